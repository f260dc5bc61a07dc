"""Notifications (engine/xfer.h, docs/notify.md): short messages that land
in the receiving engine's bounded queue; bound to a transfer, one is sent
only after every item of that transfer addressed to its peer has ended."""

from __future__ import annotations

import asyncio
import ctypes
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, AsyncIterator, Iterator, Optional

from . import _lib
from .errors import Code, check

if TYPE_CHECKING:
    from .engine import Engine


@dataclass(frozen=True)
class Notification:
    """A received notification.

    sender: node id of the sender (as its handshake proved it);
    incarnation, seq: the sender process and its message number;
    bound: sent after a transfer (else standalone); status: OK or the first
    failed item's code; n_items/n_failed: items of that transfer addressed
    to this node and how many failed; failed: (item index, code) of failed
    items (at most 4096 listed); data: the message.
    """

    sender: str
    incarnation: int
    seq: int
    bound: bool
    status: Code
    n_items: int
    n_failed: int
    failed: tuple
    data: bytes


def _code(c: int) -> Code:
    return Code(-c) if -c in Code._value2member_map_ else Code.EIO


def _take(n) -> Notification:
    d = n.contents
    failed = tuple((d.failed[i].index, _code(d.failed[i].status)) for i in range(d.n_listed))
    out = Notification(_lib.text(d.node_id), d.incarnation, d.seq, bool(d.bound), _code(d.status), d.n_items,
                       d.n_failed, failed, ctypes.string_at(d.data, d.len) if d.len else b"")
    _lib.notif_free(n)
    return out


def poll(engine: "Engine", max_count: int = 64) -> list:
    """Takes up to max_count queued notifications, oldest first (never blocks)."""
    arr = (ctypes.POINTER(_lib.Notif) * max_count)()
    n = check(_lib.notif_poll(engine.handle, arr, max_count), engine.last_error, "notifications")
    return [_take(arr[i]) for i in range(n)]


def wait(engine: "Engine", peer=None, timeout: Optional[float] = None) -> int:
    """xfer_notif_wait: blocks until a notification is queued (returns how
    many) or timeout seconds passed (0; None = no limit). Meanwhile this
    thread reads the connection peer's messages arrive on itself (peer: a
    Peer, a node id, or None for the sender of the last message)."""
    node = getattr(peer, "node_id", peer)
    node = node.encode() if isinstance(node, str) else node
    end = None if timeout is None else time.monotonic() + timeout
    while True:  # slices of at most 0.5 s: Ctrl-C gets through between them
        left = 0.5 if end is None else min(0.5, max(0.0, end - time.monotonic()))
        n = check(_lib.notif_wait(engine.handle, node, int(left * 1000)), engine.last_error, "notifications")
        if n > 0 or (end is not None and time.monotonic() >= end):
            return n


def iterate(engine: "Engine", timeout: Optional[float], peer=None) -> Iterator[Notification]:
    """Yields notifications as they arrive; stops after timeout seconds
    without one (None = never). Waits in xfer_notif_wait (see wait())."""
    while True:
        got = poll(engine)
        yield from got
        if not got and wait(engine, peer, timeout) == 0:
            return


async def aiterate(engine: "Engine") -> AsyncIterator[Notification]:
    """Async iterator over arriving notifications (the queue's eventfd with
    loop.add_reader; nothing polls). Runs until the consumer stops."""
    loop = asyncio.get_running_loop()
    fd = _lib.notif_fd(engine.handle)
    while True:
        got = poll(engine)
        for n in got:
            yield n
        if got:
            continue
        fut = loop.create_future()
        loop.add_reader(fd, lambda: fut.done() or fut.set_result(None))
        try:
            await fut
        finally:
            loop.remove_reader(fd)


def _bytes(msg) -> bytes:
    return msg.encode() if isinstance(msg, str) else bytes(msg)
