#!/usr/bin/env python3
"""Interleaved A/B of many callers sharing one engine (xfer_bench --callers).

Per round, every (build, shape) pair runs once, in an order that rotates per
round so the host's drift hits every build alike; each run is one
`xfer_bench --callers N --json` of SECONDS. Prints one line per run and, at
the end, per shape the median ops/s and p50/p99 call latency of each build
and each build's ops/s over the first build's (median of the per-round
ratios).

    bench/callers_ab.py ROUNDS SECONDS LABEL=XFER_BENCH [LABEL=XFER_BENCH ...]

SHAPES (environment) overrides the shapes: space-separated
TRANSPORT:OP:SIZE:CALLERS:SOCKETS:THREADS, e.g. "tcp:write:8:8:1:1".
"""
import json
import os
import statistics
import subprocess
import sys

DEFAULT_SHAPES = ("tcp:write:8:1:1:1 tcp:write:8:2:1:1 tcp:write:8:4:1:1 tcp:write:8:8:1:1 "
                  "tcp:write:8:16:1:1 tcp:write:8:16:4:4 tcp:read:64K:8:4:4 "
                  "ipc:read:8:1:1:1 ipc:read:8:4:1:1 ipc:read:8:16:1:1")


def run(prog, shape, seconds):
    tr, op, size, callers, socks, threads = shape.split(":")
    cmd = [prog, "--json", "--transport", tr, "--op", op, "--size", size, "--callers", callers,
           "--sockets", socks, "--threads", threads, "--seconds", str(seconds), "--warmup", "0.2"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        print(f"# {' '.join(cmd)}: exit {out.returncode}: {out.stderr.strip()}", flush=True)
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    if len(sys.argv) < 4:
        print(__doc__, file=sys.stderr)
        return 2
    rounds, seconds = int(sys.argv[1]), float(sys.argv[2])
    builds = [a.split("=", 1) for a in sys.argv[3:]]
    shapes = os.environ.get("SHAPES", DEFAULT_SHAPES).split()
    pairs = [(b, s) for s in shapes for b in range(len(builds))]
    got = {}  # (build, shape) -> list of (round, ops, p50, p99)
    for r in range(rounds):
        k = r % len(pairs)
        for b, s in pairs[k:] + pairs[:k]:
            res = run(builds[b][1], s, seconds)
            if not res:
                continue
            row = (r, res["ops"], res["lat_us"]["p50"], res["lat_us"]["p99"])
            got.setdefault((b, s), []).append(row)
            print(f"R{r} {builds[b][0]} {s} ops {row[1]:.0f} p50 {row[2]:.1f} p99 {row[3]:.1f}",
                  flush=True)
    print("\nshape | " + " | ".join(f"{n} ops/s, p50, p99 us" for n, _ in builds) +
          " | ops/s ratio to " + builds[0][0] + " (median of rounds)")
    for s in shapes:
        cells, base = [], {row[0]: row[1] for row in got.get((0, s), [])}
        for b in range(len(builds)):
            v = got.get((b, s), [])
            if not v:
                cells.append("-")
                continue
            cells.append(f"{statistics.median(x[1] for x in v):.0f}, "
                         f"{statistics.median(x[2] for x in v):.1f}, "
                         f"{statistics.median(x[3] for x in v):.0f}")
        ratios = []
        for b in range(1, len(builds)):
            rr = [x[1] / base[x[0]] for x in got.get((b, s), []) if base.get(x[0])]
            ratios.append(f"{builds[b][0]} {statistics.median(rr):.3f}" if rr else "-")
        print(f"{s} | " + " | ".join(cells) + " | " + ", ".join(ratios))
    return 0


if __name__ == "__main__":
    sys.exit(main())
