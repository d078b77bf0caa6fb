//! The load balancer lab (issue 19): every test through a balancer with two agents behind it,
//! and through source and destination NAT.
//!
//! Four namespaces: the client `c` (198.18.10.2) and two agents `a1` (198.18.11.2) and `a2`
//! (198.18.12.2), each on its own veth to the balancer `lb` (198.18.10.1, 198.18.11.1,
//! 198.18.12.1), which routes between them. The agents listen on port 5300; the client tests
//! 198.18.10.1:5300, the balancer's address, which no agent has. Three balancers:
//! - nftables DNAT, `numgen inc` (round robin) over the two agents, per TCP connection and per
//!   UDP flow, keeping the client's address (a cloud network load balancer);
//! - the same with a masquerade toward the agents: source and destination NAT ("the public
//!   address");
//! - Debian's haproxy in TCP mode, round robin over the two agents, proxying (the agents see
//!   haproxy's address); it forwards no UDP.
//!
//! Checked: each test completes, says which agent served it (its own address, not the
//! balancer's) and, where the balancer placed a channel on the other agent first, warns that
//! the address is a balancer and says how many channels were opened again; the figures are
//! counted (bytes, messages) and come from the agent that served them. Through haproxy a UDP
//! test fails with one line that says UDP is not forwarded, and exit code 3.
//!
//! Needs root, `ip`, `nft` and `haproxy`; without them the tests print `SKIP ...` and pass,
//! unless `SONDE_TEST_REQUIRE_ALL=1`. Traffic stays inside the namespaces, addressed from
//! 198.18.0.0/15. About 40 s in all.

use crate::common;

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::Value;

use common::netns::{self, link_up, veth, Namespaces, Segments};
use common::{at, check, command_in, require_or_skip, run_json_in, tool, Agent, Daemon, Need};

/// The balancer's address, which the client tests.
const VIP: &str = "198.18.10.1:5300";
/// The agents' own addresses.
const AGENTS: [&str; 2] = ["198.18.11.2:5300", "198.18.12.2:5300"];

/// The lab: the client, the balancer, two agents running.
struct Lab {
    ns: Namespaces,
    _agents: Vec<Agent>,
}

impl Lab {
    fn new(tag: &str) -> Lab {
        let ns = Namespaces::new(tag, &["lb", "c", "a1", "a2"]);
        let lb = ns.name(0);
        for (host, k) in [(1, 10), (2, 11), (3, 12)] {
            let name = ns.name(host);
            let rdev = format!("veth-l{k}");
            veth(name, "veth-h", lb, &rdev);
            link_up(
                name,
                "veth-h",
                &format!("198.18.{k}.2"),
                1500,
                Segments::Whole,
            );
            link_up(lb, &rdev, &format!("198.18.{k}.1"), 1500, Segments::Whole);
            netns::ip(
                name,
                &[
                    "route",
                    "add",
                    "198.18.0.0/15",
                    "via",
                    &format!("198.18.{k}.1"),
                ],
            );
        }
        check(command_in(Some(lb), tool("sysctl")).args(["-qw", "net.ipv4.ip_forward=1"]));
        let agents = [(2, "198.18.11.2"), (3, "198.18.12.2")]
            .into_iter()
            .map(|(i, addr)| {
                Agent::with_args(
                    Some(ns.name(i)),
                    &["server", "--bind", addr, "--port", "5300"],
                )
            })
            .collect();
        Lab {
            ns,
            _agents: agents,
        }
    }

    fn lb(&self) -> &str {
        self.ns.name(0)
    }

    fn c(&self) -> &str {
        self.ns.name(1)
    }

