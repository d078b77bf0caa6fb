//! `sonde throughput iperf3://HOST` against the real `iperf3 -s` (Debian 3.12): TCP forward,
//! `-R`, `--bidir`, `-P 3`, UDP at `-b 20M` both ways, Ctrl-C, and the error cases (busy,
//! nothing listening, a sonde agent or another service on the port).
//!
//! The numbers sonde prints are checked against the iperf3 server's own `-J` document of the
//! same run: that server is the reference. Each test starts its own `iperf3 -s --one-off` on a
//! port handed out by the OS, on 127.0.0.1 only, and sends about a second of traffic.

use crate::common;
use crate::common::json::{arr, f, u};

use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

use common::{require_or_skip, run_with_timeout, Agent, Daemon, Need, Output};

/// No sonde run in this file may take longer (each asks for 1 s of traffic).
const RUN_LIMIT: Duration = Duration::from_secs(30);

/// How long an iperf3 server may take to listen, and to exit after its one test.
const SERVER_LIMIT: Duration = Duration::from_secs(10);

fn have_iperf3(test: &str) -> bool {
    require_or_skip(test, &[Need::Cmd("iperf3")])
}

/// A port that was free a moment ago (bound by us, then released).
fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("local address").port()
}

/// Whether some socket listens on TCP `port` (any address), from `/proc/net/tcp{,6}`. Reading
/// the table leaves the server alone: a probe connection would count as a (failed) test and end
/// a `--one-off` server.
fn tcp_listening(port: u16) -> bool {
    let wanted = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|table| {
        std::fs::read_to_string(table).is_ok_and(|text| {
            text.lines().skip(1).any(|line| {
                let cols: Vec<&str> = line.split_whitespace().collect();
                // local_address is column 1, state column 3 (0A = LISTEN).
                cols.len() > 3 && cols[1].ends_with(&wanted) && cols[3] == "0A"
            })
        })
    })
}

/// `iperf3 -s -p PORT --one-off -J` on an OS-chosen port, its JSON going to a file; killed and
/// reaped on drop, its file removed.
struct Iperf3Server {
    child: Child,
    port: u16,
    json: PathBuf,
    stderr: PathBuf,
}

impl Iperf3Server {
    fn start() -> Iperf3Server {
        Self::start_with(&["--one-off", "-J"])
    }

    fn start_with(extra: &[&str]) -> Iperf3Server {
        let port = free_port();
        let dir = std::env::temp_dir();
        let tag = format!("sonde-iperf3-{}-{port}", std::process::id());
        let json = dir.join(format!("{tag}.json"));
        let stderr = dir.join(format!("{tag}.err"));
        let child = Command::new(common::tool("iperf3"))
            .args(["-s", "-B", "127.0.0.1", "-p", &port.to_string()])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(File::create(&json).expect("create the server's JSON file"))
            .stderr(File::create(&stderr).expect("create the server's stderr file"))
            .spawn()
            .expect("start iperf3 -s");
        let mut server = Iperf3Server {
            child,
            port,
            json,
            stderr,
        };
        let deadline = Instant::now() + SERVER_LIMIT;
        while !tcp_listening(port) {
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!(
                    "iperf3 -s exited ({status}) before listening on {port}:\n{}",
                    server.output()
                );
            }
            assert!(
                Instant::now() < deadline,
                "iperf3 -s not listening on {port} within {SERVER_LIMIT:?}"
            );
            thread::sleep(Duration::from_millis(20));
        }
        server
    }

    fn target(&self) -> String {
        format!("iperf3://127.0.0.1:{}", self.port)
    }

    /// What the server printed so far (stdout, then stderr).
    fn output(&self) -> String {
        let read = |p: &PathBuf| std::fs::read_to_string(p).unwrap_or_default();
        format!("{}{}", read(&self.json), read(&self.stderr))
    }

    /// Waits for the one-off server to finish its test and exit; its `-J` document.
    fn document(mut self) -> Value {
        let deadline = Instant::now() + SERVER_LIMIT;
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(20)),
                _ => panic!(
                    "iperf3 -s --one-off did not exit within {SERVER_LIMIT:?} after the test:\n{}",
                    self.output()
                ),
            }
        }
        let text = self.output();
        serde_json::from_str(&std::fs::read_to_string(&self.json).unwrap_or_default())
            .unwrap_or_else(|e| panic!("iperf3 -s -J printed no JSON document ({e}):\n{text}"))
    }
}

