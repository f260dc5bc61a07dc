"""The NIXL-shaped module's surface, between this process and a target
process (nixl_peer.py) through a real redis-server."""

import hashlib
import time

import numpy as np
import pytest

import xfer
from peer import bytes_of
from xfer.nixl import nixl_agent, nixl_agent_config

MB = 1 << 20


def poll_state(agent, h, timeout=10.0):
    deadline = time.monotonic() + timeout
    while True:
        s = agent.check_xfer_state(h)
        if s != "PROC" or time.monotonic() > deadline:
            return s
        time.sleep(0.001)


@pytest.fixture
def pair(redis_url, peers, node_name):
    tgt = peers("--name", "t-" + node_name, "--redis", redis_url, "--bytes", str(MB), "--seed", "4",
                script="nixl_peer.py")
    agent = nixl_agent("i-" + node_name, nixl_agent_config(redis_url=redis_url, transports="tcp"))
    yield agent, tgt
    agent.close()


@pytest.mark.parametrize("by", ["blob", "name"])
def test_read_write_prepped(pair, node_name, by):
    agent, tgt = pair
    md = bytes.fromhex(tgt.ready["md"])
    name = agent.add_remote_agent(md if by == "blob" else "t-" + node_name)
    assert name == "t-" + node_name and agent.check_remote_metadata(name)
    agent.make_connection(name)

    local = np.zeros(MB, dtype=np.uint8)
    reg = agent.register_memory(agent.get_reg_descs([(local.ctypes.data, MB, 0, "")], "DRAM"))
    assert reg.descCount() == 1 and reg.getType() == "DRAM"
    blk, n = 4096, MB // 4096
    raddr = tgt.ready["addr"]
    ldesc = agent.get_xfer_descs([(local.ctypes.data + i * blk, blk, 0) for i in range(n)], "DRAM")
    rdesc = agent.get_xfer_descs(np.array([[raddr + i * blk, blk, 0] for i in range(n)], dtype=np.uint64), "DRAM")
    lh = agent.prep_xfer_dlist("NIXL_INIT_AGENT", ldesc)
    rh = agent.prep_xfer_dlist(name, rdesc)
    # Blocks 10..19 of the remote -> blocks 0..9 here, and 100 -> 50.
    h = agent.make_prepped_xfer("READ", lh, list(range(10)) + [50], rh, list(range(10, 20)) + [100])
    assert len(h.transfer) == 2  # the ten adjacent blocks merged into one item
    st = agent.transfer(h)
    assert st in ("DONE", "PROC")
    assert poll_state(agent, h) == "DONE"
    assert agent.query_xfer_backend(h) == "TCP"
    want = bytes_of(4, MB)
    assert np.array_equal(local[: 10 * blk], want[10 * blk: 20 * blk])
    assert np.array_equal(local[50 * blk: 51 * blk], want[100 * blk: 101 * blk])
    # Reposting a finished handle runs it again.
    local[:] = 0
    assert agent.transfer(h) in ("DONE", "PROC") and poll_state(agent, h) == "DONE"
    assert np.array_equal(local[: 10 * blk], want[10 * blk: 20 * blk])
    agent.release_xfer_handle(h)

    # initialize_xfer (WRITE) of the whole buffer.
    local[:] = bytes_of(8, MB)
    h = agent.initialize_xfer("WRITE", agent.get_xfer_descs([(local.ctypes.data, MB, 0)], "DRAM"),
                              agent.get_xfer_descs([(raddr, MB, 0)], "DRAM"), name)
    agent.transfer(h)
    assert poll_state(agent, h) == "DONE"
    assert tgt.cmd(op="digest")["hex"] == hashlib.sha256(local.tobytes()).hexdigest()
    agent.release_xfer_handle(h)
    agent.release_dlist_handle(lh)
    agent.release_dlist_handle(rh)
    agent.deregister_memory(reg)
    agent.remove_remote_agent(name)
    assert not agent.check_remote_metadata(name)


