//! sockperf compatibility in both directions, against the real `sockperf` 3.7 binary:
//!
//! 1. `sockperf ping-pong` (UDP and `--tcp`, several message sizes) against
//!    `sonde server --sockperf`: the agent counts exactly the messages sockperf sent.
//! 2. `sockperf under-load` and `sockperf throughput` against the agent: only PONG requests are
//!    answered, every message is counted.
//! 3. `sonde latency sockperf://...` against a real `sockperf server`: a valid document, and the
//!    server counted exactly the messages sonde says it sent.
//! 4. Bad input to the agent's sockperf listener (in-process agent, its counters read directly).
//! 5. `sonde latency sockperf://...` where nothing answers: one line, exit code 3.
//! 6. The inner view against a real `sockperf server`: `--full-log` (a line per message sent,
//!    agreeing with the result), `--timestamps` (the sockets never see more than the
//!    application), and `--one-way` still refused (exit code 2).
//!
//! Tests that need sockperf skip through `require_or_skip` when it is missing. Only 127.0.0.1;
//! every sockperf run is `-t 1` (plus its 2 s start-up sleep).

use crate::common;
use crate::common::json::u;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;
use sonde_agent::{Agent as InProcessAgent, AgentConfig, AgentHandle};
use sonde_client::LatencyOptions;
use sonde_wire::sockperf::{self as wire, Flags, Header};
use sonde_wire::Protocol;

use common::fulllog::{read_log, LogLine, TempFile};
use common::{require_or_skip, run_with_timeout, Daemon, Need};

/// How long one sockperf client run may take: `-t 1` plus its 2 s sleep, with room for a busy
/// host.
const SOCKPERF_RUN_LIMIT: Duration = Duration::from_secs(30);
/// How long a server may take to say it is ready, or to print its totals when stopped.
const READY: Duration = Duration::from_secs(10);

fn have_sockperf(test: &str) -> bool {
    require_or_skip(test, &[Need::Cmd("sockperf")])
}

/// A port free for both TCP and UDP on 127.0.0.1 right now (bound, read, released).
fn free_port() -> u16 {
    for _ in 0..50 {
        let tcp = TcpListener::bind("127.0.0.1:0").expect("bind a TCP port");
        let port = tcp.local_addr().expect("local address").port();
        if UdpSocket::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no port free for both TCP and UDP on 127.0.0.1");
}

/// sockperf prints some lines inside ANSI colour codes.
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // ESC [ ... letter
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The number right after the first `key` in `text` that has one (e.g. `SentMessages=` →
/// 28045; `Total ` skips `[Total Run]` for `Total 15102 observations`).
fn number_after(text: &str, key: &str) -> Option<u64> {
    text.match_indices(key).find_map(|(at, _)| {
        let digits: String = text[at + key.len()..]
            .trim_start()
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().ok()
    })
}

fn must_number_after(text: &str, key: &str) -> u64 {
    number_after(text, key).unwrap_or_else(|| panic!("no `{key}` number in:\n{text}"))
}

/// Runs a sockperf client; panics unless it exits 0. Its output, ANSI codes removed.
fn sockperf_client(args: &[&str]) -> String {
    let mut cmd = Command::new(common::tool("sockperf"));
    cmd.args(args);
    let line = common::command_line(&cmd);
    let out = run_with_timeout(&mut cmd, SOCKPERF_RUN_LIMIT).unwrap_or_else(|e| panic!("{e}"));
    let text = strip_ansi(&format!("{}\n{}", out.stdout, out.stderr));
    assert!(
        out.status.success(),
        "`{line}` failed ({}):\n{text}",
        out.status
    );
    text
}

// ---------------------------------------------------------------------------------------------
// A `sonde server --sockperf=0` child
// ---------------------------------------------------------------------------------------------

/// What the agent logged for one sockperf TCP connection or UDP peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Handled {
    tcp: bool,
    messages: u64,
    replies: u64,
}

/// `sonde server --bind 127.0.0.1 --port 0 --sockperf=0`, logging; killed when dropped.
struct SondeServer {
    daemon: Daemon,
    sockperf_port: u16,
}

impl SondeServer {
    fn start(extra: &[&str]) -> SondeServer {
        let mut cmd = common::sonde_command();
        cmd.args([
            "server",
            "--bind",
            "127.0.0.1",
            "--port",
            "0",
            "--sockperf=0",
        ])
        .args(extra);
        let mut daemon = Daemon::spawn(&mut cmd);
        let sockperf_port = daemon.wait_for_line(READY, |line| {
            let rest = line.strip_prefix("sockperf clients served on ")?;
            let endpoint = rest.split_whitespace().next()?;
            endpoint.rsplit_once(':')?.1.parse::<u16>().ok()
        });
        SondeServer {
            daemon,
            sockperf_port,
        }
    }

    fn port(&self) -> String {
        self.sockperf_port.to_string()
    }

    /// Stops the agent with SIGTERM and returns what it logged per sockperf connection or peer
    /// (a UDP peer's line is written when it goes quiet or when the agent stops).
    fn stop(self) -> Vec<Handled> {
        let pid = self.daemon.pid().to_string();
        assert!(
            common::quiet(Command::new("kill").args(["-TERM", &pid])),
            "cannot signal the agent"
        );
        let deadline = Instant::now() + READY;
        while !self.daemon.stderr().contains("sonde agent: stopped") {
            assert!(
                Instant::now() < deadline,
                "the agent did not stop within {READY:?}:\n{}",
                self.daemon.stderr()
            );
            thread::sleep(Duration::from_millis(20));
        }
        let log = self.daemon.stderr();
        log.lines()
            .filter_map(|line| {
                let rest = line.strip_prefix("sonde agent: sockperf ")?;
                let tcp = rest.starts_with("tcp ");
                let messages = number_after(rest, ": ")?;
                rest.contains("messages received and handled")
                    .then_some(())?;
                let replies = number_after(rest, "handled, ")?;
                Some(Handled {
                    tcp,
                    messages,
                    replies,
                })
            })
            .collect()
    }
}

/// The sum over every connection or peer of one transport.
fn total(handled: &[Handled], tcp: bool) -> Handled {
    handled.iter().filter(|h| h.tcp == tcp).fold(
        Handled {
            tcp,
            messages: 0,
            replies: 0,
        },
        |a, h| Handled {
            tcp,
            messages: a.messages + h.messages,
            replies: a.replies + h.replies,
        },
    )
}

fn tcp_flag(tcp: bool) -> &'static [&'static str] {
    if tcp {
        &["--tcp"]
    } else {
        &[]
    }
}

