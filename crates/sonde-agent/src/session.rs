//! One control connection: hello, admission, data channels, the test, the report.
//!
//! Besides the counts, a session tells the client what it ran on and what it cost:
//!
//! * `Accepted` (or `Description`, for `sonde conf`) carries this host's configuration for the
//!   interface that faces the client ([`sonde_net::hostinfo::collect_for_peer`], about 0.3 ms
//!   of `/proc` and `/sys` reads), once the client is admitted and, with a shared secret,
//!   authenticated; `Welcome` says nothing about the host.
//! * The report's `cpu` is the CPU time of this session's threads only (control, control
//!   reader, data streams, interval reporter), each counted with `RUSAGE_THREAD` by a
//!   [`ThreadsMeter`]: sessions running at once do not count each other. Its syscalls are the
//!   data loops' send/receive calls ([`Counters::syscalls`]), the latency echoes' included.
//! * TCP senders sample `TCP_INFO` per stream at every interval (`Interval.tcp_info`, sent
//!   even when the agent receives nothing, in reverse) and once when their loop ends
//!   (`SenderDone`). A message that would pass the frame limit goes without them.

use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use sonde_engine::interval::Intervals;
use sonde_net::bulk::{SendOutcome, TcpRecvOutcome, UdpRecvOutcome};
use sonde_net::control::{forward_frames, read_frame, write_frame, ControlError};
use sonde_net::cpu::ThreadsMeter;
use sonde_net::hostinfo::InterfaceSnapshot;
use sonde_net::socket::DataOptions;
use sonde_net::tcpinfo::TcpInfoSample;
use sonde_net::{Clock, Counters};
use sonde_wire::auth::{Nonce, SessionKey};
use sonde_wire::{
    AgentReport, AppliedSocketOptions, ControlMsg, CpuReport, IntervalStats, Preamble, Protocol,
    SessionId, StreamStats, TcpInfoStats, TestKind, TestSpec, Token, Tuning, TuningReport,
};

use crate::admission::Full;
use crate::control::{describe, peer_gone, refused};
use crate::conversation::running::{Action, Running, OVERRUN};
use crate::conversation::{Agent, Conversation, NotAdmitted, Output};
use crate::{lock, peer_of, AgentEvent, DataChannel, PendingGuard, Shared, Slot};

/// Runs a control connection to its end: the [`Conversation`] over `ctrl`, then the test.
/// Returns false when the peer never said a valid hello.
pub(crate) fn run(
    mut ctrl: TcpStream,
    preamble: Preamble,
    shared: &Arc<Shared>,
    pending: &mut Option<PendingGuard>,
) -> bool {
    let peer = peer_of(&ctrl);
    let version = preamble.check_version().map_err(|e| e.to_string());
    let mut talk = Conversation::new(Instant::now(), &shared.cfg, shared.local.port(), version);
    let mut held = Held::default();
    let mut body = Vec::new();
    loop {
        while let Some(output) = talk.poll() {
            match output {
                Output::Send(msg) => {
                    if write_frame(&mut ctrl, &msg).is_err() {
                        talk.handle_write_failed();
                    }
                }
                Output::ShutdownWrite => {
                    let _ = ctrl.shutdown(std::net::Shutdown::Write);
                }
                Output::Refused {
                    reason,
                    message,
                    unauthenticated,
                } => {
                    if unauthenticated {
                        shared
                            .rejections
                            .unauthenticated
                            .fetch_add(1, Ordering::Relaxed);
                    }
                    refused(shared, &ctrl, reason, message);
                }
                Output::Admitted { session, spec } => {
                    pending.take();
                    shared.stats.admitted(spec.kind);
                    shared.report(|| AgentEvent::SessionAdmitted {
                        session,
                        peer: peer.clone(),
                        test: describe(&spec),
                    });
                }
                Output::AwaitJoins => match held.slot.as_deref() {
                    Some(slot) if wait_for_channels(slot, shared, &ctrl, &mut talk) => {}
                    _ => talk.gave_up_joins(),
                },
                Output::Run {
                    session,
                    spec,
                    tuning,
                } => {
                    let token = held.registered.as_ref().map(|r| r.token);
                    let (Some(slot), Some(token)) = (held.slot.take(), token) else {
                        return true;
                    };
                    if spec.kind == TestKind::Crr {
                        crate::crr::run_session(ctrl, token, &slot, shared, session, &peer);
                        return true;
                    }
                    let channels: Option<Vec<DataChannel>> =
                        lock(&slot.channels).iter_mut().map(Option::take).collect();
                    let Some(channels) = channels else {
                        return true;
                    };
                    let outcome = Test::new(spec, channels, &slot, shared, tuning).run(ctrl);
                    shared.report(|| AgentEvent::SessionEnded {
                        session,
                        peer,
                        outcome,
                    });
                    return true;
                }
                Output::Help { target, test } => {
                    let Some(requester) = held.helper.as_ref().map(|h| h.1) else {
                        return true;
                    };
                    pending.take();
                    crate::helper::serve(ctrl, shared, requester, target, test);
                    return true;
                }
                Output::End { bad_hello } => return !bad_hello,
            }
        }
        let Some(deadline) = talk.poll_timeout() else {
            return true;
        };
        match read_frame(&mut ctrl, &mut body, deadline) {
            Ok(msg) => talk.handle(
                Instant::now(),
                msg,
                &mut Admit::new(shared, &ctrl, &mut held),
            ),
            Err(ControlError::Timeout(_)) => talk.handle_timeout(deadline.max(Instant::now())),
            Err(_) => talk.handle_lost(),
        }
    }
}

/// What an admitted session holds while it runs: its place among the agent's sessions (freed
/// when it ends, however it ends), the data channels it waits for, its mesh link, and a helper
/// request's place.
#[derive(Default)]
struct Held<'a> {
    slot: Option<Arc<Slot>>,
    registered: Option<Registered<'a>>,
    link: Option<crate::LinkTest>,
    /// A helper request's place, and the requester's address.
    helper: Option<(crate::CompatSession<'a>, std::net::SocketAddr)>,
}

