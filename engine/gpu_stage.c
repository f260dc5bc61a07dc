/* Pinned host staging ring for GPU memory over sockets (see gpu_stage.h). */
#include "gpu_stage.h"
#include "mono_clock.h"

#include "xfer_io.h"
#include "xfer.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#if XFER_WITH_CUDA
#include <cuda_runtime_api.h>

#define STAGE_DEF_SLOT     (4u << 20)
#define STAGE_DEF_SLOTS    4u
#define STAGE_MAX_SLOTS    1024u
#define STAGE_FREE_WAIT_MS 30000
#define STAGE_SMALL_COPY   (64u << 10) /* emulated: "small" copies, see emulated_new() */

struct stage_slot {
    char *host;         /* pinned, a part of the stage's one block */
    cudaEvent_t ev;     /* after the slot's last copy */
    bool taken;         /* between get and put */
    bool busy;          /* ev recorded and not yet seen complete */
    int fake_polls;     /* emulated: polls that still answer "in progress" */
    int64_t fake_until; /* emulated: in progress until this time (us) */
};

struct xfer_gpu_stage {
    bool emulated;    /* XFER_GPU_STAGE_EMULATE test mode, see emulated_new() */
    int64_t small_us; /* emulated: how long a small copy takes */
    int device;
    size_t slot_bytes;
    unsigned nslots;
    char *block;           /* nslots * slot_bytes, pinned (one allocation, not one per slot) */
    cudaStream_t d2h, h2d; /* one per direction: sending and receiving overlap */
    struct stage_slot slot[STAGE_MAX_SLOTS];
    char err[256];
};

static int stage_err(struct xfer_gpu_stage *s, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->err, sizeof(s->err), fmt, ap);
    va_end(ap);
    return rc;
}

static int cuda_err(struct xfer_gpu_stage *s, cudaError_t e, const char *what)
{
    (void)cudaGetLastError();
    return stage_err(s, e == cudaErrorMemoryAllocation ? -XFER_ENOMEM : -XFER_EIO, "%s: %s", what,
                     cudaGetErrorString(e));
}

const char *xfer_gpu_stage_last_error(const struct xfer_gpu_stage *s)
{
    return s ? s->err : "no stage";
}

size_t xfer_gpu_stage_slot_bytes(const struct xfer_gpu_stage *s)
{
    return s ? s->slot_bytes : 0;
}

void xfer_gpu_stage_free(struct xfer_gpu_stage *s)
{
    if (!s)
        return;
    if (s->emulated) {
        free(s->block);
        free(s);
        return;
    }
    cudaSetDevice(s->device);
    for (unsigned i = 0; i < s->nslots; i++) {
        struct stage_slot *sl = &s->slot[i];
        if (sl->busy)
            xfer_gpu_stage_wait(s, (int)i, STAGE_FREE_WAIT_MS);
        if (sl->ev)
            cudaEventDestroy(sl->ev);
    }
    if (s->block)
        cudaFreeHost(s->block);
    if (s->d2h)
        cudaStreamDestroy(s->d2h);
    if (s->h2d)
        cudaStreamDestroy(s->h2d);
    free(s);
}

/* Test mode for machines without a GPU (XFER_GPU_STAGE_EMULATE=1 and no CUDA
 * device): "device" memory is host memory, copies are memcpy done at once
 * but reported in progress for the first two polls, so the callers' waiting
 * paths (tcp_gpu.c) run in CI. XFER_GPU_STAGE_EMULATE_SMALL_US=N also keeps
 * every copy below 64 KiB in progress for N us: the shape of a GPU where a
 * small H2D waits for another process's kernel to give up its time slice
 * (docs/gpu.md), so tests see what a per-copy latency does to the
 * pipeline. Never chosen when a device exists. */
static int emulated_new(size_t slot_bytes, unsigned nslots, struct xfer_gpu_stage **out)
{
    struct xfer_gpu_stage *s = calloc(1, sizeof(*s));
    if (!s)
        return -XFER_ENOMEM;
    s->emulated = true;
    const char *us = getenv("XFER_GPU_STAGE_EMULATE_SMALL_US");
    s->small_us = us ? strtoll(us, NULL, 10) : 0;
    s->slot_bytes = slot_bytes ? slot_bytes : STAGE_DEF_SLOT;
    s->nslots = nslots ? nslots : STAGE_DEF_SLOTS;
    if (!(s->block = malloc(s->slot_bytes * s->nslots))) {
        free(s);
        return -XFER_ENOMEM;
    }
    for (unsigned i = 0; i < s->nslots; i++)
        s->slot[i].host = s->block + i * s->slot_bytes;
    *out = s;
    return 0;
}

