# Shared helpers of the engine/tcp integration tests. Source after set -u.
# Every process started with core_start is killed on exit, even on failure.
: "${B:=build}"
: "${XFER_ROOT:=$PWD}"
CORE_BIN=${CORE_BIN:-$XFER_ROOT/$B/tests} # another build of the helpers (e.g. tests/fake)
CORE_TMP=$(mktemp -d /tmp/xfer-core.XXXXXX)
CORE_PIDS=()

core_cleanup() {
    local p
    for p in "${CORE_PIDS[@]}"; do kill "$p" 2>/dev/null && kill -CONT "$p" 2>/dev/null; done
    for p in "${CORE_PIDS[@]}"; do wait "$p" 2>/dev/null; done
    rm -rf "$CORE_TMP"
}
trap core_cleanup EXIT

# Under ASan everything is slower; tests may scale work down with this.
core_san() { [[ $B == *san* ]]; }

# core_start NAME serve-args...: starts a node whose node file is
# $CORE_TMP/NAME.node and log $CORE_TMP/NAME.log; waits until it is ready.
core_start() {
    local name=$1; shift
    core_start_prog "$name" "$CORE_BIN/xfer_node" serve "$@"
}

# core_start_prog NAME PROG ARGS...: the same for another serving program
# that takes --out FILE --node NAME and writes the node file when ready.
core_start_prog() {
    local name=$1; shift
    "$@" --out "$CORE_TMP/$name.node" --node "$name" >"$CORE_TMP/$name.log" 2>&1 &
    local pid=$!
    CORE_PIDS+=("$pid")
    eval "PID_${name//-/_}=$pid"
    local deadline=$((SECONDS + 60)) # filling big regions takes long on a loaded machine
    until [[ -s $CORE_TMP/$name.node ]]; do
        if ! kill -0 "$pid" 2>/dev/null || ((SECONDS > deadline)); then
            echo "node $name did not start:"; cat "$CORE_TMP/$name.log"; return 1
        fi
        sleep 0.05
    done
}

core_alive() { kill -0 "$1" 2>/dev/null; }

source "$(dirname "${BASH_SOURCE[0]}")/freeze.sh"
# core_freeze PID: SIGSTOP and wait until every thread stopped (freeze.sh).
core_freeze() { pid_freeze "$@"; }

# Fails the test with a message.
core_fail() { echo "FAIL: $*"; exit 1; }

# core_stop NAME: SIGTERM, wait (bounded), and fail on a bad exit or any
# sanitizer report in its log (leaks included: the node frees everything).
core_stop() {
    local name=$1 var="PID_${1//-/_}" rc
    local pid=${!var}
    kill -TERM "$pid" 2>/dev/null
    local deadline=$((SECONDS + 15))
    while core_alive "$pid" && ((SECONDS < deadline)); do sleep 0.05; done
    core_alive "$pid" && core_fail "node $name did not stop within 15 s"
    wait "$pid"; rc=$?
    if ((rc != 0)) || grep -qE "Sanitizer|runtime error" "$CORE_TMP/$name.log"; then
        tail -40 "$CORE_TMP/$name.log"
        core_fail "node $name exited with $rc or reported errors"
    fi
    grep "served_ops" "$CORE_TMP/$name.log"
}

# core_scripts LABEL SCRIPT...: runs tests/integration/SCRIPT.sh one after
# the other in the current environment (another transport's helpers, say),
# output indented; returns 1 if any failed.
core_scripts() {
    local label=$1 rc=0 t st
    shift
    for t in "$@"; do
        echo "== $t $label"
        bash "$XFER_ROOT/tests/integration/$t.sh" 2>&1 | sed 's/^/   /'
        st=${PIPESTATUS[0]}
        echo "== $t $label: exit $st"
        ((st == 0)) || rc=1
    done
    return $rc
}
