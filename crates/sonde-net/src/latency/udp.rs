//! The UDP loops: datagrams, so a reply carries the seq of the message it answers; a reply
//! may be lost (counted after a timeout), duplicated or late. The echo sends each datagram
//! back and answers joins.

use std::io;
use std::net::UdpSocket;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use sonde_engine::rtt::RttRecorder;
use sonde_engine::seq::{Arrival, SeqTracker};
use sonde_wire::sockperf;
use sonde_wire::stamps;
use sonde_wire::{UdpJoin, UDP_JOIN_LEN};

use super::framing::{udp_reply_seq, Framing};
use super::inner::{Recorder, ReplyAt, Stamps};
use super::open::{OpenLoop, OpenReader};
use super::transport::{
    ClosedWait, EchoState, InFlight, Received, ReplyReader, Run, Sink, Transport, Wait,
};
use super::txstamp::Keying;
use super::{
    count_call, duration_ns, host_clock_ns, ring_slot, NoReply, Timeouts, ECHO_POLL, SEND_RING,
    SOCKPERF_NO_REPLY, TIMEOUT_REFRESH, UDP_FIRST_REPLY_TIMEOUT, UDP_MAX_MSG,
    UDP_MIN_REPLY_TIMEOUT, UDP_POLL, UDP_RECV_BUF,
};
use crate::{fault, sys, Clock, Counters};

impl Transport for UdpSocket {
    const NAME: &'static str = "UDP";
    const MAX_MSG: u32 = UDP_MAX_MSG;
    const SOCKPERF_MAX_MSG: u32 = sockperf::MAX_UDP_MSG;
    type Closed = UdpClosed;
    type Reader = UdpReader;
    type Echo = UdpEcho;

    /// By datagram.
    fn keying(_msg: usize) -> Keying {
        Keying::Datagram
    }

    fn loop_timeouts(&self) -> io::Result<Timeouts<'_>> {
        let restore = Timeouts::save_udp(self)?;
        self.set_read_timeout(Some(UDP_POLL))?;
        Ok(restore)
    }

    fn sock_ref(&self) -> sys::SockRef<'_> {
        sys::sock_ref(self)
    }

    fn enable_timestamps(&self, tx: bool) -> io::Result<()> {
        sys::udp_enable_timestamps(self, tx)
    }

    fn prepare(framing: Framing, _one_way: bool, _msg_size: u32, out: &mut [u8]) {
        framing.prepare(out);
    }

    /// Every datagram carries its seq: in the one-way request's layout, or the framing's.
    fn number(framing: Framing, one_way: bool, seq: u64, out: &mut [u8]) {
        if one_way {
            stamps::write_udp_request(seq, out);
        } else {
            framing.stamp(seq, out);
        }
    }

    fn send_message(&self, msg: &[u8]) -> io::Result<()> {
        send_transient_ok(self, msg).map_err(udp_error)
    }
}

/// Send time of one closed-loop message, tagged with its seq so that a slot reused by a later
/// message is not mistaken for it.
#[derive(Debug, Clone, Copy)]
pub(super) struct SentAt {
    seq: u64,
    ns: u64,
    /// `--timestamps`: the wall clock just before the send (0: not read).
    real_ns: u64,
    /// Its reply has come (for the full log's lost messages).
    answered: bool,
}

/// Receives one datagram (counted), with its kernel receive timestamp when `stamped`.
fn udp_recv(sock: &UdpSocket, buf: &mut [u8], stamped: bool) -> io::Result<(usize, Option<u64>)> {
    count_call();
    recv(sock, buf, stamped)
}

/// Receives one datagram, with its kernel receive timestamp when `stamped`.
fn recv(sock: &UdpSocket, buf: &mut [u8], stamped: bool) -> io::Result<(usize, Option<u64>)> {
    if stamped {
        sys::udp_recv_stamped(sock, buf)
    } else {
        sock.recv(buf).map(|n| (n, None))
    }
}

/// The UDP closed loop's state: everything preallocated before the first send.
pub(super) struct UdpClosed {
    msg: usize,
    framing: Framing,
    one_way: bool,
    stamped: bool,
    log_lost: bool,
    inbuf: Vec<u8>,
    sent_at: Vec<SentAt>,
    /// Messages sent so far; the next seq.
    sent: u64,
    first_send_ns: Option<u64>,
    /// Every RTT, warm-up included: the reply timeout's median. (From the run's RTTs alone,
    /// every reply lost during the warm-up cost the 1 s first-reply timeout.)
    all: RttRecorder,
    reply_timeout_ns: u64,
    timeouts: u64,
    tracker: SeqTracker,
}

