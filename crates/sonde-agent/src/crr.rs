//! The agent's side of `sonde crr`: the control session of a connection-rate test, and the
//! exchanges of its connections (request in, response out, wait for the client's close).
//!
//! A crr session is admitted like any other (limits, `max_sessions`, token), then registered
//! here: each connection presents the token in a [`sonde_wire::CrrJoin`] and must come from
//! the control connection's IP address. An unknown token, another address, a worker index out
//! of range or a response size out of bounds closes the connection unanswered and counts in
//! [`crate::Rejections::bad_crr`]. The session counts the exchanges it completed, reports the
//! count when the client says `Finish`, and ends at the latest 30 s after its planned end.
//!
//! How connections reach an exchange: the agent's ordinary path spawns a thread per accepted
//! connection to read its preamble, and that spawn costs more than the exchange. Measured on the
//! project's 2-core VM on loopback (1 B request and response): a micro-benchmark of a bare
//! accept loop served 1,600 to 7,500 transactions/s with a thread per connection against 8,000
//! to 14,000 served inline or by a pool of 2 to 4 threads; `sonde crr -t 3` (release build,
//! three interleaved rounds) read 1,300 to 3,400/s with one worker and 4,200 to 8,800/s with
//! four through the ordinary path, against 8,600 to 10,200/s and 12,800 to 13,600/s through the
//! pool. So while a crr session runs, the accept loop hands each new
//! connection to an idle thread of a fixed [`Pool`] instead, which peeks at the preamble (up to
//! 200 ms) and serves a crr exchange in place. Anything else (a control or data channel, junk,
//! a client slower than that) goes on to the ordinary path with its own timeouts and
//! accounting. A pool thread is taken only when idle: clients that hold pool threads with slow
//! exchanges (each bounded: the agent's hello timeout to show a token, 5 s per read or write,
//! 10 s in all) only send the next connections down the ordinary path, never stall them.
//!
//! CPU: the threads that serve exchanges are shared by every crr session, so each exchange's
//! CPU is counted to its own session: the serving thread takes a `RUSAGE_THREAD` snapshot when
//! it takes the connection, and once the token names the session, counts from that snapshot to
//! the close into the session's meter (two `getrusage` calls per connection). The session's
//! control thread counts too. Not counted: the accept loop's `accept` calls, which happen before
//! any connection is known to be a crr one, and exchanges rejected before they named a session.
//!
//! A connection's token is looked up under the registry's lock, once per connection: a
//! transaction already costs a dozen system calls (accept, options, reads, write, close), and
//! the lock is held for one hash lookup.

use std::collections::HashMap;
use std::net::{IpAddr, Shutdown, TcpStream};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use sonde_net::control::{read_frame, write_frame};
use sonde_net::cpu::{CpuScope, CpuSnapshot, ThreadsMeter};
use sonde_net::crr::{agent_answer, agent_prepare, agent_read_join, peek_preamble, read_full};
use sonde_net::Clock;
use sonde_wire::{
    AgentReport, Channel, ControlMsg, CpuReport, CrrReport, Preamble, SessionId, Token,
    PREAMBLE_LEN,
};

use crate::{canonical, lock, PendingGuard, Shared, Slot};

/// Largest request and response of a crr exchange (as for TCP latency messages).
pub(crate) const MAX_CRR_MESSAGE: u32 = 65_536;
/// Threads that serve crr exchanges in place while a crr session runs.
const POOL_THREADS: usize = 8;
/// How long a pool thread waits for a new connection's preamble before it hands the connection
/// to the ordinary path. A client's preamble leaves with its request, right after the handshake.
const PEEK_BUDGET: Duration = Duration::from_millis(200);
/// Each read and write of an exchange (or the agent's hello timeout, when shorter).
const STEP: Duration = Duration::from_secs(5);
/// A whole exchange, from the join to the client's close.
const EXCHANGE_LIMIT: Duration = Duration::from_secs(10);
/// After `Finish`, how long the session waits for exchanges still in progress (the client has
/// closed all its connections by then; their last bytes are in flight).
const DRAIN: Duration = Duration::from_secs(5);
/// How far past its planned end a crr session may run before the agent ends it.
const OVERRUN: Duration = Duration::from_secs(30);
/// How often the session looks at the shutdown flag while it waits for the client.
const POLL: Duration = Duration::from_millis(200);