/// The agent around a [`Conversation`] on one control connection.
struct Admit<'s, 'h> {
    shared: &'s Arc<Shared>,
    ctrl: &'h TcpStream,
    held: &'h mut Held<'s>,
}

impl<'s, 'h> Admit<'s, 'h> {
    fn new(shared: &'s Arc<Shared>, ctrl: &'h TcpStream, held: &'h mut Held<'s>) -> Self {
        Self { shared, ctrl, held }
    }
}

impl Agent for Admit<'_, '_> {
    fn nonce(&mut self) -> Option<Nonce> {
        crate::random_nonce()
    }

    fn next_session(&mut self) -> SessionId {
        SessionId(self.shared.next_session.fetch_add(1, Ordering::Relaxed))
    }

    fn shutting_down(&self) -> bool {
        self.shared.shutdown.load(Ordering::Relaxed)
    }

    fn admit(
        &mut self,
        spec: &TestSpec,
        key: Option<&SessionKey>,
        token: Option<Token>,
    ) -> Result<Token, NotAdmitted> {
        let shared = self.shared;
        let Ok(peer_addr) = self.ctrl.peer_addr() else {
            return Err(NotAdmitted::Gone);
        };
        let channels = usize::try_from(spec.channels()).unwrap_or(usize::MAX);
        let slot = Arc::new(Slot {
            peer_ip: peer_addr.ip(),
            spec: spec.clone(),
            channels: Mutex::new((0..channels).map(|_| None).collect()),
            joined: std::sync::Condvar::new(),
            closed: AtomicBool::new(false),
            overlap: std::sync::atomic::AtomicU32::new(0),
            key: key.cloned(),
        });
        let token = shared
            .admit(Arc::clone(&slot), token)
            .map_err(NotAdmitted::Full)?
            .ok_or(NotAdmitted::TokenTaken)?;
        self.held.registered = Some(Registered { shared, token });
        // Mesh mode: one throughput or pps test on a link at a time, whichever end starts it.
        if let (Some(links), TestKind::Throughput | TestKind::Pps) =
            (&shared.cfg.link_tests, spec.kind)
        {
            let local = self.ctrl.local_addr().map_or(peer_addr.ip(), |a| a.ip());
            match links.serve_incoming(local, peer_addr.ip()) {
                Ok(link) => self.held.link = Some(link),
                // Still registered until the conversation ends, as every refused session.
                Err(crate::LinkBusy) => return Err(NotAdmitted::LinkBusy),
            }
        }
        self.held.slot = Some(slot);
        Ok(token)
    }

    fn admit_helper(&mut self) -> Result<(), NotAdmitted> {
        let Ok(peer) = self.ctrl.peer_addr() else {
            return Err(NotAdmitted::Gone);
        };
        let session = self.shared.admit_compat(peer.ip());
        self.held.helper = Some((session.ok_or(NotAdmitted::Full(Full::Listener))?, peer));
        Ok(())
    }

    fn host(&mut self) -> Option<Box<sonde_wire::HostInfo>> {
        host_for(self.ctrl)
    }

    fn tag(&mut self) -> Option<sonde_wire::AgentTag> {
        Some(sonde_wire::AgentTag {
            id: self.shared.agent_id,
            addr: self.ctrl.local_addr().ok()?.to_string(),
        })
    }

    fn try_socket(&mut self, spec: &TestSpec) -> Result<(), String> {
        if spec.socket.is_default() {
            return Ok(());
        }
        let (Ok(local), Ok(peer)) = (self.ctrl.local_addr(), self.ctrl.peer_addr()) else {
            return Ok(());
        };
        let opts = DataOptions::from(&spec.socket);
        opts.try_on(local, peer.ip(), spec.protocol == Protocol::Tcp)
            .map(drop)
            .map_err(|e| format!("{}: {}", e.flag(), e.explain()))
    }
}

/// Removes the session from the agent when it ends, however it ends.
struct Registered<'a> {
    shared: &'a Shared,
    token: Token,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.shared.slots().remove(&self.token);
    }
}

/// The agent's configuration as the client on `ctrl` sees it: the interface its traffic comes
/// in by. Sent only to admitted (and, with a secret, authenticated) clients.
fn host_for(ctrl: &TcpStream) -> Option<Box<sonde_wire::HostInfo>> {
    ctrl.peer_addr().ok().map(|peer| {
        Box::new(sonde_net::hostinfo::collect_for_peer(
            env!("CARGO_PKG_VERSION"),
            peer.ip(),
        ))
    })
}

/// Waits for every data channel to join, until the conversation's join deadline; gives up then,
/// at shutdown, or when the client closes its control connection. Tells `talk` which.
fn wait_for_channels(
    slot: &Slot,
    shared: &Shared,
    ctrl: &TcpStream,
    talk: &mut Conversation<'_>,
) -> bool {
    let Some(deadline) = talk.poll_timeout() else {
        return false;
    };
    let mut channels = lock(&slot.channels);
    loop {
        if channels.iter().all(Option::is_some) {
            slot.closed.store(true, Ordering::Relaxed);
            drop(channels);
            talk.joined();
            return true;
        }
        let now = Instant::now();
        if now >= deadline {
            slot.closed.store(true, Ordering::Relaxed);
            drop(channels);
            talk.handle_timeout(now);
            return true;
        }
        if shared.shutdown.load(Ordering::Relaxed) || peer_gone(ctrl) {
            slot.closed.store(true, Ordering::Relaxed);
            return false;
        }
        let wait = (deadline - now).min(Duration::from_millis(200));
        channels = slot
            .joined
            .wait_timeout(channels, wait)
            .map_or_else(|e| e.into_inner().0, |(g, _)| g);
    }
}

