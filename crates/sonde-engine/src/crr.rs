//! Connection-rate (`crr`) statistics: what one worker of a connect-request-response-close loop
//! saw, kept so that workers merge at the end without sharing anything while they run.
//!
//! A worker reports three kinds of event, each with times on the test clock: a connection
//! established ([`CrrStats::connected`]), a transaction completed, the response read in full
//! ([`CrrStats::completed`]), and an attempt that failed ([`CrrStats::failed`]). Connect and
//! transaction times go into HDR histograms ([`RttRecorder`], no warm-up); the rate is counted
//! over the worker's own window, from its first attempt to its last completed transaction.
//!
//! With intervals (`sonde crr -i`), a worker also counts each event into its current interval
//! ([`CrrIntervalCutter`]), handing it over to the run's [`CrrIntervals`] when an event falls
//! past it; those give each interval's counts and connect percentiles
//! ([`CrrIntervals::summaries`]).
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

use hdrhistogram::Histogram;

use crate::rtt::{percentile_supported, quantile, RttRecorder, MAX_TRACKABLE_NS};

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
    /// A load balancer placed the connection on an agent without the test's session, which
    /// said so: not a transaction of the test, and not a fault of the path.
    OtherAgent,
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
    /// [`CrrError::OtherAgent`].
    pub other_agent: u64,
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
            CrrError::OtherAgent => &mut self.other_agent,
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
            + self.other_agent
    }

    fn merge(&mut self, o: &Self) {
        self.refused += o.refused;
        self.timeout += o.timeout;
        self.reset += o.reset;
        self.addr_not_available += o.addr_not_available;
        self.closed += o.closed;
        self.other += o.other;
        self.other_agent += o.other_agent;
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

// ---------------------------------------------------------------------------------------------
// Intervals (`sonde crr -i`)
// ---------------------------------------------------------------------------------------------

/// Significant digits of an interval's connect times: 2 (within 1 %), not the totals' 3. An
/// interval's histogram is then 18 KiB instead of about 270, and a run holds one per interval.
const INTERVAL_DIGITS: u8 = 2;

/// What happened in one interval: one worker's part while it runs, or all workers' merged.
/// Each event counts in the interval of the time it happened: a transaction when its response
/// was read in full, a connect when the connection was established, a failure when the worker
/// saw it.
#[derive(Debug, Clone)]
pub struct CrrIntervalCounts {
    transactions: u64,
    connects: u64,
    errors: CrrErrorCounts,
    /// Connect times of the connects established in the interval.
    connect: Histogram<u32>,
}

impl Default for CrrIntervalCounts {
    fn default() -> Self {
        Self::new()
    }
}

impl CrrIntervalCounts {
    /// Nothing counted. Allocates the connect-time histogram (18 KiB): make these before a
    /// worker's loop, and [`reset`](Self::reset) them to reuse them.
    pub fn new() -> Self {
        // Constant bounds that hdrhistogram accepts (low >= 1, high >= 2 * low, sigfig <= 5).
        let connect = Histogram::new_with_bounds(1, MAX_TRACKABLE_NS, INTERVAL_DIGITS)
            .expect("constant histogram bounds are valid");
        Self {
            transactions: 0,
            connects: 0,
            errors: CrrErrorCounts::default(),
            connect,
        }
    }

    /// Back to nothing counted, keeping the histogram's memory.
    pub fn reset(&mut self) {
        self.transactions = 0;
        self.connects = 0;
        self.errors = CrrErrorCounts::default();
        self.connect.reset();
    }

    /// Whether nothing was counted.
    pub fn is_empty(&self) -> bool {
        self.transactions == 0 && self.connects == 0 && self.errors.total() == 0
    }

    /// Adds another part of the same interval (another worker's).
    pub fn merge(&mut self, other: &Self) {
        self.transactions += other.transactions;
        self.connects += other.connects;
        self.errors.merge(&other.errors);
        crate::histogram::add_saturating(&mut self.connect, &other.connect);
    }

    /// Transactions completed in the interval.
    pub fn transactions(&self) -> u64 {
        self.transactions
    }

    /// Connections established in the interval.
    pub fn connects(&self) -> u64 {
        self.connects
    }

    /// Failures seen in the interval, by kind.
    pub fn errors(&self) -> &CrrErrorCounts {
        &self.errors
    }

    /// The `pct` percentile of the interval's connect times, ns (to 2 significant digits);
    /// `None` when its connects are too few to state it (the latency rule: p50 needs 20, p99
    /// 1,000), none at all included.
    pub fn connect_percentile(&self, pct: f64) -> Option<u64> {
        let n = self.connect.len();
        (n > 0 && percentile_supported(pct, n))
            .then(|| self.connect.value_at_quantile(quantile(pct, n)))
    }
}

/// One worker's current interval, on a grid of `interval_ns` from 0 on the test clock.
///
/// Why this design: a worker counts into its own [`CrrIntervalCounts`], with nothing shared
/// and nothing allocated per transaction, and only when an event falls past the current
/// interval does it hand the finished one to `flush` (which adds it to all workers' intervals,
/// under a lock taken once per interval per worker, not per transaction) and reuse the counts.
/// Events are put in their interval by the time the worker already read for them, so the
/// intervals add up exactly to the totals. The alternatives cost more: a bucket per worker and
/// interval merged at the end holds workers × intervals histograms (64 workers for 60 s of 1 s
/// intervals: 69 MiB), and a reporter thread that swaps each worker's histogram at the
/// boundary needs the same hand-off plus a thread, and counts by when it polled.
#[derive(Debug, Clone)]
pub struct CrrIntervalCutter {
    interval_ns: u64,
    /// The current interval's number: it covers `[index, index + 1) * interval_ns`.
    index: u64,
    current: CrrIntervalCounts,
}

impl CrrIntervalCutter {
    /// Intervals of `interval_ns` (0 is taken as 1 ns). Allocates one [`CrrIntervalCounts`].
    pub fn new(interval_ns: u64) -> Self {
        Self {
            interval_ns: interval_ns.max(1),
            index: 0,
            current: CrrIntervalCounts::new(),
        }
    }

    /// The counts for an event at `t_ns`, first handing the current interval to `flush` (with
    /// its number) when `t_ns` is past it. An event older than the current interval (one clock
    /// per worker makes that a caller's bug) counts in the current one.
    fn at(
        &mut self,
        t_ns: u64,
        flush: &mut impl FnMut(u64, &CrrIntervalCounts),
    ) -> &mut CrrIntervalCounts {
        let index = t_ns / self.interval_ns;
        if index > self.index {
            if !self.current.is_empty() {
                flush(self.index, &self.current);
                self.current.reset();
            }
            self.index = index;
        }
        &mut self.current
    }

    /// A connection established at `connected_ns` after `connect_ns` of connecting.
    pub fn connected(
        &mut self,
        connected_ns: u64,
        connect_ns: u64,
        flush: &mut impl FnMut(u64, &CrrIntervalCounts),
    ) {
        let c = self.at(connected_ns, flush);
        c.connects += 1;
        c.connect.saturating_record(connect_ns);
    }

    /// A transaction whose response was read in full at `done_ns`.
    pub fn completed(&mut self, done_ns: u64, flush: &mut impl FnMut(u64, &CrrIntervalCounts)) {
        self.at(done_ns, flush).transactions += 1;
    }

    /// A failure the worker saw at `seen_ns`.
    pub fn failed(
        &mut self,
        seen_ns: u64,
        kind: CrrError,
        flush: &mut impl FnMut(u64, &CrrIntervalCounts),
    ) {
        self.at(seen_ns, flush).errors.add(kind);
    }

    /// Hands the current interval to `flush` (at the worker's end), unless nothing was counted.
    pub fn finish(&mut self, flush: &mut impl FnMut(u64, &CrrIntervalCounts)) {
        if !self.current.is_empty() {
            flush(self.index, &self.current);
            self.current.reset();
        }
    }
}

/// All workers' intervals of one run, on a grid of `interval_ns` from 0: interval `i` covers
/// `[i, i + 1) * interval_ns`. The last slot is the one that ends at or after `until_ns`, when
/// workers start their last attempts; it also takes anything counted after it (attempts still
/// running then, up to their timeouts), so that no count is lost and the last interval simply
/// runs to the run's end.
#[derive(Debug, Clone)]
pub struct CrrIntervals {
    interval_ns: u64,
    slots: Vec<CrrIntervalCounts>,
}

/// One interval's figures, as reported.
#[derive(Debug, Clone, PartialEq)]
pub struct CrrIntervalSummary {
    /// Start, ns on the test clock.
    pub start_ns: u64,
    /// End, ns (the next interval's start; the run's end for the last).
    pub end_ns: u64,
    /// Transactions completed in the interval.
    pub transactions: u64,
    /// `transactions` over the interval's length, per second (0 without any).
    pub per_second: f64,
    /// Connections established in the interval.
    pub connects: u64,
    /// Failures seen in the interval, by kind.
    pub errors: CrrErrorCounts,
    /// Median connect time of the interval's connects, ns; `None` with fewer than 20.
    pub connect_p50_ns: Option<u64>,
    /// 99th percentile, ns; `None` with fewer than 1,000.
    pub connect_p99_ns: Option<u64>,
}

impl CrrIntervals {
    /// The slots for a run whose workers start no attempt at or after `until_ns`: the
    /// intervals up to `until_ns`, at least one (an `interval_ns` of 0 is taken as 1 ns), all
    /// allocated now (18 KiB each); the caller bounds their number. The attempts still running
    /// at `until_ns` end in the last of them, which then runs a little past it: a sliver of an
    /// interval after `until_ns` would hold only those few, and read as a rate of nothing.
    pub fn new(interval_ns: u64, until_ns: u64) -> Self {
        let interval_ns = interval_ns.max(1);
        let n = usize::try_from(until_ns.div_ceil(interval_ns))
            .unwrap_or(usize::MAX)
            .max(1);
        Self {
            interval_ns,
            slots: (0..n).map(|_| CrrIntervalCounts::new()).collect(),
        }
    }

    /// The interval length, ns.
    pub fn interval_ns(&self) -> u64 {
        self.interval_ns
    }

    /// Adds a worker's counts of interval `index` (past the last slot: to the last).
    pub fn add(&mut self, index: u64, counts: &CrrIntervalCounts) {
        let last = self.slots.len() - 1;
        let i = usize::try_from(index).map_or(last, |i| i.min(last));
        self.slots[i].merge(counts);
    }

    /// The intervals of a run that ended at `end_ns` (no event after it): on the grid, the last
    /// from its start to `end_ns` (shorter than the others, or longer when it is the last slot
    /// and attempts ran past `until_ns`). Together they hold every count added. Empty when
    /// `end_ns` is 0.
    pub fn summaries(&self, end_ns: u64) -> Vec<CrrIntervalSummary> {
        if end_ns == 0 {
            return Vec::new();
        }
        let last_slot = self.slots.len() - 1;
        let last = usize::try_from((end_ns - 1) / self.interval_ns)
            .map_or(last_slot, |i| i.min(last_slot));
        let mut out = Vec::with_capacity(last + 1);
        for (i, slot) in self.slots.iter().enumerate().take(last + 1) {
            let start_ns = i as u64 * self.interval_ns;
            let (end, merged);
            let counts = if i == last {
                end = end_ns;
                // Counts past the end (an event exactly at `end_ns` on a boundary) stay in.
                let rest = &self.slots[i + 1..];
                if rest.iter().all(CrrIntervalCounts::is_empty) {
                    slot
                } else {
                    let mut m = slot.clone();
                    for r in rest {
                        m.merge(r);
                    }
                    merged = m;
                    &merged
                }
            } else {
                end = start_ns + self.interval_ns;
                slot
            };
            out.push(CrrIntervalSummary {
                start_ns,
                end_ns: end,
                transactions: counts.transactions,
                per_second: crate::per_second(counts.transactions, end - start_ns),
                connects: counts.connects,
                errors: counts.errors,
                connect_p50_ns: counts.connect_percentile(50.0),
                connect_p99_ns: counts.connect_percentile(99.0),
            });
        }
        out
    }
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

    const MS: u64 = 1_000_000;
    const SEC: u64 = 1_000_000_000;

    /// One attempt: its start, when it connected, and when it completed or when it was seen to
    /// fail and why.
    type Attempt = (u64, Option<u64>, Result<u64, (u64, CrrError)>);

    /// Workers on a virtual clock, recording into their totals and their interval cutters as
    /// `sonde_net::crr::client_worker` does; returns the merged totals, the intervals, and how
    /// many times the workers handed an interval over.
    fn run_with_intervals(
        interval_ns: u64,
        until_ns: u64,
        workers: &[&[Attempt]],
    ) -> (CrrStats, CrrIntervals, u64) {
        let mut all = CrrIntervals::new(interval_ns, until_ns);
        let mut totals = CrrStats::new();
        let mut flushes = 0;
        for attempts in workers {
            let mut stats = CrrStats::new();
            let mut cut = CrrIntervalCutter::new(interval_ns);
            let mut flush = |i: u64, c: &CrrIntervalCounts| {
                flushes += 1;
                all.add(i, c);
            };
            for &(start, connected, end) in *attempts {
                if let Some(c) = connected {
                    stats.connected(start, c);
                    cut.connected(c, c - start, &mut flush);
                }
                match end {
                    Ok(done) => {
                        stats.completed(start, done);
                        cut.completed(done, &mut flush);
                    }
                    Err((seen, kind)) => {
                        stats.failed(start, kind);
                        cut.failed(seen, kind, &mut flush);
                    }
                }
            }
            cut.finish(&mut flush);
            totals.merge(&stats);
        }
        (totals, all, flushes)
    }

    /// `n` transactions back to back from `start`, each taking `connect` then `rest` ns.
    fn back_to_back(start: u64, n: u64, connect: u64, rest: u64) -> Vec<Attempt> {
        (0..n)
            .map(|i| {
                let t = start + i * (connect + rest);
                (t, Some(t + connect), Ok(t + connect + rest))
            })
            .collect()
    }

    #[test]
    fn intervals_add_up_to_the_totals_and_the_last_one_runs_to_the_end() {
        // Worker 0: 2.5 s of 100 µs transactions (30 µs connects); worker 1: 1 ms
        // transactions (200 µs connects) from 0.3 s to past the 3 s of the test (its last
        // attempt started before 3 s), with failures at 1.5 s and 2.7 s.
        let w0 = back_to_back(0, 25_000, 30 * US, 70 * US);
        let mut w1 = back_to_back(300 * MS, 1_200, 200 * US, 800 * US);
        w1.push((1_500 * MS, None, Err((1_500 * MS, CrrError::Refused))));
        w1.extend(back_to_back(1_505 * MS, 1_195, 200 * US, 800 * US));
        w1.push((
            2_700 * MS,
            Some(2_700 * MS + 200 * US),
            Err((2_705 * MS, CrrError::Timeout)),
        ));
        w1.extend(back_to_back(2_705 * MS + 200 * US, 300, 200 * US, 800 * US));
        let end = w1.last().and_then(|a| a.2.ok()).unwrap();
        assert!(end > 3 * SEC, "the last transaction ends after -t");
        let (totals, all, flushes) = run_with_intervals(SEC, 3 * SEC, &[&w0, &w1]);
        // Each worker hands over each interval it counted in once: w0 3, w1 4.
        assert_eq!(flushes, 3 + 4);

        let iv = all.summaries(end);
        let spans: Vec<(u64, u64)> = iv.iter().map(|i| (i.start_ns, i.end_ns)).collect();
        // The attempts that ended after 3 s are in the last interval, which runs to the end:
        // no sliver after 3 s holding only them.
        assert_eq!(spans, [(0, SEC), (SEC, 2 * SEC), (2 * SEC, end)]);
        let sum = |f: fn(&CrrIntervalSummary) -> u64| iv.iter().map(f).sum::<u64>();
        assert_eq!(sum(|i| i.transactions), totals.transactions());
        assert_eq!(sum(|i| i.connects), totals.connects());
        assert_eq!(sum(|i| i.errors.total()), totals.errors().total());
        assert_eq!((iv[1].errors.refused, iv[2].errors.timeout), (1, 1));
        // Interval 0: what ended before 1 s, w0's first 9,999 (the 10,000th ends at 1 s, in
        // the next) and w1's 699 (from 0.3 s); the rate is over 1 s.
        assert_eq!(iv[0].transactions, 9_999 + 699);
        assert_eq!(iv[0].per_second, 10_698.0);
        for i in &iv {
            let secs = (i.end_ns - i.start_ns) as f64 / 1e9;
            assert!(
                (i.per_second - i.transactions as f64 / secs).abs() < 1e-6,
                "{i:?}"
            );
        }
        // Connect times: interval 0 is mostly w0's 30 µs, with 700 of w1's 200 µs (6.5 %):
        // the median is w0's, the 99th percentile w1's, to 2 significant digits.
        assert!(
            iv[0].connect_p50_ns.unwrap().abs_diff(30 * US) <= 300,
            "{:?}",
            iv[0]
        );
        assert!(
            iv[0].connect_p99_ns.unwrap().abs_diff(200 * US) <= 2 * US,
            "{:?}",
            iv[0]
        );
        // The last interval has w0's to 2.5 s and w1's to its end, past 3 s.
        assert_eq!(
            iv[2].transactions,
            totals.transactions() - iv[0].transactions - iv[1].transactions
        );
        assert!(iv[2].transactions > 5_000, "{:?}", iv[2]);
    }

    #[test]
    fn an_interval_without_transactions_is_zero_with_null_percentiles() {
        // One worker: transactions for 0.5 s, then a connect that hangs for 2 s and times out,
        // then more: the interval from 1 s to 2 s has nothing in it.
        let mut w = back_to_back(0, 5_000, 30 * US, 70 * US);
        w.push((500 * MS, None, Err((2_500 * MS, CrrError::Timeout))));
        w.extend(back_to_back(2_600 * MS, 100, 30 * US, 70 * US));
        let (_, all, _) = run_with_intervals(SEC, 3 * SEC, &[&w]);
        let iv = all.summaries(2_700 * MS);
        assert_eq!(iv.len(), 3);
        let empty = &iv[1];
        assert_eq!((empty.start_ns, empty.end_ns), (SEC, 2 * SEC));
        assert_eq!((empty.transactions, empty.connects), (0, 0));
        assert_eq!(empty.per_second, 0.0);
        assert_eq!((empty.connect_p50_ns, empty.connect_p99_ns), (None, None));
        assert_eq!(empty.errors, CrrErrorCounts::default());
        assert_eq!(iv[2].errors.timeout, 1);
        assert_eq!(iv[2].transactions, 100);
        assert_eq!(iv[2].end_ns, 2_700 * MS);
        // 100 connects state a median, not a 99th percentile.
        assert!(iv[2].connect_p50_ns.is_some());
        assert_eq!(iv[2].connect_p99_ns, None);
        assert_eq!(iv[0].transactions, 5_000);
    }

    #[test]
    fn counts_after_the_last_slot_stay_in_the_last_interval() {
        // -t 2 -i 1: slots 0 and 1; a transaction that ends at 4.5 s (after a long response)
        // goes in the last, which runs to the end.
        let w = [
            (100 * MS, Some(100 * MS + 30 * US), Ok(200 * MS)),
            (1_900 * MS, Some(1_900 * MS + 30 * US), Ok(4_500 * MS)),
        ];
        let (totals, all, _) = run_with_intervals(SEC, 2 * SEC, &[&w]);
        let iv = all.summaries(4_600 * MS);
        let spans: Vec<(u64, u64)> = iv.iter().map(|i| (i.start_ns, i.end_ns)).collect();
        assert_eq!(spans, [(0, SEC), (SEC, 4_600 * MS)]);
        assert_eq!(
            iv.iter().map(|i| i.transactions).sum::<u64>(),
            totals.transactions()
        );
        assert_eq!(iv[1].transactions, 1);
        assert!((iv[1].per_second - 1.0 / 3.6).abs() < 1e-12, "{:?}", iv[1]);
        // A run that ended on a boundary with an event right at it loses nothing either.
        let (_, all, _) = run_with_intervals(SEC, 3 * SEC, &[&[(1_500 * MS, None, Ok(2 * SEC))]]);
        let iv = all.summaries(2 * SEC);
        assert_eq!(iv.len(), 2);
        assert_eq!((iv[1].end_ns, iv[1].transactions), (2 * SEC, 1));
        assert!(all.summaries(0).is_empty());
    }

    #[test]
    fn interval_counts_reset_for_reuse_and_merge() {
        let mut a = CrrIntervalCounts::new();
        assert!(a.is_empty());
        for i in 0..1_000 {
            a.connects += 1;
            a.connect.saturating_record(10 * US + i);
        }
        a.transactions = 1_000;
        let mut b = a.clone();
        b.merge(&a);
        assert_eq!((b.transactions(), b.connects()), (2_000, 2_000));
        assert!(b.connect_percentile(99.0).unwrap().abs_diff(10_990) <= 110);
        a.reset();
        assert!(a.is_empty());
        assert_eq!(a.connect_percentile(50.0), None);
        // The histogram stays small: one per interval of a run.
        assert!(
            a.connect.distinct_values() * 4 <= 20 * 1024,
            "{}",
            a.connect.distinct_values()
        );
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
