//! One trait over the socket kinds the latency loops run on, and the loops written once above
//! it.
//!
//! TCP is a byte stream: a message is framed by its size (and, with sockperf's framing, its
//! header), replies are reassembled from split and coalesced reads, nothing is lost, and a
//! silent peer is a timeout. UDP is datagrams: a reply carries the seq of the message it
//! answers, and may be lost (counted after a timeout), duplicated or late. Exactly that
//! difference is behind [`Transport`]: how a message is laid out and numbered, how one is sent
//! and one read received, how a closed loop waits for its reply and how an open loop's reader
//! turns reads into replies. The run itself ([`ping`]: sizes, rates, timeouts, kernel stamps,
//! the inner view) and the open loop ([`open`]: the schedule, the paced sender on its own
//! thread, the reader on the caller's) are written once, generic over the transport, so that
//! the hot loops stay monomorphised (no `dyn` per message).

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;

use sonde_engine::rtt::RttRecorder;
use sonde_engine::seq::SeqTracker;

use super::framing::Framing;
use super::inner::{realtime_ns, InnerView, Recorder};
use super::open::{join, paced_sender, sender_thread, OpenLoop, OpenReader, Progress, SendTimes};
use super::{
    add_calls, check_one_way, check_rate, check_size, count_call, enable_stamps, LatencyOutcome,
    PingConfig, Timeouts,
};
use crate::{sys, Clock};

/// A socket kind the latency loops run on (implemented by `TcpStream` and `UdpSocket`).
pub(super) trait Transport: Sync {
    /// `"TCP"` or `"UDP"`, for messages.
    const NAME: &'static str;
    /// Largest message with sonde's framing.
    const MAX_MSG: u32;
    /// Largest message with sockperf's framing.
    const SOCKPERF_MAX_MSG: u32;

    /// What an open loop's reader comes back with besides its RTTs: TCP counts the replies
    /// (in order, none lost), UDP tracks their seqs (loss, duplicates, reordering).
    type Replies;

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

    /// One closed-loop run: one message in flight.
    fn closed(
        &self,
        msg: usize,
        framing: Framing,
        cfg: &PingConfig,
        clock: &Clock,
        stop: &AtomicBool,
        rec: &mut Recorder,
    ) -> io::Result<LatencyOutcome>;

    /// An open loop's reader: receives replies until the sender has ended and every reply is
    /// in (or the drain time has passed), `stop`, or the sender failed.
    fn read_replies(
        &self,
        msg: usize,
        framing: Framing,
        r: &OpenReader<'_>,
        warmup_ns: u64,
        rec: &mut Recorder,
    ) -> io::Result<(RttRecorder, Self::Replies)>;

    /// After an open loop: the sequence accounting for the outcome, and (for the full log) the
    /// messages that got no reply, of the `sent` sent on `plan`.
    fn settle(
        replies: Self::Replies,
        sent: u64,
        plan: &OpenLoop,
        rec: &mut Recorder,
    ) -> Option<SeqTracker>;
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
    let mut rec = Recorder::new(view, cfg.warmup_ns);
    let _stamps_off = enable_stamps(&mut rec, sock.sock_ref(), |tx| sock.enable_timestamps(tx));
    let mut out = match rate {
        None => sock.closed(msg, framing, cfg, clock, stop, &mut rec),
        Some(rate) => open(sock, msg, framing, rate, cfg, clock, stop, &mut rec),
    }?;
    (out.socket, out.one_way) = rec.finish();
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
        let received = sock.read_replies(msg, framing, &reader, cfg.warmup_ns, rec);
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
    let seq = T::settle(replies, sent, &plan, rec);
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
