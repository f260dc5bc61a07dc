/* fakeverbs: devices, contexts, queries, protection domains, memory regions. */
#include "fv_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#undef ibv_query_port
#undef ibv_reg_mr

static struct fv_device devices[FV_MAX_DEVICES];
static int n_devices = -1;
static pthread_once_t devices_once = PTHREAD_ONCE_INIT;
static struct ibv_context *shared_ctx[FV_MAX_DEVICES];
static pthread_mutex_t shared_lock = PTHREAD_MUTEX_INITIALIZER;

static int fv_poll_cq_op(struct ibv_cq *cq, int n, struct ibv_wc *wc);
static int fv_notify_op(struct ibv_cq *cq, int solicited);
int fv_post_send_op(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
int fv_post_recv_op(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);
int fv_cq_poll(struct ibv_cq *cq, int n, struct ibv_wc *wc);
int fv_cq_notify(struct ibv_cq *cq, int solicited);

static void devices_init(void)
{
    const char *s = getenv("XFER_FAKEVERBS_DEVICES");
    int n = s ? atoi(s) : 1;
    if (n < 0)
        n = 0;
    if (n > FV_MAX_DEVICES)
        n = FV_MAX_DEVICES;
    const char *addr = getenv("XFER_FAKEVERBS_ADDR");
    for (int i = 0; i < n; i++) {
        struct fv_device *d = &devices[i];
        d->index = i;
        d->dev.node_type = IBV_NODE_CA;
        d->dev.transport_type = IBV_TRANSPORT_IB;
        snprintf(d->dev.name, sizeof(d->dev.name), "fake%d", i);
        snprintf(d->dev.dev_name, sizeof(d->dev.dev_name), "uverbs%d", i);
        snprintf(d->dev.dev_path, sizeof(d->dev.dev_path), "/nonexistent/uverbs%d", i);
        snprintf(d->dev.ibdev_path, sizeof(d->dev.ibdev_path), "/nonexistent/fake%d", i);
        char buf[32];
        snprintf(buf, sizeof(buf), "127.0.0.%d", 1 + i);
        if (!inet_aton(addr ? addr : buf, &d->addr))
            inet_aton(buf, &d->addr);
    }
    n_devices = n;
}

int fv_device_count(void)
{
    pthread_once(&devices_once, devices_init);
    return n_devices;
}

struct ibv_device **ibv_get_device_list(int *num)
{
    int n = fv_device_count();
    if (num)
        *num = 0;
    if (n == 0) {
        errno = ENOSYS; /* what libibverbs says when no device/driver exists */
        return NULL;
    }
    struct ibv_device **list = calloc((size_t)n + 1, sizeof(*list));
    if (!list) {
        errno = ENOMEM;
        return NULL;
    }
    for (int i = 0; i < n; i++)
        list[i] = &devices[i].dev;
    if (num)
        *num = n;
    return list;
}

/* libibverbs dereferences the list: a NULL here would crash a real program,
 * so the stand-in refuses it loudly instead of hiding the bug. */
void ibv_free_device_list(struct ibv_device **list)
{
    if (!list) {
        fprintf(stderr, "fakeverbs: ibv_free_device_list(NULL) crashes libibverbs\n");
        abort();
    }
    free(list);
}

const char *ibv_get_device_name(struct ibv_device *d)
{
    return d ? d->name : NULL;
}

__be64 ibv_get_device_guid(struct ibv_device *d)
{
    struct fv_device *fd = container_of(d, struct fv_device, dev);
    return htobe64(0x02c9000000000000ull | (uint64_t)fd->index);
}

struct fv_device *fv_device_for_addr(const struct sockaddr *sa)
{
    int n = fv_device_count();
    if (!sa || sa->sa_family != AF_INET)
        return n > 0 ? &devices[0] : NULL;
    const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
    if (in->sin_addr.s_addr == htonl(INADDR_ANY))
        return n > 0 ? &devices[0] : NULL;
    for (int i = 0; i < n; i++)
        if (devices[i].addr.s_addr == in->sin_addr.s_addr)
            return &devices[i];
    return NULL;
}

struct ibv_context *ibv_open_device(struct ibv_device *d)
{
    if (!d) {
        errno = EINVAL;
        return NULL;
    }
    struct fv_context *c = calloc(1, sizeof(*c));
    if (!c) {
        errno = ENOMEM;
        return NULL;
    }
    c->dev = container_of(d, struct fv_device, dev);
    c->ctx.device = d;
    c->ctx.cmd_fd = -1;
    c->ctx.async_fd = -1;
    c->ctx.num_comp_vectors = 1;
    c->ctx.abi_compat = NULL; /* not extended: static inlines use ops or exports */
    c->ctx.ops.poll_cq = fv_poll_cq_op;
    c->ctx.ops.req_notify_cq = fv_notify_op;
    c->ctx.ops.post_send = fv_post_send_op;
    c->ctx.ops.post_recv = fv_post_recv_op;
    c->ctx.ops.alloc_mw = fv_alloc_mw;
    c->ctx.ops.dealloc_mw = fv_dealloc_mw;
    c->ctx.ops.bind_mw = fv_bind_mw;
    pthread_mutex_init(&c->ctx.mutex, NULL);
    pthread_rwlock_init(&c->mr_lock, NULL);
    c->key_variant = (uint8_t)(0x11 + 0x22 * c->dev->index);
    return &c->ctx;
}

int ibv_close_device(struct ibv_context *ctx)
{
    if (!ctx)
        return EINVAL;
    struct fv_context *c = fv_context_of(ctx);
    pthread_rwlock_destroy(&c->mr_lock);
    pthread_mutex_destroy(&c->ctx.mutex);
    free(c->mrs);
    free(c->mws);
    free(c);
    return 0;
}

struct fv_context *fv_context_of(struct ibv_context *c)
{
    return container_of(c, struct fv_context, ctx);
}

/* librdmacm keeps one context per device for the whole process. */
struct ibv_context *fv_shared_context(int index)
{
    if (index < 0 || index >= fv_device_count())
        return NULL;
    pthread_mutex_lock(&shared_lock);
    if (!shared_ctx[index])
        shared_ctx[index] = ibv_open_device(&devices[index].dev);
    struct ibv_context *c = shared_ctx[index];
    pthread_mutex_unlock(&shared_lock);
    return c;
}

int ibv_query_device(struct ibv_context *ctx, struct ibv_device_attr *a)
{
    if (!ctx || !a)
        return EINVAL;
    struct fv_context *c = fv_context_of(ctx);
    memset(a, 0, sizeof(*a));
    snprintf(a->fw_ver, sizeof(a->fw_ver), "fakeverbs-1.0");
    a->node_guid = ibv_get_device_guid(ctx->device);
    a->vendor_id = 0x02c9;
    a->vendor_part_id = 0xfa4e;
    a->max_mr_size = ~0ull;
    a->page_size_cap = 4096;
    a->max_qp = 1 << 16;
    a->max_qp_wr = 8192;
    a->max_sge = 16;
    a->max_cq = 1 << 16;
    a->max_cqe = 1 << 20;
    a->max_mr = 1 << 20;
    a->max_pd = 1 << 16;
    a->max_qp_rd_atom = 16;
    a->max_qp_init_rd_atom = 16;
    a->max_mw = 1 << 20;
    a->device_cap_flags = IBV_DEVICE_MEM_WINDOW | IBV_DEVICE_MEM_WINDOW_TYPE_2B;
    a->phys_port_cnt = 1;
    (void)c;
    return 0;
}

int ibv_query_port(struct ibv_context *ctx, uint8_t port, struct _compat_ibv_port_attr *compat)
{
    /* The verbs.h inline passes a full, zeroed struct ibv_port_attr. */
    struct ibv_port_attr *a = (struct ibv_port_attr *)compat;
    if (!ctx || !a)
        return EINVAL;
    if (port != 1)
        return EINVAL;
    a->state = IBV_PORT_ACTIVE;
    a->max_mtu = IBV_MTU_4096;
    a->active_mtu = IBV_MTU_1024; /* Ethernet MTU 1500 gives 1024 for RoCE */
    a->gid_tbl_len = 2;
    a->max_msg_sz = FV_MAX_MSG;
    a->pkey_tbl_len = 1;
    a->active_width = 2;  /* 4x */
    a->active_speed = 32; /* EDR 25 Gb/s per lane → 100 Gb/s */
    a->phys_state = 5;    /* LinkUp */
    a->link_layer = IBV_LINK_LAYER_ETHERNET;
    return 0;
}

/* GID table: index 0 = RoCE v1 link-local, index 1 = RoCE v2 IPv4-mapped. */
static int fake_gid(struct ibv_context *ctx, uint32_t port, uint32_t index, union ibv_gid *gid,
                    uint32_t *type)
{
    if (!ctx || port != 1 || index > 1)
        return EINVAL;
    struct fv_context *c = fv_context_of(ctx);
    memset(gid, 0, sizeof(*gid));
    if (index == 0) {
        gid->raw[0] = 0xfe;
        gid->raw[1] = 0x80;
        gid->raw[15] = (uint8_t)(1 + c->dev->index);
        *type = IBV_GID_TYPE_ROCE_V1;
    } else {
        gid->raw[10] = 0xff;
        gid->raw[11] = 0xff;
        memcpy(&gid->raw[12], &c->dev->addr, 4);
        *type = IBV_GID_TYPE_ROCE_V2;
    }
    return 0;
}

int ibv_query_gid(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid)
{
    uint32_t type;
    return index < 0 || fake_gid(ctx, port, (uint32_t)index, gid, &type) ? -1 : 0;
}

int _ibv_query_gid_ex(struct ibv_context *ctx, uint32_t port, uint32_t index,
                      struct ibv_gid_entry *e, uint32_t flags, size_t entry_size)
{
    if (flags || entry_size < sizeof(*e))
        return EINVAL;
    memset(e, 0, sizeof(*e));
    if (fake_gid(ctx, port, index, &e->gid, &e->gid_type))
        return ENODATA;
    e->gid_index = index;
    e->port_num = port;
    e->ndev_ifindex = 1;
    return 0;
}

struct ibv_pd *ibv_alloc_pd(struct ibv_context *ctx)
{
    if (!ctx) {
        errno = EINVAL;
        return NULL;
    }
    struct ibv_pd *pd = calloc(1, sizeof(*pd));
    if (!pd) {
        errno = ENOMEM;
        return NULL;
    }
    pd->context = ctx;
    return pd;
}

int ibv_dealloc_pd(struct ibv_pd *pd)
{
    free(pd);
    return 0;
}

static const int known_access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |
                                IBV_ACCESS_MW_BIND | IBV_ACCESS_RELAXED_ORDERING;

/* The stand-in moves bytes with the CPU: it can register host memory only.
 * A GPU pointer (or any unmapped range) is refused like an unpinnable one. */
static bool cpu_readable(const void *addr, size_t len)
{
    char b;
    const char *ends[2] = {addr, (const char *)addr + len - 1};
    for (int i = 0; i < 2; i++) {
        struct iovec local = {&b, 1}, remote = {(void *)ends[i], 1};
        if (process_vm_readv(getpid(), &local, 1, &remote, 1, 0) != 1)
            return false;
    }
    return true;
}

/* Keys: slot index << 8 | a variant byte, as a NIC's mkey. */
static struct ibv_mr *mr_create(struct ibv_pd *pd, void *addr, size_t len, int access)
{
    if (!pd || (access & ~known_access) || (len && !addr)) {
        errno = EINVAL;
        return NULL;
    }
    if (len && !cpu_readable(addr, len)) {
        errno = EFAULT;
        return NULL;
    }
    /* Remote write or atomic without local write is refused by every NIC. */
    if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
        !(access & IBV_ACCESS_LOCAL_WRITE)) {
        errno = EINVAL;
        return NULL;
    }
    struct fv_context *c = fv_context_of(pd->context);
    struct fv_mr *m = calloc(1, sizeof(*m));
    if (!m) {
        errno = ENOMEM;
        return NULL;
    }
    pthread_rwlock_wrlock(&c->mr_lock);
    uint32_t slot = 1;
    while (slot < c->n_mrs && c->mrs[slot])
        slot++;
    if (slot >= c->n_mrs) {
        uint32_t n = c->n_mrs ? c->n_mrs * 2 : 64;
        struct fv_mr **t = n <= (1u << 24) ? realloc(c->mrs, n * sizeof(*t)) : NULL;
        if (!t) {
            pthread_rwlock_unlock(&c->mr_lock);
            free(m);
            errno = ENOMEM;
            return NULL;
        }
        memset(t + c->n_mrs, 0, (n - c->n_mrs) * sizeof(*t));
        c->mrs = t;
        c->n_mrs = n;
    }
    c->key_variant++;
    m->mr.context = pd->context;
    m->mr.pd = pd;
    m->mr.addr = addr;
    m->mr.length = len;
    m->mr.handle = slot;
    m->mr.lkey = m->mr.rkey = slot << 8 | c->key_variant;
    m->access = access;
    c->mrs[slot] = m;
    pthread_rwlock_unlock(&c->mr_lock);
    return &m->mr;
}

struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access)
{
    return mr_create(pd, addr, len, access);
}

struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova,
                                unsigned int access)
{
    if (iova != (uintptr_t)addr) { /* the fake supports VA-based MRs only */
        errno = EOPNOTSUPP;
        return NULL;
    }
    return mr_create(pd, addr, len, (int)access);
}

struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t len, uint64_t iova,
                                 int fd, int access)
{
    (void)pd, (void)offset, (void)len, (void)iova, (void)fd, (void)access;
    errno = EOPNOTSUPP; /* no dma-buf exporter behind the fake */
    return NULL;
}

int ibv_dereg_mr(struct ibv_mr *mr)
{
    if (!mr)
        return EINVAL;
    struct fv_context *c = fv_context_of(mr->context);
    /* The write lock waits for remote accesses in progress, as a NIC does. */
    pthread_rwlock_wrlock(&c->mr_lock);
    if (container_of(mr, struct fv_mr, mr)->windows > 0) {
        pthread_rwlock_unlock(&c->mr_lock);
        return EBUSY; /* memory windows are bound to it: invalidate them first */
    }
    uint32_t slot = mr->lkey >> 8;
    if (slot < c->n_mrs && c->mrs[slot] == container_of(mr, struct fv_mr, mr))
        c->mrs[slot] = NULL;
    pthread_rwlock_unlock(&c->mr_lock);
    free(container_of(mr, struct fv_mr, mr));
    return 0;
}

