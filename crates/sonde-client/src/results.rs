//! From what the two sides measured to the result documents (the JSON contract).

use sonde_engine::rtt::REPORTED_PERCENTILES;
use sonde_engine::{bits_per_second, per_second};
use sonde_report::Warning;
use sonde_report::{
    EndsTuning, FlowResult, GsoMode, GsoReason, IntervalResult, LatencyMode, LatencyResult, Meta,
    PpsGso, PpsInterval, PpsResult, Protocol, SideTotals, StreamDirection, StreamResult,
    ThroughputResult,
};
use sonde_wire::{Direction, IntervalStats, SessionId, StreamStats, TestSpec, TuningReport};

pub(crate) use crate::rtt::{rtt_ns, rtt_ns_if_any};
use crate::run::{BulkRun, ClientRole, Context, LatencyRun};
use crate::{LatencyOptions, PpsOptions, Target, ThroughputOptions};

fn protocol(p: sonde_wire::Protocol) -> Protocol {
    match p {
        sonde_wire::Protocol::Tcp => Protocol::Tcp,
        sonde_wire::Protocol::Udp => Protocol::Udp,
    }
}

fn meta(target: &Target, session: SessionId, started: u64, overlapping: u32) -> Meta {
    meta_for(
        target,
        sonde_report::Peer::Sonde,
        session,
        started,
        overlapping,
    )
}

/// The one place a result's [`Meta`] is made: what every document says about its run (the
/// peer, the session, when it started, the overlap and its warning); the caller adds the
/// hosts, the CPU cost and its own warnings.
pub(crate) fn meta_for(
    target: &Target,
    peer: sonde_report::Peer,
    session: SessionId,
    started: u64,
    overlapping: u32,
) -> Meta {
    let mut meta = Meta {
        peer,
        sonde_version: env!("CARGO_PKG_VERSION").into(),
        timestamp_unix_ms: started,
        server: target.label.clone(),
        session: session.0,
        overlapping_sessions: overlapping,
        warnings: Vec::new(),
        warning_codes: Vec::new(),
        labels: sonde_report::Labels::new(),
        interrupted: false,
        hosts: sonde_report::Hosts::default(),
        cpu: sonde_report::CpuCosts::default(),
        agent: None,
        sources: Vec::new(),
        interfaces: None,
    };
    if overlapping > 0 {
        meta.add(&Warning::OverlappingSessions {
            sessions: overlapping,
        });
    }
    meta
}

/// Puts each data stream's source in `meta`, as this host opened it (`sources`, in channel
/// order) and as the agent saw it (`report`'s streams), with a warning for each that the agent
/// saw from elsewhere (a source NAT or a proxy in the path).
pub(crate) fn add_sources(
    meta: &mut Meta,
    sources: &[Option<std::net::SocketAddr>],
    report: &sonde_wire::AgentReport,
) {
    let canonical =
        |a: std::net::SocketAddr| std::net::SocketAddr::new(a.ip().to_canonical(), a.port());
    for (i, client) in sources.iter().enumerate() {
        let stream = u32::try_from(i).unwrap_or(u32::MAX);
        let client = client.map(canonical);
        let seen = report
            .received
            .iter()
            .chain(&report.sent)
            .chain(&report.echoed)
            .find(|s| s.stream == stream)
            .and_then(|s| s.peer);
        if let (Some(c), Some(s)) = (client, seen) {
            if c != s {
                meta.add(&Warning::SourceTranslated {
                    stream,
                    client: c.to_string(),
                    seen: s.to_string(),
                });
            }
        }
        meta.sources.push(sonde_report::StreamSource {
            stream,
            client: client.map(|a| a.to_string()),
            seen_by_server: seen.map(|a| a.to_string()),
        });
    }
}

/// Puts what each end's interface counted in `meta`, with a warning for an interface that
/// dropped packets or counted errors meanwhile.
pub(crate) fn add_interfaces(
    meta: &mut Meta,
    client: Option<&sonde_wire::InterfaceDelta>,
    server: Option<&sonde_wire::InterfaceDelta>,
) {
    if client.is_none() && server.is_none() {
        return;
    }
    for (end, delta) in [("this host's", client), ("the agent's", server)] {
        let Some(d) = delta else { continue };
        for signal in sonde_report::driver_signals(d.driver_name.as_deref(), &d.driver) {
            let interface = d.name.clone();
            meta.add(&match signal.limit.kind {
                sonde_report::SignalKind::Allowance => Warning::CloudLimitExceeded {
                    end,
                    interface,
                    signal,
                },
                sonde_report::SignalKind::Dropped => Warning::DriverDrops {
                    end,
                    interface,
                    signal,
                },
            });
        }
        if d.rx_dropped + d.tx_dropped + d.rx_errors + d.tx_errors > 0 {
            meta.add(&Warning::InterfaceDrops {
                end,
                delta: d.clone(),
            });
        }
    }
    meta.interfaces = Some(sonde_report::EndsInterfaces {
        client: client.cloned(),
        server: server.cloned(),
    });
}

/// Puts both ends' configuration and CPU cost in `meta`, with a warning for what a sonde agent
/// did not report (an older one) and for a CPU cost this host cannot measure.
pub(crate) fn add_context(
    meta: &mut Meta,
    ctx: &Context,
    agent_cpu: Option<&sonde_wire::CpuReport>,
) {
    use sonde_report::{CpuCost, CpuScope};
    meta.hosts.client.clone_from(&ctx.client_host);
    meta.hosts.server.clone_from(&ctx.server_host);
    let cost = |r: &sonde_wire::CpuReport| CpuCost::from_report(CpuScope::TestThreads, r);
    meta.cpu.client = ctx.client_cpu.as_ref().map(cost);
    meta.cpu.server = agent_cpu.map(cost);
    // Against other servers this host's CPU is not measured (yet): nothing to warn about.
    if ctx.agent && ctx.client_cpu.is_none() {
        meta.add(&Warning::ClientCpuUnknown);
    }
    let uncounted = |c: &Option<CpuCost>| {
        c.as_ref()
            .is_some_and(|c| c.voluntary_context_switches.is_none())
    };
    for (side, uncounted) in [
        ("client", uncounted(&meta.cpu.client)),
        ("server", uncounted(&meta.cpu.server)),
    ] {
        if uncounted {
            meta.add(&Warning::ContextSwitchesUnknown { side });
        }
    }
    // Host-wide counters: every platform sonde measures on counts interrupts and context
    // switches (Linux /proc/stat, Windows PDH), so either one missing means they could not be
    // read. System calls are named only beside them: Linux keeps no host-wide count of those,
    // by design, and that needs no warning.
    for (side, report) in [("client", ctx.client_cpu.as_ref()), ("server", agent_cpu)] {
        let Some(r) = report else { continue };
        if r.system_interrupts.is_some() && r.system_context_switches.is_some() {
            continue;
        }
        let fields = [
            ("system_interrupts_per_second", r.system_interrupts),
            (
                "system_context_switches_per_second",
                r.system_context_switches,
            ),
            ("system_syscalls_per_second", r.system_syscalls),
        ]
        .into_iter()
        .filter_map(|(name, n)| n.is_none().then_some(name))
        .collect();
        meta.add(&Warning::SystemCountersUnknown { side, fields });
    }
    if ctx.agent && ctx.server_host.is_none() {
        meta.add(&Warning::ServerConfigurationUnknown);
    }
    add_placement(meta, &ctx.placement);
    if ctx.agent && agent_cpu.is_none() {
        meta.add(&Warning::ServerCpuUnknown);
    }
}

/// Names the agent that served the test, and warns when the address tested balanced its
/// channels over several agents.
fn add_placement(meta: &mut Meta, placement: &crate::session::Placement) {
    let Some(agent) = &placement.agent else {
        return;
    };
    meta.agent = Some(sonde_report::ServedBy {
        id: agent.id.to_string(),
        addr: agent.addr.clone(),
        other_agents: placement.others.iter().map(ToString::to_string).collect(),
        reopened_channels: placement.reopened,
    });
    if !placement.others.is_empty() {
        meta.add(&Warning::Balancer {
            agents: placement.others.len() + 1,
            reopened: placement.reopened,
            agent: agent.addr.clone(),
        });
    }
}

