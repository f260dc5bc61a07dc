// Kernels of the GPU request ring tests and benches: they use the device
// API exactly as an application kernel would (kernels/xfer_dev.cuh).
#include <cuda_runtime.h>
#include <stdio.h>

#include "xfer_dev.cuh"

extern "C" {
#include "gpu_ring_kernels.h"
}

// node_common.h's pattern: 8 bytes per hash at aligned positions.
__device__ __forceinline__ uint64_t gr_mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

__device__ __forceinline__ uint64_t gr_word(uint64_t seed, uint64_t pos)
{
    return gr_mix64(seed ^ (pos >> 3) * 0x100000001b3ull);
}

// The block fills [base, base + len) of buf (len % 8 == 0, base % 8 == 0).
__device__ void gr_fill_block(uint8_t *buf, uint64_t base, uint64_t len, uint64_t seed)
{
    uint64_t *w = (uint64_t *)(buf + base);
    for (uint64_t i = threadIdx.x; i < len / 8; i += blockDim.x)
        w[i] = gr_word(seed, base + i * 8);
}

__device__ void gr_note(int *rc, int v)
{
    if (v < 0)
        atomicCAS(rc, 0, v);
}

__global__ void k_slices(xfer_ring_dev r, uint32_t local, uint32_t remote, uint8_t *buf,
                         uint64_t slice, uint64_t seed, int mode, uint32_t ctr0, int *rc)
{
    const uint64_t base = blockIdx.x * slice;
    const uint32_t ctr = ctr0 + blockIdx.x;
    gr_fill_block(buf, base, slice, seed);
    __syncthreads(); // the block's data, visible to whoever puts it
    uint64_t expect = 1;
    int v = 0;
    if (mode == GR_PUT_BLOCK) {
        if (threadIdx.x == 0)
            v = xfer_dev_put(r, local, base, remote, base, slice, ctr, base);
    } else if (mode == GR_PUT_WARP) {
        const uint64_t warps = blockDim.x / 32, part = slice / warps;
        const uint64_t off = base + (threadIdx.x / 32) * part;
        v = xfer_dev_put_warp(r, local, off, remote, off, part, ctr, off);
        expect = warps;
    } else {
        const uint64_t part = slice / blockDim.x, off = base + threadIdx.x * part;
        v = xfer_dev_put_lanes(r, local, off, remote, off, part, ctr, off);
        expect = blockDim.x;
    }
    gr_note(&rc[blockIdx.x], v);
    __syncthreads();
    if (threadIdx.x == 0)
        gr_note(&rc[blockIdx.x], xfer_dev_wait(r, ctr, expect));
}

__global__ void k_get_check(xfer_ring_dev r, uint32_t local, uint32_t remote, uint8_t *back,
                            uint64_t slice, uint64_t seed, uint32_t ctr0, int *rc,
                            unsigned long long *bad)
{
    const uint64_t base = blockIdx.x * slice;
    __shared__ int ok;
    if (threadIdx.x == 0) {
        int v = xfer_dev_get(r, local, base, remote, base, slice, ctr0 + blockIdx.x, base);
        if (v == 0)
            v = xfer_dev_wait(r, ctr0 + blockIdx.x, 1);
        gr_note(&rc[blockIdx.x], v);
        ok = v == 0;
    }
    __syncthreads(); // thread 0's acquire (the wait) covers the block's reads
    if (!ok)
        return;
    unsigned long long n = 0;
    const uint64_t *w = (const uint64_t *)(back + base);
    for (uint64_t i = threadIdx.x; i < slice / 8; i += blockDim.x)
        n += w[i] != gr_word(seed, base + i * 8);
    if (n)
        atomicAdd(bad, n);
}

