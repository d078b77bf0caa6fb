//! The mesh file (`sonde server --mesh FILE`, docs/mesh.md): parsed once into a typed
//! [`MeshConfig`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use serde::Deserialize;
use sonde_engine::mesh_select::{Labels, Policy};
use sonde_engine::schedule::{Check, CheckPlan, SchedulerConfig};
use sonde_wire::Protocol;

use crate::spec::{self, KeyValue, TestKind, PROTOCOL_KEY, TARGET_KEY};
use crate::{pps, throughput};

/// Default port of DNS peers (and of listed peers without one).
pub(crate) const DEFAULT_PORT: u16 = sonde_client::DEFAULT_PORT;

/// Names this agent (its `source` label) over the mesh file's `name`: one file serves every
/// agent, and in Kubernetes the downward API sets it per pod (`status.podIP`, so that `source`
/// and the `target` of DNS peers, which are addresses, name a node alike).
pub(crate) const NAME_ENV: &str = "SONDE_MESH_NAME";

/// This agent's labels (`zone=a,rack=r7`), over the mesh file's `labels` key by key: in
/// Kubernetes, set from the node's labels by whatever writes the pod's environment.
pub(crate) const LABELS_ENV: &str = "SONDE_MESH_LABELS";

/// A listed peer: `HOST[:PORT]` as written, and the labels written beside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Listed {
    pub(crate) spec: String,
    pub(crate) labels: Labels,
}

/// A label's name: what `[select]` and `name_labels` can refer to.
fn label_name_ok(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
}

/// `KEY=VALUE` items, split by `sep` (whitespace for a peer line, `,` for [`LABELS_ENV`]).
fn label_items<'a>(items: impl Iterator<Item = &'a str>) -> anyhow::Result<Labels> {
    let mut labels = Labels::new();
    for item in items.map(str::trim).filter(|i| !i.is_empty()) {
        let (k, v) = item
            .split_once('=')
            .filter(|(k, v)| label_name_ok(k) && !v.is_empty())
            .with_context(|| format!("{item:?} is not a label KEY=VALUE (e.g. zone=a)"))?;
        labels.insert(k.to_owned(), v.to_owned());
    }
    Ok(labels)
}

/// A peer line, of the peer file or of `hosts`: `HOST[:PORT]`, then any labels
/// (`198.18.0.2:5300 zone=a rack=r7`).
pub(crate) fn parse_listed(line: &str) -> anyhow::Result<Listed> {
    let mut words = line.split_whitespace();
    let spec = words.next().context("an empty peer line")?.to_owned();
    let labels = label_items(words).with_context(|| format!("peer {spec}"))?;
    Ok(Listed { spec, labels })
}

/// `SONDE_MESH_LABELS`' form: `zone=a,rack=r7`.
pub(crate) fn parse_label_list(text: &str) -> anyhow::Result<Labels> {
    label_items(text.split(','))
}

/// The mesh file, as typed settings.
#[derive(Debug, Clone)]
pub(crate) struct MeshConfig {
    /// This agent's `source` label.
    pub(crate) name: String,
    pub(crate) hosts: Vec<Listed>,
    pub(crate) file: Option<PathBuf>,
    /// Labels from a peer's name: a regex whose named groups are labels, over the host part.
    pub(crate) name_labels: Option<regex::Regex>,
    /// This agent's own labels (the file's `labels`, then [`LABELS_ENV`]): for itself where
    /// the peer list does not label it.
    pub(crate) labels: Labels,
    /// `[select]`: which of the listed peers this agent probes (None: every one).
    pub(crate) select: Option<Policy>,
    pub(crate) dns: Option<String>,
    pub(crate) dns_port: u16,
    /// `[peers] kubernetes`: the ready endpoints of a Service, labelled from their nodes.
    pub(crate) kubernetes: Option<KubePeers>,
    pub(crate) refresh: Duration,
    pub(crate) protocols: Vec<Protocol>,
    /// Time between two probes of one peer over one protocol (± a tenth, at random).
    pub(crate) interval: Duration,
    /// A probe not answered within this is lost.
    pub(crate) timeout: Duration,
    /// UDP source ports (sockets) the probes rotate over.
    pub(crate) source_ports: u16,
    /// Bytes of each probe (and its reply).
    pub(crate) msg_size: u32,
    /// `latency.session` was given: probes are no sessions any more, so it is ignored.
    pub(crate) session_ignored: bool,
    pub(crate) throughput: Option<ThroughputCheck>,
    pub(crate) pps: Option<PpsCheck>,
    pub(crate) max_link_share: f64,
    /// The port this agent serves on (set by `sonde server`): a peer at this port on one of
    /// this host's addresses is this agent.
    pub(crate) own_port: u16,
}

/// `[peers] kubernetes`: where the API server and the Service are, and which node labels the
/// peers take (mesh/kube.rs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KubePeers {
    pub(crate) service: String,
    /// None: this pod's own namespace ([`super::kube::NAMESPACE_FILE`]).
    pub(crate) namespace: Option<String>,
    /// None: each EndpointSlice's port named `sonde-tcp`, else [`DEFAULT_PORT`].
    pub(crate) port: Option<u16>,
    /// A sonde label name -> the node label key it is read from.
    pub(crate) labels: BTreeMap<String, String>,
    /// `https://HOST:PORT`; None: from `KUBERNETES_SERVICE_HOST` and `KUBERNETES_SERVICE_PORT`.
    pub(crate) api_server: Option<String>,
    pub(crate) token_file: PathBuf,
    pub(crate) ca_file: PathBuf,
}

#[derive(Debug, Clone)]
pub(crate) struct ThroughputCheck {
    pub(crate) plan: CheckPlan,
    pub(crate) options: sonde_client::ThroughputOptions,
    /// Where this agent's sockets of the test come from (`-B`, `--bind-dev`, `--cport`).
    pub(crate) source: sonde_client::Source,
    /// The equivalent command line (`sonde throughput PEER ...`).
    pub(crate) command: String,
}

