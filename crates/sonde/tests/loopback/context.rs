//! Every result carries its context: both ends' configuration (`sonde conf`, `hosts` in every
//! document), what the test cost each end in CPU (`cpu`), and the TCP senders' `TCP_INFO` per
//! stream and interval. Each test runs the binary against a `sonde server` child on loopback
//! and checks the figures against what the machine says itself (`uname -r`, `/sys`), and the
//! bounds the loops' batching sets.
//!
//! Only 127.0.0.1; every test sends at most about a second of traffic.

use crate::common;
use crate::common::json::{arr, f, u};

use std::process::Command as StdCommand;
use std::time::Duration;

use assert_cmd::Command;
use serde_json::Value;

use common::Agent;

/// No single run in this file may take longer.
const RUN_LIMIT: Duration = Duration::from_secs(30);

fn sonde() -> Command {
    let mut cmd = Command::cargo_bin("sonde").expect("the sonde binary is built for the tests");
    cmd.timeout(RUN_LIMIT)
        .env("SONDE_DB", common::test_db())
        .env("COLUMNS", "100")
        .env("TERM", "dumb");
    cmd
}

fn server() -> Agent {
    Agent::start_in(None, "127.0.0.1", &["-q"])
}

/// Runs `sonde ARGS...`, which must exit 0: its stdout.
fn run_ok(args: &[&str]) -> String {
    let out = sonde()
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("`sonde {}`: {e}", args.join(" ")));
    assert_eq!(
        out.status.code(),
        Some(0),
        "`sonde {}` failed\n--- stdout ---\n{}\n--- stderr ---\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `sonde ARGS... --json`, checked against the schema and the result model.
fn run_json(args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.push("--json");
    let stdout = run_ok(&all);
    let doc: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("`sonde {}`: not JSON ({e}):\n{stdout}", all.join(" ")));
    if let Err(errors) = sonde_report::validate(&doc) {
        panic!(
            "the document breaks the schema:\n{}\n{doc:#}",
            errors.join("\n")
        );
    }
    if let Err(e) = serde_json::from_value::<sonde_report::TestResult>(doc.clone()) {
        panic!("the document does not read back as a TestResult: {e}\n{doc:#}");
    }
    doc
}

fn at<'a>(doc: &'a Value, pointer: &str) -> &'a Value {
    doc.pointer(pointer)
        .unwrap_or_else(|| panic!("{pointer} is missing in\n{doc:#}"))
}

