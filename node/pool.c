/* KV pools of this node (registration, publication) — filled in below. */
#include "node_int.h"

void node_pools_free(xfer_node *n)
{
    (void)n;
}

void node_rpools_forget(xfer_node *n, const char *node, const char *pool)
{
    (void)n;
    (void)node;
    (void)pool;
}

bool node_region_in_pool(xfer_node *n, const xfer_region *r)
{
    (void)n;
    (void)r;
    return false;
}
