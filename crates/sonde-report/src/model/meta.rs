//! What every result carries: [`Meta`] and its typed warnings, the peer and the transport.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::context::{CpuCosts, Hosts};

/// Facts common to every result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Meta {
    /// sonde's version.
    pub sonde_version: String,
    /// When the test started, milliseconds since the Unix epoch.
    pub timestamp_unix_ms: u64,
    /// The agent's address as the client reached it.
    pub server: String,
    /// What answered at `server`: a sonde agent, or a real iperf3 or sockperf server.
    #[serde(default)]
    pub peer: Peer,
    /// The agent's session id (0 when the peer is not a sonde agent).
    pub session: u64,
    /// The largest number of other sessions the agent ran during this one (0: it had the agent
    /// to itself).
    pub overlapping_sessions: u32,
    /// Things the reader must know to trust the numbers (overlap, too few samples, loss...).
    pub warnings: Vec<String>,
    /// What each of `warnings` is about, in the same order: a stable code a report can group
    /// and count by. Add warnings with [`Meta::add`], which keeps the two in step.
    #[serde(default)]
    pub warning_codes: Vec<WarningCode>,
    /// `--label KEY=VALUE`: the case this run measured (`{"path": "private"}`); `quick` adds
    /// `case`, a sweep the parameter and its value. Empty when none was given.
    #[serde(default)]
    pub labels: Labels,
    /// Stopped before its time (Ctrl-C or SIGTERM): the figures cover what was measured until
    /// then. Absent when the test ran its course.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub interrupted: bool,
    /// Both ends' configuration: CPU, memory, OS and kernel, the interface the test used,
    /// TCP congestion control, socket buffer limits, sonde's version.
    #[serde(default)]
    pub hosts: Hosts,
    /// What the test cost each end in CPU.
    #[serde(default)]
    pub cpu: CpuCosts,
    /// The agent process that ran the test, and whether `server` placed the test's channels on
    /// other agents first (a load balancer). Absent for a peer that is not a sonde agent and
    /// for an agent older than this field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<ServedBy>,
    /// Each data stream's source address and port: as this host opened it and as the agent
    /// saw it (they differ behind a NAT; an iperf3 server does not say, so `seen_by_server` is
    /// `null` there). Absent for tests without data streams (crr), against sockperf servers,
    /// and in results older than the field.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sources: Vec<StreamSource>,
    /// What the interface at each end counted over the test: packets, bytes, drops and errors
    /// each way. Absent where neither end could read its interface, and in results older than
    /// the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interfaces: Option<super::context::EndsInterfaces>,
}

/// Where one data stream came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct StreamSource {
    /// The stream's index (a throughput stream, a pps flow; 0 for latency).
    pub stream: u32,
    /// Its local address and port at this host (`-B`, `--cport`, or the kernel's choice).
    pub client: Option<String>,
    /// Its source address and port as the agent saw them; `null` from an agent that does not
    /// report it (older than the field).
    pub seen_by_server: Option<String>,
}

/// Which agent served a test, as it named itself, and the other agents behind the same
/// address.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ServedBy {
    /// The agent process: 16 hex digits, drawn when it started.
    pub id: String,
    /// The address and port the agent saw the test's control connection arrive at: behind a
    /// load balancer or a destination NAT its own address, not the one the client dialled.
    pub addr: String,
    /// Other agents that answered this test's data channels at `server`: it is a load
    /// balancer, which placed those channels there first. Empty on a direct path.
    pub other_agents: Vec<String>,
    /// Data channels opened again from a new source port because the balancer had placed them
    /// on another agent, until they reached this one.
    pub reopened_channels: u32,
}

impl Meta {
    /// Adds a warning: its text (its `Display`) and its code, side by side.
    pub fn add(&mut self, warning: &Warning) {
        self.warnings.push(warning.to_string());
        self.warning_codes.push(warning.code());
    }

    /// Adds typed warnings gathered before the meta was made, in order.
    pub fn add_all<'a>(&mut self, warnings: impl IntoIterator<Item = &'a Warning>) {
        for w in warnings {
            self.add(w);
        }
    }

    /// Takes out every warning with `code`.
    pub fn remove_warnings(&mut self, code: WarningCode) {
        let keep: Vec<bool> = self.warning_codes.iter().map(|&c| c != code).collect();
        let mut i = 0;
        self.warnings.retain(|_| {
            let k = keep.get(i).copied().unwrap_or(true);
            i += 1;
            k
        });
        self.warning_codes.retain(|&c| c != code);
    }
}

