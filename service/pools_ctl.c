/*
 * KV pool requests (node/xfer_node.h "KV pools"): list the pools a node
 * published, create and delete host-memory pools in this xferd, and move
 * blocks between two pools (xfer_node_batch_add_blocks). A pool made here
 * owns its member regions NAME.0 .. NAME.k-1 (allocated, published, and
 * deregistered with it); pools of embedding processes are listed the same.
 */
#include "xfer_io.h"
#include "xferd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define POOL_COPY_MAX_BLOCKS 65536

static Xctl__Pool *pool_msg(struct arena *a, const struct xfer_kv_pool_desc *pd)
{
    Xctl__Pool *m = arena_alloc(a, sizeof(*m));
    char **names = arena_alloc(a, (pd->nregions + 1) * sizeof(*names));
    if (!m || !names)
        return NULL;
    xctl__pool__init(m);
    const struct xfer_kv_geom *g = &pd->geom;
    m->node = arena_strdup(a, pd->node);
    m->name = arena_strdup(a, pd->name);
    m->layout = arena_strdup(a, xfer_kv_layout_name(g->layout));
    m->dtype = arena_strdup(a, g->dtype);
    m->block_bytes = g->block_bytes;
    m->num_blocks = g->num_blocks;
    m->layers = g->layers;
    m->kv = g->kv;
    m->block_tokens = g->block_tokens;
    m->kv_heads = g->kv_heads;
    m->head_dim = g->head_dim;
    m->shard_rank = g->shard_rank;
    m->shard_count = g->shard_count;
    m->tag = arena_strdup(a, g->tag);
    for (size_t i = 0; i < pd->nregions; i++)
        names[i] = arena_strdup(a, pd->regions[i]);
    m->n_regions = pd->nregions;
    m->regions = names;
    return m;
}

void xferd_do_pools(struct xferd *d, const char *node, Xctl__Response *resp, struct arena *a)
{
    struct xfer_node_desc nd;
    if (strcmp(node, d->cfg.node) && xfer_registry_lookup_node(d->reg, node, &nd)) {
        xferd_fail(resp, a, -XFER_ENOENT, "unknown node %s (not in the registry)", node);
        return;
    }
    struct xfer_kv_pool_desc *v = NULL;
    size_t n = 0;
    int rc = xfer_node_pool_list(d->node, node, &v, &n);
    if (rc) {
        xferd_fail(resp, a, rc, "%s", xfer_node_last_error(d->node));
        return;
    }
    Xctl__PoolList *pl = arena_alloc(a, sizeof(*pl));
    Xctl__Pool **arr = arena_alloc(a, (n + 1) * sizeof(*arr));
    for (size_t i = 0; pl && arr && i < n; i++)
        arr[i] = pool_msg(a, &v[i]);
    for (size_t i = 0; i < n; i++)
        xfer_kv_pool_desc_clear(&v[i]);
    free(v);
    if (!pl || !arr)
        return;
    xctl__pool_list__init(pl);
    pl->n_pools = n;
    pl->pools = arr;
    resp->body_case = XCTL__RESPONSE__BODY_POOLS;
    resp->pools = pl;
}

static int geom_from_msg(const Xctl__Pool *m, struct xfer_kv_geom *g, char *why, size_t wl)
{
    memset(g, 0, sizeof(*g));
    if (xfer_kv_layout_parse(m->layout ? m->layout : "", &g->layout)) {
        snprintf(why, wl, "layout: '%s' (block_major, vllm_fa, flashinfer, sglang or mla)",
                 m->layout ? m->layout : "");
        return -XFER_EINVAL;
    }
    if (!m->dtype || strlen(m->dtype) >= sizeof(g->dtype) || !m->tag ||
        strlen(m->tag) >= sizeof(g->tag)) {
        snprintf(why, wl, "dtype or tag: too long");
        return -XFER_EINVAL;
    }
    strcpy(g->dtype, m->dtype);
    strcpy(g->tag, m->tag);
    g->block_bytes = m->block_bytes;
    g->num_blocks = m->num_blocks;
    g->layers = m->layers;
    g->kv = m->kv;
    g->block_tokens = m->block_tokens;
    g->kv_heads = m->kv_heads;
    g->head_dim = m->head_dim;
    g->shard_rank = m->shard_rank;
    g->shard_count = m->shard_count ? m->shard_count : 1;
    return xfer_kv_geom_check(g, why, wl);
}

