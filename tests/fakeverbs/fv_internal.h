/*
 * fakeverbs — a software stand-in for the subset of libibverbs and librdmacm
 * that engine/rdma uses. Test builds only (never in libxfer.a).
 *
 * Every verbs object is the real rdma-core struct embedded in a private one.
 * A connected RC QP is a TCP socket to its peer QP plus two threads: a sender
 * (the only writer: requests of the send queue and responses) and a receiver
 * (the only reader: it serves the peer's WRITE/READ requests against the
 * local MR table, enforcing rkey, access and bounds, and completes our own
 * requests when their responses arrive). Because the reader never writes, the
 * socket always drains and two QPs cannot deadlock each other.
 *
 * Environment (read once):
 *   XFER_FAKEVERBS_DEVICES  number of fake devices (default 1, 0 = none)
 *   XFER_FAKEVERBS_ADDR     IPv4 address of every device (default 127.0.0.<1+i>)
 */
#ifndef FV_INTERNAL_H
#define FV_INTERNAL_H

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#define FV_MAX_DEVICES   8
#define FV_MAX_PDATA     56 /* REQ private data, as for RDMA_PS_TCP */
#define FV_MAX_REP_PDATA 196
#define FV_MAX_MSG       (1u << 31) /* port max_msg_sz */
#define FV_MAX_RECV_SGE  16

#ifndef container_of
#define container_of(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))
#endif

struct fv_device {
    struct ibv_device dev;
    int index;
    struct in_addr addr;
};

struct fv_mr {
    struct ibv_mr mr;
    int access;
    int windows; /* memory windows bound to it: deregistration fails (EBUSY) */
};

/* A type-2 memory window (fv_mw.c). Its key is FV_MW_KEY_BIT | index << 8 |
 * tag; a bind changes the tag (the application picks it, ibv_inc_rkey). */
#define FV_MW_KEY_BIT (1u << 31)
struct fv_mw {
    struct ibv_mw mw;
    bool bound;
    uint32_t key;     /* valid while bound */
    struct fv_qp *qp; /* the QP it is bound to: only that QP may use it */
    struct fv_mr *mr; /* the MR it lies in */
    uint64_t addr, len;
    int access; /* IBV_ACCESS_REMOTE_* of the bind */
};

struct fv_context {
    struct ibv_context ctx;
    struct fv_device *dev;
    pthread_rwlock_t mr_lock; /* readers: remote access; writer: reg/dereg */
    struct fv_mr **mrs;       /* index = key >> 8 */
    uint32_t n_mrs;
    uint8_t key_variant;
    struct fv_mw **mws; /* index = (key & ~FV_MW_KEY_BIT) >> 8; under mr_lock */
    uint32_t n_mws;
};

struct fv_comp_channel {
    struct ibv_comp_channel ch;
    int wfd;
};

struct fv_cqe {
    struct ibv_wc wc;
    struct fv_qp *qp; /* send CQEs: reclaim SQ slots when polled */
    uint64_t seq;
};

struct fv_cq {
    struct ibv_cq cq;
    pthread_mutex_t lock;
    struct fv_cqe *ring;
    int cap, head, count;
    bool overflow;
    bool armed;
};

/* One send WR as copied at post time. */
struct fv_wr {
    struct fv_wr *next;
    uint64_t wr_id;
    uint64_t seq;
    enum ibv_wr_opcode opcode;
    bool signaled;
    uint64_t remote_addr;
    uint32_t rkey;
    uint32_t len;
    uint32_t imm;      /* SEND_WITH_IMM, network order as posted */
    uint8_t rnr_tries; /* RNR NAKs this SEND got so far */
    /* BIND_MW / LOCAL_INV: run by the sender in send-queue order, no
     * network; their CQE waits behind older requests (local, local_st). */
    struct ibv_mw *mw;
    struct ibv_mw_bind_info bind;
    bool local;
    enum ibv_wc_status local_st;
    int num_sge;
    struct ibv_sge sge[];
};

