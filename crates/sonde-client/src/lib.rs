//! sonde's client: runs a test against a sonde agent and returns a result document.
//!
//! Every test runs the same way: its options (one type per test kind, each implementing
//! [`Test`]) and a target go to [`run`], with [`Controls`] for an interrupt flag or live
//! intervals.
//!
//! ```no_run
//! use sonde_client::{resolve, run, Controls, LatencyOptions};
//! let target = resolve("127.0.0.1", 5300).unwrap();
//! let m = run(&target, &LatencyOptions::default(), Controls::new()).unwrap();
//! println!("median RTT {:?} ns", m.result.rtt_ns.p50);
//! ```

mod clock;
mod conf;
mod crr;
pub mod handshake;
mod helper;
mod inner;
pub mod iperf3;
mod load;
mod mtu;
mod results;
mod rtt;
mod run;
mod session;
pub mod sockperf;
mod test;

use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use sonde_net::control::ControlError;
use sonde_report::{IntervalResult, LatencyResult, PpsInterval, PpsResult, ThroughputResult};
use sonde_wire::{Direction, Protocol, Refusal, TestKind, TestSpec};

pub use conf::conf;
pub use crr::{CrrOptions, MAX_CRR_MESSAGE};
pub use helper::run_as_helper;
pub use load::{LoadMeasurement, LoadOptions};
pub use mtu::{MtuOptions, MAX_MTU_PROBES};
pub use sonde_net::gso::GsoMode;
pub use sonde_net::socket::Bind;
pub use sonde_wire::Direction as StreamsDirection;
pub use test::{run, Controls, FromHelpers, Iperf3Server, SockperfServer, Test};

/// Why a test could not be run or did not finish.
///
/// Each message states its cause once (no `source()` chain to repeat it).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The host name did not resolve.
    #[error("cannot resolve {0}: {1}")]
    Resolve(String, io::Error),
    /// The TCP connection to the agent failed.
    #[error("cannot connect to {1}: {0} (is `sonde server` running there, and TCP port {port} open?)", port = .1.port())]
    Connect(io::Error, SocketAddr),
    /// The peer answered, but not as a sonde agent does.
    #[error("{0}")]
    NotAnAgent(String),
    /// The agent never acknowledged a UDP flow: UDP to its port is blocked or lost.
    #[error("the agent at {0} did not acknowledge UDP flow {1} within 5 s: is UDP port {port} blocked by a firewall?", port = .0.port())]
    UdpBlocked(SocketAddr, u32),
    /// The path to the agent does not carry the test as asked: a balancer that sends every
    /// try of a data channel to another agent, a NAT that gives the channels another address,
    /// a TCP-only forward for a UDP test.
    #[error("{0}")]
    Path(String),
    /// The peer broke the protocol mid-test.
    #[error("{0}")]
    Protocol(String),
    /// The agent refused the test.
    #[error("the agent refused the test: {message}")]
    Refused {
        /// Why.
        reason: Refusal,
        /// The agent's explanation.
        message: String,
    },
    /// The control connection failed during the test.
    #[error("control connection to the agent: {0}")]
    Control(ControlError),
    /// A data channel failed.
    #[error("data stream {1}: {0}")]
    Data(io::Error, u32),
    /// The agent reported an error and ended the test.
    #[error("the agent ended the test: {0}")]
    Remote(String),
    /// The options make no sense.
    #[error("{0}")]
    Usage(String),
    /// The source asked for (`-B`, `--bind-dev`, `--cport`) cannot be used here: the address is
    /// not this host's, the port is taken, or there is no such device.
    #[error("{0} (-B, --bind-dev, --cport)")]
    Source(io::Error),
    /// A peer that is not a sonde agent (a real `sockperf server`) never answered.
    #[error("{0}")]
    NoReply(String),
    /// `iperf3://`: nothing could be reached there, or what answered is not an iperf3 server.
    #[error("{0}")]
    NotIperf3(String),
    /// `iperf3://`: the iperf3 server refused the test (busy, or its `SERVER_ERROR`).
    #[error("{0}")]
    Iperf3Refused(String),
    /// Ctrl-C or SIGTERM ended the test (a peer that understands it was told).
    #[error("interrupted")]
    Interrupted,
    /// `--from`: one helper could not take part; the error names it.
    #[error("helper {helper}: {error}")]
    Helper {
        /// The helper, as resolved.
        helper: String,
        /// What went wrong with it.
        error: Box<ClientError>,
    },
    /// `--from`: a helper's own test against the target failed (it could not reach the target,
    /// the target refused it, or the test broke).
    #[error("its test against the target failed: {message}")]
    HelperTarget {
        /// The exit code the helper's client ended with.
        exit_code: u8,
        /// The helper's explanation.
        message: String,
    },
}

impl From<ControlError> for ClientError {
    fn from(e: ControlError) -> Self {
        Self::Control(e)
    }
}

impl ClientError {
    /// The process exit code for this error (documented in `sonde --help`, the README and docs/exit-codes.md).
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Usage(_) | Self::Source(_) => 2,
            Self::Resolve(..) | Self::Connect(..) | Self::NotAnAgent(_) | Self::UdpBlocked(..) => 3,
            Self::Path(_) => 3,
            Self::NoReply(_) => 3,
            Self::NotIperf3(_) => 3,
            Self::Refused { .. } | Self::Iperf3Refused(_) => 4,
            Self::Interrupted => 130,
            Self::Helper { error, .. } => error.exit_code(),
            Self::HelperTarget { exit_code, .. } => *exit_code,
            Self::Protocol(_) | Self::Control(_) | Self::Data(..) | Self::Remote(_) => 1,
        }
    }
}

