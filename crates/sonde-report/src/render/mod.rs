//! Renderers: pure functions from a result to text. They never print and never fail.
//!
//! - [`table`]: for people. Rates in SI units (1 Mbit/s = 10^6 bit/s), bytes in binary units
//!   (1 MiB = 2^20 B), times in µs or ms with one unit per table.
//! - [`json`]: the document itself, pretty-printed: the contract programs should read.
//! - [`csv`]: one header line, then one `summary` row per run and, for throughput, one `interval`
//!   row per receiver interval. Units are in the column names; an unknown value is an empty cell.

use std::borrow::Cow;
use std::collections::BTreeMap;

use crate::model::{
    FlowResult, LatencyMode, LatencyResult, Meta, PpsResult, Protocol, QuickResult, RttNs,
    SideTotals, StreamDirection, StreamResult, TestResult, ThroughputResult,
};

// ---------------------------------------------------------------------------------------------
// JSON

/// The document as pretty JSON, with a trailing newline.
///
/// A non-finite `f64` (NaN, infinity) comes out as `null`, which the schema rejects: producers
/// must not put one in the model.
pub fn json(result: &TestResult) -> String {
    // Serializing the model cannot fail: every map key is a string and no Serialize impl errors.
    let mut s = serde_json::to_string_pretty(result).expect("the result model always serializes");
    s.push('\n');
    s
}

// ---------------------------------------------------------------------------------------------
// Table

/// A table for people: the configuration, the figures with their units, then the overlap and the
/// warnings. Ends with a newline.
pub fn table(result: &TestResult) -> String {
    let mut out = String::new();
    match result {
        TestResult::Latency(r) => latency_table(r, &mut out),
        TestResult::Throughput(r) => throughput_table(r, &mut out),
        TestResult::Pps(r) => pps_table(r, &mut out),
        TestResult::Quick(r) => quick_table(r, &mut out),
    }
    out
}

/// The percentiles sonde states, with the smallest sample count that supports each:
/// `ceil(10 / (1 - p))`, sonde-engine's `rtt::percentile_supported` rule (ten samples at or beyond
/// the percentile). `p` is kept in parts per 100,000 so the bound is exact integer arithmetic
/// (in `f64`, 10 / (1 - 0.9) rounds up to 101).
const PERCENTILES: [(&str, u64, fn(&RttNs) -> Option<u64>); 6] = [
    ("p50", 50_000, |r| r.p50),
    ("p90", 90_000, |r| r.p90),
    ("p99", 99_000, |r| r.p99),
    ("p99.9", 99_900, |r| r.p999),
    ("p99.99", 99_990, |r| r.p9999),
    ("p99.999", 99_999, |r| r.p99999),
];

/// `ceil(10 / (1 - p))` for `p = parts / 100_000`.
const fn min_samples(parts_per_100k: u64) -> u64 {
    let rest = 100_000 - parts_per_100k;
    (1_000_000 + rest - 1) / rest
}

fn latency_table(r: &LatencyResult, out: &mut String) {
    header(out, "latency", &r.meta);
    let mut kv = Grid::new(&[Align::Left, Align::Left]);
    kv.row(["protocol".into(), protocol_name(r.protocol).to_owned()]);
    let mode = match r.mode {
        LatencyMode::ClosedLoop => "closed loop (one message in flight)".to_owned(),
        LatencyMode::OpenLoop => match r.rate_per_second {
            Some(rate) => format!(
                "open loop at {} msg/s (RTT from the scheduled send time)",
                fmt_count_f64(rate)
            ),
            None => "open loop (RTT from the scheduled send time)".to_owned(),
        },
    };
    kv.row(["mode".into(), mode]);
    kv.row([
        "message size".into(),
        format!("{} each way", fmt_size(u64::from(r.msg_size_bytes))),
    ]);
    let warmup = if r.warmup_ns == 0 && r.warmup_samples == 0 {
        "none".to_owned()
    } else {
        format!(
            "{} ({} samples excluded)",
            fmt_secs(r.warmup_ns),
            fmt_count(r.warmup_samples)
        )
    };
    kv.row([
        "duration".into(),
        format!("{} (warm-up included)", fmt_secs(r.duration_ns)),
    ]);
    kv.row(["warm-up".into(), warmup]);
    kv.row(["sent".into(), format!("{} messages", fmt_count(r.sent))]);
    kv.row(["samples".into(), fmt_count(r.samples)]);
    kv.render("", out);

    out.push('\n');
    if r.samples == 0 {
        line(out, "RTT (round trip): no samples");
    } else {
        let rtt = &r.rtt_ns;
        let unit = TimeUnit::for_typical(rtt.p50.map_or(rtt.mean, to_f64));
        line(
            out,
            format!("RTT (round trip), {}: not one-way latency", unit.suffix()),
        );
        let mut g = Grid::new(&[Align::Left, Align::Right, Align::Left]);
        let stat = |g: &mut Grid, name: &str, ns: f64| {
            g.row([
                name.to_owned(),
                ns_number(ns, unit),
                unit.suffix().to_owned(),
            ]);
        };
        stat(&mut g, "min", to_f64(rtt.min));
        stat(&mut g, "mean", rtt.mean);
        stat(&mut g, "stddev", rtt.stddev);
        for (name, parts, value) in PERCENTILES {
            match value(rtt) {
                Some(ns) => stat(&mut g, name, to_f64(ns)),
                None => {
                    let need = min_samples(parts);
                    let why = if r.samples < need {
                        format!("(needs ≥{} samples)", fmt_count(need))
                    } else {
                        String::new()
                    };
                    g.row([name.to_owned(), "n/a".to_owned(), why]);
                }
            }
        }
        stat(&mut g, "max", to_f64(rtt.max));
        g.render("  ", out);
    }

    let udp = r.protocol == Protocol::Udp;
    let open = r.mode == LatencyMode::OpenLoop;
    if udp || open {
        out.push('\n');
        let mut g = Grid::new(&[Align::Left, Align::Right, Align::Left]);
        if udp {
            let mut how = format!(
                "of {} sent ({})",
                fmt_count(r.sent),
                fmt_ratio(r.lost, r.sent)
            );
            if r.lost_outbound.is_some() || r.lost_return.is_some() {
                let part = |v: Option<u64>| v.map_or_else(|| "?".to_owned(), fmt_count);
                how = format!(
                    "{how}: {} requests lost on the way out, {} replies on the way back",
                    part(r.lost_outbound),
                    part(r.lost_return)
                );
            }
            g.row(["lost".into(), fmt_count(r.lost), how]);
            g.row([
                "duplicated".into(),
                fmt_count(r.duplicated),
                "replies received more than once".into(),
            ]);
            g.row([
                "reordered".into(),
                fmt_count(r.reordered),
                "replies that came after a later one".into(),
            ]);
        }
        if open {
            let (count, note) = match r.late_sends {
                Some(n) => (
                    fmt_count(n),
                    "sends that left >1 ms after their scheduled time".to_owned(),
                ),
                None => ("n/a".to_owned(), String::new()),
            };
            g.row(["late sends".into(), count, note]);
        }
        g.render("", out);
    }
    footer(out, &[("", &r.meta)]);
}

