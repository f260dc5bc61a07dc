/*
 * Forwarding a request to the xferd that must carry it out, over that
 * node's TCP control port (handshake with the cluster secret). Connections
 * are kept in a small idle pool keyed by node and incarnation, so a
 * third-party transfer costs one round trip, not a connect and a handshake.
 */
#include "ctl_client.h"
#include "xferd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FWD_IDLE_MAX 32

struct fwd_conn {
    char node[XFER_NAME_MAX];
    uint64_t incarnation;
    struct ctl_client *c;
    struct fwd_conn *next;
};

/* An idle connection to this incarnation of node, or NULL; connections to
 * an older incarnation are closed on the way. */
static struct ctl_client *pool_take(struct xferd *d, const char *node, uint64_t inc)
{
    struct ctl_client *found = NULL;
    pthread_mutex_lock(&d->fwd_lock);
    for (struct fwd_conn **pp = &d->fwd_idle; *pp;) {
        struct fwd_conn *f = *pp;
        if (strcmp(f->node, node) || (found && f->incarnation == inc)) {
            pp = &f->next;
            continue;
        }
        *pp = f->next;
        d->fwd_nidle--;
        if (f->incarnation == inc)
            found = f->c;
        else
            ctl_close(f->c);
        free(f);
    }
    pthread_mutex_unlock(&d->fwd_lock);
    return found;
}

static void pool_put(struct xferd *d, const char *node, uint64_t inc, struct ctl_client *c)
{
    struct fwd_conn *f = calloc(1, sizeof(*f));
    pthread_mutex_lock(&d->fwd_lock);
    if (f && d->fwd_nidle < FWD_IDLE_MAX && !atomic_load(&d->draining)) {
        snprintf(f->node, sizeof(f->node), "%s", node);
        f->incarnation = inc;
        f->c = c;
        f->next = d->fwd_idle;
        d->fwd_idle = f;
        d->fwd_nidle++;
        f = NULL;
        c = NULL;
    }
    pthread_mutex_unlock(&d->fwd_lock);
    free(f);
    ctl_close(c);
}

void xferd_forward_close_all(struct xferd *d)
{
    pthread_mutex_lock(&d->fwd_lock);
    while (d->fwd_idle) {
        struct fwd_conn *f = d->fwd_idle;
        d->fwd_idle = f->next;
        ctl_close(f->c);
        free(f);
    }
    d->fwd_nidle = 0;
    pthread_mutex_unlock(&d->fwd_lock);
}

static struct ctl_client *fwd_connect(struct xferd *d, const struct xfer_node_desc *nd,
                                      int timeout_ms, int *rc, char *why, size_t wl)
{
    int cto = d->cfg.connect_timeout_ms < timeout_ms ? d->cfg.connect_timeout_ms : timeout_ms;
    return ctl_connect_tcp(nd->peer.addr, nd->ctrl_port, d->cfg.secret, cto, rc, why, wl);
}

int xferd_forward(struct xferd *d, const char *node, const Xctl__Request *req,
                  Xctl__Response **resp, int timeout_ms, char *why, size_t wl)
{
    struct xfer_node_desc nd;
    int rc = xfer_registry_lookup_node(d->reg, node, &nd);
    if (rc) {
        snprintf(why, wl, "%s", xfer_registry_last_error(d->reg));
        return rc;
    }
    if (!nd.ctrl_port) {
        snprintf(why, wl, "node %s has no control port to forward to", node);
        return -XFER_ENOTSUP;
    }
    char cwhy[300] = "";
    Xctl__Request copy = *req;
    struct ctl_client *c = pool_take(d, node, nd.peer.incarnation);
    if (c) {
        rc = ctl_call(c, &copy, -1, timeout_ms, resp, cwhy, sizeof(cwhy));
        if (rc == 0) {
            pool_put(d, node, nd.peer.incarnation, c);
            return 0;
        }
        ctl_close(c); /* went stale while idle (peer restarted, network) */
        if (rc != -XFER_ECONN) {
            snprintf(why, wl, "forwarding to %s: %s", node, cwhy);
            return rc;
        }
    }
    c = fwd_connect(d, &nd, timeout_ms, &rc, cwhy, sizeof(cwhy));
    if (!c) {
        snprintf(why, wl, "forwarding to %s: %s", node, cwhy);
        return rc;
    }
    rc = ctl_call(c, &copy, -1, timeout_ms, resp, cwhy, sizeof(cwhy));
    if (rc) {
        ctl_close(c);
        snprintf(why, wl, "forwarding to %s: %s", node, cwhy);
        return rc;
    }
    pool_put(d, node, nd.peer.incarnation, c);
    return 0;
}