static void add_host_bytes(const struct xfer_region_desc *rd, void *arg)
{
    if (rd->kind == XFER_MEM_HOST)
        *(uint64_t *)arg += rd->len;
}

/* Removes member regions 0..n-1 of pool name (caller holds region_lock). */
static void drop_members(struct xferd *d, const char *name, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char rn[XFER_NAME_MAX];
        snprintf(rn, sizeof(rn), "%s.%zu", name, i);
        xfer_region *r = xfer_region_find(d->eng, rn);
        if (r && xfer_node_region_detach(d->node, r) == 0)
            xfer_node_region_deregister(d->node, r);
    }
}

/* Allocates the members and registers the pool; caller holds region_lock
 * for writing. 0 or an error with why. */
static int create_locked(struct xferd *d, const char *name, const struct xfer_kv_geom *g,
                         unsigned access, char *why, size_t wl)
{
    size_t n = xfer_kv_geom_regions(g);
    uint64_t each = xfer_kv_geom_region_bytes(g), held = 0, limit = d->cfg.max_region_bytes;
    if (xfer_node_pool_find(d->node, name)) {
        snprintf(why, wl, "pool %s exists already", name);
        return -XFER_EEXIST;
    }
    if (limit)
        xfer_region_foreach(d->eng, add_host_bytes, &held);
    if (limit && (each > limit / n || each * n > limit - (held < limit ? held : limit))) {
        snprintf(why, wl,
                 "pool %s: %zu regions of %llu bytes would take this node's regions past "
                 "max_region_bytes (%llu bytes, %llu held)",
                 name, n, (unsigned long long)each, (unsigned long long)limit,
                 (unsigned long long)held);
        return -XFER_ENOSPC;
    }
    xfer_region **r = calloc(n, sizeof(*r));
    if (!r) {
        snprintf(why, wl, "out of memory");
        return -XFER_ENOMEM;
    }
    int rc = 0;
    size_t made = 0;
    for (; !rc && made < n; made++) {
        char rn[XFER_NAME_MAX];
        snprintf(rn, sizeof(rn), "%s.%zu", name, made);
        if (xfer_region_find(d->eng, rn)) {
            snprintf(why, wl, "region %s exists already (a pool's members are NAME.0, NAME.1, ...)",
                     rn);
            rc = -XFER_EEXIST;
            break;
        }
        if ((rc = xfer_node_region_alloc(d->node, rn, each, access, &r[made])) != 0) {
            snprintf(why, wl, "%s", xfer_node_last_error(d->node));
            break;
        }
    }
    if (!rc && (rc = xfer_node_pool_register(d->node, name, g, r, n, NULL)) != 0)
        snprintf(why, wl, "%s", xfer_node_last_error(d->node));
    if (rc)
        drop_members(d, name, made);
    free(r);
    return rc;
}

int xferd_pool_create(struct xferd *d, const char *name, const struct xfer_kv_geom *g,
                      unsigned access, char *why, size_t wl)
{
    pthread_rwlock_wrlock(&d->region_lock);
    int rc = create_locked(d, name, g, access, why, wl);
    pthread_rwlock_unlock(&d->region_lock);
    if (!rc)
        xfer_info("pool %s created (%s, %zu regions)", name, xfer_kv_layout_name(g->layout),
                  xfer_kv_geom_regions(g));
    return rc;
}

void xferd_do_pool_create(struct xferd *d, const Xctl__CreatePool *m, Xctl__Response *resp,
                          struct arena *a)
{
    char why[300];
    struct xfer_kv_geom g;
    unsigned access = XFER_ACCESS_RW;
    const Xctl__Pool *pm = m->pool;
    if (!pm || !pm->name || !xfer_registry_name_ok(pm->name) || strpbrk(pm->name, "/+#,.") ||
        pm->name[0] == XFERD_PRIVATE_PREFIX) {
        xferd_fail(resp, a, -XFER_EINVAL, "bad pool name '%s'", pm && pm->name ? pm->name : "");
        return;
    }
    if (m->access && *m->access && xfer_access_parse(m->access, &access)) {
        xferd_fail(resp, a, -XFER_EINVAL, "bad access '%s' (want r, w or rw)", m->access);
        return;
    }
    if (geom_from_msg(pm, &g, why, sizeof(why))) {
        xferd_fail(resp, a, -XFER_EINVAL, "pool %s: %s", pm->name, why);
        return;
    }
    int rc = xferd_pool_create(d, pm->name, &g, access, why, sizeof(why));
    if (rc) {
        xferd_fail(resp, a, rc, "%s", why);
        return;
    }

