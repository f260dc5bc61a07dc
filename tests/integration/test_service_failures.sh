#!/usr/bin/env bash
# Failure handling across three hosts (network namespaces), short TTLs:
#  - Redis killed: transfers between cached peers keep working; restarted
#    empty: every node is back in Redis within a few seconds;
#  - kill -9 of a node: transfers to it fail fast with a clear error, its
#    keys expire within TTL + 2 s, the others get "leave";
#  - SIGTERM: drains, exits 0, removes the node's keys at once, "leave".
set -u
cd "${XFER_ROOT:-.}"
B=${B:-build}
source tests/lib/netns.sh
source tests/lib/service.sh
netns_available || { echo "SKIP: needs root and ip netns"; exit 77; }
command -v redis-server >/dev/null || { echo "SKIP: redis-server not installed"; exit 77; }
trap 'svc_cleanup; redis_stop; netns_down' EXIT
svc_init
TTL_MS=2000
svc_cluster_up 3
now_ms() { echo $(($(date +%s%N) / 1000000)); }
keys_of() { redis_cli exists "xfer:node:{$1}" "xfer:regions:{$1}" "xfer:region:{$1}:r1"; }

# Warm the peer caches: every node has talked to every other.
for a in 1 2 3; do for b in 1 2 3; do
    ((a == b)) || ctl "n$a" copy "n$a/r1" "n$b/r1+$((a * 4096))" 4096 >/dev/null || fail "warm n$a -> n$b"
done; done

# --- Redis down: cached peers keep working.
kill -9 "$REDIS_PID"; wait "$REDIS_PID" 2>/dev/null
ctl n1 write n1/r1+100000 'while redis is down' || fail "inline write"
ctl n1 copy n1/r1+100000 n2/r1+100000 19 >/dev/null || fail "n1 -> n2 while Redis is down"
ctl n3 copy --op read n2/r1+100000 n3/r1+100000 19 >/dev/null || fail "n3 <- n2 while Redis is down"
[[ $(ctl n3 read n3/r1+100000 19) == 'while redis is down' ]] || fail "content while Redis is down"
wait_for 10 bash -c "$XFERCTL --socket $SVC_DIR/n1.sock health | grep -q UNREACHABLE" \
    || fail "health does not report Redis down: $(ctl n1 health)"
echo "Redis down: transfers between cached peers work"

# --- Redis restarted empty: everything republished within a few seconds.
t0=$(now_ms)
redis_restart || fail "redis restart"
for i in 1 2 3; do
    wait_for 8 bash -c "[[ \$(redis-cli -p $REDIS_PORT exists 'xfer:node:{n$i}' 'xfer:region:{n$i}:r1' 'xfer:region:{n$i}:ro') == 3 ]]" \
        || fail "n$i not back in Redis: $(redis_cli keys 'xfer:*' | tr '\n' ' ')"
done
echo "Redis restarted empty: all nodes back after $(($(now_ms) - t0)) ms"
[[ $(redis_cli zcard xfer:nodes) == 3 ]] || fail "xfer:nodes after restart"

# --- kill -9 of n3.
t0=$(now_ms)
svc_kill n3 KILL
start=$(now_ms)
out=$(ctl n1 copy n1/r1 n3/r1 4096 2>&1) && fail "copy to a dead node succeeded"
took=$(($(now_ms) - start))
((took < 3000)) || fail "copy to a dead node took $took ms"
[[ $out == *n3* ]] || fail "dead-node error does not name n3: $out"
echo "copy to killed n3 failed in $took ms: $out"
wait_for $(((TTL_MS + 2000) / 1000 + 1)) bash -c "[[ \$(redis-cli -p $REDIS_PORT exists 'xfer:node:{n3}' 'xfer:regions:{n3}' 'xfer:region:{n3}:r1' 'xfer:region:{n3}:ro') == 0 ]]" \
    || fail "n3 keys still there: $(redis_cli keys '*n3*' | tr '\n' ' ')"
gone=$(($(now_ms) - t0))
((gone <= TTL_MS + 2000)) || fail "n3 keys took $gone ms to expire (TTL $TTL_MS)"
echo "n3 keys expired $gone ms after kill -9 (TTL $TTL_MS ms)"
for i in 1 2; do
    wait_for 5 grep -q 'event: leave n3' "$SVC_DIR/n$i.log" || fail "n$i did not get 'leave n3'"
