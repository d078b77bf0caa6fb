//! Sequence-number accounting at a receiver: unique, duplicated, reordered, lost.

/// What one arriving datagram was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// First arrival, in order (its seq is above every seq seen before).
    InOrder,
    /// First arrival, but a higher seq had already arrived.
    Reordered,
    /// Seen before.
    Duplicate,
}

/// Sequence numbers remembered behind the highest one (a power of two, so that a seq's bit is
/// at `seq % WINDOW`).
pub const WINDOW: u64 = 65_536;

const WORD_BITS: u64 = u64::BITS as u64;
const WORDS: usize = (WINDOW / WORD_BITS) as usize;

/// Tracks a flow's sequence numbers. Memory is bounded: duplicates are recognised within a
/// window of recent sequence numbers (65,536 behind the highest); an older seq is counted as
/// reordered, not duplicate.
///
/// Precisely, the window is the [`WINDOW`] seqs `highest - 65_535 ..= highest`. A seq below it
/// is counted as a unique, reordered arrival even if it is a copy of one seen long ago: with
/// bounded memory the two cannot be told apart. `on_packet` is O(1) amortised, never allocates,
/// and a hostile jump of the seq (0, then `u64::MAX`) costs at most one pass over the window.
#[derive(Debug, Clone)]
pub struct SeqTracker {
    /// Bit `seq % WINDOW` is set when `seq` (within the window) has arrived.
    seen: Box<[u64]>,
    highest: Option<u64>,
    received: u64,
    duplicated: u64,
    reordered: u64,
}

impl Default for SeqTracker {
    fn default() -> Self {
        Self::new()
    }
}

impl SeqTracker {
    /// An empty tracker.
    pub fn new() -> Self {
        Self {
            seen: vec![0; WORDS].into_boxed_slice(),
            highest: None,
            received: 0,
            duplicated: 0,
            reordered: 0,
        }
    }

    /// Accounts one arrival.
    pub fn on_packet(&mut self, seq: u64) -> Arrival {
        let Some(highest) = self.highest else {
            self.highest = Some(seq);
            self.set(seq);
            self.received += 1;
            return Arrival::InOrder;
        };
        if seq > highest {
            // The window slides forward: forget the seqs it leaves behind, which is the same as
            // clearing the bits of the seqs skipped over (and of `seq` itself).
            self.clear_after(highest, seq - highest);
            self.highest = Some(seq);
            self.set(seq);
            self.received += 1;
            return Arrival::InOrder;
        }
        if highest - seq >= WINDOW {
            // Too old to remember: count it as a late first arrival.
            self.received += 1;
            self.reordered += 1;
            return Arrival::Reordered;
        }
        if self.is_set(seq) {
            self.duplicated += 1;
            Arrival::Duplicate
        } else {
            self.set(seq);
            self.received += 1;
            self.reordered += 1;
            Arrival::Reordered
        }
    }

    /// Unique datagrams received.
    pub fn received(&self) -> u64 {
        self.received
    }

    /// Datagrams received more than once (each extra copy counts once).
    pub fn duplicated(&self) -> u64 {
        self.duplicated
    }

    /// Unique datagrams that arrived after a higher seq.
    pub fn reordered(&self) -> u64 {
        self.reordered
    }

    /// The highest seq seen.
    pub fn highest(&self) -> Option<u64> {
        self.highest
    }

    /// Lost, given the sender's count: every seq in `0..sent` that never arrived, including the
    /// ones after the last datagram received.
    ///
    /// Computed as `sent - received`, saturating at 0: datagrams with a seq at or above `sent`
    /// (which a correct sender never produces) and copies older than the window would hide as
    /// many losses.
    pub fn lost(&self, sent: u64) -> u64 {
        sent.saturating_sub(self.received)
    }

    fn set(&mut self, seq: u64) {
        let bit = seq % WINDOW;
        self.seen[(bit / WORD_BITS) as usize] |= 1 << (bit % WORD_BITS);
    }

    fn is_set(&self, seq: u64) -> bool {
        let bit = seq % WINDOW;
        self.seen[(bit / WORD_BITS) as usize] & (1 << (bit % WORD_BITS)) != 0
    }

