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

/* Peer mask of a launch on exec whose other side is on GPU other. */
static uint64_t pair_mask(int exec, int other)
{
    return other >= 0 && other != exec ? 1ull << other : 0;
}

/* t: a launch's ticket, or why there is none (logged; the caller copies
 * those items otherwise). */
static bool launched(struct xfer_kbatch *kb, int t, int exec)
{
    if (t < 0)
        xfer_debug("ipc: batched copy on cuda:%d not used (%s): %s", exec, xfer_strerror(t),
                   xfer_kbatch_last_error(kb));
    return t >= 0;
}

/* Starts launches for the groups of v[0..n) large enough; v[i].w.ticket is set
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
        int t = xfer_kbatch_start(*kb, v[i].exec, pair_mask(v[i].exec, v[i].other), d, k);
        for (size_t x = 0; launched(*kb, t, v[i].exec) && x < k; x++)
            v[which[x]].w.ticket = t;
    }
out:
    free(d);
    free(which);
    free(done);
}

void ipc_kbatch_finish(struct xfer_kbatch *kb, struct ipc_kwait *w, size_t stride, size_t n,
                       int timeout_ms)
{
#define KW(i) ((struct ipc_kwait *)((char *)w + (i)*stride))
    for (size_t i = 0; i < n; i++) {
        int t = KW(i)->ticket;
        if (t < 0)
            continue;
        int rc = xfer_kbatch_wait(kb, t, timeout_ms);
        for (size_t j = i; j < n; j++)
            if (KW(j)->ticket == t)
                *KW(j) = (struct ipc_kwait){.ticket = -1, .status = rc, .ran = true};
    }
#undef KW
}

/* Launches the runs of v[0..n) in which[0..k) (one GPU pair, one kind):
 * segment runs only from XFER_KBATCH_MIN_ITEMS segments on. */
static void start_pair(struct xfer_kbatch *kb, struct ipc_krun *v, const size_t *which, size_t k,
                       bool blk)
{
    struct xfer_copy_run r[IPC_BATCH_MAX];
    struct xfer_block_run br[IPC_BATCH_MAX];
    size_t segs = 0;
    uint64_t total = 0;
    for (size_t x = 0; x < k; x++) {
        const struct ipc_krun *q = &v[which[x]];
        if (blk)
            br[x] = q->blk;
        else
            r[x] = q->run;
        segs += blk ? q->blk.s1 - q->blk.s0 : q->run.n;
        total += q->bytes;
    }
    if (k == 0 || (!blk && segs < XFER_KBATCH_MIN_ITEMS))
        return;
    const struct ipc_krun *f = &v[which[0]];
    uint64_t mask = pair_mask(f->exec, f->other);
    int t = blk ? xfer_kbatch_start_blocks(kb, f->exec, mask, br, k)
                : xfer_kbatch_start_runs(kb, f->exec, mask, r, k, total);
    for (size_t x = 0; launched(kb, t, f->exec) && x < k; x++)
        v[which[x]].w.ticket = t;
}

void ipc_kbatch_start_runs(struct xfer_kbatch **kb, struct ipc_krun *v, size_t n)
{
    if (n == 0 || getenv("XFER_IPC_NO_KBATCH"))
        return;
    if (!*kb && xfer_kbatch_new(kb) < 0)
        return;
    size_t which[IPC_BATCH_MAX], bwhich[IPC_BATCH_MAX];
    bool seen[IPC_BATCH_MAX] = {false}; /* runs of a pair already launched */
    for (size_t i = 0; i < n && i < IPC_BATCH_MAX; i++) {
        if (seen[i])
            continue;
        size_t k = 0, kb_ = 0;
        for (size_t j = i; j < n && j < IPC_BATCH_MAX; j++) { /* every run of v[i]'s pair */
            if (seen[j] || v[j].exec != v[i].exec || v[j].other != v[i].other)
                continue;
            seen[j] = true;
            if (v[j].is_blk)
                bwhich[kb_++] = j;
            else
                which[k++] = j;
        }
        start_pair(*kb, v, which, k, false);
        start_pair(*kb, v, bwhich, kb_, true);
    }
}
