//! The agent's side of `sonde crr` through its sockets: only a session's own connections are
//! answered and counted, stalled joins are bounded, a cut or reset exchange is a failure, and a
//! crr session needs TCP and a request within bounds.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use socket2::{Domain, Socket, Type};
use sonde_net::control::{read_frame, write_frame};
use sonde_wire::{AgentReport, Channel, ControlMsg, CrrJoin, CrrReport, Direction, Protocol};
use sonde_wire::{TestKind, TestSpec, Token};

use super::{agent, preamble, spec, wait_until, Raw, PATIENCE};
use crate::crr::{DRAIN, MAX_CRR_MESSAGE, POOL_THREADS};
use crate::{Agent, AgentConfig, AgentHandle};

/// An agent on 127.0.0.1:0 with the default hello timeout.
fn default_agent() -> AgentHandle {
    let cfg = AgentConfig::new(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)));
    Agent::bind(cfg).expect("bind on loopback").spawn()
}

/// The agent's view of a crr test: `workers` connections at a time, `request` bytes each.
fn crr_spec(protocol: Protocol, workers: u32, request: u32, duration_ms: u64) -> TestSpec {
    TestSpec {
        streams: workers,
        msg_size: request,
        bitrate_per_stream: 0,
        ..spec(TestKind::Crr, protocol, Direction::Forward, duration_ms)
    }
}

/// A crr session opened by hand: the control connection and its token, once the agent is ready.
fn session(h: &AgentHandle, workers: u32, request: u32) -> (TcpStream, Token) {
    let (mut raw, token) = Raw::accepted(h, &crr_spec(Protocol::Tcp, workers, request, 5_000));
    assert_eq!(raw.recv(), ControlMsg::Ready);
    (raw.ctrl, token)
}

/// What opens a crr connection: the preamble and the join, before the request.
fn join_bytes(join: CrrJoin) -> Vec<u8> {
    let mut out = preamble(Channel::Crr).to_vec();
    out.extend_from_slice(&join.encode());
    out
}

