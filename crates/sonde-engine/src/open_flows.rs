//! The open loop over many flows (`sonde latency -P N --rate R`): `R` requests per second in
//! all, spread evenly over the `N` flows, each flow on a schedule of its own with the flows'
//! phases staggered so that they never send together in bursts.
//!
//! The flows share one [`Schedule`] of the total rate: flow `f`'s request `i` is the total
//! schedule's item `i * N + f`, so each flow sends at exactly `R / N`, consecutive items of the
//! whole belong to consecutive flows, and the sends of all flows together are the evenly spaced
//! schedule of `R` (the one-flow open loop's, item for item when `N` is 1).
//!
//! A thread drives a contiguous group of the flows with one [`FlowPacer`]: it visits the
//! group's due times in order (the readiness loop sleeps until the next, [`FlowPacer::next_due`])
//! and lets a flow send what is due while it has fewer than `depth` requests outstanding. A flow
//! at its limit is not skipped: its request waits for a response to free a place and then
//! leaves late, its RTT still counted from the *scheduled* time (no coordinated omission, as
//! the one-flow open loop), and a send later than the caller's threshold is counted late. No
//! request leaves at or after the end of the schedule; what was due before then and never left
//! is counted unsent ([`FlowPacer::unsent`]).
//!
//! Sans-IO: the caller passes the time and each flow's outstanding count.

use crate::pace::Schedule;

/// One thread's share of an open loop over many flows: when each of its flows' requests is
/// due, and how many each has sent and sent late.
#[derive(Debug, Clone)]
pub struct FlowPacer {
    sched: Schedule,
    /// All the flows of the test, over every thread.
    total_flows: u64,
    /// The test-wide index of this group's first flow.
    first: u64,
    /// The schedule's origin on the caller's clock.
    origin_ns: u64,
    /// No request leaves at or after this time.
    until_ns: u64,
    /// A send later than this after its due time counts late.
    late_ns: u64,
    /// Per flow of the group: the index of its next request.
    next: Vec<u64>,
    /// Per flow: sends later than `late_ns`.
    late: Vec<u64>,
    /// The next due time the group visits: request `cursor_i` of local flow `cursor_f`.
    cursor_i: u64,
    cursor_f: usize,
}

impl FlowPacer {
    /// `total_rate` requests per second over `total_flows` flows, of which this pacer drives
    /// `flows`, test-wide indices `first..first + flows`; the schedule starts at `origin_ns`
    /// and nothing is sent at or after `until_ns`; a send more than `late_ns` after its due
    /// time counts late.
    pub fn new(
        total_rate: f64,
        total_flows: u32,
        first: u32,
        flows: usize,
        origin_ns: u64,
        until_ns: u64,
        late_ns: u64,
    ) -> Self {
        Self {
            sched: Schedule::per_second(total_rate),
            total_flows: u64::from(total_flows.max(1)),
            first: u64::from(first),
            origin_ns,
            until_ns,
            late_ns,
            next: vec![0; flows],
            late: vec![0; flows],
            cursor_i: 0,
            cursor_f: 0,
        }
    }

    /// When local flow `f`'s request `i` is due, on the caller's clock.
    pub fn due_ns(&self, f: usize, i: u64) -> u64 {
        let item = i
            .saturating_mul(self.total_flows)
            .saturating_add(self.first + f as u64);
        self.origin_ns.saturating_add(self.sched.due_ns(item))
    }

    /// How many of local flow `f`'s requests are due at or before `t_ns`.
    pub fn due_by(&self, f: usize, t_ns: u64) -> u64 {
        let Some(since) = t_ns.checked_sub(self.origin_ns) else {
            return 0;
        };
        // Items 0..k of the whole are due; flow f owns those congruent to its index.
        let k = self.sched.due_by(since);
        let g = self.first + f as u64;
        if k > g {
            (k - g - 1) / self.total_flows + 1
        } else {
            0
        }
    }

    /// The group's next due time before the end, if any: the readiness loop sleeps no longer.
    pub fn next_due(&self) -> Option<u64> {
        if self.next.is_empty() {
            return None;
        }
        let due = self.due_ns(self.cursor_f, self.cursor_i);
        (due < self.until_ns).then_some(due)
    }

    /// A flow of the group whose due time has come by `now_ns` (each due time once, in
    /// order); the caller then [`FlowPacer::take`]s what that flow may send. `None` when no
    /// due time has come (or the schedule is over).
    pub fn due_flow(&mut self, now_ns: u64) -> Option<usize> {
        let due = self.next_due()?;
        if due > now_ns {
            return None;
        }
        let f = self.cursor_f;
        self.cursor_f += 1;
        if self.cursor_f == self.next.len() {
            self.cursor_f = 0;
            self.cursor_i += 1;
        }
        Some(f)
    }

