/*
 * xfertest: an NCCL net plugin of our own for the tcpx tests, loaded by the
 * transport through the same dlopen path as any plugin. TCP sockets on the
 * loopback (or XFER_TESTNET_ADDR) carry the messages: an 8-byte length,
 * then the payload. Exports the v7..v12 structs (engine/tcpx/nccl_net.h),
 * in testnet_abi.c.
 *
 *   XFER_TESTNET_MODE=host    receives land in the posted buffer (default)
 *   XFER_TESTNET_MODE=unpack  receives land in a bounce buffer the way
 *       GPUDirect-TCPX delivers them: fragments of random sizes, placed out
 *       of order and with gaps, described in the unpack metadata of the
 *       accept()ed comm's device handle; pages come back with irecvConsumed
 *   XFER_TESTNET_BOUNCE=host|cuda  where the bounce buffer, metadata and
 *       handle live (cuda: device memory, mapped pinned metadata, like TCPX)
 *   XFER_TESTNET_FAULT=error|oversize|badmeta|hang, after
 *       XFER_TESTNET_FAULT_AFTER requests (default 4) of this process:
 *       test() fails / reports more bytes than posted / describes a fragment
 *       outside the receive / never completes
 *   XFER_TESTNET_SEED  fragment layout seed (default: per process)
 */
#include "testnet.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#if XFER_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#define TN_MAGIC     0x78667274u
#define TN_REQS      32
#define TN_SLOT_SPAN (2u * XNCCL_UNPACK_MAX_SLICE) /* bounce bytes per unpack slot */

enum tn_fault { F_NONE, F_ERROR, F_OVERSIZE, F_BADMETA, F_HANG };

static struct {
    bool unpack, cuda;
    enum tn_fault fault;
    long fault_after;
    long requests; /* posted by this process */
    unsigned seed;
    xnccl_logger_t log;
} g;

struct tn_handle {
    uint32_t magic;
    uint16_t port;
    uint8_t addr[4];
    uint64_t nonce;
};

struct tn_listen {
    int fd;
    uint64_t nonce;
    int pending; /* accepted, hello not read yet */
};

struct tn_mr {
    uint8_t *p;
    size_t size;
    int type;
};

struct tn_comm;

struct tn_req {
    struct tn_comm *c;
    bool used, done, faulty;
    uint8_t *data;
    size_t size, got;
    int type; /* of the buffer */
    uint64_t hdr;
    size_t hdr_off, off;
    unsigned slot; /* unpack */
};

struct tn_comm {
    int fd;
    bool recv;
    int stage; /* connect: 0 = not started, 1 = connecting */
    struct tn_handle peer;
    struct tn_req req[TN_REQS];
    struct tn_req *fifo[TN_REQS]; /* in post order */
    int nfifo;
    /* unpack (receive comms) */
    struct xnccl_unpack_meta *meta; /* host address */
    struct xnccl_unpack_handle *uh; /* what the device handle points to */
    uint8_t *bounce;                /* host or device */
    uint8_t *shadow;                /* host image of one slot span */
    uint8_t *scratch;               /* host: one received message */
    bool slot_busy[XNCCL_UNPACK_QUEUE_DEPTH];
    uint64_t nrecv;
    unsigned rng;
};

static void tn_warn(const char *fmt, const char *a)
{
    if (g.log)
        g.log(2, 16, __FILE__, __LINE__, fmt, a);
}

static const char *env(const char *n, const char *def)
{
    const char *s = getenv(n);
    return s && *s ? s : def;
}

int tn_init(xnccl_logger_t log)
{
    g.log = log;
    g.unpack = !strcmp(env("XFER_TESTNET_MODE", "host"), "unpack");
    g.cuda = !strcmp(env("XFER_TESTNET_BOUNCE", "host"), "cuda");
    const char *f = env("XFER_TESTNET_FAULT", "none");
    g.fault = !strcmp(f, "error")      ? F_ERROR
              : !strcmp(f, "oversize") ? F_OVERSIZE
              : !strcmp(f, "badmeta")  ? F_BADMETA
              : !strcmp(f, "hang")     ? F_HANG
                                       : F_NONE;
    g.fault_after = atol(env("XFER_TESTNET_FAULT_AFTER", "4"));
    g.seed = (unsigned)atol(env("XFER_TESTNET_SEED", "0"));
    if (!g.seed)
        g.seed = (unsigned)getpid() * 2654435761u;
#if !XFER_WITH_CUDA
    if (g.cuda) {
        tn_warn("xfertest: %s", "XFER_TESTNET_BOUNCE=cuda needs a CUDA build");
        return XNCCL_SYSTEM_ERROR;
    }
#endif
    return XNCCL_SUCCESS;
}

