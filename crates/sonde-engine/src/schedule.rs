//! The mesh scheduler: when an agent in mesh mode runs a short throughput or pps test to each of
//! its peers. Pure logic on the caller's clock (nanoseconds since an origin the caller chose):
//! the caller asks [`MeshScheduler::poll`] what to start now, tells
//! [`MeshScheduler::finished`] when a test ends, and sleeps until
//! [`MeshScheduler::next_due_ns`]. Nothing here sleeps, spawns or reads a clock, so every rule is
//! tested on a virtual clock.
//!
//! The rules:
//! * each pair (this agent to one peer) gets each kind of test every `every` ± `jitter` (uniform),
//!   the first one at a random point within the first `every` so a mesh that starts at once does
//!   not test all at once;
//! * one test at a time on a pair, whatever its kind, and at most `concurrent` tests from this
//!   agent at once (by default one, so its own tests never compete for its links);
//! * the share of time a pair spends under test, over a sliding window, stays within
//!   `max_share`: a test that would go over it is postponed until enough of the window has
//!   passed;
//! * peers come and go: a new peer is scheduled from the time it is added, a removed one is
//!   forgotten (a test still running to it just ends; its `finished` is ignored).
//!
//! ```
//! use std::time::Duration;
//! use sonde_engine::schedule::{Check, CheckPlan, MeshScheduler, SchedulerConfig};
//!
//! let plan = CheckPlan {
//!     every: Duration::from_secs(600),
//!     jitter: Duration::from_secs(60),
//!     duration: Duration::from_secs(2),
//! };
//! let mut s = MeshScheduler::new(SchedulerConfig::new(Some(plan), None, 0.05), 7);
//! s.set_peers(["b", "c"], 0);
//! let mut now = 0;
//! let mut started = 0;
//! while now < 3_600_000_000_000 {
//!     while let Some(test) = s.poll(now) {
//!         assert_eq!(test.check, Check::Throughput);
//!         started += 1;
//!         s.finished(&test.peer, now + 2_000_000_000);
//!     }
//!     now = s.next_due_ns().unwrap().max(now + 1);
//! }
//! assert!((10..=14).contains(&started)); // about 6 an hour for each of two peers
//! ```

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

/// A kind of scheduled test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Check {
    /// A short throughput test.
    Throughput,
    /// A short packet-rate test.
    Pps,
}

/// How often one kind of test runs to each peer, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckPlan {
    /// Mean interval between two tests of one pair.
    pub every: Duration,
    /// Each interval is `every` plus a uniform random offset in `[-jitter, +jitter]`.
    pub jitter: Duration,
    /// How long one test runs (what the time-share cap counts before it starts).
    pub duration: Duration,
}

/// The scheduler's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct SchedulerConfig {
    /// Throughput tests, if any.
    pub throughput: Option<CheckPlan>,
    /// pps tests, if any.
    pub pps: Option<CheckPlan>,
    /// Largest share of time (0 to 1) one pair may spend under test within `window`.
    pub max_share: f64,
    /// The sliding window `max_share` is counted over.
    pub window: Duration,
    /// Most tests this agent runs at once (to different peers).
    pub concurrent: usize,
}

impl SchedulerConfig {
    /// Settings with the window at 10 times the longest `every` (at least a minute) and one test
    /// at a time.
    pub fn new(throughput: Option<CheckPlan>, pps: Option<CheckPlan>, max_share: f64) -> Self {
        let longest = [throughput, pps]
            .iter()
            .flatten()
            .map(|p| p.every)
            .max()
            .unwrap_or_default();
        Self {
            throughput,
            pps,
            max_share,
            window: (longest * 10).max(Duration::from_secs(60)),
            concurrent: 1,
        }
    }

    /// The most time one pair may spend under test within the window (`max_share` of it): a
    /// test longer than this never fits, so it never runs.
    pub fn allowed(&self) -> Duration {
        Duration::from_nanos(self.allowed_ns())
    }

    fn allowed_ns(&self) -> u64 {
        (self.max_share.clamp(0.0, 1.0) * ns(self.window) as f64).round() as u64
    }

