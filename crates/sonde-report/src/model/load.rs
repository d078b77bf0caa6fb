//! `sonde load`'s document.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::latency::LatencyResult;
use super::meta::Labels;
use super::throughput::ThroughputResult;

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
