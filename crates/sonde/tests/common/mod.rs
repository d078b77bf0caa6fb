//! Helpers shared by the end-to-end tests: prerequisites that skip (or, in CI, fail), an agent
//! child process that dies with its guard, and the client run with `--json` under a time limit.
//!
//! Each of the three test binaries (`loopback`, `lab`, `peers`) includes this once, as `mod
//! common;` in its `main.rs`, and uses part of it.
#![allow(dead_code)]

/// The kernel's count of what crossed a lab link, the reference for throughput readings.
pub(crate) mod flow;
/// `--full-log` files: a temporary path and a reader.
pub(crate) mod fulllog;
/// Reading result documents by JSON pointer.
pub(crate) mod json;
/// The network-namespace guard and link helpers of the lab tests.
pub(crate) mod netns;

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Set to `1` (CI does) to turn every skip into a failure.
pub(crate) const REQUIRE_ALL_ENV: &str = "SONDE_TEST_REQUIRE_ALL";

/// How long an agent may take to print its listening line.
pub(crate) const AGENT_READY_TIMEOUT: Duration = Duration::from_secs(10);

/// The first line an agent prints on stdout, up to the address.
pub(crate) const LISTENING_PREFIX: &str = "sonde agent listening on ";

/// A child's captured output is cut to this many bytes (the tail is kept).
const OUTPUT_CAP: usize = 256 * 1024;

/// The sonde binary Cargo built for these tests.
pub(crate) fn sonde_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_sonde"))
}

/// The results database every test's client saves into (`SONDE_DB`): in Cargo's scratch
/// directory for integration tests, so that no test writes the user's home. A test that reads
/// what it saved gives its own `--db`.
pub(crate) fn test_db() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("results.db")
}

/// `sonde` as a command, saving into [`test_db`].
pub(crate) fn sonde_command() -> Command {
    let mut cmd = Command::new(sonde_bin());
    cmd.env("SONDE_DB", test_db());
    cmd
}

/// [`sonde_command`] to spawn and watch: no input, its stdout and stderr piped to the test.
pub(crate) fn sonde_piped() -> Command {
    let mut cmd = sonde_command();
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    cmd
}

// ---------------------------------------------------------------------------------------------
// One file's tests at a time
// ---------------------------------------------------------------------------------------------

/// The file whose tests are running, and how many of them.
struct Running {
    file: Option<&'static str>,
    tests: usize,
}

static RUNNING: Mutex<Running> = Mutex::new(Running {
    file: None,
    tests: 0,
});
static RUNNING_CHANGED: Condvar = Condvar::new();

/// Held by a running test; the last of its file's to drop it lets another file's tests start.
#[must_use = "the test runs alone with its file's tests only while it holds this"]
pub(crate) struct FileLock;

/// Waits until no other test file's tests are running, then counts this test in. Every test
/// takes it first thing, as `common::file_lock(module_path!())`: the tests of one file (the
/// module below the binary's root, `cli` for `loopback::cli::store`) run beside each other as
/// libtest schedules them, never beside another file's. Each file was a test binary of its own,
/// and Cargo runs binaries one after another: the labs measure, and read low when another
/// test loads the cores; loopback's tests count CPU time and syscalls. Tests that need the
/// machine to themselves within a file still take that file's own lock after this one.
pub(crate) fn file_lock(module_path: &'static str) -> FileLock {
    let file = module_path.split("::").nth(1).unwrap_or(module_path);
    let mut running = RUNNING.lock().unwrap_or_else(PoisonError::into_inner);
    while running.file.is_some_and(|f| f != file) {
        running = RUNNING_CHANGED
            .wait(running)
            .unwrap_or_else(PoisonError::into_inner);
    }
    running.file = Some(file);
    running.tests += 1;
    FileLock
}

