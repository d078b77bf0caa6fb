//! Mesh mode at 40 agents on loopback, each its own process on its own address
//! (127.77.0.1 to 127.77.0.40, each its own port), with one shared secret and one peer file:
//! every agent reaches every other through stateless probes (`sonde_peer_up` 1 for all 39 of
//! its peers, 39 incoming probers each), no probe is refused (no per-source cap, MAC, replay or
//! stale refusal anywhere), each agent runs a handful of threads whatever its peer count, and
//! SIGTERM ends each one promptly. It prints each agent's threads, RSS and CPU share, the
//! figures docs/mesh.md quotes (`MESH_AGENTS=10` runs 10 agents instead of 40).
//!
//! Linux only (threads and memory are read from /proc); every wait is bounded, and every agent
//! is killed when the test ends, passing or not.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::common;

/// The agents, killed when the test ends whatever happened.
struct Agents(Vec<Child>);

impl Drop for Agents {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn ip(i: usize) -> String {
    format!("127.77.0.{i}")
}

/// A base port `p` such that `p + i` (the agents) and `p + 100 + i` (their metrics) are free on
/// every agent's address, TCP and UDP (other tests run on loopback too).
fn free_base(n: usize) -> Option<u16> {
    let seed = u64::from(std::process::id())
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::from(d.subsec_nanos()));
    (0..50u64).find_map(|k| {
        // Below the ephemeral range (32768 up by default): the agents' own probe sockets take
        // thousands of ephemeral ports while the later agents start.
        let base =
            12_000 + u16::try_from((seed.wrapping_mul(2_654_435_761) + k * 7_919) % 20_000).ok()?;
        (1..=n)
            .all(|i| {
                let port = |off: usize| base + u16::try_from(off + i).unwrap_or(0);
                let a = SocketAddr::new(ip(i).parse().unwrap(), port(0));
                let m = SocketAddr::new(ip(i).parse().unwrap(), port(100));
                TcpListener::bind(a).is_ok()
                    && UdpSocket::bind(a).is_ok()
                    && TcpListener::bind(m).is_ok()
            })
            .then_some(base)
    })
}

fn http_get(addr: SocketAddr) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

