"""Memory adapters: what a Python object's registrable bytes are.

:func:`buffer_of` turns an object into a :class:`Buffer` (address, length,
host or CUDA device, read-only flag) and keeps a reference that holds the
memory alive while it is registered. Accepted, in this order:

* a torch tensor (CPU or CUDA), through ``data_ptr()`` and ``device``;
* anything with ``__cuda_array_interface__`` (CuPy, Numba, ...);
* anything with ``__array_interface__`` (NumPy arrays);
* anything with ``__dlpack__`` (DLPack capsule, CPU or CUDA);
* a writable buffer (``bytearray``, writable ``memoryview``, ``mmap``).

The memory must be contiguous: xfer moves byte ranges.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

from . import _lib
from .errors import InvalidArgumentError, NoDeviceError


@dataclass(frozen=True)
class Buffer:
    """Registrable memory: [ptr, ptr + nbytes) on host or a CUDA device."""

    ptr: int
    nbytes: int
    cuda: bool = False
    device: int = -1
    readonly: bool = False
    keepalive: Any = None


def _bad(msg: str) -> InvalidArgumentError:
    return InvalidArgumentError(1, msg, "register")


def _torch(t) -> Buffer:
    if not t.is_contiguous():
        raise _bad("torch tensor is not contiguous")
    n = t.numel() * t.element_size()
    dev = t.device
    if dev.type == "cuda":
        return Buffer(t.data_ptr(), n, True, dev.index if dev.index is not None else 0, False, t)
    if dev.type != "cpu":
        raise _bad(f"torch device {dev.type} is not supported (cpu or cuda)")
    return Buffer(t.data_ptr(), n, False, -1, False, t)


def _contig(shape, strides, itemsize) -> bool:
    if strides is None:
        return True
    want = itemsize
    for dim, st in zip(reversed(shape), reversed(strides)):
        if dim > 1 and st != want:
            return False
        want *= dim
    return True


def _typestr_size(typestr: str) -> int:
    return int(typestr[2:])


def _array_iface(obj, iface: dict, cuda: bool) -> Buffer:
    ptr, ro = iface["data"]
    shape = tuple(iface["shape"])
    size = _typestr_size(iface["typestr"])
    if not _contig(shape, iface.get("strides"), size):
        raise _bad("array is not C-contiguous")
    n = size
    for d in shape:
        n *= d
    return Buffer(ptr or 0, n, cuda, -1, bool(ro), obj)


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


_capsule_ptr = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_ptr.restype = ctypes.c_void_p
_capsule_ptr.argtypes = [ctypes.py_object, ctypes.c_char_p]

_DL_CPU, _DL_CUDA, _DL_CUDA_HOST = 1, 2, 3


def _dlpack(obj) -> Buffer:
    # The capsule stays unconsumed and is kept alive with the registration:
    # its destructor releases the producer's tensor when the region goes.
    cap = obj.__dlpack__()
    t = _DLTensor.from_address(_capsule_ptr(cap, b"dltensor"))
    item = (t.dtype.bits * t.dtype.lanes + 7) // 8
    shape = [t.shape[i] for i in range(t.ndim)]
    strides = [t.strides[i] * item for i in range(t.ndim)] if t.strides else None
    if not _contig(shape, strides, item):
        raise _bad("DLPack tensor is not contiguous")
    n = item
    for d in shape:
        n *= d
    ptr = (t.data or 0) + t.byte_offset
    kind = t.device.device_type
    if kind == _DL_CUDA:
        return Buffer(ptr, n, True, t.device.device_id, False, (obj, cap))
    if kind in (_DL_CPU, _DL_CUDA_HOST):
        return Buffer(ptr, n, False, -1, False, (obj, cap))
    raise _bad(f"DLPack device type {kind} is not supported (CPU or CUDA)")


def buffer_of(obj: Any) -> Buffer:
    """The registrable memory of obj (see the module doc for what is accepted;
    a Buffer passes through: raw memory by address, kept alive by the caller)."""
    if isinstance(obj, Buffer):
        return obj
    if hasattr(obj, "data_ptr") and hasattr(obj, "device") and hasattr(obj, "element_size"):
        return _torch(obj)
    iface = getattr(obj, "__cuda_array_interface__", None)
    if iface is not None:
        return _array_iface(obj, iface, True)
    iface = getattr(obj, "__array_interface__", None)
    if iface is not None:
        return _array_iface(obj, iface, False)
    if hasattr(obj, "__dlpack__"):
        return _dlpack(obj)
    try:
        mv = memoryview(obj)
    except TypeError:
        raise _bad(
            f"cannot register {type(obj).__name__}: give a NumPy array, a torch tensor, "
            "an object with __cuda_array_interface__ or __dlpack__, a writable buffer, or a size"
        ) from None
    if not mv.contiguous:
        raise _bad("buffer is not contiguous")
    if mv.readonly:
        raise _bad("buffer is read-only (use a bytearray or a NumPy array)")
    c = (ctypes.c_char * mv.nbytes).from_buffer(mv)
    return Buffer(ctypes.addressof(c), mv.nbytes, False, -1, False, (obj, mv, c))


def cuda_device(buf: Buffer) -> int:
    """The CUDA ordinal that owns buf's memory (asked of the CUDA runtime);
    NoDeviceError when it is not device memory or there is no CUDA device."""
    dev = _lib.kernels_ptr_device(ctypes.c_void_p(buf.ptr)) if buf.ptr else -1
    if dev < 0:
        raise NoDeviceError(15, f"0x{buf.ptr:x} is not CUDA device memory (or no CUDA device here)", "register")
    return dev


def host_view(ptr: int, nbytes: int) -> memoryview:
    """A writable memoryview of host memory at ptr (no copy; valid while the
    memory is)."""
    return memoryview((ctypes.c_char * nbytes).from_address(ptr)).cast("B")
