//! Throughput and packet-rate loops.
//!
//! Each loop owns its socket's blocking behaviour for as long as it runs: it puts the socket in
//! blocking mode and sets a short send or receive timeout ([`TCP_POLL`], [`UDP_RECV_POLL`]) so
//! that a stalled peer never hides the deadline or the stop flag. The timeouts stay set
//! afterwards.
//!
//! Buffers are allocated once before a loop starts; inside it there is no allocation, locking,
//! formatting or logging, and [`Counters`] are updated once per system call. Every send or
//! receive call a loop makes, whether it moved data, timed out or failed, is counted in
//! [`Counters::syscalls`] (one relaxed atomic add): the "syscalls per message" of the CPU cost.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::Duration;

use sonde_engine::jitter::Jitter;
use sonde_engine::pace::{Schedule, TokenBucket};
use sonde_engine::seq::SeqTracker;
use sonde_wire::{
    DataHeader, Iperf3UdpHeader, PpsHeader, TestKind, TestSpec, UdpJoin, DATA_HEADER_LEN,
    PPS_HEADER_LEN, UDP_JOIN_LEN,
};

use crate::pace::Pacing;
use crate::{fault, socket, sys, Clock, Counters};

mod zerocopy;

/// How long a TCP loop's blocked `write` or `read` waits before it looks at the deadline and the
/// stop flag again (`SO_SNDTIMEO` / `SO_RCVTIMEO`).
pub const TCP_POLL: Duration = Duration::from_millis(100);

/// How long [`udp_recv`] waits for a datagram before it looks at the stop flag and the expected
/// count again (`SO_RCVTIMEO`). [`udp_send`] uses the same as its `SO_SNDTIMEO`.
pub const UDP_RECV_POLL: Duration = Duration::from_millis(50);

/// `ECONNREFUSED` answers a UDP sender tolerates before the deadline: each one means an ICMP
/// port unreachable came back, i.e. nothing listens on the agent's port any more. One can be a
/// leftover; a few mean the agent is gone.
pub const UDP_REFUSED_LIMIT: u32 = 3;

/// The TCP receiver's default read size ([`sonde_wire::DEFAULT_TCP_READ_SIZE`]). Larger than the
/// 128 KiB writes: on a fast path the receive queue holds several writes, and fewer, larger
/// reads leave the receiver's core more time (on loopback, single-stream throughput went from
/// 0.91x to 1.05x iperf3's, bench/compare.py).
const TCP_RECV_BUF: usize = sonde_wire::DEFAULT_TCP_READ_SIZE as usize;

/// A TCP receiver's buffer: `read_size` bytes, 1 to [`sonde_wire::MAX_TCP_READ_SIZE`].
fn read_buffer(read_size: u32) -> Vec<u8> {
    vec![0u8; read_size.clamp(1, sonde_wire::MAX_TCP_READ_SIZE) as usize]
}

/// A capped TCP receiver's burst: it may read this long's worth of its rate at once (and at
/// least [`CAPPED_MIN_READ`], at most [`TCP_RECV_BUF`]).
const CAPPED_BURST_NS: u64 = 20_000_000;
/// A capped TCP receiver waits until it may read at least this much (or its whole burst, if
/// smaller), so a slow cap is not read a few bytes per system call.
const CAPPED_MIN_READ: u64 = 16 << 10;

/// A capped TCP receiver's `SO_RCVBUF`: this long's worth of its rate (64 KiB to 4 MiB), so that
/// what the peer has sent but the receiver has not yet read stays small (the kernel would grow
/// the buffer to megabytes that fill faster than the rate empties them).
const CAPPED_RCVBUF_NS: u64 = 200_000_000;
const CAPPED_RCVBUF_MIN: u64 = 64 << 10;
const CAPPED_RCVBUF_MAX: u64 = 4 << 20;

/// Most datagrams per `sendmmsg`/`recvmmsg`, and the byte budget of one batch's buffer.
const BATCH: usize = 64;
const BATCH_BYTES: usize = 1 << 20;

/// A paced sender that fell more than this far behind its schedule (the process was stopped,
/// the machine starved it) restarts the schedule from now instead of sending the backlog in one
/// burst.
const MAX_LAG_NS: u64 = 1_000_000_000;

/// The header at the front of each UDP data datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UdpFormat {
    /// sonde's own [`DataHeader`]: 64-bit sequence from 0, send time in ns. The receiver also
    /// answers sonde [`UdpJoin`] datagrams that arrive late.
    #[default]
    Sonde,
    /// sonde's 14-byte [`PpsHeader`] (48-bit sequence from 0, send time in ns): pps datagrams
    /// shorter than a [`DataHeader`]. The receiver answers joins as with [`UdpFormat::Sonde`].
    Short,
    /// iperf3's [`Iperf3UdpHeader`]: seconds and microseconds, then a sequence number from 1,
    /// 64 bits wide when `seq64` (`udp_counters_64bit`) was negotiated, else 32. A receiver maps
    /// iperf3 seq `s` to tracker seq `s - 1`, so the tracker's `highest + 1` is iperf3's
    /// `packets`.
    Iperf3 {
        /// 64-bit sequence numbers.
        seq64: bool,
    },
}

impl UdpFormat {
    /// sonde's format for a test: [`UdpFormat::Short`] for pps datagrams shorter than a
    /// [`DataHeader`] (agents that predate it refuse those sizes), else [`UdpFormat::Sonde`].
    pub fn sonde(spec: &TestSpec) -> Self {
        if spec.kind == TestKind::Pps && (spec.msg_size as usize) < DATA_HEADER_LEN {
            Self::Short
        } else {
            Self::Sonde
        }
    }

    /// The header's length.
    pub fn header_len(self) -> usize {
        match self {
            Self::Sonde => DATA_HEADER_LEN,
            Self::Short => PPS_HEADER_LEN,
            Self::Iperf3 { seq64 } => Iperf3UdpHeader::len(seq64),
        }
    }

    /// Stamps the `index`-th datagram of a flow (from 0), sent at `now_ns` on the test clock.
    #[inline]
    fn write(self, index: u64, now_ns: u64, buf: &mut [u8]) {
        match self {
            Self::Sonde => DataHeader {
                seq: index,
                send_ns: now_ns,
            }
            .write(buf),
            Self::Short => PpsHeader {
                seq: index,
                send_ns: now_ns,
            }
            .write(buf),
            Self::Iperf3 { seq64 } => Iperf3UdpHeader::at(index + 1, now_ns).write(buf, seq64),
        }
    }

