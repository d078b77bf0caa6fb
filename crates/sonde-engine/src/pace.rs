//! Evenly spaced send schedules. Item `i` is due at `i * 1e9 / rate` nanoseconds after the
//! origin, computed without accumulating rounding error, so a long run keeps the exact rate and
//! never sends in bursts larger than what is due. A [`TokenBucket`] caps a byte stream whose
//! pieces come in sizes the caller does not choose (a TCP receiver's reads).

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

/// A byte budget that fills at `bytes_per_second` up to `burst_bytes`: whoever takes only what
/// [`TokenBucket::available`] says has moved at most `burst_bytes + rate * elapsed` bytes by
/// any time, however its pieces were sized. It starts full. Taking more than is available
/// (bytes that came anyway) leaves a debt that the rate pays back before anything is available
/// again.
///
/// Credit is held in byte-nanoseconds (bytes x 1e9), so no fraction of a byte is lost between
/// refills however often they come.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenBucket {
    /// Bytes per second, at least 1.
    rate: i128,
    /// Most credit held, byte-nanoseconds.
    cap: i128,
    /// Credit held at `last_ns`, byte-nanoseconds; negative while in debt.
    credit: i128,
    last_ns: u64,
}

/// A byte-nanosecond amount, saturating (`bytes` past 2^64 / 1e9 are beyond any real bucket).
fn byte_ns(bytes: u64) -> i128 {
    i128::from(bytes).saturating_mul(NS_PER_S as i128)
}

impl TokenBucket {
    /// A full bucket at `now_ns` (a rate of 0 counts as 1 byte/s; a burst of 0 as 1 byte).
    pub fn new(bytes_per_second: u64, burst_bytes: u64, now_ns: u64) -> Self {
        let cap = byte_ns(burst_bytes.max(1));
        Self {
            rate: i128::from(bytes_per_second.max(1)),
            cap,
            credit: cap,
            last_ns: now_ns,
        }
    }

    /// The most bytes the bucket holds.
    pub fn burst_bytes(&self) -> u64 {
        u64::try_from(self.cap / NS_PER_S as i128).unwrap_or(u64::MAX)
    }

    /// Whole bytes that may be taken at `now_ns` (a clock that went back adds nothing).
    pub fn available(&mut self, now_ns: u64) -> u64 {
        if now_ns > self.last_ns {
            let earned = i128::from(now_ns - self.last_ns).saturating_mul(self.rate);
            self.credit = self.credit.saturating_add(earned).min(self.cap);
            self.last_ns = now_ns;
        }
        u64::try_from(self.credit.max(0) / NS_PER_S as i128).unwrap_or(u64::MAX)
    }

    /// Empties the bucket at `now_ns`, as if it had just been created empty.
    pub fn empty(&mut self, now_ns: u64) {
        self.last_ns = self.last_ns.max(now_ns);
        self.credit = 0;
    }

    /// Takes `bytes`; past what [`Self::available`] said, the rest is owed.
    pub fn take(&mut self, bytes: u64) {
        self.credit = self.credit.saturating_sub(byte_ns(bytes));
    }

    /// How long after the last [`Self::available`] until `bytes` (capped at the burst) are.
    pub fn wait_ns(&self, bytes: u64) -> u64 {
        let want = byte_ns(bytes).min(self.cap);
        let missing = want.saturating_sub(self.credit).max(0);
        let ns = (missing + self.rate - 1) / self.rate;
        u64::try_from(ns).unwrap_or(u64::MAX)
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

    #[test]
    fn token_bucket_starts_full_and_refills_at_its_rate() {
        // 1,000 bytes/s, 100 bytes of burst.
        let mut b = TokenBucket::new(1_000, 100, 5_000);
        assert_eq!(b.burst_bytes(), 100);
        assert_eq!(b.available(5_000), 100);
        b.take(100);
        assert_eq!(b.available(5_000), 0);
        assert_eq!(b.wait_ns(10), 10_000_000);
        // 10 ms later: 10 bytes; a clock that goes back adds nothing.
        assert_eq!(b.available(10_005_000), 10);
        assert_eq!(b.available(1_000), 10);
        // Fractions of a byte add up over many refills.
        b.take(10);
        for t in 1..=1_000u64 {
            b.available(10_005_000 + t * 1_000);
        }
        assert_eq!(b.available(11_005_000), 1);
        // Never more than the burst, however long it waited.
        assert_eq!(b.available(1 << 40), 100);
        assert_eq!(b.wait_ns(1_000_000), 0);
        // Bytes taken beyond what was available are owed: 50 bytes of debt and 10 more wanted
        // take 60 ms to earn.
        b.empty(1 << 40);
        assert_eq!(b.available(1 << 40), 0);
        b.take(50);
        assert_eq!(b.wait_ns(10), 60_000_000);
        assert_eq!(b.available((1 << 40) + 50_000_000), 0);
        assert_eq!(b.available((1 << 40) + 60_000_000), 10);
    }

    proptest! {
        /// Whoever takes only what is available never moves more than burst + rate x elapsed,
        /// whatever the piece sizes and times.
        #[test]
        fn token_bucket_never_lets_more_through_than_its_rate_and_burst(
            rate in 1u64..10_000_000_000,
            burst in 1u64..10_000_000,
            steps in proptest::collection::vec((0u64..50_000_000, 0u64..2_000_000), 1..200),
        ) {
            let mut b = TokenBucket::new(rate, burst, 0);
            let (mut now, mut taken) = (0u64, 0u128);
            for (dt, want) in steps {
                now += dt;
                let n = want.min(b.available(now));
                b.take(n);
                taken += u128::from(n);
                let allowed = u128::from(burst) + u128::from(now) * u128::from(rate) / NS_PER_S;
                prop_assert!(taken <= allowed, "{taken} > {allowed}");
            }
        }
    }
}