int tn_devices(int *n)
{
    *n = 1;
    return XNCCL_SUCCESS;
}

int tn_ptr_support(void)
{
    int p = XNCCL_PTR_HOST;
#if XFER_WITH_CUDA
    if (g.unpack) /* sends of GPU memory go through a host copy; receives through the bounce */
        p |= XNCCL_PTR_CUDA;
#endif
    return p;
}

/* ---- connection set-up ----------------------------------------------------------- */

int tn_listen(int dev, void *handle, void **listen_comm)
{
    (void)dev;
    struct sockaddr_in a = {.sin_family = AF_INET};
    inet_pton(AF_INET, env("XFER_TESTNET_ADDR", "127.0.0.1"), &a.sin_addr);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    socklen_t sl = sizeof(a);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(fd, 16) < 0 ||
        getsockname(fd, (struct sockaddr *)&a, &sl) < 0) {
        if (fd >= 0)
            close(fd);
        return XNCCL_SYSTEM_ERROR;
    }
    struct tn_listen *l = calloc(1, sizeof(*l));
    if (!l) {
        close(fd);
        return XNCCL_SYSTEM_ERROR;
    }
    l->fd = fd;
    l->pending = -1;
    l->nonce = ((uint64_t)rand_r(&g.seed) << 32) | (unsigned)rand_r(&g.seed);
    struct tn_handle h = {.magic = TN_MAGIC, .port = a.sin_port, .nonce = l->nonce};
    memcpy(h.addr, &a.sin_addr, 4);
    memset(handle, 0, XNCCL_NET_HANDLE_MAXSIZE);
    memcpy(handle, &h, sizeof(h));
    *listen_comm = l;
    return XNCCL_SUCCESS;
}

static struct tn_comm *comm_new(int fd, bool recv)
{
    struct tn_comm *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    c->fd = fd;
    c->recv = recv;
    c->rng = g.seed ^ (unsigned)fd * 7919u;
    int one = 1;
    if (fd >= 0)
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return c;
}

int tn_connect(void *handle, void **send_comm)
{
    struct tn_handle h;
    memcpy(&h, handle, sizeof(h));
    *send_comm = NULL;
    if (h.magic != TN_MAGIC)
        return XNCCL_INVALID_ARGUMENT;
    static __thread struct tn_comm *pending;         /* one connect in progress per thread */
    if (pending && pending->peer.nonce != h.nonce) { /* an abandoned attempt */
        close(pending->fd);
        free(pending);
        pending = NULL;
    }
    if (!pending) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = h.port};
        memcpy(&a.sin_addr, h.addr, 4);
        if (fd < 0 || (connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0 && errno != EINPROGRESS)) {
            if (fd >= 0)
                close(fd);
            return XNCCL_SYSTEM_ERROR;
        }
        pending = comm_new(fd, false);
        if (!pending) {
            close(fd);
            return XNCCL_SYSTEM_ERROR;
        }
        pending->peer = h;
    }
    struct pollfd p = {pending->fd, POLLOUT, 0};
    if (poll(&p, 1, 0) <= 0)
        return XNCCL_SUCCESS; /* not yet: called again */
    int err = 0;
    socklen_t sl = sizeof(err);
    getsockopt(pending->fd, SOL_SOCKET, SO_ERROR, &err, &sl);
    uint64_t hello[2] = {TN_MAGIC, h.nonce};
    if (err || send(pending->fd, hello, sizeof(hello), MSG_NOSIGNAL) != (ssize_t)sizeof(hello)) {
        close(pending->fd);
        free(pending);
        pending = NULL;
        return XNCCL_SYSTEM_ERROR;
    }
    *send_comm = pending;
    pending = NULL;
    return XNCCL_SUCCESS;
}

/* The unpack queue of a receive comm: bounce buffer, metadata, handle,
 * in device memory when XFER_TESTNET_BOUNCE=cuda (as TCPX has them). */
