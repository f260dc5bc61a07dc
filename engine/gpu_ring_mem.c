/*
 * Memory of a request ring and where its proxy runs.
 *
 * The shared block (slots, header, counters) is anonymous memory placed on
 * the proxy's NUMA node (mbind, preferred) and touched there, then, for a
 * GPU ring, pinned and mapped into the GPU (cudaHostRegister, mapped +
 * portable): producers write it across PCIe/C2C, the proxy reads it from
 * its own node. The producers' state (ticket counter) of a GPU ring is GPU
 * memory, so the reservation atomics never leave the GPU. The GPU's NUMA
 * node comes from sysfs through its PCI bus id; no libnuma. Creating a GPU
 * ring also preloads the engine's copy kernels (xfer_kernels_preload).
 */
#include "gpu_ring.h"

#include <ctype.h>
#include <errno.h>
#include <linux/mempolicy.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#if XFER_WITH_CUDA
#include <cuda_runtime_api.h>

#include "xfer_kernels.h"
#endif

#define RING_MAX_NUMA_NODES 1024

/* ---- NUMA ------------------------------------------------------------------ */

int ring_parse_cpulist(const char *list, void *cpu_set)
{
    cpu_set_t *set = cpu_set;
    CPU_ZERO(set);
    const char *p = list;
    int n = 0;
    while (*p && *p != '\n') {
        char *end;
        long a = strtol(p, &end, 10), b = a;
        if (end == p || a < 0)
            return -XFER_EINVAL;
        p = end;
        if (*p == '-') {
            b = strtol(p + 1, &end, 10);
            if (end == p + 1 || b < a)
                return -XFER_EINVAL;
            p = end;
        }
        for (long c = a; c <= b && c < CPU_SETSIZE; c++, n++)
            CPU_SET((int)c, set);
        if (*p == ',')
            p++;
        else if (*p && *p != '\n')
            return -XFER_EINVAL;
    }
    return n > 0 ? 0 : -XFER_EINVAL;
}

int ring_numa_cpus(int node, void *cpu_set)
{
    char path[96], buf[4096];
    snprintf(path, sizeof(path), "/sys/devices/system/node/node%d/cpulist", node);
    FILE *f = fopen(path, "r");
    if (!f)
        return -XFER_ENOENT;
    bool ok = fgets(buf, sizeof(buf), f) != NULL;
    fclose(f);
    return ok && ring_parse_cpulist(buf, cpu_set) == 0 ? 0 : -XFER_ENOENT;
}

