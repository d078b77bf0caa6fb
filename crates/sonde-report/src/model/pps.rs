//! `sonde pps`'s document.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::context::{EndsTuning, Helpers};
use super::meta::{Meta, Protocol};

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
    /// `-O`: the interval is part of the omit period; its datagrams are not in the totals.
    /// Absent when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub omitted: bool,
    /// What the receiving agent's interface toward the client counted in the interval (`sar -n
    /// DEV` of it: all its traffic, not only the test's datagrams), without the driver's
    /// statistics. Absent where not read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<sonde_wire::InterfaceDelta>,
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
    /// `-O`: the omit period, ns: sent and received before the counted window. The agent's
    /// receivers cut it off by sequence number at their omit time (every datagram numbered up
    /// to the highest they had seen then is the omit period's, even if it arrives later), so
    /// `sent`, `received` and `lost` are the datagrams after the cut; the intervals of the
    /// period are marked `omitted`. Absent without `-O`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub omit_ns: Option<u64>,
    /// `-O`: datagrams the receivers got during the omit period, not in `received`. Absent
    /// without `-O`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub omitted_received: Option<u64>,
    /// Datagrams sent, all flows (with `-O`, the ones after the receivers' cut).
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
    /// `-w`, `-C`, `-M`, `-N`, `-S`/`--dscp`/`--ecn`, `--fq-rate`, `--dont-fragment`: the data
    /// streams' socket options as asked and as each end's kernel applied them. Absent unless
    /// asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket: Option<super::context::EndsSocket>,
    /// `--ecn`: the ECN marks the datagrams arrived with, counted by the agent's receivers.
    /// Absent without `--ecn`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ecn: Option<super::throughput::EcnByDirection>,
}
