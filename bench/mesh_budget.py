#!/usr/bin/env python3
"""The mesh's budget at thousands of peers: one agent probing N peers and answering N peers'
probes, its CPU, memory and threads, at several N (issue 21: 5,000 peers at one probe per 10 s
per protocol within 1% of one core and 64 MiB).

What runs, all on loopback:

- the agent measured: `sonde server --mesh` on 127.0.0.1, its peer file listing N peers at
  N loopback addresses (127.1.0.1, 127.1.0.2, ...), UDP and TCP probes every --interval;
- the peers it probes: one plain `sonde server` bound to the wildcard address on another port
  answers for all N addresses (loopback delivers 127.0.0.0/8 to it; a mesh probe needs no
  session, so one agent answers any number of peers);
- the peers that probe it: this script, sending SNDP probes (docs/protocols/sonde.md, "Mesh
  probes") under N sender names at one per --interval per name and protocol, spread evenly: a
  UDP datagram, and a fresh TCP connection with one probe (as a peer's prober does), each
  reply's MAC checked.

For each N, after a warm-up of one interval, the agent's /proc/PID/stat (user + system CPU)
is read over --seconds, with VmRSS, VmHWM and Threads from /proc/PID/status, then its /metrics:
how many peers it probed and how many of its probes were lost, how many probers it saw
(`sonde_mesh_incoming_probers`). Then it gets SIGTERM and the time it takes to exit is taken.
The figures go to stdout as a table and, with --json FILE, as JSON.

With --floor, each count is measured a second time, right after sonde, on the floor:
bench/floor/floor.c's `mesh` (compiled here with gcc -O2), one C thread and one epoll loop doing
the same probe work with nothing around it (the same probes at the same rates and jitter, UDP
from 64 source ports, a fresh non-blocking TCP connection per probe, the timer coalesced to
--tick-ms; answering each UDP probe and each TCP connection at once; no MACs, no metrics),
its peers answered by a second floor bound to the wildcard address, and probed by the same
fleet. The table then adds the floor's CPU and sonde / floor. The ratio is the figure to read:
on loopback the kernel's receive processing of a packet runs in the sender's context (the
softirq on the sending CPU), so each measured process is charged for part of its peers' kernel
work, and the floor is charged the same way.

    cargo build --release -p sonde
    python3 bench/mesh_budget.py --peers 500,1000,2000,5000

Loopback only; every phase is bounded in time. Linux only (/proc). Standard library only.
The probe encoding is checked against one the Rust code wrote:

    python3 -m doctest bench/mesh_budget.py
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import ipaddress
import json
import os
import re
import secrets
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MAGIC = b"SNDP"
VERSION = 1
KIND_PROBE = 1
KIND_REPLY = 2
HEADER = 33
MAC_LEN = 16
PROBE_LABEL = b"sonde v1 mesh probe\0"
REPLY_LABEL = b"sonde v1 mesh probe reply\0"


def probe(secret: bytes, sender: str, seq: int, sent_ns: int, nonce: int, size: int = 64) -> bytes:
    """A mesh probe, as sonde-wire's `Probe::encode` writes it.

    >>> p = probe(b"mesh", "a", 7, 1_700_000_000_000_000_000, 42, 64)
    >>> len(p), p[:6]
    (64, b'SNDP\\x01\\x01')
    >>> check_reply(b"mesh", "a", reply_for(b"mesh", p)) == (7, 42)
    True
    """
    name = sender.encode()
    size = max(size, HEADER + len(name) + MAC_LEN)
    head = MAGIC + bytes([VERSION, KIND_PROBE]) + struct.pack(">HQQQB", size, seq, sent_ns, nonce, len(name))
    signed = head + name + bytes(size - MAC_LEN - HEADER - len(name))
    return signed + hmac.new(secret, PROBE_LABEL + signed, hashlib.sha256).digest()[:MAC_LEN]


def reply_for(secret: bytes, p: bytes) -> bytes:
    """The reply an agent gives to probe `p` (for the doctest)."""
    size, seq, sent, nonce, name_len = struct.unpack(">HQQQB", p[6:HEADER])
    sender = p[HEADER:HEADER + name_len]
    head = MAGIC + bytes([VERSION, KIND_REPLY]) + struct.pack(">HQQQB", size, seq, sent, nonce, 0)
    signed = head + bytes(size - MAC_LEN - HEADER)
    return signed + hmac.new(secret, REPLY_LABEL + signed + sender, hashlib.sha256).digest()[:MAC_LEN]


def check_reply(secret: bytes, sender: str, r: bytes) -> tuple[int, int] | None:
    """(seq, nonce) of a valid reply to one of `sender`'s probes, else None."""
    if len(r) < HEADER + MAC_LEN or r[:4] != MAGIC or r[4] != VERSION or r[5] != KIND_REPLY:
        return None
    size, seq, _sent, nonce, name_len = struct.unpack(">HQQQB", r[6:HEADER])
    if size != len(r) or name_len != 0:
        return None
    signed, mac = r[:-MAC_LEN], r[-MAC_LEN:]
    want = hmac.new(secret, REPLY_LABEL + signed + sender.encode(), hashlib.sha256).digest()[:MAC_LEN]
    return (seq, nonce) if hmac.compare_digest(mac, want) else None


