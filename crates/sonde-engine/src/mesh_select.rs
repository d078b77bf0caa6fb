//! Which peers a mesh agent probes: the three levels of Pingmesh over labelled nodes, computed
//! identically by every agent from the same node list. Pure: names and labels in, a selection
//! out; no sockets, no clock, no randomness, no hash-map order.
//!
//! The [`Policy`] (a mesh file's `[select]`, docs/mesh.md):
//! 1. **group** (e.g. `"rack"`): every node probes every other node with the same value of that
//!    label (a complete graph inside a rack). Symmetric. A node without the label is in no group.
//! 2. **neighbours** K: the nodes of one scope (all nodes, or one value of `across`) sit on a
//!    ring ordered by SHA-256 of their names; each node probes the first K nodes after it that
//!    are not in its own group (already probed). So each node is probed by at least
//!    min(K, scope size − 1) others: its K nearest predecessors each probe it, through the ring
//!    or through its group (see [`Selection::new`]). Adding a node moves only the pairs it takes.
//! 3. **across** (e.g. `"zone"`) and **representatives** M: the ring stays inside one value of
//!    `across`, and between every two values A and B, M representatives of A probe M of B and
//!    back (the M members of A whose SHA-256 of `B`, a newline and the name is lowest: each pair
//!    of zones picks its own, so the load spreads). Groups are nested in `across`: rack `r1` of
//!    zone `a` and rack `r1` of zone `b` are two groups.
//!
//! ```
//! use std::collections::BTreeMap;
//! use sonde_engine::mesh_select::{Policy, Selection};
//!
//! let node = |name: &str, rack: &str| {
//!     (name.to_owned(), BTreeMap::from([("rack".to_owned(), rack.to_owned())]))
//! };
//! let nodes = [node("a1", "a"), node("a2", "a"), node("b1", "b"), node("b2", "b"), node("c1", "c")];
//! let policy = Policy { group: Some("rack".into()), neighbours: 1, ..Policy::default() };
//! let s = Selection::new(nodes, &policy);
//! // Rack mates both ways, and one node of another rack on the ring.
//! assert!(s.peers_of("a1").unwrap().any(|p| p == "a2"));
//! assert!(s.peers_of("a2").unwrap().any(|p| p == "a1"));
//! assert!(s.probers_of("c1").unwrap() >= 1);
//! ```

use std::collections::{BTreeMap, BTreeSet};

use sha2::{Digest, Sha256};

/// A node's labels (`zone` → `a`, `rack` → `r7`).
pub type Labels = BTreeMap<String, String>;

/// The `[select]` policy. The default (no group, no neighbours, no across) selects nobody: a
/// mesh without `[select]` does not use a [`Selection`] at all (every peer is probed).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    /// The label whose value makes a group; every pair inside a group is probed.
    pub group: Option<String>,
    /// K: ring neighbours (outside the node's group) each node probes.
    pub neighbours: usize,
    /// The label of the higher-level groups: the ring stays inside one of its values.
    pub across: Option<String>,
    /// M: representatives each value of `across` has towards each other value.
    pub representatives: usize,
}

/// The peers of every node under a [`Policy`]: who probes whom.
#[derive(Debug, Clone)]
pub struct Selection {
    /// Node names, sorted (the index of a node is its place here).
    names: Vec<String>,
    /// `peers[i]`: the nodes node `i` probes (sorted indices, without `i`).
    peers: Vec<BTreeSet<usize>>,
    /// `probers[i]`: how many nodes probe node `i`.
    probers: Vec<usize>,
}

/// The ring position of `text`: the first 8 bytes of its SHA-256.
fn position(text: &[u8]) -> u64 {
    let digest = Sha256::digest(text);
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first)
}

