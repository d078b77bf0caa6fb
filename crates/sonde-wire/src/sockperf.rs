//! sockperf's message format (Mellanox/NVIDIA sockperf 3.x; docs/protocols/sockperf.md).
//!
//! Every sockperf message, UDP datagram or stretch of a TCP stream, starts with a 14-byte
//! big-endian header: `seq` (u64), `flags` (u16) and `length` (u32, the **total** message length,
//! header included). There is no handshake: a server answers the messages whose flags ask for a
//! reply by echoing them with the [`Flags::CLIENT`] bit cleared.
//!
//! ```
//! use sonde_wire::sockperf::{parse, Flags, Header, Parsed, MAX_UDP_MSG};
//! // A 14-byte ping-pong request as `sockperf pp` sends it (seq 1, CLIENT | PONG_REQUEST).
//! let wire = [0, 0, 0, 0, 0, 0, 0, 1, 0x00, 0x03, 0, 0, 0, 0x0e];
//! let Parsed::Message(h) = parse(&wire, MAX_UDP_MSG) else { panic!() };
//! assert_eq!(h, Header { seq: 1, flags: Flags::CLIENT | Flags::PONG_REQUEST, length: 14 });
//! ```

use crate::Error;

/// Length of the header on the wire, and the smallest valid message.
pub const HEADER_LEN: usize = 14;
/// The smallest message, bytes (a header and no payload; sockperf's default `-m`).
pub const MIN_MSG: u32 = HEADER_LEN as u32;
/// The largest UDP message: 65,535 less the IPv4 (20) and UDP (8) headers.
pub const MAX_UDP_MSG: u32 = 65_507;
/// The largest message a `sockperf server` accepts by default, TCP or UDP (its "max payload";
/// raised with `sockperf server -m`). A TCP message above it makes sockperf close the connection.
pub const SERVER_MAX_MSG: u32 = 65_507;
/// The largest TCP message a sockperf client sends (`-m`, TCP): 2^20 − 1.
pub const MAX_TCP_MSG: u32 = 0x0f_ffff;
/// sockperf's default port, TCP and UDP.
pub const DEFAULT_PORT: u16 = 11_111;

/// The 16-bit flag field. Bits 3 to 15 are reserved (sent as 0) and are kept as they come.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Flags(pub u16);

impl Flags {
    /// Set on everything a client sends; cleared on a server's reply. A server ignores messages
    /// without it, a client ignores messages with it.
    pub const CLIENT: Flags = Flags(0x0001);
    /// "Reply to this message."
    pub const PONG_REQUEST: Flags = Flags(0x0002);
    /// A warm-up message (multicast only in practice): neither counted nor answered.
    pub const WARMUP: Flags = Flags(0x0004);

    /// Whether every bit of `other` is set.
    pub fn contains(self, other: Flags) -> bool {
        self.0 & other.0 == other.0
    }

    /// These flags with the bits of `other` cleared.
    #[must_use]
    pub fn without(self, other: Flags) -> Flags {
        Flags(self.0 & !other.0)
    }
}

impl std::ops::BitOr for Flags {
    type Output = Flags;
    fn bitor(self, rhs: Flags) -> Flags {
        Flags(self.0 | rhs.0)
    }
}

/// The 14-byte message header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Sequence number: a client starts at 1 and adds 1 per message on a socket.
    pub seq: u64,
    /// What the message is and whether it wants a reply.
    pub flags: Flags,
    /// Total message length in bytes, header included (valid only when at least 14).
    pub length: u32,
}

impl Header {
    /// Byte offset of the flags field.
    const FLAGS_AT: usize = 8;
    /// Byte offset of the length field.
    const LENGTH_AT: usize = 10;

