//! sonde against a real `iperf3 -s`: `sonde throughput iperf3://HOST[:PORT]`.
//!
//! The client half of iperf3's control protocol (docs/protocols/iperf3.md, checklist "Our client ↔
//! real iperf3 -s" in 1.17) around sonde's own data loops:
//!
//! 1. Connect, send a fresh 37-byte cookie, expect `PARAM_EXCHANGE` (or `ACCESS_DENIED` when the
//!    server is busy). Silence, an early close or any other byte means the peer is not an iperf3
//!    server (a sonde agent, an HTTP server...), said in one line. A refused connection or an
//!    early close is tried again for 0.3 s first: an iperf3 server listens anew after every
//!    test, and a test that follows another at once (a sweep) would fall into that gap.
//! 2. Send the parameters (the keys a real 3.12 client always sends, plus `bandwidth` and
//!    `udp_counters_64bit` for UDP), expect `CREATE_STREAMS` (or `SERVER_ERROR`, shown with
//!    iperf3's own message for its code).
//! 3. Open the streams strictly one after another, in order (IDs 1, 3, 4, …): TCP connect and
//!    cookie; UDP `connect()`, `"9876"`, and wait for `"6789"` (or the legacy reply).
//! 4. `TEST_START` starts the test clock (and the duration), `TEST_RUNNING` the data loops of
//!    [`sonde_net::bulk`] with iperf3's UDP header ([`UdpFormat::Iperf3`]).
//! 5. At the end of `-t`, `TEST_END`; receivers keep draining until `EXCHANGE_RESULTS`, then
//!    read their streams to the end (TCP: the server has closed them; UDP: until quiet).
//! 6. Send our results (what we sent and received per stream), read the server's, expect
//!    `DISPLAY_RESULTS`, answer `IPERF_DONE`, and wait for the server to close the connection
//!    (until then it is still in this test, and answers a new one "busy").
//!
//! Ctrl-C (the caller's `interrupt` flag) sends `CLIENT_TERMINATE` once the server is past the
//! parameters, as iperf3's client does, and ends with [`ClientError::Interrupted`].
//!
//! What the result holds: the receiver of each stream is whichever side received it: the iperf3
//! server's results for client→server streams (bytes, duration, and for UDP the packets, loss
//! and jitter it counted), sonde's own receiver for server→client streams. Figures an iperf3
//! server does not report (its read or write counts, duplicates and reordering on the streams
//! it receives, its intervals) are `null` where the model allows it and explained in a warning
//! either way. `-i` intervals are counted at this host, so for client→server streams they are
//! the sender's, and a warning says so.
//!
//! Timeouts are shorter than iperf3's where iperf3 waits for a person to notice: 5 s for the
//! server to answer the cookie (a real one answers at once), 5 s per UDP connect reply (iperf3:
//! 30 s, like sonde's own UDP join: a reply that has not come in 5 s on a working path is not
//! coming), 10 s for every later step.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sonde_engine::interval::Intervals;
use sonde_net::bulk::{self, SendOutcome, TcpRecvOutcome, UdpFormat, UdpRecvOutcome};
use sonde_net::cpu::{CpuCost, CpuMeter, CpuScope};
use sonde_net::socket::{Applied, ConnectError, DataOptionError, DataOptions};
use sonde_net::{Clock, Counters};
use sonde_report::{
    IntervalResult, Peer, StreamDirection, StreamResult, ThroughputResult, Warning,
};
use sonde_wire::iperf3::{self as wire, Cookie, Params, Results, StreamResults};
use sonde_wire::{Direction, Protocol};

use crate::results::{pct, side};
use crate::{ClientError, Family, Iperf3Server, Source, Target, ThroughputOptions};

pub mod control;

use control::{control_io, Conversation, Heard, Opening, ReadError, STEP_TIMEOUT};

/// The target scheme: `iperf3://HOST[:PORT]`.
pub const SCHEME: &str = "iperf3://";

/// iperf3's port, used when the target names none.
pub const DEFAULT_PORT: u16 = wire::DEFAULT_PORT;

/// The iperf3 version whose protocol sonde speaks, sent as `client_version` (informational).
const CLIENT_VERSION: &str = "3.12";

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// An iperf3 server closes its listening socket after every test and opens a new one
/// (`iperf_run_server` listens anew each time), so just after a test a connection is refused,
/// or taken by the closing listener and reset before it is answered. Either is tried again
/// after each of these pauses (0.3 s in all). On loopback the gap was always gone after the
/// first, for 3.12 to 3.19.1; on a port where nothing, or no iperf3 server, listens the
/// pauses only delay the verdict.
const RELISTEN_PAUSES_MS: [u64; 4] = [5, 20, 80, 200];
/// How long a UDP stream waits for the server's connect reply (iperf3 waits 30 s).
const UDP_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the event loop looks at the control connection, the clock and Ctrl-C.
const TICK: Duration = Duration::from_millis(10);
/// After `EXCHANGE_RESULTS` a UDP receiver reads until its socket has been quiet this long (the
/// server stopped sending before it asked; this only empties the socket buffer).
const UDP_QUIET: Duration = Duration::from_millis(50);
/// The longest the receivers drain after `EXCHANGE_RESULTS` before they are stopped.
const DRAIN_LIMIT: Duration = Duration::from_secs(2);
/// After the stop flags are set every loop ends within its poll time (100 ms); this bounds it.
const STOP_LIMIT: Duration = Duration::from_secs(2);

/// iperf3's own limits, which its server enforces or its client refuses beyond (1.13: codes 5,
/// 6, 7, 20).
const MAX_STREAMS: u32 = 128;
const MAX_TCP_LEN: u32 = 1 << 20;
const MAX_UDP_LEN: u32 = 65_507;
const MAX_SECONDS: u64 = 86_400;

/// `Some` when `spec` names an iperf3 server, `iperf3://HOST[:PORT]` (a trailing `/` is
/// allowed; the scheme is case-insensitive); the target resolved with iperf3's port 5201 as
/// the default. `None` for anything else, which is a sonde agent's address.
pub fn target(spec: &str) -> Option<Result<Iperf3Server, ClientError>> {
    target_in(spec, None)
}

/// [`target`], resolved to an address of `family` when one is given (`-4`, `-6`).
pub fn target_in(spec: &str, family: Option<Family>) -> Option<Result<Iperf3Server, ClientError>> {
    let scheme = spec.get(..SCHEME.len())?;
    if !scheme.eq_ignore_ascii_case(SCHEME) {
        return None;
    }
    let rest = &spec[SCHEME.len()..];
    let host = rest.strip_suffix('/').unwrap_or(rest);
    if host.is_empty() || host.contains('/') {
        return Some(Err(ClientError::Usage(format!(
            "`{spec}`: write iperf3://HOST or iperf3://HOST:PORT"
        ))));
    }
    // The label (the result's `server`) keeps the scheme: it says what answered there.
    Some(crate::resolve_in(host, DEFAULT_PORT, family).map(|t| {
        Iperf3Server(Target {
            label: format!("{SCHEME}{}", t.label),
            ..t
        })
    }))
}

impl crate::test::sealed::Sealed<Iperf3Server> for ThroughputOptions {}

