/* TCPX receive unpack on the GPU: the kernel (one warp per fragment, widest
 * access src and dst allow), per-fragment copy-engine copies, and the
 * host-mediated gather, behind struct xfer_unpacker. */
#include "klaunch.h"
#include "xfer_err.h"
#include "xfer_kernels.h"

#include <cuda_runtime.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define UNPACK_THREADS      256
#define UNPACK_SPAN_MAX     (64ull << 20) /* larger bounce spans are gathered per fragment */
#define UNPACK_FREE_WAIT_MS 30000

struct xfer_unpacker {
    int device;
    int sms;
    cudaStream_t st;
    cudaEvent_t done;
    bool pending;
    struct xfer_unpack_frag *hfrag, *dfrag; /* pinned host, device */
    size_t frag_cap;
    char *span; /* pinned: the bounce span, D2H (host method) */
    size_t span_cap;
    char *gather; /* pinned: the gathered message (host method, device dst) */
    size_t gather_cap;
    enum xfer_unpack_method last;
    uint64_t peer_on, peer_bad; /* bit d: this GPU's kernels can / cannot read GPU d */
    uint64_t launches, copies;
    char err[256];
};

/* ---- the kernel ----------------------------------------------------------------- */

template <typename T>
__device__ __forceinline__ void copy_words(char *d, const char *s, uint64_t len, int lane)
{
    uint64_t nw = len / sizeof(T), i = lane;
    T *dw = (T *)d;
    const T *sw = (const T *)s;
    for (; i + 96 < nw; i += 128) { /* four loads in flight per lane */
        T a = sw[i], b = sw[i + 32], c = sw[i + 64], e = sw[i + 96];
        dw[i] = a;
        dw[i + 32] = b;
        dw[i + 64] = c;
        dw[i + 96] = e;
    }
    for (; i < nw; i += 32)
        dw[i] = sw[i];
    for (uint64_t o = nw * sizeof(T) + lane; o < len; o += 32)
        d[o] = s[o];
}

/* One warp copies one fragment: bytes up to the common alignment of src and
 * dst, then the widest words both allow, then the tail. */
__device__ __forceinline__ void copy_frag(char *d, const char *s, uint64_t len, int lane)
{
    uintptr_t x = (uintptr_t)d ^ (uintptr_t)s;
    unsigned w = !(x & 15) ? 16 : !(x & 7) ? 8 : !(x & 3) ? 4 : 1;
    if (w > 1) {
        uint64_t head = (w - ((uintptr_t)s & (w - 1))) & (w - 1);
        head = head < len ? head : len;
        if ((uint64_t)lane < head)
            d[lane] = s[lane];
        d += head, s += head, len -= head;
    }
    switch (w) {
    case 16:
        copy_words<uint4>(d, s, len, lane);
        break;
    case 8:
        copy_words<uint2>(d, s, len, lane);
        break;
    case 4:
        copy_words<unsigned>(d, s, len, lane);
        break;
    default:
        copy_words<unsigned char>(d, s, len, lane);
    }
}

__global__ void unpack_kernel(char *dst, const char *bounce, const struct xfer_unpack_frag *f,
                              uint32_t n)
{
    int lane = threadIdx.x & 31;
    uint32_t warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    uint32_t nwarps = (gridDim.x * blockDim.x) >> 5;
    for (uint32_t i = warp; i < n; i += nwarps) {
        struct xfer_unpack_frag g = f[i];
        copy_frag(dst + g.dst_off, bounce + g.src_off, g.len, lane);
    }
}

cudaError_t kunpack_preload(void)
{
    struct cudaFuncAttributes a;
    return cudaFuncGetAttributes(&a, unpack_kernel);
}

/* ---- helpers -------------------------------------------------------------------- */

static int fail(struct xfer_unpacker *u, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(u->err, sizeof(u->err), fmt, ap);
    va_end(ap);
    (void)cudaGetLastError();
    return rc;
}

static int cfail(struct xfer_unpacker *u, cudaError_t e, const char *what)
{
    int rc = e == cudaErrorMemoryAllocation ? -XFER_ENOMEM : -XFER_EIO;
    return fail(u, rc, "%s: %s", what, cudaGetErrorString(e));
}

