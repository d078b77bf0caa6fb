//! The CSV columns and rows of a test's context: both ends' configuration (`sonde conf`, and
//! host name and kernel on every summary row), their CPU cost, and the TCP senders' `TCP_INFO`.

use super::{opt, opt_f64, Row};
use crate::model::{
    ConfResult, CpuCost, HostInfo, Meta, MinDefaultMax, StreamDirection, TcpInfo, TestResult,
    ThroughputResult,
};

/// `TCP_INFO` of a TCP sender: `stream` and `interval_stream` rows of throughput.
const TCP_INFO: [&str; 15] = [
    "tcp_srtt_ns",
    "tcp_rttvar_ns",
    "tcp_min_rtt_ns",
    "tcp_cwnd_segments",
    "tcp_ssthresh_segments",
    "tcp_mss_bytes",
    "tcp_retransmits",
    "tcp_unacked_segments",
    "tcp_pacing_rate_bits_per_second",
    "tcp_delivery_rate_bits_per_second",
    "tcp_delivery_rate_app_limited",
    "tcp_notsent_bytes",
    "tcp_busy_ns",
    "tcp_rwnd_limited_ns",
    "tcp_sndbuf_limited_ns",
];

/// Each end's context on a summary row.
const CONTEXT: [&str; 34] = [
    "client_host_name",
    "client_kernel_release",
    "client_cpu_wall_ns",
    "client_cpu_user_ns",
    "client_cpu_system_ns",
    "client_cpu_percent_of_one_core",
    "client_voluntary_context_switches",
    "client_involuntary_context_switches",
    "client_syscalls",
    "client_syscalls_per_message",
    "client_syscalls_per_byte",
    "server_host_name",
    "server_kernel_release",
    "server_cpu_wall_ns",
    "server_cpu_user_ns",
    "server_cpu_system_ns",
    "server_cpu_percent_of_one_core",
    "server_voluntary_context_switches",
    "server_involuntary_context_switches",
    "server_syscalls",
    "server_syscalls_per_message",
    "server_syscalls_per_byte",
    // latte's columns, after the rest so that the columns before keep their places.
    "client_context_switches_per_second",
    "client_syscalls_per_second",
    "client_system_interrupts_per_second",
    "client_system_context_switches_per_second",
    "client_system_syscalls_per_second",
    "server_context_switches_per_second",
    "server_syscalls_per_second",
    "server_system_interrupts_per_second",
    "server_system_context_switches_per_second",
    "server_system_syscalls_per_second",
    // After latte's, for the same reason.
    "client_system_softirq_percent",
    "server_system_softirq_percent",
];

/// `sonde conf`: one row per end (`host`), one per interface (`interface`).
pub(crate) const CONF: [&str; 40] = [
    "side",
    "host_name",
    "host_sonde_version",
    "cpu_model",
    "cpu_logical_count",
    "cpu_available_count",
    "memory_bytes",
    "os_name",
    "os_version",
    "kernel_name",
    "kernel_release",
    "architecture",
    "tcp_congestion_control",
    "tcp_congestion_control_available",
    "rmem_max_bytes",
    "wmem_max_bytes",
    "rmem_default_bytes",
    "wmem_default_bytes",
    "tcp_rmem_min_bytes",
    "tcp_rmem_default_bytes",
    "tcp_rmem_max_bytes",
    "tcp_wmem_min_bytes",
    "tcp_wmem_default_bytes",
    "tcp_wmem_max_bytes",
    "udp_mem_low_pages",
    "udp_mem_pressure_pages",
    "udp_mem_high_pages",
    "interface",
    "driver",
    "speed_mbit_per_second",
    "mtu_bytes",
    "up",
    "offload_rx_checksum",
    "offload_tx_checksum",
    "offload_tso",
    "offload_gso",
    "offload_gro",
    "offload_lro",
    "interface_count",
    "interfaces",
];

/// The context columns `result` needs, after its own.
pub(super) fn columns(result: &TestResult) -> Vec<&'static str> {
    let mut cols = Vec::new();
    if has_throughput(result) {
        cols.extend(TCP_INFO);
    }
    if has_context(result) {
        cols.extend(CONTEXT);
    }
    cols
}

/// Whether `result` holds a run whose summary row carries the context columns.
fn has_context(result: &TestResult) -> bool {
    let kind = result.kind();
    !kind.metas().is_empty() || kind.parts().iter().any(|(_, r)| has_context(r))
}

/// Whether `result` holds a throughput run, whose rows carry the `TCP_INFO` columns.
fn has_throughput(result: &TestResult) -> bool {
    let kind = result.kind();
    kind.has_streams() || kind.parts().iter().any(|(_, r)| has_throughput(r))
}

