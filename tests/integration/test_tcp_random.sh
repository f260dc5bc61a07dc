#!/usr/bin/env bash
# Two engine processes over loopback, every byte checked:
#  1. 10,000 random READ/WRITE items (1 B to 64 MiB, batches of 1..256),
#     one submitting thread, 4 sockets;
#  2. 10,000 more from 4 threads submitting concurrently (each in its own
#     slice), 4 sockets: posting races with the progress thread;
#  3. 1,000 over a single socket into a second region;
#  4. the same into a third region with XFER_WAIT_RX=0 (the waiter sleeps, the progress thread
#     receives: 1-3 run with the waiter reading its socket itself).
# XFER_RANDOM_ITEMS scales the counts (same defaults under SAN=1: the run
# takes seconds there too); XFER_RANDOM_SEED fixes the seed.
set -u
source "$XFER_ROOT/tests/lib/core.sh"
items=${XFER_RANDOM_ITEMS:-10000}
seed=${XFER_RANDOM_SEED:-$RANDOM}
core_start target --region rw:rw:268435456:42 --region mt:rw:268435456:44 \
    --region one:rw:134217728:43 --region two:rw:134217728:45 || exit 1
node=$CORE_TMP/target.node
timeout 240 "$CORE_BIN/xfer_random" --peer "$node" --region rw --pattern-seed 42 \
    --items "$items" --seed "$seed" --sockets 4 || core_fail "random, 4 sockets"
timeout 240 "$CORE_BIN/xfer_random" --peer "$node" --region mt --pattern-seed 44 \
    --items "$items" --seed $((seed + 2)) --sockets 4 --threads 4 || core_fail "random, 4 threads"
timeout 120 "$CORE_BIN/xfer_random" --peer "$node" --region one --pattern-seed 43 \
    --items $((items / 10)) --seed $((seed + 1)) --sockets 1 || core_fail "random, 1 socket"
XFER_WAIT_RX=0 timeout 120 "$CORE_BIN/xfer_random" --peer "$node" --region two --pattern-seed 45 \
    --items $((items / 10)) --seed $((seed + 3)) --sockets 1 || core_fail "random, no waiter rx"
core_alive "$PID_target" || core_fail "target died"
core_stop target
echo "PASS"
