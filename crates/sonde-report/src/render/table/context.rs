//! What a table says about a test's context: both ends' configuration (all of it for
//! `sonde conf`, one line per end under every test), what the test cost each end in CPU, and
//! the TCP senders' `TCP_INFO` cells of the throughput table.

use super::super::units::{
    fmt_bytes, fmt_count, fmt_ns_auto, fmt_percent, fmt_secs, fmt_timestamp, to_f64,
};
use super::{line, Col, Grid};
use crate::model::{
    ConfResult, CpuCost, HostInfo, IntervalResult, Meta, MinDefaultMax, NicInfo, Peer, TcpInfo,
};

const NA: &str = "n/a";

/// The smoothed RTT of `stream` at the end of `iv`, from its sender's `TCP_INFO`; `n/a` when
/// the senders sampled other streams but not this one, blank for an interval without samples
/// (the last, partial one: its figures are the stream's final ones, in the totals).
pub(super) fn interval_srtt(iv: &IntervalResult, stream: u32) -> String {
    if iv.tcp_info.is_empty() {
        return String::new();
    }
    iv.tcp_info
        .iter()
        .find(|t| t.stream == stream)
        .and_then(|t| t.tcp_info.srtt_ns)
        .map_or_else(|| NA.to_owned(), |ns| fmt_ns_auto(to_f64(ns)))
}

/// The `sRTT` and `Cwnd` cells of a stream's sender row: its last `TCP_INFO`.
pub(super) fn srtt_cwnd(info: Option<&TcpInfo>) -> [String; 2] {
    let info = info.cloned().unwrap_or_default();
    [
        info.srtt_ns
            .map_or_else(|| NA.to_owned(), |ns| fmt_ns_auto(to_f64(ns))),
        info.cwnd_segments
            .map_or_else(|| NA.to_owned(), |c| fmt_count(u64::from(c))),
    ]
}

/// What a reader of a test's table needs of its context: one line per end naming its host,
/// kernel and interface, and the CPU block. Nothing when the document has neither.
pub(super) fn blocks(out: &mut String, meta: &Meta) {
    let server = server_label(meta.peer);
    let hosts = &meta.hosts;
    if hosts.client.is_some() || hosts.server.is_some() {
        out.push('\n');
        let mut g = Grid::new(vec![Col::left(), Col::left()]);
        g.row([
            "client".into(),
            host_line(hosts.client.as_ref(), meta.peer, false),
        ]);
        g.row([
            server.into(),
            host_line(hosts.server.as_ref(), meta.peer, true),
        ]);
        g.render(out);
    }
    let cpu = &meta.cpu;
    if cpu.client.is_some() || cpu.server.is_some() {
        out.push('\n');
        cpu_block(out, cpu.client.as_ref(), cpu.server.as_ref(), server);
    }
    if let Some(ifs) = &meta.interfaces {
        out.push('\n');
        let mut g = Grid::new(vec![Col::left(), Col::left()]);
        for (end, d) in [("client", &ifs.client), (server, &ifs.server)] {
            if let Some(d) = d {
                g.row([end.into(), interface_line(d)]);
            }
        }
        g.render(out);
    }
}

/// What one end's interface counted over the test, as `sar -n DEV` would show it.
fn interface_line(d: &sonde_wire::InterfaceDelta) -> String {
    format!(
        "{}: received {} packets ({}), sent {} ({}); dropped {} in, {} out; errors {} in, {} out",
        d.name,
        fmt_count(d.rx_packets),
        fmt_bytes(d.rx_bytes),
        fmt_count(d.tx_packets),
        fmt_bytes(d.tx_bytes),
        fmt_count(d.rx_dropped),
        fmt_count(d.tx_dropped),
        fmt_count(d.rx_errors),
        fmt_count(d.tx_errors),
    )
}

/// How the table names the far end: a sonde agent, or some other server.
fn server_label(peer: Peer) -> &'static str {
    match peer {
        Peer::Sonde => "agent",
        Peer::Iperf3 | Peer::Sockperf => "server",
    }
}

/// `client-a: Linux 6.1.0-18-amd64, ens5 (virtio_net, MTU 1500), TCP cubic`.
fn host_line(h: Option<&HostInfo>, peer: Peer, server: bool) -> String {
    let Some(h) = h else {
        return match (server, peer) {
            (true, Peer::Iperf3) => "not reported (an iperf3 server does not say)".into(),
            (true, Peer::Sockperf) => "not reported (a sockperf server does not say)".into(),
            (true, Peer::Sonde) => "not reported (an older agent?)".into(),
            (false, _) => "not known".into(),
        };
    };
    let mut parts = Vec::new();
    let kernel = [h.kernel_name.as_deref(), h.kernel_release.as_deref()]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join(" ");
    if !kernel.is_empty() {
        parts.push(kernel);
    }
    for nic in &h.interfaces {
        parts.push(nic_summary(nic));
    }
    if let Some(cc) = &h.tcp_congestion_control {
        parts.push(format!("TCP {cc}"));
    }
    format!(
        "{}: {}",
        h.host_name.as_deref().unwrap_or("(no name)"),
        if parts.is_empty() {
            NA.to_owned()
        } else {
            parts.join(", ")
        }
    )
}

