//! Exit codes, a closed stdout, and an agent that shuts down under a running test.

use super::*;

// ---------------------------------------------------------------------------------------------
// Exit codes
// ---------------------------------------------------------------------------------------------

#[test]
fn no_agent_is_exit_3_with_one_line() {
    let _file = crate::common::file_lock(module_path!());
    let port = closed_port();
    let r = run(&["latency", &format!("127.0.0.1:{port}"), "-t", "0.3"]);
    assert_eq!(r.code, Some(3), "{}", r.stderr);
    assert!(r.stdout.is_empty(), "{}", r.stdout);
    let msg = r.stderr.trim_end();
    assert_eq!(msg.lines().count(), 1, "one line on stderr:\n{msg}");
    assert!(
        msg.starts_with("sonde: ") && msg.contains(&port.to_string()),
        "{msg}"
    );
}

#[test]
fn connect_error_states_its_cause_once() {
    let _file = crate::common::file_lock(module_path!());
    let port = closed_port();
    let r = run(&["throughput", &format!("127.0.0.1:{port}"), "-t", "0.3"]);
    assert_eq!(r.code, Some(3), "{}", r.stderr);
    let msg = r.stderr.trim_end();
    assert_eq!(
        msg.matches("Connection refused").count(),
        1,
        "the OS error is repeated: {msg}"
    );
}

#[test]
fn unresolvable_host_is_exit_3() {
    let _file = crate::common::file_lock(module_path!());
    let r = run(&["latency", "no-such-host.invalid", "-t", "0.3"]);
    assert_eq!(r.code, Some(3), "{}", r.stderr);
    assert!(r.stderr.contains("no-such-host.invalid"), "{}", r.stderr);
}

#[test]
fn bad_values_are_exit_2() {
    let _file = crate::common::file_lock(module_path!());
    let closed = format!("127.0.0.1:{}", closed_port());
    for args in [
        vec!["latency", "127.0.0.1", "-t", "abc"],
        vec!["latency", "127.0.0.1", "-m", "5X"],
        vec!["throughput", "127.0.0.1", "-b", "fast"],
        vec!["latency"],
        vec!["throughput", "127.0.0.1", "--json", "--csv"],
        // Checked before connecting: a closed port does not turn it into exit 3.
        vec!["throughput", &closed, "-P", "0"],
        vec!["pps", &closed, "-m", "8"],
    ] {
        let r = run(&args);
        assert_eq!(r.code, Some(2), "`sonde {}`: {}", args.join(" "), r.stderr);
        assert!(
            !r.stderr.trim().is_empty(),
            "`sonde {}` says nothing",
            args.join(" ")
        );
    }
}

/// A target of a kind the subcommand cannot test is a usage error that names what it can test,
/// before anything is resolved or sent (the hosts below resolve nowhere).
#[test]
fn a_foreign_target_the_test_cannot_use_is_exit_2() {
    let _file = crate::common::file_lock(module_path!());
    for (args, can) in [
        (
            vec!["throughput", "sockperf://no-such-host.invalid"],
            "HOST[:PORT] (a sonde agent) or iperf3://HOST[:PORT]",
        ),
        (
            vec!["latency", "iperf3://no-such-host.invalid"],
            "HOST[:PORT] (a sonde agent) or sockperf://HOST[:PORT]",
        ),
        (
            vec!["pps", "iperf3://no-such-host.invalid"],
            "HOST[:PORT] (a sonde agent)",
        ),
        (
            vec!["crr", "sockperf://no-such-host.invalid"],
            "HOST[:PORT] (a sonde agent)",
        ),
        (
            vec!["load", "iperf3://no-such-host.invalid"],
            "HOST[:PORT] (a sonde agent)",
        ),
        (
            vec!["conf", "sockperf://no-such-host.invalid"],
            "HOST[:PORT] (a sonde agent)",
        ),
    ] {
        let r = run(&args);
        assert_eq!(r.code, Some(2), "`sonde {}`: {}", args.join(" "), r.stderr);
        let want = format!(
            "sonde {} cannot test {}: its target is {can}",
            args[0], args[1]
        );
        assert!(
            r.stderr.contains(&want),
            "`sonde {}`: {}",
            args.join(" "),
            r.stderr
        );
    }
}