fn throughput_table(r: &ThroughputResult, out: &mut String) {
    header(out, "throughput", &r.meta);
    let udp = r.protocol == Protocol::Udp;
    let bidir = is_bidir(r);
    let plural = if r.parallel == 1 { "" } else { "s" };
    let per_dir = if bidir { " per direction" } else { "" };
    let unit_of_write = if udp { "datagrams" } else { "writes" };
    let mut config = format!(
        "{} {}, {} stream{plural}{per_dir}, {} {unit_of_write}, {} requested",
        protocol_name(r.protocol),
        direction_name(&r.direction),
        r.parallel,
        fmt_size(u64::from(r.msg_size_bytes)),
        fmt_secs(r.duration_ns),
    );
    if udp {
        match r.target_bits_per_second {
            Some(t) => config.push_str(&format!(", target {}", fmt_rate(to_f64(t)))),
            None => config.push_str(", no rate limit"),
        }
    }
    line(out, config);
    line(
        out,
        "units: bytes binary (1 MiB = 2^20 B), rates SI (1 Mbit/s = 10^6 bit/s)",
    );

    let many = r.streams.len() > 1;
    // Per-direction sums only add information when a direction has several streams.
    let dir_sums = bidir && r.parallel > 1;

    if !r.intervals.is_empty() {
        out.push('\n');
        line(out, "Intervals, counted at the receiver");
        let mut cols = vec![Align::Left];
        if bidir {
            cols.push(Align::Left);
        }
        cols.extend([Align::Right, Align::Left, Align::Right, Align::Right]);
        let mut g = Grid::new(&cols);
        let mut head = vec!["[ ID]".to_owned()];
        if bidir {
            head.push("Direction".into());
        }
        head.extend([
            "Interval".into(),
            String::new(),
            "Transfer".into(),
            "Bitrate".into(),
        ]);
        g.row(head);
        for iv in &r.intervals {
            let secs = iv.end_ns.saturating_sub(iv.start_ns);
            let span = format!("{:.2}-{:.2}", ns_to_s(iv.start_ns), ns_to_s(iv.end_ns));
            let mut push = |id: String, dir: &str, bytes: u64, bps: f64| {
                let mut row = vec![id];
                if bidir {
                    row.push(dir.to_owned());
                }
                row.extend([span.clone(), "sec".into(), fmt_bytes(bytes), fmt_rate(bps)]);
                g.row(row);
            };
            if many {
                for (i, s) in r.streams.iter().enumerate() {
                    let bytes = iv.stream_bytes.get(i).copied().unwrap_or(0);
                    let dir = stream_dir_name(s.direction);
                    push(stream_id(s.stream), dir, bytes, rate(bytes, secs));
                }
                if dir_sums {
                    for dir in [
                        StreamDirection::ClientToServer,
                        StreamDirection::ServerToClient,
                    ] {
                        let bytes = r
                            .streams
                            .iter()
                            .zip(&iv.stream_bytes)
                            .filter(|(s, _)| s.direction == dir)
                            .map(|(_, b)| *b)
                            .sum::<u64>();
                        push(
                            "[SUM]".into(),
                            stream_dir_name(dir),
                            bytes,
                            rate(bytes, secs),
                        );
                    }
                }
                let dir = if bidir { "both" } else { "" };
                push("[SUM]".into(), dir, iv.bytes, iv.bits_per_second);
            } else {
                let id = r.streams.first().map_or(0, |s| s.stream);
                let dir = r
                    .streams
                    .first()
                    .map_or("", |s| stream_dir_name(s.direction));
                push(stream_id(id), dir, iv.bytes, iv.bits_per_second);
            }
        }
        g.render("", out);
    }

    // Totals: per stream, receiver first (the figure to quote), then the sender's view.
    out.push('\n');
    line(
        out,
        "Totals: receiver = counted at the receiver (quote this); sender = handed to the kernel",
    );
    let jitter_unit = TimeUnit::for_typical(
        r.streams
            .iter()
            .filter_map(|s| s.jitter_ns)
            .chain(r.jitter_ns)
            .max()
            .map_or(0.0, to_f64),
    );
    let mut cols = vec![Align::Left];
    if bidir {
        cols.push(Align::Left);
    }
    cols.extend([Align::Right, Align::Left, Align::Right, Align::Right]);
    if udp {
        cols.extend([Align::Right, Align::Right, Align::Left]);
    } else {
        cols.extend([Align::Right, Align::Left]);
    }
    let mut g = Grid::new(&cols);
    let mut head = vec!["[ ID]".to_owned()];
    if bidir {
        head.push("Direction".into());
    }
    head.extend([
        "Time".into(),
        String::new(),
        "Transfer".into(),
        "Bitrate".into(),
    ]);
    if udp {
        head.extend(["Jitter".into(), "Lost/Total Datagrams".into()]);
    } else {
        head.push("Retr".into());
    }
    head.push("Side".into());
    g.row(head);

    let mut pair = |id: String, dir: &str, sum: &Sums| {
        let mut rx = vec![id.clone()];
        let mut tx = vec![id];
        if bidir {
            rx.push(dir.to_owned());
            tx.push(dir.to_owned());
        }
        for (row, side) in [(&mut rx, &sum.receiver), (&mut tx, &sum.sender)] {
            row.extend([
                format!("{:.2}", ns_to_s(side.duration_ns)),
                "sec".into(),
                fmt_bytes(side.bytes),
                fmt_rate(side.bits_per_second),
            ]);
        }
        if udp {
            rx.push(
                sum.jitter_ns
                    .map_or_else(|| "n/a".to_owned(), |j| fmt_ns(to_f64(j), jitter_unit)),
            );
            rx.push(match sum.lost {
                Some(lost) => format!(
                    "{}/{} ({})",
                    fmt_count(lost),
                    fmt_count(sum.sender.packets),
                    sum.loss_percent
                        .map_or_else(|| "n/a".to_owned(), fmt_percent)
                ),
                None => "n/a".to_owned(),
            });
            tx.extend([String::new(), String::new()]);
            rx.push("receiver".into());
            tx.push("sender (handed to kernel)".into());
        } else {
            rx.push(String::new());
            tx.push(sum.retransmits.map_or_else(|| "n/a".to_owned(), fmt_count));
            rx.push("receiver".into());
            tx.push("sender (handed to kernel)".into());
        }
        g.row(rx);
        g.row(tx);
    };
    for s in &r.streams {
        pair(
            stream_id(s.stream),
            stream_dir_name(s.direction),
            &Sums::of_stream(s),
        );
    }
    let by_dir = [
        StreamDirection::ClientToServer,
        StreamDirection::ServerToClient,
    ]
    .map(|d| (d, Sums::of_direction(r, d)));
    if dir_sums {
        for (d, sum) in &by_dir {
            pair("[SUM]".into(), stream_dir_name(*d), sum);
        }
    }
    if many || r.streams.is_empty() {
        pair(
            "[SUM]".into(),
            if bidir { "both" } else { "" },
            &Sums::of_total(r),
        );
    }
    g.render("", out);

    if udp {
        let dup = r.duplicated.map_or_else(|| "n/a".to_owned(), fmt_count);
        let reo = r.reordered.map_or_else(|| "n/a".to_owned(), fmt_count);
        line(
            out,
            format!("datagrams duplicated {dup}, reordered {reo} (all streams, at the receiver)"),
        );
    }

    out.push('\n');
    if bidir {
        let [(_, up), (_, down)] = &by_dir;
        line(
            out,
            format!(
                "throughput at the receiver: {} client → server, {} server → client",
                fmt_rate(up.receiver.bits_per_second),
                fmt_rate(down.receiver.bits_per_second)
            ),
        );
    } else {
        line(
            out,
            format!(
                "throughput at the receiver: {}",
                fmt_rate(r.receiver.bits_per_second)
            ),
        );
    }
    footer(out, &[("", &r.meta)]);
}