static int unpack_setup(struct tn_comm *c, xnccl_dh *dh)
{
    size_t bounce = (size_t)XNCCL_UNPACK_QUEUE_DEPTH * TN_SLOT_SPAN;
    c->scratch = malloc(XNCCL_UNPACK_MAX_SLICE);
    c->shadow = malloc(TN_SLOT_SPAN);
    if (!c->scratch || !c->shadow)
        return XNCCL_SYSTEM_ERROR;
    struct xnccl_unpack_handle h = {.head = (uint64_t)-1}; /* the consumer increments first */
    if (!g.cuda) {
        c->meta = calloc(1, sizeof(*c->meta));
        c->bounce = malloc(bounce);
        c->uh = malloc(sizeof(*c->uh));
        if (!c->meta || !c->bounce || !c->uh)
            return XNCCL_SYSTEM_ERROR;
        h.meta = c->meta;
        h.bounce_buf = c->bounce;
        *c->uh = h;
    } else {
#if XFER_WITH_CUDA
        if (cudaHostAlloc((void **)&c->meta, sizeof(*c->meta),
                          cudaHostAllocMapped | cudaHostAllocPortable) != cudaSuccess ||
            cudaHostGetDevicePointer((void **)&h.meta, c->meta, 0) != cudaSuccess ||
            cudaMalloc((void **)&c->bounce, bounce) != cudaSuccess ||
            cudaMalloc((void **)&c->uh, sizeof(*c->uh)) != cudaSuccess)
            return XNCCL_UNHANDLED_CUDA_ERROR;
        memset(c->meta, 0, sizeof(*c->meta));
        h.bounce_buf = c->bounce;
        if (cudaMemcpy(c->uh, &h, sizeof(h), cudaMemcpyHostToDevice) != cudaSuccess)
            return XNCCL_UNHANDLED_CUDA_ERROR;
#endif
    }
    dh->handle = c->uh;
    dh->size = sizeof(h);
    dh->needs_proxy_progress = 0;
    return XNCCL_SUCCESS;
}

