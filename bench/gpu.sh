#!/usr/bin/env bash
# make bench-gpu: the GPU paths beside their CUDA ceilings, on a GPU machine.
#   1. bench_kernels: batched copy / KV gather-scatter kernels against one
#      cudaMemcpyAsync of the same bytes, one copy per block and
#      cudaMemcpyBatchAsync (see its header)
#   2. bench_pool_gpu: one KV pool request (vLLM FlashAttention layout, 32
#      layers x K/V, 16 KiB blocks, 512 random blocks) between two processes
#      through the node library, GPU pools over ipc and tcp, against the
#      one-copy D2D ceiling and one cudaMemcpyAsync per block; host pools
#      over tcp and ipc as the comparison row; each also over ipc with
#      XFER_POOL_VECTORED=0 (one item per block run, the path before
#      vectored items) and with XFER_POOL_BLOCKS=0 (vectored items, the
#      path before block items) as the before/after of the same build
# Output to stdout and $XFER_BENCH_GPU_OUT (default $B/bench-gpu.txt).
# Without a CUDA device every part says so and the run exits 77.
set -u
cd "$(dirname "$0")/.."
B=${B:-build}
out=${XFER_BENCH_GPU_OUT:-$B/bench-gpu.txt}
source tests/lib/redis.sh
trap 'kill $srv 2>/dev/null; redis_stop' EXIT
srv=
exec > >(tee "$out") 2>&1
echo "bench-gpu $(date -u '+%F %T UTC'), $(git rev-parse --short HEAD 2>/dev/null)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null ||
    echo "no nvidia-smi"
echo "== kernels"
"$B/bench/bench_kernels" "${XFER_BENCH_GPU_REPS:-10}"
rc=$?
((rc == 77)) && { echo "no CUDA device: nothing more to measure"; exit 77; }
redis_start || exit 1
pool() { # pool MEMFLAG: a server with both transports, then a run per transport
    "$B/bench/bench_pool_gpu" serve bp-srv --transports tcp,ipc $1 --lifetime 300 &
    srv=$!
    for t in ipc tcp; do
        timeout 300 "$B/bench/bench_pool_gpu" run bp-cli-$t bp-srv --transports $t $1 || rc=1
    done
    # the path before vectored items (one plain item per block run), same build
    echo "-- ipc, XFER_POOL_VECTORED=0 (one item per block run: the earlier path)"
    XFER_POOL_VECTORED=0 timeout 300 "$B/bench/bench_pool_gpu" run bp-cli-ipc0 bp-srv \
        --transports ipc $1 || rc=1
    # over ipc pool requests are block items; the vectored items before them
    echo "-- ipc, XFER_POOL_BLOCKS=0 (vectored items: the path before block items)"
    XFER_POOL_BLOCKS=0 timeout 300 "$B/bench/bench_pool_gpu" run bp-cli-ipcv bp-srv \
        --transports ipc $1 || rc=1
    kill $srv
    wait $srv 2>/dev/null
}
echo "== KV pool request, GPU pools"
pool ""
echo "== KV pool request, host pools"
pool --host
exit $rc
