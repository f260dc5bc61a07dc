/*
 * Engine core internals shared by engine.c, region.c, peer.c, batch.c and
 * stats.c. Transports never include this file: they see the engine through
 * engine/transport.h only.
 *
 * Lock order (outer first): peer conn_lock -> batch mu -> monitor mu ->
 * region table mu; peer mu and engine err_mu are leaves.
 */
#ifndef XFER_ENGINE_INTERNAL_H
#define XFER_ENGINE_INTERNAL_H

#include "transport.h"

#include <pthread.h>
#include <stdint.h>
#include <string.h>

#define XFER_MAX_TRANSPORTS 8 /* transport bit positions */

/* Copies the string src into dst[cap] (cap > 0), cut to fit and terminated:
 * snprintf("%s") did the same at ~300-600 instructions a call, several per
 * message (docs/notify.md, "Per-message allocations"). */
static inline void xfer_copy_str(char *dst, size_t cap, const char *src)
{
    size_t n = strnlen(src, cap - 1);
    memcpy(dst, src, n);
    dst[n] = '\0';
}

/* ---- regions ------------------------------------------------------------ */
#define REGION_PINS_DEAD (1 << 30)

struct xfer_region {
    xfer_engine *engine;
    char name[XFER_NAME_MAX];
    uint32_t id, gen;
    enum xfer_mem_kind kind;
    int device;
    uint8_t *ptr;
    size_t len;
    unsigned access;
    struct xfer_layout layout;
    int memfd;           /* -1 unless backed by a memfd */
    bool owns_map;       /* munmap ptr on deregistration */
    void *cuda_ipc_base; /* xfer_region_adopt_cuda: opened mapping, closed on free */
    uint8_t cuda_ipc_handle[64];
    bool has_cuda_ipc_handle;
    int pins;      /* target accesses + running batches (atomic): added under the table mu while
                      alive, dropped without it; REGION_PINS_DEAD set once deregistration waits */
    bool dead;     /* deregistration or detach started; set under the table mu
                      (atomic store: region_pin_n reads it without the lock) */
    bool detached; /* dead by xfer_region_detach, not yet deregistered; table mu */
    struct guard_table *guards; /* lease rules (lease.c), NULL = none; table mu */
    void *tdata[XFER_MAX_TRANSPORTS];
};

struct region_name { /* remembers id and last generation per name */
    char name[XFER_NAME_MAX];
    uint32_t id, gen;
};

struct region_table {
    pthread_mutex_t mu;
    pthread_cond_t unpinned;
    xfer_region **v; /* registered, sorted by id */
    size_t n, cap;
    struct region_name *names;
    size_t n_names, cap_names;
    uint32_t next_id;
    int dying; /* regions waiting for their pins to drain; atomic */
};

/* Lease rules (lease.c), table mu held: 0 when peer may access [off,
 * off+len) of r, else -XFER_ESTALE. */
int guard_check(const xfer_region *r, const char *peer, uint64_t off, uint64_t len);
/* Frees r's rules (deregistration, table mu held or r unreachable). */
void guard_free(xfer_region *r);
/* r is going or guarded: transports withdraw direct access they lent to
 * peers (ipc); returns once no such access runs. No table lock held. */
void region_withdraw_direct(xfer_engine *e, xfer_region *r);

/* Closes an adopted CUDA IPC mapping (region_cuda.c). */
void region_cuda_close(xfer_region *r);
int region_cuda_copy_in(xfer_region *r, uint64_t off, const void *src, size_t len, char *why,
                        size_t why_len);
/* Initiator-side pin of a local region for a running batch. */
bool region_pin(xfer_region *r);
/* n pins at once (one count for a run of items on the same region); no lock. */
bool region_pin_n(xfer_region *r, int n);
void region_unpin_n(xfer_region *r, int n);
void region_unpin(xfer_region *r);
void region_table_init(struct region_table *t);
/* memfd of len bytes, mapped and pre-faulted, on huge pages where the host
 * has them (region_mem.c). 0 or -XFER_E* with the reason in the last error. */
int region_mem_alloc(xfer_engine *e, const char *name, size_t len, int *fd_out, void **ptr_out);
void region_table_destroy(xfer_engine *e);