int xfer_gpu_stage_new(int device, size_t slot_bytes, unsigned nslots, struct xfer_gpu_stage **out)
{
    int n = 0;
    if (!out)
        return -XFER_EINVAL;
    *out = NULL;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n <= 0) {
        (void)cudaGetLastError();
        const char *emu = getenv("XFER_GPU_STAGE_EMULATE");
        if (emu && *emu == '1' && nslots <= STAGE_MAX_SLOTS)
            return emulated_new(slot_bytes, nslots, out);
        return -XFER_ENODEV;
    }
    if (device < 0 || device >= n || nslots > STAGE_MAX_SLOTS)
        return -XFER_EINVAL;
    struct xfer_gpu_stage *s = calloc(1, sizeof(*s));
    if (!s)
        return -XFER_ENOMEM;
    s->device = device;
    s->slot_bytes = slot_bytes ? slot_bytes : STAGE_DEF_SLOT;
    s->nslots = nslots ? nslots : STAGE_DEF_SLOTS;
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess)
        e = cudaStreamCreateWithFlags(&s->d2h, cudaStreamNonBlocking);
    if (e == cudaSuccess)
        e = cudaStreamCreateWithFlags(&s->h2d, cudaStreamNonBlocking);
    if (e == cudaSuccess)
        e = cudaMallocHost((void **)&s->block, s->slot_bytes * s->nslots);
    for (unsigned i = 0; e == cudaSuccess && i < s->nslots; i++) {
        s->slot[i].host = s->block + i * s->slot_bytes;
        e = cudaEventCreateWithFlags(&s->slot[i].ev, cudaEventDisableTiming);
    }
    if (e != cudaSuccess) {
        int rc = e == cudaErrorMemoryAllocation ? -XFER_ENOMEM : -XFER_EIO;
        (void)cudaGetLastError();
        xfer_gpu_stage_free(s);
        return rc;
    }
    *out = s;
    return 0;
}

int xfer_gpu_stage_get(struct xfer_gpu_stage *s, void **host)
{
    for (unsigned i = 0; i < s->nslots; i++)
        if (!s->slot[i].taken) {
            s->slot[i].taken = true;
            if (host)
                *host = s->slot[i].host;
            return (int)i;
        }
    return -XFER_EBUSY;
}

static bool slot_ok(struct xfer_gpu_stage *s, int slot)
{
    return slot >= 0 && (unsigned)slot < s->nslots && s->slot[slot].taken;
}

/* Enqueues one copy touching the slot on stream st, then its event. */
static int slot_copy(struct xfer_gpu_stage *s, int slot, void *dst, const void *src, size_t len,
                     enum cudaMemcpyKind kind, cudaStream_t st)
{
    if (!s || !slot_ok(s, slot) || len > s->slot_bytes || (len && (!dst || !src)))
        return s ? stage_err(s, -XFER_EINVAL, "bad slot copy") : -XFER_EINVAL;
    struct stage_slot *sl = &s->slot[slot];
    if (sl->busy)
        return stage_err(s, -XFER_EBUSY, "slot %d still has a copy in flight", slot);
    if (s->emulated) {
        if (len)
            memcpy(dst, src, len);
        sl->busy = true;
        sl->fake_polls = 2;
        sl->fake_until = len < STAGE_SMALL_COPY && s->small_us ? xfer_mono_us() + s->small_us : 0;
        return 0;
    }
    cudaError_t e = cudaSetDevice(s->device);
    if (e == cudaSuccess && len)
        e = cudaMemcpyAsync(dst, src, len, kind, st);
    if (e == cudaSuccess)
        e = cudaEventRecord(sl->ev, st);
    if (e != cudaSuccess) {
        cudaStreamSynchronize(st); /* nothing may touch the slot after we return */
        return cuda_err(s, e, "staging copy");
    }
    sl->busy = true;
    return 0;
}

int xfer_gpu_stage_d2h(struct xfer_gpu_stage *s, int slot, const void *dev_src, size_t len)
{
    return slot_copy(s, slot, s && slot_ok(s, slot) ? s->slot[slot].host : NULL, dev_src, len,
                     cudaMemcpyDeviceToHost, s ? s->d2h : NULL);
}

int xfer_gpu_stage_h2d(struct xfer_gpu_stage *s, int slot, void *dev_dst, size_t len)
{
    return slot_copy(s, slot, dev_dst, s && slot_ok(s, slot) ? s->slot[slot].host : NULL, len,
                     cudaMemcpyHostToDevice, s ? s->h2d : NULL);
}

