/* rdma: the data path. post() checks each item against the cached remote
 * region, splits it into chunks and queues them on the connection; the pump
 * stripes waiting chunks over the connected QPs that have send-queue room,
 * signalling every N-th WR and the last one posted. */
#include "rdma.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void xrdma_chunk_finish(struct xfer_rdma_chunk *ch, bool io_begun)
{
    if (ch->drain) /* a QP's drain WR (post_drain_locked): no chunk */
        return;
    if (ch->msg) { /* an engine message's SEND, not data */
        xrdma_msg_sent(ch);
        return;
    }
    if (io_begun)
        xfer_batch_io_end(ch->b, ch->item);
    if (ch->status < 0) /* a plain item: as chunk_done */
        xfer_batch_seg_fail(ch->b, ch->item, ch->seg, ch->status, ch->why);
    else
        xfer_batch_chunk_done(ch->b, ch->item, ch->len, 0, NULL);
    xfer_batch_put(ch->b);
}

static void drop_chunk(struct xfer_rdma_chunk *ch)
{
    xfer_batch_put(ch->b);
}

static void append_locked(struct rdma_conn *c, struct rdma_pending *p)
{
    p->next = NULL;
    if (c->tail)
        c->tail->next = p;
    else
        c->head = p;
    c->tail = p;
}

void xrdma_chunk_retry_or_fail(struct rdma_conn *c, struct xfer_rdma_chunk *ch)
{
    struct rdma_pending *p = NULL;
    if (ch->retries < RDMA_MAX_RETRIES && xfer_batch_item_live(ch->b, ch->item))
        p = malloc(sizeof(*p));
    if (!p) {
        xrdma_chunk_finish(ch, false);
        return;
    }
    p->c = *ch;
    p->c.retries++;
    p->c.status = 0;
    p->c.why = NULL;
    pthread_mutex_lock(&c->lock);
    if (c->closing) {
        pthread_mutex_unlock(&c->lock);
        xrdma_chunk_finish(&p->c, false);
        free(p);
        return;
    }
    if (p->c.win_refused) /* every QP's cached window for it may be revoked */
        xrdma_win_forget_locked(c, &p->c);
    append_locked(c, p);
    xrdma_pump_locked(c);
    pthread_mutex_unlock(&c->lock);
}

struct rdma_pending *xrdma_take_pending_locked(struct rdma_conn *c)
{
    struct rdma_pending *l = c->head, *parked = xrdma_win_take_locked(c);
    c->head = c->tail = NULL;
    while (parked) { /* chunks waiting for a lease window, too */
        struct rdma_pending *n = parked->next;
        parked->next = l;
        l = parked;
        parked = n;
    }
    return l;
}

void xrdma_fail_pending(struct rdma_pending *l, int rc, const char *why)
{
    while (l) {
        struct rdma_pending *n = l->next;
        if (xfer_batch_item_live(l->c.b, l->c.item)) {
            l->c.status = rc;
            l->c.why = why;
            xrdma_chunk_finish(&l->c, false);
        } else {
            drop_chunk(&l->c);
        }
        free(l);
        l = n;
    }
}

/* Posts one chunk on slot s (s->lock held, state READY, room checked). */
static int post_chunk(struct rdma_transport *t, struct rdma_slot *s, struct xfer_rdma_chunk *ch,
                      bool last)
{
    const struct rdma_region *lr = ch->lmr;
    struct ibv_sge sge = {
        .addr = ch->laddr, .length = (uint32_t)ch->len, .lkey = lr->mr[s->lnic]->lkey};
    struct ibv_send_wr wr = {.sg_list = &sge,
                             .num_sge = ch->len ? 1 : 0,
                             .opcode =
                                 ch->op == XFER_OP_WRITE ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ};
    bool full = s->ring.n + 1 >= s->depth;
    ch->signaled = xfer_rdma_should_signal(s->unsignaled, t->signal_every, last || full);
    if (ch->signaled)
        wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = ch->raddr;
    wr.wr.rdma.rkey = ch->win ? ch->wkey : ch->rkey[s->rnic];
    ch->seq = s->next_seq;
    wr.wr_id = xrdma_wr_id(s, ch->seq);
    struct ibv_send_wr *bad = NULL;
    int rc = ibv_post_send(s->id->qp, &wr, &bad);
    if (rc)
        return rc;
    s->next_seq++;
    s->unsignaled = ch->signaled ? 0 : s->unsignaled + 1;
    xfer_rdma_ring_push(&s->ring, ch); /* cannot fail: ring.cap == depth */
    return 0;
}