/// One running crr session's counts, shared by the exchanges that present its token.
#[derive(Debug)]
pub(crate) struct Session {
    peer_ip: IpAddr,
    request_bytes: u32,
    workers: u32,
    clock: Clock,
    transactions: AtomicU64,
    failed: AtomicU64,
    /// Exchanges past the token check and not yet over.
    active: AtomicU32,
    /// When the first exchange was identified, ns on `clock` (`u64::MAX` before).
    first_ns: AtomicU64,
    /// When the last exchange completed.
    last_ns: AtomicU64,
    /// Request and response bytes of the completed exchanges.
    bytes: AtomicU64,
    /// CPU of this session's exchanges and its control thread.
    cpu: ThreadsMeter,
}

impl Session {
    fn report(&self) -> CrrReport {
        let transactions = self.transactions.load(Ordering::Acquire);
        let first = self.first_ns.load(Ordering::Acquire);
        let last = self.last_ns.load(Ordering::Acquire);
        CrrReport {
            transactions,
            active_ns: if transactions > 0 && first != u64::MAX {
                last.saturating_sub(first)
            } else {
                0
            },
            failed: self.failed.load(Ordering::Acquire),
        }
    }

    /// What the session's exchanges and control thread cost, once they have ended.
    fn cpu_report(&self) -> Option<CpuReport> {
        let cost = self.cpu.cost()?;
        // A dozen calls per exchange (accept, options, reads, write, close), not counted one by
        // one, as on the client.
        Some(cost.report(
            None,
            Some(self.transactions.load(Ordering::Acquire)),
            Some(self.bytes.load(Ordering::Acquire)),
        ))
    }
}

/// The crr sessions running now, by token.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    sessions: Mutex<HashMap<Token, Arc<Session>>>,
    /// How many are registered: the accept loop reads it on every connection, without a lock.
    running: AtomicUsize,
}

impl Registry {
    fn get(&self, token: Token) -> Option<Arc<Session>> {
        lock(&self.sessions).get(&token).cloned()
    }
}