    /// Local flow `f`'s next request, if it is due by `now_ns` (before the end) and the flow
    /// has fewer than `depth` outstanding (`outstanding`): its scheduled send time, from which
    /// its RTT counts. The request is then counted sent (and late, when `now_ns` is more than
    /// the threshold after it).
    pub fn take(&mut self, f: usize, now_ns: u64, outstanding: u32, depth: u32) -> Option<u64> {
        if outstanding >= depth || now_ns >= self.until_ns {
            return None;
        }
        let i = *self.next.get(f)?;
        let due = self.due_ns(f, i);
        if due > now_ns || due >= self.until_ns {
            return None;
        }
        self.next[f] = i + 1;
        if now_ns - due > self.late_ns {
            self.late[f] += 1;
        }
        Some(due)
    }

    /// Requests local flow `f` has sent.
    pub fn sent(&self, f: usize) -> u64 {
        self.next.get(f).copied().unwrap_or(0)
    }

    /// Requests of local flow `f` due at or after `from_ns` that it sent (the measured part of
    /// the run, from the end of the warm-up).
    pub fn sent_from(&self, f: usize, from_ns: u64) -> u64 {
        let before = from_ns.checked_sub(1).map_or(0, |t| self.due_by(f, t));
        self.sent(f).saturating_sub(before)
    }

    /// Sends of local flow `f` later than the threshold after their due time.
    pub fn late(&self, f: usize) -> u64 {
        self.late.get(f).copied().unwrap_or(0)
    }

