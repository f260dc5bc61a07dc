/*
 * The tcpx progress thread: control frames, plugin requests and their
 * completions, for every link of the transport. Only this thread makes
 * data-path plugin calls (isend, irecv, test, iflush, irecvConsumed).
 *
 * Initiators never let the plugin touch an item's local memory: a WRITE is
 * copied into a staging slot (inside xfer_batch_io_begin/io_end) before it
 * is sent, a READ lands in a slot (or, in unpack mode, in the plugin's
 * bounce buffer) and is copied out under io_begin. So cancellation and
 * deadlines never wait for the plugin; a cancelled chunk still runs its
 * plugin request to the end so both sides stay in step.
 */
#include "xfer_grow.h"
#include "tcpx.h"
#include "xfer_io.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define TCPX_SPINS 200 /* idle rounds with requests in flight before napping */

/* ---- control socket ------------------------------------------------------------- */

void tcpx_ctrl_queue(struct tcpx_link *l, const struct xfer_wire_hdr *h, const void *payload,
                     size_t len)
{
    size_t need = l->tx_len + XFER_WIRE_HDR_LEN + len;
    if (xfer_grow((void **)&l->tx, &l->tx_cap, need, 1, 64 * XFER_WIRE_HDR_LEN)) {
        tcpx_link_fail(l, -XFER_ENOMEM, "out of memory for a control frame");
        return;
    }
    xfer_wire_encode(h, l->tx + l->tx_len);
    l->tx_len += XFER_WIRE_HDR_LEN;
    if (len)
        memcpy(l->tx + l->tx_len, payload, len);
    l->tx_len += len;
}

static bool ctrl_flush(struct tcpx_link *l)
{
    bool moved = false;
    while (l->fd >= 0 && l->tx_off < l->tx_len) {
        ssize_t n =
            send(l->fd, l->tx + l->tx_off, l->tx_len - l->tx_off, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                tcpx_link_fail(l, -XFER_ECONN, strerror(errno));
            break;
        }
        l->tx_off += (size_t)n;
        moved = true;
    }
    if (l->tx_off == l->tx_len)
        l->tx_off = l->tx_len = 0;
    return moved;
}

static void served(struct tcpx_link *l, uint64_t bytes, int status)
{
    xfer_engine_count_served(l->tt->engine, XFER_TRANSPORT_TCPX, bytes, status);
    if (status < 0)
        xfer_debug("tcpx: refused request from %s: %s", l->name, xfer_strerror(status));
}

/* ---- plugin requests ------------------------------------------------------------- */

static void req_queue(struct tcpx_link *l, struct tcpx_req *r)
{
    struct tcpx_req **head = r->kind == REQ_SEND ? &l->sq_head : &l->rq_head;
    struct tcpx_req **tail = r->kind == REQ_SEND ? &l->sq_tail : &l->rq_tail;
    r->next = NULL;
    r->preq = NULL;
    r->done = false;
    r->got = 0;
    r->err = 0;
    if (*tail)
        (*tail)->next = r;
    else
        *head = r;
    *tail = r;
}

static void req_unlink(struct tcpx_link *l, struct tcpx_req *r)
{
    struct tcpx_req **head = r->kind == REQ_SEND ? &l->sq_head : &l->rq_head;
    struct tcpx_req **tail = r->kind == REQ_SEND ? &l->sq_tail : &l->rq_tail;
    struct tcpx_req *prev = NULL;
    for (struct tcpx_req *q = *head; q; prev = q, q = q->next) {
        if (q != r)
            continue;
        if (prev)
            prev->next = q->next;
        else
            *head = q->next;
        if (*tail == q)
            *tail = prev;
        return;
    }
}

static void owner_req_done(struct tcpx_link *l, struct tcpx_req *r);
static bool has_work(const struct tcpx_link *l);

/* Posts the unposted requests of a queue, in order; a plugin that says
 * "not now" (NULL request) is asked again next round. */
