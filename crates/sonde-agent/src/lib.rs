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

mod clock;
mod crr;
mod iperf3;
mod session;
mod sockperf;

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use sonde_net::control::{read_preamble, ControlError};
use sonde_wire::{Channel, DataJoin, Limits, TestSpec, Token, UdpJoin, DATA_JOIN_LEN};

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
    /// Connections that have not finished their hello yet; more are closed at once.
    pub max_pending: usize,
    /// How long a new connection may take to say who it is.
    pub hello_timeout: Duration,
    /// Print one line per session to stderr.
    pub log: bool,
    /// Also answer real iperf3 clients on this address (TCP and UDP), under the same limits.
    pub iperf3: Option<SocketAddr>,
    /// Also answer real sockperf clients on this address (TCP and UDP), under the same limits.
    pub sockperf: Option<SocketAddr>,
}

impl AgentConfig {
    /// Defaults: 16 sessions, 300 s, 128 streams, 64 pending connections, 5 s hello timeout.
    pub fn new(bind: SocketAddr) -> Self {
        Self {
            bind,
            max_sessions: 16,
            max_duration: Duration::from_secs(300),
            max_streams: 128,
            max_pending: 64,
            hello_timeout: Duration::from_secs(5),
            log: false,
            iperf3: None,
            sockperf: None,
        }
    }

    fn limits(&self) -> Limits {
        Limits {
            max_sessions: self.max_sessions,
            max_duration_ms: u64::try_from(self.max_duration.as_millis()).unwrap_or(u64::MAX),
            max_streams: self.max_streams,
            max_msg_size: MAX_MSG_SIZE,
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
    /// TCP connections closed because too many were pending.
    pub pending_full: AtomicU64,
    /// TCP connections with a bad or missing preamble or hello.
    pub bad_hello: AtomicU64,
    /// Data channels with an unknown token, wrong source address, or a stream out of range.
    pub bad_join: AtomicU64,
    /// UDP datagrams on the shared port that were not a valid join.
    pub udp_junk: AtomicU64,
    /// Sessions refused (busy, limits, bad request, version).
    pub refused: AtomicU64,
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
}

pub(crate) struct Shared {
    pub(crate) cfg: AgentConfig,
    pub(crate) local: SocketAddr,
    pub(crate) slots: Mutex<HashMap<Token, Arc<Slot>>>,
    pub(crate) shutdown: AtomicBool,
    pub(crate) pending: AtomicUsize,
    pub(crate) next_session: AtomicU64,
    pub(crate) rejections: Rejections,
    /// Sessions of the compatibility listeners (iperf3, sockperf) running now; they count
    /// against `max_sessions` together with `slots`.
    pub(crate) compat_sessions: AtomicU32,
    pub(crate) iperf3_local: Option<SocketAddr>,
    pub(crate) sockperf_local: Option<SocketAddr>,
    /// Connection-rate sessions running now.
    pub(crate) crr: crr::Registry,
}

impl Shared {
    pub(crate) fn slots(&self) -> MutexGuard<'_, HashMap<Token, Arc<Slot>>> {
        lock(&self.slots)
    }

    /// Admits a session if there is room, noting the overlap in every running session.
    pub(crate) fn admit(&self, slot: Arc<Slot>) -> Option<Token> {
        let mut slots = self.slots();
        let running = self.running(&slots);
        if running >= self.cfg.max_sessions {
            return None;
        }
        let token = loop {
            let t = Token(random_u64());
            if !slots.contains_key(&t) {
                break t;
            }
        };
        for other in slots.values() {
            other.overlap.fetch_max(running, Ordering::Relaxed);
        }
        slot.overlap.store(running, Ordering::Relaxed);
        slots.insert(token, slot);
        Some(token)
    }

    /// Sessions running now, of every kind; the caller holds the `slots` lock.
    fn running(&self, slots: &HashMap<Token, Arc<Slot>>) -> u32 {
        u32::try_from(slots.len())
            .unwrap_or(u32::MAX)
            .saturating_add(self.compat_sessions.load(Ordering::Acquire))
    }

    /// Admits a compatibility-listener session (iperf3, sockperf) if there is room. The session
    /// counts against `max_sessions` until the guard drops. Running sonde sessions see it as
    /// overlap.
    pub(crate) fn admit_compat(&self) -> Option<CompatSession<'_>> {
        let slots = self.slots();
        let running = self.running(&slots);
        if running >= self.cfg.max_sessions {
            return None;
        }
        for other in slots.values() {
            other.overlap.fetch_max(running, Ordering::Relaxed);
        }
        self.compat_sessions.fetch_add(1, Ordering::AcqRel);
        Some(CompatSession(self))
    }

    pub(crate) fn log(&self, line: std::fmt::Arguments<'_>) {
        if self.cfg.log {
            eprintln!("{line}");
        }
    }
}

/// An admitted compatibility-listener session; dropping it frees its place.
pub(crate) struct CompatSession<'a>(&'a Shared);

