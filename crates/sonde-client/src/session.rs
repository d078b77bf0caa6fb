//! The client side of a session: handshake, data channels, the run, the agent's report.
//!
//! Besides the counts, each run gathers its [`Context`]: both ends' configuration (this host's
//! for the interface toward the agent; the agent's from its `Welcome`) and this end's CPU cost,
//! counted over the threads that ran the test (a [`ThreadsMeter`]: the caller's, the control
//! reader's and the data streams'), so an agent in the same process (`sonde quick`) or another
//! test running beside it (`sonde load`) is not counted. TCP senders' `TCP_INFO` is read when
//! their loop ends and, with intervals, whenever the agent's `Interval` for those streams
//! arrives; the agent's own senders' samples come in its `Interval` and `SenderDone` messages.
//!
//! The control conversation's decisions are state machines without sockets, which the socket
//! code here drives: `running` for a running throughput or pps test, `finishing` for a latency
//! test's end (`Finish`, then the agent's report).

use std::io::Write;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use sonde_engine::interval::Intervals;
use sonde_net::control::{forward_frames, read_frame, write_frame, ControlError};
use sonde_net::cpu::ThreadsMeter;
use sonde_net::hostinfo::InterfaceSnapshot;
use sonde_net::latency::{LatencyOutcome, PingConfig};
use sonde_net::socket::DataOptions;
use sonde_net::tcpinfo::TcpInfoSample;
use sonde_net::{Clock, Counters};
use sonde_report::{IntervalResult, LatencyInterval};
use sonde_wire::auth::{Nonce, SessionKey};
use sonde_wire::{
    AgentReport, AgentTag, Channel, ControlMsg, CpuReport, HelperTest, HostInfo, IntervalStats,
    Preamble, Protocol, SessionId, StreamStats, TcpInfoStats, TestSpec, Token, Tuning,
    TuningReport, PROTOCOL_VERSION,
};

use crate::handshake::{Handshake, Progress};
pub(crate) use crate::run::{BulkRun, ClientChannel, ClientRole, Context, LatencyRun};
use crate::{ClientError, LatencyOptions, Target};

mod finishing;
mod joining;
mod running;

use finishing::{Finishing, REPORT_TIMEOUT};
pub(crate) use joining::Placement;
use running::{Running, Step};

pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// An admitted session with its data channels open and the agent ready.
pub(crate) struct Connected {
    ctrl: TcpStream,
    body: Vec<u8>,
    pub(crate) session: SessionId,
    pub(crate) channels: Vec<ClientChannel>,
    pub(crate) started_unix_ms: u64,
    /// The test as the agent accepted it.
    pub(crate) spec: TestSpec,
    /// Both ends' configuration (the client's CPU cost is added when the run ends).
    pub(crate) context: Context,
}

/// How a throughput or pps run sends and where its streams run.
#[derive(Clone, Copy)]
pub(crate) struct Bulk<'a> {
    /// Whether the client's UDP senders may send GSO batches.
    pub(crate) gso: bool,
    /// `--cpu`: stream `i` runs on `cpus[i % len]`, and the agent is asked to pin its streams;
    /// empty for neither.
    pub(crate) cpus: &'a [u32],
}

/// This end's CPU cost from its meter and its data loops' counters (see
/// [`sonde_net::cpu::loops_report`]).
pub(crate) fn cpu_report(
    meter: &ThreadsMeter,
    spec: &TestSpec,
    counters: &[Counters],
    syscalls_counted: bool,
) -> Option<CpuReport> {
    let cost = meter.cost()?;
    Some(sonde_net::cpu::loops_report(
        &cost,
        spec,
        counters,
        syscalls_counted,
    ))
}

/// Runs a latency loop (`run`) on this thread and measures this end's CPU: this thread and
/// those the loop starts (given the meter), the messages it sent and the system calls its
/// ping loops made ([`sonde_net::latency::ping_syscalls`], this thread's).
pub(crate) fn metered_latency<T>(
    msg_size: u32,
    run: impl FnOnce(&Arc<ThreadsMeter>) -> Result<(LatencyOutcome, T), ClientError>,
) -> Result<(LatencyOutcome, T, Option<CpuReport>), ClientError> {
    let meter = Arc::new(ThreadsMeter::start());
    let counted = meter.track();
    let calls_before = sonde_net::latency::ping_syscalls();
    let (outcome, extra) = run(&meter)?;
    let calls = sonde_net::latency::ping_syscalls().wrapping_sub(calls_before);
    drop(counted);
    // Messages and bytes are what this end sent.
    let bytes = outcome.sent.saturating_mul(u64::from(msg_size));
    let cpu = meter
        .cost()
        .map(|cost| cost.report(Some(calls), Some(outcome.sent), Some(bytes)));
    Ok((outcome, extra, cpu))
}

/// Writes what `handshake` has to send, then reads the agent's reply by its deadline: how the
/// handshake moved on. A refusal may already be waiting when a write fails (an agent that
/// refused and closed): it is read before giving up on the write.
fn exchange(
    ctrl: &mut TcpStream,
    body: &mut Vec<u8>,
    handshake: &mut Handshake,
) -> Result<Progress, ClientError> {
    let mut written = Ok(());
    while let Some(msg) = handshake.poll_transmit() {
        if written.is_ok() {
            written = write_frame(ctrl, &msg);
        }
    }
    let Some(deadline) = handshake.poll_timeout() else {
        return Err(ClientError::Protocol("no reply is due".into()));
    };
    handshake.handle(read_frame(ctrl, body, deadline), written)
}

/// The agent's answer to a hello.
pub(crate) struct Welcomed {
    pub(crate) ctrl: TcpStream,
    pub(crate) body: Vec<u8>,
    pub(crate) session: SessionId,
    pub(crate) limits: sonde_wire::Limits,
    /// The rest of the handshake (it knows both nonces).
    handshake: Handshake,
}

impl Welcomed {
    /// The key that signs this session's UDP joins (none without a secret).
    pub(crate) fn session_key(&self, _target: &Target) -> Option<SessionKey> {
        self.handshake.session_key()
    }

    /// Asks for `spec`, proving the secret when there is one; the agent's token and its host
    /// configuration (which it sends only once it has admitted the client).
    pub(crate) fn start(
        &mut self,
        _target: &Target,
        spec: &TestSpec,
        tuning: Tuning,
    ) -> Result<(Token, Option<HostInfo>, Option<AgentTag>), ClientError> {
        self.start_as(spec, tuning, None)
    }

    /// [`Welcomed::start`] under `token`, another agent's for the same test (`None`: the
    /// agent's choice).
    pub(crate) fn start_as(
        &mut self,
        spec: &TestSpec,
        tuning: Tuning,
        token: Option<Token>,
    ) -> Result<(Token, Option<HostInfo>, Option<AgentTag>), ClientError> {
        self.handshake.start_as(Instant::now(), spec, tuning, token);
        match exchange(&mut self.ctrl, &mut self.body, &mut self.handshake)? {
            Progress::Accepted { token, host, agent } => Ok((token, host, agent)),
            _ => Err(ClientError::Protocol("the handshake went astray".into())),
        }
    }

