/*
 * CUDA copies of the ipc transport: dedicated non-blocking streams per GPU
 * (XFER_IPC_STREAMS, default 4), one event per copy, and completion marks
 * that wake the worker through stream host functions (no polling): a group
 * of items is started at once and collected together. See ipc_cuda.c for
 * which GPU runs a copy and why.
 */
#include "ipc.h"
#include "ipc_cuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if XFER_WITH_CUDA
#include <time.h>

#define IPC_STREAMS_PER_DEV 8

struct ipc_cuda_copier {
    cudaStream_t streams[IPC_MAX_DEVS][IPC_STREAMS_PER_DEV];
    bool dirty[IPC_MAX_DEVS][IPC_STREAMS_PER_DEV]; /* copies since the last flush */
    unsigned next[IPC_MAX_DEVS];
    unsigned char peer_on[IPC_MAX_DEVS][IPC_MAX_DEVS];
    cudaEvent_t *ev; /* ticket -> event */
    int *ev_dev;
    bool *used;
    int nev;
    int *free_tickets[IPC_MAX_DEVS]; /* per-device stacks of unused tickets */
    int nfree[IPC_MAX_DEVS];
    int nstreams;       /* per device, XFER_IPC_STREAMS (default 4) */
    bool copy_on_owner; /* run D2D on the remote memory's GPU (XFER_IPC_COPY_ON=sender: no) */
    /* Marks complete through stream host functions that broadcast cv under mu;
     * both belong to the caller (the connection), so its worker can sleep
     * until either new work or a finished mark arrives. Waits use a timeout. */
    pthread_mutex_t *mu;
    pthread_cond_t *cv;
};

struct ipc_cuda_mark {
    struct ipc_cuda_copier *c;
    int left;       /* host functions not yet run */
    bool abandoned; /* the waiter gave up: the last host function frees it */
    bool failed;
};

struct ipc_cuda_copier *ipc_cuda_copier_new(int *err, pthread_mutex_t *mu, pthread_cond_t *cv)
{
    char why[160];
    int n = ipc_cuda_probe(why, sizeof(why));
    struct ipc_cuda_copier *c = n > 0 ? calloc(1, sizeof(*c)) : NULL;
    if (!c) {
        *err = n > 0 ? -XFER_ENOMEM : n;
        return NULL;
    }
    const char *ns = getenv("XFER_IPC_STREAMS"), *on = getenv("XFER_IPC_COPY_ON");
    c->nstreams = ns ? atoi(ns) : 4;
    if (c->nstreams < 1 || c->nstreams > IPC_STREAMS_PER_DEV)
        c->nstreams = IPC_STREAMS_PER_DEV;
    c->copy_on_owner = !(on && !strcmp(on, "sender"));
    c->mu = mu;
    c->cv = cv;
    return c;
}

void ipc_cuda_copier_free(struct ipc_cuda_copier *c)
{
    if (!c)
        return;
    for (int d = 0; d < IPC_MAX_DEVS; d++)
        for (int s = 0; s < IPC_STREAMS_PER_DEV; s++)
            if (c->streams[d][s]) {
                cudaSetDevice(d);
                cudaStreamSynchronize(c->streams[d][s]);
                cudaStreamDestroy(c->streams[d][s]);
            }
    for (int i = 0; i < c->nev; i++)
        if (c->ev[i]) {
            cudaSetDevice(c->ev_dev[i]);
            cudaEventDestroy(c->ev[i]);
        }
    free(c->ev);
    free(c->ev_dev);
    free(c->used);
    for (int d = 0; d < IPC_MAX_DEVS; d++)
        free(c->free_tickets[d]);
    free(c);
}

static cudaStream_t stream_for(struct ipc_cuda_copier *c, int dev)
{
    unsigned k = c->next[dev]++ % (unsigned)c->nstreams;
    if (!c->streams[dev][k] &&
        cudaStreamCreateWithFlags(&c->streams[dev][k], cudaStreamNonBlocking) != cudaSuccess)
        return NULL;
    c->dirty[dev][k] = true;
    return c->streams[dev][k];
}

