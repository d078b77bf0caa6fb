//! The sockperf compatibility listener: answers real `sockperf` clients (`ping-pong`,
//! `under-load`, `throughput`; UDP and `--tcp`) as `sockperf server` does (docs/protocols/sockperf.md §4).
//!
//! Every message starts with sockperf's 14-byte header. A message without the client flag, or a
//! warm-up, is ignored; every other message is counted, and one that asks for a reply
//! (`PONG_REQUEST`) is sent back byte for byte with only the client bit cleared: over UDP to the
//! datagram's source address, over TCP on the same connection. Messages of 14 to 65,507 bytes
//! are accepted, the default maximum of `sockperf server`.
//!
//! Sessions and limits, shared with sonde's own sessions through [`Shared::admit_compat`],
//! within a budget of their own (`max_sockperf_sessions`, `max_sockperf_sessions_per_source`):
//! a sockperf session costs its peer one datagram, so these cheap sessions may not fill the
//! agent. Only whole messages count as traffic for the idle timers below:
//! * **TCP**: each connection is a session on its own thread. When `max_sessions` are running a
//!   new connection is closed at once (the sockperf client reports the peer closing). A
//!   connection must send its first message within the hello timeout plus sockperf's 2 s start-up
//!   sleep, may then be silent for at most [`TCP_IDLE`], and lasts at most `max_duration` plus
//!   [`DURATION_SLACK`].
//! * **UDP**: sockperf has no connection, so a session is a source address seen recently: it
//!   starts with the first well-formed message from that address and ends after [`UDP_IDLE`]
//!   without one (or at `max_duration` plus [`DURATION_SLACK`], after which the address is no
//!   longer answered until it has been quiet for [`UDP_IDLE`]). One thread serves every UDP peer
//!   from a table sized to `max_sessions`; datagrams from an address that cannot be admitted are
//!   dropped unanswered, like a full server's.
//!
//! Bad input is counted in [`crate::Rejections`] and dropped: a datagram shorter than a header,
//! or holding a length below 14 or above the maximum, or a message cut off by the datagram's end
//! (sockperf would join it with the next datagram; a UDP client never sends one that way) is
//! junk; over TCP the same closes the connection, as sockperf does. A length below 14 is never
//! looped on (a 3.7 server spins forever on a zero length).
//!
//! The data loops (read, frame, answer, time out) are sonde-net's
//! ([`sonde_net::latency::sockperf_echo`]); this module makes the decisions around them
//! (admission, limits, sessions, counting refusals and junk, logging). The receive loops do not
//! allocate, lock or log: buffers are allocated once per thread or connection, the peer table
//! once, and the one log line per TCP connection or UDP peer ("N messages received and
//! handled", as `sockperf server` says on exit) is written when it ends.

use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use sonde_net::latency::sockperf_echo::{self, serve_datagram, Tally, TcpLimits};
use sonde_wire::sockperf::{self, Parsed};

use crate::{canonical as canonical_ip, lock, CompatListener, CompatSession, Shared};

/// A sockperf session: a place in the agent's sessions and in the sockperf budget, freed on
/// drop.
pub(crate) struct SockperfSession<'a> {
    _compat: CompatSession<'a>,
    shared: &'a Shared,
    ip: std::net::IpAddr,
}

impl Drop for SockperfSession<'_> {
    fn drop(&mut self) {
        let mut by_source = lock(&self.shared.sockperf_by_source);
        if let Some(n) = by_source.get_mut(&self.ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                by_source.remove(&self.ip);
            }
        }
    }
}

/// Admits a sockperf session from `ip` within the sockperf budget (`max_sockperf_sessions`,
/// `max_sockperf_sessions_per_source`) and the agent's own limits.
fn admit(shared: &Shared, ip: std::net::IpAddr) -> Option<SockperfSession<'_>> {
    let ip = canonical_ip(ip);
    let mut by_source = lock(&shared.sockperf_by_source);
    let total: u32 = by_source.values().sum();
    let mine = by_source.get(&ip).copied().unwrap_or(0);
    if total >= shared.cfg.max_sockperf_sessions
        || mine >= shared.cfg.max_sockperf_sessions_per_source
    {
        return None;
    }
    let compat = shared.admit_compat(ip)?;
    *by_source.entry(ip).or_insert(0) += 1;
    Some(SockperfSession {
        _compat: compat,
        shared,
        ip,
    })
}

