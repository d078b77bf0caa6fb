//! This host's configuration, for `sonde conf` and for every result document: CPU, memory, OS and
//! kernel, the network interfaces in use (driver, speed, MTU, offloads), TCP congestion control
//! and the socket buffer limits. The figures travel to the peer as a [`sonde_wire::HostInfo`].
//!
//! Everything is read from `/proc` and `/sys` (Linux), plus ethtool ioctls for offloads and the
//! driver of virtual devices. Collecting never fails for want of a figure: whatever this host
//! cannot say is `None`. Only an interface asked for by name that does not exist is an error.
//!
//! ```
//! use sonde_net::hostinfo;
//!
//! let info = hostinfo::collect("0.1.0", &[]).unwrap(); // every interface that is up
//! assert_eq!(info.sonde_version.as_deref(), Some("0.1.0"));
//! // The interface a test to this peer would leave by (no packet is sent to find it); Linux
//! // only for now, elsewhere an `Unsupported` error.
//! let lo = hostinfo::interface_for_peer("127.0.0.1".parse().unwrap());
//! assert!(lo.is_ok() || cfg!(not(target_os = "linux")));
//! ```

use std::fs;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::time::Instant;

use sonde_wire::{HostInfo, InterfaceDelta, MinDefaultMax, NicInfo, SocketBufferLimits};

use crate::sys;

/// Where Linux lists network interfaces.
const SYS_NET: &str = "/sys/class/net";

/// `IFF_UP` and `IFF_LOOPBACK` of `/sys/class/net/IF/flags` (`linux/if.h`).
const IFF_UP: u32 = 0x1;
const IFF_LOOPBACK: u32 = 0x8;

/// Longest interface name Linux allows (`IFNAMSIZ` less its NUL).
const MAX_INTERFACE_NAME: usize = 15;

/// Why [`collect`] refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum HostInfoError {
    /// An interface asked for by name does not exist here.
    #[error("no network interface named `{0}` on this host")]
    NoSuchInterface(String),
    /// A name no interface can have (empty, too long, with `/` or a space).
    #[error("`{0}` is not a network interface name")]
    InvalidInterfaceName(String),
}

