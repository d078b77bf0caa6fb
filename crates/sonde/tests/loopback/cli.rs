//! The `sonde` binary as users run it: each subcommand against a `sonde server` child on
//! loopback, the JSON checked against the result schema and for the properties people rely on,
//! CSV and table output, exit codes, a closed stdout, SIGTERM, and `--help` snapshots.
//!
//! Only 127.0.0.1; every test sends at most about a second of traffic.

/// Shell completions and man pages.
mod completions;
/// Exit codes, a closed stdout, SIGTERM.
mod exit;
/// `--from` and `sonde server --helper`.
mod helpers;
/// `sonde latency -P --depth --response-size`.
mod many_flows;
/// `sonde plan`: check, run, failures, resume.
mod plan;
/// `--db postgres://...`: a shared database, and nothing lost when it is unreachable.
mod postgres;
/// The results store: saving, `--label`, `--repeat`, `sonde results`.
mod store;

use crate::common;
use crate::common::json::{arr, f, s, u};

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::Command as StdCommand;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use assert_cmd::Command;
use serde_json::Value;

use common::{parse_listening_line, Agent};

/// No single run in this file may take longer.
const RUN_LIMIT: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------------------------
// Running the binary
// ---------------------------------------------------------------------------------------------

fn sonde() -> Command {
    let mut cmd = Command::cargo_bin("sonde").expect("the sonde binary is built for the tests");
    cmd.timeout(RUN_LIMIT)
        .env("SONDE_DB", common::test_db())
        .env("COLUMNS", "100")
        .env("TERM", "dumb");
    cmd
}

/// `sonde server --bind 127.0.0.1 --port 0 -q EXTRA...`, killed when dropped.
fn server(extra: &[&str]) -> Agent {
    let mut args = vec!["-q"];
    args.extend_from_slice(extra);
    Agent::start_in(None, "127.0.0.1", &args)
}

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn run(args: &[&str]) -> Run {
    let out = sonde()
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("`sonde {}`: {e}", args.join(" ")));
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// A loopback port with nothing listening on it (bound by us, then released).
fn closed_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("local address").port()
}

/// Runs `sonde ARGS...`, which must exit 0; its stdout.
fn run_ok(args: &[&str]) -> String {
    let r = run(args);
    assert_eq!(
        r.code,
        Some(0),
        "`sonde {}` failed\n--- stdout ---\n{}\n--- stderr ---\n{}",
        args.join(" "),
        r.stdout,
        r.stderr
    );
    r.stdout
}

/// Runs `sonde SUBCOMMAND TARGET ARGS... --json`; the document, checked against the schema and
/// the result model.
fn run_json(subcommand: &str, agent: &Agent, args: &[&str]) -> Value {
    let target = agent.target();
    let mut all = vec![subcommand, target.as_str()];
    all.extend_from_slice(args);
    all.push("--json");
    let stdout = run_ok(&all);
    let doc: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "`sonde {}`: not one JSON document ({e}):\n{stdout}",
            all.join(" ")
        )
    });
    assert_valid(&doc);
    doc
}

// ---------------------------------------------------------------------------------------------
// The schema
// ---------------------------------------------------------------------------------------------

/// Checks `doc` against the result schema and that it reads back as a `TestResult`.
fn assert_valid(doc: &Value) {
    if let Err(errors) = sonde_report::validate(doc) {
        panic!(
            "the document breaks the schema:\n{}\n{doc:#}",
            errors.join("\n")
        );
    }
    if let Err(e) = serde_json::from_value::<sonde_report::TestResult>(doc.clone()) {
        panic!("the document does not read back as a TestResult: {e}\n{doc:#}");
    }
    assert_warnings_coded(doc);
}

/// Every run in `doc` (nested ones too) has a code for each warning.
fn assert_warnings_coded(doc: &Value) {
    match doc {
        Value::Object(m) => {
            if let Some(Value::Array(w)) = m.get("warnings") {
                if m.contains_key("session") {
                    let codes = m.get("warning_codes").and_then(Value::as_array);
                    assert_eq!(
                        codes.map(Vec::len),
                        Some(w.len()),
                        "a code per warning: {doc:#}"
                    );
                }
            }
            m.values().for_each(assert_warnings_coded);
        }
        Value::Array(a) => a.iter().for_each(assert_warnings_coded),
        _ => {}
    }
}

// ---------------------------------------------------------------------------------------------
// Reading documents
// ---------------------------------------------------------------------------------------------

// ---------------------------------------------------------------------------------------------
// Latency
// ---------------------------------------------------------------------------------------------

/// What every latency document must say, whatever the transport.
fn check_latency(doc: &Value, protocol: &str, warmup_ns: u64, measured_ns: u64) {
    assert_eq!(s(doc, "/test"), "latency", "{doc:#}");
    assert_eq!(s(doc, "/protocol"), protocol, "{doc:#}");
    assert!(u(doc, "/samples") > 0, "{doc:#}");
    assert_eq!(u(doc, "/warmup_ns"), warmup_ns, "{doc:#}");
    // Closed loop sends until warm-up + -t has passed; open loop's last message is scheduled one
    // period before that, and the run ends with its reply.
    let period_ns = doc["rate_per_second"]
        .as_f64()
        .map_or(0, |rate| (1e9 / rate).ceil() as u64);
    assert!(
        u(doc, "/duration_ns") >= warmup_ns + measured_ns - period_ns,
        "ran shorter than warm-up + -t: {doc:#}"
    );
    let (min, p50, max) = (
        u(doc, "/rtt_ns/min"),
        u(doc, "/rtt_ns/p50"),
        u(doc, "/rtt_ns/max"),
    );
    let p90 = u(doc, "/rtt_ns/p90");
    assert!(
        0 < min && min <= p50 && p50 <= p90 && p90 <= max,
        "RTT order: {doc:#}"
    );
    let mean = f(doc, "/rtt_ns/mean");
    assert!((min as f64) <= mean && mean <= max as f64, "{doc:#}");
    // Every message sent is either a sample, a warm-up sample, or lost.
    assert!(
        u(doc, "/samples") + u(doc, "/warmup_samples") + u(doc, "/lost") <= u(doc, "/sent"),
        "{doc:#}"
    );
}

