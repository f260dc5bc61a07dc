# Helpers for xferd/xferctl integration scripts. Source after setting B.
#   svc_init                   temp dir $SVC_DIR, redis helpers loaded
#   svc_redis_up               a redis-server of the test's own: exit 77 when
#                              none is installed, fail when it does not start
#   svc_start NAME HOST ARGS.. starts xferd NAME (in netns host HOST, or
#                              HOST=0: root namespace); pid in SVC_PID[NAME]
#   svc_wait_ready NAME        health answers (10 s max)
#   ctl NAME ARGS...           xferctl against NAME's unix socket
#   svc_kill NAME [SIG]        signal it (default TERM) and wait (10 s max)
#   svc_cleanup                stops every xferd started here, removes $SVC_DIR
#   wait_for SECONDS CMD...    polls CMD every 50 ms until it succeeds
#   fail MSG                   prints and exits 1 (the EXIT trap cleans up)
#   svc_wait_peers N NAME...   each NAME lists N peers (10 s max)
#   svc_ring_start NAME...     copies around the ring in the background
#   svc_ring_stop              ... must go on; stops them, fails on any failed one
#   pid_freeze PID             SIGSTOP and wait until every thread stopped
#                              (tests/lib/freeze.sh; kill -STOP returns first)
# Every xferd logs to $SVC_DIR/NAME.log.

XFERD=${B:-build}/bin/xferd
XFERCTL=${B:-build}/bin/xferctl
declare -A SVC_PID=() SVC_HOST=()
source "$(dirname "${BASH_SOURCE[0]}")/freeze.sh"

if [[ -f ${XFER_ROOT:-.}/tests/lib/redis.sh ]]; then
    source "${XFER_ROOT:-.}/tests/lib/redis.sh"
else
    # Minimal stand-in until the registry's tests/lib/redis.sh is merged.
    redis_start() {
        command -v redis-server >/dev/null || { echo "SKIP: redis-server not installed"; return 77; }
        REDIS_DIR=$(mktemp -d /tmp/xfer-redis.XXXXXX)
        REDIS_ARGS=("$@")
        REDIS_PORT=$((20000 + RANDOM % 20000))
        _svc_redis_launch && REDIS_URL="redis://127.0.0.1:$REDIS_PORT"
    }
    _svc_redis_launch() {
        redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --dir "$REDIS_DIR" --save '' \
            --appendonly no --logfile "$REDIS_DIR/redis.log" "${REDIS_ARGS[@]}" </dev/null &
        REDIS_PID=$!
        wait_for 5 bash -c "[[ \$(redis-cli -p $REDIS_PORT ping 2>/dev/null) == PONG ]]"
    }
    redis_cli() { redis-cli -p "$REDIS_PORT" "$@"; }
    redis_restart() {
        kill -9 "$REDIS_PID" 2>/dev/null; wait "$REDIS_PID" 2>/dev/null
        _svc_redis_launch
    }
    redis_stop() {
        [[ -n ${REDIS_PID:-} ]] && { kill -9 "$REDIS_PID" 2>/dev/null; wait "$REDIS_PID" 2>/dev/null; }
        REDIS_PID=
        [[ -n ${REDIS_DIR:-} ]] && rm -rf "$REDIS_DIR"
        return 0
    }
fi

fail() {
    echo "FAIL: $*" >&2
    exit 1
}

wait_for() {
    local limit=$1; shift
    local deadline=$(($(date +%s%N) / 1000000 + limit * 1000))
    until "$@" >/dev/null 2>&1; do
        (($(date +%s%N) / 1000000 < deadline)) || return 1
        sleep 0.05
    done
}

svc_init() {
    SVC_DIR=$(mktemp -d /tmp/xfer-svc.XXXXXX)
}

svc_start() {
    local name=$1 host=$2; shift 2
    SVC_HOST[$name]=$host
    local pre=()
    ((host > 0)) && pre=(ip netns exec "$(_netns_name "$host")")
    # exec chain (ip netns exec -> env -> xferd) keeps $! the xferd pid.
    # Metrics off unless asked for (SVC_METRICS_PORT; "" = xferd's default
    # port): several xferd share 127.0.0.1 here.
    "${pre[@]}" env XFER_LOG_LEVEL=${XFER_LOG_LEVEL:-info} XFER_METRICS_PORT="${SVC_METRICS_PORT-0}" \
        "$XFERD" --node "$name" \
        --ctrl-socket "$SVC_DIR/$name.sock" "$@" >"$SVC_DIR/$name.log" 2>&1 </dev/null &
    SVC_PID[$name]=$!
}

ctl() {
    local name=$1; shift
    "$XFERCTL" --socket "$SVC_DIR/$name.sock" --timeout "${CTL_TIMEOUT:-10000}" "$@"
}

svc_wait_ready() {
    local name=$1
    if ! wait_for 10 ctl "$name" health; then
        echo "--- $name.log" >&2
        tail -20 "$SVC_DIR/$name.log" >&2
        fail "xferd $name did not become ready"
    fi
}

svc_kill() { # name [signal]: returns the exit status of xferd
    local name=$1 sig=${2:-TERM} pid=${SVC_PID[$1]:-}
    [[ -n $pid ]] || return 0
    kill -"$sig" "$pid" 2>/dev/null
    local deadline=$((SECONDS + 15))
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.05; done
    kill -9 "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    local rc=$?
    unset "SVC_PID[$name]"
    return $rc
}

# svc_wait_peers COUNT NAME...: every NAME lists COUNT peers (10 s max).
svc_wait_peers() {
    local want=$1 n
    shift
    for n in "$@"; do
        wait_for 10 bash -c "(( \$($XFERCTL --socket $SVC_DIR/$n.sock peers | tail -n +2 | wc -l) == $want ))" ||
            fail "$n does not see $want peers: $(ctl "$n" peers 2>&1)"
    done
}

