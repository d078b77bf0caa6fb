//! `[peers] kubernetes`: the ready endpoints of a Service's EndpointSlices, each labelled from
//! its node's labels, read from the Kubernetes API server and watched (docs/mesh.md, "Peers from
//! the Kubernetes API").
//!
//! One thread per watched resource, no async runtime: the Service's EndpointSlices in its
//! namespace and, when `labels` names a node label other than the zone (which the
//! slices carry), the nodes' metadata (asked for as
//! `PartialObjectMetadata`, so 5,000 nodes are not 5,000 full Node objects). Each thread lists
//! (in pages of [`PAGE`]), then watches from the list's `resourceVersion` with bookmarks; the
//! server ends a watch after `timeoutSeconds` and the thread watches again from the last version
//! it saw. A watch the server expired (410 Gone) or a stream that broke is followed by a new
//! list, after a bounded, jittered backoff. A failure keeps what was last listed and watched,
//! and is logged once per change of cause, named: the token (401), the RBAC rule missing (403),
//! the CA (TLS), the address (connect).
//!
//! In cluster only: the API server from `KUBERNETES_SERVICE_HOST`/`KUBERNETES_SERVICE_PORT`,
//! the service account's bearer token from its file, read again for every request (bound
//! tokens rotate), and its `ca.crt` as the only root of trust (read again at every list).
//! `api_server`, `token_file` and `ca_file` in the mesh file override them (for tests).
//!
//! `sonde mesh publish` runs the same watches once for a whole mesh and writes the labelled list
//! into one ConfigMap ([`publish_watching`], [`publish_once`]), which the agents mount as their
//! `[peers] file`: no API access in the agents, and no node event sent to every agent.

use std::collections::hash_map::RandomState;
use std::collections::BTreeMap;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::io::{self, BufRead, BufReader, Read};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Deserialize;
use sonde_engine::mesh_select::Labels;

use super::config::{KubePeers, DEFAULT_PORT};

/// Where Kubernetes mounts the pod's service account: `token`, `ca.crt`, `namespace`.
pub(crate) const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The pod's namespace, for a `[peers] kubernetes` without `namespace`.
pub(crate) const NAMESPACE_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";
/// The EndpointSlice port whose number the peers are at, when the mesh file gives no `port`
/// (the DaemonSet's and the Service's name for the agent's TCP port).
const PORT_NAME: &str = "sonde-tcp";
/// The node label the EndpointSlice controller copies into each endpoint's `zone`: a mesh whose
/// only node label is this one reads it there and does not watch the nodes.
const ZONE_KEY: &str = "topology.kubernetes.io/zone";

/// Whether the nodes must be watched: `labels` names a node label other than the zone, which
/// the EndpointSlices carry themselves.
pub(crate) fn needs_nodes(cfg: &KubePeers) -> bool {
    cfg.labels.values().any(|key| key != ZONE_KEY)
}
/// Items per list page (`limit`): a page of 500 nodes' metadata is a few MB at most.
const PAGE: usize = 500;
/// Pages of one list at most (1,000,000 items): a server that never stops paging is a fault.
const MAX_PAGES: usize = 2_000;
/// Bytes of one list page, and of one watch event: an answer above this is refused, not read.
const PAGE_LIMIT: u64 = 64 << 20;
const EVENT_LIMIT: u64 = 16 << 20;
/// The server ends each watch after a random 5 to 10 minutes (as client-go does), and the
/// thread watches again from its last version: a stream silent for longer than that plus
/// [`WATCH_GRACE`] has broken.
const WATCH_SECONDS: (u64, u64) = (300, 600);
const WATCH_GRACE: Duration = Duration::from_secs(30);
/// Connecting (and the TLS handshake), and a list page's whole answer.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const LIST_TIMEOUT: Duration = Duration::from_secs(60);
/// The backoff before a new list after a failure: doubling from the first to the last, each
/// wait a random 50 to 100% of it; back to the first only once a watch has run for
/// [`HEALTHY_WATCH`], so a server that lists but breaks every watch at once is not asked for a
/// list a second by every agent. (The tests run it 10 times faster.)
const BACKOFF: (Duration, Duration) = if cfg!(test) {
    (Duration::from_millis(50), Duration::from_secs(3))
} else {
    (Duration::from_millis(500), Duration::from_secs(30))
};
const HEALTHY_WATCH: Duration = Duration::from_secs(30);

/// What a list or a watch failed on, named for whoever reads the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Cause {
    /// No API server address, or no namespace: not in a pod.
    NotInCluster(String),
    /// The token file could not be read, or the server did not take its token (401).
    Token { file: PathBuf, detail: String },
    /// The service account's RBAC lacks `verb` on `resource` (403).
    Forbidden {
        verb: &'static str,
        resource: String,
        message: String,
    },
    /// The CA file could not be read, or did not sign the server's certificate.
    Tls { file: PathBuf, detail: String },
    /// The server could not be reached.
    Connect { url: String, detail: String },
    /// The watch's resource version expired (410 Gone): list again.
    Gone,
    /// Another status.
    Status {
        code: u16,
        what: String,
        message: String,
    },
    /// An answer that is not what the API promises, or a stream that broke.
    Stream { what: String, detail: String },
    /// The publisher's peer list does not fit in a ConfigMap.
    TooLarge { bytes: usize, peers: usize },
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotInCluster(detail) => write!(f, "not in a Kubernetes pod: {detail}"),
            Self::Token { file, detail } => write!(
                f,
                "the service account token ({}): {detail}",
                file.display()
            ),
            Self::Forbidden {
                verb,
                resource,
                message,
            } => write!(
                f,
                "403 Forbidden: the service account's RBAC does not allow {verb} on {resource} \
                 (grant it with a Role or ClusterRole and a binding, as \
                 deploy/kubernetes/node-labels and node-labels-direct do); the API server said: {message}"
            ),
            Self::Tls { file, detail } => write!(
                f,
                "TLS with the API server, checked against the CA in {}: {detail}",
                file.display()
            ),
            Self::Connect { url, detail } => {
                write!(f, "cannot reach the API server at {url}: {detail}")
            }
            Self::Gone => write!(
                f,
                "410 Gone: the resource version expired (the API server compacted past it)"
            ),
            Self::Status {
                code,
                what,
                message,
            } => write!(f, "the API server answered {code} to {what}: {message}"),
            Self::Stream { what, detail } => write!(f, "{what}: {detail}"),
            Self::TooLarge { bytes, peers } => write!(
                f,
                "the peer list of {peers} peers is {bytes} bytes, over the {PEER_TEXT_LIMIT} \
                 a ConfigMap can hold (1 MiB less 16 KiB for its metadata; about 60 bytes a \
                 peer, so some 15,000 peers at most): not written. Shorten the labels, or use \
                 [peers] dns with labels from the names"
            ),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The objects, as far as the mesh reads them
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ObjectMeta {
    #[serde(default)]
    name: String,
    #[serde(default)]
    resource_version: String,
    #[serde(default)]
    labels: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ListMeta {
    #[serde(default)]
    resource_version: String,
    #[serde(default, rename = "continue")]
    next: Option<String>,
}

#[derive(Debug, Deserialize)]
struct List<T> {
    #[serde(default)]
    metadata: ListMeta,
    #[serde(default = "Vec::new")]
    items: Vec<T>,
}

/// A Node, or its `PartialObjectMetadata`: only the metadata is read.
#[derive(Debug, Deserialize)]
struct NodeMeta {
    #[serde(default)]
    metadata: ObjectMeta,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct EndpointSlice {
    #[serde(default)]
    metadata: ObjectMeta,
    #[serde(default)]
    address_type: String,
    #[serde(default)]
    endpoints: Option<Vec<Endpoint>>,
    #[serde(default)]
    ports: Option<Vec<EndpointPort>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Endpoint {
    #[serde(default)]
    addresses: Vec<String>,
    /// The zone of its node, as the EndpointSlice controller copies it.
    #[serde(default)]
    zone: Option<String>,
    #[serde(default)]
    conditions: Option<Conditions>,
    #[serde(default)]
    node_name: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct Conditions {
    #[serde(default)]
    ready: Option<bool>,
}

#[derive(Debug, Deserialize)]
struct EndpointPort {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    port: Option<i64>,
    #[serde(default)]
    protocol: Option<String>,
}

/// A watch event: `{"type": "ADDED", "object": {...}}`.
#[derive(Debug, Deserialize)]
struct WatchEvent {
    #[serde(rename = "type")]
    kind: String,
    object: serde_json::Value,
}

/// A `Status` (an ERROR event's object, or a failed request's body).
#[derive(Debug, Default, Deserialize)]
struct Status {
    #[serde(default)]
    code: u16,
    #[serde(default)]
    message: String,
}

/// One ready address of a slice, at the peers' port.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Ready {
    addr: SocketAddr,
    node: Option<String>,
    zone: Option<String>,
}

/// The ready addresses of a slice: `conditions.ready` not false (unknown counts as ready, as
/// the API says consumers should take it), IPv4 and IPv6 slices (not FQDN ones), at `port` or
/// the slice's `sonde-tcp` port, else [`DEFAULT_PORT`].
fn ready_addresses(slice: &EndpointSlice, port: Option<u16>) -> Vec<Ready> {
    if !matches!(slice.address_type.as_str(), "IPv4" | "IPv6") {
        return Vec::new();
    }
    let port = port
        .or_else(|| {
            slice.ports.iter().flatten().find_map(|p| {
                (p.name.as_deref() == Some(PORT_NAME)
                    && p.protocol.as_deref().unwrap_or("TCP") == "TCP")
                    .then(|| p.port.and_then(|n| u16::try_from(n).ok()))
                    .flatten()
            })
        })
        .unwrap_or(DEFAULT_PORT);
    slice
        .endpoints
        .iter()
        .flatten()
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) != Some(false))
        .flat_map(|e| {
            e.addresses.iter().filter_map(|a| {
                Some(Ready {
                    addr: SocketAddr::new(a.parse::<IpAddr>().ok()?, port),
                    node: e.node_name.clone(),
                    zone: e.zone.clone(),
                })
            })
        })
        .collect()
}

/// A node's labels that the mesh file names (by their node label key).
fn wanted_labels(node: &NodeMeta, wanted: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let labels = node.metadata.labels.as_ref();
    wanted
        .values()
        .filter_map(|key| Some((key.clone(), labels?.get(key)?.clone())))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// What the watches keep
// ---------------------------------------------------------------------------------------------

/// A peer of `[peers] kubernetes`: a ready address and the labels of its node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KubePeer {
    pub(crate) addr: SocketAddr,
    pub(crate) labels: Labels,
}

#[derive(Debug, Default)]
struct Store {
    /// Slice name -> its ready addresses.
    slices: BTreeMap<String, Vec<Ready>>,
    /// Node name -> the labels the mesh file names (node label key -> value).
    nodes: BTreeMap<String, BTreeMap<String, String>>,
    slices_listed: bool,
    nodes_listed: bool,
    /// How many times what the peers are made of changed (a list, or an event that changed an
    /// address or a label the mesh names; not a node's status update): the publisher renders
    /// the list again only when this moved.
    changes: u64,
    /// The current cause of failure of each watch ("endpointslices", "nodes"), for `--check`
    /// and the tests; the log has it too.
    failing: BTreeMap<&'static str, Cause>,
}

impl Store {
    /// The peers, once every watched resource was listed; each address once.
    fn peers(&self, cfg: &KubePeers) -> Option<Vec<KubePeer>> {
        let need_nodes = needs_nodes(cfg);
        if !self.slices_listed || (need_nodes && !self.nodes_listed) {
            return None;
        }
        let mut peers: BTreeMap<SocketAddr, Labels> = BTreeMap::new();
        for ready in self.slices.values().flatten() {
            peers.entry(ready.addr).or_insert_with(|| {
                let node = ready.node.as_ref().and_then(|n| self.nodes.get(n));
                cfg.labels
                    .iter()
                    .filter_map(|(name, key)| {
                        // The node's label; for the zone, the slice's copy when the nodes are
                        // not watched (or the node not yet listed).
                        let value = node.and_then(|n| n.get(key)).or_else(|| {
                            (key == ZONE_KEY).then_some(ready.zone.as_ref()).flatten()
                        })?;
                        Some((name.clone(), value.clone()))
                    })
                    .collect()
            });
        }
        Some(
            peers
                .into_iter()
                .map(|(addr, labels)| KubePeer { addr, labels })
                .collect(),
        )
    }
}

/// What `[peers] kubernetes` gives at a refresh of the peer list.
#[derive(Debug, Default)]
pub(crate) struct KubeView {
    /// The peers as last listed and watched (none before the first list).
    pub(crate) peers: Vec<KubePeer>,
    /// Every watched resource listed, and no watch failing now.
    pub(crate) up: bool,
}

/// The watches of one `[peers] kubernetes`: their threads fill the store, the supervisor reads
/// the peers from it at each refresh.
pub(crate) struct KubeWatch {
    cfg: KubePeers,
    store: Arc<Mutex<Store>>,
}

impl KubeWatch {
    /// Starts the watch threads (the EndpointSlices', and the nodes' when [`needs_nodes`]
    /// says); they end soon after `stop` (at the next event, or when the server ends the
    /// watch).
    pub(crate) fn spawn(cfg: &KubePeers, stop: &Arc<AtomicBool>) -> io::Result<KubeWatch> {
        let store = Arc::new(Mutex::new(Store::default()));
        let mut kinds = vec![Kind::Slices];
        if needs_nodes(cfg) {
            kinds.push(Kind::Nodes);
        }
        for kind in kinds {
            let (cfg, store, stop) = (cfg.clone(), Arc::clone(&store), Arc::clone(stop));
            thread::Builder::new()
                .name(format!("sonde-k8s-{}", kind.name()))
                .spawn(move || run(kind, &cfg, &store, &stop))?;
        }
        Ok(KubeWatch {
            cfg: cfg.clone(),
            store,
        })
    }

    /// The peers as last listed and watched; None until the first list of each watch.
    #[cfg(test)]
    fn peers(&self) -> Option<Vec<KubePeer>> {
        lock(&self.store).peers(&self.cfg)
    }

    /// The peers and whether the watches are healthy now: `up` once every watched resource
    /// was listed and while no watch fails (a failing watch keeps the peers of its last list,
    /// which `peers` still gives).
    pub(crate) fn view(&self) -> KubeView {
        let st = lock(&self.store);
        let peers = st.peers(&self.cfg);
        KubeView {
            up: peers.is_some() && st.failing.is_empty(),
            peers: peers.unwrap_or_default(),
        }
    }

    /// The peers with the store's change count they reflect (see `Store::changes`).
    fn peers_at(&self) -> (u64, Option<Vec<KubePeer>>) {
        let st = lock(&self.store);
        (st.changes, st.peers(&self.cfg))
    }

    /// The store's change count: the peers are the same while it stays.
    fn changes(&self) -> u64 {
        lock(&self.store).changes
    }

    /// Why the watches fail now, if they do.
    #[cfg(test)]
    fn failing(&self) -> Vec<String> {
        lock(&self.store)
            .failing
            .values()
            .map(ToString::to_string)
            .collect()
    }
}

fn lock(store: &Mutex<Store>) -> std::sync::MutexGuard<'_, Store> {
    store.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Lists every watched resource once (for `sonde server --mesh FILE --check`).
pub(crate) fn list_once(cfg: &KubePeers) -> Result<Vec<KubePeer>, Cause> {
    let mut store = Store::default();
    let api = Api::new(cfg)?;
    let agent = api.agent()?;
    let (slices, _) = list_slices(&api, &agent, cfg)?;
    store.slices = slices;
    store.slices_listed = true;
    if needs_nodes(cfg) {
        let (nodes, _) = list_nodes(&api, &agent, cfg)?;
        store.nodes = nodes;
        store.nodes_listed = true;
    }
    Ok(store.peers(cfg).unwrap_or_default())
}

/// `[peers] kubernetes` for `--check`.
pub(crate) fn describe(cfg: &KubePeers) -> String {
    let ns = cfg
        .namespace
        .clone()
        .unwrap_or_else(|| format!("this pod's namespace (from {NAMESPACE_FILE})"));
    let port = cfg.port.map_or_else(
        || format!("the slices' port named {PORT_NAME} (else {DEFAULT_PORT})"),
        |p| format!("port {p}"),
    );
    let server = cfg.api_server.clone().unwrap_or_else(|| {
        "$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT (in cluster)".to_owned()
    });
    let labels = if cfg.labels.is_empty() {
        "no node labels (set labels to read them)".to_owned()
    } else if !needs_nodes(cfg) {
        format!(
            "labels from each endpoint's zone in its slice (nodes not watched): {}",
            cfg.labels
                .keys()
                .map(|k| format!("{k}={ZONE_KEY}"))
                .collect::<Vec<_>>()
                .join(" ")
        )
    } else {
        format!(
            "labels from each endpoint's node: {}",
            cfg.labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" ")
        )
    };
    format!(
        "  kubernetes: the ready endpoints of Service {svc} in {ns}, {port}; {labels}; from the \
         API server at {server} (token {token}, CA {ca}), listed then watched",
        svc = cfg.service,
        token = cfg.token_file.display(),
        ca = cfg.ca_file.display(),
    )
}

