# Shared by the tcpx integration tests: every node and client loads the test
# NCCL net plugin (tests/tcpx/testnet.c) through XFER_TCPX_PLUGIN and allows
# tcpx alone, so nothing falls back to tcp unnoticed. Source after set -u.
: "${B:=build}"
: "${XFER_ROOT:=$PWD}"
TCPX_PLUGIN=$XFER_ROOT/$B/tests/libnccl-net-xfertest.so
[[ -f $TCPX_PLUGIN ]] || { echo "SKIP: $TCPX_PLUGIN not built"; exit 77; }
export XFER_TCPX_PLUGIN=$TCPX_PLUGIN XFER_TRANSPORTS=tcpx

# tcpx_suite NAME: the engine/tcp conformance scripts over tcpx with the
# plugin mode already in the environment; items scaled to this plugin's
# speed (XFER_RANDOM_ITEMS overrides).
tcpx_suite() {
    local rc=0 t st
    export XFER_RANDOM_ITEMS=${XFER_RANDOM_ITEMS:-2000}
    for t in test_tcp_random test_tcp_auth_kill test_tcp_deadline; do
        echo "== $t over tcpx ($1)"
        bash "$XFER_ROOT/tests/integration/$t.sh" 2>&1 | sed 's/^/   /'
        st=${PIPESTATUS[0]}
        echo "== $t over tcpx ($1): exit $st"
        ((st == 0)) || rc=1
    done
    return $rc
}
