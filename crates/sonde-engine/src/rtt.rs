//! Round-trip time samples: HDR histogram, warm-up exclusion and the summary.

use hdrhistogram::Histogram;

/// Percentiles sonde reports, in percent.
pub const REPORTED_PERCENTILES: [f64; 6] = [50.0, 90.0, 99.0, 99.9, 99.99, 99.999];

/// The largest RTT the histogram tells apart, ns (one hour). Longer samples are recorded as this
/// value (`saturating_record`): a fixed range keeps `record` free of allocation.
pub const MAX_TRACKABLE_NS: u64 = 3_600 * 1_000_000_000;

/// Significant decimal digits the histogram keeps (values within 0.1 %).
const SIGNIFICANT_DIGITS: u8 = 3;

/// Percentiles are handled in parts per billion, so that the thresholds for the usual decimal
/// percentiles (99.9, 99.999) come out as exact integers rather than float noise.
const PPB: u64 = 1_000_000_000;

/// Whether `samples` can support the `pct` percentile: sonde asks for at least ten samples at or
/// beyond it, i.e. `samples >= 10 / (1 - pct/100)` (p99 needs 1,000, p99.99 needs 100,000).
///
/// `pct` is taken to a precision of 1e-7 percent. 100 and above (and NaN) are never supported;
/// below 0 counts as 0 (ten samples).
pub fn percentile_supported(pct: f64, samples: u64) -> bool {
    min_samples(pct).is_some_and(|needed| samples >= needed)
}

/// `pct` percent in parts per billion, clamped to `0..=PPB`; `None` for NaN.
fn pct_to_ppb(pct: f64) -> Option<u64> {
    if pct.is_nan() {
        return None;
    }
    // Percent to parts per billion is * 1e7; the cast saturates.
    Some(((pct.max(0.0) * 1e7).round() as u64).min(PPB))
}

/// The smallest sample count that supports `pct` (`10 / (1 - pct/100)`, rounded up); `None`
/// when no count does (100 and above, NaN).
pub fn min_samples(pct: f64) -> Option<u64> {
    let below_ppb = pct_to_ppb(pct)?;
    if below_ppb >= PPB {
        return None;
    }
    // 10 / (1 - below/PPB) = 10 * PPB / (PPB - below), rounded up.
    Some((10 * PPB).div_ceil(PPB - below_ppb))
}

