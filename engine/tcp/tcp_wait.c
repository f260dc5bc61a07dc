/*
 * Waiter-driven receive (issue 15): the thread waiting for a batch whose
 * chunks all went out on one socket polls that socket itself and reads the
 * responses when they arrive, instead of sleeping until the socket's
 * progress thread has read them and woken it (one thread hand-off less per
 * round trip).
 *
 * While a waiter polls, the owner leaves EPOLLIN on the socket to it
 * (s->waiters). The waiter stops polling (waiters - 1, seq_cst), then takes
 * iomu and reads whatever is there: an edge the owner skipped is read then,
 * and one that comes later finds waiters at 0. What the reading waiter may
 * not do, because it touches the owner's lists, it leaves to the owner
 * through a kick: going on past the rx budget, closing the socket after a
 * failure (tcp_sock_deferred). Sockets that carried GPU chunks are left to
 * the owner (staging is the owner's).
 */
#include "tcp.h"

#include <errno.h>
#include <poll.h>

void tcp_sock_deferred(struct tcp_sock *s)
{
    if (!s->rx_defer)
        return;
    s->rx_defer = false;
    if (s->fail_defer) {
        s->fail_defer = false;
        tcp_sock_fail_as(s, s->fail_lvl, s->fail_why);
    } else if (s->fd >= 0) {
        tcp_sock_readable(s); /* the waiter stopped at the rx budget */
    }
}

int tcp_wait_rx(struct xfer_conn *c, void *chan, xfer_batch *b, int timeout_ms)
{
    (void)c;
    struct tcp_sock *s = chan;
    if (!s || s->target)
        return -1;
    pthread_mutex_lock(&s->qmu);
    bool gpu = s->gpu_seen;
    pthread_mutex_unlock(&s->qmu);
    if (gpu)
        return -1;
    int rc = 0;
    __atomic_add_fetch(&s->waiters, 1, __ATOMIC_SEQ_CST);
    /* fd is read without iomu: if the owner closes it meanwhile, poll sees
     * a stale or reused descriptor for at most timeout_ms, and the check
     * under iomu below ends the waiting. */
    int fd = __atomic_load_n(&s->fd, __ATOMIC_RELAXED);
    if (fd >= 0 && xfer_batch_running(b)) {
        /* The owner may have taken the answer just before we polled: the
         * end of the run then wakes us through the batch's eventfd. */
        struct pollfd p[2] = {{.fd = fd, .events = POLLIN | POLLRDHUP},
                              {.fd = xfer_batch_wake_fd(b), .events = POLLIN}};
        if (poll(p, 2, timeout_ms) < 0 && errno != EINTR)
            rc = -1;
    }
    __atomic_sub_fetch(&s->waiters, 1, __ATOMIC_SEQ_CST);
    pthread_mutex_lock(&s->iomu);
    pthread_mutex_lock(&s->qmu);
    gpu = s->gpu_seen; /* a GPU chunk queued meanwhile: its answer is the owner's */
    pthread_mutex_unlock(&s->qmu);
    if (s->fd < 0) {
        rc = -1;
    } else if (gpu) {
        s->rx_defer = true; /* an edge skipped while we polled is read there */
    } else {
        s->by_waiter = true;
        tcp_sock_readable(s);
        s->by_waiter = false;
    }
    bool defer = s->rx_defer;
    pthread_mutex_unlock(&s->iomu);
    if (defer) { /* the owner carries on (and this waiter sleeps as usual) */
        tcp_thread_kick(s);
        rc = -1;
    }
    return rc;
}
