/*
 * Who reads an accepted ipc connection (issues 10 and 15, docs/notify.md
 * "ipc"): its serving thread, or a thread waiting for a message from that
 * peer (the RTS its RECV waits for, the FIN of its SEND).
 *
 * Why: a message used to wake the serving thread (asleep in poll on the
 * socket), which handed it to the engine, which woke the waiter: two
 * wake-ups per one-way message. Now the waiter polls the socket itself and
 * serves what arrives, as tcp's message waiters do (docs/perf.md, "Message
 * waiters read their peer's socket"): one wake-up.
 *
 * Rules. Requests are read and answered under rx_mu, one at a time, by
 * whoever holds it; the per-connection state (pin slots, loans, mappings)
 * is touched only there. The serving thread sleeps in epoll_wait on its own
 * epoll set holding only the socket. While waiters poll the socket
 * (waiters > 0) the set's EPOLLIN is off, so the serving thread is not
 * woken for what they read (an epoll_ctl, no wake-up); if it was woken
 * anyway (the data came before the first waiter turned it off, or a
 * hang-up, which epoll reports regardless) it notes `skipped` and goes
 * back to epoll_wait (on a hang-up it parks on rx_cv until the last waiter
 * leaves, not to spin on it). A waiter that stops polling reads the socket
 * if its poll saw it readable or the serving thread skipped an edge, then
 * the last one gives EPOLLIN back (level-triggered: what is left wakes the
 * serving thread) and unparks it if parked. A request the waiter
 * cannot serve (malformed, peer gone) ends the connection as it would in
 * the serving thread: `failed` is set and the socket shut down, which wakes
 * the serving thread to clean up. Every wait is bounded: the waiter's poll
 * by its slice (batch.c, 20 ms), a request's reading and answer by
 * io_timeout_ms (ipc_recv, ipc_send), the parked serving thread by 500 ms.
 */
#include "ipc_serve.h"
#include "mono_clock.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

int ipc_rx_init(struct serve_conn *c)
{
    c->ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP};
    if (c->ep < 0 || epoll_ctl(c->ep, EPOLL_CTL_ADD, c->fd, &ev) < 0) {
        if (c->ep >= 0)
            close(c->ep);
        return -XFER_EIO;
    }
    pthread_mutex_init(&c->rx_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&c->rx_cv, &ca);
    pthread_condattr_destroy(&ca);
    return 0;
}

void ipc_rx_fini(struct serve_conn *c)
{
    close(c->ep);
    pthread_mutex_destroy(&c->rx_mu);
    pthread_cond_destroy(&c->rx_cv);
}

/* rx_mu held: the serving thread's interest in the socket's input. */
static void interest(struct serve_conn *c, bool on)
{
    struct epoll_event ev = {.events = on ? EPOLLIN | EPOLLRDHUP : 0};
    if (epoll_ctl(c->ep, EPOLL_CTL_MOD, c->fd, &ev) < 0)
        xfer_debug("ipc: epoll_ctl on a served connection: %s", strerror(errno));
}

static bool readable_now(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    return poll(&p, 1, 0) > 0;
}

int ipc_rx_serve_step(struct serve_conn *c, int timeout_ms)
{
    pthread_mutex_lock(&c->rx_mu);
    uint64_t served = c->served; /* unchanged after the wait: nobody read what woke us */
    pthread_mutex_unlock(&c->rx_mu);
    struct epoll_event ev;
    int n = epoll_wait(c->ep, &ev, 1, timeout_ms);
    if (n < 0 && errno != EINTR)
        return -XFER_EIO;
    int rc = 0;
    pthread_mutex_lock(&c->rx_mu);
    if (c->waiters > 0 && !(n > 0 && (ev.events & (EPOLLHUP | EPOLLERR)))) {
        /* Woken by data a waiter now polls for (it came before the waiter
         * turned EPOLLIN off): it is the waiter's, and the last waiter
         * turning EPOLLIN back on wakes us for what it leaves. */
        c->skipped |= n > 0;
    } else if (c->waiters > 0) {
        /* A hang-up, which epoll reports whatever the interest: sleep
         * until the waiters are gone rather than spin on it. */
        c->skipped = true;
        c->parked = true;
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_sec += 1; /* at most 1 s: then it looks at stop and leases */
        while (c->waiters > 0 && !c->failed)
            if (pthread_cond_timedwait(&c->rx_cv, &c->rx_mu, &ts) == ETIMEDOUT)
                break;
        c->parked = false;
    } else if (n > 0 && !c->failed &&
               (((ev.events & EPOLLIN) && c->served == served) || readable_now(c->fd))) {
        rc = ipc_serve_one(c);
    }
    if (rc == 0)
        rc = c->failed;
    pthread_mutex_unlock(&c->rx_mu);
    return rc;
}

void ipc_rx_close(struct serve_conn *c, int rc)
{
    pthread_mutex_lock(&c->rx_mu);
    if (!c->failed)
        c->failed = rc < 0 ? rc : -XFER_ECONN;
    pthread_mutex_unlock(&c->rx_mu);
}

