#!/usr/bin/env bash
# GPU kernels vs the CPU reference (tests/gpu/test_kernels.c). Skips (77)
# with "skipped: no CUDA device" where there is no GPU.
set -u
B=${B:-build}
exec "$B/tests/test_kernels" "${XFER_KERNEL_ROUNDS:-18}"
