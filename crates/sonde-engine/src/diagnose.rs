//! Where is the fault (`sonde mesh diagnose`): from each (source, target) pair's p99 RTT, loss
//! and reachability over a window, which pairs are bad, and which one cause explains them best.
//!
//! A pair is bad when its target was unreachable for part of the window (`down`), when it lost
//! at least [`Thresholds::loss_ratio`] of its probes and at least [`Thresholds::min_lost`] of
//! them (so three lost probes out of 300 count, one out of 20 does not), or when its p99 RTT is
//! above both [`Thresholds::rtt_factor`] times the baseline and the baseline plus
//! [`Thresholds::rtt_excess`]. The baseline is the lower quartile of every pair's p99: a typical
//! healthy pair even when a fault makes half the pairs slow (a rack's uplink in a mesh of two
//! racks touches just over half of them).
//!
//! Each candidate cause is a set of pairs: a source host's row, a target host's column, a host's
//! cross (its row and column: a host bad both ways), a group's boundary (every pair with exactly
//! one end in the group: what a rack's uplink or a zone's link carries). A candidate's score is
//! the F0.5 of "the pairs it names" against "the pairs that are bad" (the F-measure weighing
//! precision twice as much as recall): 1 when it names exactly the bad pairs, lower for each
//! good pair it names (precision) and each bad pair it leaves out (recall). Precision weighs
//! more because on a busy network unrelated bad pairs (noise) lower every candidate's recall
//! alike, and a wide candidate (a rack) collects some of them: a host all of whose pairs are
//! bad must still beat its rack, of which only that host's pairs are (in the lab, a host with
//! 1% loss among 22 noisy pairs scored 0.59 against its rack's 0.54 by F1; by F0.5, 0.78
//! against 0.55). So a bad row outscores the cross of its host (half of the cross is good), a cross
//! outscores its row (which leaves half the bad pairs out), and a rack whose uplink is slow
//! outscores each of its hosts. Pairs without data (no series in the window: an agent that is
//! not running exports nothing as a source) are in no set, good or bad. A group is a candidate
//! only with at least [`Thresholds::min_group`] members and one host outside it: a group of one
//! is its host's cross.
//!
//! ```
//! use std::collections::BTreeMap;
//! use std::time::Duration;
//! use sonde_engine::diagnose::{diagnose, PairStats, SuspectKind, Thresholds};
//!
//! let hosts = ["a", "b", "c", "d"];
//! let mut pairs = BTreeMap::new();
//! for s in hosts {
//!     for t in hosts.iter().filter(|t| **t != s) {
//!         // c's answers are slow: the column of c.
//!         let ms = if *t == "c" { 40 } else { 1 };
//!         pairs.insert((s.to_owned(), t.to_string()), PairStats {
//!             p99_rtt: Some(Duration::from_millis(ms)),
//!             sent: Some(1000.0),
//!             lost: Some(0.0),
//!             up_fraction: Some(1.0),
//!         });
//!     }
//! }
//! let d = diagnose(&pairs, &BTreeMap::new(), &Thresholds::default());
//! assert_eq!(d.suspects[0].kind, SuspectKind::Target("c".into()));
//! assert_eq!((d.suspects[0].bad_pairs, d.suspects[0].pairs), (3, 3));
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// What the mesh measured for one (source, target) pair over the window. `None`: no series.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PairStats {
    /// The p99 RTT (both protocols unless the caller filtered one).
    pub p99_rtt: Option<Duration>,
    /// Probes sent in the window (a counter's increase: not always a whole number).
    pub sent: Option<f64>,
    /// Probes lost in the window.
    pub lost: Option<f64>,
    /// The share of the window the target was reachable (`sonde_peer_up` averaged), 0 to 1.
    pub up_fraction: Option<f64>,
}

impl PairStats {
    /// The share of probes lost, when any were sent.
    pub fn loss_ratio(&self) -> Option<f64> {
        match (self.sent, self.lost) {
            (Some(sent), Some(lost)) if sent > 0.0 => Some((lost / sent).clamp(0.0, 1.0)),
            _ => None,
        }
    }

    fn has_data(&self) -> bool {
        self.p99_rtt.is_some() || self.loss_ratio().is_some() || self.up_fraction.is_some()
    }
}

