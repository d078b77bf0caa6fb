//! The clock offset between a client and an agent, estimated NTP-style (RFC 5905, section 8)
//! from timestamp exchanges over the control channel, and one-way delays converted with it.
//!
//! One [`Exchange`] is four timestamps, each on its own host's monotonic clock: the client sends
//! at `t1`, the agent receives at `t2` and replies at `t3`, the client receives at `t4`. Then
//!
//! * the offset (agent clock minus client clock) is `θ = ((t2 − t1) + (t3 − t4)) / 2`, and
//! * the round-trip delay, the agent's hold time left out, is `δ = (t4 − t1) − (t3 − t2)`.
//!
//! `θ` is exact when the two directions take equally long. When they do not, its error is half
//! the difference of the two one-way delays, and since neither is negative that is at most
//! `δ / 2`: an exchange bounds the offset to `θ ± δ/2`, and the exchanges with the smallest `δ`
//! bound it best. So [`OffsetEstimator`] keeps, for each window of time, only the exchange with
//! the smallest delay, leaves out windows whose best delay is far above the test's best (a
//! queue was in the way), and fits offset and drift (a straight line in time) through the rest
//! by least squares, so the estimate follows two clocks that run at different rates.
//!
//! The uncertainty a [`ClockFit`] states is honest rather than statistical:
//!
//! * the fitted offset at any time is a weighted sum `Σ cᵢ θᵢ` of the exchanges used, so if each
//!   `θᵢ` is off by at most `δᵢ/2`, the fit is off by at most `Σ |cᵢ| δᵢ/2`. That covers any
//!   asymmetry of the path, in the middle of the test and (growing) outside it;
//! * plus the largest fit residual, in case the drift was not constant (an NTP daemon slewing
//!   one clock mid-test);
//! * plus, when the exchanges cannot show a drift (one exchange, or all at one instant),
//!   [`UNKNOWN_DRIFT_PPM`] times the distance in time from them.
//!
//! Times are nanoseconds; the time axis of a fit is the client's clock.
//!
//! ```
//! use std::time::Duration;
//! use sonde_engine::offset::{Exchange, OffsetEstimator};
//!
//! // The agent's clock reads 5 s more than the client's; 40 µs each way, 10 µs in the agent.
//! let mut est = OffsetEstimator::new(Duration::from_secs(1));
//! for i in 0..20u64 {
//!     let t1 = i * 500_000_000;
//!     est.add(Exchange {
//!         client_send_ns: t1,
//!         agent_receive_ns: t1 + 40_000 + 5_000_000_000,
//!         agent_send_ns: t1 + 50_000 + 5_000_000_000,
//!         client_receive_ns: t1 + 90_000,
//!     });
//! }
//! let fit = est.fit().unwrap();
//! let at = fit.offset_at(3_000_000_000);
//! assert_eq!(at.offset_ns, 5_000_000_000);
//! assert!(at.uncertainty_ns >= 40_000); // half the 80 µs round trip, at least
//!
//! // A datagram sent by the client at 4 s that the agent stamped 5 s + 4 s + 70 µs:
//! let d = fit.forward_delay(4_000_000_000, 9_000_070_000);
//! assert_eq!(d.delay_ns, 70_000);
//! ```

use std::time::Duration;

/// Windows whose best round trip is within `2 × best + SLACK_NS` of the test's best are used.
/// An idle host's scheduling jitter is some microseconds, so a window that close to the best is
/// as clean an exchange as the best one; one further off met a queue.
const SLACK_NS: u64 = 20_000;

/// The most windows an estimator keeps. When a long test would pass it, neighbouring windows are
/// merged (the window doubles), so memory stays bounded for any test length.
pub const MAX_WINDOWS: usize = 4_096;

/// The drift assumed, in parts per million, when the exchanges cannot show one: Linux's clock
/// discipline never corrects a clock by more than 500 ppm (`adjtimex`, `MAXFREQ`), so two
/// disciplined clocks drift apart by no more than about that.
pub const UNKNOWN_DRIFT_PPM: f64 = 500.0;

