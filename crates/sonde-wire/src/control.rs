//! Control frames: a 4-byte big-endian length, then one JSON-encoded [`ControlMsg`].
//!
//! JSON keeps the control channel readable in a packet capture and lets fields be added without a
//! version bump (unknown fields are ignored); it never carries test data.

use serde::{Deserialize, Serialize};

use crate::Error;

/// The largest control frame body either side accepts. A length field above it ends the
/// connection before any allocation.
pub const MAX_FRAME_LEN: u32 = 64 * 1024;

/// A session's secret: data channels and UDP flows present it to join their session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Token(pub u64);

/// The agent's identifier for a session, shown in both sides' results and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SessionId(pub u64);

/// Transport of a test's data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
}

/// Who sends the data of a throughput or pps test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// The client sends, the agent receives and counts.
    Forward,
    /// The agent sends, the client receives and counts.
    Reverse,
    /// Both at once, on separate streams: streams `0..n` forward, `n..2n` reverse.
    Bidir,
}

/// What a session measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TestKind {
    /// Ping-pong: the agent echoes every message.
    Latency,
    /// Bulk transfer.
    Throughput,
    /// Small UDP packets as fast as possible.
    Pps,
}

/// Everything the agent needs to play its part in a test.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TestSpec {
    /// What is measured.
    pub kind: TestKind,
    /// Transport.
    pub protocol: Protocol,
    /// Who sends (ignored for latency: both do).
    pub direction: Direction,
    /// Parallel streams (TCP connections or UDP flows) per direction.
    pub streams: u32,
    /// Message size: bytes per write (TCP), datagram payload (UDP).
    pub msg_size: u32,
    /// UDP throughput: target bits per second *per stream*; 0 is unlimited.
    pub bitrate_per_stream: u64,
    /// How long the sender sends, in milliseconds.
    pub duration_ms: u64,
    /// Interval between receiver reports, in milliseconds; 0 for none.
    pub interval_ms: u64,
}

impl TestSpec {
    /// Number of data channels the client must open (both directions for `Bidir`).
    pub fn channels(&self) -> u32 {
        match (self.kind, self.direction) {
            (TestKind::Throughput, Direction::Bidir) => self.streams.saturating_mul(2),
            _ => self.streams,
        }
    }

    /// Whether the client sends on stream `index` (the agent sends on the others).
    pub fn client_sends(&self, index: u32) -> bool {
        match self.kind {
            TestKind::Latency => true,
            TestKind::Pps | TestKind::Throughput => match self.direction {
                Direction::Forward => true,
                Direction::Reverse => false,
                Direction::Bidir => index < self.streams,
            },
        }
    }
}

/// Why the agent will not run a test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Refusal {
    /// The client speaks another protocol version.
    Version,
    /// The agent is running its maximum number of sessions.
    Busy,
    /// A parameter is outside the agent's limits (duration, streams, size).
    Limits,
    /// A parameter makes no sense (zero streams, message too small for UDP).
    BadRequest,
    /// The agent is shutting down.
    ShuttingDown,
}

/// The agent's limits, announced in [`ControlMsg::Welcome`] so a client can explain a refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Maximum sessions at once.
    pub max_sessions: u32,
    /// Maximum test duration, milliseconds.
    pub max_duration_ms: u64,
    /// Maximum streams (per direction) per session.
    pub max_streams: u32,
    /// Maximum message size, bytes.
    pub max_msg_size: u32,
}

/// One stream's (or flow's) counts, from the side that measured them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamStats {
    /// Stream index, as in [`crate::DataJoin::stream`].
    pub stream: u32,
    /// Payload bytes sent or received.
    pub bytes: u64,
    /// Datagrams (UDP) or messages (latency) sent or received; for TCP bulk, write or read calls.
    pub packets: u64,
    /// Time from the first to the last byte seen, nanoseconds.
    pub active_ns: u64,
    /// UDP receiver: datagrams the sender sent that never arrived.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost: Option<u64>,
    /// UDP receiver: datagrams that arrived more than once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duplicated: Option<u64>,
    /// UDP receiver: datagrams that arrived after a higher sequence number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reordered: Option<u64>,
    /// UDP receiver: RFC 3550 interarrival jitter, nanoseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jitter_ns: Option<u64>,
    /// TCP sender: segments retransmitted (`tcpi_total_retrans`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retransmits: Option<u64>,
}

