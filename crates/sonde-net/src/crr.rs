//! Connection rate (`sonde crr`): the client's connect-request-response-close loop, and the
//! agent's side of one exchange.
//!
//! Each transaction is a new TCP connection: the client connects, writes the preamble
//! (channel `crr`), a [`CrrJoin`] and the request in one write, reads the whole response, and
//! closes first, so that `TIME_WAIT` stays on the client as in netperf's `TCP_CRR`. With `rst`
//! it closes with a reset instead (`SO_LINGER` 0): no `TIME_WAIT`, so its ephemeral ports are
//! free again at once. The agent reads the request, writes the response, and waits for that
//! close before it closes its own end.
//!
//! Every step has a timeout; the loops allocate nothing per transaction (the buffers are made
//! before the loop) and count into a per-worker [`CrrStats`]; with intervals (`sonde crr -i`)
//! also into the worker's current interval, which it adds to the run's [`SharedCrrIntervals`]
//! once its clock has passed that interval (see [`CrrIntervalCutter`] for why).

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use sonde_engine::crr::{CrrError, CrrIntervalCounts, CrrIntervalCutter, CrrIntervals, CrrStats};
use sonde_wire::{Channel, CrrJoin, Preamble, Token, CRR_JOIN_LEN, PREAMBLE_LEN, PROTOCOL_VERSION};

use crate::deadline::{self, Fill};
use crate::Clock;

/// After a failure that says the agent is not serving (refused, closed early, anything
/// unexpected), a worker waits this long before its next attempt, so that a dead agent costs a
/// few hundred attempts per second rather than a spinning core.
const ERROR_BACKOFF: Duration = Duration::from_millis(10);

/// One client worker's settings.
#[derive(Debug, Clone)]
pub struct CrrClientConfig {
    /// The agent's address (its one port).
    pub agent: SocketAddr,
    /// The session's token.
    pub token: Token,
    /// This worker's index.
    pub worker: u16,
    /// Request size, bytes (the session's `msg_size`).
    pub request_bytes: u32,
    /// Response size, bytes.
    pub response_bytes: u32,
    /// Close with a reset (`SO_LINGER` 0) instead of a FIN.
    pub rst: bool,
    /// No new attempt starts at or after this time on the test clock, ns.
    pub until_ns: u64,
    /// Limit of each step: the connect, and the wait for the whole response.
    pub timeout: Duration,
    /// Ask an agent without the session to say so ([`CrrJoin::answer`]): only for an agent
    /// that named itself when it admitted the test.
    pub answer: bool,
    /// The source address and device of every connection (`-B`, `--bind-dev`); the port is
    /// always an ephemeral one (a connection per transaction leaves each in TIME_WAIT).
    pub bind: crate::socket::Bind,
    /// `-w`, `-C`, `-M`, `-S`, `--dscp`: set on every connection before it connects; `None`
    /// for none.
    pub socket: Option<CrrSocket>,
}

/// The socket options of a crr test's connections, and what the kernel granted.
#[derive(Debug, Clone, Default)]
pub struct CrrSocket {
    /// Set on every connection before its connect.
    pub options: crate::socket::DataOptions,
    /// What the kernel granted on the first connection that connected, read back there once
    /// (not per connection: the getsockopt calls would be part of every transaction).
    pub first: Arc<OnceLock<crate::socket::Applied>>,
}

/// All workers' intervals of a run (`sonde crr -i`). Each worker adds to it once per interval
/// it counted in, when its clock passes that interval's end, and once at its own end: the lock
/// is taken that often, never per transaction.
#[derive(Debug)]
pub struct SharedCrrIntervals {
    interval_ns: u64,
    all: Mutex<CrrIntervals>,
}

impl SharedCrrIntervals {
    /// Shares `intervals` between workers.
    pub fn new(intervals: CrrIntervals) -> Self {
        Self {
            interval_ns: intervals.interval_ns(),
            all: Mutex::new(intervals),
        }
    }

    /// The intervals, once every worker has ended.
    pub fn into_inner(self) -> CrrIntervals {
        self.all
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn add(&self, index: u64, counts: &CrrIntervalCounts) {
        // Only a merge runs under the lock; were one to panic, the counts merged before it
        // would still stand, so a poisoned lock is used as it is.
        self.all
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .add(index, counts);
    }
}

/// What a worker records into: its totals, and with intervals its current interval.
struct Recorder<'a> {
    stats: CrrStats,
    intervals: Option<(CrrIntervalCutter, &'a SharedCrrIntervals)>,
}

impl<'a> Recorder<'a> {
    fn new(intervals: Option<&'a SharedCrrIntervals>) -> Self {
        Self {
            stats: CrrStats::new(),
            intervals: intervals.map(|s| (CrrIntervalCutter::new(s.interval_ns), s)),
        }
    }

