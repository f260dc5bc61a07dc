"""A thin module shaped like NIXL's Python agent, over xfer.

Code written against ``nixl._api`` (``nixl_agent``, ``nixl_agent_config``)
can switch by changing its import::

    from xfer.nixl import nixl_agent, nixl_agent_config

Descriptors are NIXL's: ``(address, length, device id)`` tuples (plus a meta
string for registration), Nx3 NumPy arrays, tensors or lists of tensors,
with a memory type "DRAM"/"VRAM" (or "cpu"/"cuda"). xfer addresses remote
memory by region and offset, so every remote descriptor is resolved against
the remote agent's registered regions (from its metadata) when prepared.

Metadata exchange works both ways:

* NIXL's: ``get_agent_metadata()`` bytes passed out of band to the other
  side's ``add_remote_agent(blob)``;
* xfer's: ``add_remote_agent("name")`` looks the agent up by node name in
  Redis (``nixl_agent_config(redis_url=...)``; each agent publishes itself
  and its registrations there).

Differences from NIXL that remain are listed in docs/python.md.
"""

from __future__ import annotations

import bisect
import ctypes
import struct
import threading
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Union

from . import _lib
from .engine import Engine, Peer, PeerInfo, Region, RegionInfo
from .errors import Error, InvalidArgumentError, NotFoundError, NotSupportedError, RangeError
from .memory import Buffer, buffer_of
from .registry import Registry
from .transfer import Transfer

NIXL_INIT_AGENT = ""
DEFAULT_COMM_PORT = 0
_MAGIC = b"XFERNIXL"
_MEMS = {"DRAM": False, "cpu": False, "VRAM": True, "cuda": True}
_OPS = ("READ", "WRITE")


class nixl_agent_config:
    """NIXL's agent configuration; the xfer-only fields are keyword-only.

    Args (NIXL's, accepted for compatibility): enable_prog_thread,
        enable_listen_thread, listen_port, capture_telemetry, num_threads,
        backends, sync_mode. xfer always runs its progress threads; the
        listener is the engine's data port (listen_port, 0 = ephemeral).
    Args (xfer's): redis_url (metadata by name through Redis), secret
        (handshake authentication), transports ("tcp,ipc,..."), listen_addr.
    """

    def __init__(self, enable_prog_thread: bool = True, enable_listen_thread: bool = False,
                 listen_port: int = DEFAULT_COMM_PORT, capture_telemetry: bool = False, num_threads: int = 0,
                 backends: Optional[list] = None, sync_mode: Any = None, *, redis_url: Optional[str] = None,
                 secret: Union[None, str, bytes] = None, transports: Optional[str] = None,
                 listen_addr: str = "127.0.0.1"):
        self.enable_pthread = enable_prog_thread
        self.enable_listen = enable_listen_thread
        self.port = listen_port
        self.capture_telemetry = capture_telemetry
        self.num_threads = num_threads
        self.backends = list(backends or ["XFER"])
        self.sync_mode = sync_mode
        self.redis_url = redis_url
        self.secret = secret
        self.transports = transports
        self.listen_addr = listen_addr


@dataclass
class _Desc:
    addr: int
    length: int
    dev: int
    meta: str = ""


class nixl_reg_dlist(list):
    """Registration descriptor list (NIXL's nixlRegDList): a list of
    (addr, len, dev, meta) with its memory type."""

    def __init__(self, mem_type: str, descs=(), keep: Any = None):
        super().__init__(descs)
        self.mem_type = mem_type
        self.keep = keep  # the tensors/arrays it was made from

    def getType(self) -> str:  # NIXL's accessor names
        return self.mem_type

    def descCount(self) -> int:
        return len(self)


class nixl_xfer_dlist(nixl_reg_dlist):
    """Transfer descriptor list (NIXL's nixlXferDList): (addr, len, dev)."""


class nixl_prepped_dlist_handle:
    """A descriptor list resolved to xfer regions: entries (region-or-info,
    offset, length) for one agent (local, or a remote one)."""

    def __init__(self, agent_name: str, peer: Optional[Peer], entries: list):
        self.agent_name = agent_name
        self.peer = peer
        self.entries = entries
        self._released = False

    def release(self) -> None:
        self._released = True
        self.entries = []


