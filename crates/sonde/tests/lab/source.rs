//! Where a test's streams come from, seen on the wire: a client `a` with two addresses, an agent
//! `b`, and a router `r` between them (a — r — b), each link a veth pair.
//!
//! - `-B 198.18.0.3 --cport 40001-40002 -P 2` (TCP and UDP throughput) and `--cport 40101`
//!   (UDP latency): nftables in b counts the packets from exactly those address and ports, and
//!   the result's `sources` says the agent saw them, with no NAT warning.
//! - With a source NAT on r (`snat to 198.18.1.254`), the agent sees r's address: the result
//!   says so (`source_translated`, "the agent saw 198.18.1.254:... for 198.18.0.3:40001").
//! - `-6` against an IPv4-only target, and `-B` with an address a does not have, fail with a
//!   message that says why.
//! - `-n 10M -P 3` and `-k 100 -l 64K -R`: the receivers counted exactly that many bytes, in
//!   all and over the streams, and the senders sent exactly that many.
//! - `-O 1 -i 0.5 -t 2` (TCP, forward and reverse): the two intervals of the first second, and
//!   only they, are marked omitted; the receivers' totals leave out exactly the bytes the result
//!   says were omitted, and every byte of every interval is in one or the other.
//!
//! Needs root, `ip`, `nft` and `sysctl`; without them the test prints `SKIP ...` and passes, unless
//! `SONDE_TEST_REQUIRE_ALL=1` (CI). Traffic stays inside the namespaces, addressed from
//! 198.18.0.0/15; they are deleted when the lab drops, also when the test panics.

use crate::common;

use std::time::Duration;

use serde_json::Value;

use common::netns::{self, link_up, veth, Namespaces, Segments};
use common::{
    check, command_in, require_or_skip, run_json_in, run_with_timeout, tool, Agent, Need,
};

const A_ADDR: &str = "198.18.0.1";
/// a's second address, the one `-B` picks.
const A_BIND_ADDR: &str = "198.18.0.3";
const RA_ADDR: &str = "198.18.0.254";
const RB_ADDR: &str = "198.18.1.254";
const B_ADDR: &str = "198.18.1.2";
const VETH_A: &str = "veth-a";
const VETH_RA: &str = "veth-ra";
const VETH_RB: &str = "veth-rb";
const VETH_B: &str = "veth-b";
const TIMEOUT: Duration = Duration::from_secs(60);

/// a — r — b, r forwarding between 198.18.0.0/24 and 198.18.1.0/24.
struct SourceLab {
    ns: Namespaces,
}

impl SourceLab {
    fn new() -> SourceLab {
        let lab = SourceLab {
            ns: Namespaces::new("source", &["a", "r", "b"]),
        };
        veth(lab.a(), VETH_A, lab.r(), VETH_RA);
        veth(lab.r(), VETH_RB, lab.b(), VETH_B);
        for (ns, dev, addr) in [
            (lab.a(), VETH_A, A_ADDR),
            (lab.r(), VETH_RA, RA_ADDR),
            (lab.r(), VETH_RB, RB_ADDR),
            (lab.b(), VETH_B, B_ADDR),
        ] {
            link_up(ns, dev, addr, 1500, Segments::Whole);
        }
        netns::ip(
            lab.a(),
            &["addr", "add", &format!("{A_BIND_ADDR}/24"), "dev", VETH_A],
        );
        netns::ip(lab.a(), &["route", "add", "198.18.1.0/24", "via", RA_ADDR]);
        netns::ip(lab.b(), &["route", "add", "198.18.0.0/24", "via", RB_ADDR]);
        check(command_in(Some(lab.r()), "sysctl").args(["-w", "net.ipv4.ip_forward=1"]));
        lab
    }

    fn a(&self) -> &str {
        self.ns.name(0)
    }

    fn r(&self) -> &str {
        self.ns.name(1)
    }

    fn b(&self) -> &str {
        self.ns.name(2)
    }

    /// `nft ARGS...` in `ns`, which must succeed.
    fn nft(ns: &str, args: &[&str]) -> String {
        check(command_in(Some(ns), tool("nft")).args(args))
    }

    /// Counters in b for packets from `A_BIND_ADDR` with the source ports asked for, one per
    /// protocol and port (rules `tcp 40001`, `udp 40001`, ...), and one for every packet
    /// from `A_BIND_ADDR`.
    fn count_sources(&self, ports: &[u16]) {
        let b = self.b();
        Self::nft(b, &["add", "table", "inet", "sonde_lab"]);
        Self::nft(
            b,
            &[
                "add",
                "chain",
                "inet",
                "sonde_lab",
                "input",
                "{",
                "type",
                "filter",
                "hook",
                "input",
                "priority",
                "0",
                ";",
                "}",
            ],
        );
        for proto in ["tcp", "udp"] {
            for port in ports {
                let port = port.to_string();
                Self::nft(
                    b,
                    &[
                        "add",
                        "rule",
                        "inet",
                        "sonde_lab",
                        "input",
                        "ip",
                        "saddr",
                        A_BIND_ADDR,
                        proto,
                        "sport",
                        &port,
                        "counter",
                        "comment",
                        &format!("\"{proto}{port}\""),
                    ],
                );
            }
        }
    }

