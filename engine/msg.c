/*
 * Engine messages: the thread that sends them and the dispatch of received
 * ones (docs/notify.md).
 *
 * Why a thread: a bound notification becomes ready inside item_end(), under
 * the batch lock and often on a transport's progress thread, while the
 * peer's conn_lock ranks above the batch lock. The message thread takes
 * conn_lock for reading, with no other lock held, and calls send_msg.
 *
 * Direct sections (msg_direct_begin/end): a thread that will hold no lock
 * at the section's end (a submitting caller) keeps what it queues in the
 * section and delivers it itself at the end, on its own thread: no hand-off
 * to the message thread (docs/perf.md, "Messages and notifications").
 */
#include "blk_cache.h"
#include "internal.h"
#include "mono_clock.h"
#include "msg_wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Messages of up to MSG_OUT_BLK bytes (struct and frame: a notification
 * of up to ~900 bytes, an eager RTS of up to ~180 bytes, every FIN and
 * rendezvous RTS) come from a process-wide cache of blocks: they are
 * built by a submitter and freed by whichever thread reads the answer
 * (blk_cache.h). Larger ones are malloc'd. */
#define MSG_OUT_BLK 1024
static struct xfer_blk_cache out_cache = {.size = MSG_OUT_BLK, .tl = BLK_TL_OUT};

struct msg_out *msg_out_new(size_t len)
{
    bool small = sizeof(struct msg_out) + len <= MSG_OUT_BLK;
    struct msg_out *o = small ? xfer_blk_get(&out_cache) : malloc(sizeof(*o) + len);
    if (!o)
        return NULL;
    memset(o, 0, sizeof(*o)); /* the frame's encoder writes every byte of it */
    o->m.frame = (const uint8_t *)(o + 1);
    o->m.len = len;
    o->cached = small;
    return o;
}

void msg_out_free(struct msg_out *o)
{
    if (o && o->cached)
        xfer_blk_put(&out_cache, o);
    else
        free(o);
}

uint64_t msg_next_seq(xfer_engine *e)
{
    return __atomic_add_fetch(&e->msgs.seq, 1, __ATOMIC_RELAXED);
}

/* A counter (inflight, direct) reached 0: wake whoever waits for that. */
static void counter_zero(struct msg_thread *t, pthread_cond_t *cv)
{
    if (!__atomic_load_n(&t->waiters, __ATOMIC_SEQ_CST))
        return;
    pthread_mutex_lock(&t->mu);
    pthread_cond_broadcast(cv);
    pthread_mutex_unlock(&t->mu);
}

static void msg_finish(struct msg_out *o, int status, const char *why)
{
    xfer_engine *e = o->peer ? o->peer->engine : NULL;
    if (o->done)
        o->done(o, status, why);
    msg_out_free(o);
    if (!e)
        return;
    struct msg_thread *t = &e->msgs;
    size_t v = __atomic_load_n(&t->inflight, __ATOMIC_SEQ_CST);
    do
        if (v == 0)
            return;
    while (!__atomic_compare_exchange_n(&t->inflight, &v, v - 1, false, __ATOMIC_SEQ_CST,
                                        __ATOMIC_SEQ_CST));
    if (v == 1)
        counter_zero(t, &t->idle_cv);
}

void xfer_msg_done(struct xfer_msg *m, int status, const char *why)
{
    msg_finish(container_of(m, struct msg_out, m), status, why);
}

bool xfer_msg_fold(struct xfer_msg *into, const struct xfer_msg *fin)
{
    struct msg_out *o = container_of(into, struct msg_out, m);
    size_t cap = o->cached ? MSG_OUT_BLK - sizeof(*o) : into->len; /* (malloc'd: no room) */
    size_t len = xfer_msg_fold_fin((uint8_t *)into->frame, into->len, cap, fin->frame, fin->len);
    if (!len)
        return false;
    into->len = len;
    return true;
}

