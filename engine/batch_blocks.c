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
#include "xfer_grow.h"

#include <inttypes.h>
#include <stdio.h>
#include <limits.h>
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

/* The largest ids of a list (the entry holding each), kept while the
 * lists of one call share their arrays: one scan per request, not per
 * region pair. */
struct ids_top {
    const uint64_t *l, *r;
    uint32_t n, li, ri;
    uint64_t lmax, rmax;
};

/* The largest id of every stream must fit each side (local: in the
 * region; remote: below 2^64, its bounds are the owner's to check). */
static int blk_check(xfer_engine *e, const xfer_region *local, const struct xfer_block_list *bl,
                     struct ids_top *top, uint64_t *total)
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
    if (top->l != bl->local_ids || top->r != bl->remote_ids || top->n != bl->nids) {
        top->l = bl->local_ids, top->r = bl->remote_ids, top->n = bl->nids;
        top->lmax = ids_max(bl->local_ids, bl->nids, &top->li);
        top->rmax = ids_max(bl->remote_ids, bl->nids, &top->ri);
    }
    uint64_t llen = xfer_region_len(local);
    for (uint32_t s = 0; s < bl->nstreams; s++) {
        bool lok = blk_fits(bl->local_base[s], top->lmax, bl->local_stride, bl->len, llen);
        if (lok && blk_fits(bl->remote_base[s], top->rmax, bl->remote_stride, bl->len, UINT64_MAX))
            continue;
        xfer_engine_set_error(e,
                              "block item: %s id %" PRIu64 " (entry %u) of stream %u lies past "
                              "%s",
                              lok ? "remote" : "local", lok ? top->rmax : top->lmax,
                              lok ? top->ri : top->li, s, lok ? "2^64" : "the local region");
        return -XFER_ERANGE;
    }
    *total = bl->len * nseg;
    return 0;
}

/* Room for the items' heads (each one's len set to its total). */
#define BLK_ADD_CHUNK 64

int xfer_batch_add_block_items(xfer_batch *b, const struct xfer_item *items,
                               const struct xfer_block_list *lists, size_t n)
{
    if (!b || (n && (!items || !lists)) || n > INT_MAX)
        return -XFER_EINVAL;
    xfer_engine *e = batch_engine(b);
    struct xfer_item head[BLK_ADD_CHUNK];
    struct ids_top top = {0};
    int first = -1;
    size_t had = xfer_batch_count(b);
    for (size_t at = 0; at < n; at += BLK_ADD_CHUNK) { /* all or none: undone below */
        size_t k = n - at < BLK_ADD_CHUNK ? n - at : BLK_ADD_CHUNK;
        int rc = 0;
        for (size_t i = 0; rc == 0 && i < k; i++) {
            const struct xfer_item *it = &items[at + i];
            head[i] = *it;
            if (it->local_off || it->remote_off || it->len) {
                xfer_engine_set_error(e, "block item: no offsets or length in the item");
                rc = -XFER_EINVAL;
            }
            if (rc == 0)
                rc = batch_item_check(e, it, BK_RMA);
            if (rc == 0)
                rc = blk_check(e, it->local, &lists[at + i], &top, &head[i].len);
        }
        if (rc == 0)
            rc = batch_append_blocks(b, head, lists + at, k);
        if (rc < 0) {
            xfer_batch_truncate(b, had);
            return rc;
        }
        first = first < 0 ? rc : first;
    }
    return first < 0 ? (int)had : first;
}

int xfer_batch_add_block_item(xfer_batch *b, const struct xfer_item *it,
                              const struct xfer_block_list *bl)
{
    return it && bl ? xfer_batch_add_block_items(b, it, bl, 1) : -XFER_EINVAL;
}

/* Does list i store its ids where the entry before it does? Within one
 * call by pointer (the caller's arrays do not change during it); the
 * first list of a call by content, against the batch's last entry. */