#[derive(Debug, Clone)]
pub(crate) struct PpsCheck {
    pub(crate) plan: CheckPlan,
    pub(crate) options: sonde_client::PpsOptions,
    /// Where this agent's sockets of the test come from (`-B`, `--bind-dev`, `--cport`).
    pub(crate) source: sonde_client::Source,
    /// The equivalent command line (`sonde pps PEER ...`).
    pub(crate) command: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    name: Option<String>,
    #[serde(default)]
    peers: Peers,
    #[serde(default)]
    latency: Latency,
    /// The test's plan keys, less [`NOT_IN_MESH`], plus `every`, `jitter` and `time`.
    throughput: Option<toml::Table>,
    pps: Option<toml::Table>,
    max_link_share: Option<f64>,
    labels: Option<BTreeMap<String, String>>,
    select: Option<Select>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Select {
    group: Option<String>,
    neighbours: Option<usize>,
    across: Option<String>,
    representatives: Option<usize>,
}

/// A `hosts` item: a peer line (`"HOST[:PORT] zone=a"`), or a table with `host` and labels.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum HostItem {
    Line(String),
    Table(BTreeMap<String, String>),
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Peers {
    #[serde(default)]
    hosts: Vec<HostItem>,
    file: Option<PathBuf>,
    name_labels: Option<String>,
    dns: Option<String>,
    dns_port: Option<u16>,
    kubernetes: Option<KubeTable>,
    refresh: Option<Value>,
}

/// `[peers] kubernetes = { service = "sonde", labels = { zone = "topology.kubernetes.io/zone" } }`.
/// (Also what `sonde mesh publish` builds from its flags.)
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct KubeTable {
    pub(crate) service: String,
    pub(crate) namespace: Option<String>,
    pub(crate) port: Option<u16>,
    #[serde(default)]
    pub(crate) labels: BTreeMap<String, String>,
    pub(crate) api_server: Option<String>,
    pub(crate) token_file: Option<PathBuf>,
    pub(crate) ca_file: Option<PathBuf>,
}

/// A Kubernetes object name as the API takes it in a path or selector (RFC 1123 label).
pub(crate) fn kube_name_ok(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

/// A node label key: `[PREFIX/]NAME`, PREFIX a DNS subdomain, NAME up to 63 characters of
/// `[A-Za-z0-9._-]` (Kubernetes' "Labels and Selectors").
fn node_label_key_ok(key: &str) -> bool {
    let (prefix, name) = key
        .rsplit_once('/')
        .map_or((None, key), |(p, n)| (Some(p), n));
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '-'))
    });
    name_ok && prefix_ok
}

/// The table checked and its defaults filled in; its keys named as the mesh file names them.
pub(crate) fn kube_peers(t: &KubeTable) -> anyhow::Result<KubePeers> {
    kube_peers_named(t, &|key| format!("peers.kubernetes.{key}"))
}

/// [`kube_peers`], with `named` naming each key in the errors (`labels.zone` for one label):
/// as the mesh file does, or as `sonde mesh publish`'s flags do.
pub(crate) fn kube_peers_named(
    t: &KubeTable,
    named: &dyn Fn(&str) -> String,
) -> anyhow::Result<KubePeers> {
    anyhow::ensure!(
        kube_name_ok(&t.service),
        "{} = {:?} is not a Service name (lower-case letters, digits and -)",
        named("service"),
        t.service
    );
    if let Some(ns) = &t.namespace {
        anyhow::ensure!(
            kube_name_ok(ns),
            "{} = {ns:?} is not a namespace name",
            named("namespace")
        );
    }
    anyhow::ensure!(
        t.port != Some(0),
        "{} must be from 1 to 65535",
        named("port")
    );
    for (name, key) in &t.labels {
        anyhow::ensure!(
            label_name_ok(name),
            "{}: {name:?} is not a label name",
            named("labels")
        );
        anyhow::ensure!(
            node_label_key_ok(key),
            "{} = {key:?} is not a node label key (e.g. \"topology.kubernetes.io/zone\")",
            named(&format!("labels.{name}"))
        );
    }
    if let Some(url) = &t.api_server {
        anyhow::ensure!(
            url.strip_prefix("https://")
                .is_some_and(|rest| !rest.is_empty()),
            "{} = {url:?} must be https://HOST[:PORT] (the service account token is never sent \
             in clear)",
            named("api_server")
        );
    }
    let dir = Path::new(super::kube::SERVICE_ACCOUNT_DIR);
    Ok(KubePeers {
        service: t.service.clone(),
        namespace: t.namespace.clone(),
        port: t.port,
        labels: t.labels.clone(),
        api_server: t
            .api_server
            .as_ref()
            .map(|u| u.trim_end_matches('/').to_owned()),
        token_file: t.token_file.clone().unwrap_or_else(|| dir.join("token")),
        ca_file: t.ca_file.clone().unwrap_or_else(|| dir.join("ca.crt")),
    })
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Latency {
    protocols: Option<Vec<String>>,
    interval: Option<Value>,
    /// The former spelling of `interval`: probes per second (interval = 1 / rate).
    rate: Option<f64>,
    timeout: Option<Value>,
    source_ports: Option<u16>,
    msg_size: Option<Value>,
    /// Before probes were stateless, the length of a probe session; accepted and ignored.
    session: Option<Value>,
}

/// A number or a string with a unit, as the subcommands' flags take it.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum Value {
    Int(i64),
    Float(f64),
    Text(String),
}

impl Value {
    fn text(&self) -> String {
        match self {
            Self::Int(n) => n.to_string(),
            Self::Float(f) => f.to_string(),
            Self::Text(s) => s.clone(),
        }
    }
}

