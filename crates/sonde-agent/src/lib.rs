//! sonde's agent: one port for TCP and UDP, control and data; many sessions at once; limits;
//! and no input from the network that can make it panic or stop serving.
//!
//! A client opens a control connection (preamble, `Hello`, `Start`), gets a token, and joins its
//! data channels with it: TCP connections to the same port (preamble + `DataJoin`) and UDP flows
//! (an `SNDJ` join datagram to the same port, answered from a per-flow socket connected to the
//! client). The agent only ever sends to the address that opened the control connection.
//!
//! ```no_run
//! use sonde_agent::{Agent, AgentConfig};
//! let agent = Agent::bind(AgentConfig::new("127.0.0.1:0".parse().unwrap())).unwrap();
//! println!("listening on {}", agent.local_addr());
//! let handle = agent.spawn();
//! // ... run tests against it ...
//! handle.stop();
//! ```

mod admission;
mod clock;
mod control;
mod conversation;
mod crr;
mod event;
mod helper;
mod iperf3;
mod join;
mod link;
mod probe;
mod session;
mod sockperf;
/// The agent as a whole, through its sockets: bad input, limits, secrets, crr, descriptors.
#[cfg(test)]
mod tests;

/// CPU lists and pinning, for `AgentConfig::cpu_list` (`sonde server --cpu-list`).
pub use sonde_net::tune;

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

pub(crate) use admission::PendingGuard;
pub use event::{AgentEvent, EventSink, Events};
pub use helper::{Helper, HelperFailure, HelperJob, HelperOutcome, HelperRunner};
pub use link::{LinkBusy, LinkTest, LinkTests};
pub use probe::ProbeRefusal;
use sonde_net::control::{read_exact_by, ControlError};
use sonde_wire::auth::{Secret, SessionKey};
use sonde_wire::{Channel, DataJoin, JoinOutcome, Limits, TestSpec, Token, UdpJoin, DATA_JOIN_LEN};

/// Errors that stop the agent from starting or serving.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The TCP or UDP socket could not be bound.
    #[error("cannot listen on {1}: {0}")]
    Bind(io::Error, SocketAddr),
    /// A socket operation on the listening sockets failed.
    #[error("listening socket failed: {0}")]
    Listen(io::Error),
}

/// The agent's settings.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// Address and port for both TCP and UDP.
    pub bind: SocketAddr,
    /// Sessions allowed at once; more are refused as busy.
    pub max_sessions: u32,
    /// Longest test a client may ask for.
    pub max_duration: Duration,
    /// Most streams (per direction) in one session.
    pub max_streams: u32,
    /// Most flows of one many-flow latency test (`sonde latency -P`): they share a few
    /// threads' readiness loops, so they cost descriptors and memory, not threads.
    pub max_latency_flows: u32,
    /// Connections that are not yet sessions (or data channels handed to one), per listener
    /// (sonde's port and the iperf3 port each have this many); more are refused at once.
    pub max_pending: usize,
    /// Of those, what one source address may hold (plus, on sonde's port, the data channels
    /// its admitted sessions still expect); more from it are refused at once.
    pub max_pending_per_source: usize,
    /// Sessions one source address may run at once, of every kind; more are refused.
    pub max_sessions_per_source: u32,
    /// Of `max_sessions`, how many the sockperf listener may take (a sockperf session costs
    /// its peer one datagram or connection: cheap sessions get a budget of their own).
    pub max_sockperf_sessions: u32,
    /// sockperf sessions one source address may run at once.
    pub max_sockperf_sessions_per_source: u32,
    /// A cap on one sonde session's data rate, bits per second, like iperf3's
    /// `--server-bitrate-limit`: the agent's TCP senders are paced to it (`SO_MAX_PACING_RATE`,
    /// shared among the session's sending streams), and a UDP throughput or pps test asking for
    /// more in either direction (or for no limit) is refused; the iperf3 listener does the same
    /// (IETOTALRATE). `None`: no cap.
    pub max_bitrate: Option<u64>,
    /// How long a new connection may take to say who it is.
    pub hello_timeout: Duration,
    /// Where the agent reports what it does (sessions admitted and ended, refusals): one
    /// [`AgentEvent`] each. `None`: nothing is reported.
    pub events: Option<Events>,
    /// Also answer real iperf3 clients on this address (TCP and UDP), under the same limits.
    pub iperf3: Option<SocketAddr>,
    /// Also answer real sockperf clients on this address (TCP and UDP), under the same limits.
    pub sockperf: Option<SocketAddr>,
    /// Admit only sonde clients that prove this secret (`sonde_wire::auth`); `None` admits
    /// any. The iperf3 and sockperf listeners cannot authenticate (their protocols have no
    /// room for it): an agent with a secret should not enable them on an untrusted network.
    pub secret: Option<Secret>,
    /// `--helper`: run tests against third hosts at the request of clients that prove the
    /// shared secret (an agent without a secret refuses them all), with this runner ([`Helper`],
    /// sonde's client, injected by the binary). `None` refuses every helper request.
    pub helper: Option<Helper>,
    /// The CPUs the agent pins a latency echo to when a client asks (`sonde latency --cpu`,
    /// `sonde server --cpu-list`), one per session in turn from the last; `None`: the CPUs
    /// the agent may run on.
    pub cpu_list: Option<Vec<u32>>,
    /// Mesh mode: the throughput and pps tests on this agent's links, shared with its
    /// scheduler, so that the two ends of a link never test it at once ([`LinkTests`]). `None`:
    /// every session is served as usual.
    pub link_tests: Option<Arc<LinkTests>>,
    /// Mesh probes (`sonde_wire::probe`) are answered only when their send time is less than
    /// this far from the agent's clock (the replay window; peers' clocks must agree within it).
    pub probe_window: Duration,
    /// A sender counts in [`Stats::incoming_probers`] while its last valid probe is this recent.
    pub prober_recent: Duration,
}

