//! A plan over two paths to one host, in network namespaces: the client `c` reaches the target
//! `t` directly (c — t) and through a router `r` (c — r — t) whose egress toward either end is a
//! `tc tbf` of 10 Mbit/s. The plan is docs/plans.md's workflows 1 and 3 over those paths:
//!
//! - latency over both paths, TCP and UDP, 16 KiB messages (four cases). A 16 KiB message is
//!   a dozen packets, far more than tbf's 3,000-byte bucket lets through at once, so each
//!   crossing of r waits for the bucket to refill: the routed round trip carries milliseconds of
//!   serialisation (16 KiB + headers at 10 Mbit/s each way) that the direct veth (some tens of
//!   µs) has not. The test checks the order, for both protocols, not the figure: the plan's
//!   matrix (`--json`) and its HTML report both show each routed case's RTT above the direct one.
//! - throughput over the shaped path with 1, 2 and 5 streams (three cases): each case's total
//!   (at the receiver) is at most the shaped rate plus a margin, whatever the stream count, and
//!   well above nothing (the shaped path carried the traffic).
//!
//! The test prints `sonde plan check` and the plan run's text (the matrix), as docs/plans.md shows
//! them (`cargo test -p sonde --test lab -- plan:: --nocapture`).
//!
//! Needs root, `ip`, `tc` and `sysctl`; without them the test prints `SKIP ...` and passes, unless
//! `SONDE_TEST_REQUIRE_ALL=1` (CI). Traffic stays inside the namespaces, addressed from
//! 198.18.0.0/15; they are deleted when the lab drops, also when the test panics. About 15 s.

use crate::common;

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
/// The shaped rate in bit/s, for the throughput bound.
const RATE_BPS: f64 = 10e6;
/// The plan's whole run may take this long on a busy host (it measures 4 x 1.5 s + 3 x 2 s).
const PLAN_TIMEOUT: Duration = Duration::from_secs(180);

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