/// When a pair counts as bad.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Thresholds {
    /// A p99 at least this many times the baseline (and [`Thresholds::rtt_excess`] above it).
    pub rtt_factor: f64,
    /// A p99 at least this much above the baseline (and [`Thresholds::rtt_factor`] times it):
    /// keeps microsecond jitter on a fast network from reading as a fault.
    pub rtt_excess: Duration,
    /// A loss ratio at least this (0 to 1) ...
    pub loss_ratio: f64,
    /// ... over at least this many lost probes.
    pub min_lost: f64,
    /// Reachable for less than this share of the window: down.
    pub min_up: f64,
    /// The fewest members a group needs to be a suspect of its own.
    pub min_group: usize,
}

impl Default for Thresholds {
    fn default() -> Thresholds {
        Thresholds {
            rtt_factor: 3.0,
            rtt_excess: Duration::from_millis(1),
            loss_ratio: 0.005,
            min_lost: 3.0,
            min_up: 0.99,
            min_group: 2,
        }
    }
}

/// Why a pair is bad (any of the three), or that it is not.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Verdict {
    /// p99 RTT over the thresholds.
    pub slow: bool,
    /// Loss over the thresholds.
    pub lossy: bool,
    /// The target unreachable for part of the window.
    pub down: bool,
}

impl Verdict {
    /// Any of the three.
    pub fn bad(&self) -> bool {
        self.slow || self.lossy || self.down
    }
}

/// One cell of the heatmap.
#[derive(Debug, Clone, PartialEq)]
pub struct Cell {
    /// The measuring host.
    pub source: String,
    /// The measured host.
    pub target: String,
    /// What was measured.
    pub stats: PairStats,
    /// Whether it is bad, and why.
    pub verdict: Verdict,
}

/// What a suspect is.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum SuspectKind {
    /// A host whose outgoing pairs (its row) are bad: its own sending or receive path back.
    Source(String),
    /// A host whose incoming pairs (its column) are bad: it answers badly, or not at all.
    Target(String),
    /// A host bad both ways (its row and its column).
    Cross(String),
    /// A group (rack, zone) whose pairs to and from every other group are bad.
    Group(String),
}

impl SuspectKind {
    /// The host or group named.
    pub fn name(&self) -> &str {
        match self {
            SuspectKind::Source(n)
            | SuspectKind::Target(n)
            | SuspectKind::Cross(n)
            | SuspectKind::Group(n) => n,
        }
    }

    /// `source`, `target`, `cross` or `group`.
    pub fn label(&self) -> &'static str {
        match self {
            SuspectKind::Source(_) => "source",
            SuspectKind::Target(_) => "target",
            SuspectKind::Cross(_) => "cross",
            SuspectKind::Group(_) => "group",
        }
    }

    /// Simpler explanations first when two score alike.
    fn rank(&self) -> u8 {
        match self {
            SuspectKind::Source(_) => 0,
            SuspectKind::Target(_) => 1,
            SuspectKind::Cross(_) => 2,
            SuspectKind::Group(_) => 3,
        }
    }
}

/// A candidate cause with its evidence.
#[derive(Debug, Clone, PartialEq)]
pub struct Suspect {
    /// The host or group, and how it is suspected.
    pub kind: SuspectKind,
    /// F0.5 of its pairs against the bad pairs: 0 to 1, 1 when it explains exactly them.
    pub score: f64,
    /// Its pairs with data.
    pub pairs: usize,
    /// Of those, the bad ones.
    pub bad_pairs: usize,
    /// Of the bad ones: slow, lossy, down.
    pub slow_pairs: usize,
    /// Lossy bad pairs.
    pub lossy_pairs: usize,
    /// Pairs whose target was down.
    pub down_pairs: usize,
    /// The median p99 RTT of its bad pairs that have one.
    pub median_bad_p99: Option<Duration>,
    /// The median loss ratio of its bad pairs that have one.
    pub median_bad_loss: Option<f64>,
    /// For a host: no pair with it as the source had data (is its agent running?).
    pub silent_as_source: bool,
}

