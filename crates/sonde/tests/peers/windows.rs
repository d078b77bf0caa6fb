//! sonde on Windows against sonde on Linux, both ways, on loopback: the cross-built `sonde.exe`
//! (`x86_64-pc-windows-gnu`) runs under wine through `.ci/wine-run`, as the agent for this
//! host's client and as the client of this host's agent. Both ends must speak the same control
//! and data protocol, and each states what its platform measures: the Windows end's CPU time is
//! there and its context switches are null, with a warning. Latency, throughput, pps and crr
//! run both ways.
//! The Windows agent's compatibility listeners answer the real clients too: Debian's `iperf3`
//! (TCP both ways, UDP) and `sockperf` (ping-pong, UDP and TCP).
//!
//! Needs `wine` and the .exe: `.ci/windows` builds it before CI runs the tests (or
//! `cargo build --target x86_64-pc-windows-gnu -p sonde`; `SONDE_WINDOWS_EXE` points elsewhere).
//! Without them the tests skip with the reason, unless `SONDE_TEST_REQUIRE_ALL=1`.

use crate::common;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use common::{parse_listening_line, run_json, run_with_timeout, Agent, Daemon, Need};

/// The first wine start in a fresh prefix takes a while (`wineboot`); later ones a second.
const WINE_START_TIMEOUT: Duration = Duration::from_secs(180);

/// A client run under wine: far longer than the tests ask for.
const WINE_CLIENT_TIMEOUT: Duration = Duration::from_secs(180);

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `SONDE_WINDOWS_EXE`, or where `cargo build --target x86_64-pc-windows-gnu -p sonde` puts it.
fn windows_exe() -> PathBuf {
    std::env::var_os("SONDE_WINDOWS_EXE").map_or_else(
        || repo_root().join("target/x86_64-pc-windows-gnu/debug/sonde.exe"),
        PathBuf::from,
    )
}

/// The .exe when wine and it are there; otherwise skips (or fails in CI) with the reason.
fn prerequisites(test: &str) -> Option<PathBuf> {
    if !common::require_or_skip(test, &[Need::Cmd("wine")]) {
        return None;
    }
    let exe = windows_exe();
    if !exe.is_file() {
        common::skip(
            test,
            &format!(
                "no Windows build at {} (`cargo build --target x86_64-pc-windows-gnu -p sonde`, \
                 or set SONDE_WINDOWS_EXE)",
                exe.display()
            ),
        );
        return None;
    }
    Some(exe)
}

fn wine(exe: &PathBuf) -> Command {
    let mut cmd = Command::new(repo_root().join(".ci/wine-run"));
    cmd.arg(exe);
    cmd
}

