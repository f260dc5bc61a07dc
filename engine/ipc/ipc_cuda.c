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
 * (ipc_map.c), and runs copies on dedicated non-blocking streams (4 per GPU,
 * XFER_IPC_STREAMS), each followed by an event; a group of items is started
 * at once and completed through a stream host function (no polling).
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

#define IPC_STREAMS_PER_DEV 8
#define IPC_MAX_DEVS        64

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

static int cuda_fail(cudaError_t e, const char *what, char *why, size_t why_len)
{
    snprintf(why, why_len, "%s: %s", what, cudaGetErrorString(e));
    cudaGetLastError(); /* clear the sticky-free error state of this thread */
    return e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver ? -XFER_ENODEV : -XFER_EIO;
}

static void uuid_str(const uint8_t *u, char *out, size_t len)
{
    snprintf(out, len, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12],
             u[13], u[14], u[15]);
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
        snprintf(why, why_len, "cuMem allocation was created without "
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

int ipc_cuda_export(void *ptr, int dev, struct ipc_cuda_export *out, char *why, size_t why_len)
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
        return cuda_fail(e, "cudaSetDevice", why, why_len);
    memcpy(out->uuid, cu.uuid[a.device], IPC_UUID_LEN);
    CUdeviceptr base = 0;
    size_t size = 0;
    if (cu.addr_range(&base, &size, (CUdeviceptr)(uintptr_t)ptr) != CUDA_SUCCESS) {
        snprintf(why, why_len, "cuMemGetAddressRange(%p) failed (freed allocation?)", ptr);
        return -XFER_ESTALE;
    }
    out->alloc_off = (uint64_t)((uintptr_t)ptr - base);
    out->alloc_len = size;
    CUmemGenericAllocationHandle h;
    if (cu.retain && cu.release && cu.retain(&h, ptr) == CUDA_SUCCESS)
        return export_cumem(h, out, why, why_len);
    cudaGetLastError();
    cudaIpcMemHandle_t ih;
    e = cudaIpcGetMemHandle(&ih, (void *)(uintptr_t)base);
    if (e != cudaSuccess)
        return cuda_fail(e, "cudaIpcGetMemHandle", why, why_len);
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
    snprintf(why, why_len, "peer access impossible: owner's %s not visible here "
             "(CUDA_VISIBLE_DEVICES?)", s);
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
            rc = cuda_fail(e, "cudaIpcOpenMemHandle (allocation freed by the owner, or peer "
                           "access impossible)", why, why_len);
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

static int open_cumem(struct ipc_cuda_import *imp, const struct ipc_map_resp *m, int fd,
                      char *why, size_t why_len)
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
            acc[na++] = (CUmemAccessDesc){.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = d},
                                          .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    }
    if (cu.set_access(imp->va, imp->va_len, acc, (size_t)na) != CUDA_SUCCESS) {
        snprintf(why, why_len, "cuMemSetAccess on the peer's allocation failed");
        return -XFER_EIO;
    }
    imp->ptr = (char *)(uintptr_t)imp->va + m->alloc_off;
    return 0;
}

int ipc_cuda_import(const struct ipc_map_resp *m, int fd, struct ipc_cuda_import **out,
                    char *why, size_t why_len)
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

void *ipc_cuda_import_ptr(const struct ipc_cuda_import *imp) { return imp->ptr; }
int ipc_cuda_import_device(const struct ipc_cuda_import *imp) { return imp->dev; }

/* ---- copies ------------------------------------------------------------- */

