/*
 * Named transfers: "copy len bytes from src=node/region[+off] to
 * dst=node/region[+off]". WRITE is carried out by the owner of src, READ by
 * the owner of dst; a node owning neither side forwards the request (once)
 * to the one that must carry it out. Access modes are enforced on both
 * sides for every named transfer: the source must be readable (r), the
 * destination writable (w).
 */
#include "ctl_client.h"
#include "notify_tag.h"
#include "xfer_io.h"
#include "transfer_int.h"
#include "xferd.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int why_set(struct xctx *x, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(x->why, sizeof(x->why), fmt, ap);
    va_end(ap);
    return rc;
}

int xferd_clamp_deadline(struct xferd *d, int deadline_ms)
{
    int64_t dd = atomic_load(&d->drain_deadline_ms);
    if (dd) {
        int64_t left = dd - xfer_now_ms();
        if (left < deadline_ms)
            deadline_ms = left > 1 ? (int)left : 1;
    }
    return deadline_ms;
}

void inflight_add(struct xferd *d, struct inflight *f)
{
    pthread_mutex_lock(&d->inflight_lock);
    f->next = d->inflight;
    d->inflight = f;
    pthread_mutex_unlock(&d->inflight_lock);
}

void inflight_del(struct xferd *d, struct inflight *f)
{
    pthread_mutex_lock(&d->inflight_lock);
    for (struct inflight **pp = &d->inflight; *pp; pp = &(*pp)->next)
        if (*pp == f) {
            *pp = f->next;
            break;
        }
    pthread_mutex_unlock(&d->inflight_lock);
}

void xferd_cancel_inflight(struct xferd *d)
{
    pthread_mutex_lock(&d->inflight_lock);
    for (struct inflight *f = d->inflight; f; f = f->next)
        xfer_batch_cancel(f->b);
    pthread_mutex_unlock(&d->inflight_lock);
}

/* The local side: region by name, described. Caller holds region_lock. */
int side_local(struct xctx *x, struct side *s)
{
    s->local = true;
    s->lr = xfer_region_find(x->d->eng, s->n.region);
    if (!s->lr)
        return why_set(x, -XFER_ENOENT, "unknown region %s/%s", s->n.node, s->n.region);
    xfer_region_describe(s->lr, &s->rd);
    return 0;
}

int side_remote(struct xctx *x, struct side *s, bool connect)
{
    s->local = false;
    if (!connect) {
        int rc = xfer_registry_lookup_region(x->d->reg, s->n.node, s->n.region, &s->rd);
        return rc ? why_set(x, rc, "%s", xfer_registry_last_error(x->d->reg)) : 0;
    }
    int rc = xfer_node_resolve(x->d->node, s->n.node, s->n.region, 0, &s->ref);
    if (rc)
        return why_set(x, rc, "%s", xfer_node_last_error(x->d->node));
    s->peer = s->ref.peer;
    s->rd = s->ref.rd;
    return 0;
}

void side_release(struct xctx *x, struct side *s)
{
    xfer_node_unref(x->d->node, &s->ref);
    s->peer = NULL;
}

/* Block addresses -> byte offsets and length, once both layouts are known. */
int to_bytes(struct xctx *x, struct side *src, struct side *dst, uint64_t *len)
{
    if (src->n.is_block != dst->n.is_block)
        return why_set(x, -XFER_EINVAL, "mixing block (#) and byte (+) addresses");
    if (!src->n.is_block)
        return 0;
    int rc = xfer_layouts_match(&src->rd.layout, &dst->rd.layout, x->why, sizeof(x->why));
    if (rc)
        return rc;
    uint64_t bs = xfer_layout_block_size(&src->rd.layout);
    if (src->n.off > UINT64_MAX / bs || dst->n.off > UINT64_MAX / bs || *len > UINT64_MAX / bs)
        return why_set(x, -XFER_ERANGE, "block index out of range");
    src->n.off *= bs;
    dst->n.off *= bs;
    *len *= bs;
    src->n.is_block = dst->n.is_block = false;
    return 0;
}

