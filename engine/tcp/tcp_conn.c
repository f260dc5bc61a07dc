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
    int fd = dial(e, d->addr, d->data_port, deadline_ms);
    if (fd < 0)
        return fd;
    bool back = tcp_back_offer(tt, d->node_id, purpose); /* (tcp_back.c) */
    struct xfer_hs_self hs = {cfg->node_id, xfer_engine_incarnation(e), cfg->secret,
                              cfg->secret_len, purpose | (back ? TCP_PURPOSE_BACK : 0)};
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
    snprintf((*out)->peer_node, sizeof((*out)->peer_node), "%s", d->node_id);
    (*out)->peer_hash = tcp_peer_hash((*out)->peer_node);
    (*out)->peer_inc = hp.incarnation;
    (*out)->back_in = back;
    (*out)->solo_ok = tt->solo && tcp_solo_setup(fd);
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
    pthread_mutex_init(&tc->back_mu, NULL);
    tc->base.transport = t;
    tc->base.peer = peer;
    tc->tt = tt;
    tc->peer_hash = tcp_peer_hash(d->node_id);
    tc->n = n;
    tc->socks = socks;
    *out = &tc->base;
    return 0;
}

static bool not_released(const struct tcp_sock *s)
{
    return !s->released;
}

static bool on_kick_list(const struct tcp_sock *s)
{
    return s->kicked;
}

/* Waits on its owner's th->cv while pending(s) (th->mu held for the look),
 * 30 s at most: false if still pending then (its thread is stuck). */
static bool owner_wait(struct tcp_sock *s, bool (*pending)(const struct tcp_sock *))
{
    struct tcp_thread *th = s->th;
    pthread_mutex_lock(&th->mu);
    for (int tries = 0; pending(s) && tries < 30; tries++) {
        struct timespec ts = xfer_mono_after_ms(1000);
        pthread_cond_timedwait(&th->cv, &th->mu, &ts);
    }
    bool ok = !pending(s);
    pthread_mutex_unlock(&th->mu);
    return ok;
}

/* Asks each socket's owner to close it and fail what it carries, waits for
 * that, then frees. */