    /// Clears the bits of the `count` seqs after `from` (`from + 1 ..= from + count`), a word at a
    /// time; at most the whole window, whatever `count` is.
    fn clear_after(&mut self, from: u64, count: u64) {
        if count >= WINDOW {
            self.seen.fill(0);
            return;
        }
        let mut bit = from.wrapping_add(1) % WINDOW;
        let mut left = count;
        while left > 0 {
            let offset = bit % WORD_BITS;
            let n = left.min(WORD_BITS - offset);
            let mask = if n == WORD_BITS {
                u64::MAX
            } else {
                ((1u64 << n) - 1) << offset
            };
            self.seen[(bit / WORD_BITS) as usize] &= !mask;
            left -= n;
            bit = (bit + n) % WINDOW;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn feed(t: &mut SeqTracker, seqs: &[u64]) -> Vec<Arrival> {
        seqs.iter().map(|&s| t.on_packet(s)).collect()
    }

    #[test]
    fn in_order_stream() {
        let mut t = SeqTracker::new();
        assert_eq!(t.highest(), None);
        for s in 0..10_000 {
            assert_eq!(t.on_packet(s), Arrival::InOrder);
        }
        assert_eq!(t.received(), 10_000);
        assert_eq!((t.duplicated(), t.reordered()), (0, 0));
        assert_eq!(t.highest(), Some(9_999));
        assert_eq!(t.lost(10_000), 0);
    }

    #[test]
    fn loss_in_the_middle_and_at_the_tail() {
        let mut t = SeqTracker::new();
        let seqs: Vec<u64> = (0..100).filter(|s| !(40..45).contains(s)).collect();
        assert!(feed(&mut t, &seqs).iter().all(|&a| a == Arrival::InOrder));
        assert_eq!(t.received(), 95);
        assert_eq!(t.lost(100), 5);
        // The sender sent 10 more that never arrived: they are lost too.
        assert_eq!(t.lost(110), 15);
        assert_eq!(t.reordered(), 0);
    }

    #[test]
    fn lost_saturates_when_more_arrived_than_sent() {
        let mut t = SeqTracker::new();
        feed(&mut t, &[0, 1, 2, 50]);
        assert_eq!(t.lost(3), 0);
        assert_eq!(t.lost(0), 0);
    }

    #[test]
    fn duplicates() {
        let mut t = SeqTracker::new();
        let got = feed(&mut t, &[0, 1, 1, 2, 0, 2, 2]);
        use Arrival::*;
        assert_eq!(
            got,
            [InOrder, InOrder, Duplicate, InOrder, Duplicate, Duplicate, Duplicate]
        );
        assert_eq!((t.received(), t.duplicated(), t.reordered()), (3, 4, 0));
        assert_eq!(t.lost(3), 0);
    }

    #[test]
    fn reordering_and_a_duplicate_of_a_reordered_packet() {
        let mut t = SeqTracker::new();
        use Arrival::*;
        let got = feed(&mut t, &[0, 2, 3, 1, 1, 5, 4]);
        assert_eq!(
            got,
            [InOrder, InOrder, InOrder, Reordered, Duplicate, InOrder, Reordered]
        );
        assert_eq!((t.received(), t.duplicated(), t.reordered()), (6, 1, 2));
        assert_eq!(t.highest(), Some(5));
        assert_eq!(t.lost(6), 0);
    }

    #[test]
    fn first_packet_above_zero_then_the_earlier_ones() {
        let mut t = SeqTracker::new();
        assert_eq!(t.on_packet(10), Arrival::InOrder);
        assert_eq!(t.on_packet(3), Arrival::Reordered);
        assert_eq!(t.on_packet(3), Arrival::Duplicate);
        assert_eq!(t.lost(11), 9);
    }

    #[test]
    fn window_edge() {
        let mut t = SeqTracker::new();
        t.on_packet(0);
        t.on_packet(WINDOW - 1);
        // 0 is still inside the window (highest - 65_535): a copy is recognised.
        assert_eq!(t.on_packet(0), Arrival::Duplicate);
        t.on_packet(WINDOW);
        // Now 0 is older than the window: it cannot be told from a first arrival.
        assert_eq!(t.on_packet(0), Arrival::Reordered);
        assert_eq!(t.on_packet(1), Arrival::Reordered);
        // 1 is just as old: the bitmap slot is shared with WINDOW + 1, which must stay clear.
        assert_eq!(t.on_packet(WINDOW + 1), Arrival::InOrder);
        assert_eq!((t.received(), t.duplicated(), t.reordered()), (6, 1, 2));
    }

    #[test]
    fn packet_older_than_the_window() {
        let mut t = SeqTracker::new();
        for s in 0..200_000 {
            if s != 7 {
                t.on_packet(s);
            }
        }
        assert_eq!(t.on_packet(7), Arrival::Reordered);
        assert_eq!(
            t.on_packet(8),
            Arrival::Reordered,
            "too old to recognise as a copy"
        );
        assert_eq!(t.reordered(), 2);
        assert_eq!(t.duplicated(), 0);
    }

    #[test]
    fn sliding_window_forgets_skipped_seqs() {
        // Fill the ring, then jump by less than a window: the skipped seqs' slots held old seqs
        // and must read as not seen.
        let mut t = SeqTracker::new();
        for s in 0..WINDOW {
            t.on_packet(s);
        }
        assert_eq!(t.on_packet(WINDOW + 1_000), Arrival::InOrder);
        for s in WINDOW..WINDOW + 1_000 {
            assert_eq!(t.on_packet(s), Arrival::Reordered, "seq {s}");
        }
        assert_eq!(t.on_packet(WINDOW + 500), Arrival::Duplicate);
        assert_eq!(
            t.on_packet(1_001),
            Arrival::Duplicate,
            "still in the window"
        );
    }

    #[test]
    fn hostile_jumps_finish_quickly() {
        let start = std::time::Instant::now();
        let mut t = SeqTracker::new();
        use Arrival::*;
        let got = feed(&mut t, &[0, u64::MAX - 1, 5, u64::MAX, u64::MAX - 1]);
        assert_eq!(got, [InOrder, InOrder, Reordered, InOrder, Duplicate]);
        assert_eq!((t.received(), t.duplicated(), t.reordered()), (4, 1, 1));
        assert_eq!(t.highest(), Some(u64::MAX));

        // Ten thousand jumps each larger than the window: each costs one pass at most.
        let mut t = SeqTracker::new();
        let step = u64::MAX / 10_001;
        for i in 0..10_000u64 {
            assert_eq!(t.on_packet(i * step), InOrder);
            assert_eq!(t.on_packet(i * step + 1), InOrder);
        }
        assert_eq!(t.received(), 20_000);
        assert!(start.elapsed() < std::time::Duration::from_secs(2));
    }

    proptest! {
        /// Any arrival order of 0..n, with extra copies, within the window.
        #[test]
        fn permutation_with_duplicates(
            (n, order) in (1u64..2_000).prop_flat_map(|n| {
                let copies = proptest::collection::vec(0..n, 0..(n as usize));
                (Just(n), copies)
            }).prop_flat_map(|(n, extra)| {
                let mut all: Vec<u64> = (0..n).collect();
                all.extend(extra);
                (Just(n), Just(all).prop_shuffle())
            }),
            dropped in proptest::collection::btree_set(0u64..2_000, 0..50),
        ) {
            let arrivals: Vec<u64> = order.iter().copied().filter(|s| !dropped.contains(s)).collect();
            let distinct = (0..n).filter(|s| !dropped.contains(s)).count() as u64;
            let mut t = SeqTracker::new();
            let mut max: Option<u64> = None;
            let mut expected_reordered = 0;
            let mut seen = std::collections::HashSet::new();
            for &s in &arrivals {
                let got = t.on_packet(s);
                let expected = if !seen.insert(s) {
                    Arrival::Duplicate
                } else if max.is_some_and(|m| s < m) {
                    expected_reordered += 1;
                    Arrival::Reordered
                } else {
                    Arrival::InOrder
                };
                prop_assert_eq!(got, expected);
                max = max.max(Some(s));
            }
            prop_assert_eq!(t.received(), distinct);
            prop_assert_eq!(t.duplicated(), arrivals.len() as u64 - distinct);
            prop_assert_eq!(t.reordered(), expected_reordered);
            prop_assert_eq!(t.lost(n), n - distinct);
            prop_assert_eq!(t.highest(), max);
        }

        /// Forward jumps of any size keep the window exact: seqs inside it are remembered,
        /// skipped ones are not.
        #[test]
        fn jumps_keep_the_window_exact(steps in proptest::collection::vec(1u64..200_000, 1..20)) {
            let mut t = SeqTracker::new();
            let mut seq = 0u64;
            let mut sent = vec![0u64];
            t.on_packet(0);
            for step in steps {
                seq += step;
                prop_assert_eq!(t.on_packet(seq), Arrival::InOrder);
                sent.push(seq);
            }
            for &s in sent.iter().rev() {
                if seq - s < WINDOW {
                    prop_assert_eq!(t.on_packet(s), Arrival::Duplicate);
                }
            }
            // A skipped seq just below the highest is new.
            if seq > 0 && !sent.contains(&(seq - 1)) {
                prop_assert_eq!(t.on_packet(seq - 1), Arrival::Reordered);
            }
        }
    }
}