#[test]
fn refused_is_exit_4_and_says_why() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server(&["--max-duration", "1"]);
    let r = run(&["latency", &agent.target(), "-t", "5", "--warmup", "0.2"]);
    assert_eq!(r.code, Some(4), "{}", r.stderr);
    assert!(r.stderr.contains("refused"), "{}", r.stderr);
    assert!(
        r.stderr.contains("--max-duration"),
        "names the agent's limit: {}",
        r.stderr
    );
    assert!(r.stdout.is_empty(), "{}", r.stdout);
}

/// `sonde server --secret-file`: a client without the secret, or with another, is refused with
/// one line and exit code 4; with it (a file or `SONDE_SECRET`) every kind of test runs.
#[test]
fn an_agent_with_a_secret_refuses_clients_without_it() {
    let _file = crate::common::file_lock(module_path!());
    let dir = tempfile::tempdir().expect("a temporary directory");
    let right = dir.path().join("secret");
    let wrong = dir.path().join("wrong");
    std::fs::write(&right, "correct horse battery staple\n").expect("write the secret");
    std::fs::write(&wrong, "incorrect horse\n").expect("write another secret");
    let (right, wrong) = (
        right.to_str().expect("utf-8"),
        wrong.to_str().expect("utf-8"),
    );
    let agent = server(&["--secret-file", right]);
    let target = agent.target();
    let latency = ["latency", target.as_str(), "-t", "0.3", "--warmup", "0.1"];
    for (extra, says) in [
        (vec![], "requires a shared secret"),
        (vec!["--secret-file", wrong], "does not match"),
    ] {
        let mut args = latency.to_vec();
        args.extend(extra);
        let r = run(&args);
        assert_eq!(r.code, Some(4), "`sonde {}`: {}", args.join(" "), r.stderr);
        let msg = r.stderr.trim_end();
        assert_eq!(msg.lines().count(), 1, "one line on stderr:\n{msg}");
        assert!(msg.contains(says) && msg.contains("--secret-file"), "{msg}");
        assert!(r.stdout.is_empty(), "{}", r.stdout);
    }
    let mut args = latency.to_vec();
    args.extend(["--secret-file", right, "-u"]);
    run_ok(&args);
    for args in [
        vec!["pps", target.as_str(), "-t", "0.3"],
        vec!["throughput", target.as_str(), "-t", "0.3", "-R"],
        vec!["crr", target.as_str(), "-t", "0.3"],
        vec!["conf", target.as_str()],
    ] {
        let out = sonde()
            .env("SONDE_SECRET", "correct horse battery staple")
            .args(&args)
            .arg("--json")
            .output()
            .expect("run sonde");
        assert!(
            out.status.success(),
            "`sonde {}` with SONDE_SECRET: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // A secret file that cannot be read is a usage error, before any connection.
    let missing = dir.path().join("missing");
    let r = run(&[
        "pps",
        &target,
        "--secret-file",
        missing.to_str().expect("utf-8"),
    ]);
    assert_eq!(r.code, Some(2), "{}", r.stderr);
    assert!(r.stderr.contains("secret file"), "{}", r.stderr);
}

/// A TCP server that answers like another service (an SSH banner) and closes.
fn not_sonde() -> (SocketAddr, thread::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("address");
    let t = thread::spawn(move || {
        if let Ok((mut s, _)) = l.accept() {
            let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
            let _ = s.write_all(b"SSH-2.0-OpenSSH_9.6\r\n");
            let mut buf = [0u8; 256];
            let _ = s.read(&mut buf);
        }
    });
    (addr, t)
}

#[test]
fn a_peer_that_is_not_a_sonde_agent_is_exit_3() {
    let _file = crate::common::file_lock(module_path!());
    // `--help`: "3  could not reach a sonde agent (resolve, connect, not a sonde agent, ...)".
    let (addr, peer) = not_sonde();
    let r = run(&["latency", &addr.to_string(), "-t", "0.3"]);
    let _ = peer.join();
    assert!(r.stderr.contains("not a sonde agent"), "{}", r.stderr);
    assert_eq!(r.code, Some(3), "{}", r.stderr);
}

/// A fake agent on TCP only: it admits a UDP test, but nothing answers on the UDP port, as when
/// a firewall blocks UDP.
fn agent_without_udp() -> (SocketAddr, thread::JoinHandle<()>) {
    use sonde_wire::{
        decode_frame, encode_frame, ControlMsg, Limits, SessionId, Token, PROTOCOL_VERSION,
    };
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("address");
    let t = thread::spawn(move || {
        let Ok((mut s, _)) = l.accept() else { return };
        let _ = s.set_read_timeout(Some(Duration::from_secs(15)));
        let read_frame = |s: &mut TcpStream| -> Option<ControlMsg> {
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            for _ in 0..64 {
                if let Ok(Some((msg, _))) = decode_frame(&buf) {
                    return Some(msg);
                }
                let n = s.read(&mut chunk).ok().filter(|&n| n > 0)?;
                buf.extend_from_slice(&chunk[..n]);
            }
            None
        };
        let mut preamble = [0u8; 8];
        if s.read_exact(&mut preamble).is_err() {
            return;
        }
        let send = |s: &mut TcpStream, msg: &ControlMsg| {
            let mut out = Vec::new();
            encode_frame(msg, &mut out).expect("encodes");
            let _ = s.write_all(&out);
        };
        if !matches!(read_frame(&mut s), Some(ControlMsg::Hello { .. })) {
            return;
        }
        send(
            &mut s,
            &ControlMsg::Welcome {
                protocol: PROTOCOL_VERSION,
                software: "fake".into(),
                session: SessionId(1),
                limits: Limits {
                    max_sessions: 1,
                    max_duration_ms: 60_000,
                    max_streams: 1,
                    max_msg_size: 65_536,
                    request_response: false,
                },
                nonce: sonde_wire::auth::Nonce([0; 32]),
                secret_required: false,
            },
        );
        if !matches!(read_frame(&mut s), Some(ControlMsg::Start { .. })) {
            return;
        }
        send(
            &mut s,
            &ControlMsg::Accepted {
                token: Token(42),
                host: None,
                agent: None,
            },
        );
        // Hold the session until the client gives up.
        let mut sink = [0u8; 256];
        while matches!(s.read(&mut sink), Ok(n) if n > 0) {}
    });
    (addr, t)
}

#[test]
fn udp_blocked_is_exit_3() {
    let _file = crate::common::file_lock(module_path!());
    // `--help`: "3  could not reach a sonde agent (..., UDP blocked)". The client gives up on the
    // UDP join after 5 s.
    let (addr, fake) = agent_without_udp();
    let started = Instant::now();
    let r = run(&[
        "latency",
        &addr.to_string(),
        "-u",
        "-t",
        "0.3",
        "--warmup",
        "0.1",
    ]);
    let _ = fake.join();
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
    assert!(
        r.stderr.contains("UDP"),
        "says that UDP is the problem: {}",
        r.stderr
    );
    assert_eq!(r.code, Some(3), "{}", r.stderr);
}

/// An agent that predates many-flow latency tests (its `Welcome` limits lack
/// `request_response`) is refused before the test is asked for, with the reason: it would run
/// its one-flow test instead.
#[test]
fn an_agent_without_many_flow_tests_is_refused_with_the_reason() {
    let _file = crate::common::file_lock(module_path!());
    let (addr, fake) = agent_without_udp();
    let r = run(&["latency", &addr.to_string(), "-P", "4", "-t", "0.3"]);
    let _ = fake.join();
    assert!(
        r.stderr.contains("predates many-flow latency tests"),
        "{}",
        r.stderr
    );
    assert_ne!(r.code, Some(0), "{}", r.stderr);
}

// ---------------------------------------------------------------------------------------------
// A closed stdout
// ---------------------------------------------------------------------------------------------

/// Runs `sonde ARGS...` with its stdout closed before it writes anything (as `| head -c 0`
/// would); the exit code and stderr.
fn run_with_closed_stdout(args: &[&str]) -> (Option<i32>, String) {
    let mut child = common::sonde_piped()
        .args(args)
        .spawn()
        .expect("spawn sonde");
    drop(child.stdout.take());
    let mut stderr = child.stderr.take().expect("piped stderr");
    let reader = thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let deadline = Instant::now() + RUN_LIMIT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "`sonde {}` with a closed stdout did not finish",
                args.join(" ")
            );
        }
        thread::sleep(Duration::from_millis(20));
    };
    (status.code(), reader.join().unwrap_or_default())
}

