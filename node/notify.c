/* Notifications addressed by node name (the engine's, engine/xfer.h): bound
 * to a named batch, or standalone. Received ones are the engine's queue:
 * xfer_notif_poll(xfer_node_engine(n), ...). */
#include "node_batch.h"

#include <stdlib.h>
#include <string.h>

int xfer_node_batch_notify(xfer_node_batch *b, const char *node, const void *msg, size_t len)
{
    if (!b || !node || (!msg && len) || len > XFER_NOTIFY_MAX)
        return node_err(-XFER_EINVAL, "bad notification (at most %u bytes)", XFER_NOTIFY_MAX);
    if (b->submitted)
        return node_err(-XFER_EBUSY, "batch was submitted (reset it first)");
    int ri = nb_ref(b, node, NULL);
    if (ri < 0)
        return ri;
    size_t i = 0;
    while (i < b->nnotifs && b->notifs[i].ref != (uint32_t)ri)
        i++;
    if (i == b->nnotifs) {
        struct nb_notif *v = realloc(b->notifs, (b->nnotifs + 1) * sizeof(*v));
        if (!v)
            return node_err(-XFER_ENOMEM, "out of memory");
        b->notifs = v;
        b->notifs[b->nnotifs++] = (struct nb_notif){.ref = (uint32_t)ri};
    }
    struct nb_notif *nf = &b->notifs[i];
    void *copy = malloc(len ? len : 1);
    if (!copy)
        return node_err(-XFER_ENOMEM, "out of memory");
    memcpy(copy, msg, len);
    int rc = xfer_batch_notify(b->eb, b->refs[ri].ref.peer, msg, len);
    if (rc) {
        free(copy);
        return node_err(rc, "notification for %s: %s", node, xfer_engine_last_error(b->n->eng));
    }
    free(nf->msg);
    nf->msg = copy;
    nf->len = len;
    return 0;
}

int nb_notifs_rebind(xfer_node_batch *b)
{
    for (size_t i = 0; i < b->nnotifs; i++) {
        const struct nb_notif *nf = &b->notifs[i];
        int rc = xfer_batch_notify(b->eb, b->refs[nf->ref].ref.peer, nf->msg, nf->len);
        if (rc)
            return node_err(rc, "notification for %s: %s", b->refs[nf->ref].ref.node,
                            xfer_engine_last_error(b->n->eng));
    }
    return 0;
}

void nb_notifs_clear(xfer_node_batch *b)
{
    for (size_t i = 0; i < b->nnotifs; i++)
        free(b->notifs[i].msg);
    free(b->notifs);
    b->notifs = NULL;
    b->nnotifs = 0;
}

int xfer_node_batch_notify_status(const xfer_node_batch *b, const char *node)
{
    for (size_t i = 0; b && node && i < b->nnotifs; i++) {
        const struct nb_ref *r = &b->refs[b->notifs[i].ref];
        if (!strcmp(r->ref.node, node))
            return xfer_batch_notify_status(b->eb, r->ref.peer);
    }
    return -XFER_ENOENT;
}

int xfer_node_notify(xfer_node *n, const char *node, const void *msg, size_t len, int deadline_ms)
{
    if (!n || !node || (!msg && len) || len > XFER_NOTIFY_MAX)
        return node_err(-XFER_EINVAL, "bad notification (at most %u bytes)", XFER_NOTIFY_MAX);
    struct xfer_node_ref ref;
    int rc = xfer_node_resolve(n, node, NULL, 0, &ref);
    if (rc)
        return rc;
    rc = xfer_notify(n->eng, ref.peer, msg, len, deadline_ms);
    if (rc)
        node_err(rc, "notification for %s: %s", node, xfer_engine_last_error(n->eng));
    xfer_node_unref(n, &ref);
    return rc;
}
