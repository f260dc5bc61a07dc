# Benchmarks (build/bench/<name>); bench/run.sh runs them with iperf3 as the ceiling.
BENCH_PROGS += bench_tcp:bench/bench_tcp.c
# xfer_bench: the library-level bench with knobs; pingpong and memcpy_bw are
# the floors/ceilings it is compared with (bench/run.sh).
BENCH_PROGS += xfer_bench:bench/xfer_bench.c pingpong:bench/pingpong.c memcpy_bw:bench/memcpy_bw.c
# The bench itself is service/xbench.c (in libxfer.a, not libxfer.so) so that
# xfer_bench and `xferctl bench` run the same code; bench_util.h lives beside
# it in service/ (found through -Iservice).
BENCH_PROGS += bench_call:bench/bench_call.c
BENCH_PROGS += bench_pool:bench/bench_pool.c
BENCH_PROGS += bench_notify:bench/bench_notify.c
BENCH_PROGS += bench_pool_gpu:bench/bench_pool_gpu.c
# spin_idle: SCHED_IDLE loops that keep the cores out of idle (bench_all.py's warm-core rows)
BENCH_PROGS += spin_idle:bench/spin_idle.c