def log(msg: str) -> None:
    print(f"[mesh_budget] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_tcp(host: str, port: int, proc: subprocess.Popen, what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{what} did not listen on {host}:{port} within {timeout} s")


def proc_stats(pid: int) -> dict:
    status = Path(f"/proc/{pid}/status").read_text()
    kib = lambda key: int(re.search(rf"{key}:\s+(\d+) kB", status).group(1))  # noqa: E731
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])  # utime + stime
    return {
        "rss_kib": kib("VmRSS"),
        "hwm_kib": kib("VmHWM"),
        "threads": int(re.search(r"Threads:\s+(\d+)", status).group(1)),
        "cpu_s": ticks / os.sysconf("SC_CLK_TCK"),
    }


def peer_addr(i: int) -> str:
    """The i-th simulated peer's address: 127.1.0.1 upwards, skipping .0 and .255."""
    return str(ipaddress.IPv4Address("127.1.0.0") + (i // 254) * 256 + i % 254 + 1)


def metric_values(text: str, name: str) -> list[tuple[dict, float]]:
    """Every sample of `name` in a Prometheus text exposition: (labels, value).

    >>> metric_values('a_total{source="x",target="y"} 3\\nb 1\\na_total{target="z"} 4\\n', "a_total")
    [({'source': 'x', 'target': 'y'}, 3.0), ({'target': 'z'}, 4.0)]
    """
    out = []
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name)}(?:\{{(.*)\}})? (\S+)", line)
        if m:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1) or ""))
            out.append((labels, float(m.group(2))))
    return out


