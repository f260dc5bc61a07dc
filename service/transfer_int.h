/*
 * Internals shared by transfer.c (one named transfer) and transfer_batch.c
 * (many named transfers as one engine batch).
 */
#ifndef XFER_SERVICE_TRANSFER_INT_H
#define XFER_SERVICE_TRANSFER_INT_H

#include "xferd.h"

struct inflight {
    xfer_batch *b;
    struct inflight *next;
};

struct side {
    struct xfer_node_addr n;
    bool local;
    xfer_region *lr;            /* local region */
    struct xfer_region_desc rd; /* local or remote descriptor */
    xfer_peer *peer;            /* remote side's peer (ref.peer) */
    struct xfer_node_ref ref;   /* remote side, held while resolved */
};

struct xctx {
    struct xferd *d;
    const uint8_t *notify; /* bound notification for the remote side, or NULL */
    size_t notify_len;
    uint64_t notify_id; /* its copy id, the same for every attempt (notify_tag.c) */
    char why[400];
};

/* Reason of a failure into x->why; returns rc. */
int why_set(struct xctx *x, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Parses the addresses; picks the operation and the node that executes it. */
int transfer_plan(struct xctx *x, const Xctl__Transfer *t, struct side *src, struct side *dst,
                  enum xfer_op *op, const char **exec);
/* Local side (caller holds region_lock); remote side (connect: the peer is
 * set up and held, side_release() when done). */
int side_local(struct xctx *x, struct side *s);
int side_remote(struct xctx *x, struct side *s, bool connect);
void side_release(struct xctx *x, struct side *s);
/* Block addresses -> bytes; access and bounds of one side. */
int to_bytes(struct xctx *x, struct side *src, struct side *dst, uint64_t *len);
int check_side(struct xctx *x, const struct side *s, uint64_t len, unsigned need);
int local_copy(struct xctx *x, struct side *src, struct side *dst, uint64_t len);
/* Batches that SIGTERM's drain may have to cancel. */
void inflight_add(struct xferd *d, struct inflight *f);
void inflight_del(struct xferd *d, struct inflight *f);
uint64_t now_us(void);
/* Binds x's notification, tagged (notify_tag.c), to b for peer p. */
int bind_notify(struct xctx *x, xfer_batch *b, xfer_peer *p, unsigned flags);

#endif
