//! `sonde mesh diagnose` against a real mesh and a real Prometheus, with known faults.
//!
//! Nine mesh agents in three racks of three, each agent in its own namespace: rack k's hosts are
//! `198.18.k.1`-`.3`, on a bridge `brk` in the router namespace, which is `198.18.k.254` on it and
//! forwards between the racks. Pairs inside a rack are bridged; pairs between racks are routed,
//! so whatever the router sends into rack k leaves through `brk`: that is rack k's uplink. A real
//! Prometheus in the router namespace scrapes the nine agents every second. After every pair is
//! up, three faults, one after another, each judged over the 15 s after it began (so the one
//! before is out of the window):
//!
//! 1. a 1% nftables drop on one host (`numgen random mod 100 < 1 drop` in its input and output
//!    hooks): the first suspect must be that host (as a cross, row or column; not a rack);
//! 2. a `tbf` queue on rack 1's uplink (1 Mbit/s, up to 50 ms of queue, kept full by a bulk TCP
//!    transfer from rack 2 into rack 1): every pair between rack 1 and the others gains up to
//!    50 ms, the pairs inside rack 1 nothing; the first suspect must be the group `rack1`;
//! 3. a killed agent: the first suspect must be that host.
//!
//! The peer list labels each agent with its rack; the first case takes the groups from a
//! `--groups` file, the other two from the agents' own label series (`--group-label rack`), and
//! before the faults the two must give every host the same group.
//!
//! Each case polls `sonde mesh diagnose --json` a few times (the window must fill with the
//! fault first), a bounded number of times. No timing is asserted: only which suspect ranks
//! first, which the fault sizes decide (2% loss against none, tens of ms against a fraction).
//!
//! Needs root, `ip`, `tc`, `nft`, `sysctl`, `prometheus`; without them the test prints `SKIP`
//! and passes, unless `SONDE_TEST_REQUIRE_ALL=1` (CI). About a minute.

use crate::common;
use crate::mesh::mesh_agent;

use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

use common::netns::{ip, link_up, veth, Namespaces, Segments};
use common::{check, command_in, require_or_skip, sonde_bin, test_db, tool, Daemon, Need};

const RACKS: usize = 3;
const PER_RACK: usize = 3;
const METRICS_PORT: u16 = 9300;
const PROM: &str = "127.0.0.1:9090";
/// The window each case is judged over, and how long after a fault begins it is first judged.
const WINDOW: &str = "15s";
const SETTLE: Duration = Duration::from_secs(17);

fn addr(rack: usize, i: usize) -> String {
    format!("198.18.{rack}.{i}")
}

/// Every agent's address, rack by rack.
fn agents() -> Vec<String> {
    (1..=RACKS)
        .flat_map(|r| (1..=PER_RACK).map(move |i| addr(r, i)))
        .collect()
}

/// `sonde mesh diagnose --json` from the router's namespace, the groups from `grouping` (e.g.
/// `--groups FILE`, or `--group-label rack`: the mesh's own label series).
fn diagnose(router: &str, grouping: &[&str]) -> Value {
    let out = common::run_with_timeout(
        command_in(Some(router), sonde_bin())
            .args([
                "mesh",
                "diagnose",
                "--prometheus",
                &format!("http://{PROM}"),
                "--window",
                WINDOW,
                "--json",
            ])
            .args(grouping),
        Duration::from_secs(60),
    )
    .expect("sonde mesh diagnose ran");
    assert!(
        out.status.success(),
        "sonde mesh diagnose failed: {}",
        out.stderr
    );
    serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("diagnose --json: {e}\n{}", out.stdout))
}

/// The first suspect as `(kind, name)`, or `("", "")` when there is none.
fn first(d: &Value) -> (String, String) {
    let s = &d["suspects"][0];
    (
        s["kind"].as_str().unwrap_or_default().to_owned(),
        s["name"].as_str().unwrap_or_default().to_owned(),
    )
}