/// What one data channel's thread came back with.
enum RoleOutcome {
    /// What the sender sent, and (TCP) its connection's `TCP_INFO` at the end.
    Sent(SendOutcome, Option<Box<TcpInfoStats>>),
    TcpReceived(TcpRecvOutcome),
    UdpReceived(Box<UdpRecvOutcome>),
    Echoed,
    Failed(String),
}

enum Event {
    /// Boxed: a `Report` is the largest control message by far, and events are few.
    Control(Result<Box<ControlMsg>, ControlError>),
    Done(usize, RoleOutcome),
}

/// The running part of a session.
struct Test<'a> {
    spec: TestSpec,
    channels: Vec<DataChannel>,
    slot: &'a Slot,
    shared: &'a Shared,
    stops: Vec<AtomicBool>,
    expect: Vec<AtomicU64>,
    counters: Vec<Counters>,
    /// Set when every receiving stream has finished: ends the interval reporter.
    received_all: AtomicBool,
    /// When the client said `Go`, ns on the test clock (`u64::MAX` before): senders start then.
    go_at_ns: AtomicU64,
    /// The CPU of this session's threads, from the start of the test.
    cpu: ThreadsMeter,
    /// Busy polling and pinning the client asked for (latency).
    tuning: Tuning,
    /// How the echoes ran when `tuning` asked for anything: one entry per echo.
    tuned: Mutex<Vec<TuningReport>>,
}

impl<'a> Test<'a> {
    fn new(
        spec: TestSpec,
        channels: Vec<DataChannel>,
        slot: &'a Slot,
        shared: &'a Shared,
        tuning: Tuning,
    ) -> Self {
        let n = channels.len();
        Self {
            spec,
            channels,
            slot,
            shared,
            stops: (0..n).map(|_| AtomicBool::new(false)).collect(),
            expect: (0..n).map(|_| AtomicU64::new(u64::MAX)).collect(),
            counters: (0..n).map(|_| Counters::default()).collect(),
            received_all: AtomicBool::new(false),
            go_at_ns: AtomicU64::new(u64::MAX),
            cpu: ThreadsMeter::start(),
            tuning,
            tuned: Mutex::new(Vec::new()),
        }
    }

    /// Applies the client's [`Tuning`] to the calling data thread (a latency echo, or one
    /// stream or flow of a throughput or pps test) and its socket: pins the thread to the
    /// agent's next CPU; for an echo, makes the socket non-blocking (the echo then spins,
    /// bounded by its stop flag) with `SO_BUSY_POLL` where permitted. What was done goes into
    /// the report; what could not be done is noted there, and the loop runs anyway.
    fn tune_thread(&self, channel: &DataChannel) -> Option<sonde_net::tune::Pinned> {
        let mut done = TuningReport::default();
        let mut notes = Vec::new();
        let pinned = if self.tuning.pin {
            match self
                .shared
                .next_cpu()
                .and_then(sonde_net::tune::pin_current_thread)
            {
                Ok(p) => {
                    done.cpus.push(p.cpu());
                    Some(p)
                }
                Err(e) => {
                    notes.push(format!("not pinned: {e}"));
                    None
                }
            }
        } else {
            None
        };
        if self.tuning.busy_poll && self.spec.kind != TestKind::Latency {
            // The bulk loops block with a timeout (they set their sockets blocking).
            notes.push("busy polling applies to latency tests only".into());
        } else if self.tuning.busy_poll {
            let busy = match channel {
                DataChannel::Tcp(s) => sonde_net::tune::busy_poll_tcp(s),
                DataChannel::Udp(s) => sonde_net::tune::busy_poll_udp(s),
            };
            match busy {
                Ok(b) => {
                    done.busy_poll = true;
                    done.so_busy_poll_us = b.so_busy_poll_us;
                }
                Err(e) => notes.push(format!("not busy-polled: {e}")),
            }
        }
        if !notes.is_empty() {
            done.note = Some(notes.join("; "));
        }
        lock(&self.tuned).push(done);
        pinned
    }

    /// The report's `tuning`: the echoes' reports merged (`None` when nothing was asked).
    fn tuning_report(&self) -> Option<TuningReport> {
        if self.tuning.is_default() {
            return None;
        }
        let tuned = lock(&self.tuned);
        let mut out = TuningReport {
            busy_poll: !tuned.is_empty() && tuned.iter().all(|t| t.busy_poll),
            so_busy_poll_us: tuned.iter().find_map(|t| t.so_busy_poll_us),
            cpus: {
                let mut cpus: Vec<u32> = tuned.iter().flat_map(|t| t.cpus.clone()).collect();
                cpus.sort_unstable();
                cpus.dedup();
                cpus
            },
            note: None,
        };
        let mut notes: Vec<&str> = tuned.iter().filter_map(|t| t.note.as_deref()).collect();
        notes.dedup();
        if !notes.is_empty() {
            out.note = Some(notes.join("; "));
        }
        Some(out)
    }

    fn agent_receives(&self, i: usize) -> bool {
        self.spec.kind != TestKind::Latency && self.spec.client_sends(index_u32(i))
    }

    fn agent_sends(&self, i: usize) -> bool {
        self.spec.kind != TestKind::Latency && !self.spec.client_sends(index_u32(i))
    }

    fn stop_all(&self) {
        for s in &self.stops {
            s.store(true, Ordering::Relaxed);
        }
    }

