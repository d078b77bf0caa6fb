//! The table for people.

pub(crate) mod context;
pub(crate) mod crr;
pub(super) mod helpers;
mod inner;
pub(crate) mod latency;
pub(crate) mod load;
pub(crate) mod mtu;
pub(crate) mod pps;
pub(crate) mod quick;
pub(crate) mod sweep;
pub(crate) mod throughput;

pub use self::latency::latency_interval_line;
pub use self::pps::pps_interval_line;

use std::borrow::Cow;

use super::units::{fmt_timestamp, ns_to_s, to_f64, Unit, BYTES, RATE};
use crate::model::{Meta, Protocol, RttNs, StreamDirection, TestResult, ThroughputResult};

/// A table for people: a header line (test, server, session, start), the configuration, the
/// figures with their units, then the overlap and the warnings. Ends with a newline.
///
/// Rates are in SI units (1 Mbit/s = 10^6 bit/s), bytes in binary units (1 MiB = 2^20 B), both
/// with one unit per column; RTTs in µs, or ms when the median is 1 ms or more. A percentile the
/// sample count cannot support reads `n/a (needs ≥N samples)`.
pub fn table(result: &TestResult) -> String {
    let mut out = String::new();
    result.kind().table(&mut out);
    out
}

/// A percentile sonde states: its label, `p` in parts per 100,000 (so the sample bound below is
/// exact integer arithmetic: in `f64`, 10 / (1 - 0.9) rounds up to 101), and where the document
/// keeps it.
struct Percentile {
    label: &'static str,
    parts_per_100k: u64,
    value: fn(&RttNs) -> Option<u64>,
}

impl Percentile {
    const fn new(
        label: &'static str,
        parts_per_100k: u64,
        value: fn(&RttNs) -> Option<u64>,
    ) -> Self {
        Self {
            label,
            parts_per_100k,
            value,
        }
    }

    /// The smallest sample count that supports it, `ceil(10 / (1 - p))`: sonde-engine's
    /// `rtt::percentile_supported` rule (ten samples at or beyond the percentile).
    const fn min_samples(&self) -> u64 {
        1_000_000_u64.div_ceil(100_000 - self.parts_per_100k)
    }
}

const PERCENTILES: [Percentile; 6] = [
    Percentile::new("p50", 50_000, |r| r.p50),
    Percentile::new("p90", 90_000, |r| r.p90),
    Percentile::new("p99", 99_000, |r| r.p99),
    Percentile::new("p99.9", 99_900, |r| r.p999),
    Percentile::new("p99.99", 99_990, |r| r.p9999),
    Percentile::new("p99.999", 99_999, |r| r.p99999),
];

const RECEIVER: &str = "receiver";
const SENDER: &str = "sender (handed to kernel)";

/// `--ecn`: per direction that counted, the marks its datagrams arrived with.
fn ecn_lines(e: &crate::model::EcnByDirection) -> Vec<String> {
    [
        ("client → server", e.client_to_server),
        ("server → client", e.server_to_client),
    ]
    .into_iter()
    .filter_map(|(dir, c)| {
        let c = c?;
        Some(format!(
            "ECN arrived {dir}: {} CE, {} ECT(0), {} ECT(1), {} Not-ECT",
            super::units::fmt_count(c.ce),
            super::units::fmt_count(c.ect0),
            super::units::fmt_count(c.ect1),
            super::units::fmt_count(c.not_ect)
        ))
    })
    .collect()
}

