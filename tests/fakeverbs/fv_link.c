/* fakeverbs: the link between two connected QPs. The sender thread is the
 * only writer of the socket, the receiver the only reader; the receiver
 * serves the peer's requests against this process's MR table exactly where a
 * NIC would check them (rkey, PD, access flags, bounds, QP access).
 *
 * SEND (and SEND_WITH_IMM) consume the head of this QP's posted receive
 * queue: the data is scattered into its buffers and a receive completion
 * (IBV_WC_RECV, byte_len, imm) is pushed. A SEND longer than the receive's
 * buffers completes it with IBV_WC_LOC_LEN_ERR here and IBV_WC_REM_INV_REQ_ERR
 * at the sender, both QPs in error (a bad receive WQE: LOC_PROT_ERR here,
 * REM_OP_ERR there). With no receive posted the responder answers an RNR
 * NAK carrying its min_rnr_timer and, like a NIC whose expected PSN did not
 * move, drops every later request until the sender resends; the sender
 * waits that long and resends the SEND and everything after it (go-back-N),
 * up to its QP's rnr_retry times (7 = forever), then completes the SEND with
 * IBV_WC_RNR_RETRY_EXC_ERR and flushes the rest. */
#include "fv_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define PIECE (1u << 20) /* WRITE payloads are applied in pieces of this */

static bool range_inside(uint64_t addr, uint64_t len, uint64_t base, uint64_t size)
{
    return addr >= base && addr - base <= size && len <= size - (addr - base);
}

/* Local checks the NIC does when it fetches a WR: lkey, PD, bounds, and
 * local write access for the buffers a READ lands in. */
static int check_local(struct fv_qp *qp, const struct fv_wr *w)
{
    struct fv_context *c = fv_context_of(qp->qp.context);
    int nak = NAK_OK;
    pthread_rwlock_rdlock(&c->mr_lock);
    for (int i = 0; i < w->num_sge && nak == NAK_OK; i++) {
        if (w->sge[i].length == 0)
            continue; /* a zero-length SGE is not checked */
        struct fv_mr *m = fv_mr_lookup(c, w->sge[i].lkey);
        if (!m || m->mr.pd != qp->qp.pd ||
            !range_inside(w->sge[i].addr, w->sge[i].length, (uintptr_t)m->mr.addr, m->mr.length) ||
            (w->opcode == IBV_WR_RDMA_READ && !(m->access & IBV_ACCESS_LOCAL_WRITE)))
            nak = NAK_LOCAL;
    }
    pthread_rwlock_unlock(&c->mr_lock);
    return nak;
}

/* Responder checks; the caller holds mr_lock for reading. */
static int check_remote(struct fv_qp *qp, const struct fv_msg *h, int need)
{
    pthread_mutex_lock(&qp->lock);
    int qp_access = qp->qp_access;
    bool reads = qp->max_dest_rd_atomic > 0;
    pthread_mutex_unlock(&qp->lock);
    if (need == IBV_ACCESS_REMOTE_READ && !reads)
        return NAK_INVALID; /* no responder resources for RDMA READ */
    if (!(qp_access & need))
        return NAK_ACCESS;
    if (fv_is_mw_key(h->rkey)) /* a memory window: its QP, range and access */
        return fv_mw_check(qp, h->rkey, h->addr, h->len, need);
    struct fv_mr *m = fv_mr_lookup(fv_context_of(qp->qp.context), h->rkey);
    if (!m || m->mr.pd != qp->qp.pd || !(m->access & need) ||
        !range_inside(h->addr, h->len, (uintptr_t)m->mr.addr, m->mr.length))
        return NAK_ACCESS;
    return NAK_OK;
}

static void enqueue(struct fv_qp *qp, struct fv_out *o)
{
    pthread_mutex_lock(&qp->lock);
    if (qp->st == IBV_QPS_ERR || qp->stopping) {
        pthread_mutex_unlock(&qp->lock);
        fv_free_out(o);
        return;
    }
    if (qp->out_tail)
        qp->out_tail->next = o;
    else
        qp->out_head = o;
    qp->out_tail = o;
    pthread_cond_broadcast(&qp->cond);
    pthread_mutex_unlock(&qp->lock);
}

