/*
 * xfertest's NCCL net ABI (engine/tcpx/nccl_net.h): the properties and the
 * exported ncclNetPlugin_v7..v12 structs, each version's calls adapted to
 * the one set of operations in testnet.c.
 */
#include "testnet.h"

#include <string.h>

#define TN_EXPORT __attribute__((visibility("default")))

/* ---- properties and the exported structs ---------------------------------------------- */

#define TN_PROPS_COMMON(p)                                                                         \
    do {                                                                                           \
        (p)->name = "xfertest";                                                                    \
        (p)->pci_path = NULL;                                                                      \
        (p)->guid = 0x78667274;                                                                    \
        (p)->ptr_support = tn_ptr_support();                                                       \
        (p)->speed = 100000;                                                                       \
        (p)->port = 0;                                                                             \
        (p)->latency = 0;                                                                          \
        (p)->max_comms = 65536;                                                                    \
        (p)->max_recvs = 1;                                                                        \
        (p)->net_device_type = tn_unpack_mode() ? XNCCL_NET_DEVICE_UNPACK : XNCCL_NET_DEVICE_HOST; \
        (p)->net_device_version = tn_unpack_mode() ? XNCCL_NET_DEVICE_UNPACK_VERSION : 0;          \
    } while (0)

static int props_v7(int dev, struct xnccl_props_v7 *p)
{
    (void)dev;
    TN_PROPS_COMMON(p);
    return XNCCL_SUCCESS;
}

static int props_v8(int dev, struct xnccl_props_v8 *p)
{
    (void)dev;
    TN_PROPS_COMMON(p);
    p->reg_is_global = 0;
    return XNCCL_SUCCESS;
}

static int props_v9(int dev, struct xnccl_props_v9 *p)
{
    (void)dev;
    memset(p, 0, sizeof(*p));
    TN_PROPS_COMMON(p);
    p->vprops.ndevs = 1;
    p->max_p2p_bytes = p->max_coll_bytes = XNCCL_UNPACK_MAX_SLICE;
    return XNCCL_SUCCESS;
}

static int props_v11(int dev, struct xnccl_props_v11 *p)
{
    props_v9(dev, &p->v9);
    p->max_multi_request_size = 1;
    return XNCCL_SUCCESS;
}

static int props_v12(int dev, struct xnccl_props_v12 *p)
{
    (void)dev;
    memset(p, 0, sizeof(*p));
    TN_PROPS_COMMON(p);
    p->vprops.ndevs = 1;
    p->max_p2p_bytes = p->max_coll_bytes = XNCCL_UNPACK_MAX_SLICE;
    p->max_multi_request_size = 1;
    return XNCCL_SUCCESS;
}

/* the per-version shapes of the same calls */
static int init_v10(xnccl_logger_t log, xnccl_profiler_cb_t prof)
{
    (void)prof;
    return tn_init(log);
}
static int init_v11(void **ctx, uint64_t id, struct xnccl_comm_config *cfg, xnccl_logger_t log,
                    xnccl_profiler_cb_t prof)
{
    (void)id, (void)cfg, (void)prof;
    *ctx = tn_context();
    return tn_init(log);
}
static int finalize(void *ctx)
{
    (void)ctx;
    return XNCCL_SUCCESS;
}
static int listen_v11(void *ctx, int dev, void *h, void **lc)
{
    (void)ctx;
    return tn_listen(dev, h, lc);
}
static int connect_v7(int dev, void *h, void **sc, xnccl_dh **d)
{
    (void)dev, (void)d;
    return tn_connect(h, sc);
}
static int connect_v10(int dev, struct xnccl_comm_config *cfg, void *h, void **sc, xnccl_dh **d)
{
    (void)cfg;
    return connect_v7(dev, h, sc, d);
}
static int connect_v11(void *ctx, int dev, void *h, void **sc, xnccl_dh **d)
{
    (void)ctx;
    return connect_v7(dev, h, sc, d);
}
static int reg_mr_v7(void *c, void *data, int size, int type, void **mh)
{
    return size < 0 ? XNCCL_INVALID_ARGUMENT : tn_reg_mr(c, data, (size_t)size, type, mh);
}
static int isend_v7(void *c, void *data, int size, int tag, void *mh, void **req)
{
    return size < 0 ? XNCCL_INVALID_ARGUMENT : tn_isend(c, data, (size_t)size, tag, mh, req);
}
static int isend_v10(void *c, void *data, size_t size, int tag, void *mh, void *ph, void **req)
{
    (void)ph;
    return tn_isend(c, data, size, tag, mh, req);
}
static int irecv_v7(void *c, int n, void **data, int *sizes, int *tags, void **mh, void **req)
{
    if (n != 1 || sizes[0] < 0)
        return XNCCL_INVALID_ARGUMENT;
    size_t s = (size_t)sizes[0];
    return tn_irecv(c, n, data, &s, tags, mh, req);
}
static int irecv_v10(void *c, int n, void **data, size_t *sizes, int *tags, void **mh, void **ph,
                     void **req)
{
    (void)ph;
    return tn_irecv(c, n, data, sizes, tags, mh, req);
}