/* A free ticket with an event created on dev, or a negative code. */
static int ticket_get(struct ipc_cuda_copier *c, int dev)
{
    if (c->nfree[dev] > 0) {
        int t = c->free_tickets[dev][--c->nfree[dev]];
        c->used[t] = true;
        return t;
    }
    int n = c->nev + 1;
    cudaEvent_t *ev = realloc(c->ev, (size_t)n * sizeof(*ev));
    if (ev)
        c->ev = ev;
    int *ed = realloc(c->ev_dev, (size_t)n * sizeof(*ed));
    if (ed)
        c->ev_dev = ed;
    bool *u = realloc(c->used, (size_t)n * sizeof(*u));
    if (u)
        c->used = u;
    /* Room to hand every ticket of dev back. */
    int *f = realloc(c->free_tickets[dev], (size_t)n * sizeof(*f));
    if (f)
        c->free_tickets[dev] = f;
    if (!ev || !ed || !u || !f)
        return -XFER_ENOMEM;
    if (cudaEventCreateWithFlags(&c->ev[c->nev], cudaEventDisableTiming) != cudaSuccess)
        return -XFER_EIO;
    c->ev_dev[c->nev] = dev;
    c->used[c->nev] = true;
    return c->nev++;
}

static void ticket_put(struct ipc_cuda_copier *c, int t)
{
    c->used[t] = false;
    c->free_tickets[c->ev_dev[t]][c->nfree[c->ev_dev[t]]++] = t;
}

static void CUDART_CB host_fired(void *arg)
{
    struct ipc_cuda_mark *m = arg;
    struct ipc_cuda_copier *c = m->c;
    pthread_mutex_lock(c->mu);
    bool gone = --m->left == 0 && m->abandoned;
    pthread_cond_broadcast(c->cv);
    pthread_mutex_unlock(c->mu);
    if (gone)
        free(m);
}

/* One host function per stream used since the last mark: the mark completes
 * when every copy started before it has finished, and its waiter sleeps on a
 * condition variable instead of polling events (polling sleeps overshoot by
 * tens of microseconds, which shows at NVLink speeds). */
struct ipc_cuda_mark *ipc_cuda_mark_new(struct ipc_cuda_copier *c, int *err)
{
    struct ipc_cuda_mark *m = calloc(1, sizeof(*m));
    if (!m) {
        *err = -XFER_ENOMEM;
        return NULL;
    }
    m->c = c;
    for (int d = 0; d < IPC_MAX_DEVS; d++)
        for (int k = 0; k < IPC_STREAMS_PER_DEV; k++) {
            if (!c->dirty[d][k])
                continue;
            c->dirty[d][k] = false;
            cudaSetDevice(d);
            pthread_mutex_lock(c->mu);
            m->left++;
            pthread_mutex_unlock(c->mu);
            if (cudaLaunchHostFunc(c->streams[d][k], host_fired, m) != cudaSuccess) {
                cudaGetLastError();
                pthread_mutex_lock(c->mu);
                m->left--;
                m->failed = true;
                pthread_mutex_unlock(c->mu);
            }
        }
    return m;
}

bool ipc_cuda_mark_done_locked(const struct ipc_cuda_mark *m)
{
    return m->left == 0;
}

int ipc_cuda_mark_wait(struct ipc_cuda_mark *m, int timeout_ms, char *why, size_t why_len)
{
    struct ipc_cuda_copier *c = m->c;
    struct timespec end = xfer_mono_after_ms(timeout_ms);
    int rc = 0;
    pthread_mutex_lock(c->mu);
    while (rc == 0 && m->left > 0)
        rc = pthread_cond_timedwait(c->cv, c->mu, &end);
    bool done = m->left == 0, failed = m->failed;
    if (!done)
        m->abandoned = true;
    pthread_mutex_unlock(c->mu);
    if (done)
        free(m);
    if (!done) {
        snprintf(why, why_len, "CUDA copies not finished after %d ms", timeout_ms);
        return -XFER_ETIMEDOUT;
    }
    if (failed) {
        snprintf(why, why_len, "cudaLaunchHostFunc failed; copies waited for one by one");
        return -XFER_EIO;
    }
    return 0;
}

