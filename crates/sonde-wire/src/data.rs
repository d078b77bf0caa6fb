//! Fixed-layout binary structures: the preamble, data-channel joins and UDP datagram headers.
//! All integers are big-endian.

use crate::auth::JOIN_MAC_LEN;
use crate::{Error, Token};

/// The magic that opens every TCP connection to a sonde agent.
pub const MAGIC: [u8; 4] = *b"SNDE";
/// The magic of a UDP join request datagram.
pub const UDP_JOIN_MAGIC: [u8; 4] = *b"SNDJ";
/// The magic of a UDP join acknowledgement datagram.
pub const UDP_ACK_MAGIC: [u8; 4] = *b"SNDA";
/// The control protocol version this build speaks. Version 2 added authentication (nonces in
/// `Hello` and `Welcome`, a proof in `Start`, `Describe`, the host configuration moved from
/// `Welcome` to `Accepted`) and the MAC in [`UdpJoin`].
pub const PROTOCOL_VERSION: u16 = 2;
/// Length of [`Preamble`] on the wire.
pub const PREAMBLE_LEN: usize = 8;
/// Length of [`DataJoin`] on the wire.
pub const DATA_JOIN_LEN: usize = 16;
/// Length of [`UdpJoin`] on the wire: 16 bytes it signs, then a [`JOIN_MAC_LEN`]-byte MAC.
pub const UDP_JOIN_LEN: usize = 16 + JOIN_MAC_LEN;
/// The part of a [`UdpJoin`] its MAC covers.
const UDP_JOIN_SIGNED_LEN: usize = 16;
/// Length of [`CrrJoin`] on the wire.
pub const CRR_JOIN_LEN: usize = 16;
/// Length of [`DataHeader`] on the wire: the smallest UDP throughput payload.
pub const DATA_HEADER_LEN: usize = 16;
/// Length of [`PpsHeader`] on the wire: the smallest pps payload (sockperf's header size).
pub const PPS_HEADER_LEN: usize = 14;
/// Sequence numbers a [`PpsHeader`] carries: 48 bits, 2.8e14 datagrams per flow (over 32 days
/// at 100 million datagrams per second), so they never wrap within a test.
pub const PPS_SEQ_LIMIT: u64 = 1 << 48;

/// What a TCP connection to the agent's port carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    /// Length-prefixed [`crate::ControlMsg`] frames.
    Control,
    /// Test data for a session, after a [`DataJoin`].
    Data,
    /// One connection-rate exchange, after a [`CrrJoin`]: the request, the agent's response,
    /// then the client closes.
    Crr,
}

impl Channel {
    const CONTROL: u8 = 0x01;
    const DATA: u8 = 0x02;
    const CRR: u8 = 0x03;
}

/// The first 8 bytes of every TCP connection: `SNDE`, version, channel kind, reserved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Preamble {
    /// Protocol version of the sender.
    pub version: u16,
    /// What the connection carries.
    pub channel: Channel,
}

impl Preamble {
    /// Writes the preamble.
    pub fn encode(&self) -> [u8; PREAMBLE_LEN] {
        let mut b = [0u8; PREAMBLE_LEN];
        b[..4].copy_from_slice(&MAGIC);
        b[4..6].copy_from_slice(&self.version.to_be_bytes());
        b[6] = match self.channel {
            Channel::Control => Channel::CONTROL,
            Channel::Data => Channel::DATA,
            Channel::Crr => Channel::CRR,
        };
        b
    }

    /// Reads a preamble. The version is returned as sent; [`Preamble::check_version`] compares it.
    pub fn decode(b: &[u8]) -> Result<Self, Error> {
        let b = fixed::<PREAMBLE_LEN>(b)?;
        let magic = [b[0], b[1], b[2], b[3]];
        if magic != MAGIC {
            return Err(Error::BadMagic(magic));
        }
        let channel = match b[6] {
            Channel::CONTROL => Channel::Control,
            Channel::DATA => Channel::Data,
            Channel::CRR => Channel::Crr,
            other => return Err(Error::Channel(other)),
        };
        Ok(Self {
            version: u16::from_be_bytes([b[4], b[5]]),
            channel,
        })
    }

