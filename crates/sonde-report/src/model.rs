//! The result documents. Field names carry their units (`rtt_ns`, `bits_per_second`). A value
//! that could not be measured is `null`, never 0.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
pub use sonde_wire::{HostInfo, MinDefaultMax, NicInfo, NicOffloads, SocketBufferLimits};

/// One run's document, tagged by `test`.
// Variants differ in size (load holds three results); a result is built once per run and never
// sits in a hot loop, so boxing would only add noise to every construction site.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "test", rename_all = "lowercase")]
pub enum TestResult {
    /// `sonde latency`.
    Latency(LatencyResult),
    /// `sonde throughput`.
    Throughput(ThroughputResult),
    /// `sonde pps`.
    Pps(PpsResult),
    /// `sonde crr`: connection rate.
    Crr(CrrResult),
    /// `sonde quick`.
    Quick(QuickResult),
    /// `sonde load`: latency idle and under load.
    Load(LoadResult),
    /// `--sweep`: one test at each value of a parameter.
    Sweep(SweepResult),
    /// `sonde conf`: both ends' configuration, side by side.
    Conf(ConfResult),
}

/// `sonde conf [HOST]`: this host's configuration and, with a host, the agent's, as a test
/// between them would see them (the interfaces that face each other).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ConfResult {
    /// sonde's version.
    pub sonde_version: String,
    /// When it was collected, milliseconds since the Unix epoch.
    pub timestamp_unix_ms: u64,
    /// The agent asked, as the client reached it; `null` for this host alone.
    pub server: Option<String>,
    /// This host (`client`) and the agent (`server`; `null` without a host, or from an agent
    /// too old to say).
    pub hosts: Hosts,
    /// What the reader must know (an agent that did not report its configuration).
    pub warnings: Vec<String>,
    /// What each of `warnings` is about, in the same order (as in a test's result). Add
    /// warnings with [`ConfResult::add`], which keeps the two in step.
    #[serde(default)]
    pub warning_codes: Vec<WarningCode>,
}

impl ConfResult {
    /// Adds a typed warning: its text and its code, side by side.
    pub fn add(&mut self, warning: &Warning) {
        self.warnings.push(warning.to_string());
        self.warning_codes.push(warning.code());
    }
}

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
            Self::SenderLimited { .. } => WarningCode::SenderLimited,
            Self::TcpInfoUnknown => WarningCode::TcpInfoUnknown,
            Self::NotTuned { .. } => WarningCode::NotTuned,
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
                 not keep --rate; their RTT counts from the schedule"
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
        }
    }
}

/// Both ends' configuration. `null` for an end that cannot say: a peer that is not a sonde
/// agent (a real iperf3 or sockperf server), or an older agent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Hosts {
    /// This host (the client), for the interface toward the server.
    pub client: Option<HostInfo>,
    /// The server (the agent), for the interface toward this client, as it reported itself.
    pub server: Option<HostInfo>,
}

/// What the test cost each end in CPU. `null` for an end that cannot say (a peer that is not
/// a sonde agent, an older agent, a platform without `getrusage`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CpuCosts {
    /// This host (the client).
    pub client: Option<CpuCost>,
    /// The server (the agent).
    pub server: Option<CpuCost>,
}

/// Whose CPU a [`CpuCost`] counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CpuScope {
    /// The threads that ran this test only (`RUSAGE_THREAD`, summed): other tests running in
    /// the same process (other clients of the agent, `sonde quick`'s agent) are not included.
    #[default]
    TestThreads,
    /// The whole process (`RUSAGE_SELF`).
    Process,
}

/// One end's CPU cost of a test (netperf's "service demand", latte's CPU columns): user and
/// system time, context switches, and the system calls its data path made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CpuCost {
    /// Whose CPU is counted.
    pub scope: CpuScope,
    /// Wall-clock time the figures were counted over, ns (this end's part of the test: its
    /// threads' start to the report).
    pub wall_ns: u64,
    /// CPU time in user mode, ns.
    pub user_ns: u64,
    /// CPU time in the kernel (system calls, and the network stack's work done in them), ns.
    pub system_ns: u64,
    /// User plus system time as a percentage of one core over `wall_ns` (100 = one core busy
    /// the whole time; several busy threads pass 100). `null` when no wall time passed.
    pub percent_of_one_core: Option<f64>,
    /// User time as a percentage of one core.
    pub user_percent_of_one_core: Option<f64>,
    /// System time as a percentage of one core.
    pub system_percent_of_one_core: Option<f64>,
    /// Times the counted threads gave up the CPU to wait (a blocking read, a sleep). `null`
    /// where the platform does not count them per thread (Windows), with a warning.
    pub voluntary_context_switches: Option<u64>,
    /// Times they were preempted; `null` as `voluntary_context_switches`.
    pub involuntary_context_switches: Option<u64>,
    /// System calls the data path made to send and receive (failed and timed-out ones
    /// included; not sleeps), latency's ping loops and echoes too. `null` where they are not
    /// counted (an older sonde agent).
    pub syscalls: Option<u64>,
    /// Messages this end's data path moved: datagrams (UDP), messages (latency), or for TCP
    /// bulk the bytes over the write size.
    pub messages: Option<u64>,
    /// Payload bytes this end's data path moved.
    pub bytes: Option<u64>,
    /// `syscalls / messages`: about 1 for one write per TCP message, 1/64 for full UDP GSO or
    /// `recvmmsg` batches. `null` when either is unknown or no message moved.
    pub syscalls_per_message: Option<f64>,
    /// `syscalls / bytes`.
    pub syscalls_per_byte: Option<f64>,
    /// Context switches of the counted threads (voluntary and involuntary) per second of
    /// `wall_ns`; `null` with them. Absent from older documents.
    #[serde(default)]
    pub context_switches_per_second: Option<f64>,
    /// The data path's system calls (`syscalls`) per second of `wall_ns`: this test's sends
    /// and receives, not every call the process made; `null` with `syscalls`.
    #[serde(default)]
    pub syscalls_per_second: Option<f64>,
    /// Interrupts per second of the whole host, every CPU and every process, over `wall_ns`
    /// (latte's column; Linux `/proc/stat` `intr`, Windows `\Processor(_Total)\Interrupts/sec`).
    /// System-wide: other work on the host counts too. `null` where not counted (no `/proc`,
    /// a Windows without the counter, wine).
    #[serde(default)]
    pub system_interrupts_per_second: Option<f64>,
    /// Context switches per second of the whole host over `wall_ns` (Linux `/proc/stat`
    /// `ctxt`, Windows `\System\Context Switches/sec`). System-wide; `null` where not counted.
    #[serde(default)]
    pub system_context_switches_per_second: Option<f64>,
    /// System calls per second of the whole host over `wall_ns` (Windows
    /// `\System\System Calls/sec`). System-wide. Always `null` from Linux, which keeps no
    /// host-wide count of system calls (it would take tracing); `null` too under wine.
    #[serde(default)]
    pub system_syscalls_per_second: Option<f64>,
}

