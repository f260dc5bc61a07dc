# tcpx: the test NCCL net plugin (tests/tcpx/testnet.c, testnet_abi.c), a
# shared library the transport dlopens like any plugin:
# $(B)/tests/libnccl-net-xfertest.so.
TESTNET := $(B)/tests/libnccl-net-xfertest.so
ifeq ($(XFER_WITH_CUDA),1)
TESTNET_LIBS := -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt
endif
TESTNET_OBJS := $(B)/obj/tests/tcpx/testnet.o $(B)/obj/tests/tcpx/testnet_abi.o
$(TESTNET): $(TESTNET_OBJS)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -shared $^ -o $@ $(TESTNET_LIBS)
$(TESTNET_OBJS): CPPFLAGS += -Iengine/tcpx
all: $(TESTNET)
TEST_PROGS += tcpx_check:tests/tcpx/tcpx_check.c
$(B)/obj/tests/tcpx/tcpx_check.o: CPPFLAGS += -Itests/prog
TEST_PROGS += test_unpack:tests/gpu/test_unpack.c
$(B)/obj/tests/unit/test_tcpx_plugin.o: CPPFLAGS += -Iengine/tcpx
$(B)/tests/unit/test_tcpx_plugin: $(TESTNET)