fn nanos(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// `part` as a percentage of `whole`; 0 when `whole` is.
pub(crate) fn pct(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

/// The direction as the documents name it.
pub(crate) fn direction_name(d: Direction) -> String {
    match d {
        Direction::Forward => "forward",
        Direction::Reverse => "reverse",
        Direction::Bidir => "bidir",
    }
    .into()
}

/// Builds the latency document.
pub(crate) fn latency(target: &Target, opt: &LatencyOptions, run: &LatencyRun) -> LatencyResult {
    let o = &run.outcome;
    let s = o.rtt.summary();
    let mut meta = meta(
        target,
        run.session,
        run.started_unix_ms,
        run.report.overlapping_sessions,
    );
    add_context(&mut meta, &run.context, run.report.cpu.as_ref());
    add_sources(&mut meta, &run.context.sources, &run.report);
    add_interfaces(
        &mut meta,
        run.context.interface.as_ref(),
        run.report.interface.as_deref(),
    );
    let udp = opt.protocol == sonde_wire::Protocol::Udp;
    let many = run.many_flows.as_ref().map(|m| many_flows(opt, run, m));
    let (lost, duplicated, reordered) = if let Some(m) = &run.many_flows {
        let lost = if udp {
            m.flows
                .iter()
                .map(sonde_net::latency::rr::RrFlow::lost)
                .sum()
        } else {
            0
        };
        (lost, 0, 0)
    } else {
        o.seq.as_ref().map_or((0, 0, 0), |t| {
            (
                o.sent.saturating_sub(t.received()),
                t.duplicated(),
                t.reordered(),
            )
        })
    };
    let echoed: u64 = run.report.echoed.iter().map(|e| e.packets).sum();
    let (lost_outbound, lost_return) = if udp {
        let out = o.sent.saturating_sub(echoed).min(lost);
        (Some(out), Some(lost - out))
    } else {
        (None, None)
    };
    // p99.999 needs a million samples: its n/a row says so; a warning is for the common tail.
    if let Some(p) = REPORTED_PERCENTILES
        .iter()
        .filter(|&&p| p <= 99.99)
        .find(|&&p| !sonde_engine::rtt::percentile_supported(p, s.samples))
    {
        meta.add(&Warning::TooFewSamples {
            samples: s.samples,
            from_percentile: *p,
            needed: (10.0 / (1.0 - p / 100.0)).round() as u64,
        });
    }
    if lost > 0 {
        meta.add(&Warning::LostMessages {
            lost,
            sent: o.sent,
            percent: pct(lost, o.sent),
        });
    }
    if o.late_sends > 0 {
        meta.add(&Warning::LateSends { late: o.late_sends });
    }
    if let Some(unsent) = many.as_ref().and_then(|m| m.unsent).filter(|&u| u > 0) {
        meta.add(&Warning::UnsentRequests {
            unsent,
            due: o.sent.saturating_add(unsent),
            depth: opt.depth,
        });
    }
    if s.samples == 0 {
        meta.add(&Warning::NoSample);
    }
    // The inner view (`--timestamps`, `--one-way`, `--full-log`), each with its warnings.
    let mut inner_warnings = Vec::new();
    let socket_rtt = crate::inner::socket_rtt(o, &mut inner_warnings);
    let one_way = crate::inner::one_way(o, run.elapsed_ns, &mut inner_warnings);
    let full_log = crate::inner::full_log(o, &mut inner_warnings);
    meta.add_all(&inner_warnings);
    let tuning = ends_tuning(run.tuning.as_ref(), run.report.tuning.as_deref(), &mut meta);
    let socket = ends_socket(
        &run.context,
        run.report.socket.as_deref(),
        opt.protocol == sonde_wire::Protocol::Tcp,
        &mut meta,
    );
    LatencyResult {
        meta,
        protocol: protocol(opt.protocol),
        mode: if opt.rate.is_some() {
            LatencyMode::OpenLoop
        } else {
            LatencyMode::ClosedLoop
        },
        rate_per_second: opt.rate,
        msg_size_bytes: opt.msg_size,
        duration_ns: run.elapsed_ns,
        warmup_ns: nanos(opt.warmup),
        warmup_samples: s.warmup_excluded,
        sent: o.sent,
        samples: s.samples,
        rtt_ns: rtt_ns(&s),
        lost,
        lost_outbound,
        lost_return,
        duplicated,
        reordered,
        late_sends: opt.rate.map(|_| o.late_sends),
        rtt_histogram: crate::inner::histogram(o, opt),
        socket_rtt,
        one_way,
        full_log,
        helpers: None,
        tuning,
        socket,
        intervals: run.intervals.clone(),
        request_response: many,
    }
}

/// A many-flow run's figures: transactions per second in all and per flow, fairness, CPU per
/// transaction at each end.
fn many_flows(
    opt: &LatencyOptions,
    run: &LatencyRun,
    m: &crate::run::ManyFlowsRun,
) -> sonde_report::RequestResponse {
    // The measured time: from the end of the warm-up to the last request's send time (the
    // duration), or less for an interrupted run.
    let warmup = nanos(opt.warmup);
    let measured_ns = run
        .elapsed_ns
        .saturating_sub(warmup)
        .min(nanos(opt.duration))
        .max(1);
    let secs = measured_ns as f64 / 1e9;
    let per_flow: Vec<u64> = m.flows.iter().map(|f| f.measured).collect();
    let transactions: u64 = per_flow.iter().sum();
    let rate = |x: u64| x as f64 / secs;
    // Each end's CPU was metered over the whole run, the warm-up included: it is divided by
    // every transaction of that run (answered, warm-up included), not by the measured ones
    // alone, which would overstate it by (warm-up + duration) / duration.
    let answered: u64 = m.flows.iter().map(|f| f.answered).sum();
    let per_transaction = |cpu: Option<&sonde_wire::CpuReport>| {
        cpu.filter(|_| answered > 0)
            .map(|c| c.user_ns.saturating_add(c.system_ns) as f64 / answered as f64)
    };
    sonde_report::RequestResponse {
        flows: u32::try_from(m.flows.len()).unwrap_or(u32::MAX),
        depth: opt.depth,
        response_size_bytes: opt.response_size(),
        client_threads: m.threads,
        transactions,
        transactions_per_second: rate(transactions),
        flow_min_per_second: rate(per_flow.iter().copied().min().unwrap_or(0)),
        flow_max_per_second: rate(per_flow.iter().copied().max().unwrap_or(0)),
        fairness: sonde_report::RequestResponse::jain(&per_flow),
        flow_transactions: per_flow,
        timeouts: (opt.protocol == sonde_wire::Protocol::Udp)
            .then(|| m.flows.iter().map(|f| f.timeouts).sum()),
        client_cpu_ns_per_transaction: per_transaction(run.context.client_cpu.as_ref()),
        server_cpu_ns_per_transaction: per_transaction(run.report.cpu.as_ref()),
        // Open loop: what left of what was scheduled in the measured time.
        rate_achieved_per_second: opt
            .rate
            .map(|_| rate(m.flows.iter().map(|f| f.sent_measured).sum())),
        unsent: opt.rate.map(|_| m.flows.iter().map(|f| f.unsent).sum()),
    }
}

/// The result's `read_size_bytes`: what every TCP receiver of the test asked for per read.
/// `None` for UDP, and with a warning when the agent received but did not say how it read
/// (an agent older than `--read-size`, which read with its own default).
fn read_size(
    spec: &TestSpec,
    agent_received: bool,
    agent_read: Option<u32>,
    meta: &mut Meta,
) -> Option<u32> {
    if spec.protocol == sonde_wire::Protocol::Udp {
        return None;
    }
    if spec.read_size != 0 && agent_received && agent_read.is_none() {
        meta.add(&Warning::NotTuned {
            detail: format!(
                "the agent did not say how it read (it predates --read-size): its receivers read \
                 up to their default of {} bytes per call, not {}",
                sonde_wire::DEFAULT_TCP_READ_SIZE,
                spec.read_size
            ),
        });
        // Not one size for every receiver: a figure would claim what did not run.
        return None;
    }
    Some(spec.tcp_read_size())
}

/// `-w`, `-C`, `-M`, ...: the socket options as asked and as both ends' kernels applied them,
/// with a warning for each that differs (or for an agent that did not apply them).
fn ends_socket(
    context: &Context,
    server: Option<&sonde_wire::AppliedSocketOptions>,
    tcp: bool,
    meta: &mut Meta,
) -> Option<sonde_report::EndsSocket> {
    let (asked, client) = context.socket.clone()?;
    let ends = sonde_report::EndsSocket {
        asked,
        client,
        server: server.cloned(),
    };
    meta.add_all(&ends.warnings(tcp, context.agent));
    Some(ends)
}

/// `--busy-poll`, `--cpu`: both ends' reports, with a warning where an end did not do what was
/// asked (an agent that predates the request ignores it and reports nothing).
fn ends_tuning(
    client: Option<&TuningReport>,
    server: Option<&TuningReport>,
    meta: &mut Meta,
) -> Option<EndsTuning> {
    let client = client?.clone();
    let server = server.cloned();
    match &server {
        None => meta.add(&Warning::NotTuned {
            detail: "the agent did not pin its end or busy-poll (it predates --busy-poll and \
                     --cpu): it ran as usual, blocking in recv on any CPU"
                .into(),
        }),
        Some(s) => {
            if let Some(note) = &s.note {
                meta.add(&Warning::NotTuned {
                    detail: format!("the agent's end: {note}"),
                });
            }
        }
    }
    Some(EndsTuning { client, server })
}

/// One side's totals: `bytes` and `packets` over `active_ns`.
pub(crate) fn side(bytes: u64, packets: u64, active_ns: u64) -> SideTotals {
    SideTotals {
        bytes,
        bits_per_second: bits_per_second(bytes, active_ns),
        packets,
        duration_ns: active_ns,
    }
}

/// A throughput test's receiver and sender totals from its streams, for sonde's own peers and
/// iperf3's alike: bytes and packets summed, over the longest stream's active time.
pub(crate) fn stream_totals(streams: &[StreamResult]) -> (SideTotals, SideTotals) {
    (
        totals(streams.iter().map(|s| &s.receiver)),
        totals(streams.iter().map(|s| &s.sender)),
    )
}

fn totals<'a>(sides: impl Iterator<Item = &'a SideTotals>) -> SideTotals {
    let (mut bytes, mut packets, mut active) = (0u64, 0u64, 0u64);
    for s in sides {
        bytes = bytes.saturating_add(s.bytes);
        packets = packets.saturating_add(s.packets);
        // The longest stream's active time: a total never reads above what the streams carried.
        active = active.max(s.duration_ns);
    }
    side(bytes, packets, active)
}

/// Per-stream counts (`-Z`'s zero-copy sends, `--ecn`'s marks) of one end or direction added
/// together; `None` when no stream said.
fn sum_some<T: Default>(
    streams: impl IntoIterator<Item = Option<T>>,
    add: fn(&mut T, &T),
) -> Option<T> {
    streams.into_iter().flatten().fold(None, |sum, c| {
        let mut sum = sum.unwrap_or_default();
        add(&mut sum, &c);
        Some(sum)
    })
}

/// `-Z`: the zero-copy counts of one end's sending streams together; `None` when none said.
pub(crate) fn sum_zerocopy(
    streams: impl IntoIterator<Item = Option<sonde_wire::ZerocopyStats>>,
) -> Option<sonde_wire::ZerocopyStats> {
    sum_some(streams, sonde_wire::ZerocopyStats::add)
}

/// `--ecn`: the marks counted by one direction's receivers together; `None` when none said.
fn sum_ecn(
    streams: impl IntoIterator<Item = Option<sonde_wire::EcnCounts>>,
) -> Option<sonde_wire::EcnCounts> {
    sum_some(streams, sonde_wire::EcnCounts::add)
}

/// `--ecn`: warnings for a direction whose datagrams arrived CE (congestion signalled) or
/// Not-ECT (the marking bleached on the way).
fn ecn_warnings(e: &sonde_report::EcnByDirection, meta: &mut Meta) {
    for (direction, counts) in [
        ("client → server", e.client_to_server),
        ("server → client", e.server_to_client),
    ] {
        let Some(c) = counts else { continue };
        let received = c.not_ect + c.ect0 + c.ect1 + c.ce;
        if c.ce > 0 {
            meta.add(&Warning::EcnCongestion {
                direction,
                ce: c.ce,
                received,
            });
        }
        if c.not_ect > 0 {
            meta.add(&Warning::EcnBleached {
                direction,
                not_ect: c.not_ect,
                received,
            });
        }
    }
}

/// `-Z`: a warning for each end whose kernel copied zero-copy sends after all.
pub(crate) fn zerocopy_warnings(z: &sonde_report::EndsZerocopy, meta: &mut Meta) {
    for (side, stats) in [("client", z.client), ("server", z.server)] {
        if let Some(s) = stats.filter(|s| s.copied > 0) {
            meta.add(&Warning::ZerocopyCopied {
                side,
                copied: s.copied,
                completed: s.completed,
            });
        }
    }
}

fn stats_for(list: &[StreamStats], i: u32) -> Option<&StreamStats> {
    list.iter().find(|s| s.stream == i)
}

/// One stream's receiver and sender view, whichever side measured each.
struct StreamView {
    receiver: StreamStats,
    sender: StreamStats,
}

impl StreamView {
    /// UDP: the datagrams the test's loss is counted over. With `-O`, the sender's datagrams
    /// after the sequence numbers the receiver cut off as the omit period's (the receiver's
    /// cut, not the sender's clock, decides which are the test's); without, all it sent.
    fn measured_sent(&self) -> u64 {
        self.sender
            .packets
            .saturating_add(self.sender.omitted_packets)
            .saturating_sub(self.receiver.omitted_packets)
    }
}

fn stream_views(spec: &TestSpec, run: &BulkRun) -> Vec<StreamView> {
    (0..spec.channels())
        .map(|i| {
            let role = usize::try_from(i).ok().and_then(|i| run.roles.get(i));
            let client_sent = match role {
                Some(ClientRole::Sent(o)) => Some(StreamStats {
                    tcp_info: usize::try_from(i)
                        .ok()
                        .and_then(|i| run.client_tcp_info.get(i).copied().flatten()),
                    ..o.stats(i)
                }),
                _ => None,
            };
            if let Some(sender) = client_sent {
                let receiver = stats_for(&run.report.received, i)
                    .cloned()
                    .unwrap_or_default();
                return StreamView { receiver, sender };
            }
            let mut sender = stats_for(&run.report.sent, i)
                .or_else(|| stats_for(&run.agent_sent, i))
                .cloned()
                .unwrap_or_default();
            // The agent's last TCP_INFO came with its `SenderDone`, not in the report.
            sender.tcp_info = sender
                .tcp_info
                .or_else(|| stats_for(&run.agent_sent, i).and_then(|s| s.tcp_info));
            let receiver = match role {
                Some(ClientRole::TcpReceived(o)) => StreamStats {
                    stream: i,
                    bytes: o.bytes,
                    packets: o.reads,
                    active_ns: o.last_ns.saturating_sub(o.first_ns),
                    omitted_bytes: o.omitted_bytes,
                    ..StreamStats::default()
                },
                Some(ClientRole::UdpReceived(o)) => StreamStats {
                    stream: i,
                    bytes: o.bytes,
                    packets: o.seq.received(),
                    active_ns: o.last_ns.saturating_sub(o.first_ns),
                    lost: Some(o.lost(sender.packets.saturating_add(sender.omitted_packets))),
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
                },
                _ => StreamStats::default(),
            };
            StreamView { receiver, sender }
        })
        .collect()
}

/// Which end counted an interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CountedBy {
    Agent,
    Client,
}