int check_side(struct xctx *x, const struct side *s, uint64_t len, unsigned need)
{
    if (!(s->rd.access & need))
        return why_set(x, -XFER_EACCES, "region %s/%s is %s", s->n.node, s->n.region,
                       need == XFER_ACCESS_W ? "not writable (read-only)"
                                             : "not readable (write-only)");
    if (!xfer_range_ok(s->n.off, len, s->rd.len))
        return why_set(x, -XFER_ERANGE,
                       "%s/%s: offset %llu + length %llu is past its end (%llu bytes)", s->n.node,
                       s->n.region, (unsigned long long)s->n.off, (unsigned long long)len,
                       (unsigned long long)s->rd.len);
    return 0;
}

int local_copy(struct xctx *x, struct side *src, struct side *dst, uint64_t len)
{
    if (src->rd.kind != XFER_MEM_HOST || dst->rd.kind != XFER_MEM_HOST)
        return why_set(x, -XFER_ENOTSUP, "local copy between GPU regions is not supported here");
    memmove((char *)xfer_region_ptr(dst->lr) + dst->n.off,
            (char *)xfer_region_ptr(src->lr) + src->n.off, len);
    return 0;
}

int bind_notify(struct xctx *x, xfer_batch *b, xfer_peer *p, unsigned flags)
{
    uint8_t *m = malloc(NOTIFY_TAG_LEN + x->notify_len);
    if (!m)
        return -XFER_ENOMEM;
    notify_tag_put(m, x->notify_id, flags);
    memcpy(m + NOTIFY_TAG_LEN, x->notify, x->notify_len);
    int rc = xfer_batch_notify(b, p, m, NOTIFY_TAG_LEN + x->notify_len);
    free(m);
    return rc;
}

/* One engine batch of one item. flags: NOTIFY_TAG_MAY_RETRY unless this is
 * the retry after a stale descriptor (the last attempt). */
static int engine_op(struct xctx *x, enum xfer_op op, struct side *loc, struct side *rem,
                     uint64_t len, int deadline_ms, unsigned flags)
{
    int err = 0;
    xfer_batch *b = xfer_batch_new(x->d->eng, &err);
    if (!b)
        return why_set(x, err, "cannot create a batch: %s", xfer_strerror(err));
    struct xfer_item it = {.op = op,
                           .local = loc->lr,
                           .local_off = loc->n.off,
                           .peer = rem->peer,
                           .remote_id = rem->rd.id,
                           .remote_gen = rem->rd.gen,
                           .remote_off = rem->n.off,
                           .len = len};
    struct inflight f = {.b = b};
    int rc = xfer_batch_add(b, &it);
    if (rc >= 0 && x->notify && (rc = bind_notify(x, b, rem->peer, flags))) {
        why_set(x, rc, "notification for %s: %s", rem->n.node, xfer_engine_last_error(x->d->eng));
        xfer_batch_free(b);
        return rc;
    }
    if (rc >= 0) {
        inflight_add(x->d, &f);
        rc = xfer_batch_submit(b, xferd_clamp_deadline(x->d, deadline_ms));
        if (rc == 0)
            rc = xfer_batch_wait(b, -1);
        if (rc == -XFER_EINPROGRESS) /* wait gave up: make sure nothing runs on */
            rc = xfer_batch_cancel(b) ? rc : -XFER_ETIMEDOUT;
        inflight_del(x->d, &f);
    }
    if (rc < 0 && x->notify && xfer_batch_count(b) && xfer_batch_item_status(b, 0) == 0) {
        /* the data landed; the notification did not (or may not have) */
        why_set(x, rc, "%s %s/%s done, but its notification to %s failed: %s",
                op == XFER_OP_WRITE ? "write to" : "read from", rem->n.node, rem->n.region,
                rem->n.node, xfer_strerror(rc));
    } else if (rc < 0) {
        const char *e = xfer_batch_count(b) ? xfer_batch_item_error(b, 0) : NULL;
        why_set(x, rc, "%s %s/%s: %s", op == XFER_OP_WRITE ? "write to" : "read from", rem->n.node,
                rem->n.region, e && *e ? e : xfer_strerror(rc));
    }
    xfer_batch_free(b);
    return rc < 0 ? rc : 0;
}