/* ---- peers -------------------------------------------------------------- */
/* Counters that many threads add to (issue 15, docs/perf.md "Shared state on
 * the tcp data path" and "Step 17"): each thread adds to a shard chosen once per thread, so
 * threads completing items at once do not pass one cache line around; the
 * first STATS_SHARDS / 2 own theirs (plain stores), the rest share the
 * others (atomic adds); readers sum the shards (stats.c). */
#define STATS_SHARDS 16
struct stats_shard {
    struct xfer_stats s;
} __attribute__((aligned(64)));
struct stats_set {
    struct stats_shard sh[STATS_SHARDS];
};

struct xfer_peer {
    xfer_engine *engine;
    pthread_rwlock_t conn_lock; /* write: connect/disconnect; read: post */
    struct xfer_conn *conn;
    unsigned tbit;        /* transport of conn */
    uint64_t conn_gen;    /* conn_lock: bumped whenever conn changes */
    bool conn_down;       /* atomic: conn can carry nothing (peer_repair.c) */
    int64_t repair_at_ms; /* repair thread only: next attempt (backoff) */
    int repair_delay_ms;  /* repair thread only: current backoff */
    pthread_mutex_t mu;   /* desc and region cache */
    struct xfer_peer_desc desc;
    struct xfer_region_desc *regions;
    size_t n_regions, cap_regions;
    struct stats_set stats;
};

struct peer_table {
    pthread_mutex_t mu;
    xfer_peer **v;
    size_t n, cap;
};

void peer_table_init(struct peer_table *t);
void peer_table_destroy(xfer_engine *e);

/* ---- batches ------------------------------------------------------------ */
struct batch_monitor { /* enforces deadlines of running batches */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    bool started, stop;
    int64_t wake_ns;  /* when the sleeping monitor wakes next: a submit with a
                         later deadline need not wake it (mu) */
    xfer_batch *head; /* running batches, doubly linked */
};

/* Drops items appended after the first n (undoes a partial multi-add). */
void batch_truncate(xfer_batch *b, size_t n);
xfer_engine *batch_engine(const xfer_batch *b);
int batch_monitor_start(xfer_engine *e);
/* Cancels every running batch, then stops the thread. */
void batch_monitor_stop(xfer_engine *e);
/* Frees the batches kept for reuse (engine free, after the monitor). */
void batch_idle_drain(xfer_engine *e);

/* ---- connection repair (peer_repair.c) ------------------------------------ */
struct peer_repair { /* replaces dead connections in the background */
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* wakes the thread (stop, kick) */
    pthread_cond_t done_cv; /* current went back to NULL */
    pthread_t thread;
    bool started, stop;
    xfer_peer *current; /* mu: the peer being repaired; its removal waits */
};
int peer_repair_start(xfer_engine *e);
void peer_repair_stop(xfer_engine *e);
/* xfer_peer_remove, after taking p off the table: waits while the repair
 * thread still works on p (one attempt, bounded by connect_timeout_ms). */
void peer_repair_quiesce(xfer_engine *e, xfer_peer *p);
/* A post found the connection dead: note it and wake the repair thread.
 * conn_lock held for reading. Only for transports with conn_state(). */
void peer_repair_kick(xfer_peer *p);

/* ---- engine messages (msg.c, notify_queue.c, notify_bind.c) -------------- */
/* An outgoing message on its way through the message thread (msg.c). */
struct msg_out {
    struct xfer_msg m; /* frame points just past this struct */
    struct msg_out *next;
    xfer_peer *peer;
    /* Called once with the outcome, then o is freed by msg.c. */
    void (*done)(struct msg_out *o, int status, const char *why);
    xfer_batch *b; /* held until done */
    size_t note;   /* index of the binding in b */
    uint64_t run;  /* b's run that sent it */
    uint64_t id;   /* RTS: the send id */
    bool cached;   /* a block of msg.c's cache: msg_out_free gives it back */
};

