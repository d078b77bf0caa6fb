//! Evenly spaced send schedules. Item `i` is due at `i * 1e9 / rate` nanoseconds after the
//! origin, computed without accumulating rounding error, so a long run keeps the exact rate and
//! never sends in bursts larger than what is due.

const NS_PER_S: u128 = 1_000_000_000;

/// [`Schedule::per_second`] keeps the rate to a millionth of an item per second.
const RATE_SCALE: f64 = 1e6;

/// A schedule of `rate` items per second from an origin at 0 ns.
///
/// The interval between items is held as an exact fraction of nanoseconds, `num / den`, and
/// `due_ns(i) = floor(i * num / den)` in 128-bit integers: item 10^9 is as exact as item 1.
/// A rate of 0 (or any rate that is not a positive number) means *unpaced*, as iperf3's `-b 0`:
/// every item is due at 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schedule {
    /// Nanoseconds per item, numerator; 0 when unpaced.
    num: u128,
    /// Nanoseconds per item, denominator; never 0.
    den: u128,
}

impl Schedule {
    /// `rate` items per second (must be > 0).
    ///
    /// The rate is rounded to a millionth of an item per second (and at least that); 0, a
    /// negative rate, NaN and infinity give an unpaced schedule.
    pub fn per_second(rate: f64) -> Self {
        if !(rate > 0.0 && rate.is_finite()) {
            return Self::UNPACED;
        }
        // The cast saturates at u64::MAX (a rate past 1.8e13/s, effectively unpaced anyway).
        let micro_rate = ((rate * RATE_SCALE).round() as u64).max(1);
        Self::new(NS_PER_S * 1_000_000, u128::from(micro_rate))
    }

    /// A schedule for `bits_per_second` with items of `item_bytes` payload bytes.
    ///
    /// `due_ns(i) = i * 8 * item_bytes * 1e9 / bits_per_second`, exactly. A bitrate of 0 or an
    /// item of 0 bytes gives an unpaced schedule.
    pub fn bits_per_second(bits_per_second: u64, item_bytes: u32) -> Self {
        if bits_per_second == 0 {
            return Self::UNPACED;
        }
        Self::new(
            8 * u128::from(item_bytes) * NS_PER_S,
            u128::from(bits_per_second),
        )
    }

    const UNPACED: Self = Self { num: 0, den: 1 };

    /// `num / den` ns per item, reduced so the products in `due_by` stay small.
    fn new(num: u128, den: u128) -> Self {
        let g = gcd(num, den);
        if g == 0 {
            return Self::UNPACED;
        }
        Self {
            num: num / g,
            den: den / g,
        }
    }

    /// Whether items are spaced at all (false for a rate of 0: everything is due at once).
    pub fn is_paced(&self) -> bool {
        self.num != 0
    }

    /// When item `i` is due, ns since the origin (`u64::MAX` if that is past the end of time).
    pub fn due_ns(&self, i: u64) -> u64 {
        // If the product saturates, the true quotient is >= 2^128 / den >= 2^64 (den fits a
        // u64 after reduction), so it saturates the result too.
        let due = u128::from(i).saturating_mul(self.num) / self.den;
        u64::try_from(due).unwrap_or(u64::MAX)
    }

    /// How many items are due by `now_ns` (items `0..n` have due times <= now).
    ///
    /// Exactly consistent with [`Self::due_ns`]: `due_by(due_ns(i))` is the first value above
    /// `i`. `u64::MAX` for an unpaced schedule.
    pub fn due_by(&self, now_ns: u64) -> u64 {
        if self.num == 0 {
            return u64::MAX;
        }
        // floor(i * num / den) <= now  <=>  i * num < (now + 1) * den, so the count of such i is
        // ceil((now + 1) * den / num). (now + 1) <= 2^64 and den < 2^64: the product fits.
        let limit = (u128::from(now_ns) + 1) * self.den;
        let n = limit.div_ceil(self.num);
        u64::try_from(n).unwrap_or(u64::MAX)
    }
}

