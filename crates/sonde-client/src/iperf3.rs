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
use sonde_net::control::ControlError;
use sonde_net::cpu::{CpuCost, CpuMeter, CpuScope};
use sonde_net::{Clock, Counters};
use sonde_report::{
    IntervalResult, Peer, StreamDirection, StreamResult, ThroughputResult, Warning,
};
use sonde_wire::iperf3::{self as wire, Cookie, Params, Results, State, StreamResults};
use sonde_wire::{Direction, Protocol};

use crate::results::{pct, side};
use crate::{ClientError, Target, ThroughputOptions};

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
/// A real iperf3 server answers the cookie at once (`PARAM_EXCHANGE`, or `ACCESS_DENIED` when
/// busy): silence this long means something else listens on the port.
const GREETING_TIMEOUT: Duration = Duration::from_secs(5);
/// Every later step: `CREATE_STREAMS` after the parameters, `TEST_START` after the last stream,
/// the server's results, `DISPLAY_RESULTS`; and a control write.
const STEP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a UDP stream waits for the server's connect reply (iperf3 waits 30 s).
const UDP_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// After `TEST_END`, the server has this long to ask for results.
const RESULTS_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the event loop looks at the control connection, the clock and Ctrl-C.
const TICK: Duration = Duration::from_millis(10);
/// After `EXCHANGE_RESULTS` a UDP receiver reads until its socket has been quiet this long (the
/// server stopped sending before it asked; this only empties the socket buffer).
const UDP_QUIET: Duration = Duration::from_millis(50);
/// After `IPERF_DONE`, how long the server may take to close the control connection (it does
/// at once) before this end stops waiting for it.
const CLOSE_WAIT: Duration = Duration::from_secs(1);
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
pub fn target(spec: &str) -> Option<Result<Target, ClientError>> {
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
    Some(crate::resolve(host, DEFAULT_PORT).map(|t| Target {
        label: format!("{SCHEME}{}", t.label),
        ..t
    }))
}