int ipc_cuda_copy_start(struct ipc_cuda_copier *c, void *dst, int dst_dev, const void *src,
                        int src_dev, int remote_dev, size_t len, char *why, size_t why_len)
{
    int exec = src_dev >= 0 ? src_dev : dst_dev; /* the only GPU, or push from the sender */
    if (c->copy_on_owner && src_dev >= 0 && dst_dev >= 0 && remote_dev >= 0)
        exec = remote_dev; /* default: the GPU (and context) holding the peer's memory */
    char pwhy[8];
    if (exec < 0 || exec >= ipc_cuda_probe(pwhy, sizeof(pwhy))) {
        snprintf(why, why_len, "no GPU side in a CUDA copy");
        return -XFER_EINVAL;
    }
    cudaError_t e = cudaSetDevice(exec);
    int other = exec == src_dev ? dst_dev : src_dev;
    if (e == cudaSuccess && other >= 0 && other != exec && !c->peer_on[exec][other]) {
        int can = 0;
        cudaDeviceCanAccessPeer(&can, exec, other);
        if (can) {
            e = cudaDeviceEnablePeerAccess(other, 0);
            if (e == cudaErrorPeerAccessAlreadyEnabled)
                e = cudaSuccess;
            cudaGetLastError();
        }
        c->peer_on[exec][other] = 1; /* without P2P, cudaMemcpyPeerAsync stages */
    }
    if (e != cudaSuccess)
        return ipc_cuda_fail(e, "selecting the copy GPU", why, why_len);
    cudaStream_t s = stream_for(c, exec);
    int t = s ? ticket_get(c, exec) : -XFER_EIO;
    if (t < 0) {
        snprintf(why, why_len, "cannot create a CUDA stream/event on cuda:%d", exec);
        return t;
    }
    if (src_dev >= 0 && dst_dev >= 0 && src_dev != dst_dev)
        e = cudaMemcpyPeerAsync(dst, dst_dev, src, src_dev, len, s);
    else
        e = cudaMemcpyAsync(dst, src, len, cudaMemcpyDefault, s);
    if (e == cudaSuccess)
        e = cudaEventRecord(c->ev[t], s);
    if (e != cudaSuccess) {
        ticket_put(c, t);
        return ipc_cuda_fail(e, "cudaMemcpyAsync", why, why_len);
    }
    return t;
}

int ipc_cuda_copy_wait(struct ipc_cuda_copier *c, int t, int timeout_ms, char *why, size_t why_len)
{
    if (t < 0 || t >= c->nev || !c->used[t])
        return -XFER_EINVAL;
    struct timespec nap = {0, 2000};
    int64_t end = xfer_mono_ns() + (int64_t)timeout_ms * 1000000;
    cudaError_t e;
    cudaSetDevice(c->ev_dev[t]);
    while ((e = cudaEventQuery(c->ev[t])) == cudaErrorNotReady) {
        if (xfer_mono_ns() > end) {
            snprintf(why, why_len, "CUDA copy not finished after %d ms", timeout_ms);
            return -XFER_ETIMEDOUT; /* ticket stays used: the copy may still land */
        }
        nanosleep(&nap, NULL);
        if (nap.tv_nsec < 500000)
            nap.tv_nsec *= 2;
    }
    ticket_put(c, t);
    if (e != cudaSuccess)
        return ipc_cuda_fail(e, "CUDA copy", why, why_len);
    return 0;
}

#else /* !XFER_WITH_CUDA */

static int no_cuda(char *why, size_t why_len)
{
    snprintf(why, why_len, "no CUDA device (built without CUDA)");
    return -XFER_ENODEV;
}

struct ipc_cuda_copier *ipc_cuda_copier_new(int *err, pthread_mutex_t *mu, pthread_cond_t *cv)
{
    (void)mu, (void)cv;
    *err = -XFER_ENODEV;
    return NULL;
}
void ipc_cuda_copier_free(struct ipc_cuda_copier *c)
{
    (void)c;
}
int ipc_cuda_copy_start(struct ipc_cuda_copier *c, void *dst, int dst_dev, const void *src,
                        int src_dev, int remote_dev, size_t len, char *why, size_t why_len)
{
    (void)c, (void)dst, (void)dst_dev, (void)src, (void)src_dev, (void)remote_dev, (void)len;
    return no_cuda(why, why_len);
}
int ipc_cuda_copy_wait(struct ipc_cuda_copier *c, int t, int timeout_ms, char *why, size_t why_len)
{
    (void)c, (void)t, (void)timeout_ms;
    return no_cuda(why, why_len);
}
struct ipc_cuda_mark *ipc_cuda_mark_new(struct ipc_cuda_copier *c, int *err)
{
    (void)c;
    *err = -XFER_ENODEV;
    return NULL;
}
bool ipc_cuda_mark_done_locked(const struct ipc_cuda_mark *m)
{
    (void)m;
    return true;
}
int ipc_cuda_mark_wait(struct ipc_cuda_mark *m, int timeout_ms, char *why, size_t why_len)
{
    (void)m, (void)timeout_ms;
    return no_cuda(why, why_len);
}
#endif
