/* Memory a link's plugin comms can use: regions registered on first use
 * (one regMr per comm, cached until the region or the link goes) and
 * staging slots (host, or GPU memory when the plugin takes CUDA pointers). */
#include "tcpx.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if XFER_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

static int mem_type(enum xfer_mem_kind kind)
{
    return kind == XFER_MEM_CUDA ? XNCCL_PTR_CUDA : XNCCL_PTR_HOST;
}

bool tcpx_mem_direct(const struct tcpx_link *l, enum xfer_mem_kind kind)
{
    return (l->tt->net->props.ptr_support & mem_type(kind)) != 0;
}

int tcpx_copy(void *dst, const void *src, size_t len)
{
    return len ? xfer_kernels_copy(dst, src, len) : 0;
}

/* regMr of [p, p+len) with both comms. */
static int reg_both(struct tcpx_link *l, void *p, size_t len, int type, void **ms, void **mr,
                    char *why, size_t wl)
{
    struct tcpx_net *n = l->tt->net;
    int r = tcpx_net_reg_mr(n, l->send_comm, p, len, type, ms);
    if (r == 0 && (r = tcpx_net_reg_mr(n, l->recv_comm, p, len, type, mr)) != 0)
        tcpx_net_dereg_mr(n, l->send_comm, *ms);
    if (r != 0) {
        snprintf(why, wl, "plugin regMr of %zu bytes of %s memory: %s", len,
                 type == XNCCL_PTR_CUDA ? "GPU" : "host", tcpx_net_result_str(r));
        return -XFER_EIO;
    }
    return 0;
}

int tcpx_mem_region(struct tcpx_link *l, xfer_region *r, void **ms, void **mr, char *why, size_t wl)
{
    uint32_t id = xfer_region_id(r), gen = xfer_region_gen(r);
    int rc = 0;
    pthread_mutex_lock(&l->mem_mu);
    struct tcpx_mr *m = l->mrs;
    while (m && (m->id != id || m->gen != gen))
        m = m->next;
    if (!m) {
        m = calloc(1, sizeof(*m));
        rc = m ? reg_both(l, xfer_region_ptr(r), xfer_region_len(r), mem_type(xfer_region_kind(r)),
                          &m->mh_send, &m->mh_recv, why, wl)
               : -XFER_ENOMEM;
        if (rc == 0) {
            m->id = id;
            m->gen = gen;
            m->next = l->mrs;
            l->mrs = m;
        } else {
            free(m);
            m = NULL;
        }
    }
    if (m) {
        *ms = m->mh_send;
        *mr = m->mh_recv;
    }
    pthread_mutex_unlock(&l->mem_mu);
    return rc;
}

void tcpx_mem_forget(struct tcpx_link *l, uint32_t id, uint32_t gen)
{
    struct tcpx_net *n = l->tt->net;
    pthread_mutex_lock(&l->mem_mu); /* no comms: nothing is registered */
    for (struct tcpx_mr **pp = &l->mrs; *pp;) {
        struct tcpx_mr *m = *pp;
        if (m->id == id && m->gen == gen) {
            tcpx_net_dereg_mr(n, l->send_comm, m->mh_send);
            tcpx_net_dereg_mr(n, l->recv_comm, m->mh_recv);
            *pp = m->next;
            free(m);
        } else {
            pp = &m->next;
        }
    }
    pthread_mutex_unlock(&l->mem_mu);
}

static void *buf_alloc(int device)
{
    if (device < 0)
        return aligned_alloc(4096, TCPX_CHUNK_MAX);
#if XFER_WITH_CUDA
    void *p = NULL;
    int saved = -1;
    cudaGetDevice(&saved);
    if (cudaSetDevice(device) != cudaSuccess || cudaMalloc(&p, TCPX_CHUNK_MAX) != cudaSuccess) {
        (void)cudaGetLastError();
        p = NULL;
    }
    if (saved >= 0)
        cudaSetDevice(saved);
    return p;
#else
    return NULL;
#endif
}

static void buf_free(int device, void *p)
{
    if (!p)
        return;
    if (device < 0) {
        free(p);
        return;
    }
#if XFER_WITH_CUDA
    cudaFree(p);
#endif
}

/* The pool for memory of `device`: its GPU's when the plugin takes CUDA
 * pointers, else the host pool (copies cross PCIe then). */
