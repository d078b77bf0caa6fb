//! `sonde latency`'s document.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::context::{EndsTuning, Helpers};
use super::meta::{Meta, Protocol};
use super::stats::{HistogramBucket, RttNs};

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
    /// `-w`, `-C`, `-M`, `-N`, `-S`/`--dscp`/`--ecn`, `--fq-rate`, `--dont-fragment`: the data
    /// streams' socket options as asked and as each end's kernel applied them. Absent unless
    /// asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket: Option<super::context::EndsSocket>,
    /// `-i`: the RTTs of each interval, from the end of the warm-up to the end of the run. A
    /// reply counts in the interval it arrived in; the intervals' samples add up to `samples`.
    /// Empty (absent) without `-i`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub intervals: Vec<LatencyInterval>,
    /// `-P N`, `--depth K`, `--response-size`: many flows, many requests in flight. The
    /// figures above are over all flows (the RTT percentiles merged from every thread's
    /// histogram, `sent`, `samples` and `lost` summed); this says how they were run and what
    /// each flow got. Absent for the one-flow, one-in-flight test.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_response: Option<RequestResponse>,
}

/// A many-flow request/response run (`sonde latency -P N --depth K`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RequestResponse {
    /// Flows (TCP connections or UDP flows).
    pub flows: u32,
    /// Requests in flight per flow (closed loop); with `--rate` (open loop), the most a flow
    /// may have outstanding.
    pub depth: u32,
    /// Response size, bytes (the request is `msg_size_bytes`).
    pub response_size_bytes: u32,
    /// The client's threads, each driving its share of the flows with one readiness loop.
    pub client_threads: u32,
    /// Transactions (a request answered) after the warm-up, all flows.
    pub transactions: u64,
    /// `transactions` per second of the measured time.
    pub transactions_per_second: f64,
    /// The least of any flow, transactions per second.
    pub flow_min_per_second: f64,
    /// The most of any flow, transactions per second.
    pub flow_max_per_second: f64,
    /// Jain's fairness index of the flows' transactions, (Σx)² / (n·Σx²): 1 when every flow
    /// got the same, 1/n when one flow got everything.
    pub fairness: f64,
    /// Each flow's transactions after the warm-up, in flow order; they add up to
    /// `transactions`.
    pub flow_transactions: Vec<u64>,
    /// UDP: requests given up on at the reply timeout (the flow sent the next one); a response
    /// that came later still counts as received. Absent for TCP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeouts: Option<u64>,
    /// The client's CPU time (user + system) per transaction, nanoseconds: its CPU over the
    /// whole run (the meter runs from the start, warm-up included) divided by every request
    /// answered in that run; absent when it was not measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_cpu_ns_per_transaction: Option<f64>,
    /// The agent's, likewise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_cpu_ns_per_transaction: Option<f64>,
    /// Open loop (`--rate`, the result's `rate_per_second`, over all flows): the requests
    /// sent that were scheduled after the warm-up, per second of the measured time, all
    /// flows. At most the rate asked; below it when flows were held at their depth until the
    /// end (`unsent`). Absent for the closed loop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_achieved_per_second: Option<f64>,
    /// Open loop: requests due before the end that never left, all flows (each flow was at
    /// its depth limit, waiting for responses, until the end). A request held back and sent
    /// later is not here but in the result's `late_sends`, its RTT counted from its
    /// scheduled time. Absent for the closed loop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unsent: Option<u64>,
}

impl RequestResponse {
    /// Jain's fairness index of `xs` ((Σx)² / (n·Σx²)); 1 for no flow or none that moved.
    pub fn jain(xs: &[u64]) -> f64 {
        let n = xs.len() as f64;
        let sum: f64 = xs.iter().map(|&x| x as f64).sum();
        let squares: f64 = xs.iter().map(|&x| (x as f64) * (x as f64)).sum();
        if squares == 0.0 {
            1.0
        } else {
            sum * sum / (n * squares)
        }
    }
}

/// One interval of a latency test (`-i`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LatencyInterval {
    /// Start, ns since the test started (the first starts at the end of the warm-up).
    pub start_ns: u64,
    /// End, ns since the test started.
    pub end_ns: u64,
    /// Replies that arrived in it.
    pub samples: u64,
    /// Their round-trip times, each percentile `null` where `samples` cannot support it (p99
    /// needs 1,000, as for the whole run). `null` when no reply arrived.
    pub rtt_ns: Option<RttNs>,
    /// `-P`/`--depth`: the interval's transactions (its replies, over all flows) per second of
    /// its length. Absent for the one-flow test.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transactions_per_second: Option<f64>,
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
