"""The node level: an embedded xfer node (node/xfer_node.h) that publishes
itself and its memory in Redis and moves bytes by name
("decode-3/kv.L0+4096") and KV blocks by pool ("decode-3/kv"), and
exchanges notifications and messages with other nodes."""

from __future__ import annotations

import asyncio
import ctypes
import weakref
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Union

from . import _lib
from . import _node_lib as N
from . import notify as _notify
from .engine import Region, RegionInfo, _Notifications, access_mask, transports_mask, transports_names
from .errors import Code, InvalidArgumentError, check, error_for
from .memory import buffer_of, cuda_device
from .registry import NodeInfo, Registry
from .transfer import Transfer, _timeout_ms


class _NodeBatchOps:
    free = staticmethod(N.batch_free)
    count = staticmethod(N.batch_count)
    reset = staticmethod(N.batch_reset)
    submit = staticmethod(N.batch_submit)
    poll = staticmethod(N.batch_poll)
    wait = staticmethod(N.batch_wait)
    cancel = staticmethod(N.batch_cancel)
    item_status = staticmethod(N.batch_item_status)
    item_error = staticmethod(N.batch_item_error)


_OPS = {"read": _lib.OP_READ, "write": _lib.OP_WRITE}


def _op(op: str) -> int:
    try:
        return _OPS[op.lower()]
    except (KeyError, AttributeError):
        raise InvalidArgumentError(1, f"op {op!r}: 'read' or 'write'", "transfer") from None


class NodeTransfer(Transfer):
    """A named transfer: items address remote memory by name. Same running
    interface as :class:`Transfer` (wait, done, status, cancel, await); a
    wait re-resolves and retries, once within the deadline, items that met a
    restarted peer or a re-registered region."""

    _c = _NodeBatchOps

    def __init__(self, node: "Node", require: Union[None, str, Sequence[str]] = None):
        err = ctypes.c_int(0)
        h = N.batch_new(node.handle, ctypes.byref(err))
        if not h:
            check(-abs(err.value) or -2, node.last_error, "batch_new")
        self._init(node, h)
        if require:
            check(N.batch_require(h, transports_mask(require)), node.last_error, "require")

    def _add_named(self, op: int, local: Region, local_off: int, remote: str, n: int) -> "NodeTransfer":
        rc = N.batch_add(self.handle, op, local.handle, local_off, remote.encode(), n)
        check(rc, self._engine.last_error, f"{'read' if op == _lib.OP_READ else 'write'} {remote}")
        self._refs.append(local)
        return self

    def read(self, local: Region, local_off: int, remote: str, nbytes: int) -> "NodeTransfer":  # type: ignore[override]
        """Adds a READ of nbytes from remote "node/region[+off]" (or
        "node/region#block": nbytes counts blocks) into local at local_off."""
        return self._add_named(_lib.OP_READ, local, local_off, remote, nbytes)

    def write(self, local: Region, local_off: int, remote: str, nbytes: int) -> "NodeTransfer":  # type: ignore[override]
        """Adds a WRITE of local [local_off, +nbytes) to remote "node/region[+off]"."""
        return self._add_named(_lib.OP_WRITE, local, local_off, remote, nbytes)

    def blocks(self, op: str, pool: "Pool", local_ids: Sequence[int], remote_pool: str, remote_ids: Sequence[int],
               layers: Union[None, range, tuple] = None) -> int:
        """Adds the moves of blocks local_ids[i] <-> remote_ids[i] between
        pool and "node/pool" over layers (None = all; a range or (first, n));
        returns the number of items (runs of consecutive blocks merge)."""
        if len(local_ids) != len(remote_ids):
            raise InvalidArgumentError(1, f"{len(local_ids)} local vs {len(remote_ids)} remote block ids", "blocks")
        first, count = 0, 0
        if isinstance(layers, range):
            if layers.step != 1:
                raise InvalidArgumentError(1, "layers must be consecutive", "blocks")
            first, count = layers.start, len(layers)
            if count == 0:
                raise InvalidArgumentError(1, "empty layer range", "blocks")
        elif layers is not None:
            first, count = layers
        n = len(local_ids)
        la = (ctypes.c_uint64 * n)(*local_ids)
        ra = (ctypes.c_uint64 * n)(*remote_ids)
        rc = N.batch_add_blocks(self.handle, _op(op), pool.handle, la, remote_pool.encode(), ra, n, first, count)
        check(rc, self._engine.last_error, f"blocks {remote_pool}")
        self._refs.append(pool)
        return rc

    def notify(self, node: str, msg) -> "NodeTransfer":
        """Binds a notification for node: sent after every item of this
        transfer addressed to node has ended (failed ones named in it).
        One per node; before submit."""
        b = _notify._bytes(msg)
        check(N.batch_notify(self.handle, node.encode(), b, len(b)), self._engine.last_error, f"notify {node}")
        return self

    def notify_status(self, node: str) -> Code:
        """OK once node queued the bound notification, EINPROGRESS before,
        or the error (ENOENT: none bound for node)."""
        st = N.batch_notify_status(self.handle, node.encode())
        return Code(-st) if -st in Code._value2member_map_ else Code.EIO

    def item_segments(self, i: int) -> int:
        """Segments of item i: the block runs of a pool item (one vectored
        item per pair of member regions), 1 for an item added by address."""
        return N.batch_item_segments(self.handle, i)

    def item_transport(self, i: int) -> Optional[str]:
        """The transport item i's bytes moved over (None: local copy or not started)."""
        names = transports_names(N.batch_item_transport(self.handle, i))
        return names[0] if names else None

    def fileno(self) -> int:
        raise InvalidArgumentError(13, "a node transfer has no completion fd; await it instead", "fileno")

    async def wait_async(self) -> None:
        """Awaits completion: the node's wait (with its one retry) runs on
        the loop's default executor, so the loop is never blocked and
        nothing polls. Cancelling the awaiting task cancels the transfer."""
        if not self._submitted:
            raise InvalidArgumentError(1, "transfer not submitted", "await")
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, self._c.wait, self.handle, -1)
        except asyncio.CancelledError:
            self.cancel()
            raise
        self.result()