    fn connected(&mut self, start_ns: u64, connected_ns: u64) {
        self.stats.connected(start_ns, connected_ns);
        if let Some((cut, shared)) = &mut self.intervals {
            let connect_ns = connected_ns.saturating_sub(start_ns);
            cut.connected(connected_ns, connect_ns, &mut |i, c| shared.add(i, c));
        }
    }

    fn completed(&mut self, start_ns: u64, done_ns: u64) {
        self.stats.completed(start_ns, done_ns);
        if let Some((cut, shared)) = &mut self.intervals {
            cut.completed(done_ns, &mut |i, c| shared.add(i, c));
        }
    }

    /// An attempt that started at `start_ns` failed, as seen at `seen_ns`.
    fn failed(&mut self, start_ns: u64, seen_ns: u64, kind: CrrError) {
        self.stats.failed(start_ns, kind);
        if let Some((cut, shared)) = &mut self.intervals {
            cut.failed(seen_ns, kind, &mut |i, c| shared.add(i, c));
        }
    }

    fn finish(mut self) -> CrrStats {
        if let Some((cut, shared)) = &mut self.intervals {
            cut.finish(&mut |i, c| shared.add(i, c));
        }
        self.stats
    }
}

/// The client's side of one worker: connect, request, response, close, until `until_ns`, `stop`,
/// or the first `EADDRNOTAVAIL` (the client has run out of ephemeral ports: then it also sets
/// `stop`, so every worker ends and the rate is not counted over a time when no connection
/// could be made).
pub fn client_worker(cfg: &CrrClientConfig, clock: &Clock, stop: &AtomicBool) -> CrrStats {
    client_worker_with_intervals(cfg, clock, stop, None)
}

/// [`client_worker`], also counting into `intervals` (on the grid of `clock`'s origin).
pub fn client_worker_with_intervals(
    cfg: &CrrClientConfig,
    clock: &Clock,
    stop: &AtomicBool,
    intervals: Option<&SharedCrrIntervals>,
) -> CrrStats {
    let mut rec = Recorder::new(intervals);
    let addr = SockAddr::from(cfg.agent);
    let domain = Domain::for_address(cfg.agent);
    let request = request_bytes(cfg);
    let mut response = vec![0u8; cfg.response_bytes as usize];
    while !stop.load(Ordering::Relaxed) {
        let start = clock.now_ns();
        if start >= cfg.until_ns {
            break;
        }
        let Err(kind) = attempt(cfg, &addr, domain, &request, &mut response, clock, &mut rec)
        else {
            continue;
        };
        rec.failed(start, clock.now_ns(), kind);
        match kind {
            CrrError::AddrNotAvailable => {
                stop.store(true, Ordering::Relaxed);
                break;
            }
            CrrError::Refused | CrrError::Closed | CrrError::Other => {
                std::thread::sleep(ERROR_BACKOFF);
            }
            CrrError::Timeout | CrrError::Reset | CrrError::OtherAgent => {}
        }
    }
    rec.finish()
}

/// What the client writes on each connection: preamble, join, then the request (zeros).
fn request_bytes(cfg: &CrrClientConfig) -> Vec<u8> {
    let len = PREAMBLE_LEN + CRR_JOIN_LEN + cfg.request_bytes as usize;
    let mut b = Vec::with_capacity(len);
    b.extend_from_slice(
        &Preamble {
            version: PROTOCOL_VERSION,
            channel: Channel::Crr,
        }
        .encode(),
    );
    b.extend_from_slice(
        &CrrJoin {
            token: cfg.token,
            worker: cfg.worker,
            rst: cfg.rst,
            response_size: cfg.response_bytes,
            answer: cfg.answer,
        }
        .encode(),
    );
    b.resize(len, 0);
    b
}

/// One transaction; records the connect and the transaction in `rec`.
fn attempt(
    cfg: &CrrClientConfig,
    addr: &SockAddr,
    domain: Domain,
    request: &[u8],
    response: &mut [u8],
    clock: &Clock,
    rec: &mut Recorder<'_>,
) -> Result<(), CrrError> {
    let start = clock.now_ns();
    let sock = Socket::new(domain, Type::STREAM, Some(Protocol::TCP)).map_err(|e| classify(&e))?;
    let setup = || -> io::Result<()> {
        if cfg.rst {
            sock.set_linger(Some(Duration::ZERO))?;
        }
        // A request or response larger than one segment must not wait for an ACK (Nagle).
        sock.set_nodelay(true)?;
        sock.set_read_timeout(Some(cfg.timeout))?;
        sock.set_write_timeout(Some(cfg.timeout))?;
        if !cfg.bind.is_default() {
            cfg.bind.apply(&sock, cfg.agent, 0)?;
        }
        Ok(())
    };
    setup().map_err(|e| classify(&e))?;
    if let Some(s) = &cfg.socket {
        // The client checked them on a socket of its own first: a refusal here is not the
        // path's, and is counted as an other failure.
        s.options
            .set_tcp_to(&sock, cfg.agent)
            .map_err(|_| CrrError::Other)?;
        sock.connect_timeout(addr, cfg.timeout)
            .map_err(|e| classify(&e))?;
        if s.first.get().is_none() {
            // Read back once, on the connection (an MSS settles at the handshake); setting them
            // again is harmless.
            if let Ok(connected) = s.options.apply_tcp_to(&sock, cfg.agent) {
                let _ = s.first.set(connected);
            }
        }
    } else {
        sock.connect_timeout(addr, cfg.timeout)
            .map_err(|e| classify(&e))?;
    }
    rec.connected(start, clock.now_ns());
    // Each call is bounded by the socket's timeouts, the whole exchange by one more.
    let deadline = Instant::now() + cfg.timeout;
    if let Some(first) = response.first_mut() {
        // What an earlier answer left there must not be read as this one's.
        *first = 0;
    }
    let exchange = write_all_by(&sock, request, deadline)
        .and_then(|()| read_all_by(&sock, response, deadline));
    // A response is zeros; an agent without the session answers `SNDK...` and closes, which a
    // response of 16 bytes or more reads as cut short and a shorter one reads in part.
    if cfg.answer && response.first() == Some(&b'S') {
        let _ = sock.set_linger(Some(Duration::ZERO));
        return Err(CrrError::OtherAgent);
    }
    if let Err(e) = exchange {
        // Abandoned: a reset tells the agent this exchange did not complete.
        let _ = sock.set_linger(Some(Duration::ZERO));
        return Err(classify(&e));
    }
    rec.completed(start, clock.now_ns());
    // Dropping the socket closes it: a FIN (TIME_WAIT here), or a reset with `rst`.
    drop(sock);
    Ok(())
}

/// The kind of a failed step.
pub fn classify(e: &io::Error) -> CrrError {
    use io::ErrorKind as K;
    match e.kind() {
        K::ConnectionRefused => CrrError::Refused,
        _ if crate::fault::timed_out(e) => CrrError::Timeout,
        _ if crate::fault::peer_gone(e) => CrrError::Reset,
        K::AddrNotAvailable => CrrError::AddrNotAvailable,
        K::UnexpectedEof => CrrError::Closed,
        _ => CrrError::Other,
    }
}

// ---------------------------------------------------------------------------------------------
// The agent's side
// ---------------------------------------------------------------------------------------------

/// Zeros for responses, written in chunks of this size.
static ZEROS: [u8; 64 * 1024] = [0; 64 * 1024];

/// Looks at a new connection's preamble without taking it off the socket, waiting at most
/// `budget` for it to arrive: `Some` when all 8 bytes are there and decode. `None` (too slow,
/// cut short, junk, closed) leaves the connection to the agent's ordinary path, which reads it
/// again with its own timeout and accounting.
pub fn peek_preamble(stream: &TcpStream, budget: Duration) -> Option<Preamble> {
    stream.set_read_timeout(Some(budget)).ok()?;
    let mut b = [0u8; PREAMBLE_LEN];
    match stream.peek(&mut b) {
        // A client writes preamble, join and request at once: 8 bytes arrive together.
        Ok(PREAMBLE_LEN) => Preamble::decode(&b).ok(),
        _ => None,
    }
}

/// Prepares an agent's crr connection: every read and write of it times out after `step`, and
/// the response is not held back by Nagle's algorithm.
pub fn agent_prepare(stream: &TcpStream, step: Duration) -> io::Result<()> {
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(step))?;
    stream.set_write_timeout(Some(step))
}