/* The pump works in two phases so that the last WR each QP gets in a round
 * is signaled: chunks are first assigned to QPs (round-robin from the
 * striping cursor, over READY QPs with room on a NIC the chunk may use),
 * then each QP's share is posted under its lock. */
struct share {
    struct rdma_pending *head, *tail;
    uint16_t uid; /* the QP's incarnation when the chunks were assigned */
};

static int pick_slot(struct rdma_conn *c, const uint32_t *room, uint32_t mask)
{
    for (int k = 0; k < c->n_slots; k++) {
        int i = (int)xfer_rdma_stripe_slot(c->rr, (size_t)k, (size_t)c->n_slots);
        if (room[i] && (mask & (1u << c->t->slots[c->slots[i]].lnic))) {
            c->rr = (uint32_t)(i + 1);
            return i;
        }
    }
    return -1;
}

static void assign_locked(struct rdma_conn *c, uint32_t *room, struct share *sh)
{
    bool parked = false;
    uint32_t all = (1u << c->t->n_nics) - 1;
    struct rdma_pending **pp = &c->head, *prev = NULL;
    while (*pp) {
        struct rdma_pending *p = *pp;
        bool live = xfer_batch_item_live(p->c.b, p->c.item);
        int i = live ? pick_slot(c, room, p->c.nic_mask) : -1;
        if (live && i < 0) { /* no room on its NICs now: keep it */
            if (p->c.nic_mask == all)
                break;
            prev = p;
            pp = &p->next;
            continue;
        }
        *pp = p->next;
        if (c->tail == p)
            c->tail = prev;
        p->next = NULL;
        if (!live) {
            drop_chunk(&p->c);
            free(p);
            continue;
        }
        if (p->c.win && !xrdma_win_lookup_locked(c, i, sh[i].uid, &p->c)) {
            xrdma_win_park_locked(c, i, sh[i].uid, p); /* no window of that QP yet */
            parked = true;
            continue;
        }
        room[i]--;
        if (sh[i].tail)
            sh[i].tail->next = p;
        else
            sh[i].head = p;
        sh[i].tail = p;
    }
    if (parked)
        xrdma_win_pump_locked(c);
}

/* A QP in error flushes only the WRs still outstanding: unsignaled WRs the
 * NIC already finished report nothing, so a ring ending in them would never
 * drain. A signaled WR posted behind them (flushed at once) completes them
 * in order, as the kernel's ib_drain_sq does; it is no chunk (drain). No
 * need when the last WR posted was signaled: its completion reports them. */
static void post_drain_locked(struct rdma_slot *s)
{
    if (s->unsignaled == 0 || s->ring.n >= s->depth)
        return; /* a full ring's last WR was signaled (post_chunk) */
    struct ibv_send_wr wr = {.wr_id = xrdma_wr_id(s, s->next_seq),
                             .opcode = IBV_WR_RDMA_WRITE,
                             .send_flags = IBV_SEND_SIGNALED},
                       *bad = NULL;
    int rc = ibv_post_send(s->id->qp, &wr, &bad);
    if (rc) {
        xfer_err("rdma: QP %u: cannot post the drain WR (%s): %u chunks wait for teardown",
                 s->index, strerror(rc), s->ring.n);
        return;
    }
    struct xfer_rdma_chunk ch = {.drain = true, .seq = s->next_seq++, .signaled = true};
    xfer_rdma_ring_push(&s->ring, &ch);
    s->unsignaled = 0;
}

