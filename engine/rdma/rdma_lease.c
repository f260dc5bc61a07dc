/*
 * rdma: leases, owner side (docs/rdma.md "Leases"). rdma READ/WRITE never
 * reach the owner's CPU, so the lease rules (engine/lease.c) are enforced by
 * the NIC through type-2 memory windows:
 *
 * - A region registered with XFER_ACCESS_LEASED gets MRs with
 *   IBV_ACCESS_MW_BIND and no remote access, and publishes no rkey ("mw"):
 *   the NIC refuses every remote access through the MR itself.
 * - A peer that wants to reach [off, off+len) sends a window request on the
 *   QP it will use (rdma_win.c). The owner checks the rules for the node id
 *   that QP proved in its HELLO, binds a window over what they grant (the
 *   whole region when nothing else is guarded, else the access widened over
 *   the peer's live rules) on that accepted QP (IBV_WR_BIND_MW: only that QP
 *   may use the key), and answers with the key after the bind in the same
 *   send queue. A bind that cannot be posted now (the QP's window operations
 *   at their limit, its send queue refusing it, the QP being re-established)
 *   is answered -XFER_EBUSY: not a refusal by the rules, the peer asks again
 *   (on the re-established QP) within its io timeout. A bind that fails on
 *   the NIC puts the QP in error, which flushes the answer behind it: the
 *   peer asks again on the new QP.
 * - When rules change or a lease ends (leases_changed, from lease.c), every
 *   window the rules no longer admit is invalidated (IBV_WR_LOCAL_INV on its
 *   QP), and the call returns once those completions arrived: from then on
 *   the NIC answers the peer's READ/WRITE with a remote access error. The
 *   NIC knows no time: the CM thread re-checks windows at the earliest
 *   deadline they rely on (xrdma_lease_expire).
 *
 * Windows live in a table (index, generation) so that completions of a QP
 * already destroyed are recognised. Lock order: acc_lock, win_lock, then the
 * engine's region table (xfer_region_lease_*).
 */
#include "rdma.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { OP_BIND = 1, OP_INV = 2 };

/* wr_id of a window operation: kind 0 | op(2) at 60 | index(28) at 32 | gen(16) at 16. */
static uint64_t win_wr_id(int op, const struct rdma_window *w)
{
    return (uint64_t)op << 60 | (uint64_t)(w->index & 0xfffffff) << 32 | (uint64_t)w->gen << 16;
}

void xrdma_lease_init(struct rdma_transport *t)
{
    pthread_mutex_init(&t->win_lock, NULL);
    xfer_cond_init_mono(&t->win_cond);
    t->win_next = INT64_MAX;
}

void xrdma_lease_fini(struct rdma_transport *t)
{
    for (uint32_t i = 0; i < t->win_cap; i++)
        if (t->wins[i]) {
            ibv_dealloc_mw(t->wins[i]->mw);
            free(t->wins[i]);
        }
    free(t->wins);
    free(t->win_gen);
    pthread_cond_destroy(&t->win_cond);
    pthread_mutex_destroy(&t->win_lock);
}

int xrdma_lease_check(struct xfer_transport *tr, xfer_region *r)
{
    const struct rdma_region *rr = xfer_region_transport_data(r, XFER_TRANSPORT_RDMA);
    if (!rr || rr->windowed)
        return 0;
    struct xfer_region_desc d;
    xfer_region_describe(r, &d);
    xfer_engine_set_error(tr->engine,
                          "region %s: leases need it registered with XFER_ACCESS_LEASED: its rdma "
                          "rkey is published and rdma peers would bypass them",
                          d.name);
    return -XFER_ENOTSUP;
}

/* ---- the window table (win_lock held) ----------------------------------- */