    /// Fails unless the peer speaks [`PROTOCOL_VERSION`].
    pub fn check_version(&self) -> Result<(), Error> {
        if self.version == PROTOCOL_VERSION {
            Ok(())
        } else {
            Err(Error::Version {
                theirs: self.version,
                ours: PROTOCOL_VERSION,
            })
        }
    }
}

/// Sent by a TCP data channel right after its [`Preamble`]: which session and which stream.
///
/// Layout: token (8), stream (4), flags (4). Flag `0x0000_0001` asks the agent for a
/// [`crate::JoinAnswer`] (whether the session took the channel, and which agent answered); a
/// client sets it only for an agent that named itself in `Accepted`, since an older agent
/// ignores the flags and answers nothing. Unknown flag bits are ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataJoin {
    /// The session's secret token, from [`crate::ControlMsg::Accepted`].
    pub token: Token,
    /// Stream index, 0-based.
    pub stream: u32,
    /// Answer the join with a [`crate::JoinAnswer`].
    pub answer: bool,
}

impl DataJoin {
    const FLAG_ANSWER: u32 = 0x0000_0001;

    /// Writes the join.
    pub fn encode(&self) -> [u8; DATA_JOIN_LEN] {
        let mut b = [0u8; DATA_JOIN_LEN];
        b[..8].copy_from_slice(&self.token.0.to_be_bytes());
        b[8..12].copy_from_slice(&self.stream.to_be_bytes());
        let flags = if self.answer { Self::FLAG_ANSWER } else { 0 };
        b[12..16].copy_from_slice(&flags.to_be_bytes());
        b
    }

    /// Reads a join.
    pub fn decode(b: &[u8]) -> Result<Self, Error> {
        let b = fixed::<DATA_JOIN_LEN>(b)?;
        let flags = u32::from_be_bytes([b[12], b[13], b[14], b[15]]);
        Ok(Self {
            token: Token(be_u64(&b[..8])),
            stream: u32::from_be_bytes([b[8], b[9], b[10], b[11]]),
            answer: flags & Self::FLAG_ANSWER != 0,
        })
    }
}

/// Sent by a connection-rate (`crr`) connection right after its [`Preamble`]: which session,
/// which worker, how large a response, and how the client will close. The request
/// ([`crate::TestSpec::msg_size`] bytes) follows at once.
///
/// Layout: token (8), worker (2), flags (2), response size (4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CrrJoin {
    /// The session's secret token, from [`crate::ControlMsg::Accepted`].
    pub token: Token,
    /// Worker index, 0-based (below [`crate::TestSpec::streams`]).
    pub worker: u16,
    /// The client closes with a reset (`SO_LINGER` 0) rather than a FIN, so the agent counts a
    /// reset after the response as a completed exchange.
    pub rst: bool,
    /// Bytes the agent answers with.
    pub response_size: u32,
    /// An agent without a session of this token answers with a [`crate::JoinAnswer`] (which
    /// starts `S`, where a response is zeros) instead of closing: behind a load balancer the
    /// client tells a connection placed on another agent from a failed one. Set only for an
    /// agent that named itself in `Accepted`.
    pub answer: bool,
}

impl CrrJoin {
    const FLAG_RST: u16 = 0x0001;
    const FLAG_ANSWER: u16 = 0x0002;

    /// Writes the join.
    pub fn encode(&self) -> [u8; CRR_JOIN_LEN] {
        let mut b = [0u8; CRR_JOIN_LEN];
        b[..8].copy_from_slice(&self.token.0.to_be_bytes());
        b[8..10].copy_from_slice(&self.worker.to_be_bytes());
        let mut flags = if self.rst { Self::FLAG_RST } else { 0 };
        if self.answer {
            flags |= Self::FLAG_ANSWER;
        }
        b[10..12].copy_from_slice(&flags.to_be_bytes());
        b[12..16].copy_from_slice(&self.response_size.to_be_bytes());
        b
    }

    /// Reads a join. Unknown flag bits are ignored (a later version may add some).
    pub fn decode(b: &[u8]) -> Result<Self, Error> {
        let b = fixed::<CRR_JOIN_LEN>(b)?;
        let flags = u16::from_be_bytes([b[10], b[11]]);
        Ok(Self {
            token: Token(be_u64(&b[..8])),
            worker: u16::from_be_bytes([b[8], b[9]]),
            rst: flags & Self::FLAG_RST != 0,
            response_size: u32::from_be_bytes([b[12], b[13], b[14], b[15]]),
            answer: flags & Self::FLAG_ANSWER != 0,
        })
    }
}

