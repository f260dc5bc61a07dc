/*
 * Block-list transfers between KV pools: "my blocks 7, 19, 3 -> blocks 40,
 * 2, 11 of decode-3/kv" over all layers or a layer range. Remote pools are
 * resolved once (pool fields, member region descriptors, a held peer) and
 * cached until an event says they changed. Each pair of regions (a layer's
 * tensor here and there, or its K and V buffers) becomes ONE vectored item
 * (xfer_batch_add_segments) whose segments are the blocks, built straight
 * into the batch's arrays (one growth per call, nothing per block); runs of
 * blocks consecutive on both sides become one segment. ipc moves such an
 * item with one owner round trip and batched GPU copies (docs/engine.md).
 */
#include "node_batch.h"
#include "node_pool.h"
#include "pool_plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct rpool {
    struct rpool *next;
    char node[XFER_NAME_MAX], name[XFER_NAME_MAX];
    struct xfer_kv_geom geom;
    size_t nregions;
    struct xfer_region_desc *rd; /* members, in layout order */
    struct xfer_node_ref ref;    /* the peer, held while cached */
    int users;                   /* add_blocks calls using it (pool_lock) */
    bool dead;                   /* forgotten while in use: the last user frees */
};

static void rpool_free(xfer_node *n, struct rpool *r)
{
    xfer_node_unref(n, &r->ref);
    free(r->rd);
    free(r);
}

void node_rpools_forget(xfer_node *n, const char *node, const char *pool)
{
    struct rpool *gone = NULL;
    pthread_mutex_lock(&n->pool_lock);
    for (struct rpool **pp = &n->rpools; *pp;) {
        struct rpool *r = *pp;
        if ((node && strcmp(r->node, node)) || (pool && strcmp(r->name, pool))) {
            pp = &r->next;
            continue;
        }
        *pp = r->next;
        r->dead = true;
        if (!r->users) {
            r->next = gone;
            gone = r;
        }
    }
    pthread_mutex_unlock(&n->pool_lock);
    while (gone) { /* unref may remove a peer: not under pool_lock */
        struct rpool *r = gone;
        gone = r->next;
        rpool_free(n, r);
    }
}

static void rpool_put(xfer_node *n, struct rpool *r)
{
    pthread_mutex_lock(&n->pool_lock);
    bool last = --r->users == 0 && r->dead;
    pthread_mutex_unlock(&n->pool_lock);
    if (last)
        rpool_free(n, r);
}

/* Reads pool node/name and its members from the registry, holds the peer
 * and caches the members' descriptors in the engine. */
static int rpool_resolve(xfer_node *n, const char *node, const char *name, struct rpool **out)
{
    struct xfer_kv_pool_desc d;
    int rc = xfer_node_pool_lookup(n, node, name, &d);
    if (rc)
        return rc;
    struct rpool *r = calloc(1, sizeof(*r));
    if (!r || !(r->rd = calloc(d.nregions, sizeof(*r->rd)))) {
        free(r);
        xfer_kv_pool_desc_clear(&d);
        return node_err(-XFER_ENOMEM, "out of memory");
    }
    snprintf(r->node, sizeof(r->node), "%s", node);
    snprintf(r->name, sizeof(r->name), "%s", name);
    r->geom = d.geom;
    r->nregions = d.nregions;
    rc = xfer_node_resolve(n, node, NULL, 0, &r->ref);
    for (size_t i = 0; !rc && i < d.nregions; i++) {
        rc = xfer_registry_lookup_region(n->reg, node, d.regions[i], &r->rd[i]);
        if (rc)
            rc = node_err(rc, "pool %s/%s: member %s: %s", node, name, d.regions[i],
                          xfer_registry_last_error(n->reg));
        else if (r->rd[i].len < kv_region_need(&r->geom, i))
            rc = node_err(-XFER_EPROTO, "pool %s/%s: member %s is shorter than its layout", node,
                          name, d.regions[i]);
        else if ((rc = xfer_peer_region_add(r->ref.peer, &r->rd[i])) != 0)
            node_err(rc, "caching %s/%s: %s", node, d.regions[i], xfer_strerror(rc));
    }
    xfer_kv_pool_desc_clear(&d);
    if (rc) {
        rpool_free(n, r);
        return rc;
    }
    *out = r;
    return 0;
}

/* The cached remote pool node/name (resolved on a miss), held: rpool_put. */
static int rpool_get(xfer_node *n, const char *node, const char *name, struct rpool **out)
{
    pthread_mutex_lock(&n->pool_lock);
    struct rpool *r = n->rpools;
    while (r && (strcmp(r->node, node) || strcmp(r->name, name)))
        r = r->next;
    if (r)
        r->users++;
    pthread_mutex_unlock(&n->pool_lock);
    if (r) {
        *out = r;
        return 0;
    }
    int rc = rpool_resolve(n, node, name, &r);
    if (rc)
        return rc;
    r->users = 1;
    pthread_mutex_lock(&n->pool_lock); /* a racing resolve may have cached one too: fine */
    r->next = n->rpools;
    n->rpools = r;
    pthread_mutex_unlock(&n->pool_lock);
    *out = r;
    return 0;
}