#[test]
fn a_closed_stdout_is_not_an_error() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server(&[]);
    let target = agent.target();
    for args in [
        vec!["latency", &target, "-t", "0.3", "--warmup", "0.1"],
        vec!["latency", &target, "-t", "0.3", "--warmup", "0.1", "--json"],
        // Interval lines are printed while the test runs.
        vec!["throughput", &target, "-t", "0.5", "-i", "0.1"],
        vec!["pps", &target, "-t", "0.3", "--csv"],
    ] {
        let (code, stderr) = run_with_closed_stdout(&args);
        assert!(
            !stderr.contains("panicked"),
            "`sonde {}`:\n{stderr}",
            args.join(" ")
        );
        assert_eq!(code, Some(0), "`sonde {}`:\n{stderr}", args.join(" "));
    }
}

// ---------------------------------------------------------------------------------------------
// Server shutdown
// ---------------------------------------------------------------------------------------------

/// A `sonde server` child whose exit status the test reads; killed if the test fails first.
struct ServerChild {
    child: std::process::Child,
    target: String,
    stderr: Option<thread::JoinHandle<String>>,
}

impl ServerChild {
    fn start() -> ServerChild {
        let mut child = common::sonde_piped()
            .args(["server", "--bind", "127.0.0.1", "--port", "0"])
            .spawn()
            .expect("spawn sonde server");
        let mut stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            use std::io::BufRead;
            let mut lines = std::io::BufReader::new(&mut stdout).lines();
            if let Some(Ok(line)) = lines.next() {
                let _ = tx.send(line);
            }
            // Keep draining so the server never blocks on its stdout.
            for _ in lines {}
        });
        let mut pipe = child.stderr.take().expect("piped stderr");
        let stderr = thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            text
        });
        let line = rx.recv_timeout(Duration::from_secs(10));
        let Some((addr, port)) = line.as_deref().ok().and_then(parse_listening_line) else {
            let _ = child.kill();
            panic!("no listening line from sonde server: {line:?}");
        };
        ServerChild {
            child,
            target: format!("{addr}:{port}"),
            stderr: Some(stderr),
        }
    }
}

