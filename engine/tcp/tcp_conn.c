/* TCP transport: connections to a peer (control path) and posting chunks. */
#include "tcp.h"
#include "xfer_io.h"
#include "handshake.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* Non-blocking connect bounded by deadline_ms; returns the fd or -code. */
static int dial(xfer_engine *e, const char *addr, uint16_t port, int64_t deadline_ms)
{
    struct addrinfo hints = {
        .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    char ports[8];
    snprintf(ports, sizeof(ports), "%u", port);
    int rc = getaddrinfo(addr, ports, &hints, &res);
    if (rc != 0) {
        xfer_engine_set_error(e, "tcp: address %s: %s", addr, gai_strerror(rc));
        return -XFER_EINVAL;
    }
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        freeaddrinfo(res);
        return -XFER_EIO;
    }
    rc = connect(fd, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    if (rc < 0 && errno == EINPROGRESS) {
        struct pollfd p = {fd, POLLOUT, 0};
        int left = (int)(deadline_ms - xfer_now_ms());
        rc = left > 0 ? poll(&p, 1, left) : 0;
        if (rc == 0) {
            close(fd);
            xfer_engine_set_error(e, "tcp: connect to %s:%u timed out", addr, port);
            return -XFER_ETIMEDOUT;
        }
        int soerr = 0;
        socklen_t sl = sizeof(soerr);
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
        errno = soerr;
        rc = soerr ? -1 : 0;
    }
    if (rc < 0) {
        xfer_engine_set_error(e, "tcp: connect to %s:%u: %s", addr, port, strerror(errno));
        close(fd);
        return -XFER_ECONN;
    }
    return fd;
}

/* One socket: dial, handshake, check that the right node answered. */
static int open_socket(struct tcp_transport *tt, const struct xfer_peer_desc *d, uint32_t purpose,
                       int64_t deadline_ms, struct tcp_sock **out)
{
    xfer_engine *e = tt->engine;
    const struct xfer_engine_config *cfg = xfer_engine_config_get(e);
    struct xfer_peer_desc self;
    xfer_engine_describe(e, &self);
    int fd = dial(e, d->addr, d->data_port, deadline_ms);
    if (fd < 0)
        return fd;
    struct xfer_hs_self hs = {cfg->node_id, self.incarnation, cfg->secret, cfg->secret_len,
                              purpose};
    struct xfer_hs_peer hp;
    char why[200] = "";
    int left = (int)(deadline_ms - xfer_now_ms());
    int rc =
        left > 0 ? xfer_handshake_client(fd, &hs, left, &hp, why, sizeof(why)) : -XFER_ETIMEDOUT;
    if (rc == 0 && strcmp(hp.node_id, d->node_id)) {
        snprintf(why, sizeof(why), "node %.40s answered at %.40s:%u, expected %.40s", hp.node_id,
                 d->addr, d->data_port, d->node_id);
        rc = -XFER_ESTALE;
    } else if (rc == 0 && d->incarnation && hp.incarnation != d->incarnation) {
        snprintf(why, sizeof(why), "node %s restarted (incarnation differs)", d->node_id);
        rc = -XFER_ESTALE;
    }
    if (rc < 0) {
        xfer_engine_set_error(e, "tcp: handshake with %s at %s:%u: %s", d->node_id, d->addr,
                              d->data_port, why[0] ? why : xfer_strerror(rc));
        xfer_warn("%s", xfer_engine_last_error(e));
        close(fd);
        return rc;
    }
    tcp_sock_tune(tt, fd);
    char name[96];
    snprintf(name, sizeof(name), "%.40s@%.40s:%u#%u", d->node_id, d->addr, d->data_port, purpose);
    *out = tcp_sock_new(tt, fd, false, name);
    if (!*out) {
        close(fd);
        return -XFER_ENOMEM;
    }
    return 0;
}

int tcp_connect(struct xfer_transport *t, xfer_peer *peer, int timeout_ms, struct xfer_conn **out)
{
    struct tcp_transport *tt = container_of(t, struct tcp_transport, base);
    const struct xfer_peer_desc *d = xfer_peer_desc_get(peer);
    int n = xfer_engine_config_get(tt->engine)->sockets_per_peer;
    n = n < 1 ? 1 : n > 64 ? 64 : n;
    struct tcp_conn *tc = calloc(1, sizeof(*tc));
    struct tcp_sock **socks = calloc((size_t)n, sizeof(*socks));
    if (!tc || !socks) {
        free(tc);
        free(socks);
        return -XFER_ENOMEM;
    }
    int64_t deadline = xfer_now_ms() + timeout_ms;
    int rc = 0, i;
    for (i = 0; i < n && rc == 0; i++)
        rc = open_socket(tt, d, (uint32_t)i, deadline, &socks[i]);
    if (rc < 0) {
        while (i-- > 0)
            tcp_sock_destroy(socks[i]);
        free(socks);
        free(tc);
        return rc;
    }
    for (i = 0; i < n; i++) /* before anything else: fences older frames may need */
        tcp_fence_resend(tt, socks[i]);
    for (i = 0; i < n; i++) {
        tcp_thread_adopt(tt, socks[i]);
        tcp_thread_kick(socks[i]);
    }
    tc->base.transport = t;
    tc->base.peer = peer;
    tc->tt = tt;
    tc->n = n;
    tc->socks = socks;
    *out = &tc->base;
    return 0;
}

/* Asks each socket's owner to close it and fail what it carries, waits for
 * that, then frees. */
void tcp_disconnect(struct xfer_conn *c)
{
    struct tcp_conn *tc = container_of(c, struct tcp_conn, base);
    for (int i = 0; i < tc->n; i++) {
        struct tcp_sock *s = tc->socks[i];
        pthread_mutex_lock(&s->th->mu);
        s->close_req = true;
        pthread_mutex_unlock(&s->th->mu);
        tcp_thread_kick(s);
    }
    for (int i = 0; i < tc->n; i++) {
        struct tcp_sock *s = tc->socks[i];
        struct tcp_thread *th = s->th;
        bool released;
        pthread_mutex_lock(&th->mu);
        for (int tries = 0; !s->released && tries < 30; tries++) {
            struct timespec ts = xfer_mono_after_ms(1000);
            pthread_cond_timedwait(&th->cv, &th->mu, &ts);
        }
        released = s->released;
        pthread_mutex_unlock(&th->mu);
        if (released)
            tcp_sock_destroy(s);
        else /* its thread is stuck: leaking beats a use after free */
            xfer_err("tcp: socket %s not released by its thread", s->name);
    }
    free(tc->socks);
    free(tc);
}

/* Dead sockets (cut after io_timeout_ms, reset, EOF) are never reused;
 * the engine replaces the whole connection when all died, or when some died
 * and the live ones are idle (engine/peer_repair.c). */
unsigned tcp_conn_state(struct xfer_conn *c)
{
    struct tcp_conn *tc = container_of(c, struct tcp_conn, base);
    int dead = 0;
    uint64_t load = 0;
    for (int k = 0; k < tc->n; k++) {
        struct tcp_sock *s = tc->socks[k];
        if (__atomic_load_n(&s->dead, __ATOMIC_RELAXED))
            dead++;
        else
            load += __atomic_load_n(&s->load, __ATOMIC_RELAXED);
    }
    unsigned st = load ? XFER_CONN_BUSY : 0;
    if (dead)
        st |= XFER_CONN_SOME_DEAD;
    if (dead == tc->n)
        st |= XFER_CONN_ALL_DEAD;
    return st;
}

/* Least loaded live socket (first_live: the first live one), or NULL. */
static struct tcp_sock *pick_socket(struct tcp_conn *tc, bool first_live)
{
    for (int k = 0; first_live && k < tc->n; k++)
        if (!__atomic_load_n(&tc->socks[k]->dead, __ATOMIC_RELAXED))
            return tc->socks[k];
    unsigned start = __atomic_fetch_add(&tc->next, 1, __ATOMIC_RELAXED);
    struct tcp_sock *best = NULL;
    uint64_t best_load = UINT64_MAX;
    for (int k = 0; k < tc->n; k++) {
        struct tcp_sock *s = tc->socks[(start + (unsigned)k) % (unsigned)tc->n];
        uint64_t load = __atomic_load_n(&s->load, __ATOMIC_RELAXED);
        if (!__atomic_load_n(&s->dead, __ATOMIC_RELAXED) && load < best_load) {
            best = s;
            best_load = load;
        }
    }
    return best;
}

/* Queues t on a live socket; false if every socket is dead. */
bool tcp_enqueue(struct tcp_conn *tc, struct tcp_tx *t, bool *kick, bool first_live)
{
    for (int tries = 0; tries < tc->n; tries++) {
        struct tcp_sock *s = pick_socket(tc, first_live);
        if (!s)
            return false;
        pthread_mutex_lock(&s->qmu);
        bool ok = !s->dead;
        if (ok) {
            if (s->q_tail)
                s->q_tail->next = t;
            else
                s->q_head = t;
            s->q_tail = t;
            s->gpu_seen |= t->gpu;
            __atomic_add_fetch(&s->load, XFER_WIRE_HDR_LEN + t->len, __ATOMIC_RELAXED);
        }
        pthread_mutex_unlock(&s->qmu);
        if (ok) {
            for (int k = 0; k < tc->n; k++)
                if (tc->socks[k] == s)
                    kick[k] = true;
            return true;
        }
    }
    return false;
}

static struct tcp_tx *make_chunk(struct tcp_transport *tt, xfer_batch *b, size_t i,
                                 const struct xfer_item *it, uint64_t off, uint64_t len)
{
    struct tcp_tx *t = calloc(1, sizeof(*t));
    if (!t)
        return NULL;
    uint8_t *local = (uint8_t *)xfer_region_ptr(it->local) + it->local_off + off;
    t->b = b;
    t->idx = i;
    t->len = len;
    t->req_id = __atomic_add_fetch(&tt->next_req, 1, __ATOMIC_RELAXED);
    t->op = it->op == XFER_OP_WRITE ? XFER_WIRE_WRITE_REQ : XFER_WIRE_READ_REQ;
    uint16_t flags = 0;
    if (it->op == XFER_OP_WRITE) { /* the batch's number, for the target's fence */
        t->req_id = (uint64_t)xfer_batch_seq(b) << 32 | (t->req_id & 0xffffffffu);
        flags = XFER_WIRE_F_SEQ;
    }
    if (it->op == XFER_OP_WRITE) {
        t->payload = local;
        t->payload_len = len;
    } else {
        t->local = local;
    }
    t->gslot = -1;
    if (xfer_region_kind(it->local) == XFER_MEM_CUDA) { /* staged (tcp_gpu.c) */
        t->gpu = true;
        t->gdev = xfer_region_device(it->local);
        if (it->op == XFER_OP_WRITE) {
            t->gsrc = local;
            t->payload = NULL;
        }
    }
    struct xfer_wire_hdr h = {.version = XFER_PROTO_VERSION,
                              .op = t->op,
                              .flags = flags,
                              .req_id = t->req_id,
                              .region_id = it->remote_id,
                              .gen = it->remote_gen,
                              .offset = it->remote_off + off,
                              .length = len,
                              .payload = (uint32_t)t->payload_len};
    xfer_wire_encode(&h, t->hdr);
    xfer_batch_hold(b);
    return t;
}

/* GPU memory on either side moves through staging slots of TCP_GPU_SLOT. */
static bool gpu_item(struct tcp_conn *tc, const struct xfer_item *it)
{
    struct xfer_region_brief rd;
    if (xfer_region_kind(it->local) == XFER_MEM_CUDA)
        return true;
    return xfer_peer_region_brief(tc->base.peer, it->remote_id, &rd) == 0 &&
           rd.kind == XFER_MEM_CUDA;
}

/* Splits item i into chunks spread over the sockets; returns how many. */
static uint32_t post_item(struct tcp_conn *tc, xfer_batch *b, size_t i, uint64_t chunk, bool *kick)
{
    const struct xfer_item *it = xfer_batch_item(b, i);
    uint32_t frames = 0;
    if (it->len > UINT64_MAX - it->remote_off) { /* would wrap into a valid range */
        xfer_batch_chunk_done(b, i, 0, -XFER_ERANGE, "remote offset + length overflows");
        return 0;
    }
    if (gpu_item(tc, it) && chunk > TCP_GPU_SLOT)
        chunk = TCP_GPU_SLOT;
    uint64_t off = 0;
    do {
        uint64_t len = it->len - off < chunk ? it->len - off : chunk;
        struct tcp_tx *t = make_chunk(tc->tt, b, i, it, off, len);
        if (!t) {
            xfer_batch_chunk_done(b, i, 0, -XFER_ENOMEM, "out of memory for a chunk");
            return frames;
        }
        if (!tcp_enqueue(tc, t, kick, false)) {
            xfer_batch_chunk_done(b, i, 0, -XFER_ECONN, "every connection to the peer is lost");
            xfer_batch_put(b);
            tcp_tx_free(t);
            return frames;
        }
        frames++;
        off += len;
    } while (off < it->len);
    return frames;
}

int tcp_post(struct xfer_conn *c, xfer_batch *b, const size_t *idx, size_t n)
{
    struct tcp_conn *tc = container_of(c, struct tcp_conn, base);
    bool any = false;
    for (int k = 0; k < tc->n && !any; k++)
        any = !__atomic_load_n(&tc->socks[k]->dead, __ATOMIC_RELAXED);
    if (!any)
        return -XFER_ECONN;
    uint64_t chunk = xfer_engine_config_get(tc->tt->engine)->chunk_bytes;
    chunk = chunk < 4096 ? 4096 : chunk > TCP_MAX_PAYLOAD ? TCP_MAX_PAYLOAD : chunk;
    bool kick[64] = {false};
    uint32_t frames = 0;
    for (size_t k = 0; k < n; k++)
        frames += post_item(tc, b, idx[k], chunk, kick);
    int used = 0, one = -1;
    for (int k = 0; k < tc->n; k++)
        if (kick[k])
            used++, one = k;
    if (used == 1) /* a notification bound to these items may follow them */
        tcp_msg_behind(tc, b, tc->socks[one], idx, n, frames);
    for (int k = 0; k < tc->n; k++) {
        if (!kick[k])
            continue;
        if (!(tc->tt->direct && !tc->socks[k]->target && tcp_sock_send_direct(tc->socks[k])))
            tcp_thread_kick(tc->socks[k]);
    }
    /* All of it on one socket: the waiter may read the answer itself. */
    if (used == 1)
        xfer_batch_wait_hint(b, c, tc->socks[one]);
    else if (used > 1)
        xfer_batch_wait_hint(b, c, NULL);
    return 0;
}
