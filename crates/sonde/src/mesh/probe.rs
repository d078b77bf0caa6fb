//! The mesh's prober: one thread for every peer and protocol. A readiness loop (mio) over a
//! pool of UDP sockets (one per source port, `latency.source_ports`) and the TCP probes'
//! connections in flight, driven by `sonde_engine::probe::Prober` (when each probe is due,
//! from which port, which reply is whose, what is lost). Probes and replies are
//! `sonde_wire::probe`'s; the peer's agent answers them on its own port, no session.
//!
//! TCP probes: a fresh connection per probe (a new source port each time, as Pingmesh), its
//! connect time observed as `sonde_tcp_connect_seconds`, then one probe written and its reply
//! read, that exchange's round trip observed as the TCP `sonde_rtt_seconds`; the agent closes
//! first (so the TIME_WAIT is the agent's, not this host's source ports').
//!
//! Times are the user-space clock at send and at reading the reply (no kernel timestamps).

use std::collections::{BTreeMap, HashMap};
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use mio::net::{TcpStream, UdpSocket};
use mio::{Events, Interest, Poll, Token, Waker};
use sonde_engine::probe::{Event, ProbeConfig, Prober, Transmit};
use sonde_wire::auth::Secret;
use sonde_wire::probe::{Probe, ProbeReply, MAX_PROBE_LEN};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use super::metrics::{FloatGauge, Metrics, Pair, PairProto, Proto, RttHistogram};
use super::{log, MeshConfig, Peer};

/// A peer counts as down after this many probes in a row lost over every protocol.
pub(crate) const DOWN_AFTER: u32 = 3;
/// The longest the loop sleeps: how soon it sees `stop` and new commands without a wake.
const TICK: Duration = Duration::from_millis(100);
/// The prober's timer is coalesced: it wakes for due probes on a grid of this step and sends
/// every probe due by then, each stamped with the clock as it leaves. A probe leaves up to this
/// much after its (jittered) due time; at 5,000 peers and two protocols every 10 s that is 10
/// probes a wake-up instead of one (docs/mesh.md, "The budget at 5,000 peers").
const COALESCE_NS: u64 = 5_000_000;

const WAKER: Token = Token(0);
/// UDP pool sockets: IPv4 from token 1, IPv6 from 1 + 1024 (`source_ports` is at most 1024).
const V4_BASE: usize = 1;
const V6_BASE: usize = 1 + 1_024;
/// TCP probe connections from here up.
const CONN_BASE: usize = 4_096;

/// What the supervisor tells the prober.
pub(crate) enum Command {
    /// Probe this peer; `down` is set while it does not answer (its scheduled tests skip).
    Add(Peer, Arc<AtomicBool>),
    /// Stop probing this peer and remove its probe series.
    Remove(Peer),
}

/// The running prober thread.
pub(crate) struct ProberThread {
    commands: Arc<Mutex<Vec<Command>>>,
    waker: Arc<Waker>,
    thread: JoinHandle<()>,
}

impl ProberThread {
    pub(crate) fn send(&self, c: Command) {
        self.commands
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(c);
        let _ = self.waker.wake();
    }

    /// Waits for the thread (after `stop` was set).
    pub(crate) fn join(self) {
        let _ = self.waker.wake();
        let _ = self.thread.join();
    }
}

/// Starts the prober thread; it runs until `stop`.
pub(crate) fn spawn(
    cfg: &MeshConfig,
    secret: Secret,
    metrics: Arc<Metrics>,
    stop: Arc<AtomicBool>,
) -> io::Result<ProberThread> {
    let poll = Poll::new()?;
    let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
    let commands = Arc::new(Mutex::new(Vec::new()));
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
        ^ u64::from(std::process::id()).rotate_left(32);
    let driver = Driver {
        engine: Prober::new(
            ProbeConfig::new(cfg.interval, cfg.timeout, cfg.source_ports),
            seed,
        ),
        cfg: cfg.clone(),
        secret,
        metrics,
        origin: Instant::now(),
        poll,
        peers: HashMap::new(),
        ids: BTreeMap::new(),
        next_id: 0,
        v4: None,
        v6: None,
        pool_failed: false,
        conns: HashMap::new(),
        next_conn: CONN_BASE,
    };
    let c = Arc::clone(&commands);
    let thread = thread::Builder::new()
        .name("sonde-probe".into())
        .spawn(move || driver.run(&c, &stop))?;
    Ok(ProberThread {
        commands,
        waker,
        thread,
    })
}

