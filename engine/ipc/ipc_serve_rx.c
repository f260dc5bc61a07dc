/*
 * Who reads an accepted ipc connection (issues 10 and 15, docs/notify.md
 * "ipc"): its serving thread, or a thread waiting for a message from that
 * peer (the RTS its RECV waits for, the FIN of its SEND, a notification in
 * xfer_notif_wait), or from any peer (xfer_notif_wait(e, NULL, ...)).
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
 * epoll set holding the socket and a timer. While waiters poll the socket
 * (waiters > 0) the set's EPOLLIN is off, so the serving thread is not
 * woken for what they read (an epoll_ctl, no wake-up); if it was woken
 * anyway (the data came before the first waiter turned it off, or a
 * hang-up, which epoll reports regardless) it notes `skipped` and goes
 * back to epoll_wait (on a hang-up it parks on rx_cv until the last waiter
 * leaves, not to spin on it). A waiter that stops polling reads the socket
 * if its poll saw it readable or the serving thread skipped an edge.
 *
 * Linger. The last waiter to leave does not give EPOLLIN back at once: it
 * arms the timer for linger_us (XFER_IPC_LINGER_US, default 200 us) and
 * the connection stays the waiters' (`lingering`). Why: in a blocking
 * ping-pong (xfer_send, then xfer_recv) the peer's next message arrives
 * before this side's RECV exists; read by the serving thread it would be
 * an unexpected message (queued, answered 0, completed later by a FIN: a
 * second round trip and a second wake-up on each side). Left in the socket
 * it is read by the RECV's waiter a few microseconds later, matched on
 * arrival and answered XFER_MSG_DELIVERED, as if the RECV had been posted
 * ahead. A waiter that comes back meanwhile needs no epoll_ctl (EPOLLIN is
 * still off). If none does, the timer wakes the serving thread, which takes
 * the socket back (EPOLLIN on; what waits is read at once): a message
 * nobody waits for is read at most linger_us late. A hang-up is seen at
 * once (epoll reports it whatever the interest).
 *
 * A request the waiter cannot serve (malformed, peer gone) ends the
 * connection as it would in the serving thread: `failed` is set and the
 * socket shut down, which wakes the serving thread to clean up. Every wait
 * is bounded: the waiter's poll by its slice (batch.c, 20 ms), a request's
 * reading and answer by io_timeout_ms (ipc_recv, ipc_send), the parked
 * serving thread by 1 s, the linger by linger_us.
 */
#include "ipc_serve.h"
#include "mono_clock.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

enum { EV_SOCK, EV_TIMER }; /* epoll data of c->ep's two fds */

/* At most this many connections are polled by one wait for any peer; the
 * next wait starts after them (s->any_next), so every peer gets its turn. */
#define WAIT_ANY_MAX 8

int ipc_rx_init(struct serve_conn *c)
{
    c->ep = epoll_create1(EPOLL_CLOEXEC);
    c->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.u32 = EV_SOCK};
    struct epoll_event tv = {.events = EPOLLIN, .data.u32 = EV_TIMER};
    if (c->ep < 0 || c->tfd < 0 || epoll_ctl(c->ep, EPOLL_CTL_ADD, c->fd, &ev) < 0 ||
        epoll_ctl(c->ep, EPOLL_CTL_ADD, c->tfd, &tv) < 0) {
        if (c->ep >= 0)
            close(c->ep);
        if (c->tfd >= 0)
            close(c->tfd);
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
    close(c->tfd);
    pthread_mutex_destroy(&c->rx_mu);
    pthread_cond_destroy(&c->rx_cv);
}

/* rx_mu held: the serving thread's interest in the socket's input. */
static void interest(struct serve_conn *c, bool on)
{
    struct epoll_event ev = {.events = on ? EPOLLIN | EPOLLRDHUP : 0, .data.u32 = EV_SOCK};
    if (epoll_ctl(c->ep, EPOLL_CTL_MOD, c->fd, &ev) < 0)
        xfer_debug("ipc: epoll_ctl on a served connection: %s", strerror(errno));
}

/* rx_mu held: a thread starts polling the socket. */
static void rx_enter(struct serve_conn *c)
{
    if (c->waiters++ > 0)
        return;
    if (c->lingering) /* EPOLLIN is still off; the timer, if it fires, finds us */
        c->lingering = false;
    else
        interest(c, false);
}

