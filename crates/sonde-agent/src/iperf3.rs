//! The iperf3 compatibility listener: answers real `iperf3 -c` clients (docs/protocols/iperf3.md),
//! several at once, under the agent's limits.
//!
//! One TCP listener and one UDP socket share a port number, as with iperf3. Every new TCP
//! connection starts with a 37-byte cookie (read with the agent's hello timeout). If the cookie
//! names a running test, the connection is one of its data streams: accepted while that test
//! waits for its streams (CREATE_STREAMS) and comes from the control connection's IP address,
//! refused with ACCESS_DENIED otherwise. Any other cookie opens a new test, admitted against
//! `max_sessions` together with sonde's own sessions; when full it gets ACCESS_DENIED, which the
//! client prints as "the server is busy running a test. try again later".
//!
//! UDP streams attach with a 4-byte datagram that carries no cookie, so only one test at a time
//! may be attaching UDP streams (others wait before they send CREATE_STREAMS), and only
//! datagrams from that test's control-connection IP count. Each attached stream gets a socket on
//! the shared port connected to the client's socket ([`sonde_net::socket::udp_flow`]), from
//! which the `"6789"` reply goes out; the kernel then hands that peer's datagrams to it.
//!
//! The control connection's conversation, from PARAM_EXCHANGE to the end, is a state machine
//! without sockets ([`conversation`]); `session` drives it here until the streams are attached
//! (the attach waits and the UDP gate are this module's), and [`run`] from there: the data
//! streams, the results.

mod conversation;
mod run;
mod text;

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use sonde_net::control::{read_exact_by, ControlError};
use sonde_net::socket::{DataOptionError, DataOptions};
use sonde_wire::iperf3::{errno, Cookie, Params, State, COOKIE_LEN, UDP_CONNECT_REPLY};

use conversation::{Conversation, Ended, Host, Output};

use crate::admission::{self, Door};
use crate::{canonical, lock, peer_of, CompatListener, CompatSession, PendingGuard, Shared};

/// How long a client has to open all its data streams after CREATE_STREAMS.
const ATTACH_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a UDP test waits for another test to finish attaching its UDP streams before it
/// gives up (and answers ACCESS_DENIED, as a busy iperf3 server would): longer than one test
/// may hold it.
const UDP_GATE_WAIT: Duration = Duration::from_secs(15);
/// How often waits look at the agent's shutdown flag and the control connection.
const POLL: Duration = Duration::from_millis(100);
/// Bound on a blocked write to a client's control connection.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// `EINVAL`, sent with `SERVER_ERROR` codes that iperf3 prints with `strerror(errno)`.
const EINVAL: i32 = 22;

/// A refusal: `(i_errno, errno, why)`, sent as SERVER_ERROR; `why` goes to the log.
type Refusal = (i32, i32, String);

/// State shared by the listener's threads.
struct Listener {
    shared: Arc<Shared>,
    /// The bound address of the TCP listener and UDP socket (the flow sockets bind it too).
    local: SocketAddr,
    /// Tests from admission to their end, for matching data connections by cookie.
    tests: Mutex<Vec<Arc<Attach>>>,
    /// The test allowed to attach UDP streams now, if any.
    gate: Gate,
    /// Tests so far, numbered for the log.
    next_test: AtomicU64,
}

/// A test as data connections see it.
struct Attach {
    cookie: Cookie,
    peer_ip: IpAddr,
    state: Mutex<AttachState>,
    joined: Condvar,
}

#[derive(Default)]
struct AttachState {
    /// Between CREATE_STREAMS and the last TCP stream: data connections are taken.
    open: bool,
    /// TCP streams the test expects.
    expected: usize,
    /// TCP streams so far, with the listener's accept index (their order on the wire).
    streams: Vec<(u64, TcpStream)>,
}

