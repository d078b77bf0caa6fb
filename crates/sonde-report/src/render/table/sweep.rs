//! `--sweep`'s table: one row per step.

use super::{footer, line, plural, Col, Grid};
use crate::model::{Meta, SweepResult, TestResult};
use crate::render::units::{
    fmt_count, fmt_count_f64, fmt_percent, fmt_rate, fmt_ratio, fmt_size, fmt_timestamp, ns_number,
    to_f64, TimeUnit,
};

pub(crate) fn sweep(r: &SweepResult, out: &mut String) {
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
                .filter_map(|s| s.result.kind().rtt()?.rtt_ns.p50.map(to_f64))
                .fold(0.0, f64::max);
            let unit = TimeUnit::for_typical(largest);
            // Many-flow steps (-P, --depth): their transactions per second too.
            let tps = r.steps.iter().any(
                |s| matches!(&s.result, TestResult::Latency(l) if l.request_response.is_some()),
            );
            let mut g = Grid::new(
                std::iter::once(Col::left())
                    .chain((0..7 + usize::from(tps)).map(|_| Col::right()))
                    .collect(),
            );
            let mut head = vec![
                r.parameter.clone(),
                "samples".into(),
                format!("p50 {}", unit.suffix()),
                format!("p90 {}", unit.suffix()),
                format!("p99 {}", unit.suffix()),
                format!("p99.9 {}", unit.suffix()),
                format!("mean {}", unit.suffix()),
                "lost".into(),
            ];
            if tps {
                head.push("transactions/s".into());
            }
            g.row(head);
            for s in &r.steps {
                let TestResult::Latency(l) = &s.result else {
                    continue;
                };
                let p = |v: Option<u64>| {
                    v.filter(|_| l.samples > 0)
                        .map_or_else(na, |ns| ns_number(to_f64(ns), unit))
                };
                let mut row = vec![
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
                ];
                if tps {
                    // A one-flow step's rate is its samples over the measured time.
                    let measured = l.duration_ns.saturating_sub(l.warmup_ns).max(1);
                    row.push(fmt_count_f64(
                        l.request_response
                            .as_ref()
                            .map_or(l.samples as f64 * 1e9 / measured as f64, |rr| {
                                rr.transactions_per_second
                            }),
                    ));
                }
                g.row(row);
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

/// A sweep's figure to quote in quick's table, and its context.
pub(crate) fn headline(w: &SweepResult) -> (String, String) {
    (
        format!("{} steps of {}", w.steps.len(), w.parameter),
        w.sweep_test.clone(),
    )
}