/* rx_mu held: a thread stopped polling; the last one lingers (above). */
static void rx_leave(struct serve_conn *c)
{
    if (--c->waiters > 0 || c->failed)
        return;
    int us = c->srv->linger_us;
    struct itimerspec it = {.it_value = {us / 1000000, (long)(us % 1000000) * 1000}};
    if (us > 0 && timerfd_settime(c->tfd, 0, &it, NULL) == 0) {
        c->lingering = true;
        return;
    }
    interest(c, true);
}

static bool readable_now(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    return poll(&p, 1, 0) > 0;
}

/* rx_mu held: the linger's timer fired (tfd drained). Nobody came back:
 * the serving thread takes the socket back (level-triggered: what waits
 * wakes it again at once). */
static void linger_over(struct serve_conn *c)
{
    if (!c->lingering || c->waiters > 0)
        return; /* a waiter came back (and may have left again: re-armed) */
    c->lingering = false;
    if (!c->failed)
        interest(c, true);
}

int ipc_rx_serve_step(struct serve_conn *c, int timeout_ms)
{
    pthread_mutex_lock(&c->rx_mu);
    uint64_t served = c->served; /* unchanged after the wait: nobody read what woke us */
    pthread_mutex_unlock(&c->rx_mu);
    struct epoll_event ev[2];
    int n = epoll_wait(c->ep, ev, 2, timeout_ms);
    if (n < 0 && errno != EINTR)
        return -XFER_EIO;
    uint32_t sock = 0; /* the socket's events, 0: not reported */
    bool timer = false;
    for (int i = 0; i < n; i++) {
        if (ev[i].data.u32 == EV_TIMER)
            timer = true;
        else
            sock = ev[i].events;
    }
    uint64_t ticks;
    if (timer && read(c->tfd, &ticks, sizeof(ticks)) < 0 && errno != EAGAIN)
        xfer_debug("ipc: linger timer read: %s", strerror(errno));
    int rc = 0;
    pthread_mutex_lock(&c->rx_mu);
    if (timer)
        linger_over(c);
    if (c->waiters > 0 && !(sock & (EPOLLHUP | EPOLLERR))) {
        /* Woken by data a waiter now polls for (it came before the waiter
         * turned EPOLLIN off): it is the waiter's, and the last waiter
         * reads it before it leaves. */
        c->skipped |= sock != 0;
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
    } else if (sock && !c->failed &&
               (((sock & EPOLLIN) && c->served == served) || readable_now(c->fd))) {
        rc = ipc_serve_one(c); /* lingering too on a hang-up: EOF ends it */
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

static bool live(const struct ipc_server *s, const struct serve_conn *c)
{
    return !s->stopping && c->ready && !c->done;
}

/* Pins (until unpin) node's newest live connection, or with node NULL up
 * to max live connections of any peer, the first after the previous such
 * wait's; returns how many. */
static int pin(struct ipc_server *s, const char *node, struct serve_conn **v, int max)
{
    pthread_mutex_lock(&s->mu);
    int n = 0, all = 0;
    for (struct serve_conn *c = s->conns; c; c = c->next) /* newest first */
        all += live(s, c) && (!node || strcmp(c->peer_node, node) == 0);
    int skip = node || all <= max ? 0 : (int)(s->any_next++ % (unsigned)all);
    int k = 0;
    for (struct serve_conn *c = s->conns; c && n < max; c = c->next) {
        if (!live(s, c) || (node && strcmp(c->peer_node, node) != 0))
            continue;
        if ((k++ - skip + all) % all < max) { /* the max after skip, round the list */
            __atomic_add_fetch(&c->pins, 1, __ATOMIC_ACQ_REL);
            v[n++] = c;
            if (node)
                break; /* the newest */
        }
    }
    pthread_mutex_unlock(&s->mu);
    return n;
}

static void unpin(struct ipc_server *s, struct serve_conn **v, int n)
{
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < n; i++)
        __atomic_sub_fetch(&v[i]->pins, 1, __ATOMIC_ACQ_REL);
    pthread_mutex_unlock(&s->mu);
}

/* Busy-polls p (the sockets, wake_fd) without sleeping for up to spin_us:
 * > 0 when one of them is ready, as poll. */
static int spin_poll(struct pollfd *p, nfds_t n, int spin_us)
{
    int64_t end = xfer_mono_ns() + (int64_t)spin_us * 1000;
    int k;
    while ((k = poll(p, n, 0)) == 0 && xfer_mono_ns() < end)
        ;
    return k;
}

/* rx_mu held, after the poll: serves one request if the poll saw c readable
 * (and no other waiter read it since: served) or the serving thread
 * skipped an edge, then stops polling c. */
static void rx_after_poll(struct serve_conn *c, short revents, uint64_t served)
{
    bool ready = revents || c->skipped;
    bool there = (revents & POLLIN) && c->served == served;
    c->skipped = false;
    if (!c->failed && ready && (there || readable_now(c->fd))) {
        int err = ipc_serve_one(c);
        if (err < 0) { /* over, as in the serving thread: it cleans up */
            c->failed = err;
            shutdown(c->fd, SHUT_RDWR);
        }
    }
    rx_leave(c);
    if (c->parked && (c->waiters == 0 || c->failed))
        pthread_cond_signal(&c->rx_cv);
}

/* Polls the n pinned connections v and wake_fd (above); 0, or -1 when none
 * of them can be read any more or the poll failed. */
static int wait_conns(struct serve_conn **v, int n, int wake_fd, int timeout_ms, int spin_us)
{
    struct pollfd p[WAIT_ANY_MAX + 1];
    uint64_t served[WAIT_ANY_MAX];
    int in = 0;
    for (int i = 0; i < n; i++) {
        struct serve_conn *c = v[i];
        pthread_mutex_lock(&c->rx_mu);
        bool over = c->failed != 0;
        if (!over)
            rx_enter(c);
        served[i] = c->served;
        pthread_mutex_unlock(&c->rx_mu);
        /* fd stays open while c is pinned (conn_free waits for the pins) */
        p[i] = (struct pollfd){.fd = over ? -1 : c->fd, .events = POLLIN | POLLRDHUP};
        in += !over;
    }
    if (in == 0)
        return -1;
    p[n] = (struct pollfd){.fd = wake_fd, .events = POLLIN};
    nfds_t np = (nfds_t)n + (wake_fd >= 0);
    int k = spin_us > 0 ? spin_poll(p, np, spin_us) : 0;
    if (k == 0)
        k = poll(p, np, timeout_ms);
    int rc = k < 0 && errno != EINTR ? -1 : 0;
    bool any_live = false;
    for (int i = 0; i < n; i++) {
        struct serve_conn *c = v[i];
        if (p[i].fd < 0)
            continue;
        pthread_mutex_lock(&c->rx_mu);
        rx_after_poll(c, k > 0 ? p[i].revents : 0, served[i]);
        any_live |= !c->failed;
        pthread_mutex_unlock(&c->rx_mu);
    }
    return any_live ? rc : -1;
}

int ipc_server_wait_in(struct ipc_server *s, const char *node, int wake_fd, int timeout_ms,
                       int spin_us)
{
    struct serve_conn *v[WAIT_ANY_MAX];
    int n = s ? pin(s, node, v, WAIT_ANY_MAX) : 0;
    if (n == 0)
        return -1;
    int rc = wait_conns(v, n, wake_fd, timeout_ms, spin_us);
    unpin(s, v, n);
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
    struct ipc_transport *t = container_of(xt, struct ipc_transport, base);
    xfer_engine *e = xt->engine;
    int spin = xfer_engine_config_get(e)->busy_poll_us;
    /* Serves at most one request per connection; xfer_notif_wait's loop
     * looks at the queue (a notification this thread queued itself does
     * not write the wake fd) and its deadline, and calls again. node NULL
     * or "": every peer's connection (up to WAIT_ANY_MAX, in turns). */
    return ipc_server_wait_in(t->server, node && *node ? node : NULL, xfer_notif_wake_fd(e),
                              timeout_ms, spin < timeout_ms * 1000 ? spin : timeout_ms * 1000) < 0
               ? -1 /* no such connection: the caller sleeps */
               : 0;
}