impl AgentConfig {
    /// Defaults: 16 sessions (8 per source address), 300 s, 128 streams, 64 pending
    /// connections per listener (16 per source address), 5 s hello timeout.
    pub fn new(bind: SocketAddr) -> Self {
        Self {
            bind,
            max_sessions: 16,
            max_duration: Duration::from_secs(300),
            max_streams: 128,
            max_latency_flows: 1024,
            max_pending: 64,
            max_pending_per_source: 16,
            max_sessions_per_source: 8,
            max_sockperf_sessions: 8,
            max_sockperf_sessions_per_source: 2,
            max_bitrate: None,
            hello_timeout: Duration::from_secs(5),
            events: None,
            iperf3: None,
            sockperf: None,
            secret: None,
            helper: None,
            cpu_list: None,
            link_tests: None,
            probe_window: Duration::from_secs(30),
            prober_recent: Duration::from_secs(30),
        }
    }

    fn limits(&self) -> Limits {
        Limits {
            max_sessions: self.max_sessions,
            max_duration_ms: u64::try_from(self.max_duration.as_millis()).unwrap_or(u64::MAX),
            max_streams: self.max_streams,
            max_msg_size: MAX_MSG_SIZE,
            request_response: sonde_net::latency::rr::SUPPORTED,
        }
    }
}

/// Largest TCP write in a throughput test.
const MAX_MSG_SIZE: u32 = 1 << 20;
/// Largest message in a TCP latency test.
const MAX_TCP_MESSAGE: u32 = 65_536;
/// Largest UDP payload over IPv4.
const MAX_UDP_PAYLOAD: u32 = 65_507;

/// Counts of what the agent turned away, by kind.
#[derive(Debug, Default)]
pub struct Rejections {
    /// TCP connections refused because their listener had its maximum of pending connections.
    pub pending_full: AtomicU64,
    /// TCP connections refused because their source address had its maximum pending.
    pub pending_source_full: AtomicU64,
    /// Sessions refused because their source address ran its maximum of sessions (counted in
    /// `refused` too, for sonde sessions).
    pub source_sessions_full: AtomicU64,
    /// TCP connections with a bad or missing preamble or hello.
    pub bad_hello: AtomicU64,
    /// Data channels with an unknown token, wrong source address, or a stream out of range.
    pub bad_join: AtomicU64,
    /// UDP datagrams on the shared port that were not a valid join.
    pub udp_junk: AtomicU64,
    /// Sessions refused (busy, limits, bad request, version, authentication).
    pub refused: AtomicU64,
    /// Of those, clients refused for a missing or wrong proof of the shared secret.
    pub unauthenticated: AtomicU64,
    /// Accepts that failed because the process was out of file descriptors (or socket memory);
    /// each is followed by a pause of 100 ms, not an immediate retry.
    pub out_of_descriptors: AtomicU64,
    /// sockperf listener: TCP connections closed, and UDP datagrams dropped unanswered, because
    /// `max_sessions` sessions were running.
    pub sockperf_refused: AtomicU64,
    /// sockperf listener: UDP datagrams that could not be framed (shorter than a header, a
    /// length below 14 or above 65,507, a message cut off), and TCP connections closed for the
    /// same.
    pub sockperf_junk: AtomicU64,
    /// Connection-rate (`crr`) connections closed unanswered: an unknown token (or a session
    /// that has ended), another source address than the session's, a worker index out of range,
    /// a response size out of bounds, or a bad join.
    pub bad_crr: AtomicU64,
}

/// What the agent has served since it started, for its metrics (`sonde server --metrics`).
/// Counters only go up; read them with `Ordering::Relaxed`.
#[derive(Debug, Default)]
pub struct Stats {
    /// sonde sessions admitted, by kind (`sonde_wire::TestKind` order: latency, throughput,
    /// pps, crr); see [`Stats::sessions_of`].
    pub sessions: [AtomicU64; 4],
    /// sonde sessions (and connections turned away before they were one) refused, by
    /// [`sonde_wire::Refusal`]; see [`Stats::refusals_of`].
    pub refusals: [AtomicU64; 9],
    /// Test data bytes the agent's sonde sessions sent and received (payload, both directions).
    pub served_bytes: AtomicU64,
    /// Mesh probes answered (UDP and TCP).
    pub probes_answered: AtomicU64,
    /// Mesh probes not answered, by [`ProbeRefusal`]; see [`Stats::probe_refusals_of`].
    pub probe_refusals: [AtomicU64; 4],
    /// Distinct senders of a valid mesh probe within [`AgentConfig::prober_recent`], as of the
    /// last count (refreshed about once a second).
    pub incoming_probers: AtomicU64,
}

impl Stats {
    /// Sessions admitted of `kind`.
    pub fn sessions_of(&self, kind: sonde_wire::TestKind) -> u64 {
        self.sessions[kind_index(kind)].load(Ordering::Relaxed)
    }

    /// Sessions refused for `reason`.
    pub fn refusals_of(&self, reason: sonde_wire::Refusal) -> u64 {
        self.refusals[refusal_index(reason)].load(Ordering::Relaxed)
    }

    /// Mesh probes refused for `reason`.
    pub fn probe_refusals_of(&self, reason: ProbeRefusal) -> u64 {
        self.probe_refusals[reason.index()].load(Ordering::Relaxed)
    }

