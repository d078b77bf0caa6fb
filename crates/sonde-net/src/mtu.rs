//! `sonde mtu`'s probe loop: DF datagrams of the sizes [`MtuSearch`] asks for, sent one at a
//! time on a UDP flow whose agent echoes each one back unchanged (a latency session's echo), and
//! what became of each: echoed, refused as too big (by a router's ICMP, read from the error
//! queue with the MTU it named and its address, or by this host's kernel), or silent.
//!
//! Bounded three ways: each probe has a timeout, the search a time budget and a probe count.

use std::io;
use std::net::{IpAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sonde_engine::mtu::{MtuSearch, ProbeFate};

use crate::{fault, sys};

/// IPv4's header without options, bytes.
pub const IPV4_HEADER: u32 = 20;
/// IPv6's fixed header, bytes.
pub const IPV6_HEADER: u32 = 40;
/// UDP's header, bytes.
pub const UDP_HEADER: u32 = 8;
/// The largest UDP payload over IPv4 (65,535 less the headers): the largest datagram probed.
pub const MAX_UDP_PAYLOAD: u32 = 65_507;
/// The smallest MTU a link may have: 68 for IPv4 (RFC 791), 1,280 for IPv6 (RFC 8200). The
/// search starts there (it must cross, or nothing does).
pub const IPV4_MIN_MTU: u32 = 68;
/// See [`IPV4_MIN_MTU`].
pub const IPV6_MIN_MTU: u32 = 1_280;
/// A probe's timeout before any echo has come back.
pub const FIRST_PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// The shortest probe timeout, once the RTT is known: the timeout is four times the longest RTT
/// seen, at least this.
pub const MIN_PROBE_TIMEOUT: Duration = Duration::from_millis(50);

/// How a search runs.
#[derive(Debug, Clone, Copy)]
pub struct SearchConfig {
    /// The smallest IP packet size tried ([`IPV4_MIN_MTU`] or [`IPV6_MIN_MTU`]).
    pub floor: u32,
    /// The largest: the local interface's MTU, or the largest UDP datagram, whichever is less.
    pub ceiling: u32,
    /// The IP header's size (20 or 40); the UDP payload of a probe is its size less this and 8.
    pub ip_header: u32,
    /// Silent probes of one size before it is read as too big.
    pub tries: u32,
    /// The whole search's time budget.
    pub budget: Duration,
    /// At most this many probes.
    pub max_probes: u32,
}

/// What became of one probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Its echo came back.
    Echoed,
    /// No echo within its timeout.
    Silent,
    /// A router said it is too big ("fragmentation needed", "packet too big").
    RouterTooBig,
    /// This host's kernel refused to send it (larger than the interface's MTU).
    LocalTooBig,
}

/// One probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probe {
    /// Its IP packet size, bytes (headers included).
    pub ip_bytes: u32,
    /// What became of it.
    pub fate: Fate,
    /// Its round trip, for an echoed probe, ns.
    pub rtt_ns: Option<u64>,
    /// The MTU the refusal named, for a refused probe.
    pub reported_mtu: Option<u32>,
    /// The router that refused it.
    pub reported_by: Option<IpAddr>,
}

/// What a search found.
#[derive(Debug, Clone)]
pub struct SearchOutcome {
    /// Every probe, in order.
    pub probes: Vec<Probe>,
    /// The search's state at its end: the answer and how its upper bound was learnt.
    pub search: MtuSearch,
    /// The search ran out of time or probes before its end.
    pub cut_short: bool,
    /// Stopped by the caller's flag.
    pub stopped: bool,
    /// The longest probe timeout used, ns.
    pub probe_timeout_ns: u64,
    /// The whole search, ns.
    pub elapsed_ns: u64,
}

/// Makes `sock` (connected to the agent's echo) send probes: DF, the kernel's cached path MTU
/// ignored, ICMP errors queued. Fails with [`io::ErrorKind::Unsupported`] where the options do
/// not exist (anything but Linux).
///
/// # Errors
/// The kernel refused an option.
pub fn prepare(sock: &UdpSocket) -> io::Result<()> {
    sys::set_mtu_probing(sock, is_ipv6(sock))
}

fn is_ipv6(sock: &UdpSocket) -> bool {
    matches!(sock.peer_addr(), Ok(std::net::SocketAddr::V6(p)) if p.ip().to_ipv4_mapped().is_none())
}

/// The path MTU this host's kernel knows toward `sock`'s peer (`IP_MTU`): the route's MTU, or
/// less where a router said so and the kernel remembers it.
///
/// # Errors
/// Not connected, or not available on this platform.
pub fn kernel_path_mtu(sock: &UdpSocket) -> io::Result<u32> {
    sys::path_mtu(sys::sock_ref(sock), is_ipv6(sock))
}

