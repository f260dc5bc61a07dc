/*
 * Socket I/O of the TCP transport, run by the socket's progress thread only:
 * gathering frames into sendmsg, reading responses (initiator) and requests
 * (target), failure and stall handling.
 *
 * Payload goes straight between the socket and registered memory; only the
 * few bytes that arrive in the header read-ahead buffer are copied. Local
 * memory of an initiator is touched only inside xfer_batch_io_begin/io_end,
 * one system call at a time, so cancellation never waits for a peer.
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

#define RX_BUDGET (8u << 20) /* bytes per readable event before yielding */

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
    pthread_mutex_lock(&th->mu);
    for (struct tcp_sock **pp = &th->grave; *pp;) {
        struct tcp_sock *s = *pp;
        if (force || (!s->kicked && __atomic_load_n(&s->pins, __ATOMIC_ACQUIRE) == 0)) {
            *pp = s->grave_next;
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

static uint64_t chunk_load(const struct tcp_tx *t)
{
    return XFER_WIRE_HDR_LEN + t->len;
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
    __atomic_sub_fetch(&s->load, chunk_load(t), __ATOMIC_RELAXED);
    if (t->msg) { /* an engine message: status is the target engine's answer */
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

/* Reports the chunk ends collected by chunk_done_later. */
static void done_flush(struct tcp_sock *s)
{
    if (!s->ndone)
        return;
    __atomic_sub_fetch(&s->load, s->done_load, __ATOMIC_RELAXED);
    xfer_batch_chunks_done_put(s->done, s->ndone);
    s->ndone = 0;
    s->done_load = 0;
}

/* A host chunk's response arrived whole (status 0): its end is reported
 * with the others this read brings (done_flush when the read stops), so a
 * recv full of small responses takes each batch's lock once. */
static void chunk_done_later(struct tcp_sock *s, struct tcp_tx *t)
{
    if (t->op == XFER_WIRE_FENCE || t->msg || t->gpu) {
        tcp_chunk_complete(s, t, 0, NULL);
        return;
    }
    if (s->ndone == TCP_DONE_MAX)
        done_flush(s);
    uint32_t n = tcp_tx_items(t);
    if (n == 1) {
        s->done[s->ndone++] = (struct xfer_chunk_end){t->b, t->idx, t->len, 0, NULL};
    } else {
        for (uint32_t k = 0; k < n; k++) { /* a run: one entry per item */
            if (s->ndone == TCP_DONE_MAX)
                done_flush(s);
            s->done[s->ndone++] = (struct xfer_chunk_end){t->b, t->idx + k, t->len / n, 0, NULL};
        }
    }
    s->done_load += chunk_load(t);
    tcp_tx_free(t); /* its holds on t->b pass to the entries */
}

static void response_done(struct tcp_tx *t)
{
    tcp_gpu_tx_release(t);
    if (t->region)
        xfer_region_release(t->region);
    tcp_tx_free(t);
}

/* A response sent whole: kept on s's spare list for tcp_queue_response
 * (both run holding iomu), or freed. */
static void response_sent(struct tcp_sock *s, struct tcp_tx *t)
{
    if (t->slab || t->own || t->gpu || s->tx_nspare >= TCP_TX_SPARE_MAX) {
        response_done(t);
        return;
    }
    if (t->region)
        xfer_region_release(t->region);
    t->next = s->tx_spare;
    s->tx_spare = t;
    s->tx_nspare++;
}

static void drop_list(struct tcp_sock *s, struct tcp_tx *t, const char *why)
{
    while (t) {
        struct tcp_tx *next = t->next;
        if (s->target)
            response_done(t);
        else
            tcp_chunk_complete(s, t, -XFER_ECONN, why);
        t = next;
    }
}

static void ready_push(struct tcp_sock *s)
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
    if (s->target)
        tcp_in_forget(s); /* before it can reach the grave: waiters pin it */
    if (s->fd >= 0) {
        if (s->closing)
            lvl = XFER_LOG_DEBUG;
        if (lvl == XFER_LOG_WARN)
            xfer_warn("tcp: closing connection %s: %s", s->name, why);
        else
            xfer_log(lvl, "tcp: connection %s closed: %s", s->name, why);
        epoll_ctl(th->epfd, EPOLL_CTL_DEL, s->fd, NULL);
        close(s->fd);
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
    if (s->rx_region)
        xfer_region_release(s->rx_region);
    s->rx_region = NULL;
    free(s->rx_msg);
    s->rx_msg = NULL;
    s->rx_state = RX_HDR;
    s->rx_lo = s->rx_hi = 0;
    ready_unlink(s);
    tcp_gpu_sock_fail(s);
    pthread_mutex_lock(&th->mu);
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
            th->grave = s;
        }
    }
    if (s->close_req)
        s->released = true;
    pthread_mutex_unlock(&th->mu);
}

static bool has_work(struct tcp_sock *s)
{
    if (s->target)
        return s->rx_state == RX_PAYLOAD || s->rx_hi > s->rx_lo || s->tx_head;
    return s->tx_head || s->inf_head;
}

void tcp_sock_check_timeout(struct tcp_sock *s, int64_t now_ms)
{
    int limit = xfer_engine_config_get(s->tt->engine)->io_timeout_ms;
    if (!s->target && s->fd >= 0) { /* belt and braces: queued work is never left behind */
        pthread_mutex_lock(&s->qmu);
        bool queued = s->q_head != NULL;
        pthread_mutex_unlock(&s->qmu);
        if (queued)
            tcp_sock_writable(s);
    }
    if (s->fd < 0 || !has_work(s) || now_ms - s->last_progress_ms <= limit)
        return;
    char why[96];
    snprintf(why, sizeof(why), "no progress for %d ms (peer stalled)", limit);
    tcp_sock_fail(s, -XFER_ECONN, why);
}

/* recv() with the error handling every reader shares: >0 bytes, 0 = try
 * later, -1 = the socket failed; the caller calls rx_failed() once it has
 * let go of any memory pin (failing completes and frees chunks). */
static ssize_t sock_recv(struct tcp_sock *s, void *buf, size_t len)
{
    if (s->rx_short) /* saves the recv that would say EAGAIN */
        return 0;
    for (;;) {
        ssize_t n = recv(s->fd, buf, len, MSG_DONTWAIT);
        if (n > 0) {
            s->last_progress_ms = xfer_now_ms();
            s->rx_short = (size_t)n < len;
            return n;
        }
        if (n == 0) {
            s->rx_errno = 0;
            return -1;
        }
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return 0;
        s->rx_errno = errno;
        return -1;
    }
}

static void rx_failed(struct tcp_sock *s)
{
    if (s->rx_errno) {
        tcp_sock_fail(s, -XFER_ECONN, strerror(s->rx_errno));
        return;
    }
    bool mid = s->rx_state == RX_PAYLOAD || s->rx_hi > s->rx_lo;
    bool clean = s->target && !mid;
    /* An initiator with nothing in flight loses nothing: the peer shut
     * down (or closed an idle socket); repair reconnects if it comes back. */
    pthread_mutex_lock(&s->qmu);
    bool idle = !mid && !s->tx_head && !s->inf_head && !s->q_head;
    pthread_mutex_unlock(&s->qmu);
    tcp_sock_fail_as(s, clean || idle ? XFER_LOG_INFO : XFER_LOG_WARN,
                     mid ? "peer closed the connection mid-frame" : "peer closed the connection");
}

/* Makes a whole header available in rxbuf: 1 = yes, 0 = later, -1 = failed.
 * exact: read no further than the header (a large payload follows, which
 * should go straight to its memory rather than through rxbuf). */
static int fill_header(struct tcp_sock *s, bool exact)
{
    exact |= s->rx_big;
    while (s->rx_hi - s->rx_lo < XFER_WIRE_HDR_LEN) {
        if (s->rx_small_run >= TCP_RX_GROW_AFTER && s->rxbuf == s->rxsmall) {
            uint8_t *big = malloc(TCP_RXBUF_BIG); /* NULL: stay small */
            if (big) {
                memcpy(big, s->rxbuf, s->rx_hi);
                s->rxbuf = big;
                s->rxcap = TCP_RXBUF_BIG;
            }
            s->rx_small_run = 0;
        }
        if (s->rx_lo > 0) {
            memmove(s->rxbuf, s->rxbuf + s->rx_lo, s->rx_hi - s->rx_lo);
            s->rx_hi -= s->rx_lo;
            s->rx_lo = 0;
        }
        size_t want = exact ? XFER_WIRE_HDR_LEN - s->rx_hi : s->rxcap - s->rx_hi;
        ssize_t n = sock_recv(s, s->rxbuf + s->rx_hi, want);
        if (n < 0)
            rx_failed(s);
        if (n <= 0)
            return (int)n;
        s->rx_hi += (size_t)n;
    }
    return 1;
}

/* A header announced `payload` bytes: counts small ones in a row (the
 * read-ahead grows after TCP_RX_GROW_AFTER) and notes a large one. */
static void rx_note(struct tcp_sock *s, uint64_t payload)
{
    s->rx_big = payload >= TCP_RX_DIRECT;
    if (payload > 0 && payload <= TCP_RX_SMALL)
        s->rx_small_run++;
    else if (payload)
        s->rx_small_run = 0;
}

/* Moves up to `left` payload bytes into dst (NULL = discard) from the
 * read-ahead buffer or the socket. Returns bytes moved, 0 = later, -1.
 * Discarding from the socket goes through the owner's scratch buffer: a
 * waiter leaves that to the owner. */
static ssize_t payload_in(struct tcp_sock *s, uint8_t *dst, uint64_t left)
{
    size_t buffered = s->rx_hi - s->rx_lo;
    if (buffered) {
        size_t k = buffered < left ? buffered : (size_t)left;
        if (dst)
            memcpy(dst, s->rxbuf + s->rx_lo, k);
        s->rx_lo += k;
        return (ssize_t)k;
    }
    if (dst)
        return sock_recv(s, dst, left);
    if (s->by_waiter) {
        s->rx_defer = true;
        return 0;
    }
    size_t cap = sizeof(s->th->scratch);
    return sock_recv(s, s->th->scratch, left < cap ? (size_t)left : cap);
}

/* ---- sending ------------------------------------------------------------------- */

static void tx_pop(struct tcp_sock *s)
{
    struct tcp_tx *t = s->tx_head;
    s->tx_head = t->next;
    if (!s->tx_head)
        s->tx_tail = NULL;
    s->tx_count--;
    t->next = NULL;
}

static void inflight_push(struct tcp_sock *s, struct tcp_tx *t)
{
    if (s->inf_tail)
        s->inf_tail->next = t;
    else
        s->inf_head = t;
    s->inf_tail = t;
}

/* Moves the shared queue to the owner's list; false (nothing moved) for a
 * direct sender once GPU chunks were queued: their staging is the owner's. */
static bool splice_queue(struct tcp_sock *s, bool direct)
{
    pthread_mutex_lock(&s->qmu);
    if (direct && s->gpu_seen) {
        pthread_mutex_unlock(&s->qmu);
        return false;
    }
    struct tcp_tx *q = s->q_head;
    s->q_head = s->q_tail = NULL;
    pthread_mutex_unlock(&s->qmu);
    if (!q)
        return true;
    if (!s->tx_head && !s->inf_head) /* was idle: the stall clock starts now */
        s->last_progress_ms = xfer_now_ms();
    for (; q; q = q->next) {
        if (s->tx_tail)
            s->tx_tail->next = q;
        else
            s->tx_head = q;
        s->tx_tail = q;
        s->tx_count++;
    }
    return true;
}

/* Initiator: drops unsent chunks at the head whose items ended. */
/* Unsent chunks of items that ended, or whose batch is being cancelled or
 * timed out, leave the head (a FENCE may wait behind them). A chunk of an
 * item that is still open only gives its hold back: ending the item here
 * (-XFER_ECANCELED) raced the cancel, which fences one socket at a time: a
 * frame of the same item half sent on a socket not fenced yet then lost its
 * memory and went out as zeros, landing at the target (test_tcp_cancel_retry
 * with bulk on 2 progress threads). The cancel or deadline ends the item
 * once every socket is fenced. */
static void drop_dead_heads(struct tcp_sock *s)
{
    while (!s->target && s->tx_head && s->tx_head->hdr_sent == 0 && s->tx_head->b &&
           !xfer_batch_item_live(s->tx_head->b, s->tx_head->idx)) {
        struct tcp_tx *t = s->tx_head;
        tx_pop(s);
        if (xfer_batch_item_open(t->b, t->idx))
            tcp_chunk_release(s, t);
        else
            tcp_chunk_complete(s, t, -XFER_ECANCELED, "item ended before it was sent");
    }
}

struct gather {
    struct iovec iov[2 * TCP_IOV_MAX];
    struct tcp_tx *pinned[TCP_IOV_MAX];
    int niov, npinned;
    bool last; /* the frame just added is only partly covered */
};

/* Adds t to g; false = stop gathering here (t goes next round). An
 * initiator's WRITE payload is local memory: pinned for this call only. A
 * frame whose batch is cancelled or timed out was detached by tcp_fence()
 * before its item ended (the rest goes out of a copy). If its item ended
 * otherwise (a failure elsewhere) while the frame is half sent, the rest is
 * sent as zeros: the stream stays in sync (other chunks on this socket are
 * not hurt) and the failed item's remote range is undefined anyway. A chunk
 * not begun starts only while its item is live, so none starts once a
 * cancel began. */
static const uint8_t zeros[65536];

static bool gather_add(struct tcp_sock *s, struct gather *g, struct tcp_tx *t)
{
    bool chunk = !s->target && t->b;
    bool needs_mem = chunk && !t->pad && !t->detached && t->payload_sent < t->payload_len;
    if (chunk && t->hdr_sent == 0 && !xfer_batch_item_live(t->b, t->idx))
        return false; /* the head is dropped next round (drop_dead_heads) */
    if (needs_mem) {
        if (xfer_batch_io_begin(t->b, t->idx)) {
            g->pinned[g->npinned++] = t;
        } else if (t->hdr_sent == 0) {
            return false; /* not started: dropped when it reaches the head */
        } else {
            t->pad = true;
        }
    }
    if (t->hdr_sent < XFER_WIRE_HDR_LEN)
        g->iov[g->niov++] = (struct iovec){t->hdr + t->hdr_sent, XFER_WIRE_HDR_LEN - t->hdr_sent};
    uint64_t left = t->payload_len - t->payload_sent;
    if (left && t->pad) {
        g->iov[g->niov++] =
            (struct iovec){(void *)zeros, left < sizeof(zeros) ? (size_t)left : sizeof(zeros)};
        /* tx_advance() assumes each frame's iovs cover all it has left, so a
         * frame sent only in part by this call must be the last one. */
        g->last = left > sizeof(zeros);
    } else if (left)
        g->iov[g->niov++] = (struct iovec){t->payload + t->payload_sent, left};
    return true;
}

/* Accounts n sent bytes to the queue head onwards. */
static void tx_advance(struct tcp_sock *s, size_t n)
{
    while (s->tx_head) {
        struct tcp_tx *t = s->tx_head;
        size_t h = XFER_WIRE_HDR_LEN - t->hdr_sent;
        if (h > n)
            h = n;
        t->hdr_sent += (uint32_t)h;
        n -= h;
        uint64_t p = t->payload_len - t->payload_sent;
        if (p > n)
            p = n;
        t->payload_sent += p;
        n -= (size_t)p;
        if (t->hdr_sent < XFER_WIRE_HDR_LEN || t->payload_sent < t->payload_len)
            return;
        tx_pop(s);
        tcp_gpu_tx_sent(t);
        if (s->target)
            response_sent(s, t);
        else if (t->op == XFER_WIRE_FENCE) /* answered by nothing */
            tcp_tx_free(t);
        else
            inflight_push(s, t);
    }
}

/* Is the head's GPU payload (or the GPU copy its ack waits for) done? 1 yes,
 * 0 not yet, -1 the head was a chunk whose copy failed (completed, popped). */
static int gpu_head_ready(struct tcp_sock *s)
{
    struct tcp_tx *t = s->tx_head;
    char why[240];
    int rc = tcp_gpu_tx_check(s, t, why, sizeof(why));
    if (rc >= 0)
        return rc;
    tx_pop(s);
    tcp_chunk_complete(s, t, rc, why);
    return -1;
}

/* direct: called by a submitting thread; a failing send is left to the
 * owner (kicked by the caller), which alone closes sockets. Returns false if
 * frames are left unsent. */
static bool send_queued(struct tcp_sock *s, bool direct)
{
    if (s->fd < 0)
        return false;
    if (!s->target && !splice_queue(s, direct))
        return false;
    for (;;) {
        drop_dead_heads(s);
        if (!s->tx_head)
            break;
        tcp_gpu_prefetch(s);
        int ready = gpu_head_ready(s);
        if (ready < 0)
            continue;
        if (ready == 0)
            break;
        struct gather g;
        g.niov = g.npinned = 0;
        g.last = false;
        int n_ent = 0;
        for (struct tcp_tx *t = s->tx_head; t && n_ent < TCP_IOV_MAX && !g.last;
             t = t->next, n_ent++)
            if ((t != s->tx_head && t->gpu && tcp_gpu_tx_check(s, t, NULL, 0) != 1) ||
                !gather_add(s, &g, t))
                break;
        if (n_ent == 0)
            continue; /* the unsent head just ended: dropped next round */
        struct msghdr msg = {.msg_iov = g.iov, .msg_iovlen = (size_t)g.niov};
        ssize_t n = sendmsg(s->fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
        int err = errno;
        for (int i = 0, j; i < g.npinned; i = j) { /* one lock round per run of a batch */
            for (j = i + 1; j < g.npinned && g.pinned[j]->b == g.pinned[i]->b; j++)
                ;
            xfer_batch_io_end_n(g.pinned[i]->b, j - i);
        }
        if (n < 0) {
            if (err == EINTR)
                continue;
            if (err == EAGAIN || err == EWOULDBLOCK) { /* the owner goes on at EPOLLOUT */
                if (!s->out_armed) {
                    s->out_armed = true;
                    tcp_sock_interest(s);
                }
            } else if (!direct) {
                tcp_sock_fail(s, -XFER_ECONN, strerror(err));
            }
            return false;
        }
        s->last_progress_ms = xfer_now_ms();
        tx_advance(s, (size_t)n);
    }
    if (s->target && s->rx_blocked && s->tx_count < TCP_TXQ_HIGH / 4) {
        s->rx_blocked = false;
        ready_push(s);
    }
    return true;
}

void tcp_sock_writable(struct tcp_sock *s)
{
    send_queued(s, false);
}

bool tcp_sock_send_direct(struct tcp_sock *s)
{
    if (pthread_mutex_trylock(&s->iomu) != 0)
        return false; /* the owner is at it: it sees the queue when done */
    /* Only an idle socket: a busy one has the owner waiting for EPOLLOUT. */
    bool ok = !s->tx_head && s->fd >= 0 && send_queued(s, true) && !s->tx_head;
    pthread_mutex_unlock(&s->iomu);
    return ok;
}

/* ---- initiator: responses --------------------------------------------------------- */

static struct tcp_tx *inflight_pop(struct tcp_sock *s)
{
    struct tcp_tx *t = s->inf_head;
    s->inf_head = t->next;
    if (!s->inf_head)
        s->inf_tail = NULL;
    return t;
}

static void remote_refused(struct tcp_sock *s, struct tcp_tx *t, int status)
{
    if (tcp_tx_items(t) > 1 && status != -XFER_ECANCELED) {
        tcp_run_split(s, t); /* each item gets its own answer */
        return;
    }
    char why[160];
    snprintf(why, sizeof(why), "target %s refused: %s", s->name, xfer_strerror(status));
    tcp_chunk_complete(s, t, status, why);
}

/* Header of a response: checks it against the oldest request. 1 = go on. */
static int initiator_header(struct tcp_sock *s)
{
    struct xfer_wire_hdr *h = &s->rh;
    if (xfer_wire_decode(s->rxbuf + s->rx_lo, TCP_MAX_PAYLOAD, h) < 0) {
        tcp_sock_fail(s, -XFER_EPROTO, "malformed response header");
        return -1;
    }
    s->rx_lo += XFER_WIRE_HDR_LEN;
    struct tcp_tx *t = s->inf_head;
    if (!t || h->req_id != t->req_id || h->op != t->op + 1 ||
        (h->op == XFER_WIRE_READ_RESP && h->status == 0 && h->length != t->len)) {
        tcp_sock_fail(s, -XFER_EPROTO, "response does not match the oldest request");
        return -1;
    }
    rx_note(s, h->op == XFER_WIRE_READ_RESP && h->status == 0 ? t->len : 0);
    if (h->op == XFER_WIRE_READ_RESP && h->status == 0 && t->len > 0) {
        s->rx_state = RX_PAYLOAD;
        s->rx_got = 0;
        return 1;
    }
    inflight_pop(s);
    if (h->status < 0)
        remote_refused(s, t, h->status);
    else if (h->status == 0)
        chunk_done_later(s, t);
    else /* XFER_MSG_* answering a MSG_REQ (the decoder allows no other) */
        tcp_chunk_complete(s, t, h->status, NULL);
    return 1;
}

/* READ payload into local memory, pinned per call; discarded if the item
 * ended meanwhile. */
/* READ payload for local GPU memory: into a staging slot, then H2D. */
static ssize_t initiator_payload_gpu(struct tcp_sock *s, struct tcp_tx *t)
{
    if (s->rx_gslot < 0 && s->rx_gerr == 0) {
        char why[160];
        int rc = tcp_gpu_rx_slot(s, t->gdev, t->len, why, sizeof(why));
        if (rc == -XFER_EBUSY)
            return 0;
        if (rc < 0) {
            xfer_warn("tcp: %s: %s", s->name, why);
            s->rx_gerr = rc;
        }
    }
    uint64_t left = t->len - s->rx_got;
    ssize_t n = payload_in(s, s->rx_gslot >= 0 ? s->rx_host + s->rx_got : NULL, left);
    if (n < 0)
        rx_failed(s);
    if (n <= 0)
        return n;
    s->rx_got += (uint64_t)n;
    if (s->rx_got == t->len) {
        s->rx_state = RX_HDR;
        tcp_gpu_land(s, inflight_pop(s));
    }
    return n;
}

static ssize_t initiator_payload(struct tcp_sock *s)
{
    struct tcp_tx *t = s->inf_head;
    if (t->gpu)
        return initiator_payload_gpu(s, t);
    uint64_t left = t->len - s->rx_got;
    bool live = xfer_batch_io_begin(t->b, t->idx);
    ssize_t n = payload_in(s, live ? t->local + s->rx_got : NULL, left);
    if (live)
        xfer_batch_io_end(t->b, t->idx);
    if (n < 0)
        rx_failed(s);
    if (n <= 0)
        return n;
    s->rx_got += (uint64_t)n;
    if (s->rx_got == t->len) {
        s->rx_state = RX_HDR;
        chunk_done_later(s, inflight_pop(s));
    }
    return n;
}

static void initiator_read(struct tcp_sock *s);

static void initiator_readable(struct tcp_sock *s)
{
    initiator_read(s);
    done_flush(s);
}

static void initiator_read(struct tcp_sock *s)
{
    size_t budget = RX_BUDGET;
    while (s->fd >= 0) {
        ssize_t n;
        if (s->rx_state == RX_HDR) {
            struct tcp_tx *t = s->inf_head;
            bool big = t && t->op == XFER_WIRE_READ_REQ && t->len >= 65536;
            int rc = fill_header(s, big);
            if (rc <= 0)
                return;
            if (initiator_header(s) < 0)
                return;
            continue;
        }
        n = initiator_payload(s);
        if (n <= 0)
            return;
        if ((size_t)n >= budget) {
            ready_push(s);
            return;
        }
        budget -= (size_t)n;
    }
}

/* ---- target: requests ---------------------------------------------------------- */

struct tcp_tx *tcp_queue_response(struct tcp_sock *s, const struct xfer_wire_hdr *req, uint8_t op,
                                  int status, xfer_region *r, uint8_t *payload)
{
    struct tcp_tx *t = s->tx_spare;
    if (t) {
        s->tx_spare = t->next;
        s->tx_nspare--;
        memset(t, 0, sizeof(*t));
    } else {
        t = calloc(1, sizeof(*t));
    }
    if (!t) {
        if (r)
            xfer_region_release(r);
        tcp_sock_fail(s, -XFER_ENOMEM, "out of memory for a response");
        return NULL;
    }
    struct xfer_wire_hdr h = *req;
    h.op = op;
    h.status = status;
    h.payload = op == XFER_WIRE_READ_RESP && status == 0 ? (uint32_t)req->length : 0;
    xfer_wire_encode(&h, t->hdr);
    t->region = r;
    t->payload = payload;
    t->payload_len = h.payload;
    t->gslot = -1;
    if (r && t->payload_len && xfer_region_kind(r) == XFER_MEM_CUDA) {
        t->gpu = true; /* sent from a staging slot after its D2H */
        t->gdev = xfer_region_device(r);
        t->gsrc = payload;
        t->payload = NULL;
        __atomic_store_n(&s->tgt_gpu, true, __ATOMIC_RELAXED); /* waiters keep off s */
    }
    if (s->tx_tail)
        s->tx_tail->next = t;
    else
        s->tx_head = t;
    s->tx_tail = t;
    s->tx_count++;
    if (s->tx_count > TCP_TXQ_HIGH)
        s->rx_blocked = true;
    return t;
}

static void served(struct tcp_sock *s, uint64_t bytes, int status)
{
    if (status == 0) { /* counted by served_flush */
        s->srv_ops++;
        s->srv_bytes += bytes;
        return;
    }
    xfer_engine_count_served(s->tt->engine, XFER_TRANSPORT_TCP, bytes, status);
    if (status < 0)
        xfer_debug("tcp: refused request from %s: %s", s->name, xfer_strerror(status));
}

/* Counts what this read served, before its responses go out (whoever sees
 * a response sees the count). */
static void served_flush(struct tcp_sock *s)
{
    if (!s->srv_ops)
        return;
    xfer_engine_count_served_n(s->tt->engine, XFER_TRANSPORT_TCP, s->srv_ops, s->srv_bytes);
    s->srv_ops = s->srv_bytes = 0;
}

/* A chunk of a GPU region must fit one staging slot (our initiators split
 * them so); a larger one is refused and r released. */
static xfer_region *gpu_chunk_fits(struct tcp_sock *s, xfer_region *r, uint64_t len, int *err)
{
    if (!r || xfer_region_kind(r) != XFER_MEM_CUDA || len <= TCP_GPU_SLOT)
        return r;
    xfer_warn("tcp: %s: refused a %llu-byte chunk of GPU memory (staging slots hold %u)", s->name,
              (unsigned long long)len, TCP_GPU_SLOT);
    xfer_region_release(r);
    *err = -XFER_ENOTSUP;
    return NULL;
}

static int target_header(struct tcp_sock *s)
{
    struct xfer_wire_hdr *h = &s->rh;
    if (xfer_wire_decode(s->rxbuf + s->rx_lo, TCP_MAX_PAYLOAD, h) < 0) {
        tcp_sock_fail(s, -XFER_EPROTO, "malformed request header (garbage on the stream)");
        return -1;
    }
    s->rx_lo += XFER_WIRE_HDR_LEN;
    rx_note(s, h->op == XFER_WIRE_READ_REQ ? 0 : h->length);
    int err = 0;
    if (h->op == XFER_WIRE_READ_REQ) {
        xfer_region *r = xfer_region_acquire_by(s->tt->engine, s->peer_node, h->region_id, h->gen,
                                                XFER_OP_READ, h->offset, h->length, &err);
        r = gpu_chunk_fits(s, r, h->length, &err);
        served(s, r ? h->length : 0, err);
        tcp_queue_response(s, h, XFER_WIRE_READ_RESP, err, r,
                           r ? (uint8_t *)xfer_region_ptr(r) + h->offset : NULL);
        return 1;
    }
    if (h->op == XFER_WIRE_MSG_REQ)
        return tcp_msg_header(s);
    if (h->op == XFER_WIRE_FENCE) {
        tcp_fence_frame_in(s);
        return 1;
    }
    if (h->op != XFER_WIRE_WRITE_REQ) {
        tcp_sock_fail(s, -XFER_EPROTO, "unexpected frame type from an initiator");
        return -1;
    }
    /* Refused writes still consume their payload so the stream stays in sync. */
    s->rx_region = xfer_region_acquire_by(s->tt->engine, s->peer_node, h->region_id, h->gen,
                                          XFER_OP_WRITE, h->offset, h->length, &err);
    s->rx_region = gpu_chunk_fits(s, s->rx_region, h->length, &err);
    s->rx_status = err;
    s->rx_dst = s->rx_region ? (uint8_t *)xfer_region_ptr(s->rx_region) + h->offset : NULL;
    s->rx_gpu = s->rx_region && xfer_region_kind(s->rx_region) == XFER_MEM_CUDA && h->length;
    if (s->rx_gpu) /* staging is the owner's: waiters keep off s (tcp_wait.c) */
        __atomic_store_n(&s->tgt_gpu, true, __ATOMIC_RELAXED);
    s->rx_seq = xfer_wire_seq(h);
    s->rx_fgen = 0; /* look its batch up once fences exist */
    s->rx_got = 0;
    s->rx_state = RX_PAYLOAD;
    return 1;
}

/* The payload is in the region, or (GPU region) in a staging slot whose
 * H2D must finish before the ack goes out; the region stays pinned till then. */
static void target_write_done(struct tcp_sock *s)
{
    tcp_msg_landed(s, s->rx_seq, s->rx_status == 0 && !s->rx_gpu);
    xfer_region *r = s->rx_region;
    s->rx_region = NULL;
    s->rx_state = RX_HDR;
    bool gpu = s->rx_gpu;
    s->rx_gpu = false;
    struct tcp_tx *t =
        tcp_queue_response(s, &s->rh, XFER_WIRE_WRITE_RESP, s->rx_status, gpu ? r : NULL, NULL);
    if (!gpu && r)
        xfer_region_release(r);
    if (gpu && t) {
        t->gdev = xfer_region_device(r);
        uint8_t *dst = (uint8_t *)xfer_region_ptr(r) + s->rh.offset;
        int rc = tcp_gpu_ack_start(s, t, dst, s->rh.length);
        if (rc < 0) {
            s->rx_status = rc;
            struct xfer_wire_hdr h = s->rh;
            h.op = XFER_WIRE_WRITE_RESP;
            h.status = rc;
            h.payload = 0;
            xfer_wire_encode(&h, t->hdr);
        }
    }
    served(s, s->rx_status == 0 ? s->rh.length : 0, s->rx_status);
}

/* A GPU region's payload goes into a staging slot: 1 = have one (or the
 * payload is discarded), 0 = wait for one. */
static int target_gpu_slot(struct tcp_sock *s)
{
    if (!s->rx_gpu || s->rx_gslot >= 0)
        return 1;
    char why[160];
    int rc = tcp_gpu_rx_slot(s, xfer_region_device(s->rx_region), s->rh.length, why, sizeof(why));
    if (rc == -XFER_EBUSY)
        return 0;
    if (rc < 0) { /* no device: refuse, discard the payload */
        xfer_warn("tcp: %s: %s", s->name, why);
        xfer_region_release(s->rx_region);
        s->rx_region = NULL;
        s->rx_gpu = false;
        s->rx_status = rc;
        s->rx_dst = NULL;
        return 1;
    }
    s->rx_dst = s->rx_host;
    return 1;
}

/* The WRITE being received belongs to a fenced (cancelled) batch: the rest
 * of its payload is discarded, the frame answered -XFER_ECANCELED. */
static void fenced_write(struct tcp_sock *s)
{
    xfer_region_release(s->rx_region);
    s->rx_region = NULL;
    s->rx_dst = NULL;
    s->rx_status = -XFER_ECANCELED;
}

static void target_readable(struct tcp_sock *s)
{
    size_t budget = RX_BUDGET;
    while (s->fd >= 0 && !s->rx_blocked) {
        if (s->by_waiter && s->tgt_gpu) { /* GPU staging: the owner goes on */
            s->rx_defer = true;
            break;
        }
        if (s->rx_state == RX_HDR) {
            int rc = fill_header(s, false);
            if (rc <= 0 || target_header(s) < 0)
                break;
            continue;
        }
        if (!target_gpu_slot(s))
            break;
        uint64_t left = s->rh.length - s->rx_got;
        bool fence = left && s->rx_seq && s->rx_region && !s->rx_gpu;
        if (fence && !tcp_fence_enter(s)) {
            fence = false;
            fenced_write(s);
        }
        ssize_t n = left ? payload_in(s, s->rx_dst ? s->rx_dst + s->rx_got : NULL, left) : 0;
        if (fence)
            tcp_fence_leave(s);
        if (n < 0)
            rx_failed(s);
        if (n < 0 || (n == 0 && left))
            break;
        s->rx_got += (uint64_t)n;
        if (s->rx_got == s->rh.length && s->rh.op == XFER_WIRE_MSG_REQ)
            tcp_msg_received(s);
        else if (s->rx_got == s->rh.length)
            target_write_done(s);
        if ((size_t)n >= budget) {
            ready_push(s);
            break;
        }
        budget -= (size_t)n;
    }
    served_flush(s);
    if (s->fd >= 0 && s->tx_head && !(s->by_waiter && s->tgt_gpu))
        tcp_sock_writable(s);
}

void tcp_sock_readable(struct tcp_sock *s)
{
    s->rx_short = false;
    if (s->target)
        target_readable(s);
    else
        initiator_readable(s);
}