/// A UDP datagram that binds the sender's address and port to a session's flow.
///
/// The client sends `SNDJ` joins to the agent's port until the agent answers with the same
/// structure under `SNDA` from the per-flow socket; data follows only after that. With a shared
/// secret the request carries a MAC of its first 16 bytes under the session's key
/// ([`crate::auth::SessionKey::join_mac`]); without, zeros. The acknowledgement echoes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UdpJoin {
    /// True for the agent's acknowledgement, false for the client's request.
    pub ack: bool,
    /// Flow (stream) index, 0-based.
    pub flow: u16,
    /// The session's secret token.
    pub token: Token,
    /// MAC of [`UdpJoin::signed`] under the session key; zeros when the agent has no secret.
    pub mac: [u8; JOIN_MAC_LEN],
}

impl UdpJoin {
    /// Writes the join or its acknowledgement.
    pub fn encode(&self) -> [u8; UDP_JOIN_LEN] {
        let mut b = [0u8; UDP_JOIN_LEN];
        b[..4].copy_from_slice(if self.ack {
            &UDP_ACK_MAGIC
        } else {
            &UDP_JOIN_MAGIC
        });
        b[4..6].copy_from_slice(&PROTOCOL_VERSION.to_be_bytes());
        b[6..8].copy_from_slice(&self.flow.to_be_bytes());
        b[8..16].copy_from_slice(&self.token.0.to_be_bytes());
        b[UDP_JOIN_SIGNED_LEN..].copy_from_slice(&self.mac);
        b
    }

    /// The bytes the MAC covers: the encoded join up to the MAC (magic, version, flow, token).
    pub fn signed(&self) -> [u8; UDP_JOIN_SIGNED_LEN] {
        let mut b = [0u8; UDP_JOIN_SIGNED_LEN];
        b.copy_from_slice(&self.encode()[..UDP_JOIN_SIGNED_LEN]);
        b
    }

    /// Reads a join; anything else (junk, data, another version) is an error.
    pub fn decode(b: &[u8]) -> Result<Self, Error> {
        if b.len() != UDP_JOIN_LEN {
            return Err(Error::Truncated {
                need: UDP_JOIN_LEN,
                have: b.len(),
            });
        }
        let magic = [b[0], b[1], b[2], b[3]];
        let ack = match magic {
            UDP_JOIN_MAGIC => false,
            UDP_ACK_MAGIC => true,
            _ => return Err(Error::BadMagic(magic)),
        };
        let version = u16::from_be_bytes([b[4], b[5]]);
        if version != PROTOCOL_VERSION {
            return Err(Error::Version {
                theirs: version,
                ours: PROTOCOL_VERSION,
            });
        }
        Ok(Self {
            ack,
            flow: u16::from_be_bytes([b[6], b[7]]),
            token: Token(be_u64(&b[8..16])),
            mac: *fixed::<JOIN_MAC_LEN>(&b[UDP_JOIN_SIGNED_LEN..])?,
        })
    }
}

/// The header at the front of each UDP throughput and pps datagram.
///
/// The payload after it is filler. Sequence numbers are 64-bit and start at 0 per flow, so they
/// never wrap; the send time lets the receiver compute RFC 3550 jitter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataHeader {
    /// Per-flow sequence number, from 0.
    pub seq: u64,
    /// Sender's clock at send, nanoseconds since the flow started.
    pub send_ns: u64,
}

impl DataHeader {
    /// Writes the header into the first [`DATA_HEADER_LEN`] bytes of `buf`.
    ///
    /// # Panics
    /// If `buf` is shorter than [`DATA_HEADER_LEN`]: callers size their buffers once, up front.
    pub fn write(&self, buf: &mut [u8]) {
        buf[..8].copy_from_slice(&self.seq.to_be_bytes());
        buf[8..16].copy_from_slice(&self.send_ns.to_be_bytes());
    }

    /// Reads the header from the front of a datagram.
    pub fn read(buf: &[u8]) -> Result<Self, Error> {
        let b = fixed::<DATA_HEADER_LEN>(buf)?;
        Ok(Self {
            seq: be_u64(&b[..8]),
            send_ns: be_u64(&b[8..16]),
        })
    }
}

