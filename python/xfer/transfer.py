"""A transfer: a batch of READ/WRITE items, submitted once, then waited for,
polled, cancelled or awaited (asyncio, through the batch's eventfd)."""

from __future__ import annotations

import asyncio
import ctypes
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Sequence

from . import _lib
from .errors import Code, InvalidArgumentError, check, error_for

if TYPE_CHECKING:
    from .engine import Engine, Peer, Region, RegionInfo


@dataclass(frozen=True)
class ItemStatus:
    """One item's outcome: code OK, EINPROGRESS or the error; reason text."""

    index: int
    code: Code
    reason: str

    @property
    def ok(self) -> bool:
        return self.code == Code.OK


_tls = threading.local()


def _scratch_item() -> _lib.Item:
    """This thread's item buffer: xfer_batch_add copies the item, so one
    per thread serves every transfer (no allocation per call)."""
    it = getattr(_tls, "item", None)
    if it is None:
        it = _tls.item = _lib.new_filled(_lib.Item)
    return it


def _timeout_ms(timeout: Optional[float]) -> int:
    return -1 if timeout is None else max(0, int(timeout * 1000))


class _EngineBatchOps:
    """The C functions a Transfer drives (a node transfer has its own)."""

    free = staticmethod(_lib.batch_free)
    count = staticmethod(_lib.batch_count)
    reset = staticmethod(_lib.batch_reset)
    submit = staticmethod(_lib.batch_submit)
    poll = staticmethod(_lib.batch_poll)
    wait = staticmethod(_lib.batch_wait)
    cancel = staticmethod(_lib.batch_cancel)
    item_status = staticmethod(_lib.batch_item_status)
    item_error = staticmethod(_lib.batch_item_error)