static int execute_held(struct xctx *x, enum xfer_op op, struct side *src, struct side *dst,
                        struct side *loc, struct side *rem, uint64_t len, int deadline_ms)
{
    int rc = to_bytes(x, src, dst, &len);
    if (!rc)
        rc = check_side(x, src, len, XFER_ACCESS_R);
    if (!rc)
        rc = check_side(x, dst, len, XFER_ACCESS_W);
    if (!rc && rem->local && x->notify)
        rc =
            why_set(x, -XFER_EINVAL, "--notify needs a remote side: %s/%s and %s/%s are both on %s",
                    src->n.node, src->n.region, dst->n.node, dst->n.region, x->d->cfg.node);
    if (rc || len == 0)
        return rc;
    if (rem->local)
        return local_copy(x, src, dst, len);
    /* A notification goes with every attempt, tagged with one copy id: the
     * target delivers it at most once, and drops a stale attempt's (the
     * retry below follows it; docs/service.md "Notifications"). */
    rc = engine_op(x, op, loc, rem, len, deadline_ms, NOTIFY_TAG_MAY_RETRY);
    /* A connection failure may mean the peer restarted and its "join" has
     * not reached our cache yet: Redis has a different incarnation. */
    if (rc == -XFER_ECONN && xfer_node_peer_restarted(x->d->node, &rem->ref)) {
        xfer_info("%s restarted: retrying on its new incarnation", rem->n.node);
        side_release(x, rem);
        rc = side_remote(x, rem, true); /* re-adds it with the new incarnation */
        if (rc)
            return rc;
        rc = engine_op(x, op, loc, rem, len, deadline_ms, NOTIFY_TAG_MAY_RETRY);
    }
    if (rc == -XFER_ESTALE) { /* re-read the descriptor once and retry */
        xfer_info("%s/%s was registered again: retrying with its new descriptor", rem->n.node,
                  rem->n.region);
        xfer_registry_cache_clear(x->d->reg);
        side_release(x, rem);
        rc = side_remote(x, rem, true);
        if (rc)
            return rc;
        rc = engine_op(x, op, loc, rem, len, deadline_ms, 0);
    }
    return rc;
}

static int execute(struct xctx *x, enum xfer_op op, struct side *src, struct side *dst,
                   uint64_t len, int deadline_ms)
{
    struct side *loc = op == XFER_OP_WRITE ? src : dst;
    struct side *rem = op == XFER_OP_WRITE ? dst : src;
    int rc = side_local(x, loc);
    if (rc)
        return rc;
    if (!strcmp(rem->n.node, x->d->cfg.node))
        rc = side_local(x, rem);
    else
        rc = side_remote(x, rem, true); /* holds the peer on success */
    if (rc)
        return rc;
    rc = execute_held(x, op, src, dst, loc, rem, len, deadline_ms);
    if (!rem->local)
        side_release(x, rem);
    return rc;
}

static int forward_transfer(struct xctx *x, const Xctl__Transfer *t, enum xfer_op op,
                            const char *node, uint32_t hops, int deadline_ms, Xctl__ItemResult *res,
                            struct arena *a)
{
    if (hops >= 1)
        return why_set(x, -XFER_EINVAL, "%s does not own %s or %s (forwarded already)",
                       x->d->cfg.node, t->src, t->dst);
    Xctl__Transfer item = *t;
    item.op = op == XFER_OP_WRITE ? XCTL__OP__OP_WRITE : XCTL__OP__OP_READ;
    Xctl__Transfer *items[1] = {&item};
    Xctl__SubmitBatch b = XCTL__SUBMIT_BATCH__INIT;
    b.n_items = 1;
    b.items = items;
    b.deadline_ms = (uint32_t)deadline_ms;
    b.notify.data = (uint8_t *)x->notify;
    b.notify.len = x->notify ? x->notify_len : 0;
    Xctl__Request req = XCTL__REQUEST__INIT;
    req.hops = hops + 1;
    req.body_case = XCTL__REQUEST__BODY_BATCH;
    req.batch = &b;
    Xctl__Response *r = NULL;
    int rc = xferd_forward(x->d, node, &req, &r, deadline_ms + 1000, x->why, sizeof(x->why));
    if (rc)
        return rc;
    rc = r->status;
    if (r->body_case == XCTL__RESPONSE__BODY_BATCH && r->batch->n_items == 1) {
        const Xctl__ItemResult *ir = r->batch->items[0];
        rc = ir->status;
        res->executor = arena_strdup(a, ir->executor);
        res->elapsed_us = ir->elapsed_us;
        res->bytes = ir->bytes;
        why_set(x, rc, "%s", ir->message ? ir->message : "");
    } else {
        why_set(x, rc ? rc : -XFER_EPROTO, "%s",
                r->message && *r->message ? r->message : "bad answer");
        rc = rc ? rc : -XFER_EPROTO;
    }
    xctl__response__free_unpacked(r, NULL);
    return rc;
}

uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

int transfer_plan(struct xctx *x, const Xctl__Transfer *t, struct side *src, struct side *dst,
                  enum xfer_op *op, const char **exec)
{
    const char *me = x->d->cfg.node;
    int rc = xfer_node_addr_parse(t->src, &src->n, x->why, sizeof(x->why));
    if (!rc)
        rc = xfer_node_addr_parse(t->dst, &dst->n, x->why, sizeof(x->why));
    bool own_src = !rc && !strcmp(src->n.node, me), own_dst = !rc && !strcmp(dst->n.node, me);
    *op = t->op == XCTL__OP__OP_READ ? XFER_OP_READ : XFER_OP_WRITE;
    if (t->op == XCTL__OP__OP_AUTO)
        *op = own_src || !own_dst ? XFER_OP_WRITE : XFER_OP_READ;
    *exec = *op == XFER_OP_WRITE ? src->n.node : dst->n.node;
    return rc;
}

void xferd_transfer(struct xferd *d, const Xctl__Transfer *t, uint32_t hops, int deadline_ms,
                    Xctl__ItemResult *res, struct arena *a)
{
    xferd_transfer_notify(d, t, NULL, 0, hops, deadline_ms, res, a);
}

void xferd_transfer_notify(struct xferd *d, const Xctl__Transfer *t, const uint8_t *notify,
                           size_t notify_len, uint32_t hops, int deadline_ms, Xctl__ItemResult *res,
                           struct arena *a)
{
    struct xctx x = {.d = d, .notify = notify, .notify_len = notify_len};
    if (notify)
        x.notify_id = notify_tag_id();
    struct side src = {0}, dst = {0};
    const char *me = d->cfg.node;
    deadline_ms = xferd_clamp_deadline(d, deadline_ms); /* SIGTERM bounds everything */
    enum xfer_op op;
    const char *exec;
    int rc = transfer_plan(&x, t, &src, &dst, &op, &exec);
    uint64_t t0 = now_us(), bytes = 0;
    if (!rc && strcmp(exec, me)) {
        rc = forward_transfer(&x, t, op, exec, hops, deadline_ms, res, a);
        goto out;
    }
    res->executor = arena_strdup(a, me);
    uint32_t reps = t->repeat ? t->repeat : 1;
    int64_t deadline = xfer_now_ms() + deadline_ms;
    pthread_rwlock_rdlock(&d->region_lock);
    for (uint32_t i = 0; !rc && i < reps; i++) {
        struct side s2 = src, d2 = dst;
        int left = (int)(deadline - xfer_now_ms());
        rc = left > 0 ? execute(&x, op, &s2, &d2, t->len, left)
                      : why_set(&x, -XFER_ETIMEDOUT, "deadline passed");
        if (!rc && i == 0)
            bytes = t->len * (src.n.is_block ? xfer_layout_block_size(&s2.rd.layout) : 1);
    }
    pthread_rwlock_unlock(&d->region_lock);
    res->bytes = bytes * reps;
out:
    res->status = rc;
    if (!res->elapsed_us)
        res->elapsed_us = now_us() - t0;
    res->message = arena_strdup(a, rc ? x.why : "");
    if (rc)
        xfer_debug("transfer %s -> %s: %s", t->src ? t->src : "", t->dst ? t->dst : "", x.why);
}