/// The header of pps datagrams shorter than a [`DataHeader`] (14 and 15 bytes): a 48-bit
/// sequence number, then the 64-bit send time. 48 bits never wrap within a test
/// ([`PPS_SEQ_LIMIT`]), so the receiver's loss, duplicate and reorder accounting is exactly that
/// of the 64-bit header; the only cost is the two bytes, which is why sizes of 16 and more keep
/// the [`DataHeader`] (and agents without this header refuse 14 and 15 as before).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PpsHeader {
    /// Per-flow sequence number, from 0, below [`PPS_SEQ_LIMIT`].
    pub seq: u64,
    /// Sender's clock at send, nanoseconds since the flow started.
    pub send_ns: u64,
}

impl PpsHeader {
    /// Writes the header into the first [`PPS_HEADER_LEN`] bytes of `buf`; a `seq` of
    /// [`PPS_SEQ_LIMIT`] or more is written modulo it.
    ///
    /// # Panics
    /// If `buf` is shorter than [`PPS_HEADER_LEN`]: callers size their buffers once, up front.
    pub fn write(&self, buf: &mut [u8]) {
        buf[..6].copy_from_slice(&self.seq.to_be_bytes()[2..]);
        buf[6..14].copy_from_slice(&self.send_ns.to_be_bytes());
    }

    /// Reads the header from the front of a datagram.
    pub fn read(buf: &[u8]) -> Result<Self, Error> {
        let b = fixed::<PPS_HEADER_LEN>(buf)?;
        let mut seq = [0u8; 8];
        seq[2..].copy_from_slice(&b[..6]);
        Ok(Self {
            seq: u64::from_be_bytes(seq),
            send_ns: be_u64(&b[6..14]),
        })
    }
}

/// Bytes of an iperf3 UDP header with a 32-bit sequence number (iperf3's default).
pub const IPERF3_UDP_HEADER_LEN_32: usize = 12;
/// Bytes of an iperf3 UDP header with a 64-bit sequence number (`udp_counters_64bit`).
pub const IPERF3_UDP_HEADER_LEN_64: usize = 16;

/// The header at the front of every iperf3 UDP datagram (docs/protocols/iperf3.md §8): the sender's clock
/// as seconds and microseconds, then the sequence number, all big-endian. The sequence number
/// starts at 1 per stream and is 32 bits wide unless the client negotiated
/// `udp_counters_64bit`.
///
/// ```
/// use sonde_wire::Iperf3UdpHeader;
/// // Captured from iperf3 3.12: sec = 323, usec = 641419, seq = 1, 32-bit counters.
/// let bytes = [0, 0, 0x01, 0x43, 0, 0x09, 0xc9, 0x8b, 0, 0, 0, 1];
/// let h = Iperf3UdpHeader::read(&bytes, false).unwrap();
/// assert_eq!(h, Iperf3UdpHeader { sec: 323, usec: 641_419, seq: 1 });
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Iperf3UdpHeader {
    /// Sender's clock, whole seconds (truncated to 32 bits).
    pub sec: u32,
    /// Sender's clock, microseconds within the second (0 to 999,999).
    pub usec: u32,
    /// Sequence number, from 1.
    pub seq: u64,
}

impl Iperf3UdpHeader {
    /// The header's length for the given counter width.
    pub fn len(seq64: bool) -> usize {
        if seq64 {
            IPERF3_UDP_HEADER_LEN_64
        } else {
            IPERF3_UDP_HEADER_LEN_32
        }
    }

    /// A header stamped with `ns` nanoseconds of the sender's clock.
    pub fn at(seq: u64, ns: u64) -> Self {
        Self {
            // iperf3 itself truncates its clock's seconds to 32 bits.
            #[allow(clippy::cast_possible_truncation)]
            sec: (ns / 1_000_000_000) as u32,
            #[allow(clippy::cast_possible_truncation)]
            usec: ((ns % 1_000_000_000) / 1_000) as u32,
            seq,
        }
    }

    /// The sender's clock in nanoseconds (modulo 2^32 seconds), for jitter.
    pub fn ns(&self) -> u64 {
        u64::from(self.sec) * 1_000_000_000 + u64::from(self.usec) * 1_000
    }

