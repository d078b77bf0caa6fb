//! `sonde latency -P N --depth K --response-size SIZE` against a `sonde server` child: many
//! flows, many requests in flight, TCP and UDP, closed and open loop (`--rate`), with `-i`;
//! what the document adds up, and the options it refuses.

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
        (vec!["--depth", "2", "-n", "100"], "-n"),
        (vec!["-P", "2", "--full-log", "x.csv"], "--full-log"),
        (vec!["-P", "2", "--timestamps"], "--timestamps"),
        (vec!["-P", "2", "--one-way", "-m", "64"], "--one-way"),
        // The one-flow open loop's sender and reader would spin against each other.
        (vec!["--rate", "1000", "--busy-poll"], "--busy-poll"),
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
    // The refused --full-log was not created.
    assert!(!std::path::Path::new("x.csv").exists());
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

/// `-P 16 --rate 20K -t 2`: the open loop over many flows, TCP and UDP. What holds on any host,
/// however loaded: every request due on the schedule (20,000/s over the 0.5 s warm-up and the
/// 2 s) either left or is counted unsent, exactly; no flow got more than its sixteenth of the
/// schedule and the rate achieved is not above the rate asked (the schedule caps both); the run
/// says how many sends were late and how many never left rather than reaching the rate.
#[test]
fn open_loop_sixteen_flows_at_20k_tcp_and_udp() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server(&[]);
    let common = ["-P", "16", "--rate", "20K", "-t", "2", "--warmup", "0.5"];
    for udp in [false, true] {
        let mut args = if udp { vec!["-u"] } else { vec![] };
        args.extend(common);
        let doc = run_json("latency", &agent, &args);
        check_many_flows(&doc, 16, 1);
        assert_eq!(doc["mode"], "open_loop", "{doc:#}");
        assert_eq!(f(&doc, "/rate_per_second"), 20_000.0);
        let rr = &doc["request_response"];
        // 2.5 s at 20,000/s: 50,000 due, each sent or counted unsent.
        let (sent, unsent) = (u(&doc, "/sent"), u(rr, "/unsent"));
        assert_eq!(sent + unsent, 50_000, "udp {udp}: {doc:#}");
        let late = u(&doc, "/late_sends");
        assert!(late <= sent, "{doc:#}");
        // Achieved: what left of the 40,000 scheduled after the warm-up, over the 2 s. The
        // schedule caps it at the rate (a 0.1% slack for the float's rounding).
        let achieved = f(rr, "/rate_achieved_per_second");
        assert!(
            achieved > 0.0 && achieved <= 20_000.0 * 1.001,
            "udp {udp}: {doc:#}"
        );
        assert!(
            f(rr, "/transactions_per_second") <= achieved * 1.001,
            "{doc:#}"
        );
        // Each flow: at most its share (40,000 / 16 after the warm-up), and, unless the host
        // starved it, a fair part of it: at least a tenth (a flow never sending would be 0).
        for t in arr(rr, "/flow_transactions") {
            let t = t.as_u64().expect("a count");
            assert!(t <= 2_500, "a flow above its share: {doc:#}");
            assert!(t >= 250, "a flow far below its share: {doc:#}");
        }
        if udp {
            assert!(rr["timeouts"].is_u64(), "{doc:#}");
        } else {
            // TCP loses nothing: every request sent was answered.
            assert_eq!(
                u(&doc, "/samples") + u(&doc, "/warmup_samples"),
                sent,
                "{doc:#}"
            );
        }
    }
}

/// `--sweep rate=` with -P: each step is the open loop over the flows at that total rate.
#[test]
fn a_rate_sweep_over_many_flows() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server(&[]);
    let doc = run_json(
        "latency",
        &agent,
        &[
            "-P",
            "4",
            "-t",
            "0.3",
            "--warmup",
            "0.1",
            "--sweep",
            "rate=1K,4K",
        ],
    );
    let steps = arr(&doc, "/steps");
    assert_eq!(steps.len(), 2, "{doc:#}");
    for (step, rate) in steps.iter().zip([1_000u64, 4_000]) {
        let r = &step["result"];
        assert_eq!(r["mode"], "open_loop", "{doc:#}");
        assert_eq!(u(r, "/request_response/flows"), 4);
        // 0.4 s at the step's rate: every request due left or is counted unsent.
        assert_eq!(
            u(r, "/sent") + u(r, "/request_response/unsent"),
            rate * 4 / 10,
            "{doc:#}"
        );
    }
}

/// `-P 8 --depth 2 -i 0.5 -t 2`: intervals merged over every thread, live as `--json-stream`
/// events equal to the document's, tiling the run from the end of the warm-up, their counts
/// adding up to the run's, each with its transactions per second; and the store keeps them.
#[test]
fn intervals_over_eight_flows_two_deep_add_up_to_the_run() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server(&[]);
    for udp in [false, true] {
        let (_dir, db) = super::store::temp_db();
        let mut args = vec![
            "latency",
            "-P",
            "8",
            "--depth",
            "2",
            "--threads",
            "2",
            "-i",
            "0.5",
            "-t",
            "2",
            "--warmup",
            "0.5",
            "--json-stream",
            "--db",
        ];
        let target = agent.target();
        args.extend([super::store::path_str(&db), target.as_str()]);
        if udp {
            args.push("-u");
        }
        let (end, live) = super::store::json_stream(&args);
        let doc = &end["data"];
        check_many_flows(doc, 8, 2);
        // 0.5 to 1, 1 to 1.5, 1.5 to 2, 2 to the end (2.5 and the last responses after it).
        let intervals = super::store::check_latency_intervals(doc, &live, 4);
        let samples: u64 = intervals.iter().map(|iv| u(iv, "/samples")).sum();
        assert_eq!(
            samples,
            u(doc, "/request_response/transactions"),
            "udp {udp}"
        );
        for iv in intervals {
            let secs = (u(iv, "/end_ns") - u(iv, "/start_ns")) as f64 / 1e9;
            let tps = f(iv, "/transactions_per_second");
            assert!(
                (tps * secs - u(iv, "/samples") as f64).abs() < 1.0,
                "{iv:#}"
            );
        }
        let saved: Value =
            serde_json::from_str(&super::store::results(&db, &["show", "1", "--json"]))
                .expect("json");
        assert_eq!(&saved["intervals"], &doc["intervals"], "{saved:#}");
    }
}