/// A throughput test against the real `iperf3 -s` at the target; live intervals are `-i`'s as
/// they are cut (counted at this host, see the module docs). Interrupted, the server is told
/// (`CLIENT_TERMINATE`) and the result is [`ClientError::Interrupted`].
///
/// UDP `bitrate` is for all streams of one direction together, as everywhere in sonde; each
/// iperf3 stream gets its share as `bandwidth`. `bitrate` 0 sends unlimited (no `bandwidth`
/// key, which an iperf3 server also takes as unlimited for its own sending).
impl crate::Test<Iperf3Server> for ThroughputOptions {
    type Output = ThroughputResult;
    type Interval = IntervalResult;

    fn run(
        &self,
        server: &Iperf3Server,
        controls: crate::Controls<'_, IntervalResult>,
    ) -> Result<ThroughputResult, ClientError> {
        let (interrupt, mut on_interval, _) = controls.parts();
        throughput(&server.0, self, interrupt, &mut |iv| on_interval.call(iv))
    }
}

fn throughput(
    target: &Target,
    opt: &ThroughputOptions,
    interrupt: &AtomicBool,
    on_interval: &mut dyn FnMut(&IntervalResult),
) -> Result<ThroughputResult, ClientError> {
    check(opt)?;
    let started_unix_ms = crate::now_unix_ms();
    let cookie = fresh_cookie();
    let mut ctl = Control::open(target.addr, &target.source, interrupt, &cookie)?;
    let run = session(&mut ctl, &cookie, target.addr, opt, on_interval);
    if matches!(run, Err(ClientError::Interrupted)) && ctl.talk.params_sent() {
        // Best effort: the server drops the test and prints "the client has terminated".
        ctl.talk.terminate();
        let _ = ctl.stream.write_all(&ctl.talk.poll_transmit());
    }
    let _ = ctl.stream.shutdown(Shutdown::Both);
    Ok(document(target, opt, started_unix_ms, &run?))
}

/// The options an iperf3 server can run, checked before connecting (exit 2, not 3 or 4).
fn check(opt: &ThroughputOptions) -> Result<(), ClientError> {
    if opt.parallel == 0 || opt.parallel > MAX_STREAMS {
        return Err(ClientError::Usage(format!(
            "-P: an iperf3 server runs 1 to {MAX_STREAMS} streams per direction"
        )));
    }
    let (min, max) = match opt.protocol {
        // The iperf3 UDP header with 64-bit counters (negotiated) is 16 bytes.
        Protocol::Udp => (wire_udp_header_len(), MAX_UDP_LEN),
        Protocol::Tcp => (1, MAX_TCP_LEN),
    };
    if !(min..=max).contains(&opt.msg_size) {
        return Err(ClientError::Usage(format!(
            "-l: an iperf3 server takes {} blocks of {min} to {max} bytes",
            match opt.protocol {
                Protocol::Udp => "UDP",
                Protocol::Tcp => "TCP",
            }
        )));
    }
    // What a test against an agent refuses (-n/-k with UDP or --bidir, -O with UDP, ...), an
    // iperf3 server is not asked either.
    crate::throughput_spec(opt)?;
    if opt.protocol == Protocol::Udp && (opt.bytes.is_some() || opt.blocks.is_some()) {
        return Err(ClientError::Usage(
            "-n and -k with -u against an iperf3 server: not supported (sonde's iperf3 client \
             ends a counted test when the server's host acknowledged every byte, which UDP has \
             no way to say); against a sonde agent they work"
                .into(),
        ));
    }
    if opt.protocol == Protocol::Udp && opt.omit.is_some_and(|o| !o.is_zero()) {
        return Err(ClientError::Usage(
            "-O with -u against an iperf3 server: not supported (an iperf3 receiver restarts \
             its UDP counts at the end of the omit period, not at a sequence number, so the \
             loss it reports would mix the two periods); against a sonde agent it is"
                .into(),
        ));
    }
    if opt
        .omit
        .is_some_and(|o| o.subsec_nanos() != 0 || o.as_secs() > MAX_SECONDS)
    {
        return Err(ClientError::Usage(format!(
            "-O: an iperf3 server takes the omit period in whole seconds, at most {MAX_SECONDS}"
        )));
    }
    if opt.duration.is_zero() || opt.duration > Duration::from_secs(MAX_SECONDS) {
        return Err(ClientError::Usage(format!(
            "-t: an iperf3 test runs for more than 0 and at most {MAX_SECONDS} seconds"
        )));
    }
    Ok(())
}

fn wire_udp_header_len() -> u32 {
    u32::try_from(UdpFormat::Iperf3 { seq64: true }.header_len()).unwrap_or(u32::MAX)
}

/// The parameters a real 3.12 client would send for these options (docs/protocols/iperf3.md §6, "For our
/// client").
fn params(opt: &ThroughputOptions, socket: &sonde_wire::SocketOptions) -> Params {
    let udp = opt.protocol == Protocol::Udp;
    let wide = |v: Option<u32>| v.map_or(0, i64::from);
    // iperf3's `time` is whole seconds; sonde ends the test itself at the exact -t, so this
    // only sets the server's failsafe (time + 40 s) and what its own report says.
    let secs = opt.duration.as_secs() + u64::from(opt.duration.subsec_nanos() > 0);
    let counted = opt.bytes.is_some() || opt.blocks.is_some();
    let per_stream = if udp && opt.bitrate > 0 {
        (opt.bitrate / u64::from(opt.parallel)).max(1)
    } else {
        0
    };
    Params {
        protocol: if udp {
            wire::Protocol::Udp
        } else {
            wire::Protocol::Tcp
        },
        omit: opt
            .omit
            .map_or(0, |o| i64::try_from(o.as_secs()).unwrap_or(i64::MAX)),
        // With -n or -k iperf3's own client sends `"time":0`: the count ends the test.
        time: if counted {
            0
        } else {
            i64::try_from(secs).unwrap_or(i64::MAX)
        },
        num: opt
            .bytes
            .map_or(0, |n| i64::try_from(n).unwrap_or(i64::MAX)),
        blockcount: opt
            .blocks
            .map_or(0, |k| i64::try_from(k).unwrap_or(i64::MAX)),
        parallel: i64::from(opt.parallel),
        reverse: opt.direction == Direction::Reverse,
        bidirectional: opt.direction == Direction::Bidir,
        len: i64::from(opt.msg_size),
        bandwidth: i64::try_from(per_stream).unwrap_or(i64::MAX),
        pacing_timer: 1000,
        // 64-bit sequence numbers: a long fast test cannot wrap them. Every iperf3 since 3.1
        // takes the key.
        udp_counters_64bit: udp,
        client_version: Some(CLIENT_VERSION.into()),
        // The socket options, in iperf3's own keys: the server sets them on its end.
        window: wide(socket.window_bytes),
        mss: wide(socket.mss_bytes),
        nodelay: socket.no_delay,
        congestion: socket.congestion.clone(),
        tos: socket.tos.map_or(0, i64::from),
        dont_fragment: i64::from(socket.dont_fragment),
        // -Z: iperf3's server then sends with sendfile (-R, --bidir); this client sends with
        // MSG_ZEROCOPY.
        zerocopy: i64::from(socket.zerocopy),
        fqrate: socket
            .pacing_bits_per_second
            .map_or(0, |r| i64::try_from(r).unwrap_or(i64::MAX)),
        ..Params::default()
    }
}

