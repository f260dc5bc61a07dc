#!/usr/bin/env bash
# The transfer suite over the rdma transport on the verbs stand-in: two
# processes, random sizes/offsets/directions checked byte by byte, with the
# cluster secret; two fake NICs per node (striping over NICs and QPs); the
# engine's bad-input suite (with and without a secret: a stale incarnation
# or another node is refused with -XFER_ESTALE); vectored items (segment
# lists); authentication failures; what the NIC itself
# refuses (bad rkey, read-only registration, out of bounds) and recovery.
set -u
source "$XFER_ROOT/tests/lib/rdma.sh"
rdma_setup

rdma_serve srv --secret s3cret --region rw:rw:16777216:1 --region ro:r:4194304:2 \
    --region wo:w:1048576:3 --region regen:rw:65536:4 --regen regen || exit 1
N=$WORK/srv.node
step "random batches, seed 1" "$FAKE/xfer_rdma_check" random --peer "$N" --secret s3cret --seed 1 --rounds 40
step "random batches, seed 2, small chunks" env XFER_RDMA_SQ_DEPTH=8 XFER_RDMA_SIGNAL_EVERY=3 \
    "$FAKE/xfer_rdma_check" random --peer "$N" --secret s3cret --seed 2 --rounds 20
step "random batches, 3 progress threads, 4 QPs" env XFER_RDMA_QPS=4 \
    "$FAKE/xfer_rdma_check" random --peer "$N" --secret s3cret --seed 4 --rounds 20 --progress 3
step "bad input (engine suite)" "$FAKE/xfer_node" bad --peer "$N" --secret s3cret --phase setup
step "bad input, second client" "$FAKE/xfer_node" bad --peer "$N" --secret s3cret --phase check
step "wrong secret is refused" "$FAKE/xfer_node" auth --peer "$N" --secret wrong
step "no secret is refused" "$FAKE/xfer_node" auth --peer "$N"
step "NIC-enforced access and recovery" "$FAKE/xfer_rdma_check" nic --peer "$N" --secret s3cret

# Without a secret too: the CM reply's node id and incarnation must match the
# descriptor (-XFER_ESTALE for an old incarnation or another node).
rdma_serve nosec --region rw:rw:1048576:1 --region ro:r:65536:2 --region wo:w:65536:3 \
    --region regen:rw:65536:4 --regen regen || exit 1
step "bad input (engine suite), no secret" "$FAKE/xfer_node" bad --peer "$WORK/nosec.node" --phase setup
rdma_serve vec --region vw:rw:4194304:7 || exit 1
step "vectored items (segment lists)" "$FAKE/xfer_vec" --peer "$WORK/vec.node" --region vw \
    --pattern-seed 7 --rounds 10 --seed 5 --expect rdma

# Two NICs on each side (127.0.0.1 and 127.0.0.2): QPs on both, chunks striped.
# Every NIC serves only with a wildcard listen address (issue 18 item 6).
export XFER_FAKEVERBS_DEVICES=2
rdma_serve srv2 --listen 0.0.0.0 --region rw:rw:16777216:1 --region ro:r:4194304:2 || exit 1
grep -q '^nics=fake0.*;fake1' "$WORK/srv2.node" || { echo "srv2 publishes one NIC"; FAILED=$((FAILED + 1)); }
step "two NICs: random batches" "$FAKE/xfer_rdma_check" random --peer "$WORK/srv2.node" --seed 3 --rounds 30
step "two NICs: bench smoke run" "$FAKE/xfer_rdma_check" bench --peer "$WORK/srv2.node" \
    --seconds 0.1 --sizes 4096,1048576,4194304
step "two NICs: NIC-enforced access" "$FAKE/xfer_rdma_check" nic --peer "$WORK/srv2.node"
# rdma honours listen: the NIC at the listen address serves, the other is
# not offered, and no NIC at it means no rdma (issue 18 item 6).
rdma_serve one --listen 127.0.0.2 --region rw:rw:65536:1 || exit 1
grep -q '^nics=fake1' "$WORK/one.node" && ! grep -q 'fake0' "$WORK/one.node" \
    || { echo "listen 127.0.0.2 offers: $(grep '^nics=' "$WORK/one.node")"; FAILED=$((FAILED + 1)); }
XFER_LOG_LEVEL=info timeout 20 "$FAKE/xfer_node" serve --out "$WORK/none.node" --node none \
    --listen 127.0.0.9 --region rw:rw:65536:1 >"$WORK/none.log" 2>&1
grep -q 'no RDMA NIC has the listen address 127.0.0.9' "$WORK/none.log" \
    || { echo "listen 127.0.0.9 did not refuse rdma:"; cat "$WORK/none.log"; FAILED=$((FAILED + 1)); }
unset XFER_FAKEVERBS_DEVICES

echo "$FAILED step(s) failed"
((FAILED == 0))
