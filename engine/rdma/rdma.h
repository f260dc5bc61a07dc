/*
 * rdma transport — private state shared by the files of engine/rdma/.
 *
 *   rdma_device.c     verbs devices, active ports, GID choice, NIC list
 *   rdma_mr.c         memory registration (host, CUDA dma-buf), rkeys
 *   rdma_cm.c         the CM thread: listeners, accepts, QP (re)connection
 *   rdma_post.c       chunking, striping, posting WRs (the data path)
 *   rdma_progress.c   progress threads: one CQ per thread and NIC
 *   rdma_msg.c        engine messages: SEND/RECV, credits, the HELLO
 *   rdma_lease.c      leases, owner side: memory windows bound per peer QP
 *   rdma_win.c        leases, initiator side: window requests and cache
 *   rdma_transport.c  the ops table, open/close, connect/disconnect
 *   rdma_plan.c       pure arithmetic and formats;  rdma_auth.c  CM private data
 *
 * Threads: the CM thread alone creates and destroys cm ids and QPs. Progress
 * threads poll CQs and complete chunks. post() runs in the caller's thread.
 * Locks: conn->lock before slot->lock; t->lock only for the slot table and
 * the connection list. Completions reach the engine (chunk_done, io_end,
 * put) with no slot lock held; the engine's batch lock is a leaf (it never
 * calls back into a transport), so io_begin under conn and slot locks and
 * the rare failed-post completion under the conn lock cannot deadlock.
 */
#ifndef XFER_RDMA_H
#define XFER_RDMA_H

#include "rdma_auth.h"
#include "rdma_plan.h"
#include "transport.h"
#include "xfer_io.h" /* xfer_now_ms */

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <pthread.h>
#include <sys/socket.h>

#define RDMA_MAX_SLOTS    4096 /* QPs per transport (12 bits of wr_id) */
#define RDMA_MAX_PROGRESS 8
#define RDMA_SEQ_BITS     40
#define RDMA_SEQ_MASK     ((1ull << RDMA_SEQ_BITS) - 1)
/* A flushed chunk did nothing wrong (another WR put its QP in error) and is
 * re-posted; every QP error ends the item at its head, so this cap is only a
 * safety net against a QP that fails with no culprit over and over. */
#define RDMA_MAX_RETRIES 64

/* Engine messages (rdma_msg.c, docs/rdma.md "Messages"). Every accepted QP
 * keeps RDMA_MSG_CREDITS receives of a whole frame posted; an initiator has
 * at most that many requests in flight per QP (credits), so a SEND always
 * finds a receive and RNR is a safety net, not flow control. */
#define RDMA_MSG_CREDITS  4
#define RDMA_MSG_HDR      24
#define RDMA_MSG_BUF      (RDMA_MSG_HDR + XFER_MSG_FRAME_MAX) /* a request and its receive */
#define RDMA_MSG_SMALL    64                                  /* a response and its receive */
#define RDMA_MAX_ACCEPTED 4096                                /* accepted QPs per transport */
/* Memory-window binds and invalidations in flight per accepted QP. */
#define RDMA_WIN_INFLIGHT 16
/* Per NIC: every slot's response receives, every accepted QP's request
 * receives, (2 x credits) response sends and its window operations. */
#define RDMA_MSG_CQ_DEPTH                                                                          \
    (RDMA_MAX_SLOTS * RDMA_MSG_CREDITS +                                                           \
     RDMA_MAX_ACCEPTED * (3 * RDMA_MSG_CREDITS + RDMA_WIN_INFLIGHT))
#define RDMA_MSG_RNR_TIMER 12 /* min_rnr_timer code: 0.64 ms */

enum rdma_tag { TAG_LISTENER = 1, TAG_SLOT, TAG_ACCEPTED };

struct rdma_nic {
    enum rdma_tag tag; /* id->context of the listener */
    int index;
    struct ibv_context *ctx; /* librdmacm's context (rdma_get_devices) */
    struct xfer_rdma_nic_desc desc;
    int gid_index;
    enum ibv_mtu mtu;
    char sysfs[256]; /* realpath of <ibdev>/device, "" if unknown */
    uint32_t max_qp_wr;
    uint8_t rd_atom; /* RDMA READs in flight per QP */
    uint32_t max_msg;
    bool mw2; /* type-2 memory windows (leases, rdma_lease.c) */
    struct ibv_pd *pd;
    struct ibv_comp_channel *msg_ch; /* engine messages: polled by progress thread 0 */
    struct ibv_cq *msg_cq;           /* slots' receives; accepted QPs' receives and sends */
    struct rdma_cm_id *listen_id;
    struct sockaddr_storage addr; /* where this NIC listens / connects from */
};

