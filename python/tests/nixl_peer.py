"""The target side of the NIXL-shaped module's tests, written as NIXL code
would be (only the import differs). Prints its metadata (hex) and the
address of its buffer, then answers JSON commands on stdin:
  {"op": "digest"} -> {"hex": sha256 of the buffer}
  {"op": "wait_notif", "agent": A, "tag": T, "wait": S} -> {"found": bool, "digest": ...}
  {"op": "add", "name": A} (by name through Redis)   {"op": "send_notif", "agent": A, "msg": M}
  {"op": "deregister"} -> {}        {"op": "exit"}

  nixl_peer.py --name N --redis URL --bytes B --seed S
"""

import argparse
import hashlib
import json
import sys
import time

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
        elif c["op"] == "wait_notif":  # NIXL's target loop, bounded
            deadline = time.monotonic() + c.get("wait", 10)
            found = False
            while not found and time.monotonic() < deadline:
                found = agent.check_remote_xfer_done(c["agent"], c["tag"].encode())
                if not found:
                    time.sleep(0.001)
            out = {"found": found, "digest": hashlib.sha256(buf.tobytes()).hexdigest()}
        elif c["op"] == "add":
            out = {"name": agent.add_remote_agent(c["name"])}
        elif c["op"] == "send_notif":
            agent.send_notif(c["agent"], c["msg"].encode())
            out = {}
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