/// A TCP connection's state as its sender's kernel saw it (`TCP_INFO`, `tcp(7)`). Each figure
/// is `null` when that kernel did not fill it (older kernels have fewer), never 0 in its place.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TcpInfo {
    /// Smoothed RTT (`tcpi_rtt`), ns.
    pub srtt_ns: Option<u64>,
    /// RTT mean deviation (`tcpi_rttvar`), ns.
    pub rttvar_ns: Option<u64>,
    /// Smallest RTT seen (`tcpi_min_rtt`), ns.
    pub min_rtt_ns: Option<u64>,
    /// Congestion window (`tcpi_snd_cwnd`), segments.
    pub cwnd_segments: Option<u32>,
    /// Slow-start threshold (`tcpi_snd_ssthresh`), segments; also `null` while the connection
    /// is still in its first slow start.
    pub ssthresh_segments: Option<u32>,
    /// The sender's MSS (`tcpi_snd_mss`), bytes.
    pub mss_bytes: Option<u32>,
    /// Segments retransmitted since the connection opened (`tcpi_total_retrans`).
    pub retransmits: Option<u64>,
    /// Segments sent and not yet acknowledged (`tcpi_unacked`).
    pub unacked_segments: Option<u32>,
    /// Pacing rate (`tcpi_pacing_rate`); `null` too when unlimited.
    pub pacing_rate_bits_per_second: Option<u64>,
    /// Latest delivery rate (`tcpi_delivery_rate`).
    pub delivery_rate_bits_per_second: Option<u64>,
    /// Whether that delivery rate was limited by the application, not the network.
    pub delivery_rate_app_limited: Option<bool>,
    /// Bytes written by the application and not yet sent (`tcpi_notsent_bytes`).
    pub notsent_bytes: Option<u32>,
    /// Time the connection had data to send (`tcpi_busy_time`), ns.
    pub busy_ns: Option<u64>,
    /// Of that, time limited by the receiver's window (`tcpi_rwnd_limited`), ns.
    pub rwnd_limited_ns: Option<u64>,
    /// Of that, time limited by the sender's buffer (`tcpi_sndbuf_limited`), ns.
    pub sndbuf_limited_ns: Option<u64>,
}

/// One stream's [`TcpInfo`] at the end of an interval.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct StreamTcpInfo {
    /// Stream index.
    pub stream: u32,
    /// The sender's `TCP_INFO`.
    #[serde(flatten)]
    pub tcp_info: TcpInfo,
}

/// Where a throughput test's intervals were counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CountedAt {
    /// At each stream's receiver: no interval can read above what the path delivered.
    #[default]
    Receiver,
    /// At the senders (what they handed to their kernel): reads high while buffers fill.
    Sender,
    /// At this host: client→server streams at their sender, server→client at their receiver.
    ThisHost,
}

impl CountedAt {
    /// How a table names it.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Receiver => "counted at the receiver",
            Self::Sender => "counted at the sender (what it handed to its kernel)",
            Self::ThisHost => "counted at this host (sent by client→server streams, received by server→client ones)",
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

/// Round-trip time statistics, nanoseconds. A percentile is `null` when the sample count cannot
/// support it (sonde asks for `samples >= 10 / (1 - p)`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RttNs {
    /// Smallest.
    pub min: u64,
    /// Mean.
    pub mean: f64,
    /// Standard deviation.
    pub stddev: f64,
    /// Median.
    pub p50: Option<u64>,
    /// 90th percentile.
    pub p90: Option<u64>,
    /// 99th.
    pub p99: Option<u64>,
    /// 99.9th.
    pub p999: Option<u64>,
    /// 99.99th.
    pub p9999: Option<u64>,
    /// 99.999th.
    pub p99999: Option<u64>,
    /// Largest.
    pub max: u64,
}

/// Closed loop (one message in flight) or open loop (fixed rate).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LatencyMode {
    /// One message in flight: the next leaves when the reply is back.
    ClosedLoop,
    /// Messages leave on a fixed schedule; RTT counts from the scheduled time.
    OpenLoop,
}

