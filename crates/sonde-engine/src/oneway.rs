//! One-way delays from four-timestamp probes (`sonde latency --one-way`).
//!
//! Each probe the agent stamps is an [`Exchange`]: the client sent at `t1` and received the reply
//! at `t4` (client clock), the agent received at `t2` and replied at `t3` (agent clock). With the
//! agent clock's offset `θ` (agent minus client) the delays are
//!
//! * forward (client → agent): `(t2 − t1) − θ`,
//! * return (agent → client): `(t4 − t3) + θ`,
//! * and the agent's hold time `t3 − t2` is neither,
//!
//! so forward + return + hold is the RTT, whatever `θ` is: only the split depends on it.
//!
//! The loop cannot wait for the final estimate of `θ` (that would mean keeping every sample), so
//! it converts each probe with the best model it has at the time, a [`LinearOffset`] fitted by
//! [`crate::offset`] from the exchanges so far, and records the delays into signed HDR
//! histograms ([`SignedRecorder`]: a delay is negative when the clock estimate is off by more
//! than the delay). [`OneWayRecorder::finish`] then states how far off any recorded value can be:
//! the final fit's own uncertainty over the span of the samples, plus how far each provisional
//! model strayed from the final fit while it was in use ([`OneWaySummary::model_error_ns`]), plus
//! what the drift can move in half a round trip. Each recorded delay is within that of the
//! truth, and so is each percentile.
//!
//! ```
//! use sonde_engine::offset::Exchange;
//! use sonde_engine::oneway::{LinearOffset, OneWayRecorder};
//!
//! // The agent's clock reads 1 s more than the client's; 30 µs out, 10 µs back, 2 µs held.
//! let mut rec = OneWayRecorder::new(0);
//! rec.set_model(LinearOffset { at_ns: 0, offset_ns: 1_000_000_000, drift: 0.0 });
//! let t1 = 5_000_000;
//! rec.record(t1, &Exchange {
//!     client_send_ns: t1,
//!     agent_receive_ns: t1 + 30_000 + 1_000_000_000,
//!     agent_send_ns: t1 + 32_000 + 1_000_000_000,
//!     client_receive_ns: t1 + 42_000,
//! });
//! assert_eq!(rec.samples(), 1);
//! // To the histograms' 3 significant digits.
//! let fwd = rec.forward().summary().min_ns;
//! let back = rec.backward().summary().min_ns;
//! assert!(fwd.abs_diff(30_000) <= 30 && back.abs_diff(10_000) <= 10, "{fwd} {back}");
//! ```

use hdrhistogram::Histogram;

use crate::offset::{ClockFit, Exchange};
use crate::rtt::{
    percentile_supported, quantile, RttRecorder, RttSummary, MAX_TRACKABLE_NS, REPORTED_PERCENTILES,
};

/// The most provisional models a run keeps track of (a new one every 100 ms is 400 s of test);
/// past that the last one stays in use, so memory stays bounded and the loop never allocates.
pub const MAX_EPOCHS: usize = 4_096;

/// The agent clock's offset as a straight line in the client's time: `offset_ns` at `at_ns`,
/// moving by `drift` ns per ns.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinearOffset {
    /// Client time the line is anchored at, ns.
    pub at_ns: u64,
    /// Offset (agent minus client) at `at_ns`, ns.
    pub offset_ns: i64,
    /// Slope: ns of offset per ns of client time (1 ppm is 1e-6).
    pub drift: f64,
}

impl LinearOffset {
    /// The fit's line, anchored at `at_ns`.
    pub fn from_fit(fit: &ClockFit, at_ns: u64) -> Self {
        Self {
            at_ns,
            offset_ns: fit.offset_at(at_ns).offset_ns,
            drift: fit.drift_ppm() / 1e6,
        }
    }