/// Accepts iperf3 control and data connections until the agent shuts down.
pub(crate) fn serve(listener: CompatListener, shared: &Arc<Shared>) {
    let CompatListener { tcp, udp } = listener;
    let local = match udp.local_addr() {
        Ok(a) => a,
        Err(e) => {
            shared.report(|| crate::AgentEvent::Iperf3ListenerFailed {
                error: e.to_string(),
            });
            return;
        }
    };
    let state = Arc::new(Listener {
        shared: Arc::clone(shared),
        local,
        tests: Mutex::new(Vec::new()),
        gate: Gate::default(),
        next_test: AtomicU64::new(1),
    });
    let udp_state = Arc::clone(&state);
    let udp_thread = thread::Builder::new()
        .name("sonde-iperf3-udp".into())
        .spawn(move || udp_dispatch(&udp, &udp_state))
        .ok();
    // The accept index orders data streams: a real client opens stream k+1 only after stream
    // k's connection and cookie, so accept order is the client's order (docs/protocols/iperf3.md §7).
    let connections = std::iter::from_fn(|| crate::next_connection(&tcp, shared));
    for (index, stream) in (0u64..).zip(connections) {
        // A source may hold as many more pending connections as its tests still expect
        // streams: a client's own -P burst is never refused.
        let allowance = |ip| {
            lock(&state.tests)
                .iter()
                .filter(|t| canonical(t.peer_ip) == ip)
                .map(|t| {
                    let st = lock(&t.state);
                    st.expected.saturating_sub(st.streams.len())
                })
                .fold(0, usize::saturating_add)
        };
        let Some(guard) = admission::let_in(shared, Door::Iperf3, &stream, allowance) else {
            continue;
        };
        let conn_state = Arc::clone(&state);
        // A failed spawn drops the closure, and with it the connection and its pending place.
        let _ = thread::Builder::new()
            .name("sonde-iperf3".into())
            .spawn(move || handle_connection(stream, index, &conn_state, guard));
    }
    if let Some(t) = udp_thread {
        let _ = t.join();
    }
}

/// Reads a new connection's cookie and hands it to its test or starts a test with it.
fn handle_connection(mut stream: TcpStream, index: u64, l: &Listener, pending: PendingGuard) {
    let shared = &*l.shared;
    let mut cookie = [0u8; COOKIE_LEN];
    let deadline = Instant::now() + shared.cfg.hello_timeout;
    if let Err(e) = read_exact_by(&mut stream, &mut cookie, deadline) {
        shared.rejections.bad_hello.fetch_add(1, Ordering::Relaxed);
        if !matches!(e, ControlError::Closed) {
            shared.report(|| crate::AgentEvent::Iperf3NoCookie {
                peer: peer_of(&stream),
                error: e.to_string(),
            });
        }
        return;
    }
    let cookie = Cookie::from_bytes(cookie);
    let test = lock(&l.tests)
        .iter()
        .find(|t| t.cookie.matches(cookie.as_bytes()))
        .cloned();
    if let Some(test) = test {
        drop(pending);
        attach_tcp(stream, index, &test, shared);
        return;
    }
    if shared.shutdown.load(Ordering::Relaxed) {
        deny(&mut stream);
        return;
    }
    let admitted = stream
        .peer_addr()
        .ok()
        .and_then(|peer| shared.admit_compat(peer.ip()));
    let Some(admitted) = admitted else {
        shared.rejections.refused.fetch_add(1, Ordering::Relaxed);
        shared.report(|| crate::AgentEvent::Iperf3Busy {
            peer: peer_of(&stream),
            max_sessions: shared.cfg.max_sessions,
            max_sessions_per_source: shared.cfg.max_sessions_per_source,
        });
        deny(&mut stream);
        return;
    };
    drop(pending);
    session(stream, cookie, &admitted, l);
}

/// ACCESS_DENIED, then close: what iperf3 sends when busy and for a bad data cookie.
fn deny(stream: &mut TcpStream) {
    let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
    let _ = stream.write_all(&[State::AccessDenied.byte()]);
}