fn warnings(doc: &Value) -> Vec<&str> {
    doc["warnings"]
        .as_array()
        .map(|w| w.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// The Windows end's CPU figures: time measured, context switches null with a warning naming
/// that side; the Linux end's switches counted.
fn check_cpu(doc: &Value, windows_side: &str, linux_side: &str) {
    let win = &doc["cpu"][windows_side];
    assert!(win.is_object(), "cpu.{windows_side} missing in\n{doc:#}");
    assert!(win["wall_ns"].as_u64().is_some_and(|w| w > 0), "{doc:#}");
    assert!(win["voluntary_context_switches"].is_null(), "{doc:#}");
    assert!(win["involuntary_context_switches"].is_null(), "{doc:#}");
    assert!(
        warnings(doc)
            .iter()
            .any(|w| w.contains(&format!("cpu.{windows_side}.voluntary_context_switches"))),
        "no warning about the null switches in\n{doc:#}"
    );
    // The host-wide counters (latte's columns): counted where Windows has them, null under
    // wine, whose PDH has none of them; never a 0 standing for "not counted".
    for key in [
        "system_interrupts_per_second",
        "system_context_switches_per_second",
        "system_syscalls_per_second",
    ] {
        assert!(
            win[key].is_null() || win[key].as_f64().is_some_and(|v| v > 0.0),
            "cpu.{windows_side}.{key}: {doc:#}"
        );
    }
    let linux = &doc["cpu"][linux_side];
    assert!(
        linux["voluntary_context_switches"].as_u64().is_some(),
        "{doc:#}"
    );
}

#[test]
fn a_linux_client_measures_against_a_windows_agent() {
    let _file = crate::common::file_lock(module_path!());
    let test = "a_linux_client_measures_against_a_windows_agent";
    let Some(exe) = prerequisites(test) else {
        return;
    };
    let mut cmd = wine(&exe);
    cmd.args(["server", "--bind", "127.0.0.1", "--port", "0"]);
    let mut agent = Daemon::spawn(&mut cmd);
    let (addr, port) = agent.wait_for_line(WINE_START_TIMEOUT, parse_listening_line);
    let target = format!("{addr}:{port}");

    // pps: the Windows agent counts the datagrams this host sends, per flow.
    let doc = run_json(&["pps", &target, "--flows", "2", "-t", "1"]);
    check_pps(&doc, 2);
    // This end (Linux) sends over loopback: auto keeps GSO off and says why.
    assert_eq!(doc["gso"]["reason"], "loopback", "{doc:#}");

    // crr: each transaction a new connection to the Windows agent, counted at both ends.
    let doc = run_json(&["crr", &target, "-t", "1"]);
    check_crr(&doc);

    // TCP latency: the Windows agent echoes.
    let doc = run_json(&["latency", &target, "-t", "1"]);
    assert!(doc["samples"].as_u64().is_some_and(|n| n > 0), "{doc:#}");
    assert_eq!(doc["lost"], 0, "{doc:#}");
    check_cpu(&doc, "server", "client");

    // UDP, the Windows agent sends (-R) and this host counts at the receiver; the agent's
    // sent count closes the loss account, so both ends' counts crossed the control channel.
    let doc = run_json(&["throughput", &target, "-u", "-b", "20M", "-R", "-t", "1"]);
    let rx = &doc["receiver"];
    assert!(rx["bytes"].as_u64().is_some_and(|b| b > 0), "{doc:#}");
    let streams = doc["streams"].as_array().expect("streams");
    let sent = streams[0]["sender"]["packets"].as_u64().unwrap_or(0);
    assert!(sent > 0, "the agent's sent count is missing: {doc:#}");

    // TCP forward: the Windows agent receives and reports what it counted.
    let doc = run_json(&["throughput", &target, "-t", "1"]);
    assert!(
        doc["receiver"]["bytes"].as_u64().is_some_and(|b| b > 0),
        "{doc:#}"
    );
    assert!(agent.is_running(), "the agent died:\n{}", agent.stderr());
}

#[test]
fn a_windows_client_measures_against_a_linux_agent() {
    let _file = crate::common::file_lock(module_path!());
    let test = "a_windows_client_measures_against_a_linux_agent";
    let Some(exe) = prerequisites(test) else {
        return;
    };
    let agent = Agent::start("127.0.0.1");
    let target = agent.target();
    let run = |args: &[&str]| -> Value {
        let mut cmd = wine(&exe);
        // Not saved: the results would pile up in the wine prefix's profile.
        cmd.args(args).args(["--json", "--no-save"]);
        let out = run_with_timeout(&mut cmd, WINE_CLIENT_TIMEOUT).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            out.status.success(),
            "sonde.exe {args:?} failed ({})\n--- stdout ---\n{}\n--- stderr ---\n{}\n--- agent ---\n{}",
            out.status,
            out.stdout,
            out.stderr,
            agent.stderr()
        );
        serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}:\n{}", out.stdout))
    };

    let doc = run(&["latency", &target, "-u", "-t", "1"]);
    assert!(doc["samples"].as_u64().is_some_and(|n| n > 0), "{doc:#}");
    check_cpu(&doc, "client", "server");

    // The Linux agent receives UDP from the Windows client and counts it.
    let doc = run(&["throughput", &target, "-u", "-b", "20M", "-t", "1"]);
    assert!(
        doc["receiver"]["bytes"].as_u64().is_some_and(|b| b > 0),
        "{doc:#}"
    );

    // TCP from the Windows client: no TCP_INFO there, so no retransmit count; null and said.
    let doc = run(&["throughput", &target, "-t", "1"]);
    assert!(
        doc["receiver"]["bytes"].as_u64().is_some_and(|b| b > 0),
        "{doc:#}"
    );
    assert!(doc["retransmits"].is_null(), "{doc:#}");
    assert!(
        warnings(&doc).iter().any(|w| w.contains("no TCP_INFO")),
        "no warning about the missing TCP_INFO in\n{doc:#}"
    );

    // pps from the Windows client, auto: the target is loopback, no offload, said so.
    let doc = run(&["pps", &target, "--flows", "2", "-t", "1"]);
    check_pps(&doc, 2);
    assert_eq!(doc["gso"]["reason"], "loopback", "{doc:#}");
    assert_eq!(doc["gso"]["used"], false, "{doc:#}");
    // --gso on: Windows tries USO (UDP_SEND_MSG_SIZE); wine refuses it and the sender falls
    // back to one datagram per send. Either way the result says which ran, and why.
    let doc = run(&["pps", &target, "-t", "1", "--gso", "on"]);
    check_pps(&doc, 1);
    let gso = &doc["gso"];
    assert_eq!(gso["mode"], "on", "{doc:#}");
    assert_eq!(gso["reason"], "requested", "{doc:#}");
    let method = doc["send_method"].as_str().unwrap_or_default();
    assert!(
        ["send+UDP_SEND_MSG_SIZE", "send"].contains(&method),
        "{doc:#}"
    );
    assert_eq!(
        gso["used"].as_bool(),
        Some(method == "send+UDP_SEND_MSG_SIZE"),
        "{doc:#}"
    );
    if method == "send" {
        assert!(
            gso["explanation"]
                .as_str()
                .is_some_and(|e| e.contains("refused UDP_SEND_MSG_SIZE")),
            "{doc:#}"
        );
    }

    // crr from the Windows client against the Linux agent.
    let doc = run(&["crr", &target, "-t", "1"]);
    check_crr(&doc);
}