/// The value of the sample line that starts with `prefix` (name and labels).
fn sample(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

fn proc_field(pid: u32, file: &str, key: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/{file}"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// utime + stime of a process, clock ticks.
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = after.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

#[cfg(target_os = "linux")]
#[test]
fn forty_agents_on_loopback_all_reach_each_other_with_a_handful_of_threads() {
    let _file = common::file_lock(module_path!());
    let n: usize = std::env::var("MESH_AGENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| (2..=200).contains(n))
        .unwrap_or(40);
    let Some(base) = free_base(n) else {
        common::skip(
            "forty_agents_on_loopback",
            "no free base port on 127.77.0.x for every agent",
        );
        return;
    };
    // MESH_INTERVAL="200ms" measures at the rate of the mesh before stateless probes.
    let interval = std::env::var("MESH_INTERVAL").unwrap_or_else(|_| "1s".into());
    let dir = tempfile::tempdir().unwrap();
    let port = |i: usize| base + u16::try_from(i).unwrap();
    let peers: String = (1..=n)
        .map(|i| format!("{}:{}\n", ip(i), port(i)))
        .collect();
    let peer_file = dir.path().join("peers.txt");
    std::fs::write(&peer_file, peers).unwrap();
    let mesh = dir.path().join("mesh.toml");
    std::fs::write(
        &mesh,
        format!(
            "[peers]\nfile = \"{}\"\n[latency]\ninterval = \"{interval}\"\n",
            peer_file.display()
        ),
    )
    .unwrap();
    let mut agents = Agents(Vec::new());
    for i in 1..=n {
        let child = common::sonde_command()
            .args([
                "server",
                "--bind",
                &ip(i),
                "-p",
                &port(i).to_string(),
                "--quiet",
            ])
            .arg("--mesh")
            .arg(&mesh)
            .args(["--metrics", &format!("{}:{}", ip(i), port(100 + i))])
            .env("SONDE_SECRET", "forty agents")
            .env("SONDE_MESH_NAME", format!("{}:{}", ip(i), port(i)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn an agent");
        agents.0.push(child);
    }
    let metrics = |i: usize| SocketAddr::new(ip(i).parse().unwrap(), port(100 + i));
    // Every agent sees every peer up, and every peer probing it.
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut missing: BTreeMap<usize, String> = (1..=n).map(|i| (i, String::new())).collect();
    while !missing.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
        for (i, c) in agents.0.iter_mut().enumerate() {
            if let Some(status) = c.try_wait().unwrap() {
                panic!("agent {} ({}) exited: {status}", i + 1, ip(i + 1));
            }
        }
        missing.retain(|&i, why| {
            let Some(text) = http_get(metrics(i)) else {
                *why = "no /metrics".into();
                return true;
            };
            let up = text
                .lines()
                .filter(|l| l.starts_with("sonde_peer_up{") && l.ends_with(" 1"))
                .count();
            let incoming = sample(&text, "sonde_mesh_incoming_probers ").unwrap_or(0.0);
            *why = format!("{up} peers up, {incoming} incoming probers");
            up != n - 1 || incoming < (n - 1) as f64
        });
    }
    assert!(
        missing.is_empty(),
        "agents short of their peers: {missing:?}"
    );
    // Steady state: threads, RSS and CPU over a few seconds.
    let window = Duration::from_secs(
        std::env::var("MESH_MEASURE_SECS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(5),
    );
    let pids: Vec<u32> = agents.0.iter().map(Child::id).collect();
    let before: Vec<u64> = pids.iter().map(|&p| cpu_ticks(p).unwrap_or(0)).collect();
    let start = Instant::now();
    let mut most_threads = 0;
    while start.elapsed() < window {
        for &p in &pids {
            most_threads = most_threads.max(proc_field(p, "status", "Threads:").unwrap_or(0));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let secs = start.elapsed().as_secs_f64();
    let ticks = 100.0; // USER_HZ on Linux
    let cpu: Vec<f64> = pids
        .iter()
        .zip(&before)
        .map(|(&p, &b)| (cpu_ticks(p).unwrap_or(b) - b) as f64 / ticks / secs * 100.0)
        .collect();
    let rss: Vec<u64> = pids
        .iter()
        .map(|&p| proc_field(p, "status", "VmRSS:").unwrap_or(0))
        .collect();
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    println!(
        "{n} agents, probes every {interval} over UDP and TCP: most threads in one agent {most_threads}, \
         RSS mean {:.1} MiB (max {:.1}), CPU mean {:.2}% of a core (max {:.2}%)",
        rss.iter().sum::<u64>() as f64 / rss.len() as f64 / 1024.0,
        *rss.iter().max().unwrap() as f64 / 1024.0,
        mean(&cpu),
        cpu.iter().copied().fold(0.0, f64::max),
    );
    // A handful each, not one per peer (before: about 10 per peer).
    assert!(most_threads <= 16, "{most_threads} threads in one agent");
    // No refusal of any kind anywhere: no per-source cap (probes are no sessions), no probe
    // refused.
    for i in 1..=n {
        let text = http_get(metrics(i)).expect("metrics");
        for reason in [
            "source_busy",
            "busy",
            "probe_mac",
            "probe_stale",
            "probe_replay",
            "probe_overload",
        ] {
            let v = sample(
                &text,
                &format!("sonde_refusals_total{{reason=\"{reason}\"}} "),
            );
            assert_eq!(v, Some(0.0), "agent {i}: {reason}");
        }
        assert_eq!(
            sample(&text, "sonde_sessions_total{kind=\"latency\"} "),
            Some(0.0)
        );
    }
    // SIGTERM, one agent at a time: each ends within 2 s.
    for c in &mut agents.0 {
        let pid = c.id();
        let sent = Instant::now();
        let ok = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill -TERM {pid}");
        let mut status = None;
        while sent.elapsed() < Duration::from_secs(10) {
            if let Some(s) = c.try_wait().unwrap() {
                status = Some(s);
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let took = sent.elapsed();
        assert!(
            status.is_some_and(|s| s.success()),
            "agent {pid} after SIGTERM: {status:?}"
        );
        assert!(
            took < Duration::from_secs(2),
            "agent {pid} took {took:?} to end"
        );
    }
}
