/*
 * A node of the node library as the test programs (node_lease, node_lib,
 * node_pools) and the KV pool benches (bench_pool, bench_pool_gpu) start
 * one: Redis from $REDIS_URL, the given transports, the other settings
 * from base (NULL: xfer_node_config_init's). NULL with the reason on
 * stderr. Header-only, like node_common.h.
 */
#ifndef XFER_TEST_NODE_ENV_H
#define XFER_TEST_NODE_ENV_H

#include "xfer_node.h"

#include <stdio.h>
#include <stdlib.h>

static inline xfer_node *node_from_env(const char *id, const char *transports,
                                       const struct xfer_node_config *base)
{
    struct xfer_node_config c;
    if (base)
        c = *base;
    else
        xfer_node_config_init(&c);
    c.node_id = id;
    c.redis_url = getenv("REDIS_URL");
    c.transports = transports;
    int err = 0;
    xfer_node *n = xfer_node_new(&c, &err);
    if (!n)
        fprintf(stderr, "node %s: %s (%s)\n", id, xfer_strerror(err), xfer_node_last_error(NULL));
    return n;
}

#endif