static bool post_queue(struct tcpx_link *l, struct tcpx_req *q)
{
    struct tcpx_net *n = l->tt->net;
    bool moved = false;
    for (; q && l->fd >= 0; q = q->next) {
        if (q->preq || q->done)
            continue;
        int r = q->kind == REQ_SEND
                    ? tcpx_net_isend(n, l->send_comm, q->buf, q->len, TCPX_TAG, q->mh, &q->preq)
                    : tcpx_net_irecv(n, l->recv_comm, q->buf, q->len, TCPX_TAG, q->mh, &q->preq);
        if (r != 0) {
            char why[128];
            snprintf(why, sizeof(why), "plugin %s failed: %s",
                     q->kind == REQ_SEND ? "isend" : "irecv", tcpx_net_result_str(r));
            tcpx_link_fail(l, -XFER_EIO, why);
            return true;
        }
        if (!q->preq)
            break;
        if (q->kind == REQ_RECV)
            q->seq = l->recv_seq++;
        moved = true;
    }
    return moved;
}

static bool test_queue(struct tcpx_link *l, struct tcpx_req *q)
{
    struct tcpx_net *n = l->tt->net;
    bool moved = false;
    while (q && l->fd >= 0) {
        struct tcpx_req *next = q->next;
        if (!q->preq)
            break;
        int done = 0, size = 0;
        int r = tcpx_net_test(n, q->preq, &done, &size);
        if (r != 0) {
            char why[128];
            snprintf(why, sizeof(why), "plugin test of a %s failed: %s",
                     q->kind == REQ_SEND ? "send" : "receive", tcpx_net_result_str(r));
            tcpx_link_fail(l, -XFER_EIO, why);
            return true;
        }
        if (done) {
            q->done = true;
            q->got = size;
            moved = true;
            req_unlink(l, q);
            owner_req_done(l, q);
            if (l->fd < 0)
                return true;
        }
        q = next;
    }
    return moved;
}

/* ---- initiator --------------------------------------------------------------------- */

static void chunk_free(struct tcpx_link *l, struct tcpx_chunk *c, int status, const char *why)
{
    tcpx_mem_slot_put(c->slot);
    __atomic_sub_fetch(&l->load, 1, __ATOMIC_RELAXED);
    if (status < 0 && c->seg != UINT32_MAX)
        xfer_batch_seg_fail(c->b, c->idx, c->seg, status, why);
    else
        xfer_batch_chunk_done(c->b, c->idx, status == 0 ? c->len : 0, status, why);
    xfer_batch_put(c->b);
    free(c);
}

static void inflight_unlink(struct tcpx_link *l, struct tcpx_chunk *c)
{
    for (struct tcpx_chunk **pp = &l->inflight; *pp; pp = &(*pp)->next)
        if (*pp == c) {
            *pp = c->next;
            l->n_inflight--;
            return;
        }
}

/* A READ's data is in: copy it out (or unpack it) into local memory if the
 * item still wants it. Returns the chunk's status. */
static int read_land(struct tcpx_link *l, struct tcpx_chunk *c, char *why, size_t wl)
{
    bool live = xfer_batch_io_begin(c->b, c->idx);
    int rc;
    if (l->unpack)
        rc = tcpx_unpack(l, &c->req, live ? c->local : NULL, why, wl);
    else
        rc = live ? tcpx_copy(c->local, c->slot->buf, c->len) : 0;
    if (live)
        xfer_batch_io_end(c->b, c->idx);
    if (rc && !why[0])
        snprintf(why, wl, "copying the received data into place failed");
    return rc;
}

static void chunk_maybe_done(struct tcpx_link *l, struct tcpx_chunk *c)
{
    if (!c->req.done || !c->resp)
        return;
    char why[160] = "";
    int st = c->status;
    if (st < 0)
        snprintf(why, sizeof(why), "target %s refused: %s", l->name, xfer_strerror(st));
    if (c->op == XFER_WIRE_READ_REQ) {
        uint64_t want = st == 0 ? c->len : 0;
        if ((uint64_t)c->req.got != want) {
            snprintf(why, sizeof(why), "plugin delivered %d bytes for a %llu-byte receive",
                     c->req.got, (unsigned long long)want);
            st = -XFER_EPROTO;
            if (l->unpack) /* the pages still go back */
                tcpx_unpack(l, &c->req, NULL, NULL, 0);
        } else if (st == 0) {
            st = read_land(l, c, why, sizeof(why));
        } else if (l->unpack) {
            tcpx_unpack(l, &c->req, NULL, NULL, 0);
        }
    }
    inflight_unlink(l, c);
    chunk_free(l, c, st, why[0] ? why : NULL);
}

