#!/usr/bin/env bash
# tcpx with GPU memory (needs a CUDA device, else 77): the unpack kernel,
# per-fragment copies and host gather against the CPU reference on random
# fragment lists (tests/gpu/test_unpack.c), then GPU regions through the
# engine over tcpx on the test plugin in unpack mode with its bounce buffer
# in GPU memory (tests/gpu/gpu_xfer.c), once per unpack method.
set -u
B=${B:-build}
"$B/tests/test_unpack" || exit $?
source "$XFER_ROOT/tests/lib/tcpx.sh"
export XFER_TESTNET_MODE=unpack XFER_TESTNET_BOUNCE=cuda XFER_TCPX_NET_VERSION=7
for m in kernel d2d host; do
    echo "== GPU regions over tcpx, unpack $m"
    XFER_TCPX_UNPACK=$m timeout --kill-after=5 300 "$B/tests/gpu_xfer" --transport tcpx || exit 1
done