/// `"500ms"`, `"2s"`, `"10m"`, `"1h"`, or plain seconds.
fn duration(v: &Value, what: &str) -> anyhow::Result<Duration> {
    let text = v.text();
    let t = text.trim();
    let (n, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = t.strip_suffix('h') {
        (n, 3_600.0)
    } else {
        (t, 1.0)
    };
    let secs: f64 = n
        .trim()
        .parse()
        .ok()
        .filter(|s: &f64| s.is_finite() && *s >= 0.0 && *s <= 86_400.0 * 7.0)
        .with_context(|| {
            format!("{what} = {text:?}: not a duration (e.g. \"500ms\", \"2s\", \"10m\")")
        })?;
    Ok(Duration::from_secs_f64(secs * scale))
}

fn opt_duration(v: Option<&Value>, what: &str, default: Duration) -> anyhow::Result<Duration> {
    v.map_or(Ok(default), |v| duration(v, what))
}

fn size(v: Option<&Value>, what: &str, default: u32) -> anyhow::Result<u32> {
    v.map_or(Ok(default), |v| {
        crate::units::size(&v.text()).map_err(|e| anyhow::anyhow!("{what}: {e}"))
    })
}

fn plan(
    every: Option<&Value>,
    jitter: Option<&Value>,
    time: Option<&Value>,
    table: &str,
) -> anyhow::Result<CheckPlan> {
    let every = opt_duration(every, &format!("{table}.every"), Duration::from_secs(600))?;
    let jitter = opt_duration(jitter, &format!("{table}.jitter"), every / 10)?;
    let duration = opt_duration(time, &format!("{table}.time"), Duration::from_secs(2))?;
    anyhow::ensure!(
        duration > Duration::ZERO && duration < every,
        "{table}.time must be above 0 and below {table}.every"
    );
    anyhow::ensure!(
        jitter <= every,
        "{table}.jitter must not exceed {table}.every"
    );
    Ok(CheckPlan {
        every,
        jitter,
        duration,
    })
}

/// The source of a scheduled test's sockets: `-B`, `--bind-dev` and `--cport` apply; `-4` and
/// `-6` do not, since the mesh resolves its peers once for every test.
fn scheduled_source(
    source: Result<crate::source::Source, crate::units::BadValue>,
    kind: &str,
    command: &str,
) -> anyhow::Result<sonde_client::Source> {
    let source = source.map_err(|e| anyhow::anyhow!("[{kind}]: {e} (as `{command}`)"))?;
    match source.family {
        Some(_) if source.client.bind.ip.is_none() => Err(anyhow::anyhow!(
            "[{kind}]: -4 and -6 do not apply to a mesh's tests: its peers are resolved once \
             for all of them (name them by address) (as `{command}`)"
        )),
        _ => Ok(source.client),
    }
}

/// The keys of `[throughput]` and `[pps]` that schedule the test rather than set it (`time`
/// is both: the test's `--time`, and how long the link is under test).
const SCHEDULE_KEYS: [&str; 3] = ["every", "jitter", "time"];

/// The test's flags a scheduled test cannot take, and why.
const NOT_IN_MESH: &[(&str, &str)] = &[
    (TARGET_KEY, "the mesh tests each of its peers ([peers])"),
    ("from", "the agent runs its scheduled tests itself"),
    (
        "secret_file",
        "the agent proves its own secret to its peers (sonde server --secret-file or SONDE_SECRET)",
    ),
    ("interval", "the metrics hold each test's whole result"),
    (
        "bidir",
        "the metrics have direction forward or reverse: set reverse = true instead",
    ),
    ("repeat", "`every` says how often the test runs"),
    ("sweep", "a scheduled test runs one configuration"),
    ("json", "the results are metrics (--metrics)"),
    ("csv", "the results are metrics (--metrics)"),
    ("json_stream", "the results are metrics (--metrics)"),
    ("db", "the results are metrics (--metrics), not saved"),
    ("no_save", "the results are metrics (--metrics), not saved"),
    (
        "label",
        "the results are metrics (--metrics), labelled source and target",
    ),
    ("pause", "`every` and `jitter` space the tests"),
];

/// A `[throughput]` or `[pps]` table: its schedule, and the rest of its keys as the test's plan
/// keys, parsed by the subcommand's own definition into the same specification as `sonde
/// throughput` / `sonde pps` with those flags (and the equivalent command line).
fn scheduled<O: clap::FromArgMatches + 'static>(
    table: &toml::Table,
) -> anyhow::Result<(CheckPlan, O, String)> {
    let kind = TestKind::of::<O>();
    let name = kind.name();
    let schedule = |key: &str| -> anyhow::Result<Option<Value>> {
        table
            .get(key)
            .map(|v| match v {
                toml::Value::Integer(n) => Ok(Value::Int(*n)),
                toml::Value::Float(f) => Ok(Value::Float(*f)),
                toml::Value::String(s) => Ok(Value::Text(s.clone())),
                _ => anyhow::bail!("{name}.{key}: expected a duration (e.g. \"2s\", \"10m\")"),
            })
            .transpose()
    };
    let plan = plan(
        schedule("every")?.as_ref(),
        schedule("jitter")?.as_ref(),
        schedule("time")?.as_ref(),
        name,
    )?;
    let keys = spec::plan_keys(kind);
    // The positional HOST[:PORT] the subcommand requires; each test's target is a peer.
    let mut args = vec!["PEER".to_owned()];
    for (key, v) in table {
        if SCHEDULE_KEYS.contains(&key.as_str()) {
            continue;
        }
        if let Some((_, why)) = NOT_IN_MESH.iter().find(|(k, _)| k == key) {
            anyhow::bail!("{name}.{key} is not for a mesh: {why}");
        }
        if key != PROTOCOL_KEY && !keys.iter().any(|k| k.key == *key) {
            let known: Vec<&str> = SCHEDULE_KEYS
                .into_iter()
                .chain(keys.iter().map(|k| k.key.as_str()))
                .filter(|k| !NOT_IN_MESH.iter().any(|(n, _)| n == k))
                .chain([PROTOCOL_KEY])
                .collect();
            anyhow::bail!(
                "unknown key \"{key}\" in [{name}]: sonde {name} has no --{} (the keys are {})",
                key.replace('_', "-"),
                known.join(", ")
            );
        }
        let value = match v {
            toml::Value::String(s) => KeyValue::Text(s.clone()),
            toml::Value::Integer(n) => KeyValue::Text(n.to_string()),
            toml::Value::Float(f) => KeyValue::Text(f.to_string()),
            toml::Value::Boolean(b) => KeyValue::Switch(*b),
            _ => anyhow::bail!("{name}.{key}: expected a string, a number or a boolean"),
        };
        args.extend(
            spec::key_args(kind, &keys, key, &value)
                .map_err(|e| anyhow::anyhow!("{name}.{key}: {e}"))?,
        );
    }
    // The mesh's own default length (2 s, not the subcommand's 10 s), in plain seconds
    // since `time` takes the mesh's units ("500ms") like `every`.
    args.push("--time".to_owned());
    args.push(plan.duration.as_secs_f64().to_string());
    let command = std::iter::once(format!("sonde {name}"))
        .chain(args.iter().cloned())
        .collect::<Vec<_>>()
        .join(" ");
    let spec = kind.parse_as::<O>(&args).map_err(|e| {
        let message = e.render().to_string();
        let first = message
            .lines()
            .next()
            .unwrap_or_default()
            .trim_start_matches("error: ")
            .to_owned();
        anyhow::anyhow!("[{name}]: {first} (as `{command}`)")
    })?;
    Ok((plan, spec, command))
}

