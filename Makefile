# xfer — top-level build. Each folder contributes a module.mk fragment that
# appends to the variables below; nothing here names individual sources.
#
#   make            build library, xferd, xferctl, tests, benches
#   make test       deps + build + every test (ends "N passed, N failed, N skipped")
#   make test SAN=1 the same under AddressSanitizer/UBSan (build-san/)
#   make demo       deps + build + local redis + two workers + named transfers
#   make bench      benchmarks (see README)
#   make deps       install missing Debian packages (root), quick when present
#   make install PREFIX=/usr/local   libxfer.so, headers, xferd, xferctl
#   make python     the Python package into $(B)/venv (offline)
#   make clean

.DEFAULT_GOAL := all
SHELL := /bin/bash

SAN ?= 0
ifeq ($(SAN),1)
B ?= build-san
SANFLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
OPT ?= -O1 -g
else
B ?= build
SANFLAGS :=
OPT ?= -O2 -g
endif

PREFIX ?= /usr/local
CC ?= cc
CPPFLAGS += -D_GNU_SOURCE -I. -Iengine -Iproto -Iregistry -Ikernels -Iservice -I$(B)/gen
# -fvisibility=hidden: libxfer.so exports only what the public headers mark
# (XFER_API, or a header-wide visibility pragma); the in-tree programs link
# the static archive and see everything.
# -fno-plt: calls into libc (a message takes ~70 mutex calls) go straight
# through the GOT, without the PLT stub's jump (docs/perf.md, "Step 14").
CFLAGS += -std=c11 -Wall -Wextra -Werror $(OPT) -fPIC -fvisibility=hidden -fno-plt -pthread -MMD -MP $(SANFLAGS)
LDFLAGS += -pthread $(SANFLAGS)
VERBS_LIBS ?= -libverbs -lrdmacm
EXT_LIBS := -lhiredis -levent -levent_pthreads -lprotobuf-c -lcrypto -lm -ldl -lrt

# CUDA: on when nvcc is found (XFER_WITH_CUDA=0 forces it off).
NVCC ?= $(or $(shell command -v nvcc 2>/dev/null),$(wildcard /usr/local/cuda/bin/nvcc))
ifneq ($(strip $(NVCC)),)
XFER_WITH_CUDA ?= 1
else
XFER_WITH_CUDA := 0
endif
ifeq ($(XFER_WITH_CUDA),1)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
CPPFLAGS += -DXFER_WITH_CUDA=1 -I$(CUDA_HOME)/include
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -lcudart_static -lstdc++
NVCCFLAGS ?= -O3 -std=c++17 -Xcompiler -fPIC,-fvisibility=hidden,-Wall,-Werror -I. -Iengine -Ikernels \
             -gencode arch=compute_90,code=[sm_90,compute_90] -gencode arch=compute_80,code=sm_80
endif

LIB_SRCS :=
CU_SRCS :=
PROGS :=          # name:main.c pairs become $(B)/bin/name
TEST_PROGS :=     # helper programs for integration tests, $(B)/tests/name
BENCH_PROGS :=    # $(B)/bench/name
PROTOS :=
GEN_SRCS :=

