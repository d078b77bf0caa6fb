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

/// Tracks a flow's sequence numbers. Memory is bounded: duplicates are recognised within a
/// window of recent sequence numbers (65,536 behind the highest); an older seq is counted as
/// reordered, not duplicate.
#[derive(Debug, Clone)]
pub struct SeqTracker {
    _private: (),
}

impl Default for SeqTracker {
    fn default() -> Self {
        Self::new()
    }
}

impl SeqTracker {
    /// An empty tracker.
    pub fn new() -> Self {
        todo!()
    }
    /// Accounts one arrival.
    pub fn on_packet(&mut self, seq: u64) -> Arrival {
        todo!("{seq}")
    }
    /// Unique datagrams received.
    pub fn received(&self) -> u64 {
        todo!()
    }
    /// Datagrams received more than once (each extra copy counts once).
    pub fn duplicated(&self) -> u64 {
        todo!()
    }
    /// Unique datagrams that arrived after a higher seq.
    pub fn reordered(&self) -> u64 {
        todo!()
    }
    /// The highest seq seen.
    pub fn highest(&self) -> Option<u64> {
        todo!()
    }
    /// Lost, given the sender's count: every seq in `0..sent` that never arrived, including the
    /// ones after the last datagram received.
    pub fn lost(&self, sent: u64) -> u64 {
        todo!("{sent}")
    }
}
