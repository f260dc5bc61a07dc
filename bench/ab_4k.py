#!/usr/bin/env python3
"""Interleaved rounds of the make-bench row "4 KiB WRITE, batch 128, depth 2,
tcp" for two builds: XB_MAIN's xfer_bench (default: xb.base beside this
script) and XB_NEW's (xb.new): items back to back (runs), 4 KiB apart (a
frame each, --gap), engine defaults (4 sockets); and UCX ucp_put_bw 4 KiB
over tcp as bench/bench_all.py runs it. Order rotates per round; prints each
round, then medians and per-round ratios to UCX as JSON.
    XB_MAIN=old/xfer_bench XB_NEW=build/bench/xfer_bench bench/ab_4k.py [ROUNDS]
(docs/perf.md, "Runs of small items")."""
import json, os, socket, statistics, subprocess, sys, time
D = os.path.dirname(os.path.abspath(__file__))
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 5
ROW = ["--size", "4096", "--batch", "128", "--depth", "2", "--seconds", "1", "--json"]
def xb(binary, *extra):
    path = os.environ.get("XB_MAIN" if binary == "xb.base" else "XB_NEW", D + "/" + binary)
    out = subprocess.run([path] + ROW + list(extra), capture_output=True, text=True,
                         timeout=60).stdout
    r = json.loads(out.strip().splitlines()[-1])
    return r["gbps"], r["ops"]
def ucx():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    e = dict(os.environ, UCX_TLS="tcp", UCX_WARN_UNUSED_ENV_VARS="n")
    srv = subprocess.Popen(["ucx_perftest", "-p", str(port)], env=e, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    try:
        for _ in range(40):
            p = subprocess.run(["ucx_perftest", "127.0.0.1", "-p", str(port), "-t", "ucp_put_bw",
                                "-s", "4096", "-n", "100000", "-w", "1000", "-f", "-v"], env=e,
                               capture_output=True, text=True, timeout=30)
            if p.returncode == 0:
                row = p.stdout.strip().splitlines()[-1].split(",")
                g = float(row[5]) * 1048576 / 1e9
                return g, g * 1e9 / 4096
            time.sleep(0.1)
        raise RuntimeError("ucx never connected")
    finally:
        srv.kill(); srv.wait()
sides = [("main", lambda: xb("xb.base")), ("runs", lambda: xb("xb.new")),
         ("apart", lambda: xb("xb.new", "--gap", "4096")),
         ("4sock", lambda: xb("xb.new", "--sockets", "4")), ("ucx", ucx)]
res = {k: [] for k, _ in sides}
for r in range(ROUNDS):
    order = sides[r % len(sides):] + sides[:r % len(sides)]
    for k, f in order:
        try:
            res[k].append(f())
        except Exception as ex:
            print("round", r, k, "failed:", ex, flush=True)
    print("round", r, {k: round(v[-1][0], 3) for k, v in res.items() if v}, flush=True)
out = {}
for k, v in res.items():
    if v:
        out[k] = {"gbps": [round(x[0], 3) for x in v], "median_gbps": round(statistics.median(x[0] for x in v), 3),
                  "median_ops": round(statistics.median(x[1] for x in v))}
n = min(len(res["ucx"]), len(res["main"]))
for k in ("main", "runs", "apart", "4sock"):
    m = min(len(res[k]), len(res["ucx"]))
    if m:
        rat = [res[k][i][0] / res["ucx"][i][0] for i in range(m)]
        out[k]["ratio_vs_ucx_median"] = round(statistics.median(rat), 2)
        out[k]["ratio_vs_ucx_minmax"] = [round(min(rat), 2), round(max(rat), 2)]
print(json.dumps(out, indent=1))