/// A data connection whose cookie names a test: take it if the test is waiting for it.
fn attach_tcp(mut stream: TcpStream, index: u64, test: &Attach, shared: &Shared) {
    let from = stream.peer_addr().ok();
    let same_ip = from.is_some_and(|a| canonical(a.ip()) == canonical(test.peer_ip));
    let mut st = lock(&test.state);
    if st.open && st.streams.len() < st.expected && same_ip {
        st.streams.push((index, stream));
        test.joined.notify_all();
        return;
    }
    drop(st);
    shared.rejections.bad_join.fetch_add(1, Ordering::Relaxed);
    shared.report(|| crate::AgentEvent::Iperf3StreamRefused {
        peer: from.map_or_else(|| "?".into(), |a| a.to_string()),
        cookie: test.cookie.text().to_string(),
        reason: if same_ip {
            "the test is not waiting for streams"
        } else {
            "not from the control connection's address"
        },
    });
    deny(&mut stream);
}

/// Removes a test from the listener's list when it ends, however it ends.
struct Registered<'a> {
    l: &'a Listener,
    test: Arc<Attach>,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        lock(&self.l.tests).retain(|t| !Arc::ptr_eq(t, &self.test));
    }
}

/// One admitted iperf3 test, from PARAM_EXCHANGE to the end; logs one line.
fn session(mut ctrl: TcpStream, cookie: Cookie, _admitted: &CompatSession<'_>, l: &Listener) {
    let shared = &*l.shared;
    let number = l.next_test.fetch_add(1, Ordering::Relaxed);
    let Ok(peer) = ctrl.peer_addr() else {
        return;
    };
    // An IPv4 client of a dual-stack listener logs as 127.0.0.1, not ::ffff:127.0.0.1.
    let peer = SocketAddr::new(canonical(peer.ip()), peer.port());
    let test = Arc::new(Attach {
        cookie,
        peer_ip: peer.ip(),
        state: Mutex::new(AttachState::default()),
        joined: Condvar::new(),
    });
    lock(&l.tests).push(Arc::clone(&test));
    let _registered = Registered {
        l,
        test: Arc::clone(&test),
    };
    let _ = ctrl.set_nodelay(true);
    let _ = ctrl.set_write_timeout(Some(WRITE_TIMEOUT));
    let mut host = SessionHost {
        shared,
        peer_ip: peer.ip(),
        local: l.local,
    };
    let mut c = Conversation::new(Instant::now(), &shared.cfg);
    let line = match negotiate(&mut ctrl, &mut c, &mut host, &test, l) {
        Ok(attached) => {
            let what = describe(&attached.params);
            match run::run(
                &mut ctrl, &mut c, &mut host, attached, shared, peer, l.local,
            ) {
                Ok(summary) => format!("{what}: {summary}"),
                Err(why) => format!("{what}: ended: {why}"),
            }
        }
        Err(why) => format!("ended: {why}"),
    };
    shared.report(|| crate::AgentEvent::Iperf3TestEnded {
        number,
        peer: peer.to_string(),
        line,
    });
}

/// The agent around one test's [`Conversation`].
struct SessionHost<'a> {
    shared: &'a Shared,
    peer_ip: IpAddr,
    local: SocketAddr,
}

impl Host for SessionHost<'_> {
    fn shutting_down(&self) -> bool {
        self.shared.shutdown.load(Ordering::Relaxed)
    }

    fn try_options(&mut self, p: &Params, opts: &DataOptions) -> Result<(), Refusal> {
        try_options(opts, p, self.peer_ip, self.local)
    }
}