struct msg_thread { /* sends queued messages: takes peer conn_lock, calls send_msg */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    bool started, stop;
    struct msg_out *head, *tail;
    uint64_t seq;           /* atomic: message numbers */
    bool kick;              /* run the matcher (msg_match.c) */
    int64_t swept_ns;       /* last mm_sweep */
    bool busy;              /* the thread works outside mu */
    uint64_t rounds;        /* works finished */
    pthread_cond_t done_cv; /* a work finished (msg_peer_gone waits) */
    /* inflight and direct change without mu (atomic, sequentially consistent):
     * three lock rounds per message were ~150 instructions; whoever waits
     * for them to reach 0 counts itself in waiters under mu, and the one
     * that brings a counter to 0 takes mu and broadcasts only then. */
    size_t inflight;        /* queued or handed to a transport, not done yet */
    pthread_cond_t idle_cv; /* inflight reached 0 (msg_thread_stop drains) */
    size_t direct;          /* kept by direct sections, not delivered yet */
    int waiters;            /* threads waiting on idle_cv or done_cv for those */
    bool behind; /* notifications may go behind their data (XFER_NOTIFY_BEHIND=0: never) */
};
int msg_thread_start(xfer_engine *e);
/* Lets messages already queued or in flight finish (at most
 * MSG_DRAIN_MS: a FIN the user's last RECV queued must reach its sender),
 * then fails what is still queued with -XFER_ECANCELED, joins the thread. */
void msg_thread_stop(xfer_engine *e);
/* Allocates an outgoing message with room for a frame of len bytes. */
struct msg_out *msg_out_new(size_t len);
/* Frees o (NULL: nothing) without finishing it. */
void msg_out_free(struct msg_out *o);
/* xfer_notif_free: a received notification back to msg.c's cache. */
void msg_notif_free(struct xfer_notif *n);
/* xfer_peer_remove, after p's connection was dropped: messages queued for
 * p and two-sided entries naming it end -XFER_ECONN, and the message thread
 * has let go of p when this returns. */
void msg_peer_gone(xfer_engine *e, xfer_peer *p);
/* Queues o for o->peer: 0 and o->done is called exactly once (never from
 * inside this call), or -XFER_ECANCELED (engine stopping; o is the caller's).
 * Inside a direct section the calling thread delivers o at the section's end. */
int msg_send(xfer_engine *e, struct msg_out *o);
/* A message handed to a transport without msg_send (a notification sent
 * behind its data): counted like one in flight; -XFER_ECANCELED if the
 * engine stops. */
int msg_handed(xfer_engine *e);
/* A direct section (nestable): messages queued in it are delivered by this
 * thread at msg_direct_end, which must be called with no lock held (it
 * takes peers' conn_lock and calls send_msg). */
void msg_direct_begin(void);
void msg_direct_end(void);
uint64_t msg_next_seq(xfer_engine *e);

struct notify_queue { /* received notifications, FIFO ring */
    pthread_mutex_t mu;
    /* Readable while n > 0, once someone may sleep on it: xfer_notif_fd()
     * was called (exported), or threads in xfer_notif_wait may poll it
     * (sleepers). A waiter that queues a notification itself (it read the
     * socket) writes it for nobody: armed says whether it was written. */
    int efd;
    bool exported, armed;
    int sleepers;
    struct xfer_notif **v;
    size_t cap, head, n;
    uint64_t refused;
};
int notify_queue_init(xfer_engine *e);
void notify_queue_destroy(xfer_engine *e);
/* Takes ownership of n: 0, or -XFER_ENOSPC (queue full; n is not freed). */
int notify_queue_push(xfer_engine *e, struct xfer_notif *n);

/* Notifications bound to a batch (notify_bind.c), kept under the batch mu. */
#define NOTE_INLINE 48 /* message bytes kept in the binding itself (no malloc) */
struct batch_note {
    xfer_peer *peer;
    uint8_t *msg; /* malloc'd copy when len > NOTE_INLINE, else NULL: inl */
    size_t len;
    uint8_t inl[NOTE_INLINE];
    /* per run */
    uint32_t n_items, n_open, n_failed;
    struct xfer_notif_fail *failed; /* the first XFER_NOTIFY_FAILED_MAX */
    uint32_t n_listed, cap_listed;
    bool fired;
    bool behind; /* its frame went behind the items' data (transport's send_behind) */
    int status;  /* -XFER_EINPROGRESS until acknowledged or failed */
    char why[96];
};