/// The heatmap and the ranked suspects.
#[derive(Debug, Clone, PartialEq)]
pub struct Diagnosis {
    /// Every host named as a source or a target, sorted.
    pub hosts: Vec<String>,
    /// The typical healthy p99 (lower quartile of every pair's p99).
    pub baseline_p99: Option<Duration>,
    /// Every pair with data, by source then target.
    pub cells: Vec<Cell>,
    /// Bad pairs among the cells.
    pub bad_pairs: usize,
    /// Best first; only those that name at least one bad pair.
    pub suspects: Vec<Suspect>,
}

/// Judges every pair and ranks the suspects. `groups` maps a host to its group (hosts absent
/// from it are in no group).
pub fn diagnose(
    pairs: &BTreeMap<(String, String), PairStats>,
    groups: &BTreeMap<String, String>,
    th: &Thresholds,
) -> Diagnosis {
    let mut hosts = BTreeSet::new();
    for (s, t) in pairs.keys() {
        hosts.insert(s.clone());
        hosts.insert(t.clone());
    }
    let mut p99s: Vec<Duration> = pairs.values().filter_map(|p| p.p99_rtt).collect();
    p99s.sort_unstable();
    let baseline_p99 = (!p99s.is_empty()).then(|| p99s[(p99s.len() - 1) / 4]);
    let cells: Vec<Cell> = pairs
        .iter()
        .filter(|(_, stats)| stats.has_data())
        .map(|((s, t), stats)| Cell {
            source: s.clone(),
            target: t.clone(),
            stats: *stats,
            verdict: judge(stats, baseline_p99, th),
        })
        .collect();
    let bad_total = cells.iter().filter(|c| c.verdict.bad()).count();

    // Each candidate's pairs, as indices into `cells`: a host's row and column from one pass
    // (O(cells), not O(hosts x cells): a mesh of thousands of hosts is diagnosed in a blink).
    let mut rows: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    let mut cols: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, c) in cells.iter().enumerate() {
        rows.entry(c.source.as_str()).or_default().push(i);
        cols.entry(c.target.as_str()).or_default().push(i);
    }
    let mut candidates: Vec<(SuspectKind, Vec<usize>)> = Vec::new();
    for h in &hosts {
        let row = rows.get(h.as_str()).cloned().unwrap_or_default();
        let col = cols.get(h.as_str()).cloned().unwrap_or_default();
        let mut cross: Vec<usize> = row.iter().chain(&col).copied().collect();
        cross.sort_unstable();
        cross.dedup();
        candidates.push((SuspectKind::Source(h.clone()), row));
        candidates.push((SuspectKind::Target(h.clone()), col));
        candidates.push((SuspectKind::Cross(h.clone()), cross));
    }
    let mut members: BTreeMap<&str, usize> = BTreeMap::new();
    for h in &hosts {
        if let Some(g) = groups.get(h) {
            *members.entry(g).or_default() += 1;
        }
    }
    for (g, n) in members {
        if n < th.min_group.max(2) || n == hosts.len() {
            continue;
        }
        let in_g = |h: &str| groups.get(h).is_some_and(|x| x == g);
        let boundary = (0..cells.len())
            .filter(|&i| in_g(&cells[i].source) != in_g(&cells[i].target))
            .collect();
        candidates.push((SuspectKind::Group(g.to_owned()), boundary));
    }

    let mut suspects: Vec<Suspect> = candidates
        .into_iter()
        .filter_map(|(kind, named)| {
            let set: Vec<&Cell> = named.iter().map(|&i| &cells[i]).collect();
            let bad: Vec<&Cell> = set.iter().copied().filter(|c| c.verdict.bad()).collect();
            if bad.is_empty() {
                return None;
            }
            let precision = bad.len() as f64 / set.len() as f64;
            let recall = bad.len() as f64 / bad_total as f64;
            let silent_as_source = match &kind {
                SuspectKind::Group(_) => false,
                k => !rows.contains_key(k.name()),
            };
            let mut bad_p99: Vec<Duration> = bad.iter().filter_map(|c| c.stats.p99_rtt).collect();
            bad_p99.sort_unstable();
            let mut bad_loss: Vec<f64> = bad.iter().filter_map(|c| c.stats.loss_ratio()).collect();
            bad_loss.sort_by(f64::total_cmp);
            Some(Suspect {
                score: f_half(precision, recall),
                pairs: set.len(),
                bad_pairs: bad.len(),
                slow_pairs: bad.iter().filter(|c| c.verdict.slow).count(),
                lossy_pairs: bad.iter().filter(|c| c.verdict.lossy).count(),
                down_pairs: bad.iter().filter(|c| c.verdict.down).count(),
                median_bad_p99: median(&bad_p99).copied(),
                median_bad_loss: median(&bad_loss).copied(),
                silent_as_source,
                kind,
            })
        })
        .collect();
    // Best score first; at a tie the one naming fewer pairs (the narrower explanation), then
    // the simpler kind, then the name (a stable order).
    suspects.sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then(a.pairs.cmp(&b.pairs))
            .then(a.kind.rank().cmp(&b.kind.rank()))
            .then(a.kind.cmp(&b.kind))
    });
    Diagnosis {
        hosts: hosts.into_iter().collect(),
        baseline_p99,
        cells,
        bad_pairs: bad_total,
        suspects,
    }
}