    /// The tracker sequence number (from 0) and the sender's clock of a data datagram.
    #[inline]
    fn read(self, datagram: &[u8]) -> Option<(u64, u64)> {
        match self {
            Self::Sonde => DataHeader::read(datagram).ok().map(|h| (h.seq, h.send_ns)),
            Self::Short => PpsHeader::read(datagram).ok().map(|h| (h.seq, h.send_ns)),
            Self::Iperf3 { seq64 } => Iperf3UdpHeader::read(datagram, seq64)
                .ok()
                // iperf3 counts from 1; a 0 is junk (seq 0 would wrap the tracker).
                .and_then(|h| Some((h.seq.checked_sub(1)?, h.ns()))),
        }
    }
}

/// Whether this platform's TCP receivers can discard without a copy (`--skip-rx-copy`,
/// `MSG_TRUNC`): Linux only.
pub const SKIP_RX_COPY: bool = cfg!(target_os = "linux");

/// Whether this platform's TCP senders can send without a copy (`-Z`, `MSG_ZEROCOPY`): Linux
/// only.
pub const ZEROCOPY: bool = cfg!(target_os = "linux");

/// How long a zero-copy sender waits at its end for the kernel's last completions (the data
/// still unacknowledged), so that its counts cover every send.
const ZEROCOPY_DRAIN: Duration = Duration::from_millis(500);

/// What a sender sent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SendOutcome {
    /// Payload bytes handed to the kernel.
    pub bytes: u64,
    /// Datagrams (UDP) or write calls (TCP).
    pub packets: u64,
    /// First to last send, ns.
    pub active_ns: u64,
    /// TCP only: retransmitted segments, from `TCP_INFO`.
    pub retransmits: Option<u64>,
    /// How the data was sent, for the report (`"write"`, `"sendmsg+UDP_SEGMENT"`, `"sendmmsg"`...).
    pub method: &'static str,
    /// `-O`: bytes written before the omit time, not in `bytes` (nor their writes or datagrams
    /// in `packets`, nor their time in `active_ns`).
    pub omitted_bytes: u64,
    /// `-O` (UDP): datagrams sent before the omit time, not in `packets`. With `packets`, the
    /// count of sequence numbers the sender used.
    pub omitted_packets: u64,
    /// `-Z` (TCP): what the `MSG_ZEROCOPY` sends came to, from the kernel's completions.
    pub zerocopy: Option<sonde_wire::ZerocopyStats>,
}

impl SendOutcome {
    /// The sender's counts for stream `stream`, as reported over the control channel.
    pub fn stats(&self, stream: u32) -> sonde_wire::StreamStats {
        sonde_wire::StreamStats {
            stream,
            bytes: self.bytes,
            packets: self.packets,
            active_ns: self.active_ns,
            retransmits: self.retransmits,
            omitted_bytes: self.omitted_bytes,
            omitted_packets: self.omitted_packets,
            zerocopy: self.zerocopy,
            ..sonde_wire::StreamStats::default()
        }
    }
}

/// What a TCP receiver received.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TcpRecvOutcome {
    /// Payload bytes read.
    pub bytes: u64,
    /// Read calls that returned data.
    pub reads: u64,
    /// First byte, ns on the test clock (0 when nothing arrived).
    pub first_ns: u64,
    /// Last byte, ns on the test clock.
    pub last_ns: u64,
    /// `-O`: bytes read before the omit time, not in `bytes` (nor their reads in `reads`, nor
    /// their time in `first_ns`..`last_ns`).
    pub omitted_bytes: u64,
}

/// What a UDP receiver received.
#[derive(Debug, Clone)]
pub struct UdpRecvOutcome {
    /// Payload bytes of data datagrams (duplicates included).
    pub bytes: u64,
    /// Data datagrams (duplicates included).
    pub packets: u64,
    /// First data datagram, ns on the test clock.
    pub first_ns: u64,
    /// Last data datagram, ns on the test clock.
    pub last_ns: u64,
    /// Datagrams too short to carry a header, ignored.
    pub malformed: u64,
    /// Sequence accounting.
    pub seq: SeqTracker,
    /// RFC 3550 jitter.
    pub jitter: Jitter,
    /// `--ecn` ([`udp_recv_with`]): the ECN marks of the data datagrams, where the platform
    /// reads them.
    pub ecn: Option<sonde_wire::EcnCounts>,
    /// `-O` ([`UdpRecvOptions::omit`]): the omit period's datagrams, counted apart; `None`
    /// without an omit period.
    pub omitted: Option<UdpOmitted>,
}

/// A UDP receiver's omit period (`-O`), cut by sequence number: at the first datagram that
/// arrives after the omit time, every sequence number up to the highest seen so far belongs to
/// the omit period, and every one above it to the test. The datagrams of the omit period that
/// arrive late are counted here, not in the test's counts, so the test's loss is exact: of the
/// sequence numbers from [`UdpOmitted::seqs`] to the sender's last, the ones that never arrived.
#[derive(Debug, Clone)]
pub struct UdpOmitted {
    /// Sequence numbers `0..seqs` are the omit period's (the highest seen before the cut + 1).
    pub seqs: u64,
    /// Payload bytes of the omit period's datagrams (duplicates included).
    pub bytes: u64,
    /// The omit period's sequence accounting.
    pub seq: SeqTracker,
}

impl UdpRecvOutcome {
    /// The test's lost datagrams given the sender's count of every datagram it sent (omitted
    /// ones included): the sequence numbers after the omit period's that never arrived.
    pub fn lost(&self, sent_total: u64) -> u64 {
        let omitted = self.omitted.as_ref().map_or(0, |o| o.seqs);
        self.seq.lost(sent_total.saturating_sub(omitted))
    }

    /// `-O`: the omit period's sequence numbers, 0 without one.
    pub fn omitted_packets(&self) -> u64 {
        self.omitted.as_ref().map_or(0, |o| o.seqs)
    }

    /// `-O`: the omit period's payload bytes received, 0 without one.
    pub fn omitted_bytes(&self) -> u64 {
        self.omitted.as_ref().map_or(0, |o| o.bytes)
    }

    /// Unique datagrams received, the omit period's included.
    fn received_total(&self) -> u64 {
        let omitted = self.omitted.as_ref().map_or(0, |o| o.seq.received());
        self.seq.received().saturating_add(omitted)
    }

    /// Moves what was received so far into the omit period: the cut.
    fn cut(&mut self) {
        let seqs = self.seq.highest().map_or(0, |h| h.saturating_add(1));
        self.omitted = Some(UdpOmitted {
            seqs,
            bytes: self.bytes,
            seq: std::mem::take(&mut self.seq),
        });
        self.bytes = 0;
        self.packets = 0;
        self.first_ns = 0;
        self.last_ns = 0;
        self.jitter = Jitter::default();
        if let Some(ecn) = self.ecn.as_mut() {
            *ecn = sonde_wire::EcnCounts::default();
        }
    }
}

