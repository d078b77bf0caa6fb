//! `sonde crr` end to end:
//!
//! 1. the binary against a `sonde server` child on loopback: the JSON validates against the
//!    schema, the agent's count equals the client's, the percentiles the count supports are
//!    there; `--rst`, the table and the CSV; `-i` intervals that follow each other and add up
//!    to the client's totals;
//! 2. connections with a bad token, sent while a real `sonde crr` runs against an in-process
//!    agent: each is closed unanswered and counted in `Rejections::bad_crr`, and the real test
//!    is untouched;
//! 3. usage errors (exit 2), no agent (exit 3), `--help`;
//! 4. the netns lab (root): in a namespace with 64 ephemeral ports and no `TIME_WAIT` reuse,
//!    FIN closes run out of ports (the test stops and says so, and its intervals end there) and
//!    `--rst` closes do not; and
//!    across a veth where nftables drops every 50th SYN, the connects that lost their SYN take
//!    the kernel's initial retransmission timeout (1 s), which shows in the connect percentiles.
//!
//! Only 127.0.0.1 and namespaces this file creates (198.18.0.0/15); every run is bounded by
//! `-t` and a time limit.

use crate::common;
use crate::common::json::{f, u};

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::process::Stdio;
use std::sync::atomic::Ordering;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;
use sonde_agent::{Agent as InProcessAgent, AgentConfig};
use sonde_wire::{Channel, CrrJoin, Preamble, Token, PROTOCOL_VERSION};

use common::netns::{link_up, veth, Namespaces, Segments};
use common::{
    command_line, require_or_skip, run_json_in, run_with_timeout, tool, Agent, Need, CLIENT_TIMEOUT,
};

/// No single client run here may take longer.
const RUN_LIMIT: Duration = Duration::from_secs(30);

/// The document is valid against the schema and reads back as a result.
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
}

/// `sonde crr TARGET ARGS... --json` against `agent`, validated.
fn crr_json(target: &str, args: &[&str]) -> Value {
    let mut all = vec!["crr", target];
    all.extend_from_slice(args);
    let doc = run_json_in(None, &all, RUN_LIMIT);
    assert_valid(&doc);
    doc
}

/// What every crr document of a clean loopback run must say.
fn check_clean_run(doc: &Value, workers: u64) {
    assert_eq!(doc["test"], "crr", "{doc:#}");
    assert_eq!(doc["protocol"], "tcp", "{doc:#}");
    assert_eq!(u(doc, "/workers"), workers, "{doc:#}");
    let transactions = u(doc, "/transactions");
    assert!(transactions > 0, "{doc:#}");
    // Counted at both ends, the same exchanges.
    assert_eq!(u(doc, "/agent_transactions"), transactions, "{doc:#}");
    assert_eq!(u(doc, "/connects"), transactions, "{doc:#}");
    assert_eq!(u(doc, "/agent_failed"), 0, "{doc:#}");
    for kind in [
        "refused",
        "timeout",
        "reset",
        "addr_not_available",
        "closed",
        "other",
    ] {
        assert_eq!(u(doc, &format!("/errors/{kind}")), 0, "{kind}: {doc:#}");
    }
    // The headline is the agent's count over the agent's window.
    let agent_ns = u(doc, "/agent_duration_ns");
    let rate = f(doc, "/connections_per_second");
    assert!(
        (rate - transactions as f64 * 1e9 / agent_ns as f64).abs() <= rate * 1e-9,
        "{doc:#}"
    );
    assert!(f(doc, "/client_connections_per_second") > 0.0, "{doc:#}");
    // Percentiles: present as far as the count supports them (p50 needs 20, p90 100, p99
    // 1,000), and ordered; a transaction includes its connect.
    for times in ["connect_ns", "transaction_ns"] {
        let t = &doc[times];
        let (min, max) = (u(t, "/min"), u(t, "/max"));
        let mut last = min;
        for (p, need) in [("p50", 20), ("p90", 100), ("p99", 1_000), ("p999", 10_000)] {
            if transactions >= need {
                let v = u(t, &format!("/{p}"));
                assert!(last <= v && v <= max, "{times}.{p}: {doc:#}");
                last = v;
            } else {
                assert!(t[p].is_null(), "{times}.{p} from too few samples: {doc:#}");
            }
        }
        assert!(0 < min, "{doc:#}");
    }
    assert!(
        u(doc, "/transaction_ns/min") >= u(doc, "/connect_ns/min"),
        "{doc:#}"
    );
    assert!(
        doc["warnings"].as_array().is_some_and(Vec::is_empty),
        "{doc:#}"
    );
}

