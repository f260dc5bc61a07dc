/*
 * The engine's bounded queue of received notifications: a FIFO ring with an
 * eventfd that is readable while the ring is not empty (level-triggered in
 * effect: the take that empties the ring drains the counter).
 */
#include "internal.h"

#include "transport.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
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
        msg_notif_free(q->v[(q->head + k) % q->cap]);
    free(q->v);
    q->v = NULL;
    close(q->efd);
    pthread_mutex_destroy(&q->mu);
}

/* The engine this thread waits in xfer_notif_wait for (it is one of that
 * queue's sleepers), else NULL. */
static __thread const xfer_engine *waiting_in;

/* mu held: makes efd readable (n > 0). */
static void arm(struct notify_queue *q)
{
    uint64_t one = 1;
    if (!q->armed && write(q->efd, &one, sizeof(one)) < 0)
        xfer_debug("notification eventfd write failed");
    q->armed = true;
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
        q->n++;
        /* A waiter that read the socket itself needs no wake-up. */
        if (q->exported || q->sleepers > (waiting_in == e ? 1 : 0))
            arm(q);
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
    if (k > 0 && q->n == 0 && q->armed) {
        q->armed = false;
        uint64_t drain;
        if (read(q->efd, &drain, sizeof(drain)) < 0 && errno != EAGAIN)
            xfer_debug("notification eventfd drain failed");
    }
    pthread_mutex_unlock(&q->mu);
    return (int)(k > (size_t)0x7fffffff ? 0x7fffffff : k);
}

void xfer_notif_free(struct xfer_notif *n)
{
    msg_notif_free(n);
}

int xfer_notif_fd(const xfer_engine *e)
{
    if (!e)
        return -1;
    /* From now on it is readable whenever the queue is not empty. The
     * queue is the engine's mutable state (e itself is never const). */
    struct notify_queue *q = (struct notify_queue *)&e->notifs;
    pthread_mutex_lock(&q->mu);
    q->exported = true;
    if (q->n > 0)
        arm(q);
    pthread_mutex_unlock(&q->mu);
    return q->efd;
}

int xfer_notif_wake_fd(xfer_engine *e)
{
    return e->notifs.efd;
}

/* A notification waiter polls or reads a socket at most this long at a
 * time, then checks the queue and its deadline again. */
#define NOTIF_WAIT_SLICE_MS 20

/* One slice: a transport's waiter-driven receive for node's channel, else
 * a sleep on the queue's eventfd. */
static void notif_wait_slice(xfer_engine *e, const char *node, int ms)
{
    static int rx_on = -1;
    if (rx_on < 0) {
        __atomic_store_n(&rx_on, !xfer_env_off("XFER_NOTIF_WAIT_RX"), __ATOMIC_RELAXED);
    }
    for (size_t k = 0; __atomic_load_n(&rx_on, __ATOMIC_RELAXED) && k < e->n_transports; k++) {
        struct xfer_transport *t = e->transports[k];
        if (t->ops->notif_wait_rx && t->ops->notif_wait_rx(t, node, ms) >= 0)
            return;
    }
    struct pollfd p = {.fd = e->notifs.efd, .events = POLLIN};
    if (poll(&p, 1, ms) < 0 && errno != EINTR) /* readable: sleepers > 0 */
        xfer_debug("notification wait: poll failed");
}

int xfer_notif_wait(xfer_engine *e, const char *node_id, int timeout_ms)
{
    if (!e)
        return -XFER_EINVAL;
    struct notify_queue *q = &e->notifs;
    int64_t end = timeout_ms < 0 ? INT64_MAX : xfer_mono_ns() + (int64_t)timeout_ms * 1000000;
    const xfer_engine *outer = waiting_in; /* a callback of another engine's wait */
    waiting_in = e;
    pthread_mutex_lock(&q->mu);
    q->sleepers++; /* from here on a push by another thread writes efd */
    size_t n;
    while ((n = q->n) == 0) {
        pthread_mutex_unlock(&q->mu);
        int64_t left = end - xfer_mono_ns();
        if (left > 0)
            notif_wait_slice(e, node_id,
                             left >= (int64_t)NOTIF_WAIT_SLICE_MS * 1000000
                                 ? NOTIF_WAIT_SLICE_MS
                                 : (int)((left + 999999) / 1000000));
        pthread_mutex_lock(&q->mu);
        if (left <= 0)
            break;
    }
    q->sleepers--;
    pthread_mutex_unlock(&q->mu);
    waiting_in = outer;
    return n > INT_MAX ? INT_MAX : (int)n;
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
