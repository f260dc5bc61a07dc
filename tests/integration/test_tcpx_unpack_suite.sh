#!/usr/bin/env bash
# The same suite over tcpx with the test plugin in unpack mode through the
# v7 struct, as GPUDirect-TCPX runs: every receive lands in the plugin's
# bounce buffer as fragments of random sizes, out of order, with gaps, and
# the transport checks the fragment lists and unpacks them into place
# (host memory here: the CPU copies; kernel/d2d on a GPU machine).
set -u
source "$XFER_ROOT/tests/lib/tcpx.sh"
export XFER_TESTNET_MODE=unpack XFER_TCPX_NET_VERSION=7
tcpx_suite "unpack mode, v7"
