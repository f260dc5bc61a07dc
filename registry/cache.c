/* Local cache of nodes and regions (node id -> node + its regions). Entries
 * are trusted while the watcher is subscribed (events invalidate them), and
 * for cache_max_age_ms otherwise; stale entries are still served when Redis
 * is unreachable. A node whose incarnation changed loses its cached regions
 * and a RESTARTED event is emitted. */
#include <stdlib.h>
#include <string.h>

#include "reg_internal.h"

static void free_cached_node(void *v)
{
    struct reg_cached_node *n = v;
    strmap_clear(&n->regions, free);
    free(n);
}

void reg_cache_free(xfer_registry *r)
{
    strmap_clear(&r->cache, free_cached_node);
}

void xfer_registry_cache_clear(xfer_registry *r)
{
    pthread_mutex_lock(&r->cache_lock);
    reg_cache_free(r);
    pthread_mutex_unlock(&r->cache_lock);
}

static bool fresh(const xfer_registry *r, bool stale, uint64_t fetched_ms)
{
    if (stale)
        return false;
    if (atomic_load(&r->subscribed))
        return true;
    return reg_now_ms() - fetched_ms <= (uint64_t)r->cfg.cache_max_age_ms;
}

static void mark_region_stale(const char *k, void *v, void *arg)
{
    (void)k, (void)arg;
    ((struct reg_cached_region *)v)->stale = true;
}

static void mark_node_stale(const char *k, void *v, void *arg)
{
    (void)k, (void)arg;
    struct reg_cached_node *n = v;
    n->stale = true;
    strmap_foreach(&n->regions, mark_region_stale, NULL);
}

void reg_cache_mark_all_stale(xfer_registry *r)
{
    pthread_mutex_lock(&r->cache_lock);
    strmap_foreach(&r->cache, mark_node_stale, NULL);
    pthread_mutex_unlock(&r->cache_lock);
}

void reg_cache_mark_node_stale(xfer_registry *r, const char *node, bool *was_cached)
{
    pthread_mutex_lock(&r->cache_lock);
    struct reg_cached_node *n = strmap_get(&r->cache, node);
    if (n)
        n->stale = true;
    *was_cached = n != NULL;
    pthread_mutex_unlock(&r->cache_lock);
}

void reg_cache_drop_node(xfer_registry *r, const char *node)
{
    pthread_mutex_lock(&r->cache_lock);
    struct reg_cached_node *n = strmap_del(&r->cache, node);
    pthread_mutex_unlock(&r->cache_lock);
    if (n)
        free_cached_node(n);
}

void reg_cache_drop_region(xfer_registry *r, const char *node, const char *name)
{
    pthread_mutex_lock(&r->cache_lock);
    struct reg_cached_node *n = strmap_get(&r->cache, node);
    free(n ? strmap_del(&n->regions, name) : NULL);
    pthread_mutex_unlock(&r->cache_lock);
}

/* Caches a node just read from Redis; emits RESTARTED when its incarnation
 * differs from the cached one (whose regions are then dropped). */
void reg_cache_store_node(xfer_registry *r, const struct xfer_node_desc *d)
{
    uint64_t old = 0;
    pthread_mutex_lock(&r->cache_lock);
    struct reg_cached_node *n = strmap_get(&r->cache, d->peer.node_id);
    if (!n && (n = calloc(1, sizeof(*n)))) {
        strmap_init(&n->regions);
        if (strmap_put(&r->cache, d->peer.node_id, n, NULL)) {
            free(n);
            n = NULL;
        }
        if (n)
            n->desc = *d;
    }
    if (n && n->desc.peer.incarnation != d->peer.incarnation) {
        old = n->desc.peer.incarnation;
        strmap_clear(&n->regions, free);
    }
    if (n) {
        n->desc = *d;
        n->fetched_ms = reg_now_ms();
        n->stale = false;
    }
    pthread_mutex_unlock(&r->cache_lock);
    if (!old)
        return;
    xfer_info("registry: node %s restarted (incarnation %llu -> %llu), dropped its cached regions",
              d->peer.node_id, (unsigned long long)old, (unsigned long long)d->peer.incarnation);
    struct xfer_registry_event ev = {.type = XFER_REG_EV_RESTARTED,
                                     .node = d->peer.node_id,
                                     .old_incarnation = old,
                                     .new_incarnation = d->peer.incarnation};
    reg_emit(r, &ev);
}

/* Caches regions of a node, only if the cached node has incarnation inc. */
void reg_cache_store_regions(xfer_registry *r, const char *node, uint64_t inc,
                                const struct xfer_region_desc *v, size_t n)
{
    pthread_mutex_lock(&r->cache_lock);
    struct reg_cached_node *cn = strmap_get(&r->cache, node);
    for (size_t i = 0; cn && cn->desc.peer.incarnation == inc && i < n; i++) {
        struct reg_cached_region *c = strmap_get(&cn->regions, v[i].name);
        if (!c && (c = malloc(sizeof(*c))) && strmap_put(&cn->regions, v[i].name, c, NULL)) {
            free(c);
            c = NULL;
        }
        if (c) {
            c->desc = v[i];
            c->fetched_ms = reg_now_ms();
            c->stale = false;
        }
    }
    pthread_mutex_unlock(&r->cache_lock);
}

