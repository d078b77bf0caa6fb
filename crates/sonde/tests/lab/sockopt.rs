//! The socket options (`-w -C -M -N -S --dscp --ecn --dont-fragment`) seen where the packets
//! are, not only in the result.
//!
//! Two network namespaces, client `a` (198.18.0.1) and agent `b` (198.18.0.2), joined by a veth
//! pair at MTU 1500 that hands no GSO super-packets across (one segment per packet), so that
//! nftables sees each datagram and segment as a wire would carry it. nftables rules in each
//! namespace's input hook count, per direction, the test's packets and those that carry what was
//! asked:
//! - `--dscp ef --ecn ect1 --dont-fragment` on UDP `--bidir`: every datagram of the test, both
//!   ways (the joins and their acknowledgements included), has DSCP EF (`ip dscp ef`), ECT(1)
//!   (`ip ecn ect1`) and DF (`ip frag-off & 0x4000`); a 1,600-byte datagram is fragmented
//!   without `--dont-fragment` and refused with it (exit 2, naming the 1,500-byte MTU);
//! - `-M 1000` on TCP `--bidir`: the client's SYN announces 1,000 (`tcp option maxseg size`), no
//!   segment either way is longer than 1,000 payload bytes (IP length at most 1,052: 20 of IPv4,
//!   32 of TCP with timestamps), and the result's MSS at each end (read back) is the same;
//! - `-C reno -w 1M` on TCP: `ss -tmi` in each namespace, during the test, sees the test's
//!   connections with `reno` and the socket buffers (`skmem` `rb`, `tb`) the result reports for
//!   that end.
//!
//! - `--ecn` with nftables marking CE (`ip ecn set ce`) on the agent's ingress and clearing
//!   the field (`ip ecn set not-ect`) on the client's: each receiver's counts match nftables'.
//!
//! Needs root, `ip`, `nft` and `ss`; without them the test prints `SKIP ...` and passes, unless
//! `SONDE_TEST_REQUIRE_ALL=1` (CI). Traffic stays inside the namespaces, addressed from
//! 198.18.0.0/15; they are deleted when the lab drops, also when the test panics. About 10 s.

use crate::common;

use std::thread;
use std::time::Duration;

use serde_json::Value;

use common::netns::{link_up, veth, Namespaces, Segments};
use common::{
    at, check, command_in, require_or_skip, run_json_in, run_with_timeout, sonde_bin, tool, u64_at,
    Agent, Need,
};

const A_ADDR: &str = "198.18.0.1";
const B_ADDR: &str = "198.18.0.2";
const NEEDS: &[Need] = &[
    Need::Root,
    Need::Cmd("ip"),
    Need::Cmd("nft"),
    Need::Cmd("ss"),
    Need::Netns,
];
const TIMEOUT: Duration = Duration::from_secs(60);

/// One end of the link: the client `a` or the agent `b`.
#[derive(Debug, Clone, Copy)]
enum Side {
    A,
    B,
}

/// Two namespaces joined by a veth pair; both deleted on drop.
struct Lab {
    ns: Namespaces,
}

impl Lab {
    fn new() -> Lab {
        let lab = Lab {
            ns: Namespaces::new("sock", &["a", "b"]),
        };
        veth(lab.a(), "veth-a", lab.b(), "veth-b");
        link_up(lab.a(), "veth-a", A_ADDR, 1500, Segments::OnePerPacket);
        link_up(lab.b(), "veth-b", B_ADDR, 1500, Segments::OnePerPacket);
        lab
    }

    fn a(&self) -> &str {
        self.ns.name(0)
    }

    fn ns(&self, side: Side) -> &str {
        match side {
            Side::A => self.a(),
            Side::B => self.b(),
        }
    }

    fn b(&self) -> &str {
        self.ns.name(1)
    }

    /// A counting chain in `ns`'s input hook, one `MATCH counter` rule per matcher, in order.
    fn count(&self, side: Side, matchers: &[String]) {
        self.count_at(side, "input priority 0", matchers);
    }

    /// [`Lab::count`] at another hook (`prerouting priority -500` sees fragments before the
    /// kernel reassembles them).
    fn count_at(&self, side: Side, hook: &str, matchers: &[String]) {
        self.chain(side, ("sonde_sock", "input"), hook, matchers);
    }

