//! The metrics `--metrics` serves (names, labels and types: docs/mesh.md), kept with the
//! `prometheus-client` crate and encoded by its text encoder.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::{
    EncodeLabelSet, EncodeLabelValue, EncodeMetric, MetricEncoder, NoLabelSet,
};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Registry;
use sonde_agent::{ProbeRefusal, Stats};
use sonde_engine::mesh_select::Labels;
use sonde_wire::{Refusal, TestKind};

/// RTT buckets: 15 a doubling (a factor of 2^(1/15) = 1.0473 between bounds), so that a
/// quantile read by `histogram_quantile` is within 5% of the true one from 10 us to 10 s
/// (docs/mesh.md, "Resolution": 4.73% for the bucket, 0.1% for the HDR histogram's 3
/// significant digits the samples come through).
pub(crate) const RTT_BUCKETS_PER_DOUBLING: i32 = 15;
/// Bound `i` is 10 us x 2^((i - 1) / 15), to 6 significant digits: bound 1 is 10 us (bound 0,
/// 9.548 us, is the lower edge of the bucket of 10 us) and bound 300 is 10.012 s.
pub(crate) const RTT_BUCKETS: usize = 301;
/// Buckets exported on each side of every bucket that holds a sample: a pair exports the
/// bounds over the range it has seen, a factor of 2 wider each way (docs/mesh.md).
pub(crate) const RTT_BUCKET_MARGIN: usize = 15;

/// The RTT bucket bounds, seconds.
pub(crate) fn rtt_bounds() -> &'static [f64; RTT_BUCKETS] {
    static BOUNDS: std::sync::OnceLock<[f64; RTT_BUCKETS]> = std::sync::OnceLock::new();
    BOUNDS.get_or_init(|| {
        let mut b = [0.0; RTT_BUCKETS];
        for (i, bound) in (-1i32..).zip(b.iter_mut()) {
            let exact = 1e-5 * 2f64.powf(f64::from(i) / f64::from(RTT_BUCKETS_PER_DOUBLING));
            // 6 significant digits: short `le` values, the factor kept to 1e-6.
            let scale = 10f64.powi(5 - exact.log10().floor() as i32);
            *bound = (exact * scale).round() / scale;
        }
        b
    })
}

/// `sonde_rtt_seconds` of one pair: fine classic buckets ([`rtt_bounds`]), of which only those
/// within [`RTT_BUCKET_MARGIN`] of a bucket that holds a sample are exported (they stay once
/// exported: counts only grow), with `+Inf`, `_sum` and `_count`. A clone shares the counts
/// (as a `Counter`'s does): the prober keeps a handle per pair rather than looking the series up
/// by its labels for every probe.
#[derive(Debug, Default, Clone)]
pub(crate) struct RttHistogram {
    inner: Arc<Mutex<RttCounts>>,
}

#[derive(Debug, Default)]
struct RttCounts {
    /// Counts of buckets `lo ..`: the range seen so far (index [`RTT_BUCKETS`] is above the
    /// last bound).
    lo: usize,
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl RttHistogram {
    /// One RTT, seconds.
    pub(crate) fn observe(&self, secs: f64) {
        self.observe_n(secs, 1);
    }

    /// `n` RTTs of `secs` seconds.
    pub(crate) fn observe_n(&self, secs: f64, n: u64) {
        if n == 0 || secs.is_nan() {
            return;
        }
        // The first bound at or above the value (`le`), or past the last one.
        let i = rtt_bounds().partition_point(|b| *b < secs);
        let mut c = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if c.counts.is_empty() {
            c.lo = i;
        }
        if i < c.lo {
            let grow = c.lo - i;
            c.counts.splice(0..0, std::iter::repeat_n(0, grow));
            c.lo = i;
        }
        let at = i - c.lo;
        if at >= c.counts.len() {
            c.counts.resize(at + 1, 0);
        }
        c.counts[at] += n;
        #[expect(clippy::cast_precision_loss, reason = "counts are far below 2^52")]
        let weight = n as f64;
        c.sum += secs * weight;
        c.count += n;
    }

    /// `_sum`, `_count` and the exported buckets as `(bound, count in the bucket since the
    /// previous exported bound)`, ending with `+Inf`.
    pub(crate) fn exported(&self) -> (f64, u64, Vec<(f64, u64)>) {
        let c = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let bounds = rtt_bounds();
        let mut shown = vec![false; RTT_BUCKETS];
        for (k, &n) in c.counts.iter().enumerate() {
            if n > 0 {
                let i = c.lo + k;
                let from = i.saturating_sub(RTT_BUCKET_MARGIN);
                let to = (i + RTT_BUCKET_MARGIN).min(RTT_BUCKETS - 1);
                for s in &mut shown[from..=to] {
                    *s = true;
                }
            }
        }
        let mut out = Vec::new();
        let mut pending = 0;
        for i in 0..=RTT_BUCKETS {
            pending += i
                .checked_sub(c.lo)
                .and_then(|k| c.counts.get(k))
                .copied()
                .unwrap_or(0);
            if i < RTT_BUCKETS && shown[i] {
                out.push((bounds[i], pending));
                pending = 0;
            }
        }
        out.push((f64::INFINITY, pending));
        (c.sum, c.count, out)
    }
}

impl TypedMetric for RttHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for RttHistogram {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> Result<(), std::fmt::Error> {
        let (sum, count, buckets) = self.exported();
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelValue)]
#[allow(non_camel_case_types, reason = "label values as Prometheus shows them")]
pub(crate) enum Proto {
    udp,
    tcp,
}

impl Proto {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::udp => "udp",
            Self::tcp => "tcp",
        }
    }
}

