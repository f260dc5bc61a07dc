"""The engine level: one node's memory regions, its peers, and batches of
one-sided READ/WRITE items (engine/xfer.h).

An :class:`Engine` knows nothing of Redis: peers and their regions are
descriptors (:class:`PeerInfo`, :class:`RegionInfo`) that the caller obtains
from the other side, through :class:`xfer.Registry` or any channel
(:meth:`PeerInfo.to_bytes` / :meth:`PeerInfo.from_bytes`).
"""

from __future__ import annotations

import ctypes
import weakref
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional, Union

from . import _lib
from . import notify as _notify
from .errors import InvalidArgumentError, check, error_for
from .memory import Buffer, buffer_of, cuda_device, host_view
from .transfer import Transfer

_TRANSPORT_BITS = {
    "tcp": _lib.TRANSPORT_TCP,
    "ipc": _lib.TRANSPORT_IPC,
    "rdma": _lib.TRANSPORT_RDMA,
    "tcpx": _lib.TRANSPORT_TCPX,
}


def _b(s: Optional[str]) -> Optional[bytes]:
    return None if s is None else s.encode()


def transports_mask(transports: Union[None, str, Iterable[str]]) -> int:
    """"tcp,ipc" or ["tcp", "ipc"] -> the library's bit mask (0 for None)."""
    if transports is None:
        return 0
    if not isinstance(transports, str):
        transports = ",".join(transports)
    mask = ctypes.c_uint(0)
    rc = _lib.transports_parse(transports.encode(), ctypes.byref(mask))
    check(rc, lambda: f"unknown transport in {transports!r} (tcp, ipc, rdma, tcpx)", "transports")
    return mask.value


def transports_names(mask: int) -> list[str]:
    return [n for n, bit in _TRANSPORT_BITS.items() if mask & bit]


def access_mask(access: str) -> int:
    m = ctypes.c_uint(0)
    check(_lib.access_parse(access.encode(), ctypes.byref(m)), lambda: f"access {access!r}: r, w or rw", "access")
    return m.value


@dataclass(frozen=True)
class KVLayout:
    """Typed layout of a region (engine level): ``num_blocks`` blocks of
    ``max(layers, 1) * block_bytes`` bytes, block-major."""

    block_bytes: int
    num_blocks: int
    layers: int = 1
    dtype: str = ""
    tag: str = ""

    def _c(self) -> _lib.Layout:
        lay = _lib.Layout()
        lay.dtype = self.dtype.encode()
        lay.block_bytes = self.block_bytes
        lay.num_blocks = self.num_blocks
        lay.layers = self.layers
        lay.tag = self.tag.encode()
        return lay

    @staticmethod
    def _from(c: _lib.Layout) -> Optional["KVLayout"]:
        if not c.block_bytes:
            return None
        return KVLayout(c.block_bytes, c.num_blocks, c.layers, _lib.text(c.dtype), _lib.text(c.tag))


@dataclass(frozen=True)
class RegionInfo:
    """A region as its owner publishes it (what a peer needs to address it)."""

    name: str
    id: int
    gen: int
    cuda: bool
    device: int
    addr: int
    nbytes: int
    access: str
    layout: Optional[KVLayout]
    raw: bytes = field(repr=False, default=b"")

    @staticmethod
    def _from(d: _lib.RegionDesc) -> "RegionInfo":
        return RegionInfo(
            _lib.text(d.name),
            d.id,
            d.gen,
            d.kind == _lib.MEM_CUDA,
            d.device,
            d.addr,
            d.len,
            _lib.text(_lib.access_str(d.access)),
            KVLayout._from(d.layout),
            ctypes.string_at(ctypes.addressof(d), ctypes.sizeof(_lib.RegionDesc)),
        )

    def _c(self) -> _lib.RegionDesc:
        d = _lib.new_filled(_lib.RegionDesc)
        ctypes.memmove(ctypes.addressof(d), self.raw, min(len(self.raw), ctypes.sizeof(d)))
        return d

    def to_bytes(self) -> bytes:
        """Serialized descriptor, for exchange outside Redis."""
        return self.raw

    @staticmethod
    def from_bytes(raw: bytes) -> "RegionInfo":
        d = _lib.new_filled(_lib.RegionDesc)
        if len(raw) != ctypes.sizeof(_lib.RegionDesc):
            raise InvalidArgumentError(1, f"region descriptor of {len(raw)} bytes", "RegionInfo")
        ctypes.memmove(ctypes.addressof(d), raw, len(raw))
        return RegionInfo._from(d)