/// Collects this host's configuration. `interfaces` names the network interfaces to describe;
/// empty means every interface that is up, loopback left out.
pub fn collect(sonde_version: &str, interfaces: &[String]) -> Result<HostInfo, HostInfoError> {
    let nics = if interfaces.is_empty() {
        up_interfaces().iter().map(|name| nic_info(name)).collect()
    } else {
        interfaces
            .iter()
            .map(|name| {
                check_interface(name)?;
                Ok(nic_info(name))
            })
            .collect::<Result<_, _>>()?
    };
    let os_release = read("/etc/os-release").or_else(|| read("/usr/lib/os-release"));
    let (os_name, os_version) = os_release.as_deref().map_or((None, None), parse_os_release);
    Ok(HostInfo {
        sonde_version: non_empty(sonde_version.trim()),
        host_name: read_line("/proc/sys/kernel/hostname"),
        cpu_model: read("/proc/cpuinfo").as_deref().and_then(parse_cpu_model),
        cpu_logical_count: read("/sys/devices/system/cpu/online")
            .as_deref()
            .and_then(parse_cpu_list),
        cpu_available_count: std::thread::available_parallelism()
            .ok()
            .and_then(|n| u32::try_from(n.get()).ok()),
        memory_bytes: read("/proc/meminfo").as_deref().and_then(parse_mem_total),
        os_name,
        os_version,
        kernel_name: read_line("/proc/sys/kernel/ostype"),
        kernel_release: read_line("/proc/sys/kernel/osrelease"),
        architecture: non_empty(std::env::consts::ARCH),
        interfaces: nics,
        tcp_congestion_control: read_line("/proc/sys/net/ipv4/tcp_congestion_control"),
        tcp_congestion_control_available: read(
            "/proc/sys/net/ipv4/tcp_available_congestion_control",
        )
        .map(|s| s.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
        .filter(|v| !v.is_empty()),
        socket_buffers: SocketBufferLimits {
            rmem_max_bytes: read_number("/proc/sys/net/core/rmem_max"),
            wmem_max_bytes: read_number("/proc/sys/net/core/wmem_max"),
            rmem_default_bytes: read_number("/proc/sys/net/core/rmem_default"),
            wmem_default_bytes: read_number("/proc/sys/net/core/wmem_default"),
            tcp_rmem_bytes: read("/proc/sys/net/ipv4/tcp_rmem")
                .as_deref()
                .and_then(parse_triple),
            tcp_wmem_bytes: read("/proc/sys/net/ipv4/tcp_wmem")
                .as_deref()
                .and_then(parse_triple),
            udp_mem_pages: read("/proc/sys/net/ipv4/udp_mem")
                .as_deref()
                .and_then(parse_triple),
        },
    })
}

/// This host's configuration as a test with `peer` sees it: the interface toward `peer` only
/// ([`interface_for_peer`]), or every interface that is up when that cannot be found. Never
/// fails: what cannot be read is `None`.
pub fn collect_for_peer(sonde_version: &str, peer: IpAddr) -> HostInfo {
    let interfaces: Vec<String> = interface_for_peer(peer)
        .ok()
        .flatten()
        .into_iter()
        .collect();
    collect(sonde_version, &interfaces)
        .or_else(|_| collect(sonde_version, &[]))
        .unwrap_or_default()
}

/// The interface a test to `peer` leaves this host by, found as the kernel would route it: a
/// UDP socket is connected to the peer (which sends nothing, only picks a route and a source
/// address) and the source address is looked up among the interfaces' addresses.
///
/// `Ok(None)` when the source address belongs to no interface (it cannot on Linux, but
/// interfaces come and go); an error when there is no route to the peer, or the platform cannot
/// list interface addresses ([`io::ErrorKind::Unsupported`]).
pub fn interface_for_peer(peer: IpAddr) -> io::Result<Option<String>> {
    let peer = peer.to_canonical();
    let any: IpAddr = match peer {
        IpAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        IpAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    };
    let sock = UdpSocket::bind(SocketAddr::new(any, 0))?;
    // The discard port; no datagram is ever sent on this socket.
    sock.connect(SocketAddr::new(peer, 9))?;
    let local = sock.local_addr()?.ip();
    let addresses = sys::interface_addresses()?;
    Ok(addresses
        .into_iter()
        .find(|(_, addr)| *addr == local)
        .map(|(name, _)| name))
}

/// The counters of `/sys/class/net/IF/statistics` an [`InterfaceDelta`] holds, in its order.
const INTERFACE_COUNTERS: [&str; 8] = [
    "rx_packets",
    "tx_packets",
    "rx_bytes",
    "tx_bytes",
    "rx_dropped",
    "tx_dropped",
    "rx_errors",
    "tx_errors",
];

/// An interface's counters at one moment, for [`InterfaceSnapshot::delta`] at the test's end.
#[derive(Debug, Clone)]
pub struct InterfaceSnapshot {
    name: String,
    at: Instant,
    counts: [u64; 8],
    /// `ethtool -S`; empty where the driver has none or they cannot be read.
    driver: Vec<(String, u64)>,
    /// The driver's name (`ETHTOOL_GDRVINFO`), read with its statistics.
    driver_name: Option<String>,
}

impl InterfaceSnapshot {
    /// The interface a test with `peer` goes by ([`interface_for_peer`]), read now; `None`
    /// where that cannot be known or its counters read (a platform without sysfs).
    pub fn toward(peer: IpAddr) -> Option<Self> {
        Self::of(&interface_for_peer(peer).ok()??)
    }

    /// The counters of interface `name`, read now (eight small sysfs reads: not for a hot
    /// path).
    pub fn of(name: &str) -> Option<Self> {
        let counts = read_counts(name)?;
        Some(Self {
            name: name.to_owned(),
            at: Instant::now(),
            counts,
            driver: sys::driver_stats(name).unwrap_or_default(),
            driver_name: sys::nic_driver(name),
        })
    }

    /// `-i`: what the interface counted since this reading, without the driver's statistics
    /// (an `ioctl` per interval is not worth it: they are in the test's total), and this
    /// reading moved to now, so that the next call gives the next interval's. `None` once the
    /// interface cannot be read.
    pub fn interval(&mut self) -> Option<InterfaceDelta> {
        let counts = read_counts(&self.name)?;
        let now = Self {
            name: self.name.clone(),
            at: Instant::now(),
            counts,
            driver: Vec::new(),
            driver_name: self.driver_name.clone(),
        };
        let delta = Self::between(self, &now);
        self.at = now.at;
        self.counts = now.counts;
        Some(delta)
    }

    /// [`InterfaceSnapshot::delta`], and [`InterfaceSnapshot::interval`]'s readings without
    /// the driver's.
    pub fn counters_only(&self) -> Self {
        Self {
            driver: Vec::new(),
            ..self.clone()
        }
    }

    /// What the interface counted since this reading; `None` once it cannot be read (it went
    /// away). A counter that went back (the driver reset it) counts 0.
    pub fn delta(&self) -> Option<InterfaceDelta> {
        Some(Self::between(self, &Self::of(&self.name)?))
    }

    fn between(before: &Self, now: &Self) -> InterfaceDelta {
        let this = before;
        let d = |i: usize| now.counts[i].saturating_sub(this.counts[i]);
        InterfaceDelta {
            name: this.name.clone(),
            driver_name: this.driver_name.clone(),
            duration_ns: u64::try_from(now.at.duration_since(this.at).as_nanos())
                .unwrap_or(u64::MAX),
            rx_packets: d(0),
            tx_packets: d(1),
            rx_bytes: d(2),
            tx_bytes: d(3),
            rx_dropped: d(4),
            tx_dropped: d(5),
            rx_errors: d(6),
            tx_errors: d(7),
            // By name: a statistic the driver did not have at the start is left out.
            driver: {
                let before: std::collections::HashMap<&str, u64> =
                    this.driver.iter().map(|(n, v)| (n.as_str(), *v)).collect();
                now.driver
                    .iter()
                    .filter_map(|(name, after)| {
                        let before = before.get(name.as_str())?;
                        Some((name.clone(), after.saturating_sub(*before)))
                    })
                    .collect()
            },
        }
    }
}

/// The [`INTERFACE_COUNTERS`] of interface `name`, in that order (eight small sysfs reads).
fn read_counts(name: &str) -> Option<[u64; 8]> {
    let mut counts = [0; 8];
    for (count, file) in counts.iter_mut().zip(INTERFACE_COUNTERS) {
        *count = read_number(Path::new(SYS_NET).join(name).join("statistics").join(file))?;
    }
    Some(counts)
}

/// What kind of device a network interface is, as far as sending packets through it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    /// The loopback device (`IFF_LOOPBACK`).
    Loopback,
    /// A device with no hardware behind it in sysfs (`/sys/class/net/IF/device` is missing):
    /// veth, bridge, tun/tap, macvlan, VXLAN, WireGuard...
    Virtual,
    /// A device with hardware (or, in a virtual machine, what the guest sees as hardware)
    /// behind it.
    Physical,
    /// Not a name this host knows, or no sysfs to ask.
    Unknown,
}

