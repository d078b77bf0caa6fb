//! Control frames: a 4-byte big-endian length, then one JSON-encoded [`ControlMsg`].
//!
//! JSON keeps the control channel readable in a packet capture and lets fields be added without a
//! version bump (unknown fields are ignored); it never carries test data.

use serde::{Deserialize, Serialize};

use crate::auth::{Nonce, Proof};
use crate::Error;
use crate::SocketOptions;

/// The largest control frame body either side accepts. A length field above it ends the
/// connection before any allocation.
pub const MAX_FRAME_LEN: u32 = 64 * 1024;

/// A session's secret: data channels and UDP flows present it to join their session.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
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
    /// Connection rate: TCP connect, request, response, close, over `streams` workers; each
    /// connection joins with a [`crate::CrrJoin`]. `msg_size` is the request size.
    Crr,
}

impl TestKind {
    /// Its name on the wire and in logs: `latency`, `throughput`, `pps`, `crr`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Latency => "latency",
            Self::Throughput => "throughput",
            Self::Pps => "pps",
            Self::Crr => "crr",
        }
    }
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
    /// TCP throughput: the most one read of a receiver asks for, bytes (`--read-size`); 0 for
    /// the receiver's default ([`DEFAULT_TCP_READ_SIZE`]). Absent from the JSON when 0, so a
    /// client that asks nothing speaks as before; an agent that predates it ignores it, and
    /// the client learns that from [`AgentReport::read_size`].
    #[serde(default, skip_serializing_if = "is_zero")]
    pub read_size: u32,
    /// The socket options of every data stream, at both ends (`-w`, `-C`, `-M`, `-N`, `-S`,
    /// `--fq-rate`, `--dont-fragment`). Absent from the JSON when nothing is asked; an agent that
    /// predates it ignores it, and the client learns that from [`AgentReport::socket`].
    #[serde(default, skip_serializing_if = "SocketOptions::is_default")]
    pub socket: SocketOptions,
    /// Throughput (`-O`): the first milliseconds, on each receiver's clock, whose bytes are
    /// received but not counted in its totals (the intervals cover them, marked omitted by the
    /// client); the senders send for `omit_ms + duration_ms`. Absent from the JSON when 0.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub omit_ms: u64,
    /// TCP throughput (`--skip-rx-copy`): both ends' receivers discard what they read without
    /// copying it to user space (`MSG_TRUNC`), which changes the CPU cost they report. Absent
    /// from the JSON when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub skip_rx_copy: bool,
    /// TCP throughput (`-n`): the senders stop after this many payload bytes in all (stream `i`
    /// its share, [`TestSpec::send_limit`]) instead of at `duration_ms`, which is then only the
    /// cap. Absent from the JSON when 0.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub bytes: u64,
    /// TCP throughput (`-k`): the senders stop after this many `msg_size` writes in all. Absent
    /// from the JSON when 0.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub blocks: u64,
    /// Latency with many flows or many requests in flight (`-P`, `--depth`,
    /// `--response-size`): each of the `streams` flows keeps `depth` requests of `msg_size`
    /// bytes outstanding and the agent answers each with `response_size` bytes, its flows
    /// spread over `threads` readiness loops. `None` (absent from the JSON): the one-flow,
    /// one-in-flight latency test, unchanged. An agent that predates it says so in
    /// [`Limits::request_response`] (false), and the client refuses before asking.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_response: Option<RequestResponse>,
}

/// The shape of a many-flow request/response latency test ([`TestSpec::request_response`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestResponse {
    /// Requests in flight per flow (closed loop: a flow sends its next request when a
    /// response comes back); at least 1.
    pub depth: u32,
    /// Bytes of each response (the request is `msg_size`).
    pub response_size: u32,
    /// The agent's threads, each running one readiness loop over its share of the flows;
    /// 0 for the agent's choice (one per available core, at most one per flow).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub threads: u32,
}

/// The most requests in flight per flow a many-flow latency test may ask (`--depth`).
pub const MAX_DEPTH: u32 = 1024;

/// The most threads either end of a many-flow latency test runs (`--threads`).
pub const MAX_RR_THREADS: u32 = 256;

/// A TCP receiver's read size when the test does not set one: 512 KiB, four of the default
/// 128 KiB writes. On a fast path the receive queue holds several writes, and fewer, larger
/// reads leave the receiver's core more time.
pub const DEFAULT_TCP_READ_SIZE: u32 = 512 << 10;