struct rdma_progress {
    struct rdma_transport *t;
    int index;
    pthread_t thread;
    bool running;
    int wake_fd; /* eventfd: stop */
    struct ibv_comp_channel *ch[XFER_RDMA_MAX_NICS];
    struct ibv_cq *cq[XFER_RDMA_MAX_NICS];
    uint32_t cq_room[XFER_RDMA_MAX_NICS]; /* CQEs not yet promised to a QP */
};

enum slot_state {
    SLOT_FREE = 0,
    SLOT_IDLE,       /* allocated, waiting for the CM thread to connect */
    SLOT_CONNECTING, /* resolving / connecting */
    SLOT_READY,      /* connected: chunks may be posted */
    SLOT_ERROR,      /* QP in error: no posts, waiting for the ring to drain */
    SLOT_DEAD,       /* ring drained: the CM thread tears it down */
    SLOT_FAILED,     /* refused for good (authentication, version) */
};

struct rdma_conn;

/* One RC QP of a connection, reached from wr_id by its table index. */
struct rdma_slot {
    enum rdma_tag tag; /* id->context */
    pthread_mutex_t lock;
    enum slot_state state;
    uint32_t index;
    uint16_t uid; /* incarnation; stale CQEs carry an old one */
    struct rdma_conn *conn;
    int lnic, rnic;
    struct rdma_progress *prog;
    struct rdma_cm_id *id;
    struct xfer_rdma_nonce nonce; /* of the REQ in flight, to check the REP proof */
    uint32_t depth;               /* send queue depth */
    uint32_t unsignaled;          /* posted unsignaled since the last signaled WR */
    uint64_t next_seq;
    struct xfer_rdma_ring ring; /* posted, not yet completed */
    int64_t retry_at_ms;
    int failures;     /* connection attempts failed in a row */
    int conn_pos;     /* index in conn->slots: its response receive buffers */
    uint32_t credits; /* receives the target holds for our requests */
    bool hello_sent;  /* the HELLO went out on this QP (first message) */
};

/* An engine message in flight on one of a connection's QPs (rdma_msg.c).
 * Its entry (and bounce buffer) is free again once both the SEND's
 * completion and the answer (or the QP's end) were seen. */
struct rdma_msg_out {
    bool used, sent, answered;
    uint32_t slot; /* t->slots index and incarnation it was posted on */
    uint16_t uid;
    uint64_t req_id;
    struct xfer_msg *m;     /* NULL: the HELLO or a window request */
    struct rdma_want *want; /* a window request (rdma_win.c) */
};

struct rdma_msg_wait {
    struct rdma_msg_wait *next;
    struct xfer_msg *m;
};

struct rdma_pending {
    struct rdma_pending *next;
    struct xfer_rdma_chunk c;
    uint64_t want; /* parked in conn->wwait: the window request it waits for */
};

/* Initiator (rdma_win.c): the memory windows an owner bound for one of our
 * QPs (valid while the QP keeps incarnation uid), in remote addresses. */
struct rdma_win_entry {
    uint32_t rid, rgen, key;
    uint64_t start, end;
};
struct rdma_win_cache {
    uint16_t uid;
    uint32_t n, cap;
    struct rdma_win_entry *v;
};
/* A window request to send (or sent) on the QP at conn->slots[pos]. */
struct rdma_want {
    struct rdma_want *next;
    uint64_t id;
    int pos;
    uint16_t uid;
    bool sent;
    uint32_t rid, rgen;
    uint64_t rbase, addr, len; /* remote region base; the range asked for */
    enum xfer_op op;
};