/// The largest message accepted, bytes: `sockperf server`'s default maximum.
pub(crate) const MAX_MSG: u32 = sockperf_echo::MAX_MSG;
/// A UDP peer with no message for this long has ended its session.
pub(crate) const UDP_IDLE: Duration = Duration::from_secs(2);
/// A TCP connection silent this long (after its first message) is closed.
pub(crate) const TCP_IDLE: Duration = Duration::from_secs(30);
/// A sockperf client sleeps this long after connecting before it sends anything.
const CLIENT_START_SLEEP: Duration = Duration::from_secs(2);
/// Time over `max_duration` a sockperf session gets: the client's 2 s start-up sleep, the
/// 450 µs its timer adds, and its last replies.
pub(crate) const DURATION_SLACK: Duration = Duration::from_secs(5);
/// After a refusal, new UDP peers are refused without asking again for this long, so that a flood
/// from many addresses does not take the session lock per datagram.
const REFUSAL_HOLD: Duration = Duration::from_millis(100);
/// At most this many UDP peers are tracked at once, whatever `max_sessions` says.
const MAX_UDP_PEERS: usize = 4096;

/// Serves sockperf TCP connections and UDP messages until the agent shuts down.
pub(crate) fn serve(listener: CompatListener, shared: &Arc<Shared>) {
    let CompatListener { tcp, udp } = listener;
    let shared: &Shared = shared;
    // Scoped threads: a connection's session guard borrows `shared`, and every thread has
    // noticed the shutdown flag (within `POLL`) when `serve` returns.
    thread::scope(|scope| {
        let udp = &udp;
        let spawned = thread::Builder::new()
            .name("sonde-sockperf-udp".into())
            .spawn_scoped(scope, move || udp_loop(udp, shared));
        if let Err(e) = spawned {
            shared.report(|| crate::AgentEvent::SockperfUdpNotServed {
                why: format!("cannot start its thread: {e}"),
            });
        }
        while let Some(stream) = crate::next_connection(&tcp, shared) {
            let admitted = stream
                .peer_addr()
                .ok()
                .and_then(|peer| admit(shared, peer.ip()));
            let Some(session) = admitted else {
                shared
                    .rejections
                    .sockperf_refused
                    .fetch_add(1, Ordering::Relaxed);
                drop(stream);
                continue;
            };
            // A failed spawn drops the closure, and with it the connection and its session.
            let _ = thread::Builder::new()
                .name("sonde-sockperf-tcp".into())
                .spawn_scoped(scope, move || tcp_session(&stream, shared, session));
        }
    });
}

// ---------------------------------------------------------------------------------------------
// TCP

fn tcp_session(stream: &TcpStream, shared: &Shared, session: SockperfSession<'_>) {
    let started = Instant::now();
    let peer = stream
        .peer_addr()
        .map_or_else(|_| "?".to_owned(), |a| canonical(a).to_string());
    let mut tally = Tally::default();
    let limits = TcpLimits {
        first_message: shared.cfg.hello_timeout.saturating_add(CLIENT_START_SLEEP),
        idle: TCP_IDLE,
        max_life: shared.cfg.max_duration.saturating_add(DURATION_SLACK),
        max_duration: shared.cfg.max_duration,
    };
    let end = sockperf_echo::tcp_serve(stream, &limits, &shared.shutdown, started, &mut tally);
    drop(session);
    if end.is_junk() {
        shared
            .rejections
            .sockperf_junk
            .fetch_add(1, Ordering::Relaxed);
    }
    shared.report(|| crate::AgentEvent::SockperfTcpEnded {
        peer: peer.to_string(),
        messages: tally.messages,
        replies: tally.replies,
        elapsed: started.elapsed(),
        end: end.to_string(),
    });
}

// ---------------------------------------------------------------------------------------------
// UDP

/// One UDP source address being served.
struct UdpPeer<'a> {
    addr: SocketAddr,
    first_seen: Instant,
    last_seen: Instant,
    tally: Tally,
    /// Datagrams with unframable bytes from this peer.
    junk: u64,
    /// `None` once the peer has run past `max_duration`: its messages are dropped.
    session: Option<SockperfSession<'a>>,
}

fn udp_loop(udp: &UdpSocket, shared: &Shared) {
    let capacity = usize::try_from(shared.cfg.max_sessions)
        .unwrap_or(usize::MAX)
        .min(MAX_UDP_PEERS);
    let mut table = UdpPeers {
        peers: Vec::with_capacity(capacity),
        capacity,
        refused_until: None,
        last: 0,
        shared,
    };
    if let Err(e) = sockperf_echo::udp_serve(udp, &shared.shutdown, &mut table) {
        shared.report(|| crate::AgentEvent::SockperfUdpNotServed {
            why: format!("cannot set its read timeout: {e}"),
        });
        return;
    }
    for peer in table.peers.drain(..) {
        peer.end(shared, "the agent is stopping");
    }
}