    /// Asks the agent, a helper, to run `test` against `target` (`--from`), proving the
    /// helper's secret; returns once the helper's session at the target is ready.
    pub(crate) fn help(
        &mut self,
        _helper: &Target,
        target: &str,
        test: &HelperTest,
    ) -> Result<(), ClientError> {
        // The helper makes its own handshake with the target first (connect, admission, data
        // channels, UDP joins), each step under its own timeout.
        self.handshake.help(Instant::now(), target, test);
        match exchange(&mut self.ctrl, &mut self.body, &mut self.handshake)? {
            Progress::HelperReady => Ok(()),
            _ => Err(ClientError::Protocol("the handshake went astray".into())),
        }
    }

    /// Asks the agent to describe its host (`sonde conf`), proving the secret when there is one.
    pub(crate) fn describe(mut self, _target: &Target) -> Result<Option<HostInfo>, ClientError> {
        self.handshake.describe(Instant::now());
        match exchange(&mut self.ctrl, &mut self.body, &mut self.handshake)? {
            Progress::Described { host } => Ok(host),
            _ => Err(ClientError::Protocol("the handshake went astray".into())),
        }
    }
}

/// A fresh random nonce for one connection.
fn fresh_nonce() -> Result<Nonce, ClientError> {
    let mut n = [0u8; sonde_wire::auth::NONCE_LEN];
    getrandom::getrandom(&mut n)
        .map_err(|e| ClientError::Usage(format!("no random numbers for a nonce: {e}")))?;
    Ok(Nonce(n))
}

/// Connects and says hello.
pub(crate) fn hello(target: &Target) -> Result<Welcomed, ClientError> {
    let mut ctrl = target.source.tcp(target.addr, 0, true)?;
    let mut body = Vec::new();
    let preamble = Preamble {
        version: PROTOCOL_VERSION,
        channel: Channel::Control,
    };
    let mut handshake = Handshake::new(Instant::now(), target.secret.clone(), fresh_nonce()?);
    // A refusal (a full agent, too many connections from this address) may be waiting when a
    // write fails: the reply is read either way.
    let progress = match ctrl.write_all(&preamble.encode()) {
        Ok(()) => exchange(&mut ctrl, &mut body, &mut handshake),
        Err(e) => {
            let deadline = handshake.poll_timeout().unwrap_or_else(Instant::now);
            handshake.handle(read_frame(&mut ctrl, &mut body, deadline), Err(e.into()))
        }
    }?;
    match progress {
        Progress::Welcomed { session, limits } => Ok(Welcomed {
            ctrl,
            body,
            session,
            limits,
            handshake,
        }),
        _ => Err(ClientError::Protocol("the handshake went astray".into())),
    }
}

/// Connects, says hello, asks for the test (with the `tuning` the agent is to apply to its
/// end), joins the data channels and waits for `Ready`.
pub(crate) fn connect(
    target: &Target,
    spec: &TestSpec,
    tuning: Tuning,
) -> Result<Connected, ClientError> {
    let started_unix_ms = crate::now_unix_ms();
    // A value this host's kernel refuses is a usage error, found before the agent is asked.
    let options = (!spec.socket.is_default()).then(|| DataOptions::from(&spec.socket));
    if let Some(o) = &options {
        o.try_on(
            unspecified_like(target.addr),
            target.addr.ip(),
            spec.protocol == Protocol::Tcp,
        )
        .map_err(|e| socket_refused(&e))?;
    }
    let mut welcomed = hello(target)?;
    if spec.request_response.is_some() && !welcomed.limits.request_response {
        return Err(ClientError::Refused {
            reason: sonde_wire::Refusal::BadRequest,
            message: format!(
                "the agent at {} predates many-flow latency tests (-P, --depth, \
                 --response-size): upgrade it, or run -P 1 --depth 1",
                target.label
            ),
        });
    }
    let mut spec = spec.clone();
    if spec.duration_ms == 0 {
        // Open-ended (latency -n): as long as the agent allows.
        spec.duration_ms = welcomed.limits.max_duration_ms;
    }
    let (token, server_host, agent) = welcomed.start(target, &spec, tuning)?;
    let join_deadline = Instant::now() + joining::JOIN_BUDGET;
    let key = welcomed.session_key(target);
    let Welcomed {
        mut ctrl,
        mut body,
        session,
        mut handshake,
        ..
    } = welcomed;
    let mut placement = Placement {
        agent,
        ..Placement::default()
    };
    let mut channels = Vec::new();
    let mut applied: Option<sonde_wire::AppliedSocketOptions> = None;
    for i in 0..spec.channels() {
        let (channel, a) = joining::open_channel(
            target,
            &spec,
            options.as_ref(),
            token,
            key.as_ref(),
            i,
            &mut placement,
            join_deadline,
        )?;
        channels.push(channel);
        let a = a.map(|a| a.to_wire(&spec.socket, spec.protocol == Protocol::Tcp));
        match (&mut applied, a) {
            (None, a) => applied = a,
            // The pacing rate and zero-copy as the first sending stream has them.
            (Some(f), Some(a)) if spec.client_sends(i) => {
                if f.pacing_bits_per_second.is_none() {
                    f.pacing_bits_per_second = a.pacing_bits_per_second;
                    f.note = f.note.take().or(a.note);
                }
                f.zerocopy = f.zerocopy.or(a.zerocopy);
            }
            _ => {}
        }
    }
    let context = Context {
        agent: true,
        server_host,
        placement,
        socket: applied.map(|a| (spec.socket.clone(), a)),
        sources: channels
            .iter()
            .map(|c| match c {
                ClientChannel::Tcp(s) => s.local_addr().ok(),
                ClientChannel::Udp(s) => s.local_addr().ok(),
            })
            .collect(),
        ..Context::this_host(target)
    };
    handshake.await_ready(Instant::now());
    match exchange(&mut ctrl, &mut body, &mut handshake)? {
        Progress::Ready => {}
        _ => return Err(ClientError::Protocol("the handshake went astray".into())),
    }
    Ok(Connected {
        ctrl,
        body,
        session,
        channels,
        started_unix_ms,
        spec,
        context,
    })
}

/// `--dont-fragment`: a datagram of `payload` bytes must fit the path MTU the kernel knows
/// toward the agent (the interface's, or less where a router said so); a usage error naming the
/// MTU otherwise, before any datagram is sent. (A path MTU that shrinks during the test ends
/// it with the send's `EMSGSIZE`, explained the same way.)
pub(crate) fn fits_path_mtu(sock: &std::net::UdpSocket, payload: u32) -> Result<(), ClientError> {
    let Ok(mtu) = sonde_net::socket::path_mtu(sock) else {
        return Ok(());
    };
    let ip = match sock.peer_addr() {
        Ok(std::net::SocketAddr::V6(p)) if p.ip().to_ipv4_mapped().is_none() => 40,
        _ => 20,
    };
    let datagram = payload.saturating_add(8 + ip);
    if datagram > mtu {
        return Err(ClientError::Usage(format!(
            "--dont-fragment: a {payload}-byte datagram is {datagram} B with the UDP and IP \
             headers, above the path MTU of {mtu} B toward the agent, and may not be fragmented: \
             send at most {} bytes (-l/-m), or leave out --dont-fragment",
            mtu.saturating_sub(8 + ip)
        )));
    }
    Ok(())
}