/// `-O` at a UDP receiver: the omit period ends `omit_ns` after `from_ns` on the loop's clock.
/// The start is read at every batch, so that a receiver whose loop starts before it is known
/// (the agent's, before the client's `Go`) learns it there: `u64::MAX` until then, when every
/// datagram is the omit period's.
#[derive(Debug, Clone, Copy)]
pub struct UdpOmit<'a> {
    /// The start of the test on the loop's clock, ns; `u64::MAX` while unknown.
    pub from_ns: &'a AtomicU64,
    /// The omit period, ns.
    pub omit_ns: u64,
}

impl UdpOmit<'_> {
    fn until_ns(&self) -> u64 {
        self.from_ns
            .load(Ordering::Relaxed)
            .saturating_add(self.omit_ns)
    }
}

/// How a UDP sender ([`udp_send_with`]) sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpSendOptions {
    /// Datagram payload, bytes (at least the format's header).
    pub msg_size: u32,
    /// Paced at this rate, bits per second of payload; 0: as fast as the kernel takes them.
    pub bits_per_second: u64,
    /// The header each datagram carries.
    pub format: UdpFormat,
    /// Unlimited senders may send GSO batches (see [`crate::gso::choose`]).
    pub gso: bool,
    /// The loop ends at this time on the loop's clock, ns.
    pub until_ns: u64,
    /// `-O` (0 for none): datagrams sent before this time go into
    /// [`SendOutcome::omitted_packets`] and `omitted_bytes`, not the outcome's counts.
    pub omit_until_ns: u64,
    /// `-n`, `-k` (`u64::MAX` for none): the loop also ends once it has sent this many payload
    /// bytes, in whole datagrams (the last one may take it past: a datagram is not cut).
    pub max_bytes: u64,
}

/// How a UDP receiver ([`udp_recv_with`]) receives.
#[derive(Debug, Clone, Copy)]
pub struct UdpRecvOptions<'a> {
    /// The sender's datagram payload, bytes.
    pub msg_size: u32,
    /// The header each datagram carries.
    pub format: UdpFormat,
    /// `--ecn`: count the ECN field each data datagram arrives with.
    pub ecn: bool,
    /// `-O`: the omit period, counted apart ([`UdpRecvOutcome::omitted`]).
    pub omit: Option<UdpOmit<'a>>,
}

/// How a TCP sender ([`tcp_send`]) sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpSendOptions {
    /// Bytes per write (at least 1): `-l`.
    pub msg_size: u32,
    /// The loop ends at this time on the loop's clock, ns.
    pub until_ns: u64,
    /// `-O` (0 for none): what is written before this time on the clock goes into
    /// [`SendOutcome::omitted_bytes`] rather than the outcome's counts, whose time starts at the
    /// first write after it. The per-stream counters (the intervals) count every byte.
    pub omit_until_ns: u64,
    /// `-n`, `-k` (`u64::MAX` for none): the loop also ends once it has written this many
    /// bytes, omitted ones included, the last write cut to fit.
    pub max_bytes: u64,
    /// `-Z` (Linux): send with `MSG_ZEROCOPY` from a ring of message buffers, each written
    /// again only once the kernel has completed every send from it; the outcome's
    /// [`SendOutcome::zerocopy`] says how many sends the kernel copied after all. Elsewhere the
    /// loop fails with `Unsupported` before it sends.
    pub zerocopy: bool,
}

impl TcpSendOptions {
    /// `msg_size`-byte writes until `until_ns`, nothing omitted, no byte limit.
    pub fn until(msg_size: u32, until_ns: u64) -> Self {
        Self {
            msg_size,
            until_ns,
            omit_until_ns: 0,
            max_bytes: u64::MAX,
            zerocopy: false,
        }
    }
}

/// Writes [`TcpSendOptions::msg_size`]-byte messages from a static buffer until
/// [`TcpSendOptions::until_ns`] on `clock`, the byte limit, or `stop`, then shuts down the write
/// side so the receiver sees the end. Reads `TCP_INFO` retransmits at the end.
///
/// Sets the stream blocking with a [`TCP_POLL`] write timeout. A reset or closed peer
/// (`EPIPE`, `ECONNRESET`) ends the loop: after the deadline or once `stop` is set that is the
/// normal end of a test and the outcome is returned; before it, the error is.
pub fn tcp_send(
    stream: &TcpStream,
    opts: &TcpSendOptions,
    clock: &Clock,
    stop: &AtomicBool,
    counters: &Counters,
) -> io::Result<SendOutcome> {
    let TcpSendOptions {
        msg_size,
        until_ns,
        omit_until_ns,
        max_bytes,
        zerocopy,
    } = *opts;
    if msg_size == 0 {
        return Err(invalid_input("a TCP message must be at least 1 byte"));
    }
    stream.set_nonblocking(false)?;
    stream.set_write_timeout(Some(TCP_POLL))?;
    let msg_len = msg_size as usize;
    let mut zc = if zerocopy {
        Some(zerocopy::ZerocopySender::new(stream, msg_len, counters)?)
    } else {
        None
    };
    // The zero-copy sender sends from its own ring of buffers.
    let buf = if zc.is_some() {
        Vec::new()
    } else {
        vec![0u8; msg_len]
    };
    let mut out = SendOutcome {
        method: if zc.is_some() {
            "send+MSG_ZEROCOPY"
        } else {
            "write"
        },
        ..SendOutcome::default()
    };
    let mut span = Span::default();
    let mut writer = stream;
    // Where in the message the next write starts: messages are written whole, write_all style.
    let mut offset = 0;
    let mut peer_gone = false;
    // One clock read per write: the time after a write is the next write's start and the
    // deadline check. The counters are published about every millisecond rather than at each
    // write (their readers sample every 50 ms or more): with 1-byte messages a write costs well
    // under a microsecond, and a second clock read and three atomic adds per write were a
    // measurable share of it.
    let mut pending = Pending::new(counters);
    let mut now = clock.now_ns();
    // What is left to write under `max_bytes`.
    let mut left = max_bytes;
    while !stop.load(Ordering::Relaxed) && now < until_ns && left > 0 {
        let end = usize::try_from(left).map_or(msg_len, |l| msg_len.min(offset + l));
        let written = match zc.as_mut() {
            None => writer.write(&buf[offset..end]),
            Some(zc) => zc.write(offset, end, TCP_POLL),
        };
        let after = clock.now_ns();
        match written {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) if now < omit_until_ns => {
                left -= n as u64;
                out.omitted_bytes += n as u64;
                pending.add(after, n as u64, 1);
                offset += n;
                if offset == msg_len {
                    offset = 0;
                }
            }
            Ok(n) => {
                left -= n as u64;
                span.mark(now, after);
                out.bytes += n as u64;
                out.packets += 1;
                pending.add(after, n as u64, 1);
                offset += n;
                if offset == msg_len {
                    offset = 0;
                }
            }
            Err(e) if fault::again(&e) => pending.add(after, 0, 0),
            Err(e) if fault::peer_gone(&e) => {
                pending.add(after, 0, 0);
                if stop.load(Ordering::Relaxed) || after >= until_ns {
                    peer_gone = true;
                    break;
                }
                return Err(e);
            }
            Err(e) => return Err(e),
        }
        now = after;
    }
    drop(pending);
    if !peer_gone {
        match stream.shutdown(Shutdown::Write) {
            Ok(()) => {}
            // The receiver already went away: its side of the test is over, nothing to tell it.
            Err(e) if e.kind() == io::ErrorKind::NotConnected || fault::peer_gone(&e) => {}
            Err(e) => return Err(e),
        }
    }
    out.zerocopy = zc.map(|zc| zc.finish(ZEROCOPY_DRAIN));
    out.retransmits = socket::tcp_retransmits(stream);
    out.active_ns = span.ns();
    Ok(out)
}