/// One line pair of the throughput totals.
struct Sums {
    receiver: SideTotals,
    sender: SideTotals,
    lost: Option<u64>,
    loss_percent: Option<f64>,
    jitter_ns: Option<u64>,
    retransmits: Option<u64>,
}

impl Sums {
    fn of_stream(s: &StreamResult) -> Self {
        Self {
            receiver: s.receiver.clone(),
            sender: s.sender.clone(),
            lost: s.lost,
            loss_percent: s.loss_percent,
            jitter_ns: s.jitter_ns,
            retransmits: s.retransmits,
        }
    }

    fn of_total(r: &ThroughputResult) -> Self {
        Self {
            receiver: r.receiver.clone(),
            sender: r.sender.clone(),
            lost: r.lost,
            loss_percent: r.loss_percent,
            jitter_ns: r.jitter_ns,
            retransmits: r.retransmits,
        }
    }

    /// One direction of a bidir test, summed here (the document has no such totals). Like
    /// iperf3's SUM: bytes over the longest stream's active time.
    fn of_direction(r: &ThroughputResult, dir: StreamDirection) -> Self {
        let streams: Vec<&StreamResult> = r.streams.iter().filter(|s| s.direction == dir).collect();
        let side = |pick: fn(&StreamResult) -> &SideTotals| {
            let bytes = streams.iter().map(|s| pick(s).bytes).sum::<u64>();
            let duration_ns = streams
                .iter()
                .map(|s| pick(s).duration_ns)
                .max()
                .unwrap_or(0);
            SideTotals {
                bytes,
                bits_per_second: rate(bytes, duration_ns),
                packets: streams.iter().map(|s| pick(s).packets).sum(),
                duration_ns,
            }
        };
        let sum_opt = |pick: fn(&StreamResult) -> Option<u64>| {
            streams
                .iter()
                .map(|s| pick(s))
                .try_fold(0_u64, |acc, v| v.map(|v| acc + v))
        };
        let receiver = side(|s| &s.receiver);
        let sender = side(|s| &s.sender);
        let lost = sum_opt(|s| s.lost);
        let loss_percent = lost.map(|l| 100.0 * to_f64(l) / to_f64(sender.packets));
        Self {
            receiver,
            sender,
            lost,
            loss_percent: loss_percent.filter(|p| p.is_finite()),
            jitter_ns: streams.iter().filter_map(|s| s.jitter_ns).max(),
            retransmits: sum_opt(|s| s.retransmits),
        }
    }
}

fn pps_table(r: &PpsResult, out: &mut String) {
    header(out, "pps", &r.meta);
    line(
        out,
        format!(
            "{}, {} datagrams, {} requested, {} flow{}, sent with {}",
            protocol_name(r.protocol),
            fmt_size(u64::from(r.msg_size_bytes)),
            fmt_secs(r.duration_ns),
            r.flows.len(),
            if r.flows.len() == 1 { "" } else { "s" },
            r.send_method
        ),
    );
    out.push('\n');
    let mut g = Grid::new(&[
        Align::Left,
        Align::Right,
        Align::Right,
        Align::Right,
        Align::Right,
    ]);
    g.row([
        "[ ID]".into(),
        "Sent".into(),
        "Received".into(),
        "Lost".into(),
        "Loss".into(),
    ]);
    let mut row = |id: String, f: &FlowResult| {
        g.row([
            id,
            fmt_count(f.sent),
            fmt_count(f.received),
            fmt_count(f.lost),
            fmt_ratio(f.lost, f.sent),
        ]);
    };
    if r.flows.len() > 1 {
        for f in &r.flows {
            row(stream_id(f.flow), f);
        }
    }
    g.row([
        if r.flows.len() > 1 { "[SUM]" } else { "[ALL]" }.into(),
        fmt_count(r.sent),
        fmt_count(r.received),
        fmt_count(r.lost),
        fmt_percent(r.loss_percent),
    ]);
    g.render("", out);
    out.push('\n');
    let mut kv = Grid::new(&[Align::Left, Align::Right, Align::Left]);
    kv.row([
        "sent".into(),
        fmt_count_f64(r.sent_pps),
        "pps  sender: what it handed to the kernel".into(),
    ]);
    kv.row([
        "received".into(),
        fmt_count_f64(r.received_pps),
        "pps  counted by the receiving agent: quote this".into(),
    ]);
    kv.render("", out);
    footer(out, &[("", &r.meta)]);
}