/// `-w`, `-C`, `-M`, ...: one line per end with the options asked, as its kernel applied them
/// (read back), `not applied` for an agent that predates them.
fn socket_lines(s: &crate::model::EndsSocket) -> [String; 2] {
    let end = |who: &str, got: Option<&sonde_wire::AppliedSocketOptions>| {
        let Some(got) = got else {
            return format!("socket options, {who}: not applied (an agent older than them)");
        };
        let a = &s.asked;
        let unknown = || "?".to_owned();
        let size = |b: Option<u64>| b.map_or_else(unknown, super::units::fmt_size);
        let mut parts = Vec::new();
        if a.window_bytes.is_some() {
            parts.push(format!(
                "SO_SNDBUF {} SO_RCVBUF {}",
                size(got.send_buffer_bytes),
                size(got.recv_buffer_bytes)
            ));
        }
        if a.congestion.is_some() {
            parts.push(got.congestion.clone().unwrap_or_else(unknown));
        }
        if a.mss_bytes.is_some() {
            parts.push(format!(
                "MSS {}",
                got.mss_bytes.map_or_else(unknown, |m| format!("{m} B"))
            ));
        }
        if a.no_delay {
            parts.push(match got.no_delay {
                Some(true) => "TCP_NODELAY".to_owned(),
                _ => "Nagle on".to_owned(),
            });
        }
        if a.tos.is_some() {
            parts.push(got.tos.map_or_else(
                || "TOS ?".to_owned(),
                |t| format!("TOS {t:#04x} (DSCP {}, ECN {})", t >> 2, t & 0b11),
            ));
        }
        if a.dont_fragment {
            parts.push(match got.dont_fragment {
                Some(true) => "DF".to_owned(),
                _ => "no DF".to_owned(),
            });
        }
        if a.zerocopy {
            // Read back on the streams an end sends on; an end that only receives has none.
            parts.push(
                match got.zerocopy {
                    Some(true) => "SO_ZEROCOPY",
                    Some(false) => "no SO_ZEROCOPY",
                    None => "SO_ZEROCOPY - (does not send)",
                }
                .to_owned(),
            );
        }
        if a.pacing_bits_per_second.is_some() {
            if let Some(r) = got.pacing_bits_per_second {
                parts.push(format!(
                    "paced {} per stream",
                    super::units::fmt_rate(to_f64(r))
                ));
            }
        }
        format!("socket options, {who}: {}", parts.join(", "))
    };
    [
        end("client", Some(&s.client)),
        end("agent", s.server.as_ref()),
    ]
}

/// `--busy-poll`, `--cpu`: how one end waited and where it ran.
fn tuning_text(t: &sonde_wire::TuningReport) -> String {
    let wait = match (t.busy_poll, t.so_busy_poll_us) {
        (true, Some(us)) => format!("busy-polled (SO_BUSY_POLL {us} µs)"),
        (true, None) => "busy-polled (spin; no SO_BUSY_POLL)".to_owned(),
        (false, _) => "blocked in recv".to_owned(),
    };
    let cpus = if t.cpus.is_empty() {
        "unpinned".to_owned()
    } else {
        let list: Vec<String> = t.cpus.iter().map(u32::to_string).collect();
        format!("pinned to CPU {}", list.join(","))
    };
    format!("{wait}, {cpus}")
}

/// `--cpu` of throughput and pps: where each end's `what` (streams, flows) ran.
fn pinning_line(t: &crate::model::EndsTuning, what: &str) -> String {
    let cpus = |r: &sonde_wire::TuningReport| {
        if r.cpus.is_empty() {
            "unpinned".to_owned()
        } else {
            let list: Vec<String> = r.cpus.iter().map(u32::to_string).collect();
            format!("CPU {}", list.join(","))
        }
    };
    let agent = t
        .server
        .as_ref()
        .map_or_else(|| "unpinned (an older agent)".to_owned(), cpus);
    let mut text = format!(
        "{what} pinned (--cpu): this host's on {}, the agent's on {agent}",
        cpus(&t.client)
    );
    for note in [
        &t.client.note,
        &t.server.as_ref().and_then(|s| s.note.clone()),
    ]
    .into_iter()
    .flatten()
    {
        text.push_str(&format!(" ({note})"));
    }
    text
}

/// The first line of every table but quick's: what, where, which session, when.
fn header(out: &mut String, test: &str, meta: &Meta) {
    line(
        out,
        format!(
            "sonde {} {test}: server {}, session {}, started {}",
            meta.sonde_version,
            meta.server,
            meta.session,
            fmt_timestamp(meta.timestamp_unix_ms)
        ),
    );
    if !meta.labels.is_empty() {
        let labels: Vec<String> = meta
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        line(out, format!("labels: {}", labels.join(", ")));
    }
}