/// How long a connection to the agent may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The agent's port, TCP and UDP, where a target names none (and `sonde server`'s default).
pub const DEFAULT_PORT: u16 = 5300;

/// The agent to test against.
#[derive(Debug, Clone)]
pub struct Target {
    /// Resolved address.
    pub addr: SocketAddr,
    /// As the user wrote it (for reports).
    pub label: String,
    /// The secret the agent requires (`--secret-file`, `SONDE_SECRET`); `None` for an agent
    /// without one. Not used by `sockperf://` and `iperf3://` targets.
    pub secret: Option<sonde_wire::auth::Secret>,
    /// Where this host's sockets of the test come from (`-B`, `--bind-dev`, `--cport`): the
    /// kernel's choice by default.
    pub source: Source,
}

impl Target {
    /// The same target, proving `secret` to the agent.
    #[must_use]
    pub fn with_secret(self, secret: Option<sonde_wire::auth::Secret>) -> Self {
        Self { secret, ..self }
    }

    /// The same target, reached from `source`.
    #[must_use]
    pub fn with_source(self, source: Source) -> Self {
        Self { source, ..self }
    }
}

/// An address family (`-4`, `-6`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// IPv4 only.
    V4,
    /// IPv6 only.
    V6,
}

impl Family {
    /// Whether `addr` is of this family.
    pub fn has(self, addr: &SocketAddr) -> bool {
        matches!(
            (self, addr),
            (Self::V4, SocketAddr::V4(_)) | (Self::V6, SocketAddr::V6(_))
        )
    }

    fn name(self) -> &'static str {
        match self {
            Self::V4 => "IPv4",
            Self::V6 => "IPv6",
        }
    }
}

/// `--cport`: the source ports of a test's data channels, `first..=last`; channel `i` takes
/// `first + i`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortRange {
    /// The first port (channel 0's).
    pub first: u16,
    /// The last port, `first` for a single one.
    pub last: u16,
}

impl PortRange {
    /// How many ports the range holds.
    pub fn len(self) -> u32 {
        u32::from(self.last.saturating_sub(self.first)) + 1
    }

    /// Whether it holds no port (never, for a range made by the parser: `last >= first`).
    pub fn is_empty(self) -> bool {
        self.last < self.first
    }
}

/// Where this host's sockets of a test come from: the source address and device of every
/// socket (control and data), and `--cport`, the source port of each data channel.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Source {
    /// `-B ADDR[%DEV]`, `--bind-dev DEV`.
    pub bind: sonde_net::socket::Bind,
    /// `--cport PORT[-PORT]`: data channel `i` from the `i`-th port; `None` for ephemeral
    /// ports. The control connection always takes an ephemeral one.
    pub ports: Option<PortRange>,
}

impl Source {
    /// The source port of data channel `channel` (0: an ephemeral one).
    ///
    /// # Errors
    /// The range holds fewer ports than the test's channels (a usage error).
    pub fn port(&self, channel: u32, channels: u32) -> Result<u16, ClientError> {
        let Some(range) = self.ports else {
            return Ok(0);
        };
        if channels > range.len() {
            return Err(ClientError::Usage(format!(
                "--cport {}: {} port{} for {channels} data streams (a stream each: give a \
                 range of {channels}, PORT-PORT)",
                if range.first == range.last {
                    range.first.to_string()
                } else {
                    format!("{}-{}", range.first, range.last)
                },
                range.len(),
                if range.len() == 1 { "" } else { "s" },
            )));
        }
        // `channel < channels <= len`, so the sum stays within the range.
        Ok(range
            .first
            .saturating_add(u16::try_from(channel).unwrap_or(u16::MAX)))
    }

    /// A TCP connection to `peer` from this source (the control connection with `port` 0).
    pub(crate) fn tcp(
        &self,
        peer: SocketAddr,
        port: u16,
        nodelay: bool,
    ) -> Result<std::net::TcpStream, ClientError> {
        sonde_net::socket::tcp_connect_from(peer, &self.bind, port, CONNECT_TIMEOUT, nodelay)
            .map_err(|e| match e {
                sonde_net::socket::ConnectError::Source(e) => ClientError::Source(e),
                e => ClientError::Connect(e.into_io(), peer),
            })
    }

    /// A UDP socket connected to `peer` from this source; data channel `index`'s errors.
    pub(crate) fn udp(
        &self,
        peer: SocketAddr,
        port: u16,
        index: u32,
    ) -> Result<std::net::UdpSocket, ClientError> {
        sonde_net::socket::udp_connect_from(peer, &self.bind, port).map_err(|e| match e {
            sonde_net::socket::ConnectError::Source(e) => ClientError::Source(e),
            e => ClientError::Data(e.into_io(), index),
        })
    }
}

/// Resolves `HOST`, `HOST:PORT`, `[V6]:PORT` or a bare IPv6 address.
pub fn resolve(spec: &str, default_port: u16) -> Result<Target, ClientError> {
    resolve_in(spec, default_port, None)
}

