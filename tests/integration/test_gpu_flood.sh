#!/usr/bin/env bash
# Many tiny GPU items over tcp's staging path (tests/gpu/gpu_flood.c): 64-byte
# GPU -> GPU WRITEs and READs between two processes, batches of 256 and 1024,
# up to 4096 in flight, each flood bounded by a deadline (a stalled staging
# path fails, it never hangs); then one 4 KiB against one 64 KiB item.
# Without a CUDA device the staging ring is emulated (XFER_GPU_STAGE_EMULATE=1):
# once as is, once with every small copy taking 2 ms (a small H2D waiting for
# another process's kernel to leave the GPU, as on the H100 run of
# 2026-11-25), where four staging slots made 4096 tiny items crawl.
set -u
B=${B:-build}
# A build without CUDA has no staging ring to emulate: gpu_flood says so (77).
XFER_GPU_STAGE_EMULATE=1 timeout --kill-after=5 120 "$B/tests/gpu_flood"
rc=$?
((rc == 0)) || exit $rc
XFER_GPU_STAGE_EMULATE=1 XFER_GPU_STAGE_EMULATE_SMALL_US=2000 \
    timeout --kill-after=5 120 "$B/tests/gpu_flood"