    /// The header's 14 bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[..Self::FLAGS_AT].copy_from_slice(&self.seq.to_be_bytes());
        b[Self::FLAGS_AT..Self::LENGTH_AT].copy_from_slice(&self.flags.0.to_be_bytes());
        b[Self::LENGTH_AT..].copy_from_slice(&self.length.to_be_bytes());
        b
    }

    /// Writes the header at the front of `msg`.
    ///
    /// # Errors
    /// [`Error::Truncated`] when `msg` is shorter than [`HEADER_LEN`].
    pub fn write(&self, msg: &mut [u8]) -> Result<(), Error> {
        let have = msg.len();
        let head = msg.get_mut(..HEADER_LEN).ok_or(Error::Truncated {
            need: HEADER_LEN,
            have,
        })?;
        head.copy_from_slice(&self.encode());
        Ok(())
    }

    /// Reads the header at the front of `b`, whatever its `length` says (see [`parse`] for the
    /// checks a receiver needs).
    ///
    /// # Errors
    /// [`Error::Truncated`] when `b` is shorter than [`HEADER_LEN`].
    pub fn decode(b: &[u8]) -> Result<Self, Error> {
        let Some(head) = b.get(..HEADER_LEN) else {
            return Err(Error::Truncated {
                need: HEADER_LEN,
                have: b.len(),
            });
        };
        let mut seq = [0u8; 8];
        seq.copy_from_slice(&head[..Self::FLAGS_AT]);
        let flags = u16::from_be_bytes([head[Self::FLAGS_AT], head[Self::FLAGS_AT + 1]]);
        let mut length = [0u8; 4];
        length.copy_from_slice(&head[Self::LENGTH_AT..]);
        Ok(Self {
            seq: u64::from_be_bytes(seq),
            flags: Flags(flags),
            length: u32::from_be_bytes(length),
        })
    }

    /// Whether a server counts this message: the client flag is set and it is not a warm-up.
    pub fn counted_by_server(&self) -> bool {
        self.flags.contains(Flags::CLIENT) && !self.flags.contains(Flags::WARMUP)
    }

    /// Whether a server answers this message: counted, and asking for a reply.
    pub fn wants_reply(&self) -> bool {
        self.counted_by_server() && self.flags.contains(Flags::PONG_REQUEST)
    }
}

/// What the front of a receive buffer holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parsed {
    /// Not a whole message yet: at least `need` bytes in all are required (TCP: read more).
    Incomplete {
        /// Bytes needed in total from the front of the buffer.
        need: usize,
    },
    /// A whole message of `header.length` bytes is at the front of the buffer.
    Message(Header),
    /// `length` is below [`HEADER_LEN`]: the stream can never be framed again (a 3.7 server
    /// spins forever on a zero length). Drop the datagram or close the connection.
    TooShort(Header),
    /// `length` is above the receiver's maximum: drop the datagram or close the connection
    /// (what sockperf does), without waiting for, or buffering, its body.
    TooLong(Header),
}

/// Frames the message at the front of `buf`, accepting lengths from [`MIN_MSG`] to `max_len`.
/// The length is checked as soon as the header is in, so an oversized message is refused before
/// any of its body is buffered.
pub fn parse(buf: &[u8], max_len: u32) -> Parsed {
    let Ok(header) = Header::decode(buf) else {
        return Parsed::Incomplete { need: HEADER_LEN };
    };
    if header.length < MIN_MSG {
        return Parsed::TooShort(header);
    }
    if header.length > max_len {
        return Parsed::TooLong(header);
    }
    // `length` <= `max_len` (a u32): it fits in a usize on every target sonde builds for.
    let need = usize::try_from(header.length).unwrap_or(usize::MAX);
    if buf.len() < need {
        Parsed::Incomplete { need }
    } else {
        Parsed::Message(header)
    }
}

/// Turns a request into its reply in place: clears [`Flags::CLIENT`] and changes nothing else
/// (same seq, length, other flag bits and payload), as a sockperf server does. Returns `false`,
/// changing nothing, when `msg` is shorter than a header.
pub fn make_reply(msg: &mut [u8]) -> bool {
    if msg.len() < HEADER_LEN {
        return false;
    }
    // The low byte of the big-endian flags holds the client bit.
    msg[Header::LENGTH_AT - 1] &= !(Flags::CLIENT.0 as u8);
    true
}

