/* Xctl__StatsInfo (control API) -> struct xfer_metrics_snapshot. */
#include "metrics_ctl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void stats_from_msg(const Xctl__Stats *m, struct xfer_stats *st)
{
    memset(st, 0, sizeof(*st));
    if (!m)
        return;
    st->ops_read = m->ops_read;
    st->ops_write = m->ops_write;
    st->bytes_read = m->bytes_read;
    st->bytes_written = m->bytes_written;
    st->errors = m->errors;
    st->served_ops = m->served_ops;
    st->served_bytes = m->served_bytes;
    st->served_errors = m->served_errors;
    st->lat_us_sum = m->lat_us_sum;
    for (size_t i = 0; i < m->n_lat_hist && i < XFER_LAT_BUCKETS; i++)
        st->lat_hist[i] = m->lat_hist[i];
}

static void named_from_msg(const Xctl__NamedStats *m, struct xfer_metrics_named *n)
{
    memset(n, 0, sizeof(*n));
    snprintf(n->name, sizeof(n->name), "%s", m && m->name ? m->name : "");
    stats_from_msg(m ? m->stats : NULL, &n->st);
}

int xfer_metrics_from_stats_msg(const Xctl__StatsInfo *si, struct xfer_metrics_snapshot *out)
{
    if (!si || !out)
        return -XFER_EINVAL;
    memset(out, 0, sizeof(*out));
    snprintf(out->node, sizeof(out->node), "%s", si->node ? si->node : "");
    stats_from_msg(si->total, &out->total);
    if (si->n_peers) {
        out->peers = calloc(si->n_peers, sizeof(*out->peers));
        if (!out->peers)
            return -XFER_ENOMEM;
        for (size_t i = 0; i < si->n_peers; i++)
            named_from_msg(si->peers[i], &out->peers[i]);
        out->npeers = si->n_peers;
    }
    size_t cap = sizeof(out->transports) / sizeof(out->transports[0]);
    for (size_t i = 0; i < si->n_transports && i < cap; i++)
        named_from_msg(si->transports[i], &out->transports[out->ntransports++]);
    return 0;
}