/* Inline data: the owner of the address copies it in or out. */
static int inline_forward(struct xferd *d, const char *node, Xctl__Request *req, uint32_t hops,
                          Xctl__Response **r, char *why, size_t wl)
{
    if (hops >= 1) {
        snprintf(why, wl, "%s does not own the address (forwarded already)", d->cfg.node);
        return -XFER_EINVAL;
    }
    req->hops = hops + 1;
    int rc =
        xferd_forward(d, node, req, r, xferd_clamp_deadline(d, d->cfg.request_timeout_ms), why, wl);
    if (rc == 0 && (*r)->status) {
        rc = (*r)->status;
        snprintf(why, wl, "%s", (*r)->message);
    }
    return rc;
}

static int inline_local(struct xferd *d, const struct xfer_node_addr *n, uint64_t len,
                        unsigned need, xfer_region **r, char *why, size_t wl)
{
    struct xctx x = {.d = d};
    struct side s = {.n = *n};
    int rc = n->is_block ? why_set(&x, -XFER_EINVAL, "inline data takes a byte address")
                         : side_local(&x, &s);
    if (!rc && s.rd.kind != XFER_MEM_HOST)
        rc =
            why_set(&x, -XFER_ENOTSUP, "inline data to a GPU region (use copy from a host region)");
    if (!rc)
        rc = check_side(&x, &s, len, need);
    if (rc)
        snprintf(why, wl, "%s", x.why);
    *r = s.lr;
    return rc;
}

int xferd_write_data(struct xferd *d, const char *dst, const uint8_t *data, size_t len,
                     uint32_t hops, char *why, size_t wl)
{
    struct xfer_node_addr n;
    int rc = xfer_node_addr_parse(dst, &n, why, wl);
    if (rc)
        return rc;
    if (strcmp(n.node, d->cfg.node)) {
        Xctl__WriteData w = XCTL__WRITE_DATA__INIT;
        w.dst = (char *)dst;
        w.data.data = (uint8_t *)data;
        w.data.len = len;
        Xctl__Request req = XCTL__REQUEST__INIT;
        req.body_case = XCTL__REQUEST__BODY_WRITE;
        req.write = &w;
        Xctl__Response *r = NULL;
        rc = inline_forward(d, n.node, &req, hops, &r, why, wl);
        if (r)
            xctl__response__free_unpacked(r, NULL);
        return rc;
    }
    xfer_region *r;
    pthread_rwlock_rdlock(&d->region_lock);
    rc = inline_local(d, &n, len, XFER_ACCESS_W, &r, why, wl);
    if (!rc && len)
        memcpy((char *)xfer_region_ptr(r) + n.off, data, len);
    pthread_rwlock_unlock(&d->region_lock);
    return rc;
}

int xferd_read_data(struct xferd *d, const char *src, uint64_t len, uint32_t hops, uint8_t **out,
                    char *why, size_t wl)
{
    struct xfer_node_addr n;
    int rc = xfer_node_addr_parse(src, &n, why, wl);
    if (rc)
        return rc;
    *out = NULL;
    if (strcmp(n.node, d->cfg.node)) {
        Xctl__ReadData rd = XCTL__READ_DATA__INIT;
        rd.src = (char *)src;
        rd.len = len;
        Xctl__Request req = XCTL__REQUEST__INIT;
        req.body_case = XCTL__REQUEST__BODY_READ;
        req.read = &rd;
        Xctl__Response *r = NULL;
        rc = inline_forward(d, n.node, &req, hops, &r, why, wl);
        if (!rc && (r->body_case != XCTL__RESPONSE__BODY_DATA || r->data->data.len != len)) {
            snprintf(why, wl, "bad answer from %s", n.node);
            rc = -XFER_EPROTO;
        }
        if (!rc && (*out = malloc(len ? len : 1)) != NULL)
            memcpy(*out, r->data->data.data, len);
        else if (!rc)
            rc = -XFER_ENOMEM;
        if (r)
            xctl__response__free_unpacked(r, NULL);
        return rc;
    }
    xfer_region *r;
    pthread_rwlock_rdlock(&d->region_lock);
    rc = inline_local(d, &n, len, XFER_ACCESS_R, &r, why, wl);
    if (!rc && !(*out = malloc(len ? len : 1)))
        rc = -XFER_ENOMEM;
    if (!rc)
        memcpy(*out, (char *)xfer_region_ptr(r) + n.off, len);
    pthread_rwlock_unlock(&d->region_lock);
    return rc;
}