def test_errors(pair, node_name):
    agent, tgt = pair
    name = agent.add_remote_agent(bytes.fromhex(tgt.ready["md"]))
    raddr = tgt.ready["addr"]
    local = np.zeros(8192, dtype=np.uint8)
    agent.register_memory([(local.ctypes.data, local.nbytes, 0, "")], "DRAM")
    with pytest.raises(xfer.RangeError, match="not inside a region"):
        agent.prep_xfer_dlist(name, [(raddr + MB - 10, 100, 0)], "DRAM")
    with pytest.raises(xfer.RangeError):
        agent.prep_xfer_dlist(name, [(raddr, 100, 0)], "VRAM")  # wrong memory type
    with pytest.raises(xfer.NotFoundError):
        agent.prep_xfer_dlist("nobody", [(raddr, 100, 0)], "DRAM")
    with pytest.raises(xfer.InvalidArgumentError):
        agent.get_xfer_descs([(raddr, 100, 0)], "HBM")
    with pytest.raises(xfer.InvalidArgumentError):
        agent.add_remote_agent(b"garbage")
    lh = agent.prep_xfer_dlist("", [(local.ctypes.data, 4096, 0)], "DRAM")
    rh = agent.prep_xfer_dlist(name, [(raddr, 4096, 0), (raddr, 8, 0)], "DRAM")
    with pytest.raises(xfer.InvalidArgumentError, match="bytes"):
        agent.make_prepped_xfer("READ", lh, [0], rh, [1])
    with pytest.raises(xfer.InvalidArgumentError):
        agent.make_prepped_xfer("COPY", lh, [0], rh, [0])
    # The target deregisters: the transfer ends "ERR" with the item's reason.
    tgt.cmd(op="deregister")
    h = agent.make_prepped_xfer("READ", lh, [0], rh, [0])
    agent.transfer(h)
    assert poll_state(agent, h) == "ERR"
    st = h.transfer.status()[0]
    assert st.code in (xfer.Code.ENOENT, xfer.Code.ESTALE) and st.reason
    agent.release_xfer_handle(h)


def test_notifications(pair, node_name):
    agent, tgt = pair
    name = agent.add_remote_agent("t-" + node_name)
    raddr = tgt.ready["addr"]
    local = bytes_of(21, MB).copy()
    agent.register_memory([(local.ctypes.data, MB, 0, "")], "DRAM")
    lh = agent.prep_xfer_dlist("", [(local.ctypes.data, MB, 0)], "DRAM")
    rh = agent.prep_xfer_dlist(name, [(raddr, MB, 0)], "DRAM")
    h = agent.make_prepped_xfer("WRITE", lh, [0], rh, [0], notif_msg=b"req-1:done")
    agent.transfer(h)
    # The target learns of the transfer from the notification alone, and
    # the data is there when it does.
    r = tgt.cmd(op="wait_notif", agent=agent.name, tag="req-1")
    assert r["found"] and r["digest"] == hashlib.sha256(local.tobytes()).hexdigest()
    assert poll_state(agent, h) == "DONE"
    local[:] = bytes_of(22, MB)
    agent.transfer(h, notif_msg=b"req-2:done")
    r = tgt.cmd(op="wait_notif", agent=agent.name, tag="req-2")
    assert r["found"] and r["digest"] == hashlib.sha256(local.tobytes()).hexdigest()
    assert not tgt.cmd(op="wait_notif", agent=agent.name, tag="req-1", wait=0.2)["found"]  # taken once

    # The target answers with a standalone notification (it finds us by name).
    tgt.cmd(op="add", name=agent.name)
    tgt.cmd(op="send_notif", agent=agent.name, msg="release:req-1")
    deadline = time.monotonic() + 10
    while not agent.check_remote_xfer_done(name, b"release:", tag_is_prefix=True):
        assert time.monotonic() < deadline, "no notification from the target"
        time.sleep(0.001)
    assert agent.get_new_notifs() == {}