impl Drop for Iperf3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.json);
        let _ = std::fs::remove_file(&self.stderr);
    }
}

fn sonde(args: &[&str]) -> Output {
    let mut cmd = common::sonde_command();
    cmd.args(args).env("COLUMNS", "100").env("TERM", "dumb");
    run_with_timeout(&mut cmd, RUN_LIMIT).unwrap_or_else(|e| panic!("{e}"))
}

/// `sonde throughput iperf3://... ARGS --json` against `server`: sonde's document (checked
/// against the schema) and the server's own document of the same run.
fn run_against(server: Iperf3Server, args: &[&str]) -> (Value, Value) {
    let target = server.target();
    let mut all = vec!["throughput", target.as_str()];
    all.extend_from_slice(args);
    all.push("--json");
    let out = sonde(&all);
    assert!(
        out.status.success(),
        "`sonde {}` failed ({})\n--- stdout ---\n{}\n--- stderr ---\n{}\n--- iperf3 -s ---\n{}",
        all.join(" "),
        out.status,
        out.stdout,
        out.stderr,
        server.output()
    );
    let doc: Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "`sonde {}`: not one JSON document ({e}):\n{}",
            all.join(" "),
            out.stdout
        )
    });
    assert_valid(&doc);
    let theirs = server.document();
    assert!(
        theirs.get("error").is_none(),
        "the iperf3 server reports an error:\n{theirs:#}"
    );
    (doc, theirs)
}

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
}

fn warnings(doc: &Value) -> String {
    arr(doc, "/warnings")
        .iter()
        .filter_map(Value::as_str)
        .collect::<Vec<_>>()
        .join("\n")
}

/// What every iperf3 document of sonde's shares.
fn check_common(doc: &Value, protocol: &str, direction: &str, streams: usize) {
    assert_eq!(doc["test"], "throughput", "{doc:#}");
    assert_eq!(doc["peer"], "iperf3", "{doc:#}");
    assert_eq!(doc["session"], 0, "{doc:#}");
    assert_eq!(doc["protocol"], protocol, "{doc:#}");
    assert_eq!(doc["direction"], direction, "{doc:#}");
    assert_eq!(arr(doc, "/streams").len(), streams, "{doc:#}");
    assert!(u(doc, "/receiver/bytes") > 0, "nothing received:\n{doc:#}");
    let sum: u64 = arr(doc, "/streams")
        .iter()
        .map(|s| u(s, "/receiver/bytes"))
        .sum();
    assert_eq!(sum, u(doc, "/receiver/bytes"), "{doc:#}");
}

