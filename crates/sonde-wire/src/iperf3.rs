//! The iperf3 control connection (docs/protocols/iperf3.md), both directions, as pure codecs.
//!
//! What travels on an iperf3 control connection: a 37-byte [`Cookie`], one-byte [`State`]
//! codes, and three JSON documents with a 4-byte big-endian length prefix ([`json_len`]): the
//! client's [`Params`] and each side's [`Results`]. `SERVER_ERROR` carries two big-endian
//! `i32`s, the first an [`errno`] code that [`error_message`] explains. UDP streams attach with
//! the 4-byte datagrams [`UDP_CONNECT_MSG`] / [`UDP_CONNECT_REPLY`]. Stream IDs follow iperf3's
//! 1, 3, 4, 5, … numbering ([`stream_id`], [`stream_index`]).
//!
//! JSON numbers are read the way iperf3's cJSON reads them (a double plus a saturating 64-bit
//! integer; floats truncate toward zero), booleans in the parameters count by presence, and
//! `18446744073709551615` in results (how iperf3 3.12 and 3.13 print -1) reads as -1.
//!
//! ```
//! use sonde_wire::iperf3::{stream_id, Params, State};
//! let p = Params::from_json(br#"{"udp":true,"time":1,"parallel":2,"len":1400,"reverse":false}"#).unwrap();
//! assert!(p.udp() && p.reverse, "\"reverse\":false still means reverse, as in iperf3");
//! assert_eq!(p.streams(), 2);
//! assert_eq!(State::from_byte(0x0a), Some(State::CreateStreams));
//! assert_eq!((stream_id(0), stream_id(1)), (1, 3));
//! ```

use std::borrow::Cow;

use serde::Serialize;
use serde_json::{Map, Value};

/// iperf3's well-known port.
pub const DEFAULT_PORT: u16 = 5201;
/// Bytes in a cookie on the wire: 36 characters and a NUL.
pub const COOKIE_LEN: usize = 37;
/// The characters a real client draws its cookie from.
pub const COOKIE_ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";

/// The largest JSON message either side reads. iperf3 3.12–3.17 impose no bound at all; this one
/// only keeps a length field from making us allocate gigabytes. The biggest message in practice is
/// a server's results with `--get-server-output`: per-stream totals are about 250 bytes each (32
/// KiB at iperf3's 128-stream maximum), and a real server's embedded `-J` document adds about
/// 350 bytes per stream per interval, so 1 MiB holds, for example, 8 streams for 5 minutes of
/// one-second intervals. Parameters are a few hundred bytes (3.18 servers cap them at 8 KiB).
pub const MAX_JSON_LEN: u32 = 1 << 20;

/// Datagram a 3.12+ client sends to attach a UDP stream (any 4 bytes are accepted by servers).
pub const UDP_CONNECT_MSG: [u8; 4] = *b"9876";
/// A 3.12+ server's answer to [`UDP_CONNECT_MSG`].
pub const UDP_CONNECT_REPLY: [u8; 4] = *b"6789";
/// The connect datagram of clients up to 3.11: 123456789 as a little-endian `u32`.
pub const LEGACY_UDP_CONNECT_MSG: [u8; 4] = [0x15, 0xcd, 0x5b, 0x07];
/// The reply of servers up to 3.11: 987654321 as a little-endian `u32`; 3.12+ clients accept it.
pub const LEGACY_UDP_CONNECT_REPLY: [u8; 4] = [0xb1, 0x68, 0xde, 0x3a];

/// Length of a `SERVER_ERROR` payload after its state byte: two big-endian `i32`s.
pub const SERVER_ERROR_PAYLOAD_LEN: usize = 8;

/// Errors decoding iperf3 control messages.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A JSON length prefix is zero or above [`MAX_JSON_LEN`].
    #[error("iperf3 JSON message length {0} is outside 1..={MAX_JSON_LEN}")]
    Length(u32),
    /// The JSON text does not parse (iperf3 closes the connection on this).
    #[error("iperf3 JSON message does not parse: {0}")]
    Json(String),
    /// The JSON parses but is not an object where one is needed.
    #[error("iperf3 {0} is not a JSON object")]
    NotObject(&'static str),
    /// A key the real reader requires is missing (iperf3 reports "unable to receive results").
    #[error("iperf3 {what} lacks the required key \"{key}\"")]
    MissingKey {
        /// Which message.
        what: &'static str,
        /// The key.
        key: &'static str,
    },
    /// A value is outside what the protocol allows.
    #[error("iperf3 {what}: {detail}")]
    Invalid {
        /// Which field.
        what: &'static str,
        /// What is wrong with it.
        detail: String,
    },
}

/// The cookie that names a test: sent first on the control connection and on every TCP data
/// connection. Real cookies are 36 characters from [`COOKIE_ALPHABET`] and a NUL, but a server
/// takes any 37 bytes as the control cookie.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cookie([u8; COOKIE_LEN]);

