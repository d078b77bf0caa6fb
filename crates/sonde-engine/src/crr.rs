//! Connection-rate (`crr`) statistics: what one worker of a connect-request-response-close loop
//! saw, kept so that workers merge at the end without sharing anything while they run.
//!
//! A worker reports three kinds of event, each with times on the test clock: a connection
//! established ([`CrrStats::connected`]), a transaction completed, the response read in full
//! ([`CrrStats::completed`]), and an attempt that failed ([`CrrStats::failed`]). Connect and
//! transaction times go into HDR histograms ([`RttRecorder`], no warm-up); the rate is counted
//! over the worker's own window, from its first attempt to its last completed transaction.
//!
//! ```
//! use sonde_engine::crr::{CrrError, CrrStats};
//!
//! let mut a = CrrStats::new();
//! // Attempt at 0 µs: connected after 30 µs, response read at 80 µs.
//! a.connected(0, 30_000);
//! a.completed(0, 80_000);
//! let mut b = CrrStats::new();
//! b.failed(10_000, CrrError::Refused);
//! b.connected(100_000, 140_000);
//! b.completed(100_000, 200_000);
//! a.merge(&b);
//! assert_eq!((a.connects(), a.transactions(), a.errors().refused), (2, 2, 1));
//! assert_eq!(a.active_ns(), 200_000); // 0 to 200 µs
//! assert_eq!(a.per_second(), Some(10_000.0));
//! ```

use crate::rtt::RttRecorder;

/// Why one attempt failed, as the client saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrrError {
    /// The connection was refused (`ECONNREFUSED`: nothing listening, or a firewall's reset).
    Refused,
    /// The connect or the response took longer than the client's timeout.
    Timeout,
    /// The connection was reset (`ECONNRESET`, `EPIPE`) before the response was read.
    Reset,
    /// No local address and port was free for a new connection (`EADDRNOTAVAIL`): the client's
    /// ephemeral ports are all in use or in `TIME_WAIT`.
    AddrNotAvailable,
    /// The agent closed the connection before the whole response (it refused the connection, or
    /// its session had ended).
    Closed,
    /// Anything else (out of file descriptors, no route, ...).
    Other,
}

/// Failed attempts, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CrrErrorCounts {
    /// [`CrrError::Refused`].
    pub refused: u64,
    /// [`CrrError::Timeout`].
    pub timeout: u64,
    /// [`CrrError::Reset`].
    pub reset: u64,
    /// [`CrrError::AddrNotAvailable`].
    pub addr_not_available: u64,
    /// [`CrrError::Closed`].
    pub closed: u64,
    /// [`CrrError::Other`].
    pub other: u64,
}

impl CrrErrorCounts {
    /// Counts one failure.
    pub fn add(&mut self, kind: CrrError) {
        let n = match kind {
            CrrError::Refused => &mut self.refused,
            CrrError::Timeout => &mut self.timeout,
            CrrError::Reset => &mut self.reset,
            CrrError::AddrNotAvailable => &mut self.addr_not_available,
            CrrError::Closed => &mut self.closed,
            CrrError::Other => &mut self.other,
        };
        *n += 1;
    }

    /// All failures.
    pub fn total(&self) -> u64 {
        self.refused
            + self.timeout
            + self.reset
            + self.addr_not_available
            + self.closed
            + self.other
    }

    fn merge(&mut self, o: &Self) {
        self.refused += o.refused;
        self.timeout += o.timeout;
        self.reset += o.reset;
        self.addr_not_available += o.addr_not_available;
        self.closed += o.closed;
        self.other += o.other;
    }
}

/// One worker's (or, merged, all workers') connection-rate counts and times.
#[derive(Debug, Clone)]
pub struct CrrStats {
    connect: RttRecorder,
    transaction: RttRecorder,
    connects: u64,
    transactions: u64,
    errors: CrrErrorCounts,
    /// Start of the first attempt, ns on the test clock.
    first_ns: Option<u64>,
    /// End of the last completed transaction.
    last_ns: Option<u64>,
}

impl Default for CrrStats {
    fn default() -> Self {
        Self::new()
    }
}