    /// A chain `table`/`chain` at `hook` in `side`'s namespace, one `RULE counter` rule per
    /// entry, in order (a rule may rewrite, `ip ecn set ce`, as well as match).
    fn chain(&self, side: Side, (table, chain): (&str, &str), hook: &str, rules: &[String]) {
        let ns = self.ns(side);
        let nft = |args: &[&str]| check(command_in(Some(ns), tool("nft")).args(args));
        nft(&["add", "table", "inet", table]);
        nft(&[
            "add",
            "chain",
            "inet",
            table,
            chain,
            &format!("{{ type filter hook {hook}; policy accept; }}"),
        ]);
        for m in rules {
            let mut args = vec!["add", "rule", "inet", table, chain];
            args.extend(m.split_whitespace());
            args.push("counter");
            nft(&args);
            eprintln!("lab: {ns}: {m} counter");
        }
    }

    /// The packet counts of [`Lab::count`]'s rules in `ns`, in order.
    fn counts(&self, side: Side) -> Vec<u64> {
        self.chain_counts(side, ("sonde_sock", "input"))
    }

    /// The packet counts of [`Lab::chain`]'s rules, in order.
    fn chain_counts(&self, side: Side, (table, chain): (&str, &str)) -> Vec<u64> {
        let ns = self.ns(side);
        let json = check(
            command_in(Some(ns), tool("nft")).args(["-j", "list", "chain", "inet", table, chain]),
        );
        let doc: Value =
            serde_json::from_str(&json).unwrap_or_else(|e| panic!("nft -j: {e}\n{json}"));
        doc["nftables"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|item| item.get("rule")?.get("expr")?.as_array())
            .filter_map(|expr| {
                expr.iter()
                    .find_map(|e| e.get("counter")?.get("packets")?.as_u64())
            })
            .collect()
    }

    /// Removes the counting chain of `ns` (for the next case).
    fn reset(&self, side: Side) {
        let ns = self.ns(side);
        check(command_in(Some(ns), tool("nft")).args(["flush", "ruleset"]));
    }
}

fn client(lab: &Lab, args: &[&str]) -> Value {
    run_json_in(Some(lab.a()), args, TIMEOUT)
}

/// Issue 19: DSCP, ECN and DF are on every datagram of the test, in both directions, as
/// nftables counts them at each receiver.
#[test]
fn dscp_ecn_and_df_mark_every_udp_datagram_both_ways() {
    let _file = crate::common::file_lock(module_path!());
    let test = "dscp_ecn_and_df_mark_every_udp_datagram_both_ways";
    if !require_or_skip(test, NEEDS) {
        return;
    }
    let lab = Lab::new();
    let agent = Agent::start_in(Some(lab.b()), B_ADDR, &[]);
    let port = agent.port();
    // At b: the client's datagrams (to the agent's port); at a: the agent's (from it).
    let rules = |dir: &str| {
        let flow = format!("ip saddr {{ {A_ADDR}, {B_ADDR} }} udp {dir} {port}");
        vec![
            flow.clone(),
            format!("{flow} ip dscp ef"),
            format!("{flow} ip ecn ect1"),
            format!("{flow} ip frag-off & 0x4000 != 0"),
        ]
    };
    lab.count(Side::B, &rules("dport"));
    lab.count(Side::A, &rules("sport"));
    let target = agent.target();
    let doc = client(
        &lab,
        &[
            "throughput",
            &target,
            "-u",
            "--bidir",
            "-b",
            "20M",
            "-l",
            "1200",
            "-t",
            "1",
            "--dscp",
            "ef",
            "--ecn",
            "ect1",
            "--dont-fragment",
        ],
    );
    for (ns, side) in [(Side::B, "at the agent"), (Side::A, "at the client")] {
        let c = lab.counts(ns);
        eprintln!("{side}: {c:?} (all, ef, ect1, DF)");
        assert_eq!(c.len(), 4, "{c:?}");
        // Joins and data alike: every datagram of the session carries them.
        assert!(c[0] > 1_000, "{side}: {c:?}");
        assert_eq!(c[1], c[0], "{side}: DSCP EF on every datagram: {c:?}");
        assert_eq!(c[2], c[0], "{side}: ECT(1) on every datagram: {c:?}");
        assert_eq!(c[3], c[0], "{side}: DF on every datagram: {c:?}");
    }
    for end in ["client", "server"] {
        assert_eq!(
            u64_at(&doc, &["socket", end, "tos"]),
            (46 << 2) | 1,
            "{doc:#}"
        );
        assert_eq!(
            at(&doc, &["socket", end, "dont_fragment"]),
            &Value::Bool(true)
        );
    }
    // Linux sets DF on a UDP datagram that fits the path MTU even without the option
    // (IP_PMTUDISC_WANT); the option's difference is the datagram that does not fit: without
    // it the kernel fragments it, with it the test is refused, naming the MTU.
    lab.reset(Side::B);
    lab.count_at(
        Side::B,
        "prerouting priority -500",
        &[format!("ip saddr {A_ADDR} ip frag-off & 0x3fff != 0")],
    );
    client(
        &lab,
        &[
            "throughput",
            &target,
            "-u",
            "-b",
            "1M",
            "-l",
            "1600",
            "-t",
            "0.5",
        ],
    );
    let fragments = lab.counts(Side::B);
    assert!(
        fragments[0] > 0,
        "1,600-byte datagrams were fragmented: {fragments:?}"
    );
    let out = run_with_timeout(
        command_in(Some(lab.a()), sonde_bin()).args([
            "throughput",
            &target,
            "-u",
            "-l",
            "1600",
            "--dont-fragment",
            "-t",
            "0.5",
            "--no-save",
        ]),
        TIMEOUT,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let stderr = &out.stderr;
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("above the path MTU of 1500 B"), "{stderr}");
    assert!(stderr.contains("send at most 1472 bytes"), "{stderr}");
}