/// Bytes that sonde says were received on its streams in `direction`.
fn received(doc: &Value, direction: &str) -> Vec<u64> {
    arr(doc, "/streams")
        .iter()
        .filter(|s| s["direction"] == direction)
        .map(|s| u(s, "/receiver/bytes"))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// TCP
// ---------------------------------------------------------------------------------------------

#[test]
fn tcp_forward_receiver_bytes_are_the_iperf3_servers() {
    let _file = crate::common::file_lock(module_path!());
    if !have_iperf3("tcp_forward_receiver_bytes_are_the_iperf3_servers") {
        return;
    }
    let (doc, theirs) = run_against(Iperf3Server::start(), &["-t", "1"]);
    check_common(&doc, "tcp", "forward", 1);
    // This end's configuration and CPU are known; an iperf3 server tells neither.
    let uname = std::process::Command::new("uname")
        .arg("-r")
        .output()
        .unwrap();
    assert_eq!(
        doc["hosts"]["client"]["kernel_release"],
        String::from_utf8_lossy(&uname.stdout).trim(),
        "{doc:#}"
    );
    assert!(doc["hosts"]["server"].is_null(), "{doc:#}");
    assert!(
        u(&doc, "/cpu/client/user_ns") + u(&doc, "/cpu/client/system_ns") > 0,
        "{doc:#}"
    );
    assert!(doc["cpu"]["server"].is_null(), "{doc:#}");
    assert!(
        doc["server"]
            .as_str()
            .is_some_and(|s| s.starts_with("iperf3://127.0.0.1:")),
        "{doc:#}"
    );
    // What the iperf3 server counted is what sonde reports as received, to the byte.
    assert_eq!(
        u(&doc, "/receiver/bytes"),
        u(&theirs, "/end/sum_received/bytes"),
        "sonde:\n{doc:#}\niperf3 -s:\n{theirs:#}"
    );
    // The sender's figure is sonde's own, and at least what arrived.
    assert!(
        u(&doc, "/sender/bytes") >= u(&doc, "/receiver/bytes"),
        "{doc:#}"
    );
    assert_eq!(doc["streams"][0]["direction"], "client_to_server");
    // The server's read count is unknown: said so.
    assert!(warnings(&doc).contains("iperf3"), "{doc:#}");
}

#[test]
fn tcp_parallel_streams_match_the_iperf3_servers_per_stream() {
    let _file = crate::common::file_lock(module_path!());
    if !have_iperf3("tcp_parallel_streams_match_the_iperf3_servers_per_stream") {
        return;
    }
    let (doc, theirs) = run_against(Iperf3Server::start(), &["-t", "1", "-P", "3"]);
    check_common(&doc, "tcp", "forward", 3);
    // The server lists its streams in accept order, which is the order sonde opened them in.
    let server_streams: Vec<u64> = arr(&theirs, "/end/streams")
        .iter()
        .map(|s| u(s, "/receiver/bytes"))
        .collect();
    assert_eq!(
        received(&doc, "client_to_server"),
        server_streams,
        "sonde:\n{doc:#}\niperf3 -s:\n{theirs:#}"
    );
    assert_eq!(
        u(&doc, "/receiver/bytes"),
        u(&theirs, "/end/sum_received/bytes")
    );
}

#[test]
fn tcp_reverse_receives_what_the_iperf3_server_sent() {
    let _file = crate::common::file_lock(module_path!());
    if !have_iperf3("tcp_reverse_receives_what_the_iperf3_server_sent") {
        return;
    }
    let (doc, theirs) = run_against(Iperf3Server::start(), &["-t", "1", "-R"]);
    check_common(&doc, "tcp", "reverse", 1);
    assert_eq!(doc["streams"][0]["direction"], "server_to_client");
    let sent = u(&theirs, "/end/sum_sent/bytes");
    let got = u(&doc, "/receiver/bytes");
    // sonde counts at its receiver; it cannot receive more than was sent, and it drains the
    // streams to their end, so nearly all of it.
    assert!(
        got <= sent,
        "received {got} > sent {sent}\n{doc:#}\n{theirs:#}"
    );
    assert!(
        got as f64 >= sent as f64 * 0.99,
        "received {got} of {sent}\n{doc:#}\n{theirs:#}"
    );
    // The sender's figure is the server's own count.
    assert_eq!(u(&doc, "/sender/bytes"), sent, "{doc:#}\n{theirs:#}");
}

/// Issue 19: the socket options reach the iperf3 server in its own keys, and it applies them
/// (its own document says so), while this host applies them to its end.
#[test]
fn socket_options_reach_the_iperf3_server() {
    let _file = crate::common::file_lock(module_path!());
    if !have_iperf3("socket_options_reach_the_iperf3_server") {
        return;
    }
    let (doc, theirs) = run_against(
        Iperf3Server::start(),
        &[
            "-t", "1", "-R", "-C", "reno", "-w", "512K", "--dscp", "af21", "-M", "1200",
        ],
    );
    check_common(&doc, "tcp", "reverse", 1);
    // The server sent (-R) with reno, as its document says, and took the TOS byte and MSS.
    assert_eq!(theirs["end"]["sender_tcp_congestion"], "reno", "{theirs:#}");
    assert_eq!(u(&theirs, "/start/test_start/tos"), 18 << 2, "{theirs:#}");
    // This host's end, as its kernel applied them; the server's is not reported.
    assert_eq!(doc["socket"]["client"]["congestion"], "reno", "{doc:#}");
    assert_eq!(u(&doc, "/socket/client/tos"), 18 << 2, "{doc:#}");
    assert!(doc["socket"]["server"].is_null(), "{doc:#}");
    assert!(
        !arr(&doc, "/warning_codes")
            .iter()
            .any(|c| c == "socket_option_differs"),
        "{doc:#}"
    );
}

/// `-n` and `-k` against a real iperf3 server: this host sends exactly the count and the
/// server's own document received exactly it; with `-R` the test ends once this host has
/// received the count (as iperf3's client ends it), and the server was told the count.
#[test]
fn byte_and_block_counts_end_the_test_at_the_count() {
    let _file = crate::common::file_lock(module_path!());
    if !have_iperf3("byte_and_block_counts_end_the_test_at_the_count") {
        return;
    }
    // -n 24M over 2 streams, and -k 300 writes of 64 KiB.
    for (args, streams, total) in [
        (vec!["-n", "24M", "-P", "2"], 2, 24u64 << 20),
        (vec!["-k", "300", "-l", "64K"], 1, 300 << 16),
    ] {
        let (doc, theirs) = run_against(Iperf3Server::start(), &args);
        check_common(&doc, "tcp", "forward", streams);
        assert_eq!(
            u(&doc, "/sender/bytes"),
            total,
            "{args:?}: sonde sent\n{doc:#}"
        );
        assert_eq!(
            u(&theirs, "/end/sum_received/bytes"),
            total,
            "{args:?}: the server received\n{theirs:#}"
        );
        assert_eq!(u(&doc, "/receiver/bytes"), total, "{args:?}\n{doc:#}");
        assert_eq!(u(&doc, "/duration_ns"), 0, "{doc:#}");
    }
    let (doc, theirs) = run_against(Iperf3Server::start(), &["-n", "24M", "-R"]);
    check_common(&doc, "tcp", "reverse", 1);
    assert_eq!(
        u(&theirs, "/start/test_start/bytes"),
        24 << 20,
        "{theirs:#}"
    );
    assert!(
        u(&doc, "/receiver/bytes") >= 24 << 20,
        "the test ended before the count arrived:\n{doc:#}"
    );
    assert_eq!(u(&doc, "/bytes_to_send"), 24 << 20, "{doc:#}");
}

/// `-O 1` against a real iperf3 server: the server was asked to omit 1 s (its document says
/// so and marks its first second's intervals omitted); sonde's own intervals of that second are
/// marked omitted, its counts leave them out, and with `-R` it reports what its receivers got in
/// the omit period. A fraction of a second is refused: iperf3 takes whole seconds.
#[test]
fn omit_asks_the_iperf3_server_to_leave_out_the_first_seconds() {
    let _file = crate::common::file_lock(module_path!());
    if !have_iperf3("omit_asks_the_iperf3_server_to_leave_out_the_first_seconds") {
        return;
    }
    for reverse in [false, true] {
        let mut args = vec!["-O", "1", "-t", "1", "-i", "0.5"];
        if reverse {
            args.push("-R");
        }
        let (doc, theirs) = run_against(Iperf3Server::start(), &args);
        check_common(&doc, "tcp", if reverse { "reverse" } else { "forward" }, 1);
        assert_eq!(u(&theirs, "/start/test_start/omit"), 1, "{theirs:#}");
        assert!(
            arr(&theirs, "/intervals")
                .iter()
                .any(|iv| iv["sum"]["omitted"] == true),
            "the server marked no interval omitted:\n{theirs:#}"
        );
        assert_eq!(u(&doc, "/omit_ns"), 1_000_000_000, "{doc:#}");
        let intervals = arr(&doc, "/intervals");
        for iv in intervals.iter() {
            let omitted = iv["omitted"] == true;
            assert_eq!(
                omitted,
                u(iv, "/end_ns") <= 1_000_000_000,
                "reverse {reverse}: {iv:#}"
            );
        }
        assert!(intervals.iter().any(|iv| iv["omitted"] == true), "{doc:#}");
        assert!(intervals.iter().any(|iv| iv["omitted"] != true), "{doc:#}");
        if reverse {
            // This host received: it knows what the omit period brought, and left it out.
            let omitted = u(&doc, "/omitted_bytes");
            assert!(omitted > 0, "{doc:#}");
            let counted: u64 = intervals
                .iter()
                .filter(|iv| iv["omitted"] != true)
                .map(|iv| u(iv, "/bytes"))
                .sum();
            assert!(counted <= u(&doc, "/receiver/bytes") + omitted, "{doc:#}");
        } else {
            assert!(doc["omitted_bytes"].is_null(), "{doc:#}");
        }
    }
    let out = sonde(&["throughput", "iperf3://127.0.0.1:9", "-O", "0.5"]);
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("whole seconds"), "{}", out.stderr);
}