    pub(crate) fn admitted(&self, kind: sonde_wire::TestKind) {
        self.sessions[kind_index(kind)].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn refused(&self, reason: sonde_wire::Refusal) {
        self.refusals[refusal_index(reason)].fetch_add(1, Ordering::Relaxed);
    }
}

fn kind_index(kind: sonde_wire::TestKind) -> usize {
    use sonde_wire::TestKind as K;
    match kind {
        K::Latency => 0,
        K::Throughput => 1,
        K::Pps => 2,
        K::Crr => 3,
    }
}

fn refusal_index(reason: sonde_wire::Refusal) -> usize {
    use sonde_wire::Refusal as R;
    match reason {
        R::Version => 0,
        R::Busy => 1,
        R::Limits => 2,
        R::BadRequest => 3,
        R::ShuttingDown => 4,
        R::Unauthenticated => 5,
        R::SourceBusy => 6,
        R::TokenTaken => 8,
        _ => 7,
    }
}

/// A data channel handed to its session.
#[derive(Debug)]
pub(crate) enum DataChannel {
    Tcp(TcpStream),
    Udp(UdpSocket),
}

/// A session waiting for, or running with, its data channels.
#[derive(Debug)]
pub(crate) struct Slot {
    pub(crate) peer_ip: IpAddr,
    pub(crate) spec: TestSpec,
    pub(crate) channels: Mutex<Vec<Option<DataChannel>>>,
    pub(crate) joined: Condvar,
    /// Set (under the `channels` lock) once the session has taken its channels or given up
    /// waiting: later joins are refused, not parked.
    pub(crate) closed: AtomicBool,
    /// Most other sessions seen running at once during this one.
    pub(crate) overlap: AtomicU32,
    /// With a shared secret: the session's key, which its UDP joins must be signed with.
    pub(crate) key: Option<SessionKey>,
}

pub(crate) struct Shared {
    pub(crate) cfg: AgentConfig,
    pub(crate) local: SocketAddr,
    pub(crate) slots: Mutex<HashMap<Token, Arc<Slot>>>,
    pub(crate) shutdown: AtomicBool,
    /// Connections of sonde's port that are not yet sessions.
    pub(crate) pending_sonde: admission::Pending,
    /// Connections of the iperf3 port that are not yet sessions.
    pub(crate) pending_iperf3: admission::Pending,
    /// Compatibility-listener sessions per source address (under the `slots` lock).
    pub(crate) compat_by_source: Mutex<HashMap<IpAddr, u32>>,
    /// sockperf sessions per source address.
    pub(crate) sockperf_by_source: Mutex<HashMap<IpAddr, u32>>,
    pub(crate) next_session: AtomicU64,
    /// This agent process, as `Accepted` and the answers to data joins name it (drawn at
    /// random when the agent binds).
    pub(crate) agent_id: sonde_wire::AgentId,
    pub(crate) rejections: Rejections,
    pub(crate) stats: Stats,
    /// Sessions of the compatibility listeners (iperf3, sockperf) running now; they count
    /// against `max_sessions` together with `slots`.
    pub(crate) compat_sessions: AtomicU32,
    pub(crate) iperf3_local: Option<SocketAddr>,
    pub(crate) sockperf_local: Option<SocketAddr>,
    /// Connection-rate sessions running now.
    pub(crate) crr: crr::Registry,
    /// Pinned echoes so far: the next one takes the CPU after the last one's.
    pub(crate) pinned: std::sync::atomic::AtomicUsize,
    /// Mesh probes: the replay guard and who probed recently.
    pub(crate) probes: probe::Desk,
}

impl Shared {
    /// Tells a data or crr connection that asked what became of its join, naming this agent
    /// (a [`sonde_wire::JoinAnswer`]): false when it could not be written.
    pub(crate) fn answer_join(&self, stream: &mut TcpStream, outcome: JoinOutcome) -> bool {
        let a = sonde_wire::JoinAnswer {
            outcome,
            agent: self.agent_id,
        };
        io::Write::write_all(stream, &a.encode()).is_ok()
    }

    pub(crate) fn slots(&self) -> MutexGuard<'_, HashMap<Token, Arc<Slot>>> {
        lock(&self.slots)
    }

    /// The CPU the next pinned echo takes: the agent's `cpu_list` (or every CPU it may run
    /// on) in turn, from the last, so that a client on the same host pinned to CPU 0 (the
    /// usual choice) does not share its core with the echo.
    pub(crate) fn next_cpu(&self) -> std::io::Result<u32> {
        let list = match &self.cfg.cpu_list {
            Some(list) => list.clone(),
            None => sonde_net::tune::allowed_cpus()?,
        };
        let turn = self.pinned.fetch_add(1, Ordering::Relaxed);
        list.iter()
            .rev()
            .cycle()
            .nth(turn % list.len().max(1))
            .copied()
            .ok_or_else(|| std::io::Error::other("the agent's CPU list is empty"))
    }

    pub(crate) fn pending(&self, door: admission::Door) -> &admission::Pending {
        match door {
            admission::Door::Sonde => &self.pending_sonde,
            admission::Door::Iperf3 => &self.pending_iperf3,
        }
    }

    /// The connections `ip`'s admitted sessions may still open: their data channels, and the
    /// workers of a crr session.
    pub(crate) fn joins_expected_from(&self, ip: IpAddr) -> usize {
        self.slots()
            .values()
            .filter(|s| canonical(s.peer_ip) == ip)
            .map(|s| match s.spec.kind {
                sonde_wire::TestKind::Crr => s.spec.streams,
                _ => s.spec.channels(),
            })
            .map(|n| usize::try_from(n).unwrap_or(usize::MAX))
            .fold(0, usize::saturating_add)
    }