/// The mangling chain: at prerouting, mangle priority, before the input hook's counters; what
/// it rewrites the receiver reads.
const MANGLE: (&str, &str) = ("sonde_mangle", "pre");

fn mangle(lab: &Lab, side: Side, rules: &[String]) {
    lab.chain(side, MANGLE, "prerouting priority -150", rules);
}

fn mangled(lab: &Lab, side: Side) -> Vec<u64> {
    lab.chain_counts(side, MANGLE)
}

/// Issue 19: `--ecn` receivers count the marks their datagrams arrive with. nftables at the
/// agent's ingress sets CE on every third data datagram of the client's (a router signalling
/// congestion, `ip ecn set ce`): the agent's count of CE is nftables' count of what it marked,
/// the rest arrive ECT(0) as sent, and the result warns that congestion was signalled. Then
/// nftables at the client's ingress clears the field of the agent's datagrams (`-R`; `ip ecn
/// set not-ect`, a path that bleaches): the client counts every one Not-ECT and warns.
#[test]
fn ecn_marks_are_counted_where_they_arrive_ce_and_bleached() {
    let _file = crate::common::file_lock(module_path!());
    let test = "ecn_marks_are_counted_where_they_arrive_ce_and_bleached";
    if !require_or_skip(test, NEEDS) {
        return;
    }
    let lab = Lab::new();
    let agent = Agent::start_in(Some(lab.b()), B_ADDR, &[]);
    let port = agent.port();
    let target = agent.target();
    // Data datagrams only (-l 1200); the joins are short.
    mangle(
        &lab,
        Side::B,
        &[format!(
            "ip saddr {A_ADDR} udp dport {port} meta length > 1000 numgen inc mod 3 == 0 ip ecn set ce"
        )],
    );
    let args = |reverse: bool| {
        let mut a = vec![
            "throughput",
            target.as_str(),
            "-u",
            "-b",
            "20M",
            "-l",
            "1200",
            "-t",
            "1",
            "--ecn",
            "ect0",
        ];
        if reverse {
            a.push("-R");
        }
        a
    };
    let doc = client(&lab, &args(false));
    let marked = mangled(&lab, Side::B)[0];
    eprintln!(
        "nftables marked {marked} datagrams CE; sonde: {}",
        doc["ecn"]
    );
    let counts = &doc["ecn"]["client_to_server"];
    let received = u64_at(&doc, &["receiver", "packets"]);
    assert!(marked > 100, "{marked}");
    assert_eq!(u64_at(counts, &["ce"]), marked, "{doc:#}");
    assert_eq!(u64_at(counts, &["ect0"]) + marked, received, "{doc:#}");
    assert_eq!(u64_at(counts, &["not_ect"]), 0, "{doc:#}");
    assert!(doc["ecn"]["server_to_client"].is_null(), "{doc:#}");
    let codes = doc["warning_codes"].as_array().cloned().unwrap_or_default();
    assert!(codes.iter().any(|c| c == "ecn_congestion"), "{doc:#}");
    assert!(!codes.iter().any(|c| c == "ecn_bleached"), "{doc:#}");

    mangle(
        &lab,
        Side::A,
        &[format!(
            "ip saddr {B_ADDR} udp sport {port} meta length > 1000 ip ecn set not-ect"
        )],
    );
    let doc = client(&lab, &args(true));
    let bleached = mangled(&lab, Side::A)[0];
    let counts = &doc["ecn"]["server_to_client"];
    let received = u64_at(&doc, &["receiver", "packets"]);
    assert!(bleached > 100, "{bleached}");
    assert_eq!(u64_at(counts, &["not_ect"]), received, "{doc:#}");
    assert_eq!(u64_at(counts, &["not_ect"]), bleached, "{doc:#}");
    assert_eq!(
        u64_at(counts, &["ect0"]) + u64_at(counts, &["ce"]),
        0,
        "{doc:#}"
    );
    let codes = doc["warning_codes"].as_array().cloned().unwrap_or_default();
    assert!(codes.iter().any(|c| c == "ecn_bleached"), "{doc:#}");
}