    struct xfer_kv_pool_desc pd = {.geom = g, .nregions = xfer_kv_geom_regions(&g)};
    snprintf(pd.node, sizeof(pd.node), "%s", d->cfg.node);
    snprintf(pd.name, sizeof(pd.name), "%s", pm->name);
    pd.regions = calloc(pd.nregions, XFER_NAME_MAX);
    for (size_t i = 0; pd.regions && i < pd.nregions; i++)
        snprintf(pd.regions[i], XFER_NAME_MAX, "%s.%zu", pm->name, i);
    if (!pd.regions)
        pd.nregions = 0;
    resp->body_case = XCTL__RESPONSE__BODY_POOL;
    resp->pool = pool_msg(a, &pd);
    xfer_kv_pool_desc_clear(&pd);
}

void xferd_do_pool_delete(struct xferd *d, const char *name, Xctl__Response *resp, struct arena *a)
{
    pthread_rwlock_wrlock(&d->region_lock);
    xfer_kv_pool *p = name ? xfer_node_pool_find(d->node, name) : NULL;
    struct xfer_kv_geom g;
    int rc = p ? 0 : -XFER_ENOENT;
    if (p) {
        xfer_kv_pool_geom(p, &g);
        rc = xfer_node_pool_deregister(d->node, p);
    }
    if (!rc)
        drop_members(d, name, xfer_kv_geom_regions(&g));
    pthread_rwlock_unlock(&d->region_lock);
    if (rc)
        xferd_fail(resp, a, rc, "pool-delete '%s': %s", name ? name : "",
                   rc == -XFER_ENOENT ? "no such pool here" : xfer_node_last_error(d->node));
}

/* "node/pool" -> its parts; 0 or -XFER_EINVAL. */
static int pool_addr(const char *s, char *node, char *pool, char *why, size_t wl)
{
    const char *slash = s ? strchr(s, '/') : NULL;
    size_t nl = slash ? (size_t)(slash - s) : 0;
    if (!slash || nl == 0 || nl >= XFER_NAME_MAX || strlen(slash + 1) >= XFER_NAME_MAX) {
        snprintf(why, wl, "bad pool address '%s' (want NODE/POOL)", s ? s : "");
        return -XFER_EINVAL;
    }
    memcpy(node, s, nl);
    node[nl] = 0;
    strcpy(pool, slash + 1);
    if (!xfer_registry_name_ok(node) || !xfer_registry_name_ok(pool) || strpbrk(pool, "/+#,")) {
        snprintf(why, wl, "bad pool address '%s' (want NODE/POOL)", s);
        return -XFER_EINVAL;
    }
    return 0;
}

static void copy_result(struct xferd *d, Xctl__Response *resp, struct arena *a, int items,
                        uint64_t bytes, uint64_t us, unsigned transport)
{
    Xctl__PoolCopyResult *r = arena_alloc(a, sizeof(*r));
    if (!r)
        return;
    char tr[32] = "";
    if (transport)
        xfer_transports_format(transport, tr, sizeof(tr));
    xctl__pool_copy_result__init(r);
    r->executor = arena_strdup(a, d->cfg.node);
    r->items = (uint32_t)items;
    r->bytes = bytes;
    r->elapsed_us = us;
    r->transport = arena_strdup(a, tr);
    resp->body_case = XCTL__RESPONSE__BODY_POOL_COPY;
    resp->pool_copy = r;
}

