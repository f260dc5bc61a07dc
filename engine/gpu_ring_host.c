/*
 * CPU producers of a request ring: kernels/xfer_ring_proto.h compiled as
 * C11 over the GCC __atomic builtins (the C11 memory model on plain
 * objects, as the ring's fields are shared with CUDA code). The same
 * protocol the device header compiles, so the tests that feed a host ring
 * from threads exercise the kernels' ordering and back-pressure logic.
 */
#include "gpu_ring.h"
#include "mono_clock.h"

#include <sched.h>
#include <time.h>

#define XR_FN static inline

XR_FN uint64_t xr_ld_sys_u64(uint64_t *p)
{
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

XR_FN int32_t xr_ld_sys_i32(int32_t *p)
{
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

XR_FN void xr_st_sys_u64(uint64_t *p, uint64_t v)
{
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
}

XR_FN uint64_t xr_ld_dev_u64(uint64_t *p)
{
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

XR_FN uint64_t xr_cas_dev_u64(uint64_t *p, uint64_t expected, uint64_t desired)
{
    __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return expected; /* the value seen: equal to the argument on success */
}

XR_FN void xr_max_dev_u64(uint64_t *p, uint64_t v)
{
    uint64_t cur = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (cur < v &&
           !__atomic_compare_exchange_n(p, &cur, v, true, __ATOMIC_RELEASE, __ATOMIC_RELAXED))
        ;
}

XR_FN void xr_add_dev_u64(uint64_t *p, uint64_t v)
{
    __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}

XR_FN uint64_t xr_now_ns(void)
{
    return (uint64_t)xfer_mono_ns();
}

/* A CPU thread waiting for room yields: the proxy may share its core. */
XR_FN void xr_pause(void)
{
    sched_yield();
}

#include "xfer_ring_proto.h"

int xfer_gpu_ring_host_post(xfer_gpu_ring *r, const struct xfer_ring_slot *req, uint64_t timeout_ns)
{
    if (!r || !req)
        return -XFER_EINVAL;
    if (r->cfg.device >= 0)
        return -XFER_ENOTSUP;
    return xfer_ring_post(&r->host_dev, req, timeout_ns);
}

int xfer_gpu_ring_host_wait(xfer_gpu_ring *r, uint32_t idx, uint64_t target, uint64_t timeout_ns)
{
    if (!r)
        return -XFER_EINVAL;
    return xfer_ring_wait(&r->host_dev, idx, target, timeout_ns);
}