/// Runs a throughput test against the real `iperf3 -s` at `target`; `on_interval` sees each
/// `-i` interval as it is cut (counted at this host, see the module docs). Setting `interrupt`
/// ends the test: the server is told (`CLIENT_TERMINATE`) and the result is
/// [`ClientError::Interrupted`].
///
/// UDP `bitrate` is for all streams of one direction together, as everywhere in sonde; each
/// iperf3 stream gets its share as `bandwidth`. `bitrate` 0 sends unlimited (no `bandwidth`
/// key, which an iperf3 server also takes as unlimited for its own sending).
pub fn throughput(
    target: &Target,
    opt: &ThroughputOptions,
    interrupt: &AtomicBool,
    on_interval: &mut dyn FnMut(&IntervalResult),
) -> Result<ThroughputResult, ClientError> {
    check(opt)?;
    let started_unix_ms = crate::now_unix_ms();
    let cookie = fresh_cookie();
    let mut ctl = Control::open(target.addr, interrupt, &cookie)?;
    let run = session(&mut ctl, &cookie, target.addr, opt, on_interval);
    if matches!(run, Err(ClientError::Interrupted)) && ctl.params_sent {
        // Best effort: the server drops the test and prints "the client has terminated".
        let _ = ctl.send(State::ClientTerminate);
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
fn params(opt: &ThroughputOptions) -> Params {
    let udp = opt.protocol == Protocol::Udp;
    // iperf3's `time` is whole seconds; sonde ends the test itself at the exact -t, so this
    // only sets the server's failsafe (time + 40 s) and what its own report says.
    let secs = opt.duration.as_secs() + u64::from(opt.duration.subsec_nanos() > 0);
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
        omit: 0,
        time: i64::try_from(secs).unwrap_or(i64::MAX),
        num: 0,
        blockcount: 0,
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

/// Why a control read ended without its bytes.
enum ReadError {
    Timeout,
    Closed,
    Interrupted,
    Io(io::Error),
}

/// Why opening the control connection failed.
#[derive(Debug)]
enum Opening {
    /// Refused, or closed before any answer: perhaps an iperf3 server between two tests.
    Gap(ClientError),
    Failed(ClientError),
}

/// The control connection, with every read bounded by a deadline and by Ctrl-C.
struct Control<'a> {
    stream: TcpStream,
    peer: SocketAddr,
    interrupt: &'a AtomicBool,
    /// The server has our parameters: from here on it reads state bytes, so `CLIENT_TERMINATE`
    /// is understood.
    params_sent: bool,
}

impl<'a> Control<'a> {
    /// Connects and greets (the cookie, then `PARAM_EXCHANGE`), again after each of
    /// [`RELISTEN_PAUSES_MS`] while the server looks like an iperf3 server between two tests.
    fn open(
        peer: SocketAddr,
        interrupt: &'a AtomicBool,
        cookie: &Cookie,
    ) -> Result<Self, ClientError> {
        let mut pauses = RELISTEN_PAUSES_MS.iter();
        loop {
            let attempt = Self::connect(peer, interrupt).and_then(|mut ctl| {
                ctl.greet(cookie)?;
                Ok(ctl)
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

    fn connect(peer: SocketAddr, interrupt: &'a AtomicBool) -> Result<Self, Opening> {
        let stream =
            sonde_net::socket::tcp_connect(peer, CONNECT_TIMEOUT, true).map_err(|e| {
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
            interrupt,
            params_sent: false,
        })
    }

    fn interrupted(&self) -> bool {
        self.interrupt.load(Ordering::Relaxed)
    }

    /// Reads exactly `buf.len()` bytes before `deadline`, looking at Ctrl-C every [`TICK`].
    fn read_exact(&mut self, buf: &mut [u8], deadline: Instant) -> Result<(), ReadError> {
        let mut got = 0;
        while got < buf.len() {
            if self.interrupted() {
                return Err(ReadError::Interrupted);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ReadError::Timeout);
            }
            self.stream
                .set_read_timeout(Some(left.min(TICK)))
                .map_err(ReadError::Io)?;
            match self.stream.read(&mut buf[got..]) {
                Ok(0) => return Err(ReadError::Closed),
                Ok(n) => got += n,
                Err(e) if sonde_net::control::read_again(&e) => {}
                // A reset is how a server that closed with our bytes unread says goodbye.
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted
                    ) =>
                {
                    return Err(ReadError::Closed)
                }
                Err(e) => return Err(ReadError::Io(e)),
            }
        }
        Ok(())
    }

    /// One state byte before `deadline`.
    fn read_byte(&mut self, deadline: Instant) -> Result<u8, ReadError> {
        let mut b = [0u8; 1];
        self.read_exact(&mut b, deadline)?;
        Ok(b[0])
    }

    /// A state byte if one arrives within `wait`.
    fn poll_byte(&mut self, wait: Duration) -> Result<Option<u8>, ReadError> {
        match self.read_byte(Instant::now() + wait) {
            Ok(b) => Ok(Some(b)),
            Err(ReadError::Timeout) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn send(&mut self, state: State) -> Result<(), ClientError> {
        self.stream
            .write_all(&[state.byte()])
            .map_err(|e| control_io(&e))
    }

    fn send_json(&mut self, body: &[u8]) -> Result<(), ClientError> {
        let mut msg = Vec::with_capacity(4 + body.len());
        msg.extend_from_slice(&wire::json_prefix(body));
        msg.extend_from_slice(body);
        self.stream.write_all(&msg).map_err(|e| control_io(&e))
    }

    /// The server's explanation after a `SERVER_ERROR` byte: iperf3's message for the code,
    /// with the OS error where iperf3 adds it. An authentication failure sends only the code,
    /// so an early close after it is tolerated.
    fn server_error(&mut self) -> String {
        let deadline = Instant::now() + STEP_TIMEOUT;
        let mut code = [0u8; 4];
        if self.read_exact(&mut code, deadline).is_err() {
            return "the iperf3 server reported an error but not which".into();
        }
        let mut errno = [0u8; 4];
        let errno = match self.read_exact(&mut errno, deadline) {
            Ok(()) => i32::from_be_bytes(errno),
            Err(_) => 0,
        };
        server_error_text(i32::from_be_bytes(code), errno)
    }

    /// Sends the cookie and waits for `PARAM_EXCHANGE`.
    fn greet(&mut self, cookie: &Cookie) -> Result<(), Opening> {
        let peer = self.peer;
        let not_iperf3 = |what: String| {
            ClientError::NotIperf3(format!("{peer} is not an iperf3 server: {what}"))
        };
        // A busy server answers and closes without reading: its ACCESS_DENIED may be waiting
        // even when the cookie write fails.
        let wrote = self.stream.write_all(cookie.as_bytes());
        let e = match self.read_byte(Instant::now() + GREETING_TIMEOUT) {
            Ok(b) if b == State::ParamExchange.byte() => {
                return wrote.map_err(|e| Opening::Failed(control_io(&e)))
            }
            Ok(b) if b == State::AccessDenied.byte() => ClientError::Iperf3Refused(format!(
                "the iperf3 server at {peer} is busy running a test; try again later"
            )),
            Ok(b) if b == State::ServerError.byte() => {
                ClientError::Iperf3Refused(self.server_error())
            }
            Ok(b) => not_iperf3(format!(
                "it answered {} where iperf3 asks for the test parameters",
                self.describe_answer(b)
            )),
            Err(ReadError::Timeout) => not_iperf3(format!(
                "it said nothing for {} s after the cookie (an iperf3 server answers at once)",
                GREETING_TIMEOUT.as_secs()
            )),
            Err(ReadError::Closed) => {
                return Err(Opening::Gap(not_iperf3(
                    "it closed the connection without answering the cookie (a sonde agent does: for one, leave out iperf3://)".into(),
                )))
            }
            Err(ReadError::Interrupted) => ClientError::Interrupted,
            Err(ReadError::Io(e)) => control_io(&e),
        };
        Err(Opening::Failed(e))
    }

    /// `first` and whatever text follows at once, for a message: `0x53 ("SSH-2.0-OpenSSH")`.
    fn describe_answer(&mut self, first: u8) -> String {
        let mut text = [0u8; 48];
        text[0] = first;
        let _ = self
            .stream
            .set_read_timeout(Some(Duration::from_millis(100)));
        let n = 1 + self.stream.read(&mut text[1..]).unwrap_or(0);
        let line: String = String::from_utf8_lossy(&text[..n])
            .lines()
            .next()
            .unwrap_or_default()
            .chars()
            .filter(|c| !c.is_control())
            .collect();
        if line.len() >= 3 {
            format!("{first:#04x} ({line:?})")
        } else {
            format!("{first:#04x}")
        }
    }

    /// Sends the parameters and waits for `CREATE_STREAMS`.
    fn send_params(&mut self, params: &Params) -> Result<(), ClientError> {
        self.send_json(&params.to_json())?;
        self.params_sent = true;
        let peer = self.peer;
        match self.read_byte(Instant::now() + STEP_TIMEOUT) {
            Ok(b) if b == State::CreateStreams.byte() => Ok(()),
            Ok(b) if b == State::ServerError.byte() => Err(ClientError::Iperf3Refused(format!(
                "the iperf3 server at {peer} refused the test: {}",
                self.server_error()
            ))),
            Ok(b) if b == State::AccessDenied.byte() => Err(ClientError::Iperf3Refused(format!(
                "the iperf3 server at {peer} denied access to the test"
            ))),
            Ok(b) => Err(unexpected(b, "CREATE_STREAMS")),
            // What iperf3 does with parameters it will not run (a rate over its
            // --server-bitrate-limit, JSON it cannot read): close without a word.
            Err(ReadError::Closed) => Err(ClientError::Iperf3Refused(format!(
                "the iperf3 server at {peer} closed the connection after reading the test parameters: it refused them without saying why (its own log does; a rate over its --server-bitrate-limit is one cause)"
            ))),
            Err(e) => Err(self.read_failed(e, "CREATE_STREAMS")),
        }
    }

    /// Waits for `TEST_START` and `TEST_RUNNING` (often in one segment).
    fn await_start(&mut self) -> Result<(), ClientError> {
        let deadline = Instant::now() + STEP_TIMEOUT;
        for want in [State::TestStart, State::TestRunning] {
            match self.read_byte(deadline) {
                Ok(b) if b == want.byte() => {}
                Ok(b) => return Err(self.mid_test_state(b, &format!("{want:?}"))),
                Err(e) => return Err(self.read_failed(e, &format!("{want:?}"))),
            }
        }
        Ok(())
    }

    /// A state byte other than the one due: the server's own end of the test, or confusion.
    fn mid_test_state(&mut self, b: u8, due: &str) -> ClientError {
        match State::from_byte(b) {
            Some(State::ServerTerminate) => {
                // As iperf3 3.12 does before it closes.
                let _ = self.send(State::IperfDone);
                ClientError::Remote(
                    "the iperf3 server was stopped during the test (SERVER_TERMINATE)".into(),
                )
            }
            Some(State::ServerError) => ClientError::Remote(format!(
                "the iperf3 server ended the test: {}",
                self.server_error()
            )),
            Some(State::AccessDenied) => {
                ClientError::Remote("the iperf3 server denied access during the test".into())
            }
            _ => unexpected(b, due),
        }
    }

    fn read_failed(&self, e: ReadError, waiting_for: &str) -> ClientError {
        match e {
            ReadError::Interrupted => ClientError::Interrupted,
            ReadError::Closed => ClientError::Remote(format!(
                "the iperf3 server at {} closed the control connection while sonde waited for {waiting_for}",
                self.peer
            )),
            ReadError::Timeout => ClientError::Remote(format!(
                "the iperf3 server at {} sent no {waiting_for} in time",
                self.peer
            )),
            ReadError::Io(e) => control_io(&e),
        }
    }

    /// Reads the server's results JSON (its length checked before anything is allocated).
    fn read_results(&mut self) -> Result<Results, ClientError> {
        let deadline = Instant::now() + STEP_TIMEOUT;
        let mut prefix = [0u8; 4];
        self.read_exact(&mut prefix, deadline)
            .map_err(|e| self.read_failed(e, "its results"))?;
        let len = wire::json_len(prefix)
            .map_err(|e| ClientError::Protocol(format!("the iperf3 server's results: {e}")))?;
        let mut body = vec![0u8; len];
        self.read_exact(&mut body, deadline)
            .map_err(|e| self.read_failed(e, "its results"))?;
        Results::from_json(&body)
            .map_err(|e| ClientError::Protocol(format!("the iperf3 server's results: {e}")))
    }

    /// `DISPLAY_RESULTS`, answered with `IPERF_DONE`, then the server's close. `false` when the
    /// server closed instead (its results had arrived: the test is complete all the same).
    fn finish(&mut self) -> Result<bool, ClientError> {
        match self.read_byte(Instant::now() + STEP_TIMEOUT) {
            Ok(b) if b == State::DisplayResults.byte() => {
                self.send(State::IperfDone)?;
                self.await_close();
                Ok(true)
            }
            Ok(b) => Err(unexpected(b, "DISPLAY_RESULTS")),
            Err(ReadError::Closed) => Ok(false),
            Err(e) => Err(self.read_failed(e, "DISPLAY_RESULTS")),
        }
    }

    /// Waits (at most [`CLOSE_WAIT`]) for the server to close the control connection, which it
    /// does once it has read `IPERF_DONE` and left the test. A test started before that (the
    /// next step of a sweep, a script's next run) finds the server still in this one and is
    /// told it is busy. Nothing the server sends now changes the result, so any answer ends
    /// the wait.
    fn await_close(&mut self) {
        let _ = self.read_byte(Instant::now() + CLOSE_WAIT);
    }
}

fn control_io(e: &io::Error) -> ClientError {
    ClientError::Control(ControlError::Io(io::Error::new(e.kind(), e.to_string())))
}

fn unexpected(b: u8, due: &str) -> ClientError {
    let name =
        State::from_byte(b).map_or_else(|| "an undefined state".to_owned(), |s| format!("{s:?}"));
    ClientError::Protocol(format!(
        "the iperf3 server sent {name} ({b:#04x}) where {due} was due"
    ))
}

/// iperf3's wording for a `SERVER_ERROR`: the message for its code, and `strerror(errno)` where
/// iperf3 prints it ("unable to set TCP/SCTP MSS: Invalid argument").
fn server_error_text(code: i32, errno: i32) -> String {
    let msg = wire::error_message(code);
    if errno != 0 && wire::error_has_os_errno(code) {
        format!("{msg}: {}", strerror(errno))
    } else {
        msg.to_owned()
    }
}

/// `strerror(errno)` for an errno the server sent: this host's text where errno numbers are
/// POSIX's (std adds " (os error N)", which iperf3 does not print).
#[cfg(unix)]
fn strerror(errno: i32) -> String {
    let os = io::Error::from_raw_os_error(errno).to_string();
    os.split(" (os error").next().unwrap_or(&os).to_owned()
}

/// On Windows an OS error number means a Windows error (22 is "Bad command"), but an iperf3
/// server sends its own errno, nearly always Linux's: glibc's text for the errnos iperf3's
/// socket-option and setup errors carry, else the number.
#[cfg(not(unix))]
fn strerror(errno: i32) -> String {
    let text = match errno {
        1 => "Operation not permitted",
        2 => "No such file or directory",
        12 => "Cannot allocate memory",
        13 => "Permission denied",
        22 => "Invalid argument",
        24 => "Too many open files",
        90 => "Message too long",
        92 => "Protocol not available",
        95 => "Operation not supported",
        98 => "Address already in use",
        99 => "Cannot assign requested address",
        104 => "Connection reset by peer",
        105 => "No buffer space available",
        111 => "Connection refused",
        _ => return format!("errno {errno}"),
    };
    text.to_owned()
}

// ---------------------------------------------------------------------------------------------
// The data streams
// ---------------------------------------------------------------------------------------------

enum DataSocket {
    Tcp(TcpStream),
    Udp(UdpSocket),
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
) -> Result<Vec<DataStream>, ClientError> {
    let n = usize::try_from(params.streams()).unwrap_or(0);
    let mut streams = Vec::with_capacity(n);
    for i in 0..n {
        if ctl.interrupted() {
            return Err(ClientError::Interrupted);
        }
        let id = wire::stream_id(i);
        let sock = if params.udp() {
            DataSocket::Udp(udp_attach(ctl, params, i)?)
        } else {
            let mut s = sonde_net::socket::tcp_connect(ctl.peer, CONNECT_TIMEOUT, false)
                .map_err(|e| ClientError::Data(e, id))?;
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
    Ok(streams)
}

/// A UDP stream: a connected socket, `"9876"`, and the server's `"6789"` (or the legacy reply)
/// within [`UDP_CONNECT_TIMEOUT`]. Sent once: a second connect datagram would reach the socket
/// the server opens for the next stream.
fn udp_attach(ctl: &Control<'_>, params: &Params, index: usize) -> Result<UdpSocket, ClientError> {
    let id = wire::stream_id(index);
    let sock = sonde_net::socket::udp_connect(ctl.peer).map_err(|e| ClientError::Data(e, id))?;
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
        until_ns: nanos(opt.duration),
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
            bulk::tcp_send(s, cfg.msg_size, clock, cfg.until_ns, stop, counters).map(Outcome::Sent)
        }
        (DataSocket::Tcp(s), false) => {
            bulk::tcp_recv(s, sonde_wire::DEFAULT_TCP_READ_SIZE, clock, stop, counters)
                .map(Outcome::TcpReceived)
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
        let mut end_sent_at: Option<Instant> = None;
        loop {
            if ctl.interrupted() {
                return Err(ClientError::Interrupted);
            }
            while let Ok((i, r)) = rx.try_recv() {
                self.on_outcome(ctl, i, r)?;
            }
            self.poll_intervals(false, on_interval);
            let now_ns = self.clock.now_ns();
            if end_sent_at.is_none() && now_ns >= self.until_ns {
                ctl.send(State::TestEnd)?;
                end_sent_at = Some(Instant::now());
                self.end_ns = Some(now_ns);
            }
            if end_sent_at.is_some_and(|t| t.elapsed() > RESULTS_TIMEOUT) {
                return Err(ClientError::Remote(format!(
                    "the iperf3 server did not ask for results within {} s of the test's end",
                    RESULTS_TIMEOUT.as_secs()
                )));
            }
            match ctl.poll_byte(TICK) {
                Ok(None) => {}
                Ok(Some(b)) if b == State::ExchangeResults.byte() => {
                    self.end_ns.get_or_insert_with(|| self.clock.now_ns());
                    return Ok(());
                }
                Ok(Some(b)) => return Err(ctl.mid_test_state(b, "EXCHANGE_RESULTS")),
                Err(ReadError::Closed) => {
                    return Err(ClientError::Remote(format!(
                        "the iperf3 server at {} closed the control connection during the test",
                        ctl.peer
                    )))
                }
                Err(e) => return Err(ctl.read_failed(e, "EXCHANGE_RESULTS")),
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
                return Err(match ctl.poll_byte(Duration::from_millis(500)) {
                    Ok(Some(b)) => ctl.mid_test_state(b, "nothing"),
                    _ => ClientError::Data(e, wire::stream_id(i)),
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
            })
        } else {
            Outcome::TcpReceived(TcpRecvOutcome {
                bytes,
                reads: packets,
                first_ns: 0,
                last_ns: end,
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
            let iv = crate::results::interval(&iv, self.streams.len());
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
}

fn session(
    ctl: &mut Control<'_>,
    cookie: &Cookie,
    peer: SocketAddr,
    opt: &ThroughputOptions,
    on_interval: &mut dyn FnMut(&IntervalResult),
) -> Result<Run, ClientError> {
    let params = params(opt);
    ctl.send_params(&params)?;
    let streams = open_streams(ctl, cookie, &params)?;
    ctl.await_start()?;
    // TEST_START starts the duration; TEST_RUNNING (already read) the loops.
    let clock = Clock::start();
    let cpu = CpuMeter::start(CpuScope::Process);
    let data = run_streams(ctl, &streams, &params, opt, &clock, on_interval)?;
    drop(streams);
    let cpu = cpu.stop();
    let ours = our_results(&data, params.udp(), cpu);
    ctl.send_json(&ours.to_json())?;
    let theirs = ctl.read_results()?;
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
    meta.add_all(&warnings);
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
        duration_ns: nanos(opt.duration),
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sonde_engine::seq::SeqTracker;

    fn opt(protocol: Protocol, direction: Direction) -> ThroughputOptions {
        ThroughputOptions {
            protocol,
            parallel: 2,
            direction,
            msg_size: if protocol == Protocol::Udp {
                1400
            } else {
                128 << 10
            },
            bitrate: 20_000_000,
            duration: Duration::from_millis(1500),
            interval: None,
            cpus: Vec::new(),
            read_size: None,
        }
    }

    #[test]
    fn only_iperf3_urls_are_iperf3_targets() {
        assert!(target("127.0.0.1").is_none());
        assert!(target("127.0.0.1:5300").is_none());
        assert!(target("sockperf://127.0.0.1").is_none());
        let t = target("iperf3://127.0.0.1").unwrap().unwrap();
        assert_eq!(t.addr, "127.0.0.1:5201".parse().unwrap());
        assert_eq!(t.label, "iperf3://127.0.0.1:5201");
        let t = target("IPERF3://127.0.0.1:7000/").unwrap().unwrap();
        assert_eq!(t.addr.port(), 7000);
        let t = target("iperf3://[::1]:7000").unwrap().unwrap();
        assert!(t.addr.is_ipv6() && t.addr.port() == 7000);
        let t = target("iperf3://::1").unwrap().unwrap();
        assert_eq!(t.addr.port(), DEFAULT_PORT);
        assert!(matches!(
            target("iperf3://"),
            Some(Err(ClientError::Usage(_)))
        ));
        assert!(matches!(
            target("iperf3://host/path"),
            Some(Err(ClientError::Usage(_)))
        ));
    }

    #[test]
    fn parameters_are_what_a_real_client_sends() {
        // The key set and order of docs/protocols/iperf3.md §6 "For our client": UDP adds bandwidth (per
        // stream: sonde's -b is for all streams together) and 64-bit counters.
        let json = params(&opt(Protocol::Udp, Direction::Reverse)).to_json();
        assert_eq!(
            String::from_utf8(json).unwrap(),
            r#"{"udp":true,"omit":0,"time":2,"num":0,"blockcount":0,"parallel":2,"reverse":true,"len":1400,"bandwidth":10000000,"pacing_timer":1000,"udp_counters_64bit":1,"client_version":"3.12"}"#
        );
        let json = params(&opt(Protocol::Tcp, Direction::Bidir)).to_json();
        assert_eq!(
            String::from_utf8(json).unwrap(),
            r#"{"tcp":true,"omit":0,"time":2,"num":0,"blockcount":0,"parallel":2,"bidirectional":true,"len":131072,"pacing_timer":1000,"client_version":"3.12"}"#
        );
        // Unlimited UDP: no bandwidth key.
        let mut o = opt(Protocol::Udp, Direction::Forward);
        o.bitrate = 0;
        assert!(!String::from_utf8(params(&o).to_json())
            .unwrap()
            .contains("bandwidth"));
    }

    #[test]
    fn options_beyond_iperf3s_limits_are_usage_errors() {
        let mut o = opt(Protocol::Udp, Direction::Forward);
        assert!(check(&o).is_ok());
        o.msg_size = 15;
        assert!(matches!(check(&o), Err(ClientError::Usage(_))));
        o.msg_size = 65_508;
        assert!(matches!(check(&o), Err(ClientError::Usage(_))));
        let mut o = opt(Protocol::Tcp, Direction::Forward);
        o.parallel = 129;
        assert!(matches!(check(&o), Err(ClientError::Usage(_))));
        o.parallel = 1;
        o.duration = Duration::ZERO;
        assert!(matches!(check(&o), Err(ClientError::Usage(_))));
    }

    #[test]
    fn cookies_are_fresh_and_from_iperf3s_alphabet() {
        let (a, b) = (fresh_cookie(), fresh_cookie());
        assert_ne!(a, b);
        let bytes = a.as_bytes();
        assert_eq!(bytes[wire::COOKIE_LEN - 1], 0);
        assert!(bytes[..wire::COOKIE_LEN - 1]
            .iter()
            .all(|c| wire::COOKIE_ALPHABET.contains(c)));
    }

    /// A listener on loopback for a fake iperf3 server, and its address.
    fn fake_listener() -> (std::net::TcpListener, SocketAddr) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        (l, addr)
    }

    fn read_cookie(conn: &mut TcpStream) -> [u8; wire::COOKIE_LEN] {
        conn.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut cookie = [0u8; wire::COOKIE_LEN];
        conn.read_exact(&mut cookie).unwrap();
        cookie
    }

    #[test]
    fn a_server_between_two_tests_is_tried_again() {
        // An iperf3 server reopening its listener after a test: the first connection is
        // closed unanswered (a sweep's next step lands there), the next one is greeted.
        let (listener, addr) = fake_listener();
        let server = thread::spawn(move || {
            drop(listener.accept().unwrap());
            let (mut conn, _) = listener.accept().unwrap();
            let cookie = read_cookie(&mut conn);
            conn.write_all(&[State::ParamExchange.byte()]).unwrap();
            (cookie, conn)
        });
        let interrupt = AtomicBool::new(false);
        let cookie = fresh_cookie();
        let opened = Control::open(addr, &interrupt, &cookie);
        assert!(opened.is_ok(), "{:?}", opened.err());
        let (seen, _conn) = server.join().unwrap();
        assert_eq!(
            &seen,
            cookie.as_bytes(),
            "the same cookie on the second try"
        );
    }

    #[test]
    fn a_busy_server_is_not_tried_again() {
        let (listener, addr) = fake_listener();
        let server = thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            conn.write_all(&[State::AccessDenied.byte()]).unwrap();
            listener
        });
        let interrupt = AtomicBool::new(false);
        let r = Control::open(addr, &interrupt, &fresh_cookie());
        assert!(
            matches!(r, Err(ClientError::Iperf3Refused(_))),
            "{:?}",
            r.err()
        );
        // `open` has returned, so a second attempt would be waiting to be accepted.
        let listener = server.join().unwrap();
        listener.set_nonblocking(true).unwrap();
        assert_eq!(
            listener.accept().map(|_| ()).unwrap_err().kind(),
            io::ErrorKind::WouldBlock,
            "busy is an answer: no second connection"
        );
    }

    #[test]
    fn a_test_ends_once_the_server_has_closed_the_connection() {
        // Until the server closes, it is still in this test and answers the next one "busy".
        let (listener, addr) = fake_listener();
        let closed = std::sync::Arc::new(AtomicBool::new(false));
        let server = thread::spawn({
            let closed = closed.clone();
            move || {
                let (mut conn, _) = listener.accept().unwrap();
                conn.write_all(&[State::DisplayResults.byte()]).unwrap();
                conn.set_read_timeout(Some(Duration::from_secs(10)))
                    .unwrap();
                let mut done = [0u8; 1];
                conn.read_exact(&mut done).unwrap();
                // The server's own cleanup, well inside the client's wait for the close.
                thread::sleep(Duration::from_millis(200));
                closed.store(true, Ordering::SeqCst);
                drop(conn);
                done[0]
            }
        });
        let interrupt = AtomicBool::new(false);
        let mut ctl = Control::connect(addr, &interrupt).unwrap();
        assert!(ctl.finish().unwrap(), "DISPLAY_RESULTS came");
        assert!(
            closed.load(Ordering::SeqCst),
            "finish returned before the close"
        );
        assert_eq!(server.join().unwrap(), State::IperfDone.byte());
    }

    #[test]
    fn server_errors_read_as_iperf3_prints_them() {
        // docs/protocols/iperf3.md §12: IESETMSS with EINVAL.
        assert_eq!(
            server_error_text(123, 22),
            "unable to set TCP/SCTP MSS: Invalid argument"
        );
        // No OS error for this code (and none sent, as after an authentication failure).
        assert_eq!(server_error_text(142, 0), "test authorization failed");
        assert_eq!(
            server_error_text(27, 22),
            "total required bandwidth is larger than server limit"
        );
    }

    fn udp_received(seqs: &[u64], bytes_each: u64) -> UdpRecvOutcome {
        let mut seq = SeqTracker::new();
        for &s in seqs {
            seq.on_packet(s);
        }
        UdpRecvOutcome {
            bytes: bytes_each * seqs.len() as u64,
            packets: seqs.len() as u64,
            first_ns: 1_000,
            last_ns: 1_000_000_000,
            malformed: 0,
            seq,
            jitter: sonde_engine::jitter::Jitter::default(),
        }
    }

    fn sent(bytes: u64, packets: u64) -> SendOutcome {
        SendOutcome {
            bytes,
            packets,
            active_ns: 1_000_000_000,
            retransmits: Some(3),
            method: "write",
        }
    }

    #[test]
    fn our_results_describe_each_stream_as_iperf3_does() {
        let data = DataRun {
            outcomes: vec![
                Outcome::Sent(sent(14_000, 10)),
                // Tracker seqs 0, 1, 3, 5: iperf3 packets 6 (highest seq 6), errors 2.
                Outcome::UdpReceived(Box::new(udp_received(&[0, 1, 3, 5], 1400))),
            ],
            intervals: Vec::new(),
            elapsed_ns: 1_500_000_000,
        };
        let r = our_results(&data, true, None);
        // Bidir UDP: a sender without retransmit counts.
        assert_eq!(r.sender_has_retransmits, 0);
        let (s, rx) = (&r.streams[0], &r.streams[1]);
        assert_eq!(
            (s.id, s.bytes, s.packets, s.errors, s.retransmits),
            (1, 14_000, 10, 0, -1)
        );
        assert_eq!((rx.id, rx.bytes, rx.packets, rx.errors), (3, 5_600, 6, 2));
        assert!((rx.end_time - 1.5).abs() < 1e-9);
        // It parses back as the server will read it.
        let back = Results::from_json(&r.to_json()).unwrap();
        assert_eq!(back.streams.len(), 2);

        // TCP: a pure receiver says -1; a sender with TCP_INFO reports its retransmits.
        let rx_only = DataRun {
            outcomes: vec![Outcome::TcpReceived(TcpRecvOutcome {
                bytes: 5,
                reads: 1,
                first_ns: 1,
                last_ns: 2,
            })],
            intervals: Vec::new(),
            elapsed_ns: 1,
        };
        assert_eq!(
            our_results(&rx_only, false, None).sender_has_retransmits,
            -1
        );
        let tx = DataRun {
            outcomes: vec![Outcome::Sent(sent(5, 1))],
            intervals: Vec::new(),
            elapsed_ns: 1,
        };
        let r = our_results(&tx, false, None);
        assert_eq!((r.sender_has_retransmits, r.streams[0].retransmits), (1, 3));
    }

    fn theirs(id: u32, bytes: u64, packets: i64, errors: i64) -> StreamResults {
        StreamResults {
            id,
            bytes,
            retransmits: -1,
            jitter: 0.000_012,
            errors,
            packets,
            start_time: 0.0,
            end_time: 1.0,
            ..StreamResults::default()
        }
    }

    fn target_label() -> Target {
        Target {
            addr: "127.0.0.1:5201".parse().unwrap(),
            label: "127.0.0.1:5201".into(),
            secret: None,
        }
    }

    #[test]
    fn forward_udp_takes_the_receiver_from_the_servers_results() {
        let run = Run {
            udp: true,
            streams: vec![StreamRun {
                client_sends: true,
                ours: Outcome::Sent(sent(1_400_000, 1_000)),
                // The server saw up to seq 990, 10 of them missing.
                theirs: theirs(1, 1_372_000, 990, 10),
            }],
            server_retransmits: false,
            intervals: Vec::new(),
            elapsed_ns: 1_000_000_000,
            clean_end: true,
            cpu: None,
        };
        let o = opt(Protocol::Udp, Direction::Forward);
        let doc = document(&target_label(), &o, 1, &run);
        assert_eq!(doc.meta.peer, Peer::Iperf3);
        assert_eq!(doc.meta.session, 0);
        let s = &doc.streams[0];
        assert_eq!(s.direction, StreamDirection::ClientToServer);
        assert_eq!((s.receiver.bytes, s.receiver.packets), (1_372_000, 980));
        assert_eq!(s.receiver.duration_ns, 1_000_000_000);
        assert_eq!((s.sender.bytes, s.sender.packets), (1_400_000, 1_000));
        assert_eq!(s.lost, Some(10));
        assert_eq!(s.jitter_ns, Some(12_000));
        // Not reported by an iperf3 server: null, and the warnings say why.
        assert_eq!(
            (s.duplicated, s.reordered, s.retransmits),
            (None, None, None)
        );
        assert_eq!((doc.duplicated, doc.reordered), (None, None));
        assert_eq!(doc.lost, Some(10));
        assert!((doc.loss_percent.unwrap() - 10.0 * 100.0 / 990.0).abs() < 1e-9);
        let w = doc.meta.warnings.join("\n");
        assert!(w.contains("no duplicates or reordering"), "{w}");
        assert!(w.contains("10 of 990 datagrams were lost"), "{w}");
    }

    #[test]
    fn reverse_udp_counts_loss_against_what_the_server_sent() {
        let run = Run {
            udp: true,
            streams: vec![StreamRun {
                client_sends: false,
                // Received tracker seqs 0..=3 and 5 (one duplicate of 5) of 8 sent.
                ours: Outcome::UdpReceived(Box::new(udp_received(&[0, 1, 2, 3, 5, 5], 1400))),
                theirs: theirs(1, 11_200, 8, 0),
            }],
            server_retransmits: false,
            intervals: Vec::new(),
            elapsed_ns: 1_000_000_000,
            clean_end: true,
            cpu: None,
        };
        let o = opt(Protocol::Udp, Direction::Reverse);
        let doc = document(&target_label(), &o, 1, &run);
        let s = &doc.streams[0];
        assert_eq!(s.direction, StreamDirection::ServerToClient);
        assert_eq!(s.receiver.packets, 5);
        assert_eq!((s.sender.bytes, s.sender.packets), (11_200, 8));
        // 8 sent, 5 unique received: 3 lost, the tail included.
        assert_eq!((s.lost, s.duplicated), (Some(3), Some(1)));
        assert_eq!(doc.loss_percent, Some(37.5));
    }

    #[test]
    fn tcp_bidir_warns_about_counts_an_iperf3_server_does_not_report() {
        let run = Run {
            udp: false,
            streams: vec![
                StreamRun {
                    client_sends: true,
                    ours: Outcome::Sent(sent(2_000, 2)),
                    theirs: theirs(1, 1_900, 0, 0),
                },
                StreamRun {
                    client_sends: false,
                    ours: Outcome::TcpReceived(TcpRecvOutcome {
                        bytes: 3_000,
                        reads: 3,
                        first_ns: 10,
                        last_ns: 1_000_000_010,
                    }),
                    theirs: StreamResults {
                        retransmits: 7,
                        ..theirs(3, 3_000, 0, 0)
                    },
                },
            ],
            server_retransmits: true,
            intervals: Vec::new(),
            elapsed_ns: 1_000_000_000,
            clean_end: false,
            cpu: None,
        };
        let mut o = opt(Protocol::Tcp, Direction::Bidir);
        o.parallel = 1;
        o.interval = Some(Duration::from_secs(1));
        let doc = document(&target_label(), &o, 1, &run);
        assert_eq!(doc.receiver.bytes, 4_900);
        assert_eq!(doc.sender.bytes, 5_000);
        assert_eq!(doc.streams[0].retransmits, Some(3));
        assert_eq!(doc.streams[1].retransmits, Some(7));
        assert_eq!(doc.retransmits, Some(10));
        assert_eq!((doc.lost, doc.jitter_ns), (None, None));
        let w = doc.meta.warnings.join("\n");
        assert!(w.contains("read calls") && w.contains("write calls"), "{w}");
        assert!(w.contains("intervals (-i)"), "{w}");
        assert!(w.contains("DISPLAY_RESULTS"), "{w}");
    }
}
