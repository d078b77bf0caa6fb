//! The agent never panics or stops serving on bad input, and enforces its limits.
//!
//! Each test starts its own agent on 127.0.0.1 (port 0, so its rejection counters are its own),
//! sends something bad, checks that the matching counter moved, and then proves the agent still
//! serves by running a real (short) client test against it. Only loopback; every loop is bounded
//! in count and time.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use sonde_agent::{Agent, AgentConfig, AgentHandle, Rejections};
use sonde_client::{ClientError, LatencyOptions, ThroughputOptions};
use sonde_net::control::{read_frame, write_frame};
use sonde_wire::auth::{Nonce, Request, Secret};
use sonde_wire::{
    Channel, ControlMsg, DataJoin, Direction, Preamble, Protocol, Refusal, TestKind, TestSpec,
    Token, UdpJoin, PROTOCOL_VERSION, UDP_JOIN_LEN,
};

/// Short enough that tests which wait for it stay quick, long enough to tell "closed at once"
/// apart from "closed by the timeout" where a test needs to.
const HELLO_TIMEOUT: Duration = Duration::from_millis(300);
/// Any wait for the agent to do something is bounded by this.
const PATIENCE: Duration = Duration::from_secs(3);

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// An agent on 127.0.0.1:0 with a short hello timeout, adjusted by `tune`.
fn agent(tune: impl FnOnce(&mut AgentConfig)) -> AgentHandle {
    let mut cfg = AgentConfig::new(SocketAddr::from(([127, 0, 0, 1], 0)));
    cfg.hello_timeout = HELLO_TIMEOUT;
    tune(&mut cfg);
    Agent::bind(cfg).expect("bind on loopback").spawn()
}

fn target(h: &AgentHandle) -> sonde_client::Target {
    sonde_client::resolve(&h.local_addr().to_string(), 0).expect("a literal address resolves")
}

fn latency_opts(protocol: Protocol) -> LatencyOptions {
    LatencyOptions {
        protocol,
        msg_size: 64,
        duration: Duration::from_millis(300),
        warmup: Duration::from_millis(100),
        ..LatencyOptions::default()
    }
}

/// Runs a short TCP latency test and checks it measured something: the agent still serves.
fn assert_serves(h: &AgentHandle) {
    assert_serves_over(h, Protocol::Tcp);
}

fn assert_serves_over(h: &AgentHandle, protocol: Protocol) {
    let r = sonde_client::latency(&target(h), &latency_opts(protocol))
        .unwrap_or_else(|e| panic!("the agent no longer serves {protocol:?} latency: {e}"));
    assert!(r.samples > 0, "no RTT sample: {r:?}");
    assert_eq!(r.lost, 0, "lost messages on loopback: {r:?}");
}

fn count(h: &AgentHandle, which: fn(&Rejections) -> &AtomicU64) -> u64 {
    which(h.rejections()).load(Ordering::Relaxed)
}

/// Polls `cond` every 10 ms for at most `limit`.
fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// Waits until the counter reaches `want` and checks it goes no further.
fn assert_counter(h: &AgentHandle, name: &str, which: fn(&Rejections) -> &AtomicU64, want: u64) {
    wait_until(PATIENCE, || count(h, which) >= want);
    assert_eq!(count(h, which), want, "rejections().{name}");
}

/// Reads (and discards) until the agent closes the connection (EOF or reset); how long that
/// took, or `None` when it is still open after `limit`.
fn closed_within(s: &mut TcpStream, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    let mut buf = [0u8; 1024];
    loop {
        let left = limit
            .checked_sub(start.elapsed())
            .filter(|d| !d.is_zero())?;
        s.set_read_timeout(Some(left)).expect("set a read timeout");
        match s.read(&mut buf) {
            Ok(0) => return Some(start.elapsed()),
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return None
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // A reset: the agent closed with our bytes unread.
            Err(_) => return Some(start.elapsed()),
        }
    }
}

fn connect(h: &AgentHandle) -> TcpStream {
    TcpStream::connect_timeout(&h.local_addr(), PATIENCE).expect("connect to the agent")
}

fn preamble(channel: Channel) -> [u8; 8] {
    Preamble {
        version: PROTOCOL_VERSION,
        channel,
    }
    .encode()
}

fn frame(msg: &ControlMsg) -> Vec<u8> {
    let mut buf = Vec::new();
    sonde_wire::encode_frame(msg, &mut buf).expect("encodes");
    buf
}

fn hello(protocol: u16) -> ControlMsg {
    ControlMsg::Hello {
        protocol,
        software: "robustness test".into(),
        nonce: sonde_wire::auth::Nonce([0x42; 32]),
    }
}

fn spec(kind: TestKind, protocol: Protocol, direction: Direction, duration_ms: u64) -> TestSpec {
    TestSpec {
        kind,
        protocol,
        direction,
        streams: 1,
        msg_size: if protocol == Protocol::Udp {
            1200
        } else {
            64 * 1024
        },
        bitrate_per_stream: if protocol == Protocol::Udp {
            10_000_000
        } else {
            0
        },
        duration_ms,
        interval_ms: 0,
        read_size: 0,
    }
}

/// A control connection driven by hand.
struct Raw {
    ctrl: TcpStream,
    body: Vec<u8>,
}

impl Raw {
    /// Connects, says hello and checks the welcome.
    fn hello(h: &AgentHandle) -> Raw {
        let mut ctrl = connect(h);
        ctrl.write_all(&preamble(Channel::Control))
            .expect("preamble");
        let mut raw = Raw {
            ctrl,
            body: Vec::new(),
        };
        raw.send(&hello(PROTOCOL_VERSION));
        match raw.recv() {
            ControlMsg::Welcome { protocol, .. } => assert_eq!(protocol, PROTOCOL_VERSION),
            other => panic!("expected a welcome, got {other:?}"),
        }
        raw
    }

    /// Hello, then `Start`; the agent's answer.
    fn start(h: &AgentHandle, spec: &TestSpec) -> (Raw, ControlMsg) {
        let mut raw = Raw::hello(h);
        raw.send(&ControlMsg::Start {
            spec: spec.clone(),
            proof: None,
            tuning: sonde_wire::Tuning::default(),
        });
        let reply = raw.recv();
        (raw, reply)
    }

    /// Hello, then `Start`, which must be accepted; the session's token.
    fn accepted(h: &AgentHandle, spec: &TestSpec) -> (Raw, Token) {
        match Raw::start(h, spec) {
            (raw, ControlMsg::Accepted { token, .. }) => (raw, token),
            (_, other) => panic!("expected acceptance of {spec:?}, got {other:?}"),
        }
    }

    fn send(&mut self, msg: &ControlMsg) {
        write_frame(&mut self.ctrl, msg).expect("write a control frame");
    }

    fn recv(&mut self) -> ControlMsg {
        read_frame(&mut self.ctrl, &mut self.body, Instant::now() + PATIENCE)
            .unwrap_or_else(|e| panic!("no control message from the agent: {e}"))
    }
}

