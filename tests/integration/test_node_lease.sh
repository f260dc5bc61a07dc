#!/usr/bin/env bash
# Leases on KV pool blocks (tests/prog/node_lease.c): an owner process and a
# reader process embedding the node library, through a real redis-server,
# over tcp and over ipc. Blocks whose lease ended are refused at the owner
# with -XFER_ESTALE naming them while leased blocks are served; renewal
# extends; release refuses at once; another node's lease grants nothing.
set -u
cd "${XFER_ROOT:-.}"
B=${B:-build}
PROG=$B/tests/node_lease
[[ -x $PROG ]] || { echo "FAIL: $PROG not built"; exit 1; }
source tests/lib/service.sh
trap 'redis_stop' EXIT
redis_start; rc=$?; ((rc == 77)) && exit 77; ((rc == 0)) || fail "redis did not start"
export REDIS_URL
"$PROG" check --node lease-tcp --transports tcp --expect tcp || fail "leases over tcp"
"$PROG" check --node lease-ipc --transports tcp,ipc --expect ipc || fail "leases over ipc"
echo "PASS"
