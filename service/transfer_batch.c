/*
 * Many named transfers as one engine batch: the items this node carries out
 * against remote peers are resolved and checked one by one, then posted
 * together and waited for once. Items that must be forwarded, repeated
 * (probe), or retried after a stale descriptor or a connection failure take
 * the one-at-a-time path of transfer.c afterwards.
 *
 * With a notification (xferctl batch --notify) every line must be carried
 * out here against a remote node, all or none: the engine batch then holds
 * the lines in their order (a notification's failed item indices are line
 * numbers), each remote node gets one notification after its lines landed,
 * and nothing is retried (the notification already named the failures).
 */
#include "notify_tag.h"
#include "xfer_io.h"
#include "transfer_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct prepared {
    struct side src, dst;
    enum xfer_op op;
    uint64_t len; /* bytes */
    bool posted, single;
};

static void result(Xctl__ItemResult *res, struct arena *a, int rc, const char *why,
                   const char *exec, uint64_t bytes, uint64_t us)
{
    res->status = rc;
    res->message = arena_strdup(a, rc ? why : "");
    res->executor = arena_strdup(a, exec);
    res->bytes = rc ? 0 : bytes;
    res->elapsed_us = us;
}

/* Resolves item t; 1: add it to the engine batch, 0: finished here (local
 * copy or error, res filled), 2: leave it to the one-at-a-time path. */
static int prepare(struct xferd *d, const Xctl__Transfer *t, bool notified, struct prepared *p,
                   Xctl__ItemResult *res, struct arena *a)
{
    struct xctx x = {.d = d};
    const char *exec, *me = d->cfg.node;
    uint64_t t0 = now_us();
    int rc = transfer_plan(&x, t, &p->src, &p->dst, &p->op, &exec);
    if (!rc && notified && strcmp(exec, me))
        rc = why_set(&x, -XFER_EINVAL,
                     "a notified batch runs on one xferd: this line is carried out by %s", exec);
    else if (!rc && notified && t->repeat > 1)
        rc = why_set(&x, -XFER_EINVAL, "a notified batch does not repeat lines");
    if (!rc && (strcmp(exec, me) || t->repeat > 1))
        return 2;
    struct side *loc = p->op == XFER_OP_WRITE ? &p->src : &p->dst;
    struct side *rem = p->op == XFER_OP_WRITE ? &p->dst : &p->src;
    bool held = false;
    p->len = t->len;
    if (!rc)
        rc = side_local(&x, loc);
    if (!rc && !strcmp(rem->n.node, me))
        rc = side_local(&x, rem);
    else if (!rc)
        held = (rc = side_remote(&x, rem, true)) == 0;
    if (!rc)
        rc = to_bytes(&x, &p->src, &p->dst, &p->len);
    if (!rc)
        rc = check_side(&x, &p->src, p->len, XFER_ACCESS_R);
    if (!rc)
        rc = check_side(&x, &p->dst, p->len, XFER_ACCESS_W);
    if (!rc && notified && (!held || p->len == 0))
        rc = why_set(&x, -XFER_EINVAL, "--notify needs a remote side and bytes to move: %s -> %s",
                     t->src, t->dst);
    if (!rc && held && p->len > 0)
        return 1; /* the peer stays held until the batch is done */
    if (!rc && rem->local && p->len > 0)
        rc = local_copy(&x, &p->src, &p->dst, p->len);
    if (held)
        side_release(&x, rem);
    result(res, a, rc, x.why, me, p->len, now_us() - t0);
    return 0;
}

static xfer_peer *remote_peer(struct prepared *p)
{
    return p->op == XFER_OP_WRITE ? p->dst.peer : p->src.peer;
}

/* One notification per remote node of the posted items (nx->notify set). */
static int bind_all(struct xctx *nx, xfer_batch *b, struct prepared *pp, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        bool first = pp[i].posted;
        for (size_t j = 0; first && j < i; j++)
            first = !pp[j].posted || remote_peer(&pp[j]) != remote_peer(&pp[i]);
        int rc = first ? bind_notify(nx, b, remote_peer(&pp[i]), 0) : 0;
        if (rc)
            return rc;
    }
    return 0;
}

/* Posts the prepared items (and nx's notifications) and waits; returns the
 * batch's overall code. */
static int post(struct xctx *nx, struct prepared *pp, size_t n, int deadline_ms, xfer_batch **out)
{
    struct xferd *d = nx->d;
    int err = 0;
    xfer_batch *b = xfer_batch_new(d->eng, &err);
    if (!b)
        return err;
    for (size_t i = 0; i < n; i++) {
        if (!pp[i].posted)
            continue;
        struct side *loc = pp[i].op == XFER_OP_WRITE ? &pp[i].src : &pp[i].dst;
        struct side *rem = pp[i].op == XFER_OP_WRITE ? &pp[i].dst : &pp[i].src;
        struct xfer_item it = {.op = pp[i].op,
                               .local = loc->lr,
                               .local_off = loc->n.off,
                               .peer = rem->peer,
                               .remote_id = rem->rd.id,
                               .remote_gen = rem->rd.gen,
                               .remote_off = rem->n.off,
                               .len = pp[i].len};
        int idx = xfer_batch_add(b, &it);
        if (idx < 0) {
            xfer_batch_free(b);
            return idx;
        }
    }
    int brc = nx->notify ? bind_all(nx, b, pp, n) : 0;
    if (brc) {
        xfer_batch_free(b);
        return brc;
    }
    *out = b;
    struct inflight f = {.b = b};
    inflight_add(d, &f);
    int rc = xfer_batch_submit(b, xferd_clamp_deadline(d, deadline_ms));
    if (rc == 0)
        rc = xfer_batch_wait(b, -1);
    if (rc == -XFER_EINPROGRESS)
        xfer_batch_cancel(b);
    inflight_del(d, &f);
    return rc;
}

