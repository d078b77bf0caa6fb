//! Statistics for comparing runs (`sonde compare`, the report): whether two sets of runs differ
//! (a two-sided Mann-Whitney U test, benchstat's method), and what a user can honestly quote for
//! a percentile that the sample count cannot support.
//!
//! The U test compares the runs of side A with the runs of side B, one value per run (a run's
//! mean RTT, its throughput). It makes no assumption about the distribution, which suits figures
//! with long tails, and needs at least [`MIN_RUNS`] runs a side to say anything: with fewer,
//! [`significance`] says so instead of guessing. The p-value comes from the normal approximation
//! with the tie correction and the continuity correction (what `scipy.stats.mannwhitneyu(x, y,
//! method="asymptotic", use_continuity=True)` computes), not from the exact distribution: with
//! 5 runs a side and no ties the approximation gives p = 0.012 where the exact test gives
//! 0.008, a little more cautious, and it stays correct when runs tie.
//!
//! ```
//! use sonde_engine::compare::{significance, Significance, DEFAULT_ALPHA};
//!
//! let before = [101.0, 99.0, 100.0, 102.0, 98.0];
//! let after = [111.0, 109.0, 110.0, 112.0, 108.0];
//! assert!(matches!(significance(&before, &after, DEFAULT_ALPHA), Significance::Significant { .. }));
//! let again = [100.5, 99.5, 101.5, 98.5, 100.0];
//! assert!(matches!(significance(&before, &again, DEFAULT_ALPHA), Significance::NotSignificant { .. }));
//! assert!(matches!(significance(&before[..3], &after, DEFAULT_ALPHA), Significance::TooFewRuns { .. }));
//! ```

use crate::rtt::{min_samples, percentile_supported, RttRecorder};

/// The significance level unless the user states another.
pub const DEFAULT_ALPHA: f64 = 0.05;

/// Runs a side below which no significance is claimed (benchstat's threshold: with 4 and 4 the
/// smallest possible two-sided p-value is above 0.05 anyway).
pub const MIN_RUNS: usize = 5;

/// The outcome of a two-sided Mann-Whitney U test.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MannWhitney {
    /// U of the first sample: the number of (a, b) pairs with a > b, ties counting one half.
    pub u: f64,
    /// The two-sided p-value (normal approximation, tie and continuity corrected), in [0, 1].
    pub p_value: f64,
}

/// The two-sided Mann-Whitney U test of `a` against `b`; `None` when either is empty or holds a
/// NaN. When every value ties (no spread at all) the p-value is 1: nothing tells the sides apart.
pub fn mann_whitney_u(a: &[f64], b: &[f64]) -> Option<MannWhitney> {
    if a.is_empty() || b.is_empty() || a.iter().chain(b).any(|v| v.is_nan()) {
        return None;
    }
    let (n1, n2) = (a.len() as f64, b.len() as f64);
    let n = n1 + n2;
    // Midranks over the pooled values; the first sample's rank sum gives U, each group of
    // tied values of size t adds t^3 - t to the tie correction.
    let mut pooled: Vec<(f64, bool)> = a
        .iter()
        .map(|&v| (v, true))
        .chain(b.iter().map(|&v| (v, false)))
        .collect();
    pooled.sort_by(|x, y| x.0.total_cmp(&y.0));
    let (mut rank_sum_a, mut ties) = (0.0, 0.0);
    let mut i = 0;
    while i < pooled.len() {
        let mut j = i + 1;
        while j < pooled.len() && pooled[j].0 == pooled[i].0 {
            j += 1;
        }
        // Ranks i+1 ..= j share their mean.
        let midrank = (i + 1 + j) as f64 / 2.0;
        let in_a = pooled[i..j].iter().filter(|(_, is_a)| *is_a).count() as f64;
        rank_sum_a += midrank * in_a;
        let t = (j - i) as f64;
        ties += t * t * t - t;
        i = j;
    }
    let u = rank_sum_a - n1 * (n1 + 1.0) / 2.0;
    let mean = n1 * n2 / 2.0;
    let variance = n1 * n2 / 12.0 * ((n + 1.0) - ties / (n * (n - 1.0)));
    let p_value = if variance <= 0.0 {
        1.0
    } else {
        // Two-sided: the larger of U1 and U2 against the mean, 0.5 nearer for continuity.
        let z = (u.max(n1 * n2 - u) - mean - 0.5) / variance.sqrt();
        (2.0 * normal_sf(z)).clamp(0.0, 1.0)
    };
    Some(MannWhitney { u, p_value })
}

