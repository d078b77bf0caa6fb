//! `sonde pps`'s table.

use super::{
    context, footer, header, helpers, line, pinning_line, plural, protocol_name, socket_lines,
    stream_id, Col, Grid,
};
use crate::model::{FlowResult, GsoMode, PpsResult};
use crate::render::units::{
    fmt_count, fmt_count_f64, fmt_percent, fmt_ratio, fmt_secs, fmt_size, ns_to_s,
};

/// `-i`: datagrams and datagrams per second in each interval, per flow when there are several.
fn pps_intervals(r: &PpsResult, out: &mut String) {
    if r.intervals.is_empty() {
        return;
    }
    out.push('\n');
    line(out, "Intervals, counted at the receiver");
    let many = r.flows.len() > 1;
    // The agent's interface per interval, where read: what `sar -n DEV` would show beside it.
    let nic = r.intervals.iter().any(|iv| iv.interface.is_some());
    let mut cols = vec![
        Col::left(),
        Col::right(),
        Col::left().gap(1),
        Col::right(),
        Col::right(),
    ];
    let mut head = vec![
        "[ ID]".into(),
        "Interval".into(),
        String::new(),
        "Received".into(),
        "Received/s".into(),
    ];
    if nic {
        cols.push(Col::right());
        head.push("Interface rx pkts".into());
    }
    let mut g = Grid::new(cols);
    g.row(head);
    for (n, iv) in r.intervals.iter().enumerate() {
        if many && n > 0 {
            g.blank();
        }
        let span = format!("{:.2}-{:.2}", ns_to_s(iv.start_ns), ns_to_s(iv.end_ns));
        let secs = iv.end_ns.saturating_sub(iv.start_ns);
        // `-O`: an interval of the omit period says so, as iperf3's do.
        let unit = if iv.omitted { "sec (omitted)" } else { "sec" };
        if many {
            for (f, received) in r.flows.iter().zip(&iv.flow_received) {
                let mut row = vec![
                    stream_id(f.flow),
                    span.clone(),
                    unit.into(),
                    fmt_count(*received),
                    fmt_count_f64(sonde_engine::per_second(*received, secs)),
                ];
                if nic {
                    row.push(String::new());
                }
                g.row(row);
            }
        }
        let id = if many {
            "[SUM]".to_owned()
        } else {
            stream_id(r.flows.first().map_or(0, |f| f.flow))
        };
        let mut row = vec![
            id,
            span,
            unit.into(),
            fmt_count(iv.received),
            fmt_count_f64(iv.received_pps),
        ];
        if nic {
            row.push(
                iv.interface
                    .as_ref()
                    .map_or_else(|| "n/a".into(), |i| fmt_count(i.rx_packets)),
            );
        }
        g.row(row);
    }
    g.render(out);
}

/// A live `-i` line of a pps test, for a terminal (the table holds all intervals in a block).
pub fn pps_interval_line(iv: &crate::model::PpsInterval) -> String {
    format!(
        "[SUM]  {:.2}-{:.2} sec  {:>12} datagrams  {:>12} pps  (counted at the receiver){}",
        ns_to_s(iv.start_ns),
        ns_to_s(iv.end_ns),
        fmt_count(iv.received),
        fmt_count_f64(iv.received_pps),
        if iv.omitted { "  (omitted)" } else { "" }
    )
}

fn gso_mode(mode: GsoMode) -> &'static str {
    match mode {
        GsoMode::Auto => "auto",
        GsoMode::On => "on",
        GsoMode::Off => "off",
    }
}

pub(crate) fn pps(r: &PpsResult, out: &mut String) {
    header(out, "pps", &r.meta);
    let omit = r.omit_ns.map_or(String::new(), |o| {
        let received = r.omitted_received.map_or(String::new(), |n| {
            format!(", {} datagrams received in it", fmt_count(n))
        });
        format!(", the first {} omitted (-O{received})", fmt_secs(o))
    });
    line(
        out,
        format!(
            "{}, {} datagrams, {} requested, {} flow{}, sent with {}{omit}",
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
    for l in r.socket.iter().flat_map(socket_lines) {
        line(out, l);
    }
    for l in r.ecn.iter().flat_map(super::ecn_lines) {
        line(out, l);
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
    if let Some(d) = r.meta.interfaces.as_ref().and_then(|i| i.server.as_ref()) {
        // What `sar -n DEV` would have read at the receiver: the whole interface.
        kv.row([
            "interface".into(),
            fmt_count(d.rx_packets),
            format!(
                "packets the agent's {} received (all its traffic; {} dropped)",
                d.name,
                fmt_count(d.rx_dropped)
            ),
        ]);
    }
    kv.render(out);
    helpers::section(r.helpers.as_ref(), helpers::Shares::Pps, out);
    pps_intervals(r, out);
    context::blocks(out, &r.meta);
    footer(out, &[("", &r.meta)]);
}

/// A pps run's figure to quote in quick's table, and its context.
pub(crate) fn headline(p: &PpsResult) -> (String, String) {
    (
        format!("{} pps", fmt_count_f64(p.received_pps)),
        format!(
            "{} B datagrams, lost {}",
            p.msg_size_bytes,
            fmt_percent(p.loss_percent)
        ),
    )
}
