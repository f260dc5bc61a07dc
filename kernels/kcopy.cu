/* Copy kernels: a byte range per thread block, widest accesses that the
 * relative alignment of src and dst allows, several loads in flight. */
#include "klaunch.h"

#include "xfer_err.h"
#include "xfer_kernels.h"

#include <stdlib.h>
#include <type_traits>

#define KCOPY_UNROLL 4

/* A piece: one contiguous copy inside one thread block's byte range. */
struct kpiece {
    char *dst;
    const char *src;
    uint32_t len;
};

#include "kbulk.cuh"

template <typename T, int HINT> __device__ __forceinline__ T kload(const T *p)
{
    if (HINT)
        return __ldcs(p); /* streaming: evict first, the data is used once */
    return *p;
}

template <typename T, int HINT> __device__ __forceinline__ void kstore(T *p, T v)
{
    if (HINT)
        __stcs(p, v);
    else
        *p = v;
}

/* Thread tid of nt copies its share of n elements; loads of one round are
 * all issued before the first store so U requests are in flight. */
template <typename T, int U, int HINT = 0>
__device__ __forceinline__ void copy_elems(T *__restrict__ d, const T *__restrict__ s, uint32_t n,
                                           unsigned tid, unsigned nt)
{
    for (uint32_t base = tid; base < n; base += nt * U) {
        T v[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            uint32_t i = base + u * nt;
            if (i < n)
                v[u] = kload<T, HINT>(s + i);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            uint32_t i = base + u * nt;
            if (i < n)
                kstore<T, HINT>(d + i, v[u]);
        }
    }
}

/* dst and src have equal address modulo sizeof(T): bytes up to dst's
 * alignment, then T-wide elements, then the tail bytes. len < 4 GiB: one
 * call copies at most one block's chunk. */
template <typename T, int U = KCOPY_UNROLL, int HINT = 0>
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
    copy_elems<T, U, HINT>((T *)(dst + head), (const T *)(src + head), body, tid, nt);
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

/* The threads [0, nt) copy one piece. */
template <int U, int HINT>
__device__ __forceinline__ void copy_piece(const kpiece &p, unsigned tid, unsigned nt)
{
    if ((((uintptr_t)p.dst ^ (uintptr_t)p.src) & 15) == 0)
        copy_as<uint4, U, HINT>(p.dst, p.src, p.len, tid, nt);
    else
        copy_narrow(p.dst, p.src, p.len, tid, nt);
}

/* What the bulk pipeline leaves: head and tail bytes of aligned pieces, and
 * the whole of relatively misaligned ones. */
__device__ __forceinline__ void copy_fringe(const kpiece &p, unsigned tid, unsigned nt)
{
    uint32_t head, body;
    if ((((uintptr_t)p.dst ^ (uintptr_t)p.src) & 15) != 0 ||
        !bulk_body(p.dst, p.len, &head, &body)) {
        copy_piece<KCOPY_UNROLL, 0>(p, tid, nt);
        return;
    }
    if (tid < head)
        p.dst[tid] = p.src[tid];
    uint32_t done = head + body;
    if (tid < p.len - done)
        p.dst[done + tid] = p.src[done + tid];
}

/* Pieces of the batched copy in bytes [lo, hi) of the concatenation of all
 * descriptors; k starts at the first descriptor that reaches past lo. */
struct desc_walk {
    const uint64_t *desc, *start;
    uint32_t n, k;
    uint64_t lo, hi;
    __device__ bool next(kpiece &p)
    {
        while (k < n && start[k] < hi) {
            uint64_t s0 = start[k], s1 = start[k + 1];
            uint64_t a = max(lo, s0) - s0, b = min(hi, s1) - s0;
            const uint64_t *d = desc + 3 * (uint64_t)k++;
            if (b > a) {
                p.dst = (char *)d[0] + a;
                p.src = (const char *)d[1] + a;
                p.len = (uint32_t)(b - a);
                return true;
            }
        }
        return false;
    }
};

/* Pieces of a KV gather/scatter in bytes [pos, hi) of the contiguous buffer;
 * piece q is block ids[q % n_ids] of layer q / n_ids. */
