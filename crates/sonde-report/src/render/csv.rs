//! CSV for spreadsheets and scripts: one header line, then rows. Units are in the column names,
//! numbers are plain (no separators, `.` decimal point, no exponent), an unknown value is an empty
//! cell, lines end in `\n`, and a cell is quoted (RFC 4180) when it holds a comma, a quote or a
//! line break.

pub(crate) mod context;
pub(crate) mod crr;
pub(crate) mod inner;

use std::borrow::Cow;

use crate::model::{
    CrrResult, LatencyMode, LatencyResult, LoadResult, Meta, MtuResult, PpsResult, Protocol,
    QuickResult, StreamDirection, SweepResult, TestResult, ThroughputResult,
};

/// Columns every row starts with (quick puts `case` before them).
const HEAD: [&str; 8] = [
    "test",
    "row",
    "sonde_version",
    "timestamp_unix_ms",
    "server",
    "session",
    "overlapping_sessions",
    "labels",
];

pub(crate) const LATENCY: [&str; 27] = [
    "protocol",
    "mode",
    "rate_per_second",
    "msg_size_bytes",
    "duration_ns",
    "warmup_ns",
    "warmup_samples",
    "interval_start_ns",
    "interval_end_ns",
    "sent",
    "samples",
    "rtt_min_ns",
    "rtt_mean_ns",
    "rtt_stddev_ns",
    "rtt_p50_ns",
    "rtt_p90_ns",
    "rtt_p99_ns",
    "rtt_p999_ns",
    "rtt_p9999_ns",
    "rtt_p99999_ns",
    "rtt_max_ns",
    "lost",
    "lost_outbound",
    "lost_return",
    "duplicated",
    "reordered",
    "late_sends",
];

/// A many-flow latency run's columns (`-P`, `--depth`): empty for the one-flow test.
pub(crate) const REQUEST_RESPONSE: [&str; 10] = [
    "flows",
    "depth",
    "response_size_bytes",
    "transactions",
    "transactions_per_second",
    "flow_min_per_second",
    "flow_max_per_second",
    "fairness",
    "rate_achieved_per_second",
    "unsent",
];

pub(crate) const THROUGHPUT: [&str; 26] = [
    "protocol",
    "direction",
    "parallel",
    "msg_size_bytes",
    "read_size_bytes",
    "target_bits_per_second",
    "duration_ns",
    "stream",
    "stream_direction",
    "interval_start_ns",
    "interval_end_ns",
    "omitted",
    "receiver_bytes",
    "receiver_bits_per_second",
    "receiver_packets",
    "receiver_duration_ns",
    "sender_bytes",
    "sender_bits_per_second",
    "sender_packets",
    "sender_duration_ns",
    "lost",
    "loss_percent",
    "jitter_ns",
    "duplicated",
    "reordered",
    "retransmits",
];

pub(crate) const PPS: [&str; 18] = [
    "protocol",
    "msg_size_bytes",
    "duration_ns",
    "send_method",
    "gso_mode",
    "gso_used",
    "gso_interface",
    "gso_reason",
    "flow",
    "interval_start_ns",
    "interval_end_ns",
    "omitted",
    "sent",
    "received",
    "lost",
    "loss_percent",
    "sent_pps",
    "received_pps",
];