// ---------------------------------------------------------------------------------------------
// The API server
// ---------------------------------------------------------------------------------------------

/// What is watched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Slices,
    Nodes,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Self::Slices => "endpointslices",
            Self::Nodes => "nodes",
        }
    }

    /// Nodes as metadata only, or plain JSON if the server does not do that.
    fn accept(self, watch: bool) -> &'static str {
        match (self, watch) {
            (Self::Slices, _) => "application/json",
            (Self::Nodes, false) => {
                "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
            }
            (Self::Nodes, true) => {
                "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
            }
        }
    }
}

/// The API server of one attempt: its address, the namespace, and the token and CA files.
struct Api {
    base: String,
    namespace: String,
    token_file: PathBuf,
    ca_file: PathBuf,
}

impl Api {
    fn new(cfg: &KubePeers) -> Result<Api, Cause> {
        let base = match &cfg.api_server {
            Some(url) => url.clone(),
            None => {
                let host = std::env::var("KUBERNETES_SERVICE_HOST").map_err(|_| {
                    Cause::NotInCluster(
                        "KUBERNETES_SERVICE_HOST is not set (outside a pod, set \
                         peers.kubernetes.api_server, or sonde mesh publish --api-server)"
                            .to_owned(),
                    )
                })?;
                let port =
                    std::env::var("KUBERNETES_SERVICE_PORT").unwrap_or_else(|_| "443".into());
                match host.parse::<IpAddr>() {
                    Ok(IpAddr::V6(v6)) => format!("https://[{v6}]:{port}"),
                    _ => format!("https://{host}:{port}"),
                }
            }
        };
        let namespace = match &cfg.namespace {
            Some(ns) => ns.clone(),
            None => std::fs::read_to_string(NAMESPACE_FILE)
                .map(|s| s.trim().to_owned())
                .ok()
                .filter(|s| !s.is_empty())
                .ok_or_else(|| {
                    Cause::NotInCluster(format!(
                        "cannot read the pod's namespace from {NAMESPACE_FILE} (is the service \
                         account token mounted? or set peers.kubernetes.namespace)"
                    ))
                })?,
        };
        Ok(Api {
            base,
            namespace,
            token_file: cfg.token_file.clone(),
            ca_file: cfg.ca_file.clone(),
        })
    }