struct kv_walk {
    const uint64_t *layer_base, *ids;
    uint64_t n_ids, block_bytes, block_stride;
    char *buf;
    uint64_t pos, hi, q, off;
    int scatter;
    __device__ bool next(kpiece &p)
    {
        if (pos >= hi)
            return false;
        uint64_t l = q / n_ids, i = q - l * n_ids;
        char *blk = (char *)layer_base[l] + ids[i] * block_stride + off;
        uint64_t take = min(block_bytes - off, hi - pos);
        p.dst = scatter ? blk : buf + pos;
        p.src = scatter ? buf + pos : blk;
        p.len = (uint32_t)take;
        pos += take;
        q++;
        off = 0;
        return true;
    }
};

/* Pieces of block runs in bytes [pos, hi) of their concatenation; run r
 * holds pos. Segment k of a run (from its s0 on) lies at base[k / nids] +
 * ids[k % nids] * stride on each side: the expansion the CPU used to do
 * per segment (32,768 descriptors for one KV pool request), here on the
 * GPU. The divisions run once per thread block and run (seek); then the
 * walk steps (stream, id) along, and the run's fields stay in registers.
 * The next segment's two ids are loaded as soon as the current piece is
 * handed out, so their latency hides behind its copy (the bulk engine's
 * one thread otherwise waits for them before it can issue the next load). */
struct block_walk {
    const kbrun *runs;
    const uint64_t *start;
    const char *rebase; /* added to a run's array fields (param launches: offsets) */
    uint32_t r, nr;
    uint64_t pos, hi, end; /* end: start[r + 1] */
    uint64_t st, i, off;   /* stream, id, offset of pos in its segment */
    uint64_t ia, ib;       /* ids[i] of each side, loaded ahead */
    uint64_t total;
    kbrun R;
    const char *ab, *bb; /* R.a + a_base[st], R.b + b_base[st] */
    __device__ void seek()
    {
        R = runs[r];
        R.a_base = (const uint64_t *)(rebase + (uintptr_t)R.a_base);
        R.b_base = (const uint64_t *)(rebase + (uintptr_t)R.b_base);
        R.a_ids = (const uint64_t *)(rebase + (uintptr_t)R.a_ids);
        R.b_ids = (const uint64_t *)(rebase + (uintptr_t)R.b_ids);
        end = start[r + 1];
        uint64_t rel = pos - start[r], q = rel / R.len;
        off = rel - q * R.len;
        uint64_t k = R.s0 + q;
        st = k / R.nids;
        i = k - st * R.nids;
        ia = R.a_ids[i];
        ib = R.b_ids[i];
        ab = R.a + R.a_base[st];
        bb = R.b + R.b_base[st];
    }
    /* The run holding pos: first guessed as if the runs were of one size
     * (a request's region pairs are: one latency, two loads side by side),
     * else a binary search for the last run starting at or before pos. */
    __device__ void locate()
    {
        uint32_t lo = (uint32_t)min((uint64_t)nr - 1, (uint64_t)((double)pos / total * nr));
        if (!(start[lo] <= pos && pos < start[lo + 1])) {
            uint32_t top = nr;
            lo = 0;
            while (top - lo > 1) {
                uint32_t mid = (lo + top) / 2;
                if (start[mid] <= pos)
                    lo = mid;
                else
                    top = mid;
            }
        }
        r = lo;
        seek();
    }
    __device__ bool next(kpiece &p)
    {
        if (pos >= hi)
            return false;
        if (pos >= end) { /* into the next run (empty ones: none, s0 < s1) */
            do
                r++;
            while (start[r + 1] <= pos);
            seek();
        }
        const char *a = ab + ia * R.a_stride + off;
        const char *b = bb + ib * R.b_stride + off;
        uint64_t take = min(R.len - off, hi - pos);
        p.dst = (char *)(R.a_is_dst ? a : b);
        p.src = R.a_is_dst ? b : a;
        p.len = (uint32_t)take;
        pos += take;
        off += take;
        if (off == R.len && pos < end) { /* the next segment of this run */
            off = 0;
            if (++i == R.nids) {
                i = 0;
                st++;
                ab = R.a + R.a_base[st];
                bb = R.b + R.b_base[st];
            }
            if (pos < hi) {
                ia = R.a_ids[i];
                ib = R.b_ids[i];
            }
        }
        return true;
    }
};

/* Default variants (chosen by measurement, docs/kernels.md): KAUTO for any
 * batch, KAUTO_ALIGNED when every piece has src == dst modulo 16 (the bulk
 * engine, 64 threads: 1-3 % ahead of vec4 on one H200, equal across GPUs). */
#define KAUTO         KV_VEC4
#define KAUTO_ALIGNED KV_BULK
#define KBULK_THREADS 64

