//! The mesh file (`sonde server --mesh FILE`, docs/mesh.md): parsed once into a typed
//! [`MeshConfig`].

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use serde::Deserialize;
use sonde_engine::schedule::CheckPlan;
use sonde_wire::Protocol;

/// Default port of DNS peers (and of listed peers without one).
pub(crate) const DEFAULT_PORT: u16 = crate::cli::DEFAULT_PORT;

/// Names this agent (its `source` label) over the mesh file's `name`: one file serves every
/// agent, and in Kubernetes the downward API sets it per pod (`status.podIP`, so that `source`
/// and the `target` of DNS peers, which are addresses, name a node alike).
pub(crate) const NAME_ENV: &str = "SONDE_MESH_NAME";

/// The mesh file, as typed settings.
#[derive(Debug, Clone)]
pub(crate) struct MeshConfig {
    /// This agent's `source` label.
    pub(crate) name: String,
    pub(crate) hosts: Vec<String>,
    pub(crate) file: Option<PathBuf>,
    pub(crate) dns: Option<String>,
    pub(crate) dns_port: u16,
    pub(crate) refresh: Duration,
    pub(crate) protocols: Vec<Protocol>,
    /// Probes per second per peer and protocol.
    pub(crate) rate: f64,
    pub(crate) msg_size: u32,
    /// Length of one probe session.
    pub(crate) session: Duration,
    pub(crate) throughput: Option<ThroughputCheck>,
    pub(crate) pps: Option<PpsCheck>,
    pub(crate) max_link_share: f64,
    /// The port this agent serves on (set by `sonde server`): a peer at this port on one of
    /// this host's addresses is this agent.
    pub(crate) own_port: u16,
    /// This agent's `--max-sessions`: its peers' probes hold sessions here all the time.
    pub(crate) max_sessions: u32,
}

#[derive(Debug, Clone)]
pub(crate) struct ThroughputCheck {
    pub(crate) plan: CheckPlan,
    pub(crate) options: sonde_client::ThroughputOptions,
}