/// A summary row's context cells.
pub(super) fn summary_cells(meta: &Meta) -> Vec<(&'static str, String)> {
    let host = |h: Option<&HostInfo>, name: bool| {
        h.and_then(|h| {
            if name {
                h.host_name.clone()
            } else {
                h.kernel_release.clone()
            }
        })
        .unwrap_or_default()
    };
    let mut cells = vec![
        ("client_host_name", host(meta.hosts.client.as_ref(), true)),
        (
            "client_kernel_release",
            host(meta.hosts.client.as_ref(), false),
        ),
        ("server_host_name", host(meta.hosts.server.as_ref(), true)),
        (
            "server_kernel_release",
            host(meta.hosts.server.as_ref(), false),
        ),
    ];
    for (side, cost) in [
        (&CONTEXT[2..11], meta.cpu.client.as_ref()),
        (&CONTEXT[13..22], meta.cpu.server.as_ref()),
    ] {
        cells.extend(side.iter().copied().zip(cpu_values(cost)));
    }
    for (side, cost) in [
        (&CONTEXT[22..27], meta.cpu.client.as_ref()),
        (&CONTEXT[27..32], meta.cpu.server.as_ref()),
    ] {
        cells.extend(side.iter().copied().zip(cpu_rates(cost)));
    }
    for (name, cost) in [
        (CONTEXT[32], meta.cpu.client.as_ref()),
        (CONTEXT[33], meta.cpu.server.as_ref()),
    ] {
        cells.push((name, opt_f64(cost.and_then(|c| c.system_softirq_percent))));
    }
    cells
}

/// The CPU figures in the order of `CONTEXT`'s `_cpu_wall_ns` to `_syscalls_per_byte`.
fn cpu_values(c: Option<&CpuCost>) -> [String; 9] {
    let Some(c) = c else {
        return Default::default();
    };
    [
        c.wall_ns.to_string(),
        c.user_ns.to_string(),
        c.system_ns.to_string(),
        opt_f64(c.percent_of_one_core),
        opt(c.voluntary_context_switches),
        opt(c.involuntary_context_switches),
        opt(c.syscalls),
        opt_f64(c.syscalls_per_message),
        opt_f64(c.syscalls_per_byte),
    ]
}

/// The per-second figures in the order of `CONTEXT`'s `_context_switches_per_second` to
/// `_system_syscalls_per_second`.
fn cpu_rates(c: Option<&CpuCost>) -> [String; 5] {
    let Some(c) = c else {
        return Default::default();
    };
    [
        opt_f64(c.context_switches_per_second),
        opt_f64(c.syscalls_per_second),
        opt_f64(c.system_interrupts_per_second),
        opt_f64(c.system_context_switches_per_second),
        opt_f64(c.system_syscalls_per_second),
    ]
}

/// A TCP sender's `TCP_INFO` cells; none when there is none.
pub(super) fn tcp_cells(t: Option<&TcpInfo>) -> Vec<(&'static str, String)> {
    let Some(t) = t else {
        return Vec::new();
    };
    let o32 = |v: Option<u32>| opt(v.map(u64::from));
    let values = [
        opt(t.srtt_ns),
        opt(t.rttvar_ns),
        opt(t.min_rtt_ns),
        o32(t.cwnd_segments),
        o32(t.ssthresh_segments),
        o32(t.mss_bytes),
        opt(t.retransmits),
        o32(t.unacked_segments),
        opt(t.pacing_rate_bits_per_second),
        opt(t.delivery_rate_bits_per_second),
        t.delivery_rate_app_limited
            .map_or_else(String::new, |b| b.to_string()),
        o32(t.notsent_bytes),
        opt(t.busy_ns),
        opt(t.rwnd_limited_ns),
        opt(t.sndbuf_limited_ns),
    ];
    TCP_INFO.into_iter().zip(values).collect()
}

/// One `interval_stream` row per stream and interval with a `TCP_INFO` sample.
pub(super) fn interval_stream_rows(config: &Row, r: &ThroughputResult, rows: &mut Vec<Row>) {
    for iv in &r.intervals {
        for t in &iv.tcp_info {
            let at = r.streams.iter().position(|s| s.stream == t.stream);
            let bytes = at.and_then(|i| iv.stream_bytes.get(i));
            let direction = at.map_or("", |i| match r.streams[i].direction {
                StreamDirection::ClientToServer => "client_to_server",
                StreamDirection::ServerToClient => "server_to_client",
            });
            let mut row = config.clone();
            row.extend([
                ("row", "interval_stream".to_owned()),
                ("stream", t.stream.to_string()),
                ("stream_direction", direction.to_owned()),
                ("interval_start_ns", iv.start_ns.to_string()),
                ("interval_end_ns", iv.end_ns.to_string()),
                ("receiver_bytes", opt(bytes.copied())),
            ]);
            row.extend(tcp_cells(Some(&t.tcp_info)));
            rows.push(row);
        }
    }
}