/// The four timestamps of one exchange, each on its own host's monotonic clock, ns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exchange {
    /// `t1`: the client sent the request (client clock).
    pub client_send_ns: u64,
    /// `t2`: the agent received it (agent clock).
    pub agent_receive_ns: u64,
    /// `t3`: the agent sent the reply (agent clock).
    pub agent_send_ns: u64,
    /// `t4`: the client received the reply (client clock).
    pub client_receive_ns: u64,
}

impl Exchange {
    /// The round-trip delay without the agent's hold time, `(t4 − t1) − (t3 − t2)`, ns. `None`
    /// when the timestamps contradict each other (a reply before its request, a hold longer
    /// than the round trip): such an exchange says nothing about the offset.
    pub fn delay_ns(&self) -> Option<u64> {
        let round_trip = self.client_receive_ns.checked_sub(self.client_send_ns)?;
        let hold = self.agent_send_ns.checked_sub(self.agent_receive_ns)?;
        round_trip.checked_sub(hold)
    }

    /// `2θ`, twice the offset (agent minus client), exact in integers.
    fn two_theta(&self) -> i128 {
        (i128::from(self.agent_receive_ns) - i128::from(self.client_send_ns))
            + (i128::from(self.agent_send_ns) - i128::from(self.client_receive_ns))
    }

    /// The middle of the exchange on the client's clock: where its offset applies.
    fn client_mid_ns(&self) -> u64 {
        self.client_send_ns + (self.client_receive_ns - self.client_send_ns) / 2
    }
}

/// The best exchange of one window.
#[derive(Debug, Clone, Copy)]
struct Point {
    window: u64,
    x_ns: u64,
    two_theta: i128,
    delay_ns: u64,
}

/// Collects exchanges over a test and fits the offset and drift of the agent's clock.
#[derive(Debug, Clone)]
pub struct OffsetEstimator {
    window_ns: u64,
    /// Sorted by window (and so by time).
    points: Vec<Point>,
    seen: u64,
    rejected: u64,
}

impl OffsetEstimator {
    /// An estimator that keeps the best exchange of every `window` of the client's clock.
    ///
    /// A window of about a second, with several exchanges in each, gives each window a good
    /// chance of one clean round trip and still follows drift; a zero window counts as 1 ns.
    pub fn new(window: Duration) -> Self {
        Self {
            window_ns: u64::try_from(window.as_nanos()).unwrap_or(u64::MAX).max(1),
            points: Vec::new(),
            seen: 0,
            rejected: 0,
        }
    }

    /// Takes one exchange. Returns false (and counts it) when its timestamps contradict each
    /// other or put the clocks more than 292 years apart.
    pub fn add(&mut self, exchange: Exchange) -> bool {
        self.seen += 1;
        let offset_fits = i64::try_from(exchange.two_theta() / 2).is_ok();
        let Some(delay_ns) = exchange.delay_ns().filter(|_| offset_fits) else {
            self.rejected += 1;
            return false;
        };
        let x_ns = exchange.client_mid_ns();
        let point = Point {
            window: x_ns / self.window_ns,
            x_ns,
            two_theta: exchange.two_theta(),
            delay_ns,
        };
        match self
            .points
            .binary_search_by_key(&point.window, |p| p.window)
        {
            Ok(i) => {
                if delay_ns < self.points[i].delay_ns {
                    self.points[i] = point;
                }
            }
            Err(i) => {
                self.points.insert(i, point);
                if self.points.len() > MAX_WINDOWS {
                    self.coarsen();
                }
            }
        }
        true
    }

    /// Exchanges offered to [`OffsetEstimator::add`].
    pub fn exchanges_seen(&self) -> u64 {
        self.seen
    }

    /// Exchanges refused because their timestamps contradicted each other.
    pub fn exchanges_rejected(&self) -> u64 {
        self.rejected
    }

    /// The current window width (it doubles when a long test fills [`MAX_WINDOWS`]).
    pub fn window(&self) -> Duration {
        Duration::from_nanos(self.window_ns)
    }

