/* Copy kernels: a byte range per thread block, widest accesses that the
 * relative alignment of src and dst allows, several loads in flight. */
#include "klaunch.h"

#include "xfer_kernels.h"

#define KCOPY_UNROLL 4

/* Thread tid of nt copies its share of n elements; loads of one round are
 * all issued before the first store so U requests are in flight. */
template <typename T, int U>
__device__ __forceinline__ void copy_elems(T *__restrict__ d, const T *__restrict__ s, uint32_t n,
                                           unsigned tid, unsigned nt)
{
    for (uint32_t base = tid; base < n; base += nt * U) {
        T v[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            uint32_t i = base + u * nt;
            if (i < n)
                v[u] = s[i];
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            uint32_t i = base + u * nt;
            if (i < n)
                d[i] = v[u];
        }
    }
}

/* dst and src have equal address modulo sizeof(T): bytes up to dst's
 * alignment, then T-wide elements, then the tail bytes. len < 4 GiB: one
 * call copies at most one block's chunk. */
template <typename T>
__device__ __forceinline__ void copy_as(char *dst, const char *src, uint32_t len, unsigned tid,
                                        unsigned nt)
{
    const uint32_t w = sizeof(T);
    uint32_t head = (w - ((uint32_t)(uintptr_t)dst & (w - 1))) & (w - 1);
    if (head > len)
        head = len;
    if (tid < head)
        dst[tid] = src[tid];
    uint32_t body = (len - head) / w;
    copy_elems<T, KCOPY_UNROLL>((T *)(dst + head), (const T *)(src + head), body, tid, nt);
    uint32_t done = head + body * w;
    if (tid < len - done)
        dst[done + tid] = src[done + tid];
}

/* src and dst differ in alignment modulo 16: the widest access both allow. */
__device__ __forceinline__ void copy_narrow(char *dst, const char *src, uint32_t len, unsigned tid,
                                         unsigned nt)
{
    unsigned mis = (unsigned)(((uintptr_t)dst ^ (uintptr_t)src) & 15);
    if ((mis & 7) == 0)
        copy_as<uint2>(dst, src, len, tid, nt);
    else if ((mis & 3) == 0)
        copy_as<uint32_t>(dst, src, len, tid, nt);
    else if ((mis & 1) == 0)
        copy_as<uint16_t>(dst, src, len, tid, nt);
    else
        copy_elems<uint8_t, 2 * KCOPY_UNROLL>((uint8_t *)dst, (const uint8_t *)src, len, tid, nt);
}

/* The whole block copies len (< 4 GiB) bytes. */
__device__ __forceinline__ void copy_range(char *dst, const char *src, uint32_t len, unsigned tid,
                                           unsigned nt)
{
    unsigned mis = (unsigned)(((uintptr_t)dst ^ (uintptr_t)src) & 15);
    if (mis == 0)
        copy_as<uint4>(dst, src, len, tid, nt);
    else
        copy_narrow(dst, src, len, tid, nt);
}

/* Block b copies global bytes [b*chunk, (b+1)*chunk) of the concatenation of
 * all descriptors; start[] locates the first descriptor it touches. */
__global__ void __launch_bounds__(512, 2) batched_copy_kernel(const uint64_t *__restrict__ desc,
                                    const uint64_t *__restrict__ start, uint32_t n,
                                    uint64_t total, uint64_t chunk)
{
    __shared__ uint32_t first;
    uint64_t lo = (uint64_t)blockIdx.x * chunk;
    uint64_t hi = min(lo + chunk, total);
    if (threadIdx.x == 0) { /* first k with start[k+1] > lo */
        uint32_t a = 0, b = n;
        while (a < b) {
            uint32_t m = (a + b) / 2;
            if (start[m + 1] > lo)
                b = m;
            else
                a = m + 1;
        }
        first = a;
    }
    __syncthreads();
    for (uint32_t k = first; k < n && start[k] < hi; k++) {
        uint64_t s0 = start[k], s1 = start[k + 1];
        uint64_t a = max(lo, s0) - s0, b = min(hi, s1) - s0;
        if (b > a)
            copy_range((char *)desc[3 * k] + a, (const char *)desc[3 * k + 1] + a, (uint32_t)(b - a),
                       threadIdx.x, blockDim.x);
    }
}

