/*
 * Pool block lists as block items (xfer_batch_add_block_item,
 * docs/engine.md "Block items"): where the peer's connection expands them
 * itself (ipc), a request is one item per pair of member regions that
 * carries the block ids (stored once per add_blocks call) and the
 * streams' bases instead of one segment per block and stream. 512 blocks
 * over a vLLM pool's 32 layers x K/V: 32 items and ~8.5 KiB, not 32,768
 * segments written here, copied into the engine batch, walked by the ipc
 * worker and turned into kernel descriptors (docs/gpu.md: that CPU work
 * kept the request at 0.25-0.29 of one copy). Other transports keep the
 * vectored items of pool_xfer.c (no change there). Blocks are not merged
 * into runs (the GPU copies 16 KiB blocks at full speed; a fully
 * consecutive list is one segment per stream), but an item still reports
 * its block runs (xfer_node_batch_item_segments), as vectored items do.
 */
#include "pool_plan.h"
#include "xfer_grow.h"

#include <stdlib.h>
#include <string.h>

/* XFER_POOL_BLOCKS=0: vectored items over ipc too (the path before). */
static bool blocks_off(void)
{
    static int off = -1;
    if (__atomic_load_n(&off, __ATOMIC_RELAXED) < 0) {
        const char *e = getenv("XFER_POOL_BLOCKS");
        __atomic_store_n(&off, e && !strcmp(e, "0"), __ATOMIC_RELAXED);
    }
    return __atomic_load_n(&off, __ATOMIC_RELAXED);
}

bool nb_blocks_wanted(const xfer_node_batch *b, xfer_peer *peer, size_t nb, uint64_t segs)
{
    (void)b;
    /* the transport of the peer's connection now; one that falls back to
     * tcp before submit fails these items with -XFER_ENOTSUP */
    return !blocks_off() && nb && nb <= UINT32_MAX && segs <= XFER_SEGS_MAX &&
           xfer_peer_transport(peer) == XFER_TRANSPORT_IPC;
}

/* Appends one block item over streams ls/rs[0..n) (one region pair). */
static void emit_item(xfer_node_batch *b, const struct plan *pl, const struct kv_stream *ls,
                      const struct kv_stream *rs, size_t n, uint64_t seg, size_t ids, size_t nids,
                      uint32_t runs)
{
    const struct xfer_region_desc *rd = plan_remote_member(pl, rs[0].region);
    size_t k = b->nitems++;
    b->item_ref[k] = pl->ref;
    b->seg0[k] = 0;
    b->nseg[k] = 0;
    b->items[k] = (struct xfer_item){.op = pl->op,
                                     .local = pl->lp->regions[ls[0].region],
                                     .peer = plan_remote_peer(pl),
                                     .remote_id = rd->id,
                                     .remote_gen = rd->gen};
    b->blks[b->nblks] = (struct nb_blk){.r = {.len = seg,
                                              .lstride = ls[0].stride,
                                              .rstride = rs[0].stride,
                                              .nids = (uint32_t)nids,
                                              .nstreams = (uint32_t)n,
                                              .ids = ids,
                                              .bases = b->nbw},
                                        .runs = runs};
    for (size_t s = 0; s < n; s++) {
        b->bw[b->nbw + s] = ls[s].base;
        b->bw[b->nbw + n + s] = rs[s].base;
    }
    b->nbw += 2 * n;
    b->blk[k] = (uint32_t)++b->nblks;
}

/* Runs of the list as pool_xfer.c merges them (neighbours consecutive on
 * both sides, blocks touching in memory on both sides): the block runs
 * the request moves, whatever the segments the engine copies. */
static uint32_t list_runs(const struct plan *pl, const struct kv_stream *ls,
                          const struct kv_stream *rs, size_t nst, uint64_t seg)
{
    for (size_t s = 0; s < nst; s++)
        if (ls[s].stride != seg || rs[s].stride != seg)
            return (uint32_t)pl->nb;
    uint32_t runs = pl->nb ? 1 : 0;
    for (size_t i = 1; i < pl->nb; i++)
        runs += pl->lb[i] != pl->lb[i - 1] + 1 || pl->rb[i] != pl->rb[i - 1] + 1;
    return runs;
}

/* A list consecutive on both sides whose blocks touch in memory on both
 * sides (stride == segment, on every stream) is one segment per stream, as
 * pool_xfer.c's merging makes it; other lists are not merged (the GPU
 * copies 16 KiB blocks at full speed, and the worker's host parts join
 * small ones). */
static bool one_run(const struct plan *pl, const struct kv_stream *ls, const struct kv_stream *rs,
                    size_t nst, uint64_t seg)
{
    for (size_t i = 1; i < pl->nb; i++)
        if (pl->lb[i] != pl->lb[0] + i || pl->rb[i] != pl->rb[0] + i)
            return false;
    for (size_t s = 0; s < nst; s++)
        if (ls[s].stride != seg || rs[s].stride != seg)
            return false;
    return true;
}