    /// Packets counted by the rule `comment` in b.
    fn counted(&self, comment: &str) -> u64 {
        let json = Self::nft(
            self.b(),
            &["-j", "list", "chain", "inet", "sonde_lab", "input"],
        );
        let doc: Value = serde_json::from_str(&json).expect("nft -j");
        doc["nftables"]
            .as_array()
            .expect("nftables")
            .iter()
            .filter_map(|item| item.get("rule"))
            .find(|rule| rule["comment"] == comment)
            .and_then(|rule| {
                rule["expr"]
                    .as_array()?
                    .iter()
                    .find_map(|e| e["counter"]["packets"].as_u64())
            })
            .unwrap_or_else(|| panic!("no counter {comment} in {json}"))
    }
}

fn sources(doc: &Value) -> Vec<(String, String)> {
    doc["sources"]
        .as_array()
        .unwrap_or_else(|| panic!("no sources in {doc}"))
        .iter()
        .map(|s| {
            (
                s["client"].as_str().unwrap_or_default().to_owned(),
                s["seen_by_server"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

fn codes(doc: &Value) -> Vec<String> {
    doc["warning_codes"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|c| c.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// `-B` and `--cport` on the wire, and a source NAT made visible.
#[test]
fn bind_and_cport_are_what_the_agent_and_nftables_see_and_a_snat_is_named() {
    let test = "bind_and_cport_are_what_the_agent_and_nftables_see_and_a_snat_is_named";
    let needs = [
        Need::Root,
        Need::Netns,
        Need::Cmd("ip"),
        Need::Cmd("nft"),
        Need::Cmd("sysctl"),
    ];
    if !require_or_skip(test, &needs) {
        return;
    }
    let lab = SourceLab::new();
    lab.count_sources(&[40001, 40002, 40101]);
    let agent = Agent::start_in(Some(lab.b()), B_ADDR, &[]);
    let target = agent.target();

    for (udp, label) in [(false, "tcp"), (true, "udp")] {
        let mut args = vec![
            "throughput",
            &target,
            "-t",
            "1",
            "-P",
            "2",
            "-B",
            A_BIND_ADDR,
            "--cport",
            "40001-40002",
        ];
        if udp {
            args.extend(["-u", "-b", "10M"]);
        }
        let before = [
            lab.counted(&format!("{label}40001")),
            lab.counted(&format!("{label}40002")),
        ];
        let doc = run_json_in(Some(lab.a()), &args, TIMEOUT);
        assert_eq!(
            sources(&doc),
            [
                (
                    format!("{A_BIND_ADDR}:40001"),
                    format!("{A_BIND_ADDR}:40001")
                ),
                (
                    format!("{A_BIND_ADDR}:40002"),
                    format!("{A_BIND_ADDR}:40002")
                ),
            ],
            "{label}"
        );
        assert!(
            !codes(&doc).contains(&"source_translated".to_owned()),
            "{doc}"
        );
        // Both streams carried data from exactly those ports (a handful of packets at least:
        // the join, the data).
        for (i, port) in [40001, 40002].iter().enumerate() {
            let n = lab.counted(&format!("{label}{port}")) - before[i];
            assert!(
                n > 10,
                "{label}: {n} packets from {A_BIND_ADDR}:{port} at b"
            );
        }
    }

    // UDP latency from one port.
    let doc = run_json_in(
        Some(lab.a()),
        &[
            "latency",
            &target,
            "-u",
            "-t",
            "1",
            "--warmup",
            "0",
            "-B",
            A_BIND_ADDR,
            "--cport",
            "40101",
        ],
        TIMEOUT,
    );
    assert_eq!(
        sources(&doc),
        [(
            format!("{A_BIND_ADDR}:40101"),
            format!("{A_BIND_ADDR}:40101")
        )]
    );
    assert!(lab.counted("udp40101") > 100);

    // A source NAT on r: the agent sees r's address, and the result says so.
    SourceLab::nft(lab.r(), &["add", "table", "ip", "nat"]);
    SourceLab::nft(
        lab.r(),
        &[
            "add",
            "chain",
            "ip",
            "nat",
            "post",
            "{",
            "type",
            "nat",
            "hook",
            "postrouting",
            "priority",
            "100",
            ";",
            "}",
        ],
    );
    SourceLab::nft(
        lab.r(),
        &[
            "add", "rule", "ip", "nat", "post", "oifname", VETH_RB, "snat", "to", RB_ADDR,
        ],
    );
    let doc = run_json_in(
        Some(lab.a()),
        &[
            "throughput",
            &target,
            "-t",
            "1",
            "-B",
            A_BIND_ADDR,
            "--cport",
            "40002",
        ],
        TIMEOUT,
    );
    let s = sources(&doc);
    assert_eq!(s.len(), 1, "{doc}");
    assert_eq!(s[0].0, format!("{A_BIND_ADDR}:40002"));
    assert!(
        s[0].1.starts_with(&format!("{RB_ADDR}:")),
        "the agent saw {} behind the NAT",
        s[0].1
    );
    assert!(
        codes(&doc).contains(&"source_translated".to_owned()),
        "{doc}"
    );
    let warning = doc["warnings"]
        .as_array()
        .and_then(|w| {
            w.iter()
                .find_map(|w| w.as_str().filter(|w| w.contains("agent saw")))
        })
        .unwrap_or_else(|| panic!("no NAT warning in {doc}"));
    assert!(
        warning.starts_with(&format!("the agent saw {RB_ADDR}:"))
            && warning.contains(&format!("for {A_BIND_ADDR}:40002")),
        "{warning}"
    );

    // What cannot be done is said, not timed out.
    let fails = |args: &[&str]| {
        let mut cmd = command_in(Some(lab.a()), common::sonde_bin());
        cmd.env("SONDE_DB", common::test_db()).args(args);
        let out = run_with_timeout(&mut cmd, TIMEOUT).unwrap_or_else(|e| panic!("{e}"));
        assert!(!out.status.success(), "{args:?} succeeded");
        out.stderr
    };
    let e = fails(&["latency", &target, "-t", "1", "-6"]);
    assert!(e.contains("no IPv6 address"), "{e}");
    let e = fails(&["latency", &target, "-t", "1", "-B", "198.18.0.9"]);
    assert!(
        e.contains("cannot bind the source address 198.18.0.9"),
        "{e}"
    );
}

/// `-O`: the omit period's intervals, and only they, are marked; the totals leave them out.
/// TCP and UDP (where the receiver cuts the period off by sequence number), both directions,
/// and pps.
#[test]
fn omit_excludes_exactly_the_first_intervals() {
    let test = "omit_excludes_exactly_the_first_intervals";
    let needs = [
        Need::Root,
        Need::Netns,
        Need::Cmd("ip"),
        Need::Cmd("sysctl"),
    ];
    if !require_or_skip(test, &needs) {
        return;
    }
    let lab = SourceLab::new();
    let agent = Agent::start_in(Some(lab.b()), B_ADDR, &[]);
    let target = agent.target();
    // Paced UDP, so the veth and the receivers keep up: the datagrams are all 1,200 bytes.
    let udp = ["-u", "-b", "50M", "-l", "1200"];
    for (extra, reverse) in [
        (&[][..], false),
        (&[][..], true),
        (&udp[..], false),
        (&udp[..], true),
    ] {
        let case = format!("{extra:?} reverse {reverse}");
        let mut args = vec!["throughput", &target, "-t", "2", "-O", "1", "-i", "0.5"];
        args.extend(extra);
        if reverse {
            args.push("-R");
        }
        let doc = run_json_in(Some(lab.a()), &args, TIMEOUT);
        assert_eq!(doc["omit_ns"], 1_000_000_000_u64, "{doc}");
        let intervals = doc["intervals"].as_array().expect("intervals");
        let omitted: Vec<bool> = intervals
            .iter()
            .map(|iv| iv["omitted"].as_bool().unwrap_or(false))
            .collect();
        // 0-0.5 and 0.5-1 are the omit period's; 1-1.5, 1.5-2, 2-2.5, 2.5-3 and the tail are
        // counted.
        assert!(omitted.len() >= 6, "{case}: {omitted:?}");
        assert_eq!(omitted[..2], [true, true], "{case}");
        assert!(omitted[2..].iter().all(|o| !o), "{case}: {omitted:?}");
        for iv in &intervals[..2] {
            assert!(iv["end_ns"].as_u64().unwrap() <= 1_000_000_000, "{iv}");
        }
        let sum = |key: &str| -> u64 { intervals.iter().map(|iv| iv[key].as_u64().unwrap()).sum() };
        let all = sum("bytes");
        let omitted_bytes = doc["omitted_bytes"].as_u64().expect("omitted_bytes");
        let counted = doc["receiver"]["bytes"].as_u64().unwrap();
        assert!(omitted_bytes > 0 && counted > 0, "{case}: {doc}");
        // The intervals count every byte the receiver read; the totals and the omitted bytes
        // split them.
        assert_eq!(counted + omitted_bytes, all, "{case}");
        // The sender's totals leave its own omit period out too.
        let sent = doc["sender"]["bytes"].as_u64().unwrap();
        if extra.is_empty() {
            assert!(
                sent <= counted + omitted_bytes,
                "sent {sent}, received {counted}"
            );
        } else {
            // Every datagram is 1,200 bytes, on either side of the cut.
            assert_eq!(all, sum("packets") * 1200, "{case}");
            assert_eq!(counted % 1200, 0, "{case}");
            // 1 s of 50 Mbit/s is about 5,200 datagrams: the sender's count and the
            // receiver's cut split the same sequence numbers, so the test's loss is that of
            // the counted window, not a second's worth either way.
            let lost = doc["lost"].as_u64().expect("lost");
            let sent_packets = doc["sender"]["packets"].as_u64().unwrap();
            assert!(
                lost * 100 <= sent_packets,
                "{case}: {lost} of {sent_packets} lost: {doc}"
            );
        }
    }

    // pps: the agent's receivers cut the omit period off; sent, received and lost are the
    // counted window's.
    let doc = run_json_in(
        Some(lab.a()),
        &[
            "pps", &target, "-t", "2", "-O", "1", "-i", "0.5", "-m", "64",
        ],
        TIMEOUT,
    );
    assert_eq!(doc["omit_ns"], 1_000_000_000_u64, "{doc}");
    let intervals = doc["intervals"].as_array().expect("intervals");
    assert!(intervals.len() >= 6, "{doc}");
    for (n, iv) in intervals.iter().enumerate() {
        assert_eq!(iv["omitted"].as_bool().unwrap_or(false), n < 2, "{iv}");
    }
    let all: u64 = intervals
        .iter()
        .map(|iv| iv["received"].as_u64().unwrap())
        .sum();
    let omitted_received = doc["omitted_received"].as_u64().expect("omitted_received");
    let received = doc["received"].as_u64().unwrap();
    assert!(omitted_received > 0 && received > 0, "{doc}");
    assert_eq!(received + omitted_received, all, "{doc}");
    let (sent, lost) = (doc["sent"].as_u64().unwrap(), doc["lost"].as_u64().unwrap());
    assert_eq!(sent, received + lost, "{doc}");
}

/// `-n` and `-k`: the test ends when the receivers have exactly the count.
#[test]
fn byte_and_block_counts_end_at_what_the_receivers_counted() {
    let test = "byte_and_block_counts_end_at_what_the_receivers_counted";
    let needs = [
        Need::Root,
        Need::Netns,
        Need::Cmd("ip"),
        Need::Cmd("sysctl"),
    ];
    if !require_or_skip(test, &needs) {
        return;
    }
    let lab = SourceLab::new();
    let agent = Agent::start_in(Some(lab.b()), B_ADDR, &[]);
    let target = agent.target();
    for (args, expected) in [
        (vec!["-n", "10M", "-P", "3"], 10 << 20),
        (vec!["-k", "100", "-l", "64K", "-R"], 100 * (64 << 10)),
    ] {
        let mut all = vec!["throughput", target.as_str()];
        all.extend(&args);
        let doc = run_json_in(Some(lab.a()), &all, TIMEOUT);
        assert_eq!(doc["receiver"]["bytes"], expected, "{args:?}: {doc}");
        assert_eq!(doc["sender"]["bytes"], expected, "{args:?}");
        assert_eq!(doc["duration_ns"], 0, "{args:?}");
        let streams = doc["streams"].as_array().expect("streams");
        let per_stream: u64 = streams
            .iter()
            .map(|s| s["receiver"]["bytes"].as_u64().unwrap())
            .sum();
        assert_eq!(per_stream, expected, "{args:?}");
    }
    // UDP: whole datagrams, each stream's share rounded up to one (1 MiB over 2 streams of
    // 1,000-byte datagrams: 525 each); what did not arrive is counted lost, to the datagram.
    for (args, size, expected) in [
        (
            vec!["-n", "1M", "-P", "2", "-l", "1000"],
            1000,
            2 * 525 * 1000,
        ),
        (vec!["-k", "500", "-l", "1200", "-R"], 1200, 500 * 1200),
    ] {
        let mut all = vec!["throughput", target.as_str(), "-u", "-b", "50M"];
        all.extend(&args);
        let doc = run_json_in(Some(lab.a()), &all, TIMEOUT);
        assert_eq!(doc["sender"]["bytes"], expected, "{args:?}: {doc}");
        let received = doc["receiver"]["bytes"].as_u64().unwrap();
        let lost = doc["lost"].as_u64().expect("lost");
        assert_eq!(received + lost * size, expected, "{args:?}: {doc}");
        assert_eq!(doc["duration_ns"], 0, "{args:?}");
    }
}
