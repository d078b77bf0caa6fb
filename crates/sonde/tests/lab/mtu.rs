//! `sonde mtu` against a path narrower than the client's link: a client `a`, a router `r` and an
//! agent `b` (a — r — b), the link r — b with an MTU of 1,400 bytes at both ends (a 1,500-byte
//! link into a 1,400-byte one, as a tunnel or an overlay makes it), r forwarding.
//!
//! - r answers a's 1,500-byte DF probe with ICMP "fragmentation needed, MTU 1400": sonde finds
//!   exactly 1,400 B (1,372 B of UDP payload), names r as the router that said so, warns that
//!   the path is below the interface's 1,500, and the TCP exchange ends with an MSS that fits
//!   1,400 at both ends.
//! - The same with r's ICMP dropped by nftables in r's output (a PMTU black hole): sonde still
//!   finds exactly 1,400, by silence, says that no router reported it, and nftables counted the
//!   ICMP it dropped (so the black hole was real, not merely unused).
//! - IPv6 over the same lab (2001:2::/48, the IPv6 benchmarking prefix of RFC 5180, inside the
//!   namespaces only): ICMPv6 "packet too big, MTU 1400", and sonde finds 1,400 B (1,352 B of
//!   UDP payload under the 40-byte header).
//!
//! (With only r's end at 1,400 and b's at 1,500, b's own 1,500-byte packets would be dropped on
//! arrival at r's veth without any ICMP: the reverse direction would be a black hole of its own,
//! for TCP's full-size segments in particular.)
//!
//! Needs root, `ip`, `nft` and `sysctl`; without them the test prints `SKIP ...` and passes, unless
//! `SONDE_TEST_REQUIRE_ALL=1` (CI). Traffic stays inside the namespaces; they are deleted when the
//! lab drops, also when the test panics.

use crate::common;

use std::time::Duration;

use serde_json::Value;

use common::netns::{self, link_up, veth, Namespaces, Segments};
use common::{check, command_in, require_or_skip, run_json_in, tool, Agent, Need};

const A_ADDR: &str = "198.18.0.1";
const RA_ADDR: &str = "198.18.0.254";
const RB_ADDR: &str = "198.18.1.254";
const B_ADDR: &str = "198.18.1.2";
const A6_ADDR: &str = "2001:2:0:1::1";
const RA6_ADDR: &str = "2001:2:0:1::fe";
const RB6_ADDR: &str = "2001:2:0:2::fe";
const B6_ADDR: &str = "2001:2:0:2::2";
const VETH_A: &str = "veth-a";
const VETH_RA: &str = "veth-ra";
const VETH_RB: &str = "veth-rb";
const VETH_B: &str = "veth-b";
const NARROW: u64 = 1_400;
const TIMEOUT: Duration = Duration::from_secs(60);

/// a — r — b, r forwarding IPv4 and IPv6, the r — b link at 1,400 bytes.
struct MtuLab {
    ns: Namespaces,
}