/// Writes a client request into `msg`: the header (`length` = `msg.len()`) with `seq` and `flags`;
/// the payload after it is left as it is (sockperf fills it once per run and only `seq`
/// changes).
///
/// # Errors
/// [`Error::Truncated`] when `msg` is shorter than [`HEADER_LEN`]; [`Error::FrameTooLarge`] when
/// it is longer than `u32::MAX`.
pub fn write_request(seq: u64, flags: Flags, msg: &mut [u8]) -> Result<(), Error> {
    let length = u32::try_from(msg.len()).map_err(|_| Error::FrameTooLarge(u32::MAX))?;
    Header { seq, flags, length }.write(msg)
}

/// Overwrites only the `seq` field of a message already written with [`write_request`] (the
/// per-message work of a client: everything else stays).
///
/// # Errors
/// [`Error::Truncated`] when `msg` is shorter than [`HEADER_LEN`].
pub fn set_seq(seq: u64, msg: &mut [u8]) -> Result<(), Error> {
    if msg.len() < HEADER_LEN {
        return Err(Error::Truncated {
            need: HEADER_LEN,
            have: msg.len(),
        });
    }
    msg[..Header::FLAGS_AT].copy_from_slice(&seq.to_be_bytes());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// docs/protocols/sockperf.md §2, the [verified] headers captured from sockperf 3.7 on loopback.
    #[test]
    fn headers_captured_from_sockperf_3_7() {
        let cases = [
            // ping-pong request, -m 64
            ("0000000000000001 0003 00000040", 1, 0x0003, 64),
            // ping-pong reply
            ("0000000000000001 0002 00000040", 1, 0x0002, 64),
            // throughput, -m 100: never answered
            ("0000000000000001 0001 00000064", 1, 0x0001, 100),
            // under-load, reply-every 10: seq 10 asks for a reply
            ("000000000000000a 0003 0000000e", 10, 0x0003, 14),
            // default size: a header-only message
            ("000000000000000100030000000e", 1, 0x0003, 14),
        ];
        for (bytes, seq, flags, length) in cases {
            let wire = hex(bytes);
            let h = Header {
                seq,
                flags: Flags(flags),
                length,
            };
            assert_eq!(Header::decode(&wire), Ok(h), "{bytes}");
            assert_eq!(h.encode().as_slice(), wire.as_slice(), "{bytes}");
        }
    }

    #[test]
    fn flag_constants_are_the_wire_bits() {
        assert_eq!(Flags::CLIENT.0, 0x0001);
        assert_eq!(Flags::PONG_REQUEST.0, 0x0002);
        assert_eq!(Flags::WARMUP.0, 0x0004);
        assert_eq!((Flags::CLIENT | Flags::PONG_REQUEST).0, 0x0003);
        assert_eq!(Flags(0x8003).without(Flags::CLIENT), Flags(0x8002));
    }

    #[test]
    fn the_server_rules_follow_the_flags() {
        // A real 3.7 server answered 0x0003 and 0x8003 only, and counted 0x0001, 0x0003 and
        // 0x8003 (docs/protocols/sockperf.md §4).
        let h = |flags| Header {
            seq: 1,
            flags: Flags(flags),
            length: 14,
        };
        for (flags, counted, answered) in [
            (0x0001, true, false),
            (0x0002, false, false),
            (0x0003, true, true),
            (0x0005, false, false),
            (0x0007, false, false),
            (0x8003, true, true),
        ] {
            assert_eq!(h(flags).counted_by_server(), counted, "{flags:#06x}");
            assert_eq!(h(flags).wants_reply(), answered, "{flags:#06x}");
        }
    }

    #[test]
    fn a_reply_differs_from_its_request_in_the_client_bit_only() {
        let mut msg = hex("0000000000000001 8003 00000014 0102030405 06");
        let request = msg.clone();
        assert!(make_reply(&mut msg));
        let mut expected = request;
        expected[9] = 0x02;
        assert_eq!(msg, expected);
        assert_eq!(Header::decode(&msg).unwrap().flags, Flags(0x8002));
        // Replying twice changes nothing more.
        assert!(make_reply(&mut msg));
        assert_eq!(msg, expected);
        let mut short = [0x01u8; 13];
        assert!(!make_reply(&mut short));
        assert_eq!(short, [0x01; 13]);
    }

    #[test]
    fn requests_are_written_with_their_total_length() {
        let mut msg = vec![0xaau8; 64];
        write_request(1, Flags::CLIENT | Flags::PONG_REQUEST, &mut msg).unwrap();
        assert_eq!(msg[..14], hex("0000000000000001 0003 00000040")[..]);
        assert!(msg[14..].iter().all(|&b| b == 0xaa));
        set_seq(0x0102_0304_0506_0708, &mut msg).unwrap();
        assert_eq!(msg[..14], hex("0102030405060708 0003 00000040")[..]);
        assert!(write_request(1, Flags::CLIENT, &mut [0u8; 13]).is_err());
        assert!(set_seq(1, &mut [0u8; 8]).is_err());
    }

    #[test]
    fn parse_frames_streams_and_refuses_bad_lengths() {
        let mut two = hex("0000000000000001 0003 0000000f ff");
        two.extend(hex("0000000000000002 0001 0000000e"));
        let Parsed::Message(first) = parse(&two, SERVER_MAX_MSG) else {
            panic!("{:?}", parse(&two, SERVER_MAX_MSG))
        };
        assert_eq!((first.seq, first.length), (1, 15));
        assert_eq!(
            parse(&two[15..], SERVER_MAX_MSG),
            Parsed::Message(Header {
                seq: 2,
                flags: Flags::CLIENT,
                length: 14
            })
        );
        // Fewer than 14 bytes, or fewer than `length`: wait.
        assert_eq!(
            parse(&two[..13], SERVER_MAX_MSG),
            Parsed::Incomplete { need: 14 }
        );
        assert_eq!(
            parse(&two[..14], SERVER_MAX_MSG),
            Parsed::Incomplete { need: 15 }
        );
        // length 0 and 13: never framed; 65,508: over the server's maximum, refused from the
        // header alone.
        for len in [0u32, 13] {
            let mut m = hex("0000000000000001 0003");
            m.extend(len.to_be_bytes());
            assert!(matches!(parse(&m, SERVER_MAX_MSG), Parsed::TooShort(_)));
        }
        let mut huge = hex("0000000000000001 0003");
        huge.extend(65_508u32.to_be_bytes());
        assert!(matches!(parse(&huge, SERVER_MAX_MSG), Parsed::TooLong(h) if h.length == 65_508));
        assert!(matches!(
            parse(&huge, MAX_TCP_MSG),
            Parsed::Incomplete { need: 65_508 }
        ));
        assert_eq!(MAX_TCP_MSG, 1_048_575);
    }

    proptest! {
        #[test]
        fn decode_and_parse_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64), max in any::<u32>()) {
            let _ = Header::decode(&bytes);
            let parsed = parse(&bytes, max);
            // A message is never longer than the buffer it was found in, nor shorter than a
            // header.
            if let Parsed::Message(h) = parsed {
                prop_assert!(h.length as usize <= bytes.len() && h.length >= MIN_MSG && h.length <= max);
            }
            let mut copy = bytes.clone();
            let _ = make_reply(&mut copy);
        }

        #[test]
        fn headers_round_trip(seq in any::<u64>(), flags in any::<u16>(), length in any::<u32>()) {
            let h = Header { seq, flags: Flags(flags), length };
            prop_assert_eq!(Header::decode(&h.encode()), Ok(h));
            let mut msg = h.encode();
            prop_assert!(make_reply(&mut msg));
            let reply = Header::decode(&msg).unwrap();
            prop_assert_eq!(reply, Header { flags: Flags(flags & !1), ..h });
        }
    }
}
