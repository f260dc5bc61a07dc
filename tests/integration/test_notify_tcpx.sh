#!/usr/bin/env bash
# tcpx carries no engine messages (docs/notify.md): over tcpx alone (the test
# NCCL net plugin), a notification and a SEND fail with -XFER_ENOTSUP and say
# why, while the WRITE of the same batch lands; the node keeps serving.
set -u
source "$XFER_ROOT/tests/lib/tcpx.sh"
export XFER_TESTNET_MODE=host XFER_NOTIFY_EXPECT=tcpx
source "$XFER_ROOT/tests/lib/core.sh"
core_start_prog recv "$CORE_BIN/xfer_notify" serve --mb 1 || exit 1
timeout 60 "$CORE_BIN/xfer_notify" unsupported --peer "$CORE_TMP/recv.node" ||
    core_fail "tcpx: unsupported messages"
core_stop recv
echo "PASS"
