//! `sonde throughput`'s document.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::context::{EndsTuning, Helpers, StreamTcpInfo, TcpInfo};
use super::meta::{Meta, Protocol};

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
    /// `-O`: the interval is part of the omit period; its bytes are not in the totals (iperf3
    /// marks such intervals "(omitted)"). Absent when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub omitted: bool,
    /// What the interface toward the other end counted in the interval (`sar -n DEV` of it) at
    /// the end that counted the interval, the receiver: `server` for the agent's receivers,
    /// `client` for this host's (`-R`; both with `--bidir`). Without the driver's statistics
    /// (those are in `interfaces`, over the test). Absent where not read (an older agent, no
    /// sysfs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interfaces: Option<super::context::EndsInterfaces>,
}

/// `--ecn` (UDP): the ECN marks the datagrams arrived with (RFC 3168), counted by each
/// direction's receivers from each datagram's `IP_TOS` / `IPV6_TCLASS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct EcnByDirection {
    /// Client → server, counted by the agent's receivers; `null` where none ran, or they did not
    /// say (an agent older than the field, or whose platform cannot read the marks).
    pub client_to_server: Option<sonde_wire::EcnCounts>,
    /// Server → client, counted by this host's receivers; `null` where none ran, or this
    /// platform cannot read the marks (not Linux).
    pub server_to_client: Option<sonde_wire::EcnCounts>,
}

/// `-Z`: each end's zero-copy sends, all its sending streams together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct EndsZerocopy {
    /// This host's senders; `null` where it did not send.
    pub client: Option<sonde_wire::ZerocopyStats>,
    /// The agent's senders; `null` where it did not send, or did not say (an agent that
    /// predates `-Z`, with a warning; an iperf3 server, which sends with `sendfile`).
    pub server: Option<sonde_wire::ZerocopyStats>,
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
    /// Requested duration, ns; 0 for a test that sent a byte or block count (`-n`, `-k`).
    pub duration_ns: u64,
    /// `-n`: the payload bytes the senders sent in all, then stopped. Absent for a timed test.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_to_send: Option<u64>,
    /// `-k`: the writes of `msg_size_bytes` the senders made in all, then stopped. Absent for a
    /// timed test.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocks_to_send: Option<u64>,
    /// `-O`: the omit period, ns: sent and received before the counted window, on each
    /// receiver's clock. The totals and rates below cover the window after it (their time is
    /// the counted window's); the intervals of the period are marked `omitted`. Absent without
    /// `-O`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub omit_ns: Option<u64>,
    /// `--skip-rx-copy` (TCP): the receivers discarded what they read without copying it to
    /// user space (`MSG_TRUNC`), so their CPU cost leaves the copy out. Absent when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub skip_rx_copy: bool,
    /// `-Z` (TCP): what each end's `MSG_ZEROCOPY` sends came to, from its kernel's
    /// completions: how many sends the kernel copied after all. Absent without `-Z`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zerocopy: Option<EndsZerocopy>,
    /// `--ecn` (UDP): the ECN marks the datagrams arrived with, per direction. Absent without
    /// `--ecn` and for TCP (a TCP socket does not see the marks of what it receives).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ecn: Option<EcnByDirection>,
    /// `-O`: payload bytes the receivers got during the omit period, not in `receiver`. Absent
    /// without `-O`, and against an iperf3 server when it received any stream (it does not
    /// report its omitted bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub omitted_bytes: Option<u64>,
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
    /// `-w`, `-C`, `-M`, `-N`, `-S`/`--dscp`/`--ecn`, `--fq-rate`, `--dont-fragment`: the data
    /// streams' socket options as asked and as each end's kernel applied them. Absent unless
    /// asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket: Option<super::context::EndsSocket>,
}
