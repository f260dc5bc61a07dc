/*
 * rdma: engine messages (docs/notify.md, docs/rdma.md "Messages") as SEND /
 * RECV on the connection's RC QPs.
 *
 * Initiator: send_msg queues the frame; the pump copies it into one of the
 * connection's RDMA_MSG_CREDITS registered bounce buffers and posts an
 * IBV_WR_SEND (always signaled, a ring entry of the slot like a chunk) on the
 * connection's message QP: the first READY one, kept while it lives so that
 * messages to a peer arrive in the order they were sent. The first SEND on
 * a QP is the HELLO (rdma_auth.h): the initiator's whole node id and
 * incarnation, proved with the REQ's nonce. Each request spends a credit (a
 * receive the target posted); the target's answer is a SEND into one of the
 * slot's RDMA_MSG_CREDITS response receives, which gives the credit back.
 *
 * Target: each accepted QP posts RDMA_MSG_CREDITS receives of a whole frame
 * before it accepts, hands each request to xfer_engine_msg_recv() with the
 * HELLO's node id (never the frame's), reposts the receive, then answers.
 *
 * Window requests (leases, rdma_win.c / rdma_lease.c) are requests of type
 * T_WIN on the QP the window is wanted for; the answer carries the window.
 *
 * Frames (little-endian): 0 magic "XRMS" 4 type 5..7 0 8 request id(8)
 * 16 status(4, answers) 20 payload length(4), then the payload.
 */
#include "rdma.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MSG_MAGIC 0x534d5258u /* "XRMS" */
enum msg_type { T_HELLO = 1, T_REQ = 2, T_RESP = 3, T_WIN = 4 };
enum cqe_kind { K_SLOT_RECV = 1, K_ACC_RECV = 2, K_ACC_SEND = 3 };