    /// Runs the test; returns a line for the agent's log.
    fn run(self, ctrl: TcpStream) -> String {
        let Ok(reader) = ctrl.try_clone() else {
            return "ended: cannot clone the control socket".into();
        };
        let this_thread = self.cpu.track();
        let socket = match self.apply_socket() {
            Ok(applied) => applied,
            Err(why) => {
                let mut ctrl = ctrl;
                let _ = write_frame(
                    &mut ctrl,
                    &ControlMsg::Error {
                        message: why.clone(),
                    },
                );
                return format!("ended: {why}");
            }
        };
        // The interface toward the client, counted from here to the report.
        let interface = ctrl
            .peer_addr()
            .ok()
            .and_then(|p| InterfaceSnapshot::toward(p.ip()));
        let writer = Mutex::new(ctrl);
        let (tx, rx) = mpsc::channel::<Event>();
        let clock = Clock::start();
        let duration = Duration::from_millis(self.spec.duration_ms);
        let until_ns = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
        // `-O`: the senders send the omit period on top of the duration.
        let omit = Duration::from_millis(self.spec.omit_ms);
        let hard_deadline = Instant::now() + omit + duration + OVERRUN;
        let mut intervals_out: Vec<IntervalStats> = Vec::new();
        let reader_stop = AtomicBool::new(false);

        let result = thread::scope(|scope| {
            let ctrl_tx = tx.clone();
            let cpu = &self.cpu;
            let reader_stop = &reader_stop;
            scope.spawn(move || {
                let _counted = cpu.track();
                forward_frames(reader, hard_deadline, reader_stop, |m| {
                    ctrl_tx.send(Event::Control(m.map(Box::new))).is_ok()
                });
            });
            // A many-flow latency test: its flows shared by a few threads' readiness loops.
            let rr_groups = self.rr_groups();
            let pooled = !rr_groups.is_empty();
            for group in rr_groups {
                let tx = tx.clone();
                let this = &self;
                scope.spawn(move || {
                    let _counted = this.cpu.track();
                    let outcome = this.serve_flows(group.clone());
                    for i in group.clone() {
                        let o = match &outcome {
                            Ok(()) => RoleOutcome::Echoed,
                            Err(why) => RoleOutcome::Failed(why.clone()),
                        };
                        let _ = tx.send(Event::Done(i, o));
                    }
                });
            }
            for (i, channel) in self.channels.iter().enumerate() {
                if pooled {
                    break;
                }
                let tx = tx.clone();
                let this = &self;
                scope.spawn(move || {
                    let _counted = this.cpu.track();
                    let outcome = this.role(i, channel, &clock, until_ns);
                    let bytes = match &outcome {
                        RoleOutcome::Sent(sent, _) => sent.bytes,
                        RoleOutcome::TcpReceived(received) => received.bytes,
                        RoleOutcome::UdpReceived(received) => received.bytes,
                        RoleOutcome::Echoed | RoleOutcome::Failed(_) => 0,
                    };
                    this.shared
                        .stats
                        .served_bytes
                        .fetch_add(bytes, Ordering::Relaxed);
                    let _ = tx.send(Event::Done(i, outcome));
                });
            }
            let receivers: Vec<usize> = (0..self.channels.len())
                .filter(|&i| self.agent_receives(i))
                .collect();
            // TCP senders are sampled at every interval too, so a reverse test has a reporter.
            let tcp_senders: Vec<usize> = (0..self.channels.len())
                .filter(|&i| self.agent_sends(i) && self.spec.protocol == Protocol::Tcp)
                .collect();
            let reporting = !receivers.is_empty() || !tcp_senders.is_empty();
            let reporter = (self.spec.interval_ms > 0 && reporting).then(|| {
                let this = &self;
                let writer = &writer;
                let receivers = receivers.clone();
                // `-i`: the interface's counters per interval, from this reading on.
                let iface = interface.as_ref().map(InterfaceSnapshot::counters_only);
                scope.spawn(move || {
                    let _counted = this.cpu.track();
                    this.report_intervals(&receivers, &tcp_senders, &clock, writer, iface)
                })
            });
            if write_frame(&mut lock(&writer), &ControlMsg::Ready).is_err() {
                self.stop_all();
            }
            let result = self.drive(&rx, &writer, hard_deadline, &clock);
            self.received_all.store(true, Ordering::Relaxed);
            self.stop_all();
            if let Some(r) = reporter {
                intervals_out = r.join().unwrap_or_default();
            }
            // End the control reader (not by shutting the read side: see forward_frames).
            reader_stop.store(true, Ordering::Relaxed);
            result
        });
        match result {
            Ok(mut report) => {
                report.intervals = intervals_out;
                report.overlapping_sessions = self.slot.overlap.load(Ordering::Relaxed);
                report.socket = socket.map(Box::new);
                report.interface = interface
                    .as_ref()
                    .and_then(InterfaceSnapshot::delta)
                    .map(Box::new);
                // Every other thread of the session has ended: the sum is complete.
                drop(this_thread);
                report.cpu = self.cpu_report();
                let mut w = lock(&writer);
                if write_shrinking(&mut w, ControlMsg::Report(report)).is_err() {
                    return "ended before its report was delivered".into();
                }
                // Give the client time to read the report before the close.
                let _ = w.shutdown(std::net::Shutdown::Write);
                "finished".into()
            }
            Err(why) => {
                let _ = write_frame(
                    &mut lock(&writer),
                    &ControlMsg::Error {
                        message: why.clone(),
                    },
                );
                format!("ended: {why}")
            }
        }
    }

