#!/usr/bin/env bash
# GPU request rings on a GPU (tests/gpu/gpu_ring.c): thread blocks put their
# slices through the ring to a receiver in this process (tcp), in another
# process (tcp) and in another process over ipc (CUDA IPC), with one put per
# block, per warp and per thread, and get them back; the receiver checks
# every byte. Then a 4-slot ring (back-pressure), a frozen receiver and a
# stopped ring (the kernels' waits end), a killed receiver (the kernel reads
# the error word within a bound); compute-sanitizer (memcheck, synccheck) on
# the in-process cases when it is installed. Skips (77) without a CUDA build
# or device. Two GPUs: XFER_RING_PEER_GPU=1 puts the receiver on GPU 1.
set -u
B=${B:-build}
prog=$B/tests/gpu_ring
[[ -x $prog ]] || { echo "skip: built without CUDA (no $prog)"; exit 77; }
peer_gpu=${XFER_RING_PEER_GPU:-0}
timeout --kill-after=5 400 "$prog" check --peer-gpu "$peer_gpu"
rc=$?
((rc == 0)) || exit $rc
if command -v compute-sanitizer >/dev/null; then
    for tool in memcheck synccheck; do
        echo "== compute-sanitizer --tool $tool"
        timeout --kill-after=5 400 compute-sanitizer --tool "$tool" --error-exitcode 9 \
            "$prog" check --cases local,pressure || { echo "compute-sanitizer $tool: failed"; exit 1; }
    done
else
    echo "skip-case: compute-sanitizer not installed; sanitizer runs not done"
fi
echo "PASS"
