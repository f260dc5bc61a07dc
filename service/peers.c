/*
 * Registry -> engine: a peer is added to the engine from its registry
 * descriptor the first time a transfer needs it, re-added when its
 * incarnation changes (restarted process), and removed when it leaves.
 * Remote regions are cached into the engine as transfers look them up.
 */
#include "xferd.h"

#include <stdio.h>
#include <string.h>

static int node_error(struct xferd *d, const char *node, int rc, char *why, size_t wl)
{
    if (rc == -XFER_ENOENT)
        snprintf(why, wl, "unknown node '%s'", node);
    else
        snprintf(why, wl, "looking up node '%s': %s", node, xfer_registry_last_error(d->reg));
    return rc;
}

/* Caller holds peer_lock. */
static int peer_ensure(struct xferd *d, const struct xfer_node_desc *nd, xfer_peer **out,
                       char *why, size_t wl)
{
    xfer_peer *p = xfer_peer_find(d->eng, nd->peer.node_id);
    struct xfer_peer_desc cur;
    int rc = 0;
    if (p)
        xfer_peer_describe(p, &cur);
    if (!p || cur.incarnation != nd->peer.incarnation || strcmp(cur.addr, nd->peer.addr) ||
        cur.data_port != nd->peer.data_port) {
        if (p)
            xfer_info("peer %s changed (incarnation %llx -> %llx): reconnecting",
                      nd->peer.node_id, (unsigned long long)cur.incarnation,
                      (unsigned long long)nd->peer.incarnation);
        rc = xfer_peer_add(d->eng, &nd->peer, &p);
    } else if (!xfer_peer_transport(p)) {
        rc = xfer_peer_connect(p);
    }
    if (rc) {
        snprintf(why, wl, "cannot connect to node %s at %s:%u: %s", nd->peer.node_id,
                 nd->peer.addr, nd->peer.data_port, xfer_engine_last_error(d->eng));
        return rc;
    }
    *out = p;
    return 0;
}

int xferd_peer_get(struct xferd *d, const char *node, const char *region, xfer_peer **peer,
                   struct xfer_region_desc *rd, char *why, size_t wl)
{
    struct xfer_node_desc nd;
    int rc = xfer_registry_lookup_node(d->reg, node, &nd);
    if (rc)
        return node_error(d, node, rc, why, wl);
    if (region) {
        rc = xfer_registry_lookup_region(d->reg, node, region, rd);
        if (rc == -XFER_ENOENT) {
            snprintf(why, wl, "unknown region %s/%s", node, region);
            return rc;
        }
        if (rc) {
            snprintf(why, wl, "looking up %s/%s: %s", node, region,
                     xfer_registry_last_error(d->reg));
            return rc;
        }
    }
    pthread_mutex_lock(&d->peer_lock);
    rc = peer_ensure(d, &nd, peer, why, wl);
    if (!rc && region && (rc = xfer_peer_region_add(*peer, rd)) != 0)
        snprintf(why, wl, "caching %s/%s: %s", node, region, xfer_strerror(rc));
    pthread_mutex_unlock(&d->peer_lock);
    return rc;
}

static void drop_peer(struct xferd *d, const char *node, const char *why)
{
    pthread_mutex_lock(&d->peer_lock);
    xfer_peer *p = xfer_peer_find(d->eng, node);
    if (p) {
        xfer_info("peer %s %s: dropping its connections", node, why);
        xfer_peer_remove(d->eng, p);
    }
    pthread_mutex_unlock(&d->peer_lock);
}

static void drop_region(struct xferd *d, const char *node, const char *name)
{
    pthread_mutex_lock(&d->peer_lock);
    xfer_peer *p = xfer_peer_find(d->eng, node);
    struct xfer_region_desc rd;
    if (p && xfer_peer_region_lookup(p, name, &rd) == 0)
        xfer_peer_region_remove(p, rd.id);
    pthread_mutex_unlock(&d->peer_lock);
}

void xferd_on_registry_event(const struct xfer_registry_event *ev, void *arg)
{
    struct xferd *d = arg;
    if (ev->node && !strcmp(ev->node, d->cfg.node))
        return;
    switch (ev->type) {
    case XFER_REG_EV_JOIN: xfer_info("event: join %s", ev->node); break;
    case XFER_REG_EV_LEAVE:
        xfer_info("event: leave %s", ev->node);
        drop_peer(d, ev->node, "left");
        break;
    case XFER_REG_EV_RESTARTED:
        xfer_info("event: restarted %s", ev->node);
        drop_peer(d, ev->node, "restarted");
        break;
    case XFER_REG_EV_REGION_DEL:
        xfer_debug("event: region- %s %s", ev->node, ev->region);
        drop_region(d, ev->node, ev->region);
        break;
    case XFER_REG_EV_REGION_ADD: xfer_debug("event: region+ %s %s", ev->node, ev->region); break;
    case XFER_REG_EV_RESYNC: xfer_info("event: registry resync"); break;
    }
}