/// Drives the conversation from PARAM_EXCHANGE until the test runs (`Ok`: its streams, with
/// the client's socket options set on them) or ends (`Err`: why, for the log). The waits for
/// the UDP attach gate and the streams are this side's.
fn negotiate(
    ctrl: &mut TcpStream,
    c: &mut Conversation<'_>,
    host: &mut SessionHost<'_>,
    test: &Attach,
    l: &Listener,
) -> Result<run::Attached, String> {
    let shared = &*l.shared;
    let mut gate = None;
    let mut attached = None;
    let ended = 'talk: loop {
        while let Some(out) = next_output(ctrl, c, host) {
            let count = c
                .params()
                .map_or(0, |p| usize::try_from(p.streams()).unwrap_or(usize::MAX));
            match out {
                Output::Deny => deny(ctrl),
                Output::BadHello => {
                    shared.rejections.bad_hello.fetch_add(1, Ordering::Relaxed);
                }
                Output::Refused => {
                    shared.rejections.refused.fetch_add(1, Ordering::Relaxed);
                }
                Output::EnterGate => match l.gate.enter(test.peer_ip, || gone(ctrl, shared)) {
                    Some(entered) => {
                        gate = Some(entered);
                        c.gate_entered();
                    }
                    None => c.gate_busy(host),
                },
                Output::OpenStreams => {
                    let mut st = lock(&test.state);
                    st.expected = count;
                    st.open = true;
                }
                Output::AwaitStreams => {
                    let streams = match &gate {
                        Some((_, arrivals)) => {
                            attach_udp(arrivals, count, l, || gone(ctrl, shared))
                        }
                        None => take_tcp(test, count, || gone(ctrl, shared)),
                    };
                    let Some(params) = c.params().cloned() else {
                        continue;
                    };
                    let applied = streams.map(|s| {
                        let options = apply_options(&s, &params, c.options(), shared);
                        (s, options)
                    });
                    match applied {
                        Err(why) => c.attach_failed(why, host),
                        Ok((_, Err(refusal))) => c.refuse(refusal, host),
                        Ok((streams, Ok(congestion_used))) => {
                            attached = Some((params, streams, congestion_used));
                            c.streams_attached(Instant::now());
                        }
                    }
                }
                Output::Run(plan) => {
                    if let Some((params, streams, congestion_used)) = attached.take() {
                        return Ok(run::Attached {
                            params,
                            plan,
                            streams,
                            congestion_used,
                        });
                    }
                }
                Output::End(ended) => break 'talk ended,
                Output::Send(_) | Output::EndOmit { .. } | Output::StopStreams { .. } => {}
            }
        }
        read_once(ctrl, c, host, None);
    };
    // Streams that arrived for a test that gave up are closed here.
    close_streams(test);
    Err(match ended {
        Ended::Setup(why) | Ended::Test(why) | Ended::Exchange(why) => why,
        Ended::Completed => "ended before its test".to_owned(),
    })
}

/// The conversation's next output other than bytes to write, which it writes on the way (a
/// failed write goes back to the conversation).
fn next_output(ctrl: &mut TcpStream, c: &mut Conversation<'_>, host: &dyn Host) -> Option<Output> {
    loop {
        match c.poll()? {
            Output::Send(bytes) => {
                if let Err(e) = ctrl.write_all(&bytes) {
                    c.handle_write_failed(Instant::now(), &e, host);
                }
            }
            other => return Some(other),
        }
    }
}

/// One read of what the conversation wants, waiting at most until its timeout (or `poll`, when
/// it looks at the agent's shutdown); the bytes, the close, the failure or the time go to the
/// conversation.
fn read_once(
    ctrl: &mut TcpStream,
    c: &mut Conversation<'_>,
    host: &mut dyn Host,
    poll: Option<Duration>,
) {
    let mut buf = [0u8; 4096];
    let want = c.wants().min(buf.len());
    let now = Instant::now();
    let wait = match (
        c.poll_timeout().map(|d| d.saturating_duration_since(now)),
        poll,
    ) {
        (Some(w), Some(p)) => Some(w.min(p)),
        (w, p) => w.or(p),
    };
    if want == 0 || wait.is_some_and(|w| w.is_zero()) {
        return c.handle_timeout(now, host);
    }
    if let Err(e) = ctrl.set_read_timeout(wait) {
        return c.handle_read_error(now, e, host);
    }
    match ctrl.read(&mut buf[..want]) {
        Ok(0) => c.handle_closed(Instant::now(), host),
        Ok(n) => c.handle_bytes(Instant::now(), &buf[..n], host),
        Err(e) if sonde_net::fault::timed_out(&e) => c.handle_timeout(Instant::now(), host),
        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
        Err(e) => c.handle_read_error(Instant::now(), e, host),
    }
}