# svc_ring_start NAME...: one copy of 64 KiB NAME/r1 -> next NAME/r1 around
# the ring (each must work), then the same in the background until
# svc_ring_stop, one line per copy in $SVC_DIR/traffic.txt ("ok" or "fail
# SRC->DST: why"); returns once 5 went through. svc_cleanup stops it too.
SVC_RING_PID=
svc_ring_start() {
    local nodes=("$@") i k=$#
    for ((i = 0; i < k; i++)); do
        ctl "${nodes[i]}" copy "${nodes[i]}/r1" "${nodes[(i + 1) % k]}/r1" 65536 >/dev/null ||
            fail "warm-up ${nodes[i]} -> ${nodes[(i + 1) % k]}"
    done
    (
        local i=0 src dst out
        while [[ ! -e $SVC_DIR/stop ]]; do
            src=${nodes[i % k]} dst=${nodes[(i + 1) % k]}
            if out=$(ctl "$src" copy "$src/r1" "$dst/r1" 65536 2>&1); then echo ok; else echo "fail $src->$dst: $out"; fi
            i=$((i + 1))
        done >"$SVC_DIR/traffic.txt"
    ) &
    SVC_RING_PID=$!
    wait_for 10 bash -c "(( \$(grep -c ^ok $SVC_DIR/traffic.txt) >= 5 ))" || fail "no traffic around the ring"
}

# svc_ring_stop: 5 more copies must go through (the traffic did not stall),
# then the loop stops; prints the counts and fails when any copy failed.
svc_ring_stop() {
    local n_ok n_fail
    n_ok=$(grep -c ^ok "$SVC_DIR/traffic.txt")
    wait_for 10 bash -c "(( \$(grep -c ^ok $SVC_DIR/traffic.txt) >= $n_ok + 5 ))" || fail "traffic stalled"
    touch "$SVC_DIR/stop"
    wait "$SVC_RING_PID"
    SVC_RING_PID=
    n_ok=$(grep -c ^ok "$SVC_DIR/traffic.txt")
    n_fail=$(grep -c ^fail "$SVC_DIR/traffic.txt")
    echo "copies during the test: $n_ok ok, $n_fail failed"
    ((n_fail == 0)) || { grep ^fail "$SVC_DIR/traffic.txt" | head -5; fail "$n_fail copies failed"; }
}

svc_redis_up() {
    redis_start
    local rc=$?
    ((rc == 77)) && exit 77
    ((rc == 0)) || fail "redis did not start"
}

svc_cleanup() {
    local name
    [[ -n ${SVC_RING_PID:-} ]] && kill "$SVC_RING_PID" 2>/dev/null
    for name in "${!SVC_PID[@]}"; do
        kill -9 "${SVC_PID[$name]}" 2>/dev/null
        wait "${SVC_PID[$name]}" 2>/dev/null
    done
    SVC_PID=()
    if [[ -n ${SVC_DIR:-} && -d $SVC_DIR ]]; then
        if [[ -n ${SVC_KEEP_LOGS:-} ]]; then
            cp "$SVC_DIR"/*.log "$SVC_KEEP_LOGS"/ 2>/dev/null
        fi
        rm -rf "$SVC_DIR"
    fi
    return 0
}

# svc_cluster_up N [xferd args...]: N hosts (netns), Redis in the root
# namespace reachable from all, xferd n1..nN (one per host, tcp transport,
# regions r1 4 MiB rw and ro 64 KiB r), each seeing all N in `peers`.
# Needs tests/lib/netns.sh sourced. Env: TTL_MS (2000), SECRET (clustersecret).
svc_cluster_up() {
    local n=$1 i; shift
    netns_up "$n" || fail "could not create $n network namespaces"
    redis_start --bind "127.0.0.1 $NETNS_GW" --protected-mode no || fail "redis did not start"
    CLUSTER_REDIS="redis://$NETNS_GW:$REDIS_PORT"
    for ((i = 1; i <= n; i++)); do
        svc_start "n$i" "$i" --listen "${NETNS_IP[i]}" --redis-url "$CLUSTER_REDIS" \
            --ttl-ms "${TTL_MS:-2000}" --secret "${SECRET:-clustersecret}" --transports tcp \
            --region r1:4M:rw --region ro:64k:r "$@"
    done
    for ((i = 1; i <= n; i++)); do svc_wait_ready "n$i"; done
    for ((i = 1; i <= n; i++)); do
        wait_for 10 bash -c "(( \$($XFERCTL --socket $SVC_DIR/n$i.sock peers | tail -n +2 | wc -l) == $n ))" \
            || fail "n$i does not see $n peers: $(ctl "n$i" peers 2>&1)"
    done
}

# sha256 of a file
sum_of() { sha256sum "$1" | cut -d' ' -f1; }

# Stops every xferd with SIGTERM; fails unless each exits 0 with no
# sanitizer report in its log.
svc_stop_all_checked() {
    local name rc
    for name in "${!SVC_PID[@]}"; do
        svc_kill "$name" TERM; rc=$?
        if grep -qE 'AddressSanitizer|LeakSanitizer|runtime error' "$SVC_DIR/$name.log"; then
            grep -E -A30 'AddressSanitizer|LeakSanitizer|runtime error' "$SVC_DIR/$name.log" | head -60 >&2
            fail "sanitizer report in $name.log"
        fi
        ((rc == 0)) || { tail -20 "$SVC_DIR/$name.log" >&2; fail "xferd $name exited $rc on SIGTERM"; }
    done
}
