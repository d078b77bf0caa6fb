//! The path MTU search of `sonde mtu`, sans-IO: which IP packet size to probe next, and what a
//! probe's fate says about the path. The caller sends each probe with DF set, waits for the
//! agent's echo (as large, DF too) and tells [`MtuSearch`] what happened.
//!
//! A binary search between the largest size known to cross and the smallest known not to.
//! An echo proves a size crosses. A router's "fragmentation needed" (ICMP type 3 code 4, or
//! ICMPv6 "packet too big") proves it does not, and names the MTU to try next. Silence is weaker
//! evidence: a probe may be lost for any reason, so a size is read as too big by silence only
//! after [`MtuSearch::tries`] silent probes in a row (RFC 4821's packetization-layer probing
//! takes the same view of a lost probe).
//!
//! ```
//! use sonde_engine::mtu::{MtuSearch, ProbeFate};
//! // IPv4, 1,500-byte interface, the path carries 1,400.
//! let mut s = MtuSearch::new(68, 1_500, 2);
//! while let Some(size) = s.next_size() {
//!     let fate = if size <= 1_400 { ProbeFate::Echoed } else { ProbeFate::TooBig(Some(1_400)) };
//!     s.record(size, fate);
//! }
//! assert_eq!(s.largest_crossed(), Some(1_400));
//! ```

/// What became of one probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeFate {
    /// The agent's echo came back: the size crosses both ways.
    Echoed,
    /// No echo within the probe's timeout.
    Silent,
    /// A router (or this host's kernel) said it is too big, with the MTU it named when it
    /// named one.
    TooBig(Option<u32>),
}

/// How the search learnt that sizes above its answer do not cross.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpperBound {
    /// Nothing above the answer was tried: the answer is the search's ceiling (the local
    /// interface's MTU, or the largest UDP datagram).
    Ceiling,
    /// A router's "fragmentation needed" (or this host's kernel refusing the size).
    Reported,
    /// Probes of the size above went unanswered [`MtuSearch::tries`] times: a black hole, or a
    /// path that drops large packets without saying so.
    Silence,
}

/// The search state: sizes are whole IP packets, bytes.
#[derive(Debug, Clone)]
pub struct MtuSearch {
    /// Largest size that crossed (`floor - 1` until one has).
    lo: u32,
    /// Smallest size known not to cross (`ceiling + 1` until one is).
    hi: u32,
    floor: u32,
    ceiling: u32,
    tries: u32,
    /// Silent probes in a row of `pending`.
    silent: u32,
    /// The size being probed, and a size a router named to try next.
    pending: Option<u32>,
    hint: Option<u32>,
    bound: UpperBound,
    floor_checked: bool,
}

impl MtuSearch {
    /// A search for the largest size in `floor..=ceiling` that crosses, reading a size as too
    /// big by silence after `tries` silent probes (at least 1). The floor is probed first (it
    /// must cross, or nothing does), then the ceiling.
    #[must_use]
    pub fn new(floor: u32, ceiling: u32, tries: u32) -> Self {
        let floor = floor.max(1);
        let ceiling = ceiling.max(floor);
        Self {
            lo: floor - 1,
            hi: ceiling.saturating_add(1),
            floor,
            ceiling,
            tries: tries.max(1),
            silent: 0,
            pending: None,
            hint: None,
            bound: UpperBound::Ceiling,
            floor_checked: false,
        }
    }

    /// Silent probes of one size before it is read as too big.
    #[must_use]
    pub fn tries(&self) -> u32 {
        self.tries
    }

    /// The size to probe next; `None` when the search is over.
    pub fn next_size(&mut self) -> Option<u32> {
        if let Some(p) = self.pending {
            return Some(p);
        }
        if self.done() {
            return None;
        }
        let size = if self.floor_checked {
            match self.hint.take().filter(|&h| h > self.lo && h < self.hi) {
                Some(h) => h,
                // The ceiling first: most paths carry the interface's MTU.
                None if self.hi == self.ceiling.saturating_add(1) => self.ceiling,
                None => self.lo + (self.hi - self.lo) / 2,
            }
        } else {
            self.floor
        };
        self.pending = Some(size);
        Some(size)
    }

    /// Whether the search is over: the answer is known, or the floor did not cross.
    #[must_use]
    pub fn done(&self) -> bool {
        self.pending.is_none()
            && (self.hi <= self.lo.saturating_add(1)
                || (self.floor_checked && self.lo < self.floor))
    }

    /// What became of a probe of `size` (the one [`next_size`](Self::next_size) gave; an
    /// answer for another size, a late echo, only moves the bounds).
    pub fn record(&mut self, size: u32, fate: ProbeFate) {
        let current = self.pending == Some(size);
        match fate {
            ProbeFate::Echoed => {
                if size > self.lo && size < self.hi {
                    self.lo = size;
                }
                if current {
                    self.settle();
                }
            }
            ProbeFate::TooBig(named) => {
                if size < self.hi && size > self.lo {
                    self.hi = size;
                    self.bound = UpperBound::Reported;
                }
                // A router names the MTU of its next hop: taken at its word as the bound
                // (anything above it meets the same router), and the size to try next.
                if let Some(m) = named.filter(|&m| m > self.lo && m < self.hi) {
                    self.hi = m + 1;
                    self.bound = UpperBound::Reported;
                    self.hint = Some(m);
                }
                if current {
                    self.settle();
                }
            }
            ProbeFate::Silent if current => {
                self.silent += 1;
                if self.silent >= self.tries {
                    if size < self.hi && size > self.lo {
                        self.hi = size;
                        self.bound = UpperBound::Silence;
                    }
                    self.settle();
                }
            }
            ProbeFate::Silent => {}
        }
    }