/* Variants (xfer_kernels_tune): 16-byte vector copy with U loads in flight
 * per thread, optionally with streaming cache hints; or the bulk engine.
 * Tried for the KV pool request and dropped (one H200, 2026-11-29,
 * docs/kernels.md): a grid-stride bulk kernel (as many thread blocks as
 * fit, each walking every grid-th chunk with its pipeline kept full) at
 * 0.89-0.895 of one copy against 0.913 for this one, and evict-first L2
 * hints on the bulk loads and stores (0.915: no change). */
enum { KV_VEC4 = 1, KV_VEC8, KV_VEC4S, KV_VEC8S, KV_BULK, KV_NVARIANTS };
#define KBULKV(V) ((V) == KV_BULK)

/* 8 loads in flight need more than 64 registers per thread, and so does
 * the bulk pipeline's thread with the block walk (316 bytes of spills at
 * 64); bulk blocks are 64 threads and shared memory limits them to 4 per
 * SM anyway. */
#define KMINBLOCKS(V) (((V) == KV_VEC8 || (V) == KV_VEC8S || KBULKV(V)) ? 1 : 2)

/* Runs a block's pieces with variant V. */
template <int V, class W> __device__ __forceinline__ void run_block(W w)
{
    if constexpr (KBULKV(V)) {
        extern __shared__ __align__(128) char kdyn[]; /* KBULK_SMEM bytes */
        uint64_t *bar = (uint64_t *)kdyn;
        char *stage = kdyn + 128;
        if (threadIdx.x == 0) {
            for (int i = 0; i < KBULK_STAGES; i++)
                mbar_init(&bar[i]);
            mbar_init_fence();
            bulk_pipeline(w, stage, bar);
        } else if (threadIdx.x >= 32) {
            kpiece p;
            while (w.next(p))
                copy_fringe(p, threadIdx.x - 32, blockDim.x - 32);
        }
    } else {
        constexpr int U = (V == KV_VEC8 || V == KV_VEC8S) ? 8 : 4;
        constexpr int H = (V == KV_VEC4S || V == KV_VEC8S) ? 1 : 0;
        kpiece p;
        while (w.next(p))
            copy_piece<U, H>(p, threadIdx.x, blockDim.x);
    }
}

/* Block b copies global bytes [b*chunk, (b+1)*chunk) of the concatenation of
 * all descriptors; first[b] is the first descriptor it touches. */
template <int V>
__global__ void __launch_bounds__(512, KMINBLOCKS(V))
    batched_copy_kernel(const uint64_t *__restrict__ desc, const uint64_t *__restrict__ start,
                        const uint32_t *__restrict__ first, uint32_t n, uint64_t total,
                        uint64_t chunk)
{
    desc_walk w;
    w.desc = desc, w.start = start, w.n = n, w.k = first[blockIdx.x];
    w.lo = (uint64_t)blockIdx.x * chunk;
    w.hi = min(w.lo + chunk, total);
    run_block<V>(w);
}

/* Block b copies bytes [b*chunk, (b+1)*chunk) of the contiguous buffer. */
template <int V>
__global__ void __launch_bounds__(512, KMINBLOCKS(V))
    kv_kernel(const uint64_t *__restrict__ layer_base, const uint64_t *__restrict__ ids,
              uint64_t n_ids, uint64_t block_bytes, uint64_t block_stride, char *buf,
              uint64_t total, uint64_t chunk, int scatter)
{
    kv_walk w;
    w.layer_base = layer_base, w.ids = ids, w.n_ids = n_ids, w.block_bytes = block_bytes;
    w.block_stride = block_stride, w.buf = buf, w.scatter = scatter;
    w.pos = (uint64_t)blockIdx.x * chunk;
    w.hi = min(w.pos + chunk, total);
    w.q = w.pos / block_bytes;
    w.off = w.pos - w.q * block_bytes;
    run_block<V>(w);
}

/* Block b copies bytes [b*chunk, (b+1)*chunk) of the runs' concatenation. */
template <int V>
__device__ __forceinline__ void block_runs_body(const kbrun *runs, const uint64_t *start,
                                                uint32_t nr, uint64_t total, uint64_t chunk,
                                                const char *rebase)
{
    block_walk w;
    w.runs = runs, w.start = start, w.nr = nr, w.total = total, w.rebase = rebase;
    w.pos = (uint64_t)blockIdx.x * chunk;
    w.hi = min(w.pos + chunk, total);
    if (w.pos >= w.hi)
        return;
    w.locate();
    run_block<V>(w);
}

