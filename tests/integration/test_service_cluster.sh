#!/usr/bin/env bash
# Three xferd on three hosts (network namespaces + veth + bridge), Redis
# reachable from all: named transfers between every pair in both directions
# (WRITE by the source's owner, READ by the destination's owner) and
# third-party copies asked of the node owning neither side, each verified by
# checksum; the exact redis-cli view; a node with the wrong secret; and the
# control-path benchmark (small named transfers per second over the unix
# socket).
set -u
cd "${XFER_ROOT:-.}"
B=${B:-build}
source tests/lib/netns.sh
source tests/lib/service.sh
netns_available || { echo "SKIP: needs root and ip netns"; exit 77; }
command -v redis-server >/dev/null || { echo "SKIP: redis-server not installed"; exit 77; }
trap 'svc_cleanup; redis_stop; netns_down' EXIT
svc_init
svc_cluster_up 3

# Every ordered pair, three ways.
MiB=$((1 << 20))
for a in 1 2 3; do
    for b in 1 2 3; do
        ((a == b)) && continue
        c=$((6 - a - b))
        len=$((100000 + a * 1000 + b))
        head -c "$len" /dev/urandom >"$SVC_DIR/src.bin"
        want=$(sum_of "$SVC_DIR/src.bin")
        ctl "n$a" put "$SVC_DIR/src.bin" "n$a/r1" || fail "put on n$a"
        ctl "n$a" copy "n$a/r1" "n$b/r1+$MiB" "$len" >/dev/null || fail "write n$a -> n$b"
        ctl "n$b" copy --op read "n$a/r1" "n$b/r1+$((2 * MiB))" "$len" >/dev/null \
            || fail "read n$b <- n$a"
        out=$(ctl "n$c" copy "n$a/r1" "n$b/r1+$((3 * MiB))" "$len") || fail "third-party on n$c: n$a -> n$b"
        [[ $out == *"by n$a"* ]] || fail "third-party copy not carried out by n$a: $out"
        for k in 1 2 3; do
            ctl "n$b" get "n$b/r1+$((k * MiB))" "$len" "$SVC_DIR/out.bin" || fail "get n$b"
            [[ $(sum_of "$SVC_DIR/out.bin") == "$want" ]] || fail "checksum n$a -> n$b (way $k)"
        done
        # Reading it back from a third node, inline, over the control path.
        [[ $(ctl "n$c" read "n$b/r1+$MiB" 64 | sha256sum) == $(head -c 64 "$SVC_DIR/src.bin" | sha256sum) ]] \
            || fail "inline read of n$b via n$c"
    done
done
echo "pairs: 6 x (write, read, third-party) verified by sha256"

# Block-level copy between equal layouts across hosts.
for i in 1 2; do
    ctl "n$i" register kv 1M --layout bf16:4096:128:2:model-a || fail "register kv on n$i"
done
ctl n3 register kvx 1M --layout fp8:4096:128:2:model-a || fail "register kvx on n3"
ctl n1 write 'n1/kv+16384' 'block four' || fail "write block"
ctl n1 copy 'n1/kv#2' 'n2/kv#5' 1 >/dev/null || fail "block copy n1 -> n2"
[[ $(ctl n2 read 'n2/kv+40960' 10) == 'block four' ]] || fail "block copy content"
out=$(ctl n1 copy 'n1/kv#0' 'n3/kvx#0' 1 2>&1) && fail "layout mismatch accepted"
[[ $out == *"layouts disagree"* ]] || fail "layout mismatch message: $out"

# One batch mixing engine-batched items, a forwarded (third-party) item and
# failing ones: each item gets its own status, the good ones land.
ctl n1 write n1/r1+500000 'batched bytes' || fail "write for batch"
ctl n2 write n2/r1+600000 'forwarded one' || fail "write for batch"
cat >"$SVC_DIR/batch.txt" <<B
n1/r1+500000 n2/r1+500000 13
n1/r1+500000 n3/r1+500000 13
n1/r1+500000 ghost/r1 13
n1/r1+500000 n2/ro 13
n2/r1+600000 n3/r1+600000 13
n2/r1+600000 n1/r1+510000 13
B
out=$(ctl n1 --json batch "$SVC_DIR/batch.txt") && fail "batch with bad items succeeded"
python3 -c '
import json, sys
r = json.loads(sys.argv[1])
st = [i["status"] for i in r["items"]]
assert st[0] == 0 and st[1] == 0 and st[4] == 0 and st[5] == 0, st
assert st[2] != 0 and "unknown node" in r["items"][2]["message"], r["items"][2]
assert st[3] != 0 and "read-only" in r["items"][3]["message"], r["items"][3]
assert r["items"][4]["executor"] == "n2", r["items"][4]
' "$out" || fail "batch results: $out"
[[ $(ctl n3 read n3/r1+500000 13) == 'batched bytes' && $(ctl n3 read n3/r1+600000 13) == 'forwarded one' &&
   $(ctl n1 read n1/r1+510000 13) == "forwarded one" ]] || fail "batch contents"