/// P(Z > z) for a standard normal Z.
fn normal_sf(z: f64) -> f64 {
    0.5 * libm::erfc(z / std::f64::consts::SQRT_2)
}

/// Whether a change between two sets of runs is significant.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Significance {
    /// p < alpha: the runs differ.
    Significant {
        /// The test's p-value.
        p_value: f64,
    },
    /// p >= alpha: no difference the runs can show (printed `~`).
    NotSignificant {
        /// The test's p-value.
        p_value: f64,
    },
    /// Fewer than [`MIN_RUNS`] runs on a side: the change is printed, and significance needs
    /// `--repeat`.
    TooFewRuns {
        /// Runs on side A.
        runs_a: usize,
        /// Runs on side B.
        runs_b: usize,
    },
}

/// The U test of `a` against `b` at `alpha`, with at least [`MIN_RUNS`] runs a side.
pub fn significance(a: &[f64], b: &[f64], alpha: f64) -> Significance {
    if a.len() < MIN_RUNS || b.len() < MIN_RUNS {
        return Significance::TooFewRuns {
            runs_a: a.len(),
            runs_b: b.len(),
        };
    }
    match mann_whitney_u(a, b) {
        Some(t) if t.p_value < alpha => Significance::Significant { p_value: t.p_value },
        Some(t) => Significance::NotSignificant { p_value: t.p_value },
        // A NaN figure: nothing can be said.
        None => Significance::NotSignificant { p_value: 1.0 },
    }
}

/// The median of `values` (the mean of the middle two for an even count); `None` when empty.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// What can honestly be said about the `pct` percentile of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PercentileReading {
    /// The sample count supports the percentile (at least ten samples beyond it).
    Supported {
        /// The percentile, ns.
        value_ns: u64,
    },
    /// Too few samples: the percentile's value rests on `beyond` samples above it (fewer than
    /// ten), so one slow message more or less moves it.
    Thin {
        /// The nearest-rank value, ns.
        value_ns: u64,
        /// Samples beyond it (1 to 9).
        beyond: u64,
    },
    /// Not even one sample beyond the percentile: the largest sample is all there is, and it is
    /// the maximum, not the percentile (sockperf prints it as p99.99).
    Max {
        /// The largest sample, ns.
        value_ns: u64,
    },
    /// No samples at all.
    Empty,
}

/// The samples of a run of `samples` that lie beyond the `pct` percentile (nearest rank).
pub fn samples_beyond(pct: f64, samples: u64) -> u64 {
    let ppb = (pct.clamp(0.0, 100.0) * 1e7).round() as u128;
    let rank = (ppb * u128::from(samples)).div_ceil(1_000_000_000).max(1);
    samples.saturating_sub(rank as u64)
}

/// What `rtt` can say about its `pct` percentile: see [`PercentileReading`].
pub fn percentile_reading(rtt: &RttRecorder, pct: f64) -> PercentileReading {
    let samples = rtt.samples();
    let Some(value_ns) = rtt.value_at(pct) else {
        return PercentileReading::Empty;
    };
    if percentile_supported(pct, samples) {
        return PercentileReading::Supported { value_ns };
    }
    match samples_beyond(pct, samples) {
        0 => PercentileReading::Max {
            value_ns: rtt.value_at(100.0).unwrap_or(value_ns),
        },
        beyond => PercentileReading::Thin { value_ns, beyond },
    }
}

