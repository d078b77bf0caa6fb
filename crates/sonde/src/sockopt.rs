//! The socket options users bring from iperf3 and netperf (`-w`, `-C`, `-M`, `-N`, `-S`,
//! `--dscp`, `--ecn`, `--fq-rate`, `--dont-fragment`, `-Z`), in groups a subcommand flattens where
//! they mean something: a subcommand that does not take a group refuses its flags.

use clap::Args;
use sonde_wire::SocketOptions;

/// `-w`, `-S`, `--dscp`, `--ecn`: every test's streams, TCP or UDP.
#[derive(Debug, Clone, Default, Args)]
pub(crate) struct IpOpt {
    /// Socket buffers of every data stream, both ends: SO_SNDBUF and SO_RCVBUF, bytes (64K,
    /// 4M; Linux grants twice this, capped by net.core.wmem_max / rmem_max; default: the
    /// kernel's). iperf3 -w, netperf -s/-S
    #[arg(short = 'w', long = "window", value_name = "SIZE", value_parser = crate::units::size)]
    pub(crate) window: Option<u32>,
    /// The TOS byte of every data stream, both directions: IP_TOS (IPv4) or IPV6_TCLASS (IPv6),
    /// 0 to 255, decimal or 0x hex (0xb8 is DSCP EF). iperf3 -S, netperf -Y
    #[arg(short = 'S', long = "tos", value_name = "VALUE", value_parser = tos, conflicts_with = "dscp")]
    pub(crate) tos: Option<u8>,
    /// The DSCP of every data stream, both directions: a name (ef, af11 to af43, cs0 to cs7, le;
    /// RFC 4594, 2474, 8622) or 0 to 63 (the TOS byte's upper six bits). iperf3 --dscp
    #[arg(long = "dscp", value_name = "NAME|VALUE", value_parser = dscp)]
    pub(crate) dscp: Option<u8>,
    /// The ECN bits of UDP datagrams: ect0 or ect1 (RFC 3168, 9331), with -S/--dscp's DSCP. TCP
    /// sets its own ECN bits (net.ipv4.tcp_ecn): the result reports that value. No iperf3 flag
    /// (iperf3 -S with the low bits set)
    #[arg(long = "ecn", value_name = "ect0|ect1", value_parser = ecn)]
    pub(crate) ecn: Option<u8>,
}

/// `-C`, `-M`: TCP only.
#[derive(Debug, Clone, Default, Args)]
pub(crate) struct TcpOpt {
    /// TCP congestion control of every data stream, both ends: TCP_CONGESTION (reno, cubic,
    /// bbr; one of net.ipv4.tcp_available_congestion_control; default: the kernel's). iperf3 -C
    #[arg(short = 'C', long = "congestion", value_name = "ALGO")]
    pub(crate) congestion: Option<String>,
    /// TCP maximum segment size, bytes: TCP_MAXSEG, set before the client connects, so its SYN
    /// holds both directions to it (88 to 32767; default: the path's). iperf3 -M
    #[arg(short = 'M', long = "set-mss", value_name = "BYTES")]
    pub(crate) set_mss: Option<u32>,
}

/// `-N`: the TCP tests that stream (a latency test's sockets always have `TCP_NODELAY`).
#[derive(Debug, Clone, Default, Args)]
pub(crate) struct NoDelayOpt {
    /// TCP_NODELAY on every data stream, both ends: each write leaves at once, without Nagle's
    /// wait for a full segment. iperf3 -N, netperf -D
    #[arg(short = 'N', long = "no-delay")]
    pub(crate) no_delay: bool,
}

/// `--dont-fragment`: UDP only.
#[derive(Debug, Clone, Default, Args)]
pub(crate) struct DfOpt {
    /// UDP: every datagram carries DF (IPv4 IP_MTU_DISCOVER = IP_PMTUDISC_DO; IPv6
    /// IPV6_DONTFRAG), both directions; a datagram over the path MTU ends the test with an error
    /// that names the MTU. iperf3 --dont-fragment
    #[arg(long = "dont-fragment")]
    pub(crate) dont_fragment: bool,
}