class Fleet:
    """N simulated peers probing the agent: one UDP probe and one TCP probe per name per
    interval, spread evenly over the interval, from a background thread."""

    def __init__(self, secret: bytes, target: tuple[str, int], names: list[str], interval: float, size: int):
        self.secret, self.target, self.names = secret, target, names
        self.interval, self.size = interval, size
        self.stop = threading.Event()
        self.sent = {"udp": 0, "tcp": 0}
        self.answered = {"udp": 0, "tcp": 0}
        self.rate: dict[str, float] = {}
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        sel = selectors.DefaultSelector()
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        udp.setblocking(False)
        sel.register(udp, selectors.EVENT_READ, ("udp", None))
        outstanding: dict[int, str] = {}
        step = self.interval / max(len(self.names), 1)
        start = time.monotonic()
        k = 0
        while not self.stop.is_set():
            due = start + k * step
            now = time.monotonic()
            if now >= due:
                name = self.names[k % len(self.names)]
                seq = k // len(self.names)
                nonce = secrets.randbits(64)
                p = probe(self.secret, name, seq, time.time_ns(), nonce, self.size)
                outstanding[nonce] = name
                try:
                    udp.sendto(p, self.target)
                    self.sent["udp"] += 1
                except OSError:
                    pass
                # Its own nonce: the agent answers a (sender, nonce) once, whatever the protocol.
                tp = probe(self.secret, name, seq, time.time_ns(), secrets.randbits(64), self.size)
                c = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                c.setblocking(False)
                c.connect_ex(self.target)
                sel.register(c, selectors.EVENT_WRITE, ("tcp", (name, tp, bytearray(), time.monotonic())))
                self.sent["tcp"] += 1
                k += 1
                continue
            for key, ev in sel.select(timeout=min(due - now, 0.05)):
                kind, state = key.data
                if kind == "udp":
                    while True:
                        try:
                            r = udp.recv(2048)
                        except BlockingIOError:
                            break
                        got = None
                        # The reply echoes the nonce: its sender's name is what the MAC covers.
                        if len(r) >= HEADER:
                            nonce = struct.unpack(">Q", r[24:32])[0]
                            name = outstanding.pop(nonce, None)
                            if name is not None:
                                got = check_reply(self.secret, name, r)
                        if got is not None:
                            self.answered["udp"] += 1
                    continue
                name, p, buf, t0 = state
                s = key.fileobj
                if ev & selectors.EVENT_WRITE:
                    try:
                        s.send(p)
                        sel.modify(s, selectors.EVENT_READ, ("tcp", state))
                    except OSError:
                        sel.unregister(s)
                        s.close()
                    continue
                try:
                    chunk = s.recv(2048)
                except OSError:
                    chunk = b""
                buf += chunk
                if len(buf) >= len(p) or not chunk:
                    if len(buf) >= len(p) and check_reply(self.secret, name, bytes(buf[: len(p)])):
                        self.answered["tcp"] += 1
                    sel.unregister(s)
                    s.close()
            # Connections without an answer after 2 s are given up.
            now = time.monotonic()
            for key in list(sel.get_map().values()):
                kind, state = key.data
                if kind == "tcp" and now - state[3] > 2.0:
                    sel.unregister(key.fileobj)
                    key.fileobj.close()
            if len(outstanding) > 4 * len(self.names):
                outstanding.clear()
        for key in list(sel.get_map().values()):
            key.fileobj.close()

    def __enter__(self) -> "Fleet":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(timeout=5)


def window(args, proc: subprocess.Popen, port: int, n: int, secret: bytes) -> tuple[dict, dict, float, Fleet]:
    """Probes `proc` on `port` as N peers, and reads its /proc over the measured window:
    (before, after, wall seconds, the fleet)."""
    names = [f"sim-{i}" for i in range(n)]
    with Fleet(secret, ("127.0.0.1", port), names, args.interval, 64) as fleet:
        time.sleep(args.interval + args.warmup)
        before, t0 = proc_stats(proc.pid), time.monotonic()
        sent0 = dict(fleet.sent)
        time.sleep(args.seconds)
        after, t1 = proc_stats(proc.pid), time.monotonic()
        fleet.rate = {k: (fleet.sent[k] - sent0[k]) / (t1 - t0) for k in sent0}
    return before, after, t1 - t0, fleet