static void respond_ex(struct fv_qp *qp, uint8_t type, int status, uint16_t flags, void *payload,
                       uint32_t len, bool then_error)
{
    struct fv_out *o = calloc(1, sizeof(*o));
    if (!o) {
        free(payload);
        return; /* the initiator will see its request time out */
    }
    o->hdr.type = type;
    o->hdr.status = (uint8_t)status;
    o->hdr.flags = flags;
    o->hdr.len = payload ? len : 0;
    o->payload = payload;
    o->then_error = then_error;
    enqueue(qp, o);
}

static void respond(struct fv_qp *qp, uint8_t type, int status, void *payload, uint32_t len)
{
    respond_ex(qp, type, status, 0, payload, len, false);
}

static int serve_write(struct fv_qp *qp, const struct fv_msg *h, uint8_t *piece)
{
    struct fv_context *c = fv_context_of(qp->qp.context);
    pthread_rwlock_rdlock(&c->mr_lock);
    int nak = check_remote(qp, h, IBV_ACCESS_REMOTE_WRITE);
    pthread_rwlock_unlock(&c->mr_lock);
    for (uint64_t off = 0; off < h->len;) {
        uint32_t n = h->len - off < PIECE ? (uint32_t)(h->len - off) : PIECE;
        if (fv_recv_all(qp->sock, piece, n))
            return -1;
        if (nak == NAK_OK) { /* re-checked per piece: the MR may go away */
            pthread_rwlock_rdlock(&c->mr_lock);
            nak = check_remote(qp, h, IBV_ACCESS_REMOTE_WRITE);
            if (nak == NAK_OK)
                memcpy((void *)(uintptr_t)(h->addr + off), piece, n);
            pthread_rwlock_unlock(&c->mr_lock);
        }
        off += n;
    }
    respond(qp, M_ACK, nak, NULL, 0);
    return 0;
}

static void serve_read(struct fv_qp *qp, const struct fv_msg *h)
{
    struct fv_context *c = fv_context_of(qp->qp.context);
    void *buf = NULL;
    pthread_rwlock_rdlock(&c->mr_lock);
    int nak = check_remote(qp, h, IBV_ACCESS_REMOTE_READ);
    if (nak == NAK_OK && h->len) {
        buf = malloc(h->len);
        if (buf)
            memcpy(buf, (void *)(uintptr_t)h->addr, h->len);
        else
            nak = NAK_INVALID;
    }
    pthread_rwlock_unlock(&c->mr_lock);
    if (nak == NAK_OK && !buf)
        buf = malloc(1); /* zero-length READ: still a response with status */
    respond(qp, M_READ_RESP, nak, nak == NAK_OK ? buf : NULL, h->len);
    if (nak != NAK_OK)
        free(buf);
}

/* Reads and throws away len bytes of a request's payload. */
static int discard(struct fv_qp *qp, uint64_t len, uint8_t *piece)
{
    for (uint64_t off = 0; off < len;) {
        uint32_t n = len - off < PIECE ? (uint32_t)(len - off) : PIECE;
        if (fv_recv_all(qp->sock, piece, n))
            return -1;
        off += n;
    }
    return 0;
}

/* Checks a receive WQE's buffers (lkey, PD, bounds, local write) and
 * scatters data into them; NAK_OK or NAK_LOCAL. Caller holds mr_lock. */
static int scatter(struct fv_qp *qp, const struct fv_recv *r, const uint8_t *data, uint32_t len)
{
    struct fv_context *c = fv_context_of(qp->qp.context);
    for (int i = 0; i < r->num_sge; i++) {
        struct fv_mr *m = fv_mr_lookup(c, r->sge[i].lkey);
        if (r->sge[i].length &&
            (!m || m->mr.pd != qp->qp.pd || !(m->access & IBV_ACCESS_LOCAL_WRITE) ||
             !range_inside(r->sge[i].addr, r->sge[i].length, (uintptr_t)m->mr.addr, m->mr.length)))
            return NAK_LOCAL;
    }
    for (int i = 0; i < r->num_sge && len; i++) {
        uint32_t n = r->sge[i].length < len ? r->sge[i].length : len;
        memcpy((void *)(uintptr_t)r->sge[i].addr, data, n);
        data += n;
        len -= n;
    }
    return NAK_OK;
}

/* A SEND from the peer: the head of the receive queue takes it, or the
 * sender is told to come back (RNR NAK) and later requests are dropped. */
