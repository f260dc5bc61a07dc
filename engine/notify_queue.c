/*
 * The engine's bounded queue of received notifications: a FIFO ring with an
 * eventfd that is readable while the ring is not empty (level-triggered in
 * effect: the take that empties the ring drains the counter).
 */
#include "internal.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

int notify_queue_init(xfer_engine *e)
{
    struct notify_queue *q = &e->notifs;
    q->cap = (size_t)e->cfg.notify_queue_len;
    q->v = calloc(q->cap, sizeof(*q->v));
    if (!q->v)
        return -XFER_ENOMEM;
    q->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (q->efd < 0) {
        free(q->v);
        q->v = NULL;
        xfer_engine_set_error(e, "notification queue: eventfd failed");
        return -XFER_ENOMEM;
    }
    pthread_mutex_init(&q->mu, NULL);
    return 0;
}

void notify_queue_destroy(xfer_engine *e)
{
    struct notify_queue *q = &e->notifs;
    if (!q->v)
        return;
    for (size_t k = 0; k < q->n; k++)
        free(q->v[(q->head + k) % q->cap]);
    free(q->v);
    q->v = NULL;
    close(q->efd);
    pthread_mutex_destroy(&q->mu);
}

int notify_queue_push(xfer_engine *e, struct xfer_notif *n)
{
    struct notify_queue *q = &e->notifs;
    pthread_mutex_lock(&q->mu);
    int rc = 0;
    if (q->n == q->cap) {
        q->refused++;
        rc = -XFER_ENOSPC;
    } else {
        q->v[(q->head + q->n) % q->cap] = n;
        if (q->n++ == 0) {
            uint64_t one = 1;
            if (write(q->efd, &one, sizeof(one)) < 0)
                xfer_debug("notification eventfd write failed");
        }
    }
    pthread_mutex_unlock(&q->mu);
    return rc;
}

int xfer_notif_poll(xfer_engine *e, struct xfer_notif **out, size_t max)
{
    if (!e || (!out && max))
        return -XFER_EINVAL;
    struct notify_queue *q = &e->notifs;
    pthread_mutex_lock(&q->mu);
    size_t k = 0;
    for (; k < max && q->n > 0; k++) {
        out[k] = q->v[q->head];
        q->v[q->head] = NULL;
        q->head = (q->head + 1) % q->cap;
        q->n--;
    }
    if (k > 0 && q->n == 0) {
        uint64_t drain;
        if (read(q->efd, &drain, sizeof(drain)) < 0 && errno != EAGAIN)
            xfer_debug("notification eventfd drain failed");
    }
    pthread_mutex_unlock(&q->mu);
    return (int)(k > (size_t)0x7fffffff ? 0x7fffffff : k);
}

void xfer_notif_free(struct xfer_notif *n)
{
    free(n);
}

int xfer_notif_fd(const xfer_engine *e)
{
    return e ? e->notifs.efd : -1;
}

size_t xfer_notif_pending(xfer_engine *e)
{
    if (!e)
        return 0;
    pthread_mutex_lock(&e->notifs.mu);
    size_t n = e->notifs.n;
    pthread_mutex_unlock(&e->notifs.mu);
    return n;
}

uint64_t xfer_notif_refused(xfer_engine *e)
{
    if (!e)
        return 0;
    pthread_mutex_lock(&e->notifs.mu);
    uint64_t n = e->notifs.refused;
    pthread_mutex_unlock(&e->notifs.mu);
    return n;
}
