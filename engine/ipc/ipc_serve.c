/*
 * Owner side of the ipc transport. The owner never copies: for each request
 * it validates id, generation, access and bounds against its own region table
 * (xfer_region_acquire), keeps the region pinned until the initiator says it
 * is done (IPC_REL) or the connection drops, and tells initiators how to
 * reach a region (memfd over SCM_RIGHTS, CMA address, CUDA handle).
 *
 * One accept thread plus one thread per connection: peers are few (one
 * connection per same-host node) and blocking I/O with deadlines keeps a slow
 * peer from stalling the others.
 */
#include "handshake.h"
#include "xfer_io.h"
#include "ipc_serve.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define SLOT_NONE UINT32_MAX

static int slot_alloc(struct serve_conn *c, xfer_region *r, uint32_t *out)
{
    if (c->free_head == SLOT_NONE) {
        uint32_t n = c->nslots ? c->nslots * 2 : 64;
        if (n > (1u << 20))
            return -XFER_ENOSPC; /* a peer pinning a million ranges is misbehaving */
        xfer_region **s = realloc(c->slots, n * sizeof(*s));
        if (!s)
            return -XFER_ENOMEM;
        c->slots = s;
        uint32_t *f = realloc(c->free_next, n * sizeof(*f));
        if (!f)
            return -XFER_ENOMEM;
        c->free_next = f;
        int64_t *t = realloc(c->pinned_ms, n * sizeof(*t));
        if (!t)
            return -XFER_ENOMEM;
        c->pinned_ms = t;
        for (uint32_t i = c->nslots; i < n; i++) {
            s[i] = NULL;
            f[i] = i + 1 < n ? i + 1 : SLOT_NONE;
        }
        c->free_head = c->nslots;
        c->nslots = n;
    }
    uint32_t i = c->free_head;
    c->free_head = c->free_next[i];
    c->slots[i] = r;
    c->pinned_ms[i] = xfer_now_ms();
    *out = i;
    return 0;
}

static int slot_release(struct serve_conn *c, uint32_t i)
{
    if (i >= c->nslots || !c->slots[i])
        return -XFER_EPROTO;
    xfer_region_release(c->slots[i]);
    c->slots[i] = NULL;
    c->free_next[i] = c->free_head;
    c->free_head = i;
    return 0;
}

static int serve_timeout(struct ipc_server *s)
{
    return xfer_engine_config_get(s->engine)->io_timeout_ms;
}

/* A peer holding a pin on a region being deregistered for longer than
 * io_timeout_ms (stopped, hung) would make the deregistration wait for
 * ever, and with it whoever waits on that. Its access is revoked by closing
 * the connection, which releases all its pins; the peer's copies then fail
 * with -XFER_ECONN (it checks the connection before each host copy). */
static bool holds_dying_too_long(struct serve_conn *c)
{
    int64_t now = xfer_now_ms(), lease = serve_timeout(c->srv);
    if (now - c->lease_check_ms < 100 || xfer_engine_regions_dying(c->srv->engine) == 0)
        return false;
    c->lease_check_ms = now;
    for (uint32_t i = 0; i < c->nslots; i++) {
        if (!c->slots[i] || now - c->pinned_ms[i] <= lease || !xfer_region_dying(c->slots[i]))
            continue;
        struct xfer_region_desc d;
        xfer_region_describe(c->slots[i], &d);
        xfer_warn("ipc: a peer has held region %s for %lld ms while it is being deregistered: "
                  "revoking its access (closing its connection)",
                  d.name, (long long)(now - c->pinned_ms[i]));
        return true;
    }
    return false;
}

