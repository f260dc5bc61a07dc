/* Engine helper around the batched copy: per-device stage + stream, and
 * tickets (events) that a transport's progress loop can poll. */
#include "klaunch.h"
#include "xfer_err.h"
#include "xfer_kernels.h"

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define KB_MAX_DEVS     64
#define KB_FREE_WAIT_MS 30000

struct kb_dev {
    struct xfer_kstage *stage;
    cudaStream_t stream;
    uint64_t peer_on;  /* peers whose access from this device is enabled */
    uint64_t peer_bad; /* peers this device cannot access */
};

struct kb_ticket {
    cudaEvent_t ev;
    cudaEvent_t ev0; /* traced helpers: before the launch (timing events) */
    float gpu_ms;    /* traced: ev0 -> ev of the last completion */
    int dev;
    bool used;
};

struct xfer_kbatch {
    int ndev;
    struct kb_dev dev[KB_MAX_DEVS];
    struct kb_ticket *t;
    int nt;
    bool trace; /* XFER_KBATCH_TRACE=1: GPU time of each launch (xfer_kbatch_gpu_us) */
    char err[256];
};

static int kb_fail(struct xfer_kbatch *b, int rc, const char *what, cudaError_t e)
{
    snprintf(b->err, sizeof(b->err), "%s: %s", what, cudaGetErrorString(e));
    (void)cudaGetLastError();
    return rc;
}

extern "C" const char *xfer_kbatch_last_error(const struct xfer_kbatch *b)
{
    return b ? b->err : "no batch helper";
}

extern "C" int xfer_kbatch_new(struct xfer_kbatch **out)
{
    int n = 0, rc;
    if (!out)
        return -XFER_EINVAL;
    *out = NULL;
    if ((rc = xfer_kernels_probe(&n)))
        return rc;
    struct xfer_kbatch *b = (struct xfer_kbatch *)calloc(1, sizeof(*b));
    if (!b)
        return -XFER_ENOMEM;
    b->ndev = n < KB_MAX_DEVS ? n : KB_MAX_DEVS;
    const char *tr = getenv("XFER_KBATCH_TRACE");
    b->trace = tr && *tr == '1';
    *out = b;
    return 0;
}

extern "C" void xfer_kbatch_free(struct xfer_kbatch *b)
{
    if (!b)
        return;
    for (int i = 0; i < b->nt; i++) {
        if (b->t[i].used)
            xfer_kbatch_wait(b, i, KB_FREE_WAIT_MS);
        cudaSetDevice(b->t[i].dev);
        cudaEventDestroy(b->t[i].ev);
        if (b->t[i].ev0)
            cudaEventDestroy(b->t[i].ev0);
    }
    for (int d = 0; d < b->ndev; d++) {
        if (b->dev[d].stage)
            xfer_kstage_free(b->dev[d].stage);
        if (b->dev[d].stream) {
            cudaSetDevice(d);
            cudaStreamDestroy(b->dev[d].stream);
        }
    }
    free(b->t);
    free(b);
}

/* Stage, stream and peer access of device d for peers in mask. */
static int kb_dev_ready(struct xfer_kbatch *b, int d, uint64_t mask)
{
    struct kb_dev *k = &b->dev[d];
    cudaError_t e = cudaSetDevice(d);
    if (e != cudaSuccess)
        return kb_fail(b, -XFER_ENODEV, "selecting the copy GPU", e);
    if (!k->stream && (e = cudaStreamCreateWithFlags(&k->stream, cudaStreamNonBlocking)))
        return kb_fail(b, -XFER_EIO, "creating a stream", e);
    int rc;
    if (!k->stage && (rc = xfer_kstage_new(d, &k->stage))) {
        snprintf(b->err, sizeof(b->err), "creating staging for GPU %d", d);
        return rc;
    }
    mask &= ~(1ull << d);
    for (int p = 0; p < b->ndev && (mask & ~k->peer_on); p++) {
        if ((mask & (1ull << p)) && !kpeer_reach(d, p, &k->peer_on, &k->peer_bad)) {
            snprintf(b->err, sizeof(b->err), "GPU %d cannot access GPU %d as a peer", d, p);
            return -XFER_ENOTSUP;
        }
    }
    return 0;
}

/* A free ticket with an event on device d. */
static int kb_ticket_get(struct xfer_kbatch *b, int d)
{
    for (int i = 0; i < b->nt; i++)
        if (!b->t[i].used && b->t[i].dev == d)
            return i;
    struct kb_ticket *t = (struct kb_ticket *)realloc(b->t, (b->nt + 1) * sizeof(*t));
    if (!t)
        return -XFER_ENOMEM;
    b->t = t;
    unsigned flags = b->trace ? cudaEventDefault : cudaEventDisableTiming;
    t[b->nt] = (struct kb_ticket){};
    cudaError_t e = cudaEventCreateWithFlags(&t[b->nt].ev, flags);
    if (e == cudaSuccess && b->trace && (e = cudaEventCreate(&t[b->nt].ev0)) != cudaSuccess)
        cudaEventDestroy(t[b->nt].ev);
    if (e != cudaSuccess)
        return kb_fail(b, -XFER_EIO, "creating an event", e);
    t[b->nt].dev = d;
    t[b->nt].used = false;
    return b->nt++;
}

/* Readies exec for peers in peer_mask, runs launch (a batched copy on
 * exec's stage and stream) and records a ticket after it. */