/// Converts one receiver interval to the document's form, with a byte count per stream and
/// the interface counts of the end that cut it (`by`).
pub(crate) fn interval(iv: &IntervalStats, channels: usize, by: CountedBy) -> IntervalResult {
    let mut stream_bytes = vec![0; channels];
    for (s, b) in iv.streams.iter().zip(&iv.bytes) {
        if let Some(slot) = usize::try_from(*s)
            .ok()
            .and_then(|i| stream_bytes.get_mut(i))
        {
            *slot = *b;
        }
    }
    let bytes = iv.bytes.iter().sum();
    IntervalResult {
        start_ns: iv.start_ns,
        end_ns: iv.end_ns,
        bytes,
        bits_per_second: bits_per_second(bytes, iv.end_ns.saturating_sub(iv.start_ns)),
        packets: iv.packets.iter().sum(),
        stream_bytes,
        tcp_info: Vec::new(),
        omitted: false,
        interfaces: iv.interface.as_deref().map(|d| {
            let d = Some(d.clone());
            match by {
                CountedBy::Agent => sonde_report::EndsInterfaces {
                    client: None,
                    server: d,
                },
                CountedBy::Client => sonde_report::EndsInterfaces {
                    client: d,
                    server: None,
                },
            }
        }),
    }
}