#[test]
fn latency_tcp_json() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server(&[]);
    let doc = run_json("latency", &agent, &["-t", "0.5", "--warmup", "0.2"]);
    check_latency(&doc, "tcp", 200_000_000, 500_000_000);
    assert_eq!(s(&doc, "/mode"), "closed_loop");
    assert_eq!(u(&doc, "/msg_size_bytes"), 64);
    assert_eq!(u(&doc, "/lost"), 0, "TCP on loopback: {doc:#}");
    assert!(
        doc["lost_outbound"].is_null() && doc["lost_return"].is_null(),
        "{doc:#}"
    );
    // Closed loop over TCP: every message sent got its reply, before or after the warm-up.
    assert_eq!(
        u(&doc, "/samples") + u(&doc, "/warmup_samples"),
        u(&doc, "/sent"),
        "{doc:#}"
    );
    assert_eq!(u(&doc, "/overlapping_sessions"), 0, "{doc:#}");

    // The schema check is not a formality: it rejects broken documents.
    let breakages: [(&str, &str, Value); 4] = [
        ("negative samples", "/samples", serde_json::json!(-1)),
        (
            "an unknown protocol",
            "/protocol",
            serde_json::json!("sctp"),
        ),
        (
            "a string percentile",
            "/rtt_ns/p50",
            serde_json::json!("14000"),
        ),
        ("a null minimum RTT", "/rtt_ns/min", Value::Null),
    ];
    for (what, pointer, value) in breakages {
        let mut broken = doc.clone();
        *broken.pointer_mut(pointer).expect("the field exists") = value;
        assert!(
            sonde_report::validate(&broken).is_err(),
            "the schema check accepts {what}"
        );
    }
}

#[test]
fn latency_udp_json() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server(&[]);
    let doc = run_json(
        "latency",
        &agent,
        &["-u", "-m", "200", "-t", "0.5", "--warmup", "0.2"],
    );
    check_latency(&doc, "udp", 200_000_000, 500_000_000);
    assert_eq!(s(&doc, "/mode"), "closed_loop");
    assert_eq!(u(&doc, "/msg_size_bytes"), 200);
    let lost = u(&doc, "/lost");
    assert!(
        lost * 1000 <= u(&doc, "/sent"),
        "more than 0.1% lost on loopback: {doc:#}"
    );
    assert_eq!(
        u(&doc, "/lost_outbound") + u(&doc, "/lost_return"),
        lost,
        "{doc:#}"
    );
}

/// `--busy-poll --cpu N` against `sonde server --cpu-list M`: both ends spin and are pinned
/// where they were told, the result says so (`tuning`) with no warning about it, and both
/// ends' CPU cost is there. Linux: the only platform that pins.
#[cfg(target_os = "linux")]
#[test]
fn latency_busy_poll_pins_both_ends_and_says_so() {
    let _file = crate::common::file_lock(module_path!());
    let cpus = sonde_agent::tune::allowed_cpus().expect("the CPUs this test may run on");
    let (client_cpu, agent_cpu) = (cpus[0], *cpus.last().expect("at least one CPU"));
    let agent = server(&["--cpu-list", &agent_cpu.to_string()]);
    for proto in [&["-u"][..], &[][..]] {
        let mut args = proto.to_vec();
        let cpu = client_cpu.to_string();
        args.extend_from_slice(&["-t", "0.3", "--warmup", "0.1", "--busy-poll", "--cpu", &cpu]);
        let doc = run_json("latency", &agent, &args);
        assert!(u(&doc, "/samples") > 0, "{doc:#}");
        for (end, pinned) in [("client", client_cpu), ("server", agent_cpu)] {
            let t = &doc["tuning"][end];
            assert_eq!(t["busy_poll"], true, "{end}: {doc:#}");
            assert_eq!(t["cpus"], serde_json::json!([pinned]), "{end}: {doc:#}");
            assert!(
                doc["cpu"][end]["percent_of_one_core"].is_number(),
                "{doc:#}"
            );
        }
        assert!(
            !arr(&doc, "/warning_codes").iter().any(|c| c == "not_tuned"),
            "{doc:#}"
        );
    }
    // Asked for nothing: no `tuning`, the echo blocks as before.
    let doc = run_json("latency", &agent, &["-u", "-t", "0.2", "--warmup", "0.1"]);
    assert!(doc.get("tuning").is_none(), "{doc:#}");
}

/// `throughput --cpu LIST` and `pps --cpu LIST` against `sonde server --cpu-list M`: this host's
/// streams (flows) run on the list's CPUs in turn, the agent pins each of its own to M, and the
/// result says where each end ran (`tuning`), with no warning. Linux: the only platform that
/// pins.
#[cfg(target_os = "linux")]
#[test]
fn throughput_and_pps_cpu_pins_both_ends_and_says_so() {
    let _file = crate::common::file_lock(module_path!());
    let cpus = sonde_agent::tune::allowed_cpus().expect("the CPUs this test may run on");
    let agent_cpu = *cpus.last().expect("at least one CPU");
    let list = cpus
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let agent = server(&["--cpu-list", &agent_cpu.to_string()]);
    // Three streams over the list: stream i on cpus[i % len], each CPU once in the result.
    let mut used: Vec<u32> = (0..3).map(|i| cpus[i % cpus.len()]).collect();
    used.sort_unstable();
    used.dedup();
    for (test, args) in [
        ("throughput", vec!["-P", "3", "-t", "0.3", "--cpu", &list]),
        (
            "throughput",
            vec!["-P", "3", "-t", "0.3", "-R", "--cpu", &list],
        ),
        ("pps", vec!["--flows", "3", "-t", "0.3", "--cpu", &list]),
    ] {
        let doc = run_json(test, &agent, &args);
        let t = &doc["tuning"];
        assert_eq!(
            t["client"]["cpus"],
            serde_json::json!(used),
            "{test}: {doc:#}"
        );
        assert_eq!(
            t["server"]["cpus"],
            serde_json::json!([agent_cpu]),
            "{test}: {doc:#}"
        );
        assert_eq!(
            t["server"]["note"],
            serde_json::Value::Null,
            "{test}: {doc:#}"
        );
        assert!(
            !arr(&doc, "/warning_codes").iter().any(|c| c == "not_tuned"),
            "{test}: {doc:#}"
        );
        let moved = if test == "pps" {
            u(&doc, "/received")
        } else {
            u(&doc, "/receiver/bytes")
        };
        assert!(moved > 0, "{test}: {doc:#}");
    }
    // The table says it too.
    let target = agent.target();
    let table = run(&[
        "throughput",
        &target,
        "-t",
        "0.2",
        "--cpu",
        &cpus[0].to_string(),
        "--no-save",
    ]);
    assert_eq!(table.code, Some(0), "{}", table.stderr);
    assert!(
        table.stdout.contains(&format!(
            "streams pinned (--cpu): this host's on CPU {}, the agent's on CPU {agent_cpu}",
            cpus[0]
        )),
        "{}",
        table.stdout
    );
    // Not asked: no `tuning`.
    let doc = run_json("throughput", &agent, &["-t", "0.2"]);
    assert!(doc.get("tuning").is_none(), "{doc:#}");
}