/* Device memory (>= 0) or host (-1); *dev_ptr: the address a kernel uses,
 * NULL when a kernel cannot reach it (pageable host memory). */
static int classify(const void *p, const void **dev_ptr)
{
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError();
        *dev_ptr = NULL;
        return -1;
    }
    if (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged) {
        *dev_ptr = p;
        return a.device;
    }
    *dev_ptr = a.type == cudaMemoryTypeHost ? a.devicePointer : NULL;
    return -1;
}

extern "C" int xfer_kernels_ptr_device(const void *p)
{
    const void *d;
    return classify(p, &d);
}

extern "C" void *xfer_kernels_host_ptr(void *p)
{
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return p;
    }
    if (a.type == cudaMemoryTypeHost)
        return a.hostPointer ? a.hostPointer : p;
    return a.type == cudaMemoryTypeDevice ? NULL : p;
}

extern "C" int xfer_kernels_copy(void *dst, const void *src, size_t len)
{
    const void *d;
    if (classify(dst, &d) < 0 && classify(src, &d) < 0) {
        memcpy(dst, src, len);
        return 0;
    }
    cudaError_t e = cudaMemcpy(dst, src, len, cudaMemcpyDefault);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return -XFER_EIO;
    }
    return 0;
}

static int grow_pinned(struct xfer_unpacker *u, char **p, size_t *cap, size_t need)
{
    if (*cap >= need)
        return 0;
    if (*p)
        cudaFreeHost(*p);
    *p = NULL;
    *cap = 0;
    size_t c = need < (1u << 20) ? (1u << 20) : need;
    cudaError_t e = cudaMallocHost((void **)p, c);
    if (e != cudaSuccess)
        return cfail(u, e, "pinned buffer");
    *cap = c;
    return 0;
}

static int grow_frags(struct xfer_unpacker *u, size_t n)
{
    if (u->frag_cap >= n)
        return 0;
    cudaFreeHost(u->hfrag);
    cudaFree(u->dfrag);
    u->hfrag = u->dfrag = NULL;
    u->frag_cap = 0;
    size_t c = n < 4096 ? 4096 : n;
    cudaError_t e = cudaMallocHost((void **)&u->hfrag, c * sizeof(*u->hfrag));
    if (e == cudaSuccess)
        e = cudaMalloc((void **)&u->dfrag, c * sizeof(*u->dfrag));
    if (e != cudaSuccess)
        return cfail(u, e, "fragment buffers");
    u->frag_cap = c;
    return 0;
}

/* ---- object --------------------------------------------------------------------- */

extern "C" int xfer_unpacker_new(int device, struct xfer_unpacker **out)
{
    *out = NULL;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || device < 0 || device >= n) {
        (void)cudaGetLastError();
        return -XFER_ENODEV;
    }
    struct xfer_unpacker *u = (struct xfer_unpacker *)calloc(1, sizeof(*u));
    if (!u)
        return -XFER_ENOMEM;
    u->device = device;
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&u->sms, cudaDevAttrMultiProcessorCount, device);
    if (e == cudaSuccess)
        e = cudaStreamCreateWithFlags(&u->st, cudaStreamNonBlocking);
    if (e == cudaSuccess)
        e = cudaEventCreateWithFlags(&u->done, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        xfer_unpacker_free(u);
        return -XFER_ENODEV;
    }
    *out = u;
    return 0;
}

extern "C" void xfer_unpacker_free(struct xfer_unpacker *u)
{
    if (!u)
        return;
    cudaSetDevice(u->device);
    if (u->pending)
        xfer_unpacker_wait(u, UNPACK_FREE_WAIT_MS);
    if (u->done)
        cudaEventDestroy(u->done);
    if (u->st)
        cudaStreamDestroy(u->st);
    cudaFreeHost(u->hfrag);
    cudaFree(u->dfrag);
    cudaFreeHost(u->span);
    cudaFreeHost(u->gather);
    (void)cudaGetLastError();
    free(u);
}

extern "C" const char *xfer_unpacker_last_error(const struct xfer_unpacker *u)
{
    return u ? u->err : "no unpacker";
}