class Transfer:
    """A batch of items. Fill with :meth:`read`/:meth:`write`/
    :meth:`read_blocks`/:meth:`write_blocks`, then :meth:`submit`; then
    :meth:`wait`, :meth:`done`, :meth:`status`, :meth:`cancel`, or
    ``await transfer``. Free with :meth:`close` (or let it be collected;
    freeing a running transfer cancels it)."""

    _c = _EngineBatchOps

    def __init__(self, engine: "Engine"):
        err = ctypes.c_int(0)
        h = _lib.batch_new(engine.handle, ctypes.byref(err))
        if not h:
            check(-abs(err.value) or -2, engine.last_error, "batch_new")
        self._init(engine, h)

    def _init(self, owner, h: int) -> None:
        self._engine = owner
        self._h = h
        self._refs: list = []  # regions and peers the items use
        self._submitted = False

    @property
    def handle(self) -> int:
        if not self._h:
            raise InvalidArgumentError(1, "transfer is closed", "transfer")
        return self._h

    def close(self) -> None:
        """Cancels if running, then frees."""
        if self._h:
            h, self._h = self._h, 0
            if self._engine._h:  # a closed engine took its batches with it
                self._c.free(h)
            self._refs.clear()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self) -> "Transfer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- filling -------------------------------------------------------------
    def _add(self, op: int, local: "Region", local_off: int, peer: "Peer", remote: "RegionInfo",
             remote_off: int, length: int) -> "Transfer":
        it = _scratch_item()
        it.op = op
        it.local = local.handle
        it.local_off = local_off
        it.peer = peer.handle
        it.remote_id = remote.id
        it.remote_gen = remote.gen
        it.remote_off = remote_off
        it.len = length
        check(_lib.batch_add(self.handle, it), self._engine.last_error, "add")
        self._refs.append((local, peer))
        return self

    def read(self, local: "Region", local_off: int, peer: "Peer", remote: "RegionInfo", remote_off: int,
             length: int) -> "Transfer":
        """Adds a READ: remote [remote_off, +length) -> local [local_off, ...)."""
        return self._add(_lib.OP_READ, local, local_off, peer, remote, remote_off, length)

    def write(self, local: "Region", local_off: int, peer: "Peer", remote: "RegionInfo", remote_off: int,
              length: int) -> "Transfer":
        """Adds a WRITE: local [local_off, +length) -> remote [remote_off, ...)."""
        return self._add(_lib.OP_WRITE, local, local_off, peer, remote, remote_off, length)

    def _blocks(self, op: int, local: "Region", local_ids: Sequence[int], peer: "Peer", remote: "RegionInfo",
                remote_ids: Sequence[int]) -> int:
        if len(local_ids) != len(remote_ids):
            raise InvalidArgumentError(1, f"{len(local_ids)} local vs {len(remote_ids)} remote block ids", "blocks")
        n = len(local_ids)
        la = (ctypes.c_uint64 * n)(*local_ids)
        ra = (ctypes.c_uint64 * n)(*remote_ids)
        rc = _lib.batch_add_blocks(self.handle, op, local.handle, la, peer.handle, remote.id, remote.gen, ra, n)
        check(rc, self._engine.last_error, "add_blocks")
        self._refs.append((local, peer))
        return rc

    def read_blocks(self, local: "Region", local_ids: Sequence[int], peer: "Peer", remote: "RegionInfo",
                    remote_ids: Sequence[int]) -> int:
        """Adds READs of blocks remote_ids[i] -> local_ids[i] between regions
        with typed layouts; returns the number of items (runs) added."""
        return self._blocks(_lib.OP_READ, local, local_ids, peer, remote, remote_ids)

    def write_blocks(self, local: "Region", local_ids: Sequence[int], peer: "Peer", remote: "RegionInfo",
                     remote_ids: Sequence[int]) -> int:
        """Adds WRITEs of blocks local_ids[i] -> remote_ids[i]."""
        return self._blocks(_lib.OP_WRITE, local, local_ids, peer, remote, remote_ids)

    def send(self, local: "Region", local_off: int, nbytes: int, peer: "Peer", tag: int = 0,
             local_completion: bool = False) -> "Transfer":
        """Adds a SEND (two-sided message) of local [local_off, +nbytes) to
        peer with tag; it completes when a matching RECV took it. Both sides
        must know each other as peers (the receiver reads the bytes).
        local_completion=True (XFER_SEND_LOCAL, host memory of at most 8 KiB):
        it completes once its frame was written, like UCX's eager send; the
        sender is then not told of truncation, a full receive queue or a
        peer that died after the frame left (docs/notify.md)."""
        flags = _lib.SEND_LOCAL if local_completion else 0
        rc = _lib.batch_add_send_flags(self.handle, local.handle, local_off, nbytes, peer.handle, tag, flags)
        check(rc, self._engine.last_error, "send")
        self._refs.append((local, peer))
        return self

    def recv(self, local: "Region", local_off: int, cap: int, peer: Optional["Peer"] = None,
             tag: Optional[int] = None) -> "Transfer":
        """Adds a RECV: posts local [local_off, +cap) for a message from peer
        (None = any) with tag (None = any). After completion,
        item_bytes(i) is the length received and item_msg(i) its (tag,
        sender). A longer message fails both sides with TruncatedError."""
        rc = _lib.batch_add_recv(self.handle, local.handle, local_off, cap, peer.handle if peer else None,
                                 _lib.MSG_TAG_ANY if tag is None else tag)
        check(rc, self._engine.last_error, "recv")
        self._refs.append((local, peer))
        return self

    def item_bytes(self, i: int) -> int:
        """Bytes received by RECV item i (else the item's length)."""
        return _lib.batch_item_bytes(self.handle, i)

    def item_msg(self, i: int) -> tuple:
        """(tag, sender node id) of finished RECV item i."""
        tag = ctypes.c_uint64(0)
        who = ctypes.create_string_buffer(_lib.NAME_MAX)
        check(_lib.batch_item_msg(self.handle, i, ctypes.byref(tag), who), self._engine.last_error, "item_msg")
        return tag.value, _lib.text(who.value)

    def notify(self, peer: "Peer", msg) -> "Transfer":
        """Binds a notification for peer: sent once every item of this
        transfer addressed to peer has ended, so on arrival their data is in
        place (failed items are named in it). One per peer; before submit."""
        b = msg.encode() if isinstance(msg, str) else bytes(msg)
        check(_lib.batch_notify(self.handle, peer.handle, b, len(b)), self._engine.last_error, "notify")
        self._refs.append(peer)
        return self

    def notify_status(self, peer: "Peer") -> Code:
        """OK once peer queued the bound notification, EINPROGRESS before,
        or the error (ENOSPC: its queue was full; ENOENT: none bound)."""
        st = _lib.batch_notify_status(self.handle, peer.handle)
        return Code(-st) if -st in Code._value2member_map_ else Code.EIO

    def __len__(self) -> int:
        return self._c.count(self.handle)

    def reset(self) -> None:
        """Clears the items so the transfer can be filled again (not while running)."""
        check(self._c.reset(self.handle), self._engine.last_error, "reset")
        self._refs.clear()
        self._submitted = False

    # -- running -------------------------------------------------------------
    def submit(self, deadline_ms: int = 0) -> "Transfer":
        """Starts the transfer; past deadline_ms (0 = engine default) it is
        cancelled and fails with TimeoutError."""
        check(self._c.submit(self.handle, deadline_ms), self._engine.last_error, "submit")
        self._submitted = True
        return self

    def _raise_for(self, rc: int) -> None:
        n = len(self)
        for i in range(n):
            st = self._c.item_status(self._h, i)
            if st < 0 and st != -_lib.EINPROGRESS:
                raise error_for(st, _lib.text(self._c.item_error(self._h, i)), f"item {i} of {n}")
        raise error_for(rc, self._engine.last_error(), "transfer")

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Waits up to timeout seconds (None = until the deadline). Returns
        True when every item succeeded, False if still running at timeout;
        raises the first failed item's Error (its code and reason)."""
        rc = self._c.wait(self.handle, _timeout_ms(timeout))
        if rc == 0:
            return True
        if rc == -_lib.EINPROGRESS:
            return False
        self._raise_for(rc)
        return False

    def done(self) -> bool:
        """True once finished (succeeded or failed); never blocks."""
        return self._c.poll(self.handle) != -_lib.EINPROGRESS

    def result(self) -> None:
        """Raises the failure of a finished transfer, if any."""
        rc = self._c.poll(self.handle)
        if rc == 0:
            return
        if rc == -_lib.EINPROGRESS:
            raise error_for(rc, "transfer still running", "result")
        self._raise_for(rc)

    def status(self) -> list[ItemStatus]:
        """Every item's status (OK, EINPROGRESS or its error and reason)."""
        out = []
        for i in range(len(self)):
            st = self._c.item_status(self._h, i)
            why = _lib.text(self._c.item_error(self._h, i)) if st < 0 else ""
            out.append(ItemStatus(i, Code(-st) if -st in Code._value2member_map_ else Code.EIO, why))
        return out

    def cancel(self) -> None:
        """Ends unfinished items with ECANCELED; returns once no transport
        touches the local memory any more."""
        check(self._c.cancel(self.handle), self._engine.last_error, "cancel")

    def fileno(self) -> int:
        """An eventfd that becomes readable when the transfer finishes."""
        return _lib.batch_fd(self.handle)

    async def wait_async(self) -> None:
        """Awaits completion without blocking the loop (``loop.add_reader``
        on the batch's eventfd); raises the failure like :meth:`wait`.
        Cancelling the awaiting task cancels the transfer."""
        if not self._submitted:
            raise InvalidArgumentError(1, "transfer not submitted", "await")
        loop = asyncio.get_running_loop()
        fd = self.fileno()
        while not self.done():
            fut = loop.create_future()
            loop.add_reader(fd, lambda: fut.done() or fut.set_result(None))
            try:
                await fut
            except asyncio.CancelledError:
                self.cancel()
                raise
            finally:
                loop.remove_reader(fd)
        self.result()

    def __await__(self):
        return self.wait_async().__await__()

    def __repr__(self) -> str:
        if not self._h:
            return "<xfer.Transfer closed>"
        state = "new" if not self._submitted else ("done" if self.done() else "running")
        return f"<xfer.Transfer {len(self)} items {state}>"