/// `ens5 (virtio_net, 10 Gbit/s, MTU 1500)`, leaving out what is not known.
fn nic_summary(nic: &NicInfo) -> String {
    let mut facts = Vec::new();
    if let Some(d) = &nic.driver {
        facts.push(d.clone());
    }
    if let Some(s) = nic.speed_mbit_per_second {
        facts.push(speed(s));
    }
    if let Some(m) = nic.mtu_bytes {
        facts.push(format!("MTU {m}"));
    }
    if facts.is_empty() {
        nic.name.clone()
    } else {
        format!("{} ({})", nic.name, facts.join(", "))
    }
}

/// A link speed as the drivers state it: `25 Gbit/s`, `100 Mbit/s`.
fn speed(mbit: u64) -> String {
    if mbit >= 1_000 && mbit.is_multiple_of(1_000) {
        format!("{} Gbit/s", mbit / 1_000)
    } else if mbit >= 1_000 {
        format!("{:.1} Gbit/s", to_f64(mbit) / 1e3)
    } else {
        format!("{mbit} Mbit/s")
    }
}

/// The CPU block: one column per end, `n/a` for an end that could not say.
fn cpu_block(out: &mut String, client: Option<&CpuCost>, server: Option<&CpuCost>, label: &str) {
    let mut g = Grid::new(vec![Col::left(), Col::right(), Col::right()]);
    g.row([
        "CPU, this test's threads".into(),
        "client".into(),
        label.into(),
    ]);
    let mut row = |name: &str, cell: &dyn Fn(&CpuCost) -> Option<String>| {
        let c = |side: Option<&CpuCost>| side.and_then(cell).unwrap_or_else(|| NA.to_owned());
        g.row([format!("  {name}"), c(client), c(server)]);
    };
    row("user", &|c| Some(fmt_secs(c.user_ns)));
    row("system", &|c| Some(fmt_secs(c.system_ns)));
    row("of one core", &|c| c.percent_of_one_core.map(fmt_percent));
    row("over (wall time)", &|c| Some(fmt_secs(c.wall_ns)));
    row("voluntary switches", &|c| {
        c.voluntary_context_switches.map(fmt_count)
    });
    row("involuntary switches", &|c| {
        c.involuntary_context_switches.map(fmt_count)
    });
    row("data syscalls", &|c| c.syscalls.map(fmt_count));
    row("syscalls per message", &|c| {
        c.syscalls_per_message.map(|v| format!("{v:.3}"))
    });
    row("bytes per syscall", &|c| {
        c.syscalls_per_byte
            .filter(|v| *v > 0.0)
            .map(|v| fmt_count((1.0 / v).round() as u64))
    });
    // latte's columns: the test's own rates, then the whole host's (other work counts too).
    let per_second = |v: f64| fmt_count(v.round() as u64);
    row("switches per second", &|c| {
        c.context_switches_per_second.map(per_second)
    });
    row("data syscalls per second", &|c| {
        c.syscalls_per_second.map(per_second)
    });
    row("host interrupts per second", &|c| {
        c.system_interrupts_per_second.map(per_second)
    });
    row("host switches per second", &|c| {
        c.system_context_switches_per_second.map(per_second)
    });
    row("host syscalls per second", &|c| {
        c.system_syscalls_per_second.map(per_second)
    });
    // Newer than the rest: shown only where an end measured it.
    if [client, server]
        .iter()
        .any(|c| c.is_some_and(|c| c.system_softirq_percent.is_some()))
    {
        row("host softirq, of one core", &|c| {
            c.system_softirq_percent.map(|p| format!("{p:.2}%"))
        });
    }
    g.render(out);
}

