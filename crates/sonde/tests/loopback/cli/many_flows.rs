//! `sonde latency -P N --depth K --response-size SIZE` against a `sonde server` child: many
//! flows, many requests in flight, TCP and UDP; what the document adds up, and the options it
//! refuses.

use serde_json::Value;

use super::common::json::{arr, f, u};
use super::{run, run_json, server};

/// The many-flow figures of `doc`, checked for what holds in any run: `flows` flows, the
/// per-flow transactions adding up to the total and to the RTT samples, a fairness index in
/// (0, 1], min <= max, and the percentiles stated.
fn check_many_flows(doc: &Value, flows: u64, depth: u64) {
    let rr = &doc["request_response"];
    assert_eq!(u(rr, "/flows"), flows, "{doc:#}");
    assert_eq!(u(rr, "/depth"), depth, "{doc:#}");
    let per_flow: Vec<u64> = arr(rr, "/flow_transactions")
        .iter()
        .map(|v| v.as_u64().expect("a count"))
        .collect();
    assert_eq!(per_flow.len() as u64, flows, "{doc:#}");
    let total: u64 = per_flow.iter().sum();
    assert_eq!(total, u(rr, "/transactions"), "{doc:#}");
    // Every measured transaction is one RTT sample of the merged distribution.
    assert_eq!(total, u(doc, "/samples"), "{doc:#}");
    assert!(
        per_flow.iter().all(|&t| t > 0),
        "a flow got nothing: {doc:#}"
    );
    let fairness = f(rr, "/fairness");
    assert!(fairness > 0.0 && fairness <= 1.0, "{doc:#}");
    assert!(f(rr, "/flow_min_per_second") <= f(rr, "/flow_max_per_second"));
    assert!(f(rr, "/transactions_per_second") > 0.0);
    for p in ["p50", "p90", "p99"] {
        assert!(doc["rtt_ns"][p].is_u64(), "{p} is not stated: {doc:#}");
    }
    assert!(u(rr, "/client_threads") >= 1);
    assert!(f(rr, "/client_cpu_ns_per_transaction") > 0.0, "{doc:#}");
    assert!(f(rr, "/server_cpu_ns_per_transaction") > 0.0, "{doc:#}");
}

#[test]
fn sixteen_flows_four_deep_tcp_and_udp() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server(&[]);
    let common = ["-P", "16", "--depth", "4", "-t", "0.5", "--warmup", "0.2"];

    let doc = run_json("latency", &agent, &common);
    check_many_flows(&doc, 16, 4);
    assert_eq!(u(&doc, "/request_response/response_size_bytes"), 64);
    // TCP loses nothing: every request sent, warm-up or not, was answered.
    assert_eq!(
        u(&doc, "/samples") + u(&doc, "/warmup_samples"),
        u(&doc, "/sent"),
        "{doc:#}"
    );
    assert!(doc["request_response"]["timeouts"].is_null(), "{doc:#}");

    let mut udp = vec!["-u", "--response-size", "1K"];
    udp.extend(common);
    let doc = run_json("latency", &agent, &udp);
    check_many_flows(&doc, 16, 4);
    assert_eq!(u(&doc, "/request_response/response_size_bytes"), 1024);
    let (sent, lost) = (u(&doc, "/sent"), u(&doc, "/lost"));
    assert!(
        lost * 1000 <= sent,
        "more than 0.1% lost on loopback: {doc:#}"
    );
    assert_eq!(
        u(&doc, "/lost_outbound") + u(&doc, "/lost_return"),
        lost,
        "{doc:#}"
    );
    assert!(doc["request_response"]["timeouts"].is_u64(), "{doc:#}");
}

/// 256 connections, 4 requests in flight each (1,024 outstanding), against one agent, from one
/// client: more descriptors than a default soft limit of 1,024 leaves room for in some shells
/// (the client raises its own to the hard limit when it must).
#[test]
fn two_hundred_fifty_six_flows_against_one_agent() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server(&[]);
    let doc = run_json(
        "latency",
        &agent,
        &["-P", "256", "--depth", "4", "-t", "0.5", "--warmup", "0.2"],
    );
    check_many_flows(&doc, 256, 4);
}

/// `-P 1 --depth 1` (the defaults) is the one-flow test: no many-flow section.
#[test]
fn one_flow_one_deep_is_the_one_flow_test() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server(&[]);
    let doc = run_json(
        "latency",
        &agent,
        &["-P", "1", "--depth", "1", "-t", "0.3", "--warmup", "0.1"],
    );
    assert!(doc.get("request_response").is_none(), "{doc:#}");
    assert_eq!(doc["mode"], "closed_loop");
}

/// What a many-flow test cannot be combined with is a usage error (exit 2) that says so,
/// before any test runs.
#[test]
fn what_many_flows_refuse() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server(&[]);
    let t = agent.target();
    for (args, says) in [
        (vec!["-P", "4", "--rate", "1000"], "--rate"),
        (vec!["--depth", "2", "-n", "100"], "-n"),
        (vec!["-P", "2", "-i", "0.1"], "-i"),
        (vec!["-u", "-P", "2", "-m", "4"], "8-byte sequence number"),
        (vec!["--depth", "0"], "--depth is 1 to 1024"),
        (vec!["-P", "2", "--threads", "0"], "--threads"),
    ] {
        let mut all = vec!["latency", t.as_str(), "--warmup", "0"];
        all.extend(&args);
        let r = run(&all);
        assert_eq!(r.code, Some(2), "{args:?}: {}", r.stderr);
        assert!(r.stderr.contains(says), "{args:?}: {}", r.stderr);
    }
}

/// `--sweep depth=1,4` and `--sweep parallel=1,4`: one step per value, each the test its
/// flags would run (the one-flow test where both are 1).
#[test]
fn sweeps_of_depth_and_parallel() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server(&[]);
    for (args, param) in [
        (["-P", "4", "--sweep", "depth=1,4"], "depth"),
        (["--depth", "1", "--sweep", "parallel=1,4"], "parallel"),
    ] {
        let mut all = vec!["-t", "0.3", "--warmup", "0.1"];
        all.extend(args);
        let doc = run_json("latency", &agent, &all);
        assert_eq!(doc["parameter"], param, "{doc:#}");
        let steps = arr(&doc, "/steps");
        assert_eq!(steps.len(), 2, "{doc:#}");
        let last = &steps[1]["result"];
        assert_eq!(
            u(
                last,
                &format!(
                    "/request_response/{}",
                    if param == "depth" { "depth" } else { "flows" }
                )
            ),
            4
        );
        if param == "parallel" {
            assert!(
                steps[0]["result"].get("request_response").is_none(),
                "{doc:#}"
            );
        }
    }
}