type Key = (u32, Proto);

struct PeerEntry {
    peer: Peer,
    down: Arc<AtomicBool>,
    was_up: Option<bool>,
    /// This pair's series, each looked up by its labels once (when first written) and then
    /// written through the handle: no label strings built and hashed per probe.
    series: Series,
}

/// Handles on one pair's series, `None` until first written (a series appears when it has a
/// value, as before the handles were kept).
#[derive(Default)]
struct Series {
    up: Option<Gauge>,
    tcp_connect: Option<RttHistogram>,
    /// Indexed by [`proto_index`].
    protos: [ProtoSeries; 2],
}

#[derive(Default)]
struct ProtoSeries {
    sent: Option<Counter>,
    lost: Option<Counter>,
    rtt: Option<RttHistogram>,
    worst_port_ratio: Option<FloatGauge>,
    worst_port: Option<Gauge>,
}

fn proto_index(p: Proto) -> usize {
    match p {
        Proto::udp => 0,
        Proto::tcp => 1,
    }
}

/// The handle in `slot`, created from `family` under `labels` the first time.
fn series<'a, L, M>(
    slot: &'a mut Option<M>,
    family: &Family<L, M>,
    labels: impl FnOnce() -> L,
) -> &'a M
where
    L: Clone + std::hash::Hash + Eq,
    M: Clone + Default,
{
    slot.get_or_insert_with(|| family.get_or_create_owned(&labels()))
}

/// One socket per source port.
struct Pool {
    sockets: Vec<UdpSocket>,
    ports: Vec<u16>,
}

impl Pool {
    fn open(poll: &Poll, unspecified: IpAddr, n: u16, base: usize) -> io::Result<Self> {
        let mut sockets = Vec::with_capacity(usize::from(n));
        let mut ports = Vec::with_capacity(usize::from(n));
        for i in 0..usize::from(n) {
            let mut s = UdpSocket::bind(SocketAddr::new(unspecified, 0))?;
            ports.push(s.local_addr()?.port());
            poll.registry()
                .register(&mut s, Token(base + i), Interest::READABLE)?;
            sockets.push(s);
        }
        Ok(Self { sockets, ports })
    }
}

/// A TCP probe in flight.
struct Conn {
    stream: TcpStream,
    key: Key,
    nonce: u64,
    seq: u64,
    started: Instant,
    written_at: Option<Instant>,
    buf: [u8; MAX_PROBE_LEN],
    have: usize,
    want: usize,
    /// The reply was read: only the agent's close is awaited.
    answered: bool,
}

struct Driver {
    cfg: MeshConfig,
    secret: Secret,
    metrics: Arc<Metrics>,
    engine: Prober<Key>,
    origin: Instant,
    poll: Poll,
    peers: HashMap<u32, PeerEntry>,
    ids: BTreeMap<Peer, u32>,
    next_id: u32,
    v4: Option<Pool>,
    v6: Option<Pool>,
    /// A pool could not be opened (said once).
    pool_failed: bool,
    conns: HashMap<usize, Conn>,
    next_conn: usize,
}

fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn secs(ns: u64) -> f64 {
    #[expect(clippy::cast_precision_loss, reason = "RTTs are far below 2^52 ns")]
    let s = ns as f64 / 1e9;
    s
}

