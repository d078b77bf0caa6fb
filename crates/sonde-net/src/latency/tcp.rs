//! The TCP loops: a byte stream, so replies are framed by size and reassembled from split and
//! coalesced reads; nothing is lost, a silent peer is a timeout. The echo sends bytes back as
//! they come, or frames a one-way request's stream into messages to stamp.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};

use sonde_engine::rtt::RttRecorder;
use sonde_engine::seq::SeqTracker;
use sonde_wire::sockperf;
use sonde_wire::stamps;

use super::framing::{sockperf_reply_seq, Framing};
use super::inner::{Recorder, ReplyAt, Stamps};
use super::open::{OpenLoop, OpenReader};
use super::peer_closed;
use super::transport::{
    ClosedWait, EchoState, InFlight, Received, ReplyReader, Run, Sink, Transport, Wait,
};
use super::txstamp::Keying;
use super::{
    count_call, duration_ns, host_clock_ns, tcp_write_error, NoReply, Timeouts, ECHO_POLL,
    STAMPS_LEN, TCP_ECHO_BUF, TCP_MAX_MSG, TCP_OPEN_LOOP_DRAIN, TCP_POLL, TCP_REPLY_TIMEOUT,
};
use crate::deadline::{read_full, Fill};
use crate::{fault, sys, Clock, Counters};

impl Transport for TcpStream {
    const NAME: &'static str = "TCP";
    const MAX_MSG: u32 = TCP_MAX_MSG;
    const SOCKPERF_MAX_MSG: u32 = sockperf::MAX_TCP_MSG;
    type Closed = TcpClosed;
    type Reader = TcpReader;
    type Echo = TcpEcho;

    /// By bytes: a message's stamp is the one of its last byte.
    fn keying(msg: usize) -> Keying {
        Keying::Bytes(msg as u64)
    }

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
}

/// The closed loop's state: the buffer a reply is read whole into.
pub(super) struct TcpClosed {
    reply: Vec<u8>,
    framing: Framing,
    one_way: bool,
    stamped: bool,
}

impl TcpClosed {
    /// Before the first reply of a sockperf run, a failure means nothing answers there: say
    /// so, not "a reply was late" or "reset" (a sockperf server closes on a message over its
    /// maximum).
    fn first_error(&self, seq: u64, e: io::Error) -> io::Error {
        if self.framing == Framing::Sockperf && seq == 0 {
            no_first_reply(e)
        } else {
            e
        }
    }
}

impl ClosedWait<TcpStream> for TcpClosed {
    fn new(msg: usize, framing: Framing, rec: &Recorder) -> Self {
        Self {
            reply: vec![0u8; msg],
            framing,
            one_way: rec.one_way(),
            stamped: rec.reading_rx(),
        }
    }

    fn send(&mut self, sock: &TcpStream, out: &[u8], m: InFlight, clock: &Clock) -> io::Result<()> {
        write_message(sock, out, clock, m.t0).map_err(|e| self.first_error(m.seq, e))
    }

    /// Reads the whole reply (or fails after [`TCP_REPLY_TIMEOUT`]); a sockperf reply must
    /// answer the message in flight.
    fn wait(
        &mut self,
        sock: &TcpStream,
        m: InFlight,
        run: Run<'_>,
        sink: &mut Sink<'_, '_>,
    ) -> io::Result<Wait> {
        let InFlight {
            seq,
            t0,
            send_real_ns,
        } = m;
        let deadline = t0.saturating_add(duration_ns(TCP_REPLY_TIMEOUT));
        let (clock, stop) = (run.clock, run.stop);
        let read = tcp_read_reply(sock, &mut self.reply, clock, stop, deadline, self.stamped)
            .map_err(|e| self.first_error(seq, e));
        let ReadReply::Done(rx_ns) = read? else {
            sink.rec.lost(seq, t0);
            return Ok(Wait::Stopped);
        };
        let t1 = clock.now_ns();
        if self.framing == Framing::Sockperf {
            check_sockperf_tcp_reply(&self.reply, seq + 1)?;
        }
        sink.reply(
            seq,
            ReplyAt {
                seq,
                send_ns: t0,
                receive_ns: t1,
                late: false,
                stamps: Stamps {
                    rx_ns,
                    tx_ns: None,
                    send_real_ns,
                    agent: if self.one_way {
                        stamps::tcp_reply_stamps(&self.reply)
                    } else {
                        None
                    },
                },
            },
        );
        Ok(Wait::Answered)
    }

