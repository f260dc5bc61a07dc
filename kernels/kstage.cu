/* Staging of descriptors and block tables into device memory, and the public
 * entry points. A stage owns a ring of slots (pinned host + device buffer +
 * event); a slot is reused only once the launch that read it has finished,
 * so callers never wait unless they are KSTAGE_SLOTS launches ahead. */
#include "klaunch.h"

#include "xfer_err.h"
#include "xfer_kernels.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define KSTAGE_SLOTS     4
#define KSTAGE_MIN_BYTES (64u << 10)
#define KSTAGE_WAIT_S    30 /* a slot's previous launch must finish within this */

static_assert(sizeof(struct xfer_copy_desc) == 24, "descriptor is three 64-bit words");

struct kslot {
    void *host; /* pinned */
    void *dev;
    size_t cap;
    cudaEvent_t uploaded; /* on the upload stream, after the slot's upload */
    cudaEvent_t done;     /* on the caller's stream, after the launch */
    bool pending;         /* done was recorded after a launch that reads this slot */
};

/* Uploads run on a stream of their own so that they overlap the caller's
 * earlier work; the caller's stream waits for them before the launch. */
struct xfer_kstage {
    int device;
    int sms;
    int cc_major;
    cudaStream_t up;
    unsigned next;
    struct kslot slot[KSTAGE_SLOTS];
    bool no_param;          /* the driver refused a parameter blob (brun_param) */
    struct kparam_blob *pb; /* brun_param's, made on first use */
    char err[256];
};

static int cuda_to_xfer(cudaError_t e)
{
    switch (e) {
    case cudaSuccess:
        return 0;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
    case cudaErrorDevicesUnavailable:
    case cudaErrorCompatNotSupportedOnDevice:
        return -XFER_ENODEV;
    case cudaErrorMemoryAllocation:
        return -XFER_ENOMEM;
    case cudaErrorInvalidValue:
        return -XFER_EINVAL;
    default:
        return -XFER_EIO;
    }
}

/* Records "what: cuda error text" on the stage and returns the xfer code. */
static int stage_fail(struct xfer_kstage *s, cudaError_t e, const char *what)
{
    if (s)
        snprintf(s->err, sizeof(s->err), "%s: %s", what, cudaGetErrorString(e));
    return cuda_to_xfer(e);
}

static int stage_failx(struct xfer_kstage *s, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->err, sizeof(s->err), fmt, ap);
    va_end(ap);
    return rc;
}

extern "C" int xfer_kernels_probe(int *count)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (count)
        *count = e == cudaSuccess ? n : 0;
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* clear the sticky "no driver" error */
        return -XFER_ENODEV;
    }
    return n > 0 ? 0 : -XFER_ENODEV;
}

extern "C" const char *xfer_kstage_last_error(const struct xfer_kstage *s)
{
    return s ? s->err : "no stage";
}

/* A NULL stage: "no CUDA device" when that is why there is none. */
static int no_stage(void)
{
    return xfer_kernels_probe(NULL) ? -XFER_ENODEV : -XFER_EINVAL;
}

/* Switches to the stage's device for the life of the object. */
struct device_scope {
    int saved;
    bool ok;
    explicit device_scope(int dev) : saved(-1), ok(false)
    {
        if (cudaGetDevice(&saved) != cudaSuccess)
            saved = -1;
        ok = cudaSetDevice(dev) == cudaSuccess;
    }
    ~device_scope()
    {
        if (saved >= 0)
            cudaSetDevice(saved);
    }
};

static void slot_release(struct kslot *sl)
{
    if (sl->host)
        cudaFreeHost(sl->host);
    if (sl->dev)
        cudaFree(sl->dev);
    sl->host = sl->dev = NULL;
    sl->cap = 0;
}

extern "C" void xfer_kstage_free(struct xfer_kstage *s)
{
    if (!s)
        return;
    device_scope ds(s->device);
    for (int i = 0; i < KSTAGE_SLOTS; i++) {
        struct kslot *sl = &s->slot[i];
        if (sl->done) {
            if (sl->pending)
                cudaEventSynchronize(sl->done);
            cudaEventDestroy(sl->done);
        }
        if (sl->uploaded)
            cudaEventDestroy(sl->uploaded);
        slot_release(sl);
    }
    if (s->up)
        cudaStreamDestroy(s->up);
    free(s->pb);
    free(s);
}

