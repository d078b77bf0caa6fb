#!/usr/bin/env python3
"""Many concurrent UDP latency sessions against one sonde agent: its threads, memory and CPU
per session, at several session counts (to see whether the cost stays linear).

One `sonde server` on 127.0.0.1 (its session limits raised to the largest count; everything
else default). For each count N, several client processes (--procs) open N sessions between
them, each a closed-loop UDP latency session speaking sonde's control protocol (preamble,
hello, start, UDP join, then 64-byte messages, one in flight, a --think pause after each reply;
the sessions' own latency figures are not the point). While all N run, the agent's
/proc/PID/status (VmRSS, Threads) and /proc/PID/stat (user + system CPU) are sampled; then the
sessions finish and the next count starts.

    cargo build --release -p sonde
    python3 bench/scale.py --counts 10,100,1000 --seconds 10

Loopback only; every session is bounded by --seconds (the agent's duration for it) and the
whole run by a time limit. Linux only (/proc). Standard library only.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import secrets
import selectors
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

HOST = "127.0.0.1"
REPO = Path(__file__).resolve().parent.parent
PROTOCOL = 2
MSG = 64


def frame(msg: dict) -> bytes:
    body = json.dumps(msg, separators=(",", ":")).encode()
    return struct.pack(">I", len(body)) + body


def read_frame(s: socket.socket) -> dict:
    head = recv_exact(s, 4)
    (n,) = struct.unpack(">I", head)
    if n > 64 * 1024:
        raise RuntimeError(f"control frame of {n} bytes")
    return json.loads(recv_exact(s, n))


def recv_exact(s: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise RuntimeError("the agent closed the control connection")
        out += chunk
    return out


class Session:
    """One closed-loop UDP latency session: handshake, join, then pings until told to stop."""

    def __init__(self, port: int, seconds: float) -> None:
        self.ctrl = socket.create_connection((HOST, port), timeout=15)
        self.ctrl.sendall(b"SNDE" + struct.pack(">H", PROTOCOL) + bytes([1, 0]))
        self.ctrl.sendall(frame({"type": "hello", "protocol": PROTOCOL, "software": "scale.py",
                                 "nonce": secrets.token_hex(32)}))
        welcome = read_frame(self.ctrl)
        if welcome.get("type") != "welcome":
            raise RuntimeError(f"no welcome: {welcome}")
        spec = {"kind": "latency", "protocol": "udp", "direction": "forward", "streams": 1,
                "msg_size": MSG, "bitrate_per_stream": 0,
                "duration_ms": int(seconds * 1000) + 5000, "interval_ms": 0}
        self.ctrl.sendall(frame({"type": "start", "spec": spec}))
        accepted = read_frame(self.ctrl)
        if accepted.get("type") != "accepted":
            raise RuntimeError(f"not accepted: {accepted}")
        token = int(accepted["token"])
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.connect((HOST, port))
        self.udp.settimeout(0.2)
        join = b"SNDJ" + struct.pack(">HHQ", PROTOCOL, 0, token) + bytes(16)
        for _ in range(50):
            self.udp.send(join)
            try:
                if self.udp.recv(64)[:4] == b"SNDA":
                    break
            except socket.timeout:
                continue
        else:
            raise RuntimeError("no UDP join acknowledgement")
        ready = read_frame(self.ctrl)
        if ready.get("type") != "ready":
            raise RuntimeError(f"not ready: {ready}")
        self.udp.setblocking(False)
        self.seq = 0
        self.sent = self.received = 0
        self.next_send = 0.0
        self.waiting = False

    def finish(self) -> None:
        self.ctrl.settimeout(15)
        self.ctrl.sendall(frame({"type": "finish"}))
        while read_frame(self.ctrl).get("type") != "report":
            pass
        self.ctrl.close()
        self.udp.close()


def client_proc(port: int, n: int, seconds: float, think: float,
                up: mp.Barrier, done: mp.Barrier, out: mp.Queue) -> None:
    """Opens `n` sessions one after the other (so the agent's per-source pending limit is never
    in the way), runs them for `seconds` after the barrier, then finishes each."""
    sessions = []
    try:
        for _ in range(n):
            sessions.append(Session(port, seconds))
    except Exception as e:  # noqa: BLE001 - reported to the parent
        out.put(("error", f"{len(sessions)} sessions open, then: {e}"))
        up.abort()
        return
    up.wait()
    sel = selectors.DefaultSelector()
    for s in sessions:
        sel.register(s.udp, selectors.EVENT_READ, s)
    end = time.monotonic() + seconds
    payload = bytearray(MSG)
    while (now := time.monotonic()) < end:
        for s in sessions:
            if not s.waiting and now >= s.next_send:
                payload[:8] = s.seq.to_bytes(8, "little")
                s.udp.send(payload)
                s.sent += 1
                s.waiting = True
                s.sent_at = now
            elif s.waiting and now - s.sent_at > 1.0:
                s.waiting = False  # lost: move on
                s.seq += 1
        for key, _ in sel.select(timeout=0.005):
            s = key.data
            try:
                while s.udp.recv(2048):
                    s.received += 1
                    s.waiting = False
                    s.seq += 1
                    s.next_send = time.monotonic() + think
            except BlockingIOError:
                pass
    done.wait()
    for s in sessions:
        s.finish()
    out.put(("ok", sum(s.sent for s in sessions), sum(s.received for s in sessions)))


def proc_stats(pid: int) -> dict:
    status = Path(f"/proc/{pid}/status").read_text()
    rss = int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1))
    threads = int(re.search(r"Threads:\s+(\d+)", status).group(1))
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])  # utime + stime
    return {"rss_kib": rss, "threads": threads, "cpu_s": ticks / os.sysconf("SC_CLK_TCK")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--counts", default="10,100,1000", help="session counts (default 10,100,1000)")
    ap.add_argument("--seconds", type=float, default=10, help="steady phase per count (default 10)")
    ap.add_argument("--think", type=float, default=0.1,
                    help="pause after each reply, s (default 0.1: 10 messages/s per session)")
    ap.add_argument("--procs", type=int, default=4, help="client processes (default 4)")
    ap.add_argument("--sonde", default=str(REPO / "target" / "release" / "sonde"))
    args = ap.parse_args(argv)
    counts = [int(c) for c in args.counts.split(",")]
    if not 1 <= args.seconds <= 60 or max(counts) > 2000:
        ap.error("--seconds within 1..60, counts up to 2000")
    top = max(counts)
    agent = subprocess.Popen(
        [args.sonde, "server", "--bind", HOST, "--port", "0", "-q",
         "--max-sessions", str(top), "--max-sessions-per-source", str(top),
         "--max-duration", str(int(args.seconds) + 60)],
        stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    rows = []
    try:
        line = agent.stdout.readline()
        m = re.match(r"sonde agent listening on \S+:(\d+) ", line)
        if not m:
            raise RuntimeError(f"no ready line: {line!r}")
        port = int(m.group(1))
        time.sleep(0.5)
        idle = proc_stats(agent.pid)
        print(f"idle: {idle['rss_kib']} KiB RSS, {idle['threads']} threads", file=sys.stderr)
        for n in counts:
            procs = min(args.procs, n)
            share = [n // procs + (1 if i < n % procs else 0) for i in range(procs)]
            up, done = mp.Barrier(procs + 1), mp.Barrier(procs + 1)
            out: mp.Queue = mp.Queue()
            ps = [mp.Process(target=client_proc,
                             args=(port, k, args.seconds, args.think, up, done, out))
                  for k in share]
            for p in ps:
                p.start()
            up.wait(timeout=300)
            before, t0 = proc_stats(agent.pid), time.monotonic()
            peak = dict(before)
            while time.monotonic() - t0 < args.seconds:
                time.sleep(0.25)
                st = proc_stats(agent.pid)
                peak["rss_kib"] = max(peak["rss_kib"], st["rss_kib"])
                peak["threads"] = max(peak["threads"], st["threads"])
            after, wall = proc_stats(agent.pid), time.monotonic() - t0
            done.wait(timeout=60)
            results = [out.get(timeout=120) for _ in ps]
            for p in ps:
                p.join(timeout=60)
            errors = [r[1] for r in results if r[0] == "error"]
            if errors:
                raise RuntimeError("; ".join(errors))
            sent = sum(r[1] for r in results)
            received = sum(r[2] for r in results)
            cpu = after["cpu_s"] - before["cpu_s"]
            rows.append({
                "sessions": n,
                "threads": peak["threads"],
                "threads_per_session": (peak["threads"] - idle["threads"]) / n,
                "rss_mib": peak["rss_kib"] / 1024,
                "rss_kib_per_session": (peak["rss_kib"] - idle["rss_kib"]) / n,
                "cpu_percent": 100 * cpu / wall,
                "cpu_ms_per_session_s": 1000 * cpu / wall / n,
                "echoes_per_s": received / args.seconds,
                "cpu_us_per_echo": 1e6 * cpu / max(received, 1),
                "lost": sent - received,
            })
            print(f"{n} sessions: {rows[-1]}", file=sys.stderr)
            time.sleep(1)
    finally:
        agent.terminate()
        agent.wait(timeout=10)
    print(f"One sonde agent, UDP latency sessions closed loop with a {args.think * 1000:.0f} ms "
          f"pause after each reply, {args.procs} client processes, {args.seconds:.0f} s each")
    print()
    print("| sessions | agent threads | per session | RSS (MiB) | KiB per session "
          "| agent CPU (% of a core) | CPU ms/s per session | echoes/s | CPU µs per echo | lost |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['sessions']} | {r['threads']} | {r['threads_per_session']:.2f} "
              f"| {r['rss_mib']:.1f} | {r['rss_kib_per_session']:.0f} | {r['cpu_percent']:.1f} "
              f"| {r['cpu_ms_per_session_s']:.3f} | {r['echoes_per_s']:.0f} "
              f"| {r['cpu_us_per_echo']:.0f} | {r['lost']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