/// `sonde latency`: round-trip times of messages echoed by the agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LatencyResult {
    /// Common facts.
    #[serde(flatten)]
    pub meta: Meta,
    /// Transport.
    pub protocol: Protocol,
    /// Closed or open loop.
    pub mode: LatencyMode,
    /// Open loop: messages per second scheduled.
    pub rate_per_second: Option<f64>,
    /// Message size, bytes (each way).
    pub msg_size_bytes: u32,
    /// Measured duration (warm-up included), ns.
    pub duration_ns: u64,
    /// Warm-up at the start whose samples are excluded, ns.
    pub warmup_ns: u64,
    /// Samples excluded as warm-up.
    pub warmup_samples: u64,
    /// Messages sent (warm-up included).
    pub sent: u64,
    /// RTT samples in the statistics.
    pub samples: u64,
    /// Round-trip time. Not one-way latency: sockperf's "latency" is half of this.
    pub rtt_ns: RttNs,
    /// UDP: messages whose reply never came (0 for TCP).
    pub lost: u64,
    /// UDP: of the lost, requests that never reached the agent (`null` for TCP).
    pub lost_outbound: Option<u64>,
    /// UDP: of the lost, replies lost on the way back (`null` for TCP).
    pub lost_return: Option<u64>,
    /// UDP: replies received more than once.
    pub duplicated: u64,
    /// UDP: replies that came after a later one.
    pub reordered: u64,
    /// Open loop: sends that left more than 1 ms late (the client could not keep the rate).
    pub late_sends: Option<u64>,
    /// `--histogram`: the RTT distribution in log-spaced buckets (from the same HDR histogram
    /// as `rtt_ns`). Absent unless asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rtt_histogram: Option<Vec<HistogramBucket>>,
    /// `--timestamps`: the RTT as the sockets saw it, from the kernel's software timestamps.
    /// Absent unless asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket_rtt: Option<SocketRtt>,
    /// `--one-way`: the delay each way, from the agent's timestamps and an estimate of its
    /// clock's offset. Absent unless asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub one_way: Option<OneWay>,
    /// `--full-log`: where every sample went. Absent unless asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub full_log: Option<FullLog>,
    /// `--from`: the helpers that ran this test against `server` at once, each its own share;
    /// the figures above are theirs together. Absent for a test this host ran itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub helpers: Option<Helpers>,
    /// `--busy-poll`, `--cpu`: how each end waited for messages and where it ran. Absent
    /// unless asked for. What it cost is in `cpu` (a busy-polled end burns its whole core).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tuning: Option<EndsTuning>,
}

/// `--busy-poll`, `--cpu`: both ends' way of waiting and the CPUs they ran on, as each reported
/// it (latency; throughput and pps have `--cpu` only).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct EndsTuning {
    /// This end: busy-polled, `SO_BUSY_POLL`, the CPUs its loops ran on.
    pub client: sonde_wire::TuningReport,
    /// The agent's end (its echo, or its streams); `null` from an agent older than the option,
    /// which ran unpinned and blocked in `recv` as always (with a warning).
    pub server: Option<sonde_wire::TuningReport>,
}

/// One bucket of a histogram: the samples above the previous bucket's `le_ns`, up to and
/// including this one's. Counts are per bucket, not cumulative. Bounds are log-spaced (4 per
/// octave, fewer for a wide range); empty buckets between the first and the last are listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct HistogramBucket {
    /// Upper bound, inclusive, ns.
    pub le_ns: u64,
    /// Samples in this bucket.
    pub count: u64,
}

/// `--timestamps`: the RTT at the sockets. The kernel stamps a datagram (or TCP segment) as it
/// leaves for the device and as it arrives from it, in software; what lies between the
/// application's RTT and the sockets' is this host's own time: system calls, scheduling,
/// wake-ups. Figures the kernel did not give are `null` (and a warning says why), never 0.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SocketRtt {
    /// The kernel gave receive timestamps on the client's socket.
    pub rx_timestamps: bool,
    /// The kernel gave transmit timestamps (per datagram for UDP, per message's last byte for
    /// TCP).
    pub tx_timestamps: bool,
    /// Samples (after the warm-up) whose reply had a kernel receive timestamp.
    pub rx_stamped: u64,
    /// Samples that also had their request's kernel transmit timestamp.
    pub tx_stamped: u64,
    /// Samples where a kernel figure came out longer than the application's RTT (the wall
    /// clock the kernel stamps with was stepped); left out of the distributions below.
    pub inconsistent: u64,
    /// The reply's kernel receive time minus the request's kernel transmit time: the round
    /// trip as the sockets saw it. `null` without transmit timestamps.
    pub socket_rtt_ns: Option<RttNs>,
    /// Per sample, the application's RTT minus `socket_rtt_ns`: time spent in this host on
    /// both ends of the round trip. `null` with `socket_rtt_ns`.
    pub host_ns: Option<RttNs>,
    /// The reply's kernel receive time minus the application's send: the fallback where
    /// transmit timestamps are missing (it still holds the send path's host time).
    pub send_to_socket_rx_ns: Option<RttNs>,
    /// Per sample, the application's RTT minus `send_to_socket_rx_ns`: from the reply's
    /// kernel receive time to the application's.
    pub rx_host_ns: Option<RttNs>,
}

/// `--one-way`: the delay of the requests (client to agent) and of the replies (agent to
/// client). The agent stamps each reply with its receive and send times; the client converts
/// them with an NTP-style estimate of the agent clock's offset and drift, from timestamp
/// exchanges over the control channel (and the probes themselves). Forward plus return plus
/// the agent's hold time is the RTT; only the split depends on the estimate, and every stated
/// delay is within `uncertainty_ns` of the truth.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct OneWay {
    /// Probes (after the warm-up) converted into one-way delays.
    pub samples: u64,
    /// Replies that came back without the agent's timestamps (an older agent).
    pub unstamped: u64,
    /// Client to agent, ns. `null` when nothing could be converted.
    pub forward_ns: Option<SignedNs>,
    /// Agent to client, ns.
    pub return_ns: Option<SignedNs>,
    /// The agent's time between receiving a probe and sending its reply, ns.
    pub agent_hold_ns: Option<RttNs>,
    /// Every stated one-way figure is within this of the truth, ns: the clock estimate's
    /// bound (`clock.offset_uncertainty_ns` over the whole test), plus what the provisional
    /// estimates used during the run strayed from the final one.
    pub uncertainty_ns: Option<u64>,
    /// The estimate of the agent's clock; `null` when none could be made.
    pub clock: Option<ClockEstimate>,
}

