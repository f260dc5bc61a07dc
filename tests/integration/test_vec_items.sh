#!/usr/bin/env bash
# Vectored items (xfer_batch_add_segments, tests/prog/xfer_vec.c), two
# engine processes, every byte checked: random segment lists (up to 20,000
# segments an item) READ and WRITE over tcp, then over ipc (host memory:
# one owner round trip per segment list); a segment past the remote end and
# one on a range no lease covers fail their item naming the segment; empty,
# oversized and malformed lists are refused at add; a cancelled batch ends
# cleanly. XFER_VEC_SEED fixes the seed. Under another transport's suite
# (XFER_TRANSPORTS set, e.g. tcpx) only that transport runs.
set -u
source "$XFER_ROOT/tests/lib/core.sh"
seed=${XFER_VEC_SEED:-$RANDOM}
rounds=40
core_san && rounds=12
regions=(--region rw:rw:67108864:42 --region gd:rw:4194304:43 --guard gd:1048576:65536
    --region ro:r:65536:44) # ro: a WRITE to it is refused whole
# Run by another transport's suite (tcpx: XFER_TRANSPORTS=tcpx): that one only.
first=${XFER_TRANSPORTS:-tcp}
core_start tcpnode "${regions[@]}" || exit 1
timeout 240 "$CORE_BIN/xfer_vec" --peer "$CORE_TMP/tcpnode.node" --pattern-seed 42 \
    --rounds "$rounds" --seed "$seed" --guard gd:1048576 --expect "$first" ||
    core_fail "vectored, $first"
core_alive "$PID_tcpnode" || core_fail "$first node died"
core_stop tcpnode
[[ -n ${XFER_TRANSPORTS:-} ]] && { echo "PASS (seed $seed, $first)"; exit 0; }
export XFER_TRANSPORTS=ipc,tcp
core_start ipcnode "${regions[@]}" || exit 1
timeout 240 "$CORE_BIN/xfer_vec" --peer "$CORE_TMP/ipcnode.node" --pattern-seed 42 \
    --rounds "$rounds" --seed $((seed + 1)) --guard gd:1048576 --expect ipc ||
    core_fail "vectored, ipc"
core_alive "$PID_ipcnode" || core_fail "ipc node died"
core_stop ipcnode
echo "PASS (seed $seed)"