extern "C" enum xfer_unpack_method xfer_unpacker_method(const struct xfer_unpacker *u)
{
    return u->last;
}

extern "C" uint64_t xfer_unpacker_launches(const struct xfer_unpacker *u)
{
    return u->launches;
}

extern "C" uint64_t xfer_unpacker_copies(const struct xfer_unpacker *u)
{
    return u->copies;
}

/* ---- methods -------------------------------------------------------------------- */

static int run_kernel(struct xfer_unpacker *u, char *dst, const char *bounce,
                      const struct xfer_unpack_frag *f, size_t n)
{
    int rc = grow_frags(u, n);
    if (rc)
        return rc;
    memcpy(u->hfrag, f, n * sizeof(*f));
    cudaError_t e =
        cudaMemcpyAsync(u->dfrag, u->hfrag, n * sizeof(*f), cudaMemcpyHostToDevice, u->st);
    if (e != cudaSuccess)
        return cfail(u, e, "uploading fragments");
    u->copies++;
    size_t warps_per_block = UNPACK_THREADS / 32;
    size_t blocks = (n + warps_per_block - 1) / warps_per_block;
    size_t cap = (size_t)(u->sms > 0 ? u->sms : 16) * 16;
    unpack_kernel<<<(unsigned)(blocks < cap ? blocks : cap), UNPACK_THREADS, 0, u->st>>>(
        dst, bounce, u->dfrag, (uint32_t)n);
    if ((e = cudaGetLastError()) != cudaSuccess)
        return cfail(u, e, "launching the unpack kernel");
    u->launches++;
    return 0;
}

static int run_d2d(struct xfer_unpacker *u, char *dst, const char *bounce,
                   const struct xfer_unpack_frag *f, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (!f[i].len)
            continue;
        cudaError_t e = cudaMemcpyAsync(dst + f[i].dst_off, bounce + f[i].src_off, f[i].len,
                                        cudaMemcpyDefault, u->st);
        if (e != cudaSuccess)
            return cfail(u, e, "fragment copy");
        u->copies++;
    }
    return 0;
}

/* The fragments' source span in host memory: the bounce itself when it is
 * host memory, else one D2H of [lo, hi) into the span buffer (waited for).
 * *base is then the host address of bounce offset 0 (may point before the
 * buffer; only [lo, hi) is read). NULL base: span too large, caller goes
 * per fragment. */
static int host_view(struct xfer_unpacker *u, const char *bounce, bool bounce_dev,
                     const struct xfer_unpack_frag *f, size_t n, const char **base)
{
    if (!bounce_dev) {
        *base = bounce;
        return 0;
    }
    uint64_t lo = UINT64_MAX, hi = 0;
    for (size_t i = 0; i < n; i++) {
        if (!f[i].len)
            continue;
        lo = f[i].src_off < lo ? f[i].src_off : lo;
        hi = f[i].src_off + (uint64_t)f[i].len > hi ? f[i].src_off + (uint64_t)f[i].len : hi;
    }
    *base = NULL;
    if (hi <= lo)
        return 0;
    if (hi - lo > UNPACK_SPAN_MAX)
        return 0;
    int rc = grow_pinned(u, &u->span, &u->span_cap, hi - lo);
    if (rc)
        return rc;
    cudaError_t e = cudaMemcpyAsync(u->span, bounce + lo, hi - lo, cudaMemcpyDefault, u->st);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(u->st);
    if (e != cudaSuccess)
        return cfail(u, e, "copying the bounce span to the host");
    u->copies++;
    *base = u->span - lo;
    return 0;
}

