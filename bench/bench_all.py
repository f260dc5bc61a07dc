#!/usr/bin/env python3
"""make bench: xfer beside the peers Debian ships, in one run.

Each row pairs an xfer measurement with a peer measurement (raw TCP
ping-pong, iperf3, ucx_perftest, memcpy, or xfer itself for the first-pass
row). The two sides of a row alternate, round after round (which side goes
first alternates too), so noise on a shared machine hits both alike; a row
reports the medians of both sides and the median of the per-round ratios.
Then sweeps for the plots. Writes the table, the machine and the date to
docs/BENCHMARKS.md (XFER_BENCH_OUT) and PNG plots beside it (gnuplot).

Needs: $B/bench/xfer_bench, $B/bench/pingpong, $B/bench/memcpy_bw,
$B/bench/bench_notify (notification rows), python3.
Optional (their columns are skipped, with a note, when absent): iperf3,
ucx_perftest (Debian ucx-utils), gnuplot. No Redis, no xferd: a build tree
carried to another machine runs it as is (bench/run.sh).

Environment: B (build dir), XFER_BENCH_SECONDS (per measurement, 1),
XFER_BENCH_ROUNDS (3), XFER_BENCH_STREAMS ("1 2 4"; "1 2 4 8" on a big
host), XFER_BENCH_ONLY (regex on row names), XFER_BENCH_FRESH_MIB (1024),
XFER_BENCH_OUT (docs/BENCHMARKS.md; empty = print only), XFER_BENCH_PLOTS
(0 = none). The scaling rows (1 MiB, N sockets vs iperf3 -P N) and the
first-pass row move +-15 % between 1 s rounds on a many-core host: they run
longer and more often, XFER_BENCH_SCALE_SECONDS (2) x XFER_BENCH_SCALE_ROUNDS
(5), and the first-pass row XFER_BENCH_FRESH_ROUNDS (7) one-pass rounds; the
message round-trip rows (~50 ms a measurement, +-10 %) XFER_BENCH_MSG_ROUNDS
(9) rounds; every row reports the spread of its per-round ratios (min-max)
beside the median. The "cores kept out of idle" rows run both sides with
$B/bench/spin_idle (SCHED_IDLE loops on every CPU; skipped without it and on
hosts of fewer than 8 CPUs).
"""
import datetime
import json
import os
import platform
import re
import shutil
import socket
import statistics
import subprocess
import sys
import time

B = os.environ.get("B", "build")
SECS = float(os.environ.get("XFER_BENCH_SECONDS", "1"))
ROUNDS = int(os.environ.get("XFER_BENCH_ROUNDS", "3"))
STREAMS = [int(x) for x in os.environ.get("XFER_BENCH_STREAMS", "1 2 4").split()]
ONLY = re.compile(os.environ.get("XFER_BENCH_ONLY", "."))
FRESH_MIB = int(os.environ.get("XFER_BENCH_FRESH_MIB", "1024"))
SCALE_SECS = float(os.environ.get("XFER_BENCH_SCALE_SECONDS", "2"))
SCALE_ROUNDS = int(os.environ.get("XFER_BENCH_SCALE_ROUNDS", "5"))
FRESH_ROUNDS = int(os.environ.get("XFER_BENCH_FRESH_ROUNDS", "7"))
MSG_ROUNDS = int(os.environ.get("XFER_BENCH_MSG_ROUNDS", "9"))
WARM_MIN_CPUS = 8  # the "cores kept out of idle" rows (class Warm)
OUT = os.environ.get("XFER_BENCH_OUT", "docs/BENCHMARKS.md")
PLOTS = os.environ.get("XFER_BENCH_PLOTS", "1") != "0"
HAVE_IPERF = shutil.which("iperf3") is not None
HAVE_UCX = shutil.which("ucx_perftest") is not None
HAVE_GNUPLOT = shutil.which("gnuplot") is not None
notes = []


class Skip(Exception):
    pass


def run(cmd, env=None, timeout=120):
    e = dict(os.environ)
    e.update(env or {})
    p = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError("%s: exit %d: %s" % (" ".join(cmd), p.returncode, p.stderr[-400:]))
    return p.stdout


