//! Mesh mode (`sonde server --mesh FILE`): the agent measures its peers, continuously, and
//! exposes the results for Prometheus (`--metrics`). The contract (file format, metric names):
//! docs/mesh.md.
//!
//! Threads, besides the agent's: one supervisor re-reads the peer list every `refresh`, tells
//! the prober which peers to probe, and runs the scheduled throughput and pps tests one at a
//! time as `sonde_engine::schedule` says; one prober thread ([`probe`]) sends every peer's
//! stateless probes (UDP over a pool of source ports, and TCP on a fresh connection each) and
//! observes each RTT as its reply comes. Neither grows with the number of peers. With
//! `[peers] kubernetes`, one or two more ([`kube`]) list and watch the API server.

pub(crate) mod config;
mod dns;
pub(crate) mod http;
pub(crate) mod kube;
pub(crate) mod metrics;
mod probe;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{SocketAddr, ToSocketAddrs, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sonde_agent::LinkTests;
use sonde_client::{ClientError, Controls, Target};
use sonde_engine::mesh_select::{Labels, Selection};
use sonde_engine::schedule::{Check, MeshScheduler};
use sonde_wire::auth::Secret;

pub(crate) use config::MeshConfig;
use metrics::{Dir, Metrics, Pair, PairDir};

/// A peer: its label (as listed, or the address for DNS peers) and where it answers.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Peer {
    label: String,
    addr: SocketAddr,
}

/// Starts the mesh; it runs until `stop`. A mesh needs the shared secret: its probes are
/// MACed with it, and an agent answers no probe without it (docs/mesh.md).
pub(crate) fn spawn(
    cfg: MeshConfig,
    secret: Option<Secret>,
    metrics: Arc<Metrics>,
    links: Arc<LinkTests>,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<JoinHandle<()>> {
    let Some(probe_secret) = secret.clone() else {
        anyhow::bail!(
            "mesh mode needs the mesh's shared secret (--secret-file FILE or SONDE_SECRET, the \
             same on every agent): probes are authenticated with it, and agents answer no \
             probe without it"
        );
    };
    anyhow::ensure!(
        !cfg.name.is_empty() && cfg.name.len() <= sonde_wire::probe::MAX_SENDER_LEN,
        "the mesh name {:?} must be 1 to {} bytes long (its probes carry it)",
        cfg.name,
        sonde_wire::probe::MAX_SENDER_LEN
    );
    let prober = probe::spawn(&cfg, probe_secret, Arc::clone(&metrics), Arc::clone(&stop))?;
    let kube = cfg
        .kubernetes
        .as_ref()
        .map(|k| kube::KubeWatch::spawn(k, &stop))
        .transpose()?;
    Ok(thread::Builder::new()
        .name("sonde-mesh".into())
        .spawn(move || {
            let sources = Sources {
                resolve: &dns::tcp_resolver,
                kube: kube.as_ref(),
            };
            supervise(
                &cfg,
                secret.as_ref(),
                &metrics,
                &links,
                &prober,
                &sources,
                &stop,
            );
            prober.join();
        })?)
}

/// One line per event on stderr: a peer joining or leaving, a peer going down (once, not at
/// every retry), a scheduled test failing. Few, so `--quiet` (no line per session) keeps them.
fn log(args: std::fmt::Arguments<'_>) {
    eprintln!("sonde mesh: {args}");
}

/// Whether `addr` is this agent: its port on one of this host's own addresses (only a local
/// address can be bound). Another agent on this host, on another port, is a peer.
fn is_own(addr: &SocketAddr, own_port: u16) -> bool {
    addr.port() == own_port
        && (addr.ip().is_unspecified() || UdpSocket::bind(SocketAddr::new(addr.ip(), 0)).is_ok())
}

/// `HOST` or `HOST:PORT` (`[v6]:PORT`) with the default port.
fn resolve_one(spec: &str, default_port: u16) -> Option<SocketAddr> {
    sonde_client::resolve(spec, default_port)
        .ok()
        .map(|t| t.addr)
}

/// Looks a DNS name up: every address of `name`, at `port` (injected, so a test can change the
/// record set between two refreshes).
type Resolver<'a> = dyn Fn(&str, u16) -> std::io::Result<Vec<SocketAddr>> + 'a;

/// The C library's resolver (`getaddrinfo`: A and AAAA records). `[peers] dns` is looked up
/// over TCP ([`dns::tcp_resolver`]), which comes here for names in /etc/hosts.
fn system_resolver(name: &str, port: u16) -> std::io::Result<Vec<SocketAddr>> {
    Ok((name, port).to_socket_addrs()?.collect())
}

/// The peer file as last read: its lines, and what said it was current.
struct PeerFile {
    modified: SystemTime,
    len: u64,
    /// When it was read: a write in the same timestamp tick as the read is not seen in `modified`.
    read_at: SystemTime,
    lines: Vec<config::Listed>,
}

impl PeerFile {
    /// A file's timestamp moves in ticks of the kernel's clock (milliseconds), and a rewrite
    /// (`echo ... > peers`) truncates before it writes: a read between the two sees an empty
    /// file whose timestamp the write may not change. As git does for its index ("racily
    /// clean" entries), a file read less than [`PeerFile::RACY`] after its timestamp is read
    /// again at the next refresh, whatever its timestamp and size say.
    const RACY: Duration = Duration::from_secs(2);

    fn may_have_changed(&self, (modified, len): (SystemTime, u64)) -> bool {
        modified != self.modified
            || len != self.len
            || self
                .read_at
                .duration_since(self.modified)
                .map_or(true, |d| d < Self::RACY)
    }
}

/// The peer sources that are not files: `[peers] dns`'s lookup, and `[peers] kubernetes`'
/// watches (injected, so that a test can drive them).
struct Sources<'a> {
    resolve: &'a Resolver<'a>,
    /// The watches' peers as last listed and watched (None until listed).
    kube: Option<&'a kube::KubeWatch>,
}