/// What a pps run must say whichever end runs Windows: the receiving agent counted datagrams,
/// and the account closes (received + lost = sent, per flow and in all).
fn check_pps(doc: &Value, flows: usize) {
    let n = |v: &Value, key: &str| {
        v[key]
            .as_u64()
            .unwrap_or_else(|| panic!("{key} missing: {doc:#}"))
    };
    assert_eq!(doc["test"], "pps", "{doc:#}");
    let (sent, received, lost) = (n(doc, "sent"), n(doc, "received"), n(doc, "lost"));
    assert!(received > 0, "the agent counted nothing: {doc:#}");
    assert_eq!(received + lost, sent, "{doc:#}");
    let per_flow = doc["flows"].as_array().expect("flows");
    assert_eq!(per_flow.len(), flows, "{doc:#}");
    for (i, fl) in per_flow.iter().enumerate() {
        assert!(
            n(fl, "received") > 0,
            "flow {i} got nothing through: {doc:#}"
        );
        assert_eq!(
            n(fl, "received") + n(fl, "lost"),
            n(fl, "sent"),
            "flow {i}: {doc:#}"
        );
    }
    let sum: u64 = per_flow.iter().map(|fl| n(fl, "received")).sum();
    assert_eq!(sum, received, "{doc:#}");
}

/// What a crr run must say whichever end runs Windows: transactions completed, the agent's count
/// the client's, no connection failed.
fn check_crr(doc: &Value) {
    assert_eq!(doc["test"], "crr", "{doc:#}");
    let transactions = doc["transactions"].as_u64().unwrap_or(0);
    assert!(transactions > 0, "{doc:#}");
    assert_eq!(
        doc["agent_transactions"].as_u64(),
        Some(transactions),
        "{doc:#}"
    );
    assert_eq!(doc["connects"].as_u64(), Some(transactions), "{doc:#}");
    assert_eq!(doc["agent_failed"].as_u64(), Some(0), "{doc:#}");
    let errors = doc["errors"].as_object().expect("errors");
    assert!(errors.values().all(|v| v.as_u64() == Some(0)), "{doc:#}");
}

/// Runs a real peer client (iperf3, sockperf) against the Windows agent; its output when it
/// exits 0, else panics with it and the agent's log.
fn peer_client(agent: &Daemon, program: &str, args: &[&str]) -> common::Output {
    let mut cmd = Command::new(common::tool(program));
    cmd.args(args);
    let line = common::command_line(&cmd);
    let out = run_with_timeout(&mut cmd, WINE_CLIENT_TIMEOUT).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        out.status.success(),
        "`{line}` failed ({})\n--- stdout ---\n{}\n--- stderr ---\n{}\n--- agent ---\n{}",
        out.status,
        out.stdout,
        out.stderr,
        agent.stderr()
    );
    out
}