    /// No sequence accounting and no timeouts over TCP: a reply that does not come fails the
    /// run.
    fn end(
        self,
        _sock: &TcpStream,
        _stopped: bool,
        _run: Run<'_>,
        _sink: &mut Sink<'_, '_>,
    ) -> io::Result<(Option<SeqTracker>, u64)> {
        Ok((None, 0))
    }
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

/// The open loop's reader: replies come in order, reply `k` answering message `k`. TCP may
/// split or coalesce them, so complete `msg`-sized units are counted (sockperf's too), and
/// every message completed by one `read` gets that read's timestamp.
pub(super) struct TcpReader {
    buf: Vec<u8>,
    msg: usize,
    one_way: bool,
    /// Replies so far.
    received: u64,
    /// Bytes of the reply currently being assembled, and (one-way) its first bytes.
    partial: usize,
    head: [u8; STAMPS_LEN],
}

impl ReplyReader<TcpStream> for TcpReader {
    type Replies = u64;

    fn new(msg: usize, _framing: Framing, rec: &Recorder) -> Self {
        Self {
            buf: vec![0u8; TCP_ECHO_BUF.max(msg)],
            msg,
            one_way: rec.one_way(),
            received: 0,
            partial: 0,
            head: [0u8; STAMPS_LEN],
        }
    }

    fn answered(&self) -> u64 {
        self.received
    }

    /// TCP cannot lose a reply; a peer that stops echoing is given this long.
    fn drain_ns(_rtt: &RttRecorder) -> u64 {
        duration_ns(TCP_OPEN_LOOP_DRAIN)
    }

    fn recv(
        &mut self,
        sock: &TcpStream,
        stamped: bool,
    ) -> io::Result<Option<(usize, Option<u64>)>> {
        let read = if stamped {
            sys::tcp_recv_stamped(sock, &mut self.buf)
        } else {
            let mut s = sock;
            s.read(&mut self.buf).map(|n| (n, None))
        };
        read.map(|got| (got.0 > 0).then_some(got))
    }

    fn take(&mut self, got: Received, r: &OpenReader<'_>, sink: &mut Sink<'_, '_>) {
        let Received { n, rx_ns, t } = got;
        let msg = self.msg;
        // Only a message already due can have been answered; more is a misbehaving peer.
        let due_by = r.plan.due_by(t);
        let newest = r.progress.sent().saturating_sub(1);
        let mut reply = |k: u64, agent| sink.scheduled(r, k, t, newest.max(k), rx_ns, agent);
        if self.one_way {
            // Message by message, to pick up each reply's stamps across reads.
            let mut at = 0;
            while at < n {
                let take = (msg - self.partial).min(n - at);
                if self.partial < STAMPS_LEN {
                    let end = (self.partial + take).min(STAMPS_LEN);
                    self.head[self.partial..end]
                        .copy_from_slice(&self.buf[at..at + end - self.partial]);
                }
                self.partial += take;
                at += take;
                if self.partial == msg {
                    self.partial = 0;
                    if self.received < due_by {
                        reply(self.received, stamps::tcp_reply_stamps(&self.head));
                        self.received += 1;
                    }
                }
            }
        } else {
            let total = self.partial + n;
            self.partial = total % msg;
            let completed = ((total / msg) as u64).min(due_by.saturating_sub(self.received));
            for k in self.received..self.received + completed {
                reply(k, None);
            }
            self.received += completed;
        }
    }