/// Issue 19: TCP with `--ecn` cannot count marks at the receiver (a TCP socket does not see the
/// field), so the sender's `tcpi_delivered_ce` stands for it. The client's namespace asks for
/// ECN on its connections (`net.ipv4.tcp_ecn = 1`; the agent's answers, the default 2) and
/// nftables at the agent's ingress sets CE on every tenth data segment: the client's sender
/// reports segments delivered CE, and the result warns that congestion was signalled.
#[test]
fn tcp_senders_report_segments_delivered_ce() {
    let _file = crate::common::file_lock(module_path!());
    let test = "tcp_senders_report_segments_delivered_ce";
    if !require_or_skip(test, NEEDS) {
        return;
    }
    let lab = Lab::new();
    check(command_in(Some(lab.a()), tool("sysctl")).args(["-w", "net.ipv4.tcp_ecn=1"]));
    let agent = Agent::start_in(Some(lab.b()), B_ADDR, &[]);
    let port = agent.port();
    let target = agent.target();
    mangle(
        &lab,
        Side::B,
        &[format!(
            "ip saddr {A_ADDR} tcp dport {port} meta length > 1000 numgen inc mod 10 == 0 ip ecn set ce"
        )],
    );
    let doc = client(&lab, &["throughput", &target, "-t", "1", "--ecn", "ect0"]);
    let marked = mangled(&lab, Side::B)[0];
    let ce = doc["streams"][0]["tcp_info"]["delivered_ce_segments"]
        .as_u64()
        .unwrap_or_else(|| panic!("no delivered_ce_segments: {doc:#}"));
    eprintln!("nftables marked {marked} segments CE; the sender's tcpi_delivered_ce: {ce}");
    assert!(marked > 0, "{marked}");
    // The receiver echoes ECE until the sender's CWR, and every segment acknowledged with ECE
    // counts: the figure is congestion signalled, not a count of the marked segments (in the
    // run here 12,594 marked, 64,754 counted).
    assert!(ce > 0, "{doc:#}");
    let codes = doc["warning_codes"].as_array().cloned().unwrap_or_default();
    assert!(codes.iter().any(|c| c == "ecn_congestion"), "{doc:#}");
    // A TCP test has no receiver-side counts.
    assert!(doc.get("ecn").is_none(), "{doc:#}");
}