/// Two consecutive ports free for both TCP and UDP on 127.0.0.3 a moment ago.
fn free_port_pair() -> u16 {
    for _ in 0..100 {
        let first = free_port();
        let Some(second) = first.checked_add(1) else {
            continue;
        };
        let free = |p: u16| {
            std::net::TcpListener::bind(("127.0.0.3", p)).is_ok()
                && std::net::UdpSocket::bind(("127.0.0.3", p)).is_ok()
        };
        if free(first) && free(second) {
            return first;
        }
    }
    panic!("no two consecutive free ports on 127.0.0.3");
}

/// `-B` and `--cport` against a real iperf3 server: its own document sees the control
/// connection from the `-B` address and each stream from its `--cport` port, and sonde's
/// `sources` say the same.
#[test]
fn bind_and_cport_are_where_the_iperf3_server_sees_the_streams_from() {
    let _file = crate::common::file_lock(module_path!());
    if !have_iperf3("bind_and_cport_are_where_the_iperf3_server_sees_the_streams_from") {
        return;
    }
    for udp in [false, true] {
        let first = free_port_pair();
        let cport = format!("{first}-{}", first + 1);
        let mut args = vec!["-t", "0.5", "-P", "2", "-B", "127.0.0.3", "--cport", &cport];
        if udp {
            args.extend(["-u", "-b", "10M"]);
        }
        let (doc, theirs) = run_against(Iperf3Server::start(), &args);
        check_common(&doc, if udp { "udp" } else { "tcp" }, "forward", 2);
        assert_eq!(
            theirs["start"]["accepted_connection"]["host"], "127.0.0.3",
            "{theirs:#}"
        );
        let mut seen: Vec<String> = arr(&theirs, "/start/connected")
            .iter()
            .map(|c| {
                format!(
                    "{}:{}",
                    c["remote_host"].as_str().unwrap_or("?"),
                    u(c, "/remote_port")
                )
            })
            .collect();
        seen.sort();
        let want = vec![
            format!("127.0.0.3:{first}"),
            format!("127.0.0.3:{}", first + 1),
        ];
        assert_eq!(seen, want, "udp {udp}: the server's view\n{theirs:#}");
        let ours: Vec<String> = arr(&doc, "/sources")
            .iter()
            .map(|s| s["client"].as_str().unwrap_or("?").to_owned())
            .collect();
        assert_eq!(ours, want, "udp {udp}: sonde's view\n{doc:#}");
    }
}

