"""The node level: an embedded xfer node (node/xfer_node.h) that publishes
itself and its memory in Redis and moves bytes by name
("decode-3/kv.L0+4096"), and exchanges notifications with other nodes."""

from __future__ import annotations

import asyncio
import ctypes
import weakref
from typing import Any, Optional, Sequence, Union

from . import _lib
from . import _node_lib as N
from . import notify as _notify
from .engine import Region, RegionInfo, _Notifications, access_mask, transports_mask, transports_names
from .errors import InvalidArgumentError, check, error_for
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

    # -- the fleet ---------------------------------------------------------------
    def peers(self) -> list[NodeInfo]:
        """Other live nodes, sorted by id."""
        return [n for n in self._registry.nodes() if n.node_id != self.node_id]

    def regions(self, node: Optional[str] = None) -> list[RegionInfo]:
        """Published regions of node (default: this one), sorted by name."""
        return self._registry.regions(node or self.node_id)

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
             deadline_ms: int = 0) -> Transfer:
        """Sends local (a region, its name, or (region, offset)) as a
        message to node with tag; done once node received it (its recv)."""
        r, off = self._local(local)
        n = r.nbytes - off if nbytes is None else nbytes
        t = Transfer(self._eng)
        self._transfers.add(t)
        return t.send(r, off, n, _RefPeer(self, node), tag).submit(deadline_ms)

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