impl Cookie {
    /// A fresh cookie from 36 random bytes, mapped onto [`COOKIE_ALPHABET`] as iperf3 does.
    pub fn from_random(random: &[u8; COOKIE_LEN - 1]) -> Self {
        let mut b = [0u8; COOKIE_LEN];
        for (out, r) in b.iter_mut().zip(random) {
            *out = COOKIE_ALPHABET[usize::from(*r) % COOKIE_ALPHABET.len()];
        }
        Self(b)
    }

    /// The 37 bytes a peer sent, taken as they are.
    pub fn from_bytes(bytes: [u8; COOKIE_LEN]) -> Self {
        Self(bytes)
    }

    /// The bytes on the wire.
    pub fn as_bytes(&self) -> &[u8; COOKIE_LEN] {
        &self.0
    }

    /// The text before the first NUL (lossy if a peer sent bytes that are not UTF-8); this is
    /// what iperf3 `-J` shows as `start.cookie`.
    pub fn text(&self) -> Cow<'_, str> {
        String::from_utf8_lossy(c_str(&self.0))
    }

    /// Whether `other` (the first bytes of a data connection) names this cookie, compared as C
    /// strings like iperf3's `strcmp`: bytes after the first NUL do not count, and the end of
    /// `other` counts as a NUL.
    pub fn matches(&self, other: &[u8]) -> bool {
        c_str(&self.0) == c_str(other)
    }
}

impl std::fmt::Debug for Cookie {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Cookie({:?})", self.text())
    }
}

fn c_str(b: &[u8]) -> &[u8] {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    &b[..end]
}

/// A state code: one signed byte on the control connection (docs/protocols/iperf3.md §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i8)]
pub enum State {
    /// Server: all streams are connected; the client starts its timers.
    TestStart = 1,
    /// Server: data transfer starts (sent right after `TestStart`).
    TestRunning = 2,
    /// Defined by iperf3, never sent.
    ResultRequest = 3,
    /// Client: the test is over.
    TestEnd = 4,
    /// Defined by iperf3, never sent.
    StreamBegin = 5,
    /// Defined by iperf3, never sent.
    StreamRunning = 6,
    /// Defined by iperf3, never sent.
    StreamEnd = 7,
    /// Defined by iperf3, never sent.
    AllStreamsEnd = 8,
    /// Server: send your parameters.
    ParamExchange = 9,
    /// Server: open the data streams now.
    CreateStreams = 10,
    /// Server: interrupted; the test is over.
    ServerTerminate = 11,
    /// Client: interrupted; the test is over, no results follow.
    ClientTerminate = 12,
    /// Server: send your results, then read mine.
    ExchangeResults = 13,
    /// Server: the exchange is done; print, then say `IperfDone`.
    DisplayResults = 14,
    /// A server's initial local state, never sent.
    IperfStart = 15,
    /// Client: last byte before it closes.
    IperfDone = 16,
    /// Server: busy (or a data connection's cookie was wrong); it closes after this byte.
    AccessDenied = -1,
    /// Server: an error, followed by two big-endian `i32`s (an [`errno`] code and the OS errno).
    ServerError = -2,
}

impl State {
    /// Decodes a state byte; `None` for values iperf3 does not define.
    pub fn from_byte(b: u8) -> Option<Self> {
        Some(match i8::from_ne_bytes([b]) {
            1 => Self::TestStart,
            2 => Self::TestRunning,
            3 => Self::ResultRequest,
            4 => Self::TestEnd,
            5 => Self::StreamBegin,
            6 => Self::StreamRunning,
            7 => Self::StreamEnd,
            8 => Self::AllStreamsEnd,
            9 => Self::ParamExchange,
            10 => Self::CreateStreams,
            11 => Self::ServerTerminate,
            12 => Self::ClientTerminate,
            13 => Self::ExchangeResults,
            14 => Self::DisplayResults,
            15 => Self::IperfStart,
            16 => Self::IperfDone,
            -1 => Self::AccessDenied,
            -2 => Self::ServerError,
            _ => return None,
        })
    }

    /// The byte on the wire.
    pub fn byte(self) -> u8 {
        (self as i8).to_ne_bytes()[0]
    }
}

/// Encodes a `SERVER_ERROR` message: the state byte, the [`errno`] code and the OS errno.
pub fn encode_server_error(i_errno: i32, os_errno: i32) -> [u8; 1 + SERVER_ERROR_PAYLOAD_LEN] {
    let mut b = [0u8; 1 + SERVER_ERROR_PAYLOAD_LEN];
    b[0] = State::ServerError.byte();
    b[1..5].copy_from_slice(&i_errno.to_be_bytes());
    b[5..9].copy_from_slice(&os_errno.to_be_bytes());
    b
}

/// Decodes the 8 bytes after a `SERVER_ERROR` byte into (iperf3 error code, OS errno).
pub fn decode_server_error(payload: [u8; SERVER_ERROR_PAYLOAD_LEN]) -> (i32, i32) {
    let [a, b, c, d, e, f, g, h] = payload;
    (
        i32::from_be_bytes([a, b, c, d]),
        i32::from_be_bytes([e, f, g, h]),
    )
}