/// `throughput --read-size N`: every TCP receiver, the agent's (forward) and this host's (-R),
/// reads at most N bytes per call, and the result and the table say so. With 1-byte writes
/// and 1-byte reads each read returns one byte, so the receiver's read count equals its bytes.
#[test]
fn throughput_read_size_sets_how_each_receiver_reads() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server(&[]);
    for direction in [None, Some("-R")] {
        let mut args = vec!["-l", "1", "--read-size", "1", "-t", "0.3"];
        args.extend(direction);
        let doc = run_json("throughput", &agent, &args);
        assert_eq!(u(&doc, "/read_size_bytes"), 1, "{direction:?}: {doc:#}");
        let (bytes, reads) = (u(&doc, "/receiver/bytes"), u(&doc, "/receiver/packets"));
        assert!(bytes > 0, "{direction:?}: {doc:#}");
        assert_eq!(reads, bytes, "{direction:?}: one read per byte\n{doc:#}");
        assert!(
            !arr(&doc, "/warning_codes").iter().any(|c| c == "not_tuned"),
            "{direction:?}: {doc:#}"
        );
    }
    // Large writes, 1,000-byte reads: never more than 1,000 bytes in one.
    let doc = run_json("throughput", &agent, &["--read-size", "1000", "-t", "0.3"]);
    let (bytes, reads) = (u(&doc, "/receiver/bytes"), u(&doc, "/receiver/packets"));
    assert!(
        reads >= bytes.div_ceil(1000),
        "{reads} reads for {bytes} bytes"
    );
    // Not asked: the default, stated; UDP: none.
    let doc = run_json("throughput", &agent, &["-t", "0.2"]);
    assert_eq!(u(&doc, "/read_size_bytes"), 512 * 1024, "{doc:#}");
    let doc = run_json("throughput", &agent, &["-u", "-t", "0.2"]);
    assert_eq!(doc["read_size_bytes"], Value::Null, "{doc:#}");
    // The table names a size that is not the default, and only then.
    let target = agent.target();
    let table = run(&[
        "throughput",
        &target,
        "-t",
        "0.2",
        "--read-size",
        "64K",
        "--no-save",
    ]);
    assert_eq!(table.code, Some(0), "{}", table.stderr);
    assert!(
        table.stdout.contains(", read 64 KiB per call"),
        "{}",
        table.stdout
    );
    let table = run(&["throughput", &target, "-t", "0.2", "--no-save"]);
    assert!(!table.stdout.contains("per call"), "{}", table.stdout);
    // What it cannot do is a usage error before anything is sent.
    let closed = format!("127.0.0.1:{}", closed_port());
    for args in [
        vec!["throughput", &closed, "-u", "--read-size", "1K"],
        vec!["throughput", &closed, "--read-size", "0"],
        vec!["throughput", &closed, "--read-size", "17M"],
        vec!["throughput", "iperf3://127.0.0.1:1", "--read-size", "1K"],
    ] {
        let r = run(&args);
        assert_eq!(r.code, Some(2), "{args:?}: {}", r.stderr);
        assert!(r.stderr.contains("--read-size"), "{args:?}: {}", r.stderr);
    }
}

/// `-w -C -M -N --dscp --fq-rate` (TCP) and `--dscp --ecn --dont-fragment` (UDP): set at both
/// ends, each end's kernel read back in the result, the pacing rate on the senders only.
#[test]
fn socket_options_are_applied_at_both_ends_and_read_back() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server(&[]);
    let tcp = [
        "-w",
        "256K",
        "-C",
        "reno",
        "-M",
        "1000",
        "-N",
        "--dscp",
        "ef",
        "--fq-rate",
        "500M",
        "-t",
        "0.3",
    ];
    for (direction, sender) in [(None, "client"), (Some("-R"), "server")] {
        let mut args = tcp.to_vec();
        args.extend(direction);
        let doc = run_json("throughput", &agent, &args);
        let what = format!("{direction:?}: {doc:#}");
        assert_eq!(u(&doc, "/socket/asked/window_bytes"), 256 << 10, "{what}");
        assert_eq!(u(&doc, "/socket/asked/tos"), 0xb8, "{what}");
        for end in ["client", "server"] {
            let at = |f: &str| format!("/socket/{end}/{f}");
            assert_eq!(s(&doc, &at("congestion")), "reno", "{end} {what}");
            // The client's SYN announced 1,000: both ends send at most that (less the
            // timestamp option's 12 bytes).
            let mss = u(&doc, &at("mss_bytes"));
            assert!((900..=1000).contains(&mss), "{end}: MSS {mss} {what}");
            assert_eq!(
                doc.pointer(&at("no_delay")),
                Some(&Value::Bool(true)),
                "{what}"
            );
            assert_eq!(u(&doc, &at("tos")), 0xb8, "{end} {what}");
            // Linux grants twice the request.
            assert!(
                u(&doc, &at("recv_buffer_bytes")) >= 256 << 10,
                "{end} {what}"
            );
            let paced = doc.pointer(&at("pacing_bits_per_second")).unwrap();
            if end == sender {
                assert_eq!(paced.as_u64(), Some(500_000_000), "{end} {what}");
            } else {
                assert!(paced.is_null(), "{end} {what}");
            }
        }
        assert!(
            !arr(&doc, "/warning_codes")
                .iter()
                .any(|c| c == "socket_option_differs"),
            "{what}"
        );
    }
    // UDP: the TOS byte with ECN ECT(1), and DF, at both ends.
    let doc = run_json(
        "throughput",
        &agent,
        &[
            "-u",
            "-b",
            "10M",
            "--dscp",
            "af41",
            "--ecn",
            "ect1",
            "--dont-fragment",
            "-t",
            "0.3",
            "--bidir",
        ],
    );
    for end in ["client", "server"] {
        assert_eq!(
            u(&doc, &format!("/socket/{end}/tos")),
            (34 << 2) | 1,
            "{doc:#}"
        );
        assert_eq!(
            doc.pointer(&format!("/socket/{end}/dont_fragment")),
            Some(&Value::Bool(true)),
            "{doc:#}"
        );
    }
    let doc = run_json("pps", &agent, &["--dscp", "cs1", "-t", "0.2"]);
    assert_eq!(u(&doc, "/socket/server/tos"), 0x20, "{doc:#}");
    let doc = run_json(
        "latency",
        &agent,
        &["-u", "-S", "0x20", "-t", "0.2", "--warmup", "0"],
    );
    assert_eq!(u(&doc, "/socket/client/tos"), 0x20, "{doc:#}");
    // TCP -b is the total of a direction, each stream paced at its share.
    let doc = run_json(
        "throughput",
        &agent,
        &["-b", "200M", "-P", "2", "-t", "0.2"],
    );
    assert_eq!(
        u(&doc, "/socket/asked/pacing_bits_per_second"),
        100_000_000,
        "{doc:#}"
    );
    // Nothing asked: no `socket`.
    let doc = run_json("throughput", &agent, &["-t", "0.2"]);
    assert!(doc.get("socket").is_none(), "{doc:#}");
    // The table shows each end's kernel's values.
    let target = agent.target();
    let table = run(&[
        "throughput",
        &target,
        "-t",
        "0.2",
        "-C",
        "reno",
        "--no-save",
    ]);
    assert_eq!(table.code, Some(0), "{}", table.stderr);
    assert!(
        table.stdout.contains("socket options, agent: reno"),
        "{}",
        table.stdout
    );
}

