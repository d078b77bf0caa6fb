//! The agent's side of mesh probes (`sonde_wire::probe`): a probe on the shared UDP port, or as
//! the first bytes of a TCP connection, is answered statelessly (no session, no `--max-sessions`
//! place, no per-source session cap) when its MAC is the agent's secret's, its send time is
//! within the replay window and its (sender, nonce) is new; anything else is counted by reason
//! and gets no answer. An agent without a secret answers no probe (docs/mesh.md: a mesh needs a
//! secret).

use std::collections::HashMap;
use std::io::{self, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sonde_wire::probe::{Freshness, Probe, ProbeError, ProbeReply, ReplayGuard, MAX_PROBE_LEN};

use crate::{lock, Shared};

/// Why a probe got no answer ([`crate::Stats::probe_refusals_of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProbeRefusal {
    /// Its MAC is not this agent's secret's (or this agent has no secret).
    Mac,
    /// Its send time is outside the replay window of this agent's clock.
    Stale,
    /// Its (sender, nonce) was answered before.
    Replay,
    /// The replay guard holds its maximum of recent nonces.
    Overload,
}

impl ProbeRefusal {
    /// Every reason, in [`crate::Stats::probe_refusals`] order.
    pub const ALL: [Self; 4] = [Self::Mac, Self::Stale, Self::Replay, Self::Overload];

    pub(crate) fn index(self) -> usize {
        match self {
            Self::Mac => 0,
            Self::Stale => 1,
            Self::Replay => 2,
            Self::Overload => 3,
        }
    }
}

/// Most nonces one generation of the replay guard keeps (three generations of at most this
/// many 16-byte keys: about 50 MB at worst; 10,000 probes a second over a 30 s window fill a
/// third of it).
const GUARD_CAPACITY: usize = 1 << 20;
/// Most distinct senders remembered for `sonde_mesh_incoming_probers`; past it the oldest
/// entries are dropped first.
const MAX_SENDERS: usize = 1 << 16;

/// The replay guard and who probed recently.
pub(crate) struct Desk {
    state: Mutex<State>,
    recent: Duration,
}

struct State {
    guard: ReplayGuard,
    /// Sender name -> when its last valid probe came (agent's monotonic clock).
    senders: HashMap<String, Instant>,
    last_count: Option<Instant>,
}

impl Desk {
    pub(crate) fn new(window: Duration, recent: Duration) -> Self {
        Self {
            state: Mutex::new(State {
                guard: ReplayGuard::new(
                    u64::try_from(window.as_nanos()).unwrap_or(u64::MAX),
                    GUARD_CAPACITY,
                ),
                senders: HashMap::new(),
                last_count: None,
            }),
            recent,
        }
    }

    /// Checks `datagram` and, when it is a probe to answer, writes the reply into `out`:
    /// `Ok(reply length)`; `Err(None)` when it is not a probe at all.
    pub(crate) fn answer(
        &self,
        shared: &Shared,
        datagram: &[u8],
        out: &mut [u8; MAX_PROBE_LEN],
    ) -> Result<usize, Option<ProbeRefusal>> {
        if Probe::parse(datagram).is_err() {
            return Err(None);
        }
        let refuse = |r: ProbeRefusal| {
            shared.stats.probe_refusals[r.index()].fetch_add(1, Ordering::Relaxed);
            Err(Some(r))
        };
        let Some(secret) = &shared.cfg.secret else {
            return refuse(ProbeRefusal::Mac);
        };
        let probe = match Probe::decode(secret, datagram) {
            Ok(p) => p,
            Err(ProbeError::BadMac) => return refuse(ProbeRefusal::Mac),
            Err(_) => return Err(None),
        };
        let now_unix_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        {
            let mut state = lock(&self.state);
            match state.guard.check(&probe, now_unix_ns) {
                Freshness::Fresh => {}
                Freshness::Stale => return refuse(ProbeRefusal::Stale),
                Freshness::Replayed => return refuse(ProbeRefusal::Replay),
                Freshness::Full => return refuse(ProbeRefusal::Overload),
            }
            let now = Instant::now();
            if let Some(seen) = state.senders.get_mut(probe.sender) {
                *seen = now;
            } else {
                if state.senders.len() >= MAX_SENDERS {
                    self.prune(&mut state, now);
                }
                if state.senders.len() < MAX_SENDERS {
                    state.senders.insert(probe.sender.to_owned(), now);
                }
            }
        }
        shared.stats.probes_answered.fetch_add(1, Ordering::Relaxed);
        ProbeReply::answer(secret, &probe, datagram.len(), out).map_err(|_| None)
    }

    fn prune(&self, state: &mut State, now: Instant) {
        let recent = self.recent;
        state
            .senders
            .retain(|_, seen| now.saturating_duration_since(*seen) < recent);
    }

