/*
 * Internal contract between the engine core and its transports.
 *
 * Each transport is one file (or folder) exporting one ops table,
 * `const struct xfer_transport_ops xfer_<name>_transport_ops`, listed in
 * engine/transport_table.c. Its private state embeds struct xfer_transport
 * (and struct xfer_conn for connections) and is reached with container_of.
 * Differences between transports are capability bits, never name tests in
 * the core.
 */
#ifndef XFER_TRANSPORT_H
#define XFER_TRANSPORT_H

#include "mono_clock.h"
#include "xfer.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#ifndef container_of
#define container_of(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))
#endif

struct xfer_transport;
struct xfer_conn;

/* ---- engine messages (notifications; docs/notify.md) -------------------- */
#define XFER_MSG_FRAME_MAX (128u << 10) /* largest engine message frame */

/* An outgoing engine message as a transport sees it: opaque bytes. */
struct xfer_msg {
    const uint8_t *frame;
    size_t len;
    /* Set only while the sender's own thread delivers m from inside its
     * xfer_batch_submit (the batch is alive): the answer completes this
     * batch, so send_msg may name the channel it used with
     * xfer_batch_wait_hint (waiter-driven receive). Else NULL. */
    xfer_batch *wait_b;
    /* Nobody waits for the answer (a FIN; the RTS of a rendezvous SEND,
     * which completes with its FIN): a transport may leave it to be read
     * later instead of holding the sending thread (ipc). */
    bool lazy;
    /* No answer wanted (an RTS of XFER_SEND_LOCAL): a transport that can
     * tell its peer so (tcp) calls xfer_msg_done(m, 0) once the frame is
     * written and the target answers nothing; others carry the answer as
     * usual. */
    bool noresp;
    /* Its peer waits for it, but no sooner than for this side's next
     * message (a FIN, whose SEND's sender usually receives next): tcp may
     * hold it for that message to carry (tcp_back.c, "frames ride along"). */
    bool ride;
    /* The transport's while it holds m (from send_msg until it calls
     * xfer_msg_done): room for its queue node, so that a message costs no
     * allocation there (ipc: struct ipc_msgq, ~300 instructions a message
     * as a calloc/free pair). */
    _Alignas(8) unsigned char tp[40];
};

enum xfer_transport_cap {
    XFER_CAP_HOST_MEM = 1u << 0,  /* can move host memory */
    XFER_CAP_CUDA_MEM = 1u << 1,  /* can move CUDA device memory */
    XFER_CAP_SAME_HOST = 1u << 2, /* only reaches peers with the same host_id */
    XFER_CAP_NEEDS_REG = 1u << 3, /* regions must be registered with reg_mem */
    XFER_CAP_BLOCKS = 1u << 4,    /* expands block items itself (xfer_batch_item_blocks) */
    /* wait_rx with inbound busy-polls the peer's channel itself for
     * busy_poll_us first: xfer_batch_wait does not spin on the batch then
     * (which would leave the reading to the transport's own thread). */
    XFER_CAP_RX_SPIN = 1u << 5,
};

enum xfer_conn_state_bits {
    XFER_CONN_SOME_DEAD = 1u << 0, /* at least one channel died */
    XFER_CONN_ALL_DEAD = 1u << 1,  /* none can carry chunks any more */
    XFER_CONN_BUSY = 1u << 2,      /* live channels have chunks in flight */
    XFER_CONN_PEER_LEFT = 1u << 3, /* the peer closed it in order (its engine stopped) */
};

struct xfer_transport_ops {
    const char *name; /* "tcp", "ipc", ... */
    unsigned bit;     /* XFER_TRANSPORT_* */
    unsigned caps;    /* XFER_CAP_* */
    int preference;   /* lower is tried first when several reach a peer */