static bool ids_shared(const xfer_batch *b, const struct xfer_block_list *lists, size_t i)
{
    if (i > 0)
        return lists[i - 1].local_ids == lists[i].local_ids &&
               lists[i - 1].remote_ids == lists[i].remote_ids && lists[i - 1].nids == lists[i].nids;
    if (!b->nblks)
        return false;
    const struct batch_blk *p = &b->blks[b->nblks - 1];
    const struct xfer_block_list *bl = &lists[0];
    const uint64_t *w = b->bwords + p->r.ids;
    return p->r.nids == bl->nids && !memcmp(w, bl->local_ids, bl->nids * sizeof(*w)) &&
           !memcmp(w + p->r.nids, bl->remote_ids, bl->nids * sizeof(*w));
}

int blk_reserve_locked(xfer_batch *b, const struct xfer_block_list *lists, size_t n)
{
    size_t words = 0;
    for (size_t i = 0; i < n; i++)
        words += 2 * (size_t)lists[i].nstreams +
                 (ids_shared(b, lists, i) ? 0 : 2 * (size_t)lists[i].nids);
    int rc = xfer_grow((void **)&b->blks, &b->capblks, b->nblks + n, sizeof(*b->blks), 16);
    return rc ? rc
              : xfer_grow((void **)&b->bwords, &b->capbwords, b->nbwords + words,
                          sizeof(*b->bwords), 256);
}

void blk_store_locked(xfer_batch *b, struct batch_item *bi, const struct xfer_block_list *lists,
                      size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const struct xfer_block_list *bl = &lists[i];
        struct batch_blk *p = &b->blks[b->nblks];
        bool shared = ids_shared(b, lists, i);
        *p = (struct batch_blk){.r = {.len = bl->len,
                                      .lstride = bl->local_stride,
                                      .rstride = bl->remote_stride,
                                      .nids = bl->nids,
                                      .nstreams = bl->nstreams},
                                .words0 = b->nbwords};
        uint64_t *w = b->bwords;
        if (shared) {
            p->r.ids = b->blks[b->nblks - 1].r.ids;
            p->rmax = b->blks[b->nblks - 1].rmax;
        } else {
            uint32_t at;
            p->rmax = ids_max(bl->remote_ids, bl->nids, &at);
            p->r.ids = b->nbwords;
            memcpy(w + b->nbwords, bl->local_ids, bl->nids * sizeof(*w));
            memcpy(w + b->nbwords + bl->nids, bl->remote_ids, bl->nids * sizeof(*w));
            b->nbwords += 2 * (size_t)bl->nids;
        }
        p->r.bases = b->nbwords;
        memcpy(w + b->nbwords, bl->local_base, bl->nstreams * sizeof(*w));
        memcpy(w + b->nbwords + bl->nstreams, bl->remote_base, bl->nstreams * sizeof(*w));
        b->nbwords += 2 * (size_t)bl->nstreams;
        bi[i].blk = (uint32_t)++b->nblks;
        bi[i].nseg = bl->nstreams * bl->nids;
    }
}

bool xfer_batch_item_blocks(const xfer_batch *b, size_t i, struct xfer_block_list *out)
{
    const struct batch_item *bi = &b->items[i];
    if (!bi->blk)
        return false;
    *out = xfer_blkrec_list(&b->blks[bi->blk - 1].r, b->bwords);
    return true;
}

bool blk_ranges_ok(xfer_batch *b, size_t i, uint64_t len)
{
    const struct batch_item *bi = &b->items[i];
    const struct batch_blk *p = &b->blks[bi->blk - 1];
    struct xfer_block_list bl;
    xfer_batch_item_blocks(b, i, &bl);
    bool ok = true;
    for (uint32_t s = 0; ok && s < bl.nstreams; s++) /* no wrap: checked at add */
        ok = xfer_range_ok(bl.remote_base[s] + p->rmax * bl.remote_stride, bl.len, len);
    for (uint64_t k = 0; !ok && k < bi->nseg; k++) { /* the first one outside, named */
        struct xfer_seg sg = xfer_block_list_seg(&bl, k);
        if (xfer_range_ok(sg.remote_off, sg.len, len))
            continue;
        char why[128];
        snprintf(why, sizeof(why),
                 "remote [%" PRIu64 ", +%" PRIu64 ") outside the region of %" PRIu64
                 " bytes: no block moved",
                 sg.remote_off, sg.len, len);
        xfer_batch_seg_fail(b, i, k, -XFER_ERANGE, why);
        return false;
    }
    return true;
}
