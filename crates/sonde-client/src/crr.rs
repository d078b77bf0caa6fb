//! `sonde crr`: connection rate. A control session (`TestKind::Crr`, `streams` = workers,
//! `msg_size` = request size) admits the test and returns a token; then each worker makes one
//! transaction after another on a new TCP connection (connect, request, response, close; see
//! `sonde_net::crr`) until the test's time is up; then the client says `Finish` and the agent
//! reports how many exchanges it completed.
//!
//! The headline rate is the agent's: transactions it completed over its own window. The
//! client's count and rate are reported next to it, with the connect and transaction times
//! (HDR histograms per worker, merged) and the failures by kind. A client that runs out of
//! ephemeral ports (`EADDRNOTAVAIL`, every port in `TIME_WAIT`) stops there and says so rather
//! than counting a rate over a time when no connection could be made.
//!
//! With intervals (`-i`), the same counts per interval, at the client: each worker counts into
//! its own current interval and adds it to the run's once its clock has passed it
//! (`sonde_net::crr::SharedCrrIntervals`); the intervals end where the workers did.

use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

use sonde_engine::crr::{rate, CrrErrorCounts, CrrIntervals, CrrStats};
use sonde_net::control::{forward_frames, read_frame, write_frame, ControlError};
use sonde_net::cpu::ThreadsMeter;
use sonde_net::crr::{
    client_worker_with_intervals, CrrClientConfig, CrrSocket, SharedCrrIntervals,
};
use sonde_net::hostinfo::InterfaceSnapshot;
use sonde_net::socket::DataOptions;
use sonde_net::Clock;
use sonde_report::{
    CpuCost, CpuCosts, CpuScope, CrrAgentShare, CrrClose, CrrErrors, CrrInterval, CrrResult, Hosts,
    Protocol, Warning,
};
use sonde_wire::{
    AgentReport, AgentTag, ControlMsg, CpuReport, CrrReport, Direction, HostInfo, Refusal,
    SessionId, TestKind, TestSpec, Token,
};

use crate::{ClientError, Target};

/// The largest request and response (the agent's limit, as for TCP latency messages).
pub const MAX_CRR_MESSAGE: u32 = 65_536;

/// The most intervals `-t` may hold (an hour of 1 s intervals): the run keeps one 18 KiB
/// histogram of connect times per interval, allocated before the workers start.
pub(crate) const MAX_CRR_INTERVALS: u64 = 3_600;

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the agent has to report after `Finish` (it first lets its last exchanges end).
const REPORT_TIMEOUT: Duration = Duration::from_secs(15);

/// `sonde crr` options.
#[derive(Debug, Clone)]
pub struct CrrOptions {
    /// Connections at a time, each worker one after another (1 to 65,536).
    pub workers: u32,
    /// Request size, bytes (1 to [`MAX_CRR_MESSAGE`]).
    pub request_bytes: u32,
    /// Response size, bytes (1 to [`MAX_CRR_MESSAGE`]).
    pub response_bytes: u32,
    /// How long workers start new transactions.
    pub duration: Duration,
    /// Close each connection with a reset instead of a FIN: no `TIME_WAIT` on the client.
    pub rst: bool,
    /// Limit of a connect, and of the wait for a whole response.
    pub timeout: Duration,
    /// Interval length; `None` (or zero) for none.
    pub interval: Option<Duration>,
    /// `-w`, `-C`, `-M`, `-S`, `--dscp`, `--ecn`: set on every connection at both ends.
    pub socket: sonde_wire::SocketOptions,
}

