"""ctypes mirror of node/xfer_node.h (the node library inside libxfer.so)."""

from __future__ import annotations

import ctypes
from ctypes import POINTER, Structure, c_bool, c_char, c_char_p, c_int, c_size_t, c_uint, c_uint16, c_uint32, c_uint64, c_void_p

from ._lib import DTYPE_MAX, NAME_MAX, TAG_MAX, RegionDesc, lib

P = c_void_p



class NodeConfig(Structure):
    _fields_ = [
        ("node_id", c_char_p),
        ("redis_url", c_char_p),
        ("secret", c_void_p),
        ("secret_len", c_size_t),
        ("transports", c_char_p),
        ("require", c_char_p),
        ("listen_addr", c_char_p),
        ("data_port", c_uint16),
        ("advertise", c_char_p),
        ("ctrl_port", c_uint16),
        ("ttl_ms", c_int),
        ("heartbeat_ms", c_int),
        ("registry_timeout_ms", c_int),
        ("connect_timeout_ms", c_int),
        ("io_timeout_ms", c_int),
        ("default_deadline_ms", c_int),
        ("offline_ok", c_bool),
        ("on_event", c_void_p),
        ("event_arg", c_void_p),
        ("sockets_per_peer", c_int),
        ("progress_threads", c_int),
        ("chunk_bytes", c_size_t),
        ("busy_poll_us", c_int),
    ]


class NodeRef(Structure):
    _fields_ = [
        ("peer", c_void_p),
        ("rd", RegionDesc),
        ("node", c_char * NAME_MAX),
        ("incarnation", c_uint64),
    ]


STRUCTS = {
    "struct xfer_node_config": NodeConfig,
    "struct xfer_node_ref": NodeRef,
}


def _fn(name, restype, *argtypes):
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


config_init = _fn("xfer_node_config_init", None, POINTER(NodeConfig))
new = _fn("xfer_node_new", P, POINTER(NodeConfig), POINTER(c_int))
free = _fn("xfer_node_free", None, P)
last_error = _fn("xfer_node_last_error", c_char_p, P)
node_id = _fn("xfer_node_id", c_char_p, P)
incarnation = _fn("xfer_node_incarnation", c_uint64, P)
engine = _fn("xfer_node_engine", P, P)
registry = _fn("xfer_node_registry", P, P)
region_register = _fn("xfer_node_region_register", c_int, P, c_char_p, c_void_p, c_size_t, c_int, c_int, c_uint,
                      POINTER(P))
region_alloc = _fn("xfer_node_region_alloc", c_int, P, c_char_p, c_size_t, c_uint, POINTER(P))
region_publish = _fn("xfer_node_region_publish", c_int, P, P)
region_deregister = _fn("xfer_node_region_deregister", c_int, P, P)

batch_new = _fn("xfer_node_batch_new", P, P, POINTER(c_int))
batch_free = _fn("xfer_node_batch_free", None, P)
batch_require = _fn("xfer_node_batch_require", c_int, P, c_uint)
batch_add = _fn("xfer_node_batch_add", c_int, P, c_int, P, c_uint64, c_char_p, c_uint64)
batch_count = _fn("xfer_node_batch_count", c_size_t, P)
batch_submit = _fn("xfer_node_batch_submit", c_int, P, c_int)
batch_poll = _fn("xfer_node_batch_poll", c_int, P)
batch_wait = _fn("xfer_node_batch_wait", c_int, P, c_int)
batch_cancel = _fn("xfer_node_batch_cancel", c_int, P)
batch_item_status = _fn("xfer_node_batch_item_status", c_int, P, c_size_t)
batch_item_error = _fn("xfer_node_batch_item_error", c_char_p, P, c_size_t)
batch_item_transport = _fn("xfer_node_batch_item_transport", c_uint, P, c_size_t)
batch_reset = _fn("xfer_node_batch_reset", c_int, P)

resolve = _fn("xfer_node_resolve", c_int, P, c_char_p, c_char_p, c_uint, POINTER(NodeRef))
unref = _fn("xfer_node_unref", None, P, POINTER(NodeRef))
