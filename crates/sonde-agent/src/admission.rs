//! Connections not yet admitted: how many each listener and each source address may hold, and
//! how a connection over those limits is turned away so that its client can say why.
//!
//! Each listener that spawns a thread per new connection (sonde's port, the iperf3 port) has its
//! own [`Pending`] count, so filling one does not lock out the other, and within it each source
//! address may hold at most `max_pending_per_source`, so one address does not lock out the
//! others. A source with sessions waiting for their data channels (or running crr workers) may
//! hold that many more, so a client's own burst of data connections is never refused.

use std::collections::HashMap;
use std::io::Write;
use std::net::{IpAddr, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use sonde_wire::{ControlMsg, Refusal};

use crate::{canonical, lock, Shared};

/// Which listener a pending connection came in by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Door {
    /// sonde's own port (control, data, crr).
    Sonde,
    /// The iperf3 listener.
    Iperf3,
}

/// Why a connection was not let in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Full {
    /// The listener holds its maximum of pending connections.
    Listener,
    /// The connection's source address holds its maximum.
    Source,
}

/// Pending connections of one listener: in total and per source address.
#[derive(Debug)]
pub(crate) struct Pending {
    max_total: usize,
    max_per_source: usize,
    state: Mutex<PendingState>,
}

#[derive(Debug, Default)]
struct PendingState {
    total: usize,
    by_source: HashMap<IpAddr, usize>,
}

impl Pending {
    pub(crate) fn new(max_total: usize, max_per_source: usize) -> Self {
        Self {
            max_total,
            max_per_source,
            state: Mutex::new(PendingState::default()),
        }
    }

    /// Counts a new connection from `ip`, which may hold `allowance` more than the per-source
    /// limit, and find that much more room in the listener (the connections its admitted
    /// sessions still expect are never crowded out by strangers); refused when the listener or
    /// the source is full.
    fn enter(&self, ip: IpAddr, allowance: usize) -> Result<(), Full> {
        let mut st = lock(&self.state);
        if st.total >= self.max_total.saturating_add(allowance) {
            return Err(Full::Listener);
        }
        let mine = st.by_source.entry(ip).or_insert(0);
        if *mine >= self.max_per_source.saturating_add(allowance) {
            if *mine == 0 {
                st.by_source.remove(&ip);
            }
            return Err(Full::Source);
        }
        *mine += 1;
        st.total += 1;
        Ok(())
    }

    fn leave(&self, ip: IpAddr) {
        let mut st = lock(&self.state);
        st.total = st.total.saturating_sub(1);
        if let Some(mine) = st.by_source.get_mut(&ip) {
            *mine = mine.saturating_sub(1);
            if *mine == 0 {
                st.by_source.remove(&ip);
            }
        }
    }

    /// Connections pending now: in total, and from `ip`.
    #[cfg(test)]
    fn counts(&self, ip: IpAddr) -> (usize, usize) {
        let st = lock(&self.state);
        (st.total, st.by_source.get(&ip).copied().unwrap_or(0))
    }
}

/// A connection counted as pending until this drops (or is taken out of its `Option`).
pub(crate) struct PendingGuard {
    shared: Arc<Shared>,
    door: Door,
    ip: IpAddr,
}

impl Drop for PendingGuard {
    fn drop(&mut self) {
        self.shared.pending(self.door).leave(self.ip);
    }
}

/// Lets `stream` in as a pending connection of `door`, or turns it away with a refusal its
/// client can read (sonde's `Refused` frame, iperf3's ACCESS_DENIED) and counts it. `allowance`
/// says how many data connections the source's admitted sessions still expect: it may hold that
/// many more.
pub(crate) fn let_in(
    shared: &Arc<Shared>,
    door: Door,
    stream: &TcpStream,
    allowance: impl FnOnce(IpAddr) -> usize,
) -> Option<PendingGuard> {
    let ip = canonical(stream.peer_addr().ok()?.ip());
    match shared.pending(door).enter(ip, allowance(ip)) {
        Ok(()) => Some(PendingGuard {
            shared: Arc::clone(shared),
            door,
            ip,
        }),
        Err(full) => {
            let counter = match full {
                Full::Listener => &shared.rejections.pending_full,
                Full::Source => &shared.rejections.pending_source_full,
            };
            counter.fetch_add(1, Ordering::Relaxed);
            turn_away(shared, door, full, stream);
            None
        }
    }
}

/// Writes the refusal without blocking the accept loop (a new connection's send buffer has room
/// for it); the caller then closes the connection. A client that has already written its hello
/// still reads this refusal: the close may reset the connection, but Linux keeps what had
/// arrived readable, and sonde's client reads the reply even when its own write failed.
fn turn_away(shared: &Shared, door: Door, full: Full, mut stream: &TcpStream) {
    if stream.set_nonblocking(true).is_err() {
        return;
    }
    match door {
        Door::Sonde => {
            let (reason, message) = match full {
                Full::Listener => (
                    Refusal::Busy,
                    format!(
                        "the agent has its maximum of {} connections that are not yet sessions; try again shortly",
                        shared.cfg.max_pending
                    ),
                ),
                Full::Source => (
                    Refusal::SourceBusy,
                    format!(
                        "this address has its maximum of {} connections at the agent that are not yet sessions; try again shortly (sonde server --max-pending-per-source)",
                        shared.cfg.max_pending_per_source
                    ),
                ),
            };
            shared.stats.refused(reason);
            let mut frame = Vec::new();
            if sonde_wire::encode_frame(&ControlMsg::Refused { reason, message }, &mut frame)
                .is_ok()
            {
                let _ = stream.write_all(&frame);
            }
        }
        Door::Iperf3 => {
            // What iperf3 prints as "the server is busy running a test. try again later".
            let _ = stream.write_all(&[sonde_wire::iperf3::State::AccessDenied.byte()]);
        }
    }
    let _ = stream.shutdown(std::net::Shutdown::Write);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_source_and_the_listener_have_their_own_limit() {
        let p = Pending::new(5, 2);
        let (a, b): (IpAddr, IpAddr) =
            ("198.18.0.1".parse().unwrap(), "198.18.0.2".parse().unwrap());
        assert_eq!(p.enter(a, 0), Ok(()));
        assert_eq!(p.enter(a, 0), Ok(()));
        assert_eq!(p.enter(a, 0), Err(Full::Source));
        // The same source with joins of its own to come may hold more.
        assert_eq!(p.enter(a, 1), Ok(()));
        assert_eq!(p.enter(b, 0), Ok(()));
        assert_eq!(p.enter(b, 0), Ok(()));
        assert_eq!(p.counts(a), (5, 3));
        let c: IpAddr = "198.18.0.3".parse().unwrap();
        assert_eq!(p.enter(c, 0), Err(Full::Listener));
        p.leave(a);
        assert_eq!(p.enter(c, 0), Ok(()));
        for ip in [a, a, b, b, c] {
            p.leave(ip);
        }
        assert_eq!(p.counts(a), (0, 0));
        assert!(lock(&p.state).by_source.is_empty(), "no entry left behind");
    }
}
