//! Receiver intervals: cumulative per-stream counters cut at fixed boundaries.

use sonde_wire::IntervalStats;

/// Cuts cumulative `(bytes, packets)` counters into intervals of `interval_ns`, on the
/// receiver's clock, from an origin at 0 ns.
///
/// Boundaries are the multiples of `interval_ns`. The counts of an interval are whatever the
/// cumulative counters grew by between two calls, so a late `poll` attributes to the interval
/// it closes the traffic that arrived since its boundary: poll promptly.
#[derive(Debug, Clone)]
pub struct Intervals {
    interval_ns: u64,
    streams: Vec<u32>,
    /// Where the current (open) interval started.
    start_ns: u64,
    /// The cumulative counters at `start_ns`, parallel to `streams`.
    last: Vec<(u64, u64)>,
}

impl Intervals {
    /// Intervals of `interval_ns` (> 0) for the given stream indexes.
    ///
    /// An `interval_ns` of 0 is taken as 1 ns.
    pub fn new(interval_ns: u64, streams: Vec<u32>) -> Self {
        let last = vec![(0, 0); streams.len()];
        Self {
            interval_ns: interval_ns.max(1),
            streams,
            start_ns: 0,
            last,
        }
    }

    /// When the next interval ends, ns since the origin.
    pub fn next_boundary_ns(&self) -> u64 {
        (self.start_ns / self.interval_ns)
            .saturating_add(1)
            .saturating_mul(self.interval_ns)
    }

    /// Called at or after a boundary with the cumulative counters (parallel to the streams given
    /// to `new`): returns the interval that ended, with the counts since the previous one.
    /// Returns `None` before the boundary.
    ///
    /// A late poll, after several boundaries have passed, returns one longer interval from the
    /// previous cut to the latest boundary passed, never a run of made-up empty intervals;
    /// `end_ns - start_ns` tells its length.
    pub fn poll(&mut self, now_ns: u64, cumulative: &[(u64, u64)]) -> Option<IntervalStats> {
        if now_ns < self.next_boundary_ns() {
            return None;
        }
        let end_ns = now_ns / self.interval_ns * self.interval_ns;
        if end_ns <= self.start_ns {
            // Only at the end of time, where the next boundary saturated.
            return None;
        }
        Some(self.cut(end_ns, cumulative))
    }

    /// Closes the last, partial interval at `now_ns` (None when it would be empty in time).
    ///
    /// If boundaries have passed unpolled, the interval runs from the previous cut to `now_ns`
    /// (call [`Self::poll`] first to close them at the boundary). Later intervals continue from
    /// `now_ns`, up to the next boundary.
    pub fn finish(&mut self, now_ns: u64, cumulative: &[(u64, u64)]) -> Option<IntervalStats> {
        if now_ns <= self.start_ns {
            return None;
        }
        Some(self.cut(now_ns, cumulative))
    }