/// A fresh cookie. It only has to differ from other clients' cookies; the bytes come from
/// std's per-process random hash keys, mixed with the time.
fn fresh_cookie() -> Cookie {
    let state = RandomState::new();
    let salt = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut random = [0u8; wire::COOKIE_LEN - 1];
    for (i, chunk) in random.chunks_mut(8).enumerate() {
        let word = state.hash_one((i, salt, std::process::id()));
        chunk.copy_from_slice(&word.to_le_bytes()[..chunk.len()]);
    }
    Cookie::from_random(&random)
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

// ---------------------------------------------------------------------------------------------
// The control connection
// ---------------------------------------------------------------------------------------------

/// The control connection: the [`Conversation`] over a `TcpStream`, every read bounded by the
/// conversation's deadline and by Ctrl-C (looked at every [`TICK`]).
struct Control<'a> {
    stream: TcpStream,
    peer: SocketAddr,
    /// `-B`, `--bind-dev`, `--cport`: where this host's sockets come from.
    source: &'a Source,
    interrupt: &'a AtomicBool,
    talk: Conversation,
}

impl<'a> Control<'a> {
    /// Connects and greets (the cookie, then `PARAM_EXCHANGE`), again after each of
    /// [`RELISTEN_PAUSES_MS`] while the server looks like an iperf3 server between two tests.
    fn open(
        peer: SocketAddr,
        source: &'a Source,
        interrupt: &'a AtomicBool,
        cookie: &Cookie,
    ) -> Result<Self, ClientError> {
        let mut pauses = RELISTEN_PAUSES_MS.iter();
        loop {
            let attempt = Self::connect(peer, source, interrupt, cookie).and_then(|mut ctl| {
                match ctl.next()? {
                    Heard::ParamExchange => Ok(ctl),
                    other => Err(Opening::Failed(astray(&other))),
                }
            });
            match attempt {
                Ok(ctl) => return Ok(ctl),
                Err(Opening::Gap(e)) => match pauses.next() {
                    Some(&ms) if !interrupt.load(Ordering::Relaxed) => {
                        thread::sleep(Duration::from_millis(ms));
                    }
                    _ => return Err(e),
                },
                Err(Opening::Failed(e)) => return Err(e),
            }
        }
    }

    fn connect(
        peer: SocketAddr,
        source: &'a Source,
        interrupt: &'a AtomicBool,
        cookie: &Cookie,
    ) -> Result<Self, Opening> {
        // The control connection from the source address, on an ephemeral port (`--cport` is
        // the data streams').
        let stream = sonde_net::socket::tcp_connect_from(peer, &source.bind, 0, CONNECT_TIMEOUT, true)
            .map_err(|e| {
                let e = match e {
                    ConnectError::Source(e) => return Opening::Failed(ClientError::Source(e)),
                    e => e.into_io(),
                };
                let refused = e.kind() == io::ErrorKind::ConnectionRefused;
                let e = ClientError::NotIperf3(format!(
                    "cannot connect to {peer}: {e} (is `iperf3 -s` running there, and TCP port {} open?)",
                    peer.port()
                ));
                if refused {
                    Opening::Gap(e)
                } else {
                    Opening::Failed(e)
                }
            })?;
        stream
            .set_write_timeout(Some(STEP_TIMEOUT))
            .map_err(|e| Opening::Failed(control_io(&e)))?;
        Ok(Self {
            stream,
            peer,
            source,
            interrupt,
            talk: Conversation::new(Instant::now(), peer, cookie),
        })
    }

    fn interrupted(&self) -> bool {
        self.interrupt.load(Ordering::Relaxed)
    }

    /// Writes what the conversation has to send; a failure is the conversation's to judge.
    fn flush(&mut self) {
        let out = self.talk.poll_transmit();
        if !out.is_empty() {
            if let Err(e) = self.stream.write_all(&out) {
                self.talk.handle_write_failed(&e);
            }
        }
    }

    /// What the server says next (or how the conversation failed).
    fn next(&mut self) -> Result<Heard, Opening> {
        loop {
            self.flush();
            if let Some(heard) = self.talk.poll() {
                return heard;
            }
            if !self.talk.reading() {
                return Err(Opening::Failed(ClientError::Protocol(
                    "internal: the iperf3 conversation waits for nothing".into(),
                )));
            }
            self.read_once(None);
        }
    }

    /// What the server says within `wait`, if anything.
    fn poll_for(&mut self, wait: Duration) -> Result<Option<Heard>, ClientError> {
        let until = Instant::now() + wait;
        loop {
            self.flush();
            if let Some(heard) = self.talk.poll() {
                return heard.map(Some).map_err(Opening::error);
            }
            if Instant::now() >= until || !self.talk.reading() {
                return Ok(None);
            }
            self.read_once(Some(until));
        }
    }

    /// One read, for at most a [`TICK`], the conversation's deadline and `until`; what it got
    /// (or why it got nothing) goes to the conversation.
    fn read_once(&mut self, until: Option<Instant>) {
        let now = Instant::now();
        if self.interrupted() {
            return self.talk.handle_read_error(now, ReadError::Interrupted);
        }
        let deadline = self.talk.poll_timeout();
        if deadline.is_some_and(|d| now >= d) {
            return self.talk.handle_timeout(now);
        }
        let limit = [deadline, until].into_iter().flatten().min();
        let left = limit.map_or(TICK, |l| l.saturating_duration_since(now).min(TICK));
        if left.is_zero() {
            return;
        }
        if let Err(e) = self.stream.set_read_timeout(Some(left)) {
            return self.talk.handle_read_error(now, ReadError::Io(e));
        }
        let mut buf = [0u8; 4096];
        match self.stream.read(&mut buf) {
            Ok(0) => self
                .talk
                .handle_read_error(Instant::now(), ReadError::Closed),
            Ok(n) => self.talk.handle_bytes(Instant::now(), &buf[..n]),
            Err(e) if sonde_net::control::read_again(&e) => {}
            // A reset is how a server that closed with our bytes unread says goodbye.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted
                ) =>
            {
                self.talk
                    .handle_read_error(Instant::now(), ReadError::Closed);
            }
            Err(e) => self
                .talk
                .handle_read_error(Instant::now(), ReadError::Io(e)),
        }
    }

    /// Sends the parameters and waits for `CREATE_STREAMS`.
    fn send_params(&mut self, params: &Params) -> Result<(), ClientError> {
        self.talk.send_params(Instant::now(), params);
        match self.next().map_err(Opening::error)? {
            Heard::CreateStreams => Ok(()),
            other => Err(astray(&other)),
        }
    }

    /// Waits for `TEST_START` and `TEST_RUNNING` (often in one segment).
    fn await_start(&mut self) -> Result<(), ClientError> {
        self.talk.streams_open(Instant::now());
        match self.next().map_err(Opening::error)? {
            Heard::TestRunning => Ok(()),
            other => Err(astray(&other)),
        }
    }

    /// Sends our results and reads the server's.
    fn exchange_results(&mut self, ours: &Results) -> Result<Results, ClientError> {
        self.talk.send_results(Instant::now(), ours);
        match self.next().map_err(Opening::error)? {
            Heard::ServerResults(theirs) => Ok(*theirs),
            other => Err(astray(&other)),
        }
    }

    /// `DISPLAY_RESULTS`, answered with `IPERF_DONE`, then the server's close (waited for at
    /// most [`control::CLOSE_WAIT`]: until then it is still in this test, and a test started at once, the
    /// next step of a sweep, would find it busy). `false` when the server closed instead (its
    /// results had arrived: the test is complete all the same).
    fn finish(&mut self) -> Result<bool, ClientError> {
        match self.next().map_err(Opening::error)? {
            Heard::Done { clean_end } => Ok(clean_end),
            other => Err(astray(&other)),
        }
    }
}

