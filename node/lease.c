/*
 * Leases on the blocks of this node's KV pools: blocks x layers x halves
 * become byte ranges of the member regions, and the engine's lease rules
 * (engine/lease.c) refuse, at this node, every access to them by a peer
 * that holds no live lease on them (-XFER_ESTALE). The initiator's node
 * names the refused blocks (batch.c, item errors).
 */
#include "node_pool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct xfer_kv_lease {
    xfer_node *n;
    xfer_kv_pool *p;
    xfer_lease *el;
    char peer[XFER_NAME_MAX];
};

struct lrange { /* one byte range of member region `region` */
    size_t region;
    uint64_t off, len;
};

static int lrange_cmp(const void *a, const void *b)
{
    const struct lrange *x = a, *y = b;
    if (x->region != y->region)
        return x->region < y->region ? -1 : 1;
    return x->off < y->off ? -1 : x->off > y->off;
}

/* The ranges blocks[0..nb) occupy over all layers and halves, sorted by
 * region and offset, adjacent ones merged. *out malloc'ed. */
static int block_ranges(const struct xfer_kv_geom *g, const uint64_t *blocks, size_t nb,
                        struct lrange **out, size_t *count)
{
    for (size_t i = 0; i < nb; i++)
        if (blocks[i] >= g->num_blocks)
            return node_err(-XFER_ERANGE, "block %llu is past the pool's %llu blocks",
                            (unsigned long long)blocks[i], (unsigned long long)g->num_blocks);
    size_t n = nb * g->layers * g->kv, k = 0;
    struct lrange *v = malloc((n ? n : 1) * sizeof(*v));
    if (!v)
        return node_err(-XFER_ENOMEM, "out of memory");
    for (uint32_t l = 0; l < g->layers; l++)
        for (uint32_t h = 0; h < g->kv; h++) {
            struct kv_stream s;
            kv_stream_of(g, l, h, &s);
            for (size_t i = 0; i < nb; i++)
                v[k++] = (struct lrange){s.region, s.base + blocks[i] * s.stride, g->block_bytes};
        }
    qsort(v, n, sizeof(*v), lrange_cmp);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        struct lrange *last = m ? &v[m - 1] : NULL;
        if (last && last->region == v[i].region && v[i].off <= last->off + last->len) {
            uint64_t end = v[i].off + v[i].len;
            if (end > last->off + last->len)
                last->len = end - last->off;
        } else {
            v[m++] = v[i];
        }
    }
    *out = v;
    *count = m;
    return 0;
}

typedef int (*range_fn)(xfer_lease *, xfer_region *, const struct xfer_range *, size_t);

/* Applies fn (add or drop) to the ranges of blocks, one call per region. */
static int apply(struct xfer_kv_lease *l, const uint64_t *blocks, size_t nb, range_fn fn)
{
    struct lrange *v = NULL;
    size_t n = 0;
    int rc = block_ranges(&l->p->geom, blocks, nb, &v, &n);
    if (rc)
        return rc;
    struct xfer_range *r = malloc((n ? n : 1) * sizeof(*r));
    if (!r) {
        free(v);
        return node_err(-XFER_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < n && !rc;) {
        size_t j = i, k = 0;
        for (; j < n && v[j].region == v[i].region; j++)
            r[k++] = (struct xfer_range){v[j].off, v[j].len};
        rc = fn(l->el, l->p->regions[v[i].region], r, k);
        if (rc)
            node_err(rc, "lease of pool %s for %s: %s", l->p->name, l->peer, xfer_strerror(rc));
        i = j;
    }
    free(r);
    free(v);
    return rc;
}

int xfer_node_lease_grant(xfer_node *n, xfer_kv_pool *p, const char *peer_node,
                          const uint64_t *blocks, size_t nb, int ttl_ms, xfer_kv_lease **out)
{
    if (!n || !p || !peer_node || !xfer_registry_name_ok(peer_node) || (nb && !blocks) ||
        ttl_ms <= 0 || !out)
        return node_err(-XFER_EINVAL, "lease: bad node, pool, peer, blocks or ttl");
    struct xfer_kv_lease *l = calloc(1, sizeof(*l));
    int rc = l ? 0 : -XFER_ENOMEM;
    if (l && !(l->el = xfer_lease_new(n->eng, peer_node, ttl_ms, &rc))) {
        free(l);
        l = NULL;
    }
    if (!l)
        return node_err(rc, "lease: %s", xfer_strerror(rc));
    l->n = n;
    l->p = p;
    snprintf(l->peer, sizeof(l->peer), "%s", peer_node);
    pthread_mutex_lock(&n->pool_lock);
    p->leases++;
    pthread_mutex_unlock(&n->pool_lock);
    if ((rc = apply(l, blocks, nb, xfer_lease_add)) != 0) {
        xfer_node_lease_free(l);
        return rc;
    }
    *out = l;
    return 0;
}

int xfer_node_lease_add(xfer_kv_lease *l, const uint64_t *blocks, size_t nb)
{
    if (!l || (nb && !blocks))
        return node_err(-XFER_EINVAL, "lease: bad blocks");
    return apply(l, blocks, nb, xfer_lease_add);
}

int xfer_node_lease_renew(xfer_kv_lease *l, int ttl_ms)
{
    if (!l || ttl_ms <= 0)
        return node_err(-XFER_EINVAL, "lease: bad ttl");
    int rc = xfer_lease_renew(l->el, ttl_ms);
    return rc ? node_err(rc, "lease of pool %s for %s has ended: grant a new one", l->p->name,
                         l->peer)
              : 0;
}

int xfer_node_lease_release(xfer_kv_lease *l, const uint64_t *blocks, size_t nb)
{
    if (!l || (nb && !blocks))
        return node_err(-XFER_EINVAL, "lease: bad blocks");
    if (!blocks) {
        xfer_lease_end(l->el);
        return 0;
    }
    return apply(l, blocks, nb, xfer_lease_drop);
}

bool xfer_node_lease_live(const xfer_kv_lease *l)
{
    return l && xfer_lease_live(l->el);
}

void xfer_node_lease_free(xfer_kv_lease *l)
{
    if (!l)
        return;
    xfer_lease_free(l->el);
    pthread_mutex_lock(&l->n->pool_lock);
    l->p->leases--;
    pthread_mutex_unlock(&l->n->pool_lock);
    free(l);
}