/// `--fq-rate`: the tests that send in bulk.
#[derive(Debug, Clone, Default, Args)]
pub(crate) struct PacingOpt {
    /// Pace each stream to RATE bits/s (100M, 1G): SO_MAX_PACING_RATE on every stream an end
    /// sends on (TCP paces itself; UDP needs the fq qdisc). Per stream, as iperf3 --fq-rate
    #[arg(long = "fq-rate", value_name = "RATE", value_parser = crate::units::bitrate)]
    pub(crate) fq_rate: Option<u64>,
}

/// `-Z`: TCP throughput.
#[derive(Debug, Clone, Default, Args)]
pub(crate) struct ZerocopyOpt {
    /// TCP: the senders at both ends send with MSG_ZEROCOPY (SO_ZEROCOPY; Linux), so the kernel
    /// sends from sonde's pages instead of copying them; the result says per end how many sends
    /// the kernel copied after all (loopback and veth copy every one). Changes the sender's CPU
    /// cost. iperf3 -Z/--zerocopy. Default: off (write, which copies)
    #[arg(short = 'Z', long = "zerocopy")]
    pub(crate) zerocopy: bool,
}

/// The groups of socket options a subcommand takes (`None`: not taken).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Taken<'a> {
    pub(crate) tcp: Option<&'a TcpOpt>,
    pub(crate) no_delay: Option<&'a NoDelayOpt>,
    pub(crate) df: Option<&'a DfOpt>,
    pub(crate) pacing: Option<&'a PacingOpt>,
    pub(crate) zerocopy: Option<&'a ZerocopyOpt>,
}

/// The socket options of a test from the groups its subcommand takes.
pub(crate) fn socket_options(ip: &IpOpt, taken: Taken<'_>) -> SocketOptions {
    let Taken {
        tcp,
        no_delay,
        df,
        pacing,
        zerocopy,
    } = taken;
    let dscp_tos = ip.dscp.map(|d| d << 2).or(ip.tos);
    let tos = match (dscp_tos, ip.ecn) {
        (None, None) => None,
        (t, None) => t,
        (t, Some(ecn)) => Some((t.unwrap_or(0) & !0b11) | ecn),
    };
    SocketOptions {
        window_bytes: ip.window,
        congestion: tcp.and_then(|t| t.congestion.clone()),
        mss_bytes: tcp.and_then(|t| t.set_mss),
        no_delay: no_delay.is_some_and(|n| n.no_delay),
        pacing_bits_per_second: pacing.and_then(|p| p.fq_rate),
        tos,
        dont_fragment: df.is_some_and(|d| d.dont_fragment),
        zerocopy: zerocopy.is_some_and(|z| z.zerocopy),
    }
}

/// `-S`: 0 to 255, decimal, `0x` hex or `0`-led octal (as iperf3 takes it).
pub(crate) fn tos(s: &str) -> Result<u8, String> {
    let t = s.trim();
    let parsed = if let Some(hex) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        u8::from_str_radix(hex, 16)
    } else if t.len() > 1 && t.starts_with('0') {
        u8::from_str_radix(&t[1..], 8)
    } else {
        t.parse()
    };
    parsed.map_err(|_| format!("`{s}` is not a TOS byte (0 to 255, e.g. 0xb8)"))
}

/// The DSCP names of RFC 4594 (and RFC 2474's class selectors, RFC 8622's LE), with values.
const DSCP_NAMES: &[(&str, u8)] = &[
    ("cs0", 0),
    ("le", 1),
    ("cs1", 8),
    ("af11", 10),
    ("af12", 12),
    ("af13", 14),
    ("cs2", 16),
    ("af21", 18),
    ("af22", 20),
    ("af23", 22),
    ("cs3", 24),
    ("af31", 26),
    ("af32", 28),
    ("af33", 30),
    ("cs4", 32),
    ("af41", 34),
    ("af42", 36),
    ("af43", 38),
    ("cs5", 40),
    ("ef", 46),
    ("cs6", 48),
    ("cs7", 56),
];