void tcp_disconnect(struct xfer_conn *c)
{
    struct tcp_conn *tc = container_of(c, struct tcp_conn, base);
    tcp_back_detach(tc); /* messages that went back on the peer's connection */
    for (int i = 0; i < tc->n; i++) {
        struct tcp_sock *s = tc->socks[i];
        pthread_mutex_lock(&s->th->mu);
        s->close_req = true;
        pthread_mutex_unlock(&s->th->mu);
        tcp_thread_kick(s);
    }
    for (int i = 0; i < tc->n; i++) {
        struct tcp_sock *s = tc->socks[i];
        bool released = owner_wait(s, not_released);
        tcp_out_forget(s); /* a notification waiter may poll it */
        /* Released, it may still sit on its owner's kick list (a kick
         * queued before its peer closed it, or a waiter's, gone after
         * tcp_out_forget): serve_kicks takes it off without touching it
         * again; freeing it before that was a use after free
         * (ThreadSanitizer, a peer that died while disconnect asked). */
        if (released && owner_wait(s, on_kick_list))
            tcp_sock_destroy(s);
        else /* its thread is stuck: leaking beats a use after free */
            xfer_err("tcp: socket %s not released by its thread", s->name);
    }
    pthread_mutex_destroy(&tc->back_mu);
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

/* Appends the list head..tail to s's queue, adding load bytes to s->load
 * (taken off as the chunks complete); gpu: it holds GPU chunks. false if s
 * is dead (the list is still the caller's). */
static bool sock_splice(struct tcp_sock *s, struct tcp_tx *head, struct tcp_tx *tail, bool gpu,
                        uint64_t load)
{
    pthread_mutex_lock(&s->qmu);
    bool ok = !s->dead;
    if (ok) {
        if (s->q_tail)
            s->q_tail->next = head;
        else
            s->q_head = head;
        s->q_tail = tail;
        if (gpu)
            __atomic_store_n(&s->gpu_seen, true,
                             __ATOMIC_RELEASE); /* waiter_may reads it unlocked */
        __atomic_add_fetch(&s->load, load, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&s->qmu);
    return ok;
}

bool tcp_sock_append(struct tcp_sock *s, struct tcp_tx *t)
{
    /* a FENCE has no completion to take its load off again */
    uint64_t load = t->op == XFER_WIRE_FENCE ? 0 : XFER_WIRE_HDR_LEN + t->len;
    return sock_splice(s, t, t, t->gpu, load);
}

/* Queues t on a live socket; false if every socket is dead. */
bool tcp_enqueue(struct tcp_conn *tc, struct tcp_tx *t, bool *kick, bool first_live)
{
    for (int tries = 0; tries < tc->n; tries++) {
        struct tcp_sock *s = pick_socket(tc, first_live);
        if (!s)
            return false;
        if (tcp_sock_append(s, t)) {
            for (int k = 0; k < tc->n; k++)
                if (tc->socks[k] == s)
                    kick[k] = true;
            return true;
        }
    }
    return false;
}

/* Fills chunk t of item i (all of it: slab memory is reused unzeroed):
 * [off, off+len) of it, request id req. */
static inline void fill_chunk(struct tcp_transport *tt, struct tcp_tx *t, xfer_batch *b, size_t i,
                              const struct xfer_item *it, uint64_t off, uint64_t len, uint64_t req)
{
    uint8_t *local = (uint8_t *)xfer_region_ptr(it->local) + it->local_off + off;
    *t = (struct tcp_tx){0};
    t->b = b;
    t->idx = i;
    t->len = len;
    t->req_id = req;
    t->op = it->op == XFER_OP_WRITE ? XFER_WIRE_WRITE_REQ : XFER_WIRE_READ_REQ;
    uint16_t flags = 0;
    if (it->op == XFER_OP_WRITE) { /* the batch's number, for the target's fence */
        t->req_id = (uint64_t)xfer_batch_seq(b) << 32 | (t->req_id & 0xffffffffu);
        flags = XFER_WIRE_F_SEQ;
    }
    if (it->op == XFER_OP_WRITE) {
        t->payload = local;
        t->payload_len = len;
        tcp_tx_file(tt, t, it->local, local, len);
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
}

/* Is the peer's region id GPU memory? Remembered for the last id asked
 * (items of a block list come in runs on one region). */
struct gpu_memo {
    bool valid, gpu;
    uint32_t id;
};

/* GPU memory on either side moves through staging slots of TCP_GPU_SLOT. */
static bool gpu_item(struct tcp_conn *tc, const struct xfer_item *it, struct gpu_memo *m)
{
    struct xfer_region_brief rd;
    if (xfer_region_kind(it->local) == XFER_MEM_CUDA)
        return true;
    if (!m->valid || m->id != it->remote_id) {
        m->gpu = xfer_peer_region_brief(tc->base.peer, it->remote_id, &rd) == 0 &&
                 rd.kind == XFER_MEM_CUDA;
        m->id = it->remote_id;
        m->valid = true;
    }
    return m->gpu;
}

/* Chunk size of item it (GPU memory goes through staging slots), 0 when
 * the item cannot be sent. */
static uint64_t item_chunk(struct tcp_conn *tc, const struct xfer_item *it, uint64_t chunk,
                           struct gpu_memo *memo)
{
    if (it->len > UINT64_MAX - it->remote_off) /* would wrap into a valid range */
        return 0;
    /* One chunk either way: no look-up of the peer's region (a lock round
     * and ~150 instructions of a one-item WRITE). */
    if (it->len <= chunk && it->len <= TCP_GPU_SLOT)
        return chunk;
    return gpu_item(tc, it, memo) && chunk > TCP_GPU_SLOT ? TCP_GPU_SLOT : chunk;
}

static size_t n_chunks(uint64_t len, uint64_t chunk)
{
    return len ? (size_t)((len - 1) / chunk + 1) : 1;
}

/* Runs. Small plain items that lie back to back here and at the target
 * (one local region, one remote region and generation, one op and length)
 * go out as one frame: per-frame costs on both sides (header, request id,
 * region check, response, completion) were most of a 4 KiB item's. The
 * target checks the run's whole range; a run it refuses goes again item by
 * item (tcp_run_split), so each item gets the answer it would have had
 * alone. The peer's cached descriptor of the remote region, when it has
 * one of the item's generation, spares such round trips: no run where
 * the op is not allowed, and a run ends where the region does. */
struct run_memo {
    bool valid, ok;
    uint32_t id;
    struct xfer_region_brief rd;
};

static bool run_next(const struct xfer_item *a, uint64_t at, const struct xfer_item *n)
{
    return n->op == a->op && n->local == a->local && n->remote_id == a->remote_id &&
           n->remote_gen == a->remote_gen && n->len == a->len &&
           n->local_off == a->local_off + at && n->remote_off == a->remote_off + at;
}

/* Is item i of b plain and, as its one segment, the next of a's run (at
 * bytes from a's start)? The item's own fields are compared first: that is
 * all a batch of items apart costs. */
static bool run_takes(xfer_batch *b, size_t i, const struct xfer_item *a, uint64_t at)
{
    size_t nseg;
    struct xfer_item seg;
    if (!run_next(a, at, xfer_batch_item(b, i)) || xfer_batch_item_segs(b, i, &nseg) || nseg != 1)
        return false;
    xfer_batch_item_seg(b, i, 0, &seg); /* a block item of one block differs */
    return run_next(a, at, &seg);
}

/* How many items from idx[k] (whose one segment is *a) go as one frame of
 * at most cap bytes: 1 = no run. */
static uint32_t run_items(struct tcp_conn *tc, xfer_batch *b, const size_t *idx, size_t k, size_t n,
                          const struct xfer_item *a, uint64_t cap, struct gpu_memo *gm,
                          struct run_memo *rm)
{
    if (k + 1 >= n || idx[k + 1] != idx[k] + 1 || a->len == 0 || a->len > TCP_RUN_ITEM_MAX ||
        2 * a->len > cap || !run_takes(b, idx[k + 1], a, a->len) || gpu_item(tc, a, gm))
        return 1;
    if (!rm->valid || rm->id != a->remote_id) {
        rm->ok = xfer_peer_region_brief(tc->base.peer, a->remote_id, &rm->rd) == 0;
        rm->id = a->remote_id;
        rm->valid = true;
    }
    unsigned need = a->op == XFER_OP_READ ? XFER_ACCESS_R : XFER_ACCESS_W;
    bool known = rm->ok && rm->rd.gen == a->remote_gen;
    if (known && !(rm->rd.access & need))
        return 1;
    uint64_t m = 2, most = cap / a->len;
    for (size_t j = k + 2; j < n && m < most && idx[j] == idx[k] + m; j++, m++)
        if (!run_takes(b, idx[j], a, m * a->len))
            break;
    if (known && !xfer_range_ok(a->remote_off, m * a->len, rm->rd.len)) /* what fits goes as one: */
        m = a->remote_off < rm->rd.len ? (rm->rd.len - a->remote_off) / a->len
                                       : 1; /* the rest is */
    return m > 1 ? (uint32_t)m : 1;         /* refused item by item */
}

/* Chunks bound for one socket, queued under its qmu once. */
struct sock_list {
    struct tcp_tx *head, *tail;
    uint32_t n;    /* chunks */
    uint64_t load; /* socket's load plus what this post adds; UINT64_MAX: dead */
    uint64_t added;
    bool gpu;
};

/* Hands each socket its list (one qmu lock per socket). Chunks of a socket
 * that died meanwhile go to another live one, or fail. Returns how many
 * were queued. */
static uint32_t splice_lists(struct tcp_conn *tc, struct sock_list *q, bool *kick)
{
    uint32_t queued = 0;
    for (int k = 0; k < tc->n; k++) {
        if (!q[k].head)
            continue;
        struct tcp_sock *s = tc->socks[k];
        if (sock_splice(s, q[k].head, q[k].tail, q[k].gpu, q[k].added)) {
            kick[k] = true;
            queued += q[k].n;
            continue;
        }
        for (struct tcp_tx *t = q[k].head, *next; t; t = next) {
            next = t->next;
            t->next = NULL;
            if (tcp_enqueue(tc, t, kick, false) && ++queued)
                continue;
            for (uint32_t i = 0; i < tcp_tx_items(t); i++) /* a run: each item */
                xfer_batch_chunk_done_put(t->b, t->idx + i, 0, -XFER_ECONN,
                                          "every connection to the peer is lost");
            tcp_tx_free(t);
        }
    }
    return queued;
}

/* A run the target refused goes again item by item on s, so each item gets
 * the answer it would have had alone (a lease rule may cover only some;
 * nothing of the run was written). Its n batch holds pass to the n new
 * chunks. Called by whoever reads s's responses. */
void tcp_run_split(struct tcp_sock *s, struct tcp_tx *t)
{
    uint32_t n = tcp_tx_items(t);
    struct tcp_slab *slab = tcp_slab_get(s->tt, n);
    __atomic_sub_fetch(&s->load, XFER_WIRE_HDR_LEN + t->len, __ATOMIC_RELAXED);
    if (!slab) {
        tcp_chunk_complete(s, t, -XFER_ENOMEM, "out of memory to send a refused run again");
        return;
    }
    uint64_t req = __atomic_fetch_add(&s->tt->next_req, n, __ATOMIC_RELAXED) + 1;
    for (uint32_t k = 0; k < n; k++) {
        struct xfer_item it;
        xfer_batch_item_seg(t->b, t->idx + k, 0, &it);
        struct tcp_tx *c = &slab->tx[k];
        fill_chunk(s->tt, c, t->b, t->idx + k, &it, 0, it.len, req++);
        c->seg = UINT32_MAX;
        c->slab = slab;
        c->next = k + 1 < n ? &slab->tx[k + 1] : NULL;
    }
    slab->refs = (int)n;
    uint64_t load = n * (uint64_t)XFER_WIRE_HDR_LEN + t->len;
    tcp_tx_free(t);
    if (sock_splice(s, slab->tx, &slab->tx[n - 1], false, load)) {
        tcp_thread_kick(s);
        return;
    }
    for (uint32_t k = 0; k < n; k++) { /* s died meanwhile: no load was added */
        struct tcp_tx *c = &slab->tx[k];
        xfer_batch_chunk_done_put(c->b, c->idx, 0, -XFER_ECONN, "connection lost");
        tcp_tx_free(c);
    }
}

/* Queues t on the least loaded live socket of this post (q is rotated by
 * the post's start). */
static void place(struct sock_list *q, int nq, struct tcp_tx *t)
{
    int best = 0;
    for (int j = 1; j < nq; j++)
        if (q[j].load < q[best].load)
            best = j;
    struct sock_list *l = &q[best];
    if (l->tail)
        l->tail->next = t;
    else
        l->head = t;
    l->tail = t;
    l->n++;
    l->gpu |= t->gpu;
    l->load += XFER_WIRE_HDR_LEN + t->len;
    l->added += XFER_WIRE_HDR_LEN + t->len;
}

/* A post of more chunks than this, or of more bytes than this over a
 * connection of several sockets, is left to the progress threads: the
 * submitting thread sends itself only small posts (latency), not bulk. Bulk
 * sent by the submitter put the copies of all sockets on that one thread:
 * 1 MiB x 16 over 4 sockets + 4 threads ran at 5.3 GB/s, 17.1 GB/s when
 * handed off (32-core host, 2026-11-28, docs/perf.md). One socket, or one
 * progress thread for all sockets, keeps it: there the submitter is a second
 * sender, not one in place of several (N=1: handing off measured no gain). */
#define TCP_DIRECT_MAX_CHUNKS 64
#define TCP_DIRECT_MAX_BYTES  (256u << 10)

/* Splits the items into chunks spread over the sockets by least load. All
 * chunks come from one allocation, take their request ids and batch holds
 * at once, and each socket's queue lock is taken once per post. */
int tcp_post(struct xfer_conn *c, xfer_batch *b, const size_t *idx, size_t n)
{
    struct tcp_conn *tc = container_of(c, struct tcp_conn, base);
    struct sock_list q[64];
    bool any = false;
    unsigned start = __atomic_fetch_add(&tc->next, 1, __ATOMIC_RELAXED);
    for (int k = 0; k < tc->n; k++) {
        struct tcp_sock *s = tc->socks[(start + (unsigned)k) % (unsigned)tc->n];
        bool dead = __atomic_load_n(&s->dead, __ATOMIC_RELAXED);
        q[k] = (struct sock_list){0};
        q[k].load = dead ? UINT64_MAX : __atomic_load_n(&s->load, __ATOMIC_RELAXED);
        any |= !dead;
    }
    if (!any)
        return -XFER_ECONN;
    uint64_t chunk = xfer_engine_config_get(tc->tt->engine)->chunk_bytes;
    chunk = chunk < 4096 ? 4096 : chunk > TCP_MAX_PAYLOAD ? TCP_MAX_PAYLOAD : chunk;
    struct gpu_memo memo = {0};
    /* At most this many chunks (each segment's, cut at the smaller of the
     * chunk and a GPU staging slot): the exact count would look each item's
     * memory kind up twice. */
    uint64_t least = chunk < TCP_GPU_SLOT ? chunk : TCP_GPU_SLOT;
    size_t total = 0;
    for (size_t k = 0; k < n; k++) { /* each segment of a vectored item */
        size_t nseg;
        const struct xfer_seg *v = xfer_batch_item_segs(b, idx[k], &nseg);
        if (!v && nseg == 1) {
            total += n_chunks(xfer_batch_item(b, idx[k])->len, least);
            continue;
        }
        for (size_t sg = 0; sg < nseg; sg++) {
            struct xfer_item it;
            if (!v) /* a block item's segments are computed */
                xfer_batch_item_seg(b, idx[k], sg, &it);
            total += n_chunks(v ? v[sg].len : it.len, least);
        }
    }
    struct tcp_slab *slab = total ? tcp_slab_get(tc->tt, total) : NULL;
    if (total && !slab)
        return -XFER_ENOMEM;
    uint64_t req = __atomic_fetch_add(&tc->tt->next_req, total, __ATOMIC_RELAXED) + 1;
    uint64_t run_cap = chunk < TCP_RUN_MAX ? chunk : TCP_RUN_MAX;
    struct run_memo rm = {0};
    size_t used = 0, holds = 0;
    for (size_t k = 0; k < n; k++) {
        size_t nseg;
        bool vec = xfer_batch_item_segs(b, idx[k], &nseg) != NULL;
        for (size_t sg = 0; sg < nseg; sg++) { /* a plain item is its own one segment */
            struct xfer_item seg, *it = &seg;
            xfer_batch_item_seg(b, idx[k], sg, &seg);
            uint64_t ch = item_chunk(tc, it, chunk, &memo), off = 0;
            if (!ch) {
                xfer_batch_chunk_done(b, idx[k], 0, -XFER_ERANGE,
                                      "remote offset + length overflows");
                break;
            }
            if (n_chunks(it->len, ch) > total - used) { /* the peer's region kind changed */
                xfer_batch_chunk_done(b, idx[k], 0, -XFER_ESTALE,
                                      "peer region changed while posting");
                break;
            }
            uint32_t m = vec ? 1 : run_items(tc, b, idx, k, n, it, run_cap, &memo, &rm);
            do {
                uint64_t len = m > 1 ? m * it->len : it->len - off < ch ? it->len - off : ch;
                struct tcp_tx *t = &slab->tx[used++];
                fill_chunk(tc->tt, t, b, idx[k], it, off, len, req++);
                t->nitems = m;
                t->seg = vec ? (uint32_t)sg : UINT32_MAX;
                t->slab = slab;
                place(q, tc->n, t);
                holds += m;
                off += len;
            } while (off < it->len);
            k += m - 1; /* a run took the next items too */
        }
    }
    /* Nothing is queued yet: one batch hold per item a chunk carries, one
     * slab reference per chunk. */
    if (slab && used == 0)
        tcp_slab_free(slab);
    else if (slab)
        slab->refs = (int)used;
    xfer_batch_hold_n(b, (int)holds);
    /* q[k] is socket (start + k) % n: put it back in socket order */
    struct sock_list byk[64];
    uint64_t bytes = 0;
    for (int k = 0; k < tc->n; k++) {
        byk[(start + (unsigned)k) % (unsigned)tc->n] = q[k];
        bytes += q[k].added;
    }
    bool kick[64] = {false};
    uint32_t frames = splice_lists(tc, byk, kick);
    int nsock = 0, one = -1;
    for (int k = 0; k < tc->n; k++)
        if (kick[k])
            nsock++, one = k;
    if (nsock == 1) /* a notification bound to these items may follow them */
        tcp_msg_behind(tc, b, tc->socks[one], idx, n, frames);
    bool direct = tc->tt->direct && used <= TCP_DIRECT_MAX_CHUNKS &&
                  (tc->n == 1 || tc->tt->n_threads == 1 || bytes <= TCP_DIRECT_MAX_BYTES);
    for (int k = 0; k < tc->n; k++) {
        if (!kick[k])
            continue;
        if (!(direct && !tc->socks[k]->target && tcp_sock_send_direct(tc->socks[k], false)))
            tcp_thread_kick(tc->socks[k]);
    }
    /* All of it on one socket: the waiter may read the answer itself. */
    if (nsock == 1)
        xfer_batch_wait_hint(b, c, tc->socks[one]);
    else if (nsock > 1)
        xfer_batch_wait_hint(b, c, NULL);
    return 0;
}