struct batch_notes {
    struct batch_note *v; /* one1 while one binding fits (the usual), else malloc'd */
    struct batch_note one1[1];
    size_t n, cap;
    size_t n_unacked; /* bindings of this run not yet finished */
    uint64_t run;     /* bumped at each submit */
};

int notes_bind(struct batch_notes *ns, xfer_peer *p, const void *msg, size_t len);
void notes_free(struct batch_notes *ns);
/* A new run: resets every binding; then notes_count() once per item. */
void notes_start(struct batch_notes *ns);
void notes_count(struct batch_notes *ns, xfer_peer *p);
/* Item idx for peer p ended with status; returns the index of a binding that
 * is now ready to send, or -1. */
long notes_item_end(struct batch_notes *ns, xfer_peer *p, size_t idx, int status);
/* Binding of p whose items are exactly the n open items idx (all of them,
 * none ended yet), not sent yet: its index, else -1. */
long notes_behind_ok(const struct batch_notes *ns, const xfer_peer *p, size_t n);
/* Binding k's frame sent behind the data was declined by the target: it
 * is sent the fenced way; true if its items all ended (send it now). */
bool notes_behind_declined(struct batch_notes *ns, size_t k);
/* Builds binding k's frame; NULL when out of memory. */
struct msg_out *notes_frame(xfer_engine *e, struct batch_notes *ns, size_t k);
/* Binding k finished with status: true if it was still open. */
bool notes_finish(struct batch_notes *ns, size_t k, int status, const char *why);
/* Ends every open binding with status (deadline, cancel). */
void notes_abort(struct batch_notes *ns, int status, const char *why);
/* First failing binding's code, else 0. */
int notes_result(const struct batch_notes *ns);

/* ---- two-sided messages (msg_match.c, batch_msg.c; docs/notify.md) ------- */
#define XFER_MSG_UNEXPECTED_MAX 4096 /* RTS waiting for a RECV, per engine */
struct xfer_msg_rts;
struct xfer_msg_fin;
struct mm_recv;
struct mm_rts;
struct mm_send;
struct msg_match { /* leaf lock: never held while calling out */
    pthread_mutex_t mu;
    struct mm_recv *recv_head, *recv_tail; /* posted RECV items, FIFO */
    struct mm_rts *rts_head, *rts_tail;    /* arrived RTS not matched yet, FIFO */
    size_t n_rts;
    struct mm_send *sends; /* SEND items waiting for their FIN */
    uint64_t next_send_id;
    bool eager;             /* small SENDs carry their bytes (XFER_MSG_EAGER=0: never) */
    bool short_rts;         /* XFER_SEND_LOCAL sends the short RTS (XFER_MSG_SHORT=0: not) */
    unsigned matching;      /* pairs taken, being handed to their batch */
    /* The peer the last RTS came from (rts_queue): most come from the same
     * one as the last, and the look-up by name took the peer table's lock
     * and a walk of it. Cleared by the sweep of that peer's removal, under
     * mu, so it never outlives the peer. */
    xfer_peer *last_from;
    pthread_cond_t idle_cv; /* matching reached 0 (mm_peer_gone waits) */
};
void msg_match_init(xfer_engine *e);
/* After the message thread stopped: ends what is left (-XFER_ECANCELED). */
void msg_match_destroy(xfer_engine *e);
/* b->mu held: registers RECV / SEND item i of run (takes a batch hold).
 * mm_recv_add: 1 if RTS were waiting (mm_match_run may pair them), else 0. */
int mm_recv_add(xfer_engine *e, xfer_batch *b, size_t i, uint64_t run, xfer_peer *want,
                uint64_t tag, uint64_t cap, bool host);
int mm_send_add(xfer_engine *e, xfer_batch *b, size_t i, uint64_t run, xfer_peer *p, uint64_t len,
                uint64_t *send_id);
/* b->mu held: item i ended; drops its registration if it still has one. */
void mm_forget(xfer_engine *e, xfer_batch *b, size_t i);
/* Queues an RTS (no lock needed) / a FIN (b->mu may be held). */
void mm_send_rts(xfer_engine *e, xfer_batch *b, xfer_peer *p, const struct xfer_msg_rts *r);
/* The RTS of a locally completed SEND (item i of b, r->local): the item
 * ends when the transport reports the frame written (or answered). */