/// Resolves `HOST`, `HOST:PORT`, `[V6]:PORT` or a bare IPv6 address to an address of
/// `family` when one is given (`-4`, `-6`): a host with none of that family is an error that
/// says so.
pub fn resolve_in(
    spec: &str,
    default_port: u16,
    family: Option<Family>,
) -> Result<Target, ClientError> {
    let with_port = if spec.parse::<std::net::Ipv6Addr>().is_ok() {
        format!("[{spec}]:{default_port}")
    } else if spec.rsplit_once(':').is_some_and(|(h, p)| {
        !h.is_empty() && p.parse::<u16>().is_ok() && (!h.contains(':') || h.ends_with(']'))
    }) {
        spec.to_owned()
    } else {
        format!("{spec}:{default_port}")
    };
    let mut addrs = with_port
        .to_socket_addrs()
        .map_err(|e| ClientError::Resolve(spec.to_owned(), e))?
        .peekable();
    if addrs.peek().is_none() {
        return Err(ClientError::Resolve(
            spec.to_owned(),
            io::Error::new(io::ErrorKind::NotFound, "no address"),
        ));
    }
    let addr = match family {
        None => addrs.next(),
        Some(f) => addrs.find(|a| f.has(a)),
    }
    .ok_or_else(|| {
        let f = family.map_or("", Family::name);
        ClientError::Resolve(
            spec.to_owned(),
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("it has no {f} address (asked for with -4/-6, or by -B's family)"),
            ),
        )
    })?;
    Ok(Target {
        addr,
        label: addr.to_string(),
        secret: None,
        source: Source::default(),
    })
}

/// `sonde latency` options.
#[derive(Debug, Clone)]
pub struct LatencyOptions {
    /// TCP or UDP.
    pub protocol: Protocol,
    /// Message size each way, bytes.
    pub msg_size: u32,
    /// Measured time after the warm-up.
    pub duration: Duration,
    /// Warm-up before the measured time; its samples are excluded.
    pub warmup: Duration,
    /// Open loop at this many messages per second; `None` for closed loop.
    pub rate: Option<f64>,
    /// Send this many messages after the warm-up instead of running for `duration`.
    pub count: Option<u64>,
    /// `--full-log`: every sample to this file as CSV, written by a thread of its own.
    pub full_log: Option<std::path::PathBuf>,
    /// `--histogram`: the RTT distribution's buckets in the result.
    pub histogram: bool,
    /// `--timestamps`: the kernel's software timestamps, and the RTT at the sockets.
    pub timestamps: bool,
    /// `--one-way`: the delay each way, from the agent's stamps and its clock's offset
    /// (messages of at least 24 bytes).
    pub one_way: bool,
    /// `--busy-poll`: both ends spin on non-blocking sockets instead of sleeping in `recv`
    /// (closed loop only), and the agent pins its echo to a CPU.
    pub busy_poll: bool,
    /// `--cpu N`: the loop's thread runs on CPU N only (and the agent pins its echo).
    pub cpu: Option<u32>,
    /// `-w`, `-C`, `-M`, `-N`, `-S`/`--dscp`/`--ecn`, `--fq-rate`, `--dont-fragment`: the data
    /// streams' socket options, set at both ends ([`sonde_wire::SocketOptions`]).
    pub socket: sonde_wire::SocketOptions,
    /// `-i`: the RTTs of each interval this long, live and in the result; `None` for none.
    pub interval: Option<Duration>,
    /// `-P`: flows (TCP connections or UDP flows), 1 for the one-flow test.
    pub parallel: u32,
    /// `--depth`: requests in flight per flow (closed loop), 1 for one.
    pub depth: u32,
    /// `--response-size`: bytes of each response; `None` for `msg_size` (an echo).
    pub response_size: Option<u32>,
    /// `--threads`: threads at each end driving the flows; `None` for one per available core
    /// (at most one per flow).
    pub threads: Option<u32>,
}

impl LatencyOptions {
    /// Whether this is a many-flow request/response test (`-P`, `--depth` above 1, or a
    /// response size other than the request's): `-P 1 --depth 1` is the one-flow test.
    pub fn many_flows(&self) -> bool {
        self.parallel > 1
            || self.depth > 1
            || self.response_size.is_some_and(|r| r != self.msg_size)
    }

    /// The response size: `--response-size`, else the request's.
    pub fn response_size(&self) -> u32 {
        self.response_size.unwrap_or(self.msg_size)
    }

    /// The client's threads for a many-flow test: `--threads`, else one per available core; at
    /// most one per flow.
    pub fn client_threads(&self) -> u32 {
        let cores = std::thread::available_parallelism()
            .map_or(1, |n| u32::try_from(n.get()).unwrap_or(u32::MAX));
        self.threads.unwrap_or(cores).clamp(1, self.parallel.max(1))
    }
}

impl Default for LatencyOptions {
    fn default() -> Self {
        Self {
            protocol: Protocol::Tcp,
            msg_size: 64,
            duration: Duration::from_secs(10),
            warmup: Duration::from_secs(1),
            rate: None,
            count: None,
            full_log: None,
            histogram: false,
            timestamps: false,
            one_way: false,
            busy_poll: false,
            cpu: None,
            socket: sonde_wire::SocketOptions::default(),
            interval: None,
            parallel: 1,
            depth: 1,
            response_size: None,
            threads: None,
        }
    }
}