fn quick_table(r: &QuickResult, out: &mut String) {
    let mut servers: Vec<&str> = Vec::new();
    for c in &r.results {
        if let Some(m) = c.result.meta() {
            if !servers.contains(&m.server.as_str()) {
                servers.push(&m.server);
            }
        }
    }
    let server = if servers.is_empty() {
        String::new()
    } else {
        format!(", server {}", servers.join(", "))
    };
    line(
        out,
        format!(
            "sonde {} quick: {} case{}{server}, started {}",
            r.sonde_version,
            r.results.len(),
            if r.results.len() == 1 { "" } else { "s" },
            fmt_timestamp(r.timestamp_unix_ms)
        ),
    );
    line(
        out,
        "figures counted at the receiver; rates SI (1 Mbit/s = 10^6 bit/s)",
    );
    out.push('\n');

    // One time unit for every RTT in the table, picked from the slowest median.
    let unit = TimeUnit::for_typical(
        r.results
            .iter()
            .filter_map(|c| match &c.result {
                TestResult::Latency(l) if l.samples > 0 => {
                    Some(l.rtt_ns.p50.map_or(l.rtt_ns.mean, to_f64))
                }
                _ => None,
            })
            .fold(0.0, f64::max),
    );
    let mut g = Grid::new(&[Align::Left, Align::Right, Align::Left, Align::Left]);
    g.row([
        "case".into(),
        "session".into(),
        "headline".into(),
        "details".into(),
    ]);
    for c in &r.results {
        let session = c
            .result
            .meta()
            .map_or_else(String::new, |m| m.session.to_string());
        let (headline, details) = quick_headline(&c.result, unit);
        g.row([c.case.clone(), session, headline, details]);
    }
    g.render("", out);
    let metas: Vec<(&str, &Meta)> = r
        .results
        .iter()
        .filter_map(|c| c.result.meta().map(|m| (c.case.as_str(), m)))
        .collect();
    footer(out, &metas);
}

/// A case's figure to quote and its context, for the quick table.
fn quick_headline(result: &TestResult, unit: TimeUnit) -> (String, String) {
    match result {
        TestResult::Latency(l) => {
            if l.samples == 0 {
                return ("RTT: no samples".into(), String::new());
            }
            let p =
                |v: Option<u64>| v.map_or_else(|| "n/a".to_owned(), |ns| fmt_ns(to_f64(ns), unit));
            let headline = format!(
                "RTT p50 {}, p99 {}, mean {}",
                p(l.rtt_ns.p50),
                p(l.rtt_ns.p99),
                fmt_ns(l.rtt_ns.mean, unit)
            );
            let mut details = format!(
                "{} {}",
                protocol_name(l.protocol),
                match l.mode {
                    LatencyMode::ClosedLoop => "closed loop",
                    LatencyMode::OpenLoop => "open loop",
                }
            );
            if l.protocol == Protocol::Udp {
                details.push_str(&format!(", lost {}", fmt_ratio(l.lost, l.sent)));
            }
            if let Some(late) = l.late_sends.filter(|n| *n > 0) {
                details.push_str(&format!(", {} late sends", fmt_count(late)));
            }
            (headline, details)
        }
        TestResult::Throughput(t) => {
            let headline = if is_bidir(t) {
                let up = Sums::of_direction(t, StreamDirection::ClientToServer);
                let down = Sums::of_direction(t, StreamDirection::ServerToClient);
                format!(
                    "{} up, {} down",
                    fmt_rate(up.receiver.bits_per_second),
                    fmt_rate(down.receiver.bits_per_second)
                )
            } else {
                fmt_rate(t.receiver.bits_per_second)
            };
            let mut details = format!(
                "{} {}, {} stream{}",
                protocol_name(t.protocol),
                t.direction,
                t.parallel,
                if t.parallel == 1 { "" } else { "s" }
            );
            if let Some(retr) = t.retransmits {
                details.push_str(&format!(", {} retransmits", fmt_count(retr)));
            }
            if let Some(loss) = t.loss_percent {
                details.push_str(&format!(", lost {}", fmt_percent(loss)));
            }
            if let Some(j) = t.jitter_ns {
                details.push_str(&format!(
                    ", jitter {}",
                    fmt_ns(to_f64(j), TimeUnit::for_typical(to_f64(j)))
                ));
            }
            (headline, details)
        }
        TestResult::Pps(p) => (
            format!("{} pps received", fmt_count_f64(p.received_pps)),
            format!(
                "{} B datagrams, lost {}",
                p.msg_size_bytes,
                fmt_percent(p.loss_percent)
            ),
        ),
        TestResult::Quick(q) => (format!("{} nested cases", q.results.len()), String::new()),
    }
}

/// First line of every table but quick's: what, where, which session, when.
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
}