/// Checks a JSON message's 4-byte big-endian length prefix before anything is allocated.
pub fn json_len(prefix: [u8; 4]) -> Result<usize, Error> {
    let n = u32::from_be_bytes(prefix);
    if n == 0 || n > MAX_JSON_LEN {
        return Err(Error::Length(n));
    }
    usize::try_from(n).map_err(|_| Error::Length(n))
}

/// The 4-byte length prefix for a JSON body (callers keep bodies under [`MAX_JSON_LEN`]).
pub fn json_prefix(body: &[u8]) -> [u8; 4] {
    u32::try_from(body.len()).unwrap_or(u32::MAX).to_be_bytes()
}

/// The ID of the stream opened (client) or accepted (server) `index`-th, from 0: 1, 3, 4, 5, …
/// (iperf3 skips 2, and both sides rely on it).
pub fn stream_id(index: usize) -> u32 {
    match index {
        0 => 1,
        i => u32::try_from(i).unwrap_or(u32::MAX - 2).saturating_add(2),
    }
}

/// The position of the stream with this ID, the inverse of [`stream_id`].
pub fn stream_index(id: u32) -> Option<usize> {
    match id {
        1 => Some(0),
        0 | 2 => None,
        i => usize::try_from(i - 2).ok(),
    }
}

/// Transport named in the parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Protocol {
    /// `"tcp"` (also the default when no protocol key is present).
    #[default]
    Tcp,
    /// `"udp"`.
    Udp,
    /// `"sctp"` (sonde does not serve it).
    Sctp,
}

/// The client's test parameters (docs/protocols/iperf3.md §6).
///
/// Numbers are what cJSON's `valueint` gives: integers, floats truncated toward zero, huge values
/// saturated to `i64::MAX`, `true` as 1 and anything else as 0. Keys the real client sends only
/// when set are written by [`Params::to_json`] only when they differ from the default (0, false
/// or `None`); `Params::default()` has the server defaults (`time` 10 s, `len` 128 KiB, one
/// stream, `pacing_timer` 1000 µs).
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    /// The protocol: the last of `tcp`, `udp`, `sctp` present wins, as in iperf3.
    pub protocol: Protocol,
    /// Seconds at the start that do not count (`-O`).
    pub omit: i64,
    /// CPU to pin the server to (`-A`).
    pub server_affinity: Option<i64>,
    /// Test duration in seconds (`-t`); 0 with `-n`/`-k`.
    pub time: i64,
    /// Byte budget (`-n`); 0 = unused.
    pub num: i64,
    /// Block budget (`-k`); 0 = unused.
    pub blockcount: i64,
    /// TCP_MAXSEG (`-M`); 0 = unset.
    pub mss: i64,
    /// TCP_NODELAY on data sockets (`-N`).
    pub nodelay: bool,
    /// Streams per direction (`-P`).
    pub parallel: i64,
    /// The server sends (`-R`).
    pub reverse: bool,
    /// Both directions (`--bidir`).
    pub bidirectional: bool,
    /// Socket buffer bytes (`-w`); 0 = autotune.
    pub window: i64,
    /// TCP write size and UDP datagram size in bytes (`-l`).
    pub len: i64,
    /// Target bits per second per stream (`-b`); 0 = unlimited.
    pub bandwidth: i64,
    /// SO_MAX_PACING_RATE in bits per second (`--fq-rate`); 0 = unset.
    pub fqrate: i64,
    /// Pacing tick in microseconds.
    pub pacing_timer: i64,
    /// Packets per burst (`-b rate/N`); 0 = unset.
    pub burst: i64,
    /// IP_TOS (`-S`); 0 = unset.
    pub tos: i64,
    /// IPv6 flow label (`-L`); 0 = unset.
    pub flowlabel: i64,
    /// `-T`.
    pub title: Option<String>,
    /// `--extra-data`.
    pub extra_data: Option<String>,
    /// TCP_CONGESTION (`-C`).
    pub congestion: Option<String>,
    /// The client's congestion control, if known.
    pub congestion_used: Option<String>,
    /// The server embeds its output in its results (`--get-server-output`).
    pub get_server_output: bool,
    /// 64-bit UDP sequence numbers (`--udp-counters-64bit`).
    pub udp_counters_64bit: bool,
    /// Payload "0123456789" repeated (`--repeating-payload`).
    pub repeating_payload: bool,
    /// sendfile (`-Z`); 0 = off.
    pub zerocopy: i64,
    /// IPv4 DF on UDP (`--dont-fragment`); 0 = off.
    pub dont_fragment: i64,
    /// Authentication token (sonde does not check tokens).
    pub authtoken: Option<String>,
    /// The client's version, e.g. `"3.12"` (informational).
    pub client_version: Option<String>,
}

