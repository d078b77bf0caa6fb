//! How a latency message looks on the wire ([`Framing`]: sonde's or sockperf's), and which
//! message a reply answers.

use sonde_wire::sockperf::{self, Flags};
use sonde_wire::stamps;
use sonde_wire::{read_latency_seq, widen_seq, write_latency_seq, UdpJoin, UDP_JOIN_LEN};

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
    pub(super) fn size_range(self, sonde_max: u32, sockperf_max: u32) -> (u32, u32) {
        match self {
            Self::Sonde => (1, sonde_max),
            Self::Sockperf => (sockperf::MIN_MSG, sockperf_max),
        }
    }

    /// Fills a message buffer once, before the first send.
    pub(super) fn prepare(self, out: &mut [u8]) {
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
    pub(super) fn stamp(self, seq: u64, out: &mut [u8]) {
        match self {
            Self::Sonde => write_latency_seq(seq, out),
            Self::Sockperf => {
                let _ = sockperf::set_seq(seq.saturating_add(1), out);
            }
        }
    }

    /// The seq (from 0) of the message a UDP datagram answers, or `None` when it is not a reply.
    pub(super) fn reply_seq(self, datagram: &[u8], msg: usize, expected: u64) -> Option<u64> {
        match self {
            Self::Sonde => reply_seq(datagram, msg, expected),
            Self::Sockperf => sockperf_reply_seq(datagram, msg),
        }
    }
}

/// The seq (from 0) of a sockperf reply of `msg` bytes, or `None` for anything else: a request
/// (client flag set, e.g. our own message reflected), a warm-up, another size, seq 0.
pub(super) fn sockperf_reply_seq(datagram: &[u8], msg: usize) -> Option<u64> {
    if datagram.len() != msg {
        return None;
    }
    let h = sockperf::Header::decode(datagram).ok()?;
    let is_reply = !h.flags.contains(Flags::CLIENT) && !h.flags.contains(Flags::WARMUP);
    (is_reply && h.length as usize == msg)
        .then(|| h.seq.checked_sub(1))
        .flatten()
}

/// The sequence number a UDP reply answers: sonde's and sockperf's framings, and the one-way
/// layout (the seq with the stamps' flag bits, in a full-size reply).
pub(super) fn udp_reply_seq(
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
/// The seq of a latency reply, or `None` for anything else: a wrong size, or a stray join
/// acknowledgement from the agent (a latency seq is below 2^62, so its first byte is never the
/// `S` of `SNDA` even when the message is exactly [`UDP_JOIN_LEN`] bytes long).
pub(super) fn reply_seq(datagram: &[u8], msg: usize, expected: u64) -> Option<u64> {
    if datagram.len() == UDP_JOIN_LEN && UdpJoin::decode(datagram).is_ok() {
        return None;
    }
    if datagram.len() != msg {
        return None;
    }
    let (low, bytes) = read_latency_seq(datagram);
    Some(widen_seq(low, bytes, expected))
}
