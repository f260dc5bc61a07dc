#!/usr/bin/env bash
# GPU memory over TCP loopback through the pinned staging ring
# (tests/gpu/test_gpu_stage.c). Skips (77) where there is no GPU.
set -u
B=${B:-build}
exec "$B/tests/test_gpu_stage"