impl Selection {
    /// The selection of `nodes` (name and labels; a name given twice keeps its first labels)
    /// under `policy`. Every agent that passes the same names and labels, in any order, gets the
    /// same selection.
    ///
    /// Why each node has at least min(K, scope − 1) probers: take its K nearest predecessors
    /// on its ring. One in its group probes it through the group; one outside has fewer than K
    /// nodes between it and this node, so this node is among the first K nodes after it that
    /// are outside its group, and it probes this node through the ring.
    pub fn new(nodes: impl IntoIterator<Item = (String, Labels)>, policy: &Policy) -> Self {
        let mut unique: BTreeMap<String, Labels> = BTreeMap::new();
        for (name, labels) in nodes {
            unique.entry(name).or_insert(labels);
        }
        let (names, labels): (Vec<String>, Vec<Labels>) = unique.into_iter().unzip();
        let n = names.len();
        let mut peers = vec![BTreeSet::new(); n];
        // The scope of each node: its value of `across` (missing: the empty value), or one
        // scope for all when there is no `across`.
        let scope = |i: usize| -> &str {
            policy
                .across
                .as_ref()
                .map_or("", |a| labels[i].get(a).map_or("", String::as_str))
        };
        let group = |i: usize| -> Option<(&str, &str)> {
            let g = policy.group.as_ref()?;
            labels[i].get(g).map(|v| (scope(i), v.as_str()))
        };
        let same_group = |i: usize, j: usize| group(i).is_some() && group(i) == group(j);

        // Level 1: complete graphs inside groups.
        let mut groups: BTreeMap<(&str, &str), Vec<usize>> = BTreeMap::new();
        for i in 0..n {
            if let Some(g) = group(i) {
                groups.entry(g).or_default().push(i);
            }
        }
        for members in groups.values() {
            for &i in members {
                peers[i].extend(members.iter().copied().filter(|&j| j != i));
            }
        }

        // Level 2: the ring of each scope, ordered by the SHA-256 of the names.
        let mut scopes: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for i in 0..n {
            scopes.entry(scope(i)).or_default().push(i);
        }
        if policy.neighbours > 0 {
            for members in scopes.values() {
                let mut ring: Vec<(u64, usize)> = members
                    .iter()
                    .map(|&i| (position(names[i].as_bytes()), i))
                    .collect();
                // Names are unique, so (position, index) orders every ring the same way.
                ring.sort_unstable();
                let len = ring.len();
                for (at, &(_, i)) in ring.iter().enumerate() {
                    let mut taken = 0;
                    for step in 1..len {
                        if taken == policy.neighbours {
                            break;
                        }
                        let j = ring[(at + step) % len].1;
                        if !same_group(i, j) {
                            peers[i].insert(j);
                            taken += 1;
                        }
                    }
                }
            }
        }

        // Level 3: representatives between every two scopes, both ways.
        if policy.across.is_some() && policy.representatives > 0 {
            let keys: Vec<&str> = scopes.keys().copied().collect();
            // The representatives of scope `from` towards scope `to`.
            let chosen = |from: &str, to: &str| -> Vec<usize> {
                let mut ranked: Vec<(u64, usize)> = scopes[from]
                    .iter()
                    .map(|&i| {
                        let mut key = to.as_bytes().to_vec();
                        key.push(b'\n');
                        key.extend_from_slice(names[i].as_bytes());
                        (position(&key), i)
                    })
                    .collect();
                ranked.sort_unstable();
                ranked
                    .into_iter()
                    .take(policy.representatives)
                    .map(|(_, i)| i)
                    .collect()
            };
            for (x, &a) in keys.iter().enumerate() {
                for &b in &keys[x + 1..] {
                    let (ra, rb) = (chosen(a, b), chosen(b, a));
                    for &i in &ra {
                        for &j in &rb {
                            peers[i].insert(j);
                            peers[j].insert(i);
                        }
                    }
                }
            }
        }

        let mut probers = vec![0; n];
        for set in &peers {
            for &j in set {
                probers[j] += 1;
            }
        }
        Self {
            names,
            peers,
            probers,
        }
    }

    /// Every node's name, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.names.iter().map(String::as_str)
    }

    fn index(&self, name: &str) -> Option<usize> {
        self.names.binary_search_by(|n| n.as_str().cmp(name)).ok()
    }

    /// The names of the nodes `name` probes (sorted); `None` when `name` is not a node.
    pub fn peers_of(&self, name: &str) -> Option<impl Iterator<Item = &str>> {
        let i = self.index(name)?;
        Some(self.peers[i].iter().map(|&j| self.names[j].as_str()))
    }

    /// How many nodes `name` probes.
    pub fn peer_count(&self, name: &str) -> Option<usize> {
        self.index(name).map(|i| self.peers[i].len())
    }

    /// How many nodes probe `name`: what its incoming probers should number when every agent
    /// runs.
    pub fn probers_of(&self, name: &str) -> Option<usize> {
        self.index(name).map(|i| self.probers[i])
    }

    /// Whether `from` probes `to`.
    pub fn probes(&self, from: &str, to: &str) -> bool {
        match (self.index(from), self.index(to)) {
            (Some(i), Some(j)) => self.peers[i].contains(&j),
            _ => false,
        }
    }

    /// Every directed pair (prober, probed), by name.
    pub fn pairs(&self) -> impl Iterator<Item = (&str, &str)> {
        self.peers.iter().enumerate().flat_map(move |(i, set)| {
            set.iter()
                .map(move |&j| (self.names[i].as_str(), self.names[j].as_str()))
        })
    }

    /// The largest and the mean number of peers a node probes.
    pub fn peers_per_node(&self) -> (usize, f64) {
        let max = self.peers.iter().map(BTreeSet::len).max().unwrap_or(0);
        let total: usize = self.peers.iter().map(BTreeSet::len).sum();
        #[expect(clippy::cast_precision_loss, reason = "node counts are far below 2^52")]
        let mean = if self.peers.is_empty() {
            0.0
        } else {
            total as f64 / self.peers.len() as f64
        };
        (max, mean)
    }
}

