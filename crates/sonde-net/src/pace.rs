//! The one way sonde's paced loops wait for a scheduled time.
//!
//! The schedules themselves are [`sonde_engine::pace`]'s (sans-IO: they say when, never wait);
//! every loop that sends or reads on a schedule (the open-loop latency sender, the paced UDP and
//! TCP senders, the rate-capped TCP receiver) waits here, with one of two policies:
//!
//! * [`Pacing::SLEEP`]: sleep the whole wait, in slices of at most 50 ms so that a slow
//!   schedule still notices its stop flag; the caller reads the clock and calls again;
//! * [`Pacing::FINE`]: sleep through most of a long wait, waking 100 µs early (Linux's default
//!   50 µs timer slack makes sleeps overshoot), and only yield the CPU for the last 200 µs, so
//!   that a datagram leaves close to its time.

use std::thread;
use std::time::Duration;

/// How a loop waits for a time on its schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pacing {
    /// Waits longer than this sleep; shorter ones yield the CPU once.
    sleep_above_ns: u64,
    /// A sleep ends this much before the target.
    wake_early_ns: u64,
    /// Longest single sleep, so that the caller looks at its stop flag between them.
    max_sleep: Duration,
}

impl Pacing {
    /// Sleep the whole wait, at most 50 ms at a time.
    pub(crate) const SLEEP: Pacing = Pacing {
        sleep_above_ns: 0,
        wake_early_ns: 0,
        max_sleep: Duration::from_millis(50),
    };

    /// Sleep most of a long wait, yield for the last stretch; at most 50 ms at a time.
    pub(crate) const FINE: Pacing = Pacing {
        sleep_above_ns: 200_000,
        wake_early_ns: 100_000,
        max_sleep: Duration::from_millis(50),
    };

    /// This policy with single sleeps of at most `max`.
    pub(crate) const fn at_most(self, max: Duration) -> Pacing {
        Pacing {
            max_sleep: max,
            ..self
        }
    }

    /// Waits toward `target_ns`, it being `now_ns` (same clock): one sleep or one yield, or
    /// nothing when the time has come. The caller reads its clock and loops until it has.
    pub(crate) fn wait(self, now_ns: u64, target_ns: u64) {
        let Some(left) = target_ns.checked_sub(now_ns).filter(|&l| l > 0) else {
            return;
        };
        if left > self.sleep_above_ns {
            thread::sleep(
                Duration::from_nanos(left.saturating_sub(self.wake_early_ns)).min(self.max_sleep),
            );
        } else {
            thread::yield_now();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    #[test]
    fn a_wait_whose_time_has_come_returns_at_once_and_a_long_one_is_cut_to_the_slice() {
        let t = Instant::now();
        Pacing::SLEEP.wait(10, 10);
        Pacing::FINE.wait(20, 10);
        assert!(t.elapsed() < Duration::from_millis(20));
        let t = Instant::now();
        Pacing::SLEEP
            .at_most(Duration::from_millis(5))
            .wait(0, 10_000_000_000);
        let took = t.elapsed();
        assert!(took >= Duration::from_millis(5), "{took:?}");
        assert!(took < Duration::from_secs(5), "{took:?}");
    }
}