/* A post failed, or a WR of s must not go on: the QP is moved to error,
 * which flushes every WR still outstanding with a completion (post_drain
 * reports the ones already done); the CM thread then re-establishes it.
 * s->lock held. */
bool xrdma_break_qp_locked(struct rdma_slot *s)
{
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
    s->state = SLOT_ERROR;
    ibv_modify_qp(s->id->qp, &a, IBV_QP_STATE);
    post_drain_locked(s);
    if (s->ring.n == 0) {
        s->state = SLOT_DEAD;
        return true; /* nothing will complete: the CM thread must look now */
    }
    return false;
}

/* Puts the list head..tail back at the head of c's queue (c->lock held). */
static void requeue_locked(struct rdma_conn *c, struct rdma_pending *head,
                           struct rdma_pending *tail)
{
    if (!head)
        return;
    tail->next = c->head;
    if (!c->head)
        c->tail = tail;
    c->head = head;
}

/* ibv_post_send refused a WR of s (s->lock held, READY): rc is what it
 * returned. A full send queue (ENOMEM) is waited out when the last WR
 * posted was signaled: its completion reports every WR before it and pumps
 * the queue again. Otherwise no completion would ever report the
 * unsignaled WRs already posted (or none would come at all), so the QP goes
 * to error, which flushes them, and is re-established. */
static void post_refused_locked(struct rdma_conn *c, struct rdma_slot *s, int rc, bool *kick)
{
    if (rc == ENOMEM && s->ring.n > 0 && s->unsignaled == 0) {
        xfer_debug("rdma: send queue of QP %u to %s full: chunks re-queued", s->index,
                   c->peer.node_id);
        return;
    }
    xfer_warn("rdma: ibv_post_send to %s failed (%s): QP re-established", c->peer.node_id,
              rc > 0 ? strerror(rc) : "no reason given");
    *kick = xrdma_break_qp_locked(s) || *kick;
}

/* Posts one QP's share. The live chunks are picked (io_begin) before
 * posting, so that the last WR actually posted is the signaled one. What is
 * not posted (the QP went to error meanwhile, its send queue is full, or
 * the post was refused) goes back to the head of the queue for the next
 * pump, on this QP or another: a chunk whose own post failed counts a try,
 * RDMA_MAX_RETRIES at most, as a flushed chunk does, then fails -XFER_EIO. */
static void post_share(struct rdma_conn *c, struct rdma_slot *s, struct share *sh)
{
    pthread_mutex_lock(&s->lock);
    if (s->state != SLOT_READY || s->uid != sh->uid) { /* went to error meanwhile */
        pthread_mutex_unlock(&s->lock);
        requeue_locked(c, sh->head, sh->tail);
        return;
    }
    struct rdma_pending *go = NULL, **tail = &go;
    for (struct rdma_pending *p = sh->head, *n; p; p = n) {
        n = p->next;
        if (xfer_batch_io_begin(p->c.b, p->c.item)) {
            *tail = p;
            tail = &p->next;
            p->next = NULL;
        } else { /* ended meanwhile (cancel, deadline, an error) */
            drop_chunk(&p->c);
            free(p);
        }
    }
    bool kick = false, stop = false;
    struct rdma_pending *back = NULL, *back_tail = NULL, *failed = NULL;
    for (struct rdma_pending *p = go, *n; p; p = n) {
        n = p->next;
        p->next = NULL;
        bool tried = !stop && s->state == SLOT_READY;
        int rc = tried ? post_chunk(c->t, s, &p->c, n == NULL) : 0;
        if (tried && rc == 0) {
            free(p);
            continue;
        }
        if (tried) { /* this chunk's own post failed: nothing behind it goes now */
            stop = true;
            post_refused_locked(c, s, rc, &kick);
            if (++p->c.retries > RDMA_MAX_RETRIES) {
                p->c.status = -XFER_EIO;
                p->c.why = "ibv_post_send refused the work request";
                p->next = failed;
                failed = p;
                continue;
            }
        }
        xfer_batch_io_end(p->c.b, p->c.item); /* not posted: the NIC never had it */
        if (back_tail)
            back_tail->next = p;
        else
            back = p;
        back_tail = p;
    }
    pthread_mutex_unlock(&s->lock);
    requeue_locked(c, back, back_tail);
    for (struct rdma_pending *p = failed, *n; p; p = n) {
        n = p->next;
        xrdma_chunk_finish(&p->c, true);
        free(p);
    }
    if (kick)
        xrdma_cm_kick(c->t);
}