    /// The session's event loop: control messages in, roles finishing, deadlines.
    fn drive(
        &self,
        rx: &mpsc::Receiver<Event>,
        writer: &Mutex<TcpStream>,
        hard_deadline: Instant,
        clock: &Clock,
    ) -> Result<AgentReport, String> {
        let n = self.channels.len();
        let mut outcomes: Vec<Option<RoleOutcome>> = (0..n).map(|_| None).collect();
        let senders: Vec<usize> = (0..n).filter(|&i| self.agent_sends(i)).collect();
        let sends = (0..n).map(|i| self.agent_sends(i)).collect();
        let mut test = Running::new(Instant::now(), hard_deadline, sends);
        loop {
            while let Some(action) = test.poll() {
                match action {
                    Action::Go => self.go_at_ns.store(clock.now_ns(), Ordering::Release),
                    Action::Expect { stream, packets } => {
                        self.expect[stream].store(packets, Ordering::Relaxed);
                    }
                    Action::StopReceivers => {
                        // A capped TCP receiver would read what the client's socket buffers
                        // still hold (megabytes a stream) at its share of the cap: it stops
                        // here too, that data unread and uncounted, so the test ends a second
                        // after the client's senders.
                        let capped_tcp = self.read_cap().is_some();
                        for (i, stop) in self.stops.iter().enumerate() {
                            if (self.spec.protocol == Protocol::Udp || capped_tcp)
                                && self.agent_receives(i)
                            {
                                stop.store(true, Ordering::Relaxed);
                            }
                        }
                    }
                    Action::StopAll => self.stop_all(),
                    Action::AnswerClock { client_send_ns } => {
                        crate::clock::answer(client_send_ns, writer)?;
                    }
                    Action::SendSenderDone => {
                        let streams = senders
                            .iter()
                            .filter_map(|&s| match &outcomes[s] {
                                Some(RoleOutcome::Sent(o, info)) => {
                                    Some(sent_stats(s, o, info.as_deref().copied()))
                                }
                                _ => None,
                            })
                            .collect();
                        let msg = ControlMsg::SenderDone { streams };
                        if write_shrinking(&mut lock(writer), msg).is_err() {
                            test.handle_write_failed(None);
                        }
                    }
                    Action::Fail(why) => return Err(why),
                }
            }
            if test.is_over() {
                break;
            }
            let now = Instant::now();
            test.handle_timeout(now);
            if self.shared.shutdown.load(Ordering::Relaxed) {
                test.shutting_down();
            }
            if test.has_output() {
                continue;
            }
            match rx.recv_timeout(Duration::from_millis(50)) {
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return Err("internal: event loop".into()),
                Ok(Event::Control(Ok(msg))) => test.handle(Instant::now(), *msg),
                Ok(Event::Control(Err(e))) => test.handle_lost(&e.to_string()),
                Ok(Event::Done(i, outcome)) => {
                    let failure = match &outcome {
                        RoleOutcome::Failed(why) => Some(why.clone()),
                        _ => None,
                    };
                    let stopped = self.stops[i].load(Ordering::Relaxed);
                    if failure.is_none() || stopped {
                        outcomes[i] = Some(outcome);
                    }
                    test.stream_ended(i, failure.as_deref(), stopped);
                }
            }
        }
        let client_sent = test.client_sent();
        let mut report = AgentReport::default();
        for (i, outcome) in outcomes.into_iter().enumerate() {
            let stream = index_u32(i);
            match outcome {
                // The final TCP_INFO went with `SenderDone`; the report stays small.
                Some(RoleOutcome::Sent(o, _)) => report.sent.push(sent_stats(i, &o, None)),
                Some(RoleOutcome::TcpReceived(o)) => {
                    report.read_size = Some(self.spec.tcp_read_size());
                    report.skip_rx_copy = Some(self.spec.skip_rx_copy);
                    report.received.push(StreamStats {
                        stream,
                        bytes: o.bytes,
                        packets: o.reads,
                        active_ns: o.last_ns.saturating_sub(o.first_ns),
                        omitted_bytes: o.omitted_bytes,
                        ..StreamStats::default()
                    });
                }
                Some(RoleOutcome::UdpReceived(o)) => {
                    report.received.push(StreamStats {
                        stream,
                        bytes: o.bytes,
                        packets: o.seq.received(),
                        active_ns: o.last_ns.saturating_sub(o.first_ns),
                        lost: client_sent[i].map(|sent| o.lost(sent)),
                        duplicated: Some(o.seq.duplicated()),
                        reordered: Some(o.seq.reordered()),
                        jitter_ns: Some(o.jitter.jitter_ns()),
                        retransmits: None,
                        tcp_info: None,
                        peer: None,
                        omitted_bytes: o.omitted_bytes(),
                        omitted_packets: o.omitted_packets(),
                        zerocopy: None,
                        ecn: o.ecn,
                    });
                }
                Some(RoleOutcome::Echoed) => {
                    let (bytes, packets) = self.counters[i].load();
                    // A TCP echo's TCP_INFO as it ended: the MSS it settled on (`sonde mtu`).
                    let tcp_info = match &self.channels[i] {
                        DataChannel::Tcp(s) => TcpInfoSample::read(s).ok().map(|t| t.stats(stream)),
                        DataChannel::Udp(_) => None,
                    };
                    report.echoed.push(StreamStats {
                        stream,
                        bytes,
                        packets,
                        tcp_info,
                        ..StreamStats::default()
                    });
                }
                Some(RoleOutcome::Failed(_)) | None => {}
            }
        }
        // A many-flow test's flows, up to `--max-latency-flows` of them, would not fit the
        // report's frame one by one: their sum, as stream 0 (the client counts each flow).
        if self.spec.request_response.is_some() && report.echoed.len() > 1 {
            let flows = std::mem::take(&mut report.echoed);
            report.echoed.push(StreamStats {
                stream: 0,
                bytes: flows.iter().map(|f| f.bytes).sum(),
                packets: flows.iter().map(|f| f.packets).sum(),
                ..StreamStats::default()
            });
        }
        report.tuning = self.tuning_report().map(Box::new);
        // Where each stream came from, as this end saw it (a NAT in the path shows).
        for stats in report
            .received
            .iter_mut()
            .chain(&mut report.sent)
            .chain(&mut report.echoed)
        {
            stats.peer = usize::try_from(stats.stream)
                .ok()
                .and_then(|i| self.channels.get(i))
                .and_then(|channel| match channel {
                    DataChannel::Tcp(s) => s.peer_addr().ok(),
                    DataChannel::Udp(s) => s.peer_addr().ok(),
                })
                // A v4-mapped peer of a dual-stack socket is an IPv4 client.
                .map(|a| SocketAddr::new(a.ip().to_canonical(), a.port()));
        }
        Ok(report)
    }