    /// An HTTP agent that trusts only the CA file's certificates (read now).
    fn agent(&self) -> Result<ureq::Agent, Cause> {
        let tls = |detail: String| Cause::Tls {
            file: self.ca_file.clone(),
            detail,
        };
        let pem = std::fs::read(&self.ca_file).map_err(|e| tls(format!("cannot read it: {e}")))?;
        let certs = ureq::tls::parse_pem(&pem)
            .filter_map(|item| match item {
                Ok(ureq::tls::PemItem::Certificate(c)) => Some(Ok(c)),
                Ok(_) => None,
                Err(e) => Some(Err(e)),
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| tls(format!("not PEM: {e}")))?;
        if certs.is_empty() {
            return Err(tls("no certificate in it".to_owned()));
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = ureq::tls::TlsConfig::builder()
            .provider(ureq::tls::TlsProvider::Rustls)
            .root_certs(ureq::tls::RootCerts::Specific(Arc::new(certs)))
            .unversioned_rustls_crypto_provider(provider)
            .build();
        Ok(ureq::Agent::config_builder()
            .tls_config(tls)
            .http_status_as_error(false)
            // The API server is reached directly, as kubelet's in-cluster address is.
            .proxy(None)
            .timeout_connect(Some(CONNECT_TIMEOUT))
            .timeout_recv_response(Some(LIST_TIMEOUT))
            .build()
            .into())
    }

    /// The path of `kind`'s collection, with its query's first part.
    fn path(&self, kind: Kind, service: &str) -> String {
        match kind {
            Kind::Slices => format!(
                "/apis/discovery.k8s.io/v1/namespaces/{}/endpointslices?labelSelector=kubernetes.io%2Fservice-name%3D{service}",
                self.namespace
            ),
            Kind::Nodes => "/api/v1/nodes?".to_owned(),
        }
    }

    fn resource(&self, kind: Kind) -> String {
        match kind {
            Kind::Slices => format!(
                "endpointslices (group discovery.k8s.io) in namespace {}",
                self.namespace
            ),
            Kind::Nodes => "nodes (cluster-wide)".to_owned(),
        }
    }

    /// The `Authorization` header, with the token read now (the kubelet rotates a bound token).
    fn bearer(&self) -> Result<String, Cause> {
        let token = std::fs::read_to_string(&self.token_file).map_err(|e| Cause::Token {
            file: self.token_file.clone(),
            detail: format!("cannot read it: {e} (is automountServiceAccountToken on?)"),
        })?;
        Ok(format!("Bearer {}", token.trim()))
    }

    /// A 401 (the token) or a 403 (the RBAC rule for `verb` on `resource`) as its cause, with
    /// the API server's `message`; None for any other code.
    fn denied(
        &self,
        code: u16,
        verb: &'static str,
        resource: impl FnOnce() -> String,
        message: impl FnOnce() -> String,
    ) -> Option<Cause> {
        match code {
            401 => Some(Cause::Token {
                file: self.token_file.clone(),
                detail: format!(
                    "401 Unauthorized: the API server did not accept it (expired, revoked, or \
                     not this cluster's): {}",
                    message()
                ),
            }),
            403 => Some(Cause::Forbidden {
                verb,
                resource: resource(),
                message: message(),
            }),
            _ => None,
        }
    }

    /// GET `path_query` with the token read now; an answer other than 200 as its cause.
    fn get(
        &self,
        agent: &ureq::Agent,
        kind: Kind,
        verb: &'static str,
        path_query: &str,
        timeout: Duration,
    ) -> Result<ureq::http::Response<ureq::Body>, Cause> {
        let bearer = self.bearer()?;
        let url = format!("{}{path_query}", self.base);
        let response = agent
            .get(&url)
            .config()
            .timeout_global(Some(timeout))
            .build()
            .header("Authorization", bearer)
            .header("Accept", kind.accept(verb == "watch"))
            .call()
            .map_err(|e| self.transport(&e))?;
        let code = response.status().as_u16();
        if code == 200 {
            return Ok(response);
        }
        let status: Status = response
            .into_body()
            .with_config()
            .limit(64 << 10)
            .read_to_vec()
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        if let Some(cause) = self.denied(
            code,
            verb,
            || self.resource(kind),
            || status.message.clone(),
        ) {
            return Err(cause);
        }
        Err(match code {
            410 => Cause::Gone,
            _ => Cause::Status {
                code,
                what: format!("{verb} {}", self.resource(kind)),
                message: status.message,
            },
        })
    }

    /// A request that got no answer: TLS (the CA), or the connection (the address).
    fn transport(&self, e: &ureq::Error) -> Cause {
        let tls = match e {
            ureq::Error::Rustls(_) | ureq::Error::Tls(_) | ureq::Error::Pem(_) => true,
            ureq::Error::Io(io) => io
                .get_ref()
                .is_some_and(|inner| inner.downcast_ref::<rustls::Error>().is_some()),
            _ => false,
        };
        if tls {
            Cause::Tls {
                file: self.ca_file.clone(),
                detail: e.to_string(),
            }
        } else {
            Cause::Connect {
                url: self.base.clone(),
                detail: e.to_string(),
            }
        }
    }
}

/// `text` for a query string (RFC 3986 unreserved characters kept).
fn query_escape(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Every item of `kind`, page by page, and the list's resource version.
fn list<T: DeserializeOwned>(
    api: &Api,
    agent: &ureq::Agent,
    kind: Kind,
    service: &str,
    mut each: impl FnMut(T),
) -> Result<String, Cause> {
    let path = api.path(kind, service);
    let sep = if path.ends_with('?') { "" } else { "&" };
    let mut next: Option<String> = None;
    for _ in 0..MAX_PAGES {
        let mut query = format!("{path}{sep}limit={PAGE}");
        if let Some(token) = &next {
            query.push_str("&continue=");
            query.push_str(&query_escape(token));
        }
        let response = api.get(agent, kind, "list", &query, LIST_TIMEOUT)?;
        let stream = |detail: String| Cause::Stream {
            what: format!("list {}", api.resource(kind)),
            detail,
        };
        let body = response
            .into_body()
            .into_with_config()
            .limit(PAGE_LIMIT)
            .read_to_vec()
            .map_err(|e| stream(e.to_string()))?;
        let page: List<T> =
            serde_json::from_slice(&body).map_err(|e| stream(format!("not a list: {e}")))?;
        page.items.into_iter().for_each(&mut each);
        match page.metadata.next.filter(|c| !c.is_empty()) {
            Some(c) => next = Some(c),
            None => return Ok(page.metadata.resource_version),
        }
    }
    Err(Cause::Stream {
        what: format!("list {}", api.resource(kind)),
        detail: format!("more than {MAX_PAGES} pages of {PAGE}"),
    })
}

type Slices = BTreeMap<String, Vec<Ready>>;
type Nodes = BTreeMap<String, BTreeMap<String, String>>;

fn list_slices(api: &Api, agent: &ureq::Agent, cfg: &KubePeers) -> Result<(Slices, String), Cause> {
    let mut slices = Slices::new();
    let rv = list(
        api,
        agent,
        Kind::Slices,
        &cfg.service,
        |s: EndpointSlice| {
            slices.insert(s.metadata.name.clone(), ready_addresses(&s, cfg.port));
        },
    )?;
    Ok((slices, rv))
}

fn list_nodes(api: &Api, agent: &ureq::Agent, cfg: &KubePeers) -> Result<(Nodes, String), Cause> {
    let mut nodes = Nodes::new();
    let rv = list(api, agent, Kind::Nodes, &cfg.service, |n: NodeMeta| {
        nodes.insert(n.metadata.name.clone(), wanted_labels(&n, &cfg.labels));
    })?;
    Ok((nodes, rv))
}

/// Reads one line of at most `limit` bytes; None at the end of the stream.
fn read_event_line(reader: &mut impl BufRead, limit: u64) -> io::Result<Option<Vec<u8>>> {
    let mut line = Vec::new();
    let n = reader
        .by_ref()
        .take(limit + 1)
        .read_until(b'\n', &mut line)?;
    if n == 0 {
        return Ok(None);
    }
    if line.last() != Some(&b'\n') && n as u64 > limit {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a watch event longer than {limit} bytes"),
        ));
    }
    Ok(Some(line))
}

/// A watch event applied to the store, or why the watch must end.
fn apply_event(
    kind: Kind,
    cfg: &KubePeers,
    store: &Mutex<Store>,
    event: WatchEvent,
    rv: &mut String,
) -> Result<(), Cause> {
    let bad = |detail: String| Cause::Stream {
        what: format!("watch {}", kind.name()),
        detail,
    };
    match event.kind.as_str() {
        "ERROR" => {
            let status: Status = serde_json::from_value(event.object).unwrap_or_default();
            return Err(if status.code == 410 {
                Cause::Gone
            } else {
                Cause::Status {
                    code: status.code,
                    what: format!("watch {}", kind.name()),
                    message: status.message,
                }
            });
        }
        "BOOKMARK" => {
            let meta: NodeMeta = serde_json::from_value(event.object)
                .map_err(|e| bad(format!("a bookmark without metadata: {e}")))?;
            *rv = meta.metadata.resource_version;
        }
        "ADDED" | "MODIFIED" | "DELETED" => {
            let deleted = event.kind == "DELETED";
            match kind {
                Kind::Slices => {
                    let s: EndpointSlice = serde_json::from_value(event.object)
                        .map_err(|e| bad(format!("not an EndpointSlice: {e}")))?;
                    *rv = s.metadata.resource_version.clone();
                    let mut st = lock(store);
                    let changed = if deleted {
                        st.slices.remove(&s.metadata.name).is_some()
                    } else {
                        let ready = ready_addresses(&s, cfg.port);
                        st.slices.insert(s.metadata.name.clone(), ready.clone()) != Some(ready)
                    };
                    st.changes += u64::from(changed);
                }
                Kind::Nodes => {
                    let n: NodeMeta = serde_json::from_value(event.object)
                        .map_err(|e| bad(format!("not a node's metadata: {e}")))?;
                    *rv = n.metadata.resource_version.clone();
                    let mut st = lock(store);
                    let changed = if deleted {
                        st.nodes.remove(&n.metadata.name).is_some()
                    } else {
                        let labels = wanted_labels(&n, &cfg.labels);
                        st.nodes.insert(n.metadata.name.clone(), labels.clone()) != Some(labels)
                    };
                    st.changes += u64::from(changed);
                }
            }
        }
        other => return Err(bad(format!("an event of unknown type {other:?}"))),
    }
    Ok(())
}

/// Watches `kind` from `rv` until the server ends the watch (Ok) or it fails.
fn watch(
    (api, agent): (&Api, &ureq::Agent),
    kind: Kind,
    cfg: &KubePeers,
    store: &Mutex<Store>,
    rv: &mut String,
    seconds: u64,
    stop: &AtomicBool,
) -> Result<(), Cause> {
    let path = api.path(kind, &cfg.service);
    let sep = if path.ends_with('?') { "" } else { "&" };
    let query = format!(
        "{path}{sep}watch=1&resourceVersion={}&allowWatchBookmarks=true&timeoutSeconds={seconds}",
        query_escape(rv)
    );
    let timeout = Duration::from_secs(seconds) + WATCH_GRACE;
    let response = api.get(agent, kind, "watch", &query, timeout)?;
    let mut reader = BufReader::new(response.into_body().into_reader());
    while !stop.load(Ordering::Relaxed) {
        let line = read_event_line(&mut reader, EVENT_LIMIT).map_err(|e| Cause::Stream {
            what: format!("watch {}", kind.name()),
            detail: format!("the stream broke: {e}"),
        })?;
        let Some(line) = line else { return Ok(()) };
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let event: WatchEvent = serde_json::from_slice(&line).map_err(|e| Cause::Stream {
            what: format!("watch {}", kind.name()),
            detail: format!("not a watch event: {e}"),
        })?;
        apply_event(kind, cfg, store, event, rv)?;
    }
    Ok(())
}

/// A small random number source for jitter (not for anything secret).
struct Jitter(u64);

impl Jitter {
    fn new() -> Jitter {
        let mut h = RandomState::new().build_hasher();
        h.write_u64(u64::from(std::process::id()));
        Jitter(h.finish() | 1)
    }

