//! `sonde mtu`: the path MTU to an agent by DF probes, and the TCP MSS each end settles on.
//!
//! Two sessions, each an ordinary latency session, so any agent that echoes serves (no new
//! message on the wire):
//! 1. UDP with `--dont-fragment`: the agent's echo sets DF on its end (`IP_PMTUDISC_DO`, read
//!    back in its report) and sends every datagram back at its size. This end sends the probes
//!    (`sonde_net::mtu`: DF without the kernel's cached path MTU in the way, ICMP errors read
//!    from the error queue) and [`sonde_engine::mtu::MtuSearch`] chooses their sizes. A probe
//!    crosses only if it crosses both ways: the answer is the smaller direction's MTU.
//! 2. TCP: a connection to the agent's echo with 64 KiB sent and echoed back (full-size
//!    segments both ways, so PMTU discovery runs), then each end's MSS: this host's from
//!    `TCP_MAXSEG` and `TCP_INFO`, the agent's at connect from its socket read-back (asked for
//!    by `-N`, which the latency echo sets anyway) and at the end from the `TCP_INFO` its report
//!    carries for the echo (an agent older than that report: `null`).

use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sonde_net::cpu::ThreadsMeter;
use sonde_net::mtu::{self as probe, Fate, SearchConfig};
use sonde_report::{MtuBound, MtuProbe, MtuProbeFate, MtuResult, MtuTcp, Warning};
use sonde_wire::{Direction, Protocol, SocketOptions, TestKind, TestSpec, Tuning};

use crate::session::{self, ClientChannel};
use crate::{ClientError, Target};

/// How `sonde mtu` searches.
#[derive(Debug, Clone)]
pub struct MtuOptions {
    /// The whole search's time budget.
    pub budget: Duration,
    /// Silent probes of one size before it is read as too big.
    pub tries: u32,
    /// At most this many probes.
    pub max_probes: u32,
    /// Also read the TCP MSS at each end over a TCP connection to the agent.
    pub tcp: bool,
}

impl Default for MtuOptions {
    fn default() -> Self {
        Self {
            budget: Duration::from_secs(10),
            tries: 3,
            max_probes: MAX_MTU_PROBES,
            tcp: true,
        }
    }
}

/// The default, and most, probes of a search.
pub const MAX_MTU_PROBES: u32 = 200;
/// Bytes each way over the TCP connection: several full-size segments at any MTU up to 64 KiB.
const TCP_EXCHANGE: usize = 65_536;
/// How long the TCP exchange may take before it is read as stalled.
const TCP_EXCHANGE_TIMEOUT: Duration = Duration::from_secs(3);
/// What the agent is told the session lasts beyond the search (connection, report).
const SESSION_SLACK: Duration = Duration::from_secs(5);

