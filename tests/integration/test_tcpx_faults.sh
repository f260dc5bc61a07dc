#!/usr/bin/env bash
# tcpx with bad input and a misbehaving plugin. One target node; clients:
#  - engine-level bad input (access, bounds, overflow, stale generation,
#    unknown region, stale descriptors), protected content intact after;
#  - a client whose plugin fails its requests, reports more bytes than
#    posted, describes fragments outside the receive, or never completes:
#    every item ends with a clear error within its deadline, no crash, and
#    the target keeps serving;
#  - the fallback: a client without the plugin uses tcp, and says why.
set -u
source "$XFER_ROOT/tests/lib/core.sh"
source "$XFER_ROOT/tests/lib/tcpx.sh"
export XFER_TESTNET_MODE=unpack XFER_TCPX_NET_VERSION=7
export XFER_TRANSPORTS=tcpx,tcp
core_start target --io-timeout 2000 --region rw:rw:1048576:5 --region ro:r:4194304:6 \
    --region wo:w:65536 --region regen:rw:65536 --region scratch:rw:33554432 --regen regen || exit 1
node=$CORE_TMP/target.node
check() { timeout 60 "$CORE_BIN/tcpx_check" --peer "$node" --region scratch "$@"; }
XFER_TRANSPORTS=tcpx "$CORE_BIN/xfer_node" bad --peer "$node" --phase setup ||
    core_fail "engine-level bad input over tcpx"
check --transport tcpx || core_fail "clean run"

# faults start after 4 requests of the client's plugin (connections are up)
XFER_TESTNET_FAULT=oversize check --transport tcpx --expect-read EPROTO --expect-write ok ||
    core_fail "plugin reporting more bytes than posted"
XFER_TESTNET_FAULT=badmeta check --transport tcpx --expect-read EPROTO --expect-write ok ||
    core_fail "plugin describing a fragment outside the receive"
XFER_TESTNET_FAULT=error check --transport tcpx --expect-read error --expect-write error ||
    core_fail "plugin failing its requests"
XFER_TESTNET_FAULT=hang XFER_TESTNET_FAULT_AFTER=0 check --transport tcpx --deadline 1500 --expect-read ETIMEDOUT \
    --expect-write ETIMEDOUT || core_fail "plugin never completing"
# a misbehaving plugin on the target side: oversize WRITE receives
core_alive "$PID_target" || core_fail "target died"
check --transport tcpx || core_fail "target serves after the faults"

# fallback: no plugin on the client
XFER_TCPX_PLUGIN=/nonexistent/libnccl-net.so XFER_LOG_LEVEL=info check --transport tcp \
    >"$CORE_TMP/fallback.out" 2>&1 || { cat "$CORE_TMP/fallback.out"; core_fail "fallback to tcp"; }
cat "$CORE_TMP/fallback.out" | grep -E "transport|tcpx" | head -4
grep -q "transport tcpx not usable: no NCCL net plugin" "$CORE_TMP/fallback.out" ||
    core_fail "no log line saying why tcpx is not used"
# fallback: no plugin on the target, so it offers no tcpx
XFER_TCPX_PLUGIN=/nonexistent/libnccl-net.so core_start plain --region scratch:rw:33554432 || exit 1
XFER_LOG_LEVEL=info timeout 60 "$CORE_BIN/tcpx_check" --peer "$CORE_TMP/plain.node" --region scratch \
    --transport tcp >"$CORE_TMP/fallback2.out" 2>&1 ||
    { cat "$CORE_TMP/fallback2.out"; core_fail "fallback to tcp for a peer without tcpx"; }
grep "does not offer tcpx" "$CORE_TMP/fallback2.out" | head -1
grep -q "does not offer tcpx" "$CORE_TMP/fallback2.out" || core_fail "no log line for the peer without tcpx"
core_stop plain
XFER_TRANSPORTS=tcpx "$CORE_BIN/xfer_node" bad --peer "$node" --phase check ||
    core_fail "content after the faults"
core_stop target
echo "PASS"