/* wr_id of the message CQ: kind(2) | index(16) at 32 | generation(16) at 16 | buffer(16). */
static uint64_t msg_wr_id(enum cqe_kind k, uint32_t index, uint16_t gen, uint32_t buf)
{
    return (uint64_t)k << 62 | (uint64_t)(index & 0xffff) << 32 | (uint64_t)gen << 16 |
           (buf & 0xffff);
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void hdr_encode(uint8_t *p, enum msg_type type, uint64_t req_id, int status, uint32_t len)
{
    memset(p, 0, RDMA_MSG_HDR);
    put32(p, MSG_MAGIC);
    p[4] = (uint8_t)type;
    put32(p + 8, (uint32_t)req_id);
    put32(p + 12, (uint32_t)(req_id >> 32));
    put32(p + 16, (uint32_t)status);
    put32(p + 20, len);
}

/* 0 and the fields of a frame of n bytes, or -XFER_EPROTO (with the
 * request id when there is a header: the answer names what it refuses). */
static int hdr_decode(const uint8_t *p, size_t n, enum msg_type *type, uint64_t *req_id,
                      int *status)
{
    if (n >= RDMA_MSG_HDR)
        *req_id = get32(p + 8) | (uint64_t)get32(p + 12) << 32;
    if (n < RDMA_MSG_HDR || get32(p) != MSG_MAGIC || p[4] < T_HELLO || p[4] > T_WIN ||
        get32(p + 20) != n - RDMA_MSG_HDR)
        return -XFER_EPROTO;
    *type = (enum msg_type)p[4];
    *status = (int)get32(p + 16);
    return 0;
}

/* ---- initiator ---------------------------------------------------------- */

static uint8_t *resp_buf(struct rdma_conn *c, const struct rdma_slot *s, uint32_t j)
{
    return c->msg_mem + RDMA_MSG_CREDITS * RDMA_MSG_BUF +
           ((size_t)s->conn_pos * RDMA_MSG_CREDITS + j) * RDMA_MSG_SMALL;
}

int xrdma_msg_conn_init(struct rdma_conn *c, int max_slots)
{
    struct rdma_transport *t = c->t;
    size_t len =
        RDMA_MSG_CREDITS * RDMA_MSG_BUF + (size_t)max_slots * RDMA_MSG_CREDITS * RDMA_MSG_SMALL;
    c->msg_slot = -1;
    c->msg_mem = malloc(len);
    if (!c->msg_mem)
        return -XFER_ENOMEM;
    for (int i = 0; i < t->n_nics; i++) {
        c->msg_mr[i] = ibv_reg_mr(t->nics[i].pd, c->msg_mem, len, IBV_ACCESS_LOCAL_WRITE);
        if (!c->msg_mr[i]) {
            xfer_engine_set_error(t->base.engine, "rdma: registering message buffers on %s: %s",
                                  t->nics[i].desc.name, strerror(errno));
            xrdma_msg_conn_free(c);
            return -XFER_EIO;
        }
    }
    return 0;
}

void xrdma_msg_conn_free(struct rdma_conn *c)
{
    for (int i = 0; i < XFER_RDMA_MAX_NICS; i++)
        if (c->msg_mr[i]) {
            ibv_dereg_mr(c->msg_mr[i]);
            c->msg_mr[i] = NULL;
        }
    free(c->msg_mem);
    c->msg_mem = NULL;
    xrdma_win_conn_free(c);
}

void xrdma_msg_slot_up(struct rdma_slot *s)
{
    struct rdma_conn *c = s->conn;
    struct ibv_qp_attr a = {.min_rnr_timer = RDMA_MSG_RNR_TIMER};
    pthread_mutex_lock(&s->lock);
    s->credits = RDMA_MSG_CREDITS;
    s->hello_sent = false;
    /* The CM's RTR transition leaves its own RNR timer; RTS -> RTS may set it. */
    if (s->id && ibv_modify_qp(s->id->qp, &a, IBV_QP_MIN_RNR_TIMER))
        xfer_debug("rdma: QP %u: min_rnr_timer not set", s->index);
    for (uint32_t j = 0; s->id && j < RDMA_MSG_CREDITS; j++) {
        struct ibv_sge sge = {.addr = (uintptr_t)resp_buf(c, s, j),
                              .length = RDMA_MSG_SMALL,
                              .lkey = c->msg_mr[s->lnic]->lkey};
        struct ibv_recv_wr wr = {.wr_id = msg_wr_id(K_SLOT_RECV, s->index, s->uid & 0xfff, j),
                                 .sg_list = &sge,
                                 .num_sge = 1},
                           *bad;
        if (ibv_post_recv(s->id->qp, &wr, &bad)) {
            xfer_warn("rdma: QP %u: posting response receives failed: no messages on it", s->index);
            s->credits = 0;
            break;
        }
    }
    pthread_mutex_unlock(&s->lock);
}

static int free_entry(const struct rdma_conn *c)
{
    for (int i = 0; i < RDMA_MSG_CREDITS; i++)
        if (!c->out[i].used)
            return i;
    return -1;
}

/* Posts one SEND (s->lock held, READY, a credit, ring room, entry e free). */
static int post_send(struct rdma_conn *c, struct rdma_slot *s, int e, enum msg_type type,
                     const uint8_t *payload, size_t len, struct xfer_msg *m)
{
    uint8_t *buf = c->msg_mem + (size_t)e * RDMA_MSG_BUF;
    uint64_t req_id = ++c->next_req;
    hdr_encode(buf, type, req_id, 0, (uint32_t)len);
    memcpy(buf + RDMA_MSG_HDR, payload, len);
    struct ibv_sge sge = {.addr = (uintptr_t)buf,
                          .length = (uint32_t)(RDMA_MSG_HDR + len),
                          .lkey = c->msg_mr[s->lnic]->lkey};
    struct ibv_send_wr wr = {.wr_id = xrdma_wr_id(s, s->next_seq),
                             .sg_list = &sge,
                             .num_sge = 1,
                             .opcode = IBV_WR_SEND,
                             .send_flags = IBV_SEND_SIGNALED},
                       *bad;
    if (ibv_post_send(s->id->qp, &wr, &bad))
        return -1;
    struct xfer_rdma_chunk ch = {
        .msg = c, .item = (size_t)e, .seq = s->next_seq++, .signaled = true};
    xfer_rdma_ring_push(&s->ring, &ch); /* room checked by the caller */
    s->unsignaled = 0;
    s->credits--;
    c->out[e] = (struct rdma_msg_out){
        .used = true, .slot = s->index, .uid = s->uid, .req_id = req_id, .m = m};
    return 0;
}

int xrdma_msg_send_win_locked(struct rdma_conn *c, struct rdma_slot *s, struct rdma_want *w)
{
    for (;;) {
        int e = free_entry(c);
        if (e < 0 || s->credits == 0 || s->ring.n >= s->depth)
            return 0;
        if (!s->hello_sent) { /* the owner binds for the node this QP proved */
            uint8_t hello[XFER_RDMA_HELLO_MAX];
            size_t n = xfer_rdma_hello_encode(&c->t->self, c->peer.node_id, &s->nonce, hello);
            if (post_send(c, s, e, T_HELLO, hello, n, NULL))
                return -1;
            s->hello_sent = true;
            continue;
        }
        uint8_t p[RDMA_WIN_REQ_LEN];
        put32(p, w->rid);
        put32(p + 4, w->rgen);
        put32(p + 8, (uint32_t)(w->addr - w->rbase));
        put32(p + 12, (uint32_t)((w->addr - w->rbase) >> 32));
        put32(p + 16, (uint32_t)w->len);
        put32(p + 20, (uint32_t)(w->len >> 32));
        p[24] = (uint8_t)w->op;
        if (post_send(c, s, e, T_WIN, p, sizeof(p), NULL))
            return -1;
        c->out[e].want = w;
        return 1;
    }
}

/* The message QP: the one in use while it is READY, else the first READY. */
static struct rdma_slot *msg_slot_locked(struct rdma_conn *c)
{
    struct rdma_transport *t = c->t;
    for (int pass = 0; pass < 2; pass++) {
        for (int k = 0; k < c->n_slots; k++) {
            int i = pass == 0 ? c->msg_slot : k;
            if (i < 0)
                break;
            struct rdma_slot *s = &t->slots[c->slots[i]];
            pthread_mutex_lock(&s->lock);
            if (s->state == SLOT_READY) {
                c->msg_slot = i;
                return s; /* locked */
            }
            pthread_mutex_unlock(&s->lock);
            if (pass == 0)
                break;
        }
    }
    c->msg_slot = -1;
    return NULL;
}

void xrdma_msg_pump_locked(struct rdma_conn *c)
{
    if (!c->mq_head || !c->msg_mem)
        return;
    struct rdma_slot *s = msg_slot_locked(c);
    if (!s)
        return;
    bool kick = false;
    while (c->mq_head && s->credits > 0 && s->ring.n < s->depth) {
        int e = free_entry(c);
        if (e < 0)
            break;
        int rc;
        if (!s->hello_sent) {
            uint8_t hello[XFER_RDMA_HELLO_MAX];
            size_t n = xfer_rdma_hello_encode(&c->t->self, c->peer.node_id, &s->nonce, hello);
            rc = post_send(c, s, e, T_HELLO, hello, n, NULL);
            s->hello_sent = rc == 0;
        } else {
            struct rdma_msg_wait *w = c->mq_head;
            rc = post_send(c, s, e, T_REQ, w->m->frame, w->m->len, w->m);
            if (rc == 0) {
                c->mq_head = w->next;
                if (!c->mq_head)
                    c->mq_tail = NULL;
                free(w);
            }
        }
        if (rc) { /* the message stays queued for the re-established QP */
            xfer_warn("rdma: ibv_post_send of a message to %s failed: QP re-established",
                      c->peer.node_id);
            kick = xrdma_break_qp_locked(s);
            break;
        }
    }
    pthread_mutex_unlock(&s->lock);
    if (kick)
        xrdma_cm_kick(c->t);
}

int xrdma_send_msg(struct xfer_conn *xc, struct xfer_msg *m)
{
    struct rdma_conn *c = container_of(xc, struct rdma_conn, base);
    if (m->len > XFER_MSG_FRAME_MAX)
        return -XFER_EINVAL;
    struct rdma_msg_wait *w = calloc(1, sizeof(*w));
    if (!w)
        return -XFER_ENOMEM;
    w->m = m;
    pthread_mutex_lock(&c->lock);
    if (c->closing || !c->msg_mem) {
        pthread_mutex_unlock(&c->lock);
        free(w);
        return -XFER_ECONN;
    }
    if (c->mq_tail)
        c->mq_tail->next = w;
    else
        c->mq_head = w;
    c->mq_tail = w;
    xrdma_msg_pump_locked(c);
    bool waiting = c->mq_head != NULL;
    pthread_mutex_unlock(&c->lock);
    if (waiting)
        xrdma_cm_kick(c->t); /* no QP up: make sure a reconnect is under way */
    return 0;
}

/* Frees entry e once both its SEND completion and its answer were seen. */
static void entry_settle(struct rdma_conn *c, int e)
{
    if (c->out[e].sent && c->out[e].answered)
        c->out[e].used = false;
}

void xrdma_msg_sent(struct xfer_rdma_chunk *ch)
{
    struct rdma_conn *c = ch->msg;
    int e = (int)ch->item;
    struct xfer_msg *m = NULL;
    pthread_mutex_lock(&c->lock);
    struct rdma_msg_out *o = &c->out[e];
    o->sent = true;
    if (ch->status && !o->answered) { /* the QP failed: may or may not have arrived */
        o->answered = true;
        m = o->m;
    }
    entry_settle(c, e);
    if (!c->closing)
        xrdma_pump_locked(c);
    pthread_mutex_unlock(&c->lock);
    if (m)
        xfer_msg_done(m, -XFER_ECONN, ch->why ? ch->why : "rdma queue pair failed");
}

void xrdma_msg_slot_down(struct rdma_conn *c, struct rdma_slot *s, uint16_t uid, const char *why)
{
    struct xfer_msg *fail[RDMA_MSG_CREDITS];
    int n = 0;
    if (!c)
        return;
    pthread_mutex_lock(&c->lock);
    for (int e = 0; e < RDMA_MSG_CREDITS; e++) {
        struct rdma_msg_out *o = &c->out[e];
        if (!o->used || o->slot != s->index || o->uid != uid)
            continue;
        o->sent = true; /* the QP is destroyed: the NIC let go of the buffer */
        o->want = NULL; /* its window request: forgotten below (slot down) */
        if (!o->answered && o->m)
            fail[n++] = o->m;
        o->answered = true;
        entry_settle(c, e);
    }
    if (c->msg_slot >= 0 && c->slots[c->msg_slot] == s->index)
        c->msg_slot = -1;
    xrdma_win_slot_down_locked(c, s->conn_pos, uid);
    pthread_mutex_unlock(&c->lock);
    for (int i = 0; i < n; i++)
        xfer_msg_done(fail[i], -XFER_ECONN, why);
}

void xrdma_msg_fail_waiting(struct rdma_conn *c, int rc, const char *why)
{
    pthread_mutex_lock(&c->lock);
    struct rdma_msg_wait *w = c->mq_head;
    c->mq_head = c->mq_tail = NULL;
    pthread_mutex_unlock(&c->lock);
    while (w) {
        struct rdma_msg_wait *n = w->next;
        xfer_msg_done(w->m, rc, why);
        free(w);
        w = n;
    }
}

/* An answer arrived in response receive j of slot idx (progress thread). */
static void slot_answer(struct rdma_transport *t, const struct ibv_wc *wc, uint32_t idx,
                        uint16_t uid, uint32_t j)
{
    if (idx >= RDMA_MAX_SLOTS || j >= RDMA_MSG_CREDITS)
        return;
    struct rdma_slot *s = &t->slots[idx];
    pthread_mutex_lock(&s->lock);
    if (s->state == SLOT_FREE || (s->uid & 0xfff) != uid || !s->conn || !s->id ||
        wc->status != IBV_WC_SUCCESS) {
        pthread_mutex_unlock(&s->lock); /* a QP torn down or in error: its end fails its messages */
        return;
    }
    struct rdma_conn *c = s->conn;
    enum msg_type type;
    uint64_t req_id = 0;
    int status = 0;
    uint8_t *buf = resp_buf(c, s, j);
    int rc = hdr_decode(buf, wc->byte_len, &type, &req_id, &status);
    uint8_t pay[RDMA_MSG_SMALL]; /* the buffer is posted again below */
    size_t plen = rc == 0 ? wc->byte_len - RDMA_MSG_HDR : 0;
    memcpy(pay, buf + RDMA_MSG_HDR, plen);
    struct ibv_sge sge = {
        .addr = (uintptr_t)buf, .length = RDMA_MSG_SMALL, .lkey = c->msg_mr[s->lnic]->lkey};
    struct ibv_recv_wr wr = {.wr_id = wc->wr_id, .sg_list = &sge, .num_sge = 1}, *bad;
    if (ibv_post_recv(s->id->qp, &wr, &bad)) /* before the credit goes back */
        xfer_warn("rdma: QP %u: reposting a response receive failed", idx);
    __atomic_add_fetch(&c->refs, 1, __ATOMIC_ACQ_REL);
    pthread_mutex_unlock(&s->lock);
    if (rc == 0 && type != T_RESP)
        rc = -XFER_EPROTO;
    if (rc == 0 && ((status > 0 && status != XFER_MSG_DELIVERED) || status <= -XFER_ERR_MAX))
        rc = -XFER_EPROTO;
    struct xfer_msg *m = NULL;
    struct rdma_pending *refused = NULL;
    bool hello = false, busy = false;
    pthread_mutex_lock(&c->lock);
    for (int e = 0; rc == 0 && e < RDMA_MSG_CREDITS; e++) {
        struct rdma_msg_out *o = &c->out[e];
        if (!o->used || o->answered || o->slot != idx || (o->uid & 0xfff) != uid ||
            o->req_id != req_id)
            continue;
        o->answered = true;
        m = o->m;
        hello = !o->m && !o->want;
        busy = o->want && status == -XFER_EBUSY;
        if (o->want)
            refused = xrdma_win_answer_locked(c, o->want, status, pay, plen);
        o->want = NULL;
        entry_settle(c, e);
        pthread_mutex_lock(&s->lock);
        if ((s->uid & 0xfff) == uid)
            s->credits++;
        pthread_mutex_unlock(&s->lock);
        break;
    }
    if (!c->closing)
        xrdma_pump_locked(c);
    if (__atomic_sub_fetch(&c->refs, 1, __ATOMIC_ACQ_REL) == 0)
        pthread_cond_broadcast(&c->cond);
    const char *peer = c->peer.node_id;
    pthread_mutex_unlock(&c->lock);
    if (busy)
        xfer_info("rdma: %s could not bind a memory window now (QP busy or being "
                  "re-established): asking again",
                  peer);
    if (refused && status == -XFER_EBUSY)
        xrdma_fail_pending(refused, -XFER_ETIMEDOUT,
                           "the owner could not bind a memory window for it within io_timeout_ms "
                           "(its QP busy or being re-established)");
    else if (refused)
        xrdma_fail_pending(refused, status < 0 ? status : -XFER_EPROTO,
                           status == -XFER_ESTALE
                               ? "refused by the owner: no live lease (ended, released or not "
                                 "granted to this node), or the region was re-registered"
                               : "the owner refused a memory window for it");
    if (rc)
        xfer_warn("rdma: malformed answer from %s on QP %u (ignored)", peer, idx);
    else if (hello && status)
        xfer_warn("rdma: %s refused our hello: %s", peer, xfer_strerror(status));
    if (m)
        xfer_msg_done(m, status, status < 0 ? "refused by the peer" : NULL);
}

/* ---- target ------------------------------------------------------------- */

static uint8_t *acc_send_buf(struct rdma_accepted *a, uint32_t k)
{
    return a->mem + RDMA_MSG_CREDITS * RDMA_MSG_BUF + (size_t)k * RDMA_MSG_SMALL;
}

static int acc_post_recv(struct rdma_accepted *a, uint32_t j)
{
    struct ibv_sge sge = {.addr = (uintptr_t)(a->mem + (size_t)j * RDMA_MSG_BUF),
                          .length = RDMA_MSG_BUF,
                          .lkey = a->mr->lkey};
    struct ibv_recv_wr wr = {.wr_id = msg_wr_id(K_ACC_RECV, a->index, a->gen, j),
                             .sg_list = &sge,
                             .num_sge = 1},
                       *bad;
    return ibv_post_recv(a->id->qp, &wr, &bad);
}

int xrdma_msg_accept_qp(struct rdma_transport *t, struct rdma_nic *nic, struct rdma_accepted *a)
{
    size_t len = RDMA_MSG_CREDITS * RDMA_MSG_BUF + 2 * RDMA_MSG_CREDITS * RDMA_MSG_SMALL;
    a->lnic = nic->index;
    a->send_free = 2 * RDMA_MSG_CREDITS;
    a->mem = malloc(len);
    a->mr = a->mem ? ibv_reg_mr(nic->pd, a->mem, len, IBV_ACCESS_LOCAL_WRITE) : NULL;
    if (!a->mr)
        return -XFER_ENOMEM;
    pthread_mutex_lock(&t->acc_lock);
    uint32_t i = 0;
    while (i < RDMA_MAX_ACCEPTED && t->acc[i])
        i++;
    if (i < RDMA_MAX_ACCEPTED) {
        a->index = i;
        a->gen = ++t->acc_gen[i];
        t->acc[i] = a;
    }
    pthread_mutex_unlock(&t->acc_lock);
    if (i == RDMA_MAX_ACCEPTED)
        return -XFER_ENOSPC;
    /* Responses: at most one per request in flight, but a SEND's completion
     * may be polled after the next request arrives: twice as many. */
    struct ibv_qp_init_attr qa = {.send_cq = nic->msg_cq,
                                  .recv_cq = nic->msg_cq,
                                  .qp_type = IBV_QPT_RC,
                                  .cap = {.max_send_wr = 2 * RDMA_MSG_CREDITS + RDMA_WIN_INFLIGHT,
                                          .max_recv_wr = RDMA_MSG_CREDITS,
                                          .max_send_sge = 1,
                                          .max_recv_sge = 1}};
    if (rdma_create_qp(a->id, nic->pd, &qa))
        return -XFER_ENOMEM;
    for (uint32_t j = 0; j < RDMA_MSG_CREDITS; j++) /* before the initiator can send */
        if (acc_post_recv(a, j))
            return -XFER_EIO;
    return 0;
}

void xrdma_msg_accepted_ready(struct rdma_accepted *a)
{
    struct ibv_qp_attr qa = {.min_rnr_timer = RDMA_MSG_RNR_TIMER};
    if (ibv_modify_qp(a->id->qp, &qa, IBV_QP_MIN_RNR_TIMER))
        xfer_debug("rdma: accepted QP from %s: min_rnr_timer not set", a->node);
}

void xrdma_msg_accepted_close(struct rdma_transport *t, struct rdma_accepted *a)
{
    pthread_mutex_lock(&t->acc_lock);
    a->closing = true;
    if (a->index < RDMA_MAX_ACCEPTED && t->acc[a->index] == a)
        t->acc[a->index] = NULL;
    while (a->busy > 0)
        pthread_cond_wait(&t->acc_cond, &t->acc_lock);
    pthread_mutex_unlock(&t->acc_lock);
}

void xrdma_msg_accepted_free(struct rdma_accepted *a)
{
    if (a->mr)
        ibv_dereg_mr(a->mr);
    free(a->mem);
    a->mr = NULL;
    a->mem = NULL;
}

static struct rdma_accepted *acc_get(struct rdma_transport *t, uint32_t idx, uint16_t gen)
{
    if (idx >= RDMA_MAX_ACCEPTED)
        return NULL;
    struct rdma_accepted *a = t->acc[idx];
    return a && a->gen == gen && !a->closing ? a : NULL;
}

/* What the target answers to one request. */
static int serve_request(struct rdma_transport *t, struct rdma_accepted *a, const uint8_t *buf,
                         size_t n, uint64_t *req_id, uint8_t *out, size_t *out_len)
{
    enum msg_type type;
    int status;
    char why[192];
    if (hdr_decode(buf, n, &type, req_id, &status) < 0 || type == T_RESP) {
        xfer_warn("rdma: malformed message frame from %s (%zu bytes): answered EPROTO", a->node, n);
        return -XFER_EPROTO;
    }
    const uint8_t *p = buf + RDMA_MSG_HDR;
    size_t len = n - RDMA_MSG_HDR;
    if (type == T_HELLO) {
        int rc = xfer_rdma_hello_verify(&t->self, &a->req, p, len, a->peer, &a->peer_inc, why,
                                        sizeof(why));
        a->hello_ok = rc == 0;
        if (rc)
            xfer_warn("rdma: %s", why);
        return rc;
    }
    if (!a->hello_ok)
        return -XFER_EAUTH; /* no proven sender: nothing reaches the engine */
    if (type == T_WIN)
        return xrdma_lease_serve(t, a, p, len, out, out_len);
    return xfer_engine_msg_recv(t->base.engine, a->peer, a->peer_inc, p, len);
}

static void acc_request(struct rdma_transport *t, const struct ibv_wc *wc, uint32_t idx,
                        uint16_t gen, uint32_t j)
{
    pthread_mutex_lock(&t->acc_lock);
    struct rdma_accepted *a = acc_get(t, idx, gen);
    if (a)
        a->busy++;
    pthread_mutex_unlock(&t->acc_lock);
    if (!a || j >= RDMA_MSG_CREDITS)
        goto out;
    if (wc->status != IBV_WC_SUCCESS) {
        if (wc->status != IBV_WC_WR_FLUSH_ERR)
            xfer_warn("rdma: message from %s: %s (queue pair in error)", a->node,
                      ibv_wc_status_str(wc->status));
        goto out;
    }
    uint64_t req_id = 0;
    uint8_t pay[RDMA_MSG_SMALL - RDMA_MSG_HDR];
    size_t plen = 0;
    int status =
        serve_request(t, a, a->mem + (size_t)j * RDMA_MSG_BUF, wc->byte_len, &req_id, pay, &plen);
    pthread_mutex_lock(&t->acc_lock);
    if (acc_post_recv(a, j)) /* the frame was copied: the buffer is free again */
        xfer_warn("rdma: reposting a message receive for %s failed", a->node);
    if (a->send_free == 0) { /* cannot happen with credits; never overwrite a buffer in use */
        xfer_err("rdma: no response buffer for %s: answer dropped", a->node);
    } else {
        uint32_t k = a->send_next;
        a->send_next = (a->send_next + 1) % (2 * RDMA_MSG_CREDITS);
        a->send_free--;
        uint8_t *b = acc_send_buf(a, k);
        hdr_encode(b, T_RESP, req_id, status, (uint32_t)plen);
        memcpy(b + RDMA_MSG_HDR, pay, plen);
        struct ibv_sge sge = {
            .addr = (uintptr_t)b, .length = (uint32_t)(RDMA_MSG_HDR + plen), .lkey = a->mr->lkey};
        struct ibv_send_wr wr = {.wr_id = msg_wr_id(K_ACC_SEND, idx, gen, k),
                                 .sg_list = &sge,
                                 .num_sge = 1,
                                 .opcode = IBV_WR_SEND,
                                 .send_flags = IBV_SEND_SIGNALED},
                           *bad;
        if (ibv_post_send(a->id->qp, &wr, &bad)) {
            a->send_free++;
            xfer_warn("rdma: answering %s failed: %s", a->node, strerror(errno));
        }
    }
    pthread_mutex_unlock(&t->acc_lock);
out:
    if (!a)
        return;
    pthread_mutex_lock(&t->acc_lock);
    if (--a->busy == 0)
        pthread_cond_broadcast(&t->acc_cond);
    pthread_mutex_unlock(&t->acc_lock);
}

void xrdma_msg_cqe(struct rdma_transport *t, const struct ibv_wc *wc)
{
    enum cqe_kind k = (enum cqe_kind)(wc->wr_id >> 62);
    uint32_t idx = (uint32_t)(wc->wr_id >> 32) & 0xffff;
    uint16_t gen = (uint16_t)(wc->wr_id >> 16);
    uint32_t buf = (uint32_t)wc->wr_id & 0xffff;
    if (k == 0) { /* a window bind or invalidation (rdma_lease.c) */
        xrdma_lease_cqe(t, wc);
    } else if (k == K_SLOT_RECV) {
        slot_answer(t, wc, idx, gen, buf);
    } else if (k == K_ACC_RECV) {
        acc_request(t, wc, idx, gen, buf);
    } else if (k == K_ACC_SEND) { /* SEND ring slots come back in order */
        pthread_mutex_lock(&t->acc_lock);
        struct rdma_accepted *a = idx < RDMA_MAX_ACCEPTED ? t->acc[idx] : NULL;
        if (a && a->gen == gen)
            a->send_free++;
        pthread_mutex_unlock(&t->acc_lock);
    }
}