/// Removes a session from the registry when it ends, however it ends.
struct Registered<'a> {
    registry: &'a Registry,
    token: Token,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        let mut sessions = lock(&self.registry.sessions);
        if sessions.remove(&self.token).is_some() {
            self.registry.running.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Runs an admitted crr session (the `Accepted` frame is sent) to its end, and logs its end.
pub(crate) fn run_session(
    mut ctrl: TcpStream,
    token: Token,
    slot: &Slot,
    shared: &Shared,
    session: SessionId,
    peer: &str,
) {
    let spec = &slot.spec;
    let state = Arc::new(Session {
        peer_ip: slot.peer_ip,
        request_bytes: spec.msg_size,
        workers: spec.streams,
        clock: Clock::start(),
        transactions: AtomicU64::new(0),
        failed: AtomicU64::new(0),
        active: AtomicU32::new(0),
        first_ns: AtomicU64::new(u64::MAX),
        last_ns: AtomicU64::new(0),
        bytes: AtomicU64::new(0),
        cpu: ThreadsMeter::start(),
    });
    {
        let mut sessions = lock(&shared.crr.sessions);
        sessions.insert(token, Arc::clone(&state));
        shared.crr.running.fetch_add(1, Ordering::AcqRel);
    }
    let _registered = Registered {
        registry: &shared.crr,
        token,
    };
    let outcome = if write_frame(&mut ctrl, &ControlMsg::Ready).is_err() {
        "ended: the client left before the test began".to_owned()
    } else {
        let planned = Duration::from_millis(spec.duration_ms);
        let counted = state.cpu.track();
        let waited = wait_for_finish(&mut ctrl, shared, Instant::now() + planned + OVERRUN);
        drop(counted);
        match waited {
            Ok(()) => finish(&mut ctrl, &state, slot),
            Err(why) => {
                let _ = write_frame(
                    &mut ctrl,
                    &ControlMsg::Error {
                        message: why.clone(),
                    },
                );
                format!("ended: {why}")
            }
        }
    };
    shared.report(|| crate::AgentEvent::SessionEnded {
        session,
        peer: peer.to_string(),
        outcome,
    });
}

/// Waits for the client's `Finish`, watching the shutdown flag and the session's hard end.
fn wait_for_finish(ctrl: &mut TcpStream, shared: &Shared, hard_end: Instant) -> Result<(), String> {
    let mut body = Vec::new();
    loop {
        if shared.shutdown.load(Ordering::Relaxed) {
            return Err("the agent is shutting down".into());
        }
        if Instant::now() >= hard_end {
            return Err(format!(
                "the test overran its planned end by {} s",
                OVERRUN.as_secs()
            ));
        }
        // Peek, so that a poll that times out never leaves half a frame behind.
        let mut b = [0u8; 1];
        let ready = ctrl
            .set_read_timeout(Some(POLL))
            .and_then(|()| ctrl.peek(&mut b));
        match ready {
            Ok(0) => return Err("the client closed the control connection".into()),
            Ok(_) => {}
            Err(e) if sonde_net::fault::timed_out(&e) => continue,
            Err(e) => return Err(format!("control connection lost: {e}")),
        }
        match read_frame(ctrl, &mut body, Instant::now() + STEP) {
            Ok(ControlMsg::Finish) => return Ok(()),
            // Harmless: a client may say when its workers start.
            Ok(ControlMsg::Go) => {}
            Ok(ControlMsg::Error { message }) => {
                return Err(format!("the client reported: {message}"))
            }
            Ok(_) => return Err("unexpected control message from the client".into()),
            Err(e) => return Err(format!("control connection lost: {e}")),
        }
    }
}

/// After `Finish`: lets the exchanges in progress end, then sends the report.
fn finish(ctrl: &mut TcpStream, state: &Session, slot: &Slot) -> String {
    let drain_end = Instant::now() + DRAIN;
    while state.active.load(Ordering::Acquire) > 0 && Instant::now() < drain_end {
        thread::sleep(Duration::from_millis(1));
    }
    let crr = state.report();
    let line = format!(
        "finished: {} transactions, {} failed",
        crr.transactions, crr.failed
    );
    let report = AgentReport {
        overlapping_sessions: slot.overlap.load(Ordering::Relaxed),
        crr: Some(crr),
        cpu: state.cpu_report(),
        ..AgentReport::default()
    };
    if write_frame(ctrl, &ControlMsg::Report(report)).is_err() {
        return "ended before its report was delivered".into();
    }
    // Let the client read the report before the close.
    let _ = ctrl.shutdown(Shutdown::Write);
    line
}

/// How one crr connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Served {
    /// Counted in its session's transactions.
    Completed,
    /// Its session's, but not completed: counted in the session's `failed`.
    Failed,
    /// Not a connection of a running crr session: closed unanswered.
    Rejected,
}

/// A crr connection from the ordinary path, its preamble read. It counts as pending until it
/// ends, since it holds a thread for as long as its exchange may stall (the crr timeout): its
/// source may hold as many more pending connections as its crr sessions have workers, so a
/// stalled join costs a place of that bound, not a thread outside every bound.
pub(crate) fn serve_spawned(
    stream: TcpStream,
    preamble: Preamble,
    shared: &Shared,
    _pending: &mut Option<PendingGuard>,
) {
    let cpu_start = CpuSnapshot::take(CpuScope::Thread).ok();
    let served = if preamble.check_version().is_ok() {
        serve(stream, shared, true, cpu_start, || {})
    } else {
        Served::Rejected
    };
    if served == Served::Rejected {
        shared.rejections.bad_crr.fetch_add(1, Ordering::Relaxed);
    }
}

