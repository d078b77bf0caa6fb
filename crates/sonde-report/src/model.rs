//! The result documents. Field names carry their units (`rtt_ns`, `bits_per_second`). A value
//! that could not be measured is `null`, never 0.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One run's document, tagged by `test`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "test", rename_all = "lowercase")]
pub enum TestResult {
    /// `sonde latency`.
    Latency(LatencyResult),
    /// `sonde throughput`.
    Throughput(ThroughputResult),
    /// `sonde pps`.
    Pps(PpsResult),
    /// `sonde quick`.
    Quick(QuickResult),
    /// `sonde load`: latency idle and under load.
    Load(LoadResult),
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
    /// Receiver intervals (`-i`).
    pub intervals: Vec<IntervalResult>,
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
    /// How the sender sent (`sendmsg+UDP_SEGMENT`, `sendmmsg`, ...).
    pub send_method: String,
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
}

/// `sonde quick`: the embedded default's results, one per case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct QuickResult {
    /// sonde's version.
    pub sonde_version: String,
    /// When the run started, milliseconds since the Unix epoch.
    pub timestamp_unix_ms: u64,
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
            mean: both.then(|| l.mean - i.mean),
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
            Self::Quick(_) => "quick",
            Self::Load(_) => "load",
        }
    }

    /// The common facts; `None` for quick and load, whose runs each have their own.
    pub fn meta(&self) -> Option<&Meta> {
        match self {
            Self::Latency(r) => Some(&r.meta),
            Self::Throughput(r) => Some(&r.meta),
            Self::Pps(r) => Some(&r.meta),
            Self::Quick(_) | Self::Load(_) => None,
        }
    }
}