impl Drop for FileLock {
    fn drop(&mut self) {
        let mut running = RUNNING.lock().unwrap_or_else(PoisonError::into_inner);
        running.tests -= 1;
        if running.tests == 0 {
            running.file = None;
            RUNNING_CHANGED.notify_all();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Prerequisites
// ---------------------------------------------------------------------------------------------

/// Something a test needs from the machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Need {
    /// Effective uid 0.
    Root,
    /// Network namespaces can be created (root alone is not enough in some containers).
    Netns,
    /// An executable on `PATH` (or in the sbin directories root's `PATH` usually has).
    Cmd(&'static str),
}

/// `true` when the test may go on. Otherwise prints `SKIP <test>: <reason>` to stderr and
/// returns `false`, or panics when `SONDE_TEST_REQUIRE_ALL=1` (CI installs everything, so a
/// missing prerequisite there is a broken CI, not a reason to pass silently).
pub(crate) fn require_or_skip(test: &str, needs: &[Need]) -> bool {
    for need in needs {
        let missing = match need {
            Need::Root => (!is_root()).then(|| "not running as root".to_owned()),
            Need::Netns => {
                if is_root() {
                    netns_unavailable()
                        .map(|why| format!("cannot create a network namespace: {why}"))
                } else {
                    Some("network namespaces need root".to_owned())
                }
            }
            Need::Cmd(name) => (!have_cmd(name)).then(|| format!("`{name}` not found on PATH")),
        };
        if let Some(reason) = missing {
            return skip(test, &reason);
        }
    }
    true
}

/// Skips `test` for `reason` (always returns `false`), or panics when
/// `SONDE_TEST_REQUIRE_ALL=1`.
pub(crate) fn skip(test: &str, reason: &str) -> bool {
    if require_all() {
        panic!("{test}: {reason}; this prerequisite is required in CI ({REQUIRE_ALL_ENV}=1)");
    }
    eprintln!("SKIP {test}: {reason}");
    false
}

/// Whether `SONDE_TEST_REQUIRE_ALL=1`.
pub(crate) fn require_all() -> bool {
    std::env::var_os(REQUIRE_ALL_ENV).is_some_and(|v| v == "1")
}

/// Effective uid is 0 (read from /proc, so no libc dependency).
pub(crate) fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status.lines().find_map(|line| {
                // "Uid:\treal\teffective\tsaved\tfs"
                let rest = line.strip_prefix("Uid:")?;
                rest.split_whitespace().nth(1).map(|euid| euid == "0")
            })
        })
        .unwrap_or(false)
}

/// An executable named `name` exists on `PATH` or in an sbin directory.
pub(crate) fn have_cmd(name: &str) -> bool {
    find_cmd(name).is_some()
}

/// The full path of `name`, or `name` itself when not found (so the spawn error names it).
pub(crate) fn tool(name: &str) -> PathBuf {
    find_cmd(name).unwrap_or_else(|| PathBuf::from(name))
}

fn find_cmd(name: &str) -> Option<PathBuf> {
    if name.contains('/') {
        return is_executable(Path::new(name)).then(|| PathBuf::from(name));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    let sbin = ["/usr/local/sbin", "/usr/sbin", "/sbin"].map(PathBuf::from);
    std::env::split_paths(&path)
        .chain(sbin)
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// `None` when a namespace could be created and deleted; probed once per test binary.
fn netns_unavailable() -> Option<String> {
    static PROBE: OnceLock<Option<String>> = OnceLock::new();
    PROBE
        .get_or_init(|| {
            if !have_cmd("ip") {
                return Some("`ip` not found".to_owned());
            }
            let name = format!("sonde-probe-{}", std::process::id());
            let _ = quiet(Command::new(tool("ip")).args(["netns", "delete", &name]));
            let added = run_with_timeout(
                Command::new(tool("ip")).args(["netns", "add", &name]),
                Duration::from_secs(10),
            );
            let _ = quiet(Command::new(tool("ip")).args(["netns", "delete", &name]));
            match added {
                Ok(out) if out.status.success() => None,
                Ok(out) => Some(out.stderr.trim().to_owned()),
                Err(e) => Some(e),
            }
        })
        .clone()
}

// ---------------------------------------------------------------------------------------------
// Running commands under a time limit
// ---------------------------------------------------------------------------------------------

/// What a finished child printed.
#[derive(Debug, Clone)]
pub(crate) struct Output {
    /// How it ended.
    pub(crate) status: ExitStatus,
    /// Standard output (lossy UTF-8, tail-capped).
    pub(crate) stdout: String,
    /// Standard error (lossy UTF-8, tail-capped).
    pub(crate) stderr: String,
}

/// Reads a pipe to its end on a thread, keeping at most [`OUTPUT_CAP`] bytes (the tail).
fn drain<R: Read + Send + 'static>(mut pipe: R) -> JoinHandle<Vec<u8>> {
    thread::spawn(move || {
        let mut kept = Vec::new();
        let mut buf = [0u8; 8192];
        loop {
            match pipe.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    kept.extend_from_slice(&buf[..n]);
                    if kept.len() > OUTPUT_CAP {
                        let cut = kept.len() - OUTPUT_CAP;
                        kept.drain(..cut);
                    }
                }
            }
        }
        kept
    })
}