@dataclass(frozen=True)
class PeerInfo:
    """How to reach a node's engine (address, port, transports, ...)."""

    node_id: str
    addr: str
    port: int
    host_id: str
    transports: tuple
    incarnation: int
    raw: bytes = field(repr=False, default=b"")

    @staticmethod
    def _from(d: _lib.PeerDesc) -> "PeerInfo":
        return PeerInfo(
            _lib.text(d.node_id),
            _lib.text(d.addr),
            d.data_port,
            _lib.text(d.host_id),
            tuple(transports_names(d.transports)),
            d.incarnation,
            ctypes.string_at(ctypes.addressof(d), ctypes.sizeof(_lib.PeerDesc)),
        )

    def _c(self) -> _lib.PeerDesc:
        d = _lib.new_filled(_lib.PeerDesc)
        ctypes.memmove(ctypes.addressof(d), self.raw, min(len(self.raw), ctypes.sizeof(d)))
        return d

    def to_bytes(self) -> bytes:
        return self.raw

    @staticmethod
    def from_bytes(raw: bytes) -> "PeerInfo":
        if len(raw) != ctypes.sizeof(_lib.PeerDesc):
            raise InvalidArgumentError(1, f"peer descriptor of {len(raw)} bytes", "PeerInfo")
        d = _lib.new_filled(_lib.PeerDesc)
        ctypes.memmove(ctypes.addressof(d), raw, len(raw))
        return PeerInfo._from(d)


def _stats(s: _lib.Stats) -> dict:
    out = {n: getattr(s, n) for n, _ in _lib.Stats._fields_ if n != "lat_hist"}
    out["lat_hist"] = list(s.lat_hist)
    return out


class _Notifications:
    """What Engine.notifications() returns: iterable and async-iterable."""

    def __init__(self, engine: "Engine", timeout: Optional[float], peer=None):
        self._engine, self._timeout, self._peer = engine, timeout, peer

    def __iter__(self):
        return _notify.iterate(self._engine, self._timeout, self._peer)

    def __aiter__(self):
        return _notify.aiterate(self._engine)


class Region:
    """A registered region of this engine. Valid until :meth:`deregister` or
    the engine's close."""

    def __init__(self, engine: "Engine", handle: int, name: str, buf: Optional[Buffer]):
        self._engine = engine
        self._h = handle
        self.name = name
        self._buf = buf  # keeps the registered object alive

    @property
    def handle(self) -> int:
        if not self._h:
            raise InvalidArgumentError(1, f"region {self.name!r} is deregistered", "region")
        return self._h

    @property
    def ptr(self) -> int:
        return _lib.region_ptr(self.handle) or 0

    @property
    def nbytes(self) -> int:
        return _lib.region_len(self.handle)

    def info(self) -> RegionInfo:
        d = _lib.new_filled(_lib.RegionDesc)
        _lib.region_describe(self.handle, d)
        return RegionInfo._from(d)

    def set_layout(self, layout: KVLayout) -> None:
        lay = layout._c()
        check(_lib.region_set_layout(self.handle, ctypes.byref(lay)), self._engine.last_error, "set_layout")

    def view(self) -> memoryview:
        """The region's bytes (host regions only), without a copy."""
        if self.info().cuda:
            raise InvalidArgumentError(1, "a CUDA region has no host view", "view")
        return host_view(self.ptr, self.nbytes)

    def numpy(self, dtype: Any = "uint8"):
        """NumPy view of a host region (no copy)."""
        import numpy as np

        return np.frombuffer(self.view(), dtype=dtype)

    def deregister(self) -> None:
        """Removes the region; waits for target-side accesses in progress."""
        if self._h:
            h, self._h = self._h, 0
            self._engine._regions.pop(self.name, None)
            check(_lib.region_deregister(self._engine.handle, h), self._engine.last_error, "deregister")
            self._buf = None

    def __repr__(self) -> str:
        return f"<xfer.Region {self.name!r} {self.nbytes if self._h else 'deregistered'}>"