/// What the server said where the conversation had told the client to expect something else:
/// a fault of this client, not of the server.
fn astray(heard: &Heard) -> ClientError {
    ClientError::Protocol(format!(
        "internal: the iperf3 conversation went astray ({heard:?})"
    ))
}

// ---------------------------------------------------------------------------------------------
// The data streams
// ---------------------------------------------------------------------------------------------

enum DataSocket {
    Tcp(TcpStream),
    Udp(UdpSocket),
}

impl DataSocket {
    /// Where the stream comes from at this host.
    fn local_addr(&self) -> Option<SocketAddr> {
        match self {
            DataSocket::Tcp(s) => s.local_addr().ok(),
            DataSocket::Udp(s) => s.local_addr().ok(),
        }
    }
}

/// One data stream, in the order opened (index 0 is iperf3's stream 1).
struct DataStream {
    sock: DataSocket,
    client_sends: bool,
}

/// What one of this host's loops counted.
enum Outcome {
    Sent(SendOutcome),
    TcpReceived(TcpRecvOutcome),
    UdpReceived(Box<UdpRecvOutcome>),
}

/// Opens the streams strictly one after another (docs/protocols/iperf3.md §7): the server numbers and
/// directs them by arrival order.
fn open_streams(
    ctl: &Control<'_>,
    cookie: &Cookie,
    params: &Params,
    options: Option<&DataOptions>,
) -> Result<(Vec<DataStream>, Option<Applied>), ClientError> {
    let n = usize::try_from(params.streams()).unwrap_or(0);
    let mut streams = Vec::with_capacity(n);
    let mut first: Option<Applied> = None;
    for i in 0..n {
        if ctl.interrupted() {
            return Err(ClientError::Interrupted);
        }
        let id = wire::stream_id(i);
        // The pacing rate and zero-copy sends are for the streams this host sends on.
        let options = options.map(|o| DataOptions {
            max_pacing_rate_bytes_per_second: o
                .max_pacing_rate_bytes_per_second
                .filter(|_| params.client_sends(i)),
            zerocopy: o.zerocopy && params.client_sends(i),
            ..o.clone()
        });
        let sock = if params.udp() {
            let port = ctl.source.port(index_u32(i), index_u32(n))?;
            let sock = udp_attach(ctl, params, i, port)?;
            if let Some(o) = &options {
                let a = o
                    .apply_udp(&sock)
                    .map_err(|e| crate::session::socket_refused(&e))?;
                first.get_or_insert(a);
            }
            DataSocket::Udp(sock)
        } else {
            let port = ctl.source.port(index_u32(i), index_u32(n))?;
            let mut s = match &options {
                None => sonde_net::socket::tcp_connect_from(
                    ctl.peer,
                    &ctl.source.bind,
                    port,
                    CONNECT_TIMEOUT,
                    false,
                )
                .map_err(|e| match e {
                    ConnectError::Source(e) => ClientError::Source(e),
                    e => ClientError::Data(e.into_io(), id),
                })?,
                Some(o) => {
                    let (s, a) = sonde_net::socket::tcp_connect_from_with(
                        ctl.peer,
                        &ctl.source.bind,
                        port,
                        CONNECT_TIMEOUT,
                        o,
                    )
                    .map_err(|e| match e {
                        DataOptionError::Socket(e) => ClientError::Data(e, id),
                        DataOptionError::Source(e) => ClientError::Source(e),
                        e => crate::session::socket_refused(&e),
                    })?;
                    first.get_or_insert(a);
                    s
                }
            };
            s.set_write_timeout(Some(STEP_TIMEOUT))
                .and_then(|()| s.write_all(cookie.as_bytes()))
                .map_err(|e| ClientError::Data(e, id))?;
            DataSocket::Tcp(s)
        };
        streams.push(DataStream {
            sock,
            client_sends: params.client_sends(i),
        });
    }
    Ok((streams, first))
}

/// A UDP stream: a connected socket, `"9876"`, and the server's `"6789"` (or the legacy reply)
/// within [`UDP_CONNECT_TIMEOUT`]. Sent once: a second connect datagram would reach the socket
/// the server opens for the next stream.
fn udp_attach(
    ctl: &Control<'_>,
    params: &Params,
    index: usize,
    port: u16,
) -> Result<UdpSocket, ClientError> {
    let id = wire::stream_id(index);
    let sock = ctl.source.udp(ctl.peer, port, id)?;
    sock.send(&wire::UDP_CONNECT_MSG)
        .map_err(|e| ClientError::Data(e, id))?;
    sock.set_read_timeout(Some(TICK))
        .map_err(|e| ClientError::Data(e, id))?;
    let deadline = Instant::now() + UDP_CONNECT_TIMEOUT;
    // In reverse mode stray datagrams may come first; iperf3 skips up to 4 + 2 x len bytes.
    let mut stray_budget = if params.reverse || params.bidirectional {
        params.len.saturating_mul(2).saturating_add(4)
    } else {
        0
    };
    let mut reply = [0u8; 4];
    loop {
        if ctl.interrupted() {
            return Err(ClientError::Interrupted);
        }
        if Instant::now() >= deadline {
            return Err(ClientError::UdpBlocked(ctl.peer, index_u32(index)));
        }
        match sock.recv(&mut reply) {
            Ok(4) if reply == wire::UDP_CONNECT_REPLY || reply == wire::LEGACY_UDP_CONNECT_REPLY => {
                return Ok(sock)
            }
            Ok(n) if stray_budget > 0 => {
                stray_budget = stray_budget.saturating_sub(i64::try_from(n).unwrap_or(i64::MAX));
            }
            Ok(n) => {
                return Err(ClientError::Protocol(format!(
                    "stream {id}: the iperf3 server answered the UDP connect with {:02x?}, not \"6789\"",
                    &reply[..n.min(4)]
                )))
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
                ) => {}
            // An ICMP port unreachable: nothing listens on the UDP port.
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                return Err(ClientError::UdpBlocked(ctl.peer, index_u32(index)))
            }
            Err(e) => return Err(ClientError::Data(e, id)),
        }
    }
}

fn index_u32(i: usize) -> u32 {
    u32::try_from(i).unwrap_or(u32::MAX)
}

/// The test as it ran, before the server's results.
struct DataRun {
    outcomes: Vec<Outcome>,
    intervals: Vec<IntervalResult>,
    /// From `TEST_START` to `TEST_END` (or to `EXCHANGE_RESULTS` if that came first), ns.
    elapsed_ns: u64,
}

/// What the loops share with the event loop, one entry per stream.
struct Shared {
    stops: Vec<AtomicBool>,
    expect: Vec<AtomicU64>,
    counters: Vec<Counters>,
}