/// One exchange: join, identification, request, response, the client's close. Its CPU, from
/// `cpu_start` (this thread, when it took the connection) to the close, counts to its session.
fn serve(
    mut stream: TcpStream,
    shared: &Shared,
    preamble_read: bool,
    cpu_start: Option<CpuSnapshot>,
    identified: impl FnOnce(),
) -> Served {
    // A stranger has the agent's hello timeout to say who it is, as on every other channel.
    let hello = shared.cfg.hello_timeout;
    if agent_prepare(&stream, STEP.min(hello)).is_err() {
        return Served::Rejected;
    }
    let start = Instant::now();
    let (join_deadline, deadline) = (start + hello.min(EXCHANGE_LIMIT), start + EXCHANGE_LIMIT);
    if !preamble_read {
        let mut b = [0u8; PREAMBLE_LEN];
        if read_full(&mut stream, &mut b, join_deadline).is_err() {
            return Served::Rejected;
        }
    }
    let Ok(join) = agent_read_join(&mut stream, join_deadline) else {
        return Served::Rejected;
    };
    let Ok(peer) = stream.peer_addr() else {
        return Served::Rejected;
    };
    let Some(session) = shared.crr.get(join.token) else {
        return Served::Rejected;
    };
    if canonical(peer.ip()) != canonical(session.peer_ip)
        || u32::from(join.worker) >= session.workers
        || !(1..=MAX_CRR_MESSAGE).contains(&join.response_size)
    {
        return Served::Rejected;
    }
    identified();
    let counted = session.cpu.track_from(cpu_start);
    session.active.fetch_add(1, Ordering::AcqRel);
    session
        .first_ns
        .fetch_min(session.clock.now_ns(), Ordering::AcqRel);
    let answered = agent_answer(
        &mut stream,
        session.request_bytes,
        join.response_size,
        join.rst,
        deadline,
    );
    // The close is part of the exchange's cost.
    drop(stream);
    let served = if answered.is_ok() {
        session.bytes.fetch_add(
            u64::from(session.request_bytes) + u64::from(join.response_size),
            Ordering::AcqRel,
        );
        session
            .last_ns
            .fetch_max(session.clock.now_ns(), Ordering::AcqRel);
        session.transactions.fetch_add(1, Ordering::AcqRel);
        Served::Completed
    } else {
        session.failed.fetch_add(1, Ordering::AcqRel);
        Served::Failed
    };
    // Counted before the exchange stops being active: the session's report waits for that.
    drop(counted);
    session.active.fetch_sub(1, Ordering::AcqRel);
    served
}

/// Threads that serve crr exchanges in place, started with the first crr session.
pub(crate) struct Pool {
    shared: Arc<Shared>,
    idle: Arc<AtomicUsize>,
    tx: Option<SyncSender<TcpStream>>,
}

impl Pool {
    /// A pool with no threads yet.
    pub(crate) fn new(shared: &Arc<Shared>) -> Self {
        Self {
            shared: Arc::clone(shared),
            idle: Arc::new(AtomicUsize::new(0)),
            tx: None,
        }
    }

    /// Takes a newly accepted connection when a crr session runs and a pool thread is idle;
    /// otherwise gives it back for the ordinary path.
    pub(crate) fn offer(&mut self, stream: TcpStream) -> Option<TcpStream> {
        if self.shared.crr.running.load(Ordering::Acquire) == 0 {
            return Some(stream);
        }
        if self.tx.is_none() {
            self.start();
        }
        let Some(tx) = self.tx.as_ref() else {
            return Some(stream);
        };
        let claimed = self
            .idle
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
        if claimed.is_err() {
            return Some(stream);
        }
        match tx.try_send(stream) {
            Ok(()) => None,
            Err(mpsc::TrySendError::Full(s) | mpsc::TrySendError::Disconnected(s)) => {
                self.idle.fetch_add(1, Ordering::AcqRel);
                Some(s)
            }
        }
    }