/// `uname -r`: the kernel both ends of a loopback test run.
fn uname_r() -> String {
    let out = StdCommand::new("uname")
        .arg("-r")
        .output()
        .expect("uname runs");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// The loopback interface's MTU as the kernel states it.
fn lo_mtu() -> u64 {
    std::fs::read_to_string("/sys/class/net/lo/mtu")
        .expect("/sys/class/net/lo/mtu")
        .trim()
        .parse()
        .expect("a number")
}

/// Both ends are this host, seen through `lo`: the kernel `uname -r` states, the loopback's
/// MTU, and this build's version.
fn check_hosts(doc: &Value) {
    let kernel = uname_r();
    for side in ["client", "server"] {
        let h = at(doc, &format!("/hosts/{side}"));
        assert_eq!(h["kernel_release"], kernel.as_str(), "{side}: {doc:#}");
        assert_eq!(h["sonde_version"], env!("CARGO_PKG_VERSION"), "{side}");
        let nics = h["interfaces"].as_array().expect("interfaces");
        assert_eq!(
            nics.len(),
            1,
            "{side}: only the interface toward the peer: {h:#}"
        );
        assert_eq!(nics[0]["name"], "lo", "{side}");
        assert_eq!(nics[0]["mtu_bytes"], lo_mtu(), "{side}");
        assert!(
            h["cpu_logical_count"].as_u64().is_some_and(|n| n > 0),
            "{side}"
        );
        assert!(h["memory_bytes"].as_u64().is_some_and(|n| n > 0), "{side}");
    }
}

/// Both ends measured the CPU the test cost them; the per-message syscalls of each end are
/// within `[lo, hi]` (`None`: not counted, `null`).
fn check_cpu(doc: &Value, client: Option<(f64, f64)>, server: Option<(f64, f64)>) {
    for (side, bounds) in [("client", client), ("server", server)] {
        let c = at(doc, &format!("/cpu/{side}"));
        assert_eq!(c["scope"], "test_threads", "{side}");
        let (user, system) = (u(c, "/user_ns"), u(c, "/system_ns"));
        assert!(user + system > 0, "{side} used no CPU: {c:#}");
        assert!(u(c, "/wall_ns") > 0, "{side}");
        let percent = f(c, "/percent_of_one_core");
        let expected = (user + system) as f64 * 100.0 / u(c, "/wall_ns") as f64;
        assert!((percent - expected).abs() < 1e-6, "{side}: {c:#}");
        assert!(u(c, "/messages") > 0, "{side}: {c:#}");
        // latte's columns: the test threads' switches per second are their count over the
        // wall time; the host's interrupts and switches come from /proc/stat, and over a test
        // that ran threads on this host both moved (the switches at least by the test's
        // own); Linux counts no system calls host-wide, so that one is null, not 0.
        let wall_s = u(c, "/wall_ns") as f64 / 1e9;
        let switches = u(c, "/voluntary_context_switches") + u(c, "/involuntary_context_switches");
        let per_second = f(c, "/context_switches_per_second");
        assert!(
            (per_second * wall_s - switches as f64).abs() < 1e-6 * switches.max(1) as f64,
            "{side}: {c:#}"
        );
        assert!(
            f(c, "/system_context_switches_per_second") * wall_s >= switches as f64 * (1.0 - 1e-9),
            "{side}: the host counted fewer switches than the test's threads: {c:#}"
        );
        assert!(f(c, "/system_interrupts_per_second") > 0.0, "{side}: {c:#}");
        assert!(c["system_syscalls_per_second"].is_null(), "{side}: {c:#}");
        match bounds {
            Some((lo, hi)) => {
                let per = f(c, "/syscalls_per_message");
                assert!(
                    (lo..=hi).contains(&per),
                    "{side}: {per} syscalls per message, not within {lo}..={hi}: {c:#}"
                );
                let calls = u(c, "/syscalls") as f64;
                let per_byte = f(c, "/syscalls_per_byte");
                assert!((per_byte * u(c, "/bytes") as f64 - calls).abs() < 1e-3 * calls);
                let per_second = f(c, "/syscalls_per_second");
                assert!(
                    (per_second * wall_s - calls).abs() < 1e-6 * calls,
                    "{side}: {c:#}"
                );
            }
            None => {
                assert!(c["syscalls"].is_null(), "{side}: {c:#}");
                assert!(c["syscalls_per_message"].is_null(), "{side}");
                assert!(c["syscalls_per_second"].is_null(), "{side}");
            }
        }
    }
}

/// A TCP sender's `TCP_INFO` as the kernel fills it for a connection that moved data.
fn check_tcp_info(t: &Value, what: &str) {
    assert!(
        t["srtt_ns"].as_u64().is_some_and(|v| v > 0),
        "{what}: {t:#}"
    );
    assert!(
        t["cwnd_segments"].as_u64().is_some_and(|v| v > 0),
        "{what}: {t:#}"
    );
    assert!(
        t["mss_bytes"].as_u64().is_some_and(|v| v > 0),
        "{what}: {t:#}"
    );
    assert!(t["retransmits"].as_u64().is_some(), "{what}: {t:#}");
}

/// Every stream has its sender's final `TCP_INFO`, and every interval but the last, partial
/// one (after the senders stopped) has every stream's.
fn check_tcp_info_per_stream_and_interval(doc: &Value, streams: u64) {
    for st in arr(doc, "/streams") {
        check_tcp_info(&st["tcp_info"], &format!("stream {}", st["stream"]));
    }
    let intervals = arr(doc, "/intervals");
    assert!(intervals.len() >= 3, "{doc:#}");
    for (n, iv) in intervals[..intervals.len() - 1].iter().enumerate() {
        let sampled: Vec<u64> = arr(iv, "/tcp_info")
            .iter()
            .map(|t| {
                check_tcp_info(t, &format!("interval {n}"));
                u(t, "/stream")
            })
            .collect();
        assert_eq!(
            sampled,
            (0..streams).collect::<Vec<_>>(),
            "interval {n}: {doc:#}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// sonde conf
// ---------------------------------------------------------------------------------------------

#[test]
fn conf_shows_both_ends_side_by_side() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server();
    let target = agent.target();
    let doc = run_json(&["conf", &target]);
    assert_eq!(doc["test"], "conf");
    assert_eq!(doc["server"], target.as_str());
    check_hosts(&doc);
    assert!(arr(&doc, "/warnings").is_empty(), "{doc:#}");

    let table = run_ok(&["conf", &target]);
    let kernel_row = table
        .lines()
        .find(|l| l.starts_with("kernel "))
        .unwrap_or_else(|| panic!("no kernel row:\n{table}"));
    assert_eq!(kernel_row.matches(&uname_r()).count(), 2, "{table}");
    assert!(
        table.contains("client (this host)") && table.contains("agent"),
        "{table}"
    );
    assert!(table.contains(&format!("{} B", lo_mtu())), "{table}");

    let csv = run_ok(&["conf", &target, "--csv"]);
    let header: Vec<&str> = csv.lines().next().expect("a header").split(',').collect();
    let col = |name: &str| header.iter().position(|c| *c == name).expect(name);
    let rows: Vec<Vec<&str>> = csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').collect())
        .collect();
    let kinds: Vec<(&str, &str)> = rows
        .iter()
        .map(|r| (r[col("row")], r[col("side")]))
        .collect();
    assert_eq!(
        kinds,
        [
            ("host", "client"),
            ("interface", "client"),
            ("host", "server"),
            ("interface", "server")
        ],
        "{csv}"
    );
    assert_eq!(rows[2][col("kernel_release")], uname_r());
    assert_eq!(rows[3][col("interface")], "lo");
}

#[test]
fn conf_without_a_host_is_this_host_alone() {
    let _file = crate::common::file_lock(module_path!());
    let doc = run_json(&["conf"]);
    assert!(
        doc["server"].is_null() && doc["hosts"]["server"].is_null(),
        "{doc:#}"
    );
    let me = at(&doc, "/hosts/client");
    assert_eq!(me["kernel_release"], uname_r().as_str());
    // Every interface that is up, loopback left out.
    for nic in me["interfaces"].as_array().expect("interfaces") {
        assert_ne!(nic["name"], "lo");
        assert_eq!(nic["up"], true);
    }
    let table = run_ok(&["conf"]);
    assert!(
        table.contains("this host") && !table.contains("agent"),
        "{table}"
    );
}

#[test]
fn conf_against_nothing_is_exit_3() {
    let _file = crate::common::file_lock(module_path!());
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a port")
        .port();
    let out = sonde()
        .args(["conf", &format!("127.0.0.1:{port}")])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&out.stdout).is_empty());
}

// ---------------------------------------------------------------------------------------------
// Every test's context
// ---------------------------------------------------------------------------------------------

#[test]
fn tcp_forward_has_hosts_cpu_and_the_clients_tcp_info_per_interval() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server();
    let doc = run_json(&[
        "throughput",
        &agent.target(),
        "-P",
        "2",
        "-t",
        "1",
        "-i",
        "0.25",
    ]);
    check_hosts(&doc);
    // The client writes one 128 KiB message per call; the agent reads up to 512 KiB (four
    // messages) per call, and less when it catches up with the sender.
    check_cpu(&doc, Some((0.9, 1.2)), Some((0.24, 8.0)));
    check_tcp_info_per_stream_and_interval(&doc, 2);
    assert!(arr(&doc, "/warnings").is_empty(), "{doc:#}");
}

