//! The agent at the file-descriptor limit: it raises its soft `RLIMIT_NOFILE` to the hard limit
//! when it starts, and when accept fails for want of descriptors it counts it and backs off
//! rather than retrying at once (before, its accept loop spun a whole core until descriptors
//! came back).
//!
//! The test lowers its process's own descriptor limits (with util-linux `prlimit --pid`),
//! which would starve any test running beside it: so it runs in a child process of this test
//! binary that runs this one test alone. Loopback only; every loop is bounded.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::thread;
use std::time::{Duration, Instant};

use crate::{Agent, AgentConfig};

/// `Max open files` from /proc/self/limits: (soft, hard), `None` for unlimited.
fn nofile() -> (Option<u64>, Option<u64>) {
    let limits = std::fs::read_to_string("/proc/self/limits").expect("/proc/self/limits");
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("a Max open files line");
    let mut fields = line["Max open files".len()..].split_whitespace();
    let mut next = || fields.next().and_then(|f| f.parse().ok());
    (next(), next())
}

fn prlimit(soft: u64, hard: &str) {
    let spec = format!("--nofile={soft}:{hard}");
    let pid = std::process::id().to_string();
    let out = Command::new("prlimit")
        .args(["--pid", &pid, &spec])
        .output()
        .expect("run prlimit");
    assert!(
        out.status.success(),
        "prlimit {spec}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn open_descriptors() -> u64 {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .count() as u64
}

/// The open `stat` file of this process's thread named `name` (/proc/self/task/TID/stat), kept
/// open so it can be read again when no descriptor is left to open it.
fn thread_stat(name: &str) -> File {
    // The thread may still be starting.
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        let tasks = std::fs::read_dir("/proc/self/task").expect("/proc/self/task");
        for task in tasks.flatten() {
            let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
            if comm.trim_end() == name {
                return File::open(task.path().join("stat")).expect("open the thread's stat");
            }
        }
        thread::sleep(Duration::from_millis(20));
    }
    panic!("no thread named {name}");
}

/// User plus system CPU time of a thread, in clock ticks (stat fields 14 and 15; USER_HZ is 100
/// on Linux).
fn cpu_ticks(stat: &mut File) -> u64 {
    let mut text = String::new();
    stat.seek(SeekFrom::Start(0)).expect("rewind");
    stat.read_to_string(&mut text)
        .expect("read the thread's stat");
    // Fields after the command name, which is in parentheses and may hold spaces; `after`
    // starts at field 3 (state), so utime and stime are its 12th and 13th.
    let after = text.rsplit_once(") ").map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    [11, 12]
        .iter()
        .map(|&i| {
            fields
                .get(i)
                .and_then(|f| f.parse::<u64>().ok())
                .unwrap_or(0)
        })
        .sum()
}

/// Set in the child process that runs the test alone.
const ALONE_ENV: &str = "SONDE_AGENT_TEST_ALONE";
/// How long the child may take: its own waits add up to well under this.
const CHILD_LIMIT: Duration = Duration::from_secs(120);

#[test]
fn at_the_descriptor_limit_the_agent_backs_off_and_counts() {
    if std::env::var_os(ALONE_ENV).is_some() {
        backs_off_and_counts();
        return;
    }
    if Command::new("prlimit").arg("--version").output().is_err() {
        assert!(
            std::env::var_os("SONDE_TEST_REQUIRE_ALL").is_none_or(|v| v != "1"),
            "prlimit (util-linux) is required in CI"
        );
        eprintln!("SKIP at_the_descriptor_limit_the_agent_backs_off_and_counts: no prlimit");
        return;
    }
    let name = format!(
        "{}::at_the_descriptor_limit_the_agent_backs_off_and_counts",
        module_path!().split_once("::").map_or("", |(_, path)| path)
    );
    let exe = std::env::current_exe().expect("this test binary's path");
    let mut child = Command::new(exe)
        .args([name.as_str(), "--exact", "--nocapture", "--test-threads=1"])
        .env(ALONE_ENV, "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run this test binary again");
    // Read both pipes while it runs, so that a chatty child never blocks on a full pipe.
    let drain = |mut pipe: Box<dyn Read + Send>| {
        thread::spawn(move || {
            let mut text = Vec::new();
            let _ = pipe.read_to_end(&mut text);
            String::from_utf8_lossy(&text).into_owned()
        })
    };
    let stdout = drain(Box::new(child.stdout.take().expect("piped stdout")));
    let stderr = drain(Box::new(child.stderr.take().expect("piped stderr")));
    let deadline = Instant::now() + CHILD_LIMIT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the child") {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        thread::sleep(Duration::from_millis(50));
    };
    let stdout = stdout.join().expect("the child's stdout");
    let stderr = stderr.join().expect("the child's stderr");
    print!("{stdout}");
    eprint!("{stderr}");
    assert!(
        status.is_some_and(|s| s.success()) && stdout.contains("1 passed"),
        "the test alone in a child process ({name}) failed, did not run or ran over {} s: {status:?}",
        CHILD_LIMIT.as_secs()
    );
}