fn gcd(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn per_second_is_exact() {
        let s = Schedule::per_second(1_000.0);
        assert!(s.is_paced());
        assert_eq!(s.due_ns(0), 0);
        assert_eq!(s.due_ns(1), 1_000_000);
        assert_eq!(s.due_ns(1_000), 1_000_000_000);
    }

    #[test]
    fn long_run_has_no_drift() {
        let s = Schedule::per_second(1_000.0);
        assert_eq!(s.due_ns(1_000_000_000), 1_000_000_000 * 1_000_000);
        // A rate whose interval is not a whole number of ns: 3/s is 333,333,333.3 ns.
        let s = Schedule::per_second(3.0);
        assert_eq!(s.due_ns(1), 333_333_333);
        assert_eq!(s.due_ns(3), 1_000_000_000);
        assert_eq!(s.due_ns(3_000_000_000), 1_000_000_000 * 1_000_000_000);
        assert_eq!(s.due_by(1_000_000_000 * 1_000_000_000), 3_000_000_001);
    }

    #[test]
    fn fractional_rate() {
        let s = Schedule::per_second(0.5);
        assert_eq!(s.due_ns(1), 2_000_000_000);
        let s = Schedule::per_second(2.5);
        assert_eq!(s.due_ns(5), 2_000_000_000);
        assert_eq!(s.due_ns(1), 400_000_000);
    }

    #[test]
    fn bits_per_second_schedule() {
        // 100 Mbit/s of 1,250-byte items is 10,000 items/s: one every 100 µs.
        let s = Schedule::bits_per_second(100_000_000, 1_250);
        assert_eq!(s, Schedule::per_second(10_000.0));
        assert_eq!(s.due_ns(1), 100_000);
        assert_eq!(s.due_ns(10_000), 1_000_000_000);
        assert_eq!(s.due_by(999_999_999), 10_000);
        assert_eq!(s.due_by(1_000_000_000), 10_001);
        // 1 Gbit/s of 1,472-byte datagrams: 11,776 ns each, over an hour exactly.
        let s = Schedule::bits_per_second(1_000_000_000, 1_472);
        assert_eq!(s.due_ns(1), 11_776);
        let hour = 3_600 * 1_000_000_000;
        assert_eq!(s.due_by(hour - 1), hour / 11_776 + 1);
    }

    #[test]
    fn due_by_boundaries() {
        let s = Schedule::per_second(1_000.0);
        assert_eq!(s.due_by(0), 1, "item 0 is due at the origin");
        assert_eq!(s.due_by(999_999), 1);
        assert_eq!(s.due_by(1_000_000), 2);
        assert_eq!(s.due_by(1_999_999), 2);
        assert_eq!(s.due_by(1_000_000_000), 1_001);
        assert_eq!(s.due_by(u64::MAX), u64::MAX / 1_000_000 + 1);
    }

    #[test]
    fn unpaced_and_extremes() {
        for s in [
            Schedule::per_second(0.0),
            Schedule::per_second(-1.0),
            Schedule::per_second(f64::NAN),
            Schedule::per_second(f64::INFINITY),
            Schedule::bits_per_second(0, 1_000),
            Schedule::bits_per_second(1_000, 0),
        ] {
            assert!(!s.is_paced());
            assert_eq!(s.due_ns(u64::MAX), 0);
            assert_eq!(s.due_by(0), u64::MAX);
        }
        // The slowest and the largest schedules neither overflow nor panic.
        let s = Schedule::bits_per_second(1, u32::MAX);
        assert_eq!(s.due_ns(u64::MAX), u64::MAX);
        assert_eq!(s.due_by(u64::MAX), 1);
        let s = Schedule::per_second(1e-12);
        assert_eq!(s.due_ns(1), 1_000_000 * 1_000_000_000);
        let s = Schedule::per_second(1e30);
        assert_eq!(s.due_ns(1), 0);
        assert!(s.due_by(0) > 1);
    }

    proptest! {
        #[test]
        fn due_by_agrees_with_due_ns(
            bps in 1u64..100_000_000_000,
            bytes in 1u32..65_536,
            i in 0u64..1_000_000_000_000,
        ) {
            let s = Schedule::bits_per_second(bps, bytes);
            let due = s.due_ns(i);
            prop_assume!(due < u64::MAX, "saturated");
            prop_assert!(s.due_by(due) > i);
            if due > 0 {
                prop_assert!(s.due_by(due - 1) <= i);
            }
            prop_assert!(s.due_ns(i + 1) >= due);
        }
    }
}
