#!/usr/bin/env bash
# Notifications (docs/notify.md), two processes, over tcp (4 sockets, 1 and
# 3 progress threads) and ipc (same host), XFER_NOTIFY_TRANSPORTS picks:
#  1. ordering: XFER_NOTIFY_BATCHES (10,000) batches of 1..8 random WRITE
#     items, each with a bound notification; the receiver checksums every
#     range of a batch the moment it reads the notification: zero early ones;
#  2. a batch with one out-of-bounds item: the notification arrives marked
#     failed and names item 1, the other items' data is there; a batch
#     cancelled right after submit: its notification still arrives (marked
#     cancelled, naming the item, unless the WRITE won the race);
#  3. back-pressure: a receiver that reads nothing, queue of 4: 4 accepted,
#     the rest refused with -XFER_ENOSPC (standalone and bound), nothing
#     lost, the queue works again after a drain;
#  4. (tcp) bad message frames from a raw client: answered -XFER_EPROTO or
#     the connection cut; the node keeps serving;
#  5. (tcp) notifications racing a reconnect: a stream of standalone
#     notifications while the receiver is frozen past io_timeout and resumed;
#     every acknowledged one arrived exactly once, none twice.
#  6. closing right after a notification: a receiver frees its engine the
#     moment "BYE" is queued while its answer is still on the way (its
#     sendmsg delayed 300 ms by tests/slowsend); the sender's xfer_notify
#     must still return 0, over tcp and ipc (ipc once cut the answer off:
#     docs/notify.md, "Closing right after a notification").
# The storm's receiver, and tcp with 3 progress threads, wait in
# xfer_notif_wait (XFER_TEST_NOTIF_WAIT: the waiting thread reads the
# sender's sockets itself) instead of sleeping on the queue's fd.
# Parts 1-3 run over ipc twice: with direct copies (the submitter copies and
# sends the notification) and with XFER_IPC_DIRECT=0 (items through the
# connection's worker, notifications from the message thread on the same
# socket).
# XFER_NOTIFY_ONLY="rdma" runs parts 1-3 over those transports only
# (test_rdma_notify.sh: rdma on the verbs stand-in).
set -u
source "$XFER_ROOT/tests/lib/core.sh"
batches=${XFER_NOTIFY_BATCHES:-10000}
core_san && batches=${XFER_NOTIFY_BATCHES:-3000}
storm_n=20000
core_san && storm_n=5000
seed=${XFER_NOTIFY_SEED:-$RANDOM}
N=$CORE_BIN/xfer_notify
echo "seed $seed, $batches batches"

one_transport() { # transport progress-threads [label]
    local tr=$1 pt=$2 tag=$1-$2${3:+-$3}
    # a node file needs a tcp port: ipc runs allow tcp too, and the sender
    # checks that ipc (preferred on one host) is what it got
    export XFER_TRANSPORTS=$tr XFER_NOTIFY_EXPECT=$tr XFER_TEST_PROGRESS_THREADS=$pt
    [[ $tr == ipc ]] && XFER_TRANSPORTS=ipc,tcp
    echo "== $tr, $pt progress thread(s)${3:+, $3}"
    core_start_prog "recv-$tag" "$N" serve --mb 192 || exit 1
    local node=$CORE_TMP/recv-$tag.node
    timeout 300 "$N" order --peer "$node" --batches "$batches" --depth 16 --sockets 4 \
        --seed "$seed" || core_fail "$tag: ordering"
    timeout 60 "$N" failed --peer "$node" || core_fail "$tag: failed item"
    timeout 60 "$N" cancel --peer "$node" || core_fail "$tag: cancel"
    if [[ $tr == tcp ]]; then
        timeout 60 "$N" wire --peer "$node" || core_fail "$tag: bad frames"
        timeout 60 "$N" failed --peer "$node" || core_fail "$tag: served after bad frames"
    fi
    core_stop "recv-$tag"
    grep -q "notifications: good=$batches bad=0 failed_ok=[12] ends=1 end_n=$batches" \
        "$CORE_TMP/recv-$tag.log" || { cat "$CORE_TMP/recv-$tag.log"; core_fail "$tag: receiver"; }
    grep -q "cancel_ok=1" "$CORE_TMP/recv-$tag.log" ||
        { cat "$CORE_TMP/recv-$tag.log"; core_fail "$tag: notification of a cancelled batch"; }
    grep notifications: "$CORE_TMP/recv-$tag.log"

    core_start_prog "held-$tag" "$N" serve --mb 1 --queue 4 --hold "$CORE_TMP/go-$tag" || exit 1
    timeout 120 "$N" flood --peer "$CORE_TMP/held-$tag.node" --count 10 --queue 4 \
        --ready "$CORE_TMP/go-$tag" || core_fail "$tag: back-pressure sender"
    core_stop "held-$tag"
    grep -q "held: go=1 pending=4 refused=7 floods=4 expect=4/7 bad=0" "$CORE_TMP/held-$tag.log" ||
        { cat "$CORE_TMP/held-$tag.log"; core_fail "$tag: back-pressure receiver"; }
}