/// What a warning is about. The code is stable (a report groups and counts warnings by it); the
/// text beside it in [`Meta::warnings`] says the details. New codes are added, none is renamed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum WarningCode {
    /// The agent ran other sessions during this one.
    OverlappingSessions,
    /// This host cannot measure the test's CPU cost.
    ClientCpuUnknown,
    /// The agent did not report its configuration (an older agent).
    ServerConfigurationUnknown,
    /// The agent did not report the test's CPU cost.
    ServerCpuUnknown,
    /// Too few samples for some percentiles: they are not stated.
    TooFewSamples,
    /// Messages or datagrams were lost.
    Loss,
    /// Open loop: sends left late; the client could not keep the rate.
    LateSends,
    /// Many-flow open loop: requests due never left (flows held at their depth).
    UnsentRequests,
    /// The senders did not reach the rate asked: the sending host is the limit.
    SenderLimited,
    /// The receivers counted nothing.
    NothingReceived,
    /// crr: the client ran out of local ports.
    PortsExhausted,
    /// crr: the agent reported no count; the rate is the client's.
    AgentCountMissing,
    /// crr: the agent's and the client's counts differ.
    CountsDiffer,
    /// crr: no transaction completed.
    NoTransaction,
    /// The peer (an iperf3 or sockperf server) does not report a figure: it is null or 0.
    PeerDoesNotReport,
    /// Intervals were counted at this host, not at the receivers.
    IntervalsCountedHere,
    /// The iperf3 server ended the test in an unusual way.
    UncleanEnd,
    /// `--full-log`: the log does not hold every sample.
    FullLogIncomplete,
    /// `--timestamps`: kernel timestamps missing or inconsistent for some or all samples.
    KernelTimestamps,
    /// `--one-way`: some or all one-way figures could not be computed.
    OneWayIncomplete,
    /// `--one-way`: the clock estimate is too uncertain to split the directions.
    OneWayUncertain,
    /// load: the load stopped before the loaded probes ended.
    LoadEndedEarly,
    /// load: the load's receivers counted nothing.
    NoLoad,
    /// Stopped before its time (Ctrl-C, SIGTERM).
    Interrupted,
    /// An end's platform does not count context switches per thread (Windows): they are null.
    ContextSwitchesUnknown,
    /// An end's host-wide counters (interrupts, context switches, system calls per second)
    /// could not be read: no `/proc/stat`, a Windows without the performance counters, wine.
    SystemCountersUnknown,
    /// A sending end's platform has no `TCP_INFO` (Windows, macOS): retransmits and tcp_info
    /// are null.
    TcpInfoUnknown,
    /// `--busy-poll`, `--cpu`, `--read-size`: an end did not busy-poll, pin or read as asked (an
    /// agent older than the option, or the kernel refused).
    NotTuned,
    /// The address tested balances connections over several agents: the channels were kept
    /// on the session's agent, and the figures are that agent's alone.
    Balancer,
    /// `-w`, `-C`, `-M`, `-N`, `-S`/`--dscp`/`--ecn`, `--fq-rate`, `--dont-fragment`: an end's
    /// kernel applied a socket option otherwise than asked (a capped buffer, a clamped MSS, TCP's
    /// own ECN bits), or the agent did not apply them (it predates the options).
    SocketOptionDiffers,
    /// The agent saw a stream come from another address or port than this host sent it from:
    /// a source NAT (or a proxy) is in the path.
    SourceTranslated,
    /// The interface at one end dropped packets (or counted errors) during the test: packets
    /// lost there never reached a socket, so the receivers' counts do not show them.
    InterfaceDrops,
    /// A driver statistic that counts a cloud provider's limit rose during the test (AWS ENA's
    /// `pps_allowance_exceeded`, virtio-net's `rx0_hw_ratelimit_packets`, ...): the instance
    /// held packets back, not the path.
    CloudLimitExceeded,
    /// A driver statistic that counts packets the virtual NIC or its driver dropped or held
    /// back rose during the test (gVNIC's `rx_no_buffers_posted[q]`, MANA's
    /// `hc_rx_discards_no_wqe`, netvsc's `tx_no_space`, ...): the host's own receive or send
    /// path fell behind, which the interface's counters may not show.
    DriverDrops,
    /// `sonde mtu`: the path carries smaller packets than the local interface sends (a tunnel,
    /// an overlay, a clamp): the MTU to set.
    PathMtuBelowInterface,
    /// `sonde mtu`: larger packets vanish without a router saying so (a PMTU black hole).
    PathMtuBlackHole,
    /// `sonde mtu`: the search ran out of time or probes, or was stopped, before its end.
    MtuSearchIncomplete,
    /// `sonde mtu`: the TCP connection that reads each end's MSS failed.
    TcpMssUnknown,
    /// `--ecn`: datagrams arrived marked CE: a router on the path signalled congestion.
    EcnCongestion,
    /// `--ecn`: datagrams sent ECT arrived Not-ECT: the path bleaches the ECN field.
    EcnBleached,
    /// `-Z`: an end's kernel copied some or all of its zero-copy sends after all (loopback,
    /// veth, a device without scatter-gather): its CPU cost includes the copy.
    ZerocopyCopied,
    /// A code this version does not know (from a newer sonde).
    #[serde(other)]
    Other,
}

/// How the overlap warning's text starts, to find it again.
pub const OVERLAP_WARNING_START: &str = "the agent ran ";

