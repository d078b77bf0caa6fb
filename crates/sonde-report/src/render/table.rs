//! The table for people.

mod context;
mod crr;
pub(super) mod helpers;
mod inner;

use std::borrow::Cow;

use super::units::{
    fmt_bytes, fmt_count, fmt_count_f64, fmt_ns, fmt_ns_auto, fmt_percent, fmt_rate, fmt_ratio,
    fmt_secs, fmt_size, fmt_timestamp, ns_number, ns_to_s, rate, to_f64, TimeUnit, Unit, BYTES,
    RATE,
};
use crate::model::{
    FlowResult, GsoMode, LatencyMode, LatencyResult, LoadResult, Meta, PpsResult, Protocol,
    QuickResult, RttNs, SideTotals, StreamDirection, StreamResult, SweepResult, TestResult,
    ThroughputResult,
};

/// A table for people: a header line (test, server, session, start), the configuration, the
/// figures with their units, then the overlap and the warnings. Ends with a newline.
///
/// Rates are in SI units (1 Mbit/s = 10^6 bit/s), bytes in binary units (1 MiB = 2^20 B), both
/// with one unit per column; RTTs in µs, or ms when the median is 1 ms or more. A percentile the
/// sample count cannot support reads `n/a (needs ≥N samples)`.
pub fn table(result: &TestResult) -> String {
    let mut out = String::new();
    match result {
        TestResult::Latency(r) => latency(r, &mut out),
        TestResult::Throughput(r) => throughput(r, &mut out),
        TestResult::Pps(r) => pps(r, &mut out),
        TestResult::Crr(r) => crr::crr(r, &mut out),
        TestResult::Quick(r) => quick(r, &mut out),
        TestResult::Load(r) => load(r, &mut out),
        TestResult::Sweep(r) => sweep(r, &mut out),
        TestResult::Conf(r) => context::conf(r, &mut out),
    }
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

fn latency(r: &LatencyResult, out: &mut String) {
    header(out, "latency", &r.meta);
    let mut kv = Grid::new(vec![Col::left(), Col::left()]);
    kv.row(["protocol".into(), protocol_name(r.protocol).into()]);
    let mode = match (r.mode, r.rate_per_second) {
        (LatencyMode::ClosedLoop, _) => "closed loop (one message in flight)".to_owned(),
        (LatencyMode::OpenLoop, Some(rate)) => format!(
            "open loop, {} msg/s scheduled (RTT counted from the scheduled send time)",
            fmt_count_f64(rate)
        ),
        (LatencyMode::OpenLoop, None) => {
            "open loop (RTT counted from the scheduled send time)".to_owned()
        }
    };
    kv.row(["mode".into(), mode]);
    kv.row([
        "message size".into(),
        format!("{} each way", fmt_size(u64::from(r.msg_size_bytes))),
    ]);
    kv.row([
        "duration".into(),
        format!("{}, warm-up included", fmt_secs(r.duration_ns)),
    ]);
    let warmup = if r.warmup_ns == 0 && r.warmup_samples == 0 {
        "none".to_owned()
    } else {
        format!(
            "{}, {} samples left out",
            fmt_secs(r.warmup_ns),
            fmt_count(r.warmup_samples)
        )
    };
    kv.row(["warm-up".into(), warmup]);
    kv.row(["sent".into(), format!("{} messages", fmt_count(r.sent))]);
    kv.row(["samples".into(), format!("{} RTTs", fmt_count(r.samples))]);
    if let Some(t) = &r.tuning {
        kv.row(["client".into(), tuning_text(&t.client)]);
        let agent = t.server.as_ref().map_or_else(
            || "blocked in recv, unpinned (an older agent)".to_owned(),
            tuning_text,
        );
        kv.row(["agent".into(), agent]);
    }
    inner::config_rows(r, &mut kv);
    kv.render(out);

    out.push('\n');
    if r.samples == 0 {
        line(out, "RTT (round trip): no samples");
    } else {
        line(out, "RTT (round trip), not one-way latency");
        let rtt = &r.rtt_ns;
        let unit = TimeUnit::for_typical(rtt.p50.map_or(rtt.mean, to_f64));
        let mut g = Grid::new(vec![
            Col::left().indent(2),
            Col::right(),
            Col::left().gap(1),
        ]);
        let stat = |g: &mut Grid, name: &str, ns: f64| {
            g.row([name.into(), ns_number(ns, unit), unit.suffix().into()]);
        };
        stat(&mut g, "min", to_f64(rtt.min));
        stat(&mut g, "mean", rtt.mean);
        stat(&mut g, "stddev", rtt.stddev);
        for p in &PERCENTILES {
            match (p.value)(rtt) {
                Some(ns) => stat(&mut g, p.label, to_f64(ns)),
                None => {
                    let need = p.min_samples();
                    let why = if r.samples < need {
                        format!("(needs ≥{} samples)", fmt_count(need))
                    } else {
                        String::new()
                    };
                    g.row([p.label.into(), "n/a".into(), why]);
                }
            }
        }
        stat(&mut g, "max", to_f64(rtt.max));
        g.render(out);
    }
    inner::sections(r, out);

    let udp = r.protocol == Protocol::Udp;
    let open = r.mode == LatencyMode::OpenLoop;
    if udp || open {
        out.push('\n');
        let mut g = Grid::new(vec![Col::left(), Col::right(), Col::left().gap(1)]);
        if udp {
            g.row([
                "lost".into(),
                fmt_count(r.lost),
                format!(
                    "of {} sent ({})",
                    fmt_count(r.sent),
                    fmt_ratio(r.lost, r.sent)
                ),
            ]);
            if let Some(n) = r.lost_outbound {
                g.row([
                    "  outbound".into(),
                    fmt_count(n),
                    "requests that never reached the agent".into(),
                ]);
            }
            if let Some(n) = r.lost_return {
                g.row([
                    "  return".into(),
                    fmt_count(n),
                    "replies lost on the way back".into(),
                ]);
            }
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
            match r.late_sends {
                Some(n) => g.row([
                    "late sends".into(),
                    fmt_count(n),
                    "left more than 1 ms after their scheduled time".into(),
                ]),
                None => g.row(["late sends".into(), "n/a".into(), String::new()]),
            }
        }
        g.render(out);
    }
    helpers::section(r.helpers.as_ref(), helpers::Shares::Latency, out);
    context::blocks(out, &r.meta);
    footer(out, &[("", &r.meta)]);
}

fn throughput(r: &ThroughputResult, out: &mut String) {
    header(out, "throughput", &r.meta);
    let udp = r.protocol == Protocol::Udp;
    let bidir = is_bidir(r);
    let mut config = format!(
        "{} {}, {} stream{}{}, {} {}, {} requested",
        protocol_name(r.protocol),
        direction_name(&r.direction),
        r.parallel,
        plural(u64::from(r.parallel)),
        if bidir { " each way" } else { "" },
        fmt_size(u64::from(r.msg_size_bytes)),
        if udp { "datagrams" } else { "writes" },
        fmt_secs(r.duration_ns),
    );
    if udp {
        match r.target_bits_per_second {
            Some(t) => config.push_str(&format!(", target {}", fmt_rate(to_f64(t)))),
            None => config.push_str(", no rate limit"),
        }
    }
    // The default (512 KiB) goes unsaid; a size asked for is part of what was measured.
    if let Some(read) = r
        .read_size_bytes
        .filter(|&b| b != sonde_wire::DEFAULT_TCP_READ_SIZE)
    {
        config.push_str(&format!(", read {} per call", fmt_size(u64::from(read))));
    }
    line(out, config);
    if let Some(t) = &r.tuning {
        line(out, pinning_line(t, "streams"));
    }
    line(
        out,
        "units: bytes binary (1 MiB = 2^20 B), rates SI (1 Mbit/s = 10^6 bit/s)",
    );

    let many = r.streams.len() > 1;
    // Per-direction sums add information only when a direction has several streams.
    let dir_sums = bidir && r.parallel > 1;
    let by_dir = [
        StreamDirection::ClientToServer,
        StreamDirection::ServerToClient,
    ]
    .map(|d| (d, Sums::of_direction(r, d)));

    // One rate unit for the whole table, so a column never mixes Mbit/s and Gbit/s.
    let rate_unit = Unit::for_largest(
        &RATE,
        r.intervals
            .iter()
            .map(|iv| iv.bits_per_second)
            .chain([r.receiver.bits_per_second, r.sender.bits_per_second])
            .filter(|v| v.is_finite())
            .fold(0.0, f64::max),
    );

    // The columns both blocks share: [ ID], direction (bidir), time span, "sec".
    let lead = |first: &str| {
        let mut cols = vec![Col::left()];
        let mut head = vec!["[ ID]".to_owned()];
        if bidir {
            cols.push(Col::left());
            head.push("Direction".into());
        }
        cols.extend([Col::right(), Col::left().gap(1)]);
        head.extend([first.to_owned(), String::new()]);
        (cols, head)
    };

    if !r.intervals.is_empty() {
        out.push('\n');
        line(
            out,
            format!("Intervals, {}", r.intervals_counted_at.describe()),
        );
        let bytes_unit = Unit::for_largest(
            &BYTES,
            r.intervals
                .iter()
                .map(|iv| to_f64(iv.bytes))
                .fold(0.0, f64::max),
        );
        let (mut cols, mut head) = lead("Interval");
        cols.extend([Col::right(), Col::right()]);
        head.extend(["Transfer".into(), "Bitrate".into()]);
        // TCP: each stream's smoothed RTT at the interval's end, from its sender's TCP_INFO.
        let srtt_col = r.intervals.iter().any(|iv| !iv.tcp_info.is_empty());
        if srtt_col {
            cols.push(Col::right());
            head.push("sRTT".into());
        }
        let srtt_of =
            |iv: &crate::model::IntervalResult, stream: u32| context::interval_srtt(iv, stream);
        let mut g = Grid::new(cols);
        g.row(head);
        for (n, iv) in r.intervals.iter().enumerate() {
            if many && n > 0 {
                g.blank();
            }
            let span_ns = iv.end_ns.saturating_sub(iv.start_ns);
            let span = format!("{:.2}-{:.2}", ns_to_s(iv.start_ns), ns_to_s(iv.end_ns));
            let mut push = |id: String, dir: &str, bytes: u64, bps: f64, srtt: String| {
                let mut row = vec![id];
                if bidir {
                    row.push(dir.to_owned());
                }
                row.extend([
                    span.clone(),
                    "sec".into(),
                    bytes_unit.fmt(to_f64(bytes)),
                    rate_unit.fmt(bps),
                ]);
                if srtt_col {
                    row.push(srtt);
                }
                g.row(row);
            };
            if !many {
                let id = r.streams.first().map_or(0, |s| s.stream);
                let dir = r.streams.first().map_or("", |s| dir_name(s.direction));
                let srtt = srtt_of(iv, id);
                push(stream_id(id), dir, iv.bytes, iv.bits_per_second, srtt);
                continue;
            }
            for (i, s) in r.streams.iter().enumerate() {
                let bytes = iv.stream_bytes.get(i).copied().unwrap_or(0);
                push(
                    stream_id(s.stream),
                    dir_name(s.direction),
                    bytes,
                    rate(bytes, span_ns),
                    srtt_of(iv, s.stream),
                );
            }
            if dir_sums {
                for (dir, _) in &by_dir {
                    let bytes = r
                        .streams
                        .iter()
                        .zip(&iv.stream_bytes)
                        .filter(|(s, _)| s.direction == *dir)
                        .map(|(_, b)| *b)
                        .sum::<u64>();
                    let bps = rate(bytes, span_ns);
                    push("[SUM]".into(), dir_name(*dir), bytes, bps, String::new());
                }
            }
            let dir = if bidir { "both" } else { "" };
            push(
                "[SUM]".into(),
                dir,
                iv.bytes,
                iv.bits_per_second,
                String::new(),
            );
        }
        g.render(out);
    }

    out.push('\n');
    line(out, "Totals");
    let bytes_unit = Unit::for_largest(&BYTES, to_f64(r.receiver.bytes.max(r.sender.bytes)));
    let jitter_unit = TimeUnit::for_typical(
        r.streams
            .iter()
            .filter_map(|s| s.jitter_ns)
            .chain(r.jitter_ns)
            .max()
            .map_or(0.0, to_f64),
    );
    let (mut cols, mut head) = lead("Time");
    cols.extend([Col::right(), Col::right()]);
    head.extend(["Transfer".into(), "Bitrate".into()]);
    if udp {
        cols.extend([Col::right(), Col::right()]);
        head.extend(["Jitter".into(), "Lost/Total Datagrams".into()]);
    } else {
        cols.push(Col::right());
        head.push("Retr".into());
    }
    // TCP: each stream's sender's TCP_INFO when it stopped sending.
    let tcp_cols = !udp && r.streams.iter().any(|s| s.tcp_info.is_some());
    if tcp_cols {
        cols.extend([Col::right(), Col::right()]);
        head.extend(["sRTT".into(), "Cwnd".into()]);
    }
    cols.push(Col::left());
    head.push(String::new());
    let mut g = Grid::new(cols);
    g.row(head);
    // `tcp`: a stream's sRTT and Cwnd cells; `None` for sums.
    let mut pair = |id: String, dir: &str, sum: &Sums, tcp: Option<[String; 2]>| {
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
                bytes_unit.fmt(to_f64(side.bytes)),
                rate_unit.fmt(side.bits_per_second),
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
        } else {
            rx.push(String::new());
            tx.push(sum.retransmits.map_or_else(|| "n/a".to_owned(), fmt_count));
        }
        if tcp_cols {
            rx.extend([String::new(), String::new()]);
            tx.extend(tcp.unwrap_or_default());
        }
        rx.push(RECEIVER.into());
        tx.push(SENDER.into());
        g.row(rx);
        g.row(tx);
    };
    for s in &r.streams {
        pair(
            stream_id(s.stream),
            dir_name(s.direction),
            &Sums::of_stream(s),
            Some(context::srtt_cwnd(s.tcp_info.as_ref())),
        );
    }
    if dir_sums {
        for (dir, sum) in &by_dir {
            pair("[SUM]".into(), dir_name(*dir), sum, None);
        }
    }
    if many || r.streams.is_empty() {
        let dir = if bidir { "both" } else { "" };
        pair("[SUM]".into(), dir, &Sums::of_total(r), None);
    }
    g.render(out);
    if udp {
        line(
            out,
            format!(
                "datagrams duplicated: {}, reordered: {} (all streams, at the receiver)",
                r.duplicated.map_or_else(|| "n/a".to_owned(), fmt_count),
                r.reordered.map_or_else(|| "n/a".to_owned(), fmt_count)
            ),
        );
    }

    out.push('\n');
    let headline = if bidir {
        let [(_, up), (_, down)] = &by_dir;
        format!(
            "client → server {}, server → client {}",
            rate_unit.fmt(up.receiver.bits_per_second),
            rate_unit.fmt(down.receiver.bits_per_second)
        )
    } else {
        format!(
            "{} ({} in {})",
            rate_unit.fmt(r.receiver.bits_per_second),
            fmt_bytes(r.receiver.bytes),
            fmt_secs(r.receiver.duration_ns)
        )
    };
    let mut headline = format!("throughput at the receiver: {headline}");
    if let Some(loss) = r.loss_percent {
        headline.push_str(&format!(", {} lost", fmt_percent(loss)));
    }
    line(out, headline);
    helpers::section(r.helpers.as_ref(), helpers::Shares::Throughput, out);
    context::blocks(out, &r.meta);
    footer(out, &[("", &r.meta)]);
}

