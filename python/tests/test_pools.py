"""KV pools at the node level between two processes: register_pool in
vLLM's FlashAttention layout, pools() listing, transfer_blocks both ways
over all layers and a layer range, mismatched geometry and bad block ids."""

import hashlib

import numpy as np
import pytest

import xfer
from peer import bytes_of

L, BS, HD, DIM = 3, 4, 2, 8


def layer_blocks(seed, l, nb, ids):
    t = np.zeros((2, nb, BS, HD, DIM), dtype=np.float16)
    t.view(np.uint8).reshape(-1)[:] = bytes_of(seed + l, t.nbytes)
    return t[:, ids]


@pytest.fixture
def pair(redis_url, peers, node_name):
    srv = peers("--node", "s-" + node_name, "--redis", redis_url, "--transports", "tcp,ipc",
                "--pool", f"kv:{L}:32:{BS}:{HD}:{DIM}:40", script="node_peer.py")
    with xfer.Node("c-" + node_name, redis_url, transports="tcp,ipc", ttl_ms=3000) as me:
        yield me, srv, "s-" + node_name


def test_pool_blocks(pair):
    me, srv, s = pair
    kv = [np.zeros((2, 16, BS, HD, DIM), dtype=np.float16) for _ in range(L)]
    pool = me.register_pool("kv", kv, "vllm_fa")
    info = pool.info()
    assert (info.layout, info.layers, info.num_blocks, info.kv, info.block_tokens, info.kv_heads, info.head_dim) == \
        ("vllm_fa", L, 16, 2, BS, HD, DIM)
    assert info.block_bytes == BS * HD * DIM * 2 and info.dtype == "fp16"
    (rp,) = me.pools(s)
    assert rp.name == "kv" and rp.num_blocks == 32 and rp.regions == ("kv.0", "kv.1", "kv.2")
    assert [p.name for p in me.pools()] == ["kv"]

    t = me.transfer_blocks(pool, [0, 1, 2, 5], f"{s}/kv", [10, 11, 12, 20], op="read")
    assert t.wait(10)
    # one vectored item per layer tensor pair; its segments: two runs
    # (0-2 -> 10-12, 5 -> 20) for K and two for V
    assert len(t) == L and [t.item_segments(i) for i in range(L)] == [4] * L
    for l in range(L):
        got, want = kv[l][:, [0, 1, 2, 5]], layer_blocks(40, l, 32, [10, 11, 12, 20])
        assert np.array_equal(got.view(np.uint16), want.view(np.uint16))  # bits: random fp16 has NaNs

    # Write blocks back over layer 1 only.
    kv[1][:, 7] = 1.5
    t = me.transfer_blocks("kv", [7], f"{s}/kv", [30], op="write", layers=range(1, 2), notify=b"req-3 layer 1")
    assert t.wait(10) and t.notify_status(s) == xfer.Code.OK
    assert srv.cmd(op="notifs", count=1)["notifs"] == [[me.node_id, "req-3 layer 1"]]
    want = hashlib.sha256(np.ascontiguousarray(kv[1][:, [7]]).tobytes()).hexdigest()
    assert srv.cmd(op="blocks", layer=1, ids=[30])["hex"] == want
    untouched = hashlib.sha256(np.ascontiguousarray(layer_blocks(40, 0, 32, [30])).tobytes()).hexdigest()
    assert srv.cmd(op="blocks", layer=0, ids=[30])["hex"] == untouched


def test_pool_errors(pair):
    me, srv, s = pair
    bad = me.register_pool("bad", [np.zeros((2, 16, BS, HD, DIM * 2), dtype=np.float16) for _ in range(L)])
    with pytest.raises(xfer.MismatchError) as ei:
        me.transfer_blocks(bad, [0], f"{s}/kv", [0], op="read")
    assert "block_bytes: 256 vs 128" in ei.value.reason  # the field that differs, named
    tagged = me.register_pool("tagged", [np.zeros((2, 16, BS, HD, DIM), dtype=np.float16) for _ in range(L)],
                              tag="other-model")
    with pytest.raises(xfer.MismatchError, match="tag"):
        me.transfer_blocks(tagged, [0], f"{s}/kv", [0], op="read")
    good = me.register_pool("kv", [np.zeros((2, 16, BS, HD, DIM), dtype=np.float16) for _ in range(L)])
    with pytest.raises(xfer.RangeError):
        me.transfer_blocks(good, [0], f"{s}/kv", [32], op="read")
    with pytest.raises(xfer.RangeError):
        me.transfer_blocks(good, [16], f"{s}/kv", [0], op="read")
    with pytest.raises(xfer.NotFoundError):
        me.transfer_blocks(good, [0], f"{s}/nopool", [0], op="read")
    with pytest.raises(xfer.InvalidArgumentError):
        me.register_pool("odd", [np.zeros((3, 4), dtype=np.float16)], "vllm_fa")
    with pytest.raises(xfer.InvalidArgumentError):
        me.transfer_blocks(good, [0, 1], f"{s}/kv", [0], op="read")
