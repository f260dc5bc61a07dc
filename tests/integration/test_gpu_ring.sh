#!/usr/bin/env bash
# GPU request rings fed by CPU threads (the kernels' producer code compiled
# for the CPU) against a peer engine in another process, over tcp and over
# ipc (tests/prog/xfer_ring_node.c): threads put slices and the receiver
# checks every byte, GETs bring them back, requests queued before the proxy
# starts are grouped into engine batches; a 4-slot ring under 8 threads
# (back-pressure); the peer frozen with requests in flight and queued, then
# the ring stopped: every request failed, counted and reported; the peer
# killed mid-stream: waits return -XFER_ECONN, the error word holds it.
set -u
source "$XFER_ROOT/tests/lib/core.sh"
prog=$CORE_BIN/xfer_ring_node

wait_file() { # FILE SECONDS PID: until FILE exists, PID lives, the time is not up
    local deadline=$((SECONDS + $2))
    until [[ -e $1 ]]; do
        ((SECONDS < deadline)) && core_alive "$3" || return 1
        sleep 0.02
    done
}

# The peers offer tcp and ipc; the client allows one of them.
peer() { XFER_TRANSPORTS=tcp,ipc core_start_prog "$1" "$prog" peer; }

run_transport() {
    local t=$1 out=$CORE_TMP/client-$1.out
    export XFER_TRANSPORTS=$t
    echo "== $t"
    peer "peer-$t" || exit 1
    local node=$CORE_TMP/peer-$t.node pid_var=PID_peer_$t
    timeout 120 "$prog" slices --peer "$node" --expect "$t" || core_fail "slices over $t"
    timeout 120 "$prog" pressure --peer "$node" --expect "$t" || core_fail "pressure over $t"
    # teardown: the peer frozen with requests in flight (ipc direct copies
    # need no owner, so they would all finish: this case needs the owner's path)
    local ready=$CORE_TMP/teardown-$t
    XFER_IPC_DIRECT=0 timeout 120 "$prog" teardown --peer "$node" --expect "$t" --ready "$ready" >"$out" 2>&1 &
    local client=$!
    CORE_PIDS+=("$client")
    wait_file "$ready" 30 "$client" || { cat "$out"; core_fail "teardown client did not start"; }
    core_freeze "${!pid_var}" || core_fail "peer did not stop"
    touch "$ready.go"
    wait "$client"; local rc=$?
    kill -CONT "${!pid_var}"
    cat "$out"
    ((rc == 0)) || core_fail "teardown over $t"
    core_stop "peer-$t"
    # the peer killed mid-stream
    peer "dead-$t" || exit 1
    ready=$CORE_TMP/dead-$t.ready
    pid_var=PID_dead_$t
    timeout 120 "$prog" dead --peer "$CORE_TMP/dead-$t.node" --expect "$t" --ready "$ready" \
        >"$out" 2>&1 &
    client=$!
    CORE_PIDS+=("$client")
    wait_file "$ready" 60 "$client" || { cat "$out"; core_fail "dead client did not stream"; }
    kill -KILL "${!pid_var}"
    wait "$client"; rc=$?
    cat "$out"
    ((rc == 0)) || core_fail "dead peer over $t"
}

run_transport tcp
run_transport ipc
echo "PASS"