include $(sort $(wildcard */module.mk */*/module.mk))

UNIT_SRCS := $(sort $(wildcard tests/unit/test_*.c))
UNIT_BINS := $(patsubst tests/unit/%.c,$(B)/tests/unit/%,$(UNIT_SRCS))

LIB_OBJS := $(patsubst %.c,$(B)/obj/%.o,$(LIB_SRCS)) $(patsubst %.c,%.o,$(GEN_SRCS))
ifeq ($(XFER_WITH_CUDA),1)
LIB_OBJS += $(patsubst %.cu,$(B)/obj/%.cu.o,$(CU_SRCS))
endif
LIBXFER := $(B)/lib/libxfer.a
# The shared library is the public one: the layers below the service only
# (engine, registry, proto, kernels, node), never xferd's or xferctl's code.
SO_LAYERS := engine registry proto kernels node
SO_OBJS := $(filter $(foreach l,$(SO_LAYERS),$(B)/obj/$(l)/%) $(B)/gen/%,$(LIB_OBJS))
# LTO=1 (the default; never with SAN=1): the engine layer, where a
# message's path runs through batch, matcher and transport files, is
# optimized as one unit (its sources compiled to GCC's intermediate form,
# then one `ld -r` with link-time optimization into $(ENGINE_LTO), a plain
# object). Only that step re-optimizes: the programs and tests link the
# archive as before. docs/perf.md, "Step 14".
LTO ?= 1
ENGINE_OBJS := $(filter $(B)/obj/engine/%,$(LIB_OBJS))
ifeq ($(SAN)$(LTO),01)
ENGINE_LTO := $(B)/obj/engine.lto.o
$(ENGINE_OBJS): private CFLAGS += -flto
LIB_OBJS := $(filter-out $(ENGINE_OBJS),$(LIB_OBJS)) $(ENGINE_LTO)
SO_OBJS := $(filter-out $(ENGINE_OBJS),$(SO_OBJS)) $(ENGINE_LTO)
endif
# The engine's objects are GCC's intermediate form with LTO and machine
# code without: switching LTO in a built tree rebuilds them (the stamp of
# the other mode is removed, this one's is new).
ENGINE_MODE := $(B)/obj/engine/.lto-$(if $(ENGINE_LTO),on,off)
$(ENGINE_MODE):
	@mkdir -p $(dir $@) && rm -f $(B)/obj/engine/.lto-* && touch $@
$(ENGINE_OBJS): $(ENGINE_MODE)
XFER_SOVERSION := 0
LIBXFER_SO := $(B)/lib/libxfer.so
# Headers installed under include/xfer/ (they include each other by bare name).
PUBLIC_HEADERS := engine/xfer.h engine/xfer_err.h engine/xfer_gpu_ring.h \
                  registry/xfer_registry.h kernels/xfer_kernels.h kernels/xfer_ring.h \
                  kernels/xfer_ring_proto.h kernels/xfer_dev.cuh $(wildcard node/xfer_node.h)
LINK_LIBS = $(LIBXFER) $(EXT_LIBS) $(VERBS_LIBS) $(CUDA_LIBS)

prog_name = $(word 1,$(subst :, ,$(1)))
prog_main = $(word 2,$(subst :, ,$(1)))
BIN_TARGETS := $(foreach p,$(PROGS),$(B)/bin/$(call prog_name,$(p)))
TEST_TARGETS := $(foreach p,$(TEST_PROGS),$(B)/tests/$(call prog_name,$(p)))
BENCH_TARGETS := $(foreach p,$(BENCH_PROGS),$(B)/bench/$(call prog_name,$(p)))

all: $(LIBXFER) $(LIBXFER_SO) $(BIN_TARGETS) $(TEST_TARGETS) $(BENCH_TARGETS) $(UNIT_BINS)

# Generated protobuf-c sources must exist before anything includes them:
# every object (library, mains, tests) waits for them.
$(B)/obj/%.o: %.c | $(GEN_SRCS)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -c $< -o $@

# Keep the generated sources (make would delete them as intermediates and
# regenerate them, and rebuild everything that includes them, on every run).
.SECONDARY: $(GEN_SRCS) $(GEN_SRCS:.c=.h)

$(B)/obj/%.cu.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $(filter -D%,$(CPPFLAGS)) -c $< -o $@

ifdef ENGINE_LTO
$(ENGINE_LTO): $(ENGINE_OBJS)
	$(CC) -r $(filter-out -MMD -MP,$(CFLAGS)) -flto-partition=one -flinker-output=nolto-rel $^ -o $@
endif

$(LIBXFER): $(LIB_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

# -z defs: every symbol resolves inside the listed libraries (a layer that
# reached into service/ would fail here); --exclude-libs keeps the static
# CUDA runtime's symbols out of the export table.
$(LIBXFER_SO): $(SO_OBJS)
	@mkdir -p $(dir $@)
	$(CC) -shared -Wl,-soname,libxfer.so.$(XFER_SOVERSION) -Wl,-z,defs -Wl,--exclude-libs,ALL \
	    $(LDFLAGS) $^ -o $@ $(EXT_LIBS) $(VERBS_LIBS) $(CUDA_LIBS)

define prog_rule
$(2)/$(call prog_name,$(1)): $(B)/obj/$(call prog_main,$(1)) $(LIBXFER)
	@mkdir -p $$(dir $$@)
	$$(CC) $$(LDFLAGS) $$< -o $$@ $$(LINK_LIBS)
endef
$(foreach p,$(PROGS),$(eval $(call prog_rule,$(patsubst %.c,%.o,$(p)),$(B)/bin)))
$(foreach p,$(TEST_PROGS),$(eval $(call prog_rule,$(patsubst %.c,%.o,$(p)),$(B)/tests)))
$(foreach p,$(BENCH_PROGS),$(eval $(call prog_rule,$(patsubst %.c,%.o,$(p)),$(B)/bench)))

$(B)/tests/unit/%: $(B)/obj/tests/unit/%.o $(LIBXFER)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $< -o $@ $(LINK_LIBS) -lcmocka

deps:
	@bash mk/deps.sh

# The Python package into a venv, offline (mk/python.sh; README "Python").
PYTHON ?= /usr/bin/python3
PY_VENV ?= $(B)/venv
python: $(LIBXFER_SO)
	@B=$(B) PYTHON=$(PYTHON) bash mk/python.sh $(PY_VENV)

test: deps
	@$(MAKE) --no-print-directory all
	@B=$(B) bash tests/run.sh

test-unit: all
	@B=$(B) bash tests/run.sh unit

demo: deps
	@$(MAKE) --no-print-directory all
	@B=$(B) bash mk/demo.sh

bench: deps
	@bash mk/deps.sh bench
	@$(MAKE) --no-print-directory all
	@B=$(B) bash bench/run.sh

# GPU paths against their CUDA ceilings (a GPU machine; exits 77 without one)
bench-gpu: deps
	@$(MAKE) --no-print-directory all
	@B=$(B) bash bench/gpu.sh

install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include/xfer
	install -m 755 $(BIN_TARGETS) $(DESTDIR)$(PREFIX)/bin/
	install -m 755 $(LIBXFER_SO) $(DESTDIR)$(PREFIX)/lib/libxfer.so.$(XFER_SOVERSION)
	ln -sf libxfer.so.$(XFER_SOVERSION) $(DESTDIR)$(PREFIX)/lib/libxfer.so
	install -m 644 $(PUBLIC_HEADERS) $(DESTDIR)$(PREFIX)/include/xfer/
	-[[ -n "$(DESTDIR)" ]] || ldconfig

format:
	clang-format -i $(shell git ls-files '*.c' '*.h' '*.cu')

clean:
	rm -rf build build-san build-fuzz dist

.PHONY: all deps test test-unit demo bench bench-gpu install format clean python

-include $(shell find $(B)/obj -name '*.d' 2>/dev/null)
