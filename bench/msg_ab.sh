#!/usr/bin/env bash
# Interleaved A/B of message round trips (docs/notify.md: "Per-message
# allocations", "tcp: the blocking round trip", "ipc: the blocking round
# trip"): per round the raw pingpong --size 56, then every (variant, probe)
# in an order that rotates per round: bench_notify --transport $TRANSPORT
# (default tcp) --only PROBE --iters ITERS, its p50 round trip (us;
# sendrecv* = 2 x one way) and the TCP segments sent per round trip
# (/proc/net/snmp OutSegs, both directions: 4 for a tcp message round trip
# matched on arrival, 8 when each RTS comes before its RECV and a FIN
# follows, 2 + ACKs for XFER_SEND_LOCAL; about 0 over ipc). Prints one line
# per run ("R<round> label probe p50 segments") and, at the end, the
# medians with their ratio to the ping-pong. The segment counts are the
# network namespace's: only meaningful on an otherwise quiet host (the lent
# GPU machine; not the shared dev VM). SPIN_FLOOR=1 adds, per round, the
# ping-pong with both sides busy-polling (pingpong --spin: the floor for
# variants run with XFER_BUSY_POLL_US), reported beside the blocking one.
#   [TRANSPORT=tcp|ipc] bench/msg_ab.sh ROUNDS ITERS PINGPONG LABEL=BENCH_NOTIFY[,VAR=VALUE...]:PROBE[+PROBE...] ...
# e.g. bench/msg_ab.sh 7 3000 build/bench/pingpong \
#        main=/tmp/main/bench_notify:notify-pp+sendrecv \
#        new=build/bench/bench_notify:notify-pp+sendrecv+sendrecv-local \
#        new-lazy=build/bench/bench_notify,XFER_TCP_LAZY_TARGET=1:sendrecv
# (the two-build form of earlier notes, "msg_ab.sh BASE NEW 5 3000", is
#  "msg_ab.sh 5 3000 NEW/pingpong base=BASE/bench_notify:notify-pp+sendrecv+sendrecv-pre
#  new=NEW/bench_notify:notify-pp+sendrecv+sendrecv-pre"; ab_ipc_msg.sh's is the same with TRANSPORT=ipc)
set -u
transport=${TRANSPORT:-tcp}
rounds=$1 iters=$2 pingpong=$3
shift 3
segs() { awk '/^Tcp:/ { if (!h) { for (i = 1; i <= NF; i++) if ($i == "OutSegs") c = i; h = 1 } else print $c }' /proc/net/snmp; }
runs=() # "label prog env probe"
for v in "$@"; do
    label=${v%%=*} rest=${v#*=}
    spec=${rest%%:*} probes=${rest##*:}
    prog=${spec%%,*} envs=
    [[ $spec == *,* ]] && envs=${spec#*,}
    for p in ${probes//+/ }; do runs+=("$label $prog ${envs:-_} $p"); done
done
one() { # label prog env probe
    local s0 s1 v env=()
    [ "$3" = _ ] || IFS=, read -ra env <<<"$3"
    s0=$(segs)
    v=$(env "${env[@]}" "$2" --transport "$transport" --only "$4" --iters "$iters" 2>/dev/null | tail -1 |
        awk '{print $(NF-1)}')
    s1=$(segs)
    [ "$4" = notify-pp ] || v=$(awk -v v="$v" 'BEGIN {printf "%.1f", 2 * v}')
    echo "$1 $4 $v $(awk -v a="$s0" -v b="$s1" -v n="$iters" 'BEGIN {printf "%.2f", (b - a) / n}')"
}
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
n=${#runs[@]}
for r in $(seq 1 "$rounds"); do
    pp=$("$pingpong" --size 56 --seconds 1 --json | sed 's/.*"p50":\([0-9.]*\).*/\1/')
    echo "R$r pingpong - $pp -" | tee -a "$tmp"
    if [ "${SPIN_FLOOR:-0}" = 1 ]; then
        pp=$("$pingpong" --size 56 --seconds 1 --spin --json | sed 's/.*"p50":\([0-9.]*\).*/\1/')
        echo "R$r pingpong-spin - $pp -" | tee -a "$tmp"
    fi
    for k in $(seq 0 $((n - 1))); do # every run takes every place once in n rounds
        one ${runs[$(((k + r) % n))]} | sed "s/^/R$r /" | tee -a "$tmp"
    done
done
python3 - "$tmp" <<'PY'
import collections, statistics as st, sys
pp, spin, v, s = [], [], collections.defaultdict(list), collections.defaultdict(list)
for f in (l.split() for l in open(sys.argv[1])):
    if f[1] == "pingpong":
        pp.append(float(f[3]))
    elif f[1] == "pingpong-spin":
        spin.append(float(f[3]))
    elif f[3] != "":
        v[f[1], f[2]].append(float(f[3])); s[f[1], f[2]].append(float(f[4]))
m = st.median(pp)
print("medians of %d rounds: raw ping-pong %.1f us" % (len(pp), m))
if spin:
    print("  raw ping-pong, both sides busy-polling: %.1f us" % st.median(spin))
for k in sorted(v, key=lambda k: (k[1], k[0])):
    print("  %-12s %-15s %6.1f us (%.2fx)  %5.1f-%5.1f  segments %.2f" %
          (k[0], k[1], st.median(v[k]), st.median(v[k]) / m, min(v[k]), max(v[k]), st.median(s[k])))
PY