impl MtuLab {
    fn new() -> MtuLab {
        let lab = MtuLab {
            ns: Namespaces::new("mtu", &["a", "r", "b"]),
        };
        veth(lab.a(), VETH_A, lab.r(), VETH_RA);
        veth(lab.r(), VETH_RB, lab.b(), VETH_B);
        for (ns, dev, addr, addr6, link_local, mtu) in [
            (lab.a(), VETH_A, A_ADDR, A6_ADDR, "fe80::1", 1_500),
            (lab.r(), VETH_RA, RA_ADDR, RA6_ADDR, "fe80::fe", 1_500),
            (lab.r(), VETH_RB, RB_ADDR, RB6_ADDR, "fe80::fe", 1_400),
            (lab.b(), VETH_B, B_ADDR, B6_ADDR, "fe80::2", 1_400),
        ] {
            link_up(ns, dev, addr, mtu, Segments::Whole);
            // No duplicate address detection: the addresses are usable at once. Neighbour
            // discovery needs a link-local address, which `link_up` does not generate.
            for a in [format!("{addr6}/64"), format!("{link_local}/64")] {
                netns::ip(ns, &["-6", "addr", "add", &a, "dev", dev, "nodad"]);
            }
        }
        netns::ip(lab.a(), &["route", "add", "198.18.1.0/24", "via", RA_ADDR]);
        netns::ip(lab.b(), &["route", "add", "198.18.0.0/24", "via", RB_ADDR]);
        netns::ip(
            lab.a(),
            &["-6", "route", "add", "2001:2:0:2::/64", "via", RA6_ADDR],
        );
        netns::ip(
            lab.b(),
            &["-6", "route", "add", "2001:2:0:1::/64", "via", RB6_ADDR],
        );
        for knob in ["net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"] {
            check(command_in(Some(lab.r()), "sysctl").args(["-w", knob]));
        }
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

    /// r drops the "too big" ICMP and ICMPv6 it would send, and counts them.
    fn black_hole(&self) {
        check(command_in(Some(self.r()), tool("nft")).arg(
            "add table inet sonde_lab; \
             add chain inet sonde_lab out { type filter hook output priority 0; }; \
             add rule inet sonde_lab out icmp type destination-unreachable icmp code \
             frag-needed counter drop comment \"v4\"; \
             add rule inet sonde_lab out icmpv6 type packet-too-big counter drop comment \"v6\"",
        ));
    }

    /// ICMP messages the black hole dropped.
    fn dropped(&self) -> u64 {
        let json = check(command_in(Some(self.r()), tool("nft")).args([
            "-j",
            "list",
            "chain",
            "inet",
            "sonde_lab",
            "out",
        ]));
        let doc: Value = serde_json::from_str(&json).expect("nft -j");
        doc["nftables"]
            .as_array()
            .expect("nftables")
            .iter()
            .filter_map(|item| item.get("rule"))
            .filter_map(|rule| {
                rule["expr"]
                    .as_array()?
                    .iter()
                    .find_map(|e| e["counter"]["packets"].as_u64())
            })
            .sum()
    }

    /// `sonde mtu TARGET --json` from a.
    fn mtu(&self, target: &str) -> Value {
        let doc = run_json_in(Some(self.a()), &["mtu", target, "--no-save"], TIMEOUT);
        if let Err(errors) = sonde_report::validate(&doc) {
            panic!(
                "the document breaks the schema:\n{}\n{doc:#}",
                errors.join("\n")
            );
        }
        doc
    }
}

fn needs(test: &str) -> bool {
    require_or_skip(
        test,
        &[
            Need::Root,
            Need::Netns,
            Need::Cmd("ip"),
            Need::Cmd("nft"),
            Need::Cmd("sysctl"),
        ],
    )
}

fn codes(doc: &Value) -> Vec<&str> {
    doc["warning_codes"]
        .as_array()
        .expect("warning_codes")
        .iter()
        .filter_map(Value::as_str)
        .collect()
}

/// What every run over the lab finds: exactly 1,400 B, below a's 1,500, with a TCP MSS at each
/// end that fits 1,400 less the IP and TCP headers.
fn check_narrow(doc: &Value, ip_header: u64) {
    assert_eq!(doc["path_mtu_bytes"].as_u64(), Some(NARROW), "{doc:#}");
    assert_eq!(
        doc["udp_payload_bytes"].as_u64(),
        Some(NARROW - ip_header - 8),
        "{doc:#}"
    );
    assert_eq!(doc["ip_header_bytes"].as_u64(), Some(ip_header), "{doc:#}");
    assert_eq!(doc["interface_mtu_bytes"], 1_500, "{doc:#}");
    assert_eq!(doc["ceiling_bytes"], 1_500, "{doc:#}");
    assert_eq!(
        doc["smallest_refused_bytes"].as_u64().map(|b| b > NARROW),
        Some(true),
        "{doc:#}"
    );
    assert_eq!(doc["complete"], true, "{doc:#}");
    assert_eq!(doc["agent_dont_fragment"], true, "{doc:#}");
    // Every probe at or below 1,400 that got an answer was echoed; none above was.
    for p in doc["probes"].as_array().expect("probes") {
        let size = p["ip_bytes"].as_u64().expect("ip_bytes");
        if p["fate"] == "echoed" {
            assert!(size <= NARROW, "{size} echoed: {doc:#}");
        } else {
            assert!(size > NARROW, "{size} {}: {doc:#}", p["fate"]);
        }
    }
    assert!(codes(doc).contains(&"path_mtu_below_interface"), "{doc:#}");
    let tcp = &doc["tcp"];
    assert_eq!(tcp["completed"], true, "{doc:#}");
    let fits = NARROW - ip_header - 20;
    for key in [
        "client_mss_bytes",
        "agent_mss_bytes",
        "agent_mss_at_connect_bytes",
    ] {
        let mss = tcp[key]
            .as_u64()
            .unwrap_or_else(|| panic!("{key}: {doc:#}"));
        assert!(mss <= fits && mss >= fits - 40, "{key} {mss}: {doc:#}");
    }
}

#[test]
fn mtu_finds_a_routers_1400_byte_link_as_it_reports_it_and_by_silence() {
    if !needs("mtu_finds_a_routers_1400_byte_link_as_it_reports_it_and_by_silence") {
        return;
    }
    let lab = MtuLab::new();
    let agent = Agent::start_in(Some(lab.b()), B_ADDR, &[]);
    let doc = lab.mtu(&agent.target());
    check_narrow(&doc, 20);
    assert_eq!(doc["upper_bound"], "reported", "{doc:#}");
    // r said so, from its address toward a, naming 1,400.
    let said: Vec<&Value> = doc["probes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["fate"] == "router_too_big")
        .collect();
    assert!(!said.is_empty(), "{doc:#}");
    for p in said {
        assert_eq!(p["reported_mtu_bytes"].as_u64(), Some(NARROW), "{doc:#}");
        assert!(
            [RA_ADDR, RB_ADDR].contains(&p["reported_by"].as_str().unwrap_or("")),
            "{doc:#}"
        );
    }
    // a's kernel learnt it too.
    assert_eq!(
        doc["kernel_path_mtu_bytes"].as_u64(),
        Some(NARROW),
        "{doc:#}"
    );
    assert!(!codes(&doc).contains(&"path_mtu_black_hole"), "{doc:#}");
    drop(agent);

    // IPv6 over the same routers: ICMPv6 packet too big.
    let agent6 = Agent::start_in(Some(lab.b()), B6_ADDR, &[]);
    let doc = lab.mtu(&agent6.target());
    assert_eq!(doc["ip_version"], 6, "{doc:#}");
    check_narrow(&doc, 40);
    assert_eq!(doc["upper_bound"], "reported", "{doc:#}");
    drop(agent6);

    // The black hole: r's ICMP dropped. Found by silence, and said so.
    let lab = MtuLab::new();
    lab.black_hole();
    let agent = Agent::start_in(Some(lab.b()), B_ADDR, &[]);
    let doc = lab.mtu(&agent.target());
    check_narrow(&doc, 20);
    assert_eq!(doc["upper_bound"], "silence", "{doc:#}");
    assert!(
        doc["probes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["fate"] == "echoed" || p["fate"] == "silent"),
        "no router may have said anything: {doc:#}"
    );
    // Each size above 1,400 was tried three times before it was read as too big.
    let tries = doc["tries"].as_u64().unwrap();
    let silent = doc["probes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["fate"] == "silent")
        .count() as u64;
    assert!(silent > 0 && silent.is_multiple_of(tries), "{doc:#}");
    assert!(codes(&doc).contains(&"path_mtu_black_hole"), "{doc:#}");
    let warning = doc["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .find(|w| w.starts_with("the path carries"))
        .unwrap_or_else(|| panic!("{doc:#}"));
    assert!(warning.contains("no router said so"), "{warning}");
    assert!(lab.dropped() > 0, "the black hole dropped nothing: {doc:#}");
}