/// The largest read size a TCP receiver takes (`--read-size`): 16 MiB, well above any socket
/// buffer's default ceiling. A larger request is read with this.
pub const MAX_TCP_READ_SIZE: u32 = 16 << 20;

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn is_zero_u64(n: &u64) -> bool {
    *n == 0
}

impl TestSpec {
    /// What a TCP receiver of this test asks for in one read: the default for 0, at most
    /// [`MAX_TCP_READ_SIZE`].
    pub fn tcp_read_size(&self) -> u32 {
        if self.read_size == 0 {
            DEFAULT_TCP_READ_SIZE
        } else {
            self.read_size.min(MAX_TCP_READ_SIZE)
        }
    }

    /// `-n`/`-k`: the payload bytes the sender of stream `index` stops after (its share of the
    /// total, the first streams one byte or block more where it does not divide), or
    /// `u64::MAX` when the test is timed.
    pub fn send_limit(&self, index: u32) -> u64 {
        let streams = u64::from(self.streams.max(1));
        let share = |total: u64| {
            total / streams + u64::from(u64::from(index % self.streams.max(1)) < total % streams)
        };
        if self.bytes > 0 {
            share(self.bytes)
        } else if self.blocks > 0 {
            share(self.blocks).saturating_mul(u64::from(self.msg_size))
        } else {
            u64::MAX
        }
    }

    /// Number of data channels the client must open (both directions for `Bidir`).
    pub fn channels(&self) -> u32 {
        match (self.kind, self.direction) {
            (TestKind::Throughput, Direction::Bidir) => self.streams.saturating_mul(2),
            // A crr worker opens a new connection per transaction; none is held open.
            (TestKind::Crr, _) => 0,
            _ => self.streams,
        }
    }