#[test]
fn tcp_reverse_has_the_agents_tcp_info_per_interval() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server();
    let doc = run_json(&["throughput", &agent.target(), "-R", "-t", "1", "-i", "0.25"]);
    check_hosts(&doc);
    check_cpu(&doc, Some((0.24, 8.0)), Some((0.9, 1.2)));
    check_tcp_info_per_stream_and_interval(&doc, 1);
}

/// `--skip-rx-copy`: each end's receivers discard in the kernel with the same system calls per
/// message as a copying read (one call per read, several messages per read), and the result says
/// both ends did.
#[test]
#[cfg(target_os = "linux")]
fn skip_rx_copy_keeps_one_syscall_per_read_at_both_ends() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server();
    let target = agent.target();
    for reverse in [false, true] {
        let mut args = vec!["throughput", &target, "-t", "1", "--skip-rx-copy"];
        if reverse {
            args.push("-R");
        }
        let doc = run_json(&args);
        assert_eq!(doc["skip_rx_copy"], true, "{doc:#}");
        if reverse {
            check_cpu(&doc, Some((0.24, 8.0)), Some((0.9, 1.2)));
        } else {
            check_cpu(&doc, Some((0.9, 1.2)), Some((0.24, 8.0)));
        }
        assert!(arr(&doc, "/warnings").is_empty(), "{doc:#}");
    }
}