/// The kind of the interface named `name`, from `/sys/class/net`.
pub fn device_kind(name: &str) -> DeviceKind {
    if check_interface(name).is_err() || !sys_net(name, "").exists() {
        return DeviceKind::Unknown;
    }
    match interface_flags(name) {
        Some(f) if f & IFF_LOOPBACK != 0 => DeviceKind::Loopback,
        // Virtual devices live under /sys/devices/virtual/net and have no `device` link.
        _ if sys_net(name, "device").exists() => DeviceKind::Physical,
        _ => DeviceKind::Virtual,
    }
}

/// Refuses names that are not interface names (they would also be paths under `/sys`), and
/// names that do not exist where the system lists interfaces.
fn check_interface(name: &str) -> Result<(), HostInfoError> {
    let valid = !name.is_empty()
        && name.len() <= MAX_INTERFACE_NAME
        && name != "."
        && name != ".."
        && !name
            .bytes()
            .any(|b| b == b'/' || b == b':' || b.is_ascii_whitespace() || b.is_ascii_control());
    if !valid {
        return Err(HostInfoError::InvalidInterfaceName(name.to_owned()));
    }
    // Where there is no sysfs (not Linux) nothing can be checked, and nothing will be known.
    if Path::new(SYS_NET).is_dir() && !sys_net(name, "").exists() {
        return Err(HostInfoError::NoSuchInterface(name.to_owned()));
    }
    Ok(())
}