/// The columns of `result`'s CSV, in order. Each test has a fixed set, whatever the values:
///
/// - first `test`, `row`, `sonde_version`, `timestamp_unix_ms`, `server`, `session`,
///   `overlapping_sessions`, `labels` (`KEY=VALUE` pairs by key, joined with `;`); last
///   `warnings` (joined with `; `);
/// - latency: `protocol`, `mode`, `rate_per_second`, `msg_size_bytes`, `duration_ns`,
///   `warmup_ns`, `warmup_samples`, `interval_start_ns`, `interval_end_ns` (`-i`: an `interval`
///   row per interval with its `samples` and RTT columns, and with `-P`/`--depth` its
///   `transactions_per_second`), `sent`, `samples`,
///   `rtt_{min,mean,stddev}_ns`, `rtt_p{50,90,99,999,9999,99999}_ns`, `rtt_max_ns`, `lost`,
///   `lost_outbound`, `lost_return`, `duplicated`, `reordered`, `late_sends`; then (latency and latency sweeps) the inner
///   view's `full_log_written`, `full_log_dropped`, `one_way_uncertainty_ns`, `clock_offset_ns`,
///   `clock_offset_uncertainty_ns`, `clock_drift_ppm`, `socket_rx_stamped`,
///   `socket_tx_stamped`, `histogram_le_ns`, `histogram_count`;
/// - throughput: `protocol`, `direction`, `parallel`, `msg_size_bytes`, `read_size_bytes`,
///   `target_bits_per_second`, `duration_ns`, `stream`, `stream_direction`, `interval_start_ns`,
///   `interval_end_ns`, `omitted` (an interval of the `-O` period), `receiver_{bytes,bits_per_second,packets,duration_ns}`,
///   `sender_{bytes,bits_per_second,packets,duration_ns}`, `lost`, `loss_percent`, `jitter_ns`,
///   `duplicated`, `reordered`, `retransmits`;
/// - pps: `protocol`, `msg_size_bytes`, `duration_ns`, `send_method`, `gso_mode`, `gso_used`,
///   `gso_interface`, `gso_reason` (the reason's code), `flow`, `interval_start_ns`,
///   `interval_end_ns`, `omitted` (`-i`: an `interval` row per interval with the flows' sum, and an
///   `interval_flow` row per flow with its `received`), `sent`, `received`, `lost`,
///   `loss_percent`, `sent_pps`, `received_pps`;
/// - crr: `protocol`, `workers`, `request_bytes`, `response_bytes`, `close`, `duration_ns`,
///   `interval_start_ns`, `interval_end_ns`, `connections_per_second` (the agent's), `agent_transactions`, `agent_duration_ns`,
///   `agent_failed`, `transactions`, `client_connections_per_second`, `client_duration_ns`,
///   `connects`, `connect_{min,mean,stddev}_ns`, `connect_p{50,90,99,999,9999,99999}_ns`,
///   `connect_max_ns`, the same ten `transaction_*_ns`, and `errors_{refused,timeout,reset,
///   addr_not_available,closed,other}`;
/// - quick: `case` first, then the union of the three (a name shared by two tests, like `lost`,
///   is one column with the same meaning);
/// - then, wherever a throughput result is, the TCP senders' `TCP_INFO`: `tcp_srtt_ns`,
///   `tcp_rttvar_ns`, `tcp_min_rtt_ns`, `tcp_cwnd_segments`, `tcp_ssthresh_segments`,
///   `tcp_mss_bytes`, `tcp_retransmits`, `tcp_unacked_segments`,
///   `tcp_pacing_rate_bits_per_second`, `tcp_delivery_rate_bits_per_second`,
///   `tcp_delivery_rate_app_limited`, `tcp_notsent_bytes`, `tcp_busy_ns`, `tcp_rwnd_limited_ns`,
///   `tcp_sndbuf_limited_ns`;
/// - then, for every test, each end's context (`client_` and `server_` each):
///   `{client,server}_host_name`, `_kernel_release`, `_cpu_wall_ns`, `_cpu_user_ns`,
///   `_cpu_system_ns`, `_cpu_percent_of_one_core`, `_voluntary_context_switches`,
///   `_involuntary_context_switches`, `_syscalls`, `_syscalls_per_message`, `_syscalls_per_byte`,
///   and after both ends' (client then server) `_context_switches_per_second`,
///   `_syscalls_per_second`, `_system_interrupts_per_second`,
///   `_system_context_switches_per_second`, `_system_syscalls_per_second`;
/// - conf: `side`, then every [`crate::HostInfo`] figure (`host_name` ... `udp_mem_max_pages`),
///   then the interface's (`interface`, `driver`, `speed_mbit_per_second`, `mtu_bytes`, `up`,
///   and each offload as `true`/`false`).
pub fn csv_columns(result: &TestResult) -> Vec<&'static str> {
    let mut cols = Vec::new();
    if result.kind().csv_has_case() {
        cols.push("case");
    }
    cols.extend(HEAD);
    let own = result.kind().csv_columns();
    for set in own {
        for c in *set {
            if !cols.contains(c) {
                cols.push(c);
            }
        }
    }
    for c in context::columns(result) {
        if !cols.contains(&c) {
            cols.push(c);
        }
    }
    cols.push("warnings");
    cols
}

/// The header line of [`csv`], with its newline.
pub fn csv_header(result: &TestResult) -> String {
    let mut s = csv_columns(result).join(",");
    s.push('\n');
    s
}