extern "C" int xfer_kstage_new(int device, struct xfer_kstage **out)
{
    int n = 0, rc;
    if (!out)
        return -XFER_EINVAL;
    *out = NULL;
    if ((rc = xfer_kernels_probe(&n)))
        return rc;
    if (device < 0 || device >= n)
        return -XFER_EINVAL;
    struct xfer_kstage *s = (struct xfer_kstage *)calloc(1, sizeof(*s));
    if (!s)
        return -XFER_ENOMEM;
    s->device = device;
    device_scope ds(device);
    cudaError_t e = ds.ok ? cudaSuccess : cudaErrorInvalidDevice;
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&s->sms, cudaDevAttrMultiProcessorCount, device);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&s->cc_major, cudaDevAttrComputeCapabilityMajor, device);
    if (e == cudaSuccess)
        e = cudaStreamCreateWithFlags(&s->up, cudaStreamNonBlocking);
    for (int i = 0; e == cudaSuccess && i < KSTAGE_SLOTS; i++) {
        e = cudaEventCreateWithFlags(&s->slot[i].done, cudaEventDisableTiming);
        if (e == cudaSuccess)
            e = cudaEventCreateWithFlags(&s->slot[i].uploaded, cudaEventDisableTiming);
    }
    if (e != cudaSuccess) {
        rc = cuda_to_xfer(e);
        xfer_kstage_free(s);
        return rc;
    }
    *out = s;
    return 0;
}

/* Waits, with a deadline, until the slot's last launch has finished. */
static int slot_wait(struct xfer_kstage *s, struct kslot *sl)
{
    struct timespec t0, now, nap = {0, 20000};
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (unsigned spins = 0;; spins++) {
        cudaError_t e = cudaEventQuery(sl->done);
        if (e == cudaSuccess) {
            sl->pending = false;
            return 0;
        }
        if (e != cudaErrorNotReady)
            return stage_fail(s, e, "waiting for an earlier launch");
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - t0.tv_sec > KSTAGE_WAIT_S)
            return stage_failx(s, -XFER_ETIMEDOUT, "earlier launch still running after %d s",
                               KSTAGE_WAIT_S);
        if (spins > 64)
            nanosleep(&nap, NULL);
    }
}

/* Next free slot with at least `bytes` of room. */
static int slot_get(struct xfer_kstage *s, size_t bytes, struct kslot **out)
{
    struct kslot *sl = &s->slot[s->next++ % KSTAGE_SLOTS];
    int rc;
    if (sl->pending && (rc = slot_wait(s, sl)))
        return rc;
    if (sl->cap < bytes) {
        size_t cap = sl->cap * 2 > bytes ? sl->cap * 2 : bytes;
        if (cap < KSTAGE_MIN_BYTES)
            cap = KSTAGE_MIN_BYTES;
        slot_release(sl);
        cudaError_t e = cudaMallocHost(&sl->host, cap);
        if (e == cudaSuccess)
            e = cudaMalloc(&sl->dev, cap);
        if (e != cudaSuccess) {
            slot_release(sl);
            return stage_fail(s, e, "allocating staging memory");
        }
        sl->cap = cap;
    }
    *out = sl;
    return 0;
}

/* Uploads the slot's first `bytes` on the upload stream, makes `st` wait
 * for it, lets `launch` run on st, then marks the slot busy until st passes
 * this point (which is after the upload too). */
