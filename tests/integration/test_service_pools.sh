#!/usr/bin/env bash
# KV pools through xferd and xferctl (docs/service.md "KV pools"): two xferd
# (n1, n2) and a real redis-server. Pools from the config (--pool, a
# `pool =` line) and pool-create (host memory), the pools
# listing (own and a peer's, text and --json, and redis-cli's view), block
# copies WRITE and READ between a vLLM-layout pool and a FlashInfer one with
# every byte of every member checked against a model of both layouts
# (written here, not taken from the library), a layer range, mismatches
# refused naming the field, bad input, pool-delete.
set -u
cd "${XFER_ROOT:-.}"
B=${B:-build}
source tests/lib/service.sh
trap 'svc_cleanup; redis_stop' EXIT
svc_init
svc_redis_up
out=$("$XFERD" --node bad --redis-url "$REDIS_URL" --pool 'p=vllm_fa:bf16:4K' 2>&1); rc=$?
((rc == 2)) && [[ $out == *"bad pool geometry"* ]] || fail "xferd --pool with a bad geometry: rc=$rc '$out'"
printf 'pool = cfgf=sglang:bf16:1K:8:2\n' >"$SVC_DIR/n1.conf"
svc_start n1 0 --redis-url "$REDIS_URL" --transports tcp --config "$SVC_DIR/n1.conf" \
    --pool 'cfgp=mla:fp8:1K:16:2'
svc_start n2 0 --redis-url "$REDIS_URL" --transports tcp
svc_wait_ready n1
svc_wait_ready n2
D=$SVC_DIR
B_=4096 N=64 L=4 # block bytes, blocks, layers (K and V halves)

ctl n1 pool-create kv vllm_fa:bf16:4K:64:4:2:llama >"$D/c1" || fail "pool-create vllm_fa"
grep -q '^kv  *vllm_fa  *bf16  *4096  *64  *4  *2 .*llama  *kv.0,kv.1,kv.2,kv.3$' "$D/c1" ||
    fail "pool-create printed: $(cat "$D/c1")"
ctl n2 pool-create kv flashinfer:bf16:4K:64:4:2:llama >/dev/null || fail "pool-create flashinfer"
ctl n2 pool-create kv8 vllm_fa:fp8:4K:64:4:2:llama >/dev/null || fail "pool-create fp8"
ctl n2 pool-create kvl vllm_fa:bf16:4K:64:2:2:llama >/dev/null || fail "pool-create 2 layers"
ctl n2 pool-create kvt vllm_fa:bf16:4K:64:4:2:other >/dev/null || fail "pool-create other tag"

# Pools from the config (a file line and a flag), made at start.
ctl n1 pools | grep -q '^cfgp  *mla  *fp8  *1024  *16  *2  *1 .* cfgp.0,cfgp.1$' ||
    fail "--pool: $(ctl n1 pools)"
ctl n1 pools | grep -q '^cfgf  *sglang  *bf16 .* cfgf.0,cfgf.1,cfgf.2,cfgf.3$' ||
    fail "pool = in the config file: $(ctl n1 pools)"

# Listings: own, a peer's (from Redis), --json, redis-cli.
ctl n1 pools | grep -q '^kv  *vllm_fa' || fail "pools: $(ctl n1 pools)"
wait_for 10 ctl n1 pools n2 || fail "n1 cannot list n2's pools"
ctl n1 --json pools n2 >"$D/p2.json" || fail "pools n2 --json"
python3 - "$D/p2.json" <<'PY' || fail "pools --json: $(cat "$D/p2.json")"
import json, sys
ps = {p["name"]: p for p in json.load(open(sys.argv[1]))}
assert set(ps) == {"kv", "kv8", "kvl", "kvt"}, ps.keys()
kv = ps["kv"]
assert kv["node"] == "n2" and kv["layout"] == "flashinfer" and kv["dtype"] == "bf16", kv
assert kv["block_bytes"] == 4096 and kv["num_blocks"] == 64 and kv["layers"] == 4, kv
assert kv["kv"] == 2 and kv["tag"] == "llama" and kv["shard"] == "0/1", kv
assert kv["regions"] == ["kv.0", "kv.1", "kv.2", "kv.3"], kv
assert ps["kvl"]["layers"] == 2 and ps["kv8"]["dtype"] == "fp8"
PY
[[ $(redis-cli -p "$REDIS_PORT" hget 'xfer:pool:{n1}:kv' layout) == vllm_fa ]] ||
    fail "redis: $(redis-cli -p "$REDIS_PORT" hgetall 'xfer:pool:{n1}:kv')"
[[ $(redis-cli -p "$REDIS_PORT" hget 'xfer:pool:{n1}:kv' regions) == kv.0,kv.1,kv.2,kv.3 ]] ||
    fail "redis members"

# Random bytes in every member of n1/kv (each 2 * 64 * 4 KiB = 512 KiB).
for l in 0 1 2 3; do
    head -c $((2 * N * B_)) /dev/urandom >"$D/src$l"
    ctl n1 put "$D/src$l" "n1/kv.$l" || fail "fill n1/kv.$l"
done