/// `sonde conf`'s rows: each end's host, then its interfaces.
pub(crate) fn conf_rows(c: &ConfResult, rows: &mut Vec<Row>) {
    let mut base = Row::new();
    base.insert("test", "conf".to_owned());
    base.insert("sonde_version", c.sonde_version.clone());
    base.insert("timestamp_unix_ms", c.timestamp_unix_ms.to_string());
    base.insert("server", c.server.clone().unwrap_or_default());
    let mut first = true;
    for (side, host) in [("client", &c.hosts.client), ("server", &c.hosts.server)] {
        if side == "server" && c.server.is_none() {
            continue;
        }
        let mut row = base.clone();
        row.insert("row", "host".to_owned());
        row.insert("side", side.to_owned());
        if first {
            row.insert("warnings", c.warnings.join("; "));
            first = false;
        }
        let Some(h) = host else {
            rows.push(row);
            continue;
        };
        host_cells(h, &mut row);
        rows.push(row);
        for nic in &h.interfaces {
            let mut row = base.clone();
            row.insert("row", "interface".to_owned());
            row.insert("side", side.to_owned());
            let b = |v: Option<bool>| v.map_or_else(String::new, |b| b.to_string());
            let o = nic.offloads;
            row.extend([
                ("interface", nic.name.clone()),
                ("driver", nic.driver.clone().unwrap_or_default()),
                ("speed_mbit_per_second", opt(nic.speed_mbit_per_second)),
                ("mtu_bytes", opt(nic.mtu_bytes.map(u64::from))),
                ("up", b(nic.up)),
                ("offload_rx_checksum", b(o.rx_checksum)),
                ("offload_tx_checksum", b(o.tx_checksum)),
                ("offload_tso", b(o.tso)),
                ("offload_gso", b(o.gso)),
                ("offload_gro", b(o.gro)),
                ("offload_lro", b(o.lro)),
            ]);
            rows.push(row);
        }
    }
}

fn host_cells(h: &HostInfo, row: &mut Row) {
    let s = |v: &Option<String>| v.clone().unwrap_or_default();
    let n = |v: Option<u64>| opt(v);
    let b = h.socket_buffers;
    let triple = |t: Option<MinDefaultMax>| {
        t.map_or_else(Default::default, |t| {
            [t.min.to_string(), t.default.to_string(), t.max.to_string()]
        })
    };
    let [rmin, rdef, rmax] = triple(b.tcp_rmem_bytes);
    let [wmin, wdef, wmax] = triple(b.tcp_wmem_bytes);
    let [ulow, upress, uhigh] = triple(b.udp_mem_pages);
    row.extend([
        ("host_name", s(&h.host_name)),
        ("host_sonde_version", s(&h.sonde_version)),
        ("cpu_model", s(&h.cpu_model)),
        ("cpu_logical_count", n(h.cpu_logical_count.map(u64::from))),
        (
            "cpu_available_count",
            n(h.cpu_available_count.map(u64::from)),
        ),
        ("memory_bytes", n(h.memory_bytes)),
        ("os_name", s(&h.os_name)),
        ("os_version", s(&h.os_version)),
        ("kernel_name", s(&h.kernel_name)),
        ("kernel_release", s(&h.kernel_release)),
        ("architecture", s(&h.architecture)),
        ("tcp_congestion_control", s(&h.tcp_congestion_control)),
        (
            "tcp_congestion_control_available",
            h.tcp_congestion_control_available
                .as_ref()
                .map_or_else(String::new, |v| v.join(" ")),
        ),
        ("rmem_max_bytes", n(b.rmem_max_bytes)),
        ("wmem_max_bytes", n(b.wmem_max_bytes)),
        ("rmem_default_bytes", n(b.rmem_default_bytes)),
        ("wmem_default_bytes", n(b.wmem_default_bytes)),
        ("tcp_rmem_min_bytes", rmin),
        ("tcp_rmem_default_bytes", rdef),
        ("tcp_rmem_max_bytes", rmax),
        ("tcp_wmem_min_bytes", wmin),
        ("tcp_wmem_default_bytes", wdef),
        ("tcp_wmem_max_bytes", wmax),
        ("udp_mem_low_pages", ulow),
        ("udp_mem_pressure_pages", upress),
        ("udp_mem_high_pages", uhigh),
        ("interface_count", h.interfaces.len().to_string()),
        (
            "interfaces",
            h.interfaces
                .iter()
                .map(|i| i.name.as_str())
                .collect::<Vec<_>>()
                .join(" "),
        ),
    ]);
}