struct fv_mr *fv_mr_lookup(struct fv_context *c, uint32_t key)
{
    uint32_t slot = key >> 8;
    if (slot == 0 || slot >= c->n_mrs || !c->mrs[slot] || c->mrs[slot]->mr.lkey != key)
        return NULL;
    return c->mrs[slot];
}

static int fv_poll_cq_op(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
    return fv_cq_poll(cq, n, wc);
}
static int fv_notify_op(struct ibv_cq *cq, int solicited)
{
    return fv_cq_notify(cq, solicited);
}

const char *ibv_wc_status_str(enum ibv_wc_status s)
{
    static const char *const str[] = {
        [IBV_WC_SUCCESS] = "success",
        [IBV_WC_LOC_LEN_ERR] = "local length error",
        [IBV_WC_LOC_QP_OP_ERR] = "local QP operation error",
        [IBV_WC_LOC_EEC_OP_ERR] = "local EE context operation error",
        [IBV_WC_LOC_PROT_ERR] = "local protection error",
        [IBV_WC_WR_FLUSH_ERR] = "Work Request Flushed Error",
        [IBV_WC_MW_BIND_ERR] = "memory management operation error",
        [IBV_WC_BAD_RESP_ERR] = "bad response error",
        [IBV_WC_LOC_ACCESS_ERR] = "local access error",
        [IBV_WC_REM_INV_REQ_ERR] = "remote invalid request error",
        [IBV_WC_REM_ACCESS_ERR] = "remote access error",
        [IBV_WC_REM_OP_ERR] = "remote operation error",
        [IBV_WC_RETRY_EXC_ERR] = "transport retry counter exceeded",
        [IBV_WC_RNR_RETRY_EXC_ERR] = "RNR retry counter exceeded",
        [IBV_WC_LOC_RDD_VIOL_ERR] = "local RDD violation error",
        [IBV_WC_REM_INV_RD_REQ_ERR] = "remote invalid RD request",
        [IBV_WC_REM_ABORT_ERR] = "aborted error",
        [IBV_WC_INV_EECN_ERR] = "invalid EE context number",
        [IBV_WC_INV_EEC_STATE_ERR] = "invalid EE context state",
        [IBV_WC_FATAL_ERR] = "fatal error",
        [IBV_WC_RESP_TIMEOUT_ERR] = "response timeout error",
        [IBV_WC_GENERAL_ERR] = "general error",
    };
    if ((unsigned)s < sizeof(str) / sizeof(str[0]) && str[s])
        return str[s];
    return "unknown";
}

const char *ibv_port_state_str(enum ibv_port_state s)
{
    return s == IBV_PORT_ACTIVE ? "PORT_ACTIVE" : s == IBV_PORT_DOWN ? "PORT_DOWN" : "unknown";
}