int xfer_gpu_stage_poll(struct xfer_gpu_stage *s, int slot)
{
    if (!s || slot < 0 || (unsigned)slot >= s->nslots)
        return -XFER_EINVAL;
    struct stage_slot *sl = &s->slot[slot];
    if (!sl->busy)
        return 0;
    if (s->emulated) {
        if (sl->fake_polls-- > 0 || (sl->fake_until && xfer_mono_us() < sl->fake_until))
            return -XFER_EINPROGRESS;
        sl->busy = false;
        return 0;
    }
    cudaError_t e = cudaEventQuery(sl->ev);
    if (e == cudaErrorNotReady)
        return -XFER_EINPROGRESS;
    sl->busy = false;
    return e == cudaSuccess ? 0 : cuda_err(s, e, "staging copy");
}

int xfer_gpu_stage_wait(struct xfer_gpu_stage *s, int slot, int timeout_ms)
{
    int64_t end = xfer_now_ms() + timeout_ms;
    struct timespec nap = {0, 2000};
    for (;;) {
        int rc = xfer_gpu_stage_poll(s, slot);
        if (rc != -XFER_EINPROGRESS)
            return rc;
        if (xfer_now_ms() >= end)
            return stage_err(s, -XFER_ETIMEDOUT, "staging copy not done after %d ms", timeout_ms);
        nanosleep(&nap, NULL);
        if (nap.tv_nsec < 200000)
            nap.tv_nsec *= 2;
    }
}

void xfer_gpu_stage_put(struct xfer_gpu_stage *s, int slot)
{
    if (s && slot >= 0 && (unsigned)slot < s->nslots && !s->slot[slot].busy)
        s->slot[slot].taken = false;
}

/* Waits for fd to be ready for `events` until deadline. */
static int fd_wait(struct xfer_gpu_stage *s, int fd, short events, int64_t deadline)
{
    int rc = xfer_io_wait(fd, events, deadline);
    if (rc == -XFER_ETIMEDOUT)
        return stage_err(s, rc, "socket not ready before the deadline");
    if (rc < 0)
        return stage_err(s, rc, "poll: %s", strerror(errno));
    return 0;
}

static int write_all(struct xfer_gpu_stage *s, int fd, const char *p, size_t len, int64_t deadline)
{
    while (len) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n > 0) {
            p += n, len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int rc = fd_wait(s, fd, POLLOUT, deadline);
            if (rc)
                return rc;
            continue;
        }
        return stage_err(s, -XFER_ECONN, "send: %s", n < 0 ? strerror(errno) : "closed");
    }
    return 0;
}

static int read_all(struct xfer_gpu_stage *s, int fd, char *p, size_t len, int64_t deadline)
{
    while (len) {
        int rc = fd_wait(s, fd, POLLIN, deadline); /* so a silent peer cannot block us */
        if (rc)
            return rc;
        ssize_t n = recv(fd, p, len, MSG_DONTWAIT);
        if (n > 0) {
            p += n, len -= (size_t)n;
            continue;
        }
        if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))
            continue;
        return stage_err(s, -XFER_ECONN, "recv: %s", n < 0 ? strerror(errno) : "peer closed");
    }
    return 0;
}

/* Slots in flight, oldest first. */
struct fifo {
    int slot[STAGE_MAX_SLOTS];
    size_t len[STAGE_MAX_SLOTS];
    unsigned head, count;
};

static void fifo_push(struct fifo *f, int slot, size_t len)
{
    unsigned i = (f->head + f->count++) % STAGE_MAX_SLOTS;
    f->slot[i] = slot, f->len[i] = len;
}

/* Waits out and returns every slot still in flight (error paths too). */
static void fifo_drain(struct xfer_gpu_stage *s, struct fifo *f)
{
    for (; f->count; f->count--, f->head = (f->head + 1) % STAGE_MAX_SLOTS) {
        int slot = f->slot[f->head];
        if (xfer_gpu_stage_wait(s, slot, STAGE_FREE_WAIT_MS) == 0)
            xfer_gpu_stage_put(s, slot);
    }
}

static int remaining_ms(int64_t deadline)
{
    int64_t left = deadline - xfer_now_ms();
    return left > 0 ? (int)(left > 1 << 30 ? 1 << 30 : left) : 0;
}

int xfer_gpu_stage_send(struct xfer_gpu_stage *s, int fd, const void *dev_src, uint64_t len,
                        int timeout_ms)
{
    if (!s || fd < 0 || (len && !dev_src))
        return -XFER_EINVAL;
    int64_t deadline = xfer_now_ms() + timeout_ms;
    struct fifo f = {.head = 0, .count = 0};
    uint64_t issued = 0, sent = 0;
    int rc = 0, slot;
    while (!rc && sent < len) {
        void *host;
        while (issued < len && (slot = xfer_gpu_stage_get(s, &host)) >= 0) {
            size_t n = len - issued < s->slot_bytes ? (size_t)(len - issued) : s->slot_bytes;
            if ((rc = xfer_gpu_stage_d2h(s, slot, (const char *)dev_src + issued, n))) {
                xfer_gpu_stage_put(s, slot);
                break;
            }
            fifo_push(&f, slot, n);
            issued += n;
        }
        if (rc || !f.count)
            break;
        slot = f.slot[f.head];
        size_t n = f.len[f.head];
        if ((rc = xfer_gpu_stage_wait(s, slot, remaining_ms(deadline))))
            break;
        if ((rc = write_all(s, fd, s->slot[slot].host, n, deadline)))
            break;
        xfer_gpu_stage_put(s, slot);
        f.head = (f.head + 1) % STAGE_MAX_SLOTS, f.count--;
        sent += n;
    }
    fifo_drain(s, &f);
    return rc;
}

