//! `--from`: the helpers' shares under the aggregate, with how closely they started.

use super::super::units::{
    fmt_bytes, fmt_count, fmt_count_f64, fmt_ns_auto, fmt_rate, fmt_secs, to_f64,
};
use super::{line, Col, Grid};
use crate::model::Helpers;

/// Which figures a share shows: the test's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Shares {
    Pps,
    Throughput,
    Latency,
}

pub(super) fn section(h: Option<&Helpers>, kind: Shares, out: &mut String) {
    let Some(h) = h else { return };
    out.push('\n');
    line(
        out,
        format!(
            "from {} helper{} at once: starts within {} of each other (clock offsets known \
             within ±{}), common window {}",
            h.shares.len(),
            if h.shares.len() == 1 { "" } else { "s" },
            fmt_ns_auto(to_f64(h.start_spread_ns)),
            fmt_ns_auto(to_f64(h.offset_uncertainty_ns)),
            fmt_secs(h.window_ns),
        ),
    );
    let mut g = Grid::new(vec![
        Col::left().indent(2),
        Col::right(),
        Col::right(),
        Col::right(),
        Col::right(),
        Col::right(),
    ]);
    match kind {
        Shares::Pps => g.row(
            [
                "helper",
                "start",
                "sent",
                "received",
                "lost",
                "received pps",
            ]
            .map(String::from),
        ),
        Shares::Throughput => g.row(
            [
                "helper",
                "start",
                "sent",
                "received",
                "lost",
                "received bit/s",
            ]
            .map(String::from),
        ),
        Shares::Latency => {
            g.row(["helper", "start", "RTT min", "p50", "p99", "max"].map(String::from));
        }
    }
    let opt = |v: Option<u64>, f: fn(u64) -> String| v.map_or_else(|| "-".to_owned(), f);
    for s in &h.shares {
        let start = format!("+{}", fmt_ns_auto(to_f64(s.start_offset_ns)));
        let row = match kind {
            Shares::Pps => [
                s.helper.clone(),
                start,
                opt(s.sent, fmt_count),
                opt(s.received, fmt_count),
                opt(s.lost, fmt_count),
                s.received_pps.map_or_else(|| "-".into(), fmt_count_f64),
            ],
            Shares::Throughput => [
                s.helper.clone(),
                start,
                opt(s.sent, fmt_bytes),
                opt(s.received, fmt_bytes),
                opt(s.lost, fmt_count),
                s.bits_per_second.map_or_else(|| "-".into(), fmt_rate),
            ],
            Shares::Latency => {
                let ns =
                    |v: Option<u64>| v.map_or_else(|| "n/a".into(), |v| fmt_ns_auto(to_f64(v)));
                let rtt = s.rtt_ns.as_ref();
                [
                    s.helper.clone(),
                    start,
                    ns(rtt.map(|r| r.min)),
                    ns(rtt.and_then(|r| r.p50)),
                    ns(rtt.and_then(|r| r.p99)),
                    ns(rtt.map(|r| r.max)),
                ]
            }
        };
        g.row(row);
    }
    g.render(out);
    if kind == Shares::Latency {
        line(
            out,
            "  (the RTT figures above are the first helper's: percentiles of different paths do \
             not add up)",
        );
    }
}