class nixl_xfer_handle:
    """A prepared transfer (an xfer Transfer not yet posted, or posted)."""

    def __init__(self, agent: "nixl_agent", transfer: Transfer, remote: str, notif: bytes):
        self._agent = agent
        self.transfer = transfer
        self.remote = remote
        self.notif = notif
        self._posted = False

    def release(self) -> None:
        """Cancels if still running, then frees."""
        self.transfer.close()


def _mem_cuda(mem_type: Optional[str]) -> bool:
    if mem_type not in _MEMS:
        raise InvalidArgumentError(1, f"memory type {mem_type!r}: DRAM, VRAM (or cpu, cuda)", "nixl")
    return _MEMS[mem_type]


def _is_tensor(x) -> bool:
    return hasattr(x, "data_ptr") and hasattr(x, "element_size")


def _tensor_desc(t) -> tuple:
    b = buffer_of(t)
    return (b.ptr, b.nbytes, b.device if b.cuda else 0)


class nixl_agent:
    """An xfer node with NIXL's agent interface (see the module doc)."""

    def __init__(self, agent_name: str, nixl_conf: Optional[nixl_agent_config] = None, instantiate_all: bool = False):
        conf = nixl_conf or nixl_agent_config()
        self.name = agent_name
        self.conf = conf
        self.engine = Engine(agent_name, listen=conf.listen_addr, port=conf.port or 0, secret=conf.secret,
                             transports=conf.transports)
        self.registry = Registry(conf.redis_url) if conf.redis_url else None
        if self.registry:
            self.registry.publish_node(self.engine)
        self.backends = {"XFER": 0}
        self.notifs: dict = {}
        self._lock = threading.Lock()
        self._seq = 0
        self._regions: list[Region] = []  # local registrations
        self._remote: dict[str, tuple] = {}  # name -> (Peer, [RegionInfo])

    # -- lifetime and backends -------------------------------------------------
    def close(self) -> None:
        if self.registry:
            self.registry.close()
            self.registry = None
        self.engine.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def get_plugin_list(self) -> list:
        return ["XFER"]

    def get_plugin_mem_types(self, backend: str) -> list:
        return ["DRAM", "VRAM"]

    get_backend_mem_types = get_plugin_mem_types

    def get_plugin_params(self, backend: str) -> dict:
        return {}

    get_backend_params = get_plugin_params

    def create_backend(self, backend: str, initParams: Optional[dict] = None) -> None:
        """xfer picks its transport per peer (ipc, rdma, tcpx, tcp): no-op."""

    # -- descriptor lists ------------------------------------------------------
    def get_reg_descs(self, descs, mem_type: Optional[str] = None) -> nixl_reg_dlist:
        """(addr, len, dev, meta) tuples + mem_type, an Nx3 array + mem_type,
        a tensor, or a list of tensors -> registration list."""
        if isinstance(descs, nixl_reg_dlist):
            return descs
        return self._dlist(nixl_reg_dlist, descs, mem_type, 4)

    def get_xfer_descs(self, descs, mem_type: Optional[str] = None) -> nixl_xfer_dlist:
        """(addr, len, dev) tuples + mem_type, an Nx3 array + mem_type, a
        tensor, or a list of tensors -> transfer list."""
        if isinstance(descs, nixl_xfer_dlist):
            return descs
        if isinstance(descs, nixl_reg_dlist):
            raise InvalidArgumentError(1, "a registration list was given for a transfer list", "get_xfer_descs")
        return self._dlist(nixl_xfer_dlist, descs, mem_type, 3)

    def _dlist(self, cls, descs, mem_type, width):
        if _is_tensor(descs):
            descs = [descs]
        if isinstance(descs, (list, tuple)) and descs and _is_tensor(descs[0]):
            cuda = {buffer_of(t).cuda for t in descs}
            if len(cuda) != 1:
                raise InvalidArgumentError(1, "tensors on different kinds of device", "descs")
            rows = [_tensor_desc(t) + (("",) if width == 4 else ()) for t in descs]
            return cls("VRAM" if cuda.pop() else "DRAM", rows, keep=descs)
        _mem_cuda(mem_type)
        if hasattr(descs, "ndim"):
            if descs.ndim != 2 or descs.shape[1] != 3:
                raise InvalidArgumentError(1, "an Nx3 array (address, length, device) is needed", "descs")
            rows = [tuple(int(v) for v in r) + (("",) if width == 4 else ()) for r in descs]
            return cls(mem_type, rows)
        rows = []
        for d in descs:
            d = tuple(d)
            if len(d) == 3 and width == 4:
                d = d + ("",)
            if len(d) != width:
                raise InvalidArgumentError(1, f"descriptor {d!r}: {width}-tuples needed", "descs")
            rows.append(d)
        return cls(mem_type, rows)

    # -- registration ------------------------------------------------------------
    def register_memory(self, reg_list, mem_type: Optional[str] = None, backends: Optional[list] = None):
        """Registers every descriptor as an xfer region (access rw) and
        publishes them when a registry is configured; returns the list for
        deregister_memory."""
        dl = self.get_reg_descs(reg_list, mem_type)
        cuda = _mem_cuda(dl.mem_type)
        made = []
        try:
            for addr, length, dev, _meta in dl:
                with self._lock:
                    self._seq += 1
                    name = f"nixl{self._seq}"
                buf = Buffer(int(addr), int(length), cuda, int(dev) if cuda else -1, False, dl.keep)
                made.append(self.engine.register(name, buf, "rw"))
        except Error:
            for r in made:
                r.deregister()
            raise
        self._regions.extend(made)
        dl.regions = made
        if self.registry:
            self.registry.publish_regions(made)
        return dl

    def deregister_memory(self, dereg_list, backends: Optional[list] = None) -> None:
        regions = getattr(dereg_list, "regions", None)
        if regions is None:
            raise InvalidArgumentError(1, "not a list returned by register_memory", "deregister_memory")
        for r in regions:
            if self.registry:
                self.registry.unpublish_region(r.name)
            self._regions.remove(r)
            r.deregister()
        dereg_list.regions = []

    # -- metadata ------------------------------------------------------------------
    def get_agent_metadata(self) -> bytes:
        """This agent (address, transports) and its registrations, as bytes
        for another agent's add_remote_agent()."""
        name = self.name.encode()
        peer = self.engine.info().to_bytes()
        regs = [r.info().to_bytes() for r in self._regions]
        head = _MAGIC + struct.pack("<HII", len(name), len(peer), len(regs))
        return head + name + peer + b"".join(regs)

    def add_remote_agent(self, metadata: Union[bytes, str]) -> str:
        """Loads a remote agent from its metadata bytes, or (a str) by name
        through Redis; connects to it. Returns its name."""
        if isinstance(metadata, str):
            if not self.registry:
                raise InvalidArgumentError(1, "add_remote_agent by name needs nixl_agent_config(redis_url=...)",
                                           "add_remote_agent")
            info = self.registry.node(metadata, fresh=True)
            regions = self.registry.regions(metadata)
            return self._add(info.peer, regions)
        mv = bytes(metadata)
        hl = len(_MAGIC) + 10
        if len(mv) < hl or not mv.startswith(_MAGIC):
            raise InvalidArgumentError(1, "not xfer agent metadata", "add_remote_agent")
        nl, pl, nr = struct.unpack_from("<HII", mv, len(_MAGIC))
        rs = ctypes.sizeof(_lib.RegionDesc)
        if len(mv) != hl + nl + pl + nr * rs:
            raise InvalidArgumentError(1, f"metadata of {len(mv)} bytes does not add up", "add_remote_agent")
        peer = PeerInfo.from_bytes(mv[hl + nl: hl + nl + pl])
        base = hl + nl + pl
        regions = [RegionInfo.from_bytes(mv[base + i * rs: base + (i + 1) * rs]) for i in range(nr)]
        return self._add(peer, regions)

    def _add(self, info: PeerInfo, regions: list) -> str:
        p = self.engine.add_peer(info)
        for r in regions:
            p.add_region(r)
        self._remote[info.node_id] = (p, sorted(regions, key=lambda r: r.addr))
        return info.node_id

    def remove_remote_agent(self, agent: str) -> None:
        p, _ = self._remote.pop(agent, (None, None))
        if p is None:
            raise NotFoundError(3, f"no remote agent {agent!r}", "remove_remote_agent")
        p.remove()

    def check_remote_metadata(self, agent: str, descs=None) -> bool:
        return agent in self._remote

    def make_connection(self, remote_agent: str, backends: Optional[list] = None) -> None:
        p, _ = self._remote_of(remote_agent)
        if p.transport is None:
            p.connect()

    def _remote_of(self, agent: str):
        try:
            return self._remote[agent]
        except KeyError:
            raise NotFoundError(3, f"unknown remote agent {agent!r} (add_remote_agent first)", "nixl") from None

    # -- preparing -------------------------------------------------------------
    @staticmethod
    def _resolve(dl, regions: list, starts: list, info_of, who: str) -> list:
        cuda = _mem_cuda(dl.mem_type)
        out = []
        for i, (addr, length, dev, *_rest) in enumerate(dl):
            hit = None
            # Candidates start at or below addr; registrations may overlap.
            for k in range(bisect.bisect_right(starts, addr) - 1, -1, -1):
                ri = info_of(regions[k])
                if ri.addr + ri.nbytes >= addr + length and ri.cuda == cuda and (not cuda or ri.device == dev):
                    hit = (regions[k], addr - ri.addr, length)
                    break
            if hit is None:
                raise RangeError(5, f"descriptor {i} (0x{addr:x}, {length}, dev {dev}) is not inside a region "
                                    f"registered by {who}", "prep_xfer_dlist")
            out.append(hit)
        return out

    def prep_xfer_dlist(self, agent_name: str, xfer_list, mem_type: Optional[str] = None,
                        backends: Optional[list] = None) -> nixl_prepped_dlist_handle:
        """Resolves a descriptor list to regions: agent_name "" or
        "NIXL_INIT_AGENT" for local memory, a remote agent's name for its."""
        dl = self.get_xfer_descs(xfer_list, mem_type)
        if agent_name in ("", "NIXL_INIT_AGENT"):
            infos = {id(r): r.info() for r in self._regions}
            regs = sorted(self._regions, key=lambda r: infos[id(r)].addr)
            ents = self._resolve(dl, regs, [infos[id(r)].addr for r in regs], lambda r: infos[id(r)], self.name)
            return nixl_prepped_dlist_handle(self.name, None, ents)
        if agent_name == self.name:
            raise NotSupportedError(13, "loopback transfers (to this agent's own memory) are not supported",
                                    "prep_xfer_dlist")
        p, regions = self._remote_of(agent_name)
        ents = self._resolve(dl, regions, [r.addr for r in regions], lambda r: r, agent_name)
        return nixl_prepped_dlist_handle(agent_name, p, ents)

    def release_dlist_handle(self, handle: nixl_prepped_dlist_handle) -> None:
        handle.release()

    def make_prepped_xfer(self, operation: str, local_xfer_side: nixl_prepped_dlist_handle,
                          local_indices: Sequence[int], remote_xfer_side: nixl_prepped_dlist_handle,
                          remote_indices: Sequence[int], notif_msg: bytes = b"", backends: Optional[list] = None,
                          skip_desc_merge: bool = False) -> nixl_xfer_handle:
        """A transfer of local entries[local_indices[i]] <-> remote
        entries[remote_indices[i]] (equal lengths); adjacent pairs merge."""
        if operation not in _OPS:
            raise InvalidArgumentError(1, f"operation {operation!r}: READ or WRITE", "make_prepped_xfer")
        if len(local_indices) != len(remote_indices):
            raise InvalidArgumentError(1, f"{len(local_indices)} local vs {len(remote_indices)} remote indices",
                                       "make_prepped_xfer")
        if remote_xfer_side.peer is None:
            raise InvalidArgumentError(1, "the remote side was prepared for the local agent", "make_prepped_xfer")
        pairs = []
        for li, ri in zip(local_indices, remote_indices):
            lr, lo, ll = local_xfer_side.entries[int(li)]
            rr, ro, rl = remote_xfer_side.entries[int(ri)]
            if ll != rl:
                raise InvalidArgumentError(1, f"local entry {li} has {ll} bytes, remote entry {ri} {rl}",
                                           "make_prepped_xfer")
            prev = pairs[-1] if pairs and not skip_desc_merge else None
            if prev and prev[0] is lr and prev[2] is rr and prev[1] + prev[4] == lo and prev[3] + prev[4] == ro:
                prev[4] += ll
            else:
                pairs.append([lr, lo, rr, ro, ll])
        t = self.engine.batch()
        add = t.read if operation == "READ" else t.write
        for lr, lo, rr, ro, n in pairs:
            add(lr, lo, remote_xfer_side.peer, rr, ro, n)
        h = nixl_xfer_handle(self, t, remote_xfer_side.agent_name, b"")
        h.peer = remote_xfer_side.peer
        if notif_msg:
            t.notify(h.peer, notif_msg)
        return h

    def initialize_xfer(self, operation: str, local_descs, remote_descs, remote_agent: str,
                        notif_msg: bytes = b"", backends: Optional[list] = None) -> nixl_xfer_handle:
        """One-shot form: prepares both lists and pairs them in order."""
        loc = self.prep_xfer_dlist("", local_descs)
        rem = self.prep_xfer_dlist(remote_agent, remote_descs)
        n = len(loc.entries)
        if n != len(rem.entries):
            raise InvalidArgumentError(1, f"{n} local vs {len(rem.entries)} remote descriptors", "initialize_xfer")
        return self.make_prepped_xfer(operation, loc, range(n), rem, range(n), notif_msg)

    # -- running -----------------------------------------------------------------
    @staticmethod
    def _state(t: Transfer) -> str:
        rc = _lib.batch_poll(t.handle)
        return "DONE" if rc == 0 else "PROC" if rc == -_lib.EINPROGRESS else "ERR"

    def transfer(self, handle: nixl_xfer_handle, notif_msg: bytes = b"") -> str:
        """Posts the transfer (again, once the last post finished): "DONE",
        "PROC" or "ERR". notif_msg reaches the remote agent once the data is
        in place (get_new_notifs there)."""
        if handle._posted and self._state(handle.transfer) == "PROC":
            return "ERR"  # still running: NIXL refuses a repost too
        try:
            if notif_msg:  # replaces the one given at creation
                handle.transfer.notify(handle.peer, notif_msg)
            handle.transfer.submit()
        except Error:
            return "ERR"
        handle._posted = True
        return self._state(handle.transfer)

    def check_xfer_state(self, handle: nixl_xfer_handle) -> str:
        """ "DONE", "PROC" or "ERR" (the reason: handle.transfer.status())."""
        return self._state(handle.transfer)

    def query_xfer_backend(self, handle: nixl_xfer_handle) -> str:
        p, _ = self._remote_of(handle.remote)
        return (p.transport or "none").upper()

    def release_xfer_handle(self, handle: nixl_xfer_handle) -> None:
        handle.release()

    # -- notifications -------------------------------------------------------------
    def get_new_notifs(self, backends: Optional[list] = None) -> dict:
        """Notifications received since the last call: {agent: [bytes, ...]}."""
        out: dict = {}
        while True:
            got = self.engine.poll_notifications(256)
            for n in got:
                out.setdefault(n.sender, []).append(n.data)
            if len(got) < 256:
                return out

    def update_notifs(self, backends: Optional[list] = None) -> dict:
        """Adds new notifications to self.notifs and returns it."""
        for k, v in self.get_new_notifs().items():
            self.notifs.setdefault(k, []).extend(v)
        return self.notifs

    def check_remote_xfer_done(self, remote_agent_name: str, lookup_tag: bytes, backends: Optional[list] = None,
                               tag_is_prefix: bool = True) -> bool:
        """True (and the message is taken out of self.notifs) when a
        notification from remote_agent_name starts with (or, tag_is_prefix
        False, contains) lookup_tag."""
        self.update_notifs()
        tag = lookup_tag.encode() if isinstance(lookup_tag, str) else bytes(lookup_tag)
        msgs = self.notifs.get(remote_agent_name, [])
        for i, m in enumerate(msgs):
            if (m.startswith(tag) if tag_is_prefix else tag in m):
                del msgs[i]
                return True
        return False

    def send_notif(self, remote_agent_name: str, notif_msg: bytes, backend: Optional[str] = None) -> None:
        """A standalone notification; waits until the remote agent queued it."""
        p, _ = self._remote_of(remote_agent_name)
        self.engine.notify(p, notif_msg)
