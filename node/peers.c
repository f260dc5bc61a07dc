/*
 * Registry -> engine peers: a peer is added to the engine from its registry
 * descriptor the first time a ref needs it, re-added when its incarnation
 * changes (restarted process), removed when it leaves. Remote region
 * descriptors are cached into the engine as refs resolve them.
 *
 * peer_lock guards the use table only and is never held across network I/O
 * (issue 18 item 4): connecting and removing happen with the peer's use
 * entry marked busy, so one unreachable peer delays only the callers that
 * need that peer, never the registry thread or transfers to other peers.
 */
#include "xfer_io.h" /* xfer_mono_after_ms */
#include "node_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Caller holds peer_lock. */
static struct peer_use *use_find(xfer_node *n, const char *node, bool create)
{
    for (size_t i = 0; i < n->n_uses; i++)
        if (!strcmp(n->uses[i].node, node))
            return &n->uses[i];
    if (!create)
        return NULL;
    if (n->n_uses == n->cap_uses) {
        size_t cap = n->cap_uses ? n->cap_uses * 2 : 16;
        struct peer_use *v = realloc(n->uses, cap * sizeof(*v));
        if (!v)
            return NULL;
        n->uses = v;
        n->cap_uses = cap;
    }
    struct peer_use *u = &n->uses[n->n_uses++];
    memset(u, 0, sizeof(*u));
    snprintf(u->node, sizeof(u->node), "%s", node);
    return u;
}

/* Caller holds peer_lock; u must be idle. Pointers into uses[] move. */
static void use_forget(xfer_node *n, struct peer_use *u)
{
    *u = n->uses[--n->n_uses];
}

void node_peers_free(xfer_node *n)
{
    free(n->uses);
    n->uses = NULL;
    n->n_uses = n->cap_uses = 0;
}

/* Takes a hold on node and waits (bounded) until nobody else is connecting
 * or removing it; then marks it busy for the caller. Returns with peer_lock
 * released. 0, -XFER_ENOMEM or -XFER_ETIMEDOUT (hold not taken). */
static int hold_busy(xfer_node *n, const char *node)
{
    /* One connect tries each transport once, each bounded by the timeout. */
    struct timespec until = xfer_mono_after_ms(4 * n->connect_timeout_ms + 1000);
    pthread_mutex_lock(&n->peer_lock);
    struct peer_use *u = use_find(n, node, true);
    if (!u) {
        pthread_mutex_unlock(&n->peer_lock);
        return node_err(-XFER_ENOMEM, "out of memory");
    }
    u->inuse++;
    int rc = 0;
    while ((u = use_find(n, node, false))->connecting && rc == 0)
        rc = pthread_cond_timedwait(&n->connected, &n->peer_lock, &until);
    if (u->connecting) {
        pthread_mutex_unlock(&n->peer_lock);
        node_peer_hold_release(n, node);
        return node_err(-XFER_ETIMEDOUT,
                        "node %s: another caller's connection attempt is still "
                        "running",
                        node);
    }
    u->connecting = true;
    pthread_mutex_unlock(&n->peer_lock);
    return 0;
}

/* Ends the busy state; drop: also releases the caller's hold. */
static void busy_end(xfer_node *n, const char *node, bool drop)
{
    pthread_mutex_lock(&n->peer_lock);
    struct peer_use *u = use_find(n, node, false);
    u->connecting = false;
    pthread_cond_broadcast(&n->connected);
    pthread_mutex_unlock(&n->peer_lock);
    if (drop)
        node_peer_hold_release(n, node);
}

/* Removes node's engine peer once nobody holds it: marks the use busy so
 * concurrent resolvers wait, and removes it with peer_lock released. */
static void remove_idle(xfer_node *n, struct peer_use *u)
{
    char node[XFER_NAME_MAX];
    snprintf(node, sizeof(node), "%s", u->node);
    u->connecting = u->removing = true;
    u->doomed = false;
    pthread_mutex_unlock(&n->peer_lock);
    xfer_peer *p = xfer_peer_find(n->eng, node);
    if (p)
        xfer_peer_remove(n->eng, p);
    pthread_mutex_lock(&n->peer_lock);
    u = use_find(n, node, false);
    u->connecting = u->removing = false;
    pthread_cond_broadcast(&n->connected);
    if (!u->inuse)
        use_forget(n, u);
}