void xrdma_pump_locked(struct rdma_conn *c)
{
    xrdma_msg_pump_locked(c); /* messages first: they are small and wait on a round trip */
    xrdma_win_pump_locked(c); /* window requests waiting for a credit */
    if (!c->head)
        return;
    struct rdma_transport *t = c->t;
    uint32_t room[XFER_RDMA_MAX_NICS * 16];
    struct share sh[XFER_RDMA_MAX_NICS * 16];
    bool any = false;
    for (int i = 0; i < c->n_slots; i++) {
        struct rdma_slot *s = &t->slots[c->slots[i]];
        pthread_mutex_lock(&s->lock);
        room[i] = s->state == SLOT_READY ? s->depth - s->ring.n : 0;
        sh[i].uid = s->uid;
        pthread_mutex_unlock(&s->lock);
        any |= room[i] > 0;
        sh[i].head = sh[i].tail = NULL;
    }
    if (!any)
        return;
    assign_locked(c, room, sh);
    for (int i = 0; i < c->n_slots; i++)
        if (sh[i].head)
            post_share(c, &t->slots[c->slots[i]], &sh[i]);
}

/* The per-item part of a plan, shared by the item's segments. */
struct plan_ctx {
    const struct xfer_region_desc *rd;
    const uint32_t *rkeys;
    const struct rdma_region *lr;
    bool win;
};

/* Queues the chunks of segment sg (or the plain item) it of item i. */
static int plan_seg(struct rdma_conn *c, xfer_batch *b, size_t i, size_t sg,
                    const struct xfer_item *it, const struct plan_ctx *x,
                    struct rdma_pending **list, const char **why)
{
    if (!xfer_range_ok(it->remote_off, it->len, x->rd->len))
        return *why = "range outside the remote region", -XFER_ERANGE;
    uint8_t *lbase = (uint8_t *)xfer_region_ptr(it->local) + it->local_off;
    size_t n = xfer_rdma_chunk_count(it->len, c->t->chunk);
    for (size_t k = 0; k < n; k++) {
        struct rdma_pending *p = calloc(1, sizeof(*p));
        if (!p)
            return *why = "out of memory", -XFER_ENOMEM;
        uint64_t off, len;
        xfer_rdma_chunk_at(it->len, c->t->chunk, k, &off, &len);
        p->c = (struct xfer_rdma_chunk){.b = b,
                                        .item = i,
                                        .seg = (uint32_t)sg,
                                        .op = it->op,
                                        .laddr = (uintptr_t)(lbase + off),
                                        .raddr = x->rd->addr + it->remote_off + off,
                                        .len = len,
                                        .lmr = x->lr,
                                        .nic_mask = x->lr->near_mask,
                                        .win = x->win,
                                        .rid = it->remote_id,
                                        .rgen = it->remote_gen,
                                        .rbase = x->rd->addr};
        memcpy(p->c.rkey, x->rkeys, sizeof(p->c.rkey));
        p->next = *list;
        *list = p;
    }
    return 0;
}

/* Checks item i against what this node knows of the remote region and
 * queues its chunks (those of each segment of a vectored item) on list; 0
 * or the item's error (reported by caller; *bad = the failing segment). */
