/*
 * Two-sided messages: matching (docs/notify.md). Rendezvous, receiver
 * driven: a SEND item registers here and sends an RTS (tag, length, its
 * region); the target queues the RTS, the message thread pairs it with the
 * oldest posted RECV that fits (peer or any, tag or any), and the RECV item
 * becomes a READ of the sender's region (batch_msg.c), whose end sends a FIN
 * that completes the SEND. Data thus moves on the transports' READ path,
 * except for an eager RTS (up to XFER_MSG_EAGER_MAX bytes inside the frame,
 * kept here with the RTS until matched): its bytes are copied into the RECV.
 *
 * Who matches (docs/perf.md, "Messages and notifications"): the transport
 * thread an RTS arrives on, for pairs that need no post (an eager message
 * into host memory, a truncation, an empty message; the FIN of the arrived
 * RTS then travels as its answer, XFER_MSG_DELIVERED); the submitting
 * thread of a batch with RECVs (any pair: it may post the READ); the
 * message thread for the rest (kicked when a transport thread stops at a
 * pair it may not complete). Pairs are taken in order under mu by whoever
 * runs, so the matching rules do not depend on the thread.
 *
 * Locks: mm->mu is a leaf, except that an arriving RTS looks its peer up
 * (peer table, peer lock) under it: a peer removal's sweep (under mu) thus
 * comes after any RTS queued from that peer. Entries hold a reference on
 * their batch; an entry is taken off its list under mu by exactly one of:
 * the matcher, a FIN, the sweep, or mm_forget (the item ended), which then
 * owns that reference.
 */
#include "blk_cache.h"
#include "internal.h"
#include "msg_wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct mm_recv {
    struct mm_recv *next;
    xfer_batch *b;
    size_t i;
    uint64_t run;
    xfer_peer *want; /* NULL = any peer */
    uint64_t tag;    /* or XFER_MSG_TAG_ANY */
    uint64_t cap;    /* the buffer's length */
    bool host;       /* the buffer is host memory (eager bytes are copied in) */
};

struct mm_rts {
    struct mm_rts *next;
    xfer_peer *from;
    struct xfer_msg_rts r;
};

struct mm_send {
    struct mm_send *next;
    uint64_t id;
    xfer_batch *b;
    size_t i;
    uint64_t run, len;
    xfer_peer *to;
};

/* Entries are made by one thread and freed by another (a submitter posts a
 * RECV, the transport thread an RTS arrives on matches and frees it): from
 * block caches (blk_cache.h), not malloc, in steady state. An RTS with up
 * to RTS_BLK - sizeof(struct mm_rts) eager bytes fits a cached block. */
#define RTS_BLK 1024
union mm_entry {
    struct mm_recv v;
    struct mm_send s;
};
static struct xfer_blk_cache ent_cache = {.size = sizeof(union mm_entry), .tl = BLK_TL_ENT};
static struct xfer_blk_cache rts_cache = {.size = RTS_BLK, .tl = BLK_TL_RTS};

static size_t rts_size(size_t eager)
{
    return sizeof(struct mm_rts) + eager;
}

static struct mm_rts *rts_new(size_t eager)
{
    return rts_size(eager) <= RTS_BLK ? xfer_blk_get(&rts_cache) : malloc(rts_size(eager));
}

static void rts_free(struct mm_rts *x)
{
    if (x && rts_size(x->r.eager ? x->r.len : 0) <= RTS_BLK)
        xfer_blk_put(&rts_cache, x);
    else
        free(x);
}

/* A transport thread's inline match: the FIN of this SEND is not sent but
 * becomes the answer to its RTS (mm_rts_arrived). */
struct fin_capture {
    const xfer_peer *to;
    uint64_t send_id;
    bool hit;
};
static __thread struct fin_capture *tl_fin;

void msg_match_init(xfer_engine *e)
{
    pthread_mutex_init(&e->match.mu, NULL);
    pthread_cond_init(&e->match.idle_cv, NULL);
    /* XFER_MSG_EAGER=0: every SEND goes rendezvous (measuring the eager
     * path; talking to a peer that predates the eager RTS) */
    e->match.eager = !xfer_env_off("XFER_MSG_EAGER");
    /* XFER_MSG_SHORT=0: XFER_SEND_LOCAL sends the long RTS (a receiver
     * built before the short one refuses XFER_MSG_F_SHORT) */
    e->match.short_rts = !xfer_env_off("XFER_MSG_SHORT");
}

