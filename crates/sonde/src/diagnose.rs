//! `sonde mesh diagnose`: the mesh's series from Prometheus as a source x target heatmap of p99
//! RTT and loss, and the ranked suspects (`sonde_engine::diagnose` judges; this module queries
//! and prints).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context as _};
use clap::{Args, Subcommand};
use serde_json::Value;
use sonde_engine::diagnose::{diagnose, PairStats, Thresholds};
use sonde_report::render::diagnosis::{
    diagnosis_html, diagnosis_json, diagnosis_text, DiagnosisMeta,
};

use crate::output::print;
use crate::units::BadValue;

/// Mesh tools: where a mesh's fault is (from Prometheus), and its labelled peer list for Kubernetes
#[derive(Debug, Args)]
pub(crate) struct Opt {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    Diagnose(DiagnoseOpt),
    Publish(crate::publish::PublishOpt),
}

/// Where is the fault: the source x target heatmap of p99 RTT and loss, and the ranked suspects
///
/// Reads the mesh's series (`sonde_rtt_seconds`, `sonde_probes_sent_total`,
/// `sonde_probes_lost_total`, `sonde_peer_up`) from Prometheus over the last --window, judges
/// each (source, target) pair, and ranks what explains the bad pairs best: a source host (a bad
/// row), a target host (a bad column: a host that answers badly or not at all), a cross (one host
/// bad both ways) or a group (a rack or zone whose pairs to every other group are bad: its
/// uplink), each with a score and its evidence.
#[derive(Debug, Args)]
#[command(after_long_help = "\
A pair is bad when its target was unreachable for part of the window (sonde_peer_up below 1), \
when it lost at least --loss percent of its probes and at least 3 of them, or when its p99 RTT \
is at least --rtt-factor times the baseline and --rtt-excess above it. The baseline is the lower \
quartile of every pair's p99 (a typical healthy pair, even when a fault slows half the mesh).

A suspect's score (0 to 1) is the F0.5 of the pairs it names against the bad pairs (precision \
weighing twice as much as recall): 1 when it names exactly the bad pairs; each good pair it \
names, and each bad pair it leaves out, lowers it. A \
group (from --groups or --group-regex) is a suspect only with at least --min-group members and \
one host outside it; its pairs are those with one end in it and one outside.

With groups (two or more), a group matrix follows the suspects: the pairs from each group to \
each group, how many are bad. The text prints the source x target heatmaps up to 40 hosts; \
--html FILE draws them as a page (up to 250 hosts cell by cell, hosts ordered by group so a \
rack is a block; past that the page draws the group matrix) that opens offline in any browser.

Host names: `source` is each agent's name and `target` each peer as listed; a target listed as \
HOST:PORT whose HOST is an agent's name is read as that agent.

Examples:
  sonde mesh diagnose --prometheus http://prometheus:9090
  sonde mesh diagnose --prometheus http://prometheus:9090 --window 15m --groups racks.txt
  sonde mesh diagnose --prometheus http://prometheus:9090 --group-regex '^(rack-[0-9]+)-' --json
  sonde mesh diagnose --prometheus http://prometheus:9090 --group-label rack --html mesh.html

Exit codes:
    0  the diagnosis was printed (with or without suspects)
    1  Prometheus could not be reached or answered an error, or has no mesh series
    2  usage error (bad option, unreadable --groups file, bad --group-regex)")]
