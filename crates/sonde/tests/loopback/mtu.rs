//! `sonde mtu` on loopback (MTU 65,536): the search stops at the largest UDP datagram (65,507
//! bytes of payload, a 65,535-byte IPv4 packet) in two probes, both echoed; the document
//! validates against the schema; the TCP exchange reports an MSS at each end; the table, usage
//! errors and `--help`. The path MTU found below a router's smaller link is the lab's
//! (`tests/lab/mtu.rs`).
//!
//! Only 127.0.0.1; every run is bounded by `-t` and a time limit.

use crate::common;

use std::time::Duration;

use serde_json::Value;

use common::{run_json_in, run_with_timeout, Agent};

/// No single client run here may take longer.
const RUN_LIMIT: Duration = Duration::from_secs(30);

fn sonde(args: &[&str]) -> (Option<i32>, String, String) {
    let mut cmd = common::sonde_command();
    cmd.args(args).env("COLUMNS", "100").env("TERM", "dumb");
    let out = run_with_timeout(&mut cmd, RUN_LIMIT).unwrap_or_else(|e| panic!("{e}"));
    (out.status.code(), out.stdout, out.stderr)
}

fn valid(doc: &Value) {
    if let Err(errors) = sonde_report::validate(doc) {
        panic!(
            "the document breaks the schema:\n{}\n{doc:#}",
            errors.join("\n")
        );
    }
    serde_json::from_value::<sonde_report::TestResult>(doc.clone())
        .unwrap_or_else(|e| panic!("not a TestResult: {e}\n{doc:#}"));
}

#[test]
fn mtu_on_loopback_stops_at_the_largest_udp_datagram() {
    let _file = crate::common::file_lock(module_path!());
    let agent = Agent::start_in(None, "127.0.0.1", &["-q"]);
    let doc = run_json_in(None, &["mtu", &agent.target(), "--no-save"], RUN_LIMIT);
    valid(&doc);
    assert_eq!(doc["test"], "mtu", "{doc:#}");
    assert_eq!(doc["ip_version"], 4, "{doc:#}");
    // lo's MTU is 65,536; an IPv4 packet is at most 65,535 bytes.
    assert_eq!(doc["interface_mtu_bytes"], 65_536, "{doc:#}");
    assert_eq!(doc["ceiling_bytes"], 65_535, "{doc:#}");
    assert_eq!(doc["path_mtu_bytes"], 65_535, "{doc:#}");
    assert_eq!(doc["udp_payload_bytes"], 65_507, "{doc:#}");
    assert_eq!(doc["ip_header_bytes"], 20, "{doc:#}");
    assert_eq!(doc["udp_header_bytes"], 8, "{doc:#}");
    assert_eq!(doc["upper_bound"], "ceiling", "{doc:#}");
    assert_eq!(doc["smallest_refused_bytes"], Value::Null, "{doc:#}");
    assert_eq!(doc["complete"], true, "{doc:#}");
    // The floor, then the ceiling: two probes, both echoed.
    assert_eq!(doc["probes_sent"], 2, "{doc:#}");
    let sizes: Vec<u64> = doc["probes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            assert_eq!(p["fate"], "echoed", "{doc:#}");
            assert!(p["rtt_ns"].as_u64().is_some_and(|ns| ns > 0), "{doc:#}");
            p["ip_bytes"].as_u64().unwrap()
        })
        .collect();
    assert_eq!(sizes, [68, 65_535]);
    // The agent's echoes carried DF, as its kernel read it back.
    assert_eq!(doc["agent_dont_fragment"], true, "{doc:#}");
    // TCP's MSS at each end, read at connect and at the end of the 64 KiB exchange.
    let tcp = &doc["tcp"];
    assert_eq!(tcp["completed"], true, "{doc:#}");
    assert_eq!(tcp["exchanged_bytes"], 65_536, "{doc:#}");
    for key in [
        "client_mss_at_connect_bytes",
        "client_mss_bytes",
        "agent_mss_at_connect_bytes",
        "agent_mss_bytes",
    ] {
        let mss = tcp[key]
            .as_u64()
            .unwrap_or_else(|| panic!("{key}: {doc:#}"));
        assert!((536..=65_495).contains(&mss), "{key} {mss}: {doc:#}");
    }
    // Nothing to warn about: the path carries what the interface sends, up to UDP's limit.
    let codes = doc["warning_codes"].as_array().unwrap();
    assert!(
        !codes
            .iter()
            .any(|c| c.as_str().is_some_and(|c| c.contains("mtu"))),
        "{doc:#}"
    );
}

#[test]
fn mtu_table_and_usage() {
    let _file = crate::common::file_lock(module_path!());
    let agent = Agent::start_in(None, "127.0.0.1", &["-q"]);
    let target = agent.target();
    let (code, table, err) = sonde(&["mtu", &target, "--no-tcp", "--no-save"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(table.starts_with("sonde "), "{table}");
    assert!(
        table.contains("\npath MTU       65535 B  largest IP packet that crossed, both ways"),
        "{table}"
    );
    assert!(table.contains("\nUDP payload    65507 B"), "{table}");
    assert!(!table.contains("TCP MSS"), "--no-tcp: {table}");
    for bad in [
        vec!["mtu", target.as_str(), "--tries", "0"],
        vec!["mtu", target.as_str(), "--max-probes", "201"],
        vec!["mtu", target.as_str(), "--udp"],
    ] {
        let (code, _, err) = sonde(&bad);
        assert_eq!(code, Some(2), "{bad:?}: {err}");
    }
}

#[test]
fn help_mtu() {
    let _file = crate::common::file_lock(module_path!());
    let (code, out, err) = sonde(&["mtu", "--help"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("Exit codes:"), "{out}");
    insta::assert_snapshot!("help_mtu", out);
}