    /* 0 if usable on this machine; else a negative code and a reason in why
     * (e.g. "no RDMA device"). Must not crash where hardware is absent. */
    int (*probe)(xfer_engine *e, char *why, size_t why_len);
    /* Creates the transport, starts its listener and progress threads. */
    int (*open)(xfer_engine *e, struct xfer_transport **out);
    /* Stops threads, closes every connection, frees the transport. */
    void (*close)(struct xfer_transport *t);
    /* Can this transport reach that peer (host id, NICs, ...)? */
    bool (*reaches)(struct xfer_transport *t, const struct xfer_peer_desc *peer);
    /* Sets up connection(s) to a peer within timeout_ms; runs off the data
     * path (from xfer_peer_add/xfer_peer_connect). */
    int (*connect)(struct xfer_transport *t, xfer_peer *peer, int timeout_ms,
                   struct xfer_conn **out);
    /* Fails the connection's in-flight chunks with -XFER_ECONN, frees it. */
    void (*disconnect)(struct xfer_conn *c);
    /* Optional, cheap (no locks beyond atomics; called with the peer's
     * conn_lock held for reading): XFER_CONN_* bits saying whether some or
     * all of c's channels died and whether live ones carry work. The engine
     * uses it to replace a dead (or an idle degraded) connection in the
     * background. Transports without it are never replaced that way. */
    unsigned (*conn_state)(struct xfer_conn *c);
    /* Optional (XFER_CAP_NEEDS_REG): make a local region usable / forget it. */
    int (*reg_mem)(struct xfer_transport *t, xfer_region *r);
    void (*dereg_mem)(struct xfer_transport *t, xfer_region *r);
    /* Starts items idx[0..n) of b over c. Completion is reported with
     * xfer_batch_chunk_done(), possibly before this returns. A negative return
     * means none of the n items was started. */
    int (*post)(struct xfer_conn *c, xfer_batch *b, const size_t *idx, size_t n);
    /* Optional: drive completions for transports without their own thread. */
    int (*progress)(struct xfer_transport *t);
    /* Optional: adds this transport's part of the node's own descriptor
     * (rdma: the NIC list in self->nics). Called by xfer_engine_describe(). */
    void (*describe)(struct xfer_transport *t, struct xfer_peer_desc *self);
    /* Optional: fills this transport's published field of a local region's
     * descriptor (ipc: out->ipc, e.g. "memfd", "cma:<pid>:<addr>",
     * "cuda:<handle hex>+<off>"; rdma: out->rkeys). Called by
     * xfer_region_describe() with the region table locked: must not call back
     * into region functions. */
    void (*describe_region)(struct xfer_transport *t, const xfer_region *r,
                            struct xfer_region_desc *out);
    /* Optional: carries one engine message (m->frame, m->len <=
     * XFER_MSG_FRAME_MAX bytes, valid until completion) to the peer, whose
     * transport hands the bytes to xfer_engine_msg_recv() and answers with
     * its return value. Completion: xfer_msg_done(m, status) exactly once,
     * possibly before this returns; a negative return means not sent and no
     * completion. Without it the peer gets -XFER_ENOTSUP for messages. */
    int (*send_msg)(struct xfer_conn *c, struct xfer_msg *m);
    /* Optional: batch b, which WRITEs to c's peer, is being cancelled or
     * timed out; its items have not ended yet and new chunks of it no
     * longer start (xfer_batch_item_live). Called with the peer's conn_lock
     * held for reading, before the items end. The transport detaches chunks
     * of b already begun from b's local memory, and makes sure no byte of b
     * lands at the peer after anything sent on c once this returns
     * (docs/engine.md, "Cancel and retry"). */
    void (*fence)(struct xfer_conn *c, xfer_batch *b);
    /* Optional: deregistration (or detach) of local region r has started,
     * or r got lease rules the owner must check on every access; called
     * without locks (before deregistration waits for r's pins). A transport
     * that lent peers direct access to r (ipc's direct copies) withdraws it
     * here and returns once no peer copy runs (bounded by io_timeout_ms). */
    void (*region_withdraw)(struct xfer_transport *t, xfer_region *r);
    /* Optional, for transports whose peers reach memory without the owner's
     * CPU (rdma): lease_check says whether lease rules on r can be enforced
     * (0, or -XFER_ENOTSUP with the reason in the engine's last error);
     * leases_changed is called after rules changed or a lease ended (no lock
     * held): the transport revokes what the rules no longer grant and
     * returns once its hardware refuses it (bounded by io_timeout_ms). */
    int (*lease_check)(struct xfer_transport *t, xfer_region *r);
    void (*leases_changed)(struct xfer_transport *t);
    /* Optional waiter-driven receive: the thread in xfer_batch_wait(b) waits
     * for chan of c itself (at most timeout_ms) and reads what arrived on it,
     * completing chunks without a hand-off through the progress thread.
     * Called with c's peer connection lock held for reading, with a
     * channel the transport named with xfer_batch_wait_hint or NULL; inbound:
     * b's SEND/RECV items all name c's peer, so the waiter may also read the
     * channel that peer's messages to us arrive on (an RTS, a FIN). < 0:
     * cannot (the waiter sleeps on the batch as usual). */
    int (*wait_rx)(struct xfer_conn *c, void *chan, bool inbound, xfer_batch *b, int timeout_ms);
    /* Optional, the same for a thread in xfer_notif_wait(): waits at most
     * timeout_ms for the channel messages from node (NULL: from anyone, the
     * channel the last message came on) arrive on, reads and serves what
     * arrived, and returns once the notification queue is not empty
     * (poll xfer_notif_wake_fd() beside the channel: readable while it is
     * not, except for a notification this thread queued itself), or
     * timeout_ms passed, or earlier: xfer_notif_wait looks at the queue and
     * its deadline and calls again. No lock held. < 0: no such channel (the caller
     * sleeps on the wake fd). */
    int (*notif_wait_rx)(struct xfer_transport *t, const char *node, int timeout_ms);
};