/// Tries the options on a throwaway socket like the streams' (an accepted TCP socket or a UDP
/// flow socket of the listener's family, talking to the client's address), as iperf3's server
/// sets them on its data listener when it reads the parameters: a buffer the kernel will not
/// grant, an MSS it rejects, an algorithm it does not have are refused before CREATE_STREAMS.
fn try_options(
    opts: &DataOptions,
    p: &Params,
    peer: IpAddr,
    local: SocketAddr,
) -> Result<(), Refusal> {
    if *opts == DataOptions::default() {
        return Ok(());
    }
    opts.try_on(local, peer, !p.udp())
        .and_then(|applied| opts.check_granted(&applied))
        .map_err(|e| option_refusal(&e))
}

/// Sets the client's socket options on the agent's end of every stream, before any data
/// flows (the client sends none before TEST_START); returns the congestion control the TCP
/// streams use, which the results report as `congestion_used` (the client shows it as the
/// agent's "receiver/sender congestion").
///
/// How each one compares with iperf3 3.12's server:
/// * `-w`: iperf3 sets SO_SNDBUF/SO_RCVBUF on a listening socket it makes for the test, so
///   accepted streams have them from the SYN on. The agent's listener is shared by every test
///   (and sonde's own sessions), so they are set on each accepted stream instead. The window
///   scale is fixed at the handshake, but Linux picks it from the largest buffer the socket
///   could have (`tcp_rmem`'s max or `rmem_max`), not from SO_RCVBUF, so the scale the stream
///   got without `-w` can advertise all of a larger buffer set later. A grant below the
///   request (`rmem_max`/`wmem_max` caps it) is refused with IESETBUF2 as iperf3 does; UDP
///   flow sockets get the size too, in place of the agent's large UDP default.
/// * `-M`: TCP_MAXSEG on an accepted socket does not change its MSS (Linux fixes it at the
///   handshake; measured on 6.18, an accepted loopback socket kept its 32 KiB MSS after
///   TCP_MAXSEG 500). It does not need to: the real client sets `-M` on its own socket before
///   it connects, so its SYN's MSS option already holds the agent's segments to it (an
///   accepted socket reads an MSS of 524 for `-M 536`). The agent sets it anyway, so that a
///   value the kernel rejects is refused with IESETMSS as by iperf3's server.
/// * `-C`: set on every TCP stream and read back. An algorithm the kernel lacks (`ENOENT`) is
///   refused with IESETCONGESTION; iperf3 3.12's server only warns on its console and runs
///   the default, which the client reports only with `-J` or `-V`, so its numbers would
///   silently be another algorithm's. (On one host the real client fails first anyway: it sets
///   `-C` on its own sockets too.)
/// * `-S`: IP_TOS, or IPV6_TCLASS for an IPv6 peer, on TCP and UDP streams alike (iperf3
///   sets it on every stream, by the socket's family; the agent by the peer's, since a
///   dual-stack socket sends an IPv4 client IPv4 packets, which IPV6_TCLASS does not mark).
/// * `--fq-rate`: SO_MAX_PACING_RATE on the streams the agent sends on (`-R`, `--bidir`). iperf3
///   3.12's server sets it on its listener only when `-w`, `-M` or `-N` is also given, so it
///   paces a plain `--fq-rate 10M -R` not at all; the agent paces whenever asked. Failing to
///   set it is only logged, as iperf3 only warns.
fn apply_options(
    streams: &[run::Stream],
    p: &Params,
    opts: &DataOptions,
    shared: &Shared,
) -> Result<Option<String>, Refusal> {
    let receiving = DataOptions {
        max_pacing_rate_bytes_per_second: None,
        ..opts.clone()
    };
    // With --max-bitrate the agent's sending streams share the cap (below any --fq-rate).
    let senders = (0..streams.len()).filter(|&i| !p.client_sends(i)).count();
    let sending = match shared.cfg.max_bitrate {
        Some(cap) if senders > 0 => {
            let share = (cap / 8 / u64::try_from(senders).unwrap_or(1)).max(1);
            DataOptions {
                max_pacing_rate_bytes_per_second: Some(
                    opts.max_pacing_rate_bytes_per_second
                        .map_or(share, |r| r.min(share)),
                ),
                ..opts.clone()
            }
        }
        _ => opts.clone(),
    };
    let opts = &sending;
    let mut congestion_used = None;
    for (i, stream) in streams.iter().enumerate() {
        let agent_sends = !p.client_sends(i);
        let asked = if agent_sends { opts } else { &receiving };
        let applied = stream
            .apply(asked)
            .and_then(|applied| asked.check_granted(&applied).map(|()| applied))
            .map_err(|e| option_refusal(&e))?;
        if let Some(e) = applied.pacing_error {
            shared.report(|| crate::AgentEvent::Iperf3Unpaced {
                peer: stream.peer.to_string(),
                error: e.to_string(),
            });
        }
        congestion_used = congestion_used.or(applied.congestion);
    }
    Ok(congestion_used)
}

