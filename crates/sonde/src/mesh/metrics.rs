//! The metrics `--metrics` serves (names, labels and types: docs/mesh.md), kept with the
//! `prometheus-client` crate and encoded by its text encoder.

use std::sync::atomic::AtomicU64;
use std::sync::Mutex;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use sonde_agent::Stats;
use sonde_wire::{Refusal, TestKind};

/// Lowest RTT bucket bound, seconds (10 us), and the number of bounds (doubling: up to 5.24 s).
pub(crate) const RTT_BUCKET_START_SECONDS: f64 = 1e-5;
pub(crate) const RTT_BUCKETS: u16 = 20;

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
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

/// Which way a lost probe was lost (`return` is a Rust keyword, so the label values are
/// strings).
pub(crate) const OUTBOUND: &str = "outbound";
pub(crate) const RETURN: &str = "return";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct PairProtoWay {
    pub(crate) source: String,
    pub(crate) target: String,
    pub(crate) protocol: Proto,
    /// [`OUTBOUND`] or [`RETURN`].
    pub(crate) direction: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

type FloatGauge = Gauge<f64, AtomicU64>;

fn rtt_histogram() -> Histogram {
    Histogram::new(exponential_buckets(
        RTT_BUCKET_START_SECONDS,
        2.0,
        RTT_BUCKETS,
    ))
}

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

/// Every series of this agent.
pub(crate) struct Metrics {
    registry: Registry,
    pub(crate) rtt: Family<PairProto, Histogram, fn() -> Histogram>,
    pub(crate) sent: Family<PairProto, Counter>,
    pub(crate) lost: Family<PairProto, Counter>,
    pub(crate) lost_one_way: Family<PairProtoWay, Counter>,
    pub(crate) up: Family<Pair, Gauge>,
    pub(crate) throughput_bytes: Family<PairDir, FloatGauge>,
    pub(crate) throughput_time: Family<PairDir, FloatGauge>,
    pub(crate) pps: Family<Pair, FloatGauge>,
    pub(crate) pps_time: Family<Pair, FloatGauge>,
    selected_peers: Gauge,
    expected_probers: Gauge,
    sessions_active: Gauge,
    sessions_total: Family<KindLabel, Counter>,
    refusals: Family<ReasonLabel, Counter>,
    served_bytes: Counter,
    /// Scrapes one at a time: the agent's counters are copied in, then everything encoded.
    scrape: Mutex<()>,
}

impl Metrics {
    pub(crate) fn new() -> Self {
        let mut registry = Registry::default();
        let rtt = Family::<PairProto, Histogram, fn() -> Histogram>::new_with_constructor(
            rtt_histogram as fn() -> Histogram,
        );
        let m = Self {
            rtt,
            sent: Family::default(),
            lost: Family::default(),
            lost_one_way: Family::default(),
            up: Family::default(),
            throughput_bytes: Family::default(),
            throughput_time: Family::default(),
            pps: Family::default(),
            pps_time: Family::default(),
            selected_peers: Gauge::default(),
            expected_probers: Gauge::default(),
            sessions_active: Gauge::default(),
            sessions_total: Family::default(),
            refusals: Family::default(),
            served_bytes: Counter::default(),
            scrape: Mutex::new(()),
            registry: Registry::default(),
        };
        registry.register(
            "sonde_rtt_seconds",
            "Round-trip time of each mesh probe (open loop, from its scheduled send)",
            m.rtt.clone(),
        );
        registry.register("sonde_probes_sent", "Mesh probes sent", m.sent.clone());
        registry.register(
            "sonde_probes_lost",
            "Mesh probes whose reply never came",
            m.lost.clone(),
        );
        registry.register(
            "sonde_probes_lost_one_way",
            "Of the lost UDP probes, those lost on the way out (outbound) or back (return)",
            m.lost_one_way.clone(),
        );
        registry.register(
            "sonde_peer_up",
            "1 when the last probe session to the peer succeeded, 0 when it failed",
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
        // Every kind and reason from the start, at 0, so a rate() sees the first one.
        for (_, kind) in KINDS {
            let _ = m.sessions_total.get_or_create(&KindLabel { kind });
        }
        for (_, reason) in REASONS {
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

    /// Removes every series of `target` (a peer that left): they go stale in Prometheus.
    pub(crate) fn forget(&self, source: &str, target: &str) {
        let pair = Pair {
            source: source.to_owned(),
            target: target.to_owned(),
        };
        self.up.remove(&pair);
        self.pps.remove(&pair);
        self.pps_time.remove(&pair);
        for protocol in [Proto::udp, Proto::tcp] {
            let l = PairProto {
                source: source.to_owned(),
                target: target.to_owned(),
                protocol,
            };
            self.rtt.remove(&l);
            self.sent.remove(&l);
            self.lost.remove(&l);
            for direction in [OUTBOUND, RETURN] {
                self.lost_one_way.remove(&PairProtoWay {
                    source: source.to_owned(),
                    target: target.to_owned(),
                    protocol,
                    direction,
                });
            }
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

    fn pp(target: &str) -> PairProto {
        PairProto {
            source: "a".into(),
            target: target.into(),
            protocol: Proto::udp,
        }
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
        m.lost_one_way
            .get_or_create(&PairProtoWay {
                source: "a".into(),
                target: "b".into(),
                protocol: Proto::udp,
                direction: RETURN,
            })
            .inc_by(2);
        let stats = Stats::default();
        stats
            .served_bytes
            .store(1234, std::sync::atomic::Ordering::Relaxed);
        let text = m.encode(Some((&stats, 2)));
        for line in [
            "# TYPE sonde_rtt_seconds histogram",
            "sonde_rtt_seconds_bucket{le=\"0.00016\",source=\"a\",target=\"b\",protocol=\"udp\"} 1",
            "sonde_rtt_seconds_bucket{le=\"0.00008\",source=\"a\",target=\"b\",protocol=\"udp\"} 0",
            "sonde_rtt_seconds_bucket{le=\"5.24288\",source=\"a\",target=\"b\",protocol=\"udp\"} 1",
            "sonde_probes_sent_total{source=\"a\",target=\"b\",protocol=\"udp\"} 5",
            "sonde_peer_up{source=\"a\",target=\"b\"} 1",
            "sonde_probes_lost_one_way_total{source=\"a\",target=\"b\",protocol=\"udp\",direction=\"return\"} 2",
            "sonde_sessions_active 2",
            "sonde_sessions_total{kind=\"pps\"} 0",
            "sonde_refusals_total{reason=\"unauthenticated\"} 0",
            "sonde_served_bytes_total 1234",
        ] {
            assert!(text.contains(line), "{line} not in\n{text}");
        }
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
        // A peer that left: no series of it at all, not zeros.
        m.forget("a", "b");
        let text = m.encode(None);
        assert!(!text.contains("target=\"b\""), "{text}");
    }
}