/// The data rows of [`csv`], each ending in a newline. Per run (per case for quick), in order:
///
/// - one `summary` row: the run's totals, as in the JSON document;
/// - throughput: one `stream` row per stream (`stream`, `stream_direction`, and that stream's
///   receiver, sender, loss, jitter and retransmit figures), then one `interval` row per receiver
///   interval (`interval_start_ns`, `interval_end_ns`, and all streams' `receiver_bytes`,
///   `receiver_bits_per_second`, `receiver_packets` in it);
/// - pps: one `flow` row per flow (`flow`, `sent`, `received`, `lost`);
/// - crr: one `interval` row per interval (`interval_start_ns`, `interval_end_ns`, and the
///   interval's `transactions`, `client_connections_per_second`, `connects`, `connect_p50_ns`,
///   `connect_p99_ns` and `errors_*`);
/// - latency with `--timestamps`, `--one-way` or `--histogram`: a row per distribution
///   (`socket_rtt`, `host`, `send_to_socket_rx`, `rx_host`, `forward`, `return`, `agent_hold`)
///   with it in the `rtt_*` columns, and one `histogram` row per bucket (`histogram_le_ns`,
///   `histogram_count`);
/// - TCP throughput: `stream` rows also carry the sender's last `TCP_INFO` (`tcp_*`), and one
///   `interval_stream` row per stream and interval that has one (`stream`, `interval_*`, that
///   stream's `receiver_bytes`, and the `tcp_*` its sender sampled at the interval's end);
/// - conf: one `host` row per end (`side` = `client` or `server`), then one `interface` row per
///   interface of each end.
///
/// The context columns (`client_*`, `server_*`) are on summary rows only.
///
/// The configuration columns (`protocol` to `duration_ns`) repeat on every row; a figure that
/// belongs to another kind of row is empty; `warnings` is on the summary row only.
pub fn csv_rows(result: &TestResult) -> String {
    let cols = csv_columns(result);
    let mut rows = Vec::new();
    result.kind().csv_rows(None, &mut rows);
    let mut out = String::new();
    for row in rows {
        let cells: Vec<Cow<'_, str>> = cols
            .iter()
            .map(|c| row.get(c).map_or(Cow::Borrowed(""), |v| quote(v)))
            .collect();
        out.push_str(&cells.join(","));
        out.push('\n');
    }
    out
}

/// The result as CSV: [`csv_header`] then [`csv_rows`]. To gather several runs of the same test
/// in one file, write the header once and append each run's rows.
pub fn csv(result: &TestResult) -> String {
    let mut s = csv_header(result);
    s.push_str(&csv_rows(result));
    s
}

type Row = crate::model::CsvRow;

/// A summary row's first cells: `case`, the test and the run's common facts.
fn base_row(test: &str, case: Option<&str>, meta: &Meta) -> Row {
    let mut row = Row::new();
    if let Some(case) = case {
        row.insert("case", case.to_owned());
    }
    row.insert("test", test.to_owned());
    row.insert("row", "summary".to_owned());
    row.insert("sonde_version", meta.sonde_version.clone());
    row.insert("timestamp_unix_ms", meta.timestamp_unix_ms.to_string());
    row.insert("server", meta.server.clone());
    row.insert("session", meta.session.to_string());
    row.insert(
        "overlapping_sessions",
        meta.overlapping_sessions.to_string(),
    );
    row.insert("labels", labels(&meta.labels));
    row
}

fn warnings(meta: &Meta) -> String {
    meta.warnings.join("; ")
}

