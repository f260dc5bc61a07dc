/* Bridge from the control API's stats message to a metrics snapshot, so
 * `xferctl stats --prometheus` prints the text /metrics serves, made by the
 * same renderer (metrics_text.c). */
#ifndef XFER_SERVICE_METRICS_CTL_H
#define XFER_SERVICE_METRICS_CTL_H

#include "metrics.h"
#include "proto/control.pb-c.h"

/* Fills out from si (peers malloc'd: free with xfer_metrics_snapshot_clear).
 * No registry or uptime data travels in the message: those stay unset. */
int xfer_metrics_from_stats_msg(const Xctl__StatsInfo *si, struct xfer_metrics_snapshot *out);

#endif