/// A warning with the figures it needs: its [`code`](Self::code) is stable, its text is its
/// `Display` (hyperfine's `Warnings` is the model). A result's [`Meta`] keeps both, side by
/// side (`warnings`, `warning_codes`), through [`Meta::add`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Warning {
    /// The agent ran this many other sessions during this one.
    OverlappingSessions {
        /// Other sessions.
        sessions: u32,
    },
    /// This host cannot measure the test's CPU cost.
    ClientCpuUnknown,
    /// The agent did not report its configuration.
    ServerConfigurationUnknown,
    /// The agent did not report the test's CPU cost.
    ServerCpuUnknown,
    /// One end's platform does not count context switches per thread.
    ContextSwitchesUnknown {
        /// `client` or `server`.
        side: &'static str,
    },
    /// One end could not read the host-wide interrupt or context switch counts.
    SystemCountersUnknown {
        /// `client` or `server`.
        side: &'static str,
        /// The `cpu.{side}` fields that are null (`system_interrupts_per_second`, ...).
        fields: Vec<&'static str>,
    },
    /// Too few samples for the percentiles from `from_percentile` up.
    TooFewSamples {
        /// Samples taken.
        samples: u64,
        /// The first percentile not stated (99.9 for p99.9).
        from_percentile: f64,
        /// Samples it needs.
        needed: u64,
    },
    /// No RTT sample after the warm-up.
    NoSample,
    /// Latency: messages that got no reply.
    LostMessages {
        /// Without a reply.
        lost: u64,
        /// Sent.
        sent: u64,
        /// `lost` in % of `sent`.
        percent: f64,
    },
    /// Open loop: sends that left more than 1 ms late.
    LateSends {
        /// Late sends.
        late: u64,
    },
    /// Many-flow open loop: requests due before the end that never left, the flows being at
    /// their `--depth` limit.
    UnsentRequests {
        /// Requests never sent.
        unsent: u64,
        /// Requests due before the end, all flows.
        due: u64,
        /// The depth limit per flow.
        depth: u32,
    },
    /// Throughput (UDP): datagrams lost.
    LostDatagrams {
        /// Lost.
        lost: u64,
        /// Sent.
        sent: u64,
        /// `lost` in % of `sent`.
        percent: f64,
    },
    /// Throughput (UDP): the senders did not reach the rate asked.
    SenderLimited {
        /// Reached, bits/s.
        reached_bits_per_second: f64,
        /// Asked, bits/s.
        asked_bits_per_second: f64,
    },
    /// Throughput (TCP): a sending end has no `TCP_INFO`.
    TcpInfoUnknown,
    /// `--busy-poll`, `--cpu`, `--read-size`: an end did not run as asked.
    NotTuned {
        /// What it did instead, and why.
        detail: String,
    },
    /// A socket option as an end's kernel applied it differs from what was asked.
    SocketOptionDiffers {
        /// `client` or `server`.
        side: &'static str,
        /// The option (`-w/--window`, `-M/--set-mss`, ...).
        option: &'static str,
        /// What was asked, as a person reads it.
        asked: String,
        /// What the kernel made of it, and why where known.
        applied: String,
    },
    /// Throughput: the receivers counted nothing.
    NothingReceived,
    /// pps: datagrams lost at full rate.
    PpsLoss {
        /// Lost.
        lost: u64,
        /// Sent.
        sent: u64,
        /// `lost` in % of `sent`.
        percent: f64,
    },
    /// Stopped before its planned end (Ctrl-C or SIGTERM).
    Interrupted,
    /// crr: the client ran out of local ports.
    PortsExhausted {
        /// Connections made before.
        connections: u64,
        /// When the test stopped, seconds.
        stopped_after_s: f64,
        /// The test's planned length, seconds.
        asked_s: f64,
    },
    /// crr: the agent reported no count.
    AgentCountMissing,
    /// crr: the agent's and the client's transaction counts differ.
    CountsDiffer {
        /// Counted by the agent.
        agent: u64,
        /// Counted by the client.
        client: u64,
    },
    /// crr: no transaction completed.
    NoTransaction {
        /// Attempts that failed.
        failed_attempts: u64,
    },
    /// sockperf:// over UDP: the loss cannot be split by direction.
    SockperfLossNotSplit,
    /// sockperf://: whether the server served other clients is not known.
    SockperfOverlapUnknown,
    /// load: the load stopped before the loaded probes ended.
    LoadEndedEarly,
    /// load: the load's receivers counted nothing.
    NoLoad,
    /// `sonde conf HOST`: the agent did not describe itself.
    ConfServerUnknown,
    /// `--full-log`: writing the log failed part way.
    FullLogFailed {
        /// The log's path.
        path: String,
        /// Why.
        error: String,
        /// Samples it holds.
        written: u64,
    },
    /// `--full-log`: the writer could not keep up.
    FullLogDropped {
        /// The log's path.
        path: String,
        /// Samples left out of it.
        dropped: u64,
    },
    /// `--timestamps`: no kernel receive timestamps on the socket.
    NoRxTimestamps {
        /// Why.
        why: String,
    },
    /// `--timestamps`: no kernel transmit timestamps.
    NoTxTimestamps {
        /// Why.
        why: String,
    },
    /// `--timestamps`: some samples had no kernel transmit timestamp.
    TxStampsMissing {
        /// Samples without.
        missing: u64,
        /// Samples with a receive timestamp.
        of: u64,
    },
    /// `--timestamps`: some replies had no kernel receive timestamp.
    RxStampsMissing {
        /// Replies without.
        missing: u64,
        /// Samples.
        of: u64,
    },
    /// `--timestamps`: kernel figures longer than the application's RTT.
    KernelStampsInconsistent {
        /// Samples affected.
        samples: u64,
    },
    /// `--one-way`: replies without the agent's timestamps.
    OneWayUnstamped {
        /// Replies without.
        unstamped: u64,
        /// One-way samples from the others.
        samples: u64,
    },
    /// `--one-way`: stamped replies that could not be converted.
    OneWayUnconverted {
        /// Replies.
        replies: u64,
    },
    /// `--one-way`: no usable clock exchange.
    OneWayNoClock,
    /// `--one-way`: no probe after the warm-up carried the agent's timestamps.
    OneWayNoProbe,
    /// `--one-way`: the clock estimate is more uncertain than a median one-way delay.
    OneWayUncertain {
        /// ± this many ns.
        uncertainty_ns: u64,
    },
    /// iperf3:// over TCP: the server does not report its read calls.
    Iperf3ReadsUncounted,
    /// iperf3:// over TCP: the server does not report its write calls.
    Iperf3WritesUncounted,
    /// iperf3:// over UDP: the server's count of client→server datagrams.
    Iperf3DatagramsCountedByServer,
    /// iperf3://: intervals counted at this host (both directions).
    IntervalsCountedHereBidir,
    /// iperf3://: intervals counted at this host, the sender.
    IntervalsCountedAtSender,
    /// iperf3://: the server closed instead of ending the test.
    UncleanEnd,
    /// load: a balancer placed the probes and the load on different agents.
    LoadOnOtherAgent {
        /// The probes' agent, as it saw itself.
        probes: String,
        /// The load's agent.
        load: String,
    },
    /// Connections a balancer placed on an agent the client had not found.
    UnfoundAgent {
        /// Such connections.
        connections: u64,
    },
    /// The address tested spread a crr test's connections over several agents.
    SpreadOverAgents {
        /// Agents that served the test.
        agents: usize,
    },
    /// The address tested balanced the test's channels over several agents.
    Balancer {
        /// Agents seen, the session's included.
        agents: usize,
        /// Channels opened again until they reached the session's agent.
        reopened: u32,
        /// The session's agent, as it saw itself (`ServedBy::addr`).
        agent: String,
    },
    /// `--ecn`: datagrams of a direction arrived marked CE.
    EcnCongestion {
        /// `client → server` or `server → client`.
        direction: &'static str,
        /// Datagrams marked CE.
        ce: u64,
        /// Datagrams counted.
        received: u64,
    },
    /// TCP with `--ecn` (ECN negotiated): a direction's senders were told of CE-marked segments
    /// (`tcpi_delivered_ce`).
    TcpEcnCongestion {
        /// `client → server` or `server → client`.
        direction: &'static str,
        /// Segments acknowledged as CE-marked, all streams of the direction.
        delivered_ce: u64,
    },
    /// `--ecn`: datagrams of a direction sent ECT arrived Not-ECT.
    EcnBleached {
        /// `client → server` or `server → client`.
        direction: &'static str,
        /// Datagrams that arrived Not-ECT.
        not_ect: u64,
        /// Datagrams counted.
        received: u64,
    },
    /// `-Z`: an end's kernel copied zero-copy sends after all.
    ZerocopyCopied {
        /// `client` or `server`.
        side: &'static str,
        /// Sends the kernel copied (`SO_EE_CODE_ZEROCOPY_COPIED`).
        copied: u64,
        /// Sends whose completion the end read.
        completed: u64,
    },
    /// The agent saw a stream's packets come from `seen`, sent from `client`.
    SourceTranslated {
        /// The stream.
        stream: u32,
        /// Where this host sent it from.
        client: String,
        /// Where the agent saw it come from.
        seen: String,
    },
    /// A cloud limit's driver statistic rose during the test.
    CloudLimitExceeded {
        /// "this host's" or "the agent's".
        end: &'static str,
        /// The interface.
        interface: String,
        /// The statistic, by how much it rose, over how many queues.
        signal: super::context::DriverSignal,
    },
    /// A driver's count of packets it or the virtual NIC dropped rose during the test.
    DriverDrops {
        /// "this host's" or "the agent's".
        end: &'static str,
        /// The interface.
        interface: String,
        /// The statistic, by how much it rose, over how many queues.
        signal: super::context::DriverSignal,
    },
    /// An interface dropped packets or counted errors during the test.
    InterfaceDrops {
        /// "this host's" or "the agent's".
        end: &'static str,
        /// The interface counted.
        delta: sonde_wire::InterfaceDelta,
    },
    /// `sonde mtu`: the path MTU is below the local interface's.
    PathMtuBelowInterface {
        /// The path MTU found, bytes.
        path: u32,
        /// The local interface's MTU, bytes.
        interface: u32,
        /// How it was learnt: `198.18.0.2 said so`, `by silence: no router said so`.
        how: String,
        /// The TCP MSS that fits it, bytes (less 40 for IPv4's and TCP's headers, 60 for
        /// IPv6's).
        mss: u32,
    },
    /// `sonde mtu`: probes above `above` bytes went unanswered and no router said why.
    PathMtuBlackHole {
        /// The largest size that crossed, bytes.
        crossed: u32,
        /// The smallest that did not, bytes.
        above: u32,
    },
    /// `sonde mtu`: the TCP exchange did not come back in time.
    TcpStalledOnPath {
        /// Bytes sent each way.
        bytes: u64,
        /// Its timeout, s.
        within_s: u64,
        /// This host's MSS, bytes, where known.
        mss: Option<u32>,
    },
    /// `sonde mtu`: the TCP connection that reads each end's MSS failed.
    TcpMssUnknown {
        /// Why, as the client's error says it.
        reason: String,
    },
    /// `sonde mtu`: the search stopped before its end.
    MtuSearchIncomplete {
        /// Why: its time, its probe count, an interrupt.
        why: String,
        /// The size range still open, bytes.
        between: (u32, u32),
    },
}

