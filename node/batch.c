/*
 * Named batches: items addressed by "node/region[+off]" (or added by pool
 * block lists, pool_xfer.c) go out as one engine batch. Items that meet a
 * restarted peer or a re-registered region are re-resolved and run once
 * more as a second engine batch within the same deadline.
 */
#include "xfer_grow.h"
#include "node_batch.h"
#include "xfer_io.h" /* xfer_now_ms */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

xfer_node_batch *xfer_node_batch_new(xfer_node *n, int *err)
{
    int rc = n ? 0 : -XFER_EINVAL;
    xfer_node_batch *b = n ? calloc(1, sizeof(*b)) : NULL;
    if (n && !b)
        rc = -XFER_ENOMEM;
    if (b) {
        b->n = n;
        b->eb = xfer_batch_new(n->eng, &rc);
    }
    if (b && !b->eb) {
        free(b);
        b = NULL;
    }
    if (!b && err)
        *err = node_err(rc, "cannot create a batch: %s", xfer_strerror(rc));
    return b;
}

static void release_refs(xfer_node_batch *b)
{
    for (size_t i = 0; i < b->nrefs; i++)
        xfer_node_unref(b->n, &b->refs[i].ref);
    b->nrefs = 0;
}

int xfer_node_batch_reset(xfer_node_batch *b)
{
    if (!b)
        return -XFER_EINVAL;
    int rc = xfer_batch_reset(b->eb);
    if (rc)
        return node_err(rc, "batch is in flight");
    xfer_batch_free(b->eb2);
    b->eb2 = NULL;
    nb_notifs_clear(b);
    nb_spans_clear(b);
    release_refs(b);
    free(b->retry_idx); /* sized for the old capacity */
    b->retry_idx = NULL;
    b->nitems = 0;
    b->nsegs = 0;
    b->nblks = b->nbw = 0;
    b->submitted = b->retried = false;
    b->first_other = 0;
    return 0;
}

void xfer_node_batch_free(xfer_node_batch *b)
{
    if (!b)
        return;
    xfer_batch_free(b->eb2); /* both cancel and wait if in flight */
    xfer_batch_free(b->eb);
    nb_notifs_clear(b);
    nb_spans_clear(b);
    free(b->spans);
    release_refs(b);
    free(b->items);
    free(b->item_ref);
    free(b->seg0);
    free(b->nseg);
    free(b->segs);
    free(b->blk);
    free(b->blks);
    free(b->bw);
    free(b->retry_idx);
    free(b->refs);
    free(b);
}

int xfer_node_batch_require(xfer_node_batch *b, unsigned transports)
{
    if (!b || (transports & ~(unsigned)XFER_TRANSPORT_ALL))
        return node_err(-XFER_EINVAL, "bad transport mask");
    if (b->nitems)
        return node_err(-XFER_EBUSY, "set the requirement before adding items");
    b->require = transports;
    return 0;
}

size_t xfer_node_batch_count(const xfer_node_batch *b)
{
    return b ? b->nitems : 0;
}

/* Index of the batch's ref to node[/region], resolving it on first use. */
int nb_ref(xfer_node_batch *b, const char *node, const char *region)
{
    const char *reg = region ? region : "";
    for (size_t i = 0; i < b->nrefs; i++)
        if (!strcmp(b->refs[i].ref.node, node) && !strcmp(b->refs[i].region, reg))
            return (int)i;
    if (b->nrefs == b->caprefs) {
        size_t cap = b->caprefs ? b->caprefs * 2 : 8;
        struct nb_ref *v = realloc(b->refs, cap * sizeof(*v));
        if (!v)
            return node_err(-XFER_ENOMEM, "out of memory");
        b->refs = v;
        b->caprefs = cap;
    }
    struct nb_ref *r = &b->refs[b->nrefs];
    memset(r, 0, sizeof(*r));
    int rc = xfer_node_resolve(b->n, node, region, b->require, &r->ref);
    if (rc)
        return rc;
    snprintf(r->region, sizeof(r->region), "%s", reg);
    return (int)b->nrefs++;
}

