/* Notify requests: a standalone notification from this xferd to a named
 * node (node/xfer_node.h xfer_node_notify). Listen is served by the loop
 * thread (ctl_listen.c); bound notifications ride on SubmitBatch
 * (transfer.c). */
#include "xfer_io.h"
#include "xferd.h"

#include <string.h>

void xferd_do_notify(struct xferd *d, const Xctl__Notify *m, Xctl__Response *resp, struct arena *a)
{
    if (!m->node || !*m->node || !xfer_registry_name_ok(m->node)) {
        xferd_fail(resp, a, -XFER_EINVAL, "notify: bad node name '%s'", m->node ? m->node : "");
        return;
    }
    if (!strcmp(m->node, d->cfg.node)) {
        xferd_fail(resp, a, -XFER_EINVAL,
                   "notify: %s is this node (notifications go to another node)", m->node);
        return;
    }
    if (m->text.len > XFER_NOTIFY_MAX) {
        xferd_fail(resp, a, -XFER_EINVAL,
                   "notify: notification of %zu bytes is over the limit (%u bytes)", m->text.len,
                   XFER_NOTIFY_MAX);
        return;
    }
    int deadline =
        xferd_clamp_deadline(d, m->deadline_ms ? (int)m->deadline_ms : d->cfg.request_timeout_ms);
    int rc = xfer_node_notify(d->node, m->node, m->text.data, m->text.len, deadline);
    if (rc)
        xferd_fail(resp, a, rc, "notify %s: %s", m->node, xfer_node_last_error(d->node));
}