/// Runs `cmd` to completion with piped output; kills it after `timeout`.
/// `Err` carries the command line, the time limit and what it printed so far.
pub(crate) fn run_with_timeout(cmd: &mut Command, timeout: Duration) -> Result<Output, String> {
    let line = command_line(cmd);
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start `{line}`: {e}"))?;
    let out = drain(child.stdout.take().expect("piped stdout"));
    let err = drain(child.stderr.take().expect("piped stderr"));
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() >= deadline => break None,
            Ok(None) => thread::sleep(Duration::from_millis(10)),
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("waiting for `{line}`: {e}"));
            }
        }
    };
    let timed_out = status.is_none();
    let status = status.unwrap_or_else(|| {
        let _ = child.kill();
        child.wait().expect("wait after kill")
    });
    let stdout = String::from_utf8_lossy(&out.join().unwrap_or_default()).into_owned();
    let stderr = String::from_utf8_lossy(&err.join().unwrap_or_default()).into_owned();
    if timed_out {
        return Err(format!(
            "`{line}` did not finish within {timeout:?} and was killed\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}"
        ));
    }
    Ok(Output {
        status,
        stdout,
        stderr,
    })
}

/// Runs `cmd` (30 s limit) and panics unless it exits 0; returns its stdout.
pub(crate) fn check(cmd: &mut Command) -> String {
    check_within(cmd, Duration::from_secs(30))
}

/// Like [`check`], with the time limit given.
pub(crate) fn check_within(cmd: &mut Command, timeout: Duration) -> String {
    let line = command_line(cmd);
    match run_with_timeout(cmd, timeout) {
        Ok(out) if out.status.success() => out.stdout,
        Ok(out) => panic!(
            "`{line}` failed ({})\n--- stdout ---\n{}\n--- stderr ---\n{}",
            out.status, out.stdout, out.stderr
        ),
        Err(e) => panic!("{e}"),
    }
}

/// Runs `cmd` (30 s limit) ignoring the outcome: for cleanup.
pub(crate) fn quiet(cmd: &mut Command) -> bool {
    run_with_timeout(cmd, Duration::from_secs(30)).is_ok_and(|out| out.status.success())
}

/// `program arg arg ...` for messages.
pub(crate) fn command_line(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(OsStr::to_string_lossy)
        .collect::<Vec<_>>()
        .join(" ")
}

/// `program args...`, inside network namespace `netns` when given (`ip netns exec NS ...`).
pub(crate) fn command_in(netns: Option<&str>, program: impl AsRef<OsStr>) -> Command {
    match netns {
        Some(ns) => {
            let mut cmd = Command::new(tool("ip"));
            cmd.args(["netns", "exec", ns]).arg(program);
            cmd
        }
        None => Command::new(program),
    }
}

// ---------------------------------------------------------------------------------------------
// Child processes that die with their guard
// ---------------------------------------------------------------------------------------------

/// A long-running child (a server) that is killed and reaped on drop. Its stderr is kept for
/// failure messages; its stdout lines go to a channel until the first wanted one is read, and are
/// drained after that so the child never blocks on a full pipe.
pub(crate) struct Daemon {
    child: Child,
    what: String,
    stderr: Arc<Mutex<String>>,
    lines: mpsc::Receiver<String>,
}

