/* KV pools of this node: registration over registered regions, publication
 * (registry fields from pool_desc.c), and reading other nodes' pools. */
#include "node_pool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void pool_free(struct xfer_kv_pool *p)
{
    if (p)
        free(p->regions);
    free(p);
}

void node_pools_free(xfer_node *n)
{
    while (n->pools) {
        struct xfer_kv_pool *p = n->pools;
        n->pools = p->next;
        pool_free(p);
    }
    node_rpools_forget(n, NULL, NULL);
}

bool node_region_in_pool(xfer_node *n, const xfer_region *r)
{
    bool in = false;
    pthread_mutex_lock(&n->pool_lock);
    for (struct xfer_kv_pool *p = n->pools; p && !in; p = p->next)
        for (size_t i = 0; i < p->nregions && !in; i++)
            in = p->regions[i] == r;
    pthread_mutex_unlock(&n->pool_lock);
    return in;
}

/* Members: published regions of this node, long enough, in layout order. */
static int check_members(const char *name, const struct xfer_kv_geom *g,
                         xfer_region *const *regions, size_t nregions, const char **names,
                         char (*buf)[XFER_NAME_MAX])
{
    size_t want = xfer_kv_geom_regions(g);
    if (nregions != want)
        return node_err(-XFER_EINVAL, "pool %s: layout %s with %u layers has %zu regions, got %zu",
                        name, xfer_kv_layout_name(g->layout), g->layers, want, nregions);
    for (size_t i = 0; i < nregions; i++) {
        struct xfer_region_desc rd;
        if (!regions[i])
            return node_err(-XFER_EINVAL, "pool %s: region %zu missing", name, i);
        xfer_region_describe(regions[i], &rd);
        if (rd.name[0] == '_' || strchr(rd.name, ','))
            return node_err(-XFER_EINVAL, "pool %s: region %s is private or has a ','", name,
                            rd.name);
        if (rd.len < kv_region_need(g, i))
            return node_err(
                -XFER_ERANGE, "pool %s: region %s has %llu bytes, the layout needs %llu", name,
                rd.name, (unsigned long long)rd.len, (unsigned long long)kv_region_need(g, i));
        snprintf(buf[i], XFER_NAME_MAX, "%s", rd.name);
        names[i] = buf[i];
    }
    return 0;
}

static int publish(xfer_node *n, const char *name, const struct xfer_kv_geom *g,
                   const char *const *names, size_t nregions)
{
    struct kv_fields kf;
    if (kv_fields_make(&kf, g, names, nregions))
        return node_err(-XFER_ENOMEM, "out of memory");
    int rc = xfer_registry_publish_pool(n->reg, name, kf.f, KV_FIELDS);
    kv_fields_free(&kf);
    if (rc == -XFER_EUNAVAIL)
        return 0; /* recorded: published on reconnect */
    return rc ? node_err(rc, "publishing pool %s: %s", name, xfer_registry_last_error(n->reg)) : 0;
}

int xfer_node_pool_register(xfer_node *n, const char *name, const struct xfer_kv_geom *g,
                            xfer_region *const *regions, size_t nregions, xfer_kv_pool **out)
{
    char why[160];
    if (!n || !name || !xfer_registry_name_ok(name) || strpbrk(name, "/+#,") || name[0] == '_')
        return node_err(-XFER_EINVAL, "bad pool name '%s'", name ? name : "");
    if (kv_geom_check(g, why, sizeof(why)))
        return node_err(-XFER_EINVAL, "pool %s: %s", name, why);
    struct xfer_kv_pool *p = calloc(1, sizeof(*p));
    const char **names = calloc(nregions ? nregions : 1, sizeof(*names));
    char(*buf)[XFER_NAME_MAX] = calloc(nregions ? nregions : 1, XFER_NAME_MAX);
    int rc = p && names && buf ? 0 : node_err(-XFER_ENOMEM, "out of memory");
    if (!rc)
        rc = check_members(name, g, regions, nregions, names, buf);
    if (!rc && !(p->regions = malloc(nregions * sizeof(*p->regions))))
        rc = node_err(-XFER_ENOMEM, "out of memory");
    for (size_t i = 0; !rc && i < nregions; i++)
        rc = xfer_node_region_publish(n, regions[i]);
    if (!rc) {
        snprintf(p->name, sizeof(p->name), "%s", name);
        p->geom = *g;
        p->nregions = nregions;
        memcpy(p->regions, regions, nregions * sizeof(*regions));
        pthread_mutex_lock(&n->pool_lock);
        for (struct xfer_kv_pool *q = n->pools; q && !rc; q = q->next)
            if (!strcmp(q->name, name))
                rc = node_err(-XFER_EEXIST, "pool %s is registered already", name);
        if (!rc) {
            p->next = n->pools;
            n->pools = p;
        }
        pthread_mutex_unlock(&n->pool_lock);
    }
    if (!rc && (rc = publish(n, name, g, names, nregions)) != 0)
        xfer_node_pool_deregister(n, p);
    else if (rc)
        pool_free(p);
    free(names);
    free(buf);
    if (!rc && out)
        *out = p;
    return rc;
}