void mm_send_local(xfer_engine *e, xfer_batch *b, size_t i, xfer_peer *p,
                   const struct xfer_msg_rts *r);
void mm_send_fin(xfer_engine *e, xfer_peer *to, uint64_t send_id, int status, uint64_t got);
/* No lock held (message thread, submitter): pairs arrived RTS with posted
 * RECVs; mm_sweep fails entries whose peer's connection is gone
 * (-XFER_ECONN). */
void mm_match_run(xfer_engine *e);
void mm_sweep(xfer_engine *e);
/* xfer_peer_remove: entries naming p end -XFER_ECONN, RTS from p go. */
void mm_peer_gone(xfer_engine *e, xfer_peer *p);
/* Transport threads (xfer_engine_msg_recv): 0 or the status to answer. */
int mm_rts_arrived(xfer_engine *e, const char *node, uint64_t inc, const struct xfer_msg_rts *r);
int mm_fin_arrived(xfer_engine *e, const char *node, const struct xfer_msg_fin *f);
/* batch_msg.c, no lock held: RECV item i of run got the message r from p:
 * it becomes a READ of the sender's region (or ends -XFER_ETRUNC).
 * -XFER_ENOENT when the item no longer waits (ended, another run). Drops
 * the caller's hold on b (under the lock it takes anyway). */
int batch_recv_matched(xfer_batch *b, size_t i, uint64_t run, xfer_peer *p,
                       const struct xfer_msg_rts *r);
/* b->mu held and another reference alive: drops one hold without the lock
 * xfer_batch_put takes. */
void batch_unhold_locked(xfer_batch *b);
/* The matcher's entry of SEND item i was taken (its FIN, or the answer
 * standing for it, came): its end has nothing to forget. Matcher mu held. */
void batch_send_unlisted(xfer_batch *b, size_t i);
/* b->mu held: drops one hold, lets go of b->mu, frees b if it was the last. */
void batch_put_unlock(xfer_batch *b);
/* Kicks the message thread to run the matcher. */
void msg_kick(xfer_engine *e);

/* ---- engine ------------------------------------------------------------- */
struct xfer_engine {
    struct xfer_engine_config cfg; /* strings point at the copies below */
    char node_id[XFER_NAME_MAX];
    char listen_addr[XFER_ADDR_MAX];
    char host_id[XFER_HOSTID_MAX];
    void *secret;
    uint64_t incarnation;
    uint16_t data_port;
    unsigned transport_mask;                                /* opened transports */
    struct xfer_transport *transports[XFER_MAX_TRANSPORTS]; /* preference order */
    size_t n_transports;
    struct region_table regions;
    struct peer_table peers;
    struct batch_monitor monitor;
    uint32_t batch_seq; /* atomic: the last run's sequence number (batch.c) */
    /* Small finished batches freed by the application, reset and kept for
     * the next xfer_batch_new (batch.c, "kept batches"); atomic slots */
    void *idle_b[4]; /* kept xfer_batch (batch.c), lock-free slots (blk_cache.h) */
    struct peer_repair repair;
    struct msg_thread msgs;
    struct notify_queue notifs;
    struct msg_match match;
    struct stats_set stats;
    struct stats_set tstats[XFER_MAX_TRANSPORTS];
    pthread_mutex_t err_mu;
    char last_err[256];
};

/* ---- statistics (stats.c) ------------------------------------------------ */
/* Bit position of a single-bit mask, or -1. */
int transport_index(unsigned bit);
/* One item ended: counted in each of sets[0..n) (node, peer, transport). */
void stats_count_item(struct stats_set *const *sets, size_t n, enum xfer_op op, uint64_t bytes,
                      int status, uint64_t lat_us);
/* items successful items of op, bytes in all, each lat_us: one atomic add
 * per counter for all of them (items ended together, batch.c). */
void stats_count_items(struct stats_set *const *sets, size_t n, enum xfer_op op, uint64_t items,
                       uint64_t bytes, uint64_t lat_us);
void stats_count_served(struct stats_set *s, uint64_t bytes, int status);
/* The sum of the shards (each counter read atomically, the set not). */
void stats_read(const struct stats_set *s, struct xfer_stats *out);

#endif
