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
//! and deadlines) rather than spinning on a non-blocking socket. Measured on loopback (2 cores,
//! release build, 64-byte UDP closed loop against [`udp_echo`] in another process, 5 s runs),
//! blocking gave a median of 10.5 to 11.6 µs and a p99 of 16 to 32 µs; busy-polling the same
//! loop gave 11.1 to 17.9 µs and 40 to 89 µs: a lower minimum (6 µs) but a spinning client
//! competes for the core the echo (or the open-loop sender) needs. `sockperf ping-pong
//! --full-rtt` against `sockperf sr` in the same runs: median 11.1 to 13.3 µs.
//!
//! The loops set the socket's read (and, for TCP, write) timeouts and restore the previous ones
//! when they return.

use std::io::{self, Read, Write};
use std::net::{TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::Duration;

use sonde_engine::pace::Schedule;
use sonde_engine::rtt::RttRecorder;
use sonde_engine::seq::{Arrival, SeqTracker};
use sonde_wire::{read_latency_seq, widen_seq, write_latency_seq, UdpJoin, UDP_JOIN_LEN};

use crate::{Clock, Counters};

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
/// Send times of the last this many UDP closed-loop messages are kept for late replies.
const SEND_RING: usize = 65_536;
/// The UDP closed loop re-reads the median for its reply timeout this often (and at every power
/// of two before that): a percentile query walks the histogram.
const TIMEOUT_REFRESH: u64 = 1024;

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
}

/// Agent side: echoes every byte back until EOF or `stop`.
///
/// # Errors
/// A failed read or write (a reset connection included); the loop ends there.
pub fn tcp_echo(stream: &TcpStream, stop: &AtomicBool, counters: &Counters) -> io::Result<()> {
    let _restore = Timeouts::save_tcp(stream)?;
    stream.set_read_timeout(Some(ECHO_POLL))?;
    stream.set_write_timeout(Some(ECHO_POLL))?;
    let mut buf = vec![0u8; TCP_ECHO_BUF];
    let mut s = stream;
    while !stop.load(Ordering::Relaxed) {
        let n = match s.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if is_retry(&e) => continue,
            Err(e) => return Err(e),
        };
        // Written by hand rather than `write_all` so that a peer that stopped reading cannot
        // hold the echo past `stop`.
        let mut off = 0;
        while off < n {
            match s.write(&buf[off..n]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(k) => off += k,
                Err(e) if is_retry(&e) => {
                    if stop.load(Ordering::Relaxed) {
                        return Ok(());
                    }
                }
                Err(e) => return Err(e),
            }
        }
        counters.add(n as u64, 1);
    }
    Ok(())
}