static int serve_send(struct fv_qp *qp, const struct fv_msg *h)
{
    uint8_t *data = malloc(h->len ? h->len : 1);
    if (!data || fv_recv_all(qp->sock, data, h->len)) {
        free(data);
        return -1;
    }
    pthread_mutex_lock(&qp->lock);
    if (qp->rq_count == 0) {
        qp->rnr_dropping = true;
        uint16_t timer = qp->min_rnr_timer;
        pthread_mutex_unlock(&qp->lock);
        free(data);
        respond_ex(qp, M_ACK, NAK_RNR, timer, NULL, 0, false);
        return 0;
    }
    struct fv_recv r = qp->rq[qp->rq_head];
    qp->rq_head = (qp->rq_head + 1) % qp->max_recv_wr;
    qp->rq_count--;
    qp->busy++; /* a flush waits until the buffers are no longer written */
    pthread_mutex_unlock(&qp->lock);
    uint64_t room = 0;
    for (int i = 0; i < r.num_sge; i++)
        room += r.sge[i].length;
    struct ibv_wc wc = {.wr_id = r.wr_id,
                        .status = IBV_WC_SUCCESS,
                        .opcode = IBV_WC_RECV,
                        .qp_num = qp->qp.qp_num,
                        .byte_len = h->len};
    int nak = NAK_OK;
    if (h->len > room) {
        nak = NAK_INVALID;
        wc.status = IBV_WC_LOC_LEN_ERR;
    } else {
        struct fv_context *c = fv_context_of(qp->qp.context);
        pthread_rwlock_rdlock(&c->mr_lock);
        if (scatter(qp, &r, data, h->len) != NAK_OK) {
            nak = NAK_REMOP;
            wc.status = IBV_WC_LOC_PROT_ERR;
        }
        pthread_rwlock_unlock(&c->mr_lock);
    }
    if (wc.status == IBV_WC_SUCCESS && (h->flags & FV_F_IMM)) {
        wc.wc_flags = IBV_WC_WITH_IMM;
        wc.imm_data = h->imm;
    }
    if (wc.status != IBV_WC_SUCCESS)
        wc.vendor_err = 0x82;
    /* A NIC acknowledges before software can see the receive (so an answer
     * SEND never overtakes the ACK); a failed receive completes first and
     * puts this QP in error once the NAK is out, flushing the rest after it. */
    if (nak == NAK_OK)
        respond(qp, M_ACK, NAK_OK, NULL, 0);
    fv_cq_push(qp->qp.recv_cq, &wc, NULL, 0);
    free(data);
    pthread_mutex_lock(&qp->lock);
    qp->busy--;
    pthread_cond_broadcast(&qp->cond);
    pthread_mutex_unlock(&qp->lock);
    if (nak != NAK_OK)
        respond_ex(qp, M_ACK, nak, 0, NULL, 0, true);
    return 0;
}

/* An RNR NAK for the SEND w at the head of the wait list (qp->lock held):
 * after the responder's timer, w and every request after it go again, the
 * first one marked so the responder stops dropping; rnr_retry exhausted
 * (7 never is), w fails with RNR_RETRY_EXC_ERR and the QP goes to error.
 * Returns true when the caller must move the QP to error. */
static bool rnr_nak_locked(struct fv_qp *qp, struct fv_wr *w, unsigned timer)
{
    if (qp->rnr_retry != 7 && w->rnr_tries >= qp->rnr_retry) {
        qp->wait_head = w->next;
        if (!qp->wait_head)
            qp->wait_tail = NULL;
        fv_push_send_cqe(qp, w, IBV_WC_RNR_RETRY_EXC_ERR);
        free(w);
        return true;
    }
    w->rnr_tries++;
    struct fv_out *head = NULL, **tail = &head;
    for (struct fv_wr *x = qp->wait_head, *n; x; x = n) {
        n = x->next;
        x->next = NULL;
        struct fv_out *o = calloc(1, sizeof(*o));
        if (!o) { /* out of memory in the stand-in: give up like a dead link */
            x->next = n;
            qp->wait_head = x;
            return true;
        }
        o->wr = x;
        *tail = o;
        tail = &o->next;
    }
    qp->wait_head = qp->wait_tail = NULL;
    *tail = qp->out_head;
    if (!qp->out_head)
        qp->out_tail = container_of(tail, struct fv_out, next);
    qp->out_head = head;
    qp->rewind = true;
    qp->rnr_until_ns = fv_now_ns() + fv_rnr_timer_ns(timer);
    pthread_cond_broadcast(&qp->cond);
    return false;
}