crate::test::impl_test!(
    /// A path MTU search against a sonde agent. Interrupted (Ctrl-C), the search stops after
    /// its current probe and the result says what it had found, marked `interrupted`.
    MtuOptions, Target => MtuResult, mtu
);

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn mtu(
    target: &Target,
    opt: &MtuOptions,
    interrupt: &AtomicBool,
) -> Result<MtuResult, ClientError> {
    if opt.tries == 0 || opt.max_probes == 0 || opt.max_probes > MAX_MTU_PROBES {
        return Err(ClientError::Usage(format!(
            "sonde mtu: --tries must be at least 1 and --max-probes 1 to {MAX_MTU_PROBES}"
        )));
    }
    supported(target)?;
    let ipv6 = target.addr.is_ipv6()
        && !matches!(target.addr.ip(), std::net::IpAddr::V6(a) if a.to_ipv4_mapped().is_some());
    let (floor, ip_header) = if ipv6 {
        (probe::IPV6_MIN_MTU, probe::IPV6_HEADER)
    } else {
        (probe::IPV4_MIN_MTU, probe::IPV4_HEADER)
    };
    let overhead = ip_header + probe::UDP_HEADER;
    let spec = TestSpec {
        kind: TestKind::Latency,
        protocol: Protocol::Udp,
        direction: Direction::Forward,
        streams: 1,
        // The smallest probe: the echo answers any size, and a DF flow is checked against the
        // path MTU this host knows as it joins.
        msg_size: floor - overhead,
        bitrate_per_stream: 0,
        duration_ms: millis(opt.budget + SESSION_SLACK),
        interval_ms: 0,
        read_size: 0,
        socket: SocketOptions {
            dont_fragment: true,
            ..SocketOptions::default()
        },
        omit_ms: 0,
        skip_rx_copy: false,
        bytes: 0,
        blocks: 0,
        request_response: None,
    };
    let mut c = session::connect(target, &spec, Tuning::default())?;
    let ClientChannel::Udp(sock) = &c.channels[0] else {
        return Err(ClientError::Protocol(
            "a UDP session without its flow".into(),
        ));
    };
    probe::prepare(sock).map_err(|e| ClientError::Data(e, 0))?;
    let interface = c
        .context
        .client_host
        .as_ref()
        .and_then(|h| h.interfaces.first())
        .and_then(|i| i.mtu_bytes);
    let ceiling = interface
        .or_else(|| probe::kernel_path_mtu(sock).ok())
        .unwrap_or(1_500)
        .min(probe::MAX_UDP_PAYLOAD + overhead)
        .max(floor);
    let cfg = SearchConfig {
        floor,
        ceiling,
        ip_header,
        tries: opt.tries,
        budget: opt.budget,
        max_probes: opt.max_probes,
    };
    let meter = Arc::new(ThreadsMeter::start());
    let counted = meter.track();
    let stop = AtomicBool::new(false);
    let found = session::stopped_by(interrupt, &stop, || probe::search(sock, &cfg, &stop))
        .map_err(|e| ClientError::Data(e, 0))?;
    let kernel_pmtu = probe::kernel_path_mtu(sock).ok();
    drop(counted);
    let sent = found.probes.len() as u64;
    let bytes: u64 = found
        .probes
        .iter()
        .map(|p| u64::from(p.ip_bytes.saturating_sub(overhead)))
        .sum();
    c.context.client_cpu = meter
        .cost()
        .map(|cost| cost.report(None, Some(sent), Some(bytes)));
    let (report, _) = session::finish_latency(&mut c, found.stopped)?;

    let mut meta = crate::results::meta_for(
        target,
        sonde_report::Peer::Sonde,
        c.session,
        c.started_unix_ms,
        report.overlapping_sessions,
    );
    crate::results::add_context(&mut meta, &c.context, report.cpu.as_ref());
    crate::results::add_sources(&mut meta, &c.context.sources, &report);
    let search = &found.search;
    let largest = search.largest_crossed();
    let bound = match search.upper_bound() {
        sonde_engine::mtu::UpperBound::Ceiling => MtuBound::Ceiling,
        sonde_engine::mtu::UpperBound::Reported => MtuBound::Reported,
        sonde_engine::mtu::UpperBound::Silence => MtuBound::Silence,
    };
    let probes: Vec<MtuProbe> = found
        .probes
        .iter()
        .map(|p| MtuProbe {
            ip_bytes: p.ip_bytes,
            fate: match p.fate {
                Fate::Echoed => MtuProbeFate::Echoed,
                Fate::Silent => MtuProbeFate::Silent,
                Fate::RouterTooBig => MtuProbeFate::RouterTooBig,
                Fate::LocalTooBig => MtuProbeFate::LocalTooBig,
            },
            rtt_ns: p.rtt_ns,
            reported_mtu_bytes: p.reported_mtu,
            reported_by: p.reported_by.map(|a| a.to_string()),
        })
        .collect();
    if found.stopped {
        crate::mark_interrupted(&mut meta);
    }
    let complete = !found.cut_short && !found.stopped;
    if !complete {
        meta.add(&Warning::MtuSearchIncomplete {
            why: if found.stopped {
                "interrupted".to_owned()
            } else {
                format!(
                    "its time ({} s) or probe count ({}) ran out",
                    opt.budget.as_secs_f64(),
                    opt.max_probes
                )
            },
            between: (
                largest.unwrap_or(floor),
                search.smallest_refused().map_or(ceiling, |r| r - 1),
            ),
        });
    }
    if let (Some(path), Some(refused)) = (largest, search.smallest_refused()) {
        if bound == MtuBound::Silence {
            meta.add(&Warning::PathMtuBlackHole {
                crossed: path,
                above: refused,
            });
        }
    }
    if let (Some(path), Some(iface)) = (largest, interface) {
        // Below the interface, bounded by the path (not by the largest UDP datagram, which is
        // the ceiling on an interface of 64 KiB).
        if path < iface && complete && bound != MtuBound::Ceiling {
            let routers: std::collections::BTreeSet<String> = probes
                .iter()
                .filter_map(|p| p.reported_by.clone())
                .collect();
            let how = match bound {
                MtuBound::Reported if !routers.is_empty() => format!(
                    "{} said so",
                    routers.into_iter().collect::<Vec<_>>().join(" and ")
                ),
                MtuBound::Silence => "found by silence: no router said so".to_owned(),
                _ => "this host's kernel refused larger packets".to_owned(),
            };
            meta.add(&Warning::PathMtuBelowInterface {
                path,
                interface: iface,
                how,
                mss: path.saturating_sub(ip_header + 20),
            });
        }
    }
    let agent_df = report.socket.as_ref().and_then(|s| s.dont_fragment);
    let tcp = if opt.tcp && !found.stopped && !interrupt.load(Ordering::Relaxed) {
        // The probes' answer stands without it: a failure here is a warning, not the run's.
        match tcp_mss(target, &mut meta) {
            Ok(t) => Some(t),
            Err(e) => {
                meta.add(&Warning::TcpMssUnknown {
                    reason: format!("{e:#}"),
                });
                None
            }
        }
    } else {
        None
    };
    Ok(MtuResult {
        meta,
        ip_version: if ipv6 { 6 } else { 4 },
        path_mtu_bytes: largest,
        udp_payload_bytes: largest.map(|m| m - overhead),
        ip_header_bytes: ip_header,
        udp_header_bytes: probe::UDP_HEADER,
        interface_mtu_bytes: interface,
        ceiling_bytes: ceiling,
        upper_bound: bound,
        smallest_refused_bytes: search.smallest_refused(),
        tries: opt.tries,
        probe_timeout_ns: found.probe_timeout_ns,
        search_ns: found.elapsed_ns,
        probes_sent: u32::try_from(sent).unwrap_or(u32::MAX),
        probes,
        kernel_path_mtu_bytes: kernel_pmtu,
        agent_dont_fragment: agent_df,
        complete,
        tcp,
    })
}