template <typename F>
static int stage_run(struct xfer_kstage *s, struct kslot *sl, size_t bytes, cudaStream_t st,
                     bool same, F launch)
{
    cudaError_t e =
        cudaMemcpyAsync(sl->dev, sl->host, bytes, cudaMemcpyHostToDevice, same ? st : s->up);
    if (e == cudaSuccess && !same)
        e = cudaEventRecord(sl->uploaded, s->up);
    if (e == cudaSuccess && !same)
        e = cudaStreamWaitEvent(st, sl->uploaded, 0);
    if (e != cudaSuccess) {
        cudaStreamSynchronize(same ? st : s->up);
        return stage_fail(s, e, "uploading descriptors");
    }
    e = launch();
    if (e != cudaSuccess) {
        /* the upload may still be reading the slot */
        if (cudaEventRecord(sl->done, st) == cudaSuccess)
            sl->pending = true;
        return stage_fail(s, e, "launching copy kernel");
    }
    e = cudaEventRecord(sl->done, st);
    if (e != cudaSuccess) {
        cudaStreamSynchronize(st);
        return stage_fail(s, e, "recording completion");
    }
    sl->pending = true;
    return 0;
}

/* Per thread block, the first descriptor reaching past the block's start. */
static void first_fill(uint32_t *first, const uint64_t *start, size_t blocks, uint64_t chunk)
{
    uint32_t k = 0;
    for (size_t b = 0; b < blocks; b++) {
        while (start[k + 1] <= b * chunk)
            k++;
        first[b] = k;
    }
}

/* Staging of a batched copy of n descriptors over `blocks` thread blocks:
 * the descriptors, then n + 1 prefix sums from *off_start, then one first
 * index per block from *off_first. Returns its bytes. */
static size_t copy_layout(size_t n, size_t blocks, size_t *off_start, size_t *off_first)
{
    size_t os = n * sizeof(struct xfer_copy_desc), of = os + (n + 1) * sizeof(uint64_t);
    if (off_start)
        *off_start = os;
    if (off_first)
        *off_first = of;
    return of + blocks * sizeof(uint32_t);
}

/* A slot for a batched copy of n descriptors, total bytes, grid g; *start:
 * where the prefix sums go (the descriptors go at the slot's start). */
static int copy_slot(struct xfer_kstage *s, size_t n, uint64_t total, struct kgrid g,
                     struct kslot **sl, uint64_t **start)
{
    size_t off_start, bytes = copy_layout(n, kgrid_blocks(total, g), &off_start, NULL);
    int rc = slot_get(s, bytes, sl);
    if (rc == 0)
        *start = (uint64_t *)((char *)(*sl)->host + off_start);
    return rc;
}

/* The slot holds the descriptors and their prefix sums: adds the blocks'
 * first indexes, uploads it and launches. */
static int copy_launch(struct xfer_kstage *s, struct kslot *sl, size_t n, uint64_t total,
                       struct kgrid g, void *stream)
{
    size_t blocks = kgrid_blocks(total, g);
    size_t off_start, off_first, bytes = copy_layout(n, blocks, &off_start, &off_first);
    first_fill((uint32_t *)((char *)sl->host + off_first),
               (const uint64_t *)((char *)sl->host + off_start), blocks, g.chunk);
    const uint64_t *ddesc = (const uint64_t *)sl->dev;
    const uint64_t *dstart = (const uint64_t *)((char *)sl->dev + off_start);
    const uint32_t *dfirst = (const uint32_t *)((char *)sl->dev + off_first);
    cudaStream_t st = (cudaStream_t)stream;
    return stage_run(s, sl, bytes, st, false, [&] {
        return klaunch_batched_copy(ddesc, dstart, dfirst, (uint32_t)n, total, g, st);
    });
}

extern "C" int xfer_kernels_batched_copy(struct xfer_kstage *s, const struct xfer_copy_desc *d,
                                         size_t n, void *stream)
{
    if (!s)
        return no_stage();
    if (!n)
        return 0;
    if (!d || n >= UINT32_MAX)
        return stage_failx(s, -XFER_EINVAL, "bad descriptor array");
    uint64_t total = 0;
    bool all_aligned = true;
    for (size_t i = 0; i < n; i++) {
        if (d[i].len && (!d[i].dst || !d[i].src))
            return stage_failx(s, -XFER_EINVAL, "descriptor %zu: NULL pointer", i);
        if (((uintptr_t)d[i].dst ^ (uintptr_t)d[i].src) & 15)
            all_aligned = false;
        if (total + d[i].len < total)
            return stage_failx(s, -XFER_EINVAL, "descriptor lengths overflow");
        total += d[i].len;
    }
    if (!total)
        return 0;
    device_scope ds(s->device);
    if (!ds.ok)
        return stage_failx(s, -XFER_ENODEV, "cannot select device %d", s->device);
    struct kgrid g = kgrid_pick(total, s->sms, s->cc_major, all_aligned);
    struct kslot *sl;
    uint64_t *start;
    int rc = copy_slot(s, n, total, g, &sl, &start);
    if (rc)
        return rc;
    memcpy(sl->host, d, n * sizeof(*d));
    uint64_t acc = 0;
    for (size_t i = 0; i < n; i++) {
        start[i] = acc;
        acc += d[i].len;
    }
    start[n] = acc;
    return copy_launch(s, sl, n, total, g, stream);
}

