//! One trait over the socket kinds the latency loops run on, and the loops written once above
//! it.
//!
//! TCP is a byte stream: a message is framed by its size (and, with sockperf's framing, its
//! header), replies are reassembled from split and coalesced reads, nothing is lost, and a
//! silent peer is a timeout. UDP is datagrams: a reply carries the seq of the message it
//! answers, and may be lost (counted after a timeout), duplicated or late. Exactly that
//! difference is behind [`Transport`] and the per-loop states it names: how a message is laid
//! out and numbered and how one is sent; how a closed loop waits for its reply
//! ([`ClosedWait`]: a whole reply read by size, or datagrams matched by seq until a timeout);
//! how an open loop's reader turns reads into replies ([`ReplyReader`]); how an echo sends
//! back what it read ([`EchoState`]); and how the kernel keys transmit stamps (the last byte
//! of a TCP message, the datagram for UDP). Every loop is written once, generic over the
//! transport, so that the hot loops stay monomorphised (no `dyn` per message) and make the
//! same calls per message as before: the run ([`ping`]: sizes, rates, timeouts, kernel
//! stamps, the inner view), the closed loop ([`closed`]), the open loop ([`open`]: the
//! schedule, the paced sender on its own thread, the reader
//! ([`read_replies`]) on the caller's), and the agent's echo
//! ([`echo`](super::echo::echo)). Every reply goes through one [`Sink`]: its RTT, its transmit
//! stamp, the inner view.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;

use sonde_engine::rtt::RttRecorder;
use sonde_engine::seq::SeqTracker;

use super::framing::Framing;
use super::inner::{realtime_ns, InnerView, Recorder, ReplyAt, Stamps};
use super::open::{join, paced_sender, sender_thread, OpenLoop, OpenReader, Progress, SendTimes};
use super::txstamp::{Keying, TxStamps};
use super::{
    add_calls, check_one_way, check_rate, check_size, count_call, enable_stamps, peer_closed,
    LatencyOutcome, PingConfig, Timeouts,
};
use crate::{fault, sys, Clock, Counters};

/// A socket kind the latency loops run on (implemented by `TcpStream` and `UdpSocket`).
///
/// Each loop's per-run state is an associated type with the loop's transport-dependent steps
/// ([`ClosedWait`], [`ReplyReader`], [`EchoState`]); the loops themselves ([`closed`],
/// [`read_replies`], [`echo`](super::echo::echo)) are written once
/// over them and monomorphised per transport.
pub(super) trait Transport: Sync + Sized {
    /// `"TCP"` or `"UDP"`, for messages.
    const NAME: &'static str;
    /// Largest message with sonde's framing.
    const MAX_MSG: u32;
    /// Largest message with sockperf's framing.
    const SOCKPERF_MAX_MSG: u32;

    /// A closed loop's state and its waits for replies.
    type Closed: ClosedWait<Self>;
    /// An open loop's reader state: how reads become replies.
    type Reader: ReplyReader<Self>;
    /// An echo's state: how what it reads goes back.
    type Echo: EchoState<Self>;

    /// How the kernel keys this socket's transmit stamps for `msg`-byte messages.
    fn keying(msg: usize) -> Keying;

    /// Saves the socket's timeouts (restored when the guard drops) and sets the loop's: the
    /// read timeout its loops poll at, and whatever else the transport needs.
    fn loop_timeouts(&self) -> io::Result<Timeouts<'_>>;

    /// The socket, borrowed for the kernel-timestamp calls.
    fn sock_ref(&self) -> sys::SockRef<'_>;

    /// Asks the kernel for receive timestamps and, with `tx`, transmit timestamps.
    fn enable_timestamps(&self, tx: bool) -> io::Result<()>;

    /// Fills a message buffer once, before the first send.
    fn prepare(framing: Framing, one_way: bool, msg_size: u32, out: &mut [u8]);

    /// Writes message `seq`'s (from 0) number into `out`, before its send.
    fn number(framing: Framing, one_way: bool, seq: u64, out: &mut [u8]);

    /// The open-loop sender's send of one whole message (blocking; counted by the caller).
    fn send_message(&self, msg: &[u8]) -> io::Result<()>;
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

/// A closed loop's transport-dependent steps (see [`closed`]): TCP reads a whole reply or
/// fails after [`TCP_REPLY_TIMEOUT`](super::TCP_REPLY_TIMEOUT); UDP takes whatever reply
/// comes, matched to its message by seq, and moves on after its reply timeout.
pub(super) trait ClosedWait<T>: Sized {
    /// Everything the loop needs, allocated before the first send.
    fn new(msg: usize, framing: Framing, rec: &Recorder) -> Self;

