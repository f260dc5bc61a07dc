#!/usr/bin/env bash
# A deadline fires on time even when the transport is stuck: the target is
# frozen with SIGSTOP mid-run; the initiator's 500 ms batch must end with
# -XFER_ETIMEDOUT within 1.5 s and be freeable at once. Then the target is
# thawed and must still shut down cleanly.
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
kill -STOP "$PID_frozen"
touch "$ready.go"
wait "$client"; rc=$?
kill -CONT "$PID_frozen"
cat "$CORE_TMP/stuck.out"
((rc == 0)) || core_fail "deadline did not fire as expected"
core_stop frozen
echo "PASS"