impl Sources<'_> {
    fn kube_view(&self) -> Option<kube::KubeView> {
        self.kube.map(kube::KubeWatch::view)
    }
}

/// How one peer source (`[peers] file`, `dns`, `kubernetes`) fared at the last refresh: what
/// `sonde_mesh_peer_source_*` say. A source that fails keeps giving the peers of its last good
/// read, so the probes go on and only these series show that the list is going stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SourceState {
    /// `file`, `dns` or `kubernetes`: the mesh file's key.
    pub(crate) source: &'static str,
    /// The file was read (or was unchanged), the name resolved, the watches listed and
    /// watching.
    pub(crate) up: bool,
    /// The peers (lines, addresses) it gives now, this agent among them where listed.
    pub(crate) peers: usize,
}

/// The peers of every source, de-duplicated by address, without this agent, and narrowed to
/// `[select]`'s when there is one; `[peers] dns` through `resolve`.
#[cfg(test)]
fn current_peers(
    cfg: &MeshConfig,
    last_file: &mut Option<PeerFile>,
    last_dns: &mut Vec<SocketAddr>,
    resolve: &Resolver<'_>,
) -> Vec<Peer> {
    current_peer_list(cfg, last_file, last_dns, &mut None, resolve, None).peers
}

/// The last selection's input (the list, this agent's name, the policy) and what this agent
/// took from it: the list rarely changes between refreshes, and computing everyone's selection
/// costs about 0.1 s for 10,000 agents.
struct SelectionMemo {
    nodes: Vec<(String, Labels)>,
    own: String,
    policy: sonde_engine::mesh_select::Policy,
    peers: BTreeSet<String>,
    probers: usize,
}

/// The peers this agent probes, and what the list says of the others.
struct PeerList {
    /// The peers to probe: every listed one, or `[select]`'s.
    peers: Vec<Peer>,
    /// Listed peers (without this agent).
    listed: usize,
    /// How many agents of the list probe this one (every listed peer, without `[select]`).
    expected_probers: usize,
    /// This agent's labels (the list's entry for it, then the mesh file's and the
    /// environment's for the keys the list does not give).
    own_labels: Labels,
    /// The labels of each peer probed, by its `target` name, as the list gives them.
    peer_labels: BTreeMap<String, Labels>,
    /// How each source the mesh file names fared.
    sources: Vec<SourceState>,
}

