/*
 * Many GPU<->GPU items of one ipc group as batched-copy kernel launches
 * (kernels/kbatch.cu, docs/kernels.md "Engine helpers"): one launch per
 * (copy GPU, other GPU) pair with at least XFER_KBATCH_MIN_ITEMS items,
 * instead of one cudaMemcpyAsync each, which costs a few microseconds per
 * item and leaves small KV blocks far from the link's speed.
 *
 * The launch runs on the GPU holding the peer's memory (where its handle was
 * opened), as ipc's copy-engine path does by default; the local GPU is its
 * peer. Where the two GPUs cannot reach each other as peers the kernel path
 * says -XFER_ENOTSUP and the caller keeps per-item copies.
 */
#include "ipc.h"
#include "xfer_kernels.h"

#include <stdlib.h>

/* Starts launches for the groups of v[0..n) large enough; v[i].ticket is set
 * (>= 0) for every copy a launch took, left -1 for the others. */
void ipc_kbatch_start(struct xfer_kbatch **kb, struct ipc_kcopy *v, size_t n)
{
    if (n < XFER_KBATCH_MIN_ITEMS || getenv("XFER_IPC_NO_KBATCH"))
        return;
    if (!*kb && xfer_kbatch_new(kb) < 0)
        return;
    struct xfer_copy_desc *d = malloc(n * sizeof(*d));
    size_t *which = malloc(n * sizeof(*which));
    bool *done = calloc(n, sizeof(*done));
    if (!d || !which || !done)
        goto out;
    for (size_t i = 0; i < n; i++) {
        if (done[i])
            continue;
        size_t k = 0; /* every copy with the same pair as v[i] */
        for (size_t j = i; j < n; j++) {
            if (done[j] || v[j].exec != v[i].exec || v[j].other != v[i].other)
                continue;
            done[j] = true;
            d[k] = (struct xfer_copy_desc){.dst = v[j].dst, .src = v[j].src, .len = v[j].len};
            which[k++] = j;
        }
        if (k < XFER_KBATCH_MIN_ITEMS)
            continue;
        uint64_t mask = v[i].other >= 0 && v[i].other != v[i].exec ? 1ull << v[i].other : 0;
        int t = xfer_kbatch_start(*kb, v[i].exec, mask, d, k);
        if (t < 0) {
            xfer_debug("ipc: batched copy on cuda:%d not used (%s): %s", v[i].exec,
                       xfer_strerror(t), xfer_kbatch_last_error(*kb));
            continue;
        }
        for (size_t x = 0; x < k; x++)
            v[which[x]].ticket = t;
    }
out:
    free(d);
    free(which);
    free(done);
}

/* Waits for every launch v[] started: v[i].status = its result. */
void ipc_kbatch_finish(struct xfer_kbatch *kb, struct ipc_kcopy *v, size_t n, int timeout_ms)
{
    for (size_t i = 0; i < n; i++) {
        if (v[i].ticket < 0)
            continue;
        int t = v[i].ticket;
        int rc = xfer_kbatch_wait(kb, t, timeout_ms);
        for (size_t j = i; j < n; j++)
            if (v[j].ticket == t) {
                v[j].status = rc;
                v[j].ticket = -1;
                v[j].ran = true;
            }
    }
}

void ipc_kbatch_start_runs(struct xfer_kbatch **kb, struct ipc_krun *v, size_t n)
{
    if (n == 0 || getenv("XFER_IPC_NO_KBATCH"))
        return;
    if (!*kb && xfer_kbatch_new(kb) < 0)
        return;
    struct xfer_copy_run r[IPC_BATCH_MAX];
    size_t which[IPC_BATCH_MAX];
    bool seen[IPC_BATCH_MAX] = {false}; /* runs of a pair already launched */
    for (size_t i = 0; i < n && i < IPC_BATCH_MAX; i++) {
        if (seen[i])
            continue;
        size_t k = 0, segs = 0;
        uint64_t total = 0;
        for (size_t j = i; j < n && j < IPC_BATCH_MAX; j++) { /* every run of v[i]'s pair */
            if (seen[j] || v[j].exec != v[i].exec || v[j].other != v[i].other)
                continue;
            seen[j] = true;
            r[k] = v[j].run;
            which[k++] = j;
            segs += v[j].run.n;
            total += v[j].bytes;
        }
        if (segs < XFER_KBATCH_MIN_ITEMS)
            continue;
        uint64_t mask = v[i].other >= 0 && v[i].other != v[i].exec ? 1ull << v[i].other : 0;
        int t = xfer_kbatch_start_runs(*kb, v[i].exec, mask, r, k, total);
        if (t < 0) {
            xfer_debug("ipc: batched copy on cuda:%d not used (%s): %s", v[i].exec,
                       xfer_strerror(t), xfer_kbatch_last_error(*kb));
            continue;
        }
        for (size_t x = 0; x < k; x++)
            v[which[x]].ticket = t;
    }
}

void ipc_kbatch_finish_runs(struct xfer_kbatch *kb, struct ipc_krun *v, size_t n, int timeout_ms)
{
    for (size_t i = 0; i < n; i++) {
        if (v[i].ticket < 0)
            continue;
        int t = v[i].ticket;
        int rc = xfer_kbatch_wait(kb, t, timeout_ms);
        for (size_t j = i; j < n; j++)
            if (v[j].ticket == t) {
                v[j].status = rc;
                v[j].ticket = -1;
                v[j].ran = true;
            }
    }
}