    /// Sessions `ip` runs now, of every kind; the caller holds the `slots` lock.
    fn running_from(&self, slots: &HashMap<Token, Arc<Slot>>, ip: IpAddr) -> u32 {
        let sonde = slots
            .values()
            .filter(|s| canonical(s.peer_ip) == ip)
            .count();
        let compat = lock(&self.compat_by_source).get(&ip).copied().unwrap_or(0);
        u32::try_from(sonde)
            .unwrap_or(u32::MAX)
            .saturating_add(compat)
    }

    /// Whether a new session from `ip` fits: the agent's and the source's limits.
    fn room_for(
        &self,
        slots: &HashMap<Token, Arc<Slot>>,
        ip: IpAddr,
    ) -> Result<u32, admission::Full> {
        let running = self.running(slots);
        if running >= self.cfg.max_sessions {
            return Err(admission::Full::Listener);
        }
        if self.running_from(slots, ip) >= self.cfg.max_sessions_per_source {
            self.rejections
                .source_sessions_full
                .fetch_add(1, Ordering::Relaxed);
            return Err(admission::Full::Source);
        }
        Ok(running)
    }

    /// Admits a session if there is room (for the agent and for its source address), noting
    /// the overlap in every running session.
    /// `asked`: the token the client asks the session to run under (another agent behind the
    /// same balancer admitted the test under it); `Ok(None)` when a session here has it.
    pub(crate) fn admit(
        &self,
        slot: Arc<Slot>,
        asked: Option<Token>,
    ) -> Result<Option<Token>, admission::Full> {
        let mut slots = self.slots();
        let running = self.room_for(&slots, canonical(slot.peer_ip))?;
        let token = match asked {
            Some(t) if slots.contains_key(&t) => return Ok(None),
            Some(t) => t,
            None => loop {
                let t = Token(random_u64());
                if !slots.contains_key(&t) {
                    break t;
                }
            },
        };
        for other in slots.values() {
            other.overlap.fetch_max(running, Ordering::Relaxed);
        }
        slot.overlap.store(running, Ordering::Relaxed);
        slots.insert(token, slot);
        Ok(Some(token))
    }

    /// Sessions running now, of every kind; the caller holds the `slots` lock.
    fn running(&self, slots: &HashMap<Token, Arc<Slot>>) -> u32 {
        u32::try_from(slots.len())
            .unwrap_or(u32::MAX)
            .saturating_add(self.compat_sessions.load(Ordering::Acquire))
    }

    /// Admits a compatibility-listener session (iperf3, sockperf) from `ip` if there is room
    /// (for the agent and for that source). The session counts against `max_sessions` and
    /// `max_sessions_per_source` until the guard drops. Running sonde sessions see it as overlap.
    pub(crate) fn admit_compat(&self, ip: IpAddr) -> Option<CompatSession<'_>> {
        let ip = canonical(ip);
        let slots = self.slots();
        let running = self.room_for(&slots, ip).ok()?;
        for other in slots.values() {
            other.overlap.fetch_max(running, Ordering::Relaxed);
        }
        *lock(&self.compat_by_source).entry(ip).or_insert(0) += 1;
        self.compat_sessions.fetch_add(1, Ordering::AcqRel);
        Some(CompatSession(self, ip))
    }

    /// Reports the event `make` makes to the agent's user, when it gave a sink (the event is
    /// made only then).
    pub(crate) fn report(&self, make: impl FnOnce() -> AgentEvent) {
        if let Some(events) = &self.cfg.events {
            events.0.event(make());
        }
    }
}

/// An admitted compatibility-listener session from an address; dropping it frees its place.
pub(crate) struct CompatSession<'a>(&'a Shared, IpAddr);

impl Drop for CompatSession<'_> {
    fn drop(&mut self) {
        let _slots = self.0.slots();
        let mut by_source = lock(&self.0.compat_by_source);
        if let Some(n) = by_source.get_mut(&self.1) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                by_source.remove(&self.1);
            }
        }
        self.0.compat_sessions.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The TCP listener and UDP socket of a compatibility listener, bound to one port number.
#[derive(Debug)]
pub(crate) struct CompatListener {
    pub(crate) tcp: TcpListener,
    pub(crate) udp: UdpSocket,
}

impl CompatListener {
    fn bind(addr: SocketAddr) -> Result<(Self, SocketAddr), Error> {
        let tcp = sonde_net::socket::tcp_listen(addr).map_err(|e| Error::Bind(e, addr))?;
        sonde_net::socket::set_accept_wake(&tcp).map_err(Error::Listen)?;
        let local = tcp.local_addr().map_err(Error::Listen)?;
        let udp = sonde_net::socket::udp_listen(local).map_err(|e| Error::Bind(e, local))?;
        Ok((Self { tcp, udp }, local))
    }
}

/// Locks a mutex, recovering the data if a thread panicked while holding it (the agent keeps
/// serving; the data is counters and channel slots, valid at every step).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    if getrandom::getrandom(&mut b).is_err() {
        // No entropy source: fall back to the clock, still unique per session.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        return u64::try_from(t.as_nanos()).unwrap_or(u64::MAX) ^ 0x9e37_79b9_7f4a_7c15;
    }
    u64::from_ne_bytes(b)
}

/// How long an accept loop pauses when the process is out of file descriptors: the connection
/// waits in the backlog, and retrying at once would spin a core.
const DESCRIPTOR_BACKOFF: Duration = Duration::from_millis(100);

