/*
 * KV block transfers: "blocks 7, 19, 3 of region kv" on both sides, turned
 * into ordinary batch items, one per run of blocks consecutive on both sides.
 * Items are the form every transport already moves (tcp stages GPU memory,
 * ipc copies with the copy engine or batched kernels), so block transfers
 * work for host and CUDA regions over every transport.
 *
 * Layout (the same blocks xferctl's NODE/REGION#B addresses): block i is
 * block_bytes * max(layers, 1) contiguous bytes at offset i * that.
 */
#include "internal.h"

#include <stdio.h>
#include <string.h>

uint64_t xfer_layout_block_size(const struct xfer_layout *l)
{
    if (!l || l->block_bytes == 0)
        return 0;
    uint64_t layers = l->layers ? l->layers : 1;
    return l->block_bytes > UINT64_MAX / layers ? 0 : l->block_bytes * layers;
}

int xfer_layouts_match(const struct xfer_layout *a, const struct xfer_layout *b, char *why,
                       size_t why_len)
{
    char dummy[8];
    if (!why) {
        why = dummy;
        why_len = sizeof(dummy);
    }
    if (!a || !b || !xfer_layout_block_size(a) || !xfer_layout_block_size(b)) {
        snprintf(why, why_len, "block transfer on a region without a layout");
        return -XFER_EMISMATCH;
    }
    if (strncmp(a->dtype, b->dtype, XFER_DTYPE_MAX)) {
        snprintf(why, why_len, "layouts disagree: dtype %.15s vs %.15s", a->dtype, b->dtype);
        return -XFER_EMISMATCH;
    }
    if (a->block_bytes != b->block_bytes || a->layers != b->layers) {
        snprintf(why, why_len, "layouts disagree: block_bytes/layers %llu/%u vs %llu/%u",
                 (unsigned long long)a->block_bytes, a->layers, (unsigned long long)b->block_bytes,
                 b->layers);
        return -XFER_EMISMATCH;
    }
    if (a->tag[0] && b->tag[0] && strncmp(a->tag, b->tag, XFER_TAG_MAX)) {
        snprintf(why, why_len, "layouts disagree: tag %.40s vs %.40s", a->tag, b->tag);
        return -XFER_EMISMATCH;
    }
    return 0;
}

/* Every id must name a block of the layout that lies inside the region. */
static int ids_ok(xfer_engine *e, const char *side, const uint64_t *ids, size_t n,
                  const struct xfer_layout *l, uint64_t region_len)
{
    uint64_t bs = xfer_layout_block_size(l);
    uint64_t fit = region_len / bs;
    uint64_t max = l->num_blocks && l->num_blocks < fit ? l->num_blocks : fit;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] >= max) {
            xfer_engine_set_error(e,
                                  "%s block id %llu (index %zu) outside the %llu blocks of the "
                                  "region",
                                  side, (unsigned long long)ids[i], i, (unsigned long long)max);
            return -XFER_ERANGE;
        }
    }
    return 0;
}

/* Length of the run starting at i: both ids go up by one each step. */
static size_t run_length(const uint64_t *lids, const uint64_t *rids, size_t i, size_t n)
{
    size_t k = 1;
    while (i + k < n && lids[i + k] == lids[i] + k && rids[i + k] == rids[i] + k)
        k++;
    return k;
}

static int check_blocks(xfer_batch *b, enum xfer_op op, xfer_region *local, const uint64_t *lids,
                        xfer_peer *peer, uint32_t remote_id, const uint64_t *rids, size_t n,
                        struct xfer_region_desc *rd, struct xfer_layout *ll)
{
    xfer_engine *e = batch_engine(b);
    if ((op != XFER_OP_READ && op != XFER_OP_WRITE) || !local || !peer || n > INT32_MAX ||
        (n && (!lids || !rids)) || local->engine != e || peer->engine != e) {
        xfer_engine_set_error(e, "block transfer: bad op, region, peer or id array");
        return -XFER_EINVAL;
    }
    if (xfer_peer_region_get(peer, remote_id, rd) < 0) {
        xfer_engine_set_error(e,
                              "block transfer: remote region id %u of %s is not cached "
                              "(xfer_peer_region_add)",
                              remote_id, peer->desc.node_id);
        return -XFER_ENOENT;
    }
    pthread_mutex_lock(&e->regions.mu);
    *ll = local->layout;
    pthread_mutex_unlock(&e->regions.mu);
    char why[200];
    int rc = xfer_layouts_match(ll, &rd->layout, why, sizeof(why));
    if (rc < 0) {
        xfer_engine_set_error(e, "block transfer %s -> %s/%s: %s", local->name, peer->desc.node_id,
                              rd->name, why);
        return rc;
    }
    rc = ids_ok(e, "local", lids, n, ll, local->len);
    return rc ? rc : ids_ok(e, "remote", rids, n, &rd->layout, rd->len);
}

int xfer_batch_add_blocks(xfer_batch *b, enum xfer_op op, xfer_region *local,
                          const uint64_t *local_ids, xfer_peer *peer, uint32_t remote_id,
                          uint32_t remote_gen, const uint64_t *remote_ids, size_t n)
{
    if (!b)
        return -XFER_EINVAL;
    struct xfer_region_desc rd;
    struct xfer_layout ll;
    int rc = check_blocks(b, op, local, local_ids, peer, remote_id, remote_ids, n, &rd, &ll);
    if (rc < 0)
        return rc;
    uint64_t bs = xfer_layout_block_size(&ll);
    size_t first = xfer_batch_count(b), items = 0;
    for (size_t i = 0; i < n;) {
        size_t k = run_length(local_ids, remote_ids, i, n);
        struct xfer_item it = {.op = op,
                               .local = local,
                               .local_off = local_ids[i] * bs,
                               .peer = peer,
                               .remote_id = remote_id,
                               .remote_gen = remote_gen,
                               .remote_off = remote_ids[i] * bs,
                               .len = (uint64_t)k * bs};
        rc = xfer_batch_add(b, &it);
        if (rc < 0) {
            batch_truncate(b, first);
            return rc;
        }
        items++;
        i += k;
    }
    return (int)items;
}