/* One posted receive: consumed, head first, by the peer's SEND. */
struct fv_recv {
    uint64_t wr_id;
    int num_sge;
    struct ibv_sge sge[FV_MAX_RECV_SGE];
};

enum fv_msg_type { M_WRITE = 1, M_READ, M_ECHO, M_ACK, M_READ_RESP, M_SEND };
/* NAK_RNR: no receive posted (flags = the responder's min_rnr_timer);
 * NAK_REMOP: the responder's receive WQE was bad (remote operation error). */
enum fv_nak { NAK_OK = 0, NAK_ACCESS, NAK_INVALID, NAK_LOCAL, NAK_RNR, NAK_REMOP };
#define FV_F_REWIND 1u /* first request resent after an RNR NAK */
#define FV_F_IMM    2u /* SEND carries immediate data */

struct fv_msg {
    uint8_t type, status;
    uint16_t flags; /* requests: FV_F_*; an RNR NAK: the min_rnr_timer code */
    uint32_t rkey;
    uint64_t addr;
    uint32_t len;
    uint32_t imm;
};

/* Queued for the sender thread: a request (wr) or a response (payload). */
struct fv_out {
    struct fv_out *next;
    struct fv_msg hdr;
    void *payload; /* owned (responses) */
    struct fv_wr *wr;
    bool then_error; /* a NAK after which this (responder) QP goes to ERR */
};

struct fv_qp {
    struct ibv_qp qp;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    enum ibv_qp_state st;
    int qp_access;              /* from INIT/RTR attributes */
    uint8_t max_dest_rd_atomic; /* 0: this QP serves no RDMA READ */
    struct fv_recv *rq;         /* posted receives, a ring (flushed on error) */
    uint32_t rq_head, rq_count;
    uint32_t max_send_wr, max_recv_wr, max_sge, max_recv_sge;
    uint8_t rnr_retry;     /* requester: RNR NAKs a SEND survives (7 = forever) */
    uint8_t min_rnr_timer; /* responder: the wait it asks for in an RNR NAK */
    bool rnr_dropping;     /* responder: NAKed RNR, drops requests until a rewind */
    bool rewind;           /* requester: the next request is the resent one */
    int64_t rnr_until_ns;  /* requester: no request leaves before (monotonic) */
    bool sq_sig_all;
    uint64_t sq_posted, sq_reclaimed;    /* seq numbers; depth = posted - reclaimed */
    struct fv_out *out_head, *out_tail;  /* to send */
    struct fv_wr *wait_head, *wait_tail; /* sent, awaiting response */
    int busy;                            /* threads touching user memory right now */
    int sock;                            /* -1 until connected */
    bool threads_running, stopping, peer_closed_cleanly;
    int flushing; /* fv_qp_to_error under way: a post joins the WRs it flushes */
    pthread_t sender, receiver;
    struct fv_id *cm_id; /* for DISCONNECTED events */
};

struct fv_event {
    struct rdma_cm_event ev;
    struct fv_event *next;
    uint8_t pdata[FV_MAX_REP_PDATA];
};

struct fv_channel {
    struct rdma_event_channel ch;
    int wfd;
    pthread_mutex_t lock;
    struct fv_event *head, *tail;
};

struct fv_id {
    struct rdma_cm_id id;
    int listen_sock;  /* listening ids, else -1 */
    int conn_sock;    /* child ids before accept, active ids before REP */
    pthread_t thread; /* acceptor (listening) or connector (active) */
    bool thread_running;
    struct sockaddr_storage dst;
    uint8_t req_pdata[FV_MAX_PDATA];
    uint8_t req_len;
    uint8_t initiator_depth, responder_resources;
    uint8_t rnr_for_peer; /* rnr_retry_count of our connect/accept: the peer QP's rnr_retry */
    uint8_t rnr_mine;     /* the peer's wish: our QP's rnr_retry */
    bool disconnected;    /* DISCONNECTED already reported */
};

