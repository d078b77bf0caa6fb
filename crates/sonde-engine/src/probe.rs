//! The mesh prober's state machine: when to send each probe, which source port it leaves from,
//! which reply answers which probe, and when a probe is lost. Sans-IO on the caller's clock
//! (nanoseconds since an origin the caller chose), in the manner of quinn-proto's `Connection`:
//! the caller sends what [`Prober::poll_transmit`] hands out, feeds replies to
//! [`Prober::handle_reply`], calls [`Prober::handle_timeout`] when [`Prober::next_timeout`]
//! comes, and reads what happened from [`Prober::poll_event`]. One prober serves every peer of
//! an agent over every protocol, so the caller needs one thread, not one per peer.
//!
//! The rules:
//! * each key (a peer and a protocol) gets one probe per `interval`, each interval drawn
//!   uniformly in `interval ± jitter`, the first at a random point of the first interval, so
//!   agents started together do not probe in step;
//! * probe `seq` of a key leaves from source port index `(offset + seq) % ports`, `offset`
//!   drawn per key, so every key rotates over the whole pool and keys do not share a phase;
//! * a probe not answered within `timeout` (or that the caller reports failed) is lost; a
//!   reply after that is ignored;
//! * per key and source port, the outcomes of the last [`PORT_WINDOW`] probes and a smoothed
//!   RTT are kept, so [`Prober::worst_port`] names the port (the 5-tuple) with the most loss.
//!
//! ```
//! use std::time::Duration;
//! use sonde_engine::probe::{Event, ProbeConfig, Prober};
//! let cfg = ProbeConfig::new(Duration::from_secs(1), Duration::from_millis(500), 64);
//! let mut p: Prober<&str> = Prober::new(cfg, 7);
//! p.add("b", 0);
//! let mut now = 0;
//! let mut replies = 0;
//! while now < 10_000_000_000 {
//!     while let Some(t) = p.poll_transmit(now) {
//!         // The network: answered after 300 us.
//!         assert!(p.handle_reply(t.nonce, now + 300_000));
//!     }
//!     p.handle_timeout(now);
//!     while let Some(e) = p.poll_event() {
//!         if let Event::Reply { rtt_ns, .. } = e {
//!             assert_eq!(rtt_ns, 300_000);
//!             replies += 1;
//!         }
//!     }
//!     now = p.next_timeout().unwrap().max(now + 1);
//! }
//! assert!((9..=11).contains(&replies)); // one a second
//! ```

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::hash::Hash;
use std::time::Duration;

use crate::schedule::SplitMix64;

/// Outcomes kept per key and source port.
pub const PORT_WINDOW: u32 = 16;

/// How a [`Prober`] probes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeConfig {
    /// Mean time between two probes of one key.
    pub interval: Duration,
    /// Each interval is `interval` plus a uniform offset in `[-jitter, +jitter]`.
    pub jitter: Duration,
    /// A probe not answered within this is lost.
    pub timeout: Duration,
    /// Source ports (sockets) each key rotates over.
    pub ports: u16,
}

impl ProbeConfig {
    /// `interval`, `timeout` and `ports`, with a jitter of a tenth of the interval.
    pub fn new(interval: Duration, timeout: Duration, ports: u16) -> Self {
        Self {
            interval,
            jitter: interval / 10,
            timeout,
            ports: ports.max(1),
        }
    }
}

/// A probe to send now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit<K> {
    /// Whose probe it is.
    pub key: K,
    /// The key's sequence number (from 0).
    pub seq: u64,
    /// Random: what the reply echoes, and what [`Prober::handle_reply`] takes.
    pub nonce: u64,
    /// Index of the source port (socket) to send from, below [`ProbeConfig::ports`].
    pub port: u16,
}

/// What happened to a probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event<K> {
    /// Answered, `rtt_ns` after it was handed out.
    Reply {
        /// Whose probe.
        key: K,
        /// Its source port index.
        port: u16,
        /// Round-trip time, nanoseconds.
        rtt_ns: u64,
    },
    /// Not answered within the timeout, or failed.
    Lost {
        /// Whose probe.
        key: K,
        /// Its source port index.
        port: u16,
    },
}