/// `-Z`: the sending end (this host, then the agent with `-R`) sends with `MSG_ZEROCOPY`, the
/// result accounts for its sends from the kernel's completions, and, since loopback copies every
/// one, says so in a typed warning instead of claiming zero copy.
#[test]
#[cfg(target_os = "linux")]
fn zerocopy_accounts_for_each_senders_sends_and_owns_up_to_loopbacks_copies() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server();
    let target = agent.target();
    for reverse in [false, true] {
        let mut args = vec!["throughput", &target, "-t", "0.5", "-Z"];
        if reverse {
            args.push("-R");
        }
        let doc = run_json(&args);
        let (sender, other) = if reverse {
            ("server", "client")
        } else {
            ("client", "server")
        };
        assert_eq!(doc["socket"]["asked"]["zerocopy"], true, "{doc:#}");
        assert_eq!(doc["socket"][sender]["zerocopy"], true, "{doc:#}");
        let z = &doc["zerocopy"][sender];
        let count = |k: &str| z[k].as_u64().unwrap_or_else(|| panic!("{k}: {doc:#}"));
        // One numbered send per write call of the stream's sender.
        assert_eq!(
            count("sends"),
            doc["sender"]["packets"].as_u64().unwrap(),
            "{doc:#}"
        );
        assert!(
            count("completed") > 0 && count("completed") <= count("sends"),
            "{doc:#}"
        );
        assert_eq!(count("copied"), count("completed"), "{doc:#}");
        assert!(doc["zerocopy"][other].is_null(), "{doc:#}");
        assert!(
            arr(&doc, "/warning_codes")
                .iter()
                .any(|c| c == "zerocopy_copied"),
            "{doc:#}"
        );
        assert_eq!(doc["receiver"]["bytes"], doc["sender"]["bytes"], "{doc:#}");
    }
}

/// `--ecn`: each direction's UDP receivers count the marks their datagrams arrive with;
/// loopback keeps the sender's ECT, so every data datagram is counted ECT as sent, with no
/// warning. pps counts at the agent.
#[test]
#[cfg(target_os = "linux")]
fn ecn_receivers_count_each_directions_marks() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server();
    let target = agent.target();
    let doc = run_json(&[
        "throughput",
        &target,
        "-u",
        "--bidir",
        "-b",
        "10M",
        "-t",
        "0.5",
        "--ecn",
        "ect1",
    ]);
    for dir in ["client_to_server", "server_to_client"] {
        let c = &doc["ecn"][dir];
        let received: u64 = arr(&doc, "/streams")
            .iter()
            .filter(|s| s["direction"] == dir)
            .map(|s| s["receiver"]["packets"].as_u64().unwrap())
            .sum();
        assert!(received > 0, "{doc:#}");
        assert_eq!(c["ect1"].as_u64(), Some(received), "{dir}: {doc:#}");
        assert_eq!(c["ce"], 0, "{doc:#}");
        assert_eq!(c["not_ect"], 0, "{doc:#}");
    }
    assert!(
        !arr(&doc, "/warning_codes")
            .iter()
            .any(|c| c == "ecn_congestion" || c == "ecn_bleached"),
        "{doc:#}"
    );
    let doc = run_json(&["pps", &target, "-t", "0.5", "--ecn", "ect0"]);
    assert_eq!(
        doc["ecn"]["client_to_server"]["ect0"].as_u64(),
        doc["received"].as_u64(),
        "{doc:#}"
    );
    // Without --ecn nothing is read or said.
    let doc = run_json(&["throughput", &target, "-u", "-b", "10M", "-t", "0.3"]);
    assert!(doc.get("ecn").is_none(), "{doc:#}");
}