/// Opens a TCP data channel from `from` (any local address when `None`) and sends its join.
fn tcp_join(h: &AgentHandle, from: Option<SocketAddr>, token: Token, stream: u32) -> TcpStream {
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
        .expect("a TCP socket");
    if let Some(from) = from {
        sock.bind(&from.into())
            .unwrap_or_else(|e| panic!("bind {from} (loopback 127.0.0.0/8): {e}"));
    }
    sock.connect_timeout(&h.local_addr().into(), PATIENCE)
        .expect("connect a data channel");
    let mut s: TcpStream = sock.into();
    s.write_all(&preamble(Channel::Data))
        .expect("data preamble");
    s.write_all(&DataJoin { token, stream }.encode())
        .expect("data join");
    s
}

/// Sends UDP joins for `flow` from `sock` every 50 ms for at most `limit`; true once acknowledged.
fn udp_join(sock: &UdpSocket, agent: SocketAddr, token: Token, flow: u16, limit: Duration) -> bool {
    let join = UdpJoin {
        ack: false,
        flow,
        token,
        ..UdpJoin::default()
    }
    .encode();
    sock.set_read_timeout(Some(Duration::from_millis(50)))
        .expect("set a read timeout");
    let deadline = Instant::now() + limit;
    let mut buf = [0u8; 64];
    while Instant::now() < deadline {
        sock.send_to(&join, agent).expect("send a join");
        if let Ok((n, _)) = sock.recv_from(&mut buf) {
            if n == UDP_JOIN_LEN
                && UdpJoin::decode(&buf[..n])
                    .is_ok_and(|a| a.ack && a.token == token && a.flow == flow)
            {
                return true;
            }
        }
    }
    false
}

/// A small deterministic generator for junk (xorshift64*).
struct Junk(u64);