/// `-Z` against an iperf3 server: this host sends with `MSG_ZEROCOPY` and accounts for each send
/// (loopback copies every one: a warning, not a claim); the server (asked with iperf3's
/// `zerocopy` key, which 3.12 takes) still receives every byte, and reports nothing of its own.
#[test]
#[cfg(target_os = "linux")]
fn zerocopy_sends_reach_the_iperf3_server_whole() {
    let _file = crate::common::file_lock(module_path!());
    if !have_iperf3("zerocopy_sends_reach_the_iperf3_server_whole") {
        return;
    }
    let (doc, theirs) = run_against(Iperf3Server::start(), &["-t", "1", "-Z"]);
    check_common(&doc, "tcp", "forward", 1);
    assert_eq!(
        u(&doc, "/receiver/bytes"),
        u(&theirs, "/end/sum_received/bytes")
    );
    assert_eq!(
        u(&doc, "/zerocopy/client/sends"),
        u(&doc, "/sender/packets"),
        "{doc:#}"
    );
    assert_eq!(
        u(&doc, "/zerocopy/client/copied"),
        u(&doc, "/zerocopy/client/completed"),
        "{doc:#}"
    );
    assert!(doc["zerocopy"]["server"].is_null(), "{doc:#}");
    assert!(
        arr(&doc, "/warning_codes")
            .iter()
            .any(|c| c == "zerocopy_copied"),
        "{doc:#}"
    );
}

#[test]
fn tcp_bidir_reports_both_receivers() {
    let _file = crate::common::file_lock(module_path!());
    if !have_iperf3("tcp_bidir_reports_both_receivers") {
        return;
    }
    let (doc, theirs) = run_against(Iperf3Server::start(), &["-t", "1", "--bidir", "-i", "0.5"]);
    check_common(&doc, "tcp", "bidir", 2);
    // Client to server: the iperf3 server's count. Server to client: sonde's own.
    assert_eq!(
        received(&doc, "client_to_server"),
        vec![u(&theirs, "/end/sum_received/bytes")],
        "{doc:#}\n{theirs:#}"
    );
    let sent_back = u(&theirs, "/end/sum_sent_bidir_reverse/bytes");
    let got_back = received(&doc, "server_to_client");
    assert_eq!(got_back.len(), 1, "{doc:#}");
    assert!(
        got_back[0] <= sent_back && got_back[0] as f64 >= sent_back as f64 * 0.99,
        "received {} of {sent_back}\n{doc:#}\n{theirs:#}",
        got_back[0]
    );
    // -i: intervals, and a warning saying where each direction was counted.
    assert!(!arr(&doc, "/intervals").is_empty(), "{doc:#}");
    assert!(warnings(&doc).contains("interval"), "{doc:#}");
}