/* Block b copies bytes [b*chunk, (b+1)*chunk) of the contiguous buffer; piece
 * p of it is block ids[p % n_ids] of layer p / n_ids. */
__global__ void __launch_bounds__(512, 2) kv_kernel(const uint64_t *__restrict__ layer_base, const uint64_t *__restrict__ ids,
                          uint64_t n_ids, uint64_t block_bytes, uint64_t block_stride, char *buf,
                          uint64_t total, uint64_t chunk, int scatter)
{
    uint64_t pos = (uint64_t)blockIdx.x * chunk;
    uint64_t hi = min(pos + chunk, total);
    uint64_t p = pos / block_bytes, off = pos - p * block_bytes;
    while (pos < hi) {
        uint64_t l = p / n_ids, i = p - l * n_ids;
        char *blk = (char *)layer_base[l] + ids[i] * block_stride + off;
        uint64_t take = min(block_bytes - off, hi - pos);
        if (scatter)
            copy_range(blk, buf + pos, (uint32_t)take, threadIdx.x, blockDim.x);
        else
            copy_range(buf + pos, blk, (uint32_t)take, threadIdx.x, blockDim.x);
        pos += take;
        p++;
        off = 0;
    }
}

static uint64_t tune_chunk;
static unsigned tune_threads;

extern "C" void xfer_kernels_tune(uint64_t chunk_bytes, unsigned threads)
{
    /* one block's range must stay < 4 GiB (32-bit indices inside a block) */
    tune_chunk = (chunk_bytes > (1ull << 30) ? 1ull << 30 : chunk_bytes) & ~(uint64_t)15;
    tune_threads = (threads >= 32 && threads <= 512) ? threads & ~31u : 0;
}

struct kgrid kgrid_pick(uint64_t total, int sms)
{
    struct kgrid g;
    g.threads = tune_threads ? tune_threads : 256;
    g.chunk = tune_chunk;
    if (!g.chunk) { /* ~16 blocks per SM, each a multiple of 16 KiB, at most 256 KiB */
        const uint64_t unit = 16384;
        uint64_t want = total / ((uint64_t)(sms > 0 ? sms : 1) * 16);
        g.chunk = (want + unit - 1) / unit * unit;
        if (g.chunk < unit)
            g.chunk = unit;
        if (g.chunk > 16 * unit)
            g.chunk = 16 * unit;
    }
    return g;
}

static unsigned grid_blocks(uint64_t total, uint64_t chunk)
{
    return (unsigned)((total + chunk - 1) / chunk);
}

cudaError_t klaunch_batched_copy(const uint64_t *desc, const uint64_t *start, uint32_t n,
                                 uint64_t total, struct kgrid g, cudaStream_t st)
{
    if (!total)
        return cudaSuccess;
    if ((total + g.chunk - 1) / g.chunk > 0x7fffffffu)
        return cudaErrorInvalidValue;
    batched_copy_kernel<<<grid_blocks(total, g.chunk), g.threads, 0, st>>>(desc, start, n, total,
                                                                           g.chunk);
    return cudaGetLastError();
}

cudaError_t klaunch_kv(const uint64_t *layer_base, const uint64_t *ids, uint64_t n_ids,
                       uint32_t layers, uint64_t block_bytes, uint64_t block_stride, char *buf,
                       int scatter, struct kgrid g, cudaStream_t st)
{
    uint64_t total = (uint64_t)layers * n_ids * block_bytes;
    if (!total)
        return cudaSuccess;
    if ((total + g.chunk - 1) / g.chunk > 0x7fffffffu)
        return cudaErrorInvalidValue;
    kv_kernel<<<grid_blocks(total, g.chunk), g.threads, 0, st>>>(
        layer_base, ids, n_ids, block_bytes, block_stride, buf, total, g.chunk, scatter);
    return cudaGetLastError();
}
