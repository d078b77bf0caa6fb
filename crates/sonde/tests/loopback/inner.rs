//! Latency's inner view end to end, the binary against a `sonde server` child on loopback:
//! `--full-log`, `--histogram`, `--timestamps` and `--one-way`, each in the JSON (checked
//! against the schema), and the usage errors around them.
//!
//! Only 127.0.0.1; every run sends about a second of traffic. The kernel-timestamp checks are
//! Linux-only (elsewhere the figures are null with a warning, which is checked instead).

use crate::common;

use std::time::Duration;

use serde_json::Value;

use common::fulllog::{read_log, TempFile};
use common::{run_with_timeout, Agent};

const LIMIT: Duration = Duration::from_secs(60);

fn agent() -> Agent {
    Agent::start_in(None, "127.0.0.1", &["-q"])
}

/// `sonde latency TARGET ARGS...`: exit code, stdout, stderr.
fn latency(target: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let mut cmd = common::sonde_command();
    cmd.arg("latency").arg(target).args(args);
    let out = run_with_timeout(&mut cmd, LIMIT).unwrap_or_else(|e| panic!("{e}"));
    (out.status.code(), out.stdout, out.stderr)
}

/// `sonde latency TARGET ARGS... --json`, which must succeed: the document, schema-checked.
fn latency_json(agent: &Agent, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.push("--json");
    let (code, stdout, stderr) = latency(&agent.target(), &all);
    assert_eq!(
        code,
        Some(0),
        "`sonde latency {}`: {stderr}\n{stdout}",
        all.join(" ")
    );
    let doc: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    if let Err(errors) = sonde_report::validate(&doc) {
        panic!(
            "the document breaks the schema:\n{}\n{doc:#}",
            errors.join("\n")
        );
    }
    serde_json::from_value::<sonde_report::TestResult>(doc.clone())
        .unwrap_or_else(|e| panic!("does not read back: {e}\n{doc:#}"));
    doc
}

fn num(doc: &Value, pointer: &str) -> f64 {
    doc.pointer(pointer)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("{pointer} is not a number in\n{doc:#}"))
}