/// The pairs between two groups (or inside one), as the group matrix shows them: a rack whose
/// uplink is bad is a bad row and column of this matrix, readable at any host count.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupCell {
    /// The sources' group.
    pub source: String,
    /// The targets' group.
    pub target: String,
    /// Pairs with data from a host of `source` to a host of `target`.
    pub pairs: usize,
    /// Bad pairs among them.
    pub bad_pairs: usize,
    /// The median of their p99 RTTs (pairs without one left out).
    pub median_p99: Option<Duration>,
    /// Their probes lost over their probes sent, pooled (`None` when none was sent).
    pub loss_ratio: Option<f64>,
}

/// The diagnosis's cells pooled by the groups of their ends, by source group then target group.
/// Pairs with an end in no group are left out; a group's own pairs (both ends in it) are its
/// diagonal cell.
pub fn group_matrix(d: &Diagnosis, groups: &BTreeMap<String, String>) -> Vec<GroupCell> {
    #[derive(Default)]
    struct Pool {
        pairs: usize,
        bad: usize,
        p99: Vec<Duration>,
        sent: f64,
        lost: f64,
    }
    let mut pools: BTreeMap<(&str, &str), Pool> = BTreeMap::new();
    for c in &d.cells {
        let (Some(gs), Some(gt)) = (groups.get(&c.source), groups.get(&c.target)) else {
            continue;
        };
        let p = pools.entry((gs.as_str(), gt.as_str())).or_default();
        p.pairs += 1;
        p.bad += usize::from(c.verdict.bad());
        p.p99.extend(c.stats.p99_rtt);
        if let (Some(sent), Some(lost)) = (c.stats.sent, c.stats.lost) {
            p.sent += sent;
            p.lost += lost;
        }
    }
    pools
        .into_iter()
        .map(|((s, t), mut p)| {
            p.p99.sort_unstable();
            GroupCell {
                source: s.to_owned(),
                target: t.to_owned(),
                pairs: p.pairs,
                bad_pairs: p.bad,
                median_p99: median(&p.p99).copied(),
                loss_ratio: (p.sent > 0.0).then(|| (p.lost / p.sent).clamp(0.0, 1.0)),
            }
        })
        .collect()
}

/// The F-measure with beta = 0.5: precision weighs twice as much as recall.
fn f_half(precision: f64, recall: f64) -> f64 {
    const BETA2: f64 = 0.25;
    (1.0 + BETA2) * precision * recall / (BETA2 * precision + recall)
}

fn judge(stats: &PairStats, baseline: Option<Duration>, th: &Thresholds) -> Verdict {
    let slow = match (stats.p99_rtt, baseline) {
        (Some(p99), Some(base)) => {
            p99.as_secs_f64() >= base.as_secs_f64() * th.rtt_factor
                && p99 >= base.saturating_add(th.rtt_excess)
        }
        _ => false,
    };
    let lossy = match (stats.loss_ratio(), stats.lost) {
        (Some(ratio), Some(lost)) => ratio >= th.loss_ratio && lost >= th.min_lost,
        _ => false,
    };
    let down = stats.up_fraction.is_some_and(|up| up < th.min_up);
    Verdict { slow, lossy, down }
}

