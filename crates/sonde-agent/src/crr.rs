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
use std::sync::{Arc, Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use sonde_net::control::{read_frame, write_frame};
use sonde_net::cpu::{CpuScope, CpuSnapshot, ThreadsMeter};
use sonde_net::crr::{agent_answer, agent_prepare, agent_read_join, peek_preamble, read_full};
use sonde_net::hostinfo::InterfaceSnapshot;
use sonde_net::socket::DataOptions;
use sonde_net::Clock;
use sonde_wire::{
    AgentReport, Channel, ControlMsg, CpuReport, CrrReport, Preamble, SessionId, Token,
    PREAMBLE_LEN,
};

use crate::{canonical, lock, PendingGuard, Shared, Slot};

/// Largest request and response of a crr exchange (as for TCP latency messages).
pub(crate) const MAX_CRR_MESSAGE: u32 = 65_536;
/// Threads that serve crr exchanges in place while a crr session runs.
pub(crate) const POOL_THREADS: usize = 8;
/// How long a pool thread waits for a new connection's preamble before it hands the connection
/// to the ordinary path. A client's preamble leaves with its request, right after the handshake.
const PEEK_BUDGET: Duration = Duration::from_millis(200);
/// Each read and write of an exchange (or the agent's hello timeout, when shorter).
const STEP: Duration = Duration::from_secs(5);
/// A whole exchange, from the join to the client's close.
const EXCHANGE_LIMIT: Duration = Duration::from_secs(10);
/// After `Finish`, how long the session waits for exchanges still in progress (the client has
/// closed all its connections by then; their last bytes are in flight).
pub(crate) const DRAIN: Duration = Duration::from_secs(5);
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
    /// `-w`, `-C`, `-M`, `-S`, `--dscp`: set on every connection of the session once it is
    /// identified, as asked (`None`: none asked).
    socket: Option<(DataOptions, sonde_wire::SocketOptions)>,
    /// What the kernel granted on the session's first connection (read back there once).
    applied: OnceLock<sonde_wire::AppliedSocketOptions>,
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
        socket: (!spec.socket.is_default())
            .then(|| (DataOptions::from(&spec.socket), spec.socket.clone())),
        applied: OnceLock::new(),
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
        // The interface toward the client, counted from here to the report.
        let interface = InterfaceSnapshot::toward(slot.peer_ip);
        let waited = wait_for_finish(&mut ctrl, shared, Instant::now() + planned + OVERRUN);
        drop(counted);
        match waited {
            Ok(()) => finish(&mut ctrl, &state, slot, interface.as_ref()),
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
fn finish(
    ctrl: &mut TcpStream,
    state: &Session,
    slot: &Slot,
    interface: Option<&InterfaceSnapshot>,
) -> String {
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
        socket: state.applied.get().cloned().map(Box::new),
        interface: interface.and_then(InterfaceSnapshot::delta).map(Box::new),
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
    // Behind a load balancer a connection may reach an agent without its session: one that
    // asked hears so (and from which agent) rather than a bare close.
    let answer = |stream: &mut TcpStream, outcome| {
        if join.answer {
            shared.answer_join(stream, outcome);
        }
        Served::Rejected
    };
    let Some(session) = shared.crr.get(join.token) else {
        return answer(&mut stream, sonde_wire::JoinOutcome::NoSuchSession);
    };
    if canonical(peer.ip()) != canonical(session.peer_ip) {
        return answer(&mut stream, sonde_wire::JoinOutcome::OtherAddress);
    }
    if u32::from(join.worker) >= session.workers
        || !(1..=MAX_CRR_MESSAGE).contains(&join.response_size)
    {
        return Served::Rejected;
    }
    identified();
    let counted = session.cpu.track_from(cpu_start);
    if let Some((options, asked)) = &session.socket {
        // On the accepted connection: the MSS bounds what this end sends, the buffers and the
        // TOS byte its responses. Checked at the session's start, so a refusal is not expected;
        // should one come, the exchange goes on without the option, and the read-back shows it.
        if session.applied.get().is_none() {
            // Read back on the first connection only: the getsockopt calls, and the sysctl
            // `to_wire` reads, are not part of every exchange.
            if let Ok(applied) = options.apply_tcp(&stream) {
                let _ = session.applied.set(applied.to_wire(asked, true));
            }
        } else {
            let _ = options.set_tcp(&stream);
        }
    }
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
