//! Mesh mode end to end: agents measuring each other, scraped by a real Prometheus.
//!
//! `mesh_exposition_passes_promtool` (no root): two agents on loopback find each other through a
//! peer file written after they start (the file is re-read when it changes, each leaves itself
//! out), and what `/metrics` serves passes `promtool check metrics`.
//!
//! `mesh_select_probes_exactly_the_planned_pairs` (no root): five agents on loopback share a
//! labelled peer file and a `[select]` (racks of 2, 2 and 1, one ring neighbour): each probes
//! exactly the peers `sonde_engine::mesh_select` plans for it (its RTT series name them and no
//! other), and exports how many it probes and how many should probe it.
//!
//! `mesh_lab_four_agents_in_prometheus` (root, namespaces): four agents `198.18.0.1`-`.4`, each in
//! its own namespace, on one bridge in a fifth namespace, which also holds a real Prometheus
//! (Debian's `prometheus`, its storage in a temporary directory) scraping the four metrics
//! endpoints every second. The link from `.1` to `.2` goes through a `tc tbf` of 1 Mbit/s with a
//! queue of up to 50 ms (only packets to `.2`: an htb class picked by a u32 filter), kept full by
//! a bulk TCP transfer from `.1` to `.2`, so the pairs (.1, .2) and (.2, .1) have the higher RTT,
//! and only they. A PromQL query
//! through Prometheus' HTTP API (`promtool query instant`) must return the median RTT of all 12
//! ordered pairs, the two shaped ones above every other. Then `.3` is killed: the others must
//! report it unreachable (`sonde_peer_up` 0), its own series go stale, and the median RTT to it
//! from each live agent, over a window after its death, exists and is NaN (no sample), not 0.
//! No absolute timing is asserted: only the order of medians, which a full queue decides.
//!
//! Needs root, `ip`, `tc`, `prometheus` and `promtool`; without them the tests print `SKIP` and
//! pass, unless `SONDE_TEST_REQUIRE_ALL=1` (CI). About half a minute.

use crate::common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

use common::netns::{ip, link_up, veth, Namespaces, Segments};
use common::{check, command_in, require_or_skip, sonde_bin, test_db, tool, Daemon, Need};

/// The agents' addresses (RFC 2544 benchmarking range), one per namespace.
const AGENTS: [&str; 4] = ["198.18.0.1", "198.18.0.2", "198.18.0.3", "198.18.0.4"];
/// The bridge's own address, where Prometheus lives.
const BRIDGE_ADDR: &str = "198.18.0.254";
const METRICS_PORT: u16 = 9300;
/// The longest the slow link's tbf holds a packet.
const SHAPED_QUEUE: &str = "50ms";

/// A `sonde server --mesh` child, printing the agent's and the metrics' lines.
pub(crate) fn mesh_agent(
    netns: Option<&str>,
    name: Option<&str>,
    args: &[&str],
) -> (Daemon, SocketAddr, SocketAddr) {
    let mut cmd = command_in(netns, sonde_bin());
    if let Some(name) = name {
        cmd.env("SONDE_MESH_NAME", name);
    }
    cmd.env("SONDE_DB", test_db())
        .env("SONDE_SECRET", "mesh lab secret")
        .arg("server")
        .args(args);
    let mut d = Daemon::spawn(&mut cmd);
    let agent = d.wait_for_line(Duration::from_secs(10), |l| {
        let rest = l.strip_prefix("sonde agent listening on ")?;
        rest.split(' ').next()?.parse::<SocketAddr>().ok()
    });
    let metrics = d.wait_for_line(Duration::from_secs(10), |l| {
        let rest = l.strip_prefix("metrics served on http://")?;
        rest.strip_suffix("/metrics")?.parse::<SocketAddr>().ok()
    });
    (d, agent, metrics)
}

/// GET `path` from `addr` (loopback only), the whole response.
/// Whether the sample line starting with `prefix` ends with `end`.
fn sample_is(text: &str, prefix: &str, end: &str) -> bool {
    text.lines()
        .any(|l| l.starts_with(prefix) && l.ends_with(end))
}

