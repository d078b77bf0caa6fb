//! The context of a result against a known truth, in network namespaces: a client `a` and an
//! agent `b` with a router `r` between them (a — r — b), each link a veth pair.
//!
//! - The configuration each end reports is the one the lab set: the MTU of its own veth (4000
//!   on a's link, 3000 on b's, so the two ends differ), the speed and driver the kernel states
//!   for it, and the TCP congestion control its namespace uses.
//! - The TCP senders' `TCP_INFO` shows the path: the MSS both ends agreed on (b's MTU less the
//!   IPv4 and TCP headers and, with timestamps, their option), a minimum RTT of the bare veths,
//!   and a smoothed RTT that rises to the queue r's `tbf` holds (50 Mbit/s, up to 20 ms) once the
//!   loss-based sender (`reno`, set in both namespaces) has filled it. A queue on the sender's
//!   own interface would stay near empty (TCP small queues); a router's fills as a real
//!   bottleneck's does.
//!
//! Needs root, `ip`, `tc` and `sysctl`; without them the test prints `SKIP ...` and passes, unless
//! `SONDE_TEST_REQUIRE_ALL=1` (CI). Traffic stays inside the namespaces, addressed from
//! 198.18.0.0/15; they are deleted when the lab drops, also when the test panics.

use crate::common;

use std::time::Duration;

use serde_json::Value;

use common::netns::{self, link_up, tbf, veth, Namespaces, Segments};
use common::{check, command_in, require_or_skip, run_json_in, tool, Agent, Need};

const A_ADDR: &str = "198.18.0.1";
const RA_ADDR: &str = "198.18.0.254";
const RB_ADDR: &str = "198.18.1.254";
const B_ADDR: &str = "198.18.1.2";
const VETH_A: &str = "veth-a";
const VETH_RA: &str = "veth-ra";
const VETH_RB: &str = "veth-rb";
const VETH_B: &str = "veth-b";
/// a's link and b's link have different MTUs, so each end's report is told apart.
const MTU_A: u32 = 4000;
const MTU_B: u32 = 3000;
/// r's queue toward either end holds at most this much time at [`RATE`].
const QUEUE_MS: u64 = 20;
const RATE: &str = "50mbit";
/// The client's time limit for each run.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(60);

/// a — r — b, deleted on drop.
struct Lab {
    ns: Namespaces,
}

impl Lab {
    fn new() -> Lab {
        let lab = Lab {
            ns: Namespaces::new("ctx", &["a", "r", "b"]),
        };
        veth(lab.a(), VETH_A, lab.r(), VETH_RA);
        veth(lab.r(), VETH_RB, lab.b(), VETH_B);
        for (ns, dev, addr, mtu) in [
            (lab.a(), VETH_A, A_ADDR, MTU_A),
            (lab.r(), VETH_RA, RA_ADDR, MTU_A),
            (lab.r(), VETH_RB, RB_ADDR, MTU_B),
            (lab.b(), VETH_B, B_ADDR, MTU_B),
        ] {
            link_up(ns, dev, addr, mtu, Segments::Whole);
        }
        netns::ip(lab.a(), &["route", "add", "198.18.1.0/24", "via", RA_ADDR]);
        netns::ip(lab.b(), &["route", "add", "198.18.0.0/24", "via", RB_ADDR]);
        sysctl(lab.r(), "net.ipv4.ip_forward=1");
        // Loss-based congestion control fills the queue up to its limit, where the smoothed
        // RTT can be checked against it (BBR keeps it short on purpose).
        for ns in [lab.a(), lab.b()] {
            sysctl(ns, "net.ipv4.tcp_congestion_control=reno");
        }
        for dev in [VETH_RA, VETH_RB] {
            tbf(lab.r(), dev, RATE, 15_000, &format!("{QUEUE_MS}ms"));
        }
        lab
    }

    /// The client's namespace.
    fn a(&self) -> &str {
        self.ns.name(0)
    }

    /// The router's namespace.
    fn r(&self) -> &str {
        self.ns.name(1)
    }

    /// The agent's namespace.
    fn b(&self) -> &str {
        self.ns.name(2)
    }
}

/// `sysctl -w SETTING` in `ns`.
fn sysctl(ns: &str, setting: &str) {
    check(command_in(Some(ns), tool("sysctl")).args(["-w", setting]));
}

/// A file of `ns`'s `/proc` or `/sys`, trimmed.
fn read_in(ns: &str, path: &str) -> String {
    check(command_in(Some(ns), "cat").arg(path))
        .trim()
        .to_owned()
}

fn valid(doc: &Value) {
    if let Err(errors) = sonde_report::validate(doc) {
        panic!(
            "the document breaks the schema:\n{}\n{doc:#}",
            errors.join("\n")
        );
    }
}

/// One end's only interface in a document: the lab's veth, as the kernel in its namespace
/// states it.
fn check_nic(host: &Value, ns: &str, dev: &str, mtu: u32) {
    let nics = host["interfaces"].as_array().expect("interfaces");
    assert_eq!(
        nics.len(),
        1,
        "only the interface toward the peer: {host:#}"
    );
    let nic = &nics[0];
    assert_eq!(nic["name"], dev, "{host:#}");
    assert_eq!(nic["mtu_bytes"], mtu, "{host:#}");
    assert_eq!(nic["driver"], "veth", "{host:#}");
    let speed: u64 = read_in(ns, &format!("/sys/class/net/{dev}/speed"))
        .parse()
        .expect("a veth states a speed");
    assert_eq!(nic["speed_mbit_per_second"], speed, "{host:#}");
    assert_eq!(
        host["tcp_congestion_control"],
        read_in(ns, "/proc/sys/net/ipv4/tcp_congestion_control").as_str()
    );
}