/// A socket option this host's kernel refused: a usage error naming the option and the
/// kernel's reason.
/// The unspecified address of `peer`'s family, port 0: where a socket that talks to `peer`
/// would be bound before the kernel picks.
pub(crate) fn unspecified_like(peer: std::net::SocketAddr) -> std::net::SocketAddr {
    match peer {
        std::net::SocketAddr::V4(_) => std::net::SocketAddr::from(([0, 0, 0, 0], 0)),
        std::net::SocketAddr::V6(_) => {
            std::net::SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, 0))
        }
    }
}

pub(crate) fn socket_refused(e: &sonde_net::socket::DataOptionError) -> ClientError {
    ClientError::Usage(format!("{}: {}", e.flag(), e.explain()))
}

/// Runs a latency test on an open session.
/// Runs `f` (a ping loop watching `stop`) while a watcher raises `stop` when the caller's
/// `interrupt` is raised: the loop ends as its own end would, and what it measured stands. (The
/// loops raise `stop` themselves too, so it is not the caller's flag.)
pub(crate) fn stopped_by<T>(interrupt: &AtomicBool, stop: &AtomicBool, f: impl FnOnce() -> T) -> T {
    let done = AtomicBool::new(false);
    thread::scope(|scope| {
        scope.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                if interrupt.load(Ordering::Relaxed) {
                    stop.store(true, Ordering::Relaxed);
                    return;
                }
                thread::sleep(INTERRUPT_POLL);
            }
        });
        let r = f();
        done.store(true, Ordering::Relaxed);
        r
    })
}

/// `-i`: intervals that may wait for the caller's callback (a slow terminal) before the loop's
/// `try_send` drops them: minutes of 10 ms intervals.
const INTERVAL_QUEUE: usize = 16_384;

/// `hold` is called once the agent is ready and before the first message (a helper waits there
/// for its common start). `-i`: each interval goes to `on_interval` as it ends.
pub(crate) fn run_latency_held(
    target: &Target,
    spec: &TestSpec,
    opt: &LatencyOptions,
    interrupt: &AtomicBool,
    on_interval: &mut dyn FnMut(&LatencyInterval),
    hold: &mut dyn FnMut() -> Result<(), ClientError>,
) -> Result<LatencyRun, ClientError> {
    let tuning = Tuning {
        busy_poll: opt.busy_poll,
        pin: opt.busy_poll || opt.cpu.is_some(),
    };
    let mut c = connect(target, spec, tuning)?;
    hold()?;
    let interface = InterfaceSnapshot::toward(target.addr.ip());
    let mut tuned = (!tuning.is_default()).then(TuningReport::default);
    if let Some(t) = tuned.as_mut().filter(|_| opt.busy_poll) {
        let busy = match &c.channels[0] {
            ClientChannel::Tcp(s) => sonde_net::tune::busy_poll_tcp(s),
            ClientChannel::Udp(s) => sonde_net::tune::busy_poll_udp(s),
        }
        .map_err(|e| ClientError::Data(e, 0))?;
        t.busy_poll = true;
        t.so_busy_poll_us = busy.so_busy_poll_us;
    }
    if let Some(t) = tuned.as_mut() {
        t.cpus.extend(opt.cpu);
    }
    let warmup_ns = u64::try_from(opt.warmup.as_nanos()).unwrap_or(u64::MAX);
    let until_ns = if opt.count.is_some() {
        c.spec.duration_ms.saturating_mul(1_000_000)
    } else {
        warmup_ns.saturating_add(u64::try_from(opt.duration.as_nanos()).unwrap_or(u64::MAX))
    };
    let cfg = PingConfig {
        msg_size: spec.msg_size,
        until_ns,
        warmup_ns,
        rate: opt.rate,
        count: opt.count,
    };
    let stop = AtomicBool::new(false);
    let mut intervals = Vec::new();
    let measured = stopped_by(interrupt, &stop, || {
        metered_latency(spec.msg_size, |meter| {
            let clock = Clock::start();
            // The ping loop, with the inner view (log, timestamps, one-way clock sync) when
            // asked; pinned for the loop only (checked by `check_tuning`): the thread's CPUs
            // come back when the guard drops.
            let mut ping = |ivs: Option<sonde_net::latency::IntervalView>| {
                let _pinned = opt
                    .cpu
                    .map(sonde_net::tune::pin_current_thread)
                    .transpose()
                    .map_err(|e| ClientError::Usage(format!("--cpu: {e}")))?;
                let outcome = crate::inner::ping(
                    &mut c.ctrl,
                    &mut c.body,
                    &c.channels[0],
                    &cfg,
                    opt,
                    &clock,
                    &stop,
                    meter,
                    ivs,
                )?;
                Ok((outcome, clock.now_ns()))
            };
            let Some(every) = opt.interval else {
                return ping(None);
            };
            // `-i`: the loop runs on a thread of its own, counted as this one, and this thread
            // hands its intervals on as they come.
            let (tx, rx) = std::sync::mpsc::sync_channel(INTERVAL_QUEUE);
            let view = sonde_net::latency::IntervalView {
                every_ns: u64::try_from(every.as_nanos()).unwrap_or(u64::MAX),
                out: tx,
            };
            thread::scope(|s| {
                let looping = s.spawn(|| {
                    let _counted = meter.track();
                    let before = sonde_net::latency::ping_syscalls();
                    let r = ping(Some(view));
                    (r, sonde_net::latency::ping_syscalls().wrapping_sub(before))
                });
                // Ends when the loop has dropped its sender, after its last interval.
                for iv in rx {
                    let iv = crate::rtt::latency_interval(&iv);
                    on_interval(&iv);
                    intervals.push(iv);
                }
                let (r, calls) = looping
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
                sonde_net::latency::credit_ping_syscalls(calls);
                r
            })
        })
    });
    let (outcome, elapsed_ns, client_cpu) = measured?;
    c.context.client_cpu = client_cpu;
    let (report, interrupted) = finish_latency(&mut c, interrupt.load(Ordering::Relaxed))?;
    c.context.interface = interface.as_ref().and_then(InterfaceSnapshot::delta);
    Ok(LatencyRun {
        session: c.session,
        started_unix_ms: c.started_unix_ms,
        outcome,
        elapsed_ns,
        report,
        context: c.context,
        interrupted,
        tuning: tuned,
        intervals,
        many_flows: None,
    })
}

/// Descriptors a many-flow test may need beyond its flows (the control connection, the
/// threads' epoll instances, the standard streams, a results store).
const SPARE_DESCRIPTORS: u64 = 64;

