#!/usr/bin/env python3
"""Why does 1 MiB WRITE over N sockets trail iperf3 -P N? (issue 15)

Runs variants of the make-bench scaling row (xfer_bench --size 1M --batch
16 --depth max(2,N) --sockets N --threads N) beside iperf3 -P N, interleaved
round after round, and reports per variant the median GB/s, the median
ratio to iperf3 of the same round with its min-max, and CPU seconds per GB
moved (user+sys of both processes, from wait4: the cost per byte, which a
busy or small host distorts less than GB/s).

  B=build python3 bench/scale_sweep.py [N ...]   (default 1 4)
  env XFER_SWEEP_SECONDS (2), XFER_SWEEP_ROUNDS (3), XFER_SWEEP_ONLY (regex)
"""
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time

B = os.environ.get("B", "build")
SECS = float(os.environ.get("XFER_SWEEP_SECONDS", "2"))
ROUNDS = int(os.environ.get("XFER_SWEEP_ROUNDS", "3"))
ONLY = re.compile(os.environ.get("XFER_SWEEP_ONLY", "."))


def spawn(cmd, env=None):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def reap(p):
    """Waits for p; (stdout, cpu seconds of p and its waited-for children)."""
    out = p.stdout.read()
    p.stderr.read()
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise RuntimeError("exit %d" % p.returncode)
    return out, ru.ru_utime + ru.ru_stime


def xfer(n, env, extra):
    cmd = [B + "/bench/xfer_bench", "--json", "--op", "write", "--size", "1M", "--batch", "16",
           "--depth", str(max(2, n)), "--sockets", str(n), "--threads", str(n),
           "--seconds", str(SECS)] + extra
    out, cpu = reap(spawn(cmd, env))
    j = json.loads(out.strip().splitlines()[-1])
    # the CPU time includes setup and the 0.2 s warmup: count its bytes too
    gb = j["gbps"] * (j["seconds"] + 0.2)
    return j["gbps"], cpu / gb


def iperf(n):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    srv = spawn(["iperf3", "-s", "-1", "-p", str(port)])
    time.sleep(0.3)
    out, ccpu = reap(spawn(["iperf3", "-c", "127.0.0.1", "-p", str(port), "-P", str(n), "-t",
                            str(max(1, round(SECS))), "-J"]))
    _, scpu = reap(srv)
    e = json.loads(out)["end"]["sum_received"]
    return e["bits_per_second"] / 8e9, (ccpu + scpu) / (e["bytes"] / 1e9)


def variants(n):
    return [("default", {}, []),
            ("slots %d (cache-resident)" % (2 * n), {}, ["--slots", str(2 * n)]),
            ("slots %d" % (8 * n), {}, ["--slots", str(8 * n)]),
            ("slots %d (one batch)" % (16 * n), {}, ["--slots", str(16 * n)]),
            ("chunk 256 KiB", {}, ["--chunk", "262144"]),
            ("chunk 4 MiB", {}, ["--chunk", "4194304"]),
            ("SO_SNDBUF/RCVBUF 4 MiB", {"XFER_TCP_SOCKBUF": "4194304"}, []),
            ("SO_SNDBUF/RCVBUF 1 MiB", {"XFER_TCP_SOCKBUF": "1048576"}, []),
            ("no direct send", {"XFER_TCP_DIRECT": "0"}, []),
            ("copying (XFER_TCP_SENDFILE=0)", {"XFER_TCP_SENDFILE": "0"}, [])]


def main():
    ns = [int(a) for a in sys.argv[1:]] or [1, 4]
    print("sweep: %d rounds of %.1f s; %d CPUs" % (ROUNDS, SECS, os.cpu_count() or 0))
    print("| N | variant | GB/s | iperf3 GB/s | ratio | min-max | cpu s/GB | iperf3 cpu s/GB |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for n in ns:
        vs = [v for v in variants(n) if ONLY.search(v[0])]
        got = {v[0]: [] for v in vs}
        ip = []
        for r in range(ROUNDS):
            order = vs if r % 2 == 0 else vs[::-1]
            ip.append(iperf(n))
            for name, env, extra in order:
                got[name].append(xfer(n, env, extra) + (ip[-1][0],))
        ipg = statistics.median(x[0] for x in ip)
        ipc = statistics.median(x[1] for x in ip)
        for name, _, _ in vs:
            g = got[name]
            ratios = [x[0] / x[2] for x in g]
            print("| %d | %s | %.2f | %.2f | %.2f | %.2f-%.2f | %.3f | %.3f |" % (
                n, name, statistics.median(x[0] for x in g), ipg, statistics.median(ratios),
                min(ratios), max(ratios), statistics.median(x[1] for x in g), ipc), flush=True)


if __name__ == "__main__":
    main()