    fn end(self, _sent: u64, _plan: &OpenLoop, _rec: &mut Recorder) -> u64 {
        self.received
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

/// How the echo treats the connection, known from its first bytes.
#[derive(Debug, Clone, Copy)]
enum EchoMode {
    /// Not known yet: a one-way request shows itself in 8 bytes.
    Sniffing,
    /// Every byte back as it comes.
    Plain,
    /// One-way requests of this many bytes each, stamped and echoed whole.
    Stamped(usize),
}

/// The TCP echo's state.
pub(super) struct TcpEcho {
    /// Room for a whole message of the largest size plus a read's worth behind it.
    buf: Vec<u8>,
    /// Bytes held: read before the kind of connection was known, or of a stamped message not
    /// yet whole.
    have: usize,
    mode: EchoMode,
}

impl TcpEcho {
    /// Every complete message in the buffer, stamped (`t2`: when the read that completed it
    /// returned) and written back in one write.
    fn stamped(
        &mut self,
        sock: &TcpStream,
        size: usize,
        t2: u64,
        stop: &AtomicBool,
        counters: &Counters,
    ) -> io::Result<bool> {
        let whole = self.have - self.have % size;
        if whole > 0 {
            let t3 = host_clock_ns();
            for m in self.buf[..whole].chunks_exact_mut(size) {
                stamps::write_agent_stamps(m, t2, t3);
            }
            if !write_echo(sock, stop, &self.buf[..whole], counters)? {
                return Ok(false);
            }
            counters.add(whole as u64, (whole / size) as u64);
            self.buf.copy_within(whole..self.have, 0);
            self.have -= whole;
        }
        Ok(true)
    }
}

impl EchoState<TcpStream> for TcpEcho {
    fn new() -> Self {
        Self {
            buf: vec![0u8; 2 * TCP_ECHO_BUF],
            have: 0,
            mode: EchoMode::Sniffing,
        }
    }

    fn timeouts(sock: &TcpStream) -> io::Result<Timeouts<'_>> {
        let restore = Timeouts::save_tcp(sock)?;
        sock.set_read_timeout(Some(ECHO_POLL))?;
        sock.set_write_timeout(Some(ECHO_POLL))?;
        Ok(restore)
    }

    fn recv(&mut self, sock: &TcpStream) -> io::Result<Option<usize>> {
        let room = match self.mode {
            EchoMode::Sniffing => self.have..TCP_ECHO_BUF,
            EchoMode::Plain => 0..TCP_ECHO_BUF,
            // At most up to the end of the message being assembled plus a read's worth; the
            // buffer holds two of the largest messages.
            EchoMode::Stamped(size) => self.have..(size + TCP_ECHO_BUF).min(self.buf.len()),
        };
        let mut s = sock;
        s.read(&mut self.buf[room]).map(|n| (n > 0).then_some(n))
    }

    fn transient(e: &io::Error) -> bool {
        fault::again(e)
    }

    fn back(
        &mut self,
        sock: &TcpStream,
        n: usize,
        stop: &AtomicBool,
        counters: &Counters,
    ) -> io::Result<bool> {
        match self.mode {
            EchoMode::Plain => {
                if !write_echo(sock, stop, &self.buf[..n], counters)? {
                    return Ok(false);
                }
                counters.add(n as u64, 1);
                Ok(true)
            }
            EchoMode::Stamped(size) => {
                let t2 = host_clock_ns();
                self.have += n;
                self.stamped(sock, size, t2, stop, counters)
            }
            EchoMode::Sniffing => {
                let t2 = host_clock_ns();
                self.have += n;
                // A plain sonde message is zeros and a sockperf one never reaches this port:
                // anything but `S` first is echoed as bytes. A one-way request shows itself in
                // 8 bytes.
                if self.buf[0] == stamps::TCP_STAMP_REQUEST[0] && self.have < 8 {
                    return Ok(true);
                }
                if let Some(size) = stamps::tcp_request_size(&self.buf[..self.have], TCP_MAX_MSG) {
                    let size = size as usize;
                    self.mode = EchoMode::Stamped(size);
                    return self.stamped(sock, size, t2, stop, counters);
                }
                if !write_echo(sock, stop, &self.buf[..self.have], counters)? {
                    return Ok(false);
                }
                counters.add(self.have as u64, 1);
                self.have = 0;
                self.mode = EchoMode::Plain;
                Ok(true)
            }
        }
    }
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
            Err(e) if fault::again(&e) => {
                if stop.load(Ordering::Relaxed) {
                    return Ok(false);
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}