#[test]
fn tcp_forward_intervals_are_labelled_as_the_senders() {
    let _file = crate::common::file_lock(module_path!());
    if !have_iperf3("tcp_forward_intervals_are_labelled_as_the_senders") {
        return;
    }
    let (doc, _) = run_against(Iperf3Server::start(), &["-t", "1", "-i", "0.25"]);
    let intervals = arr(&doc, "/intervals");
    assert!(intervals.len() >= 3, "{doc:#}");
    let total: u64 = intervals.iter().map(|iv| u(iv, "/bytes")).sum();
    // Counted at this sender: they add up to what sonde sent, not to what the server received.
    assert_eq!(total, u(&doc, "/sender/bytes"), "{doc:#}");
    assert_eq!(doc["intervals_counted_at"], "sender", "{doc:#}");
    let w = warnings(&doc);
    assert!(w.contains("interval") && w.contains("sender"), "{w}");
}

// ---------------------------------------------------------------------------------------------
// UDP
// ---------------------------------------------------------------------------------------------

#[test]
fn udp_forward_loss_and_packets_are_the_iperf3_servers() {
    let _file = crate::common::file_lock(module_path!());
    if !have_iperf3("udp_forward_loss_and_packets_are_the_iperf3_servers") {
        return;
    }
    let (doc, theirs) = run_against(
        Iperf3Server::start(),
        &["-t", "1", "-u", "-b", "20M", "-l", "1400"],
    );
    check_common(&doc, "udp", "forward", 1);
    let sum = "/end/sum_received";
    assert_eq!(u(&doc, "/lost"), u(&theirs, &format!("{sum}/lost_packets")));
    // The server's `packets` is the highest sequence number it saw: received plus lost.
    assert_eq!(
        u(&doc, "/receiver/packets") + u(&doc, "/lost"),
        u(&theirs, &format!("{sum}/packets")),
        "{doc:#}\n{theirs:#}"
    );
    assert_eq!(
        u(&doc, "/receiver/bytes"),
        u(&theirs, &format!("{sum}/bytes"))
    );
    let jitter_ms = f(&theirs, &format!("{sum}/jitter_ms"));
    let jitter_ns = u(&doc, "/jitter_ns") as f64;
    assert!(
        (jitter_ns - jitter_ms * 1e6).abs() <= 1.0 + jitter_ms * 1e3,
        "jitter {jitter_ns} ns vs the server's {jitter_ms} ms"
    );
    // iperf3 does not report duplicates: null, not 0, and said why.
    assert!(doc["duplicated"].is_null(), "{doc:#}");
    assert!(warnings(&doc).contains("duplicate"), "{doc:#}");
    // 20 Mbit/s in 1400-byte datagrams for 1 s: about 1,786 sent.
    let sent = u(&doc, "/sender/packets");
    assert!((1_000..=2_500).contains(&sent), "{sent}\n{doc:#}");
    assert_eq!(u(&doc, "/target_bits_per_second"), 20_000_000);
}

#[test]
fn udp_reverse_counts_against_what_the_iperf3_server_sent() {
    let _file = crate::common::file_lock(module_path!());
    if !have_iperf3("udp_reverse_counts_against_what_the_iperf3_server_sent") {
        return;
    }
    let (doc, theirs) = run_against(
        Iperf3Server::start(),
        &["-t", "1", "-u", "-b", "20M", "-R", "-l", "1400"],
    );
    check_common(&doc, "udp", "reverse", 1);
    let sent = u(&theirs, "/end/sum_sent/packets");
    assert_eq!(u(&doc, "/sender/packets"), sent, "{doc:#}\n{theirs:#}");
    assert_eq!(
        u(&doc, "/receiver/packets") + u(&doc, "/lost"),
        sent,
        "{doc:#}\n{theirs:#}"
    );
    assert_eq!(
        u(&doc, "/sender/bytes"),
        u(&theirs, "/end/sum_sent/bytes"),
        "{doc:#}\n{theirs:#}"
    );
    // sonde's own receiver counts duplicates and reordering.
    assert!(doc["duplicated"].is_u64(), "{doc:#}");
    assert!(doc["reordered"].is_u64(), "{doc:#}");
    assert!(doc["jitter_ns"].is_u64(), "{doc:#}");
}

