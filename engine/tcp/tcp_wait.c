/*
 * Waiter-driven receive (issue 15): the thread waiting for a batch reads
 * the sockets its answers arrive on itself when they arrive, instead of
 * sleeping until their progress thread has read them and woken it (one
 * thread hand-off less per round trip). Two kinds of socket:
 *  - the initiator socket all of the run's chunks went out on (their
 *    responses; a SEND's RTS and its answer);
 *  - for a run whose SEND/RECV items all name one peer, the accepted
 *    (target) socket that peer's messages arrive on: the RTS a RECV waits
 *    for, the FIN a SEND waits for. Whatever else arrives there (WRITE
 *    payloads into regions, READ requests) is served as its owner would,
 *    under the same locks (iomu; its thread's fence_mu around a payload).
 *
 * While a waiter polls, the owner leaves EPOLLIN on the socket to it
 * (s->waiters) and notes that it did (s->skipped, under iomu). The waiter
 * stops polling (waiters - 1, seq_cst), then takes iomu and reads the
 * socket if poll saw it readable or the owner skipped an edge: that edge is
 * read then, and one that comes later finds waiters at 0. What the reading waiter may
 * not do, because it touches the owner's lists or memory, it leaves to the
 * owner through a kick: going on past the rx budget, closing the socket
 * after a failure (tcp_sock_deferred), discarding payload (the owner's
 * scratch buffer). Sockets that carried GPU memory are left to the owner
 * (staging is the owner's). An accepted socket is pinned while a waiter may
 * touch it (tcp_reap keeps a closed one until the pin goes).
 */
#include "tcp.h"

#include <errno.h>
#include <poll.h>
#include <string.h>

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

/* ---- the message socket of each peer (target) ----------------------------------- */

static unsigned in_hash(const char *node)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (; *node; node++)
        h = (h ^ (uint8_t)*node) * 16777619u;
    return h % TCP_IN_SLOTS;
}

void tcp_in_note(struct tcp_sock *s)
{
    if (__atomic_load_n(&s->in_slot, __ATOMIC_RELAXED))
        return; /* already remembered (cleared only under in_mu: racy is fine) */
    struct tcp_transport *tt = s->tt;
    unsigned k = in_hash(s->peer_node);
    pthread_mutex_lock(&tt->in_mu);
    struct tcp_sock *old = tt->in_sock[k];
    if (old && old != s)
        __atomic_store_n(&old->in_slot, 0, __ATOMIC_RELAXED);
    tt->in_sock[k] = s;
    __atomic_store_n(&s->in_slot, (int)k + 1, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&tt->in_mu);
}

void tcp_in_forget(struct tcp_sock *s)
{
    if (!__atomic_load_n(&s->in_slot, __ATOMIC_RELAXED))
        return;
    struct tcp_transport *tt = s->tt;
    pthread_mutex_lock(&tt->in_mu);
    int k = s->in_slot - 1;
    if (k >= 0 && tt->in_sock[k] == s)
        tt->in_sock[k] = NULL;
    __atomic_store_n(&s->in_slot, 0, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&tt->in_mu);
}

/* The accepted socket node's messages last came on, pinned; NULL if none
 * is known or it carried GPU memory. */
static struct tcp_sock *in_pin(struct tcp_transport *tt, const char *node)
{
    pthread_mutex_lock(&tt->in_mu);
    struct tcp_sock *s = tt->in_sock[in_hash(node)];
    if (s && (strcmp(s->peer_node, node) != 0 || __atomic_load_n(&s->tgt_gpu, __ATOMIC_RELAXED)))
        s = NULL;
    if (s)
        __atomic_add_fetch(&s->pins, 1, __ATOMIC_ACQ_REL);
    pthread_mutex_unlock(&tt->in_mu);
    return s;
}

/* ---- waiting ------------------------------------------------------------------------- */