impl Default for Params {
    fn default() -> Self {
        Self {
            protocol: Protocol::Tcp,
            omit: 0,
            server_affinity: None,
            time: 10,
            num: 0,
            blockcount: 0,
            mss: 0,
            nodelay: false,
            parallel: 1,
            reverse: false,
            bidirectional: false,
            window: 0,
            len: 128 * 1024,
            bandwidth: 0,
            fqrate: 0,
            pacing_timer: 1000,
            burst: 0,
            tos: 0,
            flowlabel: 0,
            title: None,
            extra_data: None,
            congestion: None,
            congestion_used: None,
            get_server_output: false,
            udp_counters_64bit: false,
            repeating_payload: false,
            zerocopy: 0,
            dont_fragment: 0,
            authtoken: None,
            client_version: None,
        }
    }
}

/// cJSON's `valueint`: the number saturated to `i64`, floats truncated, `true` as 1, else 0.
fn cjson_int(v: &Value) -> i64 {
    match v {
        Value::Number(n) => n.as_i64().unwrap_or_else(|| {
            if n.as_u64().is_some() {
                i64::MAX
            } else {
                // `as` saturates and maps NaN to 0, which is what cJSON's clamp does.
                #[allow(clippy::cast_possible_truncation)]
                let i = n.as_f64().unwrap_or(0.0) as i64;
                i
            }
        }),
        Value::Bool(true) => 1,
        _ => 0,
    }
}

/// cJSON's `valuedouble`: the number, `true` as 1, anything else 0.
fn cjson_f64(v: &Value) -> f64 {
    match v {
        Value::Number(n) => n.as_f64().unwrap_or(0.0),
        Value::Bool(true) => 1.0,
        _ => 0.0,
    }
}

/// A results integer: like [`cjson_int`], but values of 2^63 and above wrap, because iperf3 3.12
/// and 3.13 print -1 as 18446744073709551615 (docs/protocols/iperf3.md §10).
fn results_int(v: &Value) -> i64 {
    match v {
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                i
            } else if let Some(u) = n.as_u64() {
                #[allow(clippy::cast_possible_wrap)]
                let i = u as i64;
                i
            } else {
                let f = n.as_f64().unwrap_or(0.0);
                #[allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]
                let i = if f >= 9.223_372_036_854_776e18 {
                    (f as u64) as i64
                } else {
                    f as i64
                };
                i
            }
        }
        Value::Bool(true) => 1,
        _ => 0,
    }
}

/// A byte count: unsigned, saturating; negative or non-numeric values read as 0.
fn results_u64(v: &Value) -> u64 {
    match v {
        Value::Number(n) => n.as_u64().unwrap_or_else(|| {
            // Negative integers and floats: `as` truncates, saturates, and maps NaN to 0.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let u = n.as_f64().unwrap_or(0.0) as u64;
            u
        }),
        Value::Bool(true) => 1,
        _ => 0,
    }
}

/// cJSON's `valuestring`: `None` for anything that is not a string.
fn cjson_string(v: &Value) -> Option<String> {
    v.as_str().map(str::to_owned)
}

fn parse_object(json: &[u8], what: &'static str) -> Result<Map<String, Value>, Error> {
    match serde_json::from_slice::<Value>(json) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(Error::NotObject(what)),
        Err(e) => Err(Error::Json(e.to_string())),
    }
}

impl Params {
    /// Reads a parameter JSON the way an iperf3 server does: start from the defaults, override
    /// every key present, ignore unknown keys.
    pub fn from_json(json: &[u8]) -> Result<Self, Error> {
        let m = parse_object(json, "parameter message")?;
        let mut p = Self::default();
        let int = |k: &str| m.get(k).map(cjson_int);
        let has = |k: &str| m.contains_key(k);
        let string = |k: &str| m.get(k).and_then(cjson_string);
        if has("tcp") {
            p.protocol = Protocol::Tcp;
        }
        if has("udp") {
            p.protocol = Protocol::Udp;
        }
        if has("sctp") {
            p.protocol = Protocol::Sctp;
        }
        p.omit = int("omit").unwrap_or(p.omit);
        p.server_affinity = int("server_affinity");
        p.time = int("time").unwrap_or(p.time);
        p.num = int("num").unwrap_or(0);
        p.blockcount = int("blockcount").unwrap_or(0);
        p.mss = int("MSS").unwrap_or(0);
        p.nodelay = has("nodelay");
        p.parallel = int("parallel").unwrap_or(p.parallel);
        p.reverse = has("reverse");
        p.bidirectional = has("bidirectional");
        p.window = int("window").unwrap_or(0);
        p.len = int("len").unwrap_or(p.len);
        p.bandwidth = int("bandwidth").unwrap_or(0);
        p.fqrate = int("fqrate").unwrap_or(0);
        p.pacing_timer = int("pacing_timer").unwrap_or(p.pacing_timer);
        p.burst = int("burst").unwrap_or(0);
        p.tos = int("TOS").unwrap_or(0);
        p.flowlabel = int("flowlabel").unwrap_or(0);
        p.title = string("title");
        p.extra_data = string("extra_data");
        p.congestion = string("congestion");
        p.congestion_used = string("congestion_used");
        p.get_server_output = has("get_server_output");
        p.udp_counters_64bit = has("udp_counters_64bit");
        p.repeating_payload = has("repeating_payload");
        p.zerocopy = int("zerocopy").unwrap_or(0);
        p.dont_fragment = int("dont_fragment").unwrap_or(0);
        p.authtoken = string("authtoken");
        p.client_version = string("client_version");
        Ok(p)
    }

