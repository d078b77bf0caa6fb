//! `sonde latency`'s table.

use super::{
    context, footer, header, helpers, inner, line, protocol_name, socket_lines, tuning_text, Col,
    Grid, PERCENTILES,
};
use crate::model::{LatencyInterval, LatencyMode, LatencyResult, Protocol};
use crate::render::units::{
    fmt_count, fmt_count_f64, fmt_ns, fmt_ns_auto, fmt_ratio, fmt_secs, fmt_size, ns_number,
    ns_to_s, to_f64, TimeUnit,
};

/// A live `-i` line of a latency test: the interval, its replies and their RTTs (a percentile
/// its replies cannot support is n/a).
pub fn latency_interval_line(iv: &LatencyInterval) -> String {
    let span = format!("{:.2}-{:.2} sec", ns_to_s(iv.start_ns), ns_to_s(iv.end_ns));
    let Some(rtt) = &iv.rtt_ns else {
        return format!("{span}  no replies");
    };
    let opt = |v: Option<u64>| v.map_or_else(|| "n/a".to_owned(), |ns| fmt_ns_auto(to_f64(ns)));
    let tps = iv
        .transactions_per_second
        .map(|t| format!("  {:>9} trans/s", fmt_count_f64(t)))
        .unwrap_or_default();
    format!(
        "{span}  {:>9} RTTs{tps}  min {}  p50 {}  p99 {}  max {}",
        fmt_count(iv.samples),
        fmt_ns_auto(to_f64(rtt.min)),
        opt(rtt.p50),
        opt(rtt.p99),
        fmt_ns_auto(to_f64(rtt.max)),
    )
}

/// `-i`: the intervals' RTTs in one block, in the unit of the run's median.
fn intervals(r: &LatencyResult, unit: TimeUnit, out: &mut String) {
    if r.intervals.is_empty() {
        return;
    }
    out.push('\n');
    line(out, "Intervals: RTT of the replies that arrived in each");
    // Many flows: each interval's transactions per second too.
    let tps = r
        .intervals
        .iter()
        .any(|iv| iv.transactions_per_second.is_some());
    let mut cols = vec![Col::left().indent(2), Col::left().gap(1), Col::right()];
    cols.extend(std::iter::repeat_n(Col::right(), 5 + usize::from(tps)));
    let mut g = Grid::new(cols);
    let u = unit.suffix();
    let mut head = vec![String::from("Interval"), String::new(), "RTTs".into()];
    if tps {
        head.push("trans/s".into());
    }
    head.extend([
        format!("min {u}"),
        format!("p50 {u}"),
        format!("p90 {u}"),
        format!("p99 {u}"),
        format!("max {u}"),
    ]);
    g.row(head);
    for iv in &r.intervals {
        let span = format!("{:.2}-{:.2}", ns_to_s(iv.start_ns), ns_to_s(iv.end_ns));
        let mut row = vec![span, "sec".into(), fmt_count(iv.samples)];
        if tps {
            row.push(
                iv.transactions_per_second
                    .map_or_else(|| "-".to_owned(), fmt_count_f64),
            );
        }
        match &iv.rtt_ns {
            Some(rtt) => {
                let n = |v: Option<u64>| {
                    v.map_or_else(|| "n/a".into(), |ns| ns_number(to_f64(ns), unit))
                };
                row.extend([
                    n(Some(rtt.min)),
                    n(rtt.p50),
                    n(rtt.p90),
                    n(rtt.p99),
                    n(Some(rtt.max)),
                ]);
            }
            None => row.extend(std::iter::repeat_n("-".to_owned(), 5)),
        }
        g.row(row);
    }
    g.render(out);
}

pub(crate) fn latency(r: &LatencyResult, out: &mut String) {
    header(out, "latency", &r.meta);
    let mut kv = Grid::new(vec![Col::left(), Col::left()]);
    kv.row(["protocol".into(), protocol_name(r.protocol).into()]);
    let mode = match (r.mode, r.rate_per_second) {
        (LatencyMode::ClosedLoop, _) if r.request_response.is_some() => {
            "closed loop (a response lets the flow's next request go)".to_owned()
        }
        (LatencyMode::ClosedLoop, _) => "closed loop (one message in flight)".to_owned(),
        (LatencyMode::OpenLoop, Some(rate)) if r.request_response.is_some() => format!(
            "open loop, {} requests/s scheduled over all flows (RTT counted from the scheduled \
             send time)",
            fmt_count_f64(rate)
        ),
        (LatencyMode::OpenLoop, Some(rate)) => format!(
            "open loop, {} msg/s scheduled (RTT counted from the scheduled send time)",
            fmt_count_f64(rate)
        ),
        (LatencyMode::OpenLoop, None) => {
            "open loop (RTT counted from the scheduled send time)".to_owned()
        }
    };
    kv.row(["mode".into(), mode]);
    if let Some(rr) = &r.request_response {
        kv.row([
            "flows".into(),
            format!(
                "{} x depth {} ({} in flight; {} client thread{})",
                rr.flows,
                rr.depth,
                fmt_count(u64::from(rr.flows) * u64::from(rr.depth)),
                rr.client_threads,
                if rr.client_threads == 1 { "" } else { "s" }
            ),
        ]);
        kv.row([
            "message size".into(),
            format!(
                "{} request, {} response",
                fmt_size(u64::from(r.msg_size_bytes)),
                fmt_size(u64::from(rr.response_size_bytes))
            ),
        ]);
    } else {
        kv.row([
            "message size".into(),
            format!("{} each way", fmt_size(u64::from(r.msg_size_bytes))),
        ]);
    }
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
    if let Some(rr) = &r.request_response {
        kv.row([
            "transactions".into(),
            format!(
                "{}/s total; per flow min {}/s, max {}/s, fairness {:.3} (Jain)",
                fmt_count_f64(rr.transactions_per_second),
                fmt_count_f64(rr.flow_min_per_second),
                fmt_count_f64(rr.flow_max_per_second),
                rr.fairness
            ),
        ]);
        if let Some(achieved) = rr.rate_achieved_per_second {
            let unsent = match rr.unsent.unwrap_or(0) {
                0 => "every request due was sent".to_owned(),
                n => format!("{} requests never sent, flows at their depth", fmt_count(n)),
            };
            kv.row([
                "rate achieved".into(),
                format!(
                    "{}/s of {}/s scheduled ({unsent})",
                    fmt_count_f64(achieved),
                    r.rate_per_second
                        .map_or_else(|| "n/a".into(), fmt_count_f64),
                ),
            ]);
        }
        let per = |ns: Option<f64>| ns.map_or_else(|| "n/a".to_owned(), |v| format!("{v:.0} ns"));
        kv.row([
            "cpu per transaction".into(),
            format!(
                "client {}, agent {}",
                per(rr.client_cpu_ns_per_transaction),
                per(rr.server_cpu_ns_per_transaction)
            ),
        ]);
    }
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
    for l in r.socket.iter().flat_map(socket_lines) {
        line(out, l);
    }

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
        intervals(r, unit, out);
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

/// A latency run's figure to quote in quick's table, and its context.
pub(crate) fn headline(l: &LatencyResult) -> (String, String) {
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
    let p = |v: Option<u64>| v.map_or_else(|| "n/a".to_owned(), |ns| fmt_ns(to_f64(ns), unit));
    let headline = format!(
        "RTT p50 {}, p99 {}, mean {}",
        p(l.rtt_ns.p50),
        p(l.rtt_ns.p99),
        fmt_ns(l.rtt_ns.mean, unit)
    );
    (headline, details)
}