echo "mixed batch: per-item results ok"

# The registry as redis-cli sees it: exactly the documented keys and fields.
python3 - "$REDIS_PORT" <<'PY' || fail "redis-cli view"
import subprocess, sys
port = sys.argv[1]
def cli(*a):
    return subprocess.run(["redis-cli", "-p", port, *a], capture_output=True, text=True).stdout.split("\n")[:-1]
keys = set(cli("--scan", "--pattern", "xfer:*"))
want = {"xfer:nodes"}
for n in ("n1", "n2", "n3"):
    want |= {f"xfer:node:{{{n}}}", f"xfer:regions:{{{n}}}", f"xfer:region:{{{n}}}:r1", f"xfer:region:{{{n}}}:ro"}
want |= {"xfer:region:{n1}:kv", "xfer:region:{n2}:kv", "xfer:region:{n3}:kvx"}
assert keys == want, f"keys differ: extra {keys - want}, missing {want - keys}"
node_fields = {"host", "addr", "ctrl_port", "data_port", "transports", "gpus", "nics", "host_id",
               "pid", "version", "started_ms", "heartbeat_ms", "incarnation"}
region_fields = {"id", "gen", "kind", "device", "addr", "len", "access", "rkeys", "ipc",
                 "created_ms", "dtype", "block_bytes", "num_blocks", "layers", "tag"}
for n in ("n1", "n2", "n3"):
    h = cli("hgetall", f"xfer:node:{{{n}}}")
    f = dict(zip(h[0::2], h[1::2]))
    assert set(f) == node_fields, f"node fields of {n}: {sorted(f)}"
    assert int(cli("ttl", f"xfer:node:{{{n}}}")[0]) > 0, "node key without TTL"
    assert f["transports"] == "tcp", f
    r = cli("hgetall", f"xfer:region:{{{n}}}:r1")
    r = dict(zip(r[0::2], r[1::2]))
    assert set(r) == region_fields, f"region fields of {n}: {sorted(r)}"
    assert r["len"] == str(4 << 20) and r["access"] == "rw", r
    assert set(cli("smembers", f"xfer:regions:{{{n}}}")) >= {"r1", "ro"}
members = cli("zrange", "xfer:nodes", "0", "-1")
assert sorted(members) == ["n1", "n2", "n3"], members
print("redis-cli view ok:", len(keys), "keys")
PY

# A node with the wrong secret is refused by its peers, clearly.
svc_start bad 3 --listen "${NETNS_IP[3]}" --redis-url "$CLUSTER_REDIS" --ttl-ms 2000 \
    --secret not-the-secret --transports tcp --region r1:1M:rw
svc_wait_ready bad
out=$(ctl bad copy bad/r1 n1/r1 100 2>&1) && fail "wrong secret accepted"
[[ $out == *auth* || $out == *secret* || $out == *proof* ]] || fail "wrong secret message: $out"
out=$(ctl bad copy n1/r1 n2/r1 100 2>&1) && fail "forward with wrong secret accepted"
echo "wrong secret: $out"
svc_kill bad

# Control-path benchmark: small named transfers through xferd (unix socket).
count=20000
[[ $B == *san* ]] && count=2000
for args in "--depth 1" "--depth 16" "--depth 16 --batch 32"; do
    ctl n1 bench n1/r1 n2/r1+3M --count "$count" --size 64 $args || fail "bench $args"
    ctl n1 bench n1/r1 n1/r1+3M --count "$count" --size 64 $args || fail "local bench $args"
done
# Third-party: asked of n3, forwarded to n1 over a pooled control connection.
for args in "--depth 1" "--depth 16"; do
    ctl n3 bench n1/r1 n2/r1+3M --count $((count / 4)) --size 64 $args || fail "third-party bench $args"
done
ctl n1 probe n1/r1 n2/r1 --size 1M --count 8 || fail "probe"
ctl n2 stats || fail "stats"
ctl n3 stats n1 | grep -q 'node n1' || fail "stats of another node"
svc_stop_all_checked
echo "cluster test passed"