/* May a waiter read s? Not once GPU memory went through it. */
static bool waiter_may(struct tcp_sock *s)
{
    if (s->target)
        return !__atomic_load_n(&s->tgt_gpu, __ATOMIC_RELAXED);
    pthread_mutex_lock(&s->qmu);
    bool gpu = s->gpu_seen;
    pthread_mutex_unlock(&s->qmu);
    return !gpu;
}

/* After the poll: reads s as its owner would if poll saw it readable or
 * its owner skipped an edge meanwhile (else nothing is there: no recv just
 * to hear EAGAIN). 0, or -1: stop (s closed, or its owner was kicked to
 * carry on). */
static int read_as_waiter(struct tcp_sock *s, bool ready)
{
    pthread_mutex_lock(&s->iomu);
    __atomic_sub_fetch(&s->waiters, 1, __ATOMIC_SEQ_CST);
    ready |= s->skipped;
    s->skipped = false;
    int rc = 0;
    if (s->fd < 0) {
        rc = -1;
    } else if (!waiter_may(s)) { /* GPU memory queued meanwhile: the owner's */
        s->rx_defer = ready;     /* an edge skipped while we polled is read there */
        rc = -1;
    } else if (ready) {
        s->by_waiter = true;
        tcp_sock_readable(s);
        s->by_waiter = false;
        if (s->target && s->rx_blocked)
            rc = -1; /* it stopped reading with data left: polling would spin */
    }
    if (s->fd >= 0)
        tcp_sock_interest(s); /* the last waiter gives EPOLLIN back (after reading) */
    bool defer = s->rx_defer;
    pthread_mutex_unlock(&s->iomu);
    if (defer) { /* the owner carries on (and this waiter sleeps as usual) */
        tcp_thread_kick(s);
        rc = -1;
    }
    return rc;
}

int tcp_wait_rx(struct xfer_conn *c, void *chan, bool inbound, xfer_batch *b, int timeout_ms)
{
    struct tcp_conn *tc = container_of(c, struct tcp_conn, base);
    struct tcp_sock *v[2];
    int n = 0;
    struct tcp_sock *s = chan;
    if (s && !s->target && waiter_may(s))
        v[n++] = s;
    struct tcp_sock *in = inbound ? in_pin(tc->tt, xfer_peer_desc_get(c->peer)->node_id) : NULL;
    if (in)
        v[n++] = in;
    if (n == 0)
        return -1;
    struct pollfd p[3];
    int np = 0;
    for (int i = 0; i < n; i++) {
        /* While it polls, its owner's epoll leaves EPOLLIN out (its thread
         * is not woken for what this one reads). fd, taken under iomu, may
         * be closed by the owner meanwhile: poll then sees a stale or
         * reused descriptor for at most timeout_ms, and the check under
         * iomu below ends the waiting. */
        pthread_mutex_lock(&v[i]->iomu);
        __atomic_add_fetch(&v[i]->waiters, 1, __ATOMIC_SEQ_CST);
        int fd = v[i]->fd;
        if (fd >= 0) {
            tcp_sock_interest(v[i]);
            p[np++] = (struct pollfd){.fd = fd, .events = POLLIN | POLLRDHUP};
        }
        pthread_mutex_unlock(&v[i]->iomu);
    }
    int rc = 0;
    bool polled = false;
    if (np == n && xfer_batch_running(b)) {
        /* The owner may have taken the answer just before we polled: the
         * end of the run then wakes us through the waiter's eventfd. */
        p[np++] = (struct pollfd){.fd = xfer_batch_wake_fd(b), .events = POLLIN};
        int k = poll(p, (nfds_t)np, timeout_ms);
        if (k < 0 && errno != EINTR)
            rc = -1;
        polled = k >= 0;
    }
    for (int i = 0; i < n; i++)
        if (read_as_waiter(v[i], !polled || p[i].revents) < 0)
            rc = -1;
    if (in)
        __atomic_sub_fetch(&in->pins, 1, __ATOMIC_ACQ_REL);
    return rc;
}