/* Fills how a peer reaches r; *fd_out is an fd to pass (caller closes) or -1. */
static void describe_reach(xfer_region *r, struct ipc_map_resp *m, int *fd_out)
{
    struct xfer_region_desc d;
    xfer_region_describe(r, &d);
    m->ctl_slot = IPC_SLOT_NONE;
    m->access = d.access;
    m->len = d.len;
    m->addr = (uint64_t)(uintptr_t)xfer_region_ptr(r);
    *fd_out = -1;
    if (xfer_region_kind(r) == XFER_MEM_CUDA) {
        struct ipc_cuda_export ex;
        m->status = ipc_cuda_export(xfer_region_ptr(r), xfer_region_device(r),
                                    xfer_region_cuda_ipc_handle(r), &ex, m->why, sizeof(m->why));
        if (m->status == 0) {
            m->mech = ex.mech;
            memcpy(m->handle, ex.handle, sizeof(m->handle));
            memcpy(m->uuid, ex.uuid, sizeof(m->uuid));
            m->alloc_off = ex.alloc_off;
            m->alloc_len = ex.alloc_len;
            *fd_out = ex.fd;
        }
        return;
    }
    int mfd = xfer_region_memfd(r);
    if (mfd >= 0) {
        m->mech = IPC_MECH_MEMFD;
        /* A peer that may not write gets a read-only fd: the kernel then
         * refuses a writable mapping, whatever the peer's code does. */
        *fd_out = (d.access & XFER_ACCESS_W) ? dup(mfd) : ipc_memfd_reopen_ro(mfd);
        if (*fd_out < 0) {
            m->status = -XFER_EIO;
            snprintf(m->why, sizeof(m->why), "cannot share memfd: %s", strerror(errno));
        }
        return;
    }
    m->mech = IPC_MECH_CMA; /* the peer is a declared tracer (ipc_tracer_add) */
}

static int handle_map(struct serve_conn *c, const struct ipc_hdr *h, const void *buf)
{
    struct ipc_server *s = c->srv;
    struct ipc_map_req q;
    if (ipc_msg_check(h, buf, IPC_MAP_REQ, 1))
        return -XFER_EPROTO;
    memcpy(&q, buf, sizeof(q));
    struct ipc_map_resp m;
    memset(&m, 0, sizeof(m));
    m.ctl_slot = IPC_SLOT_NONE;
    int fd = -1, err = 0;
    if (q.op != XFER_OP_READ && q.op != XFER_OP_WRITE)
        return -XFER_EPROTO;
    xfer_region *r = xfer_region_acquire(s->engine, q.id, q.gen, q.op, 0, 0, &err);
    if (!r) {
        m.status = err;
        snprintf(m.why, sizeof(m.why), "region %u gen %u: %s", q.id, q.gen, xfer_strerror(err));
    } else {
        describe_reach(r, &m, &fd);
        bool lendable = m.mech == IPC_MECH_MEMFD || m.mech == IPC_MECH_CUDA ||
                        m.mech == IPC_MECH_CUMEM; /* GPU loans: ipc_dgpu.c */
        m.ctl_slot = m.status == 0 && lendable && c->loans_up
                         ? ipc_loan_add(&c->loans, s->engine, r, q.id, q.gen)
                         : IPC_SLOT_NONE;
        xfer_region_release(r);
        if (m.status == 0 && m.mech != IPC_MECH_CMA && c->nmapped < IPC_MAP_TRACK)
            c->mapped[c->nmapped++] = (struct ipc_revoked){q.id, q.gen};
    }
    m.has_fd = fd >= 0;
    int rc = ipc_send(c->fd, IPC_MAP_RESP, 1, &m, sizeof(m), fd, serve_timeout(s));
    if (fd >= 0)
        close(fd);
    return rc;
}

/* At most every 100 ms: which regions this peer has mapped are gone? */
static uint32_t find_revoked(struct serve_conn *c, struct ipc_revoked *gone)
{
    int64_t now = xfer_now_ms();
    if (c->nmapped == 0 || now - c->revoke_check_ms < 100)
        return 0;
    c->revoke_check_ms = now;
    uint32_t n = 0;
    for (uint32_t i = 0; i < c->nmapped && n < IPC_REVOKED_MAX;) {
        int err = 0;
        xfer_region *r = xfer_region_acquire(c->srv->engine, c->mapped[i].id, c->mapped[i].gen,
                                             XFER_OP_READ, 0, 0, &err);
        if (r)
            xfer_region_release(r);
        if (err == -XFER_ENOENT || err == -XFER_ESTALE) {
            gone[n++] = c->mapped[i];
            c->mapped[i] = c->mapped[--c->nmapped];
        } else {
            i++;
        }
    }
    return n;
}

