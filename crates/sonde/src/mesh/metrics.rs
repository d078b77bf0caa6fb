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
use sonde_agent::{ProbeRefusal, Stats};
use sonde_wire::{Refusal, TestKind};

/// Lowest RTT bucket bound, seconds (10 us), and the number of bounds (doubling: up to 5.24 s).
pub(crate) const RTT_BUCKET_START_SECONDS: f64 = 1e-5;
pub(crate) const RTT_BUCKETS: u16 = 20;

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
    pub(crate) rtt: Family<PairProto, Histogram, fn() -> Histogram>,
    pub(crate) sent: Family<PairProto, Counter>,
    pub(crate) lost: Family<PairProto, Counter>,
    pub(crate) tcp_connect: Family<Pair, Histogram, fn() -> Histogram>,
    pub(crate) worst_port_ratio: Family<PairProto, FloatGauge>,
    pub(crate) worst_port: Family<PairProto, Gauge>,
    pub(crate) up: Family<Pair, Gauge>,
    pub(crate) throughput_bytes: Family<PairDir, FloatGauge>,
    pub(crate) throughput_time: Family<PairDir, FloatGauge>,
    pub(crate) pps: Family<Pair, FloatGauge>,
    pub(crate) pps_time: Family<Pair, FloatGauge>,
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
        let rtt = Family::<PairProto, Histogram, fn() -> Histogram>::new_with_constructor(
            rtt_histogram as fn() -> Histogram,
        );
        let m = Self {
            rtt,
            sent: Family::default(),
            lost: Family::default(),
            tcp_connect: Family::<Pair, Histogram, fn() -> Histogram>::new_with_constructor(
                rtt_histogram as fn() -> Histogram,
            ),
            worst_port_ratio: Family::default(),
            worst_port: Family::default(),
            up: Family::default(),
            throughput_bytes: Family::default(),
            throughput_time: Family::default(),
            pps: Family::default(),
            pps_time: Family::default(),
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
        m.worst_port_ratio.get_or_create(&pp("b")).set(0.25);
        m.worst_port.get_or_create(&pp("b")).set(40_001);
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