/// Overlap and warnings, after a blank line; nothing when there is neither. `label` names the
/// quick case a meta belongs to ("" for a single run).
fn footer(out: &mut String, metas: &[(&str, &Meta)]) {
    let mut lines = Vec::new();
    for (label, m) in metas {
        let prefix = if label.is_empty() {
            String::new()
        } else {
            format!("{label}: ")
        };
        if m.overlapping_sessions > 0 {
            lines.push(format!(
                "{prefix}overlapping sessions: {} (the agent ran other tests during this one; \
                 they shared its CPU and links)",
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

fn stream_dir_name(d: StreamDirection) -> &'static str {
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

/// A text grid: columns padded to their widest cell (by `char`, so `µ` and `→` count as one),
/// two spaces apart, trailing blanks trimmed.
struct Grid {
    align: Vec<Align>,
    rows: Vec<Vec<String>>,
}

#[derive(Clone, Copy)]
enum Align {
    Left,
    Right,
}

impl Grid {
    fn new(align: &[Align]) -> Self {
        Self {
            align: align.to_vec(),
            rows: Vec::new(),
        }
    }

    fn row(&mut self, cells: impl IntoIterator<Item = String>) {
        self.rows.push(cells.into_iter().collect());
    }

    fn render(&self, indent: &str, out: &mut String) {
        let mut widths = vec![0; self.align.len()];
        for row in &self.rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        for row in &self.rows {
            let mut l = indent.to_owned();
            for (i, cell) in row.iter().enumerate() {
                if i > 0 {
                    l.push_str("  ");
                }
                let w = widths.get(i).copied().unwrap_or(0);
                let pad = " ".repeat(w.saturating_sub(cell.chars().count()));
                match self.align.get(i).copied().unwrap_or(Align::Left) {
                    Align::Left => {
                        l.push_str(cell);
                        l.push_str(&pad);
                    }
                    Align::Right => {
                        l.push_str(&pad);
                        l.push_str(cell);
                    }
                }
            }
            line(out, l.trim_end());
        }
    }
}

// ---------------------------------------------------------------------------------------------
// CSV

/// Columns every row starts with.
const CSV_HEAD: [&str; 7] = [
    "test",
    "row",
    "sonde_version",
    "timestamp_unix_ms",
    "server",
    "session",
    "overlapping_sessions",
];

const CSV_LATENCY: [&str; 25] = [
    "protocol",
    "mode",
    "rate_per_second",
    "msg_size_bytes",
    "duration_ns",
    "warmup_ns",
    "warmup_samples",
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

const CSV_THROUGHPUT: [&str; 22] = [
    "protocol",
    "direction",
    "parallel",
    "msg_size_bytes",
    "target_bits_per_second",
    "duration_ns",
    "interval_start_ns",
    "interval_end_ns",
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

const CSV_PPS: [&str; 10] = [
    "protocol",
    "msg_size_bytes",
    "duration_ns",
    "send_method",
    "sent",
    "received",
    "lost",
    "loss_percent",
    "sent_pps",
    "received_pps",
];

/// The columns of `result`'s CSV, in order.
///
/// Each test has its own fixed set, whatever the values: `test`, `row`, `sonde_version`,
/// `timestamp_unix_ms`, `server`, `session`, `overlapping_sessions`, the test's own columns, then
/// `warnings`. Quick starts with `case` and has the union of the three tests' columns (a column
/// shared by name, like `lost`, appears once and means the same thing).
pub fn csv_columns(result: &TestResult) -> Vec<&'static str> {
    let mut cols = Vec::new();
    if matches!(result, TestResult::Quick(_)) {
        cols.push("case");
    }
    cols.extend(CSV_HEAD);
    let own: &[&[&'static str]] = match result {
        TestResult::Latency(_) => &[&CSV_LATENCY],
        TestResult::Throughput(_) => &[&CSV_THROUGHPUT],
        TestResult::Pps(_) => &[&CSV_PPS],
        TestResult::Quick(_) => &[&CSV_LATENCY, &CSV_THROUGHPUT, &CSV_PPS],
    };
    for set in own {
        for c in *set {
            if !cols.contains(c) {
                cols.push(c);
            }
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

/// The data rows of [`csv`], each ending in a newline: one `summary` row per run (per case for
/// quick), followed by that run's `interval` rows (throughput with `-i`).
///
/// On interval rows, the run's configuration columns repeat, `interval_start_ns`,
/// `interval_end_ns`, `receiver_bytes`, `receiver_bits_per_second` and `receiver_packets` hold the
/// interval's figures (all streams, at the receiver), and the other figures are empty.
pub fn csv_rows(result: &TestResult) -> String {
    let cols = csv_columns(result);
    let mut rows = Vec::new();
    collect_rows(result, None, &mut rows);
    let mut out = String::new();
    for row in rows {
        let cells: Vec<Cow<'_, str>> = cols
            .iter()
            .map(|c| row.get(c).map_or(Cow::Borrowed(""), |v| csv_quote(v)))
            .collect();
        out.push_str(&cells.join(","));
        out.push('\n');
    }
    out
}

/// The result as CSV: [`csv_header`] then [`csv_rows`]. Lines end in `\n`; a cell is quoted
/// (RFC 4180) when it holds a comma, a quote or a line break.
pub fn csv(result: &TestResult) -> String {
    let mut s = csv_header(result);
    s.push_str(&csv_rows(result));
    s
}

type CsvRow = BTreeMap<&'static str, String>;

fn collect_rows(result: &TestResult, case: Option<&str>, rows: &mut Vec<CsvRow>) {
    let base = |test: &str, meta: &Meta| {
        let mut row = CsvRow::new();
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
        row
    };
    let warnings = |meta: &Meta| meta.warnings.join("; ");
    match result {
        TestResult::Latency(r) => {
            let mut row = base("latency", &r.meta);
            let mut put = |k: &'static str, v: String| {
                row.insert(k, v);
            };
            put("protocol", protocol_key(r.protocol).into());
            put(
                "mode",
                match r.mode {
                    LatencyMode::ClosedLoop => "closed_loop",
                    LatencyMode::OpenLoop => "open_loop",
                }
                .into(),
            );
            put("rate_per_second", opt_f64(r.rate_per_second));
            put("msg_size_bytes", r.msg_size_bytes.to_string());
            put("duration_ns", r.duration_ns.to_string());
            put("warmup_ns", r.warmup_ns.to_string());
            put("warmup_samples", r.warmup_samples.to_string());
            put("sent", r.sent.to_string());
            put("samples", r.samples.to_string());
            let rtt = &r.rtt_ns;
            put("rtt_min_ns", rtt.min.to_string());
            put("rtt_mean_ns", cell_f64(rtt.mean));
            put("rtt_stddev_ns", cell_f64(rtt.stddev));
            put("rtt_p50_ns", opt(rtt.p50));
            put("rtt_p90_ns", opt(rtt.p90));
            put("rtt_p99_ns", opt(rtt.p99));
            put("rtt_p999_ns", opt(rtt.p999));
            put("rtt_p9999_ns", opt(rtt.p9999));
            put("rtt_p99999_ns", opt(rtt.p99999));
            put("rtt_max_ns", rtt.max.to_string());
            put("lost", r.lost.to_string());
            put("lost_outbound", opt(r.lost_outbound));
            put("lost_return", opt(r.lost_return));
            put("duplicated", r.duplicated.to_string());
            put("reordered", r.reordered.to_string());
            put("late_sends", opt(r.late_sends));
            put("warnings", warnings(&r.meta));
            rows.push(row);
        }
        TestResult::Throughput(r) => {
            let mut config = base("throughput", &r.meta);
            config.insert("protocol", protocol_key(r.protocol).into());
            config.insert("direction", r.direction.clone());
            config.insert("parallel", r.parallel.to_string());
            config.insert("msg_size_bytes", r.msg_size_bytes.to_string());
            config.insert("target_bits_per_second", opt(r.target_bits_per_second));
            config.insert("duration_ns", r.duration_ns.to_string());

            let mut row = config.clone();
            let mut put = |k: &'static str, v: String| {
                row.insert(k, v);
            };
            put("receiver_bytes", r.receiver.bytes.to_string());
            put(
                "receiver_bits_per_second",
                cell_f64(r.receiver.bits_per_second),
            );
            put("receiver_packets", r.receiver.packets.to_string());
            put("receiver_duration_ns", r.receiver.duration_ns.to_string());
            put("sender_bytes", r.sender.bytes.to_string());
            put("sender_bits_per_second", cell_f64(r.sender.bits_per_second));
            put("sender_packets", r.sender.packets.to_string());
            put("sender_duration_ns", r.sender.duration_ns.to_string());
            put("lost", opt(r.lost));
            put("loss_percent", opt_f64(r.loss_percent));
            put("jitter_ns", opt(r.jitter_ns));
            put("duplicated", opt(r.duplicated));
            put("reordered", opt(r.reordered));
            put("retransmits", opt(r.retransmits));
            put("warnings", warnings(&r.meta));
            rows.push(row);

            for iv in &r.intervals {
                let mut row = config.clone();
                row.insert("row", "interval".into());
                row.insert("interval_start_ns", iv.start_ns.to_string());
                row.insert("interval_end_ns", iv.end_ns.to_string());
                row.insert("receiver_bytes", iv.bytes.to_string());
                row.insert("receiver_bits_per_second", cell_f64(iv.bits_per_second));
                row.insert("receiver_packets", iv.packets.to_string());
                rows.push(row);
            }
        }
        TestResult::Pps(r) => {
            let mut row = base("pps", &r.meta);
            let mut put = |k: &'static str, v: String| {
                row.insert(k, v);
            };
            put("protocol", protocol_key(r.protocol).into());
            put("msg_size_bytes", r.msg_size_bytes.to_string());
            put("duration_ns", r.duration_ns.to_string());
            put("send_method", r.send_method.clone());
            put("sent", r.sent.to_string());
            put("received", r.received.to_string());
            put("lost", r.lost.to_string());
            put("loss_percent", cell_f64(r.loss_percent));
            put("sent_pps", cell_f64(r.sent_pps));
            put("received_pps", cell_f64(r.received_pps));
            put("warnings", warnings(&r.meta));
            rows.push(row);
        }
        TestResult::Quick(q) => {
            for c in &q.results {
                let name = match case {
                    Some(outer) => format!("{outer} / {}", c.case),
                    None => c.case.clone(),
                };
                collect_rows(&c.result, Some(&name), rows);
            }
        }
    }
}

fn protocol_key(p: Protocol) -> &'static str {
    match p {
        Protocol::Tcp => "tcp",
        Protocol::Udp => "udp",
    }
}

fn opt(v: Option<u64>) -> String {
    v.map_or_else(String::new, |v| v.to_string())
}

fn opt_f64(v: Option<f64>) -> String {
    v.map_or_else(String::new, cell_f64)
}

/// Shortest exact decimal, never an exponent; empty for NaN and infinities (JSON's `null`).
fn cell_f64(v: f64) -> String {
    if v.is_finite() {
        v.to_string()
    } else {
        String::new()
    }
}

/// RFC 4180: quote a cell holding a comma, a quote or a line break; double inner quotes.
fn csv_quote(s: &str) -> Cow<'_, str> {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\"")).into()
    } else {
        s.into()
    }
}

// ---------------------------------------------------------------------------------------------
// Number formatting

/// The unit a table states times in: µs with 2 decimals while the typical value is under 1 ms,
/// ms with 3 decimals above.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TimeUnit {
    Micros,
    Millis,
}

impl TimeUnit {
    fn for_typical(ns: f64) -> Self {
        if ns < 1e6 {
            Self::Micros
        } else {
            Self::Millis
        }
    }

    fn suffix(self) -> &'static str {
        match self {
            Self::Micros => "µs",
            Self::Millis => "ms",
        }
    }
}

/// `ns` in `unit`, number only.
fn ns_number(ns: f64, unit: TimeUnit) -> String {
    match unit {
        TimeUnit::Micros => format!("{:.2}", ns / 1e3),
        TimeUnit::Millis => format!("{:.3}", ns / 1e6),
    }
}

/// `ns` in `unit`, with the unit: `38.91 µs`, `12.411 ms`.
fn fmt_ns(ns: f64, unit: TimeUnit) -> String {
    format!("{} {}", ns_number(ns, unit), unit.suffix())
}

/// A duration in seconds, 3 decimals: `10.000 s`.
fn fmt_secs(ns: u64) -> String {
    format!("{:.3} s", ns_to_s(ns))
}

fn ns_to_s(ns: u64) -> f64 {
    to_f64(ns) / 1e9
}

/// Scales `v` down by `base` until it prints below 1000 (after rounding to `decimals`).
fn scaled(v: f64, base: f64, units: &[&str], decimals: usize) -> String {
    // Compare what will be printed, so 999.999 goes up a unit instead of printing 1000.00.
    let shown = |v: f64| {
        let scale = 10_f64.powi(i32::try_from(decimals).unwrap_or(0));
        (v * scale).round() / scale
    };
    let mut v = v;
    let mut i = 0;
    while i + 1 < units.len() && shown(v) >= 1000.0 {
        v /= base;
        i += 1;
    }
    format!("{v:.decimals$} {}", units[i])
}

/// A rate in SI units (10^3 steps), 2 decimals: `941.52 Mbit/s`, `9.41 Gbit/s`.
fn fmt_rate(bits_per_second: f64) -> String {
    if !bits_per_second.is_finite() {
        return "n/a".to_owned();
    }
    scaled(
        bits_per_second,
        1000.0,
        &["bit/s", "Kbit/s", "Mbit/s", "Gbit/s", "Tbit/s"],
        2,
    )
}

/// A byte count in binary units (2^10 steps), 2 decimals: `1.65 GiB`; bytes as an integer.
fn fmt_bytes(bytes: u64) -> String {
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    scaled(
        to_f64(bytes),
        1024.0,
        &["B", "KiB", "MiB", "GiB", "TiB", "PiB"],
        2,
    )
}

/// A size the user chose (message, datagram): exact, `64 B`, `128 KiB`; `1500 B` stays bytes.
fn fmt_size(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

/// An integer with thousands separators: `1,234,567`.
fn fmt_count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A non-negative float rounded to an integer, with separators; `n/a` when not finite.
fn fmt_count_f64(v: f64) -> String {
    if !v.is_finite() || v < 0.0 {
        return "n/a".to_owned();
    }
    // In range: finite and non-negative; `as` saturates above u64::MAX.
    fmt_count(v.round() as u64)
}

/// A percentage with two significant digits below 1 % (so 1 in 10^7 does not print as 0),
/// two decimals above: `0%`, `0.012%`, `0.000010%`, `1.67%`.
fn fmt_percent(p: f64) -> String {
    if !p.is_finite() {
        return "n/a".to_owned();
    }
    if p == 0.0 {
        return "0%".to_owned();
    }
    if p >= 1.0 {
        return format!("{p:.2}%");
    }
    let decimals = ((-p.log10()).ceil() as usize + 1).min(9);
    format!("{p:.decimals$}%")
}

/// `part` as a percentage of `whole`.
fn fmt_ratio(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "n/a".to_owned();
    }
    fmt_percent(to_f64(part) * 100.0 / to_f64(whole))
}

/// `bytes` over `ns` in bits per second; NaN for an empty interval.
fn rate(bytes: u64, ns: u64) -> f64 {
    if ns == 0 {
        return f64::NAN;
    }
    to_f64(bytes) * 8.0 / (to_f64(ns) / 1e9)
}

/// Exact below 2^53, which covers every count and nanosecond figure sonde can measure.
fn to_f64(v: u64) -> f64 {
    v as f64
}

/// Milliseconds since the Unix epoch as `2024-05-01 12:00:00 UTC`.
fn fmt_timestamp(unix_ms: u64) -> String {
    let secs = unix_ms / 1000;
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian. Howard Hinnant's algorithm,
/// <https://howardhinnant.github.io/date_algorithms.html#civil_from_days>, for non-negative days.
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;

    #[test]
    fn rate_uses_si_steps() {
        assert_eq!(fmt_rate(0.0), "0.00 bit/s");
        assert_eq!(fmt_rate(999.0), "999.00 bit/s");
        assert_eq!(fmt_rate(1_000.0), "1.00 Kbit/s");
        assert_eq!(fmt_rate(941_520_000.0), "941.52 Mbit/s");
        assert_eq!(fmt_rate(9_412_000_000.0), "9.41 Gbit/s");
        // Rounds to 1000.00 in Mbit/s: go up a unit instead.
        assert_eq!(fmt_rate(999_999_000.0), "1.00 Gbit/s");
        assert_eq!(fmt_rate(400e12), "400.00 Tbit/s");
        assert_eq!(fmt_rate(f64::NAN), "n/a");
    }

    #[test]
    fn bytes_use_binary_steps() {
        assert_eq!(fmt_bytes(0), "0 B");
        assert_eq!(fmt_bytes(1023), "1023 B");
        assert_eq!(fmt_bytes(1024), "1.00 KiB");
        assert_eq!(fmt_bytes(1536), "1.50 KiB");
        assert_eq!(fmt_bytes(1_048_576), "1.00 MiB");
        assert_eq!(fmt_bytes(1_048_575), "1.00 MiB");
        assert_eq!(fmt_bytes(1_767_903_232), "1.65 GiB");
        assert_eq!(fmt_bytes(u64::MAX), "16384.00 PiB");
    }

    #[test]
    fn sizes_are_exact() {
        assert_eq!(fmt_size(64), "64 B");
        assert_eq!(fmt_size(1448), "1448 B");
        assert_eq!(fmt_size(131_072), "128 KiB");
        assert_eq!(fmt_size(1 << 20), "1 MiB");
    }

    #[test]
    fn ns_in_the_table_unit() {
        assert_eq!(TimeUnit::for_typical(999_999.0), TimeUnit::Micros);
        assert_eq!(TimeUnit::for_typical(1_000_000.0), TimeUnit::Millis);
        assert_eq!(fmt_ns(38_911.0, TimeUnit::Micros), "38.91 µs");
        assert_eq!(fmt_ns(800.0, TimeUnit::Micros), "0.80 µs");
        assert_eq!(fmt_ns(1_204_223.0, TimeUnit::Micros), "1204.22 µs");
        assert_eq!(fmt_ns(12_410_879.0, TimeUnit::Millis), "12.411 ms");
        assert_eq!(fmt_ns(31_231.0, TimeUnit::Millis), "0.031 ms");
    }

    #[test]
    fn counts_and_percentages() {
        assert_eq!(fmt_count(0), "0");
        assert_eq!(fmt_count(999), "999");
        assert_eq!(fmt_count(1000), "1,000");
        assert_eq!(fmt_count(1_234_567), "1,234,567");
        assert_eq!(fmt_count(u64::MAX), "18,446,744,073,709,551,615");
        assert_eq!(fmt_count_f64(1_180_342.4), "1,180,342");
        assert_eq!(fmt_percent(0.0), "0%");
        assert_eq!(fmt_percent(0.012_08), "0.012%");
        assert_eq!(fmt_percent(0.5), "0.50%");
        assert_eq!(fmt_percent(0.000_01), "0.000010%");
        assert_eq!(fmt_percent(1.666_7), "1.67%");
        assert_eq!(fmt_percent(100.0), "100.00%");
        assert_eq!(fmt_ratio(1, 0), "n/a");
        assert_eq!(fmt_ratio(50, 110_000), "0.045%");
    }

    #[test]
    fn timestamps_are_utc() {
        assert_eq!(fmt_timestamp(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(fmt_timestamp(1_714_564_800_000), "2024-05-01 12:00:00 UTC");
        assert_eq!(fmt_timestamp(951_782_400_000), "2000-02-29 00:00:00 UTC");
        assert_eq!(fmt_timestamp(4_102_444_799_999), "2099-12-31 23:59:59 UTC");
    }

    #[test]
    fn percentile_sample_bounds_are_ceil_10_over_1_minus_p() {
        let bounds: Vec<u64> = PERCENTILES
            .iter()
            .map(|(_, p, _)| min_samples(*p))
            .collect();
        assert_eq!(bounds, [20, 100, 1_000, 10_000, 100_000, 1_000_000]);
    }

    #[test]
    fn csv_quotes_only_what_needs_it() {
        assert_eq!(csv_quote("sendmmsg"), "sendmmsg");
        assert_eq!(csv_quote("a, b"), "\"a, b\"");
        assert_eq!(csv_quote("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(csv_quote("two\nlines"), "\"two\nlines\"");
        assert_eq!(cell_f64(f64::NAN), "");
        assert_eq!(cell_f64(39_870.4), "39870.4");
        assert_eq!(cell_f64(1e21), "1000000000000000000000");
    }

    #[test]
    fn every_csv_row_has_every_column_and_only_known_ones() {
        for (name, r) in fixtures::all() {
            let cols = csv_columns(&r);
            let mut rows = Vec::new();
            collect_rows(&r, None, &mut rows);
            assert!(!rows.is_empty(), "{name}");
            for row in &rows {
                for key in row.keys() {
                    assert!(cols.contains(key), "{name}: {key} is not a column");
                }
            }
            // A real CSV parser would see the same number of fields on every line.
            let text = csv(&r);
            for l in text.lines() {
                assert_eq!(split_csv_line(l).len(), cols.len(), "{name}: {l}");
            }
        }
    }

    /// Minimal RFC 4180 field splitter (no embedded line breaks), for the test above.
    fn split_csv_line(l: &str) -> Vec<String> {
        let mut fields = vec![String::new()];
        let mut quoted = false;
        let mut chars = l.chars().peekable();
        while let Some(c) = chars.next() {
            match (c, quoted) {
                ('"', true) if chars.peek() == Some(&'"') => {
                    chars.next();
                    fields.last_mut().expect("non-empty").push('"');
                }
                ('"', _) => quoted = !quoted,
                (',', false) => fields.push(String::new()),
                (c, _) => fields.last_mut().expect("non-empty").push(c),
            }
        }
        fields
    }

    #[test]
    fn quick_csv_has_a_case_column_and_every_case() {
        let text = csv(&fixtures::quick_all());
        let mut lines = text.lines();
        assert!(lines
            .next()
            .is_some_and(|h| h.starts_with("case,test,row,")));
        let cases: Vec<&str> = lines.map(|l| l.split(',').next().unwrap_or("")).collect();
        for c in [
            "tcp latency",
            "udp latency",
            "tcp throughput x2",
            "udp throughput reverse",
            "udp pps",
        ] {
            assert!(cases.contains(&c), "{c} missing from {cases:?}");
        }
        // Summary row plus three interval rows for the throughput case with intervals.
        assert_eq!(
            cases.iter().filter(|c| **c == "tcp throughput x2").count(),
            4
        );
    }

    #[test]
    fn json_is_the_document() {
        for (name, r) in fixtures::all() {
            let text = json(&r);
            assert!(text.ends_with("}\n"), "{name}");
            let back: TestResult = serde_json::from_str(&text).expect(name);
            assert_eq!(back, r, "{name}: JSON does not round-trip");
        }
    }

    #[test]
    fn table_survives_a_run_without_samples() {
        let TestResult::Latency(mut r) = fixtures::latency_tcp() else {
            unreachable!()
        };
        r.samples = 0;
        r.sent = 0;
        r.rtt_ns.mean = f64::NAN;
        r.rtt_ns.stddev = f64::NAN;
        let t = table(&TestResult::Latency(r));
        assert!(t.contains("RTT (round trip): no samples"), "{t}");
    }

    #[test]
    fn unsupported_percentiles_say_how_many_samples_they_need() {
        let t = table(&fixtures::latency_tcp());
        let row = t
            .lines()
            .find(|l| l.starts_with("  p99.999 "))
            .expect("a p99.999 row");
        assert!(row.ends_with(" n/a  (needs ≥1,000,000 samples)"), "{row}");
        assert!(!t.contains("needs ≥100,000"), "{t}");
        let t = table(&fixtures::latency_with_warnings());
        assert!(t.contains("(needs ≥1,000 samples)"), "{t}");
    }

    #[test]
    fn every_table_ends_with_overlap_and_warnings() {
        let t = table(&fixtures::latency_with_warnings());
        let tail: Vec<&str> = t.lines().rev().take(3).collect();
        assert!(tail[0].starts_with("warning: only 850 samples"), "{t}");
        assert!(tail[1].starts_with("warning: the agent ran 2 other"), "{t}");
        assert!(tail[2].starts_with("overlapping sessions: 2"), "{t}");
        assert!(!table(&fixtures::latency_tcp()).contains("warning"));
    }

    macro_rules! snapshots {
        ($($name:ident),* $(,)?) => {$(
            #[test]
            fn $name() {
                let r = fixtures::$name();
                insta::assert_snapshot!(concat!(stringify!($name), "_table"), table(&r));
                insta::assert_snapshot!(concat!(stringify!($name), "_json"), json(&r));
                insta::assert_snapshot!(concat!(stringify!($name), "_csv"), csv(&r));
            }
        )*};
    }

    snapshots!(
        latency_tcp,
        latency_udp_lossy,
        throughput_tcp_2_streams,
        throughput_udp_reverse,
        throughput_bidir,
        pps_2_flows,
        quick_all,
        latency_with_warnings,
    );
}