/// The TCP senders' samples, put in the interval that starts where they were taken (both ends
/// cut on the same grid), in stream order.
fn with_tcp_info(mut intervals: Vec<IntervalResult>, run: &BulkRun) -> Vec<IntervalResult> {
    for (start_ns, samples) in &run.interval_tcp_info {
        if let Some(iv) = intervals.iter_mut().find(|iv| iv.start_ns == *start_ns) {
            iv.tcp_info
                .extend(samples.iter().map(|t| sonde_report::StreamTcpInfo {
                    stream: t.stream,
                    tcp_info: t.into(),
                }));
            iv.tcp_info.sort_by_key(|t| t.stream);
        }
    }
    intervals
}

/// Merges the agent's and the client's intervals (bidir has both). Both sides cut on the same
/// grid (multiples of the interval from their own start), so intervals with the same start are
/// the same period.
fn merged_intervals(run: &BulkRun, channels: usize) -> Vec<IntervalResult> {
    merge_intervals(&run.report.intervals, &run.client_intervals, channels)
}

/// [`merged_intervals`] over the two lists. Each side's final interval ends where its receiver
/// ended, which can be past the next grid boundary; when the other side has an interval from
/// that boundary on (its receiver ran longer on its own clock, whose origin the session's
/// set-up can put a little earlier), the earlier interval is cut at the boundary, so the
/// intervals follow each other without overlapping. Its bytes stay where they were counted:
/// the sums per stream are unchanged, and only the few milliseconds past the boundary are
/// labelled with the interval before.
fn merge_intervals(
    agent: &[IntervalStats],
    client: &[IntervalStats],
    channels: usize,
) -> Vec<IntervalResult> {
    let mut all: Vec<IntervalResult> = agent
        .iter()
        .map(|iv| interval(iv, channels, CountedBy::Agent))
        .chain(
            client
                .iter()
                .map(|iv| interval(iv, channels, CountedBy::Client)),
        )
        .collect();
    all.sort_by_key(|iv| iv.start_ns);
    let mut merged: Vec<IntervalResult> = Vec::with_capacity(all.len());
    for iv in all {
        match merged.last_mut() {
            Some(m) if m.start_ns == iv.start_ns => {
                m.bytes += iv.bytes;
                m.packets += iv.packets;
                // `--bidir`: each end's interface, from the interval it cut.
                if let Some(theirs) = iv.interfaces {
                    let ours = m.interfaces.get_or_insert(sonde_report::EndsInterfaces {
                        client: None,
                        server: None,
                    });
                    ours.client = ours.client.take().or(theirs.client);
                    ours.server = ours.server.take().or(theirs.server);
                }
                for (d, s) in m.stream_bytes.iter_mut().zip(&iv.stream_bytes) {
                    *d += s;
                }
                m.end_ns = m.end_ns.max(iv.end_ns);
                m.bits_per_second = bits_per_second(m.bytes, m.end_ns.saturating_sub(m.start_ns));
            }
            _ => merged.push(iv),
        }
    }
    for k in 1..merged.len() {
        let next_start = merged[k].start_ns;
        let prev = &mut merged[k - 1];
        if prev.end_ns > next_start {
            prev.end_ns = next_start;
            prev.bits_per_second =
                bits_per_second(prev.bytes, prev.end_ns.saturating_sub(prev.start_ns));
        }
    }
    merged
}

