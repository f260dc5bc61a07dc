#!/usr/bin/env bash
# Interleaved A/B of the ipc message round trips against the raw TCP
# ping-pong (docs/notify.md, "ipc: the blocking round trip"):
#   bench/ab_ipc_msg.sh BASE_BUILD NEW_BUILD [rounds] [iters]
# Each round runs pingpong --size 56, then for each build bench_notify
# --transport ipc --only sendrecv | sendrecv-pre | notify-pp; prints one
# line per run (the round trip in us: ping-pong, 2 x one way, notification
# round trip) and the medians of the rounds.
set -u
A=$1 B=$2 R=${3:-5} N=${4:-2000}
out=$(mktemp)
for r in $(seq "$R"); do
    pp=$("$A"/bench/pingpong --size 56 2>/dev/null | sed -n 's/.*round trip p50 \([0-9.]*\) us.*/\1/p')
    echo "$r pingpong - $pp" | tee -a "$out"
    for side in base:"$A" new:"$B"; do
        name=${side%%:*} dir=${side#*:}
        for only in sendrecv sendrecv-pre notify-pp; do
            v=$("$dir"/bench/bench_notify --transport ipc --only $only --iters "$N" 2>/dev/null |
                awk '/one way/ {print 2 * $(NF-1)} /notification round trip/ {print $(NF-1)}')
            echo "$r $only $name $v" | tee -a "$out"
        done
    done
done
echo "medians of $R rounds (round trip, us):"
awk '{k = $2 " " $3; v[k] = v[k] " " $4} END {for (k in v) print k, v[k]}' "$out" | sort |
    while read -r what who vals; do
        med=$(echo "$vals" | tr ' ' '\n' | sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}')
        echo "  $what $who: $med  ($vals)"
    done
rm -f "$out"
