/*
 * Prometheus metrics of one node: engine counters (totals, per peer, per
 * transport, latency histograms) and registry state, as the Prometheus text
 * exposition format (version 0.0.4), served over HTTP by libevent's evhttp.
 *
 * Two halves, so the text can be tested without sockets:
 *   snapshot + render: plain data in, text out (no libevent);
 *   xfer_metrics_start/stop: an evhttp server on the caller's event_base
 *   answering GET /metrics with a fresh snapshot each time.
 *
 * Metric names (all counters are cumulative since the process started):
 *   xfer_node_{ops,bytes}_total{op="read|write"}         items this node initiated
 *   xfer_node_errors_total                                items that failed
 *   xfer_node_served_{ops,bytes,errors}_total             requests served as target
 *   xfer_node_op_latency_seconds (histogram)              item latency
 *   xfer_peer_*{peer="<node>"} and xfer_transport_*{transport="tcp|ipc|rdma|tcpx"}:
 *                                                         the same families per peer
 *                                                         and per transport
 *   xfer_peer_transport_info{peer,transport} 1            transport in use per peer
 *   xfer_registry_connected, xfer_registry_known_peers, xfer_regions (gauges)
 *   xfer_up 1, xfer_uptime_seconds, xfer_build_info{node,version} 1
 */
#ifndef XFER_SERVICE_METRICS_H
#define XFER_SERVICE_METRICS_H

#include "xfer.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct event_base;

/* Registry side of the node, filled by the caller's callback on each scrape. */
struct xfer_metrics_registry {
    bool connected;       /* Redis reachable right now */
    uint32_t known_peers; /* other nodes the registry lists */
    uint32_t regions;     /* regions this node publishes */
};
/* Runs on the event loop thread during a scrape; must not block long. */
typedef void (*xfer_metrics_registry_fn)(struct xfer_metrics_registry *out, void *arg);

struct xfer_metrics_named {
    char name[XFER_NAME_MAX];      /* peer node id or transport name */
    char transport[XFER_NAME_MAX]; /* peers only: transport in use, "" if none */
    struct xfer_stats st;
};

struct xfer_metrics_snapshot {
    char node[XFER_NAME_MAX];
    bool live; /* taken by the serving xferd: adds xfer_up, uptime */
    uint64_t uptime_ms;
    bool have_registry;
    struct xfer_metrics_registry reg;
    struct xfer_stats total;
    struct xfer_metrics_named *peers; /* malloc'd, npeers entries */
    size_t npeers;
    struct xfer_metrics_named transports[4];
    size_t ntransports;
};

/* Reads the engine's counters into s (zeroed first). e may be NULL (all
 * zero). Free with xfer_metrics_snapshot_clear(). */
int xfer_metrics_snapshot_take(xfer_engine *e, struct xfer_metrics_snapshot *s);
void xfer_metrics_snapshot_clear(struct xfer_metrics_snapshot *s);

/* Prometheus text of s into *out (malloc'd, NUL-terminated, caller frees);
 * *len (if not NULL) gets its length. */
int xfer_metrics_render(const struct xfer_metrics_snapshot *s, char **out, size_t *len);

/* ---- HTTP server ---------------------------------------------------------- */
struct xfer_metrics;

struct xfer_metrics_config {
    const char *addr;                     /* listen address, default "0.0.0.0" */
    uint16_t port;                        /* 0 = ephemeral (read it back with _port()) */
    const char *node;                     /* node id shown in xfer_build_info; copied */
    xfer_engine *engine;                  /* borrowed; must outlive the server */
    xfer_metrics_registry_fn registry_fn; /* may be NULL */
    void *registry_arg;
};

/* Starts serving GET /metrics on base (the caller runs the loop). Returns
 * NULL with *err set (-XFER_EINVAL, -XFER_EBUSY address in use, ...). */
struct xfer_metrics *xfer_metrics_start(struct event_base *base,
                                        const struct xfer_metrics_config *cfg, int *err);
uint16_t xfer_metrics_port(const struct xfer_metrics *m);
/* Closes the listener and any open scrape connections; accepts NULL. Call
 * on the loop thread (or with the loop stopped). */
void xfer_metrics_stop(struct xfer_metrics *m);

#endif
