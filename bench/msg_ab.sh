#!/usr/bin/env bash
# Message round trips of two builds against the raw TCP ping-pong, in
# interleaved rounds (docs/notify.md, "Per-message allocations"): per round
# the raw ping-pong p50, then for each build (order alternating per round)
# the p50 of the notification round trip (bench_notify --only notify-pp),
# the 8 B send/recv round trip, blocking (--only sendrecv, 2 x one way) and
# with receives posted ahead (--only sendrecv-pre). Prints one line per
# round and the medians of the rounds with their ratio to the ping-pong.
#   bench/msg_ab.sh BASE_BENCH_DIR NEW_BENCH_DIR [ROUNDS=5] [ITERS=2000]
# (a *_BENCH_DIR holds bench_notify; pingpong is taken from the new one)
set -eu
base=$1 new=$2 rounds=${3:-5} iters=${4:-2000}
run() { # $1 dir, $2 probe: p50 round trip in µs
    local out
    out=$("$1/bench_notify" --transport tcp --only "$2" --iters "$iters" 2>/dev/null)
    case $2 in
    notify-pp) echo "$out" | awk '/round trip/ {print $(NF-1)}' ;;
    *) echo "$out" | awk '/one way/ {printf "%.1f\n", 2 * $(NF-1)}' ;;
    esac
}
probes="notify-pp sendrecv sendrecv-pre"
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
for r in $(seq 1 "$rounds"); do
    pp=$("$new/pingpong" --size 56 --seconds 1 --json | sed 's/.*"p50":\([0-9.]*\).*/\1/')
    line="round $r: pingpong $pp"
    echo "pp $pp" >>"$tmp"
    order="base new"
    [ $((r % 2)) -eq 0 ] && order="new base"
    for b in $order; do
        dir=$base
        [ "$b" = new ] && dir=$new
        for p in $probes; do
            v=$(run "$dir" "$p")
            line="$line | $b $p $v"
            echo "$b-$p $v" >>"$tmp"
        done
    done
    echo "$line"
done
median() { sort -n | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
ppm=$(awk '$1 == "pp" {print $2}' "$tmp" | median)
echo "medians of $rounds rounds (p50 round trip, us; ratio to the ping-pong $ppm):"
for p in $probes; do
    b=$(awk -v k="base-$p" '$1 == k {print $2}' "$tmp" | median)
    n=$(awk -v k="new-$p" '$1 == k {print $2}' "$tmp" | median)
    awk -v p="$p" -v b="$b" -v n="$n" -v pp="$ppm" \
        'BEGIN {printf "  %-13s base %6.1f (%.2fx)  new %6.1f (%.2fx)\n", p, b, b / pp, n, n / pp}'
done
