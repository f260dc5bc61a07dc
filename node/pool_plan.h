/* A pool block-list request as pool_xfer.c plans it, shared with
 * pool_blocks.c (which emits it as block items). Not installed. */
#ifndef XFER_NODE_POOL_PLAN_H
#define XFER_NODE_POOL_PLAN_H

#include "node_batch.h"
#include "node_pool.h"

struct rpool;

struct plan {
    enum xfer_op op;
    const xfer_kv_pool *lp;
    const struct rpool *rp;
    const uint64_t *lb, *rb;
    size_t nb;
    uint32_t l0, nl;
    uint32_t ref;
};

/* The streams of a plan: for layers [l0, l0 + layers) and halves
 * [0, halves), kv_stream_of on both geometries; seg bytes per block. */
struct plan_streams {
    uint32_t layers, halves;
    uint64_t seg;
};
void plan_streams(const struct plan *pl, struct plan_streams *ps);

/* The remote pool's member descriptors and held peer (pool_xfer.c). */
const struct xfer_region_desc *plan_remote_member(const struct plan *pl, uint32_t region);
xfer_peer *plan_remote_peer(const struct plan *pl);
const struct xfer_kv_geom *plan_remote_geom(const struct plan *pl);

#endif