template <typename F>
static int kb_start(struct xfer_kbatch *b, int exec, uint64_t peer_mask, F launch)
{
    if (!b || exec < 0 || exec >= b->ndev)
        return -XFER_EINVAL;
    if (b->ndev < 64 && (peer_mask >> b->ndev))
        return -XFER_EINVAL; /* a device that does not exist */
    int saved = -1, rc, t;
    cudaGetDevice(&saved);
    if ((rc = kb_dev_ready(b, exec, peer_mask)) || (t = kb_ticket_get(b, exec)) < 0) {
        rc = rc ? rc : t;
        goto out;
    }
    if (b->trace)
        cudaEventRecord(b->t[t].ev0, b->dev[exec].stream);
    b->err[0] = 0;
    rc = launch(b->dev[exec].stage, b->dev[exec].stream);
    if (rc) { /* the stage's reason, unless the launch said its own */
        if (!b->err[0])
            snprintf(b->err, sizeof(b->err), "%s", xfer_kstage_last_error(b->dev[exec].stage));
        goto out;
    }
    cudaError_t e;
    if ((e = cudaEventRecord(b->t[t].ev, b->dev[exec].stream)) != cudaSuccess) {
        cudaStreamSynchronize(b->dev[exec].stream);
        rc = kb_fail(b, -XFER_EIO, "recording completion", e);
        goto out;
    }
    b->t[t].used = true;
    rc = t;
out:
    if (saved >= 0)
        cudaSetDevice(saved);
    return rc;
}

extern "C" int xfer_kbatch_start(struct xfer_kbatch *b, int exec, uint64_t peer_mask,
                                 const struct xfer_copy_desc *d, size_t n)
{
    if (n && !d)
        return -XFER_EINVAL;
    return kb_start(b, exec, peer_mask, [&](struct xfer_kstage *st, cudaStream_t s) {
        return xfer_kernels_batched_copy(st, d, n, s);
    });
}

extern "C" int xfer_kbatch_start_runs(struct xfer_kbatch *b, int exec, uint64_t peer_mask,
                                      const struct xfer_copy_run *r, size_t nr, uint64_t total)
{
    if (nr && !r)
        return -XFER_EINVAL;
    return kb_start(b, exec, peer_mask, [&](struct xfer_kstage *st, cudaStream_t s) {
        return xfer_kernels_batched_copy_runs(st, r, nr, total, s);
    });
}

extern "C" int xfer_kbatch_start_copies(struct xfer_kbatch *b, int exec, uint64_t peer_mask,
                                        const struct xfer_copy_run *r, size_t nr, uint64_t total,
                                        const struct xfer_copy_desc *ce, size_t nce)
{
    if ((nr && !r) || (nce && !ce))
        return -XFER_EINVAL;
    return kb_start(b, exec, peer_mask, [&](struct xfer_kstage *st, cudaStream_t s) {
        int rc = nr ? xfer_kernels_batched_copy_runs(st, r, nr, total, s) : 0;
        for (size_t i = 0; rc == 0 && i < nce; i++) {
            cudaError_t e = cudaMemcpyAsync(ce[i].dst, ce[i].src, ce[i].len, cudaMemcpyDefault, s);
            if (e != cudaSuccess) {
                /* what started runs to its end before the caller lets go */
                cudaStreamSynchronize(s);
                rc = kb_fail(b, -XFER_EIO, "copy-engine copy", e);
            }
        }
        return rc;
    });
}

extern "C" int xfer_kbatch_start_blocks(struct xfer_kbatch *b, int exec, uint64_t peer_mask,
                                        const struct xfer_block_run *r, size_t nr)
{
    if (nr && !r)
        return -XFER_EINVAL;
    return kb_start(b, exec, peer_mask, [&](struct xfer_kstage *st, cudaStream_t s) {
        return xfer_kernels_block_runs(st, r, nr, s);
    });
}

extern "C" int xfer_kbatch_poll(struct xfer_kbatch *b, int t)
{
    if (!b || t < 0 || t >= b->nt || !b->t[t].used)
        return -XFER_EINVAL;
    cudaError_t e = cudaEventQuery(b->t[t].ev);
    if (e == cudaErrorNotReady)
        return -XFER_EINPROGRESS;
    b->t[t].used = false;
    if (e == cudaSuccess && b->trace) {
        b->t[t].gpu_ms = -1;
        cudaEventElapsedTime(&b->t[t].gpu_ms, b->t[t].ev0, b->t[t].ev);
    }
    return e == cudaSuccess ? 0 : kb_fail(b, -XFER_EIO, "batched copy", e);
}

extern "C" double xfer_kbatch_gpu_us(const struct xfer_kbatch *b, int t)
{
    if (!b || !b->trace || t < 0 || t >= b->nt)
        return -1;
    return b->t[t].gpu_ms * 1e3;
}

extern "C" int xfer_kbatch_wait(struct xfer_kbatch *b, int t, int timeout_ms)
{
    struct timespec t0, now, nap = {0, 2000};
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        int rc = xfer_kbatch_poll(b, t);
        if (rc != -XFER_EINPROGRESS)
            return rc;
        clock_gettime(CLOCK_MONOTONIC, &now);
        long ms = (now.tv_sec - t0.tv_sec) * 1000 + (now.tv_nsec - t0.tv_nsec) / 1000000;
        if (ms >= timeout_ms) {
            snprintf(b->err, sizeof(b->err), "batched copy not finished after %d ms", timeout_ms);
            return -XFER_ETIMEDOUT;
        }
        nanosleep(&nap, NULL);
        /* at most 4 us between polls: a KV pool request of 512 blocks is
         * ~0.26 ms of copy on an H200 once the GPU expands its block ids,
         * and each microsecond between the kernel's end and its report is
         * 0.4 % of it (16 us naps; 64 us ones once added a third of a
         * group's latency). A poll is one cudaEventQuery. */
        if (nap.tv_nsec < 4000)
            nap.tv_nsec *= 2;
    }
}