pub(crate) struct DiagnoseOpt {
    /// The Prometheus server that scrapes the mesh's agents (http:// only; e.g.
    /// http://prometheus:9090)
    #[arg(long, value_name = "URL")]
    prometheus: String,
    /// The window the figures are taken over, ending now: 30s, 5m, 1h
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = window)]
    window: Duration,
    /// Only this probe protocol's series (udp or tcp); default both
    #[arg(long, value_name = "PROTO", value_parser = ["udp", "tcp"])]
    protocol: Option<String>,
    /// Groups from the mesh's own labels: each host's value of this label (e.g. rack, zone)
    /// as the agents export it (sonde_mesh_labels, and sonde_mesh_peer_labels for what the
    /// peer lists say of a host, a dead agent's included)
    #[arg(long, value_name = "LABEL", conflicts_with_all = ["groups", "group_regex"])]
    group_label: Option<String>,
    /// Groups from a file: one `HOST GROUP` a line (`#` starts a comment)
    #[arg(long, value_name = "FILE", conflicts_with = "group_regex")]
    groups: Option<PathBuf>,
    /// Groups from the host names: the regex's first capture group (or the whole match) is the
    /// host's group; hosts it does not match are in no group
    #[arg(long, value_name = "REGEX")]
    group_regex: Option<String>,
    /// A pair is slow at a p99 RTT of at least this many times the baseline (and --rtt-excess
    /// above it)
    #[arg(long, value_name = "FACTOR", default_value_t = 3.0)]
    rtt_factor: f64,
    /// A pair is slow at a p99 RTT at least this far above the baseline (and --rtt-factor times
    /// it), in milliseconds
    #[arg(long, value_name = "MS", default_value_t = 1.0)]
    rtt_excess: f64,
    /// A pair is lossy at this share of its probes lost (and at least 3 probes), in percent
    #[arg(long, value_name = "PERCENT", default_value_t = 0.5)]
    loss: f64,
    /// The fewest members a group needs to be a suspect of its own
    #[arg(long, value_name = "N", default_value_t = 2)]
    min_group: usize,
    /// At most this many suspects printed (every one in --json)
    #[arg(long, value_name = "N", default_value_t = 5)]
    top: usize,
    /// Print the heatmap and the suspects as one JSON document
    #[arg(long, short = 'J')]
    json: bool,
    /// Also write the diagnosis as one self-contained HTML page: the suspects, the group
    /// matrix, and the source x target heatmaps of p99 RTT and loss (hosts ordered by group;
    /// up to 250 hosts drawn cell by cell). The text or JSON is printed as well
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,
}

/// A Prometheus duration: `500ms`, `30s`, `5m`, `1h`.
fn window(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let (n, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = t.strip_suffix('h') {
        (n, 3_600.0)
    } else {
        return Err(format!("`{s}`: give a unit (500ms, 30s, 5m, 1h)"));
    };
    let v: f64 = n
        .parse()
        .ok()
        .filter(|v: &f64| v.is_finite() && *v > 0.0)
        .ok_or_else(|| format!("`{s}` is not a duration"))?;
    let d = Duration::from_secs_f64(v * scale);
    if d < Duration::from_secs(1) || d > Duration::from_secs(86_400 * 31) {
        return Err(format!("`{s}`: the window must be 1s to 31 days"));
    }
    Ok(d)
}

pub(crate) fn run(opt: &Opt) -> anyhow::Result<()> {
    match &opt.command {
        Command::Diagnose(o) => run_diagnose(o),
        Command::Publish(o) => crate::publish::run(o),
    }
}

fn run_diagnose(opt: &DiagnoseOpt) -> anyhow::Result<()> {
    let th = thresholds(opt)?;
    let grouping = Grouping::from_opt(opt)?;
    let prom = Prometheus::new(&opt.prometheus)?;
    let pairs = fetch_pairs(&prom, opt.window, opt.protocol.as_deref())?;
    if pairs.is_empty() {
        bail!(
            "{} has no mesh series (sonde_peer_up, sonde_rtt_seconds) in the last {}: does it \
             scrape the agents' --metrics endpoints?",
            opt.prometheus,
            promql_duration(opt.window)
        );
    }
    let grouping = match &opt.group_label {
        Some(label) => {
            let sources: BTreeSet<String> = pairs.keys().map(|(s, _)| s.clone()).collect();
            let found = label_groups(&prom, label, opt.window, &sources)?;
            if found.is_empty() {
                eprintln!(
                    "sonde: warning: no agent or peer list gives the label {label:?} in the last \
                     {} (sonde_mesh_labels, sonde_mesh_peer_labels): the diagnosis has no groups. \
                     Label the peers (docs/mesh.md, \"Choosing peers\"), or give --groups or \
                     --group-regex",
                    promql_duration(opt.window)
                );
            }
            Grouping::File(found)
        }
        None => grouping,
    };
    let hosts: BTreeSet<&String> = pairs.keys().flat_map(|(s, t)| [s, t]).collect();
    let groups: BTreeMap<String, String> = hosts
        .into_iter()
        .filter_map(|h| Some((h.clone(), grouping.group(h)?)))
        .collect();
    let d = diagnose(&pairs, &groups, &th);
    let made_unix_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX));
    let meta = DiagnosisMeta {
        prometheus: &opt.prometheus,
        window: opt.window,
        protocol: opt.protocol.as_deref(),
        thresholds: &th,
        made_unix_ms,
    };
    if let Some(path) = &opt.html {
        let page = diagnosis_html(&d, &groups, &meta);
        std::fs::write(path, page)
            .with_context(|| format!("writing the page to {}", path.display()))?;
        eprintln!(
            "sonde: the diagnosis's page is {} ({} hosts, {} bad pairs of {})",
            path.display(),
            d.hosts.len(),
            d.bad_pairs,
            d.cells.len()
        );
    }
    if opt.json {
        let mut text = serde_json::to_string_pretty(&diagnosis_json(&d, &groups, &meta))?;
        text.push('\n');
        print(&text)
    } else {
        print(&diagnosis_text(&d, &groups, &meta, opt.top))
    }
}