// ---------------------------------------------------------------------------------------------
// 1. sockperf ping-pong against the agent
// ---------------------------------------------------------------------------------------------

fn ping_pong_against_the_agent(test: &str, tcp: bool, sizes: &[u32]) {
    if !have_sockperf(test) {
        return;
    }
    for &size in sizes {
        let agent = SondeServer::start(&[]);
        let port = agent.port();
        let msg = size.to_string();
        let mut args = vec![
            "ping-pong",
            "-i",
            "127.0.0.1",
            "-p",
            &port,
            "-t",
            "1",
            "-m",
            &msg,
        ];
        args.extend_from_slice(tcp_flag(tcp));
        let out = sockperf_client(&args);
        let handled = agent.stop();
        let sent = must_number_after(&out, "SentMessages=");
        let observations = must_number_after(&out, "Total ");
        assert!(sent > 0 && observations > 0, "size {size}:\n{out}");
        assert!(out.contains("percentile 50.000"), "size {size}:\n{out}");
        if tcp {
            assert_eq!(
                must_number_after(&out, "# dropped messages ="),
                0,
                "size {size}:\n{out}"
            );
        }
        // Every message sockperf sent reached the agent, was counted and answered (loopback,
        // one message in flight: nothing is lost).
        let t = total(&handled, tcp);
        assert_eq!(
            (t.messages, t.replies),
            (sent, sent),
            "size {size}: agent logged {handled:?}\n{out}"
        );
    }
}

#[test]
fn sockperf_ping_pong_udp_against_the_agent() {
    let _file = crate::common::file_lock(module_path!());
    ping_pong_against_the_agent(
        "sockperf_ping_pong_udp_against_the_agent",
        false,
        &[14, 64, 1400, 65_000],
    );
}

#[test]
fn sockperf_ping_pong_tcp_against_the_agent() {
    let _file = crate::common::file_lock(module_path!());
    // 65,507 is the largest message sockperf's server (and so the agent) takes by default.
    ping_pong_against_the_agent(
        "sockperf_ping_pong_tcp_against_the_agent",
        true,
        &[14, 64, 1400, 65_507],
    );
}

// ---------------------------------------------------------------------------------------------
// 2. sockperf under-load and throughput against the agent
// ---------------------------------------------------------------------------------------------

fn under_load_against_the_agent(test: &str, tcp: bool) {
    if !have_sockperf(test) {
        return;
    }
    let agent = SondeServer::start(&[]);
    let port = agent.port();
    // sockperf's defaults: 10,000 messages/s, a reply asked for every 100th.
    let mut args = vec![
        "under-load",
        "-i",
        "127.0.0.1",
        "-p",
        &port,
        "-t",
        "1",
        "--reply-every",
        "100",
    ];
    args.extend_from_slice(tcp_flag(tcp));
    let out = sockperf_client(&args);
    let handled = agent.stop();
    let sent = must_number_after(&out, "SentMessages=");
    let received = must_number_after(&out, "ReceivedMessages=");
    assert!(sent >= 100, "{out}");
    let t = total(&handled, tcp);
    assert_eq!(t.messages, sent, "agent logged {handled:?}\n{out}");
    // Only the PONG requests (seq 100, 200, ...) are answered: a reply to any other message
    // would land in the wrong slot of sockperf's statistics.
    assert_eq!(t.replies, sent / 100, "agent logged {handled:?}\n{out}");
    assert!(received > 0 && received <= t.replies, "{out}");
    assert!(must_number_after(&out, "Total ") > 0, "{out}");
}

#[test]
fn sockperf_under_load_udp_against_the_agent() {
    let _file = crate::common::file_lock(module_path!());
    under_load_against_the_agent("sockperf_under_load_udp_against_the_agent", false);
}

#[test]
fn sockperf_under_load_tcp_against_the_agent() {
    let _file = crate::common::file_lock(module_path!());
    under_load_against_the_agent("sockperf_under_load_tcp_against_the_agent", true);
}

fn throughput_against_the_agent(test: &str, tcp: bool) {
    if !have_sockperf(test) {
        return;
    }
    let agent = SondeServer::start(&[]);
    let port = agent.port();
    // TCP at full speed; UDP paced so that a busy test host's socket buffer cannot overflow and
    // the count stays exact.
    let mps = if tcp { "max" } else { "5000" };
    let mut args = vec![
        "throughput",
        "-i",
        "127.0.0.1",
        "-p",
        &port,
        "-t",
        "1",
        "-m",
        "100",
        "--mps",
        mps,
    ];
    args.extend_from_slice(tcp_flag(tcp));
    let out = sockperf_client(&args);
    let handled = agent.stop();
    let sent = must_number_after(&out, "Total of ");
    assert!(sent > 0, "{out}");
    let t = total(&handled, tcp);
    assert_eq!(
        (t.messages, t.replies),
        (sent, 0),
        "agent logged {handled:?}\n{out}"
    );
}

#[test]
fn sockperf_throughput_udp_against_the_agent() {
    let _file = crate::common::file_lock(module_path!());
    throughput_against_the_agent("sockperf_throughput_udp_against_the_agent", false);
}

#[test]
fn sockperf_throughput_tcp_against_the_agent() {
    let _file = crate::common::file_lock(module_path!());
    throughput_against_the_agent("sockperf_throughput_tcp_against_the_agent", true);
}

// ---------------------------------------------------------------------------------------------
// 3. sonde's client against a real sockperf server
// ---------------------------------------------------------------------------------------------