/// A latency run's rows: the summary, then the inner view's (`--timestamps`, `--one-way`,
/// `--histogram`).
pub(crate) fn latency_rows(r: &LatencyResult, case: Option<&str>, rows: &mut Vec<Row>) {
    let base = |meta: &Meta| base_row("latency", case, meta);
    let mut row = base(&r.meta);
    row.extend([
        ("protocol", protocol(r.protocol).to_owned()),
        (
            "mode",
            match r.mode {
                LatencyMode::ClosedLoop => "closed_loop",
                LatencyMode::OpenLoop => "open_loop",
            }
            .to_owned(),
        ),
        ("rate_per_second", opt_f64(r.rate_per_second)),
        ("msg_size_bytes", r.msg_size_bytes.to_string()),
        ("duration_ns", r.duration_ns.to_string()),
        ("warmup_ns", r.warmup_ns.to_string()),
        ("warmup_samples", r.warmup_samples.to_string()),
        ("sent", r.sent.to_string()),
        ("samples", r.samples.to_string()),
        ("lost", r.lost.to_string()),
        ("lost_outbound", opt(r.lost_outbound)),
        ("lost_return", opt(r.lost_return)),
        ("duplicated", r.duplicated.to_string()),
        ("reordered", r.reordered.to_string()),
        ("late_sends", opt(r.late_sends)),
        ("warnings", warnings(&r.meta)),
    ]);
    row.extend(rtt_cells(&r.rtt_ns));
    row.extend(context::summary_cells(&r.meta));
    row.extend(inner::summary_cells(r));
    if let Some(rr) = &r.request_response {
        row.extend([
            ("flows", rr.flows.to_string()),
            ("depth", rr.depth.to_string()),
            ("response_size_bytes", rr.response_size_bytes.to_string()),
            ("transactions", rr.transactions.to_string()),
            (
                "transactions_per_second",
                num_f64(rr.transactions_per_second),
            ),
            ("flow_min_per_second", num_f64(rr.flow_min_per_second)),
            ("flow_max_per_second", num_f64(rr.flow_max_per_second)),
            ("fairness", num_f64(rr.fairness)),
        ]);
        // Open loop only: empty for the closed loop.
        if let Some(achieved) = rr.rate_achieved_per_second {
            row.insert("rate_achieved_per_second", num_f64(achieved));
        }
        if let Some(unsent) = rr.unsent {
            row.insert("unsent", unsent.to_string());
        }
    }
    let detail = inner::rows(&row, r);
    let mut config = base(&r.meta);
    config.extend(
        [
            "protocol",
            "mode",
            "rate_per_second",
            "msg_size_bytes",
            "duration_ns",
        ]
        .map(|c| (c, row[c].clone())),
    );
    rows.push(row);
    for iv in &r.intervals {
        let mut row = config.clone();
        row.extend([
            ("row", "interval".to_owned()),
            ("interval_start_ns", iv.start_ns.to_string()),
            ("interval_end_ns", iv.end_ns.to_string()),
            ("samples", iv.samples.to_string()),
        ]);
        if let Some(tps) = iv.transactions_per_second {
            row.insert("transactions_per_second", num_f64(tps));
        }
        if let Some(rtt) = &iv.rtt_ns {
            row.extend(rtt_cells(rtt));
        }
        rows.push(row);
    }
    rows.extend(detail);
}

