"""The other process of the two-process tests: an xfer node that publishes
its regions in Redis and answers JSON commands, one per line on stdin.

  peer.py --node N --redis URL [--secret S] [--transports T]
          [--region NAME:BYTES:ACCESS[:SEED[:BLOCK_BYTES:NUM_BLOCKS]]]...

Regions are filled with bytes_of(SEED, BYTES). Commands (reply on stdout):
  {"op": "digest", "region": R, "off": O, "len": L}   -> {"hex": sha256}
  {"op": "fill", "region": R, "seed": S}             -> {}
  {"op": "reregister", "region": R}                  -> {"gen": G}
  {"op": "deregister", "region": R}                  -> {}
  {"op": "notifs", "count": N, "wait": S}         -> {"notifs": [...]}
  {"op": "notify", "node": NODE, "msg": TEXT}          -> {}   (standalone)
  {"op": "exit"}
"""

import argparse
import hashlib
import json
import sys

import numpy as np

import xfer


def bytes_of(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--node", required=True)
    ap.add_argument("--redis", required=True)
    ap.add_argument("--secret")
    ap.add_argument("--transports", default="tcp")
    ap.add_argument("--region", action="append", default=[])
    ap.add_argument("--notify-queue", type=int)
    a = ap.parse_args()

    eng = xfer.Engine(a.node, secret=a.secret, transports=a.transports, notify_queue_len=a.notify_queue)
    reg = xfer.Registry(a.redis, ttl_ms=3000)
    reg.publish_node(eng)
    specs = {}
    for spec in a.region:
        f = spec.split(":")
        name, size, acc = f[0], int(f[1]), f[2]
        seed = int(f[3]) if len(f) > 3 else 0
        layout = xfer.KVLayout(int(f[4]), int(f[5])) if len(f) > 5 else None
        specs[name] = (size, acc, layout)
        r = eng.register(name, size, acc, layout)
        r.numpy()[:] = bytes_of(seed, size)
    reg.publish_regions(eng.regions.values())
    print(json.dumps({"ready": a.node, "regions": sorted(specs)}), flush=True)

    for line in sys.stdin:
        c = json.loads(line)
        op = c["op"]
        try:
            if op == "exit":
                break
            r = eng.region(c["region"]) if "region" in c else None
            if op == "digest":
                v = r.numpy()[c.get("off", 0) : c.get("off", 0) + c.get("len", r.nbytes)]
                out = {"hex": hashlib.sha256(v.tobytes()).hexdigest()}
            elif op == "notifs":  # waits up to timeout for at least "count"
                got = []
                for n in eng.notifications(timeout=c.get("wait", 5)):
                    got.append({"sender": n.sender, "data": n.data.decode(), "bound": n.bound,
                                "status": n.status.name, "n_items": n.n_items, "n_failed": n.n_failed,
                                "failed": [[i, code.name] for i, code in n.failed]})
                    if len(got) >= c.get("count", 1):
                        break
                out = {"notifs": got}
            elif op == "notify":
                eng.notify(reg.connect(eng, c["node"]), c["msg"], c.get("deadline_ms", 5000))
                out = {}
            elif op == "fill":
                r.numpy()[:] = bytes_of(c["seed"], r.nbytes)
                out = {}
            elif op == "deregister":
                reg.unpublish_region(r.name)
                r.deregister()
                out = {}
            elif op == "reregister":
                size, acc, layout = specs[r.name]
                r.deregister()
                r = eng.register(r.name, size, acc, layout)
                reg.publish_regions([r])
                out = {"gen": r.info().gen}
            else:
                out = {"error": f"unknown op {op}"}
        except xfer.Error as e:
            out = {"error": str(e)}
        print(json.dumps(out), flush=True)
    reg.close()
    eng.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
