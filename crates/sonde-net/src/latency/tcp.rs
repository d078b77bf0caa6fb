//! The TCP client loops: a byte stream, so replies are framed by size and reassembled from
//! split and coalesced reads; nothing is lost, a silent peer is a timeout.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};

use sonde_engine::rtt::RttRecorder;
use sonde_engine::seq::SeqTracker;
use sonde_wire::sockperf;
use sonde_wire::stamps;

use super::framing::{sockperf_reply_seq, Framing};
use super::inner::{realtime_ns, Recorder, ReplyAt, Stamps};
use super::open::{OpenLoop, OpenReader};
use super::transport::Transport;
use super::txstamp::{Keying, TxStamps};
use super::{
    count_call, duration_ns, peer_closed, tcp_write_error, LatencyOutcome, NoReply, PingConfig,
    Timeouts, STAMPS_LEN, TCP_ECHO_BUF, TCP_MAX_MSG, TCP_OPEN_LOOP_DRAIN, TCP_POLL,
    TCP_REPLY_TIMEOUT,
};
use crate::deadline::{read_full, Fill};
use crate::{fault, sys, Clock};

impl Transport for TcpStream {
    const NAME: &'static str = "TCP";
    const MAX_MSG: u32 = TCP_MAX_MSG;
    const SOCKPERF_MAX_MSG: u32 = sockperf::MAX_TCP_MSG;
    type Replies = u64;

    fn loop_timeouts(&self) -> io::Result<Timeouts<'_>> {
        let restore = Timeouts::save_tcp(self)?;
        self.set_read_timeout(Some(TCP_POLL))?;
        self.set_write_timeout(Some(TCP_REPLY_TIMEOUT))?;
        Ok(restore)
    }

    fn sock_ref(&self) -> sys::SockRef<'_> {
        sys::sock_ref(self)
    }

    fn enable_timestamps(&self, tx: bool) -> io::Result<()> {
        sys::tcp_enable_timestamps(self, tx)
    }

    /// The framing's bytes, and a one-way request's header (the same in every message: replies
    /// come back in order, so a TCP message needs no number of its own).
    fn prepare(framing: Framing, one_way: bool, msg_size: u32, out: &mut [u8]) {
        framing.prepare(out);
        if one_way {
            stamps::write_tcp_request(msg_size, out);
        }
    }

    /// Only sockperf's header carries a seq over TCP.
    fn number(framing: Framing, _one_way: bool, seq: u64, out: &mut [u8]) {
        if framing == Framing::Sockperf {
            framing.stamp(seq, out);
        }
    }

    fn send_message(&self, msg: &[u8]) -> io::Result<()> {
        let mut s = self;
        s.write_all(msg).map_err(tcp_write_error)
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
        tcp_closed(self, msg, framing, cfg, clock, stop, rec)
    }

    /// Replies in order, reassembled by size (sockperf's too: the open loop counts its replies
    /// by size, as sonde's framing).
    fn read_replies(
        &self,
        msg: usize,
        _framing: Framing,
        r: &OpenReader<'_>,
        warmup_ns: u64,
        rec: &mut Recorder,
    ) -> io::Result<(RttRecorder, u64)> {
        tcp_open_reader(self, msg, r, warmup_ns, rec)
    }

    /// No sequence accounting over TCP; the messages past the last reply are the full log's
    /// lost ones.
    fn settle(received: u64, sent: u64, plan: &OpenLoop, rec: &mut Recorder) -> Option<SeqTracker> {
        if rec.wants_lost() {
            for k in received..sent {
                rec.lost(k, plan.due(k));
            }
        }
        None
    }
}

