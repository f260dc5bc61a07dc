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
 * epoll set holding only the socket. While waiters poll the socket
 * (waiters > 0) the set's EPOLLIN is off, so the serving thread is not
 * woken for what they read (an epoll_ctl, no wake-up); if it was woken
 * anyway (the data came before the first waiter turned it off, or a
 * hang-up, which epoll reports regardless) it notes `skipped` and goes
 * back to epoll_wait (on a hang-up it parks on rx_cv until the last waiter
 * leaves, not to spin on it). A waiter that stops polling reads the socket
 * if its poll saw it readable or the serving thread skipped an edge.
 * A waiter that busy-polls connections that all have a message ring does
 * not take the socket while it spins (spin_rings): it looks at the rings
 * only, and the socket, which then carries only pin traffic, stays with
 * the serving thread; no epoll_ctl pair per wait.
 *
 * Linger. In a blocking ping-pong (xfer_send, then xfer_recv) the peer's
 * next message arrives before this side's RECV exists, usually while no
 * waiter polls; read by the serving thread it would be an unexpected
 * message (queued, answered 0, completed later by a FIN: a second round
 * trip and a second wake-up on each side). So a serving thread woken by
 * data less than linger_us (XFER_IPC_LINGER_US, default 200 us) after the
 * last waiter left does not read it at once: it waits (rx_cv) until that
 * time is over. A waiter that comes meanwhile (the RECV posted a few
 * microseconds later) reads it, matches it on arrival and answers
 * XFER_MSG_DELIVERED, as if the RECV had been posted ahead; the serving
 * thread then leaves it the socket. Otherwise the serving thread reads it:
 * a message nobody waits for is read at most linger_us late. Only an RTS
 * lingers (the headers are peeked): a notification is queued without a
 * FIN anyway, a FIN and pin traffic (MAP, ACQ, REL) are read at once. No
 * timer, no system call on the waiters' path: the serving thread's own
 * wait is the clock (a timerfd armed by each leaving waiter cost a timer
 * reprogram per message: +11 us per notification on the dev VM). A
 * hang-up is read at once (after the linger if the serving thread already
 * lingers then).
 *
 * A request the waiter cannot serve (malformed, peer gone) ends the
 * connection as it would in the serving thread: `failed` is set and the
 * socket shut down, which wakes the serving thread to clean up. Every wait
 * is bounded: the waiter's poll by its slice (batch.c, 20 ms), a request's
 * reading and answer by io_timeout_ms (ipc_recv, ipc_send), the parked
 * serving thread by 1 s, the lingering one by linger_us.
 */
#include "ipc_serve.h"
#include "mono_clock.h"
#include "msg_wire.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* At most this many connections are polled by one wait for any peer; the
 * next wait starts after them (s->any_next), so every peer gets its turn. */
#define WAIT_ANY_MAX 8

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

/* rx_mu held: a thread starts polling the socket. */
static void rx_enter(struct serve_conn *c)
{
    if (c->waiters++ == 0)
        interest(c, false);
}

/* rx_mu held: nobody waits on c any more (the serving thread's linger
 * counts from here). */
static void note_left(struct serve_conn *c)
{
    if (c->waiters == 0 && c->ring_spin == 0 && c->ring_sleepers == 0)
        c->left_ns = xfer_mono_ns();
}

/* rx_mu held: a thread stopped polling; the last one gives the input back
 * (level-triggered: what is left wakes the serving thread, which lingers). */
static void rx_leave(struct serve_conn *c)
{
    if (--c->waiters > 0 || c->failed)
        return;
    note_left(c);
    interest(c, true);
}

static bool readable_now(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    return poll(&p, 1, 0) > 0;
}

/* rx_mu held, the socket readable and no waiter: true if a waiter came
 * (it reads) or one read it meanwhile, after waiting while the last
 * waiter left less than linger_us ago (above). */