const struct xfer_region_desc *plan_remote_member(const struct plan *pl, uint32_t region)
{
    return &pl->rp->rd[region];
}

xfer_peer *plan_remote_peer(const struct plan *pl)
{
    return pl->rp->ref.peer;
}

const struct xfer_kv_geom *plan_remote_geom(const struct plan *pl)
{
    return &pl->rp->geom;
}

static int check_blocks(const struct plan *pl)
{
    for (size_t i = 0; i < pl->nb; i++) {
        if (pl->lb[i] >= pl->lp->geom.num_blocks)
            return node_err(-XFER_ERANGE, "block %llu (entry %zu) is past pool %s's %llu blocks",
                            (unsigned long long)pl->lb[i], i, pl->lp->name,
                            (unsigned long long)pl->lp->geom.num_blocks);
        if (pl->rb[i] >= pl->rp->geom.num_blocks)
            return node_err(-XFER_ERANGE, "block %llu (entry %zu) is past pool %s/%s's %llu blocks",
                            (unsigned long long)pl->rb[i], i, pl->rp->node, pl->rp->name,
                            (unsigned long long)pl->rp->geom.num_blocks);
    }
    return 0;
}

static int check_access(const struct plan *pl)
{
    unsigned need = pl->op == XFER_OP_READ ? XFER_ACCESS_R : XFER_ACCESS_W;
    for (size_t i = 0; i < pl->rp->nregions; i++)
        if (!(pl->rp->rd[i].access & need))
            return node_err(-XFER_EACCES, "pool %s/%s: member %s is not %s", pl->rp->node,
                            pl->rp->name, pl->rp->rd[i].name,
                            need == XFER_ACCESS_R ? "readable" : "writable");
    return 0;
}

/* Appends the segments of one stream: block i of the list at lbase + lb[i] *
 * lstride locally and rbase + rb[i] * rstride remotely, seg bytes each;
 * neighbours adjacent on both sides merge. The stream joins the last item
 * of this call (from `first` on) when that one moves between the same two
 * regions (the K and V halves of one layer tensor), else starts one. */
static void emit_stream(xfer_node_batch *b, const struct plan *pl, xfer_region *local,
                        const struct xfer_region_desc *rd, const struct kv_stream *ls,
                        const struct kv_stream *rs, uint64_t seg, size_t first)
{
    size_t k = b->nitems - 1;
    struct xfer_seg *s = NULL;
    if (b->nitems > first && b->items[k].local == local && b->items[k].remote_id == rd->id)
        s = &b->segs[b->nsegs - 1];
    for (size_t i = 0; i < pl->nb; i++) {
        uint64_t lo = ls->base + pl->lb[i] * ls->stride, ro = rs->base + pl->rb[i] * rs->stride;
        if (s && s->local_off + s->len == lo && s->remote_off + s->len == ro) {
            s->len += seg;
            continue;
        }
        if (!s || b->nseg[k] == XFER_SEGS_MAX) { /* a new vectored item */
            k = b->nitems++;
            b->item_ref[k] = pl->ref;
            b->seg0[k] = b->nsegs;
            b->nseg[k] = 0;
            b->blk[k] = 0;
            b->items[k] = (struct xfer_item){.op = pl->op,
                                             .local = local,
                                             .peer = pl->rp->ref.peer,
                                             .remote_id = rd->id,
                                             .remote_gen = rd->gen};
        }
        s = &b->segs[b->nsegs++];
        *s = (struct xfer_seg){lo, ro, seg};
        b->nseg[k]++;
    }
}

/* XFER_POOL_VECTORED=0: one plain item per block run (the path before
 * vectored items; kept to compare against and as a fallback). */
static bool vectored_off(void)
{
    static int off = -1;
    if (off < 0) {
        const char *e = getenv("XFER_POOL_VECTORED");
        __atomic_store_n(&off, e && !strcmp(e, "0"), __ATOMIC_RELAXED);
    }
    return off;
}

/* Turns the vectored items [first, nitems) into one plain item per segment
 * (room reserved by the caller), in place from the back. */