/// A many-flow latency test (`-P`, `--depth`, `--response-size`): the flows split into
/// contiguous groups, one per thread, each driven by one readiness loop
/// ([`sonde_net::latency::rr`]); their histograms merged. `--rate`: the open loop, the total
/// rate spread over every flow of every thread. `-i`: each thread cuts its intervals at the
/// same boundaries, and this thread merges each interval of every thread as the last one hands
/// it over and passes it to `on_interval`. `hold` as for [`run_latency_held`].
pub(crate) fn run_many_flows(
    target: &Target,
    spec: &TestSpec,
    opt: &LatencyOptions,
    interrupt: &AtomicBool,
    on_interval: &mut dyn FnMut(&LatencyInterval),
    hold: &mut dyn FnMut() -> Result<(), ClientError>,
) -> Result<LatencyRun, ClientError> {
    let Some(rr) = spec.request_response else {
        return Err(ClientError::Usage("internal: not a many-flow test".into()));
    };
    // One descriptor per flow at this end: the soft limit raised to the hard one if need be.
    let needed = u64::from(spec.streams) + SPARE_DESCRIPTORS;
    let (soft, hard) = sonde_net::socket::raise_descriptor_limit().unwrap_or((u64::MAX, u64::MAX));
    if soft < needed {
        return Err(ClientError::Usage(format!(
            "-P {} needs about {needed} open files, and this process may open {soft} (hard limit \
             {hard}): raise it (ulimit -n, or LimitNOFILE= for a service) or ask fewer flows",
            spec.streams
        )));
    }
    let tuning = Tuning {
        busy_poll: opt.busy_poll,
        pin: opt.busy_poll || opt.cpu.is_some(),
    };
    let mut c = connect(target, spec, tuning)?;
    hold()?;
    let interface = InterfaceSnapshot::toward(target.addr.ip());
    let mut tuned = (!tuning.is_default()).then(TuningReport::default);
    if let Some(t) = tuned.as_mut().filter(|_| opt.busy_poll) {
        // Every flow non-blocking (the loops make them so anyway) with `SO_BUSY_POLL` where
        // permitted; the loops spin on a zero wait.
        for (i, c) in c.channels.iter().enumerate() {
            let busy = match c {
                ClientChannel::Tcp(s) => sonde_net::tune::busy_poll_tcp(s),
                ClientChannel::Udp(s) => sonde_net::tune::busy_poll_udp(s),
            }
            .map_err(|e| ClientError::Data(e, u32::try_from(i).unwrap_or(u32::MAX)))?;
            t.so_busy_poll_us = t.so_busy_poll_us.or(busy.so_busy_poll_us);
        }
        t.busy_poll = true;
    }
    if let Some(t) = tuned.as_mut() {
        t.cpus.extend(opt.cpu);
    }
    let warmup_ns = u64::try_from(opt.warmup.as_nanos()).unwrap_or(u64::MAX);
    let cfg = sonde_net::latency::rr::RrConfig {
        request_size: spec.msg_size,
        response_size: rr.response_size,
        depth: rr.depth,
        until_ns: warmup_ns
            .saturating_add(u64::try_from(opt.duration.as_nanos()).unwrap_or(u64::MAX)),
        warmup_ns,
        spin: opt.busy_poll,
        open: None,
    };
    let n = c.channels.len();
    let threads = (opt.client_threads() as usize).clamp(1, n.max(1));
    let groups: Vec<std::ops::Range<usize>> = (0..threads)
        .map(|t| t * n / threads..(t + 1) * n / threads)
        .filter(|r| !r.is_empty())
        .collect();
    let stop = AtomicBool::new(false);
    let channels = &c.channels;
    let every_ns = opt
        .interval
        .map(|every| u64::try_from(every.as_nanos()).unwrap_or(u64::MAX));
    let mut intervals = Vec::new();
    let measured = stopped_by(interrupt, &stop, || {
        metered_latency(spec.msg_size, |meter| {
            let clock = Clock::start();
            let (tx, rx) = std::sync::mpsc::sync_channel(INTERVAL_QUEUE);
            let outcomes = thread::scope(|s| {
                let running: Vec<_> = groups
                    .iter()
                    .enumerate()
                    .map(|(t, group)| {
                        let (clock, stop) = (&clock, &stop);
                        let view =
                            every_ns.map(|every_ns| sonde_net::latency::rr::RrIntervalView {
                                every_ns,
                                thread: t,
                                out: tx.clone(),
                            });
                        let cfg = sonde_net::latency::rr::RrConfig {
                            open: opt.rate.map(|rate| sonde_net::latency::rr::RrOpen {
                                rate_per_second: rate,
                                total_flows: u32::try_from(n).unwrap_or(u32::MAX),
                                first_flow: u32::try_from(group.start).unwrap_or(u32::MAX),
                            }),
                            ..cfg
                        };
                        s.spawn(move || {
                            let _counted = meter.track();
                            let _pinned = opt
                                .cpu
                                .map(sonde_net::tune::pin_current_thread)
                                .transpose()
                                .map_err(|e| ClientError::Usage(format!("--cpu: {e}")))?;
                            let before = sonde_net::latency::ping_syscalls();
                            let r = flows_of(&channels[group.clone()], &cfg, clock, stop, view);
                            let calls = sonde_net::latency::ping_syscalls().wrapping_sub(before);
                            // One thread failing ends the others' loops too.
                            if r.is_err() {
                                stop.store(true, Ordering::Relaxed);
                            }
                            Ok((
                                r.map_err(|e| ClientError::Data(e, group.start as u32))?,
                                calls,
                            ))
                        })
                    })
                    .collect();
                // `-i`: ends when every thread has dropped its sender, after its last interval.
                drop(tx);
                let mut merging = MergedIntervals::new(groups.len());
                for iv in rx {
                    merging.add(iv, &mut |iv| {
                        on_interval(&iv);
                        intervals.push(iv);
                    });
                }
                merging.finish(&mut |iv| {
                    on_interval(&iv);
                    intervals.push(iv);
                });
                running
                    .into_iter()
                    .map(|h| {
                        h.join()
                            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
                    })
                    .collect::<Result<Vec<_>, ClientError>>()
            })?;
            let mut rtt = sonde_engine::rtt::RttRecorder::new(warmup_ns);
            let mut flows = Vec::with_capacity(n);
            for (o, calls) in outcomes {
                sonde_net::latency::credit_ping_syscalls(calls);
                rtt.merge(&o.rtt);
                flows.extend(o.flows);
            }
            let outcome = LatencyOutcome {
                rtt,
                sent: flows.iter().map(|f| f.sent).sum(),
                seq: None,
                late_sends: flows.iter().map(|f| f.late_sends).sum(),
                timeouts: flows.iter().map(|f| f.timeouts).sum(),
                socket: None,
                one_way: None,
                log: None,
            };
            Ok((outcome, (flows, clock.now_ns())))
        })
    });
    let (outcome, (flows, elapsed_ns), client_cpu) = measured?;
    c.context.client_cpu = client_cpu;
    let (report, interrupted) = finish_latency(&mut c, interrupt.load(Ordering::Relaxed))?;
    c.context.interface = interface.as_ref().and_then(InterfaceSnapshot::delta);
    Ok(LatencyRun {
        session: c.session,
        started_unix_ms: c.started_unix_ms,
        outcome,
        elapsed_ns,
        report,
        context: c.context,
        interrupted,
        tuning: tuned,
        intervals,
        many_flows: Some(crate::run::ManyFlowsRun {
            flows,
            threads: u32::try_from(groups.len()).unwrap_or(u32::MAX),
        }),
    })
}