/// Diagnoses after the window has filled with the fault, up to four times 4 s apart, until
/// `right` accepts the first suspect; panics with every answer otherwise.
fn expect_first(
    case: &str,
    router: &str,
    grouping: &[&str],
    right: impl Fn(&str, &str) -> bool,
    agents: &[Daemon],
) {
    thread::sleep(SETTLE);
    let mut answers = Vec::new();
    for attempt in 0..4 {
        if attempt > 0 {
            thread::sleep(Duration::from_secs(4));
        }
        let d = diagnose(router, grouping);
        let (kind, name) = first(&d);
        eprintln!(
            "{case}: first suspect {kind} {name} (score {}), {} bad pairs; suspects: {}",
            d["suspects"][0]["score"], d["bad_pairs"], d["suspects"]
        );
        if right(&kind, &name) {
            return;
        }
        answers.push(d);
    }
    let logs: Vec<String> = agents.iter().map(Daemon::stderr).collect();
    panic!(
        "{case}: the first suspect was never the right one: {answers:#?}\n--- agents' stderr ---\n{}",
        logs.join("\n---\n")
    );
}

#[test]
fn diagnose_names_the_faulty_host_or_rack() {
    let _file = crate::common::file_lock(module_path!());
    if !require_or_skip(
        "diagnose_names_the_faulty_host_or_rack",
        &[
            Need::Root,
            Need::Cmd("ip"),
            Need::Netns,
            Need::Cmd("tc"),
            Need::Cmd("nft"),
            Need::Cmd("sysctl"),
            Need::Cmd("prometheus"),
        ],
    ) {
        return;
    }
    let addrs = agents();
    let mut roles = vec!["r".to_owned()];
    roles.extend((0..addrs.len()).map(|i| format!("h{i}")));
    let roles: Vec<&str> = roles.iter().map(String::as_str).collect();
    let ns = Namespaces::new("diag", &roles);
    let router = ns.name(0);
    let host_ns = |i: usize| ns.name(i + 1);
    check(command_in(Some(router), tool("sysctl")).args(["-qw", "net.ipv4.ip_forward=1"]));
    for rack in 1..=RACKS {
        let br = format!("br{rack}");
        ip(router, &["link", "add", &br, "type", "bridge"]);
        ip(router, &["link", "set", "dev", &br, "addrgenmode", "none"]);
        ip(
            router,
            &["addr", "add", &format!("198.18.{rack}.254/24"), "dev", &br],
        );
        ip(router, &["link", "set", "dev", &br, "up"]);
    }
    for (i, a) in addrs.iter().enumerate() {
        let rack = i / PER_RACK + 1;
        let port = format!("p{i}");
        veth(host_ns(i), "eth0", router, &port);
        ip(
            router,
            &["link", "set", "dev", &port, "master", &format!("br{rack}")],
        );
        ip(router, &["link", "set", "dev", &port, "up"]);
        link_up(host_ns(i), "eth0", a, 1500, Segments::Whole);
        ip(
            host_ns(i),
            &[
                "route",
                "add",
                "198.18.0.0/15",
                "via",
                &format!("198.18.{rack}.254"),
            ],
        );
    }

    let dir = tempfile::tempdir().unwrap();
    let groups = dir.path().join("racks.txt");
    std::fs::write(
        &groups,
        addrs
            .iter()
            .enumerate()
            .map(|(i, a)| format!("{a} rack{}\n", i / PER_RACK + 1))
            .collect::<String>(),
    )
    .unwrap();
    // Each peer with its rack as a label: the agents export them (sonde_mesh_labels,
    // sonde_mesh_peer_labels), which `--group-label rack` reads back.
    let peers = addrs
        .iter()
        .enumerate()
        .map(|(i, a)| format!("\"{a} rack=rack{}\"", i / PER_RACK + 1))
        .collect::<Vec<_>>()
        .join(", ");
    let mut agents = Vec::new();
    for (i, a) in addrs.iter().enumerate() {
        let file = dir.path().join(format!("h{i}.toml"));
        // UDP probes only (loss is counted on UDP), 40 a second per peer: 600 in the window,
        // so a 2% loss is some 12 lost probes a pair, against none.
        std::fs::write(
            &file,
            format!(
                "name = \"set by SONDE_MESH_NAME\"\n[peers]\nhosts = [{peers}]\nrefresh = \"1s\"\n\
                 [latency]\nprotocols = [\"udp\"]\nrate = 40\nsession = \"1s\"\n"
            ),
        )
        .unwrap();
        let metrics = format!("{a}:{METRICS_PORT}");
        let (d, _, _) = mesh_agent(
            Some(host_ns(i)),
            Some(a),
            &[
                "--bind",
                a,
                "--port",
                "5300",
                "--quiet",
                "--max-sessions",
                "40",
                "--mesh",
                file.to_str().unwrap(),
                "--metrics",
                &metrics,
            ],
        );
        agents.push(d);
    }
    let targets = addrs
        .iter()
        .map(|a| format!("\"{a}:{METRICS_PORT}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n\
             scrape_configs:\n  - job_name: sonde\n    static_configs:\n      - targets: [{targets}]\n"
        ),
    )
    .unwrap();
    let mut prom_cmd = command_in(Some(router), tool("prometheus"));
    prom_cmd.args([
        &format!("--config.file={}", config.display()),
        &format!("--storage.tsdb.path={}", dir.path().join("tsdb").display()),
        &format!("--web.listen-address={PROM}"),
        "--log.level=warn",
    ]);
    // Killed and reaped when the test ends, passed or failed; the directory goes with `dir`.
    let _prometheus = Daemon::spawn(&mut prom_cmd);

    // Every ordered pair up and measured, as Prometheus sees it.
    let pairs = addrs.len() * (addrs.len() - 1);
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let out = common::run_with_timeout(
            command_in(Some(router), sonde_bin()).args([
                "mesh",
                "diagnose",
                "--prometheus",
                &format!("http://{PROM}"),
                "--window",
                "5s",
                "--json",
            ]),
            Duration::from_secs(30),
        );
        let ready = out.as_ref().ok().and_then(|o| {
            let d: Value = serde_json::from_str(&o.stdout).ok()?;
            let cells = d["pairs"].as_array()?;
            Some(
                cells.len() == pairs
                    && cells.iter().all(|c| {
                        c["up_fraction"].as_f64() == Some(1.0) && c["p99_rtt_ns"].is_u64()
                    }),
            )
        });
        if ready == Some(true) {
            break;
        }
        if Instant::now() > deadline {
            let logs: Vec<String> = agents.iter().map(Daemon::stderr).collect();
            panic!(
                "not every pair measured within 90 s: {out:?}\n--- agents' stderr ---\n{}",
                logs.join("\n---\n")
            );
        }
        thread::sleep(Duration::from_secs(1));
    }
    let by_file = ["--groups", groups.to_str().unwrap()];
    let by_label = ["--group-label", "rack"];
    // The healthy mesh, for the log (not asserted: a busy host's jitter is its own business).
    let d = diagnose(router, &by_file);
    eprintln!(
        "healthy: baseline p99 {} ns, {} bad pairs, suspects {}",
        d["baseline_p99_rtt_ns"], d["bad_pairs"], d["suspects"]
    );

    // The racks read from the agents' label series are the racks of the file, host by host.
    let from_labels = diagnose(router, &by_label);
    let group_of = |d: &Value| -> Vec<(String, String)> {
        d["hosts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| {
                let g = h["group"].as_str().unwrap_or("(none)");
                (h["host"].as_str().unwrap().to_owned(), g.to_owned())
            })
            .collect()
    };
    assert_eq!(group_of(&from_labels), group_of(&d), "--group-label rack");
    assert_eq!(
        group_of(&d).iter().filter(|(_, g)| g == "rack2").count(),
        PER_RACK
    );
    // The dashboard's two group panels (deploy/grafana/sonde-mesh.json: each source to each
    // target rack, through sonde_mesh_peer_labels) against this Prometheus: a cell for every
    // agent and rack, RTTs positive and under a second, a loss ratio (a busy host may lose a
    // probe or two even when healthy: under 5%, not NaN).
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../deploy/grafana/sonde-mesh.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let grouped: Vec<String> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["expr"].as_str().map(str::to_owned))
        .filter(|e| e.contains("$group_label"))
        .map(|e| e.replace("$group_label", "rack"))
        .collect();
    assert_eq!(grouped.len(), 2, "the dashboard's group panels");
    for expr in &grouped {
        let cells = crate::mesh::promtool_query(router, &format!("http://{PROM}"), expr)
            .unwrap_or_else(|| panic!("Prometheus did not answer {expr}"));
        let mut seen: Vec<(String, String)> = cells
            .iter()
            .map(|(l, _)| (l["source"].clone(), l["value"].clone()))
            .collect();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), addrs.len() * RACKS, "{expr}: {cells:?}");
        let rtt = expr.starts_with("histogram_quantile");
        for (l, v) in &cells {
            assert!(
                if rtt {
                    *v > 0.0 && *v < 1.0
                } else {
                    (0.0..0.05).contains(v)
                },
                "{expr}: {l:?} = {v}"
            );
        }
    }

    // 1. 1% loss each way on one host of rack 2.
    let lossy = 4;
    let nft = |args: &[&str]| check(command_in(Some(host_ns(lossy)), tool("nft")).args(args));
    nft(&["add", "table", "inet", "sonde_diag"]);
    for (chain, hook) in [("in", "input"), ("out", "output")] {
        nft(&[
            "add",
            "chain",
            "inet",
            "sonde_diag",
            chain,
            &format!("{{ type filter hook {hook} priority 0; policy accept; }}"),
        ]);
        nft(&[
            "add",
            "rule",
            "inet",
            "sonde_diag",
            chain,
            "numgen",
            "random",
            "mod",
            "100",
            "<",
            "1",
            "drop",
        ]);
    }
    let host = addrs[lossy].clone();
    expect_first(
        "1% drop on one host",
        router,
        &by_file,
        |kind, name| name == host && kind != "group",
        &agents,
    );
    nft(&["delete", "table", "inet", "sonde_diag"]);

    // 2. A slow uplink: rack 1's, the packets the router sends into it, through a 1 Mbit/s tbf
    // with up to 50 ms of queue, kept full by a bulk TCP transfer from rack 2 into rack 1
    // (bounded: 60 s, killed when this case ends).
    let tc = |args: &[&str]| check(Command::new(tool("tc")).args(["-n", router]).args(args));
    tc(&[
        "qdisc", "add", "dev", "br1", "root", "tbf", "rate", "1mbit", "burst", "15140", "latency",
        "50ms",
    ]);
    let mut load_cmd = command_in(Some(host_ns(PER_RACK)), sonde_bin());
    load_cmd
        .env("SONDE_DB", test_db())
        .env("SONDE_SECRET", "mesh lab secret")
        .args([
            "throughput",
            &format!("{}:5300", addrs[0]),
            "-t",
            "60",
            "--no-save",
        ]);
    let load = Daemon::spawn(&mut load_cmd);
    expect_first(
        "tbf queue on rack 1's uplink",
        router,
        &by_label,
        |kind, name| kind == "group" && name == "rack1",
        &agents,
    );
    drop(load);
    tc(&["qdisc", "del", "dev", "br1", "root"]);

    // 3. A killed agent, in rack 3.
    let dead = addrs.len() - 1;
    let host = addrs[dead].clone();
    drop(agents.remove(dead));
    expect_first(
        "killed agent",
        router,
        &by_label,
        |kind, name| name == host && kind != "group",
        &agents,
    );
}