pub(super) fn tcp_closed(
    stream: &TcpStream,
    msg: usize,
    framing: Framing,
    cfg: &PingConfig,
    clock: &Clock,
    stop: &AtomicBool,
    rec: &mut Recorder,
) -> io::Result<LatencyOutcome> {
    let mut out = vec![0u8; msg];
    let one_way = rec.one_way();
    TcpStream::prepare(framing, one_way, cfg.msg_size, &mut out);
    let stamped = rec.reading_rx();
    let mut tx = TxStamps::new(
        rec.reading_tx(),
        sys::sock_ref(stream),
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
        TcpStream::number(framing, one_way, sent, &mut out);
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
pub(super) fn write_message(
    stream: &TcpStream,
    msg: &[u8],
    clock: &Clock,
    t0: u64,
) -> io::Result<()> {
    let mut s = stream;
    let mut off = 0;
    let deadline = t0.saturating_add(duration_ns(TCP_REPLY_TIMEOUT));
    while off < msg.len() {
        match s.write(&msg[off..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(k) => off += k,
            Err(e) if fault::again(&e) && clock.now_ns() < deadline => {}
            Err(e) => return Err(tcp_write_error(e)),
        }
    }
    Ok(())
}

/// A TCP failure before the first reply, as a [`NoReply`] where it says that nothing answered.
pub(super) fn no_first_reply(e: io::Error) -> io::Error {
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
pub(super) fn check_sockperf_tcp_reply(reply: &[u8], seq: u64) -> io::Result<()> {
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
pub(super) enum ReadReply {
    /// It arrived; with `--timestamps`, the kernel receive time of its last segment.
    Done(Option<u64>),
    /// `stop` was raised first.
    Stopped,
}

/// Reads exactly `buf.len()` bytes (with the kernel's receive timestamp when `stamped`).
pub(super) fn tcp_read_reply(
    stream: &TcpStream,
    buf: &mut [u8],
    clock: &Clock,
    stop: &AtomicBool,
    deadline_ns: u64,
    stamped: bool,
) -> io::Result<ReadReply> {
    let mut s = stream;
    let mut rx_ns = None;
    let read = |b: &mut [u8]| {
        count_call();
        let (n, stamp) = if stamped {
            sys::tcp_recv_stamped(stream, b)?
        } else {
            (s.read(b)?, None)
        };
        if n > 0 {
            rx_ns = stamp.or(rx_ns);
        }
        Ok(n)
    };
    let mut policy = ReplyRead {
        clock,
        stop,
        deadline_ns,
    };
    match read_full(buf, read, &mut policy) {
        Ok(()) => Ok(ReadReply::Done(rx_ns)),
        Err(ReplyCut::Stopped) => Ok(ReadReply::Stopped),
        Err(ReplyCut::Failed(e)) => Err(e),
    }
}

/// Why a TCP reply was not read whole.
enum ReplyCut {
    Stopped,
    Failed(io::Error),
}

/// A closed-loop reply's policy: each read waits at most the socket's poll timeout; at each
/// timeout the stop flag, then the deadline (on the test clock) are looked at.
struct ReplyRead<'a> {
    clock: &'a Clock,
    stop: &'a AtomicBool,
    deadline_ns: u64,
}

impl Fill for ReplyRead<'_> {
    type Error = ReplyCut;

    fn before_read(&mut self) -> Result<(), ReplyCut> {
        Ok(())
    }

    fn failed(&mut self, e: io::Error) -> Result<(), ReplyCut> {
        if !fault::again(&e) {
            return Err(ReplyCut::Failed(e));
        }
        if self.stop.load(Ordering::Relaxed) {
            return Err(ReplyCut::Stopped);
        }
        if self.clock.now_ns() >= self.deadline_ns {
            return Err(ReplyCut::Failed(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "no TCP reply from the peer within {} s: is the agent alive and the path \
                     open?",
                    TCP_REPLY_TIMEOUT.as_secs()
                ),
            )));
        }
        Ok(())
    }

    fn closed(&mut self) -> ReplyCut {
        ReplyCut::Failed(peer_closed())
    }
}

/// Reads replies in order: reply `k` answers message `k`. TCP may split or coalesce them, so
/// complete `msg`-sized units are counted, and every message completed by one `read` gets that
/// read's timestamp. Returns the RTTs and how many replies came.
pub(super) fn tcp_open_reader(
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
        sys::sock_ref(stream),
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
            Err(e) if fault::again(&e) => continue,
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