/// The number right after `key` in sockperf's output (`SentMessages=28045`, `Total 15102`).
fn number_after(text: &str, key: &str) -> u64 {
    text.match_indices(key)
        .find_map(|(at, _)| {
            let digits: String = text[at + key.len()..]
                .trim_start()
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            digits.parse().ok()
        })
        .unwrap_or_else(|| panic!("no `{key}` number in:\n{text}"))
}

/// The port of a `<what> clients served on ADDR:PORT (tcp+udp)` line.
fn served_port(what: &'static str) -> impl FnMut(&str) -> Option<u16> {
    move |line: &str| {
        let rest = line.trim().strip_prefix(what)?;
        let endpoint = rest.strip_prefix(" clients served on ")?;
        endpoint
            .split_whitespace()
            .next()?
            .rsplit_once(':')?
            .1
            .parse()
            .ok()
    }
}

#[test]
fn real_iperf3_and_sockperf_clients_measure_against_a_windows_agent() {
    let _file = crate::common::file_lock(module_path!());
    let test = "real_iperf3_and_sockperf_clients_measure_against_a_windows_agent";
    let Some(exe) = prerequisites(test) else {
        return;
    };
    if !common::require_or_skip(test, &[Need::Cmd("iperf3"), Need::Cmd("sockperf")]) {
        return;
    }
    let mut cmd = wine(&exe);
    cmd.args(["server", "--bind", "127.0.0.1", "--port", "0"])
        .args(["--iperf3", "0", "--sockperf", "0"]);
    let mut agent = Daemon::spawn(&mut cmd);
    agent.wait_for_line(WINE_START_TIMEOUT, parse_listening_line);
    let iperf3 = agent
        .wait_for_line(WINE_START_TIMEOUT, served_port("iperf3"))
        .to_string();
    let sockperf = agent
        .wait_for_line(WINE_START_TIMEOUT, served_port("sockperf"))
        .to_string();

    let iperf3_json = |args: &[&str]| -> Value {
        let mut all = vec!["-c", "127.0.0.1", "-p", &iperf3, "-t", "1", "-J"];
        all.extend_from_slice(args);
        let out = peer_client(&agent, "iperf3", &all);
        let doc: Value = serde_json::from_str(&out.stdout)
            .unwrap_or_else(|e| panic!("iperf3 {args:?}: {e}\n{}\n{}", out.stdout, out.stderr));
        assert!(doc.get("error").is_none(), "iperf3 {args:?}: {doc:#}");
        doc
    };
    // TCP, iperf3 sends: the bytes the Windows agent counted come back in iperf3's results
    // exchange (sum_received is the server's figure), at most what iperf3 sent.
    let doc = iperf3_json(&[]);
    let received = doc["end"]["sum_received"]["bytes"].as_u64().unwrap_or(0);
    let sent = doc["end"]["sum_sent"]["bytes"].as_u64().unwrap_or(0);
    assert!(received > 0 && received <= sent, "{doc:#}");
    // TCP, the Windows agent sends (-R).
    let doc = iperf3_json(&["-R"]);
    assert!(
        doc["end"]["sum_received"]["bytes"]
            .as_u64()
            .is_some_and(|b| b > 0),
        "{doc:#}"
    );
    // UDP at 10 Mbit/s: the agent counts the datagrams and reports their loss to iperf3.
    let doc = iperf3_json(&["-u", "-b", "10M"]);
    let sum = &doc["end"]["sum"];
    let packets = sum["packets"].as_u64().unwrap_or(0);
    let lost = sum["lost_packets"].as_u64().unwrap_or(u64::MAX);
    assert!(packets > 0 && lost <= packets, "{doc:#}");

    // sockperf ping-pong, UDP and TCP: the Windows agent echoes in sockperf's framing.
    for tcp in [false, true] {
        let mut args = vec!["ping-pong", "-i", "127.0.0.1", "-p", &sockperf, "-t", "1"];
        if tcp {
            args.push("--tcp");
        }
        let out = peer_client(&agent, "sockperf", &args);
        let out = format!("{}\n{}", out.stdout, out.stderr);
        assert!(number_after(&out, "SentMessages=") > 0, "{out}");
        assert!(number_after(&out, "Total ") > 0, "no observation:\n{out}");
        if tcp {
            assert_eq!(number_after(&out, "# dropped messages ="), 0, "{out}");
        }
    }
    assert!(agent.is_running(), "the agent died:\n{}", agent.stderr());
}
