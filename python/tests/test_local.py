"""In-process checks: errors, memory adapters, registration rules, and the
Python-level leak check (10,000 transfers, flat RSS and fd count)."""

import gc
import os

import numpy as np
import pytest

import xfer
from xfer import memory


def test_every_code_has_a_class():
    for code in xfer.Code:
        if code == xfer.Code.OK:
            continue
        e = xfer.error_for(-code.value, "because", "what")
        assert isinstance(e, xfer.Error) and e.code == code and e.reason == "because"
        assert type(e) is not xfer.Error, code
        assert f"XFER_{code.name}" in str(e) and "because" in str(e)
    assert isinstance(xfer.error_for(-7), TimeoutError)
    assert isinstance(xfer.error_for(-9), ConnectionError)
    assert isinstance(xfer.error_for(-1), ValueError)
    assert isinstance(xfer.error_for(-3), LookupError)


@pytest.fixture
def eng():
    with xfer.Engine("local-py", transports="tcp") as e:
        yield e


def test_adapters(eng):
    a = np.arange(1024, dtype=np.float32)
    r = eng.register("np", a)
    assert r.ptr == a.ctypes.data and r.nbytes == a.nbytes
    b = bytearray(b"x" * 100)
    r = eng.register("ba", b)
    assert r.nbytes == 100 and bytes(r.view()[:3]) == b"xxx"
    r.view()[0] = ord("y")
    assert b[0] == ord("y")  # the same memory, no copy
    d = np.ones((4, 8), dtype=np.float16)
    buf = memory.buffer_of(d.__dlpack__ and _Dl(d))  # DLPack path, not __array_interface__
    assert buf.ptr == d.ctypes.data and buf.nbytes == d.nbytes and not buf.cuda
    r = eng.register("size", 1 << 16)
    assert r.nbytes == 1 << 16 and r.numpy().sum() == 0
    assert sorted(eng.regions) == ["ba", "np", "size"]


class _Dl:
    """Only __dlpack__ (hides the array interface)."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, stream=None):
        return self.a.__dlpack__()


class _FakeCuda:
    """__cuda_array_interface__ over host memory: the library must refuse it
    as CUDA memory on a machine without a CUDA device."""

    def __init__(self, a):
        self.a = a
        self.__cuda_array_interface__ = {"data": (a.ctypes.data, False), "shape": a.shape, "typestr": "<f4",
                                         "strides": None, "version": 3}


def test_bad_memory(eng):
    with pytest.raises(xfer.InvalidArgumentError, match="contiguous"):
        eng.register("strided", np.zeros(100)[::2])
    ro = np.zeros(100)
    ro.flags.writeable = False
    with pytest.raises(xfer.InvalidArgumentError, match="read-only"):
        eng.register("ro", ro, "rw")
    eng.register("ro", ro, "r")
    with pytest.raises(xfer.InvalidArgumentError, match="read-only"):
        eng.register("bytes", memoryview(b"abc"))
    with pytest.raises(xfer.InvalidArgumentError, match="cannot register"):
        eng.register("obj", object())
    with pytest.raises(xfer.InvalidArgumentError):
        eng.register("acc", 4096, access="x")
    with pytest.raises(xfer.ExistsError):
        eng.register("ro", 4096)
    fake = _FakeCuda(np.zeros(16, dtype=np.float32))
    with pytest.raises(xfer.Error) as ei:
        eng.register("cuda", fake)
    assert ei.value.code == xfer.Code.ENODEV and "not CUDA device memory" in ei.value.reason


def test_torch_if_installed(eng):
    torch = pytest.importorskip("torch")
    t = torch.arange(256, dtype=torch.float32)
    r = eng.register("t", t)
    assert r.ptr == t.data_ptr() and r.nbytes == 1024
    with pytest.raises(xfer.InvalidArgumentError):
        eng.register("tt", t.view(16, 16).t())


def test_closed_handles():
    e = xfer.Engine("closing", transports="tcp")
    r = e.register("r", 4096)
    t = e.batch()
    e.close()
    e.close()
    with pytest.raises(xfer.InvalidArgumentError, match="closed|deregistered"):
        r.info()
    with pytest.raises(xfer.InvalidArgumentError):
        len(t)


def _rss_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def test_no_python_level_leaks():
    """10,000 small transfers: RSS and open fds stay flat."""
    with xfer.Engine("leak-a", transports="tcp") as a, xfer.Engine("leak-b", transports="tcp") as b:
        ra = a.register("src", np.arange(4096, dtype=np.uint8))
        rb = b.register("dst", 4096)
        p = b.add_peer(a.info())
        info = ra.info()
        p.add_region(info)

        def run(n):
            for i in range(n):
                t = b.read(rb, i % 64, p, info, i % 64, 64)
                assert t.wait(10)
                t.status()
            gc.collect()

        run(1000)  # warm up: allocator pools, connections
        rss0, fds0 = _rss_kb(), len(os.listdir("/proc/self/fd"))
        run(10000)
        rss1, fds1 = _rss_kb(), len(os.listdir("/proc/self/fd"))
        assert fds1 == fds0, f"fds {fds0} -> {fds1}"
        if os.environ.get("XFER_SAN"):
            return  # ASan's quarantine holds freed memory: RSS says nothing there
        assert rss1 - rss0 < 4096, f"RSS grew {rss1 - rss0} KiB over 10,000 transfers"
