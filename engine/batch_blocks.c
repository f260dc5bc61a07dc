/*
 * Block items (xfer_batch_add_block_item): a vectored item whose segments are
 * described by block ids, stream bases and strides instead of listed. A KV
 * pool request of 512 blocks over 32 layers x K/V was 32,768 segments
 * written by the node library, copied into the batch, walked by the ipc
 * worker and turned into kernel descriptors, all on the CPU before the GPU
 * had anything to do (docs/gpu.md); as block items it is 32 items sharing
 * one 8 KiB id list, checked on the largest id and expanded by the GPU.
 * Only transports with XFER_CAP_BLOCKS take them (batch_post_to_peer).
 */
#include "batch.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* Largest of ids[0..n) and its index. */
static uint64_t ids_max(const uint64_t *ids, uint32_t n, uint32_t *at)
{
    uint64_t m = 0;
    *at = 0;
    for (uint32_t i = 0; i < n; i++)
        if (ids[i] > m) {
            m = ids[i];
            *at = i;
        }
    return m;
}

/* base + id * stride + len <= limit, without wrapping. */
static bool blk_fits(uint64_t base, uint64_t id, uint64_t stride, uint64_t len, uint64_t limit)
{
    if (stride && id > (UINT64_MAX - base) / stride)
        return false;
    return xfer_range_ok(base + id * stride, len, limit);
}

/* The largest id of every stream must fit each side (local: in the
 * region; remote: below 2^64, its bounds are the owner's to check). */
static int blk_check(xfer_engine *e, const xfer_region *local, const struct xfer_block_list *bl,
                     uint64_t *total)
{
    uint64_t nseg = (uint64_t)bl->nstreams * bl->nids;
    if (!bl->len || !bl->nids || !bl->nstreams || nseg > XFER_SEGS_MAX || !bl->local_ids ||
        !bl->remote_ids || !bl->local_base || !bl->remote_base) {
        xfer_engine_set_error(e,
                              "block item: want len > 0, 1..%u segments (streams x ids) and "
                              "every array (got %u streams x %u ids)",
                              XFER_SEGS_MAX, bl->nstreams, bl->nids);
        return -XFER_EINVAL;
    }
    if (bl->len > UINT64_MAX / nseg) {
        xfer_engine_set_error(e, "block item: %" PRIu64 " segments of %" PRIu64 " bytes overflow",
                              nseg, bl->len);
        return -XFER_ERANGE;
    }
    uint32_t li, ri;
    uint64_t lmax = ids_max(bl->local_ids, bl->nids, &li);
    uint64_t rmax = ids_max(bl->remote_ids, bl->nids, &ri);
    uint64_t llen = xfer_region_len(local);
    for (uint32_t s = 0; s < bl->nstreams; s++) {
        bool lok = blk_fits(bl->local_base[s], lmax, bl->local_stride, bl->len, llen);
        if (lok && blk_fits(bl->remote_base[s], rmax, bl->remote_stride, bl->len, UINT64_MAX))
            continue;
        xfer_engine_set_error(e,
                              "block item: %s id %" PRIu64 " (entry %u) of stream %u lies past "
                              "%s",
                              lok ? "remote" : "local", lok ? rmax : lmax, lok ? ri : li, s,
                              lok ? "2^64" : "the local region");
        return -XFER_ERANGE;
    }
    *total = bl->len * nseg;
    return 0;
}

int xfer_batch_add_block_item(xfer_batch *b, const struct xfer_item *it,
                              const struct xfer_block_list *bl)
{
    if (!b || !it || !bl)
        return -XFER_EINVAL;
    xfer_engine *e = batch_engine(b);
    if (it->local_off || it->remote_off || it->len) {
        xfer_engine_set_error(e, "block item: no offsets or length in the item");
        return -XFER_EINVAL;
    }
    int rc = batch_item_check(e, it, BK_RMA);
    struct xfer_item head = *it;
    if (rc == 0)
        rc = blk_check(e, it->local, bl, &head.len);
    return rc ? rc : batch_append_blocks(b, &head, bl);
}

/* The last block item's ids, if equal to bl's (stored once). */
static bool ids_shared(const xfer_batch *b, const struct xfer_block_list *bl)
{
    if (!b->nblks)
        return false;
    const struct batch_blk *p = &b->blks[b->nblks - 1];
    const uint64_t *w = b->bwords + p->ids;
    return p->nids == bl->nids && !memcmp(w, bl->local_ids, bl->nids * sizeof(*w)) &&
           !memcmp(w + p->nids, bl->remote_ids, bl->nids * sizeof(*w));
}

static bool grow(void **v, size_t *cap, size_t want, size_t each)
{
    if (want <= *cap)
        return true;
    size_t c = *cap ? 2 * *cap : 64;
    while (c < want)
        c *= 2;
    void *p = realloc(*v, c * each);
    if (!p)
        return false;
    *v = p;
    *cap = c;
    return true;
}

int blk_reserve_locked(xfer_batch *b, const struct xfer_block_list *bl)
{
    size_t words = 2 * (size_t)bl->nstreams + (ids_shared(b, bl) ? 0 : 2 * (size_t)bl->nids);
    if (!grow((void **)&b->blks, &b->capblks, b->nblks + 1, sizeof(*b->blks)) ||
        !grow((void **)&b->bwords, &b->capbwords, b->nbwords + words, sizeof(*b->bwords)))
        return -XFER_ENOMEM;
    return 0;
}

void blk_store_locked(xfer_batch *b, struct batch_item *bi, const struct xfer_block_list *bl)
{
    struct batch_blk *p = &b->blks[b->nblks];
    *p = (struct batch_blk){.len = bl->len,
                            .lstride = bl->local_stride,
                            .rstride = bl->remote_stride,
                            .nids = bl->nids,
                            .nstreams = bl->nstreams,
                            .words0 = b->nbwords};
    uint64_t *w = b->bwords;
    if (ids_shared(b, bl)) {
        p->ids = b->blks[b->nblks - 1].ids;
    } else {
        p->ids = b->nbwords;
        memcpy(w + b->nbwords, bl->local_ids, bl->nids * sizeof(*w));
        memcpy(w + b->nbwords + bl->nids, bl->remote_ids, bl->nids * sizeof(*w));
        b->nbwords += 2 * (size_t)bl->nids;
    }
    p->bases = b->nbwords;
    memcpy(w + b->nbwords, bl->local_base, bl->nstreams * sizeof(*w));
    memcpy(w + b->nbwords + bl->nstreams, bl->remote_base, bl->nstreams * sizeof(*w));
    b->nbwords += 2 * (size_t)bl->nstreams;
    bi->blk = (uint32_t)++b->nblks;
    bi->nseg = bl->nstreams * bl->nids;
}

bool xfer_batch_item_blocks(const xfer_batch *b, size_t i, struct xfer_block_list *out)
{
    const struct batch_item *bi = &b->items[i];
    if (!bi->blk)
        return false;
    const struct batch_blk *p = &b->blks[bi->blk - 1];
    const uint64_t *w = b->bwords;
    *out = (struct xfer_block_list){.len = p->len,
                                    .local_stride = p->lstride,
                                    .remote_stride = p->rstride,
                                    .local_ids = w + p->ids,
                                    .remote_ids = w + p->ids + p->nids,
                                    .nids = p->nids,
                                    .local_base = w + p->bases,
                                    .remote_base = w + p->bases + p->nstreams,
                                    .nstreams = p->nstreams};
    return true;
}