impl CrrStats {
    /// Nothing seen yet. Allocates the two histograms (a few hundred KiB): make one per worker
    /// before its loop starts.
    pub fn new() -> Self {
        Self {
            connect: RttRecorder::new(0),
            transaction: RttRecorder::new(0),
            connects: 0,
            transactions: 0,
            errors: CrrErrorCounts::default(),
            first_ns: None,
            last_ns: None,
        }
    }

    fn attempt(&mut self, start_ns: u64) {
        self.first_ns = Some(self.first_ns.map_or(start_ns, |f| f.min(start_ns)));
    }

    /// An attempt that started (the `connect` call) at `start_ns` was established at
    /// `connected_ns`.
    pub fn connected(&mut self, start_ns: u64, connected_ns: u64) {
        self.attempt(start_ns);
        self.connects += 1;
        self.connect
            .record(start_ns, connected_ns.saturating_sub(start_ns));
    }

    /// An attempt that started at `start_ns` read its whole response at `done_ns`.
    pub fn completed(&mut self, start_ns: u64, done_ns: u64) {
        self.attempt(start_ns);
        self.transactions += 1;
        self.transaction
            .record(start_ns, done_ns.saturating_sub(start_ns));
        self.last_ns = Some(self.last_ns.map_or(done_ns, |l| l.max(done_ns)));
    }

    /// An attempt that started at `start_ns` failed.
    pub fn failed(&mut self, start_ns: u64, kind: CrrError) {
        self.attempt(start_ns);
        self.errors.add(kind);
    }

    /// Adds another worker's counts and times.
    pub fn merge(&mut self, other: &CrrStats) {
        self.connect.merge(&other.connect);
        self.transaction.merge(&other.transaction);
        self.connects += other.connects;
        self.transactions += other.transactions;
        self.errors.merge(&other.errors);
        self.first_ns = match (self.first_ns, other.first_ns) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.last_ns = self.last_ns.max(other.last_ns);
    }

    /// Connections established.
    pub fn connects(&self) -> u64 {
        self.connects
    }

    /// Transactions completed (response read in full).
    pub fn transactions(&self) -> u64 {
        self.transactions
    }

    /// Failed attempts, by kind.
    pub fn errors(&self) -> &CrrErrorCounts {
        &self.errors
    }

    /// Connect times: from the `connect` call to the connection established (one round trip
    /// when the SYN is not lost; a retransmitted SYN adds the kernel's retransmission timeout).
    pub fn connect_times(&self) -> &RttRecorder {
        &self.connect
    }

    /// Transaction times: from the `connect` call to the last byte of the response.
    pub fn transaction_times(&self) -> &RttRecorder {
        &self.transaction
    }

    /// The window the rate is counted over: from the first attempt to the last completed
    /// transaction, ns; 0 before any transaction completed.
    pub fn active_ns(&self) -> u64 {
        match (self.first_ns, self.last_ns) {
            (Some(first), Some(last)) => last.saturating_sub(first),
            _ => 0,
        }
    }

    /// Transactions per second over [`CrrStats::active_ns`]; `None` when no transaction
    /// completed (a rate needs a window, and there is none).
    pub fn per_second(&self) -> Option<f64> {
        rate(self.transactions, self.active_ns())
    }
}

