//! What a client run produced and where it ran: the data channels, the run records that the
//! results are built from ([`LatencyRun`], [`BulkRun`]) and their [`Context`].
//!
//! Plain data, below `session` (which fills it), `inner` and `results` (which read it); it
//! uses none of them.

use std::net::{TcpStream, UdpSocket};

use sonde_net::bulk::{SendOutcome, TcpRecvOutcome, UdpRecvOutcome};
use sonde_net::latency::LatencyOutcome;
use sonde_wire::{
    AgentReport, CpuReport, HostInfo, IntervalStats, SessionId, StreamStats, TcpInfoStats,
    TuningReport,
};

use crate::Target;

/// A data channel of a session, connected to the agent.
pub(crate) enum ClientChannel {
    Tcp(TcpStream),
    Udp(UdpSocket),
}

/// What a run says about where it ran and what it cost this end, beside its counts.
#[derive(Debug, Clone, Default)]
pub(crate) struct Context {
    /// The peer is a sonde agent: what it does not report deserves a warning.
    pub(crate) agent: bool,
    /// This host, for the interface toward the agent.
    pub(crate) client_host: Option<HostInfo>,
    /// The agent, as its `Welcome` described it.
    pub(crate) server_host: Option<HostInfo>,
    /// This end's CPU cost; `None` where it cannot be measured.
    pub(crate) client_cpu: Option<CpuReport>,
    /// Which agent took the session's channels, and which others answered on the way.
    pub(crate) placement: crate::session::Placement,
    /// The socket options asked for, and what this host's kernel made of them on its first
    /// data stream; `None` when none were asked.
    pub(crate) socket: Option<(sonde_wire::SocketOptions, sonde_wire::AppliedSocketOptions)>,
    /// The local address and port of each data channel, in channel order.
    pub(crate) sources: Vec<Option<std::net::SocketAddr>>,
    /// What this host's interface toward the agent counted over the test; `None` where it
    /// cannot be read.
    pub(crate) interface: Option<sonde_wire::InterfaceDelta>,
}

impl Context {
    /// This host's configuration as a test toward `target` sees it; nothing about the peer.
    pub(crate) fn this_host(target: &Target) -> Self {
        Self {
            client_host: Some(sonde_net::hostinfo::collect_for_peer(
                env!("CARGO_PKG_VERSION"),
                target.addr.ip(),
            )),
            ..Self::default()
        }
    }
}

/// What a latency run produced.
pub(crate) struct LatencyRun {
    pub(crate) session: SessionId,
    pub(crate) started_unix_ms: u64,
    pub(crate) outcome: LatencyOutcome,
    pub(crate) elapsed_ns: u64,
    pub(crate) report: AgentReport,
    /// Both ends' configuration and this end's CPU cost.
    pub(crate) context: Context,
    /// Stopped early by the caller's interrupt flag.
    pub(crate) interrupted: bool,
    /// `--busy-poll`, `--cpu`: how this end ran (`None` when neither was asked).
    pub(crate) tuning: Option<TuningReport>,
    /// `-i`: the intervals, in order (empty without).
    pub(crate) intervals: Vec<sonde_report::LatencyInterval>,
    /// `-P`/`--depth`: each flow's counts and the client's threads; `None` for one flow.
    pub(crate) many_flows: Option<ManyFlowsRun>,
}

/// What a many-flow run adds to a [`LatencyRun`].
#[derive(Debug, Clone)]
pub(crate) struct ManyFlowsRun {
    /// Each flow's counts, in flow order.
    pub(crate) flows: Vec<sonde_net::latency::rr::RrFlow>,
    /// The client's threads.
    pub(crate) threads: u32,
}

/// One client data channel's outcome.
pub(crate) enum ClientRole {
    Sent(SendOutcome),
    TcpReceived(TcpRecvOutcome),
    UdpReceived(Box<UdpRecvOutcome>),
}

/// What a throughput or pps run produced.
pub(crate) struct BulkRun {
    pub(crate) session: SessionId,
    pub(crate) started_unix_ms: u64,
    /// Per channel, the client's part.
    pub(crate) roles: Vec<ClientRole>,
    /// The agent's sender counts for the streams it sent (from its `SenderDone`).
    pub(crate) agent_sent: Vec<StreamStats>,
    /// The agent's report.
    pub(crate) report: AgentReport,
    /// Intervals the client measured on the streams it received.
    pub(crate) client_intervals: Vec<IntervalStats>,
    /// TCP senders' `TCP_INFO` per interval (by its start on the interval grid): the agent's
    /// senders' from its `Interval` messages, this host's sampled when those arrived.
    pub(crate) interval_tcp_info: Vec<(u64, Vec<TcpInfoStats>)>,
    /// Per channel: this host's TCP sender's `TCP_INFO` when its loop ended.
    pub(crate) client_tcp_info: Vec<Option<TcpInfoStats>>,
    /// Both ends' configuration and this end's CPU cost.
    pub(crate) context: Context,
    /// Stopped early by the caller's interrupt flag.
    pub(crate) interrupted: bool,
    /// `--cpu`: the CPUs this end's streams ran on (`None` when not asked).
    pub(crate) tuning: Option<TuningReport>,
}
