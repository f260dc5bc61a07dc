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
    return reg_now_ms() - fetched_ms < (uint64_t)r->cfg.cache_max_age_ms; /* 0: never */
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

/* HGETALL reply of a node hash -> *out, cached; consumes rep. */
static int node_from_reply(xfer_registry *r, redisReply *rep, const char *node_id,
                           struct xfer_node_desc *out)
{
    int rc = reg_reply_check(rep, "HGETALL");
    if (!rc)
        rc = reg_parse_node(rep, node_id, out);
    freeReplyObject(rep);
    if (rc == -XFER_ENOENT) {
        if (!reg_outage_recent(r)) /* else its owner may just not have rewritten it yet */
            reg_cache_drop_node(r, node_id);
        return reg_set_err(-XFER_ENOENT, "unknown node '%s' (no xfer:node:{%s} in redis)", node_id,
                           node_id);
    }
    if (rc == -XFER_EPROTO)
        xfer_warn("registry: %s", xfer_registry_last_error(r));
    if (!rc)
        reg_cache_store_node(r, out);
    return rc;
}

/* Whether a lookup that failed with rc serves its cached copy (have): Redis
 * unreachable, or the key missing shortly after an outage — a failover
 * longer than the TTL loses the keys of live nodes until they write them
 * again, and a missing key then does not mean the node left (a "leave"
 * event, or the reaper after the outage, still drops it). */
static bool serve_cached(xfer_registry *r, int rc, bool have)
{
    return have && (rc == -XFER_EUNAVAIL || (rc == -XFER_ENOENT && reg_outage_recent(r)));
}

int xfer_registry_fetch_node(xfer_registry *r, const char *node_id, struct xfer_node_desc *out)
{
    if (!r || !out || !xfer_registry_name_ok(node_id))
        return reg_set_err(-XFER_EINVAL, "bad node id '%s'", node_id ? node_id : "(null)");
    char key[REG_KEY_MAX];
    redisReply *rep;
    reg_key_node(key, node_id);
    const char *argv[] = {"HGETALL", key};
    pthread_mutex_lock(&r->cmd_lock);
    int rc = reg_cmd(r, &rep, 2, argv, NULL);
    pthread_mutex_unlock(&r->cmd_lock);
    return rc ? rc : node_from_reply(r, rep, node_id, out);
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
    if (serve_cached(r, rc, have)) {
        xfer_debug("registry: serving cached node %s (%s)", node_id, xfer_registry_last_error(r));
        *out = old;
        return 0;
    }
    return rc;
}

/* Region from the cache: 1 = fresh hit, 0 = miss or stale (copy in *old,
 * *have set when present). */
static int cached_region(xfer_registry *r, const char *node_id, const char *name,
                         struct xfer_region_desc *old, bool *have, uint64_t *fresh_inc)
{
    int hit = 0;
    pthread_mutex_lock(&r->cache_lock);
    struct reg_cached_node *n = strmap_get(&r->cache, node_id);
    struct reg_cached_region *c = n ? strmap_get(&n->regions, name) : NULL;
    bool node_fresh = n && fresh(r, n->stale, n->fetched_ms);
    *fresh_inc = node_fresh ? n->desc.peer.incarnation : 0;
    *have = c != NULL;
    if (c) {
        *old = c->desc;
        hit = node_fresh && fresh(r, c->stale, c->fetched_ms);
    }
    pthread_mutex_unlock(&r->cache_lock);
    return hit;
}

/* Reads the region hash, and the node hash too when the cached node is not
 * fresh (inc == 0), in one round trip. On success *rep is the region's
 * HGETALL reply and *inc the node's incarnation. */
static int fetch_region(xfer_registry *r, const char *node_id, const char *name, uint64_t *inc,
                        redisReply **rep)
{
    char nkey[REG_KEY_MAX], rkey[REG_KEY_MAX];
    reg_key_node(nkey, node_id);
    reg_key_region(rkey, node_id, name);
    const char *node_cmd[] = {"HGETALL", nkey}, *region_cmd[] = {"HGETALL", rkey};
    redisReply *reps[2] = {NULL, NULL};
    bool with_node = *inc == 0;
    pthread_mutex_lock(&r->cmd_lock);
    int rc = reg_conn_ensure(r);
    if (!rc) {
        if (with_node)
            reg_append(r, 2, node_cmd, NULL);
        reg_append(r, 2, region_cmd, NULL);
        rc = reg_read_replies(r, with_node ? 2 : 1, reps);
    }
    pthread_mutex_unlock(&r->cmd_lock);
    if (rc)
        return rc;
    redisReply *region = reps[with_node ? 1 : 0];
    if (with_node) {
        struct xfer_node_desc nd;
        if ((rc = node_from_reply(r, reps[0], node_id, &nd))) {
            freeReplyObject(region);
            return rc;
        }
        *inc = nd.peer.incarnation;
    }
    if ((rc = reg_reply_check(region, "HGETALL"))) {
        freeReplyObject(region);
        return rc;
    }
    *rep = region;
    return 0;
}

int xfer_registry_lookup_region(xfer_registry *r, const char *node_id, const char *name,
                                struct xfer_region_desc *out)
{
    if (!r || !out || !xfer_registry_name_ok(node_id) || !xfer_registry_name_ok(name))
        return reg_set_err(-XFER_EINVAL, "bad node id or region name");
    struct xfer_region_desc old;
    bool have;
    uint64_t inc;
    if (cached_region(r, node_id, name, &old, &have, &inc)) {
        *out = old;
        return 0;
    }
    redisReply *rep;
    int rc = fetch_region(r, node_id, name, &inc, &rep);
    bool fetched = rc == 0;
    if (fetched) {
        rc = reg_parse_region(rep, node_id, name, out);
        freeReplyObject(rep);
        if (rc == -XFER_ENOENT)
            reg_set_err(rc, "unknown region '%s' on node '%s'", name, node_id);
    }
    if (serve_cached(r, rc, have)) {
        xfer_debug("registry: serving cached region %s/%s (%s)", node_id, name,
                   xfer_registry_last_error(r));
        *out = old;
        return 0;
    }
    if (!fetched)
        return rc;
    if (rc == -XFER_ENOENT) {
        reg_cache_drop_region(r, node_id, name);
        return rc;
    }
    if (rc == -XFER_EPROTO)
        xfer_warn("registry: %s", xfer_registry_last_error(r));
    if (!rc)
        reg_cache_store_regions(r, node_id, inc, out, 1);
    return rc;
}