    /// The offset at client time `x`, ns.
    pub fn offset_at(&self, x: u64) -> i64 {
        let dx = (i128::from(x) - i128::from(self.at_ns)) as f64;
        let v = i128::from(self.offset_ns) + (self.drift * dx).round() as i128;
        i64::try_from(v).unwrap_or(if v < 0 { i64::MIN } else { i64::MAX })
    }
}

/// Signed nanosecond values in two HDR histograms (3 significant digits): one for values at or
/// above zero, one for the magnitudes of negative ones.
#[derive(Debug, Clone)]
pub struct SignedRecorder {
    pos: Histogram<u64>,
    neg: Histogram<u64>,
}

impl Default for SignedRecorder {
    fn default() -> Self {
        Self::new()
    }
}

/// The summary of a [`SignedRecorder`], with the percentiles of [`REPORTED_PERCENTILES`] that the
/// sample count supports (`None` for the others, as for RTTs).
#[derive(Debug, Clone, PartialEq)]
pub struct SignedSummary {
    /// Values recorded.
    pub samples: u64,
    /// Smallest (0 with no samples).
    pub min_ns: i64,
    /// Largest.
    pub max_ns: i64,
    /// Mean.
    pub mean_ns: f64,
    /// Standard deviation.
    pub stddev_ns: f64,
    /// `(pct, value)` for each of [`REPORTED_PERCENTILES`].
    pub percentiles: Vec<(f64, Option<i64>)>,
}

impl SignedRecorder {
    /// An empty recorder (its histograms are allocated here, not while recording).
    pub fn new() -> Self {
        let hist = || {
            // Constant bounds that hdrhistogram accepts, as RttRecorder's.
            Histogram::new_with_bounds(1, MAX_TRACKABLE_NS, 3)
                .expect("constant histogram bounds are valid")
        };
        Self {
            pos: hist(),
            neg: hist(),
        }
    }

    /// Records `v`; a magnitude beyond an hour is recorded as an hour.
    pub fn record(&mut self, v: i64) {
        if v >= 0 {
            self.pos.saturating_record(v.unsigned_abs());
        } else {
            self.neg.saturating_record(v.unsigned_abs());
        }
    }

    /// Values recorded.
    pub fn samples(&self) -> u64 {
        self.pos.len() + self.neg.len()
    }

    /// The `rank`-th smallest value (1-based, at most [`SignedRecorder::samples`]), to the
    /// histograms' precision, rounded towards +∞ on either side of zero.
    fn at_rank(&self, rank: u64) -> i64 {
        let n_neg = self.neg.len();
        let to_i64 = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        if rank <= n_neg {
            // The k-th smallest magnitude, counted from the most negative.
            let k = n_neg - rank + 1;
            let q = (k as f64 - 0.5) / n_neg as f64;
            -to_i64(self.neg.lowest_equivalent(self.neg.value_at_quantile(q)))
        } else {
            let k = rank - n_neg;
            let q = (k as f64 - 0.5) / self.pos.len() as f64;
            to_i64(self.pos.value_at_quantile(q))
        }
    }

    /// The nearest-rank `pct` percentile, whatever the sample count; `None` with no samples.
    pub fn value_at(&self, pct: f64) -> Option<i64> {
        let n = self.samples();
        if n == 0 {
            return None;
        }
        // `quantile` aims at the middle of the nearest rank: undo that to get the rank itself.
        let rank = (quantile(pct, n) * n as f64 + 0.5).round() as u64;
        Some(self.at_rank(rank.clamp(1, n)))
    }