fn thresholds(opt: &DiagnoseOpt) -> anyhow::Result<Thresholds> {
    let bad = |what: &str| anyhow::Error::new(BadValue(what.to_owned()));
    if !(opt.rtt_factor.is_finite() && opt.rtt_factor >= 1.0) {
        return Err(bad("--rtt-factor: a factor of 1 or more"));
    }
    if !(opt.rtt_excess.is_finite() && opt.rtt_excess >= 0.0 && opt.rtt_excess < 3_600_000.0) {
        return Err(bad("--rtt-excess: milliseconds, 0 or more"));
    }
    if !(opt.loss.is_finite() && opt.loss > 0.0 && opt.loss <= 100.0) {
        return Err(bad("--loss: a percentage above 0, at most 100"));
    }
    Ok(Thresholds {
        rtt_factor: opt.rtt_factor,
        rtt_excess: Duration::from_secs_f64(opt.rtt_excess / 1e3),
        loss_ratio: opt.loss / 100.0,
        min_group: opt.min_group,
        ..Thresholds::default()
    })
}

/// How a host's group is found.
enum Grouping {
    None,
    File(BTreeMap<String, String>),
    Regex(regex::Regex),
}

impl Grouping {
    fn from_opt(opt: &DiagnoseOpt) -> anyhow::Result<Grouping> {
        if let Some(path) = &opt.groups {
            let text = std::fs::read_to_string(path).map_err(|e| {
                BadValue(format!("--groups {}: cannot read it: {e}", path.display()))
            })?;
            let mut map = BTreeMap::new();
            for (n, line) in text.lines().enumerate() {
                let line = line.split('#').next().unwrap_or_default().trim();
                if line.is_empty() {
                    continue;
                }
                let mut words = line.split_whitespace();
                match (words.next(), words.next(), words.next()) {
                    (Some(h), Some(g), None) => {
                        map.insert(h.to_owned(), g.to_owned());
                    }
                    _ => {
                        return Err(BadValue(format!(
                            "--groups {}:{}: expected `HOST GROUP`, found {line:?}",
                            path.display(),
                            n + 1
                        ))
                        .into())
                    }
                }
            }
            return Ok(Grouping::File(map));
        }
        if let Some(re) = &opt.group_regex {
            let re = regex::Regex::new(re)
                .map_err(|e| BadValue(format!("--group-regex {re:?}: {e}")))?;
            return Ok(Grouping::Regex(re));
        }
        Ok(Grouping::None)
    }