/// The agent's clock as the client estimated it (RFC 5905-style exchanges, the cleanest of
/// each second fitted with a straight line for offset and drift).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ClockEstimate {
    /// The agent's monotonic clock minus the client's, in the middle of the test, ns. On one
    /// host (both ends read the same clock) it is 0 within `offset_uncertainty_ns`.
    pub offset_ns: i64,
    /// How far the true offset can be from `offset_ns` there, ns: half the round trip of the
    /// cleanest exchanges (the path may be asymmetric by that much, unseen), and more away
    /// from them.
    pub offset_uncertainty_ns: u64,
    /// How fast the agent's clock runs against the client's, parts per million.
    pub drift_ppm: f64,
    /// The smallest round trip (agent hold left out) of any exchange, ns.
    pub best_round_trip_ns: u64,
    /// Exchanges over the control channel.
    pub control_exchanges: u64,
    /// Probe exchanges offered to the estimate (the best of each second).
    pub probe_exchanges: u64,
    /// Exchanges the fit used (one per window of time, those without a queue in the way).
    pub exchanges_used: u64,
}

/// Signed delay statistics, ns (a one-way delay estimate can come out below zero when the
/// clock estimate is off by more than the delay; the uncertainty says by how much it can be).
/// A percentile is `null` when the sample count cannot support it, as for RTTs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SignedNs {
    /// Smallest.
    pub min: i64,
    /// Mean.
    pub mean: f64,
    /// Standard deviation.
    pub stddev: f64,
    /// Median.
    pub p50: Option<i64>,
    /// 90th percentile.
    pub p90: Option<i64>,
    /// 99th.
    pub p99: Option<i64>,
    /// 99.9th.
    pub p999: Option<i64>,
    /// 99.99th.
    pub p9999: Option<i64>,
    /// 99.999th.
    pub p99999: Option<i64>,
    /// Largest.
    pub max: i64,
}

/// `--full-log FILE`: every sample, one CSV line each, written by a thread of its own. A sample
/// the writer could not keep up with is dropped (never waited for) and counted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct FullLog {
    /// The file.
    pub path: String,
    /// Lines written (one per message, lost ones too).
    pub written: u64,
    /// Samples dropped because the writer fell behind (or writing failed).
    pub dropped: u64,
    /// The write error that stopped the log, if any.
    pub error: Option<String>,
}

/// One side's totals.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SideTotals {
    /// Payload bytes.
    pub bytes: u64,
    /// Payload bits per second over this side's active time.
    pub bits_per_second: f64,
    /// Datagrams (UDP) or system calls (TCP).
    pub packets: u64,
    /// This side's active time (first to last byte), ns.
    pub duration_ns: u64,
}

/// Who sent a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum StreamDirection {
    /// Client to agent.
    ClientToServer,
    /// Agent to client.
    ServerToClient,
}

/// One stream of a throughput test.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StreamResult {
    /// Stream index.
    pub stream: u32,
    /// Who sent it.
    pub direction: StreamDirection,
    /// Counted at the receiver.
    pub receiver: SideTotals,
    /// The sender's view: what it handed to the kernel.
    pub sender: SideTotals,
    /// UDP: datagrams lost.
    pub lost: Option<u64>,
    /// UDP: lost as a percentage of sent.
    pub loss_percent: Option<f64>,
    /// UDP: duplicates.
    pub duplicated: Option<u64>,
    /// UDP: reordered.
    pub reordered: Option<u64>,
    /// UDP: RFC 3550 jitter, ns.
    pub jitter_ns: Option<u64>,
    /// TCP: retransmitted segments at the sender.
    pub retransmits: Option<u64>,
    /// TCP: the sender's `TCP_INFO` when it stopped sending; `null` for UDP, or when the
    /// sender could not read it.
    #[serde(default)]
    pub tcp_info: Option<TcpInfo>,
}

/// One interval, counted at the receiver(s).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct IntervalResult {
    /// Start, ns since the receiver started.
    pub start_ns: u64,
    /// End, ns since the receiver started.
    pub end_ns: u64,
    /// All streams' payload bytes in the interval.
    pub bytes: u64,
    /// All streams' payload rate in the interval.
    pub bits_per_second: f64,
    /// Datagrams (UDP).
    pub packets: u64,
    /// Per stream: bytes, in the order of `streams` in the result.
    pub stream_bytes: Vec<u64>,
    /// TCP: each sending stream's `TCP_INFO`, sampled by its sender at the end of the interval
    /// (empty for UDP, or where the sender could not read it).
    #[serde(default)]
    pub tcp_info: Vec<StreamTcpInfo>,
}

/// `sonde throughput`: bulk transfer, counted at the receiver.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ThroughputResult {
    /// Common facts.
    #[serde(flatten)]
    pub meta: Meta,
    /// Transport.
    pub protocol: Protocol,
    /// `forward` (client sends), `reverse` (agent sends) or `bidir`.
    pub direction: String,
    /// Streams per direction.
    pub parallel: u32,
    /// Bytes per write (TCP) or datagram payload (UDP).
    pub msg_size_bytes: u32,
    /// TCP: the most one read of each receiver asked for, bytes (`--read-size`; 524,288 by
    /// default). With small writes it sets how often TCP acknowledges, and so the segment sizes
    /// and the throughput. `null` for UDP (one datagram per read), for the receivers of an
    /// iperf3 server, and in results older than the field.
    #[serde(default)]
    pub read_size_bytes: Option<u32>,
    /// UDP: target rate, all streams of one direction together; `null` for TCP or unlimited.
    pub target_bits_per_second: Option<u64>,
    /// Requested duration, ns.
    pub duration_ns: u64,
    /// Totals counted at the receiver(s): the figure to quote.
    pub receiver: SideTotals,
    /// Totals at the sender(s): what was handed to the kernel.
    pub sender: SideTotals,
    /// Per stream.
    pub streams: Vec<StreamResult>,
    /// Intervals (`-i`), counted where `intervals_counted_at` says.
    pub intervals: Vec<IntervalResult>,
    /// Where the intervals were counted: at the receivers (always, against a sonde agent), or
    /// at this host whatever its role (against an iperf3 server, which does not report its own).
    #[serde(default)]
    pub intervals_counted_at: CountedAt,
    /// UDP: datagrams lost, all streams.
    pub lost: Option<u64>,
    /// UDP: lost as a percentage of sent.
    pub loss_percent: Option<f64>,
    /// UDP: largest stream jitter, ns.
    pub jitter_ns: Option<u64>,
    /// UDP: duplicates, all streams.
    pub duplicated: Option<u64>,
    /// UDP: reordered, all streams.
    pub reordered: Option<u64>,
    /// TCP: retransmits, all streams.
    pub retransmits: Option<u64>,
    /// `--from`: the helpers that ran this test against `server` at once, each its own share;
    /// the figures above are theirs together. Absent for a test this host ran itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub helpers: Option<Helpers>,
    /// `--cpu`: the CPUs each end's streams ran on. Absent unless asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tuning: Option<EndsTuning>,
}