/* ---- registration (b->mu held) ------------------------------------------------- */

int mm_recv_add(xfer_engine *e, xfer_batch *b, size_t i, uint64_t run, xfer_peer *want,
                uint64_t tag, uint64_t cap, bool host)
{
    struct mm_recv *r = xfer_blk_get(&ent_cache);
    if (!r)
        return -XFER_ENOMEM;
    *r = (struct mm_recv){NULL, b, i, run, want, tag, cap, host};
    xfer_batch_hold(b);
    struct msg_match *m = &e->match;
    pthread_mutex_lock(&m->mu);
    if (m->recv_tail)
        m->recv_tail->next = r;
    else
        m->recv_head = r;
    m->recv_tail = r;
    /* An RTS waiting already: the submitter matches (batch_msg_submit);
     * one arriving later finds this RECV (mm_rts_arrived). */
    bool early = m->rts_head != NULL;
    pthread_mutex_unlock(&m->mu);
    return early;
}

int mm_send_add(xfer_engine *e, xfer_batch *b, size_t i, uint64_t run, xfer_peer *p, uint64_t len,
                uint64_t *send_id)
{
    struct mm_send *s = xfer_blk_get(&ent_cache);
    if (!s)
        return -XFER_ENOMEM;
    struct msg_match *m = &e->match;
    xfer_batch_hold(b);
    pthread_mutex_lock(&m->mu);
    *s = (struct mm_send){m->sends, ++m->next_send_id, b, i, run, len, p};
    m->sends = s;
    *send_id = s->id;
    pthread_mutex_unlock(&m->mu);
    return 0;
}

void mm_forget(xfer_engine *e, xfer_batch *b, size_t i)
{
    struct msg_match *m = &e->match;
    void *gone = NULL;
    pthread_mutex_lock(&m->mu);
    struct mm_recv *prev = NULL;
    for (struct mm_recv *r = m->recv_head; r; prev = r, r = r->next) {
        if (r->b == b && r->i == i) {
            if (prev)
                prev->next = r->next;
            else
                m->recv_head = r->next;
            if (m->recv_tail == r)
                m->recv_tail = prev;
            gone = r;
            break;
        }
    }
    for (struct mm_send **pp = &m->sends; !gone && *pp; pp = &(*pp)->next) {
        if ((*pp)->b == b && (*pp)->i == i) {
            gone = *pp;
            *pp = (*pp)->next;
            break; /* pp may point at a NULL link now: no step past it */
        }
    }
    pthread_mutex_unlock(&m->mu);
    if (gone) {
        batch_unhold_locked(b);
        xfer_blk_put(&ent_cache, gone);
    }
}

/* ---- sending RTS and FIN -------------------------------------------------------- */

/* Unlinks the SEND waiting for its FIN by id (and receiver, if node). */
static struct mm_send *take_send(struct msg_match *m, uint64_t id, const char *node)
{
    struct mm_send *s = NULL;
    pthread_mutex_lock(&m->mu);
    for (struct mm_send **pp = &m->sends; *pp; pp = &(*pp)->next) {
        if ((*pp)->id == id && (!node || !strcmp((*pp)->to->desc.node_id, node))) {
            s = *pp;
            *pp = s->next;
            batch_send_unlisted(s->b, s->i);
            break;
        }
    }
    pthread_mutex_unlock(&m->mu);
    return s;
}

/* The receiver's FIN (or the answer standing for it) for SEND s. */
static void send_finished(struct mm_send *s, const char *node, const struct xfer_msg_fin *f)
{
    char why[160];
    /* (each with the entry's hold dropped under the same batch lock) */
    if (f->status == 0 && f->got != s->len) {
        xfer_batch_chunk_done_put(s->b, s->i, 0, -XFER_EPROTO, "receiver reports another length");
    } else if (f->status == 0) { /* (formatting a reason per message cost ~1k instructions) */
        xfer_batch_chunk_done_put(s->b, s->i, s->len, 0, NULL);
    } else {
        snprintf(why, sizeof(why), "receiver %s: %s", node, xfer_strerror(f->status));
        xfer_batch_chunk_done_put(s->b, s->i, 0, f->status, why);
    }
    xfer_blk_put(&ent_cache, s);
}

/* An RTS that was not queued at the target fails its SEND (if still
 * waiting); one answered XFER_MSG_DELIVERED completes it (no FIN follows). */