struct rdma_conn {
    struct xfer_conn base;
    struct rdma_transport *t;
    pthread_mutex_t lock;
    pthread_cond_t cond; /* slot state changes, teardown, refs */
    struct xfer_peer_desc peer;
    int n_rnics;
    struct xfer_rdma_nic_desc rnics[XFER_RDMA_MAX_NICS];
    int n_slots;
    uint32_t slots[XFER_RDMA_MAX_NICS * 16];
    struct rdma_pending *head, *tail; /* chunks waiting for a QP */
    uint32_t rr;                      /* striping cursor */
    bool closing, torn_down;
    bool unreachable; /* atomic: no QP up, none coming, the last attempt failed */
    int refs;         /* progress threads using conn outside its lock */
    char why[192];    /* last connection failure */
    int why_rc;
    /* engine messages (rdma_msg.c), under lock */
    uint8_t *msg_mem; /* RDMA_MSG_CREDITS bounce buffers, then responses' receives */
    struct ibv_mr *msg_mr[XFER_RDMA_MAX_NICS];
    struct rdma_msg_out out[RDMA_MSG_CREDITS];
    struct rdma_msg_wait *mq_head, *mq_tail; /* waiting for a QP and a credit */
    int msg_slot;                            /* index in slots[] carrying them, -1 none */
    uint64_t next_req;
    /* lease windows (rdma_win.c), under lock */
    struct rdma_win_cache wcache[XFER_RDMA_MAX_NICS * 16]; /* per slots[] position */
    struct rdma_want *wants;
    struct rdma_pending *wwait; /* chunks parked until their window arrives */
    uint64_t next_want;
    struct rdma_conn *next; /* t->conns */
};

struct rdma_accepted {
    enum rdma_tag tag;
    struct rdma_cm_id *id;
    char node[17];
    struct rdma_accepted *next;
    /* engine messages (rdma_msg.c); the table entry under t->acc_lock */
    struct xfer_rdma_req req; /* nonce and label: checks the HELLO */
    uint32_t index;
    uint16_t gen;
    int lnic;
    uint8_t *mem; /* request receives, then response sends */
    struct ibv_mr *mr;
    uint32_t send_free, send_next;
    int busy; /* progress thread using it: close waits */
    bool closing, hello_ok;
    char peer[XFER_NAME_MAX]; /* from the HELLO */
    uint64_t peer_inc;
    /* lease windows bound on this QP (rdma_lease.c), under t->win_lock */
    int win_inflight; /* binds and invalidations posted, not completed */
    bool win_closed;  /* the QP is being destroyed: post nothing more */
};

/* Owner (rdma_lease.c): a type-2 memory window bound on accepted QP a over
 * [off, off+len) of region r, for a's peer, while the lease rules admit it. */
struct rdma_window {
    uint32_t index;
    uint16_t gen;
    struct rdma_accepted *a;
    xfer_region *r;
    const struct rdma_region *rr;
    struct ibv_mw *mw;
    uint32_t key;
    uint64_t off, len;
    int64_t until;  /* re-check by then (a lease deadline), INT64_MAX never */
    uint64_t round; /* the revocation that invalidates it, 0 none */
    int inflight;   /* its bind / invalidation posted, not completed */
};

struct rdma_transport {
    struct xfer_transport base;
    const struct xfer_engine_config *cfg;
    struct xfer_rdma_self self;
    int n_nics;
    struct rdma_nic nics[XFER_RDMA_MAX_NICS];
    struct ibv_context **dev_list; /* rdma_get_devices() */
    char nic_list[XFER_NICS_MAX];
    /* tunables (env) */
    int qps_per_nic;
    uint32_t sq_depth, signal_every, cq_depth;
    uint64_t chunk;
    /* threads */
    struct rdma_event_channel *channel;
    pthread_t cm_thread;
    bool cm_running, stopping;
    int cm_wake_fd; /* eventfd */
    int n_progress;
    struct rdma_progress progress[RDMA_MAX_PROGRESS];
    /* slot table and connections */
    pthread_mutex_t lock;
    struct rdma_slot *slots; /* RDMA_MAX_SLOTS */
    struct rdma_conn *conns;
    struct rdma_region *regions;    /* registered, under lock */
    struct rdma_accepted *accepted; /* CM thread only */
    pthread_mutex_t acc_lock;       /* acc[], acc_gen[], accepted QPs' message state */
    pthread_cond_t acc_cond;
    struct rdma_accepted *acc[RDMA_MAX_ACCEPTED];
    uint16_t acc_gen[RDMA_MAX_ACCEPTED];
    struct xfer_rdma_replay replay; /* CM thread only */
    /* lease windows bound by this owner (rdma_lease.c) */
    pthread_mutex_t win_lock; /* after acc_lock; before the region table */
    pthread_cond_t win_cond;  /* a window went away */
    struct rdma_window **wins;
    uint16_t *win_gen;
    uint32_t win_cap, win_hint;
    int64_t win_next; /* earliest until: the CM thread re-checks then */
    uint64_t win_round;
};