/* Item results from the engine batch; stale or lost ones go single (not in
 * a notified batch). An item whose data landed but whose notification did
 * not fails with the notification's code. */
static void collect(struct xferd *d, bool notified, struct prepared *pp, size_t n, xfer_batch *b,
                    int brc, uint64_t us, Xctl__ItemResult **res, struct arena *a)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (!pp[i].posted)
            continue;
        struct side *rem = pp[i].op == XFER_OP_WRITE ? &pp[i].dst : &pp[i].src;
        int rc = b ? xfer_batch_item_status(b, k) : brc;
        const char *e = b ? xfer_batch_item_error(b, k) : NULL;
        int nrc = b && notified ? xfer_batch_notify_status(b, rem->peer) : 0;
        k++;
        if (!notified && (rc == -XFER_ESTALE || rc == -XFER_ECONN)) {
            struct xctx x = {.d = d};
            side_release(&x, rem);
            pp[i].single = true; /* re-resolved and retried alone */
            continue;
        }
        char why[300];
        const char *what = pp[i].op == XFER_OP_WRITE ? "write to" : "read from";
        if (!rc && nrc)
            snprintf(why, sizeof(why),
                     "%s %s/%s done, but the batch's notification to %s failed: %s", what,
                     rem->n.node, rem->n.region, rem->n.node, xfer_strerror(nrc));
        else
            snprintf(why, sizeof(why), "%s %s/%s: %s", what, rem->n.node, rem->n.region,
                     e && *e ? e : xfer_strerror(rc));
        result(res[i], a, rc ? rc : nrc, why, d->cfg.node, pp[i].len, us);
    }
    /* after the notification statuses were read: they name the peers */
    for (size_t i = 0; i < n; i++)
        if (pp[i].posted && !pp[i].single) {
            struct xctx x = {.d = d};
            side_release(&x, pp[i].op == XFER_OP_WRITE ? &pp[i].dst : &pp[i].src);
        }
}

/* A notified batch runs whole or not at all: when line bad failed to
 * prepare, the others are released and fail naming it. */
static void refuse_all(struct xferd *d, struct prepared *pp, size_t n, size_t bad,
                       Xctl__ItemResult **res, struct arena *a)
{
    char why[400];
    snprintf(why, sizeof(why), "not run: line %zu of this notified batch failed: %s", bad + 1,
             res[bad]->message);
    for (size_t i = 0; i < n; i++) {
        if (pp[i].posted) {
            struct xctx x = {.d = d};
            side_release(&x, pp[i].op == XFER_OP_WRITE ? &pp[i].dst : &pp[i].src);
        }
        if (i != bad)
            result(res[i], a, -XFER_ECANCELED, why, d->cfg.node, 0, 0);
    }
}

void xferd_transfer_many(struct xferd *d, Xctl__Transfer *const *items, size_t n,
                         const uint8_t *notify, size_t notify_len, uint32_t hops, int deadline_ms,
                         Xctl__ItemResult **res, struct arena *a)
{
    struct xctx nx = {.d = d, .notify = notify, .notify_len = notify_len};
    if (notify)
        nx.notify_id = notify_tag_id();
    int64_t deadline = xfer_now_ms() + xferd_clamp_deadline(d, deadline_ms);
    struct prepared *pp = calloc(n, sizeof(*pp));
    if (!pp) {
        for (size_t i = 0; i < n; i++)
            result(res[i], a, -XFER_ENOMEM, "out of memory", d->cfg.node, 0, 0);
        return;
    }
    size_t nposted = 0;
    uint64_t t0 = now_us();
    pthread_rwlock_rdlock(&d->region_lock);
    size_t bad = n;
    for (size_t i = 0; i < n; i++) {
        int how = prepare(d, items[i], notify != NULL, &pp[i], res[i], a);
        pp[i].posted = how == 1;
        pp[i].single = how == 2;
        nposted += how == 1;
        if (notify && how != 1 && bad == n)
            bad = i;
    }
    if (bad < n) {
        refuse_all(d, pp, n, bad, res, a);
        nposted = 0;
    }
    if (nposted) {
        xfer_batch *b = NULL;
        int brc = post(&nx, pp, n, (int)(deadline - xfer_now_ms()), &b);
        collect(d, notify != NULL, pp, n, b, brc, now_us() - t0, res, a);
        xfer_batch_free(b);
    }
    pthread_rwlock_unlock(&d->region_lock);
    for (size_t i = 0; i < n; i++) {
        if (!pp[i].single)
            continue;
        int left = (int)(deadline - xfer_now_ms());
        if (left > 0)
            xferd_transfer(d, items[i], hops, left, res[i], a);
        else
            result(res[i], a, -XFER_ETIMEDOUT, "batch deadline passed", d->cfg.node, 0, 0);
    }
    free(pp);
}