/// The test itself, alone in its process.
fn backs_off_and_counts() {
    // 1. The soft limit is raised to the hard one when the agent starts.
    let (_, hard) = nofile();
    let hard_text = hard.map_or_else(|| "unlimited".to_owned(), |h| h.to_string());
    prlimit(256, &hard_text);
    assert_eq!(nofile().0, Some(256));
    let mut cfg = AgentConfig::new(SocketAddr::from(([127, 0, 0, 1], 0)));
    cfg.hello_timeout = Duration::from_secs(20);
    // Every connection below stays pending at the agent (holding its descriptor) instead of
    // being refused over the pending caps and closed whenever the agent gets to it: such a
    // close freed a slot after the test had filled them, the agent's next accept took it, and
    // in one CI run that happened at every try for 5 s (no EMFILE seen, 25 connections held).
    cfg.max_pending = 1_000;
    cfg.max_pending_per_source = 1_000;
    let agent = Agent::bind(cfg).expect("bind on loopback");
    assert_eq!(nofile(), (hard, hard), "the soft limit was not raised");
    let addr = agent.local_addr();
    let h = agent.spawn();
    let mut accept_stat = thread_stat("sonde-agent");

    // 2. Out of descriptors: room for a few dozen more, then connections until none is left.
    let limit = open_descriptors() + 40;
    prlimit(limit, &limit.to_string());
    let mut held: Vec<TcpStream> = Vec::new();
    for _ in 0..200 {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
            Ok(s) => held.push(s),
            Err(_) => break,
        }
    }
    assert!(!held.is_empty(), "no connection could be opened");
    // Free one of ours and take it back at once with a new connection: that one waits in the
    // agent's backlog with no descriptor left for its accept. Every other free slot (the
    // agent frees its side of the connections it refuses, whenever it gets to them) is first
    // filled with /dev/null, so the new connection's socket takes the only one: otherwise the
    // agent could win a freed slot, and on a busy host it did, every time, for 5 s.
    let mut filler: Vec<File> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while h.rejections().out_of_descriptors.load(Ordering::Relaxed) == 0
        && Instant::now() < deadline
    {
        held.pop();
        while let Ok(f) = File::open("/dev/null") {
            filler.push(f);
        }
        filler.pop();
        if let Ok(s) = TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
            held.push(s);
        }
        thread::sleep(Duration::from_millis(50));
    }
    assert!(
        h.rejections().out_of_descriptors.load(Ordering::Relaxed) > 0,
        "no accept failed for want of descriptors ({} connections held)",
        held.len()
    );
    // While the descriptors stay exhausted, the accept loop sleeps between tries: well under
    // half a core (it spun a whole one before).
    let before = cpu_ticks(&mut accept_stat);
    let start = Instant::now();
    thread::sleep(Duration::from_secs(1));
    let used = cpu_ticks(&mut accept_stat) - before;
    let wall_ticks = u64::try_from(start.elapsed().as_millis() / 10).unwrap_or(u64::MAX);
    assert!(
        used * 2 < wall_ticks,
        "the accept loop used {used} of {wall_ticks} ticks while out of descriptors"
    );

    // 3. Descriptors back: the agent serves again.
    drop(held);
    drop(filler);
    let target = sonde_client::resolve(&addr.to_string(), 0).expect("a literal address");
    let opts = sonde_client::LatencyOptions {
        msg_size: 64,
        duration: Duration::from_millis(300),
        warmup: Duration::from_millis(100),
        ..sonde_client::LatencyOptions::default()
    };
    let mut served = None;
    let deadline = Instant::now() + Duration::from_secs(10);
    while served.is_none() && Instant::now() < deadline {
        served = super::latency(&target, &opts).ok().map(|m| m.result);
        thread::sleep(Duration::from_millis(100));
    }
    assert!(
        served.is_some_and(|r| r.samples > 0),
        "the agent does not serve again"
    );
    h.stop();
}
