#!/usr/bin/env python3
"""A real mesh on one machine: N sonde agents, each in its own network namespace with its own
address, probing each other as their peer list plans, scraped by a real Prometheus; then
whether every planned pair is in Prometheus, and what each agent cost (issue 21: 200 agents for
10 minutes; CI runs a short version with --check).

The lab: a namespace `mf-br` holds a bridge; Prometheus lives in `mf-prom` (198.18.0.1/16) and
agent i in `mf-<i>`, each behind a veth on the bridge, at 198.18.<1 + i / 250>.<1 + i % 250>. Every agent reads
the same peer file (each line `ADDRESS rack=rK zone=zJ`, --rack-size agents a rack,
--zone-size racks a zone) and the same mesh file: UDP and TCP probes every --interval, and with
--select the Pingmesh policy (every peer in the rack, --neighbours on the ring across racks,
--representatives between zones); without it, every peer.

After --seconds, Prometheus is asked (promtool, PromQL):
- the plan: `sonde_peer_up`, one series for each (source, target) an agent probes;
- what was measured: pairs whose `sonde_rtt_seconds` count rose over the last 2 intervals,
  per protocol;
- loss: `sonde_probes_lost_total` over `sonde_probes_sent_total`, over the same window (and
  the run's totals);
- coverage: `sonde_mesh_incoming_probers` against `sonde_mesh_expected_incoming_probers`
  where the agents export them.
and each agent's /proc (CPU over the run, VmRSS, VmHWM, threads) is read before SIGTERM, and
its exit timed. The figures go to stdout (and --json FILE).

    sudo python3 bench/mesh_fleet.py --agents 200 --seconds 600 --select
    sudo python3 bench/mesh_fleet.py --agents 24 --seconds 60 --select --check   # CI

--check exits 1 unless every planned pair of each protocol was measured, no agent lost more
than 1% of its probes, every agent exited within 2 s of SIGTERM, and the incoming-prober
counts match the plan. Needs root, `ip`, `prometheus`, `promtool`, and a release build of sonde.
Addresses are from 198.18.0.0/15 only, inside namespaces this script makes and deletes (also on
failure or Ctrl-C). Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BRIDGE_NS = "mf-br"
# Prometheus' own namespace, a port of the bridge like every agent.
PROM_NS = "mf-prom"
BRIDGE_ADDR = "198.18.0.1"
PORT = 5300
METRICS_PORT = 9530
PROM = f"http://{BRIDGE_ADDR}:9090"


def log(msg: str) -> None:
    print(f"[mesh_fleet] {msg}", file=sys.stderr, flush=True)


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=check, capture_output=True, text=True, timeout=60)


def agent_addr(i: int) -> str:
    """Agent i's address.

    >>> agent_addr(0), agent_addr(249), agent_addr(250)
    ('198.18.1.1', '198.18.1.250', '198.18.2.1')
    """
    return f"198.18.{1 + i // 250}.{1 + i % 250}"


def peer_lines(n: int, rack_size: int, zone_size: int) -> list[str]:
    """The peer file: each agent with its rack and zone.

    >>> peer_lines(3, 2, 1)
    ['198.18.1.1 rack=r0 zone=z0', '198.18.1.2 rack=r0 zone=z0', '198.18.1.3 rack=r1 zone=z1']
    """
    out = []
    for i in range(n):
        rack = i // rack_size
        out.append(f"{agent_addr(i)} rack=r{rack} zone=z{rack // zone_size}")
    return out


def ns_name(i: int) -> str:
    return f"mf-{i}"


def cleanup(n: int) -> None:
    for i in range(n):
        sh("ip", "netns", "del", ns_name(i), check=False)
    sh("ip", "netns", "del", PROM_NS, check=False)
    sh("ip", "netns", "del", BRIDGE_NS, check=False)


# The kernel's ARP table is one for every namespace, capped by the initial namespace's
# gc_thresh3 (1,024 by default): 200 agents with some 25 neighbours each overflow it, and the
# kernel then drops packets to new neighbours ("neighbor table overflow"). Raised for the run
# to room for every agent's neighbours, and put back after.
NEIGH = [f"net.ipv4.neigh.default.gc_thresh{i}" for i in (1, 2, 3)]


def raise_neigh(n: int) -> dict[str, str]:
    old = {k: sh("sysctl", "-n", k).stdout.strip() for k in NEIGH}
    need = max(1024, 4 * n * n // 10 + 4 * n)
    for k, v in zip(NEIGH, (need // 4, need // 2, need)):
        if int(old[k]) < v:
            sh("sysctl", "-qw", f"{k}={v}")
    return old


def restore_neigh(old: dict[str, str]) -> None:
    for k in reversed(NEIGH):
        sh("sysctl", "-qw", f"{k}={old[k]}", check=False)


def build_lab(n: int) -> None:
    sh("ip", "netns", "add", BRIDGE_NS)
    sh("ip", "-n", BRIDGE_NS, "link", "set", "lo", "up")
    sh("ip", "-n", BRIDGE_NS, "link", "add", "br0", "type", "bridge")
    sh("ip", "-n", BRIDGE_NS, "link", "set", "br0", "up")
    # Prometheus scrapes from a namespace of its own behind a port of the bridge, as the agents
    # reach each other.
    sh("ip", "netns", "add", PROM_NS)
    sh("ip", "-n", PROM_NS, "link", "set", "lo", "up")
    sh("ip", "-n", PROM_NS, "link", "add", "eth0", "type", "veth", "peer", "name", "pprom", "netns", BRIDGE_NS)
    sh("ip", "-n", PROM_NS, "addr", "add", f"{BRIDGE_ADDR}/16", "dev", "eth0")
    sh("ip", "-n", PROM_NS, "link", "set", "eth0", "up")
    sh("ip", "-n", BRIDGE_NS, "link", "set", "pprom", "master", "br0")
    sh("ip", "-n", BRIDGE_NS, "link", "set", "pprom", "up")
    for i in range(n):
        ns = ns_name(i)
        sh("ip", "netns", "add", ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", f"p{i}", "netns", BRIDGE_NS)
        sh("ip", "-n", ns, "addr", "add", f"{agent_addr(i)}/16", "dev", "eth0")
        sh("ip", "-n", ns, "link", "set", "eth0", "up")
        sh("ip", "-n", BRIDGE_NS, "link", "set", f"p{i}", "master", "br0")
        sh("ip", "-n", BRIDGE_NS, "link", "set", f"p{i}", "up")


def proc_stats(pid: int) -> dict:
    status = Path(f"/proc/{pid}/status").read_text()
    kib = lambda key: int(re.search(rf"{key}:\s+(\d+) kB", status).group(1))  # noqa: E731
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])
    return {
        "rss_kib": kib("VmRSS"),
        "hwm_kib": kib("VmHWM"),
        "threads": int(re.search(r"Threads:\s+(\d+)", status).group(1)),
        "cpu_s": ticks / os.sysconf("SC_CLK_TCK"),
    }


def query(promql: str) -> list[tuple[dict, float]]:
    """An instant PromQL query through promtool, inside the bridge's namespace."""
    out = sh("ip", "netns", "exec", PROM_NS, "promtool", "query", "instant", "-o", "json", PROM, promql, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"promtool: {out.stderr.strip()}")
    return [(s["metric"], float(s["value"][1])) for s in json.loads(out.stdout or "[]")]