/// `-i` with many flows: each interval once every thread has handed over its part, the
/// threads' histograms merged, in order.
struct MergedIntervals {
    threads: usize,
    /// Intervals from `first` on, each with the threads that have handed it over.
    pending: std::collections::VecDeque<(sonde_net::latency::rr::RrInterval, usize)>,
    first: u64,
}

impl MergedIntervals {
    fn new(threads: usize) -> Self {
        Self {
            threads,
            pending: std::collections::VecDeque::new(),
            first: 0,
        }
    }

    /// One thread's part of an interval; `done` gets every interval now complete.
    fn add(
        &mut self,
        iv: sonde_net::latency::rr::RrInterval,
        done: &mut dyn FnMut(LatencyInterval),
    ) {
        let Some(at) = iv
            .index
            .checked_sub(self.first)
            .and_then(|k| usize::try_from(k).ok())
        else {
            // An interval already given out (a thread's part came after it was closed at
            // the end): nothing to add to.
            return;
        };
        if at < self.pending.len() {
            let (merged, parts) = &mut self.pending[at];
            merged.rtt.merge(&iv.rtt);
            merged.start_ns = merged.start_ns.min(iv.start_ns);
            merged.end_ns = merged.end_ns.max(iv.end_ns);
            *parts += 1;
        } else {
            // Intervals before it that no thread has handed over yet (one thread ahead of
            // another by more than an interval) hold nothing so far.
            while self.pending.len() < at {
                let index = self.first + self.pending.len() as u64;
                self.pending.push_back((
                    sonde_net::latency::rr::RrInterval {
                        thread: iv.thread,
                        index,
                        start_ns: u64::MAX,
                        end_ns: 0,
                        rtt: sonde_engine::rtt::RttRecorder::default(),
                    },
                    0,
                ));
            }
            self.pending.push_back((iv, 1));
        }
        while self
            .pending
            .front()
            .is_some_and(|(_, p)| *p >= self.threads)
        {
            if let Some((iv, _)) = self.pending.pop_front() {
                self.first += 1;
                done(merged_interval(&iv));
            }
        }
    }

    /// The run is over: what is left, in order (a thread stopped by an interrupt may have cut
    /// one interval fewer than another).
    fn finish(&mut self, done: &mut dyn FnMut(LatencyInterval)) {
        while let Some((iv, parts)) = self.pending.pop_front() {
            self.first += 1;
            if parts > 0 {
                done(merged_interval(&iv));
            }
        }
    }
}

/// A merged interval in the document's form, with its transactions per second.
fn merged_interval(iv: &sonde_net::latency::rr::RrInterval) -> LatencyInterval {
    let summary = iv.rtt.summary();
    let secs = iv.end_ns.saturating_sub(iv.start_ns) as f64 / 1e9;
    LatencyInterval {
        transactions_per_second: (secs > 0.0).then(|| summary.samples as f64 / secs),
        ..crate::rtt::latency_interval(&sonde_net::latency::RttInterval {
            start_ns: iv.start_ns,
            end_ns: iv.end_ns,
            rtt: summary,
        })
    }
}

/// One thread's flows through the readiness loop of their protocol.
fn flows_of(
    channels: &[ClientChannel],
    cfg: &sonde_net::latency::rr::RrConfig,
    clock: &Clock,
    stop: &AtomicBool,
    intervals: Option<sonde_net::latency::rr::RrIntervalView>,
) -> std::io::Result<sonde_net::latency::rr::RrOutcome> {
    let tcp: Vec<&TcpStream> = channels
        .iter()
        .filter_map(|c| match c {
            ClientChannel::Tcp(s) => Some(s),
            ClientChannel::Udp(_) => None,
        })
        .collect();
    if !tcp.is_empty() {
        return sonde_net::latency::rr::client(&tcp, cfg, clock, stop, intervals);
    }
    let udp: Vec<&std::net::UdpSocket> = channels
        .iter()
        .filter_map(|c| match c {
            ClientChannel::Udp(s) => Some(s),
            ClientChannel::Tcp(_) => None,
        })
        .collect();
    sonde_net::latency::rr::client(&udp, cfg, clock, stop, intervals)
}

/// A latency test's end ([`Finishing`]) over the session's control connection: `Finish`, then
/// the agent's report, read by its deadline. The report, and whether the test was interrupted.
pub(crate) fn finish_latency(
    c: &mut Connected,
    interrupted: bool,
) -> Result<(AgentReport, bool), ClientError> {
    let mut end = Finishing::new(Instant::now());
    if interrupted {
        end.interrupt();
    }
    loop {
        match end.poll() {
            Some(finishing::Step::SendFinish) => write_frame(&mut c.ctrl, &ControlMsg::Finish)?,
            Some(finishing::Step::Done {
                report,
                interrupted,
            }) => return Ok((*report, interrupted)),
            None => {
                end.handle_timeout(Instant::now())?;
                match read_frame(&mut c.ctrl, &mut c.body, end.poll_timeout()) {
                    Ok(msg) => end.handle(Instant::now(), msg)?,
                    Err(e) => end.handle_lost(e)?,
                }
            }
        }
    }
}

/// How often a run looks at the caller's interrupt flag.
const INTERRUPT_POLL: Duration = Duration::from_millis(20);

enum Event {
    Control(Result<ControlMsg, ControlError>),
    /// A data channel ended: its outcome, and a TCP sender's last `TCP_INFO`.
    Done(
        usize,
        Result<(ClientRole, Option<TcpInfoStats>), std::io::Error>,
    ),
}