    /// Refreshes [`crate::Stats::incoming_probers`] (distinct senders of a valid probe within
    /// `recent`), at most once a second.
    pub(crate) fn count_probers(&self, shared: &Shared) {
        let now = Instant::now();
        let mut state = lock(&self.state);
        if state
            .last_count
            .is_some_and(|t| now.saturating_duration_since(t) < Duration::from_secs(1))
        {
            return;
        }
        state.last_count = Some(now);
        self.prune(&mut state, now);
        shared
            .stats
            .incoming_probers
            .store(state.senders.len() as u64, Ordering::Relaxed);
    }
}

/// A datagram on the shared UDP port that starts like a probe: answered, or counted and
/// dropped. False when it is not a probe at all.
pub(crate) fn udp(udp: &UdpSocket, datagram: &[u8], from: SocketAddr, shared: &Shared) -> bool {
    let mut out = [0u8; MAX_PROBE_LEN];
    match shared.probes.answer(shared, datagram, &mut out) {
        Ok(n) => {
            let _ = udp.send_to(&out[..n], from);
            true
        }
        Err(refused) => refused.is_some(),
    }
}

/// A TCP connection whose first 8 bytes (`prefix`) start a probe of `len` bytes: reads the
/// rest by `deadline`, answers and closes (the agent closes first, so the TIME_WAIT is the
/// agent's, not the prober's many source ports'). False when it was not a valid probe.
pub(crate) fn tcp(
    mut stream: TcpStream,
    prefix: [u8; 8],
    len: usize,
    shared: &Shared,
    deadline: Instant,
) -> bool {
    let mut b = [0u8; MAX_PROBE_LEN];
    b[..8].copy_from_slice(&prefix);
    if sonde_net::control::read_exact_by(&mut stream, &mut b[8..len], deadline).is_err() {
        return false;
    }
    let mut out = [0u8; MAX_PROBE_LEN];
    match shared.probes.answer(shared, &b[..len], &mut out) {
        Ok(n) => {
            let _ = stream.set_nodelay(true);
            let _ = stream.set_write_timeout(Some(
                deadline
                    .saturating_duration_since(Instant::now())
                    .max(Duration::from_millis(10)),
            ));
            let written: io::Result<()> = stream.write_all(&out[..n]);
            written.is_ok()
        }
        Err(refused) => refused.is_some(),
    }
}

/// How long the accepting thread waits for a new connection's first bytes before handing it
/// to a thread of its own. A prober writes its probe as soon as its connect completes, but the
/// accept is woken by the handshake's last ACK, a moment before the probe: without this wait
/// most probe connections would cost a thread (measured at 5,000 peers: two thirds of them,
/// 330 threads a second). A connection that sends nothing this long costs the accept loop this
/// long once.
pub(crate) const FIRST_BYTES_WAIT: Duration = Duration::from_millis(5);

/// A new connection whose whole probe arrives within [`FIRST_BYTES_WAIT`] (the usual case: the
/// prober writes it as soon as the handshake completes) is answered on the accepting thread,
/// without a thread of its own; anything else is handed back, untouched, to be served as before
/// (a probe still in flight then gets a connection thread). Per probe: a peek without waiting
/// (and a `poll` when nothing had arrived yet), one read, one write, and the close (no
/// `TCP_NODELAY`: Nagle's algorithm does not hold a connection's first write, nothing being
/// unacknowledged).
pub(crate) fn answer_at_accept(stream: TcpStream, shared: &Shared) -> Option<TcpStream> {
    let mut b = [0u8; MAX_PROBE_LEN];
    let have = match sonde_net::socket::peek_now(&stream, &mut b) {
        Ok(n) => n,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
            if !matches!(
                sonde_net::socket::wait_readable(&stream, FIRST_BYTES_WAIT),
                Ok(true)
            ) {
                return Some(stream);
            }
            match sonde_net::socket::peek_now(&stream, &mut b) {
                Ok(n) => n,
                Err(_) => return Some(stream),
            }
        }
        Err(_) => return Some(stream),
    };
    let Some(len) = (match b.get(..8) {
        Some(&[a0, a1, a2, a3, a4, a5, a6, a7]) if have >= 8 => {
            sonde_wire::probe::probe_len_from_prefix(&[a0, a1, a2, a3, a4, a5, a6, a7])
        }
        _ => None,
    }) else {
        return Some(stream);
    };
    if have < len {
        return Some(stream);
    }
    let mut stream = stream;
    // The bytes are there (peeked): this read does not wait.
    if io::Read::read_exact(&mut stream, &mut b[..len]).is_err() {
        return None;
    }
    let mut out = [0u8; MAX_PROBE_LEN];
    match shared.probes.answer(shared, &b[..len], &mut out) {
        Ok(n) => {
            // A fresh connection's send buffer takes a probe's reply whole.
            if !matches!(stream.write(&out[..n]), Ok(w) if w == n) {
                shared.rejections.bad_hello.fetch_add(1, Ordering::Relaxed);
            }
        }
        Err(None) => {
            shared.rejections.bad_hello.fetch_add(1, Ordering::Relaxed);
        }
        Err(Some(_)) => {}
    }
    None
}
