"""The other process of the GPU tests: regions in CUDA memory (torch),
filled with bytes_of(seed), published in Redis; answers JSON commands:
  {"op": "digest", "region": R} -> {"hex": sha256 of the bytes (copied to host)}
  {"op": "exit"}

  gpu_peer.py --node N --redis URL --transports T --region NAME:BYTES:ACCESS[:SEED]...
"""

import argparse
import hashlib
import json
import sys

import torch

import xfer
from peer import bytes_of


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--node", required=True)
    ap.add_argument("--redis", required=True)
    ap.add_argument("--transports", default="ipc")
    ap.add_argument("--region", action="append", default=[])
    a = ap.parse_args()
    eng = xfer.Engine(a.node, transports=a.transports)
    reg = xfer.Registry(a.redis, ttl_ms=3000)
    reg.publish_node(eng)
    mem = {}
    for spec in a.region:
        f = spec.split(":")
        name, size, acc, seed = f[0], int(f[1]), f[2], int(f[3]) if len(f) > 3 else 0
        mem[name] = torch.from_numpy(bytes_of(seed, size)).to("cuda")
        eng.register(name, mem[name], acc)
    reg.publish_regions(eng.regions.values())
    print(json.dumps({"ready": a.node}), flush=True)
    for line in sys.stdin:
        c = json.loads(line)
        if c["op"] == "exit":
            break
        torch.cuda.synchronize()
        out = {"hex": hashlib.sha256(mem[c["region"]].cpu().numpy().tobytes()).hexdigest()}
        print(json.dumps(out), flush=True)
    reg.close()
    eng.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