/// The peers of every source, de-duplicated by address, without this agent, narrowed to
/// `[select]`'s when there is one, with the counts of the whole list.
fn current_peer_list(
    cfg: &MeshConfig,
    last_file: &mut Option<PeerFile>,
    last_dns: &mut Vec<SocketAddr>,
    last_selection: &mut Option<SelectionMemo>,
    resolve: &Resolver<'_>,
    kube: Option<&kube::KubeView>,
) -> PeerList {
    let mut listed: Vec<config::Listed> = cfg.hosts.clone();
    let mut sources = Vec::new();
    if let Some(path) = &cfg.file {
        // Re-read only when it changed (or could not be read before, or may have changed
        // without a new timestamp: see `PeerFile::may_have_changed`).
        let meta = std::fs::metadata(path).ok();
        let stamp = meta
            .as_ref()
            .and_then(|m| Some((m.modified().ok()?, m.len())));
        let fresh = match (stamp, last_file.as_ref()) {
            (Some(stamp), Some(seen)) => seen.may_have_changed(stamp),
            _ => true,
        };
        // Up when read now, or unchanged since a good read.
        let mut up = stamp.is_some() && !fresh;
        if fresh {
            let read_at = SystemTime::now();
            match std::fs::read_to_string(path) {
                Ok(text) => {
                    let lines = text
                        .lines()
                        .map(|l| l.split('#').next().unwrap_or_default().trim())
                        .filter(|l| !l.is_empty())
                        .filter_map(|l| {
                            // A line whose labels do not parse is left out, said once per read:
                            // probed unlabelled, it would be selected as what it is not.
                            config::parse_listed(l)
                                .map_err(|e| {
                                    log(format_args!(
                                        "peer file {}: {e:#} (line left out)",
                                        path.display()
                                    ));
                                })
                                .ok()
                        })
                        .collect();
                    up = true;
                    *last_file = stamp.map(|(modified, len)| PeerFile {
                        modified,
                        len,
                        read_at,
                        lines,
                    });
                }
                Err(e) => log(format_args!(
                    "cannot read the peer file {}: {e}",
                    path.display()
                )),
            }
        }
        let lines = last_file.as_ref().map_or(&[][..], |seen| &seen.lines[..]);
        sources.push(SourceState {
            source: "file",
            up,
            peers: lines.len(),
        });
        listed.extend(lines.iter().cloned());
    }
    // This agent as the list names it (its labels as every agent sees them), when listed.
    let mut own: Option<(String, Labels)> = None;
    let mut peers: BTreeMap<SocketAddr, (String, Labels)> = BTreeMap::new();
    for config::Listed { spec, labels } in listed {
        let host = config::host_part(&spec);
        let labels = cfg.labels_of(&spec, &labels);
        if host == cfg.name {
            own.get_or_insert((spec, labels));
            continue;
        }
        if let Some(addr) = resolve_one(&spec, config::DEFAULT_PORT) {
            peers.entry(addr).or_insert((spec, labels));
        }
    }
    if let Some(name) = &cfg.dns {
        // A lookup that fails keeps the last answer: a DNS blip does not drop every peer and
        // its series. An answer, even an empty one, replaces it.
        let up = match resolve(name, cfg.dns_port) {
            Ok(addrs) => {
                *last_dns = addrs;
                true
            }
            Err(e) => {
                log(format_args!(
                    "cannot resolve {name}: {e} (keeping its {} addresses of the last lookup)",
                    last_dns.len()
                ));
                false
            }
        };
        sources.push(SourceState {
            source: "dns",
            up,
            peers: last_dns.len(),
        });
        for &addr in last_dns.iter() {
            peers.entry(addr).or_insert_with(|| {
                let label = addr.ip().to_string();
                let labels = cfg.labels_of(&label, &Labels::new());
                (label, labels)
            });
        }
    }
    // `[peers] kubernetes`: addresses, named by address as DNS peers are, with their nodes'
    // labels; this agent among them by its port on a local address, or by its name.
    if let Some(view) = kube {
        sources.push(SourceState {
            source: "kubernetes",
            up: view.up,
            peers: view.peers.len(),
        });
        for p in &view.peers {
            let label = p.addr.ip().to_string();
            if label == cfg.name && own.is_none() {
                own = Some((label, p.labels.clone()));
                continue;
            }
            peers.entry(p.addr).or_insert((label, p.labels.clone()));
        }
    }
    let mut candidates = Vec::with_capacity(peers.len());
    for (addr, (label, labels)) in peers {
        if is_own(&addr, cfg.own_port) {
            own.get_or_insert((label, labels));
        } else {
            candidates.push((Peer { label, addr }, labels));
        }
    }
    let listed = candidates.len();
    // The list's labels of this agent come first (every agent computes this agent's selection
    // from them); its own labels fill in what the list does not say.
    let (own_name, mut own_labels) =
        own.unwrap_or_else(|| (cfg.name.clone(), cfg.labels_of(&cfg.name, &Labels::new())));
    for (k, v) in &cfg.labels {
        own_labels.entry(k.clone()).or_insert_with(|| v.clone());
    }
    let Some(policy) = &cfg.select else {
        let peer_labels = candidates
            .iter()
            .map(|(p, labels)| (p.label.clone(), labels.clone()))
            .collect();
        return PeerList {
            peers: candidates.into_iter().map(|(p, _)| p).collect(),
            listed,
            expected_probers: listed,
            own_labels,
            peer_labels,
            sources,
        };
    };
    let nodes: Vec<(String, Labels)> = candidates
        .iter()
        .map(|(p, labels)| (p.label.clone(), labels.clone()))
        .chain(std::iter::once((own_name.clone(), own_labels.clone())))
        .collect();
    let fresh = last_selection
        .as_ref()
        .is_none_or(|m| m.nodes != nodes || m.own != own_name || m.policy != *policy);
    if fresh {
        let selection = Selection::new(nodes.iter().cloned(), policy);
        *last_selection = Some(SelectionMemo {
            peers: selection
                .peers_of(&own_name)
                .into_iter()
                .flatten()
                .map(str::to_owned)
                .collect(),
            probers: selection.probers_of(&own_name).unwrap_or(0),
            nodes,
            own: own_name,
            policy: policy.clone(),
        });
    }
    let (peers, probers) = last_selection
        .as_ref()
        .map_or((None, 0), |m| (Some(&m.peers), m.probers));
    let (peers, peer_labels) = candidates
        .into_iter()
        .filter(|(p, _)| peers.is_some_and(|set| set.contains(&p.label)))
        .map(|(p, labels)| {
            let name = p.label.clone();
            (p, (name, labels))
        })
        .unzip();
    PeerList {
        peers,
        listed,
        expected_probers: probers,
        own_labels,
        peer_labels,
        sources,
    }
}

/// What `sonde server --mesh FILE --check` says of the peer list: the peers read now (the file,
/// the DNS name looked up once, the Kubernetes source listed once without a watch), and how
/// many of them this agent probes.
pub(crate) fn describe_peers(cfg: &MeshConfig) -> String {
    let mut s = String::new();
    let kube = match cfg.kubernetes.as_ref().map(kube::list_once) {
        None => None,
        Some(Ok(peers)) => {
            s = format!("kubernetes now: {} ready endpoints\n", peers.len());
            Some(kube::KubeView { peers, up: true })
        }
        Some(Err(cause)) => {
            s = format!("kubernetes now: cannot list: {cause}\n");
            Some(kube::KubeView::default())
        }
    };
    let list = current_peer_list(
        cfg,
        &mut None,
        &mut Vec::new(),
        &mut None,
        &dns::tcp_resolver,
        kube.as_ref(),
    );
    s + &match &cfg.select {
        None => format!(
            "peer list now: {} peers, all probed; {} agents probe this one\n",
            list.listed, list.expected_probers
        ),
        Some(_) => format!(
            "peer list now: {} peers, of which [select] probes {}; {} agents probe this one\n",
            list.listed,
            list.peers.len(),
            list.expected_probers
        ),
    }
}

