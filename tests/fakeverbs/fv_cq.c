/* fakeverbs: completion queues and completion channels. */
#include "fv_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *ctx)
{
    struct fv_comp_channel *c = calloc(1, sizeof(*c));
    int p[2];
    if (!c || pipe2(p, O_CLOEXEC)) {
        free(c);
        errno = ENOMEM;
        return NULL;
    }
    fcntl(p[1], F_SETFL, O_NONBLOCK);
    c->ch.context = ctx;
    c->ch.fd = p[0];
    c->wfd = p[1];
    return &c->ch;
}

int ibv_destroy_comp_channel(struct ibv_comp_channel *ch)
{
    if (!ch)
        return EINVAL;
    if (ch->refcnt)
        return EBUSY;
    struct fv_comp_channel *c = container_of(ch, struct fv_comp_channel, ch);
    close(c->ch.fd);
    close(c->wfd);
    free(c);
    return 0;
}

struct ibv_cq *ibv_create_cq(struct ibv_context *ctx, int cqe, void *cq_context,
                             struct ibv_comp_channel *channel, int comp_vector)
{
    (void)comp_vector;
    if (!ctx || cqe < 1 || cqe > (1 << 20)) {
        errno = EINVAL;
        return NULL;
    }
    struct fv_cq *q = calloc(1, sizeof(*q));
    if (!q || !(q->ring = calloc((size_t)cqe, sizeof(*q->ring)))) {
        free(q);
        errno = ENOMEM;
        return NULL;
    }
    pthread_mutex_init(&q->lock, NULL);
    pthread_mutex_init(&q->cq.mutex, NULL);
    q->cap = cqe;
    q->cq.context = ctx;
    q->cq.channel = channel;
    q->cq.cq_context = cq_context;
    q->cq.cqe = cqe;
    if (channel)
        channel->refcnt++;
    return &q->cq;
}

int ibv_destroy_cq(struct ibv_cq *cq)
{
    if (!cq)
        return EINVAL;
    struct fv_cq *q = container_of(cq, struct fv_cq, cq);
    if (cq->channel)
        cq->channel->refcnt--;
    pthread_mutex_destroy(&q->lock);
    free(q->ring);
    free(q);
    return 0;
}

/* Adds a CQE. A full CQ overflows: the CQE is lost and the CQ is in error
 * from then on (a NIC raises IBV_EVENT_CQ_ERR); poll_cq reports it. */
void fv_cq_push(struct ibv_cq *cq, const struct ibv_wc *wc, struct fv_qp *qp, uint64_t seq)
{
    struct fv_cq *q = container_of(cq, struct fv_cq, cq);
    bool notify = false;
    pthread_mutex_lock(&q->lock);
    if (q->count == q->cap) {
        q->overflow = true;
    } else {
        struct fv_cqe *e = &q->ring[(q->head + q->count) % q->cap];
        e->wc = *wc;
        e->qp = qp;
        e->seq = seq;
        q->count++;
    }
    if (q->armed && cq->channel) {
        q->armed = false;
        notify = true;
    }
    pthread_mutex_unlock(&q->lock);
    if (notify) {
        struct fv_comp_channel *c = container_of(cq->channel, struct fv_comp_channel, ch);
        ssize_t w = write(c->wfd, &cq, sizeof(cq));
        (void)w; /* one event per arm; the pipe cannot fill up in practice */
    }
}

void fv_cq_forget_qp(struct ibv_cq *cq, struct fv_qp *qp)
{
    struct fv_cq *q = container_of(cq, struct fv_cq, cq);
    pthread_mutex_lock(&q->lock);
    for (int i = 0; i < q->count; i++) {
        struct fv_cqe *e = &q->ring[(q->head + i) % q->cap];
        if (e->qp == qp)
            e->qp = NULL;
    }
    pthread_mutex_unlock(&q->lock);
}

/* Send-queue slots are reclaimed when their CQE is polled, as on hardware.
 * Atomic, so the CQ lock never nests a QP lock (QP code pushes CQEs while
 * holding its own lock). */
static void reclaim(struct fv_qp *qp, uint64_t seq)
{
    uint64_t cur = __atomic_load_n(&qp->sq_reclaimed, __ATOMIC_ACQUIRE);
    while (seq > cur && !__atomic_compare_exchange_n(&qp->sq_reclaimed, &cur, seq, false,
                                                     __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        ;
}

int fv_cq_poll(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
    struct fv_cq *q = container_of(cq, struct fv_cq, cq);
    int got = 0;
    pthread_mutex_lock(&q->lock);
    if (q->overflow) {
        pthread_mutex_unlock(&q->lock);
        return -EOVERFLOW;
    }
    while (got < n && q->count > 0) {
        struct fv_cqe *e = &q->ring[q->head];
        wc[got++] = e->wc;
        if (e->qp && e->seq)
            reclaim(e->qp, e->seq);
        q->head = (q->head + 1) % q->cap;
        q->count--;
    }
    pthread_mutex_unlock(&q->lock);
    return got;
}

/* Arms the CQ for the next new CQE only, as hardware does: completions
 * already queued do not raise an event (poll again after arming). */
int fv_cq_notify(struct ibv_cq *cq, int solicited)
{
    (void)solicited;
    struct fv_cq *q = container_of(cq, struct fv_cq, cq);
    pthread_mutex_lock(&q->lock);
    q->armed = true;
    pthread_mutex_unlock(&q->lock);
    return 0;
}

int ibv_get_cq_event(struct ibv_comp_channel *ch, struct ibv_cq **cq, void **cq_context)
{
    struct ibv_cq *got;
    ssize_t r = read(ch->fd, &got, sizeof(got));
    if (r != (ssize_t)sizeof(got))
        return -1;
    *cq = got;
    *cq_context = got->cq_context;
    return 0;
}

void ibv_ack_cq_events(struct ibv_cq *cq, unsigned int n)
{
    pthread_mutex_lock(&cq->mutex);
    cq->comp_events_completed += n;
    pthread_mutex_unlock(&cq->mutex);
}