    /// An nftables DNAT balancer at [`VIP`]: round robin over the agents per TCP connection and
    /// per UDP flow; with `snat`, the agents see the balancer's address instead of the client's.
    fn nft_balancer(&self, snat: bool) {
        let mut rules = String::from(
            "table ip sonde_lb {\n\
             chain pre { type nat hook prerouting priority -100;\n\
             ip daddr 198.18.10.1 tcp dport 5300 dnat to numgen inc mod 2 map { 0 : 198.18.11.2, 1 : 198.18.12.2 }\n\
             ip daddr 198.18.10.1 udp dport 5300 dnat to numgen inc mod 2 map { 0 : 198.18.11.2, 1 : 198.18.12.2 }\n\
             }\n",
        );
        if snat {
            rules.push_str(
                "chain post { type nat hook postrouting priority 100;\n\
                 ip daddr { 198.18.11.2, 198.18.12.2 } masquerade\n\
                 }\n",
            );
        }
        rules.push_str("}\n");
        let path = std::env::temp_dir().join(format!(
            "sonde-lab-balancer-{}-{}.nft",
            std::process::id(),
            self.lb()
        ));
        std::fs::write(&path, rules).expect("write the nftables rules");
        let out = check(
            command_in(Some(self.lb()), tool("nft"))
                .arg("-f")
                .arg(&path),
        );
        let _ = std::fs::remove_file(&path);
        drop(out);
    }

    /// haproxy in TCP mode at [`VIP`], round robin over the agents; killed on drop.
    fn haproxy(&self) -> Daemon {
        let cfg = "global\n  maxconn 256\n\
                   defaults\n  mode tcp\n  timeout connect 5s\n  timeout client 60s\n  timeout server 60s\n\
                   frontend vip\n  bind 198.18.10.1:5300\n  default_backend agents\n\
                   backend agents\n  balance roundrobin\n\
                   \x20 server a1 198.18.11.2:5300\n  server a2 198.18.12.2:5300\n";
        let path = std::env::temp_dir().join(format!(
            "sonde-lab-haproxy-{}-{}.cfg",
            std::process::id(),
            self.lb()
        ));
        std::fs::write(&path, cfg).expect("write the haproxy configuration");
        let mut cmd = command_in(Some(self.lb()), tool("haproxy"));
        cmd.arg("-db").arg("-f").arg(&path);
        let daemon = Daemon::spawn(&mut cmd);
        // Ready when its port answers inside the namespace.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let probe = command_in(Some(self.lb()), tool("ss"))
                .args(["-Htln", "sport", "= :5300"])
                .output()
                .expect("ss");
            if !String::from_utf8_lossy(&probe.stdout).trim().is_empty() {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "haproxy did not listen within 10 s:\n{}",
                daemon.stderr()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        daemon
    }

    /// `sonde ARGS... VIP --no-save --json` from the client: its document.
    fn run(&self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.extend([VIP, "--no-save"]);
        run_json_in(Some(self.c()), &all, Duration::from_secs(60))
    }
}

/// A test through the balancer, and the figure that shows it carried traffic.
struct Case {
    args: &'static [&'static str],
    /// A path in the document to a count that must be above zero.
    counted: &'static [&'static str],
    /// Where the document's sessions are: the top for one session, `load`'s parts for its
    /// three.
    sessions: &'static [&'static str],
}

/// A document of one session.
const ONE: &[&str] = &[""];

const TCP_CASES: &[Case] = &[
    Case {
        args: &["latency", "-t", "1"],
        counted: &["samples"],
        sessions: ONE,
    },
    Case {
        args: &["throughput", "-t", "1", "-P", "4"],
        counted: &["receiver", "bytes"],
        sessions: ONE,
    },
    Case {
        args: &["throughput", "-t", "1", "-P", "2", "-R"],
        counted: &["receiver", "bytes"],
        sessions: ONE,
    },
    Case {
        args: &["throughput", "-t", "1", "-P", "2", "--bidir"],
        counted: &["receiver", "bytes"],
        sessions: ONE,
    },
    Case {
        args: &[
            "load", "-t", "1", "--warmup", "0", "--ramp", "0.5", "-P", "2",
        ],
        counted: &["loaded", "samples"],
        sessions: &["idle", "loaded", "load"],
    },
];