void node_peer_hold_release(xfer_node *n, const char *node)
{
    pthread_mutex_lock(&n->peer_lock);
    struct peer_use *u = use_find(n, node, false);
    if (u && --u->inuse <= 0 && !u->connecting) {
        if (u->doomed) {
            xfer_info("peer %s removed after its last transfer", node);
            remove_idle(n, u);
        } else {
            use_forget(n, u);
        }
    }
    pthread_mutex_unlock(&n->peer_lock);
}

/* The caller holds node busy: adds or refreshes the engine peer from nd and
 * connects it when it has no live connection. No lock held. */
static int peer_ensure(xfer_node *n, const struct xfer_node_desc *nd, xfer_peer **out)
{
    xfer_peer *p = xfer_peer_find(n->eng, nd->peer.node_id);
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
        rc = xfer_peer_add(n->eng, &nd->peer, &p);
    } else if (!xfer_peer_transport(p)) {
        rc = xfer_peer_connect(p);
    }
    if (rc)
        return node_err(rc, "cannot connect to node %s at %s:%u: %s", nd->peer.node_id,
                        nd->peer.addr, nd->peer.data_port, xfer_engine_last_error(n->eng));
    *out = p;
    return 0;
}

static int lookup(xfer_node *n, const char *node, const char *region, struct xfer_node_desc *nd,
                  struct xfer_region_desc *rd)
{
    int rc = xfer_registry_lookup_node(n->reg, node, nd);
    if (rc == -XFER_ENOENT)
        return node_err(rc, "unknown node '%s'", node);
    if (rc)
        return node_err(rc, "looking up node '%s': %s", node, xfer_registry_last_error(n->reg));
    if (!region)
        return 0;
    rc = xfer_registry_lookup_region(n->reg, node, region, rd);
    if (rc == -XFER_ENOENT)
        return node_err(rc, "unknown region %s/%s", node, region);
    if (rc)
        return node_err(rc, "looking up %s/%s: %s", node, region, xfer_registry_last_error(n->reg));
    return 0;
}

int xfer_node_resolve(xfer_node *n, const char *node, const char *region, unsigned require,
                      struct xfer_node_ref *out)
{
    if (!n || !node || !out)
        return node_err(-XFER_EINVAL, "no node or name");
    memset(out, 0, sizeof(*out));
    if (!strcmp(node, n->node_id))
        return node_err(-XFER_EINVAL, "%s is this node (not a peer)", node);
    struct xfer_node_desc nd;
    int rc = lookup(n, node, region, &nd, &out->rd);
    if (rc || (rc = hold_busy(n, node)))
        return rc;
    xfer_peer *p = NULL;
    rc = peer_ensure(n, &nd, &p);
    if (!rc && region && (rc = xfer_peer_region_add(p, &out->rd)) != 0)
        node_err(rc, "caching %s/%s: %s", node, region, xfer_strerror(rc));
    if (!rc)
        rc = xfer_node_transport_check(n, p, require, node_err_buf(), NODE_ERR_MAX);
    busy_end(n, node, rc != 0);
    if (rc)
        return rc;
    out->peer = p;
    out->incarnation = nd.peer.incarnation;
    snprintf(out->node, sizeof(out->node), "%s", node);
    return 0;
}

void xfer_node_unref(xfer_node *n, struct xfer_node_ref *ref)
{
    if (!n || !ref || !ref->peer)
        return;
    node_peer_hold_release(n, ref->node);
    ref->peer = NULL;
}

bool xfer_node_peer_restarted(xfer_node *n, const struct xfer_node_ref *ref)
{
    struct xfer_node_desc nd;
    return xfer_registry_fetch_node(n->reg, ref->node, &nd) == 0 &&
           nd.peer.incarnation != ref->incarnation;
}

/* Why bit cannot connect us to peer pd (for the requirement's message). */
static const char *why_not(xfer_node *n, unsigned bit, const struct xfer_peer_desc *self,
                           const struct xfer_peer_desc *pd)
{
    (void)n;
    if (!(self->transports & bit))
        return "not enabled on this node";
    if (!(pd->transports & bit))
        return "not offered by the peer";
    if (bit == XFER_TRANSPORT_IPC && strcmp(self->host_id, pd->host_id))
        return "the peer is on another host (host_id differs)";
    if (bit == XFER_TRANSPORT_RDMA && (!self->nics[0] || !pd->nics[0]))
        return "no RDMA NIC on one side";
    return "the connection was made over another transport";
}