/// Builds the throughput document.
pub(crate) fn throughput(
    target: &Target,
    opt: &ThroughputOptions,
    spec: &TestSpec,
    run: &BulkRun,
) -> ThroughputResult {
    let udp = opt.protocol == sonde_wire::Protocol::Udp;
    let views = stream_views(spec, run);
    let mut meta = meta(
        target,
        run.session,
        run.started_unix_ms,
        run.report.overlapping_sessions,
    );
    add_context(&mut meta, &run.context, run.report.cpu.as_ref());
    add_sources(&mut meta, &run.context.sources, &run.report);
    add_interfaces(
        &mut meta,
        run.context.interface.as_ref(),
        run.report.interface.as_deref(),
    );
    let tuning = ends_tuning(run.tuning.as_ref(), run.report.tuning.as_deref(), &mut meta);
    let socket = ends_socket(&run.context, run.report.socket.as_deref(), !udp, &mut meta);
    let streams: Vec<StreamResult> = views
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let i = u32::try_from(i).unwrap_or(u32::MAX);
            StreamResult {
                stream: i,
                direction: if spec.client_sends(i) {
                    StreamDirection::ClientToServer
                } else {
                    StreamDirection::ServerToClient
                },
                receiver: side(v.receiver.bytes, v.receiver.packets, v.receiver.active_ns),
                sender: side(v.sender.bytes, v.sender.packets, v.sender.active_ns),
                lost: v.receiver.lost,
                loss_percent: v.receiver.lost.map(|l| pct(l, v.measured_sent())),
                duplicated: v.receiver.duplicated,
                reordered: v.receiver.reordered,
                jitter_ns: v.receiver.jitter_ns,
                retransmits: v.sender.retransmits,
                tcp_info: v.sender.tcp_info.as_ref().map(Into::into),
            }
        })
        .collect();
    let (receiver, sender) = stream_totals(&streams);
    let sum = |f: fn(&StreamResult) -> Option<u64>| sum_streams(&streams, f);
    let lost = if udp { sum(|s| s.lost) } else { None };
    let sent_packets: u64 = views.iter().map(StreamView::measured_sent).sum();
    if let Some(l) = lost.filter(|&l| l > 0) {
        meta.add(&Warning::LostDatagrams {
            lost: l,
            sent: sent_packets,
            percent: pct(l, sent_packets),
        });
    }
    if udp && opt.bitrate > 0 {
        let per_direction = if opt.direction == Direction::Bidir {
            2.0
        } else {
            1.0
        };
        let target_bps = opt.bitrate as f64 * per_direction;
        if sender.bits_per_second < target_bps * 0.95 {
            meta.add(&Warning::SenderLimited {
                reached_bits_per_second: sender.bits_per_second,
                asked_bits_per_second: target_bps,
            });
        }
    }
    if !udp && run.context.agent && streams.iter().any(|s| s.tcp_info.is_none()) {
        meta.add(&Warning::TcpInfoUnknown);
    }
    if receiver.bytes == 0 {
        meta.add(&Warning::NothingReceived);
    }
    let agent_received = streams
        .iter()
        .any(|s| s.direction == StreamDirection::ClientToServer);
    // The views of the streams of one direction.
    let of = |d: StreamDirection| {
        streams
            .iter()
            .zip(&views)
            .filter(move |(s, _)| s.direction == d)
            .map(|(_, v)| v)
    };
    let ecn = (udp && spec.socket.ecn_asked()).then(|| {
        let dir = |d| sum_ecn(of(d).map(|v| v.receiver.ecn));
        sonde_report::EcnByDirection {
            client_to_server: dir(StreamDirection::ClientToServer),
            server_to_client: dir(StreamDirection::ServerToClient),
        }
    });
    if let Some(e) = &ecn {
        ecn_warnings(e, &mut meta);
    }
    // TCP: a receiving socket does not see the ECN field; the sender's TCP_INFO counts the
    // segments its peer echoed as CE-marked.
    if !udp && spec.socket.ecn_asked() {
        for (d, direction) in [
            (StreamDirection::ClientToServer, "client → server"),
            (StreamDirection::ServerToClient, "server → client"),
        ] {
            let delivered_ce: u64 = streams
                .iter()
                .filter(|s| s.direction == d)
                .filter_map(|s| s.tcp_info.as_ref()?.delivered_ce_segments)
                .map(u64::from)
                .sum();
            if delivered_ce > 0 {
                meta.add(&Warning::TcpEcnCongestion {
                    direction,
                    delivered_ce,
                });
            }
        }
    }
    let zerocopy = (spec.socket.zerocopy && !udp).then(|| {
        let end = |d| sum_zerocopy(of(d).map(|v| v.sender.zerocopy));
        sonde_report::EndsZerocopy {
            client: end(StreamDirection::ClientToServer),
            server: end(StreamDirection::ServerToClient),
        }
    });
    if let Some(z) = &zerocopy {
        zerocopy_warnings(z, &mut meta);
        let agent_sent = streams
            .iter()
            .any(|s| s.direction == StreamDirection::ServerToClient);
        if agent_sent && z.server.is_none() {
            meta.add(&Warning::NotTuned {
                detail: "-Z: the agent did not say how its zero-copy sends went (it predates \
                         -Z): it sent with write, and its CPU cost includes the copy"
                    .into(),
            });
        }
    }
    let read_size_bytes = read_size(spec, agent_received, run.report.read_size, &mut meta);
    if spec.skip_rx_copy && agent_received && run.report.skip_rx_copy != Some(true) {
        meta.add(&Warning::NotTuned {
            detail: "--skip-rx-copy: the agent did not say it received without a copy (it \
                     predates the option): its receivers copied, and its CPU cost includes that"
                .into(),
        });
    }
    let omit_ns = opt.omit.map(nanos).filter(|&ns| ns > 0);
    if omit_ns.is_some() && run.context.agent && agent_ignored_omit(spec, &views) {
        meta.add(&Warning::NotTuned {
            detail: "-O: the agent did not omit the first seconds on its end (it predates -O): \
                     its streams' figures include them"
                .into(),
        });
    }
    let mut intervals = with_tcp_info(merged_intervals(run, views.len()), run);
    if let Some(omit_ns) = omit_ns {
        // The receivers count from the omit time on the clock the intervals are cut on: the
        // intervals that end by then are the omit period's.
        for iv in &mut intervals {
            iv.omitted = iv.end_ns <= omit_ns;
        }
    }
    ThroughputResult {
        meta,
        protocol: protocol(opt.protocol),
        direction: direction_name(opt.direction),
        parallel: opt.parallel,
        msg_size_bytes: opt.msg_size,
        read_size_bytes,
        target_bits_per_second: (udp && opt.bitrate > 0).then_some(opt.bitrate),
        duration_ns: if opt.bytes.is_some() || opt.blocks.is_some() {
            0
        } else {
            nanos(opt.duration)
        },
        skip_rx_copy: spec.skip_rx_copy,
        zerocopy,
        ecn,
        bytes_to_send: opt.bytes,
        blocks_to_send: opt.blocks,
        omit_ns,
        omitted_bytes: omit_ns.map(|_| views.iter().map(|v| v.receiver.omitted_bytes).sum()),
        receiver,
        sender,
        intervals,
        intervals_counted_at: sonde_report::CountedAt::Receiver,
        lost,
        loss_percent: lost.map(|l| pct(l, sent_packets)),
        jitter_ns: if udp {
            streams.iter().filter_map(|s| s.jitter_ns).max()
        } else {
            None
        },
        duplicated: if udp { sum(|s| s.duplicated) } else { None },
        reordered: if udp { sum(|s| s.reordered) } else { None },
        retransmits: if udp { None } else { sum(|s| s.retransmits) },
        streams,
        helpers: None,
        tuning,
        socket,
    }
}

/// Whether the agent's end of any stream counted data of the `-O` period as counted (an agent
/// that predates `omit_ms` ignores it): a stream that carried data and omitted none.
fn agent_ignored_omit(spec: &TestSpec, views: &[StreamView]) -> bool {
    views.iter().enumerate().any(|(i, v)| {
        let agent_end = if spec.client_sends(u32::try_from(i).unwrap_or(u32::MAX)) {
            &v.receiver
        } else {
            &v.sender
        };
        agent_end.bytes > 0 && agent_end.omitted_bytes == 0
    })
}

/// A per-stream count summed over the streams; `None` when any stream cannot say.
pub(crate) fn sum_streams(
    streams: &[StreamResult],
    f: fn(&StreamResult) -> Option<u64>,
) -> Option<u64> {
    streams
        .iter()
        .map(f)
        .try_fold(0u64, |acc, v| v.map(|v| acc.saturating_add(v)))
}

/// Builds the pps document.
pub(crate) fn pps(
    target: &Target,
    opt: &PpsOptions,
    gso: &sonde_net::gso::GsoChoice,
    run: &BulkRun,
) -> PpsResult {
    let mut meta = meta(
        target,
        run.session,
        run.started_unix_ms,
        run.report.overlapping_sessions,
    );
    add_context(&mut meta, &run.context, run.report.cpu.as_ref());
    add_sources(&mut meta, &run.context.sources, &run.report);
    add_interfaces(
        &mut meta,
        run.context.interface.as_ref(),
        run.report.interface.as_deref(),
    );
    let tuning = ends_tuning(run.tuning.as_ref(), run.report.tuning.as_deref(), &mut meta);
    let socket = ends_socket(&run.context, run.report.socket.as_deref(), false, &mut meta);
    let mut flows = Vec::new();
    let mut method = "";
    let (mut sent_active, mut recv_active) = (0, 0);
    // What the senders sent over their own time (after their omit time, with `-O`).
    let mut sender_packets = 0;
    for (i, role) in run.roles.iter().enumerate() {
        let ClientRole::Sent(o) = role else { continue };
        let flow = u32::try_from(i).unwrap_or(u32::MAX);
        method = o.method;
        sent_active = sent_active.max(o.active_ns);
        sender_packets += o.packets;
        let r = stats_for(&run.report.received, flow);
        let received = r.map_or(0, |r| r.packets);
        recv_active = recv_active.max(r.map_or(0, |r| r.active_ns));
        // `-O`: the flow's test datagrams are the ones after the agent's omit cut.
        let sent = o
            .packets
            .saturating_add(o.omitted_packets)
            .saturating_sub(r.map_or(0, |r| r.omitted_packets));
        flows.push(FlowResult {
            flow,
            sent,
            received,
            lost: r
                .and_then(|r| r.lost)
                .unwrap_or(sent.saturating_sub(received)),
        });
    }
    let sent: u64 = flows.iter().map(|f| f.sent).sum();
    let received: u64 = flows.iter().map(|f| f.received).sum();
    let lost: u64 = flows.iter().map(|f| f.lost).sum();
    if lost > 0 {
        meta.add(&Warning::PpsLoss {
            lost,
            sent,
            percent: pct(lost, sent),
        });
    }
    // `--ecn`: every pps flow is client → agent, counted by the agent's receivers.
    let ecn = run
        .context
        .socket
        .as_ref()
        .is_some_and(|(asked, _)| asked.ecn_asked())
        .then(|| sonde_report::EcnByDirection {
            client_to_server: sum_ecn(run.report.received.iter().map(|r| r.ecn)),
            server_to_client: None,
        });
    if let Some(e) = &ecn {
        ecn_warnings(e, &mut meta);
    }
    let omit_ns = opt.omit.map(nanos).filter(|&ns| ns > 0);
    PpsResult {
        meta,
        protocol: Protocol::Udp,
        msg_size_bytes: opt.msg_size,
        duration_ns: nanos(opt.duration),
        omit_ns,
        omitted_received: omit_ns.map(|_| {
            // Every datagram counted is exactly -m bytes.
            let size = u64::from(opt.msg_size.max(1));
            run.report
                .received
                .iter()
                .map(|r| r.omitted_bytes / size)
                .sum()
        }),
        send_method: method.into(),
        gso: pps_gso(gso, method),
        intervals: run
            .report
            .intervals
            .iter()
            .map(|iv| {
                let mut iv = pps_interval(iv, flows.len());
                iv.omitted = omit_ns.is_some_and(|o| iv.end_ns <= o);
                iv
            })
            .collect(),
        sent,
        received,
        lost,
        loss_percent: pct(lost, sent),
        sent_pps: per_second(sender_packets, sent_active),
        received_pps: per_second(received, recv_active),
        flows,
        helpers: None,
        tuning,
        socket,
        ecn,
    }
}

