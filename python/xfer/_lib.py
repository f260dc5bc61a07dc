"""Loading libxfer.so and the ctypes mirror of its public structs.

Only this module knows C layouts. Structs that the library fills are
allocated with slack (see :func:`new_filled`) so a field appended on the C
side cannot make the library write past a Python-owned buffer;
``tests/test_abi.py`` compiles a C program that prints the real sizes and
offsets and compares them with the ones here.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from ctypes import (
    POINTER,
    Structure,
    c_bool,
    c_char,
    c_char_p,
    c_int,
    c_size_t,
    c_uint,
    c_uint16,
    c_uint32,
    c_uint64,
    c_void_p,
)
from pathlib import Path

NAME_MAX = 64
ADDR_MAX = 64
HOSTID_MAX = 64
DTYPE_MAX = 16
TAG_MAX = 128
BLOB_MAX = 256
NICS_MAX = 1024
LAT_BUCKETS = 16
REG_HOST_MAX = 256
REG_VERSION_MAX = 32

TRANSPORT_TCP, TRANSPORT_IPC, TRANSPORT_RDMA, TRANSPORT_TCPX = 1, 2, 4, 8
MEM_HOST, MEM_CUDA = 0, 1
ACCESS_R, ACCESS_W = 1, 2
OP_READ, OP_WRITE = 1, 2
EINPROGRESS = 14
NOTIFY_MAX = 65536
MSG_TAG_ANY = (1 << 64) - 1
SEND_LOCAL = 1  # XFER_SEND_LOCAL


class Layout(Structure):
    _fields_ = [
        ("dtype", c_char * DTYPE_MAX),
        ("block_bytes", c_uint64),
        ("num_blocks", c_uint64),
        ("layers", c_uint32),
        ("tag", c_char * TAG_MAX),
    ]


class RegionDesc(Structure):
    _fields_ = [
        ("name", c_char * NAME_MAX),
        ("id", c_uint32),
        ("gen", c_uint32),
        ("kind", c_int),
        ("device", c_int),
        ("addr", c_uint64),
        ("len", c_uint64),
        ("access", c_uint),
        ("layout", Layout),
        ("ipc", c_char * BLOB_MAX),
        ("rkeys", c_char * BLOB_MAX),
    ]


class PeerDesc(Structure):
    _fields_ = [
        ("node_id", c_char * NAME_MAX),
        ("addr", c_char * ADDR_MAX),
        ("data_port", c_uint16),
        ("host_id", c_char * HOSTID_MAX),
        ("transports", c_uint),
        ("incarnation", c_uint64),
        ("nics", c_char * NICS_MAX),
        ("tcpx_port", c_uint16),
    ]


class EngineConfig(Structure):
    _fields_ = [
        ("node_id", c_char_p),
        ("listen_addr", c_char_p),
        ("data_port", c_uint16),
        ("secret", c_void_p),
        ("secret_len", c_size_t),
        ("host_id", c_char_p),
        ("transports", c_uint),
        ("sockets_per_peer", c_int),
        ("chunk_bytes", c_size_t),
        ("progress_threads", c_int),
        ("connect_timeout_ms", c_int),
        ("io_timeout_ms", c_int),
        ("default_deadline_ms", c_int),
        ("notify_queue_len", c_int),
        ("busy_poll_us", c_int),
    ]


class Item(Structure):
    _fields_ = [
        ("op", c_int),
        ("local", c_void_p),
        ("local_off", c_uint64),
        ("peer", c_void_p),
        ("remote_id", c_uint32),
        ("remote_gen", c_uint32),
        ("remote_off", c_uint64),
        ("len", c_uint64),
    ]


class NotifFail(Structure):
    _fields_ = [("index", c_uint32), ("status", ctypes.c_int32)]


class Notif(Structure):
    _fields_ = [
        ("node_id", c_char * NAME_MAX),
        ("incarnation", c_uint64),
        ("seq", c_uint64),
        ("bound", c_bool),
        ("status", c_int),
        ("n_items", c_uint32),
        ("n_failed", c_uint32),
        ("n_listed", c_uint32),
        ("failed", POINTER(NotifFail)),
        ("len", c_size_t),
        ("data", POINTER(ctypes.c_uint8)),
    ]


class Stats(Structure):
    _fields_ = [
        ("ops_read", c_uint64),
        ("ops_write", c_uint64),
        ("bytes_read", c_uint64),
        ("bytes_written", c_uint64),
        ("errors", c_uint64),
        ("served_ops", c_uint64),
        ("served_bytes", c_uint64),
        ("served_errors", c_uint64),
        ("lat_us_sum", c_uint64),
        ("lat_hist", c_uint64 * LAT_BUCKETS),
    ]


class NodeDesc(Structure):
    _fields_ = [
        ("peer", PeerDesc),
        ("host", c_char * REG_HOST_MAX),
        ("ctrl_port", c_uint16),
        ("gpus", c_char * BLOB_MAX),
        ("pid", c_uint32),
        ("version", c_char * REG_VERSION_MAX),
        ("started_ms", c_uint64),
        ("heartbeat_ms", c_uint64),
    ]


class RegistryConfig(Structure):
    _fields_ = [
        ("url", c_char_p),
        ("timeout_ms", c_int),
        ("ttl_ms", c_int),
        ("heartbeat_ms", c_int),
        ("reap_ms", c_int),
        ("backoff_min_ms", c_int),
        ("backoff_max_ms", c_int),
        ("cache_max_age_ms", c_int),
        ("start_offline", c_bool),
    ]


# Every struct above, by its C name (the ABI test walks this).
STRUCTS = {
    "struct xfer_layout": Layout,
    "struct xfer_region_desc": RegionDesc,
    "struct xfer_peer_desc": PeerDesc,
    "struct xfer_engine_config": EngineConfig,
    "struct xfer_item": Item,
    "struct xfer_stats": Stats,
    "struct xfer_notif_fail": NotifFail,
    "struct xfer_notif": Notif,
    "struct xfer_node_desc": NodeDesc,
    "struct xfer_registry_config": RegistryConfig,
}

_SLACK = 4096


def new_filled(cls):
    """A zeroed cls instance inside a buffer with room to spare, for structs
    the library writes (config_init, describe, lookups)."""
    buf = (c_char * (ctypes.sizeof(cls) + _SLACK))()
    obj = cls.from_buffer(buf)
    obj._xfer_buf = buf  # keeps the buffer alive with the view
    return obj


def _candidates():
    env = os.environ.get("XFER_LIB")
    if env:
        yield env
        return
    here = Path(__file__).resolve().parent
    # A package imported from a source checkout (python/xfer/): that
    # checkout's build, so tests and examples use the tree they belong to.
    for b in (os.environ.get("B", "build"), "build"):
        p = here.parent.parent / b / "lib" / "libxfer.so"
        if p.exists():
            yield str(p)
    found = ctypes.util.find_library("xfer")
    if found:
        yield found
    for d in ("/usr/local/lib", "/usr/lib", "/usr/lib/x86_64-linux-gnu"):
        yield f"{d}/libxfer.so.0"


def _load():
    errors = []
    for path in _candidates():
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            errors.append(f"{path}: {e}")
    raise ImportError(
        "xfer: cannot load libxfer.so (build it with `make` and `make install`, "
        "or set XFER_LIB=/path/to/libxfer.so); tried: " + "; ".join(errors or ["nothing"])
    )


lib, lib_path = _load()

P = c_void_p


def _fn(name, restype, *argtypes):
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


strerror = _fn("xfer_strerror", c_char_p, c_int)
transports_parse = _fn("xfer_transports_parse", c_int, c_char_p, POINTER(c_uint))
transports_format = _fn("xfer_transports_format", c_int, c_uint, c_char_p, c_size_t)
access_parse = _fn("xfer_access_parse", c_int, c_char_p, POINTER(c_uint))
access_str = _fn("xfer_access_str", c_char_p, c_uint)

engine_config_init = _fn("xfer_engine_config_init", None, POINTER(EngineConfig))
engine_new = _fn("xfer_engine_new", P, POINTER(EngineConfig), POINTER(c_int))
engine_free = _fn("xfer_engine_free", None, P)
engine_last_error = _fn("xfer_engine_last_error", c_char_p, P)
engine_describe = _fn("xfer_engine_describe", None, P, POINTER(PeerDesc))
engine_stats = _fn("xfer_engine_stats", None, P, POINTER(Stats))

region_register = _fn(
    "xfer_region_register", c_int, P, c_char_p, c_void_p, c_size_t, c_int, c_int, c_uint, POINTER(P)
)
region_alloc = _fn("xfer_region_alloc", c_int, P, c_char_p, c_size_t, c_uint, POINTER(P))
region_deregister = _fn("xfer_region_deregister", c_int, P, P)
region_set_layout = _fn("xfer_region_set_layout", c_int, P, POINTER(Layout))
region_ptr = _fn("xfer_region_ptr", c_void_p, P)
region_len = _fn("xfer_region_len", c_size_t, P)
region_describe = _fn("xfer_region_describe", None, P, POINTER(RegionDesc))

peer_add = _fn("xfer_peer_add", c_int, P, POINTER(PeerDesc), POINTER(P))
peer_connect = _fn("xfer_peer_connect", c_int, P)
peer_find = _fn("xfer_peer_find", P, P, c_char_p)
peer_remove = _fn("xfer_peer_remove", c_int, P, P)
peer_region_add = _fn("xfer_peer_region_add", c_int, P, POINTER(RegionDesc))
peer_region_remove = _fn("xfer_peer_region_remove", c_int, P, c_uint32)
peer_region_lookup = _fn("xfer_peer_region_lookup", c_int, P, c_char_p, POINTER(RegionDesc))
peer_describe = _fn("xfer_peer_describe", None, P, POINTER(PeerDesc))
peer_transport = _fn("xfer_peer_transport", c_uint, P)
peer_stats = _fn("xfer_peer_stats", None, P, POINTER(Stats))

batch_new = _fn("xfer_batch_new", P, P, POINTER(c_int))
batch_free = _fn("xfer_batch_free", None, P)
batch_add = _fn("xfer_batch_add", c_int, P, POINTER(Item))
batch_count = _fn("xfer_batch_count", c_size_t, P)
batch_submit = _fn("xfer_batch_submit", c_int, P, c_int)
batch_poll = _fn("xfer_batch_poll", c_int, P)
batch_wait = _fn("xfer_batch_wait", c_int, P, c_int)
batch_cancel = _fn("xfer_batch_cancel", c_int, P)
batch_fd = _fn("xfer_batch_fd", c_int, P)
batch_item_status = _fn("xfer_batch_item_status", c_int, P, c_size_t)
batch_item_error = _fn("xfer_batch_item_error", c_char_p, P, c_size_t)
batch_reset = _fn("xfer_batch_reset", c_int, P)
batch_add_blocks = _fn(
    "xfer_batch_add_blocks",
    c_int,
    P,
    c_int,
    P,
    POINTER(c_uint64),
    P,
    c_uint32,
    c_uint32,
    POINTER(c_uint64),
    c_size_t,
)
batch_notify = _fn("xfer_batch_notify", c_int, P, P, c_char_p, c_size_t)
batch_notify_status = _fn("xfer_batch_notify_status", c_int, P, P)
notify = _fn("xfer_notify", c_int, P, P, c_char_p, c_size_t, c_int)
notif_poll = _fn("xfer_notif_poll", c_int, P, POINTER(POINTER(Notif)), c_size_t)
notif_free = _fn("xfer_notif_free", None, POINTER(Notif))
notif_fd = _fn("xfer_notif_fd", c_int, P)
notif_wait = _fn("xfer_notif_wait", c_int, P, c_char_p, c_int)
notif_pending = _fn("xfer_notif_pending", c_size_t, P)
notif_refused = _fn("xfer_notif_refused", c_uint64, P)
batch_add_send = _fn("xfer_batch_add_send", c_int, P, P, c_uint64, c_uint64, P, c_uint64)
batch_add_send_flags = _fn("xfer_batch_add_send_flags", c_int, P, P, c_uint64, c_uint64, P, c_uint64, c_uint)
batch_add_recv = _fn("xfer_batch_add_recv", c_int, P, P, c_uint64, c_uint64, P, c_uint64)
batch_item_bytes = _fn("xfer_batch_item_bytes", c_uint64, P, c_size_t)
batch_item_msg = _fn("xfer_batch_item_msg", c_int, P, c_size_t, POINTER(c_uint64), c_char_p)
layout_block_size = _fn("xfer_layout_block_size", c_uint64, POINTER(Layout))
layouts_match = _fn("xfer_layouts_match", c_int, POINTER(Layout), POINTER(Layout), c_char_p, c_size_t)
kernels_ptr_device = _fn("xfer_kernels_ptr_device", c_int, c_void_p)

registry_config_init = _fn("xfer_registry_config_init", None, POINTER(RegistryConfig))
registry_new = _fn("xfer_registry_new", P, POINTER(RegistryConfig), POINTER(c_int))
registry_free = _fn("xfer_registry_free", None, P)
registry_last_error = _fn("xfer_registry_last_error", c_char_p, P)
registry_connected = _fn("xfer_registry_connected", c_bool, P)
registry_publish_node = _fn("xfer_registry_publish_node", c_int, P, POINTER(NodeDesc))
registry_own_node = _fn("xfer_registry_own_node", c_int, P, POINTER(NodeDesc))
registry_publish_regions = _fn("xfer_registry_publish_regions", c_int, P, POINTER(RegionDesc), c_size_t)
registry_unpublish_region = _fn("xfer_registry_unpublish_region", c_int, P, c_char_p)
registry_unpublish_node = _fn("xfer_registry_unpublish_node", c_int, P)
registry_lookup_node = _fn("xfer_registry_lookup_node", c_int, P, c_char_p, POINTER(NodeDesc))
registry_lookup_region = _fn(
    "xfer_registry_lookup_region", c_int, P, c_char_p, c_char_p, POINTER(RegionDesc)
)
registry_fetch_node = _fn("xfer_registry_fetch_node", c_int, P, c_char_p, POINTER(NodeDesc))
registry_list_nodes = _fn(
    "xfer_registry_list_nodes", c_int, P, POINTER(POINTER(NodeDesc)), POINTER(c_size_t)
)
registry_list_regions = _fn(
    "xfer_registry_list_regions", c_int, P, c_char_p, POINTER(POINTER(RegionDesc)), POINTER(c_size_t)
)
registry_cache_clear = _fn("xfer_registry_cache_clear", None, P)
registry_thread_start = _fn("xfer_registry_thread_start", c_int, P)
registry_thread_stop = _fn("xfer_registry_thread_stop", None, P)

libc = ctypes.CDLL(None)
libc.free.argtypes = [c_void_p]
libc.free.restype = None


def text(b: bytes | None) -> str:
    return b.decode("utf-8", "replace") if b else ""