    /// A many-flow latency test's flows in contiguous groups, one per thread: as many threads
    /// as the client asked, else one per available core, at most one per flow. Empty for any
    /// other test.
    fn rr_groups(&self) -> Vec<std::ops::Range<usize>> {
        let Some(rr) = self
            .spec
            .request_response
            .filter(|_| self.spec.kind == TestKind::Latency)
        else {
            return Vec::new();
        };
        let n = self.channels.len();
        let cores = thread::available_parallelism().map_or(1, std::num::NonZero::get);
        let threads = if rr.threads == 0 {
            cores
        } else {
            rr.threads as usize
        }
        .clamp(1, n.max(1));
        (0..threads)
            .map(|t| t * n / threads..(t + 1) * n / threads)
            .filter(|r| !r.is_empty())
            .collect()
    }

    /// One thread of a many-flow latency test: answers the requests of the flows in `group`
    /// until they close or the test stops; pinned (and spinning) as the client asked.
    fn serve_flows(&self, group: std::ops::Range<usize>) -> Result<(), String> {
        let Some(rr) = self.spec.request_response else {
            return Ok(());
        };
        let _pinned = if self.tuning.is_default() {
            None
        } else {
            self.tune_thread(&self.channels[group.start])
        };
        // `--busy-poll`: `SO_BUSY_POLL` on the group's other flows too (`tune_thread` set the
        // first and reports it); best effort, as there.
        if self.tuning.busy_poll {
            for c in &self.channels[group.start + 1..group.end] {
                let _ = match c {
                    DataChannel::Tcp(s) => sonde_net::tune::busy_poll_tcp(s),
                    DataChannel::Udp(s) => sonde_net::tune::busy_poll_udp(s),
                };
            }
        }
        let stop = &self.stops[group.start];
        let counters: Vec<&Counters> = self.counters[group.clone()].iter().collect();
        let spin = self.tuning.busy_poll;
        let echo = sonde_net::latency::rr::RrEcho {
            request_size: self.spec.msg_size,
            response_size: rr.response_size,
            depth: rr.depth,
            spin,
        };
        let tcp: Vec<&TcpStream> = self.channels[group.clone()]
            .iter()
            .filter_map(|c| match c {
                DataChannel::Tcp(s) => Some(s),
                DataChannel::Udp(_) => None,
            })
            .collect();
        let r = if tcp.is_empty() {
            let udp: Vec<&std::net::UdpSocket> = self.channels[group]
                .iter()
                .filter_map(|c| match c {
                    DataChannel::Udp(s) => Some(s),
                    DataChannel::Tcp(_) => None,
                })
                .collect();
            sonde_net::latency::rr::echo(&udp, &echo, stop, &counters)
        } else {
            sonde_net::latency::rr::echo(&tcp, &echo, stop, &counters)
        };
        r.map_err(|e| e.to_string())
    }

    /// Waits for the client's `Go`; returns when it came (ns on the test clock), or `None` when
    /// the test was stopped first.
    fn wait_for_go(&self, stop: &AtomicBool) -> Option<u64> {
        loop {
            let go = self.go_at_ns.load(Ordering::Acquire);
            if go != u64::MAX {
                return Some(go);
            }
            if stop.load(Ordering::Relaxed) {
                return None;
            }
            thread::sleep(Duration::from_micros(200));
        }
    }

    /// One data channel's part, on its own thread. Senders start at the client's `Go` and send
    /// for the test's duration from there.
    fn role(
        &self,
        i: usize,
        channel: &DataChannel,
        clock: &Clock,
        duration_ns: u64,
    ) -> RoleOutcome {
        let stop = &self.stops[i];
        // Pinned (and, for an echo, busy-polled) for the loop, when the client asked.
        let _pinned = if self.tuning.is_default() {
            None
        } else {
            self.tune_thread(channel)
        };
        if self.agent_sends(i) {
            let Some(go) = self.wait_for_go(stop) else {
                return RoleOutcome::Sent(SendOutcome::default(), None);
            };
            // `-O`: the senders send the omit period first, then the test's duration.
            let omit_until = go.saturating_add(omit_ns(&self.spec));
            return self.send(i, channel, clock, omit_until, duration_ns);
        }
        let counters = &self.counters[i];
        let spec = &self.spec;
        let failed = |e: std::io::Error| RoleOutcome::Failed(e.to_string());
        match channel {
            DataChannel::Tcp(s) if spec.kind == TestKind::Latency => {
                sonde_net::latency::echo(s, stop, counters)
                    .map_or_else(failed, |()| RoleOutcome::Echoed)
            }
            DataChannel::Udp(s) if spec.kind == TestKind::Latency => {
                sonde_net::latency::echo(s, stop, counters)
                    .map_or_else(failed, |()| RoleOutcome::Echoed)
            }
            // `-O`: the receiver's first `omit_ms` from the client's `Go`, as the senders'. The
            // client starts sending just before it says `Go`, but not always just after `Ready`
            // (a helper holds there for the common start): counted from `Ready`, the omit period
            // could be over before the first byte. Reading starts at `Go`, which leaves what came
            // before it queued in the socket, not lost (TCP only).
            DataChannel::Tcp(s) => {
                let omit_until_ns = if spec.omit_ms == 0 {
                    0
                } else {
                    // Stopped before `Go`: nothing to omit, and the read below ends at once.
                    self.wait_for_go(stop)
                        .map_or(0, |go| go.saturating_add(omit_ns(spec)))
                };
                let opts = sonde_net::bulk::TcpRecvOptions {
                    read_size: spec.tcp_read_size(),
                    omit_until_ns,
                    discard: spec.skip_rx_copy,
                    max_bytes_per_second: self.read_cap(),
                };
                sonde_net::bulk::tcp_recv(s, &opts, clock, stop, counters)
                    .map_or_else(failed, RoleOutcome::TcpReceived)
            }
            // `--ecn`: the receiver counts the marks its datagrams arrive with.
            // `-O`: the omit period starts at the client's `Go`, which the loop learns when it
            // comes (datagrams may arrive before it, and a UDP receiver cannot wait to read).
            DataChannel::Udp(s) => {
                let opts = sonde_net::bulk::UdpRecvOptions {
                    msg_size: spec.msg_size,
                    format: sonde_net::bulk::UdpFormat::sonde(spec),
                    ecn: spec.socket.ecn_asked(),
                    omit: (spec.omit_ms > 0).then_some(sonde_net::bulk::UdpOmit {
                        from_ns: &self.go_at_ns,
                        omit_ns: omit_ns(spec),
                    }),
                };
                sonde_net::bulk::udp_recv_with(s, &opts, clock, stop, &self.expect[i], counters)
                    .map_or_else(failed, |o| RoleOutcome::UdpReceived(Box::new(o)))
            }
        }
    }

