//! Clock probes (`sonde latency --one-way`): the agent's side of the NTP-style exchanges a
//! client makes over the control channel to estimate this host's clock offset.
//!
//! The answer carries the probe's `t1` back with `t2` (when the session's event loop took the
//! probe) and `t3` (just before the reply is written), both on
//! [`sonde_net::latency::host_clock_ns`], the clock the latency echoes stamp one-way requests
//! with. The time the probe spent crossing from the control reader thread to the event loop
//! counts as network time for the exchange; it makes the exchange's round trip longer, so the
//! client trusts it less (its bound is half the round trip), never more.

use std::net::TcpStream;
use std::sync::Mutex;

use sonde_net::control::write_frame;
use sonde_net::latency::host_clock_ns;
use sonde_wire::ControlMsg;

use crate::lock;

/// Answers one `ClockProbe` whose `t1` is `client_send_ns`.
///
/// # Errors
/// The control connection failed (as the session loop words it).
pub(crate) fn answer(client_send_ns: u64, writer: &Mutex<TcpStream>) -> Result<(), String> {
    let agent_receive_ns = host_clock_ns();
    let mut w = lock(writer);
    let reply = ControlMsg::ClockReply {
        client_send_ns,
        agent_receive_ns,
        agent_send_ns: host_clock_ns(),
    };
    write_frame(&mut w, &reply).map_err(|e| format!("control connection lost: {e}"))
}
