#!/usr/bin/env bash
# The node library embedded in separate processes through a real
# redis-server (tests/prog/node_lib.c): named READ/WRITE over tcp and ipc
# with every byte checked and the transport reported, refusals, a transport
# requirement that cannot be met, a peer that black-holes SYNs (issue 18
# item 4: connecting to it stalls neither transfers to others nor registry
# events), and a peer restarted under the same name.
set -u
cd "${XFER_ROOT:-.}"
B=${B:-build}
PROG=$B/tests/node_lib
[[ -x $PROG ]] || { echo "FAIL: $PROG not built"; exit 1; }
source tests/lib/service.sh
dir=$(mktemp -d /tmp/xfer-nodelib.XXXXXX)
pids=()
declare -A PID=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
    redis_stop
    rm -rf "$dir"
}
trap cleanup EXIT
svc_redis_up

serve() { # NAME SEED TRANSPORTS [ARGS...]
    rm -f "$dir/$1.ready"
    "$PROG" serve --node "$1" --seed "$2" --transports "$3" --ready "$dir/$1.ready" "${@:4}" \
        >>"$dir/$1.log" 2>&1 &
    pids+=($!)
    PID[$1]=$!
    wait_for 10 test -s "$dir/$1.ready" || { cat "$dir/$1.log"; fail "$1 did not start"; }
}

serve srv-tcp 7 tcp
"$PROG" basic --node cli-tcp --peer srv-tcp --seed 7 --transports tcp --expect tcp ||
    fail "basic over tcp"
serve srv-ipc 8 tcp,ipc
"$PROG" basic --node cli-ipc --peer srv-ipc --seed 8 --transports tcp,ipc --expect ipc ||
    fail "basic over ipc"

# A port whose listen backlog is full: the kernel drops further SYNs.
python3 - "$dir/hole.port" <<'PY' &
import socket, sys, time
l = socket.socket(); l.bind(("127.0.0.1", 0)); l.listen(0)
c = socket.socket(); c.connect(l.getsockname())  # fills the backlog
open(sys.argv[1] + ".tmp", "w").write(str(l.getsockname()[1]))
import os; os.rename(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(300)
PY
pids+=($!)
wait_for 10 test -s "$dir/hole.port" || fail "black hole did not start"
"$PROG" blackhole --node cli-hole --peer srv-tcp --seed 7 --hole "$(cat "$dir/hole.port")" ||
    fail "black-holed peer"

"$PROG" restart --node cli-rs --peer srv-tcp --seed 7 --seed2 9 --go "$dir/go" &
client=$!
pids+=($client)
wait_for 20 test -e "$dir/go" || fail "restart client did not get going"
kill "${PID[srv-tcp]}"
wait "${PID[srv-tcp]}" 2>/dev/null
serve srv-tcp 9 tcp --ro-first
wait "$client" || fail "restart"
echo "PASS"