/// Agent side: echoes every datagram back on a connected flow socket until `stop`; answers join
/// requests with acknowledgements (not counted).
///
/// # Errors
/// A failed `recv` or `send`, except the transient ones: a timeout, a full send buffer, and
/// `ECONNREFUSED` (an ICMP error about an earlier echo), which are skipped.
pub fn udp_echo(sock: &UdpSocket, stop: &AtomicBool, counters: &Counters) -> io::Result<()> {
    let _restore = Timeouts::save_udp(sock)?;
    sock.set_read_timeout(Some(ECHO_POLL))?;
    let mut buf = vec![0u8; UDP_RECV_BUF];
    while !stop.load(Ordering::Relaxed) {
        let n = match sock.recv(&mut buf) {
            Ok(n) => n,
            // The client's port is closed (an ICMP error for an earlier echo): it may be gone
            // or about to rejoin; the agent's session decides, through `stop`.
            Err(e) if is_retry(&e) || e.kind() == io::ErrorKind::ConnectionRefused => continue,
            Err(e) => return Err(e),
        };
        let datagram = &buf[..n];
        if n == UDP_JOIN_LEN {
            if let Ok(join) = UdpJoin::decode(datagram) {
                // A repeated join: the client has not seen our first ack yet. A stray ack (never
                // sent to an agent) is dropped.
                if !join.ack {
                    send_transient_ok(sock, &UdpJoin { ack: true, ..join }.encode())?;
                }
                continue;
            }
        }
        send_transient_ok(sock, datagram)?;
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
    let msg = check_size(cfg.msg_size, TCP_MAX_MSG, "TCP")?;
    let rate = check_rate(cfg.rate)?;
    let _restore = Timeouts::save_tcp(stream)?;
    stream.set_read_timeout(Some(TCP_POLL))?;
    stream.set_write_timeout(Some(TCP_REPLY_TIMEOUT))?;
    match rate {
        None => tcp_closed(stream, msg, cfg, clock, stop),
        Some(rate) => tcp_open(stream, msg, rate, cfg, clock, stop),
    }
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
    let msg = check_size(cfg.msg_size, UDP_MAX_MSG, "UDP")?;
    let rate = check_rate(cfg.rate)?;
    let _restore = Timeouts::save_udp(sock)?;
    sock.set_read_timeout(Some(UDP_POLL))?;
    match rate {
        None => udp_closed(sock, msg, cfg, clock, stop),
        Some(rate) => udp_open(sock, msg, rate, cfg, clock, stop),
    }
}

// ---------------------------------------------------------------------------------------------
// TCP client

fn tcp_closed(
    stream: &TcpStream,
    msg: usize,
    cfg: &PingConfig,
    clock: &Clock,
    stop: &AtomicBool,
) -> io::Result<LatencyOutcome> {
    let out = vec![0u8; msg];
    let mut reply = vec![0u8; msg];
    let mut rtt = RttRecorder::new(cfg.warmup_ns);
    let mut sent = 0;
    let mut measured = 0;
    let mut s = stream;
    while !stop.load(Ordering::Relaxed) {
        let t0 = clock.now_ns();
        if t0 >= cfg.until_ns || cfg.counted_out(measured) {
            break;
        }
        s.write_all(&out).map_err(tcp_write_error)?;
        sent += 1;
        measured += u64::from(t0 >= cfg.warmup_ns);
        let deadline = t0.saturating_add(duration_ns(TCP_REPLY_TIMEOUT));
        if !tcp_read_reply(stream, &mut reply, clock, stop, deadline)? {
            break;
        }
        let t1 = clock.now_ns();
        rtt.record(t0, t1.saturating_sub(t0));
    }
    Ok(LatencyOutcome {
        rtt,
        sent,
        seq: None,
        late_sends: 0,
        timeouts: 0,
    })
}

/// Reads exactly `buf.len()` bytes. `Ok(false)` when `stop` was raised first.
fn tcp_read_reply(
    stream: &TcpStream,
    buf: &mut [u8],
    clock: &Clock,
    stop: &AtomicBool,
    deadline_ns: u64,
) -> io::Result<bool> {
    let mut s = stream;
    let mut got = 0;
    while got < buf.len() {
        match s.read(&mut buf[got..]) {
            Ok(0) => return Err(peer_closed()),
            Ok(n) => got += n,
            Err(e) if is_retry(&e) => {
                if stop.load(Ordering::Relaxed) {
                    return Ok(false);
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
    Ok(true)
}

fn tcp_open(
    stream: &TcpStream,
    msg: usize,
    rate: f64,
    cfg: &PingConfig,
    clock: &Clock,
    stop: &AtomicBool,
) -> io::Result<LatencyOutcome> {
    let plan = OpenLoop::new(rate, clock.now_ns(), cfg.until_ns);
    let progress = Progress::default();
    let rtt = thread::scope(|scope| {
        let sender = scope.spawn(|| {
            let out = vec![0u8; msg];
            let mut s = stream;
            paced_sender(&plan, clock, stop, &progress, |_| {
                s.write_all(&out).map_err(tcp_write_error)
            })
        });
        let received = tcp_open_reader(stream, msg, &plan, clock, stop, &progress, cfg.warmup_ns);
        if received.is_err() {
            progress.abort.store(true, Ordering::Relaxed);
        }
        let sent = join(sender);
        // The sender's error explains a reader's error (a reset seen on both sides), not the
        // other way round.
        sent.and(received)
    })?;
    Ok(LatencyOutcome {
        rtt,
        sent: progress.sent(),
        seq: None,
        late_sends: progress.late.load(Ordering::Relaxed),
        timeouts: 0,
    })
}

/// Reads replies in order: reply `k` answers message `k`. TCP may split or coalesce them, so
/// complete `msg`-sized units are counted, and every message completed by one `read` gets that
/// read's timestamp.
fn tcp_open_reader(
    stream: &TcpStream,
    msg: usize,
    plan: &OpenLoop,
    clock: &Clock,
    stop: &AtomicBool,
    progress: &Progress,
    warmup_ns: u64,
) -> io::Result<RttRecorder> {
    let mut rtt = RttRecorder::new(warmup_ns);
    let mut buf = vec![0u8; TCP_ECHO_BUF.max(msg)];
    let mut s = stream;
    let mut received = 0u64;
    // Bytes of the reply currently being assembled.
    let mut partial = 0usize;
    let mut sender_done_at = None;
    let drain_ns = duration_ns(TCP_OPEN_LOOP_DRAIN);
    loop {
        if stop.load(Ordering::Relaxed) || progress.abort.load(Ordering::Relaxed) {
            return Ok(rtt);
        }
        if let Some(done_at) = progress.done_at(&mut sender_done_at, clock) {
            // TCP cannot lose a reply; a peer that stops echoing is given the drain time.
            if received >= progress.sent() || clock.now_ns() >= done_at.saturating_add(drain_ns) {
                return Ok(rtt);
            }
        }
        let n = match s.read(&mut buf) {
            Ok(0) => {
                if progress.done.load(Ordering::Acquire) && received >= progress.sent() {
                    return Ok(rtt);
                }
                return Err(peer_closed());
            }
            Ok(n) => n,
            Err(e) if is_retry(&e) => continue,
            Err(e) => return Err(e),
        };
        let t = clock.now_ns();
        let total = partial + n;
        partial = total % msg;
        // Only a message already due can have been answered; more is a misbehaving peer.
        let completed = ((total / msg) as u64).min(plan.due_by(t).saturating_sub(received));
        for k in received..received + completed {
            let due = plan.due(k);
            rtt.record(due, t.saturating_sub(due));
        }
        received += completed;
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

/// The UDP closed loop's state: everything preallocated before the first send.
struct ClosedUdp<'a> {
    sock: &'a UdpSocket,
    msg: usize,
    out: Vec<u8>,
    inbuf: Vec<u8>,
    sent_at: Vec<SentAt>,
    /// Messages sent so far; the next seq.
    sent: u64,
    rtt: RttRecorder,
    tracker: SeqTracker,
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
            match self.sock.recv(&mut self.inbuf) {
                Ok(n) => {
                    let t = clock.now_ns();
                    let expected = self.sent.saturating_sub(1);
                    if let Some(seq) = reply_seq(&self.inbuf[..n], self.msg, expected) {
                        // A seq never sent is junk, or a truncated seq widened the wrong way.
                        if seq < self.sent {
                            if self.tracker.on_packet(seq) != Arrival::Duplicate {
                                let at = self.sent_at[ring_slot(seq)];
                                if at.seq == seq {
                                    self.rtt.record(at.ns, t.saturating_sub(at.ns));
                                }
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
}

fn udp_closed(
    sock: &UdpSocket,
    msg: usize,
    cfg: &PingConfig,
    clock: &Clock,
    stop: &AtomicBool,
) -> io::Result<LatencyOutcome> {
    let mut st = ClosedUdp {
        sock,
        msg,
        out: vec![0u8; msg],
        inbuf: vec![0u8; UDP_RECV_BUF],
        sent_at: vec![
            SentAt {
                seq: u64::MAX,
                ns: 0
            };
            SEND_RING
        ],
        sent: 0,
        rtt: RttRecorder::new(cfg.warmup_ns),
        tracker: SeqTracker::new(),
    };
    let mut timeouts = 0;
    let mut reply_timeout_ns = udp_reply_timeout_ns(&st.rtt);
    let mut stopped = false;
    let mut measured = 0;
    while !stop.load(Ordering::Relaxed) {
        let seq = st.sent;
        if seq % TIMEOUT_REFRESH == 0 || seq.is_power_of_two() {
            reply_timeout_ns = udp_reply_timeout_ns(&st.rtt);
            sock.set_read_timeout(Some(udp_poll_for(reply_timeout_ns)))?;
        }
        write_latency_seq(seq, &mut st.out);
        let t0 = clock.now_ns();
        if t0 >= cfg.until_ns || cfg.counted_out(measured) {
            break;
        }
        send_transient_ok(sock, &st.out).map_err(udp_error)?;
        st.sent_at[ring_slot(seq)] = SentAt { seq, ns: t0 };
        st.sent += 1;
        measured += u64::from(t0 >= cfg.warmup_ns);
        match st.collect(clock, stop, t0.saturating_add(reply_timeout_ns), Some(seq))? {
            Wait::Answered => {}
            Wait::TimedOut => timeouts += 1,
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
    Ok(LatencyOutcome {
        rtt: st.rtt,
        sent: st.sent,
        seq: Some(st.tracker),
        late_sends: 0,
        timeouts,
    })
}

fn udp_open(
    sock: &UdpSocket,
    msg: usize,
    rate: f64,
    cfg: &PingConfig,
    clock: &Clock,
    stop: &AtomicBool,
) -> io::Result<LatencyOutcome> {
    let plan = OpenLoop::new(rate, clock.now_ns(), cfg.until_ns);
    let progress = Progress::default();
    let (rtt, tracker) = thread::scope(|scope| {
        let sender = scope.spawn(|| {
            let mut out = vec![0u8; msg];
            paced_sender(&plan, clock, stop, &progress, |seq| {
                write_latency_seq(seq, &mut out);
                send_transient_ok(sock, &out).map_err(udp_error)
            })
        });
        let received = udp_open_reader(sock, msg, &plan, clock, stop, &progress, cfg.warmup_ns);
        if received.is_err() {
            progress.abort.store(true, Ordering::Relaxed);
        }
        join(sender).and(received)
    })?;
    Ok(LatencyOutcome {
        rtt,
        sent: progress.sent(),
        seq: Some(tracker),
        late_sends: progress.late.load(Ordering::Relaxed),
        timeouts: 0,
    })
}

/// Receives replies until every message sent is answered after the sender ended, the drain
/// timeout passes, or `stop`. Only first arrivals are recorded.
fn udp_open_reader(
    sock: &UdpSocket,
    msg: usize,
    plan: &OpenLoop,
    clock: &Clock,
    stop: &AtomicBool,
    progress: &Progress,
    warmup_ns: u64,
) -> io::Result<(RttRecorder, SeqTracker)> {
    let mut rtt = RttRecorder::new(warmup_ns);
    let mut tracker = SeqTracker::new();
    let mut buf = vec![0u8; UDP_RECV_BUF];
    let mut sender_done_at = None;
    let mut drain_ns = 0;
    loop {
        if stop.load(Ordering::Relaxed) || progress.abort.load(Ordering::Relaxed) {
            return Ok((rtt, tracker));
        }
        if let Some(done_at) = progress.done_at(&mut sender_done_at, clock) {
            if drain_ns == 0 {
                drain_ns = udp_reply_timeout_ns(&rtt);
            }
            if tracker.received() >= progress.sent()
                || clock.now_ns() >= done_at.saturating_add(drain_ns)
            {
                return Ok((rtt, tracker));
            }
        }
        let n = match sock.recv(&mut buf) {
            Ok(n) => n,
            Err(e) if is_retry(&e) => continue,
            Err(e) => return Err(udp_error(e)),
        };
        let t = clock.now_ns();
        let expected = tracker.highest().map_or(0, |h| h.saturating_add(1));
        let Some(seq) = reply_seq(&buf[..n], msg, expected) else {
            continue;
        };
        // Only a message already due can have been sent (and answered).
        if seq >= plan.due_by(t) {
            continue;
        }
        if tracker.on_packet(seq) != Arrival::Duplicate {
            let due = plan.due(seq);
            rtt.record(due, t.saturating_sub(due));
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
                || e.raw_os_error() == Some(libc::ENOBUFS) =>
        {
            Ok(())
        }
        Err(e) => Err(e),
    }
}

fn udp_error(e: io::Error) -> io::Error {
    if e.kind() == io::ErrorKind::ConnectionRefused {
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

fn check_size(msg_size: u32, max: u32, proto: &str) -> io::Result<usize> {
    if (1..=max).contains(&msg_size) {
        Ok(msg_size as usize)
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{proto} latency message size must be 1 to {max} bytes, not {msg_size}"),
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
        let (client, server) = udp_pair();
        let stop = AtomicBool::new(false);
        let clock = Clock::start();
        thread::scope(|s| {
            let peer = s.spawn(|| echo(&server, &stop));
            let out = udp_ping(&client, cfg, &clock, &AtomicBool::new(false)).unwrap();
            let took = clock.origin().elapsed();
            stop.store(true, Ordering::Relaxed);
            peer.join().unwrap();
            (out, took)
        })
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

    fn assert_sane(out: &LatencyOutcome) {
        let sum = out.rtt.summary();
        assert!(sum.samples > 0, "{out:?}");
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
        assert!((595..=605).contains(&out.sent), "{out:?}");
        assert_eq!(out.rtt.samples(), out.sent - out.rtt.warmup_excluded());
        assert!((95..=105).contains(&out.rtt.warmup_excluded()), "{out:?}");
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
        assert!((195..=205).contains(&out.sent), "{out:?}");
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
            assert_eq!(seq.lost(out.sent), 0, "{out:?}");
            assert_eq!(seq.received(), out.sent);
            assert_eq!(seq.duplicated(), 0);
            assert_eq!(out.timeouts, 0);
            assert_eq!(out.sent, out.rtt.samples() + out.rtt.warmup_excluded());
            assert_eq!(counters.load(), (out.sent * u64::from(size), out.sent));
            if size == 1 {
                // One byte carries seq mod 256: widening got every seq right.
                assert!(out.sent > 256, "{out:?}");
            }
        }
    }

    #[test]
    fn udp_closed_loop_counts_loss_and_moves_on() {
        let cfg = cfg(64, 500, 0, None);
        let (out, took) = udp_run(&cfg, scripted_echo(|i| u32::from(i % 10 != 9)));
        let seq = out.seq.as_ref().unwrap();
        let lost = seq.lost(out.sent);
        assert!(out.sent >= 20, "{out:?}");
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
    fn udp_duplicates_are_counted_not_recorded_twice() {
        let (out, _) = udp_run(
            &cfg(64, 150, 0, None),
            scripted_echo(|i| 1 + u32::from(i == 5)),
        );
        let seq = out.seq.as_ref().unwrap();
        assert_eq!(seq.duplicated(), 1);
        assert_eq!(seq.received(), out.sent);
        assert_eq!(out.rtt.samples(), out.sent);
        assert_eq!(out.timeouts, 0);
    }

    #[test]
    fn udp_ping_ignores_stray_join_acks_of_the_same_length() {
        // 16-byte messages are as long as a join ack; the peer sends an ack before each reply.
        let ack = UdpJoin {
            ack: true,
            flow: 0,
            token: Token(7),
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
        let (out, _) = udp_run(&cfg(64, 300, 0, Some(5000.0)), real_echo(&counters));
        assert_sane(&out);
        assert!((1495..=1505).contains(&out.sent), "{out:?}");
        let seq = out.seq.as_ref().unwrap();
        assert_eq!(seq.lost(out.sent), 0, "{out:?}");
        assert_eq!(out.rtt.samples(), out.sent);
        assert_eq!(out.timeouts, 0);
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

    #[test]
    fn reply_seq_skips_acks_and_wrong_sizes() {
        let ack = UdpJoin {
            ack: true,
            flow: 1,
            token: Token(2),
        }
        .encode();
        assert_eq!(reply_seq(&ack, 16, 0), None);
        let mut msg = [0u8; 16];
        write_latency_seq((1 << 62) - 1, &mut msg);
        assert_eq!(reply_seq(&msg, 16, 0), Some((1 << 62) - 1));
        assert_eq!(reply_seq(&msg[..8], 16, 0), None);
        assert_eq!(reply_seq(&[0x05], 1, 0x1_00), Some(0x1_05));
    }
}