/* Sends count answers of each bytes in out (room behind them for
 * IPC_REVOKED_MAX records): revocations ride on the answer. */
static int send_answers(struct serve_conn *c, uint16_t type, uint32_t count, void *out, size_t each)
{
    struct ipc_revoked gone[IPC_REVOKED_MAX];
    uint32_t ngone = find_revoked(c, gone);
    memcpy((char *)out + count * each, gone, ngone * sizeof(gone[0]));
    return ipc_send(c->fd, type, count, out, (uint32_t)(count * each + ngone * sizeof(gone[0])), -1,
                    serve_timeout(c->srv));
}

/* Segment lists of vectored items: each record's checks under one lock
 * and one pin, on the list's hull (xfer_region_acquire_hull_by) or on each
 * range (xfer_region_acquire_segs_by: a refusal names the segment). */
static int handle_acquire_vec(struct serve_conn *c, const struct ipc_hdr *h, const void *buf)
{
    struct ipc_server *s = c->srv;
    if (ipc_msg_check(h, buf, IPC_ACQV_REQ, 0))
        return -XFER_EPROTO;
    struct {
        struct ipc_acqv_resp r[IPC_BATCH_MAX];
        struct ipc_revoked gone[IPC_REVOKED_MAX];
    } reply;
    const char *at = buf;
    for (uint32_t i = 0; i < h->count; i++) {
        const struct ipc_acqv_req *q = (const void *)at;
        const struct xfer_range *v = (const void *)(at + sizeof(*q));
        const struct ipc_acqv_hull *hl = (const void *)(at + sizeof(*q));
        at += sizeof(*q) + (q->nseg == IPC_ACQV_HULL ? sizeof(*hl) : q->nseg * sizeof(*v));
        struct ipc_acqv_resp *o = &reply.r[i];
        *o = (struct ipc_acqv_resp){.slot = SLOT_NONE, .bad = UINT32_MAX};
        size_t bad = SIZE_MAX;
        int err = -XFER_EINVAL;
        bool list = false, rw = q->op == XFER_OP_READ || q->op == XFER_OP_WRITE;
        xfer_region *r = NULL;
        if (rw && q->nseg == IPC_ACQV_HULL)
            r = xfer_region_acquire_hull_by(s->engine, c->peer_node, q->id, q->gen, q->op, hl->off,
                                            hl->len, &list, &err);
        else if (rw)
            r = xfer_region_acquire_segs_by(s->engine, c->peer_node, q->id, q->gen, q->op, v,
                                            q->nseg, &bad, &err);
        if (r && (err = slot_alloc(c, r, &o->slot)) < 0)
            xfer_region_release(r);
        o->status = err;
        o->flags = list ? IPC_ACQV_NEED_LIST : 0;
        o->bad = bad < q->nseg ? (uint32_t)bad : UINT32_MAX;
        if (list)
            continue; /* counted when the ranges come */
        uint64_t bytes = q->nseg == IPC_ACQV_HULL ? hl->bytes : 0;
        for (uint32_t k = 0; !err && q->nseg != IPC_ACQV_HULL && k < q->nseg; k++)
            bytes += v[k].len;
        xfer_engine_count_served(s->engine, XFER_TRANSPORT_IPC, err ? 0 : bytes, err);
    }
    return send_answers(c, IPC_ACQV_RESP, h->count, reply.r, sizeof(reply.r[0]));
}