static void rts_done(struct msg_out *o, int status, const char *why)
{
    if (status == 0)
        return; /* queued there; the FIN completes the SEND */
    struct mm_send *s = take_send(&o->peer->engine->match, o->id, NULL);
    if (!s)
        return;
    if (status == XFER_MSG_DELIVERED) {
        struct xfer_msg_fin f = {o->id, 0, s->len};
        send_finished(s, o->peer->desc.node_id, &f);
        return;
    }
    char msg[160];
    snprintf(msg, sizeof(msg), "send to %s: %s", o->peer->desc.node_id,
             why && *why ? why : xfer_strerror(status));
    xfer_batch_chunk_done_put(s->b, s->i, 0, status, msg);
    xfer_blk_put(&ent_cache, s);
}

void mm_send_rts(xfer_engine *e, xfer_batch *b, xfer_peer *p, const struct xfer_msg_rts *r)
{
    struct msg_out *o = msg_out_new(xfer_msg_rts_frame_len(r));
    if (!o) {
        struct msg_out stub = {.peer = p, .id = r->send_id};
        rts_done(&stub, -XFER_ENOMEM, "out of memory for a message");
        return;
    }
    xfer_msg_encode_rts(msg_next_seq(e), r, (uint8_t *)o->m.frame);
    o->peer = p;
    o->id = r->send_id;
    o->done = rts_done;
    o->m.wait_b = b;       /* the answer may complete the SEND (cleared unless direct) */
    o->m.lazy = !r->eager; /* rendezvous: the FIN completes the SEND, not this answer */
    if (msg_send(e, o) < 0) {
        struct msg_out stub = {.peer = p, .id = r->send_id};
        msg_out_free(o);
        rts_done(&stub, -XFER_ECANCELED, "engine is shutting down");
    }
}

/* A locally completed SEND (XFER_SEND_LOCAL): its frame was written (tcp:
 * status 0, no answer comes), or its transport carried the target's
 * answer (0 or XFER_MSG_DELIVERED: done; an error ends it). o->id is the
 * item's index, o->note its length. */
static void local_done(struct msg_out *o, int status, const char *why)
{
    xfer_batch *b = o->b; /* our hold is dropped under the batch lock of the end */
    if (status >= 0) {
        xfer_batch_chunk_done_put(b, (size_t)o->id, o->note, 0, NULL);
    } else {
        char msg[160];
        snprintf(msg, sizeof(msg), "send to %s: %s", o->peer->desc.node_id,
                 why && *why ? why : xfer_strerror(status));
        xfer_batch_chunk_done_put(b, (size_t)o->id, 0, status, msg);
    }
}

void mm_send_local(xfer_engine *e, xfer_batch *b, size_t i, xfer_peer *p,
                   const struct xfer_msg_rts *r)
{
    struct msg_out *o = msg_out_new(xfer_msg_rts_frame_len(r));
    xfer_batch_hold(b);
    if (!o) {
        xfer_batch_chunk_done(b, i, 0, -XFER_ENOMEM, "out of memory for a message");
        xfer_batch_put(b);
        return;
    }
    xfer_msg_encode_rts(msg_next_seq(e), r, (uint8_t *)o->m.frame);
    o->peer = p;
    o->b = b;
    o->id = i;
    o->note = (size_t)r->len; /* (a SEND has no binding: the bytes it reports) */
    o->done = local_done;
    o->m.noresp = true; /* (no wait_b: over tcp no answer comes for a waiter to read) */
    if (msg_send(e, o) < 0) {
        msg_out_free(o);
        xfer_batch_chunk_done(b, i, 0, -XFER_ECANCELED, "engine is shutting down");
        xfer_batch_put(b);
    }
}

static void fin_done(struct msg_out *o, int status, const char *why)
{
    /* Lost: the sender's SEND ends by its deadline or the sweep. Unknown
     * there (-XFER_ENOENT, a transport that answers FINs): that SEND ended
     * already (cancel, deadline); the sender logs it too. */
    if (status < 0)
        xfer_log(status == -XFER_ENOENT ? XFER_LOG_DEBUG : XFER_LOG_WARN,
                 "FIN of a message to %s: %s", o->peer->desc.node_id,
                 why && *why ? why : xfer_strerror(status));
}

