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
 * (s->waiters: out of the owner's epoll interest) and notes an edge it
 * saw anyway (s->skipped, under iomu). The waiter
 * stops polling (waiters - 1, seq_cst), then takes iomu and reads the
 * socket if poll saw it readable or the owner skipped an edge: that edge is
 * read then, and one that comes later finds waiters at 0. What the reading waiter may
 * not do, because it touches the owner's lists or memory, it leaves to the
 * owner through a kick: going on past the rx budget, closing the socket
 * after a failure (tcp_sock_deferred), discarding payload (the owner's
 * scratch buffer). Sockets that carried GPU memory are left to the owner
 * (staging is the owner's). An accepted socket is pinned while a waiter may
 * touch it (tcp_reap keeps a closed one until the pin goes).
 *
 * Lazy EPOLLIN: taking EPOLLIN out of the owner's interest and giving it
 * back cost two epoll_ctl per socket per wait, 2 of an 8 B WRITE round
 * trip's 8 system calls. So the last waiter to leave a socket leaves it
 * out (rx_lazy) when nothing it knows of is on the way (an initiator
 * socket with nothing in flight; an accepted socket, whose peer may send a
 * request at any time, see below; XFER_TCP_LAZY_TARGET=0: not those), and
 * the next waiter finds it out already. The
 * owner takes it back when it serves the socket anyway (a kick, an
 * EPOLLOUT) and, for what arrives while nobody waits (a batch submitted
 * and then not waited for, a request), every TCP_LAZY_TICK_MS: while it
 * has lazy sockets its epoll_wait wakes that often, and gives EPOLLIN back
 * to each lazy socket nobody polls that may get data and no waiter left
 * since the last tick (or that no waiter came to for TCP_LAZY_KEEP_MS).
 * Re-adding EPOLLIN reports data already there at once: nothing is lost,
 * and such data waits at most two ticks. A waiter that finds what it
 * waits for already there (late, see LATE_NS) gives EPOLLIN back itself.
 * Accepted sockets: a request that comes right after the node's waiter
 * left (a WRITE after the notification that announced the last request)
 * waited up to two 1 ms ticks (H200: p90 2.3 ms instead of 0.4 ms), so
 * while one is lazy its owner ticks every TCP_LAZY_TICK_TGT_US instead
 * (such a request waits at most ~0.2 ms), and one whose request did wait
 * (the tick gave EPOLLIN back and the owner, not a waiter, then read it:
 * lazy_gave) is not left lazy for TCP_LAZY_OFF_MS: traffic that comes
 * while nobody waits gets the old epoll_ctl pair per wait, a ping-pong
 * (its waiter back within a tick) none. A ping-pong that stalled once
 * (its waiter away for a tick, then the peer's next request) is lazy again
 * after TCP_LAZY_CLEAN waiters in a row with no request arriving between
 * them (target_may_lazy), not after the whole TCP_LAZY_OFF_MS.
 *
 * A waiter does not block on a socket's iomu to start polling it: the
 * holder (the owner reading, another waiter) may be taking the very
 * answer; the waiter polls its other sockets and the wake fd for at most
 * 1 ms and tries again. With busy_poll_us, it polls without sleeping
 * first (XFER_CAP_RX_SPIN): the owner's EPOLLIN is out, so no thread but
 * the waiter wakes for the answer.
 *
 * Solo: a waiter alone on one socket (initiator, or accepted since
 * messages go both ways on one connection: tcp_back.c) with nothing
 * buffered sleeps in a blocking recv on it (at most TCP_SOLO_MS, SO_RCVTIMEO) instead
 * of poll on it and its wake fd then recv: one system call less per round
 * trip, and the poll's setup on two files. Its descriptor is blocking for
 * that (solo_ok; every other call passes MSG_DONTWAIT). Meanwhile
 * (rx_solo) nobody else reads the socket: tcp_sock_readable only notes
 * skipped, and the waiter reads on after its recv, so what a second waiter
 * or the owner saw is read there (and ends their batches, which wakes them).
 * A close meanwhile shuts the socket down (the recv returns) and leaves the
 * descriptor to the waiter, so its number is not reused under a recv. What
 * ends the batch without an answer on that socket (a deadline, a cancel
 * whose fence is not answered) is seen after at most TCP_SOLO_MS; then
 * the waiter polls its wake fd too, as before. XFER_TCP_SOLO=0: off.
 *
 * One reader: a waiter for answers (READ, WRITE; not a message or
 * notification waiter, whose peer's messages may come on a lazy socket)
 * does not join a socket that another waiter reads already; it waits on
 * its wake fd (the busy path above), and the reader,
 * which reads every answer that comes, ends its batch and wakes it; once
 * the reader leaves, the owner reads (EPOLLIN is back while answers are on
 * the way). When every waiter joined, each answer woke all of them in poll
 * and all but one found iomu taken: with 8 threads writing 8 B over one
 * socket on the H200 host, 120-133 k calls/s and p99 380-410 us, against
 * 162-179 k and 74-83 us with one reader (docs/perf.md "Step 17").
 * XFER_TCP_ONE_READER=0: every waiter joins.
 */
#include "tcp.h"
#include "xfer_io.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

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

unsigned tcp_peer_hash(const char *node)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (; *node; node++)
        h = (h ^ (uint8_t)*node) * 16777619u;
    return h % TCP_IN_SLOTS;
}

/* in_mu held: s leaves its place. */
static void in_drop(struct tcp_sock *s)
{
    int k = s->in_slot - 1;
    if (k >= 0 && s->tt->in_sock[k][s->in_idx] == s)
        s->tt->in_sock[k][s->in_idx] = NULL;
    __atomic_store_n(&s->in_slot, 0, __ATOMIC_RELAXED);
}

void tcp_in_note(struct tcp_sock *s)
{
    struct tcp_transport *tt = s->tt;
    /* the socket anyone's last message came on: xfer_notif_wait for any
     * peer reads that peer's. Only this socket's reader stores s (iomu),
     * and its forget (same lock, before close) takes it back out. */
    if (__atomic_load_n(&tt->in_last, __ATOMIC_RELAXED) != s)
        __atomic_store_n(&tt->in_last, s, __ATOMIC_RELEASE);
    if (__atomic_load_n(&s->in_slot, __ATOMIC_RELAXED))
        return; /* already remembered (cleared only under in_mu: racy is fine) */
    unsigned k = s->peer_hash;
    struct tcp_sock **v = tt->in_sock[k];
    pthread_mutex_lock(&tt->in_mu);
    int free_at = -1;
    for (int j = 0; j < TCP_IN_SOCKS; j++) {
        if (v[j] && strcmp(v[j]->peer_node, s->peer_node) != 0)
            in_drop(v[j]); /* another peer with the same hash: forgotten */
        if (!v[j] && free_at < 0)
            free_at = j;
    }
    if (free_at < 0) { /* all used: the oldest place goes */
        free_at = (int)(tt->in_next[k]++ % TCP_IN_SOCKS);
        in_drop(v[free_at]);
    }
    v[free_at] = s;
    s->in_idx = free_at;
    __atomic_store_n(&s->in_slot, (int)k + 1, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&tt->in_mu);
}

/* Any socket that closes: it leaves every table a waiter or a sender
 * finds sockets in (messages come on initiator sockets too when their
 * target sends them back: tcp_back.c). */
void tcp_in_forget(struct tcp_sock *s)
{
    struct tcp_transport *tt = s->tt;
    struct tcp_sock **out = &tt->out_sock[s->peer_hash];
    if (!__atomic_load_n(&s->in_slot, __ATOMIC_RELAXED) &&
        __atomic_load_n(&tt->in_last, __ATOMIC_ACQUIRE) != s && !s->back_out &&
        __atomic_load_n(out, __ATOMIC_RELAXED) != s)
        return;
    pthread_mutex_lock(&tt->in_mu);
    struct tcp_sock *me = s;
    __atomic_compare_exchange_n(&tt->in_last, &me, NULL, false, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED);
    in_drop(s);
    if (*out == s)
        __atomic_store_n(out, NULL, __ATOMIC_RELAXED);
    tcp_back_drop(s);
    pthread_mutex_unlock(&tt->in_mu);
}

/* The sockets node's messages came on (node NULL: those of the peer whose
 * message came last; accepted sockets, and initiator sockets its messages
 * came back on), pinned, into out[TCP_IN_SOCKS]; how many.
 * Sockets that carried GPU memory are left out. With init: also the
 * initiator socket our last message to that node went out on, pinned, or
 * NULL. hash: tcp_peer_hash(node), made once by the caller. */
static int in_pin(struct tcp_transport *tt, const char *node, unsigned hash, struct tcp_sock **out,
                  struct tcp_sock **init)
{
    int n = 0;
    pthread_mutex_lock(&tt->in_mu);
    if (!node) { /* in_last is live while in_mu is held (forget clears it under it) */
        struct tcp_sock *last = __atomic_load_n(&tt->in_last, __ATOMIC_ACQUIRE);
        node = last ? last->peer_node : NULL;
        hash = last ? last->peer_hash : 0;
    }
    struct tcp_sock **v = node ? tt->in_sock[hash] : NULL;
    for (int j = 0; v && j < TCP_IN_SOCKS; j++) {
        struct tcp_sock *s = v[j];
        if (!s || strcmp(s->peer_node, node) != 0 ||
            __atomic_load_n(s->target ? &s->tgt_gpu : &s->gpu_seen, __ATOMIC_RELAXED))
            continue;
        __atomic_add_fetch(&s->pins, 1, __ATOMIC_ACQ_REL);
        out[n++] = s;
    }
    if (init) {
        struct tcp_sock *s = node ? tt->out_sock[hash] : NULL;
        *init = s && !strcmp(s->peer_node, node) ? s : NULL;
        if (*init)
            __atomic_add_fetch(&s->pins, 1, __ATOMIC_ACQ_REL);
    }
    pthread_mutex_unlock(&tt->in_mu);
    return n;
}

/* ---- the answer socket of each peer (initiator) ------------------------------------ */

void tcp_out_note(struct tcp_sock *s)
{
    struct tcp_transport *tt = s->tt;
    struct tcp_sock **slot = &tt->out_sock[s->peer_hash];
    if (__atomic_load_n(slot, __ATOMIC_RELAXED) == s)
        return; /* the usual case: messages to a peer keep to its first live socket */
    pthread_mutex_lock(&tt->in_mu);
    __atomic_store_n(slot, s, __ATOMIC_RELAXED); /* another peer with the same hash: forgotten */
    pthread_mutex_unlock(&tt->in_mu);
}

void tcp_out_forget(struct tcp_sock *s)
{
    struct tcp_transport *tt = s->tt;
    struct tcp_sock **slot = &tt->out_sock[s->peer_hash];
    pthread_mutex_lock(&tt->in_mu);
    if (*slot == s)
        __atomic_store_n(slot, NULL, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&tt->in_mu);
    /* No new pin now; a waiter's poll ends within its slice (20 ms), and
     * it sees the socket closed (fd < 0, under iomu) */
    while (__atomic_load_n(&s->pins, __ATOMIC_ACQUIRE))
        nanosleep(&(struct timespec){0, 100000}, NULL);
}

static void in_unpin(struct tcp_sock **v, int n)
{
    for (int j = 0; j < n; j++)
        __atomic_sub_fetch(&v[j]->pins, 1, __ATOMIC_ACQ_REL);
}

/* ---- lazy EPOLLIN (see top) --------------------------------------------------------- */

/* iomu held, fd open: may data come that nobody reads unless the owner
 * has EPOLLIN? (An initiator's answers come only to what it sent, unless
 * its target sends messages back on it.) */
static bool may_get_data(const struct tcp_sock *s)
{
    return tcp_sock_serves(s) || s->tx_head || s->inf_head;
}

/* The last waiter left s, iomu held: EPOLLIN stays out (rx_lazy) and s
 * is on its owner's lazy list, the owner woken to start ticking if it was
 * not. on_lazy changes only under iomu and th->mu both (but for a close,
 * when no waiter is left), so reading it under iomu is enough: no lock
 * round or clock read per wait once s is on the list. */
static void lazy_enter(struct tcp_sock *s)
{
    s->rx_lazy = true;
    s->lazy_uses++;
    bool fine = s->target || s->back_seen;
    if (s->on_lazy && s->lazy_fine == fine)
        return;
    struct tcp_thread *th = s->th;
    pthread_mutex_lock(&th->mu);
    if (fine && !s->lazy_fine) /* the owner ticks fine now: woken if it sleeps coarse */
        __atomic_store_n(&th->lazy_tgt, th->lazy_tgt + 1, __ATOMIC_SEQ_CST);
    s->lazy_fine = fine; /* (only ever turns true while on the list) */
    if (!s->on_lazy) {
        s->lazy_ms = xfer_now_ms();
        s->on_lazy = true;
        s->lazy_next = th->lazy_head;
        __atomic_store_n(&th->lazy_head, s, __ATOMIC_SEQ_CST); /* the owner reads it unlocked */
    }
    bool wake = !__atomic_load_n(&th->ticking, __ATOMIC_SEQ_CST) ||
                (s->lazy_fine && !__atomic_load_n(&th->tick_fine, __ATOMIC_SEQ_CST));
    pthread_mutex_unlock(&th->mu);
    if (wake)
        tcp_thread_wake(th);
}

void tcp_lazy_unlink(struct tcp_sock *s)
{
    if (!s->on_lazy)
        return;
    for (struct tcp_sock **pp = &s->th->lazy_head; *pp; pp = &(*pp)->lazy_next) {
        if (*pp == s) {
            *pp = s->lazy_next;
            break;
        }
    }
    s->on_lazy = false;
    if (s->lazy_fine)
        __atomic_store_n(&s->th->lazy_tgt, s->th->lazy_tgt - 1, __ATOMIC_RELAXED);
    s->lazy_fine = false;
}

void tcp_sock_attend(struct tcp_sock *s)
{
    if (s->rx_lazy && s->fd >= 0 && !__atomic_load_n(&s->waiters, __ATOMIC_SEQ_CST)) {
        s->rx_lazy = false; /* stays on the list: the next tick drops it */
        tcp_sock_interest(s);
    }
}

void tcp_lazy_tick(struct tcp_thread *th)
{
    pthread_mutex_lock(&th->mu);
    struct tcp_sock *s = th->lazy_head;
    th->lazy_head = NULL; /* only this thread closes (unlinks) its sockets */
    pthread_mutex_unlock(&th->mu);
    int64_t now = xfer_now_ms();
    while (s) {
        struct tcp_sock *next = s->lazy_next;
        bool locked = pthread_mutex_trylock(&s->iomu) == 0; /* busy: next tick */
        bool keep = true;
        if (locked) {
            /* A waiter came since the last tick: waiters come and go
             * (one that leaves comes back within a tick): leave it to
             * them. Else EPOLLIN goes back if data may come (so what
             * comes while nobody waits is read within two ticks). */
            bool fresh = s->lazy_uses != s->lazy_seen;
            if (fresh) {
                s->lazy_seen = s->lazy_uses;
                s->lazy_ms = now;
            }
            bool idle = now - s->lazy_ms >= TCP_LAZY_KEEP_MS;
            if (s->rx_lazy && s->fd >= 0 && !fresh && (may_get_data(s) || idle)) {
                tcp_sock_attend(s); /* not while a waiter polls */
                __atomic_store_n(&s->lazy_gave, tcp_sock_serves(s) && !s->rx_lazy,
                                 __ATOMIC_RELAXED);
            }
            keep = s->rx_lazy && s->fd >= 0;
        }
        pthread_mutex_lock(&th->mu); /* under iomu: see lazy_enter */
        if (keep) {
            s->lazy_next = th->lazy_head;
            th->lazy_head = s;
        } else {
            s->on_lazy = false;
            if (s->lazy_fine)
                __atomic_store_n(&th->lazy_tgt, th->lazy_tgt - 1, __ATOMIC_RELAXED);
            s->lazy_fine = false;
        }
        pthread_mutex_unlock(&th->mu);
        if (locked)
            pthread_mutex_unlock(&s->iomu);
        s = next;
    }
}

/* ---- waiting ------------------------------------------------------------------------- */

/* May a waiter read s? Not once GPU memory went through it. */
static bool waiter_may(struct tcp_sock *s)
{
    if (s->target)
        return !__atomic_load_n(&s->tgt_gpu, __ATOMIC_RELAXED);
    /* No qmu round (4 per solo round trip): the flag never goes back, and
     * a GPU post that lands just after this look is one the lock would
     * have missed as well; the reader's checks under iomu follow. */
    return !__atomic_load_n(&s->gpu_seen, __ATOMIC_ACQUIRE);
}

/* iomu held: may the last waiter of accepted socket s leave it lazy? Not
 * while lazy_off_ms says a request waited for the tick (see top), unless
 * TCP_LAZY_CLEAN waiters in a row left it since with no request arriving
 * while nobody waited (its owner resets lazy_clean when it reads one): one
 * stall in a ping-pong (a tick with no waiter, then the peer's next
 * request) tripped the rule, and a whole second of epoll_ctl pairs per wait
 * followed (docs/notify.md, "The 1 s rule traps ping-pong runs"). */
static bool target_may_lazy(struct tcp_sock *s)
{
    if (!s->th->tt->lazy_target)
        return false;
    int64_t off = __atomic_load_n(&s->lazy_off_ms, __ATOMIC_RELAXED);
    if (!off || xfer_now_ms() >= off)
        return true;
    if (!s->th->tt->lazy_clean || ++s->lazy_clean < s->th->tt->lazy_clean)
        return false;
    __atomic_store_n(&s->lazy_off_ms, 0, __ATOMIC_RELAXED);
    return true;
}

/* iomu held: may the last waiter leave s lazy? An initiator socket not
 * while answers are on the way (its owner reads them at once); one that
 * requests may come on unasked, as an accepted socket. */
static bool may_leave_lazy(struct tcp_sock *s)
{
    if (!s->target && (s->tx_count > s->held || s->inf_head))
        return false; /* (answers held for the next frame are not on the way) */
    return !tcp_sock_serves(s) || target_may_lazy(s);
}

/* After the poll: reads s as its owner would if poll saw it readable or
 * its owner skipped an edge meanwhile (else nothing is there: no recv just
 * to hear EAGAIN). 0, or -1: stop (s closed, or its owner was kicked to
 * carry on). The last waiter leaves EPOLLIN out if it can (see top),
 * unless late: what it read was there before it polled. */
static int leave_locked(struct tcp_sock *s, bool ready, bool late, bool *defer_out)
{
    bool last = __atomic_sub_fetch(&s->waiters, 1, __ATOMIC_SEQ_CST) == 0;
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
        if (s->rx_blocked)
            rc = -1; /* it stopped reading with data left: polling would spin */
    }
    bool defer = s->rx_defer;
    if (s->fd >= 0 && last) {
        if (rc == 0 && !defer && !late && may_leave_lazy(s))
            lazy_enter(s);
        else
            s->rx_lazy = false;
        tcp_sock_interest(s); /* EPOLLIN back unless lazy (after reading) */
    }
    *defer_out = defer;
    return rc;
}

/* leave_locked taking iomu; a deferral kicks the owner (iomu let go). */
static int read_as_waiter(struct tcp_sock *s, bool ready, bool late)
{
    bool defer;
    pthread_mutex_lock(&s->iomu);
    int rc = leave_locked(s, ready, late, &defer);
    pthread_mutex_unlock(&s->iomu);
    if (defer) { /* the owner carries on (and this waiter sleeps as usual) */
        tcp_thread_kick(s);
        rc = -1;
    }
    return rc;
}

/* Busy-poll: poll p without sleeping for up to spin_us. What poll returns,
 * 0 = nothing came. Each empty poll yields the core: with one free it
 * returns at once, on a loaded machine the thread that is to answer (the
 * peer's, or this process's other engine's) runs instead of waiting for
 * the spin to end (8 B send/recv with 50 us on the 2-core dev VM: 87-114
 * -> 32-35 us one way). */
static int spin_poll(struct pollfd *p, nfds_t np, int spin_us)
{
    int64_t end = xfer_mono_ns() + (int64_t)spin_us * 1000;
    for (;;) {
        int k = poll(p, np, 0);
        if (k != 0 || xfer_mono_ns() >= end)
            return k;
        sched_yield();
    }
}

/* A poll that returns within this did not sleep: what it saw was there
 * before the waiter came, which the owner, had it kept EPOLLIN, would
 * have read meanwhile on another core (and the waiter found its batch
 * done: no system call). So such a socket gets EPOLLIN back: a waiter
 * that comes late (a notification's acknowledgement collected after the
 * answer, say) does not make the answers wait for it. */
#define LATE_NS 4000

/* A socket poll saw readable, read while this thread stays its waiter
 * (EPOLLIN stays out of the owner's interest: no epoll_ctl pair to go on
 * polling). 0, or -1: stop polling it (closed, GPU memory queued, or
 * something left to the owner; leaving it then carries that out). */
static int read_in_place(struct tcp_sock *s)
{
    pthread_mutex_lock(&s->iomu);
    int rc = 0;
    if (s->fd < 0 || !waiter_may(s)) {
        rc = -1;
    } else {
        s->skipped = false; /* read now */
        s->by_waiter = true;
        tcp_sock_readable(s);
        s->by_waiter = false;
        if (s->rx_defer || s->rx_blocked)
            rc = -1;
    }
    pthread_mutex_unlock(&s->iomu);
    return rc;
}

/* A solo recv armed on s: what it reads into, taken under iomu. */
struct solo {
    int fd;
    uint8_t *buf; /* only a reader changes it, and none reads meanwhile */
    size_t asked;
};

/* iomu held, s this thread's only socket, which it just joined as a
 * waiter: may it sleep in recv on s (see top)? Then rx_solo is set (nobody
 * else reads s until solo_recv is back) and *so says how. Armed in the
 * same lock round that joined s: one round less per wait. */
static bool solo_arm(struct tcp_sock *s, struct solo *so)
{
    struct tcp_tx *head = s->inf_head;
    bool ok = s->solo_ok && s->fd >= 0 && !s->rx_blocked &&
              __atomic_load_n(&s->waiters, __ATOMIC_SEQ_CST) == 1 && !s->skipped && !s->rx_defer &&
              !s->in_ready && s->rx_state == RX_HDR && s->rx_lo == s->rx_hi && waiter_may(s);
    if (!ok)
        return false;
    bool big = (head && head->op == XFER_WIRE_READ_REQ && head->len >= 65536) || s->rx_big;
    *so = (struct solo){s->fd, s->rxbuf, big ? XFER_WIRE_HDR_LEN : s->rxcap};
    s->rx_solo = true;
    return true;
}

/* The recv of a solo wait armed on s: 1 = it read something, 0 = nothing
 * came within TCP_SOLO_MS: poll on, -1 = stop (s closed, or something left
 * to the owner). When what it read ends the wait (done), it leaves s in
 * the same lock round, as read_as_waiter would after it: *left = that
 * one's result (else *left = 1: s not left). */
static int solo_recv(struct tcp_sock *s, const struct solo *so, bool (*done)(void *), void *arg,
                     int *left)
{
    int fd = so->fd;
    size_t asked = so->asked;
    *left = 1;
    ssize_t n = recv(fd, so->buf, asked, 0); /* blocks: fd is blocking (solo_ok) */
    int err = errno;
    pthread_mutex_lock(&s->iomu);
    s->rx_solo = false;
    if (s->solo_close) {
        close(fd);
        s->solo_close = false;
    }
    int rc;
    if (s->fd < 0) {
        rc = -1;
    } else if (n < 0 && (err == EAGAIN || err == EWOULDBLOCK || err == EINTR)) {
        rc = 0;                           /* what came meanwhile (skipped) is read after the poll */
    } else if (n > 0 && !waiter_may(s)) { /* GPU memory queued meanwhile: the owner's */
        s->rx_lo = 0;
        s->rx_hi = (size_t)n;
        s->skipped = true; /* leaving hands it to the owner (read_as_waiter) */
        rc = -1;
    } else {
        s->by_waiter = true;
        tcp_sock_solo_in(s, n, asked, err);
        s->by_waiter = false;
        rc = s->rx_defer || s->fd < 0 ? -1 : 1;
    }
    bool defer = false;
    if (rc > 0 && done(arg))
        *left = leave_locked(s, false, false, &defer);
    pthread_mutex_unlock(&s->iomu);
    if (defer) {
        tcp_thread_kick(s);
        *left = -1;
    }
    return rc;
}

/* After a solo recv that read something but not what ends the wait (the
 * answer to this side's own message before the peer's message, on a
 * connection used both ways: tcp_back.c): arms the next one on s, in one
 * lock round, if nothing came meanwhile. */
static bool solo_rearm(struct tcp_sock *s, bool (*done)(void *), void *arg, struct solo *so)
{
    pthread_mutex_lock(&s->iomu);
    bool ok = s->fd >= 0 && !done(arg) && solo_arm(s, so);
    pthread_mutex_unlock(&s->iomu);
    return ok;
}

/* Polls v[0..n) and wake_fd (unless done() already holds) for at most
 * timeout_ms (busy-polling the first spin_us), reading what arrives as the
 * sockets' owners would; returns once done() holds, wake_fd is readable,
 * the time is up or a socket stopped. A socket whose iomu is held is left
 * out of this call (see top). One answer that is not yet what done() waits
 * for (a SEND's RTS answered before its FIN; the acknowledgement of this
 * side's notification before the peer's) is read in place and the poll
 * goes on: leaving the sockets and coming back would give the accepted
 * ones EPOLLIN back in between (an epoll_ctl pair, and their owner woken
 * if the next message comes then). */
static int wait_socks(struct tcp_sock **v, int n, int wake_fd, bool (*done)(void *), void *arg,
                      int timeout_ms, int spin_us, bool one_reader)
{
    struct pollfd p[1 + TCP_IN_SOCKS + 1];
    struct tcp_sock *w[1 + TCP_IN_SOCKS]; /* the ones polled */
    int nw = 0;
    bool busy = false, gone = false, late = false;
    if (done(arg))
        return 0; /* the sockets stay as they are */
    struct solo so;
    bool armed = false,
         solo = n == 1 && spin_us == 0 && (timeout_ms < 0 || timeout_ms >= TCP_SOLO_MS);
    for (int i = 0; i < n; i++) {
        /* While it polls, its owner's epoll leaves EPOLLIN out (its thread
         * is not woken for what this one reads; no epoll_ctl once lazy).
         * fd, taken under iomu, may be closed by the owner meanwhile: poll
         * then sees a stale or reused descriptor for at most timeout_ms,
         * and the check under iomu below ends the waiting. */
        if ((one_reader && __atomic_load_n(&v[i]->waiters, __ATOMIC_SEQ_CST) > 0) ||
            pthread_mutex_trylock(&v[i]->iomu) != 0) {
            busy = true; /* (the reader there ends our batch if our answer comes first) */
            continue;
        }
        int fd = v[i]->fd;
        if (fd >= 0) {
            __atomic_add_fetch(&v[i]->waiters, 1, __ATOMIC_SEQ_CST);
            __atomic_store_n(&v[i]->lazy_gave, false, __ATOMIC_RELAXED); /* a waiter reads now */
            tcp_sock_interest(v[i]);
            p[nw] = (struct pollfd){.fd = fd, .events = POLLIN | POLLRDHUP};
            w[nw++] = v[i];
            armed = solo && !done(arg) && solo_arm(v[i], &so);
        } else {
            gone = true;
        }
        pthread_mutex_unlock(&v[i]->iomu);
    }
    int rc = gone ? -1 : 0, left = 1;
    bool polled = false, done_before = !armed && done(arg);
    int64_t wait_ns = (int64_t)(busy && timeout_ms > 1 ? 1 : timeout_ms) * 1000000, t_end = 0;
    const int64_t solo_ns = (int64_t)TCP_SOLO_MS * 1000000;
    int64_t t_first = 0; /* the clock when a second solo recv was armed */
    bool was_solo = armed;
    while (armed) {
        int k = solo_recv(w[0], &so, done, arg, &left);
        if (left <= 0) /* read what ends the wait, and left s (the usual round trip) */
            return left;
        armed = false;
        if (k != 0) { /* read (the skipped flag has the rest), or stop */
            polled = k > 0;
            p[0].revents = 0;
            done_before = k < 0 || done(arg);
        }
        if (k > 0 && !done_before) { /* another recv while the time allows */
            int64_t now = xfer_mono_ns();
            t_first = t_first ? t_first : now;
            armed = (timeout_ms < 0 || now - t_first + 2 * solo_ns <= wait_ns) &&
                    solo_rearm(w[0], done, arg, &so);
        }
    }
    /* The clock only when the poll below runs (not after a solo recv that
     * brought the answer); the first recv took at most TCP_SOLO_MS. */
    if (!gone && !done_before)
        t_end = (t_first ? t_first : xfer_mono_ns()) + wait_ns - (was_solo ? solo_ns : 0);
    for (bool first = true; !gone && !done_before; first = false) {
        /* The owner may have taken what we wait for just before we polled:
         * wake_fd then wakes us. */
        int np = nw;
        p[np++] = (struct pollfd){.fd = wake_fd, .events = POLLIN};
        int64_t t0 = xfer_mono_ns();
        int k = first && spin_us > 0 ? spin_poll(p, (nfds_t)np, spin_us) : 0;
        if (k == 0) {
            int64_t left = t_end - t0;
            k = poll(p, (nfds_t)np,
                     timeout_ms < 0 ? -1
                     : left > 0     ? (int)((left + 999999) / 1000000)
                                    : 0);
        }
        late = k > 0 && xfer_mono_ns() - t0 < LATE_NS;
        if (k < 0 && errno != EINTR)
            rc = -1;
        polled = k >= 0;
        if (k <= 0 || p[nw].revents || timeout_ms == 0)
            break; /* time up (or EINTR), or woken: the caller looks */
        bool stop = false;
        for (int i = 0; i < nw && !stop; i++) {
            if (p[i].revents && read_in_place(w[i]) < 0)
                stop = true; /* leaving carries out what it left, and reads the rest */
            else
                p[i].revents = 0;
        }
        if (stop)
            break;
        if (done(arg) || xfer_mono_ns() >= t_end) {
            late = false; /* all read; what came since: the skipped flag, or the next waiter */
            break;
        }
    }
    /* Not polled: read all (a socket closed meanwhile), or none but what
     * the owner skipped (done before the poll: nothing to wait for). */
    for (int i = 0; i < nw; i++)
        if (read_as_waiter(w[i], polled ? p[i].revents != 0 : !done_before, late && p[i].revents) <
            0)
            rc = -1;
    return rc;
}

/* busy_poll_us, at most the wait. */
static int spin_us(struct tcp_transport *tt, int timeout_ms)
{
    int us = xfer_engine_config_get(tt->engine)->busy_poll_us;
    return timeout_ms >= 0 && us > timeout_ms * 1000 ? timeout_ms * 1000 : us;
}

/* Is s among v[0..n)? (A socket whose target sends messages back is both
 * a waiter's answer socket and that peer's message socket: joined twice,
 * it would be polled and left twice.) */
static bool among(struct tcp_sock *const *v, int n, const struct tcp_sock *s)
{
    for (int k = 0; k < n; k++)
        if (v[k] == s)
            return true;
    return false;
}

static bool batch_ended(void *b)
{
    return !xfer_batch_running(b);
}

int tcp_wait_rx(struct xfer_conn *c, void *chan, bool inbound, xfer_batch *b, int timeout_ms)
{
    struct tcp_conn *tc = container_of(c, struct tcp_conn, base);
    struct tcp_sock *v[1 + TCP_IN_SOCKS];
    int n = 0;
    struct tcp_sock *s = chan;
    if (s && !s->target && waiter_may(s))
        v[n++] = s;
    int n_in = inbound ? in_pin(tc->tt, xfer_peer_desc_get(c->peer)->node_id, tc->peer_hash, v + n,
                                NULL)
                       : 0;
    for (int k = n; n == 1 && k < n + n_in; k++) {
        if (v[k] == v[0]) { /* pinned once more: let go of that pin */
            __atomic_sub_fetch(&v[k]->pins, 1, __ATOMIC_ACQ_REL);
            v[k] = v[n + --n_in];
            break;
        }
    }
    n += n_in;
    if (n == 0)
        return -1;
    /* The end of the run writes the batch's wake fd while a waiter polls. */
    /* One reader for answers only: the owner reads those once the reader
     * left (EPOLLIN is back while they are on the way); a peer's messages
     * may come on a lazy socket, which a waiter left out would then not
     * see for up to a slice. */
    int rc = wait_socks(v, n, xfer_batch_wake_fd(b), batch_ended, b, timeout_ms,
                        spin_us(tc->tt, timeout_ms), tc->tt->one_reader && n_in == 0);
    in_unpin(v + n - n_in, n_in);
    return rc;
}

static bool notif_queued(void *e)
{
    return xfer_notif_pending(e) > 0;
}

int tcp_notif_wait_rx(struct xfer_transport *t, const char *node, int timeout_ms)
{
    struct tcp_transport *tt = container_of(t, struct tcp_transport, base);
    struct tcp_sock *v[1 + TCP_IN_SOCKS], *init = NULL;
    int n = in_pin(tt, node, node ? tcp_peer_hash(node) : 0, v, tt->notif_ack ? &init : NULL);
    /* The answer to this side's last message to node comes back on init:
     * a notification ping-pong's waiter reads its acknowledgement there
     * (else the owner of init wakes for each), unless GPU memory went
     * through it (staging is the owner's). */
    if (init && waiter_may(init) && !among(v, n, init))
        v[n++] = init;
    else if (init)
        __atomic_sub_fetch(&init->pins, 1, __ATOMIC_ACQ_REL);
    if (n == 0)
        return -1;
    /* The queue's eventfd is readable while a notification is queued. */
    int rc = wait_socks(v, n, xfer_notif_wake_fd(tt->engine), notif_queued, tt->engine, timeout_ms,
                        spin_us(tt, timeout_ms), false);
    in_unpin(v, n);
    return rc;
}