class Peer:
    """A remote node known to this engine (owned by the engine)."""

    def __init__(self, engine: "Engine", handle: int, node_id: str):
        self._engine = engine
        self._h = handle
        self.node_id = node_id

    @property
    def handle(self) -> int:
        if not self._h:
            raise InvalidArgumentError(1, f"peer {self.node_id!r} was removed", "peer")
        return self._h

    def add_region(self, info: RegionInfo) -> None:
        """Caches a remote region's descriptor (required before transfers to it)."""
        d = info._c()
        check(_lib.peer_region_add(self.handle, d), self._engine.last_error, "peer_region_add")

    def remove_region(self, info: RegionInfo) -> None:
        check(_lib.peer_region_remove(self.handle, info.id), self._engine.last_error, "peer_region_remove")

    def lookup(self, name: str) -> RegionInfo:
        d = _lib.new_filled(_lib.RegionDesc)
        check(_lib.peer_region_lookup(self.handle, name.encode(), d), self._engine.last_error, "lookup")
        return RegionInfo._from(d)

    def connect(self) -> None:
        """Drops the connection and connects anew (bounded by connect_timeout_ms)."""
        check(_lib.peer_connect(self.handle), self._engine.last_error, f"connect {self.node_id}")

    @property
    def transport(self) -> Optional[str]:
        """Transport in use ("tcp", "ipc", ...), None while unconnected."""
        names = transports_names(_lib.peer_transport(self.handle))
        return names[0] if names else None

    def info(self) -> PeerInfo:
        d = _lib.new_filled(_lib.PeerDesc)
        _lib.peer_describe(self.handle, d)
        return PeerInfo._from(d)

    def stats(self) -> dict:
        s = _lib.new_filled(_lib.Stats)
        _lib.peer_stats(self.handle, s)
        return _stats(s)

    def remove(self) -> None:
        """Fails the peer's in-flight work with ECONN and forgets it."""
        if self._h:
            h, self._h = self._h, 0
            self._engine._peers.pop(self.node_id, None)
            check(_lib.peer_remove(self._engine.handle, h), self._engine.last_error, "peer_remove")