static int local_device(xfer_region *r)
{
    return xfer_region_kind(r) == XFER_MEM_CUDA ? xfer_region_device(r) : -1;
}

/* Starts queued chunks while the window has room. */
static bool start_chunks(struct tcpx_link *l)
{
    bool moved = false;
    while (l->n_inflight < TCPX_WINDOW && l->fd >= 0) {
        pthread_mutex_lock(&l->qmu);
        struct tcpx_chunk *c = l->q_head;
        if (c && !(l->q_head = c->next))
            l->q_tail = NULL;
        pthread_mutex_unlock(&l->qmu);
        if (!c)
            break;
        moved = true;
        const struct xfer_item *it = xfer_batch_item(c->b, c->idx);
        if (!xfer_batch_item_live(c->b, c->idx)) {
            chunk_free(l, c, -XFER_ECANCELED, "item ended before it was sent");
            continue;
        }
        char why[160] = "";
        c->slot = tcpx_mem_slot(l, local_device(it->local), why, sizeof(why));
        if (!c->slot) {
            chunk_free(l, c, -XFER_ENOTSUP, why);
            continue;
        }
        bool write = c->op == XFER_WIRE_WRITE_REQ;
        if (write) {
            if (!xfer_batch_io_begin(c->b, c->idx)) {
                chunk_free(l, c, -XFER_ECANCELED, "item ended before it was sent");
                continue;
            }
            int rc = tcpx_copy(c->slot->buf, c->local, c->len);
            xfer_batch_io_end(c->b, c->idx);
            if (rc) {
                chunk_free(l, c, rc, "copying local memory into a staging buffer failed");
                continue;
            }
        }
        c->req = (struct tcpx_req){.kind = write ? REQ_SEND : REQ_RECV,
                                   .buf = c->slot->buf,
                                   .len = c->len,
                                   .mh = write ? c->slot->mh_send : c->slot->mh_recv,
                                   .owner = c};
        req_queue(l, &c->req);
        struct xfer_wire_hdr h = {.version = XFER_PROTO_VERSION,
                                  .op = c->op,
                                  .req_id = c->req_id,
                                  .region_id = c->region_id,
                                  .gen = c->gen,
                                  .offset = c->remote_off,
                                  .length = c->len,
                                  .payload = write ? (uint32_t)c->len : 0};
        tcpx_ctrl_queue(l, &h, NULL, 0);
        c->next = l->inflight;
        l->inflight = c;
        l->n_inflight++;
    }
    return moved;
}

static void on_response(struct tcpx_link *l, const struct xfer_wire_hdr *h)
{
    if (h->op == XFER_WIRE_MSG_RESP) {
        tcpx_msg_response(l, h);
        return;
    }
    struct tcpx_chunk *c = l->inflight;
    while (c && c->req_id != h->req_id)
        c = c->next;
    if (!c || h->op != c->op + 1 || c->resp ||
        (h->op == XFER_WIRE_READ_RESP && h->status == 0 && h->length != c->len)) {
        tcpx_link_fail(l, -XFER_EPROTO, "response matches no request in flight");
        return;
    }
    c->resp = true;
    c->status = h->status;
    chunk_maybe_done(l, c);
}

/* ---- target -------------------------------------------------------------------------- */

static void serve_free(struct tcpx_link *l, struct tcpx_serve *s)
{
    for (struct tcpx_serve **pp = &l->serving; *pp; pp = &(*pp)->next)
        if (*pp == s) {
            *pp = s->next;
            l->n_serving--;
            break;
        }
    if (s->r)
        xfer_region_release(s->r);
    tcpx_mem_slot_put(s->slot);
    free(s);
}

static void respond(struct tcpx_link *l, struct tcpx_serve *s, int status)
{
    struct xfer_wire_hdr h = s->h;
    h.op = s->h.op + 1;
    h.status = status;
    h.payload = h.op == XFER_WIRE_READ_RESP && status == 0 ? (uint32_t)s->h.length : 0;
    tcpx_ctrl_queue(l, &h, NULL, 0);
    served(l, status == 0 ? s->h.length : 0, status);
}

