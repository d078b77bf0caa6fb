//! The `sonde mtu` table: the answer with its headers, how the bound above it was learnt, the
//! interface and the kernel's view, the TCP MSS at each end, then every probe.

use super::super::units::{fmt_ns_auto, fmt_secs, to_f64};
use super::{context, footer, header, line, Col, Grid};
use crate::model::{MtuBound, MtuProbeFate, MtuResult};

pub(crate) fn mtu(r: &MtuResult, out: &mut String) {
    header(out, "mtu", &r.meta);
    line(
        out,
        format!(
            "IPv{} path MTU by DF probes, echoed by the agent at the same size with DF: sizes are \
             whole IP packets ({} B IP + {} B UDP header + payload)",
            r.ip_version, r.ip_header_bytes, r.udp_header_bytes
        ),
    );
    out.push('\n');
    let opt = |v: Option<u32>| v.map_or_else(|| "n/a".to_owned(), |b| format!("{b} B"));
    let mut g = Grid::new(vec![Col::left(), Col::right(), Col::left()]);
    let both = match r.agent_dont_fragment {
        Some(true) => "both ways (the smaller of the two directions)",
        Some(false) => "the agent's echoes left without DF: this host's direction only",
        None => "the agent did not say whether its echoes carry DF",
    };
    g.row([
        "path MTU".into(),
        opt(r.path_mtu_bytes),
        format!("largest IP packet that crossed, {both}"),
    ]);
    g.row([
        "UDP payload".into(),
        opt(r.udp_payload_bytes),
        "the largest datagram payload that fits it".into(),
    ]);
    let above = match (r.upper_bound, r.smallest_refused_bytes) {
        (MtuBound::Ceiling, _) | (_, None) => {
            "nothing larger tried: the search's ceiling crossed".to_owned()
        }
        (MtuBound::Reported, Some(b)) => {
            let routers: Vec<String> = r
                .probes
                .iter()
                .filter(|p| p.fate == MtuProbeFate::RouterTooBig)
                .filter_map(|p| {
                    Some(format!(
                        "{} said {}",
                        p.reported_by.as_deref()?,
                        opt(p.reported_mtu_bytes)
                    ))
                })
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            if routers.is_empty() {
                format!("{b} B and more refused by this host's kernel")
            } else {
                format!(
                    "{b} B and more too big: a router said so ({})",
                    routers.join(", ")
                )
            }
        }
        (MtuBound::Silence, Some(b)) => format!(
            "{b} B and more: no echo in {} tries each, and no router said why (silence)",
            r.tries
        ),
    };
    g.row(["above".into(), String::new(), above]);
    g.row([
        "interface MTU".into(),
        opt(r.interface_mtu_bytes),
        format!(
            "this host's interface toward the agent (search ceiling {} B)",
            r.ceiling_bytes
        ),
    ]);
    g.row([
        "kernel PMTU".into(),
        opt(r.kernel_path_mtu_bytes),
        "this host's cached path MTU toward the agent after the search (IP_MTU)".into(),
    ]);
    g.row([
        "probes".into(),
        r.probes_sent.to_string(),
        format!(
            "in {}, each waited for up to {}",
            time(r.search_ns),
            time(r.probe_timeout_ns)
        ),
    ]);
    g.render(out);
    if let Some(t) = &r.tcp {
        out.push('\n');
        line(
            out,
            format!(
                "TCP MSS (TCP_MAXSEG; payload bytes per segment), after {} B each way{}",
                t.exchanged_bytes,
                if t.completed {
                    ""
                } else {
                    ": the echo did not come back in time (TCP stalled on the path)"
                }
            ),
        );
        let mut g = Grid::new(vec![Col::left(), Col::right(), Col::right()]);
        g.row(["".into(), "at connect".into(), "at the end".into()]);
        g.row([
            "client".into(),
            opt(t.client_mss_at_connect_bytes),
            opt(t.client_mss_bytes),
        ]);
        g.row([
            "agent".into(),
            opt(t.agent_mss_at_connect_bytes),
            opt(t.agent_mss_bytes),
        ]);
        g.render(out);
    }
    out.push('\n');
    line(out, "Probes");
    let mut g = Grid::new(vec![
        Col::right(),
        Col::right(),
        Col::left(),
        Col::right(),
        Col::left(),
    ]);
    g.row([
        "#".into(),
        "IP bytes".into(),
        "fate".into(),
        "RTT".into(),
        "reported".into(),
    ]);
    for (i, p) in r.probes.iter().enumerate() {
        let fate = match p.fate {
            MtuProbeFate::Echoed => "echoed",
            MtuProbeFate::Silent => "silent",
            MtuProbeFate::RouterTooBig => "too big (router)",
            MtuProbeFate::LocalTooBig => "too big (this host)",
        };
        let reported = match (&p.reported_by, p.reported_mtu_bytes) {
            (Some(by), Some(m)) => format!("{by}: MTU {m}"),
            (Some(by), None) => by.clone(),
            (None, Some(m)) => format!("MTU {m}"),
            (None, None) => String::new(),
        };
        g.row([
            (i + 1).to_string(),
            p.ip_bytes.to_string(),
            fate.into(),
            p.rtt_ns
                .map_or_else(String::new, |ns| fmt_ns_auto(to_f64(ns))),
            reported,
        ]);
    }
    g.render(out);
    context::blocks(out, &r.meta);
    footer(out, &[("", &r.meta)]);
}

/// A duration in seconds from 1 s up, else in ms or µs.
fn time(ns: u64) -> String {
    if ns >= 1_000_000_000 {
        fmt_secs(ns)
    } else {
        fmt_ns_auto(to_f64(ns))
    }
}

/// Quick's line: the path MTU and how it was bounded.
pub(crate) fn headline(r: &MtuResult) -> (String, String) {
    let figure = r
        .path_mtu_bytes
        .map_or_else(|| "n/a".to_owned(), |b| format!("{b} B"));
    let how = match r.upper_bound {
        MtuBound::Ceiling => "the ceiling crossed",
        MtuBound::Reported => "a router said so",
        MtuBound::Silence => "by silence",
    };
    (
        figure,
        format!(
            "IPv{} path MTU, {how}, {} probes",
            r.ip_version, r.probes_sent
        ),
    )
}