/// `--from`: a test several helper agents ran against one target at once, started together at
/// a common time (each helper's clock offset to this host estimated NTP-style over its control
/// connection).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Helpers {
    /// The latest helper's start minus the earliest's, ns, on this host's clock (each helper
    /// reports when its data started, converted with its clock's offset).
    pub start_spread_ns: u64,
    /// The largest uncertainty of those offsets, ns: the spread is known within about this.
    pub offset_uncertainty_ns: u64,
    /// From the earliest start to the latest end of the target's receiving (pps, throughput) or
    /// of the helpers' measuring (latency), ns: what the aggregate rates are per.
    pub window_ns: u64,
    /// Each helper's share, in the order of `--from`.
    pub shares: Vec<HelperShare>,
}

/// One helper's part of a `--from` test, from its own result (counted at the target where the
/// test counts there).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct HelperShare {
    /// The helper as given to `--from`, resolved.
    pub helper: String,
    /// The target's session id for this helper's test.
    pub session: u64,
    /// When its data started, ns after the earliest helper's.
    pub start_offset_ns: u64,
    /// pps: datagrams sent; throughput: sender bytes. `null` for latency.
    pub sent: Option<u64>,
    /// pps: datagrams the target received from it; throughput: bytes. `null` for latency.
    pub received: Option<u64>,
    /// pps, UDP throughput: sent and never received; `null` for TCP and latency.
    pub lost: Option<u64>,
    /// pps: received per second over the target's receiving time for it.
    pub received_pps: Option<f64>,
    /// throughput: received bits per second over the target's receiving time for it.
    pub bits_per_second: Option<f64>,
    /// latency: its round-trip times to the target while the others ran.
    pub rtt_ns: Option<RttNs>,
}

/// One flow of a pps test.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct FlowResult {
    /// Flow index.
    pub flow: u32,
    /// Datagrams sent.
    pub sent: u64,
    /// Unique datagrams received by the agent.
    pub received: u64,
    /// Sent but never received.
    pub lost: u64,
}

/// `--gso`: what was asked of UDP GSO in a pps test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum GsoMode {
    /// GSO only where the route to the agent leaves by a physical device.
    Auto,
    /// GSO batches wherever the kernel takes them.
    On,
    /// One datagram per packet.
    Off,
}

/// Why a pps sender used UDP GSO batches or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum GsoReason {
    /// `--gso on` or `--gso off`.
    Requested,
    /// The route leaves by loopback, a virtual device: a batch would cross it as one packet.
    Loopback,
    /// The route leaves by a virtual device (veth, bridge, tun...), which passes a batch on as
    /// one packet.
    VirtualDevice,
    /// The route leaves by a physical device, which sends each datagram as its own packet.
    PhysicalDevice,
    /// The interface toward the agent was not found: no GSO, to count packets.
    UnknownRoute,
    /// The platform has no UDP GSO.
    Unsupported,
    /// `--gso auto` on a platform (Windows) where sonde cannot tell whether the device toward
    /// the agent is physical: off; `--gso on` sends USO batches.
    DeviceKindUnknown,
}

/// UDP GSO in a pps test: a GSO batch is up to 64 datagrams in one socket buffer, which a
/// virtual device passes on as one packet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PpsGso {
    /// What was asked (`--gso`).
    pub mode: GsoMode,
    /// Whether the sender sent GSO batches (`send_method` is `sendmsg+UDP_SEGMENT`, on Windows
    /// `send+UDP_SEND_MSG_SIZE`: USO).
    pub used: bool,
    /// The interface the route to the agent leaves by, where found.
    pub interface: Option<String>,
    /// Why GSO was allowed or not.
    pub reason: GsoReason,
    /// The reason in words.
    pub explanation: String,
}

/// One interval of a pps test (`-i`), counted by the receiving agent, like `sar -n DEV`'s
/// `rxpck/s` but of the test's datagrams only.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PpsInterval {
    /// Start, ns since the receiver started.
    pub start_ns: u64,
    /// End, ns since the receiver started.
    pub end_ns: u64,
    /// Datagrams received in the interval, all flows.
    pub received: u64,
    /// `received` over the interval's length, per second.
    pub received_pps: f64,
    /// Per flow: datagrams received, in the order of `flows`.
    pub flow_received: Vec<u64>,
}

/// `sonde pps`: small UDP datagrams as fast as possible, counted by the receiving agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PpsResult {
    /// Common facts.
    #[serde(flatten)]
    pub meta: Meta,
    /// Always `udp`.
    pub protocol: Protocol,
    /// Datagram payload, bytes.
    pub msg_size_bytes: u32,
    /// Requested duration, ns.
    pub duration_ns: u64,
    /// How the sender sent (`sendmsg+UDP_SEGMENT`, `sendmmsg`, `send+UDP_SEND_MSG_SIZE` on
    /// Windows, ...).
    pub send_method: String,
    /// UDP GSO: asked, used, and why.
    pub gso: PpsGso,
    /// Datagrams sent, all flows.
    pub sent: u64,
    /// Unique datagrams received, all flows.
    pub received: u64,
    /// Sent but never received.
    pub lost: u64,
    /// Lost as a percentage of sent.
    pub loss_percent: f64,
    /// Sent per second over the sender's active time.
    pub sent_pps: f64,
    /// Received per second over the receiver's active time.
    pub received_pps: f64,
    /// Per flow.
    pub flows: Vec<FlowResult>,
    /// Intervals (`-i`), counted by the receiving agent; empty without `-i`.
    #[serde(default)]
    pub intervals: Vec<PpsInterval>,
    /// `--from`: the helpers that ran this test against `server` at once, each its own share;
    /// the figures above are theirs together. Absent for a test this host ran itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub helpers: Option<Helpers>,
    /// `--cpu`: the CPUs each end's flows ran on. Absent unless asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tuning: Option<EndsTuning>,
}