/// One receiver interval of a pps test: datagrams per flow (flow `i` is stream `i`: every
/// stream of a pps test is a client-to-agent flow), their sum and rate.
pub(crate) fn pps_interval(iv: &IntervalStats, flows: usize) -> PpsInterval {
    let mut flow_received = vec![0; flows];
    for (s, p) in iv.streams.iter().zip(&iv.packets) {
        if let Some(slot) = usize::try_from(*s)
            .ok()
            .and_then(|i| flow_received.get_mut(i))
        {
            *slot = *p;
        }
    }
    let received = iv.packets.iter().sum();
    PpsInterval {
        start_ns: iv.start_ns,
        end_ns: iv.end_ns,
        received,
        received_pps: per_second(received, iv.end_ns.saturating_sub(iv.start_ns)),
        flow_received,
        omitted: false,
        interface: iv.interface.as_deref().cloned(),
    }
}

/// The document's account of GSO: the client's choice, and whether the sender (`method`) used
/// it (the kernel may refuse GSO, or a datagram be too large to batch).
fn pps_gso(choice: &sonde_net::gso::GsoChoice, method: &str) -> PpsGso {
    use sonde_net::gso;
    let used = method == sonde_net::bulk::GSO_SEND_METHOD;
    let mut explanation = choice.to_string();
    if choice.enabled && !used {
        explanation.push_str(if cfg!(windows) {
            "; the sender could not batch (Windows refused UDP_SEND_MSG_SIZE: USO needs Windows 10 2004 or later, and wine has none; or one datagram fills a batch): see send_method"
        } else {
            "; the sender could not batch (the kernel refused UDP_SEGMENT, or one datagram fills a batch): see send_method"
        });
    }
    PpsGso {
        mode: match choice.mode {
            gso::GsoMode::Auto => GsoMode::Auto,
            gso::GsoMode::On => GsoMode::On,
            gso::GsoMode::Off => GsoMode::Off,
        },
        used,
        interface: choice.interface.clone(),
        reason: match choice.reason {
            gso::GsoReason::Requested => GsoReason::Requested,
            gso::GsoReason::Loopback => GsoReason::Loopback,
            gso::GsoReason::VirtualDevice { .. } => GsoReason::VirtualDevice,
            gso::GsoReason::PhysicalDevice => GsoReason::PhysicalDevice,
            gso::GsoReason::Unsupported => GsoReason::Unsupported,
            gso::GsoReason::DeviceKindUnknown => GsoReason::DeviceKindUnknown,
            _ => GsoReason::UnknownRoute,
        },
        explanation,
    }
}

#[cfg(test)]
mod context_tests {
    use super::*;

    /// `-O` against an agent that predates it: its end of a stream carried data and omitted
    /// none.
    /// A cloud limit's statistic that rose is named with its meaning; one that did not, or an
    /// unknown statistic, says nothing; interface drops are their own warning.
    #[test]
    fn a_cloud_limit_that_rose_and_interface_drops_are_warned() {
        let delta = |driver: &[(&str, u64)], rx_dropped| sonde_wire::InterfaceDelta {
            name: "eth0".into(),
            rx_dropped,
            driver: driver.iter().map(|&(n, v)| (n.to_owned(), v)).collect(),
            ..sonde_wire::InterfaceDelta::default()
        };
        let mut meta = meta_for(
            &crate::resolve("127.0.0.1", 5300).unwrap(),
            sonde_report::Peer::Sonde,
            sonde_wire::SessionId(1),
            0,
            0,
        );
        let quiet = delta(
            &[("bw_in_allowance_exceeded", 0), ("rx_queue_0_drops", 9)],
            0,
        );
        let loud = delta(&[("pps_allowance_exceeded", 1_234), ("tx_timeout", 1)], 3);
        add_interfaces(&mut meta, Some(&quiet), Some(&loud));
        assert_eq!(
            meta.warning_codes,
            [
                sonde_report::WarningCode::CloudLimitExceeded,
                sonde_report::WarningCode::InterfaceDrops
            ]
        );
        assert!(
            meta.warnings[0].starts_with(
                "the agent's interface eth0: pps_allowance_exceeded rose by 1234 during the test \
                 (AWS ENA: packets queued or dropped"
            ),
            "{}",
            meta.warnings[0]
        );
        assert!(
            meta.warnings[1].contains("dropped 3 received"),
            "{}",
            meta.warnings[1]
        );
        let ifs = meta.interfaces.unwrap();
        assert_eq!(ifs.client.unwrap().driver["rx_queue_0_drops"], 9);
    }

    #[test]
    fn an_agent_that_did_not_omit_is_found_out() {
        let spec = TestSpec {
            kind: sonde_wire::TestKind::Throughput,
            protocol: sonde_wire::Protocol::Tcp,
            direction: Direction::Bidir,
            streams: 1,
            msg_size: 1,
            bitrate_per_stream: 0,
            duration_ms: 1_000,
            interval_ms: 0,
            read_size: 0,
            socket: Default::default(),
            omit_ms: 1_000,
            skip_rx_copy: false,
            bytes: 0,
            blocks: 0,
            request_response: None,
        };
        let stats = |bytes, omitted_bytes| StreamStats {
            bytes,
            omitted_bytes,
            ..StreamStats::default()
        };
        // Stream 0: the client sends, the agent receives; stream 1: the agent sends.
        let view = |agent_rx: StreamStats, agent_tx: StreamStats| {
            vec![
                StreamView {
                    receiver: agent_rx,
                    sender: stats(10, 5),
                },
                StreamView {
                    receiver: stats(10, 5),
                    sender: agent_tx,
                },
            ]
        };
        assert!(!agent_ignored_omit(
            &spec,
            &view(stats(10, 5), stats(10, 5))
        ));
        assert!(agent_ignored_omit(&spec, &view(stats(10, 0), stats(10, 5))));
        assert!(agent_ignored_omit(&spec, &view(stats(10, 5), stats(10, 0))));
        // A stream that carried nothing says nothing either way.
        assert!(!agent_ignored_omit(&spec, &view(stats(0, 0), stats(10, 5))));
    }