    /// Fits offset and drift through the best exchanges; `None` before any usable exchange.
    pub fn fit(&self) -> Option<ClockFit> {
        let best = self.points.iter().map(|p| p.delay_ns).min()?;
        let threshold = best.saturating_mul(2).saturating_add(SLACK_NS);
        let used: Vec<&Point> = self
            .points
            .iter()
            .filter(|p| p.delay_ns <= threshold)
            .collect();
        let first = used[0];
        let x_ref = first.x_ns;
        // Offsets relative to the first one used, so the floats stay small and exact.
        let theta_ref = i64::try_from(first.two_theta.div_euclid(2)).ok()?;
        let xs: Vec<f64> = used.iter().map(|p| diff_ns(p.x_ns, x_ref)).collect();
        let ys: Vec<f64> = used
            .iter()
            .map(|p| (p.two_theta - 2 * i128::from(theta_ref)) as f64 / 2.0)
            .collect();
        let n = used.len() as f64;
        let x_mean = xs.iter().sum::<f64>() / n;
        let y_mean = ys.iter().sum::<f64>() / n;
        let sxx: f64 = xs.iter().map(|x| (x - x_mean).powi(2)).sum();
        let sxy: f64 = xs
            .iter()
            .zip(&ys)
            .map(|(x, y)| (x - x_mean) * (y - y_mean))
            .sum();
        // A spread of under a nanosecond cannot show a drift (one exchange, or one instant).
        let drift_known = sxx >= 1.0;
        let slope = if drift_known { sxy / sxx } else { 0.0 };
        let max_residual_ns = xs
            .iter()
            .zip(&ys)
            .map(|(x, y)| (y - (y_mean + slope * (x - x_mean))).abs())
            .fold(0.0, f64::max);
        Some(ClockFit {
            x_ref,
            theta_ref,
            x_mean,
            y_mean,
            slope,
            sxx,
            drift_known,
            max_residual_ns,
            used: xs
                .into_iter()
                .zip(used.iter().map(|p| p.delay_ns as f64 / 2.0))
                .collect(),
            best_delay_ns: best,
        })
    }

    /// Doubles the window and keeps the best exchange of each merged pair.
    fn coarsen(&mut self) {
        self.window_ns = self.window_ns.saturating_mul(2);
        for p in &mut self.points {
            p.window = p.x_ns / self.window_ns;
        }
        // `dedup_by` hands (later, earlier) and drops the later one when it returns true.
        self.points.dedup_by(|later, earlier| {
            if later.window != earlier.window {
                return false;
            }
            if later.delay_ns < earlier.delay_ns {
                *earlier = *later;
            }
            true
        });
    }
}

/// `a − b` in ns as a float, for times on one clock.
fn diff_ns(a: u64, b: u64) -> f64 {
    (i128::from(a) - i128::from(b)) as f64
}

/// The agent clock's offset and drift against the client's, as fitted over a test.
#[derive(Debug, Clone)]
pub struct ClockFit {
    /// Client time the fit is relative to.
    x_ref: u64,
    /// Offset the fit is relative to, ns.
    theta_ref: i64,
    x_mean: f64,
    y_mean: f64,
    /// Drift, ns of offset per ns of client time.
    slope: f64,
    sxx: f64,
    drift_known: bool,
    max_residual_ns: f64,
    /// `(x, δ/2)` of each exchange used, x relative to `x_ref`.
    used: Vec<(f64, f64)>,
    best_delay_ns: u64,
}

/// The offset of the agent's clock at one moment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OffsetEstimate {
    /// Agent clock minus client clock, ns (rounded).
    pub offset_ns: i64,
    /// The true offset is within `offset_ns ± uncertainty_ns` (rounded up).
    pub uncertainty_ns: u64,
}

/// A one-way delay converted across the two clocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DelayEstimate {
    /// The delay, ns on the client's clock. Negative only when the path is asymmetric enough
    /// that the offset's uncertainty exceeds the delay; then `uncertainty_ns` says so.
    pub delay_ns: i64,
    /// The true delay is within `delay_ns ± uncertainty_ns`: the offset's uncertainty.
    pub uncertainty_ns: u64,
}

