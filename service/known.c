/* Peers this node knows of, for the xfer_registry_known_peers gauge: kept
 * up to date from registry events on the registry thread (a full listing
 * at each RESYNC, which the watcher emits when it (re)subscribes, then
 * join/leave), so a scrape never waits on Redis. */
#include "xferd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static ssize_t known_find(struct xferd *d, const char *node)
{
    for (size_t i = 0; i < d->nknown; i++)
        if (!strcmp(d->known[i], node))
            return (ssize_t)i;
    return -1;
}

static void known_add(struct xferd *d, const char *node)
{
    if (!strcmp(node, d->cfg.node) || known_find(d, node) >= 0)
        return;
    if (d->nknown == d->capknown) {
        size_t cap = d->capknown ? 2 * d->capknown : 16;
        char(*k)[XFER_NAME_MAX] = realloc(d->known, cap * sizeof(*k));
        if (!k)
            return; /* the gauge undercounts until the next resync */
        d->known = k;
        d->capknown = cap;
    }
    snprintf(d->known[d->nknown++], XFER_NAME_MAX, "%s", node);
}

/* The node starts its registry thread before start_node learns the
 * registry, so the first RESYNC (the listing of the nodes that joined
 * before we subscribed, who will send no JOIN) may come before known_reg is
 * set: it is then left to xferd_known_attach. */
static void known_resync(struct xferd *d)
{
    pthread_mutex_lock(&d->known_lock);
    xfer_registry *reg = d->known_reg;
    d->known_due = !reg;
    pthread_mutex_unlock(&d->known_lock);
    struct xfer_node_desc *nodes = NULL;
    size_t n = 0;
    if (!reg || xfer_registry_list_nodes(reg, &nodes, &n))
        return; /* Redis gone again: keep what we knew */
    pthread_mutex_lock(&d->known_lock);
    d->nknown = 0;
    for (size_t i = 0; i < n; i++)
        known_add(d, nodes[i].peer.node_id);
    pthread_mutex_unlock(&d->known_lock);
    free(nodes);
}

/* Called once by start_node with the node's registry (main thread). */
void xferd_known_attach(struct xferd *d, xfer_registry *reg)
{
    pthread_mutex_lock(&d->known_lock);
    d->known_reg = reg;
    bool due = d->known_due;
    pthread_mutex_unlock(&d->known_lock);
    if (due)
        known_resync(d);
}

void xferd_known_on_event(struct xferd *d, const struct xfer_registry_event *ev)
{
    if (ev->type == XFER_REG_EV_RESYNC) {
        known_resync(d);
        return;
    }
    if (ev->type != XFER_REG_EV_JOIN && ev->type != XFER_REG_EV_LEAVE)
        return;
    pthread_mutex_lock(&d->known_lock);
    ssize_t i = known_find(d, ev->node);
    if (ev->type == XFER_REG_EV_JOIN)
        known_add(d, ev->node);
    else if (i >= 0)
        memcpy(d->known[i], d->known[--d->nknown], XFER_NAME_MAX);
    pthread_mutex_unlock(&d->known_lock);
}

uint32_t xferd_known_count(struct xferd *d)
{
    pthread_mutex_lock(&d->known_lock);
    uint32_t n = (uint32_t)d->nknown;
    pthread_mutex_unlock(&d->known_lock);
    return n;
}

void xferd_known_free(struct xferd *d)
{
    free(d->known);
    d->known = NULL;
    d->nknown = d->capknown = 0;
}