static int win_insert(struct rdma_transport *t, struct rdma_window *w)
{
    uint32_t i = t->win_hint;
    for (uint32_t k = 0; k < t->win_cap && t->wins[i % t->win_cap]; k++)
        i++;
    if (!t->win_cap || t->wins[i % t->win_cap]) {
        uint32_t cap = t->win_cap ? t->win_cap * 2 : 64;
        struct rdma_window **v = cap <= (1u << 28) ? realloc(t->wins, cap * sizeof(*v)) : NULL;
        uint16_t *g = v ? realloc(t->win_gen, cap * sizeof(*g)) : NULL;
        if (v)
            t->wins = v;
        if (!g)
            return -XFER_ENOMEM;
        t->win_gen = g;
        memset(v + t->win_cap, 0, (cap - t->win_cap) * sizeof(*v));
        memset(g + t->win_cap, 0, (cap - t->win_cap) * sizeof(*g));
        i = t->win_cap;
        t->win_cap = cap;
    }
    i %= t->win_cap;
    w->index = i;
    w->gen = ++t->win_gen[i];
    t->wins[i] = w;
    t->win_hint = i + 1;
    return 0;
}

/* Forgets w and frees its window (the NIC no longer uses it: invalidated,
 * or its QP destroyed). */
static void win_remove(struct rdma_transport *t, struct rdma_window *w)
{
    if (w->a)
        w->a->win_inflight -= w->inflight; /* their completions are ignored now */
    t->wins[w->index] = NULL;
    t->win_hint = w->index;
    ibv_dealloc_mw(w->mw);
    free(w);
    pthread_cond_broadcast(&t->win_cond);
}

static struct rdma_window *win_at(struct rdma_transport *t, uint32_t index, uint16_t gen)
{
    struct rdma_window *w = index < t->win_cap ? t->wins[index] : NULL;
    return w && w->gen == gen ? w : NULL;
}

/* ---- binding (progress thread 0) ------------------------------------------ */

/* A window of a over r already covering [off, off+len) and not revoked. */
static struct rdma_window *win_find(struct rdma_transport *t, const struct rdma_accepted *a,
                                    const xfer_region *r, uint64_t off, uint64_t len)
{
    for (uint32_t i = 0; i < t->win_cap; i++) {
        struct rdma_window *w = t->wins[i];
        if (w && w->a == a && w->r == r && !w->round && w->off <= off &&
            off + len <= w->off + w->len)
            return w;
    }
    return NULL;
}

static int win_bind(struct rdma_transport *t, struct rdma_accepted *a, xfer_region *r,
                    const struct rdma_region *rr, uint64_t off, uint64_t len, int64_t until,
                    uint32_t *key)
{
    struct ibv_mr *mr = rr->mr[a->lnic];
    if (a->win_closed || a->win_inflight >= RDMA_WIN_INFLIGHT)
        return -XFER_EBUSY;
    struct rdma_window *w = calloc(1, sizeof(*w));
    if (!w)
        return -XFER_ENOMEM;
    w->mw = ibv_alloc_mw(mr->pd, IBV_MW_TYPE_2);
    if (!w->mw || win_insert(t, w)) {
        xfer_warn("rdma: no memory window for %s (%s)", a->peer, strerror(errno));
        if (w->mw)
            ibv_dealloc_mw(w->mw);
        free(w);
        return -XFER_ENOMEM;
    }
    w->a = a;
    w->r = r;
    w->rr = rr;
    w->off = off;
    w->len = len;
    w->until = until;
    w->key = ibv_inc_rkey(w->mw->rkey);
    unsigned acc = rr->remote_access;
    struct ibv_send_wr wr = {.wr_id = win_wr_id(OP_BIND, w),
                             .opcode = IBV_WR_BIND_MW,
                             .send_flags = IBV_SEND_SIGNALED},
                       *bad;
    wr.bind_mw.mw = w->mw;
    wr.bind_mw.rkey = w->key;
    wr.bind_mw.bind_info = (struct ibv_mw_bind_info){.mr = mr,
                                                     .addr = (uintptr_t)xfer_region_ptr(r) + off,
                                                     .length = len,
                                                     .mw_access_flags = acc};
    int prc = ibv_post_send(a->id->qp, &wr, &bad);
    if (prc) { /* the QP cannot take it now (full, or being re-established) */
        xfer_info("rdma: binding a memory window for %s not posted (%s): the peer asks again",
                  a->peer, strerror(prc));
        win_remove(t, w);
        return -XFER_EBUSY;
    }
    a->win_inflight++;
    w->inflight++;
    if (until < t->win_next)
        t->win_next = until;
    *key = w->key;
    return 0;
}

