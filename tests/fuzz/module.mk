# libFuzzer targets, built with clang: `make fuzz FUZZ_SECONDS=60`.
# Each tests/fuzz/fuzz_*.c is linked with the library sources rebuilt under
# -fsanitize=fuzzer-no-link,address,undefined, and starts from its committed
# seeds (tests/fuzz/corpus/NAME/, made by tests/fuzz/mkseeds.c).
#
# `make test` runs each target without libFuzzer too: $(B)/tests/replay_NAME
# (gcc, tests/fuzz/replay.c) replays the seeds and a fixed-seed set of
# mutations of them (tests/integration/test_fuzz_replay.sh).
FUZZ_SECONDS ?= 30
FUZZ_SRCS := $(sort $(wildcard tests/fuzz/fuzz_*.c))
FUZZ_B := build-fuzz
REPLAY_BINS := $(patsubst tests/fuzz/fuzz_%.c,$(B)/tests/replay_%,$(FUZZ_SRCS))

all: $(REPLAY_BINS) $(B)/tests/fuzz_mkseeds

# (the library by its path: this file is read before the Makefile sets
# LIBXFER, and prerequisites expand at once)
$(B)/tests/replay_%: $(B)/obj/tests/fuzz/fuzz_%.o $(B)/obj/tests/fuzz/replay.o $(B)/lib/libxfer.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $(filter %.o,$^) -o $@ $(LINK_LIBS)

$(B)/tests/fuzz_mkseeds: $(B)/obj/tests/fuzz/mkseeds.o $(B)/lib/libxfer.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $< -o $@ $(LINK_LIBS)

fuzz: deps
	@$(MAKE) --no-print-directory B=$(FUZZ_B) CC=clang \
	    SANFLAGS='-fsanitize=fuzzer-no-link,address,undefined' XFER_WITH_CUDA=0 \
	    $(FUZZ_B)/lib/libxfer.a
	@set -e; for f in $(FUZZ_SRCS); do \
	    n=$$(basename $$f .c); mkdir -p $(FUZZ_B)/fuzz/corpus-$$n; \
	    clang $(filter-out -I$(B)/gen,$(CPPFLAGS)) -I$(FUZZ_B)/gen -g -O1 \
	        -fsanitize=fuzzer,address,undefined $$f -o $(FUZZ_B)/fuzz/$$n \
	        $(FUZZ_B)/lib/libxfer.a $(EXT_LIBS) $(VERBS_LIBS) -pthread; \
	    echo "fuzz: $$n for $(FUZZ_SECONDS)s"; \
	    $(FUZZ_B)/fuzz/$$n -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
	        $(FUZZ_B)/fuzz/corpus-$$n tests/fuzz/corpus/$${n#fuzz_} 2>&1 | tail -n 3; \
	done

.PHONY: fuzz