/// A `sockperf server` child on 127.0.0.1; killed when dropped.
struct SockperfServer {
    daemon: Daemon,
    port: u16,
}

impl SockperfServer {
    fn start(tcp: bool) -> SockperfServer {
        let port = free_port();
        let mut cmd = Command::new(common::tool("sockperf"));
        cmd.args(["server", "-i", "127.0.0.1", "-p", &port.to_string()])
            .args(tcp_flag(tcp));
        let mut daemon = Daemon::spawn(&mut cmd);
        // Printed by the server thread just before it blocks in its receive loop.
        daemon.wait_for_line(READY, |l| l.contains("to block on socket").then_some(()));
        SockperfServer { daemon, port }
    }

    /// Stops the server with SIGINT; the messages it says it received and handled.
    fn stop(mut self) -> u64 {
        let pid = self.daemon.pid().to_string();
        assert!(
            common::quiet(Command::new("kill").args(["-INT", &pid])),
            "cannot signal sockperf"
        );
        self.daemon.wait_for_line(READY, |l| {
            let l = strip_ansi(l);
            if l.contains("No messages were received") {
                return Some(0);
            }
            l.contains("messages received and handled")
                .then(|| number_after(&l, "Total "))
                .flatten()
        })
    }
}

/// Runs `sonde ARGS...` to completion: (exit code, stdout, stderr).
fn sonde(args: &[&str]) -> (Option<i32>, String, String) {
    let mut cmd = common::sonde_command();
    cmd.args(args).env("TERM", "dumb");
    let out = run_with_timeout(&mut cmd, Duration::from_secs(60)).unwrap_or_else(|e| panic!("{e}"));
    (out.status.code(), out.stdout, out.stderr)
}

fn sonde_json(args: &[&str]) -> Value {
    let (code, stdout, stderr) = sonde(args);
    assert_eq!(
        code,
        Some(0),
        "`sonde {}` failed\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}",
        args.join(" ")
    );
    let doc: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("not one JSON document ({e}):\n{stdout}"));
    if let Err(errors) = sonde_report::validate(&doc) {
        panic!(
            "the document breaks the schema:\n{}\n{doc:#}",
            errors.join("\n")
        );
    }
    doc
}

/// A percentile is stated exactly when the sample count supports it (10 / (1 − p) samples);
/// checked away from the boundary.
fn check_percentiles(doc: &Value) {
    let samples = u(doc, "/samples") as f64;
    for (key, p) in [
        ("p50", 0.5),
        ("p90", 0.9),
        ("p99", 0.99),
        ("p999", 0.999),
        ("p9999", 0.9999),
        ("p99999", 0.99999),
    ] {
        let need = 10.0 / (1.0 - p);
        let value = &doc["rtt_ns"][key];
        if samples >= need * 1.01 {
            assert!(value.as_u64().is_some_and(|v| v > 0), "{key}: {doc:#}");
        } else if samples < need * 0.99 {
            assert!(value.is_null(), "{key}: {doc:#}");
        }
    }
}

fn sonde_against_sockperf_server(test: &str, tcp: bool) {
    if !have_sockperf(test) {
        return;
    }
    let server = SockperfServer::start(tcp);
    let port = server.port.to_string();
    // sockperf's own client first, on the same path (loosely: it runs, it measures).
    let mut args = vec![
        "ping-pong",
        "-i",
        "127.0.0.1",
        "-p",
        &port,
        "-t",
        "1",
        "--full-rtt",
    ];
    args.extend_from_slice(tcp_flag(tcp));
    let theirs = sockperf_client(&args);
    let their_sent = must_number_after(&theirs, "SentMessages=");
    let their_rtt = theirs
        .split("avg-rtt=")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no avg-rtt in:\n{theirs}"));

    let target = format!("sockperf://127.0.0.1:{port}");
    let proto = if tcp { "--tcp" } else { "-u" };
    let doc = sonde_json(&[
        "latency", &target, proto, "-t", "0.5", "--warmup", "0.2", "--json",
    ]);
    let handled = server.stop();

    assert_eq!(doc["test"], "latency", "{doc:#}");
    assert_eq!(doc["peer"], "sockperf", "{doc:#}");
    assert_eq!(doc["protocol"], if tcp { "tcp" } else { "udp" }, "{doc:#}");
    assert_eq!(u(&doc, "/session"), 0, "{doc:#}");
    assert_eq!(doc["server"], target.as_str(), "{doc:#}");
    assert!(u(&doc, "/samples") > 0, "{doc:#}");
    assert!(u(&doc, "/warmup_samples") > 0, "{doc:#}");
    check_percentiles(&doc);
    let sent = u(&doc, "/sent");
    assert_eq!(
        u(&doc, "/samples") + u(&doc, "/warmup_samples") + u(&doc, "/lost"),
        sent,
        "{doc:#}"
    );
    // The server can tell us nothing to split the loss with, and the document says so.
    assert!(
        doc["lost_outbound"].is_null() && doc["lost_return"].is_null(),
        "{doc:#}"
    );
    let warnings = doc["warnings"].as_array().expect("warnings");
    assert!(
        warnings
            .iter()
            .any(|w| w.as_str().is_some_and(|w| w.contains("sockperf server"))),
        "{doc:#}"
    );
    if tcp {
        assert_eq!(u(&doc, "/lost"), 0, "{doc:#}");
    }
    // What the server counted is exactly what the two clients sent.
    assert_eq!(
        handled,
        their_sent + sent,
        "the server handled {handled}: sockperf sent {their_sent}, sonde {sent}\n{doc:#}"
    );
    // Both measured something on the same path; no comparison of the numbers.
    assert!(
        their_rtt > 0.0 && u(&doc, "/rtt_ns/p50") > 0,
        "{their_rtt} {doc:#}"
    );
    // This end's CPU, as against an agent: a send and a receive (or so) per message. The
    // server's is unknown.
    let cpu = &doc["cpu"]["client"];
    assert!(u(cpu, "/user_ns") + u(cpu, "/system_ns") > 0, "{doc:#}");
    assert_eq!(u(cpu, "/messages"), sent, "{doc:#}");
    let per = cpu["syscalls_per_message"]
        .as_f64()
        .expect("syscalls per message");
    assert!((1.5..=4.0).contains(&per), "{per}: {doc:#}");
    assert!(doc["cpu"]["server"].is_null(), "{doc:#}");
}