/// A socket option no kernel or no such test takes is a usage error (exit 2) that names it.
#[test]
fn socket_options_that_cannot_apply_are_usage_errors() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server(&[]);
    let target = agent.target();
    for (args, says) in [
        (
            vec!["throughput", &target, "-C", "nosuchcc"],
            "no congestion control 'nosuchcc' (available: ",
        ),
        (
            vec!["throughput", &target, "-u", "-C", "reno"],
            "-C/--congestion is for TCP",
        ),
        (vec!["throughput", &target, "-M", "10"], "-M/--set-mss"),
        (
            vec!["throughput", &target, "--dont-fragment"],
            "--dont-fragment is for UDP",
        ),
        (
            vec!["throughput", &target, "-b", "1M", "--fq-rate", "1M"],
            "give one",
        ),
        (vec!["throughput", &target, "--dscp", "af44"], "not a DSCP"),
        (vec!["throughput", &target, "--ecn", "ce"], "ect0 or ect1"),
        (vec!["pps", &target, "-N"], "-N"),
        (vec!["pps", &target, "-C", "reno"], "-C"),
        (vec!["latency", &target, "--fq-rate", "1M"], "--fq-rate"),
        (vec!["latency", &target, "-N"], "-N"),
        (
            vec!["throughput", &target, "-u", "-Z"],
            "-Z/--zerocopy is for TCP",
        ),
        (vec!["pps", &target, "-Z"], "-Z"),
        (vec!["latency", &target, "--zerocopy"], "--zerocopy"),
        (vec!["crr", &target, "-Z"], "-Z"),
        (
            vec!["throughput", &target, "-S", "1", "--dscp", "ef"],
            "cannot be used with",
        ),
    ] {
        let r = run(&args);
        assert_eq!(r.code, Some(2), "{args:?}: {}", r.stderr);
        assert!(r.stderr.contains(says), "{args:?}: {}", r.stderr);
    }
}

/// What --busy-poll and --cpu cannot do is a usage error (exit 2) before anything is sent.
#[test]
fn busy_poll_and_cpu_misuse_is_exit_2() {
    let _file = crate::common::file_lock(module_path!());
    let closed = format!("127.0.0.1:{}", closed_port());
    for args in [
        vec!["latency", &closed, "--busy-poll", "--rate", "1000"],
        vec!["latency", &closed, "--cpu", "4095"],
        vec!["latency", "sockperf://127.0.0.1:1", "--busy-poll"],
        vec!["throughput", &closed, "--cpu", "4095"],
        vec!["pps", &closed, "--cpu", "0-x"],
        vec!["throughput", "iperf3://127.0.0.1:1", "--cpu", "0"],
        vec!["pps", &closed, "--cpu", "0", "--from", "127.0.0.1:1"],
        vec![
            "server",
            "--bind",
            "127.0.0.1",
            "--port",
            "0",
            "--cpu-list",
            "4095",
        ],
        vec![
            "server",
            "--bind",
            "127.0.0.1",
            "--port",
            "0",
            "--cpu-list",
            "1-x",
        ],
    ] {
        let r = run(&args);
        assert_eq!(r.code, Some(2), "`sonde {}`: {}", args.join(" "), r.stderr);
        assert!(
            r.stderr.contains("busy-poll") || r.stderr.contains("cpu"),
            "`sonde {}` does not name the option: {}",
            args.join(" "),
            r.stderr
        );
    }
}

#[test]
fn latency_udp_open_loop_json() {
    let _file = crate::common::file_lock(module_path!());
    const RATE: u64 = 2000;
    let agent = server(&[]);
    let doc = run_json(
        "latency",
        &agent,
        &["-u", "--rate", "2000", "-t", "0.5", "--warmup", "0.2"],
    );
    check_latency(&doc, "udp", 200_000_000, 500_000_000);
    assert_eq!(s(&doc, "/mode"), "open_loop");
    assert_eq!(f(&doc, "/rate_per_second"), RATE as f64);
    assert!(doc["late_sends"].is_u64(), "{doc:#}");
    // The schedule: RATE per second over warm-up + -t, whatever the replies did.
    let sent = u(&doc, "/sent");
    let planned = RATE * 7 / 10;
    assert!(
        sent.abs_diff(planned) <= planned / 20,
        "sent {sent} at --rate {RATE} over 0.7 s (planned {planned}): {doc:#}"
    );
    let samples = u(&doc, "/samples");
    let measured = RATE / 2;
    assert!(
        samples.abs_diff(measured) <= measured / 10,
        "{samples} samples after the warm-up, {measured} planned: {doc:#}"
    );
}

// ---------------------------------------------------------------------------------------------
// Throughput
// ---------------------------------------------------------------------------------------------

/// Totals are the sums of the streams; TCP delivers every byte its sender wrote.
fn check_throughput(doc: &Value, protocol: &str, direction: &str, streams: usize) {
    assert_eq!(s(doc, "/test"), "throughput", "{doc:#}");
    assert_eq!(s(doc, "/protocol"), protocol, "{doc:#}");
    assert_eq!(s(doc, "/direction"), direction, "{doc:#}");
    let list = arr(doc, "/streams");
    assert_eq!(list.len(), streams, "{doc:#}");
    for (i, st) in list.iter().enumerate() {
        assert_eq!(u(st, "/stream"), i as u64, "{doc:#}");
        assert!(
            u(st, "/receiver/bytes") > 0,
            "stream {i} received nothing: {doc:#}"
        );
        assert!(
            u(st, "/receiver/bytes") <= u(st, "/sender/bytes"),
            "stream {i} received more than was sent: {doc:#}"
        );
        if protocol == "tcp" {
            // The receiver reads to the sender's end of stream: nothing written is missing.
            assert_eq!(
                u(st, "/receiver/bytes"),
                u(st, "/sender/bytes"),
                "stream {i}: TCP bytes went missing: {doc:#}"
            );
        }
    }
    for side in ["receiver", "sender"] {
        for field in ["bytes", "packets"] {
            let sum: u64 = list
                .iter()
                .map(|st| u(st, &format!("/{side}/{field}")))
                .sum();
            assert_eq!(
                u(doc, &format!("/{side}/{field}")),
                sum,
                "{side}.{field}: {doc:#}"
            );
        }
    }
    assert!(f(doc, "/receiver/bits_per_second") > 0.0, "{doc:#}");
    if protocol == "tcp" {
        assert!(
            doc["lost"].is_null() && doc["jitter_ns"].is_null(),
            "{doc:#}"
        );
    }
}

