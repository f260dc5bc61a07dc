/*
 * CUDA memory for the ipc transport.
 *
 * Owner: exports a region's allocation either as a legacy CUDA IPC handle
 * (cudaIpcGetMemHandle, for cudaMalloc memory) or, for allocations made with
 * cuMemCreate, as a POSIX fd (cuMemExportToShareableHandle) passed over the
 * unix socket. Driver API calls are reached with cudaGetDriverEntryPoint so
 * that nothing links libcuda directly.
 *
 * Initiator: opens the owner's allocation on the local ordinal of the same
 * physical GPU (matched by UUID: CUDA_VISIBLE_DEVICES may number devices
 * differently in the two processes), caches it per region and generation
 * (ipc_map.c). Copies run in ipc_cuda_copy.c.
 *
 * Which GPU runs a copy: with one GPU involved, that one. GPU to GPU across
 * devices, by default the GPU holding the peer's memory, in the context where
 * its handle was opened: READ is then a push by the sender, WRITE a pull by
 * the receiver. Measured on 2x H200 (NV18), this beat "always push from the
 * sender" (XFER_IPC_COPY_ON=sender) at every size, by 0.83 -> 0.92 of
 * cudaMemcpyPeerAsync at 16 MiB and 0.28 -> 0.56 at 64 KiB (docs/ipc.md):
 * copies issued from another context than the one that opened the mapping
 * pay for a cross-context peer mapping.
 */
#include "ipc.h"
#include "ipc_cuda.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#if XFER_WITH_CUDA
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <errno.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static struct {
    pthread_once_t once;
    int ndev;
    char why[160];
    uint8_t uuid[IPC_MAX_DEVS][IPC_UUID_LEN];
    /* driver API, NULL when the driver lacks it */
    __typeof__(&cuMemRetainAllocationHandle) retain;
    __typeof__(&cuMemRelease) release;
    __typeof__(&cuMemExportToShareableHandle) export_fd;
    __typeof__(&cuMemImportFromShareableHandle) import_fd;
    __typeof__(&cuMemGetAllocationPropertiesFromHandle) props;
    __typeof__(&cuMemAddressReserve) reserve;
    __typeof__(&cuMemAddressFree) addr_free;
    __typeof__(&cuMemMap) map;
    __typeof__(&cuMemUnmap) unmap;
    __typeof__(&cuMemSetAccess) set_access;
    __typeof__(&cuMemGetAddressRange) addr_range;
} cu = {.once = PTHREAD_ONCE_INIT};

static void *driver_sym(const char *name)
{
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
        return NULL;
    return fn;
}

static void cuda_init(void)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n <= 0) {
        snprintf(cu.why, sizeof(cu.why), "no CUDA device (%s)",
                 e != cudaSuccess ? cudaGetErrorString(e) : "count 0");
        cudaGetLastError();
        return;
    }
    if (n > IPC_MAX_DEVS)
        n = IPC_MAX_DEVS;
    for (int d = 0; d < n; d++) {
        struct cudaDeviceProp p;
        if (cudaGetDeviceProperties(&p, d) == cudaSuccess)
            memcpy(cu.uuid[d], p.uuid.bytes, IPC_UUID_LEN);
    }
    cu.retain = driver_sym("cuMemRetainAllocationHandle");
    cu.release = driver_sym("cuMemRelease");
    cu.export_fd = driver_sym("cuMemExportToShareableHandle");
    cu.import_fd = driver_sym("cuMemImportFromShareableHandle");
    cu.props = driver_sym("cuMemGetAllocationPropertiesFromHandle");
    cu.reserve = driver_sym("cuMemAddressReserve");
    cu.addr_free = driver_sym("cuMemAddressFree");
    cu.map = driver_sym("cuMemMap");
    cu.unmap = driver_sym("cuMemUnmap");
    cu.set_access = driver_sym("cuMemSetAccess");
    cu.addr_range = driver_sym("cuMemGetAddressRange");
    if (!cu.addr_range) {
        snprintf(cu.why, sizeof(cu.why), "CUDA driver lacks cuMemGetAddressRange");
        return;
    }
    cu.ndev = n;
}

int ipc_cuda_probe(char *why, size_t why_len)
{
    pthread_once(&cu.once, cuda_init);
    if (cu.ndev <= 0) {
        snprintf(why, why_len, "%s", cu.why);
        return -XFER_ENODEV;
    }
    return cu.ndev;
}