static struct tcpx_pool *pool_for(struct tcpx_link *l, int device)
{
    if (device < 0 || device >= 16 || !tcpx_mem_direct(l, XFER_MEM_CUDA))
        return &l->host;
    if (!l->gpu[device]) {
        l->gpu[device] = calloc(1, sizeof(struct tcpx_pool));
        if (!l->gpu[device])
            return NULL;
        l->gpu[device]->device = device;
    }
    return l->gpu[device];
}

struct tcpx_slot *tcpx_mem_slot(struct tcpx_link *l, int device, char *why, size_t wl)
{
    pthread_mutex_lock(&l->mem_mu);
    struct tcpx_pool *p = pool_for(l, device);
    struct tcpx_slot *s = NULL;
    for (int i = 0; p && i < TCPX_WINDOW && !s; i++)
        if (!p->slot[i].busy)
            s = &p->slot[i];
    if (s && !s->buf) {
        int type = p->device < 0 ? XNCCL_PTR_HOST : XNCCL_PTR_CUDA;
        s->buf = buf_alloc(p->device);
        if (!s->buf) {
            snprintf(why, wl, "no memory for a staging buffer");
            s = NULL;
        } else if (p->device < 0 && !tcpx_mem_direct(l, XFER_MEM_HOST)) {
            snprintf(why, wl, "the plugin takes no host memory and the data is not on a GPU");
            buf_free(p->device, s->buf);
            s->buf = NULL;
            s = NULL;
        } else if (reg_both(l, s->buf, TCPX_CHUNK_MAX, type, &s->mh_send, &s->mh_recv, why, wl)) {
            buf_free(p->device, s->buf);
            s->buf = NULL;
            s = NULL;
        }
    } else if (!s && p) {
        snprintf(why, wl, "all %d staging slots busy", TCPX_WINDOW);
    }
    if (s)
        s->busy = true;
    pthread_mutex_unlock(&l->mem_mu);
    return s;
}

void tcpx_mem_slot_put(struct tcpx_slot *s)
{
    if (s)
        __atomic_store_n(&s->busy, false, __ATOMIC_RELEASE);
}

static void pool_dereg(struct tcpx_link *l, struct tcpx_pool *p)
{
    struct tcpx_net *n = l->tt->net;
    for (int i = 0; i < TCPX_WINDOW; i++) {
        struct tcpx_slot *s = &p->slot[i];
        if (s->mh_send)
            tcpx_net_dereg_mr(n, l->send_comm, s->mh_send);
        if (s->mh_recv)
            tcpx_net_dereg_mr(n, l->recv_comm, s->mh_recv);
        s->mh_send = s->mh_recv = NULL;
    }
}

void tcpx_mem_close_comms(struct tcpx_link *l)
{
    struct tcpx_net *n = l->tt->net;
    pthread_mutex_lock(&l->mem_mu);
    while (l->mrs) {
        struct tcpx_mr *m = l->mrs;
        l->mrs = m->next;
        tcpx_net_dereg_mr(n, l->send_comm, m->mh_send);
        tcpx_net_dereg_mr(n, l->recv_comm, m->mh_recv);
        free(m);
    }
    if (l->send_comm && l->recv_comm) {
        pool_dereg(l, &l->host);
        for (int d = 0; d < 16; d++)
            if (l->gpu[d])
                pool_dereg(l, l->gpu[d]);
    }
    if (l->send_comm)
        tcpx_net_close_send(n, l->send_comm);
    if (l->recv_comm)
        tcpx_net_close_recv(n, l->recv_comm);
    l->send_comm = l->recv_comm = NULL;
    pthread_mutex_unlock(&l->mem_mu);
}

static void pool_free(struct tcpx_pool *p)
{
    for (int i = 0; i < TCPX_WINDOW; i++) {
        buf_free(p->device, p->slot[i].buf);
        p->slot[i].buf = NULL;
    }
}

void tcpx_mem_release(struct tcpx_link *l)
{
    tcpx_mem_close_comms(l);
    pthread_mutex_lock(&l->mem_mu);
    pool_free(&l->host);
    for (int d = 0; d < 16; d++) {
        if (l->gpu[d])
            pool_free(l->gpu[d]);
        free(l->gpu[d]);
        l->gpu[d] = NULL;
    }
    pthread_mutex_unlock(&l->mem_mu);
}