template <int V>
__global__ void __launch_bounds__(512, KMINBLOCKS(V))
    block_runs_kernel(const kbrun *__restrict__ runs, const uint64_t *__restrict__ start,
                      uint32_t nr, uint64_t total, uint64_t chunk)
{
    block_runs_body<V>(runs, start, nr, total, chunk, nullptr);
}

/* The same with the runs, their prefix sums and arrays in the launch's
 * parameters (kparam_blob: no upload before the kernel; the run's array
 * fields are offsets into the blob). */
template <int V>
__global__ void __launch_bounds__(512, KMINBLOCKS(V))
    block_runs_param_kernel(const __grid_constant__ struct kparam_blob P)
{
    const char *blob = (const char *)P.w;
    block_runs_body<V>((const kbrun *)blob, (const uint64_t *)(blob + P.nr * sizeof(kbrun)), P.nr,
                       P.total, P.chunk, blob);
}

static uint64_t tune_chunk;
static unsigned tune_threads;
static int tune_variant;

extern "C" void xfer_kernels_tune(uint64_t chunk_bytes, unsigned threads, int variant)
{
    /* one block's range must stay < 4 GiB (32-bit indices inside a block) */
    tune_chunk = (chunk_bytes > (1ull << 30) ? 1ull << 30 : chunk_bytes) & ~(uint64_t)15;
    tune_threads = (threads >= 32 && threads <= 512) ? threads & ~31u : 0;
    tune_variant = variant > 0 && variant < KV_NVARIANTS ? variant : 0;
}

/* XFER_KERNELS_VARIANT / XFER_KERNELS_CHUNK: xfer_kernels_tune from the
 * environment, read at the first launch (to try a variant in a program
 * that does not call it, e.g. bench_pool_gpu). */
static void tune_env(void)
{
    static int done;
    if (__atomic_exchange_n(&done, 1, __ATOMIC_ACQ_REL))
        return;
    const char *v = getenv("XFER_KERNELS_VARIANT"), *c = getenv("XFER_KERNELS_CHUNK");
    if ((v || c) && !tune_variant && !tune_chunk)
        xfer_kernels_tune(c ? strtoull(c, NULL, 0) : 0, 0, v ? atoi(v) : 0);
}

struct kgrid kgrid_pick(uint64_t total, int sms, int cc_major, bool aligned)
{
    tune_env();
    struct kgrid g;
    g.variant = tune_variant ? tune_variant : (aligned && cc_major >= 9 ? KAUTO_ALIGNED : KAUTO);
    if (KBULKV(g.variant) && (!aligned || cc_major < 9))
        g.variant = KAUTO; /* bulk copies need 16-byte alignment and sm_90 */
    g.threads = tune_threads ? tune_threads : (KBULKV(g.variant) ? KBULK_THREADS : 256);
    if (KBULKV(g.variant) && g.threads < 64)
        g.threads = 64; /* warp 0 drives the bulk engine, the rest copy fringes */
    g.chunk = tune_chunk;
    if (!g.chunk) {
        /* 64 KiB per block measured best on H100 for 64 MiB..1 GiB batches
         * (docs/kernels.md); smaller batches get smaller ranges so that
         * every SM still has about two blocks. */
        const uint64_t unit = 4096, best = 65536;
        uint64_t want = total / ((uint64_t)(sms > 0 ? sms : 1) * 2);
        g.chunk = (want + unit - 1) / unit * unit;
        if (g.chunk < unit)
            g.chunk = unit;
        if (g.chunk > best)
            g.chunk = best;
    }
    return g;
}

/* Block runs on the bulk engine: at most KBLOCK_CHUNK bytes per thread
 * block. The KV pool request of issue 16 (16 KiB blocks, 512 MiB) gained
 * steadily with smaller ranges, 0.892 of one copy at 256 KiB, 0.904 at
 * 128, 0.912 at 64 (the default before), 0.915 at 32, 0.924 at 16 (one
 * H200, 2026-11-29, docs/kernels.md); a 16 KiB thread block copies one
 * such block, and its slot is free again as soon as its one store is. */
#define KBLOCK_CHUNK 16384

struct kgrid kgrid_pick_blocks(uint64_t total, int sms, int cc_major, bool aligned)
{
    struct kgrid g = kgrid_pick(total, sms, cc_major, aligned);
    if (!tune_chunk && KBULKV(g.variant) && g.chunk > KBLOCK_CHUNK)
        g.chunk = KBLOCK_CHUNK;
    return g;
}