def xb(env=None, **kw):
    """xfer_bench with --json; kw are its options (size=8 -> --size 8)."""
    args = [B + "/bench/xfer_bench", "--json"]
    kw.setdefault("seconds", SECS)
    for k, v in kw.items():
        args += ["--" + k] if v is True else ["--" + k, str(v)]
    return json.loads(run(args, env, timeout=300).strip().splitlines()[-1])


# ops/s of the small-item rows, per row (the issue asks for ops/s beside GB/s)
ops_seen = {}


def xb_ops(label, env=None, **kw):
    """xb() for a GB/s row whose ops/s the notes report too."""
    r = xb(env, **kw)
    ops_seen.setdefault(label, []).append(r["ops"])
    return r["gbps"]


def pingpong(size, unix=False, spin=False):
    out = run([B + "/bench/pingpong", "--size", str(size), "--seconds", str(SECS), "--json"] +
              (["--unix"] if unix else []) + (["--spin"] if spin else []))
    return json.loads(out)["lat_us"]["p50"]


def memcpy(size, threads=1):
    out = run([B + "/bench/memcpy_bw", "--sizes", str(size), "--threads", str(threads),
               "--seconds", str(min(SECS, 0.5)), "--json"])
    return json.loads(out)["gbps"]


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def iperf(streams, secs=None):
    """iperf3 -P streams over loopback, GB/s received (a fresh server per try)."""
    if not HAVE_IPERF:
        raise Skip("iperf3 not installed")
    for attempt in range(3):  # the server needs a moment to listen
        port = free_port()
        srv = subprocess.Popen(["iperf3", "-s", "-1", "-p", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(0.3)
            out = run(["iperf3", "-c", "127.0.0.1", "-p", str(port), "-P", str(streams),
                       "-t", str(max(1, round(secs or SECS))), "-J"], timeout=60)
            return json.loads(out)["end"]["sum_received"]["bits_per_second"] / 8e9
        except RuntimeError:
            if attempt == 2:
                raise
        finally:
            srv.kill()
            srv.wait()


def ucx(test, tls, size, lat):
    """One ucx_perftest client/server pair; p50 latency (us) or GB/s."""
    if not HAVE_UCX:
        raise Skip("ucx_perftest not installed (Debian ucx-utils)")
    port = free_port()
    env = {"UCX_TLS": tls, "UCX_WARN_UNUSED_ENV_VARS": "n"}
    e = dict(os.environ)
    e.update(env)
    srv = subprocess.Popen(["ucx_perftest", "-p", str(port)], env=e,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # about SECS at 0.5 GB/s for bandwidth (UCX stops by count, not time)
        iters = (20000 if size <= 65536 else 500) if lat else \
            min(100000, max(50, int(0.5e9 * SECS / max(size, 1))))
        for _ in range(40):
            try:
                out = run(["ucx_perftest", "127.0.0.1", "-p", str(port), "-t", test, "-s",
                           str(size), "-n", str(iters), "-w", str(min(1000, iters)), "-f", "-v"],
                          env, timeout=30)
                break
            except RuntimeError:
                if srv.poll() is not None:
                    raise
                time.sleep(0.1)
        else:
            raise RuntimeError("ucx_perftest client never connected")
        row = out.strip().splitlines()[-1].split(",")
        # iterations,50.0_percentile_lat,avg_lat,overall_lat,avg_bw,overall_bw,...
        return float(row[1]) if lat else float(row[5]) * 1048576 / 1e9
    finally:
        srv.kill()
        srv.wait()


# bench_notify measures a notified batch and the same batch without one in
# one process run; one run serves both sides of a row (and the other rows
# of its transport): a value is taken once, then the next ask runs again.
_notif_cache = {}


def notif(tr, key):
    """One field of bench_notify --json over transport tr (us or GB/s)."""
    c = _notif_cache.setdefault(tr, {})
    if key not in c:
        out = run([B + "/bench/bench_notify", "--transport", tr, "--iters", "100",
                   "--seconds", str(min(SECS, 0.5)), "--repeat", "1", "--json"], timeout=300)
        c.clear()
        c.update(json.loads(out.strip().splitlines()[-1]))
    return c.pop(key)


def msg_rt(tr, probe, env=None):
    """p50 round trip (us) of bench_notify --only probe over transport tr:
    notify-pp (two notifications), sendrecv, sendrecv-pre or sendrecv-local
    (8 B, 2 x one way)."""
    out = run([B + "/bench/bench_notify", "--transport", tr, "--only", probe, "--iters", "2000"],
              env, timeout=300)
    for line in out.splitlines():
        if "round trip" in line or "one way" in line:
            v = float(line.split()[-2])
            return v if probe == "notify-pp" else 2 * v
    raise RuntimeError("bench_notify --only %s: no result" % probe)


class Warm:
    """bench/spin_idle running (every core kept out of idle) for a block."""

    def __enter__(self):
        prog = B + "/bench/spin_idle"
        cpus = len(os.sched_getaffinity(0))
        if cpus < WARM_MIN_CPUS:
            # with a loop on each of 2 vCPUs the engine's own threads (and
            # the VM's) fight the loops for the cores: dev VM rows 4-6 x
            raise Skip("warm-core rows need %d+ CPUs (here %d): skipped" % (WARM_MIN_CPUS, cpus))
        if not os.path.exists(prog):
            raise Skip("no %s: warm-core rows skipped" % prog)
        self.p = subprocess.Popen([prog], stdout=subprocess.PIPE, text=True)
        if not self.p.stdout.readline().startswith("spin_idle:"):
            self.p.kill()
            self.p.wait()
            raise Skip("spin_idle did not start: warm-core rows skipped")

    def __exit__(self, *exc):
        self.p.terminate()  # it kills and reaps its loops before it exits
        rc = self.p.wait(timeout=30)
        self.p.stdout.close()
        if rc != 0 and exc[0] is None:
            raise RuntimeError("spin_idle: its loops could not run pinned at SCHED_IDLE")


def warm(fn):
    """fn measured with spin_idle running."""
    def measured():
        with Warm():
            return fn()
    return measured


def lat_p50(r):
    return r["lat_us"]["p50"]


# name, unit, xfer side, peer name, peer side, ratio kind, target text
# ratio kind "lower": xfer/peer, lower is better; "higher": xfer/peer, higher
def rows():
    R = []
    add = lambda *a: R.append(a)
    add("8 B WRITE round trip, tcp, depth 1", "p50 us",
        lambda: lat_p50(xb(op="write", size=8)), "TCP ping-pong 56 B", lambda: pingpong(56),
        "lower", "<= 1.3")
    add("8 B READ round trip, tcp, depth 1", "p50 us",
        lambda: lat_p50(xb(op="read", size=8)), "TCP ping-pong 56 B", lambda: pingpong(56),
        "lower", "<= 1.3")
    add("8 B WRITE round trip, tcp, busy-poll 50 us", "p50 us",
        lambda: lat_p50(xb({"XFER_BUSY_POLL_US": "50"}, op="write", size=8)),
        "TCP ping-pong 56 B", lambda: pingpong(56), "lower", "<= 1.3")
    add("8 B WRITE round trip, tcp vs UCX", "p50 us",
        lambda: lat_p50(xb(op="write", size=8)), "UCX ucp_put_lat x2 (tcp)",
        lambda: 2 * ucx("ucp_put_lat", "tcp", 8, True), "lower", "<= 1.0")
    # UCX's perftest busy-polls both sides: like with like (the default
    # row above, which sleeps, stays the measure)
    add("8 B WRITE round trip, tcp, busy-poll 50 us vs UCX", "p50 us",
        lambda: lat_p50(xb({"XFER_BUSY_POLL_US": "50"}, op="write", size=8)),
        "UCX ucp_put_lat x2 (tcp)", lambda: 2 * ucx("ucp_put_lat", "tcp", 8, True), "lower", "")
    add("8 B WRITE round trip, tcp vs UCX tag", "p50 us",
        lambda: lat_p50(xb(op="write", size=8)), "UCX tag_lat x2 (tcp)",
        lambda: 2 * ucx("tag_lat", "tcp", 8, True), "lower", "")
    add("4 KiB WRITE, batch 128, depth 2, tcp", "GB/s",
        lambda: xb_ops("4 KiB batch 128", op="write", size=4096, batch=128, depth=2),
        "UCX ucp_put_bw 4 KiB (tcp)", lambda: ucx("ucp_put_bw", "tcp", 4096, False),
        "higher", ">= 3")
    # The items above lie back to back, which tcp sends as runs (several
    # items a frame, docs/perf.md "Runs of small items"). With 4 KiB between
    # them each item is its own frame: the engine's cost per item. And the
    # engine's defaults (4 sockets per peer, 1 progress thread), which the
    # rows above narrow to 1 socket.
    add("4 KiB WRITE, batch 128, depth 2, tcp, items apart (a frame each)", "GB/s",
        lambda: xb_ops("4 KiB batch 128, items apart", op="write", size=4096, batch=128,
                       depth=2, gap=4096),
        "UCX ucp_put_bw 4 KiB (tcp)", lambda: ucx("ucp_put_bw", "tcp", 4096, False),
        "higher", "")
    add("4 KiB WRITE, batch 128, depth 2, tcp, engine defaults (4 sockets)", "GB/s",
        lambda: xb_ops("4 KiB batch 128, 4 sockets", op="write", size=4096, batch=128,
                       depth=2, sockets=4),
        "UCX ucp_put_bw 4 KiB (tcp)", lambda: ucx("ucp_put_bw", "tcp", 4096, False),
        "higher", "")
    # rows from here to the first pass: SCALE_ROUNDS rounds of SCALE_SECS
    scale = dict(rounds=SCALE_ROUNDS)
    for n in STREAMS:
        add("1 MiB WRITE, %d socket(s) + %d thread(s), tcp" % (n, n), "GB/s",
            lambda n=n: xb(op="write", size="1M", batch=16, depth=max(2, n), sockets=n,
                          threads=n, seconds=SCALE_SECS)["gbps"],
            "iperf3 -P %d" % n, lambda n=n: iperf(n, SCALE_SECS), "higher", ">= 0.9", scale)
    # Like with like (the rows above stay the measure): they walk 16 x
    # depth MiB of slots per side (32 MiB at N = 1, 128 MiB at N = 8: out of
    # the L2 caches), while iperf3 sends from and receives into one 128 KiB
    # buffer per stream. Here each stream reuses 2 MiB (--slots 2N), so both
    # sides copy from and into the caches. A gap that closes here is memory
    # traffic, one that stays is the engine (docs/perf.md: at N = 1 the
    # 32 MiB walk costs ~0.15 CPU s/GB more in the kernel's copies).
    for n in sorted({min(STREAMS), max(STREAMS)}):
        add("1 MiB WRITE, %d sock + %d thr, tcp, %d MiB reused like iperf3" % (n, n, 2 * n), "GB/s",
            lambda n=n: xb(op="write", size="1M", batch=16, depth=max(2, n), sockets=n,
                          threads=n, slots=2 * n, seconds=SCALE_SECS)["gbps"],
            "iperf3 -P %d" % n, lambda n=n: iperf(n, SCALE_SECS), "higher",
            ">= 0.9 (like with like)", scale)
    fresh = dict(op="write", size="1M", batch=16, depth=max(1, FRESH_MIB // 16), sockets=2)
    add("first pass, fresh %d MiB, 1 MiB items, tcp" % FRESH_MIB, "GB/s",
        lambda: xb(fresh=True, **fresh)["gbps"], "xfer, same over touched memory",
        lambda: xb(count=fresh["depth"], seconds=600, **{"warm-scratch": True}, **fresh)["gbps"],
        "higher", ">= 0.9", dict(rounds=FRESH_ROUNDS))
    add("1 MiB WRITE, batch 16, ipc", "GB/s",
        lambda: xb(op="write", size="1M", batch=16, depth=2, transport="ipc")["gbps"],
        "memcpy 1 MiB, 1 thread", lambda: memcpy(1 << 20), "higher", ">= 0.9")
    # ucp_put_bw puts one buffer over and over (one memcpy per op, from the
    # caches); xfer's rows above walk 32 MiB of slots. Like with like: the
    # same batch reusing one 1 MiB slot (--slots 1).
    one = dict(op="write", size="1M", batch=16, depth=2, transport="ipc", slots=1)
    add("1 MiB WRITE, batch 16, ipc, one slot vs UCX posix", "GB/s",
        lambda: xb(**one)["gbps"],
        "UCX ucp_put_bw 1 MiB (posix)", lambda: ucx("ucp_put_bw", "posix,self", 1 << 20, False),
        "higher", ">= 1.0")
    # UCX_TLS=cma alone has no active-message transport for wire-up, and
    # cma,tcp measured 0.16 GB/s (puts over tcp): "sm" lets UCX pick among
    # its shared-memory transports (posix, sysv, cma) as a user would.
    add("1 MiB WRITE, batch 16, ipc, one slot vs UCX sm", "GB/s",
        lambda: xb(**one)["gbps"],
        "UCX ucp_put_bw 1 MiB (sm)", lambda: ucx("ucp_put_bw", "sm,self", 1 << 20, False),
        "higher", ">= 1.0")
    add("8 B WRITE round trip, ipc", "p50 us",
        lambda: lat_p50(xb(op="write", size=8, transport="ipc")), "UCX ucp_put_lat x2 (posix)",
        lambda: 2 * ucx("ucp_put_lat", "posix,self", 8, True), "lower", "<= 5 us absolute")
    add("8 B READ round trip, ipc", "p50 us",
        lambda: lat_p50(xb(op="read", size=8, transport="ipc")), "UCX ucp_put_lat x2 (posix)",
        lambda: 2 * ucx("ucp_put_lat", "posix,self", 8, True), "lower", "<= 5 us absolute")
    # Same-host messages (issues 10/15): ipc carries them through a shared
    # ring since 2026-11-29 (docs/ipc.md "Message ring"); against UCX's shm
    # tag round trip and a unix-socket ping-pong (the floor of a message that
    # crosses a socket).
    ucx_tag = lambda: 2 * ucx("tag_lat", "posix,self", 8, True)
    for what, only, env in (("8 B send/recv round trip, ipc, receives posted ahead",
                             "sendrecv-pre", None),
                            ("8 B send/recv round trip, ipc, busy-poll 50 us", "sendrecv-pre",
                             {"XFER_BUSY_POLL_US": "50"}),
                            ("notification round trip, ipc", "notify-pp", None)):
        add(what, "p50 us", lambda only=only, env=env: msg_rt("ipc", only, env),
            "UCX tag_lat x2 (posix)", ucx_tag, "lower", "")
    add("8 B send/recv round trip, ipc, receives posted ahead, vs unix socket", "p50 us",
        lambda: msg_rt("ipc", "sendrecv-pre"), "unix ping-pong 56 B",
        lambda: pingpong(56, unix=True), "lower", "")
    add("4 KiB WRITE, batch 128, depth 2, ipc", "GB/s",
        lambda: xb(op="write", size=4096, batch=128, depth=2, transport="ipc")["gbps"],
        "memcpy 4 KiB, 1 thread", lambda: memcpy(4096), "higher", "")
    # Notifications (issue 10): submit -> notification read at the target,
    # against submit -> completion of the same batch without one; the
    # promise is less than one round trip more (ratio < 2 at these sizes
    # means less than one extra WRITE round trip).
    for tr in ("tcp", "ipc"):
        for size, k in (("4 KiB", "4k"), ("1 MiB", "1m")):
            add("%s WRITE + notification read at target, %s" % (size, tr), "p50 us",
                lambda tr=tr, k=k: notif(tr, "notif_%s_us" % k),
                "same batch without notification", lambda tr=tr, k=k: notif(tr, "write_%s_us" % k),
                "lower", "adds < 1 round trip")
        add("8 B send/recv one way, %s" % tr, "p50 us",
            lambda tr=tr: notif(tr, "sendrecv_8_us"), "8 B WRITE round trip / 2",
            lambda tr=tr: notif(tr, "write_8_us"), "lower", "")
        add("1 MiB send/recv, 4 in flight, %s" % tr, "GB/s",
            lambda tr=tr: notif(tr, "sendrecv_1m_gbps"), "1 MiB WRITE, 4 in flight",
            lambda tr=tr: notif(tr, "write_1m_gbps"), "higher", "")
    # Message round trips against the raw ping-pong (issue 15: <= 1.3 x):
    # two standalone notifications (each side waits in xfer_notif_wait), and
    # 8 B xfer_send then xfer_recv each way, blocking or with the receive
    # posted before the send, and blocking with the opt-in XFER_SEND_LOCAL
    # (eager, locally completed; docs/notify.md).
    # A measurement of bench_notify is ~2,000 round trips (~50 ms) and
    # moves +-10 % between rounds: these rows run MSG_ROUNDS rounds.
    msg = {"rounds": MSG_ROUNDS}
    for name, probe in (("notification round trip, tcp", "notify-pp"),
                        ("8 B send/recv round trip, tcp, blocking", "sendrecv"),
                        ("8 B send/recv round trip, tcp, receives posted ahead", "sendrecv-pre"),
                        ("8 B send/recv round trip, tcp, XFER_SEND_LOCAL (opt-in)",
                         "sendrecv-local")):
        add(name, "p50 us", lambda probe=probe: msg_rt("tcp", probe), "TCP ping-pong 56 B",
            lambda: pingpong(56), "lower", "<= 1.3", msg)
    # The same with every core kept out of its idle state (spin_idle:
    # SCHED_IDLE loops, a stand-in for a busy server), both sides alike:
    # how much of the gap above is the engine's work running on a core that
    # just woke up (docs/perf.md, step 20). Not a target row.
    for name, probe in (("notification round trip, tcp, cores kept out of idle", "notify-pp"),
                        ("8 B send/recv round trip, tcp, blocking, cores kept out of idle",
                         "sendrecv"),
                        ("8 B send/recv round trip, tcp, posted ahead, cores kept out of idle",
                         "sendrecv-pre")):
        add(name, "p50 us", warm(lambda probe=probe: msg_rt("tcp", probe)),
            "TCP ping-pong 56 B, cores kept out of idle", warm(lambda: pingpong(56)), "lower", "",
            msg)
    # The opt-in busy-poll (XFER_BUSY_POLL_US) against a ping-pong whose two
    # sides busy-poll too (pingpong --spin): like against like.
    spin = {"XFER_BUSY_POLL_US": "50"}
    for name, probe in (("notification round trip, tcp, busy-poll 50 us", "notify-pp"),
                        ("8 B send/recv round trip, tcp, blocking, busy-poll 50 us", "sendrecv")):
        add(name, "p50 us", lambda probe=probe: msg_rt("tcp", probe, spin),
            "TCP ping-pong 56 B, busy-polling", lambda: pingpong(56, spin=True), "lower", "")
    return [r for r in R if ONLY.search(r[0])]


def measure(fn):
    try:
        return fn()
    except Skip as e:
        if str(e) not in notes:
            notes.append(str(e))
        return None
    except Exception as e:  # a failed peer must not sink the run; say so
        msg = "failed: %s" % re.sub(r"-p \d+ ", "", (str(e).splitlines() or ["?"])[0][:200])
        if msg not in notes:
            notes.append(msg)
        return None


def table():
    results = []
    for row in rows():
        name, unit, xf, peer, pf, kind, target = row[:7]
        opt = row[7] if len(row) > 7 else {}
        xs, ps, ratios = [], [], []
        for r in range(opt.get("rounds", ROUNDS)):
            order = [("x", xf), ("p", pf)] if r % 2 == 0 else [("p", pf), ("x", xf)]
            got = {}
            for side, fn in order:
                got[side] = measure(fn)
            if got["x"] is not None:
                xs.append(got["x"])
            if got["p"] is not None:
                ps.append(got["p"])
            if got["x"] and got["p"]:
                ratios.append(got["x"] / got["p"])
        res = dict(name=name, unit=unit, peer=peer, kind=kind, target=target,
                   xfer=statistics.median(xs) if xs else None,
                   peer_v=statistics.median(ps) if ps else None,
                   ratio=statistics.median(ratios) if ratios else None,
                   lo=min(ratios) if ratios else None, hi=max(ratios) if ratios else None,
                   n=len(ratios))
        results.append(res)
        print(fmt_row(res), flush=True)
        print("  rounds: xfer %s; peer %s" % (" ".join(map(num, xs)), " ".join(map(num, ps))),
              file=sys.stderr, flush=True)
    return results


def num(v):
    return "-" if v is None else ("%.3g" % v if v < 100 else "%.0f" % v)


def fmt_row(r):
    spread = "-" if r["ratio"] is None else "%.2f-%.2f (%d)" % (r["lo"], r["hi"], r["n"])
    return "| %s | %s | %s | %s | %s | %s | %s | %s |" % (
        r["name"], r["unit"], num(r["xfer"]), r["peer"], num(r["peer_v"]),
        "-" if r["ratio"] is None else "%.2f" % r["ratio"], spread, r["target"])


HEAD = ("| what | unit | xfer | peer | peer value | xfer / peer | min-max (rounds) | target |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- |")


def sweeps():
    """Series for the plots: one pass each (not interleaved)."""
    s = {}
    sizes = [4096, 65536, 1 << 20, 16 << 20]
    s["bw_xfer"] = [(z, measure(lambda z=z: xb(op="write", size=z, batch=max(1, min(128, (64 << 20) // z)),
                                                depth=2, sockets=4)["gbps"])) for z in sizes]
    s["bw_ucx"] = [(z, measure(lambda z=z: ucx("ucp_put_bw", "tcp", z, False)))
                   for z in sizes if z <= (1 << 20)]  # larger ones stalled past 2 min here
    s["bw_iperf"] = measure(lambda: iperf(1))
    lsizes = [8, 4096, 65536, 1 << 20]
    s["lat_xfer"] = [(z, measure(lambda z=z: lat_p50(xb(op="write", size=z))))
                     for z in lsizes]
    s["lat_pp"] = [(z, measure(lambda z=z: pingpong(z + 48))) for z in lsizes]
    s["lat_ucx"] = [(z, measure(lambda z=z: 2 * ucx("ucp_put_lat", "tcp", z, True)))
                    for z in lsizes]
    return s


def plot(s, outdir):
    if not HAVE_GNUPLOT:
        notes.append("gnuplot not installed: no plots")
        return []
    made = []

    def series(path, pts):
        with open(path, "w") as f:
            for x, y in pts:
                if y is not None:
                    f.write("%g %g\n" % (x, y))

    tmp = os.path.join(outdir, ".plotdata")
    os.makedirs(tmp, exist_ok=True)
    series(tmp + "/bw_xfer", s["bw_xfer"])
    series(tmp + "/bw_ucx", s["bw_ucx"])
    series(tmp + "/lat_xfer", s["lat_xfer"])
    series(tmp + "/lat_pp", s["lat_pp"])
    series(tmp + "/lat_ucx", s["lat_ucx"])
    series(tmp + "/scale_xfer", s.get("scale_xfer", []))
    series(tmp + "/scale_iperf", s.get("scale_iperf", []))
    plots = {
        "bench-bandwidth.png": ("bandwidth vs item size (tcp loopback, WRITE, 4 sockets)",
                                "item bytes", "GB/s", True,
                                ['"%s/bw_xfer" w lp t "xfer"' % tmp, '"%s/bw_ucx" w lp t "UCX ucp_put_bw"' % tmp]
                                + (["%g t \"iperf3 -P 1\"" % s["bw_iperf"]] if s["bw_iperf"] else [])),
        "bench-latency.png": ("round trip vs size (tcp loopback, depth 1)", "bytes", "p50 us", True,
                              ['"%s/lat_xfer" w lp t "xfer WRITE"' % tmp,
                               '"%s/lat_pp" w lp t "TCP ping-pong (+48 B header)"' % tmp,
                               '"%s/lat_ucx" w lp t "UCX ucp_put_lat x2"' % tmp]),
        "bench-scaling.png": ("1 MiB WRITE vs streams (tcp loopback)", "sockets = threads = streams",
                              "GB/s", False,
                              ['"%s/scale_xfer" w lp t "xfer"' % tmp,
                               '"%s/scale_iperf" w lp t "iperf3 -P N"' % tmp]),
    }
    for name, (title, xl, yl, logx, lines) in plots.items():
        logs = "set logscale x 2\nset format x '%.0b%B'\n" if logx else ""
        if name == "bench-latency.png":
            logs += "set logscale y 10\n"
        script = ("set terminal png size 800,500 noenhanced\nset output '%s'\nset title '%s'\n"
                  "set xlabel '%s'\nset ylabel '%s'\n%sset key left top\nset grid\nplot %s\n"
                  % (os.path.join(outdir, name), title, xl, yl, logs, ", ".join(lines)))
        p = subprocess.run(["gnuplot"], input=script, text=True, capture_output=True)
        if p.returncode == 0:
            made.append(name)
        else:
            notes.append("gnuplot %s: %s" % (name, p.stderr.strip()[:200]))
    shutil.rmtree(tmp, ignore_errors=True)
    return made


def machine():
    cpu = "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = "?"
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal"):
                mem = "%.0f GiB" % (int(line.split()[1]) / 1048576)
    except OSError:
        pass
    load = os.getloadavg()[0]
    return ("%s, %d CPUs (%s), %s, kernel %s, load %.1f at start"
            % (platform.node(), os.cpu_count() or 0, cpu, mem, platform.release(), load))


def main():
    for prog in ("xfer_bench", "pingpong", "memcpy_bw", "bench_notify"):
        if not os.access("%s/bench/%s" % (B, prog), os.X_OK):
            sys.exit("bench: %s/bench/%s missing: build first (make)" % (B, prog))
    start = datetime.datetime.now(datetime.timezone.utc)
    mach = machine()
    print("bench: %s; %d rounds of %.1f s per side (scaling %d x %.1f s, first pass %d, "
          "message round trips %d), interleaved"
          % (mach, ROUNDS, SECS, SCALE_ROUNDS, SCALE_SECS, FRESH_ROUNDS, MSG_ROUNDS))
    print(HEAD)
    res = table()
    made = []
    if PLOTS and OUT:
        s = sweeps()
        s["scale_xfer"] = [(n, r["xfer"]) for n in STREAMS for r in res
                           if r["name"].startswith("1 MiB WRITE, %d socket(s)" % n)]
        s["scale_iperf"] = [(n, r["peer_v"]) for n in STREAMS for r in res
                            if r["name"].startswith("1 MiB WRITE, %d socket(s)" % n)]
        made = plot(s, os.path.dirname(OUT) or ".")
    for label, v in ops_seen.items():
        notes.append("%s: xfer %.0f ops/s (median of %d rounds)" % (label, statistics.median(v),
                                                                    len(v)))
    for n in notes:
        print("note: " + n)
    if not OUT:
        return
    with open(OUT, "w") as f:
        f.write("# Benchmarks: xfer beside its peers\n\n")
        f.write("Written by `make bench` (`bench/run.sh` -> `bench/bench_all.py`) on %s UTC.\n\n"
                % start.strftime("%Y-%m-%d %H:%M"))
        f.write("Machine: %s. Loopback; both sides of each row alternate, %d rounds of "
                "%.1f s each (the 1 MiB N-socket rows %d rounds of %.1f s, the first pass %d "
                "one-pass rounds, the message round trips against the ping-pong %d); values are medians, the ratio is the median of the per-round "
                "ratios, min-max their spread (latency: lower is better, bandwidth: higher is "
                "better). Round trips of UCX are twice its one-way `ucp_put_lat`/`tag_lat`.\n\n"
                % (mach, ROUNDS, SECS, SCALE_ROUNDS, SCALE_SECS, FRESH_ROUNDS, MSG_ROUNDS))
        f.write(HEAD + "\n")
        for r in res:
            f.write(fmt_row(r) + "\n")
        if notes:
            f.write("\nNotes:\n\n" + "".join("- %s\n" % n for n in notes))
        f.write("\nReproduce: `make bench` (env `XFER_BENCH_SECONDS`, `XFER_BENCH_ROUNDS`, "
                "`XFER_BENCH_SCALE_SECONDS`, `XFER_BENCH_SCALE_ROUNDS`, `XFER_BENCH_FRESH_ROUNDS`, "
                "`XFER_BENCH_MSG_ROUNDS`, `XFER_BENCH_STREAMS`, `XFER_BENCH_ONLY`; see `bench/bench_all.py`). "
                "On another machine: carry the build tree (`$B/bench/xfer_bench`, "
                "`pingpong`, `memcpy_bw`, `bench_notify`, `spin_idle`) and `bench/`, run `B=build bench/run.sh`; "
                "iperf3 and ucx_perftest are optional.\n")
        for m in made:
            f.write("\n![%s](%s)\n" % (m, m))
    print("bench: wrote %s%s" % (OUT, (" and " + ", ".join(made)) if made else ""))


if __name__ == "__main__":
    main()