struct xfer_transport {
    const struct xfer_transport_ops *ops;
    xfer_engine *engine;
};

struct xfer_conn {
    struct xfer_transport *transport;
    xfer_peer *peer;
};

/* NULL-terminated, in preference order (engine/transport_table.c). */
extern const struct xfer_transport_ops *const xfer_transport_table[];

/* ---- engine services for transports ------------------------------------ */

const struct xfer_engine_config *xfer_engine_config_get(const xfer_engine *e);
/* This engine's incarnation for handshakes: set before any transport opens,
 * so a handshake thread may read it while later transports still open
 * (xfer_engine_describe reads the transport list, which is not settled yet). */
uint64_t xfer_engine_incarnation(const xfer_engine *e);
void xfer_engine_set_error(xfer_engine *e, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* A transport with a listener reports the port it bound (data_port 0 in the
 * config = ephemeral), so that xfer_engine_describe() publishes it. */
void xfer_engine_set_data_port(xfer_engine *e, uint16_t port);

/* Target side: looks a local region up by id and pins it against
 * deregistration. Checks generation, access (XFER_ACCESS_R for READ,
 * XFER_ACCESS_W for WRITE) and bounds; on failure returns NULL and the code
 * in *err (-XFER_ENOENT, -XFER_ESTALE, -XFER_EACCES, -XFER_ERANGE). */
xfer_region *xfer_region_acquire(xfer_engine *e, uint32_t id, uint32_t gen, enum xfer_op op,
                                 uint64_t off, uint64_t len, int *err);
/* The same for an access by node peer (its handshake's node id): also
 * checks the region's lease rules (lease.c; -XFER_ESTALE when peer holds no
 * live lease on a guarded byte of the range). NULL peer: guarded ranges
 * are refused. */
xfer_region *xfer_region_acquire_by(xfer_engine *e, const char *peer, uint32_t id, uint32_t gen,
                                    enum xfer_op op, uint64_t off, uint64_t len, int *err);
/* The same for a list of ranges v[0..n) of one region (a vectored item's
 * segments): the checks once, bounds and lease rules per range, one pin for
 * all. On failure *bad = the index of the range refused (SIZE_MAX when the
 * region itself was: unknown, stale, access). */
xfer_region *xfer_region_acquire_segs_by(xfer_engine *e, const char *peer, uint32_t id,
                                         uint32_t gen, enum xfer_op op, const struct xfer_range *v,
                                         size_t n, size_t *bad, int *err);
/* The same for a list known only by its hull [off, off+len) (every range
 * lies inside it): bounds and lease rules checked once, on the hull. When
 * the rules do not admit the whole hull (a guarded gap the ranges may
 * skip), returns NULL with *err = 0 and *need_list = true: ask again with
 * the ranges (xfer_region_acquire_segs_by). */
xfer_region *xfer_region_acquire_hull_by(xfer_engine *e, const char *peer, uint32_t id,
                                         uint32_t gen, enum xfer_op op, uint64_t off, uint64_t len,
                                         bool *need_list, int *err);
void xfer_region_release(xfer_region *r);
/* rdma memory windows (lease.c). For an access by peer to [off, off+len)
 * of r (pinned by the caller) that the lease rules admit now: the window
 * [*woff, *woff + *wlen) to bind — all of r when peer may reach all of it,
 * else the access widened over peer's live rules that touch it — and
 * *until, the earliest deadline of a lease it relies on (CLOCK_MONOTONIC
 * ms, INT64_MAX: none). -XFER_ESTALE when the rules refuse the access. */
int xfer_region_lease_window(xfer_region *r, const char *peer, uint64_t off, uint64_t len,
                             uint64_t *woff, uint64_t *wlen, int64_t *until);
/* 0 (with *until as above) while the rules still admit peer to [off,
 * off+len) of r, -XFER_ESTALE once they do not (or r is being
 * deregistered). */
int xfer_region_lease_admits(xfer_region *r, const char *peer, uint64_t off, uint64_t len,
                             int64_t *until);
/* 0 when memfd fd is sealed against shrinking (with add: sealing it where
 * the memfd allows), else -XFER_EINVAL and why (region.c). */
int xfer_memfd_seal_shrink(int fd, bool add, char *why, size_t why_len);
/* True once deregistration of r has started (ipc_serve.c revokes peers'
 * pins on it after io_timeout_ms); the count of regions whose deregistration
 * waits for pins, cheap enough to read on every loop (region.c). */
bool xfer_region_dying(xfer_region *r);
int xfer_engine_regions_dying(const xfer_engine *e);
uint32_t xfer_region_id(const xfer_region *r);
/* Registered with XFER_ACCESS_LEASED (rdma: memory windows only). */
bool xfer_region_leased(const xfer_region *r);
uint32_t xfer_region_gen(const xfer_region *r);
enum xfer_mem_kind xfer_region_kind(const xfer_region *r);
int xfer_region_device(const xfer_region *r);
/* The 64-byte CUDA IPC handle a region was adopted from
 * (xfer_region_adopt_cuda), else NULL: such memory cannot be exported again,
 * so the handle itself is what same-host peers open. */
const uint8_t *xfer_region_cuda_ipc_handle(const xfer_region *r);
/* Per-transport private data slot for a region (e.g. an MR), indexed by the
 * transport's bit position. */
void *xfer_region_transport_data(const xfer_region *r, unsigned bit);
void xfer_region_set_transport_data(xfer_region *r, unsigned bit, void *data);
/* Target-side accounting. */
void xfer_engine_count_served(xfer_engine *e, unsigned transport_bit, uint64_t bytes, int status);
/* ops requests served successfully, bytes in all (one count for a run of them). */
void xfer_engine_count_served_n(xfer_engine *e, unsigned transport_bit, uint64_t ops,
                                uint64_t bytes);

/* Initiator side: the item and the peer's cached remote region. A
 * vectored item (xfer_batch_add_segments) has local_off = remote_off = 0
 * and len = its segments' total: transports walk its segments instead. */
const struct xfer_item *xfer_batch_item(const xfer_batch *b, size_t i);
/* Segments of item i: the array and *n, or NULL and *n = 1 for a plain
 * item (its one segment is the item). Valid while b runs. */
const struct xfer_seg *xfer_batch_item_segs(const xfer_batch *b, size_t i, size_t *n);
/* Item i narrowed to its segment k (a plain item: k = 0, the item). */
void xfer_batch_item_seg(const xfer_batch *b, size_t i, size_t k, struct xfer_item *out);
/* Block item i (xfer_batch_add_block_item): its description, pointers into
 * the batch valid while it runs, and true; false for other items. Its
 * segments are also what xfer_batch_item_seg gives (one at a time);
 * xfer_batch_item_segs gives NULL for it. */
bool xfer_batch_item_blocks(const xfer_batch *b, size_t i, struct xfer_block_list *out);
/* Ends item i with status (< 0) like xfer_batch_chunk_done, naming its
 * segment k as the one that failed (xfer_batch_item_failed_segment). */
void xfer_batch_seg_fail(xfer_batch *b, size_t i, size_t k, int status, const char *why);
const struct xfer_peer_desc *xfer_peer_desc_get(const xfer_peer *p);
/* Copies the cached descriptor of remote region id; -XFER_ENOENT if unknown. */
int xfer_peer_region_get(xfer_peer *p, uint32_t id, struct xfer_region_desc *out);
/* The fields per-item checks need, without copying the descriptor's text
 * blobs (KB per item on paths that see tens of thousands of items). */
struct xfer_region_brief {
    uint32_t gen;
    enum xfer_mem_kind kind;
    unsigned access;
    uint64_t len;
};
int xfer_peer_region_brief(xfer_peer *p, uint32_t id, struct xfer_region_brief *out);
struct xfer_conn *xfer_peer_conn(xfer_peer *p);

/* Before touching the local memory of item i, a transport calls
 * xfer_batch_io_begin(); false means the item is no longer live (cancelled,
 * timed out or failed) and its memory must not be touched. Every true is
 * paired with xfer_batch_io_end(). Cancellation waits for these pairs. */
bool xfer_batch_io_begin(xfer_batch *b, size_t i);
void xfer_batch_io_end(xfer_batch *b, size_t i);
/* n io_end() of b's items at once (one lock round). */
void xfer_batch_io_end_n(xfer_batch *b, int n);
/* True while item i may still complete and new chunks of it may start
 * (cheap check, no pinning): false once it ended, and from the moment a
 * cancel or deadline of its batch begins (then only chunks already begun go
 * on, until the transport's fence() detached them or the item ends). */
bool xfer_batch_item_live(const xfer_batch *b, size_t i);
/* Item i has not ended (its batch may be stopping). */
bool xfer_batch_item_open(const xfer_batch *b, size_t i);
/* The batch run's sequence number: engine-wide, never 0, new per submit. */
uint32_t xfer_batch_seq(const xfer_batch *b);
/* Reports `bytes` of item i as finished with status (0 or -XFER_E*) and an
 * optional reason. The item completes when all its bytes are reported or on
 * the first error. Safe from any thread. */
void xfer_batch_chunk_done(xfer_batch *b, size_t i, uint64_t bytes, int status, const char *why);
/* A transport that still refers to b after post() returns (a chunk awaiting
 * its response, say) holds a reference for as long as it does: b then stays
 * valid even if the user frees it, and a resubmit or reset of b waits until
 * every hold is put back, so a late completion can never land in a newer run.
 * Every hold is paired with one put; both are safe from any thread. */
void xfer_batch_hold(xfer_batch *b);
/* n holds at once (each dropped by its own xfer_batch_put). */
void xfer_batch_hold_n(xfer_batch *b, int n);
void xfer_batch_put(xfer_batch *b);
/* From post(): b's items just posted wait only for chan of c (one socket,
 * say). If nothing else of this run is hinted, xfer_batch_wait() lets the
 * waiting thread receive on chan itself (ops->wait_rx); a second channel
 * turns it off for the run. */
void xfer_batch_wait_hint(xfer_batch *b, struct xfer_conn *c, void *chan);
/* For ops->notif_wait_rx: the notification queue's eventfd. Unlike
 * xfer_notif_fd() it does not make every push write it: only pushes while
 * a thread waits in xfer_notif_wait (other than the pushing one) do. */
int xfer_notif_wake_fd(xfer_engine *e);
/* For ops->wait_rx: an eventfd that becomes readable when b's run ends
 * while the waiter polls (poll it beside the channel; do not read it). */
int xfer_batch_wake_fd(const xfer_batch *b);
/* True while b's current run has not finished (cheap, no lock). */
bool xfer_batch_running(const xfer_batch *b);
/* xfer_batch_chunk_done() then xfer_batch_put(), in one lock round. */
void xfer_batch_chunk_done_put(xfer_batch *b, size_t i, uint64_t bytes, int status,
                               const char *why);
/* The same for n chunks, each holding one reference on its batch: one lock
 * round per run of entries of the same batch (a progress thread ending the
 * chunks whose responses one recv brought). */
struct xfer_chunk_end {
    xfer_batch *b;
    size_t i;
    uint64_t bytes;
    int status;
    const char *why;
};
void xfer_batch_chunks_done_put(const struct xfer_chunk_end *v, size_t n);

/* Completion of a send_msg: status is the target's answer (0, -XFER_ENOSPC,
 * -XFER_EPROTO, ...) or the transport's failure (-XFER_ECONN: may or may not
 * have arrived). why may be NULL. Safe from any thread; m is gone after. */
void xfer_msg_done(struct xfer_msg *m, int status, const char *why);
/* Two of a transport's messages to one peer, fin (a FIN, queued first)
 * and into (the next one, an RTS), neither started: the FIN's body goes
 * into into's frame (XFER_MSG_F_FIN; into->len grows), and the transport
 * then ends fin with xfer_msg_done(fin, 0) and sends into alone, in fin's
 * place. False: not such a pair, or no room; nothing changed. */
bool xfer_msg_fold(struct xfer_msg *into, const struct xfer_msg *fin);
/* Target side: an engine message arrived from node_id/incarnation (as the
 * transport's handshake proved them). Returns the status to answer: 0
 * (accepted), XFER_MSG_DELIVERED (accepted and consumed at once: an eager
 * message matched a posted receive; the answer stands for its FIN),
 * -XFER_ENOSPC (receive queue full), -XFER_EPROTO (malformed),
 * -XFER_ENOMEM. Never blocks on the user; bytes are copied. Transports
 * carry the answer, XFER_MSG_DELIVERED included, back to xfer_msg_done. */
#define XFER_MSG_DELIVERED 1
/* The answer to a notification sent behind its batch's data
 * (xfer_batch_note_behind) when not all of that data landed at the target
 * before it: not queued there; the engine sends it again the fenced way. */
#define XFER_MSG_NOT_BEHIND 2
/* Post, no lock held but the peer's conn_lock: items idx[0..n) of b, all
 * of them sent on one ordered channel of c (nothing else of b's items for
 * this peer), WRITEs of host memory. If b binds a notification to the peer
 * whose items are exactly these, none ended yet, returns its message, to be
 * sent on that channel right behind them (send_msg's rules; the target
 * delivers it only if every one of those frames landed, else answers
 * XFER_MSG_NOT_BEHIND); else NULL (the engine sends it after the items
 * ended). docs/notify.md, "Behind the data". */
struct xfer_msg *xfer_batch_note_behind(xfer_batch *b, xfer_peer *p, const size_t *idx, size_t n);
int xfer_engine_msg_recv(xfer_engine *e, const char *node_id, uint64_t incarnation,
                         const uint8_t *frame, size_t len);

/* An engine switch from the environment (docs/tuning.md): "0" turns it
 * off, anything else or unset leaves it on. */
static inline bool xfer_env_off(const char *name)
{
    const char *v = getenv(name);
    return v && strcmp(v, "0") == 0;
}

#endif /* XFER_TRANSPORT_H */