    /// The summary.
    pub fn summary(&self) -> SignedSummary {
        let samples = self.samples();
        let percentiles = REPORTED_PERCENTILES
            .iter()
            .map(|&pct| {
                let v = percentile_supported(pct, samples)
                    .then(|| self.value_at(pct))
                    .flatten();
                (pct, v)
            })
            .collect();
        if samples == 0 {
            return SignedSummary {
                samples,
                min_ns: 0,
                max_ns: 0,
                mean_ns: 0.0,
                stddev_ns: 0.0,
                percentiles,
            };
        }
        // Mean and variance over both halves, from the buckets (as hdrhistogram does).
        let (mut sum, mut sum_sq) = (0f64, 0f64);
        for (h, sign) in [(&self.pos, 1.0), (&self.neg, -1.0)] {
            for v in h.iter_recorded() {
                let x = sign * h.median_equivalent(v.value_iterated_to()) as f64;
                let c = v.count_at_value() as f64;
                sum += x * c;
                sum_sq += x * x * c;
            }
        }
        let n = samples as f64;
        let mean = sum / n;
        let variance = (sum_sq / n - mean * mean).max(0.0);
        SignedSummary {
            samples,
            min_ns: self.at_rank(1),
            max_ns: self.at_rank(samples),
            mean_ns: mean,
            stddev_ns: variance.sqrt(),
            percentiles,
        }
    }
}

/// The span of client time over which one provisional model converted samples.
#[derive(Debug, Clone, Copy)]
struct Epoch {
    model: LinearOffset,
    /// First and last client time the model converted at; `None` before it converted any.
    span: Option<(u64, u64)>,
}

/// A run's one-way delays as the loop records them, converted with provisional models.
#[derive(Debug, Clone)]
pub struct OneWayRecorder {
    warmup_ns: u64,
    epochs: Vec<Epoch>,
    forward: SignedRecorder,
    backward: SignedRecorder,
    hold: RttRecorder,
    warmup_excluded: u64,
    /// Stamped replies that came before any model, or whose stamps contradicted each other.
    unconverted: u64,
    /// The longest round trip recorded (`t4 − t1`), ns.
    max_round_trip_ns: u64,
}

/// What [`OneWayRecorder::finish`] states.
#[derive(Debug, Clone, PartialEq)]
pub struct OneWaySummary {
    /// Client → agent.
    pub forward: SignedSummary,
    /// Agent → client.
    pub backward: SignedSummary,
    /// The agent's time between receiving a probe and sending its reply.
    pub hold: RttSummary,
    /// Every recorded delay, and so every percentile, is within this of the truth, ns: the sum
    /// of the next three and 1 ns of rounding.
    pub uncertainty_ns: u64,
    /// The final fit's uncertainty, the larger at the two ends of the samples' span, ns.
    pub fit_uncertainty_ns: u64,
    /// How far the provisional models the loop converted with strayed from the final fit, ns.
    pub model_error_ns: u64,
    /// What the fitted drift moves the offset in half the longest round trip (each probe is
    /// converted at the middle of its exchange), plus the caller's `extra_uncertainty_ns`.
    pub other_error_ns: u64,
}

impl OneWayRecorder {
    /// A recorder that leaves out probes sent in the first `warmup_ns` of the test (client test
    /// clock, as [`RttRecorder`]). Allocates everything it will use.
    pub fn new(warmup_ns: u64) -> Self {
        Self {
            warmup_ns,
            epochs: Vec::with_capacity(MAX_EPOCHS),
            forward: SignedRecorder::new(),
            backward: SignedRecorder::new(),
            hold: RttRecorder::new(0),
            warmup_excluded: 0,
            unconverted: 0,
            max_round_trip_ns: 0,
        }
    }

    /// Converts with `model` from now on. Past [`MAX_EPOCHS`] models the current one stays.
    pub fn set_model(&mut self, model: LinearOffset) {
        if self.epochs.len() < self.epochs.capacity() {
            self.epochs.push(Epoch { model, span: None });
        }
    }

    /// Whether a model has been set.
    pub fn has_model(&self) -> bool {
        !self.epochs.is_empty()
    }

