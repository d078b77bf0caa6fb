//! Where this host's sockets of a test come from: `-B/--bind ADDR[%DEV]`, `--bind-dev DEV`,
//! `-4/-6` ([`SourceOpt`], flattened into every test subcommand) and `--cport PORT[-PORT]`
//! ([`CportOpt`], into those whose data streams hold a connection or flow for the whole test:
//! not crr, which opens one per transaction). Parsed once into a [`Source`], which the route
//! resolves the target with.

use std::net::IpAddr;

use clap::Args;
use sonde_client::{Family, PortRange};

use crate::units::BadValue;

/// `-B`, `--bind-dev`, `-4`, `-6`.
#[derive(Debug, Default, Args)]
pub(crate) struct SourceOpt {
    /// Send from this local address (iperf3 -B, netperf -L): the control connection and every
    /// data stream. ADDR%DEV also binds them to interface DEV (as --bind-dev). The target is
    /// resolved in ADDR's family. Default: the route's source address
    #[arg(short = 'B', long = "bind", value_name = "ADDR[%DEV]", value_parser = parse_bind)]
    bind: Option<BindAddr>,
    /// Send only through interface DEV (iperf3 --bind-dev; SO_BINDTODEVICE, Linux only).
    /// Default: the route's interface
    #[arg(long = "bind-dev", value_name = "DEV")]
    bind_dev: Option<String>,
    /// Resolve the target to an IPv4 address and connect over IPv4 only (iperf3 and netperf
    /// -4). Default: the first address the resolver gives
    #[arg(short = '4', long = "ipv4", conflicts_with = "ipv6")]
    ipv4: bool,
    /// Resolve the target to an IPv6 address and connect over IPv6 only (iperf3 and netperf
    /// -6)
    #[arg(short = '6', long = "ipv6")]
    ipv6: bool,
}

/// `--cport`.
#[derive(Debug, Default, Args)]
pub(crate) struct CportOpt {
    /// Source port of the data streams (iperf3 --cport): PORT for one stream, or a range
    /// PORT-PORT, stream i (and with --bidir, the reverse streams after the forward ones) from
    /// the i-th port; a range with fewer ports than streams is refused. The control connection
    /// takes an ephemeral port. Default: ephemeral ports
    #[arg(long = "cport", value_name = "PORT[-PORT]", value_parser = parse_ports)]
    cport: Option<PortRange>,
}

impl CportOpt {
    /// The range asked for.
    pub(crate) fn get(&self) -> Option<PortRange> {
        self.cport
    }
}

/// `-B ADDR[%DEV]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BindAddr {
    ip: IpAddr,
    device: Option<String>,
}

fn parse_bind(s: &str) -> Result<BindAddr, String> {
    let (addr, device) = match s.split_once('%') {
        Some((a, d)) if !d.is_empty() => (a, Some(d.to_owned())),
        Some(_) => return Err(format!("`{s}`: write ADDR%DEV with a device after the %")),
        None => (s, None),
    };
    let addr = addr
        .strip_prefix('[')
        .and_then(|a| a.strip_suffix(']'))
        .unwrap_or(addr);
    let ip = addr
        .parse::<IpAddr>()
        .map_err(|_| format!("`{s}`: not an IP address (write ADDR or ADDR%DEV)"))?;
    Ok(BindAddr { ip, device })
}

fn parse_ports(s: &str) -> Result<PortRange, String> {
    let port = |p: &str| {
        p.trim()
            .parse::<u16>()
            .ok()
            .filter(|&p| p != 0)
            .ok_or_else(|| format!("`{p}`: not a port (1 to 65535)"))
    };
    let (first, last) = match s.split_once('-') {
        Some((a, b)) => (port(a)?, port(b)?),
        None => {
            let p = port(s)?;
            (p, p)
        }
    };
    if last < first {
        return Err(format!("`{s}`: the range ends before it starts"));
    }
    Ok(PortRange { first, last })
}

