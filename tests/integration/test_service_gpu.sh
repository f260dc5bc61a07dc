#!/usr/bin/env bash
# xferd and GPUs: the node's `gpus` field in the registry (xfer_gpus_describe:
# empty without CUDA devices, "idx:GPU-uuid:pci,..." with them), and a local
# client's GPU memory handed over as a CUDA IPC handle (xferctl register
# --cuda-ipc): refused with a clear one-line error where it cannot be opened
# (no CUDA device here; a handle of no live allocation on a GPU machine).
# The working handover is exercised engine-level by tests/gpu/gpu_xfer.c.
set -u
cd "${XFER_ROOT:-.}"
B=${B:-build}
source tests/lib/service.sh
trap 'svc_cleanup; redis_stop' EXIT
svc_init
svc_redis_up
svc_start n1 0 --redis-url "$REDIS_URL"
svc_wait_ready n1
wait_for 10 redis_cli exists 'xfer:node:{n1}' || fail "node not published"
gpus=$(redis_cli hget 'xfer:node:{n1}' gpus)
if nvidia-smi -L >/dev/null 2>&1; then
    [[ $gpus == 0:GPU-* ]] || fail "gpus field '$gpus' on a GPU machine"
else
    [[ -z $gpus ]] || fail "gpus field '$gpus' without GPUs"
fi
zeros=$(printf '0%.0s' $(seq 128))
out=$(ctl n1 register g 1M --cuda-ipc "$zeros" --gpu 0 2>&1); rc=$?
((rc != 0)) || fail "a zero CUDA IPC handle was accepted"
[[ $out == *"no CUDA device"* || $out == *"cudaIpcOpenMemHandle"* ]] || fail "error: '$out'"
(($(wc -l <<<"$out") == 1)) || fail "more than one line: '$out'"
out=$(ctl n1 register g 1M --cuda-ipc abc --gpu 0 2>&1); rc=$?
((rc != 0)) && [[ $out == *"hex digits"* ]] || fail "bad hex: rc=$rc '$out'"
ctl n1 regions | grep -q '^g ' && fail "a refused region was registered"
echo "gpus='$gpus'; CUDA handle refusals clear"