/* Where the plugin reads or writes for s: the region itself when the plugin
 * takes that memory, else a staging slot. 0 or an error (s->status). */
static int serve_buffer(struct tcpx_link *l, struct tcpx_serve *s, bool send, char *why, size_t wl)
{
    void *ms = NULL, *mr = NULL;
    if (s->r && tcpx_mem_direct(l, xfer_region_kind(s->r))) {
        int rc = tcpx_mem_region(l, s->r, &ms, &mr, why, wl);
        if (rc)
            return rc;
        s->req.buf = (uint8_t *)xfer_region_ptr(s->r) + s->h.offset;
        s->req.mh = send ? ms : mr;
        return 0;
    }
    s->slot = tcpx_mem_slot(l, -1, why, wl);
    if (!s->slot)
        return -XFER_ENOMEM;
    s->req.buf = s->slot->buf;
    s->req.mh = send ? s->slot->mh_send : s->slot->mh_recv;
    return 0;
}

static void on_request(struct tcpx_link *l, const struct xfer_wire_hdr *h)
{
    if (h->op == XFER_WIRE_MSG_REQ) {
        tcpx_msg_request(l, h); /* its frame follows on the control socket */
        return;
    }
    if (h->op != XFER_WIRE_WRITE_REQ && h->op != XFER_WIRE_READ_REQ) {
        tcpx_link_fail(l, -XFER_EPROTO, "unexpected frame type from an initiator");
        return;
    }
    struct tcpx_serve *s = calloc(1, sizeof(*s));
    if (!s) {
        tcpx_link_fail(l, -XFER_ENOMEM, "out of memory for a request");
        return;
    }
    bool read = h->op == XFER_WIRE_READ_REQ;
    s->h = *h;
    s->next = l->serving;
    l->serving = s;
    l->n_serving++;
    int err = 0;
    s->r = xfer_region_acquire_by(l->tt->engine, l->peer_node, h->region_id, h->gen,
                                  read ? XFER_OP_READ : XFER_OP_WRITE, h->offset, h->length, &err);
    s->status = err;
    char why[160] = "";
    int rc = serve_buffer(l, s, read, why, sizeof(why));
    if (rc && s->r) { /* the region cannot be used: refuse, consume with scratch */
        xfer_warn("tcpx: %s: %s", l->name, why);
        xfer_region_release(s->r);
        s->r = NULL;
        s->status = rc;
        rc = serve_buffer(l, s, read, why, sizeof(why));
    }
    if (rc) {
        tcpx_link_fail(l, rc, why);
        return;
    }
    s->req.kind = read ? REQ_SEND : REQ_RECV;
    s->req.owner = s;
    /* a refused READ is answered with an empty send: the stream stays in step */
    s->req.len = read && !s->r ? 0 : h->length;
    if (read && s->r && s->slot &&
        (rc = tcpx_copy(s->slot->buf, (uint8_t *)xfer_region_ptr(s->r) + h->offset, h->length))) {
        xfer_region_release(s->r);
        s->r = NULL;
        s->status = rc;
        s->req.len = 0;
    }
    req_queue(l, &s->req);
}

/* A host-mode receive into GPU memory may need a flush before it is seen. */
static int flush_gpu(struct tcpx_link *l, struct tcpx_serve *s)
{
    struct tcpx_net *n = l->tt->net;
    void *fr = NULL;
    int r = tcpx_net_iflush(n, l->recv_comm, s->req.buf, (int)s->req.len, s->req.mh, &fr);
    int64_t deadline = xfer_now_ms() + 1000;
    for (int done = 0; r == 0 && fr && !done;) {
        int size;
        r = tcpx_net_test(n, fr, &done, &size);
        if (!done && xfer_now_ms() > deadline)
            return -XFER_ETIMEDOUT;
    }
    return r ? -XFER_EIO : 0;
}

