/*
 * Vectored items (xfer_batch_add_segments): one item over a list of
 * (local_off, remote_off, len) segments of one local and one remote region.
 * The segments live in one array per batch (b->segs, grown like the item
 * array, nothing allocated per segment); the item's own offsets are 0 and
 * its len is the segments' total, so completion counts bytes as for any
 * item. Transports read the list with xfer_batch_item_segs() and either
 * move it whole (ipc) or walk it with xfer_batch_item_seg() (tcp, tcpx,
 * rdma: each segment then takes the path a plain item takes).
 */
#include "batch.h"

#include <inttypes.h>
#include <stdio.h>

/* Checks the segments against the local region; -XFER_E* with the failing
 * segment in the engine's last error. */
static int segs_check(xfer_engine *e, const xfer_region *local, const struct xfer_seg *segs,
                      size_t n, uint64_t *total)
{
    uint64_t sum = 0, llen = xfer_region_len(local);
    for (size_t k = 0; k < n; k++) {
        const struct xfer_seg *s = &segs[k];
        if (s->len == 0) {
            xfer_engine_set_error(e, "vectored item: segment %zu has length 0", k);
            return -XFER_EINVAL;
        }
        if (!xfer_range_ok(s->local_off, s->len, llen) ||
            !xfer_range_ok(s->remote_off, s->len, UINT64_MAX) || sum > UINT64_MAX - s->len) {
            xfer_engine_set_error(e,
                                  "vectored item: segment %zu (local %" PRIu64 ", remote %" PRIu64
                                  ", %" PRIu64 " bytes) outside local region of %" PRIu64
                                  " bytes or past 2^64",
                                  k, s->local_off, s->remote_off, s->len, llen);
            return -XFER_ERANGE;
        }
        sum += s->len;
    }
    *total = sum;
    return 0;
}

int xfer_batch_add_segments(xfer_batch *b, const struct xfer_item *it, const struct xfer_seg *segs,
                            size_t n)
{
    if (!b || !it)
        return -XFER_EINVAL;
    xfer_engine *e = batch_engine(b);
    if (!segs || n == 0 || n > XFER_SEGS_MAX || it->local_off || it->remote_off || it->len) {
        xfer_engine_set_error(e,
                              "vectored item: want 1..%u segments and no offsets or length in "
                              "the item (got %zu segments)",
                              XFER_SEGS_MAX, n);
        return -XFER_EINVAL;
    }
    int rc = batch_item_check(e, it, BK_RMA);
    struct xfer_item head = *it;
    if (rc == 0)
        rc = segs_check(e, it->local, segs, n, &head.len);
    return rc ? rc : batch_append_segs(b, &head, segs, n);
}

int64_t xfer_batch_item_failed_segment(const xfer_batch *b, size_t i)
{
    if (!b)
        return -1;
    pthread_mutex_lock((pthread_mutex_t *)&b->mu);
    int64_t k = i < b->n && b->items[i].nseg && b->items[i].status < 0 &&
                        b->items[i].status != -XFER_EINPROGRESS
                    ? b->items[i].bad_seg
                    : -1;
    pthread_mutex_unlock((pthread_mutex_t *)&b->mu);
    return k;
}

const struct xfer_seg *xfer_batch_item_segs(const xfer_batch *b, size_t i, size_t *n)
{
    const struct batch_item *bi = &b->items[i];
    *n = bi->nseg ? bi->nseg : 1;
    return bi->nseg && !bi->blk ? b->segs + bi->seg0 : NULL;
}

void xfer_batch_item_seg(const xfer_batch *b, size_t i, size_t k, struct xfer_item *out)
{
    const struct batch_item *bi = &b->items[i];
    *out = bi->it;
    if (!bi->nseg)
        return;
    struct xfer_block_list bl;
    struct xfer_seg gen;
    const struct xfer_seg *s = &b->segs[bi->seg0 + k];
    if (xfer_batch_item_blocks(b, i, &bl)) { /* a block item's, computed */
        gen = xfer_block_list_seg(&bl, k);
        s = &gen;
    }
    out->local_off = s->local_off;
    out->remote_off = s->remote_off;
    out->len = s->len;
}

/* Segments of vectored item i inside a remote region of len bytes; the
 * first one outside ends the item, named. */
static bool segs_ranges_ok(xfer_batch *b, size_t i, uint64_t len)
{
    const struct batch_item *bi = &b->items[i];
    for (uint32_t k = 0; k < bi->nseg; k++) {
        const struct xfer_seg *s = &b->segs[bi->seg0 + k];
        if (!xfer_range_ok(s->remote_off, s->len, len)) {
            char why[128];
            snprintf(why, sizeof(why),
                     "remote [%" PRIu64 ", +%" PRIu64 ") outside the region of %" PRIu64
                     " bytes: no segment moved",
                     s->remote_off, s->len, len);
            xfer_batch_seg_fail(b, i, k, -XFER_ERANGE, why);
            return false;
        }
    }
    return true;
}

/* All or nothing: a vectored or block item is checked whole against the
 * peer's cached descriptor of its remote region (when it has one of the
 * item's generation) before any transport moves a byte of it: the access
 * its op needs, then the bounds of every segment (a segment array) or of
 * every stream's largest block (a block list). The owner checks again where
 * it runs (it alone knows lease rules, and a region it re-registered). */
bool batch_item_remote_ok(xfer_batch *b, size_t i, xfer_peer *p)
{
    const struct batch_item *bi = &b->items[i];
    struct xfer_region_brief rd;
    if (!bi->nseg || xfer_peer_region_brief(p, bi->it.remote_id, &rd) < 0 ||
        rd.gen != bi->it.remote_gen)
        return true;
    if (!(rd.access & (bi->it.op == XFER_OP_READ ? XFER_ACCESS_R : XFER_ACCESS_W))) {
        xfer_batch_chunk_done(b, i, 0, -XFER_EACCES,
                              "the remote region does not allow this operation");
        return false;
    }
    return bi->blk ? blk_ranges_ok(b, i, rd.len) : segs_ranges_ok(b, i, rd.len);
}
