#!/usr/bin/env bash
# The engine/tcp conformance suite over tcpx on the test plugin in host mode
# (receives land in the posted buffer), through the newest struct (v12):
# random items with every byte checked (test_tcp_random), wrong/missing
# secret and a peer SIGKILLed mid-transfer (test_tcp_auth_kill), deadlines
# with a frozen peer and cancels mid-flight (test_tcp_deadline), vectored
# items naming their failed segment (test_vec_items).
set -u
source "$XFER_ROOT/tests/lib/tcpx.sh"
export XFER_TESTNET_MODE=host
tcpx_suite "host mode, v12"
