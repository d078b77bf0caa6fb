//! Receiver intervals: cumulative per-stream counters cut at fixed boundaries.

use sonde_wire::IntervalStats;

/// Cuts cumulative `(bytes, packets)` counters into intervals of `interval_ns`, on the
/// receiver's clock, from an origin at 0 ns.
#[derive(Debug, Clone)]
pub struct Intervals {
    _private: (),
}

impl Intervals {
    /// Intervals of `interval_ns` (> 0) for the given stream indexes.
    pub fn new(interval_ns: u64, streams: Vec<u32>) -> Self {
        todo!("{interval_ns} {streams:?}")
    }
    /// When the next interval ends, ns since the origin.
    pub fn next_boundary_ns(&self) -> u64 {
        todo!()
    }
    /// Called at or after a boundary with the cumulative counters (parallel to the streams given
    /// to `new`): returns the interval that ended, with the counts since the previous one.
    /// Returns `None` before the boundary.
    pub fn poll(&mut self, now_ns: u64, cumulative: &[(u64, u64)]) -> Option<IntervalStats> {
        todo!("{now_ns} {cumulative:?}")
    }
    /// Closes the last, partial interval at `now_ns` (None when it would be empty in time).
    pub fn finish(&mut self, now_ns: u64, cumulative: &[(u64, u64)]) -> Option<IntervalStats> {
        todo!("{now_ns} {cumulative:?}")
    }
}
