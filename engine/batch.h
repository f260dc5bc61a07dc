/*
 * Batch internals shared by batch.c (lifetime, items, completion),
 * batch_submit.c, batch_wait.c, batch_deadline.c (deadlines, cancel) and
 * batch_msg.c (what a batch carries besides READ/WRITE: bound
 * notifications and two-sided SEND/RECV items). Nothing else includes it.
 */
#ifndef XFER_BATCH_H
#define XFER_BATCH_H

#include "internal.h"
#include "xfer_blkrec.h"

enum batch_state { B_IDLE, B_RUNNING, B_DONE };

enum batch_kind { BK_RMA = 0, BK_SEND, BK_RECV };

/* A block item's description: ids at b->bwords[ids] (nids local, then nids
 * remote; shared with the previous block item when equal), stream bases at
 * b->bwords[bases] (nstreams local, then nstreams remote). words0: the
 * first word this item added (truncation gives back from there). */
struct batch_blk {
    struct xfer_blkrec r;
    uint64_t rmax; /* the largest remote id */
    size_t words0;
};

#define BATCH_WHY_MAX 96

struct batch_item {
    struct xfer_item it; /* a matched RECV becomes a READ of the sender's region */
    int status;
    bool open;
    unsigned tbit;
    uint64_t done;
    /* vectored items (batch_seg.c): segments b->segs[seg0, seg0 + nseg);
     * nseg 0 = a plain item */
    size_t seg0;
    uint32_t nseg;
    int32_t bad_seg; /* the segment that failed it, -1 = none */
    uint32_t blk;    /* block items (batch_blocks.c): 1 + index in b->blks, 0 = none */
    /* two-sided (batch_msg.c) */
    uint8_t kind;     /* enum batch_kind */
    bool matched;     /* RECV: a message was assigned to it */
    uint64_t tag;     /* SEND/RECV tag; a matched RECV: the message's */
    uint64_t cap;     /* RECV: the posted length */
    xfer_peer *want;  /* RECV: the peer asked for (NULL = any) */
    xfer_peer *from;  /* matched RECV: the sender */
    uint32_t name;    /* SEND/RECV: 1 + its entry in b->names, 0 none */
    uint64_t send_id; /* SEND: the RTS id; matched RECV: the sender's (0: no FIN, a local SEND) */
    bool local;       /* SEND: XFER_SEND_LOCAL (completes when its frame is written) */
    bool unlisted;    /* SEND: its matcher entry was taken (FIN, answer): nothing to forget */
};

struct xfer_batch {
    xfer_engine *engine;
    pthread_mutex_t mu;
    pthread_cond_t cv;    /* state or refs changed */
    unsigned cv_sleepers; /* mu: threads asleep on cv (batch_cv_wait): none, no wake-up owed */
    struct batch_item *items;
    size_t n, cap;
    enum batch_state state;
    size_t n_open;
    unsigned io_active;
    int refs;      /* user + transport holds + monitor; atomic */
    uint32_t seq;  /* this run's number, engine-wide, never 0 (tcp fences by it) */
    bool stopping; /* atomic: cancel or deadline under way: no new chunk starts */
    int result;
    int efd;
    bool fd_used; /* xfer_batch_fd was called: keep efd up to date (mu) */
    int64_t t_submit_ns, deadline_ns;
    int deadline_ms;
    xfer_batch *mon_prev, *mon_next;
    bool on_monitor;
    /* This run's submitter waits for it at once, on its own thread, and
     * then frees it (the one-call functions: batch_submit_wait): it is
     * not on the deadline monitor's list, the waiter ends it at its
     * deadline, and the submit takes no hold of its own. */
    bool waited;
    /* Only its creator can see it yet (a one-call function between
     * xfer_batch_new and the submit, which clears it): items are added
     * without a lock round. */
    bool unshared;
    struct batch_notes notes; /* bound notifications (notify_bind.c) */
    struct xfer_seg *segs;    /* segments of the vectored items, in item order */
    size_t nsegs, capsegs;
    struct batch_blk *blks; /* block items' descriptions, in item order */
    size_t nblks, capblks;
    uint64_t *bwords; /* their ids and stream bases */
    size_t nbwords, capbwords;
    /* Node ids of the SEND/RECV items' peers (the peer of a SEND, the sender
     * of a matched RECV), in item order: copies, valid after the peer is
     * removed (xfer_batch_item_msg). */
    char (*names)[XFER_NAME_MAX];
    size_t nnames, capnames;
    /* Reasons of failed items, allocated at the first failure of a run (the
     * item array stays small: submit walks it several times). */
    char (*whys)[BATCH_WHY_MAX];
    size_t nwhys;
    bool all_rma; /* this run has READ/WRITE items only (set by submit) */
    /* Waiter-driven receive (xfer_batch_wait_hint), mu: the one channel this
     * run waits on, or wait_many once a second one was hinted. */
    xfer_peer *wait_peer; /* wait_conn is valid only while it is this peer's conn */
    struct xfer_conn *wait_conn;
    void *wait_chan;
    bool wait_many;
    /* The one peer every SEND/RECV of this run names (msg_many: several, or
     * a RECV from any peer), mu: the waiter also reads what that peer sends
     * (its RTS, FIN), ops->wait_rx with inbound set. */
    xfer_peer *msg_peer;
    bool msg_many;
    bool msg_early;    /* a RECV of this run found RTS waiting (the submit matches) */
    bool wait_polling; /* a waiter polls wake_fd too: finishing writes it */
    int wake_fd;       /* that waiter's thread eventfd (batch_wait.c, waker_fd) */
    bool wake_hit;     /* finishing wrote it: the waiter drains it */
    /* mu: items ended in one run of chunk ends (xfer_batch_chunks_done_put)
     * share one clock reading, and like ones one count in the statistics:
     * 15 atomic adds and a clock read per item were ~15 % of the
     * initiator's instructions at 4 KiB, batch 128 (docs/perf.md). */
    struct {
        int64_t now_ns; /* 0: not in a run (items are counted one by one) */
        struct stats_set *sets[3];
        size_t nsets;
        enum xfer_op op;
        uint64_t items, bytes, lat_us;
    } run;
};

