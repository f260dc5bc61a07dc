#!/usr/bin/env bash
# Timed waits measure CLOCK_MONOTONIC, the registry schedules heartbeats on
# it too, and the wall clock only stamps what is published (issue 18 item
# 3). The wall clock of one process is stepped with tests/clockstep
# (LD_PRELOAD; the kernel's clocks are untouched):
#  1. an initiator whose wall clock is an hour ahead, then an hour behind:
#     a 500 ms deadline on a frozen target still fires in 450..1500 ms
#     (`xfer_node stuck`), and 40 cancels mid-flight return and verify
#     (`xfer_node cancel`). On CLOCK_REALTIME waits the first hangs for an
#     hour, the second returns before the batch has ended.
#  2. xferd with a 1.5 s TTL whose wall clock steps back an hour 2 s after
#     start: its node key stays in Redis for 3 TTLs after the step, and its
#     published heartbeat_ms is the stepped wall clock (the step happened).
#     Scheduled on the wall clock, the next heartbeat would be an hour away.
set -u
cd "${XFER_ROOT:-.}"
B=${B:-build}
source tests/lib/core.sh
source tests/lib/service.sh
trap 'core_cleanup; svc_cleanup; redis_stop' EXIT
shim=$PWD/$B/tests/libclockstep.so
[[ -f $shim ]] || core_fail "missing $shim"
# ASan wants to come first among loaded libraries; the shim only reads clocks.
export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0

stepped() { # SECONDS[@AFTER_MS] CMD...: CMD with its wall clock stepped
    local step=$1
    shift
    env LD_PRELOAD="$shim" XFER_CLOCK_STEP="$step" "$@"
}

core_start frozen --region rw:rw:16777216:3 || exit 1
for step in 3600 -3600; do
    ready=$CORE_TMP/stuck$step.ready
    stepped "$step" timeout 60 "$CORE_BIN/xfer_node" stuck --peer "$CORE_TMP/frozen.node" \
        --ready "$ready" >"$CORE_TMP/stuck.out" 2>&1 &
    client=$!
    CORE_PIDS+=("$client")
    deadline=$((SECONDS + 20))
    until [[ -e $ready ]]; do
        ((SECONDS < deadline)) && core_alive "$client" || { cat "$CORE_TMP/stuck.out"; core_fail "client did not start"; }
        sleep 0.05
    done
    core_freeze "$PID_frozen" || core_fail "target did not stop"
    touch "$ready.go"
    wait "$client"; rc=$?
    kill -CONT "$PID_frozen"
    cat "$CORE_TMP/stuck.out"
    ((rc == 0)) || core_fail "wall clock ${step}s: the deadline did not fire on time (exit $rc)"
    stepped "$step" timeout 120 "$CORE_BIN/xfer_node" cancel --peer "$CORE_TMP/frozen.node" \
        || core_fail "wall clock ${step}s: cancel mid-flight"
    echo "ok wall clock ${step}s: deadline and cancels on time"
done
core_stop frozen

svc_init
svc_redis_up
LD_PRELOAD=$shim XFER_CLOCK_STEP=-3600@2000 XFER_TTL_MS=1500 \
    svc_start n1 0 --redis-url "$REDIS_URL" --transports tcp
svc_wait_ready n1
key='xfer:node:{n1}'
[[ $(redis_cli exists "$key") == 1 ]] || fail "n1 not published"
ms() { echo $(($(date +%s%N) / 1000000)); }
# The step comes 2 s after xferd started; watch 3 TTLs past it.
end=$(($(ms) + 2000 + 4500))
while (($(ms) < end)); do
    [[ $(redis_cli exists "$key") == 1 ]] || {
        tail -20 "$SVC_DIR/n1.log"
        fail "n1 left the fleet after its wall clock stepped back"
    }
    sleep 0.1
done
beat=$(redis_cli hget "$key" heartbeat_ms)
behind=$(($(ms) - beat))
((behind > 3500000)) || fail "heartbeat_ms $beat is not an hour behind: the step did not happen"
echo "ok n1 kept its key for 3 TTLs after its wall clock stepped back 1 h (heartbeat_ms ${behind} ms behind)"
svc_kill n1 || fail "xferd exit"
echo "PASS"