/// The mean RTT cell of the report's case table row of `case` (the report names a plan's cases by
/// their axis values, `protocol=tcp target=direct`), as a number (all rows are in the table's one
/// unit).
fn report_mean(html: &str, case: &str) -> f64 {
    let row = html
        .lines()
        .find(|l| l.starts_with(&format!("<tr data-case=\"{case}\">")))
        .unwrap_or_else(|| panic!("no row for {case} in the report"));
    // case, runs, then the figures: the mean first.
    let mean = row.split("<td").nth(3).expect("a mean cell");
    let text: String = mean
        .split('>')
        .nth(1)
        .and_then(|s| s.split('<').next())
        .unwrap_or_default()
        .chars()
        .filter(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    text.parse()
        .unwrap_or_else(|_| panic!("the mean of {case} is not a number: {row}"))
}

/// The plan: workflow 1 (latency matrix: paths x protocols, 16 KiB) and workflow 3 (throughput
/// with 1, 2 and 5 streams) of docs/plans.md, over the two paths.
fn plan_text(direct: &Agent, routed: &Agent) -> String {
    format!(
        "name = \"paths\"

[endpoints]
direct = \"{}\"
routed = \"{}\"

# Workflow 1: latency over both paths, TCP and UDP, 16 KiB messages.
[[matrix]]
test = \"latency\"
target = [\"direct\", \"routed\"]
protocol = [\"tcp\", \"udp\"]
msg_size = \"16K\"
time = 1
warmup = 0.5

# Workflow 3: throughput through the 10 Mbit/s path with 1, 2 and 5 streams.
[[matrix]]
test = \"throughput\"
target = \"routed\"
parallel = [1, 2, 5]
time = 2
",
        direct.target(),
        routed.target()
    )
}

/// Runs `sonde ARGS` in c, in `dir`, and returns its output after printing it as a shell session
/// (`$ sonde ARGS`, then stderr and stdout), as docs/plans.md shows it.
fn sonde_in_c(lab: &Lab, dir: &std::path::Path, args: &[&str]) -> common::Output {
    let mut cmd = command_in(Some(lab.ns.name(0)), sonde_bin());
    cmd.args(args).current_dir(dir);
    let out = run_with_timeout(&mut cmd, PLAN_TIMEOUT).unwrap_or_else(|e| panic!("{e}"));
    println!("$ sonde {}", args.join(" "));
    print!("{}{}", out.stderr, out.stdout);
    println!();
    out
}

#[test]
fn a_plan_over_two_paths_shows_the_routed_paths_higher_rtt_and_the_shaped_rate() {
    let _file = crate::common::file_lock(module_path!());
    let test = "a_plan_over_two_paths_shows_the_routed_paths_higher_rtt_and_the_shaped_rate";
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
    let plan = plan_text(&direct, &routed);
    std::fs::write(dir.path().join("paths.toml"), &plan).expect("write the plan");
    println!("$ cat paths.toml\n{plan}");

    let out = sonde_in_c(&lab, dir.path(), &["plan", "check", "paths.toml"]);
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
    assert!(
        out.stdout.contains("7 cases, 7 runs"),
        "plan check: {}",
        out.stdout
    );

    let out = sonde_in_c(
        &lab,
        dir.path(),
        &[
            "plan",
            "run",
            "paths.toml",
            "--db",
            "results.db",
            "--report",
            "paths.html",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
    let group = out
        .stdout
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("plan paths run "))
        .unwrap_or_else(|| panic!("no \"plan paths run N\" line: {}", out.stdout))
        .to_owned();
    // The same plan run's matrix as JSON: a resume with nothing left to run prints it.
    let mut cmd = command_in(Some(lab.ns.name(0)), sonde_bin());
    cmd.args(["plan", "run", "paths.toml", "--db", "results.db", "--json"])
        .args(["--resume", &group])
        .current_dir(dir.path());
    let out = run_with_timeout(&mut cmd, PLAN_TIMEOUT).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
    assert!(
        out.stderr.contains("0 of 7 runs to make"),
        "the resume ran something: {}",
        out.stderr
    );
    let doc: Value = serde_json::from_str(&out.stdout).expect("one JSON document");
    assert_eq!(doc["failures"], serde_json::json!([]), "{doc:#}");

    let latency = doc["matrix"]
        .as_array()
        .and_then(|t| t.iter().find(|t| t["test"] == "latency"))
        .unwrap_or_else(|| panic!("no latency table: {doc:#}"));
    for protocol in ["tcp", "udp"] {
        for figure in ["rtt_p50_ns", "rtt_mean_ns"] {
            let (d, r) = (
                cell(
                    latency,
                    &format!("target=direct protocol={protocol}"),
                    figure,
                ),
                cell(
                    latency,
                    &format!("target=routed protocol={protocol}"),
                    figure,
                ),
            );
            // The routed path holds milliseconds of serialisation; the veth next to it tens
            // of µs. Twice is far inside that gap, whatever the host's load does to either.
            assert!(
                r > 2.0 * d,
                "{protocol} {figure}: routed {r} ns is not well above direct {d} ns\n{doc:#}"
            );
        }
    }

    let throughput = doc["matrix"]
        .as_array()
        .and_then(|t| t.iter().find(|t| t["test"] == "throughput"))
        .unwrap_or_else(|| panic!("no throughput table: {doc:#}"));
    for parallel in [1, 2, 5] {
        let bps = cell(
            throughput,
            &format!("parallel={parallel}"),
            "bits_per_second",
        );
        // The streams share one 10 Mbit/s queue: their total is bounded by it (payload, so
        // below it; 10% margin for the bucket and the edges of the window), however many there
        // are; and a tenth of it is far below what TCP gets through an idle shaped link.
        assert!(
            bps <= 1.1 * RATE_BPS,
            "-P {parallel}: {bps} bit/s is above the shaped {RATE}\n{doc:#}"
        );
        assert!(
            bps >= 0.1 * RATE_BPS,
            "-P {parallel}: {bps} bit/s, the shaped path carried next to nothing\n{doc:#}"
        );
    }

    let html = std::fs::read_to_string(dir.path().join("paths.html")).expect("the report");
    for protocol in ["tcp", "udp"] {
        let (d, r) = (
            report_mean(&html, &format!("protocol={protocol} target=direct")),
            report_mean(&html, &format!("protocol={protocol} target=routed")),
        );
        assert!(
            r > d,
            "the report's {protocol} mean RTT: routed {r}, direct {d}"
        );
    }
}