/// `sonde throughput` options.
#[derive(Debug, Clone)]
pub struct ThroughputOptions {
    /// TCP or UDP.
    pub protocol: Protocol,
    /// Streams per direction.
    pub parallel: u32,
    /// Who sends.
    pub direction: Direction,
    /// Bytes per write (TCP) or datagram payload (UDP).
    pub msg_size: u32,
    /// UDP target for all streams of one direction together, bits/s; 0 = unlimited.
    pub bitrate: u64,
    /// How long the senders send.
    pub duration: Duration,
    /// Receiver report interval; `None` for none.
    pub interval: Option<Duration>,
    /// `--cpu`: the CPUs this host's streams run on, stream `i` on `cpus[i % len]`; the agent is
    /// asked to pin its streams too (to its `--cpu-list`). Empty: not pinned.
    pub cpus: Vec<u32>,
    /// `--read-size` (TCP): the most one read of each receiver asks for, bytes; `None` for the
    /// receivers' default, [`sonde_wire::DEFAULT_TCP_READ_SIZE`].
    pub read_size: Option<u32>,
    /// `-w`, `-C`, `-M`, `-N`, `-S`/`--dscp`/`--ecn`, `--fq-rate`, `--dont-fragment`: the data
    /// streams' socket options, set at both ends ([`sonde_wire::SocketOptions`]).
    pub socket: sonde_wire::SocketOptions,
    /// `-O` (TCP): the first part of the test, sent and received but not counted in the
    /// totals (its intervals are reported, marked omitted); the senders send it on top of
    /// `duration`. `None` for none.
    pub omit: Option<Duration>,
    /// `--skip-rx-copy` (TCP): both ends' receivers discard what they read without copying it
    /// (`MSG_TRUNC`, Linux), which lowers the CPU cost they report.
    pub skip_rx_copy: bool,
    /// `-n` (TCP): the senders stop after this many payload bytes in all (each stream its
    /// share) instead of after `duration`, and the test ends when the receivers have them.
    pub bytes: Option<u64>,
    /// `-k` (TCP): the senders stop after this many `msg_size` writes in all.
    pub blocks: Option<u64>,
}

impl Default for ThroughputOptions {
    fn default() -> Self {
        Self {
            protocol: Protocol::Tcp,
            parallel: 1,
            direction: Direction::Forward,
            msg_size: 128 * 1024,
            bitrate: 0,
            duration: Duration::from_secs(10),
            interval: None,
            cpus: Vec::new(),
            read_size: None,
            socket: sonde_wire::SocketOptions::default(),
            omit: None,
            skip_rx_copy: false,
            bytes: None,
            blocks: None,
        }
    }
}

/// `sonde pps` options.
#[derive(Debug, Clone)]
pub struct PpsOptions {
    /// Datagram payload, bytes (18: a 64-byte Ethernet frame over IPv4).
    pub msg_size: u32,
    /// Parallel flows (each its own UDP socket and port).
    pub flows: u32,
    /// How long the senders send.
    pub duration: Duration,
    /// UDP GSO batches: on, off, or where the route to the agent segments them (auto).
    pub gso: GsoMode,
    /// Receiver intervals (`-i`); `None` for none.
    pub interval: Option<Duration>,
    /// `-O`: sent first, before `duration`, and left out of the totals (the agent's receivers
    /// cut it off by sequence number; its intervals are reported, marked omitted).
    pub omit: Option<Duration>,
    /// `--cpu`: the CPUs this host's flows run on, flow `i` on `cpus[i % len]`; the agent is
    /// asked to pin its flows too. Empty: not pinned.
    pub cpus: Vec<u32>,
    /// `-w`, `-C`, `-M`, `-N`, `-S`/`--dscp`/`--ecn`, `--fq-rate`, `--dont-fragment`: the data
    /// streams' socket options, set at both ends ([`sonde_wire::SocketOptions`]).
    pub socket: sonde_wire::SocketOptions,
}

impl Default for PpsOptions {
    fn default() -> Self {
        Self {
            msg_size: 18,
            flows: 1,
            duration: Duration::from_secs(10),
            gso: GsoMode::Auto,
            interval: None,
            omit: None,
            cpus: Vec::new(),
            socket: sonde_wire::SocketOptions::default(),
        }
    }
}