#[test]
fn sonde_latency_udp_against_a_sockperf_server() {
    let _file = crate::common::file_lock(module_path!());
    sonde_against_sockperf_server("sonde_latency_udp_against_a_sockperf_server", false);
}

#[test]
fn sonde_latency_tcp_against_a_sockperf_server() {
    let _file = crate::common::file_lock(module_path!());
    sonde_against_sockperf_server("sonde_latency_tcp_against_a_sockperf_server", true);
}

#[test]
fn sonde_latency_count_and_table_against_a_sockperf_server() {
    let _file = crate::common::file_lock(module_path!());
    if !have_sockperf("sonde_latency_count_and_table_against_a_sockperf_server") {
        return;
    }
    let server = SockperfServer::start(false);
    let target = format!("sockperf://127.0.0.1:{}", server.port);
    // sockperf://HOST defaults to UDP, like sockperf; -n counts messages after the warm-up.
    let doc = sonde_json(&[
        "latency", &target, "-n", "500", "--warmup", "0.1", "-m", "14", "--json",
    ]);
    assert_eq!(doc["protocol"], "udp", "{doc:#}");
    assert_eq!(u(&doc, "/msg_size_bytes"), 14, "{doc:#}");
    assert_eq!(u(&doc, "/samples"), 500, "{doc:#}");
    let (code, table, stderr) = sonde(&["latency", &target, "-t", "0.2", "--warmup", "0.1"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(table.contains(&target), "{table}");
    assert!(table.contains("RTT"), "{table}");
    let handled = server.stop();
    assert!(handled >= u(&doc, "/sent"), "{handled} {doc:#}");
}

#[test]
fn ctrl_c_against_a_sockperf_server_prints_and_saves_what_was_measured() {
    let _file = crate::common::file_lock(module_path!());
    if !have_sockperf("ctrl_c_against_a_sockperf_server_prints_and_saves_what_was_measured") {
        return;
    }
    let server = SockperfServer::start(false);
    let target = format!("sockperf://127.0.0.1:{}", server.port);
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("results.db");
    let child = common::sonde_command()
        .args([
            "latency", &target, "-t", "20", "--warmup", "0", "--json", "--db",
        ])
        .arg(&db)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn sonde");
    // sonde prints nothing while it runs; the handlers are in place long before this.
    thread::sleep(Duration::from_millis(1500));
    assert!(
        common::quiet(Command::new("kill").args(["-INT", &child.id().to_string()])),
        "cannot signal sonde"
    );
    let out = child.wait_with_output().expect("wait for sonde");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("interrupted by Ctrl-C"), "{stderr}");
    let doc: Value = serde_json::from_slice(&out.stdout).expect("the result is printed");
    if let Err(errors) = sonde_report::validate(&doc) {
        panic!(
            "the document breaks the schema:\n{}\n{doc:#}",
            errors.join("\n")
        );
    }
    assert_eq!(doc["peer"], "sockperf", "{doc:#}");
    assert_eq!(doc["interrupted"], true, "{doc:#}");
    assert!(
        u(&doc, "/samples") > 0,
        "what was measured is there: {doc:#}"
    );
    assert!(u(&doc, "/duration_ns") < 20_000_000_000, "{doc:#}");
    let codes = doc["warning_codes"].as_array().expect("warning codes");
    assert!(codes.iter().any(|c| c == "interrupted"), "{doc:#}");
    let handled = server.stop();
    assert!(
        handled >= u(&doc, "/sent") - u(&doc, "/lost"),
        "{handled} {doc:#}"
    );
    // Saved as printed, marked interrupted.
    let runs = sonde_store::Store::open_existing(&db)
        .expect("the result was saved")
        .documents(&sonde_store::Filter::default())
        .expect("runs");
    assert_eq!(runs.len(), 1);
    assert!(runs[0].summary.interrupted);
    let stored: Value = serde_json::from_str(&runs[0].document).expect("json");
    assert_eq!(stored, doc);
}

// ---------------------------------------------------------------------------------------------
// 4. Bad input to the agent's sockperf listener
// ---------------------------------------------------------------------------------------------

fn in_process_agent(max_sessions: u32) -> AgentHandle {
    let mut cfg = AgentConfig::new("127.0.0.1:0".parse().expect("address"));
    cfg.sockperf = Some("127.0.0.1:0".parse().expect("address"));
    cfg.max_sessions = max_sessions;
    InProcessAgent::bind(cfg).expect("bind the agent").spawn()
}

fn sockperf_addr(agent: &AgentHandle) -> SocketAddr {
    agent.sockperf_addr().expect("the sockperf listener")
}

fn message(seq: u64, flags: u16, length: u32, total: usize) -> Vec<u8> {
    let mut m = vec![0x5a; total.max(wire::HEADER_LEN)];
    Header {
        seq,
        flags: Flags(flags),
        length,
    }
    .write(&mut m)
    .expect("room for the header");
    m.truncate(total);
    m
}

/// A short sonde run against the agent's sockperf port: it answers.
fn sonde_client_answers(addr: SocketAddr, protocol: Protocol) {
    let target = sonde_client::sockperf::parse_target(&format!("sockperf://{addr}"))
        .expect("the scheme")
        .expect("the target");
    let opt = LatencyOptions {
        protocol,
        msg_size: 64,
        count: Some(200),
        warmup: Duration::from_millis(20),
        ..LatencyOptions::default()
    };
    let doc = sonde_client::run(&target, &opt, sonde_client::Controls::new())
        .expect("the agent answers")
        .result;
    assert_eq!(doc.samples, 200, "{doc:?}");
    assert_eq!(doc.lost, 0, "{doc:?}");
}

/// The agent's own port still runs a sonde test.
fn sonde_port_answers(agent: &AgentHandle) {
    let target = sonde_client::resolve(&agent.local_addr().to_string(), 0).expect("target");
    let opt = LatencyOptions {
        count: Some(50),
        warmup: Duration::from_millis(10),
        ..LatencyOptions::default()
    };
    let doc = sonde_client::run(&target, &opt, sonde_client::Controls::new())
        .expect("the sonde port answers")
        .result;
    assert_eq!(doc.samples, 50);
}

fn load(counter: &std::sync::atomic::AtomicU64) -> u64 {
    counter.load(std::sync::atomic::Ordering::Relaxed)
}

/// Waits until `cond` holds (the agent works on its own threads).
fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "not within 10 s: {what}");
        thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn udp_junk_is_counted_and_never_answered() {
    let _file = crate::common::file_lock(module_path!());
    let agent = in_process_agent(16);
    let addr = sockperf_addr(&agent);
    let sock = UdpSocket::bind("127.0.0.1:0").expect("bind");
    sock.connect(addr).expect("connect");
    sock.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut good_then_zero = message(7, 0x0003, 14, 14);
    good_then_zero.extend(message(8, 0x0003, 0, 14));
    let junk: Vec<Vec<u8>> = vec![
        Vec::new(),
        vec![1, 2, 3, 4, 5],
        message(1, 0x0003, 0, 14),
        message(1, 0x0003, 13, 40),
        message(1, 0x0003, 65_508, 14),
        message(1, 0x0003, 100, 20),
        // A message, then a zero length: dropped whole, never looped on.
        good_then_zero,
        // Two whole messages in one datagram: real clients send one per datagram, and one
        // reply per message would let a spoofed datagram draw several.
        [message(5, 0x8003, 14, 14), message(6, 0x8003, 14, 14)].concat(),
        // A message with bytes after it.
        message(10, 0x8003, 14, 20),
    ];
    let not_counted = [
        message(2, 0x0002, 14, 14), // no client flag
        message(3, 0x0007, 14, 14), // warm-up
        message(4, 0x0001, 14, 14), // counted, no reply asked
    ];
    for d in junk.iter().chain(&not_counted) {
        sock.send(d).expect("send");
    }
    let ping = message(9, 0x8003, 64, 64);
    sock.send(&ping).expect("send");
    // Exactly one reply: seq 9's, the request with only the client bit cleared.
    let mut buf = [0u8; 2048];
    let n = sock.recv(&mut buf).expect("the reply to seq 9");
    let mut expected = ping.clone();
    expected[9] = 0x02;
    assert_eq!(&buf[..n], &expected[..]);
    sock.set_read_timeout(Some(Duration::from_millis(300)))
        .expect("timeout");
    assert!(
        sock.recv(&mut buf).is_err(),
        "a second reply: {:02x?}",
        &buf[..14]
    );
    eventually("junk counted", || {
        load(&agent.rejections().sockperf_junk) == junk.len() as u64
    });
    assert_eq!(load(&agent.rejections().sockperf_refused), 0);
    // Still serving, both ports.
    sonde_client_answers(addr, Protocol::Udp);
    sonde_port_answers(&agent);
    agent.stop();
}

