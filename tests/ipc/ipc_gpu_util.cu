// GPU helpers of the ipc tests: fill and checksum on the device (the same
// formulas as ipc_fill_host / ipc_sum_host), cudaMalloc or cuMem allocations
// with a POSIX-fd handle type, and the cudaMemcpyPeerAsync baseline.
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

extern "C" {
#include "ipc_test.h"
}

__global__ void fill_kernel(uint8_t *p, size_t len, uint64_t seed)
{
    size_t words = (len + 7) / 8;
    for (size_t w = blockIdx.x * (size_t)blockDim.x + threadIdx.x; w < words;
         w += (size_t)gridDim.x * blockDim.x) {
        uint64_t z = seed + (w + 1) * 0x9E3779B97F4A7C15ull;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        for (int k = 0; k < 8 && w * 8 + k < len; k++)
            p[w * 8 + k] = (uint8_t)(z >> (8 * k));
    }
}

__global__ void sum_kernel(const uint8_t *p, size_t len, unsigned long long *out)
{
    unsigned long long s = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < len;
         i += (size_t)gridDim.x * blockDim.x)
        s += p[i] * (i * 0x9E3779B97F4A7C15ull + 1);
    atomicAdd(out, s);
}

static int ok(cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return 0;
    fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    return -1;
}

extern "C" int ipc_gpu_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

extern "C" int ipc_gpu_can_peer(int a, int b)
{
    int can = 0;
    cudaDeviceCanAccessPeer(&can, a, b);
    return can;
}

extern "C" int ipc_gpu_fill(int dev, void *p, size_t len, uint64_t seed)
{
    cudaSetDevice(dev);
    fill_kernel<<<1024, 256>>>((uint8_t *)p, len, seed);
    return ok(cudaDeviceSynchronize(), "fill");
}

extern "C" int ipc_gpu_sum(int dev, const void *p, size_t len, uint64_t *out)
{
    cudaSetDevice(dev);
    unsigned long long *d = NULL, h = 0;
    if (ok(cudaMalloc(&d, sizeof(*d)), "sum alloc"))
        return -1;
    cudaMemset(d, 0, sizeof(*d));
    if (len)
        sum_kernel<<<1024, 256>>>((const uint8_t *)p, len, d);
    int rc = ok(cudaMemcpy(&h, d, sizeof(h), cudaMemcpyDeviceToHost), "sum");
    cudaFree(d);
    *out = h;
    return rc;
}

static void *sym(const char *name)
{
    void *fn = NULL;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q) != cudaSuccess)
        return NULL;
    return q == cudaDriverEntryPointSuccess ? fn : NULL;
}

static size_t cumem_size(int dev, size_t len, CUmemAllocationProp *prop)
{
    static auto gran =
        (decltype(&cuMemGetAllocationGranularity))sym("cuMemGetAllocationGranularity");
    memset(prop, 0, sizeof(*prop));
    prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop->location.id = dev;
    prop->requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    size_t g = 0;
    if (!gran || gran(&g, prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS || !g)
        return 0;
    return (len + g - 1) / g * g;
}

extern "C" int ipc_gpu_alloc(int dev, size_t len, bool cumem, void **out)
{
    if (dev >= ipc_gpu_count())
        return -1;
    cudaSetDevice(dev);
    if (!cumem)
        return ok(cudaMalloc(out, len), "cudaMalloc");
    auto create = (decltype(&cuMemCreate))sym("cuMemCreate");
    auto reserve = (decltype(&cuMemAddressReserve))sym("cuMemAddressReserve");
    auto map = (decltype(&cuMemMap))sym("cuMemMap");
    auto access = (decltype(&cuMemSetAccess))sym("cuMemSetAccess");
    CUmemAllocationProp prop;
    size_t size = cumem_size(dev, len, &prop);
    CUmemGenericAllocationHandle h;
    CUdeviceptr va;
    CUmemAccessDesc acc = {};
    acc.location = prop.location;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (!size || !create || !reserve || !map || !access || create(&h, size, &prop, 0) ||
        reserve(&va, size, 0, 0, 0) || map(va, size, 0, h, 0) || access(va, size, &acc, 1)) {
        fprintf(stderr, "cuMem allocation of %zu bytes on cuda:%d failed\n", len, dev);
        return -1;
    }
    *out = (void *)va;
    return 0;
}

extern "C" void ipc_gpu_free(int dev, void *p, bool cumem, size_t len)
{
    cudaSetDevice(dev);
    if (!cumem) {
        cudaFree(p);
        return;
    }
    auto retain = (decltype(&cuMemRetainAllocationHandle))sym("cuMemRetainAllocationHandle");
    auto release = (decltype(&cuMemRelease))sym("cuMemRelease");
    auto unmap = (decltype(&cuMemUnmap))sym("cuMemUnmap");
    auto addr_free = (decltype(&cuMemAddressFree))sym("cuMemAddressFree");
    CUmemAllocationProp prop;
    size_t size = cumem_size(dev, len, &prop);
    CUmemGenericAllocationHandle h;
    if (retain && retain(&h, p) == CUDA_SUCCESS) {
        unmap((CUdeviceptr)p, size);
        release(h);
        release(h);
        addr_free((CUdeviceptr)p, size);
    }
}

extern "C" double ipc_gpu_peer_gbps(void *dst, int ddev, const void *src, int sdev, size_t len,
                                    int slots, int reps)
{
    cudaSetDevice(sdev);
    cudaStream_t s;
    cudaEvent_t a, b;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    cudaDeviceEnablePeerAccess(ddev, 0);
    cudaGetLastError();
    cudaMemcpyPeerAsync(dst, ddev, src, sdev, len, s); // warm-up
    cudaEventRecord(a, s);
    for (int i = 0; i < reps; i++) {
        size_t off = (size_t)(i % slots) * len; // slot i % slots, as ipc's items
        cudaMemcpyPeerAsync((char *)dst + off, ddev, (const char *)src + off, sdev, len, s);
    }
    cudaEventRecord(b, s);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    cudaStreamDestroy(s);
    return ms > 0 ? (double)len * reps / (ms * 1e6) : 0;
}