/// `HOST` of `HOST`, `HOST:PORT` or `[V6]:PORT`.
pub(crate) fn host_part(spec: &str) -> &str {
    if let Some(rest) = spec.strip_prefix('[') {
        return rest.split_once(']').map_or(spec, |(h, _)| h);
    }
    match spec.split_once(':') {
        // One colon: HOST:PORT; more: a bare IPv6 address.
        Some((h, port)) if !port.contains(':') => h,
        _ => spec,
    }
}

/// `[select]` as a policy, refusing one that selects nobody.
fn select_policy(s: &Select) -> anyhow::Result<Policy> {
    for (key, v) in [("group", &s.group), ("across", &s.across)] {
        if let Some(v) = v {
            anyhow::ensure!(label_name_ok(v), "select.{key} = {v:?} is not a label name");
        }
    }
    anyhow::ensure!(
        s.representatives.is_none() || s.across.is_some(),
        "select.representatives needs select.across (the label of the groups they link)"
    );
    if let (Some(g), Some(a)) = (&s.group, &s.across) {
        anyhow::ensure!(
            g != a,
            "select.group and select.across are both {g:?}: across names the higher level \
             (e.g. group = \"rack\", across = \"zone\")"
        );
    }
    let policy = Policy {
        group: s.group.clone(),
        neighbours: s.neighbours.unwrap_or(0),
        across: s.across.clone(),
        representatives: s
            .across
            .as_ref()
            .map_or(0, |_| s.representatives.unwrap_or(1)),
    };
    anyhow::ensure!(
        policy.group.is_some() || policy.neighbours > 0 || policy.representatives > 0,
        "[select] selects no peer: set group, neighbours or across (or drop [select] to probe \
         every peer)"
    );
    anyhow::ensure!(
        policy.neighbours <= 1_000 && policy.representatives <= 1_000,
        "select.neighbours and select.representatives are at most 1000"
    );
    Ok(policy)
}

/// `a=1 b=2`.
pub(crate) fn label_text(labels: &Labels) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The host name, for a mesh file without `name`.
fn host_name() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "sonde".to_owned())
}