    fn group(&self, host: &str) -> Option<String> {
        match self {
            Grouping::None => None,
            Grouping::File(map) => map.get(host).cloned(),
            Grouping::Regex(re) => {
                let c = re.captures(host)?;
                Some(c.get(1).or_else(|| c.get(0))?.as_str().to_owned())
            }
        }
    }
}

/// The Prometheus HTTP API (`/api/v1/query`), plain HTTP.
struct Prometheus {
    base: String,
    agent: ureq::Agent,
}

/// A query's answer: one sample per series, its labels and value.
type Samples = Vec<(BTreeMap<String, String>, f64)>;

/// The largest answer read (a mesh of 1,000 agents' pairs is some 100 MB of JSON per query;
/// past that, narrow the query with --protocol or a smaller mesh).
const MAX_ANSWER_BYTES: u64 = 256 << 20;

impl Prometheus {
    fn new(url: &str) -> anyhow::Result<Prometheus> {
        let base = url.trim_end_matches('/').to_owned();
        if !base.starts_with("http://") {
            return Err(BadValue(format!(
                "--prometheus {url:?}: give an http:// URL (https is not supported: put a \
                 local proxy in front, or reach Prometheus on its plain port)"
            ))
            .into());
        }
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(30)))
            .http_status_as_error(false)
            .build()
            .into();
        Ok(Prometheus { base, agent })
    }

    /// An instant query, evaluated now.
    fn query(&self, promql: &str) -> anyhow::Result<Samples> {
        let url = format!("{}/api/v1/query", self.base);
        let mut resp = self
            .agent
            .get(&url)
            .query("query", promql)
            .call()
            .with_context(|| format!("querying {url}"))?;
        let status = resp.status();
        let body = resp
            .body_mut()
            .with_config()
            .limit(MAX_ANSWER_BYTES)
            .read_to_string()
            .with_context(|| format!("reading the answer of {url}"))?;
        let doc: Value = serde_json::from_str(&body).with_context(|| {
            format!("{url} answered {status} with something that is not Prometheus' JSON")
        })?;
        if doc["status"] != "success" {
            bail!(
                "{url} refused `{promql}`: {} ({status})",
                doc["error"].as_str().unwrap_or("no error given")
            );
        }
        let result = doc["data"]["result"]
            .as_array()
            .with_context(|| format!("{url}: no data.result in the answer to `{promql}`"))?;
        Ok(result
            .iter()
            .filter_map(|s| {
                let labels = s["metric"]
                    .as_object()?
                    .iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                    .collect();
                // [time, "value"]; "NaN" parses as NaN.
                let value = s["value"][1].as_str()?.parse::<f64>().ok()?;
                Some((labels, value))
            })
            .collect())
    }
}