check() { # expected moves "s:d[:layers]" ...; dumps n2/kv and compares all of it
    for l in 0 1 2 3; do
        ctl n2 get "n2/kv.$l" $((2 * N * B_)) "$D/dst$l" || fail "dump n2/kv.$l"
    done
    python3 - "$D" "$@" <<'PY'
import sys
d, moves = sys.argv[1], sys.argv[2:]
B, N, L = 4096, 64, 4
src = [open("%s/src%d" % (d, l), "rb").read() for l in range(L)]
dst = [open("%s/dst%d" % (d, l), "rb").read() for l in range(L)]
want = [bytearray(2 * N * B) for _ in range(L)]  # the rest must stay zero
for m in moves:
    s, t, *lay = m.split(":")
    lo, hi = (int(x) for x in lay[0].split("-")) if lay else (0, L - 1)
    for l in range(lo, hi + 1):
        for h in (0, 1):
            so = h * N * B + int(s) * B        # vLLM FlashAttention: [2][N][B]
            do = (int(t) * 2 + h) * B          # FlashInfer: [N][2][B]
            want[l][do:do + B] = src[l][so:so + B]
for l in range(L):
    if bytes(want[l]) != dst[l]:
        bad = next(i for i in range(len(dst[l])) if dst[l][i] != want[l][i])
        sys.exit("layer %d differs first at byte %d (block %d)" % (l, bad, bad // (2 * B)))
PY
}

# WRITE by n1: blocks 7,19,3 -> 40,2,11, all layers.
out=$(ctl n1 copy 'n1/kv#7,19,3' 'n2/kv#40,2,11') || fail "pool copy: $out"
[[ $out == "copied 3 block(s) n1/kv -> n2/kv (by n1: "*" 98304 bytes, tcp,"* ]] || fail "copy said '$out'"
check 7:40 19:2 3:11 || fail "WRITE 7,19,3 -> 40,2,11"
# READ by n2 (it owns the destination), a range, layers 1-2 only.
out=$(ctl n2 --json copy 'n1/kv#20-22' 'n2/kv#50-52' --layers 1-2) || fail "pool copy READ: $out"
python3 -c 'import json,sys; o=json.loads(sys.argv[1]); assert o["executor"]=="n2" and o["blocks"]==3 and o["bytes"]==3*2*2*4096, o' "$out" ||
    fail "copy --json: $out"
check 7:40 19:2 3:11 20:50:1-2 21:51:1-2 22:52:1-2 || fail "READ 20-22 -> 50-52, layers 1-2"
# Asked of n1 with n1 owning the destination: READ from n2 back into n1.
ctl n1 copy 'n2/kv#40' 'n1/kv#63' >/dev/null || fail "READ into n1"
ctl n1 get n1/kv.0 $((2 * N * B_)) "$D/back0" || fail "dump n1/kv.0"
python3 - "$D" <<'PY' || fail "n1/kv#63 is not its block 7 after the round trip"
import sys
d, B, N = sys.argv[1], 4096, 64
s, b = open(d + "/src0", "rb").read(), open(d + "/back0", "rb").read()
for h in (0, 1):
    assert b[h * N * B + 63 * B:h * N * B + 64 * B] == s[h * N * B + 7 * B:h * N * B + 8 * B]
PY

# Mismatches: refused before anything moves, naming the field.
for t in "kv8:dtype" "kvl:layers" "kvt:tag"; do
    out=$(ctl n1 copy 'n1/kv#1' "n2/${t%%:*}#1" 2>&1); rc=$?
    ((rc == 1)) && [[ $out == *"vs n2/${t%%:*}: ${t#*:}: "*"(layouts disagree)" ]] ||
        fail "mismatch ${t%%:*}: rc=$rc '$out'"
done
check 7:40 19:2 3:11 20:50:1-2 21:51:1-2 22:52:1-2 || fail "a refused copy changed n2/kv"

# Bad input: clear error, nonzero exit.
expect() { # rc pattern args...
    local want=$1 pat=$2; shift 2
    local out rc
    out=$(ctl "$@" 2>&1); rc=$?
    ((rc == want)) && [[ $out == *$pat* ]] || fail "ctl $*: rc=$rc (want $want) '$out'"
}
expect 1 "nosuch" n1 copy 'n1/kv#1' 'nosuch/kv#1'
expect 1 "unknown node nosuch" n1 pools nosuch
expect 1 "unknown pool n1/nope" n1 copy 'n1/nope#1' 'n2/kv#1'
expect 1 "64" n1 copy 'n1/kv#64' 'n2/kv#1'
expect 1 "70" n1 copy 'n1/kv#1' 'n2/kv#70'
expect 2 "bad block list" n1 copy 'n1/kv#1,x' 'n2/kv#1,2'
expect 2 "bad pool blocks" n1 copy 'n1/kv#' 'n2/kv#1'
expect 2 "2 source blocks but 1 destination" n1 copy 'n1/kv#1,2' 'n2/kv#1'
expect 2 "bad --layers" n1 copy 'n1/kv#1' 'n2/kv#1' --layers 3-1
expect 1 "layer" n1 copy 'n1/kv#1' 'n2/kv#1' --layers 2-9
expect 2 "bad pool geometry" n1 pool-create x vllm_fa:bf16:4K
expect 2 "kv: must be 1 or 2" n1 pool-create x vllm_fa:bf16:4K:8:2:0
expect 1 "exists already" n1 pool-create kv vllm_fa:bf16:4K:64:4
expect 1 "both pools are on n1" n1 copy 'n1/kv#1' 'n1/kv#2'

# pool-delete removes the pool and its member regions.
ctl n2 pool-delete kvl || fail "pool-delete"
ctl n2 pools | grep -q '^kvl ' && fail "kvl still listed"
ctl n2 regions | grep -q 'kvl\.' && fail "kvl's regions left behind"
expect 1 "no such pool" n2 pool-delete kvl
svc_kill n1 TERM || fail "n1 exit status"
svc_kill n2 TERM || fail "n2 exit status"
echo "service pools: ok"