impl Warning {
    /// The stable code a report groups and counts by.
    pub fn code(&self) -> WarningCode {
        match self {
            Self::OverlappingSessions { .. } => WarningCode::OverlappingSessions,
            Self::ClientCpuUnknown => WarningCode::ClientCpuUnknown,
            Self::ServerConfigurationUnknown => WarningCode::ServerConfigurationUnknown,
            Self::ServerCpuUnknown => WarningCode::ServerCpuUnknown,
            Self::ContextSwitchesUnknown { .. } => WarningCode::ContextSwitchesUnknown,
            Self::SystemCountersUnknown { .. } => WarningCode::SystemCountersUnknown,
            Self::TooFewSamples { .. } | Self::NoSample => WarningCode::TooFewSamples,
            Self::LostMessages { .. } | Self::LostDatagrams { .. } | Self::PpsLoss { .. } => {
                WarningCode::Loss
            }
            Self::LateSends { .. } => WarningCode::LateSends,
            Self::UnsentRequests { .. } => WarningCode::UnsentRequests,
            Self::SenderLimited { .. } => WarningCode::SenderLimited,
            Self::TcpInfoUnknown => WarningCode::TcpInfoUnknown,
            Self::NotTuned { .. } => WarningCode::NotTuned,
            Self::SocketOptionDiffers { .. } => WarningCode::SocketOptionDiffers,
            Self::NothingReceived => WarningCode::NothingReceived,
            Self::Interrupted => WarningCode::Interrupted,
            Self::PortsExhausted { .. } => WarningCode::PortsExhausted,
            Self::AgentCountMissing => WarningCode::AgentCountMissing,
            Self::CountsDiffer { .. } => WarningCode::CountsDiffer,
            Self::NoTransaction { .. } => WarningCode::NoTransaction,
            Self::SockperfLossNotSplit | Self::SockperfOverlapUnknown => {
                WarningCode::PeerDoesNotReport
            }
            Self::LoadEndedEarly => WarningCode::LoadEndedEarly,
            Self::NoLoad => WarningCode::NoLoad,
            Self::ConfServerUnknown => WarningCode::ServerConfigurationUnknown,
            Self::FullLogFailed { .. } | Self::FullLogDropped { .. } => {
                WarningCode::FullLogIncomplete
            }
            Self::NoRxTimestamps { .. }
            | Self::NoTxTimestamps { .. }
            | Self::TxStampsMissing { .. }
            | Self::RxStampsMissing { .. }
            | Self::KernelStampsInconsistent { .. } => WarningCode::KernelTimestamps,
            Self::OneWayUnstamped { .. }
            | Self::OneWayUnconverted { .. }
            | Self::OneWayNoClock
            | Self::OneWayNoProbe => WarningCode::OneWayIncomplete,
            Self::OneWayUncertain { .. } => WarningCode::OneWayUncertain,
            Self::Iperf3ReadsUncounted
            | Self::Iperf3WritesUncounted
            | Self::Iperf3DatagramsCountedByServer => WarningCode::PeerDoesNotReport,
            Self::IntervalsCountedHereBidir | Self::IntervalsCountedAtSender => {
                WarningCode::IntervalsCountedHere
            }
            Self::UncleanEnd => WarningCode::UncleanEnd,
            Self::SourceTranslated { .. } => WarningCode::SourceTranslated,
            Self::InterfaceDrops { .. } => WarningCode::InterfaceDrops,
            Self::CloudLimitExceeded { .. } => WarningCode::CloudLimitExceeded,
            Self::DriverDrops { .. } => WarningCode::DriverDrops,
            Self::PathMtuBelowInterface { .. } => WarningCode::PathMtuBelowInterface,
            Self::PathMtuBlackHole { .. } | Self::TcpStalledOnPath { .. } => {
                WarningCode::PathMtuBlackHole
            }
            Self::MtuSearchIncomplete { .. } => WarningCode::MtuSearchIncomplete,
            Self::TcpMssUnknown { .. } => WarningCode::TcpMssUnknown,
            Self::ZerocopyCopied { .. } => WarningCode::ZerocopyCopied,
            Self::EcnCongestion { .. } | Self::TcpEcnCongestion { .. } => {
                WarningCode::EcnCongestion
            }
            Self::EcnBleached { .. } => WarningCode::EcnBleached,
            Self::Balancer { .. }
            | Self::SpreadOverAgents { .. }
            | Self::UnfoundAgent { .. }
            | Self::LoadOnOtherAgent { .. } => WarningCode::Balancer,
        }
    }
}