fn warnings(doc: &Value) -> Vec<String> {
    doc["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn the_full_log_has_a_line_per_message_and_the_result_says_so() {
    let _file = crate::common::file_lock(module_path!());
    let agent = agent();
    for proto in [&["-u"][..], &[], &["-u", "--rate", "3000"]] {
        let file = TempFile::new("inner-log");
        let mut args = vec!["-t", "1", "--warmup", "0.2", "--full-log", file.path()];
        args.extend_from_slice(proto);
        let doc = latency_json(&agent, &args);
        let sent = num(&doc, "/sent") as u64;
        assert_eq!(num(&doc, "/full_log/written") as u64, sent, "{proto:?}");
        assert_eq!(num(&doc, "/full_log/dropped"), 0.0);
        assert_eq!(doc["full_log"]["path"], file.path());
        let lines = read_log(&file);
        let mut seqs: Vec<u64> = lines.iter().map(|l| l.seq).collect();
        seqs.sort_unstable();
        assert_eq!(seqs, (0..sent).collect::<Vec<_>>(), "{proto:?}");
        let measured = lines
            .iter()
            .filter(|l| !l.warmup && l.outcome != "lost")
            .count();
        assert_eq!(measured as f64, num(&doc, "/samples"), "{proto:?}");
        assert_eq!(
            lines.iter().filter(|l| l.outcome == "lost").count() as f64,
            num(&doc, "/lost")
        );
        assert!(
            lines.iter().all(|l| l.socket_rtt_ns.is_none()),
            "no --timestamps"
        );
    }
}

#[test]
fn a_full_log_that_cannot_be_created_is_a_usage_error_before_the_test() {
    let _file = crate::common::file_lock(module_path!());
    // Nothing listens on port 1: the usage error comes before any connection.
    let (code, stdout, stderr) = latency(
        "127.0.0.1:1",
        &["--full-log", "/nonexistent-dir-of-sonde/rtt.csv"],
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stdout.is_empty());
    assert!(
        stderr.contains("cannot create /nonexistent-dir-of-sonde/rtt.csv"),
        "{stderr}"
    );
}

#[test]
fn the_histogram_holds_every_sample_and_only_when_asked() {
    let _file = crate::common::file_lock(module_path!());
    let agent = agent();
    let doc = latency_json(
        &agent,
        &["-u", "-t", "0.5", "--warmup", "0.1", "--histogram"],
    );
    let buckets = doc["rtt_histogram"].as_array().expect("rtt_histogram");
    let counts: u64 = buckets.iter().map(|b| b["count"].as_u64().unwrap()).sum();
    assert_eq!(counts as f64, num(&doc, "/samples"));
    // Ascending bounds; the first holds the minimum, the last the maximum.
    let les: Vec<u64> = buckets
        .iter()
        .map(|b| b["le_ns"].as_u64().unwrap())
        .collect();
    assert!(les.windows(2).all(|w| w[0] < w[1]), "{les:?}");
    assert!(les[0] as f64 >= num(&doc, "/rtt_ns/min"));
    assert!(*les.last().unwrap() as f64 >= num(&doc, "/rtt_ns/max"));
    // Not asked for: not in the document at all.
    let plain = latency_json(&agent, &["-u", "-t", "0.2", "--warmup", "0"]);
    assert!(plain.get("rtt_histogram").is_none() && plain.get("socket_rtt").is_none());
    assert!(plain.get("one_way").is_none() && plain.get("full_log").is_none());
    // The table and the CSV show it.
    let (code, table, _) = latency(
        &agent.target(),
        &["-t", "0.3", "--warmup", "0", "--histogram"],
    );
    assert_eq!(code, Some(0));
    assert!(
        table.contains("RTT histogram") && table.contains('█'),
        "{table}"
    );
    let (_, csv, _) = latency(
        &agent.target(),
        &["-t", "0.3", "--warmup", "0", "--histogram", "--csv"],
    );
    assert!(
        csv.lines().any(|l| l.starts_with("latency,histogram,")),
        "{csv}"
    );
}

#[test]
fn udp_kernel_timestamps_see_less_than_the_application_every_sample() {
    let _file = crate::common::file_lock(module_path!());
    let agent = agent();
    for rate in [None, Some("3000")] {
        let file = TempFile::new("inner-ts");
        let mut args = vec![
            "-u",
            "-t",
            "1",
            "--warmup",
            "0.2",
            "--timestamps",
            "--full-log",
            file.path(),
        ];
        if let Some(r) = rate {
            args.extend(["--rate", r]);
        }
        let doc = fully_stamped("tx_stamped", || latency_json(&agent, &args));
        let s = &doc["socket_rtt"];
        if !cfg!(target_os = "linux") {
            assert_eq!(s["rx_timestamps"], false);
            assert!(s["socket_rtt_ns"].is_null());
            assert!(warnings(&doc).iter().any(|w| w.contains("--timestamps")));
            continue;
        }
        let samples = num(&doc, "/samples");
        assert_eq!(s["rx_timestamps"], true);
        assert_eq!(s["tx_timestamps"], true);
        assert_eq!(num(s, "/rx_stamped"), samples, "{rate:?}");
        assert_eq!(num(s, "/tx_stamped"), samples, "{rate:?}");
        assert_eq!(num(s, "/inconsistent"), 0.0);
        assert!(num(s, "/socket_rtt_ns/p50") <= num(&doc, "/rtt_ns/p50"));
        assert!(num(s, "/host_ns/min") >= 0.0);
        // The per-sample check, from the full log: the sockets never see more than the
        // application, for any sample where both exist.
        let lines = read_log(&file);
        let mut both = 0u32;
        for l in &lines {
            if let (Some(app), Some(sock)) = (l.rtt_ns, l.socket_rtt_ns) {
                assert!(sock <= app, "{l:?}");
                both += 1;
            }
            if let (Some(app), Some(k)) = (l.rtt_ns, l.send_to_socket_rx_ns) {
                assert!(k <= app, "{l:?}");
            }
        }
        assert!(f64::from(both) >= samples, "{both} of {samples}");
    }
}

/// Runs `measure` until `socket_rtt`'s `count` (`rx_stamped`, or `tx_stamped`: both stamps)
/// covers every measured reply, three times at most, and returns the last run. Two things on
/// a loaded host cost stamps that say nothing about how the loop finds them: Linux turns
/// receive stamping on for the first socket that asks only a moment later, from a work queue
/// (`net_enable_timestamp` in net/core/dev.c: a host-wide static key), which can outlast the
/// warm-up; and a reader held off its core lets replies and transmit stamps fill the socket's
/// receive buffer, past which the kernel drops stamps (`sock_queue_err_skb`). Every check
/// holds for the run kept.
fn fully_stamped(count: &str, mut measure: impl FnMut() -> Value) -> Value {
    let pointer = format!("/socket_rtt/{count}");
    // Elsewhere nothing is stamped: nothing to wait for.
    let tries = if cfg!(target_os = "linux") { 3 } else { 1 };
    for _ in 1..tries {
        let doc = measure();
        let stamped = doc.pointer(&pointer).and_then(Value::as_f64);
        if stamped.is_none() || stamped == doc.pointer("/samples").and_then(Value::as_f64) {
            return doc;
        }
    }
    measure()
}

/// TCP's transmit stamps are keyed by byte: each message gets the stamp of its last byte. The
/// closed loop has one per message; the open loop may put two messages in one segment, which
/// carries the later one's stamp only, and a warning counts the samples without.
#[test]
#[cfg(target_os = "linux")]
fn tcp_kernel_timestamps_find_each_message_by_its_last_byte() {
    let _file = crate::common::file_lock(module_path!());
    let agent = agent();
    for (rate, size) in [(None, "64"), (None, "3000"), (Some("3000"), "64")] {
        let file = TempFile::new("inner-tcp-ts");
        let mut args = vec![
            "-t",
            "1",
            "--warmup",
            "0.2",
            "-m",
            size,
            "--timestamps",
            "--full-log",
            file.path(),
        ];
        if let Some(r) = rate {
            args.extend(["--rate", r]);
        }
        let doc = fully_stamped("rx_stamped", || latency_json(&agent, &args));
        let s = &doc["socket_rtt"];
        assert_eq!(
            (s["rx_timestamps"].as_bool(), s["tx_timestamps"].as_bool()),
            (Some(true), Some(true)),
            "{s:#}"
        );
        let samples = num(&doc, "/samples");
        let stamped = num(s, "/tx_stamped");
        if rate.is_none() {
            assert_eq!(stamped, samples, "{size}: {s:#}");
        } else {
            assert!(stamped >= samples * 0.9, "{s:#}");
            if stamped < samples {
                assert!(warnings(&doc)
                    .iter()
                    .any(|w| w.contains("had no kernel transmit timestamp")));
            }
        }
        assert!(num(s, "/socket_rtt_ns/p50") <= num(&doc, "/rtt_ns/p50"));
        assert!(num(s, "/host_ns/min") >= 0.0);
        let mut both = 0.0;
        for l in read_log(&file) {
            if let (Some(app), Some(k)) = (l.rtt_ns, l.socket_rtt_ns) {
                assert!(k <= app, "{l:?}");
                both += 1.0;
            }
            if let (Some(app), Some(k)) = (l.rtt_ns, l.send_to_socket_rx_ns) {
                assert!(k <= app, "{l:?}");
            }
        }
        assert!(both >= stamped, "{both} of {stamped}");
    }
}

/// On one host both ends read the same clock: the estimated offset is 0 within its bound, and
/// forward + return + the agent's hold is the RTT.
fn check_one_way_on_one_host(doc: &Value) {
    let ow = &doc["one_way"];
    assert_eq!(num(ow, "/samples"), num(doc, "/samples"));
    assert_eq!(num(ow, "/unstamped"), 0.0);
    let offset = num(ow, "/clock/offset_ns");
    let bound = num(ow, "/clock/offset_uncertainty_ns");
    assert!(
        offset.abs() <= bound,
        "offset {offset} ns ± {bound} ns on one host"
    );
    assert!(num(ow, "/clock/control_exchanges") >= 8.0);
    let u = num(ow, "/uncertainty_ns");
    assert!(
        u >= bound - 1.0,
        "the figures' bound includes the offset's: {u} < {bound}"
    );
    // Every delay is positive in truth: no stated one is below zero by more than the bound.
    for dir in ["forward_ns", "return_ns"] {
        assert!(num(ow, &format!("/{dir}/min")) >= -u, "{dir}: {ow:#}");
    }
    let sum =
        num(ow, "/forward_ns/mean") + num(ow, "/return_ns/mean") + num(ow, "/agent_hold_ns/mean");
    let rtt = num(doc, "/rtt_ns/mean");
    assert!(
        (sum - rtt).abs() <= rtt * 0.01 + 100.0,
        "forward + return + hold {sum} vs RTT {rtt}"
    );
}

#[test]
fn one_way_on_loopback_finds_no_offset_and_adds_up_to_the_rtt() {
    let _file = crate::common::file_lock(module_path!());
    let agent = agent();
    for args in [
        &["-u", "-t", "1.5", "--warmup", "0.5", "--one-way"][..],
        &["-t", "1.5", "--warmup", "0.5", "--one-way", "-m", "24"],
        &[
            "-u",
            "-t",
            "1.5",
            "--warmup",
            "0.5",
            "--one-way",
            "--rate",
            "2000",
        ],
    ] {
        let doc = latency_json(&agent, args);
        check_one_way_on_one_host(&doc);
    }
    // The table states the bound next to the figures.
    let (code, table, stderr) = latency(
        &agent.target(),
        &["-u", "-t", "1", "--warmup", "0.3", "--one-way"],
    );
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        table.contains("One-way delay") && table.contains("± "),
        "{table}"
    );
}

#[test]
fn one_way_needs_room_for_the_timestamps() {
    let _file = crate::common::file_lock(module_path!());
    let agent = agent();
    let (code, stdout, stderr) = latency(&agent.target(), &["-u", "-m", "16", "--one-way"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stdout.is_empty());
    assert!(
        stderr.contains("--one-way needs messages of at least 24 bytes"),
        "{stderr}"
    );
}

/// The rest of the inner view works against a sockperf server (`tests/peers/sockperf.rs`).
#[test]
fn a_sockperf_server_cannot_serve_one_way_delay() {
    let _file = crate::common::file_lock(module_path!());
    let flag = "--one-way";
    let (code, _, stderr) = latency("sockperf://127.0.0.1:1", &[flag]);
    assert_eq!(code, Some(2), "{flag}: {stderr}");
    assert!(
        stderr.contains(flag) && stderr.contains("sonde agent"),
        "{stderr}"
    );
}