/* HGETALL of one key under cmd_lock. */
static int hgetall(xfer_registry *r, const char *key, redisReply **rep)
{
    const char *argv[] = {"HGETALL", key};
    pthread_mutex_lock(&r->cmd_lock);
    int rc = reg_cmd(r, rep, 2, argv, NULL);
    pthread_mutex_unlock(&r->cmd_lock);
    if (!rc && (rc = reg_reply_check(*rep, "HGETALL"))) {
        freeReplyObject(*rep);
        *rep = NULL;
    }
    return rc;
}

int xfer_registry_fetch_node(xfer_registry *r, const char *node_id, struct xfer_node_desc *out)
{
    if (!r || !out || !xfer_registry_name_ok(node_id))
        return reg_set_err(-XFER_EINVAL, "bad node id '%s'", node_id ? node_id : "(null)");
    char key[REG_KEY_MAX];
    redisReply *rep;
    reg_key_node(key, node_id);
    int rc = hgetall(r, key, &rep);
    if (rc)
        return rc;
    rc = reg_parse_node(rep, node_id, out);
    freeReplyObject(rep);
    if (rc == -XFER_ENOENT) {
        reg_cache_drop_node(r, node_id);
        return reg_set_err(-XFER_ENOENT, "unknown node '%s' (no %s in redis)", node_id, key);
    }
    if (rc) {
        xfer_warn("registry: %s", xfer_registry_last_error(r));
        return rc;
    }
    reg_cache_store_node(r, out);
    return 0;
}

int xfer_registry_lookup_node(xfer_registry *r, const char *node_id, struct xfer_node_desc *out)
{
    if (!r || !out || !xfer_registry_name_ok(node_id))
        return reg_set_err(-XFER_EINVAL, "bad node id '%s'", node_id ? node_id : "(null)");
    struct xfer_node_desc old;
    pthread_mutex_lock(&r->cache_lock);
    struct reg_cached_node *n = strmap_get(&r->cache, node_id);
    bool have = n != NULL, ok = n && fresh(r, n->stale, n->fetched_ms);
    if (n)
        old = n->desc;
    pthread_mutex_unlock(&r->cache_lock);
    if (ok) {
        *out = old;
        return 0;
    }
    int rc = xfer_registry_fetch_node(r, node_id, out);
    if (rc == -XFER_EUNAVAIL && have) {
        xfer_debug("registry: serving cached node %s (%s)", node_id, xfer_registry_last_error(r));
        *out = old;
        return 0;
    }
    return rc;
}

/* Region from the cache: 1 = fresh hit, 0 = miss or stale (copy in *old,
 * *have set when present). */
static int cached_region(xfer_registry *r, const char *node_id, const char *name,
                         struct xfer_region_desc *old, bool *have)
{
    int hit = 0;
    pthread_mutex_lock(&r->cache_lock);
    struct reg_cached_node *n = strmap_get(&r->cache, node_id);
    struct reg_cached_region *c = n ? strmap_get(&n->regions, name) : NULL;
    *have = c != NULL;
    if (c) {
        *old = c->desc;
        hit = fresh(r, n->stale, n->fetched_ms) && fresh(r, c->stale, c->fetched_ms);
    }
    pthread_mutex_unlock(&r->cache_lock);
    return hit;
}

int xfer_registry_lookup_region(xfer_registry *r, const char *node_id, const char *name,
                                struct xfer_region_desc *out)
{
    if (!r || !out || !xfer_registry_name_ok(node_id) || !xfer_registry_name_ok(name))
        return reg_set_err(-XFER_EINVAL, "bad node id or region name");
    struct xfer_region_desc old;
    bool have;
    if (cached_region(r, node_id, name, &old, &have)) {
        *out = old;
        return 0;
    }
    struct xfer_node_desc nd;
    int rc = xfer_registry_lookup_node(r, node_id, &nd);
    char key[REG_KEY_MAX];
    redisReply *rep = NULL;
    reg_key_region(key, node_id, name);
    bool read = false;
    if (!rc)
        rc = hgetall(r, key, &rep);
    if (!rc) {
        read = true;
        rc = reg_parse_region(rep, node_id, name, out);
        freeReplyObject(rep);
    }
    if (rc == -XFER_ENOENT && read) {
        reg_cache_drop_region(r, node_id, name);
        return reg_set_err(-XFER_ENOENT, "unknown region '%s' on node '%s'", name, node_id);
    }
    if (rc == -XFER_EUNAVAIL && have) {
        *out = old;
        return 0;
    }
    if (rc == -XFER_EPROTO)
        xfer_warn("registry: %s", xfer_registry_last_error(r));
    if (!rc)
        reg_cache_store_regions(r, node_id, nd.peer.incarnation, out, 1);
    return rc;
}
