"""Two-sided messages (send/recv) between this process and a node_peer.py
process through a real redis-server: by node name at the node level, with
tags, any-tag receives, the sender's name, truncation on both sides, and
the engine-level calls in one process."""

import hashlib
import threading

import numpy as np
import pytest

import xfer
from peer import bytes_of


@pytest.fixture
def pair(redis_url, peers, node_name):
    srv = peers("--node", "s-" + node_name, "--redis", redis_url, "--transports", "tcp",
                "--region", "in:65536:rw", "--region", "out:65536:r:12", script="node_peer.py")
    with xfer.Node("c-" + node_name, redis_url, transports="tcp", ttl_ms=3000) as me:
        yield me, srv, "s-" + node_name


def test_node_send_recv(pair, node_name):
    me, srv, s = pair
    buf = me.register("buf", bytes_of(7, 65536).copy())
    me.notify(s, "hello")  # both nodes now know each other (the peer resolved us)
    srv.cmd(op="notify", node="c-" + node_name, msg="hi")
    # The peer posts a receive while we send 1000 bytes with tag 42.
    got = {}
    th = threading.Thread(target=lambda: got.update(srv.cmd(op="recv", region="in", node="c-" + node_name,
                                                            tag=42)))
    th.start()
    t = me.send(s, (buf, 0), 1000, tag=42)
    assert t.wait(10)
    th.join(20)
    assert got == {"n": 1000, "tag": 42, "sender": "c-" + node_name,
                   "hex": hashlib.sha256(buf.numpy()[:1000].tobytes()).hexdigest()}
    # The other way, received with any tag from any node.
    inbox = me.register("inbox", 65536)
    r = me.recv(inbox)
    assert srv.cmd(op="send", node="c-" + node_name, region="out", len=5000, tag=7) == {}
    assert r.wait(10)
    assert r.item_bytes(0) == 5000 and r.item_msg(0) == (7, s)
    assert np.array_equal(inbox.numpy()[:5000], bytes_of(12, 65536)[:5000])
    # Too long for the posted buffer: both sides fail with ETRUNC.
    r = me.recv((inbox, 0), 100, node=s)
    assert srv.cmd(op="send", node="c-" + node_name, region="out", len=5000, tag=1) == {"failed": "ETRUNC"}
    with pytest.raises(xfer.TruncatedError):
        r.wait(10)


def test_engine_send_recv_in_process():
    with xfer.Engine("sr-a", transports="tcp") as a, xfer.Engine("sr-b", transports="tcp") as b:
        pa, pb = b.add_peer(a.info()), a.add_peer(b.info())
        src = a.register("src", bytes_of(3, 4096).copy())
        dst = b.register("dst", 4096)
        r = b.recv(dst, peer=pa, tag=9)
        t = a.send(pb, src, 0, 4096, tag=9)
        assert t.wait(10) and r.wait(10)
        assert r.item_bytes(0) == 4096 and r.item_msg(0) == (9, "sr-a")
        assert np.array_equal(dst.numpy(), src.numpy())
        # A receive for another tag does not take it; cancel ends it.
        r = b.recv(dst, peer=pa, tag=10, deadline_ms=10000)
        assert r.wait(0.2) is False
        r.cancel()
        assert r.status()[0].code == xfer.Code.ECANCELED


def test_send_local_completion():
    """local_completion=True (XFER_SEND_LOCAL): the SEND ends once written,
    before any RECV is posted; the RECV gets the bytes later; truncation
    fails only the RECV; more than 8 KiB is refused when added."""
    with xfer.Engine("sl-a", transports="tcp") as a, xfer.Engine("sl-b", transports="tcp") as b:
        pa, pb = b.add_peer(a.info()), a.add_peer(b.info())
        src = a.register("src", bytes_of(5, 16384).copy())
        dst = b.register("dst", 16384)
        plain = a.send(pb, src, 0, 64, tag=1)  # the default waits for a RECV
        assert plain.wait(0.2) is False
        t = a.send(pb, src, 64, 4096, tag=2, local_completion=True)
        assert t.wait(10)  # no RECV posted for tag 2 yet
        r = b.recv(dst, 0, 8192, peer=pa, tag=2)
        assert r.wait(10) and r.item_bytes(0) == 4096
        assert np.array_equal(dst.numpy()[:4096], src.numpy()[64:4160])
        r1 = b.recv(dst, 8192, 64, peer=pa, tag=1)
        assert r1.wait(10) and plain.wait(10)
        # Too long for the posted buffer: only the receiver learns it.
        r = b.recv(dst, 0, 100, peer=pa, tag=3)
        t = a.send(pb, src, 0, 5000, tag=3, local_completion=True)
        assert t.wait(10)
        with pytest.raises(xfer.TruncatedError):
            r.wait(10)
        with pytest.raises(xfer.InvalidArgumentError):
            a.send(pb, src, 0, 16384, tag=4, local_completion=True)