    /// Records one stamped probe sent at `sent_at_ns` on the test clock (for the warm-up);
    /// the exchange's client times are on the client clock the models are fitted against.
    pub fn record(&mut self, sent_at_ns: u64, ex: &Exchange) {
        if sent_at_ns < self.warmup_ns {
            self.warmup_excluded += 1;
            return;
        }
        let (Some(epoch), Some(_)) = (self.epochs.last_mut(), ex.delay_ns()) else {
            self.unconverted += 1;
            return;
        };
        let x = ex.client_send_ns + (ex.client_receive_ns - ex.client_send_ns) / 2;
        epoch.span = Some(epoch.span.map_or((x, x), |(a, b)| (a.min(x), b.max(x))));
        let theta = i128::from(epoch.model.offset_at(x));
        let forward = i128::from(ex.agent_receive_ns) - i128::from(ex.client_send_ns) - theta;
        let backward = i128::from(ex.client_receive_ns) - i128::from(ex.agent_send_ns) + theta;
        let clamp = |v: i128| i64::try_from(v).unwrap_or(if v < 0 { i64::MIN } else { i64::MAX });
        self.forward.record(clamp(forward));
        self.backward.record(clamp(backward));
        self.hold.record(0, ex.agent_send_ns - ex.agent_receive_ns);
        self.max_round_trip_ns = self
            .max_round_trip_ns
            .max(ex.client_receive_ns - ex.client_send_ns);
    }

    /// Probes recorded (after the warm-up).
    pub fn samples(&self) -> u64 {
        self.forward.samples()
    }

    /// Probes left out as warm-up.
    pub fn warmup_excluded(&self) -> u64 {
        self.warmup_excluded
    }

    /// Stamped probes that could not be converted: before any model, or with contradictory
    /// timestamps.
    pub fn unconverted(&self) -> u64 {
        self.unconverted
    }

    /// The forward delays as recorded (provisional models).
    pub fn forward(&self) -> &SignedRecorder {
        &self.forward
    }

    /// The return delays as recorded.
    pub fn backward(&self) -> &SignedRecorder {
        &self.backward
    }

    /// The agent's hold times as recorded.
    pub fn hold(&self) -> &RttRecorder {
        &self.hold
    }