    /// Sends from now until `duration_ns` after `omit_until_ns` on `clock`, what goes before
    /// that omitted from the counts (`-O`, TCP).
    fn send(
        &self,
        i: usize,
        channel: &DataChannel,
        clock: &Clock,
        omit_until_ns: u64,
        duration_ns: u64,
    ) -> RoleOutcome {
        let until_ns = omit_until_ns.saturating_add(duration_ns);
        let (stop, counters, spec) = (&self.stops[i], &self.counters[i], &self.spec);
        let failed = |e: std::io::Error| RoleOutcome::Failed(e.to_string());
        match channel {
            DataChannel::Tcp(s) => {
                if let Err(e) = self.pace(s) {
                    return failed(e);
                }
                let opts = sonde_net::bulk::TcpSendOptions {
                    omit_until_ns,
                    max_bytes: spec.send_limit(index_u32(i)),
                    zerocopy: spec.socket.zerocopy,
                    ..sonde_net::bulk::TcpSendOptions::until(spec.msg_size, until_ns)
                };
                sonde_net::bulk::tcp_send(s, &opts, clock, stop, counters).map_or_else(
                    failed,
                    |o| {
                        let info = TcpInfoSample::read(s).ok().map(|t| t.stats(index_u32(i)));
                        RoleOutcome::Sent(o, info.map(Box::new))
                    },
                )
            }
            DataChannel::Udp(s) => {
                let opts = sonde_net::bulk::UdpSendOptions {
                    msg_size: spec.msg_size,
                    bits_per_second: spec.bitrate_per_stream,
                    format: sonde_net::bulk::UdpFormat::sonde(spec),
                    gso: true,
                    until_ns,
                    omit_until_ns,
                    max_bytes: spec.send_limit(index_u32(i)),
                };
                sonde_net::bulk::udp_send_with(s, &opts, clock, stop, counters)
                    .map_or_else(failed, |o| RoleOutcome::Sent(o, None))
            }
        }
    }

    /// Sets the client's socket options ([`TestSpec::socket`]) on the agent's end of every
    /// stream before `Ready` (the pacing rate on the streams the agent sends on only), and reads
    /// back what the kernel made of them: `None` when nothing was asked. The admission tried
    /// them on a throwaway socket already, so a failure here is rare: it ends the test with
    /// the option and the kernel's reason.
    fn apply_socket(&self) -> Result<Option<AppliedSocketOptions>, String> {
        let asked = &self.spec.socket;
        if asked.is_default() {
            return Ok(None);
        }
        let sending = DataOptions::from(asked);
        // Pacing and zero-copy sends are a sender's: a receiving stream is not asked for them
        // (an agent whose platform has no SO_ZEROCOPY still receives a -Z test).
        let receiving = DataOptions {
            max_pacing_rate_bytes_per_second: None,
            zerocopy: false,
            ..sending.clone()
        };
        let tcp = self.spec.protocol == Protocol::Tcp;
        let mut first: Option<AppliedSocketOptions> = None;
        for (i, channel) in self.channels.iter().enumerate() {
            let sends = self.agent_sends(i);
            let opts = if sends { &sending } else { &receiving };
            let applied = match channel {
                DataChannel::Tcp(s) => opts.apply_tcp(s),
                DataChannel::Udp(s) => opts.apply_udp(s),
            }
            .map_err(|e| format!("{}: {}", e.flag(), e.explain()))?;
            let wire = applied.to_wire(asked, tcp);
            match &mut first {
                None => first = Some(wire),
                // The pacing rate and zero-copy as the first sending stream has them.
                Some(f) if sends => {
                    if f.pacing_bits_per_second.is_none() {
                        f.pacing_bits_per_second = wire.pacing_bits_per_second;
                        f.note = f.note.take().or(wire.note);
                    }
                    f.zerocopy = f.zerocopy.or(wire.zerocopy);
                }
                Some(_) => {}
            }
        }
        Ok(first)
    }

    /// With `max_bitrate`, paces a sending TCP stream to its share of the cap
    /// (`SO_MAX_PACING_RATE`: the kernel holds the stream to it, with fq or TCP's own pacing).
    fn pace(&self, s: &TcpStream) -> std::io::Result<()> {
        let Some(cap) = self.shared.cfg.max_bitrate else {
            return Ok(());
        };
        let senders = (0..self.channels.len())
            .filter(|&i| self.agent_sends(i))
            .count();
        let share = (cap / 8 / u64::try_from(senders.max(1)).unwrap_or(1)).max(1);
        // A lower rate the client asked for (`--fq-rate`) stays.
        let asked = DataOptions::from(&self.spec.socket).max_pacing_rate_bytes_per_second;
        let options = sonde_net::socket::DataOptions {
            max_pacing_rate_bytes_per_second: Some(asked.map_or(share, |r| r.min(share))),
            ..sonde_net::socket::DataOptions::default()
        };
        options
            .apply_tcp(s)
            .map(|_| ())
            .map_err(|e| std::io::Error::other(e.to_string()))
    }

