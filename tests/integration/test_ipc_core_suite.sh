#!/usr/bin/env bash
# The shared engine suites over ipc (issue 18 item 10): tcp's random suite
# unchanged with XFER_TRANSPORTS=ipc (10,000 random items, 4 threads, one
# connection; every byte checked) and the engine-level part of the bad-input
# suite (access modes, bounds incl. offset+len overflow, stale generations,
# unknown ids, then the content checked intact). test_tcp_bad_input's raw
# frames and stalls speak tcp's wire format; ipc's own malformed messages,
# frozen and killed peers are test_ipc_faults.sh's.
set -u
export XFER_TRANSPORTS=ipc
source "$XFER_ROOT/tests/lib/core.sh"
core_scripts "over ipc" test_tcp_random || exit 1

core_start target --io-timeout 1000 --region rw:rw:1048576:5 --region ro:r:4194304:6 \
    --region wo:w:65536 --region regen:rw:65536 --region scratch:rw:4194304 \
    --regen regen || exit 1
node=$CORE_TMP/target.node
"$CORE_BIN/xfer_node" bad --peer "$node" --phase setup || core_fail "engine-level bad input over ipc"
"$CORE_BIN/xfer_node" bad --peer "$node" --node other-client || core_fail "a second client over ipc"
"$CORE_BIN/xfer_node" bad --peer "$node" --phase check || core_fail "content after bad input over ipc"
grep -q "served_ops=[1-9]" <(core_stop target) || core_fail "the target served nothing (not over ipc?)"
echo "PASS"