/* Our own request's response arrived: place READ data, complete in order. */
static int complete_own(struct fv_qp *qp, const struct fv_msg *h)
{
    pthread_mutex_lock(&qp->lock);
    struct fv_wr *w = qp->wait_head;
    bool is_read = w && w->opcode == IBV_WR_RDMA_READ;
    bool is_send = w && (w->opcode == IBV_WR_SEND || w->opcode == IBV_WR_SEND_WITH_IMM);
    if (!w || (h->type == M_READ_RESP) != is_read ||
        (h->type == M_READ_RESP && h->status == NAK_OK && h->len != w->len) ||
        (h->status == NAK_RNR && !is_send)) {
        pthread_mutex_unlock(&qp->lock);
        return -1; /* out of step: treat as a broken link */
    }
    if (h->status == NAK_RNR) {
        bool fail = rnr_nak_locked(qp, w, h->flags);
        pthread_mutex_unlock(&qp->lock);
        if (fail)
            fv_qp_to_error(qp, IBV_WC_WR_FLUSH_ERR);
        return 0;
    }
    if (h->type == M_READ_RESP && h->status == NAK_OK) {
        qp->busy++;
        pthread_mutex_unlock(&qp->lock);
        int rc = 0;
        for (int i = 0; i < w->num_sge && !rc; i++)
            rc = fv_recv_all(qp->sock, (void *)(uintptr_t)w->sge[i].addr, w->sge[i].length);
        pthread_mutex_lock(&qp->lock);
        qp->busy--;
        pthread_cond_broadcast(&qp->cond);
        if (rc) {
            pthread_mutex_unlock(&qp->lock);
            return -1;
        }
    }
    qp->wait_head = w->next;
    if (!qp->wait_head)
        qp->wait_tail = NULL;
    enum ibv_wc_status st = fv_nak_status(h->status);
    fv_push_send_cqe(qp, w, st);
    free(w);
    fv_complete_locals_locked(qp);
    pthread_mutex_unlock(&qp->lock);
    if (st != IBV_WC_SUCCESS)
        fv_qp_to_error(qp, IBV_WC_WR_FLUSH_ERR); /* the failed WR is done; flush the rest */
    return 0;
}

static void *receiver_main(void *arg)
{
    struct fv_qp *qp = arg;
    uint8_t *piece = malloc(PIECE);
    struct fv_msg h;
    while (piece && !fv_recv_all(qp->sock, &h, sizeof(h))) {
        int rc = 0;
        bool request =
            h.type == M_WRITE || h.type == M_READ || h.type == M_SEND || h.type == M_ECHO;
        pthread_mutex_lock(&qp->lock);
        if (request && (h.flags & FV_F_REWIND))
            qp->rnr_dropping = false;
        bool drop = request && qp->rnr_dropping;
        pthread_mutex_unlock(&qp->lock);
        if (drop) { /* after an RNR NAK: out of sequence until the resend */
            if ((h.type == M_WRITE || h.type == M_SEND) && discard(qp, h.len, piece))
                break;
            continue;
        }
        if (h.type == M_SEND)
            rc = serve_send(qp, &h);
        else if (h.type == M_WRITE)
            rc = serve_write(qp, &h, piece);
        else if (h.type == M_READ)
            serve_read(qp, &h);
        else if (h.type == M_ECHO)
            respond(qp, M_ACK, h.status, NULL, 0);
        else if (h.type == M_ACK || h.type == M_READ_RESP)
            rc = complete_own(qp, &h);
        else
            rc = -1;
        if (rc)
            break;
    }
    free(piece);
    pthread_mutex_lock(&qp->lock);
    bool stopping = qp->stopping;
    pthread_mutex_unlock(&qp->lock);
    /* The peer is gone (or the link broke): the oldest outstanding request
     * exhausts its retries, the rest are flushed. */
    if (!stopping)
        fv_qp_to_error(qp, IBV_WC_RETRY_EXC_ERR);
    return NULL;
}