/// Reads exactly `buf.len()` bytes, giving up at `deadline` (checked between reads; each read
/// is bounded by the socket's read timeout, see [`agent_prepare`]).
pub fn read_full(stream: &mut TcpStream, buf: &mut [u8], deadline: Instant) -> io::Result<()> {
    read_all_by(stream, buf, deadline)
}

/// `read_exact` with a deadline checked between reads, so that a peer that trickles bytes
/// cannot hold the caller past it.
fn read_all_by(mut r: impl Read, buf: &mut [u8], deadline: Instant) -> io::Result<()> {
    deadline::read_full(buf, |b| r.read(b), &mut ByInstant(deadline))
}

/// A CRR read's policy: the deadline is looked at between reads (each read is bounded by the
/// socket's own timeout, whose expiry is an error like any other); a signal reads again.
struct ByInstant(Instant);

impl Fill for ByInstant {
    type Error = io::Error;

    fn before_read(&mut self) -> io::Result<()> {
        if Instant::now() >= self.0 {
            return Err(io::ErrorKind::TimedOut.into());
        }
        Ok(())
    }

    fn failed(&mut self, e: io::Error) -> io::Result<()> {
        if e.kind() == io::ErrorKind::Interrupted {
            Ok(())
        } else {
            Err(e)
        }
    }