/// How the client closed each connection of a crr test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum CrrClose {
    /// A FIN, as in netperf's `TCP_CRR`: the client's end then waits in `TIME_WAIT` (60 s on
    /// Linux), holding its ephemeral port.
    Fin,
    /// A reset (`SO_LINGER` 0, `--rst`): no closing handshake and no `TIME_WAIT`.
    Rst,
}

/// Failed attempts of a crr test by kind, counted by the client.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CrrErrors {
    /// Connections refused (`ECONNREFUSED`).
    pub refused: u64,
    /// A connect, or the wait for the whole response, that passed the client's timeout.
    pub timeout: u64,
    /// Connections reset before the response was read in full.
    pub reset: u64,
    /// Connects that found no free local port (`EADDRNOTAVAIL`): the client's ephemeral ports
    /// were all in use or in `TIME_WAIT`. The first one ends the test.
    pub addr_not_available: u64,
    /// Connections the agent closed before the whole response (it refused them).
    pub closed: u64,
    /// Anything else (out of file descriptors, no route...).
    pub other: u64,
}

/// `sonde crr`: connection rate. Each transaction is a new TCP connection: connect, a request,
/// the agent's response, close; `workers` connections at a time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CrrResult {
    /// Common facts.
    #[serde(flatten)]
    pub meta: Meta,
    /// Always `tcp`.
    pub protocol: Protocol,
    /// Connections at a time: each worker makes one transaction after another.
    pub workers: u32,
    /// Request size, bytes.
    pub request_bytes: u32,
    /// Response size, bytes.
    pub response_bytes: u32,
    /// How the client closed each connection.
    pub close: CrrClose,
    /// Requested duration, ns.
    pub duration_ns: u64,
    /// Transactions per second counted by the agent over its own window (the figure to quote);
    /// `null` when the agent completed none or did not report.
    pub connections_per_second: Option<f64>,
    /// Transactions the agent completed: request read, response written, then the client's
    /// close. `null` when the agent did not report.
    pub agent_transactions: Option<u64>,
    /// The agent's window: its first identified connection to its last completed transaction,
    /// ns; `null` when it completed none or did not report.
    pub agent_duration_ns: Option<u64>,
    /// Connections of this test the agent could not complete; `null` when it did not report.
    pub agent_failed: Option<u64>,
    /// Transactions the client completed: response read in full.
    pub transactions: u64,
    /// Transactions per second counted by the client over its own window; `null` when it
    /// completed none.
    pub client_connections_per_second: Option<f64>,
    /// The client's window: its first connect to its last completed transaction, ns (0 when it
    /// completed none).
    pub client_duration_ns: u64,
    /// Connections the client established (those that then failed included).
    pub connects: u64,
    /// Connect times, from the `connect` call to the connection established: one round trip,
    /// plus the retransmission timeout (1 s at first on Linux) when a SYN or SYN-ACK was lost.
    /// The percentiles follow the latency rule (`samples >= 10 / (1 - p)`); `null` without
    /// any connection.
    pub connect_ns: Option<RttNs>,
    /// Transaction times, from the `connect` call to the last byte of the response; `null`
    /// without any completed transaction.
    pub transaction_ns: Option<RttNs>,
    /// Failed attempts by kind, counted by the client.
    pub errors: CrrErrors,
    /// Intervals (`-i`), counted by the client; empty without `-i`. Together they hold every
    /// transaction, connect and failure of the client's totals.
    #[serde(default)]
    pub intervals: Vec<CrrInterval>,
}

/// One interval of a crr test, counted by the client. Each event counts in the interval it
/// happened in: a transaction when its response was read in full, a connect when the
/// connection was established, a failure when the client saw it. Intervals follow each other
/// on a grid from the start of the client's workers; the last ends when the last worker ended
/// (shorter than the others, or longer when attempts still ran after the test's time).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CrrInterval {
    /// Start, ns since the client's workers started.
    pub start_ns: u64,
    /// End, ns since the client's workers started: the next interval's start.
    pub end_ns: u64,
    /// Transactions completed (response read in full) in the interval.
    pub transactions: u64,
    /// `transactions` over the interval's length, per second: 0 when none completed in it.
    pub transactions_per_second: f64,
    /// Connections established in the interval.
    pub connects: u64,
    /// Failed attempts seen in the interval, by kind.
    pub errors: CrrErrors,
    /// Median connect time of the interval's connects, ns (to 2 significant digits); `null`
    /// with fewer than 20 of them.
    pub connect_p50_ns: Option<u64>,
    /// 99th percentile connect time, ns; `null` with fewer than 1,000 connects in the interval.
    pub connect_p99_ns: Option<u64>,
}

/// `--label KEY=VALUE` pairs, by key.
pub type Labels = BTreeMap<String, String>;

/// `sonde quick`: the embedded default's results, one per case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct QuickResult {
    /// sonde's version.
    pub sonde_version: String,
    /// When the run started, milliseconds since the Unix epoch.
    pub timestamp_unix_ms: u64,
    /// `--label KEY=VALUE` as given (each case's own labels add `case`).
    #[serde(default)]
    pub labels: Labels,
    /// The cases, in the order run.
    pub results: Vec<QuickCase>,
}

/// One case of `sonde quick`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct QuickCase {
    /// Short name (`tcp latency`, `tcp throughput x2`...).
    pub case: String,
    /// The result.
    pub result: TestResult,
}

