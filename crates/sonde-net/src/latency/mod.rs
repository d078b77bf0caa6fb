//! Ping-pong loops (client) and echoes (agent).
//!
//! * Closed loop (`rate: None`): one message in flight; RTT is the receive time minus the send
//!   time of that message.
//! * Open loop (`rate: Some(r)`): a sender thread sends message `i` at its scheduled time and
//!   never skips one (a message that could not leave on time leaves late); the calling thread
//!   reads the replies. RTT is measured from the *scheduled* send time, so a stall delays the
//!   measurement of every message queued behind it instead of hiding them (coordinated
//!   omission, as wrk2 and oha do it). The schedule starts when the call starts.
//!
//! Waiting: every loop blocks in the kernel (`SO_RCVTIMEO` as a poll interval for the stop flag
//! and deadlines) rather than spinning on a non-blocking socket, unless the caller made the
//! socket non-blocking ([`crate::tune`], `--busy-poll`): then each wait is a spin on `recv`
//! that looks at the stop flag and the deadline at every `EAGAIN`, bounded as the blocking
//! wait is. A spinning loop needs a core of its own, and so does the echo at the other end: on
//! a 2-core host with both ends unpinned, busy polling read higher medians than blocking (the
//! spinning client took the core the echo needed). Pinned to two cores (`--cpu`, the agent's
//! `--cpu-list`) it roughly halves the loopback median; the book's Performance page (docs/performance.md) has
//! the figures, against a bare busy-polled C loop (`bench/floor/floor.c`).
//!
//! The loops set the socket's read (and, for TCP, write) timeouts and restore the previous ones
//! when they return.
//!
//! [`Framing`] says how a message looks on the wire: sonde's (the sequence number in its first
//! bytes; nothing at all over TCP) or sockperf's 14-byte header, so that the same loops measure
//! against a real `sockperf server`.
//!
//! [`ping`] runs the client's loops on either socket ([`LatencySocket`]), [`echo`] the agent's;
//! the inner view ([`InnerView`]) adds every sample to
//! the full log, kernel timestamps, and the agent's stamps for one-way delay (see
//! [`sonde_wire::stamps`]). The echoes stamp any message that asks, on [`host_clock_ns`].

use std::io;
use std::net::{TcpStream, UdpSocket};
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use sonde_engine::rtt::RttRecorder;
use sonde_engine::seq::SeqTracker;
use sonde_wire::stamps;

use crate::{fault, sys, Clock, Counters};

mod echo;
mod framing;
mod inner;
mod open;
pub mod rr;
pub mod sockperf_echo;
mod tcp;
mod transport;
mod txstamp;
mod udp;

pub use framing::Framing;
use inner::Recorder;
pub use inner::{InnerView, IntervalView, OneWayLink, OneWayOutcome, RttInterval, SocketOutcome};

/// Data-path system calls the client's ping loops run on the calling thread have made (sends,
/// receives, reads of the transmit-timestamp queue; a `write_all` of a message larger than the
/// socket takes at once is counted as one), the calls of the threads a loop starts (the open
/// loop's sender) included once the loop returns. A caller takes the difference around one run
/// on its thread; runs on other threads at the same time do not mix in. The agent's echoes
/// count theirs in their [`Counters`].
pub fn ping_syscalls() -> u64 {
    PING_CALLS.with(std::cell::Cell::get)
}