class _BorrowedEngine:
    """The node's engine, for the engine-level helpers (notifications,
    messages); gone with the node."""

    def __init__(self, node: "Node", handle: int):
        self._node, self._eh = node, handle

    @property
    def _h(self) -> int:
        return self._eh if self._node._h else 0

    @property
    def handle(self) -> int:
        self._node.handle  # raises once the node is closed
        return self._eh

    def last_error(self) -> str:
        return _lib.text(_lib.engine_last_error(self._eh)) if self._node._h else "node closed"


class _RefPeer:
    """A peer the node resolved by name, held (xfer_node_unref on release)
    while something uses it."""

    def __init__(self, node: "Node", name: str):
        self.ref = _lib.new_filled(N.NodeRef)
        check(N.resolve(node.handle, name.encode(), None, 0, self.ref), node.last_error, name)
        self.node_id = name
        self._fin = weakref.finalize(self, _RefPeer._release, node, self.ref)

    @staticmethod
    def _release(node: "Node", ref) -> None:
        if node._h:
            N.unref(node._h, ref)

    @property
    def handle(self) -> int:
        return self.ref.peer


class NodeRegion(Region):
    """A region registered (and published) through the node."""

    def deregister(self) -> None:
        if self._h:
            node = self._engine
            h, self._h = self._h, 0
            node._regions.pop(self.name, None)
            check(N.region_deregister(node.handle, h), node.last_error, f"deregister {self.name}")
            self._buf = None


@dataclass(frozen=True)
class PoolInfo:
    """A KV pool as published: geometry and member regions."""

    node: str
    name: str
    layout: str
    dtype: str
    block_bytes: int
    num_blocks: int
    layers: int
    kv: int
    block_tokens: int
    kv_heads: int
    head_dim: int
    shard: tuple
    tag: str
    regions: tuple


def _geom_info(g: N.KVGeom, node: str, name: str, regions: tuple) -> PoolInfo:
    return PoolInfo(node, name, _lib.text(N.kv_layout_name(g.layout)), _lib.text(g.dtype), g.block_bytes,
                    g.num_blocks, g.layers, g.kv, g.block_tokens, g.kv_heads, g.head_dim,
                    (g.shard_rank, g.shard_count), _lib.text(g.tag), regions)


