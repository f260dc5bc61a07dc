#!/usr/bin/env bash
# Bad input against one served node: read-only/write-only regions, bounds
# (incl. offset+len overflow), stale generation, unknown id, garbage and
# truncated frames from a raw client, a client stalling mid-payload while
# another is served. Each gets the right error within a deadline, the server
# survives, and content written before is intact afterwards.
set -u
source "$XFER_ROOT/tests/lib/core.sh"
core_start target --io-timeout 1000 --region rw:rw:1048576:5 --region ro:r:4194304:6 \
    --region wo:w:65536 --region regen:rw:65536 --region scratch:rw:4194304 \
    --regen regen || exit 1
node=$CORE_TMP/target.node
"$CORE_BIN/xfer_node" bad --peer "$node" --phase setup || core_fail "engine-level bad input"

for c in garbage bad-magic huge bad-op pre-hs; do
    "$CORE_BIN/xfer_raw" --peer "$node" --case $c --within-ms 3000 || core_fail "raw $c"
done
for c in trunc-hdr trunc-payload; do
    "$CORE_BIN/xfer_raw" --peer "$node" --case $c || core_fail "raw $c"
done

# A stalled client is cut after io_timeout (1 s); meanwhile others are served.
"$CORE_BIN/xfer_raw" --peer "$node" --case stall --within-ms 4000 >"$CORE_TMP/stall.out" 2>&1 &
stall=$!
CORE_PIDS+=("$stall")
"$CORE_BIN/xfer_node" bad --peer "$node" --node other-client || core_fail "served during a stall"
wait "$stall" || { cat "$CORE_TMP/stall.out"; core_fail "stalled client not cut"; }
cat "$CORE_TMP/stall.out"

core_alive "$PID_target" || core_fail "target died"
"$CORE_BIN/xfer_node" bad --peer "$node" --phase check || core_fail "after bad input"
grep -E "closing connection|refused connection" "$CORE_TMP/target.log" | sed 's/^/target log: /' | head -20
grep -q "malformed request header" "$CORE_TMP/target.log" || core_fail "no log line for garbage"
grep -q "peer stalled" "$CORE_TMP/target.log" || core_fail "no log line for the stall"
core_stop target
echo "PASS"