static void unvector(xfer_node_batch *b, size_t first, size_t first_seg)
{
    size_t n = first + (b->nsegs - first_seg), dst = n;
    for (size_t i = b->nitems; i-- > first;)
        for (uint32_t k = b->nseg[i]; k-- > 0;) {
            const struct xfer_seg *s = &b->segs[b->seg0[i] + k];
            struct xfer_item it = b->items[i];
            it.local_off = s->local_off;
            it.remote_off = s->remote_off;
            it.len = s->len;
            dst--;
            b->item_ref[dst] = b->item_ref[i];
            b->items[dst] = it;
            b->nseg[dst] = 0;
            b->blk[dst] = 0;
        }
    b->nitems = n;
    b->nsegs = first_seg;
}

void plan_streams(const struct plan *pl, struct plan_streams *ps)
{
    const struct xfer_kv_geom *lg = &pl->lp->geom, *rg = &pl->rp->geom;
    bool both_bm = lg->layout == XFER_KV_BLOCK_MAJOR && rg->layout == XFER_KV_BLOCK_MAJOR;
    bool halves = kv_halves_adjacent(lg) && kv_halves_adjacent(rg);
    ps->halves = halves ? 1 : lg->kv;
    ps->layers = both_bm ? 1 : pl->nl;
    ps->seg = (halves ? lg->kv : 1) * lg->block_bytes * (both_bm ? pl->nl : 1);
}

/* Streams: per layer and half, or per layer (halves adjacent on both
 * sides), or one for the whole layer range (both block-major). */
static void emit_all(xfer_node_batch *b, const struct plan *pl, size_t first)
{
    struct plan_streams ps;
    plan_streams(pl, &ps);
    for (uint32_t l = pl->l0; l < pl->l0 + ps.layers; l++)
        for (uint32_t h = 0; h < ps.halves; h++) {
            struct kv_stream ls, rs;
            kv_stream_of(&pl->lp->geom, l, h, &ls);
            kv_stream_of(&pl->rp->geom, l, h, &rs);
            emit_stream(b, pl, pl->lp->regions[ls.region], &pl->rp->rd[rs.region], &ls, &rs, ps.seg,
                        first);
        }
}

void nb_spans_clear(xfer_node_batch *b)
{
    for (size_t i = 0; i < b->nspans; i++)
        free(b->spans[i].ids);
    b->nspans = 0;
}

/* Remembers which pool items [first, nitems) address (one record per call,
 * nothing per block), so a refusal can name the blocks. */
static int span_add(xfer_node_batch *b, const struct rpool *rp, size_t first)
{
    if (b->nspans == b->capspans) {
        size_t cap = b->capspans ? 2 * b->capspans : 4;
        struct nb_span *v = realloc(b->spans, cap * sizeof(*v));
        if (!v)
            return node_err(-XFER_ENOMEM, "out of memory");
        b->spans = v;
        b->capspans = cap;
    }
    struct nb_span *sp = &b->spans[b->nspans];
    if (!(sp->ids = malloc(rp->nregions * sizeof(*sp->ids))))
        return node_err(-XFER_ENOMEM, "out of memory");
    for (size_t i = 0; i < rp->nregions; i++)
        sp->ids[i] = rp->rd[i].id;
    sp->first = first;
    sp->end = b->nitems;
    snprintf(sp->pool, sizeof(sp->pool), "%s/%s", rp->node, rp->name);
    sp->geom = rp->geom;
    sp->nregions = rp->nregions;
    b->nspans++;
    return 0;
}

const char *nb_pool_item_why(const xfer_node_batch *b, size_t i, int st, int64_t seg,
                             const char *engine_why)
{
    static __thread char buf[400];
    size_t lo = 0, hi = b->nspans;
    while (lo < hi) { /* last span with first <= i */
        size_t mid = lo + (hi - lo) / 2;
        if (b->spans[mid].first <= i)
            lo = mid + 1;
        else
            hi = mid;
    }
    const struct nb_span *sp = lo ? &b->spans[lo - 1] : NULL;
    if (!st || st == -XFER_EINPROGRESS || !sp || i >= sp->end)
        return NULL;
    const struct xfer_item *it = &b->items[i];
    size_t reg = 0;
    while (reg < sp->nregions && sp->ids[reg] != it->remote_id)
        reg++;
    size_t nseg = nb_item_nseg(b, i);
    if (reg == sp->nregions || (!b->nseg[i] && !b->blk[i]))
        return NULL;
    /* the segment that failed the item, else the item's first (its layer) */
    struct xfer_seg sgv = nb_item_seg(b, i, seg >= 0 && (size_t)seg < nseg ? (size_t)seg : 0);
    const struct xfer_seg *sg = &sgv;
    struct kv_loc loc;
    kv_locate(&sp->geom, reg, sg->remote_off, &loc);
    uint64_t n = (sg->len + loc.stride - 1) / loc.stride;
    char blocks[48], half[8] = "";
    if (seg < 0)
        snprintf(blocks, sizeof(blocks), "%zu block runs", nseg);
    else if (n > 1)
        snprintf(blocks, sizeof(blocks), "blocks %llu-%llu", (unsigned long long)loc.block,
                 (unsigned long long)(loc.block + n - 1));
    else
        snprintf(blocks, sizeof(blocks), "block %llu", (unsigned long long)loc.block);
    if (seg >= 0 && sp->geom.kv == 2 && !kv_halves_adjacent(&sp->geom))
        snprintf(half, sizeof(half), ", %s", loc.half ? "V" : "K");
    const char *what =
        st == -XFER_ESTALE
            ? "refused by the owner: no live lease (ended, released or not granted to this "
              "node), or the region was re-registered"
            : (engine_why ? engine_why : xfer_strerror(st));
    snprintf(buf, sizeof(buf), "%s of %s (layer %u%s): %s", blocks, sp->pool, loc.layer, half,
             what);
    return buf;
}