/// `count` per second over `ns`; `None` when there is no window (`ns` 0) or nothing counted, so
/// that "not measured" never reads as 0 per second.
pub fn rate(count: u64, ns: u64) -> Option<f64> {
    (count > 0 && ns > 0).then(|| crate::per_second(count, ns))
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: u64 = 1_000;

    /// A worker on a virtual clock: every transaction takes `connect` then `rest` ns, the next
    /// starts `gap` ns after the last ended.
    fn worker(start: u64, n: u64, connect: u64, rest: u64, gap: u64) -> CrrStats {
        let mut s = CrrStats::new();
        let mut t = start;
        for _ in 0..n {
            s.connected(t, t + connect);
            s.completed(t, t + connect + rest);
            t += connect + rest + gap;
        }
        s
    }

    #[test]
    fn counts_times_and_window_of_one_worker() {
        let s = worker(1_000 * US, 100, 30 * US, 50 * US, 20 * US);
        assert_eq!((s.connects(), s.transactions()), (100, 100));
        assert_eq!(s.errors().total(), 0);
        // 100 transactions of 100 µs each, back to back except the last gap.
        assert_eq!(s.active_ns(), 100 * 100 * US - 20 * US);
        let rate = s.per_second().unwrap();
        assert!((rate - 100.0 / 0.00998).abs() < 1e-6, "{rate}");
        let c = s.connect_times().summary();
        assert_eq!(c.samples, 100);
        assert!(c.min_ns.abs_diff(30 * US) <= 30, "{}", c.min_ns);
        let t = s.transaction_times().summary();
        assert!(t.max_ns.abs_diff(80 * US) <= 80, "{}", t.max_ns);
        assert_eq!(t.warmup_excluded, 0);
    }

    #[test]
    fn merging_workers_equals_one_worker_seeing_everything() {
        let a = worker(0, 500, 20 * US, 40 * US, 0);
        let b = worker(7 * US, 300, 25 * US, 90 * US, 5 * US);
        let mut merged = a.clone();
        merged.merge(&b);
        assert_eq!(merged.transactions(), 800);
        assert_eq!(merged.connects(), 800);
        // The window spans both: a starts first, b ends last.
        let b_end = 7 * US + 300 * 120 * US - 5 * US;
        assert_eq!(merged.active_ns(), b_end);

        let mut one = CrrStats::new();
        for (w, n, c, r, g) in [(0, 500, 20, 40, 0), (7, 300, 25, 90, 5)] {
            let mut t = w * US;
            for _ in 0..n {
                one.connected(t, t + c * US);
                one.completed(t, t + (c + r) * US);
                t += (c + r + g) * US;
            }
        }
        assert_eq!(
            merged.connect_times().summary(),
            one.connect_times().summary()
        );
        assert_eq!(
            merged.transaction_times().summary(),
            one.transaction_times().summary()
        );
        // Merging in the other order gives the same.
        let mut other_way = b.clone();
        other_way.merge(&a);
        assert_eq!(other_way.active_ns(), merged.active_ns());
        assert_eq!(other_way.transactions(), merged.transactions());
    }

    #[test]
    fn failures_are_counted_by_kind_and_widen_the_window_only_at_its_start() {
        let mut s = CrrStats::new();
        s.failed(0, CrrError::Refused);
        s.failed(10 * US, CrrError::Timeout);
        s.connected(20 * US, 50 * US);
        s.failed(20 * US, CrrError::Reset);
        s.connected(100 * US, 130 * US);
        s.completed(100 * US, 180 * US);
        s.failed(200 * US, CrrError::AddrNotAvailable);
        s.failed(210 * US, CrrError::Closed);
        s.failed(220 * US, CrrError::Other);
        let e = *s.errors();
        assert_eq!(
            (
                e.refused,
                e.timeout,
                e.reset,
                e.addr_not_available,
                e.closed,
                e.other
            ),
            (1, 1, 1, 1, 1, 1)
        );
        assert_eq!(e.total(), 6);
        // Two connections, one transaction; the window ends at the last *completed* one.
        assert_eq!((s.connects(), s.transactions()), (2, 1));
        assert_eq!(s.active_ns(), 180 * US);
        assert_eq!(s.transaction_times().summary().samples, 1);
    }

    #[test]
    fn no_transaction_is_no_rate_not_zero() {
        let mut s = CrrStats::new();
        assert_eq!((s.active_ns(), s.per_second()), (0, None));
        s.failed(0, CrrError::Refused);
        s.connected(5, 10);
        assert_eq!(s.per_second(), None);
        let mut empty = CrrStats::new();
        empty.merge(&s);
        assert_eq!(empty.errors().refused, 1);
        assert_eq!(rate(0, 1_000), None);
        assert_eq!(rate(5, 0), None);
        assert_eq!(rate(5, 1_000_000_000), Some(5.0));
    }

    #[test]
    fn a_transaction_that_ends_before_it_starts_saturates_at_zero() {
        // Times come from one monotonic clock, but a caller's bug must not wrap to 2^64.
        let mut s = CrrStats::new();
        s.connected(100, 50);
        s.completed(100, 50);
        assert_eq!(s.connect_times().summary().max_ns, 0);
        assert_eq!(s.active_ns(), 0);
        assert_eq!(s.per_second(), None);
    }
}