    /// A number in `lo..=hi`.
    fn between(&mut self, lo: u64, hi: u64) -> u64 {
        // xorshift64
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        lo + self.0 % (hi - lo + 1)
    }
}

/// Sleeps `d`, or until `stop`.
fn pause(d: Duration, stop: &AtomicBool) {
    let step = Duration::from_millis(50);
    let mut left = d;
    while !left.is_zero() && !stop.load(Ordering::Relaxed) {
        let s = left.min(step);
        thread::sleep(s);
        left -= s;
    }
}

/// One watch thread: list, watch, and again, until `stop`.
fn run(kind: Kind, cfg: &KubePeers, store: &Mutex<Store>, stop: &AtomicBool) {
    let mut jitter = Jitter::new();
    let mut backoff = BACKOFF.0;
    let wait = |jitter: &mut Jitter, backoff: &mut Duration| {
        let ms = u64::try_from(backoff.as_millis()).unwrap_or(u64::MAX);
        pause(Duration::from_millis(jitter.between(ms / 2, ms)), stop);
        *backoff = (*backoff * 2).min(BACKOFF.1);
    };
    let failed = |cause: Cause, jitter: &mut Jitter, backoff: &mut Duration| {
        let mut st = lock(store);
        let kept = st.peers(cfg).map_or(0, |p| p.len());
        if st.failing.get(kind.name()) != Some(&cause) {
            super::log(format_args!(
                "kubernetes {}: {cause} (keeping the last peer list: {kept} peers)",
                kind.name()
            ));
            st.failing.insert(kind.name(), cause);
        }
        drop(st);
        wait(jitter, backoff);
    };
    while !stop.load(Ordering::Relaxed) {
        let listed = Api::new(cfg).and_then(|api| {
            let agent = api.agent()?;
            let rv = match kind {
                Kind::Slices => {
                    let (slices, rv) = list_slices(&api, &agent, cfg)?;
                    let mut st = lock(store);
                    st.slices = slices;
                    st.slices_listed = true;
                    st.changes += 1;
                    rv
                }
                Kind::Nodes => {
                    let (nodes, rv) = list_nodes(&api, &agent, cfg)?;
                    let mut st = lock(store);
                    st.nodes = nodes;
                    st.nodes_listed = true;
                    st.changes += 1;
                    rv
                }
            };
            Ok((api, agent, rv))
        });
        let (api, agent, mut rv) = match listed {
            Ok(ok) => ok,
            Err(cause) => {
                failed(cause, &mut jitter, &mut backoff);
                continue;
            }
        };
        if lock(store).failing.remove(kind.name()).is_some() {
            super::log(format_args!("kubernetes {}: listed again", kind.name()));
        }
        // Watch from the list's version; the server ends each watch after `seconds`, and the
        // next starts from the last version seen. A failure lists again.
        loop {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            let seconds = jitter.between(WATCH_SECONDS.0, WATCH_SECONDS.1);
            let started = std::time::Instant::now();
            let result = watch((&api, &agent), kind, cfg, store, &mut rv, seconds, stop);
            if started.elapsed() >= HEALTHY_WATCH {
                backoff = BACKOFF.0;
            }
            match result {
                // Ended by the server: again from `rv` (after a wait if it ended at once).
                Ok(()) => {
                    if started.elapsed() < Duration::from_secs(1) {
                        wait(&mut jitter, &mut backoff);
                    }
                }
                // Expired: list again soon (the backoff's step), not an error to log.
                Err(Cause::Gone) => {
                    wait(&mut jitter, &mut backoff);
                    break;
                }
                Err(cause) => {
                    failed(cause, &mut jitter, &mut backoff);
                    break;
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The publisher: `sonde mesh publish` writes the labelled peer list into one ConfigMap
// ---------------------------------------------------------------------------------------------

/// What a ConfigMap's data may hold: the API server refuses a ConfigMap over 1 MiB
/// (`MaxSecretSize`, the same for ConfigMaps); 16 KiB of it are left for the object's metadata
/// and the key.
pub(crate) const PEER_TEXT_LIMIT: usize = (1 << 20) - (16 << 10);

/// The peer list as the peer file reads it: one `ADDRESS LABEL=VALUE ...` line per peer
/// (`ADDRESS:PORT`, `[V6]:PORT`, where the port is not the default 5300), sorted by address
/// (labels by name), so that an unchanged list is an unchanged text. The bare address is what
/// a listed peer's `target` series label then is, the same name as the agent's own (its pod's
/// IP) and as DNS and `[peers] kubernetes` peers get: the N x N matrix lines up. A label whose
/// node gives it an empty value is left out (the peer file has no empty values).
pub(crate) fn peer_text(peers: &[KubePeer]) -> String {
    let mut sorted: Vec<&KubePeer> = peers.iter().collect();
    sorted.sort_by_key(|p| p.addr);
    let mut text = String::new();
    for p in sorted {
        if p.addr.port() == DEFAULT_PORT {
            text.push_str(&p.addr.ip().to_string());
        } else {
            text.push_str(&p.addr.to_string());
        }
        for (k, v) in p.labels.iter().filter(|(_, v)| !v.is_empty()) {
            text.push(' ');
            text.push_str(k);
            text.push('=');
            text.push_str(v);
        }
        text.push('\n');
    }
    text
}

/// [`peer_text`], refused over [`PEER_TEXT_LIMIT`].
pub(crate) fn checked_peer_text(peers: &[KubePeer]) -> Result<String, Cause> {
    let text = peer_text(peers);
    if text.len() > PEER_TEXT_LIMIT {
        return Err(Cause::TooLarge {
            bytes: text.len(),
            peers: peers.len(),
        });
    }
    Ok(text)
}

/// The ConfigMap the publisher writes, and its data key.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(crate) configmap: String,
    pub(crate) key: String,
}

/// What a write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Written {
    /// The key already held the text: nothing sent.
    Unchanged,
    /// The ConfigMap was replaced (PUT) with the new text.
    Updated,
    /// The ConfigMap did not exist: created (POST).
    Created,
}

/// A ConfigMap as far as the publisher reads it (the rest of the object is sent back as it came).
#[derive(Debug, Default, Deserialize)]
struct ConfigMapData {
    #[serde(default)]
    data: Option<BTreeMap<String, String>>,
}

impl Api {
    fn configmaps(&self) -> String {
        format!("configmaps in namespace {}", self.namespace)
    }

    /// One request with the token read now: its status and body (at most 2 MiB), 401 and 403
    /// as their causes.
    fn request(
        &self,
        agent: &ureq::Agent,
        (method, verb): (&str, &'static str),
        path: &str,
        body: Option<&[u8]>,
    ) -> Result<(u16, Vec<u8>), Cause> {
        let bearer = self.bearer()?;
        let url = format!("{}{path}", self.base);
        let request = ureq::http::Request::builder()
            .method(method)
            .uri(&url)
            .header("Authorization", bearer)
            .header("Accept", "application/json")
            .header("Content-Type", "application/json");
        let request = request
            .body(body.unwrap_or_default().to_vec())
            .map_err(|e| Cause::Stream {
                what: format!("{verb} {}", self.configmaps()),
                detail: e.to_string(),
            })?;
        let response = agent.run(request).map_err(|e| self.transport(&e))?;
        let code = response.status().as_u16();
        let body = response
            .into_body()
            .with_config()
            .limit(2 << 20)
            .read_to_vec()
            .map_err(|e| Cause::Stream {
                what: format!("{verb} {}", self.configmaps()),
                detail: e.to_string(),
            })?;
        let message = || {
            serde_json::from_slice::<Status>(&body)
                .map(|s| s.message)
                .unwrap_or_default()
        };
        match self.denied(code, verb, || self.configmaps(), message) {
            Some(cause) => Err(cause),
            None => Ok((code, body)),
        }
    }
}

/// Writes `text` under `target.key` of `target.configmap` in the namespace: read it (get); if
/// the key already holds the text, nothing more; else replace the object with the key set
/// (update, with its resourceVersion: a concurrent change is a 409, tried again at the next
/// write), or create it where it does not exist. Other keys and the metadata are kept.
pub(crate) fn write_configmap(
    cfg: &KubePeers,
    target: &Target,
    text: &str,
) -> Result<Written, Cause> {
    let api = Api::new(cfg)?;
    let agent = api.agent()?;
    let base = format!("/api/v1/namespaces/{}/configmaps", api.namespace);
    let one = format!("{base}/{}", target.configmap);
    let status = |verb: &str, code: u16, body: &[u8]| Cause::Status {
        code,
        what: format!(
            "{verb} configmap {} in namespace {}",
            target.configmap, api.namespace
        ),
        message: serde_json::from_slice::<Status>(body)
            .map(|s| s.message)
            .unwrap_or_default(),
    };
    let bad = |detail: String| Cause::Stream {
        what: format!("get configmap {}", target.configmap),
        detail,
    };
    let (code, body) = api.request(&agent, ("GET", "get"), &one, None)?;
    match code {
        200 => {
            let mut object: serde_json::Value =
                serde_json::from_slice(&body).map_err(|e| bad(format!("not JSON: {e}")))?;
            let current: ConfigMapData = serde_json::from_value(object.clone())
                .map_err(|e| bad(format!("not a ConfigMap: {e}")))?;
            if current
                .data
                .as_ref()
                .and_then(|d| d.get(&target.key))
                .is_some_and(|t| t == text)
            {
                return Ok(Written::Unchanged);
            }
            let Some(map) = object.as_object_mut() else {
                return Err(bad("not an object".to_owned()));
            };
            let data = map
                .entry("data")
                .or_insert_with(|| serde_json::Value::Object(serde_json::Map::new()));
            if !data.is_object() {
                *data = serde_json::Value::Object(serde_json::Map::new());
            }
            data[&target.key] = serde_json::Value::String(text.to_owned());
            let body = serde_json::to_vec(&object).map_err(|e| bad(e.to_string()))?;
            let (code, answer) = api.request(&agent, ("PUT", "update"), &one, Some(&body))?;
            match code {
                200 | 201 => Ok(Written::Updated),
                _ => Err(status("update", code, &answer)),
            }
        }
        404 => {
            let object = serde_json::json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": target.configmap, "namespace": api.namespace,
                             "labels": {"app.kubernetes.io/managed-by": "sonde-mesh-publish"}},
                "data": {target.key.clone(): text},
            });
            let body = serde_json::to_vec(&object).map_err(|e| bad(e.to_string()))?;
            let (code, answer) = api.request(&agent, ("POST", "create"), &base, Some(&body))?;
            match code {
                200 | 201 => Ok(Written::Created),
                _ => Err(status("create", code, &answer)),
            }
        }
        _ => Err(status("get", code, &body)),
    }
}

/// How the publisher runs.
#[derive(Debug, Clone)]
pub(crate) struct Publish {
    pub(crate) source: KubePeers,
    pub(crate) target: Target,
    /// At most one write per this; changes within it are written together at its end.
    pub(crate) min_interval: Duration,
    /// The ConfigMap is read again this long after the last read or write, and the list
    /// written back if its text is not the list's (a hand edit, a `kubectl apply` of an
    /// older copy): without it, such a change would stand until the next change of the peers.
    pub(crate) resync: Duration,
}

/// Lists once and writes the list (`--once`).
pub(crate) fn publish_once(p: &Publish) -> Result<(usize, Written), Cause> {
    let peers = list_once(&p.source)?;
    let text = checked_peer_text(&peers)?;
    Ok((peers.len(), write_configmap(&p.source, &p.target, &text)?))
}

/// Watches (as `[peers] kubernetes` does) and writes the list whenever its text changes, at
/// most once per `min_interval`, until `stop`. A failed write is logged (once per cause) and
/// tried again after `min_interval`; the watches keep their last list meanwhile.
pub(crate) fn publish_watching(p: &Publish, stop: &Arc<AtomicBool>) -> io::Result<()> {
    let watch = KubeWatch::spawn(&p.source, stop)?;
    let step = Duration::from_millis(50).min(p.min_interval);
    // The text the ConfigMap is known to hold (None: not yet written or read), and the store's
    // change count it was rendered from: the list is rendered again only when that moved (or
    // a write failed), not at every step.
    let mut written: Option<String> = None;
    let mut rendered: Option<u64> = None;
    let mut last_try: Option<std::time::Instant> = None;
    let mut failing: Option<Cause> = None;
    // Set from a resync's start until its read (and write) went through.
    let mut resyncing = false;
    while !stop.load(Ordering::Relaxed) {
        thread::sleep(step);
        // Resync: forget what the ConfigMap is known to hold, so that it is read (one get) and
        // compared again; it is written only if its text differs.
        if last_try.is_some_and(|t| t.elapsed() >= p.resync) && written.is_some() {
            written = None;
            rendered = None;
            resyncing = true;
        }
        if rendered == Some(watch.changes())
            || last_try.is_some_and(|t| t.elapsed() < p.min_interval)
        {
            continue;
        }
        let (changes, peers) = watch.peers_at();
        let Some(peers) = peers else { continue };
        let outcome = checked_peer_text(&peers).and_then(|text| {
            if written.as_deref() == Some(text.as_str()) {
                return Ok(None);
            }
            last_try = Some(std::time::Instant::now());
            let w = write_configmap(&p.source, &p.target, &text)?;
            written = Some(text);
            Ok(Some(w))
        });
        if outcome.is_ok() {
            rendered = Some(changes);
        }
        match outcome {
            Ok(None) => resyncing = false,
            Ok(Some(w)) => {
                failing = None;
                let what = match w {
                    // A resync that found the list in place: nothing to say.
                    Written::Unchanged if resyncing => None,
                    Written::Unchanged => Some("already held"),
                    // A resync that found another text (a hand edit): said as such.
                    Written::Updated if resyncing => {
                        Some("found changed by someone else, restored to")
                    }
                    Written::Updated => Some("updated with"),
                    Written::Created => Some("created with"),
                };
                resyncing = false;
                if let Some(what) = what {
                    super::log(format_args!(
                        "configmap {}, key {}: {what} {} peers",
                        p.target.configmap,
                        p.target.key,
                        peers.len()
                    ));
                }
            }
            Err(cause) => {
                last_try = Some(std::time::Instant::now());
                if failing.as_ref() != Some(&cause) {
                    super::log(format_args!(
                        "configmap {}: {cause} (the ConfigMap keeps its last list; trying \
                         again every {:?})",
                        p.target.configmap, p.min_interval
                    ));
                    failing = Some(cause);
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};
    use std::sync::mpsc;
    use std::time::Instant;

    use serde_json::{json, Value};

    /// An EndpointSlice as the EndpointSlice controller writes one for the DaemonSet's headless
    /// Service (trimmed of managedFields).
    const SLICE_V4: &str = r#"{
      "kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1",
      "metadata": {
        "name": "sonde-7xk2p", "generateName": "sonde-", "namespace": "sonde",
        "uid": "0b6e4a0c-5d3e-4a4b-9f0e-2f6c3b1d9a11", "resourceVersion": "48213",
        "labels": {"endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
                   "kubernetes.io/service-name": "sonde", "service.kubernetes.io/headless": ""},
        "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": "sonde",
                             "uid": "5c1f", "controller": true, "blockOwnerDeletion": true}]
      },
      "addressType": "IPv4",
      "endpoints": [
        {"addresses": ["10.244.1.7"], "conditions": {"ready": true, "serving": true, "terminating": false},
         "targetRef": {"kind": "Pod", "namespace": "sonde", "name": "sonde-4xq8d", "uid": "a1"},
         "nodeName": "node-1", "zone": "z1"},
        {"addresses": ["10.244.2.9"], "conditions": {"ready": false, "serving": false, "terminating": true},
         "targetRef": {"kind": "Pod", "namespace": "sonde", "name": "sonde-9kd2m", "uid": "a2"},
         "nodeName": "node-2"},
        {"addresses": ["10.244.3.4"], "conditions": {},
         "targetRef": {"kind": "Pod", "namespace": "sonde", "name": "sonde-p2l7c", "uid": "a3"},
         "nodeName": "node-3"}
      ],
      "ports": [
        {"name": "metrics", "protocol": "TCP", "port": 9530},
        {"name": "sonde-udp", "protocol": "UDP", "port": 5300},
        {"name": "sonde-tcp", "protocol": "TCP", "port": 5310}
      ]
    }"#;

    fn slice(text: &str) -> EndpointSlice {
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn ready_endpoints_of_a_slice_at_its_sonde_tcp_port() {
        let s = slice(SLICE_V4);
        let ready = ready_addresses(&s, None);
        // Not ready: left out; unknown readiness (no `ready`): ready, as the API advises.
        assert_eq!(
            ready,
            [
                Ready {
                    addr: "10.244.1.7:5310".parse().unwrap(),
                    node: Some("node-1".into()),
                    zone: Some("z1".into()),
                },
                Ready {
                    addr: "10.244.3.4:5310".parse().unwrap(),
                    node: Some("node-3".into()),
                    zone: None,
                },
            ]
        );
        // The mesh file's port wins over the slice's.
        assert!(ready_addresses(&s, Some(7000))
            .iter()
            .all(|r| r.addr.port() == 7000));
        // IPv6, no ports, endpoints null, an FQDN slice.
        let v6 = slice(
            r#"{"metadata": {"name": "sonde-v6"}, "addressType": "IPv6",
                "endpoints": [{"addresses": ["fd00:10:244::5"], "conditions": {"ready": true},
                               "nodeName": "node-5"}]}"#,
        );
        assert_eq!(
            ready_addresses(&v6, None)[0].addr,
            "[fd00:10:244::5]:5300".parse().unwrap()
        );
        let empty = slice(
            r#"{"metadata": {"name": "e"}, "addressType": "IPv4", "endpoints": null, "ports": null}"#,
        );
        assert!(ready_addresses(&empty, None).is_empty());
        let fqdn = slice(
            r#"{"metadata": {"name": "f"}, "addressType": "FQDN",
                "endpoints": [{"addresses": ["node-a.example.com"]}]}"#,
        );
        assert!(ready_addresses(&fqdn, None).is_empty());
    }

    fn peers_cfg(labels: &[(&str, &str)]) -> KubePeers {
        KubePeers {
            service: "sonde".into(),
            namespace: Some("sonde".into()),
            port: None,
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            api_server: Some("https://127.0.0.1:1".into()),
            token_file: "token".into(),
            ca_file: "ca.crt".into(),
        }
    }

    #[test]
    fn several_slices_and_node_metadata_make_labelled_peers() {
        let cfg = peers_cfg(&[
            ("zone", "topology.kubernetes.io/zone"),
            ("rack", "example.com/rack"),
        ]);
        // A PartialObjectMetadataList page, as the API server answers the metadata-only list.
        let nodes: List<NodeMeta> = serde_json::from_str(
            r#"{"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1",
                "metadata": {"resourceVersion": "48290", "continue": "eyJ2IjoibWV0YS5rOHMuaW8vdjEifQ"},
                "items": [
                  {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                   "metadata": {"name": "node-1", "resourceVersion": "48001",
                     "labels": {"kubernetes.io/hostname": "node-1", "topology.kubernetes.io/zone": "z1",
                                "example.com/rack": "r7", "node.kubernetes.io/instance-type": "m6i.large"},
                     "annotations": {"node.alpha.kubernetes.io/ttl": "0"}}},
                  {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                   "metadata": {"name": "node-3", "resourceVersion": "48002",
                     "labels": {"topology.kubernetes.io/zone": "z2"}}}
                ]}"#,
        )
        .unwrap();
        assert_eq!(nodes.metadata.resource_version, "48290");
        assert!(nodes.metadata.next.is_some());
        let mut store = Store {
            slices_listed: true,
            nodes_listed: true,
            ..Store::default()
        };
        for n in &nodes.items {
            store
                .nodes
                .insert(n.metadata.name.clone(), wanted_labels(n, &cfg.labels));
        }
        store.slices.insert(
            "sonde-7xk2p".into(),
            ready_addresses(&slice(SLICE_V4), None),
        );
        // A second slice of the same Service, with one address the first has too (a pod
        // moving between slices): each address once.
        let second = slice(
            r#"{"metadata": {"name": "sonde-8mq4z"}, "addressType": "IPv4",
                "endpoints": [{"addresses": ["10.244.9.9"], "nodeName": "node-9"},
                              {"addresses": ["10.244.1.7"], "nodeName": "node-1"}],
                "ports": [{"name": "sonde-tcp", "port": 5310, "protocol": "TCP"}]}"#,
        );
        store
            .slices
            .insert("sonde-8mq4z".into(), ready_addresses(&second, None));
        let peers = store.peers(&cfg).unwrap();
        let l = |pairs: &[(&str, &str)]| -> Labels {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        assert_eq!(
            peers,
            [
                KubePeer {
                    addr: "10.244.1.7:5310".parse().unwrap(),
                    labels: l(&[("zone", "z1"), ("rack", "r7")])
                },
                KubePeer {
                    addr: "10.244.3.4:5310".parse().unwrap(),
                    labels: l(&[("zone", "z2")])
                },
                // Its node is not (yet) listed: no labels, still a peer.
                KubePeer {
                    addr: "10.244.9.9:5310".parse().unwrap(),
                    labels: Labels::new()
                },
            ]
        );
        // Not before both lists.
        store.nodes_listed = false;
        assert!(store.peers(&cfg).is_none());
        // Without node labels, the nodes are not needed.
        assert_eq!(store.peers(&peers_cfg(&[])).unwrap().len(), 3);
        // The zone only: not needed either, and taken from the slice's copy of it where no
        // node is listed (node-1's endpoint carries zone z1).
        let zone_only = peers_cfg(&[("zone", "topology.kubernetes.io/zone")]);
        assert!(!needs_nodes(&zone_only) && needs_nodes(&cfg));
        store.nodes.clear();
        let peers = store.peers(&zone_only).unwrap();
        assert_eq!(peers[0].labels, l(&[("zone", "z1")]));
        assert!(peers[1].labels.is_empty() && peers[2].labels.is_empty());
    }

