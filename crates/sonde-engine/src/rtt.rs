//! Round-trip time samples: HDR histogram, warm-up exclusion and the summary.

/// Percentiles sonde reports, in percent.
pub const REPORTED_PERCENTILES: [f64; 6] = [50.0, 90.0, 99.0, 99.9, 99.99, 99.999];

/// Whether `samples` can support the `pct` percentile: sonde asks for at least ten samples at or
/// beyond it, i.e. `samples >= 10 / (1 - pct/100)` (p99 needs 1,000, p99.99 needs 100,000).
pub fn percentile_supported(pct: f64, samples: u64) -> bool {
    todo!("{pct} {samples}")
}

/// One reported percentile: `value_ns` is `None` when the sample count cannot support it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Percentile {
    /// The percentile, in percent (99.9).
    pub pct: f64,
    /// Its value, or `None` when too few samples were taken to state it.
    pub value_ns: Option<u64>,
}

/// The RTT summary of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct RttSummary {
    /// Samples in the histogram (warm-up excluded).
    pub samples: u64,
    /// Samples sent during warm-up and left out.
    pub warmup_excluded: u64,
    /// Smallest RTT, ns (0 when there are no samples).
    pub min_ns: u64,
    /// Largest RTT, ns.
    pub max_ns: u64,
    /// Mean RTT, ns.
    pub mean_ns: f64,
    /// Standard deviation, ns.
    pub stddev_ns: f64,
    /// The [`REPORTED_PERCENTILES`], in that order.
    pub percentiles: Vec<Percentile>,
}

/// Records RTT samples. A sample whose message was *sent* before the warm-up ended is counted
/// as excluded, not recorded.
#[derive(Debug, Clone)]
pub struct RttRecorder {
    _private: (),
}

impl RttRecorder {
    /// A recorder that drops samples sent in the first `warmup_ns` nanoseconds of the run.
    pub fn new(warmup_ns: u64) -> Self {
        todo!("{warmup_ns}")
    }

    /// Records one RTT of a message sent (or scheduled) at `sent_at_ns`.
    pub fn record(&mut self, sent_at_ns: u64, rtt_ns: u64) {
        todo!("{sent_at_ns} {rtt_ns}")
    }

    /// Adds another recorder's samples (per-worker recorders merge at the end).
    pub fn merge(&mut self, other: &RttRecorder) {
        todo!("{other:?}")
    }

    /// Samples recorded so far.
    pub fn samples(&self) -> u64 {
        todo!()
    }

    /// The value at `pct` so far, for adaptive timeouts; `None` with no samples.
    pub fn value_at(&self, pct: f64) -> Option<u64> {
        todo!("{pct}")
    }

    /// The summary.
    pub fn summary(&self) -> RttSummary {
        todo!()
    }
}
