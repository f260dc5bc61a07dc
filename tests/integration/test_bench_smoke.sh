#!/usr/bin/env bash
# Smoke run of the bench programs (no speed targets here: those live in
# make bench). xfer_bench (and `xferctl bench`, the same code) moves data
# both ways over tcp and ipc with the data
# verified before and after the timed run, and reports non-zero rates and
# latencies; the raw ping-pong and memcpy ceiling report non-zero numbers.
set -u
B=${B:-build}
bin=$XFER_ROOT/$B/bench
fail() { echo "FAIL: $*" >&2; exit 1; }
positive() { # json, key path (python expression on r)
    python3 -c 'import json,sys; r=json.loads(sys.argv[1]); v=eval(sys.argv[2]); sys.exit(0 if v > 0 else 1)' "$1" "$2"
}
prog=("$bin/xfer_bench")
run() { # args...
    local out
    out=$(timeout 60 "${prog[@]}" --seconds 0.3 --warmup 0 --verify --json "$@") ||
        fail "${prog[*]} $*"
    echo "$out"
    positive "$out" 'r["ops"]' || fail "no ops/s: $*"
    positive "$out" 'r["lat_us"]["p50"]' || fail "no latency: $*"
    positive "$out" 'r["gbps"]' || fail "no GB/s: $*"
    python3 -c 'import json,sys; sys.exit(0 if json.loads(sys.argv[1])["verified"] else 1)' "$out" ||
        fail "data not verified: $*"
}
run --op write --size 8
"$bin/xfer_bench" --bogus 2>/dev/null; [[ $? == 2 ]] || fail "unknown option accepted"
run --op read --size 8
run --op read --size 64K --batch 16 --depth 2 --sockets 2 --threads 2
run --op write --size 1M --batch 4 --depth 2 --sockets 4 --chunk 256K
XFER_BUSY_POLL_US=50 run --op write --size 4K --batch 8
XFER_TCP_DIRECT=0 run --op write --size 8
run --op write --size 64K --batch 4 --transport ipc
run --op read --size 8 --transport ipc
run --op read --size 4M --batch 4 --depth 2 --transport ipc # copy threads, pieces
run --op write --size 1M --batch 16 --depth 2 --transport ipc --slots 1
# small posts over several sockets are sent by the submitter, bulk ones by
# the progress threads (tcp_post); the warm-up over a scratch pair
run --op write --size 4K --batch 8 --depth 2 --sockets 2 --threads 2
run --op write --size 1M --batch 8 --depth 2 --sockets 2 --warmup 0.1 --warm-scratch
# --callers: threads of one engine calling xfer_write / xfer_read each
run --op write --size 4K --callers 4 --sockets 2
run --op read --size 8 --callers 3 --transport ipc
out=$(timeout 60 "$bin/xfer_bench" --callers 3 --count 40 --seconds 30 --json) || fail "--callers --count"
python3 -c 'import json,sys; sys.exit(0 if json.loads(sys.argv[1])["batches"] == 120 else 1)' "$out" ||
    fail "--callers 3 --count 40: not 120 calls: $out"
out=$(timeout 60 "$bin/xfer_bench" --fresh --size 1M --batch 4 --depth 4 --sockets 2 --json) ||
    fail "--fresh"
echo "$out"
positive "$out" 'r["gbps"]' || fail "--fresh: no GB/s"
python3 -c 'import json,sys; sys.exit(0 if json.loads(sys.argv[1])["batches"] == 4 else 1)' "$out" ||
    fail "--fresh: not one pass of 4 batches"
# bad input: a clear error and exit 2, no crash
"$bin/xfer_bench" --size 0 2>/dev/null; [[ $? == 2 ]] || fail "--size 0 not refused"
"$bin/xfer_bench" --op copy 2>/dev/null; [[ $? == 2 ]] || fail "--op copy not refused"
"$bin/xfer_bench" --batch 5000 2>/dev/null; [[ $? == 2 ]] || fail "--batch 5000 not refused"
"$bin/xfer_bench" --slots 1 --fresh 2>/dev/null; [[ $? == 2 ]] || fail "--slots with --fresh not refused"
"$bin/xfer_bench" --callers 2 --batch 4 2>/dev/null; [[ $? == 2 ]] || fail "--callers with --batch not refused"
"$bin/xfer_bench" --callers 65 2>/dev/null; [[ $? == 2 ]] || fail "--callers 65 not refused"

# xferctl bench runs the same code (bench/xbench.c), no xferd needed.
prog=("$XFER_ROOT/$B/bin/xferctl" bench)
run --op write --size 64K --batch 4 --depth 2 --sockets 2 --threads 2
run --op read --size 8 --transport ipc
"${prog[@]}" --sockets 0 2>/dev/null; [[ $? == 2 ]] || fail "xferctl bench --sockets 0 not refused"
"${prog[@]}" --transport rdma-ish 2>/dev/null; [[ $? == 2 ]] || fail "xferctl bench: bad transport"

out=$(timeout 30 "$bin/pingpong" --seconds 0.2 --json) || fail pingpong
echo "$out"
positive "$out" 'r["rtt_per_s"]' || fail "pingpong: no round trips"
positive "$out" 'r["lat_us"]["p50"]' || fail "pingpong: no latency"
out=$(timeout 30 "$bin/pingpong" --seconds 0.2 --spin --json) || fail "pingpong --spin"
positive "$out" 'r["rtt_per_s"]' || fail "pingpong --spin: no round trips"
out=$(timeout 30 "$bin/memcpy_bw" --sizes 4K,1M --seconds 0.1 --json) || fail memcpy_bw
echo "$out"
while read -r line; do
    positive "$line" 'r["gbps"]' || fail "memcpy_bw: zero rate"
done <<<"$out"
echo "bench smoke: ok"