/// TCP sender paced to `bits_per_second`: `len`-byte blocks, each written when the schedule
/// says it is due (a sender that fell behind catches up back to back, as iperf3's does).
/// Otherwise as [`tcp_send`]. (The agent's iperf3 server sends with it when the client asks
/// for a bitrate over TCP.)
///
/// # Errors
/// As [`tcp_send`].
pub fn tcp_send_paced(
    stream: &TcpStream,
    len: u32,
    bits_per_second: u64,
    clock: &Clock,
    until_ns: u64,
    stop: &AtomicBool,
    counters: &Counters,
) -> io::Result<SendOutcome> {
    stream.set_nonblocking(false)?;
    stream.set_write_timeout(Some(TCP_POLL))?;
    let schedule = Schedule::bits_per_second(bits_per_second, len);
    let buf = vec![0u8; len as usize];
    let mut out = SendOutcome {
        method: "write (paced)",
        ..SendOutcome::default()
    };
    let start = clock.now_ns();
    let (mut block, mut offset) = (0u64, 0usize);
    let (mut first_ns, mut last_ns) = (None, 0u64);
    let mut writer = stream;
    while !stop.load(Ordering::Relaxed) {
        let now = clock.now_ns();
        if now >= until_ns {
            break;
        }
        if offset == 0 {
            let due = start.saturating_add(schedule.due_ns(block));
            if now < due {
                Pacing::SLEEP.wait(now, due);
                continue;
            }
        }
        match writer.write(&buf[offset..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                first_ns.get_or_insert(now);
                last_ns = clock.now_ns();
                out.bytes += n as u64;
                out.packets += 1;
                counters.add(n as u64, 1);
                offset += n;
                if offset == buf.len() {
                    offset = 0;
                    block += 1;
                }
            }
            Err(e) if fault::again(&e) => {}
            Err(e) if fault::peer_gone(&e) && stop.load(Ordering::Relaxed) => break,
            Err(e) => return Err(e),
        }
    }
    let _ = stream.shutdown(Shutdown::Write);
    out.retransmits = socket::tcp_retransmits(stream);
    out.active_ns = last_ns.saturating_sub(first_ns.unwrap_or(last_ns));
    Ok(out)
}

/// How a TCP receiver ([`tcp_recv`]) reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpRecvOptions {
    /// At most this many bytes per read, 1 to [`sonde_wire::MAX_TCP_READ_SIZE`]: the test's
    /// `--read-size` (by default [`sonde_wire::DEFAULT_TCP_READ_SIZE`]).
    pub read_size: u32,
    /// `-O` (0 for none): bytes read before this time on the clock go into
    /// [`TcpRecvOutcome::omitted_bytes`] rather than the outcome's counts; the per-stream
    /// counters (the intervals) count every byte.
    pub omit_until_ns: u64,
    /// `--skip-rx-copy`: each read discards what it takes without copying it to user space
    /// (`MSG_TRUNC`, Linux; elsewhere the first read fails with `Unsupported`): the same one
    /// system call per read, without the copy's CPU cost.
    pub discard: bool,
    /// The agent's `--max-bitrate`: read no faster than this many bytes per second (see
    /// [`tcp_recv`]); `None` reads as fast as data comes.
    pub max_bytes_per_second: Option<u64>,
}

impl Default for TcpRecvOptions {
    fn default() -> Self {
        Self {
            read_size: sonde_wire::DEFAULT_TCP_READ_SIZE,
            omit_until_ns: 0,
            discard: false,
            max_bytes_per_second: None,
        }
    }
}