/* Hands o to its peer's transport; no lock held on entry. */
static void msg_deliver(struct msg_out *o)
{
    xfer_peer *p = o->peer;
    char why[160];
    pthread_rwlock_rdlock(&p->conn_lock);
    struct xfer_conn *c = p->conn;
    int rc;
    if (!c) {
        snprintf(why, sizeof(why), "peer %s is not connected", p->desc.node_id);
        rc = -XFER_ECONN;
    } else if (!c->transport->ops->send_msg) {
        snprintf(why, sizeof(why), "transport %s carries no messages", c->transport->ops->name);
        rc = -XFER_ENOTSUP;
    } else {
        rc = c->transport->ops->send_msg(c, &o->m); /* o may be gone from here on */
        if (rc < 0)
            snprintf(why, sizeof(why), "%s: sending a message to %s: %s", c->transport->ops->name,
                     p->desc.node_id, xfer_strerror(rc));
        if (rc == -XFER_ECONN)
            peer_repair_kick(p);
    }
    pthread_rwlock_unlock(&p->conn_lock);
    if (rc < 0)
        msg_finish(o, rc, why);
}

/* This thread's direct section: depth and the messages it keeps. */
static __thread struct {
    int depth;
    struct msg_out *head, *tail;
} tl_direct;

void msg_direct_begin(void)
{
    tl_direct.depth++;
}

void msg_direct_end(void)
{
    if (--tl_direct.depth > 0)
        return;
    /* Delivered in the order queued: messages to a peer keep their order. */
    while (tl_direct.head) {
        struct msg_out *o = tl_direct.head;
        struct msg_thread *t = &o->peer->engine->msgs;
        tl_direct.head = o->next;
        if (!tl_direct.head)
            tl_direct.tail = NULL;
        msg_deliver(o); /* o->m.wait_b: still inside its submit */
        if (__atomic_sub_fetch(&t->direct, 1, __ATOMIC_SEQ_CST) == 0)
            counter_zero(t, &t->done_cv);
    }
}

#define SWEEP_NS     200000000 /* two-sided entries of dead peers fail this often */
#define MSG_DRAIN_MS 1000      /* engine free waits this long for messages in flight */

/* t->mu held: a unit of work done outside mu has finished. */
static void work_done(struct msg_thread *t)
{
    t->busy = false;
    t->rounds++;
    pthread_cond_broadcast(&t->done_cv);
}

/* Runs the matcher when kicked and the sweep every SWEEP_NS; t->mu held on
 * entry and exit. True if it dropped the lock. */
static bool match_work(xfer_engine *e, struct msg_thread *t)
{
    int64_t now = xfer_mono_ns();
    bool sweep = now - t->swept_ns >= SWEEP_NS, kick = t->kick;
    if (!sweep && !kick)
        return false;
    t->kick = false;
    if (sweep)
        t->swept_ns = now;
    t->busy = true;
    pthread_mutex_unlock(&t->mu);
    if (sweep)
        mm_sweep(e);
    mm_match_run(e);
    pthread_mutex_lock(&t->mu);
    work_done(t);
    return true;
}