/// A peer being probed (by the prober thread).
struct Prober {
    /// Set while the peer does not answer probes: its scheduled tests are skipped.
    down: Arc<AtomicBool>,
}

/// Makes the probes follow the peer list: a peer no longer listed is stopped (`end`, after
/// which the prober writes none of its series) and its series removed (so they go stale in
/// Prometheus, never a zero RTT); a new one is started with `start`.
fn apply_peers(
    cfg: &MeshConfig,
    metrics: &Metrics,
    probers: &mut BTreeMap<Peer, Prober>,
    peers: &BTreeSet<Peer>,
    start: &mut dyn FnMut(&Peer) -> Prober,
    end: &mut dyn FnMut(&Peer),
) {
    let gone: Vec<Peer> = probers
        .keys()
        .filter(|p| !peers.contains(*p))
        .cloned()
        .collect();
    for peer in gone {
        probers.remove(&peer);
        end(&peer);
        metrics.forget(&cfg.name, &peer.label);
        log(format_args!("peer {} ({}) left", peer.label, peer.addr));
    }
    for peer in peers {
        if probers.contains_key(peer) {
            continue;
        }
        log(format_args!("peer {} ({}) joined", peer.label, peer.addr));
        metrics.start_pair(&cfg.name, &peer.label, &cfg.protocols);
        probers.insert(peer.clone(), start(peer));
    }
}

fn supervise(
    cfg: &MeshConfig,
    secret: Option<&Secret>,
    metrics: &Arc<Metrics>,
    links: &Arc<LinkTests>,
    prober: &probe::ProberThread,
    sources: &Sources<'_>,
    stop: &AtomicBool,
) {
    let mut probers: BTreeMap<Peer, Prober> = BTreeMap::new();
    let mut file_state = None;
    let mut dns_state = Vec::new();
    let mut selection_memo = None;
    let sched_cfg = cfg.scheduler_config();
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64);
    let mut scheduler: MeshScheduler<Peer> = MeshScheduler::new(sched_cfg, seed);
    let origin = Instant::now();
    let now_ns = || u64::try_from(origin.elapsed().as_nanos()).unwrap_or(u64::MAX);
    let mut next_refresh = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        if Instant::now() >= next_refresh {
            next_refresh = Instant::now() + cfg.refresh;
            let list = current_peer_list(
                cfg,
                &mut file_state,
                &mut dns_state,
                &mut selection_memo,
                sources.resolve,
                sources.kube_view().as_ref(),
            );
            metrics.set_selection(list.peers.len(), list.expected_probers);
            metrics.set_peer_sources(&list.sources, unix_seconds());
            metrics.set_labels(&cfg.name, &list.own_labels, &list.peer_labels);
            let peers: BTreeSet<Peer> = list.peers.into_iter().collect();
            apply_peers(
                cfg,
                metrics,
                &mut probers,
                &peers,
                &mut |peer| {
                    let down = Arc::new(AtomicBool::new(false));
                    prober.send(probe::Command::Add(peer.clone(), Arc::clone(&down)));
                    Prober { down }
                },
                &mut |peer| prober.send(probe::Command::Remove(peer.clone())),
            );
            scheduler.set_peers(peers.iter().cloned(), now_ns());
        }
        while let Some(start) = scheduler.poll(now_ns()) {
            // A peer that does not answer probes is not tested, nor one whose own test of this
            // link this agent is serving (docs/mesh.md): its turn passes.
            if let Some(_p) = probers
                .get(&start.peer)
                .filter(|p| !p.down.load(Ordering::Relaxed))
            {
                if let Some(_link) = links.start_outgoing(start.peer.addr.ip()) {
                    // SIGTERM (`stop`) ends a running test too.
                    run_check(cfg, secret, metrics, &start.peer, start.check, stop);
                }
            }
            scheduler.finished(&start.peer, now_ns());
        }
        let until_due = scheduler
            .next_due_ns()
            .map_or(Duration::from_millis(200), |due| {
                Duration::from_nanos(due.saturating_sub(now_ns()))
            });
        thread::sleep(until_due.min(Duration::from_millis(200)));
    }
}

fn unix_seconds() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// A scheduled test that did not run to its end. Refused as busy, the peer is testing this
/// link itself (or serving its most sessions): the turn passes, as for a peer that is down, and
/// is not logged as a failure.
fn check_failed(kind: &str, peer: &Peer, e: &ClientError) {
    if !matches!(
        e,
        ClientError::Refused {
            reason: sonde_wire::Refusal::Busy,
            ..
        }
    ) {
        log(format_args!("{kind} test to {} failed: {e}", peer.label));
    }
}

