//! Ping-pong loops (client) and echoes (agent).

use std::io;
use std::net::{TcpStream, UdpSocket};
use std::sync::atomic::AtomicBool;

use sonde_engine::rtt::RttRecorder;
use sonde_engine::seq::SeqTracker;

use crate::{Clock, Counters};

/// How a latency run goes.
#[derive(Debug, Clone, Copy)]
pub struct PingConfig {
    /// Message size, bytes (1 to 65,507 for UDP; 1 to 65,536 for TCP).
    pub msg_size: u32,
    /// Stop sending at this time on the test clock.
    pub until_ns: u64,
    /// Samples of messages sent before this time are excluded (warm-up).
    pub warmup_ns: u64,
    /// `None`: closed loop, one message in flight. `Some(r)`: open loop, `r` messages per second
    /// on a fixed schedule, RTT measured from each message's scheduled send time.
    pub rate: Option<f64>,
}

/// What a latency run measured.
#[derive(Debug, Clone)]
pub struct LatencyOutcome {
    /// RTT samples.
    pub rtt: RttRecorder,
    /// Messages sent (warm-up included).
    pub sent: u64,
    /// UDP: sequence accounting of the replies (lost = sent - received).
    pub seq: Option<SeqTracker>,
    /// Open loop: sends that left more than 1 ms after their scheduled time.
    pub late_sends: u64,
    /// UDP closed loop: replies not back within the reply timeout (the run moved on; a reply
    /// that arrives later still counts as received).
    pub timeouts: u64,
}

/// Agent side: echoes every byte back until EOF or `stop`.
pub fn tcp_echo(stream: &TcpStream, stop: &AtomicBool, counters: &Counters) -> io::Result<()> {
    todo!("{stream:?} {stop:?} {counters:?}")
}

/// Agent side: echoes every datagram back on a connected flow socket until `stop`; answers join
/// requests with acknowledgements (not counted).
pub fn udp_echo(sock: &UdpSocket, stop: &AtomicBool, counters: &Counters) -> io::Result<()> {
    todo!("{sock:?} {stop:?} {counters:?}")
}

/// Client side, TCP (`TCP_NODELAY` set by the caller): closed or open loop per `cfg.rate`.
pub fn tcp_ping(
    stream: &TcpStream,
    cfg: &PingConfig,
    clock: &Clock,
    stop: &AtomicBool,
) -> io::Result<LatencyOutcome> {
    todo!("{stream:?} {cfg:?} {clock:?} {stop:?}")
}

/// Client side, UDP on a connected socket: closed or open loop per `cfg.rate`. A reply not back
/// within `max(100 ms, 10 × median RTT so far)` is given up on (the next message goes); a late
/// reply still counts. After `until_ns` the loop drains replies for up to that timeout.
pub fn udp_ping(
    sock: &UdpSocket,
    cfg: &PingConfig,
    clock: &Clock,
    stop: &AtomicBool,
) -> io::Result<LatencyOutcome> {
    todo!("{sock:?} {cfg:?} {clock:?} {stop:?}")
}
