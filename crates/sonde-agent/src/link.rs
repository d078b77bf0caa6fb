//! One scheduled throughput or pps test on a link at a time, whichever end starts it.
//!
//! In a mesh (`sonde server --mesh`) both ends of a link schedule tests to each other, each on its
//! own clock, so A's test to B and B's test to A could overlap on the link. The agent and its
//! mesh share one [`LinkTests`]: the agent registers each throughput or pps session it serves,
//! by the client's address, and the mesh each scheduled test it runs, by the peer's address.
//!
//! * The mesh does not start a test to a peer while it serves a throughput or pps session from
//!   that peer's address: its turn passes ([`LinkTests::start_outgoing`] gives `None`).
//! * Both ends starting at once: the agent refuses a throughput or pps session from an address
//!   it is running its own test to when its own address (the one the client reached it at)
//!   sorts at or below the client's ([`LinkTests::serve_incoming`]). The two ends compare the
//!   same two addresses the other way round, so exactly one of the two tests is refused; the
//!   refused one's turn passes. Two agents on one address (one host, two ports) both refuse:
//!   both turns pass, and no two tests share the link.
//!
//! Every check and registration is made under one lock, so whatever the order in which the
//! four events at the two ends happen, at most one of the two tests runs (and, with distinct
//! addresses, exactly one): the tests below go through every order.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// Tests running now on this agent's links, by the other end's address.
#[derive(Debug, Default)]
pub struct LinkTests {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The mesh's own scheduled tests, by peer address.
    outgoing: BTreeMap<IpAddr, u32>,
    /// Throughput and pps sessions this agent serves, by client address.
    incoming: BTreeMap<IpAddr, u32>,
}

/// Why a session is refused: this agent runs its own scheduled test to the client's address,
/// and its address sorts at or below the client's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkBusy;

/// A registered test; dropping it ends the registration.
#[derive(Debug)]
pub struct LinkTest {
    links: Arc<LinkTests>,
    peer: IpAddr,
    way: Way,
}

#[derive(Debug, Clone, Copy)]
enum Way {
    Outgoing,
    Incoming,
}

/// IPv4-mapped IPv6 addresses as IPv4, so both ends of a dual-stack link compare alike.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        IpAddr::V4(_) => ip,
    }
}

impl LinkTests {
    /// No test on any link.
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The mesh is about to run a scheduled test to `peer`: registered until the returned
    /// guard drops, or `None` while this agent serves a throughput or pps session from `peer`
    /// (the test's turn passes).
    pub fn start_outgoing(self: &Arc<Self>, peer: IpAddr) -> Option<LinkTest> {
        let peer = canonical(peer);
        let mut state = self.lock();
        if state.incoming.contains_key(&peer) {
            return None;
        }
        *state.outgoing.entry(peer).or_default() += 1;
        Some(LinkTest {
            links: Arc::clone(self),
            peer,
            way: Way::Outgoing,
        })
    }

    /// The agent is about to serve a throughput or pps session from `peer`, reached at its own
    /// address `local`: registered until the returned guard drops, or refused while the mesh
    /// runs its own test to `peer` and `local` sorts at or below `peer` (the tie-break both
    /// ends agree on).
    ///
    /// # Errors
    /// [`LinkBusy`]: refuse the session.
    pub fn serve_incoming(
        self: &Arc<Self>,
        local: IpAddr,
        peer: IpAddr,
    ) -> Result<LinkTest, LinkBusy> {
        let (local, peer) = (canonical(local), canonical(peer));
        let mut state = self.lock();
        if state.outgoing.contains_key(&peer) && local <= peer {
            return Err(LinkBusy);
        }
        *state.incoming.entry(peer).or_default() += 1;
        Ok(LinkTest {
            links: Arc::clone(self),
            peer,
            way: Way::Incoming,
        })
    }

    /// Whether this agent serves a throughput or pps session from `peer` now.
    pub fn serving(&self, peer: IpAddr) -> bool {
        self.lock().incoming.contains_key(&canonical(peer))
    }
}

impl Drop for LinkTest {
    fn drop(&mut self) {
        let mut state = self.links.lock();
        let map = match self.way {
            Way::Outgoing => &mut state.outgoing,
            Way::Incoming => &mut state.incoming,
        };
        if let Some(n) = map.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.peer);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn no_test_to_a_peer_while_serving_one_from_it() {
        let links = LinkTests::new();
        let served = links.serve_incoming(ip("198.18.0.1"), ip("198.18.0.2"));
        let served = served.unwrap();
        assert!(links.serving(ip("198.18.0.2")));
        assert!(links.start_outgoing(ip("198.18.0.2")).is_none());
        // Another peer is another link; the same peer as an IPv4-mapped address is the same.
        assert!(links.start_outgoing(ip("198.18.0.3")).is_some());
        assert!(links.start_outgoing(ip("::ffff:198.18.0.2")).is_none());
        drop(served);
        assert!(!links.serving(ip("198.18.0.2")));
        assert!(links.start_outgoing(ip("198.18.0.2")).is_some());
    }

