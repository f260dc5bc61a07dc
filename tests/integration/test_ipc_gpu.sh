#!/usr/bin/env bash
# ipc transport, CUDA memory, two processes: the matrix (GPU->GPU on one
# device and across devices, CPU<->GPU both ways, CPU->CPU, cuMem POSIX-fd
# allocations), READ and WRITE, checksums computed on the GPU (also with
# GPU loans, the default, and without them, XFER_IPC_DIRECT_GPU=0); a freed
# allocation; with 2+ GPUs, an owner GPU the initiator cannot see.
# Exit 77 ("skipped: no CUDA device") where there is none.
set -u
node=$B/tests/ipc_node
[[ -x $node ]] || { echo "missing $node"; exit 1; }
# without GPU loans: every GPU item through the initiator's ipc worker and
# the owner's check (the path of regions under lease rules)
out=$(XFER_IPC_DIRECT_GPU=0 timeout --kill-after=5 600 "$node" gpu 2>&1)
rc=$?
echo "without GPU loans (XFER_IPC_DIRECT_GPU=0):"
echo "$out"
((rc == 0)) || exit $rc
# again with GPU loans (the default: the owner lends CUDA regions, GPU
# items are launched by the posting thread, docs/ipc.md "GPU loans"); the
# loan trace (one line per launch at exit, kind b = block runs, s = plain
# and vectored items) shows that plain and vectored items took loans too
out=$(XFER_DGPU_TRACE=1 timeout --kill-after=5 600 "$node" gpu 2>&1)
rc=$?
echo "GPU loans (default):"
grep -v '^dgpu-trace' <<<"$out"
((rc == 0)) || exit $rc
nb=$(grep -c '^dgpu-trace .* b$' <<<"$out")
ns=$(grep -c '^dgpu-trace .* s$' <<<"$out")
echo "GPU loan launches: $nb of block items, $ns of plain/vectored items"
((nb >= 4 && ns >= 8)) || { echo "FAIL too few GPU loan launches"; exit 1; }
if grep -q "[2-9] GPU(s) visible" <<<"$out"; then
    CUDA_VISIBLE_DEVICES=0 IPC_OWNER_CUDA_VISIBLE_DEVICES=0,1 \
        timeout --kill-after=5 300 "$node" gpu --hidden-peer || exit 1
fi
echo "all ipc gpu tests passed"