int ipc_cuda_fail(cudaError_t e, const char *what, char *why, size_t why_len)
{
    snprintf(why, why_len, "%s: %s", what, cudaGetErrorString(e));
    cudaGetLastError(); /* clear the sticky-free error state of this thread */
    return e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver ? -XFER_ENODEV : -XFER_EIO;
}

static void uuid_str(const uint8_t *u, char *out, size_t len)
{
    snprintf(out, len, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13],
             u[14], u[15]);
}

/* ---- owner: export ------------------------------------------------------ */

static int export_cumem(CUmemGenericAllocationHandle h, struct ipc_cuda_export *out, char *why,
                        size_t why_len)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    int rc = 0;
    if (!cu.props || !cu.export_fd || cu.props(&prop, h) != CUDA_SUCCESS) {
        snprintf(why, why_len, "cannot read the cuMem allocation's properties");
        rc = -XFER_EIO;
    } else if (!(prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)) {
        snprintf(why, why_len,
                 "cuMem allocation was created without "
                 "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR; peers cannot open it");
        rc = -XFER_ENOTSUP;
    } else {
        int fd = -1;
        CUresult r = cu.export_fd(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        if (r != CUDA_SUCCESS) {
            snprintf(why, why_len, "cuMemExportToShareableHandle failed (%d)", (int)r);
            rc = -XFER_EIO;
        }
        out->fd = fd;
        out->mech = IPC_MECH_CUMEM;
    }
    cu.release(h); /* drops the reference cuMemRetainAllocationHandle took */
    return rc;
}

int ipc_cuda_export(void *ptr, int dev, const uint8_t *known, struct ipc_cuda_export *out,
                    char *why, size_t why_len)
{
    int n = ipc_cuda_probe(why, why_len);
    if (n < 0)
        return n;
    memset(out, 0, sizeof(*out));
    out->fd = -1;
    struct cudaPointerAttributes a;
    cudaError_t e = cudaPointerGetAttributes(&a, ptr);
    if (e != cudaSuccess || a.type != cudaMemoryTypeDevice) {
        if (e != cudaSuccess)
            cudaGetLastError();
        snprintf(why, why_len, "%p is not live CUDA device memory (freed allocation?)", ptr);
        return -XFER_ESTALE;
    }
    if (a.device != dev)
        xfer_debug("ipc: region registered on cuda:%d lives on cuda:%d", dev, a.device);
    if (a.device < 0 || a.device >= cu.ndev)
        return -XFER_ENODEV;
    /* Driver calls below need a current context on this (server) thread. */
    e = cudaSetDevice(a.device);
    if (e != cudaSuccess)
        return ipc_cuda_fail(e, "cudaSetDevice", why, why_len);
    memcpy(out->uuid, cu.uuid[a.device], IPC_UUID_LEN);
    CUdeviceptr base = 0;
    size_t size = 0;
    if (cu.addr_range(&base, &size, (CUdeviceptr)(uintptr_t)ptr) != CUDA_SUCCESS) {
        snprintf(why, why_len, "cuMemGetAddressRange(%p) failed (freed allocation?)", ptr);
        return -XFER_ESTALE;
    }
    out->alloc_off = (uint64_t)((uintptr_t)ptr - base);
    out->alloc_len = size;
    if (known) { /* adopted from another process's handle: hand that one on */
        memcpy(out->handle, known, IPC_HANDLE_LEN);
        out->mech = IPC_MECH_CUDA;
        return 0;
    }
    CUmemGenericAllocationHandle h;
    if (cu.retain && cu.release && cu.retain(&h, ptr) == CUDA_SUCCESS)
        return export_cumem(h, out, why, why_len);
    cudaGetLastError();
    cudaIpcMemHandle_t ih;
    e = cudaIpcGetMemHandle(&ih, (void *)(uintptr_t)base);
    if (e != cudaSuccess)
        return ipc_cuda_fail(e, "cudaIpcGetMemHandle", why, why_len);
    memcpy(out->handle, &ih, IPC_HANDLE_LEN);
    out->mech = IPC_MECH_CUDA;
    return 0;
}

/* ---- initiator: import -------------------------------------------------- */