int nb_emit_blocks(xfer_node_batch *b, const struct plan *pl)
{
    struct plan_streams ps;
    plan_streams(pl, &ps);
    size_t nst = (size_t)ps.layers * ps.halves, nb = pl->nb;
    struct kv_stream *st = malloc(2 * nst * sizeof(*st));
    if (!st ||
        xfer_grow((void **)&b->bw, &b->capbw, b->nbw + 2 * nb + 2 * nst, sizeof(*b->bw), 64) ||
        xfer_grow((void **)&b->blks, &b->capblks, b->nblks + nst, sizeof(*b->blks), 16)) {
        free(st);
        return node_err(-XFER_ENOMEM, "out of memory for a block list");
    }
    struct kv_stream *ls = st, *rs = st + nst;
    for (uint32_t l = 0; l < ps.layers; l++)
        for (uint32_t h = 0; h < ps.halves; h++) {
            kv_stream_of(&pl->lp->geom, pl->l0 + l, h, &ls[l * ps.halves + h]);
            kv_stream_of(plan_remote_geom(pl), pl->l0 + l, h, &rs[l * ps.halves + h]);
        }
    uint64_t seg = ps.seg;
    uint32_t runs = list_runs(pl, ls, rs, nst, seg);
    if (nb > 1 && one_run(pl, ls, rs, nst, seg)) {
        seg *= nb;
        nb = 1;
    }
    size_t ids = b->nbw;
    memcpy(b->bw + ids, pl->lb, nb * sizeof(*b->bw));
    memcpy(b->bw + ids + nb, pl->rb, nb * sizeof(*b->bw));
    b->nbw += 2 * nb;
    /* consecutive streams on one region pair (a vLLM layer's K and V
     * halves) share an item: one owner check and one run for both */
    for (size_t s = 0, e; s < nst; s = e) {
        for (e = s + 1; e < nst && ls[e].region == ls[s].region && rs[e].region == rs[s].region &&
                        ls[e].stride == ls[s].stride && rs[e].stride == rs[s].stride;
             e++)
            ;
        emit_item(b, pl, ls + s, rs + s, e - s, seg, ids, nb, runs);
    }
    free(st);
    xfer_debug("pool %s: %zu blocks x %zu streams as block items", pl->lp->name, pl->nb, nst);
    return 0;
}

bool nb_item_blocks(const xfer_node_batch *b, size_t i, struct xfer_block_list *out)
{
    if (!b->blk[i])
        return false;
    *out = xfer_blkrec_list(&b->blks[b->blk[i] - 1].r, b->bw);
    return true;
}

size_t nb_item_nseg(const xfer_node_batch *b, size_t i)
{
    if (b->blk[i]) {
        const struct nb_blk *p = &b->blks[b->blk[i] - 1];
        return (size_t)p->r.nids * p->r.nstreams;
    }
    return b->nseg[i] ? b->nseg[i] : 1;
}

size_t nb_item_runs(const xfer_node_batch *b, size_t i)
{
    if (b->blk[i]) {
        const struct nb_blk *p = &b->blks[b->blk[i] - 1];
        return (size_t)p->runs * p->r.nstreams;
    }
    return b->nseg[i] ? b->nseg[i] : 1;
}

struct xfer_seg nb_item_seg(const xfer_node_batch *b, size_t i, size_t k)
{
    struct xfer_block_list bl;
    if (nb_item_blocks(b, i, &bl))
        return xfer_block_list_seg(&bl, k);
    if (b->nseg[i])
        return b->segs[b->seg0[i] + k];
    const struct xfer_item *it = &b->items[i];
    return (struct xfer_seg){it->local_off, it->remote_off, it->len};
}

int nb_item_add(const xfer_node_batch *b, xfer_batch *eb, size_t i, const struct xfer_item *it)
{
    struct xfer_block_list bl;
    if (nb_item_blocks(b, i, &bl))
        return xfer_batch_add_block_item(eb, it, &bl);
    if (b->nseg[i])
        return xfer_batch_add_segments(eb, it, b->segs + b->seg0[i], b->nseg[i]);
    return xfer_batch_add(eb, it);
}

int nb_blocks_add(const xfer_node_batch *b, xfer_batch *eb, size_t i, size_t end)
{
    struct xfer_block_list *v = malloc((end - i) * sizeof(*v));
    if (!v)
        return -XFER_ENOMEM;
    for (size_t k = i; k < end; k++)
        nb_item_blocks(b, k, &v[k - i]);
    int rc = xfer_batch_add_block_items(eb, b->items + i, v, end - i);
    free(v);
    return rc;
}