impl Drop for CompatSession<'_> {
    fn drop(&mut self) {
        let _slots = self.0.slots();
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
        let tcp = sonde_net::socket::tcp_listen(cfg.bind).map_err(|e| Error::Bind(e, cfg.bind))?;
        let local = tcp.local_addr().map_err(Error::Listen)?;
        let udp = sonde_net::socket::udp_listen(local).map_err(|e| Error::Bind(e, local))?;
        let (iperf3, iperf3_local) = cfg.iperf3.map(CompatListener::bind).transpose()?.unzip();
        let (sockperf, sockperf_local) =
            cfg.sockperf.map(CompatListener::bind).transpose()?.unzip();
        let shared = Arc::new(Shared {
            cfg,
            local,
            slots: Mutex::new(HashMap::new()),
            shutdown: AtomicBool::new(false),
            pending: AtomicUsize::new(0),
            next_session: AtomicU64::new(1),
            rejections: Rejections::default(),
            compat_sessions: AtomicU32::new(0),
            iperf3_local,
            sockperf_local,
            crr: crr::Registry::default(),
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
        for conn in tcp.incoming() {
            if shared.shutdown.load(Ordering::Relaxed) {
                break;
            }
            let Ok(stream) = conn else { continue };
            // While a crr session runs, an idle pool thread takes the connection (crr.rs).
            let Some(stream) = crr_pool.offer(stream) else {
                continue;
            };
            let in_flight = shared.pending.fetch_add(1, Ordering::AcqRel);
            if in_flight >= shared.cfg.max_pending {
                shared.pending.fetch_sub(1, Ordering::AcqRel);
                shared
                    .rejections
                    .pending_full
                    .fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let conn_shared = Arc::clone(&shared);
            let spawned = thread::Builder::new()
                .name("sonde-conn".into())
                .spawn(move || handle_connection(stream, &conn_shared));
            if spawned.is_err() {
                shared.pending.fetch_sub(1, Ordering::AcqRel);
            }
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
        self.shared.shutdown.store(true, Ordering::Relaxed);
        // Wake the blocking accepts with connections of our own.
        let listeners = [
            Some(self.shared.local),
            self.shared.iperf3_local,
            self.shared.sockperf_local,
        ];
        for mut wake in listeners.into_iter().flatten() {
            if wake.ip().is_unspecified() {
                wake.set_ip(match wake {
                    SocketAddr::V4(_) => IpAddr::from([127, 0, 0, 1]),
                    SocketAddr::V6(_) => IpAddr::from(std::net::Ipv6Addr::LOCALHOST),
                });
            }
            let _ = TcpStream::connect_timeout(&wake, Duration::from_secs(1));
        }
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

struct PendingGuard<'a>(&'a Shared);

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        self.0.pending.fetch_sub(1, Ordering::AcqRel);
    }
}

fn handle_connection(mut stream: TcpStream, shared: &Arc<Shared>) {
    let mut pending = Some(PendingGuard(shared));
    let deadline = Instant::now() + shared.cfg.hello_timeout;
    let preamble = match read_preamble(&mut stream, deadline) {
        Ok(p) => p,
        Err(e) => {
            shared.rejections.bad_hello.fetch_add(1, Ordering::Relaxed);
            if !matches!(e, ControlError::Closed) {
                shared.log(format_args!(
                    "sonde agent: closed connection from {}: {e}",
                    peer_of(&stream)
                ));
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
    let Some(slot) = shared.slots().get(&join.token).cloned() else {
        return false;
    };
    if canonical(peer.ip()) != canonical(slot.peer_ip)
        || slot.spec.protocol != sonde_wire::Protocol::Tcp
    {
        return false;
    }
    let _ = stream.set_read_timeout(None);
    let _ = stream.set_nodelay(slot.spec.kind == sonde_wire::TestKind::Latency);
    deposit(&slot, join.stream, DataChannel::Tcp(stream))
}

/// Hands a data channel to its session; false when the index is out of range or taken.
fn deposit(slot: &Slot, index: u32, channel: DataChannel) -> bool {
    let mut channels = lock(&slot.channels);
    if slot.closed.load(Ordering::Relaxed) {
        return false;
    }
    let Some(place) = usize::try_from(index)
        .ok()
        .and_then(|i| channels.get_mut(i))
    else {
        return false;
    };
    if place.is_some() {
        return false;
    }
    *place = Some(channel);
    slot.joined.notify_all();
    true
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
        let Ok((n, from)) = udp.recv_from(&mut buf) else {
            continue;
        };
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
    let Some(slot) = shared.slots().get(&join.token).cloned() else {
        return false;
    };
    if canonical(from.ip()) != canonical(slot.peer_ip)
        || slot.spec.protocol != sonde_wire::Protocol::Udp
    {
        return false;
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
    if flow.send(&ack).is_err() {
        return false;
    }
    deposit(&slot, u32::from(join.flow), DataChannel::Udp(flow))
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
    if spec.kind == TestKind::Latency && spec.streams != 1 {
        return bad("latency tests use one stream".into());
    }
    if spec.streams > cfg.max_streams {
        return limit(format!(
            "{} streams asked, this agent allows {} (sonde server --max-streams)",
            spec.streams, cfg.max_streams
        ));
    }
    let max_ms = u64::try_from(cfg.max_duration.as_millis()).unwrap_or(u64::MAX);
    if spec.duration_ms == 0 {
        return bad("the test duration must be above zero".into());
    }
    if spec.duration_ms > max_ms {
        return limit(format!(
            "{:.1} s asked, this agent allows {:.1} s (sonde server --max-duration)",
            spec.duration_ms as f64 / 1e3,
            max_ms as f64 / 1e3
        ));
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
    Ok(())
}