thread_local! {
    /// This thread's count for [`ping_syscalls`]: a plain cell, no atomic in the hot loop.
    static PING_CALLS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

#[inline]
fn count_call() {
    add_calls(1);
}

fn add_calls(n: u64) {
    PING_CALLS.with(|c| c.set(c.get().wrapping_add(n)));
}

/// Adds `n` calls to this thread's [`ping_syscalls`]: a caller that ran a loop on a thread of
/// its own (to read its `-i` intervals meanwhile) credits that thread's calls to the thread
/// that counts the run.
pub fn credit_ping_syscalls(n: u64) {
    add_calls(n);
}

/// This host's monotonic clock, ns (`CLOCK_MONOTONIC` on Linux: since boot, the same in every
/// process of the host). The echoes stamp one-way requests with it, and the agent answers clock
/// probes with it, so that the two agree without sharing a [`Clock`].
pub fn host_clock_ns() -> u64 {
    sys::monotonic_ns()
}

/// `-i`: the end of the interval that began at `start_ns` (`every_ns` long), if it is over by
/// `now_ns` and ends before the run's planned end `until_ns`; the last interval is not cut here
/// but runs to the moment the loop stops. The one-flow and the many-flow loops cut alike.
fn interval_over(start_ns: u64, every_ns: u64, until_ns: u64, now_ns: u64) -> Option<u64> {
    let end_ns = start_ns.saturating_add(every_ns.max(1));
    (now_ns >= end_ns && end_ns < until_ns).then_some(end_ns)
}

/// Largest TCP latency message, bytes.
pub const TCP_MAX_MSG: u32 = 65_536;
/// Largest UDP latency message, bytes: 65,535 less the IPv4 (20) and UDP (8) headers.
pub const UDP_MAX_MSG: u32 = 65_507;
/// How long a TCP reply may take before the run fails with [`io::ErrorKind::TimedOut`]
/// (closed loop), and how long a blocked TCP write may make no progress.
pub const TCP_REPLY_TIMEOUT: Duration = Duration::from_secs(5);
/// Open loop over TCP: how long the reader waits for the remaining replies after the last send.
pub const TCP_OPEN_LOOP_DRAIN: Duration = Duration::from_secs(2);
/// The shortest UDP reply timeout; the timeout is `max(this, 10 × median RTT so far)`. Short,
/// because a closed loop stalls for it at every lost reply (at 1% loss a 100 ms floor cut a
/// 10 µs loop to 1% of its samples); a reply that comes later still counts.
pub const UDP_MIN_REPLY_TIMEOUT: Duration = Duration::from_millis(1);
/// The UDP reply timeout before the first RTT is known.
pub const UDP_FIRST_REPLY_TIMEOUT: Duration = Duration::from_secs(1);
/// A scheduled send that leaves later than this counts in [`LatencyOutcome::late_sends`].
pub const LATE_SEND: Duration = Duration::from_millis(1);
/// sockperf framing over UDP: a run that has had no reply at all this long after its first send
/// ends with [`NoReply`] (nothing answers sockperf messages there), rather than sending into the
/// void until `until_ns`.
pub const SOCKPERF_NO_REPLY: Duration = Duration::from_secs(3);

/// Echo loops: how often a blocked read looks at the stop flag.
const ECHO_POLL: Duration = Duration::from_millis(100);
/// UDP client: how often a blocked `recv` looks at deadlines and the stop flag. Blocking `recv`
/// is woken by the kernel as soon as a datagram arrives, so this costs no latency.
const UDP_POLL: Duration = Duration::from_millis(10);
/// TCP client reader: how often a blocked read looks at deadlines and the stop flag.
const TCP_POLL: Duration = Duration::from_millis(100);
/// Receive buffer for UDP: the largest UDP payload over IPv6 without jumbograms fits.
const UDP_RECV_BUF: usize = 65_535;
/// TCP echo buffer.
const TCP_ECHO_BUF: usize = 64 * 1024;
/// Bytes of a one-way message's header (`sonde_wire::stamps`).
const STAMPS_LEN: usize = stamps::ONE_WAY_MIN_MSG as usize;
/// Send times of the last this many UDP closed-loop messages are kept for late replies.
const SEND_RING: usize = 65_536;
/// The UDP closed loop re-reads the median for its reply timeout this often (and at every power
/// of two before that): a percentile query walks the histogram.
const TIMEOUT_REFRESH: u64 = 1024;

/// Why a sockperf-framed run got no reply at all. It travels inside the [`io::Error`] the ping
/// functions return (`error.get_ref()` downcasts to it), so that a caller can tell "nothing
/// answers there" from a failure in the middle of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoReply {
    /// No reply within this long of the first message.
    TimedOut(Duration),
    /// The TCP peer closed the connection before its first reply.
    Closed,
}

impl std::fmt::Display for NoReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::TimedOut(d) => write!(f, "no reply within {} s", d.as_secs_f64()),
            Self::Closed => f.write_str("the peer closed the connection before its first reply"),
        }
    }
}

impl std::error::Error for NoReply {}

impl NoReply {
    /// The `NoReply` inside an error from [`ping`] with sockperf framing, if any.
    pub fn of(e: &io::Error) -> Option<NoReply> {
        e.get_ref()
            .and_then(|inner| inner.downcast_ref::<NoReply>())
            .copied()
    }

    fn into_io(self) -> io::Error {
        let kind = match self {
            Self::TimedOut(_) => io::ErrorKind::TimedOut,
            Self::Closed => io::ErrorKind::UnexpectedEof,
        };
        io::Error::new(kind, self)
    }
}

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
    /// Closed loop: stop once this many messages have been sent after the warm-up (whichever
    /// of this and `until_ns` comes first). Open loop ignores it: the caller sets `until_ns`
    /// from the rate instead.
    pub count: Option<u64>,
}