/// The SERVER_ERROR for an option the kernel refused: the code iperf3's server uses for it,
/// with the kernel's errno where iperf3 prints one.
fn option_refusal(e: &DataOptionError) -> Refusal {
    let code = match e {
        DataOptionError::Buffer { .. } => errno::IESETBUF,
        DataOptionError::BufferShort { .. } => errno::IESETBUF2,
        DataOptionError::Mss { .. } => errno::IESETMSS,
        DataOptionError::Congestion { .. } => errno::IESETCONGESTION,
        DataOptionError::Tos { ipv6: false, .. } => errno::IESETTOS,
        DataOptionError::Tos { ipv6: true, .. } => errno::IESETCOS,
        // Not an option: no socket at all (iperf3: its listener failed).
        _ => errno::IESTREAMLISTEN,
    };
    (code, e.os_error().unwrap_or(0), e.to_string())
}

fn describe(p: &Params) -> String {
    let dir = if p.bidirectional {
        "bidir"
    } else if p.reverse {
        "reverse"
    } else {
        "forward"
    };
    let proto = if p.udp() { "udp" } else { "tcp" };
    let end = if p.num > 0 {
        format!("{} bytes", p.num)
    } else if p.blockcount > 0 {
        format!("{} blocks", p.blockcount)
    } else {
        format!("{} s", p.time)
    };
    let version = p.client_version.as_deref().unwrap_or("?");
    // The socket options asked for, as the client's flags.
    let mut asked = String::new();
    for (flag, value) in [
        ("-w", p.window),
        ("-M", p.mss),
        ("-S", p.tos),
        ("--fq-rate", p.fqrate),
    ] {
        if value != 0 {
            asked.push_str(&format!(", {flag} {value}"));
        }
    }
    if let Some(cc) = &p.congestion {
        asked.push_str(&format!(", -C {cc:?}"));
    }
    format!(
        "{proto} {dir}, {} stream(s), {} B, {end}{asked}, client {version}",
        p.parallel, p.len
    )
}

/// Whether the test must stop waiting: the agent is stopping or the client went away.
fn gone(ctrl: &TcpStream, shared: &Shared) -> bool {
    shared.shutdown.load(Ordering::Relaxed) || peer_closed(ctrl)
}