/// The next connection on one of the agent's listeners; `None` once the agent is shutting down
/// (noticed within [`sonde_net::socket::ACCEPT_WAKE`]). Out of descriptors, it counts and backs
/// off instead of retrying at once.
pub(crate) fn next_connection(listener: &TcpListener, shared: &Shared) -> Option<TcpStream> {
    use sonde_net::socket::Accepted;
    loop {
        if shared.shutdown.load(Ordering::Relaxed) {
            return None;
        }
        match sonde_net::socket::accept(listener) {
            Accepted::Connection(stream) => return Some(stream),
            Accepted::Idle => {}
            Accepted::OutOfDescriptors => {
                shared
                    .rejections
                    .out_of_descriptors
                    .fetch_add(1, Ordering::Relaxed);
                thread::sleep(DESCRIPTOR_BACKOFF);
            }
            // A connection reset before it was accepted; a short pause in case it persists.
            Accepted::Failed(_) => thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// A fresh random nonce for one control connection; `None` without an entropy source (the
/// connection is then closed: a predictable nonce would allow replays).
pub(crate) fn random_nonce() -> Option<sonde_wire::auth::Nonce> {
    let mut n = [0u8; sonde_wire::auth::NONCE_LEN];
    getrandom::getrandom(&mut n).ok()?;
    Some(sonde_wire::auth::Nonce(n))
}

/// A bound agent, not yet serving.
pub struct Agent {
    tcp: TcpListener,
    udp: UdpSocket,
    iperf3: Option<CompatListener>,
    sockperf: Option<CompatListener>,
    shared: Arc<Shared>,
}

impl Agent {
    /// Binds the TCP and UDP sockets on `cfg.bind` (port 0: the OS picks one port, and UDP
    /// takes the same number).
    pub fn bind(cfg: AgentConfig) -> Result<Self, Error> {
        // Each connection holds a descriptor: the limit is the administrator's hard one, not a
        // shell's default soft one. Where it cannot be raised the agent runs with what it has.
        let _ = sonde_net::socket::raise_descriptor_limit();
        let tcp = sonde_net::socket::tcp_listen(cfg.bind).map_err(|e| Error::Bind(e, cfg.bind))?;
        sonde_net::socket::set_accept_wake(&tcp).map_err(Error::Listen)?;
        let local = tcp.local_addr().map_err(Error::Listen)?;
        let udp = sonde_net::socket::udp_listen(local).map_err(|e| Error::Bind(e, local))?;
        let (iperf3, iperf3_local) = cfg.iperf3.map(CompatListener::bind).transpose()?.unzip();
        let (sockperf, sockperf_local) =
            cfg.sockperf.map(CompatListener::bind).transpose()?.unzip();
        let pending_sonde = admission::Pending::new(cfg.max_pending, cfg.max_pending_per_source);
        let pending_iperf3 = admission::Pending::new(cfg.max_pending, cfg.max_pending_per_source);
        let probes = probe::Desk::new(cfg.probe_window, cfg.prober_recent);
        let shared = Arc::new(Shared {
            probes,
            cfg,
            local,
            slots: Mutex::new(HashMap::new()),
            shutdown: AtomicBool::new(false),
            pending_sonde,
            pending_iperf3,
            compat_by_source: Mutex::new(HashMap::new()),
            sockperf_by_source: Mutex::new(HashMap::new()),
            next_session: AtomicU64::new(1),
            agent_id: sonde_wire::AgentId(random_u64()),
            rejections: Rejections::default(),
            stats: Stats::default(),
            compat_sessions: AtomicU32::new(0),
            iperf3_local,
            sockperf_local,
            crr: crr::Registry::default(),
            pinned: std::sync::atomic::AtomicUsize::new(0),
        });
        Ok(Self {
            tcp,
            udp,
            iperf3,
            sockperf,
            shared,
        })
    }

    /// The address and port the agent serves on.
    pub fn local_addr(&self) -> SocketAddr {
        self.shared.local
    }

    /// The iperf3 listener's address, when [`AgentConfig::iperf3`] asked for one.
    pub fn iperf3_addr(&self) -> Option<SocketAddr> {
        self.shared.iperf3_local
    }

    /// The sockperf listener's address, when [`AgentConfig::sockperf`] asked for one.
    pub fn sockperf_addr(&self) -> Option<SocketAddr> {
        self.shared.sockperf_local
    }

    /// Serves until [`AgentHandle::stop`] is called (or forever).
    pub fn spawn(self) -> AgentHandle {
        let shared = Arc::clone(&self.shared);
        let thread = thread::Builder::new()
            .name("sonde-agent".into())
            .spawn(move || self.serve())
            .ok();
        AgentHandle { shared, thread }
    }

    /// Serves on the calling thread until `stop` becomes true (checked at least every 200 ms).
    pub fn run_until(self, stop: &AtomicBool) -> Result<(), Error> {
        let handle = self.spawn();
        while !stop.load(Ordering::Relaxed) {
            thread::sleep(Duration::from_millis(100));
        }
        handle.stop();
        Ok(())
    }

    fn serve(self) {
        let Self {
            tcp,
            udp,
            iperf3,
            sockperf,
            shared,
        } = self;
        let udp_shared = Arc::clone(&shared);
        let udp_thread = thread::Builder::new()
            .name("sonde-udp".into())
            .spawn(move || udp_dispatch(&udp, &udp_shared))
            .ok();
        let mut compat_threads = Vec::new();
        if let Some(listener) = iperf3 {
            let s = Arc::clone(&shared);
            compat_threads.extend(
                thread::Builder::new()
                    .name("sonde-iperf3".into())
                    .spawn(move || iperf3::serve(listener, &s))
                    .ok(),
            );
        }
        if let Some(listener) = sockperf {
            let s = Arc::clone(&shared);
            compat_threads.extend(
                thread::Builder::new()
                    .name("sonde-sockperf".into())
                    .spawn(move || sockperf::serve(listener, &s))
                    .ok(),
            );
        }
        let mut crr_pool = crr::Pool::new(&shared);
        while let Some(stream) = next_connection(&tcp, &shared) {
            // A mesh probe that has fully arrived is answered here, no thread spawned.
            let Some(stream) = probe::answer_at_accept(stream, &shared) else {
                continue;
            };
            // While a crr session runs, an idle pool thread takes the connection (crr.rs).
            let Some(stream) = crr_pool.offer(stream) else {
                continue;
            };
            spawn_connection(stream, &shared);
        }
        if let Some(t) = udp_thread {
            let _ = t.join();
        }
        for t in compat_threads {
            let _ = t.join();
        }
    }
}

/// A running agent.
pub struct AgentHandle {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl AgentHandle {
    /// The address and port the agent serves on.
    pub fn local_addr(&self) -> SocketAddr {
        self.shared.local
    }

    /// What the agent has turned away so far.
    pub fn rejections(&self) -> &Rejections {
        &self.shared.rejections
    }

    /// What the agent has served so far.
    pub fn stats(&self) -> &Stats {
        &self.shared.stats
    }

    /// The iperf3 listener's address, when [`AgentConfig::iperf3`] asked for one.
    pub fn iperf3_addr(&self) -> Option<SocketAddr> {
        self.shared.iperf3_local
    }

    /// The sockperf listener's address, when [`AgentConfig::sockperf`] asked for one.
    pub fn sockperf_addr(&self) -> Option<SocketAddr> {
        self.shared.sockperf_local
    }

    /// Sessions running now, of every kind (sonde, iperf3, sockperf).
    pub fn sessions(&self) -> usize {
        let slots = self.shared.slots();
        self.shared.running(&slots) as usize
    }

    /// Stops accepting, ends running sessions (their clients get an error) and waits.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        // The accept loops look at the flag at least every `ACCEPT_WAKE`: stopping needs no
        // connection to ourselves, which a vanished address or a firewall could keep from
        // arriving.
        self.shared.shutdown.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // Sessions notice the flag within their poll interval; give them a moment to say so.
        let deadline = Instant::now() + Duration::from_secs(2);
        while self.sessions() > 0 && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for AgentHandle {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.shutdown();
        }
    }
}

/// A new connection on sonde's port: a thread of its own if it is let in as pending (its
/// listener's and its source's limits), else refused at once with a line its client prints.
pub(crate) fn spawn_connection(stream: TcpStream, shared: &Arc<Shared>) {
    let allowance = |ip| shared.joins_expected_from(ip);
    let Some(guard) = admission::let_in(shared, admission::Door::Sonde, &stream, allowance) else {
        return;
    };
    let conn_shared = Arc::clone(shared);
    // A failed spawn drops the closure, and with it the connection and its pending place.
    let _ = thread::Builder::new()
        .name("sonde-conn".into())
        .spawn(move || handle_connection(stream, &conn_shared, guard));
}

fn handle_connection(mut stream: TcpStream, shared: &Arc<Shared>, guard: PendingGuard) {
    let mut pending = Some(guard);
    let deadline = Instant::now() + shared.cfg.hello_timeout;
    let mut prefix = [0u8; sonde_wire::PREAMBLE_LEN];
    let preamble = match read_exact_by(&mut stream, &mut prefix, deadline).and_then(|()| {
        if let Some(len) = sonde_wire::probe::probe_len_from_prefix(&prefix) {
            return Ok(Err(len));
        }
        Ok(Ok(sonde_wire::Preamble::decode(&prefix)?))
    }) {
        // A mesh probe: answered and closed, no session (probe.rs).
        Ok(Err(len)) => {
            if !probe::tcp(stream, prefix, len, shared, deadline) {
                shared.rejections.bad_hello.fetch_add(1, Ordering::Relaxed);
            }
            return;
        }
        Ok(Ok(p)) => p,
        Err(e) => {
            shared.rejections.bad_hello.fetch_add(1, Ordering::Relaxed);
            if !matches!(e, ControlError::Closed) {
                shared.report(|| AgentEvent::ClosedConnection {
                    peer: peer_of(&stream),
                    error: e.to_string(),
                });
            }
            return;
        }
    };
    match preamble.channel {
        Channel::Control => {
            let ok = session::run(stream, preamble, shared, &mut pending);
            if !ok {
                shared.rejections.bad_hello.fetch_add(1, Ordering::Relaxed);
            }
        }
        Channel::Crr => crr::serve_spawned(stream, preamble, shared, &mut pending),
        Channel::Data => {
            if preamble.check_version().is_err() || !join_tcp(stream, shared, deadline) {
                shared.rejections.bad_join.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

pub(crate) fn peer_of(stream: &TcpStream) -> String {
    stream
        .peer_addr()
        .map_or_else(|_| "?".to_owned(), |a| a.to_string())
}

fn join_tcp(mut stream: TcpStream, shared: &Shared, deadline: Instant) -> bool {
    let mut b = [0u8; DATA_JOIN_LEN];
    if sonde_net::control::read_exact_by(&mut stream, &mut b, deadline).is_err() {
        return false;
    }
    let Ok(join) = DataJoin::decode(&b) else {
        return false;
    };
    let Ok(peer) = stream.peer_addr() else {
        return false;
    };
    // A client that asked hears what became of its join, and from which agent: behind a
    // balancer it opens the channel again when it reached another agent than its session's.
    let answer =
        |stream: &mut TcpStream, outcome| join.answer && shared.answer_join(stream, outcome);
    let Some(slot) = shared.slots().get(&join.token).cloned() else {
        answer(&mut stream, JoinOutcome::NoSuchSession);
        return false;
    };
    if let Err(bad) = join::check(&slot, peer.ip(), sonde_wire::Protocol::Tcp, None) {
        answer(&mut stream, bad.outcome());
        return false;
    }
    let _ = stream.set_read_timeout(None);
    let _ = stream.set_nodelay(slot.spec.kind == sonde_wire::TestKind::Latency);
    // The answer leaves before the session can take the stream.
    deposit(
        &slot,
        join.stream,
        DataChannel::Tcp(stream),
        |c, outcome| {
            let DataChannel::Tcp(s) = c else { return false };
            !join.answer || answer(s, outcome)
        },
    )
}

/// Hands a data channel to its session; false when the index is out of range or taken, or the
/// session takes no more channels. `answer` tells the client, under the session's lock before
/// the channel is placed, what became of it (false: it could not, and the channel is dropped).
fn deposit(
    slot: &Slot,
    index: u32,
    mut channel: DataChannel,
    answer: impl FnOnce(&mut DataChannel, JoinOutcome) -> bool,
) -> bool {
    let mut channels = lock(&slot.channels);
    let closed = slot.closed.load(Ordering::Relaxed);
    match join::place(&mut channels, closed, index) {
        Ok(place) => {
            if !answer(&mut channel, JoinOutcome::Joined) {
                return false;
            }
            *place = Some(channel);
            slot.joined.notify_all();
            true
        }
        Err(bad) => {
            answer(&mut channel, bad.outcome());
            false
        }
    }
}

pub(crate) fn canonical(ip: IpAddr) -> IpAddr {
    ip.to_canonical()
}

/// The shared UDP port: join datagrams get a per-flow connected socket; everything else is
/// counted and dropped.
fn udp_dispatch(udp: &UdpSocket, shared: &Shared) {
    let _ = udp.set_read_timeout(Some(Duration::from_millis(200)));
    let mut buf = [0u8; 2048];
    while !shared.shutdown.load(Ordering::Relaxed) {
        shared.probes.count_probers(shared);
        let Ok((n, from)) = udp.recv_from(&mut buf) else {
            continue;
        };
        if buf[..n].starts_with(&sonde_wire::probe::PROBE_MAGIC) {
            if !probe::udp(udp, &buf[..n], from, shared) {
                shared.rejections.udp_junk.fetch_add(1, Ordering::Relaxed);
            }
            continue;
        }
        if !udp_join(udp, &buf[..n], from, shared) {
            shared.rejections.udp_junk.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn udp_join(udp: &UdpSocket, datagram: &[u8], from: SocketAddr, shared: &Shared) -> bool {
    let Ok(join) = UdpJoin::decode(datagram) else {
        return false;
    };
    if join.ack {
        return false;
    }
    // A join this agent cannot take because the flow reached the wrong agent (a balancer) or
    // came from another address (a NAT) is answered, as long as the join, so the client can
    // say why or try again from another port; any other bad join is not.
    let elsewhere = |outcome| {
        let e = sonde_wire::UdpElsewhere {
            flow: join.flow,
            token: join.token,
            agent: shared.agent_id,
            outcome,
        };
        let _ = udp.send_to(&e.encode(), from);
    };
    let Some(slot) = shared.slots().get(&join.token).cloned() else {
        elsewhere(JoinOutcome::NoSuchSession);
        return false;
    };
    match join::check(&slot, from.ip(), sonde_wire::Protocol::Udp, Some(&join)) {
        Ok(()) => {}
        Err(join::BadJoin::OtherAddress) => {
            elsewhere(JoinOutcome::OtherAddress);
            return false;
        }
        Err(_) => return false,
    }
    let ack = UdpJoin { ack: true, ..join }.encode();
    let already = lock(&slot.channels)
        .get(usize::from(join.flow))
        .is_some_and(Option::is_some);
    if already {
        // A retry that raced the flow socket's connect: answer from the shared port.
        let _ = udp.send_to(&ack, from);
        return true;
    }
    let Ok(flow) = sonde_net::socket::udp_flow(shared.local, from) else {
        return false;
    };
    // The test's TOS byte and DF from the first datagram on, the acknowledgement included (the
    // session sets them again, with the rest, and reads them back before Ready).
    if !slot.spec.socket.is_default() {
        let marking = sonde_net::socket::DataOptions {
            tos: slot.spec.socket.tos,
            dont_fragment: slot.spec.socket.dont_fragment,
            ..sonde_net::socket::DataOptions::default()
        };
        let _ = marking.apply_udp(&flow);
    }
    if flow.send(&ack).is_err() {
        return false;
    }
    deposit(
        &slot,
        u32::from(join.flow),
        DataChannel::Udp(flow),
        |_, _| true,
    )
}

/// Checks a test request against the agent's limits: `Err((reason, message))` to refuse it.
pub(crate) fn validate(
    spec: &TestSpec,
    cfg: &AgentConfig,
) -> Result<(), (sonde_wire::Refusal, String)> {
    use sonde_wire::{Protocol, Refusal, TestKind, DATA_HEADER_LEN, PPS_HEADER_LEN};
    let bad = |m: String| Err((Refusal::BadRequest, m));
    let limit = |m: String| Err((Refusal::Limits, m));
    if spec.streams == 0 {
        return bad("a test needs at least one stream".into());
    }
    if let Some(rr) = &spec.request_response {
        if spec.kind != TestKind::Latency {
            return bad(
                "many flows and requests in flight (-P, --depth) are for latency tests".into(),
            );
        }
        if !sonde_net::latency::rr::SUPPORTED {
            return bad(
                "many-flow latency tests (-P, --depth, --response-size) are not supported on this \
                 agent's platform"
                    .into(),
            );
        }
        if let Err(e) = sonde_net::latency::rr::check(
            spec.msg_size,
            rr.response_size,
            rr.depth,
            spec.protocol == Protocol::Udp,
        ) {
            return bad(e.to_string());
        }
        if rr.threads > sonde_wire::MAX_RR_THREADS {
            return bad(format!(
                "--threads is at most {}, not {}",
                sonde_wire::MAX_RR_THREADS,
                rr.threads
            ));
        }
        if spec.streams > cfg.max_latency_flows {
            return limit(format!(
                "{} flows asked, this agent allows {} (sonde server --max-latency-flows)",
                spec.streams, cfg.max_latency_flows
            ));
        }
    } else if spec.kind == TestKind::Latency && spec.streams != 1 {
        return bad("latency tests use one stream".into());
    } else if spec.streams > cfg.max_streams {
        return limit(format!(
            "{} streams asked, this agent allows {} (sonde server --max-streams)",
            spec.streams, cfg.max_streams
        ));
    }
    let max_ms = u64::try_from(cfg.max_duration.as_millis()).unwrap_or(u64::MAX);
    if spec.duration_ms == 0 {
        return bad("the test duration must be above zero".into());
    }
    if spec.duration_ms.saturating_add(spec.omit_ms) > max_ms {
        return limit(format!(
            "{:.1} s asked{}, this agent allows {:.1} s (sonde server --max-duration)",
            spec.duration_ms.saturating_add(spec.omit_ms) as f64 / 1e3,
            if spec.omit_ms > 0 {
                " (-O included)"
            } else {
                ""
            },
            max_ms as f64 / 1e3
        ));
    }
    // `-O` counts a TCP receiver's bytes from the omit time, and cuts a UDP receiver's
    // sequence numbers there; a latency or crr test has no omit period.
    if spec.omit_ms > 0 && !matches!(spec.kind, TestKind::Throughput | TestKind::Pps) {
        return bad("-O (omit) applies to throughput and pps tests".into());
    }
    if spec.bytes > 0 || spec.blocks > 0 {
        if spec.kind != TestKind::Throughput {
            return bad("-n and -k apply to throughput tests".into());
        }
        if spec.bytes > 0 && spec.blocks > 0 {
            return bad("-n and -k cannot be combined".into());
        }
        if spec.direction == sonde_wire::Direction::Bidir {
            return bad("-n and -k are for one direction, not --bidir".into());
        }
        if spec.omit_ms > 0 {
            return bad("-n and -k cannot be combined with -O".into());
        }
    }
    if spec.skip_rx_copy {
        if spec.kind != TestKind::Throughput || spec.protocol != Protocol::Tcp {
            return bad("--skip-rx-copy applies to TCP throughput tests".into());
        }
        if !sonde_net::bulk::SKIP_RX_COPY {
            return bad(
                "--skip-rx-copy (MSG_TRUNC receives) is not supported on this agent's platform"
                    .into(),
            );
        }
    }
    if spec.interval_ms != 0 && spec.interval_ms < 100 {
        return bad("the report interval must be at least 0.1 s".into());
    }
    let (min, max) = match (spec.protocol, spec.kind) {
        (Protocol::Tcp, TestKind::Latency) => (1, MAX_TCP_MESSAGE),
        (Protocol::Tcp, _) => (1, MAX_MSG_SIZE),
        (Protocol::Udp, TestKind::Latency) => (1, MAX_UDP_PAYLOAD),
        (Protocol::Udp, TestKind::Pps) => (PPS_HEADER_LEN as u32, MAX_UDP_PAYLOAD),
        (Protocol::Udp, _) => (DATA_HEADER_LEN as u32, MAX_UDP_PAYLOAD),
    };
    if spec.msg_size < min || spec.msg_size > max {
        return bad(format!(
            "message size {} is outside {min}..={max} bytes for this test",
            spec.msg_size
        ));
    }
    if spec.kind == TestKind::Crr
        && (spec.protocol != Protocol::Tcp || spec.msg_size > crr::MAX_CRR_MESSAGE)
    {
        return bad(format!(
            "connection rate tests are TCP, with requests of 1 to {} bytes",
            crr::MAX_CRR_MESSAGE
        ));
    }
    if spec.kind == TestKind::Pps && spec.protocol != Protocol::Udp {
        return bad("packet rate tests are UDP".into());
    }
    if let Some(cap) = cfg.max_bitrate {
        // Each direction's UDP rate is the client's to ask: the agent sends it, or must take
        // it in. Unlimited (0) is above any cap.
        let asked = spec
            .bitrate_per_stream
            .saturating_mul(u64::from(spec.streams));
        let udp_load = spec.protocol == Protocol::Udp && spec.kind != TestKind::Latency;
        // The agent's TCP senders are held to the cap by the kernel (SO_MAX_PACING_RATE); a
        // platform without it would send them unpaced, above the cap: refused instead.
        let agent_sends_tcp = spec.protocol == Protocol::Tcp
            && spec.kind == TestKind::Throughput
            && spec.direction != sonde_wire::Direction::Forward;
        if agent_sends_tcp && !sonde_net::socket::KERNEL_TCP_PACING {
            return limit(format!(
                "this agent caps its rate (sonde server --max-bitrate, {:.1} Mbit/s) but its \
                 platform cannot pace the TCP it would send (no SO_MAX_PACING_RATE): run the \
                 test forward (the client sends)",
                cap as f64 / 1e6
            ));
        }
        if udp_load && (spec.bitrate_per_stream == 0 || asked > cap) {
            return limit(format!(
                "{} asked, this agent allows at most {} per session (sonde server --max-bitrate)",
                if spec.bitrate_per_stream == 0 {
                    "an unlimited rate".to_owned()
                } else {
                    format!("{:.1} Mbit/s", asked as f64 / 1e6)
                },
                format_args!("{:.1} Mbit/s", cap as f64 / 1e6)
            ));
        }
    }
    Ok(())
}
