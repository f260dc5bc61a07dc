/* Node batch internals shared by batch.c and pool_xfer.c (not installed). */
#ifndef XFER_NODE_BATCH_H
#define XFER_NODE_BATCH_H

#include "node_int.h"
#include "xfer_blkrec.h"

#define NB_NO_REF UINT32_MAX /* item not re-resolvable (pool items) */

struct nb_ref {
    struct xfer_node_ref ref;   /* held until reset/free */
    char region[XFER_NAME_MAX]; /* "" = the peer only (pool items) */
    int state;                  /* retry(): 0 unknown, 1 re-resolved, 2 keep */
    int rrc;                    /* re-resolve failure, 0 = none */
    char why[256];              /* its reason */
};

struct nb_notif { /* a bound notification, kept to bind it again */
    uint32_t ref;
    void *msg;
    size_t len;
};

struct nb_span { /* items [first, end) came from one pool block list */
    size_t first, end;
    char pool[2 * XFER_NAME_MAX]; /* "node/pool" */
    struct xfer_kv_geom geom;     /* the remote pool's */
    size_t nregions;
    uint32_t *ids; /* remote member region ids, in layout order */
};

/* A block item's description (pool block lists over ipc, pool_blocks.c):
 * ids at bw[ids] (nids local, then nids remote; shared by the items of one
 * add_blocks call), stream bases at bw[bases] (nstreams local, then remote). */
struct nb_blk {
    struct xfer_blkrec r; /* the list, over bw (the engine's record) */
    uint32_t runs;        /* block runs of the list (consecutive on both sides, memory
                           * contiguous): what xfer_node_batch_item_segments counts */
};

struct xfer_node_batch {
    xfer_node *n;
    unsigned require;
    xfer_batch *eb;          /* the items, first run */
    xfer_batch *eb2;         /* retry run (wait), or NULL */
    struct xfer_item *items; /* copies of what eb holds (for the retry) */
    uint32_t *item_ref;      /* ref index per item, or NB_NO_REF */
    /* vectored items (pool block lists): item i's segments are
     * segs[seg0[i], seg0[i] + nseg[i]); nseg 0 = a plain item */
    size_t *seg0;
    uint32_t *nseg;
    struct xfer_seg *segs;
    size_t nsegs, capsegs;
    uint32_t *blk; /* block items: 1 + index in blks, 0 = none (nseg is 0) */
    struct nb_blk *blks;
    size_t nblks, capblks;
    uint64_t *bw;
    size_t nbw, capbw;
    int32_t *retry_idx; /* item -> index in eb2, -1 = not retried */
    size_t nitems, capitems;
    struct nb_ref *refs;
    size_t nrefs, caprefs;
    int64_t deadline; /* CLOCK_MONOTONIC ms */
    bool submitted, retried;
    int first_other; /* first failure that was not retried */
    struct nb_notif *notifs;
    size_t nnotifs;
    struct nb_span *spans; /* pool block lists, in item order */
    size_t nspans, capspans;
};

/* Ref index of node[/region] (resolved and held on first use), or a code. */
int nb_ref(xfer_node_batch *b, const char *node, const char *region);
/* Room for more items (items, item_ref, seg0, nseg) and more_segs segments. */
int nb_reserve(xfer_node_batch *b, size_t more, size_t more_segs);
/* Appends items [first, nitems) to the engine batch; on failure drops them
 * (and their segments). */
int nb_commit(xfer_node_batch *b, size_t first);
/* Adds items [first, end) of b to engine batch eb, plain runs at once and
 * each vectored item with its segments; the first failure's code. */
int nb_engine_add(const xfer_node_batch *b, xfer_batch *eb, size_t first, size_t end);

/* pool_blocks.c: item i's block list (pointers into b, valid until it
 * changes) and true, or false for other items; its segment count; its
 * segment k (vectored or block item); appends item i to eb (any kind). */
bool nb_item_blocks(const xfer_node_batch *b, size_t i, struct xfer_block_list *out);
size_t nb_item_nseg(const xfer_node_batch *b, size_t i);
/* Block runs item i moves (xfer_node_batch_item_segments): its segments,
 * or for a block item the runs of its list times its streams. */
size_t nb_item_runs(const xfer_node_batch *b, size_t i);
struct xfer_seg nb_item_seg(const xfer_node_batch *b, size_t i, size_t k);
int nb_item_add(const xfer_node_batch *b, xfer_batch *eb, size_t i, const struct xfer_item *it);
/* Appends the block items [i, end) of b to eb in one call (their shared
 * id list checked once). */
int nb_blocks_add(const xfer_node_batch *b, xfer_batch *eb, size_t i, size_t end);
/* pool_blocks.c: true when the pool request to rp's peer goes as block
 * items (its connection can expand them: ipc; XFER_POOL_BLOCKS=0 turns it
 * off); emits them for plan pl (room reserved there). */
struct plan;
bool nb_blocks_wanted(const xfer_node_batch *b, xfer_peer *peer, size_t nb, uint64_t segs);
int nb_emit_blocks(xfer_node_batch *b, const struct plan *pl);

/* pool_xfer.c: forgets the spans; the reason a failed pool item failed,
 * naming its remote blocks (those of segment seg of a vectored item, when
 * one failed it: seg >= 0) (thread-local buffer), or NULL for other items. */
void nb_spans_clear(xfer_node_batch *b);
const char *nb_pool_item_why(const xfer_node_batch *b, size_t i, int st, int64_t seg,
                             const char *engine_why);

/* notify.c: binds the notifications again (after the engine batch was
 * reset); frees them. */
int nb_notifs_rebind(xfer_node_batch *b);
void nb_notifs_clear(xfer_node_batch *b);

#endif