impl ClockFit {
    /// The fitted drift of the agent's clock against the client's, parts per million (positive
    /// when the agent's clock runs fast). 0 when the exchanges could not show a drift.
    pub fn drift_ppm(&self) -> f64 {
        self.slope * 1e6
    }

    /// How many windows' exchanges the fit used.
    pub fn exchanges_used(&self) -> usize {
        self.used.len()
    }

    /// The smallest round-trip delay of any exchange, ns: the best the offset can be known.
    pub fn best_delay_ns(&self) -> u64 {
        self.best_delay_ns
    }

    /// The offset at `client_ns` on the client's clock, with its uncertainty.
    pub fn offset_at(&self, client_ns: u64) -> OffsetEstimate {
        let (rel, uncertainty) = self.relative_at(diff_ns(client_ns, self.x_ref));
        OffsetEstimate {
            offset_ns: to_i64(i128::from(self.theta_ref) + rel.round() as i128),
            uncertainty_ns: ceil_u64(uncertainty),
        }
    }

    /// The delay of a message the client sent at `client_send_ns` (client clock) and the agent
    /// received at `agent_receive_ns` (agent clock).
    pub fn forward_delay(&self, client_send_ns: u64, agent_receive_ns: u64) -> DelayEstimate {
        // The offset that applies is the one at the moment of receipt; its client time is
        // found from the offset at the send, which is off by drift × delay, nanoseconds at most.
        let guess = self.relative_at(diff_ns(client_send_ns, self.x_ref)).0;
        let receipt = diff_ns(agent_receive_ns, self.x_ref) - self.theta_ref as f64 - guess;
        let (rel, uncertainty) = self.relative_at(receipt);
        let raw = i128::from(agent_receive_ns) - i128::from(client_send_ns);
        DelayEstimate {
            delay_ns: to_i64(raw - i128::from(self.theta_ref) - rel.round() as i128),
            uncertainty_ns: ceil_u64(uncertainty),
        }
    }

    /// The delay of a message the agent sent at `agent_send_ns` (agent clock) and the client
    /// received at `client_receive_ns` (client clock).
    pub fn reverse_delay(&self, agent_send_ns: u64, client_receive_ns: u64) -> DelayEstimate {
        let guess = self.relative_at(diff_ns(client_receive_ns, self.x_ref)).0;
        let sent = diff_ns(agent_send_ns, self.x_ref) - self.theta_ref as f64 - guess;
        let (rel, uncertainty) = self.relative_at(sent);
        let raw = i128::from(client_receive_ns) - i128::from(agent_send_ns);
        DelayEstimate {
            delay_ns: to_i64(raw + i128::from(self.theta_ref) + rel.round() as i128),
            uncertainty_ns: ceil_u64(uncertainty),
        }
    }

    /// The offset relative to `theta_ref` at `x` (relative to `x_ref`), and its uncertainty.
    fn relative_at(&self, x: f64) -> (f64, f64) {
        let n = self.used.len() as f64;
        let from_mean = x - self.x_mean;
        let offset = self.y_mean + self.slope * from_mean;
        // The least-squares value at x is Σ cᵢ yᵢ with these cᵢ; each yᵢ is off by at most its
        // half delay, so the value is off by at most Σ |cᵢ| δᵢ/2.
        let asymmetry: f64 = self
            .used
            .iter()
            .map(|&(xi, half_delay)| {
                let leverage = if self.drift_known {
                    from_mean * (xi - self.x_mean) / self.sxx
                } else {
                    0.0
                };
                (1.0 / n + leverage).abs() * half_delay
            })
            .sum();
        let unknown_drift = if self.drift_known {
            0.0
        } else {
            from_mean.abs() * UNKNOWN_DRIFT_PPM / 1e6
        };
        (offset, asymmetry + self.max_residual_ns + unknown_drift)
    }
}

fn to_i64(v: i128) -> i64 {
    i64::try_from(v).unwrap_or(if v < 0 { i64::MIN } else { i64::MAX })
}