/// How long a run at the rate this one took samples (`samples` over `duration_ns`) must be to
/// support the `pct` percentile, ns; `None` without samples or time, or for a percentile no
/// count supports.
pub fn duration_needed_ns(pct: f64, samples: u64, duration_ns: u64) -> Option<u64> {
    let needed = min_samples(pct)?;
    if samples == 0 || duration_ns == 0 {
        return None;
    }
    let ns = (u128::from(needed) * u128::from(duration_ns)).div_ceil(u128::from(samples));
    Some(u64::try_from(ns).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol
    }

    // Expected U and p below were computed once, independently, with SciPy 1.x:
    //   scipy.stats.mannwhitneyu(a, b, alternative="two-sided", method="asymptotic",
    //                            use_continuity=True)
    // (the statistic SciPy returns is U of the first sample).
    #[test]
    fn known_values_from_scipy() {
        let cases: &[(&[f64], &[f64], f64, f64)] = &[
            // No ties, 5 and 5, completely separated.
            (
                &[1.0, 2.0, 3.0, 4.0, 5.0],
                &[6.0, 7.0, 8.0, 9.0, 10.0],
                0.0,
                SCIPY_SEPARATED_5_5,
            ),
            // Interleaved, with ties across the samples.
            (
                &[1.0, 2.0, 2.0, 3.0, 5.0, 8.0],
                &[2.0, 3.0, 4.0, 6.0, 7.0, 9.0, 9.0],
                SCIPY_TIES_U,
                SCIPY_TIES_P,
            ),
            // Unequal sizes, overlapping.
            (
                &[10.1, 11.3, 9.8, 12.0, 10.7, 11.1, 10.0],
                &[11.9, 12.4, 10.9, 13.1, 12.8],
                SCIPY_UNEQUAL_U,
                SCIPY_UNEQUAL_P,
            ),
        ];
        for (i, &(a, b, u, p)) in cases.iter().enumerate() {
            let t = mann_whitney_u(a, b).unwrap();
            assert!(close(t.u, u, 1e-9), "case {i}: U {} != {u}", t.u);
            assert!(
                close(t.p_value, p, 1e-8),
                "case {i}: p {} != {p}",
                t.p_value
            );
            // Swapping the sides gives the complementary U and the same two-sided p.
            let s = mann_whitney_u(b, a).unwrap();
            let n = (a.len() * b.len()) as f64;
            assert!(close(s.u, n - u, 1e-9), "case {i} swapped");
            assert!(close(s.p_value, p, 1e-12), "case {i} swapped");
        }
    }

    // SciPy 1.17.1 printed these (and 0.0079365 for the first case with method="exact", the
    // figure quoted in the module docs).
    const SCIPY_SEPARATED_5_5: f64 = 0.012_185_780_355_344_813;
    const SCIPY_TIES_U: f64 = 10.5;
    const SCIPY_TIES_P: f64 = 0.149_727_981_895_451_22;
    const SCIPY_UNEQUAL_U: f64 = 4.0;
    const SCIPY_UNEQUAL_P: f64 = 0.034_755_584_359_616_16;

    /// A deterministic stand-in for noise: a fixed pseudo-random sequence in [-1, 1).
    fn noise(seed: u64, n: usize) -> Vec<f64> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 11) as f64 / (1u64 << 52) as f64 - 1.0
            })
            .collect()
    }

    #[test]
    fn identical_distributions_are_not_significant() {
        // Five runs a side from the same distribution, for many different draws: at alpha
        // 0.05 a correct test calls about 5% of such pairs significant, never most of them.
        let mut significant = 0;
        let draws = 200;
        for seed in 0..draws {
            let a: Vec<f64> = noise(seed, 5).iter().map(|e| 100.0 + 5.0 * e).collect();
            let b: Vec<f64> = noise(seed + 10_000, 5)
                .iter()
                .map(|e| 100.0 + 5.0 * e)
                .collect();
            if matches!(
                significance(&a, &b, DEFAULT_ALPHA),
                Significance::Significant { .. }
            ) {
                significant += 1;
            }
        }
        assert!(significant <= draws / 10, "{significant} of {draws}");
        // The same runs on both sides are as alike as runs can be.
        let a = [100.0, 101.0, 99.5, 100.2, 100.8];
        match significance(&a, &a, DEFAULT_ALPHA) {
            Significance::NotSignificant { p_value } => assert!(p_value > 0.9, "{p_value}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_shifted_distribution_is_significant() {
        // The same noise, shifted by three times its spread: every draw is told apart.
        for seed in 0..50 {
            let a: Vec<f64> = noise(seed, 5).iter().map(|e| 100.0 + 5.0 * e).collect();
            let b: Vec<f64> = noise(seed + 10_000, 5)
                .iter()
                .map(|e| 115.0 + 5.0 * e)
                .collect();
            assert!(
                matches!(
                    significance(&a, &b, DEFAULT_ALPHA),
                    Significance::Significant { .. }
                ),
                "seed {seed}: {a:?} vs {b:?}"
            );
        }
    }

    #[test]
    fn fewer_than_five_runs_claims_nothing() {
        let a = [1.0, 2.0, 3.0, 4.0];
        let b = [10.0, 20.0, 30.0, 40.0, 50.0];
        assert_eq!(
            significance(&a, &b, DEFAULT_ALPHA),
            Significance::TooFewRuns {
                runs_a: 4,
                runs_b: 5
            }
        );
        assert_eq!(
            significance(&[1.0], &[2.0], DEFAULT_ALPHA),
            Significance::TooFewRuns {
                runs_a: 1,
                runs_b: 1
            }
        );
    }

    #[test]
    fn all_tied_is_p_one_and_empty_or_nan_is_none() {
        let t = mann_whitney_u(&[3.0; 5], &[3.0; 6]).unwrap();
        assert_eq!((t.u, t.p_value), (15.0, 1.0));
        assert_eq!(mann_whitney_u(&[], &[1.0]), None);
        assert_eq!(mann_whitney_u(&[f64::NAN], &[1.0]), None);
    }

    #[test]
    fn alpha_is_the_threshold() {
        let a = [1.0, 2.0, 3.0, 4.0, 5.0];
        let b = [6.0, 7.0, 8.0, 9.0, 10.0];
        // p = 0.0122 (above): significant at 0.05, not at 0.01.
        assert!(matches!(
            significance(&a, &b, 0.05),
            Significance::Significant { .. }
        ));
        assert!(matches!(
            significance(&a, &b, 0.01),
            Significance::NotSignificant { .. }
        ));
    }

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn thin_percentiles_say_what_they_rest_on() {
        // 7,000 samples (10 s over a 1.4 ms path): p99 is supported (1,000 needed), p99.9 rests
        // on the 7 samples beyond it, p99.99 on none: it is the maximum.
        let mut r = RttRecorder::new(0);
        for i in 1..=7_000u64 {
            r.record(0, i); // exact below 2,048 ns, within 0.1% above
        }
        assert!(matches!(
            percentile_reading(&r, 99.0),
            PercentileReading::Supported { .. }
        ));
        match percentile_reading(&r, 99.9) {
            PercentileReading::Thin { value_ns, beyond } => {
                assert_eq!(beyond, 7);
                // The 6,993rd smallest, to the histogram's 3 significant digits.
                assert!(value_ns.abs_diff(6_993) <= 7, "{value_ns}");
            }
            other => panic!("{other:?}"),
        }
        match percentile_reading(&r, 99.99) {
            PercentileReading::Max { value_ns } => assert!(value_ns.abs_diff(7_000) <= 7),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            percentile_reading(&RttRecorder::new(0), 50.0),
            PercentileReading::Empty
        );
    }

    #[test]
    fn samples_beyond_is_nearest_rank() {
        assert_eq!(samples_beyond(99.9, 7_000), 7);
        assert_eq!(samples_beyond(99.99, 7_000), 0);
        assert_eq!(samples_beyond(99.99, 100_000), 10);
        assert_eq!(samples_beyond(50.0, 1), 0);
        assert_eq!(samples_beyond(99.0, 0), 0);
    }

    #[test]
    fn duration_needed_scales_with_the_sample_rate() {
        // 7,000 samples in 10 s: p99.99 needs 100,000, i.e. 142.857... s, rounded up to the ns.
        assert_eq!(
            duration_needed_ns(99.99, 7_000, 10_000_000_000),
            Some(142_857_142_858)
        );
        assert_eq!(
            duration_needed_ns(99.0, 7_000, 10_000_000_000),
            Some(1_428_571_429)
        );
        assert_eq!(duration_needed_ns(99.99, 0, 10), None);
        assert_eq!(duration_needed_ns(100.0, 10, 10), None);
    }
}