static void serve_done(struct tcpx_link *l, struct tcpx_serve *s)
{
    int st = s->status;
    if (s->h.op == XFER_WIRE_READ_REQ) {
        respond(l, s, st);
        serve_free(l, s);
        return;
    }
    char why[160] = "";
    if ((uint64_t)s->req.got != s->h.length) {
        xfer_warn("tcpx: %s: plugin delivered %d bytes for a %llu-byte WRITE", l->name, s->req.got,
                  (unsigned long long)s->h.length);
        st = -XFER_EPROTO;
    }
    uint8_t *dst = st == 0 && s->r ? (uint8_t *)xfer_region_ptr(s->r) + s->h.offset : NULL;
    if (l->unpack) {
        int rc = tcpx_unpack(l, &s->req, dst, why, sizeof(why));
        if (rc && st == 0) {
            xfer_warn("tcpx: %s: %s", l->name, why);
            st = rc;
        }
    } else if (dst && s->slot) {
        st = tcpx_copy(dst, s->slot->buf, s->h.length);
    } else if (dst && xfer_region_kind(s->r) == XFER_MEM_CUDA) {
        st = flush_gpu(l, s);
    }
    respond(l, s, st);
    serve_free(l, s);
}

static void owner_req_done(struct tcpx_link *l, struct tcpx_req *r)
{
    if (l->target)
        serve_done(l, r->owner);
    else
        chunk_maybe_done(l, r->owner);
}

/* ---- control input ----------------------------------------------------------------- */

/* Up to want bytes of the control socket into buf: > 0 read, 0 nothing
 * now, < 0 the link failed. */
static ssize_t ctrl_recv(struct tcpx_link *l, void *buf, size_t want)
{
    ssize_t n = recv(l->fd, buf, want, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        bool idle = !l->rx_have && !has_work(l); /* nothing lost */
        tcpx_link_fail(l, idle ? 0 : -XFER_ECONN,
                       n == 0 ? "peer closed the connection" : strerror(errno));
        return -1;
    }
    return n < 0 ? 0 : n;
}

static bool ctrl_read(struct tcpx_link *l)
{
    bool moved = false;
    while (l->fd >= 0 && (!l->target || l->n_serving < TCPX_WINDOW)) {
        if (l->rx_msg) { /* a message's frame */
            size_t want = l->rx_msg_h.length - l->rx_msg_have;
            ssize_t n = want ? ctrl_recv(l, l->rx_msg + l->rx_msg_have, want) : 0;
            if (n < 0)
                return true;
            l->rx_msg_have += (size_t)n;
            if (l->rx_msg_have < l->rx_msg_h.length && n == 0)
                break;
            if (l->rx_msg_have == l->rx_msg_h.length)
                tcpx_msg_received(l);
            moved = true;
            continue;
        }
        if (l->rx_have < XFER_WIRE_HDR_LEN) {
            ssize_t n = ctrl_recv(l, l->rx + l->rx_have, XFER_WIRE_HDR_LEN - l->rx_have);
            if (n < 0)
                return true;
            if (n == 0)
                break;
            l->rx_have += (size_t)n;
            moved = true;
            continue;
        }
        struct xfer_wire_hdr h;
        l->rx_have = 0;
        if (xfer_wire_decode(l->rx, TCPX_CHUNK_MAX, &h) < 0) {
            tcpx_link_fail(l, -XFER_EPROTO, "malformed control frame");
            return true;
        }
        l->last_progress_ms = xfer_now_ms();
        if (l->target)
            on_request(l, &h);
        else
            on_response(l, &h);
    }
    return moved;
}

/* ---- failure ------------------------------------------------------------------------ */

void tcpx_link_fail(struct tcpx_link *l, int status, const char *why)
{
    if (l->fd < 0)
        return;
    if (status == 0)
        xfer_info("tcpx: link %s closed: %s", l->name, why);
    else if (!l->close_req)
        xfer_warn("tcpx: closing link %s: %s", l->name, why);
    snprintf(l->dead_why, sizeof(l->dead_why), "link %s lost: %s", l->name, why);
    close(l->fd);
    l->fd = -1;
    __atomic_store_n(&l->dead, true, __ATOMIC_RELAXED);
    int code = status == -XFER_EPROTO ? status : -XFER_ECONN; /* the link is gone */
    /* requests may still be with the plugin: closing the comms ends them
     * before any region pin or staging slot is given back */
    tcpx_mem_close_comms(l);
    l->sq_head = l->sq_tail = l->rq_head = l->rq_tail = NULL;
    while (l->inflight) {
        struct tcpx_chunk *c = l->inflight;
        l->inflight = c->next;
        l->n_inflight--;
        chunk_free(l, c, code, l->dead_why);
    }
    pthread_mutex_lock(&l->qmu);
    struct tcpx_chunk *q = l->q_head;
    l->q_head = l->q_tail = NULL;
    pthread_mutex_unlock(&l->qmu);
    while (q) {
        struct tcpx_chunk *next = q->next;
        chunk_free(l, q, code, l->dead_why);
        q = next;
    }
    while (l->serving)
        serve_free(l, l->serving);
    tcpx_msg_fail_all(l, l->dead_why);
}