fn http_get(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

fn body(response: &str) -> &str {
    response.split_once("\r\n\r\n").map_or("", |(_, b)| b)
}

#[test]
fn mesh_exposition_passes_promtool() {
    let _file = crate::common::file_lock(module_path!());
    if !require_or_skip("mesh_exposition_passes_promtool", &[Need::Cmd("promtool")]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let peers = dir.path().join("peers.txt");
    std::fs::write(&peers, "# filled in once both agents listen\n").unwrap();
    let mesh = |name: &str| {
        let path = dir.path().join(format!("{name}.toml"));
        std::fs::write(
            &path,
            format!(
                "name = \"{name}\"\nmax_link_share = 1\n\
                 [peers]\nfile = \"{}\"\nrefresh = \"200ms\"\n\
                 [latency]\ninterval = \"50ms\"\n\
                 [throughput]\nevery = \"3s\"\njitter = \"1s\"\ntime = \"300ms\"\nudp = true\nbitrate = \"10M\"\n\
                 [pps]\nevery = \"3s\"\njitter = \"1s\"\ntime = \"200ms\"\n",
                peers.display()
            ),
        )
        .unwrap();
        path
    };
    let (a_mesh, b_mesh) = (mesh("a"), mesh("b"));
    let start = |file: &std::path::Path| {
        mesh_agent(
            None,
            None,
            &[
                "--bind",
                "127.0.0.1",
                "--port",
                "0",
                "--mesh",
                file.to_str().unwrap(),
                "--metrics",
                "127.0.0.1:0",
            ],
        )
    };
    let (_a, a_addr, a_metrics) = start(&a_mesh);
    let (_b, b_addr, _) = start(&b_mesh);
    // Both agents in one list: each must probe the other and leave itself out.
    std::fs::write(&peers, format!("{a_addr}\n{b_addr}  # the other\n")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let text = loop {
        let r = http_get(a_metrics, "/metrics");
        let text = body(&r).to_owned();
        let nonzero = |prefix: &str, label: &str| {
            text.lines().any(|l| {
                l.starts_with(prefix)
                    && l.contains(&format!("target=\"{b_addr}\""))
                    && l.contains(label)
                    && !l.ends_with(" 0")
            })
        };
        // Probes over both protocols, and one scheduled test of each kind.
        let probed = nonzero("sonde_rtt_seconds_count{", "protocol=\"udp\"")
            && nonzero("sonde_rtt_seconds_count{", "protocol=\"tcp\"")
            && nonzero(
                "sonde_throughput_bytes_per_second{",
                "direction=\"forward\"",
            )
            && nonzero(
                "sonde_throughput_timestamp_seconds{",
                "direction=\"forward\"",
            )
            && nonzero("sonde_pps_received_per_second{", "")
            && nonzero("sonde_pps_timestamp_seconds{", "");
        // And b's of a, which a served: probes (no sessions) and scheduled tests.
        let served = sample_is(&text, "sonde_mesh_incoming_probers ", " 1")
            && ["throughput", "pps"].iter().all(|kind| {
                text.lines().any(|l| {
                    l.starts_with(&format!("sonde_sessions_total{{kind=\"{kind}\"}}"))
                        && !l.ends_with(" 0")
                })
            });
        if probed && served {
            break text;
        }
        assert!(Instant::now() < deadline, "no RTT of b from a:\n{text}");
        thread::sleep(Duration::from_millis(200));
    };
    assert!(text.contains(&format!(
        "sonde_peer_up{{source=\"a\",target=\"{b_addr}\"}} 1"
    )));
    // The worst UDP source port of the pair, and the TCP probes' connect times.
    for series in [
        "sonde_probes_lost_worst_port_ratio",
        "sonde_probes_worst_source_port",
    ] {
        assert!(
            text.contains(&format!(
                "{series}{{source=\"a\",target=\"{b_addr}\",protocol=\"udp\"}} "
            )),
            "{series}:\n{text}"
        );
    }
    assert!(
        text.contains(&format!(
            "sonde_tcp_connect_seconds_count{{source=\"a\",target=\"{b_addr}\"}} "
        )),
        "{text}"
    );
    assert!(
        !text.contains(&format!("target=\"{a_addr}\"")),
        "a probes itself:\n{text}"
    );
    // b's tests of a are sessions a served, with their bytes; its probes are none.
    assert!(
        text.contains("sonde_sessions_total{kind=\"latency\"} 0\n"),
        "{text}"
    );
    for kind in ["throughput", "pps"] {
        assert!(
            text.lines().any(|l| l
                .starts_with(&format!("sonde_sessions_total{{kind=\"{kind}\"}}"))
                && !l.ends_with(" 0")),
            "{kind}:\n{text}"
        );
    }
    assert!(text
        .lines()
        .any(|l| l.starts_with("sonde_served_bytes_total ") && !l.ends_with(" 0")));
    // A client without the secret is refused, and counted by its reason.
    let out = common::sonde_command()
        .env("SONDE_SECRET", "not the secret")
        .args([
            "latency",
            &a_addr.to_string(),
            "-t",
            "0.2",
            "--warmup",
            "0",
            "--no-save",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(4));
    let text = body(&http_get(a_metrics, "/metrics")).to_owned();
    assert!(
        text.contains("sonde_refusals_total{reason=\"unauthenticated\"} 1\n"),
        "{text}"
    );
    let mut promtool = Command::new(tool("promtool"));
    promtool
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = promtool.spawn().unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // b leaves the list: a stops probing it and drops every series of it (they go stale in
    // Prometheus; nothing reads 0).
    std::fs::write(&peers, format!("{a_addr}\n")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = body(&http_get(a_metrics, "/metrics")).to_owned();
        if !text.contains(&format!("target=\"{b_addr}\"")) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "b's series still served after it left the list:\n{text}"
        );
        thread::sleep(Duration::from_millis(200));
    }
    // The endpoint serves nothing else.
    assert!(http_get(a_metrics, "/").starts_with("HTTP/1.1 404"));
    assert!(http_get(a_metrics, "/healthz").starts_with("HTTP/1.1 200"));
}

/// The targets of `sonde_rtt_seconds_count` series with a sample, and the value of a gauge.
fn rtt_targets(text: &str) -> std::collections::BTreeSet<String> {
    text.lines()
        .filter(|l| l.starts_with("sonde_rtt_seconds_count{") && !l.ends_with(" 0"))
        .filter_map(|l| {
            let rest = l.split("target=\"").nth(1)?;
            Some(rest.split('"').next()?.to_owned())
        })
        .collect()
}

fn gauge(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} "))?.trim().parse().ok())
}

#[test]
fn mesh_select_probes_exactly_the_planned_pairs() {
    use sonde_engine::mesh_select::{Labels, Policy, Selection};
    let _file = crate::common::file_lock(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let peers = dir.path().join("peers.txt");
    std::fs::write(&peers, "# filled in once the agents listen\n").unwrap();
    let mesh = dir.path().join("mesh.toml");
    std::fs::write(
        &mesh,
        format!(
            "[peers]\nfile = \"{}\"\nrefresh = \"200ms\"\n\
             [latency]\nprotocols = [\"udp\"]\nrate = 20\nsession = \"1s\"\n\
             [select]\ngroup = \"rack\"\nneighbours = 1\n",
            peers.display()
        ),
    )
    .unwrap();
    let racks = ["r1", "r1", "r2", "r2", "r3"];
    let agents: Vec<(Daemon, SocketAddr, SocketAddr)> = racks
        .iter()
        .map(|_| {
            mesh_agent(
                None,
                None,
                &[
                    "--bind",
                    "127.0.0.1",
                    "--port",
                    "0",
                    "--quiet",
                    "--mesh",
                    mesh.to_str().unwrap(),
                    "--metrics",
                    "127.0.0.1:0",
                ],
            )
        })
        .collect();
    // Each agent is listed by its address: it finds itself by its own port on a local address.
    let list: Vec<(String, Labels)> = agents
        .iter()
        .zip(racks)
        .map(|((_, addr, _), rack)| {
            (
                addr.to_string(),
                Labels::from([("rack".to_owned(), rack.to_owned())]),
            )
        })
        .collect();
    let text: String = list
        .iter()
        .map(|(name, labels)| format!("{name} rack={}\n", labels["rack"]))
        .collect();
    std::fs::write(&peers, text).unwrap();
    let plan = Selection::new(
        list.clone(),
        &Policy {
            group: Some("rack".into()),
            neighbours: 1,
            ..Policy::default()
        },
    );
    for (d, addr, metrics) in &agents {
        let me = addr.to_string();
        let want: std::collections::BTreeSet<String> =
            plan.peers_of(&me).unwrap().map(str::to_owned).collect();
        // Rack mates at least, and r3's lone agent its ring neighbour.
        assert!(!want.is_empty());
        let deadline = Instant::now() + Duration::from_secs(30);
        let text = loop {
            let text = body(&http_get(*metrics, "/metrics")).to_owned();
            if rtt_targets(&text) == want {
                break text;
            }
            assert!(
                Instant::now() < deadline && rtt_targets(&text).is_subset(&want),
                "{me} probes {:?}, the plan {want:?}\n{}\n{text}",
                rtt_targets(&text),
                d.stderr()
            );
            thread::sleep(Duration::from_millis(200));
        };
        assert_eq!(
            gauge(&text, "sonde_mesh_probed_peers"),
            Some(want.len() as u64),
            "{text}"
        );
        assert_eq!(
            gauge(&text, "sonde_mesh_expected_incoming_probers"),
            plan.probers_of(&me).map(|n| n as u64),
            "{text}"
        );
        // Its peer file read, with every line (this agent's own among them), and no other
        // source said.
        let source = |name: &str| format!("sonde_mesh_peer_source_{name}{{peer_source=\"file\"}}");
        assert_eq!(gauge(&text, &source("up")), Some(1), "{text}");
        assert_eq!(gauge(&text, &source("peers")), Some(5), "{text}");
        assert!(!text.contains("peer_source=\"dns\""), "{text}");
    }
    // Every agent has a prober (K = 1), and the plan is not every pair.
    assert!(plan.names().all(|n| plan.probers_of(n).unwrap() >= 1));
    assert!(plan.pairs().count() < 5 * 4);
}

#[test]
fn mesh_usage_errors_exit_2() {
    let _file = crate::common::file_lock(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[peers]\nhosts = [\"198.18.0.2\"]\n[latency]\nprotocols = [\"icmp\"]\n",
    )
    .unwrap();
    let run = |args: &[&str]| {
        common::sonde_command()
            .arg("server")
            .args(args)
            .output()
            .unwrap()
    };
    let out = run(&["--mesh", bad.to_str().unwrap(), "--metrics", "127.0.0.1:0"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("bad.toml") && err.contains("icmp"), "{err}");
    assert!(out.stdout.is_empty(), "nothing may listen first");
    // --mesh needs somewhere to export to.
    let out = run(&["--mesh", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    // And the mesh's secret: its probes carry a MAC under it (agents answer none without).
    let good = dir.path().join("good.toml");
    std::fs::write(&good, "[peers]\nhosts = [\"198.18.0.2\"]\n").unwrap();
    let out = common::sonde_command()
        .env_remove("SONDE_SECRET")
        .args(["server", "--mesh", good.to_str().unwrap()])
        .args([
            "--metrics",
            "127.0.0.1:0",
            "--bind",
            "127.0.0.1",
            "--port",
            "0",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("shared secret"), "{err}");
    assert!(out.stdout.is_empty(), "nothing may listen first");
}

/// `promtool query instant` against the lab's Prometheus: the result vector as
/// `(labels, value)`; `None` while Prometheus cannot answer.
fn query(prom_ns: &str, promql: &str) -> Option<Vec<(BTreeMap<String, String>, f64)>> {
    promtool_query(prom_ns, &format!("http://{BRIDGE_ADDR}:9090"), promql)
}

/// `promtool query instant` from namespace `ns` against the Prometheus at `url`: the result
/// vector as `(labels, value)`; `None` while Prometheus cannot answer.
pub(crate) fn promtool_query(
    ns: &str,
    url: &str,
    promql: &str,
) -> Option<Vec<(BTreeMap<String, String>, f64)>> {
    let out = common::run_with_timeout(
        command_in(Some(ns), tool("promtool"))
            .args(["query", "instant", "-o", "json", url, promql]),
        Duration::from_secs(10),
    )
    .ok()?;
    if !out.status.success() {
        return None;
    }
    let v: Value = serde_json::from_str(&out.stdout).ok()?;
    let items = v.as_array()?;
    Some(
        items
            .iter()
            .filter_map(|s| {
                let labels = s["metric"]
                    .as_object()?
                    .iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                    .collect();
                // [time, "value"]; "NaN" parses as NaN.
                let value = s["value"][1].as_str()?.parse::<f64>().ok()?;
                Some((labels, value))
            })
            .collect(),
    )
}

/// Polls `promql` until `done` accepts its result, or panics after `limit`.
fn wait_for(
    prom_ns: &str,
    promql: &str,
    limit: Duration,
    mut done: impl FnMut(&[(BTreeMap<String, String>, f64)]) -> bool,
    what: &str,
    agents: &[Daemon],
) -> Vec<(BTreeMap<String, String>, f64)> {
    let deadline = Instant::now() + limit;
    let mut last = None;
    loop {
        if let Some(r) = query(prom_ns, promql) {
            if done(&r) {
                return r;
            }
            last = Some(r);
        }
        if Instant::now() > deadline {
            let logs: Vec<String> = agents.iter().map(Daemon::stderr).collect();
            panic!(
                "{what}: not within {limit:?}; last answer to `{promql}`: {last:?}\n--- agents' stderr ---\n{}",
                logs.join("\n---\n")
            );
        }
        thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn mesh_lab_four_agents_in_prometheus() {
    let _file = crate::common::file_lock(module_path!());
    if !require_or_skip(
        "mesh_lab_four_agents_in_prometheus",
        &[
            Need::Root,
            Need::Cmd("ip"),
            Need::Netns,
            Need::Cmd("tc"),
            Need::Cmd("prometheus"),
            Need::Cmd("promtool"),
        ],
    ) {
        return;
    }
    let ns = Namespaces::new("mesh", &["br", "n1", "n2", "n3", "n4"]);
    let br = ns.name(0);
    ip(br, &["link", "add", "br0", "type", "bridge"]);
    ip(br, &["link", "set", "dev", "br0", "addrgenmode", "none"]);
    ip(
        br,
        &["addr", "add", &format!("{BRIDGE_ADDR}/24"), "dev", "br0"],
    );
    ip(br, &["link", "set", "dev", "br0", "up"]);
    for (i, addr) in AGENTS.iter().enumerate() {
        let host = ns.name(i + 1);
        let port = format!("veth-{}", i + 1);
        veth(host, "eth0", br, &port);
        ip(br, &["link", "set", "dev", &port, "master", "br0"]);
        ip(br, &["link", "set", "dev", &port, "up"]);
        link_up(host, "eth0", addr, 1500, Segments::Whole);
    }
    // The slow link: .1's packets to .2 leave through an htb class whose leaf is a 1 Mbit/s
    // tbf with a queue of up to 50 ms (a u32 filter picks them); every other packet takes the
    // unlimited default class. (No netem here: the tbf queue, kept full by a bulk transfer below,
    // is the delay.)
    let n1 = ns.name(1);
    let tc = |args: &[&str]| check(Command::new(tool("tc")).args(["-n", n1]).args(args));
    tc(&[
        "qdisc", "add", "dev", "eth0", "root", "handle", "1:", "htb", "default", "10",
    ]);
    for class in ["1:10", "1:20"] {
        tc(&[
            "class", "add", "dev", "eth0", "parent", "1:", "classid", class, "htb", "rate",
            "10gbit",
        ]);
    }
    tc(&[
        "qdisc",
        "add",
        "dev",
        "eth0",
        "parent",
        "1:20",
        "handle",
        "20:",
        "tbf",
        "rate",
        "1mbit",
        "burst",
        "15140",
        "latency",
        SHAPED_QUEUE,
    ]);
    tc(&[
        "filter",
        "add",
        "dev",
        "eth0",
        "parent",
        "1:",
        "protocol",
        "ip",
        "prio",
        "1",
        "u32",
        "match",
        "ip",
        "dst",
        "198.18.0.2/32",
        "flowid",
        "1:20",
    ]);

    let dir = tempfile::tempdir().unwrap();
    let peers = AGENTS.map(|a| format!("\"{a}\"")).join(", ");
    let mut agents = Vec::new();
    for (i, addr) in AGENTS.iter().enumerate() {
        let file = dir.path().join(format!("n{}.toml", i + 1));
        std::fs::write(
            &file,
            format!(
                "name = \"set by SONDE_MESH_NAME\"\n[peers]\nhosts = [{peers}]\nrefresh = \"1s\"\n\
                 [latency]\ninterval = \"100ms\"\n"
            ),
        )
        .unwrap();
        let metrics = format!("{addr}:{METRICS_PORT}");
        // The environment names each agent, as Kubernetes' downward API would.
        let (d, _, _) = mesh_agent(
            Some(ns.name(i + 1)),
            Some(addr),
            &[
                "--bind",
                addr,
                "--port",
                "5300",
                "--quiet",
                "--mesh",
                file.to_str().unwrap(),
                "--metrics",
                &metrics,
            ],
        );
        agents.push(d);
    }

    // A bulk TCP transfer keeps the slow link's queue full (TCP fills whatever queue it is
    // given): every packet from .1 to .2 waits in it. Bounded: 60 s, killed when the test ends.
    let mut load_cmd = command_in(Some(n1), sonde_bin());
    load_cmd
        .env("SONDE_DB", test_db())
        .env("SONDE_SECRET", "mesh lab secret")
        .args(["throughput", "198.18.0.2:5300", "-t", "60", "--no-save"]);
    let _load = Daemon::spawn(&mut load_cmd);

    let targets = AGENTS.map(|a| format!("\"{a}:{METRICS_PORT}\"")).join(", ");
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n\
             scrape_configs:\n  - job_name: sonde\n    static_configs:\n      - targets: [{targets}]\n"
        ),
    )
    .unwrap();
    let storage = dir.path().join("tsdb");
    let mut prom_cmd = command_in(Some(br), tool("prometheus"));
    prom_cmd.args([
        &format!("--config.file={}", config.display()),
        &format!("--storage.tsdb.path={}", storage.display()),
        &format!("--web.listen-address={BRIDGE_ADDR}:9090"),
        "--log.level=warn",
    ]);
    // Killed and reaped when the test ends, passed or failed; the directory goes with `dir`.
    let _prometheus = Daemon::spawn(&mut prom_cmd);

    // The median RTT of every ordered pair, over what Prometheus scraped.
    let median = "histogram_quantile(0.5, sum by (source, target, le) \
                  (rate(sonde_rtt_seconds_bucket[20s])))";
    let medians = wait_for(
        br,
        median,
        Duration::from_secs(40),
        |r| r.len() == 12 && r.iter().all(|(_, v)| v.is_finite() && *v > 0.0),
        "the median RTT of all 12 ordered pairs",
        &agents,
    );
    for (l, v) in &medians {
        eprintln!(
            "median RTT {} -> {}: {:.3} ms",
            l["source"],
            l["target"],
            v * 1e3
        );
    }
    if std::env::var_os("MESH_LAB_EXCERPT").is_some() {
        // For docs/mesh.md's excerpt: what one agent serves (needs curl; not part of the test).
        let out = command_in(Some(ns.name(2)), "curl")
            .arg("-s")
            .arg(format!("http://{}:{METRICS_PORT}/metrics", AGENTS[1]))
            .output();
        if let Ok(out) = out {
            eprintln!("{}", String::from_utf8_lossy(&out.stdout));
        }
    }
    let shaped = |l: &BTreeMap<String, String>| {
        let pair = (l["source"].as_str(), l["target"].as_str());
        pair == (AGENTS[0], AGENTS[1]) || pair == (AGENTS[1], AGENTS[0])
    };
    let pairs: Vec<(&str, &str)> = medians
        .iter()
        .map(|(l, _)| (l["source"].as_str(), l["target"].as_str()))
        .collect();
    for s in AGENTS {
        for t in AGENTS {
            assert_eq!(
                pairs.contains(&(s, t)),
                s != t,
                "pair ({s}, {t}) in {medians:?}"
            );
        }
    }
    let slow_min = medians
        .iter()
        .filter(|(l, _)| shaped(l))
        .map(|(_, v)| *v)
        .fold(f64::INFINITY, f64::min);
    let fast_max = medians
        .iter()
        .filter(|(l, _)| !shaped(l))
        .map(|(_, v)| *v)
        .fold(0.0, f64::max);
    assert!(
        slow_min > fast_max,
        "the shaped pairs' median RTT ({slow_min} s at least) is not above every other pair's \
         ({fast_max} s at most): {medians:?}"
    );
    wait_for(
        br,
        "sonde_peer_up",
        Duration::from_secs(20),
        |r| r.len() == 12 && r.iter().all(|(_, v)| *v == 1.0),
        "sonde_peer_up 1 for all 12 ordered pairs",
        &agents,
    );

    // .3 dies mid-run.
    let dead = AGENTS[2];
    drop(agents.remove(2));
    let down = wait_for(
        br,
        &format!("sonde_peer_up{{target=\"{dead}\"}}"),
        Duration::from_secs(30),
        |r| r.len() == 3 && r.iter().all(|(_, v)| *v == 0.0),
        "the three live agents reporting the killed one unreachable",
        &agents,
    );
    assert!(down.iter().all(|(l, _)| l["source"] != dead));
    // Its own endpoint is gone: its series are stale (absent), not frozen.
    wait_for(
        br,
        &format!("sonde_peer_up{{source=\"{dead}\"}}"),
        Duration::from_secs(10),
        <[_]>::is_empty,
        "the killed agent's own series going stale",
        &agents,
    );
    // No RTT of it reads zero. It is still listed, so each live agent still exports its RTT
    // histogram to it, with no new sample since it died: over a window wholly after its death
    // the median from each of the three live agents exists (three series, scraped every second)
    // and is NaN, "no sample", never 0.
    thread::sleep(Duration::from_secs(4));
    let after = query(
        br,
        &format!(
            "histogram_quantile(0.5, sum by (source, target, le) \
             (rate(sonde_rtt_seconds_bucket{{target=\"{dead}\"}}[3s])))"
        ),
    )
    .unwrap();
    let mut sources: Vec<&str> = after.iter().map(|(l, _)| l["source"].as_str()).collect();
    sources.sort_unstable();
    let alive: Vec<&str> = AGENTS.iter().copied().filter(|a| *a != dead).collect();
    assert_eq!(sources, alive, "RTT series to the dead agent: {after:?}");
    assert!(
        after.iter().all(|(_, v)| v.is_nan()),
        "RTT of the dead agent: {after:?}"
    );
    // The six pairs of live agents are still measured. (A pair to the dead one may show some
    // increase too: probes answered just before it died.)
    let live = query(
        br,
        "sum by (source, target) (increase(sonde_rtt_seconds_count[5s])) > 0",
    )
    .unwrap();
    for s in AGENTS.iter().filter(|a| **a != dead) {
        for t in AGENTS.iter().filter(|a| **a != dead && *a != s) {
            assert!(
                live.iter()
                    .any(|(l, _)| l["source"] == *s && l["target"] == *t),
                "pair ({s}, {t}) no longer measured: {live:?}"
            );
        }
    }
}
