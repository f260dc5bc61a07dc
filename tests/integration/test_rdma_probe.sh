#!/usr/bin/env bash
# The production build (real libibverbs/librdmacm) on a machine without an
# RDMA device: rdma alone is refused with a clear reason, rdma,tcp falls
# back to tcp. On a machine with an active RDMA port it is skipped.
set -u
node=$B/tests/xfer_node
[[ -x $node ]] || { echo "SKIP: $node not built"; exit 77; }
if compgen -G "/sys/class/infiniband/*" >/dev/null; then
    echo "SKIP: this machine has RDMA devices (run docs/rdma.md's suite instead)"
    exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
XFER_TRANSPORTS=rdma XFER_LOG_LEVEL=info timeout 20 "$node" serve --out "$work/a" \
    --region rw:rw:4096 >"$work/rdma.log" 2>&1
rc=$?
cat "$work/rdma.log"
ok=1
((rc == 1)) || { echo "rdma only: exit $rc, want 1"; ok=0; }
grep -q "no RDMA device" "$work/rdma.log" || { echo "no 'no RDMA device' reason"; ok=0; }
XFER_TRANSPORTS=rdma,tcp XFER_LOG_LEVEL=info timeout 20 "$node" serve --out "$work/b" \
    --region rw:rw:4096 >"$work/both.log" 2>&1 &
pid=$!
for _ in $(seq 100); do [[ -f $work/b ]] && break; sleep 0.1; done
kill -TERM $pid 2>/dev/null
wait $pid
cat "$work/both.log"
grep -q '^transports=1$' "$work/b" 2>/dev/null || { echo "rdma,tcp did not fall back to tcp"; ok=0; }
((ok))
