//! Statistics several kinds share: round-trip times and histogram buckets.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

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