    /// Compact JSON with the keys, in the order, that a real 3.12 client sends: the protocol,
    /// `omit`, `time`, `num`, `blockcount`, `parallel`, `len`, `pacing_timer` and
    /// `client_version` always (when set), the others only when they differ from the default.
    pub fn to_json(&self) -> Vec<u8> {
        let nz = |v: i64| (v != 0).then_some(v);
        let on = |b: bool| b.then_some(true);
        let one = |b: bool| b.then_some(1);
        let out = ParamsOut {
            tcp: on(self.protocol == Protocol::Tcp),
            udp: on(self.protocol == Protocol::Udp),
            sctp: on(self.protocol == Protocol::Sctp),
            omit: self.omit,
            server_affinity: self.server_affinity,
            time: self.time,
            num: self.num,
            blockcount: self.blockcount,
            mss: nz(self.mss),
            nodelay: on(self.nodelay),
            parallel: self.parallel,
            reverse: on(self.reverse),
            bidirectional: on(self.bidirectional),
            window: nz(self.window),
            len: nz(self.len),
            bandwidth: nz(self.bandwidth),
            fqrate: nz(self.fqrate),
            pacing_timer: nz(self.pacing_timer),
            burst: nz(self.burst),
            tos: nz(self.tos),
            flowlabel: nz(self.flowlabel),
            title: self.title.as_deref(),
            extra_data: self.extra_data.as_deref(),
            congestion: self.congestion.as_deref(),
            congestion_used: self.congestion_used.as_deref(),
            get_server_output: one(self.get_server_output),
            udp_counters_64bit: one(self.udp_counters_64bit),
            repeating_payload: one(self.repeating_payload),
            zerocopy: nz(self.zerocopy),
            dont_fragment: nz(self.dont_fragment),
            authtoken: self.authtoken.as_deref(),
            client_version: self.client_version.as_deref(),
        };
        serde_json::to_vec(&out).unwrap_or_default()
    }

    /// Whether the test is UDP.
    pub fn udp(&self) -> bool {
        self.protocol == Protocol::Udp
    }

    /// Data streams the client opens: `parallel`, twice that for `--bidir` (0 if `parallel` is
    /// not positive; callers check their own upper limit).
    pub fn streams(&self) -> u64 {
        let per_direction = u64::try_from(self.parallel).unwrap_or(0);
        if self.bidirectional {
            per_direction.saturating_mul(2)
        } else {
            per_direction
        }
    }

    /// Whether the client sends on the stream at `index` (accept order, from 0); the server sends
    /// on the others. Bidir: the first `parallel` streams are the client's (docs/protocols/iperf3.md §7).
    pub fn client_sends(&self, index: usize) -> bool {
        if self.bidirectional {
            u64::try_from(index).unwrap_or(u64::MAX) < u64::try_from(self.parallel).unwrap_or(0)
        } else {
            !self.reverse
        }
    }
}

/// Field order of a real client's parameter JSON; `None` fields are left out.
#[derive(Serialize)]
struct ParamsOut<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    tcp: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    udp: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sctp: Option<bool>,
    omit: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    server_affinity: Option<i64>,
    time: i64,
    num: i64,
    blockcount: i64,
    #[serde(rename = "MSS", skip_serializing_if = "Option::is_none")]
    mss: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    nodelay: Option<bool>,
    parallel: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    reverse: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    bidirectional: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    window: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    len: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    bandwidth: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    fqrate: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pacing_timer: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    burst: Option<i64>,
    #[serde(rename = "TOS", skip_serializing_if = "Option::is_none")]
    tos: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    flowlabel: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    title: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    extra_data: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    congestion: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    congestion_used: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    get_server_output: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    udp_counters_64bit: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    repeating_payload: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    zerocopy: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dont_fragment: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    authtoken: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    client_version: Option<&'a str>,
}

/// One side's results (docs/protocols/iperf3.md §10): both sides send one, describing their own streams.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Results {
    /// CPU use during the test, percent.
    pub cpu_util_total: f64,
    /// User CPU, percent.
    pub cpu_util_user: f64,
    /// System CPU, percent.
    pub cpu_util_system: f64,
    /// 1: this side sends TCP and reports retransmits; 0: it sends without retransmit counts
    /// (UDP); -1: it only receives.
    pub sender_has_retransmits: i64,
    /// TCP congestion control actually used.
    pub congestion_used: Option<String>,
    /// One entry per stream of this side.
    pub streams: Vec<StreamResults>,
    /// A server's text report (`--get-server-output`, server not in `-J` mode).
    pub server_output_text: Option<String>,
    /// A server's whole `-J` document (`--get-server-output`, server in `-J` mode).
    pub server_output_json: Option<Value>,
}

