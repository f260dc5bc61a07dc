# ipc transport: engine/ipc/*.c are in LIB_SRCS through engine/module.mk.
# Test/bench driver `ipc_node` (tests/ipc): built here rather than through
# TEST_PROGS because it links several objects, plus a CUDA one when nvcc is on.
IPC_NODE_SRCS := tests/ipc/ipc_node.c tests/ipc/ipc_owner.c tests/ipc/ipc_host_tests.c \
                 tests/ipc/ipc_gpu_tests.c tests/ipc/ipc_fault_tests.c
ifeq ($(XFER_WITH_CUDA),1)
IPC_NODE_OBJS := $(patsubst %.c,$(B)/obj/%.o,$(IPC_NODE_SRCS)) $(B)/obj/tests/ipc/ipc_gpu_util.cu.o
IPC_NODE_LIBS := -lstdc++
else
IPC_NODE_OBJS := $(patsubst %.c,$(B)/obj/%.o,$(IPC_NODE_SRCS) tests/ipc/ipc_gpu_stub.c)
IPC_NODE_LIBS :=
endif

$(B)/obj/tests/ipc/%.cu.o: NVCCFLAGS += -Itests/ipc

$(B)/tests/ipc_node: $(IPC_NODE_OBJS) $(B)/lib/libxfer.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $(IPC_NODE_OBJS) -o $@ $(LINK_LIBS) $(IPC_NODE_LIBS)

all: $(B)/tests/ipc_node