int tn_accept(void *listen_comm, void **recv_comm, xnccl_dh **dev)
{
    struct tn_listen *l = listen_comm;
    *recv_comm = NULL;
    if (l->pending < 0) {
        l->pending = accept4(l->fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (l->pending < 0)
            return errno == EAGAIN || errno == EWOULDBLOCK ? XNCCL_SUCCESS : XNCCL_SYSTEM_ERROR;
    }
    uint64_t hello[2];
    ssize_t n = recv(l->pending, hello, sizeof(hello), MSG_PEEK | MSG_DONTWAIT);
    if (n < (ssize_t)sizeof(hello))
        return n == 0 || (n < 0 && errno != EAGAIN) ? XNCCL_SYSTEM_ERROR : XNCCL_SUCCESS;
    if (recv(l->pending, hello, sizeof(hello), 0) != (ssize_t)sizeof(hello) ||
        hello[0] != TN_MAGIC || hello[1] != l->nonce)
        return XNCCL_REMOTE_ERROR;
    struct tn_comm *c = comm_new(l->pending, true);
    if (!c)
        return XNCCL_SYSTEM_ERROR;
    l->pending = -1;
    int r = XNCCL_SUCCESS;
    if (g.unpack && dev && *dev)
        r = unpack_setup(c, *dev);
    *recv_comm = c;
    return r;
}

/* ---- memory ------------------------------------------------------------------------ */

int tn_reg_mr(void *comm, void *data, size_t size, int type, void **mh)
{
    (void)comm;
    if (!(type & tn_ptr_support()))
        return XNCCL_INVALID_ARGUMENT;
    struct tn_mr *m = malloc(sizeof(*m));
    if (!m)
        return XNCCL_SYSTEM_ERROR;
    *m = (struct tn_mr){data, size, type};
    *mh = m;
    return XNCCL_SUCCESS;
}

int tn_dereg_mr(void *comm, void *mh)
{
    (void)comm;
    free(mh);
    return XNCCL_SUCCESS;
}

/* ---- requests ------------------------------------------------------------------------ */

static struct tn_req *req_new(struct tn_comm *c, void *data, size_t size, void *mh, int *err)
{
    struct tn_mr *m = mh;
    *err = XNCCL_SUCCESS;
    if (!m || (uint8_t *)data < m->p || (uint8_t *)data + size > m->p + m->size) {
        *err = XNCCL_INVALID_ARGUMENT; /* not inside a registration */
        return NULL;
    }
    if (c->nfifo == TN_REQS)
        return NULL;
    for (int i = 0; i < TN_REQS; i++) {
        struct tn_req *r = &c->req[i];
        if (r->used)
            continue;
        *r = (struct tn_req){.c = c, .used = true, .data = data, .size = size, .type = m->type};
        r->faulty = g.fault != F_NONE && ++g.requests > g.fault_after;
        c->fifo[c->nfifo++] = r;
        return r;
    }
    return NULL;
}

int tn_isend(void *comm, void *data, size_t size, int tag, void *mh, void **request)
{
    (void)tag;
    int err;
    *request = req_new(comm, data, size, mh, &err);
    if (*request) {
        struct tn_req *r = *request;
        r->hdr = size;
    }
    return err;
}

int tn_irecv(void *comm, int n, void **data, size_t *sizes, int *tags, void **mh, void **request)
{
    (void)tags;
    struct tn_comm *c = comm;
    *request = NULL;
    if (n != 1)
        return XNCCL_INVALID_ARGUMENT;
    unsigned slot = (unsigned)(c->nrecv % XNCCL_UNPACK_QUEUE_DEPTH);
    if (c->meta && (c->slot_busy[slot] || sizes[0] > XNCCL_UNPACK_MAX_SLICE))
        return sizes[0] > XNCCL_UNPACK_MAX_SLICE ? XNCCL_INVALID_ARGUMENT : XNCCL_SUCCESS;
    int err;
    struct tn_req *r = req_new(c, data[0], sizes[0], mh[0], &err);
    if (r && c->meta) {
        r->slot = slot;
        c->slot_busy[slot] = true;
        c->nrecv++;
    }
    *request = r;
    return err;
}

static void fifo_pop(struct tn_comm *c)
{
    memmove(c->fifo, c->fifo + 1, (size_t)(c->nfifo - 1) * sizeof(c->fifo[0]));
    c->nfifo--;
}

/* Random fragments of the message in c->scratch, shuffled, placed in the
 * slot's span of the bounce buffer with gaps; metadata written last. */
static int scatter(struct tn_comm *c, struct tn_req *r)
{
    struct xnccl_unpack_frag *f = c->meta->mem[r->slot];
    size_t n = 0, off = 0, minf = r->got / 1024 + 1;
    while (off < r->got) {
        size_t len = minf + (size_t)rand_r(&c->rng) % 9000;
        len = len < r->got - off ? len : r->got - off;
        f[n++] = (struct xnccl_unpack_frag){0, (uint32_t)len, off};
        off += len;
    }
    for (size_t i = n; i > 1; i--) { /* out of order */
        size_t j = (size_t)rand_r(&c->rng) % i;
        struct xnccl_unpack_frag t = f[i - 1];
        f[i - 1] = f[j];
        f[j] = t;
    }
    size_t pos = (size_t)rand_r(&c->rng) % 64;
    for (size_t i = 0; i < n; i++) { /* with gaps */
        memcpy(c->shadow + pos, c->scratch + f[i].dst_off, f[i].len);
        f[i].src_off = (uint32_t)(r->slot * TN_SLOT_SPAN + pos);
        pos += f[i].len + (size_t)rand_r(&c->rng) % 64;
    }
    uint8_t *dst = c->bounce + (size_t)r->slot * TN_SLOT_SPAN;
#if XFER_WITH_CUDA
    /* a copy from pageable memory may return before its DMA is done: the
     * data must be in the bounce buffer when test() says so (as the NIC's is) */
    if (g.cuda && (cudaMemcpy(dst, c->shadow, pos, cudaMemcpyHostToDevice) != cudaSuccess ||
                   cudaDeviceSynchronize() != cudaSuccess))
        return XNCCL_UNHANDLED_CUDA_ERROR;
#endif
    if (!g.cuda)
        memcpy(dst, c->shadow, pos);
    if (r->faulty && g.fault == F_BADMETA && n)
        f[n / 2].dst_off += r->got; /* outside the receive */
    __atomic_store_n(&c->meta->cnt[r->slot], (uint64_t)n, __ATOMIC_RELEASE);
    return XNCCL_SUCCESS;
}

/* Where received payload goes: the posted buffer, or (unpack) scratch. */
static uint8_t *rx_dst(struct tn_comm *c, struct tn_req *r)
{
    return c->meta ? c->scratch : r->data;
}

/* Sending GPU memory: one host copy first (the plugin's own staging). */
static const uint8_t *tx_src(struct tn_comm *c, struct tn_req *r)
{
#if XFER_WITH_CUDA
    if (r->type == XNCCL_PTR_CUDA) {
        if (!c->scratch && !(c->scratch = malloc(XNCCL_UNPACK_MAX_SLICE)))
            return NULL;
        if (r->off == 0 && r->size &&
            cudaMemcpy(c->scratch, r->data, r->size, cudaMemcpyDeviceToHost) != cudaSuccess)
            return NULL;
        return c->scratch;
    }
#endif
    (void)c;
    return r->data;
}

/* Moves the head request of c as far as the socket allows: 1 = it is done,
 * 0 = not yet, -1 = error. */
static int step(struct tn_comm *c, struct tn_req *r)
{
    while (r->hdr_off < sizeof(r->hdr)) {
        ssize_t n = c->recv ? recv(c->fd, (uint8_t *)&r->hdr + r->hdr_off,
                                   sizeof(r->hdr) - r->hdr_off, MSG_DONTWAIT)
                            : send(c->fd, (uint8_t *)&r->hdr + r->hdr_off,
                                   sizeof(r->hdr) - r->hdr_off, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n <= 0)
            return n < 0 && (errno == EAGAIN || errno == EINTR) ? 0 : -1;
        r->hdr_off += (size_t)n;
    }
    if (c->recv && r->hdr > r->size) {
        tn_warn("xfertest: %s", "message larger than the posted receive");
        return -1;
    }
    size_t total = c->recv ? (size_t)r->hdr : r->size;
    while (r->off < total) {
        ssize_t n;
        if (c->recv) {
            n = recv(c->fd, rx_dst(c, r) + r->off, total - r->off, MSG_DONTWAIT);
        } else {
            const uint8_t *src = tx_src(c, r);
            if (!src)
                return -1;
            n = send(c->fd, src + r->off, total - r->off, MSG_DONTWAIT | MSG_NOSIGNAL);
        }
        if (n <= 0)
            return n < 0 && (errno == EAGAIN || errno == EINTR) ? 0 : -1;
        r->off += (size_t)n;
    }
    r->got = total;
    if (c->recv && c->meta && scatter(c, r) != XNCCL_SUCCESS)
        return -1;
    return 1;
}

int tn_test(void *request, int *done, int *size)
{
    struct tn_req *r = request;
    struct tn_comm *c = r->c;
    *done = 0;
    if (r->faulty && g.fault == F_ERROR)
        return XNCCL_SYSTEM_ERROR;
    while (!r->done && c->nfifo) { /* requests complete in post order */
        struct tn_req *h = c->fifo[0];
        int rc = step(c, h);
        if (rc < 0)
            return XNCCL_SYSTEM_ERROR;
        if (rc == 0)
            break;
        h->done = true;
        fifo_pop(c);
    }
    if (!r->done || (r->faulty && g.fault == F_HANG))
        return XNCCL_SUCCESS;
    *done = 1;
    if (size)
        *size = (int)r->got + (r->faulty && g.fault == F_OVERSIZE ? 1000 : 0);
    if (!c->meta) /* unpack requests live until irecvConsumed */
        r->used = false;
    return XNCCL_SUCCESS;
}

int tn_irecv_consumed(void *comm, int n, void *request)
{
    struct tn_comm *c = comm;
    struct tn_req *r = request;
    if (n != 1 || !r || r->c != c || !c->meta || !r->done)
        return XNCCL_INVALID_USAGE;
    c->slot_busy[r->slot] = false;
    r->used = false;
    return XNCCL_SUCCESS;
}

int tn_iflush(void *comm, int n, void **data, int *sizes, void **mh, void **request)
{
    (void)comm, (void)n, (void)data, (void)sizes, (void)mh;
    *request = NULL; /* receives are visible when test() says done */
    return XNCCL_SUCCESS;
}

int tn_close(void *comm)
{
    struct tn_comm *c = comm;
    if (!c)
        return XNCCL_SUCCESS;
    if (c->fd >= 0)
        close(c->fd);
    if (!g.cuda) {
        free(c->meta);
        free(c->bounce);
        free(c->uh);
    } else {
#if XFER_WITH_CUDA
        cudaFreeHost(c->meta);
        cudaFree(c->bounce);
        cudaFree(c->uh);
#endif
    }
    free(c->scratch);
    free(c->shadow);
    free(c);
    return XNCCL_SUCCESS;
}

int tn_close_listen(void *listen_comm)
{
    struct tn_listen *l = listen_comm;
    if (l->pending >= 0)
        close(l->pending);
    close(l->fd);
    free(l);
    return XNCCL_SUCCESS;
}

bool tn_unpack_mode(void)
{
    return g.unpack;
}

void *tn_context(void)
{
    return &g;
}
