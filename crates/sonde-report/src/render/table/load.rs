//! `sonde load`'s table: idle against loaded.

use super::{direction_name, footer, line, plural, protocol_name, Col, Grid};
use crate::model::{LatencyMode, LatencyResult, LoadResult, Protocol, RttNs};
use crate::render::units::{
    fmt_count, fmt_count_f64, fmt_ns_auto, fmt_rate, fmt_ratio, fmt_secs, fmt_size, fmt_timestamp,
    ns_number, to_f64, TimeUnit,
};

pub(crate) fn load(r: &LoadResult, out: &mut String) {
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

/// A load run's figure to quote in quick's table, and its context.
pub(crate) fn headline(l: &LoadResult) -> (String, String) {
    (
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
    )
}