/* Per-region registration: one MR per local NIC. */
struct rdma_region {
    int n;
    struct ibv_mr *mr[XFER_RDMA_MAX_NICS];
    int device; /* CUDA ordinal or -1: picks the nearest NICs */
    uint32_t near_mask;
    bool windowed;          /* XFER_ACCESS_LEASED: no remote access on the MRs, windows only */
    unsigned remote_access; /* IBV_ACCESS_REMOTE_* of the region (windows get it) */
    xfer_region *owner;
    struct rdma_region *prev, *next; /* t->regions: released by close */
};

static inline struct rdma_transport *xrdma_of(struct xfer_transport *t)
{
    return container_of(t, struct rdma_transport, base);
}

/* rdma_device.c */
int xrdma_devices_probe(char *why, size_t why_len);
int xrdma_devices_open(struct rdma_transport *t, char *why, size_t why_len);
void xrdma_devices_close(struct rdma_transport *t);
/* Local NICs nearest (PCI) to CUDA device dev; all NICs for host memory. */
uint32_t xrdma_nics_near(struct rdma_transport *t, int cuda_device);

/* rdma_mr.c */
int xrdma_reg_mem(struct xfer_transport *t, xfer_region *r);
void xrdma_dereg_mem(struct xfer_transport *t, xfer_region *r);
/* Deregisters what the engine did not (it closes transports first). */
void xrdma_regions_release(struct rdma_transport *t);
void xrdma_describe_region(struct xfer_transport *t, const xfer_region *r,
                           struct xfer_region_desc *out);

/* rdma_cm.c */
int xrdma_cm_start(struct rdma_transport *t, char *why, size_t why_len);
void xrdma_cm_stop(struct rdma_transport *t);
void xrdma_cm_kick(struct rdma_transport *t);

/* rdma_progress.c */
int xrdma_progress_start(struct rdma_transport *t, char *why, size_t why_len);
void xrdma_progress_stop(struct rdma_transport *t);

/* xrdma_post.c */
int xrdma_post(struct xfer_conn *c, xfer_batch *b, const size_t *idx, size_t n);
/* Posts waiting chunks on QPs with room. conn->lock held. */
void xrdma_pump_locked(struct rdma_conn *c);
/* Completes a chunk: io_end if begun, chunk_done, put. No lock held. */
void xrdma_chunk_finish(struct xfer_rdma_chunk *ch, bool io_begun);
/* A flushed chunk goes back to the connection's queue when it may be
 * retried, else it is finished with its error. io already ended. */
void xrdma_chunk_retry_or_fail(struct rdma_conn *c, struct xfer_rdma_chunk *ch);
/* Fails every waiting chunk of c with rc/why. conn->lock held; the engine
 * callbacks run after it is released via the list returned. */
struct rdma_pending *xrdma_take_pending_locked(struct rdma_conn *c);
void xrdma_fail_pending(struct rdma_pending *list, int rc, const char *why);

static inline uint64_t xrdma_wr_id(const struct rdma_slot *s, uint64_t seq)
{
    return (uint64_t)s->index << 52 | (uint64_t)(s->uid & 0xfff) << RDMA_SEQ_BITS |
           (seq & RDMA_SEQ_MASK);
}

/* Moves s's QP to error (a post failed); true when the CM thread must look
 * now. s->lock held. */
bool xrdma_break_qp_locked(struct rdma_slot *s);

/* rdma_msg.c */
int xrdma_send_msg(struct xfer_conn *c, struct xfer_msg *m);
/* Bounce and response buffers of a connection, registered on every NIC. */
int xrdma_msg_conn_init(struct rdma_conn *c, int max_slots);
void xrdma_msg_conn_free(struct rdma_conn *c); /* after teardown */
/* Posts waiting messages on the connection's message QP. conn->lock held. */
void xrdma_msg_pump_locked(struct rdma_conn *c);
/* A slot's QP is connected: response receives, credits, RNR timer (CM thread). */
void xrdma_msg_slot_up(struct rdma_slot *s);
/* A slot's QP (incarnation uid) is gone, destroyed and its ring drained:
 * its unanswered messages fail with -XFER_ECONN. No lock held. */
void xrdma_msg_slot_down(struct rdma_conn *c, struct rdma_slot *s, uint16_t uid, const char *why);
/* The SEND of a message completed (ring entry with ch->msg). No lock held. */
void xrdma_msg_sent(struct xfer_rdma_chunk *ch);
/* Fails every waiting message of c. No lock held. */
void xrdma_msg_fail_waiting(struct rdma_conn *c, int rc, const char *why);
/* Target side (CM thread): creates the QP of an accepted request on nic with
 * its receives posted; after rdma_accept, xrdma_msg_accepted_ready. */