int xfer_gpu_stage_recv(struct xfer_gpu_stage *s, int fd, void *dev_dst, uint64_t len,
                        int timeout_ms)
{
    if (!s || fd < 0 || (len && !dev_dst))
        return -XFER_EINVAL;
    int64_t deadline = xfer_now_ms() + timeout_ms;
    struct fifo f = {.head = 0, .count = 0};
    uint64_t got = 0;
    int rc = 0;
    while (!rc && got < len) {
        void *host;
        int slot = xfer_gpu_stage_get(s, &host);
        if (slot < 0) { /* all slots in H2D: retire the oldest */
            int old = f.slot[f.head];
            if ((rc = xfer_gpu_stage_wait(s, old, remaining_ms(deadline))))
                break;
            xfer_gpu_stage_put(s, old);
            f.head = (f.head + 1) % STAGE_MAX_SLOTS, f.count--;
            continue;
        }
        size_t n = len - got < s->slot_bytes ? (size_t)(len - got) : s->slot_bytes;
        if ((rc = read_all(s, fd, host, n, deadline)) ||
            (rc = xfer_gpu_stage_h2d(s, slot, (char *)dev_dst + got, n))) {
            xfer_gpu_stage_put(s, slot);
            break;
        }
        fifo_push(&f, slot, n);
        got += n;
    }
    while (!rc && f.count) { /* every byte in device memory before returning */
        int slot = f.slot[f.head];
        if ((rc = xfer_gpu_stage_wait(s, slot, remaining_ms(deadline))))
            break;
        xfer_gpu_stage_put(s, slot);
        f.head = (f.head + 1) % STAGE_MAX_SLOTS, f.count--;
    }
    fifo_drain(s, &f);
    return rc;
}

#else /* !XFER_WITH_CUDA */

int xfer_gpu_stage_new(int device, size_t slot_bytes, unsigned nslots, struct xfer_gpu_stage **out)
{
    (void)device, (void)slot_bytes, (void)nslots;
    if (out)
        *out = NULL;
    return -XFER_ENODEV;
}
void xfer_gpu_stage_free(struct xfer_gpu_stage *s)
{
    (void)s;
}
size_t xfer_gpu_stage_slot_bytes(const struct xfer_gpu_stage *s)
{
    (void)s;
    return 0;
}
const char *xfer_gpu_stage_last_error(const struct xfer_gpu_stage *s)
{
    (void)s;
    return "built without CUDA";
}
int xfer_gpu_stage_get(struct xfer_gpu_stage *s, void **host)
{
    (void)s, (void)host;
    return -XFER_ENODEV;
}
int xfer_gpu_stage_d2h(struct xfer_gpu_stage *s, int slot, const void *dev_src, size_t len)
{
    (void)s, (void)slot, (void)dev_src, (void)len;
    return -XFER_ENODEV;
}
int xfer_gpu_stage_h2d(struct xfer_gpu_stage *s, int slot, void *dev_dst, size_t len)
{
    (void)s, (void)slot, (void)dev_dst, (void)len;
    return -XFER_ENODEV;
}
int xfer_gpu_stage_poll(struct xfer_gpu_stage *s, int slot)
{
    (void)s, (void)slot;
    return -XFER_ENODEV;
}
int xfer_gpu_stage_wait(struct xfer_gpu_stage *s, int slot, int timeout_ms)
{
    (void)s, (void)slot, (void)timeout_ms;
    return -XFER_ENODEV;
}
void xfer_gpu_stage_put(struct xfer_gpu_stage *s, int slot)
{
    (void)s, (void)slot;
}
int xfer_gpu_stage_send(struct xfer_gpu_stage *s, int fd, const void *dev_src, uint64_t len,
                        int timeout_ms)
{
    (void)s, (void)fd, (void)dev_src, (void)len, (void)timeout_ms;
    return -XFER_ENODEV;
}
int xfer_gpu_stage_recv(struct xfer_gpu_stage *s, int fd, void *dev_dst, uint64_t len,
                        int timeout_ms)
{
    (void)s, (void)fd, (void)dev_dst, (void)len, (void)timeout_ms;
    return -XFER_ENODEV;
}
#endif