/// The last [`PORT_WINDOW`] outcomes of one key's probes from one source port.
#[derive(Debug, Clone, Copy, Default)]
struct PortStat {
    /// Bit i: the i-th latest outcome was a loss.
    lost_bits: u16,
    outcomes: u8,
    /// Smoothed RTT (1/8 weight per sample, as RFC 6298's SRTT), ns; 0 before any reply.
    srtt_ns: u64,
}

impl PortStat {
    fn record(&mut self, lost: bool) {
        self.lost_bits = (self.lost_bits << 1) | u16::from(lost);
        if u32::from(self.outcomes) < PORT_WINDOW {
            self.outcomes += 1;
        }
    }

    fn lost(&self) -> u32 {
        self.lost_bits.count_ones()
    }
}

/// The source port of a key with the most loss over its last [`PORT_WINDOW`] probes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WorstPort {
    /// The port's index.
    pub port: u16,
    /// Its lost probes over its last `outcomes` probes (0 to 1).
    pub lost_ratio: f64,
    /// How many probes that ratio is over (at most [`PORT_WINDOW`]).
    pub outcomes: u32,
    /// Its smoothed RTT, ns (0 when none of its probes was answered).
    pub srtt_ns: u64,
}

#[derive(Debug)]
struct KeyState {
    next_seq: u64,
    offset: u16,
    /// Bumped when the key is added again, so heap entries of an earlier life are skipped.
    life: u64,
    ports: Vec<PortStat>,
    consecutive_lost: u32,
    answered: bool,
}

#[derive(Debug)]
struct Outstanding<K> {
    key: K,
    life: u64,
    port: u16,
    sent_ns: u64,
}

/// The prober of every key of one agent ([module docs](self)).
#[derive(Debug)]
pub struct Prober<K> {
    cfg: ProbeConfig,
    rng: SplitMix64,
    keys: HashMap<K, KeyState>,
    /// (due, life, key): lazily skipped when the key is gone or of another life.
    due: BinaryHeap<Reverse<(u64, u64, K)>>,
    outstanding: HashMap<u64, Outstanding<K>>,
    /// (deadline, nonce), in deadline order: the timeout is the same for every probe.
    deadlines: VecDeque<(u64, u64)>,
    events: VecDeque<Event<K>>,
    lives: u64,
}

impl<K: Clone + Ord + Hash> Prober<K> {
    /// A prober with no keys; `seed` drives the jitter, port offsets and nonces.
    pub fn new(cfg: ProbeConfig, seed: u64) -> Self {
        Self {
            cfg,
            rng: SplitMix64(seed),
            keys: HashMap::new(),
            due: BinaryHeap::new(),
            outstanding: HashMap::new(),
            deadlines: VecDeque::new(),
            events: VecDeque::new(),
            lives: 0,
        }
    }

    /// Starts probing `key` (nothing if it is probed already): its first probe at a random
    /// point of the next interval.
    pub fn add(&mut self, key: K, now_ns: u64) {
        if self.keys.contains_key(&key) {
            return;
        }
        self.lives += 1;
        let first = now_ns + self.rng.below(nanos(self.cfg.interval).max(1));
        let offset = u16::try_from(self.rng.below(u64::from(self.cfg.ports))).unwrap_or(0);
        self.keys.insert(
            key.clone(),
            KeyState {
                next_seq: 0,
                offset,
                life: self.lives,
                ports: vec![PortStat::default(); usize::from(self.cfg.ports)],
                consecutive_lost: 0,
                answered: false,
            },
        );
        self.due.push(Reverse((first, self.lives, key)));
    }

    /// Stops probing `key`: its outstanding probes are forgotten, no event of it follows.
    pub fn remove(&mut self, key: &K) {
        self.keys.remove(key);
    }

