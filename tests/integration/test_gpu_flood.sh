#!/usr/bin/env bash
# Many tiny GPU items over tcp's staging path (tests/gpu/gpu_flood.c): 64-byte
# GPU -> GPU WRITEs and READs between two processes, batches of 256 and 1024,
# up to 4096 in flight, each flood bounded by a deadline (a stalled staging
# path fails, it never hangs); then one 4 KiB against one 64 KiB item.
# Without a CUDA device the staging ring is emulated (XFER_GPU_STAGE_EMULATE=1).
set -u
B=${B:-build}
XFER_GPU_STAGE_EMULATE=1 timeout --kill-after=5 120 "$B/tests/gpu_flood"