impl From<sonde_wire::Protocol> for Proto {
    fn from(p: sonde_wire::Protocol) -> Self {
        match p {
            sonde_wire::Protocol::Udp => Self::udp,
            sonde_wire::Protocol::Tcp => Self::tcp,
        }
    }
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types, reason = "label values as Prometheus shows them")]
pub(crate) enum Dir {
    forward,
    reverse,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct Pair {
    pub(crate) source: String,
    pub(crate) target: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct PairProto {
    pub(crate) source: String,
    pub(crate) target: String,
    pub(crate) protocol: Proto,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct PairDir {
    pub(crate) source: String,
    pub(crate) target: String,
    pub(crate) direction: Dir,
}

/// One label of this agent, as its peers' lists and `[select]` see it.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OwnLabel {
    source: String,
    label: String,
    value: String,
}

/// One label of a peer this agent probes, as this agent's list gives it.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PeerLabel {
    source: String,
    target: String,
    label: String,
    value: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PeerSourceLabel {
    /// The mesh file's key: `file`, `dns` or `kubernetes`.
    peer_source: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

pub(crate) type FloatGauge = Gauge<f64, AtomicU64>;

const KINDS: [(TestKind, &str); 4] = [
    (TestKind::Latency, "latency"),
    (TestKind::Throughput, "throughput"),
    (TestKind::Pps, "pps"),
    (TestKind::Crr, "crr"),
];

const REASONS: [(Refusal, &str); 7] = [
    (Refusal::Version, "version"),
    (Refusal::Busy, "busy"),
    (Refusal::Limits, "limits"),
    (Refusal::BadRequest, "bad_request"),
    (Refusal::ShuttingDown, "shutting_down"),
    (Refusal::Unauthenticated, "unauthenticated"),
    (Refusal::SourceBusy, "source_busy"),
];

/// Mesh probes the agent did not answer, by reason, in the same `sonde_refusals_total`.
const PROBE_REASONS: [(ProbeRefusal, &str); 4] = [
    (ProbeRefusal::Mac, "probe_mac"),
    (ProbeRefusal::Stale, "probe_stale"),
    (ProbeRefusal::Replay, "probe_replay"),
    (ProbeRefusal::Overload, "probe_overload"),
];

/// Every series of this agent.
pub(crate) struct Metrics {
    registry: Registry,
    pub(crate) rtt: Family<PairProto, RttHistogram>,
    pub(crate) sent: Family<PairProto, Counter>,
    pub(crate) lost: Family<PairProto, Counter>,
    pub(crate) tcp_connect: Family<Pair, RttHistogram>,
    pub(crate) worst_port_ratio: Family<PairProto, FloatGauge>,
    pub(crate) worst_port: Family<PairProto, Gauge>,
    pub(crate) up: Family<Pair, Gauge>,
    pub(crate) throughput_bytes: Family<PairDir, FloatGauge>,
    pub(crate) throughput_time: Family<PairDir, FloatGauge>,
    pub(crate) pps: Family<Pair, FloatGauge>,
    pub(crate) pps_time: Family<Pair, FloatGauge>,
    selected_peers: Gauge,
    expected_probers: Gauge,
    own_labels: Family<OwnLabel, Gauge>,
    peer_labels: Family<PeerLabel, Gauge>,
    peer_source_up: Family<PeerSourceLabel, Gauge>,
    peer_source_peers: Family<PeerSourceLabel, Gauge>,
    peer_source_success: Family<PeerSourceLabel, FloatGauge>,
    sessions_active: Gauge,
    sessions_total: Family<KindLabel, Counter>,
    refusals: Family<ReasonLabel, Counter>,
    served_bytes: Counter,
    incoming_probers: Gauge,
    /// Scrapes one at a time: the agent's counters are copied in, then everything encoded.
    scrape: Mutex<()>,
}

impl Metrics {
    pub(crate) fn new() -> Self {
        let mut registry = Registry::default();
        let m = Self {
            rtt: Family::default(),
            sent: Family::default(),
            lost: Family::default(),
            tcp_connect: Family::default(),
            worst_port_ratio: Family::default(),
            worst_port: Family::default(),
            up: Family::default(),
            throughput_bytes: Family::default(),
            throughput_time: Family::default(),
            pps: Family::default(),
            pps_time: Family::default(),
            selected_peers: Gauge::default(),
            expected_probers: Gauge::default(),
            own_labels: Family::default(),
            peer_labels: Family::default(),
            peer_source_up: Family::default(),
            peer_source_peers: Family::default(),
            peer_source_success: Family::default(),
            sessions_active: Gauge::default(),
            sessions_total: Family::default(),
            refusals: Family::default(),
            served_bytes: Counter::default(),
            incoming_probers: Gauge::default(),
            scrape: Mutex::new(()),
            registry: Registry::default(),
        };
        registry.register(
            "sonde_rtt_seconds",
            "Round-trip time of each mesh probe, from its send to its valid reply",
            m.rtt.clone(),
        );
        registry.register("sonde_probes_sent", "Mesh probes sent", m.sent.clone());
        registry.register(
            "sonde_probes_lost",
            "Mesh probes whose reply never came",
            m.lost.clone(),
        );
        registry.register(
            "sonde_tcp_connect_seconds",
            "Time each TCP mesh probe's connection took to establish (SYN to SYN-ACK)",
            m.tcp_connect.clone(),
        );
        registry.register(
            "sonde_probes_lost_worst_port_ratio",
            "Loss ratio of the pair's worst UDP source port over its last 16 probes",
            m.worst_port_ratio.clone(),
        );
        registry.register(
            "sonde_probes_worst_source_port",
            "The local UDP source port (the 5-tuple) of sonde_probes_lost_worst_port_ratio",
            m.worst_port.clone(),
        );
        registry.register(
            "sonde_peer_up",
            "1 while one of the peer's last 3 probes (either protocol) was answered, 0 after 3 lost",
            m.up.clone(),
        );
        registry.register(
            "sonde_throughput_bytes_per_second",
            "Receiver's figure of the last mesh throughput test, payload bytes per second",
            m.throughput_bytes.clone(),
        );
        registry.register(
            "sonde_throughput_timestamp_seconds",
            "Unix time the last mesh throughput test ended",
            m.throughput_time.clone(),
        );
        registry.register(
            "sonde_pps_received_per_second",
            "Datagrams per second the target received in the last mesh pps test",
            m.pps.clone(),
        );
        registry.register(
            "sonde_pps_timestamp_seconds",
            "Unix time the last mesh pps test ended",
            m.pps_time.clone(),
        );
        registry.register(
            "sonde_mesh_probed_peers",
            "Peers this agent probes: every listed peer, or those the mesh file's [select] picks",
            m.selected_peers.clone(),
        );
        registry.register(
            "sonde_mesh_expected_incoming_probers",
            "Agents of the peer list whose selection includes this agent: how many should probe it",
            m.expected_probers.clone(),
        );
        registry.register(
            "sonde_mesh_labels",
            "This agent's labels (zone, rack, ...) as the peer list and the mesh file give them, \
             one series of value 1 per label",
            m.own_labels.clone(),
        );
        registry.register(
            "sonde_mesh_peer_labels",
            "The labels of each peer this agent probes, as its peer list gives them, one series \
             of value 1 per label",
            m.peer_labels.clone(),
        );
        registry.register(
            "sonde_mesh_peer_source_up",
            "1 while the peer source (the mesh file's [peers] file, dns or kubernetes) was read \
             at the last refresh, 0 while it fails and its last good read's peers are probed",
            m.peer_source_up.clone(),
        );
        registry.register(
            "sonde_mesh_peer_source_peers",
            "Peers the source gives now (lines of the file, addresses of the name, ready \
             endpoints), this agent among them where listed",
            m.peer_source_peers.clone(),
        );
        registry.register(
            "sonde_mesh_peer_source_last_success_timestamp_seconds",
            "Unix time of the source's last good read",
            m.peer_source_success.clone(),
        );
        registry.register(
            "sonde_sessions_active",
            "Sessions this agent is serving now (every kind)",
            m.sessions_active.clone(),
        );
        registry.register(
            "sonde_sessions",
            "sonde sessions this agent admitted, by kind",
            m.sessions_total.clone(),
        );
        registry.register(
            "sonde_refusals",
            "sonde sessions and connections this agent refused, by reason",
            m.refusals.clone(),
        );
        registry.register(
            "sonde_served_bytes",
            "Test data bytes this agent's sonde sessions sent and received",
            m.served_bytes.clone(),
        );
        registry.register(
            "sonde_mesh_incoming_probers",
            "Distinct mesh agents whose valid probe this agent answered in the last 3 intervals",
            m.incoming_probers.clone(),
        );
        // Every kind and reason from the start, at 0, so a rate() sees the first one.
        for (_, kind) in KINDS {
            let _ = m.sessions_total.get_or_create(&KindLabel { kind });
        }
        for reason in REASONS
            .iter()
            .map(|r| r.1)
            .chain(PROBE_REASONS.iter().map(|r| r.1))
        {
            let _ = m.refusals.get_or_create(&ReasonLabel { reason });
        }
        Self { registry, ..m }
    }

    /// The peer list's counts at its last refresh: the peers this agent probes, and how many
    /// agents' selections include it.
    pub(crate) fn set_selection(&self, probed: usize, expected_probers: usize) {
        self.selected_peers
            .set(i64::try_from(probed).unwrap_or(i64::MAX));
        self.expected_probers
            .set(i64::try_from(expected_probers).unwrap_or(i64::MAX));
    }

    /// How each peer source fared at the list's refresh at `now` (Unix seconds): up or not,
    /// its peers, and the time of its last good read (no series before the first).
    pub(crate) fn set_peer_sources(&self, states: &[super::SourceState], now: f64) {
        for state in states {
            let label = PeerSourceLabel {
                peer_source: state.source,
            };
            self.peer_source_up
                .get_or_create(&label)
                .set(i64::from(state.up));
            self.peer_source_peers
                .get_or_create(&label)
                .set(i64::try_from(state.peers).unwrap_or(i64::MAX));
            if state.up {
                self.peer_source_success.get_or_create(&label).set(now);
            }
        }
    }

    /// The labels of this agent (`source`) and of the peers it probes, as of the list's last
    /// refresh: the series of labels no longer said go (between two scrapes: the scrape lock
    /// is held while they are replaced).
    pub(crate) fn set_labels(
        &self,
        source: &str,
        own: &Labels,
        peers: &std::collections::BTreeMap<String, Labels>,
    ) {
        let _one = self
            .scrape
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        self.own_labels.clear();
        self.peer_labels.clear();
        for (label, value) in own {
            self.own_labels
                .get_or_create(&OwnLabel {
                    source: source.to_owned(),
                    label: label.clone(),
                    value: value.clone(),
                })
                .set(1);
        }
        for (target, labels) in peers {
            for (label, value) in labels {
                self.peer_labels
                    .get_or_create(&PeerLabel {
                        source: source.to_owned(),
                        target: target.clone(),
                        label: label.clone(),
                        value: value.clone(),
                    })
                    .set(1);
            }
        }
    }

    /// A peer joined: its probe counters exist from now, at 0, for every protocol probed, so
    /// a pair that never lost a probe reads a loss of 0 (a `rate()` of a series that is not
    /// there is no answer at all: a dashboard's loss cell would be empty, a diagnosis's n/a).
    pub(crate) fn start_pair(
        &self,
        source: &str,
        target: &str,
        protocols: &[sonde_wire::Protocol],
    ) {
        for p in protocols {
            let l = PairProto {
                source: source.to_owned(),
                target: target.to_owned(),
                protocol: Proto::from(*p),
            };
            let _ = self.sent.get_or_create(&l);
            let _ = self.lost.get_or_create(&l);
        }
    }

    /// Removes every series of `target` (a peer that left): they go stale in Prometheus.
    pub(crate) fn forget(&self, source: &str, target: &str) {
        let pair = Pair {
            source: source.to_owned(),
            target: target.to_owned(),
        };
        self.up.remove(&pair);
        self.pps.remove(&pair);
        self.pps_time.remove(&pair);
        self.tcp_connect.remove(&pair);
        for protocol in [Proto::udp, Proto::tcp] {
            let l = PairProto {
                source: source.to_owned(),
                target: target.to_owned(),
                protocol,
            };
            self.rtt.remove(&l);
            self.sent.remove(&l);
            self.lost.remove(&l);
            self.worst_port_ratio.remove(&l);
            self.worst_port.remove(&l);
        }
        for direction in [Dir::forward, Dir::reverse] {
            let l = PairDir {
                source: source.to_owned(),
                target: target.to_owned(),
                direction,
            };
            self.throughput_bytes.remove(&l);
            self.throughput_time.remove(&l);
        }
    }

    /// The exposition in the OpenMetrics text format, with the agent's own figures as of now.
    pub(crate) fn encode(&self, agent: Option<(&Stats, usize)>) -> String {
        let _one = self
            .scrape
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((stats, active)) = agent {
            self.sessions_active
                .set(i64::try_from(active).unwrap_or(i64::MAX));
            for (kind, label) in KINDS {
                catch_up(
                    &self
                        .sessions_total
                        .get_or_create(&KindLabel { kind: label }),
                    stats.sessions_of(kind),
                );
            }
            for (reason, label) in REASONS {
                catch_up(
                    &self.refusals.get_or_create(&ReasonLabel { reason: label }),
                    stats.refusals_of(reason),
                );
            }
            for (reason, label) in PROBE_REASONS {
                catch_up(
                    &self.refusals.get_or_create(&ReasonLabel { reason: label }),
                    stats.probe_refusals_of(reason),
                );
            }
            self.incoming_probers.set(
                i64::try_from(
                    stats
                        .incoming_probers
                        .load(std::sync::atomic::Ordering::Relaxed),
                )
                .unwrap_or(i64::MAX),
            );
            catch_up(
                &self.served_bytes,
                stats
                    .served_bytes
                    .load(std::sync::atomic::Ordering::Relaxed),
            );
        }
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// The OpenMetrics text of [`Metrics::encode`] in Prometheus' text format 0.0.4, for scrapers
/// that do not ask for OpenMetrics (and `promtool check metrics`): the sample lines are the
/// same; a counter's `# HELP` and `# TYPE` name its samples' `_total` name, and `# UNIT` and
/// `# EOF` go.
pub(crate) fn to_prometheus_text(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len() + 64);
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let meta = ["# HELP ", "# TYPE "]
            .into_iter()
            .find_map(|p| line.strip_prefix(p).map(|rest| (p, rest)));
        match meta {
            Some((prefix, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                let total = if counters.contains(name) {
                    "_total"
                } else {
                    ""
                };
                out.push_str(&format!("{prefix}{name}{total} {tail}"));
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// Brings a counter up to the agent's own count (counters only go up; the agent's do too).
fn catch_up(counter: &Counter, total: u64) {
    let now = counter.get();
    if total > now {
        counter.inc_by(total - now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_step_by_at_most_the_factor_from_10_us_to_10_s() {
        let b = rtt_bounds();
        assert!((b[1] - 1e-5).abs() < 1e-15, "{}", b[1]);
        assert!(
            b[0] < 1e-5 && b[RTT_BUCKETS - 1] >= 10.0,
            "{} {}",
            b[0],
            b[RTT_BUCKETS - 1]
        );
        for w in b.windows(2) {
            let f = w[1] / w[0];
            assert!(f > 1.047 && f < 1.0474, "{w:?}: {f}");
        }
    }

    /// `histogram_quantile(q, ...)` as Prometheus computes it over classic buckets, from its
    /// documentation ("Functions", histogram_quantile) and `bucketQuantile` in
    /// promql/quantile.go: the rank is q x the `+Inf` count; the first bucket whose cumulative
    /// count reaches it is chosen, and the value interpolated linearly inside it, from the
    /// previous bucket's bound (0 for the first bucket); a rank in `+Inf` gives the highest
    /// finite bound. `buckets`: (bound, cumulative count), ascending, the last `+Inf`.
    pub(crate) fn prometheus_quantile(q: f64, buckets: &[(f64, f64)]) -> f64 {
        let n = buckets.len();
        if n < 2 || buckets[n - 1].1 == 0.0 {
            return f64::NAN;
        }
        let rank = q * buckets[n - 1].1;
        let b = buckets
            .iter()
            .position(|(_, c)| *c >= rank)
            .unwrap_or(n - 1);
        if b == n - 1 {
            return buckets[n - 2].0;
        }
        if b == 0 && buckets[0].0 <= 0.0 {
            return buckets[0].0;
        }
        let (start, below) = if b == 0 {
            (0.0, 0.0)
        } else {
            (buckets[b - 1].0, buckets[b - 1].1)
        };
        let end = buckets[b].0;
        start + (end - start) * ((rank - below) / (buckets[b].1 - below))
    }

    /// The exported buckets as cumulative (bound, count), as Prometheus stores them.
    fn cumulative(h: &RttHistogram) -> Vec<(f64, f64)> {
        let mut total = 0;
        h.exported()
            .2
            .into_iter()
            .map(|(b, n)| {
                total += n;
                #[expect(clippy::cast_precision_loss, reason = "test counts")]
                (b, total as f64)
            })
            .collect()
    }

    /// xorshift64*, for reproducible samples.
    struct Rng(u64);
    impl Rng {
        fn unit(&mut self) -> f64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            #[expect(clippy::cast_precision_loss, reason = "53 bits of a random word")]
            let x = (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64;
            (x + 0.5) / (1u64 << 53) as f64
        }
        fn normal(&mut self) -> f64 {
            (-2.0 * self.unit().ln()).sqrt() * (std::f64::consts::TAU * self.unit()).cos()
        }
    }

    /// Samples (ns) of several distributions over 10 us .. 10 s.
    fn distributions() -> Vec<(String, Vec<u64>)> {
        let mut rng = Rng(0x5eed_1234_abcd_0001);
        let mut out = Vec::new();
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "ns"
        )]
        let ns = |secs: f64| (secs * 1e9).round().clamp(10_000.0, 10e9) as u64;
        let n = 100_000;
        let uniform = |lo: f64, hi: f64, rng: &mut Rng| -> Vec<u64> {
            (0..n).map(|_| ns(lo + (hi - lo) * rng.unit())).collect()
        };
        out.push(("uniform 10-50 us".to_owned(), uniform(1e-5, 5e-5, &mut rng)));
        out.push(("uniform 1-2 ms".to_owned(), uniform(1e-3, 2e-3, &mut rng)));
        out.push(("uniform 1-10 s".to_owned(), uniform(1.0, 10.0, &mut rng)));
        out.push((
            "log-uniform 10 us-10 s".to_owned(),
            (0..n).map(|_| ns(1e-5 * 1e6f64.powf(rng.unit()))).collect(),
        ));
        for (median, sigma) in [(30e-6, 0.3), (400e-6, 0.5), (20e-3, 1.0), (1.5, 0.4)] {
            out.push((
                format!("log-normal median {median} s sigma {sigma}"),
                (0..n)
                    .map(|_| ns(median * (sigma * rng.normal()).exp()))
                    .collect(),
            ));
        }
        // Bimodal: most fast, a slow mode of 2% (p99 and p99.9 in it), and 0.5% (p99.9 in it).
        for (slow_share, fast, slow) in [(0.02, 80e-6, 4e-3), (0.005, 200e-6, 0.9)] {
            out.push((
                format!("bimodal {fast} s + {slow_share} x {slow} s"),
                (0..n)
                    .map(|_| {
                        let centre = if rng.unit() < slow_share { slow } else { fast };
                        ns(centre * (0.1 * rng.normal()).exp())
                    })
                    .collect(),
            ));
        }
        // Spikes at the bucket bounds, and just above them: every sample an edge.
        let bounds = rtt_bounds();
        for (name, nudge) in [("at bucket bounds", 0u64), ("1 ns above bucket bounds", 1)] {
            out.push((
                format!("spikes {name}"),
                (0..n)
                    .map(|_| {
                        #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                        let i = 1 + (rng.unit() * 299.0) as usize;
                        ns(bounds[i]) + nudge
                    })
                    .collect(),
            ));
        }
        out
    }

    /// The samples as the agent exports them: into the session's HDR histogram (3 significant
    /// digits), replayed at each value's highest equivalent into `sonde_rtt_seconds`.
    fn exported(samples: &[u64]) -> RttHistogram {
        let h = RttHistogram::default();
        replay(&h, samples);
        h
    }

    fn replay(h: &RttHistogram, samples: &[u64]) {
        let mut hdr = hdrhistogram::Histogram::<u64>::new_with_bounds(
            1,
            sonde_engine::rtt::MAX_TRACKABLE_NS,
            3,
        )
        .unwrap();
        for &s in samples {
            hdr.record(s).unwrap();
        }
        for v in hdr.iter_recorded() {
            #[expect(clippy::cast_precision_loss, reason = "RTTs are far below 2^52 ns")]
            let secs = hdr.highest_equivalent(v.value_iterated_to()) as f64 / 1e9;
            h.observe_n(secs, v.count_at_value());
        }
    }

    /// The true quantile: an HDR histogram of the samples at 5 significant digits.
    fn truth(samples: &[u64], q: f64) -> f64 {
        let mut exact = hdrhistogram::Histogram::<u64>::new_with_bounds(
            1,
            sonde_engine::rtt::MAX_TRACKABLE_NS,
            5,
        )
        .unwrap();
        for &s in samples {
            exact.record(s).unwrap();
        }
        #[expect(clippy::cast_precision_loss, reason = "RTTs are far below 2^52 ns")]
        let t = exact.value_at_quantile(q) as f64 / 1e9;
        t
    }

    /// Kills and reaps a child when dropped (the test passed or failed).
    struct Child(std::process::Child);
    impl Drop for Child {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// One instant query to Prometheus' HTTP API on loopback: (target label, value) of each
    /// result.
    fn instant_query(port: u16, query: &str) -> Vec<(String, f64)> {
        use std::io::{Read as _, Write as _};
        let encoded: String = query
            .bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                    char::from(b).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect();
        let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
            return Vec::new();
        };
        let _ = stream.set_read_timeout(Some(std::time::Duration::from_secs(5)));
        let _ = write!(
            stream,
            "GET /api/v1/query?query={encoded} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n"
        );
        let mut text = String::new();
        let _ = stream.read_to_string(&mut text);
        let Some((_, body)) = text.split_once("\r\n\r\n") else {
            return Vec::new();
        };
        let Ok(json) = serde_json::from_str::<serde_json::Value>(body) else {
            return Vec::new();
        };
        json["data"]["result"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| {
                let target = r["metric"]["target"].as_str()?.to_owned();
                let value = r["value"][1].as_str()?.parse().ok()?;
                Some((target, value))
            })
            .collect()
    }

    /// The bound with the real thing: the exposition of known samples, served on loopback and
    /// scraped by Prometheus (Debian's `prometheus`), read back through its own
    /// `histogram_quantile` over the buckets' counts: within 5% of the true p50, p99 and p99.9,
    /// and equal to [`prometheus_quantile`] (the rule the other test uses is Prometheus').
    #[test]
    fn a_real_prometheus_reads_the_quantiles_within_5_percent() {
        let test = "a_real_prometheus_reads_the_quantiles_within_5_percent";
        let found = std::process::Command::new("prometheus")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            assert!(
                std::env::var("SONDE_TEST_REQUIRE_ALL").as_deref() != Ok("1"),
                "{test}: no prometheus on PATH (SONDE_TEST_REQUIRE_ALL=1)"
            );
            eprintln!("SKIP {test}: no prometheus on PATH (Debian's prometheus package)");
            return;
        }
        let sets: Vec<(String, Vec<u64>)> = distributions()
            .into_iter()
            .enumerate()
            .filter(|(i, _)| [1, 3, 5, 8, 10].contains(i))
            .map(|(i, (_, samples))| (format!("t{i}"), samples))
            .collect();
        let metrics = std::sync::Arc::new(Metrics::new());
        for (target, samples) in &sets {
            replay(
                &metrics.rtt.get_or_create(&PairProto {
                    source: "a".into(),
                    target: target.clone(),
                    protocol: Proto::udp,
                }),
                samples,
            );
        }
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let served = std::sync::Arc::clone(&metrics);
        let (addr, server) = crate::mesh::http::serve(
            "127.0.0.1:0".parse().unwrap(),
            std::sync::Arc::clone(&stop),
            move || served.encode(None),
        )
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n\
                 scrape_configs:\n  - job_name: sonde\n    static_configs:\n      - targets: [\"{addr}\"]\n"
            ),
        )
        .unwrap();
        let _prometheus = Child(
            std::process::Command::new("prometheus")
                .arg(format!("--config.file={}", config.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.path().join("tsdb").display()
                ))
                .arg(format!("--web.listen-address=127.0.0.1:{port}"))
                .arg("--log.level=warn")
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap(),
        );
        for q in [0.5, 0.99, 0.999] {
            let query = format!("histogram_quantile({q}, sonde_rtt_seconds_bucket)");
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
            let mut read = Vec::new();
            while read.len() < sets.len() && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(500));
                read = instant_query(port, &query);
            }
            assert_eq!(read.len(), sets.len(), "{query}: {read:?}");
            for (target, value) in read {
                let samples = &sets.iter().find(|(t, _)| *t == target).unwrap().1;
                let t = truth(samples, q);
                let ours = prometheus_quantile(q, &cumulative(&exported(samples)));
                let error = (value - t).abs() / t;
                eprintln!(
                    "{target} p{}: Prometheus {value}, true {t}: {:.2}%",
                    q * 100.0,
                    error * 100.0
                );
                assert!(error <= 0.05, "{target} p{}: {value} vs {t}", q * 100.0);
                assert!(
                    (value - ours).abs() <= 1e-9 * ours,
                    "{target}: {value} vs {ours}"
                );
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = server.join();
    }

    /// The claim of docs/mesh.md: p50, p99 and p99.9 read the way Prometheus reads them are
    /// within 5% of the true quantile (an HDR histogram of the same samples at 5 significant
    /// digits, 0.001%), for every distribution, from 10 us to 10 s.
    #[test]
    fn quantiles_read_as_prometheus_does_are_within_5_percent() {
        let mut worst: f64 = 0.0;
        for (name, samples) in distributions() {
            let mut exact = hdrhistogram::Histogram::<u64>::new_with_bounds(
                1,
                sonde_engine::rtt::MAX_TRACKABLE_NS,
                5,
            )
            .unwrap();
            for &s in &samples {
                exact.record(s).unwrap();
            }
            let buckets = cumulative(&exported(&samples));
            for q in [0.5, 0.99, 0.999] {
                #[expect(clippy::cast_precision_loss, reason = "RTTs are far below 2^52 ns")]
                let truth = exact.value_at_quantile(q) as f64 / 1e9;
                let read = prometheus_quantile(q, &buckets);
                let error = (read - truth).abs() / truth;
                worst = worst.max(error);
                assert!(
                    error <= 0.05,
                    "{name}: p{} read {read} s, true {truth} s: {:.2}% off",
                    q * 100.0,
                    error * 100.0
                );
            }
        }
        eprintln!("worst error {:.2}%", worst * 100.0);
        // The test can fail: the buckets of the old exposition (doubling) are far off.
        let samples: Vec<u64> = (0..1000).map(|i| 100_000 + i * 10).collect();
        let old: Vec<(f64, f64)> = (0..20)
            .map(|k| {
                let bound = 1e-5 * 2f64.powi(k);
                #[expect(clippy::cast_precision_loss, reason = "test counts")]
                let below = samples.iter().filter(|&&s| s as f64 / 1e9 <= bound).count() as f64;
                (bound, below)
            })
            .chain([(f64::INFINITY, 1000.0)])
            .collect();
        assert!((prometheus_quantile(0.5, &old) - 105e-6).abs() / 105e-6 > 0.1);
    }

    /// The exported range follows the samples: buckets appear with the first sample near them
    /// and stay; the counts between exported bounds add up.
    #[test]
    fn only_buckets_near_the_samples_are_exported_and_they_stay() {
        let h = RttHistogram::default();
        let (_, count, b) = h.exported();
        assert_eq!((count, b.len()), (0, 1));
        h.observe_n(1e-3, 5);
        let (_, _, b) = h.exported();
        assert_eq!(b.len(), 2 * RTT_BUCKET_MARGIN + 1 + 1);
        h.observe(0.5);
        h.observe(20.0);
        let (sum, count, b) = h.exported();
        assert_eq!(count, 7);
        assert!((sum - (5e-3 + 20.5)).abs() < 1e-9);
        assert_eq!(b.iter().map(|(_, n)| n).sum::<u64>(), 7);
        // 1 ms and 0.5 s, each with its margins, and the last bound for the sample above it.
        assert_eq!(
            b.len(),
            2 * (2 * RTT_BUCKET_MARGIN + 1) + RTT_BUCKET_MARGIN + 1
        );
        assert_eq!(b[b.len() - 2].0, rtt_bounds()[RTT_BUCKETS - 1]);
        assert_eq!(b[b.len() - 1], (f64::INFINITY, 1));
        // Below the first sample's range now: the range grows down.
        h.observe(2e-5);
        assert!(h.exported().2[0].0 < 2e-5);
    }

    fn pp(target: &str) -> PairProto {
        PairProto {
            source: "a".into(),
            target: target.into(),
            protocol: Proto::udp,
        }
    }

    #[test]
    fn labels_are_series_of_one_and_follow_the_list() {
        let m = Metrics::new();
        let labels = |pairs: &[(&str, &str)]| -> Labels {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        let mut peers = std::collections::BTreeMap::new();
        peers.insert(
            "b:5300".to_owned(),
            labels(&[("rack", "r2"), ("zone", "z1")]),
        );
        peers.insert("c".to_owned(), labels(&[]));
        m.set_labels("a", &labels(&[("rack", "r1"), ("zone", "z1")]), &peers);
        let text = m.encode(None);
        for line in [
            "sonde_mesh_labels{source=\"a\",label=\"rack\",value=\"r1\"} 1",
            "sonde_mesh_labels{source=\"a\",label=\"zone\",value=\"z1\"} 1",
            "sonde_mesh_peer_labels{source=\"a\",target=\"b:5300\",label=\"rack\",value=\"r2\"} 1",
        ] {
            assert!(text.contains(line), "{line} not in\n{text}");
        }
        assert_eq!(text.matches("sonde_mesh_peer_labels{").count(), 2, "{text}");
        // b moved to rack r3 and a lost its zone: the old series go, not stay at 1.
        peers.insert("b:5300".to_owned(), labels(&[("rack", "r3")]));
        m.set_labels("a", &labels(&[("rack", "r1")]), &peers);
        let text = m.encode(None);
        assert!(
            text.contains("target=\"b:5300\",label=\"rack\",value=\"r3\"} 1"),
            "{text}"
        );
        assert!(
            !text.contains("value=\"r2\"") && !text.contains("value=\"z1\""),
            "{text}"
        );
    }

    #[test]
    fn exposition_names_and_buckets() {
        let m = Metrics::new();
        m.rtt.get_or_create(&pp("b")).observe(0.000_15);
        m.sent.get_or_create(&pp("b")).inc_by(5);
        m.up.get_or_create(&Pair {
            source: "a".into(),
            target: "b".into(),
        })
        .set(1);
        m.worst_port_ratio.get_or_create(&pp("b")).set(0.25);
        m.worst_port.get_or_create(&pp("b")).set(40_001);
        let stats = Stats::default();
        stats
            .served_bytes
            .store(1234, std::sync::atomic::Ordering::Relaxed);
        let text = m.encode(Some((&stats, 2)));
        for line in [
            "# TYPE sonde_rtt_seconds histogram",
            // 150 us: in the bucket (145.876 us, 152.775 us]; 15 buckets exported each side.
            "sonde_rtt_seconds_bucket{le=\"0.000152775\",source=\"a\",target=\"b\",protocol=\"udp\"} 1",
            "sonde_rtt_seconds_bucket{le=\"0.000145876\",source=\"a\",target=\"b\",protocol=\"udp\"} 0",
            "sonde_rtt_seconds_bucket{le=\"0.0000763873\",source=\"a\",target=\"b\",protocol=\"udp\"} 0",
            "sonde_rtt_seconds_bucket{le=\"0.000305549\",source=\"a\",target=\"b\",protocol=\"udp\"} 1",
            "sonde_rtt_seconds_bucket{le=\"+Inf\",source=\"a\",target=\"b\",protocol=\"udp\"} 1",
            "sonde_probes_sent_total{source=\"a\",target=\"b\",protocol=\"udp\"} 5",
            "sonde_peer_up{source=\"a\",target=\"b\"} 1",
            "sonde_probes_lost_worst_port_ratio{source=\"a\",target=\"b\",protocol=\"udp\"} 0.25",
            "sonde_probes_worst_source_port{source=\"a\",target=\"b\",protocol=\"udp\"} 40001",
            "sonde_refusals_total{reason=\"probe_replay\"} 0",
            "sonde_mesh_incoming_probers 0",
            "sonde_sessions_active 2",
            "sonde_sessions_total{kind=\"pps\"} 0",
            "sonde_refusals_total{reason=\"unauthenticated\"} 0",
            "sonde_served_bytes_total 1234",
        ] {
            assert!(text.contains(line), "{line} not in\n{text}");
        }
        assert_eq!(
            text.matches("sonde_rtt_seconds_bucket{").count(),
            2 * RTT_BUCKET_MARGIN + 1 + 1,
            "{text}"
        );
        let text = to_prometheus_text(&text);
        assert!(
            text.contains("# TYPE sonde_served_bytes_total counter\n"),
            "{text}"
        );
        assert!(
            text.contains("# HELP sonde_probes_sent_total Mesh probes sent.\n"),
            "{text}"
        );
        assert!(text.contains("# TYPE sonde_rtt_seconds histogram\n"));
        assert!(!text.contains("# EOF"));
        // A peer that joined: its counters at 0 before any probe, on each protocol probed.
        m.start_pair("a", "c", &[sonde_wire::Protocol::Tcp]);
        let text = m.encode(None);
        assert!(
            text.contains("sonde_probes_lost_total{source=\"a\",target=\"c\",protocol=\"tcp\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("sonde_probes_sent_total{source=\"a\",target=\"c\",protocol=\"tcp\"} 0"),
            "{text}"
        );
        assert!(!text.contains("target=\"c\",protocol=\"udp\""), "{text}");
        m.forget("a", "c");
        // A peer that left: no series of it at all, not zeros.
        m.forget("a", "b");
        let text = m.encode(None);
        assert!(!text.contains("target=\"b\""), "{text}");
    }
}
