"""Prefill -> decode KV handoff between two processes over xfer.

    python handoff.py prefill --node P --redis URL [--mode push|pull] ...
    python handoff.py decode  --node D --peer P --redis URL [--mode push|pull]
                              [--requests 16] [--tokens 100] ...

Each side holds a paged KV cache in vLLM's FlashAttention layout
(kvcache.py), one xfer region per layer ("kv.L<l>", published in Redis),
with its own block ids. Control messages are xfer notifications:

push:  decode  -> prefill  REQ rid ntokens push <decode block ids>
       prefill computes layer by layer and WRITEs each layer's blocks as it
       is done; each layer's transfer carries "LAYER rid l", the last one
       "DONE rid" (sent after the earlier layers finished, so on arrival
       every byte is in place); a failure sends "FAIL rid l <blocks> why".
pull:  decode  -> prefill  REQ rid ntokens pull
       prefill -> decode   READY rid <prefill block ids>
       decode READs every layer, checks, then -> prefill  RELEASE rid;
       prefill frees the blocks then, or after --abort-ms without an answer.

Request states on decode: waiting -> transferring -> done | failed (with
the blocks that failed). Decode checks every value it received and prints
one SUMMARY line (JSON): per-request latency p50/p99 and GB/s.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import xfer  # noqa: E402
from kvcache import Geometry, block_ranges, check, fill, make_layers  # noqa: E402


def ids_str(ids) -> str:
    return ",".join(str(i) for i in ids) or "-"


def ids_of(s: str) -> list:
    return [] if s == "-" else [int(x) for x in s.split(",")]


class Side:
    """One process: engine, registry, its KV cache registered per layer."""

    def __init__(self, a):
        self.a = a
        self.g = Geometry(a.layers, a.blocks, a.block_size, a.heads, a.head_dim, a.dtype)
        self.eng = xfer.Engine(a.node, transports=a.transports, notify_queue_len=4096)
        self.reg = xfer.Registry(a.redis, ttl_ms=5000)
        self.reg.publish_node(self.eng)
        self.kv = make_layers(self.g, a.device)
        self.regions = [self.eng.register(f"kv.L{l}", t) for l, t in enumerate(self.kv)]
        self.reg.publish_regions(self.regions)
        self.free = list(range(self.g.num_blocks))[::-1]
        self.peers = {}

    def peer(self, name: str):
        """(Peer, [remote layer RegionInfo]) of node name, looked up once."""
        if name not in self.peers:
            p = self.reg.connect(self.eng, name)
            self.peers[name] = (p, [self.reg.resolve(p, f"kv.L{l}") for l in range(self.g.layers)])
        return self.peers[name]

    def alloc(self, n: int):
        if len(self.free) < n:
            return None
        got = [self.free.pop() for _ in range(n)]
        return got

    def release(self, ids) -> None:
        self.free.extend(ids)

    def close(self) -> None:
        self.reg.close()
        self.eng.close()


def nblocks(g: Geometry, ntokens: int) -> int:
    return (ntokens + g.block_size - 1) // g.block_size


# ---- prefill -------------------------------------------------------------


def layer_transfer(s: Side, op: str, p, remote, l: int, local_ids, remote_ids, names) -> tuple:
    """A transfer of layer l's blocks, and per item the block names (decode's
    ids) it covers."""
    t = s.eng.batch()
    covers = []
    for lo, ro, n, first, k in block_ranges(s.g, local_ids, remote_ids):
        getattr(t, op)(s.regions[l], lo, p, remote[l], ro, n)
        covers.append(names[first:first + k])
    return t, covers


def failed_blocks(t, covers) -> tuple:
    bad, why = set(), ""
    for st in t.status():
        if not st.ok:
            bad.update(covers[st.index])
            why = why or f"{st.code.name}: {st.reason}"
    return sorted(bad), why


def prefill_push(s: Side, sender: str, rid: int, ntok: int, dec_ids) -> None:
    p, remote = s.peer(sender)
    ids = s.alloc(len(dec_ids))
    if ids is None:
        s.eng.notify(p, f"FAIL {rid} -1 {ids_str(dec_ids)} prefill out of blocks")
        return
    names = list(dec_ids)
    if rid == s.a.bad_request:  # fault: one block addressed past decode's cache
        dec_ids = list(dec_ids)
        # Past both halves of the layer tensor: id num_blocks would be V's
        # block 0 in the K half (in bounds: another request's data).
        dec_ids[-1] = 2 * s.g.num_blocks
    running = []
    try:
        for l in range(s.g.layers):
            fill(s.g, s.kv[l], rid, l, ids)  # "compute" this layer
            t, covers = layer_transfer(s, "write", p, remote, l, ids, dec_ids, names)
            last = l == s.g.layers - 1
            if last:  # DONE must mean every layer is in place: earlier ones first
                for tl, cl, ll in running:
                    try:
                        tl.wait(s.a.deadline_ms / 1000)
                    except xfer.Error:
                        pass
                bad = [(ll, *failed_blocks(tl, cl)) for tl, cl, ll in running if failed_blocks(tl, cl)[0]]
                if bad:
                    ll, blocks, why = bad[0]
                    s.eng.notify(p, f"FAIL {rid} {ll} {ids_str(blocks)} {why}")
                    return
            t.notify(p, f"DONE {rid}" if last else f"LAYER {rid} {l}").submit(s.a.deadline_ms)
            running.append((t, covers, l))
        t, covers, l = running[-1]
        try:
            t.wait(s.a.deadline_ms / 1000)
        except xfer.Error:
            blocks, why = failed_blocks(t, covers)
            s.eng.notify(p, f"FAIL {rid} {l} {ids_str(blocks)} {why}")
    finally:
        for t, _, _ in running:
            t.close()
        s.release(ids)


def run_prefill(a) -> int:
    s = Side(a)
    print(json.dumps({"ready": a.node}), flush=True)
    held = {}  # pull: rid -> (block ids, abort deadline)
    stats = {"requests": 0, "released": 0, "aborted": 0}
    fd = s.eng.notification_fd()
    bye = False
    try:
        while not bye or held:  # after BYE, wait out the abort timers
            now = time.monotonic()
            for rid, (ids, dl) in list(held.items()):
                if now >= dl:  # decode never answered: free anyway
                    s.release(ids)
                    del held[rid]
                    stats["aborted"] += 1
                    print(f"prefill: request {rid} aborted after {a.abort_ms} ms, blocks freed", flush=True)
            wait = min([dl for _, dl in held.values()], default=now + 1.0) - now
            select.select([fd], [], [], max(0.0, wait))
            for n in s.eng.poll_notifications():
                f = n.data.decode().split(" ")
                if f[0] == "BYE":
                    bye = True
                if f[0] == "RELEASE":
                    ids, _ = held.pop(int(f[1]), (None, 0))
                    if ids is not None:
                        s.release(ids)
                        stats["released"] += 1
                    continue
                if f[0] != "REQ":
                    continue
                rid, ntok, mode = int(f[1]), int(f[2]), f[3]
                stats["requests"] += 1
                if mode == "push":
                    prefill_push(s, n.sender, rid, ntok, ids_of(f[4]))
                    continue
                p, _ = s.peer(n.sender)
                ids = s.alloc(nblocks(s.g, ntok))
                if ids is None:
                    s.eng.notify(p, f"FAIL {rid} -1 - prefill out of blocks")
                    continue
                for l in range(s.g.layers):
                    fill(s.g, s.kv[l], rid, l, ids)
                held[rid] = (ids, time.monotonic() + a.abort_ms / 1000)
                s.eng.notify(p, f"READY {rid} {ids_str(ids)}")
        print("PREFILL " + json.dumps(stats), flush=True)
        return 0
    finally:
        s.close()


# ---- decode ------------------------------------------------------------------


class Request:
    def __init__(self, rid: int, ntok: int, ids):
        self.rid, self.ntok, self.ids = rid, ntok, ids
        self.state = "waiting"
        self.t0 = time.monotonic()
        self.t1 = 0.0
        self.tx = 0.0  # entered "transferring"
        self.failed_blocks: list = []
        self.why = ""
        self.transfer = None
        self.covers = None

    def move(self, state: str, verbose: bool) -> None:
        if state == "transferring":
            self.tx = time.monotonic()
        if verbose:
            print(f"decode: request {self.rid}: {self.state} -> {state}", flush=True)
        self.state = state


def verify(s: Side, r: Request) -> None:
    bad = set()
    for l in range(s.g.layers):
        bad.update(r.ids[i] for i in check(s.g, s.kv[l], r.rid, l, r.ids))
    if bad:
        r.failed_blocks, r.why = sorted(bad), "values differ"


def finish(s: Side, r: Request, verbose: bool) -> None:
    r.t1 = time.monotonic()
    if not r.failed_blocks and not r.why:
        verify(s, r)
    r.move("failed" if (r.failed_blocks or r.why) else "done", verbose)
    s.release(r.ids)


def run_decode(a) -> int:
    s = Side(a)
    p, remote = s.peer(a.peer)
    reqs = {}
    nb = nblocks(s.g, a.tokens)
    t_start = time.monotonic()
    for rid in range(a.requests):
        ids = s.alloc(nb)
        if ids is None:
            print(f"decode: out of blocks for request {rid}", file=sys.stderr)
            return 2
        reqs[rid] = r = Request(rid, a.tokens, ids)
        msg = f"REQ {rid} {a.tokens} {a.mode}" + (f" {ids_str(ids)}" if a.mode == "push" else "")
        r.t0 = time.monotonic()
        s.eng.notify(p, msg)
    deadline = time.monotonic() + a.timeout
    fd = s.eng.notification_fd()
    pending = lambda: [r for r in reqs.values() if r.state in ("waiting", "transferring")]  # noqa: E731
    while pending() and time.monotonic() < deadline:
        fds = [fd] + [r.transfer.fileno() for r in pending() if r.transfer is not None]
        select.select(fds, [], [], max(0.0, min(1.0, deadline - time.monotonic())))
        for n in s.eng.poll_notifications():
            f = n.data.decode().split(" ", 4)
            r = reqs.get(int(f[1]))
            if r is None or r.state not in ("waiting", "transferring"):
                continue
            if f[0] == "LAYER" and r.state == "waiting":
                r.move("transferring", a.verbose)
            elif f[0] == "DONE":
                if r.state == "waiting":
                    r.move("transferring", a.verbose)
                finish(s, r, a.verbose)
            elif f[0] == "FAIL":
                r.failed_blocks, r.why = ids_of(f[3]), f[4] if len(f) > 4 else "failed"
                finish(s, r, a.verbose)
            elif f[0] == "READY":
                r.move("transferring", a.verbose)
                src = ids_of(f[2])
                t = s.eng.batch()
                for l in range(s.g.layers):
                    for lo, ro, ln, _, _ in block_ranges(s.g, r.ids, src):
                        t.read(s.regions[l], lo, p, remote[l], ro, ln)
                r.transfer = t.submit(a.deadline_ms)
        for r in [r for r in pending() if r.transfer is not None and r.transfer.done()]:
            try:
                r.transfer.result()
            except xfer.Error as e:
                r.why = str(e)
            r.transfer.close()
            r.transfer = None
            finish(s, r, a.verbose)
            if r.rid != a.skip_release:  # fault: never answer for this one
                s.eng.notify(p, f"RELEASE {r.rid}")
    wall = time.monotonic() - t_start
    for r in pending():
        r.why = "timed out"
        r.move("failed", a.verbose)
    s.eng.notify(p, "BYE")
    done = [r for r in reqs.values() if r.state == "done"]
    lat = sorted((r.t1 - r.t0) * 1000 for r in done)
    xfer_ms = sorted((r.t1 - r.tx) * 1000 for r in done)

    def pct(q, v=lat):
        return round(v[min(len(v) - 1, int(q * len(v)))], 3) if v else None

    moved = len(done) * nb * s.g.layers * 2 * s.g.block_bytes
    summary = {
        "mode": a.mode, "transport": p.transport, "device": a.device, "requests": a.requests,
        "done": len(done), "failed": {r.rid: {"blocks": r.failed_blocks, "why": r.why}
                                      for r in reqs.values() if r.state == "failed"},
        "bytes_per_request": nb * s.g.layers * 2 * s.g.block_bytes,
        "latency_ms_p50": pct(0.5), "latency_ms_p99": pct(0.99),
        "transferring_ms_p50": pct(0.5, xfer_ms), "transferring_ms_p99": pct(0.99, xfer_ms),
        "gbps": round(moved / wall / 1e9, 3) if wall > 0 else None,
    }
    print("SUMMARY " + json.dumps(summary), flush=True)
    s.close()
    return 0 if len(done) == a.requests else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("role", choices=["prefill", "decode"])
    ap.add_argument("--node", required=True)
    ap.add_argument("--peer", help="decode: the prefill node")
    ap.add_argument("--redis", default=os.environ.get("XFER_REDIS_URL", "redis://127.0.0.1:6379"))
    ap.add_argument("--mode", choices=["push", "pull"], default="push")
    ap.add_argument("--transports", default="tcp,ipc")
    ap.add_argument("--device", default="cpu", help="cpu, or cuda[:N] (torch)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--blocks", type=int, default=256)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--dtype", choices=["fp16", "bf16"], default="fp16")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=100)
    ap.add_argument("--deadline-ms", type=int, default=10000)
    ap.add_argument("--abort-ms", type=int, default=2000, help="prefill: free unreleased blocks after this")
    ap.add_argument("--timeout", type=float, default=60.0, help="decode: give up waiting after this")
    ap.add_argument("--skip-release", type=int, default=-1, help="decode (fault): never release this request")
    ap.add_argument("--bad-request", type=int, default=-1, help="prefill (fault): misaddress one block of it")
    ap.add_argument("--verbose", action="store_true")
    a = ap.parse_args()
    if a.role == "decode" and not a.peer:
        ap.error("decode needs --peer")
    return run_prefill(a) if a.role == "prefill" else run_decode(a)


if __name__ == "__main__":
    sys.exit(main())