    /// Whether the client sends on stream `index` (the agent sends on the others).
    pub fn client_sends(&self, index: u32) -> bool {
        match self.kind {
            TestKind::Latency | TestKind::Crr => true,
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
    /// The agent requires a shared secret and the client gave no proof, or a wrong one.
    Unauthenticated,
    /// The client's address has its maximum of sessions or connections at the agent.
    SourceBusy,
    /// A helper request ([`ControlMsg::Help`]) to an agent that does not help: started without
    /// `--helper`, or without a shared secret.
    NotHelper,
    /// `Start` asked for a token a session of this agent has already: behind a load
    /// balancer, the test's earlier connection reached this agent (the client looks for every
    /// agent behind the address this way).
    TokenTaken,
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
    /// Whether the agent runs many-flow request/response latency tests
    /// ([`TestSpec::request_response`]); false (absent) from an agent that predates them.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub request_response: bool,
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
    /// TCP sender: the connection's `TCP_INFO` when the sender's loop ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_info: Option<TcpInfoStats>,
    /// The address and port the stream's packets came from, as the agent saw them (its
    /// peer's address), so that a NAT between the ends is visible. Absent from the client's
    /// own counts and from an agent older than the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<std::net::SocketAddr>,
    /// `-O`: payload bytes of the omit period, not in `bytes` (the receiver's before its omit
    /// time, the sender's before its own). Absent when 0.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub omitted_bytes: u64,
    /// `-O`, UDP: the omit period's datagrams, not in `packets`. At a sender, the datagrams it
    /// sent before its omit time (sequence numbers `0..omitted_packets`, `packets` after them);
    /// at a receiver, the sequence numbers it cut off as the omit period's (the highest it had
    /// seen at its omit time, + 1), whose late arrivals are counted in neither `packets` nor
    /// `lost`. Absent when 0.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub omitted_packets: u64,
    /// TCP sender with `-Z`: what its `MSG_ZEROCOPY` sends came to. Absent without `-Z`, and
    /// from an agent older than the option.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zerocopy: Option<crate::ZerocopyStats>,
    /// UDP receiver with `--ecn`: the ECN marks its datagrams arrived with. Absent without
    /// `--ecn`, where the receiver's platform cannot read them, and from an agent older than the
    /// field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ecn: Option<crate::EcnCounts>,
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
    /// TCP: the `TCP_INFO` of the streams this side *sends*, sampled at the interval's end.
    /// The agent sends `Interval` messages with only these (and no receiving streams) when it
    /// sends and does not receive (reverse): an older client shows them as empty intervals.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tcp_info: Vec<TcpInfoStats>,
    /// What the interface toward the other end counted in the interval at the side that cut
    /// it (`sar -n DEV` at the receiver): its packets, bytes, drops and errors each way, without
    /// the driver's statistics (those are in the report's total). Absent where the interface
    /// cannot be read, and from a peer older than the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<Box<crate::InterfaceDelta>>,
}

/// One TCP connection's `TCP_INFO` at one moment, as the sending side read it (`tcp(7)`). Every
/// figure is `None` when the sender's kernel did not fill it; times in ns, rates in bytes per
/// second as the kernel keeps them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct TcpInfoStats {
    /// Stream index.
    pub stream: u32,
    /// Smoothed RTT (`tcpi_rtt`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub srtt_ns: Option<u64>,
    /// RTT mean deviation (`tcpi_rttvar`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rttvar_ns: Option<u64>,
    /// Smallest RTT seen (`tcpi_min_rtt`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_rtt_ns: Option<u64>,
    /// Congestion window, segments (`tcpi_snd_cwnd`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cwnd: Option<u32>,
    /// Slow-start threshold, segments (`tcpi_snd_ssthresh`); `None` also while in slow start.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ssthresh: Option<u32>,
    /// Sender MSS, bytes (`tcpi_snd_mss`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mss: Option<u32>,
    /// Segments retransmitted since the connection opened (`tcpi_total_retrans`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retrans: Option<u64>,
    /// Segments in flight, not yet acknowledged (`tcpi_unacked`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unacked: Option<u32>,
    /// Pacing rate, bytes/s (`tcpi_pacing_rate`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pacing_rate: Option<u64>,
    /// Latest delivery rate, bytes/s (`tcpi_delivery_rate`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delivery_rate: Option<u64>,
    /// Whether that delivery rate was limited by the application (`tcpi_delivery_rate_app_limited`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub app_limited: Option<bool>,
    /// Bytes written and not yet sent (`tcpi_notsent_bytes`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub notsent_bytes: Option<u32>,
    /// Time with data to send (`tcpi_busy_time`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub busy_ns: Option<u64>,
    /// Of that, limited by the receiver's window (`tcpi_rwnd_limited`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rwnd_limited_ns: Option<u64>,
    /// Of that, limited by the send buffer (`tcpi_sndbuf_limited`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sndbuf_limited_ns: Option<u64>,
    /// Segments the peer acknowledged as having arrived CE-marked (`tcpi_delivered_ce`, Linux
    /// 4.18): congestion routers signalled to an ECN connection. Absent from older senders.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivered_ce: Option<u32>,
}

/// What one side's share of a session cost in CPU: the threads that ran it (`getrusage`
/// `RUSAGE_THREAD`, summed), and the system calls its data loops made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct CpuReport {
    /// Wall-clock time the figures were counted over, ns.
    pub wall_ns: u64,
    /// CPU time in user mode, ns.
    pub user_ns: u64,
    /// CPU time in the kernel, ns.
    pub system_ns: u64,
    /// Voluntary context switches (waits); `None` where the platform does not count them per
    /// thread (Windows).
    #[serde(default)]
    pub voluntary_switches: Option<u64>,
    /// Involuntary context switches (preemptions); `None` as `voluntary_switches`.
    #[serde(default)]
    pub involuntary_switches: Option<u64>,
    /// System calls the data loops made (send/receive family); `None` where they are not
    /// counted.
    pub syscalls: Option<u64>,
    /// Messages the data loops moved: datagrams (UDP), messages echoed (latency), or TCP bytes
    /// over the message size.
    pub messages: Option<u64>,
    /// Payload bytes the data loops moved.
    pub bytes: Option<u64>,
    /// Interrupts the whole host took over `wall_ns`, every CPU (Linux: `/proc/stat` `intr`;
    /// Windows: the `\Processor(_Total)\Interrupts/sec` counter); `None` where not counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_interrupts: Option<u64>,
    /// Context switches of the whole host over `wall_ns` (Linux: `/proc/stat` `ctxt`; Windows:
    /// `\System\Context Switches/sec`); `None` where not counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_context_switches: Option<u64>,
    /// System calls of the whole host over `wall_ns` (Windows: `\System\System Calls/sec`;
    /// Linux keeps no such count); `None` where not counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_syscalls: Option<u64>,
    /// Time every CPU of the host spent in software interrupts over `wall_ns`, ns (Linux:
    /// `/proc/stat`'s `softirq`, where the network receive path runs outside any process);
    /// `None` where not counted (other platforms, agents older than the field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_softirq_ns: Option<u64>,
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
    /// Connection rate: the exchanges the agent completed (absent for other tests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crr: Option<CrrReport>,
    /// What the session cost the agent in CPU; `None` from an agent that cannot measure it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuReport>,
    /// How the agent ran its end when the client asked for [`Tuning`]: `None` when it was not
    /// asked, or from an agent older than `--busy-poll` (which ignores the request).
    /// (Boxed: rarely there, and every control message would carry its size.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tuning: Option<Box<TuningReport>>,
    /// TCP throughput: the most one read of the agent's receivers asked for, bytes; `None`
    /// where the agent received no TCP stream, or from an agent older than `--read-size`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_size: Option<u32>,
    /// What the agent's kernel made of [`TestSpec::socket`] on its end; `None` when nothing was
    /// asked, or from an agent that predates the options. (Boxed, as `tuning`.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket: Option<Box<crate::AppliedSocketOptions>>,
    /// `--skip-rx-copy`: whether the agent's TCP receivers discarded without a copy; `None`
    /// where it received no TCP stream, or from an agent older than the option.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skip_rx_copy: Option<bool>,
    /// What the interface toward the client counted over the session; `None` where the agent
    /// cannot read it (not Linux, no route) or predates the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<Box<crate::InterfaceDelta>>,
}