int xfer_node_transport_check(xfer_node *n, xfer_peer *p, unsigned require, char *why, size_t wl)
{
    if (!require)
        require = n->require;
    unsigned t = xfer_peer_transport(p);
    if (!require || (t & require))
        return 0;
    struct xfer_peer_desc self, pd;
    char want[64], got[32] = "none";
    xfer_engine_describe(n->eng, &self);
    xfer_peer_describe(p, &pd);
    xfer_transports_format(require, want, sizeof(want));
    if (t)
        xfer_transports_format(t, got, sizeof(got));
    int len = snprintf(why, wl, "transport requirement not met: %s requires %s, connected over %s",
                       pd.node_id, want, got);
    for (unsigned bit = 1; bit <= XFER_TRANSPORT_ALL && len > 0 && (size_t)len < wl; bit <<= 1) {
        if (!(require & bit))
            continue;
        char name[16];
        xfer_transports_format(bit, name, sizeof(name));
        len += snprintf(why + len, wl - (size_t)len, "; %s: %s", name, why_not(n, bit, &self, &pd));
    }
    return -XFER_ENOTSUP;
}

unsigned xfer_node_peer_transport(xfer_node *n, const char *node)
{
    unsigned t = 0;
    pthread_mutex_lock(&n->peer_lock); /* no removal between find and use */
    struct peer_use *u = use_find(n, node, false);
    xfer_peer *p = u && u->removing ? NULL : xfer_peer_find(n->eng, node);
    if (p)
        t = xfer_peer_transport(p);
    pthread_mutex_unlock(&n->peer_lock);
    return t;
}

/* ---- events --------------------------------------------------------------------- */

static void drop_peer(xfer_node *n, const char *node, const char *why)
{
    pthread_mutex_lock(&n->peer_lock);
    struct peer_use *u = use_find(n, node, false);
    if (u && (u->inuse || u->connecting)) {
        xfer_info("peer %s %s: removing it after %d running transfers", node, why, u->inuse);
        u->doomed = true; /* their batches still point at it */
    } else if (xfer_peer_find(n->eng, node)) {
        xfer_info("peer %s %s: dropping its connections", node, why);
        u = use_find(n, node, true);
        if (u)
            remove_idle(n, u);
    }
    pthread_mutex_unlock(&n->peer_lock);
}

static void drop_region(xfer_node *n, const char *node, const char *name)
{
    xfer_peer *p = NULL;
    pthread_mutex_lock(&n->peer_lock); /* no removal between find and use */
    struct peer_use *u = use_find(n, node, false);
    if (!u || !u->removing)
        p = xfer_peer_find(n->eng, node);
    struct xfer_region_desc rd;
    if (p && xfer_peer_region_lookup(p, name, &rd) == 0)
        xfer_peer_region_remove(p, rd.id);
    pthread_mutex_unlock(&n->peer_lock);
}

void node_on_event(const struct xfer_registry_event *ev, void *arg)
{
    xfer_node *n = arg;
    bool other = ev->node && strcmp(ev->node, n->node_id);
    switch (ev->type) {
    case XFER_REG_EV_JOIN:
        xfer_info("event: join %s", ev->node);
        break;
    case XFER_REG_EV_LEAVE:
    case XFER_REG_EV_RESTARTED:
        if (!other)
            break;
        xfer_info("event: %s %s", ev->type == XFER_REG_EV_LEAVE ? "leave" : "restarted", ev->node);
        node_rpools_forget(n, ev->node, NULL);
        drop_peer(n, ev->node, ev->type == XFER_REG_EV_LEAVE ? "left" : "restarted");
        break;
    case XFER_REG_EV_REGION_DEL:
        xfer_debug("event: region- %s %s", ev->node, ev->region);
        if (other) {
            node_rpools_forget(n, ev->node, NULL); /* a member may be gone */
            drop_region(n, ev->node, ev->region);
        }
        break;
    case XFER_REG_EV_REGION_ADD:
        xfer_debug("event: region+ %s %s", ev->node, ev->region);
        break;
    case XFER_REG_EV_POOL_ADD:
    case XFER_REG_EV_POOL_DEL:
        if (other)
            node_rpools_forget(n, ev->node, ev->region);
        break;
    case XFER_REG_EV_RESYNC:
        xfer_info("event: registry resync");
        node_rpools_forget(n, NULL, NULL);
        break;
    default:
        break;
    }
    if (n->on_event)
        n->on_event(ev, n->event_arg);
}
