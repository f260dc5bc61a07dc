"""Per-call cost of small transfers through the Python package: the same
calls, sizes and depths as bench/bench_call.c, so the difference is the
package's overhead. "new" = engine.read() per transfer (batch_new + add +
submit, wait, free); "reuse" = reset + read + submit on kept transfers.

    python bench_call.py [--transport tcp|ipc] [--size 64] [--iters 20000] [--repeat 3]
"""

import argparse
import time

import xfer


def run(b, dst, p, src, depth, iters, size, reuse):
    ts = [b.batch() for _ in range(depth)] if reuse else None
    t0 = time.perf_counter()
    for _ in range(0, iters, depth):
        if reuse:
            for i, t in enumerate(ts):
                t.reset()
                t.read(dst, i * size, p, src, i * size, size).submit()
        else:
            ts = [b.read(dst, i * size, p, src, i * size, size) for i in range(depth)]
        for t in ts:
            t.wait()
        if not reuse:
            for t in ts:
                t.close()
    return (time.perf_counter() - t0) / iters


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--transport", default="tcp")
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--iters", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    with xfer.Engine("call-a", transports=a.transport) as ea, xfer.Engine("call-b", transports=a.transport) as eb:
        src = ea.register("src", 1 << 20)
        dst = eb.register("dst", 1 << 20)
        p = eb.add_peer(ea.info())
        info = src.info()
        p.add_region(info)
        for depth in (1, 32):
            for reuse in (False, True):
                best = min(run(eb, dst, p, info, depth, a.iters, a.size, reuse) for _ in range(a.repeat))
                print(f"python {a.transport:<4} size {a.size:<6} depth {depth:<3} {'reuse' if reuse else 'new':<5} "
                      f"{best * 1e6:8.2f} us/transfer", flush=True)


if __name__ == "__main__":
    main()