/// One stream's totals in [`Results`].
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StreamResults {
    /// Stream ID (1, 3, 4, …), the peer's key for matching.
    pub id: u32,
    /// Bytes sent, or received, after the omit period.
    pub bytes: u64,
    /// TCP retransmits of a sender that reports them, else -1.
    pub retransmits: i64,
    /// UDP receiver jitter, seconds; 0 otherwise.
    pub jitter: f64,
    /// UDP receiver: datagrams lost; 0 otherwise.
    pub errors: i64,
    /// UDP: datagrams sent (sender) or highest sequence number received (receiver); 0 for TCP.
    pub packets: i64,
    /// Seconds; always 0 in practice.
    pub start_time: f64,
    /// Seconds the stream ran after the omit period.
    pub end_time: f64,
    /// UDP loss during the omit period (3.14+).
    pub omitted_errors: i64,
    /// UDP packets during the omit period (3.14+).
    pub omitted_packets: i64,
}

const RESULTS: &str = "results message";
const STREAM: &str = "results stream";

impl Results {
    /// Reads a results JSON, requiring the keys the real reader requires (the cpu figures,
    /// `sender_has_retransmits`, `streams`, and per stream `id`, `bytes`, `retransmits`,
    /// `jitter`, `errors`, `packets`); optional keys default to 0 / `None`.
    pub fn from_json(json: &[u8]) -> Result<Self, Error> {
        let m = parse_object(json, RESULTS)?;
        let req = |key: &'static str| m.get(key).ok_or(Error::MissingKey { what: RESULTS, key });
        let mut r = Self {
            cpu_util_total: finite(cjson_f64(req("cpu_util_total")?)),
            cpu_util_user: finite(cjson_f64(req("cpu_util_user")?)),
            cpu_util_system: finite(cjson_f64(req("cpu_util_system")?)),
            sender_has_retransmits: results_int(req("sender_has_retransmits")?),
            congestion_used: m.get("congestion_used").and_then(cjson_string),
            streams: Vec::new(),
            server_output_text: m.get("server_output_text").and_then(cjson_string),
            server_output_json: m.get("server_output_json").cloned(),
        };
        let Value::Array(streams) = req("streams")? else {
            return Err(Error::Invalid {
                what: "streams",
                detail: "not an array".into(),
            });
        };
        r.streams.reserve(streams.len());
        for s in streams {
            let Value::Object(s) = s else {
                return Err(Error::NotObject(STREAM));
            };
            r.streams.push(StreamResults::from_map(s)?);
        }
        Ok(r)
    }

    /// Compact JSON with every required key, -1 written as a signed integer, `omitted_*` always
    /// present (3.14+ clients otherwise count every packet as omitted), and no NaN or infinity.
    pub fn to_json(&self) -> Vec<u8> {
        let out = ResultsOut {
            cpu_util_total: finite(self.cpu_util_total),
            cpu_util_user: finite(self.cpu_util_user),
            cpu_util_system: finite(self.cpu_util_system),
            sender_has_retransmits: self.sender_has_retransmits,
            congestion_used: self.congestion_used.as_deref(),
            server_output_text: self.server_output_text.as_deref(),
            server_output_json: self.server_output_json.as_ref(),
            streams: self
                .streams
                .iter()
                .map(|s| StreamOut {
                    id: s.id,
                    bytes: s.bytes,
                    retransmits: s.retransmits,
                    jitter: finite(s.jitter),
                    errors: s.errors,
                    omitted_errors: s.omitted_errors,
                    packets: s.packets,
                    omitted_packets: s.omitted_packets,
                    start_time: finite(s.start_time),
                    end_time: finite(s.end_time),
                })
                .collect(),
        };
        serde_json::to_vec(&out).unwrap_or_default()
    }
}

impl StreamResults {
    fn from_map(m: &Map<String, Value>) -> Result<Self, Error> {
        let req = |key: &'static str| m.get(key).ok_or(Error::MissingKey { what: STREAM, key });
        let id = results_int(req("id")?);
        let id = u32::try_from(id).map_err(|_| Error::Invalid {
            what: "stream id",
            detail: format!("{id} is not a stream id"),
        })?;
        Ok(Self {
            id,
            bytes: results_u64(req("bytes")?),
            retransmits: results_int(req("retransmits")?),
            jitter: finite(cjson_f64(req("jitter")?)),
            errors: results_int(req("errors")?),
            packets: results_int(req("packets")?),
            start_time: m.get("start_time").map_or(0.0, |v| finite(cjson_f64(v))),
            end_time: m.get("end_time").map_or(0.0, |v| finite(cjson_f64(v))),
            omitted_errors: m.get("omitted_errors").map_or(0, results_int),
            omitted_packets: m.get("omitted_packets").map_or(0, results_int),
        })
    }
}

fn finite(v: f64) -> f64 {
    if v.is_finite() {
        v
    } else {
        0.0
    }
}

#[derive(Serialize)]
struct ResultsOut<'a> {
    cpu_util_total: f64,
    cpu_util_user: f64,
    cpu_util_system: f64,
    sender_has_retransmits: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    congestion_used: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    server_output_text: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    server_output_json: Option<&'a Value>,
    streams: Vec<StreamOut>,
}