/// A synthetic fleet: `zones` zones of `racks` racks of `per_rack` nodes, named
/// `z{zone}-r{rack}-n{node}` and labelled `zone` and `rack` (for tests and the docs' figures).
pub fn synthetic_fleet(zones: usize, racks: usize, per_rack: usize) -> Vec<(String, Labels)> {
    let mut out = Vec::with_capacity(zones * racks * per_rack);
    for z in 0..zones {
        for r in 0..racks {
            for i in 0..per_rack {
                out.push((
                    format!("z{z}-r{r}-n{i}"),
                    BTreeMap::from([
                        ("zone".to_owned(), format!("z{z}")),
                        ("rack".to_owned(), format!("r{r}")),
                    ]),
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn pingmesh(k: usize, m: usize) -> Policy {
        Policy {
            group: Some("rack".into()),
            neighbours: k,
            across: Some("zone".into()),
            representatives: m,
        }
    }

    /// A fleet of `sizes[z][r]` nodes in rack r of zone z; some nodes lack a label.
    fn fleet(sizes: &[Vec<usize>], unlabelled: usize) -> Vec<(String, Labels)> {
        let mut out = Vec::new();
        for (z, racks) in sizes.iter().enumerate() {
            for (r, &count) in racks.iter().enumerate() {
                for i in 0..count {
                    out.push((
                        format!("10.{z}.{r}.{i}"),
                        BTreeMap::from([
                            ("zone".to_owned(), format!("z{z}")),
                            ("rack".to_owned(), format!("r{r}")),
                        ]),
                    ));
                }
            }
        }
        for i in 0..unlabelled {
            out.push((format!("bare-{i}"), Labels::new()));
        }
        out
    }

    fn scope_sizes(nodes: &[(String, Labels)], across: &str) -> BTreeMap<String, usize> {
        let mut sizes = BTreeMap::new();
        for (_, l) in nodes {
            *sizes
                .entry(l.get(across).cloned().unwrap_or_default())
                .or_default() += 1;
        }
        sizes
    }

    fn arb_fleet() -> impl Strategy<Value = Vec<(String, Labels)>> {
        (
            proptest::collection::vec(proptest::collection::vec(0usize..12, 1..6), 1..5),
            0usize..4,
        )
            .prop_map(|(sizes, bare)| fleet(&sizes, bare))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Rack mates probe each other both ways; every node is probed by at least K others
        /// (or by every other node of its zone, in a smaller zone); nobody probes itself.
        #[test]
        fn groups_are_symmetric_and_every_node_has_k_probers(
            nodes in arb_fleet(), k in 0usize..5, m in 0usize..3,
        ) {
            let s = Selection::new(nodes.clone(), &pingmesh(k, m));
            let scopes = scope_sizes(&nodes, "zone");
            for (a, la) in &nodes {
                prop_assert!(!s.probes(a, a));
                for (b, lb) in &nodes {
                    if a != b && la.get("rack").is_some() && la.get("rack") == lb.get("rack")
                        && la.get("zone") == lb.get("zone") {
                        prop_assert!(s.probes(a, b) && s.probes(b, a), "{a} {b}");
                    }
                }
                let scope = scopes[&la.get("zone").cloned().unwrap_or_default()];
                let want = k.min(scope - 1);
                prop_assert!(s.probers_of(a).unwrap() >= want,
                    "{a}: {} probers, want {want}", s.probers_of(a).unwrap());
            }
            // probers_of counts the pairs.
            for name in s.names() {
                let n = s.pairs().filter(|(_, to)| *to == name).count();
                prop_assert_eq!(s.probers_of(name).unwrap(), n);
            }
        }

        /// Every agent computes the same selection, whatever order its list came in.
        #[test]
        fn identical_from_any_order(nodes in arb_fleet(), k in 0usize..4, m in 0usize..3,
                                    seed in any::<u64>()) {
            let s = Selection::new(nodes.clone(), &pingmesh(k, m));
            let mut shuffled = nodes;
            // A deterministic shuffle from the seed.
            let mut x = seed | 1;
            for i in (1..shuffled.len()).rev() {
                x ^= x << 13; x ^= x >> 7; x ^= x << 17;
                let j = usize::try_from(x % (i as u64 + 1)).unwrap();
                shuffled.swap(i, j);
            }
            let t = Selection::new(shuffled, &pingmesh(k, m));
            prop_assert_eq!(s.pairs().collect::<Vec<_>>(), t.pairs().collect::<Vec<_>>());
        }

        /// A node probes at most its group, K ring neighbours and its representatives' peers:
        /// the size does not grow with the number of nodes.
        #[test]
        fn bounded_size(nodes in arb_fleet(), k in 0usize..5, m in 0usize..3) {
            let s = Selection::new(nodes.clone(), &pingmesh(k, m));
            let zones = scope_sizes(&nodes, "zone").len();
            for (a, la) in &nodes {
                let group = nodes.iter().filter(|(b, lb)| b != a && la.get("rack").is_some()
                    && la.get("rack") == lb.get("rack") && la.get("zone") == lb.get("zone")).count();
                let bound = group + k + m * m * (zones - 1);
                prop_assert!(s.peer_count(a).unwrap() <= bound,
                    "{a}: {} > {bound}", s.peer_count(a).unwrap());
            }
        }

        /// One node more moves few pairs: every pair that goes is displaced by one the new
        /// node takes (at most two for each of its own).
        #[test]
        fn adding_a_node_moves_few_pairs(nodes in arb_fleet(), k in 1usize..4, m in 0usize..3,
                                         zone in 0usize..4, rack in 0usize..4) {
            let before = Selection::new(nodes.clone(), &pingmesh(k, m));
            let new = "new-node".to_owned();
            let mut more = nodes;
            more.push((new.clone(), BTreeMap::from([
                ("zone".to_owned(), format!("z{zone}")),
                ("rack".to_owned(), format!("r{rack}")),
            ])));
            let after = Selection::new(more, &pingmesh(k, m));
            let now: BTreeSet<(&str, &str)> = after.pairs().collect();
            let gone = before.pairs().filter(|p| !now.contains(p)).count();
            let taken = after.pairs().filter(|(a, b)| *a == new || *b == new).count();
            prop_assert!(gone <= 2 * taken, "{gone} pairs went, the new node took {taken}");
        }
    }

    #[test]
    fn without_across_one_ring_and_no_representatives() {
        let nodes = fleet(&[vec![3, 3], vec![3]], 0);
        let s = Selection::new(
            nodes,
            &Policy {
                group: Some("rack".into()),
                neighbours: 2,
                across: None,
                representatives: 5,
            },
        );
        // Without across, "rack" values are global: r0 of z0 and r0 of z1 are one group of 6.
        assert!(s.probes("10.0.0.0", "10.1.0.2"));
        for name in s.names() {
            assert!(s.probers_of(name).unwrap() >= 2);
        }
    }

    #[test]
    fn representatives_link_every_two_zones_both_ways() {
        let nodes = fleet(&[vec![5, 5], vec![5, 5], vec![5]], 0);
        let s = Selection::new(nodes, &pingmesh(0, 2));
        let zone = |n: &str| n.split('.').nth(1).unwrap().to_owned();
        let mut between: BTreeMap<(String, String), usize> = BTreeMap::new();
        for (a, b) in s.pairs() {
            if zone(a) != zone(b) {
                *between.entry((zone(a), zone(b))).or_default() += 1;
            }
        }
        // 3 zones: 6 ordered zone pairs, each with 2 x 2 probed pairs.
        assert_eq!(between.len(), 6, "{between:?}");
        assert!(between.values().all(|&n| n == 4), "{between:?}");
    }

    /// The docs' figures (docs/mesh.md, "Choosing peers"): 40 nodes a rack, 25 racks a zone,
    /// with K = 3 and M = 2. Run with `--nocapture` to print them.
    #[test]
    fn peers_per_agent_for_1000_and_10000_nodes() {
        for (zones, want_max) in [(1usize, 39 + 3), (10, 39 + 3 + 2 * 2 * 9)] {
            let nodes = synthetic_fleet(zones, 25, 40);
            let s = Selection::new(nodes, &pingmesh(3, 2));
            let (max, mean) = s.peers_per_node();
            let min_probers = s.names().filter_map(|n| s.probers_of(n)).min().unwrap();
            println!(
                "{} nodes: peers per agent mean {mean:.1}, max {max}; fewest probers {min_probers}",
                zones * 1000
            );
            assert!(max <= want_max, "{max}");
            assert!(min_probers >= 39);
        }
    }
}
