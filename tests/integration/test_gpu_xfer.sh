#!/usr/bin/env bash
# GPU regions through the engine between two processes (tests/gpu/gpu_xfer.c):
# random batches and KV block lists, every pair of host/GPU memory, over tcp
# (pinned staging) and ipc. Without a CUDA device: the no-device errors of
# GPU regions over tcp are checked, then 77.
set -u
B=${B:-build}
prog=$B/tests/gpu_xfer
timeout --kill-after=5 300 "$prog" --transport tcp
rc=$?
((rc == 0)) || exit $rc
timeout --kill-after=5 300 "$prog" --transport ipc || exit 1
echo "gpu_xfer: tcp and ipc passed"