#[derive(Serialize)]
struct StreamOut {
    id: u32,
    bytes: u64,
    retransmits: i64,
    jitter: f64,
    errors: i64,
    omitted_errors: i64,
    packets: i64,
    omitted_packets: i64,
    start_time: f64,
    end_time: f64,
}

/// iperf3's error codes (`i_errno`, docs/protocols/iperf3.md §13) that sonde sends or must explain. The
/// values are the same in 3.12–3.19.1: later releases only added codes.
pub mod errno {
    /// Test duration too long.
    pub const IEDURATION: i32 = 5;
    /// Too many parallel streams.
    pub const IENUMSTREAMS: i32 = 6;
    /// Block size too large (TCP).
    pub const IEBLOCKSIZE: i32 = 7;
    /// Socket buffer too large.
    pub const IEBUFSIZE: i32 = 8;
    /// MSS too large.
    pub const IEMSS: i32 = 10;
    /// Bad omit value.
    pub const IEOMIT: i32 = 12;
    /// Option not implemented.
    pub const IEUNIMP: i32 = 13;
    /// Bad burst count.
    pub const IEBURST: i32 = 15;
    /// More than one end condition.
    pub const IEENDCONDITIONS: i32 = 16;
    /// No SCTP support.
    pub const IENOSCTP: i32 = 18;
    /// UDP block size outside 16..=65507.
    pub const IEUDPBLOCKSIZE: i32 = 20;
    /// Bad TOS value (`-S`).
    pub const IEBADTOS: i32 = 21;
    /// Reverse and bidirectional together.
    pub const IEREVERSEBIDIR: i32 = 25;
    /// Total rate above the server's limit.
    pub const IETOTALRATE: i32 = 27;
    /// Test initialisation failed.
    pub const IEINITTEST: i32 = 101;
    /// Control socket closed unexpectedly.
    pub const IECTRLCLOSE: i32 = 109;
    /// Unknown control message.
    pub const IEMESSAGE: i32 = 110;
    /// Cannot receive parameters.
    pub const IERECVPARAMS: i32 = 114;
    /// Cannot receive results.
    pub const IERECVRESULTS: i32 = 117;
    /// The client was interrupted.
    pub const IECLIENTTERM: i32 = 119;
    /// The server was interrupted.
    pub const IESERVERTERM: i32 = 120;
    /// The server is busy.
    pub const IEACCESSDENIED: i32 = 121;
    /// Cannot set TCP_NODELAY.
    pub const IESETNODELAY: i32 = 122;
    /// Cannot set TCP_MAXSEG.
    pub const IESETMSS: i32 = 123;
    /// Cannot set the socket buffer.
    pub const IESETBUF: i32 = 124;
    /// Cannot set IP_TOS (`-S`).
    pub const IESETTOS: i32 = 125;
    /// Cannot set IPV6_TCLASS (`-S` over IPv6).
    pub const IESETCOS: i32 = 126;
    /// Cannot reuse the address.
    pub const IEREUSEADDR: i32 = 128;
    /// Unknown protocol.
    pub const IEPROTOCOL: i32 = 131;
    /// Cannot set TCP_CONGESTION (`-C`).
    pub const IESETCONGESTION: i32 = 134;
    /// IPV6_V6ONLY.
    pub const IEV6ONLY: i32 = 136;
    /// Socket buffer size mismatch.
    pub const IESETBUF2: i32 = 141;
    /// Authentication failed.
    pub const IEAUTHTEST: i32 = 142;
    /// Nothing received within the receive timeout.
    pub const IENOMSG: i32 = 144;
    /// Cannot start the stream listener.
    pub const IESTREAMLISTEN: i32 = 202;
    /// Cannot read a stream.
    pub const IESTREAMREAD: i32 = 206;
    /// Invalid stream ID in results.
    pub const IESTREAMID: i32 = 208;
}