    #[test]
    fn events_lines_and_causes() {
        let cfg = peers_cfg(&[("zone", "topology.kubernetes.io/zone")]);
        let store = Mutex::new(Store::default());
        let mut rv = String::new();
        let event = |text: &str| -> WatchEvent { serde_json::from_str(text).unwrap() };
        apply_event(
            Kind::Nodes,
            &cfg,
            &store,
            event(r#"{"type": "ADDED", "object": {"metadata": {"name": "n1", "resourceVersion": "7", "labels": {"topology.kubernetes.io/zone": "z1"}}}}"#),
            &mut rv,
        )
        .unwrap();
        assert_eq!(rv, "7");
        apply_event(
            Kind::Nodes,
            &cfg,
            &store,
            event(r#"{"type": "BOOKMARK", "object": {"kind": "PartialObjectMetadata", "metadata": {"resourceVersion": "12"}}}"#),
            &mut rv,
        )
        .unwrap();
        assert_eq!(rv, "12");
        assert_eq!(
            lock(&store).nodes["n1"]["topology.kubernetes.io/zone"],
            "z1"
        );
        apply_event(
            Kind::Nodes,
            &cfg,
            &store,
            event(r#"{"type": "DELETED", "object": {"metadata": {"name": "n1", "resourceVersion": "13"}}}"#),
            &mut rv,
        )
        .unwrap();
        assert!(lock(&store).nodes.is_empty());
        let gone = apply_event(
            Kind::Nodes,
            &cfg,
            &store,
            event(
                r#"{"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": "too old resource version: 12 (48000)", "reason": "Expired", "code": 410}}"#,
            ),
            &mut rv,
        );
        assert_eq!(gone, Err(Cause::Gone));
        // A line over the limit is refused, not read whole.
        let mut long = io::Cursor::new(vec![b'x'; 100]);
        assert!(read_event_line(&mut long, 10).is_err());
        let mut two = io::Cursor::new(b"{}\n{}".to_vec());
        assert_eq!(read_event_line(&mut two, 10).unwrap().unwrap(), b"{}\n");
        assert_eq!(read_event_line(&mut two, 10).unwrap().unwrap(), b"{}");
        assert!(read_event_line(&mut two, 10).unwrap().is_none());
        assert_eq!(query_escape("a=b/c+d"), "a%3Db%2Fc%2Bd");
    }

    // -----------------------------------------------------------------------------------------
    // A fake API server: HTTPS with a throwaway CA, lists (in pages of 2) and watch streams
    // -----------------------------------------------------------------------------------------

    /// A CA and a server certificate for 127.0.0.1 signed by it.
    struct Pki {
        ca_pem: String,
        server: Arc<rustls::ServerConfig>,
    }

    fn pki() -> Pki {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "sonde test kubernetes CA");
        let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])
            .unwrap()
            .signed_by(&key, &ca)
            .unwrap();
        let server = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .unwrap();
        Pki {
            ca_pem: ca.pem(),
            server: Arc::new(server),
        }
    }

    #[derive(Default)]
    struct World {
        token: String,
        nodes: Vec<Value>,
        slices: Vec<Value>,
        rv: u64,
        /// 403 to every request for this resource.
        forbid: Option<&'static str>,
        lists: BTreeMap<&'static str, usize>,
        tokens: Vec<String>,
        accepts: Vec<String>,
        watchers: Vec<(&'static str, mpsc::Sender<String>)>,
        /// ConfigMaps in namespace sonde, by name.
        configmaps: BTreeMap<String, Value>,
        /// Every ConfigMap request: (method, the object sent).
        configmap_requests: Vec<(String, Value)>,
        /// 403 to this ConfigMap verb (get, update, create).
        forbid_configmap: Option<&'static str>,
    }

    impl World {
        /// The ConfigMap writes (PUT and POST) so far.
        fn writes(&self) -> Vec<(String, Value)> {
            self.configmap_requests
                .iter()
                .filter(|(m, _)| m != "GET")
                .cloned()
                .collect()
        }
    }

    struct FakeApi {
        port: u16,
        world: Arc<Mutex<World>>,
    }

    fn status(code: u16, reason: &str, message: &str) -> Value {
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": message, "reason": reason, "code": code})
    }

    impl FakeApi {
        fn start(config: Arc<rustls::ServerConfig>, world: World) -> FakeApi {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let port = listener.local_addr().unwrap().port();
            let world = Arc::new(Mutex::new(world));
            let w = Arc::clone(&world);
            thread::spawn(move || {
                for conn in listener.incoming().flatten() {
                    let (config, w) = (Arc::clone(&config), Arc::clone(&w));
                    thread::spawn(move || serve(conn, config, &w));
                }
            });
            FakeApi { port, world }
        }

        fn world(&self) -> std::sync::MutexGuard<'_, World> {
            self.world.lock().unwrap()
        }

        /// An event on `kind`'s watches, and the same change in what a list returns.
        fn event(&self, kind: &'static str, typ: &str, mut object: Value) {
            let mut w = self.world();
            w.rv += 1;
            object["metadata"]["resourceVersion"] = json!(w.rv.to_string());
            let name = object["metadata"]["name"].clone();
            let items = if kind == "nodes" {
                &mut w.nodes
            } else {
                &mut w.slices
            };
            items.retain(|o| o["metadata"]["name"] != name);
            if typ != "DELETED" {
                items.push(object.clone());
            }
            let line = json!({"type": typ, "object": object}).to_string();
            w.watchers
                .retain(|(k, tx)| *k != kind || tx.send(line.clone()).is_ok());
        }

        fn send(&self, kind: &'static str, line: &str) {
            let mut w = self.world();
            w.watchers
                .retain(|(k, tx)| *k != kind || tx.send(line.to_owned()).is_ok());
        }

        /// Breaks every watch stream (the connection closes mid-body).
        fn break_watches(&self) {
            self.world().watchers.clear();
        }

        fn watching(&self, kind: &str) -> bool {
            self.world().watchers.iter().any(|(k, _)| *k == kind)
        }
    }