unsigned kgrid_blocks(uint64_t total, struct kgrid g)
{
    return (unsigned)((total + g.chunk - 1) / g.chunk);
}

bool kpeer_reach(int dev, int peer, uint64_t *on, uint64_t *bad)
{
    if (peer == dev)
        return true;
    if (peer < 0 || peer >= 64)
        return false;
    uint64_t bit = 1ull << peer;
    if (*on & bit)
        return true;
    if (*bad & bit)
        return false;
    int can = 0;
    if (cudaDeviceCanAccessPeer(&can, dev, peer) == cudaSuccess && can) {
        cudaError_t e = cudaDeviceEnablePeerAccess(peer, 0);
        (void)cudaGetLastError(); /* AlreadyEnabled is sticky until read */
        if (e == cudaSuccess || e == cudaErrorPeerAccessAlreadyEnabled) {
            *on |= bit;
            return true;
        }
    }
    (void)cudaGetLastError();
    *bad |= bit;
    return false;
}

#define KBULK_SMEM (128 + KBULK_STAGES * KBULK_SUB)

/* The bulk kernels need more than the default 48 KiB of dynamic shared
 * memory; the attribute is per function and device, set on first use. */
template <class K> static cudaError_t bulk_smem(K *kernel, int *done)
{
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess && dev < 64 && !done[dev]) {
        e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, KBULK_SMEM);
        if (e == cudaSuccess)
            done[dev] = 1;
    }
    return e;
}

/* One launch of kernel (variant V) over `blocks` thread blocks; the bulk
 * variant first gets its shared memory (smem_set: per device, done). */
template <int V, class K, class... A>
static cudaError_t klaunch_one(K *kernel, int *smem_set, unsigned blocks, struct kgrid g,
                               cudaStream_t st, A... args)
{
    if (KBULKV(V)) {
        cudaError_t e = bulk_smem(kernel, smem_set);
        if (e != cudaSuccess)
            return e;
    }
    kernel<<<blocks, g.threads, KBULKV(V) ? KBULK_SMEM : 0, st>>>(args...);
    return cudaGetLastError();
}

/* What every launch shares: nothing for 0 bytes, the grid's size check,
 * and the switch from g.variant to the template instance: launch(V) is
 * called with std::integral_constant<int, V>. */
template <class L> static cudaError_t kdispatch(uint64_t total, struct kgrid g, L launch)
{
    if (!total)
        return cudaSuccess;
    if ((total + g.chunk - 1) / g.chunk > 0x7fffffffu)
        return cudaErrorInvalidValue;
    switch (g.variant) {
    case KV_VEC4:
        return launch(std::integral_constant<int, KV_VEC4>());
    case KV_VEC8:
        return launch(std::integral_constant<int, KV_VEC8>());
    case KV_VEC4S:
        return launch(std::integral_constant<int, KV_VEC4S>());
    case KV_VEC8S:
        return launch(std::integral_constant<int, KV_VEC8S>());
    case KV_BULK:
        return launch(std::integral_constant<int, KV_BULK>());
    default:
        return cudaErrorInvalidValue;
    }
}

/* per variant and device: the bulk attribute set (each variant is a function of its own) */
static int copy_smem_set[KV_NVARIANTS][64], kv_smem_set[KV_NVARIANTS][64],
    blk_smem_set[KV_NVARIANTS][64], blkp_smem_set[KV_NVARIANTS][64];

cudaError_t klaunch_batched_copy(const uint64_t *desc, const uint64_t *start, const uint32_t *first,
                                 uint32_t n, uint64_t total, struct kgrid g, cudaStream_t st)
{
    unsigned blocks = kgrid_blocks(total, g);
    return kdispatch(total, g, [&](auto v) {
        constexpr int V = decltype(v)::value;
        return klaunch_one<V>(batched_copy_kernel<V>, copy_smem_set[V], blocks, g, st, desc, start,
                              first, n, total, g.chunk);
    });
}

cudaError_t klaunch_kv(const uint64_t *layer_base, const uint64_t *ids, uint64_t n_ids,
                       uint32_t layers, uint64_t block_bytes, uint64_t block_stride, char *buf,
                       int scatter, struct kgrid g, cudaStream_t st)
{
    uint64_t total = (uint64_t)layers * n_ids * block_bytes;
    unsigned blocks = kgrid_blocks(total, g);
    return kdispatch(total, g, [&](auto v) {
        constexpr int V = decltype(v)::value;
        return klaunch_one<V>(kv_kernel<V>, kv_smem_set[V], blocks, g, st, layer_base, ids, n_ids,
                              block_bytes, block_stride, buf, total, g.chunk, scatter);
    });
}