/// Overlap and warnings, after a blank line; nothing when there is neither. The label names the
/// quick case a meta belongs to (empty for a single run).
fn footer(out: &mut String, metas: &[(&str, &Meta)]) {
    let mut lines = Vec::new();
    for (label, m) in metas {
        let prefix = if label.is_empty() {
            String::new()
        } else {
            format!("{label}: ")
        };
        if m.overlapping_sessions > 0 {
            // The fact only: the client's warning says what it means for the numbers.
            lines.push(format!(
                "{prefix}overlapping sessions: {}",
                m.overlapping_sessions
            ));
        }
        for w in &m.warnings {
            lines.push(format!("warning: {prefix}{w}"));
        }
    }
    if !lines.is_empty() {
        out.push('\n');
        for l in lines {
            line(out, l);
        }
    }
}

fn line(out: &mut String, s: impl AsRef<str>) {
    out.push_str(s.as_ref());
    out.push('\n');
}

fn plural(n: u64) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

fn protocol_name(p: Protocol) -> &'static str {
    match p {
        Protocol::Tcp => "TCP",
        Protocol::Udp => "UDP",
    }
}

fn direction_name(d: &str) -> Cow<'_, str> {
    match d {
        "forward" => "forward (client → server)".into(),
        "reverse" => "reverse (server → client)".into(),
        "bidir" => "bidir (both directions at once)".into(),
        other => other.into(),
    }
}

fn dir_name(d: StreamDirection) -> &'static str {
    match d {
        StreamDirection::ClientToServer => "client → server",
        StreamDirection::ServerToClient => "server → client",
    }
}

fn is_bidir(r: &ThroughputResult) -> bool {
    r.direction == "bidir"
}

fn stream_id(i: u32) -> String {
    format!("[{i:>3}]")
}

/// A column of a [`Grid`]: alignment, and blanks before it (default: none before the first
/// column, two between columns).
#[derive(Clone, Copy)]
struct Col {
    right: bool,
    gap: Option<usize>,
}

impl Col {
    fn left() -> Self {
        Self {
            right: false,
            gap: None,
        }
    }

    fn right() -> Self {
        Self {
            right: true,
            gap: None,
        }
    }

    fn gap(self, gap: usize) -> Self {
        Self {
            gap: Some(gap),
            ..self
        }
    }

    /// The first column's gap.
    fn indent(self, indent: usize) -> Self {
        self.gap(indent)
    }
}

/// A text grid: columns padded to their widest cell, counted in `char`s (`µ` and `→` are one
/// column wide), trailing blanks trimmed.
struct Grid {
    cols: Vec<Col>,
    rows: Vec<Option<Vec<String>>>,
}

impl Grid {
    fn new(cols: Vec<Col>) -> Self {
        Self {
            cols,
            rows: Vec::new(),
        }
    }

    fn row(&mut self, cells: impl IntoIterator<Item = String>) {
        self.rows.push(Some(cells.into_iter().collect()));
    }

    /// An empty line between groups of rows.
    fn blank(&mut self) {
        self.rows.push(None);
    }