/// Intervals start at 0, follow each other without gaps, and add up, stream by stream, to what
/// the receivers counted: together they cover the whole run.
fn check_intervals(doc: &Value, interval_ns: u64) {
    // Against a sonde agent every interval is the receiver's count.
    assert_eq!(s(doc, "/intervals_counted_at"), "receiver", "{doc:#}");
    let intervals = arr(doc, "/intervals");
    assert!(intervals.len() >= 2, "with -i there are intervals: {doc:#}");
    let streams = arr(doc, "/streams");
    let mut expect_start = 0;
    let mut per_stream = vec![0u64; streams.len()];
    for (k, iv) in intervals.iter().enumerate() {
        let (start, end) = (u(iv, "/start_ns"), u(iv, "/end_ns"));
        assert_eq!(
            start,
            expect_start,
            "interval {k} does not start where {} ended: {doc:#}",
            k.saturating_sub(1)
        );
        assert!(end > start, "{doc:#}");
        if k + 1 < intervals.len() {
            assert_eq!(
                (end - start) % interval_ns,
                0,
                "interval {k} is cut off its boundaries: {doc:#}"
            );
        }
        expect_start = end;
        let stream_bytes = arr(iv, "/stream_bytes");
        assert_eq!(stream_bytes.len(), streams.len(), "{doc:#}");
        let sum: u64 = stream_bytes
            .iter()
            .map(|b| b.as_u64().expect("bytes"))
            .sum();
        assert_eq!(
            u(iv, "/bytes"),
            sum,
            "interval {k}: bytes vs stream_bytes: {doc:#}"
        );
        for (i, b) in stream_bytes.iter().enumerate() {
            per_stream[i] += b.as_u64().expect("bytes");
        }
    }
    let total: u64 = intervals.iter().map(|iv| u(iv, "/bytes")).sum();
    assert_eq!(
        total,
        u(doc, "/receiver/bytes"),
        "intervals do not add up to the receiver total: {doc:#}"
    );
    for (i, st) in streams.iter().enumerate() {
        assert_eq!(
            per_stream[i],
            u(st, "/receiver/bytes"),
            "stream {i}: intervals do not add up to its receiver count: {doc:#}"
        );
    }
}

#[test]
fn throughput_tcp_json() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server(&[]);
    let doc = run_json("throughput", &agent, &["-t", "0.5"]);
    check_throughput(&doc, "tcp", "forward", 1);
    assert_eq!(s(&doc, "/streams/0/direction"), "client_to_server");
    assert_eq!(u(&doc, "/duration_ns"), 500_000_000);
    assert_eq!(u(&doc, "/msg_size_bytes"), 128 * 1024);
    assert!(
        arr(&doc, "/intervals").is_empty(),
        "no -i, no intervals: {doc:#}"
    );
}

#[test]
fn throughput_tcp_parallel_reverse_json() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server(&[]);
    let doc = run_json("throughput", &agent, &["-P", "2", "-R", "-t", "0.5"]);
    check_throughput(&doc, "tcp", "reverse", 2);
    assert_eq!(u(&doc, "/parallel"), 2);
    for st in arr(&doc, "/streams") {
        assert_eq!(s(st, "/direction"), "server_to_client", "{doc:#}");
    }
}

#[test]
fn throughput_tcp_bidir_intervals_json() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server(&[]);
    let doc = run_json("throughput", &agent, &["--bidir", "-i", "0.2", "-t", "0.6"]);
    check_throughput(&doc, "tcp", "bidir", 2);
    let directions: Vec<&str> = arr(&doc, "/streams")
        .iter()
        .map(|st| s(st, "/direction"))
        .collect();
    assert_eq!(
        directions,
        ["client_to_server", "server_to_client"],
        "{doc:#}"
    );
    check_intervals(&doc, 200_000_000);
}

#[test]
fn throughput_tcp_forward_intervals_json() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server(&[]);
    let doc = run_json("throughput", &agent, &["-i", "0.2", "-t", "0.6"]);
    check_throughput(&doc, "tcp", "forward", 1);
    check_intervals(&doc, 200_000_000);
}

/// `sonde server --max-bitrate 50M`: a forward TCP test is read at most at the cap (1 % for
/// rounding; an upper bound, which a busy machine cannot break), and the intervals still follow
/// each other and add up while the agent's reads wait for the cap. What the client's socket
/// buffers still hold a second after its sender ends is left unread: the receiver counts less
/// than the sender wrote.
#[test]
fn max_bitrate_caps_forward_tcp_with_intervals() {
    let _file = crate::common::file_lock(module_path!());
    const CAP: f64 = 50e6;
    let agent = server(&["--max-bitrate", "50M"]);
    let doc = run_json("throughput", &agent, &["-i", "0.5", "-t", "1"]);
    assert_eq!(s(&doc, "/direction"), "forward", "{doc:#}");
    let (received, sent) = (u(&doc, "/receiver/bytes"), u(&doc, "/sender/bytes"));
    assert!(0 < received && received <= sent, "{doc:#}");
    check_intervals(&doc, 500_000_000);
    let read = f(&doc, "/receiver/bits_per_second");
    assert!(
        read <= 1.01 * CAP,
        "the agent read {:.1} Mbit/s with a 50 Mbit/s cap: {doc:#}",
        read / 1e6
    );
}

#[test]
fn throughput_udp_json() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server(&[]);
    let doc = run_json(
        "throughput",
        &agent,
        &["-u", "-b", "20M", "-l", "1200", "-i", "0.2", "-t", "0.6"],
    );
    check_throughput(&doc, "udp", "forward", 1);
    check_intervals(&doc, 200_000_000);
    assert_eq!(u(&doc, "/target_bits_per_second"), 20_000_000);
    assert_eq!(u(&doc, "/msg_size_bytes"), 1200);
    let (sent, received, lost) = (
        u(&doc, "/sender/packets"),
        u(&doc, "/receiver/packets"),
        u(&doc, "/lost"),
    );
    assert_eq!(
        received + lost,
        sent,
        "every datagram sent arrived or is counted lost: {doc:#}"
    );
    assert!(
        lost * 100 <= sent,
        "more than 1% lost at 20 Mbit/s on loopback: {doc:#}"
    );
    let duplicated = u(&doc, "/duplicated");
    assert_eq!(
        u(&doc, "/receiver/bytes"),
        (received + duplicated) * 1200,
        "{doc:#}"
    );
    assert_eq!(u(&doc, "/sender/bytes"), sent * 1200, "{doc:#}");
    // Paced at -b: 20 Mbit/s for 0.6 s is 1,250 datagrams of 1,200 bytes.
    assert!(
        sent.abs_diff(1250) <= 125,
        "{sent} datagrams sent at -b 20M for 0.6 s: {doc:#}"
    );
    assert!(doc["jitter_ns"].is_u64(), "{doc:#}");
    assert!(doc["retransmits"].is_null(), "{doc:#}");
}