extern "C" int xfer_kernels_batched_copy_runs(struct xfer_kstage *s, const struct xfer_copy_run *r,
                                              size_t nr, uint64_t total, void *stream)
{
    if (!s)
        return no_stage();
    size_t n = 0;
    for (size_t x = 0; x < nr; x++) {
        if (r[x].n && (!r[x].a || !r[x].b || !r[x].segs))
            return stage_failx(s, -XFER_EINVAL, "run %zu: NULL pointer", x);
        n += r[x].n;
    }
    if (!n || !total)
        return 0;
    if (n >= UINT32_MAX)
        return stage_failx(s, -XFER_EINVAL, "too many segments");
    device_scope ds(s->device);
    if (!ds.ok)
        return stage_failx(s, -XFER_ENODEV, "cannot select device %d", s->device);
    /* the grid needs the total, the staging the grid: the caller's total
     * sizes both, checked against the segments' sum below */
    struct kgrid g = kgrid_pick(total, s->sms, s->cc_major, true);
    struct kslot *sl;
    uint64_t *start, mis = 0;
    int rc = copy_slot(s, n, total, g, &sl, &start);
    if (rc)
        return rc;
    if (xfer_copy_runs_fill(r, nr, (struct xfer_copy_desc *)sl->host, start, &mis) != total)
        return stage_failx(s, -XFER_EINVAL, "segments do not add up to %llu bytes",
                           (unsigned long long)total);
    if (mis & 15) /* the bulk variant needs src == dst modulo 16 */
        g = kgrid_pick(total, s->sms, s->cc_major, false); /* the same chunk: same staging */
    return copy_launch(s, sl, n, total, g, stream);
}

/* Words of staging run x's arrays need: its stream bases, and its id
 * arrays unless the run before shares them by pointer (the runs of one
 * request do: the engine stores a request's ids once). */
static size_t brun_words(const struct xfer_block_run *r, size_t x)
{
    size_t w = 2 * (size_t)r[x].nstreams;
    bool same = x > 0 && r[x - 1].nids == r[x].nids;
    w += same && r[x - 1].a_ids == r[x].a_ids ? 0 : r[x].nids;
    w += same && r[x - 1].b_ids == r[x].b_ids ? 0 : r[x].nids;
    return w;
}

/* Fills host (its device copy at dev; NULL: a parameter blob, the array
 * fields then offsets into it): nr runs, nr + 1 byte prefix sums, then the
 * arrays; *mis: OR of a ^ b of every stream's start (the 16-byte test;
 * strides not multiples of 16 count as misaligned). */