const UDP_CASES: &[Case] = &[
    Case {
        args: &["latency", "-u", "-t", "1"],
        counted: &["samples"],
        sessions: ONE,
    },
    Case {
        args: &["throughput", "-u", "-t", "1", "-P", "2", "-b", "20M"],
        counted: &["receiver", "bytes"],
        sessions: ONE,
    },
    Case {
        args: &["throughput", "-u", "-t", "1", "-P", "2", "-b", "20M", "-R"],
        counted: &["receiver", "bytes"],
        sessions: ONE,
    },
    Case {
        args: &["pps", "-t", "1", "--flows", "4"],
        counted: &["received"],
        sessions: ONE,
    },
];

/// Runs `cases` through the lab's balancer; every one must name an agent behind it, have
/// counted traffic, and warn exactly when channels were opened again. The agents seen over all
/// the runs, and the channels opened again.
fn run_cases(lab: &Lab, cases: &[Case]) -> (BTreeSet<String>, u64) {
    let mut seen = BTreeSet::new();
    let mut reopened = 0;
    for case in cases {
        let doc = lab.run(case.args);
        let what = case.args.join(" ");
        let counted = at(&doc, case.counted);
        assert!(
            counted.as_u64().is_some_and(|n| n > 0) || counted.as_f64().is_some_and(|n| n > 0.0),
            "{what}: {} is {counted}\n{doc:#}",
            case.counts_path()
        );
        if case.sessions.len() > 1 {
            check_load_agents(&what, &doc);
        }
        for part in case.sessions {
            let session = if part.is_empty() {
                &doc
            } else {
                at(&doc, &[part])
            };
            seen.insert(check_session(&what, session));
            reopened += at(session, &["agent", "reopened_channels"])
                .as_u64()
                .unwrap_or(0);
        }
    }
    (seen, reopened)
}

/// One session's document: served by one of the agents, with a balancer warning exactly when
/// channels were opened again. The agent's address.
fn check_session(what: &str, doc: &Value) -> String {
    {
        let agent = at(doc, &["agent"]);
        let addr = agent["addr"].as_str().unwrap_or_default();
        assert!(
            AGENTS.contains(&addr),
            "{what}: served by {addr:?}, not one of the agents {AGENTS:?}\n{doc:#}"
        );
        let reopened = agent["reopened_channels"].as_u64().unwrap_or(0);
        let others = agent["other_agents"].as_array().map_or(0, Vec::len);
        let warned = doc["warning_codes"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c == "balancer"));
        let other_agent_load = doc["warnings"].as_array().is_some_and(|w| {
            w.iter()
                .any(|w| w.as_str().is_some_and(|w| w.contains("placed the probes")))
        });
        assert_eq!(
            warned,
            others > 0 || other_agent_load,
            "{what}: a balancer warning iff other agents answered\n{doc:#}"
        );
        if doc["test"] == "crr" {
            check_crr_spread(what, doc, others);
        } else {
            assert_eq!(others > 0, reopened > 0, "{what}\n{doc:#}");
        }
        if others > 0 {
            assert_ne!(
                agent["other_agents"][0], agent["id"],
                "{what}: the other agent is this one\n{doc:#}"
            );
        }
        addr.to_owned()
    }
}

/// `sonde load` behind a balancer: when the probes and the load reached different agents, the
/// loaded probes say so (their added RTT is the shared part of the path's), and the two are not
/// taken for each other's overlapping session.
fn check_load_agents(what: &str, doc: &Value) {
    let id = |part: &str| at(doc, &[part, "agent", "id"]).clone();
    let apart = id("loaded") != id("load");
    let said = doc["loaded"]["warnings"].as_array().is_some_and(|w| {
        w.iter()
            .any(|w| w.as_str().is_some_and(|w| w.contains("placed the probes")))
    });
    assert_eq!(
        said, apart,
        "{what}: the load on another agent is said\n{doc:#}"
    );
}

