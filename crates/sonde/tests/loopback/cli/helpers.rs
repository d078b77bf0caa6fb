//! `--from` and `sonde server --helper` on loopback: helpers on 127.0.0.2 to .4, the target on
//! 127.0.0.5, the client on 127.0.0.1 (Linux answers on all of 127.0.0.0/8), each agent on a
//! port of its own. What the result adds up, and every refusal: a helper without `--helper`,
//! one without a secret, a wrong or missing secret, a replayed request, the helper's limits, a
//! target that refuses the helper.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;
use sonde_wire::{decode_frame, ControlMsg, Refusal};

use super::common::{u64_at, Agent};
use super::{assert_valid, run, run_ok};

const SECRET: &str = "correct horse battery staple";

/// A temporary directory with the shared secret (`secret`) and another one (`wrong`).
struct Secrets {
    _dir: tempfile::TempDir,
    right: PathBuf,
    wrong: PathBuf,
}

impl Secrets {
    fn new() -> Secrets {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let right = dir.path().join("secret");
        let wrong = dir.path().join("wrong");
        std::fs::write(&right, format!("{SECRET}\n")).expect("write the secret");
        std::fs::write(&wrong, "incorrect horse\n").expect("write another secret");
        Secrets {
            _dir: dir,
            right,
            wrong,
        }
    }

    fn right(&self) -> &str {
        self.right.to_str().expect("utf-8")
    }

    fn wrong(&self) -> &str {
        self.wrong.to_str().expect("utf-8")
    }
}

/// `sonde server --bind ADDR --port 0 EXTRA...`; logs kept (not `-q`) for the target's sessions.
fn agent(addr: &str, extra: &[&str]) -> Agent {
    Agent::start_in(None, addr, extra)
}

/// Three helpers with the secret and `--helper`, and a target with the secret.
fn lab(secrets: &Secrets) -> (Vec<Agent>, Agent) {
    let helpers = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
        .iter()
        .map(|a| agent(a, &["--helper", "--secret-file", secrets.right()]))
        .collect();
    (
        helpers,
        agent("127.0.0.5", &["--secret-file", secrets.right()]),
    )
}

/// `sonde ARGS... --from H... --secret-file S --json`: the document, checked against the schema.
fn run_from(args: &[&str], helpers: &[Agent], secret: &str) -> Value {
    let targets: Vec<String> = helpers.iter().map(Agent::target).collect();
    let mut all = args.to_vec();
    for t in &targets {
        all.extend(["--from", t.as_str()]);
    }
    all.extend(["--secret-file", secret, "--json"]);
    let doc: Value = serde_json::from_str(&run_ok(&all)).expect("one JSON document");
    assert_valid(&doc);
    doc
}

fn shares(doc: &Value) -> &Vec<Value> {
    doc["helpers"]["shares"]
        .as_array()
        .unwrap_or_else(|| panic!("no helpers.shares in\n{doc:#}"))
}