    /// Writes the header into the front of `buf`; a 32-bit counter keeps the low 32 bits of
    /// `seq`, as iperf3 does.
    ///
    /// # Panics
    /// If `buf` is shorter than [`Iperf3UdpHeader::len`]: callers size their buffers once.
    pub fn write(&self, buf: &mut [u8], seq64: bool) {
        buf[..4].copy_from_slice(&self.sec.to_be_bytes());
        buf[4..8].copy_from_slice(&self.usec.to_be_bytes());
        if seq64 {
            buf[8..16].copy_from_slice(&self.seq.to_be_bytes());
        } else {
            #[allow(clippy::cast_possible_truncation)]
            buf[8..12].copy_from_slice(&(self.seq as u32).to_be_bytes());
        }
    }

    /// Reads the header from the front of a datagram.
    pub fn read(buf: &[u8], seq64: bool) -> Result<Self, Error> {
        let need = Self::len(seq64);
        if buf.len() < need {
            return Err(Error::Truncated {
                need,
                have: buf.len(),
            });
        }
        let be32 = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        Ok(Self {
            sec: be32(&buf[..4]),
            usec: be32(&buf[4..8]),
            seq: if seq64 {
                be_u64(&buf[8..16])
            } else {
                u64::from(be32(&buf[8..12]))
            },
        })
    }
}

/// Latency datagrams carry only the sequence number, in the first `min(8, size)` bytes.
///
/// A message shorter than 8 bytes carries the low bytes of the sequence number; the receiver
/// widens it with [`widen_seq`]. The agent echoes the datagram unchanged.
pub fn write_latency_seq(seq: u64, buf: &mut [u8]) {
    let n = buf.len().min(8);
    buf[..n].copy_from_slice(&seq.to_be_bytes()[8 - n..]);
}

/// Reads the (possibly truncated) sequence number of a latency datagram, and how many bytes of
/// it were present (0 to 8).
pub fn read_latency_seq(buf: &[u8]) -> (u64, usize) {
    let n = buf.len().min(8);
    let mut b = [0u8; 8];
    b[8 - n..].copy_from_slice(&buf[..n]);
    (u64::from_be_bytes(b), n)
}

/// Widens a sequence number of which only the low `bytes` bytes were carried to the value
/// nearest `expected` (RFC 3550 appendix A.1 does the same for 16-bit RTP sequence numbers).
pub fn widen_seq(low: u64, bytes: usize, expected: u64) -> u64 {
    if bytes >= 8 {
        return low;
    }
    if bytes == 0 {
        return expected;
    }
    let span = 1u64 << (8 * bytes);
    let half = span / 2;
    let base = expected & !(span - 1);
    let candidate = base | low;
    if candidate > expected.saturating_add(half) && candidate >= span {
        candidate - span
    } else if candidate.saturating_add(half) < expected {
        // Past u64::MAX the nearest value with these low bytes is the candidate itself (found
        // by fuzz/: saturating gave u64::MAX, whose low bytes are not the ones carried).
        candidate.checked_add(span).unwrap_or(candidate)
    } else {
        candidate
    }
}

pub(crate) fn fixed<const N: usize>(b: &[u8]) -> Result<&[u8; N], Error> {
    b.get(..N)
        .and_then(|s| s.try_into().ok())
        .ok_or(Error::Truncated {
            need: N,
            have: b.len(),
        })
}

pub(crate) fn be_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_be_bytes(a)
}

#[cfg(test)]
mod tests {
    #[test]
    fn iperf3_udp_header_matches_captured_bytes_and_round_trips() {
        // docs/protocols/iperf3.md §8 [verified]: 32-bit `00000143 0009c98b 00000001`, 64-bit
        // `0000017a 000d0e25 0000000000000001`.
        let h32 = [0, 0, 0x01, 0x43, 0, 0x09, 0xc9, 0x8b, 0, 0, 0, 1];
        let h64 = [
            0, 0, 0x01, 0x7a, 0, 0x0d, 0x0e, 0x25, 0, 0, 0, 0, 0, 0, 0, 1,
        ];
        let a = Iperf3UdpHeader::read(&h32, false).unwrap();
        assert_eq!((a.sec, a.usec, a.seq), (323, 641_419, 1));
        let b = Iperf3UdpHeader::read(&h64, true).unwrap();
        assert_eq!((b.sec, b.usec, b.seq), (378, 855_589, 1));
        let mut buf = [0u8; 16];
        a.write(&mut buf, false);
        assert_eq!(buf[..12], h32);
        b.write(&mut buf, true);
        assert_eq!(buf, h64);
        assert!(Iperf3UdpHeader::read(&h32[..11], false).is_err());
        assert!(Iperf3UdpHeader::read(&h32, true).is_err());
        let t = Iperf3UdpHeader::at(7, 323_641_419_999);
        assert_eq!((t.sec, t.usec, t.seq), (323, 641_419, 7));
        assert_eq!(t.ns(), 323_641_419_000);
    }

