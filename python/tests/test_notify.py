"""Notifications between this process and a peer.py process through a real
redis-server: bound to a transfer (data in place on arrival, failed items
named), standalone both ways, iterator and async iterator, back-pressure."""

import asyncio
import hashlib
import time

import numpy as np
import pytest

import xfer
from peer import bytes_of

MB = 1 << 20


@pytest.fixture
def me(redis_url, node_name):
    eng = xfer.Engine("c-" + node_name, transports="tcp,ipc", connect_timeout_ms=2000)
    reg = xfer.Registry(redis_url, ttl_ms=3000)
    reg.publish_node(eng)
    yield eng, reg
    reg.close()
    eng.close()


@pytest.mark.parametrize("transport", ["tcp", "ipc"])
def test_bound_notification_after_write(me, peers, redis_url, node_name, transport):
    eng, reg = me
    srv = peers("--node", "s-" + node_name, "--redis", redis_url, "--transports", transport,
                "--region", f"dst:{MB}:w")
    p = reg.connect(eng, "s-" + node_name)
    dst = reg.resolve(p, "dst")
    local = eng.register("src", bytes_of(11, MB).copy())
    t = eng.batch()
    for i in range(4):  # four items, then the notification behind them
        t.write(local, i * (MB // 4), p, dst, i * (MB // 4), MB // 4)
    t.notify(p, b"req-7 done").submit()
    assert t.wait(10)
    assert t.notify_status(p) == xfer.Code.OK
    got = srv.cmd(op="notifs", count=1, wait=10)["notifs"]
    assert got == [{"sender": "c-" + node_name, "data": "req-7 done", "bound": True, "status": "OK",
                    "n_items": 4, "n_failed": 0, "failed": []}]
    want = hashlib.sha256(local.numpy().tobytes()).hexdigest()
    assert srv.cmd(op="digest", region="dst")["hex"] == want


def test_failed_item_is_named(me, peers, redis_url, node_name):
    eng, reg = me
    srv = peers("--node", "s-" + node_name, "--redis", redis_url, "--region", "dst:4096:w")
    p = reg.connect(eng, "s-" + node_name)
    dst = reg.resolve(p, "dst")
    local = eng.register("src", 8192)
    # Item 1 reaches past the remote region: the target refuses it.
    t = eng.batch().write(local, 0, p, dst, 0, 4096).write(local, 0, p, dst, 2048, 4096)
    t.notify(p, "partial").submit()
    with pytest.raises(xfer.RangeError):
        t.wait(10)
    (n,) = srv.cmd(op="notifs", count=1, wait=10)["notifs"]
    assert n["status"] == "ERANGE" and n["n_items"] == 2 and n["n_failed"] == 1
    assert n["failed"] == [[1, "ERANGE"]]


def test_standalone_both_ways_and_async(me, peers, redis_url, node_name):
    eng, reg = me
    srv = peers("--node", "s-" + node_name, "--redis", redis_url, "--region", "r:4096:r")
    p = reg.connect(eng, "s-" + node_name)
    eng.notify(p, "hello")
    assert srv.cmd(op="notifs", count=1)["notifs"][0]["data"] == "hello"

    srv.cmd(op="notify", node="c-" + node_name, msg="one")
    srv.cmd(op="notify", node="c-" + node_name, msg="two")
    got = [n.data for n in eng.notifications(timeout=5)]
    assert got == [b"one", b"two"]
    assert all(n.sender == "s-" + node_name for n in eng.poll_notifications()) is True

    async def take(k):
        out = []
        async for n in eng.notifications():
            out.append(n.data)
            if len(out) == k:
                return out

    async def run():
        task = asyncio.ensure_future(take(2))
        await asyncio.sleep(0.05)  # the consumer waits on the eventfd
        for m in ("three", "four"):
            await asyncio.get_running_loop().run_in_executor(
                None, lambda m=m: srv.cmd(op="notify", node="c-" + node_name, msg=m))
        return await asyncio.wait_for(task, 10)

    assert asyncio.run(run()) == [b"three", b"four"]
    assert list(eng.notifications(timeout=0)) == []


def test_wait_notification_reads_the_sender(me, peers, redis_url, node_name):
    eng, reg = me
    srv = peers("--node", "s-" + node_name, "--redis", redis_url, "--region", "r:4096:r")
    p = reg.connect(eng, "s-" + node_name)
    t0 = time.monotonic()
    assert eng.wait_notification(p, timeout=0.2) == 0  # nothing sent: bounded
    assert 0.19 <= time.monotonic() - t0 < 5
    for k in range(20):  # a ping-pong: each side waits for the other's
        eng.notify(p, f"ping {k}")
        assert srv.cmd(op="notifs", count=1, wait=10)["notifs"][0]["data"] == f"ping {k}"
        srv.cmd(op="notify", node="c-" + node_name, msg=f"pong {k}")
        who = (p, "s-" + node_name, None)[k % 3]  # Peer, node id, any
        assert eng.wait_notification(who, timeout=10) == 1
        (n,) = eng.poll_notifications()
        assert (n.sender, n.data) == ("s-" + node_name, f"pong {k}".encode())
    srv.cmd(op="notify", node="c-" + node_name, msg="last")
    assert [n.data for n in eng.notifications(timeout=5, peer=p)] == [b"last"]
    assert eng.wait_notification("nobody", timeout=0) == 0


def test_queue_full_is_back_pressure(me, peers, redis_url, node_name):
    eng, reg = me
    srv = peers("--node", "s-" + node_name, "--redis", redis_url, "--notify-queue", "2", "--region", "r:4096:r")
    p = reg.connect(eng, "s-" + node_name)
    eng.notify(p, "a")
    eng.notify(p, "b")
    with pytest.raises(xfer.NoSpaceError) as ei:
        eng.notify(p, "c")
    assert ei.value.code == xfer.Code.ENOSPC
    assert [n["data"] for n in srv.cmd(op="notifs", count=2)["notifs"]] == ["a", "b"]
    eng.notify(p, "d")  # room again
    assert srv.cmd(op="notifs", count=1)["notifs"][0]["data"] == "d"
    with pytest.raises(xfer.InvalidArgumentError):
        eng.notify(p, b"x" * (xfer._lib.NOTIFY_MAX + 1))
