//! sonde's measurement state machines and statistics. Sans-IO: nothing here touches a socket or
//! reads a clock. Callers pass times as nanoseconds since an origin they chose (a test's start),
//! which is what lets every piece be tested on a virtual clock.
//!
//! * [`rtt`]: RTT samples into an HDR histogram, warm-up exclusion, the summary with percentiles
//!   that the sample count can support.
//! * [`seq`]: unique, duplicate, reordered and lost datagrams from sequence numbers.
//! * [`jitter`]: RFC 3550 interarrival jitter.
//! * [`pace`]: evenly spaced send schedules (UDP bitrate, open-loop latency).
//! * [`interval`]: cumulative receiver counters cut into fixed intervals.
#![forbid(unsafe_code)]

pub mod interval;
pub mod jitter;
pub mod pace;
pub mod rtt;
pub mod seq;

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