/* Runs the copy on this node: p is the local pool, remote "node/pool". */
static void copy_here(struct xferd *d, const Xctl__PoolCopy *m, enum xfer_op op, xfer_kv_pool *p,
                      const char *remote, Xctl__Response *resp, struct arena *a)
{
    const uint64_t *lb = op == XFER_OP_WRITE ? m->src_blocks : m->dst_blocks;
    const uint64_t *rb = op == XFER_OP_WRITE ? m->dst_blocks : m->src_blocks;
    int64_t t0 = xfer_now_ms();
    int err = 0;
    xfer_node_batch *b = xfer_node_batch_new(d->node, &err);
    if (!b) {
        xferd_fail(resp, a, err, "cannot create a batch: %s", xfer_strerror(err));
        return;
    }
    int n = xfer_node_batch_add_blocks(b, op, p, lb, remote, rb, m->n_src_blocks, m->first_layer,
                                       m->nlayers);
    int rc = n < 0 ? n : 0;
    if (rc) {
        xferd_fail(resp, a, rc, "%s", xfer_node_last_error(d->node));
        goto out;
    }
    int deadline = m->deadline_ms ? (int)m->deadline_ms : d->cfg.request_timeout_ms;
    rc = xfer_node_batch_submit(b, xferd_clamp_deadline(d, deadline));
    if (!rc)
        rc = xfer_node_batch_wait(b, -1);
    if (rc == -XFER_EINPROGRESS) {
        xfer_node_batch_cancel(b);
        rc = -XFER_ETIMEDOUT;
    }
    if (rc) {
        size_t i = 0, cnt = xfer_node_batch_count(b);
        while (i + 1 < cnt && xfer_node_batch_item_status(b, i) == 0)
            i++;
        const char *e = cnt ? xfer_node_batch_item_error(b, i) : "";
        xferd_fail(resp, a, rc, "%s %s: %s", op == XFER_OP_WRITE ? "write to" : "read from", remote,
                   e && *e ? e : xfer_strerror(rc));
        goto out;
    }
    struct xfer_kv_geom g;
    xfer_kv_pool_geom(p, &g);
    uint64_t nl = m->nlayers ? m->nlayers : g.layers - m->first_layer;
    copy_result(d, resp, a, n, m->n_src_blocks * g.block_bytes * g.kv * nl,
                (uint64_t)(xfer_now_ms() - t0) * 1000, xfer_node_batch_item_transport(b, 0));
out:
    xfer_node_batch_free(b);
}

void xferd_do_pool_copy(struct xferd *d, const Xctl__Request *req, Xctl__Response *resp,
                        struct arena *a)
{
    const Xctl__PoolCopy *m = req->pool_copy;
    char sn[XFER_NAME_MAX], sp[XFER_NAME_MAX], dn[XFER_NAME_MAX], dp[XFER_NAME_MAX], why[200];
    const char *me = d->cfg.node;
    if (pool_addr(m->src, sn, sp, why, sizeof(why)) ||
        pool_addr(m->dst, dn, dp, why, sizeof(why))) {
        xferd_fail(resp, a, -XFER_EINVAL, "%s", why);
        return;
    }
    if (m->n_src_blocks == 0 || m->n_src_blocks != m->n_dst_blocks ||
        m->n_src_blocks > POOL_COPY_MAX_BLOCKS) {
        xferd_fail(resp, a, -XFER_EINVAL,
                   "block lists: %zu source and %zu destination blocks (want the same number, "
                   "1..%d)",
                   m->n_src_blocks, m->n_dst_blocks, POOL_COPY_MAX_BLOCKS);
        return;
    }
    bool own_src = !strcmp(sn, me), own_dst = !strcmp(dn, me);
    if (own_src && own_dst) {
        xferd_fail(resp, a, -XFER_EINVAL,
                   "both pools are on %s: a pool copy moves blocks between two nodes", me);
        return;
    }
    if (!own_src && !own_dst) { /* the owner of the source carries it out */
        xferd_forward_whole(d, sn, req, resp, a);
        return;
    }
    enum xfer_op op = own_src ? XFER_OP_WRITE : XFER_OP_READ;
    const char *local = own_src ? sp : dp;
    pthread_rwlock_rdlock(&d->region_lock); /* members stay registered */
    xfer_kv_pool *p = xfer_node_pool_find(d->node, local);
    if (!p)
        xferd_fail(resp, a, -XFER_ENOENT, "unknown pool %s/%s", me, local);
    else
        copy_here(d, m, op, p, own_src ? m->dst : m->src, resp, a);
    pthread_rwlock_unlock(&d->region_lock);
}
