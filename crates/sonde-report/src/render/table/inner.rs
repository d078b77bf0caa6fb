//! Latency's inner view in the table: the full log's line in the configuration block, then,
//! after the RTT, the histogram (`--histogram`), the RTT at the sockets (`--timestamps`) and
//! the one-way delays (`--one-way`), each only when the result has it.

use super::super::units::{fmt_count, fmt_ns, ns_number, to_f64, TimeUnit};
use super::{line, Col, Grid, PERCENTILES};
use crate::model::{HistogramBucket, LatencyResult, OneWay, RttNs, SignedNs, SocketRtt};

/// The widest bar of the histogram, in characters.
const BAR: usize = 40;

/// The configuration block's row for `--full-log`.
pub(super) fn config_rows(r: &LatencyResult, kv: &mut Grid) {
    if let Some(log) = &r.full_log {
        let mut what = format!(
            "{}: {} samples written, {} dropped",
            log.path,
            fmt_count(log.written),
            fmt_count(log.dropped)
        );
        if log.error.is_some() {
            what.push_str(" (writing failed)");
        }
        kv.row(["full log".into(), what]);
    }
}

/// The sections after the RTT, in the order the options are documented.
pub(super) fn sections(r: &LatencyResult, out: &mut String) {
    let unit = TimeUnit::for_typical(r.rtt_ns.p50.map_or(r.rtt_ns.mean, to_f64));
    if let Some(buckets) = &r.rtt_histogram {
        histogram(buckets, unit, out);
    }
    if let Some(s) = &r.socket_rtt {
        socket(r, s, unit, out);
    }
    if let Some(ow) = &r.one_way {
        one_way(ow, out);
    }
}

fn histogram(buckets: &[HistogramBucket], unit: TimeUnit, out: &mut String) {
    out.push('\n');
    if buckets.is_empty() {
        line(out, "RTT histogram: no samples");
        return;
    }
    line(
        out,
        "RTT histogram (samples per bucket; each bucket holds the RTTs up to its bound)",
    );
    let most = buckets.iter().map(|b| b.count).max().unwrap_or(0).max(1);
    let mut g = Grid::new(vec![
        Col::left().indent(2),
        Col::right().gap(1),
        Col::left().gap(1),
        Col::right(),
        Col::left(),
    ]);
    for b in buckets {
        // A non-empty bucket shows at least one mark, however small next to the largest.
        let width = if b.count == 0 {
            0
        } else {
            ((b.count as f64 / most as f64 * BAR as f64).round() as usize).max(1)
        };
        g.row([
            "≤".into(),
            ns_number(to_f64(b.le_ns), unit),
            unit.suffix().into(),
            fmt_count(b.count),
            "█".repeat(width),
        ]);
    }
    g.render(out);
}

/// The rows every distribution table shows, with the value of each in a column.
fn stat_rows(unit: TimeUnit, columns: &[Option<&RttNs>], g: &mut Grid) {
    let cell = |v: Option<f64>| v.map_or_else(|| "n/a".to_owned(), |ns| ns_number(ns, unit));
    let row = |g: &mut Grid, name: &str, f: &dyn Fn(&RttNs) -> Option<f64>| {
        let mut cells = vec![name.to_owned()];
        cells.extend(columns.iter().map(|c| cell(c.and_then(f))));
        cells.push(unit.suffix().to_owned());
        g.row(cells);
    };
    row(g, "min", &|r| Some(to_f64(r.min)));
    row(g, "mean", &|r| Some(r.mean));
    for p in &PERCENTILES[..4] {
        row(g, p.label, &|r| (p.value)(r).map(to_f64));
    }
    row(g, "max", &|r| Some(to_f64(r.max)));
}

