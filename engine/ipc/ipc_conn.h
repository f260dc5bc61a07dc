/*
 * The initiator's connection to one owner (ipc_conn.c: the worker, connect
 * and close; ipc_post.c: posting items, direct copies, engine messages).
 */
#ifndef XFER_IPC_CONN_H
#define XFER_IPC_CONN_H

#include "ipc.h"
#include "ipc_map.h"
#include "ipc_ring.h"

struct ipc_work {
    xfer_batch *b;
    size_t i;
};

/* One item (or a run of a vectored item's segments) in the worker. */
struct ipc_job {
    xfer_batch *b;
    size_t i;
    struct xfer_item it; /* vectored: remote_off/len span its segments */
    /* vectored items: the item's segments, this job's are [s0, s1) */
    const struct xfer_seg *segs;
    uint32_t s0, s1;
    bool blocks;                /* a block item: its segments are computed from blk */
    struct xfer_block_list blk; /* (xfer_batch_item_blocks), segs is NULL */
    uint64_t bytes;             /* what this job moves */
    uint64_t maxseg;            /* vectored: its longest segment */
    uint64_t lo, hi;            /* vectored: the hull of its segments' remote ranges */
    int64_t bad;                /* the item's segment that failed it, -1 = none */
    int *tickets;               /* vectored: CUDA copies outside batched launches */
    size_t ntickets;
    const struct ipc_map *map;
    uint32_t slot;
    int status;
    bool pinned, begun, skip;
    bool need_list; /* the owner asked for the ranges (lease rules on the hull) */
    bool host;      /* host memory on both sides: ipc_jobs_copy_host */
    int ticket;     /* CUDA copy in flight, else -1 */
    char why[200];
};

/* A job over a segment list (vectored or block item), not a plain range. */
static inline bool ipc_job_vec(const struct ipc_job *j)
{
    return j->segs || j->blocks;
}

/* Segment k of a vectored or block job. */
static inline struct xfer_seg ipc_job_seg(const struct ipc_job *j, uint32_t k)
{
    return j->blocks ? xfer_block_list_seg(&j->blk, k) : j->segs[k];
}

void ipc_job_fail(struct ipc_job *j, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* An engine message queued, or sent and owed its answer: kept in the
 * message's own m->tp (no allocation). */
struct ipc_msgq {
    struct xfer_msg *m;
    struct ipc_msgq *next;
    int32_t status; /* the answer, once read */
    int64_t sent_ms;
};
_Static_assert(sizeof(struct ipc_msgq) <= sizeof(((struct xfer_msg *)0)->tp), "ipc_msgq in m->tp");

struct ipc_conn {
    struct xfer_conn base;
    struct ipc_transport *t;
    int fd;
    pid_t pid;
    int io_timeout_ms;
    pthread_t worker;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct ipc_work *q; /* ring of queued items */
    size_t qhead, qlen, qcap;
    size_t qseg; /* segments of the head entry's vectored item already taken */
    void *acqv;  /* the worker's IPC_ACQV_REQ buffer (ipc_pin.c) */
    size_t acqv_cap;
    void *hparts; /* the worker's host copy parts (ipc_hcopy.c) */
    size_t hparts_cap;
    bool stop, broken;
    bool peer_left; /* broken by the peer's IPC_BYE (ipc_conn_state) */
    struct ipc_map_cache maps;
    struct ipc_cuda_copier *copier; /* created on the first CUDA item */
    struct xfer_kbatch *kb;         /* batched GPU<->GPU copies, ipc_kbatch.c */
    uint64_t group_bytes;           /* see take_work */
    struct ipc_msgq *mhead, *mtail; /* mu: messages for the worker to send */
    bool owed_wake;                 /* mu: the worker reads owed answers */
    int64_t owed_lazy_ms; /* mu: since then answers nobody waits for are owed (0 = none) */
    /* the socket (ipc_link.c); lock order link_mu, then mu */
    pthread_mutex_t link_mu;
    struct ipc_msgq *owed, *owed_tail; /* link_mu: sent, answer not read yet */
    struct ipc_msgq *answered;         /* link_mu: to complete once it is let go */
    bool link_broken;                  /* link_mu */
    /* Messages and their answers through shared memory (ipc_ring.h) when
     * both sides agreed at connect; written and read under link_mu. */
    struct ipc_ring ring;
    bool ring_up;
    int ring_spin_us;               /* an answer is spun for this long before sleeping */
    struct ipc_direct_table direct; /* entries: mu */
    int64_t direct_check_ms;        /* last direct_check */
    pthread_mutex_t dkb_mu;         /* GPU loan launches and their poller (ipc_dgpu.c) */
    struct ipc_dgpu *dgpu;          /* dkb_mu; made on the first launch */
};

/* ipc_pin.c: pins every checked job at the owner (IPC_ACQ_REQ for plain
 * jobs, IPC_ACQV_REQ for vectored ones: one round trip each kind) and
 * unpins them (IPC_REL); < 0 when the connection broke. */
int ipc_jobs_acquire(struct ipc_conn *c, struct ipc_job *jobs, size_t n);
int ipc_jobs_release(struct ipc_conn *c, struct ipc_job *jobs, size_t n);

/* ipc_link.c. Takes the socket for a request and its answer; with drain,
 * answers still owed to sent messages are read first (a request's answer
 * comes after them). < 0: the connection broke. */
int ipc_link_lock(struct ipc_conn *c, bool drain);
/* Lets the socket go (rc < 0: the exchange failed, the connection is
 * broken) and completes the messages answered meanwhile. */
void ipc_link_unlock(struct ipc_conn *c, int rc);
/* Answers nobody waits for (struct xfer_msg.lazy) that the next user of the
 * socket did not read: the idle worker reads them this long after. */
#define IPC_OWED_LAZY_MS 2
/* Worker, no lock held: reads the owed answers that arrived (a link in use
 * or answers still missing: again IPC_OWED_LAZY_MS later; missing for
 * io_timeout_ms: the connection breaks). */
void ipc_link_lazy(struct ipc_conn *c);
/* Worker: sends the messages queued for it and reads owed answers. */
void ipc_link_worker_msgs(struct ipc_conn *c);
/* The connection is going: whatever is owed fails (-XFER_ECONN). */
void ipc_link_fini(struct ipc_conn *c);
/* At connect, after HELLO (flags: its IPC_HELLO_RING): sets up the message
 * ring when both sides take one; < 0 only when the socket failed. */
int ipc_link_ring_setup(struct ipc_conn *c, uint32_t flags, int timeout_ms);

/* ipc_dgpu.c, the posting thread: launches the GPU items idx[0..n) of
 * GPU loans (entries d[k], one user each, dropped here or by the
 * completion) and reports them when their kernel is done. Returns how many
 * it left for the worker, their indices in back (room for n): withdrawn
 * loans, items outside the loan or of another GPU pair, a failed launch.
 * The connection's loan poller (a thread started with the first launch)
 * reports them. */
size_t ipc_dgpu_post(struct ipc_conn *c, xfer_batch *b, const size_t *idx, struct ipc_direct **d,
                     size_t n, size_t *back);
/* The connection is closing (nothing posts any more): reports what is in
 * flight once its kernels are done, ends the poller. */
void ipc_dgpu_fini(struct ipc_conn *c);

/* Queues items for the worker (which asks the owner); on failure reports
 * them failed and returns < 0. */
int ipc_conn_queue(struct ipc_conn *c, xfer_batch *b, const size_t *idx, size_t n);

#endif
