#!/usr/bin/env bash
# KV pools between processes embedding the node library, through a real
# redis-server (tests/prog/node_pools.c): every layout kind in host memory,
# random block lists both ways over tcp and over ipc with every byte
# checked, layer ranges, a vLLM pool fed from a FlashInfer one, run
# coalescing, each mismatch field refused, blocks out of range; the pool
# and its members as redis-cli shows them.
set -u
cd "${XFER_ROOT:-.}"
B=${B:-build}
PROG=$B/tests/node_pools
[[ -x $PROG ]] || { echo "FAIL: $PROG not built"; exit 1; }
source tests/lib/service.sh
dir=$(mktemp -d /tmp/xfer-nodepools.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
    redis_stop
    rm -rf "$dir"
}
trap cleanup EXIT
svc_redis_up

for t in tcp ipc; do
    tr=tcp
    [[ $t == ipc ]] && tr=tcp,ipc
    "$PROG" serve --node "srv-$t" --transports "$tr" --ready "$dir/$t.ready" >"$dir/srv-$t.log" 2>&1 &
    pids+=($!)
    wait_for 20 test -e "$dir/$t.ready" || { cat "$dir/srv-$t.log"; fail "srv-$t did not start"; }
    "$PROG" check --node "cli-$t" --peer "srv-$t" --transports "$tr" --expect "$t" ||
        fail "pools over $t"
done

# The registry shows the pool and its members.
[[ $(redis_cli hget 'xfer:pool:{srv-tcp}:fa' layout) == vllm_fa ]] || fail "pool hash"
[[ $(redis_cli hget 'xfer:pool:{srv-tcp}:fa' regions) == fa.0,fa.1,fa.2,fa.3 ]] ||
    fail "pool members: $(redis_cli hget 'xfer:pool:{srv-tcp}:fa' regions)"
redis_cli sismember 'xfer:pools:{srv-tcp}' sg | grep -q 1 || fail "pool set"
((${#pids[@]} == 2)) && kill "${pids[0]}" && wait "${pids[0]}" 2>/dev/null
wait_for 10 bash -c "[[ \$(redis-cli -p $REDIS_PORT exists 'xfer:pool:{srv-tcp}:fa') == 0 ]]" ||
    fail "pool keys left after the node left"
echo "PASS"
