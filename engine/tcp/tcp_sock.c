/*
 * TCP socket lifecycle: creation, destruction and reaping, the chunk slabs,
 * ending initiator chunks and target responses, failure (close and fail
 * what the socket carries) and stall handling. Sending is tcp_send.c,
 * reading tcp_recv.c.
 */
#include "tcp.h"
#include "xfer_io.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

struct tcp_sock *tcp_sock_new(struct tcp_transport *tt, int fd, bool target, const char *name)
{
    struct tcp_sock *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->tt = tt;
    s->fd = fd;
    s->target = target;
    s->linked = true; /* tcp_thread_adopt links it */
    snprintf(s->name, sizeof(s->name), "%s", name);
    pthread_mutex_init(&s->qmu, NULL);
    pthread_mutex_init(&s->iomu, NULL);
    s->last_progress_ms = xfer_now_ms();
    s->rx_state = RX_HDR;
    s->rx_gslot = -1;
    s->rxbuf = s->rxsmall;
    s->rxcap = sizeof(s->rxsmall);
    return s;
}

void tcp_sock_destroy(struct tcp_sock *s)
{
    if (!s)
        return;
    if (s->fd >= 0)
        close(s->fd);
    pthread_mutex_lock(&s->iomu); /* a direct sender has left */
    pthread_mutex_unlock(&s->iomu);
    pthread_mutex_destroy(&s->iomu);
    pthread_mutex_destroy(&s->qmu);
    while (s->tx_spare) {
        struct tcp_tx *t = s->tx_spare;
        s->tx_spare = t->next;
        free(t);
    }
    if (s->rxbuf != s->rxsmall)
        free(s->rxbuf);
    free(s);
}

void tcp_reap(struct tcp_thread *th, bool force)
{
    /* A closed socket stays while a waiter pins it or it is on the kick
     * list (a waiter that stopped kicks the owner: tcp_wait.c). */
    struct tcp_sock *dead = NULL;
    if (!__atomic_load_n(&th->grave, __ATOMIC_RELAXED))
        return; /* the usual turn: nothing to free, no lock round */
    pthread_mutex_lock(&th->mu);
    for (struct tcp_sock **pp = &th->grave; *pp;) {
        struct tcp_sock *s = *pp;
        if (force || (!s->kicked && __atomic_load_n(&s->pins, __ATOMIC_ACQUIRE) == 0)) {
            __atomic_store_n(pp, s->grave_next, __ATOMIC_RELAXED); /* (*pp may be th->grave) */
            s->grave_next = dead;
            dead = s;
        } else {
            pp = &s->grave_next;
        }
    }
    pthread_mutex_unlock(&th->mu);
    while (dead) {
        struct tcp_sock *next = dead->grave_next;
        tcp_sock_destroy(dead);
        dead = next;
    }
}

/* Slab chunks are not malloc'd one by one, so AddressSanitizer cannot see
 * a chunk used after its free on its own: a freed chunk (and so a whole
 * spare slab) is poisoned, the chunks of a slab handed out again are not. */
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define TX_POISON(p, n)   ASAN_POISON_MEMORY_REGION(p, n)
#define TX_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define TX_POISON(p, n)   ((void)(p), (void)(n))
#define TX_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

void tcp_slab_free(struct tcp_slab *s)
{
    if (s)
        TX_UNPOISON(s->tx, s->cap * sizeof(s->tx[0]));
    free(s);
}

/* A freed slab is kept as the transport's spare: the next post of a like
 * size reuses its (warm) memory instead of faulting fresh pages in. Once
 * it is published as the spare, s belongs to whoever takes it (a post too
 * large for it frees it at once): tt and cap are read before. */
void tcp_tx_free(struct tcp_tx *t)
{
    if (!t)
        return;
    free(t->own); /* a detached WRITE payload (tcp_fence.c) */
    struct tcp_slab *s = t->slab;
    if (!s) {
        if (t->cached)
            tcp_msg_tx_put(t);
        else
            free(t);
        return;
    }
    TX_POISON(t, sizeof(*t));
    if (__atomic_sub_fetch(&s->refs, 1, __ATOMIC_ACQ_REL) > 0)
        return;
    struct tcp_transport *tt = s->tt;
    size_t cap = s->cap;
    struct tcp_slab *old = __atomic_exchange_n(&tt->spare, s, __ATOMIC_ACQ_REL);
    if (old && old->cap > cap) /* keep the larger one: put it back, free what is there */
        old = __atomic_exchange_n(&tt->spare, old, __ATOMIC_ACQ_REL);
    tcp_slab_free(old);
}