impl MeshConfig {
    /// Reads and checks the mesh file at `path`. [`NAME_ENV`], when set, names this agent
    /// instead of the file's `name`.
    pub(crate) fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the mesh file {}", path.display()))?;
        let mut config =
            Self::parse(&text).with_context(|| format!("mesh file {}", path.display()))?;
        if let Some(name) = std::env::var(NAME_ENV)
            .ok()
            .filter(|n| !n.trim().is_empty())
        {
            config.name = name.trim().to_owned();
        }
        if let Ok(text) = std::env::var(LABELS_ENV) {
            let labels =
                parse_label_list(&text).with_context(|| format!("{LABELS_ENV}={text:?}"))?;
            config.labels.extend(labels);
        }
        Ok(config)
    }

    pub(crate) fn parse(text: &str) -> anyhow::Result<Self> {
        let f: File = toml::from_str(text)?;
        let protocols = match &f.latency.protocols {
            None => vec![Protocol::Udp, Protocol::Tcp],
            Some(list) => list
                .iter()
                .map(|p| match p.as_str() {
                    "udp" => Ok(Protocol::Udp),
                    "tcp" => Ok(Protocol::Tcp),
                    other => {
                        anyhow::bail!("latency.protocols: {other:?} is not \"udp\" or \"tcp\"")
                    }
                })
                .collect::<anyhow::Result<Vec<_>>>()?,
        };
        let interval = match (&f.latency.interval, f.latency.rate) {
            (Some(_), Some(_)) => {
                anyhow::bail!("latency: give interval or rate (its inverse), not both")
            }
            (Some(v), None) => duration(v, "latency.interval")?,
            (None, Some(rate)) => {
                anyhow::ensure!(
                    rate > 0.0 && rate <= 100.0,
                    "latency.rate must be above 0 and at most 100 probes per second"
                );
                Duration::from_secs_f64(1.0 / rate)
            }
            (None, None) => Duration::from_secs(1),
        };
        anyhow::ensure!(
            interval >= Duration::from_millis(10) && interval <= Duration::from_secs(3_600),
            "latency.interval must be from 10ms to 1h"
        );
        let timeout = opt_duration(
            f.latency.timeout.as_ref(),
            "latency.timeout",
            Duration::from_secs(1),
        )?;
        anyhow::ensure!(
            timeout >= Duration::from_millis(1) && timeout <= Duration::from_secs(60),
            "latency.timeout must be from 1ms to 60s"
        );
        let source_ports = f.latency.source_ports.unwrap_or(64);
        anyhow::ensure!(
            (1..=1_024).contains(&source_ports),
            "latency.source_ports must be from 1 to 1024 (default 64)"
        );
        let msg_size = size(f.latency.msg_size.as_ref(), "latency.msg_size", 64)?;
        anyhow::ensure!(
            msg_size <= 1_400,
            "latency.msg_size must be at most 1400 bytes (one datagram)"
        );
        let throughput = f
            .throughput
            .as_ref()
            .map(|t| -> anyhow::Result<ThroughputCheck> {
                let (plan, opt, command) = scheduled::<throughput::Opt>(t)?;
                let options = opt.options();
                let source = scheduled_source(opt.source(), "throughput", &command)?;
                options
                    .check()
                    .map_err(|e| anyhow::anyhow!("[throughput]: {e} (as `{command}`)"))?;
                Ok(ThroughputCheck {
                    plan,
                    options,
                    source,
                    command,
                })
            })
            .transpose()?;
        let pps = f
            .pps
            .as_ref()
            .map(|p| -> anyhow::Result<PpsCheck> {
                let (plan, opt, command) = scheduled::<pps::Opt>(p)?;
                let options = opt.options();
                let source = scheduled_source(opt.source(), "pps", &command)?;
                options
                    .check()
                    .map_err(|e| anyhow::anyhow!("[pps]: {e} (as `{command}`)"))?;
                Ok(PpsCheck {
                    plan,
                    options,
                    source,
                    command,
                })
            })
            .transpose()?;
        let max_link_share = f.max_link_share.unwrap_or(0.05);
        anyhow::ensure!(
            max_link_share > 0.0 && max_link_share <= 1.0,
            "max_link_share must be above 0 and at most 1"
        );
        let hosts = f
            .peers
            .hosts
            .iter()
            .map(|item| match item {
                HostItem::Line(line) => parse_listed(line),
                HostItem::Table(table) => {
                    let spec = table
                        .get("host")
                        .context("a [peers] hosts table needs host = \"HOST[:PORT]\"")?;
                    let labels = label_items(
                        table
                            .iter()
                            .filter(|(k, _)| *k != "host")
                            .map(|(k, v)| format!("{k}={v}"))
                            .collect::<Vec<_>>()
                            .iter()
                            .map(String::as_str),
                    )?;
                    anyhow::ensure!(
                        !spec.trim().is_empty() && !spec.contains(char::is_whitespace),
                        "[peers] hosts: host = {spec:?} is not HOST[:PORT]"
                    );
                    Ok(Listed {
                        spec: spec.clone(),
                        labels,
                    })
                }
            })
            .collect::<anyhow::Result<Vec<_>>>()
            .context("[peers] hosts")?;
        let name_labels = f
            .peers
            .name_labels
            .as_deref()
            .map(|pattern| -> anyhow::Result<regex::Regex> {
                let re = regex::Regex::new(pattern)
                    .with_context(|| format!("peers.name_labels = {pattern:?}"))?;
                let names: Vec<&str> = re.capture_names().flatten().collect();
                anyhow::ensure!(
                    !names.is_empty(),
                    "peers.name_labels = {pattern:?} has no named group: each (?P<label>...) \
                     gives a label"
                );
                if let Some(bad) = names.iter().find(|n| !label_name_ok(n)) {
                    anyhow::bail!("peers.name_labels: {bad:?} is not a label name");
                }
                Ok(re)
            })
            .transpose()?;
        let labels = label_items(
            f.labels
                .iter()
                .flatten()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .iter()
                .map(String::as_str),
        )
        .context("labels")?;
        let select = f.select.as_ref().map(select_policy).transpose()?;
        let config = Self {
            name: f.name.clone().unwrap_or_else(host_name),
            hosts,
            file: f.peers.file.clone(),
            name_labels,
            labels,
            select,
            dns: f.peers.dns.clone(),
            dns_port: f.peers.dns_port.unwrap_or(DEFAULT_PORT),
            kubernetes: f.peers.kubernetes.as_ref().map(kube_peers).transpose()?,
            refresh: opt_duration(
                f.peers.refresh.as_ref(),
                "peers.refresh",
                Duration::from_secs(30),
            )?
            .max(Duration::from_millis(100)),
            protocols,
            interval,
            timeout,
            source_ports,
            msg_size,
            session_ignored: f.latency.session.is_some(),
            throughput,
            pps,
            max_link_share,
            own_port: DEFAULT_PORT,
        };
        anyhow::ensure!(
            !config.hosts.is_empty()
                || config.file.is_some()
                || config.dns.is_some()
                || config.kubernetes.is_some(),
            "[peers] lists no hosts, file, dns or kubernetes: the mesh has no peers"
        );
        let schedule = config.scheduler_config();
        if let Some((check, plan)) = schedule.never_fits().next() {
            let table = match check {
                Check::Throughput => "throughput",
                Check::Pps => "pps",
            };
            anyhow::bail!(
                "[{table}] time = {:?} would never run: one end of a link may spend half of \
                 max_link_share ({}) of a {:?} window (10 x the longest `every`, at least 1 \
                 minute) under test, {:?}; shorten time, or raise every or max_link_share",
                plan.duration,
                config.max_link_share,
                schedule.window,
                schedule.allowed()
            );
        }
        Ok(config)
    }

    /// The labels of a listed peer: those written beside it, over those `name_labels` finds in
    /// its host name (without the port).
    pub(crate) fn labels_of(&self, spec: &str, written: &Labels) -> Labels {
        let mut labels = Labels::new();
        if let Some(re) = &self.name_labels {
            let host = host_part(spec);
            if let Some(caps) = re.captures(host) {
                for name in re.capture_names().flatten() {
                    if let Some(m) = caps.name(name) {
                        labels.insert(name.to_owned(), m.as_str().to_owned());
                    }
                }
            }
        }
        labels.extend(written.iter().map(|(k, v)| (k.clone(), v.clone())));
        labels
    }

    /// The scheduler's settings for this file. Each end of a link schedules its own tests, so
    /// each keeps to half of `max_link_share` and the link's total stays within it.
    pub(crate) fn scheduler_config(&self) -> SchedulerConfig {
        SchedulerConfig::new(
            self.throughput.as_ref().map(|t| t.plan),
            self.pps.as_ref().map(|p| p.plan),
            self.max_link_share / 2.0,
        )
    }
}

