//! What every control connection may be answered before it is a session (a test or a helper
//! request): the check of the client's proof of the shared secret, a refusal, the one-line
//! description of a test for the log, and whether the peer has gone.
//!
//! Below both `session` and `helper`, which use it; it uses neither.

use std::net::TcpStream;
use std::sync::atomic::Ordering;

use sonde_net::control::write_frame;
use sonde_wire::auth::{Nonce, Proof, Request, SessionKey};
use sonde_wire::{ControlMsg, Protocol, Refusal, TestKind, TestSpec};

use crate::{peer_of, AgentEvent, Shared};

/// Checks the client's proof of the shared secret when the agent has one, refusing the client
/// when it is missing or wrong; the session's key (`None` without a secret).
pub(crate) fn authenticate(
    shared: &Shared,
    ctrl: &mut TcpStream,
    (agent, client): &(Nonce, Nonce),
    request: &Request<'_>,
    proof: Option<Proof>,
) -> Result<Option<SessionKey>, ()> {
    let Some(secret) = &shared.cfg.secret else {
        return Ok(None);
    };
    let message = match proof {
        Some(p) if secret.check_proof(agent, client, request, &p) => {
            return Ok(Some(secret.session_key(agent, client)));
        }
        Some(_) => "the shared secret does not match the agent's (check --secret-file or SONDE_SECRET on both sides)",
        None => "this agent requires a shared secret: give the client the agent's with --secret-file FILE or SONDE_SECRET",
    };
    shared
        .rejections
        .unauthenticated
        .fetch_add(1, Ordering::Relaxed);
    refuse(shared, ctrl, Refusal::Unauthenticated, message);
    Err(())
}

pub(crate) fn refuse(shared: &Shared, ctrl: &mut TcpStream, reason: Refusal, message: &str) {
    shared.rejections.refused.fetch_add(1, Ordering::Relaxed);
    shared.stats.refused(reason);
    shared.report(|| AgentEvent::Refused {
        peer: peer_of(ctrl),
        message: message.to_owned(),
    });
    let _ = write_frame(
        ctrl,
        &ControlMsg::Refused {
            reason,
            message: message.into(),
        },
    );
}

pub(crate) fn describe(spec: &TestSpec) -> String {
    let proto = match spec.protocol {
        Protocol::Tcp => "tcp",
        Protocol::Udp => "udp",
    };
    let kind = match spec.kind {
        TestKind::Latency => "latency",
        TestKind::Throughput => "throughput",
        TestKind::Pps => "pps",
        TestKind::Crr => "crr",
    };
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