/// `--dscp`: a name of [`DSCP_NAMES`] (any case) or a number 0 to 63 (decimal or `0x` hex).
pub(crate) fn dscp(s: &str) -> Result<u8, String> {
    let t = s.trim().to_ascii_lowercase();
    if let Some(&(_, v)) = DSCP_NAMES.iter().find(|(n, _)| *n == t) {
        return Ok(v);
    }
    let n = match t.strip_prefix("0x") {
        Some(hex) => u8::from_str_radix(hex, 16).ok(),
        None => t.parse::<u8>().ok(),
    };
    n.filter(|&v| v < 64).ok_or_else(|| {
        format!(
            "`{s}` is not a DSCP: a name ({}) or 0 to 63",
            DSCP_NAMES
                .iter()
                .map(|(n, _)| *n)
                .collect::<Vec<_>>()
                .join(", ")
        )
    })
}

/// `--ecn`: the ECN field's codepoint (RFC 3168): ECT(0) is 0b10, ECT(1) 0b01.
pub(crate) fn ecn(s: &str) -> Result<u8, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "ect0" | "ect(0)" => Ok(0b10),
        "ect1" | "ect(1)" => Ok(0b01),
        _ => Err(format!(
            "`{s}` is not an ECN marking to send: ect0 or ect1 (CE is the routers' to set)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dscp_names_are_rfc_4594s() {
        assert_eq!(dscp("ef"), Ok(46));
        assert_eq!(dscp("EF"), Ok(46));
        assert_eq!(dscp("af11"), Ok(10));
        assert_eq!(dscp("af43"), Ok(38));
        assert_eq!(dscp("cs7"), Ok(56));
        assert_eq!(dscp("le"), Ok(1));
        assert_eq!(dscp("46"), Ok(46));
        assert_eq!(dscp("0x2e"), Ok(46));
        assert!(dscp("64").is_err());
        assert!(dscp("af44").unwrap_err().contains("af11"));
        // Every AF class and drop precedence: 8 * class + 2 * precedence.
        for class in 1..=4u8 {
            for drop in 1..=3u8 {
                assert_eq!(dscp(&format!("af{class}{drop}")), Ok(8 * class + 2 * drop));
            }
        }
    }

    #[test]
    fn tos_takes_decimal_hex_and_octal_as_iperf3() {
        assert_eq!(tos("184"), Ok(0xb8));
        assert_eq!(tos("0xb8"), Ok(0xb8));
        assert_eq!(tos("0270"), Ok(0xb8));
        assert_eq!(tos("0"), Ok(0));
        assert!(tos("256").is_err());
        assert!(tos("ef").is_err());
    }

    #[test]
    fn dscp_and_ecn_make_one_tos_byte() {
        let ip = |tos, dscp, ecn| IpOpt {
            window: None,
            tos,
            dscp,
            ecn,
        };
        let of = |ip: &IpOpt| socket_options(ip, Taken::default()).tos;
        assert_eq!(of(&ip(None, Some(46), None)), Some(0xb8));
        assert_eq!(
            of(&ip(None, Some(46), Some(ecn("ect0").unwrap()))),
            Some(0xba)
        );
        assert_eq!(of(&ip(None, None, Some(ecn("ect1").unwrap()))), Some(0x01));
        // --ecn replaces the ECN bits -S gave.
        assert_eq!(of(&ip(Some(0xbb), None, Some(0b10))), Some(0xba));
        assert_eq!(of(&ip(None, None, None)), None);
        assert!(ecn("ce").is_err());
    }

    #[test]
    fn groups_a_subcommand_does_not_take_add_nothing() {
        let tcp = TcpOpt {
            congestion: Some("bbr".into()),
            set_mss: Some(1_000),
        };
        let no_delay = NoDelayOpt { no_delay: true };
        let taken = Taken {
            tcp: Some(&tcp),
            no_delay: Some(&no_delay),
            ..Taken::default()
        };
        let with = socket_options(&IpOpt::default(), taken);
        assert_eq!(with.congestion.as_deref(), Some("bbr"));
        assert_eq!((with.mss_bytes, with.no_delay), (Some(1_000), true));
        assert!(socket_options(&IpOpt::default(), Taken::default()).is_default());
    }
}