class Pool:
    """A registered KV pool of this node."""

    def __init__(self, node: "Node", handle: int, name: str, regions: list):
        self._node = node
        self._h = handle
        self.name = name
        self.regions = regions

    @property
    def handle(self) -> int:
        if not self._h:
            raise InvalidArgumentError(1, f"pool {self.name!r} is deregistered", "pool")
        return self._h

    def info(self) -> PoolInfo:
        g = _lib.new_filled(N.KVGeom)
        N.pool_geom(self.handle, g)
        return _geom_info(g, self._node.node_id, self.name, tuple(r.name for r in self.regions))

    def deregister(self, regions: bool = True) -> None:
        """Unpublishes the pool, then (by default) its regions."""
        if self._h:
            h, self._h = self._h, 0
            self._node._pools.pop(self.name, None)
            check(N.pool_deregister(self._node.handle, h), self._node.last_error, f"deregister pool {self.name}")
            if regions:
                for r in self.regions:
                    r.deregister()


_DTYPES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "float8_e4m3fn": "fp8", "float8_e5m2": "fp8e5",
           "uint8": "u8", "int8": "i8", "float64": "fp64"}


def _shape(t) -> tuple:
    return tuple(int(d) for d in t.shape)


def _itemsize(t) -> int:
    return int(t.element_size()) if hasattr(t, "element_size") else int(t.itemsize)


def _dtype(t) -> str:
    s = str(t.dtype).replace("torch.", "")
    return _DTYPES.get(s, s)


def infer_geometry(tensors: Sequence[Any], layout: str, block_tokens: Optional[int] = None) -> dict:
    """Pool geometry from the tensors of a KV cache in a known layout:
    vllm_fa: L x [2, N, bs, heads, dim]; flashinfer: L x [N, 2, bs, heads, dim];
    block_major: 1 x [N, L, 2, bs, heads, dim]; mla: L x [N, bs, dim];
    sglang: 2L x [tokens, heads, dim] (K0, V0, K1, ...) with block_tokens."""
    if not tensors:
        raise InvalidArgumentError(1, "no tensors", "register_pool")
    t = tensors[0]
    sh, isz = _shape(t), _itemsize(t)
    if any(_shape(x) != sh for x in tensors):
        raise InvalidArgumentError(1, "tensors of a pool must have one shape", "register_pool")
    g = {"dtype": _dtype(t)}
    if layout == "vllm_fa" and len(sh) == 5 and sh[0] == 2:
        g.update(layers=len(tensors), kv=2, num_blocks=sh[1], block_tokens=sh[2], kv_heads=sh[3], head_dim=sh[4])
    elif layout == "flashinfer" and len(sh) == 5 and sh[1] == 2:
        g.update(layers=len(tensors), kv=2, num_blocks=sh[0], block_tokens=sh[2], kv_heads=sh[3], head_dim=sh[4])
    elif layout == "block_major" and len(tensors) == 1 and len(sh) == 6:
        g.update(layers=sh[1], kv=sh[2], num_blocks=sh[0], block_tokens=sh[3], kv_heads=sh[4], head_dim=sh[5])
    elif layout == "mla" and len(sh) == 3:
        g.update(layers=len(tensors), kv=1, num_blocks=sh[0], block_tokens=sh[1], kv_heads=1, head_dim=sh[2])
    elif layout == "sglang" and len(sh) == 3 and len(tensors) % 2 == 0 and block_tokens:
        if sh[0] % block_tokens:
            raise InvalidArgumentError(1, f"{sh[0]} tokens is not a multiple of block_tokens {block_tokens}",
                                       "register_pool")
        g.update(layers=len(tensors) // 2, kv=2, num_blocks=sh[0] // block_tokens, block_tokens=block_tokens,
                 kv_heads=sh[1], head_dim=sh[2])
    else:
        raise InvalidArgumentError(1, f"{len(tensors)} tensors of shape {list(sh)} do not fit layout {layout!r} "
                                      "(see help(xfer.node.infer_geometry))", "register_pool")
    g["block_bytes"] = g["block_tokens"] * g["kv_heads"] * g["head_dim"] * isz
    return g


