//! Evenly spaced send schedules. Item `i` is due at `i * 1e9 / rate` nanoseconds after the
//! origin, computed without accumulating rounding error, so a long run keeps the exact rate and
//! never sends in bursts larger than what is due.

/// A schedule of `rate` items per second from an origin at 0 ns.
#[derive(Debug, Clone, Copy)]
pub struct Schedule {
    _private: (),
}

impl Schedule {
    /// `rate` items per second (must be > 0).
    pub fn per_second(rate: f64) -> Self {
        todo!("{rate}")
    }
    /// A schedule for `bits_per_second` with items of `item_bytes` payload bytes.
    pub fn bits_per_second(bits_per_second: u64, item_bytes: u32) -> Self {
        todo!("{bits_per_second} {item_bytes}")
    }
    /// When item `i` is due, ns since the origin.
    pub fn due_ns(&self, i: u64) -> u64 {
        todo!("{i}")
    }
    /// How many items are due by `now_ns` (items `0..n` have due times <= now).
    pub fn due_by(&self, now_ns: u64) -> u64 {
        todo!("{now_ns}")
    }
}
