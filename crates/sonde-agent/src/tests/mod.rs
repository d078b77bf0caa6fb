//! The agent as a whole, through its sockets: it never panics or stops serving on bad input,
//! enforces its limits and its shared secret (`robustness`, `secrets`), serves only a crr
//! session's own connections (`crr`), and backs off at the descriptor limit (`descriptors`).
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

use crate::{Agent, AgentConfig, AgentHandle, Rejections};
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

mod balancer;
mod crr;
mod descriptors;
mod probes;
mod robustness;
mod secrets;

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
/// A latency test through the client's one entry.
fn latency(
    target: &sonde_client::Target,
    opt: &LatencyOptions,
) -> Result<sonde_client::LatencyMeasurement, ClientError> {
    sonde_client::run(target, opt, sonde_client::Controls::new())
}

/// A throughput test through the client's one entry.
fn throughput(
    target: &sonde_client::Target,
    opt: &ThroughputOptions,
) -> Result<<ThroughputOptions as sonde_client::Test>::Output, ClientError> {
    sonde_client::run(target, opt, sonde_client::Controls::new())
}

fn assert_serves(h: &AgentHandle) {
    assert_serves_over(h, Protocol::Tcp);
}

fn assert_serves_over(h: &AgentHandle, protocol: Protocol) {
    let r = latency(&target(h), &latency_opts(protocol))
        .unwrap_or_else(|e| panic!("the agent no longer serves {protocol:?} latency: {e}"))
        .result;
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
        socket: Default::default(),
        omit_ms: 0,
        skip_rx_copy: false,
        bytes: 0,
        blocks: 0,
        request_response: None,
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
            token: None,
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
    s.write_all(
        &DataJoin {
            token,
            stream,
            answer: false,
        }
        .encode(),
    )
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