fn socket(r: &LatencyResult, s: &SocketRtt, unit: TimeUnit, out: &mut String) {
    out.push('\n');
    if !s.rx_timestamps {
        line(
            out,
            "RTT at the sockets: not measured (the kernel gave no receive timestamps; see the warnings)",
        );
        return;
    }
    line(
        out,
        format!(
            "RTT at the sockets (kernel software timestamps: {} of {} samples on receive, {} on send)",
            fmt_count(s.rx_stamped),
            fmt_count(r.samples),
            fmt_count(s.tx_stamped),
        ),
    );
    let mut g = Grid::new(vec![
        Col::left().indent(2),
        Col::right(),
        Col::right(),
        Col::right(),
        Col::right(),
        Col::left().gap(1),
    ]);
    g.row([
        String::new(),
        "application".into(),
        "socket".into(),
        "host".into(),
        "send→socket".into(),
    ]);
    stat_rows(
        unit,
        &[
            Some(&r.rtt_ns),
            s.socket_rtt_ns.as_ref(),
            s.host_ns.as_ref(),
            s.send_to_socket_rx_ns.as_ref(),
        ],
        &mut g,
    );
    g.render(out);
    let mut legend = Grid::new(vec![Col::left().indent(2), Col::left()]);
    legend.row([
        "socket".into(),
        "the request's kernel transmit to the reply's kernel receive".into(),
    ]);
    legend.row([
        "host".into(),
        "application − socket, per sample: this host's system calls, wake-ups, scheduling".into(),
    ]);
    legend.row([
        "send→socket".into(),
        "the application's send to the reply's kernel receive (needs no transmit stamp)".into(),
    ]);
    legend.render(out);
    let median = |d: &RttNs| {
        d.p50
            .map_or_else(|| "n/a".into(), |v| fmt_ns(to_f64(v), unit))
    };
    if let Some(h) = &s.host_ns {
        line(
            out,
            format!(
                "host time: median {} of each round trip is spent in this host",
                median(h)
            ),
        );
    } else if let Some(h) = &s.rx_host_ns {
        line(
            out,
            format!(
                "host time on receive (application − send→socket): median {}; without transmit stamps the send side cannot be split off",
                median(h)
            ),
        );
    }
}

fn one_way(ow: &OneWay, out: &mut String) {
    out.push('\n');
    let (Some(f), Some(b), Some(u)) = (&ow.forward_ns, &ow.return_ns, ow.uncertainty_ns) else {
        line(out, "One-way delay: not measured (see the warnings)");
        return;
    };
    let typical = f
        .p50
        .unwrap_or(f.mean as i64)
        .max(b.p50.unwrap_or(b.mean as i64));
    let unit = TimeUnit::for_typical(typical.unsigned_abs() as f64);
    line(
        out,
        format!(
            "One-way delay, {} samples, ± {} (the clock estimate's bound on every figure)",
            fmt_count(ow.samples),
            fmt_ns(to_f64(u), unit)
        ),
    );
    let mut g = Grid::new(vec![
        Col::left().indent(2),
        Col::right(),
        Col::right(),
        Col::right(),
        Col::left().gap(1),
    ]);
    g.row([
        String::new(),
        "client → agent".into(),
        "agent → client".into(),
        "agent hold".into(),
    ]);
    let signed =
        |v: Option<i64>| v.map_or_else(|| "n/a".to_owned(), |ns| ns_number(ns as f64, unit));
    let plain = |v: Option<f64>| v.map_or_else(|| "n/a".to_owned(), |ns| ns_number(ns, unit));
    let hold = ow.agent_hold_ns.as_ref();
    let row = |g: &mut Grid, name: &str, s: &dyn Fn(&SignedNs) -> Option<i64>, h: Option<f64>| {
        g.row([
            name.to_owned(),
            signed(s(f)),
            signed(s(b)),
            plain(h),
            unit.suffix().to_owned(),
        ]);
    };
    row(&mut g, "min", &|s| Some(s.min), hold.map(|h| to_f64(h.min)));
    g.row([
        "mean".to_owned(),
        ns_number(f.mean, unit),
        ns_number(b.mean, unit),
        plain(hold.map(|h| h.mean)),
        unit.suffix().to_owned(),
    ]);
    row(
        &mut g,
        "p50",
        &|s| s.p50,
        hold.and_then(|h| h.p50).map(to_f64),
    );
    row(
        &mut g,
        "p90",
        &|s| s.p90,
        hold.and_then(|h| h.p90).map(to_f64),
    );
    row(
        &mut g,
        "p99",
        &|s| s.p99,
        hold.and_then(|h| h.p99).map(to_f64),
    );
    row(
        &mut g,
        "p99.9",
        &|s| s.p999,
        hold.and_then(|h| h.p999).map(to_f64),
    );
    row(&mut g, "max", &|s| Some(s.max), hold.map(|h| to_f64(h.max)));
    g.render(out);
    if let Some(c) = &ow.clock {
        line(
            out,
            format!(
                "agent clock: {} ± {} from this host's, drift {:.3} ppm; {} control and {} probe exchanges, {} used, best round trip {}",
                fmt_ns(c.offset_ns as f64, unit),
                fmt_ns(to_f64(c.offset_uncertainty_ns), unit),
                c.drift_ppm,
                fmt_count(c.control_exchanges),
                fmt_count(c.probe_exchanges),
                fmt_count(c.exchanges_used),
                fmt_ns(to_f64(c.best_round_trip_ns), unit)
            ),
        );
    }
}
