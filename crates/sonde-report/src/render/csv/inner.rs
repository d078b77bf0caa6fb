//! Latency's inner view in CSV. The summary row gains the full log's counts, the one-way
//! uncertainty and the clock estimate; each distribution gets a row of its own whose `rtt_*`
//! columns hold it (as the `added` row of `sonde load` does):
//!
//! - `socket_rtt`, `host`, `send_to_socket_rx`, `rx_host` (`--timestamps`; see the JSON's
//!   `socket_rtt` for what each is);
//! - `forward`, `return`, `agent_hold` (`--one-way`), in signed ns;
//! - one `histogram` row per bucket (`--histogram`): `histogram_le_ns`, `histogram_count`.
//!
//! A distribution that could not be measured has no row (the JSON has `null` and a warning
//! says why).

use super::{num_f64, opt, Row};
use crate::model::{LatencyResult, RttNs, SignedNs};

/// The columns, after the latency ones: a latency run's and a latency sweep's (the
/// subcommands that take `--histogram`, `--timestamps`, `--one-way`, `--full-log`).
pub(crate) const COLUMNS: [&str; 10] = [
    "full_log_written",
    "full_log_dropped",
    "one_way_uncertainty_ns",
    "clock_offset_ns",
    "clock_offset_uncertainty_ns",
    "clock_drift_ppm",
    "socket_rx_stamped",
    "socket_tx_stamped",
    "histogram_le_ns",
    "histogram_count",
];

/// The summary row's cells.
pub(super) fn summary_cells(r: &LatencyResult) -> Vec<(&'static str, String)> {
    let mut cells = Vec::new();
    if let Some(log) = &r.full_log {
        cells.push(("full_log_written", log.written.to_string()));
        cells.push(("full_log_dropped", log.dropped.to_string()));
    }
    if let Some(ow) = &r.one_way {
        cells.push(("one_way_uncertainty_ns", opt(ow.uncertainty_ns)));
        if let Some(c) = &ow.clock {
            cells.push(("clock_offset_ns", c.offset_ns.to_string()));
            cells.push((
                "clock_offset_uncertainty_ns",
                c.offset_uncertainty_ns.to_string(),
            ));
            cells.push(("clock_drift_ppm", num_f64(c.drift_ppm)));
        }
    }
    if let Some(s) = &r.socket_rtt {
        cells.push(("socket_rx_stamped", s.rx_stamped.to_string()));
        cells.push(("socket_tx_stamped", s.tx_stamped.to_string()));
    }
    cells
}

/// The configuration columns a distribution row repeats from its summary row.
const CONFIG: [&str; 13] = [
    "case",
    "test",
    "sonde_version",
    "timestamp_unix_ms",
    "server",
    "session",
    "overlapping_sessions",
    "protocol",
    "mode",
    "rate_per_second",
    "msg_size_bytes",
    "duration_ns",
    "warmup_ns",
];

/// The distribution and histogram rows that follow `summary` (the run's summary row, whose
/// configuration columns they repeat).
pub(super) fn rows(summary: &Row, r: &LatencyResult) -> Vec<Row> {
    let config: Row = summary
        .iter()
        .filter(|(k, _)| CONFIG.contains(k))
        .map(|(k, v)| (*k, v.clone()))
        .collect();
    let mut rows = Vec::new();
    let mut push = |name: &'static str, cells: Vec<(&'static str, String)>| {
        let mut row = config.clone();
        row.insert("row", name.to_owned());
        row.extend(cells);
        rows.push(row);
    };
    if let Some(s) = &r.socket_rtt {
        for (name, d) in [
            ("socket_rtt", &s.socket_rtt_ns),
            ("host", &s.host_ns),
            ("send_to_socket_rx", &s.send_to_socket_rx_ns),
            ("rx_host", &s.rx_host_ns),
        ] {
            if let Some(d) = d {
                push(name, unsigned(d));
            }
        }
    }
    if let Some(ow) = &r.one_way {
        for (name, d) in [("forward", &ow.forward_ns), ("return", &ow.return_ns)] {
            if let Some(d) = d {
                push(name, signed(d));
            }
        }
        if let Some(d) = &ow.agent_hold_ns {
            push("agent_hold", unsigned(d));
        }
    }
    for b in r.rtt_histogram.iter().flatten() {
        push(
            "histogram",
            vec![
                ("histogram_le_ns", b.le_ns.to_string()),
                ("histogram_count", b.count.to_string()),
            ],
        );
    }
    rows
}

fn unsigned(d: &RttNs) -> Vec<(&'static str, String)> {
    vec![
        ("rtt_min_ns", d.min.to_string()),
        ("rtt_mean_ns", num_f64(d.mean)),
        ("rtt_stddev_ns", num_f64(d.stddev)),
        ("rtt_p50_ns", opt(d.p50)),
        ("rtt_p90_ns", opt(d.p90)),
        ("rtt_p99_ns", opt(d.p99)),
        ("rtt_p999_ns", opt(d.p999)),
        ("rtt_p9999_ns", opt(d.p9999)),
        ("rtt_p99999_ns", opt(d.p99999)),
        ("rtt_max_ns", d.max.to_string()),
    ]
}

fn signed(d: &SignedNs) -> Vec<(&'static str, String)> {
    let o = |v: Option<i64>| v.map_or_else(String::new, |v| v.to_string());
    vec![
        ("rtt_min_ns", d.min.to_string()),
        ("rtt_mean_ns", num_f64(d.mean)),
        ("rtt_stddev_ns", num_f64(d.stddev)),
        ("rtt_p50_ns", o(d.p50)),
        ("rtt_p90_ns", o(d.p90)),
        ("rtt_p99_ns", o(d.p99)),
        ("rtt_p999_ns", o(d.p999)),
        ("rtt_p9999_ns", o(d.p9999)),
        ("rtt_p99999_ns", o(d.p99999)),
        ("rtt_max_ns", d.max.to_string()),
    ]
}