/// The workflow on loopback: three helpers send pps to one target at once. The total is
/// the sum of what the target counted for each helper's session, the helpers' flows are all
/// there, each share names its helper and its own session at the target.
#[test]
fn pps_from_three_helpers_adds_up_what_the_target_received() {
    let _file = crate::common::file_lock(module_path!());
    let secrets = Secrets::new();
    let (helpers, target) = lab(&secrets);
    let t = target.target();
    let args = [
        "pps", &t, "--flows", "4", "-m", "14", "-t", "0.5", "--gso", "off",
    ];
    let doc = run_from(&args, &helpers, secrets.right());
    assert_eq!(doc["test"], "pps");
    let shares = shares(&doc);
    assert_eq!(shares.len(), 3, "one share per --from");
    for (share, helper) in shares.iter().zip(&helpers) {
        assert_eq!(share["helper"], helper.target().as_str());
        assert!(u64_at(share, &["received"]) > 0, "{share:#}");
        assert_eq!(
            u64_at(share, &["received"]) + u64_at(share, &["lost"]),
            u64_at(share, &["sent"]),
            "{share:#}"
        );
    }
    for key in ["sent", "received", "lost"] {
        let sum: u64 = shares.iter().map(|s| u64_at(s, &[key])).sum();
        assert_eq!(
            sum,
            u64_at(&doc, &[key]),
            "the shares' {key} add up to the total"
        );
    }
    let sessions: std::collections::BTreeSet<u64> =
        shares.iter().map(|s| u64_at(s, &["session"])).collect();
    assert_eq!(
        sessions.len(),
        3,
        "each helper ran its own session at the target"
    );
    let flows = doc["flows"].as_array().expect("flows");
    assert_eq!(flows.len(), 12, "4 flows from each of 3 helpers");
    let ids: std::collections::BTreeSet<u64> = flows.iter().map(|f| u64_at(f, &["flow"])).collect();
    assert_eq!(ids.len(), 12, "flows numbered across helpers: {ids:?}");
    // The rate is the total over the common window, which covers every share's.
    let window = u64_at(&doc, &["helpers", "window_ns"]);
    assert!(window > 0);
    let rate = doc["received_pps"].as_f64().expect("received_pps");
    let expected = u64_at(&doc, &["received"]) as f64 / (window as f64 / 1e9);
    assert!(
        (rate - expected).abs() <= expected * 1e-9,
        "{rate} vs {expected}"
    );
    eprintln!(
        "pps --from x3: {} received, starts within {} ns",
        u64_at(&doc, &["received"]),
        u64_at(&doc, &["helpers", "start_spread_ns"])
    );
    // The target ran the three sessions, and nothing else.
    let log = target.stderr();
    let started = log
        .lines()
        .filter(|l| l.contains(": udp pps, 4 stream(s)"))
        .count();
    assert_eq!(started, 3, "the target's log:\n{log}");
}

/// `throughput --from` (with -P per helper) and `latency --from`: totals are the shares' sums;
/// each latency share has its own RTTs.
#[test]
fn throughput_and_latency_from_two_helpers() {
    let _file = crate::common::file_lock(module_path!());
    let secrets = Secrets::new();
    let (mut helpers, target) = lab(&secrets);
    helpers.truncate(2);
    let t = target.target();
    let doc = run_from(
        &["throughput", &t, "-P", "2", "-t", "0.5"],
        &helpers,
        secrets.right(),
    );
    let shares = shares(&doc);
    assert_eq!(shares.len(), 2);
    let received: u64 = shares.iter().map(|s| u64_at(s, &["received"])).sum();
    assert_eq!(received, u64_at(&doc, &["receiver", "bytes"]));
    assert!(shares.iter().all(|s| u64_at(s, &["received"]) > 0));
    assert_eq!(
        doc["streams"].as_array().map(Vec::len),
        Some(4),
        "-P 2 per helper"
    );

    // -O: every helper leaves its first 0.3 s out; the totals are the shares' counted windows.
    let doc = run_from(
        &["throughput", &t, "-O", "0.3", "-t", "0.5"],
        &helpers,
        secrets.right(),
    );
    assert_eq!(u64_at(&doc, &["omit_ns"]), 300_000_000);
    assert!(u64_at(&doc, &["omitted_bytes"]) > 0, "{doc:#}");
    // The target omitted from the helpers' start, not from before their hold for it.
    assert!(
        !doc["warnings"].to_string().contains("did not omit"),
        "{doc:#}"
    );
    let received: u64 = self::shares(&doc)
        .iter()
        .map(|s| u64_at(s, &["received"]))
        .sum();
    assert_eq!(received, u64_at(&doc, &["receiver", "bytes"]));

    let doc = run_from(
        &["latency", &t, "-t", "0.5", "--warmup", "0.1"],
        &helpers,
        secrets.right(),
    );
    for s in self::shares(&doc) {
        assert!(u64_at(s, &["rtt_ns", "min"]) > 0, "{s:#}");
        assert!(s["sent"].is_null(), "{s:#}");
    }
    assert_eq!(
        doc["rtt_ns"],
        self::shares(&doc)[0]["rtt_ns"],
        "the top-level RTTs are the first helper's"
    );
}

/// Runs `sonde pps TARGET --from HELPER ARGS...`, which must be refused: exit code 4 and one
/// line naming the helper and containing `says`.
fn assert_refused(target: &str, helper: &str, args: &[&str], says: &str) {
    let mut all = vec!["pps", target, "--from", helper];
    all.extend_from_slice(args);
    if !args.contains(&"-t") {
        all.extend(["-t", "0.3"]);
    }
    let r = run(&all);
    let msg = r.stderr.trim_end();
    assert_eq!(r.code, Some(4), "`sonde {}`: {msg}", all.join(" "));
    assert_eq!(msg.lines().count(), 1, "one line on stderr:\n{msg}");
    assert!(
        msg.contains(&format!("helper {helper}")) && msg.contains(says),
        "`sonde {}`: expected the helper and {says:?} in: {msg}",
        all.join(" ")
    );
    assert!(r.stdout.is_empty(), "{}", r.stdout);
}