impl std::fmt::Display for Warning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::OverlappingSessions { sessions } => write!(
                f,
                "{OVERLAP_WARNING_START}{sessions} other session(s) during this test: they \
                 shared its CPU and network, so these numbers are not those of an idle path"
            ),
            Self::ClientCpuUnknown => f.write_str(
                "this host cannot measure the test's CPU cost (no per-thread getrusage here): \
                 cpu.client is null",
            ),
            Self::ServerConfigurationUnknown => f.write_str(
                "the agent did not report its configuration (an older sonde agent?): \
                 hosts.server is null",
            ),
            Self::ServerCpuUnknown => f.write_str(
                "the agent did not report the test's CPU cost (an older sonde agent, or one \
                 that cannot measure it): cpu.server is null",
            ),
            Self::ContextSwitchesUnknown { side } => write!(
                f,
                "the {side}'s platform does not count context switches per thread (Windows): \
                 cpu.{side}.voluntary_context_switches and involuntary_context_switches are \
                 null"
            ),
            Self::SystemCountersUnknown { side, fields } => write!(
                f,
                "the {side} could not read the host-wide counters (no /proc/stat, a Windows \
                 without the performance counters, wine, or an older sonde agent): \
                 cpu.{side}.{} {} null",
                fields.join(", "),
                if fields.len() == 1 { "is" } else { "are" }
            ),
            Self::TooFewSamples {
                samples,
                from_percentile,
                needed,
            } => write!(
                f,
                "{samples} samples: percentiles from p{from_percentile} up need at least \
                 {needed} and are not stated; run longer (-t) for the tail"
            ),
            Self::NoSample => f.write_str("no RTT sample was taken after the warm-up"),
            Self::LostMessages {
                lost,
                sent,
                percent,
            } => write!(
                f,
                "{lost} of {sent} messages got no reply ({percent:.3}% loss)"
            ),
            Self::LateSends { late } => write!(
                f,
                "{late} sends left more than 1 ms after their scheduled time: the client could \
                 not keep --rate (or, with -P/--depth, a flow was at its limit waiting for \
                 responses); their RTT counts from the schedule"
            ),
            Self::UnsentRequests { unsent, due, depth } => write!(
                f,
                "{unsent} of {due} requests due were never sent: the flows were at --depth \
                 {depth} requests outstanding until the end, so the rate achieved is below \
                 --rate (a larger --depth or more flows lets more go; the responses are the \
                 limit)"
            ),
            Self::LostDatagrams {
                lost,
                sent,
                percent,
            } => write!(f, "{lost} of {sent} datagrams were lost ({percent:.3}%)"),
            Self::SenderLimited {
                reached_bits_per_second,
                asked_bits_per_second,
            } => write!(
                f,
                "the senders reached {:.1} Mbit/s of the {:.1} Mbit/s asked: the sending host \
                 is the limit",
                reached_bits_per_second / 1e6,
                asked_bits_per_second / 1e6
            ),
            Self::TcpInfoUnknown => f.write_str(
                "a sending end's platform has no TCP_INFO (Windows, macOS): retransmits and \
                 tcp_info are null for the streams it sent",
            ),
            Self::NotTuned { detail } => f.write_str(detail),
            Self::SocketOptionDiffers {
                side,
                option,
                asked,
                applied,
            } => write!(f, "{option} {asked}: the {side}'s kernel applied {applied}"),
            Self::NothingReceived => f.write_str("nothing was received"),
            Self::PpsLoss {
                lost,
                sent,
                percent,
            } => write!(
                f,
                "{lost} of {sent} datagrams were lost ({percent:.2}%): at full rate the usual \
                 place is the receiver's socket buffer or NIC queue; received_pps is what got \
                 through"
            ),
            Self::Interrupted => f.write_str(
                "interrupted before its planned end (Ctrl-C or SIGTERM): the figures cover what \
                 was measured until then",
            ),
            Self::PortsExhausted {
                connections,
                stopped_after_s,
                asked_s,
            } => write!(
                f,
                "the client ran out of local ports (EADDRNOTAVAIL) after {connections} \
                 connections: each connection it closes holds its port in TIME_WAIT (60 s on \
                 Linux), so the test stopped after {stopped_after_s:.3} s of the {asked_s:.3} s \
                 asked and the rates are for that time only; --rst (no TIME_WAIT), a wider \
                 net.ipv4.ip_local_port_range or net.ipv4.tcp_tw_reuse=1 lift the limit"
            ),
            Self::AgentCountMissing => f.write_str(
                "the agent reported no count (an older agent?): the rate is the client's alone",
            ),
            Self::CountsDiffer { agent, client } => write!(
                f,
                "the agent completed {agent} transactions and the client {client}: {}",
                if agent > client {
                    "the client gave up on some the agent had answered (timeouts, resets)"
                } else {
                    "the agent did not see the client's close after some responses"
                }
            ),
            Self::NoTransaction { failed_attempts } => write!(
                f,
                "no transaction completed ({failed_attempts} attempts failed)"
            ),
            Self::SockperfLossNotSplit => f.write_str(
                "the peer is a sockperf server, which reports no counts: UDP loss cannot be \
                 split into requests lost on the way out and replies lost on the way back \
                 (lost_outbound and lost_return are null)",
            ),
            Self::SockperfOverlapUnknown => f.write_str(
                "the peer is a sockperf server, which reports no counts: whether it served \
                 other clients during this test is not known",
            ),
            Self::LoadEndedEarly => f.write_str(
                "the load's senders stopped before the loaded probes ended: the last probes \
                 may have seen an idle path",
            ),
            Self::NoLoad => f.write_str(
                "the load's receivers counted no bytes: these probes did not run under load",
            ),
            Self::ConfServerUnknown => f.write_str(
                "the agent did not report its configuration (a sonde agent older than this \
                 client?)",
            ),
            Self::FullLogFailed {
                path,
                error,
                written,
            } => write!(
                f,
                "writing the full log {path} failed ({error}): it holds {written} of the samples"
            ),
            Self::FullLogDropped { path, dropped } => write!(
                f,
                "the full log {path} dropped {dropped} samples: its writer could not keep up (a \
                 slow disk?); the statistics have every sample"
            ),
            Self::NoRxTimestamps { why } => write!(
                f,
                "--timestamps: the kernel gave no receive timestamps on this socket ({why}): the \
                 RTT at the sockets is not measured (socket_rtt figures are null)"
            ),
            Self::NoTxTimestamps { why } => write!(
                f,
                "--timestamps: no kernel transmit timestamps ({why}): socket_rtt_ns and host_ns \
                 are null; send_to_socket_rx_ns (from the application's send to the reply's \
                 kernel receive) stands in, and still holds the send side's host time"
            ),
            Self::TxStampsMissing { missing, of } => write!(
                f,
                "--timestamps: {missing} of {of} samples had no kernel transmit timestamp; the \
                 socket RTT is from the others"
            ),
            Self::RxStampsMissing { missing, of } => write!(
                f,
                "--timestamps: {missing} of {of} replies had no kernel receive timestamp"
            ),
            Self::KernelStampsInconsistent { samples } => write!(
                f,
                "--timestamps: in {samples} samples a kernel figure came out longer than the \
                 application's RTT (the wall clock the kernel stamps with was stepped?)"
            ),
            Self::OneWayUnstamped { unstamped, samples } => write!(
                f,
                "--one-way: {unstamped} replies came back without the agent's timestamps (an \
                 older sonde agent?); one-way delays are from the other {samples}"
            ),
            Self::OneWayUnconverted { replies } => write!(
                f,
                "--one-way: {replies} stamped replies could not be converted (no clock estimate \
                 yet, or timestamps that contradict each other)"
            ),
            Self::OneWayNoClock => f.write_str(
                "--one-way: no clock exchange with the agent was usable, so its clock's offset \
                 is unknown: the one-way figures are null",
            ),
            Self::OneWayNoProbe => f.write_str(
                "--one-way: no probe after the warm-up carried the agent's timestamps: the \
                 one-way figures are null",
            ),
            Self::OneWayUncertain { uncertainty_ns } => write!(
                f,
                "--one-way: the clock estimate is uncertain by ± {uncertainty_ns} ns, more than \
                 a median one-way delay: the split between the two directions is not resolved \
                 here (their sum, the RTT less the agent's hold, is)"
            ),
            Self::SourceTranslated {
                stream,
                client,
                seen,
            } => write!(
                f,
                "the agent saw {seen} for {client} (stream {stream}): a source NAT or a proxy \
                 is in the path, and what the agent applies to its end goes to {seen}"
            ),
            Self::CloudLimitExceeded {
                end,
                interface,
                signal,
            } => write!(
                f,
                "{end} interface {interface}: {} rose by {} during the test ({}: {}): the \
                 limit is the instance's, not the path's",
                signal_name(signal),
                signal.count,
                signal.limit.driver,
                signal.limit.meaning
            ),
            Self::DriverDrops {
                end,
                interface,
                signal,
            } => write!(
                f,
                "{end} interface {interface}: {} rose by {} during the test ({}: {}): packets \
                 lost there may not show in the interface's counters or the receivers' counts",
                signal_name(signal),
                signal.count,
                signal.limit.driver,
                signal.limit.meaning
            ),
            Self::InterfaceDrops { end, delta } => write!(
                f,
                "{end} interface {} dropped {} received and {} outgoing packets and counted {} \
                 receive and {} transmit errors during the test: packets lost at the interface \
                 never reached a socket, so the receivers' counts do not show them (a full ring \
                 or backlog, a driver or instance limit)",
                delta.name, delta.rx_dropped, delta.tx_dropped, delta.rx_errors, delta.tx_errors
            ),
            Self::PathMtuBelowInterface {
                path,
                interface,
                how,
                mss,
            } => write!(
                f,
                "the path carries IP packets of at most {path} B, less than this host's \
                 interface MTU of {interface} B ({how}): a tunnel, an overlay or a clamp is in \
                 the path; packets between {} and {interface} B need fragmenting or PMTU \
                 discovery, so set the MTU of the interface (or the overlay) to {path}, or \
                 clamp TCP's MSS to {mss}",
                path + 1,
            ),
            Self::PathMtuBlackHole { crossed, above } => write!(
                f,
                "packets of {above} B and more vanished without any router saying they were too \
                 big (no ICMP fragmentation needed / packet too big came back), while {crossed} \
                 B crossed: a PMTU black hole; TCP stalls on it unless its MSS fits (clamped \
                 on the path, or announced smaller by the far end) or PLPMTUD is on \
                 (net.ipv4.tcp_mtu_probing)"
            ),
            Self::TcpStalledOnPath {
                bytes,
                within_s,
                mss,
            } => write!(
                f,
                "{bytes} B sent to the agent's TCP echo did not all come back within {within_s} \
                 s{}: full-size TCP segments are lost on the path without a router saying so \
                 (a black hole for TCP); clamp the MSS on the path, or lower the MTU",
                mss.map_or_else(String::new, |m| format!(" (MSS {m} B)"))
            ),
            Self::TcpMssUnknown { reason } => write!(
                f,
                "the TCP connection to the agent that reads each end's MSS failed ({reason}): \
                 tcp is null; the path MTU above stands"
            ),
            Self::MtuSearchIncomplete { why, between } => write!(
                f,
                "the search stopped before its end ({why}): the path MTU lies between {} and {} \
                 B, and path_mtu_bytes is the lower bound",
                between.0, between.1
            ),
            Self::EcnCongestion {
                direction,
                ce,
                received,
            } => write!(
                f,
                "--ecn: {ce} of {received} datagrams {direction} arrived marked CE: a router on \
                 the path signalled congestion (an ECN-capable transport would have slowed down)"
            ),
            Self::TcpEcnCongestion {
                direction,
                delivered_ce,
            } => write!(
                f,
                "--ecn: the {direction} senders' TCP_INFO counts {delivered_ce} segments \
                 delivered CE-marked (tcpi_delivered_ce): a router on the path signalled \
                 congestion, and TCP slowed down for it"
            ),
            Self::EcnBleached {
                direction,
                not_ect,
                received,
            } => write!(
                f,
                "--ecn: {not_ect} of {received} datagrams {direction} were sent ECT and arrived \
                 Not-ECT: the path clears the ECN field (bleaching), so congestion cannot be \
                 signalled on it"
            ),
            Self::ZerocopyCopied {
                side,
                copied,
                completed,
            } => write!(
                f,
                "-Z: the {side}'s kernel copied {copied} of {completed} zero-copy sends after all \
                 (it does on loopback and veth, and for a device without scatter-gather): those \
                 sends were not zero-copy, and the {side}'s CPU cost includes the copy"
            ),
            Self::Iperf3ReadsUncounted => f.write_str(
                "the iperf3 server does not report its read calls: receiver `packets` of \
                 client→server streams reads 0, not a count",
            ),
            Self::Iperf3WritesUncounted => f.write_str(
                "the iperf3 server does not report its write calls: sender `packets` of \
                 server→client streams reads 0, not a count",
            ),
            Self::Iperf3DatagramsCountedByServer => f.write_str(
                "client→server datagrams are counted by the iperf3 server: it reports no \
                 duplicates or reordering (null), and counts as lost only the gaps below the \
                 highest sequence number it saw before the test ended",
            ),
            Self::IntervalsCountedHereBidir => f.write_str(
                "intervals (-i) are counted at this host: client→server streams at their \
                 sender, server→client streams at their receiver (an iperf3 server does not \
                 report its intervals)",
            ),
            Self::IntervalsCountedAtSender => f.write_str(
                "intervals (-i) are counted at this host, the sender: an iperf3 server does not \
                 report its intervals",
            ),
            Self::UncleanEnd => f.write_str(
                "the iperf3 server closed the connection after its results instead of ending \
                 the test with DISPLAY_RESULTS",
            ),
            Self::LoadOnOtherAgent { probes, load } => write!(
                f,
                "a load balancer placed the probes on the agent at {probes} and the load on the \
                 one at {load}: the load filled the path from this host through the balancer, \
                 and the added RTT is what that shared part of the path added, not what the \
                 probes' agent's own link would"
            ),
            Self::UnfoundAgent { connections } => write!(
                f,
                "{connections} connections reached an agent behind the balancer that this test \
                 had not found (the search ends after 8 new connections in a row find no new \
                 agent): they are not counted as transactions (errors.other_agent), and that \
                 agent's share is missing from the rate"
            ),
            Self::SpreadOverAgents { agents } => write!(
                f,
                "the address tested is a load balancer: it spread this test's connections over \
                 {agents} agents, each of which ran a session of the test; the agent's figures \
                 are their sum (the rate the sum of their rates, the CPU cost each one's in \
                 `agents`)"
            ),
            Self::Balancer {
                agents,
                reopened,
                agent,
            } => write!(
                f,
                "the address tested is a load balancer over at least {agents} agents: it \
                 placed {reopened} of this test's connections or flows on another agent than \
                 the session's, and each was opened again from a new source port until it \
                 reached the session's agent ({agent}); every figure here is that one agent's, \
                 through the balancer"
            ),
        }
    }
}

