//! The UDP client loops: datagrams, so a reply carries the seq of the message it answers; a
//! reply may be lost (counted after a timeout), duplicated or late.

use std::io;
use std::net::UdpSocket;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sonde_engine::rtt::RttRecorder;
use sonde_engine::seq::{Arrival, SeqTracker};
use sonde_wire::sockperf;
use sonde_wire::stamps;

use super::framing::{udp_reply_seq, Framing};
use super::inner::{realtime_ns, Recorder, ReplyAt, Stamps};
use super::open::{OpenLoop, OpenReader};
use super::transport::Transport;
use super::txstamp::{Keying, TxStamps};
use super::{
    count_call, duration_ns, ring_slot, LatencyOutcome, NoReply, PingConfig, Timeouts, SEND_RING,
    SOCKPERF_NO_REPLY, TIMEOUT_REFRESH, UDP_FIRST_REPLY_TIMEOUT, UDP_MAX_MSG,
    UDP_MIN_REPLY_TIMEOUT, UDP_POLL, UDP_RECV_BUF,
};
use crate::{fault, sys, Clock};

impl Transport for UdpSocket {
    const NAME: &'static str = "UDP";
    const MAX_MSG: u32 = UDP_MAX_MSG;
    const SOCKPERF_MAX_MSG: u32 = sockperf::MAX_UDP_MSG;
    type Replies = SeqTracker;

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

    fn closed(
        &self,
        msg: usize,
        framing: Framing,
        cfg: &PingConfig,
        clock: &Clock,
        stop: &AtomicBool,
        rec: &mut Recorder,
    ) -> io::Result<LatencyOutcome> {
        udp_closed(self, msg, framing, cfg, clock, stop, rec)
    }

    fn read_replies(
        &self,
        msg: usize,
        framing: Framing,
        r: &OpenReader<'_>,
        warmup_ns: u64,
        rec: &mut Recorder,
    ) -> io::Result<(RttRecorder, SeqTracker)> {
        udp_open_reader(self, msg, framing, r, warmup_ns, rec)
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

/// How a wait for replies ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Wait {
    /// What was waited for arrived.
    Answered,
    /// The deadline passed.
    TimedOut,
    /// The stop flag was raised.
    Stopped,
}
/// Receives one datagram, with its kernel receive timestamp when `stamped`.
pub(super) fn udp_recv(
    sock: &UdpSocket,
    buf: &mut [u8],
    stamped: bool,
) -> io::Result<(usize, Option<u64>)> {
    count_call();
    if stamped {
        sys::udp_recv_stamped(sock, buf)
    } else {
        sock.recv(buf).map(|n| (n, None))
    }
}
/// The UDP closed loop's state: everything preallocated before the first send.
pub(super) struct ClosedUdp<'a> {
    sock: &'a UdpSocket,
    msg: usize,
    framing: Framing,
    one_way: bool,
    stamped: bool,
    out: Vec<u8>,
    inbuf: Vec<u8>,
    sent_at: Vec<SentAt>,
    tx: TxStamps<'a>,
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
                Err(e) if fault::again(&e) => {
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
pub(super) fn udp_closed(
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
        tx: TxStamps::new(rec.reading_tx(), sys::sock_ref(sock), Keying::Datagram),
        sent: 0,
        rtt: RttRecorder::new(cfg.warmup_ns),
        all: RttRecorder::new(0),
        tracker: SeqTracker::new(),
        rec,
    };
    UdpSocket::prepare(framing, st.one_way, cfg.msg_size, &mut st.out);
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
        UdpSocket::number(framing, st.one_way, seq, &mut st.out);
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

/// Receives replies until every message sent is answered after the sender ended, the drain
/// timeout passes, or `stop`. Only first arrivals are recorded.
pub(super) fn udp_open_reader(
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
    let mut tx = TxStamps::new(rec.reading_tx(), sys::sock_ref(sock), Keying::Datagram);
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
            Err(e) if fault::again(&e) => {
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
