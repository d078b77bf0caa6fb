//! `sonde quick`'s table: one line per case.

use super::throughput::Sums;
use super::{crr, footer, is_bidir, line, plural, protocol_name, Col, Grid};
use crate::model::{LatencyMode, Meta, Protocol, QuickResult, StreamDirection, TestResult};
use crate::render::units::{
    fmt_count, fmt_count_f64, fmt_ns, fmt_ns_auto, fmt_percent, fmt_rate, fmt_ratio, fmt_timestamp,
    to_f64, TimeUnit,
};

pub(super) fn quick(r: &QuickResult, out: &mut String) {
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
pub(super) fn quick_headline(result: &TestResult) -> (String, String) {
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