/// One receiver/sender line pair of the throughput totals.
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
    /// iperf3's SUM: the bytes over the longest stream's active time; the worst jitter.
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
        // `None` as soon as one stream lacks the figure: a partial sum would mislead.
        let sum = |pick: fn(&StreamResult) -> Option<u64>| {
            streams
                .iter()
                .try_fold(0_u64, |acc, s| pick(s).map(|v| acc.saturating_add(v)))
        };
        let receiver = side(|s| &s.receiver);
        let sender = side(|s| &s.sender);
        let lost = sum(|s| s.lost);
        let loss_percent = lost
            .map(|l| 100.0 * to_f64(l) / to_f64(sender.packets))
            .filter(|p| p.is_finite());
        Self {
            receiver,
            sender,
            lost,
            loss_percent,
            jitter_ns: streams.iter().filter_map(|s| s.jitter_ns).max(),
            retransmits: sum(|s| s.retransmits),
        }
    }
}

/// `-i`: datagrams and datagrams per second in each interval, per flow when there are several.
fn pps_intervals(r: &PpsResult, out: &mut String) {
    if r.intervals.is_empty() {
        return;
    }
    out.push('\n');
    line(out, "Intervals, counted at the receiver");
    let many = r.flows.len() > 1;
    let mut g = Grid::new(vec![
        Col::left(),
        Col::right(),
        Col::left().gap(1),
        Col::right(),
        Col::right(),
    ]);
    g.row([
        "[ ID]".into(),
        "Interval".into(),
        String::new(),
        "Received".into(),
        "Received/s".into(),
    ]);
    for (n, iv) in r.intervals.iter().enumerate() {
        if many && n > 0 {
            g.blank();
        }
        let span = format!("{:.2}-{:.2}", ns_to_s(iv.start_ns), ns_to_s(iv.end_ns));
        let secs = iv.end_ns.saturating_sub(iv.start_ns);
        if many {
            for (f, received) in r.flows.iter().zip(&iv.flow_received) {
                g.row([
                    stream_id(f.flow),
                    span.clone(),
                    "sec".into(),
                    fmt_count(*received),
                    fmt_count_f64(sonde_engine::per_second(*received, secs)),
                ]);
            }
        }
        let id = if many {
            "[SUM]".to_owned()
        } else {
            stream_id(r.flows.first().map_or(0, |f| f.flow))
        };
        g.row([
            id,
            span,
            "sec".into(),
            fmt_count(iv.received),
            fmt_count_f64(iv.received_pps),
        ]);
    }
    g.render(out);
}