    /// The scheduled tests longer than [`Self::allowed`], which would never run.
    pub fn never_fits(&self) -> impl Iterator<Item = (Check, CheckPlan)> + '_ {
        [Check::Throughput, Check::Pps]
            .into_iter()
            .filter_map(|c| self.plan(c).map(|p| (c, p)))
            .filter(|(_, p)| ns(p.duration) > self.allowed_ns())
    }

    fn plan(&self, check: Check) -> Option<CheckPlan> {
        match check {
            Check::Throughput => self.throughput,
            Check::Pps => self.pps,
        }
    }
}

/// A test [`MeshScheduler::poll`] says to start now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Start<P> {
    /// To which peer.
    pub peer: P,
    /// Which test.
    pub check: Check,
    /// How long it is planned to run.
    pub duration: Duration,
}

#[derive(Debug, Default)]
struct Pair {
    /// When each kind is next due.
    due_ns: BTreeMap<Check, u64>,
    /// Since when a test has been running on this pair.
    running_since_ns: Option<u64>,
    /// Past tests as `(start, end)`, oldest first, within the window.
    history: VecDeque<(u64, u64)>,
}

/// Time under test within `[now - window, now]`, from a pair's history.
fn busy_ns(history: &VecDeque<(u64, u64)>, now_ns: u64, window_ns: u64) -> u64 {
    let from = now_ns.saturating_sub(window_ns);
    history
        .iter()
        .map(|&(s, e)| e.min(now_ns).saturating_sub(s.max(from)))
        .sum()
}

/// The earliest time from `now` at which a test of `duration_ns` keeps the share within
/// `allowed_ns` (the share times the window), assuming no other test in between.
fn fits_from_ns(
    history: &VecDeque<(u64, u64)>,
    now_ns: u64,
    duration_ns: u64,
    window_ns: u64,
    allowed_ns: u64,
) -> u64 {
    // The test occupies [t, t + d]; the window ending at t + d holds what of the history is
    // after t + d - window. Candidates: now, and each moment a past test leaves that window.
    let fits = |t: u64| busy_ns(history, t + duration_ns, window_ns) + duration_ns <= allowed_ns;
    if fits(now_ns) {
        return now_ns;
    }
    for &(_, end) in history {
        let t = (end + window_ns).saturating_sub(duration_ns).max(now_ns);
        if fits(t) {
            return t;
        }
    }
    // Only a test longer than the share itself gets here: it never fits, so it never runs
    // (SchedulerConfig::never_fits; sonde refuses such a mesh file when it loads it).
    u64::MAX
}

