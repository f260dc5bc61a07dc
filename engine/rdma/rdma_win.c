/*
 * rdma: leases, initiator side (docs/rdma.md "Leases"). A remote region
 * registered with XFER_ACCESS_LEASED publishes no rkey ("mw"): its owner
 * binds a type-2 memory window per QP over what the lease rules grant this
 * node (rdma_lease.c), and only that QP may use the window's key.
 *
 * The pump assigns a chunk of such a region to a QP as usual; if this QP's
 * cache holds a window covering the chunk, the chunk is posted with its key,
 * else it is parked and a window request for the whole item's range goes on
 * that QP (T_WIN, rdma_msg.c). The answer caches the window (valid while the
 * QP keeps its incarnation) and sends the parked chunks back to the queue,
 * or fails them with the owner's refusal (-XFER_ESTALE: no live lease).
 * "Busy" (-XFER_EBUSY: the owner could not post the bind now, e.g. while
 * that QP is re-established) is no refusal: the chunks ask again within
 * io_timeout_ms, then fail with -XFER_ETIMEDOUT. A
 * window the owner invalidated since (lease ended, blocks released) makes
 * the NIC refuse the chunk (remote access error, the QP re-established):
 * the chunk asks for a window again once; refused again, it fails with
 * -XFER_ESTALE (rdma_progress.c).
 *
 * Everything here runs under the connection's lock.
 */
#include "rdma.h"

#include <stdlib.h>
#include <string.h>

#define WIN_CACHE_MAX 4096 /* windows cached per QP; past it the cache starts over */

static struct rdma_win_cache *cache_of(struct rdma_conn *c, int pos, uint16_t uid)
{
    struct rdma_win_cache *wc = &c->wcache[pos];
    if (wc->uid != uid) { /* another incarnation of the QP: its windows died with it */
        wc->uid = uid;
        wc->n = 0;
    }
    return wc;
}

bool xrdma_win_lookup_locked(struct rdma_conn *c, int pos, uint16_t uid, struct xfer_rdma_chunk *ch)
{
    struct rdma_win_cache *wc = cache_of(c, pos, uid);
    for (uint32_t i = wc->n; i-- > 0;) {
        const struct rdma_win_entry *e = &wc->v[i];
        if (e->rid == ch->rid && e->rgen == ch->rgen && e->start <= ch->raddr &&
            ch->raddr + ch->len <= e->end) {
            ch->wkey = e->key;
            return true;
        }
    }
    return false;
}

void xrdma_win_park_locked(struct rdma_conn *c, int pos, uint16_t uid, struct rdma_pending *p)
{
    const struct xfer_rdma_chunk *ch = &p->c;
    struct rdma_want *w = c->wants;
    /* A request not sent yet may take this chunk along; one already sent
     * may have been answered by rules older than this chunk's batch (a
     * refusal from before a grant would fail it): this chunk asks anew. */
    for (; w; w = w->next)
        if (!w->sent && w->pos == pos && w->uid == uid && w->rid == ch->rid &&
            w->rgen == ch->rgen && w->addr <= ch->raddr && ch->raddr + ch->len <= w->addr + w->len)
            break;
    if (!w && (w = calloc(1, sizeof(*w))) != NULL) {
        /* Ask for the whole item: its other chunks need the same window.
         * A vectored item's segments lie apart (a window over their span
         * would cover blocks not leased): the chunk's own range then. */
        const struct xfer_item *it = xfer_batch_item(ch->b, ch->item);
        size_t nseg;
        bool vec = xfer_batch_item_segs(ch->b, ch->item, &nseg) != NULL;
        *w = (struct rdma_want){.next = c->wants,
                                .id = ++c->next_want,
                                .pos = pos,
                                .uid = uid,
                                .rid = ch->rid,
                                .rgen = ch->rgen,
                                .rbase = ch->rbase,
                                .addr = vec ? ch->raddr : ch->rbase + it->remote_off,
                                .len = vec ? ch->len : it->len,
                                .op = ch->op};
        c->wants = w;
    }
    p->want = w ? w->id : 0; /* 0 (out of memory): back to the queue at the next answer */
    p->next = c->wwait;
    c->wwait = p;
}

/* Moves the chunks parked on want id (all if id is 0) to out. */
static struct rdma_pending *unpark(struct rdma_conn *c, uint64_t id)
{
    struct rdma_pending *out = NULL, **pp = &c->wwait;
    while (*pp) {
        struct rdma_pending *p = *pp;
        if (id && p->want && p->want != id) {
            pp = &p->next;
            continue;
        }
        *pp = p->next;
        p->next = out;
        out = p;
    }
    return out;
}

/* Puts chunks back at the head of the queue, for the pump. */
static void requeue(struct rdma_conn *c, struct rdma_pending *l)
{
    while (l) {
        struct rdma_pending *n = l->next;
        l->want = 0;
        l->next = c->head;
        c->head = l;
        if (!c->tail)
            c->tail = l;
        l = n;
    }
}

static void want_free(struct rdma_conn *c, struct rdma_want *w)
{
    for (struct rdma_want **pp = &c->wants; *pp; pp = &(*pp)->next)
        if (*pp == w) {
            *pp = w->next;
            break;
        }
    free(w);
}