/// The kind of server a test ran against.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Peer {
    /// A sonde agent (`sonde server`): both ends measured.
    #[default]
    Sonde,
    /// A real `iperf3 -s`, reached with `iperf3://HOST`.
    Iperf3,
    /// A real `sockperf server`, reached with `sockperf://HOST`.
    Sockperf,
}

/// Transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
}

/// `--label KEY=VALUE` pairs, by key.
pub type Labels = BTreeMap<String, String>;

/// A recognised statistic as a warning names it: `rx_no_buffers_posted[q] (4 queues)` for one
/// summed over queues.
fn signal_name(signal: &super::context::DriverSignal) -> String {
    if signal.limit.name.contains("{q}") || signal.queues > 1 {
        format!(
            "{} (summed over {} queue{})",
            signal.limit.name,
            signal.queues,
            if signal.queues == 1 { "" } else { "s" }
        )
    } else {
        signal.limit.name.to_owned()
    }
}

#[cfg(test)]
mod warning_tests {
    use super::*;
    use crate::model::TestResult;

    /// A typed warning's text is its Display, word for word what the call sites wrote before
    /// the warnings were typed; its code comes with it.
    #[test]
    fn typed_warnings_say_their_figures_and_carry_their_code() {
        let cases = [
            (
                Warning::OverlappingSessions { sessions: 2 },
                WarningCode::OverlappingSessions,
                "the agent ran 2 other session(s) during this test: they shared its CPU and \
                 network, so these numbers are not those of an idle path",
            ),
            (
                Warning::TooFewSamples {
                    samples: 7_000,
                    from_percentile: 99.99,
                    needed: 100_000,
                },
                WarningCode::TooFewSamples,
                "7000 samples: percentiles from p99.99 up need at least 100000 and are not \
                 stated; run longer (-t) for the tail",
            ),
            (
                Warning::LostMessages {
                    lost: 3,
                    sent: 1_000,
                    percent: 0.3,
                },
                WarningCode::Loss,
                "3 of 1000 messages got no reply (0.300% loss)",
            ),
            (
                Warning::SenderLimited {
                    reached_bits_per_second: 512.34e6,
                    asked_bits_per_second: 1e9,
                },
                WarningCode::SenderLimited,
                "the senders reached 512.3 Mbit/s of the 1000.0 Mbit/s asked: the sending host \
                 is the limit",
            ),
            (
                Warning::PpsLoss {
                    lost: 1,
                    sent: 3,
                    percent: 100.0 / 3.0,
                },
                WarningCode::Loss,
                "1 of 3 datagrams were lost (33.33%): at full rate the usual place is the \
                 receiver's socket buffer or NIC queue; received_pps is what got through",
            ),
            (
                Warning::ContextSwitchesUnknown { side: "server" },
                WarningCode::ContextSwitchesUnknown,
                "the server's platform does not count context switches per thread (Windows): \
                 cpu.server.voluntary_context_switches and involuntary_context_switches are null",
            ),
            (
                Warning::CountsDiffer {
                    agent: 52,
                    client: 50,
                },
                WarningCode::CountsDiffer,
                "the agent completed 52 transactions and the client 50: the client gave up on \
                 some the agent had answered (timeouts, resets)",
            ),
            (
                Warning::SystemCountersUnknown {
                    side: "client",
                    fields: vec![
                        "system_interrupts_per_second",
                        "system_context_switches_per_second",
                    ],
                },
                WarningCode::SystemCountersUnknown,
                "the client could not read the host-wide counters (no /proc/stat, a Windows \
                 without the performance counters, wine, or an older sonde agent): \
                 cpu.client.system_interrupts_per_second, system_context_switches_per_second \
                 are null",
            ),
            (
                Warning::ConfServerUnknown,
                WarningCode::ServerConfigurationUnknown,
                "the agent did not report its configuration (a sonde agent older than this \
                 client?)",
            ),
        ];
        for (warning, code, text) in cases {
            assert_eq!(warning.code(), code, "{warning:?}");
            assert_eq!(warning.to_string(), text);
        }
        let mut m = crate::fixtures::latency_tcp()
            .meta()
            .expect("a meta")
            .clone();
        m.warnings.clear();
        m.warning_codes.clear();
        m.add(&Warning::TcpInfoUnknown);
        m.add(&Warning::Interrupted);
        assert_eq!(
            m.warning_codes,
            [WarningCode::TcpInfoUnknown, WarningCode::Interrupted]
        );
        assert_eq!(m.warnings[1], Warning::Interrupted.to_string());
        let TestResult::Conf(mut conf) = crate::fixtures::conf_two_hosts() else {
            unreachable!("a conf fixture")
        };
        conf.add(&Warning::ConfServerUnknown);
        assert_eq!(conf.warnings, [Warning::ConfServerUnknown.to_string()]);
        assert_eq!(
            conf.warning_codes,
            [WarningCode::ServerConfigurationUnknown]
        );
        let json = serde_json::to_value(&m).expect("json");
        assert_eq!(
            json["warning_codes"],
            serde_json::json!(["tcp_info_unknown", "interrupted"])
        );
    }