int nb_reserve(xfer_node_batch *b, size_t more, size_t more_segs)
{
    /* The five per-item arrays share capitems: each grows from it alike, and
     * it moves only when all five did (a partial failure regrows next time). */
    size_t want = b->nitems + more, c1 = b->capitems, c2 = c1, c3 = c1, c4 = c1, c5 = c1;
    if (xfer_grow((void **)&b->items, &c1, want, sizeof(*b->items), 64) ||
        xfer_grow((void **)&b->item_ref, &c2, want, sizeof(*b->item_ref), 64) ||
        xfer_grow((void **)&b->seg0, &c3, want, sizeof(*b->seg0), 64) ||
        xfer_grow((void **)&b->nseg, &c4, want, sizeof(*b->nseg), 64) ||
        xfer_grow((void **)&b->blk, &c5, want, sizeof(*b->blk), 64))
        return node_err(-XFER_ENOMEM, "out of memory for %zu items", want);
    b->capitems = c1;
    if (xfer_grow((void **)&b->segs, &b->capsegs, b->nsegs + more_segs, sizeof(*b->segs), 64))
        return node_err(-XFER_ENOMEM, "out of memory for %zu segments", b->nsegs + more_segs);
    return 0;
}

int nb_engine_add(const xfer_node_batch *b, xfer_batch *eb, size_t first, size_t end)
{
    for (size_t i = first, j; i < end; i = j) {
        int rc;
        if (b->blk[i]) { /* a request's block items: one engine call */
            for (j = i + 1; j < end && b->blk[j]; j++)
                ;
            rc = nb_blocks_add(b, eb, i, j);
        } else if (b->nseg[i]) {
            j = i + 1;
            rc = nb_item_add(b, eb, i, &b->items[i]);
        } else {
            for (j = i + 1; j < end && !b->nseg[j] && !b->blk[j]; j++)
                ;
            rc = xfer_batch_add_many(eb, b->items + i, j - i);
        }
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Posts items [first, nitems) to the engine batch (all or none). */
int nb_commit(xfer_node_batch *b, size_t first)
{
    size_t had = xfer_batch_count(b->eb);
    int rc = nb_engine_add(b, b->eb, first, b->nitems);
    if (rc < 0) {
        if (first < b->nitems && b->nseg[first])
            b->nsegs = b->seg0[first];
        if (first < b->nitems && b->blk[first]) { /* the block list's words go too */
            b->nbw = b->blks[b->blk[first] - 1].r.ids;
            b->nblks = b->blk[first] - 1;
        }
        b->nitems = first;
        xfer_batch_truncate(b->eb, had); /* the items this call did append */
        return node_err(rc, "%s", xfer_engine_last_error(b->n->eng));
    }
    return 0;
}

/* A "#block" address: local_off and len count blocks too; both become bytes. */
static int remote_bytes(const struct xfer_node_addr *a, const struct xfer_region_desc *rd,
                        xfer_region *local, uint64_t *local_off, uint64_t *off, uint64_t *len)
{
    *off = a->off;
    if (!a->is_block)
        return 0;
    struct xfer_region_desc ld;
    xfer_region_describe(local, &ld);
    char why[200];
    if (xfer_layouts_match(&ld.layout, &rd->layout, why, sizeof(why)))
        return node_err(-XFER_EMISMATCH, "%s/%s: %s", a->node, a->region, why);
    uint64_t bs = xfer_layout_block_size(&rd->layout);
    if (a->off > UINT64_MAX / bs || *len > UINT64_MAX / bs || *local_off > UINT64_MAX / bs)
        return node_err(-XFER_ERANGE, "block index out of range");
    *off = a->off * bs;
    *local_off *= bs;
    *len *= bs;
    return 0;
}

int xfer_node_batch_add(xfer_node_batch *b, enum xfer_op op, xfer_region *local, uint64_t local_off,
                        const char *remote, uint64_t len)
{
    struct xfer_node_addr a;
    if (!b || !local || (op != XFER_OP_READ && op != XFER_OP_WRITE))
        return node_err(-XFER_EINVAL, "bad batch, local region or op");
    int rc = xfer_node_addr_parse(remote, &a, node_err_buf(), NODE_ERR_MAX);
    if (rc)
        return rc;
    if (b->submitted)
        return node_err(-XFER_EBUSY, "batch was submitted (reset it first)");
    int ri = nb_ref(b, a.node, a.region);
    if (ri < 0)
        return ri;
    const struct xfer_region_desc *rd = &b->refs[ri].ref.rd;
    uint64_t off;
    if ((rc = remote_bytes(&a, rd, local, &local_off, &off, &len)))
        return rc;
    unsigned need = op == XFER_OP_READ ? XFER_ACCESS_R : XFER_ACCESS_W;
    if (!(rd->access & need))
        return node_err(-XFER_EACCES, "region %s/%s is %s", a.node, a.region,
                        need == XFER_ACCESS_W ? "not writable (read-only)"
                                              : "not readable (write-only)");
    if (!xfer_range_ok(off, len, rd->len))
        return node_err(-XFER_ERANGE, "%s/%s: offset %llu + length %llu is past its end (%llu)",
                        a.node, a.region, (unsigned long long)off, (unsigned long long)len,
                        (unsigned long long)rd->len);
    if ((rc = nb_reserve(b, 1, 0)))
        return rc;
    size_t i = b->nitems++;
    b->nseg[i] = 0;
    b->blk[i] = 0;
    b->items[i] = (struct xfer_item){.op = op,
                                     .local = local,
                                     .local_off = local_off,
                                     .peer = b->refs[ri].ref.peer,
                                     .remote_id = rd->id,
                                     .remote_gen = rd->gen,
                                     .remote_off = off,
                                     .len = len};
    b->item_ref[i] = (uint32_t)ri;
    rc = nb_commit(b, i);
    return rc ? rc : (int)i;
}

static bool ref_stale(xfer_node_batch *b, const struct nb_ref *r)
{
    struct xfer_node_desc nd;
    struct xfer_peer_desc pd;
    if (!r->ref.peer)
        return false;
    xfer_peer_describe(r->ref.peer, &pd);
    if (pd.incarnation != r->ref.incarnation)
        return true;
    return xfer_registry_lookup_node(b->n->reg, r->ref.node, &nd) == 0 &&
           nd.peer.incarnation != r->ref.incarnation;
}

static int re_resolve(xfer_node_batch *b, struct nb_ref *r);

/* A ref resolved against one incarnation of a peer is never posted to
 * another (whose regions may reuse the old ids): refs whose peer restarted
 * since they were resolved are resolved again and their items re-targeted. */
static int refresh_stale(xfer_node_batch *b)
{
    bool any = false;
    for (size_t i = 0; i < b->nrefs; i++) {
        struct nb_ref *r = &b->refs[i];
        r->state = 0;
        if (!ref_stale(b, r))
            continue;
        if (!r->region[0])
            return node_err(-XFER_ESTALE,
                            "node %s restarted since its pool blocks or notification "
                            "were added: add them again",
                            r->ref.node);
        xfer_info("batch: %s restarted since %s/%s was resolved: resolving it again", r->ref.node,
                  r->ref.node, r->region);
        if (re_resolve(b, r))
            return node_err(r->rrc, "%s", r->why);
        r->state = 1;
        any = true;
    }
    if (!any)
        return 0;
    for (size_t i = 0; i < b->nitems; i++) {
        const struct nb_ref *r = b->item_ref[i] < b->nrefs ? &b->refs[b->item_ref[i]] : NULL;
        if (r && r->state == 1) {
            b->items[i].peer = r->ref.peer;
            b->items[i].remote_id = r->ref.rd.id;
            b->items[i].remote_gen = r->ref.rd.gen;
        }
    }
    int rc = xfer_batch_reset(b->eb); /* drops notification bindings too */
    if (!rc)
        rc = nb_engine_add(b, b->eb, 0, b->nitems);
    if (rc < 0)
        return node_err(rc, "re-targeting items: %s", xfer_engine_last_error(b->n->eng));
    return nb_notifs_rebind(b);
}

int xfer_node_batch_submit(xfer_node_batch *b, int deadline_ms)
{
    if (!b)
        return -XFER_EINVAL;
    if (b->submitted)
        return node_err(-XFER_EBUSY, "batch was submitted (reset it first)");
    int rc = refresh_stale(b);
    if (rc)
        return rc;
    /* The requirement again: a connection may have been replaced since add. */
    for (size_t i = 0; i < b->nrefs; i++) {
        int rc = xfer_node_transport_check(b->n, b->refs[i].ref.peer, b->require, node_err_buf(),
                                           NODE_ERR_MAX);
        if (rc)
            return rc;
    }
    if (deadline_ms <= 0)
        deadline_ms = b->n->default_deadline_ms;
    b->deadline = xfer_now_ms() + deadline_ms;
    rc = xfer_batch_submit(b->eb, deadline_ms);
    if (rc)
        return node_err(rc, "%s", xfer_engine_last_error(b->n->eng));
    b->submitted = true;
    return 0;
}

int xfer_node_batch_poll(xfer_node_batch *b)
{
    if (!b || !b->submitted)
        return b ? node_err(-XFER_EINVAL, "batch not submitted") : -XFER_EINVAL;
    if (!b->eb2)
        return xfer_batch_poll(b->eb);
    int rc = xfer_batch_poll(b->eb2);
    return rc == -XFER_EINPROGRESS || !b->first_other ? rc : b->first_other;
}

/* Re-resolves ref i after a stale descriptor or a peer restart; the old
 * hold is released first (the peer may be replaced). */
static int re_resolve(xfer_node_batch *b, struct nb_ref *r)
{
    char node[XFER_NAME_MAX];
    snprintf(node, sizeof(node), "%s", r->ref.node);
    xfer_node_unref(b->n, &r->ref);
    xfer_registry_cache_clear(b->n->reg);
    r->rrc = xfer_node_resolve(b->n, node, r->region[0] ? r->region : NULL, b->require, &r->ref);
    if (r->rrc) {
        snprintf(r->why, sizeof(r->why), "%s", xfer_node_last_error(b->n));
        snprintf(r->ref.node, sizeof(r->ref.node), "%s", node); /* for messages */
    }
    return r->rrc;
}

static bool retryable(xfer_node_batch *b, struct nb_ref *r, int st)
{
    if (st == -XFER_ESTALE)
        return true;
    return st == -XFER_ECONN && r->ref.peer && xfer_node_peer_restarted(b->n, &r->ref);
}

/* The first run ended with failures: items that may succeed after a fresh
 * resolve go into a second engine batch. */
static void retry(xfer_node_batch *b)
{
    b->retried = true;
    if (!b->retry_idx && !(b->retry_idx = malloc(b->capitems * sizeof(*b->retry_idx))))
        return;
    for (size_t i = 0; i < b->nrefs; i++)
        b->refs[i].state = 0; /* 0 unknown, 1 retry, 2 keep */
    size_t nre = 0;
    for (size_t i = 0; i < b->nitems; i++) {
        b->retry_idx[i] = -1;
        int st = xfer_batch_item_status(b->eb, i);
        uint32_t ri = b->item_ref[i];
        if (st == 0)
            continue;
        struct nb_ref *r = ri < b->nrefs ? &b->refs[ri] : NULL;
        if (r && !r->state) /* pool refs (no region) cannot be re-resolved here */
            r->state = r->region[0] && retryable(b, r, st) && re_resolve(b, r) == 0 ? 1 : 2;
        if (!r || r->state != 1 || (st != -XFER_ESTALE && st != -XFER_ECONN)) {
            if (!b->first_other)
                b->first_other = st;
            continue;
        }
        b->retry_idx[i] = (int32_t)nre++;
    }
    if (!nre || xfer_now_ms() >= b->deadline)
        goto none;
    int err = 0;
    if (!(b->eb2 = xfer_batch_new(b->n->eng, &err)))
        goto none;
    for (size_t i = 0; i < b->nitems; i++) {
        if (b->retry_idx[i] < 0)
            continue;
        struct xfer_item it = b->items[i];
        const struct nb_ref *r = &b->refs[b->item_ref[i]];
        it.peer = r->ref.peer;
        it.remote_id = r->ref.rd.id;
        it.remote_gen = r->ref.rd.gen;
        if (nb_item_add(b, b->eb2, i, &it) < 0)
            goto drop;
    }
    xfer_info("batch: retrying %zu items after a restarted peer or re-registered region", nre);
    if (xfer_batch_submit(b->eb2, (int)(b->deadline - xfer_now_ms())) == 0)
        return;
drop:
    xfer_batch_free(b->eb2);
    b->eb2 = NULL;
none:
    for (size_t i = 0; i < b->nitems; i++)
        b->retry_idx[i] = -1;
    b->first_other = xfer_batch_poll(b->eb);
}

int xfer_node_batch_wait(xfer_node_batch *b, int timeout_ms)
{
    if (!b || !b->submitted)
        return b ? node_err(-XFER_EINVAL, "batch not submitted") : -XFER_EINVAL;
    int64_t end = timeout_ms < 0 ? b->deadline + 1000 : xfer_now_ms() + timeout_ms;
    int left = (int)(end - xfer_now_ms());
    int rc = xfer_batch_wait(b->eb, left > 0 ? left : 0);
    if (rc == -XFER_EINPROGRESS || rc == 0)
        return rc;
    if (!b->retried)
        retry(b);
    if (!b->eb2)
        return rc;
    left = (int)(end - xfer_now_ms());
    rc = xfer_batch_wait(b->eb2, left > 0 ? left : 0);
    return rc == -XFER_EINPROGRESS || !b->first_other ? rc : b->first_other;
}

int xfer_node_batch_cancel(xfer_node_batch *b)
{
    if (!b)
        return -XFER_EINVAL;
    int rc = xfer_batch_cancel(b->eb);
    if (b->eb2) {
        int rc2 = xfer_batch_cancel(b->eb2);
        rc = rc ? rc : rc2;
    }
    return rc;
}

/* Which engine batch and index item i's latest run is in. */
static const xfer_batch *where(const xfer_node_batch *b, size_t *i)
{
    if (b->eb2 && b->retry_idx && b->retry_idx[*i] >= 0) {
        *i = (size_t)b->retry_idx[*i];
        return b->eb2;
    }
    return b->eb;
}

static const struct nb_ref *failed_ref(const xfer_node_batch *b, size_t i)
{
    uint32_t ri = b->item_ref[i];
    if (!b->retried || ri >= b->nrefs || !b->refs[ri].rrc)
        return NULL;
    return xfer_batch_item_status(b->eb, i) ? &b->refs[ri] : NULL;
}

int xfer_node_batch_item_status(const xfer_node_batch *b, size_t i)
{
    if (!b || i >= b->nitems)
        return -XFER_ENOENT;
    const struct nb_ref *r = failed_ref(b, i);
    if (r)
        return r->rrc;
    const xfer_batch *eb = where(b, &i);
    return xfer_batch_item_status(eb, i);
}

const char *xfer_node_batch_item_error(const xfer_node_batch *b, size_t i)
{
    if (!b || i >= b->nitems)
        return "no such item";
    const struct nb_ref *r = failed_ref(b, i);
    if (r)
        return r->why;
    size_t k = i;
    const xfer_batch *eb = where(b, &k);
    const char *why = xfer_batch_item_error(eb, k);
    const char *pw = nb_pool_item_why(b, i, xfer_batch_item_status(eb, k),
                                      xfer_batch_item_failed_segment(eb, k), why);
    return pw ? pw : why;
}

size_t xfer_node_batch_item_segments(const xfer_node_batch *b, size_t i)
{
    if (!b || i >= b->nitems)
        return 0;
    return nb_item_runs(b, i);
}

unsigned xfer_node_batch_item_transport(const xfer_node_batch *b, size_t i)
{
    if (!b || i >= b->nitems)
        return 0;
    const xfer_batch *eb = where(b, &i);
    return xfer_batch_item_transport(eb, i);
}
