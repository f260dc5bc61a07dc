/*
 * Registry -> engine: a peer is added to the engine from its registry
 * descriptor the first time a transfer needs it, re-added when its
 * incarnation changes (restarted process), and removed when it leaves.
 * Remote regions are cached into the engine as transfers look them up.
 */
#include "xferd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct peer_use {
    char node[XFER_NAME_MAX];
    int inuse;
    bool doomed; /* left while in use: removed by the last put */
};

/* Caller holds peer_lock. */
static struct peer_use *use_find(struct xferd *d, const char *node, bool create)
{
    for (size_t i = 0; i < d->n_peer_uses; i++)
        if (!strcmp(d->peer_uses[i].node, node))
            return &d->peer_uses[i];
    if (!create)
        return NULL;
    if (d->n_peer_uses == d->cap_peer_uses) {
        size_t cap = d->cap_peer_uses ? d->cap_peer_uses * 2 : 16;
        struct peer_use *v = realloc(d->peer_uses, cap * sizeof(*v));
        if (!v)
            return NULL;
        d->peer_uses = v;
        d->cap_peer_uses = cap;
    }
    struct peer_use *u = &d->peer_uses[d->n_peer_uses++];
    memset(u, 0, sizeof(*u));
    snprintf(u->node, sizeof(u->node), "%s", node);
    return u;
}

static void use_forget(struct xferd *d, struct peer_use *u)
{
    *u = d->peer_uses[--d->n_peer_uses];
}

void xferd_peers_free(struct xferd *d)
{
    free(d->peer_uses);
    d->peer_uses = NULL;
    d->n_peer_uses = d->cap_peer_uses = 0;
}

static int node_error(struct xferd *d, const char *node, int rc, char *why, size_t wl)
{
    if (rc == -XFER_ENOENT)
        snprintf(why, wl, "unknown node '%s'", node);
    else
        snprintf(why, wl, "looking up node '%s': %s", node, xfer_registry_last_error(d->reg));
    return rc;
}

/* Caller holds peer_lock. */
static int peer_ensure(struct xferd *d, const struct xfer_node_desc *nd, xfer_peer **out, char *why,
                       size_t wl)
{
    xfer_peer *p = xfer_peer_find(d->eng, nd->peer.node_id);
    struct xfer_peer_desc cur;
    int rc = 0;
    if (p)
        xfer_peer_describe(p, &cur);
    if (!p || cur.incarnation != nd->peer.incarnation || strcmp(cur.addr, nd->peer.addr) ||
        cur.data_port != nd->peer.data_port) {
        if (p)
            xfer_info("peer %s changed (incarnation %llx -> %llx): reconnecting", nd->peer.node_id,
                      (unsigned long long)cur.incarnation,
                      (unsigned long long)nd->peer.incarnation);
        rc = xfer_peer_add(d->eng, &nd->peer, &p);
    } else if (!xfer_peer_transport(p)) {
        rc = xfer_peer_connect(p);
    }
    if (rc) {
        snprintf(why, wl, "cannot connect to node %s at %s:%u: %s", nd->peer.node_id, nd->peer.addr,
                 nd->peer.data_port, xfer_engine_last_error(d->eng));
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
    struct peer_use *u = use_find(d, node, true);
    rc = u ? peer_ensure(d, &nd, peer, why, wl) : -XFER_ENOMEM;
    if (!rc && region && (rc = xfer_peer_region_add(*peer, rd)) != 0)
        snprintf(why, wl, "caching %s/%s: %s", node, region, xfer_strerror(rc));
    if (!rc) {
        u->inuse++;
        u->doomed = false; /* seen alive in the registry just now */
    } else if (u && !u->inuse) {
        use_forget(d, u);
    }
    pthread_mutex_unlock(&d->peer_lock);
    if (!u)
        snprintf(why, wl, "out of memory");
    return rc;
}

void xferd_peer_put(struct xferd *d, const char *node)
{
    pthread_mutex_lock(&d->peer_lock);
    struct peer_use *u = use_find(d, node, false);
    if (u && --u->inuse <= 0) {
        if (u->doomed) {
            xfer_peer *p = xfer_peer_find(d->eng, node);
            if (p)
                xfer_peer_remove(d->eng, p);
            xfer_info("peer %s removed after its last transfer", node);
        }
        use_forget(d, u);
    }
    pthread_mutex_unlock(&d->peer_lock);
}

static void drop_peer(struct xferd *d, const char *node, const char *why)
{
    pthread_mutex_lock(&d->peer_lock);
    xfer_peer *p = xfer_peer_find(d->eng, node);
    struct peer_use *u = use_find(d, node, false);
    if (p && u && u->inuse) {
        xfer_info("peer %s %s: removing it after %d running transfers", node, why, u->inuse);
        u->doomed = true; /* their batches still point at it */
    } else if (p) {
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
    xferd_known_on_event(d, ev);
    if (ev->node && !strcmp(ev->node, d->cfg.node))
        return;
    switch (ev->type) {
    case XFER_REG_EV_JOIN:
        xfer_info("event: join %s", ev->node);
        break;
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
    case XFER_REG_EV_REGION_ADD:
        xfer_debug("event: region+ %s %s", ev->node, ev->region);
        break;
    case XFER_REG_EV_RESYNC:
        xfer_info("event: registry resync");
        break;
    }
}