/// The quantile to ask hdrhistogram for the `pct` percentile of `samples`.
///
/// hdrhistogram takes the `ceil(q * samples)`-th smallest sample. With `q = pct / 100` float
/// noise can push that one rank up (0.999 * 1000 = 999.000...1, so p99.9 of 1..=1000 would be
/// 1000). So the nearest rank `ceil(pct * samples / 100)` is computed in integers, and the
/// quantile is aimed at the middle of that rank, where rounding cannot move it.
pub(crate) fn quantile(pct: f64, samples: u64) -> f64 {
    let ppb = pct_to_ppb(pct).unwrap_or(PPB);
    let rank = (u128::from(ppb) * u128::from(samples))
        .div_ceil(u128::from(PPB))
        .max(1);
    (rank as f64 - 0.5) / samples as f64
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
///
/// Values are kept to 3 significant digits up to [`MAX_TRACKABLE_NS`]; min, max, mean, stddev
/// and percentiles all come from the histogram, so they carry that precision (the max is the
/// top of its bucket, up to 0.1 % above the largest sample).
#[derive(Debug, Clone)]
pub struct RttRecorder {
    warmup_ns: u64,
    warmup_excluded: u64,
    hist: Histogram<u64>,
}

impl Default for RttRecorder {
    /// No warm-up.
    fn default() -> Self {
        Self::new(0)
    }
}

impl RttRecorder {
    /// A recorder that drops samples sent in the first `warmup_ns` nanoseconds of the run.
    pub fn new(warmup_ns: u64) -> Self {
        // Bounds are constants that hdrhistogram accepts (low >= 1, high >= 2 * low, sigfig <= 5),
        // checked by the tests.
        let hist = Histogram::new_with_bounds(1, MAX_TRACKABLE_NS, SIGNIFICANT_DIGITS)
            .expect("constant histogram bounds are valid");
        Self {
            warmup_ns,
            warmup_excluded: 0,
            hist,
        }
    }

    /// Records one RTT of a message sent (or scheduled) at `sent_at_ns`.
    pub fn record(&mut self, sent_at_ns: u64, rtt_ns: u64) {
        if sent_at_ns < self.warmup_ns {
            self.warmup_excluded += 1;
        } else {
            self.hist.saturating_record(rtt_ns);
        }
    }

    /// Adds another recorder's samples (per-worker recorders merge at the end).
    pub fn merge(&mut self, other: &RttRecorder) {
        crate::histogram::add_saturating(&mut self.hist, &other.hist);
        self.warmup_excluded += other.warmup_excluded;
    }

    /// A recorder holding the samples of `hist` (a stored run's histogram read back) and no
    /// warm-up count. Values beyond [`MAX_TRACKABLE_NS`] are kept at that bound.
    pub fn from_histogram(hist: &Histogram<u64>) -> Self {
        let mut r = Self::new(0);
        crate::histogram::add_saturating(&mut r.hist, hist);
        r
    }

    /// Forgets every sample (and the warm-up count), keeping the histogram's memory: the next
    /// interval of a run that reports intervals starts from here.
    pub fn reset(&mut self) {
        self.hist.reset();
        self.warmup_excluded = 0;
    }

    /// Samples recorded so far.
    pub fn samples(&self) -> u64 {
        self.hist.len()
    }

    /// Samples left out because they were sent during warm-up.
    pub fn warmup_excluded(&self) -> u64 {
        self.warmup_excluded
    }

    /// The value at `pct` so far, for adaptive timeouts; `None` with no samples.
    ///
    /// The nearest-rank percentile: the `ceil(pct / 100 * samples)`-th smallest sample (at least
    /// the first), to the histogram's precision. NaN counts as 100.
    pub fn value_at(&self, pct: f64) -> Option<u64> {
        if self.hist.is_empty() {
            None
        } else {
            Some(self.hist.value_at_quantile(quantile(pct, self.hist.len())))
        }
    }

    /// The summary.
    pub fn summary(&self) -> RttSummary {
        let samples = self.samples();
        let percentiles = REPORTED_PERCENTILES
            .iter()
            .map(|&pct| Percentile {
                pct,
                value_ns: if percentile_supported(pct, samples) {
                    self.value_at(pct)
                } else {
                    None
                },
            })
            .collect();
        let (min_ns, max_ns) = if samples == 0 {
            (0, 0)
        } else {
            (self.hist.min(), self.hist.max())
        };
        RttSummary {
            samples,
            warmup_excluded: self.warmup_excluded,
            min_ns,
            max_ns,
            mean_ns: self.hist.mean(),
            stddev_ns: self.hist.stdev(),
            percentiles,
        }
    }

    /// The recorded samples' histogram in hdrhistogram's V2 serialization, deflated: the whole
    /// distribution in a few kilobytes, for the results store (a reader decodes it with
    /// hdrhistogram's `Deserializer` and can merge repetitions exactly).
    pub fn serialized(&self) -> Vec<u8> {
        use hdrhistogram::serialization::{Serializer, V2DeflateSerializer};
        let mut out = Vec::new();
        // Writing to a Vec does no I/O, and counts are u64 (at most i64::MAX is serializable:
        // more samples than any test takes), so this cannot fail in practice; if it ever does,
        // the store keeps an empty blob rather than the test failing.
        if V2DeflateSerializer::new()
            .serialize(&self.hist, &mut out)
            .is_err()
        {
            out.clear();
        }
        out
    }

    /// The distribution as log-spaced buckets (`--histogram`), from the bucket holding the
    /// smallest sample to the one holding the largest: see [`crate::histogram::log_buckets`].
    pub fn log_buckets(&self, max_buckets: usize) -> Vec<crate::histogram::Bucket> {
        crate::histogram::log_buckets(
            self.hist
                .iter_recorded()
                .map(|v| (v.value_iterated_to(), v.count_at_value())),
            max_buckets,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: u64 = 1_000;

    /// Within the histogram's 3 significant digits.
    fn close(actual: u64, expected: u64) -> bool {
        actual.abs_diff(expected) <= expected / 1_000 + 1
    }

    #[test]
    fn the_serialized_histogram_decodes_to_the_same_distribution() {
        let mut r = RttRecorder::new(1_000);
        r.record(0, 5 * US); // warm-up: not in the histogram
        for (i, v) in [12 * US, 13 * US, 250 * US, 9_000 * US]
            .into_iter()
            .enumerate()
        {
            r.record(2_000 + i as u64, v);
        }
        let bytes = r.serialized();
        let back: Histogram<u64> = hdrhistogram::serialization::Deserializer::new()
            .deserialize(&mut bytes.as_slice())
            .expect("decodes");
        assert_eq!(back, r.hist);
        assert_eq!(back.len(), 4);
        assert!(close(back.max(), 9_000 * US));
    }

    #[test]
    fn percentile_support_boundaries_are_exact() {
        let cases = [
            (50.0, 20),
            (90.0, 100),
            (99.0, 1_000),
            (99.9, 10_000),
            (99.99, 100_000),
            (99.999, 1_000_000),
        ];
        for (pct, needed) in cases {
            assert!(percentile_supported(pct, needed), "p{pct} with {needed}");
            assert!(
                !percentile_supported(pct, needed - 1),
                "p{pct} with {}",
                needed - 1
            );
        }
        assert!(percentile_supported(0.0, 10));
        assert!(!percentile_supported(0.0, 9));
        assert!(percentile_supported(95.0, 200));
        assert!(!percentile_supported(95.0, 199));
        assert!(!percentile_supported(100.0, u64::MAX));
        assert!(!percentile_supported(f64::NAN, u64::MAX));
        assert!(!percentile_supported(f64::INFINITY, u64::MAX));
    }

    #[test]
    fn warmup_samples_are_counted_not_recorded() {
        let mut r = RttRecorder::new(1_000);
        r.record(0, 5 * US);
        r.record(999, 5 * US);
        r.record(1_000, 7 * US); // sent exactly when warm-up ends: kept
        r.record(2_000, 9 * US);
        assert_eq!(r.samples(), 2);
        assert_eq!(r.warmup_excluded(), 2);
        let s = r.summary();
        assert_eq!((s.samples, s.warmup_excluded), (2, 2));
        assert!(close(s.min_ns, 7 * US));
        assert!(close(s.max_ns, 9 * US));
    }

    #[test]
    fn empty_summary_has_zeros_and_no_percentiles() {
        let r = RttRecorder::new(0);
        let s = r.summary();
        assert_eq!(s.samples, 0);
        assert_eq!((s.min_ns, s.max_ns), (0, 0));
        assert_eq!(s.mean_ns, 0.0);
        assert_eq!(s.stddev_ns, 0.0);
        assert_eq!(s.percentiles.len(), REPORTED_PERCENTILES.len());
        assert!(s.percentiles.iter().all(|p| p.value_ns.is_none()));
        assert_eq!(r.value_at(50.0), None);
    }

    #[test]
    fn uniform_distribution_summary() {
        let mut r = RttRecorder::new(0);
        for us in 1..=1_000 {
            r.record(0, us * US);
        }
        let s = r.summary();
        assert_eq!(s.samples, 1_000);
        assert!(close(s.min_ns, US), "{}", s.min_ns);
        assert!(close(s.max_ns, 1_000 * US), "{}", s.max_ns);
        assert!((s.mean_ns - 500_500.0).abs() < 500.0, "{}", s.mean_ns);
        // Uniform over 1..=1000 µs: sqrt((n^2 - 1) / 12) µs.
        assert!((s.stddev_ns - 288_675.0).abs() < 500.0, "{}", s.stddev_ns);

        let pcts: Vec<f64> = s.percentiles.iter().map(|p| p.pct).collect();
        assert_eq!(pcts, REPORTED_PERCENTILES);
        let p = |pct: f64| {
            s.percentiles
                .iter()
                .find(|p| p.pct == pct)
                .unwrap()
                .value_ns
        };
        assert!(close(p(50.0).unwrap(), 500 * US), "{:?}", p(50.0));
        assert!(close(p(90.0).unwrap(), 900 * US), "{:?}", p(90.0));
        assert!(close(p(99.0).unwrap(), 990 * US), "{:?}", p(99.0));
        assert_eq!(p(99.9), None);
        assert_eq!(p(99.99), None);
        assert_eq!(p(99.999), None);
        // value_at answers whatever the count, for adaptive timeouts.
        assert!(close(r.value_at(99.9).unwrap(), 999 * US));
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        // Below 2,048 ns the histogram is exact, so the ranks can be checked to the nanosecond.
        let mut r = RttRecorder::new(0);
        for ns in 1..=2_000 {
            r.record(0, ns);
        }
        assert_eq!(r.value_at(50.0), Some(1_000));
        assert_eq!(r.value_at(90.0), Some(1_800));
        assert_eq!(r.value_at(99.0), Some(1_980));
        assert_eq!(r.value_at(99.9), Some(1_998));
        assert_eq!(r.value_at(99.99), Some(2_000));
        assert_eq!(r.value_at(100.0), Some(2_000));
        assert_eq!(r.value_at(0.0), Some(1));
        assert_eq!(r.value_at(-5.0), Some(1));
        assert_eq!(r.value_at(250.0), Some(2_000));
        assert_eq!(r.value_at(f64::NAN), Some(2_000));

        let mut r = RttRecorder::new(0);
        r.record(0, 42);
        assert_eq!(r.value_at(0.0), Some(42));
        assert_eq!(r.value_at(99.999), Some(42));
    }

    #[test]
    fn merge_equals_recording_into_one() {
        let mut one = RttRecorder::new(100);
        let mut a = RttRecorder::new(100);
        let mut b = RttRecorder::new(100);
        for i in 0..5_000u64 {
            let (sent, rtt) = (i * 7 % 300, 1_000 + i * 37 % 100_000);
            one.record(sent, rtt);
            if i % 3 == 0 {
                a.record(sent, rtt);
            } else {
                b.record(sent, rtt);
            }
        }
        a.merge(&b);
        assert_eq!(a.samples(), one.samples());
        assert_eq!(a.warmup_excluded(), one.warmup_excluded());
        assert!(a.warmup_excluded() > 0);
        assert_eq!(a.summary(), one.summary());
    }

    #[test]
    fn from_histogram_keeps_the_distribution() {
        let mut r = RttRecorder::new(0);
        for i in 1..=5_000u64 {
            r.record(0, 10_000 + i * 13);
        }
        let mut plain = Histogram::<u64>::new(3).unwrap();
        for i in 1..=5_000u64 {
            plain.record(10_000 + i * 13).unwrap();
        }
        assert_eq!(RttRecorder::from_histogram(&plain).summary(), r.summary());
    }

    #[test]
    fn huge_rtt_saturates_instead_of_failing() {
        let mut r = RttRecorder::new(0);
        r.record(0, u64::MAX);
        r.record(0, 0);
        let s = r.summary();
        assert_eq!(s.samples, 2);
        assert_eq!(s.min_ns, 0);
        assert!(close(s.max_ns, MAX_TRACKABLE_NS));
    }
}
