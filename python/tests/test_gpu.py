"""CUDA memory through the package (runs where torch sees a GPU; skips
elsewhere): torch CUDA tensors, __cuda_array_interface__ (CuPy) and DLPack
registered, GPU <-> GPU and GPU <-> host between two processes over ipc and
tcp, values checked; the KV handoff example with CUDA tensors."""

import hashlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import xfer  # noqa: E402
from peer import bytes_of  # noqa: E402

MB = 1 << 20


class _Dl:
    def __init__(self, t):
        self.t = t

    def __dlpack__(self, stream=None):
        return self.t.__dlpack__()


def test_adapters_give_cuda_regions():
    with xfer.Engine("gpu-adapters", transports="tcp") as e:
        t = torch.zeros(4096, dtype=torch.float16, device="cuda")
        info = e.register("t", t).info()
        assert info.cuda and info.device == 0 and info.addr == t.data_ptr() and info.nbytes == 8192
        info = e.register("dl", _Dl(t[:1024])).info()
        assert info.cuda and info.addr == t.data_ptr() and info.nbytes == 2048
        try:
            import cupy
        except ImportError:
            cupy = None
        if cupy is not None:
            c = cupy.zeros(1000, dtype=cupy.float32)
            info = e.register("cupy", c).info()
            assert info.cuda and info.addr == c.data.ptr and info.nbytes == 4000


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_gpu_round_trips(redis_url, peers, node_name, transport):
    srv = peers("--node", "g-" + node_name, "--redis", redis_url, "--transports", transport,
                "--region", f"src:{4 * MB}:r:3", "--region", f"dst:{4 * MB}:w", script="gpu_peer.py")
    with xfer.Engine("c-" + node_name, transports=transport) as eng, xfer.Registry(redis_url) as reg:
        p = reg.connect(eng, "g-" + node_name)
        src, dst = reg.resolve(p, "src"), reg.resolve(p, "dst")
        assert src.cuda and dst.cuda
        gbuf = torch.zeros(4 * MB, dtype=torch.uint8, device="cuda")
        hbuf = np.zeros(4 * MB, dtype=np.uint8)
        g, h = eng.register("g", gbuf), eng.register("h", hbuf)
        assert eng.read(g, 0, p, src, 0, 4 * MB).wait(20)  # GPU <- GPU
        assert eng.read(h, 0, p, src, 0, 4 * MB).wait(20)  # host <- GPU
        torch.cuda.synchronize()
        want = bytes_of(3, 4 * MB)
        assert np.array_equal(gbuf.cpu().numpy(), want) and np.array_equal(hbuf, want)
        assert p.transport == transport
        gbuf.copy_(torch.from_numpy(bytes_of(4, 4 * MB)).cuda())
        torch.cuda.synchronize()
        t = eng.batch().write(g, 0, p, dst, 0, 2 * MB).write(g, 2 * MB, p, dst, 2 * MB, 2 * MB).submit()
        assert t.wait(20)
        assert srv.cmd(op="digest", region="dst")["hex"] == hashlib.sha256(bytes_of(4, 4 * MB).tobytes()).hexdigest()