/// Runs a throughput or pps test on an open session, sending and placing its streams as `bulk`
/// says. `hold` is called once every data channel has joined and before any data is sent (a helper
/// waits there for its common start).
pub(crate) fn run_bulk_held(
    target: &Target,
    spec: &TestSpec,
    interrupt: &AtomicBool,
    bulk: Bulk<'_>,
    on_interval: &mut dyn FnMut(&IntervalResult),
    hold: &mut dyn FnMut() -> Result<(), ClientError>,
) -> Result<BulkRun, ClientError> {
    let tuning = Tuning {
        busy_poll: false,
        pin: !bulk.cpus.is_empty(),
    };
    let mut c = connect(target, spec, tuning)?;
    // As asked for, with an open-ended test's (`-n`, `-k`) cap filled in by `connect`.
    let asked = c.spec.clone();
    let spec = &asked;
    hold()?;
    let interface = InterfaceSnapshot::toward(target.addr.ip());
    let meter = ThreadsMeter::start();
    let counted = meter.track();
    let n = c.channels.len();
    let clock = Clock::start();
    let until_ns = spec
        .duration_ms
        .saturating_add(spec.omit_ms)
        .saturating_mul(1_000_000);
    let stops: Vec<AtomicBool> = (0..n).map(|_| AtomicBool::new(false)).collect();
    let expect: Vec<AtomicU64> = (0..n).map(|_| AtomicU64::new(u64::MAX)).collect();
    let counters: Vec<Counters> = (0..n).map(|_| Counters::default()).collect();
    let reader = c
        .ctrl
        .try_clone()
        .map_err(|e| ClientError::Control(e.into()))?;
    let writer = Mutex::new(c.ctrl);
    let hard_deadline = Instant::now()
        + Duration::from_millis(spec.duration_ms.saturating_add(spec.omit_ms))
        + REPORT_TIMEOUT
        + Duration::from_secs(60);
    let (tx, rx) = mpsc::channel::<Event>();
    let receivers: Vec<usize> = (0..n)
        .filter(|&i| !spec.client_sends(index_u32(i)))
        .collect();
    let senders: Vec<usize> = (0..n)
        .filter(|&i| spec.client_sends(index_u32(i)))
        .collect();

    let reader_stop = AtomicBool::new(false);
    let result = thread::scope(|scope| {
        let ctrl_tx = tx.clone();
        let meter = &meter;
        let reader_stop = &reader_stop;
        scope.spawn(move || {
            let _counted = meter.track();
            forward_frames(reader, hard_deadline, reader_stop, |m| {
                ctrl_tx.send(Event::Control(m)).is_ok()
            });
        });
        for (i, channel) in c.channels.iter().enumerate() {
            let tx = tx.clone();
            let (stop, expect, counters) = (&stops[i], &expect[i], &counters[i]);
            let sends = spec.client_sends(index_u32(i));
            let cpu = (!bulk.cpus.is_empty()).then(|| bulk.cpus[i % bulk.cpus.len()]);
            scope.spawn(move || {
                let _counted = meter.track();
                // Pinned for the stream's loop; `check_cpus` made sure the CPU is allowed.
                let r = cpu
                    .map(sonde_net::tune::pin_current_thread)
                    .transpose()
                    .and_then(|_pinned| {
                        role(
                            spec,
                            channel,
                            sends,
                            bulk.gso,
                            &clock,
                            until_ns,
                            spec.send_limit(index_u32(i)),
                            stop,
                            expect,
                            counters,
                        )
                    });
                let r = r.map(|role| {
                    let info = match (channel, &role) {
                        (ClientChannel::Tcp(s), ClientRole::Sent(_)) => {
                            TcpInfoSample::read(s).ok().map(|t| t.stats(index_u32(i)))
                        }
                        _ => None,
                    };
                    (role, info)
                });
                let _ = tx.send(Event::Done(i, r));
            });
        }
        // Our receivers are running: the agent's senders may start.
        let go = write_frame(&mut lock(&writer), &ControlMsg::Go);
        let mut state = Loop {
            spec,
            n,
            stops: &stops,
            expect: &expect,
            counters: &counters,
            receivers: &receivers,
            senders: &senders,
            roles: (0..n).map(|_| None).collect(),
            agent_sent: Vec::new(),
            report: None,
            intervals: (spec.interval_ms > 0 && !receivers.is_empty()).then(|| {
                Intervals::new(
                    spec.interval_ms.saturating_mul(1_000_000),
                    receivers.iter().map(|&i| index_u32(i)).collect(),
                )
            }),
            client_intervals: Vec::new(),
            // `-i`: this host's interface per interval it cuts, from this reading on.
            interval_iface: interface.as_ref().map(InterfaceSnapshot::counters_only),
            channels: &c.channels,
            interval_tcp_info: Vec::new(),
            client_tcp_info: vec![None; n],
            interrupt,
            interrupted: false,
        };
        let r = go
            .map_err(ClientError::from)
            .and_then(|()| state.drive(&rx, &writer, &clock, hard_deadline, on_interval));
        for s in &stops {
            s.store(true, Ordering::Relaxed);
        }
        // End the control reader (the flag: a shut socket does not wake it on Windows).
        reader_stop.store(true, Ordering::Relaxed);
        let _ = crate::session::lock(&writer).shutdown(std::net::Shutdown::Both);
        r.map(|()| state)
    })?;
    let roles = result
        .roles
        .into_iter()
        .enumerate()
        .map(|(i, r)| r.ok_or_else(|| ClientError::Protocol(format!("stream {i} never finished"))))
        .collect::<Result<Vec<_>, _>>()?;
    // The other threads of the run have ended: the sum is complete.
    drop(counted);
    c.context.client_cpu = cpu_report(&meter, spec, &counters, true);
    c.context.interface = interface.as_ref().and_then(InterfaceSnapshot::delta);
    Ok(BulkRun {
        session: c.session,
        started_unix_ms: c.started_unix_ms,
        roles,
        agent_sent: result.agent_sent,
        report: result.report.unwrap_or_default(),
        client_intervals: result.client_intervals,
        interval_tcp_info: result.interval_tcp_info,
        client_tcp_info: result.client_tcp_info,
        context: c.context,
        interrupted: result.interrupted,
        tuning: tuning.pin.then(|| TuningReport {
            cpus: stream_cpus(bulk.cpus, n),
            ..TuningReport::default()
        }),
    })
}