impl PingConfig {
    /// Whether a closed loop that has sent `measured` messages since the warm-up is done.
    fn counted_out(&self, measured: u64) -> bool {
        self.count.is_some_and(|c| measured >= c)
    }
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
    /// `--timestamps`: the RTT at the sockets (`None` when not asked for).
    pub socket: Option<SocketOutcome>,
    /// `--one-way`: the one-way delays as recorded (`None` when not asked for).
    pub one_way: Option<OneWayOutcome>,
    /// `--full-log`: how the log went; set by whoever finishes the log (the loops only feed
    /// it).
    pub log: Option<crate::samplelog::LogSummary>,
}

/// A socket the latency loops run on: a `TcpStream` (`TCP_NODELAY` set by the caller) or a
/// connected `UdpSocket`. Sealed: the loops are written for exactly these two
/// (`transport::Transport`).
pub trait LatencySocket: sealed::Sealed {}

impl<T: sealed::Sealed> LatencySocket for T {}

mod sealed {
    use std::io;
    use std::sync::atomic::AtomicBool;

    use super::transport::Transport;
    use super::{Framing, InnerView, LatencyOutcome, PingConfig};
    use crate::{Clock, Counters};

    /// The two sockets, and the loops monomorphised for each.
    pub trait Sealed {
        fn ping(
            &self,
            cfg: &PingConfig,
            framing: Framing,
            view: InnerView,
            clock: &Clock,
            stop: &AtomicBool,
        ) -> io::Result<LatencyOutcome>;

        fn echo(&self, stop: &AtomicBool, counters: &Counters) -> io::Result<()>;
    }

    impl<T: Transport> Sealed for T {
        fn ping(
            &self,
            cfg: &PingConfig,
            framing: Framing,
            view: InnerView,
            clock: &Clock,
            stop: &AtomicBool,
        ) -> io::Result<LatencyOutcome> {
            super::transport::ping(self, cfg, framing, view, clock, stop)
        }

        fn echo(&self, stop: &AtomicBool, counters: &Counters) -> io::Result<()> {
            super::echo::echo(self, stop, counters)
        }
    }
}

/// Client side: a latency run on `sock`, closed or open loop per `cfg.rate`, its messages laid
/// out as `framing` says, with the inner view `view` ([`InnerView::default`]: none).
///
/// * TCP: messages of 1 to [`TCP_MAX_MSG`] bytes; with [`Framing::Sockperf`], 14 to
///   [`sockperf::MAX_TCP_MSG`](sonde_wire::sockperf::MAX_TCP_MSG) (a `sockperf server` takes
///   up to 65,507 unless started with a larger `-m`), and a closed loop fails with
///   `InvalidData` on a reply that does not answer the message in flight. A message's
///   transmit stamp is the one of its last byte.
/// * UDP, on a connected socket: messages of 1 to [`UDP_MAX_MSG`] bytes (14 to 65,507 with
///   sockperf's framing, where datagrams that are not sockperf replies to a message sent are
///   ignored). A reply not back within `max(1 ms, 10 × median RTT so far)` (1 s before the
///   first reply) is given up on (the next message goes); a late reply still counts. After
///   `until_ns` the loop drains replies for up to that timeout. Lost replies are not errors:
///   they are counted, and the full log has them too.
///
/// The inner view: every sample to `view.log`, the kernel's receive and transmit timestamps,
/// the agent's stamps for one-way delay (sonde framing only, messages of at least
/// [`stamps::ONE_WAY_MIN_MSG`] bytes). Kernel timestamps the socket refuses are not an error:
/// the outcome says why they are missing.
///
/// # Errors
/// `InvalidInput` for a message size out of bounds, a rate that is not a positive number, or
/// one-way delay with sockperf framing or a message too small for the stamps. TCP: `TimedOut`
/// when a closed-loop reply takes longer than [`TCP_REPLY_TIMEOUT`] or a write makes no
/// progress for that long; `UnexpectedEof` when the peer closes early. UDP: `ConnectionRefused`
/// when the peer's port is closed (ICMP port unreachable). With sockperf framing, an error
/// carrying [`NoReply`] when the peer never answered the first message ([`SOCKPERF_NO_REPLY`]
/// for UDP). Any other socket error.
pub fn ping<S: LatencySocket>(
    sock: &S,
    cfg: &PingConfig,
    framing: Framing,
    view: InnerView,
    clock: &Clock,
    stop: &AtomicBool,
) -> io::Result<LatencyOutcome> {
    sock.ping(cfg, framing, view, clock, stop)
}