impl Junk {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

// ---------------------------------------------------------------------------------------------
// Bad input on a new connection
// ---------------------------------------------------------------------------------------------

#[test]
fn http_request_instead_of_a_preamble_is_closed_at_once() {
    // A hello timeout far above "at once", so a close by the timeout cannot pass for it.
    let h = agent(|c| c.hello_timeout = Duration::from_secs(5));
    let mut s = connect(&h);
    s.write_all(b"GET / HTTP/1.1\r\nHost: sonde\r\n\r\n")
        .expect("write");
    let took = closed_within(&mut s, Duration::from_secs(2))
        .expect("a non-sonde peer must be closed, not left waiting for the hello timeout");
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert_counter(&h, "bad_hello", |r| &r.bad_hello, 1);
    assert_serves(&h);
}

#[test]
fn truncated_frame_then_close_is_counted_and_forgotten() {
    let h = agent(|_| {});
    let mut s = connect(&h);
    s.write_all(&preamble(Channel::Control)).expect("preamble");
    s.write_all(&100u32.to_be_bytes()).expect("length");
    s.write_all(b"{\"type\":\"h").expect("10 bytes of body");
    drop(s);
    assert_counter(&h, "bad_hello", |r| &r.bad_hello, 1);
    assert_eq!(h.sessions(), 0);
    assert_serves(&h);
}

#[test]
fn a_4_gib_length_field_is_refused_without_waiting_for_the_body() {
    let h = agent(|c| c.hello_timeout = Duration::from_secs(5));
    let mut s = connect(&h);
    s.write_all(&preamble(Channel::Control)).expect("preamble");
    s.write_all(&u32::MAX.to_be_bytes()).expect("length");
    s.write_all(b"{\"type\":\"hello\"").expect("a little body");
    // Were the agent allocating or reading 4 GiB it would sit until the hello timeout (5 s).
    let took = closed_within(&mut s, Duration::from_secs(2))
        .expect("a 4 GiB frame must end the connection at once");
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert_counter(&h, "bad_hello", |r| &r.bad_hello, 1);
    // Just above the limit is refused too.
    let mut s = connect(&h);
    s.write_all(&preamble(Channel::Control)).expect("preamble");
    s.write_all(&(sonde_wire::MAX_FRAME_LEN + 1).to_be_bytes())
        .expect("length");
    assert!(closed_within(&mut s, Duration::from_secs(2)).is_some());
    assert_counter(&h, "bad_hello", |r| &r.bad_hello, 2);
    assert_serves(&h);
}

#[test]
fn invalid_json_and_a_wrong_first_message_are_rejected() {
    let h = agent(|c| c.hello_timeout = Duration::from_secs(5));
    let bodies: [&[u8]; 4] = [
        b"{not json at all",
        b"{\"type\":\"no_such_message\"}",
        b"{\"type\":\"hello\",\"protocol\":\"one\"}",
        // A valid message, but not a hello.
        b"{\"type\":\"ready\"}",
    ];
    for (n, body) in bodies.iter().enumerate() {
        let mut s = connect(&h);
        s.write_all(&preamble(Channel::Control)).expect("preamble");
        let len = u32::try_from(body.len()).expect("short");
        s.write_all(&len.to_be_bytes()).expect("length");
        s.write_all(body).expect("body");
        assert!(
            closed_within(&mut s, Duration::from_secs(2)).is_some(),
            "body {:?} left the connection open",
            String::from_utf8_lossy(body)
        );
        assert_counter(&h, "bad_hello", |r| &r.bad_hello, n as u64 + 1);
    }
    assert_eq!(count(&h, |r| &r.refused), 0);
    assert_serves(&h);
}

#[test]
fn another_protocol_version_gets_a_refusal_it_can_decode() {
    let h = agent(|_| {});
    // In the hello.
    let mut s = connect(&h);
    s.write_all(&preamble(Channel::Control)).expect("preamble");
    s.write_all(&frame(&hello(PROTOCOL_VERSION + 1)))
        .expect("hello");
    let mut body = Vec::new();
    match read_frame(&mut s, &mut body, Instant::now() + PATIENCE) {
        Ok(ControlMsg::Refused { reason, message }) => {
            assert_eq!(reason, Refusal::Version);
            assert!(message.contains("version"), "{message}");
        }
        other => panic!("expected Refused{{version}}, got {other:?}"),
    }
    assert!(closed_within(&mut s, Duration::from_secs(2)).is_some());
    assert_counter(&h, "refused", |r| &r.refused, 1);

    // In the preamble: the agent answers before the hello.
    let mut s = connect(&h);
    let mut p = preamble(Channel::Control);
    p[4..6].copy_from_slice(&(PROTOCOL_VERSION + 1).to_be_bytes());
    s.write_all(&p).expect("preamble");
    match read_frame(&mut s, &mut body, Instant::now() + PATIENCE) {
        Ok(ControlMsg::Refused { reason, .. }) => assert_eq!(reason, Refusal::Version),
        other => panic!("expected Refused{{version}}, got {other:?}"),
    }
    assert_counter(&h, "refused", |r| &r.refused, 2);
    assert_eq!(count(&h, |r| &r.bad_hello), 0);
    assert_serves(&h);
}

#[test]
fn a_silent_client_is_closed_after_the_hello_timeout() {
    let h = agent(|_| {});
    let mut s = connect(&h);
    let took = closed_within(&mut s, Duration::from_secs(2))
        .expect("a silent connection must be closed by the hello timeout");
    assert!(
        took >= HELLO_TIMEOUT - Duration::from_millis(50),
        "closed after {took:?}, before the {HELLO_TIMEOUT:?} hello timeout"
    );
    assert_counter(&h, "bad_hello", |r| &r.bad_hello, 1);

    // Silent after the preamble: the hello must still come in time.
    let mut s = connect(&h);
    s.write_all(&preamble(Channel::Control)).expect("preamble");
    assert!(closed_within(&mut s, Duration::from_secs(2)).is_some());
    assert_counter(&h, "bad_hello", |r| &r.bad_hello, 2);
    assert_serves(&h);
}

#[test]
fn silent_connections_beyond_max_pending_are_closed_at_once() {
    const MAX_PENDING: usize = 4;
    const SILENT: usize = 10;
    let hello_timeout = Duration::from_secs(1);
    let h = agent(|c| {
        c.max_pending = MAX_PENDING;
        c.hello_timeout = hello_timeout;
    });
    let mut silent: Vec<TcpStream> = (0..SILENT).map(|_| connect(&h)).collect();
    let opened = Instant::now();
    // The extra ones are closed well before the hello timeout.
    assert_counter(
        &h,
        "pending_full",
        |r| &r.pending_full,
        (SILENT - MAX_PENDING) as u64,
    );
    let mut closed_early = 0;
    let mut still_open = Vec::new();
    for mut s in silent.drain(..) {
        if closed_within(&mut s, Duration::from_millis(100)).is_some() {
            closed_early += 1;
        } else {
            still_open.push(s);
        }
    }
    assert!(
        opened.elapsed() < hello_timeout,
        "the test itself was too slow to tell early from late"
    );
    assert_eq!(closed_early, SILENT - MAX_PENDING);
    // The pending ones are closed by the timeout; then a real client gets in.
    for mut s in still_open {
        assert!(closed_within(&mut s, PATIENCE).is_some());
    }
    assert!(opened.elapsed() >= hello_timeout - Duration::from_millis(100));
    assert_counter(&h, "bad_hello", |r| &r.bad_hello, MAX_PENDING as u64);
    assert_serves(&h);
}

// ---------------------------------------------------------------------------------------------
// Data channels
// ---------------------------------------------------------------------------------------------

#[test]
fn a_data_channel_with_an_unknown_token_is_closed() {
    let h = agent(|c| c.hello_timeout = Duration::from_secs(5));
    let mut s = tcp_join(&h, None, Token(0x0123_4567_89ab_cdef), 0);
    assert!(closed_within(&mut s, Duration::from_secs(2)).is_some());
    assert_counter(&h, "bad_join", |r| &r.bad_join, 1);
    // A truncated join is closed too.
    let mut s = connect(&h);
    s.write_all(&preamble(Channel::Data)).expect("preamble");
    s.write_all(&[1, 2, 3]).expect("3 of 16 bytes");
    s.shutdown(std::net::Shutdown::Write).expect("shutdown");
    assert!(closed_within(&mut s, Duration::from_secs(2)).is_some());
    assert_counter(&h, "bad_join", |r| &r.bad_join, 2);
    assert_serves(&h);
}

/// Says `Go`, sends `chunks` of 16 KiB on each of `data`, ends them, tells the agent, and returns
/// its report.
fn finish_forward(raw: &mut Raw, data: &mut [TcpStream], chunks: u32) -> sonde_wire::AgentReport {
    raw.send(&ControlMsg::Go);
    let chunk = [0u8; 16 * 1024];
    let mut streams = Vec::new();
    for (i, s) in data.iter_mut().enumerate() {
        for _ in 0..chunks {
            s.write_all(&chunk).expect("send data");
        }
        s.shutdown(std::net::Shutdown::Write).expect("end of data");
        streams.push(sonde_wire::StreamStats {
            stream: u32::try_from(i).expect("few streams"),
            bytes: u64::from(chunks) * chunk.len() as u64,
            packets: u64::from(chunks),
            ..sonde_wire::StreamStats::default()
        });
    }
    raw.send(&ControlMsg::SenderDone { streams });
    for _ in 0..1_000 {
        match raw.recv() {
            ControlMsg::Report(r) => return r,
            ControlMsg::Interval(_) | ControlMsg::SenderDone { .. } => {}
            other => panic!("expected the report, got {other:?}"),
        }
    }
    panic!("no report among 1,000 control messages");
}

#[test]
fn joins_out_of_range_or_taken_are_refused_and_the_session_goes_on() {
    let h = agent(|_| {});
    let spec = TestSpec {
        streams: 2,
        ..spec(
            TestKind::Throughput,
            Protocol::Tcp,
            Direction::Forward,
            2_000,
        )
    };
    let (mut raw, token) = Raw::accepted(&h, &spec);
    for stream in [2, 7, u32::MAX] {
        let mut s = tcp_join(&h, None, token, stream);
        assert!(
            closed_within(&mut s, Duration::from_secs(2)).is_some(),
            "stream {stream} of a 2-stream session was kept"
        );
    }
    assert_counter(&h, "bad_join", |r| &r.bad_join, 3);
    // Two joins for stream 0: the agent keeps exactly one (whichever it saw first).
    let mut twins = [tcp_join(&h, None, token, 0), tcp_join(&h, None, token, 0)];
    let closed: Vec<bool> = twins
        .iter_mut()
        .map(|s| closed_within(s, Duration::from_millis(500)).is_some())
        .collect();
    assert_eq!(
        closed.iter().filter(|&&c| c).count(),
        1,
        "two joins for one stream: closed {closed:?}"
    );
    assert_counter(&h, "bad_join", |r| &r.bad_join, 4);
    let [a, b] = twins;
    let kept = if closed[0] { b } else { a };
    let second = tcp_join(&h, None, token, 1);
    assert_eq!(raw.recv(), ControlMsg::Ready);
    // The session runs to its report with the channels that were kept.
    let report = finish_forward(&mut raw, &mut [kept, second], 32);
    assert_eq!(report.received.len(), 2, "{report:?}");
    for r in &report.received {
        assert_eq!(r.bytes, 32 * 16 * 1024, "{report:?}");
    }
    assert!(wait_until(PATIENCE, || h.sessions() == 0));
    assert_serves(&h);
}

#[test]
fn a_second_join_for_a_running_stream_is_refused() {
    let h = agent(|_| {});
    let spec = spec(
        TestKind::Throughput,
        Protocol::Tcp,
        Direction::Forward,
        2_000,
    );
    let (mut raw, token) = Raw::accepted(&h, &spec);
    let data = tcp_join(&h, None, token, 0);
    assert_eq!(raw.recv(), ControlMsg::Ready);
    // Stream 0 is joined and running: another connection with the same token and stream is
    // not the client's, and must not be taken in (and held open) by the session.
    let mut late = tcp_join(&h, None, token, 0);
    let closed = closed_within(&mut late, Duration::from_secs(1));
    assert_eq!(h.sessions(), 1, "the session must still be running here");
    assert!(
        closed.is_some(),
        "a second join for stream 0 after Ready was kept open by the agent"
    );
    assert_counter(&h, "bad_join", |r| &r.bad_join, 1);
    let report = finish_forward(&mut raw, &mut [data], 32);
    assert_eq!(report.received.len(), 1, "{report:?}");
    assert_eq!(report.received[0].bytes, 32 * 16 * 1024, "{report:?}");
    assert!(wait_until(PATIENCE, || h.sessions() == 0));
    assert_serves(&h);
}

#[test]
fn a_tcp_data_channel_from_another_address_is_not_accepted() {
    let h = agent(|_| {});
    let spec = spec(TestKind::Throughput, Protocol::Tcp, Direction::Forward, 300);
    let (mut raw, token) = Raw::accepted(&h, &spec);
    // The control connection came from 127.0.0.1; the right token from 127.0.0.2 is someone else.
    let other: SocketAddr = "127.0.0.2:0".parse().expect("an address");
    let mut s = tcp_join(&h, Some(other), token, 0);
    assert!(closed_within(&mut s, Duration::from_secs(2)).is_some());
    assert_counter(&h, "bad_join", |r| &r.bad_join, 1);
    // The stream is still free for the real client.
    let data = tcp_join(&h, None, token, 0);
    assert_eq!(raw.recv(), ControlMsg::Ready);
    drop((raw, data));
    assert!(wait_until(PATIENCE, || h.sessions() == 0));
    assert_serves(&h);
}

#[test]
fn a_udp_flow_from_another_address_is_not_acknowledged() {
    let h = agent(|_| {});
    let spec = spec(TestKind::Throughput, Protocol::Udp, Direction::Forward, 300);
    let (mut raw, token) = Raw::accepted(&h, &spec);
    let stranger = UdpSocket::bind("127.0.0.2:0").expect("bind 127.0.0.2");
    assert!(
        !udp_join(
            &stranger,
            h.local_addr(),
            token,
            0,
            Duration::from_millis(300)
        ),
        "the agent acknowledged a flow from an address that did not open the session"
    );
    assert!(count(&h, |r| &r.udp_junk) >= 1);
    let own = UdpSocket::bind("127.0.0.1:0").expect("bind");
    assert!(udp_join(&own, h.local_addr(), token, 0, PATIENCE));
    assert_eq!(raw.recv(), ControlMsg::Ready);
    drop((raw, own));
    assert!(wait_until(PATIENCE, || h.sessions() == 0));
    assert_serves_over(&h, Protocol::Udp);
}

// ---------------------------------------------------------------------------------------------
// Clients that vanish
// ---------------------------------------------------------------------------------------------

/// Starts a 5 s test by hand, lets it run briefly, drops every socket: the agent must end the
/// session within a couple of seconds, not at the planned end (or a minute after).
fn vanish_mid_test(protocol: Protocol, direction: Direction) {
    let h = agent(|_| {});
    let spec = spec(TestKind::Throughput, protocol, direction, 5_000);
    let (mut raw, token) = Raw::accepted(&h, &spec);
    let data: Box<dyn std::any::Any> = match protocol {
        Protocol::Tcp => {
            let mut s = tcp_join(&h, None, token, 0);
            assert_eq!(raw.recv(), ControlMsg::Ready);
            raw.send(&ControlMsg::Go);
            if direction == Direction::Forward {
                s.write_all(&[0u8; 64 * 1024]).expect("send some data");
            } else {
                // The agent's sender is running: data arrives.
                let mut buf = [0u8; 64 * 1024];
                s.set_read_timeout(Some(PATIENCE))
                    .expect("set a read timeout");
                s.read_exact(&mut buf).expect("the agent sends after Go");
            }
            Box::new(s)
        }
        Protocol::Udp => {
            let sock = UdpSocket::bind("127.0.0.1:0").expect("bind");
            assert!(udp_join(&sock, h.local_addr(), token, 0, PATIENCE));
            assert_eq!(raw.recv(), ControlMsg::Ready);
            raw.send(&ControlMsg::Go);
            Box::new(sock)
        }
    };
    assert_eq!(h.sessions(), 1);
    thread::sleep(Duration::from_millis(200));
    let gone = Instant::now();
    drop((raw, data));
    assert!(
        wait_until(Duration::from_secs(2), || h.sessions() == 0),
        "{protocol:?} {direction:?}: the session outlived its client by 2 s"
    );
    eprintln!(
        "{protocol:?} {direction:?}: session ended {:?} after the client",
        gone.elapsed()
    );
    assert_serves(&h);
}

#[test]
fn a_tcp_sender_killed_mid_test_frees_its_session() {
    vanish_mid_test(Protocol::Tcp, Direction::Forward);
}

#[test]
fn a_tcp_receiver_killed_mid_test_frees_its_session() {
    vanish_mid_test(Protocol::Tcp, Direction::Reverse);
}

#[test]
fn a_udp_client_killed_mid_test_frees_its_session() {
    vanish_mid_test(Protocol::Udp, Direction::Forward);
}

// ---------------------------------------------------------------------------------------------
// UDP junk
// ---------------------------------------------------------------------------------------------

#[test]
fn a_udp_junk_flood_is_counted_and_udp_tests_still_run() {
    const FLOOD: u64 = 20_000;
    let h = agent(|_| {});
    let to = h.local_addr();
    let sock = UdpSocket::bind("127.0.0.1:0").expect("bind");
    let mut junk = Junk(0x5eed_0f5a_5a5a_1234);
    let mut buf = [0u8; 1500];
    for n in 0..FLOOD {
        let len = match n % 10 {
            // Well-formed joins and acknowledgements for sessions that do not exist.
            0 | 1 => {
                let join = UdpJoin {
                    ack: n % 10 == 1,
                    flow: u16::try_from(junk.below(4)).expect("small"),
                    token: Token(junk.next()),
                    ..UdpJoin::default()
                };
                buf[..UDP_JOIN_LEN].copy_from_slice(&join.encode());
                UDP_JOIN_LEN
            }
            // Joins of another protocol version, and truncated ones.
            2 => {
                buf[..4].copy_from_slice(b"SNDJ");
                buf[4..6].copy_from_slice(&(PROTOCOL_VERSION + 1).to_be_bytes());
                if junk.below(2) == 0 {
                    UDP_JOIN_LEN
                } else {
                    usize::try_from(junk.below(UDP_JOIN_LEN as u64)).expect("small")
                }
            }
            _ => {
                let len = usize::try_from(junk.below(1500)).expect("small");
                for b in &mut buf[..len] {
                    *b = junk.next() as u8;
                }
                len
            }
        };
        // A full socket buffer may refuse a send; the flood is best effort.
        let _ = sock.send_to(&buf[..len], to);
        if n % 500 == 499 {
            thread::sleep(Duration::from_millis(1));
        }
    }
    // Wait for the dispatcher to drain what the kernel kept.
    let mut last = u64::MAX;
    wait_until(PATIENCE, || {
        let now = count(&h, |r| &r.udp_junk);
        let settled = now == last;
        last = now;
        thread::sleep(Duration::from_millis(100));
        settled
    });
    let flooded = count(&h, |r| &r.udp_junk);
    assert!(
        (1..=FLOOD).contains(&flooded),
        "{flooded} of {FLOOD} junk datagrams counted"
    );
    // Each datagram is counted once: ten more, slowly enough that none is dropped.
    for _ in 0..10 {
        sock.send_to(b"junk", to).expect("send");
        thread::sleep(Duration::from_millis(5));
    }
    assert_counter(&h, "udp_junk", |r| &r.udp_junk, flooded + 10);
    assert_eq!(h.sessions(), 0);
    assert_serves_over(&h, Protocol::Udp);
    assert_serves(&h);
}

// ---------------------------------------------------------------------------------------------
// Limits
// ---------------------------------------------------------------------------------------------

#[test]
fn max_sessions_refuses_the_next_client_as_busy() {
    let h = agent(|c| c.max_sessions = 1);
    let spec = spec(
        TestKind::Throughput,
        Protocol::Tcp,
        Direction::Forward,
        5_000,
    );
    let (mut raw, token) = Raw::accepted(&h, &spec);
    assert_eq!(h.sessions(), 1);
    let err = sonde_client::latency(&target(&h), &latency_opts(Protocol::Tcp))
        .expect_err("a second session while the only one is held");
    match &err {
        ClientError::Refused { reason, message } => {
            assert_eq!(*reason, Refusal::Busy);
            assert!(message.contains("--max-sessions"), "{message}");
        }
        other => panic!("expected Refused{{busy}}, got {other:?}"),
    }
    assert_eq!(err.exit_code(), 4);
    assert_counter(&h, "refused", |r| &r.refused, 1);
    // Once the held session's client goes, the slot is free again.
    let data = tcp_join(&h, None, token, 0);
    assert_eq!(raw.recv(), ControlMsg::Ready);
    drop((raw, data));
    assert!(wait_until(PATIENCE, || h.sessions() == 0));
    assert_serves(&h);
}

#[test]
fn a_test_longer_than_max_duration_is_refused_for_limits() {
    let h = agent(|c| c.max_duration = Duration::from_secs(1));
    let opts = LatencyOptions {
        duration: Duration::from_secs(2),
        ..latency_opts(Protocol::Tcp)
    };
    match sonde_client::latency(&target(&h), &opts) {
        Err(e @ ClientError::Refused { reason, .. }) => {
            assert_eq!(reason, Refusal::Limits);
            assert_eq!(e.exit_code(), 4);
            assert!(e.to_string().contains("--max-duration"), "{e}");
        }
        other => panic!("expected Refused{{limits}}, got {other:?}"),
    }
    assert_counter(&h, "refused", |r| &r.refused, 1);
    assert_eq!(h.sessions(), 0);
    // Within the limit (0.4 s including warm-up) is fine.
    assert_serves(&h);
}

#[test]
fn more_streams_than_max_streams_are_refused_for_limits() {
    let h = agent(|c| c.max_streams = 2);
    let opts = ThroughputOptions {
        parallel: 3,
        duration: Duration::from_millis(300),
        ..ThroughputOptions::default()
    };
    match sonde_client::throughput(&target(&h), &opts, &mut |_| {}) {
        Err(e @ ClientError::Refused { reason, .. }) => {
            assert_eq!(reason, Refusal::Limits);
            assert_eq!(e.exit_code(), 4);
            assert!(e.to_string().contains("--max-streams"), "{e}");
        }
        other => panic!("expected Refused{{limits}}, got {other:?}"),
    }
    assert_counter(&h, "refused", |r| &r.refused, 1);
    // At the limit is fine.
    let ok = sonde_client::throughput(
        &target(&h),
        &ThroughputOptions {
            parallel: 2,
            ..opts
        },
        &mut |_| {},
    )
    .expect("2 streams are within --max-streams 2");
    assert_eq!(ok.streams.len(), 2);
    assert!(ok.receiver.bytes > 0);
}

#[test]
fn nonsense_requests_are_refused_as_bad_requests() {
    let h = agent(|_| {});
    let base = spec(TestKind::Throughput, Protocol::Tcp, Direction::Forward, 300);
    let cases = [
        TestSpec {
            streams: 0,
            ..base.clone()
        },
        TestSpec {
            duration_ms: 0,
            ..base.clone()
        },
        TestSpec {
            msg_size: 0,
            ..base.clone()
        },
        TestSpec {
            interval_ms: 1,
            read_size: 0,
            ..base.clone()
        },
        TestSpec {
            kind: TestKind::Pps,
            ..base.clone()
        },
        TestSpec {
            protocol: Protocol::Udp,
            msg_size: 8,
            ..base.clone()
        },
    ];
    for (n, spec) in cases.iter().enumerate() {
        match Raw::start(&h, spec) {
            (_, ControlMsg::Refused { reason, .. }) => {
                assert_eq!(reason, Refusal::BadRequest, "{spec:?}");
            }
            (_, other) => panic!("{spec:?} was not refused: {other:?}"),
        }
        assert_counter(&h, "refused", |r| &r.refused, n as u64 + 1);
    }
    assert_eq!(h.sessions(), 0);
    assert_serves(&h);
}

// ---------------------------------------------------------------------------------------------
// Concurrency
// ---------------------------------------------------------------------------------------------

#[test]
fn four_clients_at_once_all_run_and_see_each_other() {
    const CLIENTS: usize = 4;
    let h = agent(|_| {});
    let t = target(&h);
    let start = Arc::new(Barrier::new(CLIENTS));
    let overlaps: Vec<u32> = thread::scope(|s| {
        let runs: Vec<_> = (0..CLIENTS)
            .map(|i| {
                let (t, start) = (&t, Arc::clone(&start));
                s.spawn(move || -> Result<u32, ClientError> {
                    start.wait();
                    if i % 2 == 0 {
                        let r = sonde_client::latency(
                            t,
                            &LatencyOptions {
                                duration: Duration::from_millis(700),
                                ..latency_opts(Protocol::Tcp)
                            },
                        )?;
                        assert!(r.samples > 0, "client {i}: {r:?}");
                        Ok(r.meta.overlapping_sessions)
                    } else {
                        let r = sonde_client::throughput(
                            t,
                            &ThroughputOptions {
                                duration: Duration::from_millis(800),
                                ..ThroughputOptions::default()
                            },
                            &mut |_| {},
                        )?;
                        assert!(r.receiver.bytes > 0, "client {i}: {r:?}");
                        Ok(r.meta.overlapping_sessions)
                    }
                })
            })
            .collect();
        runs.into_iter()
            .enumerate()
            .map(|(i, r)| {
                r.join()
                    .expect("client thread")
                    .unwrap_or_else(|e| panic!("client {i} failed while others ran: {e}"))
            })
            .collect()
    });
    for (i, o) in overlaps.iter().enumerate() {
        assert!(
            (1..CLIENTS as u32).contains(o),
            "client {i}: overlapping_sessions {o}, expected 1..={}",
            CLIENTS - 1
        );
    }
    assert_eq!(count(&h, |r| &r.refused), 0);
    assert!(wait_until(PATIENCE, || h.sessions() == 0));
}

// ---------------------------------------------------------------------------------------------
// Authentication (`AgentConfig::secret`)
// ---------------------------------------------------------------------------------------------

const SECRET: &[u8] = b"a shared secret for the robustness tests";

fn secret(bytes: &[u8]) -> Secret {
    Secret::new(bytes.to_vec()).expect("not empty")
}

fn agent_with_secret() -> AgentHandle {
    agent(|c| c.secret = Some(secret(SECRET)))
}

/// Hello with `client_nonce`; the welcome's nonce and whether it asks for a secret. The welcome
/// must not describe the host: nothing about it goes to a client not yet admitted.
fn raw_hello(h: &AgentHandle, client_nonce: Nonce) -> (Raw, Nonce, bool) {
    let mut ctrl = connect(h);
    ctrl.write_all(&preamble(Channel::Control))
        .expect("preamble");
    let mut raw = Raw {
        ctrl,
        body: Vec::new(),
    };
    raw.send(&ControlMsg::Hello {
        protocol: PROTOCOL_VERSION,
        software: "robustness test".into(),
        nonce: client_nonce,
    });
    let msg = raw.recv();
    let text = String::from_utf8_lossy(&raw.body).into_owned();
    for field in ["host", "kernel", "cpu", "nic", "sonde_version"] {
        assert!(
            !text.contains(&format!("\"{field}")),
            "the welcome describes the host ({field}): {text}"
        );
    }
    match msg {
        ControlMsg::Welcome {
            nonce,
            secret_required,
            ..
        } => (raw, nonce, secret_required),
        other => panic!("expected a welcome, got {other:?}"),
    }
}

fn assert_unauthenticated(reply: &ControlMsg) {
    assert!(
        matches!(
            reply,
            ControlMsg::Refused {
                reason: Refusal::Unauthenticated,
                ..
            }
        ),
        "expected a refusal for authentication, got {reply:?}"
    );
}

#[test]
fn with_a_secret_only_clients_that_prove_it_are_admitted() {
    let h = agent_with_secret();
    let opts = latency_opts(Protocol::Tcp);
    // No secret, and a wrong one: refused, exit code 4, a line that says what to do.
    for (client_secret, says) in [
        (None, "requires a shared secret"),
        (Some(secret(b"not the secret")), "does not match"),
    ] {
        let t = target(&h).with_secret(client_secret);
        match sonde_client::latency(&t, &opts) {
            Err(e @ ClientError::Refused { .. }) => {
                assert_eq!(e.exit_code(), 4);
                assert!(e.to_string().contains(says), "{e}");
                assert!(e.to_string().contains("--secret-file"), "{e}");
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
    assert_counter(&h, "unauthenticated", |r| &r.unauthenticated, 2);
    // The right one: TCP and UDP tests run (UDP joins carry the session key's MAC).
    let t = target(&h).with_secret(Some(secret(SECRET)));
    for protocol in [Protocol::Tcp, Protocol::Udp] {
        let r = sonde_client::latency(&t, &latency_opts(protocol))
            .unwrap_or_else(|e| panic!("{protocol:?} latency with the secret: {e}"));
        assert!(r.samples > 0);
    }
    let r = sonde_client::throughput(
        &t,
        &ThroughputOptions {
            protocol: Protocol::Udp,
            msg_size: 1200,
            parallel: 2,
            duration: Duration::from_millis(300),
            ..ThroughputOptions::default()
        },
        &mut |_| {},
    )
    .expect("UDP throughput with the secret");
    assert!(r.receiver.bytes > 0, "{r:?}");
    assert_eq!(count(&h, |r| &r.unauthenticated), 2);
}

#[test]
fn an_agent_without_a_secret_admits_clients_with_or_without_one() {
    let h = agent(|_| {});
    let (_raw, _, required) = raw_hello(&h, Nonce([1; 32]));
    assert!(!required);
    let t = target(&h).with_secret(Some(secret(b"whatever")));
    assert!(sonde_client::latency(&t, &latency_opts(Protocol::Udp)).is_ok());
    assert_serves(&h);
}

#[test]
fn a_replayed_proof_is_refused() {
    let h = agent_with_secret();
    let s = secret(SECRET);
    let spec = spec(TestKind::Latency, Protocol::Tcp, Direction::Forward, 500);
    let client_nonce = Nonce([7; 32]);
    // A genuine client's session, recorded by an eavesdropper.
    let (mut raw, agent_nonce, required) = raw_hello(&h, client_nonce);
    assert!(required);
    let proof = s.proof(&agent_nonce, &client_nonce, &Request::Test(&spec));
    raw.send(&ControlMsg::Start {
        spec: spec.clone(),
        proof: Some(proof),
        tuning: sonde_wire::Tuning::default(),
    });
    assert!(matches!(
        raw.recv(),
        ControlMsg::Accepted { host: Some(_), .. }
    ));
    drop(raw);
    // The eavesdropper replays the hello and the proof on a new connection: the agent's nonce
    // is new, so the proof no longer fits.
    let (mut replay, fresh, _) = raw_hello(&h, client_nonce);
    assert_ne!(
        fresh, agent_nonce,
        "the agent's nonce is fresh per connection"
    );
    replay.send(&ControlMsg::Start {
        spec: spec.clone(),
        proof: Some(proof),
        tuning: sonde_wire::Tuning::default(),
    });
    assert_unauthenticated(&replay.recv());
    // Nor does a proof for one request admit another (a longer test), nor `Describe`.
    let (mut other, an, _) = raw_hello(&h, client_nonce);
    let longer = TestSpec {
        duration_ms: 5_000,
        ..spec.clone()
    };
    other.send(&ControlMsg::Start {
        spec: longer,
        proof: Some(s.proof(&an, &client_nonce, &Request::Test(&spec))),
        tuning: sonde_wire::Tuning::default(),
    });
    assert_unauthenticated(&other.recv());
    let (mut describe, an, _) = raw_hello(&h, client_nonce);
    describe.send(&ControlMsg::Describe {
        proof: Some(s.proof(&an, &client_nonce, &Request::Test(&spec))),
    });
    assert_unauthenticated(&describe.recv());
    assert_counter(&h, "unauthenticated", |r| &r.unauthenticated, 3);
    assert_serves_over_with(&h, &s);
}

fn assert_serves_over_with(h: &AgentHandle, s: &Secret) {
    let t = target(h).with_secret(Some(s.clone()));
    let r = sonde_client::latency(&t, &latency_opts(Protocol::Tcp)).expect("serves");
    assert!(r.samples > 0);
}

#[test]
fn the_host_is_described_only_to_an_authenticated_client() {
    let h = agent_with_secret();
    let s = secret(SECRET);
    let cn = Nonce([9; 32]);
    let (mut raw, _, _) = raw_hello(&h, cn);
    raw.send(&ControlMsg::Describe { proof: None });
    assert_unauthenticated(&raw.recv());
    let text = String::from_utf8_lossy(&raw.body).into_owned();
    assert!(
        !text.contains("\"host"),
        "a refusal describes the host: {text}"
    );
    let (mut raw, an, _) = raw_hello(&h, cn);
    raw.send(&ControlMsg::Describe {
        proof: Some(s.proof(&an, &cn, &Request::Describe)),
    });
    match raw.recv() {
        ControlMsg::Description { host: Some(host) } => {
            assert!(host.kernel_name.is_some(), "{host:?}");
        }
        other => panic!("expected the agent's description, got {other:?}"),
    }
    // The client's `sonde conf` path does the same.
    let conf = sonde_client::conf(Some(&target(&h).with_secret(Some(s)))).expect("conf");
    assert!(conf.hosts.server.is_some());
    let refused = sonde_client::conf(Some(&target(&h)));
    assert!(
        matches!(refused, Err(ClientError::Refused { .. })),
        "{refused:?}"
    );
}

#[test]
fn a_udp_join_without_the_session_mac_is_not_acknowledged() {
    let h = agent_with_secret();
    let s = secret(SECRET);
    let spec = spec(
        TestKind::Throughput,
        Protocol::Udp,
        Direction::Forward,
        2_000,
    );
    let cn = Nonce([3; 32]);
    let (mut raw, an, _) = raw_hello(&h, cn);
    raw.send(&ControlMsg::Start {
        spec: spec.clone(),
        proof: Some(s.proof(&an, &cn, &Request::Test(&spec))),
        tuning: sonde_wire::Tuning::default(),
    });
    let ControlMsg::Accepted { token, .. } = raw.recv() else {
        panic!("the session was not accepted");
    };
    let sock = UdpSocket::bind("127.0.0.1:0").expect("bind");
    let before = count(&h, |r| &r.udp_junk);
    // A stranger who learnt the token: no MAC, then a MAC under another session's key.
    let stranger = |mac: [u8; sonde_wire::auth::JOIN_MAC_LEN]| {
        let join = UdpJoin {
            ack: false,
            flow: 0,
            token,
            mac,
        };
        sock.send_to(&join.encode(), h.local_addr()).expect("send");
    };
    stranger([0; sonde_wire::auth::JOIN_MAC_LEN]);
    let other_key = s.session_key(&Nonce([1; 32]), &cn);
    let unsigned = UdpJoin {
        ack: false,
        flow: 0,
        token,
        mac: [0; sonde_wire::auth::JOIN_MAC_LEN],
    };
    stranger(other_key.join_mac(&unsigned.signed()));
    assert_counter(&h, "udp_junk", |r| &r.udp_junk, before + 2);
    sock.set_read_timeout(Some(Duration::from_millis(300)))
        .expect("timeout");
    let mut buf = [0u8; 64];
    assert!(
        sock.recv_from(&mut buf).is_err(),
        "a stranger's join was acknowledged"
    );
    // The genuine client's signed join is.
    let key = s.session_key(&an, &cn);
    let signed = UdpJoin {
        mac: key.join_mac(&unsigned.signed()),
        ..unsigned
    };
    sock.set_read_timeout(Some(PATIENCE)).expect("timeout");
    sock.send_to(&signed.encode(), h.local_addr())
        .expect("send");
    let (n, _) = sock
        .recv_from(&mut buf)
        .expect("the signed join is acknowledged");
    assert!(UdpJoin::decode(&buf[..n]).is_ok_and(|a| a.ack && a.token == token));
}

// ---------------------------------------------------------------------------------------------
// Per-source limits
// ---------------------------------------------------------------------------------------------

/// A TCP connection to `to` from `from` (a loopback address, any port).
fn connect_from(from: [u8; 4], to: SocketAddr) -> TcpStream {
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
        .expect("a TCP socket");
    let from = SocketAddr::from((from, 0));
    sock.bind(&from.into())
        .unwrap_or_else(|e| panic!("bind {from} (loopback 127.0.0.0/8): {e}"));
    sock.connect_timeout(&to.into(), PATIENCE)
        .expect("connect to the agent");
    sock.into()
}

/// The refusal the agent wrote on a connection it would not let in.
fn refusal_on(s: &mut TcpStream) -> ControlMsg {
    let mut body = Vec::new();
    read_frame(s, &mut body, Instant::now() + PATIENCE)
        .unwrap_or_else(|e| panic!("no refusal frame: {e}"))
}

#[test]
fn one_address_holding_connections_does_not_lock_out_another() {
    // The attack: one address fills both ports with silent connections.
    const SILENT: usize = 64;
    let h = agent(|c| {
        c.hello_timeout = Duration::from_secs(10);
        c.iperf3 = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
    });
    let iperf3 = h.iperf3_addr().expect("an iperf3 listener");
    let per_source = AgentConfig::new(h.local_addr()).max_pending_per_source;
    let mut held = Vec::new();
    let mut refused = Vec::new();
    for to in [h.local_addr(), iperf3] {
        for i in 0..SILENT {
            let s = connect_from([127, 0, 0, 2], to);
            if i < per_source {
                held.push(s);
            } else {
                refused.push((to, s));
            }
        }
    }
    let over = (2 * (SILENT - per_source)) as u64;
    assert_counter(&h, "pending_source_full", |r| &r.pending_source_full, over);
    assert_eq!(count(&h, |r| &r.pending_full), 0);
    // Each refused connection says so: sonde's a `Refused` frame, iperf3's ACCESS_DENIED.
    for (to, mut s) in refused.into_iter().step_by(12) {
        if to == iperf3 {
            let mut b = [0u8; 1];
            s.set_read_timeout(Some(PATIENCE)).expect("timeout");
            s.read_exact(&mut b).expect("a state byte");
            assert_eq!(b[0], sonde_wire::iperf3::State::AccessDenied.byte());
        } else {
            assert!(matches!(
                refusal_on(&mut s),
                ControlMsg::Refused {
                    reason: Refusal::SourceBusy,
                    ..
                }
            ));
        }
    }
    // Another address is served at once, over TCP and UDP, while the silent ones are held.
    assert_serves(&h);
    assert_serves_over(&h, Protocol::Udp);
    drop(held);
}

#[test]
fn a_client_turned_away_by_a_full_listener_gets_the_refusal_line() {
    let h = agent(|c| {
        c.max_pending = 2;
        c.hello_timeout = Duration::from_secs(10);
    });
    let _held: Vec<TcpStream> = (0..2)
        .map(|_| connect_from([127, 0, 0, 2], h.local_addr()))
        .collect();
    // Both are counted once a third from the same address is turned away.
    assert!(wait_until(PATIENCE, || {
        drop(connect_from([127, 0, 0, 2], h.local_addr()));
        count(&h, |r| &r.pending_full) > 0
    }));
    let before = count(&h, |r| &r.pending_full);
    // Several times: the refusal must win over any race with the close.
    for _ in 0..5 {
        match sonde_client::latency(&target(&h), &latency_opts(Protocol::Tcp)) {
            Err(e @ ClientError::Refused { .. }) => {
                assert_eq!(e.exit_code(), 4);
                assert!(e.to_string().contains("try again"), "{e}");
            }
            other => panic!("expected a refusal (exit 4), got {other:?}"),
        }
    }
    assert!(count(&h, |r| &r.pending_full) >= before + 5);
}

#[test]
fn one_address_cannot_take_every_session() {
    let h = agent(|c| {
        c.max_sessions = 4;
        c.max_sessions_per_source = 1;
    });
    let long = spec(TestKind::Latency, Protocol::Tcp, Direction::Forward, 5_000);
    let raw_from = |from: [u8; 4]| {
        let mut raw = Raw {
            ctrl: connect_from(from, h.local_addr()),
            body: Vec::new(),
        };
        raw.ctrl
            .write_all(&preamble(Channel::Control))
            .expect("preamble");
        raw.send(&hello(PROTOCOL_VERSION));
        assert!(matches!(raw.recv(), ControlMsg::Welcome { .. }));
        raw.send(&ControlMsg::Start {
            spec: long.clone(),
            proof: None,
            tuning: sonde_wire::Tuning::default(),
        });
        let reply = raw.recv();
        (raw, reply)
    };
    let (_first, reply) = raw_from([127, 0, 0, 2]);
    assert!(matches!(reply, ControlMsg::Accepted { .. }), "{reply:?}");
    let (_, reply) = raw_from([127, 0, 0, 2]);
    assert!(
        matches!(
            reply,
            ControlMsg::Refused {
                reason: Refusal::SourceBusy,
                ..
            }
        ),
        "{reply:?}"
    );
    assert_eq!(count(&h, |r| &r.source_sessions_full), 1);
    // Another address still gets a session.
    assert_serves(&h);
}

#[test]
fn a_client_that_never_asks_for_a_test_stays_pending() {
    // Before, a connection stopped counting as pending at the Welcome and then held a thread
    // for 30 s waiting for Start, outside every bound.
    let h = agent(|c| {
        c.max_pending_per_source = 2;
        c.hello_timeout = Duration::from_secs(10);
    });
    let welcomed = |from: [u8; 4]| {
        let mut raw = Raw {
            ctrl: connect_from(from, h.local_addr()),
            body: Vec::new(),
        };
        raw.ctrl
            .write_all(&preamble(Channel::Control))
            .expect("preamble");
        raw.send(&hello(PROTOCOL_VERSION));
        assert!(matches!(raw.recv(), ControlMsg::Welcome { .. }));
        raw
    };
    let _silent_after_hello = [welcomed([127, 0, 0, 2]), welcomed([127, 0, 0, 2])];
    let mut third = connect_from([127, 0, 0, 2], h.local_addr());
    assert!(matches!(
        refusal_on(&mut third),
        ControlMsg::Refused {
            reason: Refusal::SourceBusy,
            ..
        }
    ));
    assert_serves(&h);
}

// ---------------------------------------------------------------------------------------------
// --max-bitrate
// ---------------------------------------------------------------------------------------------

#[test]
fn max_bitrate_paces_what_the_agent_sends_and_refuses_udp_above_it() {
    const CAP: u64 = 20_000_000;
    let h = agent(|c| c.max_bitrate = Some(CAP));
    let udp = |direction, bitrate| ThroughputOptions {
        protocol: Protocol::Udp,
        direction,
        msg_size: 1200,
        bitrate,
        duration: Duration::from_millis(300),
        ..ThroughputOptions::default()
    };
    // The case: a reverse UDP test at no limit; and forward UDP above the cap.
    for opts in [udp(Direction::Reverse, 0), udp(Direction::Forward, 3 * CAP)] {
        match sonde_client::throughput(&target(&h), &opts, &mut |_| {}) {
            Err(
                e @ ClientError::Refused {
                    reason: Refusal::Limits,
                    ..
                },
            ) => {
                assert_eq!(e.exit_code(), 4);
                assert!(e.to_string().contains("--max-bitrate"), "{e}");
            }
            other => panic!("expected a refusal for limits, got {other:?}"),
        }
    }
    // Within the cap, UDP runs both ways.
    for direction in [Direction::Forward, Direction::Reverse] {
        let r = sonde_client::throughput(&target(&h), &udp(direction, CAP / 2), &mut |_| {})
            .unwrap_or_else(|e| panic!("UDP {direction:?} within the cap: {e}"));
        assert!(r.receiver.bytes > 0);
    }
    // TCP the agent sends is paced to the cap, shared by its streams: on loopback it would
    // otherwise run at gigabits per second.
    let tcp = ThroughputOptions {
        protocol: Protocol::Tcp,
        direction: Direction::Reverse,
        parallel: 2,
        duration: Duration::from_secs(1),
        ..ThroughputOptions::default()
    };
    let outcome = sonde_client::throughput(&target(&h), &tcp, &mut |_| {});
    if !sonde_net::socket::KERNEL_TCP_PACING {
        // No kernel pacing here (Windows, macOS): refused, never sent above the cap.
        match outcome {
            Err(
                e @ ClientError::Refused {
                    reason: Refusal::Limits,
                    ..
                },
            ) => assert!(e.to_string().contains("SO_MAX_PACING_RATE"), "{e}"),
            other => panic!("expected a refusal where TCP cannot be paced, got {other:?}"),
        }
        return;
    }
    let r = outcome.expect("TCP reverse");
    assert!(r.receiver.bytes > 0);
    assert!(
        r.receiver.bits_per_second < 2.0 * CAP as f64,
        "the agent sent {:.1} Mbit/s with a {} Mbit/s cap",
        r.receiver.bits_per_second / 1e6,
        CAP / 1_000_000
    );
}

/// TCP the client sends is read no faster than the cap (a token bucket on the agent's reads;
/// flow control holds the client's sender to it), shared by the session's streams. The bound
/// is an upper one a busy machine cannot break: from its first byte on, each stream reads only
/// what its share of the cap has earned since, so the receiver figure (bytes over first to last
/// byte) stays at the cap; the stated tolerance, 1 %, is for rounding only. What the client's
/// socket buffers still hold a second after its senders end is left unread, so a test under a
/// low cap ends on time.
#[test]
fn max_bitrate_caps_what_the_agent_receives_over_tcp() {
    const CAP: u64 = 50_000_000;
    let forward = |parallel| ThroughputOptions {
        protocol: Protocol::Tcp,
        direction: Direction::Forward,
        parallel,
        duration: Duration::from_secs(1),
        ..ThroughputOptions::default()
    };
    let capped = agent(|c| c.max_bitrate = Some(CAP));
    for parallel in [1, 4] {
        let r = sonde_client::throughput(&target(&capped), &forward(parallel), &mut |_| {})
            .unwrap_or_else(|e| panic!("TCP forward -P {parallel} under a cap: {e}"));
        let span_s = r.receiver.duration_ns as f64 / 1e9;
        assert!(r.receiver.bytes > 0 && span_s > 0.0, "{:?}", r.receiver);
        let tolerance_bps = CAP as f64 * 0.01;
        eprintln!(
            "-P {parallel}: read {:.2} Mbit/s over {span_s:.2} s (at most {:.2})",
            r.receiver.bits_per_second / 1e6,
            (CAP as f64 + tolerance_bps) / 1e6
        );
        assert!(
            r.receiver.bits_per_second <= CAP as f64 + tolerance_bps,
            "-P {parallel}: the agent read {:.1} Mbit/s over {span_s:.2} s with a {} Mbit/s cap",
            r.receiver.bits_per_second / 1e6,
            CAP / 1_000_000
        );
    }
    // Many streams under a low cap: the client's socket buffers take megabytes a stream, which
    // read at 10 Mbit/s / 16 would keep the test going for about 50 s; the agent leaves them
    // unread a second after the client's senders end. (A bound ten times the expected 2 s.)
    let low = agent(|c| c.max_bitrate = Some(10_000_000));
    let started = Instant::now();
    let r = sonde_client::throughput(&target(&low), &forward(16), &mut |_| {})
        .expect("TCP forward -P 16 under a low cap");
    assert!(r.receiver.bytes > 0 && r.receiver.bytes <= r.sender.bytes);
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "a 1 s test under a cap took {:?}",
        started.elapsed()
    );
    // The same client without a cap: loopback reads at gigabits per second.
    let unlimited = agent(|_| {});
    let r = sonde_client::throughput(&target(&unlimited), &forward(1), &mut |_| {})
        .expect("TCP forward without a cap");
    assert!(
        r.receiver.bits_per_second > 4.0 * CAP as f64,
        "without a cap the agent read only {:.1} Mbit/s",
        r.receiver.bits_per_second / 1e6
    );
}