impl Drop for ServerChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts a server and a 5 s client test against it, sends the server SIGTERM after 0.7 s; the
/// server's exit status (`None`: still running 3 s later), its stderr, and the client's output.
fn sigterm_during_a_test() -> (
    Option<std::process::ExitStatus>,
    String,
    std::process::Output,
) {
    let mut server = ServerChild::start();
    let client = common::sonde_piped()
        .args(["throughput", &server.target, "-t", "5", "--json"])
        .spawn()
        .expect("spawn the client");
    thread::sleep(Duration::from_millis(700));
    let pid = server.child.id().to_string();
    let killed = StdCommand::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("run kill");
    assert!(killed.success());
    let signalled = Instant::now();
    let status = loop {
        if let Some(status) = server.child.try_wait().expect("wait") {
            break Some(status);
        }
        if signalled.elapsed() > Duration::from_secs(3) {
            break None;
        }
        thread::sleep(Duration::from_millis(20));
    };
    // Kill a server that did not stop, so that the client ends too.
    drop(server.child.kill());
    let client = client.wait_with_output().expect("the client ends");
    let server_err = server
        .stderr
        .take()
        .and_then(|t| t.join().ok())
        .unwrap_or_default();
    (status, server_err, client)
}

#[test]
fn sigterm_stops_the_server_within_3_s_even_mid_test() {
    let _file = crate::common::file_lock(module_path!());
    let (status, server_err, client) = sigterm_during_a_test();
    let status = status.expect("the server did not exit within 3 s of SIGTERM");
    assert!(
        status.success(),
        "the server exited with {status} on SIGTERM:\n{server_err}"
    );
    assert!(!server_err.contains("panicked"), "{server_err}");
    // The client's test was cut short: it fails (exit 1) rather than hang or claim success.
    let client_err = String::from_utf8_lossy(&client.stderr);
    assert_eq!(client.status.code(), Some(1), "{client_err}");
    assert!(client.stdout.is_empty(), "no result for a test cut short");
}