/// Issue 19: `-M 1000` is in the client's SYN and holds every segment, both ways, to 1,000
/// payload bytes; each end's reported MSS is what its kernel sends with.
#[test]
fn set_mss_is_in_the_syn_and_in_every_segment() {
    let _file = crate::common::file_lock(module_path!());
    let test = "set_mss_is_in_the_syn_and_in_every_segment";
    if !require_or_skip(test, NEEDS) {
        return;
    }
    let lab = Lab::new();
    let agent = Agent::start_in(Some(lab.b()), B_ADDR, &[]);
    let port = agent.port();
    // The data channels are the connections whose SYN announces 1,000: conntrack marks them,
    // at b as the SYN comes in and at a as it leaves, which leaves out the control connection
    // on the same port (its messages, the report with both ends' context, may be longer).
    // 1,000 payload bytes + 20 (IPv4) + 32 (TCP with timestamps) = 1,052.
    let mark =
        format!("tcp dport {port} tcp flags syn tcp option maxseg size 1000 ct mark set 0x1");
    let rules = |dir: &str| {
        let flow = format!("tcp {dir} {port} ct mark 0x1");
        vec![
            format!("{flow} ip length > 900"),
            format!("{flow} ip length > 1052"),
        ]
    };
    let mut at_b = vec![mark.clone()];
    at_b.extend(rules("dport"));
    lab.count(Side::B, &at_b);
    lab.chain(
        Side::A,
        ("sonde_sock", "syn_out"),
        "output priority 0",
        &[mark],
    );
    lab.count(Side::A, &rules("sport"));
    let target = agent.target();
    let doc = client(
        &lab,
        &["throughput", &target, "--bidir", "-t", "1", "-M", "1000"],
    );
    let (at_b, at_a) = (lab.counts(Side::B), lab.counts(Side::A));
    eprintln!(
        "at the agent {at_b:?} (SYN MSS 1000, > 900, > 1052), at the client {at_a:?} (> 900, > 1052)"
    );
    for (side, c) in [("to the agent", &at_b[1..]), ("to the client", &at_a[..])] {
        assert!(c[0] > 100, "{side}: full segments were sent: {c:?}");
        assert_eq!(c[1], 0, "{side}: no segment above the MSS: {c:?}");
    }
    // Every data channel's SYN goes to b: two with --bidir, each announcing 1,000 (the control
    // connection's is not -M's).
    assert_eq!(at_b[0], 2, "{at_b:?}");
    for end in ["client", "server"] {
        let mss = u64_at(&doc, &["socket", end, "mss_bytes"]);
        assert!((900..=1000).contains(&mss), "{end}: {mss}\n{doc:#}");
    }
    lab.reset(Side::A);
    lab.reset(Side::B);
}

/// Issue 19: `-C reno -w 1M` as `ss` sees the test's connections at each end while it runs,
/// and as the result reports them.
#[test]
fn congestion_and_window_are_what_ss_sees_at_each_end() {
    let _file = crate::common::file_lock(module_path!());
    let test = "congestion_and_window_are_what_ss_sees_at_each_end";
    if !require_or_skip(test, NEEDS) {
        return;
    }
    let lab = Lab::new();
    let agent = Agent::start_in(Some(lab.b()), B_ADDR, &[]);
    let port = agent.port();
    let target = agent.target();
    let (ns_a, ns_b) = (lab.a().to_owned(), lab.b().to_owned());
    let (doc, seen) = thread::scope(|s| {
        let run = s.spawn(|| {
            client(
                &lab,
                &[
                    "throughput",
                    &target,
                    "-t",
                    "3",
                    "-C",
                    "reno",
                    "-w",
                    "1M",
                    "-b",
                    "200M",
                ],
            )
        });
        // Mid-test: the data connection is established and sending.
        thread::sleep(Duration::from_millis(1_500));
        let ss = |ns: &str, filter: &str| {
            check(command_in(Some(ns), "ss").args(["-tmin", "state", "established", filter]))
        };
        let seen = (
            ss(&ns_a, &format!("dport = :{port}")),
            ss(&ns_b, &format!("sport = :{port}")),
        );
        (run.join().expect("the client"), seen)
    });
    for (end, text) in [("client", &seen.0), ("server", &seen.1)] {
        eprintln!("ss at the {end}:\n{text}");
        // The data connection is the one with reno (the control connection keeps the default).
        // One connection per group: its line, then the indented lines of -m and -i.
        let mut groups: Vec<String> = Vec::new();
        for line in text.lines().skip(1) {
            match groups.last_mut() {
                Some(g) if line.starts_with(char::is_whitespace) => {
                    g.push('\n');
                    g.push_str(line);
                }
                _ => groups.push(line.to_owned()),
            }
        }
        let reno = groups
            .into_iter()
            .find(|g| g.contains(" reno "))
            .unwrap_or_else(|| panic!("{end}: no reno connection in\n{text}"));
        let skmem = |key: &str| -> u64 {
            let at = reno
                .find(&format!(",{key}"))
                .unwrap_or_else(|| panic!("no {key} in {reno}"));
            reno[at + key.len() + 1..]
                .split(|c: char| !c.is_ascii_digit())
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("no {key} value in {reno}"))
        };
        assert_eq!(
            skmem("rb"),
            u64_at(&doc, &["socket", end, "recv_buffer_bytes"]),
            "{end}: SO_RCVBUF as ss sees it\n{reno}"
        );
        assert_eq!(
            skmem("tb"),
            u64_at(&doc, &["socket", end, "send_buffer_bytes"]),
            "{end}: SO_SNDBUF as ss sees it\n{reno}"
        );
        assert_eq!(
            at(&doc, &["socket", end, "congestion"]),
            &Value::String("reno".into())
        );
    }
    // The agent paces its share... of nothing: forward, it receives. The client's stream is
    // paced at -b (one stream: all of it).
    assert_eq!(
        u64_at(&doc, &["socket", "client", "pacing_bits_per_second"]),
        200_000_000,
        "{doc:#}"
    );
}