    /// The keys probed.
    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.keys.keys()
    }

    /// The next probe due at `now_ns`, if any; call until `None`.
    pub fn poll_transmit(&mut self, now_ns: u64) -> Option<Transmit<K>> {
        loop {
            let Reverse((due, life, _)) = self.due.peek()?;
            if *due > now_ns {
                return None;
            }
            let (due, life) = (*due, *life);
            let Reverse((_, _, key)) = self.due.pop()?;
            let Some(state) = self.keys.get_mut(&key).filter(|s| s.life == life) else {
                continue;
            };
            let seq = state.next_seq;
            state.next_seq += 1;
            let port = u16::try_from((u64::from(state.offset) + seq) % u64::from(self.cfg.ports))
                .unwrap_or(0);
            let interval = nanos(self.cfg.interval).max(1);
            let jitter = nanos(self.cfg.jitter).min(interval - 1);
            let next = (due + interval + self.rng.below(2 * jitter + 1)).saturating_sub(jitter);
            // Behind (a stalled caller): the next probe one interval from now, not a burst.
            let next = if next <= now_ns {
                now_ns + interval
            } else {
                next
            };
            self.due.push(Reverse((next, life, key.clone())));
            let nonce = self.rng.next();
            self.outstanding.insert(
                nonce,
                Outstanding {
                    key: key.clone(),
                    life,
                    port,
                    sent_ns: now_ns,
                },
            );
            self.deadlines
                .push_back((now_ns + nanos(self.cfg.timeout), nonce));
            return Some(Transmit {
                key,
                seq,
                nonce,
                port,
            });
        }
    }

    /// A reply to the probe of `nonce` arrived at `now_ns`: false when no such probe is
    /// outstanding (a late or duplicate reply, or one of a removed key).
    pub fn handle_reply(&mut self, nonce: u64, now_ns: u64) -> bool {
        let Some(o) = self.outstanding.remove(&nonce) else {
            return false;
        };
        let Some(state) = self.keys.get_mut(&o.key).filter(|s| s.life == o.life) else {
            return false;
        };
        let rtt_ns = now_ns.saturating_sub(o.sent_ns);
        let p = &mut state.ports[usize::from(o.port)];
        p.record(false);
        p.srtt_ns = if p.srtt_ns == 0 {
            rtt_ns
        } else {
            (p.srtt_ns * 7 + rtt_ns) / 8
        };
        state.consecutive_lost = 0;
        state.answered = true;
        self.events.push_back(Event::Reply {
            key: o.key,
            port: o.port,
            rtt_ns,
        });
        true
    }

    /// The probe of `nonce` failed at once (a TCP connection refused or reset): lost.
    pub fn handle_failure(&mut self, nonce: u64) {
        if let Some(o) = self.outstanding.remove(&nonce) {
            self.lose(o);
        }
    }

    fn lose(&mut self, o: Outstanding<K>) {
        let Some(state) = self.keys.get_mut(&o.key).filter(|s| s.life == o.life) else {
            return;
        };
        state.ports[usize::from(o.port)].record(true);
        state.consecutive_lost = state.consecutive_lost.saturating_add(1);
        self.events.push_back(Event::Lost {
            key: o.key,
            port: o.port,
        });
    }

    /// Every probe whose timeout passed by `now_ns` is lost.
    pub fn handle_timeout(&mut self, now_ns: u64) {
        while let Some(&(deadline, nonce)) = self.deadlines.front() {
            if deadline > now_ns {
                break;
            }
            self.deadlines.pop_front();
            if let Some(o) = self.outstanding.remove(&nonce) {
                self.lose(o);
            }
        }
    }

    /// The key and probe of an outstanding `nonce` (to check a reply against its sender).
    pub fn outstanding(&self, nonce: u64) -> Option<&K> {
        self.outstanding.get(&nonce).map(|o| &o.key)
    }

    /// The next thing that happened, in order.
    pub fn poll_event(&mut self) -> Option<Event<K>> {
        self.events.pop_front()
    }

    /// When the next probe is due or the next timeout passes.
    pub fn next_timeout(&self) -> Option<u64> {
        let due = self.due.peek().map(|Reverse((d, _, _))| *d);
        let deadline = self.deadlines.front().map(|(d, _)| *d);
        match (due, deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Consecutive lost probes of `key` since its last reply, and whether it was ever
    /// answered.
    pub fn losses(&self, key: &K) -> Option<(u32, bool)> {
        self.keys.get(key).map(|s| (s.consecutive_lost, s.answered))
    }

    /// The source port of `key` with the highest loss ratio over its last [`PORT_WINDOW`]
    /// probes (then the highest smoothed RTT, then the lowest index); `None` before any
    /// outcome.
    pub fn worst_port(&self, key: &K) -> Option<WorstPort> {
        let state = self.keys.get(key)?;
        let mut worst: Option<WorstPort> = None;
        for (i, p) in state.ports.iter().enumerate() {
            if p.outcomes == 0 {
                continue;
            }
            let w = WorstPort {
                port: u16::try_from(i).unwrap_or(u16::MAX),
                lost_ratio: f64::from(p.lost()) / f64::from(p.outcomes),
                outcomes: u32::from(p.outcomes),
                srtt_ns: p.srtt_ns,
            };
            let better = worst.is_none_or(|b| {
                w.lost_ratio > b.lost_ratio
                    || (w.lost_ratio == b.lost_ratio && w.srtt_ns > b.srtt_ns)
            });
            if better {
                worst = Some(w);
            }
        }
        worst
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    const MS: u64 = 1_000_000;
    const S: u64 = 1_000_000_000;

    fn prober(ports: u16) -> Prober<u32> {
        Prober::new(
            ProbeConfig::new(Duration::from_secs(1), Duration::from_millis(500), ports),
            42,
        )
    }

    /// Runs `p` from `from` to `to` on a virtual clock; `network(key, port, seq)` says after how
    /// long a probe is answered (`None`: lost). Returns the events.
    fn run(
        p: &mut Prober<u32>,
        from: u64,
        to: u64,
        network: &mut dyn FnMut(u32, u16, u64) -> Option<u64>,
        sent: &mut Vec<(u64, Transmit<u32>)>,
    ) -> Vec<Event<u32>> {
        let mut pending: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        let mut events = Vec::new();
        let mut now = from;
        while now < to {
            while let Some((&at, _)) = pending.first_key_value() {
                if at > now {
                    break;
                }
                for nonce in pending.pop_first().unwrap().1 {
                    p.handle_reply(nonce, at);
                }
            }
            p.handle_timeout(now);
            while let Some(t) = p.poll_transmit(now) {
                if let Some(after) = network(t.key, t.port, t.seq) {
                    pending.entry(now + after).or_default().push(t.nonce);
                }
                sent.push((now, t));
            }
            events.extend(std::iter::from_fn(|| p.poll_event()));
            let next_reply = pending.first_key_value().map(|(k, _)| *k);
            now = [p.next_timeout(), next_reply]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(to)
                .max(now + 1);
        }
        events
    }

    #[test]
    fn one_probe_per_interval_per_key_with_jitter_and_no_lockstep() {
        let mut p = prober(64);
        for k in 0..50 {
            p.add(k, 0);
        }
        let mut sent = Vec::new();
        let events = run(&mut p, 0, 100 * S, &mut |_, _, _| Some(MS), &mut sent);
        for k in 0..50 {
            let times: Vec<u64> = sent
                .iter()
                .filter(|(_, t)| t.key == k)
                .map(|(at, _)| *at)
                .collect();
            assert!(
                (99..=101).contains(&times.len()),
                "key {k}: {}",
                times.len()
            );
            for w in times.windows(2) {
                let gap = w[1] - w[0];
                assert!((900 * MS..=1_100 * MS).contains(&gap), "key {k}: gap {gap}");
            }
        }
        // The first probes spread over the first interval: not all at once.
        let firsts: Vec<u64> = (0..50)
            .map(|k| sent.iter().find(|(_, t)| t.key == k).unwrap().0)
            .collect();
        let spread = firsts.iter().max().unwrap() - firsts.iter().min().unwrap();
        assert!(spread > 500 * MS, "first probes within {spread} ns");
        assert!(events
            .iter()
            .all(|e| matches!(e, Event::Reply { rtt_ns, .. } if *rtt_ns == MS)));
    }

    #[test]
    fn every_key_rotates_over_every_port() {
        let mut p = prober(64);
        p.add(1, 0);
        p.add(2, 0);
        let mut sent = Vec::new();
        run(&mut p, 0, 130 * S, &mut |_, _, _| Some(MS), &mut sent);
        for k in [1, 2] {
            let mut ports: Vec<u16> = sent
                .iter()
                .filter(|(_, t)| t.key == k)
                .map(|(_, t)| t.port)
                .collect();
            ports.sort_unstable();
            ports.dedup();
            assert_eq!(ports.len(), 64, "key {k}");
        }
    }

    #[test]
    fn loss_on_one_port_names_that_port_and_late_replies_are_lost() {
        let mut p = prober(8);
        p.add(7, 0);
        let mut sent = Vec::new();
        // Port 3 loses everything; port 5 answers after the timeout (lost too, its late reply
        // ignored); the rest answer in 200 us.
        let events = run(
            &mut p,
            0,
            200 * S,
            &mut |_, port, _| match port {
                3 => None,
                5 => Some(700 * MS),
                _ => Some(200_000),
            },
            &mut sent,
        );
        let lost: Vec<u16> = events
            .iter()
            .filter_map(|e| match e {
                Event::Lost { port, .. } => Some(*port),
                Event::Reply { .. } => None,
            })
            .collect();
        assert!(lost.iter().all(|p| [3, 5].contains(p)), "{lost:?}");
        let on = |port| sent.iter().filter(|(_, t)| t.port == port).count();
        assert_eq!(lost.len(), on(3) + on(5));
        let w = p.worst_port(&7).unwrap();
        assert!([3, 5].contains(&w.port), "{w:?}");
        assert!((w.lost_ratio - 1.0).abs() < f64::EPSILON);
        assert_eq!(w.outcomes, PORT_WINDOW);
        // A clean port reports no loss.
        assert!(events.iter().any(|e| matches!(
            e,
            Event::Reply {
                port: 0,
                rtt_ns: 200_000,
                ..
            }
        )));
    }

    #[test]
    fn a_dead_peer_counts_consecutive_losses_and_recovers() {
        let mut p = prober(4);
        p.add(1, 0);
        let mut sent = Vec::new();
        run(&mut p, 0, 10 * S, &mut |_, _, _| None, &mut sent);
        let (lost, answered) = p.losses(&1).unwrap();
        assert!(lost >= 8 && !answered, "{lost}");
        run(&mut p, 10 * S, 13 * S, &mut |_, _, _| Some(MS), &mut sent);
        assert_eq!(p.losses(&1), Some((0, true)));
    }

    #[test]
    fn a_removed_key_has_no_more_probes_or_events() {
        let mut p = prober(4);
        p.add(1, 0);
        p.add(2, 0);
        let mut sent = Vec::new();
        // Replies slower than the run's steps, so probes are outstanding at the removal.
        run(&mut p, 0, 5 * S, &mut |_, _, _| Some(400 * MS), &mut sent);
        p.remove(&1);
        let before = sent.len();
        let events = run(
            &mut p,
            5 * S,
            10 * S,
            &mut |_, _, _| Some(400 * MS),
            &mut sent,
        );
        assert!(sent[before..].iter().all(|(_, t)| t.key == 2));
        assert!(events.iter().all(|e| match e {
            Event::Reply { key, .. } | Event::Lost { key, .. } => *key == 2,
        }));
        // Added again: probed again, from a fresh state.
        p.add(1, 10 * S);
        run(&mut p, 10 * S, 13 * S, &mut |_, _, _| Some(MS), &mut sent);
        assert!(sent.iter().any(|(at, t)| t.key == 1 && *at >= 10 * S));
        assert_eq!(p.keys().count(), 2);
    }

    #[test]
    fn a_stalled_caller_gets_no_burst() {
        let mut p = prober(4);
        p.add(1, 0);
        // The caller comes back after 30 s: one probe now, the next an interval later.
        let first = p.poll_transmit(30 * S);
        assert!(first.is_some());
        assert!(p.poll_transmit(30 * S).is_none());
        assert!(p.next_timeout().unwrap() > 30 * S);
    }
}