/// The wall-clock time now, milliseconds since the Unix epoch (0 for a clock set before it):
/// the one place a result's start time (`timestamp_unix_ms`) is read from the clock.
pub fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Marks a result as ended early by the caller, with the warning a reader needs.
pub(crate) fn mark_interrupted(meta: &mut sonde_report::Meta) {
    meta.interrupted = true;
    meta.add(&sonde_report::Warning::Interrupted);
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A latency result and the histogram of round-trip times its figures come from. The histogram
/// is for the results store (distributions, exact merges of repetitions), not the document.
#[derive(Debug, Clone)]
pub struct LatencyMeasurement {
    /// The document.
    pub result: LatencyResult,
    /// The RTT histogram behind `result.rtt_ns`, serialized (hdrhistogram V2, deflated:
    /// `sonde_engine::rtt::RttRecorder::serialized`).
    pub rtt_histogram: Vec<u8>,
}

impl test::sealed::Sealed<Target> for LatencyOptions {}

/// A latency test against a sonde agent; the result keeps its RTT histogram.
impl Test for LatencyOptions {
    type Output = LatencyMeasurement;
    type Interval = sonde_report::LatencyInterval;

    fn run(
        &self,
        target: &Target,
        controls: Controls<'_, sonde_report::LatencyInterval>,
    ) -> Result<LatencyMeasurement, ClientError> {
        let (interrupt, mut on_interval, mut hold) = controls.parts();
        let opt = self;
        if opt.msg_size == 0 {
            return Err(ClientError::Usage(
                "the message size must be at least 1 byte".into(),
            ));
        }
        // Before the inner view's checks: a refused --full-log creates no file.
        check_many_flows(opt)?;
        inner::check(opt)?;
        if opt.rate.is_some_and(|r| !(r > 0.0 && r.is_finite())) {
            return Err(ClientError::Usage(
                "--rate must be a positive number of messages per second".into(),
            ));
        }
        if opt.count == Some(0) {
            return Err(ClientError::Usage("-n must be at least 1".into()));
        }
        if opt.interval.is_some_and(|i| i < Duration::from_millis(10)) {
            return Err(ClientError::Usage(
                "-i: intervals of at least 0.01 s (each one's percentiles need replies to \
                 stand on)"
                    .into(),
            ));
        }
        check_tuning(opt)?;
        if opt.depth == 0 || opt.depth > sonde_wire::MAX_DEPTH {
            return Err(ClientError::Usage(format!(
                "--depth is 1 to {} requests in flight per flow, not {}",
                sonde_wire::MAX_DEPTH,
                opt.depth
            )));
        }
        if opt.parallel == 0 {
            return Err(ClientError::Usage("-P is at least 1 flow".into()));
        }
        if opt.many_flows() {
            return many_flows(
                target,
                opt,
                interrupt,
                &mut |iv| on_interval.call(iv),
                &mut || hold.call(),
            );
        }
        let mut opt = opt.clone();
        // Open loop with a count: the schedule puts exactly `count` messages after the warm-up.
        if let (Some(n), Some(rate)) = (opt.count, opt.rate) {
            opt.duration = Duration::from_secs_f64(n as f64 / rate);
            opt.count = None;
        }
        let spec = TestSpec {
            kind: TestKind::Latency,
            protocol: opt.protocol,
            direction: Direction::Forward,
            streams: 1,
            msg_size: opt.msg_size,
            bitrate_per_stream: 0,
            // A closed loop with a count has no planned end: it may run to the agent's limit.
            duration_ms: if opt.count.is_some() {
                0
            } else {
                millis(opt.warmup + opt.duration)
            },
            interval_ms: 0,
            read_size: 0,
            socket: check_socket(&opt.socket, opt.protocol, TestKind::Latency)?,
            omit_ms: 0,
            skip_rx_copy: false,
            bytes: 0,
            blocks: 0,
            request_response: None,
        };
        let run = session::run_latency_held(
            target,
            &spec,
            &opt,
            interrupt,
            &mut |iv| on_interval.call(iv),
            &mut || hold.call(),
        )?;
        let mut result = results::latency(target, &opt, &run);
        if run.interrupted {
            mark_interrupted(&mut result.meta);
        }
        Ok(LatencyMeasurement {
            result,
            rtt_histogram: run.outcome.rtt.serialized(),
        })
    }
}

/// What a many-flow test (`-P`, `--depth`, `--response-size`) cannot be combined with: a
/// usage error naming it, rather than a figure silently missing.
pub(crate) fn check_many_flows(opt: &LatencyOptions) -> Result<(), ClientError> {
    if !opt.many_flows() {
        return Ok(());
    }
    let refuse = |what: &str| {
        Err(ClientError::Usage(format!(
            "{what} is for the one-flow test (-P 1 --depth 1, responses the size of -m); many \
             flows or requests in flight take -m, --response-size, -t, --warmup, --rate, -i, \
             --threads, --cpu, --busy-poll and the socket options"
        )))
    };
    if opt.count.is_some() {
        return refuse("-n (count)");
    }
    if opt.full_log.is_some() {
        return refuse("--full-log");
    }
    if opt.timestamps {
        return refuse("--timestamps");
    }
    if opt.one_way {
        return refuse("--one-way");
    }
    if opt.parallel == 0 {
        return Err(ClientError::Usage("-P is at least 1 flow".into()));
    }
    if opt.threads == Some(0) || opt.threads.is_some_and(|t| t > sonde_wire::MAX_RR_THREADS) {
        return Err(ClientError::Usage(format!(
            "--threads is 1 to {}",
            sonde_wire::MAX_RR_THREADS
        )));
    }
    if !sonde_net::latency::rr::SUPPORTED {
        return Err(ClientError::Usage(
            "many flows or requests in flight (-P, --depth, --response-size) are not supported \
             on this platform (their readiness loop is epoll, Linux)"
                .into(),
        ));
    }
    sonde_net::latency::rr::check(
        opt.msg_size,
        opt.response_size(),
        opt.depth,
        opt.protocol == Protocol::Udp,
    )
    .map_err(|e| ClientError::Usage(e.to_string()))
}

/// The agent's view of a many-flow test.
pub(crate) fn many_flows_spec(opt: &LatencyOptions) -> Result<TestSpec, ClientError> {
    check_many_flows(opt)?;
    Ok(TestSpec {
        streams: opt.parallel,
        request_response: Some(sonde_wire::RequestResponse {
            depth: opt.depth,
            response_size: opt.response_size(),
            threads: opt.threads.unwrap_or(0),
        }),
        ..latency_spec(opt)?
    })
}

/// A many-flow latency test against a sonde agent.
fn many_flows(
    target: &Target,
    opt: &LatencyOptions,
    interrupt: &std::sync::atomic::AtomicBool,
    on_interval: &mut dyn FnMut(&sonde_report::LatencyInterval),
    hold: &mut dyn FnMut() -> Result<(), ClientError>,
) -> Result<LatencyMeasurement, ClientError> {
    let spec = many_flows_spec(opt)?;
    let run = session::run_many_flows(target, &spec, opt, interrupt, on_interval, hold)?;
    let mut result = results::latency(target, opt, &run);
    if run.interrupted {
        mark_interrupted(&mut result.meta);
    }
    Ok(LatencyMeasurement {
        result,
        rtt_histogram: run.outcome.rtt.serialized(),
    })
}

/// `--busy-poll` and `--cpu`: not the one-flow open loop (its sender thread and reader would
/// spin against each other), and a CPU this process may run on.
fn check_tuning(opt: &LatencyOptions) -> Result<(), ClientError> {
    // The many-flow open loop has no sender thread: its readiness loop spins on a zero wait.
    if opt.busy_poll && opt.rate.is_some() && !opt.many_flows() {
        return Err(ClientError::Usage(
            "--busy-poll with --rate is for many flows or requests in flight (-P, --depth); the \
             one-flow open loop's sender and reader would spin against each other: leave out \
             --rate or --busy-poll"
                .into(),
        ));
    }
    if let Some(cpu) = opt.cpu {
        check_cpus(&[cpu])?;
    }
    Ok(())
}

/// `--cpu`: CPUs this process may run on, on a platform that can pin threads.
fn check_cpus(cpus: &[u32]) -> Result<(), ClientError> {
    if cpus.is_empty() {
        return Ok(());
    }
    let allowed = sonde_net::tune::allowed_cpus().map_err(|e| {
        ClientError::Usage(format!("--cpu: this platform cannot pin threads ({e})"))
    })?;
    if let Some(cpu) = cpus.iter().find(|c| !allowed.contains(c)) {
        return Err(ClientError::Usage(format!(
            "--cpu {cpu}: not a CPU this process may run on (allowed: {})",
            sonde_net::tune::cpu_list(&allowed)
        )));
    }
    Ok(())
}

impl test::sealed::Sealed<Target> for ThroughputOptions {}

/// A throughput test against a sonde agent; live intervals are the receivers'.
impl Test for ThroughputOptions {
    type Output = ThroughputResult;
    type Interval = IntervalResult;

    fn run(
        &self,
        target: &Target,
        controls: Controls<'_, IntervalResult>,
    ) -> Result<ThroughputResult, ClientError> {
        let (interrupt, mut on_interval, mut hold) = controls.parts();
        let spec = throughput_spec(self)?;
        check_cpus(&self.cpus)?;
        let bulk = session::Bulk {
            gso: true,
            cpus: &self.cpus,
        };
        let run = session::run_bulk_held(
            target,
            &spec,
            interrupt,
            bulk,
            &mut |iv| on_interval.call(iv),
            &mut || hold.call(),
        )?;
        let mut result = results::throughput(target, self, &spec, &run);
        if run.interrupted {
            mark_interrupted(&mut result.meta);
        }
        Ok(result)
    }
}

impl test::sealed::Sealed<Target> for PpsOptions {}

/// A packet-rate test against a sonde agent; live intervals are the receivers'.
impl Test for PpsOptions {
    type Output = PpsResult;
    type Interval = PpsInterval;

    fn run(
        &self,
        target: &Target,
        controls: Controls<'_, PpsInterval>,
    ) -> Result<PpsResult, ClientError> {
        let (interrupt, mut on_interval, mut hold) = controls.parts();
        let opt = self;
        check_pps(opt)?;
        check_cpus(&opt.cpus)?;
        let spec = pps_spec(opt)?;
        let gso = sonde_net::gso::choose(opt.gso, target.addr.ip());
        let size = u64::from(opt.msg_size);
        let mut live = |iv: &IntervalResult| {
            on_interval.call(&PpsInterval {
                start_ns: iv.start_ns,
                end_ns: iv.end_ns,
                received: iv.packets,
                received_pps: sonde_engine::per_second(
                    iv.packets,
                    iv.end_ns.saturating_sub(iv.start_ns),
                ),
                // Every datagram counted is exactly -m bytes (the receive slot holds at least that).
                flow_received: iv.stream_bytes.iter().map(|b| b / size).collect(),
                // Marked by the session, as the result marks it.
                omitted: iv.omitted,
                interface: iv.interfaces.as_ref().and_then(|i| i.server.clone()),
            });
        };
        let bulk = session::Bulk {
            gso: gso.enabled,
            cpus: &opt.cpus,
        };
        let run = session::run_bulk_held(target, &spec, interrupt, bulk, &mut live, &mut || {
            hold.call()
        })?;
        let mut result = results::pps(target, opt, &gso, &run);
        if run.interrupted {
            mark_interrupted(&mut result.meta);
        }
        Ok(result)
    }
}

impl ThroughputOptions {
    /// What the client checks before it connects (`-P`, a UDP `-l`), for a caller that takes
    /// the options long before a test (a mesh file, at load).
    pub fn check(&self) -> Result<(), ClientError> {
        throughput_spec(self).map(|_| ())
    }
}

impl PpsOptions {
    /// What the client checks before it connects (`--flows`, `-m`), for a caller that takes
    /// the options long before a test (a mesh file, at load).
    pub fn check(&self) -> Result<(), ClientError> {
        check_pps(self)
    }
}

/// Checks pps options the agent cannot check for the client.
pub(crate) fn check_pps(opt: &PpsOptions) -> Result<(), ClientError> {
    if opt.flows == 0 {
        return Err(ClientError::Usage("--flows must be at least 1".into()));
    }
    if (opt.msg_size as usize) < sonde_wire::PPS_HEADER_LEN {
        return Err(ClientError::Usage(format!(
            "datagrams carry a {}-byte sequence header: -m must be at least {}",
            sonde_wire::PPS_HEADER_LEN,
            sonde_wire::PPS_HEADER_LEN
        )));
    }
    Ok(())
}

/// The agent's view of a pps test.
pub(crate) fn pps_spec(opt: &PpsOptions) -> Result<TestSpec, ClientError> {
    Ok(TestSpec {
        kind: TestKind::Pps,
        protocol: Protocol::Udp,
        direction: Direction::Forward,
        streams: opt.flows,
        msg_size: opt.msg_size,
        bitrate_per_stream: 0,
        duration_ms: millis(opt.duration),
        interval_ms: opt.interval.map_or(0, millis),
        read_size: 0,
        socket: check_socket(&opt.socket, Protocol::Udp, TestKind::Pps)?,
        omit_ms: opt.omit.map_or(0, millis),
        skip_rx_copy: false,
        bytes: 0,
        blocks: 0,
        request_response: None,
    })
}

/// The agent's view of a throughput test, once the options are checked.
pub(crate) fn throughput_spec(opt: &ThroughputOptions) -> Result<TestSpec, ClientError> {
    if opt.parallel == 0 {
        return Err(ClientError::Usage("-P must be at least 1".into()));
    }
    if opt.protocol == Protocol::Udp && (opt.msg_size as usize) < sonde_wire::DATA_HEADER_LEN {
        return Err(ClientError::Usage(format!(
            "UDP datagrams carry a {}-byte header: -l must be at least {}",
            sonde_wire::DATA_HEADER_LEN,
            sonde_wire::DATA_HEADER_LEN
        )));
    }
    if opt.bytes.is_some() || opt.blocks.is_some() {
        if opt.direction == Direction::Bidir {
            return Err(ClientError::Usage(
                "-n and -k are for one direction: not with --bidir".into(),
            ));
        }
        if opt.bytes.is_some() && opt.blocks.is_some() {
            return Err(ClientError::Usage("-n and -k cannot be combined".into()));
        }
        if opt.bytes == Some(0) || opt.blocks == Some(0) {
            return Err(ClientError::Usage("-n and -k must be above zero".into()));
        }
        if opt.omit.is_some_and(|o| !o.is_zero()) {
            return Err(ClientError::Usage(
                "-O cannot be combined with -n or -k (yet): which bytes a count includes would \
                 be a guess"
                    .into(),
            ));
        }
    }
    if opt.skip_rx_copy {
        if opt.protocol == Protocol::Udp {
            return Err(ClientError::Usage(
                "--skip-rx-copy is for TCP here: a UDP receiver reads each datagram's header \
                 for its sequence number"
                    .into(),
            ));
        }
        if opt.direction != Direction::Forward && !sonde_net::bulk::SKIP_RX_COPY {
            return Err(ClientError::Usage(
                "--skip-rx-copy (MSG_TRUNC receives) is not supported on this platform: with \
                 -R or --bidir this host receives"
                    .into(),
            ));
        }
    }
    if let Some(size) = opt.read_size {
        if opt.protocol == Protocol::Udp {
            return Err(ClientError::Usage(
                "--read-size is for TCP: a UDP receiver reads one datagram per call".into(),
            ));
        }
        if !(1..=sonde_wire::MAX_TCP_READ_SIZE).contains(&size) {
            return Err(ClientError::Usage(format!(
                "--read-size must be 1 to {} bytes",
                sonde_wire::MAX_TCP_READ_SIZE
            )));
        }
    }
    Ok(TestSpec {
        kind: TestKind::Throughput,
        protocol: opt.protocol,
        direction: opt.direction,
        streams: opt.parallel,
        msg_size: opt.msg_size,
        bitrate_per_stream: if opt.protocol == Protocol::Udp {
            opt.bitrate / u64::from(opt.parallel)
        } else {
            0
        },
        // Open-ended with -n or -k: as long as the agent allows (its --max-duration), filled in
        // when the agent says its limits.
        duration_ms: if opt.bytes.is_some() || opt.blocks.is_some() {
            0
        } else {
            millis(opt.duration)
        },
        interval_ms: opt.interval.map_or(0, millis),
        read_size: opt.read_size.unwrap_or(0),
        socket: throughput_socket(opt)?,
        omit_ms: opt.omit.map_or(0, millis),
        skip_rx_copy: opt.skip_rx_copy,
        bytes: opt.bytes.unwrap_or(0),
        blocks: opt.blocks.unwrap_or(0),
        request_response: None,
    })
}

/// The agent's view of a closed-loop latency test for the warm-up and the duration.
pub(crate) fn latency_spec(opt: &LatencyOptions) -> Result<TestSpec, ClientError> {
    Ok(TestSpec {
        kind: TestKind::Latency,
        protocol: opt.protocol,
        direction: Direction::Forward,
        streams: 1,
        msg_size: opt.msg_size,
        bitrate_per_stream: 0,
        duration_ms: millis(opt.warmup + opt.duration),
        interval_ms: 0,
        read_size: 0,
        socket: check_socket(&opt.socket, opt.protocol, TestKind::Latency)?,
        omit_ms: 0,
        skip_rx_copy: false,
        bytes: 0,
        blocks: 0,
        request_response: None,
    })
}

/// A TCP throughput test's socket options with `-b` in them: the rate of all streams of one
/// direction together, as for UDP, paced on each stream at its share (`SO_MAX_PACING_RATE` =
/// rate / streams). `--fq-rate` is the per-stream rate itself; the two together are refused.
pub(crate) fn throughput_socket(
    opt: &ThroughputOptions,
) -> Result<sonde_wire::SocketOptions, ClientError> {
    let mut socket = check_socket(&opt.socket, opt.protocol, TestKind::Throughput)?;
    if opt.protocol == Protocol::Tcp && opt.bitrate > 0 {
        if socket.pacing_bits_per_second.is_some() {
            return Err(ClientError::Usage(
                "-b and --fq-rate both set the TCP streams' pacing: -b is the rate of all streams \
                 together, --fq-rate each stream's; give one"
                    .into(),
            ));
        }
        socket.pacing_bits_per_second = Some((opt.bitrate / u64::from(opt.parallel.max(1))).max(8));
    }
    Ok(socket)
}

/// The socket options, checked against the test: TCP's options (`-C`, `-M`, `-N`) on a UDP
/// test and `--dont-fragment` on a TCP one are refused, as is what no kernel takes.
pub(crate) fn check_socket(
    socket: &sonde_wire::SocketOptions,
    protocol: Protocol,
    kind: TestKind,
) -> Result<sonde_wire::SocketOptions, ClientError> {
    let usage = |m: &str| Err(ClientError::Usage(m.into()));
    if protocol == Protocol::Udp {
        if socket.congestion.is_some() {
            return usage("-C/--congestion is for TCP: UDP has no congestion control");
        }
        if socket.mss_bytes.is_some() {
            return usage("-M/--set-mss is for TCP: UDP sends each datagram as it is (-l)");
        }
        if socket.no_delay {
            return usage("-N/--no-delay is for TCP: UDP sends each datagram at once");
        }
        if socket.zerocopy {
            return usage(
                "-Z/--zerocopy is for TCP: sonde's UDP senders send batches from one buffer (GSO)",
            );
        }
    } else if socket.dont_fragment {
        return usage(
            "--dont-fragment is for UDP: TCP already sends with DF set and sizes its segments \
             to the path MTU (path MTU discovery)",
        );
    }
    if socket.zerocopy && kind != TestKind::Throughput {
        return usage("-Z/--zerocopy is for throughput: only its TCP senders send in bulk");
    }
    if socket.zerocopy && !sonde_net::bulk::ZEROCOPY {
        return usage(
            "-Z/--zerocopy (MSG_ZEROCOPY) is not supported on this platform: it is Linux's",
        );
    }
    if kind == TestKind::Latency && socket.pacing_bits_per_second.is_some() {
        return usage("--fq-rate is for throughput: a latency test sends one message at a time");
    }
    if socket
        .window_bytes
        .is_some_and(|w| i32::try_from(w).is_err())
    {
        return usage("-w/--window is at most 2 GiB - 1 (the kernel's int)");
    }
    Ok(socket.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolve_accepts_the_usual_spellings() {
        assert_eq!(resolve("127.0.0.1", 5300).unwrap().addr.port(), 5300);
        assert_eq!(resolve("127.0.0.1:7000", 5300).unwrap().addr.port(), 7000);
        assert_eq!(resolve("[::1]:7000", 5300).unwrap().addr.port(), 7000);
        let v6 = resolve("::1", 5300).unwrap().addr;
        assert!(v6.is_ipv6());
        assert_eq!(v6.port(), 5300);
        assert!(matches!(
            resolve("no-such-host.invalid", 1),
            Err(ClientError::Resolve(..))
        ));
    }

    #[test]
    fn exit_codes_are_distinct_per_class() {
        let connect = ClientError::Connect(io::Error::other("x"), "127.0.0.1:1".parse().unwrap());
        let refused = ClientError::Refused {
            reason: Refusal::Busy,
            message: String::new(),
        };
        assert_eq!(connect.exit_code(), 3);
        assert_eq!(refused.exit_code(), 4);
        assert_eq!(ClientError::Usage(String::new()).exit_code(), 2);
        assert_eq!(ClientError::Remote(String::new()).exit_code(), 1);
    }
}
