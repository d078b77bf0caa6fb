//! `sonde mesh publish`: the single writer of the labelled peer list. It watches a Service's
//! EndpointSlices and the nodes' metadata (as `[peers] kubernetes` does) and writes the list into
//! one ConfigMap, which the agents mount as their `[peers] file`: one node watch in the cluster
//! instead of one per agent (docs/mesh.md, "The publisher").

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use clap::Args;

use crate::mesh::config::{kube_name_ok, kube_peers_named, KubeTable};
use crate::mesh::kube::{self, Publish, Target, Written};

/// Write the mesh's labelled peer list into a ConfigMap, for agents with no API access
///
/// Watches the Service's EndpointSlices and the nodes' metadata through the Kubernetes API (the
/// same watches as `[peers] kubernetes`), and writes one `ADDRESS LABEL=VALUE ...` line per ready
/// endpoint (`ADDRESS:PORT` off port 5300), sorted, under --key of ConfigMap --configmap in --namespace. The agents mount
/// the ConfigMap and read it as `[peers] file`: their kubelets keep it current, so the API server
/// holds 2 watches for the whole mesh instead of 2 per agent.
#[derive(Debug, Args)]
#[command(after_long_help = "\
Writes only when the list's text changes (an unchanged list is no request past one get), and at \
most once per --min-interval: the first change at once, those that follow within the interval together \
at its end (a rollout is one write per interval, not one per pod). Every --resync it reads the \
ConfigMap again and writes the list back if someone else changed it (a hand edit, an older copy \
applied), saying so in its log. A ConfigMap holds 1 MiB: \
about 60 bytes a peer, some 15,000 peers; a longer list is refused, not cut.

RBAC: list and watch endpointslices (discovery.k8s.io) in the namespace; list and watch nodes \
(a ClusterRole) when a --label names a node label other than topology.kubernetes.io/zone; get and \
update on the ConfigMap (create too if it may be missing). deploy/kubernetes/node-labels has it.

Errors are named: the token (401), the RBAC verb and resource missing (403), the CA (TLS), the \
address (connect). Without --once a failure is logged and retried, the ConfigMap keeping its last \
list; SIGTERM or Ctrl-C ends it within a fraction of a second.

Examples:
  sonde mesh publish --label zone=topology.kubernetes.io/zone --label rack=example.com/rack
  sonde mesh publish --service sonde --namespace sonde --configmap sonde-peers --once

Exit codes:
    0  published (--once), or ended by SIGTERM/Ctrl-C
    1  the API server could not be read or written (--once), or the list is too large
    2  usage error (bad option)")]
pub(crate) struct PublishOpt {
    /// The Service whose EndpointSlices list the agents (the headless one of deploy/)
    #[arg(long, value_name = "NAME", default_value = "sonde")]
    service: String,
    /// The namespace of the Service and the ConfigMap; default this pod's own (from its
    /// service account)
    #[arg(long, value_name = "NS")]
    namespace: Option<String>,
    /// The peers' TCP port; default each EndpointSlice's port named sonde-tcp, else 5300
    #[arg(long, value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
    port: Option<u16>,
    /// A label of every peer, NAME=NODE_LABEL_KEY: the sonde label NAME (what `[select]` uses)
    /// from the node label NODE_LABEL_KEY of the endpoint's node (repeat for each; e.g.
    /// zone=topology.kubernetes.io/zone). None: the lines carry no labels
    #[arg(long = "label", value_name = "NAME=KEY")]
    labels: Vec<String>,
    /// The ConfigMap written (created if missing)
    #[arg(long, value_name = "NAME", default_value = "sonde-peers")]
    configmap: String,
    /// The ConfigMap's data key: the file name where the agents mount it
    #[arg(long, value_name = "KEY", default_value = "peers.txt")]
    key: String,
    /// List once, write, and exit (for a Job, or to try the RBAC)
    #[arg(long)]
    once: bool,
    /// At most one write per this many seconds; changes within it are written together
    #[arg(long, value_name = "SECONDS", default_value_t = 5.0)]
    min_interval: f64,
    /// Read the ConfigMap again this many seconds after the last read or write, and write the
    /// list back if its text was changed by anyone else (one get per period)
    #[arg(long, value_name = "SECONDS", default_value_t = 300.0)]
    resync: f64,
    /// The API server, https://HOST:PORT; default $KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT
    #[arg(long, value_name = "URL")]
    api_server: Option<String>,
    /// The bearer token file; default the pod's service account token
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// The CA that signs the API server's certificate; default the service account's ca.crt
    #[arg(long, value_name = "FILE")]
    ca_file: Option<PathBuf>,
}

impl PublishOpt {
    fn publish(&self) -> anyhow::Result<Publish> {
        let mut labels = BTreeMap::new();
        for item in &self.labels {
            let (name, key) = item
                .split_once('=')
                .with_context(|| format!("--label {item:?}: give NAME=NODE_LABEL_KEY"))?;
            labels.insert(name.to_owned(), key.to_owned());
        }
        // The keys named as this command's flags: `--label zone`, `--api-server`.
        let flag = |key: &str| match key.strip_prefix("labels") {
            Some(rest) => format!("--label{}", rest.replacen('.', " ", 1)),
            None => format!("--{}", key.replace('_', "-")),
        };
        let source = kube_peers_named(
            &KubeTable {
                service: self.service.clone(),
                namespace: self.namespace.clone(),
                port: self.port,
                labels,
                api_server: self.api_server.clone(),
                token_file: self.token_file.clone(),
                ca_file: self.ca_file.clone(),
            },
            &flag,
        )?;
        if !kube_name_ok(&self.configmap) {
            bail!(
                "--configmap {:?} is not a ConfigMap name (lower-case letters, digits and -)",
                self.configmap
            );
        }
        if self.key.is_empty()
            || self.key.len() > 253
            || !self
                .key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            bail!(
                "--key {:?} is not a ConfigMap key (letters, digits, -, _ and .)",
                self.key
            );
        }
        if !(self.min_interval.is_finite() && (0.05..=3_600.0).contains(&self.min_interval)) {
            bail!("--min-interval must be from 0.05 to 3600 seconds");
        }
        if !(self.resync.is_finite() && (self.min_interval..=86_400.0).contains(&self.resync)) {
            bail!(
                "--resync must be from --min-interval ({} s) to 86400 seconds, not {}",
                self.min_interval,
                self.resync
            );
        }
        Ok(Publish {
            source,
            target: Target {
                configmap: self.configmap.clone(),
                key: self.key.clone(),
            },
            min_interval: Duration::from_secs_f64(self.min_interval),
            resync: Duration::from_secs_f64(self.resync),
        })
    }
}

pub(crate) fn run(opt: &PublishOpt) -> anyhow::Result<()> {
    let p = opt
        .publish()
        .map_err(|e| crate::units::BadValue(format!("{e:#}")))?;
    if opt.once {
        let (peers, written) = kube::publish_once(&p)
            .map_err(|cause| anyhow::anyhow!("sonde mesh publish: {cause}"))?;
        let what = match written {
            Written::Unchanged => "unchanged",
            Written::Updated => "updated",
            Written::Created => "created",
        };
        println!(
            "configmap {}, key {}: {what}, {peers} peers",
            p.target.configmap, p.target.key
        );
        return Ok(());
    }
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, Arc::clone(&stop)).context("cannot handle SIGTERM")?;
    }
    kube::publish_watching(&p, &stop).context("cannot start the watch threads")
}