/// `--sweep PARAM=VALUES`: the same test run once per value of one parameter, in order, so a
/// reader sees where bandwidth stops growing or latency starts to climb.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SweepResult {
    /// sonde's version.
    pub sonde_version: String,
    /// When the sweep started, milliseconds since the Unix epoch.
    pub timestamp_unix_ms: u64,
    /// `--label KEY=VALUE` as given (each step's own labels add the parameter and its value).
    #[serde(default)]
    pub labels: Labels,
    /// The test swept: `latency`, `throughput` or `pps`.
    pub sweep_test: String,
    /// The parameter varied: `msg_size`, `parallel`, `rate` or `bitrate`.
    pub parameter: String,
    /// The parameter's unit: `bytes`, `streams`, `messages_per_second` or `bits_per_second`.
    pub unit: String,
    /// One run per value, in the order run.
    pub steps: Vec<SweepStep>,
}

/// One step of a sweep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SweepStep {
    /// The parameter's value in this run, in the sweep's `unit`.
    pub value: u64,
    /// The run's full result.
    pub result: TestResult,
}

/// `sonde load`: the same latency probes on the idle path, then while bulk TCP streams load it
/// (bufferbloat, "latency under load"). Three runs against one agent, each with its own meta;
/// the probes' and the load's sessions overlap by design, and that overlap is not counted in
/// their `overlapping_sessions`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LoadResult {
    /// sonde's version.
    pub sonde_version: String,
    /// When the run started, milliseconds since the Unix epoch.
    pub timestamp_unix_ms: u64,
    /// `--label KEY=VALUE` (the three runs inside carry them too).
    #[serde(default)]
    pub labels: Labels,
    /// How long the load ran before the loaded probes started, ns: time for TCP to fill the
    /// bottleneck's queue.
    pub ramp_ns: u64,
    /// The probes before the load started.
    pub idle: LatencyResult,
    /// The same probes while the load ran.
    pub loaded: LatencyResult,
    /// The load: bulk TCP, counted at its receivers over its whole run (ramp included).
    pub load: ThroughputResult,
    /// What the load added to the RTT: loaded minus idle, per statistic.
    pub added_rtt_ns: AddedRttNs,
}

/// Loaded minus idle RTT, nanoseconds (negative when the loaded figure is lower). `null` where
/// either run has no value (no samples, or too few for that percentile).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AddedRttNs {
    /// Minimum.
    pub min: Option<i64>,
    /// Mean.
    pub mean: Option<f64>,
    /// Median.
    pub p50: Option<i64>,
    /// 90th percentile.
    pub p90: Option<i64>,
    /// 99th percentile.
    pub p99: Option<i64>,
    /// 99.9th percentile.
    pub p999: Option<i64>,
    /// Maximum.
    pub max: Option<i64>,
}

impl AddedRttNs {
    /// Loaded minus idle, where both have the figure.
    pub fn between(idle: &LatencyResult, loaded: &LatencyResult) -> Self {
        let both = idle.samples > 0 && loaded.samples > 0;
        let diff = |a: Option<u64>, b: Option<u64>| -> Option<i64> {
            let (a, b) = (a.filter(|_| both)?, b.filter(|_| both)?);
            Some(i64::try_from(i128::from(b) - i128::from(a)).unwrap_or(i64::MAX))
        };
        let (i, l) = (&idle.rtt_ns, &loaded.rtt_ns);
        Self {
            min: diff(Some(i.min), Some(l.min)),
            mean: both.then_some(l.mean - i.mean),
            p50: diff(i.p50, l.p50),
            p90: diff(i.p90, l.p90),
            p99: diff(i.p99, l.p99),
            p999: diff(i.p999, l.p999),
            max: diff(Some(i.max), Some(l.max)),
        }
    }
}

impl TestResult {
    /// The `test` tag: `latency`, `throughput`, `pps`, `quick` or `load`.
    pub fn test_name(&self) -> &'static str {
        match self {
            Self::Latency(_) => "latency",
            Self::Throughput(_) => "throughput",
            Self::Pps(_) => "pps",
            Self::Crr(_) => "crr",
            Self::Quick(_) => "quick",
            Self::Load(_) => "load",
            Self::Sweep(_) => "sweep",
            Self::Conf(_) => "conf",
        }
    }

    /// The common facts; `None` for quick, load and sweep, whose runs each have their own.
    pub fn meta(&self) -> Option<&Meta> {
        match self {
            Self::Latency(r) => Some(&r.meta),
            Self::Throughput(r) => Some(&r.meta),
            Self::Pps(r) => Some(&r.meta),
            Self::Crr(r) => Some(&r.meta),
            Self::Quick(_) | Self::Load(_) | Self::Sweep(_) | Self::Conf(_) => None,
        }
    }
}

impl CpuCost {
    /// One end's cost from its raw counts (as a sonde agent reports them in its `Report`), with
    /// the percentages and per-message figures worked out; those are `null` where a divisor is
    /// 0 or unknown.
    pub fn from_report(scope: CpuScope, r: &sonde_wire::CpuReport) -> Self {
        let of_wall = |ns: u64| (r.wall_ns > 0).then(|| ns as f64 * 100.0 / r.wall_ns as f64);
        let per = |n: Option<u64>, d: Option<u64>| match (n, d) {
            (Some(n), Some(d)) if d > 0 => Some(n as f64 / d as f64),
            _ => None,
        };
        let per_second =
            |n: Option<u64>| per(n, Some(r.wall_ns)).map(|per_ns| per_ns * 1_000_000_000.0);
        Self {
            scope,
            wall_ns: r.wall_ns,
            user_ns: r.user_ns,
            system_ns: r.system_ns,
            percent_of_one_core: of_wall(r.user_ns.saturating_add(r.system_ns)),
            user_percent_of_one_core: of_wall(r.user_ns),
            system_percent_of_one_core: of_wall(r.system_ns),
            voluntary_context_switches: r.voluntary_switches,
            involuntary_context_switches: r.involuntary_switches,
            syscalls: r.syscalls,
            messages: r.messages,
            bytes: r.bytes,
            syscalls_per_message: per(r.syscalls, r.messages),
            syscalls_per_byte: per(r.syscalls, r.bytes),
            context_switches_per_second: per_second(
                r.voluntary_switches
                    .zip(r.involuntary_switches)
                    .map(|(v, i)| v.saturating_add(i)),
            ),
            syscalls_per_second: per_second(r.syscalls),
            system_interrupts_per_second: per_second(r.system_interrupts),
            system_context_switches_per_second: per_second(r.system_context_switches),
            system_syscalls_per_second: per_second(r.system_syscalls),
        }
    }
}