void mm_send_fin(xfer_engine *e, xfer_peer *to, uint64_t send_id, int status, uint64_t got)
{
    struct fin_capture *cap = tl_fin;
    if (cap && status == 0 && cap->to == to && cap->send_id == send_id) {
        cap->hit = true; /* the RTS's answer carries it */
        return;
    }
    struct msg_out *o = msg_out_new(XFER_MSG_HDR_LEN + XFER_MSG_FIN_BODY);
    if (!o) {
        xfer_warn("out of memory for a FIN to %s", to->desc.node_id);
        return;
    }
    struct xfer_msg_fin f = {send_id, status, got};
    xfer_msg_encode_fin(msg_next_seq(e), &f, (uint8_t *)o->m.frame);
    o->peer = to;
    o->done = fin_done;
    o->m.lazy = true;
    o->m.ride = true;
    /* No answer wanted (tcp; the others answer anyway): the answer only
     * told this side what the sender logs itself (a FIN for a SEND that
     * ended), and cost a frame each way, its decode and its completion
     * per blocking round trip. A FIN lost with its connection is the
     * sender's deadline's, as before; one that cannot be written still
     * ends here with the error (fin_done). */
    o->m.noresp = true;
    if (msg_send(e, o) < 0)
        msg_out_free(o);
}

/* ---- arrivals (transport threads) ---------------------------------------------- */

static bool match_pairs_locked(xfer_engine *e, bool inline_only);

/* mu held: the peer named node (the last sender, m->last_from, if it is
 * that one; else the peer table's) and its incarnation, or NULL. */
static xfer_peer *rts_sender(xfer_engine *e, const char *node, uint64_t *known)
{
    struct msg_match *m = &e->match;
    xfer_peer *p = m->last_from;
    for (bool cached = p != NULL;; cached = false) {
        if (!cached && !(p = xfer_peer_find(e, node)))
            return NULL;
        /* (not xfer_peer_describe: a copy of the whole ~1 KiB description per RTS) */
        pthread_mutex_lock(&p->mu);
        bool same = !cached || !strcmp(p->desc.node_id, node);
        *known = p->desc.incarnation;
        pthread_mutex_unlock(&p->mu);
        if (same)
            return m->last_from = p;
    }
}

/* Queues x from the peer named node; the peer is looked up under mu, so its
 * removal (which sweeps under mu after unlinking it) cannot free it before
 * x is queued, nor miss x. On success mu stays held (the caller matches
 * under it: match_pairs_locked). */
static int rts_queue(xfer_engine *e, const char *node, uint64_t inc, struct mm_rts *x,
                     const xfer_peer **from)
{
    struct msg_match *m = &e->match;
    pthread_mutex_lock(&m->mu);
    uint64_t known = 0;
    xfer_peer *p = rts_sender(e, node, &known);
    int rc = 0;
    if (!p)
        rc = -XFER_ENOENT;
    else if (known && known != inc)
        rc = -XFER_ESTALE;
    else if (m->n_rts >= XFER_MSG_UNEXPECTED_MAX)
        rc = -XFER_ENOSPC;
    if (rc == 0) {
        x->from = p;
        *from = p;
        if (m->rts_tail)
            m->rts_tail->next = x;
        else
            m->rts_head = x;
        m->rts_tail = x;
        m->n_rts++;
    } else {
        pthread_mutex_unlock(&m->mu);
    }
    return rc;
}

int mm_rts_arrived(xfer_engine *e, const char *node, uint64_t inc, const struct xfer_msg_rts *r)
{
    /* The data comes through our own connection to the sender. */
    size_t eager = r->eager ? r->len : 0; /* kept with the RTS until matched */
    struct mm_rts *x = rts_new(eager);
    if (!x)
        return -XFER_ENOMEM;
    x->next = NULL;
    x->from = NULL;
    /* (a compound literal copied it word by word, twice; a short RTS has
     * no region description to copy) */
    memcpy(&x->r, r, r->short_form ? XFER_MSG_RTS_SHORT_SIZE : sizeof(*r));
    if (r->eager) {
        memcpy(x + 1, r->eager, eager);
        x->r.eager = (const uint8_t *)(x + 1);
    }
    const xfer_peer *from = NULL;
    int rc = rts_queue(e, node, inc, x, &from);
    if (rc < 0) {
        if (rc == -XFER_ENOENT)
            xfer_warn("message from %s refused: not a known peer (add it to receive)", node);
        else if (r->local) /* its sender is not told (XFER_SEND_LOCAL) */
            xfer_debug("locally completed message from %s dropped: %s", node, xfer_strerror(rc));
        rts_free(x);
        return rc;
    }
    /* Match here what needs no post; the FIN of this RTS, if it matched
     * and landed, is the answer (x is not ours any more: by id). */
    struct fin_capture cap = {from, r->send_id, false};
    tl_fin = &cap;
    bool rest = match_pairs_locked(e, true); /* mu held by rts_queue */
    tl_fin = NULL;
    if (rest)
        msg_kick(e);
    return cap.hit ? XFER_MSG_DELIVERED : 0;
}