static int handle_acquire(struct serve_conn *c, const struct ipc_hdr *h, const void *buf)
{
    struct ipc_server *s = c->srv;
    if (ipc_msg_check(h, buf, IPC_ACQ_REQ, 0))
        return -XFER_EPROTO;
    struct {
        struct ipc_acq_resp r[IPC_BATCH_MAX];
        struct ipc_revoked gone[IPC_REVOKED_MAX];
    } reply;
    struct ipc_acq_resp *out = reply.r;
    const struct ipc_acq_req *q = buf;
    for (uint32_t i = 0; i < h->count; i++) {
        int err = 0;
        out[i].slot = SLOT_NONE;
        if (q[i].op != XFER_OP_READ && q[i].op != XFER_OP_WRITE) {
            out[i].status = -XFER_EINVAL;
            continue;
        }
        xfer_region *r = xfer_region_acquire_by(s->engine, c->peer_node, q[i].id, q[i].gen, q[i].op,
                                                q[i].off, q[i].len, &err);
        if (r && (err = slot_alloc(c, r, &out[i].slot)) < 0)
            xfer_region_release(r);
        out[i].status = err;
        xfer_engine_count_served(s->engine, XFER_TRANSPORT_IPC, err ? 0 : q[i].len, err);
    }
    return send_answers(c, IPC_ACQ_RESP, h->count, out, sizeof(out[0]));
}

static int handle_release(struct serve_conn *c, const struct ipc_hdr *h, const void *buf)
{
    if (ipc_msg_check(h, buf, IPC_REL, 0))
        return -XFER_EPROTO;
    const uint32_t *slot = buf;
    for (uint32_t i = 0; i < h->count; i++)
        if (slot_release(c, slot[i]) < 0)
            return -XFER_EPROTO;
    return 0;
}

/* An engine message: handed to the engine, its answer sent back. */
static int handle_msg(struct serve_conn *c, const struct ipc_hdr *h, const void *buf)
{
    int32_t st = xfer_engine_msg_recv(c->srv->engine, c->peer_node, c->peer_inc, buf, h->bytes);
    return ipc_send(c->fd, IPC_MSG_RESP, 1, &st, sizeof(st), -1, serve_timeout(c->srv));
}

static int conn_handshake(struct serve_conn *c)
{
    struct ipc_server *s = c->srv;
    const struct xfer_engine_config *cfg = xfer_engine_config_get(s->engine);
    struct xfer_hs_self self = {.node_id = s->node_id,
                                .incarnation = s->incarnation,
                                .secret = cfg->secret,
                                .secret_len = cfg->secret_len};
    struct xfer_hs_peer peer;
    char why[256] = "";
    /* Without a secret, only our own uid may reach our memory (the rule the
     * kernel applies to cross-memory attach anyway). */
    struct ucred cred;
    socklen_t clen = sizeof(cred);
    if (!cfg->secret &&
        (getsockopt(c->fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) < 0 || cred.uid != geteuid())) {
        xfer_warn("ipc: refused a connection from uid %d: not ours and no secret configured",
                  (int)cred.uid);
        return -XFER_EAUTH;
    }
    int rc = xfer_handshake_server(c->fd, &self, cfg->connect_timeout_ms, &peer, why, sizeof(why));
    if (rc < 0) {
        xfer_warn("ipc: refused a connection: %s", why);
        return rc;
    }
    snprintf(c->peer_node, sizeof(c->peer_node), "%s", peer.node_id);
    c->peer_inc = peer.incarnation;
    struct ipc_hello hello = {.pid = getpid(),
                              .probe_len = sizeof(s->probe_cookie),
                              .probe_addr = (uint64_t)(uintptr_t)s->probe_cookie};
    memcpy(hello.probe_cookie, s->probe_cookie, sizeof(hello.probe_cookie));
    pid_t pid = ipc_sock_peer_pid(c->fd);
    c->pid = pid > 0 ? pid : -1; /* -1: a peer we cannot name */
    ipc_tracer_add(c->pid);      /* the peer probes CMA right after HELLO */
    /* The control page of direct copies travels with HELLO; its slots are
     * only ever used for loans made under c->loans.mu. */
    pthread_mutex_lock(&s->mu);
    c->loans_up = ipc_loans_init(&c->loans, c->fd, serve_timeout(s)) == 0;
    pthread_mutex_unlock(&s->mu);
    hello.ctl_slots = c->loans_up ? IPC_CTL_SLOTS : 0;
    hello.flags = s->ring_ok ? IPC_HELLO_RING : 0;
    rc = ipc_send(c->fd, IPC_HELLO, 1, &hello, sizeof(hello), c->loans_up ? c->loans.ctl_fd : -1,
                  cfg->connect_timeout_ms);
    if (c->loans_up) {
        close(c->loans.ctl_fd);
        c->loans.ctl_fd = -1;
    }
    return rc;
}