    use super::*;
    use proptest::prelude::*;

    #[test]
    fn preamble_layout_is_stable() {
        let p = Preamble {
            version: 1,
            channel: Channel::Data,
        };
        assert_eq!(p.encode(), [b'S', b'N', b'D', b'E', 0, 1, 2, 0]);
        assert_eq!(Preamble::decode(&p.encode()), Ok(p));
    }

    #[test]
    fn preamble_rejects_junk_and_other_versions() {
        assert!(matches!(
            Preamble::decode(b"GET / HTTP/1.1"),
            Err(Error::BadMagic(_))
        ));
        assert!(matches!(
            Preamble::decode(b"SNDE"),
            Err(Error::Truncated { need: 8, have: 4 })
        ));
        let p = Preamble::decode(&[b'S', b'N', b'D', b'E', 0, 9, 1, 0]).unwrap();
        assert_eq!(
            p.check_version(),
            Err(Error::Version {
                theirs: 9,
                ours: PROTOCOL_VERSION
            })
        );
        assert_eq!(
            Preamble::decode(&[b'S', b'N', b'D', b'E', 0, 1, 7, 0]),
            Err(Error::Channel(7))
        );
    }

    #[test]
    fn crr_join_layout_is_stable() {
        let p = Preamble {
            version: 1,
            channel: Channel::Crr,
        };
        assert_eq!(p.encode(), [b'S', b'N', b'D', b'E', 0, 1, 3, 0]);
        assert_eq!(Preamble::decode(&p.encode()), Ok(p));
        let j = CrrJoin {
            token: Token(0x0102_0304_0506_0708),
            worker: 0x0a0b,
            rst: true,
            response_size: 0x0001_0000,
            answer: false,
        };
        assert_eq!(
            j.encode(),
            [1, 2, 3, 4, 5, 6, 7, 8, 0x0a, 0x0b, 0, 1, 0, 1, 0, 0]
        );
        assert_eq!(CrrJoin::decode(&j.encode()), Ok(j));
        let fin = CrrJoin { rst: false, ..j };
        assert_eq!(fin.encode()[10..12], [0, 0]);
        assert_eq!(CrrJoin::decode(&fin.encode()), Ok(fin));
        // Flag bits this version does not know are ignored.
        let mut later = fin.encode();
        later[10] = 0x80;
        assert_eq!(CrrJoin::decode(&later), Ok(fin));
        assert_eq!(
            CrrJoin::decode(&j.encode()[..15]),
            Err(Error::Truncated { need: 16, have: 15 })
        );
    }

    #[test]
    fn udp_join_layout_is_stable() {
        let j = UdpJoin {
            ack: false,
            flow: 3,
            token: Token(0x0102_0304_0506_0708),
            mac: [0xee; JOIN_MAC_LEN],
        };
        let mut want = vec![b'S', b'N', b'D', b'J', 0, 2, 0, 3, 1, 2, 3, 4, 5, 6, 7, 8];
        want.extend([0xee; JOIN_MAC_LEN]);
        assert_eq!(j.encode().to_vec(), want);
        assert_eq!(j.signed()[..], want[..16]);
        let a = UdpJoin { ack: true, ..j };
        assert_eq!(&a.encode()[..4], b"SNDA");
        assert_eq!(UdpJoin::decode(&a.encode()), Ok(a));
    }

    #[test]
    fn data_header_round_trips_at_the_front_of_a_payload() {
        let mut buf = [0xAAu8; 18];
        let h = DataHeader {
            seq: u64::MAX - 1,
            send_ns: 123_456_789,
        };
        h.write(&mut buf);
        assert_eq!(DataHeader::read(&buf), Ok(h));
        assert_eq!(buf[16..], [0xAA, 0xAA]);
        assert!(DataHeader::read(&buf[..15]).is_err());
    }

