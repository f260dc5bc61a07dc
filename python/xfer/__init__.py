"""xfer: one-sided READ/WRITE of registered memory between nodes.

Levels:

* :class:`Node`: an embedded node that publishes itself and its regions in
  Redis and moves bytes by name ("decode-0/kv+4096"), with notifications
  between nodes by name;
* :class:`Engine` (regions, peers, transfers) with descriptors exchanged by
  the caller, and :class:`Registry` to publish and find them in Redis;
* every transfer is a :class:`Transfer`: ``.wait(timeout)``, ``.done()``,
  ``.status()``, ``.cancel()``, ``await transfer``.

Errors raise :class:`Error` subclasses carrying the ``XFER_E*`` code
(``err.code``) and the library's reason (``err.reason``).

The shared library is found through $XFER_LIB, the source tree's build/,
the dynamic linker (``make install`` + ldconfig), or /usr/local/lib.
"""

from .engine import Engine, KVLayout, Peer, PeerInfo, Region, RegionInfo, transports_mask
from .errors import *  # noqa: F401,F403  (the Error classes and Code)
from .errors import Code, Error, error_for
from .memory import Buffer, buffer_of
from .node import Node, NodeRegion, NodeTransfer
from .notify import Notification
from .registry import NodeInfo, Registry
from .transfer import ItemStatus, Transfer
from ._lib import lib_path

__version__ = "0.1.0"

__all__ = [
    "Engine", "KVLayout", "Peer", "PeerInfo", "Region", "RegionInfo", "Registry", "NodeInfo",
    "Transfer", "ItemStatus", "Buffer", "buffer_of", "Code", "Error", "error_for",
    "transports_mask", "lib_path", "Node", "NodeRegion", "NodeTransfer", "Notification",
]