/// A live `-i` line of a pps test, for a terminal (the table holds all intervals in a block).
pub fn pps_interval_line(iv: &crate::model::PpsInterval) -> String {
    format!(
        "[SUM]  {:.2}-{:.2} sec  {:>12} datagrams  {:>12} pps  (counted at the receiver)",
        ns_to_s(iv.start_ns),
        ns_to_s(iv.end_ns),
        fmt_count(iv.received),
        fmt_count_f64(iv.received_pps)
    )
}

fn gso_mode(mode: GsoMode) -> &'static str {
    match mode {
        GsoMode::Auto => "auto",
        GsoMode::On => "on",
        GsoMode::Off => "off",
    }
}

fn pps(r: &PpsResult, out: &mut String) {
    header(out, "pps", &r.meta);
    line(
        out,
        format!(
            "{}, {} datagrams, {} requested, {} flow{}, sent with {}",
            protocol_name(r.protocol),
            fmt_size(u64::from(r.msg_size_bytes)),
            fmt_secs(r.duration_ns),
            r.flows.len(),
            plural(r.flows.len() as u64),
            r.send_method
        ),
    );
    line(
        out,
        format!(
            "GSO {} (--gso {}): {}",
            if r.gso.used { "used" } else { "not used" },
            gso_mode(r.gso.mode),
            r.gso.explanation
        ),
    );
    if let Some(t) = &r.tuning {
        line(out, pinning_line(t, "flows"));
    }
    out.push('\n');
    let mut g = Grid::new(vec![
        Col::left(),
        Col::right(),
        Col::right(),
        Col::right(),
        Col::right(),
    ]);
    g.row([
        "[ ID]".into(),
        "Sent".into(),
        "Received".into(),
        "Lost".into(),
        "Loss".into(),
    ]);
    let mut row = |id: String, f: &FlowResult, loss: String| {
        g.row([
            id,
            fmt_count(f.sent),
            fmt_count(f.received),
            fmt_count(f.lost),
            loss,
        ]);
    };
    if r.flows.len() > 1 {
        for f in &r.flows {
            row(stream_id(f.flow), f, fmt_ratio(f.lost, f.sent));
        }
    }
    let total = FlowResult {
        flow: 0,
        sent: r.sent,
        received: r.received,
        lost: r.lost,
    };
    let id = if r.flows.len() > 1 {
        "[SUM]".to_owned()
    } else {
        stream_id(r.flows.first().map_or(0, |f| f.flow))
    };
    row(id, &total, fmt_percent(r.loss_percent));
    g.render(out);
    out.push('\n');
    let mut kv = Grid::new(vec![Col::left(), Col::right(), Col::left().gap(1)]);
    kv.row([
        "sent".into(),
        fmt_count_f64(r.sent_pps),
        "pps  by the sender: what it handed to the kernel".into(),
    ]);
    kv.row([
        "received".into(),
        fmt_count_f64(r.received_pps),
        "pps  counted by the receiving agent: the figure to quote".into(),
    ]);
    kv.render(out);
    helpers::section(r.helpers.as_ref(), helpers::Shares::Pps, out);
    pps_intervals(r, out);
    context::blocks(out, &r.meta);
    footer(out, &[("", &r.meta)]);
}

