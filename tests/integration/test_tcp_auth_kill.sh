#!/usr/bin/env bash
# Wrong or missing secret is refused with -XFER_EAUTH and a log line; a peer
# SIGKILLed mid-transfer fails the in-flight batch with -XFER_ECONN quickly,
# and the other node keeps serving.
set -u
source "$XFER_ROOT/tests/lib/core.sh"
core_start locked --secret s3cret --region rw:rw:1048576:5 || exit 1
"$CORE_BIN/xfer_node" auth --peer "$CORE_TMP/locked.node" --secret wrong || core_fail "wrong secret"
"$CORE_BIN/xfer_node" auth --peer "$CORE_TMP/locked.node" || core_fail "missing secret"
grep -q "refused connection" "$CORE_TMP/locked.log" || core_fail "no log line for the refusal"
grep "refused connection" "$CORE_TMP/locked.log" | head -2 | sed 's/^/locked log: /'

core_start victim --region rw:rw:67108864:9 || exit 1
ready=$CORE_TMP/pump.ready
"$CORE_BIN/xfer_node" pump --peer "$CORE_TMP/victim.node" --ready "$ready" >"$CORE_TMP/pump.out" 2>&1 &
pump=$!
CORE_PIDS+=("$pump")
deadline=$((SECONDS + 30))
until [[ -e $ready ]]; do
    ((SECONDS < deadline)) && core_alive "$pump" || { cat "$CORE_TMP/pump.out"; core_fail "pump did not start"; }
    sleep 0.05
done
kill -9 "$PID_victim"
wait "$PID_victim" 2>/dev/null
t0=$(date +%s%N)
while core_alive "$pump" && (( ($(date +%s%N) - t0) / 1000000 < 5000 )); do sleep 0.02; done
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
core_alive "$pump" && core_fail "pump still running ${ms} ms after the peer was killed"
wait "$pump"; rc=$?
cat "$CORE_TMP/pump.out"
((rc == 0)) || core_fail "pump did not end with -XFER_ECONN"
echo "pump noticed the dead peer within ${ms} ms"
# the other node still serves (correct secret)
"$CORE_BIN/xfer_node" auth --peer "$CORE_TMP/locked.node" --secret wrong >/dev/null || core_fail "locked node gone"
core_alive "$PID_locked" || core_fail "locked node died"
core_stop locked
echo "PASS"