/* Legacy handles may be opened once per process: opened ones are shared. */
struct opened_handle {
    uint8_t handle[IPC_HANDLE_LEN];
    void *base;
    int refs;
    struct opened_handle *next;
};
static pthread_mutex_t opened_mu = PTHREAD_MUTEX_INITIALIZER;
static struct opened_handle *opened;

struct ipc_cuda_import {
    uint32_t mech;
    int dev;
    char *ptr; /* region start */
    struct opened_handle *oh;
    CUdeviceptr va; /* cuMem: our reservation */
    size_t va_len;
    CUmemGenericAllocationHandle h;
};

static int local_ordinal(const uint8_t *uuid, char *why, size_t why_len)
{
    for (int d = 0; d < cu.ndev; d++)
        if (memcmp(cu.uuid[d], uuid, IPC_UUID_LEN) == 0)
            return d;
    char s[48];
    uuid_str(uuid, s, sizeof(s));
    snprintf(why, why_len,
             "peer access impossible: owner's %s not visible here "
             "(CUDA_VISIBLE_DEVICES?)",
             s);
    return -XFER_ENODEV;
}

static int open_legacy(struct ipc_cuda_import *imp, const struct ipc_map_resp *m, char *why,
                       size_t why_len)
{
    pthread_mutex_lock(&opened_mu);
    struct opened_handle *oh = opened;
    while (oh && memcmp(oh->handle, m->handle, IPC_HANDLE_LEN) != 0)
        oh = oh->next;
    int rc = 0;
    if (oh) {
        oh->refs++;
    } else if (!(oh = calloc(1, sizeof(*oh)))) {
        rc = -XFER_ENOMEM;
    } else {
        cudaIpcMemHandle_t ih;
        memcpy(&ih, m->handle, IPC_HANDLE_LEN);
        cudaSetDevice(imp->dev);
        cudaError_t e = cudaIpcOpenMemHandle(&oh->base, ih, cudaIpcMemLazyEnablePeerAccess);
        if (e != cudaSuccess) {
            free(oh);
            oh = NULL;
            rc = ipc_cuda_fail(e,
                               "cudaIpcOpenMemHandle (allocation freed by the owner, or peer "
                               "access impossible)",
                               why, why_len);
        } else {
            memcpy(oh->handle, m->handle, IPC_HANDLE_LEN);
            oh->refs = 1;
            oh->next = opened;
            opened = oh;
        }
    }
    pthread_mutex_unlock(&opened_mu);
    if (oh) {
        imp->oh = oh;
        imp->ptr = (char *)oh->base + m->alloc_off;
    }
    return rc;
}

static void close_legacy(struct opened_handle *oh)
{
    pthread_mutex_lock(&opened_mu);
    if (--oh->refs == 0) {
        struct opened_handle **pp = &opened;
        while (*pp != oh)
            pp = &(*pp)->next;
        *pp = oh->next;
        cudaIpcCloseMemHandle(oh->base);
        free(oh);
    }
    pthread_mutex_unlock(&opened_mu);
}

static int open_cumem(struct ipc_cuda_import *imp, const struct ipc_map_resp *m, int fd, char *why,
                      size_t why_len)
{
    if (fd < 0 || !cu.import_fd || !cu.reserve || !cu.map || !cu.set_access) {
        snprintf(why, why_len, "cuMem import impossible (no fd or driver too old)");
        return -XFER_ENOTSUP;
    }
    if (cu.import_fd(&imp->h, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) !=
        CUDA_SUCCESS) {
        snprintf(why, why_len, "cuMemImportFromShareableHandle failed (allocation freed?)");
        return -XFER_EIO;
    }
    imp->va_len = m->alloc_len;
    if (cu.reserve(&imp->va, imp->va_len, 0, 0, 0) != CUDA_SUCCESS) {
        imp->va = 0;
        snprintf(why, why_len, "cuMemAddressReserve(%zu) failed", imp->va_len);
        return -XFER_ENOMEM;
    }
    if (cu.map(imp->va, imp->va_len, 0, imp->h, 0) != CUDA_SUCCESS) {
        cu.addr_free(imp->va, imp->va_len);
        imp->va = 0;
        snprintf(why, why_len, "cuMemMap of the peer's allocation failed");
        return -XFER_EIO;
    }
    /* Readable and writable from its own GPU and every GPU with peer access. */
    CUmemAccessDesc acc[IPC_MAX_DEVS];
    int na = 0;
    for (int d = 0; d < cu.ndev; d++) {
        int ok = d == imp->dev;
        if (!ok && cudaDeviceCanAccessPeer(&ok, d, imp->dev) != cudaSuccess)
            ok = 0;
        if (ok)
            acc[na++] =
                (CUmemAccessDesc){.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = d},
                                  .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    }
    if (cu.set_access(imp->va, imp->va_len, acc, (size_t)na) != CUDA_SUCCESS) {
        snprintf(why, why_len, "cuMemSetAccess on the peer's allocation failed");
        return -XFER_EIO;
    }
    imp->ptr = (char *)(uintptr_t)imp->va + m->alloc_off;
    return 0;
}

