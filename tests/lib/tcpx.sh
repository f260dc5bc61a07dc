# Shared by the tcpx integration tests: every node and client loads the test
# NCCL net plugin (tests/tcpx/testnet.c) through XFER_TCPX_PLUGIN and allows
# tcpx alone, so nothing falls back to tcp unnoticed. Source after set -u.
: "${B:=build}"
: "${XFER_ROOT:=$PWD}"
TCPX_PLUGIN=$XFER_ROOT/$B/tests/libnccl-net-xfertest.so
[[ -f $TCPX_PLUGIN ]] || { echo "SKIP: $TCPX_PLUGIN not built"; exit 77; }
export XFER_TCPX_PLUGIN=$TCPX_PLUGIN XFER_TRANSPORTS=tcpx

# tcpx_suite LABEL: the engine/tcp conformance scripts over tcpx, the plugin
# mode already in the environment; items scaled to this plugin's speed
# (XFER_RANDOM_ITEMS overrides).
tcpx_suite() {
    export XFER_RANDOM_ITEMS=${XFER_RANDOM_ITEMS:-2000}
    source "$XFER_ROOT/tests/lib/core.sh"
    core_scripts "over tcpx ($1)" test_tcp_random test_tcp_auth_kill test_tcp_deadline \
        test_vec_items
}