/// Every way a helper refuses: no `--helper`, `--helper` without a secret, a wrong secret, no
/// secret at all, a test past the helper's own limits; and a target that does not admit the
/// helper. Each is exit code 4 with a line naming the helper and the reason, and the target
/// never ran a session for a refused request.
#[test]
fn helpers_refuse_unless_enabled_with_a_secret_and_proven() {
    let _file = crate::common::file_lock(module_path!());
    let secrets = Secrets::new();
    let right = secrets.right();
    let target = agent("127.0.0.5", &["--secret-file", right]);
    let t = target.target();
    let not_helper = agent("127.0.0.2", &["--secret-file", right]);
    let no_secret = agent("127.0.0.3", &["--helper"]);
    let helper = agent(
        "127.0.0.4",
        &["--helper", "--secret-file", right, "--max-duration", "1"],
    );
    let with = ["--secret-file", right];
    assert_refused(
        &t,
        &not_helper.target(),
        &with,
        "started with `sonde server --helper`",
    );
    assert_refused(
        &t,
        &no_secret.target(),
        &with,
        "has --helper but no shared secret",
    );
    let wrong = ["--secret-file", secrets.wrong()];
    assert_refused(&t, &helper.target(), &wrong, "does not match");
    assert_refused(&t, &helper.target(), &[], "requires a shared secret");
    let long = ["--secret-file", right, "-t", "5"];
    assert_refused(&t, &helper.target(), &long, "--max-duration");
    let log = target.stderr();
    assert!(!log.contains("session"), "the target ran a session:\n{log}");

    // The target requires another secret than the helper's: the helper's own handshake there is
    // refused, and the client hears it from the helper.
    let other = agent("127.0.0.6", &["--secret-file", secrets.wrong()]);
    assert_refused(
        &other.target(),
        &helper.target(),
        &with,
        "its test against the target failed",
    );
}

/// A relay between a client and an agent that records what the client sent.
fn recording_relay(agent: &str) -> (String, Arc<Mutex<Vec<u8>>>, thread::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind the relay");
    let addr = listener.local_addr().expect("relay address").to_string();
    let recorded = Arc::new(Mutex::new(Vec::new()));
    let rec = Arc::clone(&recorded);
    let agent = agent.to_owned();
    let handle = thread::spawn(move || {
        let (client, _) = listener.accept().expect("the client connects");
        let server = TcpStream::connect(&agent).expect("connect to the helper");
        let (mut c_read, mut s_write) = (
            client.try_clone().expect("clone"),
            server.try_clone().expect("clone"),
        );
        let up = thread::spawn(move || {
            let mut buf = [0u8; 4096];
            loop {
                match c_read.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        rec.lock().expect("lock").extend_from_slice(&buf[..n]);
                        if s_write.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                }
            }
            let _ = s_write.shutdown(Shutdown::Write);
        });
        let (mut s_read, mut c_write) = (server, client);
        let _ = std::io::copy(&mut s_read, &mut c_write);
        let _ = c_write.shutdown(Shutdown::Write);
        let _ = up.join();
    });
    (addr, recorded, handle)
}

/// Splits a recorded client stream into its preamble (8 bytes) and its first `n` frames.
fn first_frames(bytes: &[u8], n: usize) -> Vec<u8> {
    let mut at = 8;
    for _ in 0..n {
        let (_, used) = decode_frame(&bytes[at..])
            .expect("a valid frame")
            .expect("a whole frame");
        at += used;
    }
    bytes[..at].to_vec()
}