/// Reads until the peer closes (EOF) or `stop`, counting bytes, at most
/// [`TcpRecvOptions::read_size`] bytes per read. Uses a short read timeout so `stop` is noticed
/// within 100 ms.
///
/// The read size is part of what is measured: a receiver that drains its queue at every read
/// has TCP acknowledge at once, so a sender of small writes (Nagle's algorithm) sends many small
/// segments; one that reads a message at a time leaves data queued, and the sender's segments
/// grow (docs/performance.md).
///
/// Sets the stream blocking with a [`TCP_POLL`] read timeout. A reset is returned as an error
/// unless `stop` is already set.
///
/// With [`TcpRecvOptions::max_bytes_per_second`] the reads are capped: each read asks for at
/// most what a [`TokenBucket`] (20 ms of the rate, 16 KiB to 512 KiB of burst) holds, and waits
/// for the bucket when it is short. Data the receiver does not read stays in the kernel's queue,
/// so TCP flow control slows the peer's sender to the cap. The bucket is emptied when the first
/// data arrives and that read is owed: by the start of any later read the loop has read at most
/// the rate times the time since the first byte came, so bytes over first-to-last byte never
/// exceed the rate. The capped loop sets `SO_RCVBUF` to 200 ms of the rate (64 KiB to 4 MiB), so
/// that little waits unread in the kernel; its waits are short sleeps (at most [`TCP_POLL`]), so
/// `stop` is noticed as in the uncapped loop, and the counters move with every read, so interval
/// reports keep their timing. The uncapped loop does without the clock read per read the capped
/// one needs.
pub fn tcp_recv(
    stream: &TcpStream,
    opts: &TcpRecvOptions,
    clock: &Clock,
    stop: &AtomicBool,
    counters: &Counters,
) -> io::Result<TcpRecvOutcome> {
    if let Some(cap) = opts.max_bytes_per_second {
        return tcp_recv_capped(stream, opts, cap, clock, stop, counters);
    }
    let TcpRecvOptions {
        read_size,
        omit_until_ns,
        discard,
        ..
    } = *opts;
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(TCP_POLL))?;
    let mut buf = read_buffer(read_size);
    let mut out = TcpRecvOutcome::default();
    let mut reader = stream;
    while !stop.load(Ordering::Relaxed) {
        let read = if discard {
            sys::tcp_recv_discard(stream, &mut buf)
        } else {
            reader.read(&mut buf)
        };
        counters.syscall();
        match read {
            Ok(0) => break,
            Ok(n) => {
                let now = clock.now_ns();
                counters.add(n as u64, 1);
                if now < omit_until_ns {
                    out.omitted_bytes += n as u64;
                    continue;
                }
                if out.reads == 0 {
                    out.first_ns = now;
                }
                out.last_ns = now;
                out.bytes += n as u64;
                out.reads += 1;
            }
            Err(e) if fault::again(&e) => {}
            Err(e) if fault::peer_gone(&e) && stop.load(Ordering::Relaxed) => break,
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// [`tcp_recv`] with its reads capped at `bytes_per_second`.
fn tcp_recv_capped(
    stream: &TcpStream,
    opts: &TcpRecvOptions,
    bytes_per_second: u64,
    clock: &Clock,
    stop: &AtomicBool,
    counters: &Counters,
) -> io::Result<TcpRecvOutcome> {
    let TcpRecvOptions {
        read_size,
        omit_until_ns,
        discard,
        ..
    } = *opts;
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(TCP_POLL))?;
    let burst = (u128::from(bytes_per_second) * u128::from(CAPPED_BURST_NS) / 1_000_000_000)
        .clamp(u128::from(CAPPED_MIN_READ), TCP_RECV_BUF as u128);
    let burst = u64::try_from(burst).unwrap_or(CAPPED_MIN_READ);
    let rcvbuf = (u128::from(bytes_per_second) * u128::from(CAPPED_RCVBUF_NS) / 1_000_000_000)
        .clamp(u128::from(CAPPED_RCVBUF_MIN), u128::from(CAPPED_RCVBUF_MAX));
    // Best effort: a receiver whose buffer stays as it was still reads at the rate.
    let _ = socket2::SockRef::from(stream)
        .set_recv_buffer_size(usize::try_from(rcvbuf).unwrap_or(CAPPED_RCVBUF_MIN as usize));
    let mut bucket = TokenBucket::new(bytes_per_second, burst, clock.now_ns());
    let min_read = CAPPED_MIN_READ.min(bucket.burst_bytes());
    let mut buf = read_buffer(read_size);
    let mut out = TcpRecvOutcome::default();
    let mut reader = stream;
    while !stop.load(Ordering::Relaxed) {
        let allowed = bucket.available(clock.now_ns());
        if allowed < min_read {
            let wait_ns = bucket.wait_ns(min_read).max(1);
            Pacing::SLEEP.at_most(TCP_POLL).wait(0, wait_ns);
            continue;
        }
        let len = usize::try_from(allowed).map_or(buf.len(), |a| a.min(buf.len()));
        let read = if discard {
            sys::tcp_recv_discard(stream, &mut buf[..len])
        } else {
            reader.read(&mut buf[..len])
        };
        counters.syscall();
        match read {
            Ok(0) => break,
            Ok(n) => {
                let now = clock.now_ns();
                if out.reads == 0 && out.omitted_bytes == 0 {
                    // The bucket filled while it waited for the first byte: the rate counts
                    // from here, as the receiver's figure does (first to last byte), and the
                    // first read is owed like any other.
                    bucket.empty(now);
                }
                bucket.take(n as u64);
                counters.add(n as u64, 1);
                if now < omit_until_ns {
                    out.omitted_bytes += n as u64;
                    continue;
                }
                if out.reads == 0 {
                    out.first_ns = now;
                }
                out.last_ns = now;
                out.bytes += n as u64;
                out.reads += 1;
            }
            Err(e) if fault::again(&e) => {}
            Err(e) if fault::peer_gone(&e) && stop.load(Ordering::Relaxed) => break,
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// Sends `msg_size`-byte datagrams (a [`sonde_wire::DataHeader`], then filler) on a connected
/// socket until `until_ns` or `stop`. With `bits_per_second > 0` the sends follow a
/// [`sonde_engine::pace::Schedule`] (no bursts beyond what is due); with 0 the loop sends as fast
/// as the kernel takes them, in UDP GSO batches where the kernel supports them (`sendmmsg`
/// otherwise). Every datagram carries its own sequence number.
///
/// * `msg_size` must be at least [`DATA_HEADER_LEN`] (else `InvalidInput`).
/// * The socket is set blocking with a [`UDP_RECV_POLL`] send timeout.
/// * Paced: one `send` per datagram, stamped with its actual send time. The schedule starts
///   when the call does. A sender more than 1 s behind (stopped, starved) restarts its schedule
///   from now rather than bursting the backlog.
/// * Unlimited: one `sendmsg` with `UDP_SEGMENT` per batch of up to 64 datagrams (at most
///   65,507 bytes), all stamped with the batch's send time. If the first GSO send is refused
///   the loop falls back to `sendmmsg`, and where that does not exist to `send`; `method` says
///   which ran.
/// * `ENOBUFS`, `EAGAIN` (the send timeout) and `EINTR` are retried until the deadline.
/// * `ECONNREFUSED` (an ICMP port unreachable: nothing listens on the peer's port) is tolerated
///   [`UDP_REFUSED_LIMIT`] times before the deadline, then returned as the error; after the
///   deadline or `stop` it is ignored.
#[allow(clippy::too_many_arguments)]
pub fn udp_send(
    sock: &UdpSocket,
    msg_size: u32,
    bits_per_second: u64,
    format: UdpFormat,
    clock: &Clock,
    until_ns: u64,
    stop: &AtomicBool,
    counters: &Counters,
) -> io::Result<SendOutcome> {
    let opts = UdpSendOptions {
        msg_size,
        bits_per_second,
        format,
        gso: true,
        until_ns,
        omit_until_ns: 0,
        max_bytes: u64::MAX,
    };
    udp_send_with(sock, &opts, clock, stop, counters)
}

/// [`udp_send`] with every option: GSO batches allowed only when [`UdpSendOptions::gso`] (see
/// [`crate::gso::choose`]; without it the unlimited sender sends `sendmmsg` batches of single
/// datagrams, each its own packet from the socket on), and an omit period
/// ([`UdpSendOptions::omit_until_ns`]) whose datagrams are counted apart.
pub fn udp_send_with(
    sock: &UdpSocket,
    opts: &UdpSendOptions,
    clock: &Clock,
    stop: &AtomicBool,
    counters: &Counters,
) -> io::Result<SendOutcome> {
    let size = opts.msg_size as usize;
    if size < opts.format.header_len() {
        return Err(invalid_input(
            "a UDP data datagram must be at least as long as its header (16 bytes, pps 14; iperf3: 12, or 16 with 64-bit counters)",
        ));
    }
    sock.set_nonblocking(false)?;
    sock.set_write_timeout(Some(UDP_RECV_POLL))?;
    let mut run = SendRun {
        format: opts.format,
        clock,
        until_ns: opts.until_ns,
        omit_until_ns: opts.omit_until_ns,
        left: opts.max_bytes.div_ceil(u64::from(opts.msg_size)),
        stop,
        counters,
        out: SendOutcome::default(),
        span: Span::default(),
        refused: 0,
    };
    let sent = if opts.bits_per_second > 0 {
        let schedule = Schedule::bits_per_second(opts.bits_per_second, opts.msg_size);
        run.out.method = "send";
        send_paced(sock, size, schedule, &mut run)
    } else {
        send_unlimited(sock, size, opts.gso, &mut run).map(|m| run.out.method = m.name())
    };
    sent.map_err(|e| explain_too_long(sock, size, e))?;
    run.out.active_ns = run.span.ns();
    Ok(run.out)
}

/// A send refused with `EMSGSIZE` (a datagram over the path MTU under `--dont-fragment`),
/// explained with the MTU the kernel knows for the path; any other error as it is.
pub(crate) fn explain_too_long(sock: &UdpSocket, payload: usize, e: io::Error) -> io::Error {
    if !sys::message_too_long(&e) {
        return e;
    }
    let ipv6 = matches!(sock.peer_addr(), Ok(std::net::SocketAddr::V6(p)) if p.ip().to_ipv4_mapped().is_none());
    let (ip, what) = if ipv6 { (40, "IPv6") } else { (20, "IPv4") };
    let mtu = match sys::path_mtu(sys::sock_ref(sock), ipv6) {
        Ok(mtu) => format!("the path MTU of {mtu} B"),
        Err(_) => "the path MTU".to_owned(),
    };
    io::Error::new(
        e.kind(),
        format!(
            "a {payload}-byte datagram ({} B with the UDP and {what} headers) does not fit {mtu} \
             and may not be fragmented (--dont-fragment; EMSGSIZE): send smaller datagrams (-l) \
             or leave out --dont-fragment",
            payload + 8 + ip
        ),
    )
}

/// Receives datagrams on a connected socket with `recvmmsg` until `stop`, or until the number of
/// unique datagrams reaches `expect` (`u64::MAX` while the sender's count is unknown). In
/// [`UdpFormat::Sonde`] it answers any [`sonde_wire::UdpJoin`] request that still arrives with
/// its acknowledgement, and ignores join acknowledgements; neither is counted as data.
///
/// * The socket is set blocking with a [`UDP_RECV_POLL`] receive timeout, so `stop` and
///   `expect` are looked at at least that often.
/// * `UDP_GRO` where the kernel has it (Linux 5.0): the kernel may hand over a sender's GSO
///   batch (or a NIC's GRO train) whole, one buffer of equal-sized datagrams; the loop cuts it
///   at the segment size the kernel reports and counts and checks each datagram's sequence
///   number on its own, as if they had come one by one. Measured with `sonde pps -m 18` between
///   two network namespaces over a veth (bench/README.md): 20 to 28 times the received rate
///   when the client sends GSO batches (`--gso on`: without GRO the receiving socket cuts each
///   batch up itself, and loses most of them), the same within noise when it does not (`--gso
///   auto` on a veth, where nothing coalesces single datagrams), so it is always asked for.
/// * One `recvmmsg` takes up to 64 buffers (fewer for large `msg_size` and with GRO's 64 KiB
///   buffers, to bound them to about 1 MiB); one `recv` per datagram where `recvmmsg` does not
///   exist.
/// * Receive times are taken once per batch: every datagram of a batch gets the time the
///   batch returned (for first/last and jitter).
/// * Each slot holds `max(msg_size, 64)` bytes; a longer datagram is truncated to that and its
///   bytes counted as received. Datagrams shorter than the format's header count as `malformed`.
/// * `ECONNREFUSED` (an earlier acknowledgement hit a closed port) is ignored.
pub fn udp_recv(
    sock: &UdpSocket,
    msg_size: u32,
    format: UdpFormat,
    clock: &Clock,
    stop: &AtomicBool,
    expect: &AtomicU64,
    counters: &Counters,
) -> io::Result<UdpRecvOutcome> {
    let opts = UdpRecvOptions {
        msg_size,
        format,
        ecn: false,
        omit: None,
    };
    udp_recv_with(sock, &opts, clock, stop, expect, counters)
}

/// [`udp_recv`] with every option.
///
/// With [`UdpRecvOptions::ecn`] (`--ecn`) it also counts the ECN field each data datagram
/// arrived with ([`UdpRecvOutcome::ecn`]): the socket gets `IP_RECVTOS` / `IPV6_RECVTCLASS` and
/// each `recvmmsg` slot a control buffer, read once per buffer (a GRO buffer's datagrams share
/// one TOS byte). Where the platform cannot read them (not Linux) the outcome's `ecn` is `None`.
/// Without `ecn` the loop is [`udp_recv`]'s, without the control messages' cost.
///
/// With [`UdpRecvOptions::omit`] (`-O`) it cuts the omit period off by sequence number at the
/// first batch received after the omit time ([`UdpOmitted`]); `expect` still counts every
/// unique datagram, the omit period's included. The [`Counters`] (the intervals) count every
/// datagram.
pub fn udp_recv_with(
    sock: &UdpSocket,
    opts: &UdpRecvOptions<'_>,
    clock: &Clock,
    stop: &AtomicBool,
    expect: &AtomicU64,
    counters: &Counters,
) -> io::Result<UdpRecvOutcome> {
    let UdpRecvOptions {
        msg_size,
        format,
        ecn,
        omit,
    } = *opts;
    sock.set_nonblocking(false)?;
    sock.set_read_timeout(Some(UDP_RECV_POLL))?;
    let gro = sys::enable_udp_gro(sock).is_ok();
    let ecn = ecn && sys::enable_recv_tos(sock).is_ok();
    // A coalesced buffer holds up to 64 KiB of datagrams.
    let slot = if gro { GRO_SLOT } else { recv_slot(msg_size) };
    let capacity = (BATCH_BYTES / slot).clamp(1, BATCH);
    // Control buffers carry the GRO segment size and the TOS byte.
    let mut batch = if gro || ecn {
        sys::Batch::with_segments(capacity)
    } else {
        sys::Batch::new(capacity)
    };
    let mut buf = vec![0u8; slot * batch.capacity()];
    let mut out = UdpRecvOutcome {
        bytes: 0,
        packets: 0,
        first_ns: 0,
        last_ns: 0,
        malformed: 0,
        seq: SeqTracker::new(),
        jitter: Jitter::default(),
        ecn: ecn.then(sonde_wire::EcnCounts::default),
        omitted: None,
    };
    // Until the cut, everything received is the omit period's (moved there by the cut).
    let mut cut_pending = omit.is_some();
    while !stop.load(Ordering::Relaxed) && out.received_total() < expect.load(Ordering::Relaxed) {
        let received = batch.recv(sock, &mut buf, slot);
        counters.syscall();
        let n = match received {
            Ok(n) => n,
            Err(e) if fault::again(&e) || fault::port_unreachable(&e) => continue,
            Err(e) => return Err(e),
        };
        let now = clock.now_ns();
        if cut_pending && omit.is_some_and(|o| now >= o.until_ns()) {
            out.cut();
            cut_pending = false;
        }
        let (mut bytes, mut packets) = (0u64, 0u64);
        // Every data datagram, the omit period's late ones included, for the intervals.
        let (mut all_bytes, mut all_packets) = (0u64, 0u64);
        for (i, b) in buf.chunks_exact(slot).take(n).enumerate() {
            // With GRO a buffer holds `segment` -byte datagrams (the last may be shorter);
            // each is counted and its sequence number checked on its own.
            let len = batch.datagram_len(i).min(slot);
            let segment = batch.segment_size(i).unwrap_or(len).max(1);
            let before = packets;
            for datagram in b[..len].chunks(segment) {
                let sonde = matches!(format, UdpFormat::Sonde | UdpFormat::Short);
                if sonde && datagram.len() == UDP_JOIN_LEN {
                    if let Ok(join) = UdpJoin::decode(datagram) {
                        if !join.ack {
                            // Best effort: a lost acknowledgement makes the client send another
                            // join. On a connected socket the reply goes to the joining peer.
                            let _ = sock.send(&UdpJoin { ack: true, ..join }.encode());
                            counters.syscall();
                        }
                        continue;
                    }
                }
                let Some((seq, send_ns)) = format.read(datagram) else {
                    out.malformed += 1;
                    continue;
                };
                all_bytes += datagram.len() as u64;
                all_packets += 1;
                if let Some(o) = out.omitted.as_mut().filter(|o| seq < o.seqs) {
                    // A late datagram of the omit period.
                    o.seq.on_packet(seq);
                    o.bytes += datagram.len() as u64;
                    continue;
                }
                out.seq.on_packet(seq);
                out.jitter.on_packet(send_ns, now);
                bytes += datagram.len() as u64;
                packets += 1;
            }
            if let Some(counts) = out.ecn.as_mut() {
                // Data datagrams only, as `packets` counts them.
                if let Some(tos) = batch.tos(i) {
                    counts.count(tos, packets - before);
                }
            }
        }
        if packets > 0 {
            if out.packets == 0 {
                out.first_ns = now;
            }
            out.last_ns = now;
            out.bytes += bytes;
            out.packets += packets;
        }
        if all_packets > 0 {
            counters.add(all_bytes, all_packets);
        }
    }
    if cut_pending {
        // No datagram arrived after the omit time: all of it was the omit period.
        out.cut();
    }
    Ok(out)
}

/// A receive slot with `UDP_GRO`: the largest buffer the kernel coalesces (64 KiB).
const GRO_SLOT: usize = 65_536;

/// The receive slot for `msg_size`-byte datagrams: room for the largest of a data datagram,
/// a join and a little junk, in whole cache lines, at most the largest UDP payload.
fn recv_slot(msg_size: u32) -> usize {
    (msg_size as usize).clamp(64, 65_536).next_multiple_of(64)
}

/// One UDP send loop's shared state and error policy.
struct SendRun<'a> {
    format: UdpFormat,
    clock: &'a Clock,
    until_ns: u64,
    omit_until_ns: u64,
    /// Datagrams still to send (`-n`, `-k`; about `u64::MAX / msg_size` when timed).
    left: u64,
    stop: &'a AtomicBool,
    counters: &'a Counters,
    out: SendOutcome,
    span: Span,
    refused: u32,
}

impl SendRun<'_> {
    /// The time now, or `None` once the loop must end.
    #[inline]
    fn now(&self) -> Option<u64> {
        if self.left == 0 || self.stop.load(Ordering::Relaxed) {
            return None;
        }
        let now = self.clock.now_ns();
        (now < self.until_ns).then_some(now)
    }

    /// One system call, started at `started_ns`, sent `packets` datagrams of `bytes` in all.
    #[inline]
    fn sent(&mut self, started_ns: u64, bytes: usize, packets: usize) {
        let (bytes, packets) = (bytes as u64, packets as u64);
        self.left = self.left.saturating_sub(packets);
        self.counters.add(bytes, packets);
        if started_ns < self.omit_until_ns {
            self.out.omitted_bytes += bytes;
            self.out.omitted_packets += packets;
            return;
        }
        self.span.mark(started_ns, self.clock.now_ns());
        self.out.bytes += bytes;
        self.out.packets += packets;
    }

    /// A failed send: `Ok` to try again (the loop checks the deadline first), `Err` to end the
    /// test with it.
    fn failed(&mut self, e: io::Error) -> io::Result<()> {
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(());
        }
        if fault::timed_out(&e) || fault::datagram_dropped(&e) {
            // A full queue drains at the other core's pace: give it the CPU.
            thread::yield_now();
            return Ok(());
        }
        if fault::port_unreachable(&e) {
            if self.now().is_none() {
                return Ok(());
            }
            self.refused += 1;
            return if self.refused > UDP_REFUSED_LIMIT {
                Err(e)
            } else {
                Ok(())
            };
        }
        Err(e)
    }
}

/// Sends each datagram when the schedule says it is due, and never earlier.
fn send_paced(
    sock: &UdpSocket,
    size: usize,
    schedule: Schedule,
    run: &mut SendRun<'_>,
) -> io::Result<()> {
    let mut buf = vec![0u8; size];
    let Some(start) = run.now() else {
        return Ok(());
    };
    // Datagram `seq` is due at `base_ns + schedule.due_ns(seq - base_seq)`.
    let (mut base_ns, mut base_seq) = (start, 0u64);
    let mut seq = 0u64;
    while let Some(now) = run.now() {
        let due = base_ns.saturating_add(schedule.due_ns(seq - base_seq));
        if now < due {
            Pacing::FINE.wait(run.clock.now_ns(), due.min(run.until_ns));
            continue;
        }
        if now - due > MAX_LAG_NS {
            (base_ns, base_seq) = (now, seq);
        }
        run.format.write(seq, now, &mut buf);
        let sent = sock.send(&buf);
        run.counters.syscall();
        match sent {
            Ok(n) => {
                run.sent(now, n, 1);
                seq += 1;
            }
            Err(e) => run.failed(e)?,
        }
    }
    Ok(())
}

/// The unlimited sender's method name when it sent offloaded batches: Linux's
/// `sendmsg` with `UDP_SEGMENT`, Windows' `send` after `UDP_SEND_MSG_SIZE` (USO).
pub const GSO_SEND_METHOD: &str = if cfg!(windows) {
    "send+UDP_SEND_MSG_SIZE"
} else {
    "sendmsg+UDP_SEGMENT"
};

/// How the unlimited sender hands datagrams to the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SendMethod {
    /// One `sendmsg` with a `UDP_SEGMENT` control message per batch (Windows: one `send`
    /// with `UDP_SEND_MSG_SIZE` set).
    Gso,
    /// One `sendmmsg` per batch.
    Mmsg,
    /// One `send` per datagram.
    Plain,
}