int xrdma_lease_serve(struct rdma_transport *t, struct rdma_accepted *a, const uint8_t *p, size_t n,
                      uint8_t *out, size_t *out_len)
{
    if (n != RDMA_WIN_REQ_LEN)
        return -XFER_EPROTO;
    uint32_t id = (uint32_t)xfer_rdma_get64(p) & 0xffffffffu,
             gen = (uint32_t)(xfer_rdma_get64(p) >> 32);
    uint64_t off = xfer_rdma_get64(p + 8), len = xfer_rdma_get64(p + 16);
    enum xfer_op op = (enum xfer_op)p[24];
    int rc;
    xfer_region *r = xfer_region_acquire_by(t->base.engine, a->peer, id, gen, op, off, len, &rc);
    if (!r)
        return rc; /* refused by the rules as over tcp (-XFER_ESTALE), or unknown */
    const struct rdma_region *rr = xfer_region_transport_data(r, XFER_TRANSPORT_RDMA);
    uint64_t woff = 0, wlen = 0;
    int64_t until = INT64_MAX;
    uint32_t key = 0;
    rc = rr && rr->windowed ? 0 : -XFER_EPROTO;
    pthread_mutex_lock(&t->win_lock);
    struct rdma_window *w = rc ? NULL : win_find(t, a, r, off, len);
    if (w) {
        key = w->key, woff = w->off, wlen = w->len;
    } else if (!rc &&
               !(rc = xfer_region_lease_window(r, a->peer, off, len, &woff, &wlen, &until))) {
        rc = win_bind(t, a, r, rr, woff, wlen, until, &key);
    }
    pthread_mutex_unlock(&t->win_lock);
    xfer_region_release(r); /* windows go before r's MRs do (xrdma_lease_region_gone) */
    if (rc)
        return rc;
    xfer_rdma_put64(out + 4, woff); /* key (4 bytes), window offset and length (8 each) */
    xfer_rdma_put64(out + 12, wlen);
    for (int i = 0; i < 4; i++)
        out[i] = (uint8_t)(key >> (8 * i));
    *out_len = RDMA_WIN_RESP_LEN;
    xfer_debug("rdma: window %x for %s over %llu+%llu of region %u", key, a->peer,
               (unsigned long long)woff, (unsigned long long)wlen, id);
    return 0;
}

void xrdma_lease_cqe(struct rdma_transport *t, const struct ibv_wc *wc)
{
    int op = (int)(wc->wr_id >> 60) & 3;
    uint32_t index = (uint32_t)(wc->wr_id >> 32) & 0xfffffff;
    uint16_t gen = (uint16_t)(wc->wr_id >> 16);
    pthread_mutex_lock(&t->win_lock);
    struct rdma_window *w = win_at(t, index, gen);
    if (w) {
        w->a->win_inflight--;
        w->inflight--;
        pthread_cond_broadcast(&t->win_cond);
        if (op == OP_INV || wc->status != IBV_WC_SUCCESS) {
            /* Invalidated, or the QP failed (it serves nothing in error and
             * is re-established as a new QP without windows). */
            if (op == OP_BIND && wc->status != IBV_WC_WR_FLUSH_ERR)
                xfer_warn("rdma: memory window bind for %s failed: %s", w->a->peer,
                          ibv_wc_status_str(wc->status));
            win_remove(t, w);
        }
    }
    pthread_mutex_unlock(&t->win_lock);
}

/* ---- revocation ----------------------------------------------------------- */

/* Posts the invalidation of w (win_lock held; waits for send-queue room). */
static void win_invalidate(struct rdma_transport *t, struct rdma_window *w, uint64_t round,
                           const struct timespec *until)
{
    struct rdma_accepted *a = w->a;
    uint16_t gen = w->gen;
    uint32_t index = w->index;
    w->round = round;
    /* While w is in the table, a is alive (its windows go before it). */
    while (win_at(t, index, gen) && !a->win_closed && a->win_inflight >= RDMA_WIN_INFLIGHT &&
           pthread_cond_timedwait(&t->win_cond, &t->win_lock, until) == 0)
        ;
    if (!win_at(t, index, gen) || a->win_closed)
        return; /* the QP is being destroyed: its windows go with it */
    struct ibv_send_wr wr = {.wr_id = win_wr_id(OP_INV, w),
                             .opcode = IBV_WR_LOCAL_INV,
                             .send_flags = IBV_SEND_SIGNALED},
                       *bad;
    wr.invalidate_rkey = w->key;
    int prc = ibv_post_send(a->id->qp, &wr, &bad);
    if (prc) {
        xfer_err("rdma: invalidating the window of %s failed (%s): breaking its QP", a->peer,
                 strerror(prc));
        struct ibv_qp_attr qa = {.qp_state = IBV_QPS_ERR};
        ibv_modify_qp(a->id->qp, &qa, IBV_QP_STATE); /* a QP in error serves nothing */
        w->round = 0;
        return;
    }
    a->win_inflight++;
    w->inflight++;
}