/* The owner could not bind a window now (-XFER_EBUSY: its QP's window
 * operations at their limit, or the QP being re-established): the chunks
 * ask again (on the QP the pump gives them, the re-established one if that
 * is the one), each within io_timeout_ms of its first such answer. Returns
 * those past it. */
static struct rdma_pending *requeue_busy(struct rdma_conn *c, struct rdma_pending *l)
{
    int64_t now = xfer_now_ms();
    struct rdma_pending *again = NULL, *late = NULL;
    while (l) {
        struct rdma_pending *n = l->next;
        if (!l->c.win_busy_until)
            l->c.win_busy_until = now + c->t->cfg->io_timeout_ms;
        struct rdma_pending **to = now < l->c.win_busy_until ? &again : &late;
        l->next = *to;
        *to = l;
        l = n;
    }
    requeue(c, again);
    return late;
}

void xrdma_win_pump_locked(struct rdma_conn *c)
{
    struct rdma_transport *t = c->t;
    for (struct rdma_want *w = c->wants, *n; w; w = n) {
        n = w->next;
        if (w->sent || w->pos >= c->n_slots)
            continue;
        struct rdma_slot *s = &t->slots[c->slots[w->pos]];
        pthread_mutex_lock(&s->lock);
        bool gone = s->uid != w->uid || s->state == SLOT_FAILED || s->state == SLOT_FREE;
        int rc = 0;
        if (!gone && s->state == SLOT_READY && s->id) {
            rc = xrdma_msg_send_win_locked(c, s, w);
            w->sent = rc == 1;
        }
        bool kick = rc < 0 && xrdma_break_qp_locked(s);
        pthread_mutex_unlock(&s->lock);
        if (kick)
            xrdma_cm_kick(t);
        if (gone) { /* that QP is no more: its chunks pick another */
            requeue(c, unpark(c, w->id));
            want_free(c, w);
        }
    }
}

struct rdma_pending *xrdma_win_answer_locked(struct rdma_conn *c, struct rdma_want *w, int status,
                                             const uint8_t *p, size_t n)
{
    struct rdma_pending *parked = unpark(c, w->id);
    if (status == 0 && n == RDMA_WIN_RESP_LEN) {
        struct rdma_win_cache *wc = cache_of(c, w->pos, w->uid);
        if (wc->n == WIN_CACHE_MAX)
            wc->n = 0; /* asked again when used */
        if (wc->n == wc->cap) {
            uint32_t cap = wc->cap ? wc->cap * 2 : 16;
            struct rdma_win_entry *v = realloc(wc->v, cap * sizeof(*v));
            if (v) {
                wc->v = v;
                wc->cap = cap;
            }
        }
        if (wc->n < wc->cap) {
            uint32_t key =
                (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
            uint64_t off = xfer_rdma_get64(p + 4), len = xfer_rdma_get64(p + 12);
            wc->v[wc->n++] = (struct rdma_win_entry){.rid = w->rid,
                                                     .rgen = w->rgen,
                                                     .key = key,
                                                     .start = w->rbase + off,
                                                     .end = w->rbase + off + len};
        }
        requeue(c, parked);
        parked = NULL;
    } else if (status == -XFER_EBUSY) {
        parked = requeue_busy(c, parked);
    }
    want_free(c, w);
    return parked; /* refused (or busy for too long): the caller fails them */
}

void xrdma_win_slot_down_locked(struct rdma_conn *c, int pos, uint16_t uid)
{
    if (pos < 0 || pos >= XFER_RDMA_MAX_NICS * 16)
        return;
    if (c->wcache[pos].uid == uid)
        c->wcache[pos].n = 0;
    for (struct rdma_want *w = c->wants, *n; w; w = n) {
        n = w->next;
        if (w->pos == pos && w->uid == uid) {
            requeue(c, unpark(c, w->id));
            want_free(c, w);
        }
    }
}

void xrdma_win_forget_locked(struct rdma_conn *c, const struct xfer_rdma_chunk *ch)
{
    for (int pos = 0; pos < XFER_RDMA_MAX_NICS * 16; pos++) {
        struct rdma_win_cache *wc = &c->wcache[pos];
        uint32_t k = 0;
        for (uint32_t i = 0; i < wc->n; i++) {
            const struct rdma_win_entry *e = &wc->v[i];
            if (!(e->rid == ch->rid && e->rgen == ch->rgen && e->start < ch->raddr + ch->len &&
                  ch->raddr < e->end))
                wc->v[k++] = *e;
        }
        wc->n = k;
    }
}

struct rdma_pending *xrdma_win_take_locked(struct rdma_conn *c)
{
    for (int e = 0; e < RDMA_MSG_CREDITS; e++)
        c->out[e].want = NULL; /* no answer is handled after teardown */
    while (c->wants)
        want_free(c, c->wants);
    return unpark(c, 0);
}

void xrdma_win_conn_free(struct rdma_conn *c)
{
    for (int i = 0; i < XFER_RDMA_MAX_NICS * 16; i++) {
        free(c->wcache[i].v);
        c->wcache[i] = (struct rdma_win_cache){0};
    }
}