    /// The distributions and how far they can be off, given the final `fit` and an
    /// `extra_uncertainty_ns` the caller knows of (e.g. in mapping its clocks). `None` with no
    /// samples.
    pub fn finish(&self, fit: &ClockFit, extra_uncertainty_ns: u64) -> Option<OneWaySummary> {
        let spans: Vec<(LinearOffset, u64, u64)> = self
            .epochs
            .iter()
            .filter_map(|e| e.span.map(|(a, b)| (e.model, a, b)))
            .collect();
        let first = spans.iter().map(|s| s.1).min()?;
        let last = spans.iter().map(|s| s.2).max()?;
        let fit_uncertainty_ns = fit
            .offset_at(first)
            .uncertainty_ns
            .max(fit.offset_at(last).uncertainty_ns);
        // Both lines are straight: the widest gap over a span is at one of its ends.
        let model_error_ns = spans
            .iter()
            .flat_map(|&(m, a, b)| [(m, a), (m, b)])
            .map(|(m, x)| {
                let gap = i128::from(fit.offset_at(x).offset_ns) - i128::from(m.offset_at(x));
                u64::try_from(gap.unsigned_abs()).unwrap_or(u64::MAX)
            })
            .max()
            .unwrap_or(0);
        let drift = (fit.drift_ppm() / 1e6).abs();
        let half_trip = (drift * self.max_round_trip_ns as f64 / 2.0).ceil() as u64;
        let other_error_ns = half_trip.saturating_add(extra_uncertainty_ns);
        Some(OneWaySummary {
            forward: self.forward.summary(),
            backward: self.backward.summary(),
            hold: self.hold.summary(),
            uncertainty_ns: fit_uncertainty_ns
                .saturating_add(model_error_ns)
                .saturating_add(other_error_ns)
                .saturating_add(1),
            fit_uncertainty_ns,
            model_error_ns,
            other_error_ns,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::offset::OffsetEstimator;
    use std::time::Duration;

    const US: u64 = 1_000;
    const SECOND: u64 = 1_000_000_000;

    /// Two virtual clocks: the client's reads true time; the agent's `origin + t × (1 + drift)`.
    struct Clocks {
        agent_origin_ns: u64,
        drift_ppm: f64,
    }

    impl Clocks {
        fn agent(&self, t: u64) -> u64 {
            self.agent_origin_ns + (t as f64 * (1.0 + self.drift_ppm * 1e-6)).round() as u64
        }
        fn exchange(&self, t: u64, fwd: u64, hold: u64, back: u64) -> Exchange {
            Exchange {
                client_send_ns: t,
                agent_receive_ns: self.agent(t + fwd),
                agent_send_ns: self.agent(t + fwd + hold),
                client_receive_ns: t + fwd + hold + back,
            }
        }
    }

    #[test]
    fn signed_values_keep_their_order_and_sign() {
        let mut r = SignedRecorder::new();
        for v in -1_000..=1_000i64 {
            r.record(v);
        }
        let s = r.summary();
        assert_eq!(s.samples, 2_001);
        assert_eq!((s.min_ns, s.max_ns), (-1_000, 1_000));
        assert!(s.mean_ns.abs() < 1.0, "{}", s.mean_ns);
        // Uniform over -1000..=1000: sqrt((n^2 - 1) / 12).
        assert!((s.stddev_ns - 577.6).abs() < 2.0, "{}", s.stddev_ns);
        assert_eq!(r.value_at(50.0), Some(0));
        assert_eq!(r.value_at(10.0), Some(-800));
        assert_eq!(r.value_at(90.0), Some(800));
        assert_eq!(r.value_at(0.0), Some(-1_000));
        let p = |pct: f64| s.percentiles.iter().find(|p| p.0 == pct).unwrap().1;
        assert_eq!(p(50.0), Some(0));
        assert_eq!(p(99.0), Some(980));
        assert_eq!(p(99.9), None, "2,001 samples cannot support p99.9");
    }

    #[test]
    fn all_negative_and_empty_recorders_summarise() {
        let mut r = SignedRecorder::new();
        assert_eq!(r.value_at(50.0), None);
        assert_eq!(r.summary().samples, 0);
        for v in [-30, -20, -10] {
            r.record(v);
        }
        assert_eq!(r.value_at(0.0), Some(-30));
        assert_eq!(r.value_at(50.0), Some(-20));
        assert_eq!(r.value_at(100.0), Some(-10));
        assert!((r.summary().mean_ns + 20.0).abs() < 1e-9);
    }

    #[test]
    fn forward_plus_return_plus_hold_is_the_round_trip_whatever_the_model() {
        let clocks = Clocks {
            agent_origin_ns: 77 * SECOND,
            drift_ppm: 0.0,
        };
        // A model 40 µs off: the split moves by 40 µs, the sum does not.
        let mut rec = OneWayRecorder::new(0);
        rec.set_model(LinearOffset {
            at_ns: 0,
            offset_ns: 77 * SECOND as i64 + 40_000,
            drift: 0.0,
        });
        for i in 0..1_000 {
            rec.record(
                i * 1_000 * US,
                &clocks.exchange(i * 1_000 * US, 300 * US, 5 * US, 50 * US),
            );
        }
        // To the histograms' 3 significant digits.
        let close = |v: f64, expected: f64| (v - expected).abs() <= expected / 1_000.0;
        let f = rec.forward().summary();
        let b = rec.backward().summary();
        let hold = rec.hold().summary().mean_ns;
        assert!(close(f.mean_ns, 260_000.0), "{f:?}");
        assert!(close(b.mean_ns, 90_000.0), "{b:?}");
        assert!(close(f.mean_ns + b.mean_ns + hold, 355_000.0));
    }

    /// A test as the client runs it: exchanges every 100 ms, a model refitted after each, probes
    /// in between converted with the model of the moment; asymmetric probes (the path is not).
    fn run(clocks: &Clocks, seconds: u64, warmup_ns: u64) -> (OneWayRecorder, ClockFit) {
        let mut est = OffsetEstimator::new(Duration::from_secs(1));
        let mut rec = OneWayRecorder::new(warmup_ns);
        for tick in 0..seconds * 10 {
            let t = tick * SECOND / 10;
            est.add(clocks.exchange(t, 40 * US, 10 * US, 40 * US));
            rec.set_model(LinearOffset::from_fit(&est.fit().unwrap(), t));
            for k in 1..100 {
                let t1 = t + k * SECOND / 1_000;
                rec.record(t1, &clocks.exchange(t1, 700 * US, 3 * US, 100 * US));
            }
        }
        let fit = est.fit().unwrap();
        (rec, fit)
    }

    /// Every stated figure is within the stated uncertainty of the truth.
    fn assert_honest(s: &OneWaySummary, forward: i64, backward: i64) {
        assert!(s.uncertainty_ns > s.fit_uncertainty_ns + s.model_error_ns + s.other_error_ns);
        for (name, sum, truth) in [
            ("forward", &s.forward, forward),
            ("return", &s.backward, backward),
        ] {
            let stated = sum
                .percentiles
                .iter()
                .filter_map(|p| p.1)
                .chain([sum.min_ns, sum.max_ns]);
            for v in stated {
                assert!(v.abs_diff(truth) <= s.uncertainty_ns, "{name} {v}: {s:?}");
            }
        }
    }

    #[test]
    fn a_drifting_clock_is_followed_and_the_bound_holds() {
        let clocks = Clocks {
            agent_origin_ns: 3 * SECOND,
            drift_ppm: 80.0,
        };
        // No warm-up: the first second's models, fitted before the drift could show, strayed
        // (one exchange per 1 s window), and the bound says so.
        let (rec, fit) = run(&clocks, 20, 0);
        let s = rec.finish(&fit, 0).unwrap();
        assert_eq!(s.forward.samples, 20 * 10 * 99);
        assert_honest(&s, 700_000, 100_000);
        assert!(s.model_error_ns > 70 * US, "{s:?}");
        assert!((s.hold.mean_ns - 3_000.0).abs() < 10.0);
        // With sonde's default 1 s warm-up those models convert nothing that counts: the bound
        // stays near the clean exchanges' half round trip (40 µs), not the probes' asymmetry.
        let (rec, fit) = run(&clocks, 20, SECOND);
        let s = rec.finish(&fit, 0).unwrap();
        assert_eq!(s.forward.samples, 19 * 10 * 99);
        assert_honest(&s, 700_000, 100_000);
        assert!(s.model_error_ns < 10 * US, "{s:?}");
        assert!(s.uncertainty_ns < 100 * US, "{s:?}");
    }

    #[test]
    fn stamps_before_any_model_are_counted_not_recorded() {
        let clocks = Clocks {
            agent_origin_ns: 0,
            drift_ppm: 0.0,
        };
        let mut rec = OneWayRecorder::new(0);
        rec.record(5, &clocks.exchange(5, 10, 0, 10));
        let contradictory = Exchange {
            client_receive_ns: 0,
            ..clocks.exchange(5, 10, 0, 10)
        };
        rec.set_model(LinearOffset {
            at_ns: 0,
            offset_ns: 0,
            drift: 0.0,
        });
        rec.record(5, &contradictory);
        assert_eq!((rec.samples(), rec.unconverted()), (0, 2));
        let mut est = OffsetEstimator::new(Duration::from_secs(1));
        est.add(clocks.exchange(0, 10, 0, 10));
        assert!(rec.finish(&est.fit().unwrap(), 0).is_none());
    }

    #[test]
    fn models_past_the_cap_keep_the_last_one() {
        let mut rec = OneWayRecorder::new(0);
        for i in 0..MAX_EPOCHS as i64 + 10 {
            rec.set_model(LinearOffset {
                at_ns: 0,
                offset_ns: i,
                drift: 0.0,
            });
        }
        assert_eq!(rec.epochs.len(), MAX_EPOCHS);
        assert_eq!(rec.epochs.capacity(), MAX_EPOCHS, "never reallocated");
    }
}