/// Runs the search on `sock` (prepared with [`prepare`], joined to an echo). Each probe's
/// payload starts with its sequence number (8 bytes, big-endian); an echo counts only with the
/// same number and size.
///
/// # Errors
/// A socket error other than those a probe's fate explains (the agent's port closed, ...).
pub fn search(
    sock: &UdpSocket,
    cfg: &SearchConfig,
    stop: &AtomicBool,
) -> io::Result<SearchOutcome> {
    let started = Instant::now();
    let deadline = started + cfg.budget;
    let mut search = MtuSearch::new(cfg.floor, cfg.ceiling, cfg.tries);
    let mut out = SearchOutcome {
        probes: Vec::new(),
        search: search.clone(),
        cut_short: false,
        stopped: false,
        probe_timeout_ns: 0,
        elapsed_ns: 0,
    };
    let overhead = cfg.ip_header + UDP_HEADER;
    let most = (cfg.ceiling.max(overhead + 8) - overhead) as usize;
    let mut msg = vec![0u8; most];
    let mut inbuf = vec![0u8; 65_536];
    // Each probe's size by its sequence number, for late echoes and quoted ICMP errors.
    let mut sizes: Vec<u32> = Vec::new();
    let mut longest_rtt: Option<Duration> = None;
    let drain_errors =
        |sizes: &[u32], search: &mut MtuSearch, probes: &mut Vec<Probe>, current: u64| {
            let mut hit = false;
            sys::udp_take_too_big(sock, |mtu, by, quoted| {
                // The ICMP quotes the refused datagram: its payload starts with the probe's number.
                let seq = quoted
                    .get(..8)
                    .and_then(|b| b.try_into().ok())
                    .map_or(current, u64::from_be_bytes);
                let Some(&size) = usize::try_from(seq).ok().and_then(|i| sizes.get(i)) else {
                    return;
                };
                let mtu = (mtu > 0 && mtu < size).then_some(mtu);
                search.record(size, ProbeFate::TooBig(mtu));
                probes.push(Probe {
                    ip_bytes: size,
                    fate: if by.is_some() {
                        Fate::RouterTooBig
                    } else {
                        Fate::LocalTooBig
                    },
                    rtt_ns: None,
                    reported_mtu: mtu,
                    reported_by: by,
                });
                hit |= seq == current;
            })
            .map(|_| hit)
        };
    while let Some(size) = search.next_size() {
        if stop.load(Ordering::Relaxed) {
            out.stopped = true;
            break;
        }
        let now = Instant::now();
        if now >= deadline || out.probes.len() >= cfg.max_probes as usize {
            out.cut_short = true;
            break;
        }
        let seq = sizes.len() as u64;
        sizes.push(size);
        let payload = &mut msg[..(size - overhead) as usize];
        payload[..8].copy_from_slice(&seq.to_be_bytes());
        let timeout = longest_rtt
            .map_or(FIRST_PROBE_TIMEOUT, |r| (r * 4).max(MIN_PROBE_TIMEOUT))
            .min(FIRST_PROBE_TIMEOUT);
        out.probe_timeout_ns = out.probe_timeout_ns.max(duration_ns(timeout));
        let sent_at = Instant::now();
        if let Err(e) = sock.send(payload) {
            if sys::message_too_long(&e) {
                // Larger than this host lets out (the interface's MTU): its kernel's refusal.
                if !drain_errors(&sizes, &mut search, &mut out.probes, seq)? {
                    let mtu = kernel_path_mtu(sock).ok().filter(|&m| m < size);
                    search.record(size, ProbeFate::TooBig(mtu));
                    out.probes.push(Probe {
                        ip_bytes: size,
                        fate: Fate::LocalTooBig,
                        rtt_ns: None,
                        reported_mtu: mtu,
                        reported_by: None,
                    });
                }
                continue;
            }
            if fault::datagram_dropped(&e) {
                search.record(size, ProbeFate::Silent);
                out.probes.push(silent(size));
                continue;
            }
            return Err(e);
        }
        let until = (sent_at + timeout).min(deadline.max(sent_at + MIN_PROBE_TIMEOUT));
        let waited = loop {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break Waited::TimedOut;
            }
            sock.set_read_timeout(Some(left))?;
            match sock.recv(&mut inbuf) {
                Ok(n) => {
                    let Some(got) = inbuf
                        .get(..8)
                        .and_then(|b| b.try_into().ok())
                        .map(u64::from_be_bytes)
                    else {
                        continue;
                    };
                    let Some(&got_size) = usize::try_from(got).ok().and_then(|i| sizes.get(i))
                    else {
                        continue;
                    };
                    if n as u32 != got_size - overhead {
                        continue;
                    }
                    if got == seq {
                        let rtt = sent_at.elapsed();
                        longest_rtt = Some(longest_rtt.map_or(rtt, |l| l.max(rtt)));
                        break Waited::Echoed(duration_ns(rtt));
                    }
                    // A late echo of an earlier probe: that size crossed after all.
                    search.record(got_size, ProbeFate::Echoed);
                }
                Err(e) if fault::again(&e) => {}
                Err(e) if sys::message_too_long(&e) => {
                    // A router's ICMP for a probe (this one, or a late one for an earlier).
                    if drain_errors(&sizes, &mut search, &mut out.probes, seq)? {
                        break Waited::Refused;
                    }
                }
                Err(e) if fault::port_unreachable(&e) => {
                    return Err(io::Error::new(
                        io::ErrorKind::ConnectionRefused,
                        "the agent's UDP port is closed (ICMP port unreachable): is the agent \
                         still running the test?",
                    ))
                }
                Err(e) => return Err(e),
            }
        };
        match waited {
            // Recorded (and pushed) as the error queue was drained.
            Waited::Refused => {}
            Waited::Echoed(rtt_ns) => {
                search.record(size, ProbeFate::Echoed);
                out.probes.push(Probe {
                    ip_bytes: size,
                    fate: Fate::Echoed,
                    rtt_ns: Some(rtt_ns),
                    reported_mtu: None,
                    reported_by: None,
                });
            }
            Waited::TimedOut => {
                // An ICMP may be queued without having woken the receive.
                if !drain_errors(&sizes, &mut search, &mut out.probes, seq)? {
                    search.record(size, ProbeFate::Silent);
                    out.probes.push(silent(size));
                }
            }
        }
    }
    out.search = search;
    out.elapsed_ns = duration_ns(started.elapsed());
    Ok(out)
}