/// One exchange from `from` (an address of this host): `Some(response length)` when the
/// agent answered, `None` when it closed the connection unanswered.
fn exchange(h: &AgentHandle, from: Ipv4Addr, join: CrrJoin, request: usize) -> Option<usize> {
    let sock = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    sock.bind(&SocketAddr::from((from, 0)).into()).unwrap();
    sock.connect(&h.local_addr().into()).unwrap();
    let mut s = TcpStream::from(sock);
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut out = join_bytes(join);
    out.resize(out.len() + request, 7);
    s.write_all(&out).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while got.len() < join.response_size as usize {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    (got.len() == join.response_size as usize && !got.is_empty()).then_some(got.len())
}

fn finish(ctrl: &mut TcpStream) -> CrrReport {
    finish_whole(ctrl).crr.expect("a crr report")
}

fn finish_whole(ctrl: &mut TcpStream) -> AgentReport {
    write_frame(ctrl, &ControlMsg::Finish).unwrap();
    let mut body = Vec::new();
    match read_frame(ctrl, &mut body, Instant::now() + PATIENCE + DRAIN) {
        Ok(ControlMsg::Report(r)) => r,
        other => panic!("no report: {other:?}"),
    }
}

/// Waits (within [`PATIENCE`]) until `h` has rejected `n` crr connections.
fn wait_for_rejections(h: &AgentHandle, n: u64) {
    assert!(
        wait_until(PATIENCE, || h.rejections().bad_crr.load(Ordering::Relaxed)
            == n),
        "the rejection count did not reach {n}"
    );
}

#[test]
fn only_the_sessions_own_connections_are_answered_and_counted() {
    let h = default_agent();
    let (mut ctrl, token) = session(&h, 2, 100);
    let good = CrrJoin {
        token,
        worker: 1,
        rst: false,
        response_size: 3_000,
        answer: false,
    };
    for _ in 0..5 {
        assert_eq!(exchange(&h, Ipv4Addr::LOCALHOST, good, 100), Some(3_000));
    }
    let bad = [
        CrrJoin {
            token: Token(token.0 ^ 1),
            ..good
        },
        CrrJoin { worker: 2, ..good },
        CrrJoin {
            response_size: 0,
            ..good
        },
        CrrJoin {
            response_size: MAX_CRR_MESSAGE + 1,
            ..good
        },
    ];
    for (n, join) in bad.into_iter().enumerate() {
        assert_eq!(
            exchange(&h, Ipv4Addr::LOCALHOST, join, 100),
            None,
            "{join:?}"
        );
        wait_for_rejections(&h, n as u64 + 1);
    }
    // The session's token, but not from the address that opened the session.
    assert_eq!(exchange(&h, Ipv4Addr::new(127, 0, 0, 2), good, 100), None);
    wait_for_rejections(&h, 5);
    // The session still serves, and counts only its own completed exchanges.
    assert_eq!(exchange(&h, Ipv4Addr::LOCALHOST, good, 100), Some(3_000));
    let whole = finish_whole(&mut ctrl);
    let report = whole.crr.expect("a crr report");
    assert_eq!(report.transactions, 6);
    assert_eq!(report.failed, 0);
    assert!(report.active_ns > 0);
    // The session's CPU: its own six exchanges, not the rejected strangers'.
    let cpu = whole.cpu.expect("the session's CPU");
    assert_eq!(cpu.messages, Some(6));
    assert_eq!(cpu.bytes, Some(6 * (100 + 3_000)));
    // Windows' thread CPU time advances in scheduler ticks (15.6 ms, 10 ms under wine),
    // and six loopback exchanges can all fall inside one: 0 ns there is a measurement,
    // not a thread left unmeasured (docs/platforms.md, "What wine cannot do", cpu-ticks).
    if !cfg!(windows) {
        assert!(cpu.user_ns + cpu.system_ns > 0, "{cpu:?}");
    }
    assert!(cpu.wall_ns > 0);
    // Once the session is over, its token opens nothing.
    assert!(
        wait_until(PATIENCE, || h.sessions() == 0),
        "the session's end did not happen"
    );
    assert_eq!(exchange(&h, Ipv4Addr::LOCALHOST, good, 100), None);
    wait_for_rejections(&h, 6);
}

#[test]
fn stalled_joins_hold_pending_places_not_unbounded_threads() {
    // Before, each join that showed a valid token and then stalled held a thread outside
    // every bound for the crr timeout: thousands of them made thousands of threads.
    const STALLED: usize = 60;
    let h = default_agent();
    let (mut ctrl, token) = session(&h, 1, 50);
    let out = join_bytes(CrrJoin {
        token,
        worker: 0,
        rst: false,
        response_size: 10,
        answer: false,
    });
    let held: Vec<TcpStream> = (0..STALLED)
        .map(|_| {
            let mut s = TcpStream::connect(h.local_addr()).unwrap();
            // The join, and never the request.
            let _ = s.write_all(&out);
            s
        })
        .collect();
    // The pool's threads take a few; the ordinary path holds the source's pending places
    // (16, and one more for the session's one worker); the rest are refused at once.
    let bound = POOL_THREADS + AgentConfig::new(h.local_addr()).max_pending_per_source + 1;
    let refused = (STALLED - bound) as u64;
    assert!(
        wait_until(PATIENCE, || {
            h.rejections().pending_source_full.load(Ordering::Relaxed) >= refused
        }),
        "the refusals did not happen"
    );
    drop(held);
    let _ = finish(&mut ctrl);
}

#[test]
fn an_exchange_cut_short_is_a_failure_of_the_session_not_a_transaction() {
    let h = default_agent();
    let (mut ctrl, token) = session(&h, 1, 50);
    let join = CrrJoin {
        token,
        worker: 0,
        rst: false,
        response_size: 10,
        answer: false,
    };
    // Half a request, then a close: identified, but not completed. The agent's close is awaited:
    // a connection the agent has not yet identified when `Finish` comes is not the session's
    // yet (it cannot know whose it is), so without the wait the count would race the accept.
    let mut s = TcpStream::connect(h.local_addr()).unwrap();
    let mut out = join_bytes(join);
    out.extend_from_slice(&[0u8; 25]);
    s.write_all(&out).unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut rest = Vec::new();
    assert!(
        matches!(s.read_to_end(&mut rest), Ok(0)),
        "the agent answered half a request, or did not close"
    );
    drop(s);
    // A full exchange closed with a reset where a FIN was agreed: abandoned.
    let sock = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    sock.connect(&h.local_addr().into()).unwrap();
    let mut out = join_bytes(join);
    out.extend_from_slice(&[0u8; 50]);
    let mut s = TcpStream::from(sock);
    s.write_all(&out).unwrap();
    let mut r = [0u8; 10];
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    s.read_exact(&mut r).unwrap();
    Socket::from(s).set_linger(Some(Duration::ZERO)).unwrap();
    assert_eq!(exchange(&h, Ipv4Addr::LOCALHOST, join, 50), Some(10));
    let report = finish(&mut ctrl);
    assert_eq!((report.transactions, report.failed), (1, 2), "{report:?}");
    assert_eq!(h.rejections().bad_crr.load(Ordering::Relaxed), 0);
}

#[test]
fn with_rst_agreed_the_reset_after_the_response_completes_the_exchange() {
    let h = default_agent();
    let (mut ctrl, token) = session(&h, 1, 1);
    let join = CrrJoin {
        token,
        worker: 0,
        rst: true,
        response_size: 1,
        answer: false,
    };
    for _ in 0..3 {
        let sock = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        sock.set_linger(Some(Duration::ZERO)).unwrap();
        sock.connect(&h.local_addr().into()).unwrap();
        let mut s = TcpStream::from(sock);
        let mut out = join_bytes(join);
        out.push(1);
        s.write_all(&out).unwrap();
        let mut r = [0u8; 1];
        s.set_read_timeout(Some(PATIENCE)).unwrap();
        s.read_exact(&mut r).unwrap();
    }
    let report = finish(&mut ctrl);
    assert_eq!((report.transactions, report.failed), (3, 0), "{report:?}");
}

#[test]
fn a_silent_stranger_is_closed_at_the_hello_timeout_with_or_without_a_session() {
    // The tests' agent: a 300 ms hello timeout.
    let h = agent(|_| {});
    let silent = |n: u64| {
        let mut s = TcpStream::connect(h.local_addr()).unwrap();
        s.write_all(&preamble(Channel::Crr)).unwrap();
        s.set_read_timeout(Some(PATIENCE)).unwrap();
        let mut b = [0u8; 1];
        // Closed by the agent (EOF or reset), not by this read's own timeout.
        match s.read(&mut b) {
            Ok(0) => {}
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset),
            Ok(_) => panic!("a silent stranger was answered"),
        }
        wait_for_rejections(&h, n);
    };
    // No crr session: the ordinary path reads the preamble and the join.
    silent(1);
    // A crr session runs: a pool thread takes the connection.
    let (mut ctrl, _token) = session(&h, 1, 1);
    silent(2);
    assert_eq!(finish(&mut ctrl).transactions, 0);
}

#[test]
fn a_crr_session_needs_tcp_and_a_request_within_bounds() {
    let h = default_agent();
    for (protocol, msg_size) in [(Protocol::Udp, 1), (Protocol::Tcp, MAX_CRR_MESSAGE + 1)] {
        let (_raw, reply) = Raw::start(&h, &crr_spec(protocol, 1, msg_size, 1_000));
        assert!(
            matches!(
                reply,
                ControlMsg::Refused {
                    reason: sonde_wire::Refusal::BadRequest,
                    ..
                }
            ),
            "{protocol:?} {msg_size}: {reply:?}"
        );
    }
}
