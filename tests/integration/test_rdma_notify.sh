#!/usr/bin/env bash
# Notifications and two-sided messages over rdma on the verbs stand-in
# (engine/rdma/rdma_msg.c: SEND/RECV on the RC QPs, docs/rdma.md
# "Messages"): test_notify.sh's ordering (10,000 notified batches, every
# range checksummed when its notification is read, 1 and 3 progress
# threads), failed item, cancelled batch and back-pressure parts, and
# test_sendrecv.sh whole (1,000 messages each way at once, tags,
# truncation, deadline, cancel, a killed and a removed peer), with the
# helpers linked against libfakeverbs and XFER_TRANSPORTS=rdma.
set -u
[[ -x $XFER_ROOT/$B/tests/fake/xfer_notify ]] || { echo "SKIP: fake-linked helpers not built"; exit 77; }
export CORE_BIN=$XFER_ROOT/$B/tests/fake
export XFER_RDMA_QPS=4 # data striped over 4 QPs, messages on one: the fence across QPs
source "$XFER_ROOT/tests/lib/core.sh"
XFER_NOTIFY_ONLY=rdma XFER_SENDRECV_TRANSPORTS=rdma XFER_SENDRECV_KILL=rdma \
    core_scripts "over rdma" test_notify test_sendrecv || core_fail "over rdma"
echo "PASS"
