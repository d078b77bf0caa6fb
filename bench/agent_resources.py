#!/usr/bin/env python3
"""What `sonde server` holds (memory, threads, descriptors) under load, on loopback.

Starts one agent (`sonde server --bind 127.0.0.1 --iperf3`, default limits) and reads its
/proc/PID/status (VmRSS, VmHWM, Threads) and /proc/PID/fd every 50 ms through four phases:

  idle         the agent alone, 1 s
  connections  127.0.0.2 opens 5,000 silent connections (2,500 on each of sonde's and the
               iperf3 port; the agent keeps 16 per port from one address and closes the rest)
               and 127.0.0.3 64 slow ones (32 per port, one byte every 0.5 s), held 2 s
  -P 1         one session: sonde throughput -P 1 --bidir -t 2 (2 streams)
  -P 128       one session: sonde throughput -P 128 --bidir -t 2 (256 streams)
  1,000 flows  four client processes at once, each sonde latency -P 250 --depth 1 -t 2: one
               agent serving 1,000 request/response flows (4 sessions, each over the agent's
               few readiness-loop threads); also the agent's CPU time per flow and per
               transaction, and the transactions per second the four clients counted

and prints a markdown table of each phase's peak, then the memory per stream, from the two
sessions' peaks: (peak(-P 128) - peak(-P 1)) / 254. VmRSS is the agent's own memory; the kernel's
socket buffers are not in it (they are bounded by net.ipv4.tcp_rmem / tcp_wmem per socket).

    cargo build --release -p sonde
    python3 bench/agent_resources.py                       # uses target/release/sonde
    python3 bench/agent_resources.py --sonde path/to/sonde

Linux only (it reads /proc), loopback only (127.0.0.1 to 127.0.0.3), about 15 s in all; every
phase is bounded in time and count. A benchmark, not a test: run it by hand, on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import threading
import time

HOST = "127.0.0.1"
SILENT_SOURCE = "127.0.0.2"
SLOW_SOURCE = "127.0.0.3"
SILENT_PER_PORT = 2_500
SLOW_PER_PORT = 32
SAMPLE_S = 0.05


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def wait_listening(port: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection((HOST, port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listening on {HOST}:{port} within {timeout_s:.0f} s")


def status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM in KiB, Threads, and open descriptors of `pid`."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "Threads"):
                out[key] = int(value.split()[0])
    out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    return out


class Sampler:
    """Samples the agent every 50 ms in a thread; `peak()` is the maximum of each figure since
    the last `reset()`."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.lock = threading.Lock()
        self.peaks: dict[str, int] = {}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.done.wait(SAMPLE_S):
            try:
                now = status(self.pid)
            except OSError:
                return
            with self.lock:
                for k, v in now.items():
                    self.peaks[k] = max(self.peaks.get(k, 0), v)

    def reset(self) -> None:
        with self.lock:
            self.peaks = {}

    def peak(self) -> dict[str, int]:
        time.sleep(2 * SAMPLE_S)
        with self.lock:
            return dict(self.peaks)

    def stop(self) -> None:
        self.done.set()
        self.thread.join()


def connect_from(source: str, port: int) -> socket.socket | None:
    s = socket.socket()
    try:
        s.bind((source, 0))
        s.settimeout(1.0)
        s.connect((HOST, port))
        return s
    except OSError:
        s.close()
        return None


def hold_connections(ports: list[int], hold_s: float) -> tuple[int, int]:
    """Opens the silent and slow connections, holds them `hold_s`, closes them. Returns how many
    of each were opened (the agent may close the silent ones over its limit at once)."""
    silent = [c for p in ports for _ in range(SILENT_PER_PORT) if (c := connect_from(SILENT_SOURCE, p))]
    slow = [c for p in ports for _ in range(SLOW_PER_PORT) if (c := connect_from(SLOW_SOURCE, p))]
    deadline = time.monotonic() + hold_s
    while time.monotonic() < deadline:
        for c in slow:
            try:
                c.send(b"\0")
            except OSError:
                pass
        time.sleep(0.5)
    for c in silent + slow:
        c.close()
    return len(silent), len(slow)


def session(sonde: str, port: int, parallel: int) -> None:
    cmd = [sonde, "throughput", f"{HOST}:{port}", "-P", str(parallel), "--bidir", "-t", "2",
           "--json", "--no-save"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()}")


