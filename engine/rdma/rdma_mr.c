/* rdma: memory registration. Host memory: ibv_reg_mr. CUDA memory: a dma-buf
 * of the range from cuMemGetHandleForAddressRange registered with
 * ibv_reg_dmabuf_mr, else ibv_reg_mr on the device pointer (works where the
 * nvidia-peermem module is loaded). One MR per local NIC; the rkeys are
 * published in NIC-list order. Read-only regions get no remote write access,
 * so the NIC itself refuses a WRITE. A region registered with
 * XFER_ACCESS_LEASED gets no remote access at all (IBV_ACCESS_MW_BIND
 * instead) and publishes "mw" for rkeys: peers reach it only through the
 * memory windows of its leases (rdma_lease.c). */
#include "rdma.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if XFER_WITH_CUDA
#include <cuda.h>
#include <cuda_runtime_api.h>

typedef CUresult (*get_handle_fn)(void *handle, CUdeviceptr dptr, size_t size,
                                  CUmemRangeHandleType type, unsigned long long flags);

/* A dma-buf fd covering [ptr, ptr+len) rounded out to pages, and the offset
 * of ptr in it; -1 when the driver cannot export one. */
static int cuda_dmabuf(void *ptr, size_t len, uint64_t *offset)
{
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuMemGetHandleForAddressRange", &fn, 11070,
                                         cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess || !fn)
        return -1;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t base = (uintptr_t)ptr & ~(page - 1);
    size_t span = (((uintptr_t)ptr + len + page - 1) & ~(page - 1)) - base;
    int fd = -1;
    if (((get_handle_fn)fn)(&fd, (CUdeviceptr)base, span, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0) !=
        CUDA_SUCCESS)
        return -1;
    *offset = (uintptr_t)ptr - base;
    return fd;
}
#endif

static struct ibv_mr *register_one(struct rdma_nic *nic, void *ptr, size_t len, int access,
                                   bool cuda, const char **how)
{
    *how = "ibv_reg_mr";
#if XFER_WITH_CUDA
    if (cuda) {
        uint64_t off = 0;
        int fd = cuda_dmabuf(ptr, len, &off);
        if (fd >= 0) {
            struct ibv_mr *mr = ibv_reg_dmabuf_mr(nic->pd, off, len, (uintptr_t)ptr, fd, access);
            close(fd); /* the MR keeps its own reference to the dma-buf */
            if (mr) {
                *how = "ibv_reg_dmabuf_mr";
                return mr;
            }
        }
        *how = "ibv_reg_mr (peer memory)";
    }
#else
    (void)cuda;
#endif
    return ibv_reg_mr(nic->pd, ptr, len, access);
}

