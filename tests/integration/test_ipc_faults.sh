#!/usr/bin/env bash
# ipc transport under failure (two processes): deadline, cancel, a stopped
# owner (bounded by io_timeout, then reconnect), a killed owner.
set -u
node=$B/tests/ipc_node
[[ -x $node ]] || { echo "missing $node"; exit 1; }
timeout --kill-after=5 120 "$node" faults