    fn settle(&mut self) {
        if self.pending == Some(self.floor) {
            self.floor_checked = true;
        }
        self.pending = None;
        self.silent = 0;
    }

    /// The largest size that crossed; `None` when none did (the floor went unanswered).
    #[must_use]
    pub fn largest_crossed(&self) -> Option<u32> {
        (self.lo >= self.floor).then_some(self.lo)
    }

    /// The smallest size known not to cross; `None` when the ceiling crossed (or was never
    /// refused).
    #[must_use]
    pub fn smallest_refused(&self) -> Option<u32> {
        (self.hi <= self.ceiling).then_some(self.hi)
    }

    /// How the bound above the answer was learnt.
    #[must_use]
    pub fn upper_bound(&self) -> UpperBound {
        if self.hi > self.ceiling {
            UpperBound::Ceiling
        } else {
            self.bound
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs a search against a path of MTU `mtu`: echoes at or below, `above` for the rest;
    /// the probes sent.
    fn run(s: &mut MtuSearch, mtu: u32, above: ProbeFate) -> Vec<u32> {
        let mut sent = Vec::new();
        while let Some(size) = s.next_size() {
            sent.push(size);
            assert!(sent.len() < 200, "the search does not end: {sent:?}");
            s.record(
                size,
                if size <= mtu {
                    ProbeFate::Echoed
                } else {
                    above
                },
            );
        }
        sent
    }

    #[test]
    fn a_router_that_names_the_mtu_ends_the_search_in_three_probes() {
        let mut s = MtuSearch::new(68, 1_500, 3);
        let sent = run(&mut s, 1_400, ProbeFate::TooBig(Some(1_400)));
        assert_eq!(sent, [68, 1_500, 1_400]);
        assert_eq!(s.largest_crossed(), Some(1_400));
        // The router's word: 1,401 is not probed.
        assert_eq!(s.smallest_refused(), Some(1_401));
        assert_eq!(s.upper_bound(), UpperBound::Reported);
    }

    #[test]
    fn silence_is_searched_by_halves_each_size_tried_three_times() {
        let mut s = MtuSearch::new(1_280, 1_500, 3);
        let sent = run(&mut s, 1_400, ProbeFate::Silent);
        assert_eq!(s.largest_crossed(), Some(1_400));
        assert_eq!(s.smallest_refused(), Some(1_401));
        assert_eq!(s.upper_bound(), UpperBound::Silence);
        // Each size above 1,400 was tried three times, each at or below once.
        for size in &sent {
            let n = sent.iter().filter(|s| *s == size).count();
            assert_eq!(n, if *size > 1_400 { 3 } else { 1 }, "{size} in {sent:?}");
        }
    }

    #[test]
    fn a_path_that_carries_the_ceiling_takes_two_probes() {
        let mut s = MtuSearch::new(68, 65_535, 3);
        assert_eq!(run(&mut s, 65_535, ProbeFate::Silent), [68, 65_535]);
        assert_eq!(s.largest_crossed(), Some(65_535));
        assert_eq!(s.smallest_refused(), None);
        assert_eq!(s.upper_bound(), UpperBound::Ceiling);
    }

    #[test]
    fn one_lost_probe_is_not_read_as_too_big() {
        let mut s = MtuSearch::new(68, 1_500, 3);
        assert_eq!(s.next_size(), Some(68));
        s.record(68, ProbeFate::Echoed);
        assert_eq!(s.next_size(), Some(1_500));
        s.record(1_500, ProbeFate::Silent);
        // Tried again, and this time it crosses.
        assert_eq!(s.next_size(), Some(1_500));
        s.record(1_500, ProbeFate::Echoed);
        assert_eq!(s.next_size(), None);
        assert_eq!(s.largest_crossed(), Some(1_500));
    }

    #[test]
    fn nothing_crosses_when_the_floor_is_silent() {
        let mut s = MtuSearch::new(1_280, 1_500, 2);
        let sent = run(&mut s, 0, ProbeFate::Silent);
        assert_eq!(sent, [1_280, 1_280]);
        assert_eq!(s.largest_crossed(), None);
        assert!(s.done());
    }

    #[test]
    fn a_wrong_hint_and_a_late_echo_still_converge() {
        let mut s = MtuSearch::new(68, 9_000, 2);
        // The router names a size that itself does not cross (a second, smaller hop).
        let mut sent = Vec::new();
        while let Some(size) = s.next_size() {
            sent.push(size);
            assert!(sent.len() < 100);
            let fate = match size {
                ..=1_400 => ProbeFate::Echoed,
                1_401..=1_500 => ProbeFate::TooBig(Some(1_400)),
                _ => ProbeFate::TooBig(Some(1_500)),
            };
            s.record(size, fate);
        }
        assert_eq!(sent, [68, 9_000, 1_500, 1_400]);
        assert_eq!(s.largest_crossed(), Some(1_400));
        // A late echo of a size above the answer does not move a settled search below it.
        s.record(1_300, ProbeFate::Echoed);
        assert_eq!(s.largest_crossed(), Some(1_400));
    }

    #[test]
    fn every_mtu_is_found_exactly() {
        for mtu in [68, 69, 576, 1_279, 1_280, 1_400, 1_499, 1_500, 8_999, 9_000] {
            let mut s = MtuSearch::new(68, 9_000, 1);
            let sent = run(&mut s, mtu, ProbeFate::Silent);
            assert_eq!(s.largest_crossed(), Some(mtu), "{mtu}");
            assert!(sent.len() <= 16, "{mtu}: {sent:?}");
        }
    }
}