/// Whether the peer has closed (or reset) a connection we are not reading yet. A byte that
/// arrived early (a CLIENT_TERMINATE) is left for the reader.
fn peer_closed(ctrl: &TcpStream) -> bool {
    if ctrl.set_nonblocking(true).is_err() {
        return true;
    }
    let mut b = [0u8; 1];
    let closed = match ctrl.peek(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
    };
    let _ = ctrl.set_nonblocking(false);
    closed
}

/// Waits for `count` TCP streams, in accept order; then takes no more.
fn take_tcp(
    test: &Attach,
    count: usize,
    gone: impl Fn() -> bool,
) -> Result<Vec<run::Stream>, String> {
    let streams = wait_for_tcp(test, count, gone);
    close_streams(test);
    streams
}

/// Ends a test's wait for TCP streams: later ones are refused, and those that arrived for a
/// test that gave up are closed.
fn close_streams(test: &Attach) {
    let mut st = lock(&test.state);
    st.open = false;
    st.streams.clear();
}

/// Waits for `count` TCP streams, in accept order.
fn wait_for_tcp(
    test: &Attach,
    count: usize,
    gone: impl Fn() -> bool,
) -> Result<Vec<run::Stream>, String> {
    let deadline = Instant::now() + ATTACH_TIMEOUT;
    let mut st = lock(&test.state);
    loop {
        if st.streams.len() >= count {
            st.open = false;
            let mut streams = std::mem::take(&mut st.streams);
            drop(st);
            streams.sort_by_key(|(index, _)| *index);
            let streams: Vec<run::Stream> = streams
                .into_iter()
                .filter_map(|(_, s)| run::Stream::tcp(s))
                .collect();
            if streams.len() < count {
                return Err("a data stream closed as it attached".into());
            }
            return Ok(streams);
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(format!(
                "{} of {count} TCP streams attached within {ATTACH_TIMEOUT:?}",
                st.streams.len()
            ));
        }
        drop(st);
        if gone() {
            return Err("the client went away while opening its streams".into());
        }
        st = lock(&test.state);
        if st.streams.len() < count {
            st = test
                .joined
                .wait_timeout(st, POLL.min(deadline - now))
                .map_or_else(|e| e.into_inner().0, |(g, _)| g);
        }
    }
}