def cpu_ticks(pid: int) -> int:
    """utime + stime of `pid`, in clock ticks (/proc/PID/stat fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def latency_clients(sonde: str, port: int, clients: int, flows: int) -> list[float]:
    """`clients` processes of `sonde latency -P flows` at once; each one's transactions per
    second."""
    cmd = [sonde, "latency", f"{HOST}:{port}", "-P", str(flows), "--depth", "1", "-t", "2",
           "--warmup", "0.5", "--json", "--no-save"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(clients)]
    tps = []
    for p in procs:
        out, err = p.communicate(timeout=60)
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}): {err.strip()}")
        tps.append(float(json.loads(out)["request_response"]["transactions_per_second"]))
    return tps


def mib(kib: int) -> str:
    return f"{kib / 1024:.1f} MiB"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sonde", default="target/release/sonde", help="the sonde binary")
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 2 * (SILENT_PER_PORT + SLOW_PER_PORT) + 100
    if hard != resource.RLIM_INFINITY and hard < need:
        sys.exit(f"needs {need} descriptors, the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, need), hard))

    port, iperf3_port = free_port(), free_port()
    agent = subprocess.Popen(
        [args.sonde, "server", "--bind", HOST, "--port", str(port), f"--iperf3={iperf3_port}", "-q"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    rows = []
    try:
        wait_listening(port)
        wait_listening(iperf3_port)
        sampler = Sampler(agent.pid)
        time.sleep(1.0)
        rows.append(("idle", sampler.peak()))

        sampler.reset()
        silent, slow = hold_connections([port, iperf3_port], 2.0)
        rows.append((f"{silent:,} silent from {SILENT_SOURCE}, {slow} slow from {SLOW_SOURCE}",
                     sampler.peak()))
        time.sleep(1.0)

        for parallel in (1, 128):
            sampler.reset()
            session(args.sonde, port, parallel)
            rows.append((f"throughput -P {parallel} --bidir -t 2 ({2 * parallel} streams)",
                         sampler.peak()))
            time.sleep(1.0)
        sampler.reset()
        ticks = cpu_ticks(agent.pid)
        tps = latency_clients(args.sonde, port, 4, 250)
        cpu_s = (cpu_ticks(agent.pid) - ticks) / os.sysconf("SC_CLK_TCK")
        rows.append(("latency -P 250 --depth 1 -t 2 from 4 processes (1,000 flows)", sampler.peak()))
        final = status(agent.pid)
        sampler.stop()
    finally:
        agent.terminate()
        agent.wait(timeout=10)

    print(f"sonde server, default limits, {args.sonde}, peaks sampled every {SAMPLE_S * 1000:.0f} ms\n")
    print("| phase | VmRSS | VmHWM | threads | descriptors |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, p in rows:
        print(f"| {name} | {mib(p['VmRSS'])} | {mib(p['VmHWM'])} | {p['Threads']} | {p['fds']} |")
    print(f"\nVmHWM at the end: {mib(final['VmHWM'])}")
    one, many = rows[2][1]["VmRSS"], rows[3][1]["VmRSS"]
    per_stream = (many - one) / 254
    print(f"memory per stream: ({mib(many)} - {mib(one)}) / 254 = {per_stream:.0f} KiB")
    idle = rows[0][1]["VmRSS"]
    worst = idle + 16 * 256 * per_stream
    print(f"extrapolated, 16 sessions of 256 streams: {mib(idle)} + 16 x 256 x {per_stream:.0f} KiB"
          f" = {mib(int(worst))}")
    flows = rows[4][1]
    total = sum(tps)
    # The measured 2 s of each client; the agent's CPU covers their warm-up and set-up too.
    transactions = total * 2
    print(f"1,000 latency flows: {flows['Threads']} threads, {mib(flows['VmRSS'] - idle)} above idle"
          f" ({(flows['VmRSS'] - idle) / 1000:.1f} KiB per flow), {flows['fds']} descriptors;"
          f" {', '.join(f'{t:,.0f}' for t in tps)} transactions/s ({total:,.0f} in all);"
          f" agent CPU {cpu_s:.2f} s ({cpu_s / 1000 * 1e3:.2f} ms per flow,"
          f" {cpu_s * 1e9 / transactions:,.0f} ns per transaction, warm-up included)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