    /// Before message `seq` is numbered and timed (UDP re-reads its reply timeout now and
    /// then, never between a send and its reply).
    fn next_message(&mut self, _sock: &T, _seq: u64) -> io::Result<()> {
        Ok(())
    }

    /// Message `seq` is about to go (after the end checks, before the wall clock is read):
    /// UDP logs as lost the unanswered message whose slot it reuses.
    fn before_send(&mut self, _seq: u64, _rec: &mut Recorder) {}

    /// Sends message `m` (`out`; one call, counted by the caller).
    fn send(&mut self, sock: &T, out: &[u8], m: InFlight, clock: &Clock) -> io::Result<()>;

    /// Waits for message `m`'s reply, recording into `sink` what comes meanwhile.
    fn wait(
        &mut self,
        sock: &T,
        m: InFlight,
        run: Run<'_>,
        sink: &mut Sink<'_, '_>,
    ) -> io::Result<Wait>;

    /// After the loop (`stopped`: by the flag): the outcome's sequence accounting and reply
    /// timeouts (UDP drains late replies first).
    fn end(
        self,
        sock: &T,
        stopped: bool,
        run: Run<'_>,
        sink: &mut Sink<'_, '_>,
    ) -> io::Result<(Option<SeqTracker>, u64)>;
}

/// The closed loop's message in flight.
#[derive(Debug, Clone, Copy)]
pub(super) struct InFlight {
    pub(super) seq: u64,
    /// When its send started, test clock.
    pub(super) t0: u64,
    /// `--timestamps`: the wall clock just before its send.
    pub(super) send_real_ns: Option<u64>,
}

/// What a closed loop's wait looks at: the test clock and the stop flag.
#[derive(Clone, Copy)]
pub(super) struct Run<'a> {
    pub(super) clock: &'a Clock,
    pub(super) stop: &'a AtomicBool,
}

/// One receive of an open loop's reader.
#[derive(Debug, Clone, Copy)]
pub(super) struct Received {
    /// Bytes received.
    pub(super) n: usize,
    /// With `--timestamps`, the kernel's receive time.
    pub(super) rx_ns: Option<u64>,
    /// When the receive returned, test clock.
    pub(super) t: u64,
}

/// An open loop reader's transport-dependent steps (see
/// [`read_replies`]): TCP reassembles the byte stream into replies
/// in order; UDP matches each datagram to its message by seq, and counts loss, duplicates and
/// reordering.
pub(super) trait ReplyReader<T>: Sized {
    /// What the reader hands back besides its RTTs: TCP counts the replies (in order, none
    /// lost), UDP tracks their seqs (loss, duplicates, reordering).
    type Replies;

    /// Everything the reader needs, allocated before the first read.
    fn new(msg: usize, framing: Framing, rec: &Recorder) -> Self;

    /// Replies taken so far (first arrivals).
    fn answered(&self) -> u64;

    /// How long after the sender ends the reader waits for the rest (`rtt`: the RTTs so far).
    fn drain_ns(rtt: &RttRecorder) -> u64;

    /// One receive (counted by the caller): the bytes read and, when `stamped`, the kernel's
    /// receive time. `None`: the peer closed the connection.
    fn recv(&mut self, sock: &T, stamped: bool) -> io::Result<Option<(usize, Option<u64>)>>;

    /// A receive timed out (or would block): UDP gives up on a sockperf peer that never
    /// answered.
    fn idle(&self, _r: &OpenReader<'_>) -> io::Result<()> {
        Ok(())
    }

    /// What was just received, as replies into `sink`.
    fn take(&mut self, got: Received, r: &OpenReader<'_>, sink: &mut Sink<'_, '_>);

    /// The reader ends with `sent` messages sent: what it hands back.
    fn end(self, sent: u64, plan: &OpenLoop, rec: &mut Recorder) -> Self::Replies;

    /// After the open loop: the sequence accounting for the outcome, and (for the full log)
    /// the messages that got no reply, of the `sent` sent on `plan`.
    fn settle(
        replies: Self::Replies,
        sent: u64,
        plan: &OpenLoop,
        rec: &mut Recorder,
    ) -> Option<SeqTracker>;
}

/// An echo's transport-dependent steps (see [`echo`](super::echo::echo)): TCP echoes bytes
/// (or, for a one-way request, whole stamped messages); UDP echoes datagrams and answers joins.
pub(super) trait EchoState<T>: Sized {
    /// The buffers, allocated before the first read.
    fn new() -> Self;

