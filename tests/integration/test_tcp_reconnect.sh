#!/usr/bin/env bash
# A peer frozen (SIGSTOP) past io_timeout_ms has its sockets cut by the
# initiator; once it is resumed (SIGCONT), the same initiator engine must
# reach it again without xfer_peer_add/xfer_peer_connect and without either
# process restarting: the engine replaces the dead connection in the
# background (engine/peer_repair.c).
#   all:      a batch on every socket (2 per peer), all are cut
#   degraded: one 4 KiB item on 4 sockets: one is cut, transfers go on over
#             the others, and the engine replaces the connection once idle
set -u
source "$XFER_ROOT/tests/lib/core.sh"
core_start target --region rw:rw:4194304:3 || exit 1
wait_for() { # wait_for FILE CLIENT OUT WHAT
    local deadline=$((SECONDS + 30))
    until [[ -e $1 ]]; do
        ((SECONDS < deadline)) && core_alive "$2" || { kill -CONT "$PID_target"; cat "$3"; core_fail "$4"; }
        sleep 0.05
    done
}
blip() { # blip NAME SOCKETS PHASE
    local ready=$CORE_TMP/$1.ready out=$CORE_TMP/$1.out rc
    XFER_LOG_LEVEL=info "$CORE_BIN/xfer_node" blip --peer "$CORE_TMP/target.node" \
        --ready "$ready" --sockets "$2" --phase "$3" >"$out" 2>&1 &
    local client=$!
    CORE_PIDS+=("$client")
    wait_for "$ready" "$client" "$out" "$1: client did not start"
    core_freeze "$PID_target" || core_fail "$1: target did not stop" # every thread: kill returns first
    touch "$ready.go"
    wait_for "$ready.cut" "$client" "$out" "$1: sockets not cut"
    kill -CONT "$PID_target"
    touch "$ready.cont"
    if [[ $3 == degraded ]]; then
        wait_for "$ready.ok" "$client" "$out" "$1: no transfers after the freeze"
        local deadline=$((SECONDS + 15))
        until grep -q "re-established (some channels had died)" "$out"; do
            ((SECONDS < deadline)) || { touch "$ready.done"; cat "$out"; core_fail "$1: cut socket not replaced"; }
            sleep 0.05
        done
        touch "$ready.done"
    fi
    wait "$client"; rc=$?
    grep -E "^blip|FAIL|re-established" "$out"
    if ((rc != 0)) || grep -qE "Sanitizer|runtime error" "$out"; then
        tail -20 "$out"; core_fail "$1: peer not reachable again after the freeze"
    fi
}
blip all 2 all
blip degraded 4 degraded
core_stop target
echo "PASS"
