#!/usr/bin/env bash
# Leases on KV pool blocks (tests/prog/node_lease.c): an owner process and a
# reader process embedding the node library, through a real redis-server,
# over tcp, over ipc and over rdma on the verbs stand-in (memory windows:
# the owner's NIC refuses a window invalidated when its lease ended or its
# blocks were released). Blocks whose lease ended are refused at the owner
# with -XFER_ESTALE naming them while leased blocks are served; renewal
# extends; release refuses at once; another node's lease grants nothing.
# Then rdma again with QP churn forced around the memory-window binds.
set -u
cd "${XFER_ROOT:-.}"
B=${B:-build}
PROG=$B/tests/node_lease
[[ -x $PROG ]] || { echo "FAIL: $PROG not built"; exit 1; }
source tests/lib/service.sh
trap 'redis_stop' EXIT
svc_redis_up
export REDIS_URL
"$PROG" check --node lease-tcp --transports tcp --expect tcp || fail "leases over tcp"
"$PROG" check --node lease-ipc --transports tcp,ipc --expect ipc || fail "leases over ipc"
FAKE=$B/tests/fake/node_lease
[[ -x $FAKE ]] || fail "$FAKE not built"
log=$(mktemp)
trap 'redis_stop; rm -f "$log"' EXIT
XFER_LOG_LEVEL=info "$FAKE" check --node lease-rdma --transports rdma --expect rdma 2>"$log" ||
    { cat "$log"; fail "leases over rdma"; }
# Cached windows of ended leases were refused by the owner's (stand-in) NIC,
# not only window requests by the owner's CPU.
grep -q "the owner's NIC refused a lease window" "$log" ||
    { cat "$log"; fail "no window refused by the NIC over rdma"; }
# QP churn around the binds, forced in the owner (the stand-in's
# XFER_FAKEVERBS_MW_FAULT, tests/fakeverbs/fv_mw.c): binds its QP cannot take
# now (post: answered "busy", asked again), binds its NIC fails (bind: the QP
# in error, the answer flushed) and QPs whose link dies between the ask and
# the bind (kill). The same checks: every read of leased or open blocks
# succeeds, ended and released leases are still refused (-XFER_ESTALE).
faults=post:1,bind:4,kill:9,post:15,bind:22,kill:30
XFER_FAKEVERBS_MW_FAULT=$faults XFER_LOG_LEVEL=info "$FAKE" check --node lease-churn \
    --transports rdma --expect rdma 2>"$log" || { cat "$log"; fail "leases over rdma, faults $faults"; }
n=$(grep -c "fakeverbs: fault:" "$log")
((n == 6)) || { cat "$log"; fail "$n of the 6 faults ($faults) fired"; }
grep -q "could not bind a memory window now" "$log" ||
    { cat "$log"; fail "no window asked again after a busy answer"; }
echo "PASS"
