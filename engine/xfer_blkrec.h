/*
 * A stored block list (docs/engine.md "Block items"): how the engine's
 * batch (engine/batch_blocks.c) and the node library's batch
 * (node/pool_blocks.c) keep a struct xfer_block_list, its arrays as offsets
 * into one growing word array, and the one unpacking of it. Not part of
 * libxfer.so's API: named xfer_ like xfer_grow.h so that node/ may use it.
 */
#ifndef XFER_BLKREC_H
#define XFER_BLKREC_H

#include "xfer.h"

/* words[ids..): nids local ids, then nids remote ids; words[bases..):
 * nstreams local stream bases, then nstreams remote ones. */
struct xfer_blkrec {
    uint64_t len, lstride, rstride;
    uint32_t nids, nstreams;
    size_t ids, bases;
};

/* The list that record p over words describes (pointers into words). */
static inline struct xfer_block_list xfer_blkrec_list(const struct xfer_blkrec *p,
                                                      const uint64_t *words)
{
    return (struct xfer_block_list){.len = p->len,
                                    .local_stride = p->lstride,
                                    .remote_stride = p->rstride,
                                    .local_ids = words + p->ids,
                                    .remote_ids = words + p->ids + p->nids,
                                    .nids = p->nids,
                                    .local_base = words + p->bases,
                                    .remote_base = words + p->bases + p->nstreams,
                                    .nstreams = p->nstreams};
}

#endif
