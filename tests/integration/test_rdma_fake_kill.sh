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
for _ in $(seq 600); do [[ -f $WORK/ready ]] && break; sleep 0.05; done
[[ -f $WORK/ready ]] || { echo "pump never got going"; cat "$WORK/pump.log"; exit 1; }
start=$SECONDS
kill -KILL "$SERVE_PID"
wait "$pump"
rc=$?
took=$((SECONDS - start))
cat "$WORK/pump.log"
echo "pump exit $rc, ${took}s after the kill"
ok=$((rc == 0 && took <= 10))

# Connecting to the dead node fails fast, with the CM's reason.
start=$SECONDS
timeout 30 "$FAKE/xfer_rdma_check" random --peer "$WORK/victim.node" >"$WORK/dead.log" 2>&1
rc=$?
cat "$WORK/dead.log"
echo "connect to the dead node: exit $rc after $((SECONDS - start))s"
# (Either nobody listens there any more: the CM rejects; or the dead node's
# port was handed to another listener, here the checker's own: the handshake
# names who answered instead of the node asked for.)
grep -qE "rejected|answered, expected victim" "$WORK/dead.log" || { echo "no reason given"; ok=0; }
((rc == 1 && SECONDS - start <= 5)) || ok=0
((ok))