impl MeshConfig {
    /// What the agent will do with this file, for `sonde server --mesh FILE --check`: its
    /// name, the peer sources, the probes and the schedule, one item a line.
    pub(crate) fn describe(&self) -> String {
        use std::fmt::Write as _;
        let mut s = String::new();
        let from_env = std::env::var(NAME_ENV).is_ok_and(|n| !n.trim().is_empty());
        let _ = writeln!(
            s,
            "name (the source label): {:?}{}",
            self.name,
            if from_env {
                format!(" (from {NAME_ENV})")
            } else {
                String::new()
            }
        );
        let _ = writeln!(s, "peers (re-read every {:?}):", self.refresh);
        if !self.hosts.is_empty() {
            let hosts: Vec<String> = self
                .hosts
                .iter()
                .map(|h| {
                    std::iter::once(h.spec.clone())
                        .chain(h.labels.iter().map(|(k, v)| format!("{k}={v}")))
                        .collect::<Vec<_>>()
                        .join(" ")
                })
                .collect();
            let _ = writeln!(s, "  hosts: {}", hosts.join(", "));
        }
        if let Some(file) = &self.file {
            let _ = writeln!(
                s,
                "  file: {} (one HOST[:PORT] [LABEL=VALUE ...] a line)",
                file.display()
            );
        }
        if let Some(re) = &self.name_labels {
            let _ = writeln!(s, "  labels from peer names: {}", re.as_str());
        }
        if let Some(dns) = &self.dns {
            let _ = writeln!(s, "  dns: every address of {dns}, port {}", self.dns_port);
        }
        if let Some(k) = &self.kubernetes {
            let _ = writeln!(s, "{}", super::kube::describe(k));
        }
        if !self.labels.is_empty() {
            let _ = writeln!(s, "this agent's labels: {}", label_text(&self.labels));
        }
        match &self.select {
            None => {
                let _ = writeln!(s, "select: every peer");
            }
            Some(p) => {
                let mut parts = Vec::new();
                if let Some(g) = &p.group {
                    parts.push(format!("every peer with this agent's {g}"));
                }
                if p.neighbours > 0 {
                    parts.push(format!(
                        "{} ring neighbours{}",
                        p.neighbours,
                        p.across
                            .as_ref()
                            .map_or(String::new(), |a| format!(" within its {a}"))
                    ));
                }
                if let Some(a) = &p.across {
                    parts.push(format!(
                        "{} representatives between every two {a} values",
                        p.representatives
                    ));
                }
                let _ = writeln!(s, "select: {}", parts.join("; "));
            }
        }
        let _ = writeln!(
            s,
            "probes: one per {:?} (± a tenth) per peer over {}, {} bytes, lost after {:?}, UDP from {} source ports{}",
            self.interval,
            self.protocols
                .iter()
                .map(|p| match p {
                    Protocol::Udp => "udp",
                    Protocol::Tcp => "tcp",
                })
                .collect::<Vec<_>>()
                .join(" and "),
            self.msg_size,
            self.timeout,
            self.source_ports,
            if self.session_ignored {
                " (latency.session is ignored: probes are not sessions)"
            } else {
                ""
            }
        );
        let _ = writeln!(
            s,
            "schedule (at most {} of each link's time under test):",
            self.max_link_share
        );
        let mut tests = 0;
        for (plan, command) in [
            self.throughput.as_ref().map(|t| (&t.plan, &t.command)),
            self.pps.as_ref().map(|p| (&p.plan, &p.command)),
        ]
        .into_iter()
        .flatten()
        {
            tests += 1;
            let _ = writeln!(s, "  every {:?} ± {:?}: {command}", plan.every, plan.jitter);
        }
        if tests == 0 {
            let _ = writeln!(s, "  no throughput or pps tests (latency probes only)");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_example_parses() {
        let doc = include_str!("../../../../docs/mesh.md");
        let toml = doc
            .split("```toml\n")
            .nth(1)
            .and_then(|s| s.split("```").next())
            .unwrap();
        let c = MeshConfig::parse(toml).unwrap();
        assert_eq!(c.name, "node-a");
        assert_eq!(c.hosts.len(), 3);
        assert!(c.select.is_some());
        assert_eq!(c.dns.as_deref(), Some("sonde.sonde.svc.cluster.local"));
        let k = c.kubernetes.unwrap();
        assert_eq!(
            (k.service.as_str(), k.namespace.as_deref(), k.port),
            ("sonde", Some("sonde"), None)
        );
        assert_eq!(k.labels["zone"], "topology.kubernetes.io/zone");
        assert_eq!(k.labels["rack"], "example.com/rack");
        assert_eq!(
            k.token_file,
            Path::new("/var/run/secrets/kubernetes.io/serviceaccount/token")
        );
        assert!(k.api_server.is_none());
        assert_eq!(c.refresh, Duration::from_secs(30));
        assert_eq!(c.protocols, [Protocol::Udp, Protocol::Tcp]);
        let t = c.throughput.unwrap();
        assert_eq!(t.plan.every, Duration::from_secs(600));
        assert_eq!(t.plan.jitter, Duration::from_secs(60));
        assert_eq!(t.options.duration, Duration::from_secs(2));
        assert_eq!(t.options.msg_size, 128 * 1024);
        assert_eq!(c.pps.unwrap().options.msg_size, 18);
        assert!((c.max_link_share - 0.05).abs() < 1e-12);
    }

    #[test]
    fn defaults_and_errors() {
        let c = MeshConfig::parse("name = \"a\"\n[peers]\nhosts = [\"198.18.0.2\"]\n").unwrap();
        assert_eq!(
            (c.interval, c.timeout, c.source_ports, c.msg_size),
            (Duration::from_secs(1), Duration::from_secs(1), 64, 64)
        );
        assert!(!c.session_ignored);
        assert!(c.throughput.is_none() && c.pps.is_none());
        for bad in [
            "[peers]\n",
            "[peers]\nhosts = [\"x\"]\nbogus = 1\n",
            "[peers]\nhosts = [\"x\"]\n[latency]\nprotocols = [\"icmp\"]\n",
            "[peers]\nhosts = [\"x\"]\n[throughput]\nevery = \"1s\"\ntime = \"2s\"\n",
            "[peers]\nhosts = [\"x\"]\n[pps]\nevery = \"soon\"\n",
            "[peers]\nhosts = [\"x\"]\n[latency]\nrate = 0\n",
            "[peers]\nhosts = [\"x\"]\n[latency]\nrate = 2\ninterval = \"1s\"\n",
            "[peers]\nhosts = [\"x\"]\n[latency]\nsource_ports = 0\n",
            "[peers]\nhosts = [\"x\"]\n[latency]\nmsg_size = 2000\n",
        ] {
            assert!(MeshConfig::parse(bad).is_err(), "{bad}");
        }
        let c = MeshConfig::parse(
            "[peers]\nhosts = [\"x\"]\nrefresh = \"500ms\"\n[latency]\nsession = 2\n",
        )
        .unwrap();
        assert_eq!(c.refresh, Duration::from_millis(500));
        // A file from before stateless probes still loads; its session length means nothing.
        assert!(c.session_ignored);
        let c = MeshConfig::parse("[peers]\nhosts = [\"x\"]\n[latency]\nrate = 5\n").unwrap();
        assert_eq!(c.interval, Duration::from_millis(200));
        let c = MeshConfig::parse(
            "[peers]\nhosts = [\"x\"]\n[latency]\ninterval = \"10s\"\ntimeout = \"500ms\"\nsource_ports = 256\n",
        )
        .unwrap();
        assert_eq!(
            (c.interval, c.timeout, c.source_ports),
            (Duration::from_secs(10), Duration::from_millis(500), 256)
        );
    }

    #[test]
    fn a_test_that_would_never_fit_its_share_is_refused_at_load() {
        let head = "[peers]\nhosts = [\"x\"]\n";
        // Half of 5 % of the 10-minute window (10 x every 1m) is 15 s: 15 s fits, 16 s never would.
        let c = MeshConfig::parse(&format!(
            "{head}[throughput]\nevery = \"1m\"\ntime = \"15s\"\n"
        ))
        .unwrap();
        assert_eq!(c.scheduler_config().allowed(), Duration::from_secs(15));
        let msg = format!(
            "{:#}",
            MeshConfig::parse(&format!(
                "{head}[throughput]\nevery = \"1m\"\ntime = \"16s\"\n"
            ))
            .unwrap_err()
        );
        assert!(
            msg.contains("[throughput] time = 16s would never run"),
            "{msg}"
        );
        assert!(
            msg.contains("600s window") && msg.contains(", 15s;"),
            "{msg}"
        );
        assert!(
            msg.contains("shorten time, or raise every or max_link_share"),
            "{msg}"
        );
        // The window is the longest `every`'s, and the cap the file's max_link_share: pps's 16 s
        // fits beside a throughput test every 2 minutes, or with a larger share.
        for ok in [
            "[throughput]\nevery = \"2m\"\n[pps]\nevery = \"1m\"\ntime = \"16s\"\n",
            "[pps]\nevery = \"1m\"\ntime = \"16s\"\n",
        ] {
            let text = if ok.starts_with("[pps]") {
                format!("max_link_share = 0.1\n{head}{ok}")
            } else {
                format!("{head}{ok}")
            };
            assert!(MeshConfig::parse(&text).is_ok(), "{text}");
        }
        let msg = format!(
            "{:#}",
            MeshConfig::parse(&format!("{head}[pps]\nevery = \"1m\"\ntime = \"16s\"\n"))
                .unwrap_err()
        );
        assert!(msg.contains("[pps] time = 16s would never run"), "{msg}");
    }

    #[test]
    fn labels_from_lines_tables_names_and_the_environment_form() {
        let c = MeshConfig::parse(
            "labels = { zone = \"a\" }\n\
             [peers]\n\
             hosts = [\"198.18.0.2:5300 zone=a rack=r7\", { host = \"198.18.0.3\", zone = \"b\" }, \"z9-r3-n1\"]\n\
             name_labels = '^(?P<zone>z\\d+)-(?P<rack>r\\d+)-'\n\
             [select]\ngroup = \"rack\"\nneighbours = 3\nacross = \"zone\"\n",
        )
        .unwrap();
        let l = |pairs: &[(&str, &str)]| -> Labels {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        assert_eq!(c.hosts[0].spec, "198.18.0.2:5300");
        assert_eq!(c.hosts[0].labels, l(&[("zone", "a"), ("rack", "r7")]));
        assert_eq!(c.hosts[1].spec, "198.18.0.3");
        assert_eq!(c.hosts[1].labels, l(&[("zone", "b")]));
        assert_eq!(c.labels, l(&[("zone", "a")]));
        // From the name, written labels over them.
        assert_eq!(
            c.labels_of("z9-r3-n1:5300", &Labels::new()),
            l(&[("zone", "z9"), ("rack", "r3")])
        );
        assert_eq!(
            c.labels_of("z9-r3-n1", &l(&[("rack", "r4")])),
            l(&[("zone", "z9"), ("rack", "r4")])
        );
        assert_eq!(c.labels_of("198.18.0.9", &Labels::new()), Labels::new());
        let p = c.select.unwrap();
        assert_eq!(
            (p.group.as_deref(), p.neighbours, p.across.as_deref()),
            (Some("rack"), 3, Some("zone"))
        );
        assert_eq!(p.representatives, 1, "one representative by default");
        assert_eq!(
            parse_label_list("zone=a, rack=r7").unwrap(),
            l(&[("zone", "a"), ("rack", "r7")])
        );
        assert_eq!(host_part("[::1]:5300"), "::1");
        assert_eq!(host_part("::1"), "::1");
        assert_eq!(host_part("node-a:5300"), "node-a");
        let head = "[peers]\nhosts = [\"x\"]\n";
        for (bad, want) in [
            ("[peers]\nhosts = [\"x zone\"]\n", "not a label KEY=VALUE"),
            ("[peers]\nhosts = [\"x =a\"]\n", "not a label KEY=VALUE"),
            ("[peers]\nhosts = [{ zone = \"a\" }]\n", "needs host"),
            (
                "[peers]\nhosts = [\"x\"]\nname_labels = \"^z\\\\d+\"\n",
                "has no named group",
            ),
            (
                "[peers]\nhosts = [\"x\"]\nname_labels = \"(\"\n",
                "name_labels",
            ),
            (&format!("{head}[select]\n"), "selects no peer"),
            (
                &format!("{head}[select]\nneighbours = 2\nrepresentatives = 2\n"),
                "needs select.across",
            ),
            (
                &format!("{head}[select]\ngroup = \"zone\"\nacross = \"zone\"\n"),
                "both \"zone\"",
            ),
            (&format!("{head}[select]\nk = 3\n"), "unknown field"),
        ] {
            let msg = format!("{:#}", MeshConfig::parse(bad).unwrap_err());
            assert!(msg.contains(want), "{bad}: {msg}");
        }
        assert!(parse_label_list("zone").is_err());
    }

    fn opt<O: clap::FromArgMatches + 'static>(args: &[&str]) -> O {
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        TestKind::of::<O>().parse_as(&args).unwrap()
    }

    #[test]
    fn a_scheduled_test_is_the_subcommand_with_those_flags() {
        let c = MeshConfig::parse(
            "[peers]\nhosts = [\"x\"]\n\
             [throughput]\nevery = \"1m\"\ntime = \"3s\"\nudp = true\nparallel = 4\n\
             reverse = true\nbitrate = \"10M\"\nlength = 1200\n\
             dscp = \"af41\"\nwindow = \"1M\"\ndont_fragment = true\n\
             [pps]\nevery = \"1m\"\ntime = \"500ms\"\nmsg_size = 14\nflows = 8\ngso = \"off\"\n",
        )
        .unwrap();
        let t = c.throughput.unwrap();
        let cli: throughput::Opt = opt(&[
            "198.18.0.2",
            "-u",
            "-P",
            "4",
            "-R",
            "-b",
            "10M",
            "-l",
            "1200",
            "-t",
            "3",
            "--dscp",
            "af41",
            "-w",
            "1M",
            "--dont-fragment",
        ]);
        assert_eq!(format!("{:?}", t.options), format!("{:?}", cli.options()));
        // The socket options too: the mesh's scheduled test sets them at both ends.
        assert_eq!(t.options.socket.tos, Some(34 << 2));
        assert_eq!(t.options.socket.window_bytes, Some(1 << 20));
        assert!(t.options.socket.dont_fragment);
        // The keys took (not the defaults on both sides).
        assert_eq!(
            (t.options.protocol, t.options.parallel, t.options.direction),
            (Protocol::Udp, 4, sonde_wire::Direction::Reverse)
        );
        assert_eq!((t.options.msg_size, t.options.bitrate), (1200, 10_000_000));
        assert_eq!(t.options.duration, Duration::from_secs(3));
        assert_eq!(t.plan.duration, t.options.duration);
        let p = c.pps.unwrap();
        let cli: pps::Opt = opt(&["h", "-m", "14", "--flows", "8", "--gso", "off", "-t", "0.5"]);
        assert_eq!(format!("{:?}", p.options), format!("{:?}", cli.options()));
        assert_eq!((p.options.msg_size, p.options.flows), (14, 8));
        assert_eq!(p.options.gso, sonde_client::GsoMode::Off);
        assert_eq!(p.options.duration, Duration::from_millis(500));
        assert!(p.command.starts_with("sonde pps PEER "), "{}", p.command);
    }

    #[test]
    fn keys_without_meaning_in_a_mesh_are_refused_by_name() {
        let head = "[peers]\nhosts = [\"x\"]\n";
        for (table, key) in [
            ("throughput", "target = \"b\""),
            ("throughput", "from = [\"a\"]"),
            ("throughput", "sweep = \"parallel=1:4\""),
            ("throughput", "repeat = 3"),
            ("throughput", "json = true"),
            ("throughput", "db = \"x.db\""),
            ("throughput", "no_save = true"),
            ("throughput", "bidir = true"),
            ("pps", "secret_file = \"s\""),
            ("pps", "interval = 1"),
            ("pps", "label = \"l\""),
        ] {
            let err = MeshConfig::parse(&format!("{head}[{table}]\n{key}\n")).unwrap_err();
            let name = key.split(' ').next().unwrap();
            let msg = format!("{err:#}");
            assert!(
                msg.contains(&format!("{table}.{name} is not for a mesh")),
                "{key}: {msg}"
            );
        }
        // Unknown keys, and values the subcommand's parser refuses, name the key or flag.
        let msg = format!(
            "{:#}",
            MeshConfig::parse(&format!("{head}[pps]\nflow = 4\n")).unwrap_err()
        );
        assert!(msg.contains("unknown key \"flow\" in [pps]"), "{msg}");
        assert!(msg.contains("flows"), "{msg}");
        let msg = format!(
            "{:#}",
            MeshConfig::parse(&format!("{head}[throughput]\nparallel = \"many\"\n")).unwrap_err()
        );
        assert!(msg.contains("--parallel"), "{msg}");
        let msg = format!(
            "{:#}",
            MeshConfig::parse(&format!("{head}[throughput]\nudp = \"yes\"\n")).unwrap_err()
        );
        assert!(msg.contains("throughput.udp"), "{msg}");
        assert!(
            MeshConfig::parse(&format!("{head}[pps]\nprotocol = \"tcp\"\n")).is_err(),
            "pps is UDP only"
        );
        // What the client would refuse at every test is refused at load, as the command line
        // refuses it at once.
        for (bad, want) in [
            ("[throughput]\nparallel = 0\n", "-P must be at least 1"),
            ("[pps]\nflows = 0\n", "--flows must be at least 1"),
            ("[pps]\nmsg_size = 10\n", "-m must be at least"),
        ] {
            let msg = format!(
                "{:#}",
                MeshConfig::parse(&format!("{head}{bad}")).unwrap_err()
            );
            assert!(msg.contains(want), "{bad}: {msg}");
        }
    }
}