impl SendMethod {
    fn name(self) -> &'static str {
        match self {
            Self::Gso => GSO_SEND_METHOD,
            Self::Mmsg => "sendmmsg",
            Self::Plain => "send",
        }
    }
}

/// Sends as fast as the kernel takes datagrams, in batches; returns the method that ran.
fn send_unlimited(
    sock: &UdpSocket,
    size: usize,
    gso: bool,
    run: &mut SendRun<'_>,
) -> io::Result<SendMethod> {
    let per_batch = (BATCH_BYTES / size).clamp(1, BATCH);
    let per_gso = per_batch
        .min(sys::MAX_GSO_BYTES / size)
        .min(sys::MAX_GSO_SEGMENTS);
    let gso_size = u16::try_from(size).ok().filter(|_| gso && per_gso > 1);
    let mut method = match (gso_size, per_batch) {
        (Some(_), _) => SendMethod::Gso,
        (None, 1) => SendMethod::Plain,
        (None, _) => SendMethod::Mmsg,
    };
    let mut batch = sys::Batch::new(per_batch);
    let mut buf = vec![0u8; per_batch * size];
    let mut gso_worked = false;
    let mut seq = 0u64;
    while let Some(now) = run.now() {
        let count = match method {
            SendMethod::Gso => per_gso,
            SendMethod::Mmsg => per_batch.min(batch.capacity()),
            SendMethod::Plain => 1,
        }
        .min(usize::try_from(run.left).unwrap_or(usize::MAX));
        for (i, datagram) in buf.chunks_exact_mut(size).take(count).enumerate() {
            run.format.write(seq + i as u64, now, datagram);
        }
        let data = &buf[..count * size];
        let result = match (method, gso_size) {
            (SendMethod::Gso, Some(gso)) => sys::send_segments(sock, data, gso).map(|b| b / size),
            (SendMethod::Gso | SendMethod::Mmsg, _) => batch.send(sock, data, size),
            (SendMethod::Plain, _) => sock.send(data).map(|_| 1),
        };
        run.counters.syscall();
        match result {
            Ok(sent) => {
                run.sent(now, sent * size, sent);
                seq += sent as u64;
                gso_worked |= method == SendMethod::Gso;
            }
            Err(e) if method == SendMethod::Gso && !gso_worked && sys::gso_refused(&e) => {
                method = if per_batch > 1 {
                    SendMethod::Mmsg
                } else {
                    SendMethod::Plain
                };
            }
            Err(e) if method == SendMethod::Mmsg && sys::batch_unsupported(&e) => {
                method = SendMethod::Plain;
            }
            Err(e) => run.failed(e)?,
        }
    }
    Ok(method)
}