    fn closed(&mut self) -> io::Error {
        io::ErrorKind::UnexpectedEof.into()
    }
}

/// `write_all` with a deadline checked between writes.
fn write_all_by(mut w: impl Write, buf: &[u8], deadline: Instant) -> io::Result<()> {
    let mut sent = 0;
    while sent < buf.len() {
        if Instant::now() >= deadline {
            return Err(io::ErrorKind::TimedOut.into());
        }
        match w.write(&buf[sent..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => sent += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Reads the [`CrrJoin`] that follows the preamble.
pub fn agent_read_join(stream: &mut TcpStream, deadline: Instant) -> io::Result<CrrJoin> {
    let mut b = [0u8; CRR_JOIN_LEN];
    read_full(stream, &mut b, deadline)?;
    CrrJoin::decode(&b).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// The agent's part of one exchange after the join: reads the `request_bytes` request, writes
/// `response_bytes` of response, then waits for the client to close. `Ok` only when the client
/// closed as agreed after the response: a FIN, or with `rst` a reset. Bytes after the request
/// are an error (`InvalidData`), as is a reset where a FIN was agreed (the client abandoned it).
pub fn agent_answer(
    stream: &mut TcpStream,
    request_bytes: u32,
    response_bytes: u32,
    rst: bool,
    deadline: Instant,
) -> io::Result<()> {
    let mut chunk = [0u8; 4096];
    let mut left = request_bytes as usize;
    while left > 0 {
        let n = left.min(chunk.len());
        read_full(stream, &mut chunk[..n], deadline)?;
        left -= n;
    }
    let mut left = response_bytes as usize;
    while left > 0 {
        let n = left.min(ZEROS.len());
        write_all_by(&mut *stream, &ZEROS[..n], deadline)?;
        left -= n;
    }
    loop {
        if Instant::now() >= deadline {
            return Err(io::ErrorKind::TimedOut.into());
        }
        return match stream.read(&mut chunk[..1]) {
            Ok(0) => Ok(()),
            Ok(_) => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "bytes after the request",
            )),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if rst && e.kind() == io::ErrorKind::ConnectionReset => Ok(()),
            Err(e) => Err(e),
        };
    }
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, TcpListener};
    use std::sync::atomic::AtomicU64;
    use std::sync::Arc;
    use std::thread;

    use super::*;

    const STEP: Duration = Duration::from_secs(2);

    fn listener() -> (TcpListener, SocketAddr) {
        let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let a = l.local_addr().unwrap();
        (l, a)
    }

    fn config(agent: SocketAddr, until: Duration) -> CrrClientConfig {
        CrrClientConfig {
            agent,
            token: Token(0x5eed),
            worker: 3,
            request_bytes: 100,
            response_bytes: 2_000,
            rst: false,
            until_ns: u64::try_from(until.as_nanos()).unwrap(),
            timeout: Duration::from_secs(2),
            answer: false,
            bind: crate::socket::Bind::default(),
            socket: None,
        }
    }

    /// A minimal agent: serves each connection with the functions above until `stop`, counting
    /// what `agent_answer` accepted and what it refused.
    fn responder(
        l: TcpListener,
        stop: Arc<AtomicBool>,
    ) -> (thread::JoinHandle<()>, Arc<AtomicU64>, Arc<AtomicU64>) {
        let (ok, bad) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let (ok2, bad2) = (Arc::clone(&ok), Arc::clone(&bad));
        l.set_nonblocking(true).unwrap();
        let h = thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let Ok((mut s, _)) = l.accept() else {
                    thread::sleep(Duration::from_millis(1));
                    continue;
                };
                s.set_nonblocking(false).unwrap();
                let p = peek_preamble(&s, STEP).expect("the client's preamble");
                assert_eq!(p.channel, Channel::Crr);
                agent_prepare(&s, STEP).unwrap();
                let deadline = Instant::now() + STEP;
                let mut pre = [0u8; PREAMBLE_LEN];
                read_full(&mut s, &mut pre, deadline).unwrap();
                let join = agent_read_join(&mut s, deadline).unwrap();
                assert_eq!((join.token, join.worker), (Token(0x5eed), 3));
                match agent_answer(&mut s, 100, join.response_size, join.rst, deadline) {
                    Ok(()) => ok2.fetch_add(1, Ordering::Relaxed),
                    Err(_) => bad2.fetch_add(1, Ordering::Relaxed),
                };
            }
        });
        (h, ok, bad)
    }

    fn run_against_responder(rst: bool) {
        let (l, addr) = listener();
        let stop_agent = Arc::new(AtomicBool::new(false));
        let (h, ok, bad) = responder(l, Arc::clone(&stop_agent));
        let cfg = CrrClientConfig {
            rst,
            ..config(addr, Duration::from_millis(300))
        };
        let stop = AtomicBool::new(false);
        let stats = client_worker(&cfg, &Clock::start(), &stop);
        // The responder counts an exchange when it sees the close that follows the response.
        let deadline = Instant::now() + STEP;
        while ok.load(Ordering::Relaxed) < stats.transactions() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(1));
        }
        stop_agent.store(true, Ordering::Relaxed);
        h.join().unwrap();
        assert!(stats.transactions() > 0);
        assert_eq!(stats.errors().total(), 0, "{:?}", stats.errors());
        assert_eq!(stats.connects(), stats.transactions());
        assert_eq!(
            ok.load(Ordering::Relaxed),
            stats.transactions(),
            "rst {rst}"
        );
        assert_eq!(bad.load(Ordering::Relaxed), 0);
        assert_eq!(stats.connect_times().samples(), stats.transactions());
        assert!(stats.per_second().is_some());
        assert!(!stop.load(Ordering::Relaxed));
    }

    #[test]
    fn every_transaction_the_client_completes_the_agent_counts_once() {
        run_against_responder(false);
    }

    #[test]
    fn with_rst_the_reset_after_the_response_counts_as_the_close() {
        run_against_responder(true);
    }

    #[test]
    fn with_intervals_every_count_of_two_workers_is_in_one_interval() {
        let (l, addr) = listener();
        let stop_agent = Arc::new(AtomicBool::new(false));
        let (h, _, _) = responder(l, Arc::clone(&stop_agent));
        let until = Duration::from_millis(300);
        let cfg = config(addr, until);
        let interval_ns = 100_000_000;
        let shared = SharedCrrIntervals::new(CrrIntervals::new(
            interval_ns,
            u64::try_from(until.as_nanos()).unwrap(),
        ));
        let (clock, stop) = (Clock::start(), AtomicBool::new(false));
        let mut stats = CrrStats::new();
        thread::scope(|s| {
            let workers: Vec<_> = (0..2)
                .map(|_| {
                    s.spawn(|| client_worker_with_intervals(&cfg, &clock, &stop, Some(&shared)))
                })
                .collect();
            for w in workers {
                stats.merge(&w.join().unwrap());
            }
        });
        let end = clock.now_ns();
        stop_agent.store(true, Ordering::Relaxed);
        h.join().unwrap();
        let iv = shared.into_inner().summaries(end);
        assert!(iv.len() >= 3, "{iv:?}");
        assert_eq!(iv.last().map(|i| i.end_ns), Some(end));
        for (a, b) in iv.iter().zip(&iv[1..]) {
            assert_eq!(a.end_ns, b.start_ns);
        }
        assert!(stats.transactions() > 0);
        let sum =
            |f: fn(&sonde_engine::crr::CrrIntervalSummary) -> u64| iv.iter().map(f).sum::<u64>();
        assert_eq!(sum(|i| i.transactions), stats.transactions());
        assert_eq!(sum(|i| i.connects), stats.connects());
        assert_eq!(sum(|i| i.errors.total()), stats.errors().total());
    }

    #[test]
    fn a_closed_port_is_refused_and_there_is_no_rate() {
        let (l, addr) = listener();
        drop(l);
        let cfg = config(addr, Duration::from_millis(100));
        let stats = client_worker(&cfg, &Clock::start(), &AtomicBool::new(false));
        assert!(stats.errors().refused > 0, "{:?}", stats.errors());
        assert_eq!(stats.errors().total(), stats.errors().refused);
        assert_eq!((stats.connects(), stats.transactions()), (0, 0));
        assert_eq!(stats.per_second(), None);
        // The back-off keeps a dead agent from costing a core: at most one try per 10 ms.
        assert!(stats.errors().refused <= 11, "{:?}", stats.errors());
    }

    #[test]
    fn an_agent_that_closes_without_answering_is_counted_as_closed() {
        let (l, addr) = listener();
        let h = thread::spawn(move || {
            for _ in 0..3 {
                let (mut s, _) = l.accept().unwrap();
                let mut b = [0u8; PREAMBLE_LEN + CRR_JOIN_LEN + 100];
                s.set_read_timeout(Some(STEP)).unwrap();
                s.read_exact(&mut b).unwrap();
                // Everything read, then closed with a FIN and no response.
            }
        });
        let cfg = config(addr, Duration::from_secs(5));
        let stop = AtomicBool::new(false);
        let clock = Clock::start();
        let mut rec = Recorder::new(None);
        let request = request_bytes(&cfg);
        let mut response = vec![0u8; 2_000];
        let sock = SockAddr::from(addr);
        let domain = Domain::for_address(addr);
        for _ in 0..3 {
            let r = attempt(
                &cfg,
                &sock,
                domain,
                &request,
                &mut response,
                &clock,
                &mut rec,
            );
            assert_eq!(r, Err(CrrError::Closed));
        }
        h.join().unwrap();
        let stats = rec.finish();
        assert_eq!((stats.connects(), stats.transactions()), (3, 0));
        assert!(!stop.load(Ordering::Relaxed));
    }

    /// Behind a balancer: every other connection reaches an agent without the session, which
    /// answers `SNDK...` and closes. Neither a short response (read in part) nor a long one
    /// (cut short) counts it as a transaction or a fault.
    #[test]
    fn a_connection_another_agent_answers_is_neither_a_transaction_nor_a_fault() {
        for response_bytes in [1, 2_000] {
            let (l, addr) = listener();
            let h = thread::spawn(move || {
                for i in 0..6 {
                    let (mut s, _) = l.accept().unwrap();
                    let deadline = Instant::now() + STEP;
                    let mut pre = [0u8; PREAMBLE_LEN];
                    read_full(&mut s, &mut pre, deadline).unwrap();
                    let join = agent_read_join(&mut s, deadline).unwrap();
                    assert!(join.answer);
                    if i % 2 == 0 {
                        let a = sonde_wire::JoinAnswer {
                            outcome: sonde_wire::JoinOutcome::NoSuchSession,
                            agent: sonde_wire::AgentId(9),
                        };
                        let _ = s.write_all(&a.encode());
                    } else {
                        let _ = agent_answer(&mut s, 100, join.response_size, false, deadline);
                    }
                }
            });
            let cfg = CrrClientConfig {
                response_bytes,
                answer: true,
                ..config(addr, Duration::from_secs(10))
            };
            let stop = AtomicBool::new(false);
            let clock = Clock::start();
            let mut rec = Recorder::new(None);
            let sa = SockAddr::from(addr);
            let request = request_bytes(&cfg);
            let mut response = vec![0u8; response_bytes as usize];
            let mut outcomes = Vec::new();
            for _ in 0..6 {
                let start = clock.now_ns();
                let r = attempt(
                    &cfg,
                    &sa,
                    Domain::IPV4,
                    &request,
                    &mut response,
                    &clock,
                    &mut rec,
                );
                if let Err(kind) = r {
                    rec.failed(start, clock.now_ns(), kind);
                }
                outcomes.push(r);
            }
            h.join().unwrap();
            let stats = rec.finish();
            assert_eq!(stats.transactions(), 3, "{response_bytes}: {outcomes:?}");
            let e = *stats.errors();
            assert_eq!(
                (e.other_agent, e.total()),
                (3, 3),
                "{response_bytes}: {e:?}"
            );
            assert!(!stop.load(Ordering::Relaxed));
        }
    }

    #[test]
    fn a_silent_agent_times_out() {
        let (l, addr) = listener();
        let h = thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            thread::sleep(Duration::from_millis(400));
            drop(s);
        });
        let cfg = CrrClientConfig {
            timeout: Duration::from_millis(100),
            bind: crate::socket::Bind::default(),
            ..config(addr, Duration::from_millis(50))
        };
        let stats = client_worker(&cfg, &Clock::start(), &AtomicBool::new(false));
        h.join().unwrap();
        assert_eq!(stats.errors().timeout, 1, "{:?}", stats.errors());
        assert_eq!((stats.connects(), stats.transactions()), (1, 0));
    }

    #[test]
    fn an_agent_that_trickles_its_response_times_out_as_a_whole() {
        let (l, addr) = listener();
        let h = thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            // One byte per read timeout's third: every read succeeds, the whole never does.
            for _ in 0..20 {
                if s.write_all(b"x").is_err() {
                    break;
                }
                thread::sleep(Duration::from_millis(100));
            }
        });
        let cfg = CrrClientConfig {
            response_bytes: 50,
            timeout: Duration::from_millis(300),
            bind: crate::socket::Bind::default(),
            ..config(addr, Duration::from_millis(50))
        };
        let stats = client_worker(&cfg, &Clock::start(), &AtomicBool::new(false));
        h.join().unwrap();
        assert_eq!(stats.errors().timeout, 1, "{:?}", stats.errors());
        assert_eq!(stats.transactions(), 0);
    }

    #[test]
    fn the_agent_refuses_extra_bytes_and_an_unagreed_reset() {
        for (rst_agreed, client_resets, extra, ok) in [
            (false, false, false, true),
            (false, false, true, false),
            (false, true, false, false),
            (true, true, false, true),
        ] {
            let (l, addr) = listener();
            let client = thread::spawn(move || {
                let mut c = TcpStream::connect(addr).unwrap();
                c.write_all(&[1u8; 10]).unwrap();
                let mut r = [0u8; 5];
                c.read_exact(&mut r).unwrap();
                if extra {
                    c.write_all(b"more").unwrap();
                }
                if client_resets {
                    Socket::from(c).set_linger(Some(Duration::ZERO)).unwrap();
                }
            });
            let (mut s, _) = l.accept().unwrap();
            agent_prepare(&s, STEP).unwrap();
            let r = agent_answer(&mut s, 10, 5, rst_agreed, Instant::now() + STEP);
            client.join().unwrap();
            assert_eq!(
                r.is_ok(),
                ok,
                "agreed rst {rst_agreed}, reset {client_resets}, extra {extra}: {r:?}"
            );
        }
    }

    #[test]
    fn a_slow_request_meets_the_deadline() {
        let (l, addr) = listener();
        let client = thread::spawn(move || {
            let mut c = TcpStream::connect(addr).unwrap();
            c.write_all(&[1u8; 3]).unwrap();
            thread::sleep(Duration::from_millis(500));
        });
        let (mut s, _) = l.accept().unwrap();
        agent_prepare(&s, Duration::from_millis(100)).unwrap();
        let r = agent_answer(&mut s, 10, 5, false, Instant::now() + STEP);
        let e = r.unwrap_err();
        assert!(
            matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ),
            "{e}"
        );
        client.join().unwrap();
    }

    #[test]
    fn errors_are_classified_by_kind() {
        use io::ErrorKind as K;
        for (kind, want) in [
            (K::ConnectionRefused, CrrError::Refused),
            (K::TimedOut, CrrError::Timeout),
            (K::WouldBlock, CrrError::Timeout),
            (K::ConnectionReset, CrrError::Reset),
            (K::BrokenPipe, CrrError::Reset),
            (K::AddrNotAvailable, CrrError::AddrNotAvailable),
            (K::UnexpectedEof, CrrError::Closed),
            (K::PermissionDenied, CrrError::Other),
        ] {
            assert_eq!(classify(&io::Error::from(kind)), want, "{kind:?}");
        }
    }
}