    fn cut(&mut self, end_ns: u64, cumulative: &[(u64, u64)]) -> IntervalStats {
        debug_assert_eq!(
            cumulative.len(),
            self.streams.len(),
            "one cumulative counter per stream"
        );
        let mut bytes = Vec::with_capacity(self.streams.len());
        let mut packets = Vec::with_capacity(self.streams.len());
        for (i, last) in self.last.iter_mut().enumerate() {
            // A missing counter reads as unchanged; a counter that went backwards as no traffic.
            let now = cumulative.get(i).copied().unwrap_or(*last);
            bytes.push(now.0.saturating_sub(last.0));
            packets.push(now.1.saturating_sub(last.1));
            *last = now;
        }
        let stats = IntervalStats {
            start_ns: self.start_ns,
            end_ns,
            streams: self.streams.clone(),
            bytes,
            packets,
            // The sender's TCP_INFO is added by whoever has the sockets (sonde-agent, -client).
            tcp_info: Vec::new(),
            interface: None,
        };
        self.start_ns = end_ns;
        stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn counts_split_at_boundaries() {
        let mut iv = Intervals::new(S, vec![0, 3]);
        assert_eq!(iv.next_boundary_ns(), S);
        assert_eq!(iv.poll(S / 2, &[(100, 1), (0, 0)]), None);
        assert_eq!(iv.poll(S - 1, &[(500, 5), (10, 1)]), None);

        let first = iv.poll(S, &[(1_000, 10), (20, 2)]).unwrap();
        assert_eq!(
            first,
            IntervalStats {
                start_ns: 0,
                end_ns: S,
                streams: vec![0, 3],
                bytes: vec![1_000, 20],
                packets: vec![10, 2],
                tcp_info: Vec::new(),
                interface: None,
            }
        );
        assert_eq!(iv.next_boundary_ns(), 2 * S);
        assert_eq!(
            iv.poll(S + 1, &[(1_000, 10), (20, 2)]),
            None,
            "once per boundary"
        );

        let second = iv.poll(2 * S + 10, &[(1_500, 14), (20, 2)]).unwrap();
        assert_eq!((second.start_ns, second.end_ns), (S, 2 * S));
        assert_eq!(second.bytes, vec![500, 0]);
        assert_eq!(second.packets, vec![4, 0]);
    }

    #[test]
    fn late_poll_returns_one_longer_interval() {
        let mut iv = Intervals::new(S, vec![7]);
        iv.poll(S, &[(10, 1)]).unwrap();
        // Three boundaries (2 s, 3 s, 4 s) pass before the next poll.
        let late = iv.poll(4 * S + S / 2, &[(70, 7)]).unwrap();
        assert_eq!((late.start_ns, late.end_ns), (S, 4 * S));
        assert_eq!((late.bytes[0], late.packets[0]), (60, 6));
        assert_eq!(iv.next_boundary_ns(), 5 * S);
        assert_eq!(iv.poll(4 * S + S / 2 + 1, &[(80, 8)]), None);
    }

    #[test]
    fn finish_closes_the_partial_interval() {
        let mut iv = Intervals::new(S, vec![0]);
        iv.poll(S, &[(10, 1)]).unwrap();
        iv.poll(2 * S, &[(20, 2)]).unwrap();
        let last = iv.finish(2 * S + S / 4, &[(25, 3)]).unwrap();
        assert_eq!((last.start_ns, last.end_ns), (2 * S, 2 * S + S / 4));
        assert_eq!((last.bytes[0], last.packets[0]), (5, 1));
        assert_eq!(iv.finish(2 * S + S / 4, &[(25, 3)]), None, "nothing left");
    }

    #[test]
    fn finish_at_a_boundary_is_empty() {
        let mut iv = Intervals::new(S, vec![0]);
        assert_eq!(iv.finish(0, &[(0, 0)]), None);
        iv.poll(S, &[(10, 1)]).unwrap();
        assert_eq!(iv.finish(S, &[(10, 1)]), None);
    }

    #[test]
    fn finish_after_missed_boundaries_runs_from_the_last_cut() {
        let mut iv = Intervals::new(S, vec![0]);
        let all = iv.finish(2 * S + 1, &[(9, 3)]).unwrap();
        assert_eq!((all.start_ns, all.end_ns), (0, 2 * S + 1));
        assert_eq!(all.bytes, vec![9]);
        // Intervals after a finish stay on the grid.
        assert_eq!(iv.next_boundary_ns(), 3 * S);
    }

    #[test]
    fn no_streams() {
        let mut iv = Intervals::new(S, vec![]);
        let i = iv.poll(S, &[]).unwrap();
        assert!(i.streams.is_empty() && i.bytes.is_empty() && i.packets.is_empty());
    }

    #[test]
    fn end_of_time_does_not_overflow() {
        let mut iv = Intervals::new(u64::MAX / 2 + 1, vec![0]);
        assert!(iv.poll(u64::MAX, &[(1, 1)]).is_some());
        assert_eq!(iv.next_boundary_ns(), u64::MAX);
        assert_eq!(iv.poll(u64::MAX, &[(1, 1)]), None);
    }
}
