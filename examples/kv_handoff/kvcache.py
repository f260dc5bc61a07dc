"""A paged KV cache in vLLM's FlashAttention layout, and the byte ranges of
its blocks.

One tensor per layer, shaped [2, num_blocks, block_size, kv_heads, head_dim]
(K then V): block b of layer l, half h is the B = block_size * kv_heads *
head_dim * itemsize bytes at h * num_blocks * B + b * B of layer l's tensor.
CUDA tensors (torch) when a GPU is there and asked for, else NumPy on the
host. bf16 without torch is stored as its 16-bit patterns (np.uint16).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Geometry:
    layers: int = 4
    num_blocks: int = 64
    block_size: int = 16
    kv_heads: int = 4
    head_dim: int = 64
    dtype: str = "fp16"  # fp16 | bf16

    @property
    def itemsize(self) -> int:
        return 2

    @property
    def block_bytes(self) -> int:
        """B: one block of one layer and one half."""
        return self.block_size * self.kv_heads * self.head_dim * self.itemsize

    @property
    def layer_bytes(self) -> int:
        return 2 * self.num_blocks * self.block_bytes


def make_layers(g: Geometry, device: str = "cpu") -> list:
    """L zeroed tensors [2, N, bs, heads, dim]."""
    shape = (2, g.num_blocks, g.block_size, g.kv_heads, g.head_dim)
    if device.startswith("cuda"):
        import torch

        dt = torch.float16 if g.dtype == "fp16" else torch.bfloat16
        return [torch.zeros(shape, dtype=dt, device=device) for _ in range(g.layers)]
    dt = np.float16 if g.dtype == "fp16" else np.uint16
    return [np.zeros(shape, dtype=dt) for _ in range(g.layers)]


def runs(local_ids, remote_ids):
    """Pairs of block ids -> (local_start, remote_start, count) runs that are
    consecutive on both sides ("7, 8, 9 -> 40, 41, 42" is one run)."""
    out = []
    for lb, rb in zip(local_ids, remote_ids):
        if out and out[-1][0] + out[-1][2] == lb and out[-1][1] + out[-1][2] == rb:
            out[-1][2] += 1
        else:
            out.append([lb, rb, 1])
    return out


def block_ranges(g: Geometry, local_ids, remote_ids):
    """(local_off, remote_off, nbytes, first, count) within one layer's
    tensor for moving blocks local_ids[i] <-> remote_ids[i], both halves,
    runs merged; the item covers positions [first, first + count) of the
    id lists."""
    B, N = g.block_bytes, g.num_blocks
    out = []
    pos = 0
    for lb, rb, k in runs(local_ids, remote_ids):
        for h in (0, 1):
            out.append((h * N * B + lb * B, h * N * B + rb * B, k * B, pos, k))
        pos += k
    return out


def expected(g: Geometry, req: int, layer: int, nblocks: int) -> np.ndarray:
    """What request req's blocks of layer hold after prefill: [2, nblocks,
    bs, heads, dim] of 16-bit values that depend on the request, the layer
    and the position (finite as fp16 and bf16; cheap to make, so the
    example's time is not spent generating data)."""
    n = 2 * nblocks * g.block_size * g.kv_heads * g.head_dim
    seed = (req * 1000003 + layer * 7919 + 1) & 0xFFFFFFFF
    v = (np.arange(n, dtype=np.uint32) * np.uint32(2654435761) + np.uint32(seed)) >> np.uint32(18)
    return (v & np.uint32(0x3BFF)).astype(np.uint16).reshape(2, nblocks, g.block_size, g.kv_heads, g.head_dim)


def fill(g: Geometry, layer_tensor, req: int, layer: int, block_ids) -> None:
    """Prefill "computes" layer for req: writes expected() into its blocks."""
    v = expected(g, req, layer, len(block_ids))
    if hasattr(layer_tensor, "device") and str(layer_tensor.device).startswith("cuda"):
        import torch

        t = torch.from_numpy(v.view(np.int16)).to(layer_tensor.device)
        layer_tensor.view(torch.int16)[:, list(block_ids)] = t
        # The copy above is queued on torch's stream; xfer reads the tensor on
        # its own streams (and over tcp by a D2H of its own), so the values
        # must be in memory before the transfer is submitted, as a model's
        # layer would be (vLLM records an event per layer for the same reason).
        torch.cuda.current_stream(layer_tensor.device).synchronize()
    else:
        layer_tensor.view(np.uint16)[:, list(block_ids)] = v


def check(g: Geometry, layer_tensor, req: int, layer: int, block_ids) -> list:
    """Block positions (indices into block_ids) whose values differ from
    expected(); [] when every value is right."""
    v = expected(g, req, layer, len(block_ids))
    if hasattr(layer_tensor, "device") and str(layer_tensor.device).startswith("cuda"):
        import torch

        got = layer_tensor.view(torch.int16)[:, list(block_ids)].cpu().numpy().view(np.uint16)
    else:
        got = layer_tensor.view(np.uint16)[:, list(block_ids)]
    bad = np.nonzero((got != v).reshape(2, len(block_ids), -1).any(axis=(0, 2)))[0]
    return [int(i) for i in bad]