    fn start(&mut self) {
        // Never more queued than claimed, and never more claimed than threads.
        let (tx, rx) = mpsc::sync_channel::<TcpStream>(POOL_THREADS);
        let rx = Arc::new(Mutex::new(rx));
        for _ in 0..POOL_THREADS {
            let (rx, idle, shared) = (
                Arc::clone(&rx),
                Arc::clone(&self.idle),
                Arc::clone(&self.shared),
            );
            let spawned = thread::Builder::new()
                .name("sonde-crr".into())
                .spawn(move || pool_thread(&rx, &idle, &shared));
            if spawned.is_err() {
                break;
            }
        }
        self.tx = Some(tx);
    }
}

fn pool_thread(rx: &Mutex<mpsc::Receiver<TcpStream>>, idle: &AtomicUsize, shared: &Arc<Shared>) {
    idle.fetch_add(1, Ordering::AcqRel);
    loop {
        let next = lock(rx).recv_timeout(POLL);
        match next {
            Ok(stream) => {
                take_offered(stream, shared);
                idle.fetch_add(1, Ordering::AcqRel);
            }
            Err(RecvTimeoutError::Timeout) => {
                if shared.shutdown.load(Ordering::Relaxed) {
                    break;
                }
            }
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    // Whatever it had claimed is gone with it.
    let _ = idle.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
}

/// A connection a pool thread took: a crr exchange is served here, anything else goes on.
fn take_offered(stream: TcpStream, shared: &Arc<Shared>) {
    let cpu_start = CpuSnapshot::take(CpuScope::Thread).ok();
    match peek_preamble(&stream, PEEK_BUDGET) {
        Some(p) if p.channel == Channel::Crr => {
            let served = if p.check_version().is_ok() {
                serve(stream, shared, false, cpu_start, || {})
            } else {
                Served::Rejected
            };
            if served == Served::Rejected {
                shared.rejections.bad_crr.fetch_add(1, Ordering::Relaxed);
            }
        }
        _ => ordinary_path(stream, shared),
    }
}

/// The accept loop's ordinary path: a thread of its own, under the pending limits.
fn ordinary_path(stream: TcpStream, shared: &Arc<Shared>) {
    crate::spawn_connection(stream, shared);
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::{Ipv4Addr, SocketAddr};

    use socket2::{Domain, Socket, Type};
    use sonde_wire::{CrrJoin, Direction, Protocol, TestKind, TestSpec};

    use super::*;
    use crate::{Agent, AgentConfig, AgentHandle};

    const PATIENCE: Duration = Duration::from_secs(3);

    fn agent() -> AgentHandle {
        let cfg = AgentConfig::new(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)));
        Agent::bind(cfg).expect("bind on loopback").spawn()
    }

    /// A crr session opened by hand: the control connection and its token.
    fn session(h: &AgentHandle, workers: u32, request: u32) -> (TcpStream, Token) {
        let mut ctrl = TcpStream::connect(h.local_addr()).unwrap();
        let preamble = Preamble {
            version: sonde_wire::PROTOCOL_VERSION,
            channel: Channel::Control,
        };
        ctrl.write_all(&preamble.encode()).unwrap();
        let hello = ControlMsg::Hello {
            protocol: sonde_wire::PROTOCOL_VERSION,
            software: "crr test".into(),
            nonce: sonde_wire::auth::Nonce([1; 32]),
        };
        write_frame(&mut ctrl, &hello).unwrap();
        let mut body = Vec::new();
        let deadline = || Instant::now() + PATIENCE;
        assert!(matches!(
            read_frame(&mut ctrl, &mut body, deadline()),
            Ok(ControlMsg::Welcome { .. })
        ));
        let spec = TestSpec {
            kind: TestKind::Crr,
            protocol: Protocol::Tcp,
            direction: Direction::Forward,
            streams: workers,
            msg_size: request,
            bitrate_per_stream: 0,
            duration_ms: 5_000,
            interval_ms: 0,
            read_size: 0,
        };
        write_frame(
            &mut ctrl,
            &ControlMsg::Start {
                spec,
                proof: None,
                tuning: sonde_wire::Tuning::default(),
            },
        )
        .unwrap();
        let Ok(ControlMsg::Accepted { token, .. }) = read_frame(&mut ctrl, &mut body, deadline())
        else {
            panic!("the crr session was not accepted");
        };
        assert_eq!(
            read_frame(&mut ctrl, &mut body, deadline()).ok(),
            Some(ControlMsg::Ready)
        );
        (ctrl, token)
    }

    /// One exchange from `from` (an address of this host): `Some(response length)` when the
    /// agent answered, `None` when it closed the connection unanswered.
    fn exchange(h: &AgentHandle, from: Ipv4Addr, join: CrrJoin, request: usize) -> Option<usize> {
        let sock = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        sock.bind(&SocketAddr::from((from, 0)).into()).unwrap();
        sock.connect(&h.local_addr().into()).unwrap();
        let mut s = TcpStream::from(sock);
        s.set_read_timeout(Some(PATIENCE)).unwrap();
        let mut out = Preamble {
            version: sonde_wire::PROTOCOL_VERSION,
            channel: Channel::Crr,
        }
        .encode()
        .to_vec();
        out.extend_from_slice(&join.encode());
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

    fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + PATIENCE;
        while !done() {
            assert!(Instant::now() < deadline, "{what} did not happen");
            thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn only_the_sessions_own_connections_are_answered_and_counted() {
        let h = agent();
        let (mut ctrl, token) = session(&h, 2, 100);
        let good = CrrJoin {
            token,
            worker: 1,
            rst: false,
            response_size: 3_000,
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
            wait_for("the rejection count", || {
                h.rejections().bad_crr.load(Ordering::Relaxed) == n as u64 + 1
            });
        }
        // The session's token, but not from the address that opened the session.
        assert_eq!(exchange(&h, Ipv4Addr::new(127, 0, 0, 2), good, 100), None);
        wait_for("the rejection count", || {
            h.rejections().bad_crr.load(Ordering::Relaxed) == 5
        });
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
        wait_for("the session's end", || h.sessions() == 0);
        assert_eq!(exchange(&h, Ipv4Addr::LOCALHOST, good, 100), None);
        wait_for("the rejection count", || {
            h.rejections().bad_crr.load(Ordering::Relaxed) == 6
        });
    }

    #[test]
    fn stalled_joins_hold_pending_places_not_unbounded_threads() {
        // Before, each join that showed a valid token and then stalled held a thread outside
        // every bound for the crr timeout: thousands of them made thousands of threads.
        const STALLED: usize = 60;
        let h = agent();
        let (mut ctrl, token) = session(&h, 1, 50);
        let join = CrrJoin {
            token,
            worker: 0,
            rst: false,
            response_size: 10,
        };
        let mut out = Preamble {
            version: sonde_wire::PROTOCOL_VERSION,
            channel: Channel::Crr,
        }
        .encode()
        .to_vec();
        out.extend_from_slice(&join.encode());
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
        wait_for("the refusals", || {
            h.rejections().pending_source_full.load(Ordering::Relaxed) >= refused
        });
        drop(held);
        let _ = finish(&mut ctrl);
    }

    #[test]
    fn an_exchange_cut_short_is_a_failure_of_the_session_not_a_transaction() {
        let h = agent();
        let (mut ctrl, token) = session(&h, 1, 50);
        let join = CrrJoin {
            token,
            worker: 0,
            rst: false,
            response_size: 10,
        };
        // Half a request, then a close: identified, but not completed.
        let mut s = TcpStream::connect(h.local_addr()).unwrap();
        let mut out = Preamble {
            version: sonde_wire::PROTOCOL_VERSION,
            channel: Channel::Crr,
        }
        .encode()
        .to_vec();
        out.extend_from_slice(&join.encode());
        out.extend_from_slice(&[0u8; 25]);
        s.write_all(&out).unwrap();
        drop(s);
        // A full exchange closed with a reset where a FIN was agreed: abandoned.
        let sock = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        sock.connect(&h.local_addr().into()).unwrap();
        let mut out = Preamble {
            version: sonde_wire::PROTOCOL_VERSION,
            channel: Channel::Crr,
        }
        .encode()
        .to_vec();
        out.extend_from_slice(&join.encode());
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
        let h = agent();
        let (mut ctrl, token) = session(&h, 1, 1);
        let join = CrrJoin {
            token,
            worker: 0,
            rst: true,
            response_size: 1,
        };
        for _ in 0..3 {
            let sock = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
            sock.set_linger(Some(Duration::ZERO)).unwrap();
            sock.connect(&h.local_addr().into()).unwrap();
            let mut s = TcpStream::from(sock);
            let mut out = Preamble {
                version: sonde_wire::PROTOCOL_VERSION,
                channel: Channel::Crr,
            }
            .encode()
            .to_vec();
            out.extend_from_slice(&join.encode());
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
        let mut cfg = AgentConfig::new(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)));
        cfg.hello_timeout = Duration::from_millis(300);
        let h = Agent::bind(cfg).expect("bind on loopback").spawn();
        let silent = |n: u64| {
            let mut s = TcpStream::connect(h.local_addr()).unwrap();
            s.write_all(
                &Preamble {
                    version: sonde_wire::PROTOCOL_VERSION,
                    channel: Channel::Crr,
                }
                .encode(),
            )
            .unwrap();
            s.set_read_timeout(Some(PATIENCE)).unwrap();
            let mut b = [0u8; 1];
            // Closed by the agent (EOF or reset), not by this read's own timeout.
            match s.read(&mut b) {
                Ok(0) => {}
                Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset),
                Ok(_) => panic!("a silent stranger was answered"),
            }
            wait_for("the rejection count", || {
                h.rejections().bad_crr.load(Ordering::Relaxed) == n
            });
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
        let h = agent();
        for (protocol, msg_size) in [(Protocol::Udp, 1), (Protocol::Tcp, MAX_CRR_MESSAGE + 1)] {
            let mut ctrl = TcpStream::connect(h.local_addr()).unwrap();
            ctrl.write_all(
                &Preamble {
                    version: sonde_wire::PROTOCOL_VERSION,
                    channel: Channel::Control,
                }
                .encode(),
            )
            .unwrap();
            let hello = ControlMsg::Hello {
                protocol: sonde_wire::PROTOCOL_VERSION,
                software: "crr test".into(),
                nonce: sonde_wire::auth::Nonce([1; 32]),
            };
            write_frame(&mut ctrl, &hello).unwrap();
            let mut body = Vec::new();
            let _welcome = read_frame(&mut ctrl, &mut body, Instant::now() + PATIENCE).unwrap();
            let spec = TestSpec {
                kind: TestKind::Crr,
                protocol,
                direction: Direction::Forward,
                streams: 1,
                msg_size,
                bitrate_per_stream: 0,
                duration_ms: 1_000,
                interval_ms: 0,
                read_size: 0,
            };
            write_frame(
                &mut ctrl,
                &ControlMsg::Start {
                    spec,
                    proof: None,
                    tuning: sonde_wire::Tuning::default(),
                },
            )
            .unwrap();
            let reply = read_frame(&mut ctrl, &mut body, Instant::now() + PATIENCE);
            assert!(
                matches!(
                    reply,
                    Ok(ControlMsg::Refused {
                        reason: sonde_wire::Refusal::BadRequest,
                        ..
                    })
                ),
                "{protocol:?} {msg_size}: {reply:?}"
            );
        }
    }
}
