/*
 * GPU-initiated transfers: the device API. Include from any CUDA kernel
 * (sm_70 or newer, C++17); the ring comes from the host as a
 * struct xfer_ring_dev (engine/xfer_gpu_ring.h: xfer_gpu_ring_device_handle),
 * passed by value as a kernel argument.
 *
 *   xfer_dev_put / xfer_dev_get   one request, from any thread
 *   xfer_dev_put_warp             one request for the whole warp (all 32 lanes
 *                                 call it with the same arguments)
 *   xfer_dev_put_lanes            one request per lane, one reservation per warp
 *   xfer_dev_fence                later requests start after earlier ones finished
 *   xfer_dev_quiet                fence + wait: everything posted before it finished
 *   xfer_dev_wait                 wait for a completion counter to reach a value
 *   xfer_dev_counter, xfer_dev_error   read a counter, the ring's error word
 *
 * Regions are small indices the host gave out (xfer_gpu_ring_add_local,
 * xfer_gpu_ring_add_remote); offsets and lengths are in bytes. Every call
 * returns 0 or a negative XFER_E* code (engine/xfer_err.h): a full ring is
 * waited out up to the ring's timeout (-XFER_ETIMEDOUT), a ring being torn
 * down answers its error word or -XFER_ECANCELED. A put returns once the
 * request is in the ring; its data must stay unchanged until its counter
 * says it finished. The data a thread wrote before its put is ordered by the
 * put itself (release at system scope); data written by other threads must
 * reach the putting thread first (__syncthreads(), __syncwarp()); the
 * _warp variant does the __syncwarp. After a wait, the data of finished GETs
 * may be read (the wait acquires at system scope).
 */
#ifndef XFER_DEV_CUH
#define XFER_DEV_CUH

#include <cuda/atomic>
#include <stdint.h>

#include "xfer_ring.h"

/* ---- the primitives kernels/xfer_ring_proto.h is written over ---------- */
#define XR_FN static __device__ __forceinline__

template <typename T> __device__ __forceinline__ T xr_dev_load_acquire_sys(T *p)
{
    return cuda::atomic_ref<T, cuda::thread_scope_system>(*p).load(cuda::memory_order_acquire);
}

XR_FN uint64_t xr_ld_sys_u64(uint64_t *p)
{
    return xr_dev_load_acquire_sys(p);
}

XR_FN int32_t xr_ld_sys_i32(int32_t *p)
{
    return xr_dev_load_acquire_sys(p);
}

XR_FN void xr_st_sys_u64(uint64_t *p, uint64_t v)
{
    cuda::atomic_ref<uint64_t, cuda::thread_scope_system>(*p).store(v, cuda::memory_order_release);
}

XR_FN uint64_t xr_ld_dev_u64(uint64_t *p)
{
    return cuda::atomic_ref<uint64_t, cuda::thread_scope_device>(*p).load(
        cuda::memory_order_acquire);
}

XR_FN uint64_t xr_cas_dev_u64(uint64_t *p, uint64_t expected, uint64_t desired)
{
    cuda::atomic_ref<uint64_t, cuda::thread_scope_device>(*p).compare_exchange_strong(
        expected, desired, cuda::memory_order_relaxed);
    return expected; /* the value seen: equal to the argument on success */
}

XR_FN void xr_max_dev_u64(uint64_t *p, uint64_t v)
{
    cuda::atomic_ref<uint64_t, cuda::thread_scope_device>(*p).fetch_max(v,
                                                                        cuda::memory_order_release);
}

XR_FN void xr_add_dev_u64(uint64_t *p, uint64_t v)
{
    cuda::atomic_ref<uint64_t, cuda::thread_scope_device>(*p).fetch_add(v,
                                                                        cuda::memory_order_relaxed);
}

XR_FN uint64_t xr_now_ns(void)
{
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

XR_FN void xr_pause(void)
{
    __nanosleep(128);
}

#include "xfer_ring_proto.h"

/* ---- the API ------------------------------------------------------------- */

XR_FN unsigned xfer_dev_lane(void)
{
    unsigned lane;
    asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));
    return lane;
}

/* Any request (op, counter, regions, offsets, length, tag in req). */
XR_FN int xfer_dev_post(const xfer_ring_dev &r, const xfer_ring_slot &req,
                        uint64_t timeout_ns = XFER_RING_TIMEOUT_DEFAULT)
{
    return xfer_ring_post(&r, &req, timeout_ns);
}

XR_FN xfer_ring_slot xfer_dev_req(uint32_t op, uint32_t local, uint64_t local_off, uint32_t remote,
                                  uint64_t remote_off, uint64_t len, uint32_t counter, uint64_t tag)
{
    xfer_ring_slot q = {0, op, counter, local, remote, local_off, remote_off, len, tag, 0};
    return q;
}

/* Writes [local_off, +len) of local region `local` to [remote_off, +len) of
 * remote `remote`; counter (or XFER_RING_NO_COUNTER) counts it when it
 * finished; tag comes back with a failure report. */