    #[test]
    fn pps_header_round_trips_in_14_bytes() {
        let mut buf = [0xAAu8; 15];
        let h = PpsHeader {
            seq: PPS_SEQ_LIMIT - 1,
            send_ns: u64::MAX - 7,
        };
        h.write(&mut buf);
        assert_eq!(PpsHeader::read(&buf), Ok(h));
        assert_eq!(PpsHeader::read(&buf[..PPS_HEADER_LEN]), Ok(h));
        assert_eq!(buf[14], 0xAA, "the filler after the header is untouched");
        assert!(PpsHeader::read(&buf[..13]).is_err());
        // The layout: 48-bit sequence number, then the 64-bit send time, big-endian.
        let mut wire = [0u8; PPS_HEADER_LEN];
        PpsHeader {
            seq: 0x0102_0304_0506,
            send_ns: 0x0708_090a_0b0c_0d0e,
        }
        .write(&mut wire);
        assert_eq!(wire, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]);
        // Beyond 48 bits the sequence number is carried modulo 2^48.
        PpsHeader {
            seq: PPS_SEQ_LIMIT + 5,
            send_ns: 0,
        }
        .write(&mut wire);
        assert_eq!(PpsHeader::read(&wire).map(|h| h.seq), Ok(5));
    }

    #[test]
    fn latency_seq_truncates_and_widens() {
        let mut one = [0u8; 1];
        write_latency_seq(0x1_02ff, &mut one);
        assert_eq!(one, [0xff]);
        let (low, n) = read_latency_seq(&one);
        assert_eq!((low, n), (0xff, 1));
        // The next expected is 0x1_0300: a late 0x1_02ff is the nearest match.
        assert_eq!(widen_seq(low, n, 0x1_0300), 0x1_02ff);
        // Wrap forward: expected 0x2ff, received 0x00 -> 0x300.
        assert_eq!(widen_seq(0x00, 1, 0x2ff), 0x300);
        assert_eq!(widen_seq(5, 1, 3), 5);
        let mut full = [0u8; 20];
        write_latency_seq(42, &mut full);
        assert_eq!(read_latency_seq(&full), (42, 8));
    }

    proptest! {
        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = Preamble::decode(&bytes);
            let _ = DataJoin::decode(&bytes);
            let _ = CrrJoin::decode(&bytes);
            let _ = UdpJoin::decode(&bytes);
            let _ = DataHeader::read(&bytes);
            let _ = PpsHeader::read(&bytes);
            let _ = read_latency_seq(&bytes);
        }

        #[test]
        fn pps_header_round_trips_any_seq_below_the_limit(seq in 0..PPS_SEQ_LIMIT, send_ns: u64) {
            let mut buf = [0u8; PPS_HEADER_LEN];
            PpsHeader { seq, send_ns }.write(&mut buf);
            prop_assert_eq!(PpsHeader::read(&buf), Ok(PpsHeader { seq, send_ns }));
        }

        #[test]
        fn widen_recovers_any_seq_near_expected(seq in 0u64..1u64 << 40, delta in -100i64..100, bytes in 1usize..8) {
            let expected = seq.saturating_add_signed(delta);
            let mut buf = vec![0u8; bytes];
            write_latency_seq(seq, &mut buf);
            let (low, n) = read_latency_seq(&buf);
            // Within half the span of the carried bytes the widened value is exact.
            prop_assume!(bytes >= 2 || delta.unsigned_abs() < 128);
            prop_assert_eq!(widen_seq(low, n, expected), seq);
        }

        #[test]
        fn joins_round_trip(token in any::<u64>(), stream in any::<u32>(), answer in any::<bool>(), flow in any::<u16>(), ack in any::<bool>(), mac in any::<[u8; JOIN_MAC_LEN]>()) {
            let d = DataJoin { token: Token(token), stream, answer };
            prop_assert_eq!(DataJoin::decode(&d.encode()), Ok(d));
            let u = UdpJoin { ack, flow, token: Token(token), mac };
            prop_assert_eq!(UdpJoin::decode(&u.encode()), Ok(u));
        }
    }
}