#define TN_COMMON_TAIL                                                                             \
    .iflush = tn_iflush, .test = tn_test, .close_send = tn_close, .close_recv = tn_close,          \
    .close_listen = tn_close_listen, .get_device_mr = NULL, .irecv_consumed = tn_irecv_consumed

TN_EXPORT const struct xnccl_net_v7 ncclNetPlugin_v7 = {.name = "xfertest",
                                                        .init = tn_init,
                                                        .devices = tn_devices,
                                                        .get_properties = props_v7,
                                                        .listen = tn_listen,
                                                        .connect = connect_v7,
                                                        .accept = tn_accept,
                                                        .reg_mr = reg_mr_v7,
                                                        .reg_mr_dmabuf = NULL,
                                                        .dereg_mr = tn_dereg_mr,
                                                        .isend = isend_v7,
                                                        .irecv = irecv_v7,
                                                        TN_COMMON_TAIL};

TN_EXPORT const struct xnccl_net_v8 ncclNetPlugin_v8 = {.name = "xfertest",
                                                        .init = tn_init,
                                                        .devices = tn_devices,
                                                        .get_properties = props_v8,
                                                        .listen = tn_listen,
                                                        .connect = connect_v7,
                                                        .accept = tn_accept,
                                                        .reg_mr = tn_reg_mr,
                                                        .reg_mr_dmabuf = NULL,
                                                        .dereg_mr = tn_dereg_mr,
                                                        .isend = isend_v7,
                                                        .irecv = irecv_v7,
                                                        TN_COMMON_TAIL};

TN_EXPORT const struct xnccl_net_v9 ncclNetPlugin_v9 = {.name = "xfertest",
                                                        .init = tn_init,
                                                        .devices = tn_devices,
                                                        .get_properties = props_v9,
                                                        .listen = tn_listen,
                                                        .connect = connect_v7,
                                                        .accept = tn_accept,
                                                        .reg_mr = tn_reg_mr,
                                                        .reg_mr_dmabuf = NULL,
                                                        .dereg_mr = tn_dereg_mr,
                                                        .isend = tn_isend,
                                                        .irecv = tn_irecv,
                                                        TN_COMMON_TAIL,
                                                        .make_vdevice = NULL};

TN_EXPORT const struct xnccl_net_v10 ncclNetPlugin_v10 = {.name = "xfertest",
                                                          .init = init_v10,
                                                          .devices = tn_devices,
                                                          .get_properties = props_v9,
                                                          .listen = tn_listen,
                                                          .connect = connect_v10,
                                                          .accept = tn_accept,
                                                          .reg_mr = tn_reg_mr,
                                                          .reg_mr_dmabuf = NULL,
                                                          .dereg_mr = tn_dereg_mr,
                                                          .isend = isend_v10,
                                                          .irecv = irecv_v10,
                                                          TN_COMMON_TAIL,
                                                          .make_vdevice = NULL};

TN_EXPORT const struct xnccl_net_v11 ncclNetPlugin_v11 = {.name = "xfertest",
                                                          .init = init_v11,
                                                          .devices = tn_devices,
                                                          .get_properties = props_v11,
                                                          .listen = listen_v11,
                                                          .connect = connect_v11,
                                                          .accept = tn_accept,
                                                          .reg_mr = tn_reg_mr,
                                                          .reg_mr_dmabuf = NULL,
                                                          .dereg_mr = tn_dereg_mr,
                                                          .isend = isend_v10,
                                                          .irecv = irecv_v10,
                                                          TN_COMMON_TAIL,
                                                          .make_vdevice = NULL,
                                                          .finalize = finalize,
                                                          .set_net_attr = NULL};

TN_EXPORT const struct xnccl_net_v12 ncclNetPlugin_v12 = {.name = "xfertest",
                                                          .init = init_v11,
                                                          .devices = tn_devices,
                                                          .get_properties = props_v12,
                                                          .listen = listen_v11,
                                                          .connect = connect_v11,
                                                          .accept = tn_accept,
                                                          .reg_mr = tn_reg_mr,
                                                          .reg_mr_dmabuf = NULL,
                                                          .dereg_mr = tn_dereg_mr,
                                                          .isend = isend_v10,
                                                          .irecv = irecv_v10,
                                                          TN_COMMON_TAIL,
                                                          .make_vdevice = NULL,
                                                          .finalize = finalize,
                                                          .set_net_attr = NULL};