/// The amplification: one 1,472-byte datagram of 105 ping messages drew 105 replies
/// toward its (spoofable) source. Now it draws none, and no reply is ever longer than its
/// request.
#[test]
fn a_datagram_of_many_messages_draws_no_reply() {
    let _file = crate::common::file_lock(module_path!());
    let agent = in_process_agent(16);
    let addr = sockperf_addr(&agent);
    let sock = UdpSocket::bind("127.0.0.1:0").expect("bind");
    sock.connect(addr).expect("connect");
    let many: Vec<u8> = (0..105u64)
        .flat_map(|seq| message(seq, 0x8003, 14, 14))
        .collect();
    assert_eq!(many.len(), 1_470);
    sock.send(&many).expect("send");
    let one = message(200, 0x8003, 14, 14);
    sock.send(&one).expect("send");
    sock.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut buf = [0u8; 2048];
    let n = sock.recv(&mut buf).expect("the single message is answered");
    assert_eq!(n, one.len(), "a reply as long as its request");
    assert_eq!(
        &buf[..8],
        &one[..8],
        "the reply to seq 200, not to the batch"
    );
    sock.set_read_timeout(Some(Duration::from_millis(300)))
        .expect("timeout");
    assert!(sock.recv(&mut buf).is_err(), "the batch drew a reply");
    eventually("the batch counted as junk", || {
        load(&agent.rejections().sockperf_junk) == 1
    });
    agent.stop();
}

/// Sends one ping from each socket, then counts the replies (admission happens as the pings
/// arrive, before any peer could go quiet).
fn pings_answered(socks: &[UdpSocket]) -> usize {
    for sock in socks {
        sock.send(&message(1, 0x8003, 14, 14)).expect("send");
    }
    socks
        .iter()
        .filter(|sock| {
            sock.set_read_timeout(Some(Duration::from_millis(300)))
                .expect("timeout");
            sock.recv(&mut [0u8; 64]).is_ok()
        })
        .count()
}

fn udp_peer(source: u8, addr: SocketAddr) -> UdpSocket {
    let sock = UdpSocket::bind((std::net::Ipv4Addr::new(127, 0, 0, source), 0))
        .expect("bind a loopback source");
    sock.connect(addr).expect("connect");
    sock
}

/// sockperf sessions cost their peer one datagram each: they get a budget of their own (8 of
/// the agent's 16), so idle sockperf peers cannot fill the agent.
#[test]
fn sockperf_peers_have_a_budget_of_their_own() {
    let _file = crate::common::file_lock(module_path!());
    let agent = in_process_agent(16);
    let addr = sockperf_addr(&agent);
    // Ten sources, one peer each.
    let socks: Vec<UdpSocket> = (2..12u8).map(|source| udp_peer(source, addr)).collect();
    assert_eq!(
        pings_answered(&socks),
        8,
        "sockperf peers beyond their budget"
    );
    // The agent's other sessions stay free for sonde clients.
    sonde_port_answers(&agent);
    agent.stop();
}