    /// Requests of local flow `f` due before the end (and at or before `end_ns`, for a run
    /// stopped early) that it never sent: it was at its depth limit until the end.
    pub fn unsent(&self, f: usize, end_ns: u64) -> u64 {
        let Some(last) = self.until_ns.checked_sub(1) else {
            return 0;
        };
        self.due_by(f, end_ns.min(last))
            .saturating_sub(self.sent(f))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const S: u64 = 1_000_000_000;

    /// Splits `n` flows into `threads` contiguous groups as the client does.
    fn groups(n: u32, threads: u32) -> Vec<(u32, usize)> {
        (0..threads)
            .map(|t| {
                (
                    t * n / threads,
                    ((t + 1) * n / threads - t * n / threads) as usize,
                )
            })
            .filter(|g| g.1 > 0)
            .collect()
    }

    /// Every thread's pacer over a virtual clock stepped by `step_ns`, every response back
    /// `rtt_ns` after its actual send: per flow, its sends' scheduled times, and the most it
    /// ever had outstanding.
    fn simulate(
        rate: f64,
        n: u32,
        threads: u32,
        depth: u32,
        until_ns: u64,
        step_ns: u64,
        rtt_ns: u64,
    ) -> (Vec<FlowPacer>, Vec<Vec<u64>>, Vec<u32>) {
        let mut pacers: Vec<FlowPacer> = groups(n, threads)
            .into_iter()
            .map(|(first, len)| FlowPacer::new(rate, n, first, len, 0, until_ns, MS))
            .collect();
        let mut sends = vec![Vec::new(); n as usize];
        let mut most = vec![0u32; n as usize];
        // Per flow: the actual send times of its outstanding requests.
        let mut outstanding: Vec<Vec<u64>> = vec![Vec::new(); n as usize];
        let mut now = 0;
        while now < until_ns + 10 * rtt_ns {
            for p in &mut pacers {
                let first = p.first as usize;
                // Responses first: they free places.
                for f in 0..p.next.len() {
                    outstanding[first + f].retain(|&sent| now < sent + rtt_ns);
                }
                let mut visit = |p: &mut FlowPacer, f: usize| {
                    let g = first + f;
                    let out = &mut outstanding[g];
                    while let Some(due) = p.take(f, now, out.len() as u32, depth) {
                        assert!(due <= now && due < until_ns);
                        sends[g].push(due);
                        out.push(now);
                        most[g] = most[g].max(out.len() as u32);
                    }
                };
                for f in 0..p.next.len() {
                    visit(p, f);
                }
                while let Some(f) = p.due_flow(now) {
                    visit(p, f);
                }
            }
            now += step_ns;
        }
        (pacers, sends, most)
    }

    #[test]
    fn the_total_rate_is_spread_over_the_flows_exactly_and_their_phases_staggered() {
        // 20,000/s over 16 flows and 2 threads for 2 s: 40,000 requests, 2,500 per flow, at
        // 1,250/s each. The virtual clock steps 10 µs, finer than the 50 µs between items.
        let (pacers, sends, most) = simulate(20_000.0, 16, 2, 1, 2 * S, 10_000, 1_000);
        let total: usize = sends.iter().map(Vec::len).sum();
        assert_eq!(
            total, 40_000,
            "exactly rate x duration, no more and no less"
        );
        for s in &sends {
            assert_eq!(s.len(), 2_500, "every flow its share exactly");
            // Each flow at R/N: its scheduled times 800 µs apart (to the ns of rounding).
            for w in s.windows(2) {
                assert!((w[1] - w[0]).abs_diff(800_000) <= 1, "{w:?}");
            }
        }
        // The flows' phases are staggered: all scheduled times of all flows are distinct and,
        // merged, evenly spaced at 50 µs (the total rate's schedule, item for item).
        let mut all: Vec<u64> = sends.iter().flatten().copied().collect();
        all.sort_unstable();
        for (i, t) in all.iter().enumerate() {
            assert_eq!(*t, i as u64 * 50_000, "item {i}");
        }
        assert!(most.iter().all(|&m| m == 1));
        // Nothing was late (the responses came back in 1 µs) and nothing is unsent.
        for p in &pacers {
            for f in 0..p.next.len() {
                assert_eq!(p.late(f), 0);
                assert_eq!(p.unsent(f, u64::MAX), 0);
                assert_eq!(p.sent_from(f, S), 1_250, "half the run after a 1 s mark");
            }
        }
    }

    #[test]
    fn a_flow_at_its_depth_limit_sends_late_never_more_than_depth_and_counts_what_it_could_not() {
        // 4 flows at 1,000/s each (a request every ms) with responses taking 5 ms: a flow would
        // need 5 outstanding and may have 2, so it sends 2 every 5 ms, late, from the schedule.
        let depth = 2;
        let (pacers, sends, most) = simulate(4_000.0, 4, 1, depth, S, 100_000, 5 * MS);
        assert!(most.iter().all(|&m| m == depth), "{most:?}");
        let p = &pacers[0];
        for (f, s) in sends.iter().enumerate() {
            // About 2 per 5 ms over 1 s: 400 of the 1,000 due; the rest never left.
            assert!((395..=405).contains(&s.len()), "{}", s.len());
            assert_eq!(p.sent(f), s.len() as u64);
            assert_eq!(
                p.sent(f) + p.unsent(f, u64::MAX),
                1_000,
                "sent + unsent = due"
            );
            // Sent in schedule order, none skipped: the scheduled times are the flow's first
            // sent(f) items, each 1 ms apart.
            for (i, due) in s.iter().enumerate() {
                assert_eq!(*due, p.due_ns(f, i as u64));
            }
            // All but the first two left more than 1 ms after their time.
            assert!(
                p.late(f) >= s.len() as u64 - 2,
                "{} of {}",
                p.late(f),
                s.len()
            );
        }
    }

    #[test]
    fn a_run_stopped_early_counts_unsent_only_what_was_due_by_then() {
        let mut p = FlowPacer::new(1_000.0, 1, 0, 1, 0, S, MS);
        assert_eq!(p.take(0, 0, 0, 1), Some(0));
        // Outstanding until 10 ms: the 9 due meanwhile wait.
        assert_eq!(p.take(0, 5 * MS, 1, 1), None);
        assert_eq!(p.unsent(0, 10 * MS), 10, "due by 10 ms: 11, sent 1");
        assert_eq!(
            p.take(0, 10 * MS, 0, 1),
            Some(MS),
            "the next in order, late"
        );
        assert_eq!(p.late(0), 1);
    }

    #[test]
    fn the_origin_offsets_the_schedule_and_nothing_is_due_at_or_after_the_end() {
        let mut p = FlowPacer::new(1_000.0, 2, 1, 1, 7 * MS, 9 * MS, MS);
        // Flow 1 of 2 at 500/s: items 1, 3, 5... of the whole, at 1 ms, 3 ms, ... after 7 ms.
        assert_eq!(p.next_due(), Some(8 * MS));
        assert_eq!(p.due_flow(8 * MS - 1), None);
        assert_eq!(p.due_flow(8 * MS), Some(0));
        assert_eq!(p.take(0, 8 * MS, 0, 1), Some(8 * MS));
        assert_eq!(p.next_due(), None, "10 ms is past the end");
        assert_eq!(p.take(0, 20 * MS, 0, 1), None);
        assert_eq!(p.unsent(0, u64::MAX), 0);
    }
}
