#!/usr/bin/env bash
# Two-sided messages (docs/notify.md), two processes that are peers of each
# other (tests/prog/xfer_sendrecv.c), over tcp and over ipc: 1,000 messages
# of random sizes in both directions at once through vectored SEND and
# any-tag RECV batches, every byte and index checked; exact-tag receives in
# reverse tag order (FIFO per sender and tag, messages waiting unmatched);
# truncation on both sides (eager and rendezvous sizes); a RECV's deadline
# and cancel. Then (tcp, ipc, ipc with the message waiter) a peer killed with SENDs (eager and
# rendezvous) and a RECV pending towards it: all end -XFER_ECONN within half
# their deadline (ipc: the unix socket's hang-up, ipc_conn_state); b is
# stopped first and a notification sent to it meanwhile (submit must not
# wait for it; ipc: its answer is left to the connection's worker) also
# ends -XFER_ECONN once b is killed.
# XFER_SENDRECV_TRANSPORTS / XFER_SENDRECV_KILL pick the transports
# (test_rdma_notify.sh: rdma on the verbs stand-in for both).
set -u
source "$XFER_ROOT/tests/lib/core.sh"
S=$CORE_BIN/xfer_sendrecv
count=${XFER_SENDRECV_COUNT:-1000}
seed=${XFER_SENDRECV_SEED:-$RANDOM}
echo "seed $seed"

pair() { # label [extra args for both]
    local l=$1; shift
    "$S" --node "a-$l" --role a --out "$CORE_TMP/a-$l.node" --other "$CORE_TMP/b-$l.node" \
        --count "$count" --seed "$seed" "$@" >"$CORE_TMP/a-$l.log" 2>&1 &
    PID_a=$!
    "$S" --node "b-$l" --role b --out "$CORE_TMP/b-$l.node" --other "$CORE_TMP/a-$l.node" \
        --count "$count" --seed "$seed" "$@" >"$CORE_TMP/b-$l.log" 2>&1 &
    PID_b=$!
    CORE_PIDS+=("$PID_a" "$PID_b")
}

for tr in ${XFER_SENDRECV_TRANSPORTS:-tcp ipc}; do
    echo "== $tr"
    # two progress threads, and waiters reading their peer's message
    # socket (tcp_wait.c; XFER_WAIT_RX_IN=0 would turn it off): the
    # socket's owner and a waiter both want it
    export XFER_TRANSPORTS=$tr XFER_NOTIFY_EXPECT=$tr XFER_TEST_PROGRESS_THREADS=2 XFER_WAIT_RX_IN=1
    [[ $tr == ipc ]] && XFER_TRANSPORTS=ipc,tcp # node files need a tcp port
    pair "$tr"
    wait "$PID_a"; ra=$?
    wait "$PID_b"; rb=$?
    cat "$CORE_TMP/a-$tr.log" "$CORE_TMP/b-$tr.log"
    ((ra == 0 && rb == 0)) || core_fail "$tr: a exit $ra, b exit $rb"
done

# ipc-w: ipc with a's waiter reading b's connection (ipc_serve_rx.c): it
# polls it while b is frozen, then reads the hang-up when b is killed.
for ktr in ${XFER_SENDRECV_KILL:-tcp ipc ipc-w}; do
    echo "== $ktr, peer killed with messages pending"
    export XFER_TRANSPORTS=${ktr%-w} XFER_NOTIFY_EXPECT=${ktr%-w} XFER_TEST_PROGRESS_THREADS=1 XFER_WAIT_RX_IN=0
    [[ $ktr == ipc* ]] && XFER_TRANSPORTS=ipc,tcp
    [[ $ktr == *-w ]] && XFER_WAIT_RX_IN=1
    count=50
    rm -f "$CORE_TMP"/go*
    pair "kill-$ktr" --ready "$CORE_TMP/go" --stop
    deadline=$((SECONDS + 60))
    until [[ -e $CORE_TMP/go ]]; do
        core_alive "$PID_a" || { cat "$CORE_TMP/a-kill-$ktr.log"; core_fail "a died early"; }
        ((SECONDS < deadline)) || core_fail "a never got to the kill phase"
        sleep 0.05
    done
    # stopped first: a's notification sent meanwhile is owed its answer when b dies.
    # Every thread of b stopped before a is told: kill -STOP returns while b's
    # progress thread may run on for tens of ms under load and answer the
    # notification (seen once: it ended in success, docs/notify.md)
    core_freeze "$PID_b" || core_fail "b did not stop"
    touch "$CORE_TMP/go.stopped"
    until [[ -e $CORE_TMP/go.sent ]]; do
        core_alive "$PID_a" || { cat "$CORE_TMP/a-kill-$ktr.log"; core_fail "a died"; }
        ((SECONDS < deadline)) || core_fail "a never sent to the stopped peer"
        sleep 0.05
    done
    kill -9 "$PID_b"
    wait "$PID_a"; ra=$?
    cat "$CORE_TMP/a-kill-$ktr.log"
    ((ra == 0)) || core_fail "$ktr: pending messages of a killed peer (exit $ra)"
done
echo "PASS"