int xfer_node_pool_deregister(xfer_node *n, xfer_kv_pool *p)
{
    if (!n || !p)
        return node_err(-XFER_EINVAL, "no node or pool");
    pthread_mutex_lock(&n->pool_lock);
    struct xfer_kv_pool **pp = &n->pools;
    while (*pp && *pp != p)
        pp = &(*pp)->next;
    bool found = *pp != NULL, leased = found && p->leases > 0;
    if (found && !leased)
        *pp = p->next;
    pthread_mutex_unlock(&n->pool_lock);
    if (!found)
        return node_err(-XFER_ENOENT, "pool not registered on this node");
    if (leased)
        return node_err(-XFER_EBUSY, "pool %s has leases: free them first", p->name);
    for (size_t i = 0; i < p->nregions; i++)
        xfer_region_unguard(p->regions[i]); /* its lease rules go with it */
    int rc = xfer_registry_unpublish_pool(n->reg, p->name);
    if (rc && rc != -XFER_EUNAVAIL && rc != -XFER_ENOENT)
        xfer_warn("unpublishing pool %s: %s", p->name, xfer_registry_last_error(n->reg));
    pool_free(p);
    return 0;
}

xfer_kv_pool *xfer_node_pool_find(xfer_node *n, const char *name)
{
    struct xfer_kv_pool *p = NULL;
    pthread_mutex_lock(&n->pool_lock);
    for (p = n->pools; p && strcmp(p->name, name); p = p->next)
        ;
    pthread_mutex_unlock(&n->pool_lock);
    return p;
}

void xfer_kv_pool_geom(const xfer_kv_pool *p, struct xfer_kv_geom *out)
{
    *out = p->geom;
}

int xfer_node_pool_lookup(xfer_node *n, const char *node, const char *pool,
                          struct xfer_kv_pool_desc *out)
{
    if (!n || !node || !pool || !out)
        return node_err(-XFER_EINVAL, "no node, pool or output");
    memset(out, 0, sizeof(*out));
    snprintf(out->node, sizeof(out->node), "%s", node);
    snprintf(out->name, sizeof(out->name), "%s", pool);
    struct kv_parse kp = {.d = out};
    int rc = xfer_registry_lookup_pool(n->reg, node, pool, kv_desc_field, &kp);
    if (rc == -XFER_ENOENT)
        rc = node_err(rc, "unknown pool %s/%s", node, pool);
    else if (rc)
        rc =
            node_err(rc, "looking up pool %s/%s: %s", node, pool, xfer_registry_last_error(n->reg));
    else
        rc = kv_desc_finish(&kp);
    if (rc)
        xfer_kv_pool_desc_clear(out);
    return rc;
}

int xfer_node_pool_list(xfer_node *n, const char *node, struct xfer_kv_pool_desc **out,
                        size_t *count)
{
    if (!n || !node || !out || !count)
        return node_err(-XFER_EINVAL, "no node or output");
    char(*names)[XFER_NAME_MAX] = NULL;
    size_t k = 0;
    *out = NULL;
    *count = 0;
    int rc = xfer_registry_list_pools(n->reg, node, &names, &k);
    if (rc)
        return node_err(rc, "listing pools of %s: %s", node, xfer_registry_last_error(n->reg));
    struct xfer_kv_pool_desc *v = k ? calloc(k, sizeof(*v)) : NULL;
    if (k && !v)
        rc = node_err(-XFER_ENOMEM, "out of memory");
    size_t m = 0;
    for (size_t i = 0; !rc && i < k; i++) /* a pool gone meanwhile is skipped */
        if (xfer_node_pool_lookup(n, node, names[i], &v[m]) == 0)
            m++;
    free(names);
    if (rc || !m) {
        free(v);
        return rc;
    }
    *out = v;
    *count = m;
    return 0;
}