static bool has_work(const struct tcpx_link *l)
{
    return l->n_inflight || l->n_serving || l->q_head || l->n_msgs || l->mq_head || l->rx_msg;
}

/* No completion, frame or byte for io_timeout_ms while work is pending:
 * the plugin (or the peer) is stuck. */
static void check_stall(struct tcpx_link *l, int64_t now)
{
    int limit = xfer_engine_config_get(l->tt->engine)->io_timeout_ms;
    if (l->fd < 0 || !has_work(l) || now - l->last_progress_ms <= limit)
        return;
    char why[96];
    snprintf(why, sizeof(why), "no progress for %d ms (peer or plugin stalled)", limit);
    tcpx_link_fail(l, -XFER_ECONN, why);
}

/* ---- the thread ------------------------------------------------------------------------ */

static bool drive(struct tcpx_link *l)
{
    bool moved = ctrl_read(l);
    if (!l->target) {
        moved |= start_chunks(l);
        moved |= tcpx_msg_start(l);
    }
    moved |= post_queue(l, l->sq_head);
    moved |= post_queue(l, l->rq_head);
    moved |= test_queue(l, l->sq_head);
    moved |= test_queue(l, l->rq_head);
    moved |= ctrl_flush(l);
    if (moved)
        l->last_progress_ms = xfer_now_ms();
    return moved;
}

/* Links that disconnect asked to close, and dead target links, leave. */
static void reap(struct tcpx_transport *tt)
{
    pthread_mutex_lock(&tt->mu);
    bool signal = false;
    for (struct tcpx_link **pp = &tt->links; *pp;) {
        struct tcpx_link *l = *pp;
        if (l->close_req || (l->target && l->fd < 0)) {
            *pp = l->next;
            tcpx_link_fail(l, -XFER_ECONN, "disconnected");
            if (l->target) {
                pthread_mutex_unlock(&tt->mu);
                tcpx_link_free(l);
                pthread_mutex_lock(&tt->mu);
            } else {
                l->released = true;
                signal = true;
            }
            continue;
        }
        pp = &l->next;
    }
    if (signal)
        pthread_cond_broadcast(&tt->cv);
    pthread_mutex_unlock(&tt->mu);
}

static void nap(struct tcpx_transport *tt, int ms)
{
    struct pollfd p[65];
    int n = 0;
    p[n++] = (struct pollfd){tt->wakefd, POLLIN, 0};
    pthread_mutex_lock(&tt->mu);
    for (struct tcpx_link *l = tt->links; l && n < 65; l = l->next)
        if (l->fd >= 0)
            p[n++] = (struct pollfd){l->fd, POLLIN | (l->tx_len ? POLLOUT : 0), 0};
    pthread_mutex_unlock(&tt->mu);
    if (poll(p, (nfds_t)n, ms) > 0 && (p[0].revents & POLLIN)) {
        uint64_t v;
        if (read(tt->wakefd, &v, sizeof(v)) < 0 && errno != EAGAIN)
            xfer_err("tcpx: eventfd read: %s", strerror(errno));
    }
}