/// The CPUs `n` streams ran on when stream `i` ran on `cpus[i % len]`, each once, in order.
fn stream_cpus(cpus: &[u32], n: usize) -> Vec<u32> {
    let mut used: Vec<u32> = cpus.iter().copied().take(n).collect();
    used.sort_unstable();
    used.dedup();
    used
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `-O`: the omit period, ns (0 for none).
fn omit_ns(spec: &TestSpec) -> u64 {
    spec.omit_ms.saturating_mul(1_000_000)
}

#[allow(clippy::too_many_arguments)]
fn role(
    spec: &TestSpec,
    channel: &ClientChannel,
    sends: bool,
    gso: bool,
    clock: &Clock,
    until_ns: u64,
    limit: u64,
    stop: &AtomicBool,
    expect: &AtomicU64,
    counters: &Counters,
) -> Result<ClientRole, std::io::Error> {
    use sonde_net::bulk;
    match (channel, sends) {
        // `-O`: the first `omit_ms` of this run's clock (the one the client's intervals are cut
        // on) are sent and received but not counted; the senders send the duration after them.
        (ClientChannel::Tcp(s), true) => {
            let opts = bulk::TcpSendOptions {
                omit_until_ns: omit_ns(spec),
                max_bytes: limit,
                zerocopy: spec.socket.zerocopy,
                ..bulk::TcpSendOptions::until(spec.msg_size, until_ns)
            };
            bulk::tcp_send(s, &opts, clock, stop, counters).map(ClientRole::Sent)
        }
        (ClientChannel::Tcp(s), false) => {
            let opts = bulk::TcpRecvOptions {
                read_size: spec.tcp_read_size(),
                omit_until_ns: omit_ns(spec),
                discard: spec.skip_rx_copy,
                max_bytes_per_second: None,
            };
            bulk::tcp_recv(s, &opts, clock, stop, counters).map(ClientRole::TcpReceived)
        }
        (ClientChannel::Udp(s), true) => {
            let opts = bulk::UdpSendOptions {
                msg_size: spec.msg_size,
                bits_per_second: spec.bitrate_per_stream,
                format: bulk::UdpFormat::sonde(spec),
                gso,
                until_ns,
                omit_until_ns: omit_ns(spec),
                max_bytes: limit,
            };
            bulk::udp_send_with(s, &opts, clock, stop, counters).map(ClientRole::Sent)
        }
        // `--ecn`: the receiver counts the marks its datagrams arrive with. `-O`: the run's
        // clock starts at 0, so the omit period is known from the first datagram on.
        (ClientChannel::Udp(s), false) => {
            static RUN_START: AtomicU64 = AtomicU64::new(0);
            let opts = bulk::UdpRecvOptions {
                msg_size: spec.msg_size,
                format: bulk::UdpFormat::sonde(spec),
                ecn: spec.socket.ecn_asked(),
                omit: (spec.omit_ms > 0).then_some(bulk::UdpOmit {
                    from_ns: &RUN_START,
                    omit_ns: omit_ns(spec),
                }),
            };
            bulk::udp_recv_with(s, &opts, clock, stop, expect, counters)
                .map(|o| ClientRole::UdpReceived(Box::new(o)))
        }
    }
}

struct Loop<'a> {
    spec: &'a TestSpec,
    n: usize,
    stops: &'a [AtomicBool],
    expect: &'a [AtomicU64],
    counters: &'a [Counters],
    receivers: &'a [usize],
    senders: &'a [usize],
    roles: Vec<Option<ClientRole>>,
    agent_sent: Vec<StreamStats>,
    report: Option<AgentReport>,
    intervals: Option<Intervals>,
    client_intervals: Vec<IntervalStats>,
    interval_iface: Option<InterfaceSnapshot>,
    channels: &'a [ClientChannel],
    interval_tcp_info: Vec<(u64, Vec<TcpInfoStats>)>,
    client_tcp_info: Vec<Option<TcpInfoStats>>,
    /// The caller's interrupt flag (Ctrl-C, SIGTERM).
    interrupt: &'a AtomicBool,
    /// Seen: this host's senders were stopped and the agent told to finish.
    interrupted: bool,
}

impl Loop<'_> {
    fn drive(
        &mut self,
        rx: &mpsc::Receiver<Event>,
        writer: &Mutex<TcpStream>,
        clock: &Clock,
        hard_deadline: Instant,
        on_interval: &mut dyn FnMut(&IntervalResult),
    ) -> Result<(), ClientError> {
        let sends = (0..self.n).map(|i| self.senders.contains(&i)).collect();
        let mut test = Running::new(sends);
        loop {
            let all_done = self.roles.iter().all(Option::is_some);
            if all_done && test.has_report() {
                // The agent's report can come before this host's last receiver has ended: in
                // reverse the agent reports when its senders stop, while what they left in
                // their socket buffers still drains (hundreds of ms behind a slow link), and a
                // busy host runs the receiver late. Close that receiver's final interval, or
                // the bytes since the last boundary would be in no interval.
                self.poll_intervals(clock, true, on_interval);
                (self.report, self.agent_sent) = test.finish();
                return Ok(());
            }
            test.handle_timeout(Instant::now(), hard_deadline)?;
            if self.interrupt.load(Ordering::Relaxed) {
                test.interrupt();
            }
            self.apply(&mut test, writer, on_interval)?;
            self.poll_intervals(clock, all_done, on_interval);
            match rx.recv_timeout(Duration::from_millis(20)) {
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(ClientError::Protocol("internal: event loop ended".into()))
                }
                Ok(Event::Control(Ok(msg))) => test.handle(Instant::now(), msg)?,
                Ok(Event::Control(Err(e))) => test.handle_lost(e)?,
                Ok(Event::Done(i, r)) => {
                    let role = match r {
                        Ok((role, info)) => {
                            self.client_tcp_info[i] = info;
                            role
                        }
                        // The agent may have said why before the stream broke (shutting down).
                        Err(e) => {
                            return Err(
                                reason_from_agent(rx).unwrap_or(ClientError::Data(e, index_u32(i)))
                            )
                        }
                    };
                    self.roles[i] = Some(role);
                    test.stream_ended(i);
                }
            }
            self.apply(&mut test, writer, on_interval)?;
        }
    }

    /// Does what the test's control side says, in order.
    fn apply(
        &mut self,
        test: &mut Running,
        writer: &Mutex<TcpStream>,
        on_interval: &mut dyn FnMut(&IntervalResult),
    ) -> Result<(), ClientError> {
        while let Some(step) = test.poll() {
            match step {
                Step::StopReceivers => {
                    for &i in self.receivers {
                        if self.spec.protocol == Protocol::Udp {
                            self.stops[i].store(true, Ordering::Relaxed);
                        }
                    }
                }
                Step::StopSenders => {
                    // Stop early as the planned end would: this host's senders stop and report
                    // (`SenderDone`), the agent stops its own streams (`Finish`) and reports.
                    self.interrupted = true;
                    for &i in self.senders {
                        self.stops[i].store(true, Ordering::Relaxed);
                    }
                }
                Step::SendFinish => write_frame(&mut lock(writer), &ControlMsg::Finish)?,
                Step::Expect { stream, packets } => {
                    if let Some(e) = self.expect.get(stream) {
                        e.store(packets, Ordering::Relaxed);
                    }
                }
                Step::Interval(iv) => self.on_interval(*iv, on_interval),
                Step::SendSenderDone => {
                    let streams = self
                        .senders
                        .iter()
                        .filter_map(|&s| match &self.roles[s] {
                            Some(ClientRole::Sent(o)) => Some(o.stats(index_u32(s))),
                            _ => None,
                        })
                        .collect();
                    write_frame(&mut lock(writer), &ControlMsg::SenderDone { streams })?;
                }
            }
        }
        Ok(())
    }

    /// An interval of the agent's: completed with this host's TCP senders' `TCP_INFO`, shown.
    /// A receiver interval as the live callback sees it, marked omitted when it is part of the
    /// `-O` period (as the result marks it).
    fn live(&self, iv: &IntervalStats, by: crate::results::CountedBy) -> IntervalResult {
        let mut out = crate::results::interval(iv, self.n, by);
        out.omitted = iv.end_ns <= omit_ns(self.spec);
        out
    }

    fn on_interval(&mut self, mut iv: IntervalStats, on_interval: &mut dyn FnMut(&IntervalResult)) {
        // This host's TCP senders are the other end of the streams the agent counts here:
        // sampled now, on the agent's grid.
        let ours: Vec<TcpInfoStats> = self
            .senders
            .iter()
            .filter_map(|&i| match &self.channels[i] {
                ClientChannel::Tcp(s) => TcpInfoSample::read(s).ok().map(|t| t.stats(index_u32(i))),
                ClientChannel::Udp(_) => None,
            })
            .collect();
        iv.tcp_info.extend(ours);
        let tcp_info = std::mem::take(&mut iv.tcp_info);
        if !tcp_info.is_empty() {
            self.interval_tcp_info.push((iv.start_ns, tcp_info));
        }
        // An agent that only sends (reverse) sends intervals with only its TCP_INFO.
        if !iv.streams.is_empty() {
            on_interval(&self.live(&iv, crate::results::CountedBy::Agent));
        }
    }

    fn poll_intervals(
        &mut self,
        clock: &Clock,
        receivers_done: bool,
        on_interval: &mut dyn FnMut(&IntervalResult),
    ) {
        let Some(cutter) = self.intervals.as_mut() else {
            return;
        };
        let receivers_done =
            receivers_done || self.receivers.iter().all(|&i| self.roles[i].is_some());
        let sample: Vec<(u64, u64)> = self
            .receivers
            .iter()
            .map(|&i| self.counters[i].load())
            .collect();
        let now = clock.now_ns();
        let iv = if receivers_done {
            let last = cutter.finish(now, &sample);
            self.intervals = None;
            last
        } else {
            cutter.poll(now, &sample)
        };
        if let Some(mut iv) = iv {
            iv.interface = self
                .interval_iface
                .as_mut()
                .and_then(InterfaceSnapshot::interval)
                .map(Box::new);
            on_interval(&self.live(&iv, crate::results::CountedBy::Client));
            self.client_intervals.push(iv);
        }
    }
}