/// What a client asks of the agent's end of a latency test besides the [`TestSpec`]
/// (`sonde latency --busy-poll --cpu N`). An agent that predates it ignores the field; the
/// client learns that from the report's missing [`TuningReport`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tuning {
    /// Spin on non-blocking sockets (plus `SO_BUSY_POLL` where permitted) instead of sleeping
    /// in `recv`.
    #[serde(default)]
    pub busy_poll: bool,
    /// Pin the echo thread to one CPU of the agent's `--cpu-list`.
    #[serde(default)]
    pub pin: bool,
}

impl Tuning {
    /// Nothing asked.
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// How one end ran its side of a test: busy-polled, pinned.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct TuningReport {
    /// Its sockets were non-blocking and polled in a spin loop.
    pub busy_poll: bool,
    /// `SO_BUSY_POLL` as set, µs; `null` where the kernel does not offer it or refused it
    /// (raising it needs `CAP_NET_ADMIN`).
    pub so_busy_poll_us: Option<u32>,
    /// The CPUs its measuring threads were pinned to; empty when not pinned.
    pub cpus: Vec<u32>,
    /// Why it is not what was asked (pinning refused, busy polling not possible); `null` when
    /// it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// The agent's count of a connection-rate (`crr`) session.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CrrReport {
    /// Exchanges completed: the request read, the response written in full, then the client's
    /// close (a FIN, or with `--rst` a reset).
    pub transactions: u64,
    /// From the first connection the agent identified to the last completed exchange, ns.
    pub active_ns: u64,
    /// Connections of this session the agent could not complete: a timeout, a reset or an early
    /// close before the response, or bytes after the request.
    pub failed: u64,
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
        /// The client's fresh random nonce for this connection ([`crate::auth`]).
        nonce: Nonce,
    },
    /// Agent → client: hello accepted. Nothing about the host yet: that comes once the client
    /// is admitted (`Accepted`, `Description`).
    Welcome {
        /// [`crate::PROTOCOL_VERSION`] of the agent.
        protocol: u16,
        /// Agent software and version.
        software: String,
        /// The session's id.
        session: SessionId,
        /// The agent's limits.
        limits: Limits,
        /// The agent's fresh random nonce for this connection ([`crate::auth`]).
        nonce: Nonce,
        /// Whether the agent admits only clients that prove the shared secret.
        secret_required: bool,
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
        /// The proof of the shared secret for this test ([`crate::auth::Request::Test`]);
        /// `None` from a client without a secret.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        proof: Option<Proof>,
        /// Busy polling and pinning of the agent's end (latency); absent when nothing is asked.
        /// Not covered by the proof: it changes how the agent waits, not what it measures or
        /// for how long.
        #[serde(default, skip_serializing_if = "Tuning::is_default")]
        tuning: Tuning,
        /// Run the session under this token, the one another agent behind the same address
        /// (a load balancer) gave this test: a crr connection the balancer places on either
        /// agent then finds its session. `None` for a token of the agent's choosing; refused
        /// (`bad_request`) when a session of this agent already has it. An older agent ignores
        /// it and chooses its own, which the client sees in `Accepted`. Not covered by the
        /// proof: a token opens nothing that another client's does not.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        token: Option<Token>,
    },
    /// Agent → client: open the data channels now and present this token.
    Accepted {
        /// The session's token.
        token: Token,
        /// The agent's configuration, for the interface that faces this client; `None` when
        /// it could not be read.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        host: Option<Box<crate::HostInfo>>,
        /// The agent that admitted the session. Its presence also says the agent answers data
        /// joins that ask ([`crate::JoinAnswer`], [`crate::UdpElsewhere`]); `None` from an
        /// older agent, which does not.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        agent: Option<crate::AgentTag>,
    },
    /// Client → agent, instead of `Start`: describe your host, run nothing (`sonde conf`).
    Describe {
        /// The proof of the shared secret ([`crate::auth::Request::Describe`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        proof: Option<Proof>,
    },
    /// Agent → client: the answer to `Describe`; the agent closes the connection after this.
    Description {
        /// The agent's configuration, for the interface that faces this client.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        host: Option<Box<crate::HostInfo>>,
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
    /// Client → agent, while a latency test runs (`--one-way`): one NTP-style clock exchange,
    /// `t1` = the client's clock when it sent this (ns, the client's monotonic clock).
    ClockProbe {
        /// `t1`.
        client_send_ns: u64,
    },
    /// Agent → client: the answer to a [`ControlMsg::ClockProbe`], with the agent's receive
    /// (`t2`) and send (`t3`) times on the clock its latency echoes stamp with.
    ClockReply {
        /// `t1`, as the probe carried it.
        client_send_ns: u64,
        /// `t2`.
        agent_receive_ns: u64,
        /// `t3`.
        agent_send_ns: u64,
    },
    /// Client → agent, instead of `Start` (`--from`): run `test` against the sonde agent at
    /// `target` yourself, as a helper. Only an agent started with `--helper` and a shared secret
    /// takes it, and only with a proof ([`crate::auth::Request::Help`]).
    Help {
        /// The target as the user wrote it (`HOST`, `HOST:PORT`); the helper resolves it.
        target: String,
        /// The test the helper runs against the target.
        test: HelperTest,
        /// The proof of the shared secret for this request.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        proof: Option<Proof>,
    },
    /// Helper → client: the target admitted the helper's session and its data channels are
    /// open; nothing has been sent yet. The client may now send `ClockProbe`s (answered with
    /// `ClockReply` on the helper's host clock), then `HelperGo`.
    HelperReady,
    /// Client → helper: start the data at this moment of the helper's host clock (ns, the clock
    /// of its `ClockReply`s).
    HelperGo {
        /// When to start, on the helper's host clock.
        start_host_ns: u64,
    },
    /// Helper → client: a piece of the result document's JSON text (`sonde_report::TestResult`),
    /// in order; a document can pass the frame limit, so it comes in pieces of at most
    /// [`HELPER_RESULT_PART`] bytes, then `HelperResult`.
    HelperResultPart {
        /// The next piece of the document's text.
        json: String,
    },
    /// Helper → client: the test ran; its result document is the `HelperResultPart`s before
    /// this, joined.
    HelperResult {
        /// When the helper started the data, on its host clock.
        started_host_ns: u64,
    },
    /// Helper → client: the test against the target could not be run or failed (also after
    /// some `HelperResultPart`s, which are then void).
    HelperFailed {
        /// The exit code the helper's client would have ended with (3 unreachable, 4 refused,
        /// 1 failed).
        exit_code: u8,
        /// What went wrong, for a person.
        message: String,
    },
}