__global__ void k_latency(xfer_ring_dev r, uint32_t local, uint32_t remote, uint8_t *buf,
                          uint64_t len, uint32_t ctr, int iters, uint64_t *ns, int *rc)
{
    uint64_t base = xfer_dev_counter(r, ctr);
    for (int i = 0; i < iters; i++) {
        ((volatile uint64_t *)buf)[0] = (uint64_t)i; // fresh data each time
        uint64_t t0 = xr_now_ns();
        int v = xfer_dev_put(r, local, 0, remote, 0, len, ctr, (uint64_t)i);
        if (v == 0)
            v = xfer_dev_wait(r, ctr, base + i + 1);
        ns[i] = xr_now_ns() - t0;
        if (v < 0) {
            *rc = v;
            return;
        }
    }
}

__global__ void k_produce(xfer_ring_dev r, uint32_t local, uint32_t remote, uint8_t *buf,
                          uint64_t len, uint64_t seed, int put, uint32_t ctr, uint64_t target,
                          int *rc)
{
    gr_fill_block(buf, 0, len, seed);
    if (!put)
        return;
    __syncthreads();
    if (threadIdx.x == 0) {
        int v = xfer_dev_put(r, local, 0, remote, 0, len, ctr, 0);
        *rc = v == 0 ? xfer_dev_wait(r, ctr, target) : v;
    }
}

__global__ void k_rate(xfer_ring_dev r, uint32_t local, uint32_t remote, uint64_t len,
                       uint64_t span, int per_thread, int lanes, uint32_t counters, int *rc)
{
    const uint64_t gid = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x;
    const uint32_t ctr = blockIdx.x % counters;
    for (int k = 0; k < per_thread; k++) {
        uint64_t off = ((gid * per_thread + k) * len) % span;
        int v = lanes ? xfer_dev_put_lanes(r, local, off, remote, off, len, ctr, off)
                      : xfer_dev_put(r, local, off, remote, off, len, ctr, off);
        if (v < 0) {
            gr_note(rc, v);
            if (!lanes) // put_lanes: every lane must keep calling
                return;
        }
    }
}

__global__ void k_overlap(xfer_ring_dev r, uint32_t local, uint32_t remote, uint8_t *buf,
                          uint64_t slice, int compute_iters, int put, uint32_t counters, int *rc)
{
    const uint64_t base = blockIdx.x * slice;
    float *f = (float *)(buf + base);
    for (uint64_t i = threadIdx.x; i < slice / sizeof(float); i += blockDim.x) {
        float x = f[i];
        for (int k = 0; k < compute_iters; k++)
            x = x * 0.9999f + 0.5f;
        f[i] = x;
    }
    if (!put)
        return;
    __syncthreads();
    if (threadIdx.x == 0)
        gr_note(rc, xfer_dev_put(r, local, base, remote, base, slice, blockIdx.x % counters, base));
}

__global__ void k_stream(xfer_ring_dev r, uint32_t local, uint32_t remote, int max_rounds,
                         long long *out)
{
    const uint32_t lane = threadIdx.x;
    const uint64_t off = lane * 65536ull;
    const uint64_t base = xfer_dev_counter(r, lane);
    int v = 0, round = 0;
    for (; round < max_rounds && v == 0; round++) {
        v = xfer_dev_put(r, local, off, remote, off, 65536, lane, off);
        if (v == 0)
            v = xfer_dev_wait(r, lane, base + round + 1);
    }
    if (v < 0)
        atomicCAS((unsigned long long *)&out[0], 0ull, (unsigned long long)(long long)v);
    __syncwarp();
    if (lane == 0) {
        out[1] = xfer_dev_error(r);
        out[2] = round;
    }
}

/* Kernels that spin on ring counters share the GPU with the transports'
 * copy kernels (ipc's batched copy needs ~49 KiB of shared memory per block
 * on sm_90). An SM runs blocks of one L1/shared split at a time, so a
 * waiting kernel on every SM, configured for no shared memory, could keep
 * the copy off the GPU until the waits time out (seen with 256 waiting
 * blocks over ipc on an H100; this remedy is not verified on a GPU yet, see
 * docs/gpu_initiated.md): prefer the largest shared-memory split. */