/* CM messages on the connection socket before it becomes the QP link. */
enum fv_cm_type { CM_REQ = 1, CM_REP, CM_REJ };
struct fv_cm_msg {
    uint32_t magic;
    uint8_t type, pdata_len, initiator_depth, responder_resources;
    uint8_t rnr_retry_count; /* for the receiver's QP (IBTA CM REQ/REP field) */
    uint8_t pdata[FV_MAX_REP_PDATA];
};
#define FV_CM_MAGIC 0x46564d43u

/* ---- internal API between the files ---- */
struct fv_context *fv_context_of(struct ibv_context *c);
struct fv_device *fv_device_for_addr(const struct sockaddr *sa);
struct ibv_context *fv_shared_context(int index);
int fv_device_count(void);
/* Under mr_lock (read) — the caller holds it while touching memory. */
struct fv_mr *fv_mr_lookup(struct fv_context *c, uint32_t key);

void fv_cq_push(struct ibv_cq *cq, const struct ibv_wc *wc, struct fv_qp *qp, uint64_t seq);
void fv_cq_forget_qp(struct ibv_cq *cq, struct fv_qp *qp);

/* QP link: starts threads on a connected socket (state must be RTS/RTR). */
int fv_qp_start_link(struct fv_qp *qp, int sock);
int fv_qp_set_state(struct fv_qp *qp, enum ibv_qp_state st, int access, bool responder_read,
                    uint8_t rnr_retry);
/* The IBTA RNR timer code (0..31) in nanoseconds (0 = 655.36 ms). */
int64_t fv_rnr_timer_ns(unsigned code);
int64_t fv_now_ns(void);
void fv_qp_to_error(struct fv_qp *qp, enum ibv_wc_status first);
void fv_cm_post_disconnected(struct fv_id *id);

/* Memory windows (fv_mw.c). Remote check of a window key: NAK_* (mr_lock
 * held for reading). Bind / local invalidate: the WC status (no lock held). */
bool fv_is_mw_key(uint32_t key);
int fv_mw_check(struct fv_qp *qp, uint32_t key, uint64_t addr, uint64_t len, int need);
enum ibv_wc_status fv_mw_bind(struct fv_qp *qp, const struct fv_wr *w);
enum ibv_wc_status fv_mw_invalidate(struct fv_qp *qp, uint32_t key);
/* Test faults (fv_mw.c, XFER_FAKEVERBS_MW_FAULT): around binds, and a full
 * send queue for RDMA READ/WRITE posts. */
enum fv_mw_fault { FV_FAULT_NONE, FV_FAULT_POST, FV_FAULT_BIND, FV_FAULT_KILL, FV_FAULT_FULL };
enum fv_mw_fault fv_mw_fault_next(bool post);
bool fv_fault_sq_full(void);            /* the next READ/WRITE post: refuse it (ENOMEM) */
unsigned fv_fault_fired(void);          /* faults fired since the list was set */
void fv_mw_fault_set(const char *spec); /* replaces the list, counts from 0 */
/* A destroyed QP's type-2 windows are no longer bound. */
void fv_mw_forget_qp(struct fv_qp *qp);
struct ibv_mw *fv_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type);
int fv_dealloc_mw(struct ibv_mw *mw);
int fv_bind_mw(struct ibv_qp *qp, struct ibv_mw *mw, struct ibv_mw_bind *b);

void fv_push_send_cqe(struct fv_qp *qp, const struct fv_wr *wr, enum ibv_wc_status st);
enum ibv_wc_status fv_nak_status(int nak);
void fv_free_out(struct fv_out *o);
/* Completes, in order, the local operations at the head of the wait list. */
void fv_complete_locals_locked(struct fv_qp *qp);
void fv_qp_stop_link(struct fv_qp *qp);

/* Blocking full I/O on sockets (MSG_NOSIGNAL); 0 or -1. */
int fv_send_all(int fd, const void *buf, size_t len);
int fv_recv_all(int fd, void *buf, size_t len);

#endif