done
out=$(ctl n2 copy n2/r1 n3/r1 4096 2>&1) && fail "copy to an expired node succeeded"
[[ $out == *"unknown node 'n3'"* ]] || fail "expired-node error: $out"
out=$(ctl n1 copy n3/r1 n2/r1 4096 2>&1) && fail "third-party copy from an expired node succeeded"
echo "after expiry: $out"

# --- n3 comes back (new incarnation), then is restarted before its keys
# expire: peers must drop the stale descriptors and reach the new process.
start_n3() {
    svc_start n3 3 --listen "${NETNS_IP[3]}" --redis-url "$CLUSTER_REDIS" --ttl-ms "$TTL_MS" \
        --secret clustersecret --transports tcp --region r1:4M:rw --region ro:64k:r
    svc_wait_ready n3
}
start_n3
ctl n1 copy n1/r1 n3/r1 4096 >/dev/null || fail "copy to the returned n3: $(ctl n1 copy n1/r1 n3/r1 4096 2>&1)"
inc1=$(redis_cli hget 'xfer:node:{n3}' incarnation)
svc_kill n3 KILL 2>/dev/null
start_n3
inc2=$(redis_cli hget 'xfer:node:{n3}' incarnation)
[[ $inc1 != "$inc2" ]] || fail "incarnation did not change across a restart"
ctl n1 write n1/r1+200000 'after restart' || fail "write"
ctl n1 copy n1/r1+200000 n3/r1+200000 13 >/dev/null || fail "copy to restarted n3: $(ctl n1 copy n1/r1+200000 n3/r1+200000 13 2>&1)"
[[ $(ctl n3 read n3/r1+200000 13) == 'after restart' ]] || fail "content on restarted n3"
echo "n3 restarted (incarnation $inc1 -> $inc2): transfers reach the new process"

# --- SIGTERM of n2: drain, exit 0, keys removed at once, others get leave.
ctl n1 copy n1/r1 n2/r1 4096 >/dev/null || fail "n1 -> n2 before SIGTERM"
# Requests in flight while the signal comes: they finish, later ones are
# refused with a clear error, the client never hangs.
ctl n2 bench n2/r1 n1/r1 --count 5000000 --depth 8 >"$SVC_DIR/bench.out" 2>&1 &
bench=$!
served() { ctl n2 --json stats 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["ctl_requests"])' 2>/dev/null; }
deadline=$((SECONDS + 10))
until (( $(served || echo 0) > 2000 )); do
    ((SECONDS < deadline)) || fail "bench did not start: $(cat "$SVC_DIR/bench.out")"
    sleep 0.05
done
t0=$(now_ms)
svc_kill n2 TERM; rc=$?
((rc == 0)) || fail "n2 exit status after SIGTERM: $rc"
echo "n2 drained in $(($(now_ms) - t0)) ms"
wait "$bench" && fail "bench against a stopping node succeeded"
grep -qE 'shutting down|connection|xferd' "$SVC_DIR/bench.out" || fail "bench error: $(cat "$SVC_DIR/bench.out")"
echo "client during drain: $(tail -1 "$SVC_DIR/bench.out")"
[[ $(keys_of n2) == 0 ]] || fail "n2 keys left after SIGTERM: $(redis_cli keys '*n2*' | tr '\n' ' ')"
[[ $(redis_cli zscore xfer:nodes n2) == "" ]] || fail "n2 still in xfer:nodes"
wait_for 5 grep -q 'event: leave n2' "$SVC_DIR/n1.log" || fail "n1 did not get 'leave n2'"
out=$(ctl n1 copy n1/r1 n2/r1 16 2>&1) && fail "copy to a stopped node succeeded"
echo "SIGTERM: n2 drained and left; then: $out"
ctl n1 peers

# --- A frozen peer (SIGSTOP, every thread): the client's timeout bounds the wait.
pid_freeze "${SVC_PID[n3]}" || fail "n3 did not stop"
start=$(now_ms)
out=$(CTL_TIMEOUT=1500 ctl n1 copy n1/r1 n3/r1 1M 2>&1) && fail "copy to a frozen node succeeded"
took=$(($(now_ms) - start))
kill -CONT "${SVC_PID[n3]}"
((took < 3500)) || fail "copy to a frozen node took $took ms"
[[ $out == *n3* ]] || fail "frozen-node error does not name n3: $out"
echo "copy to frozen n3 gave up after $took ms: $out"
svc_stop_all_checked
echo "failures test passed"