fn quick(r: &QuickResult, out: &mut String) {
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
            plural(r.results.len() as u64),
            fmt_timestamp(r.timestamp_unix_ms)
        ),
    );
    line(
        out,
        "headline: RTT (latency), receiver bitrate (throughput), received datagrams/s (pps), \
         connections/s counted by the agent (crr)",
    );
    out.push('\n');
    let mut g = Grid::new(vec![Col::left(), Col::right(), Col::left(), Col::left()]);
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
        let (headline, details) = quick_headline(&c.result);
        g.row([c.case.clone(), session, headline, details]);
    }
    g.render(out);
    let metas: Vec<(&str, &Meta)> = r
        .results
        .iter()
        .filter_map(|c| c.result.meta().map(|m| (c.case.as_str(), m)))
        .collect();
    footer(out, &metas);
}

/// A quick case's figure to quote, and its context.
fn quick_headline(result: &TestResult) -> (String, String) {
    match result {
        TestResult::Latency(l) => {
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
            if l.samples == 0 {
                return ("RTT: no samples".into(), details);
            }
            // One unit per row: the cases are unrelated, and a LAN RTT in ms loses its digits.
            let unit = TimeUnit::for_typical(l.rtt_ns.p50.map_or(l.rtt_ns.mean, to_f64));
            let p =
                |v: Option<u64>| v.map_or_else(|| "n/a".to_owned(), |ns| fmt_ns(to_f64(ns), unit));
            let headline = format!(
                "RTT p50 {}, p99 {}, mean {}",
                p(l.rtt_ns.p50),
                p(l.rtt_ns.p99),
                fmt_ns(l.rtt_ns.mean, unit)
            );
            (headline, details)
        }
        TestResult::Throughput(t) => {
            let headline = if is_bidir(t) {
                let up = Sums::of_direction(t, StreamDirection::ClientToServer);
                let down = Sums::of_direction(t, StreamDirection::ServerToClient);
                format!(
                    "{} c→s, {} s→c",
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
                plural(u64::from(t.parallel))
            );
            if let Some(retr) = t.retransmits {
                details.push_str(&format!(", {} retransmits", fmt_count(retr)));
            }
            if let Some(loss) = t.loss_percent {
                details.push_str(&format!(", lost {}", fmt_percent(loss)));
            }
            if let Some(j) = t.jitter_ns {
                details.push_str(&format!(", jitter {}", fmt_ns_auto(to_f64(j))));
            }
            (headline, details)
        }
        TestResult::Pps(p) => (
            format!("{} pps", fmt_count_f64(p.received_pps)),
            format!(
                "{} B datagrams, lost {}",
                p.msg_size_bytes,
                fmt_percent(p.loss_percent)
            ),
        ),
        TestResult::Quick(q) => (format!("{} nested cases", q.results.len()), String::new()),
        TestResult::Crr(c) => crr::headline(c),
        TestResult::Conf(_) => ("configuration".into(), String::new()),
        TestResult::Sweep(w) => (
            format!("{} steps of {}", w.steps.len(), w.parameter),
            w.sweep_test.clone(),
        ),
        TestResult::Load(l) => (
            format!(
                "RTT p50 {} under load",
                l.added_rtt_ns.p50.map_or_else(
                    || "n/a".to_owned(),
                    |ns| format!(
                        "{}{}",
                        if ns < 0 { "-" } else { "+" },
                        fmt_ns_auto(ns.unsigned_abs() as f64)
                    )
                )
            ),
            format!("load {}", fmt_rate(l.load.receiver.bits_per_second)),
        ),
    }
}

fn sweep(r: &SweepResult, out: &mut String) {
    let server = r
        .steps
        .iter()
        .find_map(|s| s.result.meta())
        .map_or_else(String::new, |m| format!(", server {}", m.server));
    line(
        out,
        format!(
            "sonde {} {} sweep of {} ({}): {} step{}{server}, started {}",
            r.sonde_version,
            r.sweep_test,
            r.parameter,
            r.unit.replace('_', " "),
            r.steps.len(),
            plural(r.steps.len() as u64),
            fmt_timestamp(r.timestamp_unix_ms)
        ),
    );
    out.push('\n');
    let value = |v: u64| match r.parameter.as_str() {
        "msg_size" => fmt_size(v),
        "bitrate" => fmt_rate(to_f64(v)),
        _ => fmt_count(v),
    };
    let na = || "n/a".to_owned();
    match r.sweep_test.as_str() {
        "latency" => {
            // One unit for the whole table: the largest median decides.
            let largest = r
                .steps
                .iter()
                .filter_map(|s| match &s.result {
                    TestResult::Latency(l) => l.rtt_ns.p50.map(to_f64),
                    _ => None,
                })
                .fold(0.0, f64::max);
            let unit = TimeUnit::for_typical(largest);
            let mut g = Grid::new(vec![
                Col::left(),
                Col::right(),
                Col::right(),
                Col::right(),
                Col::right(),
                Col::right(),
                Col::right(),
                Col::right(),
            ]);
            g.row([
                r.parameter.clone(),
                "samples".into(),
                format!("p50 {}", unit.suffix()),
                format!("p90 {}", unit.suffix()),
                format!("p99 {}", unit.suffix()),
                format!("p99.9 {}", unit.suffix()),
                format!("mean {}", unit.suffix()),
                "lost".into(),
            ]);
            for s in &r.steps {
                let TestResult::Latency(l) = &s.result else {
                    continue;
                };
                let p = |v: Option<u64>| {
                    v.filter(|_| l.samples > 0)
                        .map_or_else(na, |ns| ns_number(to_f64(ns), unit))
                };
                g.row([
                    value(s.value),
                    fmt_count(l.samples),
                    p(l.rtt_ns.p50),
                    p(l.rtt_ns.p90),
                    p(l.rtt_ns.p99),
                    p(l.rtt_ns.p999),
                    if l.samples > 0 {
                        ns_number(l.rtt_ns.mean, unit)
                    } else {
                        na()
                    },
                    fmt_ratio(l.lost, l.sent),
                ]);
            }
            g.render(out);
        }
        "throughput" => {
            let mut g = Grid::new(vec![
                Col::left(),
                Col::right(),
                Col::right(),
                Col::right(),
                Col::right(),
            ]);
            g.row([
                r.parameter.clone(),
                "receiver".into(),
                "sender".into(),
                "retransmits".into(),
                "lost".into(),
            ]);
            for s in &r.steps {
                let TestResult::Throughput(t) = &s.result else {
                    continue;
                };
                g.row([
                    value(s.value),
                    fmt_rate(t.receiver.bits_per_second),
                    fmt_rate(t.sender.bits_per_second),
                    t.retransmits.map_or_else(na, fmt_count),
                    t.loss_percent.map_or_else(na, fmt_percent),
                ]);
            }
            g.render(out);
        }
        _ => {
            let mut g = Grid::new(vec![Col::left(), Col::right(), Col::right(), Col::right()]);
            g.row([
                r.parameter.clone(),
                "received pps".into(),
                "sent pps".into(),
                "lost".into(),
            ]);
            for s in &r.steps {
                let TestResult::Pps(p) = &s.result else {
                    continue;
                };
                g.row([
                    value(s.value),
                    fmt_count_f64(p.received_pps),
                    fmt_count_f64(p.sent_pps),
                    fmt_percent(p.loss_percent),
                ]);
            }
            g.render(out);
        }
    }
    let labels: Vec<String> = r
        .steps
        .iter()
        .map(|s| format!("{}={}", r.parameter, s.value))
        .collect();
    let metas: Vec<(&str, &Meta)> = r
        .steps
        .iter()
        .zip(&labels)
        .filter_map(|(s, l)| s.result.meta().map(|m| (l.as_str(), m)))
        .collect();
    footer(out, &metas);
}

fn load(r: &LoadResult, out: &mut String) {
    let (idle, loaded, bulk) = (&r.idle, &r.loaded, &r.load);
    line(
        out,
        format!(
            "sonde {} load: server {}, sessions {} (idle probes), {} (loaded probes), {} (load), started {}",
            r.sonde_version,
            idle.meta.server,
            idle.meta.session,
            loaded.meta.session,
            bulk.meta.session,
            fmt_timestamp(r.timestamp_unix_ms)
        ),
    );
    let mut kv = Grid::new(vec![Col::left(), Col::left()]);
    let rate = idle
        .rate_per_second
        .map_or_else(String::new, |r| format!(", {} msg/s", fmt_count_f64(r)));
    kv.row([
        "probes".into(),
        format!(
            "{} {}{rate}, {} each way, {} measured per phase after {} warm-up",
            protocol_name(idle.protocol),
            match idle.mode {
                LatencyMode::ClosedLoop => "closed loop",
                LatencyMode::OpenLoop => "open loop",
            },
            fmt_size(u64::from(idle.msg_size_bytes)),
            fmt_secs(idle.duration_ns.saturating_sub(idle.warmup_ns)),
            fmt_secs(idle.warmup_ns),
        ),
    ]);
    kv.row([
        "load".into(),
        format!(
            "{} {}, {} stream{}, {} before the loaded probes began",
            protocol_name(bulk.protocol),
            direction_name(&bulk.direction),
            bulk.parallel,
            plural(u64::from(bulk.parallel)),
            fmt_secs(r.ramp_ns)
        ),
    ]);
    kv.render(out);
    out.push('\n');
    line(out, "RTT (round trip), not one-way latency");
    let typical = |l: &LatencyResult| l.rtt_ns.p50.map_or(l.rtt_ns.mean, to_f64);
    let unit = TimeUnit::for_typical(typical(idle).max(typical(loaded)));
    let mut g = Grid::new(vec![
        Col::left().indent(2),
        Col::right(),
        Col::right(),
        Col::right(),
        Col::left().gap(1),
    ]);
    g.row([
        String::new(),
        "idle".into(),
        "loaded".into(),
        "added".into(),
        String::new(),
    ]);
    let cell = |l: &LatencyResult, v: Option<f64>| match v {
        Some(ns) if l.samples > 0 => ns_number(ns, unit),
        _ => "n/a".into(),
    };
    let added = |v: Option<f64>| {
        v.map_or_else(
            || "n/a".to_owned(),
            |ns| {
                let sign = if ns < 0.0 { "-" } else { "+" };
                format!("{sign}{}", ns_number(ns.abs(), unit))
            },
        )
    };
    g.row([
        "samples".into(),
        fmt_count(idle.samples),
        fmt_count(loaded.samples),
        String::new(),
        String::new(),
    ]);
    type Stat = fn(&RttNs) -> Option<f64>;
    let rows: [(&str, Stat, Option<f64>); 7] = [
        (
            "min",
            |r| Some(to_f64(r.min)),
            r.added_rtt_ns.min.map(|v| v as f64),
        ),
        ("mean", |r| Some(r.mean), r.added_rtt_ns.mean),
        (
            "p50",
            |r| r.p50.map(to_f64),
            r.added_rtt_ns.p50.map(|v| v as f64),
        ),
        (
            "p90",
            |r| r.p90.map(to_f64),
            r.added_rtt_ns.p90.map(|v| v as f64),
        ),
        (
            "p99",
            |r| r.p99.map(to_f64),
            r.added_rtt_ns.p99.map(|v| v as f64),
        ),
        (
            "p99.9",
            |r| r.p999.map(to_f64),
            r.added_rtt_ns.p999.map(|v| v as f64),
        ),
        (
            "max",
            |r| Some(to_f64(r.max)),
            r.added_rtt_ns.max.map(|v| v as f64),
        ),
    ];
    for (name, get, delta) in rows {
        g.row([
            name.into(),
            cell(idle, get(&idle.rtt_ns)),
            cell(loaded, get(&loaded.rtt_ns)),
            added(delta),
            unit.suffix().into(),
        ]);
    }
    g.render(out);
    if idle.protocol == Protocol::Udp {
        out.push('\n');
        let mut g = Grid::new(vec![Col::left(), Col::right(), Col::right()]);
        g.row([String::new(), "idle".into(), "loaded".into()]);
        g.row([
            "lost".into(),
            fmt_ratio(idle.lost, idle.sent),
            fmt_ratio(loaded.lost, loaded.sent),
        ]);
        g.render(out);
    }
    out.push('\n');
    let mut g = Grid::new(vec![Col::left(), Col::right(), Col::left().gap(1)]);
    g.row([
        "load throughput".into(),
        fmt_rate(bulk.receiver.bits_per_second),
        format!(
            "counted at the receiver over {}",
            fmt_secs(bulk.receiver.duration_ns)
        ),
    ]);
    if let Some(retr) = bulk.retransmits {
        g.row([
            "retransmits".into(),
            fmt_count(retr),
            "TCP segments the load's senders sent again".into(),
        ]);
    }
    g.render(out);
    footer(
        out,
        &[
            ("idle probes", &idle.meta),
            ("loaded probes", &loaded.meta),
            ("load", &bulk.meta),
        ],
    );
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
        "[SUM]  {:.2}-{:.2} sec  {:>12}  {:>14}  (counted at the receiver)",
        ns_to_s(iv.start_ns),
        ns_to_s(iv.end_ns),
        bytes.fmt(to_f64(iv.bytes)),
        rate.fmt(iv.bits_per_second)
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
        };
        assert_eq!(
            interval_line(&iv),
            "[SUM]  1.00-2.00 sec     11.40 MiB    95.64 Mbit/s  (counted at the receiver)"
        );
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
            if !["latency_with_warnings", "crr_ports_exhausted"].contains(&name) {
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