    #[test]
    fn a_stream_the_agent_saw_from_elsewhere_is_a_source_nat_warning() {
        let mut meta = meta_for(
            &Target {
                addr: "198.18.1.2:5300".parse().unwrap(),
                label: "198.18.1.2:5300".into(),
                secret: None,
                source: crate::Source::default(),
            },
            sonde_report::Peer::Sonde,
            SessionId(1),
            0,
            0,
        );
        let sources = [
            Some("198.18.1.2:5001".parse().unwrap()),
            // A v4-mapped address is the same IPv4 source.
            Some("[::ffff:198.18.1.2]:5002".parse().unwrap()),
            Some("198.18.1.2:5003".parse().unwrap()),
        ];
        let stream = |stream, peer: &str| StreamStats {
            stream,
            peer: Some(peer.parse().unwrap()),
            ..StreamStats::default()
        };
        let report = sonde_wire::AgentReport {
            received: vec![stream(0, "198.18.0.1:40000")],
            sent: vec![stream(1, "198.18.1.2:5002")],
            ..sonde_wire::AgentReport::default()
        };
        add_sources(&mut meta, &sources, &report);
        assert_eq!(
            meta.warning_codes,
            [sonde_report::WarningCode::SourceTranslated]
        );
        assert!(
            meta.warnings[0].starts_with("the agent saw 198.18.0.1:40000 for 198.18.1.2:5001"),
            "{}",
            meta.warnings[0]
        );
        let seen: Vec<Option<&str>> = meta
            .sources
            .iter()
            .map(|s| s.seen_by_server.as_deref())
            .collect();
        // Stream 2: an older agent, or one that did not say.
        assert_eq!(
            seen,
            [Some("198.18.0.1:40000"), Some("198.18.1.2:5002"), None]
        );
        assert_eq!(meta.sources[1].client.as_deref(), Some("198.18.1.2:5002"));
    }

    /// An agent older than `--busy-poll` ignores the request and reports no tuning: the result
    /// says so with a coded warning instead of passing its blocking echo off as busy-polled;
    /// an agent that could not pin says why; a run that asked nothing has no `tuning`.
    #[test]
    fn busy_poll_against_an_older_agent_warns_and_a_tuned_one_does_not() {
        let target = Target {
            addr: "127.0.0.1:5300".parse().unwrap(),
            label: "127.0.0.1:5300".into(),
            secret: None,
            source: crate::Source::default(),
        };
        let client = TuningReport {
            busy_poll: true,
            so_busy_poll_us: None,
            cpus: vec![0],
            note: None,
        };
        let mut older = meta(&target, SessionId(1), 0, 0);
        let t = ends_tuning(Some(&client), None, &mut older).unwrap();
        assert_eq!(t.server, None);
        assert_eq!(older.warning_codes, [sonde_report::WarningCode::NotTuned]);
        assert!(
            older.warnings[0].contains("predates --busy-poll"),
            "{older:?}"
        );

        let agent = TuningReport {
            cpus: vec![1],
            ..client.clone()
        };
        let mut tuned = meta(&target, SessionId(1), 0, 0);
        let t = ends_tuning(Some(&client), Some(&agent), &mut tuned).unwrap();
        assert_eq!(t.server.as_ref().map(|s| s.cpus.clone()), Some(vec![1]));
        assert!(tuned.warnings.is_empty(), "{tuned:?}");

        let refused = TuningReport {
            cpus: Vec::new(),
            note: Some("not pinned: CPU 7 is not one this process may run on".into()),
            ..client.clone()
        };
        let mut partly = meta(&target, SessionId(1), 0, 0);
        ends_tuning(Some(&client), Some(&refused), &mut partly).unwrap();
        assert_eq!(partly.warning_codes, [sonde_report::WarningCode::NotTuned]);
        assert!(partly.warnings[0].contains("CPU 7"), "{partly:?}");

        let mut plain = meta(&target, SessionId(1), 0, 0);
        assert!(ends_tuning(None, None, &mut plain).is_none());
        assert!(plain.warnings.is_empty());
    }

    #[test]
    fn read_size_is_stated_unless_an_older_agent_read_its_own_way() {
        let target = Target {
            addr: "127.0.0.1:5300".parse().unwrap(),
            label: "127.0.0.1:5300".into(),
            secret: None,
            source: crate::Source::default(),
        };
        let spec = |protocol, read_size| TestSpec {
            kind: sonde_wire::TestKind::Throughput,
            protocol,
            direction: Direction::Forward,
            streams: 1,
            msg_size: 1,
            bitrate_per_stream: 0,
            duration_ms: 1_000,
            interval_ms: 0,
            read_size,
            socket: Default::default(),
            omit_ms: 0,
            skip_rx_copy: false,
            bytes: 0,
            blocks: 0,
            request_response: None,
        };
        let tcp = sonde_wire::Protocol::Tcp;
        let fresh = || meta(&target, SessionId(1), 0, 0);

        // Asked, and the agent read as asked (or did not receive: -R).
        for (received, agent) in [(true, Some(1)), (false, None)] {
            let mut m = fresh();
            assert_eq!(read_size(&spec(tcp, 1), received, agent, &mut m), Some(1));
            assert!(m.warnings.is_empty(), "{m:?}");
        }
        // Not asked: the default, stated, whatever the agent says.
        let mut m = fresh();
        assert_eq!(
            read_size(&spec(tcp, 0), true, None, &mut m),
            Some(sonde_wire::DEFAULT_TCP_READ_SIZE)
        );
        assert!(m.warnings.is_empty(), "{m:?}");
        // Asked, but the agent received without saying how: no size, a warning.
        let mut m = fresh();
        assert_eq!(read_size(&spec(tcp, 1), true, None, &mut m), None);
        assert_eq!(m.warning_codes, [sonde_report::WarningCode::NotTuned]);
        assert!(m.warnings[0].contains("predates --read-size"), "{m:?}");
        // UDP reads a datagram per call: no size.
        let mut m = fresh();
        assert_eq!(
            read_size(&spec(sonde_wire::Protocol::Udp, 0), true, None, &mut m),
            None
        );
    }

    fn iv(start_ns: u64, end_ns: u64, stream: u32, bytes: u64) -> IntervalStats {
        IntervalStats {
            start_ns,
            end_ns,
            streams: vec![stream],
            bytes: vec![bytes],
            packets: vec![0],
            tcp_info: Vec::new(),
            interface: None,
        }
    }

    /// Seen in a bidir run on a busy host (-i 0.2 -t 0.6): the client's receiver ended at
    /// 602 ms, past the 600 ms boundary, while the agent's ran on to 700 ms on its own clock.
    /// The merged list overlapped ([400, 602] then [600, 700]); now it follows the grid and
    /// every stream's bytes are where they were.
    #[test]
    fn a_final_interval_past_the_next_boundary_is_cut_there() {
        let ms = 1_000_000;
        let agent = [
            iv(0, 200 * ms, 0, 10),
            iv(200 * ms, 400 * ms, 0, 20),
            iv(400 * ms, 600 * ms, 0, 30),
            iv(600 * ms, 700 * ms, 0, 5),
        ];
        let client = [
            iv(0, 200 * ms, 1, 1),
            iv(200 * ms, 400 * ms, 1, 2),
            iv(400 * ms, 602 * ms, 1, 3),
        ];
        let merged = merge_intervals(&agent, &client, 2);
        let bounds: Vec<(u64, u64)> = merged.iter().map(|m| (m.start_ns, m.end_ns)).collect();
        assert_eq!(
            bounds,
            [
                (0, 200 * ms),
                (200 * ms, 400 * ms),
                (400 * ms, 600 * ms),
                (600 * ms, 700 * ms)
            ]
        );
        let per_stream: Vec<Vec<u64>> = merged.iter().map(|m| m.stream_bytes.clone()).collect();
        assert_eq!(per_stream, [[10, 1], [20, 2], [30, 3], [5, 0]]);
        // The cut interval's rate is over its new length.
        assert_eq!(merged[2].bits_per_second, bits_per_second(33, 200 * ms));
    }