impl From<&sonde_wire::TcpInfoStats> for TcpInfo {
    /// The sender's sample, rates from the kernel's bytes per second to bits per second.
    fn from(t: &sonde_wire::TcpInfoStats) -> Self {
        let bits = |bytes: Option<u64>| bytes.map(|b| b.saturating_mul(8));
        Self {
            srtt_ns: t.srtt_ns,
            rttvar_ns: t.rttvar_ns,
            min_rtt_ns: t.min_rtt_ns,
            cwnd_segments: t.cwnd,
            ssthresh_segments: t.ssthresh,
            mss_bytes: t.mss,
            retransmits: t.retrans,
            unacked_segments: t.unacked,
            pacing_rate_bits_per_second: bits(t.pacing_rate),
            delivery_rate_bits_per_second: bits(t.delivery_rate),
            delivery_rate_app_limited: t.app_limited,
            notsent_bytes: t.notsent_bytes,
            busy_ns: t.busy_ns,
            rwnd_limited_ns: t.rwnd_limited_ns,
            sndbuf_limited_ns: t.sndbuf_limited_ns,
        }
    }
}

#[cfg(test)]
mod crr_tests {
    use super::*;

    #[test]
    fn a_crr_document_from_before_intervals_reads_with_none() {
        let mut doc = serde_json::to_value(crate::fixtures::crr_ports_exhausted()).unwrap();
        assert_eq!(doc["intervals"].as_array().map(Vec::len), Some(3));
        assert!(doc["intervals"][0]["connect_p99_ns"].is_u64());
        doc.as_object_mut().unwrap().remove("intervals");
        let TestResult::Crr(r) = serde_json::from_value(doc).unwrap() else {
            unreachable!("a crr document")
        };
        assert!(r.intervals.is_empty());
    }
}

#[cfg(test)]
mod context_tests {
    use super::*;

    #[test]
    fn cpu_figures_are_worked_out_and_unknown_where_a_divisor_is() {
        let raw = sonde_wire::CpuReport {
            wall_ns: 2_000_000_000,
            user_ns: 500_000_000,
            system_ns: 1_500_000_000,
            voluntary_switches: Some(7),
            involuntary_switches: Some(3),
            syscalls: Some(1_000),
            messages: Some(4_000),
            bytes: Some(4_000 * 18),
            system_interrupts: Some(9_000),
            system_context_switches: Some(30_000),
            system_syscalls: None,
        };
        let c = CpuCost::from_report(CpuScope::TestThreads, &raw);
        // Over 2 s of wall time.
        assert_eq!(c.context_switches_per_second, Some(5.0));
        assert_eq!(c.syscalls_per_second, Some(500.0));
        assert_eq!(c.system_interrupts_per_second, Some(4_500.0));
        assert_eq!(c.system_context_switches_per_second, Some(15_000.0));
        assert_eq!(
            c.system_syscalls_per_second, None,
            "not counted: null, not 0"
        );
        assert_eq!(c.percent_of_one_core, Some(100.0));
        assert_eq!(c.user_percent_of_one_core, Some(25.0));
        assert_eq!(c.system_percent_of_one_core, Some(75.0));
        assert_eq!(c.syscalls_per_message, Some(0.25));
        assert_eq!(c.syscalls_per_byte, Some(1_000.0 / 72_000.0));
        assert_eq!(
            (c.voluntary_context_switches, c.involuntary_context_switches),
            (Some(7), Some(3))
        );
        // No wall time, no calls counted, nothing moved: unknown, not 0.
        let none = CpuCost::from_report(
            CpuScope::Process,
            &sonde_wire::CpuReport {
                syscalls: None,
                messages: Some(0),
                bytes: Some(0),
                ..sonde_wire::CpuReport::default()
            },
        );
        assert_eq!(none.percent_of_one_core, None);
        assert_eq!(none.syscalls_per_message, None);
        assert_eq!(none.syscalls_per_byte, None);
        assert_eq!(none.context_switches_per_second, None);
        assert_eq!(none.system_interrupts_per_second, None);
        let idle = CpuCost::from_report(
            CpuScope::Process,
            &sonde_wire::CpuReport {
                syscalls: Some(5),
                messages: Some(0),
                ..raw
            },
        );
        assert_eq!(idle.syscalls_per_message, None);
    }

    #[test]
    fn tcp_info_rates_are_in_bits_and_unknown_stays_null() {
        let t = TcpInfo::from(&sonde_wire::TcpInfoStats {
            stream: 2,
            srtt_ns: Some(40_000),
            cwnd: Some(10),
            pacing_rate: Some(125_000_000),
            delivery_rate: Some(u64::MAX),
            ..sonde_wire::TcpInfoStats::default()
        });
        assert_eq!(t.srtt_ns, Some(40_000));
        assert_eq!(t.cwnd_segments, Some(10));
        assert_eq!(t.pacing_rate_bits_per_second, Some(1_000_000_000));
        assert_eq!(t.delivery_rate_bits_per_second, Some(u64::MAX));
        assert_eq!(t.rttvar_ns, None);
        let v = serde_json::to_value(&t).unwrap();
        assert!(v["ssthresh_segments"].is_null());
        assert_eq!(v["cwnd_segments"], 10);
    }
}

#[cfg(test)]
mod warning_tests {
    use super::*;

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
