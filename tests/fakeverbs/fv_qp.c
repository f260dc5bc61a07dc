/* fakeverbs: RC queue pairs — state machine, posting, and the link to the
 * peer QP that carries RDMA WRITE/READ between processes. */
#include "fv_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static uint32_t next_qp_num = 0x100;

int64_t fv_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* IBTA 9.7.5.2.8 (man ibv_modify_qp, min_rnr_timer): code -> microseconds
 * x 100; code 0 is the longest wait, 655.36 ms. */
int64_t fv_rnr_timer_ns(unsigned code)
{
    static const uint32_t us100[32] = {65536, 1,    2,    3,     4,     6,     8,     12,
                                       16,    24,   32,   48,    64,    96,    128,   192,
                                       256,   384,  512,  768,   1024,  1536,  2048,  3072,
                                       4096,  6144, 8192, 12288, 16384, 24576, 32768, 49152};
    return (int64_t)us100[code & 31] * 10000;
}

int fv_send_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int fv_recv_all(int fd, void *buf, size_t len)
{
    char *p = buf;
    while (len) {
        ssize_t n = recv(fd, p, len, MSG_WAITALL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static struct fv_qp *qp_of(struct ibv_qp *q)
{
    return container_of(q, struct fv_qp, qp);
}

struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *a)
{
    if (!pd || !a || !a->send_cq || !a->recv_cq || a->srq) {
        errno = EINVAL;
        return NULL;
    }
    if (a->qp_type != IBV_QPT_RC) {
        errno = EOPNOTSUPP; /* the fake models reliable connected QPs only */
        return NULL;
    }
    if (a->cap.max_send_wr > 8192 || a->cap.max_recv_wr > 8192 || a->cap.max_send_sge > 16 ||
        a->cap.max_recv_sge > FV_MAX_RECV_SGE || a->cap.max_inline_data > 0) {
        errno = EINVAL;
        return NULL;
    }
    struct fv_qp *qp = calloc(1, sizeof(*qp));
    if (!qp) {
        errno = ENOMEM;
        return NULL;
    }
    pthread_mutex_init(&qp->lock, NULL);
    pthread_cond_init(&qp->cond, NULL);
    qp->qp.context = pd->context;
    qp->qp.qp_context = a->qp_context;
    qp->qp.pd = pd;
    qp->qp.send_cq = a->send_cq;
    qp->qp.recv_cq = a->recv_cq;
    qp->qp.qp_num = __atomic_fetch_add(&next_qp_num, 1, __ATOMIC_RELAXED);
    qp->qp.qp_type = IBV_QPT_RC;
    qp->qp.state = IBV_QPS_RESET;
    qp->st = IBV_QPS_RESET;
    qp->max_send_wr = a->cap.max_send_wr;
    qp->max_recv_wr = a->cap.max_recv_wr;
    qp->max_sge = a->cap.max_send_sge ? a->cap.max_send_sge : 1;
    qp->max_recv_sge = a->cap.max_recv_sge ? a->cap.max_recv_sge : 1;
    qp->sq_sig_all = a->sq_sig_all;
    qp->sock = -1;
    return &qp->qp;
}

/* Attribute masks each transition requires (IBTA 11.2.4.2 / man ibv_modify_qp). */
static int required_mask(enum ibv_qp_state from, enum ibv_qp_state to)
{
    if (to == IBV_QPS_RESET || to == IBV_QPS_ERR)
        return IBV_QP_STATE;
    if (from == IBV_QPS_RESET && to == IBV_QPS_INIT)
        return IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
    if (from == IBV_QPS_INIT && to == IBV_QPS_INIT)
        return IBV_QP_STATE;
    if (from == IBV_QPS_INIT && to == IBV_QPS_RTR)
        return IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
               IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    if (from == IBV_QPS_RTR && to == IBV_QPS_RTS)
        return IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
               IBV_QP_MAX_QP_RD_ATOMIC;
    if (from == IBV_QPS_RTS && to == IBV_QPS_RTS)
        return IBV_QP_STATE;
    return -1;
}

/* qp->qp.state is what libibverbs shows the application: it changes only
 * through ibv_modify_qp (and the CM's transitions), never asynchronously;
 * an asynchronous error is seen through completions or ibv_query_qp. */
static void set_state_locked(struct fv_qp *qp, enum ibv_qp_state st, bool visible)
{
    qp->st = st;
    if (visible)
        qp->qp.state = st;
}

int ibv_modify_qp(struct ibv_qp *q, struct ibv_qp_attr *attr, int mask)
{
    if (!q || !attr)
        return EINVAL;
    struct fv_qp *qp = qp_of(q);
    pthread_mutex_lock(&qp->lock);
    if (mask & IBV_QP_RNR_RETRY) /* 3 bits on the wire: 7 = retry forever */
        qp->rnr_retry = attr->rnr_retry > 7 ? 7 : attr->rnr_retry;
    if (mask & IBV_QP_MIN_RNR_TIMER) /* also RTS -> RTS (an optional attribute there) */
        qp->min_rnr_timer = attr->min_rnr_timer & 31;
    pthread_mutex_unlock(&qp->lock);
    if (!(mask & IBV_QP_STATE))
        return 0; /* other attribute-only changes: nothing the fake models */
    enum ibv_qp_state to = attr->qp_state;
    if (to == IBV_QPS_ERR) {
        fv_qp_to_error(qp, IBV_WC_WR_FLUSH_ERR);
        pthread_mutex_lock(&qp->lock);
        qp->qp.state = IBV_QPS_ERR;
        pthread_mutex_unlock(&qp->lock);
        return 0;
    }
    pthread_mutex_lock(&qp->lock);
    int need = required_mask(qp->st, to);
    if (need < 0 || (mask & need) != need) {
        pthread_mutex_unlock(&qp->lock);
        return EINVAL;
    }
    if (to == IBV_QPS_RESET && qp->threads_running) {
        pthread_mutex_unlock(&qp->lock);
        return EBUSY; /* a connected fake QP cannot be recycled in place */
    }
    if (mask & IBV_QP_ACCESS_FLAGS)
        qp->qp_access = attr->qp_access_flags;
    if (mask & IBV_QP_MAX_DEST_RD_ATOMIC)
        qp->max_dest_rd_atomic = attr->max_dest_rd_atomic;
    if (to == IBV_QPS_RESET) {
        qp->rq_count = 0;
        qp->rq_head = 0;
        qp->sq_posted = 0;
        __atomic_store_n(&qp->sq_reclaimed, 0, __ATOMIC_RELEASE);
    }
    set_state_locked(qp, to, true);
    pthread_mutex_unlock(&qp->lock);
    return 0;
}

int ibv_query_qp(struct ibv_qp *q, struct ibv_qp_attr *attr, int mask,
                 struct ibv_qp_init_attr *init)
{
    (void)mask;
    if (!q || !attr)
        return EINVAL;
    struct fv_qp *qp = qp_of(q);
    memset(attr, 0, sizeof(*attr));
    pthread_mutex_lock(&qp->lock);
    attr->qp_state = qp->st;
    attr->cur_qp_state = qp->st;
    attr->qp_access_flags = qp->qp_access;
    attr->max_dest_rd_atomic = qp->max_dest_rd_atomic;
    attr->cap.max_send_wr = qp->max_send_wr;
    attr->cap.max_recv_wr = qp->max_recv_wr;
    attr->cap.max_send_sge = qp->max_sge;
    pthread_mutex_unlock(&qp->lock);
    if (init) {
        memset(init, 0, sizeof(*init));
        init->qp_type = IBV_QPT_RC;
        init->send_cq = q->send_cq;
        init->recv_cq = q->recv_cq;
        init->cap = attr->cap;
        init->sq_sig_all = qp->sq_sig_all;
    }
    return 0;
}

/* Used by the CM: walks the same state machine with the attributes that
 * librdmacm would compute. */
int fv_qp_set_state(struct fv_qp *qp, enum ibv_qp_state st, int access, bool responder_read,
                    uint8_t rnr_retry)
{
    /* min_rnr_timer: the IB CM's RTR attributes carry 0 (655.36 ms); an
     * application that wants another sets it RTS -> RTS itself. */
    struct ibv_qp_attr a = {.qp_state = st,
                            .qp_access_flags = access,
                            .max_dest_rd_atomic = responder_read ? 16 : 0,
                            .max_rd_atomic = 16,
                            .rnr_retry = rnr_retry,
                            .min_rnr_timer = 0,
                            .path_mtu = IBV_MTU_1024};
    int mask = IBV_QP_STATE;
    if (st == IBV_QPS_INIT)
        mask |= IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
    else if (st == IBV_QPS_RTR)
        mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER | IBV_QP_ACCESS_FLAGS;
    else if (st == IBV_QPS_RTS)
        mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                IBV_QP_MAX_QP_RD_ATOMIC;
    return ibv_modify_qp(&qp->qp, &a, mask);
}

/* ---- completions --------------------------------------------------------- */

void fv_push_send_cqe(struct fv_qp *qp, const struct fv_wr *wr, enum ibv_wc_status st)
{
    enum ibv_wc_opcode op = wr->opcode == IBV_WR_RDMA_READ    ? IBV_WC_RDMA_READ
                            : wr->opcode == IBV_WR_RDMA_WRITE ? IBV_WC_RDMA_WRITE
                            : wr->opcode == IBV_WR_BIND_MW    ? IBV_WC_BIND_MW
                            : wr->opcode == IBV_WR_LOCAL_INV  ? IBV_WC_LOCAL_INV
                                                              : IBV_WC_SEND;
    struct ibv_wc wc = {.wr_id = wr->wr_id,
                        .status = st,
                        .qp_num = qp->qp.qp_num,
                        .opcode = op,
                        .byte_len = wr->opcode == IBV_WR_RDMA_READ ? wr->len : 0};
    if (st != IBV_WC_SUCCESS)
        wc.vendor_err = 0x81;
    if (st != IBV_WC_SUCCESS || wr->signaled)
        fv_cq_push(qp->qp.send_cq, &wc, qp, wr->seq);
}

enum ibv_wc_status fv_nak_status(int nak)
{
    switch (nak) {
    case NAK_OK:
        return IBV_WC_SUCCESS;
    case NAK_ACCESS:
        return IBV_WC_REM_ACCESS_ERR;
    case NAK_INVALID:
        return IBV_WC_REM_INV_REQ_ERR;
    case NAK_REMOP:
        return IBV_WC_REM_OP_ERR;
    case NAK_RNR:
        return IBV_WC_RNR_RETRY_EXC_ERR;
    default:
        return IBV_WC_LOC_PROT_ERR;
    }
}

void fv_complete_locals_locked(struct fv_qp *qp)
{
    while (qp->wait_head && qp->wait_head->local) {
        struct fv_wr *w = qp->wait_head;
        qp->wait_head = w->next;
        if (!qp->wait_head)
            qp->wait_tail = NULL;
        fv_push_send_cqe(qp, w, w->local_st);
        free(w);
    }
}

void fv_free_out(struct fv_out *o)
{
    free(o->payload);
    free(o->wr);
    free(o);
}

/* Moves the QP to ERR: stops its link, waits until no thread touches user
 * memory, then completes every outstanding WR, sent or not — the oldest
 * with `first` (e.g. RETRY_EXC when the peer vanished), the rest with
 * WR_FLUSH_ERR — and flushes posted receives. After this no buffer of a
 * flushed WR is touched. A QP already in error (the application moved it
 * there, which stops the link and so wakes its reader here too) flushes
 * everything: the link ending is its doing, not the oldest WR's fault. */
void fv_qp_to_error(struct fv_qp *qp, enum ibv_wc_status first)
{
    pthread_mutex_lock(&qp->lock);
    bool was_err = qp->st == IBV_QPS_ERR;
    if (was_err)
        first = IBV_WC_WR_FLUSH_ERR;
    set_state_locked(qp, IBV_QPS_ERR, false);
    if (qp->sock >= 0)
        shutdown(qp->sock, SHUT_RDWR);
    /* The wait below lets go of the lock: a WR posted meanwhile is queued
     * behind the outstanding ones and flushed after them, never before
     * (completions stay in send-queue order: an application counting older
     * unsignaled WRs as done on a newer CQE relies on it). */
    qp->flushing++;
    while (qp->busy > 0)
        pthread_cond_wait(&qp->cond, &qp->lock);
    qp->flushing--;
    struct fv_wr *w = qp->wait_head;
    qp->wait_head = qp->wait_tail = NULL;
    struct fv_out *o = qp->out_head;
    qp->out_head = qp->out_tail = NULL;
    for (; w; first = IBV_WC_WR_FLUSH_ERR) {
        struct fv_wr *next = w->next;
        /* a local operation that failed reports its own error */
        fv_push_send_cqe(qp, w, w->local && w->local_st ? w->local_st : first);
        free(w);
        w = next;
    }
    while (o) { /* not sent yet: a NIC would still have retried the oldest */
        struct fv_out *next = o->next;
        if (o->wr) {
            fv_push_send_cqe(qp, o->wr, first);
            first = IBV_WC_WR_FLUSH_ERR;
        }
        fv_free_out(o);
        o = next;
    }
    for (uint32_t i = 0; i < qp->rq_count; i++) {
        struct ibv_wc wc = {.wr_id = qp->rq[(qp->rq_head + i) % qp->max_recv_wr].wr_id,
                            .status = IBV_WC_WR_FLUSH_ERR,
                            .opcode = IBV_WC_RECV,
                            .qp_num = qp->qp.qp_num};
        fv_cq_push(qp->qp.recv_cq, &wc, NULL, 0);
    }
    qp->rq_count = 0;
    qp->rq_head = 0;
    qp->rnr_until_ns = 0;
    struct fv_id *id = qp->cm_id;
    pthread_cond_broadcast(&qp->cond);
    pthread_mutex_unlock(&qp->lock);
    if (!was_err && id)
        fv_cm_post_disconnected(id);
}

/* ---- posting ------------------------------------------------------------- */

static struct fv_wr *copy_wr(const struct ibv_send_wr *wr, bool sig_all)
{
    struct fv_wr *w = calloc(1, sizeof(*w) + (size_t)wr->num_sge * sizeof(struct ibv_sge));
    if (!w)
        return NULL;
    w->wr_id = wr->wr_id;
    w->opcode = wr->opcode;
    w->signaled = sig_all || (wr->send_flags & IBV_SEND_SIGNALED);
    if (wr->opcode == IBV_WR_RDMA_WRITE || wr->opcode == IBV_WR_RDMA_READ) {
        w->remote_addr = wr->wr.rdma.remote_addr;
        w->rkey = wr->wr.rdma.rkey;
    }
    if (wr->opcode == IBV_WR_SEND_WITH_IMM)
        w->imm = wr->imm_data;
    if (wr->opcode == IBV_WR_BIND_MW) {
        w->mw = wr->bind_mw.mw;
        w->rkey = wr->bind_mw.rkey;
        w->bind = wr->bind_mw.bind_info;
    }
    if (wr->opcode == IBV_WR_LOCAL_INV)
        w->rkey = wr->invalidate_rkey;
    w->num_sge = wr->num_sge;
    uint64_t len = 0;
    for (int i = 0; i < wr->num_sge; i++) {
        w->sge[i] = wr->sg_list[i];
        len += wr->sg_list[i].length;
    }
    w->len = (uint32_t)len;
    return w;
}

static int post_one(struct fv_qp *qp, struct ibv_send_wr *wr)
{
    if (wr->opcode != IBV_WR_RDMA_WRITE && wr->opcode != IBV_WR_RDMA_READ &&
        wr->opcode != IBV_WR_SEND && wr->opcode != IBV_WR_SEND_WITH_IMM &&
        wr->opcode != IBV_WR_BIND_MW && wr->opcode != IBV_WR_LOCAL_INV)
        return EINVAL; /* RDMA_WRITE_WITH_IMM, atomics, ...: not modelled */
    if (wr->opcode == IBV_WR_BIND_MW && (!wr->bind_mw.mw || wr->bind_mw.mw->type != IBV_MW_TYPE_2))
        return EINVAL; /* type 1 windows are bound with ibv_bind_mw */
    if (wr->opcode == IBV_WR_BIND_MW && fv_mw_fault_next(true) == FV_FAULT_POST)
        return ENOMEM; /* a test fault (fv_mw.c) */
    if (wr->num_sge < 0 || (uint32_t)wr->num_sge > qp->max_sge || (wr->num_sge && !wr->sg_list))
        return EINVAL;
    uint64_t len = 0;
    for (int i = 0; i < wr->num_sge; i++)
        len += wr->sg_list[i].length;
    if (len > FV_MAX_MSG)
        return EINVAL;
    pthread_mutex_lock(&qp->lock);
    if (qp->st != IBV_QPS_RTS && qp->st != IBV_QPS_ERR) {
        pthread_mutex_unlock(&qp->lock);
        return EINVAL;
    }
    if (qp->sq_posted - __atomic_load_n(&qp->sq_reclaimed, __ATOMIC_ACQUIRE) >= qp->max_send_wr ||
        (qp->st == IBV_QPS_RTS &&
         (wr->opcode == IBV_WR_RDMA_WRITE || wr->opcode == IBV_WR_RDMA_READ) &&
         fv_fault_sq_full())) { /* the second: a test fault (fv_mw.c) */
        pthread_mutex_unlock(&qp->lock);
        return ENOMEM; /* send queue full */
    }
    struct fv_wr *w = copy_wr(wr, qp->sq_sig_all);
    if (!w) {
        pthread_mutex_unlock(&qp->lock);
        return ENOMEM;
    }
    w->seq = ++qp->sq_posted;
    if (qp->st == IBV_QPS_ERR && !qp->flushing) { /* an errored QP flushes at once */
        fv_push_send_cqe(qp, w, IBV_WC_WR_FLUSH_ERR);
        free(w);
        pthread_mutex_unlock(&qp->lock);
        return 0;
    }
    struct fv_out *o = calloc(1, sizeof(*o));
    if (!o) {
        qp->sq_posted--;
        free(w);
        pthread_mutex_unlock(&qp->lock);
        return ENOMEM;
    }
    o->wr = w;
    if (qp->out_tail)
        qp->out_tail->next = o;
    else
        qp->out_head = o;
    qp->out_tail = o;
    pthread_cond_broadcast(&qp->cond);
    pthread_mutex_unlock(&qp->lock);
    return 0;
}

int fv_post_send_op(struct ibv_qp *q, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
    struct fv_qp *qp = qp_of(q);
    for (; wr; wr = wr->next) {
        int rc = post_one(qp, wr);
        if (rc) {
            if (bad)
                *bad = wr;
            return rc;
        }
    }
    return 0;
}

int fv_post_recv_op(struct ibv_qp *q, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
    struct fv_qp *qp = qp_of(q);
    pthread_mutex_lock(&qp->lock);
    for (; wr; wr = wr->next) {
        bool bad_wr = qp->st == IBV_QPS_RESET || wr->num_sge < 0 ||
                      (uint32_t)wr->num_sge > qp->max_recv_sge || (wr->num_sge && !wr->sg_list);
        if (bad_wr || qp->rq_count >= qp->max_recv_wr ||
            (!qp->rq && !(qp->rq = calloc(qp->max_recv_wr, sizeof(*qp->rq))))) {
            if (bad)
                *bad = wr;
            pthread_mutex_unlock(&qp->lock);
            return bad_wr ? EINVAL : ENOMEM;
        }
        if (qp->st == IBV_QPS_ERR) { /* posting to an errored QP flushes at once */
            struct ibv_wc wc = {.wr_id = wr->wr_id,
                                .status = IBV_WC_WR_FLUSH_ERR,
                                .opcode = IBV_WC_RECV,
                                .qp_num = qp->qp.qp_num};
            fv_cq_push(qp->qp.recv_cq, &wc, NULL, 0);
            continue;
        }
        struct fv_recv *r = &qp->rq[(qp->rq_head + qp->rq_count++) % qp->max_recv_wr];
        r->wr_id = wr->wr_id;
        r->num_sge = wr->num_sge;
        memcpy(r->sge, wr->sg_list, (size_t)wr->num_sge * sizeof(r->sge[0]));
    }
    pthread_mutex_unlock(&qp->lock);
    return 0;
}
