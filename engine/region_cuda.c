/*
 * CUDA memory handed over by another local process as a CUDA IPC handle
 * (issue 4: a client gives xferd its KV pool). The handle is opened here and
 * kept with the region: an imported allocation cannot be exported again, so
 * the ipc transport publishes the client's handle to same-host peers.
 */
#include "internal.h"

#include <stdio.h>
#include <string.h>

#if XFER_WITH_CUDA
#include <cuda.h>
#include <cuda_runtime_api.h>

/* Size of the allocation the mapping at p belongs to (0 if unknown). */
static size_t alloc_size(void *p)
{
    static __typeof__(&cuMemGetAddressRange) range;
    if (!range) {
        enum cudaDriverEntryPointQueryResult q;
        void *fn = NULL;
        if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault,
                                             &q) != cudaSuccess ||
            q != cudaDriverEntryPointSuccess)
            return 0;
        range = (__typeof__(range))fn;
    }
    CUdeviceptr base = 0;
    size_t size = 0;
    if (range(&base, &size, (CUdeviceptr)(uintptr_t)p) != CUDA_SUCCESS)
        return 0;
    return size - (size_t)((uintptr_t)p - (uintptr_t)base);
}

int xfer_region_adopt_cuda(xfer_engine *e, const char *name, const void *handle, size_t handle_len,
                           int device, uint64_t offset, size_t len, unsigned access,
                           xfer_region **out)
{
    int n = 0;
    if (!e || !handle || handle_len != sizeof(cudaIpcMemHandle_t) || !len)
        return -XFER_EINVAL;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n <= 0) {
        cudaGetLastError();
        xfer_engine_set_error(e, "adopting CUDA memory %s: no CUDA device", name);
        return -XFER_ENODEV;
    }
    if (device < 0 || device >= n) {
        xfer_engine_set_error(e, "adopting CUDA memory %s: no GPU %d here (%d visible)", name,
                              device, n);
        return -XFER_ENODEV;
    }
    cudaIpcMemHandle_t h;
    memcpy(&h, handle, sizeof(h));
    void *base = NULL;
    cudaError_t ce = cudaSetDevice(device);
    if (ce == cudaSuccess)
        ce = cudaIpcOpenMemHandle(&base, h, cudaIpcMemLazyEnablePeerAccess);
    if (ce != cudaSuccess) {
        cudaGetLastError();
        xfer_engine_set_error(e, "adopting CUDA memory %s: cudaIpcOpenMemHandle: %s", name,
                              cudaGetErrorString(ce));
        return -XFER_EINVAL;
    }
    size_t avail = alloc_size(base);
    int rc = 0;
    if (avail && (offset > avail || len > avail - offset)) {
        xfer_engine_set_error(e,
                              "adopting CUDA memory %s: [%llu, +%zu) beyond the %zu-byte "
                              "allocation",
                              name, (unsigned long long)offset, len, avail);
        rc = -XFER_ERANGE;
    }
    xfer_region *r = NULL;
    if (rc == 0)
        rc = xfer_region_register(e, name, (char *)base + offset, len, XFER_MEM_CUDA, device,
                                  access, &r);
    if (rc < 0) {
        cudaIpcCloseMemHandle(base);
        return rc;
    }
    pthread_mutex_lock(&e->regions.mu);
    r->cuda_ipc_base = base;
    memcpy(r->cuda_ipc_handle, handle, sizeof(r->cuda_ipc_handle));
    r->has_cuda_ipc_handle = true;
    pthread_mutex_unlock(&e->regions.mu);
    if (out)
        *out = r;
    return 0;
}

/* The eager bytes of a message received into device memory, copied on the
 * calling thread (the message thread or the RECV's submitter: never a
 * transport's reader, docs/notify.md), which keeps its current device. */
int region_cuda_copy_in(xfer_region *r, uint64_t off, const void *src, size_t len, char *why,
                        size_t why_len)
{
    int prev = -1;
    cudaError_t err = cudaGetDevice(&prev);
    if (err == cudaSuccess && prev != r->device)
        err = cudaSetDevice(r->device);
    if (err == cudaSuccess)
        err = cudaMemcpy(r->ptr + off, src, len, cudaMemcpyDefault);
    if (prev >= 0 && prev != r->device)
        cudaSetDevice(prev);
    if (err == cudaSuccess)
        return 0;
    cudaGetLastError();
    snprintf(why, why_len, "copying %zu message bytes into device memory of region %s: %s", len,
             r->name, cudaGetErrorString(err));
    return err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver ? -XFER_ENODEV
                                                                          : -XFER_EIO;
}

void region_cuda_close(xfer_region *r)
{
    if (!r->cuda_ipc_base)
        return;
    cudaSetDevice(r->device);
    if (cudaIpcCloseMemHandle(r->cuda_ipc_base) != cudaSuccess) {
        cudaGetLastError();
        xfer_warn("region %s: cudaIpcCloseMemHandle failed", r->name);
    }
    r->cuda_ipc_base = NULL;
}

#else

int xfer_region_adopt_cuda(xfer_engine *e, const char *name, const void *handle, size_t handle_len,
                           int device, uint64_t offset, size_t len, unsigned access,
                           xfer_region **out)
{
    (void)handle, (void)handle_len, (void)device, (void)offset, (void)len, (void)access, (void)out;
    if (e)
        xfer_engine_set_error(e, "adopting CUDA memory %s: no CUDA device (built without CUDA)",
                              name);
    return -XFER_ENODEV;
}

int region_cuda_copy_in(xfer_region *r, uint64_t off, const void *src, size_t len, char *why,
                        size_t why_len)
{
    (void)off, (void)src;
    snprintf(why, why_len, "%zu message bytes for device memory of region %s: built without CUDA",
             len, r->name);
    return -XFER_ENODEV;
}

void region_cuda_close(xfer_region *r)
{
    (void)r;
}
#endif

const uint8_t *xfer_region_cuda_ipc_handle(const xfer_region *r)
{
    return r && r->has_cuda_ipc_handle ? r->cuda_ipc_handle : NULL;
}