    fn target() -> Target {
        Target {
            addr: "127.0.0.1:5300".parse().unwrap(),
            label: "127.0.0.1:5300".into(),
            secret: None,
            source: crate::Source::default(),
        }
    }

    #[test]
    fn gso_allowed_but_not_used_says_so() {
        use sonde_net::gso::{GsoChoice, GsoMode as Mode, GsoReason as Why};
        let choice = GsoChoice {
            mode: Mode::On,
            enabled: true,
            interface: Some("lo".into()),
            reason: Why::Requested,
        };
        // The offloaded send's name is the platform's (Windows: send+UDP_SEND_MSG_SIZE).
        let used = pps_gso(&choice, sonde_net::bulk::GSO_SEND_METHOD);
        assert!(used.used);
        assert_eq!(used.explanation, "--gso on asked for it");
        // Linux's name on Windows, and the other way round, is not an offloaded send.
        let other = if cfg!(windows) {
            "sendmsg+UDP_SEGMENT"
        } else {
            "send+UDP_SEND_MSG_SIZE"
        };
        for method in ["sendmmsg", "send", other] {
            let refused = pps_gso(&choice, method);
            assert!(!refused.used, "{method}");
            assert!(
                refused.explanation.contains("see send_method"),
                "{refused:?}"
            );
        }
        let off = pps_gso(
            &GsoChoice {
                mode: Mode::Auto,
                enabled: false,
                interface: Some("veth0".into()),
                reason: Why::VirtualDevice { driver: None },
            },
            "sendmmsg",
        );
        assert_eq!(
            (off.mode, off.reason, off.used),
            (GsoMode::Auto, GsoReason::VirtualDevice, false)
        );
        assert!(!off.explanation.contains("send_method"));
    }

    #[test]
    fn what_an_older_agent_does_not_report_is_null_with_a_warning() {
        let ctx = Context {
            agent: true,
            client_host: Some(sonde_wire::HostInfo {
                kernel_release: Some("6.1.0".into()),
                ..sonde_wire::HostInfo::default()
            }),
            server_host: None,
            sources: Vec::new(),
            interface: None,
            client_cpu: Some(sonde_wire::CpuReport {
                wall_ns: 1_000,
                user_ns: 500,
                voluntary_switches: Some(0),
                involuntary_switches: Some(0),
                system_interrupts: Some(1),
                system_context_switches: Some(1),
                ..sonde_wire::CpuReport::default()
            }),
            placement: crate::session::Placement::default(),
            socket: None,
        };
        let mut m = meta(&target(), SessionId(1), 0, 0);
        add_context(&mut m, &ctx, None);
        assert_eq!(m.hosts.client, ctx.client_host);
        assert_eq!(m.hosts.server, None);
        assert_eq!(
            m.cpu.client.as_ref().unwrap().percent_of_one_core,
            Some(50.0)
        );
        assert_eq!(m.cpu.server, None);
        assert_eq!(m.warnings.len(), 2, "{:?}", m.warnings);
        assert!(m.warnings[0].contains("hosts.server is null"));
        assert!(m.warnings[1].contains("cpu.server is null"));
    }

    #[test]
    fn a_host_without_rusage_says_so_and_other_servers_are_not_warned_about() {
        let ctx = Context {
            agent: true,
            server_host: Some(sonde_wire::HostInfo::default()),
            ..Context::default()
        };
        let cpu = sonde_wire::CpuReport {
            voluntary_switches: Some(3),
            involuntary_switches: Some(0),
            system_interrupts: Some(1),
            system_context_switches: Some(1),
            ..sonde_wire::CpuReport::default()
        };
        let mut m = meta(&target(), SessionId(1), 0, 0);
        add_context(&mut m, &ctx, Some(&cpu));
        assert_eq!(m.cpu.client, None);
        assert!(m.cpu.server.is_some());
        assert_eq!(m.warnings.len(), 1, "{:?}", m.warnings);
        assert!(m.warnings[0].contains("cpu.client is null"));
        // Not a sonde agent (a sockperf server): what it cannot report is expected.
        let mut m = meta(&target(), SessionId(0), 0, 0);
        add_context(&mut m, &Context::default(), None);
        assert_eq!((m.cpu.client.clone(), m.cpu.server.clone()), (None, None));
        assert!(m.warnings.is_empty(), "{:?}", m.warnings);
    }

    /// A Windows end measures CPU time but no context switches: they are null with a
    /// warning that names the side, never 0.
    #[test]
    fn switches_a_platform_does_not_count_are_null_with_a_warning() {
        let windows = sonde_wire::CpuReport {
            wall_ns: 1_000,
            user_ns: 500,
            system_interrupts: Some(10),
            system_context_switches: Some(20),
            system_syscalls: Some(30),
            system_softirq_ns: None,
            ..sonde_wire::CpuReport::default()
        };
        let ctx = Context {
            agent: true,
            server_host: Some(sonde_wire::HostInfo::default()),
            client_cpu: Some(sonde_wire::CpuReport {
                voluntary_switches: Some(4),
                involuntary_switches: Some(1),
                ..windows
            }),
            ..Context::default()
        };
        let mut m = meta(&target(), SessionId(1), 0, 0);
        add_context(&mut m, &ctx, Some(&windows));
        let server = m.cpu.server.as_ref().unwrap();
        assert_eq!(server.percent_of_one_core, Some(50.0));
        assert_eq!(
            (
                server.voluntary_context_switches,
                server.involuntary_context_switches
            ),
            (None, None)
        );
        let client = m.cpu.client.as_ref().unwrap();
        assert_eq!(client.voluntary_context_switches, Some(4));
        assert_eq!(m.warnings.len(), 1, "{:?}", m.warnings);
        assert!(m.warnings[0].contains("cpu.server.voluntary_context_switches"));
        // With its code beside it (it had none, and put the codes out of step).
        assert_eq!(
            m.warning_codes,
            [sonde_report::WarningCode::ContextSwitchesUnknown]
        );
    }

    /// An end whose host-wide counters could not be read (wine, a Windows without the
    /// performance counters) has them null with a warning naming the side and the fields; a
    /// Linux end, which counts interrupts and context switches but never system calls, has none.
    #[test]
    fn host_counters_not_read_are_null_with_a_warning() {
        let linux = sonde_wire::CpuReport {
            wall_ns: 1_000_000_000,
            user_ns: 500,
            voluntary_switches: Some(1),
            involuntary_switches: Some(1),
            system_interrupts: Some(10),
            system_context_switches: Some(20),
            ..sonde_wire::CpuReport::default()
        };
        let wine = sonde_wire::CpuReport {
            system_interrupts: None,
            system_context_switches: None,
            ..linux
        };
        let ctx = Context {
            agent: true,
            server_host: Some(sonde_wire::HostInfo::default()),
            client_cpu: Some(linux),
            ..Context::default()
        };
        let mut m = meta(&target(), SessionId(1), 0, 0);
        add_context(&mut m, &ctx, Some(&linux));
        assert!(m.warnings.is_empty(), "{:?}", m.warnings);
        let client = m.cpu.client.as_ref().unwrap();
        assert_eq!(client.system_interrupts_per_second, Some(10.0));
        assert_eq!(client.system_syscalls_per_second, None);

        let mut m = meta(&target(), SessionId(1), 0, 0);
        add_context(&mut m, &ctx, Some(&wine));
        assert_eq!(
            m.warning_codes,
            [sonde_report::WarningCode::SystemCountersUnknown]
        );
        assert!(
            m.warnings[0].contains(
                "cpu.server.system_interrupts_per_second, system_context_switches_per_second, \
                 system_syscalls_per_second are null"
            ),
            "{:?}",
            m.warnings
        );
        let server = m.cpu.server.as_ref().unwrap();
        assert_eq!(server.system_interrupts_per_second, None);
        assert_eq!(server.system_context_switches_per_second, None);
    }
}