/// Runs every stream's loop on its own thread and the control connection on this one, from
/// `TEST_RUNNING` to the end of the drain after `EXCHANGE_RESULTS`.
fn run_streams(
    ctl: &mut Control<'_>,
    streams: &[DataStream],
    params: &Params,
    opt: &ThroughputOptions,
    clock: &Clock,
    on_interval: &mut dyn FnMut(&IntervalResult),
) -> Result<DataRun, ClientError> {
    let n = streams.len();
    // As against an agent: -n/-k's share per sending stream, and -O on top of -t.
    let spec = crate::throughput_spec(opt)?;
    let omit_ns = opt.omit.map_or(0, nanos);
    let shared = Shared {
        stops: (0..n).map(|_| AtomicBool::new(false)).collect(),
        expect: (0..n).map(|_| AtomicU64::new(u64::MAX)).collect(),
        counters: (0..n).map(|_| Counters::default()).collect(),
    };
    let cfg = LoopConfig {
        msg_size: opt.msg_size,
        bits_per_second: u64::try_from(params.bandwidth).unwrap_or(0),
        format: UdpFormat::Iperf3 {
            seq64: params.udp_counters_64bit,
        },
        // Counted (-n, -k): open-ended, up to iperf3's longest test.
        until_ns: if spec.bytes > 0 || spec.blocks > 0 {
            MAX_SECONDS.saturating_mul(1_000_000_000)
        } else {
            omit_ns.saturating_add(nanos(opt.duration))
        },
        omit_until_ns: omit_ns,
        send_limits: (0..n).map(|i| spec.send_limit(index_u32(i))).collect(),
        zerocopy: params.zerocopy != 0,
    };
    let (tx, rx) = mpsc::channel::<(usize, io::Result<Outcome>)>();
    thread::scope(|scope| {
        for (i, stream) in streams.iter().enumerate() {
            let tx = tx.clone();
            let (cfg, shared) = (&cfg, &shared);
            scope.spawn(move || {
                let r = run_loop(stream, cfg, clock, shared, i);
                let _ = tx.send((i, r));
            });
        }
        drop(tx);
        let mut ev = EventLoop {
            streams,
            shared: &shared,
            clock,
            until_ns: cfg.until_ns,
            count: if spec.bytes > 0 {
                Some(spec.bytes)
            } else if spec.blocks > 0 {
                Some(spec.blocks.saturating_mul(u64::from(spec.msg_size)))
            } else {
                None
            },
            omit_ns,
            written_at: None,
            udp: params.udp(),
            outcomes: (0..n).map(|_| None).collect(),
            intervals: opt
                .interval
                .map(|iv| Intervals::new(nanos(iv).max(1), (0..n).map(index_u32).collect())),
            cut: Vec::new(),
            end_ns: None,
        };
        let r = ev.drive(ctl, &rx, on_interval);
        // Whatever happened, every loop ends now; the scope waits for them.
        for s in &shared.stops {
            s.store(true, Ordering::Relaxed);
        }
        r?;
        let outcomes = ev
            .outcomes
            .into_iter()
            .enumerate()
            .map(|(i, o)| {
                o.ok_or_else(|| {
                    ClientError::Protocol(format!(
                        "internal: stream {} never ended",
                        wire::stream_id(i)
                    ))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(DataRun {
            outcomes,
            intervals: ev.cut,
            elapsed_ns: ev.end_ns.unwrap_or_else(|| clock.now_ns()),
        })
    })
}

struct LoopConfig {
    msg_size: u32,
    /// Per stream, UDP only; 0 = unlimited.
    bits_per_second: u64,
    format: UdpFormat,
    until_ns: u64,
    /// `-O` (TCP): what moves before this time on the clock is counted apart (0: nothing).
    omit_until_ns: u64,
    /// `-n`, `-k` (TCP): each stream's sender stops after this many bytes (`u64::MAX`: timed).
    send_limits: Vec<u64>,
    /// `-Z`: the TCP senders send with `MSG_ZEROCOPY`.
    zerocopy: bool,
}

fn run_loop(
    stream: &DataStream,
    cfg: &LoopConfig,
    clock: &Clock,
    shared: &Shared,
    i: usize,
) -> io::Result<Outcome> {
    let (stop, expect, counters) = (&shared.stops[i], &shared.expect[i], &shared.counters[i]);
    match (&stream.sock, stream.client_sends) {
        (DataSocket::Tcp(s), true) => {
            let opts = bulk::TcpSendOptions {
                omit_until_ns: cfg.omit_until_ns,
                max_bytes: cfg.send_limits[i],
                zerocopy: cfg.zerocopy,
                ..bulk::TcpSendOptions::until(cfg.msg_size, cfg.until_ns)
            };
            bulk::tcp_send(s, &opts, clock, stop, counters).map(Outcome::Sent)
        }
        (DataSocket::Tcp(s), false) => {
            let opts = bulk::TcpRecvOptions {
                omit_until_ns: cfg.omit_until_ns,
                ..bulk::TcpRecvOptions::default()
            };
            bulk::tcp_recv(s, &opts, clock, stop, counters).map(Outcome::TcpReceived)
        }
        (DataSocket::Udp(s), true) => bulk::udp_send(
            s,
            cfg.msg_size,
            cfg.bits_per_second,
            cfg.format,
            clock,
            cfg.until_ns,
            stop,
            counters,
        )
        .map(Outcome::Sent),
        (DataSocket::Udp(s), false) => {
            bulk::udp_recv(s, cfg.msg_size, cfg.format, clock, stop, expect, counters)
                .map(|o| Outcome::UdpReceived(Box::new(o)))
        }
    }
}

struct EventLoop<'a> {
    streams: &'a [DataStream],
    shared: &'a Shared,
    clock: &'a Clock,
    until_ns: u64,
    /// `-n`, `-k`: the payload bytes that end the test, sent by this host's streams or, in
    /// reverse mode, received by them (iperf3's own client ends so too).
    count: Option<u64>,
    /// `-O`: intervals that end by this time are the omit period's (0: none).
    omit_ns: u64,
    /// `-n`, `-k` when this host sends: when its last sender returned.
    written_at: Option<Instant>,
    udp: bool,
    outcomes: Vec<Option<Outcome>>,
    intervals: Option<Intervals>,
    cut: Vec<IntervalResult>,
    /// When `TEST_END` went out, on the test clock.
    end_ns: Option<u64>,
}

type Events = mpsc::Receiver<(usize, io::Result<Outcome>)>;

impl EventLoop<'_> {
    fn drive(
        &mut self,
        ctl: &mut Control<'_>,
        rx: &Events,
        on_interval: &mut dyn FnMut(&IntervalResult),
    ) -> Result<(), ClientError> {
        self.run_test(ctl, rx, on_interval)?;
        self.drain(ctl, rx, on_interval)
    }

    /// Until `EXCHANGE_RESULTS`: `TEST_END` at the end of the duration, data meanwhile.
    fn run_test(
        &mut self,
        ctl: &mut Control<'_>,
        rx: &Events,
        on_interval: &mut dyn FnMut(&IntervalResult),
    ) -> Result<(), ClientError> {
        loop {
            if ctl.interrupted() {
                return Err(ClientError::Interrupted);
            }
            while let Ok((i, r)) = rx.try_recv() {
                self.on_outcome(ctl, i, r)?;
            }
            self.poll_intervals(false, on_interval);
            let now_ns = self.clock.now_ns();
            if self.end_ns.is_none() && (now_ns >= self.until_ns || self.counted_out()) {
                // `TEST_END`; the server has RESULTS_TIMEOUT to ask for the results.
                ctl.talk.end_test(Instant::now());
                self.end_ns = Some(now_ns);
            }
            match ctl.poll_for(TICK)? {
                None => {}
                Some(Heard::ExchangeResults) => {
                    self.end_ns.get_or_insert_with(|| self.clock.now_ns());
                    return Ok(());
                }
                Some(other) => return Err(astray(&other)),
            }
        }
    }

    /// After `EXCHANGE_RESULTS` the server has stopped sending and closed its sockets: TCP
    /// receivers read to the end of their streams, UDP receivers until their socket is quiet.
    fn drain(
        &mut self,
        ctl: &mut Control<'_>,
        rx: &Events,
        on_interval: &mut dyn FnMut(&IntervalResult),
    ) -> Result<(), ClientError> {
        let started = Instant::now();
        let mut last = self.receiver_counts();
        let mut quiet_since = started;
        let mut stopped = false;
        while self.outcomes.iter().any(Option::is_none) {
            if ctl.interrupted() {
                return Err(ClientError::Interrupted);
            }
            let now = Instant::now();
            let counts = self.receiver_counts();
            if counts != last {
                last = counts;
                quiet_since = now;
            }
            let udp_quiet = self.udp && now.duration_since(quiet_since) >= UDP_QUIET;
            if !stopped && (udp_quiet || now.duration_since(started) >= DRAIN_LIMIT) {
                for s in &self.shared.stops {
                    s.store(true, Ordering::Relaxed);
                }
                stopped = true;
            }
            if now.duration_since(started) >= DRAIN_LIMIT + STOP_LIMIT {
                return Err(ClientError::Protocol(
                    "internal: a data stream did not stop".into(),
                ));
            }
            self.poll_intervals(false, on_interval);
            match rx.recv_timeout(TICK) {
                Ok((i, r)) => self.on_outcome(ctl, i, r)?,
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        self.poll_intervals(true, on_interval);
        Ok(())
    }

    /// `-n`, `-k`: this host's receivers have the count or, when it sends, every sender has
    /// written its share and the server's host has acknowledged all of it (within
    /// [`DRAIN_LIMIT`]): the server stops reading at `TEST_END`, so ending when the last write
    /// returned would leave what was still in flight uncounted at the server (a 24 MiB `-n`
    /// over loopback lost 4 MiB so).
    fn counted_out(&mut self) -> bool {
        let Some(count) = self.count else {
            return false;
        };
        if !self.streams.iter().any(|s| s.client_sends) {
            let received: u64 = self.receiver_counts().iter().map(|&(bytes, _)| bytes).sum();
            return received >= count;
        }
        let mut sending = self
            .streams
            .iter()
            .zip(&self.outcomes)
            .filter(|(s, _)| s.client_sends);
        if !sending.all(|(_, o)| o.is_some()) {
            return false;
        }
        let since = *self.written_at.get_or_insert_with(Instant::now);
        let in_flight = |s: &DataStream| match &s.sock {
            DataSocket::Tcp(t) => sonde_net::tcpinfo::TcpInfoSample::read(t).is_ok_and(|i| {
                i.unacked_segments.unwrap_or(0) > 0 || i.notsent_bytes.unwrap_or(0) > 0
            }),
            DataSocket::Udp(_) => false,
        };
        since.elapsed() >= DRAIN_LIMIT
            || !self
                .streams
                .iter()
                .filter(|s| s.client_sends)
                .any(in_flight)
    }

    fn receiver_counts(&self) -> Vec<(u64, u64)> {
        self.streams
            .iter()
            .zip(&self.shared.counters)
            .filter(|(s, _)| !s.client_sends)
            .map(|(_, c)| c.load())
            .collect()
    }

    /// A loop ended. Before `TEST_END` an error ends the test (the server may say why first);
    /// after it, the server closing its sockets is expected, and what the loop had counted
    /// stands.
    fn on_outcome(
        &mut self,
        ctl: &mut Control<'_>,
        i: usize,
        r: io::Result<Outcome>,
    ) -> Result<(), ClientError> {
        let outcome = match r {
            Ok(o) => o,
            Err(e) if self.end_ns.is_none() => {
                // The server's own account, if it sends one within half a second.
                ctl.talk.stream_failed(Instant::now());
                return Err(match ctl.next() {
                    Ok(Heard::NoAccount) => ClientError::Data(e, wire::stream_id(i)),
                    Ok(other) => astray(&other),
                    Err(o) => o.error(),
                });
            }
            Err(_) => self.counted_so_far(i),
        };
        if let Some(slot) = self.outcomes.get_mut(i) {
            *slot = Some(outcome);
        }
        Ok(())
    }

    /// A loop's outcome rebuilt from its live counters, for a stream cut after the test ended.
    fn counted_so_far(&self, i: usize) -> Outcome {
        let (bytes, packets) = self.shared.counters[i].load();
        let end = self.end_ns.unwrap_or_else(|| self.clock.now_ns());
        if self.streams[i].client_sends {
            Outcome::Sent(SendOutcome {
                bytes,
                packets,
                active_ns: end,
                retransmits: None,
                method: "",
                omitted_bytes: 0,
                omitted_packets: 0,
                zerocopy: None,
            })
        } else {
            Outcome::TcpReceived(TcpRecvOutcome {
                bytes,
                reads: packets,
                first_ns: 0,
                last_ns: end,
                omitted_bytes: 0,
            })
        }
    }

    /// Cuts `-i` intervals from every stream's counters (`last`: close the final one).
    fn poll_intervals(&mut self, last: bool, on_interval: &mut dyn FnMut(&IntervalResult)) {
        let Some(cutter) = self.intervals.as_mut() else {
            return;
        };
        let counts: Vec<(u64, u64)> = self.shared.counters.iter().map(Counters::load).collect();
        let now = self.clock.now_ns();
        let iv = if last {
            let iv = cutter.finish(now, &counts);
            self.intervals = None;
            iv
        } else {
            cutter.poll(now, &counts)
        };
        // The drain after the test can leave an empty last interval: nothing to report.
        if let Some(iv) = iv.filter(|iv| !(last && iv.bytes.iter().all(|&b| b == 0))) {
            let mut iv = crate::results::interval(
                &iv,
                self.streams.len(),
                crate::results::CountedBy::Client,
            );
            iv.omitted = self.omit_ns > 0 && iv.end_ns <= self.omit_ns;
            on_interval(&iv);
            self.cut.push(iv);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The session and the results
// ---------------------------------------------------------------------------------------------

/// One stream with both sides' accounts.
struct StreamRun {
    client_sends: bool,
    ours: Outcome,
    theirs: StreamResults,
}

/// A finished test.
struct Run {
    udp: bool,
    streams: Vec<StreamRun>,
    /// The server reported TCP retransmits for the streams it sent.
    server_retransmits: bool,
    intervals: Vec<IntervalResult>,
    elapsed_ns: u64,
    /// `DISPLAY_RESULTS` came (else the server closed after its results).
    clean_end: bool,
    /// This process's CPU over the data transfer; `None` where it cannot be measured.
    cpu: Option<CpuCost>,
    /// The socket options asked for and what this host's kernel made of them (the iperf3
    /// server does not say what its kernel did); `None` when none were asked.
    socket: Option<(sonde_wire::SocketOptions, sonde_wire::AppliedSocketOptions)>,
    /// Each stream's source at this host, in stream order.
    sources: Vec<Option<SocketAddr>>,
}

fn session(
    ctl: &mut Control<'_>,
    cookie: &Cookie,
    peer: SocketAddr,
    opt: &ThroughputOptions,
    on_interval: &mut dyn FnMut(&IntervalResult),
) -> Result<Run, ClientError> {
    // TCP -b is the streams' pacing, as against an agent; a value this host's kernel refuses
    // is a usage error before the server is asked.
    let socket = crate::throughput_socket(opt)?;
    let options = (!socket.is_default()).then(|| DataOptions::from(&socket));
    if let Some(o) = &options {
        o.try_on(
            crate::session::unspecified_like(peer),
            peer.ip(),
            opt.protocol == Protocol::Tcp,
        )
        .map_err(|e| crate::session::socket_refused(&e))?;
    }
    let params = params(opt, &socket);
    ctl.send_params(&params)?;
    let (streams, applied) = open_streams(ctl, cookie, &params, options.as_ref())?;
    let sources = streams.iter().map(|s| s.sock.local_addr()).collect();
    let socket = applied.map(|a| {
        let read_back = a.to_wire(&socket, !params.udp());
        (socket, read_back)
    });
    ctl.await_start()?;
    // TEST_START starts the duration; TEST_RUNNING (already read) the loops.
    let clock = Clock::start();
    let cpu = CpuMeter::start(CpuScope::Process);
    let data = run_streams(ctl, &streams, &params, opt, &clock, on_interval)?;
    drop(streams);
    let cpu = cpu.stop();
    let ours = our_results(&data, params.udp(), cpu);
    let theirs = ctl.exchange_results(&ours)?;
    let clean_end = ctl.finish()?;
    let mut runs = Vec::with_capacity(data.outcomes.len());
    for (i, ours) in data.outcomes.into_iter().enumerate() {
        let id = wire::stream_id(i);
        let theirs = theirs
            .streams
            .iter()
            .find(|s| s.id == id)
            .cloned()
            .ok_or_else(|| {
                ClientError::Protocol(format!(
                    "the iperf3 server at {peer} sent no results for stream {id}"
                ))
            })?;
        runs.push(StreamRun {
            client_sends: params.client_sends(i),
            ours,
            theirs,
        });
    }
    Ok(Run {
        udp: params.udp(),
        streams: runs,
        server_retransmits: theirs.sender_has_retransmits == 1,
        intervals: data.intervals,
        elapsed_ns: data.elapsed_ns,
        clean_end,
        cpu,
        socket,
        sources,
    })
}

/// iperf3's `packets` and `errors` for a UDP receiver: the highest sequence number seen (iperf3
/// numbers from 1, the tracker from 0) and how many below it never arrived.
fn iperf3_udp_counts(o: &UdpRecvOutcome) -> (u64, u64) {
    let packets = o.seq.highest().map_or(0, |h| h.saturating_add(1));
    (packets, packets.saturating_sub(o.seq.received()))
}

fn signed(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Our results message: per stream, what this host sent or received (docs/protocols/iperf3.md §10), and
/// this process's CPU use over the test (0 where the platform cannot say; iperf3 only prints it).
fn our_results(data: &DataRun, udp: bool, cpu: Option<CpuCost>) -> Results {
    let percent = |f: fn(&CpuCost) -> Option<f64>| cpu.as_ref().and_then(f).unwrap_or(0.0);
    let senders: Vec<&SendOutcome> = data
        .outcomes
        .iter()
        .filter_map(|o| match o {
            Outcome::Sent(s) => Some(s),
            _ => None,
        })
        .collect();
    let has_retransmits = if senders.is_empty() {
        -1
    } else if !udp && senders.iter().all(|s| s.retransmits.is_some()) {
        1
    } else {
        0
    };
    let end_time = data.elapsed_ns as f64 / 1e9;
    let streams = data
        .outcomes
        .iter()
        .enumerate()
        .map(|(i, o)| {
            let mut s = StreamResults {
                id: wire::stream_id(i),
                retransmits: -1,
                end_time,
                ..StreamResults::default()
            };
            match o {
                Outcome::Sent(out) => {
                    s.bytes = out.bytes;
                    if has_retransmits == 1 {
                        s.retransmits = out.retransmits.map_or(-1, signed);
                    }
                    if udp {
                        s.packets = signed(out.packets);
                    }
                }
                Outcome::TcpReceived(out) => s.bytes = out.bytes,
                Outcome::UdpReceived(out) => {
                    let (packets, errors) = iperf3_udp_counts(out);
                    s.bytes = out.bytes;
                    s.packets = signed(packets);
                    s.errors = signed(errors);
                    s.jitter = out.jitter.jitter_ns() as f64 / 1e9;
                }
            }
            s
        })
        .collect();
    Results {
        cpu_util_total: percent(CpuCost::percent_of_one_core),
        cpu_util_user: percent(CpuCost::user_percent_of_one_core),
        cpu_util_system: percent(CpuCost::system_percent_of_one_core),
        sender_has_retransmits: has_retransmits,
        congestion_used: None,
        streams,
        server_output_text: None,
        server_output_json: None,
    }
}

/// One stream of the document, and the count its loss is a share of.
fn stream_result(index: usize, s: &StreamRun, run: &Run) -> (StreamResult, u64) {
    let t = &s.theirs;
    // The server's stream time; its results may leave it out (then the test's).
    let their_ns = {
        let secs = t.end_time - t.start_time;
        if secs > 0.0 {
            (secs * 1e9) as u64
        } else {
            run.elapsed_ns
        }
    };
    let mut r = StreamResult {
        stream: index_u32(index),
        direction: if s.client_sends {
            StreamDirection::ClientToServer
        } else {
            StreamDirection::ServerToClient
        },
        receiver: side(0, 0, 0),
        sender: side(0, 0, 0),
        lost: None,
        loss_percent: None,
        duplicated: None,
        reordered: None,
        jitter_ns: None,
        retransmits: None,
        tcp_info: None,
    };
    let mut loss_of = 0;
    match &s.ours {
        Outcome::Sent(o) => {
            r.sender = side(o.bytes, o.packets, o.active_ns);
            r.retransmits = o.retransmits;
            if run.udp {
                // The server's counts: `packets` is the highest sequence number it saw.
                let packets = u64::try_from(t.packets).unwrap_or(0);
                let lost = u64::try_from(t.errors).unwrap_or(0).min(packets);
                r.receiver = side(t.bytes, packets - lost, their_ns);
                r.lost = Some(lost);
                r.loss_percent = Some(pct(lost, packets));
                r.jitter_ns = Some((t.jitter * 1e9).round() as u64);
                r.retransmits = None;
                loss_of = packets;
            } else {
                // An iperf3 server does not report its read calls.
                r.receiver = side(t.bytes, 0, their_ns);
            }
        }
        Outcome::TcpReceived(o) => {
            r.receiver = side(o.bytes, o.reads, o.last_ns.saturating_sub(o.first_ns));
            // Nor its write calls.
            r.sender = side(t.bytes, 0, their_ns);
            r.retransmits = (run.server_retransmits && t.retransmits >= 0)
                .then(|| u64::try_from(t.retransmits).unwrap_or(0));
        }
        Outcome::UdpReceived(o) => {
            let sent = u64::try_from(t.packets).unwrap_or(0);
            let lost = o.seq.lost(sent);
            r.receiver = side(
                o.bytes,
                o.seq.received(),
                o.last_ns.saturating_sub(o.first_ns),
            );
            r.sender = side(t.bytes, sent, their_ns);
            r.lost = Some(lost);
            r.loss_percent = Some(pct(lost, sent));
            r.duplicated = Some(o.seq.duplicated());
            r.reordered = Some(o.seq.reordered());
            r.jitter_ns = Some(o.jitter.jitter_ns());
            loss_of = sent;
        }
    }
    (r, loss_of)
}

/// The result document: each stream's receiver from whichever side received it.
fn document(
    target: &Target,
    opt: &ThroughputOptions,
    started_unix_ms: u64,
    run: &Run,
) -> ThroughputResult {
    let udp = run.udp;
    let (streams, loss_of): (Vec<StreamResult>, Vec<u64>) = run
        .streams
        .iter()
        .enumerate()
        .map(|(i, s)| stream_result(i, s, run))
        .unzip();
    let (receiver, sender) = crate::results::stream_totals(&streams);
    let sum = |f: fn(&StreamResult) -> Option<u64>| crate::results::sum_streams(&streams, f);
    let lost = if udp { sum(|s| s.lost) } else { None };
    let loss_whole: u64 = loss_of.iter().sum();
    let forward = streams
        .iter()
        .any(|s| s.direction == StreamDirection::ClientToServer);
    let backward = streams
        .iter()
        .any(|s| s.direction == StreamDirection::ServerToClient);

    let mut warnings: Vec<Warning> = Vec::new();
    if forward && !udp {
        warnings.push(Warning::Iperf3ReadsUncounted);
    }
    if backward && !udp {
        warnings.push(Warning::Iperf3WritesUncounted);
    }
    if forward && udp {
        warnings.push(Warning::Iperf3DatagramsCountedByServer);
    }
    if !run.intervals.is_empty() || opt.interval.is_some() {
        if forward && backward {
            warnings.push(Warning::IntervalsCountedHereBidir);
        } else if forward {
            warnings.push(Warning::IntervalsCountedAtSender);
        }
    }
    if let Some(l) = lost.filter(|&l| l > 0) {
        warnings.push(Warning::LostDatagrams {
            lost: l,
            sent: loss_whole,
            percent: pct(l, loss_whole),
        });
    }
    if udp && opt.bitrate > 0 {
        let per_direction = if forward && backward { 2.0 } else { 1.0 };
        let target_bps = opt.bitrate as f64 * per_direction;
        if sender.bits_per_second < target_bps * 0.95 {
            warnings.push(Warning::SenderLimited {
                reached_bits_per_second: sender.bits_per_second,
                asked_bits_per_second: target_bps,
            });
        }
    }
    if receiver.bytes == 0 {
        warnings.push(Warning::NothingReceived);
    }
    if !run.clean_end {
        warnings.push(Warning::UncleanEnd);
    }
    // -O: the bytes this host's receivers got in the omit period; an iperf3 server does not
    // report its own, so with streams it received the figure is unknown.
    let omit_ns = opt.omit.map(nanos).filter(|&ns| ns > 0);
    let omitted_bytes = omit_ns
        .filter(|_| run.streams.iter().all(|s| !s.client_sends))
        .map(|_| {
            run.streams
                .iter()
                .map(|s| match &s.ours {
                    Outcome::TcpReceived(o) => o.omitted_bytes,
                    _ => 0,
                })
                .sum()
        });
    let mut meta = crate::results::meta_for(
        target,
        Peer::Iperf3,
        sonde_wire::SessionId(0),
        started_unix_ms,
        0,
    );
    // This end only: an iperf3 server describes neither its host nor its CPU in a
    // form sonde can use (its cpu_util_* percentages are not comparable).
    meta.hosts = sonde_report::Hosts {
        client: Some(sonde_net::hostinfo::collect_for_peer(
            env!("CARGO_PKG_VERSION"),
            target.addr.ip(),
        )),
        server: None,
    };
    meta.cpu = sonde_report::CpuCosts {
        client: run.cpu.as_ref().map(|c| {
            sonde_report::CpuCost::from_report(
                sonde_report::CpuScope::Process,
                &c.report(None, None, None),
            )
        }),
        server: None,
    };
    // As opened here: an iperf3 server does not say where it saw them from.
    meta.sources = run
        .sources
        .iter()
        .enumerate()
        .map(|(i, a)| sonde_report::StreamSource {
            stream: index_u32(i),
            client: a.map(|a| a.to_string()),
            seen_by_server: None,
        })
        .collect();
    meta.add_all(&warnings);
    // -Z: this host's sends only; the iperf3 server sends with sendfile and does not say.
    let zerocopy = run
        .socket
        .as_ref()
        .is_some_and(|(asked, _)| asked.zerocopy && !udp)
        .then(|| sonde_report::EndsZerocopy {
            client: crate::results::sum_zerocopy(run.streams.iter().map(|s| match &s.ours {
                Outcome::Sent(o) => o.zerocopy,
                _ => None,
            })),
            server: None,
        });
    if let Some(z) = &zerocopy {
        crate::results::zerocopy_warnings(z, &mut meta);
    }
    ThroughputResult {
        meta,
        protocol: if udp {
            sonde_report::Protocol::Udp
        } else {
            sonde_report::Protocol::Tcp
        },
        direction: crate::results::direction_name(opt.direction),
        parallel: opt.parallel,
        // An iperf3 server reads its own way (its -l at a time); only this host's receivers,
        // in a reverse test, are known.
        read_size_bytes: (!udp && opt.direction == Direction::Reverse)
            .then_some(sonde_wire::DEFAULT_TCP_READ_SIZE),
        msg_size_bytes: opt.msg_size,
        target_bits_per_second: (udp && opt.bitrate > 0).then_some(opt.bitrate),
        duration_ns: if opt.bytes.is_some() || opt.blocks.is_some() {
            0
        } else {
            nanos(opt.duration)
        },
        receiver,
        sender,
        intervals: run.intervals.clone(),
        intervals_counted_at: match opt.direction {
            Direction::Forward => sonde_report::CountedAt::Sender,
            Direction::Reverse => sonde_report::CountedAt::Receiver,
            Direction::Bidir => sonde_report::CountedAt::ThisHost,
        },
        lost,
        loss_percent: lost.map(|l| pct(l, loss_whole)),
        jitter_ns: if udp {
            streams.iter().filter_map(|s| s.jitter_ns).max()
        } else {
            None
        },
        duplicated: if udp { sum(|s| s.duplicated) } else { None },
        reordered: if udp { sum(|s| s.reordered) } else { None },
        retransmits: if udp { None } else { sum(|s| s.retransmits) },
        streams,
        helpers: None,
        tuning: None,
        socket: run
            .socket
            .clone()
            .map(|(asked, client)| sonde_report::EndsSocket {
                asked,
                client,
                server: None,
            }),
        omit_ns,
        omitted_bytes,
        skip_rx_copy: false,
        zerocopy,
        // An iperf3 server does not report the marks its datagrams arrived with.
        ecn: None,
        bytes_to_send: opt.bytes,
        blocks_to_send: opt.blocks,
    }
}

#[cfg(test)]
mod tests;
