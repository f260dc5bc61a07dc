#!/usr/bin/env bash
# Notifications and two-sided messages over tcpx on the test NCCL net plugin
# in host mode (engine/tcpx/tcpx_msg.c: engine frames on the link's control
# socket, docs/tcpx.md "Messages"): test_notify.sh's ordering (notified
# batches, every range checksummed when its notification is read, 1 and 3
# progress threads), failed item, cancelled batch and back-pressure parts,
# and test_sendrecv.sh whole (1,000 messages each way at once, tags,
# truncation, deadline, cancel, a killed peer), with XFER_TRANSPORTS=tcpx
# only (tests/lib/tcpx.sh), so nothing falls back to tcp unnoticed.
set -u
source "$XFER_ROOT/tests/lib/tcpx.sh"
export XFER_TESTNET_MODE=host
# the test plugin moves ~600 items/s here (one socket per comm): fewer batches
export XFER_NOTIFY_BATCHES=${XFER_NOTIFY_BATCHES:-1000}
source "$XFER_ROOT/tests/lib/core.sh"
XFER_NOTIFY_ONLY=tcpx XFER_SENDRECV_TRANSPORTS=tcpx XFER_SENDRECV_KILL=tcpx \
    core_scripts "over tcpx" test_notify test_sendrecv || core_fail "over tcpx"
echo "PASS"