int xrdma_msg_accept_qp(struct rdma_transport *t, struct rdma_nic *nic, struct rdma_accepted *a);
void xrdma_msg_accepted_ready(struct rdma_accepted *a);
/* Forgets a's message state, waits for the progress thread to let go;
 * after its QP is destroyed, _free releases its buffers. */
void xrdma_msg_accepted_close(struct rdma_transport *t, struct rdma_accepted *a);
void xrdma_msg_accepted_free(struct rdma_accepted *a);
/* A completion of a NIC's message CQ (progress thread 0). */
void xrdma_msg_cqe(struct rdma_transport *t, const struct ibv_wc *wc);
/* Posts a window request of w on s, the HELLO first where s sent none
 * (c->lock and s->lock held, s READY): 1 posted, 0 no room now, -1 the
 * post failed (the caller breaks the QP). */
int xrdma_msg_send_win_locked(struct rdma_conn *c, struct rdma_slot *s, struct rdma_want *w);

/* rdma_lease.c (owner) */
void xrdma_lease_init(struct rdma_transport *t);
void xrdma_lease_fini(struct rdma_transport *t);
int xrdma_lease_check(struct xfer_transport *t, xfer_region *r);
void xrdma_leases_changed(struct xfer_transport *t);
/* A window request from a's peer (progress thread 0): binds a window and
 * fills the answer's payload (out, *out_len); 0 or the refusal. */
int xrdma_lease_serve(struct rdma_transport *t, struct rdma_accepted *a, const uint8_t *p, size_t n,
                      uint8_t *out, size_t *out_len);
/* A completion of a window bind or invalidation (wr_id kind 0). */
void xrdma_lease_cqe(struct rdma_transport *t, const struct ibv_wc *wc);
/* Before / after a's QP is destroyed (CM thread). */
void xrdma_lease_accepted_closing(struct rdma_transport *t, struct rdma_accepted *a);
void xrdma_lease_accepted_gone(struct rdma_transport *t, struct rdma_accepted *a);
/* Region rr goes: its windows are invalidated and freed (before its MRs). */
void xrdma_lease_region_gone(struct rdma_transport *t, const struct rdma_region *rr);
/* Deadlines (CM thread): re-checks windows whose lease may have run out;
 * returns how long the thread may sleep (at most max_ms). */
int xrdma_lease_expire(struct rdma_transport *t, int max_ms);

/* rdma_win.c (initiator) */
/* Window request payload: remote region id, gen, off, len, op. */
#define RDMA_WIN_REQ_LEN  25
#define RDMA_WIN_RESP_LEN 20 /* key, window off, len */
/* Chunk ch (windowed) was assigned the QP at slots[pos] of incarnation
 * uid: true with ch->wkey set when a window covers it, else false. */
bool xrdma_win_lookup_locked(struct rdma_conn *c, int pos, uint16_t uid,
                             struct xfer_rdma_chunk *ch);
/* Parks p until a window for it arrives on that QP, asking for one. */
void xrdma_win_park_locked(struct rdma_conn *c, int pos, uint16_t uid, struct rdma_pending *p);
/* Sends the window requests that can go now (conn->lock held). */
void xrdma_win_pump_locked(struct rdma_conn *c);
/* The answer to want w (conn->lock held): its parked chunks go back to the
 * queue, or are returned (refused: the caller fails them, unlocked). */
struct rdma_pending *xrdma_win_answer_locked(struct rdma_conn *c, struct rdma_want *w, int status,
                                             const uint8_t *p, size_t n);
/* The QP at slots[pos] of incarnation uid is gone: its windows and
 * requests are forgotten, the parked chunks go back to the queue. */
void xrdma_win_slot_down_locked(struct rdma_conn *c, int pos, uint16_t uid);
/* The owner's NIC refused ch's window: windows cached for its range (on
 * every QP) are forgotten, so that it asks the owner again. */
void xrdma_win_forget_locked(struct rdma_conn *c, const struct xfer_rdma_chunk *ch);
/* Connection teardown: the parked chunks (to fail) and no more requests. */
struct rdma_pending *xrdma_win_take_locked(struct rdma_conn *c);
void xrdma_win_conn_free(struct rdma_conn *c);

#endif
