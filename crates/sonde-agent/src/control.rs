//! What the drivers of control connections share (a session's and a helper request's): a
//! refusal counted and reported, the one-line description of a test for the log, and whether
//! the peer has gone.
//!
//! Below both `session` and `helper`, which use it; it uses neither.

use std::net::TcpStream;
use std::sync::atomic::Ordering;

use sonde_wire::{Protocol, Refusal, TestSpec};

use crate::{peer_of, AgentEvent, Shared};

/// Counts and reports a refusal of the client on `ctrl` (the `Refused` message is the
/// conversation's to send).
pub(crate) fn refused(shared: &Shared, ctrl: &TcpStream, reason: Refusal, message: String) {
    shared.rejections.refused.fetch_add(1, Ordering::Relaxed);
    shared.stats.refused(reason);
    shared.report(|| AgentEvent::Refused {
        peer: peer_of(ctrl),
        message,
    });
}

pub(crate) fn describe(spec: &TestSpec) -> String {
    let proto = match spec.protocol {
        Protocol::Tcp => "tcp",
        Protocol::Udp => "udp",
    };
    let kind = spec.kind.name();
    format!(
        "{proto} {kind}, {} stream(s) {:?}, {} B, {:.1} s",
        spec.streams,
        spec.direction,
        spec.msg_size,
        spec.duration_ms as f64 / 1e3
    )
}

/// Whether the peer has closed (or reset) a connection we are not reading yet.
pub(crate) fn peer_gone(ctrl: &TcpStream) -> bool {
    if ctrl.set_nonblocking(true).is_err() {
        return true;
    }
    let mut b = [0u8; 1];
    let gone = match ctrl.peek(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
    };
    let _ = ctrl.set_nonblocking(false);
    gone
}