void msg_kick(xfer_engine *e)
{
    struct msg_thread *t = &e->msgs;
    pthread_mutex_lock(&t->mu);
    t->kick = true;
    pthread_cond_signal(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

static void *msg_main(void *arg)
{
    xfer_engine *e = arg;
    struct msg_thread *t = &e->msgs;
    pthread_mutex_lock(&t->mu);
    while (!t->stop) {
        if (match_work(e, t))
            continue;
        struct msg_out *o = t->head;
        if (!o) {
            struct timespec ts = xfer_mono_after_ns(SWEEP_NS);
            pthread_cond_timedwait(&t->cv, &t->mu, &ts);
            continue;
        }
        t->head = o->next;
        if (!t->head)
            t->tail = NULL;
        t->busy = true;
        pthread_mutex_unlock(&t->mu);
        msg_deliver(o);
        pthread_mutex_lock(&t->mu);
        work_done(t);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

int msg_send(xfer_engine *e, struct msg_out *o)
{
    struct msg_thread *t = &e->msgs;
    o->next = NULL;
    if (tl_direct.depth > 0) { /* no lock: the thread's own list, atomic counts */
        if (__atomic_load_n(&t->stop, __ATOMIC_ACQUIRE) ||
            !__atomic_load_n(&t->started, __ATOMIC_ACQUIRE))
            return -XFER_ECANCELED;
        __atomic_add_fetch(&t->inflight, 1, __ATOMIC_SEQ_CST);
        /* msg_peer_gone waits for it: o->peer is used until delivered */
        __atomic_add_fetch(&t->direct, 1, __ATOMIC_SEQ_CST);
        if (tl_direct.tail)
            tl_direct.tail->next = o;
        else
            tl_direct.head = o;
        tl_direct.tail = o;
        return 0;
    }
    pthread_mutex_lock(&t->mu);
    bool stopped = t->stop || !t->started;
    if (!stopped) {
        o->m.wait_b = NULL; /* the batch may be gone when the thread delivers o */
        if (t->tail)
            t->tail->next = o;
        else
            t->head = o;
        t->tail = o;
        __atomic_add_fetch(&t->inflight, 1, __ATOMIC_SEQ_CST);
        pthread_cond_signal(&t->cv);
    }
    pthread_mutex_unlock(&t->mu);
    return stopped ? -XFER_ECANCELED : 0;
}

int msg_handed(xfer_engine *e)
{
    struct msg_thread *t = &e->msgs;
    if (__atomic_load_n(&t->stop, __ATOMIC_ACQUIRE) ||
        !__atomic_load_n(&t->started, __ATOMIC_ACQUIRE))
        return -XFER_ECANCELED;
    __atomic_add_fetch(&t->inflight, 1, __ATOMIC_SEQ_CST);
    return 0;
}

/* Unlinks the queued messages of p. t->mu held. */
static struct msg_out *take_peer_msgs(struct msg_thread *t, const xfer_peer *p)
{
    struct msg_out *gone = NULL, **pp = &t->head;
    t->tail = NULL;
    while (*pp) {
        struct msg_out *o = *pp;
        if (o->peer == p) {
            *pp = o->next;
            o->next = gone;
            gone = o;
        } else {
            t->tail = o;
            pp = &o->next;
        }
    }
    return gone;
}

void msg_peer_gone(xfer_engine *e, xfer_peer *p)
{
    struct msg_thread *t = &e->msgs;
    if (!t->started)
        return;
    /* The thread's current work may hold p or queue more for it (a matched
     * RECV failing sends a FIN): repeat until a pass finds nothing. */
    for (int pass = 0;; pass++) {
        mm_peer_gone(e, p);
        pthread_mutex_lock(&t->mu);
        struct msg_out *gone = take_peer_msgs(t, p);
        uint64_t r = t->rounds;
        __atomic_add_fetch(&t->waiters, 1, __ATOMIC_SEQ_CST);
        while ((t->busy && t->rounds == r) || __atomic_load_n(&t->direct, __ATOMIC_SEQ_CST))
            pthread_cond_wait(&t->done_cv, &t->mu);
        __atomic_sub_fetch(&t->waiters, 1, __ATOMIC_SEQ_CST);
        pthread_mutex_unlock(&t->mu);
        if (!gone && pass > 0)
            return;
        while (gone) {
            struct msg_out *next = gone->next;
            msg_finish(gone, -XFER_ECONN, "peer removed");
            gone = next;
        }
    }
}

int msg_thread_start(xfer_engine *e)
{
    struct msg_thread *t = &e->msgs;
    pthread_mutex_init(&t->mu, NULL);
    xfer_cond_init_mono(&t->cv);
    pthread_cond_init(&t->done_cv, NULL);
    xfer_cond_init_mono(&t->idle_cv);
    msg_match_init(e);
    t->behind = !xfer_env_off("XFER_NOTIFY_BEHIND"); /* off: measuring, or a peer without it */
    if (pthread_create(&t->thread, NULL, msg_main, e) != 0) {
        xfer_engine_set_error(e, "cannot start the message thread");
        return -XFER_ENOMEM;
    }
    __atomic_store_n(&t->started, true, __ATOMIC_RELEASE);
    return 0;
}

void msg_thread_stop(xfer_engine *e)
{
    struct msg_thread *t = &e->msgs;
    if (!t->started)
        return;
    pthread_mutex_lock(&t->mu);
    /* Drain first: the peer's side of a two-sided message may wait for a
     * FIN that the last RECV before this call queued. */
    struct timespec until = xfer_mono_after_ms(MSG_DRAIN_MS);
    __atomic_add_fetch(&t->waiters, 1, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&t->inflight, __ATOMIC_SEQ_CST) &&
           pthread_cond_timedwait(&t->idle_cv, &t->mu, &until) == 0)
        ;
    __atomic_sub_fetch(&t->waiters, 1, __ATOMIC_SEQ_CST);
    __atomic_store_n(&t->stop, true, __ATOMIC_RELEASE);
    pthread_cond_signal(&t->cv);
    pthread_mutex_unlock(&t->mu);
    pthread_join(t->thread, NULL);
    pthread_mutex_lock(&t->mu);
    struct msg_out *o = t->head;
    t->head = t->tail = NULL;
    __atomic_store_n(&t->started, false, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&t->mu);
    while (o) {
        struct msg_out *next = o->next;
        msg_finish(o, -XFER_ECANCELED, "engine is shutting down");
        o = next;
    }
    msg_match_destroy(e);
}

/* ---- receiving -------------------------------------------------------------- */

/* A received notification is built by the thread that reads it and freed
 * by the application's: small ones (up to NOTIF_BLK bytes with their
 * message) come from a block cache too. Every notification block is at
 * least NOTIF_BLK bytes, so either way of freeing one is safe. */
#define NOTIF_BLK 256
static struct xfer_blk_cache notif_cache = {.size = NOTIF_BLK, .tl = BLK_TL_NOTIF};

void msg_notif_free(struct xfer_notif *n)
{
    if (n && (size_t)(n->data - (uint8_t *)n) + n->len + 1 <= NOTIF_BLK)
        xfer_blk_put(&notif_cache, n);
    else
        free(n);
}

static struct xfer_notif *notif_from_frame(const char *node_id, uint64_t incarnation,
                                           const uint8_t *frame, const struct xfer_msg_hdr *h)
{
    size_t failed_bytes = (size_t)h->n_listed * sizeof(struct xfer_notif_fail);
    size_t size = sizeof(struct xfer_notif) + failed_bytes + h->msg_len + 1;
    struct xfer_notif *n = size <= NOTIF_BLK ? xfer_blk_get(&notif_cache) : malloc(size);
    if (!n)
        return NULL;
    memset(n, 0, sizeof(*n));
    /* (snprintf "%s" was ~600 instructions per notification: a third of
     * what the receiving side's engine does for one) */
    xfer_copy_str(n->node_id, sizeof(n->node_id), node_id);
    n->incarnation = incarnation;
    n->seq = h->seq;
    n->bound = h->flags & XFER_MSG_F_BOUND;
    n->status = h->status;
    n->n_items = h->n_items;
    n->n_failed = h->n_failed;
    n->n_listed = h->n_listed;
    n->failed = (struct xfer_notif_fail *)(n + 1);
    for (uint32_t k = 0; k < h->n_listed; k++)
        n->failed[k] = xfer_msg_failed_at(frame, k);
    n->data = (uint8_t *)n->failed + failed_bytes;
    n->len = h->msg_len;
    memcpy(n->data, xfer_msg_payload(frame, h), h->msg_len);
    n->data[h->msg_len] = '\0';
    return n;
}

int xfer_engine_msg_recv(xfer_engine *e, const char *node_id, uint64_t incarnation,
                         const uint8_t *frame, size_t len)
{
    struct xfer_msg_hdr h;
    char why[96];
    if (xfer_msg_decode(frame, len, &h, why, sizeof(why)) < 0) {
        xfer_warn("refused a message from %s: %s", node_id, why);
        return -XFER_EPROTO;
    }
    if (h.kind == XFER_MSG_RTS || h.kind == XFER_MSG_FIN) {
        const uint8_t *body = xfer_msg_payload(frame, &h);
        struct xfer_msg_rts r;
        struct xfer_msg_fin f;
        if (h.kind == XFER_MSG_FIN && xfer_msg_decode_fin(body, &f) == 0)
            return mm_fin_arrived(e, node_id, &f);
        bool fin = h.flags & XFER_MSG_F_FIN; /* a FIN rides in front */
        if (fin && xfer_msg_split_fin(&h, &body, &f) < 0)
            h.kind = XFER_MSG_FIN; /* (for the warning) */
        if (h.kind == XFER_MSG_RTS && xfer_msg_decode_rts(&h, body, &r) == 0) {
            if (fin) /* sent before the RTS: taken first */
                mm_fin_arrived(e, node_id, &f);
            return mm_rts_arrived(e, node_id, incarnation, &r);
        }
        xfer_warn("refused a message from %s: malformed %s", node_id,
                  h.kind == XFER_MSG_RTS ? "RTS" : "FIN");
        return -XFER_EPROTO;
    }
    struct xfer_notif *n = notif_from_frame(node_id, incarnation, frame, &h);
    if (!n)
        return -XFER_ENOMEM;
    int rc = notify_queue_push(e, n);
    if (rc < 0) {
        xfer_debug("notification %llu from %s refused: receive queue full",
                   (unsigned long long)h.seq, node_id);
        msg_notif_free(n);
    }
    return rc;
}
