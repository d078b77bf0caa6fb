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
//! against a real `sockperf server` ([`tcp_ping_framed`], [`udp_ping_framed`]).
//!
//! [`tcp_ping_with`] and [`udp_ping_with`] add the inner view ([`InnerView`]): every sample to
//! the full log, kernel timestamps, and the agent's stamps for one-way delay (see
//! [`sonde_wire::stamps`]). The echoes stamp any message that asks, on [`host_clock_ns`].

use std::io::{self, Read, Write};
use std::net::{TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::Duration;

use sonde_engine::pace::Schedule;
use sonde_engine::rtt::RttRecorder;
use sonde_engine::seq::{Arrival, SeqTracker};
use sonde_wire::sockperf::{self, Flags};
use sonde_wire::stamps;
use sonde_wire::{read_latency_seq, widen_seq, write_latency_seq, UdpJoin, UDP_JOIN_LEN};

use crate::cpu::ThreadsMeter;
use crate::{sys, Clock, Counters};

mod inner;

use inner::{realtime_ns, Recorder, ReplyAt, Stamps};
pub use inner::{InnerView, OneWayLink, OneWayOutcome, SocketOutcome};

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

/// Runs `send` on a thread an open loop starts: its CPU counted in the caller's meter (if any),
/// its system calls returned so that the loop's thread can add them to its own count.
fn sender_thread<T>(cpu: Option<&ThreadsMeter>, send: impl FnOnce() -> T) -> (T, u64) {
    let _counted = cpu.map(ThreadsMeter::track);
    let before = ping_syscalls();
    let out = send();
    (out, ping_syscalls().wrapping_sub(before))
}

/// This host's monotonic clock, ns (`CLOCK_MONOTONIC` on Linux: since boot, the same in every
/// process of the host). The echoes stamp one-way requests with it, and the agent answers clock
/// probes with it, so that the two agree without sharing a [`Clock`].
pub fn host_clock_ns() -> u64 {
    sys::monotonic_ns()
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
/// Longest single sleep of the open-loop sender, so that it notices `stop` between slow sends.
const MAX_SLEEP: Duration = Duration::from_millis(50);
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

/// How latency messages are laid out on the wire.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Framing {
    /// sonde's: over UDP the message's sequence number (from 0) in its first bytes (up to 8,
    /// big-endian), the rest zero; over TCP only zeros, since replies come back in order. The peer
    /// echoes every message.
    #[default]
    Sonde,
    /// sockperf's (docs/protocols/sockperf.md §2): a 14-byte header with `seq` from 1, flags
    /// `CLIENT | PONG_REQUEST` (0x0003) and `length` = the message size (14 or more), then a payload
    /// filled once. A reply counts only when its flags lack `CLIENT` (and `WARMUP`), its length is
    /// the message size, and its seq is that of a message sent: over UDP that of any message sent,
    /// over TCP (closed loop) exactly the one in flight. The TCP open loop counts replies by size,
    /// as the sonde framing does.
    Sockperf,
}

impl Framing {
    /// Message sizes this framing can carry on a transport whose limits are `sonde_max` and
    /// `sockperf_max`.
    fn size_range(self, sonde_max: u32, sockperf_max: u32) -> (u32, u32) {
        match self {
            Self::Sonde => (1, sonde_max),
            Self::Sockperf => (sockperf::MIN_MSG, sockperf_max),
        }
    }

    /// Fills a message buffer once, before the first send.
    fn prepare(self, out: &mut [u8]) {
        if self == Self::Sockperf {
            // Any payload will do (the server echoes it unchanged); sockperf's own is random.
            for (i, b) in out.iter_mut().enumerate() {
                *b = (i % 251) as u8;
            }
            // The size was checked against MIN_MSG before: the header fits.
            let _ = sockperf::write_request(0, Flags::CLIENT | Flags::PONG_REQUEST, out);
        }
    }

    /// Writes message `seq`'s (from 0) sequence number into `out`: sonde's UDP framing, and
    /// sockperf's on either transport.
    fn stamp(self, seq: u64, out: &mut [u8]) {
        match self {
            Self::Sonde => write_latency_seq(seq, out),
            Self::Sockperf => {
                let _ = sockperf::set_seq(seq.saturating_add(1), out);
            }
        }
    }

    /// The seq (from 0) of the message a UDP datagram answers, or `None` when it is not a reply.
    fn reply_seq(self, datagram: &[u8], msg: usize, expected: u64) -> Option<u64> {
        match self {
            Self::Sonde => reply_seq(datagram, msg, expected),
            Self::Sockperf => sockperf_reply_seq(datagram, msg),
        }
    }
}

/// The seq (from 0) of a sockperf reply of `msg` bytes, or `None` for anything else: a request
/// (client flag set, e.g. our own message reflected), a warm-up, another size, seq 0.
fn sockperf_reply_seq(datagram: &[u8], msg: usize) -> Option<u64> {
    if datagram.len() != msg {
        return None;
    }
    let h = sockperf::Header::decode(datagram).ok()?;
    let is_reply = !h.flags.contains(Flags::CLIENT) && !h.flags.contains(Flags::WARMUP);
    (is_reply && h.length as usize == msg)
        .then(|| h.seq.checked_sub(1))
        .flatten()
}

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
    /// The `NoReply` inside an error from [`tcp_ping_framed`] or [`udp_ping_framed`], if any.
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

/// Agent side: echoes every byte back until EOF or `stop`.
///
/// A connection whose first bytes are a one-way request ([`stamps::tcp_request_size`]) is
/// echoed message by message instead, each reply stamped with the time the read that completed
/// its request returned (`t2`) and the time just before it is written (`t3`), on
/// [`host_clock_ns`].
///
/// # Errors
/// A failed read or write (a reset connection included); the loop ends there.
pub fn tcp_echo(stream: &TcpStream, stop: &AtomicBool, counters: &Counters) -> io::Result<()> {
    let _restore = Timeouts::save_tcp(stream)?;
    stream.set_read_timeout(Some(ECHO_POLL))?;
    stream.set_write_timeout(Some(ECHO_POLL))?;
    // Room for a whole message of the largest size plus a read's worth behind it.
    let mut buf = vec![0u8; 2 * TCP_ECHO_BUF];
    let mut s = stream;
    // Bytes read before the echo knew which kind of connection this is.
    let mut have = 0;
    while !stop.load(Ordering::Relaxed) {
        let read = s.read(&mut buf[have..TCP_ECHO_BUF]);
        counters.syscall();
        let n = match read {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if is_retry(&e) => continue,
            Err(e) => return Err(e),
        };
        let t2 = host_clock_ns();
        have += n;
        // A plain sonde message is zeros and a sockperf one never reaches this port: anything
        // but `S` first is echoed as bytes. A one-way request shows itself in 8 bytes.
        if buf[0] == stamps::TCP_STAMP_REQUEST[0] && have < 8 {
            continue;
        }
        if let Some(size) = stamps::tcp_request_size(&buf[..have], TCP_MAX_MSG) {
            return tcp_echo_stamped(stream, stop, counters, &mut buf, have, t2, size as usize);
        }
        if !write_echo(stream, stop, &buf[..have], counters)? {
            return Ok(());
        }
        counters.add(have as u64, 1);
        break;
    }
    // Plain from here on: every byte back as it comes.
    while !stop.load(Ordering::Relaxed) {
        let read = s.read(&mut buf[..TCP_ECHO_BUF]);
        counters.syscall();
        let n = match read {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if is_retry(&e) => continue,
            Err(e) => return Err(e),
        };
        if !write_echo(stream, stop, &buf[..n], counters)? {
            return Ok(());
        }
        counters.add(n as u64, 1);
    }
    Ok(())
}

/// Writes all of `data`; `Ok(false)` when `stop` was raised while the peer would not take it.
/// Written by hand rather than `write_all` so that a peer that stopped reading cannot hold the
/// echo past `stop`.
fn write_echo(
    stream: &TcpStream,
    stop: &AtomicBool,
    data: &[u8],
    counters: &Counters,
) -> io::Result<bool> {
    let mut s = stream;
    let mut off = 0;
    while off < data.len() {
        let written = s.write(&data[off..]);
        counters.syscall();
        match written {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(k) => off += k,
            Err(e) if is_retry(&e) => {
                if stop.load(Ordering::Relaxed) {
                    return Ok(false);
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// The one-way TCP echo: frames the stream into `size`-byte messages, stamps each and writes it
/// back. `buf` holds `have` bytes already read (the last read returned at `t2`).
fn tcp_echo_stamped(
    stream: &TcpStream,
    stop: &AtomicBool,
    counters: &Counters,
    buf: &mut [u8],
    mut have: usize,
    mut t2: u64,
    size: usize,
) -> io::Result<()> {
    let mut s = stream;
    loop {
        // Every complete message in the buffer, stamped and written back in one write.
        let whole = have - have % size;
        if whole > 0 {
            let t3 = host_clock_ns();
            for m in buf[..whole].chunks_exact_mut(size) {
                stamps::write_agent_stamps(m, t2, t3);
            }
            if !write_echo(stream, stop, &buf[..whole], counters)? {
                return Ok(());
            }
            counters.add(whole as u64, (whole / size) as u64);
            buf.copy_within(whole..have, 0);
            have -= whole;
        }
        if stop.load(Ordering::Relaxed) {
            return Ok(());
        }
        // Read at most up to the end of the message being assembled plus a read's worth; the
        // buffer holds two of the largest messages.
        let room = (size + TCP_ECHO_BUF).min(buf.len());
        let read = s.read(&mut buf[have..room]);
        counters.syscall();
        let n = match read {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if is_retry(&e) => continue,
            Err(e) => return Err(e),
        };
        t2 = host_clock_ns();
        have += n;
    }
}

/// Agent side: echoes every datagram back on a connected flow socket until `stop`; answers join
/// requests with acknowledgements (not counted). A datagram that asks for one-way stamps
/// ([`stamps::udp_wants_stamps`]) goes back with the agent's receive and send times on
/// [`host_clock_ns`].
///
/// # Errors
/// A failed `recv` or `send`, except the transient ones: a timeout, a full send buffer, and
/// `ECONNREFUSED` (an ICMP error about an earlier echo), which are skipped.
pub fn udp_echo(sock: &UdpSocket, stop: &AtomicBool, counters: &Counters) -> io::Result<()> {
    let _restore = Timeouts::save_udp(sock)?;
    sock.set_read_timeout(Some(ECHO_POLL))?;
    let mut buf = vec![0u8; UDP_RECV_BUF];
    while !stop.load(Ordering::Relaxed) {
        let received = sock.recv(&mut buf);
        counters.syscall();
        let n = match received {
            Ok(n) => n,
            // The client's port is closed (an ICMP error for an earlier echo): it may be gone
            // or about to rejoin; the agent's session decides, through `stop`.
            Err(e) if is_retry(&e) || sys::port_unreachable(&e) => continue,
            Err(e) => return Err(e),
        };
        if stamps::udp_wants_stamps(&buf[..n]) {
            let t2 = host_clock_ns();
            stamps::write_agent_stamps(&mut buf[..n], t2, t2);
            stamps::write_agent_send_stamp(&mut buf[..n], host_clock_ns());
        }
        let datagram = &buf[..n];
        if n == UDP_JOIN_LEN {
            if let Ok(join) = UdpJoin::decode(datagram) {
                // A repeated join: the client has not seen our first ack yet. A stray ack (never
                // sent to an agent) is dropped.
                if !join.ack {
                    send_transient_ok(sock, &UdpJoin { ack: true, ..join }.encode())?;
                    counters.syscall();
                }
                continue;
            }
        }
        send_transient_ok(sock, datagram)?;
        counters.syscall();
        counters.add(n as u64, 1);
    }
    Ok(())
}

/// Client side, TCP (`TCP_NODELAY` set by the caller): closed or open loop per `cfg.rate`.
///
/// # Errors
/// `InvalidInput` for a message size outside 1 to [`TCP_MAX_MSG`] or a rate that is not a
/// positive number; `TimedOut` when a closed-loop reply takes longer than [`TCP_REPLY_TIMEOUT`]
/// or a write makes no progress for that long; `UnexpectedEof` when the peer closes early; any
/// other socket error.
pub fn tcp_ping(
    stream: &TcpStream,
    cfg: &PingConfig,
    clock: &Clock,
    stop: &AtomicBool,
) -> io::Result<LatencyOutcome> {
    tcp_ping_framed(stream, cfg, Framing::Sonde, clock, stop)
}

/// [`tcp_ping`] with the messages laid out as `framing` says. With [`Framing::Sockperf`] the
/// message size is 14 to [`sockperf::MAX_TCP_MSG`] bytes (a `sockperf server` takes up to
/// 65,507 unless started with a larger `-m`), and a closed loop fails with `InvalidData` on a
/// reply that does not answer the message in flight.
///
/// # Errors
/// As [`tcp_ping`]; with sockperf framing, an error carrying [`NoReply`] when the peer never
/// answered the first message.
pub fn tcp_ping_framed(
    stream: &TcpStream,
    cfg: &PingConfig,
    framing: Framing,
    clock: &Clock,
    stop: &AtomicBool,
) -> io::Result<LatencyOutcome> {
    tcp_ping_with(stream, cfg, framing, InnerView::default(), clock, stop)
}

/// [`tcp_ping_framed`] with the inner view: every sample to `view.log`, the kernel's receive
/// and transmit timestamps (a message's transmit stamp is the one of its last byte), the agent's
/// stamps for one-way delay (sonde framing only, messages of at least
/// [`stamps::ONE_WAY_MIN_MSG`] bytes).
///
/// # Errors
/// As [`tcp_ping_framed`]; `InvalidInput` for one-way delay with sockperf framing or a message
/// too small for the stamps. Kernel timestamps the socket refuses are not an error: the outcome
/// says why they are missing.
pub fn tcp_ping_with(
    stream: &TcpStream,
    cfg: &PingConfig,
    framing: Framing,
    view: InnerView,
    clock: &Clock,
    stop: &AtomicBool,
) -> io::Result<LatencyOutcome> {
    let msg = check_size(
        cfg.msg_size,
        framing.size_range(TCP_MAX_MSG, sockperf::MAX_TCP_MSG),
        "TCP",
    )?;
    let rate = check_rate(cfg.rate)?;
    check_one_way(&view, framing, msg)?;
    let _restore = Timeouts::save_tcp(stream)?;
    stream.set_read_timeout(Some(TCP_POLL))?;
    stream.set_write_timeout(Some(TCP_REPLY_TIMEOUT))?;
    let mut rec = Recorder::new(view, cfg.warmup_ns);
    let _stamps_off = enable_stamps(&mut rec, sys::tcp_fd(stream), |tx| {
        sys::tcp_enable_timestamps(stream, tx)
    });
    let mut out = match rate {
        None => tcp_closed(stream, msg, framing, cfg, clock, stop, &mut rec),
        Some(rate) => tcp_open(stream, msg, framing, rate, cfg, clock, stop, &mut rec),
    }?;
    (out.socket, out.one_way) = rec.finish();
    Ok(out)
}

/// With `--timestamps`, turns the kernel's stamps on for the socket `fd` through `enable`
/// (given whether to ask for transmit stamps too): both, else receive alone, and tells `rec`
/// what it got. The guard turns them off again.
fn enable_stamps(
    rec: &mut Recorder,
    fd: i32,
    enable: impl Fn(bool) -> io::Result<()>,
) -> Option<StampsOff> {
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
struct StampsOff(i32);

impl Drop for StampsOff {
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

/// Client side, UDP on a connected socket: closed or open loop per `cfg.rate`. A reply not back
/// within `max(1 ms, 10 × median RTT so far)` (1 s before the first reply) is given up on (the next message goes); a late
/// reply still counts. After `until_ns` the loop drains replies for up to that timeout.
///
/// # Errors
/// `InvalidInput` for a message size outside 1 to [`UDP_MAX_MSG`] or a rate that is not a
/// positive number; `ConnectionRefused` when the peer's port is closed (ICMP port unreachable);
/// any other socket error. Lost replies are not errors: they are counted.
pub fn udp_ping(
    sock: &UdpSocket,
    cfg: &PingConfig,
    clock: &Clock,
    stop: &AtomicBool,
) -> io::Result<LatencyOutcome> {
    udp_ping_framed(sock, cfg, Framing::Sonde, clock, stop)
}

/// [`udp_ping`] with the messages laid out as `framing` says. With [`Framing::Sockperf`] the
/// message size is 14 to 65,507 bytes, and datagrams that are not sockperf replies to a message
/// sent are ignored.
///
/// # Errors
/// As [`udp_ping`]; with sockperf framing, an error carrying [`NoReply`] when nothing has
/// answered [`SOCKPERF_NO_REPLY`] after the first send.
pub fn udp_ping_framed(
    sock: &UdpSocket,
    cfg: &PingConfig,
    framing: Framing,
    clock: &Clock,
    stop: &AtomicBool,
) -> io::Result<LatencyOutcome> {
    udp_ping_with(sock, cfg, framing, InnerView::default(), clock, stop)
}

/// [`udp_ping_framed`] with the inner view: every sample to `view.log` (lost ones too), the
/// kernel's receive and transmit timestamps, the agent's stamps for one-way delay (sonde
/// framing only, messages of at least [`stamps::ONE_WAY_MIN_MSG`] bytes).
///
/// # Errors
/// As [`udp_ping_framed`]; `InvalidInput` for one-way delay with sockperf framing or a message
/// too small for the stamps. Kernel timestamps the socket refuses are not an error: the outcome
/// says why they are missing.
pub fn udp_ping_with(
    sock: &UdpSocket,
    cfg: &PingConfig,
    framing: Framing,
    view: InnerView,
    clock: &Clock,
    stop: &AtomicBool,
) -> io::Result<LatencyOutcome> {
    let msg = check_size(
        cfg.msg_size,
        framing.size_range(UDP_MAX_MSG, sockperf::MAX_UDP_MSG),
        "UDP",
    )?;
    let rate = check_rate(cfg.rate)?;
    check_one_way(&view, framing, msg)?;
    let _restore = Timeouts::save_udp(sock)?;
    sock.set_read_timeout(Some(UDP_POLL))?;
    let mut rec = Recorder::new(view, cfg.warmup_ns);
    let _stamps_off = enable_stamps(&mut rec, sys::udp_fd(sock), |tx| {
        sys::udp_enable_timestamps(sock, tx)
    });
    let mut out = match rate {
        None => udp_closed(sock, msg, framing, cfg, clock, stop, &mut rec),
        Some(rate) => udp_open(sock, msg, framing, rate, cfg, clock, stop, &mut rec),
    }?;
    (out.socket, out.one_way) = rec.finish();
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// TCP client

fn tcp_closed(
    stream: &TcpStream,
    msg: usize,
    framing: Framing,
    cfg: &PingConfig,
    clock: &Clock,
    stop: &AtomicBool,
    rec: &mut Recorder,
) -> io::Result<LatencyOutcome> {
    let mut out = vec![0u8; msg];
    framing.prepare(&mut out);
    let one_way = rec.one_way();
    if one_way {
        stamps::write_tcp_request(cfg.msg_size, &mut out);
    }
    let stamped = rec.reading_rx();
    let mut tx = TxStamps::new(
        rec.reading_tx(),
        sys::tcp_fd(stream),
        Keying::Bytes(msg as u64),
    );
    let mut reply = vec![0u8; msg];
    let mut rtt = RttRecorder::new(cfg.warmup_ns);
    let mut sent = 0;
    let mut measured = 0;
    while !stop.load(Ordering::Relaxed) {
        let t0 = clock.now_ns();
        if t0 >= cfg.until_ns || cfg.counted_out(measured) {
            break;
        }
        if framing == Framing::Sockperf {
            framing.stamp(sent, &mut out);
        }
        // Before the first reply, a failure means nothing answers there: say so, not "a reply
        // was late" or "reset" (a sockperf server closes on a message over its maximum).
        let first = framing == Framing::Sockperf && sent == 0;
        let send_real_ns = stamped.then(realtime_ns);
        count_call();
        write_message(stream, &out, clock, t0).map_err(|e| {
            if first {
                no_first_reply(e)
            } else {
                e
            }
        })?;
        sent += 1;
        measured += u64::from(t0 >= cfg.warmup_ns);
        let deadline = t0.saturating_add(duration_ns(TCP_REPLY_TIMEOUT));
        let read =
            tcp_read_reply(stream, &mut reply, clock, stop, deadline, stamped).map_err(|e| {
                if first {
                    no_first_reply(e)
                } else {
                    e
                }
            });
        let ReadReply::Done(rx_ns) = read? else {
            rec.lost(sent - 1, t0);
            break;
        };
        let t1 = clock.now_ns();
        if framing == Framing::Sockperf {
            check_sockperf_tcp_reply(&reply, sent)?;
        }
        rtt.record(t0, t1.saturating_sub(t0));
        let tx_ns = tx.of(sent - 1, sent - 1, send_real_ns, rx_ns);
        rec.reply(&ReplyAt {
            seq: sent - 1,
            send_ns: t0,
            receive_ns: t1,
            late: false,
            stamps: Stamps {
                rx_ns,
                tx_ns,
                send_real_ns,
                agent: if one_way {
                    stamps::tcp_reply_stamps(&reply)
                } else {
                    None
                },
            },
        });
    }
    Ok(LatencyOutcome {
        rtt,
        sent,
        seq: None,
        late_sends: 0,
        timeouts: 0,
        socket: None,
        one_way: None,
        log: None,
    })
}

/// Writes a whole closed-loop message, started at `t0`. A blocking socket waits in the kernel
/// (its write timeout is [`TCP_REPLY_TIMEOUT`]); a non-blocking one (`--busy-poll`,
/// [`crate::tune::busy_poll_tcp`]) is retried until the message is out or that long has passed.
fn write_message(stream: &TcpStream, msg: &[u8], clock: &Clock, t0: u64) -> io::Result<()> {
    let mut s = stream;
    let mut off = 0;
    let deadline = t0.saturating_add(duration_ns(TCP_REPLY_TIMEOUT));
    while off < msg.len() {
        match s.write(&msg[off..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(k) => off += k,
            Err(e) if is_retry(&e) && clock.now_ns() < deadline => {}
            Err(e) => return Err(tcp_write_error(e)),
        }
    }
    Ok(())
}

/// A TCP failure before the first reply, as a [`NoReply`] where it says that nothing answered.
fn no_first_reply(e: io::Error) -> io::Error {
    match e.kind() {
        io::ErrorKind::TimedOut => NoReply::TimedOut(TCP_REPLY_TIMEOUT).into_io(),
        io::ErrorKind::UnexpectedEof
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::BrokenPipe => NoReply::Closed.into_io(),
        _ => e,
    }
}

/// A sockperf reply over TCP must answer the message in flight (`seq`, from 1): anything else
/// means the byte stream is out of step and no later reply can be trusted.
fn check_sockperf_tcp_reply(reply: &[u8], seq: u64) -> io::Result<()> {
    let ok = sockperf_reply_seq(reply, reply.len()).is_some_and(|s| s.saturating_add(1) == seq);
    if ok {
        return Ok(());
    }
    let got = sockperf::Header::decode(reply).ok();
    Err(io::Error::new(
        io::ErrorKind::InvalidData,
        format!(
            "the peer's reply to sockperf message {seq} is not one (header {got:?}): is it a \
             sockperf server?"
        ),
    ))
}

/// How a wait for a whole TCP reply ended.
enum ReadReply {
    /// It arrived; with `--timestamps`, the kernel receive time of its last segment.
    Done(Option<u64>),
    /// `stop` was raised first.
    Stopped,
}

/// Reads exactly `buf.len()` bytes (with the kernel's receive timestamp when `stamped`).
fn tcp_read_reply(
    stream: &TcpStream,
    buf: &mut [u8],
    clock: &Clock,
    stop: &AtomicBool,
    deadline_ns: u64,
    stamped: bool,
) -> io::Result<ReadReply> {
    let mut s = stream;
    let mut got = 0;
    let mut rx_ns = None;
    while got < buf.len() {
        count_call();
        let read = if stamped {
            sys::tcp_recv_stamped(stream, &mut buf[got..])
        } else {
            s.read(&mut buf[got..]).map(|n| (n, None))
        };
        match read {
            Ok((0, _)) => return Err(peer_closed()),
            Ok((n, stamp)) => {
                got += n;
                rx_ns = stamp.or(rx_ns);
            }
            Err(e) if is_retry(&e) => {
                if stop.load(Ordering::Relaxed) {
                    return Ok(ReadReply::Stopped);
                }
                if clock.now_ns() >= deadline_ns {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!(
                            "no TCP reply from the peer within {} s: is the agent alive and \
                             the path open?",
                            TCP_REPLY_TIMEOUT.as_secs()
                        ),
                    ));
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(ReadReply::Done(rx_ns))
}

#[allow(clippy::too_many_arguments)]
fn tcp_open(
    stream: &TcpStream,
    msg: usize,
    framing: Framing,
    rate: f64,
    cfg: &PingConfig,
    clock: &Clock,
    stop: &AtomicBool,
    rec: &mut Recorder,
) -> io::Result<LatencyOutcome> {
    let plan = OpenLoop::new(rate, clock.now_ns(), cfg.until_ns);
    let progress = Progress::default();
    let send_times = rec.reading_rx().then(SendTimes::new);
    let one_way = rec.one_way();
    let cpu = rec.cpu();
    let (rtt, received) = thread::scope(|scope| {
        let sender = scope.spawn(|| {
            sender_thread(cpu.as_deref(), || {
                let mut out = vec![0u8; msg];
                framing.prepare(&mut out);
                if one_way {
                    stamps::write_tcp_request(cfg.msg_size, &mut out);
                }
                let mut s = stream;
                paced_sender(&plan, clock, stop, &progress, |i| {
                    if framing == Framing::Sockperf {
                        framing.stamp(i, &mut out);
                    }
                    if let Some(times) = &send_times {
                        times.store(i, realtime_ns());
                    }
                    count_call();
                    s.write_all(&out).map_err(tcp_write_error)
                })
            })
        });
        let reader = OpenReader {
            plan: &plan,
            clock,
            stop,
            progress: &progress,
            send_times: send_times.as_ref(),
        };
        let received = tcp_open_reader(stream, msg, &reader, cfg.warmup_ns, rec);
        if received.is_err() {
            progress.abort.store(true, Ordering::Relaxed);
        }
        let (sent, calls) = join(sender);
        add_calls(calls);
        // The sender's error explains a reader's error (a reset seen on both sides), not the
        // other way round.
        sent.and(received)
    })?;
    let sent = progress.sent();
    if rec.wants_lost() {
        for k in received..sent {
            rec.lost(k, plan.due(k));
        }
    }
    Ok(LatencyOutcome {
        rtt,
        sent,
        seq: None,
        late_sends: progress.late.load(Ordering::Relaxed),
        timeouts: 0,
        socket: None,
        one_way: None,
        log: None,
    })
}

/// What an open-loop reader shares with its sender.
struct OpenReader<'a> {
    plan: &'a OpenLoop,
    clock: &'a Clock,
    stop: &'a AtomicBool,
    progress: &'a Progress,
    /// `--timestamps`: the wall clock at each actual send.
    send_times: Option<&'a SendTimes>,
}

/// Reads replies in order: reply `k` answers message `k`. TCP may split or coalesce them, so
/// complete `msg`-sized units are counted, and every message completed by one `read` gets that
/// read's timestamp. Returns the RTTs and how many replies came.
fn tcp_open_reader(
    stream: &TcpStream,
    msg: usize,
    r: &OpenReader<'_>,
    warmup_ns: u64,
    rec: &mut Recorder,
) -> io::Result<(RttRecorder, u64)> {
    let (plan, clock, progress) = (r.plan, r.clock, r.progress);
    let mut rtt = RttRecorder::new(warmup_ns);
    let mut buf = vec![0u8; TCP_ECHO_BUF.max(msg)];
    let mut s = stream;
    let mut received = 0u64;
    // Bytes of the reply currently being assembled, and (one-way) its first bytes.
    let mut partial = 0usize;
    let mut head = [0u8; STAMPS_LEN];
    let one_way = rec.one_way();
    let stamped = rec.reading_rx();
    let mut tx = TxStamps::new(
        rec.reading_tx(),
        sys::tcp_fd(stream),
        Keying::Bytes(msg as u64),
    );
    let mut sender_done_at = None;
    let drain_ns = duration_ns(TCP_OPEN_LOOP_DRAIN);
    loop {
        if r.stop.load(Ordering::Relaxed) || progress.abort.load(Ordering::Relaxed) {
            return Ok((rtt, received));
        }
        if let Some(done_at) = progress.done_at(&mut sender_done_at, clock) {
            // TCP cannot lose a reply; a peer that stops echoing is given the drain time.
            if received >= progress.sent() || clock.now_ns() >= done_at.saturating_add(drain_ns) {
                return Ok((rtt, received));
            }
        }
        count_call();
        let read = if stamped {
            sys::tcp_recv_stamped(stream, &mut buf)
        } else {
            s.read(&mut buf).map(|n| (n, None))
        };
        let (n, rx_ns) = match read {
            Ok((0, _)) => {
                if progress.done.load(Ordering::Acquire) && received >= progress.sent() {
                    return Ok((rtt, received));
                }
                return Err(peer_closed());
            }
            Ok(got) => got,
            Err(e) if is_retry(&e) => continue,
            Err(e) => return Err(e),
        };
        let t = clock.now_ns();
        // Only a message already due can have been answered; more is a misbehaving peer.
        let due_by = plan.due_by(t);
        let newest = progress.sent().saturating_sub(1);
        let mut reply = |k: u64, agent: Option<(u64, u64)>| {
            let due = plan.due(k);
            rtt.record(due, t.saturating_sub(due));
            let send_real_ns = r.send_times.and_then(|st| st.load(k));
            let tx_ns = tx.of(k, newest.max(k), send_real_ns, rx_ns);
            rec.reply(&ReplyAt {
                seq: k,
                send_ns: due,
                receive_ns: t,
                late: false,
                stamps: Stamps {
                    rx_ns,
                    tx_ns,
                    send_real_ns,
                    agent,
                },
            });
        };
        if one_way {
            // Message by message, to pick up each reply's stamps across reads.
            let mut at = 0;
            while at < n {
                let take = (msg - partial).min(n - at);
                if partial < STAMPS_LEN {
                    let end = (partial + take).min(STAMPS_LEN);
                    head[partial..end].copy_from_slice(&buf[at..at + end - partial]);
                }
                partial += take;
                at += take;
                if partial == msg {
                    partial = 0;
                    if received < due_by {
                        reply(received, stamps::tcp_reply_stamps(&head));
                        received += 1;
                    }
                }
            }
        } else {
            let total = partial + n;
            partial = total % msg;
            let completed = ((total / msg) as u64).min(due_by.saturating_sub(received));
            for k in received..received + completed {
                reply(k, None);
            }
            received += completed;
        }
    }
}

/// The wall clock at each open-loop send (`--timestamps`), written by the sender and read by
/// the reader: a ring of slots tagged with their message, so that a slot the sender has
/// already reused for a later message reads as unknown.
struct SendTimes {
    slots: Vec<(AtomicU64, AtomicU64)>,
}

impl SendTimes {
    fn new() -> Self {
        Self {
            slots: (0..SEND_RING)
                .map(|_| (AtomicU64::new(u64::MAX), AtomicU64::new(0)))
                .collect(),
        }
    }

    fn store(&self, seq: u64, real_ns: u64) {
        let (tag, value) = &self.slots[ring_slot(seq)];
        tag.store(u64::MAX, Ordering::Release);
        value.store(real_ns, Ordering::Release);
        tag.store(seq, Ordering::Release);
    }

    fn load(&self, seq: u64) -> Option<u64> {
        let (tag, value) = &self.slots[ring_slot(seq)];
        let before = tag.load(Ordering::Acquire);
        let v = value.load(Ordering::Acquire);
        (before == seq && tag.load(Ordering::Acquire) == seq).then_some(v)
    }
}

// ---------------------------------------------------------------------------------------------
// UDP client

/// Send time of one closed-loop message, tagged with its seq so that a slot reused by a later
/// message is not mistaken for it.
#[derive(Debug, Clone, Copy)]
struct SentAt {
    seq: u64,
    ns: u64,
    /// `--timestamps`: the wall clock just before the send (0: not read).
    real_ns: u64,
    /// Its reply has come (for the full log's lost messages).
    answered: bool,
}

/// How a wait for replies ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    /// What was waited for arrived.
    Answered,
    /// The deadline passed.
    TimedOut,
    /// The stop flag was raised.
    Stopped,
}

/// The sequence number a UDP reply answers: sonde's and sockperf's framings, and the one-way
/// layout (the seq with the stamps' flag bits, in a full-size reply).
fn udp_reply_seq(
    framing: Framing,
    one_way: bool,
    datagram: &[u8],
    msg: usize,
    expected: u64,
) -> Option<u64> {
    if one_way {
        (datagram.len() == msg).then(|| stamps::udp_seq(datagram))
    } else {
        framing.reply_seq(datagram, msg, expected)
    }
}

/// Receives one datagram, with its kernel receive timestamp when `stamped`.
fn udp_recv(sock: &UdpSocket, buf: &mut [u8], stamped: bool) -> io::Result<(usize, Option<u64>)> {
    count_call();
    if stamped {
        sys::udp_recv_stamped(sock, buf)
    } else {
        sock.recv(buf).map(|n| (n, None))
    }
}

/// What a transmit stamp's key counts.
#[derive(Debug, Clone, Copy)]
enum Keying {
    /// UDP: datagrams, from 0.
    Datagram,
    /// TCP: bytes, from 0, up to the last byte of the write; every message is this many bytes.
    Bytes(u64),
}

impl Keying {
    /// The message a stamp's 32-bit `key` is for, `newest` being the highest seq sent. `None`
    /// for a TCP stamp that does not end a message (a message written in parts).
    fn seq(self, key: u32, newest: u64) -> Option<u64> {
        match self {
            Keying::Datagram => Some(widen_seq(u64::from(key), 4, newest)),
            Keying::Bytes(msg) => {
                let msg = msg.max(1);
                let last_byte = newest.saturating_add(1).saturating_mul(msg) - 1;
                let byte = widen_seq(u64::from(key), 4, last_byte);
                let end = byte.saturating_add(1);
                end.is_multiple_of(msg).then(|| end / msg - 1)
            }
        }
    }
}

/// Transmit timestamps off a socket's error queue, kept by message until their reply.
struct TxStamps {
    /// `(seq, ns)` per ring slot; empty when transmit stamps are not read.
    ring: Vec<(u64, u64)>,
    fd: i32,
    keying: Keying,
}

impl TxStamps {
    fn new(reading: bool, fd: i32, keying: Keying) -> Self {
        Self {
            ring: if reading {
                vec![(u64::MAX, 0); SEND_RING]
            } else {
                Vec::new()
            },
            fd,
            keying,
        }
    }

    /// The kernel's transmit time of message `seq`, after taking what the error queue holds.
    /// `newest` is the highest seq sent (keys carry 32 bits). A stamp outside `[sent,
    /// received]` (wall clock, ns) belongs to another message (a send the kernel dropped before
    /// numbering it would shift the keys) and is not used. TCP may put two messages written
    /// back to back into one segment, which carries only the later one's stamp: the earlier
    /// has none.
    fn of(
        &mut self,
        seq: u64,
        newest: u64,
        sent: Option<u64>,
        received: Option<u64>,
    ) -> Option<u64> {
        if self.ring.is_empty() {
            return None;
        }
        while let Ok(Some((key, ns))) = {
            count_call();
            sys::read_tx_stamp(self.fd)
        } {
            if let Some(s) = self.keying.seq(key, newest) {
                self.ring[ring_slot(s)] = (s, ns);
            }
        }
        let (tag, ns) = self.ring[ring_slot(seq)];
        let plausible = sent.is_none_or(|a| ns >= a) && received.is_none_or(|b| ns <= b);
        (tag == seq && plausible).then_some(ns)
    }
}

/// The UDP closed loop's state: everything preallocated before the first send.
struct ClosedUdp<'a> {
    sock: &'a UdpSocket,
    msg: usize,
    framing: Framing,
    one_way: bool,
    stamped: bool,
    out: Vec<u8>,
    inbuf: Vec<u8>,
    sent_at: Vec<SentAt>,
    tx: TxStamps,
    /// Messages sent so far; the next seq.
    sent: u64,
    rtt: RttRecorder,
    /// Every RTT, warm-up included: the reply timeout's median. (From `rtt` alone, every reply
    /// lost during the warm-up cost the 1 s first-reply timeout.)
    all: RttRecorder,
    tracker: SeqTracker,
    rec: &'a mut Recorder,
}

impl ClosedUdp<'_> {
    /// Receives replies until the reply to `want` arrives (`None`: until every message sent has
    /// been answered), the deadline passes, or `stop`. Replies to earlier messages that arrive
    /// meanwhile are recorded against their own send times.
    fn collect(
        &mut self,
        clock: &Clock,
        stop: &AtomicBool,
        deadline_ns: u64,
        want: Option<u64>,
    ) -> io::Result<Wait> {
        loop {
            if want.is_none() && self.tracker.received() >= self.sent {
                return Ok(Wait::Answered);
            }
            match udp_recv(self.sock, &mut self.inbuf, self.stamped) {
                Ok((n, rx_ns)) => {
                    let t = clock.now_ns();
                    let expected = self.sent.saturating_sub(1);
                    let datagram = &self.inbuf[..n];
                    let seq =
                        udp_reply_seq(self.framing, self.one_way, datagram, self.msg, expected);
                    let agent = if self.one_way {
                        stamps::udp_reply_stamps(datagram)
                    } else {
                        None
                    };
                    if let Some(seq) = seq {
                        // A seq never sent is junk, or a truncated seq widened the wrong way.
                        if seq < self.sent {
                            if self.tracker.on_packet(seq) != Arrival::Duplicate {
                                self.answer(seq, t, rx_ns, agent);
                            }
                            if want == Some(seq) {
                                return Ok(Wait::Answered);
                            }
                        }
                    }
                    if t >= deadline_ns {
                        return Ok(Wait::TimedOut);
                    }
                }
                Err(e) if is_retry(&e) => {
                    if stop.load(Ordering::Relaxed) {
                        return Ok(Wait::Stopped);
                    }
                    if clock.now_ns() >= deadline_ns {
                        return Ok(Wait::TimedOut);
                    }
                }
                Err(e) => return Err(udp_error(e)),
            }
        }
    }

    /// The first reply to message `seq`, received at `t`.
    fn answer(&mut self, seq: u64, t: u64, rx_ns: Option<u64>, agent: Option<(u64, u64)>) {
        let slot = ring_slot(seq);
        let at = self.sent_at[slot];
        if at.seq != seq {
            return;
        }
        self.sent_at[slot].answered = true;
        self.rtt.record(at.ns, t.saturating_sub(at.ns));
        self.all.record(at.ns, t.saturating_sub(at.ns));
        let send_real_ns = (at.real_ns != 0).then_some(at.real_ns);
        let newest = self.sent.saturating_sub(1);
        let tx_ns = self.tx.of(seq, newest, send_real_ns, rx_ns);
        self.rec.reply(&ReplyAt {
            seq,
            send_ns: at.ns,
            receive_ns: t,
            // Not the message in flight: the loop gave up on it and moved on.
            late: seq + 1 < self.sent,
            stamps: Stamps {
                rx_ns,
                tx_ns,
                send_real_ns,
                agent,
            },
        });
    }

    /// For the full log: message `seq`'s slot is about to be reused, or the run is over; if it
    /// was never answered, it is lost.
    fn settle(&mut self, seq: u64) {
        let at = self.sent_at[ring_slot(seq)];
        if at.seq == seq && !at.answered {
            self.rec.lost(seq, at.ns);
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn udp_closed(
    sock: &UdpSocket,
    msg: usize,
    framing: Framing,
    cfg: &PingConfig,
    clock: &Clock,
    stop: &AtomicBool,
    rec: &mut Recorder,
) -> io::Result<LatencyOutcome> {
    let stamped = rec.reading_rx();
    let mut st = ClosedUdp {
        sock,
        msg,
        framing,
        one_way: rec.one_way(),
        stamped,
        out: vec![0u8; msg],
        inbuf: vec![0u8; UDP_RECV_BUF],
        sent_at: vec![
            SentAt {
                seq: u64::MAX,
                ns: 0,
                real_ns: 0,
                answered: false,
            };
            SEND_RING
        ],
        tx: TxStamps::new(rec.reading_tx(), sys::udp_fd(sock), Keying::Datagram),
        sent: 0,
        rtt: RttRecorder::new(cfg.warmup_ns),
        all: RttRecorder::new(0),
        tracker: SeqTracker::new(),
        rec,
    };
    framing.prepare(&mut st.out);
    let log_lost = st.rec.wants_lost();
    let mut timeouts = 0;
    let mut reply_timeout_ns = udp_reply_timeout_ns(&st.all);
    let mut stopped = false;
    let mut measured = 0;
    let mut first_send_ns = None;
    while !stop.load(Ordering::Relaxed) {
        let seq = st.sent;
        if seq.is_multiple_of(TIMEOUT_REFRESH) || seq.is_power_of_two() {
            reply_timeout_ns = udp_reply_timeout_ns(&st.all);
            sock.set_read_timeout(Some(udp_poll_for(reply_timeout_ns)))?;
        }
        if st.one_way {
            stamps::write_udp_request(seq, &mut st.out);
        } else {
            framing.stamp(seq, &mut st.out);
        }
        let t0 = clock.now_ns();
        if t0 >= cfg.until_ns || cfg.counted_out(measured) {
            break;
        }
        if log_lost && seq >= SEND_RING as u64 {
            st.settle(seq - SEND_RING as u64);
        }
        let real_ns = if stamped { realtime_ns() } else { 0 };
        count_call();
        send_transient_ok(sock, &st.out).map_err(udp_error)?;
        st.sent_at[ring_slot(seq)] = SentAt {
            seq,
            ns: t0,
            real_ns,
            answered: false,
        };
        st.sent += 1;
        let first = *first_send_ns.get_or_insert(t0);
        measured += u64::from(t0 >= cfg.warmup_ns);
        match st.collect(clock, stop, t0.saturating_add(reply_timeout_ns), Some(seq))? {
            Wait::Answered => {}
            Wait::TimedOut => {
                timeouts += 1;
                if framing == Framing::Sockperf
                    && st.tracker.received() == 0
                    && clock.now_ns().saturating_sub(first) >= duration_ns(SOCKPERF_NO_REPLY)
                {
                    return Err(NoReply::TimedOut(SOCKPERF_NO_REPLY).into_io());
                }
            }
            Wait::Stopped => {
                stopped = true;
                break;
            }
        }
    }
    if !stopped {
        let deadline = clock.now_ns().saturating_add(reply_timeout_ns);
        st.collect(clock, stop, deadline, None)?;
    }
    if log_lost {
        for seq in st.sent.saturating_sub(SEND_RING as u64)..st.sent {
            st.settle(seq);
        }
    }
    Ok(LatencyOutcome {
        rtt: st.rtt,
        sent: st.sent,
        seq: Some(st.tracker),
        late_sends: 0,
        timeouts,
        socket: None,
        one_way: None,
        log: None,
    })
}

#[allow(clippy::too_many_arguments)]
fn udp_open(
    sock: &UdpSocket,
    msg: usize,
    framing: Framing,
    rate: f64,
    cfg: &PingConfig,
    clock: &Clock,
    stop: &AtomicBool,
    rec: &mut Recorder,
) -> io::Result<LatencyOutcome> {
    let plan = OpenLoop::new(rate, clock.now_ns(), cfg.until_ns);
    let progress = Progress::default();
    let send_times = rec.reading_rx().then(SendTimes::new);
    let one_way = rec.one_way();
    let cpu = rec.cpu();
    let (rtt, tracker) = thread::scope(|scope| {
        let sender = scope.spawn(|| {
            sender_thread(cpu.as_deref(), || {
                let mut out = vec![0u8; msg];
                framing.prepare(&mut out);
                paced_sender(&plan, clock, stop, &progress, |seq| {
                    if one_way {
                        stamps::write_udp_request(seq, &mut out);
                    } else {
                        framing.stamp(seq, &mut out);
                    }
                    if let Some(times) = &send_times {
                        times.store(seq, realtime_ns());
                    }
                    count_call();
                    send_transient_ok(sock, &out).map_err(udp_error)
                })
            })
        });
        let reader = OpenReader {
            plan: &plan,
            clock,
            stop,
            progress: &progress,
            send_times: send_times.as_ref(),
        };
        let received = udp_open_reader(sock, msg, framing, &reader, cfg.warmup_ns, rec);
        if received.is_err() {
            progress.abort.store(true, Ordering::Relaxed);
        }
        let (sent, calls) = join(sender);
        add_calls(calls);
        sent.and(received)
    })?;
    Ok(LatencyOutcome {
        rtt,
        sent: progress.sent(),
        seq: Some(tracker),
        late_sends: progress.late.load(Ordering::Relaxed),
        timeouts: 0,
        socket: None,
        one_way: None,
        log: None,
    })
}

/// For the full log, in an open loop: which messages have been answered, by ring slot, and
/// how far the loop has settled (every message below `swept` is answered or logged lost).
struct Answered {
    got: Vec<u64>,
    swept: u64,
}

impl Answered {
    fn new(logging: bool) -> Self {
        Self {
            got: if logging {
                vec![u64::MAX; SEND_RING]
            } else {
                Vec::new()
            },
            swept: 0,
        }
    }

    fn mark(&mut self, seq: u64) {
        if let Some(slot) = self.got.get_mut(ring_slot(seq)) {
            *slot = seq;
        }
    }

    /// Logs as lost every message below `upto` not answered yet whose slot is needed
    /// (`final`: every one below `upto`).
    fn sweep(&mut self, upto: u64, last: bool, plan: &OpenLoop, rec: &mut Recorder) {
        if self.got.is_empty() {
            return;
        }
        let keep = if last { 0 } else { SEND_RING as u64 };
        while self.swept.saturating_add(keep) < upto {
            let s = self.swept;
            if self.got[ring_slot(s)] != s {
                rec.lost(s, plan.due(s));
            }
            self.swept += 1;
        }
    }
}

/// Receives replies until every message sent is answered after the sender ended, the drain
/// timeout passes, or `stop`. Only first arrivals are recorded.
fn udp_open_reader(
    sock: &UdpSocket,
    msg: usize,
    framing: Framing,
    r: &OpenReader<'_>,
    warmup_ns: u64,
    rec: &mut Recorder,
) -> io::Result<(RttRecorder, SeqTracker)> {
    let (plan, clock, progress) = (r.plan, r.clock, r.progress);
    let mut rtt = RttRecorder::new(warmup_ns);
    let mut tracker = SeqTracker::new();
    let mut buf = vec![0u8; UDP_RECV_BUF];
    let one_way = rec.one_way();
    let stamped = rec.reading_rx();
    let mut tx = TxStamps::new(rec.reading_tx(), sys::udp_fd(sock), Keying::Datagram);
    let mut answered = Answered::new(rec.wants_lost());
    let mut sender_done_at = None;
    let mut drain_ns = 0;
    loop {
        if r.stop.load(Ordering::Relaxed) || progress.abort.load(Ordering::Relaxed) {
            answered.sweep(progress.sent(), true, plan, rec);
            return Ok((rtt, tracker));
        }
        if let Some(done_at) = progress.done_at(&mut sender_done_at, clock) {
            if drain_ns == 0 {
                drain_ns = udp_reply_timeout_ns(&rtt);
            }
            if tracker.received() >= progress.sent()
                || clock.now_ns() >= done_at.saturating_add(drain_ns)
            {
                answered.sweep(progress.sent(), true, plan, rec);
                return Ok((rtt, tracker));
            }
        }
        let (n, rx_ns) = match udp_recv(sock, &mut buf, stamped) {
            Ok(got) => got,
            Err(e) if is_retry(&e) => {
                if framing == Framing::Sockperf
                    && tracker.received() == 0
                    && progress.sent() > 0
                    && clock.now_ns().saturating_sub(plan.start_ns)
                        >= duration_ns(SOCKPERF_NO_REPLY)
                {
                    return Err(NoReply::TimedOut(SOCKPERF_NO_REPLY).into_io());
                }
                continue;
            }
            Err(e) => return Err(udp_error(e)),
        };
        let t = clock.now_ns();
        let expected = tracker.highest().map_or(0, |h| h.saturating_add(1));
        let datagram = &buf[..n];
        let Some(seq) = udp_reply_seq(framing, one_way, datagram, msg, expected) else {
            continue;
        };
        // Only a message already due can have been sent (and answered).
        let due_by = plan.due_by(t);
        if seq >= due_by {
            continue;
        }
        if tracker.on_packet(seq) != Arrival::Duplicate {
            let agent = if one_way {
                stamps::udp_reply_stamps(datagram)
            } else {
                None
            };
            let due = plan.due(seq);
            rtt.record(due, t.saturating_sub(due));
            answered.mark(seq);
            let send_real_ns = r.send_times.and_then(|st| st.load(seq));
            let tx_ns = tx.of(seq, due_by - 1, send_real_ns, rx_ns);
            rec.reply(&ReplyAt {
                seq,
                send_ns: due,
                receive_ns: t,
                late: false,
                stamps: Stamps {
                    rx_ns,
                    tx_ns,
                    send_real_ns,
                    agent,
                },
            });
            answered.sweep(progress.sent(), false, plan, rec);
        }
    }
}

/// The seq of a latency reply, or `None` for anything else: a wrong size, or a stray join
/// acknowledgement from the agent (a latency seq is below 2^62, so its first byte is never the
/// `S` of `SNDA` even when the message is exactly [`UDP_JOIN_LEN`] bytes long).
fn reply_seq(datagram: &[u8], msg: usize, expected: u64) -> Option<u64> {
    if datagram.len() == UDP_JOIN_LEN && UdpJoin::decode(datagram).is_ok() {
        return None;
    }
    if datagram.len() != msg {
        return None;
    }
    let (low, bytes) = read_latency_seq(datagram);
    Some(widen_seq(low, bytes, expected))
}

/// `max(1 ms, 10 × median RTT so far)`, or 1 s before the first RTT is known.
fn udp_reply_timeout_ns(rtt: &RttRecorder) -> u64 {
    let floor = duration_ns(UDP_MIN_REPLY_TIMEOUT);
    rtt.value_at(50.0)
        .map_or(duration_ns(UDP_FIRST_REPLY_TIMEOUT), |median| {
            median.saturating_mul(10).max(floor)
        })
}

/// How often a blocked `recv` wakes to look at a reply deadline of `timeout_ns`: a quarter of
/// it (so a timeout overshoots by at most 25%), between 100 µs and [`UDP_POLL`]. Set when the
/// timeout is recomputed, never between a send and its reply.
fn udp_poll_for(timeout_ns: u64) -> Duration {
    Duration::from_nanos(timeout_ns / 4).clamp(Duration::from_micros(100), UDP_POLL)
}

fn ring_slot(seq: u64) -> usize {
    (seq % SEND_RING as u64) as usize
}

/// Sends one datagram. A datagram the kernel could not queue (`ENOBUFS`, a full send buffer) is
/// lost like any other and shows up as loss, so it is not an error.
fn send_transient_ok(sock: &UdpSocket, datagram: &[u8]) -> io::Result<()> {
    match sock.send(datagram) {
        Ok(_) => Ok(()),
        Err(e)
            if e.kind() == io::ErrorKind::WouldBlock
                || e.kind() == io::ErrorKind::Interrupted
                || sys::no_buffer_space(&e) =>
        {
            Ok(())
        }
        Err(e) => Err(e),
    }
}

fn udp_error(e: io::Error) -> io::Error {
    if sys::port_unreachable(&e) {
        io::Error::new(
            io::ErrorKind::ConnectionRefused,
            "the peer's UDP port is closed (ICMP port unreachable): is the agent still running \
             the test?",
        )
    } else {
        e
    }
}

// ---------------------------------------------------------------------------------------------
// Open loop, shared

/// An open-loop schedule placed on the test clock.
#[derive(Debug, Clone, Copy)]
struct OpenLoop {
    sched: Schedule,
    /// Test-clock time of the schedule's origin.
    start_ns: u64,
    until_ns: u64,
}

impl OpenLoop {
    fn new(rate: f64, start_ns: u64, until_ns: u64) -> Self {
        Self {
            sched: Schedule::per_second(rate),
            start_ns,
            until_ns,
        }
    }
    /// When message `i` is due, on the test clock.
    fn due(&self, i: u64) -> u64 {
        self.start_ns.saturating_add(self.sched.due_ns(i))
    }
    /// How many messages are due by `now_ns` on the test clock.
    fn due_by(&self, now_ns: u64) -> u64 {
        match now_ns.checked_sub(self.start_ns) {
            Some(since) => self.sched.due_by(since),
            None => 0,
        }
    }
}

/// Shared between the open-loop sender and reader.
#[derive(Debug, Default)]
struct Progress {
    /// Messages sent so far.
    sent: AtomicU64,
    /// Sends later than [`LATE_SEND`].
    late: AtomicU64,
    /// The sender has ended.
    done: AtomicBool,
    /// One side failed; the other ends.
    abort: AtomicBool,
}

impl Progress {
    fn sent(&self) -> u64 {
        self.sent.load(Ordering::Acquire)
    }
    /// When the reader first saw the sender done (`None` while it runs).
    fn done_at(&self, seen: &mut Option<u64>, clock: &Clock) -> Option<u64> {
        if seen.is_none() && self.done.load(Ordering::Acquire) {
            *seen = Some(clock.now_ns());
        }
        *seen
    }
}

/// Sends message `i` at `plan.due(i)` for every `i` due before `plan.until_ns`, sleeping until
/// each is due. A message is never skipped: one that cannot leave on time leaves late (and is
/// counted late beyond [`LATE_SEND`]). The sender also ends at `until_ns` on the clock, so a
/// sender running behind does not overrun the test; messages still due then are not sent.
fn paced_sender(
    plan: &OpenLoop,
    clock: &Clock,
    stop: &AtomicBool,
    progress: &Progress,
    mut send: impl FnMut(u64) -> io::Result<()>,
) -> io::Result<()> {
    let late_ns = duration_ns(LATE_SEND);
    let result = (|| {
        let mut i = 0u64;
        loop {
            let due = plan.due(i);
            if due >= plan.until_ns {
                return Ok(());
            }
            let mut now = clock.now_ns();
            while now < due {
                if stop.load(Ordering::Relaxed) || progress.abort.load(Ordering::Relaxed) {
                    return Ok(());
                }
                thread::sleep(Duration::from_nanos(due - now).min(MAX_SLEEP));
                now = clock.now_ns();
            }
            if now >= plan.until_ns
                || stop.load(Ordering::Relaxed)
                || progress.abort.load(Ordering::Relaxed)
            {
                return Ok(());
            }
            if now - due > late_ns {
                progress.late.fetch_add(1, Ordering::Relaxed);
            }
            send(i)?;
            i += 1;
            progress.sent.store(i, Ordering::Release);
        }
    })();
    if result.is_err() {
        progress.abort.store(true, Ordering::Relaxed);
    }
    progress.done.store(true, Ordering::Release);
    result
}

fn join<T>(handle: thread::ScopedJoinHandle<'_, T>) -> T {
    handle
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
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

/// A read or write that hit its timeout (`EAGAIN` on Unix, `TimedOut` on Windows) or a signal:
/// look at the flags and deadlines, then go again.
fn is_retry(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

fn peer_closed() -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "the peer closed the TCP connection before answering every message",
    )
}

fn tcp_write_error(e: io::Error) -> io::Error {
    if matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    ) {
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
mod tests {
    use std::net::TcpListener;
    use std::time::Instant;

    use sonde_wire::Token;

    use super::*;

    const MS: u64 = 1_000_000;

    fn cfg(msg_size: u32, run_ms: u64, warmup_ms: u64, rate: Option<f64>) -> PingConfig {
        PingConfig {
            msg_size,
            until_ns: run_ms * MS,
            warmup_ns: warmup_ms * MS,
            rate,
            count: None,
        }
    }

    /// The run helpers below take this, one loop at a time: a loop keeps two threads busy,
    /// and on a 2-core machine two loops at once starve each other's replies into timeouts.
    fn one_loop_at_a_time() -> std::sync::MutexGuard<'static, ()> {
        static LOOPS: std::sync::Mutex<()> = std::sync::Mutex::new(());
        LOOPS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn tcp_pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        client.set_nodelay(true).unwrap();
        server.set_nodelay(true).unwrap();
        (client, server)
    }

    fn udp_pair() -> (UdpSocket, UdpSocket) {
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").unwrap();
        a.connect(b.local_addr().unwrap()).unwrap();
        b.connect(a.local_addr().unwrap()).unwrap();
        (a, b)
    }

    /// Runs `tcp_ping` against `tcp_echo`; returns the outcome and the echo's counters.
    fn tcp_run(cfg: &PingConfig) -> (LatencyOutcome, (u64, u64)) {
        let _one = one_loop_at_a_time();
        let (client, server) = tcp_pair();
        let stop = AtomicBool::new(false);
        let counters = Counters::default();
        let clock = Clock::start();
        let out = thread::scope(|s| {
            let echo = s.spawn(|| tcp_echo(&server, &stop, &counters));
            let out = tcp_ping(&client, cfg, &clock, &AtomicBool::new(false));
            client.shutdown(std::net::Shutdown::Both).unwrap();
            echo.join().unwrap().unwrap();
            out
        })
        .unwrap();
        (out, counters.load())
    }

    /// Runs `udp_ping` against `echo` (a peer loop given its socket and a stop flag).
    fn udp_run(
        cfg: &PingConfig,
        echo: impl FnOnce(&UdpSocket, &AtomicBool) + Send,
    ) -> (LatencyOutcome, Duration) {
        let (out, took, _) = udp_run_counting_drops(cfg, echo);
        (out, took)
    }

    /// [`udp_run`], and the datagrams the kernel dropped at the two sockets (full receive
    /// buffers: on loopback the only way to lose one).
    fn udp_run_counting_drops(
        cfg: &PingConfig,
        echo: impl FnOnce(&UdpSocket, &AtomicBool) + Send,
    ) -> (LatencyOutcome, Duration, u64) {
        let _one = one_loop_at_a_time();
        let (client, server) = udp_pair();
        let stop = AtomicBool::new(false);
        let clock = Clock::start();
        let (out, took) = thread::scope(|s| {
            let peer = s.spawn(|| echo(&server, &stop));
            let out = udp_ping(&client, cfg, &clock, &AtomicBool::new(false)).unwrap();
            let took = clock.origin().elapsed();
            stop.store(true, Ordering::Relaxed);
            peer.join().unwrap();
            (out, took)
        });
        let drops = udp_drops(&client) + udp_drops(&server);
        (out, took, drops)
    }

    /// The kernel's count of datagrams dropped at `sock` (the last column of its line in
    /// `/proc/self/net/udp`, found by local address).
    fn udp_drops(sock: &UdpSocket) -> u64 {
        let std::net::SocketAddr::V4(addr) = sock.local_addr().unwrap() else {
            panic!("the test sockets are IPv4");
        };
        // `0100007F:1F90`: the address as the kernel prints it (its network-order bytes as a
        // native u32), the port in hex.
        let local = format!(
            "{:08X}:{:04X}",
            u32::from_ne_bytes(addr.ip().octets()),
            addr.port()
        );
        let table = std::fs::read_to_string("/proc/self/net/udp").unwrap();
        table
            .lines()
            .find(|line| line.split_whitespace().nth(1) == Some(local.as_str()))
            .and_then(|line| line.split_whitespace().last()?.parse().ok())
            .unwrap_or_else(|| panic!("no {local} in /proc/self/net/udp:\n{table}"))
    }

    fn real_echo(counters: &Counters) -> impl FnOnce(&UdpSocket, &AtomicBool) + Send + '_ {
        move |sock, stop| udp_echo(sock, stop, counters).unwrap()
    }

    /// A hand-written echo: `answer(i)` says how many copies the i-th request (from 0) gets.
    fn scripted_echo(
        answer: impl Fn(u64) -> u32 + Send,
    ) -> impl FnOnce(&UdpSocket, &AtomicBool) + Send {
        move |sock, stop| {
            sock.set_read_timeout(Some(Duration::from_millis(20)))
                .unwrap();
            let mut buf = [0u8; 2048];
            let mut i = 0;
            // Bounded by the stop flag, and by a count no test reaches.
            while !stop.load(Ordering::Relaxed) && i < 10_000_000 {
                let Ok(n) = sock.recv(&mut buf) else { continue };
                for _ in 0..answer(i) {
                    sock.send(&buf[..n]).unwrap();
                }
                i += 1;
            }
        }
    }

    /// How many of a closed loop's timeouts its replies allow: a timeout there is a reply that
    /// took longer than [`UDP_MIN_REPLY_TIMEOUT`] (on loopback, a host too busy to run the echo
    /// in time) and still counts when it comes, so each needs a sample at least that slow.
    /// Warm-up samples are not in the histogram and may all be slow.
    fn timeouts_allowed(out: &LatencyOutcome) -> u64 {
        let floor = duration_ns(UDP_MIN_REPLY_TIMEOUT);
        let slow: u64 = out
            .rtt
            .log_buckets(usize::MAX)
            .iter()
            .filter(|b| b.le_ns >= floor)
            .map(|b| b.count)
            .sum();
        slow + out.rtt.warmup_excluded()
    }

    /// An outcome's counts and RTT summary, without the histogram's buckets.
    fn brief(out: &LatencyOutcome) -> String {
        format!(
            "sent {}, late {}, timeouts {}, samples {} (+{} warm-up), seq {:?}, rtt {:?}",
            out.sent,
            out.late_sends,
            out.timeouts,
            out.rtt.samples(),
            out.rtt.warmup_excluded(),
            out.seq
                .as_ref()
                .map(|s| (s.received(), s.duplicated(), s.reordered())),
            out.rtt.summary()
        )
    }

    fn assert_sane(out: &LatencyOutcome) {
        let sum = out.rtt.summary();
        assert!(sum.samples > 0, "{}", brief(out));
        let p50 = out.rtt.value_at(50.0).unwrap();
        assert!(
            sum.min_ns > 0 && sum.min_ns <= p50 && p50 <= sum.max_ns,
            "{sum:?}"
        );
        assert!(sum.max_ns < 1_000_000_000, "{sum:?}");
    }

    #[test]
    fn tcp_closed_loop_measures_every_message() {
        for size in [1, 64, 65_536] {
            let (out, (bytes, _)) = tcp_run(&cfg(size, 200, 20, None));
            assert_sane(&out);
            assert!(out.rtt.warmup_excluded() > 0);
            assert_eq!(out.sent, out.rtt.samples() + out.rtt.warmup_excluded());
            assert_eq!(bytes, out.sent * u64::from(size));
            assert!(out.seq.is_none());
        }
    }

    /// The open loop's sender thread counts its CPU in the caller's meter and its system calls
    /// in the calling thread's count; a run on another thread at the same time stays out.
    #[test]
    fn an_open_loops_sender_counts_for_its_caller_and_other_runs_do_not_mix_in() {
        let (client, server) = udp_pair();
        let stop = AtomicBool::new(false);
        let counters = Counters::default();
        let clock = Clock::start();
        let meter = std::sync::Arc::new(ThreadsMeter::start());
        thread::scope(|s| {
            let peer = s.spawn(|| udp_echo(&server, &stop, &counters).unwrap());
            // A closed loop on another thread meanwhile: thousands of calls, none of them ours.
            let other = s.spawn(|| {
                let before = ping_syscalls();
                let (out, _) = udp_run(&cfg(64, 250, 0, None), real_echo(&Counters::default()));
                (out.sent, ping_syscalls() - before)
            });
            let before = ping_syscalls();
            let view = InnerView {
                cpu: Some(std::sync::Arc::clone(&meter)),
                ..InnerView::default()
            };
            let out = udp_ping_with(
                &client,
                &cfg(64, 300, 0, Some(2_000.0)),
                Framing::Sonde,
                view,
                &clock,
                &AtomicBool::new(false),
            )
            .unwrap();
            let calls = ping_syscalls() - before;
            stop.store(true, Ordering::Relaxed);
            peer.join().unwrap();
            let (other_sent, other_calls) = other.join().unwrap();
            // A send per message (on the sender thread), a receive per reply, and the reader's
            // timed-out polls (a few per 10 ms at most).
            let (sent, received) = (out.sent, out.seq.as_ref().unwrap().received());
            let what = format!("{calls} calls for {sent} sent, {received} received");
            assert!(received > 0 && sent >= 590, "{what}");
            assert!(calls >= sent + received, "{what}");
            assert!(calls <= sent + received + 200, "{what}");
            assert!(other_sent > 0 && other_calls >= 2 * other_sent);
        });
        #[cfg(target_os = "linux")]
        assert!(meter.cost().unwrap().usage.total() > Duration::ZERO);
    }

    #[test]
    fn closed_loops_stop_at_the_count_after_warm_up() {
        let counted = PingConfig {
            count: Some(300),
            ..cfg(64, 10_000, 20, None)
        };
        let (out, _) = tcp_run(&counted);
        assert_eq!(out.rtt.samples(), 300);
        let counters = Counters::default();
        let (out, _) = udp_run(&counted, real_echo(&counters));
        assert_eq!(out.rtt.samples(), 300);
        assert_eq!(out.sent, 300 + out.rtt.warmup_excluded());
    }

    #[test]
    fn tcp_open_loop_keeps_the_schedule() {
        let (out, _) = tcp_run(&cfg(64, 300, 50, Some(2000.0)));
        assert_sane(&out);
        assert!((595..=605).contains(&out.sent), "{}", brief(&out));
        assert_eq!(out.rtt.samples(), out.sent - out.rtt.warmup_excluded());
        assert!(
            (95..=105).contains(&out.rtt.warmup_excluded()),
            "{}",
            brief(&out)
        );
    }

    #[test]
    fn tcp_open_loop_reassembles_split_and_coalesced_replies() {
        // An echo that holds replies back until a 5 ms lull and returns them in 37-byte writes:
        // replies reach the client coalesced and split across reads.
        let (client, server) = tcp_pair();
        let clock = Clock::start();
        let cfg = cfg(100, 200, 0, Some(1000.0));
        let out = thread::scope(|s| {
            s.spawn(|| {
                server
                    .set_read_timeout(Some(Duration::from_millis(5)))
                    .unwrap();
                let mut s = &server;
                let mut pending = Vec::new();
                let mut buf = [0u8; 4096];
                for _ in 0..100_000 {
                    match s.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => pending.extend_from_slice(&buf[..n]),
                        Err(e) if is_retry(&e) => {
                            for chunk in pending.chunks(37) {
                                s.write_all(chunk).unwrap();
                            }
                            pending.clear();
                        }
                        Err(e) => panic!("{e}"),
                    }
                }
            });
            let out = tcp_ping(&client, &cfg, &clock, &AtomicBool::new(false));
            client.shutdown(std::net::Shutdown::Both).unwrap();
            out
        })
        .unwrap();
        assert!((195..=205).contains(&out.sent), "{}", brief(&out));
        assert_eq!(out.rtt.samples(), out.sent);
        assert_sane(&out);
    }

    #[test]
    fn tcp_ping_fails_when_the_peer_hangs_up() {
        let (client, server) = tcp_pair();
        drop(server);
        let err = tcp_ping(
            &client,
            &cfg(64, 1000, 0, None),
            &Clock::start(),
            &AtomicBool::new(false),
        )
        .unwrap_err();
        assert!(
            matches!(
                err.kind(),
                io::ErrorKind::UnexpectedEof
                    | io::ErrorKind::ConnectionReset
                    | io::ErrorKind::BrokenPipe
            ),
            "{err:?}"
        );
    }

    #[test]
    fn message_sizes_and_rates_are_checked() {
        let (client, _server) = tcp_pair();
        let (udp, _peer) = udp_pair();
        let clock = Clock::start();
        let stop = AtomicBool::new(false);
        for size in [0, 65_537] {
            let err = tcp_ping(&client, &cfg(size, 100, 0, None), &clock, &stop).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        }
        for size in [0, 65_508] {
            let err = udp_ping(&udp, &cfg(size, 100, 0, None), &clock, &stop).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        }
        for rate in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let err = udp_ping(&udp, &cfg(8, 100, 0, Some(rate)), &clock, &stop).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        }
        // The checks come before anything is sent or any timeout is changed.
        assert_eq!(client.read_timeout().unwrap(), None);
    }

    #[test]
    fn udp_closed_loop_has_no_loss_on_loopback() {
        for size in [1, 18, 1472] {
            let counters = Counters::default();
            let (out, _) = udp_run(&cfg(size, 200, 20, None), real_echo(&counters));
            assert_sane(&out);
            let seq = out.seq.as_ref().unwrap();
            assert_eq!(seq.lost(out.sent), 0, "{}", brief(&out));
            assert_eq!(seq.received(), out.sent);
            assert_eq!(seq.duplicated(), 0);
            assert!(out.timeouts <= timeouts_allowed(&out), "{}", brief(&out));
            assert_eq!(out.sent, out.rtt.samples() + out.rtt.warmup_excluded());
            assert_eq!(counters.load(), (out.sent * u64::from(size), out.sent));
            if size == 1 {
                // One byte carries seq mod 256: widening got every seq right.
                assert!(out.sent > 256, "{}", brief(&out));
            }
        }
    }

    /// `--busy-poll` ([`crate::tune`]): with both ends' sockets non-blocking the loops spin
    /// instead of sleeping, and still measure and echo every message exactly once (a 64 KiB TCP
    /// message, more than one non-blocking write takes, included); the spinning echoes end at
    /// their stop flag while the client still holds its end open.
    #[test]
    fn busy_polled_loops_measure_every_message_and_echoes_end_at_the_flag() {
        let _one = one_loop_at_a_time();
        for size in [64u32, 65_536] {
            let (client, server) = tcp_pair();
            crate::tune::busy_poll_tcp(&client).unwrap();
            crate::tune::busy_poll_tcp(&server).unwrap();
            let stop = AtomicBool::new(false);
            let counters = Counters::default();
            let clock = Clock::start();
            let out = thread::scope(|s| {
                let echo = s.spawn(|| tcp_echo(&server, &stop, &counters));
                let out = tcp_ping(&client, &cfg(size, 200, 20, None), &clock, &stop).unwrap();
                stop.store(true, Ordering::Relaxed);
                echo.join().unwrap().unwrap();
                out
            });
            assert_sane(&out);
            assert_eq!(out.sent, out.rtt.samples() + out.rtt.warmup_excluded());
            assert_eq!(counters.load().0, out.sent * u64::from(size));
            drop(client);
        }
        let (client, server) = udp_pair();
        crate::tune::busy_poll_udp(&client).unwrap();
        crate::tune::busy_poll_udp(&server).unwrap();
        let stop = AtomicBool::new(false);
        let counters = Counters::default();
        let clock = Clock::start();
        let out = thread::scope(|s| {
            let echo = s.spawn(|| udp_echo(&server, &stop, &counters));
            let out = udp_ping(
                &client,
                &cfg(64, 200, 20, None),
                &clock,
                &AtomicBool::new(false),
            )
            .unwrap();
            stop.store(true, Ordering::Relaxed);
            echo.join().unwrap().unwrap();
            out
        });
        assert_sane(&out);
        let seq = out.seq.as_ref().unwrap();
        assert_eq!(seq.received(), out.sent, "{}", brief(&out));
        assert_eq!(seq.duplicated(), 0);
        assert_eq!(counters.load(), (out.sent * 64, out.sent));
    }

    #[test]
    fn udp_closed_loop_counts_loss_and_moves_on() {
        let cfg = cfg(64, 500, 0, None);
        let (out, took) = udp_run(&cfg, scripted_echo(|i| u32::from(i % 10 != 9)));
        let seq = out.seq.as_ref().unwrap();
        let lost = seq.lost(out.sent);
        assert!(out.sent >= 20, "{}", brief(&out));
        assert!(
            lost.abs_diff(out.sent / 10) <= 1,
            "lost {lost} of {}",
            out.sent
        );
        // Every lost request timed out; a slow reply on a busy host may time out too and
        // still count as received.
        assert!(
            out.timeouts >= lost,
            "{} timeouts, {lost} lost",
            out.timeouts
        );
        assert_eq!(out.rtt.samples(), seq.received());
        // The run ends on time: losses cost a reply timeout each, not the run.
        assert!(
            took < Duration::from_millis(500 + 2 * 1000 + 300),
            "{took:?}"
        );
    }

    #[test]
    fn a_reply_lost_in_the_warm_up_costs_a_short_timeout_not_a_second() {
        // Every 10th request unanswered, all within the warm-up: the reply timeout comes from
        // the warm-up's own RTTs (10 x median, at least 1 ms), not the 1 s first-reply one.
        let (out, took) = udp_run(
            &cfg(64, 400, 400, None),
            scripted_echo(|i| u32::from(i % 10 != 9)),
        );
        assert!(out.timeouts >= 3, "{}", brief(&out));
        assert!(out.sent > 100, "{}", brief(&out));
        assert!(took < Duration::from_millis(400 + 1000), "{took:?}");
    }

    #[test]
    fn udp_duplicates_are_counted_not_recorded_twice() {
        let (out, _) = udp_run(
            &cfg(64, 150, 0, None),
            scripted_echo(|i| 1 + u32::from(i == 5)),
        );
        let seq = out.seq.as_ref().unwrap();
        assert_eq!(seq.duplicated(), 1);
        assert_eq!(seq.received(), out.sent);
        assert_eq!(out.rtt.samples(), out.sent);
        assert!(out.timeouts <= timeouts_allowed(&out), "{}", brief(&out));
    }

    #[test]
    fn udp_ping_ignores_stray_join_acks_of_the_same_length() {
        // 16-byte messages are as long as a join ack; the peer sends an ack before each reply.
        let ack = UdpJoin {
            ack: true,
            flow: 0,
            token: Token(7),
            ..UdpJoin::default()
        }
        .encode();
        let echo = move |sock: &UdpSocket, stop: &AtomicBool| {
            sock.set_read_timeout(Some(Duration::from_millis(20)))
                .unwrap();
            let mut buf = [0u8; 64];
            for _ in 0..10_000_000 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(n) = sock.recv(&mut buf) else { continue };
                sock.send(&ack).unwrap();
                sock.send(&buf[..n]).unwrap();
            }
        };
        let (out, _) = udp_run(&cfg(16, 100, 0, None), echo);
        let seq = out.seq.as_ref().unwrap();
        assert!(out.sent > 0);
        assert_eq!(seq.received(), out.sent);
        assert_eq!(out.rtt.samples(), out.sent);
    }

    #[test]
    fn udp_open_loop_keeps_the_schedule_without_loss() {
        let counters = Counters::default();
        let (out, _, drops) =
            udp_run_counting_drops(&cfg(64, 300, 0, Some(5000.0)), real_echo(&counters));
        assert_sane(&out);
        // 1500 sends in 300 ms at 5000/s. A host that stalls the sender leaves it behind when
        // the run ends: it sends the rest late (counted), never skips one, and stops on time.
        assert!(
            (1495..=1505).contains(&out.sent) || (out.sent < 1495 && out.late_sends > 0),
            "{}",
            brief(&out)
        );
        let seq = out.seq.as_ref().unwrap();
        // Nothing is lost on loopback but what a full receive buffer drops: none at all unless
        // the host stalled the echo for tens of milliseconds, and then exactly the kernel's
        // count.
        assert_eq!(seq.lost(out.sent), drops, "{}", brief(&out));
        assert_eq!(out.rtt.samples(), out.sent - drops);
        assert_eq!(out.timeouts, 0);
    }

    /// The drop count the no-loss tests compare with is the kernel's: datagrams sent to a
    /// socket whose receive buffer is full are counted there.
    #[test]
    fn udp_drops_reads_the_kernels_count() {
        let (client, server) = udp_pair();
        assert_eq!(udp_drops(&server), 0);
        socket2::SockRef::from(&server)
            .set_recv_buffer_size(4096)
            .unwrap();
        for _ in 0..200 {
            client.send(&[0u8; 1000]).unwrap();
        }
        let dropped = udp_drops(&server);
        let mut buf = [0u8; 1000];
        server.set_nonblocking(true).unwrap();
        let mut queued = 0;
        while server.recv(&mut buf).is_ok() {
            queued += 1;
        }
        assert!(dropped > 0, "nothing dropped with a 4 KiB buffer");
        assert_eq!(dropped + queued, 200, "{dropped} dropped, {queued} queued");
        assert_eq!(udp_drops(&client), 0);
    }

    #[test]
    fn udp_echo_acks_joins_and_echoes_data() {
        let (client, server) = udp_pair();
        client
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        let stop = AtomicBool::new(false);
        let counters = Counters::default();
        let join = UdpJoin {
            ack: false,
            flow: 3,
            token: Token(0xfeed),
            ..UdpJoin::default()
        };
        thread::scope(|s| {
            let echo = s.spawn(|| udp_echo(&server, &stop, &counters));
            let mut buf = [0u8; 64];
            client.send(&join.encode()).unwrap();
            let n = client.recv(&mut buf).unwrap();
            assert_eq!(
                UdpJoin::decode(&buf[..n]),
                Ok(UdpJoin { ack: true, ..join })
            );
            client.send(b"abc").unwrap();
            let n = client.recv(&mut buf).unwrap();
            assert_eq!(&buf[..n], b"abc");
            stop.store(true, Ordering::Relaxed);
            echo.join().unwrap().unwrap();
        });
        assert_eq!(counters.load(), (3, 1));
        // The echo restored the socket's timeout.
        assert_eq!(server.read_timeout().unwrap(), None);
    }

    #[test]
    fn open_loop_sender_counts_late_sends_and_skips_none() {
        // A send that stalls 20 ms once: the messages behind it go late, none is skipped.
        let clock = Clock::start();
        let plan = OpenLoop::new(1000.0, clock.now_ns(), 100 * MS);
        let progress = Progress::default();
        let started = Instant::now();
        paced_sender(&plan, &clock, &AtomicBool::new(false), &progress, |i| {
            if i == 10 {
                thread::sleep(Duration::from_millis(20));
            }
            Ok(())
        })
        .unwrap();
        assert!(started.elapsed() < Duration::from_secs(1));
        let sent = progress.sent();
        assert!((95..=100).contains(&sent), "{sent}");
        assert!(progress.late.load(Ordering::Relaxed) >= 15, "{progress:?}");
        assert!(progress.done.load(Ordering::Relaxed));
    }

    /// A sockperf server's UDP side, as docs/protocols/sockperf.md §4 has it: count client messages, answer
    /// PONG requests with the client bit cleared. Returns the seqs and flags it saw.
    fn sockperf_udp_server(
        sock: &UdpSocket,
        stop: &AtomicBool,
        reflect: bool,
    ) -> Vec<(u64, u16, u32)> {
        sock.set_read_timeout(Some(Duration::from_millis(20)))
            .unwrap();
        let mut seen = Vec::new();
        let mut buf = vec![0u8; 65_536];
        for _ in 0..10_000_000 {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let Ok(n) = sock.recv(&mut buf) else { continue };
            let sockperf::Parsed::Message(h) = sockperf::parse(&buf[..n], 65_507) else {
                panic!("not a sockperf message: {:02x?}", &buf[..n.min(14)]);
            };
            seen.push((h.seq, h.flags.0, h.length));
            if h.wants_reply() {
                if !reflect {
                    sockperf::make_reply(&mut buf[..n]);
                }
                sock.send(&buf[..n]).unwrap();
            }
        }
        seen
    }

    fn sockperf_udp_run(
        cfg: &PingConfig,
        reflect: bool,
    ) -> (io::Result<LatencyOutcome>, Vec<(u64, u16, u32)>) {
        let (client, server) = udp_pair();
        let stop = AtomicBool::new(false);
        let clock = Clock::start();
        thread::scope(|s| {
            let peer = s.spawn(|| sockperf_udp_server(&server, &stop, reflect));
            let out = udp_ping_framed(
                &client,
                cfg,
                Framing::Sockperf,
                &clock,
                &AtomicBool::new(false),
            );
            stop.store(true, Ordering::Relaxed);
            (out, peer.join().unwrap())
        })
    }

    #[test]
    fn sockperf_udp_messages_carry_the_header_sockperf_sends() {
        for size in [14, 64, 1400] {
            for rate in [None, Some(2000.0)] {
                let (out, seen) = sockperf_udp_run(&cfg(size, 200, 20, rate), false);
                let out = out.unwrap();
                assert_sane(&out);
                let seq = out.seq.as_ref().unwrap();
                assert_eq!(seq.received(), out.sent, "{}", brief(&out));
                assert_eq!(seq.lost(out.sent), 0);
                assert_eq!(out.sent, out.rtt.samples() + out.rtt.warmup_excluded());
                // seq 1, 2, 3...; flags CLIENT | PONG_REQUEST; length = the message size.
                assert_eq!(seen.len() as u64, out.sent);
                for (i, &(s, flags, length)) in seen.iter().enumerate() {
                    assert_eq!((s, flags, length), (i as u64 + 1, 0x0003, size));
                }
            }
        }
    }

    #[test]
    fn sockperf_udp_ignores_requests_reflected_back() {
        // A peer that sends our requests back unchanged (client bit still set) is no server.
        let (out, seen) = sockperf_udp_run(&cfg(64, 300, 0, None), true);
        let out = out.unwrap();
        assert!(!seen.is_empty());
        assert_eq!(out.seq.as_ref().unwrap().received(), 0, "{}", brief(&out));
        assert_eq!(out.rtt.samples(), 0);
    }

    #[test]
    fn sockperf_udp_gives_up_when_nothing_answers() {
        let (client, _silent) = udp_pair();
        let started = Instant::now();
        let err = udp_ping_framed(
            &client,
            &cfg(64, 60_000, 0, None),
            Framing::Sockperf,
            &Clock::start(),
            &AtomicBool::new(false),
        )
        .unwrap_err();
        assert_eq!(
            NoReply::of(&err),
            Some(NoReply::TimedOut(SOCKPERF_NO_REPLY)),
            "{err:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    /// A sockperf server's TCP side: reassemble messages, answer PONG requests. `corrupt` bumps
    /// the seq of the reply to the k-th message.
    fn sockperf_tcp_server(server: &TcpStream, corrupt: Option<usize>) -> u64 {
        server
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut s = server;
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        let mut handled = 0;
        loop {
            let n = match s.read(&mut chunk) {
                Ok(0) | Err(_) => return handled,
                Ok(n) => n,
            };
            buf.extend_from_slice(&chunk[..n]);
            while let sockperf::Parsed::Message(h) = sockperf::parse(&buf, sockperf::MAX_TCP_MSG) {
                let len = h.length as usize;
                let mut msg: Vec<u8> = buf.drain(..len).collect();
                handled += 1;
                if corrupt == Some(handled as usize) {
                    sockperf::set_seq(h.seq + 1, &mut msg).unwrap();
                }
                sockperf::make_reply(&mut msg);
                if s.write_all(&msg).is_err() {
                    return handled;
                }
            }
        }
    }

    fn sockperf_tcp_run(
        cfg: &PingConfig,
        corrupt: Option<usize>,
    ) -> (io::Result<LatencyOutcome>, u64) {
        let (client, server) = tcp_pair();
        let clock = Clock::start();
        thread::scope(|s| {
            let peer = s.spawn(|| sockperf_tcp_server(&server, corrupt));
            let out = tcp_ping_framed(
                &client,
                cfg,
                Framing::Sockperf,
                &clock,
                &AtomicBool::new(false),
            );
            client.shutdown(std::net::Shutdown::Both).unwrap();
            (out, peer.join().unwrap())
        })
    }

    #[test]
    fn sockperf_tcp_closed_and_open_loops_measure_every_message() {
        for size in [14, 100, 65_507, 100_000] {
            for rate in [None, Some(1000.0)] {
                let (out, handled) = sockperf_tcp_run(&cfg(size, 200, 20, rate), None);
                let out = out.unwrap();
                assert_sane(&out);
                assert_eq!(handled, out.sent, "{size}");
                assert_eq!(out.sent, out.rtt.samples() + out.rtt.warmup_excluded());
            }
        }
    }

    #[test]
    fn sockperf_tcp_reply_out_of_step_is_an_error() {
        let (out, _) = sockperf_tcp_run(&cfg(64, 2000, 0, None), Some(3));
        let err = out.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
        assert!(err.to_string().contains("sockperf message 3"), "{err}");
    }

    #[test]
    fn sockperf_tcp_peer_closing_before_any_reply_is_no_reply() {
        let (client, server) = tcp_pair();
        drop(server);
        let err = tcp_ping_framed(
            &client,
            &cfg(64, 1000, 0, None),
            Framing::Sockperf,
            &Clock::start(),
            &AtomicBool::new(false),
        )
        .unwrap_err();
        // Whether the write or the read sees the close first, and as EOF or a reset.
        assert_eq!(NoReply::of(&err), Some(NoReply::Closed), "{err:?}");
    }

    #[test]
    fn sockperf_sizes_start_at_the_header() {
        let (client, _server) = tcp_pair();
        let (udp, _peer) = udp_pair();
        let clock = Clock::start();
        let stop = AtomicBool::new(false);
        for size in [13, 1_048_576] {
            let err = tcp_ping_framed(
                &client,
                &cfg(size, 100, 0, None),
                Framing::Sockperf,
                &clock,
                &stop,
            )
            .unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{size}");
        }
        for size in [13, 65_508] {
            let err = udp_ping_framed(
                &udp,
                &cfg(size, 100, 0, None),
                Framing::Sockperf,
                &clock,
                &stop,
            )
            .unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{size}");
        }
    }

    #[test]
    fn sockperf_reply_seq_accepts_replies_only() {
        let mut msg = vec![0u8; 20];
        sockperf::write_request(5, Flags::CLIENT | Flags::PONG_REQUEST, &mut msg).unwrap();
        // The request itself (client bit set) is not a reply.
        assert_eq!(sockperf_reply_seq(&msg, 20), None);
        sockperf::make_reply(&mut msg);
        assert_eq!(sockperf_reply_seq(&msg, 20), Some(4));
        assert_eq!(sockperf_reply_seq(&msg[..19], 19), None);
        assert_eq!(sockperf_reply_seq(&msg, 21), None);
        // A warm-up reply, and seq 0 (never sent), are not either.
        let mut warm = msg.clone();
        warm[9] |= 0x04;
        assert_eq!(sockperf_reply_seq(&warm, 20), None);
        sockperf::set_seq(0, &mut msg).unwrap();
        assert_eq!(sockperf_reply_seq(&msg, 20), None);
    }

    #[test]
    fn reply_seq_skips_acks_and_wrong_sizes() {
        let ack = UdpJoin {
            ack: true,
            flow: 1,
            token: Token(2),
            ..UdpJoin::default()
        }
        .encode();
        assert_eq!(reply_seq(&ack, 16, 0), None);
        let mut msg = [0u8; 16];
        write_latency_seq((1 << 62) - 1, &mut msg);
        assert_eq!(reply_seq(&msg, 16, 0), Some((1 << 62) - 1));
        assert_eq!(reply_seq(&msg[..8], 16, 0), None);
        assert_eq!(reply_seq(&[0x05], 1, 0x1_00), Some(0x1_05));
    }

    // -----------------------------------------------------------------------------------------
    // The inner view: full log, kernel timestamps, one-way stamps

    /// A byte sink the sample log can own while the test reads it.
    #[derive(Clone, Default)]
    struct Sink(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
    impl Write for Sink {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// One line of the full log.
    #[derive(Debug)]
    struct Line {
        seq: u64,
        send_ns: u64,
        rtt_ns: Option<u64>,
        socket_rtt_ns: Option<u64>,
        send_to_socket_rx_ns: Option<u64>,
        warmup: bool,
        outcome: String,
    }

    fn lines(sink: &Sink) -> Vec<Line> {
        let text = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
        let mut it = text.lines();
        assert_eq!(it.next(), Some(crate::samplelog::HEADER.trim_end()));
        it.map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            let num = |s: &str| (!s.is_empty()).then(|| s.parse::<u64>().unwrap());
            Line {
                seq: f[0].parse().unwrap(),
                send_ns: f[1].parse().unwrap(),
                rtt_ns: num(f[3]),
                socket_rtt_ns: num(f[4]),
                send_to_socket_rx_ns: num(f[5]),
                warmup: f[6].parse().unwrap(),
                outcome: f[7].to_owned(),
            }
        })
        .collect()
    }

    /// A log into a sink, and the view that feeds it.
    fn logged(timestamps: bool) -> (crate::samplelog::SampleLog, Sink, InnerView) {
        let sink = Sink::default();
        let log = crate::samplelog::SampleLog::with_writer(sink.clone(), 1 << 20).unwrap();
        let view = InnerView {
            log: Some(log.sender()),
            timestamps,
            ..InnerView::default()
        };
        (log, sink, view)
    }

    /// Checks a log against its run: one line per message, in the statistics as the
    /// outcome says, the warm-up flagged, and every kernel figure within the app's RTT.
    fn check_log(out: &LatencyOutcome, log: crate::samplelog::SampleLog, sink: &Sink) -> Vec<Line> {
        let summary = log.finish();
        assert!(summary.error.is_none());
        assert_eq!(summary.dropped, 0);
        let mut lines = lines(sink);
        assert_eq!(summary.written, lines.len() as u64);
        lines.sort_by_key(|l| l.seq);
        let seqs: Vec<u64> = lines.iter().map(|l| l.seq).collect();
        assert_eq!(
            seqs,
            (0..out.sent).collect::<Vec<_>>(),
            "one line per message sent"
        );
        let answered = lines.iter().filter(|l| l.outcome != "lost");
        let measured = answered.clone().filter(|l| !l.warmup).count() as u64;
        assert_eq!(measured, out.rtt.samples());
        assert_eq!(
            answered.filter(|l| l.warmup).count() as u64,
            out.rtt.warmup_excluded()
        );
        for l in &lines {
            assert_eq!(l.warmup, l.send_ns < 20 * MS, "{l:?}");
            let rtt = l.rtt_ns.unwrap_or(u64::MAX);
            for k in [l.socket_rtt_ns, l.send_to_socket_rx_ns]
                .into_iter()
                .flatten()
            {
                assert!(k <= rtt, "a kernel figure above the app's RTT: {l:?}");
            }
            if l.outcome == "lost" {
                assert_eq!((l.rtt_ns, l.socket_rtt_ns), (None, None), "{l:?}");
            }
        }
        lines
    }

    fn udp_with(
        cfg: &PingConfig,
        view: InnerView,
        echo: impl FnOnce(&UdpSocket, &AtomicBool) + Send,
    ) -> LatencyOutcome {
        let _one = one_loop_at_a_time();
        let (client, server) = udp_pair();
        let stop = AtomicBool::new(false);
        let clock = Clock::start();
        thread::scope(|s| {
            let peer = s.spawn(|| echo(&server, &stop));
            let out = udp_ping_with(
                &client,
                cfg,
                Framing::Sonde,
                view,
                &clock,
                &AtomicBool::new(false),
            );
            stop.store(true, Ordering::Relaxed);
            peer.join().unwrap();
            out.unwrap()
        })
    }

    fn tcp_with(cfg: &PingConfig, view: InnerView) -> LatencyOutcome {
        let _one = one_loop_at_a_time();
        let (client, server) = tcp_pair();
        let stop = AtomicBool::new(false);
        let counters = Counters::default();
        let clock = Clock::start();
        thread::scope(|s| {
            let echo = s.spawn(|| tcp_echo(&server, &stop, &counters));
            let out = tcp_ping_with(
                &client,
                cfg,
                Framing::Sonde,
                view,
                &clock,
                &AtomicBool::new(false),
            );
            client.shutdown(std::net::Shutdown::Both).unwrap();
            echo.join().unwrap().unwrap();
            out.unwrap()
        })
    }

    #[test]
    fn the_full_log_lists_every_udp_message_lost_and_late_ones_marked() {
        for rate in [None, Some(2_000.0)] {
            let (log, sink, view) = logged(false);
            // Every 10th request goes unanswered; every 25th is answered 30 ms late (after
            // the closed loop's reply timeout).
            let echo = |sock: &UdpSocket, stop: &AtomicBool| {
                sock.set_read_timeout(Some(Duration::from_millis(5)))
                    .unwrap();
                let mut buf = [0u8; 2048];
                let mut held: Option<(Vec<u8>, Instant)> = None;
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) && i < 10_000_000 {
                    if let Some((m, at)) = &held {
                        if at.elapsed() > Duration::from_millis(30) {
                            sock.send(m).unwrap();
                            held = None;
                        }
                    }
                    let Ok(n) = sock.recv(&mut buf) else { continue };
                    match i % 50 {
                        9 | 19 | 29 | 39 | 49 => {}
                        24 if held.is_none() => held = Some((buf[..n].to_vec(), Instant::now())),
                        _ => {
                            sock.send(&buf[..n]).unwrap();
                        }
                    }
                    i += 1;
                }
            };
            let out = udp_with(&cfg(64, 400, 20, rate), view, echo);
            let lines = check_log(&out, log, &sink);
            let lost = lines.iter().filter(|l| l.outcome == "lost").count() as u64;
            assert_eq!(lost, out.seq.as_ref().unwrap().lost(out.sent), "{rate:?}");
            assert!(lost >= out.sent / 11, "{lost} of {}", out.sent);
            let late = lines.iter().filter(|l| l.outcome == "late").count();
            if rate.is_none() {
                assert!(late > 0, "held replies come after the reply timeout");
            } else {
                assert_eq!(late, 0, "an open loop waits for no reply");
            }
        }
    }

    #[test]
    fn the_full_log_lists_every_tcp_message() {
        for rate in [None, Some(2_000.0)] {
            let (log, sink, view) = logged(false);
            let out = tcp_with(&cfg(64, 300, 20, rate), view);
            assert!(out.log.is_none() && out.socket.is_none() && out.one_way.is_none());
            let lines = check_log(&out, log, &sink);
            assert!(lines.iter().all(|l| l.outcome == "received"), "{rate:?}");
        }
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn udp_kernel_timestamps_bracket_the_socket_rtt() {
        for rate in [None, Some(3_000.0)] {
            let (log, sink, view) = logged(true);
            let counters = Counters::default();
            let out = udp_with(&cfg(200, 300, 20, rate), view, real_echo(&counters));
            let lines = check_log(&out, log, &sink);
            let s = out.socket.as_ref().expect("asked for");
            assert_eq!((s.rx.is_ok(), s.tx.is_ok()), (true, true), "{s:?}");
            // Loopback stamps every datagram both ways.
            assert_eq!(s.rx_stamped, out.rtt.samples(), "{rate:?}");
            assert_eq!(s.tx_stamped, out.rtt.samples(), "{rate:?}");
            assert_eq!(s.inconsistent, 0);
            assert_eq!(s.socket_rtt.samples(), out.rtt.samples());
            // The kernel turns receive stamping on a moment after the first socket asks: the
            // warm-up may go without.
            for l in lines.iter().filter(|l| l.outcome != "lost" && !l.warmup) {
                assert!(
                    l.socket_rtt_ns.is_some() && l.send_to_socket_rx_ns.is_some(),
                    "{rate:?}: {l:?}"
                );
            }
            // The sockets see less than the application; never more.
            let app = out.rtt.summary();
            let sock = s.socket_rtt.summary();
            assert!(
                sock.min_ns <= app.min_ns && sock.max_ns <= app.max_ns,
                "{sock:?} {app:?}"
            );
            assert_eq!(s.host.samples(), out.rtt.samples());
        }
    }

    /// TCP: transmit stamps keyed by byte offset find their message; the closed loop gets one
    /// for every message, the open loop (which may put two messages in one segment, stamped
    /// for the later) for most; the sockets never see more than the application.
    #[test]
    #[cfg(target_os = "linux")]
    fn tcp_reads_receive_and_transmit_stamps_by_message() {
        for (size, rate) in [(64, None), (3_000, None), (64, Some(2_000.0))] {
            let (log, sink, view) = logged(true);
            let out = tcp_with(&cfg(size, 300, 20, rate), view);
            let lines = check_log(&out, log, &sink);
            let s = out.socket.as_ref().unwrap();
            assert_eq!((s.rx.is_ok(), s.tx.is_ok()), (true, true), "{s:?}");
            assert_eq!(s.rx_stamped, out.rtt.samples(), "{rate:?}");
            assert_eq!(s.inconsistent, 0, "{rate:?}");
            if rate.is_none() {
                assert_eq!(s.tx_stamped, out.rtt.samples(), "{size} {rate:?}");
            } else {
                assert!(s.tx_stamped * 10 >= out.rtt.samples() * 9, "{s:?}");
            }
            assert_eq!(s.socket_rtt.samples(), s.tx_stamped);
            let app = out.rtt.summary();
            let sock = s.socket_rtt.summary();
            assert!(
                sock.min_ns <= app.min_ns && sock.max_ns <= app.max_ns,
                "{sock:?} {app:?}"
            );
            for l in &lines {
                if let (Some(app), Some(sock)) = (l.rtt_ns, l.socket_rtt_ns) {
                    assert!(sock <= app, "{l:?}");
                }
            }
        }
    }

    #[test]
    fn tcp_stamp_keys_name_the_message_of_their_last_byte() {
        let k = Keying::Bytes(100);
        // Message 0 is bytes 0..=99, message 4 bytes 400..=499.
        assert_eq!(k.seq(99, 0), Some(0));
        assert_eq!(k.seq(499, 7), Some(4));
        // A write that ended inside a message (it was written in parts) names none.
        assert_eq!(k.seq(450, 7), None);
        // Past 2^32 bytes the key wraps; the newest message places it.
        let newest = (1u64 << 32) / 100 + 5;
        let last = (newest + 1) * 100 - 1;
        assert_eq!(k.seq((last & 0xffff_ffff) as u32, newest), Some(newest));
        let earlier = last - 300;
        assert_eq!(
            k.seq((earlier & 0xffff_ffff) as u32, newest),
            Some(newest - 3)
        );
        assert_eq!(Keying::Datagram.seq(5, 7), Some(5));
    }

    /// A one-way view whose model says what the host clock says: the echo runs in this
    /// process, so the offset is 0.
    fn one_way_view(
        clock: &Clock,
    ) -> (
        InnerView,
        std::sync::mpsc::Receiver<sonde_engine::offset::Exchange>,
    ) {
        let (model_tx, models) = std::sync::mpsc::sync_channel(4);
        let (probes, probe_rx) = std::sync::mpsc::sync_channel(64);
        model_tx
            .send(sonde_engine::oneway::LinearOffset {
                at_ns: 0,
                offset_ns: 0,
                drift: 0.0,
            })
            .unwrap();
        let view = InnerView {
            log: None,
            timestamps: false,
            cpu: None,
            one_way: Some(OneWayLink {
                models,
                probes,
                host_minus_test_ns: host_clock_ns() - clock.now_ns(),
            }),
        };
        (view, probe_rx)
    }

    /// Forward + return + the agent's hold is the RTT (to the histograms' precision), and on
    /// one host both directions are positive and below the RTT.
    fn check_one_way(out: &LatencyOutcome) {
        let ow = out.one_way.as_ref().expect("asked for");
        assert_eq!(ow.unstamped, 0);
        assert_eq!(ow.recorder.samples(), out.rtt.samples());
        let (f, b) = (
            ow.recorder.forward().summary(),
            ow.recorder.backward().summary(),
        );
        let hold = ow.recorder.hold().summary();
        let rtt = out.rtt.summary();
        let sum = f.mean_ns + b.mean_ns + hold.mean_ns;
        assert!(
            (sum - rtt.mean_ns).abs() <= rtt.mean_ns * 0.003 + 10.0,
            "{sum} vs {}",
            rtt.mean_ns
        );
        // The conversion is exact here (offset 0, one clock): a one-way delay is never
        // negative, and never above the whole round trip (3 significant digits aside).
        assert!(f.min_ns >= 0 && b.min_ns >= 0, "{f:?} {b:?}");
        assert!(
            f.max_ns as f64 <= rtt.max_ns as f64 * 1.001
                && b.max_ns as f64 <= rtt.max_ns as f64 * 1.001
        );
    }

    #[test]
    fn udp_echo_stamps_one_way_requests() {
        for rate in [None, Some(2_000.0)] {
            let clock = Clock::start();
            let (view, probes) = one_way_view(&clock);
            let counters = Counters::default();
            let (client, server) = udp_pair();
            let stop = AtomicBool::new(false);
            let out = thread::scope(|s| {
                let peer = s.spawn(|| udp_echo(&server, &stop, &counters));
                let out = udp_ping_with(
                    &client,
                    &cfg(64, 300, 20, rate),
                    Framing::Sonde,
                    view,
                    &clock,
                    &AtomicBool::new(false),
                );
                stop.store(true, Ordering::Relaxed);
                peer.join().unwrap().unwrap();
                out.unwrap()
            });
            check_one_way(&out);
            assert_eq!(out.seq.as_ref().unwrap().lost(out.sent), 0);
            // The best probe exchange of the run went to the clock sync.
            let offered: Vec<_> = probes.try_iter().collect();
            assert!(!offered.is_empty());
            assert_eq!(
                out.one_way.as_ref().unwrap().probes_offered,
                offered.len() as u64
            );
        }
    }

    #[test]
    fn tcp_echo_stamps_one_way_requests_message_by_message() {
        // Sizes around the echo's read buffer, so replies straddle reads.
        for (size, rate) in [
            (24, None),
            (100, Some(3_000.0)),
            (40_000, None),
            (65_536, Some(500.0)),
        ] {
            let clock = Clock::start();
            let (view, _probes) = one_way_view(&clock);
            let (client, server) = tcp_pair();
            let stop = AtomicBool::new(false);
            let counters = Counters::default();
            let out = thread::scope(|s| {
                let echo = s.spawn(|| tcp_echo(&server, &stop, &counters));
                let out = tcp_ping_with(
                    &client,
                    &cfg(size, 300, 20, rate),
                    Framing::Sonde,
                    view,
                    &clock,
                    &AtomicBool::new(false),
                );
                client.shutdown(std::net::Shutdown::Both).unwrap();
                echo.join().unwrap().unwrap();
                out.unwrap()
            });
            assert_sane(&out);
            check_one_way(&out);
            assert_eq!(
                counters.load(),
                (out.sent * u64::from(size), out.sent),
                "{size}"
            );
        }
    }

    #[test]
    fn tcp_echo_still_echoes_bytes_that_only_start_like_a_request() {
        let (client, server) = tcp_pair();
        let stop = AtomicBool::new(false);
        let counters = Counters::default();
        thread::scope(|s| {
            let echo = s.spawn(|| tcp_echo(&server, &stop, &counters));
            let mut c = &client;
            c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            // "S" alone waits for 8 bytes; "SNDX..." is not a request: echoed as it came.
            c.write_all(b"S").unwrap();
            c.write_all(b"NDX1234-and-more").unwrap();
            let mut got = [0u8; 17];
            c.read_exact(&mut got).unwrap();
            assert_eq!(&got, b"SNDX1234-and-more");
            client.shutdown(std::net::Shutdown::Both).unwrap();
            echo.join().unwrap().unwrap();
        });
    }

    #[test]
    fn one_way_needs_room_for_the_stamps_and_sonde_framing() {
        let clock = Clock::start();
        let (client, _server) = udp_pair();
        let (tcp, _peer) = tcp_pair();
        let stop = AtomicBool::new(false);
        let err = udp_ping_with(
            &client,
            &cfg(23, 100, 0, None),
            Framing::Sonde,
            one_way_view(&clock).0,
            &clock,
            &stop,
        )
        .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        assert!(err.to_string().contains("at least 24 bytes"), "{err}");
        let err = tcp_ping_with(
            &tcp,
            &cfg(64, 100, 0, None),
            Framing::Sockperf,
            one_way_view(&clock).0,
            &clock,
            &stop,
        )
        .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn an_echo_that_does_not_stamp_is_counted() {
        // A plain echo (an older agent) sends the request back unstamped.
        let clock = Clock::start();
        let (view, _probes) = one_way_view(&clock);
        let out = {
            let (client, server) = udp_pair();
            let stop = AtomicBool::new(false);
            thread::scope(|s| {
                let peer = s.spawn(|| scripted_echo(|_| 1)(&server, &stop));
                let out = udp_ping_with(
                    &client,
                    &cfg(64, 200, 20, None),
                    Framing::Sonde,
                    view,
                    &clock,
                    &AtomicBool::new(false),
                );
                stop.store(true, Ordering::Relaxed);
                peer.join().unwrap();
                out.unwrap()
            })
        };
        let ow = out.one_way.unwrap();
        assert_eq!(ow.unstamped, out.rtt.samples());
        assert_eq!(ow.recorder.samples(), 0);
        assert_eq!(
            out.seq.unwrap().lost(out.sent),
            0,
            "replies still count for the RTT"
        );
    }
}