cudaError_t klaunch_block_runs(const struct kbrun *runs, const uint64_t *start, uint32_t nr,
                               uint64_t total, struct kgrid g, cudaStream_t st)
{
    return kdispatch(total, g, [&](auto v) {
        constexpr int V = decltype(v)::value;
        unsigned blocks = kgrid_blocks(total, g);
        return klaunch_one<V>(block_runs_kernel<V>, blk_smem_set[V], blocks, g, st, runs, start, nr,
                              total, g.chunk);
    });
}

cudaError_t klaunch_block_runs_param(const struct kparam_blob *p, struct kgrid g, cudaStream_t st)
{
    return kdispatch(p->total, g, [&](auto v) {
        constexpr int V = decltype(v)::value;
        unsigned blocks = kgrid_blocks(p->total, g);
        return klaunch_one<V>(block_runs_param_kernel<V>, blkp_smem_set[V], blocks, g, st, *p);
    });
}

/* Loading a kernel: asking for its attributes makes CUDA load it. */
template <class K> static cudaError_t kfunc_load(K *kernel)
{
    struct cudaFuncAttributes a;
    return cudaFuncGetAttributes(&a, kernel);
}

extern "C" int xfer_kernels_preload(int device)
{
    int n = 0, saved = -1;
    if (xfer_kernels_probe(&n) || device < 0 || device >= n)
        return -XFER_ENODEV;
    cudaGetDevice(&saved);
    cudaError_t e = cudaSetDevice(device);
    cudaError_t (*const loads[])() = {
        [] { return kfunc_load(batched_copy_kernel<KV_VEC4>); },
        [] { return kfunc_load(batched_copy_kernel<KV_VEC8>); },
        [] { return kfunc_load(batched_copy_kernel<KV_VEC4S>); },
        [] { return kfunc_load(batched_copy_kernel<KV_VEC8S>); },
        [] { return kfunc_load(batched_copy_kernel<KV_BULK>); },
        [] { return kfunc_load(kv_kernel<KV_VEC4>); },
        [] { return kfunc_load(kv_kernel<KV_VEC8>); },
        [] { return kfunc_load(kv_kernel<KV_VEC4S>); },
        [] { return kfunc_load(kv_kernel<KV_VEC8S>); },
        [] { return kfunc_load(kv_kernel<KV_BULK>); },
        [] { return kfunc_load(block_runs_kernel<KV_VEC4>); },
        [] { return kfunc_load(block_runs_kernel<KV_VEC8>); },
        [] { return kfunc_load(block_runs_kernel<KV_VEC4S>); },
        [] { return kfunc_load(block_runs_kernel<KV_VEC8S>); },
        [] { return kfunc_load(block_runs_kernel<KV_BULK>); },
        [] { return kfunc_load(block_runs_param_kernel<KV_VEC4>); },
        [] { return kfunc_load(block_runs_param_kernel<KV_VEC8>); },
        [] { return kfunc_load(block_runs_param_kernel<KV_VEC4S>); },
        [] { return kfunc_load(block_runs_param_kernel<KV_VEC8S>); },
        [] { return kfunc_load(block_runs_param_kernel<KV_BULK>); },
        kunpack_preload, /* tcpx's receive unpack (kunpack.cu) */
    };
    for (size_t i = 0; e == cudaSuccess && i < sizeof(loads) / sizeof(loads[0]); i++)
        e = loads[i]();
    int major = 0;
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    if (e == cudaSuccess && major >= 9) /* the bulk variants' shared memory attribute */
        e = bulk_smem(batched_copy_kernel<KV_BULK>, copy_smem_set[KV_BULK]);
    if (e == cudaSuccess && major >= 9)
        e = bulk_smem(kv_kernel<KV_BULK>, kv_smem_set[KV_BULK]);
    if (e == cudaSuccess && major >= 9)
        e = bulk_smem(block_runs_kernel<KV_BULK>, blk_smem_set[KV_BULK]);
    if (e == cudaSuccess && major >= 9)
        e = bulk_smem(block_runs_param_kernel<KV_BULK>, blkp_smem_set[KV_BULK]);
    if (e != cudaSuccess)
        (void)cudaGetLastError();
    if (saved >= 0)
        cudaSetDevice(saved);
    return e == cudaSuccess ? 0 : -XFER_EIO;
}