/// The `rtt_*_ns` columns of a distribution.
fn rtt_cells(rtt: &crate::model::RttNs) -> [(&'static str, String); 10] {
    [
        ("rtt_min_ns", rtt.min.to_string()),
        ("rtt_mean_ns", num_f64(rtt.mean)),
        ("rtt_stddev_ns", num_f64(rtt.stddev)),
        ("rtt_p50_ns", opt(rtt.p50)),
        ("rtt_p90_ns", opt(rtt.p90)),
        ("rtt_p99_ns", opt(rtt.p99)),
        ("rtt_p999_ns", opt(rtt.p999)),
        ("rtt_p9999_ns", opt(rtt.p9999)),
        ("rtt_p99999_ns", opt(rtt.p99999)),
        ("rtt_max_ns", rtt.max.to_string()),
    ]
}

/// A throughput run's rows: the summary, then its streams, intervals and per-stream intervals.
pub(crate) fn throughput_rows(r: &ThroughputResult, case: Option<&str>, rows: &mut Vec<Row>) {
    let base = |meta: &Meta| base_row("throughput", case, meta);
    let mut config = base(&r.meta);
    config.extend([
        ("protocol", protocol(r.protocol).to_owned()),
        ("direction", r.direction.clone()),
        ("parallel", r.parallel.to_string()),
        ("msg_size_bytes", r.msg_size_bytes.to_string()),
        ("read_size_bytes", opt(r.read_size_bytes.map(u64::from))),
        ("target_bits_per_second", opt(r.target_bits_per_second)),
        ("duration_ns", r.duration_ns.to_string()),
    ]);
    let sides = |row: &mut Row, rx: &crate::SideTotals, tx: &crate::SideTotals| {
        row.extend([
            ("receiver_bytes", rx.bytes.to_string()),
            ("receiver_bits_per_second", num_f64(rx.bits_per_second)),
            ("receiver_packets", rx.packets.to_string()),
            ("receiver_duration_ns", rx.duration_ns.to_string()),
            ("sender_bytes", tx.bytes.to_string()),
            ("sender_bits_per_second", num_f64(tx.bits_per_second)),
            ("sender_packets", tx.packets.to_string()),
            ("sender_duration_ns", tx.duration_ns.to_string()),
        ]);
    };

    let mut row = config.clone();
    sides(&mut row, &r.receiver, &r.sender);
    row.extend([
        ("lost", opt(r.lost)),
        ("loss_percent", opt_f64(r.loss_percent)),
        ("jitter_ns", opt(r.jitter_ns)),
        ("duplicated", opt(r.duplicated)),
        ("reordered", opt(r.reordered)),
        ("retransmits", opt(r.retransmits)),
        ("warnings", warnings(&r.meta)),
    ]);
    row.extend(context::summary_cells(&r.meta));
    rows.push(row);

    for s in &r.streams {
        let mut row = config.clone();
        sides(&mut row, &s.receiver, &s.sender);
        row.extend([
            ("row", "stream".to_owned()),
            ("stream", s.stream.to_string()),
            (
                "stream_direction",
                match s.direction {
                    StreamDirection::ClientToServer => "client_to_server",
                    StreamDirection::ServerToClient => "server_to_client",
                }
                .to_owned(),
            ),
            ("lost", opt(s.lost)),
            ("loss_percent", opt_f64(s.loss_percent)),
            ("jitter_ns", opt(s.jitter_ns)),
            ("duplicated", opt(s.duplicated)),
            ("reordered", opt(s.reordered)),
            ("retransmits", opt(s.retransmits)),
        ]);
        row.extend(context::tcp_cells(s.tcp_info.as_ref()));
        rows.push(row);
    }

    for iv in &r.intervals {
        let mut row = config.clone();
        row.extend([
            ("row", "interval".to_owned()),
            ("interval_start_ns", iv.start_ns.to_string()),
            ("interval_end_ns", iv.end_ns.to_string()),
            ("omitted", iv.omitted.to_string()),
            ("receiver_bytes", iv.bytes.to_string()),
            ("receiver_bits_per_second", num_f64(iv.bits_per_second)),
            ("receiver_packets", iv.packets.to_string()),
        ]);
        rows.push(row);
    }
    context::interval_stream_rows(&config, r, rows);
}

/// A crr run's rows: the summary, then its intervals.
pub(crate) fn crr_rows(r: &CrrResult, case: Option<&str>, rows: &mut Vec<Row>) {
    let base = |meta: &Meta| base_row("crr", case, meta);
    let mut row = base(&r.meta);
    row.extend(crr::cells(r));
    row.insert("warnings", warnings(&r.meta));
    row.extend(context::summary_cells(&r.meta));
    rows.push(row);
    rows.extend(crr::interval_rows(&base(&r.meta), r));
}

/// The columns of a `sonde mtu` run, after the common head.
pub(crate) const MTU_COLUMNS: [&str; 16] = [
    "ip_version",
    "path_mtu_bytes",
    "udp_payload_bytes",
    "ip_header_bytes",
    "interface_mtu_bytes",
    "ceiling_bytes",
    "upper_bound",
    "smallest_refused_bytes",
    "probes_sent",
    "search_ns",
    "kernel_path_mtu_bytes",
    "agent_dont_fragment",
    "complete",
    "client_mss_bytes",
    "agent_mss_bytes",
    "tcp_completed",
];

/// A `sonde mtu` run's row: its summary (the probes are in the JSON).
pub(crate) fn mtu_rows(r: &MtuResult, case: Option<&str>, rows: &mut Vec<Row>) {
    let o = |v: Option<u32>| opt(v.map(u64::from));
    let mut row = base_row("mtu", case, &r.meta);
    row.extend([
        ("ip_version", r.ip_version.to_string()),
        ("path_mtu_bytes", o(r.path_mtu_bytes)),
        ("udp_payload_bytes", o(r.udp_payload_bytes)),
        ("ip_header_bytes", r.ip_header_bytes.to_string()),
        ("interface_mtu_bytes", o(r.interface_mtu_bytes)),
        ("ceiling_bytes", r.ceiling_bytes.to_string()),
        ("upper_bound", enum_name(&r.upper_bound)),
        ("smallest_refused_bytes", o(r.smallest_refused_bytes)),
        ("probes_sent", r.probes_sent.to_string()),
        ("search_ns", r.search_ns.to_string()),
        ("kernel_path_mtu_bytes", o(r.kernel_path_mtu_bytes)),
        (
            "agent_dont_fragment",
            r.agent_dont_fragment
                .map_or_else(String::new, |b| b.to_string()),
        ),
        ("complete", r.complete.to_string()),
        (
            "client_mss_bytes",
            o(r.tcp.as_ref().and_then(|t| t.client_mss_bytes)),
        ),
        (
            "agent_mss_bytes",
            o(r.tcp.as_ref().and_then(|t| t.agent_mss_bytes)),
        ),
        (
            "tcp_completed",
            r.tcp
                .as_ref()
                .map_or_else(String::new, |t| t.completed.to_string()),
        ),
    ]);
    row.insert("warnings", warnings(&r.meta));
    row.extend(context::summary_cells(&r.meta));
    rows.push(row);
}

/// A pps run's rows: the summary, then its flows and intervals.
pub(crate) fn pps_rows(r: &PpsResult, case: Option<&str>, rows: &mut Vec<Row>) {
    let base = |meta: &Meta| base_row("pps", case, meta);
    let mut config = base(&r.meta);
    config.extend([
        ("protocol", protocol(r.protocol).to_owned()),
        ("msg_size_bytes", r.msg_size_bytes.to_string()),
        ("duration_ns", r.duration_ns.to_string()),
        ("send_method", r.send_method.clone()),
        ("gso_mode", enum_name(&r.gso.mode)),
        ("gso_used", r.gso.used.to_string()),
        ("gso_interface", r.gso.interface.clone().unwrap_or_default()),
        ("gso_reason", enum_name(&r.gso.reason)),
    ]);
    let mut row = config.clone();
    row.extend([
        ("sent", r.sent.to_string()),
        ("received", r.received.to_string()),
        ("lost", r.lost.to_string()),
        ("loss_percent", num_f64(r.loss_percent)),
        ("sent_pps", num_f64(r.sent_pps)),
        ("received_pps", num_f64(r.received_pps)),
        ("warnings", warnings(&r.meta)),
    ]);
    row.extend(context::summary_cells(&r.meta));
    rows.push(row);
    for f in &r.flows {
        let mut row = config.clone();
        row.extend([
            ("row", "flow".to_owned()),
            ("flow", f.flow.to_string()),
            ("sent", f.sent.to_string()),
            ("received", f.received.to_string()),
            ("lost", f.lost.to_string()),
        ]);
        rows.push(row);
    }
    for iv in &r.intervals {
        let mut row = config.clone();
        row.extend([
            ("row", "interval".to_owned()),
            ("interval_start_ns", iv.start_ns.to_string()),
            ("interval_end_ns", iv.end_ns.to_string()),
            ("omitted", iv.omitted.to_string()),
            ("received", iv.received.to_string()),
            ("received_pps", num_f64(iv.received_pps)),
        ]);
        rows.push(row);
        for (f, received) in r.flows.iter().zip(&iv.flow_received) {
            let mut row = config.clone();
            row.extend([
                ("row", "interval_flow".to_owned()),
                ("flow", f.flow.to_string()),
                ("interval_start_ns", iv.start_ns.to_string()),
                ("interval_end_ns", iv.end_ns.to_string()),
                ("received", received.to_string()),
            ]);
            rows.push(row);
        }
    }
}

/// A load run's rows: the idle and loaded probes, what the load added, then the load.
pub(crate) fn load_rows(l: &LoadResult, _case: Option<&str>, rows: &mut Vec<Row>) {
    latency_rows(&l.idle, Some("idle"), rows);
    latency_rows(&l.loaded, Some("loaded"), rows);
    // What the load added, in the RTT columns of the two rows above.
    let a = &l.added_rtt_ns;
    let signed = |v: Option<i64>| v.map_or_else(String::new, |v| v.to_string());
    let mut row = Row::new();
    row.insert("case", "added (loaded - idle)".to_owned());
    row.insert("test", "load".to_owned());
    row.insert("row", "added".to_owned());
    row.insert("sonde_version", l.sonde_version.clone());
    row.insert("timestamp_unix_ms", l.timestamp_unix_ms.to_string());
    row.extend([
        ("rtt_min_ns", signed(a.min)),
        ("rtt_mean_ns", num_f64_opt(a.mean)),
        ("rtt_p50_ns", signed(a.p50)),
        ("rtt_p90_ns", signed(a.p90)),
        ("rtt_p99_ns", signed(a.p99)),
        ("rtt_p999_ns", signed(a.p999)),
        ("rtt_max_ns", signed(a.max)),
    ]);
    rows.push(row);
    throughput_rows(&l.load, Some("load"), rows);
}

/// A sweep's rows: each step's, its case `PARAM=VALUE`.
pub(crate) fn sweep_rows(w: &SweepResult, _case: Option<&str>, rows: &mut Vec<Row>) {
    for step in &w.steps {
        let name = format!("{}={}", w.parameter, step.value);
        step.result.kind().csv_rows(Some(&name), rows);
    }
}

/// Quick's rows: each case's, its case the case's name (after the outer one's).
pub(crate) fn quick_rows(q: &QuickResult, case: Option<&str>, rows: &mut Vec<Row>) {
    for c in &q.results {
        let name = match case {
            Some(outer) => Cow::Owned(format!("{outer} / {}", c.case)),
            None => Cow::Borrowed(c.case.as_str()),
        };
        c.result.kind().csv_rows(Some(&name), rows);
    }
}

fn protocol(p: Protocol) -> &'static str {
    match p {
        Protocol::Tcp => "tcp",
        Protocol::Udp => "udp",
    }
}