/// Every interface that is up and not loopback, by name.
fn up_interfaces() -> Vec<String> {
    let Ok(entries) = fs::read_dir(SYS_NET) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| {
            interface_flags(name).is_some_and(|f| f & IFF_UP != 0 && f & IFF_LOOPBACK == 0)
        })
        .collect();
    names.sort();
    names
}

/// One interface's facts.
fn nic_info(name: &str) -> NicInfo {
    let driver = fs::read_link(sys_net(name, "device/driver"))
        .ok()
        .and_then(|link| link.file_name()?.to_str().and_then(non_empty))
        .or_else(|| sys::nic_driver(name));
    NicInfo {
        name: name.to_owned(),
        driver,
        speed_mbit_per_second: read(sys_net(name, "speed"))
            .as_deref()
            .and_then(parse_speed),
        mtu_bytes: read_number(sys_net(name, "mtu")).filter(|&mtu| mtu > 0),
        up: interface_flags(name).map(|f| f & IFF_UP != 0),
        offloads: sys::nic_offloads(name),
    }
}

fn interface_flags(name: &str) -> Option<u32> {
    let text = read(sys_net(name, "flags"))?;
    let hex = text.trim().trim_start_matches("0x");
    u32::from_str_radix(hex, 16).ok()
}

fn sys_net(name: &str, file: &str) -> PathBuf {
    Path::new(SYS_NET).join(name).join(file)
}

fn read(path: impl AsRef<Path>) -> Option<String> {
    fs::read_to_string(path).ok()
}

/// A file's content, trimmed; `None` if missing or empty.
fn read_line(path: impl AsRef<Path>) -> Option<String> {
    read(path).as_deref().map(str::trim).and_then(non_empty)
}

fn read_number<T: std::str::FromStr>(path: impl AsRef<Path>) -> Option<T> {
    read(path)?.trim().parse().ok()
}

fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_owned())
}

/// `(name, version)` from `os-release(5)`: `PRETTY_NAME` (else `NAME`) and `VERSION_ID` (else
/// `VERSION`).
fn parse_os_release(text: &str) -> (Option<String>, Option<String>) {
    let value = |key: &str| {
        // The last assignment wins, as when the file is sourced by a shell.
        text.lines()
            .rev()
            .filter_map(|line| line.trim().split_once('='))
            .find(|(k, _)| k.trim() == key)
            .map(|(_, v)| unquote(v.trim()))
            .filter(|v| !v.is_empty())
    };
    (
        value("PRETTY_NAME").or_else(|| value("NAME")),
        value("VERSION_ID").or_else(|| value("VERSION")),
    )
}

