"""The target side of the NIXL-shaped module's tests, written as NIXL code
would be (only the import differs). Prints its metadata (hex) and the
address of its buffer, then answers JSON commands on stdin:
  {"op": "digest"} -> {"hex": sha256 of the buffer}
  {"op": "deregister"} -> {}        {"op": "exit"}

  nixl_peer.py --name N --redis URL --bytes B --seed S
"""

import argparse
import hashlib
import json
import sys

import numpy as np

from xfer.nixl import nixl_agent, nixl_agent_config
from peer import bytes_of


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", required=True)
    ap.add_argument("--redis", required=True)
    ap.add_argument("--bytes", type=int, default=1 << 20)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    agent = nixl_agent(a.name, nixl_agent_config(redis_url=a.redis, transports="tcp"))
    buf = bytes_of(a.seed, a.bytes)
    reg = agent.register_memory([(buf.ctypes.data, buf.nbytes, 0, "")], "DRAM")
    print(json.dumps({"md": agent.get_agent_metadata().hex(), "addr": buf.ctypes.data, "len": buf.nbytes}),
          flush=True)
    for line in sys.stdin:
        c = json.loads(line)
        if c["op"] == "exit":
            break
        if c["op"] == "digest":
            out = {"hex": hashlib.sha256(buf.tobytes()).hexdigest()}
        elif c["op"] == "deregister":
            agent.deregister_memory(reg)
            out = {}
        else:
            out = {"error": "unknown op"}
        print(json.dumps(out), flush=True)
    agent.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