struct ipc_cuda_copier {
    cudaStream_t streams[IPC_MAX_DEVS][IPC_STREAMS_PER_DEV];
    bool dirty[IPC_MAX_DEVS][IPC_STREAMS_PER_DEV]; /* copies since the last flush */
    unsigned next[IPC_MAX_DEVS];
    unsigned char peer_on[IPC_MAX_DEVS][IPC_MAX_DEVS];
    cudaEvent_t *ev; /* ticket -> event */
    int *ev_dev;
    bool *used;
    int nev;
    int *free_tickets[IPC_MAX_DEVS]; /* per-device stacks of unused tickets */
    int nfree[IPC_MAX_DEVS];
    int nstreams;       /* per device, XFER_IPC_STREAMS (default 4) */
    bool copy_on_owner; /* run D2D on the remote memory's GPU (XFER_IPC_COPY_ON=sender: no) */
    /* Marks complete through stream host functions; waits use a timeout. */
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

struct ipc_cuda_mark {
    struct ipc_cuda_copier *c;
    int left;       /* host functions not yet run */
    bool abandoned; /* the waiter gave up: the last host function frees it */
    bool failed;
};

struct ipc_cuda_copier *ipc_cuda_copier_new(int *err)
{
    char why[160];
    int n = ipc_cuda_probe(why, sizeof(why));
    struct ipc_cuda_copier *c = n > 0 ? calloc(1, sizeof(*c)) : NULL;
    if (!c) {
        *err = n > 0 ? -XFER_ENOMEM : n;
        return NULL;
    }
    const char *ns = getenv("XFER_IPC_STREAMS"), *on = getenv("XFER_IPC_COPY_ON");
    c->nstreams = ns ? atoi(ns) : 4;
    if (c->nstreams < 1 || c->nstreams > IPC_STREAMS_PER_DEV)
        c->nstreams = IPC_STREAMS_PER_DEV;
    c->copy_on_owner = !(on && !strcmp(on, "sender"));
    pthread_mutex_init(&c->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&c->cv, &ca);
    pthread_condattr_destroy(&ca);
    return c;
}

void ipc_cuda_copier_free(struct ipc_cuda_copier *c)
{
    if (!c)
        return;
    for (int d = 0; d < IPC_MAX_DEVS; d++)
        for (int s = 0; s < IPC_STREAMS_PER_DEV; s++)
            if (c->streams[d][s]) {
                cudaSetDevice(d);
                cudaStreamSynchronize(c->streams[d][s]);
                cudaStreamDestroy(c->streams[d][s]);
            }
    for (int i = 0; i < c->nev; i++)
        if (c->ev[i]) {
            cudaSetDevice(c->ev_dev[i]);
            cudaEventDestroy(c->ev[i]);
        }
    free(c->ev);
    free(c->ev_dev);
    free(c->used);
    for (int d = 0; d < IPC_MAX_DEVS; d++)
        free(c->free_tickets[d]);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static cudaStream_t stream_for(struct ipc_cuda_copier *c, int dev)
{
    unsigned k = c->next[dev]++ % (unsigned)c->nstreams;
    if (!c->streams[dev][k] &&
        cudaStreamCreateWithFlags(&c->streams[dev][k], cudaStreamNonBlocking) != cudaSuccess)
        return NULL;
    c->dirty[dev][k] = true;
    return c->streams[dev][k];
}

/* A free ticket with an event created on dev, or a negative code. */
static int ticket_get(struct ipc_cuda_copier *c, int dev)
{
    if (c->nfree[dev] > 0) {
        int t = c->free_tickets[dev][--c->nfree[dev]];
        c->used[t] = true;
        return t;
    }
    int n = c->nev + 1;
    cudaEvent_t *ev = realloc(c->ev, (size_t)n * sizeof(*ev));
    if (ev)
        c->ev = ev;
    int *ed = realloc(c->ev_dev, (size_t)n * sizeof(*ed));
    if (ed)
        c->ev_dev = ed;
    bool *u = realloc(c->used, (size_t)n * sizeof(*u));
    if (u)
        c->used = u;
    /* Room to hand every ticket of dev back. */
    int *f = realloc(c->free_tickets[dev], (size_t)n * sizeof(*f));
    if (f)
        c->free_tickets[dev] = f;
    if (!ev || !ed || !u || !f)
        return -XFER_ENOMEM;
    if (cudaEventCreateWithFlags(&c->ev[c->nev], cudaEventDisableTiming) != cudaSuccess)
        return -XFER_EIO;
    c->ev_dev[c->nev] = dev;
    c->used[c->nev] = true;
    return c->nev++;
}

static void ticket_put(struct ipc_cuda_copier *c, int t)
{
    c->used[t] = false;
    c->free_tickets[c->ev_dev[t]][c->nfree[c->ev_dev[t]]++] = t;
}

static void CUDART_CB host_fired(void *arg)
{
    struct ipc_cuda_mark *m = arg;
    struct ipc_cuda_copier *c = m->c;
    pthread_mutex_lock(&c->mu);
    bool gone = --m->left == 0 && m->abandoned;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (gone)
        free(m);
}

/* One host function per stream used since the last mark: the mark completes
 * when every copy started before it has finished, and its waiter sleeps on a
 * condition variable instead of polling events (polling sleeps overshoot by
 * tens of microseconds, which shows at NVLink speeds). */
struct ipc_cuda_mark *ipc_cuda_mark_new(struct ipc_cuda_copier *c, int *err)
{
    struct ipc_cuda_mark *m = calloc(1, sizeof(*m));
    if (!m) {
        *err = -XFER_ENOMEM;
        return NULL;
    }
    m->c = c;
    for (int d = 0; d < IPC_MAX_DEVS; d++)
        for (int k = 0; k < IPC_STREAMS_PER_DEV; k++) {
            if (!c->dirty[d][k])
                continue;
            c->dirty[d][k] = false;
            cudaSetDevice(d);
            pthread_mutex_lock(&c->mu);
            m->left++;
            pthread_mutex_unlock(&c->mu);
            if (cudaLaunchHostFunc(c->streams[d][k], host_fired, m) != cudaSuccess) {
                cudaGetLastError();
                pthread_mutex_lock(&c->mu);
                m->left--;
                m->failed = true;
                pthread_mutex_unlock(&c->mu);
            }
        }
    return m;
}

int ipc_cuda_mark_wait(struct ipc_cuda_mark *m, int timeout_ms, char *why, size_t why_len)
{
    struct ipc_cuda_copier *c = m->c;
    struct timespec end;
    clock_gettime(CLOCK_MONOTONIC, &end);
    end.tv_sec += timeout_ms / 1000;
    end.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (end.tv_nsec >= 1000000000L) {
        end.tv_sec++;
        end.tv_nsec -= 1000000000L;
    }
    int rc = 0;
    pthread_mutex_lock(&c->mu);
    while (rc == 0 && m->left > 0)
        rc = pthread_cond_timedwait(&c->cv, &c->mu, &end);
    bool done = m->left == 0, failed = m->failed;
    if (!done)
        m->abandoned = true;
    pthread_mutex_unlock(&c->mu);
    if (done)
        free(m);
    if (!done) {
        snprintf(why, why_len, "CUDA copies not finished after %d ms", timeout_ms);
        return -XFER_ETIMEDOUT;
    }
    if (failed) {
        snprintf(why, why_len, "cudaLaunchHostFunc failed; copies waited for one by one");
        return -XFER_EIO;
    }
    return 0;
}

int ipc_cuda_copy_start(struct ipc_cuda_copier *c, void *dst, int dst_dev, const void *src,
                        int src_dev, int remote_dev, size_t len, char *why, size_t why_len)
{
    int exec = src_dev >= 0 ? src_dev : dst_dev; /* the only GPU, or push from the sender */
    if (c->copy_on_owner && src_dev >= 0 && dst_dev >= 0 && remote_dev >= 0)
        exec = remote_dev; /* default: the GPU (and context) holding the peer's memory */
    if (exec < 0 || exec >= cu.ndev) {
        snprintf(why, why_len, "no GPU side in a CUDA copy");
        return -XFER_EINVAL;
    }
    cudaError_t e = cudaSetDevice(exec);
    int other = exec == src_dev ? dst_dev : src_dev;
    if (e == cudaSuccess && other >= 0 && other != exec && !c->peer_on[exec][other]) {
        int can = 0;
        cudaDeviceCanAccessPeer(&can, exec, other);
        if (can) {
            e = cudaDeviceEnablePeerAccess(other, 0);
            if (e == cudaErrorPeerAccessAlreadyEnabled)
                e = cudaSuccess;
            cudaGetLastError();
        }
        c->peer_on[exec][other] = 1; /* without P2P, cudaMemcpyPeerAsync stages */
    }
    if (e != cudaSuccess)
        return cuda_fail(e, "selecting the copy GPU", why, why_len);
    cudaStream_t s = stream_for(c, exec);
    int t = s ? ticket_get(c, exec) : -XFER_EIO;
    if (t < 0) {
        snprintf(why, why_len, "cannot create a CUDA stream/event on cuda:%d", exec);
        return t;
    }
    if (src_dev >= 0 && dst_dev >= 0 && src_dev != dst_dev)
        e = cudaMemcpyPeerAsync(dst, dst_dev, src, src_dev, len, s);
    else
        e = cudaMemcpyAsync(dst, src, len, cudaMemcpyDefault, s);
    if (e == cudaSuccess)
        e = cudaEventRecord(c->ev[t], s);
    if (e != cudaSuccess) {
        ticket_put(c, t);
        return cuda_fail(e, "cudaMemcpyAsync", why, why_len);
    }
    return t;
}

int ipc_cuda_copy_wait(struct ipc_cuda_copier *c, int t, int timeout_ms, char *why,
                       size_t why_len)
{
    if (t < 0 || t >= c->nev || !c->used[t])
        return -XFER_EINVAL;
    struct timespec now, end, nap = {0, 2000};
    clock_gettime(CLOCK_MONOTONIC, &end);
    end.tv_sec += timeout_ms / 1000;
    end.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    cudaError_t e;
    cudaSetDevice(c->ev_dev[t]);
    while ((e = cudaEventQuery(c->ev[t])) == cudaErrorNotReady) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec * 1000000000L + now.tv_nsec >
            end.tv_sec * 1000000000L + end.tv_nsec) {
            snprintf(why, why_len, "CUDA copy not finished after %d ms", timeout_ms);
            return -XFER_ETIMEDOUT; /* ticket stays used: the copy may still land */
        }
        nanosleep(&nap, NULL);
        if (nap.tv_nsec < 500000)
            nap.tv_nsec *= 2;
    }
    ticket_put(c, t);
    if (e != cudaSuccess)
        return cuda_fail(e, "CUDA copy", why, why_len);
    return 0;
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

int ipc_cuda_probe(char *why, size_t why_len) { return no_cuda(why, why_len); }
int ipc_cuda_export(void *ptr, int dev, struct ipc_cuda_export *out, char *why, size_t why_len)
{
    (void)ptr, (void)dev, (void)out;
    return no_cuda(why, why_len);
}
int ipc_cuda_import(const struct ipc_map_resp *m, int fd, struct ipc_cuda_import **out,
                    char *why, size_t why_len)
{
    (void)m, (void)out;
    if (fd >= 0)
        close(fd);
    return no_cuda(why, why_len);
}
void ipc_cuda_import_close(struct ipc_cuda_import *imp) { (void)imp; }
void *ipc_cuda_import_ptr(const struct ipc_cuda_import *imp) { (void)imp; return NULL; }
int ipc_cuda_import_device(const struct ipc_cuda_import *imp) { (void)imp; return -1; }
struct ipc_cuda_copier *ipc_cuda_copier_new(int *err)
{
    *err = -XFER_ENODEV;
    return NULL;
}
void ipc_cuda_copier_free(struct ipc_cuda_copier *c) { (void)c; }
int ipc_cuda_copy_start(struct ipc_cuda_copier *c, void *dst, int dst_dev, const void *src,
                        int src_dev, int remote_dev, size_t len, char *why, size_t why_len)
{
    (void)c, (void)dst, (void)dst_dev, (void)src, (void)src_dev, (void)remote_dev, (void)len;
    return no_cuda(why, why_len);
}
int ipc_cuda_copy_wait(struct ipc_cuda_copier *c, int t, int timeout_ms, char *why,
                       size_t why_len)
{
    (void)c, (void)t, (void)timeout_ms;
    return no_cuda(why, why_len);
}
struct ipc_cuda_mark *ipc_cuda_mark_new(struct ipc_cuda_copier *c, int *err)
{
    (void)c;
    *err = -XFER_ENODEV;
    return NULL;
}
int ipc_cuda_mark_wait(struct ipc_cuda_mark *m, int timeout_ms, char *why, size_t why_len)
{
    (void)m, (void)timeout_ms;
    return no_cuda(why, why_len);
}
int xfer_gpus_describe(char *buf, size_t len)
{
    if (len)
        buf[0] = 0;
    return 0;
}
#endif