static void brun_fill(const struct xfer_block_run *r, size_t nr, void *host, const void *dev,
                      uint64_t *mis)
{
    struct kbrun *run = (struct kbrun *)host;
    uint64_t *start = (uint64_t *)(run + nr), *w = start + nr + 1;
    const uint64_t *dw = (const uint64_t *)((uintptr_t)dev + (uintptr_t)((char *)w - (char *)host));
    uint64_t acc = 0, m = 0;
    size_t at = 0, a_ids = 0, b_ids = 0;
    for (size_t x = 0; x < nr; x++) {
        const struct xfer_block_run *q = &r[x];
        bool same = x > 0 && r[x - 1].nids == q->nids;
        if (!(same && r[x - 1].a_ids == q->a_ids)) {
            memcpy(w + at, q->a_ids, q->nids * sizeof(*w));
            a_ids = at;
            at += q->nids;
        }
        if (!(same && r[x - 1].b_ids == q->b_ids)) {
            memcpy(w + at, q->b_ids, q->nids * sizeof(*w));
            b_ids = at;
            at += q->nids;
        }
        memcpy(w + at, q->a_base, q->nstreams * sizeof(*w));
        memcpy(w + at + q->nstreams, q->b_base, q->nstreams * sizeof(*w));
        for (uint32_t k = 0; k < q->nstreams; k++)
            m |= ((uintptr_t)q->a + q->a_base[k]) ^ ((uintptr_t)q->b + q->b_base[k]);
        m |= (q->a_stride | q->b_stride) & 15;
        run[x] = (struct kbrun){q->a,       q->b,       dw + at,     dw + at + q->nstreams,
                                dw + a_ids, dw + b_ids, q->a_stride, q->b_stride,
                                q->len,     q->s0,      q->nids,     (uint64_t)q->a_is_dst};
        at += 2 * (size_t)q->nstreams;
        start[x] = acc;
        acc += (uint64_t)(q->s1 - q->s0) * q->len;
    }
    start[nr] = acc;
    *mis = m;
}

/* How block runs reach the GPU (xfer_kernels_tune_upload, else
 * XFER_KSTAGE_UPLOAD=param|up|same): 0 in the launch's parameters when
 * they fit (else as 1), 1 uploaded on the stage's own stream, the launch
 * waiting for it by an event (the way before), 2 uploaded on the launch's
 * stream. */
static int upload_mode = -1;

extern "C" void xfer_kernels_tune_upload(int mode)
{
    __atomic_store_n(&upload_mode, mode >= 0 && mode <= 2 ? mode : 0, __ATOMIC_RELAXED);
}

static int upload_how(void)
{
    int m = __atomic_load_n(&upload_mode, __ATOMIC_RELAXED);
    if (m < 0) {
        const char *e = getenv("XFER_KSTAGE_UPLOAD");
        m = e && !strcmp(e, "up") ? 1 : e && !strcmp(e, "same") ? 2 : 0;
        __atomic_store_n(&upload_mode, m, __ATOMIC_RELAXED);
    }
    return m;
}

/* Block runs in the launch's parameters: 1 (not launched) when they do
 * not fit or the driver refuses parameters that large (then never again
 * on this stage), else 0 or the launch's error. */
static int brun_param(struct xfer_kstage *s, const struct xfer_block_run *r, size_t nr,
                      size_t bytes, uint64_t total, cudaStream_t st)
{
    if (s->no_param || bytes > sizeof(((struct kparam_blob *)0)->w))
        return 1;
    if (!s->pb && !(s->pb = (struct kparam_blob *)malloc(sizeof(*s->pb))))
        return 1;
    struct kparam_blob *p = s->pb; /* the launch copies it: reused at once */
    uint64_t mis = 0;
    brun_fill(r, nr, p->w, NULL, &mis);
    struct kgrid g = kgrid_pick_blocks(total, s->sms, s->cc_major, (mis & 15) == 0);
    p->total = total, p->chunk = g.chunk, p->nr = (uint32_t)nr, p->pad = 0;
    cudaError_t e = klaunch_block_runs_param(p, g, st);
    if (e == cudaErrorInvalidValue || e == cudaErrorNotSupported ||
        e == cudaErrorLaunchOutOfResources) {
        (void)cudaGetLastError(); /* a driver before r530: 4 KiB of parameters at most */
        s->no_param = true;
        return 1;
    }
    return e == cudaSuccess ? 0 : stage_fail(s, e, "launching copy kernel");
}

