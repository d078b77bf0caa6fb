//! sonde's measurement state machines and statistics. Sans-IO: nothing here touches a socket or
//! reads a clock. Callers pass times as nanoseconds since an origin they chose (a test's start),
//! which is what lets every piece be tested on a virtual clock.
//!
//! * [`rtt`]: RTT samples into an HDR histogram, warm-up exclusion, the summary with percentiles
//!   that the sample count can support.
//! * [`seq`]: unique, duplicate, reordered and lost datagrams from sequence numbers.
//! * [`jitter`]: RFC 3550 interarrival jitter.
//! * [`pace`]: evenly spaced send schedules (UDP bitrate, open-loop latency), and a token bucket
//!   for byte streams (the agent's capped TCP reads).
//! * [`open_flows`]: the open loop over many flows: a total request rate spread evenly over
//!   the flows with staggered phases, each flow held to its depth (`latency -P N --rate R`).
//! * [`interval`]: cumulative receiver counters cut into fixed intervals.
//! * [`offset`]: NTP-style clock offset and drift between two hosts, and one-way delays with
//!   their uncertainty.
//! * [`histogram`]: log-spaced buckets of a distribution, for `--histogram`.
//! * [`oneway`]: one-way delays from four-timestamp probes, in signed histograms, and how far a
//!   provisional clock model strays from the final one.
//! * [`compare`]: whether two sets of runs differ (Mann-Whitney U), and what a thin percentile
//!   can honestly be read as.
//! * [`crr`]: connection-rate counts and connect/transaction times per worker, merged at the end.
//! * [`mtu`]: the path MTU search of `sonde mtu` (which size to probe next, and what an echo,
//!   a router's "fragmentation needed" or silence says).
//! * [`sweep`]: sweep specs (`msg_size=1:64K:*2`) expanded into the values to run.
//! * [`schedule`]: when a mesh agent runs its short throughput and pps tests to each peer
//!   (jitter, one test per pair at a time, a cap on each link's share of time under test).
//! * [`mesh_select`]: which peers a mesh agent probes (the three levels of Pingmesh over
//!   labelled nodes), the same at every agent.
//! * [`diagnose`]: which mesh pairs are bad, and which host, group or cross explains them best
//!   (`sonde mesh diagnose`).
//!
//! ```
//! use sonde_engine::{pace::Schedule, rtt::RttRecorder, seq::SeqTracker};
//!
//! // 1,000 probes a second; the first second is warm-up.
//! let schedule = Schedule::per_second(1_000.0);
//! let mut rtt = RttRecorder::new(1_000_000_000);
//! let mut seq = SeqTracker::new();
//! for i in 0..3_000 {
//!     if i % 100 == 7 {
//!         continue; // lost
//!     }
//!     seq.on_packet(i);
//!     rtt.record(schedule.due_ns(i), 50_000 + i % 10);
//! }
//! assert_eq!(seq.lost(3_000), 30);
//! let summary = rtt.summary();
//! assert_eq!((summary.samples, summary.warmup_excluded), (1_980, 990));
//! assert!(summary.percentiles[0].value_ns.is_some()); // p50
//! ```
#![forbid(unsafe_code)]

pub mod compare;
pub mod crr;
pub mod diagnose;
pub mod histogram;
pub mod interval;
pub mod jitter;
pub mod mesh_select;
pub mod mtu;
pub mod offset;
pub mod oneway;
pub mod open_flows;
pub mod pace;
pub mod probe;
pub mod rtt;
pub mod schedule;
pub mod seq;
pub mod sweep;

/// Bits per second for `bytes` over `ns` nanoseconds; 0 when no time has passed.
pub fn bits_per_second(bytes: u64, ns: u64) -> f64 {
    if ns == 0 {
        0.0
    } else {
        bytes as f64 * 8.0 * 1e9 / ns as f64
    }
}

/// Events per second for `count` over `ns` nanoseconds; 0 when no time has passed.
pub fn per_second(count: u64, ns: u64) -> f64 {
    if ns == 0 {
        0.0
    } else {
        count as f64 * 1e9 / ns as f64
    }
}