class Node:
    """An xfer node embedded in this process.

    Args:
        node_id: this node's name in the fleet.
        redis_url: registry (None = $XFER_REDIS_URL, else redis://127.0.0.1:6379).
        secret: cluster secret for handshakes (None = none).
        transports: allowed transports, e.g. "tcp,ipc" (None = all usable).
        require: transports every transfer must use (None = any).
        listen: data-plane address; port: data port (0 = ephemeral).
        ttl_ms, heartbeat_ms, registry_timeout_ms, connect_timeout_ms,
        io_timeout_ms, default_deadline_ms: tuning (None = defaults).
        offline_ok: start while Redis is down and publish when it answers.

    Use as a context manager (or :meth:`close`): the node leaves the fleet.
    """

    def __init__(self, node_id: str, redis_url: Optional[str] = None, *, secret: Union[None, str, bytes] = None,
                 transports: Union[None, str, Sequence[str]] = None, require: Union[None, str, Sequence[str]] = None,
                 listen: str = "127.0.0.1", port: int = 0, advertise: Optional[str] = None,
                 ttl_ms: Optional[int] = None, heartbeat_ms: Optional[int] = None,
                 registry_timeout_ms: Optional[int] = None, connect_timeout_ms: Optional[int] = None,
                 io_timeout_ms: Optional[int] = None, default_deadline_ms: Optional[int] = None,
                 offline_ok: bool = True):
        cfg = _lib.new_filled(N.NodeConfig)
        N.config_init(cfg)

        def csv(v):
            return None if v is None else (v if isinstance(v, str) else ",".join(v)).encode()

        self._keep = [node_id.encode(), redis_url.encode() if redis_url else None, csv(transports), csv(require),
                      listen.encode(), advertise.encode() if advertise else None]
        cfg.node_id, cfg.redis_url, cfg.transports, cfg.require, cfg.listen_addr, cfg.advertise = self._keep
        if secret is not None:
            sb = secret.encode() if isinstance(secret, str) else bytes(secret)
            self._keep.append(sb)
            cfg.secret = ctypes.cast(ctypes.c_char_p(sb), ctypes.c_void_p)
            cfg.secret_len = len(sb)
        cfg.data_port = port
        cfg.offline_ok = offline_ok
        for name, val in (("ttl_ms", ttl_ms), ("heartbeat_ms", heartbeat_ms),
                          ("registry_timeout_ms", registry_timeout_ms), ("connect_timeout_ms", connect_timeout_ms),
                          ("io_timeout_ms", io_timeout_ms), ("default_deadline_ms", default_deadline_ms)):
            if val is not None:
                setattr(cfg, name, val)
        err = ctypes.c_int(0)
        h = N.new(cfg, ctypes.byref(err))
        if not h:
            check(-abs(err.value) or -20, lambda: f"node {node_id}: see the log above", "Node")
        self._h = h
        self.node_id = node_id
        self._regions: dict = {}
        self._pools: dict = {}
        self._transfers: "weakref.WeakSet[NodeTransfer]" = weakref.WeakSet()
        self._registry = Registry._borrowed(N.registry(h))
        self._eng = _BorrowedEngine(self, N.engine(h))

    # -- lifetime --------------------------------------------------------------
    @property
    def handle(self) -> int:
        if not self._h:
            raise InvalidArgumentError(1, "node is closed", "node")
        return self._h

    def last_error(self) -> str:
        return _lib.text(N.last_error(self._h)) if self._h else "node closed"

    def close(self) -> None:
        """Frees every transfer, leaves the fleet, stops the engine."""
        if not self._h:
            return
        for t in list(self._transfers):
            t.close()
        for r in self._regions.values():
            r._h = 0
        for p in self._pools.values():
            p._h = 0
        self._pools.clear()
        self._regions.clear()
        h, self._h = self._h, 0
        N.free(h)

    def __enter__(self) -> "Node":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def incarnation(self) -> int:
        return N.incarnation(self.handle)

    # -- memory ----------------------------------------------------------------
    def register(self, name: str, obj: Any, access: str = "rw") -> NodeRegion:
        """Registers and publishes memory (see :meth:`xfer.Engine.register`
        for what obj may be). Names starting with '_' stay private."""
        acc = access_mask(access)
        out = ctypes.c_void_p()
        if isinstance(obj, int) and not isinstance(obj, bool):
            buf = None
            rc = N.region_alloc(self.handle, name.encode(), obj, acc, ctypes.byref(out))
        else:
            buf = buffer_of(obj)
            if buf.readonly and acc & _lib.ACCESS_W:
                raise InvalidArgumentError(1, f"{name}: read-only memory cannot take access {access!r}", "register")
            kind, dev = (_lib.MEM_CUDA, cuda_device(buf)) if buf.cuda else (_lib.MEM_HOST, -1)
            rc = N.region_register(self.handle, name.encode(), ctypes.c_void_p(buf.ptr), buf.nbytes, kind, dev, acc,
                                   ctypes.byref(out))
        check(rc, self.last_error, f"register {name}")
        r = NodeRegion(self, out.value, name, buf)
        self._regions[name] = r
        return r

    def region(self, name: str) -> NodeRegion:
        try:
            return self._regions[name]
        except KeyError:
            raise error_for(-3, f"no region {name!r} registered here", "region") from None

    def deregister(self, region: Union[str, Region]) -> None:
        (self.region(region) if isinstance(region, str) else region).deregister()

    def register_pool(self, name: str, tensors: Sequence[Any], layout: str = "vllm_fa", *,
                      block_tokens: Optional[int] = None, tag: str = "", shard: tuple = (0, 1),
                      access: str = "rw", **geometry) -> Pool:
        """Registers a KV pool over tensors in a known layout (vllm_fa,
        flashinfer, block_major, sglang, mla; see :func:`infer_geometry`)
        and publishes it. Each tensor becomes region "<name>.<i>".
        Keyword geometry (block_bytes, num_blocks, layers, kv, ...) overrides
        what is inferred, e.g. for raw byte buffers."""
        if layout not in N.KV_LAYOUTS:
            raise InvalidArgumentError(1, f"layout {layout!r}: one of {', '.join(N.KV_LAYOUTS)}", "register_pool")
        g = {} if {"block_bytes", "num_blocks", "layers"} <= geometry.keys() else \
            infer_geometry(tensors, layout, block_tokens)
        g.update(geometry)
        geom = _lib.new_filled(N.KVGeom)
        geom.layout = N.KV_LAYOUTS[layout]
        geom.dtype = g.get("dtype", "").encode()
        for f in ("block_bytes", "num_blocks", "layers", "kv", "block_tokens", "kv_heads", "head_dim"):
            setattr(geom, f, int(g.get(f, 0) or 0))
        geom.kv = geom.kv or 2
        geom.shard_rank, geom.shard_count = shard
        geom.tag = tag.encode()
        regions = []
        try:
            for i, t in enumerate(tensors):
                regions.append(self.register(f"{name}.{i}", t, access))
            arr = (ctypes.c_void_p * len(regions))(*[r.handle for r in regions])
            out = ctypes.c_void_p()
            check(N.pool_register(self.handle, name.encode(), geom, arr, len(regions), ctypes.byref(out)),
                  self.last_error, f"register_pool {name}")
        except Exception:
            for r in regions:
                r.deregister()
            raise
        p = Pool(self, out.value, name, regions)
        self._pools[name] = p
        return p

    def pool(self, name: str) -> Pool:
        try:
            return self._pools[name]
        except KeyError:
            raise error_for(-3, f"no pool {name!r} registered here", "pool") from None

    # -- the fleet ---------------------------------------------------------------
    def peers(self) -> list[NodeInfo]:
        """Other live nodes, sorted by id."""
        return [n for n in self._registry.nodes() if n.node_id != self.node_id]

    def regions(self, node: Optional[str] = None) -> list[RegionInfo]:
        """Published regions of node (default: this one), sorted by name."""
        return self._registry.regions(node or self.node_id)

    def pools(self, node: Optional[str] = None) -> list[PoolInfo]:
        """Published pools of node (default: this one), sorted by name."""
        out = ctypes.POINTER(N.KVPoolDesc)()
        n = ctypes.c_size_t(0)
        who = node or self.node_id
        check(N.pool_list(self.handle, who.encode(), ctypes.byref(out), ctypes.byref(n)), self.last_error,
              f"pools of {who}")
        res = []
        try:
            for i in range(n.value):
                d = out[i]
                names = tuple(_lib.text(d.regions[j].value) for j in range(d.nregions))
                res.append(_geom_info(d.geom, _lib.text(d.node), _lib.text(d.name), names))
                N.pool_desc_clear(ctypes.byref(d))
        finally:
            _lib.libc.free(ctypes.cast(out, ctypes.c_void_p))
        return res

    # -- transfers -----------------------------------------------------------------
    def batch(self, require: Union[None, str, Sequence[str]] = None) -> NodeTransfer:
        """An empty named transfer to fill, then submit."""
        t = NodeTransfer(self, require)
        self._transfers.add(t)
        return t

    def _local(self, local) -> tuple:
        if isinstance(local, tuple):
            r, off = local
        else:
            r, off = local, 0
        if isinstance(r, str):
            r = self.region(r)
        return r, off

    def read(self, local, remote: str, nbytes: Optional[int] = None, *, deadline_ms: int = 0,
             require=None) -> NodeTransfer:
        """Reads remote "node/region[+off]" into local (a region, its name,
        or (region, offset)); nbytes defaults to the rest of the local region.
        Returns the submitted transfer."""
        r, off = self._local(local)
        n = r.nbytes - off if nbytes is None else nbytes
        return self.batch(require).read(r, off, remote, n).submit(deadline_ms)

    def write(self, local, remote: str, nbytes: Optional[int] = None, *, deadline_ms: int = 0,
              require=None) -> NodeTransfer:
        """Writes local (a region, its name, or (region, offset)) to remote
        "node/region[+off]". Returns the submitted transfer."""
        r, off = self._local(local)
        n = r.nbytes - off if nbytes is None else nbytes
        return self.batch(require).write(r, off, remote, n).submit(deadline_ms)


    def transfer_blocks(self, pool: Union[str, Pool], local_ids: Sequence[int], remote_pool: str,
                        remote_ids: Sequence[int], *, op: str = "write", layers=None, notify=None,
                        deadline_ms: int = 0, require=None) -> NodeTransfer:
        """Moves blocks local_ids[i] of pool to (op="write") or from
        (op="read") blocks remote_ids[i] of "node/pool", over layers (None =
        all, or a range). notify: a message the pool's node receives once
        these blocks are in place. Returns the submitted transfer."""
        p = self.pool(pool) if isinstance(pool, str) else pool
        t = self.batch(require)
        t.blocks(op, p, local_ids, remote_pool, remote_ids, layers)
        if notify is not None:  # after the blocks, to the pool's node
            t.notify(remote_pool.split("/", 1)[0], notify)
        return t.submit(deadline_ms)

    # -- notifications ---------------------------------------------------------------
    def notify(self, node: str, msg, deadline_ms: int = 0) -> None:
        """Sends a standalone notification to node (resolved by name) and
        waits until it is queued there (NoSpaceError: its queue is full)."""
        p = _RefPeer(self, node)
        b = _notify._bytes(msg)
        check(_lib.notify(self._eng.handle, p.handle, b, len(b), deadline_ms), self._eng.last_error, f"notify {node}")

    def poll_notifications(self, max_count: int = 64) -> list:
        """Queued notifications, oldest first (never blocks)."""
        return _notify.poll(self._eng, max_count)

    def notifications(self, timeout: Optional[float] = None):
        """Iterator over notifications as they arrive; ends after timeout
        seconds without one (None = never). ``async for`` works too."""
        return _Notifications(self._eng, timeout)

    # -- two-sided messages ------------------------------------------------------------
    def send(self, node: str, local, nbytes: Optional[int] = None, *, tag: int = 0,
             deadline_ms: int = 0, local_completion: bool = False) -> Transfer:
        """Sends local (a region, its name, or (region, offset)) as a
        message to node with tag; done once node received it (its recv), or
        once written with local_completion=True (Transfer.send says what
        that gives up)."""
        r, off = self._local(local)
        n = r.nbytes - off if nbytes is None else nbytes
        t = Transfer(self._eng)
        self._transfers.add(t)
        return t.send(r, off, n, _RefPeer(self, node), tag, local_completion).submit(deadline_ms)

    def recv(self, local, cap: Optional[int] = None, *, node: Optional[str] = None, tag: Optional[int] = None,
             deadline_ms: int = 0) -> Transfer:
        """Posts local (a region, its name, or (region, offset)) for one
        message from node (None = any node this one knows) with tag (None =
        any); t.item_bytes(0) and t.item_msg(0) tell what came."""
        r, off = self._local(local)
        n = r.nbytes - off if cap is None else cap
        t = Transfer(self._eng)
        self._transfers.add(t)
        return t.recv(r, off, n, _RefPeer(self, node) if node else None, tag).submit(deadline_ms)