// ---------------------------------------------------------------------------------------------
// Packet rate
// ---------------------------------------------------------------------------------------------

#[test]
fn pps_json() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server(&[]);
    let doc = run_json("pps", &agent, &["--flows", "2", "-t", "0.5"]);
    assert_eq!(s(&doc, "/test"), "pps");
    assert_eq!(u(&doc, "/msg_size_bytes"), 18);
    let (sent, received, lost) = (u(&doc, "/sent"), u(&doc, "/received"), u(&doc, "/lost"));
    assert!(received > 0, "{doc:#}");
    assert_eq!(received + lost, sent, "{doc:#}");
    let flows = arr(&doc, "/flows");
    assert_eq!(flows.len(), 2, "{doc:#}");
    for (i, fl) in flows.iter().enumerate() {
        assert_eq!(u(fl, "/flow"), i as u64);
        assert!(
            u(fl, "/received") > 0,
            "flow {i} got nothing through: {doc:#}"
        );
        assert_eq!(
            u(fl, "/received") + u(fl, "/lost"),
            u(fl, "/sent"),
            "flow {i}: {doc:#}"
        );
    }
    for field in ["sent", "received", "lost"] {
        let sum: u64 = flows.iter().map(|fl| u(fl, &format!("/{field}"))).sum();
        assert_eq!(u(&doc, &format!("/{field}")), sum, "{field}: {doc:#}");
    }
    let pct = f(&doc, "/loss_percent");
    assert!(
        (pct - lost as f64 * 100.0 / sent as f64).abs() < 1e-6,
        "{doc:#}"
    );
    assert!(
        f(&doc, "/received_pps") > 0.0 && !s(&doc, "/send_method").is_empty(),
        "{doc:#}"
    );
}

/// `-m 14` (sockperf's header size) fits the 14-byte pps header: every datagram is counted by
/// its own sequence number; 13 is refused with a usage error that names the minimum.
#[test]
fn pps_takes_14_byte_datagrams_and_refuses_13() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server(&[]);
    for gso in ["off", "on"] {
        let doc = run_json("pps", &agent, &["-m", "14", "-t", "0.3", "--gso", gso]);
        assert_eq!(u(&doc, "/msg_size_bytes"), 14, "{doc:#}");
        let (sent, received, lost) = (u(&doc, "/sent"), u(&doc, "/received"), u(&doc, "/lost"));
        assert!(received > 0, "{doc:#}");
        // A header the agent misread would leave datagrams uncounted or numbered wrongly.
        assert_eq!(received + lost, sent, "{doc:#}");
    }
    let out = sonde()
        .args(["pps", &agent.target(), "-m", "13", "-t", "0.3"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("at least 14"), "{stderr}");
}

/// `-i`: the receiver's intervals follow each other from 0 and hold every datagram the agent
/// counted, per flow and in all; each rate is its count over its span. The CSV has the same.
#[test]
fn pps_intervals_add_up_to_the_received_datagrams() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server(&[]);
    let doc = run_json("pps", &agent, &["--flows", "2", "-t", "0.6", "-i", "0.2"]);
    let intervals = arr(&doc, "/intervals");
    assert!(intervals.len() >= 3, "{doc:#}");
    let mut start = 0;
    for iv in intervals {
        assert_eq!(u(iv, "/start_ns"), start, "{doc:#}");
        let (received, span_ns) = (u(iv, "/received"), u(iv, "/end_ns") - start);
        assert!(span_ns > 0, "{doc:#}");
        let rate = received as f64 * 1e9 / span_ns as f64;
        assert!(
            (f(iv, "/received_pps") - rate).abs() <= 1e-6 * rate.max(1.0),
            "{doc:#}"
        );
        let per_flow: u64 = arr(iv, "/flow_received")
            .iter()
            .map(|v| v.as_u64().unwrap())
            .sum();
        assert_eq!(per_flow, received, "{doc:#}");
        start = u(iv, "/end_ns");
    }
    let total: u64 = intervals.iter().map(|iv| u(iv, "/received")).sum();
    assert_eq!(total, u(&doc, "/received"), "{doc:#}");
    for (i, fl) in arr(&doc, "/flows").iter().enumerate() {
        let sum: u64 = intervals
            .iter()
            .map(|iv| iv["flow_received"][i].as_u64().unwrap())
            .sum();
        assert_eq!(sum, u(fl, "/received"), "flow {i}: {doc:#}");
    }
    let csv = run_ok(&["pps", &agent.target(), "-t", "0.4", "-i", "0.2", "--csv"]);
    let rows: Vec<&str> = csv
        .lines()
        .filter(|l| l.starts_with("pps,interval,"))
        .collect();
    assert!(rows.len() >= 2, "{csv}");
}

/// Loopback is a virtual device: `--gso auto` sends one datagram per packet there and says why;
/// `--gso on` batches (where the kernel has UDP GSO) and says it was asked for.
#[test]
fn pps_gso_auto_is_off_on_loopback_and_on_when_asked() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server(&[]);
    let auto = run_json("pps", &agent, &["-t", "0.3"]);
    assert_eq!(s(&auto, "/gso/mode"), "auto", "{auto:#}");
    if cfg!(target_os = "linux") {
        assert_eq!(s(&auto, "/gso/reason"), "loopback", "{auto:#}");
        assert_eq!(s(&auto, "/gso/interface"), "lo", "{auto:#}");
    }
    assert_eq!(auto["gso"]["used"], false, "{auto:#}");
    assert_ne!(s(&auto, "/send_method"), "sendmsg+UDP_SEGMENT", "{auto:#}");
    let on = run_json("pps", &agent, &["-t", "0.3", "--gso", "on"]);
    assert_eq!(s(&on, "/gso/reason"), "requested", "{on:#}");
    let batched = s(&on, "/send_method") == "sendmsg+UDP_SEGMENT";
    assert_eq!(on["gso"]["used"], batched, "{on:#}");
    let off = run_json("pps", &agent, &["-t", "0.3", "--gso", "off"]);
    assert_eq!(off["gso"]["used"], false, "{off:#}");
    assert_ne!(s(&off, "/send_method"), "sendmsg+UDP_SEGMENT", "{off:#}");
}

// ---------------------------------------------------------------------------------------------
// Quick
// ---------------------------------------------------------------------------------------------

