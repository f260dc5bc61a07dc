# kernels/: CUDA kernels behind a C ABI (xfer_kernels.h) and their CPU reference.
LIB_SRCS += kernels/kref.c
ifeq ($(XFER_WITH_CUDA),1)
CU_SRCS += kernels/kcopy.cu kernels/kstage.cu kernels/kbatch.cu
else
LIB_SRCS += kernels/nocuda.c
endif
TEST_PROGS += test_kernels:tests/gpu/test_kernels.c
TEST_PROGS += test_kblocks:tests/gpu/test_kblocks.c
BENCH_PROGS += bench_kernels:bench/bench_kernels.c
TEST_PROGS += test_gpu_stage:tests/gpu/test_gpu_stage.c
# TCPX receive unpack (docs/tcpx.md): CPU reference and checks always, the
# unpacker (kernel, per-fragment copies, host gather) with CUDA.
LIB_SRCS += kernels/kunpack_ref.c
ifeq ($(XFER_WITH_CUDA),1)
CU_SRCS += kernels/kunpack.cu
else
LIB_SRCS += kernels/kunpack_nocuda.c
endif