    #[test]
    fn warnings_and_their_codes_stay_in_step() {
        let mut m = Meta {
            sonde_version: String::new(),
            timestamp_unix_ms: 0,
            server: String::new(),
            peer: Peer::Sonde,
            session: 1,
            overlapping_sessions: 1,
            warnings: Vec::new(),
            warning_codes: Vec::new(),
            labels: Labels::new(),
            interrupted: false,
            hosts: Hosts::default(),
            cpu: CpuCosts::default(),
            agent: None,
            sources: Vec::new(),
            interfaces: None,
        };
        let a = Warning::OverlappingSessions { sessions: 1 };
        let b = Warning::NothingReceived;
        let c = Warning::OverlappingSessions { sessions: 2 };
        m.add(&a);
        m.add_all([&b, &c]);
        assert_eq!(m.warnings, [a.to_string(), b.to_string(), c.to_string()]);
        m.remove_warnings(WarningCode::OverlappingSessions);
        assert_eq!(m.warnings, [b.to_string()]);
        assert_eq!(m.warning_codes, [WarningCode::NothingReceived]);
        let json = serde_json::to_value(&m).expect("serializes");
        assert_eq!(
            json["warning_codes"],
            serde_json::json!(["nothing_received"])
        );
        // A code from a newer sonde still reads.
        let mut newer = json;
        newer["warning_codes"] = serde_json::json!(["from_the_future"]);
        let back: Meta = serde_json::from_value(newer).expect("reads");
        assert_eq!(back.warning_codes, [WarningCode::Other]);
    }
}