void *tcpx_progress_main(void *arg)
{
    struct tcpx_transport *tt = arg;
    int idle = 0;
    int64_t next_check = xfer_now_ms() + 100;
    while (!tt->stop) {
        pthread_mutex_lock(&tt->mu);
        struct tcpx_link *l = tt->links;
        pthread_mutex_unlock(&tt->mu);
        bool moved = false, busy = false;
        for (; l; l = l->next) { /* only this thread unlinks */
            if (l->fd < 0)
                continue;
            moved |= drive(l);
            busy |= has_work(l);
        }
        int64_t now = xfer_now_ms();
        if (now >= next_check) {
            pthread_mutex_lock(&tt->mu);
            l = tt->links;
            pthread_mutex_unlock(&tt->mu);
            for (; l; l = l->next)
                check_stall(l, now);
            next_check = now + 100;
        }
        reap(tt);
        idle = moved ? 0 : idle + 1;
        if (moved)
            continue;
        if (busy && idle < TCPX_SPINS)
            sched_yield();
        else
            nap(tt, busy ? 1 : 100);
    }
    return NULL;
}

/* ---- posting (caller's thread) ---------------------------------------------------------- */

static struct tcpx_chunk *make_chunk(struct tcpx_link *l, xfer_batch *b, size_t i,
                                     const struct xfer_item *it, uint64_t off, uint64_t len)
{
    struct tcpx_chunk *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    c->b = b;
    c->idx = i;
    c->op = it->op == XFER_OP_WRITE ? XFER_WIRE_WRITE_REQ : XFER_WIRE_READ_REQ;
    c->req_id = __atomic_add_fetch(&l->tt->next_req, 1, __ATOMIC_RELAXED);
    c->region_id = it->remote_id;
    c->gen = it->remote_gen;
    c->remote_off = it->remote_off + off;
    c->len = len;
    c->local = (uint8_t *)xfer_region_ptr(it->local) + it->local_off + off;
    xfer_batch_hold(b);
    return c;
}

int tcpx_post(struct xfer_conn *xc, xfer_batch *b, const size_t *idx, size_t n)
{
    struct tcpx_link *l = container_of(xc, struct tcpx_conn, base)->link;
    if (__atomic_load_n(&l->dead, __ATOMIC_RELAXED))
        return -XFER_ECONN;
    uint64_t chunk = xfer_engine_config_get(l->tt->engine)->chunk_bytes;
    chunk = chunk < 4096 ? 4096 : chunk > TCPX_CHUNK_MAX ? TCPX_CHUNK_MAX : chunk;
    struct tcpx_chunk *head = NULL, **tail = &head;
    size_t count = 0;
    for (size_t k = 0; k < n; k++) {
        size_t nseg, s = 0;
        bool vec = xfer_batch_item_segs(b, idx[k], &nseg) != NULL;
        for (bool ok = true; ok && s < nseg; s++) { /* each segment of a vectored item */
            struct xfer_item seg, *it = &seg;
            xfer_batch_item_seg(b, idx[k], s, &seg);
            if (it->len > UINT64_MAX - it->remote_off) {
                xfer_batch_chunk_done(b, idx[k], 0, -XFER_ERANGE,
                                      "remote offset + length overflows");
                break;
            }
            uint64_t off = 0;
            do {
                uint64_t len = it->len - off < chunk ? it->len - off : chunk;
                struct tcpx_chunk *c = make_chunk(l, b, idx[k], it, off, len);
                if (!c) {
                    xfer_batch_chunk_done(b, idx[k], 0, -XFER_ENOMEM, "out of memory for a chunk");
                    ok = false;
                    break;
                }
                c->seg = vec ? (uint32_t)s : UINT32_MAX;
                *tail = c;
                tail = &c->next;
                count++;
                off += len;
            } while (off < it->len);
        }
    }
    if (!head)
        return 0;
    __atomic_add_fetch(&l->load, count, __ATOMIC_RELAXED);
    pthread_mutex_lock(&l->qmu);
    bool dead = __atomic_load_n(&l->dead, __ATOMIC_RELAXED);
    if (!dead) {
        if (l->q_tail)
            l->q_tail->next = head;
        else
            l->q_head = head;
        l->q_tail = (struct tcpx_chunk *)((char *)tail - offsetof(struct tcpx_chunk, next));
    }
    pthread_mutex_unlock(&l->qmu);
    if (dead) { /* the link died meanwhile: its thread will not see these */
        while (head) {
            struct tcpx_chunk *next = head->next;
            chunk_free(l, head, -XFER_ECONN, "the link to the peer is lost");
            head = next;
        }
        return 0;
    }
    tcpx_kick(l->tt);
    return 0;
}