/// How the wait for a probe's echo ended.
enum Waited {
    /// Its echo came, after this many ns.
    Echoed(u64),
    /// A refusal of it was read from the error queue (and recorded there).
    Refused,
    /// Its timeout passed.
    TimedOut,
}

fn silent(size: u32) -> Probe {
    Probe {
        ip_bytes: size,
        fate: Fate::Silent,
        rtt_ns: None,
        reported_mtu: None,
        reported_by: None,
    }
}

fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    use std::sync::Arc;

    /// An echo on loopback: every datagram back to its sender, until the flag is raised.
    fn echo() -> (UdpSocket, Arc<AtomicBool>, std::thread::JoinHandle<()>) {
        let server = UdpSocket::bind("127.0.0.1:0").unwrap();
        server
            .set_read_timeout(Some(Duration::from_millis(20)))
            .unwrap();
        let s = server.try_clone().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let handle = std::thread::spawn(move || {
            let mut buf = vec![0u8; 65_536];
            // Bounded: 20 ms a turn at most, 30 s in all.
            for _ in 0..1_500 {
                if flag.load(Ordering::Relaxed) {
                    return;
                }
                if let Ok((n, from)) = s.recv_from(&mut buf) {
                    let _ = s.send_to(&buf[..n], from);
                }
            }
        });
        (server, stop, handle)
    }

    #[test]
    fn loopback_carries_the_largest_udp_datagram_in_two_probes() {
        let never = AtomicBool::new(false);
        let (server, stop, handle) = echo();
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        sock.connect(server.local_addr().unwrap()).unwrap();
        prepare(&sock).unwrap();
        let cfg = SearchConfig {
            floor: IPV4_MIN_MTU,
            ceiling: MAX_UDP_PAYLOAD + IPV4_HEADER + UDP_HEADER,
            ip_header: IPV4_HEADER,
            tries: 3,
            budget: Duration::from_secs(5),
            max_probes: 50,
        };
        let out = search(&sock, &cfg, &never).unwrap();
        stop.store(true, Ordering::Relaxed);
        handle.join().unwrap();
        let sizes: Vec<u32> = out.probes.iter().map(|p| p.ip_bytes).collect();
        assert_eq!(sizes, [68, 65_535]);
        assert!(out.probes.iter().all(|p| p.fate == Fate::Echoed));
        assert_eq!(out.search.largest_crossed(), Some(65_535));
        assert!(!out.cut_short);
    }

    #[test]
    fn a_probe_above_the_interface_mtu_is_this_hosts_refusal() {
        let never = AtomicBool::new(false);
        let (server, stop, handle) = echo();
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        sock.connect(server.local_addr().unwrap()).unwrap();
        prepare(&sock).unwrap();
        // A ceiling above what loopback (65,536) and IPv4 allow: the kernel refuses the send.
        let cfg = SearchConfig {
            floor: IPV4_MIN_MTU,
            ceiling: 65_600,
            ip_header: IPV4_HEADER,
            tries: 3,
            budget: Duration::from_secs(5),
            max_probes: 60,
        };
        let out = search(&sock, &cfg, &never).unwrap();
        stop.store(true, Ordering::Relaxed);
        handle.join().unwrap();
        assert_eq!(out.probes[1].ip_bytes, 65_600);
        assert_eq!(out.probes[1].fate, Fate::LocalTooBig);
        assert_eq!(out.search.largest_crossed(), Some(65_535));
    }
}