def measure(args, sonde: str, secret_file: Path, secret: bytes, responder_port: int, n: int, work: Path) -> dict:
    port, mport = free_port(), free_port()
    peers = work / f"peers-{n}.txt"
    peers.write_text("".join(f"{peer_addr(i)}:{responder_port}\n" for i in range(n)))
    mesh = work / f"mesh-{n}.toml"
    mesh.write_text(
        f'name = "under-test"\n'
        f"[peers]\nfile = \"{peers}\"\n"
        f"[latency]\nprotocols = [\"udp\", \"tcp\"]\ninterval = \"{args.interval}s\"\n"
    )
    cmd = [sonde, "server", "--bind", "127.0.0.1", "-p", str(port), "--quiet",
           "--mesh", str(mesh), "--metrics", f"127.0.0.1:{mport}", "--secret-file", str(secret_file)]
    # Its stderr to a file: a pipe nobody reads would stop the agent at its first full buffer
    # (a line per peer joining).
    agent = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(work / f"agent-{n}.log", "w"))
    try:
        wait_tcp("127.0.0.1", port, agent, "the agent")
        before, after, wall, fleet = window(args, agent, port, n, secret)
        text = urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=10).read().decode()
        sent = metric_values(text, "sonde_probes_sent_total")
        lost = metric_values(text, "sonde_probes_lost_total")
        incoming = metric_values(text, "sonde_mesh_incoming_probers")
        targets = {l.get("target") for l, v in sent if v > 0}
        t_stop = time.monotonic()
        agent.send_signal(signal.SIGTERM)
        try:
            agent.wait(timeout=10)
            exit_s = time.monotonic() - t_stop
        except subprocess.TimeoutExpired:
            exit_s = None
        return {
            "peers": n,
            "cpu_percent_of_one_core": 100.0 * (after["cpu_s"] - before["cpu_s"]) / wall,
            "rss_mib": after["rss_kib"] / 1024,
            "peak_rss_mib": after["hwm_kib"] / 1024,
            "threads": after["threads"],
            "probes_sent": sum(v for _, v in sent),
            "probes_lost": sum(v for _, v in lost),
            "peers_probed": len(targets),
            "incoming_probers": max((v for _, v in incoming), default=None),
            "fleet_probes_per_second": fleet.rate,
            "fleet_answered": dict(fleet.answered),
            "fleet_sent": dict(fleet.sent),
            "sigterm_exit_seconds": exit_s,
        }
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()