#[test]
fn crr_json_agent_and_client_count_the_same_transactions() {
    let _file = crate::common::file_lock(module_path!());
    let agent = Agent::start_in(None, "127.0.0.1", &["-q"]);
    let doc = crr_json(
        &agent.target(),
        &["-t", "1", "-P", "2", "-m", "100", "--response-size", "20K"],
    );
    check_clean_run(&doc, 2);
    assert_eq!(doc["close"], "fin", "{doc:#}");
    assert_eq!(
        (u(&doc, "/request_bytes"), u(&doc, "/response_bytes")),
        (100, 20 * 1024)
    );
    assert_eq!(u(&doc, "/duration_ns"), 1_000_000_000);
    // Thousands a second on loopback: the median at least is stated.
    assert!(u(&doc, "/transactions") >= 20, "{doc:#}");
    // The agent's configuration came with its welcome.
    assert!(doc["hosts"]["server"].is_object(), "{doc:#}");
    // Both ends' CPU, each over the transactions it completed.
    for side in ["client", "server"] {
        let cpu = &doc["cpu"][side];
        assert!(cpu.is_object(), "{side}: {doc:#}");
        assert!(
            u(cpu, "/user_ns") + u(cpu, "/system_ns") > 0,
            "{side}: {cpu:#}"
        );
    }
    assert_eq!(
        u(&doc, "/cpu/server/messages"),
        u(&doc, "/agent_transactions")
    );
    assert_eq!(
        u(&doc, "/cpu/server/bytes"),
        u(&doc, "/agent_transactions") * (100 + 20 * 1024)
    );
}

#[test]
fn crr_rst_closes_are_counted_at_both_ends_too() {
    let _file = crate::common::file_lock(module_path!());
    let agent = Agent::start_in(None, "127.0.0.1", &["-q"]);
    let doc = crr_json(&agent.target(), &["-t", "0.5", "-P", "3", "--rst"]);
    check_clean_run(&doc, 3);
    assert_eq!(doc["close"], "rst", "{doc:#}");
    assert_eq!(u(&doc, "/request_bytes"), 1);
}

fn sonde(args: &[&str]) -> (Option<i32>, String, String) {
    let mut cmd = common::sonde_command();
    cmd.args(args).env("COLUMNS", "100").env("TERM", "dumb");
    let out = run_with_timeout(&mut cmd, RUN_LIMIT).unwrap_or_else(|e| panic!("{e}"));
    (out.status.code(), out.stdout, out.stderr)
}