/// A crr test behind a balancer runs a session on every agent it found: each agent's share
/// adds up to the agent figures, which match what the client completed, and no connection
/// reached an agent without a session.
fn check_crr_spread(what: &str, doc: &Value, others: usize) {
    let shares = doc["agents"].as_array().cloned().unwrap_or_default();
    assert_eq!(others, 1, "{what}: both agents found\n{doc:#}");
    assert_eq!(shares.len(), 2, "{what}: a share per agent\n{doc:#}");
    let sum: u64 = shares
        .iter()
        .map(|a| a["transactions"].as_u64().unwrap_or(0))
        .sum();
    assert!(
        shares.iter().all(|a| a["transactions"].as_u64() > Some(0)),
        "{what}: round robin gives each agent connections\n{doc:#}"
    );
    assert_eq!(
        at(doc, &["agent_transactions"]).as_u64(),
        Some(sum),
        "{what}"
    );
    assert_eq!(
        at(doc, &["transactions"]).as_u64(),
        Some(sum),
        "{what}: every transaction the client completed, an agent counted\n{doc:#}"
    );
    assert_eq!(
        at(doc, &["errors", "other_agent"]).as_u64(),
        Some(0),
        "{what}"
    );
}

impl Case {
    fn counts_path(&self) -> String {
        self.counted.join(".")
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
            Need::Cmd("haproxy"),
        ],
    )
}

#[test]
fn every_test_completes_through_an_nftables_round_robin_over_two_agents() {
    let _file = crate::common::file_lock(module_path!());
    if !needs("every_test_completes_through_an_nftables_round_robin_over_two_agents") {
        return;
    }
    let lab = Lab::new("lbn");
    lab.nft_balancer(false);
    let (mut seen, reopened) = run_cases(&lab, TCP_CASES);
    // Round robin sends each session's first data connection to the other agent: every TCP
    // test had one opened again.
    assert!(reopened >= TCP_CASES.len() as u64, "{reopened} reopened");
    seen.extend(run_cases(&lab, UDP_CASES).0);
    // Round robin puts the sessions of successive tests on both agents.
    assert_eq!(seen.len(), 2, "every test went to {seen:?}");
}

#[test]
fn every_test_completes_through_source_and_destination_nat() {
    let _file = crate::common::file_lock(module_path!());
    if !needs("every_test_completes_through_source_and_destination_nat") {
        return;
    }
    let lab = Lab::new("lbs");
    lab.nft_balancer(true);
    run_cases(&lab, &TCP_CASES[..3]);
    run_cases(&lab, UDP_CASES);
}

#[test]
fn tcp_tests_complete_through_haproxy_and_udp_says_it_is_not_forwarded() {
    let _file = crate::common::file_lock(module_path!());
    if !needs("tcp_tests_complete_through_haproxy_and_udp_says_it_is_not_forwarded") {
        return;
    }
    let lab = Lab::new("lbh");
    let _haproxy = lab.haproxy();
    let (seen, reopened) = run_cases(&lab, TCP_CASES);
    assert!(reopened >= TCP_CASES.len() as u64, "{reopened} reopened");
    assert_eq!(seen.len(), 2, "every test went to {seen:?}");
    let mut cmd = command_in(Some(lab.c()), common::sonde_bin());
    cmd.args(["latency", "-u", "-t", "1", VIP, "--no-save"]);
    let out = common::run_with_timeout(&mut cmd, Duration::from_secs(30)).expect("sonde ran");
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let err = out.stderr.trim();
    assert_eq!(err.lines().count(), 1, "one line:\n{err}");
    assert!(
        err.contains("forwards TCP only") || err.contains("forwards only TCP"),
        "names the cause:\n{err}"
    );
}