class Engine:
    """One node's engine: regions, peers, batches.

    Args:
        node_id: this node's name (unique in the fleet).
        listen: data-plane address to listen on.
        port: data port (0 = ephemeral).
        secret: cluster secret for the handshake (None = no authentication).
        transports: allowed transports, e.g. "tcp,ipc" (None = all usable).
        connect_timeout_ms, io_timeout_ms, default_deadline_ms,
        sockets_per_peer, chunk_bytes: engine tuning (None = defaults).
        notify_queue_len: received notifications kept until polled.

    Use as a context manager, or call :meth:`close`.
    """

    def __init__(
        self,
        node_id: str,
        *,
        listen: str = "127.0.0.1",
        port: int = 0,
        secret: Union[None, str, bytes] = None,
        transports: Union[None, str, Iterable[str]] = None,
        host_id: Optional[str] = None,
        connect_timeout_ms: Optional[int] = None,
        io_timeout_ms: Optional[int] = None,
        default_deadline_ms: Optional[int] = None,
        sockets_per_peer: Optional[int] = None,
        chunk_bytes: Optional[int] = None,
        notify_queue_len: Optional[int] = None,
    ):
        cfg = _lib.new_filled(_lib.EngineConfig)
        _lib.engine_config_init(cfg)
        keep = [node_id.encode(), listen.encode(), _b(host_id)]
        cfg.node_id, cfg.listen_addr, cfg.host_id = keep
        cfg.data_port = port
        if secret is not None:
            sb = secret.encode() if isinstance(secret, str) else bytes(secret)
            keep.append(sb)
            cfg.secret = ctypes.cast(ctypes.c_char_p(sb), ctypes.c_void_p)
            cfg.secret_len = len(sb)
        cfg.transports = transports_mask(transports)
        for name, val in (
            ("connect_timeout_ms", connect_timeout_ms),
            ("io_timeout_ms", io_timeout_ms),
            ("default_deadline_ms", default_deadline_ms),
            ("sockets_per_peer", sockets_per_peer),
            ("chunk_bytes", chunk_bytes),
            ("notify_queue_len", notify_queue_len),
        ):
            if val is not None:
                setattr(cfg, name, val)
        err = ctypes.c_int(0)
        h = _lib.engine_new(cfg, ctypes.byref(err))
        if not h:
            check(-abs(err.value) or -12, lambda: "see the log above", f"engine {node_id}")
        self._h = h
        self.node_id = node_id
        self._regions: dict[str, Region] = {}
        self._peers: dict[str, Peer] = {}
        self._transfers: "weakref.WeakSet[Transfer]" = weakref.WeakSet()
        self._fin = weakref.finalize(self, _lib.engine_free, h)
        self._fin.atexit = False  # at exit the process goes anyway; transfers may outlive it

    # -- lifetime ----------------------------------------------------------
    @property
    def handle(self) -> int:
        if not self._h:
            raise InvalidArgumentError(1, "engine is closed", "engine")
        return self._h

    def close(self) -> None:
        """Cancels and frees every transfer, then stops the engine."""
        if not self._h:
            return
        for t in list(self._transfers):
            t.close()
        for r in self._regions.values():
            r._h = 0
        for p in self._peers.values():
            p._h = 0
        self._regions.clear()
        self._peers.clear()
        self._h = 0
        self._fin()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def last_error(self) -> str:
        return _lib.text(_lib.engine_last_error(self._h)) if self._h else "engine closed"

    # -- self --------------------------------------------------------------
    def info(self) -> PeerInfo:
        """This node as peers should see it (pass to their add_peer)."""
        d = _lib.new_filled(_lib.PeerDesc)
        _lib.engine_describe(self.handle, d)
        return PeerInfo._from(d)

    def stats(self) -> dict:
        s = _lib.new_filled(_lib.Stats)
        _lib.engine_stats(self.handle, s)
        return _stats(s)

    # -- regions -----------------------------------------------------------
    def register(self, name: str, obj: Any, access: str = "rw", layout: Optional[KVLayout] = None) -> Region:
        """Registers memory under name.

        obj: a NumPy array, a torch tensor (CPU/CUDA), an object with
        ``__cuda_array_interface__`` or ``__dlpack__``, a writable buffer, or
        an int (that many bytes, allocated by the engine from a memfd that
        same-host peers map). The object is kept alive while registered.
        access: what peers may do: "r", "w" or "rw".
        """
        acc = access_mask(access)
        out = ctypes.c_void_p()
        if isinstance(obj, int) and not isinstance(obj, bool):
            buf = None
            rc = _lib.region_alloc(self.handle, name.encode(), obj, acc, ctypes.byref(out))
        else:
            buf = buffer_of(obj)
            if buf.readonly and acc & _lib.ACCESS_W:
                raise InvalidArgumentError(1, f"{name}: read-only memory cannot take access {access!r}", "register")
            kind, device = _lib.MEM_HOST, -1
            if buf.cuda:  # the runtime says which GPU, and that it is one
                kind, device = _lib.MEM_CUDA, cuda_device(buf)
            rc = _lib.region_register(
                self.handle, name.encode(), ctypes.c_void_p(buf.ptr), buf.nbytes, kind, device, acc, ctypes.byref(out)
            )
        check(rc, self.last_error, f"register {name}")
        r = Region(self, out.value, name, buf)
        self._regions[name] = r
        if layout is not None:
            r.set_layout(layout)
        return r

    def region(self, name: str) -> Region:
        try:
            return self._regions[name]
        except KeyError:
            raise error_for(-3, f"no region {name!r} registered here", "region") from None

    @property
    def regions(self) -> dict:
        return dict(self._regions)

    # -- peers -------------------------------------------------------------
    def add_peer(self, info: PeerInfo) -> Peer:
        """Adds or updates a peer and connects to it (bounded by
        connect_timeout_ms; a failed connect is retried on the next add)."""
        d = info._c()
        out = ctypes.c_void_p()
        rc = _lib.peer_add(self.handle, d, ctypes.byref(out))
        if rc < 0 and not out.value:
            check(rc, self.last_error, f"add_peer {info.node_id}")
        p = self._peers.get(info.node_id)
        if p is None or p._h != out.value:
            p = Peer(self, out.value, info.node_id)
            self._peers[info.node_id] = p
        check(rc, self.last_error, f"add_peer {info.node_id}")
        return p

    def peer(self, node_id: str) -> Optional[Peer]:
        return self._peers.get(node_id)

    # -- notifications -----------------------------------------------------------
    def notify(self, peer: Peer, msg: Union[bytes, str], deadline_ms: int = 0) -> None:
        """Sends a standalone notification and waits until the peer queued
        it (NoSpaceError: its queue is full; retry later)."""
        b = _notify._bytes(msg)
        check(_lib.notify(self.handle, peer.handle, b, len(b), deadline_ms), self.last_error, f"notify {peer.node_id}")

    def poll_notifications(self, max_count: int = 64) -> list:
        """Queued notifications, oldest first (never blocks)."""
        return _notify.poll(self, max_count)

    def notifications(self, timeout: Optional[float] = None, peer=None):
        """Iterator over notifications as they arrive; ends after timeout
        seconds without one (None = never). While it waits, the iterating
        thread reads the connection of peer (a Peer or node id; None: the
        last sender) itself. ``async for`` works too (on the eventfd)."""
        return _Notifications(self, timeout, peer)

    def wait_notification(self, peer=None, timeout: Optional[float] = None) -> int:
        """Blocks until a notification is queued or timeout seconds passed
        (None = no limit); returns how many are queued (0: timeout). While
        it waits, this thread reads the connection of peer (a Peer or node
        id; None: the last sender) itself (xfer_notif_wait)."""
        return _notify.wait(self, peer, timeout)

    def notification_fd(self) -> int:
        """eventfd readable while notifications are queued."""
        return _lib.notif_fd(self.handle)

    @property
    def notifications_refused(self) -> int:
        """Notifications refused so far because the queue was full."""
        return _lib.notif_refused(self.handle)

    # -- transfers -----------------------------------------------------------
    def batch(self) -> Transfer:
        """An empty transfer (a batch of items) to fill, then submit."""
        t = Transfer(self)
        self._transfers.add(t)
        return t

    def read(self, local: Region, local_off: int, peer: Peer, remote: RegionInfo, remote_off: int,
             length: int, deadline_ms: int = 0) -> Transfer:
        """Submits one READ (remote -> local); returns the running transfer."""
        return self.batch().read(local, local_off, peer, remote, remote_off, length).submit(deadline_ms)

    def send(self, peer: Peer, local: Region, offset: int = 0, nbytes: Optional[int] = None, tag: int = 0,
             deadline_ms: int = 0, local_completion: bool = False) -> Transfer:
        """Submits one SEND of local [offset, +nbytes) (default: the rest of
        the region) to peer with tag; done once the peer received it, or
        once written with local_completion=True (Transfer.send says what
        that gives up)."""
        n = local.nbytes - offset if nbytes is None else nbytes
        return self.batch().send(local, offset, n, peer, tag, local_completion).submit(deadline_ms)

    def recv(self, local: Region, offset: int = 0, cap: Optional[int] = None, peer: Optional[Peer] = None,
             tag: Optional[int] = None, deadline_ms: int = 0) -> Transfer:
        """Submits one RECV into local [offset, +cap) from peer (None = any)
        with tag (None = any); t.item_bytes(0) and t.item_msg(0) tell what came."""
        n = local.nbytes - offset if cap is None else cap
        return self.batch().recv(local, offset, n, peer, tag).submit(deadline_ms)

    def write(self, local: Region, local_off: int, peer: Peer, remote: RegionInfo, remote_off: int,
              length: int, deadline_ms: int = 0) -> Transfer:
        """Submits one WRITE (local -> remote); returns the running transfer."""
        return self.batch().write(local, local_off, peer, remote, remote_off, length).submit(deadline_ms)