/// A recorded helper request, replayed byte for byte on a new connection, is refused: the
/// helper's fresh nonce makes the recorded proof worthless. The recording comes from a real
/// `sonde pps --from` run through a relay (which succeeded), so the bytes are exactly a genuine
/// client's: its preamble, `Hello` and `Help` with the proof.
#[test]
fn a_replayed_helper_request_is_refused() {
    let _file = crate::common::file_lock(module_path!());
    let secrets = Secrets::new();
    let (mut helpers, target) = lab(&secrets);
    helpers.truncate(1);
    let (relay, recorded, handle) = recording_relay(&helpers[0].target());
    let t = target.target();
    run_ok(&[
        "pps",
        &t,
        "--from",
        &relay,
        "-t",
        "0.3",
        "--secret-file",
        secrets.right(),
        "--json",
    ]);
    handle.join().expect("the relay ends with the run");
    let recorded = recorded.lock().expect("lock").clone();
    let request = first_frames(&recorded, 2);
    let help = decode_frame(&request[8..])
        .ok()
        .flatten()
        .and_then(|(_, used)| decode_frame(&request[8 + used..]).ok().flatten());
    assert!(
        matches!(help, Some((ControlMsg::Help { proof: Some(_), .. }, _))),
        "the second frame the client sent is its Help with a proof: {help:?}"
    );

    let mut replay = TcpStream::connect(helpers[0].target()).expect("connect to the helper");
    replay
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    replay.write_all(&request).expect("replay the request");
    let mut answer = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        match replay.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
        }
    }
    let (welcome, used) = decode_frame(&answer).ok().flatten().expect("a welcome");
    assert!(matches!(welcome, ControlMsg::Welcome { .. }), "{welcome:?}");
    let (refused, _) = decode_frame(&answer[used..])
        .ok()
        .flatten()
        .expect("an answer to the replayed request");
    match refused {
        ControlMsg::Refused { reason, message } => {
            assert_eq!(reason, Refusal::Unauthenticated, "{message}");
            assert!(message.contains("does not match"), "{message}");
        }
        other => panic!("the replayed request was not refused: {other:?}"),
    }
    // The one genuine run reached the target; the replay did not.
    let sessions = target.stderr().matches("session").count();
    assert!(sessions >= 1);
    thread::sleep(Duration::from_millis(200));
    assert_eq!(target.stderr().matches("session").count(), sessions);
}

/// Polls `done` every 50 ms for at most `limit`; whether it came true.
fn within(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if done() {
            return true;
        }
        thread::sleep(Duration::from_millis(50));
    }
    done()
}

/// A requester that goes away (killed mid-test) ends its helper's test: the helper stops
/// sending to the target long before the 20 s it was asked for.
#[test]
fn a_helper_stops_when_its_requester_goes_away() {
    let _file = crate::common::file_lock(module_path!());
    let secrets = Secrets::new();
    let (mut helpers, target) = lab(&secrets);
    helpers.truncate(1);
    let t = target.target();
    let h = helpers[0].target();
    let mut cmd = std::process::Command::new(super::common::sonde_bin());
    cmd.env("SONDE_DB", super::common::test_db()).args([
        "pps",
        &t,
        "--from",
        &h,
        "-t",
        "20",
        "--secret-file",
        secrets.right(),
        "--no-save",
    ]);
    let client = super::common::Daemon::spawn(&mut cmd);
    let started = within(Duration::from_secs(15), || {
        target.stderr().contains(": udp pps")
    });
    assert!(
        started,
        "the helper's session never started:\n{}",
        target.stderr()
    );
    drop(client);
    // The target logs a second line for the session when it ends.
    let ended = within(Duration::from_secs(10), || {
        target.stderr().matches("sonde agent: session").count() >= 2
    });
    assert!(
        ended,
        "the helper's test went on after its requester was gone:\n{}",
        target.stderr()
    );
}

/// `--from` is for sonde agents: a foreign target, or a sweep, is a usage error (exit code 2)
/// before anything is sent.
#[test]
fn from_with_a_foreign_target_or_a_sweep_is_a_usage_error() {
    let _file = crate::common::file_lock(module_path!());
    for args in [
        &["throughput", "iperf3://127.0.0.5", "--from", "127.0.0.2"][..],
        &["latency", "sockperf://127.0.0.5", "--from", "127.0.0.2"][..],
        &[
            "pps",
            "127.0.0.5",
            "--from",
            "127.0.0.2",
            "--sweep",
            "msg_size=14,18",
        ][..],
    ] {
        let r = run(args);
        assert_eq!(r.code, Some(2), "`sonde {}`: {}", args.join(" "), r.stderr);
        assert_eq!(r.stderr.trim_end().lines().count(), 1, "{}", r.stderr);
        assert!(r.stderr.contains("--from"), "{}", r.stderr);
    }
}

