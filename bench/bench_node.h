/* A node of the node library for the KV pool benches (bench_pool,
 * bench_pool_gpu): Redis from $REDIS_URL, the given transports; NULL with
 * the reason on stderr. */
#ifndef XFER_BENCH_NODE_H
#define XFER_BENCH_NODE_H

#include "xfer_node.h"

#include <stdio.h>
#include <stdlib.h>

static inline xfer_node *bench_node(const char *id, const char *transports)
{
    struct xfer_node_config c;
    xfer_node_config_init(&c);
    c.node_id = id;
    c.redis_url = getenv("REDIS_URL");
    c.transports = transports;
    int err = 0;
    xfer_node *n = xfer_node_new(&c, &err);
    if (!n)
        fprintf(stderr, "node %s: %s\n", id, xfer_node_last_error(NULL));
    return n;
}

#endif