static int run_host(struct xfer_unpacker *u, char *dst, bool dst_dev, const char *bounce,
                    bool bounce_dev, const struct xfer_unpack_frag *f, size_t n)
{
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++)
        if (f[i].dst_off + f[i].len > total)
            total = f[i].dst_off + f[i].len;
    char *out = dst;
    int rc;
    if (dst_dev) {
        if ((rc = grow_pinned(u, &u->gather, &u->gather_cap, total)))
            return rc;
        out = u->gather;
    }
    const char *base;
    if ((rc = host_view(u, bounce, bounce_dev, f, n, &base)))
        return rc;
    if (base) {
        xfer_kref_unpack(out, base, f, n);
    } else { /* huge span: one D2H per fragment straight into place */
        for (size_t i = 0; i < n; i++) {
            cudaError_t e = cudaMemcpyAsync(out + f[i].dst_off, bounce + f[i].src_off, f[i].len,
                                            cudaMemcpyDefault, u->st);
            if (e != cudaSuccess)
                return cfail(u, e, "fragment copy to the host");
            u->copies++;
        }
        cudaError_t e = cudaStreamSynchronize(u->st);
        if (e != cudaSuccess)
            return cfail(u, e, "fragment copies to the host");
    }
    if (dst_dev && total) {
        cudaError_t e = cudaMemcpyAsync(dst, u->gather, total, cudaMemcpyHostToDevice, u->st);
        if (e != cudaSuccess)
            return cfail(u, e, "copying the gathered message to the GPU");
        u->copies++;
    }
    return 0;
}

extern "C" int xfer_unpacker_start(struct xfer_unpacker *u, enum xfer_unpack_method m, void *dst,
                                   const void *bounce, const struct xfer_unpack_frag *f, size_t n)
{
    if (!u || (n && (!f || !dst || !bounce)) || n >= UINT32_MAX)
        return -XFER_EINVAL;
    if (u->pending)
        return fail(u, -XFER_EBUSY, "an unpack is still in flight");
    cudaError_t e = cudaSetDevice(u->device);
    if (e != cudaSuccess)
        return cfail(u, e, "selecting the device");
    const void *ddst, *dbounce;
    bool dst_dev = classify(dst, &ddst) >= 0;
    int bounce_gpu = classify(bounce, &dbounce);
    bool bounce_dev = bounce_gpu >= 0;
    if (m != XFER_UNPACK_HOST && !dst_dev)
        m = XFER_UNPACK_HOST; /* the GPU cannot write pageable host memory */
    if (m == XFER_UNPACK_KERNEL &&
        (!dbounce ||
         (bounce_dev && !kpeer_reach(u->device, bounce_gpu, &u->peer_on, &u->peer_bad))))
        m = XFER_UNPACK_D2D; /* nor read it, nor another GPU without peer access */
    u->last = m;
    int rc = 0;
    if (n)
        rc = m == XFER_UNPACK_KERNEL ? run_kernel(u, (char *)dst, (const char *)dbounce, f, n)
             : m == XFER_UNPACK_D2D
                 ? run_d2d(u, (char *)dst, (const char *)bounce, f, n)
                 : run_host(u, (char *)dst, dst_dev, (const char *)bounce, bounce_dev, f, n);
    if (rc == 0 && (e = cudaEventRecord(u->done, u->st)) != cudaSuccess)
        rc = cfail(u, e, "recording completion");
    if (rc) { /* whatever was queued must finish before buffers are reused */
        cudaStreamSynchronize(u->st);
        (void)cudaGetLastError();
        return rc;
    }
    u->pending = true;
    return 0;
}

extern "C" int xfer_unpacker_poll(struct xfer_unpacker *u)
{
    if (!u->pending)
        return 0;
    cudaError_t e = cudaEventQuery(u->done);
    if (e == cudaErrorNotReady)
        return -XFER_EINPROGRESS;
    u->pending = false;
    if (e != cudaSuccess)
        return cfail(u, e, "unpack");
    return 0;
}

extern "C" int xfer_unpacker_wait(struct xfer_unpacker *u, int timeout_ms)
{
    struct timespec t0, now, nap = {0, 10000};
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (unsigned spins = 0;; spins++) {
        int rc = xfer_unpacker_poll(u);
        if (rc != -XFER_EINPROGRESS)
            return rc;
        clock_gettime(CLOCK_MONOTONIC, &now);
        int64_t ms = (now.tv_sec - t0.tv_sec) * 1000 + (now.tv_nsec - t0.tv_nsec) / 1000000;
        if (ms > timeout_ms)
            return fail(u, -XFER_ETIMEDOUT, "unpack still running after %d ms", timeout_ms);
        if (spins > 256)
            nanosleep(&nap, NULL);
    }
}
