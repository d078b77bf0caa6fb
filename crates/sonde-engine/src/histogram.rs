//! A distribution as log-spaced buckets, for people (`--histogram`): latency spans orders of
//! magnitude (a 10 µs median with a 5 ms tail), so equal-width buckets would put everything in
//! the first one.
//!
//! Bucket bounds are powers of `2^(1/k)`: `k` buckets per octave (4, each bound about 19% above
//! the last, when the samples span up to 12 octaves; fewer when they span more, so that a table
//! stays short). A bucket holds the samples above the previous bound up to and including its own
//! (`le_ns`, "less than or equal", as Prometheus names it; the counts here are per bucket, not
//! cumulative). Every bucket from the smallest sample's to the largest's is listed, empty ones
//! too, so that a gap in the distribution shows.
//!
//! ```
//! use sonde_engine::histogram::log_buckets;
//!
//! // 10 samples of 1,000 ns and one of 8,000 ns: three octaves apart.
//! let b = log_buckets([(1_000, 10), (8_000, 1)], 48);
//! assert_eq!(b.first().map(|b| (b.le_ns, b.count)), Some((1_024, 10)));
//! assert_eq!(b.last().map(|b| (b.le_ns, b.count)), Some((8_192, 1)));
//! assert_eq!(b.iter().map(|b| b.count).sum::<u64>(), 11);
//! assert_eq!(b.len(), 13); // 4 per octave, from 2^10 to 2^13
//! ```

/// One bucket: the samples above the previous bucket's bound, up to `le_ns`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bucket {
    /// Upper bound, inclusive, ns.
    pub le_ns: u64,
    /// Samples in this bucket (not cumulative).
    pub count: u64,
}

/// The most buckets per octave.
const FINEST: u32 = 4;

/// Buckets of `(value, count)` pairs (in any order; values in ns), at most `max_buckets` of
/// them unless even one bucket per octave needs more (64 octaves at most). Empty when there
/// are no samples.
pub fn log_buckets(
    values: impl IntoIterator<Item = (u64, u64)>,
    max_buckets: usize,
) -> Vec<Bucket> {
    let values: Vec<(u64, u64)> = values.into_iter().filter(|&(_, c)| c > 0).collect();
    let (Some(lo), Some(hi)) = (
        values.iter().map(|&(v, _)| v).min(),
        values.iter().map(|&(v, _)| v).max(),
    ) else {
        return Vec::new();
    };
    let mut per_octave = FINEST;
    loop {
        let span = index(hi, per_octave) - index(lo, per_octave) + 1;
        if span as usize <= max_buckets.max(1) || per_octave == 1 {
            break;
        }
        per_octave /= 2;
    }
    let first = index(lo, per_octave);
    let last = index(hi, per_octave);
    let mut buckets: Vec<Bucket> = (first..=last)
        .map(|k| Bucket {
            le_ns: bound(k, per_octave),
            count: 0,
        })
        .collect();
    for (v, c) in values {
        let b = &mut buckets[(index(v, per_octave) - first) as usize];
        b.count = b.count.saturating_add(c);
    }
    buckets
}

/// Adds `from`'s samples to `into`. The histograms this crate merges (per-worker recorders,
/// per-worker intervals) all have the same fixed bounds, so the addition cannot run out of
/// range; the fallback, a sample at a time saturating at the top, only keeps the counts should
/// that ever change.
pub(crate) fn add_saturating<T: hdrhistogram::Counter>(
    into: &mut hdrhistogram::Histogram<T>,
    from: &hdrhistogram::Histogram<T>,
) {
    if into.add(from).is_err() {
        for v in from.iter_recorded() {
            into.saturating_record_n(v.value_iterated_to(), v.count_at_value());
        }
    }
}

/// The bound of bucket `k`: `2^(k / per_octave)`, rounded up to whole ns.
fn bound(k: u32, per_octave: u32) -> u64 {
    let b = 2f64.powf(f64::from(k) / f64::from(per_octave)).ceil();
    if b >= u64::MAX as f64 {
        u64::MAX
    } else {
        b as u64
    }
}

/// The bucket of `v`: the smallest `k` whose bound is at least `v`.
fn index(v: u64, per_octave: u32) -> u32 {
    if v <= 1 {
        return 0;
    }
    let max = 64 * per_octave;
    let mut k = ((v as f64).log2() * f64::from(per_octave))
        .ceil()
        .clamp(0.0, f64::from(max)) as u32;
    // The float guess may be one off either way at an exact power.
    while k < max && bound(k, per_octave) < v {
        k += 1;
    }
    while k > 0 && bound(k - 1, per_octave) >= v {
        k -= 1;
    }
    k
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_sample_lands_in_the_bucket_that_bounds_it() {
        let values: Vec<(u64, u64)> = (1..5_000u64)
            .map(|i| (i * 37 % 90_001 + 1, i % 3 + 1))
            .collect();
        let total: u64 = values.iter().map(|&(_, c)| c).sum();
        let b = log_buckets(values.iter().copied(), 64);
        assert_eq!(b.iter().map(|b| b.count).sum::<u64>(), total);
        for (v, _) in &values {
            let i = b.iter().position(|b| b.le_ns >= *v).unwrap();
            assert!(i == 0 || b[i - 1].le_ns < *v);
        }
        // Bounds rise by 2^(1/4) each.
        for w in b.windows(2) {
            let ratio = w[1].le_ns as f64 / w[0].le_ns as f64;
            assert!(
                (ratio - 2f64.powf(0.25)).abs() < 1.0 / w[0].le_ns as f64 + 0.001,
                "{w:?}"
            );
        }
    }

    #[test]
    fn a_wide_range_gets_coarser_buckets_not_a_long_table() {
        // 1 µs to 10 s: 23 octaves.
        let b = log_buckets([(1_000, 5), (10_000_000_000, 1)], 48);
        assert!(b.len() <= 48, "{}", b.len());
        assert_eq!(b.first().unwrap().count, 5);
        assert_eq!(b.last().unwrap().count, 1);
        assert!(b[1..b.len() - 1].iter().all(|b| b.count == 0));
        // Even one bucket per octave may pass the cap: 0 to 2^64 is 64 octaves.
        let b = log_buckets([(0, 1), (u64::MAX, 1)], 8);
        assert_eq!(b.len(), 65);
        assert_eq!(b.last().unwrap().le_ns, u64::MAX);
    }

    #[test]
    fn nothing_recorded_is_no_buckets() {
        assert!(log_buckets([], 48).is_empty());
        assert!(log_buckets([(5, 0)], 48).is_empty());
        assert_eq!(
            log_buckets([(7, 3)], 48),
            vec![Bucket { le_ns: 7, count: 3 }]
        );
    }
}