    /// Saves the socket's timeouts (restored when the guard drops) and sets the echo's.
    fn timeouts(sock: &T) -> io::Result<Timeouts<'_>>;

    /// One receive (counted by the caller); `None`: the peer closed the connection.
    fn recv(&mut self, sock: &T) -> io::Result<Option<usize>>;

    /// Whether a failed receive is to be retried rather than end the echo.
    fn transient(e: &io::Error) -> bool;

    /// Echoes what the last receive brought (`n` bytes); `Ok(false)` when `stop` was raised
    /// while the peer would not take it.
    fn back(
        &mut self,
        sock: &T,
        n: usize,
        stop: &AtomicBool,
        counters: &Counters,
    ) -> io::Result<bool>;
}

/// Where a loop's replies go: the RTTs, the kernel's transmit stamps kept by message, and the
/// inner view.
pub(super) struct Sink<'a, 'r> {
    pub(super) rtt: RttRecorder,
    tx: TxStamps<'a>,
    pub(super) rec: &'r mut Recorder,
}

impl<'a, 'r> Sink<'a, 'r> {
    pub(super) fn new<T: Transport>(
        sock: &'a T,
        msg: usize,
        warmup_ns: u64,
        rec: &'r mut Recorder,
    ) -> Self {
        Self {
            rtt: RttRecorder::new(warmup_ns),
            tx: TxStamps::new(rec.reading_tx(), sock.sock_ref(), T::keying(msg)),
            rec,
        }
    }

    /// The first reply to a message, as `at` says (its transmit stamp is looked up here;
    /// `newest` is the highest seq sent).
    pub(super) fn reply(&mut self, newest: u64, mut at: ReplyAt) {
        self.rtt
            .record(at.send_ns, at.receive_ns.saturating_sub(at.send_ns));
        let s = &mut at.stamps;
        s.tx_ns = self.tx.of(at.seq, newest, s.send_real_ns, s.rx_ns);
        self.rec.reply(&at);
    }