/// Bytes and datagrams per stream in one interval, counted by the receiver.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IntervalStats {
    /// Interval start, nanoseconds since the receiver started.
    pub start_ns: u64,
    /// Interval end, nanoseconds since the receiver started.
    pub end_ns: u64,
    /// Stream indexes, parallel to `bytes` and `packets`.
    pub streams: Vec<u32>,
    /// Payload bytes received per stream in the interval.
    pub bytes: Vec<u64>,
    /// Datagrams received per stream in the interval.
    pub packets: Vec<u64>,
}

/// The agent's account of a finished session.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentReport {
    /// Streams the agent received (counted at the receiver).
    pub received: Vec<StreamStats>,
    /// Streams the agent sent (the sender's view).
    pub sent: Vec<StreamStats>,
    /// Latency: messages the agent received and echoed, per flow.
    pub echoed: Vec<StreamStats>,
    /// Receiver intervals measured at the agent.
    pub intervals: Vec<IntervalStats>,
    /// The largest number of *other* sessions that ran on the agent during this one.
    pub overlapping_sessions: u32,
}

/// Every message on a control channel. The client speaks first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum ControlMsg {
    /// Client → agent, first frame.
    Hello {
        /// [`crate::PROTOCOL_VERSION`] of the client.
        protocol: u16,
        /// Client software and version, for the agent's log.
        software: String,
    },
    /// Agent → client: hello accepted.
    Welcome {
        /// [`crate::PROTOCOL_VERSION`] of the agent.
        protocol: u16,
        /// Agent software and version.
        software: String,
        /// The session's id.
        session: SessionId,
        /// The agent's limits.
        limits: Limits,
    },
    /// Agent → client: the request is refused; the agent closes the connection after this.
    Refused {
        /// Machine-readable reason.
        reason: Refusal,
        /// What to do about it, for a person.
        message: String,
    },
    /// Client → agent: run this test.
    Start {
        /// The test.
        spec: TestSpec,
    },
    /// Agent → client: open the data channels now and present this token.
    Accepted {
        /// The session's token.
        token: Token,
    },
    /// Agent → client: every data channel has joined; the agent's receivers are running.
    Ready,
    /// Client → agent, after `Ready`: the client's receivers are running; the agent's senders
    /// may start (their duration counts from here).
    Go,
    /// Receiver → sender side: one interval's counts, while the test runs.
    Interval(IntervalStats),
    /// Either side: my senders have finished; here is what they sent.
    SenderDone {
        /// Per-stream sender counts.
        streams: Vec<StreamStats>,
    },
    /// Client → agent: the client is done (latency: stop echoing).
    Finish,
    /// Agent → client: the agent's final account.
    Report(AgentReport),
    /// Either side: the test failed; the sender closes after this.
    Error {
        /// What went wrong.
        message: String,
    },
}

/// Appends one frame (length + JSON) to `out`.
pub fn encode_frame(msg: &ControlMsg, out: &mut Vec<u8>) -> Result<(), Error> {
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    serde_json::to_writer(&mut *out, msg).map_err(|e| Error::Malformed(e.to_string()))?;
    let len = out.len() - start - 4;
    let len32 = u32::try_from(len).unwrap_or(u32::MAX);
    if len32 > MAX_FRAME_LEN {
        out.truncate(start);
        return Err(Error::FrameTooLarge(len32));
    }
    out[start..start + 4].copy_from_slice(&len32.to_be_bytes());
    Ok(())
}

/// Reads the length field of a frame from its first 4 bytes, rejecting lengths over
/// [`MAX_FRAME_LEN`] before anything is allocated.
pub fn frame_len(header: [u8; 4]) -> Result<usize, Error> {
    let len = u32::from_be_bytes(header);
    if len > MAX_FRAME_LEN {
        return Err(Error::FrameTooLarge(len));
    }
    Ok(len as usize)
}