/// Issue 19: crr's connections take the options at both ends: every full segment of the
/// requests and responses carries DSCP EF and none is above `-M 1000`, every connection's SYN
/// announces 1,000 (as many SYNs as the result's connects), and both ends report reno and the
/// TOS byte they sent with.
#[test]
fn crr_connections_carry_the_options_at_both_ends() {
    let _file = crate::common::file_lock(module_path!());
    let test = "crr_connections_carry_the_options_at_both_ends";
    if !require_or_skip(test, NEEDS) {
        return;
    }
    let lab = Lab::new();
    let agent = Agent::start_in(Some(lab.b()), B_ADDR, &[]);
    let port = agent.port();
    // The crr connections are the ones whose SYN announces 1,000: conntrack marks them, at b as
    // the SYN comes in and at a as it leaves, so the control connection on the same port is
    // left out. Counted: their packets that carry data (or a SYN: longer than the 52 bytes of
    // a bare acknowledgement), those with DSCP EF, and those longer than a 1,000-byte MSS
    // allows (20 of IPv4, 32 of TCP with timestamps).
    let syn = format!("tcp dport {port} tcp flags syn tcp option maxseg size 1000");
    let mark = format!("{syn} ct mark set 0x1");
    let rules = |dir: &str| {
        // The agent's SYN-ACK goes out before it sets the options on the accepted connection.
        let flow = format!("tcp {dir} {port} ct mark 0x1 tcp flags & syn != syn");
        vec![
            format!("{flow} ip length > 52"),
            format!("{flow} ip length > 52 ip dscp ef"),
            format!("{flow} ip length > 1052"),
        ]
    };
    let mut at_b = vec![mark.clone()];
    at_b.extend(rules("dport"));
    lab.count(Side::B, &at_b);
    lab.chain(
        Side::A,
        ("sonde_sock", "syn_out"),
        "output priority 0",
        &[mark],
    );
    lab.count(Side::A, &rules("sport"));
    let target = agent.target();
    let doc = client(
        &lab,
        &[
            "crr",
            &target,
            "-t",
            "1",
            "-m",
            "3000",
            "--response-size",
            "4000",
            "--dscp",
            "ef",
            "-M",
            "1000",
            "-C",
            "reno",
        ],
    );
    let (at_b, at_a) = (lab.counts(Side::B), lab.counts(Side::A));
    eprintln!(
        "at the agent {at_b:?} (SYN MSS 1000, longer than 52, of them EF, above the MSS), at the client {at_a:?}"
    );
    let transactions = u64_at(&doc, &["transactions"]);
    assert!(transactions > 10, "{doc:#}");
    assert_eq!(
        at_b[0],
        u64_at(&doc, &["connects"]),
        "a SYN per connection: {at_b:?}"
    );
    // Requests of 3,000 bytes are four segments at least, responses of 4,000 five.
    for (side, c, per) in [("requests", &at_b[1..], 4), ("responses", &at_a[..], 5)] {
        assert!(
            c[0] >= per * transactions,
            "{side}: {c:?}, {transactions} transactions"
        );
        assert_eq!(c[1], c[0], "{side}: DSCP EF on every segment: {c:?}");
        assert_eq!(c[2], 0, "{side}: none above the MSS: {c:?}");
    }
    for end in ["client", "server"] {
        assert_eq!(u64_at(&doc, &["socket", end, "tos"]), 46 << 2, "{doc:#}");
        assert_eq!(
            at(&doc, &["socket", end, "congestion"]),
            &Value::String("reno".into()),
            "{doc:#}"
        );
        let mss = u64_at(&doc, &["socket", end, "mss_bytes"]);
        assert!((900..=1000).contains(&mss), "{end}: {mss}\n{doc:#}");
    }
}
