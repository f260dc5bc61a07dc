#!/usr/bin/env bash
# Block items (xfer_batch_add_block_item, tests/prog/xfer_blocks.c): the
# form KV pool requests take over ipc. Two engine processes over ipc (host
# memory: the worker computes each segment from the ids), random pool-like
# layouts READ and WRITE with every byte checked; ids past the region or
# past 2^64 refused at add naming the id; a remote id past the region and
# a block on a range no lease covers fail their item naming the segment.
# Over tcp the item is refused with -XFER_ENOTSUP (tcp keeps segment
# lists). XFER_BLOCKS_SEED fixes the seed.
set -u
source "$XFER_ROOT/tests/lib/core.sh"
[[ -n ${XFER_TRANSPORTS:-} ]] && { echo "SKIP: ipc and tcp only"; exit 77; }
seed=${XFER_BLOCKS_SEED:-$RANDOM}
rounds=40
core_san && rounds=12
regions=(--region rw:rw:67108864:42 --region gd:rw:4194304:43 --guard gd:1048576:65536
    --region ro:r:65536:44) # ro: a WRITE to it is refused whole
export XFER_TRANSPORTS=ipc,tcp
core_start ipcnode "${regions[@]}" || exit 1
timeout 240 "$CORE_BIN/xfer_blocks" --peer "$CORE_TMP/ipcnode.node" --pattern-seed 42 \
    --rounds "$rounds" --seed "$seed" --guard gd:1048576 --expect ipc ||
    core_fail "block items, ipc"
core_alive "$PID_ipcnode" || core_fail "ipc node died"
core_stop ipcnode
export XFER_TRANSPORTS=tcp
core_start tcpnode "${regions[@]}" || exit 1
timeout 60 "$CORE_BIN/xfer_blocks" --peer "$CORE_TMP/tcpnode.node" --expect tcp ||
    core_fail "block items refused over tcp"
core_stop tcpnode
echo "PASS (seed $seed)"
