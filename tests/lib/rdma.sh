# Shared helpers of the rdma integration tests. Nodes run the test programs
# linked with the verbs stand-in ($B/tests/fake/*, tests/fakeverbs/) and
# XFER_TRANSPORTS=rdma, so nothing can fall back to tcp unnoticed.
# Usage: source, then rdma_setup; every node started is stopped on exit.

rdma_setup() {
    FAKE=${FAKE:-$B/tests/fake}
    if [[ ! -x $FAKE/xfer_node || ! -x $FAKE/xfer_rdma_check ]]; then
        echo "SKIP: $FAKE/xfer_node or xfer_rdma_check not built"
        exit 77
    fi
    WORK=$(mktemp -d)
    NODE_PIDS=()
    trap rdma_cleanup EXIT
    export XFER_TRANSPORTS=rdma XFER_LOG_LEVEL=${XFER_LOG_LEVEL:-warn}
}

rdma_cleanup() {
    local pid
    for pid in "${NODE_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null; done
    for pid in "${NODE_PIDS[@]}"; do
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    done
    rm -rf "$WORK"
}

# rdma_serve NAME [xfer_node serve options...]: starts a node, waits (10 s
# at most) for its node file $WORK/NAME.node, sets SERVE_PID.
rdma_serve() {
    local name=$1; shift
    "$FAKE/xfer_node" serve --out "$WORK/$name.node" --node "$name" "$@" \
        >"$WORK/$name.log" 2>&1 &
    SERVE_PID=$!
    NODE_PIDS+=("$SERVE_PID")
    for _ in $(seq 100); do
        [[ -f $WORK/$name.node ]] && { grep -q '^nics=[^-]' "$WORK/$name.node" || {
            echo "node $name published no RDMA NIC"; cat "$WORK/$name.node"; return 1; }; return 0; }
        kill -0 "$SERVE_PID" 2>/dev/null || break
        sleep 0.1
    done
    echo "node $name did not start"; cat "$WORK/$name.log"
    return 1
}

# step NAME command...: runs one step with a time limit, prints its output
# indented, records a failure.
FAILED=0
step() {
    local name=$1; shift
    echo "== $name"
    if ! timeout 120 "$@" >"$WORK/step.log" 2>&1; then
        FAILED=$((FAILED + 1))
        echo "FAILED: $name"
    fi
    sed 's/^/   /' "$WORK/step.log"
}
