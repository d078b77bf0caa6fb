#!/usr/bin/env python3
"""sonde against the tools it replaces, on loopback, in one interleaved run.

For each round and each metric, sonde runs and then its Debian peer runs (A/B/A/B...), so
a machine that gets busier or quieter during the run moves both sides alike. The table shows
the median over the rounds of each side and their ratio (sonde / peer):

  UDP RTT p50, 64 B     sonde latency -u -m 64        vs sockperf ping-pong --full-rtt   within 5%
  TCP RTT p50, 64 B     sonde latency -m 64           vs sockperf ping-pong --tcp         within 5%
  TCP 1-stream bits/s   sonde throughput              vs iperf3 -c (receiver)             >= 1.0x
  UDP 18 B pps          sonde pps -m 18               vs iperf3 -u -b 0 -l 18 (received)  >= 3.0x

busy-polled, with no peer (no Linux tool busy-polls by default), against the floor only:

  UDP RTT p50, busy-polled  sonde latency -u --busy-poll --cpu A (agent pinned to B)
                            vs floor udp-ping --busy --cpu A (echo --busy --cpu B)       <= 1.10x floor
  TCP RTT p50, busy-polled  the same over TCP                                           <= 1.10x floor

and the real clients against sonde's compatibility listeners (same client, two servers):

  UDP RTT p50 (sockperf client)  sonde server --sockperf  vs sockperf sr          within 5%
  TCP RTT p50 (sockperf client)  sonde server --sockperf  vs sockperf sr --tcp    within 5%
  TCP 1 stream (iperf3 client)   sonde server --iperf3    vs iperf3 -s (receiver) >= 0.95x

and request/response over many connections (`sonde latency -P F --depth D`, 64-byte requests
and responses, two threads at each end), in transactions per second, against neper's tcp_rr
(built from its public source beside the repository, never committed: --neper DIR; the rows
run without their peer, with a printed reason, when it is absent) and the floor's epoll loop:

  TCP RR, 1 flow              -P 1 --depth 1    vs tcp_rr -F 1      >= 1.0x neper, >= 0.9x floor
  TCP RR, 16 flows            -P 16             vs tcp_rr -F 16 -T 2
  TCP RR, 256 flows           -P 256            vs tcp_rr -F 256 -T 2
  TCP RR, 16 flows x depth 8  -P 16 --depth 8   vs tcp_rr -F 128 -T 2 (neper keeps one request
                                                in flight per flow: 128 flows are the same 128
                                                requests in flight)
  UDP RR, the same four       -u                vs udp_rr           (the floor's udp-rr)

Every row also runs the floor: bench/floor/floor.c, compiled here with gcc, measures the same
figure with nothing around the system calls (a bare ping-pong, a TCP write loop into a read
loop, a sendmmsg loop into a recvmmsg loop). sonde / floor says how much of the machine's best
sonde reaches; sonde / peer says how it stands against the tool it replaces. Both come from the
same interleaved run (sonde, peer, floor, sonde, peer, floor, ...).

This is a benchmark, not a test: it exits 0 when every run worked, whatever the ratios
(--strict: exit 1 when a target is missed). Only loopback (127.0.0.1) is used.

The parsers are checked against real outputs kept in bench/fixtures/:

    python3 -m doctest bench/compare.py
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
FIXTURES = HERE / "fixtures"
HOST = "127.0.0.1"

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def fixture(name: str) -> str:
    """A captured tool output from bench/fixtures/."""
    return (FIXTURES / name).read_text()


# --------------------------------------------------------------------------------------------
# Parsers (pure: text in, numbers out)
# --------------------------------------------------------------------------------------------


def parse_sockperf(text: str) -> dict:
    """sockperf ping-pong's summary: percentiles, min, max and mean, in microseconds.

    `kind` is "rtt" with --full-rtt (figures are round trips) and "latency" without it
    (sockperf then prints half the round trip).

    >>> r = parse_sockperf(fixture("sockperf-pp-udp-64.txt"))
    >>> r["kind"], r["p50_us"], r["min_us"], r["max_us"], r["mean_us"]
    ('rtt', 62.762, 10.916, 3157.501, 55.559)
    >>> r["percentiles_us"][99.9], r["observations"], r["dropped"]
    (232.313, 27874, 0)
    >>> parse_sockperf(fixture("sockperf-pp-tcp-64.txt"))["p50_us"]
    58.516
    >>> parse_sockperf("sockperf: ---> percentile 50.000 =  7.5\\n")["kind"]
    Traceback (most recent call last):
    ...
    ValueError: sockperf output has no 'Summary:' line (did the run fail?)
    """
    text = ANSI.sub("", text)
    summary = re.search(r"Summary:\s+(Round trip|Latency) is\s+([\d.]+)\s+usec", text)
    if not summary:
        raise ValueError("sockperf output has no 'Summary:' line (did the run fail?)")
    percentiles = {
        float(p): float(v)
        for p, v in re.findall(r"--->\s+percentile\s+([\d.]+)\s*=\s*([\d.]+)", text)
    }
    if 50.0 not in percentiles:
        raise ValueError("sockperf output has no 'percentile 50.000' line")

    def one(pattern: str, cast=float):
        m = re.search(pattern, text)
        return cast(m.group(1)) if m else None

    return {
        "kind": "rtt" if summary.group(1) == "Round trip" else "latency",
        "mean_us": float(summary.group(2)),
        "percentiles_us": percentiles,
        "p50_us": percentiles[50.0],
        "min_us": one(r"<MIN> observation\s*=\s*([\d.]+)"),
        "max_us": one(r"<MAX> observation\s*=\s*([\d.]+)"),
        "observations": one(r"Total\s+(\d+)\s+observations", int),
        "dropped": one(r"# dropped messages\s*=\s*(\d+)", int),
    }


def parse_iperf3_tcp(text: str) -> dict:
    """iperf3 -J, TCP: the receiver's bits per second (what arrived, not what was sent).

    >>> r = parse_iperf3_tcp(fixture("iperf3-tcp.json"))
    >>> round(r["bits_per_second"] / 1e9, 3), r["retransmits"]
    (22.123, 4)
    """
    doc = json.loads(text)
    if "error" in doc:
        raise ValueError(f"iperf3: {doc['error']}")
    end = doc["end"]
    return {
        "bits_per_second": float(end["sum_received"]["bits_per_second"]),
        "bytes": int(end["sum_received"]["bytes"]),
        "retransmits": end.get("sum_sent", {}).get("retransmits"),
    }


def parse_iperf3_udp(text: str) -> dict:
    """iperf3 -J -u: datagrams the receiver got, per second of the receiver's time.

    `end.sum_received` (iperf3 >= 3.10) is the receiver's own view: its `packets` is the highest
    sequence seen and `lost_packets` the gaps below it, so packets - lost is what arrived.
    Older iperf3 only has `end.sum`, whose `packets` is the sender's count: packets - lost then
    counts the datagrams lost after the last one received as received (a few of a million).

    >>> r = parse_iperf3_udp(fixture("iperf3-udp-18.json"))
    >>> r["received"], r["lost"], round(r["seconds"], 6), round(r["pps"])
    (598826, 18081, 2.000085, 299400)
    >>> r["received"] * 18 == json.loads(fixture("iperf3-udp-18.json"))["end"]["sum_received"]["bytes"]
    True
    """
    doc = json.loads(text)
    if "error" in doc:
        raise ValueError(f"iperf3: {doc['error']}")
    end = doc["end"]
    s = end.get("sum_received") or end["sum"]
    received = int(s["packets"]) - int(s["lost_packets"])
    seconds = float(s["seconds"])
    return {
        "received": received,
        "lost": int(s["lost_packets"]),
        "seconds": seconds,
        "pps": received / seconds,
    }


_SI = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


def parse_qperf(text: str) -> dict:
    r"""`qperf HOST -ub -v ... tcp_bw`: its `bw` in bits per second (qperf's prefixes are SI) and
    its message rate.

    >>> r = parse_qperf(fixture("qperf-tcp-bw-1.txt"))
    >>> r["bits_per_second"], r["msg_rate"]
    (842000.0, 105000.0)
    >>> parse_qperf("tcp_bw:\n    bw  =  1.5 Gb/sec\n    msg_rate = 11.7 K/sec\n")["bits_per_second"]
    1500000000.0
    >>> parse_qperf("tcp_bw:\n    bw  =  90.1 KB/sec\n")
    Traceback (most recent call last):
    ...
    ValueError: qperf printed no bw in bits (run it with -ub): 'tcp_bw:\n    bw  =  90.1 KB/sec\n'
    """
    bw = re.search(r"^\s*bw\s*=\s*([\d.,]+)\s*([KMGT]?)b/sec", text, re.M)
    if not bw:
        raise ValueError(f"qperf printed no bw in bits (run it with -ub): {text!r}")
    rate = re.search(r"^\s*msg_rate\s*=\s*([\d.,]+)\s*([KMGT]?)/sec", text, re.M)

    def num(m):
        return float(m.group(1).replace(",", "")) * _SI[m.group(2)]

    return {"bits_per_second": num(bw), "msg_rate": num(rate) if rate else None}


def parse_floor(text: str, key: str) -> float:
    """bench/floor/floor.c's one JSON line: the figure under `key` (p50_ns is given in µs).

    >>> parse_floor('{"p50_ns": 11227, "min_ns": 10806, "samples": 84202, "lost": 0}', "p50_ns")
    11.227
    >>> parse_floor('{"bits_per_second": 16864989484, "bytes": 4217241600, "seconds": 2.0}', "bits_per_second")
    16864989484.0
    >>> parse_floor('{"pps": 0, "received": 0, "sent": 10, "seconds": 0}', "pps")
    Traceback (most recent call last):
    ...
    ValueError: the floor program measured nothing: {'pps': 0, 'received': 0, 'sent': 10, 'seconds': 0}
    """
    doc = json.loads(text)
    value = float(doc[key])
    if value <= 0:
        raise ValueError(f"the floor program measured nothing: {doc}")
    return value / 1000.0 if key == "p50_ns" else value


def parse_sonde(text: str, test: str) -> dict:
    """sonde --json: the one figure each comparison quotes.

    >>> parse_sonde('{"test": "latency", "rtt_ns": {"p50": 12345}}', "latency")
    {'p50_us': 12.345}
    >>> parse_sonde('{"test": "throughput", "receiver": {"bits_per_second": 2e10}}', "throughput")
    {'bits_per_second': 20000000000.0}
    >>> parse_sonde('{"test": "pps", "received_pps": 1e6, "lost": 3}', "pps")
    {'pps': 1000000.0, 'lost': 3}
    >>> parse_sonde('{"test": "latency", "request_response": {"transactions_per_second": 5e5}}', "rr")
    {'tps': 500000.0}
    >>> parse_sonde('{"test": "latency", "samples": 300, "duration_ns": 4e9, "warmup_ns": 1e9}', "rr")
    {'tps': 100.0}
    >>> parse_sonde('{"test": "pps"}', "latency")
    Traceback (most recent call last):
    ...
    ValueError: expected a latency result, got pps
    """
    doc = json.loads(text)
    if test == "rr":
        # Transactions per second: the many-flow figure, or (-P 1 --depth 1, the one-flow
        # test) the samples over the measured time.
        if doc.get("test") != "latency":
            raise ValueError(f"expected a latency result, got {doc.get('test')}")
        rr = doc.get("request_response")
        if rr is not None:
            return {"tps": float(rr["transactions_per_second"])}
        measured = (doc["duration_ns"] - doc["warmup_ns"]) / 1e9
        return {"tps": doc["samples"] / measured}
    if doc.get("test") != test:
        raise ValueError(f"expected a {test} result, got {doc.get('test')}")
    if test == "latency":
        p50 = doc["rtt_ns"]["p50"]
        if p50 is None:
            raise ValueError("sonde reported no p50 (too few samples)")
        return {"p50_us": p50 / 1000.0}
    if test == "throughput":
        return {"bits_per_second": float(doc["receiver"]["bits_per_second"])}
    if test == "pps":
        return {"pps": float(doc["received_pps"]), "lost": doc.get("lost")}
    raise ValueError(f"unknown test {test}")


def parse_neper(text: str) -> dict:
    """neper tcp_rr's client summary (key=value lines): its transactions per second.

    >>> parse_neper(fixture("neper-tcp-rr-16.txt"))
    {'tps': 202694.47, 'transactions': 402784}
    >>> parse_neper(fixture("neper-udp-rr-16.txt"))
    {'tps': 236963.0, 'transactions': 453266}
    >>> parse_neper("num_flows=1\\n")
    Traceback (most recent call last):
    ...
    ValueError: neper printed no throughput= line (did the run fail?)
    """
    kv = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    if "throughput" not in kv:
        raise ValueError("neper printed no throughput= line (did the run fail?)")
    return {"tps": float(kv["throughput"]), "transactions": int(kv.get("num_transactions", 0))}


# --------------------------------------------------------------------------------------------
# Running things
# --------------------------------------------------------------------------------------------


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def free_port() -> int:
    """A port free for both TCP and UDP on 127.0.0.1 right now."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as t:
            t.bind((HOST, 0))
            port = t.getsockname()[1]
            try:
                with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
                    u.bind((HOST, port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port on 127.0.0.1")


def run(cmd: list[str], timeout: float) -> str:
    """Runs cmd, returns stdout; raises with stderr on failure or time-out."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(f"`{' '.join(cmd)}` did not finish within {timeout:.0f} s") from e
    if p.returncode != 0:
        raise RuntimeError(
            f"`{' '.join(cmd)}` exited {p.returncode}\n{p.stderr.strip()}\n{p.stdout.strip()[-2000:]}"
        )
    return p.stdout


def wait_tcp(port: int, proc: subprocess.Popen, what: str, timeout: float = 10.0) -> None:
    """Waits until something accepts TCP connections on 127.0.0.1:port."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited ({proc.returncode}) before listening")
        try:
            with socket.create_connection((HOST, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} not listening on {HOST}:{port} within {timeout:.0f} s")


class Servers:
    """The servers, started once; all stopped by close() (also on error)."""

    def __init__(self) -> None:
        self.procs: list[tuple[str, subprocess.Popen]] = []

    def start(self, what: str, cmd: list[str], **kw) -> subprocess.Popen:
        log(f"start {what}: {' '.join(cmd)}")
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, **kw)
        self.procs.append((what, proc))
        return proc

    def close(self) -> None:
        for what, proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            log(f"stopped {what}")
        self.procs.clear()


def start_sonde_agent(servers: Servers, sonde: str, extra: list[str] | None = None) -> int:
    """sonde server on an OS-chosen port (plus `extra` options); returns the port from its
    ready line."""
    proc = servers.start(
        "sonde agent",
        [sonde, "server", "--bind", HOST, "--port", "0"] + (extra or []),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    lines: queue.Queue = queue.Queue()

    def pump() -> None:
        # Keeps reading after the ready line so the agent never blocks on (or dies of) a full pipe.
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + 10
    while (left := deadline - time.monotonic()) > 0:
        try:
            line = lines.get(timeout=left)
        except queue.Empty:
            break
        if line is None:
            raise RuntimeError(f"sonde agent exited ({proc.wait()}) before its ready line")
        m = re.match(r"sonde agent listening on (\S+):(\d+) ", line)
        if m:
            return int(m.group(2))
    raise RuntimeError("sonde agent printed no ready line")


# --------------------------------------------------------------------------------------------
# The comparisons
# --------------------------------------------------------------------------------------------


class Metric:
    """One row: sonde's command, its peer's (None: no peer does this) and the floor's, each with
    the parser of its figure. `ok` judges the row's target from (sonde/peer, sonde/floor)."""

    def __init__(self, key, title, unit, scale, target, ok, sonde_cmd, peer_cmd, sonde_fig, peer_fig, floor):
        self.key, self.title, self.unit, self.scale = key, title, unit, scale
        self.target, self.ok = target, ok
        self.sonde_cmd, self.peer_cmd = sonde_cmd, peer_cmd
        self.sonde_fig, self.peer_fig = sonde_fig, peer_fig
        self.floor_cmd, self.floor_fig = floor
        self.sonde: list[float] = []
        self.peer: list[float] = []
        self.floor: list[float] = []


def metrics(
    sonde: str, ports: dict, secs: int, floor: str, cpus: tuple[int, int] | None, neper: str | None = None
) -> list[Metric]:
    """Every row; `cpus` (client, server) for the busy-polled rows, which need two CPUs;
    `neper` the directory of a neper build (None: the request/response rows run without it)."""
    t = str(secs)
    agent = f"{HOST}:{ports['sonde']}"
    # The floor's io_uring echo runs only where the floor was built with liburing.
    floor_uring = "floor_uring_rr_echo" in ports

    def floor_ping(port: int, tcp: bool) -> tuple:
        # sonde latency and sockperf warm up for 1 s (sockperf 2 s); the floor does 1 s too.
        cmd = [floor, "tcp-ping" if tcp else "udp-ping", HOST, str(port), "-m", "64", "-t", t, "-w", "1"]
        return cmd, lambda out: parse_floor(out, "p50_ns")

    floor_udp_rtt = floor_ping(ports["floor_udp_echo"], tcp=False)
    floor_tcp_rtt = floor_ping(ports["floor_tcp_echo"], tcp=True)
    floor_tcp_bps = (
        [floor, "tcp-stream", HOST, str(ports["floor_tcp_sink"]), "-t", t, "-l", "131072"],
        lambda out: parse_floor(out, "bits_per_second"),
    )
    floor_udp_pps = (
        [floor, "udp-blast", HOST, str(ports["floor_udp_sink"]), "-m", "18", "-t", t],
        lambda out: parse_floor(out, "pps"),
    )

    def sockperf(port: int, tcp: bool) -> list[str]:
        cmd = ["sockperf", "ping-pong", "-i", HOST, "-p", str(port), "-t", t, "-m", "64", "--full-rtt"]
        return cmd + (["--tcp"] if tcp else [])

    def within(pct):
        return lambda r, _floor: r is not None and abs(r - 1.0) <= pct

    def at_least(x):
        return lambda r, _floor: r is not None and r >= x

    def tiny_writes(size: int) -> Metric:
        # TCP with tiny writes: what a tool spends around each write system call. qperf's
        # tcp_bw is the peer that does this by default (iperf3 has no such mode worth the name).
        # qperf's receiver reads one message per recv, and the receiver's read size sets the
        # segment sizes (a receiver that drains its queue has TCP acknowledge at once, and
        # Nagle then sends each write alone), so sonde and the floor read `size` bytes per call
        # too: the same workload on all three.
        return Metric(
            f"tcp_bps_{size}", f"TCP 1 stream, {size} B writes and reads", "Mbit/s", 1e-6, "≥ 0.95×",
            at_least(0.95),
            [sonde, "throughput", agent, "-l", str(size), "--read-size", str(size), "-t", t, "--json"],
            ["qperf", HOST, "-lp", str(ports["qperf"]), "-ub", "-v", "-t", t, "-m", str(size), "tcp_bw"],
            lambda out: parse_sonde(out, "throughput")["bits_per_second"],
            lambda out: parse_qperf(out)["bits_per_second"],
            (
                [floor, "tcp-stream", HOST, str(ports[f"floor_tcp_sink_{size}"]), "-t", t, "-l", str(size)],
                lambda out: parse_floor(out, "bits_per_second"),
            ),
        )

    def iperf3(port: int) -> list[str]:
        return ["iperf3", "-c", HOST, "-p", str(port), "-t", t, "-J"]

    def at_most_floor(x):
        return lambda _peer, r: r is not None and r <= x

    def at_least_floor(x):
        return lambda _peer, r: r is not None and r >= x

    busy = []
    if cpus is not None:
        client_cpu = str(cpus[0])
        for key, title, tcp in (
            ("busy_udp_rtt", "UDP RTT p50, 64 B, busy-polled", False),
            ("busy_tcp_rtt", "TCP RTT p50, 64 B, busy-polled", True),
        ):
            cmd, fig = floor_ping(ports["floor_busy_tcp_echo" if tcp else "floor_busy_udp_echo"], tcp)
            busy.append(
                Metric(
                    key, title, "µs", 1.0, "≤ 1.10× floor", at_most_floor(1.10),
                    [sonde, "latency", agent, "-m", "64", "-t", t, "--busy-poll", "--cpu", client_cpu, "--json"]
                    + ([] if tcp else ["-u"]),
                    None,
                    lambda out: parse_sonde(out, "latency")["p50_us"],
                    None,
                    (cmd + ["--busy", "--cpu", client_cpu], fig),
                )
            )

    threads = max(1, min(2, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 2))

    def rr(key: str, title: str, flows: int, depth: int, neper_flows: int, udp: bool = False,
           uring: bool = False) -> Metric:
        # Two threads at each end for all three (neper -T, sonde --threads and the agent's
        # default of one per core on this 2-core machine, the floor's -T), at most one per flow.
        # uring: the peer is the floor's io_uring loops at both ends instead of neper (the
        # question: would sonde gain from io_uring), the floor column its epoll loops as ever.
        t_n = str(min(threads, flows))
        sonde_cmd = [sonde, "latency", agent, "-P", str(flows), "--depth", str(depth), "-m", "64",
                     "-t", t, "--warmup", "1", "--threads", t_n, "--json"] + (["-u"] if udp else [])

        def floor_rr(echo: str, extra: list[str]) -> list[str]:
            return [floor, "udp-rr" if udp else "tcp-rr", HOST, str(ports[echo]), "-F", str(flows),
                    "-D", str(depth), "-m", "64", "-T", t_n, "-t", t, "-w", "1"] + extra

        peer, target, ok = None, "≥ 1.0× neper, ≥ 0.9× floor", (
            lambda rp, rf: (rp is None or rp >= 1.0) and rf is not None and rf >= 0.9
        )
        if uring:
            peer = floor_rr("floor_uring_rr_echo", ["--uring"]) if floor_uring else None
            target = "≥ 0.9× io_uring floor, ≥ 0.9× floor"
            ok = lambda rp, rf: rp is not None and rp >= 0.9 and rf is not None and rf >= 0.9  # noqa: E731
        elif neper is not None:
            peer = neper_rr(neper, ports["neper_ctl"], ports["neper_data"], neper_flows,
                            str(min(threads, neper_flows)), secs, "udp_rr" if udp else "tcp_rr")
        return Metric(
            key, title, "k tps", 1e-3, target, ok,
            sonde_cmd,
            peer,
            lambda out: parse_sonde(out, "rr")["tps"],
            (lambda out: parse_floor(out, "tps")) if uring else (lambda out: parse_neper(out)["tps"]),
            (floor_rr("floor_udp_rr_echo" if udp else "floor_rr_echo", []), lambda out: parse_floor(out, "tps")),
        )

    rr_rows = [
        rr("rr_1", "TCP RR, 1 flow", 1, 1, 1),
        rr("rr_16", "TCP RR, 16 flows", 16, 1, 16),
        rr("rr_256", "TCP RR, 256 flows", 256, 1, 256),
        rr("rr_16x8", "TCP RR, 16 flows x depth 8", 16, 8, 128),
        rr("udp_rr_1", "UDP RR, 1 flow", 1, 1, 1, udp=True),
        rr("udp_rr_16", "UDP RR, 16 flows", 16, 1, 16, udp=True),
        rr("udp_rr_256", "UDP RR, 256 flows", 256, 1, 256, udp=True),
        rr("udp_rr_16x8", "UDP RR, 16 flows x depth 8", 16, 8, 128, udp=True),
        rr("uring_rr_1", "TCP RR, 1 flow, io_uring floor", 1, 1, 1, uring=True),
        rr("uring_rr_16", "TCP RR, 16 flows, io_uring floor", 16, 1, 16, uring=True),
        rr("uring_rr_256", "TCP RR, 256 flows, io_uring floor", 256, 1, 256, uring=True),
        rr("uring_rr_16x8", "TCP RR, 16 flows x depth 8, io_uring floor", 16, 8, 16, uring=True),
    ]

    return busy + rr_rows + [
        Metric(
            "srv_udp_rtt", "UDP RTT p50, 64 B, sockperf client", "µs", 1.0, "within ±5%", within(0.05),
            sockperf(ports["sonde_sockperf"], tcp=False),
            sockperf(ports["sockperf_udp"], tcp=False),
            lambda out: rtt_us(parse_sockperf(out)),
            lambda out: rtt_us(parse_sockperf(out)),
            floor_udp_rtt,
        ),
        Metric(
            "srv_tcp_rtt", "TCP RTT p50, 64 B, sockperf client", "µs", 1.0, "within ±5%", within(0.05),
            sockperf(ports["sonde_sockperf"], tcp=True),
            sockperf(ports["sockperf_tcp"], tcp=True),
            lambda out: rtt_us(parse_sockperf(out)),
            lambda out: rtt_us(parse_sockperf(out)),
            floor_tcp_rtt,
        ),
        Metric(
            "srv_tcp_bps", "TCP 1 stream, iperf3 client", "Gbit/s", 1e-9, "≥ 0.95×", at_least(0.95),
            iperf3(ports["sonde_iperf3"]),
            iperf3(ports["iperf3"]),
            lambda out: parse_iperf3_tcp(out)["bits_per_second"],
            lambda out: parse_iperf3_tcp(out)["bits_per_second"],
            floor_tcp_bps,
        ),
        Metric(
            "udp_rtt", "UDP RTT p50, 64 B", "µs", 1.0, "within ±5%", within(0.05),
            [sonde, "latency", agent, "-u", "-m", "64", "-t", t, "--json"],
            sockperf(ports["sockperf_udp"], tcp=False),
            lambda out: parse_sonde(out, "latency")["p50_us"],
            lambda out: rtt_us(parse_sockperf(out)),
            floor_udp_rtt,
        ),
        Metric(
            "tcp_rtt", "TCP RTT p50, 64 B", "µs", 1.0, "within ±5%", within(0.05),
            [sonde, "latency", agent, "-m", "64", "-t", t, "--json"],
            sockperf(ports["sockperf_tcp"], tcp=True),
            lambda out: parse_sonde(out, "latency")["p50_us"],
            lambda out: rtt_us(parse_sockperf(out)),
            floor_tcp_rtt,
        ),
        Metric(
            "tcp_bps", "TCP 1 stream", "Gbit/s", 1e-9, "≥ 1.0×", at_least(1.0),
            [sonde, "throughput", agent, "-t", t, "--json"],
            ["iperf3", "-c", HOST, "-p", str(ports["iperf3"]), "-t", t, "-J"],
            lambda out: parse_sonde(out, "throughput")["bits_per_second"],
            lambda out: parse_iperf3_tcp(out)["bits_per_second"],
            floor_tcp_bps,
        ),
        Metric(
            # Judged against the floor: `sonde pps` sends one datagram per packet on loopback
            # (--gso auto: a GSO batch would cross it as one packet), so every datagram costs
            # the sending core the whole stack, receive side included, and a bare
            # sendmmsg/recvmmsg pair is the ceiling. The ratio to iperf3 (one send per
            # datagram) is printed beside it.
            "udp_pps", "UDP 18 B received", "Mpps", 1e-6, "≥ 0.95× floor", at_least_floor(0.95),
            [sonde, "pps", agent, "-m", "18", "-t", t, "--json"],
            ["iperf3", "-c", HOST, "-p", str(ports["iperf3"]), "-u", "-b", "0", "-l", "18", "-t", t, "-J"],
            lambda out: parse_sonde(out, "pps")["pps"],
            lambda out: parse_iperf3_udp(out)["pps"],
            floor_udp_pps,
        ),
        tiny_writes(1),
        tiny_writes(8),
    ]


def neper_rr(neper: str, ctl: int, data: int, flows: int, threads: str, secs: int, tool: str = "tcp_rr"):
    """A peer command as a callable: neper's `tool` (tcp_rr, udp_rr) server started for the run, its client run
    for `secs` with `flows` flows of 64-byte requests and responses over `threads` threads, the
    server stopped; the client's output."""
    binary = str(Path(neper) / tool)
    common = ["-C", str(ctl), "-P", str(data), "-F", str(flows), "-T", threads,
              "-Q", "64", "-R", "64", "--nolog"]

    def go() -> str:
        server = subprocess.Popen([binary, "-l", str(secs + 5)] + common, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_tcp(ctl, server, f"neper {tool} server")
            return run([binary, "-c", "-H", HOST, "-l", str(secs)] + common, secs + 30)
        finally:
            server.terminate()
            try:
                server.wait(timeout=5)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()

    go.__name__ = f"neper {tool} -F {flows} -T {threads}"
    return go


def rtt_us(r: dict) -> float:
    # Without --full-rtt sockperf halves the round trip; the commands above ask for full RTT.
    return r["p50_us"] if r["kind"] == "rtt" else 2 * r["p50_us"]


def fmt(v: float | None) -> str:
    if v is None:
        return "—"
    if v >= 100:
        return f"{v:.1f}"
    if v >= 10:
        return f"{v:.2f}"
    return f"{v:.3f}"


# What the sonde figure is compared with, per metric. For the srv_* metrics the client is the
# real tool on both sides; the sonde column is its figure against `sonde server`.
PEERS = {
    "busy_udp_rtt": None,
    "busy_tcp_rtt": None,
    "udp_rtt": "sockperf",
    "tcp_rtt": "sockperf",
    "tcp_bps": "iperf3",
    "udp_pps": "iperf3",
    "srv_udp_rtt": "sockperf sr",
    "srv_tcp_rtt": "sockperf sr",
    "srv_tcp_bps": "iperf3 -s",
    "tcp_bps_1": "qperf",
    "tcp_bps_8": "qperf",
    "rr_1": "neper",
    "rr_16": "neper",
    "rr_256": "neper",
    "rr_16x8": "neper -F 128",
    "udp_rr_1": "neper",
    "udp_rr_16": "neper",
    "udp_rr_256": "neper",
    "udp_rr_16x8": "neper -F 128",
    "uring_rr_1": "floor --uring",
    "uring_rr_16": "floor --uring",
    "uring_rr_256": "floor --uring",
    "uring_rr_16x8": "floor --uring",
}
ALL = ",".join(PEERS)


def idle_share(before: list[int], after: list[int]) -> float:
    """The share of CPU time spent idle (idle + iowait) between two readings of /proc/stat's
    `cpu` line (its numbers, in order).

    >>> idle_share([100, 0, 50, 800, 50, 0, 0], [110, 0, 60, 970, 60, 0, 0])
    0.9
    """
    d = [b - a for a, b in zip(before, after)]
    return (d[3] + d[4]) / max(1, sum(d))


def wait_idle(limit: float) -> None:
    """Waits until the host was at least 90% idle over one second (nothing else compiling or
    measuring beside the next runs), for at most `limit` seconds; then goes on and says so."""

    def cpu() -> list[int]:
        with open("/proc/stat") as f:
            return [int(x) for x in f.readline().split()[1:8]]

    end = time.monotonic() + limit
    while True:
        before = cpu()
        time.sleep(1)
        share = idle_share(before, cpu())
        if share >= 0.9:
            return
        if time.monotonic() >= end:
            log(f"the host is still busy ({100 * (1 - share):.0f}% of its CPU) after {limit:.0f} s: going on")
            return


def median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def paired_ratio(a: list[float], b: list[float]) -> float | None:
    """The median of the per-round ratios a[i] / b[i]: each round runs the sides back to back,
    so each ratio compares runs that shared the machine's state of the moment. This VM drifts
    between modes for seconds at a time (loopback TCP reads about 16 or about 23 Gbit/s for
    every tool), and a ratio of the two sides' medians would compare runs from different
    modes.

    >>> paired_ratio([10.0, 20.0, 12.0], [10.0, 25.0, 10.0])
    1.0
    >>> paired_ratio([16.0, 23.0, 23.0], [16.0, 23.0, 16.0])  # medians 23 / 16 would say 1.44
    1.0
    >>> paired_ratio([1.0], []) is None, paired_ratio([1.0], [0.0]) is None
    (True, True)
    """
    rs = [x / y for x, y in zip(a, b) if y]
    return statistics.median(rs) if rs else None


def table(ms: list[Metric], rounds: int, secs: int) -> tuple[str, bool]:
    """The markdown table: each side's median over the rounds, and the two ratios as medians of
    the per-round ratios ([`paired_ratio`]).

    >>> m = Metric("udp_rtt", "UDP RTT p50, 64 B", "µs", 1.0, "within ±5%",
    ...            lambda r, f: abs(r - 1) <= 0.05, [], [], None, None, ([], None))
    >>> m.sonde, m.peer, m.floor = [12.0, 11.0, 13.0], [12.5, 12.0, 11.0], [10.0, 10.0, 11.0]
    >>> print(table([m], 3, 4)[0])  # doctest: +NORMALIZE_WHITESPACE
    sonde vs peers and the floor on loopback, median of 3 interleaved round(s) of 4 s each
    (ratios: the median of the per-round ratios)
    <BLANKLINE>
    | metric | sonde | peer | sonde/peer | floor | sonde/floor | target | ok? |
    | --- | ---: | ---: | ---: | ---: | ---: | --- | --- |
    | UDP RTT p50, 64 B (µs) | 12.00 | 12.00 (sockperf) | 0.96× | 10.00 | 1.18× | within ±5% | yes |
    <BLANKLINE>
    Per round (sonde / peer / floor):
    - UDP RTT p50, 64 B: 12.00/12.50/10.00, 11.00/12.00/10.00, 13.00/11.00/11.00
    """
    lines = [
        f"sonde vs peers and the floor on loopback, median of {rounds} interleaved round(s) of {secs} s each",
        "(ratios: the median of the per-round ratios)",
        "",
        "| metric | sonde | peer | sonde/peer | floor | sonde/floor | target | ok? |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    all_ok = True
    for m in ms:
        s, p, f = median(m.sonde), median(m.peer), median(m.floor)
        rp, rf = paired_ratio(m.sonde, m.peer), paired_ratio(m.sonde, m.floor)
        ok = s is not None and m.ok(rp, rf)
        all_ok &= ok
        peer = PEERS[m.key]

        def cell(v):
            return fmt(v * m.scale) if v is not None else "—"

        def times(r):
            return f"{r:.2f}×" if r is not None else "—"

        lines.append(
            f"| {m.title} ({m.unit}) | {cell(s)} "
            f"| {cell(p) + f' ({peer})' if peer else '—'} | {times(rp)} "
            f"| {cell(f)} | {times(rf)} | {m.target} | {'yes' if ok else 'NO'} |"
        )
    lines.append("")
    lines.append("Per round (sonde / peer / floor):")
    for m in ms:
        n = max(len(m.sonde), len(m.peer), len(m.floor))

        def at(xs, i):
            return fmt(xs[i] * m.scale) if i < len(xs) else "—"

        triples = ", ".join(f"{at(m.sonde, i)}/{at(m.peer, i)}/{at(m.floor, i)}" for i in range(n))
        lines.append(f"- {m.title}: {triples or '—'}")
    return "\n".join(lines), all_ok


def build_floor(out_dir: Path | None = None) -> str:
    """Compiles bench/floor/floor.c with gcc -O2 into `out_dir`, by default a fresh directory
    under target/ (the repository's build directory, not /tmp); bench/mesh_budget.py builds
    it here too. Where liburing's header is installed (Debian: liburing-dev) the floor has its
    io_uring loops (`--uring`) and links the library."""
    cc = os.environ.get("CC", "gcc")
    if not shutil.which(cc):
        raise RuntimeError(f"{cc} not found: the floor programs are C (apt-get install gcc)")
    if out_dir is None:
        scratch = REPO / "target" / "bench"
        scratch.mkdir(parents=True, exist_ok=True)
        out_dir = Path(tempfile.mkdtemp(prefix="floor-", dir=scratch))
    out = out_dir / "floor"
    probe = subprocess.run([cc, "-E", "-x", "c", "-"], input="#include <liburing.h>\n",
                           capture_output=True, text=True)
    uring = ["-luring"] if probe.returncode == 0 else []
    cmd = [cc, "-O2", "-Wall", "-Wextra", "-Werror", "-pthread", "-o", str(out),
           str(HERE / "floor" / "floor.c")] + uring
    log(f"build: {' '.join(cmd)}")
    subprocess.run(cmd, check=True)
    return str(out)


def build(release: bool) -> str:
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    profile = "release" if release else "debug"
    cmd = ["cargo", "build", "-p", "sonde", "--bin", "sonde"] + (["--release"] if release else [])
    log(f"build: {' '.join(cmd)}")
    subprocess.run(cmd, cwd=REPO, check=True)
    return str(target / profile / "sonde")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="Compare sonde with sockperf, iperf3 and qperf on loopback (interleaved rounds).",
        epilog="Parsers: python3 -m doctest bench/compare.py",
    )
    ap.add_argument("--rounds", type=int, default=3, help="rounds of every comparison (default 3)")
    ap.add_argument("--seconds", type=int, default=5, help="duration of each run (default 5)")
    ap.add_argument(
        "--only",
        default=ALL,
        help=f"comma-separated subset of {ALL}",
    )
    ap.add_argument("--sonde", help="use this sonde binary instead of building one")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    ap.add_argument("--floor", help="use this build of bench/floor/floor.c instead of compiling it")
    ap.add_argument(
        "--wait-idle",
        type=float,
        default=0,
        metavar="SECS",
        help="before each row of each round, wait (at most SECS) until the host's CPUs were 90%% "
        "idle over one second, so that a compile or another job on a shared machine does not land "
        "inside one side of a comparison (Linux; default 0: do not wait)",
    )
    ap.add_argument(
        "--neper",
        help="directory of a neper build (its tcp_rr), the peer of the request/response rows; "
        "without it those rows run against the floor only",
    )
    args = ap.parse_args(argv)
    # The busy-polled rows pin the clients to the first CPU this process may use and the echoes
    # (sonde's agent through --cpu-list, the floor's) to the last; they need two.
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    cpus = (allowed[0], allowed[-1]) if len(allowed) >= 2 else None
    if args.rounds < 1 or not 1 <= args.seconds <= 60:
        ap.error("--rounds must be >= 1 and --seconds within 1..60")

    wanted = args.only.split(",")
    needs = {"sockperf": ("srv_udp_rtt", "srv_tcp_rtt", "udp_rtt", "tcp_rtt"),
             "iperf3": ("srv_tcp_bps", "tcp_bps", "udp_pps"), "qperf": ("tcp_bps_1", "tcp_bps_8")}
    for tool, rows in needs.items():
        if any(r in wanted for r in rows) and not shutil.which(tool):
            ap.error(f"{tool} not found (apt-get install {tool})")
    neper = args.neper
    if any(k.startswith(("rr_", "udp_rr_")) for k in wanted):
        if neper is None:
            log("no --neper DIR: the request/response rows run without their peer (neper)")
        elif not all(os.access(Path(neper) / b, os.X_OK) for b in ("tcp_rr", "udp_rr")):
            log(f"no tcp_rr and udp_rr in {neper}: the request/response rows run without their peer (neper)")
            neper = None
    sonde = args.sonde or build(release=True)
    floor = args.floor or build_floor()
    built_floor = None if args.floor else Path(floor).parent

    servers = Servers()
    try:
        ports = {
            k: free_port()
            for k in (
                "sockperf_udp", "sockperf_tcp", "iperf3", "sonde_iperf3", "sonde_sockperf",
                "floor_udp_echo", "floor_tcp_echo", "floor_tcp_sink", "floor_udp_sink",
                "floor_busy_udp_echo", "floor_busy_tcp_echo", "qperf", "floor_tcp_sink_1",
                "floor_tcp_sink_8", "floor_rr_echo", "floor_udp_rr_echo", "neper_ctl", "neper_data",
            )
        }
        ports["sonde"] = start_sonde_agent(
            servers,
            sonde,
            [f"--iperf3={ports['sonde_iperf3']}", f"--sockperf={ports['sonde_sockperf']}"]
            + (["--cpu-list", str(cpus[1])] if cpus else []),
        )
        log(f"sonde agent on {HOST}:{ports['sonde']}")
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        port = ports["floor_rr_echo"]
        p = servers.start(
            "floor tcp-rr-echo", [floor, "tcp-rr-echo", str(port), "-m", "64", "-T", "2"], **quiet
        )
        wait_tcp(port, p, "floor tcp-rr-echo")
        if subprocess.run([floor, "has-uring"]).returncode == 0:
            port = ports["floor_uring_rr_echo"] = free_port()
            p = servers.start(
                "floor tcp-rr-echo --uring",
                [floor, "tcp-rr-echo", str(port), "-m", "64", "-T", "2", "--uring"],
                **quiet,
            )
            wait_tcp(port, p, "floor tcp-rr-echo --uring")
        elif any(k.startswith("uring_") for k in wanted):
            log("the floor was built without liburing (apt-get install liburing-dev): "
                "the uring_* rows run without their peer")
        servers.start(
            "floor udp-rr-echo",
            [floor, "udp-rr-echo", str(ports["floor_udp_rr_echo"]), "-m", "64", "-T", "2"],
            **quiet,
        )
        if shutil.which("sockperf"):
            servers.start("sockperf udp", ["sockperf", "sr", "-i", HOST, "-p", str(ports["sockperf_udp"])], **quiet)
            p = servers.start(
                "sockperf tcp", ["sockperf", "sr", "--tcp", "-i", HOST, "-p", str(ports["sockperf_tcp"])], **quiet
            )
            wait_tcp(ports["sockperf_tcp"], p, "sockperf sr --tcp")
        if shutil.which("iperf3"):
            p = servers.start("iperf3", ["iperf3", "-s", "-p", str(ports["iperf3"])], **quiet)
            wait_tcp(ports["iperf3"], p, "iperf3 -s")
        if shutil.which("qperf"):
            p = servers.start("qperf", ["qperf", "--listen_port", str(ports["qperf"])], **quiet)
            wait_tcp(ports["qperf"], p, "qperf")
        # sockperf's UDP server has no ready signal; its TCP twin being up says it had the time.
        servers.start("floor udp echo", [floor, "udp-echo", str(ports["floor_udp_echo"])], **quiet)
        for what in ("tcp-echo", "tcp-sink", "udp-sink"):
            port = ports["floor_" + what.replace("-", "_")]
            p = servers.start(f"floor {what}", [floor, what, str(port)], **quiet)
            wait_tcp(port, p, f"floor {what}")
        for size in (1, 8):  # the tiny-write rows' sinks, reading a message per call
            port = ports[f"floor_tcp_sink_{size}"]
            p = servers.start(f"floor tcp-sink -r {size}", [floor, "tcp-sink", str(port), "-r", str(size)], **quiet)
            wait_tcp(port, p, f"floor tcp-sink -r {size}")
        if cpus is None:
            log("one CPU only: the busy-polled rows need two and are left out")
        elif any(k in wanted for k in ("busy_udp_rtt", "busy_tcp_rtt")):
            # A busy echo spins only while messages come (1 s after the last it blocks again).
            busy = ["--busy", "--cpu", str(cpus[1])]
            servers.start("floor busy udp echo", [floor, "udp-echo", str(ports["floor_busy_udp_echo"])] + busy, **quiet)
            port = ports["floor_busy_tcp_echo"]
            p = servers.start("floor busy tcp echo", [floor, "tcp-echo", str(port)] + busy, **quiet)
            wait_tcp(port, p, "floor busy tcp-echo")

        ms = [m for m in metrics(sonde, ports, args.seconds, floor, cpus, neper) if m.key in wanted]
        limit = args.seconds + 30
        for r in range(1, args.rounds + 1):
            for m in ms:
                if args.wait_idle > 0:
                    wait_idle(args.wait_idle)
                for side, cmd, fig, into in (
                    ("sonde", m.sonde_cmd, m.sonde_fig, m.sonde),
                    ("peer", m.peer_cmd, m.peer_fig, m.peer),
                    ("floor", m.floor_cmd, m.floor_fig, m.floor),
                ):
                    if cmd is None:
                        continue
                    out = cmd() if callable(cmd) else run(cmd, limit)
                    v = fig(out)
                    into.append(v)
                    log(f"round {r}/{args.rounds} {m.key:8} {side:5} {fmt(v * m.scale)} {m.unit}")
                    # Let TIME_WAIT sockets and softirq backlog settle between runs.
                    time.sleep(0.5)
    finally:
        servers.close()
        if built_floor is not None:
            shutil.rmtree(built_floor, ignore_errors=True)

    text, all_ok = table(ms, args.rounds, args.seconds)
    print(text)
    return 1 if args.strict and not all_ok else 0


if __name__ == "__main__":
    sys.exit(main())