/// One scheduled throughput or pps test; a failure leaves the last figures as they were.
fn run_check(
    cfg: &MeshConfig,
    secret: Option<&Secret>,
    metrics: &Metrics,
    peer: &Peer,
    check: Check,
    stop: &AtomicBool,
) {
    let target = Target {
        addr: peer.addr,
        label: peer.label.clone(),
        secret: None,
        source: sonde_client::Source::default(),
    }
    .with_secret(secret.cloned());
    match check {
        Check::Throughput => {
            let Some(t) = &cfg.throughput else { return };
            let target = target.clone().with_source(t.source.clone());
            let Some(r) = scheduled("throughput", peer, &target, &t.options, stop) else {
                return;
            };
            let labels = PairDir {
                source: cfg.name.clone(),
                target: peer.label.clone(),
                direction: if t.options.direction == sonde_wire::Direction::Reverse {
                    Dir::reverse
                } else {
                    Dir::forward
                },
            };
            metrics
                .throughput_bytes
                .get_or_create(&labels)
                .set(r.receiver.bits_per_second / 8.0);
            metrics
                .throughput_time
                .get_or_create(&labels)
                .set(unix_seconds());
        }
        Check::Pps => {
            let Some(p) = &cfg.pps else { return };
            let target = target.clone().with_source(p.source.clone());
            let Some(r) = scheduled("pps", peer, &target, &p.options, stop) else {
                return;
            };
            let labels = Pair {
                source: cfg.name.clone(),
                target: peer.label.clone(),
            };
            metrics.pps.get_or_create(&labels).set(r.received_pps);
            metrics.pps_time.get_or_create(&labels).set(unix_seconds());
        }
    }
}