static bool linger(struct serve_conn *c, uint64_t served)
{
    int64_t until = c->left_ns + (int64_t)c->srv->linger_us * 1000;
    if (c->srv->linger_us <= 0 || !c->left_ns || xfer_mono_ns() >= until)
        return false;
    /* Only an RTS waits for its RECV: a notification has its queue (no FIN
     * either way), a FIN and pin traffic (MAP, ACQ, REL) are read at once. */
    uint8_t head[sizeof(struct ipc_hdr) + 6]; /* + the frame's magic, version, kind */
    struct ipc_hdr h;
    ssize_t got = recv(c->fd, head, sizeof(head), MSG_PEEK | MSG_DONTWAIT);
    if (got < (ssize_t)sizeof(h))
        return false;
    memcpy(&h, head, sizeof(h));
    /* a bell: the frame waits in the ring (its kind a hint: it is checked
     * when served) */
    int kind = h.type == IPC_RING_BELL && c->ring_up          ? ipc_ring_peek_kind(&c->ring)
               : h.type == IPC_MSG_REQ && got == sizeof(head) ? head[sizeof(h) + 5]
                                                              : -1;
    if (kind != XFER_MSG_RTS)
        return false;
    struct timespec ts = xfer_mono_at_ns(until);
    while (c->waiters == 0 && c->served == served && !c->failed && xfer_mono_ns() < until)
        if (pthread_cond_timedwait(&c->rx_cv, &c->rx_mu, &ts) == ETIMEDOUT)
            break;
    c->skipped |= c->waiters > 0; /* it reads what woke us */
    return c->waiters > 0 || c->served != served || c->failed;
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
    uint32_t sock = n > 0 ? ev.events : 0;
    int rc = 0;
    pthread_mutex_lock(&c->rx_mu);
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
               (((sock & EPOLLIN) && c->served == served) || readable_now(c->fd)) &&
               ((sock & (EPOLLHUP | EPOLLERR)) || !linger(c, served))) {
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

/* While spinning, wake_fd (and the sockets of connections without a ring)
 * is polled this often; the rings (ipc_ring.h) are looked at all the time,
 * so a message that comes through a ring to a spinning waiter costs no
 * system call at all. */
#define SPIN_POLL_NS 20000

/* Busy-polls the rings of v[0..n) and p (the sockets, wake_fd) without
 * sleeping for up to spin_us: > 0 when one of them is ready (as poll; a
 * ring: *ring set, no revents). */
static int spin_poll(struct serve_conn **v, int n, struct pollfd *p, nfds_t np, int spin_us,
                     bool *ring)
{
    int64_t now = xfer_mono_ns(), end = now + (int64_t)spin_us * 1000;
    int64_t next = now + SPIN_POLL_NS;
    for (;;) {
        for (int i = 0; i < n; i++)
            if (p[i].fd >= 0 && ipc_ring_has(v[i])) {
                *ring = true;
                return 1;
            }
        now = xfer_mono_ns();
        if (now >= next || now >= end) {
            int k = poll(p, np, 0);
            if (k != 0 || now >= end)
                return k;
            next = now + SPIN_POLL_NS;
        }
        __builtin_ia32_pause();
    }
}

/* rx_mu held: tells c's writer how its readers wait now (with a fence):
 * one spins (no wake-up), a message waiter sleeps on the ring's eventfd
 * (write it), else the serving thread sleeps on the socket (the bell).
 * Whoever changes it serves what came before after this; what comes
 * after wakes them the new way. */
static void ring_mode(struct serve_conn *c)
{
    ipc_ring_sleep(&c->ring, c->ring_spin > 0       ? IPC_SLEEP_SPIN
                             : c->ring_sleepers > 0 ? IPC_SLEEP_EFD
                                                    : IPC_SLEEP_SOCK);
}

/* rx_mu held: a waiter starts (on) or stops spinning on c's ring. */
static void ring_spin(struct serve_conn *c, bool on)
{
    c->ring_spin += on ? 1 : -1;
    ring_mode(c);
}

/* rx_mu held: serves the frames in c's ring; a corrupt ring ends c. */
static void serve_ring_now(struct serve_conn *c)
{
    int err = !c->failed && ipc_ring_has(c) ? ipc_serve_ring(c) : 0;
    if (err < 0) { /* over, as in the serving thread: it cleans up */
        c->failed = err;
        shutdown(c->fd, SHUT_RDWR);
    }
}

/* rx_mu held, after the poll: a waiter asleep on c's ring eventfd (woke:
 * it was written) stops sleeping and serves what came. */
static void rx_after_sleep(struct serve_conn *c, bool woke)
{
    c->ring_sleepers--;
    ring_mode(c);
    uint64_t drain;
    if (woke && read(c->ring.efd, &drain, sizeof(drain)) < 0 && errno != EAGAIN)
        xfer_debug("ipc: ring eventfd read: %s", strerror(errno));
    serve_ring_now(c);
    note_left(c);
}

/* rx_mu held, after the poll: serves one request if the poll saw c readable
 * (and no other waiter read it since: served) or the serving thread
 * skipped an edge, then stops polling c. */
static void rx_after_poll(struct serve_conn *c, short revents, uint64_t served)
{
    bool ready = revents || c->skipped;
    bool there = (revents & POLLIN) && c->served == served;
    c->skipped = false;
    int err = 0;
    if (!c->failed && ready && (there || readable_now(c->fd)))
        err = ipc_serve_one(c);
    if (err < 0) { /* over, as in the serving thread: it cleans up */
        c->failed = err;
        shutdown(c->fd, SHUT_RDWR);
    }
    serve_ring_now(c); /* frames no bell announced */
    rx_leave(c);
    if (c->parked && (c->waiters == 0 || c->failed))
        pthread_cond_signal(&c->rx_cv);
}

/* Spinning first (XFER_BUSY_POLL_US) when every connection of v has a
 * ring: the waiter looks only at the rings and, every SPIN_POLL_NS, at
 * wake_fd; the sockets stay with the serving threads, which only bells
 * (none come while it spins) and pin traffic reach. So a message that
 * comes while it spins costs no system call: no epoll_ctl pair to take
 * the socket and give it back (rx_enter/rx_leave, ~2 per one-way message
 * before), no poll. Then it serves what came, under rx_mu. 0: something
 * came (or was served meanwhile), -1: none of them can be read any more,
 * 1: nothing came within spin_us: sleep as usual. */
static int spin_rings(struct serve_conn **v, int n, int wake_fd, int spin_us)
{
    bool on[WAIT_ANY_MAX];
    for (int i = 0; i < n; i++) {
        struct serve_conn *c = v[i];
        pthread_mutex_lock(&c->rx_mu);
        on[i] = !c->failed;
        if (on[i])
            ring_spin(c, true);
        pthread_mutex_unlock(&c->rx_mu);
    }
    struct pollfd wp = {.fd = wake_fd, .events = POLLIN};
    int64_t now = xfer_mono_ns(), end = now + (int64_t)spin_us * 1000;
    int64_t next = now + SPIN_POLL_NS;
    bool came = false;
    while (!came) {
        for (int i = 0; i < n && !came; i++)
            came = on[i] && ipc_ring_pending(&v[i]->ring);
        if (came)
            break;
        now = xfer_mono_ns();
        if (now >= end)
            break;
        if (now >= next && wake_fd >= 0) {
            came = poll(&wp, 1, 0) > 0;
            next = now + SPIN_POLL_NS;
        }
        __builtin_ia32_pause();
    }
    bool any_live = false;
    for (int i = 0; i < n; i++) {
        struct serve_conn *c = v[i];
        if (!on[i])
            continue;
        pthread_mutex_lock(&c->rx_mu);
        ring_spin(c, false);     /* with a fence: frames from now on wake */
        came |= ipc_ring_has(c); /* what came before that */
        serve_ring_now(c);
        note_left(c);
        any_live |= !c->failed;
        pthread_mutex_unlock(&c->rx_mu);
    }
    return !any_live ? -1 : came ? 0 : 1;
}

/* Polls the n pinned connections v and wake_fd (above); 0, or -1 when none
 * of them can be read any more or the poll failed. */
static int wait_conns(struct serve_conn **v, int n, int wake_fd, int timeout_ms, int spin_us)
{
    bool rings = spin_us > 0;
    for (int i = 0; i < n && rings; i++)
        rings = __atomic_load_n(&v[i]->ring_up, __ATOMIC_ACQUIRE);
    if (rings) {
        int rc = spin_rings(v, n, wake_fd, spin_us);
        if (rc <= 0)
            return rc;
        spin_us = 0; /* nothing came: asleep on the sockets */
    }
    struct pollfd p[WAIT_ANY_MAX + 1];
    uint64_t served[WAIT_ANY_MAX];
    bool spun[WAIT_ANY_MAX], efd[WAIT_ANY_MAX], ring = false;
    int in = 0;
    for (int i = 0; i < n; i++) {
        struct serve_conn *c = v[i];
        pthread_mutex_lock(&c->rx_mu);
        bool over = c->failed != 0;
        /* A ring with an eventfd: sleep on that, the socket stays with the
         * serving thread (no epoll_ctl pair, no socket bell to read). */
        efd[i] = !over && spin_us == 0 && c->ring_up && c->ring.efd_up;
        if (efd[i]) {
            c->ring_sleepers++;
            ring_mode(c);
        } else if (!over) {
            rx_enter(c);
        }
        spun[i] = !over && spin_us > 0 && c->ring_up;
        if (spun[i])
            ring_spin(c, true);
        served[i] = c->served;
        pthread_mutex_unlock(&c->rx_mu);
        /* fds stay open while c is pinned (conn_free waits for the pins) */
        p[i] = (struct pollfd){.fd = over     ? -1
                                     : efd[i] ? c->ring.efd
                                              : c->fd,
                               .events = POLLIN | POLLRDHUP};
        in += !over;
    }
    if (in == 0)
        return -1;
    p[n] = (struct pollfd){.fd = wake_fd, .events = POLLIN};
    nfds_t np = (nfds_t)n + (wake_fd >= 0);
    int k = spin_us > 0 ? spin_poll(v, n, p, np, spin_us, &ring) : 0;
    for (int i = 0; i < n; i++) {
        if (!spun[i])
            continue;
        pthread_mutex_lock(&v[i]->rx_mu);
        ring_spin(v[i], false);
        pthread_mutex_unlock(&v[i]->rx_mu);
    }
    for (int i = 0; i < n && k == 0 && !ring; i++) /* after the fence of ring_spin */
        ring = p[i].fd >= 0 && ipc_ring_has(v[i]);
    if (k == 0 && !ring)
        k = poll(p, np, timeout_ms);
    int rc = k < 0 && errno != EINTR ? -1 : 0;
    bool any_live = false;
    for (int i = 0; i < n; i++) {
        struct serve_conn *c = v[i];
        if (p[i].fd < 0)
            continue;
        pthread_mutex_lock(&c->rx_mu);
        if (efd[i])
            rx_after_sleep(c, k > 0 && (p[i].revents & POLLIN));
        else
            rx_after_poll(c, k > 0 && !ring ? p[i].revents : 0, served[i]);
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