/// Fails with a usage error where this platform has no DF probe options (anything but Linux),
/// before the agent is asked for anything.
fn supported(target: &Target) -> Result<(), ClientError> {
    let any: std::net::SocketAddr = if target.addr.is_ipv6() {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
    };
    let sock = std::net::UdpSocket::bind(any).map_err(|e| ClientError::Data(e, 0))?;
    sock.connect(target.addr)
        .map_err(|e| ClientError::Connect(e, target.addr))?;
    match probe::prepare(&sock) {
        Err(e) if e.kind() == std::io::ErrorKind::Unsupported => Err(ClientError::Usage(
            "sonde mtu is not supported on this platform: its probes need IP_PMTUDISC_PROBE and \
             IP_RECVERR (Linux)"
                .into(),
        )),
        Err(e) => Err(ClientError::Data(e, 0)),
        Ok(()) => Ok(()),
    }
}

/// The TCP MSS at each end after 64 KiB crossed a connection to the agent's echo both ways.
fn tcp_mss(target: &Target, meta: &mut sonde_report::Meta) -> Result<MtuTcp, ClientError> {
    let spec = TestSpec {
        kind: TestKind::Latency,
        protocol: Protocol::Tcp,
        direction: Direction::Forward,
        streams: 1,
        msg_size: u32::try_from(TCP_EXCHANGE).unwrap_or(u32::MAX),
        bitrate_per_stream: 0,
        duration_ms: millis(TCP_EXCHANGE_TIMEOUT + SESSION_SLACK),
        interval_ms: 0,
        read_size: 0,
        // Asking for an option makes both ends read theirs back, the MSS among them.
        socket: SocketOptions {
            no_delay: true,
            ..SocketOptions::default()
        },
        omit_ms: 0,
        skip_rx_copy: false,
        bytes: 0,
        blocks: 0,
        request_response: None,
    };
    let mut c = session::connect(target, &spec, Tuning::default())?;
    let client_at_connect = c.context.socket.as_ref().and_then(|(_, a)| a.mss_bytes);
    let ClientChannel::Tcp(stream) = &c.channels[0] else {
        return Err(ClientError::Protocol(
            "a TCP session without its stream".into(),
        ));
    };
    let completed = exchange(stream).map_err(|e| ClientError::Data(e, 0))?;
    let client_end = sonde_net::socket::tcp_mss(stream).ok();
    let (report, _) = session::finish_latency(&mut c, false)?;
    let agent_at_connect = report.socket.as_ref().and_then(|s| s.mss_bytes);
    let agent_end = report
        .echoed
        .first()
        .and_then(|e| e.tcp_info.as_ref())
        .and_then(|t| t.mss);
    if !completed {
        meta.add(&Warning::TcpStalledOnPath {
            bytes: TCP_EXCHANGE as u64,
            within_s: TCP_EXCHANGE_TIMEOUT.as_secs(),
            mss: client_end.or(client_at_connect),
        });
    }
    Ok(MtuTcp {
        client_mss_at_connect_bytes: client_at_connect,
        client_mss_bytes: client_end,
        agent_mss_at_connect_bytes: agent_at_connect,
        agent_mss_bytes: agent_end,
        exchanged_bytes: TCP_EXCHANGE as u64,
        completed,
    })
}

/// Sends [`TCP_EXCHANGE`] bytes and reads them back within [`TCP_EXCHANGE_TIMEOUT`]: whether
/// all came back.
fn exchange(stream: &std::net::TcpStream) -> std::io::Result<bool> {
    let deadline = Instant::now() + TCP_EXCHANGE_TIMEOUT;
    let data = vec![0u8; TCP_EXCHANGE];
    let mut s = stream;
    s.set_write_timeout(Some(TCP_EXCHANGE_TIMEOUT))?;
    if let Err(e) = s.write_all(&data) {
        return if sonde_net::fault::timed_out(&e) {
            Ok(false)
        } else {
            Err(e)
        };
    }
    let mut buf = vec![0u8; TCP_EXCHANGE];
    let mut got = 0;
    while got < TCP_EXCHANGE {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(false);
        }
        s.set_read_timeout(Some(left))?;
        match s.read(&mut buf[got..]) {
            Ok(0) => return Ok(false),
            Ok(n) => got += n,
            Err(e) if sonde_net::fault::again(&e) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}