/// One scheduled test of `kind` through the client's one run, ended early by `stop`; `None`
/// when it did not run to its end ([`check_failed`] says so where that is news).
fn scheduled<T: sonde_client::Test>(
    kind: &str,
    peer: &Peer,
    target: &Target,
    options: &T,
    stop: &AtomicBool,
) -> Option<T::Output> {
    sonde_client::run(target, options, Controls::new().interrupt(stop))
        .map_err(|e| check_failed(kind, peer, &e))
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str, own_port: u16) -> MeshConfig {
        let mut c = MeshConfig::parse(text).unwrap();
        c.own_port = own_port;
        c
    }

    /// The peer list of a mesh whose peers come from its file and `hosts` (no DNS, no
    /// Kubernetes), with `memo` the last `[select]` kept between reads.
    fn file_list(c: &MeshConfig, memo: &mut Option<SelectionMemo>) -> PeerList {
        current_peer_list(c, &mut None, &mut Vec::new(), memo, &system_resolver, None)
    }

    fn labels(peers: &[Peer]) -> Vec<&str> {
        peers.iter().map(|p| p.label.as_str()).collect()
    }

    #[test]
    fn peers_from_every_source_without_this_agent() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("peers.txt");
        std::fs::write(
            &file,
            "# comment\n127.0.0.1:7002\n\n127.0.0.1:7003 # third\n",
        )
        .unwrap();
        let c = config(
            &format!(
                "name = \"me\"\n[peers]\nhosts = [\"127.0.0.1:7001\", \"127.0.0.1:7000\", \"me:7005\", \"127.0.0.1:7002\"]\n\
                 file = \"{}\"\ndns = \"localhost\"\ndns_port = 7004\n",
                file.display()
            ),
            7000,
        );
        let mut state = None;
        let peers = current_peers(&c, &mut state, &mut Vec::new(), &system_resolver);
        let found = labels(&peers);
        // Itself (its port on a local address, or its name) left out; duplicates once.
        assert!(
            !found
                .iter()
                .any(|l| l.ends_with(":7000") || l.starts_with("me")),
            "{found:?}"
        );
        for want in ["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"] {
            assert_eq!(
                found.iter().filter(|l| **l == want).count(),
                1,
                "{want}: {found:?}"
            );
        }
        // DNS peers by address, on dns_port.
        assert!(
            peers
                .iter()
                .any(|p| p.addr == "127.0.0.1:7004".parse().unwrap() && p.label == "127.0.0.1"),
            "{peers:?}"
        );
        // The file changes: re-read.
        std::fs::write(&file, "127.0.0.1:7009\n").unwrap();
        let later = std::time::SystemTime::now() + Duration::from_secs(5);
        std::fs::File::options()
            .write(true)
            .open(&file)
            .unwrap()
            .set_modified(later)
            .unwrap();
        let found: Vec<String> = current_peers(&c, &mut state, &mut Vec::new(), &system_resolver)
            .into_iter()
            .map(|p| p.label)
            .collect();
        assert!(found.contains(&"127.0.0.1:7009".to_owned()), "{found:?}");
        assert!(!found.contains(&"127.0.0.1:7003".to_owned()), "{found:?}");
    }

    /// A peer file rewritten in place within one tick of the file system's clock keeps its
    /// timestamp and, here, its size: a refresh that read it in between (an empty file, between
    /// the truncation and the write) must still read it again (a mesh lab run once saw no peer
    /// for 30 s this way).
    #[test]
    fn a_peer_file_rewritten_within_one_timestamp_tick_is_read_again() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("peers.txt");
        let c = config(
            &format!("name = \"me\"\n[peers]\nfile = \"{}\"\n", file.display()),
            7000,
        );
        let tick = SystemTime::now();
        let write = |text: &str| {
            std::fs::write(&file, text).unwrap();
            std::fs::File::options()
                .write(true)
                .open(&file)
                .unwrap()
                .set_modified(tick)
                .unwrap();
        };
        let mut state = None;
        let mut read = || {
            labels(&current_peers(
                &c,
                &mut state,
                &mut Vec::new(),
                &system_resolver,
            ))
            .into_iter()
            .map(str::to_owned)
            .collect::<Vec<_>>()
        };
        write("127.0.0.1:7001\n");
        assert_eq!(read(), ["127.0.0.1:7001"]);
        write("127.0.0.1:7002\n");
        assert_eq!(read(), ["127.0.0.1:7002"]);
        write("");
        assert!(read().is_empty());
        write("127.0.0.1:7003\n");
        assert_eq!(read(), ["127.0.0.1:7003"]);
    }

    /// `[peers] dns` looked up again at each refresh, with a record set that changes between
    /// lookups (a DaemonSet's pods coming and going): peers join and leave the probers, the
    /// scheduler and the exposition, a failed lookup is only logged, and this agent's own
    /// address is never a peer.
    #[test]
    fn a_dns_record_set_that_changes_adds_and_removes_peers_and_their_series() {
        use std::sync::Mutex;
        let own = 7000;
        let c = config(
            &format!("name = \"127.0.0.1\"\n[peers]\ndns = \"sonde.test\"\ndns_port = {own}\n"),
            own,
        );
        let records: Mutex<std::io::Result<Vec<&str>>> = Mutex::new(Ok(Vec::new()));
        let asked = Mutex::new(Vec::new());
        let resolve = |name: &str, port: u16| -> std::io::Result<Vec<SocketAddr>> {
            asked.lock().unwrap().push((name.to_owned(), port));
            match &*records.lock().unwrap() {
                Ok(ips) => Ok(ips
                    .iter()
                    .map(|ip| SocketAddr::new(ip.parse().unwrap(), port))
                    .collect()),
                Err(e) => Err(std::io::Error::new(e.kind(), e.to_string())),
            }
        };
        let metrics = Metrics::new();
        let mut probers: BTreeMap<Peer, Prober> = BTreeMap::new();
        let mut scheduler: MeshScheduler<Peer> = MeshScheduler::new(c.scheduler_config(), 1);
        let mut started = Vec::new();
        let ended = std::cell::RefCell::new(Vec::new());
        let mut file = None;
        let mut dns = Vec::new();
        let mut refresh = |probers: &mut BTreeMap<Peer, Prober>| {
            let peers: BTreeSet<Peer> = current_peers(&c, &mut file, &mut dns, &resolve)
                .into_iter()
                .collect();
            apply_peers(
                &c,
                &metrics,
                probers,
                &peers,
                &mut |peer| {
                    started.push(peer.label.clone());
                    Prober {
                        down: Arc::new(AtomicBool::new(false)),
                    }
                },
                &mut |peer| ended.borrow_mut().push(peer.label.clone()),
            );
            scheduler.set_peers(peers.iter().cloned(), 0);
            // What a prober's session would write for each peer it probes.
            for peer in probers.keys() {
                let pair = Pair {
                    source: c.name.clone(),
                    target: peer.label.clone(),
                };
                metrics.up.get_or_create(&pair).set(1);
            }
            let listed = |p: &BTreeMap<Peer, Prober>| -> Vec<String> {
                p.keys().map(|k| k.label.clone()).collect()
            };
            (
                listed(probers),
                scheduler
                    .peers()
                    .map(|p| p.label.clone())
                    .collect::<Vec<_>>(),
            )
        };
        let series = |target: &str| {
            metrics.encode(None).lines().any(|l| {
                l.starts_with("sonde_peer_up{") && l.contains(&format!("target=\"{target}\""))
            })
        };

        // Two pods, and this agent's own address (its port on a local address): left out. (No
        // traffic: the probers here are placeholders, and 198.18.0.0/15 is nobody's.)
        *records.lock().unwrap() = Ok(vec!["198.18.0.2", "198.18.0.3", "127.0.0.1"]);
        let (now, sched) = refresh(&mut probers);
        assert_eq!(now, ["198.18.0.2", "198.18.0.3"]);
        assert_eq!(sched, now);
        assert!(series("198.18.0.2") && series("198.18.0.3"));
        assert_eq!(asked.lock().unwrap()[0], ("sonde.test".to_owned(), own));
        // .2 goes, .4 comes: .2's probers stop and its series leave the exposition.
        *records.lock().unwrap() = Ok(vec!["198.18.0.4", "198.18.0.3"]);
        let (now, sched) = refresh(&mut probers);
        assert_eq!(now, ["198.18.0.3", "198.18.0.4"]);
        assert_eq!(sched, now);
        assert_eq!(
            *ended.borrow(),
            ["198.18.0.2"],
            "the leaving peer's probes were not stopped"
        );
        assert!(!series("198.18.0.2"), "{}", metrics.encode(None));
        assert!(series("198.18.0.3") && series("198.18.0.4"));
        // A failed lookup (a DNS blip) keeps the last answer: no peer leaves, no series goes.
        *records.lock().unwrap() = Err(std::io::Error::other("no answer"));
        let (now, _) = refresh(&mut probers);
        assert_eq!(now, ["198.18.0.3", "198.18.0.4"]);
        assert!(series("198.18.0.3") && series("198.18.0.4"));
        // An answer without them removes them all.
        *records.lock().unwrap() = Ok(vec![]);
        let (now, sched) = refresh(&mut probers);
        assert!(now.is_empty() && sched.is_empty(), "{now:?} {sched:?}");
        assert!(!series("198.18.0.3") && !series("198.18.0.4"));
        *records.lock().unwrap() = Ok(vec!["198.18.0.3"]);
        let (now, _) = refresh(&mut probers);
        assert_eq!(now, ["198.18.0.3"]);
        // Each join started its probers once.
        assert_eq!(
            started,
            ["198.18.0.2", "198.18.0.3", "198.18.0.4", "198.18.0.3"]
        );
        assert_eq!(asked.lock().unwrap().len(), 5);
    }

    /// A source that fails (the peer file gone, the name not resolving) keeps giving the peers
    /// of its last good read, and `sonde_mesh_peer_source_*` say so: up 0 with the peers
    /// kept, the time of the last good read unchanged; both up again when it comes back.
    #[test]
    fn a_failing_peer_source_keeps_its_peers_and_its_series_say_so() {
        use std::sync::Mutex;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("peers.txt");
        std::fs::write(&file, "198.18.0.2\n198.18.0.3\n").unwrap();
        let c = config(
            &format!(
                "name = \"me\"\n[peers]\nfile = \"{}\"\ndns = \"sonde.test\"\n",
                file.display()
            ),
            7000,
        );
        let dns_up = Mutex::new(true);
        let resolve = |_: &str, port: u16| -> std::io::Result<Vec<SocketAddr>> {
            if *dns_up.lock().unwrap() {
                Ok(vec![SocketAddr::new("198.18.0.4".parse().unwrap(), port)])
            } else {
                Err(std::io::Error::other("no answer"))
            }
        };
        let metrics = Metrics::new();
        let (mut last_file, mut last_dns) = (None, Vec::new());
        let mut refresh = |now: f64| {
            let list =
                current_peer_list(&c, &mut last_file, &mut last_dns, &mut None, &resolve, None);
            metrics.set_peer_sources(&list.sources, now);
            (list.sources, list.peers.len())
        };
        let state = |source, up, peers| SourceState { source, up, peers };
        let series = |name: &str, source: &str| -> Option<String> {
            let prefix = format!("{name}{{peer_source=\"{source}\"}} ");
            metrics
                .encode(None)
                .lines()
                .find_map(|l| l.strip_prefix(&prefix).map(str::to_owned))
        };
        let up = "sonde_mesh_peer_source_up";
        let peers = "sonde_mesh_peer_source_peers";
        let when = "sonde_mesh_peer_source_last_success_timestamp_seconds";

        assert_eq!(
            refresh(100.0),
            (vec![state("file", true, 2), state("dns", true, 1)], 3)
        );
        assert_eq!(series(up, "file").as_deref(), Some("1"));
        assert_eq!(series(peers, "file").as_deref(), Some("2"));
        assert_eq!(series(when, "dns").as_deref(), Some("100.0"));
        // An unchanged file is not read again, and is still up.
        assert_eq!(refresh(110.0).0[0], state("file", true, 2));
        assert_eq!(series(when, "file").as_deref(), Some("110.0"));

        // Both fail: the peers stay (no probe stops, no series goes), the sources read down and
        // their last good read's time stays.
        std::fs::remove_file(&file).unwrap();
        *dns_up.lock().unwrap() = false;
        assert_eq!(
            refresh(120.0),
            (vec![state("file", false, 2), state("dns", false, 1)], 3)
        );
        for source in ["file", "dns"] {
            assert_eq!(series(up, source).as_deref(), Some("0"), "{source}");
            assert_eq!(series(when, source).as_deref(), Some("110.0"), "{source}");
        }
        assert_eq!(series(peers, "file").as_deref(), Some("2"));

        // Back: up again, with what they say now.
        std::fs::write(&file, "198.18.0.5\n").unwrap();
        *dns_up.lock().unwrap() = true;
        assert_eq!(
            refresh(130.0),
            (vec![state("file", true, 1), state("dns", true, 1)], 2)
        );
        assert_eq!(series(up, "file").as_deref(), Some("1"));
        assert_eq!(series(when, "file").as_deref(), Some("130.0"));
        // No series for a source the mesh file does not name.
        assert_eq!(series(up, "kubernetes"), None);
    }

    /// The agent's side of "one test on a link at a time", over loopback (client and agent
    /// both at 127.0.0.1, as two agents on one host, where the tie-break refuses).
    #[test]
    fn a_link_under_test_from_either_end_takes_no_second_test() {
        use std::net::{IpAddr, Ipv4Addr};
        let links = LinkTests::new();
        let mut cfg = sonde_agent::AgentConfig::new(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)));
        cfg.link_tests = Some(Arc::clone(&links));
        let agent = sonde_agent::Agent::bind(cfg).unwrap().spawn();
        let target = Target {
            addr: agent.local_addr(),
            label: "agent".into(),
            secret: None,
            source: sonde_client::Source::default(),
        };
        let peer = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let options = sonde_client::ThroughputOptions {
            duration: Duration::from_secs(2),
            ..sonde_client::ThroughputOptions::default()
        };
        // This end's own scheduled test to the client's address runs: the client's is refused
        // as busy, which the mesh takes as its turn passing.
        let own = links.start_outgoing(peer).unwrap();
        let err = sonde_client::run(&target, &options, Controls::new()).unwrap_err();
        assert!(
            matches!(
                err,
                ClientError::Refused {
                    reason: sonde_wire::Refusal::Busy,
                    ..
                }
            ),
            "{err}"
        );
        // Latency probes are not throughput tests: served.
        let probe = sonde_client::LatencyOptions {
            duration: Duration::from_millis(300),
            ..sonde_client::LatencyOptions::default()
        };
        sonde_client::run(&target, &probe, Controls::new()).unwrap();
        drop(own);
        // Served while no test of this end runs; while it is served, this end's scheduled test
        // to that address does not start.
        let client = {
            let (target, options) = (target.clone(), options.clone());
            thread::spawn(move || sonde_client::run(&target, &options, Controls::new()))
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !links.serving(peer) && !client.is_finished() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(5));
        }
        assert!(links.serving(peer), "the session was never registered");
        assert!(links.start_outgoing(peer).is_none());
        let result = client.join().unwrap().unwrap();
        assert!(result.receiver.bits_per_second > 0.0);
        // Over, the link is free again (the session's registration ends with it).
        let deadline = Instant::now() + Duration::from_secs(20);
        while links.serving(peer) && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(5));
        }
        assert!(links.start_outgoing(peer).is_some());
        agent.stop();
    }

    /// `[select]` over a labelled peer file: this agent probes exactly what the selection of
    /// the whole list (itself included, as the list names it) gives it, and expects as many
    /// probers as the list's agents whose selection includes it. Addresses of 198.18.0.0/15:
    /// nothing is sent.
    #[test]
    fn select_narrows_the_peers_to_this_agents_selection() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("peers.txt");
        let mut text = String::new();
        let mut nodes = Vec::new();
        for z in 0..2 {
            for r in 0..3 {
                for i in 0..4 {
                    let spec = format!("198.18.{}.{}:5300", z * 10 + r, i + 1);
                    text.push_str(&format!("{spec} zone=z{z} rack=r{r}\n"));
                    nodes.push((
                        spec,
                        Labels::from([
                            ("zone".to_owned(), format!("z{z}")),
                            ("rack".to_owned(), format!("r{r}")),
                        ]),
                    ));
                }
            }
        }
        std::fs::write(&file, text).unwrap();
        let me = "198.18.1.2";
        let c = config(
            &format!(
                "name = \"{me}\"\n[peers]\nfile = \"{}\"\n\
                 [select]\ngroup = \"rack\"\nneighbours = 2\nacross = \"zone\"\nrepresentatives = 1\n",
                file.display()
            ),
            7000,
        );
        let mut memo = None;
        let list = file_list(&c, &mut memo);
        assert_eq!(list.listed, 23);
        let selection = Selection::new(nodes, c.select.as_ref().unwrap());
        let own = format!("{me}:5300");
        let want: Vec<&str> = selection.peers_of(&own).unwrap().collect();
        let got: Vec<&str> = list.peers.iter().map(|p| p.label.as_str()).collect();
        assert_eq!(got, want);
        // Its three rack mates, and at least two ring neighbours beyond them.
        assert!(got.len() >= 3 + 2 && got.len() < 23, "{got:?}");
        for i in [1, 3, 4] {
            assert!(
                got.contains(&format!("198.18.1.{i}:5300").as_str()),
                "{got:?}"
            );
        }
        assert_eq!(list.expected_probers, selection.probers_of(&own).unwrap());
        // Its rack mates at least (the ring's K = 2 probers may be among them).
        assert!(list.expected_probers >= 3);
        // Read again with the last selection kept: the same (the list did not change), and a
        // new peer in the list is taken into account.
        let again = file_list(&c, &mut memo);
        assert_eq!(labels(&again.peers), labels(&list.peers));
        let mut more = std::fs::read_to_string(&file).unwrap();
        more.push_str("198.18.1.9:5300 zone=z0 rack=r1\n");
        std::fs::write(&file, more).unwrap();
        let grown = file_list(&c, &mut memo);
        assert_eq!(grown.listed, 24);
        assert!(
            labels(&grown.peers).contains(&"198.18.1.9:5300"),
            "a new rack mate"
        );
        // Without [select]: every listed peer (24 now), and every one of them probes this agent.
        let every = config(
            &format!("name = \"{me}\"\n[peers]\nfile = \"{}\"\n", file.display()),
            7000,
        );
        let list = file_list(&every, &mut None);
        assert_eq!((list.peers.len(), list.expected_probers), (24, 24));
        // A line whose labels do not parse is left out, not probed unlabelled.
        std::fs::write(&file, "198.18.0.1 zone\n198.18.0.2 zone=a\n").unwrap();
        let list = file_list(&every, &mut None);
        assert_eq!(labels(&list.peers), ["198.18.0.2"]);
    }

    #[test]
    fn another_agent_on_this_host_is_a_peer() {
        assert!(is_own(&"127.0.0.1:5300".parse().unwrap(), 5300));
        assert!(!is_own(&"127.0.0.1:5301".parse().unwrap(), 5300));
        // 198.18.0.0/15 is on no interface of a test host.
        assert!(!is_own(&"198.18.0.9:5300".parse().unwrap(), 5300));
    }
}