/// And one address holds at most two of them.
#[test]
fn sockperf_udp_peers_from_one_address_are_capped() {
    let _file = crate::common::file_lock(module_path!());
    let agent = in_process_agent(16);
    let addr = sockperf_addr(&agent);
    let socks: Vec<UdpSocket> = (0..5).map(|_| udp_peer(1, addr)).collect();
    assert_eq!(pings_answered(&socks), 2, "one address holds at most two");
    agent.stop();
}

/// A connection trickling bytes that never make a whole message is not measurement traffic:
/// it is closed when its first message is overdue, as a silent one is (before, every byte reset
/// the idle timer and the connection held a session for as long as it trickled).
#[test]
fn a_trickle_of_bytes_does_not_keep_a_sockperf_session() {
    let _file = crate::common::file_lock(module_path!());
    let mut cfg = AgentConfig::new("127.0.0.1:0".parse().expect("address"));
    cfg.sockperf = Some("127.0.0.1:0".parse().expect("address"));
    cfg.hello_timeout = Duration::from_millis(300);
    let agent = InProcessAgent::bind(cfg).expect("bind the agent").spawn();
    let addr = sockperf_addr(&agent);
    let mut s = TcpStream::connect(addr).expect("connect");
    // A header announcing 65,000 bytes, then a byte every 100 ms.
    s.write_all(&message(1, 0x0003, 65_000, 14)).expect("write");
    let started = Instant::now();
    let mut closed = false;
    while started.elapsed() < Duration::from_secs(8) {
        thread::sleep(Duration::from_millis(100));
        if s.write_all(&[0x5a]).is_err() {
            closed = true;
            break;
        }
    }
    assert!(
        closed,
        "a trickle kept the session for {:?}",
        started.elapsed()
    );
    eventually("the session freed", || agent.sessions() == 0);
    agent.stop();
}

/// Connects to the agent's sockperf port, sends `bytes`, and says whether the agent closed the
/// connection (EOF or reset) within 10 s.
fn closed_after(addr: SocketAddr, bytes: &[u8], half_close: bool) -> bool {
    let is_closed = |e: &std::io::Error| {
        matches!(
            e.kind(),
            std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::ConnectionAborted
                | std::io::ErrorKind::BrokenPipe
        )
    };
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    // A refused connection may be gone before the write.
    if let Err(e) = s.write_all(bytes) {
        return is_closed(&e);
    }
    if half_close {
        s.shutdown(Shutdown::Write).expect("shutdown");
    }
    let mut buf = [0u8; 64];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) => return is_closed(&e),
        }
    }
}

#[test]
fn tcp_bad_lengths_close_the_connection_and_are_counted() {
    let _file = crate::common::file_lock(module_path!());
    let agent = in_process_agent(16);
    let addr = sockperf_addr(&agent);
    // A length over the agent's 65,507 maximum: closed from the header alone, nothing buffered.
    assert!(closed_after(
        addr,
        &message(1, 0x0003, 100_000_000, 14),
        false
    ));
    // A zero length: closed, not spun on.
    assert!(closed_after(addr, &message(1, 0x0003, 0, 14), false));
    // Half a message, then the client closes.
    assert!(closed_after(addr, &message(1, 0x0003, 100, 50), true));
    eventually("three junk connections", || {
        load(&agent.rejections().sockperf_junk) == 3
    });
    // A good connection is still answered, its messages reassembled across writes.
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut two = message(1, 0x0003, 30, 30);
    two.extend(message(2, 0x0001, 20, 20));
    two.extend(message(3, 0x0003, 40, 40));
    for chunk in two.chunks(7) {
        s.write_all(chunk).expect("write");
        thread::sleep(Duration::from_millis(2));
    }
    let mut replies = vec![0u8; 70];
    s.read_exact(&mut replies).expect("two replies");
    assert_eq!(&replies[..30], &message(1, 0x0002, 30, 30)[..]);
    assert_eq!(&replies[30..], &message(3, 0x0002, 40, 40)[..]);
    drop(s);
    sonde_client_answers(addr, Protocol::Tcp);
    sonde_port_answers(&agent);
    assert_eq!(load(&agent.rejections().sockperf_junk), 3);
    agent.stop();
}

#[test]
fn tcp_connections_beyond_max_sessions_are_refused_and_counted() {
    let _file = crate::common::file_lock(module_path!());
    let agent = in_process_agent(2);
    let addr = sockperf_addr(&agent);
    // Two connections hold the two sessions (each proven admitted by a reply).
    let held: Vec<TcpStream> = (0..2)
        .map(|i| {
            let mut s = TcpStream::connect(addr).expect("connect");
            s.set_read_timeout(Some(Duration::from_secs(5)))
                .expect("timeout");
            s.write_all(&message(i + 1, 0x0003, 14, 14)).expect("write");
            let mut r = [0u8; 14];
            s.read_exact(&mut r).expect("a reply: admitted");
            s
        })
        .collect();
    assert_eq!(agent.sessions(), 2);
    // A flood of further connections: every one closed at once and counted.
    let flood = 40;
    for _ in 0..flood {
        assert!(closed_after(addr, &message(1, 0x0003, 14, 14), false));
    }
    eventually("the flood counted", || {
        load(&agent.rejections().sockperf_refused) == flood
    });
    // The sonde port refuses too (the limit is shared)...
    let target = sonde_client::resolve(&agent.local_addr().to_string(), 0).expect("target");
    let busy = sonde_client::run(
        &target,
        &LatencyOptions::default(),
        sonde_client::Controls::new(),
    )
    .unwrap_err();
    assert_eq!(busy.exit_code(), 4, "{busy}");
    // ...and a UDP peer is not answered while the agent is full.
    let sock = UdpSocket::bind("127.0.0.1:0").expect("bind");
    sock.connect(addr).expect("connect");
    sock.set_read_timeout(Some(Duration::from_millis(300)))
        .expect("timeout");
    sock.send(&message(1, 0x0003, 14, 14)).expect("send");
    assert!(sock.recv(&mut [0u8; 64]).is_err());
    eventually("the UDP datagram refused", || {
        load(&agent.rejections().sockperf_refused) == flood + 1
    });
    // Closing the held connections frees the sessions; everything answers again.
    drop(held);
    eventually("sessions freed", || agent.sessions() == 0);
    sonde_client_answers(addr, Protocol::Tcp);
    sonde_port_answers(&agent);
    agent.stop();
}

