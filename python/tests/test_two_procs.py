"""Round trips between this process and a peer.py process through a real
redis-server, over tcp (and ipc when the peer is on this host and asked)."""

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
    eng = xfer.Engine("c-" + node_name, transports="tcp,ipc", io_timeout_ms=2000, connect_timeout_ms=2000)
    reg = xfer.Registry(redis_url, ttl_ms=3000)
    reg.publish_node(eng)
    yield eng, reg
    reg.close()
    eng.close()


def digest(a) -> str:
    return hashlib.sha256(np.asarray(a).tobytes()).hexdigest()


@pytest.mark.parametrize("transport", ["tcp", "ipc"])
def test_read_write_round_trip(me, peers, redis_url, node_name, transport):
    eng, reg = me
    srv = peers("--node", "s-" + node_name, "--redis", redis_url, "--transports", transport,
                "--region", f"src:{MB}:r:7", "--region", f"dst:{MB}:w:0")
    p = reg.connect(eng, "s-" + node_name)
    src = reg.resolve(p, "src")
    dst = reg.resolve(p, "dst")
    assert src.nbytes == MB and src.access == "r" and dst.access == "w"

    buf = np.zeros(MB, dtype=np.uint8)
    local = eng.register("buf", buf)
    t = eng.read(local, 0, p, src, 0, MB)
    assert t.wait(10) is True
    assert p.transport == transport
    assert np.array_equal(buf, bytes_of(7, MB))  # the peer's bytes, in our array

    buf[:] = bytes_of(99, MB)
    # Several items, out of order, in one transfer.
    t = eng.batch()
    half = MB // 2
    t.write(local, half, p, dst, half, half).write(local, 0, p, dst, 0, half).submit()
    assert t.wait(10)
    assert [s.ok for s in t.status()] == [True, True]
    assert srv.cmd(op="digest", region="dst")["hex"] == digest(buf)


def test_asyncio_many_transfers(me, peers, redis_url, node_name):
    eng, reg = me
    peers("--node", "s-" + node_name, "--redis", redis_url, "--region", f"src:{MB}:r:3")
    p = reg.connect(eng, "s-" + node_name)
    src = reg.resolve(p, "src")
    local = eng.register("buf", MB)
    want = bytes_of(3, MB)

    async def run():
        n = 32
        step = MB // n
        ts = [eng.read(local, i * step, p, src, i * step, step) for i in range(n)]
        await asyncio.gather(*ts)
        return all(t.done() for t in ts)

    assert asyncio.run(asyncio.wait_for(run(), 20))
    assert np.array_equal(local.numpy(), want)


def test_blocks_between_layouts(me, peers, redis_url, node_name):
    eng, reg = me
    bb, nb = 4096, 16
    srv = peers("--node", "s-" + node_name, "--redis", redis_url,
                "--region", f"kv:{bb * nb}:rw:5:{bb}:{nb}")
    p = reg.connect(eng, "s-" + node_name)
    kv = reg.resolve(p, "kv")
    assert kv.layout == xfer.KVLayout(bb, nb)
    local = eng.register("kv", np.zeros(bb * 8, dtype=np.uint8), layout=xfer.KVLayout(bb, 8))
    t = eng.batch()
    # 3,4,5 -> 0,1,2 is one run; 9 -> 6 another.
    assert t.read_blocks(local, [0, 1, 2, 6], p, kv, [3, 4, 5, 9]) == 2
    assert t.submit().wait(10)
    remote = bytes_of(5, bb * nb).reshape(nb, bb)
    got = local.numpy().reshape(8, bb)
    assert np.array_equal(got[0:3], remote[3:6]) and np.array_equal(got[6], remote[9])
    # And back, onto other blocks.
    t = eng.batch()
    t.write_blocks(local, [0], p, kv, [15])
    t.submit().wait(10)
    assert srv.cmd(op="digest", region="kv", off=15 * bb, len=bb)["hex"] == digest(got[0])

    bad = eng.register("bad", np.zeros(2048, dtype=np.uint8), layout=xfer.KVLayout(1024, 2))
    with pytest.raises(xfer.MismatchError) as ei:
        eng.batch().read_blocks(bad, [0], p, kv, [0])
    assert ei.value.code == xfer.Code.EMISMATCH and "block_bytes" in ei.value.reason
    with pytest.raises(xfer.RangeError):
        eng.batch().read_blocks(local, [0], p, kv, [nb])


def test_unknown_node_and_region(me, peers, redis_url, node_name):
    eng, reg = me
    with pytest.raises(xfer.NotFoundError) as ei:
        reg.connect(eng, "nobody-" + node_name)
    assert ei.value.code == xfer.Code.ENOENT and "nobody" in str(ei.value)
    peers("--node", "s-" + node_name, "--redis", redis_url, "--region", "src:4096:r")
    p = reg.connect(eng, "s-" + node_name)
    with pytest.raises(xfer.NotFoundError):
        reg.resolve(p, "nothing")
    assert "s-" + node_name in [n.node_id for n in reg.nodes()]
    assert [r.name for r in reg.regions("s-" + node_name)] == ["src"]