static int send_request(struct fv_qp *qp, struct fv_out *o)
{
    struct fv_wr *w = o->wr;
    int nak = check_local(qp, w);
    struct fv_msg h = {.rkey = w->rkey, .addr = w->remote_addr, .len = w->len, .imm = w->imm};
    bool send_op = w->opcode == IBV_WR_SEND || w->opcode == IBV_WR_SEND_WITH_IMM;
    h.type = nak ? M_ECHO : w->opcode == IBV_WR_RDMA_WRITE ? M_WRITE : send_op ? M_SEND : M_READ;
    h.status = (uint8_t)nak;
    h.flags = (uint16_t)((qp->rewind ? FV_F_REWIND : 0) |
                         (w->opcode == IBV_WR_SEND_WITH_IMM ? FV_F_IMM : 0));
    qp->rewind = false;
    bool payload = (h.type == M_WRITE || h.type == M_SEND) && w->len > 0;
    o->wr = NULL; /* now owned by the wait list */
    if (qp->wait_tail)
        qp->wait_tail->next = w;
    else
        qp->wait_head = w;
    qp->wait_tail = w;
    w->next = NULL;
    if (payload)
        qp->busy++;
    /* w belongs to the wait list now: the receiver may complete and free it
     * as soon as the peer has the last byte, so send from a copy. */
    struct ibv_sge sge[16];
    int num_sge = payload ? w->num_sge : 0;
    memcpy(sge, w->sge, (size_t)num_sge * sizeof(sge[0]));
    pthread_mutex_unlock(&qp->lock);
    int rc = fv_send_all(qp->sock, &h, sizeof(h));
    for (int i = 0; !rc && i < num_sge; i++)
        rc = fv_send_all(qp->sock, (void *)(uintptr_t)sge[i].addr, sge[i].length);
    pthread_mutex_lock(&qp->lock);
    if (payload) {
        qp->busy--;
        pthread_cond_broadcast(&qp->cond);
    }
    return rc;
}

/* BIND_MW / LOCAL_INV: done by this QP's own NIC in send-queue order (the
 * requests before it have left); its CQE comes after theirs, so it waits on
 * the wait list while they do. True: it failed, the QP goes to error.
 * qp->lock held (released meanwhile). */
static bool run_local(struct fv_qp *qp, struct fv_out *o, bool fail)
{
    struct fv_wr *w = o->wr;
    o->wr = NULL;
    pthread_mutex_unlock(&qp->lock);
    enum ibv_wc_status st = fail                          ? IBV_WC_MW_BIND_ERR
                            : w->opcode == IBV_WR_BIND_MW ? fv_mw_bind(qp, w)
                                                          : fv_mw_invalidate(qp, w->rkey);
    pthread_mutex_lock(&qp->lock);
    w->local = true;
    w->local_st = st;
    w->next = NULL;
    if (qp->wait_tail)
        qp->wait_tail->next = w;
    else
        qp->wait_head = w;
    qp->wait_tail = w;
    fv_complete_locals_locked(qp);
    return st != IBV_WC_SUCCESS;
}

/* The next thing to send: the head, or while requests wait out an RNR
 * timer, the first response behind them (the responder side of a QP does
 * not wait for its requester side). Unlinks it. qp->lock held. */
static struct fv_out *next_out_locked(struct fv_qp *qp, int64_t *wait_ns)
{
    int64_t now = fv_now_ns();
    bool held = qp->rnr_until_ns && now < qp->rnr_until_ns;
    *wait_ns = held ? qp->rnr_until_ns - now : 0; /* > 0 whenever held */
    struct fv_out *prev = NULL, *o = qp->out_head;
    while (o && held && o->wr) {
        prev = o;
        o = o->next;
    }
    if (!o)
        return NULL;
    if (prev)
        prev->next = o->next;
    else
        qp->out_head = o->next;
    if (qp->out_tail == o)
        qp->out_tail = prev;
    o->next = NULL;
    return o;
}