/// Agent side: echoes until EOF or `stop`, every call counted in `counters`.
///
/// * TCP: every byte back. A connection whose first bytes are a one-way request
///   ([`stamps::tcp_request_size`]) is echoed message by message instead, each reply stamped
///   with the time the read that completed its request returned (`t2`) and the time just
///   before it is written (`t3`), on [`host_clock_ns`].
/// * UDP, on a connected flow socket: every datagram back; join requests are answered with
///   acknowledgements (not counted). A datagram that asks for one-way stamps
///   ([`stamps::udp_wants_stamps`]) goes back with the agent's receive and send times on
///   [`host_clock_ns`].
///
/// # Errors
/// A failed read or write (a reset connection included); the loop ends there. For UDP the
/// transient ones are skipped: a timeout, a full send buffer, and `ECONNREFUSED` (an ICMP error
/// about an earlier echo).
pub fn echo<S: LatencySocket>(sock: &S, stop: &AtomicBool, counters: &Counters) -> io::Result<()> {
    sock.echo(stop, counters)
}

/// With `--timestamps`, turns the kernel's stamps on for the socket `fd` through `enable`
/// (given whether to ask for transmit stamps too): both, else receive alone, and tells `rec`
/// what it got. The guard turns them off again.
fn enable_stamps<'a>(
    rec: &mut Recorder,
    fd: sys::SockRef<'a>,
    enable: impl Fn(bool) -> io::Result<()>,
) -> Option<StampsOff<'a>> {
    if !rec.timestamps() {
        return None;
    }
    // Transmit stamps need receive stamps' option too; try both, then receive alone.
    let (rx, tx) = match enable(true) {
        Ok(()) => (Ok(()), Ok(())),
        Err(e) => (
            enable(false).map_err(|e| e.to_string()),
            Err(format!("the kernel refused transmit timestamps: {e}")),
        ),
    };
    let on = rx.is_ok();
    rec.set_enabled(rx, tx);
    on.then_some(StampsOff(fd))
}

/// Turns a socket's kernel timestamps off again when dropped.
struct StampsOff<'a>(sys::SockRef<'a>);

impl Drop for StampsOff<'_> {
    fn drop(&mut self) {
        sys::disable_timestamps(self.0);
    }
}

/// One-way delay needs sonde's framing and room for the agent's stamps.
fn check_one_way(view: &InnerView, framing: Framing, msg: usize) -> io::Result<()> {
    if view.one_way.is_none() {
        return Ok(());
    }
    if framing != Framing::Sonde {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "one-way delay needs a sonde agent's echo (sonde framing)",
        ));
    }
    if msg < STAMPS_LEN {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "one-way delay needs messages of at least {STAMPS_LEN} bytes (the agent's two \
                 timestamps), not {msg}"
            ),
        ));
    }
    Ok(())
}

fn ring_slot(seq: u64) -> usize {
    (seq % SEND_RING as u64) as usize
}

// ---------------------------------------------------------------------------------------------
// Helpers

fn check_size(msg_size: u32, (min, max): (u32, u32), proto: &str) -> io::Result<usize> {
    if (min..=max).contains(&msg_size) {
        Ok(msg_size as usize)
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{proto} latency message size must be {min} to {max} bytes, not {msg_size}"),
        ))
    }
}

fn check_rate(rate: Option<f64>) -> io::Result<Option<f64>> {
    match rate {
        Some(r) if !(r.is_finite() && r > 0.0) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("open-loop rate must be a positive number of messages per second, not {r}"),
        )),
        _ => Ok(rate),
    }
}

fn peer_closed() -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "the peer closed the TCP connection before answering every message",
    )
}

fn tcp_write_error(e: io::Error) -> io::Error {
    if fault::timed_out(&e) {
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "the peer took no TCP data for {} s: is the agent alive and echoing?",
                TCP_REPLY_TIMEOUT.as_secs()
            ),
        )
    } else {
        e
    }
}

fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Restores a socket's timeouts when dropped.
enum Timeouts<'a> {
    Tcp(&'a TcpStream, Option<Duration>, Option<Duration>),
    Udp(&'a UdpSocket, Option<Duration>),
}

impl<'a> Timeouts<'a> {
    fn save_tcp(s: &'a TcpStream) -> io::Result<Self> {
        Ok(Self::Tcp(s, s.read_timeout()?, s.write_timeout()?))
    }
    fn save_udp(s: &'a UdpSocket) -> io::Result<Self> {
        Ok(Self::Udp(s, s.read_timeout()?))
    }
}

impl Drop for Timeouts<'_> {
    fn drop(&mut self) {
        // Best effort: the socket may already be dead, and the loop's result matters more.
        match *self {
            Self::Tcp(s, read, write) => {
                let _ = s.set_read_timeout(read);
                let _ = s.set_write_timeout(write);
            }
            Self::Udp(s, read) => {
                let _ = s.set_read_timeout(read);
            }
        }
    }
}

#[cfg(test)]
mod tests;
