"""The node level (xfer.Node over node/xfer_node.h) between this process and
a node_peer.py process through a real redis-server: named transfers,
listings, re-resolve after a re-registration, errors, asyncio,
notifications by node name."""

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
    with xfer.Node("c-" + node_name, redis_url, transports="tcp,ipc", ttl_ms=3000, connect_timeout_ms=2000,
                   io_timeout_ms=2000) as n:
        yield n


def start(peers, redis_url, node_name, *regions, transports="tcp"):
    args = ["--node", "s-" + node_name, "--redis", redis_url, "--transports", transports]
    for r in regions:
        args += ["--region", r]
    return peers(*args, script="node_peer.py")


@pytest.mark.parametrize("transport", ["tcp", "ipc"])
def test_named_round_trip(me, peers, redis_url, node_name, transport):
    srv = start(peers, redis_url, node_name, f"src:{MB}:r:5", f"dst:{MB}:w", transports=transport)
    s = "s-" + node_name
    buf = np.zeros(MB, dtype=np.uint8)
    local = me.register("buf", buf)
    t = me.read(local, f"{s}/src")
    assert t.wait(10) and t.item_transport(0) == transport
    assert np.array_equal(buf, bytes_of(5, MB))
    # (region, offset) and "+off" forms, several items in one transfer
    buf[:] = bytes_of(6, MB)
    t = me.batch()
    t.write(local, 0, f"{s}/dst", MB // 2).write(local, MB // 2, f"{s}/dst+{MB // 2}", MB // 2).submit()
    assert t.wait(10) and [st.ok for st in t.status()] == [True, True]
    assert srv.cmd(op="digest", region="dst")["hex"] == hashlib.sha256(buf.tobytes()).hexdigest()
    part = me.read((local, 4096), f"{s}/src+4096", 4096)
    assert part.wait(10)
    assert [p.node_id for p in me.peers()] == [s] or s in [p.node_id for p in me.peers()]
    assert [r.name for r in me.regions(s)] == ["dst", "src"]
    assert [r.name for r in me.regions()] == ["buf"]


def test_reregistered_region_is_resolved_again(me, peers, redis_url, node_name):
    srv = start(peers, redis_url, node_name, "src:65536:r:9")
    s = "s-" + node_name
    local = me.register("buf", 65536)
    assert me.read(local, f"{s}/src").wait(10)
    srv.cmd(op="reregister", region="src")
    local.numpy()[:] = 0
    # The cached descriptor is stale; the node re-resolves and retries once.
    deadline = time.monotonic() + 10
    while True:
        try:
            assert me.read(local, f"{s}/src").wait(10)
            break
        except (xfer.StaleError, xfer.NotFoundError):
            assert time.monotonic() < deadline  # the region- event may lag
            time.sleep(0.05)
    assert np.array_equal(local.numpy(), bytes_of(9, 65536))


def test_errors(me, peers, redis_url, node_name):
    srv = start(peers, redis_url, node_name, f"src:{4 * MB}:r")
    s = "s-" + node_name
    local = me.register("buf", 4 * MB)
    with pytest.raises(xfer.NotFoundError, match="nobody"):
        me.read(local, "nobody/src", 10)
    with pytest.raises(xfer.NotFoundError):
        me.read(local, f"{s}/nothing", 10)
    with pytest.raises(xfer.InvalidArgumentError):
        me.read(local, "no-slash", 10)
    with pytest.raises(xfer.AccessError):
        me.write(local, f"{s}/src", 10)
    with pytest.raises(xfer.RangeError):
        me.read(local, f"{s}/src+{4 * MB - 1}", 10)
    with pytest.raises(xfer.NotSupportedError):
        me.read(local, f"{s}/src", 10, require="rdma").wait(5)
    assert me.read(local, f"{s}/src").wait(10)
    srv.stop()
    try:
        t = me.read(local, f"{s}/src", deadline_ms=300)
        with pytest.raises(xfer.TimeoutError):
            t.wait(5)
        t = me.read(local, f"{s}/src", deadline_ms=10000)
        t.cancel()
        assert t.status()[0].code == xfer.Code.ECANCELED
    finally:
        srv.cont()
    srv.kill()
    with pytest.raises((xfer.ConnectionError, xfer.NotFoundError)):
        me.read(local, f"{s}/src", deadline_ms=5000).wait(8)


def test_asyncio_and_notifications(me, peers, redis_url, node_name):
    srv = start(peers, redis_url, node_name, f"src:{MB}:r:2")
    s = "s-" + node_name
    local = me.register("buf", MB)

    async def run():
        step = MB // 8
        await asyncio.gather(*[me.read((local, i * step), f"{s}/src+{i * step}", step) for i in range(8)])

    asyncio.run(asyncio.wait_for(run(), 20))
    assert np.array_equal(local.numpy(), bytes_of(2, MB))

    me.notify(s, "to-peer")
    assert srv.cmd(op="notifs", count=1)["notifs"] == [["c-" + node_name, "to-peer"]]
    srv.cmd(op="notify", node="c-" + node_name, msg="to-me")
    assert [(n.sender, n.data) for n in me.notifications(timeout=5)] == [(s, b"to-me")]
    with pytest.raises(xfer.NotFoundError):
        me.notify("nobody-" + node_name, "x")


def test_node_transfers_do_not_leak(me, peers, redis_url, node_name):
    """10,000 named transfers: fds and RSS stay flat (Python level)."""
    import gc
    import os

    start(peers, redis_url, node_name, "src:4096:r:1")
    s = "s-" + node_name
    local = me.register("buf", 4096)

    def run(n):
        for i in range(n):
            t = me.read((local, i % 64), f"{s}/src+{i % 64}", 64)
            assert t.wait(10)
            t.close()
        gc.collect()

    def rss_kb():
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))

    run(1000)
    rss0, fds0 = rss_kb(), len(os.listdir("/proc/self/fd"))
    run(10000)
    rss1, fds1 = rss_kb(), len(os.listdir("/proc/self/fd"))
    assert fds1 == fds0, f"fds {fds0} -> {fds1}"
    if not os.environ.get("XFER_SAN"):
        assert rss1 - rss0 < 4096, f"RSS grew {rss1 - rss0} KiB over 10,000 named transfers"