/// The UDP peers being served, allocated once.
struct UdpPeers<'a> {
    peers: Vec<UdpPeer<'a>>,
    /// Most peers at once.
    capacity: usize,
    /// New peers are refused without asking for a session until then.
    refused_until: Option<Instant>,
    /// The index of the last peer served: ping-pong traffic comes from one address at a time.
    last: usize,
    shared: &'a Shared,
}

impl sockperf_echo::UdpPeers for UdpPeers<'_> {
    fn on_datagram(&mut self, udp: &UdpSocket, datagram: &mut [u8], from: SocketAddr) {
        let shared = self.shared;
        let now = Instant::now();
        // A datagram must frame before its sender costs a session.
        if !matches!(sockperf::parse(datagram, MAX_MSG), Parsed::Message(_)) {
            shared
                .rejections
                .sockperf_junk
                .fetch_add(1, Ordering::Relaxed);
            if let Some(p) = self.find(from) {
                self.peers[p].junk += 1;
            }
            return;
        }
        let index = match self.find(from) {
            Some(i) => i,
            None => {
                let Some(i) = self.admit(from, now) else {
                    shared
                        .rejections
                        .sockperf_refused
                        .fetch_add(1, Ordering::Relaxed);
                    return;
                };
                i
            }
        };
        self.last = index;
        let peer = &mut self.peers[index];
        if peer.session.is_none() {
            // Past its maximum duration: not answered until it has been quiet a while.
            peer.last_seen = now;
            return;
        }
        if serve_datagram(udp, datagram, from, &mut peer.tally) {
            // Only a message served keeps the peer's session alive.
            peer.last_seen = now;
        } else {
            peer.junk += 1;
            shared
                .rejections
                .sockperf_junk
                .fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Ends peers that have gone quiet, and stops answering those past `max_duration`.
    fn sweep(&mut self, now: Instant) {
        let shared = self.shared;
        let max_life = shared.cfg.max_duration.saturating_add(DURATION_SLACK);
        let mut i = 0;
        while i < self.peers.len() {
            let p = &mut self.peers[i];
            if now.duration_since(p.last_seen) >= UDP_IDLE {
                self.peers.swap_remove(i).end(shared, "quiet");
                continue;
            }
            if p.session.is_some() && now.duration_since(p.first_seen) >= max_life {
                p.session = None;
                shared.report(|| crate::AgentEvent::SockperfUdpOverrun {
                    peer: canonical(p.addr).to_string(),
                    max_duration_s: shared.cfg.max_duration.as_secs(),
                });
            }
            i += 1;
        }
    }
}

impl<'a> UdpPeers<'a> {
    fn find(&self, from: SocketAddr) -> Option<usize> {
        if self.peers.get(self.last).is_some_and(|p| p.addr == from) {
            return Some(self.last);
        }
        self.peers.iter().position(|p| p.addr == from)
    }

    /// Starts a session for a new peer: its index, or `None` when the agent is full.
    fn admit(&mut self, from: SocketAddr, now: Instant) -> Option<usize> {
        let shared: &'a Shared = self.shared;
        if self.refused_until.is_some_and(|t| now < t) {
            return None;
        }
        let session = if self.peers.len() < self.capacity {
            admit(shared, from.ip())
        } else {
            None
        };
        let Some(session) = session else {
            self.refused_until = Some(now + REFUSAL_HOLD);
            return None;
        };
        // Within the capacity reserved at the start: no allocation.
        self.peers.push(UdpPeer {
            addr: from,
            first_seen: now,
            last_seen: now,
            tally: Tally::default(),
            junk: 0,
            session: Some(session),
        });
        Some(self.peers.len() - 1)
    }
}

impl UdpPeer<'_> {
    /// Frees the session and writes the peer's log line.
    fn end(self, shared: &Shared, why: &str) {
        let Self {
            addr,
            first_seen,
            last_seen,
            tally,
            junk,
            session,
        } = self;
        drop(session);
        let junk = if junk > 0 {
            format!(", {junk} junk datagrams")
        } else {
            String::new()
        };
        shared.report(|| crate::AgentEvent::SockperfUdpEnded {
            peer: canonical(addr).to_string(),
            messages: tally.messages,
            replies: tally.replies,
            junk,
            elapsed: last_seen.duration_since(first_seen),
            why: why.to_owned(),
        });
    }
}

// ---------------------------------------------------------------------------------------------
// Helpers

/// An IPv4 client of a dual-stack listener is shown as IPv4, not `::ffff:a.b.c.d`.
fn canonical(a: SocketAddr) -> SocketAddr {
    SocketAddr::new(a.ip().to_canonical(), a.port())
}
