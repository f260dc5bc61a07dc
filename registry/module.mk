# Registry layer: Redis schema, publisher, cache, watcher (hiredis).
LIB_SRCS += $(wildcard registry/*.c)
BENCH_PROGS += bench_registry:bench/bench_registry.c
BENCH_PROGS += bench_fleet:bench/bench_fleet.c
