/*
 * The ipc transport's ops table: reaches peers with the same host_id (same
 * kernel), moves host memory (memfd mappings, cross-memory attach) and CUDA
 * memory (CUDA IPC / cuMem handles) without copying bytes through a socket.
 * See ipc.h for the protocol.
 */
#include "ipc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int ipc_probe(xfer_engine *e, char *why, size_t why_len)
{
    (void)e;
    (void)why;
    (void)why_len;
    return 0; /* unix sockets and mmap are always there; CUDA is probed per use */
}

static int ipc_open(xfer_engine *e, struct xfer_transport **out)
{
    struct ipc_transport *t = calloc(1, sizeof(*t));
    if (!t)
        return -XFER_ENOMEM;
    t->base = (struct xfer_transport){.ops = &xfer_ipc_transport_ops, .engine = e};
    struct xfer_peer_desc self;
    xfer_engine_describe(e, &self);
    snprintf(t->node_id, sizeof(t->node_id), "%s", self.node_id);
    snprintf(t->host_id, sizeof(t->host_id), "%s", self.host_id);
    t->incarnation = self.incarnation;
    char why[256] = "";
    int n = ipc_cuda_probe(why, sizeof(why));
    t->cuda_devices = n > 0 ? n : 0;
    if (n <= 0)
        xfer_debug("ipc: CUDA paths off: %s", why);
    int err = 0;
    t->server = ipc_server_start(e, t->node_id, t->incarnation, &err, why, sizeof(why));
    if (!t->server) {
        xfer_engine_set_error(e, "ipc: %s", why);
        free(t);
        return err;
    }
    t->pool = ipc_pool_new(); /* NULL: none (large direct items go to the worker) */
    *out = &t->base;
    return 0;
}

static void ipc_close(struct xfer_transport *xt)
{
    if (!xt)
        return;
    struct ipc_transport *t = container_of(xt, struct ipc_transport, base);
    ipc_server_stop(t->server);
    ipc_pool_free(t->pool); /* the connections, and so their tasks, are gone */
    free(t);
}

static bool ipc_reaches(struct xfer_transport *xt, const struct xfer_peer_desc *peer)
{
    struct ipc_transport *t = container_of(xt, struct ipc_transport, base);
    return (peer->transports & XFER_TRANSPORT_IPC) && t->host_id[0] &&
           strcmp(peer->host_id, t->host_id) == 0;
}

static int ipc_connect(struct xfer_transport *xt, xfer_peer *peer, int timeout_ms,
                       struct xfer_conn **out)
{
    return ipc_conn_open(container_of(xt, struct ipc_transport, base), peer, timeout_ms, out);
}

static void ipc_describe_region(struct xfer_transport *xt, const xfer_region *r,
                                struct xfer_region_desc *out)
{
    (void)xt;
    ipc_region_describe(r, out->ipc, sizeof(out->ipc));
}

void ipc_region_describe(const xfer_region *r, char *out, size_t len)
{
    if (xfer_region_kind(r) == XFER_MEM_CUDA) {
        struct ipc_cuda_export ex;
        char why[128];
        if (ipc_cuda_export(xfer_region_ptr(r), xfer_region_device(r),
                            xfer_region_cuda_ipc_handle(r), &ex, why, sizeof(why)) < 0) {
            snprintf(out, len, "cuda:unavailable");
            return;
        }
        if (ex.fd >= 0)
            close(ex.fd);
        size_t n = (size_t)snprintf(out, len, "%s:", ex.mech == IPC_MECH_CUMEM ? "cumem" : "cuda");
        const uint8_t *src = ex.mech == IPC_MECH_CUMEM ? ex.uuid : ex.handle;
        size_t sl = ex.mech == IPC_MECH_CUMEM ? IPC_UUID_LEN : IPC_HANDLE_LEN;
        for (size_t i = 0; i < sl && n + 3 < len; i++)
            n += (size_t)snprintf(out + n, len - n, "%02x", src[i]);
        if (n + 20 < len)
            snprintf(out + n, len - n, "+%llx", (unsigned long long)ex.alloc_off);
    } else if (xfer_region_memfd(r) >= 0) {
        if (len >= sizeof("memfd")) /* per SEND (its RTS): no snprintf (~300 instructions) */
            memcpy(out, "memfd", sizeof("memfd"));
    } else {
        snprintf(out, len, "cma:%d:%llx", (int)getpid(),
                 (unsigned long long)(uintptr_t)xfer_region_ptr(r));
    }
}

static void ipc_region_withdraw(struct xfer_transport *xt, xfer_region *r)
{
    ipc_server_region_withdraw(container_of(xt, struct ipc_transport, base)->server, r);
}

const struct xfer_transport_ops xfer_ipc_transport_ops = {
    .name = "ipc",
    .bit = XFER_TRANSPORT_IPC,
    .caps = XFER_CAP_HOST_MEM | XFER_CAP_CUDA_MEM | XFER_CAP_SAME_HOST | XFER_CAP_BLOCKS |
            XFER_CAP_RX_SPIN,
    .preference = 10, /* before tcp and rdma: no NIC, no socket copies */
    .probe = ipc_probe,
    .open = ipc_open,
    .close = ipc_close,
    .reaches = ipc_reaches,
    .connect = ipc_connect,
    .disconnect = ipc_conn_close,
    .conn_state = ipc_conn_state,
    .post = ipc_conn_post,
    .send_msg = ipc_conn_send_msg,
    .wait_rx = ipc_conn_wait_rx,
    .notif_wait_rx = ipc_notif_wait_rx,
    .describe_region = ipc_describe_region,
    .region_withdraw = ipc_region_withdraw,
};