/// A send loop's counts, published to its [`Counters`] at most every [`PUBLISH_NS`] (and when
/// dropped) instead of with atomic adds at every system call. Every call adds one system call.
struct Pending<'a> {
    counters: &'a Counters,
    bytes: u64,
    packets: u64,
    syscalls: u64,
    due_ns: u64,
}

/// How stale a batched loop's published counters may be: far below the interval reporters'
/// 50 ms sampling.
const PUBLISH_NS: u64 = 1_000_000;

impl<'a> Pending<'a> {
    fn new(counters: &'a Counters) -> Self {
        Pending {
            counters,
            bytes: 0,
            packets: 0,
            syscalls: 0,
            due_ns: 0,
        }
    }

    /// Counts one system call that moved `bytes` in `packets`, at `now_ns` on the loop's clock.
    #[inline]
    fn add(&mut self, now_ns: u64, bytes: u64, packets: u64) {
        self.bytes += bytes;
        self.packets += packets;
        self.syscalls += 1;
        if now_ns >= self.due_ns {
            self.publish();
            self.due_ns = now_ns.saturating_add(PUBLISH_NS);
        }
    }

    fn publish(&mut self) {
        if self.syscalls > 0 {
            self.counters.add(self.bytes, self.packets);
            self.counters.add_syscalls(self.syscalls);
            (self.bytes, self.packets, self.syscalls) = (0, 0, 0);
        }
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        self.publish();
    }
}

/// First to last send of a loop.
#[derive(Debug, Default)]
struct Span {
    first_ns: Option<u64>,
    last_ns: u64,
}

impl Span {
    #[inline]
    fn mark(&mut self, started_ns: u64, ended_ns: u64) {
        self.first_ns.get_or_insert(started_ns);
        self.last_ns = ended_ns;
    }

    fn ns(&self) -> u64 {
        self.first_ns
            .map_or(0, |first| self.last_ns.saturating_sub(first))
    }
}

fn invalid_input(what: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, what)
}

#[cfg(test)]
mod tests;
