#!/usr/bin/env bash
# Builds test_kernels and bench_kernels linked only against the static CUDA
# runtime (no hiredis/libevent/protobuf-c/cmocka), for GPU machines that lack
# those libraries.   tests/gpu/build_lean.sh OUTDIR
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:?usage: build_lean.sh OUTDIR}
mkdir -p "$out/obj"
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
CUDA_HOME=${CUDA_HOME:-${NVCC%/bin/nvcc}}
arch="-gencode arch=compute_90,code=[sm_90,compute_90]"
inc="-D_GNU_SOURCE -DXFER_WITH_CUDA=1 -I. -Iengine -Iproto -Ikernels -I$CUDA_HOME/include"
for f in kernels/kcopy.cu kernels/kstage.cu kernels/kbatch.cu; do
    "$NVCC" -O3 -std=c++17 -Xcompiler -fPIC,-Wall,-Werror $arch $inc -c "$f" -o "$out/obj/$(basename "$f").o" &
done
wait
objs=("$out"/obj/*.cu.o)
for f in engine/error.c engine/log.c engine/gpu_stage.c proto/frame.c kernels/kref.c; do
    cc -std=c11 -O2 -g -Wall -Wextra -Werror -pthread $inc -c "$f" -o "$out/obj/$(basename "$f" .c).o"
    objs+=("$out/obj/$(basename "$f" .c).o")
done
libs="-L$CUDA_HOME/lib64 -lcudart_static -lstdc++ -ldl -lrt -lpthread -lm"
for p in tests/gpu/test_kernels.c tests/gpu/test_gpu_stage.c bench/bench_kernels.c; do
    cc -std=c11 -O2 -g -Wall -Wextra -Werror -pthread $inc "$p" "${objs[@]}" -o "$out/$(basename "$p" .c)" $libs
done
echo "built $out/test_kernels $out/test_gpu_stage $out/bench_kernels"