struct tcp_slab *tcp_slab_get(struct tcp_transport *tt, size_t n)
{
    struct tcp_slab *s = __atomic_exchange_n(&tt->spare, NULL, __ATOMIC_ACQ_REL);
    if (s && s->cap >= n) {
        TX_UNPOISON(s->tx, n * sizeof(s->tx[0]));
        return s;
    }
    tcp_slab_free(s);
    s = malloc(sizeof(*s) + n * sizeof(s->tx[0]));
    if (s) {
        s->tt = tt;
        s->cap = n;
    }
    return s;
}

/* Ends an initiator chunk: its staging and load go, the batch (or message)
 * hears of it, t is freed. keep_open: the chunk gives its hold on the item
 * back without bytes or status (tcp_chunk_release). */
static void chunk_end(struct tcp_sock *s, struct tcp_tx *t, int status, const char *why,
                      bool keep_open)
{
    if (t->op == XFER_WIRE_FENCE) { /* no batch, no load, no response */
        tcp_tx_free(t);
        return;
    }
    tcp_gpu_tx_release(t);
    __atomic_sub_fetch(&s->load, tcp_chunk_load(t), __ATOMIC_RELAXED);
    if (t->orphan) {     /* its message ended when its connection went (tcp_back.c) */
    } else if (t->msg) { /* an engine message: status is the target engine's answer */
        xfer_msg_done(t->msg, status, why);
    } else if (status < 0 && t->seg != UINT32_MAX) {
        xfer_batch_seg_fail(t->b, t->idx, t->seg, status, why);
        xfer_batch_put(t->b);
    } else {
        uint32_t n = tcp_tx_items(t); /* a run ends each of its items */
        uint64_t got = status == 0 && !keep_open ? t->len / n : 0;
        for (uint32_t k = 0; k < n; k++)
            xfer_batch_chunk_done_put(t->b, t->idx + k, got, status, why);
    }
    tcp_tx_free(t);
}

/* Initiator chunk finished (status 0: all its bytes arrived/landed). */
void tcp_chunk_complete(struct tcp_sock *s, struct tcp_tx *t, int status, const char *why)
{
    chunk_end(s, t, status, why, false);
}

void tcp_chunk_release(struct tcp_sock *s, struct tcp_tx *t)
{
    chunk_end(s, t, 0, NULL, true); /* no bytes: the item stays open */
}

void tcp_response_done(struct tcp_tx *t)
{
    tcp_gpu_tx_release(t);
    if (t->region)
        xfer_region_release(t->region);
    tcp_tx_free(t);
}

static void drop_list(struct tcp_sock *s, struct tcp_tx *t, const char *why)
{
    while (t) {
        struct tcp_tx *next = t->next;
        if (t->response)
            tcp_response_done(t);
        else
            tcp_chunk_complete(s, t, -XFER_ECONN, why);
        t = next;
    }
}

void tcp_ready_push(struct tcp_sock *s)
{
    if (s->by_waiter) { /* the ready list is the owner's: it goes on */
        s->rx_defer = true;
        return;
    }
    if (s->in_ready)
        return;
    s->in_ready = true;
    s->ready_next = s->th->ready_head;
    s->th->ready_head = s;
}

static void ready_unlink(struct tcp_sock *s)
{
    if (!s->in_ready)
        return;
    for (struct tcp_sock **pp = &s->th->ready_head; *pp; pp = &(*pp)->ready_next) {
        if (*pp == s) {
            *pp = s->ready_next;
            break;
        }
    }
    s->in_ready = false;
}

void tcp_sock_fail(struct tcp_sock *s, int status, const char *why)
{
    tcp_sock_fail_as(s, status == 0 ? XFER_LOG_INFO : XFER_LOG_WARN, why);
}

/* lvl: how the close is logged; warn is for what an operator must look at,
 * a close that was asked for (ours or an idle peer's) is info or debug. */