// ---------------------------------------------------------------------------------------------
// Errors and interrupts
// ---------------------------------------------------------------------------------------------

fn one_line(r: &Output) -> String {
    let msg = r.stderr.trim_end().to_owned();
    assert_eq!(msg.lines().count(), 1, "one line on stderr:\n{msg}");
    assert!(r.stdout.is_empty(), "{}", r.stdout);
    msg
}

#[test]
fn a_busy_iperf3_server_is_exit_4() {
    let _file = crate::common::file_lock(module_path!());
    if !have_iperf3("a_busy_iperf3_server_is_exit_4") {
        return;
    }
    let server = Iperf3Server::start();
    // The real client holds the server with a long test; killed on drop.
    let mut holder = Daemon::spawn(Command::new(common::tool("iperf3")).args([
        "-c",
        "127.0.0.1",
        "-p",
        &server.port.to_string(),
        "-t",
        "20",
        "-i",
        "1",
        "--forceflush",
    ]));
    holder.wait_for_line(SERVER_LIMIT, |l| l.contains("connected to").then_some(()));
    let r = sonde(&["throughput", &server.target(), "-t", "1"]);
    let msg = one_line(&r);
    assert_eq!(r.status.code(), Some(4), "{msg}");
    assert!(msg.contains("busy"), "{msg}");
}

#[test]
fn nothing_listening_is_exit_3() {
    let _file = crate::common::file_lock(module_path!());
    let port = free_port();
    let r = sonde(&[
        "throughput",
        &format!("iperf3://127.0.0.1:{port}"),
        "-t",
        "1",
    ]);
    let msg = one_line(&r);
    assert_eq!(r.status.code(), Some(3), "{msg}");
    assert!(msg.contains(&port.to_string()), "{msg}");
}

#[test]
fn a_sonde_agent_is_not_an_iperf3_server() {
    let _file = crate::common::file_lock(module_path!());
    let agent = Agent::start("127.0.0.1");
    let target = format!("iperf3://{}", agent.target());
    let started = Instant::now();
    let r = sonde(&["throughput", &target, "-t", "1"]);
    let msg = one_line(&r);
    assert_eq!(r.status.code(), Some(3), "{msg}");
    assert!(msg.contains("not an iperf3 server"), "{msg}");
    // Told within the handshake timeout, not after a test's worth of waiting.
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
}

/// A TCP server that answers every connection with `reply` (after reading what came), or says
/// nothing when `reply` is `None`, and holds the connection for up to `hold`.
fn fake_server(
    reply: Option<&'static [u8]>,
    hold: Duration,
) -> (SocketAddr, thread::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("address");
    let t = thread::spawn(move || {
        if let Ok((mut s, _)) = l.accept() {
            let _ = s.set_read_timeout(Some(hold));
            let mut buf = [0u8; 37];
            let _ = s.read_exact(&mut buf);
            if let Some(reply) = reply {
                let _ = s.write_all(reply);
            }
            let mut sink = [0u8; 256];
            while matches!(s.read(&mut sink), Ok(n) if n > 0) {}
        }
    });
    (addr, t)
}