/* Windows being invalidated by this round or an earlier one (another
 * thread's revocation may have posted one this round also revokes). */
static bool round_pending(const struct rdma_transport *t, uint64_t round)
{
    for (uint32_t i = 0; i < t->win_cap; i++)
        if (t->wins[i] && t->wins[i]->round && t->wins[i]->round <= round)
            return true;
    return false;
}

/* Invalidates the windows of rr (all of them), or those the rules no
 * longer admit (rr NULL), and waits until the NIC confirmed it. */
static void revoke(struct rdma_transport *t, const struct rdma_region *rr)
{
    const struct xfer_engine_config *cfg = t->cfg;
    struct timespec until = xfer_mono_after_ms(1000 + cfg->io_timeout_ms);
    pthread_mutex_lock(&t->win_lock);
    uint64_t round = ++t->win_round;
    int64_t next = INT64_MAX;
    for (uint32_t i = 0; i < t->win_cap; i++) {
        struct rdma_window *w = t->wins[i];
        if (!w || w->round)
            continue;
        bool go = rr ? w->rr == rr
                     : xfer_region_lease_admits(w->r, w->a->peer, w->off, w->len, &w->until) != 0;
        if (go)
            win_invalidate(t, w, round, &until);
        else if (w->until < next)
            next = w->until;
    }
    if (!rr)
        t->win_next = next;
    while (round_pending(t, round))
        if (pthread_cond_timedwait(&t->win_cond, &t->win_lock, &until) == ETIMEDOUT) {
            xfer_err("rdma: memory window invalidations not confirmed within %d ms",
                     1000 + cfg->io_timeout_ms);
            break;
        }
    pthread_mutex_unlock(&t->win_lock);
}

void xrdma_leases_changed(struct xfer_transport *tr)
{
    revoke(xrdma_of(tr), NULL);
}

void xrdma_lease_region_gone(struct rdma_transport *t, const struct rdma_region *rr)
{
    if (!rr->windowed)
        return;
    revoke(t, rr);
    /* Invalidations not confirmed in time: the windows go anyway (a
     * deallocated window is invalid), before the MRs and the region do. */
    pthread_mutex_lock(&t->win_lock);
    for (uint32_t i = 0; i < t->win_cap; i++)
        if (t->wins[i] && t->wins[i]->rr == rr)
            win_remove(t, t->wins[i]);
    pthread_mutex_unlock(&t->win_lock);
}

int xrdma_lease_expire(struct rdma_transport *t, int max_ms)
{
    pthread_mutex_lock(&t->win_lock);
    int64_t next = t->win_next;
    pthread_mutex_unlock(&t->win_lock);
    int64_t now = xfer_now_ms();
    if (next <= now) {
        revoke(t, NULL);
        pthread_mutex_lock(&t->win_lock);
        next = t->win_next;
        pthread_mutex_unlock(&t->win_lock);
    }
    return next - now < max_ms ? (int)(next > now ? next - now : 1) : max_ms;
}

void xrdma_lease_accepted_closing(struct rdma_transport *t, struct rdma_accepted *a)
{
    pthread_mutex_lock(&t->win_lock);
    a->win_closed = true;
    pthread_mutex_unlock(&t->win_lock);
}

void xrdma_lease_accepted_gone(struct rdma_transport *t, struct rdma_accepted *a)
{
    pthread_mutex_lock(&t->win_lock);
    for (uint32_t i = 0; i < t->win_cap; i++)
        if (t->wins[i] && t->wins[i]->a == a)
            win_remove(t, t->wins[i]); /* a type-2 window dies with its QP */
    pthread_mutex_unlock(&t->win_lock);
}