// ---------------------------------------------------------------------------------------------
// 5. Nothing answers
// ---------------------------------------------------------------------------------------------

/// Runs `sonde ARGS...`, which must fail with exit code 3 and one "no reply" line; the line.
fn assert_no_reply(args: &[&str]) -> String {
    let (code, stdout, stderr) = sonde(args);
    assert_eq!(
        code,
        Some(3),
        "`sonde {}`\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}",
        args.join(" ")
    );
    assert!(stdout.is_empty(), "{stdout}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].starts_with("sonde: no reply from sockperf server at 127.0.0.1:")
            && lines[0].contains("sockperf server"),
        "{stderr}"
    );
    lines[0].to_owned()
}

#[test]
fn nothing_listening_is_exit_3_with_one_line() {
    let _file = crate::common::file_lock(module_path!());
    let port = free_port();
    let target = format!("sockperf://127.0.0.1:{port}");
    let udp = assert_no_reply(&["latency", &target, "-t", "0.5", "--warmup", "0.1"]);
    assert!(
        udp.contains("over UDP") && udp.contains("port is closed"),
        "{udp}"
    );
    let tcp = assert_no_reply(&["latency", &target, "--tcp", "-t", "0.5", "--warmup", "0.1"]);
    assert!(
        tcp.contains("over TCP") && tcp.contains("cannot connect"),
        "{tcp}"
    );
}

#[test]
fn a_silent_udp_port_is_exit_3_with_one_line() {
    let _file = crate::common::file_lock(module_path!());
    // Something holds the port but never answers: sonde gives up after 3 s, not after -t.
    let silent = UdpSocket::bind("127.0.0.1:0").expect("bind");
    let target = format!("sockperf://{}", silent.local_addr().expect("address"));
    let started = Instant::now();
    let line = assert_no_reply(&["latency", &target, "-t", "30"]);
    assert!(line.contains("within 3 s"), "{line}");
    assert!(started.elapsed() < Duration::from_secs(20));
}

#[test]
fn a_message_over_the_sockperf_servers_maximum_is_exit_3_and_says_so() {
    let _file = crate::common::file_lock(module_path!());
    if !have_sockperf("a_message_over_the_sockperf_servers_maximum_is_exit_3_and_says_so") {
        return;
    }
    // sockperf's server closes a TCP connection on a message above its 65,507-byte default.
    let server = SockperfServer::start(true);
    let target = format!("sockperf://127.0.0.1:{}", server.port);
    let line = assert_no_reply(&["latency", &target, "--tcp", "-m", "100000", "-t", "1"]);
    assert!(line.contains("it closed the connection"), "{line}");
}

// ---------------------------------------------------------------------------------------------
// 6. The inner view against a real sockperf server
// ---------------------------------------------------------------------------------------------

/// How far the result's HDR histogram (3 significant digits) may put a value from the sample:
/// a bucket is at most 1/1024 of its values wide.
fn hdr_slack(v: u64) -> u64 {
    v / 1000 + 1
}

fn full_log_against_sockperf_server(test: &str, tcp: bool) {
    if !have_sockperf(test) {
        return;
    }
    let server = SockperfServer::start(tcp);
    let target = format!("sockperf://127.0.0.1:{}", server.port);
    let file = TempFile::new(if tcp {
        "sockperf-log-tcp"
    } else {
        "sockperf-log-udp"
    });
    let proto = if tcp { "--tcp" } else { "-u" };
    let doc = sonde_json(&[
        "latency",
        &target,
        proto,
        "-t",
        "1",
        "--warmup",
        "0.2",
        "--full-log",
        file.path(),
        "--json",
    ]);
    let handled = server.stop();
    assert_eq!(doc["peer"], "sockperf", "{doc:#}");
    let sent = u(&doc, "/sent");
    let samples = u(&doc, "/samples");
    assert!(samples > 0, "{doc:#}");
    // The result states the log, complete.
    assert_eq!(doc["full_log"]["path"], file.path(), "{doc:#}");
    assert_eq!(u(&doc, "/full_log/written"), sent, "{doc:#}");
    assert_eq!(u(&doc, "/full_log/dropped"), 0, "{doc:#}");
    assert!(doc["full_log"]["error"].is_null(), "{doc:#}");
    assert!(doc.get("socket_rtt").is_none(), "no --timestamps: {doc:#}");
    // One line per message sent, and the server received every one of them.
    let lines = read_log(&file);
    let mut seqs: Vec<u64> = lines.iter().map(|l| l.seq).collect();
    seqs.sort_unstable();
    assert_eq!(seqs, (0..sent).collect::<Vec<_>>());
    assert_eq!(handled, sent, "the server handled {handled}\n{doc:#}");
    // The lines agree with the result's counts.
    let count = |f: &dyn Fn(&LogLine) -> bool| lines.iter().filter(|l| f(l)).count() as u64;
    assert_eq!(count(&LogLine::measured), samples, "{doc:#}");
    assert_eq!(
        count(&|l| l.warmup && l.outcome != "lost"),
        u(&doc, "/warmup_samples"),
        "{doc:#}"
    );
    assert_eq!(count(&|l| l.outcome == "lost"), u(&doc, "/lost"), "{doc:#}");
    if tcp {
        assert_eq!(count(&|l| l.outcome != "received"), 0, "TCP loses nothing");
    }
    let mut rtts = Vec::new();
    for l in &lines {
        if l.outcome == "lost" {
            assert!(l.receive_ns.is_none() && l.rtt_ns.is_none(), "{l:?}");
            continue;
        }
        let rtt = l.rtt_ns.unwrap_or_else(|| panic!("no RTT: {l:?}"));
        assert_eq!(Some(l.send_ns + rtt), l.receive_ns, "{l:?}");
        assert!(l.socket_rtt_ns.is_none() && l.send_to_socket_rx_ns.is_none());
        if l.measured() {
            rtts.push(rtt);
        }
    }
    // The logged RTTs are the result's: its minimum and maximum are theirs, and every
    // percentile it states lies between them (to the histogram's precision).
    let lo = *rtts.iter().min().expect("measured RTTs");
    let hi = *rtts.iter().max().expect("measured RTTs");
    let (min, max) = (u(&doc, "/rtt_ns/min"), u(&doc, "/rtt_ns/max"));
    assert!(
        min <= lo && lo - min <= hdr_slack(lo),
        "log {lo}..{hi}: {doc:#}"
    );
    assert!(
        max >= hi && max - hi <= hdr_slack(hi),
        "log {lo}..{hi}: {doc:#}"
    );
    let mut stated = 0;
    for key in ["p50", "p90", "p99", "p999", "p9999", "p99999"] {
        if let Some(p) = doc["rtt_ns"][key].as_u64() {
            assert!(
                p + hdr_slack(lo) >= lo && p <= hi + hdr_slack(hi),
                "{key} {p} outside the log's {lo}..{hi}"
            );
            stated += 1;
        }
    }
    assert!(stated >= 2, "{doc:#}");
}