impl UdpClosed {
    /// Receives replies until the reply to `want` arrives (`None`: until every message sent has
    /// been answered), the deadline passes, or `stop`. Replies to earlier messages that arrive
    /// meanwhile are recorded against their own send times.
    fn collect(
        &mut self,
        sock: &UdpSocket,
        run: Run<'_>,
        deadline_ns: u64,
        want: Option<u64>,
        sink: &mut Sink<'_, '_>,
    ) -> io::Result<Wait> {
        let (clock, stop) = (run.clock, run.stop);
        loop {
            if want.is_none() && self.tracker.received() >= self.sent {
                return Ok(Wait::Answered);
            }
            match udp_recv(sock, &mut self.inbuf, self.stamped) {
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
                                self.answer(seq, t, rx_ns, agent, sink);
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
                Err(e) if fault::again(&e) => {
                    if stop.load(std::sync::atomic::Ordering::Relaxed) {
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
    fn answer(
        &mut self,
        seq: u64,
        t: u64,
        rx_ns: Option<u64>,
        agent: Option<(u64, u64)>,
        sink: &mut Sink<'_, '_>,
    ) {
        let slot = ring_slot(seq);
        let at = self.sent_at[slot];
        if at.seq != seq {
            return;
        }
        self.sent_at[slot].answered = true;
        self.all.record(at.ns, t.saturating_sub(at.ns));
        sink.reply(
            self.sent.saturating_sub(1),
            ReplyAt {
                seq,
                send_ns: at.ns,
                receive_ns: t,
                // Not the message in flight: the loop gave up on it and moved on.
                late: seq + 1 < self.sent,
                stamps: Stamps {
                    rx_ns,
                    tx_ns: None,
                    send_real_ns: (at.real_ns != 0).then_some(at.real_ns),
                    agent,
                },
            },
        );
    }

    /// For the full log: message `seq`'s slot is about to be reused, or the run is over; if it
    /// was never answered, it is lost.
    fn settle(&self, seq: u64, rec: &mut Recorder) {
        let at = self.sent_at[ring_slot(seq)];
        if at.seq == seq && !at.answered {
            rec.lost(seq, at.ns);
        }
    }
}

impl ClosedWait<UdpSocket> for UdpClosed {
    fn new(msg: usize, framing: Framing, rec: &Recorder) -> Self {
        let all = RttRecorder::new(0);
        Self {
            msg,
            framing,
            one_way: rec.one_way(),
            stamped: rec.reading_rx(),
            log_lost: rec.wants_lost(),
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
            sent: 0,
            first_send_ns: None,
            reply_timeout_ns: udp_reply_timeout_ns(&all),
            all,
            timeouts: 0,
            tracker: SeqTracker::new(),
        }
    }

    /// The reply timeout follows the median RTT: re-read every [`TIMEOUT_REFRESH`] messages
    /// (and at every power of two before that), since a percentile query walks the histogram.
    fn next_message(&mut self, sock: &UdpSocket, seq: u64) -> io::Result<()> {
        if seq.is_multiple_of(TIMEOUT_REFRESH) || seq.is_power_of_two() {
            self.reply_timeout_ns = udp_reply_timeout_ns(&self.all);
            sock.set_read_timeout(Some(udp_poll_for(self.reply_timeout_ns)))?;
        }
        Ok(())
    }

    fn before_send(&mut self, seq: u64, rec: &mut Recorder) {
        if self.log_lost && seq >= SEND_RING as u64 {
            self.settle(seq - SEND_RING as u64, rec);
        }
    }

    fn send(
        &mut self,
        sock: &UdpSocket,
        out: &[u8],
        m: InFlight,
        _clock: &Clock,
    ) -> io::Result<()> {
        send_transient_ok(sock, out).map_err(udp_error)?;
        self.sent_at[ring_slot(m.seq)] = SentAt {
            seq: m.seq,
            ns: m.t0,
            real_ns: m.send_real_ns.unwrap_or(0),
            answered: false,
        };
        self.sent = m.seq + 1;
        self.first_send_ns.get_or_insert(m.t0);
        Ok(())
    }

    /// Takes replies until message `seq`'s, or its reply timeout (then the loop moves on; a
    /// sockperf peer that has answered nothing for [`SOCKPERF_NO_REPLY`] ends the run).
    fn wait(
        &mut self,
        sock: &UdpSocket,
        m: InFlight,
        run: Run<'_>,
        sink: &mut Sink<'_, '_>,
    ) -> io::Result<Wait> {
        let deadline = m.t0.saturating_add(self.reply_timeout_ns);
        let wait = self.collect(sock, run, deadline, Some(m.seq), sink)?;
        if wait == Wait::TimedOut {
            self.timeouts += 1;
            let clock = run.clock;
            let first = self.first_send_ns.unwrap_or(m.t0);
            if self.framing == Framing::Sockperf
                && self.tracker.received() == 0
                && clock.now_ns().saturating_sub(first) >= duration_ns(SOCKPERF_NO_REPLY)
            {
                return Err(NoReply::TimedOut(SOCKPERF_NO_REPLY).into_io());
            }
        }
        Ok(wait)
    }

    /// Unless stopped, drains late replies for one more reply timeout; then (full log) the
    /// messages still unanswered are lost.
    fn end(
        mut self,
        sock: &UdpSocket,
        stopped: bool,
        run: Run<'_>,
        sink: &mut Sink<'_, '_>,
    ) -> io::Result<(Option<SeqTracker>, u64)> {
        if !stopped {
            let deadline = run.clock.now_ns().saturating_add(self.reply_timeout_ns);
            self.collect(sock, run, deadline, None, sink)?;
        }
        if self.log_lost {
            for seq in self.sent.saturating_sub(SEND_RING as u64)..self.sent {
                self.settle(seq, sink.rec);
            }
        }
        Ok((Some(self.tracker), self.timeouts))
    }
}

/// For the full log, in an open loop: which messages have been answered, by ring slot, and
/// how far the loop has settled (every message below `swept` is answered or logged lost).
pub(super) struct Answered {
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

/// The open loop's reader: each datagram is matched to its message by seq; only first
/// arrivals are recorded.
pub(super) struct UdpReader {
    buf: Vec<u8>,
    msg: usize,
    framing: Framing,
    one_way: bool,
    tracker: SeqTracker,
    answered: Answered,
}

impl ReplyReader<UdpSocket> for UdpReader {
    type Replies = SeqTracker;

    fn new(msg: usize, framing: Framing, rec: &Recorder) -> Self {
        Self {
            buf: vec![0u8; UDP_RECV_BUF],
            msg,
            framing,
            one_way: rec.one_way(),
            tracker: SeqTracker::new(),
            answered: Answered::new(rec.wants_lost()),
        }
    }

    fn answered(&self) -> u64 {
        self.tracker.received()
    }

    /// The reply timeout, from the RTTs when the sender ended.
    fn drain_ns(rtt: &RttRecorder) -> u64 {
        udp_reply_timeout_ns(rtt)
    }

    fn recv(
        &mut self,
        sock: &UdpSocket,
        stamped: bool,
    ) -> io::Result<Option<(usize, Option<u64>)>> {
        recv(sock, &mut self.buf, stamped)
            .map(Some)
            .map_err(udp_error)
    }

    fn idle(&self, r: &OpenReader<'_>) -> io::Result<()> {
        if self.framing == Framing::Sockperf
            && self.tracker.received() == 0
            && r.progress.sent() > 0
            && r.clock.now_ns().saturating_sub(r.plan.start_ns) >= duration_ns(SOCKPERF_NO_REPLY)
        {
            return Err(NoReply::TimedOut(SOCKPERF_NO_REPLY).into_io());
        }
        Ok(())
    }

    fn take(&mut self, got: Received, r: &OpenReader<'_>, sink: &mut Sink<'_, '_>) {
        let Received { n, rx_ns, t } = got;
        let expected = self.tracker.highest().map_or(0, |h| h.saturating_add(1));
        let datagram = &self.buf[..n];
        let Some(seq) = udp_reply_seq(self.framing, self.one_way, datagram, self.msg, expected)
        else {
            return;
        };
        // Only a message already due can have been sent (and answered).
        let due_by = r.plan.due_by(t);
        if seq >= due_by {
            return;
        }
        if self.tracker.on_packet(seq) != Arrival::Duplicate {
            let agent = if self.one_way {
                stamps::udp_reply_stamps(datagram)
            } else {
                None
            };
            self.answered.mark(seq);
            sink.scheduled(r, seq, t, due_by - 1, rx_ns, agent);
            self.answered
                .sweep(r.progress.sent(), false, r.plan, sink.rec);
        }
    }

    /// Every message not answered by now is lost (for the full log).
    fn end(mut self, sent: u64, plan: &OpenLoop, rec: &mut Recorder) -> SeqTracker {
        self.answered.sweep(sent, true, plan, rec);
        self.tracker
    }

    /// The reader has already logged the lost messages as it swept.
    fn settle(
        tracker: SeqTracker,
        _sent: u64,
        _plan: &OpenLoop,
        _rec: &mut Recorder,
    ) -> Option<SeqTracker> {
        Some(tracker)
    }
}

/// The UDP echo's state: one datagram's buffer.
pub(super) struct UdpEcho {
    buf: Vec<u8>,
}

impl EchoState<UdpSocket> for UdpEcho {
    fn new() -> Self {
        Self {
            buf: vec![0u8; UDP_RECV_BUF],
        }
    }

    fn timeouts(sock: &UdpSocket) -> io::Result<Timeouts<'_>> {
        let restore = Timeouts::save_udp(sock)?;
        sock.set_read_timeout(Some(ECHO_POLL))?;
        Ok(restore)
    }

    fn recv(&mut self, sock: &UdpSocket) -> io::Result<Option<usize>> {
        sock.recv(&mut self.buf).map(Some)
    }

    /// The client's port is closed (an ICMP error for an earlier echo): it may be gone or
    /// about to rejoin; the agent's session decides, through `stop`. Or, under DF
    /// (`--dont-fragment`, `sonde mtu`), a router said an earlier echo was too big: that echo
    /// is lost, as it would be without the ICMP.
    fn transient(e: &io::Error) -> bool {
        fault::again(e) || fault::port_unreachable(e) || sys::message_too_long(e)
    }

    fn back(
        &mut self,
        sock: &UdpSocket,
        n: usize,
        _stop: &AtomicBool,
        counters: &Counters,
    ) -> io::Result<bool> {
        let buf = &mut self.buf[..n];
        if stamps::udp_wants_stamps(buf) {
            let t2 = host_clock_ns();
            stamps::write_agent_stamps(buf, t2, t2);
            stamps::write_agent_send_stamp(buf, host_clock_ns());
        }
        let datagram = &self.buf[..n];
        if n == UDP_JOIN_LEN {
            if let Ok(join) = UdpJoin::decode(datagram) {
                // A repeated join: the client has not seen our first ack yet. A stray ack
                // (never sent to an agent) is dropped.
                if !join.ack {
                    send_transient_ok(sock, &UdpJoin { ack: true, ..join }.encode())?;
                    counters.syscall();
                }
                return Ok(true);
            }
        }
        match send_transient_ok(sock, datagram) {
            Ok(()) => counters.add(n as u64, 1),
            // Under DF, larger than the path MTU this host knows toward the client: the echo
            // does not cross, and the client reads that as it would a router's refusal.
            Err(e) if sys::message_too_long(&e) => {}
            Err(e) => return Err(e),
        }
        counters.syscall();
        Ok(true)
    }
}

/// `max(1 ms, 10 × median RTT so far)`, or 1 s before the first RTT is known.
pub(super) fn udp_reply_timeout_ns(rtt: &RttRecorder) -> u64 {
    let floor = duration_ns(UDP_MIN_REPLY_TIMEOUT);
    rtt.value_at(50.0)
        .map_or(duration_ns(UDP_FIRST_REPLY_TIMEOUT), |median| {
            median.saturating_mul(10).max(floor)
        })
}

/// How often a blocked `recv` wakes to look at a reply deadline of `timeout_ns`: a quarter of
/// it (so a timeout overshoots by at most 25%), between 100 µs and [`UDP_POLL`]. Set when the
/// timeout is recomputed, never between a send and its reply.
pub(super) fn udp_poll_for(timeout_ns: u64) -> Duration {
    Duration::from_nanos(timeout_ns / 4).clamp(Duration::from_micros(100), UDP_POLL)
}

/// Sends one datagram. A datagram the kernel could not queue (`ENOBUFS`, a full send buffer) is
/// lost like any other and shows up as loss, so it is not an error.
pub(super) fn send_transient_ok(sock: &UdpSocket, datagram: &[u8]) -> io::Result<()> {
    match sock.send(datagram) {
        Ok(_) => Ok(()),
        Err(e) if fault::datagram_dropped(&e) => Ok(()),
        Err(e) => Err(e),
    }
}

pub(super) fn udp_error(e: io::Error) -> io::Error {
    if fault::port_unreachable(&e) {
        io::Error::new(
            io::ErrorKind::ConnectionRefused,
            "the peer's UDP port is closed (ICMP port unreachable): is the agent still running \
             the test?",
        )
    } else {
        e
    }
}