/// A unit enum's name as the JSON document spells it.
fn enum_name<T: serde::Serialize>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::String(s)) => s,
        _ => String::new(),
    }
}

fn opt(v: Option<u64>) -> String {
    v.map_or_else(String::new, |v| v.to_string())
}

fn opt_f64(v: Option<f64>) -> String {
    v.map_or_else(String::new, num_f64)
}

/// The shortest decimal that reads back as the same `f64`, never with an exponent; empty for
/// NaN and infinities (which JSON writes as `null`).
fn num_f64_opt(v: Option<f64>) -> String {
    v.map_or_else(String::new, num_f64)
}

fn num_f64(v: f64) -> String {
    if v.is_finite() {
        v.to_string()
    } else {
        String::new()
    }
}

/// RFC 4180: quote a cell holding a comma, a quote or a line break; double inner quotes.
fn quote(s: &str) -> Cow<'_, str> {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\"")).into()
    } else {
        s.into()
    }
}

/// `KEY=VALUE` pairs, by key, joined with `;`.
fn labels(labels: &crate::model::Labels) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(";")
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::fixtures;

    #[test]
    fn quotes_only_what_needs_it() {
        assert_eq!(quote("sendmsg+UDP_SEGMENT"), "sendmsg+UDP_SEGMENT");
        assert_eq!(quote("[2001:db8::1]:5300"), "[2001:db8::1]:5300");
        assert_eq!(quote("a, b"), "\"a, b\"");
        assert_eq!(quote("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(quote("two\nlines"), "\"two\nlines\"");
    }

    #[test]
    fn floats_are_plain_and_exact() {
        assert_eq!(num_f64(f64::NAN), "");
        assert_eq!(num_f64(f64::INFINITY), "");
        assert_eq!(num_f64(39_870.4), "39870.4");
        assert_eq!(num_f64(10_000.0), "10000");
        assert_eq!(num_f64(1e21), "1000000000000000000000");
        let v = 9_419_435_212.581_635;
        assert_eq!(num_f64(v).parse::<f64>().ok(), Some(v));
    }

    /// Minimal RFC 4180 record splitter (no line breaks inside cells), for the tests.
    fn fields(line: &str) -> Vec<String> {
        let mut fields = vec![String::new()];
        let mut quoted = false;
        let mut chars = line.chars().peekable();
        while let Some(c) = chars.next() {
            let cur = fields.last_mut().expect("never empty");
            match c {
                '"' if quoted && chars.peek() == Some(&'"') => {
                    chars.next();
                    cur.push('"');
                }
                '"' => quoted = !quoted,
                ',' if !quoted => fields.push(String::new()),
                c => cur.push(c),
            }
        }
        fields
    }

    /// The CSV as records keyed by column name.
    fn records(text: &str) -> Vec<BTreeMap<String, String>> {
        let mut lines = text.lines();
        let header = fields(lines.next().expect("a header"));
        lines
            .map(|l| {
                let f = fields(l);
                assert_eq!(f.len(), header.len(), "{l}");
                header.iter().cloned().zip(f).collect()
            })
            .collect()
    }

    #[test]
    fn every_row_has_every_column_and_only_known_ones() {
        for (name, r) in fixtures::all() {
            let cols = csv_columns(&r);
            let mut rows = Vec::new();
            r.kind().csv_rows(None, &mut rows);
            for row in &rows {
                for key in row.keys() {
                    assert!(cols.contains(key), "{name}: {key} is not a column");
                }
            }
            assert_eq!(records(&csv(&r)).len(), rows.len(), "{name}");
        }
    }

    #[test]
    fn throughput_has_summary_stream_and_interval_rows() {
        let recs = records(&csv(&fixtures::throughput_tcp_2_streams()));
        let kinds: Vec<&str> = recs.iter().map(|r| r["row"].as_str()).collect();
        assert_eq!(
            kinds,
            ["summary", "stream", "stream", "interval", "interval", "interval"]
        );
        assert_eq!(recs[0]["receiver_bytes"], "3533701120");
        assert_eq!(recs[0]["retransmits"], "59");
        assert_eq!(recs[2]["stream"], "1");
        assert_eq!(recs[2]["retransmits"], "42");
        assert_eq!(recs[3]["interval_start_ns"], "0");
        assert_eq!(recs[3]["receiver_bits_per_second"], "9361686528");
        assert_eq!(recs[3]["sender_bytes"], "", "no sender figure per interval");
        assert!(recs.iter().all(|r| r["parallel"] == "2"));
    }

    /// `latency -i`: a row per interval with its samples and RTTs (empty where no reply came),
    /// the run's configuration repeated, the summary first; `-O`: the omitted intervals marked.
    #[test]
    fn latency_intervals_and_omitted_intervals_have_rows() {
        let TestResult::Latency(mut r) = fixtures::latency_tcp() else {
            unreachable!()
        };
        let rtt = r.rtt_ns.clone();
        r.intervals = vec![
            crate::model::LatencyInterval {
                start_ns: SEC_NS,
                end_ns: 2 * SEC_NS,
                samples: 25_000,
                rtt_ns: Some(rtt),
                transactions_per_second: None,
            },
            crate::model::LatencyInterval {
                start_ns: 2 * SEC_NS,
                end_ns: 3 * SEC_NS,
                samples: 0,
                rtt_ns: None,
                transactions_per_second: None,
            },
        ];
        let recs = records(&csv(&TestResult::Latency(r)));
        let kinds: Vec<&str> = recs.iter().map(|r| r["row"].as_str()).collect();
        assert_eq!(kinds, ["summary", "interval", "interval"]);
        assert_eq!(recs[0]["interval_start_ns"], "");
        assert_eq!(recs[1]["interval_start_ns"], "1000000000");
        assert_eq!(recs[1]["samples"], "25000");
        assert_eq!(recs[1]["rtt_p50_ns"], recs[0]["rtt_p50_ns"]);
        assert_eq!(recs[1]["protocol"], "tcp");
        assert_eq!(recs[1]["lost"], "", "no loss figure per interval");
        assert_eq!(recs[2]["samples"], "0");
        assert_eq!(recs[2]["rtt_p50_ns"], "");

        let TestResult::Throughput(mut t) = fixtures::throughput_tcp_2_streams() else {
            unreachable!()
        };
        t.intervals[0].omitted = true;
        let recs = records(&csv(&TestResult::Throughput(t)));
        let omitted: Vec<&str> = recs
            .iter()
            .filter(|r| r["row"] == "interval")
            .map(|r| r["omitted"].as_str())
            .collect();
        assert_eq!(omitted, ["true", "false", "false"]);
        assert_eq!(recs[0]["omitted"], "", "the summary is not an interval");
    }

    const SEC_NS: u64 = 1_000_000_000;

    #[test]
    fn nulls_are_empty_and_warnings_are_quoted() {
        let recs = records(&csv(&fixtures::latency_with_warnings()));
        assert_eq!(recs.len(), 1);
        assert_eq!(recs[0]["rtt_p90_ns"], "72191");
        assert_eq!(recs[0]["rtt_p99_ns"], "");
        assert_eq!(recs[0]["lost_outbound"], "");
        assert_eq!(
            recs[0]["warnings"],
            "the agent ran 2 other session(s) during this test: they shared its CPU and network, \
             so these numbers are not those of an idle path; only 850 samples: p99 and above are \
             not stated (\"-t\" longer?)"
        );
    }

    #[test]
    fn quick_has_a_case_column_and_every_case() {
        let text = csv(&fixtures::quick_all());
        assert!(text.starts_with("case,test,row,"));
        let recs = records(&text);
        let summaries: Vec<(&str, &str)> = recs
            .iter()
            .filter(|r| r["row"] == "summary")
            .map(|r| (r["case"].as_str(), r["test"].as_str()))
            .collect();
        assert_eq!(
            summaries,
            [
                ("tcp latency", "latency"),
                ("udp latency", "latency"),
                ("tcp throughput x2", "throughput"),
                ("udp throughput reverse", "throughput"),
                ("udp pps", "pps"),
            ]
        );
        let pps = recs
            .iter()
            .find(|r| r["case"] == "udp pps" && r["row"] == "summary")
            .expect("the pps summary");
        assert_eq!(pps["lost"], "210045");
        assert_eq!(pps["rtt_p50_ns"], "");
    }
}