#[test]
fn full_log_udp_against_a_sockperf_server() {
    let _file = crate::common::file_lock(module_path!());
    full_log_against_sockperf_server("full_log_udp_against_a_sockperf_server", false);
}

#[test]
fn full_log_tcp_against_a_sockperf_server() {
    let _file = crate::common::file_lock(module_path!());
    full_log_against_sockperf_server("full_log_tcp_against_a_sockperf_server", true);
}

/// `--timestamps --full-log` against a sockperf server: the kernel's stamps on this end's
/// socket, never more than the application saw, for every logged sample.
#[cfg(target_os = "linux")]
fn timestamps_against_sockperf_server(test: &str, tcp: bool, rate: Option<&str>) {
    if !have_sockperf(test) {
        return;
    }
    let server = SockperfServer::start(tcp);
    let target = format!("sockperf://127.0.0.1:{}", server.port);
    let file = TempFile::new(if tcp {
        "sockperf-ts-tcp"
    } else {
        "sockperf-ts-udp"
    });
    let mut args = vec![
        "latency",
        &target,
        if tcp { "--tcp" } else { "-u" },
        "-t",
        "1",
        "--warmup",
        "0.2",
        "--timestamps",
        "--full-log",
        file.path(),
        "--json",
    ];
    if let Some(r) = rate {
        args.extend(["--rate", r]);
    }
    let doc = sonde_json(&args);
    drop(server);
    let samples = u(&doc, "/samples");
    assert!(samples > 0, "{doc:#}");
    let s = &doc["socket_rtt"];
    assert_eq!(s["rx_timestamps"], true, "{doc:#}");
    assert_eq!(u(s, "/rx_stamped"), samples, "{doc:#}");
    assert_eq!(u(s, "/inconsistent"), 0, "{doc:#}");
    let lines = read_log(&file);
    let (mut socket, mut send_to_rx) = (0u64, 0u64);
    for l in lines.iter().filter(|l| l.measured()) {
        let app = l.rtt_ns.unwrap_or_else(|| panic!("no RTT: {l:?}"));
        if let Some(k) = l.socket_rtt_ns {
            assert!(k <= app, "socket RTT above the application's: {l:?}");
            socket += 1;
        }
        if let Some(k) = l.send_to_socket_rx_ns {
            assert!(k <= app, "send to socket RX above the RTT: {l:?}");
            send_to_rx += 1;
        }
    }
    assert!(send_to_rx >= samples, "{send_to_rx} of {samples}");
    // Transmit stamps for every message of a closed loop, UDP per datagram and TCP by the
    // message's last byte.
    assert_eq!(s["tx_timestamps"], true, "{doc:#}");
    assert_eq!(u(s, "/tx_stamped"), samples, "{doc:#}");
    assert!(
        u(s, "/socket_rtt_ns/p50") <= u(&doc, "/rtt_ns/p50"),
        "{doc:#}"
    );
    assert!(socket >= samples, "{socket} of {samples}");
}

#[test]
#[cfg(target_os = "linux")]
fn udp_timestamps_against_a_sockperf_server_see_less_than_the_application() {
    let _file = crate::common::file_lock(module_path!());
    let test = "udp_timestamps_against_a_sockperf_server_see_less_than_the_application";
    timestamps_against_sockperf_server(test, false, None);
    timestamps_against_sockperf_server(test, false, Some("3000"));
}

#[test]
#[cfg(target_os = "linux")]
fn tcp_timestamps_against_a_sockperf_server_see_less_than_the_application() {
    let _file = crate::common::file_lock(module_path!());
    timestamps_against_sockperf_server(
        "tcp_timestamps_against_a_sockperf_server_see_less_than_the_application",
        true,
        None,
    );
}

#[test]
fn one_way_against_a_sockperf_server_is_still_a_usage_error() {
    let _file = crate::common::file_lock(module_path!());
    // Nothing listens there: exit code 2, not 3, shows the refusal comes before any contact.
    let target = format!("sockperf://127.0.0.1:{}", free_port());
    for proto in ["-u", "--tcp"] {
        let (code, stdout, stderr) = sonde(&["latency", &target, proto, "--one-way", "-m", "64"]);
        assert_eq!(code, Some(2), "{proto}: {stderr}");
        assert!(stdout.is_empty(), "{stdout}");
        assert!(
            stderr.contains(
                "--one-way is for tests against a sonde agent (one-way delay needs a sonde \
                 agent's timestamps)"
            ),
            "{stderr}"
        );
    }
}
