#!/usr/bin/env bash
# Block runs (the GPU expands block ids: ipc's KV pool requests) vs the CPU
# reference (tests/gpu/test_kblocks.c). The reference and argument checks
# run everywhere; skips (77) with "skipped: no CUDA device" without a GPU.
set -u
B=${B:-build}
exec "$B/tests/test_kblocks" "${XFER_KERNEL_ROUNDS:-24}"