/// What iperf3 3.12 prints for an error code (its wording; the maxima are iperf3's own
/// compile-time limits, not the server's), e.g. for a `SERVER_ERROR` from a server; codes 3.12
/// does not have (34–36, 150–159) in the wording of the release that added them (3.14–3.19).
/// iperf3 appends `": " + strerror(errno)` for the codes where [`error_has_os_errno`] is true.
pub fn error_message(i_errno: i32) -> &'static str {
    match i_errno {
        0 => "no error",
        1 => "cannot be both server and client",
        2 => "must either be a client (-c) or server (-s)",
        3 => "some option you are trying to set is server only",
        4 => "some option you are trying to set is client only",
        5 => "test duration too long (maximum = 86400 seconds)",
        6 => "number of parallel streams too large (maximum = 128)",
        7 => "block size too large (maximum = 1048576 bytes)",
        8 => "socket buffer size too large (maximum = 536870912 bytes)",
        9 => "invalid report interval (min = 0.1, max = 60 seconds)",
        10 => "TCP MSS too large (maximum = 9216 bytes)",
        11 => "this OS does not support sendfile",
        12 => "bogus value for --omit",
        13 => "an option you are trying to set is not implemented yet",
        14 => "unable to open -F file",
        15 => "invalid burst count (maximum = 1000)",
        16 => "only one test end condition (-t, -n, -k) may be specified",
        17 => "unable to open log file",
        18 => "no SCTP support available",
        19 => "--bind must be specified to use --cport",
        20 => "block size invalid (minimum = 16 bytes, maximum = 65507 bytes)",
        21 => "bad TOS value (must be between 0 and 255 inclusive)",
        22 => "bad client authentication setup",
        23 => "bad server authentication setup",
        24 => "bad format specifier (valid formats are in the set [kmgtKMGT])",
        25 => "cannot be both reverse and bidirectional",
        26 => "port number must be between 1 and 65535 inclusive",
        27 => "total required bandwidth is larger than server limit",
        28 => "invalid time interval for calculating average data rate",
        29 => "skew threshold must be a positive number",
        30 => "idle timeout parameter is not positive or larger than allowed limit",
        31 => "receive timeout value is incorrect or not in range",
        32 => "client receive timeout is valid only in receiving mode",
        33 => "send timeout value is incorrect or not in range",
        34 => "cannot transfer file using UDP",
        35 => "cannot access authorized users file",
        36 => "control connection Keepalive period should be larger than the full retry period (interval * count)",
        100 => "unable to create a new test",
        101 => "test initialization failed",
        102 => "unable to start listener for connections",
        103 => "unable to connect to server",
        104 => "unable to accept connection from client",
        105 => "unable to send cookie to server",
        106 => "unable to receive cookie at server",
        107 => "unable to write to the control socket",
        108 => "unable to read from the control socket",
        109 => "control socket has closed unexpectedly",
        110 => "received an unknown control message",
        111 => "unable to send control message",
        112 => "unable to receive control message",
        113 => "unable to send parameters to server",
        114 => "unable to receive parameters from client",
        115 => "unable to package results",
        116 => "unable to send results",
        117 => "unable to receive results",
        118 => "select failed",
        119 => "the client has terminated",
        120 => "the server has terminated",
        121 => "the server is busy running a test. try again later",
        122 => "unable to set TCP/SCTP NODELAY",
        123 => "unable to set TCP/SCTP MSS",
        124 => "unable to set socket buffer size",
        125 => "unable to set IP TOS",
        126 => "unable to set IPv6 traffic class",
        127 => "unable to set IPv6 flow label",
        128 => "unable to reuse address on socket",
        129 => "unable to set socket to non-blocking",
        130 => "unable to set socket window size",
        131 => "protocol does not exist",
        132 => "unable to set CPU affinity",
        133 => "unable to become a daemon",
        134 => "unable to set TCP_CONGESTION: supplied congestion control algorithm not supported on this host",
        135 => "unable to write PID file",
        136 => "unable to set/reset IPV6_V6ONLY",
        137 => "unable to set SCTP_DISABLE_FRAGMENTS",
        138 => "unable to set SCTP_INIT num of SCTP streams",
        139 => "unable to process sctp_bindx() parameters",
        140 => "unable to set socket pacing",
        141 => "socket buffer size not set correctly",
        142 => "test authorization failed",
        143 => "unable to bind-to-device",
        144 => "idle timeout for receiving data",
        145 => "unable to set IP Do-Not-Fragment flag",
        146 => "bind to device is not supported on this system",
        147 => "host device name (ip%<dev>) is supported (and required) only for IPv6 link-local address",
        148 => "unable to set TCP USER_TIMEOUT",
        150 => "unable to create thread",
        151 => "unable to cancel thread",
        152 => "unable to join thread",
        153 => "unable to create thread attributes",
        154 => "unable to destroy thread attributes",
        155 => "unable to set socket keepalive (SO_KEEPALIVE) option",
        156 => "unable to set socket keepalive TCP period (TCP_KEEPIDLE) option",
        157 => "unable to set/get socket keepalive TCP retry interval (TCP_KEEPINTVL) option",
        158 => "unable to set/get socket keepalive TCP number of retries (TCP_KEEPCNT) option",
        159 => "unable to change mask of blocked signals",
        200 => "unable to create a new stream",
        201 => "unable to initialize stream",
        202 => "unable to start stream listener",
        203 => "unable to connect stream",
        204 => "unable to accept stream connection",
        205 => "unable to write to stream socket",
        206 => "unable to read from stream socket",
        207 => "stream socket has closed unexpectedly",
        208 => "stream has an invalid id",
        300 => "unable to create new timer",
        301 => "unable to update timer",
        _ => "unknown iperf3 error",
    }
}

/// Whether iperf3 appends `": " + strerror(errno)` to [`error_message`] for this code (3.12's
/// rule; for the codes added later, the rule of the release that added them).
pub fn error_has_os_errno(i_errno: i32) -> bool {
    matches!(
        i_errno,
        14 | 17
            | 36
            | 100..=108
            | 111..=118
            | 122..=126
            | 128..=130
            | 132
            | 133
            | 135..=138
            | 140
            | 150..=158
            | 200..=206
            | 300
            | 301
    )
}

#[cfg(test)]
mod tests;