/// The sender's `TCP_INFO`: the MSS both ends agreed on, the bare path's RTT as the minimum, and
/// a smoothed RTT that the queue at r raised, in every interval after the first (where the queue
/// fills) while the sender sends, and in the end. The sender samples its `TCP_INFO` on the
/// receiving agent's interval grid, or on its own when it is the agent; the receiver's intervals
/// after the sender stopped (its socket buffer draining through r, a few hundred milliseconds at
/// 50 Mbit/s) have no sample.
fn check_path(doc: &Value, sender_ns: &str) {
    let timestamps = read_in(sender_ns, "/proc/sys/net/ipv4/tcp_timestamps") != "0";
    // The smaller MTU, less IPv4 (20) and TCP (20) headers and the timestamp option (12).
    let mss = u64::from(MTU_B) - 40 - if timestamps { 12 } else { 0 };
    let queue_ns = QUEUE_MS * 1_000_000;
    let st = &doc["streams"][0]["tcp_info"];
    assert_eq!(st["mss_bytes"], mss, "{doc:#}");
    let min_rtt = st["min_rtt_ns"].as_u64().expect("min RTT");
    assert!(
        min_rtt < 2_000_000,
        "the bare veths' RTT is µs: {min_rtt} ns"
    );
    let intervals = doc["intervals"].as_array().expect("intervals");
    assert!(intervals.len() >= 4, "{doc:#}");
    // Every byte is in an interval, the drain after the sender stopped included (in reverse the
    // agent's report used to come first and the client's last interval was lost).
    let in_intervals: u64 = intervals.iter().filter_map(|iv| iv["bytes"].as_u64()).sum();
    assert_eq!(
        Some(in_intervals),
        doc["receiver"]["bytes"].as_u64(),
        "the intervals do not add up to the receiver's total\n{doc:#}"
    );
    let srtt_of = |iv: &Value| iv["tcp_info"][0]["srtt_ns"].as_u64();
    let mut srtts: Vec<u64> = intervals[1..].iter().map_while(srtt_of).collect();
    // 1.5 s at 0.25 s: the sender's six intervals, less the first, and less one for a sender
    // whose grid is a fraction of an interval behind the receiver's.
    assert!(
        srtts.len() >= 4,
        "a TCP_INFO sample in only {} intervals after the first\n{doc:#}",
        srtts.len()
    );
    // Once an interval has no sample the sender has ended: no later one has one.
    let later = &intervals[1 + srtts.len()..];
    assert!(
        later.iter().all(|iv| srtt_of(iv).is_none()),
        "an interval without a TCP_INFO sample between two with one\n{doc:#}"
    );
    srtts.push(st["srtt_ns"].as_u64().expect("a final sample"));
    eprintln!("lab: sender in {sender_ns}: min RTT {min_rtt} ns, smoothed RTTs {srtts:?} ns");
    for srtt in &srtts {
        // At least a quarter of the queue, and at most the queue with room for the delayed
        // ACKs and scheduling of a loaded host: a unit off by 1000 fails either way.
        assert!(
            (queue_ns / 4..=queue_ns * 5).contains(srtt),
            "smoothed RTTs {srtts:?} ns: not the {QUEUE_MS} ms queue at r\n{doc:#}"
        );
    }
}

#[test]
fn each_end_reports_its_own_link_and_tcp_info_sees_the_routers_queue() {
    let _file = crate::common::file_lock(module_path!());
    let test = "each_end_reports_its_own_link_and_tcp_info_sees_the_routers_queue";
    let needs = [
        Need::Root,
        Need::Cmd("ip"),
        Need::Cmd("tc"),
        Need::Cmd("sysctl"),
        Need::Netns,
    ];
    if !require_or_skip(test, &needs) {
        return;
    }
    let lab = Lab::new();
    let agent = Agent::start_in(Some(lab.b()), B_ADDR, &[]);
    let target = agent.target();

    let conf = run_json_in(Some(lab.a()), &["conf", &target], CLIENT_TIMEOUT);
    valid(&conf);
    check_nic(&conf["hosts"]["client"], lab.a(), VETH_A, MTU_A);
    check_nic(&conf["hosts"]["server"], lab.b(), VETH_B, MTU_B);

    let forward = run_json_in(
        Some(lab.a()),
        &["throughput", &target, "-t", "1.5", "-i", "0.25"],
        CLIENT_TIMEOUT,
    );
    valid(&forward);
    assert_eq!(
        forward["hosts"], conf["hosts"],
        "a test embeds what conf shows"
    );
    check_path(&forward, lab.a());

    let reverse = run_json_in(
        Some(lab.a()),
        &["throughput", &target, "-R", "-t", "1.5", "-i", "0.25"],
        CLIENT_TIMEOUT,
    );
    valid(&reverse);
    check_path(&reverse, lab.b());
}