/// Takes `count` UDP connect datagrams (their sources, from the gate) and answers each from a
/// socket of its own on the shared port, connected to the client's socket.
fn attach_udp(
    arrivals: &Receiver<SocketAddr>,
    count: usize,
    l: &Listener,
    gone: impl Fn() -> bool,
) -> Result<Vec<run::Stream>, String> {
    let deadline = Instant::now() + ATTACH_TIMEOUT;
    let mut streams: Vec<run::Stream> = Vec::with_capacity(count.min(1024));
    while streams.len() < count {
        let now = Instant::now();
        if now >= deadline {
            return Err(format!(
                "{} of {count} UDP streams attached within {ATTACH_TIMEOUT:?}",
                streams.len()
            ));
        }
        let from = match arrivals.recv_timeout(POLL.min(deadline - now)) {
            Ok(from) => from,
            Err(RecvTimeoutError::Timeout) => {
                if gone() {
                    return Err("the client went away while opening its streams".into());
                }
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => return Err("internal: UDP gate".into()),
        };
        // A copy of a connect datagram that raced its flow socket: already answered.
        if streams.iter().any(|s| s.peer == from) {
            continue;
        }
        let flow = sonde_net::socket::udp_flow(l.local, from)
            .map_err(|e| format!("cannot open a UDP stream socket for {from}: {e}"))?;
        flow.send(&UDP_CONNECT_REPLY)
            .map_err(|e| format!("cannot answer the UDP stream from {from}: {e}"))?;
        streams.push(run::Stream::udp(flow, from));
    }
    Ok(streams)
}

/// The listener's UDP socket: connect datagrams go to the test that is attaching UDP streams,
/// everything else is counted and dropped.
fn udp_dispatch(udp: &UdpSocket, l: &Listener) {
    let _ = udp.set_read_timeout(Some(Duration::from_millis(200)));
    // Larger datagrams are truncated to this, which is enough to see they are not 4 bytes.
    let mut buf = [0u8; 64];
    while !l.shared.shutdown.load(Ordering::Relaxed) {
        let Ok((n, from)) = udp.recv_from(&mut buf) else {
            continue;
        };
        // Any 4 bytes attach a stream, as with iperf3 (which replies even to "abcd").
        if !(n == 4 && l.gate.offer(from)) {
            l.shared.rejections.udp_junk.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Lets one test at a time attach UDP streams.
#[derive(Default)]
struct Gate {
    current: Mutex<Option<(IpAddr, Sender<SocketAddr>)>>,
    freed: Condvar,
}

/// Holds the gate; dropping it lets the next test in.
struct GateGuard<'a>(&'a Gate);

impl Drop for GateGuard<'_> {
    fn drop(&mut self) {
        *lock(&self.0.current) = None;
        self.0.freed.notify_all();
    }
}

impl Gate {
    /// Waits (up to [`UDP_GATE_WAIT`], or until `gone`) for the gate, then takes it for UDP
    /// connect datagrams from `ip`.
    fn enter(
        &self,
        ip: IpAddr,
        gone: impl Fn() -> bool,
    ) -> Option<(GateGuard<'_>, Receiver<SocketAddr>)> {
        let deadline = Instant::now() + UDP_GATE_WAIT;
        let mut current = lock(&self.current);
        loop {
            if current.is_none() {
                let (tx, rx) = mpsc::channel();
                *current = Some((canonical(ip), tx));
                return Some((GateGuard(self), rx));
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            drop(current);
            if gone() {
                return None;
            }
            current = lock(&self.current);
            if current.is_some() {
                current = self
                    .freed
                    .wait_timeout(current, POLL.min(deadline - now))
                    .map_or_else(|e| e.into_inner().0, |(g, _)| g);
            }
        }
    }

    /// Passes a connect datagram's source to the test attaching streams, if it is from that
    /// test's address.
    fn offer(&self, from: SocketAddr) -> bool {
        match &*lock(&self.current) {
            Some((ip, tx)) if *ip == canonical(from.ip()) => tx.send(from).is_ok(),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_refusals_map_to_the_codes_iperf3_prints() {
        let os = |n| std::io::Error::from_raw_os_error(n);
        let cases = [
            (
                DataOptionError::Congestion {
                    name: "nosuchcc".into(),
                    source: os(2),
                },
                (errno::IESETCONGESTION, 2),
            ),
            (
                DataOptionError::BufferShort {
                    asked: 1 << 30,
                    send_bytes: 8 << 20,
                    recv_bytes: 8 << 20,
                },
                (errno::IESETBUF2, 0),
            ),
            (
                DataOptionError::Mss {
                    mss: 50,
                    source: os(EINVAL),
                },
                (errno::IESETMSS, EINVAL),
            ),
            (
                DataOptionError::Tos {
                    tos: 4,
                    ipv6: true,
                    source: os(1),
                },
                (errno::IESETCOS, 1),
            ),
        ];
        for (e, (code, os_errno)) in cases {
            let (c, o, _) = option_refusal(&e);
            assert_eq!((c, o), (code, os_errno), "{e}");
        }
        // The messages the client prints for them.
        assert!(sonde_wire::iperf3::error_message(errno::IESETCONGESTION)
            .starts_with("unable to set TCP_CONGESTION"));
        assert_eq!(
            sonde_wire::iperf3::error_message(errno::IESETTOS),
            "unable to set IP TOS"
        );
        assert_eq!(
            sonde_wire::iperf3::error_message(errno::IEBADTOS),
            "bad TOS value (must be between 0 and 255 inclusive)"
        );
    }
}