int ipc_serve_one(struct serve_conn *c)
{
    struct ipc_hdr h;
    c->served++;
    int fd = -1; /* only IPC_RING_REQ carries one */
    int rc = ipc_recv(c->fd, &h, c->buf, (uint32_t)c->buf_max, &fd, serve_timeout(c->srv));
    if (rc == -XFER_EPROTO)
        xfer_warn("ipc: malformed message from peer %s (bad magic or version, or %u bytes "
                  "over the limit of %zu), closing",
                  c->peer_node, h.bytes, c->buf_max);
    if (rc < 0)
        return rc;
    switch (h.type) {
    case IPC_RING_REQ:
        rc = ipc_msg_check(&h, c->buf, IPC_RING_REQ, 0);
        if (rc == 0)
            rc = ipc_serve_ring_setup(c, fd);
        fd = -1;
        break;
    case IPC_RING_BELL: /* frames wait in the ring: serve them all */
        rc = ipc_msg_check(&h, c->buf, IPC_RING_BELL, 0);
        if (rc == 0 && c->ring_up) {
            ipc_ring_bell_taken(&c->ring);
            rc = ipc_serve_ring(c);
        }
        break;
    case IPC_MAP_REQ:
        rc = handle_map(c, &h, c->buf);
        break;
    case IPC_ACQ_REQ:
        rc = handle_acquire(c, &h, c->buf);
        break;
    case IPC_ACQV_REQ:
        rc = handle_acquire_vec(c, &h, c->buf);
        break;
    case IPC_REL:
        rc = handle_release(c, &h, c->buf);
        break;
    case IPC_MSG_REQ:
        rc = handle_msg(c, &h, c->buf);
        break;
    default:
        rc = -XFER_EPROTO;
    }
    if (fd >= 0)
        close(fd);
    if (rc == -XFER_EPROTO)
        xfer_warn("ipc: malformed message (type %u) from peer %s, closing", h.type, c->peer_node);
    return rc;
}

