# fakeverbs: the software stand-in for libibverbs + librdmacm (test builds only).
#
# It is NOT in LIB_SRCS: libxfer.a holds the same rdma transport objects for
# production and tests. Production programs link $(LINK_LIBS), which ends in
# the real $(VERBS_LIBS). Programs that exercise rdma on the stand-in link
# $(FAKE_LINK_LIBS) instead: libxfer.a first (its undefined ibv_*/rdma_*
# references), then libfakeverbs.a (which defines them), and no -libverbs
# -lrdmacm at all, so there is nothing else the symbols could bind to.
FAKEVERBS_SRCS := $(wildcard tests/fakeverbs/*.c)
FAKEVERBS_OBJS := $(patsubst %.c,$(B)/obj/%.o,$(FAKEVERBS_SRCS))
FAKEVERBS := $(B)/lib/libfakeverbs.a
FAKE_LINK_LIBS = $(B)/lib/libxfer.a $(FAKEVERBS) $(EXT_LIBS) $(CUDA_LIBS)

$(FAKEVERBS): $(FAKEVERBS_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

# Unit tests named test_fakeverbs* / test_rdma_fake* link the stand-in
# (explicit rules win over the generic tests/unit rule of the Makefile).
FAKE_UNIT_BINS := $(patsubst tests/unit/%.c,$(B)/tests/unit/%,\
    $(wildcard tests/unit/test_fakeverbs*.c tests/unit/test_rdma_fake*.c))
$(FAKE_UNIT_BINS): $(B)/tests/unit/%: $(B)/obj/tests/unit/%.o $(B)/lib/libxfer.a $(FAKEVERBS)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $< -o $@ $(FAKE_LINK_LIBS) -lcmocka

all: $(FAKEVERBS)

# Integration helpers linked with the stand-in: the same main objects as the
# TEST_PROGS built with the real libraries, linked the other way.
FAKE_TEST_PROGS := xfer_node:tests/prog/xfer_node.c xfer_rdma_check:tests/prog/xfer_rdma_check.c \
                   xfer_random:tests/prog/xfer_random.c xferd:service/xferd_main.c \
                   xfer_notify:tests/prog/xfer_notify.c xfer_sendrecv:tests/prog/xfer_sendrecv.c \
                   node_lease:tests/prog/node_lease.c xfer_vec:tests/prog/xfer_vec.c
# Also built with the real libraries, for runs on real NICs (docs/rdma.md).
TEST_PROGS += xfer_rdma_check:tests/prog/xfer_rdma_check.c
FAKE_TEST_BINS := $(foreach p,$(FAKE_TEST_PROGS),$(B)/tests/fake/$(word 1,$(subst :, ,$(p))))
define fake_prog_rule
$(B)/tests/fake/$(1): $(B)/obj/$(patsubst %.c,%.o,$(2)) $(B)/lib/libxfer.a $(FAKEVERBS)
	@mkdir -p $$(dir $$@)
	$$(CC) $$(LDFLAGS) $$< -o $$@ $$(FAKE_LINK_LIBS)
endef
$(foreach p,$(FAKE_TEST_PROGS),$(eval $(call fake_prog_rule,$(word 1,$(subst :, ,$(p))),$(word 2,$(subst :, ,$(p))))))
all: $(FAKE_TEST_BINS)
