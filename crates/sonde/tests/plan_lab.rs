//! A plan over two paths to one host, in network namespaces: the client `c` reaches the target
//! `t` directly (c — t) and through a router `r` (c — r — t) whose egress toward either end is a
//! `tc tbf` of 10 Mbit/s. An 8 KiB TCP message is six segments, more than tbf's 3,000-byte
//! bucket lets through at once, so each crossing of r waits for the bucket to refill: the
//! routed path's round trip carries milliseconds of serialisation (8 KiB + headers at 10 Mbit/s
//! each way, less what the bucket holds; 7 ms in a run here) that the direct veth (some tens of
//! µs) has not. The test checks only the order, not
//! the figure: the plan's matrix (`--json`) and its HTML report both show the routed case's
//! RTT above the direct one's.
//!
//! Needs root, `ip`, `tc` and `sysctl`; without them the test prints `SKIP ...` and passes, unless
//! `SONDE_TEST_REQUIRE_ALL=1` (CI). Traffic stays inside the namespaces, addressed from
//! 198.18.0.0/15; they are deleted when the lab drops, also when the test panics. About 6 s.

mod common;

use std::time::Duration;

use serde_json::Value;

use common::netns::{self, link_up, tbf, veth, Namespaces, Segments};
use common::{check, command_in, require_or_skip, run_with_timeout, sonde_bin, tool, Agent, Need};

/// The direct link.
const C_DIRECT: &str = "198.18.0.1";
const T_DIRECT: &str = "198.18.0.2";
/// c — r.
const C_ROUTED: &str = "198.18.1.1";
const R_C: &str = "198.18.1.254";
/// r — t.
const R_T: &str = "198.18.2.254";
const T_ROUTED: &str = "198.18.2.2";
/// r's queues: 10 Mbit/s, a bucket of two full frames, at most 50 ms queued.
const RATE: &str = "10mbit";
const BURST_BYTES: u32 = 3_000;
const QUEUE: &str = "50ms";
/// The plan's whole run may take this long on a busy host (it measures 2 x 2.5 s).
const PLAN_TIMEOUT: Duration = Duration::from_secs(90);

/// c, r and t with the two paths; deleted on drop.
struct Lab {
    ns: Namespaces,
}

impl Lab {
    fn new() -> Lab {
        let lab = Lab {
            ns: Namespaces::new("plan", &["c", "r", "t"]),
        };
        let (c, r, t) = (lab.ns.name(0), lab.ns.name(1), lab.ns.name(2));
        veth(c, "veth-ct", t, "veth-tc");
        veth(c, "veth-cr", r, "veth-rc");
        veth(r, "veth-rt", t, "veth-tr");
        // One segment per packet, so tbf meters each segment as a wire would carry it.
        for (ns, dev, addr) in [
            (c, "veth-ct", C_DIRECT),
            (t, "veth-tc", T_DIRECT),
            (c, "veth-cr", C_ROUTED),
            (r, "veth-rc", R_C),
            (r, "veth-rt", R_T),
            (t, "veth-tr", T_ROUTED),
        ] {
            link_up(ns, dev, addr, 1500, Segments::OnePerPacket);
        }
        netns::ip(c, &["route", "add", "198.18.2.0/24", "via", R_C]);
        netns::ip(t, &["route", "add", "198.18.1.0/24", "via", R_T]);
        check(command_in(Some(r), tool("sysctl")).args(["-w", "net.ipv4.ip_forward=1"]));
        for dev in ["veth-rc", "veth-rt"] {
            tbf(r, dev, RATE, BURST_BYTES, QUEUE);
        }
        lab
    }
}

/// The column of `figure` in a matrix table of the plan's JSON.
fn column(table: &Value, figure: &str) -> usize {
    table["columns"]
        .as_array()
        .and_then(|c| c.iter().position(|f| f == figure))
        .unwrap_or_else(|| panic!("no {figure} column: {table:#}"))
}

/// A case's figure in the matrix table.
fn cell(table: &Value, case: &str, figure: &str) -> f64 {
    let i = column(table, figure);
    table["rows"]
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["name"] == case))
        .and_then(|r| r["cells"][i]["value"].as_f64())
        .unwrap_or_else(|| panic!("no {figure} for {case}: {table:#}"))
}

/// The mean RTT cell of the report's case table row of case `target=NAME` (the report names a
/// plan's cases by their axis values), as a number (both rows are in the table's one unit).
fn report_mean(html: &str, name: &str) -> f64 {
    let row = html
        .lines()
        .find(|l| l.starts_with(&format!("<tr data-case=\"target={name}\">")))
        .unwrap_or_else(|| panic!("no row for target={name} in the report"));
    // case, labels, runs, then the figures: the mean first.
    let mean = row.split("<td").nth(4).expect("a mean cell");
    let text: String = mean
        .split('>')
        .nth(1)
        .and_then(|s| s.split('<').next())
        .unwrap_or_default()
        .chars()
        .filter(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    text.parse()
        .unwrap_or_else(|_| panic!("the mean of target={name} is not a number: {row}"))
}

#[test]
fn a_plan_over_two_paths_shows_the_routed_paths_higher_rtt() {
    let test = "a_plan_over_two_paths_shows_the_routed_paths_higher_rtt";
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
    let direct = Agent::start_in(Some(lab.ns.name(2)), T_DIRECT, &[]);
    let routed = Agent::start_in(Some(lab.ns.name(2)), T_ROUTED, &[]);
    let dir = tempfile::tempdir().expect("tempdir");
    let plan = dir.path().join("paths.toml");
    std::fs::write(
        &plan,
        format!(
            "name = \"paths\"\n\n[endpoints]\ndirect = \"{}\"\nrouted = \"{}\"\n\n\
             [[matrix]]\ntest = \"latency\"\ntarget = [\"direct\", \"routed\"]\n\
             msg_size = \"8K\"\ntime = 2\nwarmup = 0.5\n",
            direct.target(),
            routed.target()
        ),
    )
    .expect("write the plan");
    let db = dir.path().join("results.db");
    let report = dir.path().join("paths.html");
    let mut cmd = command_in(Some(lab.ns.name(0)), sonde_bin());
    cmd.args(["plan", "run"])
        .arg(&plan)
        .arg("--db")
        .arg(&db)
        .arg("--report")
        .arg(&report)
        .arg("--json");
    let out = run_with_timeout(&mut cmd, PLAN_TIMEOUT).unwrap_or_else(|e| panic!("{e}"));
    let stderr = &out.stderr;
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let doc: Value = serde_json::from_str(&out.stdout).expect("one JSON document");
    assert_eq!(doc["failures"], serde_json::json!([]), "{doc:#}");
    let table = &doc["matrix"][0];
    assert_eq!(table["test"], "latency", "{doc:#}");
    for figure in ["rtt_p50_ns", "rtt_mean_ns"] {
        let (d, r) = (
            cell(table, "target=direct", figure),
            cell(table, "target=routed", figure),
        );
        // The routed path holds milliseconds of serialisation; the veth next to it tens of µs.
        // Twice is far inside that gap, whatever the host's load does to either.
        assert!(
            r > 2.0 * d,
            "{figure}: routed {r} ns is not well above direct {d} ns\n{doc:#}"
        );
    }
    let html = std::fs::read_to_string(&report).expect("the report was written");
    let (d, r) = (report_mean(&html, "direct"), report_mean(&html, "routed"));
    assert!(r > d, "the report's mean RTT: routed {r}, direct {d}");
}