template <class K> static void prefer_shared(K *kernel)
{
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                             cudaSharedmemCarveoutMaxShared) != cudaSuccess)
        (void)cudaGetLastError(); /* a hint: the launch goes on without it */
}

static int launched(const char *what)
{
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess)
        return 0;
    fprintf(stderr, "%s: launch: %s\n", what, cudaGetErrorString(e));
    return -1;
}

extern "C" int gr_launch_slices(const struct xfer_ring_dev *r, uint32_t local, uint32_t remote,
                                uint8_t *buf, uint64_t slice, uint64_t seed, int mode,
                                uint32_t ctr0, int blocks, int threads, int *rc, void *stream)
{
    prefer_shared(k_slices);
    k_slices<<<blocks, threads, 0, (cudaStream_t)stream>>>(*r, local, remote, buf, slice, seed,
                                                           mode, ctr0, rc);
    return launched("slices");
}

extern "C" int gr_launch_get_check(const struct xfer_ring_dev *r, uint32_t local, uint32_t remote,
                                   uint8_t *back, uint64_t slice, uint64_t seed, uint32_t ctr0,
                                   int blocks, int *rc, unsigned long long *bad, void *stream)
{
    prefer_shared(k_get_check);
    k_get_check<<<blocks, 256, 0, (cudaStream_t)stream>>>(*r, local, remote, back, slice, seed,
                                                          ctr0, rc, bad);
    return launched("get_check");
}

extern "C" int gr_launch_latency(const struct xfer_ring_dev *r, uint32_t local, uint32_t remote,
                                 uint8_t *buf, uint64_t len, uint32_t ctr, int iters, uint64_t *ns,
                                 int *rc, void *stream)
{
    prefer_shared(k_latency);
    k_latency<<<1, 1, 0, (cudaStream_t)stream>>>(*r, local, remote, buf, len, ctr, iters, ns, rc);
    return launched("latency");
}

extern "C" int gr_launch_produce(const struct xfer_ring_dev *r, uint32_t local, uint32_t remote,
                                 uint8_t *buf, uint64_t len, uint64_t seed, int put, uint32_t ctr,
                                 uint64_t target, int *rc, void *stream)
{
    prefer_shared(k_produce);
    k_produce<<<1, 1024, 0, (cudaStream_t)stream>>>(*r, local, remote, buf, len, seed, put, ctr,
                                                    target, rc);
    return launched("produce");
}

extern "C" int gr_launch_rate(const struct xfer_ring_dev *r, uint32_t local, uint32_t remote,
                              uint64_t len, uint64_t span, int per_thread, int lanes, int blocks,
                              int threads, uint32_t counters, int *rc, void *stream)
{
    prefer_shared(k_rate);
    k_rate<<<blocks, threads, 0, (cudaStream_t)stream>>>(*r, local, remote, len, span, per_thread,
                                                         lanes, counters, rc);
    return launched("rate");
}

extern "C" int gr_launch_overlap(const struct xfer_ring_dev *r, uint32_t local, uint32_t remote,
                                 uint8_t *buf, uint64_t slice, int compute_iters, int put,
                                 int blocks, uint32_t counters, int *rc, void *stream)
{
    prefer_shared(k_overlap);
    k_overlap<<<blocks, 256, 0, (cudaStream_t)stream>>>(*r, local, remote, buf, slice,
                                                        compute_iters, put, counters, rc);
    return launched("overlap");
}

extern "C" int gr_launch_stream(const struct xfer_ring_dev *r, uint32_t local, uint32_t remote,
                                int max_rounds, long long *out, void *stream)
{
    prefer_shared(k_stream);
    k_stream<<<1, 32, 0, (cudaStream_t)stream>>>(*r, local, remote, max_rounds, out);
    return launched("stream");
}