    /// With `max_bitrate`, what each receiving TCP stream may read, bytes per second: its share
    /// of the cap. Reading no faster leaves the rest in the receive queue, and TCP flow control
    /// holds the client's sender to it.
    fn read_cap(&self) -> Option<u64> {
        let cap = self.shared.cfg.max_bitrate?;
        let receivers = (0..self.channels.len())
            .filter(|&i| self.agent_receives(i))
            .count();
        Some((cap / 8 / u64::try_from(receivers.max(1)).unwrap_or(1)).max(1))
    }

    /// What this session cost the agent, from its meter and its data loops' counters.
    fn cpu_report(&self) -> Option<CpuReport> {
        let cost = self.cpu.cost()?;
        Some(sonde_net::cpu::loops_report(
            &cost,
            &self.spec,
            &self.counters,
            true,
        ))
    }

    /// `TCP_INFO` of the given sending streams now (those whose socket can say).
    fn tcp_info_of(&self, senders: &[usize]) -> Vec<TcpInfoStats> {
        senders
            .iter()
            .filter_map(|&i| match &self.channels[i] {
                DataChannel::Tcp(s) => TcpInfoSample::read(s).ok().map(|t| t.stats(index_u32(i))),
                DataChannel::Udp(_) => None,
            })
            .collect()
    }

    /// Sends the receiving streams' counts, the TCP senders' `TCP_INFO` and what the interface
    /// `iface` counted, every interval; returns the receivers' intervals (without `TCP_INFO`:
    /// the client has it already).
    fn report_intervals(
        &self,
        receivers: &[usize],
        tcp_senders: &[usize],
        clock: &Clock,
        writer: &Mutex<TcpStream>,
        mut iface: Option<InterfaceSnapshot>,
    ) -> Vec<IntervalStats> {
        let interval_ns = self.spec.interval_ms.saturating_mul(1_000_000);
        let streams = receivers.iter().map(|&i| index_u32(i)).collect();
        let mut cutter = Intervals::new(interval_ns, streams);
        let mut out = Vec::new();
        let sample =
            || -> Vec<(u64, u64)> { receivers.iter().map(|&i| self.counters[i].load()).collect() };
        while !self.received_all.load(Ordering::Relaxed) {
            let now = clock.now_ns();
            let next = cutter.next_boundary_ns();
            if now < next {
                let wait = Duration::from_nanos(next - now).min(Duration::from_millis(50));
                thread::sleep(wait);
                continue;
            }
            if let Some(mut iv) = cutter.poll(clock.now_ns(), &sample()) {
                iv.interface = iface
                    .as_mut()
                    .and_then(InterfaceSnapshot::interval)
                    .map(Box::new);
                iv.tcp_info = self.tcp_info_of(tcp_senders);
                let _ = write_shrinking(&mut lock(writer), ControlMsg::Interval(iv.clone()));
                iv.tcp_info.clear();
                if !receivers.is_empty() {
                    out.push(iv);
                }
            }
        }
        // A boundary passed since the last cut is cut first, so the last interval is only the
        // part after the last boundary.
        let now = clock.now_ns();
        let counts = sample();
        if now >= cutter.next_boundary_ns() {
            if let Some(mut iv) = cutter.poll(now, &counts) {
                iv.interface = iface
                    .as_mut()
                    .and_then(InterfaceSnapshot::interval)
                    .map(Box::new);
                iv.tcp_info = self.tcp_info_of(tcp_senders);
                let _ = write_shrinking(&mut lock(writer), ControlMsg::Interval(iv.clone()));
                iv.tcp_info.clear();
                out.push(iv);
            }
        }
        if let Some(mut iv) = cutter.finish(now, &counts) {
            iv.interface = iface
                .as_mut()
                .and_then(InterfaceSnapshot::interval)
                .map(Box::new);
            out.push(iv);
        }
        if receivers.is_empty() {
            // Only TCP_INFO samples, which went out live: no receiver intervals to report.
            out.clear();
        }
        out
    }
}

fn sent_stats(i: usize, o: &SendOutcome, tcp_info: Option<TcpInfoStats>) -> StreamStats {
    StreamStats {
        tcp_info,
        ..o.stats(index_u32(i))
    }
}

/// Writes `msg`; one that would pass the frame limit (many streams' `TCP_INFO`) goes again
/// without its `TCP_INFO`, which is the part a client can do without.
fn write_shrinking(w: &mut TcpStream, mut msg: ControlMsg) -> Result<(), ControlError> {
    match write_frame(w, &msg) {
        Err(ControlError::Wire(sonde_wire::Error::FrameTooLarge(_))) => {
            match &mut msg {
                ControlMsg::Interval(iv) => iv.tcp_info.clear(),
                ControlMsg::SenderDone { streams } => {
                    streams.iter_mut().for_each(|s| s.tcp_info = None);
                }
                ControlMsg::Report(r) => r
                    .sent
                    .iter_mut()
                    .chain(&mut r.echoed)
                    .for_each(|s| s.tcp_info = None),
                _ => {}
            }
            write_frame(w, &msg)
        }
        r => r,
    }
}

/// `-O`: the omit period, ns (0 for none).
fn omit_ns(spec: &TestSpec) -> u64 {
    spec.omit_ms.saturating_mul(1_000_000)
}

fn index_u32(i: usize) -> u32 {
    u32::try_from(i).unwrap_or(u32::MAX)
}