impl Daemon {
    /// Spawns `cmd` with piped stdout/stderr.
    pub(crate) fn spawn(cmd: &mut Command) -> Daemon {
        let what = command_line(cmd);
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start `{what}`: {e}"));
        let (tx, lines) = mpsc::channel();
        let stdout = child.stdout.take().expect("piped stdout");
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                // Nobody listening any more: keep draining.
                let _ = tx.send(line);
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = Arc::clone(&stderr);
        let pipe = child.stderr.take().expect("piped stderr");
        thread::spawn(move || {
            for line in BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                let mut kept = sink
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                kept.push_str(&line);
                kept.push('\n');
                if kept.len() > OUTPUT_CAP {
                    let mut cut = kept.len() - OUTPUT_CAP;
                    while !kept.is_char_boundary(cut) {
                        cut += 1;
                    }
                    kept.drain(..cut);
                }
            }
        });
        Daemon {
            child,
            what,
            stderr,
            lines,
        }
    }

    /// Waits up to `timeout` for a stdout line for which `pick` returns `Some`.
    /// Panics (with the child's stderr) on timeout or when the child exits first.
    pub(crate) fn wait_for_line<T>(
        &mut self,
        timeout: Duration,
        mut pick: impl FnMut(&str) -> Option<T>,
    ) -> T {
        let deadline = Instant::now() + timeout;
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    if let Some(found) = pick(&line) {
                        return found;
                    }
                    seen.push(line);
                }
                Err(RecvTimeoutError::Timeout) => panic!(
                    "`{}` printed no ready line within {timeout:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
                    self.what,
                    seen.join("\n"),
                    self.stderr()
                ),
                Err(RecvTimeoutError::Disconnected) => {
                    // Give the stderr reader a moment to collect the reason.
                    let status = self.child.wait().ok();
                    thread::sleep(Duration::from_millis(50));
                    panic!(
                        "`{}` exited ({status:?}) before printing its ready line\n--- stdout ---\n{}\n--- stderr ---\n{}",
                        self.what,
                        seen.join("\n"),
                        self.stderr()
                    )
                }
            }
        }
    }

    /// Waits until a TCP connection to `addr` succeeds (for peers that print nothing when ready).
    /// Only for addresses reachable from the test's own namespace (loopback).
    pub(crate) fn wait_for_tcp(&mut self, addr: std::net::SocketAddr, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            if std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "`{}` exited ({status}) before listening\n{}",
                    self.what,
                    self.stderr()
                );
            }
            assert!(
                Instant::now() < deadline,
                "`{}` not listening on {addr} within {timeout:?}",
                self.what
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// What the child wrote to stderr so far.
    pub(crate) fn stderr(&self) -> String {
        self.stderr
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The child's pid.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the child is still running.
    pub(crate) fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------------------------
// The sonde agent
// ---------------------------------------------------------------------------------------------

/// A `sonde server` child on an OS-chosen port; killed and reaped on drop.
pub(crate) struct Agent {
    daemon: Daemon,
    addr: String,
    port: u16,
}

impl Agent {
    /// `sonde server --bind ADDR --port 0` in this namespace.
    pub(crate) fn start(bind: &str) -> Agent {
        Agent::start_in(None, bind, &[])
    }

    /// `sonde server --bind ADDR --port 0 EXTRA...`, inside `netns` when given.
    pub(crate) fn start_in(netns: Option<&str>, bind: &str, extra: &[&str]) -> Agent {
        let mut args = vec!["server", "--bind", bind, "--port", "0"];
        args.extend_from_slice(extra);
        Agent::with_args(netns, &args)
    }

    /// `sonde ARGS...` (which must start an agent), inside `netns` when given.
    pub(crate) fn with_args(netns: Option<&str>, args: &[&str]) -> Agent {
        let mut cmd = command_in(netns, sonde_bin());
        cmd.env("SONDE_DB", test_db()).args(args);
        let mut daemon = Daemon::spawn(&mut cmd);
        let (addr, port) = daemon.wait_for_line(AGENT_READY_TIMEOUT, parse_listening_line);
        Agent { daemon, addr, port }
    }

    /// The address the agent printed (an IPv6 one without brackets).
    pub(crate) fn addr(&self) -> &str {
        &self.addr
    }

    /// The port the agent printed.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// `HOST:PORT` for the client's command line (`[v6]:PORT` for IPv6).
    pub(crate) fn target(&self) -> String {
        if self.addr.contains(':') {
            format!("[{}]:{}", self.addr, self.port)
        } else {
            format!("{}:{}", self.addr, self.port)
        }
    }

    /// What the agent wrote to stderr so far.
    pub(crate) fn stderr(&self) -> String {
        self.daemon.stderr()
    }

    /// Whether the agent process is still running.
    pub(crate) fn is_running(&mut self) -> bool {
        self.daemon.is_running()
    }

    /// The agent process's pid.
    pub(crate) fn pid(&self) -> u32 {
        self.daemon.pid()
    }
}

/// Parses `sonde agent listening on <ADDR>:<PORT> (tcp+udp)` into (ADDR, PORT); an IPv6 ADDR may
/// come bracketed or bare.
pub(crate) fn parse_listening_line(line: &str) -> Option<(String, u16)> {
    let rest = line.trim().strip_prefix(LISTENING_PREFIX)?;
    let endpoint = rest.split_whitespace().next()?;
    let (addr, port) = endpoint.rsplit_once(':')?;
    let addr = addr.trim_start_matches('[').trim_end_matches(']');
    Some((addr.to_owned(), port.parse().ok()?))
}

// ---------------------------------------------------------------------------------------------
// The sonde client
// ---------------------------------------------------------------------------------------------

/// Time limit for [`run_json`]: every client run in these tests asks for far less.
pub(crate) const CLIENT_TIMEOUT: Duration = Duration::from_secs(120);

/// Runs `sonde ARGS... --json` in this namespace; see [`run_json_in`].
pub(crate) fn run_json(args: &[&str]) -> Value {
    run_json_in(None, args, CLIENT_TIMEOUT)
}

/// Runs `sonde ARGS... --json` (inside `netns` when given) with a time limit and returns the
/// parsed document. Panics with the command line, exit status and both outputs when the client
/// fails, runs over, or prints something other than one JSON document.
pub(crate) fn run_json_in(netns: Option<&str>, args: &[&str], timeout: Duration) -> Value {
    let mut cmd = command_in(netns, sonde_bin());
    cmd.env("SONDE_DB", test_db()).args(args);
    if !args.contains(&"--json") {
        cmd.arg("--json");
    }
    let line = command_line(&cmd);
    let out = run_with_timeout(&mut cmd, timeout).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        out.status.success(),
        "`{line}` failed ({})\n--- stdout ---\n{}\n--- stderr ---\n{}",
        out.status,
        out.stdout,
        out.stderr
    );
    serde_json::from_str(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "`{line}` printed no JSON document ({e})\n--- stdout ---\n{}\n--- stderr ---\n{}",
            out.stdout, out.stderr
        )
    })
}

/// `doc[path...]` as u64, panicking with the path and the document when absent.
pub(crate) fn u64_at(doc: &Value, path: &[&str]) -> u64 {
    at(doc, path)
        .as_u64()
        .unwrap_or_else(|| panic!("{} is not an unsigned integer in\n{doc:#}", path.join(".")))
}

/// `doc[path...]` as f64, panicking with the path and the document when absent.
pub(crate) fn f64_at(doc: &Value, path: &[&str]) -> f64 {
    at(doc, path)
        .as_f64()
        .unwrap_or_else(|| panic!("{} is not a number in\n{doc:#}", path.join(".")))
}

/// `doc[path...]`, panicking with the path and the document when absent.
pub(crate) fn at<'a>(doc: &'a Value, path: &[&str]) -> &'a Value {
    path.iter()
        .try_fold(doc, |v, key| v.get(key))
        .unwrap_or_else(|| panic!("no {} in\n{doc:#}", path.join(".")))
}