int ipc_cuda_import(const struct ipc_map_resp *m, int fd, struct ipc_cuda_import **out, char *why,
                    size_t why_len)
{
    int rc = ipc_cuda_probe(why, why_len);
    struct ipc_cuda_import *imp = NULL;
    if (rc >= 0 && !(imp = calloc(1, sizeof(*imp))))
        rc = -XFER_ENOMEM;
    if (rc >= 0) {
        imp->mech = m->mech;
        rc = imp->dev = local_ordinal(m->uuid, why, why_len);
    }
    if (rc >= 0) {
        cudaSetDevice(imp->dev);
        rc = m->mech == IPC_MECH_CUMEM ? open_cumem(imp, m, fd, why, why_len)
                                       : open_legacy(imp, m, why, why_len);
    }
    if (fd >= 0)
        close(fd);
    if (rc < 0) {
        ipc_cuda_import_close(imp);
        return rc;
    }
    *out = imp;
    return 0;
}

void ipc_cuda_import_close(struct ipc_cuda_import *imp)
{
    if (!imp)
        return;
    if (imp->oh)
        close_legacy(imp->oh);
    if (imp->va) {
        cu.unmap(imp->va, imp->va_len);
        cu.addr_free(imp->va, imp->va_len);
    }
    if (imp->h && cu.release)
        cu.release(imp->h);
    free(imp);
}

void *ipc_cuda_import_ptr(const struct ipc_cuda_import *imp)
{
    return imp->ptr;
}
int ipc_cuda_import_device(const struct ipc_cuda_import *imp)
{
    return imp->dev;
}

int xfer_gpus_describe(char *buf, size_t len)
{
    char why[160];
    int n = ipc_cuda_probe(why, sizeof(why));
    if (len)
        buf[0] = 0;
    if (n <= 0)
        return 0;
    size_t off = 0;
    for (int d = 0; d < n; d++) {
        char u[48], pci[32] = "?";
        uuid_str(cu.uuid[d], u, sizeof(u));
        if (cudaDeviceGetPCIBusId(pci, sizeof(pci), d) != cudaSuccess)
            cudaGetLastError();
        int w = snprintf(buf + off, len - off, "%s%d:%s:%s", d ? "," : "", d, u, pci);
        if (w < 0 || (size_t)w >= len - off)
            return -XFER_ENOSPC;
        off += (size_t)w;
    }
    return n;
}

#else /* !XFER_WITH_CUDA: host paths only; every CUDA request says why not. */

static int no_cuda(char *why, size_t why_len)
{
    snprintf(why, why_len, "no CUDA device (built without CUDA)");
    return -XFER_ENODEV;
}

int ipc_cuda_probe(char *why, size_t why_len)
{
    return no_cuda(why, why_len);
}
int ipc_cuda_export(void *ptr, int dev, const uint8_t *known, struct ipc_cuda_export *out,
                    char *why, size_t why_len)
{
    (void)ptr, (void)dev, (void)known, (void)out;
    return no_cuda(why, why_len);
}
int ipc_cuda_import(const struct ipc_map_resp *m, int fd, struct ipc_cuda_import **out, char *why,
                    size_t why_len)
{
    (void)m, (void)out;
    if (fd >= 0)
        close(fd);
    return no_cuda(why, why_len);
}
void ipc_cuda_import_close(struct ipc_cuda_import *imp)
{
    (void)imp;
}
void *ipc_cuda_import_ptr(const struct ipc_cuda_import *imp)
{
    (void)imp;
    return NULL;
}
int ipc_cuda_import_device(const struct ipc_cuda_import *imp)
{
    (void)imp;
    return -1;
}
int xfer_gpus_describe(char *buf, size_t len)
{
    if (len)
        buf[0] = 0;
    return 0;
}
#endif
