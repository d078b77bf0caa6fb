//! `sonde throughput`'s table.

use super::{
    context, dir_name, direction_name, footer, header, helpers, is_bidir, line, pinning_line,
    plural, protocol_name, socket_lines, stream_id, Col, Grid, RECEIVER, SENDER,
};
use crate::model::{Protocol, SideTotals, StreamDirection, StreamResult, ThroughputResult};
use crate::render::units::{
    fmt_bytes, fmt_count, fmt_ns, fmt_ns_auto, fmt_percent, fmt_rate, fmt_secs, fmt_size, ns_to_s,
    rate, to_f64, TimeUnit, Unit, BYTES, RATE,
};

pub(crate) fn throughput(r: &ThroughputResult, out: &mut String) {
    header(out, "throughput", &r.meta);
    let udp = r.protocol == Protocol::Udp;
    let bidir = is_bidir(r);
    let unit = if udp { "datagrams" } else { "writes" };
    // `-n`, `-k`: a counted test, not a timed one.
    let requested = match (r.bytes_to_send, r.blocks_to_send) {
        (Some(b), _) => format!("{} to send (-n)", fmt_size(b)),
        (None, Some(k)) => format!("{} {unit} to send (-k)", fmt_count(k)),
        (None, None) => format!("{} requested", fmt_secs(r.duration_ns)),
    };
    let mut config = format!(
        "{} {}, {} stream{}{}, {} {unit}, {requested}",
        protocol_name(r.protocol),
        direction_name(&r.direction),
        r.parallel,
        plural(u64::from(r.parallel)),
        if bidir { " each way" } else { "" },
        fmt_size(u64::from(r.msg_size_bytes)),
    );
    if udp {
        match r.target_bits_per_second {
            Some(t) => config.push_str(&format!(", target {}", fmt_rate(to_f64(t)))),
            None => config.push_str(", no rate limit"),
        }
    }
    if r.skip_rx_copy {
        config.push_str(", received without a copy (--skip-rx-copy)");
    }
    if r.zerocopy.is_some() {
        config.push_str(", sent with MSG_ZEROCOPY (-Z)");
    }
    if let Some(omit) = r.omit_ns {
        config.push_str(&format!(", the first {} omitted (-O)", fmt_secs(omit)));
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
    for l in r.socket.iter().flat_map(socket_lines) {
        line(out, l);
    }
    if let Some(z) = &r.zerocopy {
        line(out, zerocopy_line(z));
    }
    for l in r.ecn.iter().flat_map(super::ecn_lines) {
        line(out, l);
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
                    if iv.omitted {
                        "sec (omitted)".into()
                    } else {
                        "sec".into()
                    },
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

/// A throughput run's figure to quote in quick's table, and its context.
pub(crate) fn headline(t: &ThroughputResult) -> (String, String) {
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

/// `-Z`: per sending end, how many of its sends the kernel really sent without a copy.
fn zerocopy_line(z: &crate::model::EndsZerocopy) -> String {
    let end = |who: &str, s: Option<&sonde_wire::ZerocopyStats>| match s {
        None => format!("{who} -"),
        Some(s) => format!(
            "{who} {} of {} sends without a copy ({} copied by the kernel{})",
            fmt_count(s.completed - s.copied),
            fmt_count(s.sends),
            fmt_count(s.copied),
            if s.completed < s.sends {
                format!(
                    ", {} not completed by the end",
                    fmt_count(s.sends - s.completed)
                )
            } else {
                String::new()
            }
        ),
    };
    format!(
        "zero copy (-Z): {}; {}",
        end("client", z.client.as_ref()),
        end("server", z.server.as_ref())
    )
}