    #[test]
    fn while_its_own_test_runs_the_lower_address_refuses_the_peers() {
        let links = LinkTests::new();
        let own = links.start_outgoing(ip("198.18.0.2")).unwrap();
        // Reached at .1, below the client's .2: refused.
        assert_eq!(
            links
                .serve_incoming(ip("198.18.0.1"), ip("198.18.0.2"))
                .unwrap_err(),
            LinkBusy
        );
        // Reached at .3, above it: served (the peer refuses this agent's test instead).
        let served = links.serve_incoming(ip("198.18.0.3"), ip("198.18.0.2"));
        assert!(served.is_ok());
        // Equal addresses (two agents on one host): refused.
        assert!(links
            .serve_incoming(ip("198.18.0.2"), ip("198.18.0.2"))
            .is_err());
        // A client this agent is not testing is served.
        assert!(links
            .serve_incoming(ip("198.18.0.1"), ip("198.18.0.9"))
            .is_ok());
        drop((own, served));
        assert!(links
            .serve_incoming(ip("198.18.0.1"), ip("198.18.0.2"))
            .is_ok());
    }

    /// What happens at the two ends of a link when both schedule a test to the other at once.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Event {
        /// End `i`'s mesh starts its test to the other end (before it connects).
        Start(usize),
        /// End `i`'s agent admits the other end's test.
        Serve(usize),
    }

    /// Every order of the four events in which a test reaches the other end only after it
    /// started; how many of the two tests ran in each.
    fn every_order(addrs: [IpAddr; 2]) -> Vec<(Vec<Event>, usize)> {
        let events = [
            Event::Start(0),
            Event::Start(1),
            Event::Serve(0),
            Event::Serve(1),
        ];
        let mut outcomes = Vec::new();
        let mut order = Vec::new();
        permute(&events, &mut order, &mut |order: &[Event]| {
            // End i's test is served by end 1 - i (Serve(1 - i)) after Start(i).
            let at = |e| order.iter().position(|x| *x == e).unwrap();
            if (0..2).any(|i| at(Event::Serve(1 - i)) < at(Event::Start(i))) {
                return;
            }
            let ends = [LinkTests::new(), LinkTests::new()];
            let mut guards = Vec::new();
            let mut started = [false; 2];
            let mut ran = 0;
            for &e in order {
                match e {
                    Event::Start(i) => {
                        if let Some(g) = ends[i].start_outgoing(addrs[1 - i]) {
                            started[i] = true;
                            guards.push(g);
                        }
                    }
                    Event::Serve(j) => {
                        // The test of end 1 - j, if it started, reaches end j.
                        if started[1 - j] {
                            if let Ok(g) = ends[j].serve_incoming(addrs[j], addrs[1 - j]) {
                                guards.push(g);
                                ran += 1;
                            }
                        }
                    }
                }
            }
            outcomes.push((order.to_vec(), ran));
        });
        outcomes
    }

    fn permute(rest: &[Event], order: &mut Vec<Event>, visit: &mut dyn FnMut(&[Event])) {
        if rest.is_empty() {
            visit(order);
            return;
        }
        for i in 0..rest.len() {
            let mut left = rest.to_vec();
            order.push(left.remove(i));
            permute(&left, order, visit);
            order.pop();
        }
    }

    #[test]
    fn two_ends_starting_at_once_run_exactly_one_test_in_every_order() {
        let outcomes = every_order([ip("198.18.0.1"), ip("198.18.0.2")]);
        // 4! orders, of which those with each test served after it started: 6.
        assert_eq!(outcomes.len(), 6);
        for (order, ran) in &outcomes {
            assert_eq!(*ran, 1, "{order:?}");
        }
        // Without the registry both would run in the orders where both start first.
        assert!(outcomes
            .iter()
            .any(|(o, _)| matches!(o[..2], [Event::Start(_), Event::Start(_)])));
        // The same, the addresses the other way round.
        for (order, ran) in every_order([ip("198.18.0.2"), ip("198.18.0.1")]) {
            assert_eq!(ran, 1, "{order:?}");
        }
    }

    #[test]
    fn two_ends_on_one_address_never_run_two_tests() {
        for (order, ran) in every_order([ip("127.0.0.1"), ip("127.0.0.1")]) {
            assert!(ran <= 1, "{order:?}");
        }
    }
}