#[derive(Debug, Clone)]
pub(crate) struct PpsCheck {
    pub(crate) plan: CheckPlan,
    pub(crate) options: sonde_client::PpsOptions,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    name: Option<String>,
    #[serde(default)]
    peers: Peers,
    #[serde(default)]
    latency: Latency,
    throughput: Option<Throughput>,
    pps: Option<Pps>,
    max_link_share: Option<f64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Peers {
    #[serde(default)]
    hosts: Vec<String>,
    file: Option<PathBuf>,
    dns: Option<String>,
    dns_port: Option<u16>,
    refresh: Option<Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Latency {
    protocols: Option<Vec<String>>,
    rate: Option<f64>,
    msg_size: Option<Value>,
    session: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Throughput {
    every: Option<Value>,
    jitter: Option<Value>,
    time: Option<Value>,
    #[serde(default)]
    udp: bool,
    parallel: Option<u32>,
    #[serde(default)]
    reverse: bool,
    bitrate: Option<Value>,
    length: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Pps {
    every: Option<Value>,
    jitter: Option<Value>,
    time: Option<Value>,
    msg_size: Option<Value>,
    flows: Option<u32>,
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
        let rate = f.latency.rate.unwrap_or(5.0);
        anyhow::ensure!(
            rate > 0.0 && rate <= 1_000.0,
            "latency.rate must be above 0 and at most 1000 probes per second"
        );
        let session = opt_duration(
            f.latency.session.as_ref(),
            "latency.session",
            Duration::from_secs(10),
        )?;
        anyhow::ensure!(
            session >= Duration::from_millis(500) && session <= Duration::from_secs(300),
            "latency.session must be from 500ms to 300s"
        );
        let throughput = f
            .throughput
            .as_ref()
            .map(|t| -> anyhow::Result<ThroughputCheck> {
                let plan = plan(
                    t.every.as_ref(),
                    t.jitter.as_ref(),
                    t.time.as_ref(),
                    "throughput",
                )?;
                let protocol = if t.udp { Protocol::Udp } else { Protocol::Tcp };
                let bitrate = t.bitrate.as_ref().map_or(Ok(1_000_000), |b| {
                    crate::units::bitrate(&b.text())
                        .map_err(|e| anyhow::anyhow!("throughput.bitrate: {e}"))
                })?;
                let default_len = if t.udp { 1400 } else { 128 * 1024 };
                Ok(ThroughputCheck {
                    plan,
                    options: sonde_client::ThroughputOptions {
                        protocol,
                        parallel: t.parallel.unwrap_or(1).max(1),
                        direction: if t.reverse {
                            sonde_wire::Direction::Reverse
                        } else {
                            sonde_wire::Direction::Forward
                        },
                        msg_size: size(t.length.as_ref(), "throughput.length", default_len)?,
                        bitrate: if t.udp { bitrate } else { 0 },
                        duration: plan.duration,
                        interval: None,
                    },
                })
            })
            .transpose()?;
        let pps = f
            .pps
            .as_ref()
            .map(|p| -> anyhow::Result<PpsCheck> {
                let plan = plan(p.every.as_ref(), p.jitter.as_ref(), p.time.as_ref(), "pps")?;
                Ok(PpsCheck {
                    plan,
                    options: sonde_client::PpsOptions {
                        msg_size: size(p.msg_size.as_ref(), "pps.msg_size", 18)?,
                        flows: p.flows.unwrap_or(1).max(1),
                        duration: plan.duration,
                        ..sonde_client::PpsOptions::default()
                    },
                })
            })
            .transpose()?;
        let max_link_share = f.max_link_share.unwrap_or(0.05);
        anyhow::ensure!(
            max_link_share > 0.0 && max_link_share <= 1.0,
            "max_link_share must be above 0 and at most 1"
        );
        let config = Self {
            name: f.name.clone().unwrap_or_else(host_name),
            hosts: f.peers.hosts.clone(),
            file: f.peers.file.clone(),
            dns: f.peers.dns.clone(),
            dns_port: f.peers.dns_port.unwrap_or(DEFAULT_PORT),
            refresh: opt_duration(
                f.peers.refresh.as_ref(),
                "peers.refresh",
                Duration::from_secs(30),
            )?
            .max(Duration::from_millis(100)),
            protocols,
            rate,
            msg_size: size(f.latency.msg_size.as_ref(), "latency.msg_size", 64)?,
            session,
            throughput,
            pps,
            max_link_share,
            own_port: DEFAULT_PORT,
            max_sessions: u32::MAX,
        };
        anyhow::ensure!(
            !config.hosts.is_empty() || config.file.is_some() || config.dns.is_some(),
            "[peers] lists no hosts, file or dns: the mesh has no peers"
        );
        Ok(config)
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
        assert_eq!(c.dns.as_deref(), Some("sonde.sonde.svc.cluster.local"));
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
        assert_eq!((c.rate, c.session), (5.0, Duration::from_secs(10)));
        assert!(c.throughput.is_none() && c.pps.is_none());
        for bad in [
            "[peers]\n",
            "[peers]\nhosts = [\"x\"]\nbogus = 1\n",
            "[peers]\nhosts = [\"x\"]\n[latency]\nprotocols = [\"icmp\"]\n",
            "[peers]\nhosts = [\"x\"]\n[throughput]\nevery = \"1s\"\ntime = \"2s\"\n",
            "[peers]\nhosts = [\"x\"]\n[pps]\nevery = \"soon\"\n",
            "[peers]\nhosts = [\"x\"]\n[latency]\nrate = 0\n",
        ] {
            assert!(MeshConfig::parse(bad).is_err(), "{bad}");
        }
        let c = MeshConfig::parse(
            "[peers]\nhosts = [\"x\"]\nrefresh = \"500ms\"\n[latency]\nsession = 2\n",
        )
        .unwrap();
        assert_eq!(c.refresh, Duration::from_millis(500));
        assert_eq!(c.session, Duration::from_secs(2));
    }
}