/// `sonde conf`: every figure of both ends, side by side.
pub(crate) fn conf(r: &ConfResult, out: &mut String) {
    let collected = fmt_timestamp(r.timestamp_unix_ms);
    match &r.server {
        Some(server) => line(
            out,
            format!(
                "sonde {} conf: this host and the agent at {server}, collected {collected}",
                r.sonde_version
            ),
        ),
        None => line(
            out,
            format!(
                "sonde {} conf: this host, collected {collected}",
                r.sonde_version
            ),
        ),
    }
    out.push('\n');
    let mut sides: Vec<(&str, Option<&HostInfo>)> = Vec::new();
    if r.server.is_some() {
        sides.push(("client (this host)", r.hosts.client.as_ref()));
        sides.push(("agent", r.hosts.server.as_ref()));
    } else {
        sides.push(("this host", r.hosts.client.as_ref()));
    }
    let mut cols = vec![Col::left()];
    cols.extend(sides.iter().map(|_| Col::left()));
    let mut g = Grid::new(cols);
    let mut head = vec![String::new()];
    head.extend(sides.iter().map(|(name, _)| (*name).to_owned()));
    g.row(head);
    let mut row = |name: &str, cell: &dyn Fn(&HostInfo) -> Option<String>| {
        let mut cells = vec![name.to_owned()];
        cells.extend(
            sides
                .iter()
                .map(|(_, h)| h.and_then(cell).unwrap_or_else(|| NA.to_owned())),
        );
        g.row(cells);
    };
    row("host name", &|h| h.host_name.clone());
    row("sonde", &|h| h.sonde_version.clone());
    row("CPU", &|h| h.cpu_model.clone());
    row("CPUs", &|h| {
        let logical = h.cpu_logical_count?;
        Some(match h.cpu_available_count {
            Some(a) if a != logical => format!("{logical} ({a} available to sonde)"),
            _ => logical.to_string(),
        })
    });
    row("memory", &|h| h.memory_bytes.map(fmt_bytes));
    row("OS", &|h| match (&h.os_name, &h.os_version) {
        (Some(n), Some(v)) if !n.contains(v.as_str()) => Some(format!("{n} {v}")),
        (Some(n), _) => Some(n.clone()),
        (None, v) => v.clone(),
    });
    row("kernel", &|h| {
        let k = [h.kernel_name.as_deref(), h.kernel_release.as_deref()]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join(" ");
        (!k.is_empty()).then_some(k)
    });
    row("architecture", &|h| h.architecture.clone());
    let nics = sides
        .iter()
        .map(|(_, h)| h.map_or(0, |h| h.interfaces.len()))
        .max()
        .unwrap_or(0);
    for i in 0..nics {
        let nic = move |h: &HostInfo| h.interfaces.get(i).cloned();
        row("interface", &|h| nic(h).map(|n| n.name));
        row("  driver", &|h| nic(h)?.driver);
        row("  speed", &|h| nic(h)?.speed_mbit_per_second.map(speed));
        row("  MTU", &|h| nic(h)?.mtu_bytes.map(|m| format!("{m} B")));
        row("  up", &|h| {
            nic(h)?.up.map(|u| if u { "yes" } else { "no" }.to_owned())
        });
        row("  offloads on", &|h| offloads(&nic(h)?, true));
        row("  offloads off", &|h| offloads(&nic(h)?, false));
    }
    row("TCP congestion control", &|h| {
        h.tcp_congestion_control.clone()
    });
    row("  available", &|h| {
        h.tcp_congestion_control_available
            .as_ref()
            .map(|v| v.join(" "))
    });
    let b = |h: &HostInfo| h.socket_buffers;
    row("net.core.rmem_max", &|h| b(h).rmem_max_bytes.map(bytes));
    row("net.core.wmem_max", &|h| b(h).wmem_max_bytes.map(bytes));
    row("net.core.rmem_default", &|h| {
        b(h).rmem_default_bytes.map(bytes)
    });
    row("net.core.wmem_default", &|h| {
        b(h).wmem_default_bytes.map(bytes)
    });
    row("net.ipv4.tcp_rmem", &|h| {
        b(h).tcp_rmem_bytes.map(|t| triple(t, " B"))
    });
    row("net.ipv4.tcp_wmem", &|h| {
        b(h).tcp_wmem_bytes.map(|t| triple(t, " B"))
    });
    row("net.ipv4.udp_mem", &|h| {
        b(h).udp_mem_pages.map(|t| triple(t, " pages"))
    });
    g.render(out);
    if !r.warnings.is_empty() {
        out.push('\n');
        for w in &r.warnings {
            line(out, format!("warning: {w}"));
        }
    }
}

/// An exact byte count, as `sysctl` states it: `212,992 B`.
fn bytes(n: u64) -> String {
    format!("{} B", fmt_count(n))
}

/// `4,096 / 131,072 / 6,291,456 B`: min, default, max.
fn triple(t: MinDefaultMax, unit: &str) -> String {
    format!(
        "{} / {} / {}{unit}",
        fmt_count(t.min),
        fmt_count(t.default),
        fmt_count(t.max)
    )
}

/// The offloads that are on (or off), as `ethtool -k` names them; `none` when none is, `None`
/// when the interface could say nothing about any.
fn offloads(nic: &NicInfo, on: bool) -> Option<String> {
    let o = nic.offloads;
    let all = [
        ("rx-checksum", o.rx_checksum),
        ("tx-checksum", o.tx_checksum),
        ("tso", o.tso),
        ("gso", o.gso),
        ("gro", o.gro),
        ("lro", o.lro),
    ];
    if all.iter().all(|(_, v)| v.is_none()) {
        return None;
    }
    let names: Vec<&str> = all
        .iter()
        .filter(|(_, v)| *v == Some(on))
        .map(|(n, _)| *n)
        .collect();
    Some(if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(" ")
    })
}

/// Conf's entry in quick's table.
pub(crate) fn headline(_: &ConfResult) -> (String, String) {
    ("configuration".into(), String::new())
}
