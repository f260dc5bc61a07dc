# GPU request ring test and bench (tests/gpu/gpu_ring*.c and a CUDA object
# of kernels that use kernels/xfer_dev.cuh): built here rather than through
# TEST_PROGS because it links a .cu object. Not built without CUDA (its
# integration test then skips).
ifeq ($(XFER_WITH_CUDA),1)
GPU_RING_OBJS := $(B)/obj/tests/gpu/gpu_ring.o $(B)/obj/tests/gpu/gpu_ring_bench.o \
                 $(B)/obj/tests/gpu/gpu_ring_kernels.cu.o
$(B)/obj/tests/gpu/gpu_ring.o $(B)/obj/tests/gpu/gpu_ring_bench.o: CPPFLAGS += -Itests/prog

$(B)/tests/gpu_ring: $(GPU_RING_OBJS) $(B)/lib/libxfer.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -rdynamic $(GPU_RING_OBJS) -o $@ $(LINK_LIBS)

all: $(B)/tests/gpu_ring
endif