    fn render(&self, out: &mut String) {
        let mut widths = vec![0; self.cols.len()];
        for row in self.rows.iter().flatten() {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        for row in &self.rows {
            let Some(row) = row else {
                out.push('\n');
                continue;
            };
            let mut l = String::new();
            for (i, cell) in row.iter().enumerate() {
                let col = self.cols.get(i).copied().unwrap_or_else(Col::left);
                let pad = widths
                    .get(i)
                    .copied()
                    .unwrap_or(0)
                    .saturating_sub(cell.chars().count());
                let gap = col.gap.unwrap_or(if i == 0 { 0 } else { 2 });
                l.push_str(&" ".repeat(gap));
                if col.right {
                    l.push_str(&" ".repeat(pad));
                    l.push_str(cell);
                } else {
                    l.push_str(cell);
                    l.push_str(&" ".repeat(pad));
                }
            }
            line(out, l.trim_end());
        }
    }
}

/// One interval as a single line, for live display while a test runs (the final table aligns
/// all intervals in a block; this line is for a terminal, before the table exists).
pub fn interval_line(iv: &crate::model::IntervalResult) -> String {
    let bytes = Unit::for_largest(&BYTES, to_f64(iv.bytes));
    let rate = Unit::for_largest(&RATE, iv.bits_per_second);
    format!(
        "[SUM]  {:.2}-{:.2} sec  {:>12}  {:>14}  (counted at the receiver){}",
        ns_to_s(iv.start_ns),
        ns_to_s(iv.end_ns),
        bytes.fmt(to_f64(iv.bytes)),
        rate.fmt(iv.bits_per_second),
        if iv.omitted { "  (omitted)" } else { "" }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_pps_interval_line_states_span_datagrams_rate_and_where_counted() {
        let iv = crate::model::PpsInterval {
            start_ns: 1_000_000_000,
            end_ns: 2_000_000_000,
            received: 1_234_567,
            received_pps: 1_234_567.0,
            flow_received: vec![1_234_567],
            omitted: false,
            interface: None,
        };
        assert_eq!(
            pps_interval_line(&iv),
            "[SUM]  1.00-2.00 sec     1,234,567 datagrams     1,234,567 pps  (counted at the receiver)"
        );
    }

    #[test]
    fn a_live_interval_line_states_span_bytes_rate_and_where_counted() {
        let iv = crate::model::IntervalResult {
            start_ns: 1_000_000_000,
            end_ns: 2_000_000_000,
            bytes: 11_955_000,
            bits_per_second: 95_640_000.0,
            packets: 0,
            stream_bytes: vec![11_955_000],
            tcp_info: Vec::new(),
            omitted: false,
            interfaces: None,
        };
        assert_eq!(
            interval_line(&iv),
            "[SUM]  1.00-2.00 sec     11.40 MiB    95.64 Mbit/s  (counted at the receiver)"
        );
        // `-O`: an interval of the omit period says so, as iperf3's do.
        let omitted = crate::model::IntervalResult {
            omitted: true,
            ..iv
        };
        assert!(interval_line(&omitted).ends_with("(counted at the receiver)  (omitted)"));
    }
    use crate::fixtures;

    #[test]
    fn percentile_sample_bounds_are_ceil_10_over_1_minus_p() {
        let bounds: Vec<u64> = PERCENTILES.iter().map(Percentile::min_samples).collect();
        assert_eq!(bounds, [20, 100, 1_000, 10_000, 100_000, 1_000_000]);
    }

    fn row<'t>(table: &'t str, start: &str) -> &'t str {
        table
            .lines()
            .find(|l| l.starts_with(start))
            .unwrap_or_else(|| panic!("no line starting with {start:?} in\n{table}"))
    }

    #[test]
    fn unsupported_percentiles_say_how_many_samples_they_need() {
        let t = table(&fixtures::latency_tcp());
        assert!(row(&t, "  p99.99 ").ends_with(" 412.67 µs"), "{t}");
        assert!(
            row(&t, "  p99.999 ").ends_with(" n/a (needs ≥1,000,000 samples)"),
            "{t}"
        );
        let t = table(&fixtures::latency_with_warnings());
        assert!(
            row(&t, "  p99 ").ends_with(" n/a (needs ≥1,000 samples)"),
            "{t}"
        );
    }

    #[test]
    fn rtt_unit_follows_the_median() {
        let t = table(&fixtures::latency_tcp());
        assert!(row(&t, "  p50 ").ends_with(" 38.91 µs"), "{t}");
        assert!(row(&t, "  max ").ends_with(" 1204.22 µs"), "{t}");
        let t = table(&fixtures::latency_udp_lossy());
        assert!(row(&t, "  min ").ends_with(" 11.902 ms"), "{t}");
    }