    fn respond(out: &mut impl Write, code: u16, body: &Value) -> io::Result<()> {
        let body = body.to_string();
        write!(
            out,
            "HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )?;
        out.flush()
    }

    fn serve(conn: TcpStream, config: Arc<rustls::ServerConfig>, world: &Mutex<World>) {
        let tls = rustls::ServerConnection::new(config).unwrap();
        let mut stream = BufReader::new(rustls::StreamOwned::new(tls, conn));
        loop {
            let mut head = Vec::new();
            loop {
                let mut line = String::new();
                match stream.read_line(&mut line) {
                    Ok(0) | Err(_) => return,
                    Ok(_) if line == "\r\n" => break,
                    Ok(_) => head.push(line.trim_end().to_owned()),
                }
            }
            let target = head[0].split(' ').nth(1).unwrap_or_default().to_owned();
            let header = |name: &str| {
                head.iter()
                    .find_map(|h| {
                        h.split_once(": ")
                            .filter(|(k, _)| k.eq_ignore_ascii_case(name))
                    })
                    .map(|(_, v)| v.to_owned())
                    .unwrap_or_default()
            };
            let (path, query) = target.split_once('?').unwrap_or((&target, ""));
            let param = |name: &str| {
                query
                    .split('&')
                    .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
                    .map(str::to_owned)
            };
            let method = head[0].split(' ').next().unwrap_or_default().to_owned();
            let length: usize = header("Content-Length").parse().unwrap_or(0);
            let mut body = vec![0; length];
            if stream.read_exact(&mut body).is_err() {
                return;
            }
            let out = stream.get_mut();
            let mut w = world.lock().unwrap();
            let token = header("Authorization");
            w.tokens.push(token.clone());
            if token != format!("Bearer {}", w.token) {
                let _ = respond(out, 401, &status(401, "Unauthorized", "Unauthorized"));
                continue;
            }
            if let Some(rest) = path.strip_prefix("/api/v1/namespaces/sonde/configmaps") {
                let sent: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                w.configmap_requests.push((method.clone(), sent.clone()));
                let name = rest.trim_start_matches('/').to_owned();
                let verb = match method.as_str() {
                    "GET" => "get",
                    "PUT" => "update",
                    _ => "create",
                };
                if w.forbid_configmap == Some(verb) {
                    let message = format!(
                        "configmaps \"{name}\" is forbidden: User \"system:serviceaccount:sonde:sonde-publish\" cannot {verb} resource \"configmaps\" in API group \"\" in the namespace \"sonde\""
                    );
                    let _ = respond(out, 403, &status(403, "Forbidden", &message));
                    continue;
                }
                let _ = match method.as_str() {
                    "GET" => match w.configmaps.get(&name) {
                        Some(cm) => respond(out, 200, cm),
                        None => respond(out, 404, &status(404, "NotFound", "not found")),
                    },
                    "PUT" if w.configmaps.contains_key(&name) => {
                        w.configmaps.insert(name, sent.clone());
                        respond(out, 200, &sent)
                    }
                    "POST" if name.is_empty() => {
                        let name = sent["metadata"]["name"].as_str().unwrap_or_default();
                        w.configmaps.insert(name.to_owned(), sent.clone());
                        respond(out, 201, &sent)
                    }
                    _ => respond(out, 405, &status(405, "MethodNotAllowed", "no")),
                };
                continue;
            }
            let kind = match path {
                "/apis/discovery.k8s.io/v1/namespaces/sonde/endpointslices"
                    if param("labelSelector").as_deref()
                        == Some("kubernetes.io%2Fservice-name%3Dsonde") =>
                {
                    "endpointslices"
                }
                "/api/v1/nodes" => "nodes",
                _ => {
                    let _ = respond(out, 404, &status(404, "NotFound", "not found"));
                    continue;
                }
            };
            w.accepts.push(format!("{kind} {}", header("Accept")));
            let watch = param("watch").is_some();
            if w.forbid == Some(kind) {
                let verb = if watch { "watch" } else { "list" };
                let message = format!(
                    "{kind} is forbidden: User \"system:serviceaccount:sonde:sonde\" cannot {verb} resource \"{kind}\""
                );
                let _ = respond(out, 403, &status(403, "Forbidden", &message));
                continue;
            }
            if watch {
                let (tx, rx) = mpsc::channel();
                w.watchers.push((kind, tx));
                drop(w);
                let _ = write!(
                    out,
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                );
                let _ = out.flush();
                // Each event a chunk; the sender dropped (break_watches): the connection
                // closes without the last chunk, a broken stream.
                while let Ok(line) = rx.recv() {
                    let line = format!("{line}\n");
                    if write!(out, "{:x}\r\n{line}\r\n", line.len())
                        .and_then(|()| out.flush())
                        .is_err()
                    {
                        return;
                    }
                }
                return;
            }
            *w.lists.entry(kind).or_default() += 1;
            let items = if kind == "nodes" { &w.nodes } else { &w.slices };
            // Pages of 2, the continue token an index with characters to escape.
            let from: usize = param("continue")
                .and_then(|c| c.strip_prefix("at%3D").and_then(|n| n.parse().ok()))
                .unwrap_or(0);
            let page: Vec<Value> = items.iter().skip(from).take(2).cloned().collect();
            let next = if from + 2 < items.len() {
                json!(format!("at={}", from + 2))
            } else {
                Value::Null
            };
            let list_kind = if kind == "nodes" {
                "PartialObjectMetadataList"
            } else {
                "EndpointSliceList"
            };
            let body = json!({"kind": list_kind, "metadata": {"resourceVersion": w.rv.to_string(), "continue": next}, "items": page});
            drop(w);
            let _ = respond(out, 200, &body);
        }
    }

    fn node(name: &str, zone: &str, rack: &str) -> Value {
        json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
               "metadata": {"name": name, "resourceVersion": "1",
                 "labels": {"topology.kubernetes.io/zone": zone, "example.com/rack": rack,
                            "kubernetes.io/hostname": name}}})
    }

    fn slice_json(name: &str, family: &str, endpoints: &[(&str, &str, Option<bool>)]) -> Value {
        slice_json_at(name, family, endpoints, 5301)
    }

    fn slice_json_at(
        name: &str,
        family: &str,
        endpoints: &[(&str, &str, Option<bool>)],
        port: u16,
    ) -> Value {
        let endpoints: Vec<Value> = endpoints
            .iter()
            .map(|(ip, node, ready)| {
                let conditions = ready.map_or_else(|| json!({}), |r| json!({"ready": r}));
                json!({"addresses": [ip], "conditions": conditions, "nodeName": node})
            })
            .collect();
        json!({"kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1",
               "metadata": {"name": name, "namespace": "sonde", "resourceVersion": "1",
                            "labels": {"kubernetes.io/service-name": "sonde"}},
               "addressType": family, "endpoints": endpoints,
               "ports": [{"name": "sonde-tcp", "protocol": "TCP", "port": port}]})
    }

    /// Waits (at most 30 s: no timing is asserted) for `cond`.
    fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !cond() {
            assert!(Instant::now() < deadline, "never: {what}");
            thread::sleep(Duration::from_millis(20));
        }
    }

    type Seen = Vec<(String, Vec<(String, String)>)>;

    fn seen(watch: &KubeWatch) -> Seen {
        watch
            .peers()
            .unwrap_or_default()
            .into_iter()
            .map(|p| (p.addr.to_string(), p.labels.into_iter().collect::<Vec<_>>()))
            .collect()
    }

    fn has(watch: &KubeWatch, addr: &str, labels: &[(&str, &str)]) -> bool {
        let want: Vec<(String, String)> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        seen(watch).iter().any(|(a, l)| a == addr && *l == want)
    }

    /// A fake API server over `world` (its token written beside a CA it trusts, in `dir`),
    /// and a `[peers] kubernetes` with zone and rack labels pointed at it.
    fn served(dir: &std::path::Path, world: World) -> (FakeApi, KubePeers) {
        let good = pki();
        let (token_file, ca_file) = (dir.join("token"), dir.join("ca.crt"));
        std::fs::write(&token_file, format!("{}\n", world.token)).unwrap();
        std::fs::write(&ca_file, &good.ca_pem).unwrap();
        let api = FakeApi::start(Arc::clone(&good.server), world);
        let mut cfg = peers_cfg(&[
            ("zone", "topology.kubernetes.io/zone"),
            ("rack", "example.com/rack"),
        ]);
        cfg.api_server = Some(format!("https://127.0.0.1:{}", api.port));
        cfg.token_file = token_file;
        cfg.ca_file = ca_file;
        (api, cfg)
    }

    /// Three nodes: two in rack r1 of zone z1, one in rack r3 of zone z2.
    fn two_racks() -> Vec<Value> {
        vec![
            node("node-1", "z1", "r1"),
            node("node-2", "z1", "r1"),
            node("node-3", "z2", "r3"),
        ]
    }

    /// The whole life of a watch against a fake API server: peers and labels from the lists,
    /// changes through watch events, a relist on 410, and the causes of failure named while
    /// the last list is kept.
    #[test]
    fn the_watch_follows_the_api_server_and_names_what_fails() {
        let dir = tempfile::tempdir().unwrap();
        let (api, cfg) = served(
            dir.path(),
            World {
                token: "token-1".into(),
                rv: 100,
                nodes: vec![
                    node("node-1", "z1", "r1"),
                    node("node-2", "z2", "r2"),
                    node("node-3", "z2", "r3"),
                ],
                slices: vec![
                    slice_json(
                        "sonde-abcde",
                        "IPv4",
                        &[
                            ("198.18.0.1", "node-1", Some(true)),
                            ("198.18.0.2", "node-2", Some(true)),
                            ("198.18.0.3", "node-3", Some(false)),
                        ],
                    ),
                    slice_json("sonde-v6xyz", "IPv6", &[("2001:db8::4", "node-3", None)]),
                ],
                ..World::default()
            },
        );
        let (token_file, ca_file) = (cfg.token_file.clone(), cfg.ca_file.clone());
        let good_ca = std::fs::read(&ca_file).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let watch = KubeWatch::spawn(&cfg, &stop).unwrap();

        // The lists: ready endpoints at the slices' sonde-tcp port, labelled from their nodes.
        wait_for("the first lists", || watch.peers().is_some());
        assert_eq!(
            seen(&watch),
            [
                (
                    "198.18.0.1:5301".to_owned(),
                    vec![("rack".into(), "r1".into()), ("zone".into(), "z1".into())]
                ),
                (
                    "198.18.0.2:5301".to_owned(),
                    vec![("rack".into(), "r2".into()), ("zone".into(), "z2".into())]
                ),
                (
                    "[2001:db8::4]:5301".to_owned(),
                    vec![("rack".into(), "r3".into()), ("zone".into(), "z2".into())]
                ),
            ]
        );
        {
            let w = api.world();
            // Three nodes in pages of two: two requests; the nodes as metadata only.
            assert_eq!(w.lists["nodes"], 2, "the second page was not asked for");
            assert!(
                w.accepts
                    .iter()
                    .filter(|a| a.starts_with("nodes "))
                    .all(|a| a.contains("as=PartialObjectMetadata")),
                "{:?}",
                w.accepts
            );
            assert!(w.tokens.iter().all(|t| t == "Bearer token-1"));
        }
        wait_for("both watches", || {
            api.watching("nodes") && api.watching("endpointslices")
        });

        // [select] over these peers, as this agent (198.18.0.1, zone z1) computes it: nobody
        // shares its zone until node-2 moves into it.
        let mesh = super::super::MeshConfig::parse(
            "name = \"198.18.0.1\"\n\
             [peers]\nkubernetes = { service = \"sonde\", labels = { zone = \"topology.kubernetes.io/zone\" } }\n\
             [select]\ngroup = \"zone\"\n",
        )
        .unwrap();
        let selected = |watch: &KubeWatch| {
            let list = super::super::current_peer_list(
                &mesh,
                &mut None,
                &mut Vec::new(),
                &mut None,
                &super::super::system_resolver,
                Some(&watch.view()),
            );
            let own = list.own_labels.get("zone").cloned();
            (
                list.peers.into_iter().map(|p| p.label).collect::<Vec<_>>(),
                own,
            )
        };
        assert_eq!(selected(&watch), (vec![], Some("z1".to_owned())));

        // A node's label changes: its endpoint's labels follow, and so does the selection.
        api.event("nodes", "MODIFIED", node("node-2", "z1", "r2"));
        wait_for("node-2 in z1", || {
            has(&watch, "198.18.0.2:5301", &[("rack", "r2"), ("zone", "z1")])
        });
        assert_eq!(
            selected(&watch),
            (vec!["198.18.0.2".to_owned()], Some("z1".to_owned()))
        );

        // An endpoint added (a slice modified), a slice deleted.
        api.event(
            "endpointslices",
            "MODIFIED",
            slice_json(
                "sonde-abcde",
                "IPv4",
                &[
                    ("198.18.0.1", "node-1", Some(true)),
                    ("198.18.0.2", "node-2", Some(true)),
                    ("198.18.0.3", "node-3", Some(true)),
                ],
            ),
        );
        wait_for("198.18.0.3 ready", || {
            has(&watch, "198.18.0.3:5301", &[("rack", "r3"), ("zone", "z2")])
        });
        api.event(
            "endpointslices",
            "DELETED",
            slice_json("sonde-v6xyz", "IPv6", &[]),
        );
        wait_for("the IPv6 slice gone", || {
            !seen(&watch).iter().any(|(a, _)| a.starts_with('['))
        });
        assert_eq!(seen(&watch).len(), 3);

        // 410 Gone on the nodes' watch: a new list, which sees what no event said.
        let lists = api.world().lists["nodes"];
        api.world().nodes[0] = node("node-1", "z1", "r9");
        api.send(
            "nodes",
            &json!({"type": "ERROR", "object": status(410, "Expired", "too old resource version: 101 (180)")})
                .to_string(),
        );
        wait_for("node-1 relisted", || {
            has(&watch, "198.18.0.1:5301", &[("rack", "r9"), ("zone", "z1")])
        });
        assert!(api.world().lists["nodes"] > lists);
        assert!(watch.failing().is_empty(), "{:?}", watch.failing());
        let kept = seen(&watch);

        // The token rotates (a bound token, renewed by the kubelet): the file is read again.
        std::fs::write(&token_file, "token-2\n").unwrap();
        api.world().token = "token-2".into();
        wait_for("a watch again", || {
            api.watching("nodes") && api.watching("endpointslices")
        });
        api.break_watches();
        wait_for("the new token sent", || {
            api.world().tokens.iter().any(|t| t == "Bearer token-2")
                && api.watching("nodes")
                && api.watching("endpointslices")
        });
        api.event(
            "endpointslices",
            "ADDED",
            slice_json(
                "sonde-more1",
                "IPv4",
                &[("198.18.0.6", "node-1", Some(true))],
            ),
        );
        wait_for("198.18.0.6 added", || {
            seen(&watch).iter().any(|(a, _)| a == "198.18.0.6:5301")
        });
        let kept_after_rotation = seen(&watch);
        assert_eq!(kept_after_rotation.len(), kept.len() + 1);

        // 401 (a token the server does not take): named, the last list kept.
        api.world().token = "token-3".into();
        api.break_watches();
        wait_for("the token named", || {
            watch.failing().iter().any(|c| {
                c.contains("401 Unauthorized") && c.contains(&token_file.display().to_string())
            })
        });
        assert_eq!(seen(&watch), kept_after_rotation);
        // What sonde_mesh_peer_source_{up,peers}{peer_source="kubernetes"} say meanwhile: down,
        // with the peers of the last list still given.
        let view = watch.view();
        assert!(!view.up, "a failing watch reads as up");
        assert_eq!(view.peers.len(), kept_after_rotation.len());
        api.world().token = "token-2".into();
        wait_for("recovered from 401", || watch.failing().is_empty());
        assert!(watch.view().up, "recovered watches read as down");

        // 403 on the EndpointSlices (a Role missing): the verb and resource named, list kept.
        wait_for("watching again", || api.watching("endpointslices"));
        api.world().forbid = Some("endpointslices");
        api.break_watches();
        wait_for("the RBAC rule named", || {
            watch.failing().iter().any(|c| {
                c.contains("403 Forbidden")
                    && c.contains("does not allow list on endpointslices (group discovery.k8s.io) in namespace sonde")
            })
        });
        assert_eq!(seen(&watch), kept_after_rotation);
        api.world().forbid = None;
        wait_for("recovered from 403", || watch.failing().is_empty());

        // A CA that did not sign the server's certificate: the CA file named, list kept.
        wait_for("watching again", || {
            api.watching("nodes") && api.watching("endpointslices")
        });
        std::fs::write(&ca_file, pki().ca_pem).unwrap();
        api.break_watches();
        wait_for("the CA named", || {
            watch.failing().iter().any(|c| {
                c.starts_with("TLS with the API server")
                    && c.contains(&ca_file.display().to_string())
            })
        });
        assert_eq!(seen(&watch), kept_after_rotation);
        std::fs::write(&ca_file, &good_ca).unwrap();
        wait_for("recovered from the CA", || watch.failing().is_empty());

        stop.store(true, Ordering::Relaxed);
        api.break_watches();
    }

    /// `sonde server --mesh FILE --check` with `[peers] kubernetes`: the source described, and
    /// one list of it (no watch) counted and selected from, as this agent (198.18.0.1) sees it.
    #[test]
    fn check_describes_the_source_and_lists_it_once() {
        let dir = tempfile::tempdir().unwrap();
        let (api, cfg) = served(
            dir.path(),
            World {
                token: "t".into(),
                nodes: two_racks(),
                slices: vec![slice_json(
                    "sonde-abcde",
                    "IPv4",
                    &[
                        ("198.18.0.1", "node-1", Some(true)),
                        ("198.18.0.2", "node-2", Some(true)),
                        ("198.18.0.3", "node-3", Some(true)),
                        ("198.18.0.4", "node-3", Some(false)),
                    ],
                )],
                ..World::default()
            },
        );
        let (token_file, ca_file) = (&cfg.token_file, &cfg.ca_file);
        let text = format!(
            "name = \"198.18.0.1\"\n\
             [peers]\n\
             kubernetes = {{ service = \"sonde\", namespace = \"sonde\", labels = {{ zone = \"topology.kubernetes.io/zone\", rack = \"example.com/rack\" }}, \
             api_server = \"https://127.0.0.1:{}\", token_file = \"{}\", ca_file = \"{}\" }}\n\
             [select]\ngroup = \"rack\"\n",
            api.port,
            token_file.display(),
            ca_file.display()
        );
        let mesh = super::super::MeshConfig::parse(&text).unwrap();
        let described = mesh.describe();
        let want = format!(
            "peers (re-read every 30s):\n  kubernetes: the ready endpoints of Service sonde in \
             sonde, the slices' port named sonde-tcp (else 5300); labels from each endpoint's \
             node: rack=example.com/rack zone=topology.kubernetes.io/zone; from the API server \
             at https://127.0.0.1:{} (token {}, CA {}), listed then watched\n",
            api.port,
            token_file.display(),
            ca_file.display()
        );
        assert!(described.contains(&want), "{want}\nnot in\n{described}");
        let peers = super::super::describe_peers(&mesh);
        assert_eq!(
            peers,
            "kubernetes now: 3 ready endpoints\n\
             peer list now: 2 peers, of which [select] probes 1; 1 agents probe this one\n"
        );
        // Listed, never watched.
        assert!(!api.watching("nodes") && !api.watching("endpointslices"));
    }

    /// The mesh itself (its supervisor and prober, in-process) with `[peers] kubernetes`: two
    /// agents on 127.0.0.1 and 127.0.0.2 answer probes; the API gives both (this agent among
    /// them, by its port on a local address), and the mesh probes the other on the wire, exports
    /// its node's labels and its own, and follows a label change and the peer's slice going.
    #[test]
    fn the_mesh_probes_the_peers_the_api_gives_with_their_node_labels() {
        let good = pki();
        let dir = tempfile::tempdir().unwrap();
        let (token_file, ca_file) = (dir.path().join("token"), dir.path().join("ca.crt"));
        std::fs::write(&token_file, "t\n").unwrap();
        std::fs::write(&ca_file, &good.ca_pem).unwrap();
        let secret =
            sonde_wire::auth::Secret::from_text(b"kube mesh test secret".to_vec()).unwrap();
        let agent = |ip: &str| {
            let mut c = sonde_agent::AgentConfig::new(SocketAddr::new(ip.parse().unwrap(), 0));
            c.secret = Some(secret.clone());
            sonde_agent::Agent::bind(c).unwrap().spawn()
        };
        let (a, b) = (agent("127.0.0.1"), agent("127.0.0.2"));
        let (pa, pb) = (a.local_addr().port(), b.local_addr().port());
        let api = FakeApi::start(
            Arc::clone(&good.server),
            World {
                token: "t".into(),
                nodes: vec![node("node-1", "z1", "r1"), node("node-2", "z2", "r2")],
                slices: vec![
                    slice_json_at(
                        "sonde-a",
                        "IPv4",
                        &[("127.0.0.1", "node-1", Some(true))],
                        pa,
                    ),
                    slice_json_at(
                        "sonde-b",
                        "IPv4",
                        &[("127.0.0.2", "node-2", Some(true))],
                        pb,
                    ),
                ],
                ..World::default()
            },
        );
        let text = format!(
            "name = \"127.0.0.1\"\n\
             [peers]\n\
             kubernetes = {{ service = \"sonde\", namespace = \"sonde\", labels = {{ zone = \"topology.kubernetes.io/zone\", rack = \"example.com/rack\" }}, \
             api_server = \"https://127.0.0.1:{}\", token_file = \"{}\", ca_file = \"{}\" }}\n\
             refresh = \"100ms\"\n\
             [latency]\ninterval = \"100ms\"\n",
            api.port,
            token_file.display(),
            ca_file.display()
        );
        let mut cfg = super::super::MeshConfig::parse(&text).unwrap();
        cfg.own_port = pa;
        let metrics = Arc::new(super::super::metrics::Metrics::new());
        let stop = Arc::new(AtomicBool::new(false));
        let mesh = super::super::spawn(
            cfg,
            Some(secret.clone()),
            Arc::clone(&metrics),
            sonde_agent::LinkTests::new(),
            Arc::clone(&stop),
        )
        .unwrap();
        let has_line = |line: &str| metrics.encode(None).lines().any(|l| l == line);
        wait_for("127.0.0.2 probed and up", || {
            has_line("sonde_peer_up{source=\"127.0.0.1\",target=\"127.0.0.2\"} 1")
        });
        for line in [
            "sonde_mesh_peer_labels{source=\"127.0.0.1\",target=\"127.0.0.2\",label=\"zone\",value=\"z2\"} 1",
            // Its own labels, from its own node's entry.
            "sonde_mesh_labels{source=\"127.0.0.1\",label=\"zone\",value=\"z1\"} 1",
            "sonde_mesh_probed_peers 1",
        ] {
            assert!(has_line(line), "{line} not in\n{}", metrics.encode(None));
        }
        // The probes reached the peer's agent (answered there, not only sent).
        assert!(b.stats().probes_answered.load(Ordering::Relaxed) > 0);
        wait_for("both watches", || {
            api.watching("nodes") && api.watching("endpointslices")
        });
        api.event("nodes", "MODIFIED", node("node-2", "z3", "r2"));
        wait_for("node-2's new zone exported", || {
            has_line("sonde_mesh_peer_labels{source=\"127.0.0.1\",target=\"127.0.0.2\",label=\"zone\",value=\"z3\"} 1")
        });
        api.event(
            "endpointslices",
            "DELETED",
            slice_json("sonde-b", "IPv4", &[]),
        );
        wait_for("127.0.0.2 gone with its series", || {
            !metrics.encode(None).contains("target=\"127.0.0.2\"")
        });
        stop.store(true, Ordering::Relaxed);
        mesh.join().unwrap();
        api.break_watches();
        a.stop();
        b.stop();
    }

    // -----------------------------------------------------------------------------------------
    // The publisher
    // -----------------------------------------------------------------------------------------

    /// A fake API server with three nodes (two racks) and a slice of four endpoints, one not
    /// ready, listed out of address order; and the publisher's settings against it.
    fn publisher_world(dir: &std::path::Path) -> (FakeApi, Publish) {
        let (api, source) = served(
            dir,
            World {
                token: "t".into(),
                rv: 10,
                nodes: two_racks(),
                slices: vec![slice_json(
                    "sonde-abcde",
                    "IPv4",
                    &[
                        ("198.18.0.3", "node-3", Some(true)),
                        ("198.18.0.10", "node-2", Some(true)),
                        ("198.18.0.1", "node-1", Some(true)),
                        ("198.18.0.4", "node-3", Some(false)),
                    ],
                )],
                ..World::default()
            },
        );
        let publish = Publish {
            source,
            target: Target {
                configmap: "sonde-peers".into(),
                key: "peers.txt".into(),
            },
            min_interval: Duration::from_millis(100),
            resync: Duration::from_secs(3_600),
        };
        (api, publish)
    }

    fn configmap_text(api: &FakeApi) -> String {
        api.world().configmaps["sonde-peers"]["data"]["peers.txt"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// `--once`: the ConfigMap created with the sorted, labelled list of the ready endpoints;
    /// again with nothing changed: no write; a 403 names the verb and the resource.
    #[test]
    fn publish_once_writes_the_sorted_labelled_list_and_nothing_when_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let (api, publish) = publisher_world(dir.path());
        let want = "198.18.0.1:5301 rack=r1 zone=z1\n\
                    198.18.0.3:5301 rack=r3 zone=z2\n\
                    198.18.0.10:5301 rack=r1 zone=z1\n";
        assert_eq!(publish_once(&publish), Ok((3, Written::Created)));
        {
            let w = api.world();
            let writes = w.writes();
            assert_eq!(writes.len(), 1, "{writes:?}");
            assert_eq!(writes[0].0, "POST");
            assert_eq!(writes[0].1["metadata"]["name"], "sonde-peers");
            assert_eq!(writes[0].1["data"]["peers.txt"], want);
        }
        assert_eq!(configmap_text(&api), want);
        // Nothing changed: one get, no write.
        assert_eq!(publish_once(&publish), Ok((3, Written::Unchanged)));
        assert_eq!(api.world().writes().len(), 1);
        // An existing ConfigMap with another key and its metadata: replaced with both kept.
        {
            let mut w = api.world();
            let cm = w.configmaps.get_mut("sonde-peers").unwrap();
            cm["data"]["other"] = json!("kept");
            cm["metadata"]["resourceVersion"] = json!("77");
            w.nodes[2] = node("node-3", "z2", "r4");
        }
        assert_eq!(publish_once(&publish), Ok((3, Written::Updated)));
        {
            let w = api.world();
            let (method, sent) = w.writes().pop().unwrap();
            assert_eq!(method, "PUT");
            assert_eq!(sent["metadata"]["resourceVersion"], "77");
            assert_eq!(sent["data"]["other"], "kept");
        }
        assert!(configmap_text(&api).contains("198.18.0.3:5301 rack=r4 zone=z2\n"));
        // 403 on update (a Role without it): the verb and the resource named.
        api.world().forbid_configmap = Some("update");
        api.world().nodes[2] = node("node-3", "z2", "r5");
        let cause = publish_once(&publish).unwrap_err().to_string();
        assert!(
            cause.contains("403 Forbidden")
                && cause.contains("does not allow update on configmaps in namespace sonde")
                && cause.contains("cannot update resource"),
            "{cause}"
        );
        // ... and on get.
        api.world().forbid_configmap = Some("get");
        let cause = publish_once(&publish).unwrap_err().to_string();
        assert!(
            cause.contains("does not allow get on configmaps in namespace sonde"),
            "{cause}"
        );
        // Create, where the ConfigMap is missing and create is not granted.
        {
            let mut w = api.world();
            w.forbid_configmap = Some("create");
            w.configmaps.clear();
        }
        let cause = publish_once(&publish).unwrap_err().to_string();
        assert!(
            cause.contains("does not allow create on configmaps in namespace sonde"),
            "{cause}"
        );
    }

    /// Watching: the first write, then one write per change of the text (a label change, an
    /// endpoint added), none for an event that changes nothing the list says (a node's status
    /// update), and the end within a moment of `stop`.
    #[test]
    fn publish_watching_writes_once_per_change_of_the_text() {
        let dir = tempfile::tempdir().unwrap();
        let (api, publish) = publisher_world(dir.path());
        let stop = Arc::new(AtomicBool::new(false));
        let runner = {
            let (publish, stop) = (publish.clone(), Arc::clone(&stop));
            thread::spawn(move || publish_watching(&publish, &stop))
        };
        let writes = || api.world().writes().len();
        wait_for("the first write", || writes() == 1);
        wait_for("both watches", || {
            api.watching("nodes") && api.watching("endpointslices")
        });
        // Settled: no second write of the same text (several intervals).
        thread::sleep(Duration::from_millis(500));
        assert_eq!(writes(), 1);
        // A node's status update: a MODIFIED event, the same labels: nothing written.
        api.event("nodes", "MODIFIED", node("node-1", "z1", "r1"));
        thread::sleep(Duration::from_millis(500));
        assert_eq!(writes(), 1);
        // A label change: exactly one write, with the new text.
        api.event("nodes", "MODIFIED", node("node-2", "z2", "r2"));
        wait_for("the label change written", || writes() == 2);
        thread::sleep(Duration::from_millis(500));
        assert_eq!(writes(), 2);
        assert_eq!(
            configmap_text(&api),
            "198.18.0.1:5301 rack=r1 zone=z1\n\
             198.18.0.3:5301 rack=r3 zone=z2\n\
             198.18.0.10:5301 rack=r2 zone=z2\n"
        );
        // An endpoint becomes ready: one write.
        api.event(
            "endpointslices",
            "MODIFIED",
            slice_json(
                "sonde-abcde",
                "IPv4",
                &[
                    ("198.18.0.3", "node-3", Some(true)),
                    ("198.18.0.10", "node-2", Some(true)),
                    ("198.18.0.1", "node-1", Some(true)),
                    ("198.18.0.4", "node-3", Some(true)),
                ],
            ),
        );
        wait_for("the endpoint written", || writes() == 3);
        thread::sleep(Duration::from_millis(500));
        assert_eq!(writes(), 3);
        assert!(configmap_text(&api).contains("198.18.0.4:5301 rack=r3 zone=z2\n"));
        // SIGTERM's flag: it returns (the watch threads end with the process).
        stop.store(true, Ordering::Relaxed);
        let ended = Instant::now();
        runner.join().unwrap().unwrap();
        assert!(ended.elapsed() < Duration::from_secs(10));
        api.break_watches();
    }

    /// A ConfigMap whose list someone else changed (a hand edit) is written back at the next
    /// resync, and only then; between resyncs an unchanged list costs one get per period.
    #[test]
    fn a_configmap_changed_by_someone_else_is_restored_at_the_next_resync() {
        let dir = tempfile::tempdir().unwrap();
        let (api, mut publish) = publisher_world(dir.path());
        publish.resync = Duration::from_millis(400);
        let stop = Arc::new(AtomicBool::new(false));
        let runner = {
            let (publish, stop) = (publish.clone(), Arc::clone(&stop));
            thread::spawn(move || publish_watching(&publish, &stop))
        };
        let writes = || api.world().writes().len();
        let gets = || {
            api.world()
                .configmap_requests
                .iter()
                .filter(|(m, _)| m == "GET")
                .count()
        };
        wait_for("the first write", || writes() == 1);
        let published = configmap_text(&api);
        // Unchanged: resyncs read it, a get each (no more than one a period), and write nothing.
        let (before, since) = (gets(), Instant::now());
        wait_for("a resync's read", || gets() >= before + 2);
        let (read, periods) = (gets() - before, since.elapsed().as_secs_f64() / 0.4);
        assert!(
            read as f64 <= periods + 1.0,
            "{read} gets in {periods:.1} resync periods"
        );
        assert_eq!(writes(), 1);
        // A hand edit: restored at the next resync, once.
        api.world().configmaps.get_mut("sonde-peers").unwrap()["data"]["peers.txt"] =
            json!("198.18.0.99 rack=edited\n");
        wait_for("the list restored", || configmap_text(&api) == published);
        assert_eq!(writes(), 2);
        thread::sleep(Duration::from_millis(900));
        assert_eq!(writes(), 2);
        stop.store(true, Ordering::Relaxed);
        runner.join().unwrap().unwrap();
        api.break_watches();
    }

    /// A list that does not fit in a ConfigMap is refused with the numbers; 15,000 peers with
    /// zone and rack labels fit.
    #[test]
    fn a_peer_list_over_a_configmap_is_refused() {
        let labels = |z: usize, r: usize| -> Labels {
            [
                (
                    "zone".to_owned(),
                    format!("eu-west-1{}", ["a", "b", "c"][z % 3]),
                ),
                ("rack".to_owned(), format!("rack-{r:04}")),
            ]
            .into_iter()
            .collect()
        };
        let fleet = |n: usize| -> Vec<KubePeer> {
            (0..n)
                .map(|i| KubePeer {
                    addr: SocketAddr::new(
                        IpAddr::from([10, 200 + (i >> 16) as u8, (i >> 8) as u8, i as u8]),
                        5300,
                    ),
                    labels: labels(i, i / 40),
                })
                .collect()
        };
        let fits = checked_peer_text(&fleet(15_000)).unwrap();
        assert!(fits.len() <= PEER_TEXT_LIMIT, "{}", fits.len());
        let cause = checked_peer_text(&fleet(25_000)).unwrap_err();
        assert!(matches!(cause, Cause::TooLarge { peers: 25_000, .. }));
        let text = cause.to_string();
        assert!(
            text.contains("the peer list of 25000 peers is")
                && text.contains("over the 1032192 a ConfigMap can hold"),
            "{text}"
        );
    }

    /// End to end: the publisher's text, delivered as the kubelet delivers a mounted ConfigMap
    /// (the key a symlink to `..data/KEY`, `..data` a symlink swapped atomically to a new
    /// directory), read by an agent's `[peers] file`: its peers, their labels and its own, and
    /// the new list after a swap.
    #[cfg(unix)]
    #[test]
    fn an_agent_reads_the_published_list_from_a_kubelet_style_mount() {
        let dir = tempfile::tempdir().unwrap();
        let (api, publish) = publisher_world(dir.path());
        publish_once(&publish).unwrap();
        let mount = dir.path().join("mount");
        std::fs::create_dir(&mount).unwrap();
        // One fixed time (200 s ago) for the symlinks at every delivery, as a kubelet's swap
        // leaves the key's own symlink as it was: a reader that looked at the symlink, not
        // the file it leads to, would miss the swap (checked: this test fails with one).
        let links_at = format!(
            "@{}",
            (std::time::SystemTime::now() - Duration::from_secs(200))
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs()
        );
        // The kubelet's atomic writer: a timestamped directory, `..data` pointing at it (made
        // aside, then renamed over), and the key a symlink through `..data`.
        let deliver = |version: u32, text: &str, age: Duration| {
            let ts = mount.join(format!("..2026_11_28_13_00_0{version}.123456789"));
            std::fs::create_dir(&ts).unwrap();
            let file = ts.join("peers.txt");
            std::fs::write(&file, text).unwrap();
            // Timestamps well in the past: the reader must see the swap by the file, not
            // because it was just written.
            std::fs::File::options()
                .write(true)
                .open(&file)
                .unwrap()
                .set_modified(std::time::SystemTime::now() - age)
                .unwrap();
            let tmp = mount.join("..data_tmp");
            std::os::unix::fs::symlink(ts.file_name().unwrap(), &tmp).unwrap();
            std::fs::rename(&tmp, mount.join("..data")).unwrap();
            let key = mount.join("peers.txt");
            if key.symlink_metadata().is_err() {
                std::os::unix::fs::symlink("..data/peers.txt", &key).unwrap();
            }
            // The symlinks' own times in the past too (`touch -h`), so that only the file they
            // lead to can tell the reader that something changed.
            let touched = std::process::Command::new("touch")
                .args(["-h", "-d", &links_at])
                .arg(&key)
                .arg(mount.join("..data"))
                .status()
                .unwrap();
            assert!(touched.success());
        };
        deliver(1, &configmap_text(&api), Duration::from_secs(100));
        let mesh = super::super::MeshConfig::parse(&format!(
            "name = \"198.18.0.1\"\n[peers]\nfile = \"{}\"\n[select]\ngroup = \"rack\"\n",
            mount.join("peers.txt").display()
        ))
        .unwrap();
        let mut last_file = None;
        let mut list = || {
            let l = super::super::current_peer_list(
                &mesh,
                &mut last_file,
                &mut Vec::new(),
                &mut None,
                &super::super::system_resolver,
                None,
            );
            (
                l.peers.into_iter().map(|p| p.label).collect::<Vec<_>>(),
                l.listed,
                l.own_labels.into_iter().collect::<Vec<_>>(),
            )
        };
        let own = vec![
            ("rack".to_owned(), "r1".to_owned()),
            ("zone".to_owned(), "z1".to_owned()),
        ];
        // This agent (198.18.0.1, rack r1) probes its rack: 198.18.0.10.
        assert_eq!(
            list(),
            (vec!["198.18.0.10:5301".to_owned()], 2, own.clone())
        );
        // The publisher writes a change (node-3 joins rack r1); the kubelet swaps `..data`.
        api.world().nodes[2] = node("node-3", "z2", "r1");
        assert_eq!(publish_once(&publish).unwrap().1, Written::Updated);
        deliver(2, &configmap_text(&api), Duration::from_secs(50));
        assert_eq!(
            list(),
            (
                vec!["198.18.0.3:5301".to_owned(), "198.18.0.10:5301".to_owned()],
                2,
                own
            )
        );
    }

    /// At the default port the published line is the bare address (IPv6 too, unbracketed),
    /// so a listed peer's `target` is the same name as its agent's own `source` (its pod IP)
    /// and as DNS peers get; another port is written. An agent named by an IPv6 address finds
    /// its own line (its labels) in the list.
    #[test]
    fn published_peers_at_the_default_port_are_named_by_address_alone() {
        let peer = |addr: &str, rack: &str| KubePeer {
            addr: addr.parse().unwrap(),
            labels: [("rack".to_owned(), rack.to_owned())].into_iter().collect(),
        };
        let text = peer_text(&[
            peer("[fd00:10:244::5]:5300", "r1"),
            peer("198.18.0.3:7000", "r1"),
            peer("198.18.0.2:5300", "r1"),
            peer("198.18.0.4:5300", "r2"),
        ]);
        assert_eq!(
            text,
            "198.18.0.2 rack=r1\n198.18.0.3:7000 rack=r1\n198.18.0.4 rack=r2\n\
             fd00:10:244::5 rack=r1\n"
        );
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("peers.txt");
        std::fs::write(&file, &text).unwrap();
        let mesh = super::super::MeshConfig::parse(&format!(
            "name = \"fd00:10:244::5\"\n[peers]\nfile = \"{}\"\n[select]\ngroup = \"rack\"\n",
            file.display()
        ))
        .unwrap();
        let l = super::super::current_peer_list(
            &mesh,
            &mut None,
            &mut Vec::new(),
            &mut None,
            &super::super::system_resolver,
            None,
        );
        let targets: Vec<String> = l.peers.into_iter().map(|p| p.label).collect();
        assert_eq!(targets, ["198.18.0.2", "198.18.0.3:7000"]);
        assert_eq!(
            l.own_labels.into_iter().collect::<Vec<_>>(),
            [("rack".to_owned(), "r1".to_owned())]
        );
    }

    /// An API server that cannot be reached is named by its address; one that is not HTTPS
    /// is refused in the mesh file.
    #[test]
    fn an_unreachable_api_server_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = peers_cfg(&[]);
        cfg.token_file = dir.path().join("token");
        cfg.ca_file = dir.path().join("ca.crt");
        std::fs::write(&cfg.token_file, "t").unwrap();
        std::fs::write(&cfg.ca_file, pki().ca_pem).unwrap();
        // A port nothing listens on (bound, then closed).
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        cfg.api_server = Some(format!("https://127.0.0.1:{port}"));
        let cause = list_once(&cfg).unwrap_err();
        assert!(
            matches!(&cause, Cause::Connect { url, .. } if url.ends_with(&port.to_string())),
            "{cause}"
        );
        std::fs::remove_file(&cfg.ca_file).unwrap();
        let cause = list_once(&cfg).unwrap_err().to_string();
        assert!(
            cause.contains("cannot read it") && cause.contains("ca.crt"),
            "{cause}"
        );
        for (bad, want) in [
            ("api_server = \"http://127.0.0.1:1\"", "must be https://"),
            (
                "labels = { zone = \"topology.kubernetes.io/zone zone\" }",
                "not a node label key",
            ),
            ("labels = { \"9zone\" = \"zone\" }", "not a label name"),
            ("namespace = \"Sonde\"", "not a namespace name"),
            ("port = 0", "port must be from 1"),
            ("bogus = 1", "unknown field"),
        ] {
            let text = format!("[peers]\nkubernetes = {{ service = \"sonde\", {bad} }}\n");
            let msg = format!("{:#}", super::super::MeshConfig::parse(&text).unwrap_err());
            assert!(msg.contains(want), "{bad}: {msg}");
        }
        cfg.api_server = None;
        if std::env::var_os("KUBERNETES_SERVICE_HOST").is_none() {
            let cause = list_once(&cfg).unwrap_err().to_string();
            assert!(cause.contains("KUBERNETES_SERVICE_HOST"), "{cause}");
        }
    }
}