/* node's newest live connection, held (pins) until unpin. */
static struct serve_conn *pin(struct ipc_server *s, const char *node)
{
    pthread_mutex_lock(&s->mu);
    struct serve_conn *c = s->conns; /* newest first */
    while (c && (s->stopping || !c->ready || c->done || strcmp(c->peer_node, node) != 0))
        c = c->next;
    if (c)
        __atomic_add_fetch(&c->pins, 1, __ATOMIC_ACQ_REL);
    pthread_mutex_unlock(&s->mu);
    return c;
}

static void unpin(struct serve_conn *c)
{
    pthread_mutex_lock(&c->srv->mu);
    __atomic_sub_fetch(&c->pins, 1, __ATOMIC_ACQ_REL);
    pthread_mutex_unlock(&c->srv->mu);
}

/* Busy-polls p (the socket, wake_fd) without sleeping for up to spin_us:
 * > 0 when one of them is ready, as poll. */
static int spin_poll(struct pollfd *p, nfds_t n, int spin_us)
{
    int64_t end = xfer_mono_ns() + (int64_t)spin_us * 1000;
    int k;
    while ((k = poll(p, n, 0)) == 0 && xfer_mono_ns() < end)
        ;
    return k;
}

int ipc_server_wait_in(struct ipc_server *s, const char *node, int wake_fd, int timeout_ms,
                       int spin_us)
{
    struct serve_conn *c = s ? pin(s, node) : NULL;
    if (!c)
        return -1;
    pthread_mutex_lock(&c->rx_mu);
    bool over = c->failed != 0;
    if (!over && c->waiters++ == 0)
        interest(c, false);
    uint64_t served = c->served;
    pthread_mutex_unlock(&c->rx_mu);
    if (over) {
        unpin(c);
        return -1;
    }
    /* fd stays open while c is pinned (conn_free waits for the pins). */
    struct pollfd p[2] = {{.fd = c->fd, .events = POLLIN | POLLRDHUP},
                          {.fd = wake_fd, .events = POLLIN}};
    nfds_t np = wake_fd >= 0 ? 2 : 1;
    int k = spin_us > 0 ? spin_poll(p, np, spin_us) : 0;
    if (k == 0)
        k = poll(p, np, timeout_ms);
    int rc = k < 0 && errno != EINTR ? -1 : 0;
    pthread_mutex_lock(&c->rx_mu);
    bool ready = (k > 0 && p[0].revents) || c->skipped;
    /* What our poll saw is still there unless another waiter read since
     * (the serving thread does not while we are counted) */
    bool there = k > 0 && (p[0].revents & POLLIN) && c->served == served;
    c->skipped = false;
    c->waiters--;
    if (!c->failed && ready && (there || readable_now(c->fd))) {
        int err = ipc_serve_one(c);
        if (err < 0) { /* over, as in the serving thread: it cleans up */
            c->failed = err;
            shutdown(c->fd, SHUT_RDWR);
        }
    }
    if (c->failed)
        rc = -1;
    if (c->waiters == 0 && !c->failed)
        interest(c, true);
    if (c->parked && (c->waiters == 0 || c->failed))
        pthread_cond_signal(&c->rx_cv);
    pthread_mutex_unlock(&c->rx_mu);
    unpin(c);
    return rc;
}

int ipc_conn_wait_rx(struct xfer_conn *xc, void *chan, bool inbound, xfer_batch *b, int timeout_ms)
{
    (void)chan;
    if (!inbound)
        return -1;
    struct ipc_transport *t = container_of(xc->transport, struct ipc_transport, base);
    if (!xfer_batch_running(b))
        return 0; /* the caller sees the end */
    /* XFER_BUSY_POLL_US: spin on the socket first (XFER_CAP_RX_SPIN) */
    int spin = xfer_engine_config_get(xc->transport->engine)->busy_poll_us;
    return ipc_server_wait_in(t->server, xfer_peer_desc_get(xc->peer)->node_id,
                              xfer_batch_wake_fd(b), timeout_ms,
                              spin < timeout_ms * 1000 ? spin : timeout_ms * 1000);
}

int ipc_notif_wait_rx(struct xfer_transport *xt, const char *node, int timeout_ms)
{
    if (!node || !*node)
        return -1; /* "the connection the last message came on": not tracked here */
    struct ipc_transport *t = container_of(xt, struct ipc_transport, base);
    xfer_engine *e = xt->engine;
    int spin = xfer_engine_config_get(e)->busy_poll_us;
    /* Serves at most one request; xfer_notif_wait's loop looks at the queue
     * (a notification this thread queued itself does not write the wake
     * fd) and its deadline, and calls again. */
    return ipc_server_wait_in(t->server, node, xfer_notif_wake_fd(e), timeout_ms,
                              spin < timeout_ms * 1000 ? spin : timeout_ms * 1000) < 0
               ? -1 /* no such connection: the caller sleeps */
               : 0;
}