/* The reason of item i's failure ("" if none recorded). b->mu held or the
 * batch not running. */
const char *batch_item_why(const xfer_batch *b, size_t i);

/* batch.c, b->mu held: end item i (hooks batch_msg_item_end), finish. */
void batch_item_end(xfer_batch *b, size_t i, int status, const char *why);
void batch_maybe_finish(xfer_batch *b);
/* batch.c, b->mu held: ends every open item. */
void batch_end_open_items(xfer_batch *b, int status, const char *why);
/* batch.c, b->mu held: waits until no transport holds b (stale chunks of an
 * earlier run are bounded by io_timeout_ms); -XFER_EBUSY if one still does. */
int batch_wait_unheld(xfer_batch *b);
/* batch_deadline.c: b enters / leaves the deadline monitor's list. */
void batch_monitor_link(xfer_engine *e, xfer_batch *b);
void batch_monitor_unlink(xfer_engine *e, xfer_batch *b);
/* batch_deadline.c, no lock held: ends b's run at its deadline (fence, open
 * items and bindings fail with -XFER_ETIMEDOUT), as the monitor does. */
void batch_expire(xfer_batch *b);
/* batch_submit.c: submits b, which the caller filled and nobody else has
 * seen, and waits for it on this thread (xfer_read/write/send/recv,
 * xfer_notify): 0 or the run's result. */
int batch_submit_wait(xfer_batch *b, int deadline_ms);
/* The wait of batch_submit_wait: xfer_batch_wait(b, -1) counting from the
 * submit's clock reading. */
int batch_wait_submitted(xfer_batch *b);
/* batch_wait.c: the batch this thread waits for in a transport's wait_rx
 * (waiter-driven receive), else NULL: finishing it from this thread needs
 * no wake-up. */
extern __thread const xfer_batch *batch_polling;
/* batch_submit.c, no lock held: posts items idx[0..n) of peer p to its transport. */
void batch_post_to_peer(xfer_batch *b, xfer_peer *p, size_t *idx, size_t n);
/* batch.c: an item's op, regions and peer, and its local range. */
int batch_item_check(xfer_engine *e, const struct xfer_item *it, uint8_t kind);
/* batch.c: appends an item of that kind (local range checked). */
int batch_append(xfer_batch *b, const struct xfer_item *it, uint8_t kind, uint64_t tag, bool local);
/* b->mu held: pthread_cond_timedwait on b->cv, counted in cv_sleepers. */
int batch_cv_wait(xfer_batch *b, const struct timespec *ts);
/* batch_seg.c: false when vectored or block item i of running b is refused
 * whole by the cached descriptor of its remote region at peer p (the item
 * is ended); true for other items. */
bool batch_item_remote_ok(xfer_batch *b, size_t i, xfer_peer *p);
/* batch.c: appends vectored item it with segs[0..n) (checked by the caller,
 * batch_seg.c); it->len is their total. */
int batch_append_segs(xfer_batch *b, const struct xfer_item *it, const struct xfer_seg *segs,
                      size_t n);

/* batch.c: appends block items items[0..n) (len = each one's total)
 * described by lists[0..n) (checked by the caller, batch_blocks.c). */
int batch_append_blocks(xfer_batch *b, const struct xfer_item *items,
                        const struct xfer_block_list *lists, size_t n);
/* batch_blocks.c, b->mu held: room for the words and entries of lists
 * [0..n); stores them as the descriptions of items bi[0..n). */
int blk_reserve_locked(xfer_batch *b, const struct xfer_block_list *lists, size_t n);
/* batch_blocks.c: batch_item_remote_ok's bounds for block item i in a
 * remote region of len bytes (per stream on the largest remote id). */
bool blk_ranges_ok(xfer_batch *b, size_t i, uint64_t len);
void blk_store_locked(xfer_batch *b, struct batch_item *bi, const struct xfer_block_list *lists,
                      size_t n);

/* batch_msg.c, b->mu held: item i ended (the notification fence, FIN of a
 * RECV, unregistering a waiting SEND/RECV); a run starts (bindings reset and
 * counted, SEND/RECV registered). */
void batch_msg_item_end(xfer_batch *b, size_t i, int status);
void batch_msg_start(xfer_batch *b);
/* batch_msg.c, no lock held, after submit posted the READ/WRITE items:
 * sends the RTS of each SEND item. */
void batch_msg_submit(xfer_batch *b);

#endif
