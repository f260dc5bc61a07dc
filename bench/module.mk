# Benchmarks (build/bench/<name>); bench/run.sh runs them with iperf3 as the ceiling.
BENCH_PROGS += bench_tcp:bench/bench_tcp.c
BENCH_PROGS += bench_call:bench/bench_call.c
BENCH_PROGS += bench_pool:bench/bench_pool.c
BENCH_PROGS += bench_notify:bench/bench_notify.c
