//! One-way delay timestamps inside latency messages (`sonde latency --one-way`).
//!
//! The client asks the agent's echo, message by message, to write its receive time (`t2`) and
//! its send time (`t3`) into the reply, both on the agent's clock. Together with the client's
//! send (`t1`) and receive (`t4`) times that makes every probe a four-timestamp exchange, as in
//! NTP, from which the client derives the delay each way once it knows the clocks' offset.
//!
//! A message with stamps is at least [`ONE_WAY_MIN_MSG`] bytes (anything after byte 24 is
//! payload):
//!
//! ```text
//! UDP   0..8  sequence number, big-endian, with two flag bits on top:
//!             bit 63 (0x80 in byte 0) "stamp this" (set by the client),
//!             bit 62 (0x40 in byte 0) "stamped"    (set by the echo)
//! TCP   0..4  "SNDQ" (the client's request) or "SNDR" (the echo's reply)
//!       4..8  the message size, big-endian u32 (TCP has no message boundaries: the echo frames
//!             the byte stream by it)
//! both  8..16  t2: when the agent's echo received the message, ns on the agent's clock, BE
//!       16..24 t3: when the agent's echo sent the reply, ns on the agent's clock, BE
//! ```
//!
//! A latency sequence number stays below 2^62, so the flag bits never collide with it, and a
//! message without the "stamp this" bit (every message of a test without `--one-way`) is echoed
//! unchanged. An agent that predates this layout echoes the request unchanged too: the reply
//! then lacks the "stamped" mark, and the client says that the agent gave no timestamps.
//!
//! ```
//! use sonde_wire::stamps;
//!
//! let mut msg = [0u8; 64];
//! stamps::write_udp_request(41, &mut msg);
//! assert!(stamps::udp_wants_stamps(&msg));
//! stamps::write_agent_stamps(&mut msg, 1_000, 1_250);
//! assert_eq!(stamps::udp_seq(&msg), 41);
//! assert_eq!(stamps::udp_reply_stamps(&msg), Some((1_000, 1_250)));
//! ```

/// The smallest message that carries the agent's two timestamps: 8 bytes of sequence number
/// (UDP) or marker and size (TCP), then `t2` and `t3`.
pub const ONE_WAY_MIN_MSG: u32 = 24;

/// Byte 0 of a UDP request: "stamp this".
pub const UDP_STAMP_REQUEST: u8 = 0x80;
/// Byte 0 of a UDP reply: "stamped".
pub const UDP_STAMPED: u8 = 0x40;
/// The first 4 bytes of a TCP request with stamps.
pub const TCP_STAMP_REQUEST: [u8; 4] = *b"SNDQ";
/// The first 4 bytes of a TCP reply the echo stamped.
pub const TCP_STAMPED: [u8; 4] = *b"SNDR";

const MIN: usize = ONE_WAY_MIN_MSG as usize;
/// The flag bits in the first byte of a UDP message.
const UDP_FLAGS: u8 = UDP_STAMP_REQUEST | UDP_STAMPED;

/// Writes a UDP request for message `seq` (below 2^62) into the first 24 bytes of `msg`: the
/// sequence number with "stamp this", and zeroed stamp fields. A message shorter than
/// [`ONE_WAY_MIN_MSG`] is left alone.
pub fn write_udp_request(seq: u64, msg: &mut [u8]) {
    let Some(head) = msg.get_mut(..MIN) else {
        return;
    };
    head[..8].copy_from_slice(&seq.to_be_bytes());
    head[0] = (head[0] & !UDP_FLAGS) | UDP_STAMP_REQUEST;
    head[8..].fill(0);
}

/// Whether a UDP message asks the echo for its timestamps.
pub fn udp_wants_stamps(msg: &[u8]) -> bool {
    msg.len() >= MIN && msg[0] & UDP_STAMP_REQUEST != 0
}

/// The sequence number of a UDP message with stamps (flag bits cleared); 0 for a message too
/// short to be one.
pub fn udp_seq(msg: &[u8]) -> u64 {
    let Some(head) = msg.get(..8) else {
        return 0;
    };
    let mut b = [0u8; 8];
    b.copy_from_slice(head);
    b[0] &= !UDP_FLAGS;
    u64::from_be_bytes(b)
}

/// The agent's `(t2, t3)` in a UDP reply, or `None` when the echo did not stamp it.
pub fn udp_reply_stamps(msg: &[u8]) -> Option<(u64, u64)> {
    (msg.len() >= MIN && msg[0] & UDP_STAMPED != 0).then(|| read_stamps(msg))
}

/// Writes a TCP request of `size` bytes into the first 24 bytes of `msg` (left alone when
/// shorter than [`ONE_WAY_MIN_MSG`]).
pub fn write_tcp_request(size: u32, msg: &mut [u8]) {
    let Some(head) = msg.get_mut(..MIN) else {
        return;
    };
    head[..4].copy_from_slice(&TCP_STAMP_REQUEST);
    head[4..8].copy_from_slice(&size.to_be_bytes());
    head[8..].fill(0);
}

