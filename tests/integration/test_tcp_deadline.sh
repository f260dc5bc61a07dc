#!/usr/bin/env bash
# A deadline fires on time even when the transport is stuck: the target is
# frozen with SIGSTOP mid-run; the initiator's 500 ms batch must end with
# -XFER_ETIMEDOUT within 1.5 s and be freeable at once. Then the target is
# thawed; 40 batches are then cancelled mid-flight (cancel must return fast,
# the data path must still verify afterwards) and the target shuts down cleanly.
set -u
source "$XFER_ROOT/tests/lib/core.sh"
core_start frozen --region rw:rw:67108864:3 || exit 1
ready=$CORE_TMP/stuck.ready
"$CORE_BIN/xfer_node" stuck --peer "$CORE_TMP/frozen.node" --ready "$ready" >"$CORE_TMP/stuck.out" 2>&1 &
client=$!
CORE_PIDS+=("$client")
deadline=$((SECONDS + 20))
until [[ -e $ready ]]; do
    ((SECONDS < deadline)) && core_alive "$client" || { cat "$CORE_TMP/stuck.out"; core_fail "client did not start"; }
    sleep 0.05
done
core_freeze "$PID_frozen" || core_fail "target did not stop" # every thread: kill returns first
touch "$ready.go"
wait "$client"; rc=$?
kill -CONT "$PID_frozen"
cat "$CORE_TMP/stuck.out"
((rc == 0)) || core_fail "deadline did not fire as expected"
# Cancels racing with transfers return quickly, and the node serves on.
"$CORE_BIN/xfer_node" cancel --peer "$CORE_TMP/frozen.node" || core_fail "cancel mid-flight"
core_stop frozen
echo "PASS"