def measure_floor(args, floor: str, secret: bytes, responder_port: int, n: int) -> dict:
    """The floor program doing the same probe work as the agent (bench/floor/floor.c, `mesh`),
    probed by the same fleet, measured over the same window."""
    port = free_port()
    secs = args.interval + args.warmup + args.seconds + 5
    cmd = [floor, "mesh", str(port), "-N", str(n), "-P", str(responder_port),
           "-i", str(args.interval * 1000), "-k", str(args.tick_ms), "-t", str(secs)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        wait_tcp("127.0.0.1", port, proc, "the floor")
        before, after, wall, fleet = window(args, proc, port, n, secret)
        proc.send_signal(signal.SIGINT)  # nothing to save: its counts are only a sanity check
        out = proc.communicate(timeout=10)[0]
        counts = json.loads(out) if out.strip() else {}
        return {
            "peers": n,
            "cpu_percent_of_one_core": 100.0 * (after["cpu_s"] - before["cpu_s"]) / wall,
            "rss_mib": after["rss_kib"] / 1024,
            "threads": after["threads"],
            "fleet_probes_per_second": fleet.rate,
            "counts": counts,
        }
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def build_floor(work: Path) -> str:
    """Compiles bench/floor/floor.c with gcc -O2 into `work` (bench/compare.py's build)."""
    from compare import build_floor as build  # bench/ is this script's directory

    return build(work)


def ratio(sonde_cpu: float, floor_cpu: float | None) -> float | None:
    """sonde's CPU over the floor's for one peer count (None without a floor figure).

    >>> ratio(2.0, 0.5)
    4.0
    >>> ratio(2.0, None) is None, ratio(2.0, 0.0) is None
    (True, True)
    """
    if not floor_cpu:
        return None
    return sonde_cpu / floor_cpu


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peers", default="500,1000,2000,5000", help="peer counts (default 500,1000,2000,5000)")
    ap.add_argument("--interval", type=float, default=10.0, help="seconds between two probes of a pair per protocol (default 10)")
    ap.add_argument("--seconds", type=float, default=60.0, help="measured window per count (default 60)")
    ap.add_argument("--warmup", type=float, default=5.0, help="seconds after the first interval before measuring (default 5)")
    ap.add_argument("--sonde", default=str(REPO / "target" / "release" / "sonde"))
    ap.add_argument("--floor", action="store_true",
                    help="also measure bench/floor/floor.c's `mesh` (the same probe work and nothing else) at each "
                         "count, interleaved with sonde, and report sonde / floor")
    ap.add_argument("--tick-ms", type=float, default=5.0, help="the floor's timer coalescing, ms (default 5)")
    ap.add_argument("--rounds", type=int, default=1, help="sonde (then the floor) this many times per count (default 1)")
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args(argv)
    counts = [int(c) for c in args.peers.split(",")]
    if max(counts) > 254 * 256:
        ap.error("at most 65,024 peers (127.1.0.0/16)")
    if not 1 <= args.rounds <= 10 or not 0 < args.seconds <= 600 or not 1 <= args.interval <= 60:
        ap.error("--rounds within 1..10, --seconds within 0..600, --interval within 1..60")
    if not Path(args.sonde).exists():
        ap.error(f"{args.sonde} not found: cargo build --release -p sonde")
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    rows, floors = [], []
    with tempfile.TemporaryDirectory(prefix="mesh-budget-", dir=REPO / "target") as tmp:
        work = Path(tmp)
        secret = secrets.token_hex(16).encode()
        secret_file = work / "secret"
        secret_file.write_bytes(secret)
        rport = free_port()
        responder = subprocess.Popen(
            [args.sonde, "server", "--bind", "0.0.0.0", "-p", str(rport), "--quiet", "--secret-file", str(secret_file)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        floor_responder = None
        try:
            wait_tcp("127.0.0.1", rport, responder, "the responder")
            if args.floor:
                floor = build_floor(work)
                frport = free_port()
                # The floor's peers: one floor answering for every 127.1.x.y (as the responder
                # does for sonde), for as long as the whole run can take.
                total = len(counts) * args.rounds * 2 * (args.interval + args.warmup + args.seconds + 20)
                floor_responder = subprocess.Popen(
                    [floor, "mesh", str(frport), "-N", "0", "--any", "-t", str(min(total, 3600))],
                    stdout=subprocess.DEVNULL)
                wait_tcp("127.0.0.1", frport, floor_responder, "the floor's responder")
            for n in counts:
                for r in range(args.rounds):
                    log(f"{n} peers, round {r + 1}: {args.interval:g} s interval, measuring {args.seconds:g} s after {args.interval + args.warmup:g} s")
                    rows.append(measure(args, args.sonde, secret_file, secret, rport, n, work))
                    log(json.dumps(rows[-1]))
                    if args.floor:
                        floors.append(measure_floor(args, floor, secret, frport, n))
                        log(json.dumps(floors[-1]))
        finally:
            for p in (responder, floor_responder):
                if p is not None:
                    p.terminate()
                    p.wait(timeout=10)
    print(f"{'peers':>6} {'CPU % core':>10} {'RSS MiB':>8} {'peak MiB':>8} {'threads':>7} {'probed':>7} {'lost %':>7} {'probers':>8} {'exit s':>6}"
          + (f" {'floor %':>8} {'sonde/floor':>11}" if args.floor else ""))
    for i, r in enumerate(rows):
        lost = 100.0 * r["probes_lost"] / r["probes_sent"] if r["probes_sent"] else float("nan")
        line = (f"{r['peers']:>6} {r['cpu_percent_of_one_core']:>10.2f} {r['rss_mib']:>8.1f} {r['peak_rss_mib']:>8.1f} "
                f"{r['threads']:>7} {r['peers_probed']:>7} {lost:>7.2f} {str(r['incoming_probers']):>8} "
                f"{r['sigterm_exit_seconds'] if r['sigterm_exit_seconds'] is None else round(r['sigterm_exit_seconds'], 2)!s:>6}")
        if args.floor:
            f = floors[i]["cpu_percent_of_one_core"]
            q = ratio(r["cpu_percent_of_one_core"], f)
            r["floor_cpu_percent_of_one_core"], r["sonde_over_floor"] = f, q
            line += f" {f:>8.2f} {'—' if q is None else f'{q:.2f}x':>11}"
        print(line)
    if args.json:
        Path(args.json).write_text(json.dumps({"sonde": rows, "floor": floors}, indent=2) if args.floor else json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