/// Where this host's sockets come from, as the options asked, and the family the target is
/// resolved in.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Source {
    /// For the client's sockets.
    pub(crate) client: sonde_client::Source,
    /// `-4`, `-6`, or `-B`'s family.
    pub(crate) family: Option<Family>,
}

impl Source {
    /// Whether anything was asked.
    pub(crate) fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

impl SourceOpt {
    /// The source these options and `cport` ask for.
    ///
    /// # Errors
    /// `-B ADDR%DEV` with a different `--bind-dev`, or `-4`/`-6` against `-B`'s family (usage
    /// errors).
    pub(crate) fn source(&self, cport: Option<PortRange>) -> Result<Source, BadValue> {
        let mut bind = sonde_client::Bind::default();
        let asked = if self.ipv4 {
            Some(Family::V4)
        } else if self.ipv6 {
            Some(Family::V6)
        } else {
            None
        };
        let mut family = asked;
        if let Some(b) = &self.bind {
            let of_bind = if b.ip.is_ipv4() {
                Family::V4
            } else {
                Family::V6
            };
            if asked.is_some_and(|f| f != of_bind) {
                return Err(BadValue(format!(
                    "-B {} is {}, and {} asks for the other family",
                    b.ip,
                    if b.ip.is_ipv4() { "IPv4" } else { "IPv6" },
                    if self.ipv4 { "-4" } else { "-6" },
                )));
            }
            family = Some(of_bind);
            bind.ip = Some(b.ip);
            bind.device.clone_from(&b.device);
        }
        if let Some(dev) = &self.bind_dev {
            if bind.device.as_ref().is_some_and(|d| d != dev) {
                return Err(BadValue(format!(
                    "-B ...%{} and --bind-dev {dev} name two devices",
                    bind.device.as_deref().unwrap_or_default()
                )));
            }
            bind.device = Some(dev.clone());
        }
        Ok(Source {
            client: sonde_client::Source { bind, ports: cport },
            family,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_takes_an_optional_device() {
        assert_eq!(
            parse_bind("198.18.0.1").unwrap(),
            BindAddr {
                ip: "198.18.0.1".parse().unwrap(),
                device: None
            }
        );
        assert_eq!(
            parse_bind("fe80::1%eth0").unwrap(),
            BindAddr {
                ip: "fe80::1".parse().unwrap(),
                device: Some("eth0".into())
            }
        );
        assert_eq!(
            parse_bind("[::1]").unwrap().ip,
            "::1".parse::<IpAddr>().unwrap()
        );
        assert!(parse_bind("198.18.0.1%").is_err());
        assert!(parse_bind("host.example").is_err());
    }

    #[test]
    fn ports_are_one_or_a_range() {
        assert_eq!(
            parse_ports("5001").unwrap(),
            PortRange {
                first: 5001,
                last: 5001
            }
        );
        assert_eq!(parse_ports("5001-5004").unwrap().len(), 4);
        assert!(parse_ports("5004-5001").is_err());
        assert!(parse_ports("0").is_err());
        assert!(parse_ports("70000").is_err());
    }

    #[test]
    fn the_family_follows_b_and_refuses_the_other() {
        let opt = SourceOpt {
            bind: Some(parse_bind("::1").unwrap()),
            ..SourceOpt::default()
        };
        assert_eq!(opt.source(None).unwrap().family, Some(Family::V6));
        let opt = SourceOpt {
            bind: Some(parse_bind("127.0.0.1").unwrap()),
            ipv6: true,
            ..SourceOpt::default()
        };
        assert!(opt.source(None).is_err());
        let opt = SourceOpt {
            bind: Some(parse_bind("127.0.0.1%lo").unwrap()),
            bind_dev: Some("eth0".into()),
            ..SourceOpt::default()
        };
        assert!(opt.source(None).is_err());
    }
}