/// The message size a TCP stream's first 8 bytes announce, when they are a request with stamps
/// of a size an echo can frame (24 to `max` bytes); `None` otherwise.
pub fn tcp_request_size(first: &[u8], max: u32) -> Option<u32> {
    let head = first.get(..8)?;
    if head[..4] != TCP_STAMP_REQUEST {
        return None;
    }
    let size = u32::from_be_bytes([head[4], head[5], head[6], head[7]]);
    (ONE_WAY_MIN_MSG..=max).contains(&size).then_some(size)
}

/// The agent's `(t2, t3)` in a TCP reply, or `None` when the echo did not stamp it.
pub fn tcp_reply_stamps(msg: &[u8]) -> Option<(u64, u64)> {
    (msg.len() >= MIN && msg[..4] == TCP_STAMPED).then(|| read_stamps(msg))
}

/// The echo's side, either transport: marks the message as stamped and writes `t2` and `t3`.
/// A message shorter than [`ONE_WAY_MIN_MSG`] is left alone.
pub fn write_agent_stamps(msg: &mut [u8], t2: u64, t3: u64) {
    let Some(head) = msg.get_mut(..MIN) else {
        return;
    };
    if head[..4] == TCP_STAMP_REQUEST {
        head[..4].copy_from_slice(&TCP_STAMPED);
    } else {
        head[0] |= UDP_STAMPED;
    }
    head[8..16].copy_from_slice(&t2.to_be_bytes());
    head[16..24].copy_from_slice(&t3.to_be_bytes());
}

/// Writes only `t3` (the echo stamps `t2` when the message arrives and `t3` just before it
/// sends); the message must already carry `t2` and its mark.
pub fn write_agent_send_stamp(msg: &mut [u8], t3: u64) {
    if let Some(field) = msg.get_mut(16..MIN) {
        field.copy_from_slice(&t3.to_be_bytes());
    }
}

fn read_stamps(msg: &[u8]) -> (u64, u64) {
    let word = |at: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&msg[at..at + 8]);
        u64::from_be_bytes(b)
    };
    (word(8), word(16))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn udp_requests_round_trip_through_an_echo() {
        let mut msg = vec![0xffu8; 100];
        write_udp_request((1 << 62) - 1, &mut msg);
        assert_eq!(msg[0] & 0xc0, 0x80);
        assert!(udp_wants_stamps(&msg));
        assert_eq!(udp_reply_stamps(&msg), None, "not stamped yet");
        assert_eq!(udp_seq(&msg), (1 << 62) - 1);
        write_agent_stamps(&mut msg, 7, 9);
        write_agent_send_stamp(&mut msg, 11);
        assert_eq!(udp_reply_stamps(&msg), Some((7, 11)));
        assert_eq!(udp_seq(&msg), (1 << 62) - 1);
        // The payload after the header is untouched.
        assert!(msg[24..].iter().all(|&b| b == 0xff));
    }

    #[test]
    fn plain_messages_do_not_ask_for_stamps() {
        // An ordinary latency message: the seq in the first 8 bytes, below 2^62.
        let mut msg = [0u8; 64];
        crate::write_latency_seq((1 << 62) - 1, &mut msg);
        assert!(!udp_wants_stamps(&msg));
        assert_eq!(tcp_request_size(&[0u8; 64], 65_536), None);
        // Too short for the stamps.
        let mut short = [0u8; 23];
        write_udp_request(3, &mut short);
        assert_eq!(short, [0u8; 23]);
        assert!(!udp_wants_stamps(&[0x80; 23]));
    }

    #[test]
    fn tcp_requests_announce_their_size() {
        let mut msg = vec![0u8; 1000];
        write_tcp_request(1000, &mut msg);
        assert_eq!(&msg[..4], b"SNDQ");
        assert_eq!(tcp_request_size(&msg, 65_536), Some(1000));
        assert_eq!(
            tcp_request_size(&msg, 999),
            None,
            "above the echo's maximum"
        );
        assert_eq!(tcp_request_size(&msg[..7], 65_536), None);
        assert_eq!(tcp_reply_stamps(&msg), None);
        write_agent_stamps(&mut msg, u64::MAX, 0);
        assert_eq!(&msg[..4], b"SNDR");
        assert_eq!(tcp_reply_stamps(&msg), Some((u64::MAX, 0)));
        let mut tiny = [0u8; 24];
        write_tcp_request(23, &mut tiny);
        assert_eq!(tcp_request_size(&tiny, 65_536), None, "too small to stamp");
    }

    proptest! {
        #[test]
        fn readers_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = udp_wants_stamps(&bytes);
            let _ = udp_seq(&bytes);
            let _ = udp_reply_stamps(&bytes);
            let _ = tcp_request_size(&bytes, u32::MAX);
            let _ = tcp_reply_stamps(&bytes);
            let mut copy = bytes.clone();
            write_agent_stamps(&mut copy, 1, 2);
            write_agent_send_stamp(&mut copy, 3);
        }

        #[test]
        fn any_seq_survives_the_flags(seq in 0u64..1 << 62, t2 in any::<u64>(), t3 in any::<u64>()) {
            let mut msg = [0u8; 24];
            write_udp_request(seq, &mut msg);
            write_agent_stamps(&mut msg, t2, t3);
            prop_assert_eq!(udp_seq(&msg), seq);
            prop_assert_eq!(udp_reply_stamps(&msg), Some((t2, t3)));
        }
    }
}