def pairs(result: list[tuple[dict, float]], keep=lambda v: True) -> set[tuple[str, str]]:
    return {(m.get("source", ""), m.get("target", "")) for m, v in result if keep(v)}


def summary(xs: list[float]) -> dict:
    xs = sorted(xs)
    return {"mean": sum(xs) / len(xs), "max": xs[-1], "median": xs[len(xs) // 2]} if xs else {}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agents", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=600.0, help="how long the mesh runs (default 600)")
    ap.add_argument("--interval", type=float, default=10.0, help="probe interval per pair and protocol, s (default 10)")
    ap.add_argument("--rack-size", type=int, default=20)
    ap.add_argument("--zone-size", type=int, default=5, help="racks a zone (default 5)")
    ap.add_argument("--select", action="store_true", help="the Pingmesh policy instead of every peer")
    ap.add_argument("--neighbours", type=int, default=4)
    ap.add_argument("--representatives", type=int, default=2)
    ap.add_argument("--sonde", default=str(REPO / "target" / "release" / "sonde"))
    ap.add_argument("--json", help="write the figures here too")
    ap.add_argument("--check", action="store_true", help="exit 1 unless the mesh is whole (see above)")
    args = ap.parse_args(argv)
    n = args.agents
    if not 2 <= n <= 1000:
        ap.error("--agents from 2 to 1000 (one bridge)")
    for tool in ("ip", "prometheus", "promtool"):
        if shutil.which(tool) is None:
            ap.error(f"{tool} is not installed")
    if os.geteuid() != 0:
        ap.error("needs root (network namespaces)")
    if not Path(args.sonde).exists():
        ap.error(f"{args.sonde} not found: cargo build --release -p sonde")

    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    cleanup(n)
    neigh = raise_neigh(n)
    agents: list[subprocess.Popen] = []
    prom = None
    interrupted = False

    def on_signal(*_):
        nonlocal interrupted
        interrupted = True
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    report: dict = {"agents": n, "seconds": args.seconds, "interval": args.interval, "select": args.select}
    ok = True
    with tempfile.TemporaryDirectory(prefix="mesh-fleet-", dir=REPO / "target") as tmp:
        work = Path(tmp)
        try:
            t0 = time.monotonic()
            build_lab(n)
            log(f"{n} namespaces and the bridge in {time.monotonic() - t0:.1f} s")
            (work / "secret").write_text(secrets.token_hex(16))
            (work / "peers.txt").write_text("\n".join(peer_lines(n, args.rack_size, args.zone_size)) + "\n")
            select = ""
            if args.select:
                select = (
                    f"[select]\ngroup = \"rack\"\nneighbours = {args.neighbours}\n"
                    f"across = \"zone\"\nrepresentatives = {args.representatives}\n"
                )
            (work / "mesh.toml").write_text(
                "name = \"set by SONDE_MESH_NAME\"\n"
                f"[peers]\nfile = \"{work / 'peers.txt'}\"\nrefresh = \"30s\"\n"
                f"[latency]\nprotocols = [\"udp\", \"tcp\"]\ninterval = \"{args.interval}s\"\n" + select
            )
            check = sh(args.sonde, "server", "--mesh", str(work / "mesh.toml"), "--check", check=False)
            if check.returncode != 0:
                raise RuntimeError(f"the mesh file: {check.stderr.strip()}")
            report["mesh_check"] = check.stdout.strip()
            for i in range(n):
                env = dict(os.environ, SONDE_MESH_NAME=agent_addr(i))
                agents.append(subprocess.Popen(
                    ["ip", "netns", "exec", ns_name(i), args.sonde, "server", "--bind", agent_addr(i),
                     "-p", str(PORT), "--quiet", "--mesh", str(work / "mesh.toml"),
                     "--metrics", f"{agent_addr(i)}:{METRICS_PORT}", "--secret-file", str(work / "secret")],
                    env=env, stdout=subprocess.DEVNULL, stderr=open(work / f"agent-{i}.log", "w")))
            (work / "prometheus.yml").write_text(
                "global:\n  scrape_interval: 10s\n  scrape_timeout: 5s\n"
                "scrape_configs:\n  - job_name: sonde\n    static_configs:\n      - targets: ["
                + ", ".join(f'"{agent_addr(i)}:{METRICS_PORT}"' for i in range(n)) + "]\n")
            prom = subprocess.Popen(
                ["ip", "netns", "exec", PROM_NS, "prometheus", f"--config.file={work / 'prometheus.yml'}",
                 f"--storage.tsdb.path={work / 'tsdb'}", f"--web.listen-address={BRIDGE_ADDR}:9090",
                 "--log.level=warn"],
                stdout=subprocess.DEVNULL, stderr=open(work / "prometheus.log", "w"))
            time.sleep(3)
            pids = {}
            for i, a in enumerate(agents):
                if a.poll() is not None:
                    raise RuntimeError(f"agent {i} exited: {(work / f'agent-{i}.log').read_text()[-2000:]}")
                # `ip netns exec` execs the agent: the child is the agent itself.
                pids[i] = a.pid
            start = {i: proc_stats(p) for i, p in pids.items()}
            t_start = time.monotonic()
            log(f"{n} agents up; running {args.seconds:g} s")
            while time.monotonic() - t_start < args.seconds:
                time.sleep(min(10.0, args.seconds - (time.monotonic() - t_start)) or 0.1)
                dead = [i for i, a in enumerate(agents) if a.poll() is not None]
                if dead:
                    raise RuntimeError(f"agents {dead} exited during the run")
            wall = time.monotonic() - t_start
            end = {i: proc_stats(p) for i, p in pids.items()}

            window = f"{int(max(2 * args.interval, 30))}s"
            plan = pairs(query("sonde_peer_up"))
            up = query("up")
            report["scrape_targets_up"] = sum(1 for _, v in up if v == 1)
            if not plan:
                log(f"no sonde_peer_up series in Prometheus; targets up: {report['scrape_targets_up']} of {len(up)}")
                log("prometheus.log: " + (work / "prometheus.log").read_text()[-3000:])
                t = sh("ip", "netns", "exec", PROM_NS, "python3", "-c",
                       f"import urllib.request; print(urllib.request.urlopen('{PROM}/api/v1/targets').read()[:1500])",
                       check=False)
                log("targets: " + t.stdout + t.stderr)
            per_proto = {}
            for proto in ("udp", "tcp"):
                got = pairs(query(f'increase(sonde_rtt_seconds_count{{protocol="{proto}"}}[{window}])'), lambda v: v > 0)
                missing = sorted(plan - got)
                per_proto[proto] = {"measured_pairs": len(got & plan), "missing": missing[:20], "missing_count": len(missing)}
                ok &= not missing
            # Loss in the steady state: over the same last window (the first probes of a mesh
            # starting up go to agents not listening yet).
            sent = {(m["source"], m["target"], m.get("protocol")): v
                    for m, v in query(f"increase(sonde_probes_sent_total[{window}])")}
            lost = {(m["source"], m["target"], m.get("protocol")): v
                    for m, v in query(f"increase(sonde_probes_lost_total[{window}])")}
            report["probes_sent_total"] = sum(v for _, v in query("sonde_probes_sent_total"))
            report["probes_lost_total"] = sum(v for _, v in query("sonde_probes_lost_total"))
            by_source: dict[str, list[float]] = {}
            for k, s in sent.items():
                by_source.setdefault(k[0], [0.0, 0.0])
                by_source[k[0]][0] += s
                by_source[k[0]][1] += lost.get(k, 0.0)
            loss = {src: (l / s if s else 0.0) for src, (s, l) in by_source.items()}
            worst = max(loss.items(), key=lambda kv: kv[1], default=("", 0.0))
            ok &= worst[1] <= 0.01
            incoming = {m.get("instance", ""): v for m, v in query("sonde_mesh_incoming_probers")}
            expected = {m.get("instance", ""): v for m, v in query("sonde_mesh_expected_incoming_probers")}
            short = sorted(k for k in expected if incoming.get(k, 0) < expected[k])
            ok &= not short and bool(incoming)
            series = query('count({__name__=~"sonde_.+"})')
            report.update({
                "planned_pairs": len(plan),
                "peers_per_agent": len(plan) / n,
                "protocols": per_proto,
                "worst_loss": {"source": worst[0], "ratio": worst[1]},
                "probes_sent_in_window": sum(sent.values()),
                "incoming_probers_short": short[:20],
                "incoming_probers": summary(list(incoming.values())),
                "sonde_series": series[0][1] if series else None,
                "series_per_agent": (series[0][1] / n) if series else None,
                "cpu_percent_of_one_core": summary([100.0 * (end[i]["cpu_s"] - start[i]["cpu_s"]) / wall for i in pids]),
                "rss_mib": summary([end[i]["rss_kib"] / 1024 for i in pids]),
                "peak_rss_mib": summary([end[i]["hwm_kib"] / 1024 for i in pids]),
                "threads": summary([end[i]["threads"] for i in pids]),
            })
            exits = []
            for a in agents:
                a.send_signal(signal.SIGTERM)
            t_term = time.monotonic()
            for a in agents:
                try:
                    a.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    a.kill()
                exits.append(time.monotonic() - t_term)
            report["sigterm_exit_seconds_max"] = max(exits)
            ok &= max(exits) <= 2.0
        except KeyboardInterrupt:
            log("interrupted")
            ok = False
        finally:
            for a in agents:
                if a.poll() is None:
                    a.kill()
                    a.wait()
            if prom is not None:
                prom.terminate()
                try:
                    prom.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    prom.kill()
            cleanup(n)
            restore_neigh(neigh)
    report["ok"] = ok
    print(json.dumps(report, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    if interrupted:
        return 130
    return 1 if args.check and not ok else 0


if __name__ == "__main__":
    sys.exit(main())