impl Driver {
    fn now_ns(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    fn run(mut self, commands: &Mutex<Vec<Command>>, stop: &AtomicBool) {
        let mut events = Events::with_capacity(1_024);
        let mut last_sweep = 0;
        while !stop.load(Ordering::Relaxed) {
            let queued =
                std::mem::take(&mut *commands.lock().unwrap_or_else(PoisonError::into_inner));
            for c in queued {
                self.command(c);
            }
            let now = self.now_ns();
            self.engine.handle_timeout(now);
            // Each probe is handed out (and its send time taken) just before it leaves, not
            // at the wake-up: a burst of due probes does not shift their measured send times.
            while let Some(t) = self.engine.poll_transmit(self.now_ns()) {
                self.transmit(&t);
            }
            self.drain_events();
            let now = self.now_ns();
            if now.saturating_sub(last_sweep) >= nanos(TICK) {
                last_sweep = now;
                self.sweep_conns();
            }
            // To the next step of the grid at or after the next thing due (a timeout's loss
            // is counted up to a step late; a probe leaves up to a step late).
            let wait = self
                .engine
                .next_timeout()
                .map_or(TICK, |due| {
                    let due = due.div_ceil(COALESCE_NS).saturating_mul(COALESCE_NS);
                    Duration::from_nanos(due.saturating_sub(now))
                })
                .min(TICK);
            if let Err(e) = self.poll.poll(&mut events, Some(wait)) {
                if e.kind() != io::ErrorKind::Interrupted {
                    log(format_args!("the prober's poll failed: {e}"));
                    thread::sleep(TICK);
                }
                continue;
            }
            for ev in &events {
                match ev.token() {
                    WAKER => {}
                    Token(t) if t >= CONN_BASE => self.conn_ready(t, ev.is_error()),
                    Token(t) => self.udp_ready(t),
                }
            }
            self.drain_events();
        }
    }

    fn command(&mut self, c: Command) {
        match c {
            Command::Add(peer, down) => {
                if self.ids.contains_key(&peer) {
                    return;
                }
                let id = self.next_id;
                self.next_id += 1;
                let now = self.now_ns();
                for &p in &self.cfg.protocols {
                    self.engine.add((id, Proto::from(p)), now);
                }
                self.ids.insert(peer.clone(), id);
                self.peers.insert(
                    id,
                    PeerEntry {
                        peer,
                        down,
                        was_up: None,
                        series: Series::default(),
                    },
                );
            }
            Command::Remove(peer) => {
                let Some(id) = self.ids.remove(&peer) else {
                    return;
                };
                for proto in [Proto::udp, Proto::tcp] {
                    self.engine.remove(&(id, proto));
                }
                let gone: Vec<usize> = self
                    .conns
                    .iter()
                    .filter(|(_, c)| c.key.0 == id)
                    .map(|(t, _)| *t)
                    .collect();
                for t in gone {
                    self.drop_conn(t);
                }
                self.peers.remove(&id);
                // Nothing of this peer is written after this: its series go stale.
                self.metrics.forget(&self.cfg.name, &peer.label);
            }
        }
    }

    fn transmit(&mut self, t: &Transmit<Key>) {
        let Some(entry) = self.peers.get_mut(&t.key.0) else {
            return;
        };
        let addr = entry.peer.addr;
        let name = &self.cfg.name;
        let s = &mut entry.series.protos[proto_index(t.key.1)];
        series(&mut s.sent, &self.metrics.sent, || {
            pair_proto(name, &entry.peer, t.key.1)
        })
        .inc();
        let probe = Probe {
            seq: t.seq,
            sent_unix_ns: unix_ns(),
            nonce: t.nonce,
            sender: &self.cfg.name,
        };
        let mut buf = [0u8; MAX_PROBE_LEN];
        let Ok(len) = probe.encode(&self.secret, self.cfg.msg_size as usize, &mut buf) else {
            self.engine.handle_failure(t.nonce);
            return;
        };
        let sent = match t.key.1 {
            Proto::udp => self.send_udp(addr, t.port, &buf[..len]),
            Proto::tcp => self.connect_tcp(addr, t, &buf[..len]),
        };
        if !sent {
            self.engine.handle_failure(t.nonce);
        }
    }

    fn pool(&mut self, v6: bool) -> Option<&Pool> {
        let (slot, unspecified, base) = if v6 {
            (&mut self.v6, IpAddr::V6(Ipv6Addr::UNSPECIFIED), V6_BASE)
        } else {
            (&mut self.v4, IpAddr::V4(Ipv4Addr::UNSPECIFIED), V4_BASE)
        };
        if slot.is_none() {
            match Pool::open(&self.poll, unspecified, self.cfg.source_ports, base) {
                Ok(p) => *slot = Some(p),
                Err(e) => {
                    if !self.pool_failed {
                        self.pool_failed = true;
                        log(format_args!(
                            "cannot open {} UDP source ports for the probes: {e}",
                            self.cfg.source_ports
                        ));
                    }
                    return None;
                }
            }
        }
        slot.as_ref()
    }

    fn send_udp(&mut self, addr: SocketAddr, port: u16, datagram: &[u8]) -> bool {
        let Some(pool) = self.pool(addr.is_ipv6()) else {
            return false;
        };
        pool.sockets
            .get(usize::from(port))
            .is_some_and(|s| s.send_to(datagram, addr).is_ok())
    }

    fn connect_tcp(&mut self, addr: SocketAddr, t: &Transmit<Key>, probe: &[u8]) -> bool {
        let Ok(mut stream) = TcpStream::connect(addr) else {
            return false;
        };
        let token = self.next_conn;
        self.next_conn = self.next_conn.checked_add(1).unwrap_or(CONN_BASE);
        if self
            .poll
            .registry()
            .register(
                &mut stream,
                Token(token),
                Interest::READABLE | Interest::WRITABLE,
            )
            .is_err()
        {
            return false;
        }
        let mut buf = [0u8; MAX_PROBE_LEN];
        buf[..probe.len()].copy_from_slice(probe);
        self.conns.insert(
            token,
            Conn {
                stream,
                key: t.key,
                nonce: t.nonce,
                seq: t.seq,
                started: Instant::now(),
                written_at: None,
                buf,
                have: 0,
                want: probe.len(),
                answered: false,
            },
        );
        true
    }

    /// Closes a probe's connection (closing its socket takes it out of the epoll set: no
    /// `deregister`, one system call fewer a probe).
    fn drop_conn(&mut self, token: usize) {
        self.conns.remove(&token);
    }

    /// A TCP probe that failed before its reply: lost, at once.
    fn fail_conn(&mut self, token: usize) {
        if let Some(c) = self.conns.get(&token) {
            if !c.answered {
                self.engine.handle_failure(c.nonce);
            }
        }
        self.drop_conn(token);
    }

    /// A probe's connection is ready. It is registered once, for both directions (epoll is
    /// edge-triggered under mio): the first writable edge is the connect's end, when the probe
    /// is written; readable edges bring the reply, then the agent's close. No `getsockopt`,
    /// `getpeername` or re-registration per probe: a refused or reset connect is an error
    /// event, or the write's error; a write before the handshake ends would block, and waits
    /// for the next edge. Nagle's algorithm does not hold a connection's first and only write
    /// (nothing is unacknowledged), so no `TCP_NODELAY` either.
    fn conn_ready(&mut self, token: usize, error: bool) {
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        if c.written_at.is_none() {
            if error {
                return self.fail_conn(token);
            }
            let connected = c.started.elapsed();
            match c.stream.write(&c.buf[..c.want]) {
                Ok(n) if n == c.want => {}
                // Not connected yet (a write in SYN_SENT would block): the next edge.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                _ => return self.fail_conn(token),
            }
            c.written_at = Some(Instant::now());
            let key = c.key;
            c.have = 0;
            if let Some(e) = self.peers.get_mut(&key.0) {
                let name = &self.cfg.name;
                series(&mut e.series.tcp_connect, &self.metrics.tcp_connect, || {
                    pair(name, &e.peer)
                })
                .observe(connected.as_secs_f64());
            }
        }
        loop {
            let Some(c) = self.conns.get_mut(&token) else {
                return;
            };
            if c.answered {
                let mut sink = [0u8; 64];
                match c.stream.read(&mut sink) {
                    Ok(0) => return self.drop_conn(token),
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => return self.drop_conn(token),
                }
                continue;
            }
            let want = c.want;
            match c.stream.read(&mut c.buf[c.have..want]) {
                Ok(0) => return self.fail_conn(token),
                Ok(n) => c.have += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return self.fail_conn(token),
            }
            if c.have < want {
                continue;
            }
            let rtt = c.written_at.map(|w| w.elapsed());
            let valid = ProbeReply::decode(&self.secret, &self.cfg.name, &c.buf[..want])
                .is_ok_and(|r| r.nonce == c.nonce && r.seq == c.seq);
            if !valid {
                return self.fail_conn(token);
            }
            c.answered = true;
            let (nonce, key) = (c.nonce, c.key);
            let now = self.now_ns();
            if self.engine.handle_reply(nonce, now) {
                if let (Some(rtt), Some(e)) = (rtt, self.peers.get_mut(&key.0)) {
                    let name = &self.cfg.name;
                    let s = &mut e.series.protos[proto_index(key.1)];
                    series(&mut s.rtt, &self.metrics.rtt, || {
                        pair_proto(name, &e.peer, key.1)
                    })
                    .observe(rtt.as_secs_f64());
                }
            }
        }
    }

    fn udp_ready(&mut self, token: usize) {
        let (v6, index) = if token >= V6_BASE {
            (true, token - V6_BASE)
        } else {
            (false, token - V4_BASE)
        };
        let mut buf = [0u8; MAX_PROBE_LEN + 1];
        loop {
            let pool = if v6 { &self.v6 } else { &self.v4 };
            let Some(socket) = pool.as_ref().and_then(|p| p.sockets.get(index)) else {
                return;
            };
            let (n, _from) = match socket.recv_from(&mut buf) {
                Ok(r) => r,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // WouldBlock, or an ICMP error from an earlier send: nothing more now.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(_) => continue,
            };
            let now = self.now_ns();
            let Ok(reply) = ProbeReply::decode(&self.secret, &self.cfg.name, &buf[..n]) else {
                continue;
            };
            // Its MAC says an agent of the mesh answered this agent's probe of that nonce (a
            // random 64-bit number only that probe carried). Its source address is not
            // checked: an agent bound to every address of a multi-homed host may answer from
            // another address than the one probed.
            self.engine.handle_reply(reply.nonce, now);
        }
    }

    /// Connections whose reply came and whose agent has not closed within the timeout, or whose
    /// probe the engine gave up on: closed.
    fn sweep_conns(&mut self) {
        let limit = self.cfg.timeout + Duration::from_secs(1);
        let old: Vec<usize> = self
            .conns
            .iter()
            .filter(|(_, c)| c.started.elapsed() > limit)
            .map(|(t, _)| *t)
            .collect();
        for t in old {
            self.drop_conn(t);
        }
    }

    fn drain_events(&mut self) {
        while let Some(e) = self.engine.poll_event() {
            let (key, lost, rtt_ns) = match e {
                Event::Reply { key, rtt_ns, .. } => (key, false, Some(rtt_ns)),
                Event::Lost { key, .. } => (key, true, None),
            };
            let Some(e) = self.peers.get_mut(&key.0) else {
                continue;
            };
            let name = &self.cfg.name;
            let s = &mut e.series.protos[proto_index(key.1)];
            let labels = || pair_proto(name, &e.peer, key.1);
            if lost {
                // A TCP probe given up on keeps its connection until `sweep_conns`: a reply
                // after the timeout is no longer outstanding, so it is not observed.
                series(&mut s.lost, &self.metrics.lost, labels).inc();
            }
            if key.1 == Proto::udp {
                if let Some(rtt_ns) = rtt_ns {
                    series(&mut s.rtt, &self.metrics.rtt, labels).observe(secs(rtt_ns));
                }
                if let Some(w) = self.engine.worst_port(&key) {
                    let pool = if e.peer.addr.is_ipv6() {
                        &self.v6
                    } else {
                        &self.v4
                    };
                    if let Some(port) = pool.as_ref().and_then(|p| p.ports.get(usize::from(w.port)))
                    {
                        series(
                            &mut s.worst_port_ratio,
                            &self.metrics.worst_port_ratio,
                            labels,
                        )
                        .set(w.lost_ratio);
                        series(&mut s.worst_port, &self.metrics.worst_port, labels)
                            .set(i64::from(*port));
                    }
                }
            }
            self.update_up(key.0);
        }
    }

    /// `sonde_peer_up` and the peer's `down` flag from its probes' recent outcomes: up while
    /// one protocol was answered within its last [`DOWN_AFTER`] probes, down once every
    /// protocol lost that many in a row; unknown (no series) before either.
    fn update_up(&mut self, id: u32) {
        let mut known = false;
        let mut up = false;
        for p in [Proto::udp, Proto::tcp] {
            if let Some((lost, answered)) = self.engine.losses(&(id, p)) {
                if answered && lost < DOWN_AFTER {
                    up = true;
                    known = true;
                } else if lost >= DOWN_AFTER {
                    known = true;
                }
            }
        }
        let Some(e) = self.peers.get_mut(&id) else {
            return;
        };
        if !known {
            return;
        }
        e.down.store(!up, Ordering::Relaxed);
        let name = &self.cfg.name;
        series(&mut e.series.up, &self.metrics.up, || pair(name, &e.peer)).set(i64::from(up));
        if e.was_up != Some(up) {
            if !up {
                log(format_args!(
                    "peer {} ({}) is not answering probes",
                    e.peer.label, e.peer.addr
                ));
            } else if e.was_up.is_some() {
                log(format_args!(
                    "peer {} ({}) answers probes again",
                    e.peer.label, e.peer.addr
                ));
            }
            e.was_up = Some(up);
        }
    }
}

fn pair(source: &str, peer: &Peer) -> Pair {
    Pair {
        source: source.to_owned(),
        target: peer.label.clone(),
    }
}

fn pair_proto(source: &str, peer: &Peer, protocol: Proto) -> PairProto {
    PairProto {
        source: source.to_owned(),
        target: peer.label.clone(),
        protocol,
    }
}