/// Decodes one frame body (without its length prefix).
pub fn decode_body(body: &[u8]) -> Result<ControlMsg, Error> {
    serde_json::from_slice(body).map_err(|e| Error::Malformed(e.to_string()))
}

/// Decodes the first frame in `buf`: `Ok(None)` when more bytes are needed, else the message and
/// how many bytes it used.
pub fn decode_frame(buf: &[u8]) -> Result<Option<(ControlMsg, usize)>, Error> {
    let Some(header) = buf.get(..4) else {
        return Ok(None);
    };
    let len = frame_len([header[0], header[1], header[2], header[3]])?;
    let Some(body) = buf.get(4..4 + len) else {
        return Ok(None);
    };
    Ok(Some((decode_body(body)?, 4 + len)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn spec() -> TestSpec {
        TestSpec {
            kind: TestKind::Throughput,
            protocol: Protocol::Udp,
            direction: Direction::Bidir,
            streams: 2,
            msg_size: 1200,
            bitrate_per_stream: 50_000_000,
            duration_ms: 10_000,
            interval_ms: 1_000,
        }
    }

    #[test]
    fn frames_round_trip_and_report_their_length() {
        let msgs = [
            ControlMsg::Hello {
                protocol: 1,
                software: "sonde 0.1.0".into(),
            },
            ControlMsg::Start { spec: spec() },
            ControlMsg::Accepted {
                token: Token(u64::MAX),
            },
            ControlMsg::Ready,
            ControlMsg::Report(AgentReport {
                received: vec![StreamStats {
                    stream: 1,
                    bytes: 10,
                    lost: Some(2),
                    ..StreamStats::default()
                }],
                ..AgentReport::default()
            }),
            ControlMsg::Refused {
                reason: Refusal::Busy,
                message: "16 sessions running".into(),
            },
        ];
        let mut buf = Vec::new();
        for m in &msgs {
            encode_frame(m, &mut buf).unwrap();
        }
        let mut at = 0;
        for m in &msgs {
            let (got, used) = decode_frame(&buf[at..]).unwrap().unwrap();
            assert_eq!(&got, m);
            at += used;
        }
        assert_eq!(at, buf.len());
    }

    #[test]
    fn json_shape_is_tagged_and_readable() {
        let mut buf = Vec::new();
        encode_frame(&ControlMsg::Ready, &mut buf).unwrap();
        assert_eq!(&buf[4..], br#"{"type":"ready"}"#);
        assert_eq!(&buf[..4], &16u32.to_be_bytes());
    }

    #[test]
    fn partial_frames_ask_for_more_and_huge_lengths_are_refused() {
        let mut buf = Vec::new();
        encode_frame(&ControlMsg::Finish, &mut buf).unwrap();
        for cut in 0..buf.len() {
            assert_eq!(decode_frame(&buf[..cut]), Ok(None));
        }
        assert_eq!(
            decode_frame(&[0xff, 0xff, 0xff, 0xff, b'{']),
            Err(Error::FrameTooLarge(u32::MAX))
        );
        assert!(matches!(
            decode_frame(&[0, 0, 0, 2, b'{', b'}']),
            Err(Error::Malformed(_))
        ));
    }

    #[test]
    fn bidir_doubles_the_channels_and_splits_directions() {
        let s = spec();
        assert_eq!(s.channels(), 4);
        assert!(s.client_sends(0) && s.client_sends(1));
        assert!(!s.client_sends(2) && !s.client_sends(3));
    }

    proptest! {
        #[test]
        fn decode_frame_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode_frame(&bytes);
        }

        #[test]
        fn decode_frame_never_panics_on_json_like_bodies(body in "\\{\"type\":\"[a-z_]{0,12}\"[ -~]{0,40}\\}") {
            let mut buf = (body.len() as u32).to_be_bytes().to_vec();
            buf.extend_from_slice(body.as_bytes());
            let _ = decode_frame(&buf);
        }
    }
}