    /// An open loop's reply to message `seq`, received at `t`: its RTT from the scheduled send.
    pub(super) fn scheduled(
        &mut self,
        r: &OpenReader<'_>,
        seq: u64,
        t: u64,
        newest: u64,
        rx_ns: Option<u64>,
        agent: Option<(u64, u64)>,
    ) {
        let send_real_ns = r.send_times.and_then(|st| st.load(seq));
        self.reply(
            newest,
            ReplyAt {
                seq,
                send_ns: r.plan.due(seq),
                receive_ns: t,
                late: false,
                stamps: Stamps {
                    rx_ns,
                    tx_ns: None,
                    send_real_ns,
                    agent,
                },
            },
        );
    }
}

/// A latency run on `sock`: closed or open loop per `cfg.rate`, with the inner view.
pub(super) fn ping<T: Transport>(
    sock: &T,
    cfg: &PingConfig,
    framing: Framing,
    view: InnerView,
    clock: &Clock,
    stop: &AtomicBool,
) -> io::Result<LatencyOutcome> {
    let msg = check_size(
        cfg.msg_size,
        framing.size_range(T::MAX_MSG, T::SOCKPERF_MAX_MSG),
        T::NAME,
    )?;
    let rate = check_rate(cfg.rate)?;
    check_one_way(&view, framing, msg)?;
    let _restore = sock.loop_timeouts()?;
    let mut rec = Recorder::new(view, cfg.warmup_ns, cfg.until_ns);
    let _stamps_off = enable_stamps(&mut rec, sock.sock_ref(), |tx| sock.enable_timestamps(tx));
    let mut out = match rate {
        None => closed(sock, msg, framing, cfg, clock, stop, &mut rec),
        Some(rate) => open(sock, msg, framing, rate, cfg, clock, stop, &mut rec),
    }?;
    (out.socket, out.one_way) = rec.finish(clock.now_ns());
    Ok(out)
}

/// The open loop: a sender thread sends message `i` at its scheduled time, the calling thread
/// reads the replies; RTTs from the scheduled send times.
#[allow(clippy::too_many_arguments)]
fn open<T: Transport>(
    sock: &T,
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
    let (rtt, replies) = thread::scope(|scope| {
        let sender = scope.spawn(|| {
            sender_thread(cpu.as_deref(), || {
                let mut out = vec![0u8; msg];
                T::prepare(framing, one_way, cfg.msg_size, &mut out);
                paced_sender(&plan, clock, stop, &progress, |seq| {
                    T::number(framing, one_way, seq, &mut out);
                    if let Some(times) = &send_times {
                        times.store(seq, realtime_ns());
                    }
                    count_call();
                    sock.send_message(&out)
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
        let received = read_replies(sock, msg, framing, &reader, cfg.warmup_ns, rec);
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
    let seq = T::Reader::settle(replies, sent, &plan, rec);
    Ok(LatencyOutcome {
        rtt,
        sent,
        seq,
        late_sends: progress.late.load(Ordering::Relaxed),
        timeouts: 0,
        socket: None,
        one_way: None,
        log: None,
    })
}

/// The closed loop: one message in flight; its RTT from its send to its reply.
fn closed<T: Transport>(
    sock: &T,
    msg: usize,
    framing: Framing,
    cfg: &PingConfig,
    clock: &Clock,
    stop: &AtomicBool,
    rec: &mut Recorder,
) -> io::Result<LatencyOutcome> {
    let one_way = rec.one_way();
    let stamped = rec.reading_rx();
    let mut out = vec![0u8; msg];
    T::prepare(framing, one_way, cfg.msg_size, &mut out);
    let mut st = T::Closed::new(msg, framing, rec);
    let mut sink = Sink::new(sock, msg, cfg.warmup_ns, rec);
    let run = Run { clock, stop };
    let mut sent = 0;
    let mut measured = 0;
    let mut stopped = false;
    while !stop.load(Ordering::Relaxed) {
        st.next_message(sock, sent)?;
        T::number(framing, one_way, sent, &mut out);
        let t0 = clock.now_ns();
        if t0 >= cfg.until_ns || cfg.counted_out(measured) {
            break;
        }
        st.before_send(sent, sink.rec);
        let m = InFlight {
            seq: sent,
            t0,
            send_real_ns: stamped.then(realtime_ns),
        };
        count_call();
        st.send(sock, &out, m, clock)?;
        sent += 1;
        measured += u64::from(t0 >= cfg.warmup_ns);
        if st.wait(sock, m, run, &mut sink)? == Wait::Stopped {
            stopped = true;
            break;
        }
        sink.rec.tick(clock);
    }
    let (seq, timeouts) = st.end(sock, stopped, run, &mut sink)?;
    Ok(LatencyOutcome {
        rtt: sink.rtt,
        sent,
        seq,
        late_sends: 0,
        timeouts,
        socket: None,
        one_way: None,
        log: None,
    })
}

/// An open loop's reader: receives replies until the sender has ended and every reply is in
/// (or the transport's drain time has passed), `stop`, or the sender failed. RTTs from the
/// scheduled send times.
pub(super) fn read_replies<T: Transport>(
    sock: &T,
    msg: usize,
    framing: Framing,
    r: &OpenReader<'_>,
    warmup_ns: u64,
    rec: &mut Recorder,
) -> io::Result<(RttRecorder, <T::Reader as ReplyReader<T>>::Replies)> {
    let (plan, clock, progress) = (r.plan, r.clock, r.progress);
    let stamped = rec.reading_rx();
    let mut st = T::Reader::new(msg, framing, rec);
    let mut sink = Sink::new(sock, msg, warmup_ns, rec);
    let mut sender_done_at = None;
    let mut drain_ns = None;
    loop {
        if r.stop.load(Ordering::Relaxed) || progress.abort.load(Ordering::Relaxed) {
            break;
        }
        if let Some(done_at) = progress.done_at(&mut sender_done_at, clock) {
            let drain = *drain_ns.get_or_insert_with(|| T::Reader::drain_ns(&sink.rtt));
            if st.answered() >= progress.sent() || clock.now_ns() >= done_at.saturating_add(drain) {
                break;
            }
        }
        count_call();
        let (n, rx_ns) = match st.recv(sock, stamped) {
            Ok(Some(got)) => got,
            Ok(None) => {
                if progress.done.load(Ordering::Acquire) && st.answered() >= progress.sent() {
                    break;
                }
                return Err(peer_closed());
            }
            Err(e) if fault::again(&e) => {
                st.idle(r)?;
                sink.rec.tick(clock);
                continue;
            }
            Err(e) => return Err(e),
        };
        let t = clock.now_ns();
        st.take(Received { n, rx_ns, t }, r, &mut sink);
    }
    let replies = st.end(progress.sent(), plan, sink.rec);
    Ok((sink.rtt, replies))
}
