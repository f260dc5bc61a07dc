"""The other process of the node-level tests: an xfer.Node that registers
regions (filled with bytes_of(seed)) and answers JSON commands on stdin:
  {"op": "digest", "region": R}            -> {"hex": sha256}
  {"op": "reregister", "region": R}        -> {}   (new generation, same bytes)
  {"op": "notifs", "count": N, "wait": S}  -> {"notifs": [[sender, text], ...]}
  {"op": "notify", "node": N, "msg": M}    -> {}
  {"op": "exit"}

  node_peer.py --node N --redis URL [--transports T] --region NAME:BYTES:ACCESS[:SEED]...
"""

import argparse
import hashlib
import json
import sys

import numpy as np

import xfer
from peer import bytes_of


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--node", required=True)
    ap.add_argument("--redis", required=True)
    ap.add_argument("--transports", default="tcp")
    ap.add_argument("--region", action="append", default=[])
    ap.add_argument("--pool", help="NAME:LAYERS:BLOCKS:BLOCK_SIZE:HEADS:HEAD_DIM:SEED, vllm_fa fp16 (numpy)")
    a = ap.parse_args()
    node = xfer.Node(a.node, a.redis, transports=a.transports, ttl_ms=3000)
    specs = {}
    for spec in a.region:
        f = spec.split(":")
        name, size, acc, seed = f[0], int(f[1]), f[2], int(f[3]) if len(f) > 3 else 0
        specs[name] = (size, acc, seed)
        node.register(name, size, acc).numpy()[:] = bytes_of(seed, size)
    kv = []
    if a.pool:
        pname, L, nb, bs, hd, dim, seed = a.pool.split(":")
        L, nb, bs, hd, dim, seed = int(L), int(nb), int(bs), int(hd), int(dim), int(seed)
        for l in range(L):
            t = np.zeros((2, nb, bs, hd, dim), dtype=np.float16)
            t.view(np.uint8).reshape(-1)[:] = bytes_of(seed + l, t.nbytes)
            kv.append(t)
        node.register_pool(pname, kv, "vllm_fa")
    print(json.dumps({"ready": a.node}), flush=True)
    for line in sys.stdin:
        c = json.loads(line)
        op = c["op"]
        try:
            if op == "exit":
                break
            if op == "digest":
                out = {"hex": hashlib.sha256(node.region(c["region"]).numpy().tobytes()).hexdigest()}
            elif op == "recv":  # one message into region R from any node this one knows
                node.peers()  # (listing only; the sender must have been resolved: see "resolve")
                t = node.recv(c["region"], c.get("cap"), node=c.get("node"), tag=c.get("tag"))
                try:
                    t.wait(c.get("wait", 10))
                    tag, sender = t.item_msg(0)
                    n = t.item_bytes(0)
                    data = node.region(c["region"]).numpy()[:n]
                    out = {"n": int(n), "tag": tag, "sender": sender,
                           "hex": hashlib.sha256(data.tobytes()).hexdigest()}
                except xfer.Error as e:
                    out = {"failed": e.code.name}
            elif op == "send":
                t = node.send(c["node"], c["region"], c.get("len"), tag=c.get("tag", 0))
                try:
                    t.wait(c.get("wait", 10))
                    out = {}
                except xfer.Error as e:
                    out = {"failed": e.code.name}
            elif op == "blocks":  # sha256 of K and V of blocks ids in one layer
                v = kv[c["layer"]][:, c["ids"]]
                out = {"hex": hashlib.sha256(np.ascontiguousarray(v).tobytes()).hexdigest()}
            elif op == "reregister":
                size, acc, seed = specs[c["region"]]
                node.deregister(c["region"])
                node.register(c["region"], size, acc).numpy()[:] = bytes_of(seed, size)
                out = {}
            elif op == "notifs":
                got = []
                for n in node.notifications(timeout=c.get("wait", 5)):
                    got.append([n.sender, n.data.decode()])
                    if len(got) >= c.get("count", 1):
                        break
                out = {"notifs": got}
            elif op == "notify":
                node.notify(c["node"], c["msg"])
                out = {}
            else:
                out = {"error": f"unknown op {op}"}
        except xfer.Error as e:
            out = {"error": str(e)}
        print(json.dumps(out), flush=True)
    node.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