#[test]
fn quick_json() {
    let _file = crate::common::file_lock(module_path!());
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("results.db");
    let stdout = run_ok(&["quick", "--json", "-t", "1", "--db", store::path_str(&db)]);
    let doc: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}:\n{stdout}"));
    assert_valid(&doc);
    assert_eq!(s(&doc, "/test"), "quick");
    let results = arr(&doc, "/results");
    let tests: Vec<&str> = results.iter().map(|c| s(c, "/result/test")).collect();
    assert_eq!(
        tests,
        [
            "latency",
            "latency",
            "throughput",
            "throughput",
            "pps",
            "crr"
        ],
        "{doc:#}"
    );
    let cases: Vec<&str> = results.iter().map(|c| s(c, "/case")).collect();
    let mut unique = cases.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), 6, "case names: {cases:?}");
    for c in results {
        let r = &c["result"];
        match s(r, "/test") {
            "latency" => assert!(u(r, "/samples") > 0, "{c:#}"),
            "throughput" => assert!(u(r, "/receiver/bytes") > 0, "{c:#}"),
            "crr" => assert!(u(r, "/agent_transactions") > 0, "{c:#}"),
            _ => assert!(u(r, "/received") > 0, "{c:#}"),
        }
    }
    // The contract (README, docs/guide/quick.md): quick saves every case, as its own run, in one group.
    store::assert_saved_cases(&db, results);
}

// ---------------------------------------------------------------------------------------------
// Load (latency under load)
// ---------------------------------------------------------------------------------------------

#[test]
fn load_json_has_idle_and_loaded_probes_and_the_load() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server(&[]);
    for (probe, load_dir) in [("tcp", &[][..]), ("udp", &["-u", "-R"][..])] {
        let mut args = vec![
            "-t", "1", "--warmup", "0.2", "--ramp", "0.5", "-P", "2", "--rate", "500",
        ];
        args.extend_from_slice(load_dir);
        let doc = run_json("load", &agent, &args);
        assert_eq!(s(&doc, "/test"), "load");
        for phase in ["idle", "loaded"] {
            // A phase is a latency result without the `test` tag of a whole document.
            let mut p = doc[phase].clone();
            p["test"] = "latency".into();
            let p = &p;
            check_latency(p, probe, 200_000_000, 1_000_000_000);
            assert_eq!(s(p, "/mode"), "open_loop", "{p:#}");
            // Our own load and probes overlap by design; nobody else used this agent.
            assert_eq!(u(p, "/overlapping_sessions"), 0, "{p:#}");
            assert!(
                !p["warnings"].to_string().contains("other session"),
                "{p:#}"
            );
        }
        let load = &doc["load"];
        assert_eq!(s(load, "/protocol"), "tcp");
        assert_eq!(
            s(load, "/direction"),
            if load_dir.is_empty() {
                "forward"
            } else {
                "reverse"
            }
        );
        assert_eq!(u(load, "/overlapping_sessions"), 0, "{load:#}");
        assert!(u(load, "/receiver/bytes") > 0, "{load:#}");
        // The load ran through the loaded probes: ramp + warm-up + measured time, and more.
        assert!(u(load, "/duration_ns") >= 1_700_000_000, "{load:#}");
        assert_eq!(u(&doc, "/ramp_ns"), 500_000_000);
        // added = loaded - idle, exactly, wherever both are stated.
        for stat in ["min", "p50", "p90", "max"] {
            let added = doc["added_rtt_ns"][stat].as_i64().expect(stat);
            let (i, l) = (
                u(&doc["idle"], &format!("/rtt_ns/{stat}")),
                u(&doc["loaded"], &format!("/rtt_ns/{stat}")),
            );
            assert_eq!(added, l as i64 - i as i64, "{stat}: {doc:#}");
        }
        // Too few samples for p99.9 in either phase: no difference is made up.
        assert!(doc["added_rtt_ns"]["p999"].is_null(), "{doc:#}");
    }
}

#[test]
fn load_table_and_csv_show_both_phases() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server(&[]);
    let target = agent.target();
    let common = [
        "-t", "0.5", "--warmup", "0.1", "--ramp", "0.3", "-P", "1", "--rate", "200",
    ];
    let mut args = vec!["load", target.as_str()];
    args.extend_from_slice(&common);
    let table = run_ok(&args);
    for needle in [
        "idle",
        "loaded",
        "added",
        "load throughput",
        "RTT (round trip)",
    ] {
        assert!(table.contains(needle), "no {needle:?} in\n{table}");
    }
    args.push("--csv");
    let csv = run_ok(&args);
    let rows = csv_rows(&csv);
    let cases: Vec<&str> = rows.iter().map(|r| r["case"].as_str()).collect();
    assert_eq!(
        &cases[..3],
        ["idle", "loaded", "added (loaded - idle)"],
        "{csv}"
    );
    assert!(cases[3..].iter().all(|c| *c == "load"), "{csv}");
    let added: i64 = rows[2]["rtt_p50_ns"].parse().expect("added p50");
    let p50 = |i: usize| rows[i]["rtt_p50_ns"].parse::<i64>().expect("p50");
    assert_eq!(added, p50(1) - p50(0));
}

// ---------------------------------------------------------------------------------------------
// Sweeps
// ---------------------------------------------------------------------------------------------

/// The steps of a sweep document: (value, result), after checking the envelope.
fn sweep_steps<'a>(doc: &'a Value, test: &str, parameter: &str) -> Vec<(u64, &'a Value)> {
    assert_eq!(s(doc, "/test"), "sweep", "{doc:#}");
    assert_eq!(s(doc, "/sweep_test"), test, "{doc:#}");
    assert_eq!(s(doc, "/parameter"), parameter, "{doc:#}");
    arr(doc, "/steps")
        .iter()
        .map(|step| {
            assert_eq!(s(step, "/result/test"), test, "{step:#}");
            (u(step, "/value"), &step["result"])
        })
        .collect()
}

#[test]
fn sweeps_run_each_value_in_order_with_the_value_applied() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server(&[]);
    let doc = run_json(
        "pps",
        &agent,
        &["-t", "0.3", "--sweep", "msg_size=18,64,32"],
    );
    let steps = sweep_steps(&doc, "pps", "msg_size");
    assert_eq!(
        steps.iter().map(|(v, _)| *v).collect::<Vec<_>>(),
        [18, 64, 32]
    );
    for (value, r) in &steps {
        assert_eq!(u(r, "/msg_size_bytes"), *value, "{r:#}");
        assert!(u(r, "/received") > 0, "{r:#}");
    }

    let doc = run_json(
        "throughput",
        &agent,
        &["-t", "0.3", "--sweep", "parallel=1:4:*2"],
    );
    let steps = sweep_steps(&doc, "throughput", "parallel");
    assert_eq!(steps.iter().map(|(v, _)| *v).collect::<Vec<_>>(), [1, 2, 4]);
    for (value, r) in &steps {
        assert_eq!(u(r, "/parallel"), *value, "{r:#}");
        assert_eq!(arr(r, "/streams").len() as u64, *value, "{r:#}");
        assert!(u(r, "/receiver/bytes") > 0, "{r:#}");
    }

    let doc = run_json(
        "throughput",
        &agent,
        &[
            "-u",
            "-t",
            "0.3",
            "-l",
            "1200",
            "--sweep",
            "bitrate=2M:6M:+2M",
        ],
    );
    for (value, r) in sweep_steps(&doc, "throughput", "bitrate") {
        assert_eq!(u(r, "/target_bits_per_second"), value, "{r:#}");
    }
}