def test_access_and_range(me, peers, redis_url, node_name):
    eng, reg = me
    peers("--node", "s-" + node_name, "--redis", redis_url, "--region", "ro:4096:r")
    p = reg.connect(eng, "s-" + node_name)
    ro = reg.resolve(p, "ro")
    local = eng.register("buf", 8192)
    with pytest.raises(xfer.AccessError):
        eng.write(local, 0, p, ro, 0, 4096).wait(10)
    with pytest.raises(xfer.RangeError) as ei:
        eng.read(local, 0, p, ro, 4000, 200).wait(10)
    assert ei.value.reason  # the engine said why


def test_stale_region(me, peers, redis_url, node_name):
    eng, reg = me
    srv = peers("--node", "s-" + node_name, "--redis", redis_url, "--region", "src:4096:r")
    p = reg.connect(eng, "s-" + node_name)
    old = reg.resolve(p, "src")
    local = eng.register("buf", 4096)
    assert eng.read(local, 0, p, old, 0, 4096).wait(10)
    gen = srv.cmd(op="reregister", region="src")["gen"]
    assert gen > old.gen
    t = eng.read(local, 0, p, old, 0, 4096)
    with pytest.raises((xfer.StaleError, xfer.NotFoundError)) as ei:
        t.wait(10)
    st = t.status()[0]
    assert st.code in (xfer.Code.ESTALE, xfer.Code.ENOENT) and st.reason
    # The fresh descriptor works (read Redis again: the event may lag).
    reg.clear_cache()
    new = poll_region_gen(reg, "s-" + node_name, "src", gen)
    p.add_region(new)
    assert eng.read(local, 0, p, new, 0, 4096).wait(10)


def poll_region_gen(reg, node, name, gen, timeout=10):
    deadline = time.monotonic() + timeout
    while True:
        info = reg.region(node, name)
        if info.gen == gen:
            return info
        assert time.monotonic() < deadline, f"region {name} never reached gen {gen}"
        reg.clear_cache()
        time.sleep(0.02)


def test_dead_peer(me, peers, redis_url, node_name):
    eng, reg = me
    srv = peers("--node", "s-" + node_name, "--redis", redis_url, "--region", f"src:{MB}:r")
    p = reg.connect(eng, "s-" + node_name)
    src = reg.resolve(p, "src")
    local = eng.register("buf", MB)
    assert eng.read(local, 0, p, src, 0, MB).wait(10)
    srv.kill()
    t0 = time.monotonic()
    with pytest.raises(xfer.ConnectionError) as ei:
        eng.read(local, 0, p, src, 0, MB, deadline_ms=8000).wait(10)
    assert ei.value.code == xfer.Code.ECONN
    assert time.monotonic() - t0 < 8


def test_timeout_and_cancel(me, peers, redis_url, node_name):
    eng, reg = me
    srv = peers("--node", "s-" + node_name, "--redis", redis_url, "--region", f"src:{4 * MB}:r")
    p = reg.connect(eng, "s-" + node_name)
    src = reg.resolve(p, "src")
    local = eng.register("buf", 4 * MB)
    assert eng.read(local, 0, p, src, 0, 4 * MB).wait(10)
    srv.stop()  # frozen: requests go unanswered
    try:
        t = eng.read(local, 0, p, src, 0, 4 * MB, deadline_ms=300)
        assert t.wait(0.05) is False and not t.done()
        with pytest.raises(xfer.TimeoutError) as ei:
            t.wait(5)
        assert isinstance(ei.value, TimeoutError) and ei.value.code == xfer.Code.ETIMEDOUT

        t = eng.read(local, 0, p, src, 0, 4 * MB, deadline_ms=10000)
        assert not t.done()
        t.cancel()
        assert t.done()
        assert t.status()[0].code == xfer.Code.ECANCELED
        with pytest.raises(xfer.CanceledError):
            t.result()

        async def cancel_task():
            t = eng.read(local, 0, p, src, 0, 4 * MB, deadline_ms=10000)
            task = asyncio.ensure_future(t.wait_async())
            await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return t

        t = asyncio.run(cancel_task())
        assert t.done() and t.status()[0].code == xfer.Code.ECANCELED
    finally:
        srv.cont()


def test_auth_mismatch(redis_url, peers, node_name):
    peers("--node", "s-" + node_name, "--redis", redis_url, "--secret", "right", "--region", "src:4096:r")
    with xfer.Engine("c-" + node_name, secret="wrong", transports="tcp", connect_timeout_ms=2000) as eng, \
            xfer.Registry(redis_url) as reg:
        with pytest.raises(xfer.Error) as ei:
            p = reg.connect(eng, "s-" + node_name)
            src = reg.resolve(p, "src")
            eng.read(eng.register("b", 4096), 0, p, src, 0, 4096).wait(5)
        assert ei.value.code in (xfer.Code.EAUTH, xfer.Code.ECONN)