XR_FN int xfer_dev_put(const xfer_ring_dev &r, uint32_t local, uint64_t local_off, uint32_t remote,
                       uint64_t remote_off, uint64_t len, uint32_t counter, uint64_t tag = 0)
{
    xfer_ring_slot q =
        xfer_dev_req(XFER_RING_OP_PUT, local, local_off, remote, remote_off, len, counter, tag);
    return xfer_ring_post(&r, &q, XFER_RING_TIMEOUT_DEFAULT);
}

/* Reads [remote_off, +len) of remote `remote` into local region `local`. */
XR_FN int xfer_dev_get(const xfer_ring_dev &r, uint32_t local, uint64_t local_off, uint32_t remote,
                       uint64_t remote_off, uint64_t len, uint32_t counter, uint64_t tag = 0)
{
    xfer_ring_slot q =
        xfer_dev_req(XFER_RING_OP_GET, local, local_off, remote, remote_off, len, counter, tag);
    return xfer_ring_post(&r, &q, XFER_RING_TIMEOUT_DEFAULT);
}

/* Warp-collective put: all 32 lanes call it with the same arguments; the
 * lanes' earlier writes are made visible to lane 0, which posts one request.
 * Every lane gets the result. */
XR_FN int xfer_dev_put_warp(const xfer_ring_dev &r, uint32_t local, uint64_t local_off,
                            uint32_t remote, uint64_t remote_off, uint64_t len, uint32_t counter,
                            uint64_t tag = 0)
{
    __syncwarp();
    int rc = 0;
    if (xfer_dev_lane() == 0)
        rc = xfer_dev_put(r, local, local_off, remote, remote_off, len, counter, tag);
    return __shfl_sync(0xffffffffu, rc, 0);
}

/* Every lane of the warp (all 32 call it) posts its own request, with its
 * own arguments, through one reservation of 32 tickets. Falls back to one
 * reservation per lane on rings smaller than a warp. */
XR_FN int xfer_dev_put_lanes(const xfer_ring_dev &r, uint32_t local, uint64_t local_off,
                             uint32_t remote, uint64_t remote_off, uint64_t len, uint32_t counter,
                             uint64_t tag = 0)
{
    xfer_ring_slot q =
        xfer_dev_req(XFER_RING_OP_PUT, local, local_off, remote, remote_off, len, counter, tag);
    if (r.mask + 1 < 32)
        return xfer_ring_post(&r, &q, XFER_RING_TIMEOUT_DEFAULT);
    const unsigned lane = xfer_dev_lane();
    uint64_t first = 0;
    int rc = 0;
    if (lane == 0)
        rc = xfer_ring_reserve(&r, 32, XFER_RING_TIMEOUT_DEFAULT, &first);
    rc = __shfl_sync(0xffffffffu, rc, 0);
    first = __shfl_sync(0xffffffffu, first, 0);
    if (rc == 0)
        xfer_ring_publish(&r, first + lane, &q);
    return rc;
}

/* Requests posted after the fence start only once every request posted
 * before it (by any thread) finished; counter, if given, counts the fence
 * when that happened. */
XR_FN int xfer_dev_fence(const xfer_ring_dev &r, uint32_t counter = XFER_RING_NO_COUNTER)
{
    xfer_ring_slot q = xfer_dev_req(XFER_RING_OP_FENCE, 0, 0, 0, 0, 0, counter, 0);
    return xfer_ring_post(&r, &q, XFER_RING_TIMEOUT_DEFAULT);
}

/* Waits until counter `counter` reached target: 0, or the counter's last
 * error if one of its requests failed, -XFER_ETIMEDOUT past timeout_ns
 * (default: the ring's bound), -XFER_EINPROGRESS for timeout_ns 0 when not
 * reached, the ring's error once it stopped. A flag is a counter waited
 * for at 1. */
XR_FN int xfer_dev_wait(const xfer_ring_dev &r, uint32_t counter, uint64_t target,
                        uint64_t timeout_ns = XFER_RING_TIMEOUT_DEFAULT)
{
    return xfer_ring_wait(&r, counter, target, timeout_ns);
}

/* Fence counted on `counter` (one the caller owns) and wait for it: when it
 * returns 0, every request posted before it finished (each one's own result
 * is on its counter and in the ring's error word). */
XR_FN int xfer_dev_quiet(const xfer_ring_dev &r, uint32_t counter,
                         uint64_t timeout_ns = XFER_RING_TIMEOUT_DEFAULT)
{
    uint64_t base = xfer_ring_counter_done(&r, counter);
    int rc = xfer_dev_fence(r, counter);
    return rc < 0 ? rc : xfer_ring_wait(&r, counter, base + 1, timeout_ns);
}

XR_FN uint64_t xfer_dev_counter(const xfer_ring_dev &r, uint32_t counter)
{
    return xfer_ring_counter_done(&r, counter);
}

/* The ring's error word: first failure of any request (sticky), 0 if none. */
XR_FN int xfer_dev_error(const xfer_ring_dev &r)
{
    return xfer_ring_error(&r);
}

#undef XR_FN
#endif /* XFER_DEV_CUH */