/// Rounds a non-negative float up; the cast saturates (and NaN, which cannot occur, gives 0).
fn ceil_u64(v: f64) -> u64 {
    v.ceil() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A virtual pair of clocks: the client's reads true time, the agent's reads
    /// `offset + true time × (1 + drift)`.
    #[derive(Clone, Copy)]
    struct Clocks {
        /// Client clock at true time 0.
        client_origin_ns: u64,
        /// Agent clock at true time 0.
        agent_origin_ns: u64,
        drift_ppm: f64,
    }

    impl Clocks {
        fn client(&self, t_ns: u64) -> u64 {
            self.client_origin_ns + t_ns
        }
        fn agent(&self, t_ns: u64) -> u64 {
            self.agent_origin_ns + (t_ns as f64 * (1.0 + self.drift_ppm * 1e-6)).round() as u64
        }
        /// The true offset (agent minus client) at true time `t_ns`.
        fn offset(&self, t_ns: u64) -> i64 {
            self.agent(t_ns) as i64 - self.client(t_ns) as i64
        }
        /// An exchange starting at true time `t`, `fwd` out, `hold` in the agent, `rev` back.
        fn exchange(&self, t: u64, fwd: u64, hold: u64, rev: u64) -> Exchange {
            Exchange {
                client_send_ns: self.client(t),
                agent_receive_ns: self.agent(t + fwd),
                agent_send_ns: self.agent(t + fwd + hold),
                client_receive_ns: self.client(t + fwd + hold + rev),
            }
        }
    }

    /// A small deterministic generator (xorshift64*), so noisy tests are repeatable.
    struct Rng(u64);
    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
        }
    }

    const SECOND: u64 = 1_000_000_000;

    /// Asserts that the estimate at true time `t` is within its stated uncertainty of the truth.
    fn assert_honest(fit: &ClockFit, clocks: &Clocks, t: u64) -> OffsetEstimate {
        let est = fit.offset_at(clocks.client(t));
        let error = (est.offset_ns - clocks.offset(t)).unsigned_abs();
        assert!(
            error <= est.uncertainty_ns,
            "at {t} ns: error {error} ns > uncertainty {} ns",
            est.uncertainty_ns
        );
        est
    }

    #[test]
    fn a_constant_offset_is_found_exactly_with_symmetric_delays() {
        // The agent booted long after the client: its clock reads far less (negative offset).
        let clocks = Clocks {
            client_origin_ns: 3_000_000 * SECOND,
            agent_origin_ns: 7 * SECOND,
            drift_ppm: 0.0,
        };
        let mut est = OffsetEstimator::new(Duration::from_secs(1));
        for i in 0..100 {
            assert!(est.add(clocks.exchange(i * SECOND / 10, 60_000, 15_000, 60_000)));
        }
        let fit = est.fit().unwrap();
        assert_eq!(fit.exchanges_used(), 10);
        assert_eq!(fit.best_delay_ns(), 120_000);
        assert_eq!(fit.drift_ppm(), 0.0);
        let truth = 7 * SECOND as i64 - 3_000_000 * SECOND as i64;
        for t in [0, 5 * SECOND, 10 * SECOND] {
            let at = assert_honest(&fit, &clocks, t);
            assert_eq!(at.offset_ns, truth);
            // Half the 120 µs round trip, and more towards the ends, where an error in the
            // drift adds up; never double.
            assert!((60_000..120_000).contains(&at.uncertainty_ns), "{at:?}");
        }
        // In the middle of the exchanges (4.5 s, plus half a round trip) the bound is exactly
        // half the round trip (the float sum may round up by 1 ns).
        let mid = fit.offset_at(clocks.client(4_500_067_500));
        assert_eq!(mid.offset_ns, truth);
        assert!((60_000..=60_001).contains(&mid.uncertainty_ns), "{mid:?}");
    }

    #[test]
    fn a_50_ppm_drift_is_followed() {
        let clocks = Clocks {
            client_origin_ns: 1_000 * SECOND,
            agent_origin_ns: 50_000 * SECOND,
            drift_ppm: 50.0,
        };
        let mut est = OffsetEstimator::new(Duration::from_secs(1));
        for i in 0..1_000 {
            est.add(clocks.exchange(i * SECOND / 10, 40_000, 5_000, 40_000));
        }
        let fit = est.fit().unwrap();
        assert!((fit.drift_ppm() - 50.0).abs() < 0.01, "{}", fit.drift_ppm());
        // Over 100 s the offset moves by 5 ms; the fit tracks it to well under a microsecond.
        for t in [0, 10 * SECOND, 50 * SECOND, 99 * SECOND] {
            let at = assert_honest(&fit, &clocks, t);
            assert!((at.offset_ns - clocks.offset(t)).abs() < 100, "at {t}");
        }
        // A constant-offset model would have been 2.5 ms off at the ends; this one is not.
        let spread = fit.offset_at(clocks.client(99 * SECOND)).offset_ns
            - fit.offset_at(clocks.client(0)).offset_ns;
        assert!((spread - 4_950_000).abs() < 1_000, "{spread}");
    }

    #[test]
    fn an_asymmetric_path_stays_within_the_stated_uncertainty() {
        let clocks = Clocks {
            client_origin_ns: 0,
            agent_origin_ns: 123_456_789,
            drift_ppm: -20.0,
        };
        // 300 µs out, 50 µs back: θ is 125 µs off, which no timestamp can reveal.
        let mut est = OffsetEstimator::new(Duration::from_secs(1));
        for i in 0..300 {
            est.add(clocks.exchange(i * SECOND / 10, 300_000, 10_000, 50_000));
        }
        let fit = est.fit().unwrap();
        for t in [0, 15 * SECOND, 29 * SECOND] {
            let at = assert_honest(&fit, &clocks, t);
            let error = (at.offset_ns - clocks.offset(t)).unsigned_abs();
            assert!(error > 120_000, "the asymmetry shows as error: {error}");
            assert!(at.uncertainty_ns < 2 * 175_000, "{}", at.uncertainty_ns);
        }
        // The one-way delays it converts carry that same honesty.
        let t = 12 * SECOND;
        let fwd = fit.forward_delay(clocks.client(t), clocks.agent(t + 300_000));
        assert!(
            fwd.delay_ns.abs_diff(300_000) <= fwd.uncertainty_ns,
            "{fwd:?}"
        );
        let rev = fit.reverse_delay(clocks.agent(t), clocks.client(t + 50_000));
        assert!(
            rev.delay_ns.abs_diff(50_000) <= rev.uncertainty_ns,
            "{rev:?}"
        );
        // Forward plus reverse is the measured round trip, whatever the offset.
        assert!((fwd.delay_ns + rev.delay_ns - 350_000).abs() <= 20);
    }

    #[test]
    fn noisy_delays_and_outliers_are_filtered() {
        let clocks = Clocks {
            client_origin_ns: 77 * SECOND,
            agent_origin_ns: 5 * SECOND,
            drift_ppm: 50.0,
        };
        let mut rng = Rng(0x5eed);
        let mut est = OffsetEstimator::new(Duration::from_secs(1));
        for i in 0..600 {
            let mut fwd = 80_000 + rng.below(60_000);
            let mut rev = 80_000 + rng.below(60_000);
            // One in five meets a 5–25 ms queue in one direction; now and then a whole window
            // does (an interval of bulk load).
            if i % 5 == 3 || (200..210).contains(&i) {
                if rng.below(2) == 0 {
                    fwd += 5_000_000 + rng.below(20_000_000);
                } else {
                    rev += 5_000_000 + rng.below(20_000_000);
                }
            }
            est.add(clocks.exchange(i * SECOND / 10, fwd, 20_000, rev));
        }
        let fit = est.fit().unwrap();
        // The loaded window was left out; the others were used.
        assert!(fit.exchanges_used() < 60 && fit.exchanges_used() >= 50);
        assert!((fit.drift_ppm() - 50.0).abs() < 1.0, "{}", fit.drift_ppm());
        for i in 0..60 {
            let at = assert_honest(&fit, &clocks, i * SECOND);
            // Outliers did not inflate the bound: it stays near the clean round trips.
            assert!(at.uncertainty_ns < 250_000, "{}", at.uncertainty_ns);
        }
        // Outside the test the bound grows with the distance, as the drift's error does.
        let inside = fit.offset_at(clocks.client(30 * SECOND)).uncertainty_ns;
        let outside = assert_honest(&fit, &clocks, 600 * SECOND).uncertainty_ns;
        assert!(outside > inside);
    }

    #[test]
    fn one_exchange_gives_an_offset_whose_bound_grows_with_unknown_drift() {
        let clocks = Clocks {
            client_origin_ns: 0,
            agent_origin_ns: 1_000_000,
            drift_ppm: 0.0,
        };
        let mut est = OffsetEstimator::new(Duration::from_secs(1));
        est.add(clocks.exchange(SECOND, 25_000, 0, 25_000));
        let fit = est.fit().unwrap();
        assert_eq!(fit.drift_ppm(), 0.0);
        let near = fit.offset_at(clocks.client(SECOND + 25_000));
        assert_eq!(near.offset_ns, 1_000_000);
        assert_eq!(near.uncertainty_ns, 25_000);
        // 10 s away, 500 ppm of unknown drift adds 5 ms.
        let far = fit.offset_at(clocks.client(11 * SECOND + 25_000));
        assert_eq!(far.uncertainty_ns, 25_000 + 5_000_000);
    }

    #[test]
    fn contradictory_exchanges_are_rejected_and_counted() {
        let mut est = OffsetEstimator::new(Duration::from_secs(1));
        let ok = Exchange {
            client_send_ns: 100,
            agent_receive_ns: 1_000,
            agent_send_ns: 1_010,
            client_receive_ns: 200,
        };
        assert_eq!(ok.delay_ns(), Some(90));
        let reply_first = Exchange {
            client_receive_ns: 50,
            ..ok
        };
        let sent_before_received = Exchange {
            agent_send_ns: 900,
            ..ok
        };
        let hold_too_long = Exchange {
            agent_send_ns: 1_200,
            ..ok
        };
        for bad in [reply_first, sent_before_received, hold_too_long] {
            assert_eq!(bad.delay_ns(), None);
            assert!(!est.add(bad));
        }
        assert!(est.fit().is_none());
        assert!(est.add(ok));
        assert_eq!((est.exchanges_seen(), est.exchanges_rejected()), (4, 3));
        assert_eq!(est.fit().unwrap().offset_at(150).offset_ns, 855);
    }

    #[test]
    fn the_best_exchange_of_each_window_is_kept_whatever_the_order() {
        let clocks = Clocks {
            client_origin_ns: 0,
            agent_origin_ns: 9 * SECOND,
            drift_ppm: 0.0,
        };
        let mut est = OffsetEstimator::new(Duration::from_secs(1));
        // Arriving late and out of order, the clean exchange of window 0 still wins.
        est.add(clocks.exchange(SECOND + 100, 2_000_000, 0, 10_000));
        est.add(clocks.exchange(100, 3_000_000, 0, 10_000));
        est.add(clocks.exchange(200, 10_000, 0, 10_000));
        est.add(clocks.exchange(SECOND + 200, 10_000, 0, 10_000));
        let fit = est.fit().unwrap();
        assert_eq!(fit.exchanges_used(), 2);
        assert_eq!(fit.offset_at(SECOND / 2).offset_ns, 9 * SECOND as i64);
        let mid = fit.offset_at(SECOND / 2 + 10_200);
        assert!((10_000..=10_001).contains(&mid.uncertainty_ns), "{mid:?}");
    }

    #[test]
    fn a_long_test_merges_windows_and_stays_bounded() {
        let clocks = Clocks {
            client_origin_ns: SECOND,
            agent_origin_ns: 2 * SECOND,
            drift_ppm: 10.0,
        };
        let mut est = OffsetEstimator::new(Duration::from_millis(10));
        for i in 0..3 * MAX_WINDOWS as u64 {
            est.add(clocks.exchange(i * SECOND / 100, 30_000, 0, 30_000));
        }
        assert!(est.window() >= Duration::from_millis(40));
        let fit = est.fit().unwrap();
        assert!(fit.exchanges_used() <= MAX_WINDOWS);
        assert!((fit.drift_ppm() - 10.0).abs() < 0.01);
        assert_honest(&fit, &clocks, 100 * SECOND);
    }
}