fn median<T>(sorted: &[T]) -> Option<&T> {
    sorted.get(sorted.len().checked_sub(1)? / 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOSTS: usize = 9;

    fn host(i: usize) -> String {
        format!("h{i}")
    }

    /// Racks of three: h0-h2 in r0, h3-h5 in r1, h6-h8 in r2.
    fn racks() -> BTreeMap<String, String> {
        (0..HOSTS)
            .map(|i| (host(i), format!("r{}", i / 3)))
            .collect()
    }

    fn healthy(noise: u64) -> PairStats {
        PairStats {
            // 200 to 290 us: the jitter of a healthy network.
            p99_rtt: Some(Duration::from_micros(200 + noise % 10 * 10)),
            sent: Some(600.0),
            lost: Some(0.0),
            up_fraction: Some(1.0),
        }
    }

    /// The full mesh of `HOSTS`, each pair as `f(source, target)` makes it.
    fn mesh(f: impl Fn(usize, usize) -> PairStats) -> BTreeMap<(String, String), PairStats> {
        let mut m = BTreeMap::new();
        for s in 0..HOSTS {
            for t in (0..HOSTS).filter(|t| *t != s) {
                m.insert((host(s), host(t)), f(s, t));
            }
        }
        m
    }

    fn slow(mut p: PairStats) -> PairStats {
        p.p99_rtt = Some(Duration::from_millis(30));
        p
    }

    fn lossy(mut p: PairStats) -> PairStats {
        p.lost = Some(12.0); // 2 %
        p
    }

    #[test]
    fn the_group_matrix_pools_pairs_by_the_groups_of_their_ends() {
        // Rack r1's uplink is slow: every pair with one end in r1 and one outside.
        let m = mesh(|s, t| {
            let p = healthy((s * 7 + t) as u64);
            if (s / 3 == 1) != (t / 3 == 1) {
                slow(p)
            } else {
                p
            }
        });
        let mut groups = racks();
        groups.remove("h8"); // a host in no group: its pairs are in no cell
        let d = diagnose(&m, &groups, &Thresholds::default());
        let g = group_matrix(&d, &groups);
        let cell = |s: &str, t: &str| g.iter().find(|c| c.source == s && c.target == t).unwrap();
        assert_eq!(g.len(), 9, "3 x 3 groups");
        // r0 to r1: 3 x 3 pairs, all slow; r1's own pairs 3 x 2, none.
        assert_eq!((cell("r0", "r1").pairs, cell("r0", "r1").bad_pairs), (9, 9));
        assert_eq!((cell("r1", "r1").pairs, cell("r1", "r1").bad_pairs), (6, 0));
        // r2 without h8: 2 hosts, 2 x 1 pairs inside, 2 x 3 to r0.
        assert_eq!((cell("r2", "r2").pairs, cell("r2", "r0").pairs), (2, 6));
        assert_eq!(cell("r2", "r1").median_p99, Some(Duration::from_millis(30)));
        assert_eq!(cell("r0", "r2").loss_ratio, Some(0.0));
        let total: usize = g.iter().map(|c| c.pairs).sum();
        assert_eq!(total, 8 * 7, "every pair between grouped hosts, once");
    }

    fn first(d: &Diagnosis) -> &Suspect {
        d.suspects.first().expect("a suspect")
    }

    #[test]
    fn a_bad_row_names_its_source() {
        let d = diagnose(
            &mesh(|s, t| {
                if s == 4 {
                    lossy(healthy((s * t) as u64))
                } else {
                    healthy((s + t) as u64)
                }
            }),
            &racks(),
            &Thresholds::default(),
        );
        assert_eq!(first(&d).kind, SuspectKind::Source(host(4)));
        assert_eq!((first(&d).bad_pairs, first(&d).pairs), (8, 8));
        assert_eq!(first(&d).lossy_pairs, 8);
        assert!((first(&d).median_bad_loss.unwrap() - 0.02).abs() < 1e-9);
        assert!((first(&d).score - 1.0).abs() < 1e-9);
        // The cross of h4 is second: half of it is good.
        assert_eq!(d.suspects[1].kind, SuspectKind::Cross(host(4)));
        assert!(d.suspects[1].score < 0.7);
    }

    #[test]
    fn a_bad_column_names_its_target() {
        let d = diagnose(
            &mesh(|s, t| {
                if t == 7 {
                    slow(healthy(s as u64))
                } else {
                    healthy(t as u64)
                }
            }),
            &racks(),
            &Thresholds::default(),
        );
        assert_eq!(first(&d).kind, SuspectKind::Target(host(7)));
        assert_eq!(first(&d).slow_pairs, 8);
        assert_eq!(first(&d).median_bad_p99, Some(Duration::from_millis(30)));
        assert_eq!(
            d.baseline_p99.map(|b| b < Duration::from_micros(300)),
            Some(true)
        );
    }

    #[test]
    fn a_host_bad_both_ways_is_a_cross() {
        let d = diagnose(
            &mesh(|s, t| {
                if s == 2 || t == 2 {
                    lossy(healthy(0))
                } else {
                    healthy(0)
                }
            }),
            &racks(),
            &Thresholds::default(),
        );
        assert_eq!(first(&d).kind, SuspectKind::Cross(host(2)));
        assert_eq!((first(&d).bad_pairs, first(&d).pairs), (16, 16));
        // Its rack is not blamed: two of its three hosts are fine.
        let rack = d
            .suspects
            .iter()
            .find(|s| s.kind == SuspectKind::Group("r0".into()));
        assert!(rack.is_none_or(|r| r.score < 0.6), "{rack:?}");
    }

    #[test]
    fn a_slow_uplink_names_its_rack_not_its_hosts() {
        // Every pair with one end in r1 crosses r1's uplink; pairs inside r1 do not.
        let in_r1 = |h: usize| (3..6).contains(&h);
        let d = diagnose(
            &mesh(|s, t| {
                if in_r1(s) != in_r1(t) {
                    slow(healthy(0))
                } else {
                    healthy(s as u64)
                }
            }),
            &racks(),
            &Thresholds::default(),
        );
        assert_eq!(first(&d).kind, SuspectKind::Group("r1".into()));
        assert_eq!((first(&d).bad_pairs, first(&d).pairs), (36, 36));
        // Half the pairs are slow, yet the baseline is still a healthy pair's.
        assert!(d.baseline_p99.unwrap() < Duration::from_millis(1));
        assert_eq!(d.bad_pairs, 36);
    }

    #[test]
    fn groups_too_small_to_tell_are_not_suspects() {
        let in_r1 = |h: usize| (3..6).contains(&h);
        let th = Thresholds {
            min_group: 4,
            ..Thresholds::default()
        };
        let d = diagnose(
            &mesh(|s, t| {
                if in_r1(s) != in_r1(t) {
                    slow(healthy(0))
                } else {
                    healthy(0)
                }
            }),
            &racks(),
            &th,
        );
        assert!(d
            .suspects
            .iter()
            .all(|s| !matches!(s.kind, SuspectKind::Group(_))));
        // A group that is the whole mesh tells nothing either.
        let one: BTreeMap<String, String> = (0..HOSTS).map(|i| (host(i), "all".into())).collect();
        let d = diagnose(
            &mesh(|_, t| if t == 1 { slow(healthy(0)) } else { healthy(0) }),
            &one,
            &Thresholds::default(),
        );
        assert!(d
            .suspects
            .iter()
            .all(|s| !matches!(s.kind, SuspectKind::Group(_))));
    }

    #[test]
    fn a_dead_agent_is_its_column_and_silent_as_a_source() {
        // h5 was killed: the others see it down, and it exports nothing (no row).
        let d = diagnose(
            &mesh(|s, t| {
                if s == 5 {
                    PairStats::default()
                } else if t == 5 {
                    PairStats {
                        up_fraction: Some(0.0),
                        p99_rtt: None,
                        sent: Some(0.0),
                        lost: Some(0.0),
                    }
                } else {
                    healthy(0)
                }
            }),
            &racks(),
            &Thresholds::default(),
        );
        assert_eq!(first(&d).kind, SuspectKind::Target(host(5)));
        assert_eq!((first(&d).down_pairs, first(&d).pairs), (8, 8));
        assert!(first(&d).silent_as_source);
        assert!(d.cells.iter().all(|c| c.source != host(5)));
    }

    #[test]
    fn noise_names_nothing_strongly_and_a_fault_stands_out_of_it() {
        // Scattered bad pairs, no structure: every suspect scores low.
        let noisy = |s: usize, t: usize| (s * 7 + t * 13).is_multiple_of(23);
        let d = diagnose(
            &mesh(|s, t| {
                if noisy(s, t) {
                    slow(healthy(0))
                } else {
                    healthy((s * t) as u64)
                }
            }),
            &racks(),
            &Thresholds::default(),
        );
        assert!(d.bad_pairs > 0 && d.bad_pairs < 6, "{}", d.bad_pairs);
        assert!(first(&d).score < 0.5, "{:?}", first(&d));
        // The same noise beside a bad column: the column still comes first.
        let d = diagnose(
            &mesh(|s, t| {
                if t == 0 || noisy(s, t) {
                    slow(healthy(0))
                } else {
                    healthy(0)
                }
            }),
            &racks(),
            &Thresholds::default(),
        );
        assert_eq!(first(&d).kind, SuspectKind::Target(host(0)));
        // And beside a lossy rack uplink.
        let d = diagnose(
            &mesh(|s, t| {
                if (s < 3) != (t < 3) {
                    lossy(healthy(0))
                } else if noisy(s, t) {
                    slow(healthy(0))
                } else {
                    healthy(0)
                }
            }),
            &racks(),
            &Thresholds::default(),
        );
        assert_eq!(first(&d).kind, SuspectKind::Group("r0".into()));
    }

    /// What the lab saw on a loaded host: a lossy host among many unrelated bad pairs, a third
    /// of them in its own rack's boundary. The host must still come first, ahead of its rack.
    #[test]
    fn a_lossy_host_beats_its_rack_among_noise() {
        let noise = [
            (3, 0),
            (3, 1),
            (3, 2),
            (5, 6),
            (5, 7),
            (5, 8),
            (0, 5),
            (1, 3),
            (0, 1),
            (1, 2),
            (6, 7),
            (7, 8),
            (2, 0),
            (8, 6),
            (6, 0),
            (7, 1),
            (8, 2),
            (0, 7),
            (1, 8),
            (2, 6),
            (6, 8),
            (8, 7),
        ];
        let d = diagnose(
            &mesh(|s, t| {
                if s == 4 || t == 4 {
                    lossy(healthy(0))
                } else if noise.contains(&(s, t)) {
                    slow(healthy(0))
                } else {
                    healthy(0)
                }
            }),
            &racks(),
            &Thresholds::default(),
        );
        assert_eq!(d.bad_pairs, 16 + noise.len());
        assert_eq!(first(&d).kind, SuspectKind::Cross(host(4)));
        let rack = d
            .suspects
            .iter()
            .find(|s| s.kind == SuspectKind::Group("r1".into()))
            .unwrap();
        assert!(
            first(&d).score > rack.score + 0.15,
            "{:?} vs {rack:?}",
            first(&d)
        );
    }

    #[test]
    fn thresholds_need_both_ratio_and_count() {
        let th = Thresholds::default();
        let base = Some(Duration::from_micros(200));
        let p = |sent: f64, lost: f64| PairStats {
            sent: Some(sent),
            lost: Some(lost),
            ..PairStats::default()
        };
        // One loss in twenty: 5 %, but one probe is not evidence.
        assert!(!judge(&p(20.0, 1.0), base, &th).lossy);
        // Three in 10,000: many, but 0.03 %.
        assert!(!judge(&p(10_000.0, 3.0), base, &th).lossy);
        assert!(judge(&p(600.0, 3.0), base, &th).lossy);
        // 3x the baseline but only 400 us above it: jitter, not a fault.
        let rtt = |us: u64| PairStats {
            p99_rtt: Some(Duration::from_micros(us)),
            ..PairStats::default()
        };
        assert!(!judge(&rtt(600), base, &th).slow);
        assert!(judge(&rtt(1_200), base, &th).slow);
        // Nothing bad without data.
        assert!(!judge(&PairStats::default(), base, &th).bad());
        assert!(
            judge(
                &PairStats {
                    up_fraction: Some(0.5),
                    ..PairStats::default()
                },
                base,
                &th
            )
            .down
        );
    }

    #[test]
    fn a_healthy_mesh_has_no_suspect() {
        let d = diagnose(
            &mesh(|s, t| healthy((s * 3 + t) as u64)),
            &racks(),
            &Thresholds::default(),
        );
        assert_eq!(d.bad_pairs, 0);
        assert!(d.suspects.is_empty());
        assert_eq!(d.hosts.len(), HOSTS);
        assert_eq!(d.cells.len(), HOSTS * (HOSTS - 1));
    }
}