int xrdma_reg_mem(struct xfer_transport *tr, xfer_region *r)
{
    struct rdma_transport *t = xrdma_of(tr);
    struct xfer_region_desc d;
    xfer_region_describe(r, &d);
    bool cuda = xfer_region_kind(r) == XFER_MEM_CUDA;
    struct rdma_region *rr = calloc(1, sizeof(*rr));
    if (!rr)
        return -XFER_ENOMEM;
    int remote = 0;
    if (d.access & XFER_ACCESS_R)
        remote |= IBV_ACCESS_REMOTE_READ;
    if (d.access & XFER_ACCESS_W)
        remote |= IBV_ACCESS_REMOTE_WRITE;
    bool windowed = xfer_region_leased(r);
    int access = IBV_ACCESS_LOCAL_WRITE | (windowed ? IBV_ACCESS_MW_BIND : remote);
    for (int i = 0; windowed && i < t->n_nics; i++)
        if (!t->nics[i].mw2) { /* the other transports still serve it, with its leases */
            xfer_warn("rdma: region %s not registered: it carries leases and %s has no type-2 "
                      "memory windows",
                      d.name, t->nics[i].desc.name);
            free(rr);
            return 0;
        }
    void *ptr = xfer_region_ptr(r);
    size_t len = xfer_region_len(r);
    for (int i = 0; i < t->n_nics; i++) {
        const char *how;
        rr->mr[i] = register_one(&t->nics[i], ptr, len, access, cuda, &how);
        if (!rr->mr[i]) {
            int e = errno;
            for (int j = 0; j < i; j++)
                ibv_dereg_mr(rr->mr[j]);
            free(rr);
            if (cuda) { /* no GPUDirect RDMA here: the region stays usable by the other
                         * transports; rdma items on it fail with a clear reason */
                xfer_warn("rdma: GPU region %s not registered (%s on %s: %s): no GPUDirect RDMA "
                          "(dma-buf or nvidia-peermem) for it",
                          d.name, how, t->nics[i].desc.name, strerror(e));
                return 0;
            }
            xfer_engine_set_error(t->base.engine, "rdma: %s on %s for region %s (%zu bytes): %s%s",
                                  how, t->nics[i].desc.name, d.name, len, strerror(e),
                                  e == ENOMEM ? " (locked-memory limit, ulimit -l?)" : "");
            return e == ENOMEM ? -XFER_ENOMEM : -XFER_EIO;
        }
        xfer_debug("rdma: region %s on %s: %s lkey %x rkey %x", d.name, t->nics[i].desc.name, how,
                   rr->mr[i]->lkey, rr->mr[i]->rkey);
    }
    rr->n = t->n_nics;
    rr->windowed = windowed;
    rr->remote_access = (unsigned)remote;
    rr->device = cuda ? xfer_region_device(r) : -1;
    rr->near_mask = xrdma_nics_near(t, rr->device);
    rr->owner = r;
    pthread_mutex_lock(&t->lock);
    rr->next = t->regions;
    if (t->regions)
        t->regions->prev = rr;
    t->regions = rr;
    pthread_mutex_unlock(&t->lock);
    xfer_region_set_transport_data(r, XFER_TRANSPORT_RDMA, rr);
    return 0;
}

static void region_release(struct rdma_region *rr)
{
    /* Deregistration revokes the rkeys: a peer still using them gets a
     * remote access error from the NIC, never this memory. */
    for (int i = 0; i < rr->n; i++)
        ibv_dereg_mr(rr->mr[i]);
    free(rr);
}

void xrdma_regions_release(struct rdma_transport *t)
{
    pthread_mutex_lock(&t->lock);
    struct rdma_region *rr = t->regions;
    t->regions = NULL;
    pthread_mutex_unlock(&t->lock);
    while (rr) {
        struct rdma_region *n = rr->next;
        xfer_region_set_transport_data(rr->owner, XFER_TRANSPORT_RDMA, NULL);
        region_release(rr);
        rr = n;
    }
}

void xrdma_dereg_mem(struct xfer_transport *tr, xfer_region *r)
{
    struct rdma_transport *t = xrdma_of(tr);
    struct rdma_region *rr = r ? xfer_region_transport_data(r, XFER_TRANSPORT_RDMA) : NULL;
    if (!rr)
        return;
    xfer_region_set_transport_data(r, XFER_TRANSPORT_RDMA, NULL);
    pthread_mutex_lock(&t->lock);
    if (rr->prev)
        rr->prev->next = rr->next;
    else
        t->regions = rr->next;
    if (rr->next)
        rr->next->prev = rr->prev;
    pthread_mutex_unlock(&t->lock);
    xrdma_lease_region_gone(t, rr); /* an MR with bound windows cannot go */
    region_release(rr);
}

void xrdma_describe_region(struct xfer_transport *tr, const xfer_region *r,
                           struct xfer_region_desc *out)
{
    (void)tr;
    const struct rdma_region *rr = xfer_region_transport_data(r, XFER_TRANSPORT_RDMA);
    if (!rr)
        return;
    if (rr->windowed) { /* no rkey: windows are asked for per QP */
        snprintf(out->rkeys, sizeof(out->rkeys), "%s", XFER_RDMA_RKEYS_WINDOWED);
        return;
    }
    uint32_t keys[XFER_RDMA_MAX_NICS];
    for (int i = 0; i < rr->n; i++)
        keys[i] = rr->mr[i]->rkey;
    if (xfer_rdma_rkeys_format(keys, rr->n, out->rkeys, sizeof(out->rkeys)) < 0)
        out->rkeys[0] = '\0';
}
