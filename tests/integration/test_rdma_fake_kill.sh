#!/usr/bin/env bash
# Peer killed mid-transfer over rdma (verbs stand-in): the client's items in
# flight fail with -XFER_ECONN within seconds, and the client exits cleanly.
set -u
source "$XFER_ROOT/tests/lib/rdma.sh"
rdma_setup

rdma_serve victim --region rw:rw:33554432:1 || exit 1
timeout 60 "$FAKE/xfer_node" pump --peer "$WORK/victim.node" --ready "$WORK/ready" \
    >"$WORK/pump.log" 2>&1 &
pump=$!
for _ in $(seq 200); do [[ -f $WORK/ready ]] && break; sleep 0.05; done
[[ -f $WORK/ready ]] || { echo "pump never got going"; cat "$WORK/pump.log"; exit 1; }
start=$SECONDS
kill -KILL "$SERVE_PID"
wait "$pump"
rc=$?
took=$((SECONDS - start))
cat "$WORK/pump.log"
echo "pump exit $rc, ${took}s after the kill"
((rc == 0 && took <= 10))