/// Which peer gets which test when; see the module documentation.
#[derive(Debug)]
pub struct MeshScheduler<P: Ord + Clone> {
    cfg: SchedulerConfig,
    pairs: BTreeMap<P, Pair>,
    running: usize,
    rng: SplitMix64,
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl<P: Ord + Clone> MeshScheduler<P> {
    /// A scheduler with no peers; `seed` drives the jitter (same seed, same schedule).
    pub fn new(cfg: SchedulerConfig, seed: u64) -> Self {
        Self {
            cfg,
            pairs: BTreeMap::new(),
            running: 0,
            rng: SplitMix64(seed),
        }
    }

    /// Replaces the peer set at `now_ns`: new peers get their first test of each kind at a
    /// random time within one `every`; peers no longer listed are forgotten.
    pub fn set_peers<I: IntoIterator<Item = P>>(&mut self, peers: I, now_ns: u64) {
        let wanted: BTreeMap<P, ()> = peers.into_iter().map(|p| (p, ())).collect();
        let gone: Vec<P> = self
            .pairs
            .keys()
            .filter(|p| !wanted.contains_key(*p))
            .cloned()
            .collect();
        for p in gone {
            if let Some(pair) = self.pairs.remove(&p) {
                if pair.running_since_ns.is_some() {
                    self.running -= 1;
                }
            }
        }
        for (p, ()) in wanted {
            if self.pairs.contains_key(&p) {
                continue;
            }
            let mut pair = Pair::default();
            for check in [Check::Throughput, Check::Pps] {
                if let Some(plan) = self.cfg.plan(check) {
                    let first = self.rng.below(ns(plan.every).max(1));
                    pair.due_ns.insert(check, now_ns.saturating_add(first));
                }
            }
            self.pairs.insert(p, pair);
        }
    }

    /// The peers scheduled now.
    pub fn peers(&self) -> impl Iterator<Item = &P> {
        self.pairs.keys()
    }

    /// Tests running now.
    pub fn running(&self) -> usize {
        self.running
    }

    /// A test to start at `now_ns`, if one is due and allowed; call again until `None`. The
    /// pair counts as under test until [`Self::finished`].
    pub fn poll(&mut self, now_ns: u64) -> Option<Start<P>> {
        if self.running >= self.cfg.concurrent.max(1) {
            return None;
        }
        // A mesh without throughput or pps tests: nothing to look for among its pairs (a walk
        // over 5,000 pairs at every wake-up otherwise).
        if self.cfg.throughput.is_none() && self.cfg.pps.is_none() {
            return None;
        }
        let window_ns = ns(self.cfg.window);
        let allowed_ns = self.cfg.allowed_ns();
        // The most overdue test first, so no pair starves another.
        let mut best: Option<(u64, P, Check)> = None;
        for (peer, pair) in &mut self.pairs {
            if pair.running_since_ns.is_some() {
                continue;
            }
            while pair
                .history
                .front()
                .is_some_and(|&(_, end)| end + window_ns <= now_ns)
            {
                pair.history.pop_front();
            }
            let Pair {
                due_ns, history, ..
            } = pair;
            for (&check, due) in due_ns {
                if *due > now_ns {
                    continue;
                }
                let Some(plan) = self.cfg.plan(check) else {
                    continue;
                };
                let fits = fits_from_ns(history, now_ns, ns(plan.duration), window_ns, allowed_ns);
                if fits > now_ns {
                    // Over the share: postponed, not dropped.
                    *due = fits;
                    continue;
                }
                if best.as_ref().is_none_or(|(d, _, _)| *due < *d) {
                    best = Some((*due, peer.clone(), check));
                }
            }
        }
        let (_, peer, check) = best?;
        let plan = self.cfg.plan(check)?;
        let interval = self.jittered(plan);
        let pair = self.pairs.get_mut(&peer)?;
        pair.running_since_ns = Some(now_ns);
        pair.due_ns.insert(
            check,
            now_ns.saturating_add(interval.max(ns(plan.duration))),
        );
        self.running += 1;
        Some(Start {
            peer,
            check,
            duration: plan.duration,
        })
    }

    /// The test to `peer` ended at `now_ns` (done or failed): the pair is free again and the
    /// time it took counts against its share.
    pub fn finished(&mut self, peer: &P, now_ns: u64) {
        let Some(pair) = self.pairs.get_mut(peer) else {
            return;
        };
        let Some(since) = pair.running_since_ns.take() else {
            return;
        };
        pair.history.push_back((since, now_ns.max(since)));
        self.running -= 1;
    }

    /// When the next test is due (it may still wait for its share then); `None` without peers
    /// or plans, and while this agent runs its most tests at once (the next can start only
    /// after a [`Self::finished`]).
    pub fn next_due_ns(&self) -> Option<u64> {
        if self.running >= self.cfg.concurrent.max(1) {
            return None;
        }
        self.pairs
            .values()
            .filter(|p| p.running_since_ns.is_none())
            .flat_map(|p| p.due_ns.values().copied())
            .min()
    }

    fn jittered(&mut self, plan: CheckPlan) -> u64 {
        let every = ns(plan.every);
        let jitter = ns(plan.jitter).min(every);
        let offset = self.rng.below(2 * jitter + 1);
        (every - jitter).saturating_add(offset)
    }
}

/// A small deterministic generator for the jitter (Steele, Lea and Flood's SplitMix64, as in
/// `java.util.SplittableRandom`): not for anything secret. The mesh prober's too (`probe.rs`:
/// jitter, and nonces that only need to differ; the MAC, not the nonce, is the secret part).
#[derive(Debug, Clone)]
pub(crate) struct SplitMix64(pub(crate) u64);

impl SplitMix64 {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, n)` (n > 0), by multiply-shift; the bias is below 2^-32 for n < 2^32 ns.
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next()) * u128::from(n)) >> 64) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const S: u64 = 1_000_000_000;

    fn plan(every_s: u64, jitter_s: u64, duration_s: u64) -> CheckPlan {
        CheckPlan {
            every: Duration::from_secs(every_s),
            jitter: Duration::from_secs(jitter_s),
            duration: Duration::from_secs(duration_s),
        }
    }

    /// Every test the scheduler starts, as `(peer, check, start, end)`, running each for its
    /// planned duration (plus `overrun` ns) on a virtual clock until `until`.
    fn simulate(
        s: &mut MeshScheduler<u32>,
        from: u64,
        until: u64,
        overrun: u64,
    ) -> Vec<(u32, Check, u64, u64)> {
        let mut now = from;
        let mut ends: Vec<(u64, u32)> = Vec::new();
        let mut log = Vec::new();
        while now < until {
            ends.sort_unstable();
            while ends.first().is_some_and(|&(t, _)| t <= now) {
                let (t, p) = ends.remove(0);
                s.finished(&p, t);
            }
            while let Some(t) = s.poll(now) {
                let end = now + ns(t.duration) + overrun;
                log.push((t.peer, t.check, now, end));
                ends.push((end, t.peer));
            }
            let next_end = ends.iter().map(|&(t, _)| t).min();
            let next = [s.next_due_ns(), next_end].into_iter().flatten().min();
            now = next.unwrap_or(until).max(now + 1);
        }
        log
    }

    #[test]
    fn intervals_stay_within_the_jitter_and_average_every() {
        let mut s = MeshScheduler::new(SchedulerConfig::new(Some(plan(600, 60, 2)), None, 1.0), 1);
        s.set_peers([1], 0);
        let log = simulate(&mut s, 0, 200 * 600 * S, 0);
        let starts: Vec<u64> = log.iter().map(|e| e.2).collect();
        assert!(starts[0] < 600 * S, "first test within one interval");
        let gaps: Vec<u64> = starts.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(gaps.len() > 190);
        assert!(gaps.iter().all(|&g| (540 * S..=660 * S).contains(&g)));
        // Jitter is random, not a constant offset: both halves of the range are used.
        assert!(gaps.iter().any(|&g| g < 570 * S) && gaps.iter().any(|&g| g > 630 * S));
        let mean = gaps.iter().sum::<u64>() / gaps.len() as u64;
        assert!((585 * S..=615 * S).contains(&mean), "mean {mean}");
    }

    #[test]
    fn no_two_tests_on_one_pair_at_once_even_when_they_overrun() {
        let cfg = SchedulerConfig {
            concurrent: 8,
            ..SchedulerConfig::new(Some(plan(10, 9, 2)), Some(plan(10, 9, 2)), 1.0)
        };
        let mut s = MeshScheduler::new(cfg, 2);
        s.set_peers([1, 2, 3], 0);
        // Each test takes 20 s longer than planned: far past the next one's due time.
        let log = simulate(&mut s, 0, 3_600 * S, 20 * S);
        for peer in 1..=3 {
            let mut mine: Vec<_> = log.iter().filter(|e| e.0 == peer).collect();
            mine.sort_by_key(|e| e.2);
            assert!(mine.len() > 10);
            assert!(
                mine.iter().any(|e| e.1 == Check::Pps)
                    && mine.iter().any(|e| e.1 == Check::Throughput)
            );
            for w in mine.windows(2) {
                assert!(w[1].2 >= w[0].3, "overlap on pair {peer}: {w:?}");
            }
        }
        // Different pairs do run at once when allowed.
        let overlapping = log
            .iter()
            .any(|a| log.iter().any(|b| a.0 != b.0 && a.2 < b.3 && b.2 < a.3));
        assert!(overlapping);
    }

    #[test]
    fn one_test_at_a_time_from_the_agent_by_default() {
        let mut s = MeshScheduler::new(SchedulerConfig::new(Some(plan(10, 5, 3)), None, 1.0), 3);
        s.set_peers(0..6, 0);
        let log = simulate(&mut s, 0, 600 * S, 0);
        let mut sorted = log.clone();
        sorted.sort_by_key(|e| e.2);
        for w in sorted.windows(2) {
            assert!(w[1].2 >= w[0].3, "{w:?}");
        }
        for peer in 0..6 {
            assert!(
                log.iter().filter(|e| e.0 == peer).count() > 5,
                "peer {peer} starved"
            );
        }
    }

    /// Time under test on `peer` within every window ending at a test's end.
    fn max_share(log: &[(u32, Check, u64, u64)], peer: u32, window: u64) -> f64 {
        let mine: Vec<_> = log.iter().filter(|e| e.0 == peer).collect();
        mine.iter()
            .map(|e| {
                let to = e.3;
                let from = to.saturating_sub(window);
                let busy: u64 = mine
                    .iter()
                    .map(|o| o.3.min(to).saturating_sub(o.2.max(from)))
                    .sum();
                busy as f64 / window as f64
            })
            .fold(0.0, f64::max)
    }

    #[test]
    fn the_time_share_cap_postpones_tests() {
        // Asked for 2 s every 10 s (20 %) with a 5 % cap over the window of 100 s.
        let cfg = SchedulerConfig::new(Some(plan(10, 2, 2)), None, 0.05);
        assert_eq!(
            cfg.window,
            Duration::from_secs(100).max(Duration::from_secs(60))
        );
        let mut s = MeshScheduler::new(cfg.clone(), 4);
        s.set_peers([7], 0);
        let log = simulate(&mut s, 0, 10_000 * S, 0);
        let share = max_share(&log, 7, ns(cfg.window));
        assert!(share <= 0.05 + 1e-9, "share {share}");
        // Postponed, not dropped: it runs as often as the cap allows, two 2 s tests in each
        // 100 s (a third would make 6 s of the 5 s allowed).
        let n = log.len();
        assert!((190..=200).contains(&n), "{n} tests");
        // Without the cap the same plan runs about 1,000 times.
        let mut free = MeshScheduler::new(SchedulerConfig::new(Some(plan(10, 2, 2)), None, 1.0), 4);
        free.set_peers([7], 0);
        assert!(simulate(&mut free, 0, 10_000 * S, 0).len() > 950);
    }

    #[test]
    fn the_cap_counts_both_kinds_and_overruns() {
        let cfg = SchedulerConfig::new(Some(plan(20, 5, 1)), Some(plan(20, 5, 1)), 0.1);
        let mut s = MeshScheduler::new(cfg.clone(), 5);
        s.set_peers([1], 0);
        let log = simulate(&mut s, 0, 20_000 * S, S);
        assert!(
            log.iter().any(|e| e.1 == Check::Pps) && log.iter().any(|e| e.1 == Check::Throughput)
        );
        // The planned 1 s is what the cap checks before a start; the overrun (2 s in all) is
        // counted once known, so the share may pass the cap by at most one overrun.
        let share = max_share(&log, 1, ns(cfg.window));
        assert!(share <= 0.1 + 1.0 / 200.0 + 1e-9, "share {share}");
    }

    #[test]
    fn peers_added_and_removed() {
        let mut s = MeshScheduler::new(SchedulerConfig::new(Some(plan(60, 10, 2)), None, 1.0), 6);
        s.set_peers([1, 2], 0);
        let first = simulate(&mut s, 0, 1_200 * S, 0);
        assert!(first.iter().all(|e| e.0 == 1 || e.0 == 2));
        // 2 leaves, 3 joins at 1,200 s.
        s.set_peers([1, 3], 1_200 * S);
        assert_eq!(s.peers().copied().collect::<Vec<_>>(), [1, 3]);
        let later = simulate(&mut s, 1_200 * S, 2_400 * S, 0);
        assert!(later.iter().all(|e| e.0 != 2), "removed peer still tested");
        let three: Vec<u64> = later.iter().filter(|e| e.0 == 3).map(|e| e.2).collect();
        assert!(
            three[0] < 1_260 * S + 2 * S,
            "new peer's first test within one every"
        );
        assert!(three.len() >= 17);
        assert!(later.iter().filter(|e| e.0 == 1).count() >= 17);
        // Removed while running: its slot is freed and its late `finished` changes nothing.
        let mut s = MeshScheduler::new(SchedulerConfig::new(Some(plan(1, 0, 5)), None, 1.0), 7);
        s.set_peers([1, 2], 0);
        let t = (0..).find_map(|i| s.poll(i * S)).unwrap();
        assert_eq!(s.running(), 1);
        let other = if t.peer == 1 { 2 } else { 1 };
        s.set_peers([other], 3 * S);
        assert_eq!(s.running(), 0);
        s.finished(&t.peer, 5 * S);
        assert_eq!(s.running(), 0);
        assert_eq!(s.poll(3 * S).map(|t| t.peer), Some(other));
    }

    #[test]
    fn a_test_longer_than_the_share_never_runs_and_is_named() {
        // 5 % of the 100 s window is 5 s: a 6 s test never fits, a 5 s one does.
        let cfg = SchedulerConfig::new(Some(plan(10, 0, 6)), Some(plan(10, 0, 5)), 0.05);
        assert_eq!(cfg.allowed(), Duration::from_secs(5));
        let never: Vec<Check> = cfg.never_fits().map(|(c, _)| c).collect();
        assert_eq!(never, [Check::Throughput]);
        let mut s = MeshScheduler::new(cfg, 8);
        s.set_peers([1], 0);
        let log = simulate(&mut s, 0, 1_000 * S, 0);
        assert!(log.iter().all(|e| e.1 == Check::Pps), "{log:?}");
        assert!(!log.is_empty());
    }

    #[test]
    fn same_seed_same_schedule() {
        let run = |seed| {
            let mut s =
                MeshScheduler::new(SchedulerConfig::new(Some(plan(60, 30, 2)), None, 1.0), seed);
            s.set_peers([1, 2, 3], 0);
            simulate(&mut s, 0, 3_600 * S, 0)
        };
        assert_eq!(run(9), run(9));
        assert_ne!(run(9), run(10));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn rules_hold_for_any_plan(
            every in 2u64..120,
            jitter_frac in 0.0f64..1.0,
            duration in 1u64..10,
            share in 0.01f64..1.0,
            peers in 1u32..6,
            concurrent in 1usize..4,
            overrun in 0u64..3,
            seed: u64,
        ) {
            let jitter = (every as f64 * jitter_frac) as u64;
            let cfg = SchedulerConfig {
                concurrent,
                ..SchedulerConfig::new(Some(plan(every, jitter, duration)), Some(plan(every * 2, jitter, duration)), share)
            };
            let window = ns(cfg.window);
            let mut s = MeshScheduler::new(cfg, seed);
            s.set_peers(0..peers, 0);
            let log = simulate(&mut s, 0, 20 * window, overrun * S);
            let mut all = log.clone();
            all.sort_by_key(|e| e.2);
            for (i, a) in all.iter().enumerate() {
                let at_once = all[..i].iter().filter(|b| b.3 > a.2).count() + 1;
                prop_assert!(at_once <= concurrent);
                prop_assert!(all[..i].iter().all(|b| b.0 != a.0 || b.3 <= a.2));
            }
            for p in 0..peers {
                let cap = share + (overrun as f64 * S as f64) / window as f64 + 1e-9;
                if duration as f64 * S as f64 <= share * window as f64 {
                    prop_assert!(log.iter().any(|e| e.0 == p), "peer {} never tested", p);
                }
                prop_assert!(max_share(&log, p, window) <= cap);
            }
        }
    }
}