#[test]
fn tcp_bidir_has_every_streams_tcp_info_from_whichever_end_sent_it() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server();
    let doc = run_json(&[
        "throughput",
        &agent.target(),
        "--bidir",
        "-t",
        "1",
        "-i",
        "0.25",
    ]);
    check_cpu(&doc, Some((0.24, 8.0)), Some((0.24, 8.0)));
    check_tcp_info_per_stream_and_interval(&doc, 2);
}

#[test]
fn udp_throughput_has_no_tcp_info_and_one_syscall_per_paced_datagram() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server();
    let doc = run_json(&[
        "throughput",
        &agent.target(),
        "-u",
        "-b",
        "20M",
        "-t",
        "0.5",
    ]);
    for st in arr(&doc, "/streams") {
        assert!(st["tcp_info"].is_null(), "{doc:#}");
    }
    // Paced: one send per datagram; the agent's recvmmsg takes what is queued (at least one).
    check_cpu(&doc, Some((1.0, 1.2)), Some((1.0 / 64.0, 2.0)));
}

#[test]
fn pps_batches_show_in_syscalls_per_datagram() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server();
    let doc = run_json(&["pps", &agent.target(), "-t", "0.5"]);
    check_hosts(&doc);
    // sendmmsg batches of up to 64 datagrams (GSO batches with --gso on); recvmmsg up to 64.
    check_cpu(&doc, Some((1.0 / 64.0, 2.0)), Some((1.0 / 64.0, 2.0)));
    let sender = f(&doc, "/cpu/client/syscalls_per_message");
    assert!(sender < 0.5, "the sender sends batches: {sender}");
}

#[test]
fn latency_counts_about_two_syscalls_per_message_on_both_ends() {
    let _file = crate::common::file_lock(module_path!());
    // Closed loop: the client writes a message and reads its reply, the echo reads it and writes
    // it back; a TCP read can come back short, and a UDP timeout costs a receive of its own.
    let agent = server();
    let target = agent.target();
    for proto in [&[][..], &["-u"][..]] {
        let mut args = vec!["latency", target.as_str(), "-t", "0.5", "--warmup", "0"];
        args.extend_from_slice(proto);
        let doc = run_json(&args);
        check_hosts(&doc);
        check_cpu(&doc, Some((1.5, 4.0)), Some((1.5, 4.0)));
    }
    // Open loop: the sends are made on a thread of their own, and count all the same.
    for proto in [&[][..], &["-u"][..]] {
        let mut args = vec![
            "latency",
            target.as_str(),
            "-t",
            "0.5",
            "--warmup",
            "0",
            "--rate",
            "2000",
        ];
        args.extend_from_slice(proto);
        let doc = run_json(&args);
        check_cpu(&doc, Some((1.5, 4.0)), Some((1.5, 4.0)));
    }
}

#[test]
fn the_table_names_both_kernels_and_states_the_cpu_and_tcp_info() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server();
    let table = run_ok(&["throughput", &agent.target(), "-t", "0.5", "-i", "0.25"]);
    let kernel = uname_r();
    for end in ["client  ", "agent   "] {
        let l = table
            .lines()
            .find(|l| l.starts_with(end))
            .unwrap_or_else(|| panic!("no `{end}` line:\n{table}"));
        assert!(l.contains(&kernel) && l.contains("lo (MTU"), "{l}");
    }
    assert!(table.contains("CPU, this test's threads"), "{table}");
    assert!(table.contains("syscalls per message"), "{table}");
    assert!(table.contains("host interrupts per second"), "{table}");
    let totals = table.split("\nTotals\n").nth(1).expect("a totals block");
    let head = totals.lines().next().expect("a header");
    assert!(head.contains("sRTT") && head.contains("Cwnd"), "{table}");

    let csv = run_ok(&[
        "throughput",
        &agent.target(),
        "-t",
        "0.5",
        "-i",
        "0.25",
        "--csv",
    ]);
    let header: Vec<&str> = csv.lines().next().expect("a header").split(',').collect();
    for col in [
        "tcp_srtt_ns",
        "tcp_cwnd_segments",
        "client_cpu_user_ns",
        "server_syscalls_per_message",
        "server_kernel_release",
    ] {
        assert!(header.contains(&col), "{col} missing: {header:?}");
    }
    assert!(
        csv.lines()
            .any(|l| l.starts_with("throughput,interval_stream,")),
        "{csv}"
    );
}