/// A shell-style value: quotes removed, and within double quotes the escapes `os-release(5)`
/// allows (`\"`, `\\`, `` \` ``, `\$`).
fn unquote(v: &str) -> String {
    let quoted = |q: char| v.len() >= 2 && v.starts_with(q) && v.ends_with(q);
    if quoted('\'') {
        return v[1..v.len() - 1].to_owned();
    }
    if !quoted('"') {
        return v.to_owned();
    }
    let mut out = String::with_capacity(v.len());
    let mut chars = v[1..v.len() - 1].chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some(e @ ('"' | '\\' | '`' | '$')) => out.push(e),
                Some(other) => {
                    out.push('\\');
                    out.push(other);
                }
                None => out.push('\\'),
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The CPU model from `/proc/cpuinfo`: `model name` (x86), else the names other architectures
/// use (`Model` on Raspberry Pi, `Hardware` on older ARM, `cpu model` on MIPS, `cpu` on POWER).
fn parse_cpu_model(text: &str) -> Option<String> {
    ["model name", "Model", "Hardware", "cpu model", "cpu"]
        .into_iter()
        .find_map(|key| {
            text.lines()
                .filter_map(|line| line.split_once(':'))
                .find(|(k, _)| k.trim() == key)
                .and_then(|(_, v)| non_empty(v.trim()))
        })
}

/// The number of CPUs in a kernel CPU list such as `0-3,5,7-8` (`/sys/devices/system/cpu/online`).
fn parse_cpu_list(text: &str) -> Option<u32> {
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    let mut count = 0u32;
    for part in text.split(',') {
        let (lo, hi) = match part.split_once('-') {
            Some((lo, hi)) => (
                lo.trim().parse::<u32>().ok()?,
                hi.trim().parse::<u32>().ok()?,
            ),
            None => {
                let cpu = part.trim().parse::<u32>().ok()?;
                (cpu, cpu)
            }
        };
        count = count.checked_add(hi.checked_sub(lo)?.checked_add(1)?)?;
    }
    Some(count)
}

/// `MemTotal` of `/proc/meminfo`, in bytes (the kernel writes kibibytes as `kB`).
fn parse_mem_total(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let mut words = line["MemTotal:".len()..].split_whitespace();
    let n: u64 = words.next()?.parse().ok()?;
    let bytes = match words.next() {
        Some("kB") => n.checked_mul(1024)?,
        None => n,
        Some(_) => return None,
    };
    (bytes > 0).then_some(bytes)
}

/// A `sysctl` triple (`4096 131072 6291456`, tab-separated).
fn parse_triple(text: &str) -> Option<MinDefaultMax> {
    let mut it = text.split_whitespace().map(str::parse::<u64>);
    let triple = MinDefaultMax {
        min: it.next()?.ok()?,
        default: it.next()?.ok()?,
        max: it.next()?.ok()?,
    };
    it.next().is_none().then_some(triple)
}

/// `/sys/class/net/IF/speed`: Mbit/s, or `-1` (and a read error) when the link has no speed.
fn parse_speed(text: &str) -> Option<u64> {
    let speed: i64 = text.trim().parse().ok()?;
    // Some drivers print SPEED_UNKNOWN (-1) as an unsigned 32-bit number.
    u64::try_from(speed)
        .ok()
        .filter(|&s| s > 0 && s != u64::from(u32::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_os = "linux")]
    use std::process::Command;

    /// The interface an IPv4 destination is routed by in `/proc/net/route` (the main table):
    /// the longest matching prefix, then the lowest metric. An independent oracle for
    /// [`interface_for_peer`] (which also follows policy routing, so it stays the real thing).
    fn route_v4_interface(table: &str, dest: Ipv4Addr) -> Option<String> {
        /// `RTF_UP`: the route is usable.
        const RTF_UP: u32 = 0x1;
        // Addresses are printed as the hex of a native-endian u32 holding network-order bytes.
        let addr = |hex: &str| u32::from_str_radix(hex, 16).ok().map(u32::to_ne_bytes);
        let dest = dest.octets();
        table
            .lines()
            .skip(1)
            .filter_map(|line| {
                let f: Vec<&str> = line.split_whitespace().collect();
                let (iface, net, flags, metric, mask) =
                    (f.first()?, f.get(1)?, f.get(3)?, f.get(6)?, f.get(7)?);
                let net = addr(net)?;
                let mask = addr(mask)?;
                let flags = u32::from_str_radix(flags, 16).ok()?;
                let metric: u32 = metric.parse().ok()?;
                let matches = (0..4).all(|i| dest[i] & mask[i] == net[i] & mask[i]);
                (flags & RTF_UP != 0 && matches).then(|| {
                    (
                        u32::from_be_bytes(mask).count_ones(),
                        metric,
                        (*iface).to_owned(),
                    )
                })
            })
            .max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)))
            .map(|(_, _, iface)| iface)
    }

    #[test]
    fn os_release_values_are_unquoted_and_preferred_in_order() {
        let debian = "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nNAME=\"Debian GNU/Linux\"\n\
                      VERSION_ID=\"12\"\nVERSION=\"12 (bookworm)\"\nID=debian\n";
        assert_eq!(
            parse_os_release(debian),
            (
                Some("Debian GNU/Linux 12 (bookworm)".into()),
                Some("12".into())
            )
        );
        // No PRETTY_NAME or VERSION_ID: the plain ones; single quotes; comments and blanks.
        let plain = "# comment\n\nNAME='Alpine Linux'\nVERSION=3.19.1\n";
        assert_eq!(
            parse_os_release(plain),
            (Some("Alpine Linux".into()), Some("3.19.1".into()))
        );
        let escaped = r#"PRETTY_NAME="say \"hi\" \\ \$5""#;
        assert_eq!(
            parse_os_release(escaped).0.as_deref(),
            Some(r#"say "hi" \ $5"#)
        );
        // Empty values are unknown, not "".
        assert_eq!(parse_os_release("NAME=\"\"\nVERSION_ID=\n"), (None, None));
        assert_eq!(parse_os_release(""), (None, None));
    }

    #[test]
    fn cpu_model_comes_from_whichever_line_the_architecture_has() {
        let x86 = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel\t\t: 1\n\
                   model name\t: AMD EPYC 7763 64-Core Processor\n\nprocessor\t: 1\n\
                   model name\t: AMD EPYC 7763 64-Core Processor\n";
        assert_eq!(
            parse_cpu_model(x86).as_deref(),
            Some("AMD EPYC 7763 64-Core Processor")
        );
        let pi = "processor\t: 0\nBogoMIPS\t: 108.00\n\nHardware\t: BCM2835\n\
                  Model\t\t: Raspberry Pi 4 Model B Rev 1.4\n";
        assert_eq!(
            parse_cpu_model(pi).as_deref(),
            Some("Raspberry Pi 4 Model B Rev 1.4")
        );
        let power = "processor\t: 0\ncpu\t\t: POWER9 (architected), altivec supported\n";
        assert_eq!(
            parse_cpu_model(power).as_deref(),
            Some("POWER9 (architected), altivec supported")
        );
        // An arm64 server names no model at all.
        assert_eq!(parse_cpu_model("processor\t: 0\nCPU part\t: 0xd0c\n"), None);
        assert_eq!(parse_cpu_model("model name\t: \n"), None);
    }

    #[test]
    fn cpu_lists_are_counted() {
        assert_eq!(parse_cpu_list("0-1\n"), Some(2));
        assert_eq!(parse_cpu_list("0"), Some(1));
        assert_eq!(parse_cpu_list("0-3,5,7-8\n"), Some(7));
        assert_eq!(parse_cpu_list(""), None);
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("0-x"), None);
        assert_eq!(parse_cpu_list("0-4294967295,1"), None);
    }

    #[test]
    fn mem_total_is_in_bytes() {
        let meminfo = "MemTotal:       16318412 kB\nMemFree:         1234567 kB\n";
        assert_eq!(parse_mem_total(meminfo), Some(16_318_412 * 1024));
        assert_eq!(parse_mem_total("MemFree: 1 kB\n"), None);
        assert_eq!(parse_mem_total("MemTotal: 0 kB\n"), None);
        assert_eq!(parse_mem_total("MemTotal: 12 MB\n"), None);
        assert_eq!(parse_mem_total("MemTotal: 99999999999999999999 kB\n"), None);
    }

    #[test]
    fn triples_and_speeds_parse_and_reject_what_they_are_not() {
        assert_eq!(
            parse_triple("4096\t131072\t6291456\n"),
            Some(MinDefaultMax {
                min: 4096,
                default: 131_072,
                max: 6_291_456
            })
        );
        assert_eq!(parse_triple("4096 131072"), None);
        assert_eq!(parse_triple("1 2 3 4"), None);
        assert_eq!(parse_triple("a b c"), None);
        assert_eq!(parse_speed("10000\n"), Some(10_000));
        assert_eq!(parse_speed("-1\n"), None);
        assert_eq!(parse_speed("4294967295"), None);
        assert_eq!(parse_speed("0"), None);
        assert_eq!(parse_speed(""), None);
    }

    #[test]
    fn the_loopback_interface_counts_the_datagrams_sent_over_it() {
        let before = InterfaceSnapshot::toward(Ipv4Addr::LOCALHOST.into());
        if !cfg!(target_os = "linux") {
            // No interface counters elsewhere (under wine `/sys` may even be there).
            assert!(before.is_none());
            return;
        }
        let before = before.expect("lo's counters on Linux");
        let rx = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let tx = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        tx.connect(rx.local_addr().unwrap()).unwrap();
        for _ in 0..100 {
            tx.send(&[0; 100]).unwrap();
        }
        let d = before.delta().unwrap();
        assert_eq!(d.name, "lo");
        // Other traffic on lo only adds; on lo every packet sent is received.
        assert!(d.tx_packets >= 100 && d.rx_packets >= 100, "{d:?}");
        // 100 bytes of payload, 8 of UDP, 20 of IPv4 (lo counts no link-layer header).
        assert!(d.rx_bytes >= 100 * 128, "{d:?}");
    }

    #[test]
    fn the_ipv4_route_table_gives_the_longest_prefix() {
        // As on a little-endian host: 00000000 default via 192.168.1.1 on eth0; 192.168.1.0/24
        // on eth0; 10.0.0.0/8 on wg0 with a lower metric than 10.1.0.0/16 on tun0, which is
        // longer and so wins for 10.1.x.x; a down route is ignored.
        let hex = |a: [u8; 4]| format!("{:08X}", u32::from_ne_bytes(a));
        let line = |iface: &str, net: [u8; 4], flags: u32, metric: u32, mask: [u8; 4]| {
            format!(
                "{iface}\t{}\t{}\t{flags:04X}\t0\t0\t{metric}\t{}\t0\t0\t0\n",
                hex(net),
                hex([0; 4]),
                hex(mask)
            )
        };
        let table = [
            "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
                .to_owned(),
            line("eth0", [0; 4], 3, 100, [0; 4]),
            line("eth0", [192, 168, 1, 0], 1, 100, [255, 255, 255, 0]),
            line("wg0", [10, 0, 0, 0], 1, 5, [255, 0, 0, 0]),
            line("tun0", [10, 1, 0, 0], 1, 50, [255, 255, 0, 0]),
            line("down0", [172, 16, 0, 0], 0, 0, [255, 240, 0, 0]),
            line("eth1", [0; 4], 3, 600, [0; 4]),
        ]
        .concat();
        let route = |a: [u8; 4]| route_v4_interface(&table, Ipv4Addr::from(a));
        assert_eq!(route([192, 168, 1, 7]).as_deref(), Some("eth0"));
        assert_eq!(route([10, 1, 2, 3]).as_deref(), Some("tun0"));
        assert_eq!(route([10, 2, 2, 3]).as_deref(), Some("wg0"));
        assert_eq!(route([172, 16, 0, 1]).as_deref(), Some("eth0"));
        assert_eq!(route([8, 8, 8, 8]).as_deref(), Some("eth0"));
        assert_eq!(
            route_v4_interface("Iface\tDestination\n", Ipv4Addr::LOCALHOST),
            None
        );
    }

    #[test]
    fn interface_names_are_checked_before_any_path_is_built() {
        for bad in [
            "",
            "..",
            ".",
            "../../etc",
            "a/b",
            "eth0 ",
            "a:b",
            "sixteen_chars_xx",
        ] {
            assert_eq!(
                collect("0.1.0", &[bad.to_owned()]),
                Err(HostInfoError::InvalidInterfaceName(bad.to_owned())),
                "{bad:?}"
            );
        }
    }

    /// `uname OPTION`'s output, if the command exists.
    #[cfg(target_os = "linux")]
    fn uname(option: &str) -> Option<String> {
        let out = Command::new("uname").arg(option).output().ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn this_hosts_figures_are_plausible() {
        let info = collect("9.9.9", &[]).unwrap();
        assert_eq!(info.sonde_version.as_deref(), Some("9.9.9"));
        let available = std::thread::available_parallelism().unwrap().get();
        assert_eq!(info.cpu_available_count, Some(available as u32));
        assert!(info.cpu_logical_count.unwrap() >= available as u32);
        assert!(info.memory_bytes.unwrap() > 0);
        assert_eq!(info.kernel_release, uname("-r"));
        assert_eq!(info.kernel_name, uname("-s"));
        assert_eq!(info.host_name, uname("-n"));
        if cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) {
            assert_eq!(info.architecture, uname("-m"));
        }
        if Path::new("/etc/os-release").exists() {
            assert!(info.os_name.is_some());
        }
        let cc = info.tcp_congestion_control.unwrap();
        assert!(info.tcp_congestion_control_available.unwrap().contains(&cc));
        let b = info.socket_buffers;
        assert!(b.rmem_max_bytes.unwrap() > 0 && b.wmem_max_bytes.unwrap() > 0);
        let tcp = b.tcp_rmem_bytes.unwrap();
        assert!(tcp.min <= tcp.default && tcp.default <= tcp.max);
        assert!(b.udp_mem_pages.is_some());
        // Every interface listed is up and not loopback, and says so.
        for nic in &info.interfaces {
            assert_ne!(nic.name, "lo");
            assert_eq!(nic.up, Some(true), "{nic:?}");
            assert!(nic.mtu_bytes.is_some_and(|m| m >= 68), "{nic:?}");
            assert_ne!(nic.driver.as_deref(), Some(""));
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn device_kinds_follow_sysfs() {
        assert_eq!(device_kind("lo"), DeviceKind::Loopback);
        assert_eq!(device_kind("no-such-if0"), DeviceKind::Unknown);
        assert_eq!(device_kind("../../etc"), DeviceKind::Unknown);
        // Every other interface is virtual exactly when sysfs has no device behind it.
        for name in up_interfaces() {
            let expected = if sys_net(&name, "device").exists() {
                DeviceKind::Physical
            } else {
                DeviceKind::Virtual
            };
            assert_eq!(device_kind(&name), expected, "{name}");
        }
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn loopback_is_described_when_asked_for() {
        let info = collect("0.1.0", &["lo".to_owned()]).unwrap();
        let [lo] = &info.interfaces[..] else {
            panic!("{:?}", info.interfaces);
        };
        assert_eq!(lo.name, "lo");
        assert_eq!(lo.up, Some(true));
        // No speed on a virtual link, and no driver: unknown, not 0 or "".
        assert_eq!(lo.speed_mbit_per_second, None);
        assert_eq!(lo.driver, None);
        // The MTU as `ip` reports it, where `ip` is installed.
        if let Ok(out) = Command::new("ip")
            .args(["-o", "link", "show", "lo"])
            .output()
        {
            let text = String::from_utf8_lossy(&out.stdout);
            let mtu = text
                .split_whitespace()
                .skip_while(|w| *w != "mtu")
                .nth(1)
                .and_then(|m| m.parse().ok());
            assert_eq!(lo.mtu_bytes, mtu);
        }
        // Loopback's offloads are fixed by the kernel: checksums, TSO, GSO and GRO on, LRO off.
        let o = lo.offloads;
        assert_eq!(
            (o.rx_checksum, o.tx_checksum, o.tso, o.gso, o.gro, o.lro),
            (
                Some(true),
                Some(true),
                Some(true),
                Some(true),
                Some(true),
                Some(false)
            )
        );
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn an_interface_that_does_not_exist_is_an_error() {
        assert_eq!(
            collect("0.1.0", &["lo".to_owned(), "nosuch0".to_owned()]),
            Err(HostInfoError::NoSuchInterface("nosuch0".to_owned()))
        );
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn loopback_peers_are_reached_through_lo() {
        let v4 = interface_for_peer(IpAddr::V4(Ipv4Addr::LOCALHOST)).unwrap();
        assert_eq!(v4.as_deref(), Some("lo"));
        let mapped = interface_for_peer("::ffff:127.0.0.1".parse().unwrap()).unwrap();
        assert_eq!(mapped.as_deref(), Some("lo"));
        // IPv6 may be switched off here; where ::1 is reachable it is on lo too.
        if let Ok(v6) = interface_for_peer(IpAddr::V6(Ipv6Addr::LOCALHOST)) {
            assert_eq!(v6.as_deref(), Some("lo"));
        }
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn a_loopback_peer_is_described_by_lo_alone() {
        let info = collect_for_peer("0.1.0", IpAddr::V4(Ipv4Addr::LOCALHOST));
        let names: Vec<&str> = info.interfaces.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["lo"]);
        assert_eq!(info.kernel_release, uname("-r"));
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn the_route_to_a_remote_peer_agrees_with_the_route_table() {
        // Connecting a UDP socket sends nothing; 198.18.0.1 is the benchmarking range.
        let peer = Ipv4Addr::new(198, 18, 0, 1);
        let by_table = route_v4_interface(&read("/proc/net/route").unwrap(), peer);
        match interface_for_peer(IpAddr::V4(peer)) {
            Ok(by_connect) => assert_eq!(by_connect, by_table),
            // No route at all (an isolated sandbox): the table has none either.
            Err(_) => assert_eq!(by_table, None),
        }
    }
}
