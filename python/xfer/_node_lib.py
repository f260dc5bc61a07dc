"""ctypes mirror of node/xfer_node.h (the node library inside libxfer.so)."""

from __future__ import annotations

import ctypes
from ctypes import POINTER, Structure, c_bool, c_char, c_char_p, c_int, c_size_t, c_uint, c_uint16, c_uint32, c_uint64, c_void_p

from ._lib import DTYPE_MAX, NAME_MAX, TAG_MAX, RegionDesc, lib

P = c_void_p

KV_LAYOUTS = {"block_major": 0, "vllm_fa": 1, "flashinfer": 2, "sglang": 3, "mla": 4}



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


class KVGeom(Structure):
    _fields_ = [
        ("layout", c_int),
        ("dtype", c_char * DTYPE_MAX),
        ("block_bytes", c_uint64),
        ("num_blocks", c_uint64),
        ("layers", c_uint32),
        ("kv", c_uint32),
        ("block_tokens", c_uint32),
        ("kv_heads", c_uint32),
        ("head_dim", c_uint32),
        ("shard_rank", c_uint32),
        ("shard_count", c_uint32),
        ("tag", c_char * TAG_MAX),
    ]


class KVPoolDesc(Structure):
    _fields_ = [
        ("node", c_char * NAME_MAX),
        ("name", c_char * NAME_MAX),
        ("geom", KVGeom),
        ("nregions", c_size_t),
        ("regions", POINTER(c_char * NAME_MAX)),
    ]


STRUCTS = {
    "struct xfer_node_config": NodeConfig,
    "struct xfer_node_ref": NodeRef,
    "struct xfer_kv_geom": KVGeom,
    "struct xfer_kv_pool_desc": KVPoolDesc,
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
batch_item_segments = _fn("xfer_node_batch_item_segments", c_size_t, P, c_size_t)
batch_reset = _fn("xfer_node_batch_reset", c_int, P)

resolve = _fn("xfer_node_resolve", c_int, P, c_char_p, c_char_p, c_uint, POINTER(NodeRef))
unref = _fn("xfer_node_unref", None, P, POINTER(NodeRef))
kv_layout_name = _fn("xfer_kv_layout_name", c_char_p, c_int)
kv_geom_regions = _fn("xfer_kv_geom_regions", c_size_t, POINTER(KVGeom))
kv_geom_match = _fn("xfer_kv_geom_match", c_int, POINTER(KVGeom), POINTER(KVGeom), c_char_p, c_size_t)
pool_register = _fn("xfer_node_pool_register", c_int, P, c_char_p, POINTER(KVGeom), POINTER(P), c_size_t, POINTER(P))
pool_deregister = _fn("xfer_node_pool_deregister", c_int, P, P)
pool_geom = _fn("xfer_kv_pool_geom", None, P, POINTER(KVGeom))
pool_desc_clear = _fn("xfer_kv_pool_desc_clear", None, POINTER(KVPoolDesc))
pool_lookup = _fn("xfer_node_pool_lookup", c_int, P, c_char_p, c_char_p, POINTER(KVPoolDesc))
pool_list = _fn("xfer_node_pool_list", c_int, P, c_char_p, POINTER(POINTER(KVPoolDesc)), POINTER(c_size_t))
batch_add_blocks = _fn("xfer_node_batch_add_blocks", c_int, P, c_int, P, POINTER(c_uint64), c_char_p,
                       POINTER(c_uint64), c_size_t, c_uint32, c_uint32)
batch_notify = _fn("xfer_node_batch_notify", c_int, P, c_char_p, c_char_p, c_size_t)
batch_notify_status = _fn("xfer_node_batch_notify_status", c_int, P, c_char_p)