extern "C" int xfer_kernels_block_runs(struct xfer_kstage *s, const struct xfer_block_run *r,
                                       size_t nr, void *stream)
{
    if (!s)
        return no_stage();
    uint64_t total = 0, mis = 0;
    size_t bad = 0;
    if ((nr && !r) || nr >= UINT32_MAX)
        return stage_failx(s, -XFER_EINVAL, "bad block run array");
    int rc = xfer_block_runs_check(r, nr, &total, &bad);
    if (rc)
        return stage_failx(s, rc, "block run %zu: NULL array, no length or bad segment range", bad);
    if (!total)
        return 0;
    device_scope ds(s->device);
    if (!ds.ok)
        return stage_failx(s, -XFER_ENODEV, "cannot select device %d", s->device);
    size_t words = 0;
    for (size_t x = 0; x < nr; x++)
        words += brun_words(r, x);
    size_t bytes = nr * sizeof(struct kbrun) + (nr + 1 + words) * sizeof(uint64_t);
    cudaStream_t st = (cudaStream_t)stream;
    int how = upload_how();
    if (how == 0 && (rc = brun_param(s, r, nr, bytes, total, st)) <= 0)
        return rc;
    struct kslot *sl;
    if ((rc = slot_get(s, bytes, &sl)))
        return rc;
    brun_fill(r, nr, sl->host, sl->dev, &mis);
    struct kgrid g = kgrid_pick_blocks(total, s->sms, s->cc_major, (mis & 15) == 0);
    const struct kbrun *druns = (const struct kbrun *)sl->dev;
    const uint64_t *dstart = (const uint64_t *)(druns + nr);
    return stage_run(s, sl, bytes, st, how == 2,
                     [&] { return klaunch_block_runs(druns, dstart, (uint32_t)nr, total, g, st); });
}

static int kv_run(struct xfer_kstage *s, const struct xfer_kv_layout *lay, const uint64_t *ids,
                  size_t n_ids, char *buf, int scatter, void *stream)
{
    int rc;
    if (!s)
        return no_stage();
    if ((rc = xfer_kv_check(lay, ids, n_ids)))
        return stage_failx(s, rc, "bad KV layout or block id");
    if (!n_ids)
        return 0;
    if (!buf)
        return stage_failx(s, -XFER_EINVAL, "NULL buffer");
    uint64_t per_layer = n_ids * lay->block_bytes;
    if (per_layer / lay->block_bytes != n_ids ||
        per_layer * lay->num_layers / lay->num_layers != per_layer)
        return stage_failx(s, -XFER_EINVAL, "KV transfer size overflows");
    device_scope ds(s->device);
    if (!ds.ok)
        return stage_failx(s, -XFER_ENODEV, "cannot select device %d", s->device);
    size_t bytes = ((size_t)lay->num_layers + n_ids) * sizeof(uint64_t);
    struct kslot *sl;
    if ((rc = slot_get(s, bytes, &sl)))
        return rc;
    uint64_t *hb = (uint64_t *)sl->host;
    for (uint32_t l = 0; l < lay->num_layers; l++)
        hb[l] = (uint64_t)(uintptr_t)xfer_kv_block_addr(lay, l, 0);
    memcpy(hb + lay->num_layers, ids, n_ids * sizeof(*ids));
    const uint64_t *dbase = (const uint64_t *)sl->dev;
    uint64_t stride = lay->block_stride ? lay->block_stride : lay->block_bytes;
    bool aligned = (lay->block_bytes % 16) == 0 && (stride % 16) == 0 && ((uintptr_t)buf % 16) == 0;
    for (uint32_t l = 0; aligned && l < lay->num_layers; l++)
        aligned = (hb[l] % 16) == 0;
    struct kgrid g = kgrid_pick(per_layer * lay->num_layers, s->sms, s->cc_major, aligned);
    cudaStream_t st = (cudaStream_t)stream;
    return stage_run(s, sl, bytes, st, false, [&] {
        return klaunch_kv(dbase, dbase + lay->num_layers, n_ids, lay->num_layers, lay->block_bytes,
                          stride, buf, scatter, g, st);
    });
}

extern "C" int xfer_kernels_kv_gather(struct xfer_kstage *s, const struct xfer_kv_layout *lay,
                                      const uint64_t *ids, size_t n_ids, void *buf, void *stream)
{
    return kv_run(s, lay, ids, n_ids, (char *)buf, 0, stream);
}

extern "C" int xfer_kernels_kv_scatter(struct xfer_kstage *s, const struct xfer_kv_layout *lay,
                                       const uint64_t *ids, size_t n_ids, const void *buf,
                                       void *stream)
{
    return kv_run(s, lay, ids, n_ids, (char *)buf, 1, stream);
}