int mm_fin_arrived(xfer_engine *e, const char *node, const struct xfer_msg_fin *f)
{
    struct mm_send *s = take_send(&e->match, f->send_id, node);
    if (!s) { /* ended meanwhile (cancel, deadline) or never ours */
        xfer_debug("FIN from %s for unknown send %llu", node, (unsigned long long)f->send_id);
        return -XFER_ENOENT;
    }
    send_finished(s, node, f);
    return 0;
}

/* ---- matching and sweeping (message thread) ------------------------------------- */

static bool fits(const struct mm_recv *v, const struct mm_rts *x)
{
    return (!v->want || v->want == x->from) && (v->tag == XFER_MSG_TAG_ANY || v->tag == x->r.tag);
}

/* A pair that completes without a post (batch_recv_matched): the eager
 * bytes are copied into host memory, or nothing moves. */
static bool needs_no_post(const struct mm_recv *v, const struct mm_rts *x)
{
    return x->r.len == 0 || x->r.len > v->cap || (x->r.eager && v->host);
}

/* Takes the first (RTS, RECV) pair in arrival / posting order, unless
 * inline_only and it needs a post (then *stopped). mu held; the pair
 * counts in m->matching until match_done. */
static bool take_pair(struct msg_match *m, struct mm_rts **xo, struct mm_recv **vo,
                      bool inline_only, bool *stopped)
{
    struct mm_rts *xp = NULL;
    for (struct mm_rts *x = m->rts_head; x; xp = x, x = x->next) {
        struct mm_recv *vp = NULL;
        for (struct mm_recv *v = m->recv_head; v; vp = v, v = v->next) {
            if (!fits(v, x))
                continue;
            if (inline_only && !needs_no_post(v, x)) {
                *stopped = true;
                return false;
            }
            if (vp)
                vp->next = v->next;
            else
                m->recv_head = v->next;
            if (m->recv_tail == v)
                m->recv_tail = vp;
            if (xp)
                xp->next = x->next;
            else
                m->rts_head = x->next;
            if (m->rts_tail == x)
                m->rts_tail = xp;
            m->n_rts--;
            m->matching++;
            *xo = x;
            *vo = v;
            return true;
        }
    }
    return false;
}

/* A pair taken by take_pair is handed over (or x is back). mu held. */
static void match_done(struct msg_match *m)
{
    if (--m->matching == 0)
        pthread_cond_broadcast(&m->idle_cv);
}

/* Pairs RTS with RECVs until none fits; inline_only stops at the first
 * pair that needs a post and returns true then (the message thread must
 * go on). mu held on entry, let go on return; it is held from one pair's
 * match_done to the next take_pair (one lock per pair, not two: the
 * state between them is the same as under two locks, and whoever waits on
 * idle_cv or mu just runs after us). */
static bool match_pairs_locked(xfer_engine *e, bool inline_only)
{
    struct msg_match *m = &e->match;
    struct mm_rts *x;
    struct mm_recv *v;
    for (;;) {
        bool stopped = false;
        bool got = take_pair(m, &x, &v, inline_only, &stopped);
        pthread_mutex_unlock(&m->mu);
        if (!got)
            return stopped;
        int rc = batch_recv_matched(v->b, v->i, v->run, x->from, &x->r); /* drops v's hold */
        xfer_blk_put(&ent_cache, v);
        pthread_mutex_lock(&m->mu);
        if (rc == 0) {
            rts_free(x);
        } else { /* that RECV ended meanwhile: the message waits for the next one */
            x->next = m->rts_head;
            m->rts_head = x;
            if (!m->rts_tail)
                m->rts_tail = x;
            m->n_rts++;
        }
        match_done(m);
    }
}

void mm_match_run(xfer_engine *e)
{
    pthread_mutex_lock(&e->match.mu);
    match_pairs_locked(e, false);
}

static bool peer_dead(const xfer_peer *p, const xfer_peer *arg)
{
    (void)arg;
    return p && xfer_peer_transport(p) == 0; /* lock-free: fine under mu */
}