static int plan_item(struct rdma_conn *c, xfer_batch *b, size_t i, struct rdma_pending **list,
                     const char **why, size_t *bad)
{
    const struct xfer_item *it = xfer_batch_item(b, i);
    struct xfer_region_desc rd;
    if (xfer_peer_region_get(c->base.peer, it->remote_id, &rd) < 0)
        return *why = "remote region unknown to this node", -XFER_ENOENT;
    if (rd.gen != it->remote_gen)
        return *why = "remote region was registered again (stale generation)", -XFER_ESTALE;
    unsigned need = it->op == XFER_OP_READ ? XFER_ACCESS_R : XFER_ACCESS_W;
    if (!(rd.access & need))
        return *why = it->op == XFER_OP_READ ? "remote region is not readable"
                                             : "remote region is not writable",
               -XFER_EACCES;
    uint32_t rkeys[XFER_RDMA_MAX_NICS] = {0};
    bool win = xfer_rdma_rkeys_windowed(rd.rkeys); /* leases: a window per QP (rdma_win.c) */
    int nk = win ? c->n_rnics : xfer_rdma_rkeys_parse(rd.rkeys, rkeys, XFER_RDMA_MAX_NICS);
    if (nk == 0)
        return *why = "remote region is not registered for RDMA (GPU memory without "
                      "GPUDirect RDMA on the peer?)",
               -XFER_ENOTSUP;
    if (nk < c->n_rnics)
        return *why = "remote region has no rkey for every NIC of the peer", -XFER_EPROTO;
    const struct rdma_region *lr = xfer_region_transport_data(it->local, XFER_TRANSPORT_RDMA);
    if (!lr)
        return *why = "local region is not registered for RDMA (GPU memory without "
                      "GPUDirect RDMA here?)",
               -XFER_ENOTSUP;
    struct plan_ctx x = {&rd, rkeys, lr, win};
    size_t nseg;
    xfer_batch_item_segs(b, i, &nseg);
    for (size_t sg = 0; sg < nseg; sg++) {
        struct xfer_item seg;
        xfer_batch_item_seg(b, i, sg, &seg);
        *bad = sg;
        int rc = plan_seg(c, b, i, sg, &seg, &x, list, why);
        if (rc < 0)
            return rc;
    }
    return 0;
}

int xrdma_post(struct xfer_conn *xc, xfer_batch *b, const size_t *idx, size_t n)
{
    struct rdma_conn *c = container_of(xc, struct rdma_conn, base);
    for (size_t k = 0; k < n; k++) {
        struct rdma_pending *list = NULL, *rev = NULL;
        const char *why = NULL;
        size_t bad = SIZE_MAX; /* no segment to blame */
        int rc = plan_item(c, b, idx[k], &list, &why, &bad);
        while (list) { /* back into chunk order */
            struct rdma_pending *p = list;
            list = p->next;
            p->next = rev;
            rev = p;
        }
        if (rc < 0) {
            for (struct rdma_pending *p = rev, *nx; p; p = nx) {
                nx = p->next;
                free(p);
            }
            xfer_batch_seg_fail(b, idx[k], bad, rc, why);
            continue;
        }
        pthread_mutex_lock(&c->lock);
        if (c->closing) {
            pthread_mutex_unlock(&c->lock);
            for (struct rdma_pending *p = rev, *nx; p; p = nx) {
                nx = p->next;
                free(p);
            }
            xfer_batch_chunk_done(b, idx[k], 0, -XFER_ECONN, "rdma connection closing");
            continue;
        }
        for (struct rdma_pending *p = rev, *nx; p; p = nx) {
            nx = p->next;
            xfer_batch_hold(b);
            append_locked(c, p);
        }
        pthread_mutex_unlock(&c->lock);
    }
    pthread_mutex_lock(&c->lock);
    xrdma_pump_locked(c);
    bool none = c->head != NULL;
    pthread_mutex_unlock(&c->lock);
    if (none)
        xrdma_cm_kick(c->t); /* chunks wait: make sure a reconnect is under way */
    return 0;
}