int ring_gpu_numa_node(int device)
{
#if XFER_WITH_CUDA
    char bus[32], path[128];
    if (device < 0 || cudaDeviceGetPCIBusId(bus, sizeof(bus), device) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    for (char *c = bus; *c; c++) /* sysfs names are lower case */
        *c = (char)tolower((unsigned char)*c);
    snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/numa_node", bus);
    FILE *f = fopen(path, "r");
    int node = -1;
    if (f) {
        if (fscanf(f, "%d", &node) != 1)
            node = -1;
        fclose(f);
    }
    return node >= 0 ? node : -1;
#else
    (void)device;
    return -1;
#endif
}

/* Prefers node for the pages of [p, p+len) not touched yet. */
static void prefer_node(void *p, size_t len, int node)
{
    if (node < 0 || node >= RING_MAX_NUMA_NODES)
        return;
    unsigned long mask[RING_MAX_NUMA_NODES / (8 * sizeof(unsigned long))] = {0};
    mask[node / (8 * sizeof(unsigned long))] |= 1ul << (node % (8 * sizeof(unsigned long)));
    if (syscall(SYS_mbind, p, len, MPOL_PREFERRED, mask, RING_MAX_NUMA_NODES, 0) != 0)
        xfer_debug("ring memory: mbind to node %d: %s (left to the kernel)", node, strerror(errno));
}

/* ---- memory ------------------------------------------------------------------ */

#if XFER_WITH_CUDA
static cudaError_t zero_device(void *p, size_t len, const char **what)
{
    cudaStream_t s;
    *what = "cudaStreamCreate";
    cudaError_t ce = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (ce != cudaSuccess)
        return ce;
    *what = "cudaMemsetAsync";
    ce = cudaMemsetAsync(p, 0, len, s);
    if (ce == cudaSuccess)
        ce = cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
    return ce;
}

/* Pins and maps the block into GPU m->device, allocates the producer state
 * there. The caller's current device is restored. */
static int map_into_gpu(struct ring_mem *m, char *why, size_t why_len)
{
    int n = 0, prev = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n <= 0) {
        cudaGetLastError();
        snprintf(why, why_len, "no CUDA device");
        return -XFER_ENODEV;
    }
    if (m->device >= n) {
        snprintf(why, why_len, "no GPU %d here (%d visible)", m->device, n);
        return -XFER_ENODEV;
    }
    cudaGetDevice(&prev);
    const char *what = "cudaSetDevice";
    cudaError_t ce = cudaSetDevice(m->device);
    if (ce == cudaSuccess) {
        what = "cudaHostRegister";
        ce =
            cudaHostRegister(m->block, m->bytes, cudaHostRegisterMapped | cudaHostRegisterPortable);
    }
    if (ce == cudaSuccess) {
        m->registered = true;
        what = "cudaHostGetDevicePointer";
        ce = cudaHostGetDevicePointer(&m->block_dev, m->block, 0);
    }
    if (ce == cudaSuccess) {
        what = "cudaMalloc";
        ce = cudaMalloc(&m->prod, sizeof(struct xfer_ring_prod));
    }
    if (ce == cudaSuccess) /* on a stream of its own: no wait for others' work */
        ce = zero_device(m->prod, sizeof(struct xfer_ring_prod), &what);
    cudaSetDevice(prev);
    /* Kernels will spin on this ring until transports have copied: the
     * transports' own kernels must not be loaded lazily under them. */
    if (ce == cudaSuccess && xfer_kernels_preload(m->device) < 0)
        xfer_warn("gpu ring: preloading the copy kernels on GPU %d failed: a kernel waiting on "
                  "an ipc batched copy could deadlock with CUDA's lazy loading",
                  m->device);
    if (ce != cudaSuccess) {
        snprintf(why, why_len, "%s on GPU %d: %s", what, m->device, cudaGetErrorString(ce));
        cudaGetLastError();
        return -XFER_EIO;
    }
    return 0;
}

static void unmap_from_gpu(struct ring_mem *m)
{
    int prev = 0;
    cudaGetDevice(&prev);
    cudaSetDevice(m->device);
    if (m->prod)
        cudaFree(m->prod);
    if (m->registered)
        cudaHostUnregister(m->block);
    cudaGetLastError();
    cudaSetDevice(prev);
}
#else
static int map_into_gpu(struct ring_mem *m, char *why, size_t why_len)
{
    (void)m;
    snprintf(why, why_len, "built without CUDA");
    return -XFER_ENODEV;
}

static void unmap_from_gpu(struct ring_mem *m)
{
    (void)m;
}
#endif

int ring_mem_alloc(struct ring_mem *m, int device, size_t bytes, int numa_node, char *why,
                   size_t why_len)
{
    memset(m, 0, sizeof(*m));
    m->device = device;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    m->bytes = (bytes + page - 1) / page * page;
    m->block = mmap(NULL, m->bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m->block == MAP_FAILED) {
        m->block = NULL;
        snprintf(why, why_len, "mmap of %zu bytes: %s", m->bytes, strerror(errno));
        return -XFER_ENOMEM;
    }
    prefer_node(m->block, m->bytes, numa_node);
    memset(m->block, 0, m->bytes); /* first touch: pages land on the preferred node */
    int rc;
    if (device < 0) {
        m->block_dev = m->block;
        m->prod = aligned_alloc(128, sizeof(struct xfer_ring_prod));
        rc = m->prod ? 0 : -XFER_ENOMEM;
        if (m->prod)
            memset(m->prod, 0, sizeof(struct xfer_ring_prod));
        else
            snprintf(why, why_len, "out of memory");
    } else {
        rc = map_into_gpu(m, why, why_len);
    }
    if (rc < 0)
        ring_mem_free(m);
    return rc;
}

void ring_mem_free(struct ring_mem *m)
{
    if (m->device >= 0)
        unmap_from_gpu(m);
    else
        free(m->prod);
    if (m->block)
        munmap(m->block, m->bytes);
    memset(m, 0, sizeof(*m));
    m->device = -1;
}
