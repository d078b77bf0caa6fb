//! `--from`: the helpers' shares under the aggregate, with how closely they started. The text
//! table and the HTML report show the same columns (`header`, `share_row`).

use super::super::units::{
    fmt_bytes, fmt_count, fmt_count_f64, fmt_ns_auto, fmt_rate, fmt_secs, to_f64,
};
use super::{line, Col, Grid};
use crate::model::{HelperShare, Helpers};

/// Which figures a share shows: the test's.
pub(in crate::render) use crate::model::ShareFigures as Shares;

/// Under a latency share table: why the aggregate's RTTs are one helper's.
pub(in crate::render) const LATENCY_NOTE: &str =
    "(the RTT figures above are the first helper's: percentiles of different paths do not add up)";

/// `from 2 helpers at once: starts within 613.44 µs of each other (...), common window 2.0 s`.
pub(in crate::render) fn summary(h: &Helpers) -> String {
    format!(
        "from {} helper{} at once: starts within {} of each other (clock offsets known within \
         ±{}), common window {}",
        h.shares.len(),
        if h.shares.len() == 1 { "" } else { "s" },
        fmt_ns_auto(to_f64(h.start_spread_ns)),
        fmt_ns_auto(to_f64(h.offset_uncertainty_ns)),
        fmt_secs(h.window_ns),
    )
}

/// The share table's column titles.
pub(in crate::render) fn header(kind: Shares) -> [&'static str; 6] {
    match kind {
        Shares::Pps => [
            "helper",
            "start",
            "sent",
            "received",
            "lost",
            "received pps",
        ],
        Shares::Throughput => [
            "helper",
            "start",
            "sent",
            "received",
            "lost",
            "received bit/s",
        ],
        Shares::Latency => ["helper", "start", "RTT min", "p50", "p99", "max"],
    }
}

/// One helper's row of the share table.
pub(in crate::render) fn share_row(s: &HelperShare, kind: Shares) -> [String; 6] {
    let opt = |v: Option<u64>, f: fn(u64) -> String| v.map_or_else(|| "-".to_owned(), f);
    let start = format!("+{}", fmt_ns_auto(to_f64(s.start_offset_ns)));
    match kind {
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
            let ns = |v: Option<u64>| v.map_or_else(|| "n/a".into(), |v| fmt_ns_auto(to_f64(v)));
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
    }
}

pub(super) fn section(h: Option<&Helpers>, kind: Shares, out: &mut String) {
    let Some(h) = h else { return };
    out.push('\n');
    line(out, summary(h));
    let mut g = Grid::new(vec![
        Col::left().indent(2),
        Col::right(),
        Col::right(),
        Col::right(),
        Col::right(),
        Col::right(),
    ]);
    g.row(header(kind).map(String::from));
    for s in &h.shares {
        g.row(share_row(s, kind));
    }
    g.render(out);
    if kind == Shares::Latency {
        line(out, format!("  {LATENCY_NOTE}"));
    }
}