/// After a data stream failed: the agent's own account of why, if it sends one within 0.5 s.
fn reason_from_agent(rx: &mpsc::Receiver<Event>) -> Option<ClientError> {
    let deadline = Instant::now() + Duration::from_millis(500);
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match rx.recv_timeout(left) {
            Ok(Event::Control(Ok(ControlMsg::Error { message }))) => {
                return Some(ClientError::Remote(message))
            }
            Ok(Event::Control(Err(_))) | Err(_) => return None,
            Ok(_) => {}
        }
    }
    None
}

fn index_u32(i: usize) -> u32 {
    u32::try_from(i).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sonde_net::bulk::TcpRecvOutcome;
    use sonde_wire::{Direction, TestKind};

    /// `-i` with many flows: the threads' parts of each interval, coming in any order between
    /// threads, make one interval each, in order, once every thread has handed over its part
    /// (the last when the run ends), their samples merged.
    #[test]
    fn many_flow_intervals_merge_every_threads_part_in_order() {
        use sonde_net::latency::rr::RrInterval;
        let part = |thread: usize, index: u64, samples: u64, end_ns: u64| {
            let mut rtt = sonde_engine::rtt::RttRecorder::new(0);
            for k in 0..samples {
                rtt.record(k, 1_000 + k);
            }
            RrInterval {
                thread,
                index,
                start_ns: 100 * index,
                end_ns,
                rtt,
            }
        };
        let mut m = MergedIntervals::new(2);
        let mut out = Vec::new();
        let mut done = |iv: LatencyInterval| out.push(iv);
        m.add(part(0, 0, 3, 100), &mut done);
        m.add(part(0, 1, 4, 200), &mut done);
        m.add(part(1, 0, 5, 100), &mut done);
        // Thread 1 ended its last interval later than thread 0 did.
        m.add(part(0, 2, 1, 250), &mut done);
        m.add(part(1, 1, 6, 200), &mut done);
        m.add(part(1, 2, 2, 260), &mut done);
        m.finish(&mut done);
        let got: Vec<(u64, u64, u64)> = out
            .iter()
            .map(|iv| (iv.start_ns, iv.end_ns, iv.samples))
            .collect();
        assert_eq!(got, [(0, 100, 8), (100, 200, 10), (200, 260, 3)]);
        // 8 transactions in 100 ns.
        assert_eq!(out[0].transactions_per_second, Some(8e7));
    }

    /// The agent's report reaches the loop before this host's receiver says it has ended (on a
    /// busy host its thread runs late): the bytes it read after the last boundary still land in
    /// the final interval, and the intervals add up to what it received.
    #[test]
    fn the_final_interval_is_closed_when_the_report_comes_first() {
        let spec = TestSpec {
            kind: TestKind::Throughput,
            protocol: Protocol::Tcp,
            direction: Direction::Reverse,
            streams: 1,
            msg_size: 131_072,
            bitrate_per_stream: 0,
            duration_ms: 1_000,
            interval_ms: 100,
            read_size: 0,
            socket: Default::default(),
            omit_ms: 0,
            skip_rx_copy: false,
            bytes: 0,
            blocks: 0,
            request_response: None,
        };
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let control = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let writer = Mutex::new(control);
        let (stops, expect, counters) = (
            [AtomicBool::new(false)],
            [AtomicU64::new(0)],
            [Counters::default()],
        );
        let clock = Clock::start();
        let mut state = Loop {
            spec: &spec,
            n: 1,
            stops: &stops,
            expect: &expect,
            counters: &counters,
            receivers: &[0],
            senders: &[],
            roles: vec![None],
            agent_sent: Vec::new(),
            report: None,
            intervals: Some(Intervals::new(100_000_000, vec![0])),
            interval_iface: None,
            client_intervals: Vec::new(),
            channels: &[],
            interval_tcp_info: Vec::new(),
            client_tcp_info: vec![None],
            interrupt: &AtomicBool::new(false),
            interrupted: false,
        };
        // Bytes arrive before the report and after it, and the receiver ends last.
        counters[0].add(1_000, 1);
        let (tx, rx) = mpsc::channel();
        tx.send(Event::Control(Ok(ControlMsg::Report(
            AgentReport::default(),
        ))))
        .unwrap();
        counters[0].add(2_500, 2);
        let received = TcpRecvOutcome {
            bytes: 3_500,
            reads: 3,
            ..TcpRecvOutcome::default()
        };
        tx.send(Event::Done(
            0,
            Ok((ClientRole::TcpReceived(received), None)),
        ))
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut seen = 0u64;
        state
            .drive(&rx, &writer, &clock, deadline, &mut |iv| {
                seen += iv.bytes;
            })
            .unwrap();
        let counted: u64 = state.client_intervals.iter().flat_map(|iv| &iv.bytes).sum();
        assert_eq!(counted, 3_500, "{:?}", state.client_intervals);
        assert_eq!(seen, 3_500, "every interval was shown as well");
        assert!(state.intervals.is_none(), "the final interval was cut");
    }
}