#[test]
fn crr_table_and_csv() {
    let _file = crate::common::file_lock(module_path!());
    let agent = Agent::start_in(None, "127.0.0.1", &["-q"]);
    let target = agent.target();
    let (code, table, err) = sonde(&["crr", &target, "-t", "0.3"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(table.starts_with("sonde "), "{table}");
    let first = table
        .lines()
        .find(|l| l.starts_with("connections/s"))
        .unwrap_or_else(|| panic!("no rate line:\n{table}"));
    assert!(first.ends_with(": the figure to quote"), "{table}");
    assert!(table.contains("failed attempts: none"), "{table}");

    let (code, csv, err) = sonde(&["crr", &target, "-t", "0.3", "--csv"]);
    assert_eq!(code, Some(0), "{err}");
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 2, "a header and one summary row:\n{csv}");
    let header: Vec<&str> = lines[0].split(',').collect();
    // The summary row's cells are plain numbers here (no warnings to quote).
    let row: Vec<&str> = lines[1].split(',').collect();
    assert_eq!(header.len(), row.len(), "{csv}");
    let cell = |name: &str| {
        let i = header
            .iter()
            .position(|h| *h == name)
            .unwrap_or_else(|| panic!("no column {name}:\n{csv}"));
        row[i]
    };
    assert_eq!((cell("test"), cell("row")), ("crr", "summary"));
    assert_eq!(cell("agent_transactions"), cell("transactions"));
    assert!(
        cell("connections_per_second")
            .parse::<f64>()
            .is_ok_and(|r| r > 0.0),
        "{csv}"
    );
    assert_eq!(cell("errors_addr_not_available"), "0");
}

/// What the `-i` intervals of a crr document must hold, whatever the timing: they follow each
/// other from 0, each rate is its transactions over its length, the connect percentiles are
/// there when its connects support them, and together they hold the client's totals. Returns
/// them.
fn check_intervals(doc: &Value) -> Vec<Value> {
    let intervals = doc["intervals"]
        .as_array()
        .unwrap_or_else(|| panic!("no intervals in\n{doc:#}"))
        .clone();
    assert!(!intervals.is_empty(), "{doc:#}");
    assert_eq!(u(&intervals[0], "/start_ns"), 0, "{doc:#}");
    for pair in intervals.windows(2) {
        assert_eq!(u(&pair[0], "/end_ns"), u(&pair[1], "/start_ns"), "{doc:#}");
    }
    let (mut transactions, mut connects, mut errors) = (0, 0, 0);
    for iv in &intervals {
        let (start, end) = (u(iv, "/start_ns"), u(iv, "/end_ns"));
        assert!(start < end, "{iv:#}");
        let n = u(iv, "/transactions");
        let expected = n as f64 * 1e9 / (end - start) as f64;
        let rate = f(iv, "/transactions_per_second");
        assert!((rate - expected).abs() <= expected * 1e-9, "{iv:#}");
        let c = u(iv, "/connects");
        for (p, need) in [("connect_p50_ns", 20), ("connect_p99_ns", 1_000)] {
            assert_eq!(iv[p].is_u64(), c >= need, "{p} with {c} connects: {iv:#}");
        }
        if c >= 1_000 {
            assert!(
                u(iv, "/connect_p50_ns") <= u(iv, "/connect_p99_ns"),
                "{iv:#}"
            );
        }
        transactions += n;
        connects += c;
        errors += iv["errors"]
            .as_object()
            .map_or(0, |e| e.values().filter_map(Value::as_u64).sum::<u64>());
    }
    assert_eq!(transactions, u(doc, "/transactions"), "{doc:#}");
    assert_eq!(connects, u(doc, "/connects"), "{doc:#}");
    let total_errors: u64 = doc["errors"]
        .as_object()
        .map_or(0, |e| e.values().filter_map(Value::as_u64).sum());
    assert_eq!(errors, total_errors, "{doc:#}");
    intervals
}

#[test]
fn crr_intervals_follow_each_other_and_add_up_to_the_clients_totals() {
    let _file = crate::common::file_lock(module_path!());
    let agent = Agent::start_in(None, "127.0.0.1", &["-q"]);
    let doc = crr_json(&agent.target(), &["-t", "3", "-i", "1", "-P", "2"]);
    check_clean_run(&doc, 2);
    let intervals = check_intervals(&doc);
    // On the 1 s grid up to -t; the workers' last attempts end just after it, in the last
    // interval, which runs to their end (no sliver of an interval after -t).
    assert_eq!(intervals.len(), 3, "{doc:#}");
    for (i, iv) in intervals.iter().enumerate() {
        let i = i as u64;
        assert_eq!(u(iv, "/start_ns"), i * 1_000_000_000, "{doc:#}");
        if i < 2 {
            assert_eq!(u(iv, "/end_ns"), (i + 1) * 1_000_000_000, "{doc:#}");
        }
    }
    let end = u(intervals.last().expect("intervals"), "/end_ns");
    assert!(end >= 3_000_000_000, "{doc:#}");

    // Without -i, or with -i 0: none.
    for args in [&["-t", "0.2"][..], &["-t", "0.2", "-i", "0"]] {
        let doc = crr_json(&agent.target(), args);
        assert_eq!(doc["intervals"], serde_json::json!([]), "{args:?}: {doc:#}");
    }

    // CSV: an `interval` row each, after the summary, in the summary's columns.
    let (code, csv, err) = sonde(&["crr", &agent.target(), "-t", "1", "-i", "0.5", "--csv"]);
    assert_eq!(code, Some(0), "{err}");
    let lines: Vec<&str> = csv.lines().collect();
    let header: Vec<&str> = lines[0].split(',').collect();
    let col = |name: &str| {
        header
            .iter()
            .position(|h| *h == name)
            .unwrap_or_else(|| panic!("no column {name}:\n{csv}"))
    };
    let rows: Vec<Vec<&str>> = lines[1..].iter().map(|l| l.split(',').collect()).collect();
    assert_eq!(rows[0][col("row")], "summary", "{csv}");
    assert!(
        rows.len() >= 3,
        "a summary and at least 2 intervals:\n{csv}"
    );
    let mut sum = 0;
    for r in &rows[1..] {
        assert_eq!(r[col("row")], "interval", "{csv}");
        sum += r[col("transactions")].parse::<u64>().expect("a count");
    }
    assert_eq!(
        sum.to_string(),
        rows[0][col("transactions")],
        "the intervals hold the summary's transactions:\n{csv}"
    );
}

#[test]
fn crr_interval_too_short_for_the_run_is_a_usage_error() {
    let _file = crate::common::file_lock(module_path!());
    let (code, _, err) = sonde(&["crr", "127.0.0.1:1", "-t", "10", "-i", "0.001"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("more than 3600 intervals"), "{err}");
}

// ---------------------------------------------------------------------------------------------
// Bad tokens
// ---------------------------------------------------------------------------------------------

/// A crr connection with `token`: `true` when the agent closed it without a byte of response.
fn refused_unanswered(addr: SocketAddr, token: Token) -> bool {
    let mut s = TcpStream::connect(addr).expect("connect to the agent");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("a read timeout");
    let mut out = Preamble {
        version: PROTOCOL_VERSION,
        channel: Channel::Crr,
    }
    .encode()
    .to_vec();
    let join = CrrJoin {
        token,
        worker: 0,
        rst: false,
        response_size: 1,
        answer: false,
    };
    out.extend_from_slice(&join.encode());
    out.push(b'?');
    // The agent may close before the request is written: a reset then is as good as a FIN.
    let _ = s.write_all(&out);
    let mut b = [0u8; 16];
    match s.read(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
    }
}

#[test]
fn bad_tokens_are_refused_and_counted_while_a_real_test_runs() {
    let _file = crate::common::file_lock(module_path!());
    let mut cfg = AgentConfig::new(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)));
    cfg.hello_timeout = Duration::from_secs(2);
    let h = InProcessAgent::bind(cfg).expect("bind on loopback").spawn();
    let addr = h.local_addr();
    let mut cmd = common::sonde_command();
    cmd.args(["crr", &addr.to_string(), "-t", "2", "-P", "2", "--json"]);
    let line = command_line(&cmd);
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start `{line}`: {e}"));
    let child = common_child::Guard(Some(child));

    // Once the real session runs, twenty strangers guess tokens.
    let deadline = Instant::now() + Duration::from_secs(10);
    while h.sessions() == 0 {
        assert!(
            Instant::now() < deadline,
            "`{line}` never started its session"
        );
        thread::sleep(Duration::from_millis(5));
    }
    const GUESSES: u64 = 20;
    for guess in 0..GUESSES {
        assert!(
            refused_unanswered(addr, Token(0x0bad_0000 + guess)),
            "guess {guess} was answered"
        );
    }
    let out = child.wait_with_output(RUN_LIMIT);
    assert!(
        out.status.success(),
        "`{line}` failed\n--- stdout ---\n{}\n--- stderr ---\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    assert_valid(&doc);
    check_clean_run(&doc, 2);
    let deadline = Instant::now() + Duration::from_secs(5);
    while h.rejections().bad_crr.load(Ordering::Relaxed) < GUESSES && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(h.rejections().bad_crr.load(Ordering::Relaxed), GUESSES);
    assert_eq!(h.rejections().bad_join.load(Ordering::Relaxed), 0);
    h.stop();
}

#[test]
fn a_crr_test_whose_agent_stops_is_told_so() {
    let _file = crate::common::file_lock(module_path!());
    let cfg = AgentConfig::new(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)));
    let h = InProcessAgent::bind(cfg).expect("bind on loopback").spawn();
    let target = sonde_client::resolve(&h.local_addr().to_string(), 0).expect("an address");
    let (tx, rx) = std::sync::mpsc::channel();
    thread::spawn(move || {
        let opt = sonde_client::CrrOptions {
            workers: 2,
            duration: Duration::from_secs(20),
            ..sonde_client::CrrOptions::default()
        };
        let _ = tx.send(sonde_client::run(
            &target,
            &opt,
            sonde_client::Controls::new(),
        ));
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while h.sessions() == 0 {
        assert!(Instant::now() < deadline, "the crr session never started");
        thread::sleep(Duration::from_millis(5));
    }
    thread::sleep(Duration::from_millis(200));
    h.stop();
    let result = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the client ends soon after its agent");
    match result {
        Err(e @ sonde_client::ClientError::Remote(_)) => {
            assert!(e.to_string().contains("shutting down"), "{e}");
            assert_eq!(e.exit_code(), 1);
        }
        other => panic!("expected the agent's reason, got {other:?}"),
    }
}

/// A child process that is killed on drop unless waited for.
mod common_child {
    use std::io::Read;
    use std::process::{Child, Output};
    use std::thread;
    use std::time::{Duration, Instant};

    pub(crate) struct Guard(pub(crate) Option<Child>);

    impl Guard {
        /// Waits up to `limit` for the child to exit (killing it then) and returns its output.
        pub(crate) fn wait_with_output(mut self, limit: Duration) -> Output {
            let mut child = self.0.take().expect("a child");
            let mut stdout = child.stdout.take().expect("piped stdout");
            let mut stderr = child.stderr.take().expect("piped stderr");
            let out = thread::spawn(move || {
                let mut b = Vec::new();
                let _ = stdout.read_to_end(&mut b);
                b
            });
            let err = thread::spawn(move || {
                let mut b = Vec::new();
                let _ = stderr.read_to_end(&mut b);
                b
            });
            let deadline = Instant::now() + limit;
            let status = loop {
                if let Ok(Some(status)) = child.try_wait() {
                    break status;
                }
                if Instant::now() >= deadline {
                    let _ = child.kill();
                    break child.wait().expect("wait after kill");
                }
                thread::sleep(Duration::from_millis(10));
            };
            Output {
                status,
                stdout: out.join().unwrap_or_default(),
                stderr: err.join().unwrap_or_default(),
            }
        }
    }

    impl Drop for Guard {
        fn drop(&mut self) {
            if let Some(mut c) = self.0.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Errors and help
// ---------------------------------------------------------------------------------------------

#[test]
fn bad_values_are_exit_2_and_no_agent_is_exit_3() {
    let _file = crate::common::file_lock(module_path!());
    for bad in [
        &["-P", "0"][..],
        &["-m", "0"],
        &["-m", "65537"],
        &["--response-size", "100K"],
        &["-t", "0"],
        &["--timeout", "x"],
    ] {
        let mut args = vec!["crr", "127.0.0.1:1"];
        args.extend_from_slice(bad);
        let (code, _, err) = sonde(&args);
        assert_eq!(code, Some(2), "{bad:?}: {err}");
        assert!(
            err.lines().count() <= 3 && !err.is_empty(),
            "{bad:?}: {err}"
        );
    }
    // Nothing listens on a port just released.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("address").port()
    };
    let (code, out, err) = sonde(&["crr", &format!("127.0.0.1:{port}"), "-t", "0.2"]);
    assert_eq!(code, Some(3), "{out}{err}");
    assert!(
        err.starts_with("sonde: cannot connect to 127.0.0.1:"),
        "{err}"
    );
    assert_eq!(out, "");
}

#[test]
fn help_crr() {
    let _file = crate::common::file_lock(module_path!());
    let (code, out, err) = sonde(&["crr", "--help"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("Exit codes:") && out.contains("4  the server refused"),
        "{out}"
    );
    insta::assert_snapshot!("help_crr", out);
    let (code, out, _) = sonde(&["--help"]);
    assert_eq!(code, Some(0));
    assert!(out.contains("\n  sonde crr HOST "), "{out}");
}

// ---------------------------------------------------------------------------------------------
// The netns lab
// ---------------------------------------------------------------------------------------------

/// Runs `PROGRAM ARGS...` inside `ns`, which must succeed; its stdout.
fn in_ns(ns: &str, program: &str, args: &[&str]) -> String {
    let mut cmd = common::command_in(Some(ns), tool(program));
    cmd.args(args);
    common::check(&mut cmd)
}

/// The ephemeral ports of a namespace whose lab test opens its agent there: the agent's
/// listening port and the control connection take two of them.
const PORT_RANGE: (u32, u32) = (61_000, 61_063);

#[test]
fn lab_fin_closes_run_out_of_ports_and_rst_closes_do_not() {
    let _file = crate::common::file_lock(module_path!());
    if !require_or_skip(
        "lab_fin_closes_run_out_of_ports_and_rst_closes_do_not",
        &[
            Need::Root,
            Need::Cmd("ip"),
            Need::Netns,
            Need::Cmd("sysctl"),
        ],
    ) {
        return;
    }
    let ports = PORT_RANGE.1 - PORT_RANGE.0 + 1;
    let range = format!(
        "net.ipv4.ip_local_port_range={} {}",
        PORT_RANGE.0, PORT_RANGE.1
    );
    let run = |rst: bool| -> Value {
        // A fresh namespace each: the FIN run's TIME_WAITs would hold the ports for 60 s.
        let ns = Namespaces::new("crr", &["ports"]);
        let name = ns.name(0);
        // Linux reuses a port in TIME_WAIT for a new connection to the same place only on
        // loopback (tcp_tw_reuse 2, the default) or everywhere (1): off here, as between hosts.
        in_ns(
            name,
            "sysctl",
            &["-q", "-w", &range, "net.ipv4.tcp_tw_reuse=0"],
        );
        let agent = Agent::start_in(Some(name), "127.0.0.1", &["-q"]);
        let target = agent.target();
        let mut args = vec!["crr", target.as_str(), "-t", "2", "-P", "2", "-i", "0.5"];
        if rst {
            args.push("--rst");
        }
        let doc = run_json_in(Some(name), &args, CLIENT_TIMEOUT);
        assert_valid(&doc);
        doc
    };

    let fin = run(false);
    let transactions = u(&fin, "/transactions");
    eprintln!(
        "lab: FIN closes: {transactions} transactions from {ports} ports in {} ns",
        fin["client_duration_ns"]
    );
    // Every port but the agent's and the control connection's, then EADDRNOTAVAIL.
    assert!(u(&fin, "/errors/addr_not_available") >= 1, "{fin:#}");
    assert!(
        transactions > 0 && transactions <= u64::from(ports) - 2,
        "{transactions} transactions from {ports} ports: {fin:#}"
    );
    assert_eq!(u(&fin, "/agent_transactions"), transactions, "{fin:#}");
    let warning = fin["warnings"][0].as_str().unwrap_or_default();
    assert!(
        warning.starts_with("the client ran out of local ports (EADDRNOTAVAIL)"),
        "{fin:#}"
    );
    // It stopped there: the rate is over the time the ports lasted, not over -t.
    assert!(u(&fin, "/client_duration_ns") < 2_000_000_000, "{fin:#}");
    // And so do its intervals: the last holds the EADDRNOTAVAIL and ends with the test, with
    // no empty intervals made up for the rest of -t.
    let intervals = check_intervals(&fin);
    let last = intervals.last().expect("intervals");
    assert!(u(last, "/errors/addr_not_available") >= 1, "{fin:#}");
    assert!(u(last, "/end_ns") < 2_000_000_000, "{fin:#}");

    let rst = run(true);
    assert_eq!(u(&rst, "/errors/addr_not_available"), 0, "{rst:#}");
    assert_eq!(rst["close"], "rst");
    assert!(
        u(&rst, "/transactions") > u64::from(ports),
        "--rst leaves no TIME_WAIT, so {ports} ports serve more than {ports} transactions: {rst:#}"
    );
    assert_eq!(
        u(&rst, "/agent_transactions"),
        u(&rst, "/transactions"),
        "{rst:#}"
    );
    // The ports never ran out: the intervals cover all of -t.
    let intervals = check_intervals(&rst);
    assert!(intervals.len() >= 4, "{rst:#}");
    assert!(
        u(intervals.last().expect("intervals"), "/end_ns") >= 2_000_000_000,
        "{rst:#}"
    );
}

/// Client side of the SYN-loss lab, and the agent's side.
const SYN_A: &str = "198.18.0.1";
const SYN_B: &str = "198.18.0.2";
/// nftables drops every `SYN_DROP_EVERY`th SYN to the agent's port.
const SYN_DROP_EVERY: u64 = 50;
/// Linux's initial retransmission timeout (`TCP_TIMEOUT_INIT`, RFC 6298 2.1): a connect whose
/// SYN is lost takes at least this long.
const INITIAL_RTO_NS: u64 = 1_000_000_000;

#[test]
fn lab_a_lost_syn_costs_the_initial_retransmission_timeout() {
    let _file = crate::common::file_lock(module_path!());
    if !require_or_skip(
        "lab_a_lost_syn_costs_the_initial_retransmission_timeout",
        &[Need::Root, Need::Cmd("ip"), Need::Netns, Need::Cmd("nft")],
    ) {
        return;
    }
    let ns = Namespaces::new("crr", &["a", "b"]);
    let (a, b) = (ns.name(0), ns.name(1));
    veth(a, "veth-a", b, "veth-b");
    link_up(a, "veth-a", SYN_A, 1500, Segments::Whole);
    link_up(b, "veth-b", SYN_B, 1500, Segments::Whole);
    let agent = Agent::start_in(Some(b), SYN_B, &["-q"]);
    let port = agent.port().to_string();
    in_ns(b, "nft", &["add", "table", "inet", "sondecrr"]);
    in_ns(
        b,
        "nft",
        &[
            "add", "chain", "inet", "sondecrr", "input", "{", "type", "filter", "hook", "input",
            "priority", "0", ";", "policy", "accept", ";", "}",
        ],
    );
    let every = SYN_DROP_EVERY.to_string();
    in_ns(
        b,
        "nft",
        &[
            "add",
            "rule",
            "inet",
            "sondecrr",
            "input",
            "tcp",
            "dport",
            &port,
            "tcp",
            "flags",
            "&",
            "(syn|ack)",
            "==",
            "syn",
            "numgen",
            "inc",
            "mod",
            &every,
            "==",
            "0",
            "counter",
            "drop",
        ],
    );
    // 32 workers: each lost SYN stalls its worker for a second, the others go on.
    let doc = run_json_in(
        Some(a),
        &[
            "crr",
            &agent.target(),
            "-t",
            "4",
            "-P",
            "32",
            "--timeout",
            "10",
        ],
        CLIENT_TIMEOUT,
    );
    assert_valid(&doc);
    let listing = in_ns(b, "nft", &["list", "chain", "inet", "sondecrr", "input"]);
    let dropped: u64 = listing
        .split("counter packets ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no drop counter in\n{listing}"));
    let connects = u(&doc, "/connects");
    eprintln!(
        "lab: {dropped} SYNs dropped, {connects} connects; connect p50 {} ns, p90 {} ns, p99 {}, max {} ns",
        doc["connect_ns"]["p50"], doc["connect_ns"]["p90"], doc["connect_ns"]["p99"], doc["connect_ns"]["max"]
    );
    // The lab's truth: one SYN in 50 lost (control connection included), so about 2% of the
    // connects waited for the retransmission.
    assert!(dropped >= 1, "no SYN was dropped:\n{listing}\n{doc:#}");
    assert!(
        connects >= 1_000,
        "too few connects to state p99 ({connects}); the lab is too slow: {doc:#}"
    );
    assert!(
        (dropped as f64) < connects as f64 * 0.05,
        "{dropped} drops for {connects} connects: {doc:#}"
    );
    let connect = &doc["connect_ns"];
    assert!(
        u(connect, "/max") >= INITIAL_RTO_NS,
        "a lost SYN costs at least 1 s: {doc:#}"
    );
    // About 2% of the connects lost their SYN: more than 1%, fewer than 10%.
    assert!(
        dropped * 100 > connects * 3 / 2,
        "{dropped} drops for {connects} connects: {doc:#}"
    );
    assert!(u(connect, "/p99") >= INITIAL_RTO_NS, "{doc:#}");
    assert!(u(connect, "/p90") < INITIAL_RTO_NS, "{doc:#}");
    assert!(u(connect, "/p50") < INITIAL_RTO_NS / 10, "{doc:#}");
    // Slow connects are not failures, and both ends agree on what completed.
    assert_eq!(u(&doc, "/errors/timeout"), 0, "{doc:#}");
    assert_eq!(
        u(&doc, "/agent_transactions"),
        u(&doc, "/transactions"),
        "{doc:#}"
    );
}