static void *sender_main(void *arg)
{
    struct fv_qp *qp = arg;
    pthread_mutex_lock(&qp->lock);
    for (;;) {
        struct fv_out *o = NULL;
        int64_t wait_ns = 0;
        while (!qp->stopping && qp->st != IBV_QPS_ERR && !(o = next_out_locked(qp, &wait_ns))) {
            if (wait_ns > 0) {
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                int64_t ns = ts.tv_nsec + wait_ns;
                ts.tv_sec += ns / 1000000000;
                ts.tv_nsec = ns % 1000000000;
                pthread_cond_timedwait(&qp->cond, &qp->lock, &ts);
            } else {
                pthread_cond_wait(&qp->cond, &qp->lock);
            }
        }
        if (!o)
            break; /* stopping or in error: fv_qp_to_error flushes what is queued */
        bool then_error = o->then_error;
        if (o->wr && (o->wr->opcode == IBV_WR_BIND_MW || o->wr->opcode == IBV_WR_LOCAL_INV)) {
            enum fv_mw_fault f =
                o->wr->opcode == IBV_WR_BIND_MW ? fv_mw_fault_next(false) : FV_FAULT_NONE;
            if (f == FV_FAULT_KILL) { /* the link dies before the bind: flushed with the rest */
                o->next = qp->out_head;
                qp->out_head = o;
                if (!qp->out_tail)
                    qp->out_tail = o;
                pthread_mutex_unlock(&qp->lock);
                fv_qp_to_error(qp, IBV_WC_RETRY_EXC_ERR);
                pthread_mutex_lock(&qp->lock);
                continue;
            }
            then_error = run_local(qp, o, f == FV_FAULT_BIND);
        } else if (o->wr) {
            send_request(qp, o); /* a failure shows up in the receiver */
        } else {
            pthread_mutex_unlock(&qp->lock);
            if (!fv_send_all(qp->sock, &o->hdr, sizeof(o->hdr)) && o->hdr.len)
                fv_send_all(qp->sock, o->payload, o->hdr.len);
            pthread_mutex_lock(&qp->lock);
        }
        fv_free_out(o);
        if (then_error) { /* the responder NAKed a bad receive: this QP is in error too */
            pthread_mutex_unlock(&qp->lock);
            fv_qp_to_error(qp, IBV_WC_WR_FLUSH_ERR);
            pthread_mutex_lock(&qp->lock);
        }
    }
    pthread_mutex_unlock(&qp->lock);
    return NULL;
}

int fv_qp_start_link(struct fv_qp *qp, int sock)
{
    pthread_mutex_lock(&qp->lock);
    qp->sock = sock;
    int rc = pthread_create(&qp->receiver, NULL, receiver_main, qp);
    if (!rc && (rc = pthread_create(&qp->sender, NULL, sender_main, qp))) {
        shutdown(sock, SHUT_RDWR);
        qp->stopping = true;
        pthread_mutex_unlock(&qp->lock);
        pthread_join(qp->receiver, NULL);
        pthread_mutex_lock(&qp->lock);
    }
    qp->threads_running = rc == 0;
    pthread_mutex_unlock(&qp->lock);
    return rc ? -1 : 0;
}

void fv_qp_stop_link(struct fv_qp *qp)
{
    pthread_mutex_lock(&qp->lock);
    qp->stopping = true;
    if (qp->sock >= 0)
        shutdown(qp->sock, SHUT_RDWR);
    pthread_cond_broadcast(&qp->cond);
    bool running = qp->threads_running;
    qp->threads_running = false;
    pthread_mutex_unlock(&qp->lock);
    if (running) {
        pthread_join(qp->sender, NULL);
        pthread_join(qp->receiver, NULL);
    }
    if (qp->sock >= 0)
        close(qp->sock);
    qp->sock = -1;
}

int ibv_destroy_qp(struct ibv_qp *q)
{
    if (!q)
        return EINVAL;
    struct fv_qp *qp = container_of(q, struct fv_qp, qp);
    fv_qp_stop_link(qp);
    fv_mw_forget_qp(qp);
    fv_cq_forget_qp(q->send_cq, qp);
    if (q->recv_cq != q->send_cq)
        fv_cq_forget_qp(q->recv_cq, qp);
    for (struct fv_wr *w = qp->wait_head, *n; w; w = n) {
        n = w->next;
        free(w);
    }
    for (struct fv_out *o = qp->out_head, *n; o; o = n) {
        n = o->next;
        fv_free_out(o);
    }
    free(qp->rq);
    pthread_cond_destroy(&qp->cond);
    pthread_mutex_destroy(&qp->lock);
    free(qp);
    return 0;
}