#[test]
fn sweep_table_and_csv_have_a_row_per_step() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server(&[]);
    let target = agent.target();
    let table = run_ok(&["pps", &target, "-t", "0.2", "--sweep", "parallel=1,2"]);
    assert!(
        table.contains("pps sweep of parallel (streams): 2 steps"),
        "{table}"
    );
    let data_rows: Vec<&str> = table
        .lines()
        .filter(|l| l.starts_with("1 ") || l.starts_with("2 "))
        .collect();
    assert_eq!(data_rows.len(), 2, "{table}");
    let csv = run_ok(&[
        "pps",
        &target,
        "-t",
        "0.2",
        "--sweep",
        "parallel=1,2",
        "--csv",
    ]);
    let rows = csv_rows(&csv);
    let summaries: Vec<&str> = rows
        .iter()
        .filter(|r| r["row"] == "summary")
        .map(|r| r["case"].as_str())
        .collect();
    assert_eq!(summaries, ["parallel=1", "parallel=2"], "{csv}");
}

#[test]
fn a_sweep_the_test_cannot_run_is_a_usage_error() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server(&[]);
    let target = agent.target();
    for args in [
        vec!["pps", &target, "--sweep", "rate=1K,2K"],
        vec!["throughput", &target, "--sweep", "bitrate=1M,2M"],
        vec!["pps", &target, "--sweep", "msg_size=1:2:3"],
        vec!["pps", &target, "--sweep", "color=1,2"],
    ] {
        let r = run(&args);
        assert_eq!(r.code, Some(2), "{args:?}: {}", r.stderr);
        assert!(r.stderr.contains("sweep"), "{args:?}: {}", r.stderr);
        assert!(r.stdout.is_empty(), "{args:?}: {}", r.stdout);
    }
}

// ---------------------------------------------------------------------------------------------
// CSV and table
// ---------------------------------------------------------------------------------------------

/// Splits one CSV line (RFC 4180 quoting).
fn csv_fields(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                chars.next();
                fields.last_mut().expect("a field").push('"');
            }
            ('"', _) => quoted = !quoted,
            (',', false) => fields.push(String::new()),
            (c, _) => fields.last_mut().expect("a field").push(c),
        }
    }
    assert!(!quoted, "unterminated quote in {line:?}");
    fields
}

/// The rows as maps from the header's names; every row has as many fields as the header.
fn csv_rows(text: &str) -> Vec<BTreeMap<String, String>> {
    let mut lines = text.lines();
    let header = csv_fields(lines.next().expect("a header line"));
    let rows: Vec<BTreeMap<String, String>> = lines
        .map(|line| {
            let fields = csv_fields(line);
            assert_eq!(
                fields.len(),
                header.len(),
                "row {line:?} vs header {header:?}"
            );
            header.iter().cloned().zip(fields).collect()
        })
        .collect();
    assert!(!rows.is_empty(), "no row under the header:\n{text}");
    rows
}

#[test]
fn latency_csv() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server(&[]);
    let out = run_ok(&[
        "latency",
        &agent.target(),
        "-t",
        "0.3",
        "--warmup",
        "0.1",
        "--csv",
    ]);
    let rows = csv_rows(&out);
    assert_eq!(rows.len(), 1, "{out}");
    assert_eq!(rows[0]["test"], "latency");
    let samples: u64 = rows[0]["samples"].parse().expect("samples is a number");
    assert!(samples > 0, "{out}");
}

#[test]
fn throughput_csv_has_a_row_per_interval() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server(&[]);
    let out = run_ok(&[
        "throughput",
        &agent.target(),
        "-t",
        "0.5",
        "-i",
        "0.2",
        "--csv",
    ]);
    let rows = csv_rows(&out);
    assert!(rows.len() >= 3, "a summary and intervals:\n{out}");
    assert!(rows.iter().all(|r| r["test"] == "throughput"), "{out}");
    let sum: u64 = rows
        .iter()
        .filter(|r| r["row"] == "interval")
        .map(|r| r["receiver_bytes"].parse::<u64>().expect("bytes"))
        .sum();
    let summary = rows
        .iter()
        .find(|r| r["row"] == "summary")
        .expect("a summary row");
    assert_eq!(sum.to_string(), summary["receiver_bytes"], "{out}");
}

#[test]
fn pps_csv() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server(&[]);
    let out = run_ok(&["pps", &agent.target(), "-t", "0.3", "--csv"]);
    let rows = csv_rows(&out);
    assert_eq!(rows[0]["test"], "pps", "{out}");
}

#[test]
fn latency_table_speaks_of_rtt() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server(&[]);
    let out = run_ok(&["latency", &agent.target(), "-t", "0.3", "--warmup", "0.1"]);
    assert!(out.contains("RTT"), "{out}");
    assert!(out.contains("p50"), "{out}");
}

// ---------------------------------------------------------------------------------------------
// --help
// ---------------------------------------------------------------------------------------------

#[test]
fn help_snapshots() {
    let _file = crate::common::file_lock(module_path!());
    for (name, args) in [
        ("help_sonde", vec!["--help"]),
        ("help_server", vec!["server", "--help"]),
        ("help_latency", vec!["latency", "--help"]),
        ("help_throughput", vec!["throughput", "--help"]),
        ("help_pps", vec!["pps", "--help"]),
        ("help_quick", vec!["quick", "--help"]),
        ("help_load", vec!["load", "--help"]),
        ("help_conf", vec!["conf", "--help"]),
        ("help_results", vec!["results", "--help"]),
        ("help_compare", vec!["compare", "--help"]),
        ("help_report", vec!["report", "--help"]),
        ("help_plan", vec!["plan", "--help"]),
        ("help_mesh_diagnose", vec!["mesh", "diagnose", "--help"]),
        ("help_mesh_publish", vec!["mesh", "publish", "--help"]),
    ] {
        let out = run_ok(&args);
        insta::assert_snapshot!(name, out);
    }
}

#[test]
fn every_help_lists_the_exit_codes() {
    let _file = crate::common::file_lock(module_path!());
    for sub in ["server", "latency", "throughput", "pps", "quick", "load"] {
        for flag in ["-h", "--help"] {
            let out = run_ok(&[sub, flag]);
            assert!(
                out.contains("Exit codes:") && out.contains("4  the server refused"),
                "`sonde {sub} {flag}` does not list the exit codes:\n{out}"
            );
        }
    }
}
