/* Hopper bulk-copy (TMA, cp.async.bulk) pipeline for one thread: global ->
 * shared -> global in KBULK_STAGES stages of KBULK_SUB bytes, each load
 * completing on an mbarrier, each store a bulk group. Included by kcopy.cu
 * only; compiled for sm_90 and newer (older targets get a trap). */
#ifndef XFER_KBULK_CUH
#define XFER_KBULK_CUH

#include <stdint.h>

#define KBULK_STAGES 3
#define KBULK_SUB    16384 /* 3 x 16 KiB = 48 KiB of shared memory per block */

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define KBULK_OK 1
#else
#define KBULK_OK 0
#endif

__device__ __forceinline__ uint32_t smem_addr(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void mbar_init(uint64_t *bar)
{
#if KBULK_OK
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(bar)) : "memory");
#endif
}

__device__ __forceinline__ void mbar_init_fence(void)
{
#if KBULK_OK
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

__device__ __forceinline__ void bulk_load(void *sdst, const void *gsrc, uint32_t bytes,
                                          uint64_t *bar)
{
#if KBULK_OK
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)),
                 "r"(bytes)
                 : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], "
                 "%2, [%3];" ::"r"(smem_addr(sdst)),
                 "l"(gsrc), "r"(bytes), "r"(smem_addr(bar))
                 : "memory");
#else
    __trap();
#endif
}

__device__ __forceinline__ void mbar_wait(uint64_t *bar, uint32_t parity)
{
#if KBULK_OK
    uint32_t done = 0;
    while (!done)
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; "
                     "selp.u32 %0, 1, 0, p; }"
                     : "=r"(done)
                     : "r"(smem_addr(bar)), "r"(parity)
                     : "memory");
#endif
}

__device__ __forceinline__ void bulk_store(void *gdst, const void *ssrc, uint32_t bytes)
{
#if KBULK_OK
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(gdst),
                 "r"(smem_addr(ssrc)), "r"(bytes)
                 : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
#endif
}

/* All committed stores have finished reading shared memory. */
__device__ __forceinline__ void bulk_wait_read(void)
{
#if KBULK_OK
    asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
#endif
}

/* All committed stores are complete. */
__device__ __forceinline__ void bulk_wait_all(void)
{
#if KBULK_OK
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
#endif
}

/* The 16-byte aligned middle of a piece whose src and dst agree modulo 16;
 * the bytes before and after it are the "fringe" copied by other threads. */
__device__ __forceinline__ bool bulk_body(const char *dst, uint32_t len, uint32_t *head,
                                          uint32_t *body)
{
    uint32_t h = (16u - ((uint32_t)(uintptr_t)dst & 15u)) & 15u;
    if (h >= len)
        return false;
    *head = h;
    *body = (len - h) & ~15u;
    return *body != 0;
}

/* One thread moves the aligned bodies of every piece that walker w yields
 * (pieces with relatively misaligned src/dst are skipped: the fringe threads
 * copy those whole). stage: KBULK_STAGES * KBULK_SUB bytes of shared memory,
 * bar: KBULK_STAGES initialised mbarriers. */
template <class W> __device__ void bulk_pipeline(W w, char *stage, uint64_t *bar)
{
    char *q_dst[KBULK_STAGES];
    uint32_t q_len[KBULK_STAGES];
    uint32_t parity = 0; /* bit s: parity of stage s's next completion */
    uint32_t issued = 0, stored = 0;
    struct kpiece p;
    uint32_t off = 0, head = 0, body = 0;
    bool have = false;
    for (;;) {
        /* refill: keep up to KBULK_STAGES loads in flight */
        while (issued - stored < KBULK_STAGES) {
            while (!have || off >= body) {
                if (!w.next(p)) {
                    have = false;
                    break;
                }
                have = (((uintptr_t)p.dst ^ (uintptr_t)p.src) & 15) == 0 &&
                       bulk_body(p.dst, p.len, &head, &body);
                off = 0;
            }
            if (!have)
                break;
            uint32_t s = issued % KBULK_STAGES, n = min(body - off, (uint32_t)KBULK_SUB);
            if (issued >= KBULK_STAGES)
                bulk_wait_read(); /* the store that used stage s has read it */
#pragma unroll
            for (int i = 0; i < KBULK_STAGES; i++)
                if (i == (int)s)
                    q_dst[i] = p.dst + head + off, q_len[i] = n;
            bulk_load(stage + s * KBULK_SUB, p.src + head + off, n, &bar[s]);
            off += n;
            issued++;
        }
        if (stored == issued)
            break;
        uint32_t s = stored % KBULK_STAGES;
        mbar_wait(&bar[s], (parity >> s) & 1u);
        parity ^= 1u << s;
        char *d = q_dst[0];
        uint32_t n = q_len[0];
#pragma unroll
        for (int i = 1; i < KBULK_STAGES; i++)
            if (i == (int)s)
                d = q_dst[i], n = q_len[i];
        bulk_store(d, stage + s * KBULK_SUB, n);
        stored++;
    }
    bulk_wait_all();
}

#endif