storm() {
    export XFER_TRANSPORTS=tcp XFER_NOTIFY_EXPECT=tcp XFER_TEST_PROGRESS_THREADS=1
    # the receiver waits in xfer_notif_wait for any peer: its thread reads
    # the sender's sockets while they are cut and replaced
    export XFER_TEST_NOTIF_WAIT=any
    echo "== tcp, notifications racing a reconnect"
    core_start_prog storm "$N" serve --mb 1 || exit 1
    local acked=$CORE_TMP/storm.acked
    timeout 120 "$N" storm --peer "$CORE_TMP/storm.node" --count "$storm_n" --ready "$acked" &
    local sp=$!
    CORE_PIDS+=("$sp")
    local deadline=$((SECONDS + 30))
    until [[ -s $acked && $(wc -l <"$acked") -ge 200 ]]; do
        ((SECONDS < deadline)) || core_fail "storm did not start"
        sleep 0.05
    done
    core_freeze "$PID_storm" || core_fail "freeze"
    sleep 4 # past the sender's io_timeout (3 s): its sockets are cut
    kill -CONT "$PID_storm"
    wait "$sp" || core_fail "storm sender"
    core_stop storm
    grep "storm:" "$CORE_TMP/storm.log"
    grep -q "storm: received=[0-9]* dups=0" "$CORE_TMP/storm.log" || core_fail "duplicates"
    local missing
    missing=$(sort "$acked" | comm -23 - <(sort "$CORE_TMP/storm.node.storm") | head -3)
    [[ -z $missing ]] || core_fail "acknowledged but never received: $missing"
    grep -q "notif_wait: empty queue, 150 ms: 0 after" "$CORE_TMP/storm.log" ||
        core_fail "xfer_notif_wait bounds"
    unset XFER_TEST_NOTIF_WAIT
}

close_after() { # transport
    local tr=$1
    export XFER_TRANSPORTS=$tr XFER_NOTIFY_EXPECT=$tr XFER_TEST_PROGRESS_THREADS=1
    [[ $tr == ipc ]] && XFER_TRANSPORTS=ipc,tcp
    echo "== $tr, closing right after a notification"
    local shim=$XFER_ROOT/$B/tests/libslowsend.so armed=$CORE_TMP/armed-$tr
    [[ -f $shim ]] || core_fail "missing $shim"
    # ASan wants to come first among loaded libraries; the shim only delays.
    ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0 LD_PRELOAD=$shim \
        core_start_prog "closer-$tr" "$N" closer --ready "$armed" || exit 1
    timeout 60 "$N" bye --peer "$CORE_TMP/closer-$tr.node" --ready "$armed" ||
        core_fail "$tr: a notification queued by a closing receiver was not answered"
    # The closer exits by itself once its engine is freed (after its last,
    # delayed sendmsg: over ipc the orderly close's BYE); then collect it.
    local var="PID_closer_$tr" deadline=$((SECONDS + 15))
    while core_alive "${!var}" && ((SECONDS < deadline)); do sleep 0.05; done
    core_stop "closer-$tr"
    grep "closer:" "$CORE_TMP/closer-$tr.log"
}

if [[ -n ${XFER_NOTIFY_ONLY:-} ]]; then
    for tr in $XFER_NOTIFY_ONLY; do
        one_transport "$tr" 1
        one_transport "$tr" 3
    done
    echo "PASS"
    exit 0
fi
storm
for tr in ${XFER_NOTIFY_TRANSPORTS:-tcp ipc}; do
    one_transport "$tr" 1
    close_after "$tr"
done
if [[ " ${XFER_NOTIFY_TRANSPORTS:-tcp ipc} " == *" ipc "* ]]; then
    # ipc without direct copies: every item goes through the connection's
    # worker, whose MAP/ACQ/REL round trips share the socket with the
    # notifications (answers owed to messages are read first: ipc_link.c)
    export XFER_IPC_DIRECT=0
    one_transport ipc 1 nodirect
    unset XFER_IPC_DIRECT
fi
# the receiver waits in xfer_notif_wait for the sender: its thread reads
# the sender's 4 sockets (WRITE payloads, notifications behind them, bad
# frames) beside the 3 progress threads
XFER_TEST_NOTIF_WAIT=notify-sender one_transport tcp 3 notif-wait
if [[ " ${XFER_NOTIFY_TRANSPORTS:-tcp ipc} " == *" ipc "* ]]; then
    # the receiver's thread in xfer_notif_wait reads the sender's ipc
    # connection itself (ipc_notif_wait_rx)
    XFER_TEST_NOTIF_WAIT=notify-sender one_transport ipc 1 notif-wait
fi
echo "PASS"