int xfer_node_batch_add_blocks(xfer_node_batch *b, enum xfer_op op, xfer_kv_pool *p,
                               const uint64_t *local_blocks, const char *remote_pool,
                               const uint64_t *remote_blocks, size_t nb, uint32_t first_layer,
                               uint32_t nlayers)
{
    if (!b || !p || !remote_pool || (nb && (!local_blocks || !remote_blocks)) ||
        (op != XFER_OP_READ && op != XFER_OP_WRITE))
        return node_err(-XFER_EINVAL, "bad batch, pool, block lists or op");
    if (b->submitted)
        return node_err(-XFER_EBUSY, "batch was submitted (reset it first)");
    const char *slash = strchr(remote_pool, '/');
    char node[XFER_NAME_MAX], name[XFER_NAME_MAX];
    if (!slash || slash == remote_pool || (size_t)(slash - remote_pool) >= sizeof(node) ||
        strlen(slash + 1) >= sizeof(name) || !slash[1] || strpbrk(slash + 1, "/+#"))
        return node_err(-XFER_EINVAL, "bad pool name '%s' (want NODE/POOL)", remote_pool);
    snprintf(node, sizeof(node), "%.*s", (int)(slash - remote_pool), remote_pool);
    snprintf(name, sizeof(name), "%s", slash + 1);
    if (nlayers == 0)
        nlayers = first_layer < p->geom.layers ? p->geom.layers - first_layer : 0;
    if (first_layer >= p->geom.layers || nlayers > p->geom.layers - first_layer)
        return node_err(-XFER_ERANGE, "layers [%u, +%u) outside pool %s's %u layers", first_layer,
                        nlayers, p->name, p->geom.layers);
    struct rpool *rp;
    int rc = rpool_get(b->n, node, name, &rp);
    if (rc)
        return rc;
    char why[200];
    struct plan pl = {op, p, rp, local_blocks, remote_blocks, nb, first_layer, nlayers, 0};
    if ((rc = xfer_kv_geom_match(&p->geom, &rp->geom, why, sizeof(why))) != 0)
        rc = node_err(rc, "pool %s vs %s: %s", p->name, remote_pool, why);
    if (!rc)
        rc = check_blocks(&pl);
    if (!rc)
        rc = check_access(&pl);
    int ri = rc ? rc : nb_ref(b, node, NULL); /* the batch holds the peer too */
    rc = ri < 0 ? ri : 0;
    if (!rc && b->refs[ri].ref.incarnation != rp->ref.incarnation)
        rc = node_err(-XFER_ESTALE, "node %s restarted since pool %s was resolved: try again", node,
                      name);
    if (rc == -XFER_ESTALE)
        node_rpools_forget(b->n, node, name);
    uint32_t halves =
        kv_halves_adjacent(&p->geom) && kv_halves_adjacent(&rp->geom) ? 1 : p->geom.kv;
    size_t first = b->nitems, first_seg = b->nsegs, segs = (size_t)nlayers * halves * nb;
    size_t first_blk = b->nblks, first_bw = b->nbw;
    bool blocks = !vectored_off() && nb_blocks_wanted(b, rp->ref.peer, nb, segs);
    size_t want = vectored_off() ? segs : segs / XFER_SEGS_MAX + nlayers * halves;
    if (!rc && nb && (rc = nb_reserve(b, want, blocks ? 0 : segs)) == 0) {
        pl.ref = (uint32_t)ri;
        if (blocks)
            rc = nb_emit_blocks(b, &pl);
        else
            emit_all(b, &pl, first);
        if (!rc && vectored_off())
            unvector(b, first, first_seg);
        if (rc || (rc = span_add(b, rp, first)) != 0) {
            b->nitems = first;
            b->nsegs = first_seg;
            b->nblks = first_blk;
            b->nbw = first_bw;
        } else if ((rc = nb_commit(b, first)) != 0)
            free(b->spans[--b->nspans].ids);
    }
    rpool_put(b->n, rp);
    return rc ? rc : (int)(b->nitems - first);
}