static void *conn_main(void *arg)
{
    struct serve_conn *c = arg;
    struct ipc_server *s = c->srv;
    /* Big enough for the largest request: an ACQ of IPC_BATCH_MAX records,
     * an ACQV of IPC_ACQV_SEGS_MAX segments or an engine message frame. */
    size_t max = IPC_BATCH_MAX * sizeof(struct ipc_acq_req);
    if (max < XFER_MSG_FRAME_MAX)
        max = XFER_MSG_FRAME_MAX;
    if (max < IPC_ACQV_BYTES_MAX)
        max = IPC_ACQV_BYTES_MAX;
    c->buf = malloc(max);
    c->buf_max = max;
    int rc = c->buf ? conn_handshake(c) : -XFER_ENOMEM;
    pthread_mutex_lock(&s->mu);
    c->ready = rc == 0; /* waiters may read it from now on */
    pthread_mutex_unlock(&s->mu);
    while (rc == 0) {
        pthread_mutex_lock(&s->mu);
        bool stop = s->stopping;
        pthread_mutex_unlock(&s->mu);
        if (stop)
            break;
        pthread_mutex_lock(&c->rx_mu);
        bool revoke = holds_dying_too_long(c);
        pthread_mutex_unlock(&c->rx_mu);
        if (revoke) {
            rc = -XFER_ECONN;
            break;
        }
        rc = ipc_rx_serve_step(c, 500);
    }
    ipc_rx_close(c, rc); /* no waiter reads it from now on */
    pthread_mutex_lock(&s->mu);
    bool stopping = s->stopping;
    pthread_mutex_unlock(&s->mu);
    /* This engine stops: after the last answer (a waiter may be sending
     * one: rx_mu), tell the peer the close is orderly (IPC_BYE), so that it
     * does not report a lost connection. */
    pthread_mutex_lock(&c->rx_mu);
    if (stopping && c->peer_node[0] && ipc_send(c->fd, IPC_BYE, 0, NULL, 0, -1, 100) < 0)
        xfer_debug("ipc: no BYE to %s", c->peer_node);
    pthread_mutex_unlock(&c->rx_mu);
    /* Loans go before pins: a peer still copying directly must be done. */
    if (c->loans_up)
        ipc_loans_withdraw_all(&c->loans);
    for (uint32_t i = 0; i < c->nslots; i++)
        if (c->slots[i])
            slot_release(c, i);
    shutdown(c->fd, SHUT_RDWR);
    if (c->pid)
        ipc_tracer_remove(c->pid); /* a peer that went is no tracer any more */
    pthread_mutex_lock(&s->mu);
    c->done = true;
    pthread_cond_broadcast(&s->done_cv);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* c's thread ended (joined): frees c. */
static void conn_free(struct serve_conn *c)
{
    while (__atomic_load_n(&c->pins, __ATOMIC_ACQUIRE) > 0) {
        /* a waiter still holds it: its poll ends within its slice (the
         * socket is shut down), then it finds the connection over */
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    ipc_rx_fini(c);
    ipc_ring_unmap(&c->ring);
    free(c->buf);
    if (c->loans_up)
        ipc_loans_fini(&c->loans);
    close(c->fd);
    free(c->slots);
    free(c->pinned_ms);
    free(c->free_next);
    free(c);
}

/* How long a closing engine lets a serving thread finish the request it
 * already read (its answer included) before its socket is cut for writing
 * too: a sender whose notification was queued here learns so even when
 * this engine closes at once on reading it (docs/notify.md, "Closing right
 * after a notification"). Only a peer that reads nothing makes a close
 * wait this long. */
#define STOP_ANSWER_GRACE_MS 1000

/* Joins c's thread; with until (a closing engine), the thread may answer
 * until then (its socket shut down for reading: a thread waiting for a
 * request wakes, one answering still sends), then its socket is shut down
 * for writing too (wakes a thread blocked sending to a peer that does not
 * read). */
static void conn_join(struct serve_conn *c, const struct timespec *until)
{
    /* A timed wait for done, then a plain join (the thread is at its end):
     * not pthread_clockjoin_np, which ThreadSanitizer does not know as a
     * join (every free after it was reported as a race). */
    if (until) {
        struct ipc_server *s = c->srv;
        pthread_mutex_lock(&s->mu);
        while (!c->done && pthread_cond_timedwait(&s->done_cv, &s->mu, until) == 0)
            ;
        bool done = c->done;
        pthread_mutex_unlock(&s->mu);
        if (!done)
            shutdown(c->fd, SHUT_RDWR);
    }
    pthread_join(c->thread, NULL);
}

/* Joins finished connection threads; with all, stops and joins every one. */
static void reap_conns(struct ipc_server *s, bool all)
{
    pthread_mutex_lock(&s->mu);
    struct serve_conn **pp = &s->conns, *gone = NULL;
    while (*pp) {
        struct serve_conn *c = *pp;
        if (all || (c->done && __atomic_load_n(&c->pins, __ATOMIC_ACQUIRE) == 0)) {
            *pp = c->next;
            c->next = gone;
            gone = c;
            if (all) /* wakes a thread waiting for a request (conn_join) */
                shutdown(c->fd, SHUT_RD);
        } else {
            pp = &c->next;
        }
    }
    pthread_mutex_unlock(&s->mu);
    struct timespec until = xfer_mono_after_ms(STOP_ANSWER_GRACE_MS);
    while (gone) {
        struct serve_conn *c = gone;
        gone = c->next;
        conn_join(c, all ? &until : NULL);
        conn_free(c);
    }
}

static void accept_one(struct ipc_server *s)
{
    int fd = accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0)
        return;
    struct serve_conn *c = calloc(1, sizeof(*c));
    if (!c) {
        close(fd);
        return;
    }
    c->srv = s;
    c->fd = fd;
    c->free_head = SLOT_NONE;
    if (ipc_rx_init(c) < 0) {
        close(fd);
        free(c);
        return;
    }
    pthread_mutex_lock(&s->mu);
    if (pthread_create(&c->thread, NULL, conn_main, c) != 0) {
        pthread_mutex_unlock(&s->mu);
        ipc_rx_fini(c);
        close(fd);
        free(c);
        return;
    }
    c->next = s->conns;
    s->conns = c;
    pthread_mutex_unlock(&s->mu);
}

static void *accept_main(void *arg)
{
    struct ipc_server *s = arg;
    for (;;) {
        struct pollfd p[2] = {{.fd = s->listen_fd, .events = POLLIN},
                              {.fd = s->stop_fd, .events = POLLIN}};
        int n = poll(p, 2, 1000);
        if (n < 0 && errno != EINTR)
            break;
        if (p[1].revents)
            break;
        if (n > 0 && (p[0].revents & POLLIN))
            accept_one(s);
        reap_conns(s, false);
    }
    return NULL;
}

struct ipc_server *ipc_server_start(xfer_engine *e, const char *node_id, uint64_t incarnation,
                                    int *err, char *why, size_t why_len)
{
    struct ipc_server *s = calloc(1, sizeof(*s));
    if (!s) {
        *err = -XFER_ENOMEM;
        return NULL;
    }
    s->engine = e;
    snprintf(s->node_id, sizeof(s->node_id), "%s", node_id);
    s->incarnation = incarnation;
    s->linger_us = 200; /* ipc_serve_rx.c, "Linger" */
    const char *lg = getenv("XFER_IPC_LINGER_US");
    if (lg && *lg)
        s->linger_us = (int)strtol(lg, NULL, 10) < 0 ? 0 : (int)strtol(lg, NULL, 10);
    if (s->linger_us > 1000000)
        s->linger_us = 1000000;
    s->ring_ok = ipc_ring_enabled();
    if (getrandom(s->probe_cookie, sizeof(s->probe_cookie), 0) != sizeof(s->probe_cookie))
        memset(s->probe_cookie, 0x5a, sizeof(s->probe_cookie));
    pthread_mutex_init(&s->mu, NULL);
    xfer_cond_init_mono(&s->done_cv);
    s->stop_fd = eventfd(0, EFD_CLOEXEC);
    s->listen_fd = ipc_sock_listen(node_id, incarnation, why, why_len);
    if (s->stop_fd < 0 || s->listen_fd < 0) {
        *err = s->listen_fd < 0 ? s->listen_fd : -XFER_EIO;
        goto out_close;
    }
    if (pthread_create(&s->accept_thread, NULL, accept_main, s) != 0) {
        *err = -XFER_ENOMEM;
        snprintf(why, why_len, "cannot start the ipc accept thread");
        goto out_close;
    }
    return s;
out_close:
    if (s->listen_fd >= 0)
        close(s->listen_fd);
    if (s->stop_fd >= 0)
        close(s->stop_fd);
    pthread_cond_destroy(&s->done_cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
    return NULL;
}

void ipc_server_region_withdraw(struct ipc_server *s, xfer_region *r)
{
    pthread_mutex_lock(&s->mu);
    for (struct serve_conn *c = s->conns; c; c = c->next)
        if (c->loans_up)
            ipc_loans_withdraw(&c->loans, r);
    pthread_mutex_unlock(&s->mu);
}

void ipc_server_stop(struct ipc_server *s)
{
    if (!s)
        return;
    uint64_t one = 1;
    if (write(s->stop_fd, &one, sizeof(one)) < 0)
        xfer_warn("ipc: cannot wake the accept thread: %s", strerror(errno));
    pthread_join(s->accept_thread, NULL);
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    pthread_mutex_unlock(&s->mu);
    reap_conns(s, true);
    close(s->listen_fd);
    close(s->stop_fd);
    pthread_cond_destroy(&s->done_cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
}