    #[test]
    fn a_run_without_samples_says_so() {
        let TestResult::Latency(mut r) = fixtures::latency_tcp() else {
            unreachable!("a latency fixture")
        };
        r.samples = 0;
        r.rtt_ns.mean = f64::NAN;
        r.rtt_ns.stddev = f64::NAN;
        let t = table(&TestResult::Latency(r));
        assert!(t.contains("\nRTT (round trip): no samples\n"), "{t}");
        assert!(!t.contains("NaN"), "{t}");
    }

    #[test]
    fn every_table_ends_with_overlap_and_warnings() {
        let t = table(&fixtures::latency_with_warnings());
        let tail: Vec<&str> = t.lines().rev().take(3).collect();
        assert!(tail[0].starts_with("warning: only 850 samples"), "{t}");
        assert!(tail[1].starts_with("warning: the agent ran 2 other"), "{t}");
        assert_eq!(tail[2], "overlapping sessions: 2", "{t}");
        for (name, r) in fixtures::all() {
            let t = table(&r);
            assert!(t.ends_with('\n') && !t.ends_with("\n\n"), "{name}");
            if ![
                "latency_with_warnings",
                "crr_ports_exhausted",
                "mtu_router_said",
                "latency_many_flows_open",
            ]
            .contains(&name)
            {
                assert!(
                    !t.contains("warning") && !t.contains("overlapping"),
                    "{name}"
                );
            }
        }
    }

    #[test]
    fn quick_names_the_case_of_each_warning() {
        let TestResult::Quick(mut q) = fixtures::quick_all() else {
            unreachable!("a quick fixture")
        };
        q.results[1].result = fixtures::latency_with_warnings();
        let t = table(&TestResult::Quick(q));
        let tail: Vec<&str> = t.lines().rev().take(3).collect();
        assert!(
            tail[0].starts_with("warning: udp latency: only 850 samples"),
            "{t}"
        );
        assert_eq!(tail[2], "udp latency: overlapping sessions: 2", "{t}");
        assert!(row(&t, "udp latency ").contains(" p99 n/a, "), "{t}");
    }

    #[test]
    fn throughput_columns_share_one_rate_unit() {
        let t = table(&fixtures::throughput_bidir());
        assert!(
            t.lines()
                .filter(|l| l.starts_with('[') && !l.starts_with("[ ID]"))
                .all(|l| l.contains(" Gbit/s") && !l.contains("Mbit/s")),
            "{t}"
        );
        assert!(row(&t, "[  0]  client → server  0.00-1.00 sec").ends_with(" 0.923 Gbit/s"));
        // 998.76 Mbit/s received next to 1000.00 Mbit/s sent: both in Gbit/s, to the Mbit/s.
        let t = table(&fixtures::throughput_udp_reverse());
        assert!(row(&t, "[  0]").contains(" 0.999 Gbit/s "), "{t}");
        assert!(
            t.lines()
                .nth(7)
                .is_some_and(|l| l.contains(" 1.000 Gbit/s ")),
            "{t}"
        );
    }

    #[test]
    fn bidir_shows_each_direction() {
        let t = table(&fixtures::throughput_bidir());
        assert!(
            t.contains("throughput at the receiver: client → server 1.849 Gbit/s, server → client 3.694 Gbit/s"),
            "{t}"
        );
        assert!(
            row(&t, "[SUM]  client → server  2.00 sec").ends_with(" receiver"),
            "{t}"
        );
    }

    #[test]
    fn sender_rows_are_labelled() {
        let t = table(&fixtures::throughput_tcp_2_streams());
        assert!(row(&t, "[SUM]  3.00 sec").ends_with(" receiver"), "{t}");
        assert_eq!(t.matches("sender (handed to kernel)").count(), 3, "{t}");
        assert!(t.contains("  59  sender (handed to kernel)"), "{t}");
    }

    #[test]
    fn grid_aligns_by_chars() {
        let mut g = Grid::new(vec![Col::left(), Col::right(), Col::left().gap(1)]);
        g.row(["a".into(), "1.5".into(), "µs".into()]);
        g.blank();
        g.row(["long name".into(), "12.25".into(), String::new()]);
        let mut out = String::new();
        g.render(&mut out);
        assert_eq!(out, "a            1.5 µs\n\nlong name  12.25\n");
    }
}
