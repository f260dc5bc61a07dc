#!/usr/bin/env bash
# make bench: xfer beside iperf3, ucx_perftest, a raw TCP ping-pong and
# memcpy, interleaved, one table of ratios, docs/BENCHMARKS.md with plots.
# Runs from a build tree on any machine (no Redis, no xferd). Needs
# $B/bench/{xfer_bench,pingpong,memcpy_bw} and python3; iperf3,
# ucx_perftest (ucx-utils) and gnuplot are optional (skipped with a note).
# Knobs: see bench/bench_all.py (XFER_BENCH_SECONDS, _ROUNDS, _STREAMS,
# _ONLY, _OUT, _PLOTS, _FRESH_MIB).
set -u
cd "$(dirname "$0")/.."
export B=${B:-build}
exec python3 bench/bench_all.py "$@"
