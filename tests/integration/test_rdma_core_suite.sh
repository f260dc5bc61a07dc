#!/usr/bin/env bash
# The engine/tcp integration suite, unchanged, over rdma on the verbs
# stand-in: core's scripts with the helper programs linked against
# libfakeverbs ($B/tests/fake) and XFER_TRANSPORTS=rdma, so every transfer
# goes through engine/rdma. test_tcp_random: 10,000 random items (1 B..64 MiB,
# batches up to 256, every byte checked) and 1,000 more into a second
# region; test_tcp_auth_kill: wrong/missing secret refused, a peer SIGKILLed
# mid-transfer fails the batch with -XFER_ECONN quickly. (test_tcp_bad_input
# speaks raw tcp frames; its engine-level part runs in test_rdma_fake.sh.)
set -u
[[ -x $XFER_ROOT/$B/tests/fake/xfer_random ]] || { echo "SKIP: fake-linked helpers not built"; exit 77; }
export CORE_BIN=$XFER_ROOT/$B/tests/fake XFER_TRANSPORTS=rdma
source "$XFER_ROOT/tests/lib/core.sh"
core_scripts "over rdma" test_tcp_random test_tcp_auth_kill
