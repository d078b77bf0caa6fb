//! `sonde mtu`'s document.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::meta::Meta;

/// How the search learnt that larger packets do not cross.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum MtuBound {
    /// Nothing larger was tried: the answer is the search's ceiling (the local interface's MTU,
    /// or the largest UDP datagram).
    Ceiling,
    /// A router said so (ICMP "fragmentation needed" or ICMPv6 "packet too big", naming its
    /// MTU), or this host's kernel refused the size.
    Reported,
    /// Probes of the next size went unanswered every try, and no router said why: a black hole,
    /// or a path that drops large packets silently.
    Silence,
}

/// What became of one probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum MtuProbeFate {
    /// The agent's echo (as large, DF set) came back.
    Echoed,
    /// No echo within the probe timeout.
    Silent,
    /// A router said it is too big.
    RouterTooBig,
    /// This host's kernel refused to send it (larger than the interface's MTU).
    LocalTooBig,
}

/// One probe of the search.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct MtuProbe {
    /// The probe's IP packet size, bytes (IP and UDP headers included).
    pub ip_bytes: u32,
    /// What became of it.
    pub fate: MtuProbeFate,
    /// Its round trip, ns; `null` unless echoed.
    pub rtt_ns: Option<u64>,
    /// The MTU the refusal named, bytes; `null` when none was named.
    pub reported_mtu_bytes: Option<u32>,
    /// The router that refused it; `null` for anything but a router's refusal.
    pub reported_by: Option<String>,
}

/// The TCP MSS at each end of a TCP connection to the agent, after data crossed it both ways.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct MtuTcp {
    /// The client's MSS once connected (`TCP_MAXSEG`), bytes: from the handshake (the smaller
    /// of what the agent announced and this host's route allows), before any data.
    pub client_mss_at_connect_bytes: Option<u32>,
    /// The client's MSS after the exchange (`TCP_MAXSEG`), bytes: lower than at connect when
    /// PMTU discovery shrank it on the way.
    pub client_mss_bytes: Option<u32>,
    /// The agent's MSS once connected (its `TCP_MAXSEG` on the accepted socket), bytes; `null`
    /// from an agent that does not report it.
    pub agent_mss_at_connect_bytes: Option<u32>,
    /// The agent's MSS after the exchange (its `TCP_INFO`'s `tcpi_snd_mss`), bytes; `null`
    /// from an agent older than this report.
    pub agent_mss_bytes: Option<u32>,
    /// Bytes sent to the agent and echoed back (several full-size segments each way).
    pub exchanged_bytes: u64,
    /// Whether all of them came back within the timeout; `false` is TCP stalled on the path
    /// (full-size segments lost without a router's ICMP: a black hole for TCP).
    pub completed: bool,
}

/// `sonde mtu`: the largest IP packet that crosses the path to the agent and back, by DF
/// probes the agent echoes at the same size with DF set too; and the TCP MSS each end settled
/// on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct MtuResult {
    /// Common facts.
    #[serde(flatten)]
    pub meta: Meta,
    /// 4 or 6.
    pub ip_version: u8,
    /// The largest IP packet that crossed both ways, bytes (headers included): the path MTU of
    /// both directions (the smaller of the two); `null` when no probe crossed.
    pub path_mtu_bytes: Option<u32>,
    /// The UDP payload of such a packet, bytes: `path_mtu_bytes` less `ip_header_bytes` and
    /// `udp_header_bytes`.
    pub udp_payload_bytes: Option<u32>,
    /// The IP header each probe carried, bytes (20 for IPv4 without options, 40 for IPv6).
    pub ip_header_bytes: u32,
    /// The UDP header, bytes (8).
    pub udp_header_bytes: u32,
    /// The MTU of this host's interface toward the agent, bytes; `null` when unknown.
    pub interface_mtu_bytes: Option<u32>,
    /// The largest size the search tried: the interface's MTU or the largest UDP datagram
    /// (65,507 bytes of payload), whichever is less.
    pub ceiling_bytes: u32,
    /// How it learnt that larger packets do not cross.
    pub upper_bound: MtuBound,
    /// The smallest size known not to cross, bytes; `null` when the ceiling crossed. Taken at a
    /// router's word when one named its MTU (`path_mtu_bytes` + 1).
    pub smallest_refused_bytes: Option<u32>,
    /// Silent probes of one size before it is read as too big.
    pub tries: u32,
    /// The longest probe timeout used, ns (4 × the longest RTT seen, 50 ms to 1 s).
    pub probe_timeout_ns: u64,
    /// The search's duration, ns.
    pub search_ns: u64,
    /// Probes sent.
    pub probes_sent: u32,
    /// Every probe, in order.
    pub probes: Vec<MtuProbe>,
    /// The path MTU this host's kernel had cached toward the agent after the search (`IP_MTU`),
    /// bytes: what a router's ICMP taught it; `null` where not readable.
    pub kernel_path_mtu_bytes: Option<u32>,
    /// Whether the agent's echoes left with DF set, as its kernel read it back; `null` from an
    /// agent that did not say (older than `--dont-fragment`: then only this host's direction
    /// was probed with DF).
    pub agent_dont_fragment: Option<bool>,
    /// The search ended on its own (not cut short by its time, its probe count or an
    /// interrupt).
    pub complete: bool,
    /// The TCP MSS at each end; `null` when the TCP connection could not be made.
    pub tcp: Option<MtuTcp>,
}