#[test]
fn an_http_server_is_not_an_iperf3_server() {
    let _file = crate::common::file_lock(module_path!());
    let (addr, peer) = fake_server(
        Some(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"),
        Duration::from_secs(5),
    );
    let r = sonde(&["throughput", &format!("iperf3://{addr}"), "-t", "1"]);
    let _ = peer.join();
    let msg = one_line(&r);
    assert_eq!(r.status.code(), Some(3), "{msg}");
    assert!(msg.contains("not an iperf3 server"), "{msg}");
}

#[test]
fn a_silent_server_times_out_as_not_iperf3() {
    let _file = crate::common::file_lock(module_path!());
    let (addr, peer) = fake_server(None, Duration::from_secs(20));
    let r = sonde(&["throughput", &format!("iperf3://{addr}"), "-t", "1"]);
    let msg = one_line(&r);
    drop(peer);
    assert_eq!(r.status.code(), Some(3), "{msg}");
    assert!(msg.contains("not an iperf3 server"), "{msg}");
}

#[test]
fn a_server_error_shows_iperf3s_message_and_is_exit_4() {
    let _file = crate::common::file_lock(module_path!());
    // PARAM_EXCHANGE, then (after our parameters) SERVER_ERROR IESETMSS (123) with EINVAL (22):
    // the bytes a 3.12 server sent in docs/protocols/iperf3.md §2.
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("address");
    let peer = thread::spawn(move || {
        let Ok((mut s, _)) = l.accept() else { return };
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        let mut cookie = [0u8; 37];
        if s.read_exact(&mut cookie).is_err() || s.write_all(&[0x09]).is_err() {
            return;
        }
        let mut len = [0u8; 4];
        if s.read_exact(&mut len).is_err() {
            return;
        }
        let mut params = vec![0u8; u32::from_be_bytes(len).min(65_536) as usize];
        if s.read_exact(&mut params).is_err() {
            return;
        }
        let _ = s.write_all(&[0xfe, 0, 0, 0, 0x7b, 0, 0, 0, 0x16]);
    });
    let r = sonde(&["throughput", &format!("iperf3://{addr}"), "-t", "1"]);
    let _ = peer.join();
    let msg = one_line(&r);
    assert_eq!(r.status.code(), Some(4), "{msg}");
    assert!(msg.contains("MSS"), "{msg}");
    assert!(msg.contains("Invalid argument"), "{msg}");
}

#[test]
fn ctrl_c_tells_the_iperf3_server_and_exits_130() {
    let _file = crate::common::file_lock(module_path!());
    if !have_iperf3("ctrl_c_tells_the_iperf3_server_and_exits_130") {
        return;
    }
    // Without -J the server prints why its test ended.
    let server = Iperf3Server::start_with(&["--one-off", "--forceflush"]);
    let mut child = common::sonde_command()
        .args(["throughput", &server.target(), "-t", "10"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn sonde");
    // Wait until the test runs (the server says it accepted the connection), then SIGINT.
    let deadline = Instant::now() + SERVER_LIMIT;
    while !server.output().contains("connected to") {
        assert!(
            Instant::now() < deadline,
            "no test started:\n{}",
            server.output()
        );
        thread::sleep(Duration::from_millis(20));
    }
    thread::sleep(Duration::from_millis(300));
    let killed = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill -INT");
    assert!(killed.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for sonde") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("sonde did not end within 10 s of SIGINT");
        }
        thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut stderr);
    }
    assert_eq!(status.code(), Some(130), "{stderr}");
    // The server heard CLIENT_TERMINATE, rather than a connection that just went away.
    let deadline = Instant::now() + SERVER_LIMIT;
    while !server.output().contains("client has terminated") {
        assert!(
            Instant::now() < deadline,
            "the iperf3 server was not told:\n{}",
            server.output()
        );
        thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_table_names_the_iperf3_peer() {
    let _file = crate::common::file_lock(module_path!());
    if !have_iperf3("the_table_names_the_iperf3_peer") {
        return;
    }
    let server = Iperf3Server::start();
    let r = sonde(&["throughput", &server.target(), "-t", "1"]);
    assert_eq!(
        r.status.code(),
        Some(0),
        "{}\n{}",
        r.stderr,
        server.output()
    );
    let first = r.stdout.lines().next().unwrap_or_default();
    assert!(
        first.contains(&format!("server {},", server.target())),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout.contains("throughput at the receiver"),
        "{}",
        r.stdout
    );
}

/// A sweep runs its steps back to back against one iperf3 server, which closes and re-opens
/// its listener after each test: every step must still find it (it once got "busy" or a
/// reset at the second step).
#[test]
fn a_sweep_runs_every_step_against_a_real_iperf3_server() {
    let _file = crate::common::file_lock(module_path!());
    if !have_iperf3("a_sweep_runs_every_step_against_a_real_iperf3_server") {
        return;
    }
    let server = Iperf3Server::start_with(&[]);
    let target = server.target();
    let out = sonde(&[
        "throughput",
        &target,
        "-t",
        "1",
        "--sweep",
        "parallel=1,2,1",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}\n{}\n--- iperf3 -s ---\n{}",
        out.stdout,
        out.stderr,
        server.output()
    );
    let doc: Value = serde_json::from_str(&out.stdout).expect("one JSON document");
    assert_valid(&doc);
    assert_eq!(doc["test"], "sweep", "{doc:#}");
    let steps = arr(&doc, "/steps");
    let values: Vec<u64> = steps.iter().map(|s| u(s, "/value")).collect();
    assert_eq!(values, [1, 2, 1], "{doc:#}");
    for step in steps {
        let r = &step["result"];
        assert_eq!(arr(r, "/streams").len() as u64, u(step, "/value"), "{r:#}");
        assert!(u(r, "/receiver/bytes") > 0, "{r:#}");
    }
}