/// The most bytes of a result document's text one [`ControlMsg::HelperResultPart`] carries:
/// JSON escaping at most doubles them (a quote or backslash), which stays under
/// [`MAX_FRAME_LEN`].
pub const HELPER_RESULT_PART: usize = 16 * 1024;

/// What a helper runs against its target ([`ControlMsg::Help`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HelperTest {
    /// The test, as the helper's client will ask the target for it.
    pub spec: TestSpec,
    /// pps: UDP GSO batches (`Some(true)` on, `Some(false)` off, `None` auto).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gso: Option<bool>,
    /// latency: warm-up at the start of `spec.duration_ms`, whose samples are excluded, ms.
    #[serde(default)]
    pub warmup_ms: u64,
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

    #[test]
    fn a_byte_or_block_count_is_shared_among_the_streams() {
        let spec = TestSpec {
            kind: TestKind::Throughput,
            protocol: Protocol::Tcp,
            direction: Direction::Forward,
            streams: 3,
            msg_size: 1000,
            bitrate_per_stream: 0,
            duration_ms: 0,
            interval_ms: 0,
            read_size: 0,
            socket: Default::default(),
            omit_ms: 0,
            skip_rx_copy: false,
            bytes: 10,
            blocks: 0,
            request_response: None,
        };
        let shares: Vec<u64> = (0..3).map(|i| spec.send_limit(i)).collect();
        assert_eq!(shares, [4, 3, 3]);
        let blocks = TestSpec {
            bytes: 0,
            blocks: 5,
            ..spec.clone()
        };
        let shares: Vec<u64> = (0..3).map(|i| blocks.send_limit(i)).collect();
        assert_eq!(shares, [2_000, 2_000, 1_000]);
        let timed = TestSpec { bytes: 0, ..spec };
        assert_eq!(timed.send_limit(0), u64::MAX);
    }
    use proptest::prelude::*;

    /// A kind's name is the one it has on the wire.
    #[test]
    fn a_kinds_name_is_its_wire_name() {
        for kind in [
            TestKind::Latency,
            TestKind::Throughput,
            TestKind::Pps,
            TestKind::Crr,
        ] {
            let wire = serde_json::to_value(kind).unwrap();
            assert_eq!(wire, kind.name(), "{kind:?}");
        }
    }

    /// A report from an agent that predates the host-wide counters decodes with them unknown,
    /// and one without them leaves them out.
    #[test]
    fn cpu_reports_without_host_counters_decode_as_unknown() {
        let older =
            r#"{"wall_ns":1,"user_ns":2,"system_ns":3,"syscalls":4,"messages":5,"bytes":6}"#;
        let r: CpuReport = serde_json::from_str(older).unwrap();
        assert_eq!(
            (
                r.system_interrupts,
                r.system_context_switches,
                r.system_syscalls
            ),
            (None, None, None)
        );
        assert!(!serde_json::to_string(&r)
            .unwrap()
            .contains("system_interrupts"));
        let newer = CpuReport {
            system_interrupts: Some(10),
            ..r
        };
        let back: CpuReport =
            serde_json::from_str(&serde_json::to_string(&newer).unwrap()).unwrap();
        assert_eq!(back, newer);
    }

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
            read_size: 0,
            socket: Default::default(),
            omit_ms: 0,
            skip_rx_copy: false,
            bytes: 0,
            blocks: 0,
            request_response: None,
        }
    }

    #[test]
    fn the_tcp_read_size_is_the_default_for_0_and_at_most_the_maximum() {
        let with = |read_size| TestSpec {
            read_size,
            ..spec()
        };
        assert_eq!(with(0).tcp_read_size(), DEFAULT_TCP_READ_SIZE);
        assert_eq!(with(1).tcp_read_size(), 1);
        assert_eq!(with(u32::MAX).tcp_read_size(), MAX_TCP_READ_SIZE);
    }

    #[test]
    fn a_full_result_part_fits_a_frame_whatever_it_holds() {
        // Quotes and backslashes are the characters JSON doubles.
        for c in ['"', '\\', 'a', 'é'] {
            let mut json = String::new();
            while json.len() + c.len_utf8() <= HELPER_RESULT_PART {
                json.push(c);
            }
            let mut buf = Vec::new();
            encode_frame(&ControlMsg::HelperResultPart { json }, &mut buf)
                .unwrap_or_else(|e| panic!("a part of {c:?} does not fit: {e}"));
        }
    }

    #[test]
    fn frames_round_trip_and_report_their_length() {
        let msgs = [
            ControlMsg::Hello {
                protocol: 2,
                software: "sonde 0.1.0".into(),
                nonce: Nonce([3; 32]),
            },
            ControlMsg::Start {
                spec: spec(),
                proof: Some(Proof([4; 32])),
                tuning: Tuning::default(),
                token: None,
            },
            ControlMsg::Start {
                spec: spec(),
                proof: None,
                tuning: Tuning {
                    busy_poll: true,
                    pin: true,
                },
                token: None,
            },
            ControlMsg::Accepted {
                token: Token(u64::MAX),
                host: None,
                agent: None,
            },
            ControlMsg::Accepted {
                token: Token(7),
                host: None,
                agent: Some(crate::AgentTag {
                    id: crate::AgentId(u64::MAX),
                    addr: "[2001:db8::2]:5300".into(),
                }),
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
            ControlMsg::Help {
                target: "198.18.0.2:5300".into(),
                test: HelperTest {
                    spec: spec(),
                    gso: Some(false),
                    warmup_ms: 0,
                },
                proof: Some(Proof([5; 32])),
            },
            ControlMsg::HelperReady,
            ControlMsg::HelperGo {
                start_host_ns: 1_234_567_890,
            },
            ControlMsg::HelperResultPart {
                json: r#"{"test": "pps", "received": 42}"#.into(),
            },
            ControlMsg::HelperResult {
                started_host_ns: 1_234_567_891,
            },
            ControlMsg::HelperFailed {
                exit_code: 4,
                message: "the target refused".into(),
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
    fn clock_exchanges_carry_full_64_bit_times() {
        let reply = ControlMsg::ClockReply {
            client_send_ns: u64::MAX,
            agent_receive_ns: 1,
            agent_send_ns: 2,
        };
        let mut buf = Vec::new();
        encode_frame(&ControlMsg::ClockProbe { client_send_ns: 7 }, &mut buf).unwrap();
        assert_eq!(&buf[4..], br#"{"type":"clock_probe","client_send_ns":7}"#);
        encode_frame(&reply, &mut buf).unwrap();
        let first = decode_frame(&buf).unwrap().unwrap().1;
        assert_eq!(decode_frame(&buf[first..]).unwrap().unwrap().0, reply);
    }

    /// `tuning` is additive both ways: a `Start` from a client older than `--busy-poll` reads
    /// as asking nothing, a `Start` that asks nothing is the bytes an older client sends, and
    /// an older agent's report (no `tuning`) reads as `None`, which the client warns about.
    #[test]
    fn tuning_is_absent_when_nothing_is_asked_and_defaults_when_missing() {
        let old = br#"{"type":"start","spec":{"kind":"latency","protocol":"udp","direction":"forward","streams":1,"msg_size":64,"bitrate_per_stream":0,"duration_ms":1000,"interval_ms":0}}"#;
        let ControlMsg::Start { tuning, .. } = decode_body(old).unwrap() else {
            panic!("not a start");
        };
        assert!(tuning.is_default());
        let mut buf = Vec::new();
        encode_frame(&decode_body(old).unwrap(), &mut buf).unwrap();
        assert_eq!(&buf[4..], &old[..]);
        let asked = ControlMsg::Start {
            spec: spec(),
            proof: None,
            tuning: Tuning {
                busy_poll: true,
                pin: true,
            },
            token: None,
        };
        buf.clear();
        encode_frame(&asked, &mut buf).unwrap();
        assert!(String::from_utf8_lossy(&buf).contains(r#""tuning":{"busy_poll":true,"pin":true}"#));
        let ControlMsg::Report(r) = decode_body(br#"{"type":"report","received":[],"sent":[],"echoed":[],"intervals":[],"overlapping_sessions":0}"#).unwrap() else {
            panic!("not a report");
        };
        assert_eq!(r.tuning, None);
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

    #[test]
    fn crr_holds_no_data_channel_and_its_report_reads_back() {
        let s = TestSpec {
            kind: TestKind::Crr,
            protocol: Protocol::Tcp,
            direction: Direction::Forward,
            streams: 8,
            ..spec()
        };
        assert_eq!(s.channels(), 0, "crr connections join one by one");
        let mut buf = Vec::new();
        encode_frame(
            &ControlMsg::Start {
                spec: s.clone(),
                proof: None,
                tuning: Tuning::default(),
                token: None,
            },
            &mut buf,
        )
        .unwrap();
        assert!(String::from_utf8_lossy(&buf).contains(r#""kind":"crr""#));
        let report = ControlMsg::Report(AgentReport {
            crr: Some(CrrReport {
                transactions: 12_345,
                active_ns: 2_000_000_000,
                failed: 2,
            }),
            ..AgentReport::default()
        });
        buf.clear();
        encode_frame(&report, &mut buf).unwrap();
        assert_eq!(decode_frame(&buf).unwrap().unwrap().0, report);
        // An older agent's report has no `crr`: it reads as `None`, not as zero transactions.
        let old = br#"{"type":"report","received":[],"sent":[],"echoed":[],"intervals":[],"overlapping_sessions":0}"#;
        let Ok(ControlMsg::Report(r)) = decode_body(old) else {
            panic!("an older report still decodes");
        };
        assert_eq!(r.crr, None);
    }

    #[test]
    fn context_fields_are_optional_both_ways() {
        // An acceptance without a host, and an older agent's interval and report: no TCP_INFO
        // or CPU.
        let accepted = br#"{"type":"accepted","token":7}"#;
        let Ok(ControlMsg::Accepted { host, .. }) = decode_body(accepted) else {
            panic!("an acceptance without a host decodes");
        };
        assert_eq!(host, None);
        let iv = br#"{"type":"interval","start_ns":0,"end_ns":1,"streams":[0],"bytes":[5],"packets":[1]}"#;
        let Ok(ControlMsg::Interval(iv)) = decode_body(iv) else {
            panic!("an older interval still decodes");
        };
        assert!(iv.tcp_info.is_empty());
        let old = br#"{"type":"report","received":[],"sent":[{"stream":0,"bytes":1,"packets":1,"active_ns":1}],"echoed":[],"intervals":[],"overlapping_sessions":0}"#;
        let Ok(ControlMsg::Report(r)) = decode_body(old) else {
            panic!("an older report still decodes");
        };
        assert_eq!((r.cpu, r.sent[0].tcp_info), (None, None));
        // And what a newer agent adds reads back; an unknown TCP_INFO figure is left out.
        let accepted = ControlMsg::Accepted {
            token: Token(3),
            host: Some(Box::new(crate::HostInfo {
                kernel_release: Some("6.1.0".into()),
                ..crate::HostInfo::default()
            })),
            agent: None,
        };
        let mut buf = Vec::new();
        encode_frame(&accepted, &mut buf).unwrap();
        assert_eq!(decode_frame(&buf).unwrap().unwrap().0, accepted);
        let info = TcpInfoStats {
            stream: 2,
            srtt_ns: Some(50_000),
            ..TcpInfoStats::default()
        };
        let text = serde_json::to_string(&info).unwrap();
        assert_eq!(text, r#"{"stream":2,"srtt_ns":50000}"#);
        assert_eq!(serde_json::from_str::<TcpInfoStats>(&text).unwrap(), info);
    }

    #[test]
    fn an_interval_of_the_most_streams_fits_in_a_frame_with_their_tcp_info() {
        // 128 streams received and 128 sent (bidir at the agent's default limit), each sender
        // with every TCP_INFO figure at a large value.
        let big = TcpInfoStats {
            stream: 255,
            srtt_ns: Some(9_999_999_000),
            rttvar_ns: Some(9_999_999_000),
            min_rtt_ns: Some(9_999_999_000),
            cwnd: Some(999_999),
            ssthresh: Some(999_999),
            mss: Some(65_535),
            retrans: Some(99_999_999),
            unacked: Some(999_999),
            pacing_rate: Some(99_999_999_999),
            delivery_rate: Some(99_999_999_999),
            app_limited: Some(false),
            notsent_bytes: Some(99_999_999),
            busy_ns: Some(999_999_999_999_000),
            rwnd_limited_ns: Some(999_999_999_999_000),
            sndbuf_limited_ns: Some(999_999_999_999_000),
            delivered_ce: Some(99_999_999),
        };
        let iv = IntervalStats {
            start_ns: 299_000_000_000,
            end_ns: 300_000_000_000,
            streams: (0..128).collect(),
            bytes: vec![99_999_999_999; 128],
            packets: vec![9_999_999_999; 128],
            tcp_info: vec![big; 128],
            interface: None,
        };
        let mut buf = Vec::new();
        encode_frame(&ControlMsg::Interval(iv), &mut buf).unwrap();
        assert!(buf.len() < MAX_FRAME_LEN as usize, "{} bytes", buf.len());
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
