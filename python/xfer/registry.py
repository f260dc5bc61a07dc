"""The registry: nodes and regions in Redis (registry/xfer_registry.h).

A :class:`Registry` publishes this process's node and regions (with a TTL
refreshed by a heartbeat thread) and looks other nodes up, from a cache kept
current by Redis events.
"""

from __future__ import annotations

import ctypes
import os
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Optional

from . import _lib
from .engine import PeerInfo, RegionInfo
from .errors import InvalidArgumentError, check

if TYPE_CHECKING:
    from .engine import Engine, Peer, Region


@dataclass(frozen=True)
class NodeInfo:
    """A node as published: its engine descriptor plus service fields."""

    node_id: str
    peer: PeerInfo
    host: str
    pid: int
    version: str
    gpus: str
    heartbeat_ms: int


def _node(d: _lib.NodeDesc) -> NodeInfo:
    return NodeInfo(
        _lib.text(d.peer.node_id),
        PeerInfo._from(d.peer),
        _lib.text(d.host),
        d.pid,
        _lib.text(d.version),
        _lib.text(d.gpus),
        d.heartbeat_ms,
    )


class Registry:
    """A Redis registry handle.

    Args:
        url: redis://[user:pw@]host[:port][/db] or unix:///path (None =
            $XFER_REDIS_URL, else redis://127.0.0.1:6379).
        ttl_ms: TTL of this node's keys (a dead node leaves after it).
        timeout_ms: connect and per-command timeout.
        start_offline: succeed while Redis is down and connect later.
        watch: run the registry's thread (heartbeat, events, reconnects).
    """

    def __init__(
        self,
        url: Optional[str] = None,
        *,
        ttl_ms: Optional[int] = None,
        timeout_ms: Optional[int] = None,
        heartbeat_ms: Optional[int] = None,
        start_offline: bool = False,
        watch: bool = True,
    ):
        cfg = _lib.new_filled(_lib.RegistryConfig)
        _lib.registry_config_init(cfg)
        self._url = url.encode() if url else None
        cfg.url = self._url
        for name, val in (("ttl_ms", ttl_ms), ("timeout_ms", timeout_ms), ("heartbeat_ms", heartbeat_ms)):
            if val is not None:
                setattr(cfg, name, val)
        cfg.start_offline = start_offline
        err = ctypes.c_int(0)
        h = _lib.registry_new(cfg, ctypes.byref(err))
        if not h:
            check(-abs(err.value) or -20, lambda: f"cannot use Redis at {url or 'the default URL'}", "registry")
        self._h = h
        if watch:
            rc = _lib.registry_thread_start(h)
            if rc < 0:
                _lib.registry_free(h)
                self._h = 0
                check(rc, lambda: "registry thread", "registry")

    @classmethod
    def _borrowed(cls, handle: int) -> "Registry":
        """A view of a registry owned by someone else (a node): close() only
        forgets it."""
        r = cls.__new__(cls)
        r._h = handle
        r._owned = False
        return r

    @property
    def handle(self) -> int:
        if not self._h:
            raise InvalidArgumentError(1, "registry is closed", "registry")
        return self._h

    def last_error(self) -> str:
        return _lib.text(_lib.registry_last_error(self._h)) if self._h else "registry closed"

    def close(self, unpublish: bool = True) -> None:
        """Unpublishes this node (if it published one) and disconnects."""
        if self._h and not getattr(self, "_owned", True):
            self._h = 0
        if self._h:
            if unpublish:
                _lib.registry_unpublish_node(self._h)
            h, self._h = self._h, 0
            _lib.registry_free(h)

    def __enter__(self) -> "Registry":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def connected(self) -> bool:
        return bool(self._h) and _lib.registry_connected(self._h)

    # -- publisher -------------------------------------------------------------
    def publish_node(self, engine: "Engine") -> None:
        """Publishes engine's node ("join")."""
        d = _lib.new_filled(_lib.NodeDesc)
        _lib.engine_describe(engine.handle, ctypes.byref(d.peer))
        d.host = socket.gethostname().encode()[: _lib.REG_HOST_MAX - 1]
        d.pid = os.getpid()
        d.version = b"py-0.1.0"
        check(_lib.registry_publish_node(self.handle, d), self.last_error, "publish_node")

    def publish_regions(self, regions: Iterable["Region"]) -> None:
        """Publishes (or republishes) regions of the own node."""
        regions = list(regions)
        arr = (_lib.RegionDesc * max(1, len(regions)))()
        for i, r in enumerate(regions):
            _lib.region_describe(r.handle, ctypes.byref(arr[i]))
        check(_lib.registry_publish_regions(self.handle, arr, len(regions)), self.last_error, "publish_regions")

    def unpublish_region(self, name: str) -> None:
        check(_lib.registry_unpublish_region(self.handle, name.encode()), self.last_error, "unpublish_region")

    def unpublish_node(self) -> None:
        check(_lib.registry_unpublish_node(self.handle), self.last_error, "unpublish_node")

    # -- reader ----------------------------------------------------------------
    def node(self, node_id: str, fresh: bool = False) -> NodeInfo:
        """A node by id (from the cache unless fresh); NotFoundError if unknown."""
        d = _lib.new_filled(_lib.NodeDesc)
        fn = _lib.registry_fetch_node if fresh else _lib.registry_lookup_node
        check(fn(self.handle, node_id.encode(), d), self.last_error, f"node {node_id}")
        return _node(d)

    def region(self, node_id: str, name: str) -> RegionInfo:
        """A region of a node by name; NotFoundError if unknown."""
        d = _lib.new_filled(_lib.RegionDesc)
        rc = _lib.registry_lookup_region(self.handle, node_id.encode(), name.encode(), d)
        check(rc, self.last_error, f"region {node_id}/{name}")
        return RegionInfo._from(d)

    def nodes(self) -> list[NodeInfo]:
        """Live nodes, sorted by id."""
        out = ctypes.POINTER(_lib.NodeDesc)()
        n = ctypes.c_size_t(0)
        check(_lib.registry_list_nodes(self.handle, ctypes.byref(out), ctypes.byref(n)), self.last_error, "nodes")
        try:
            return [_node(out[i]) for i in range(n.value)]
        finally:
            _lib.libc.free(ctypes.cast(out, ctypes.c_void_p))

    def regions(self, node_id: str) -> list[RegionInfo]:
        """Regions of a node, sorted by name."""
        out = ctypes.POINTER(_lib.RegionDesc)()
        n = ctypes.c_size_t(0)
        rc = _lib.registry_list_regions(self.handle, node_id.encode(), ctypes.byref(out), ctypes.byref(n))
        check(rc, self.last_error, f"regions of {node_id}")
        try:
            return [RegionInfo._from(out[i]) for i in range(n.value)]
        finally:
            _lib.libc.free(ctypes.cast(out, ctypes.c_void_p))

    def clear_cache(self) -> None:
        _lib.registry_cache_clear(self.handle)

    # -- engine glue -------------------------------------------------------------
    def connect(self, engine: "Engine", node_id: str) -> "Peer":
        """Looks node_id up and adds it to engine as a peer (connecting)."""
        return engine.add_peer(self.node(node_id).peer)

    def resolve(self, peer: "Peer", name: str) -> RegionInfo:
        """Looks up region name of peer's node and caches it on the peer, so
        transfers can address it."""
        info = self.region(peer.node_id, name)
        peer.add_region(info)
        return info