void tcp_sock_fail_as(struct tcp_sock *s, enum xfer_log_level lvl, const char *why)
{
    struct tcp_thread *th = s->th;
    if (s->by_waiter) { /* closing touches the owner's lists: it does it */
        if (!s->fail_defer) {
            s->fail_defer = true;
            s->fail_lvl = lvl;
            snprintf(s->fail_why, sizeof(s->fail_why), "%s", why);
        }
        s->rx_defer = true;
        return;
    }
    tcp_in_forget(s); /* before it can reach the grave: waiters and senders pin it */
    if (s->fd >= 0) {
        if (s->closing)
            lvl = XFER_LOG_DEBUG;
        if (lvl == XFER_LOG_WARN)
            xfer_warn("tcp: closing connection %s: %s", s->name, why);
        else
            xfer_log(lvl, "tcp: connection %s closed: %s", s->name, why);
        epoll_ctl(th->epfd, EPOLL_CTL_DEL, s->fd, NULL);
        if (s->rx_solo) { /* a waiter sleeps in recv on it: wake it, it closes */
            shutdown(s->fd, SHUT_RDWR);
            s->solo_close = true;
        } else {
            close(s->fd);
        }
        s->fd = -1;
    }
    pthread_mutex_lock(&s->qmu);
    __atomic_store_n(&s->dead, true, __ATOMIC_RELAXED);
    struct tcp_tx *q = s->q_head;
    s->q_head = s->q_tail = NULL;
    pthread_mutex_unlock(&s->qmu);
    char msg[200];
    snprintf(msg, sizeof(msg), "connection %s lost: %s", s->name, why);
    drop_list(s, s->tx_head, msg);
    drop_list(s, q, msg);
    drop_list(s, s->inf_head, msg);
    s->tx_head = s->tx_tail = s->inf_head = s->inf_tail = NULL;
    s->tx_count = 0;
    s->held = 0;
    if (s->rx_region)
        xfer_region_release(s->rx_region);
    s->rx_region = NULL;
    free(s->rx_msg);
    s->rx_msg = NULL;
    s->rx_state = RX_HDR;
    s->rx_lo = s->rx_hi = 0;
    ready_unlink(s);
    tcp_gpu_sock_fail(s);
    s->rx_lazy = false;
    pthread_mutex_lock(&th->mu);
    tcp_lazy_unlink(s);
    tcp_held_unlink(s);
    if (s->linked) {
        if (s->th_prev)
            s->th_prev->th_next = s->th_next;
        else
            th->socks = s->th_next;
        if (s->th_next)
            s->th_next->th_prev = s->th_prev;
        s->linked = false;
        if (s->target) {
            s->grave_next = th->grave;
            __atomic_store_n(&th->grave, s, __ATOMIC_RELAXED); /* tcp_reap peeks */
        }
    }
    if (s->close_req)
        s->released = true;
    pthread_mutex_unlock(&th->mu);
}

/* Something under way that the peer owes progress on: a request being
 * received (an accepted socket, or a message sent back on an initiator
 * socket), frames to send, answers awaited. */
static bool has_work(struct tcp_sock *s)
{
    return s->rx_state == RX_PAYLOAD || s->rx_hi > s->rx_lo || s->tx_head || s->inf_head;
}

void tcp_sock_check_timeout(struct tcp_sock *s, int64_t now_ms)
{
    int limit = xfer_engine_config_get(s->tt->engine)->io_timeout_ms;
    if (tcp_sock_queues(s) && s->fd >= 0) {
        /* belt and braces: queued work is never left behind */
        pthread_mutex_lock(&s->qmu);
        bool queued = s->q_head != NULL;
        pthread_mutex_unlock(&s->qmu);
        if (queued)
            tcp_sock_writable(s);
    }
    if (s->io_count != s->io_seen) { /* bytes moved since the last look */
        s->io_seen = s->io_count;
        s->last_progress_ms = now_ms;
    }
    if (s->fd < 0 || !has_work(s) || now_ms - s->last_progress_ms <= limit)
        return;
    char why[96];
    snprintf(why, sizeof(why), "no progress for %d ms (peer stalled)", limit);
    tcp_sock_fail(s, -XFER_ECONN, why);
}