static bool peer_is(const xfer_peer *p, const xfer_peer *arg)
{
    return p == arg;
}

/* Entries whose peer is gone (per peer_gone) fail with -XFER_ECONN; RTS of
 * such peers are dropped (their FIN could not go back). */
static void sweep_where(xfer_engine *e, bool (*peer_gone)(const xfer_peer *, const xfer_peer *),
                        const xfer_peer *arg, const char *what)
{
    struct msg_match *m = &e->match;
    struct mm_recv *dead_v = NULL;
    struct mm_send *dead_s = NULL;
    struct mm_rts *dead_x = NULL;
    pthread_mutex_lock(&m->mu);
    /* Pairs being handed over may name the peer (p removed): let them end. */
    while (peer_gone == peer_is && m->matching)
        pthread_cond_wait(&m->idle_cv, &m->mu);
    if (peer_gone == peer_is && m->last_from == arg)
        m->last_from = NULL;
    struct mm_recv **vp = &m->recv_head, *vlast = NULL;
    while (*vp) {
        struct mm_recv *v = *vp;
        if (peer_gone(v->want, arg)) {
            *vp = v->next;
            v->next = dead_v;
            dead_v = v;
        } else {
            vlast = v;
            vp = &v->next;
        }
    }
    m->recv_tail = vlast;
    for (struct mm_send **sp = &m->sends; *sp;) {
        struct mm_send *s = *sp;
        if (peer_gone(s->to, arg)) {
            *sp = s->next;
            s->next = dead_s;
            dead_s = s;
        } else {
            sp = &s->next;
        }
    }
    struct mm_rts **xp = &m->rts_head, *xlast = NULL;
    while (*xp) {
        struct mm_rts *x = *xp;
        if (peer_gone(x->from, arg)) {
            *xp = x->next;
            x->next = dead_x;
            dead_x = x;
            m->n_rts--;
        } else {
            xlast = x;
            xp = &x->next;
        }
    }
    m->rts_tail = xlast;
    pthread_mutex_unlock(&m->mu);
    char why[160];
    for (struct mm_recv *v; (v = dead_v);) {
        dead_v = v->next;
        snprintf(why, sizeof(why), "%s %s while receiving", what, v->want->desc.node_id);
        xfer_batch_chunk_done(v->b, v->i, 0, -XFER_ECONN, why);
        xfer_batch_put(v->b);
        xfer_blk_put(&ent_cache, v);
    }
    for (struct mm_send *s; (s = dead_s);) {
        dead_s = s->next;
        snprintf(why, sizeof(why), "%s %s before it received the message", what,
                 s->to->desc.node_id);
        xfer_batch_chunk_done(s->b, s->i, 0, -XFER_ECONN, why);
        xfer_batch_put(s->b);
        xfer_blk_put(&ent_cache, s);
    }
    for (struct mm_rts *x; (x = dead_x);) {
        dead_x = x->next;
        rts_free(x);
    }
}

void mm_sweep(xfer_engine *e)
{
    sweep_where(e, peer_dead, NULL, "connection lost to");
}

void mm_peer_gone(xfer_engine *e, xfer_peer *p)
{
    sweep_where(e, peer_is, p, "removed peer");
}

void msg_match_destroy(xfer_engine *e)
{
    struct msg_match *m = &e->match;
    pthread_mutex_lock(&m->mu);
    struct mm_recv *v = m->recv_head;
    struct mm_send *s = m->sends;
    struct mm_rts *x = m->rts_head;
    m->recv_head = m->recv_tail = NULL;
    m->sends = NULL;
    m->rts_head = m->rts_tail = NULL;
    m->n_rts = 0;
    pthread_mutex_unlock(&m->mu);
    pthread_cond_destroy(&m->idle_cv);
    while (v) {
        struct mm_recv *n = v->next;
        xfer_batch_chunk_done(v->b, v->i, 0, -XFER_ECANCELED, "engine is shutting down");
        xfer_batch_put(v->b);
        xfer_blk_put(&ent_cache, v);
        v = n;
    }
    while (s) {
        struct mm_send *n = s->next;
        xfer_batch_chunk_done(s->b, s->i, 0, -XFER_ECANCELED, "engine is shutting down");
        xfer_batch_put(s->b);
        xfer_blk_put(&ent_cache, s);
        s = n;
    }
    while (x) {
        struct mm_rts *n = x->next;
        rts_free(x);
        x = n;
    }
    pthread_mutex_destroy(&m->mu);
}