impl Default for CrrOptions {
    /// One worker, 1-byte request and response (netperf's `TCP_CRR` defaults), 10 s, FIN, 5 s,
    /// no intervals.
    fn default() -> Self {
        Self {
            workers: 1,
            request_bytes: 1,
            response_bytes: 1,
            duration: Duration::from_secs(10),
            rst: false,
            timeout: Duration::from_secs(5),
            interval: None,
            socket: sonde_wire::SocketOptions::default(),
        }
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

crate::test::impl_test!(
    /// A connection-rate test against a sonde agent. Interrupted (Ctrl-C), the workers stop
    /// after their current transaction, the agent reports, and the result covers what was
    /// counted until then, marked `interrupted`.
    CrrOptions, Target => CrrResult, crr
);

fn crr(
    target: &Target,
    opt: &CrrOptions,
    interrupt: &AtomicBool,
) -> Result<CrrResult, ClientError> {
    let usage = |m: String| Err(ClientError::Usage(m));
    if !(1..=65_536).contains(&opt.workers) {
        return usage("-P must be between 1 and 65536 workers".into());
    }
    for (what, n) in [
        ("-m (request size)", opt.request_bytes),
        ("--response-size", opt.response_bytes),
    ] {
        if !(1..=MAX_CRR_MESSAGE).contains(&n) {
            return usage(format!(
                "{what} must be between 1 and {MAX_CRR_MESSAGE} bytes, not {n}"
            ));
        }
    }
    if opt.duration.is_zero() || opt.timeout.is_zero() {
        return usage("-t must be above zero".into());
    }
    if let Some(iv) = opt.interval.filter(|d| !d.is_zero()) {
        if nanos(opt.duration) / nanos(iv).max(1) > MAX_CRR_INTERVALS {
            return usage(format!(
                "-i {} s cuts -t {} s into more than {MAX_CRR_INTERVALS} intervals: make -i longer",
                iv.as_secs_f64(),
                opt.duration.as_secs_f64()
            ));
        }
    }
    let spec = TestSpec {
        kind: TestKind::Crr,
        protocol: sonde_wire::Protocol::Tcp,
        direction: Direction::Forward,
        streams: opt.workers,
        msg_size: opt.request_bytes,
        bitrate_per_stream: 0,
        duration_ms: u64::try_from(opt.duration.as_millis())
            .unwrap_or(u64::MAX)
            .max(1),
        interval_ms: 0,
        read_size: 0,
        socket: crate::check_socket(&opt.socket, sonde_wire::Protocol::Tcp, TestKind::Crr)?,
        omit_ms: 0,
        skip_rx_copy: false,
        bytes: 0,
        blocks: 0,
        request_response: None,
    };
    if !spec.socket.is_default() {
        // What this host's kernel refuses is a usage error before the agent is asked.
        DataOptions::from(&spec.socket)
            .try_on(
                crate::session::unspecified_like(target.addr),
                target.addr.ip(),
                true,
            )
            .map_err(|e| crate::session::socket_refused(&e))?;
    }
    let started_unix_ms = crate::now_unix_ms();
    let first = handshake(target, &spec, None)?;
    let sessions = find_agents(target, &spec, first)?;
    let run = run(target, opt, &spec.socket, sessions, interrupt)?;
    let mut r = result(target, opt, started_unix_ms, &run);
    if run.interrupted {
        crate::mark_interrupted(&mut r.meta);
    }
    Ok(r)
}

/// An admitted crr session whose agent is ready.
struct Admitted {
    ctrl: TcpStream,
    session: SessionId,
    token: Token,
    agent_host: Option<HostInfo>,
    /// The agent, as it named itself; `None` from an older agent.
    agent: Option<AgentTag>,
}

fn expect_reply(
    ctrl: &mut TcpStream,
    body: &mut Vec<u8>,
    what: &str,
) -> Result<ControlMsg, ClientError> {
    match read_frame(ctrl, body, Instant::now() + HANDSHAKE_TIMEOUT) {
        Ok(ControlMsg::Refused { reason, message }) => {
            Err(ClientError::Refused { reason, message })
        }
        Ok(ControlMsg::Error { message }) => Err(ClientError::Remote(message)),
        Ok(m) => Ok(m),
        Err(ControlError::Wire(e)) => Err(ClientError::NotAnAgent(format!(
            "the peer is not a sonde agent, or a different version ({e})"
        ))),
        Err(ControlError::Closed) => Err(ClientError::NotAnAgent(format!(
            "the peer closed the connection while {what}: not a sonde agent, or one that is shutting down (or too old for `sonde crr`)"
        ))),
        Err(e) => Err(ClientError::Control(e)),
    }
}

fn unexpected(wanted: &str) -> ClientError {
    ClientError::Protocol(format!(
        "the agent sent another message where {wanted} was due"
    ))
}

/// Hello, Start (under `token` when given), Accepted, Ready.
fn handshake(
    target: &Target,
    spec: &TestSpec,
    token: Option<Token>,
) -> Result<Admitted, ClientError> {
    let mut welcomed = crate::session::hello(target)?;
    let (token, agent_host, agent) =
        welcomed.start_as(spec, sonde_wire::Tuning::default(), token)?;
    let crate::session::Welcomed {
        mut ctrl,
        mut body,
        session,
        ..
    } = welcomed;
    match expect_reply(&mut ctrl, &mut body, "waiting for the agent")? {
        ControlMsg::Ready => {}
        _ => return Err(unexpected("ready")),
    }
    Ok(Admitted {
        ctrl,
        session,
        token,
        agent_host,
        agent,
    })
}

/// How many new control connections in a row must find no new agent behind a balancer before
/// the search ends, and how many it makes at most.
const AGENT_SEARCH: (u32, u32) = (8, 32);

/// Every agent behind the address, each running a session of the test under the first one's
/// token: behind a load balancer each crr connection is placed on its own, and finds its
/// session on whichever agent it reaches. Searched for only when the first agent saw the test
/// arrive at another address than the one dialled (a balancer or a destination NAT): new
/// control connections ask for the same token, which an agent that has it refuses
/// (`token_taken`), until [`AGENT_SEARCH`] say nothing new.
fn find_agents(
    target: &Target,
    spec: &TestSpec,
    first: Admitted,
) -> Result<Vec<Admitted>, ClientError> {
    let token = first.token;
    let behind = first
        .agent
        .as_ref()
        .is_some_and(|a| a.addr.parse::<std::net::SocketAddr>().ok() != Some(target.addr));
    let mut sessions = vec![first];
    if !behind {
        return Ok(sessions);
    }
    let (mut misses, mut tries) = (0, 0);
    while misses < AGENT_SEARCH.0 && tries < AGENT_SEARCH.1 {
        tries += 1;
        match handshake(target, spec, Some(token)) {
            // An agent that ignored the token (older than it) cannot serve this test's
            // connections: its session ends with its connection.
            Ok(a) if a.token != token => break,
            Ok(a) => {
                sessions.push(a);
                misses = 0;
            }
            Err(ClientError::Refused {
                reason: Refusal::TokenTaken,
                ..
            }) => misses += 1,
            Err(e) => return Err(e),
        }
    }
    Ok(sessions)
}

/// What a crr run produced.
struct Run {
    session: SessionId,
    agent_host: Option<HostInfo>,
    stats: CrrStats,
    /// From the workers' start to the last one's end.
    elapsed_ns: u64,
    /// With `-i`: every worker's counts, per interval, and when the last worker ended.
    intervals: Option<(CrrIntervals, u64)>,
    /// Each agent's report, the first agent's first; more than one behind a balancer.
    reports: Vec<(Option<AgentTag>, AgentReport)>,
    cpu: Option<CpuReport>,
    /// Stopped early by the caller's interrupt flag.
    interrupted: bool,
    /// The socket options as asked and as this host's kernel granted them on the first
    /// connection; `None` when none were asked.
    socket: Option<(sonde_wire::SocketOptions, sonde_wire::AppliedSocketOptions)>,
    /// What this host's interface toward the agent counted over the run.
    interface: Option<sonde_wire::InterfaceDelta>,
}

/// A message, or the end, of session `.0`'s control connection.
enum Event {
    Control(usize, Result<ControlMsg, ControlError>),
}

fn run(
    target: &Target,
    opt: &CrrOptions,
    socket: &sonde_wire::SocketOptions,
    sessions: Vec<Admitted>,
    interrupt: &AtomicBool,
) -> Result<Run, ClientError> {
    let first = sessions.first().ok_or_else(|| unexpected("a session"))?;
    let (session, token, agent_host) = (first.session, first.token, first.agent_host.clone());
    // An agent that named itself says so when a connection reaches it without the session.
    let answer = sessions.iter().all(|a| a.agent.is_some());
    let mut readers = Vec::with_capacity(sessions.len());
    let mut writers = Vec::with_capacity(sessions.len());
    let mut agents = Vec::with_capacity(sessions.len());
    for a in sessions {
        readers.push(
            a.ctrl
                .try_clone()
                .map_err(|e| ClientError::Control(e.into()))?,
        );
        writers.push(a.ctrl);
        agents.push(a.agent);
    }
    let hard_deadline = Instant::now()
        + opt.duration
        + opt.timeout.saturating_mul(2)
        + REPORT_TIMEOUT
        + Duration::from_secs(60);
    let until_ns = nanos(opt.duration);
    // Made (and allocated) before the clock starts, so the workers start on the grid's origin.
    let shared = opt
        .interval
        .filter(|d| !d.is_zero())
        .map(|iv| SharedCrrIntervals::new(CrrIntervals::new(nanos(iv), until_ns)));
    // Every worker's connections take the options; the first to connect reads back what the
    // kernel granted.
    let crr_socket = (!socket.is_default()).then(|| CrrSocket {
        options: DataOptions::from(socket),
        ..CrrSocket::default()
    });
    let interface = InterfaceSnapshot::toward(target.addr.ip());
    let clock = Clock::start();
    let stop = AtomicBool::new(false);
    let meter = ThreadsMeter::start();
    let (tx, rx) = mpsc::channel::<Event>();
    let reader_stop = AtomicBool::new(false);
    let outcome = thread::scope(|scope| {
        let reader_stop = &reader_stop;
        for (i, reader) in readers.into_iter().enumerate() {
            let tx = tx.clone();
            scope.spawn(move || {
                forward_frames(reader, hard_deadline, reader_stop, |m| {
                    tx.send(Event::Control(i, m)).is_ok()
                });
            });
        }
        drop(tx);
        let workers: Vec<_> = (0..opt.workers)
            .map(|w| {
                let cfg = CrrClientConfig {
                    agent: target.addr,
                    token,
                    worker: u16::try_from(w).unwrap_or(u16::MAX),
                    request_bytes: opt.request_bytes,
                    response_bytes: opt.response_bytes,
                    rst: opt.rst,
                    until_ns,
                    timeout: opt.timeout,
                    answer,
                    bind: target.source.bind.clone(),
                    socket: crr_socket.clone(),
                };
                let (clock, stop, meter, shared) = (&clock, &stop, &meter, shared.as_ref());
                scope.spawn(move || {
                    let _tracked = meter.track();
                    let stats = client_worker_with_intervals(&cfg, clock, stop, shared);
                    (stats, clock.now_ns())
                })
            })
            .collect();
        // While the workers run, an agent may end the test (it is shutting down).
        let mut failure = None;
        while !workers.iter().all(thread::ScopedJoinHandle::is_finished) {
            if interrupt.load(std::sync::atomic::Ordering::Relaxed) {
                // The workers stop after their current transaction; the agents then report.
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            match rx.recv_timeout(Duration::from_millis(50)) {
                Ok(Event::Control(_, Ok(ControlMsg::Error { message }))) => {
                    failure = Some(ClientError::Remote(message));
                }
                Ok(Event::Control(_, Ok(_))) => {
                    failure = Some(unexpected("nothing (the test was running)"));
                }
                Ok(Event::Control(_, Err(e))) => {
                    failure = Some(match e {
                        ControlError::Closed => ClientError::Remote(
                            "the agent closed the control connection mid-test".into(),
                        ),
                        e => ClientError::Control(e),
                    });
                }
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {}
            }
            if failure.is_some() {
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
                break;
            }
        }
        let mut stats = CrrStats::new();
        // When the last worker ended: where the intervals end (the loop above notices it up
        // to 50 ms later).
        let mut workers_end_ns = 0;
        for w in workers {
            match w.join() {
                Ok((s, end)) => {
                    stats.merge(&s);
                    workers_end_ns = workers_end_ns.max(end);
                }
                Err(_) => {
                    failure.get_or_insert(ClientError::Protocol("a crr worker panicked".into()));
                }
            }
        }
        let elapsed_ns = clock.now_ns();
        let result = match failure {
            Some(e) => Err(e),
            None => finish(&mut writers, &rx).map(|reports| {
                let reports = agents.into_iter().zip(reports).collect();
                (stats, elapsed_ns, workers_end_ns, reports)
            }),
        };
        // End the control readers (the flag: a shut socket does not wake it on Windows).
        reader_stop.store(true, Ordering::Relaxed);
        for w in &writers {
            let _ = w.shutdown(Shutdown::Both);
        }
        result
    });
    let (stats, elapsed_ns, workers_end_ns, reports) = outcome?;
    // Each transaction makes a dozen calls (socket, options, connect, write, read, close), some
    // inside socket2 and std: not counted one by one.
    let cpu = meter.cost().map(|cost| {
        let per = u64::from(opt.request_bytes) + u64::from(opt.response_bytes);
        cost.report(
            None,
            Some(stats.transactions()),
            Some(stats.transactions().saturating_mul(per)),
        )
    });
    Ok(Run {
        session,
        agent_host,
        stats,
        elapsed_ns,
        intervals: shared.map(|s| (s.into_inner(), workers_end_ns)),
        reports,
        cpu,
        interrupted: interrupt.load(std::sync::atomic::Ordering::Relaxed),
        interface: interface.as_ref().and_then(InterfaceSnapshot::delta),
        socket: crr_socket.map(|s| {
            let granted = s
                .first
                .get()
                .map(|a| a.to_wire(socket, true))
                .unwrap_or_default();
            (socket.clone(), granted)
        }),
    })
}

/// Says `Finish` to every agent and waits for each one's report, in the sessions' order.
fn finish(
    writers: &mut [TcpStream],
    rx: &mpsc::Receiver<Event>,
) -> Result<Vec<AgentReport>, ClientError> {
    for w in writers.iter_mut() {
        write_frame(w, &ControlMsg::Finish)?;
    }
    let mut reports: Vec<Option<AgentReport>> = vec![None; writers.len()];
    let deadline = Instant::now() + REPORT_TIMEOUT;
    // Nothing else is due: each agent sends its report, or says why not.
    while reports.iter().any(Option::is_none) {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(Event::Control(i, Ok(ControlMsg::Report(r)))) => {
                if let Some(slot) = reports.get_mut(i) {
                    *slot = Some(r);
                }
            }
            Ok(Event::Control(_, Ok(ControlMsg::Error { message }))) => {
                return Err(ClientError::Remote(message))
            }
            Ok(Event::Control(_, Ok(_))) => return Err(unexpected("the report")),
            Ok(Event::Control(_, Err(ControlError::Closed))) => {
                return Err(ClientError::Remote(
                    "the agent closed the control connection before its report".into(),
                ))
            }
            Ok(Event::Control(_, Err(e))) => return Err(ClientError::Control(e)),
            Err(_) => {
                return Err(ClientError::Remote(format!(
                    "the agent sent no report within {} s",
                    REPORT_TIMEOUT.as_secs()
                )))
            }
        }
    }
    Ok(reports.into_iter().flatten().collect())
}

/// The agents' counts together: transactions and failures summed, the longest window, and the
/// rate as the sum of each agent's rate over its own window. `None` when an agent did not
/// count (an older one).
fn agents_together(
    reports: &[(Option<AgentTag>, AgentReport)],
) -> Option<(CrrReport, Option<f64>)> {
    let mut sum = CrrReport::default();
    let mut rate_sum: Option<f64> = None;
    for (_, r) in reports {
        let c = r.crr.as_ref()?;
        sum.transactions += c.transactions;
        sum.failed += c.failed;
        sum.active_ns = sum.active_ns.max(c.active_ns);
        if let Some(r) = rate(c.transactions, c.active_ns) {
            *rate_sum.get_or_insert(0.0) += r;
        }
    }
    Some((sum, rate_sum))
}

/// Each agent's share of a test spread over several; empty for one agent.
fn shares(reports: &[(Option<AgentTag>, AgentReport)]) -> Vec<CrrAgentShare> {
    if reports.len() < 2 {
        return Vec::new();
    }
    reports
        .iter()
        .map(|(tag, r)| {
            let c = r.crr.clone().unwrap_or_default();
            CrrAgentShare {
                id: tag.as_ref().map(|t| t.id.to_string()).unwrap_or_default(),
                addr: tag.as_ref().map(|t| t.addr.clone()).unwrap_or_default(),
                transactions: c.transactions,
                connections_per_second: rate(c.transactions, c.active_ns),
                failed: c.failed,
                cpu: r
                    .cpu
                    .as_ref()
                    .map(|c| CpuCost::from_report(CpuScope::TestThreads, c)),
            }
        })
        .collect()
}

fn result(target: &Target, opt: &CrrOptions, started_unix_ms: u64, run: &Run) -> CrrResult {
    let stats = &run.stats;
    let together = agents_together(&run.reports);
    let agent: Option<&CrrReport> = together.as_ref().map(|(sum, _)| sum);
    let first = run.reports.first().map(|(_, r)| r);
    let overlapping = first.map_or(0, |r| r.overlapping_sessions);
    // The overlap warning comes with the meta (results::meta_for).
    let mut warnings: Vec<Warning> = Vec::new();
    let e = *stats.errors();
    if e.addr_not_available > 0 {
        warnings.push(Warning::PortsExhausted {
            connections: stats.connects(),
            stopped_after_s: run.elapsed_ns as f64 / 1e9,
            asked_s: opt.duration.as_secs_f64(),
        });
    }
    match agent {
        None => warnings.push(Warning::AgentCountMissing),
        Some(a) if a.transactions != stats.transactions() => {
            warnings.push(Warning::CountsDiffer {
                agent: a.transactions,
                client: stats.transactions(),
            });
        }
        Some(_) => {}
    }
    if stats.transactions() == 0 {
        warnings.push(Warning::NoTransaction {
            failed_attempts: e.total(),
        });
    }
    if run.reports.len() > 1 {
        warnings.push(Warning::SpreadOverAgents {
            agents: run.reports.len(),
        });
    }
    if e.other_agent > 0 {
        warnings.push(Warning::UnfoundAgent {
            connections: e.other_agent,
        });
    }
    let cpu = CpuCosts {
        client: run
            .cpu
            .as_ref()
            .map(|c| CpuCost::from_report(CpuScope::TestThreads, c)),
        // The agent counts each exchange's CPU to its session (not its accept calls); several
        // agents' costs are each one's, in `agents`.
        server: first
            .filter(|_| run.reports.len() == 1)
            .and_then(|r| r.cpu.as_ref())
            .map(|c| CpuCost::from_report(CpuScope::TestThreads, c)),
    };
    let agent_ns = agent.filter(|a| a.transactions > 0).map(|a| a.active_ns);
    let mut meta = crate::results::meta_for(
        target,
        sonde_report::Peer::Sonde,
        run.session,
        started_unix_ms,
        overlapping,
    );
    meta.hosts = Hosts {
        client: Some(sonde_net::hostinfo::collect_for_peer(
            env!("CARGO_PKG_VERSION"),
            target.addr.ip(),
        )),
        server: run.agent_host.clone(),
    };
    meta.cpu = cpu;
    meta.agent = served_by(&run.reports);
    meta.add_all(&warnings);
    // The first agent's interface, as its socket options: behind a balancer the others' are
    // each one's.
    crate::results::add_interfaces(
        &mut meta,
        run.interface.as_ref(),
        first.and_then(|r| r.interface.as_deref()),
    );
    // As asked and as each end's kernel granted on its first connection (the first agent's,
    // behind a balancer).
    let socket = run.socket.clone().map(|(asked, client)| {
        let ends = sonde_report::EndsSocket {
            asked,
            client,
            server: first.and_then(|r| r.socket.as_deref().cloned()),
        };
        meta.add_all(&ends.warnings(true, true));
        ends
    });
    CrrResult {
        socket,
        meta,
        protocol: Protocol::Tcp,
        workers: opt.workers,
        request_bytes: opt.request_bytes,
        response_bytes: opt.response_bytes,
        close: if opt.rst {
            CrrClose::Rst
        } else {
            CrrClose::Fin
        },
        duration_ns: nanos(opt.duration),
        connections_per_second: together.as_ref().and_then(|(_, r)| *r),
        agent_transactions: agent.map(|a| a.transactions),
        agent_duration_ns: agent_ns,
        agent_failed: agent.map(|a| a.failed),
        transactions: stats.transactions(),
        client_connections_per_second: stats.per_second(),
        client_duration_ns: stats.active_ns(),
        connects: stats.connects(),
        connect_ns: crate::results::rtt_ns_if_any(stats.connect_times()),
        transaction_ns: crate::results::rtt_ns_if_any(stats.transaction_times()),
        errors: errors(&e),
        intervals: run
            .intervals
            .as_ref()
            .map_or_else(Vec::new, |(all, end_ns)| {
                all.summaries(*end_ns)
                    .into_iter()
                    .map(|iv| CrrInterval {
                        start_ns: iv.start_ns,
                        end_ns: iv.end_ns,
                        transactions: iv.transactions,
                        transactions_per_second: iv.per_second,
                        connects: iv.connects,
                        errors: errors(&iv.errors),
                        connect_p50_ns: iv.connect_p50_ns,
                        connect_p99_ns: iv.connect_p99_ns,
                    })
                    .collect()
            }),
        agents: shares(&run.reports),
    }
}

/// The first agent, with the others that served the test (behind a balancer).
fn served_by(reports: &[(Option<AgentTag>, AgentReport)]) -> Option<sonde_report::ServedBy> {
    let (Some(first), _) = reports.first()? else {
        return None;
    };
    Some(sonde_report::ServedBy {
        id: first.id.to_string(),
        addr: first.addr.clone(),
        other_agents: reports
            .iter()
            .skip(1)
            .filter_map(|(t, _)| t.as_ref().map(|t| t.id.to_string()))
            .collect(),
        reopened_channels: 0,
    })
}

fn errors(e: &CrrErrorCounts) -> CrrErrors {
    CrrErrors {
        refused: e.refused,
        timeout: e.timeout,
        reset: e.reset,
        addr_not_available: e.addr_not_available,
        closed: e.closed,
        other: e.other,
        other_agent: e.other_agent,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target() -> Target {
        Target {
            addr: "127.0.0.1:9".parse().unwrap(),
            label: "127.0.0.1:9".into(),
            secret: None,
            source: crate::Source::default(),
        }
    }

    #[test]
    fn options_out_of_range_are_usage_errors_before_any_connection() {
        for opt in [
            CrrOptions {
                workers: 0,
                ..CrrOptions::default()
            },
            CrrOptions {
                workers: 65_537,
                ..CrrOptions::default()
            },
            CrrOptions {
                request_bytes: 0,
                ..CrrOptions::default()
            },
            CrrOptions {
                response_bytes: MAX_CRR_MESSAGE + 1,
                ..CrrOptions::default()
            },
            CrrOptions {
                duration: Duration::ZERO,
                ..CrrOptions::default()
            },
            CrrOptions {
                duration: Duration::from_secs(10),
                interval: Some(Duration::from_millis(2)),
                ..CrrOptions::default()
            },
        ] {
            assert!(
                matches!(
                    crate::run(&target(), &opt, crate::Controls::new()),
                    Err(ClientError::Usage(_))
                ),
                "{opt:?}"
            );
        }
    }

    fn stats(transactions: u64) -> CrrStats {
        let mut s = CrrStats::new();
        for i in 0..transactions {
            s.connected(i * 100, i * 100 + 30);
            s.completed(i * 100, i * 100 + 90);
        }
        s
    }

    fn run_with(stats: CrrStats, report: AgentReport) -> Run {
        Run {
            session: SessionId(3),
            agent_host: None,
            stats,
            elapsed_ns: 1_000_000_000,
            intervals: None,
            reports: vec![(None, report)],
            cpu: None,
            interrupted: false,
            interface: None,
            socket: None,
        }
    }

    fn tagged(
        id: u64,
        addr: &str,
        transactions: u64,
        active_ns: u64,
    ) -> (Option<AgentTag>, AgentReport) {
        let tag = AgentTag {
            id: sonde_wire::AgentId(id),
            addr: addr.into(),
        };
        let report = AgentReport {
            crr: Some(CrrReport {
                transactions,
                active_ns,
                failed: 0,
            }),
            ..AgentReport::default()
        };
        (Some(tag), report)
    }

    #[test]
    fn two_agents_behind_a_balancer_add_up_and_each_has_its_share() {
        let mut run = run_with(stats(90), AgentReport::default());
        run.reports = vec![
            tagged(1, "198.18.11.2:5300", 60, 6_000_000),
            tagged(2, "198.18.12.2:5300", 30, 5_000_000),
        ];
        let r = result(&target(), &CrrOptions::default(), 0, &run);
        assert_eq!(r.agent_transactions, Some(90));
        // Each agent's rate over its own window, summed: 10,000/s + 6,000/s.
        assert_eq!(r.connections_per_second, Some(16_000.0));
        assert_eq!(r.agent_duration_ns, Some(6_000_000));
        assert_eq!(r.agents.len(), 2);
        assert_eq!(
            (r.agents[1].addr.as_str(), r.agents[1].transactions),
            ("198.18.12.2:5300", 30)
        );
        assert_eq!(r.agents[1].connections_per_second, Some(6_000.0));
        let agent = r.meta.agent.as_ref().expect("the first agent is named");
        assert_eq!(agent.addr, "198.18.11.2:5300");
        assert_eq!(agent.other_agents, ["0000000000000002"]);
        assert_eq!(
            r.meta.warning_codes,
            [sonde_report::WarningCode::Balancer],
            "{:?}",
            r.meta.warnings
        );
        // No one agent's CPU stands for the server's.
        assert!(r.meta.cpu.server.is_none());
    }

    #[test]
    fn the_agents_count_is_the_headline_and_a_mismatch_is_explained() {
        let report = AgentReport {
            crr: Some(CrrReport {
                transactions: 50,
                active_ns: 5_000_000,
                failed: 0,
            }),
            ..AgentReport::default()
        };
        let r = result(
            &target(),
            &CrrOptions::default(),
            0,
            &run_with(stats(50), report),
        );
        assert_eq!(r.agent_transactions, Some(50));
        assert_eq!(r.connections_per_second, Some(10_000.0));
        assert_eq!(r.transactions, 50);
        assert!(r.meta.warnings.is_empty(), "{:?}", r.meta.warnings);
        assert_eq!(r.connect_ns.as_ref().unwrap().p50, Some(30));
        // 50 samples: p90 needs 100.
        assert_eq!(r.transaction_ns.as_ref().unwrap().p90, None);

        let report = AgentReport {
            crr: Some(CrrReport {
                transactions: 52,
                active_ns: 5_000_000,
                failed: 0,
            }),
            ..AgentReport::default()
        };
        let r = result(
            &target(),
            &CrrOptions::default(),
            0,
            &run_with(stats(50), report),
        );
        assert!(
            r.meta.warnings[0].starts_with("the agent completed 52 transactions and the client 50"),
            "{:?}",
            r.meta.warnings
        );
    }

    #[test]
    fn what_was_not_measured_is_null_not_zero() {
        let r = result(
            &target(),
            &CrrOptions::default(),
            0,
            &run_with(stats(0), AgentReport::default()),
        );
        assert_eq!(r.agent_transactions, None);
        assert_eq!(r.connections_per_second, None);
        assert_eq!(r.client_connections_per_second, None);
        assert_eq!((r.connect_ns, r.transaction_ns), (None, None));
        assert!(r.meta.warnings.iter().any(|w| w.contains("no count")));
        assert!(r
            .meta
            .warnings
            .iter()
            .any(|w| w.starts_with("no transaction")));
        let report = AgentReport {
            crr: Some(CrrReport::default()),
            ..AgentReport::default()
        };
        let r = result(
            &target(),
            &CrrOptions::default(),
            0,
            &run_with(stats(0), report),
        );
        assert_eq!(r.agent_transactions, Some(0));
        assert_eq!(
            (r.connections_per_second, r.agent_duration_ns),
            (None, None)
        );
    }

    #[test]
    fn intervals_run_from_the_workers_start_to_their_end() {
        use sonde_engine::crr::{CrrError, CrrIntervalCutter};
        const SEC: u64 = 1_000_000_000;
        // -t 2 -i 1, one worker: 10 transactions in the first second, none in the second, one
        // EADDRNOTAVAIL at 2.0005 s, which ended the run at 2.001 s.
        let mut all = CrrIntervals::new(SEC, 2 * SEC);
        let mut cut = CrrIntervalCutter::new(SEC);
        let mut s = CrrStats::new();
        let mut flush = |i, c: &_| all.add(i, c);
        for i in 0..10 {
            let t = i * 1_000_000;
            s.connected(t, t + 30_000);
            cut.connected(t + 30_000, 30_000, &mut flush);
            s.completed(t, t + 90_000);
            cut.completed(t + 90_000, &mut flush);
        }
        s.failed(2 * SEC + 500_000, CrrError::AddrNotAvailable);
        cut.failed(2 * SEC + 500_000, CrrError::AddrNotAvailable, &mut flush);
        cut.finish(&mut flush);
        let mut run = run_with(s, AgentReport::default());
        run.intervals = Some((all, 2 * SEC + 1_000_000));
        let r = result(&target(), &CrrOptions::default(), 0, &run);
        let spans: Vec<(u64, u64, u64)> = r
            .intervals
            .iter()
            .map(|i| (i.start_ns, i.end_ns, i.transactions))
            .collect();
        // The last interval holds what ended after -t, and runs to the run's end.
        assert_eq!(spans, [(0, SEC, 10), (SEC, 2 * SEC + 1_000_000, 0)]);
        assert_eq!(r.intervals[0].transactions_per_second, 10.0);
        assert_eq!(r.intervals[1].transactions_per_second, 0.0);
        assert_eq!(r.intervals[1].errors.addr_not_available, 1);
        // 10 connects: too few for a median.
        assert_eq!(r.intervals[0].connect_p50_ns, None);
        // Without -i: none.
        let r = result(
            &target(),
            &CrrOptions::default(),
            0,
            &run_with(stats(5), AgentReport::default()),
        );
        assert!(r.intervals.is_empty());
    }

    #[test]
    fn running_out_of_ports_is_said_plainly() {
        let mut s = stats(10);
        s.failed(5_000, sonde_engine::crr::CrrError::AddrNotAvailable);
        let report = AgentReport {
            crr: Some(CrrReport {
                transactions: 10,
                active_ns: 990,
                failed: 0,
            }),
            ..AgentReport::default()
        };
        let r = result(&target(), &CrrOptions::default(), 0, &run_with(s, report));
        assert_eq!(r.errors.addr_not_available, 1);
        assert!(
            r.meta.warnings[0].starts_with(
                "the client ran out of local ports (EADDRNOTAVAIL) after 10 connections"
            ),
            "{:?}",
            r.meta.warnings
        );
        assert!(r.meta.warnings[0].contains("stopped after 1.000 s of the 10.000 s asked"));
    }
}