fn promql_duration(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

/// Every pair's p99, probe counts and reachability over the window.
fn fetch_pairs(
    prom: &Prometheus,
    window: Duration,
    protocol: Option<&str>,
) -> anyhow::Result<BTreeMap<(String, String), PairStats>> {
    let w = promql_duration(window);
    let sel = protocol.map_or(String::new(), |p| format!("protocol=\"{p}\""));
    let p99 = prom.query(&format!(
        "histogram_quantile(0.99, sum by (source, target, le) (rate(sonde_rtt_seconds_bucket{{{sel}}}[{w}])))"
    ))?;
    let sent = prom.query(&format!(
        "sum by (source, target) (increase(sonde_probes_sent_total{{{sel}}}[{w}]))"
    ))?;
    let lost = prom.query(&format!(
        "sum by (source, target) (increase(sonde_probes_lost_total{{{sel}}}[{w}]))"
    ))?;
    let up = prom.query(&format!(
        "avg by (source, target) (avg_over_time(sonde_peer_up[{w}]))"
    ))?;
    let mut pairs: BTreeMap<(String, String), PairStats> = BTreeMap::new();
    let key =
        |l: &BTreeMap<String, String>| Some((l.get("source")?.clone(), l.get("target")?.clone()));
    for (l, v) in &up {
        if let Some(k) = key(l) {
            pairs.entry(k).or_default().up_fraction = v.is_finite().then_some(v.clamp(0.0, 1.0));
        }
    }
    for (l, v) in &p99 {
        if let Some(k) = key(l) {
            // NaN: no sample in the window; +Inf: beyond the last bucket (over 5.2 s).
            let p = (v.is_finite() && *v >= 0.0).then(|| Duration::from_secs_f64(*v));
            pairs.entry(k).or_default().p99_rtt = p;
        }
    }
    for (l, v) in &sent {
        if let Some(k) = key(l) {
            pairs.entry(k).or_default().sent = v.is_finite().then_some(*v);
        }
    }
    for (l, v) in &lost {
        if let Some(k) = key(l) {
            pairs.entry(k).or_default().lost = v.is_finite().then_some(*v);
        }
    }
    Ok(same_names(pairs))
}

/// The agent a target names: a target listed as `HOST:PORT` whose HOST is a source's name is
/// that source (the agent's name and the peer list then name one node alike); `None` when the
/// target is to be kept as listed.
fn agent_of(target: &str, sources: &BTreeSet<String>) -> Option<String> {
    if sources.contains(target) {
        return None;
    }
    let (host, port) = target.rsplit_once(':')?;
    port.parse::<u16>().ok()?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    sources.contains(host).then(|| host.to_owned())
}

/// Every target renamed to the agent it names ([`agent_of`]).
fn same_names(
    pairs: BTreeMap<(String, String), PairStats>,
) -> BTreeMap<(String, String), PairStats> {
    let sources: BTreeSet<String> = pairs.keys().map(|(s, _)| s.clone()).collect();
    pairs
        .into_iter()
        .map(|((s, t), p)| {
            let t = agent_of(&t, &sources).unwrap_or(t);
            ((s, t), p)
        })
        .collect()
}

/// Each host's group from the mesh's own label series (`--group-label NAME`): an agent's
/// `sonde_mesh_labels` first (what it says of itself), then what the peer lists say of it in
/// `sonde_mesh_peer_labels` (which names agents that export nothing, a dead one). Where lists
/// disagree, the value most of them give (then the smallest).
fn label_groups(
    prom: &Prometheus,
    label: &str,
    window: Duration,
    sources: &BTreeSet<String>,
) -> anyhow::Result<BTreeMap<String, String>> {
    let w = promql_duration(window);
    let quoted = label.replace('\\', "\\\\").replace('"', "\\\"");
    let own = prom.query(&format!(
        "max by (source, value) (max_over_time(sonde_mesh_labels{{label=\"{quoted}\"}}[{w}]))"
    ))?;
    let said = prom.query(&format!(
        "count by (target, value) (max_over_time(sonde_mesh_peer_labels{{label=\"{quoted}\"}}[{w}]))"
    ))?;
    let mut votes: BTreeMap<String, BTreeMap<String, f64>> = BTreeMap::new();
    for (l, n) in &said {
        let (Some(t), Some(v)) = (l.get("target"), l.get("value")) else {
            continue;
        };
        let host = agent_of(t, sources).unwrap_or_else(|| t.clone());
        *votes.entry(host).or_default().entry(v.clone()).or_default() += n;
    }
    let mut groups: BTreeMap<String, String> = votes
        .into_iter()
        .filter_map(|(host, values)| {
            let best = values
                .into_iter()
                .max_by(|a, b| a.1.total_cmp(&b.1).then(b.0.cmp(&a.0)))?;
            Some((host, best.0))
        })
        .collect();
    for (l, _) in &own {
        if let (Some(h), Some(v)) = (l.get("source"), l.get("value")) {
            groups.insert(h.clone(), v.clone());
        }
    }
    Ok(groups)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_parse_as_prometheus_durations() {
        assert_eq!(window("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(window("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(window("1500ms"), Ok(Duration::from_millis(1500)));
        assert_eq!(promql_duration(Duration::from_secs(300)), "300000ms");
        assert!(window("5").is_err());
        assert!(window("100ms").is_err());
        assert!(window("-5m").is_err());
    }

    /// The text a user reads: the suspect with its evidence, then both heatmaps with the bad
    /// cells marked and a host with no series as a source shown as such.
    #[test]
    fn the_table_names_the_suspect_and_marks_the_bad_cells() {
        use clap::Parser as _;
        #[derive(clap::Parser)]
        struct T {
            #[command(flatten)]
            o: DiagnoseOpt,
        }
        let opt = T::parse_from(["t", "--prometheus", "http://prom:9090", "--window", "30s"]).o;
        let ok = PairStats {
            p99_rtt: Some(Duration::from_micros(250)),
            sent: Some(300.0),
            lost: Some(0.0),
            up_fraction: Some(1.0),
        };
        let mut pairs = BTreeMap::new();
        for (s, t) in [
            ("a", "b"),
            ("b", "a"),
            ("a", "d"),
            ("d", "a"),
            ("b", "d"),
            ("d", "b"),
        ] {
            pairs.insert((s.to_owned(), t.to_owned()), ok);
        }
        // c died: the others see it down; it exports nothing.
        for s in ["a", "b", "d"] {
            let down = PairStats {
                up_fraction: Some(0.0),
                p99_rtt: None,
                ..ok
            };
            pairs.insert((s.to_owned(), "c".to_owned()), down);
        }
        let th = thresholds(&opt).unwrap();
        let d = diagnose(&pairs, &BTreeMap::new(), &th);
        let meta = DiagnosisMeta {
            prometheus: &opt.prometheus,
            window: opt.window,
            protocol: None,
            thresholds: &th,
            made_unix_ms: 0,
        };
        let text = diagnosis_text(&d, &BTreeMap::new(), &meta, opt.top);
        assert!(text.starts_with(
            "Mesh diagnosis over the last 30 s from http://prom:9090: 4 hosts, 9 pairs with data, 3 bad; baseline p99 0.25 ms\n"
        ), "{text}");
        assert!(text.contains("  1. 1.00  target c (a bad column: it answers badly or not at all)\n         3 of its 3 pairs bad (3 unreachable); no series from it as a source (is its agent running?)\n"), "{text}");
        // Row c has no data; column c is down and marked.
        assert!(
            text.contains("  [3]      .      .      -      .\n"),
            "{text}"
        );
        assert!(
            text.contains("  [1]      -   0.25  down*   0.25\n"),
            "{text}"
        );
        assert!(
            text.contains("  [1]      -   0.00  down*   0.00\n"),
            "{text}"
        );
    }

    #[test]
    fn a_regex_groups_by_its_first_capture() {
        let g = Grouping::Regex(regex::Regex::new(r"^198\.18\.(\d+)\.").unwrap());
        assert_eq!(g.group("198.18.3.7").as_deref(), Some("3"));
        assert_eq!(g.group("10.0.0.1"), None);
        // No capture group: the whole match.
        let g = Grouping::Regex(regex::Regex::new(r"^rack-[a-z]+").unwrap());
        assert_eq!(g.group("rack-b-node-4").as_deref(), Some("rack-b"));
    }

    #[test]
    fn a_target_with_the_port_is_the_agent_of_that_name() {
        let p = PairStats::default();
        let pairs: BTreeMap<_, _> = [
            (("10.0.0.1".to_owned(), "10.0.0.2:5300".to_owned()), p),
            (("10.0.0.2".to_owned(), "10.0.0.1:5300".to_owned()), p),
            // No agent of that name: kept as listed.
            (("10.0.0.2".to_owned(), "10.0.0.9:5300".to_owned()), p),
        ]
        .into_iter()
        .collect();
        let keys: Vec<(String, String)> = same_names(pairs).into_keys().collect();
        assert_eq!(
            keys,
            [
                ("10.0.0.1".to_owned(), "10.0.0.2".to_owned()),
                ("10.0.0.2".to_owned(), "10.0.0.1".to_owned()),
                ("10.0.0.2".to_owned(), "10.0.0.9:5300".to_owned()),
            ]
        );
    }
}