/// A helper's result document can pass the 64 KiB control frame (128 streams, each with its
/// `TCP_INFO`: about 95 KB): it comes in pieces and arrives whole.
#[test]
fn a_result_larger_than_a_control_frame_arrives_whole() {
    let _file = crate::common::file_lock(module_path!());
    let secrets = Secrets::new();
    let (mut helpers, target) = lab(&secrets);
    helpers.truncate(1);
    let t = target.target();
    let doc = run_from(
        &["throughput", &t, "-P", "128", "-t", "0.3"],
        &helpers,
        secrets.right(),
    );
    assert!(
        doc.to_string().len() > 64 * 1024,
        "the document is smaller than a frame: the test shows nothing"
    );
    assert_eq!(doc["streams"].as_array().map(Vec::len), Some(128));
    assert_eq!(
        u64_at(&doc, &["receiver", "bytes"]),
        u64_at(&shares(&doc)[0], &["received"])
    );
}

/// The issue's `from = [...]` in a plan: the helpers are endpoints, the case runs from them, and
/// the saved result holds every helper's share.
#[test]
fn a_plan_case_runs_from_helpers() {
    let _file = crate::common::file_lock(module_path!());
    let secrets = Secrets::new();
    let (mut helpers, target) = lab(&secrets);
    helpers.truncate(2);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let plan = dir.path().join("helpers.toml");
    let db = dir.path().join("results.db");
    let secret = secrets.right().replace('\\', "\\\\");
    std::fs::write(
        &plan,
        format!(
            "[endpoints]\nb = \"{}\"\na1 = \"{}\"\na2 = \"{}\"\n\n[[matrix]]\ntest = \"pps\"\n\
             target = \"b\"\nfrom = [\"a1\", \"a2\"]\ntime = \"0.3s\"\nmsg_size = 14\n\
             secret_file = \"{secret}\"\n",
            target.target(),
            helpers[0].target(),
            helpers[1].target()
        ),
    )
    .expect("write the plan");
    let (plan, db) = (plan.to_str().expect("utf-8"), db.to_str().expect("utf-8"));
    let check = run_ok(&["plan", "check", plan]);
    let from = format!(
        "--from {} --from {}",
        helpers[0].target(),
        helpers[1].target()
    );
    assert!(check.contains(&from), "the case's command line:\n{check}");
    run_ok(&["plan", "run", plan, "--db", db]);
    let doc: Value = serde_json::from_str(&run_ok(&["results", "show", "1", "--db", db, "--json"]))
        .expect("the saved document");
    assert_valid(&doc);
    let shares = shares(&doc);
    assert_eq!(shares.len(), 2);
    let sum: u64 = shares.iter().map(|s| u64_at(s, &["received"])).sum();
    assert_eq!(sum, u64_at(&doc, &["received"]));
}

/// `sonde latency -P 256 --depth 4 --from H1 --from H2`: each helper runs the many-flow test
/// (the spec passes through) against the target at once; the document is the first helper's,
/// with its 256 flows, and every helper's RTTs in its share.
#[test]
fn many_flow_latency_from_two_helpers() {
    let _file = crate::common::file_lock(module_path!());
    let secrets = Secrets::new();
    let (mut helpers, target) = lab(&secrets);
    helpers.truncate(2);
    let t = target.target();
    let doc = run_from(
        &[
            "latency", &t, "-P", "256", "--depth", "4", "-t", "0.5", "--warmup", "0.2",
        ],
        &helpers,
        secrets.right(),
    );
    let rr = &doc["request_response"];
    assert_eq!(u64_at(rr, &["flows"]), 256, "{doc:#}");
    assert_eq!(u64_at(rr, &["depth"]), 4, "{doc:#}");
    let per_flow: u64 = rr["flow_transactions"]
        .as_array()
        .expect("per-flow counts")
        .iter()
        .filter_map(Value::as_u64)
        .sum();
    assert_eq!(per_flow, u64_at(rr, &["transactions"]), "{doc:#}");
    let shares = shares(&doc);
    assert_eq!(shares.len(), 2);
    assert!(
        shares.iter().all(|s| s["rtt_ns"]["p50"].is_u64()),
        "{doc:#}"
    );
}