#[test]
fn a_client_whose_agent_shuts_down_is_told_so() {
    let _file = crate::common::file_lock(module_path!());
    // `sonde server --help`: "running sessions are told it is shutting down".
    let (status, _, client) = sigterm_during_a_test();
    assert!(status.is_some_and(|s| s.success()));
    let client_err = String::from_utf8_lossy(&client.stderr);
    assert!(client_err.contains("shutting down"), "{client_err}");
}

/// `sonde mesh publish`: a bad flag is exit 2, named as the flag; watching an API server it
/// cannot use, it logs the cause by name and keeps trying, and SIGTERM ends it, exit 0.
#[test]
fn mesh_publish_names_its_errors_and_ends_on_sigterm() {
    let _file = crate::common::file_lock(module_path!());
    for (args, want) in [
        (
            vec!["--label", "zone"],
            "--label \"zone\": give NAME=NODE_LABEL_KEY",
        ),
        (
            vec!["--label", "zone=not a key"],
            "--label zone = \"not a key\" is not a node label key",
        ),
        (
            vec!["--configmap", "Peers"],
            "--configmap \"Peers\" is not a ConfigMap name",
        ),
        (
            vec!["--resync", "1"],
            "--resync must be from --min-interval (5 s) to 86400 seconds, not 1",
        ),
        (
            vec!["--api-server", "http://127.0.0.1:1"],
            "--api-server = \"http://127.0.0.1:1\" must be https://",
        ),
    ] {
        let out = common::sonde_piped()
            .args(["mesh", "publish", "--once"])
            .args(&args)
            .output()
            .expect("run sonde");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {want:?} not in {err}");
    }
    let dir = tempfile::tempdir().unwrap();
    let (token, ca) = (dir.path().join("token"), dir.path().join("ca.crt"));
    std::fs::write(&token, "t\n").unwrap();
    let mut child = common::sonde_piped()
        .args([
            "mesh",
            "publish",
            "--namespace",
            "sonde",
            "--api-server",
            "https://127.0.0.1:1",
        ])
        .arg("--token-file")
        .arg(&token)
        .arg("--ca-file")
        .arg(&ca)
        .spawn()
        .expect("spawn sonde mesh publish");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(stderr)).map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    // The CA file is missing: named, once, and the publisher keeps running.
    let line = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("no log line from the publisher");
    assert!(
        line.contains("TLS with the API server, checked against the CA in")
            && line.contains("ca.crt: cannot read it"),
        "{line}"
    );
    assert!(child.try_wait().unwrap().is_none(), "it gave up: {line}");
    let killed = StdCommand::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(killed.success());
    let signalled = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            signalled.elapsed() < Duration::from_secs(30),
            "still running 30 s after SIGTERM"
        );
        thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}");
}
