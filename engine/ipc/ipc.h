/*
 * Same-host IPC transport: private declarations shared by the engine/ipc files.
 *
 * Shape. Each node listens on an abstract unix socket named after its node id
 * and incarnation. An initiator connects, runs the engine handshake, then
 * speaks the small binary protocol below. The owner of a region never copies
 * bytes: it validates and pins. The initiator copies directly between its own
 * memory and the owner's memory, reached through
 *   memfd   the owner's memfd, passed once with SCM_RIGHTS and mmapped
 *           (cached per region id + generation);
 *   cma     process_vm_readv/writev into the owner's address space, for
 *           regions registered from a plain user pointer;
 *   cuda    a CUDA IPC handle (cudaIpcGetMemHandle) or a cuMem POSIX fd,
 *           opened once per region id + generation.
 * Every copy is bracketed by ACQ (owner checks id, generation, access and
 * bounds with xfer_region_acquire and keeps the region pinned) and REL, so a
 * region is never deregistered under a copy and stale ids fail cleanly.
 */
#ifndef XFER_IPC_H
#define XFER_IPC_H

#include "transport.h"
#include "xfer_kernels.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/* ---- wire (same host, host byte order, fixed-size records) -------------- */

#define IPC_MAGIC      0x43504958u /* "XIPC" */
#define IPC_VERSION    3u          /* 3: ACQV hull records */
#define IPC_BATCH_MAX  512u        /* records per ACQ/REL message */
#define IPC_HANDLE_LEN 64u         /* cudaIpcMemHandle_t */
#define IPC_UUID_LEN   16u

enum ipc_msg_type {
    IPC_HELLO = 1,    /* owner -> initiator after the handshake */
    IPC_MAP_REQ = 2,  /* how do I reach region (id, gen)? */
    IPC_MAP_RESP = 3, /* + one fd (memfd / cuMem) when the mechanism has one */
    IPC_ACQ_REQ = 4,  /* validate + pin count regions ranges */
    IPC_ACQ_RESP = 5,
    IPC_REL = 6,      /* unpin slots, no answer */
    IPC_MSG_REQ = 7,  /* an engine message frame (docs/notify.md) */
    IPC_MSG_RESP = 8, /* int32 status: the owner engine's answer */
    IPC_ACQV_REQ = 9, /* validate + pin count segment lists (vectored items) */
    IPC_ACQV_RESP = 10,
    IPC_BYE = 11, /* owner -> initiator, no payload: its engine stops, the socket closes next */
    IPC_RING_REQ = 12,  /* + the message ring's memfd (ipc_ring.h), no payload */
    IPC_RING_RESP = 13, /* int32 status: 0 = messages go through the ring from now on */
    IPC_RING_BELL = 14, /* no payload: frames wait in the ring and its reader may sleep */
};

enum ipc_mech { IPC_MECH_NONE = 0, IPC_MECH_MEMFD, IPC_MECH_CMA, IPC_MECH_CUDA, IPC_MECH_CUMEM };

struct ipc_hdr {
    uint32_t magic;
    uint16_t type;
    uint16_t version;
    uint32_t count; /* records following */
    uint32_t bytes; /* payload bytes following this header */
};

struct ipc_hello {
    int32_t pid;
    uint32_t probe_len;
    uint64_t probe_addr; /* owner memory holding probe_cookie, for a CMA probe */
    uint8_t probe_cookie[16];
    uint32_t ctl_slots; /* slots of the control page passed with HELLO, 0 = none */
    uint32_t flags;     /* IPC_HELLO_RING; 0 from an owner built before it */
};
#define IPC_HELLO_RING 1u /* the owner takes a message ring (IPC_RING_REQ) */

struct ipc_map_req {
    uint32_t id, gen;
    uint32_t op; /* enum xfer_op the initiator needs */
    uint32_t pad;
};

struct ipc_map_resp {
    int32_t status; /* 0 or -XFER_E* */
    uint32_t mech;  /* enum ipc_mech */
    uint32_t access;
    int32_t has_fd;
    uint64_t len;                   /* region length */
    uint64_t addr;                  /* region address in the owner (CMA) */
    uint64_t alloc_off;             /* CUDA: region start minus allocation start */
    uint64_t alloc_len;             /* CUDA: allocation length (cuMem mapping) */
    uint8_t uuid[IPC_UUID_LEN];     /* CUDA: owner GPU */
    uint8_t handle[IPC_HANDLE_LEN]; /* CUDA IPC handle */
    uint32_t ctl_slot;              /* direct copies allowed: control slot, else IPC_SLOT_NONE */
    uint32_t pad;
    char why[96]; /* reason when status != 0 */
};

struct ipc_acq_req {
    uint32_t id, gen;
    uint32_t op;
    uint32_t pad;
    uint64_t off, len;
};

struct ipc_acq_resp {
    int32_t status;
    uint32_t slot; /* pin to hand back in IPC_REL */
};

/* A vectored item's segments on the owner's side: count records, each an
 * ipc_acqv_req followed by its nseg ranges (struct xfer_range: off, len in
 * the region); the owner checks them all under one lock (bounds and lease
 * rules per segment) and pins the region once per record. */
#define IPC_VEC_SEGS_MAX  8192u  /* segments of one record */
#define IPC_ACQV_SEGS_MAX 32768u /* segments of one IPC_ACQV_REQ */
#define IPC_ACQV_BYTES_MAX                                                                         \
    (IPC_BATCH_MAX * sizeof(struct ipc_acqv_req) + IPC_ACQV_SEGS_MAX * sizeof(struct xfer_range))
struct ipc_acqv_req {
    uint32_t id, gen;
    uint32_t op;
    uint32_t nseg; /* 1..IPC_VEC_SEGS_MAX ranges follow, or IPC_ACQV_HULL */
};

/* A record of nseg IPC_ACQV_HULL is followed by one ipc_acqv_hull instead
 * of the ranges: the hull of the job's segments (every segment lies in
 * [off, off+len)). The owner checks bounds and lease rules once, on the
 * hull, so nothing per segment crosses the socket or is looked at by the
 * owner; where lease rules refuse the hull (a guarded gap the segments may
 * skip) it answers IPC_ACQV_NEED_LIST and the initiator sends the ranges. */
#define IPC_ACQV_HULL 0u
struct ipc_acqv_hull {
    uint64_t off, len;
    uint64_t bytes; /* the segments' total, for the owner's counters */
    uint64_t nseg;  /* 1..IPC_VEC_SEGS_MAX */
};

struct ipc_acqv_resp {
    int32_t status;
    uint32_t slot;  /* pin to hand back in IPC_REL */
    uint32_t bad;   /* refused segment (index in its record), UINT32_MAX = none */
    uint32_t flags; /* IPC_ACQV_NEED_LIST: not pinned, send the ranges */
};
#define IPC_ACQV_NEED_LIST 1u

/* Appended to an IPC_ACQ_RESP or IPC_ACQV_RESP after its count records: regions this peer
 * mapped that are no longer registered, so it can drop the mappings (and the
 * owner's memory can really go). */
struct ipc_revoked {
    uint32_t id, gen;
};
#define IPC_REVOKED_MAX 64

/* Checks a received message against the size rules of its type (and the
 * type and record count expected; want_count 0 = any) and the fields the
 * receiver trusts (statuses, mech, probe length): 0 or -XFER_EPROTO.
 * payload holds h->bytes bytes (ipc_msg.c). */
int ipc_msg_check(const struct ipc_hdr *h, const void *payload, uint32_t want_type,
                  uint32_t want_count);

/* ---- sockets (ipc_sock.c) ---------------------------------------------- */

/* Abstract socket address for a node incarnation; returns the address length. */
int ipc_sock_addr(const char *node_id, uint64_t incarnation, void *sun, size_t sun_size);
int ipc_sock_listen(const char *node_id, uint64_t incarnation, char *why, size_t why_len);
int ipc_sock_connect(const char *node_id, uint64_t incarnation, int timeout_ms, char *why,
                     size_t why_len);
/* Sends header + payload (+ fd when fd >= 0) within timeout_ms. */
int ipc_send(int fd, uint16_t type, uint32_t count, const void *payload, uint32_t bytes,
             int pass_fd, int timeout_ms);
/* Receives one message; payload (<= max bytes) into buf. *got_fd = received fd or
 * -1 (when got_fd is NULL, a received fd is closed). */
int ipc_recv(int fd, struct ipc_hdr *h, void *buf, uint32_t max, int *got_fd, int timeout_ms);
/* Receives one message that must carry exactly bytes (<= 64) of payload, in
 * one read when it has arrived whole (answers of a fixed size). */
int ipc_recv_fixed(int fd, struct ipc_hdr *h, void *buf, uint32_t bytes, int timeout_ms);
/* Waits until fd is readable (POLLIN) within timeout_ms: 0, -XFER_ETIMEDOUT, -XFER_ECONN. */
int ipc_wait_readable(int fd, int timeout_ms);
/* True once the other end closed (or the socket failed): one poll, no wait. */
bool ipc_sock_hung_up(int fd);
/* True when the unread input of fd (peeked, not consumed; the first 4 KiB)
 * holds the owner's IPC_BYE: it closed in order (its engine stopped), it
 * did not die. */
bool ipc_sock_said_bye(int fd);
pid_t ipc_sock_peer_pid(int fd);

/* ---- host memory (ipc_host.c) ------------------------------------------- */

/* Maps len bytes of memfd (rw when writable). NULL + *err on failure. */
void *ipc_host_map(int fd, size_t len, bool writable, int *err);
void ipc_host_unmap(void *p, size_t len);
/* Copies between local memory and [raddr, raddr+len) of process pid.
 * -XFER_EACCES with a reason when the kernel refuses (ptrace policy). */
int ipc_cma_read(pid_t pid, uint64_t raddr, void *local, size_t len, char *why, size_t why_len);
int ipc_cma_write(pid_t pid, uint64_t raddr, const void *local, size_t len, char *why,
                  size_t why_len);
/* Lets same-uid peers attach with process_vm_* despite Yama ptrace_scope=1. */
/* Cross-memory attach into this process is allowed to the tracer Yama
 * (ptrace_scope 1) lets it declare, one process at most. The owner declares
 * its one connected ipc peer, "any" while several (or one it cannot name:
 * another pid namespace) are connected, nobody once none is (issue 18 item
 * 6). ipc_ptracer_choice: 0 none, -1 any, else the pid. */
pid_t ipc_ptracer_choice(const pid_t *pids, size_t n);
/* Every ipc server of the process shares the one declaration: peers are
 * added when they pass the handshake and removed when they go (pid -1: a
 * peer we cannot name). */
void ipc_tracer_add(pid_t pid);
void ipc_tracer_remove(pid_t pid);
/* Kernel's view, for error messages: "ptrace_scope=N" or "no Yama". */
void ipc_cma_policy(char *buf, size_t len);
/* Reopens a memfd read-only, so a peer that may only READ cannot map it rw. */
int ipc_memfd_reopen_ro(int fd);

/* ---- CUDA (ipc_cuda.c; stubs return -XFER_ENODEV without XFER_WITH_CUDA) - */

struct ipc_cuda_export {
    uint32_t mech; /* IPC_MECH_CUDA or IPC_MECH_CUMEM */
    uint8_t handle[IPC_HANDLE_LEN];
    uint8_t uuid[IPC_UUID_LEN];
    uint64_t alloc_off, alloc_len;
    int fd; /* cuMem POSIX fd (caller closes), else -1 */
};
struct ipc_cuda_import; /* opened remote GPU memory */
struct ipc_cuda_copier; /* streams + events of one connection */

/* Number of usable CUDA devices, or -XFER_ENODEV with a reason. */
int ipc_cuda_probe(char *why, size_t why_len);
/* Owner: how a peer may open the device memory at ptr (device ordinal dev).
 * known: the handle the memory was adopted from (xfer_region_adopt_cuda), or
 * NULL; an imported allocation cannot be exported again, so it is reused. */
int ipc_cuda_export(void *ptr, int dev, const uint8_t *known, struct ipc_cuda_export *out,
                    char *why, size_t why_len);
/* Initiator: opens what the owner exported (takes ownership of ex->fd). */
int ipc_cuda_import(const struct ipc_map_resp *m, int fd, struct ipc_cuda_import **out, char *why,
                    size_t why_len);
void ipc_cuda_import_close(struct ipc_cuda_import *imp);
/* Device pointer of the region start within an import. */
void *ipc_cuda_import_ptr(const struct ipc_cuda_import *imp);
int ipc_cuda_import_device(const struct ipc_cuda_import *imp);

/* Completion wake-ups broadcast cv under mu (both owned by the caller). */
struct ipc_cuda_copier *ipc_cuda_copier_new(int *err, pthread_mutex_t *mu, pthread_cond_t *cv);
void ipc_cuda_copier_free(struct ipc_cuda_copier *c);
/* Starts an async copy of len bytes; dst_dev/src_dev are local ordinals, -1 for
 * host memory; remote_dev is the GPU holding the peer's side (or -1). Returns a
 * ticket (>= 0) or a negative code. */
int ipc_cuda_copy_start(struct ipc_cuda_copier *c, void *dst, int dst_dev, const void *src,
                        int src_dev, int remote_dev, size_t len, char *why, size_t why_len);
/* A mark after the copies started so far; waiting on it sleeps (no polling)
 * until they have finished. mark_wait frees the mark in every case. */
struct ipc_cuda_mark;
struct ipc_cuda_mark *ipc_cuda_mark_new(struct ipc_cuda_copier *c, int *err);
int ipc_cuda_mark_wait(struct ipc_cuda_mark *m, int timeout_ms, char *why, size_t why_len);
/* With mu held: have all copies before m finished? (cv is broadcast when so) */
bool ipc_cuda_mark_done_locked(const struct ipc_cuda_mark *m);
/* Waits for ticket within timeout_ms, then frees it: 0 or -XFER_E*. */
int ipc_cuda_copy_wait(struct ipc_cuda_copier *c, int ticket, int timeout_ms, char *why,
                       size_t why_len);

/* ---- batched GPU<->GPU copies (ipc_kbatch.c) ------------------------------ */

struct xfer_kbatch;
/* A copy's place in a batched launch, shared by ipc_kcopy and ipc_krun. */
struct ipc_kwait {
    int ticket; /* launch that took it, -1 = copy it otherwise */
    int status; /* after ipc_kbatch_finish */
    bool ran;
};
struct ipc_kcopy {
    void *dst;
    const void *src;
    uint64_t len;
    int exec, other; /* GPU running the copy (the peer memory's), the local GPU */
    struct ipc_kwait w;
    size_t job;   /* caller's index */
    uint32_t seg; /* the job's segment (vectored items), UINT32_MAX = the whole job */
};
/* Groups of >= XFER_KBATCH_MIN_ITEMS copies with the same GPU pair go into
 * one kernel launch each (*kb created on first use; XFER_IPC_NO_KBATCH=1
 * turns it off). */
void ipc_kbatch_start(struct xfer_kbatch **kb, struct ipc_kcopy *v, size_t n);
/* Waits for every launch of n copies whose ipc_kwait is at w, each stride
 * bytes after the last (an ipc_kcopy or ipc_krun array): status = its
 * launch's result. */
void ipc_kbatch_finish(struct xfer_kbatch *kb, struct ipc_kwait *w, size_t stride, size_t n,
                       int timeout_ms);
/* A vectored job's GPU<->GPU segments as one run of a batched launch: the
 * descriptors are written once, straight into the launch's staging
 * (xfer_kbatch_start_runs), nothing per segment here. */
struct ipc_krun {
    struct xfer_copy_run run;
    struct xfer_block_run blk; /* a block job's run instead (is_blk): the GPU expands it */
    bool is_blk;
    uint64_t bytes;
    int exec, other; /* as in ipc_kcopy */
    struct ipc_kwait w;
    size_t job; /* caller's index */
};
/* One launch per GPU pair of runs v[0..n) with >= XFER_KBATCH_MIN_ITEMS
 * segments, and one per GPU pair of block runs (any number of segments:
 * nothing per segment is staged); v[i].w.ticket as in ipc_kbatch_start. */
void ipc_kbatch_start_runs(struct xfer_kbatch **kb, struct ipc_krun *v, size_t n);
/* Segments [s0, s1) of block list bl between local (our region's start)
 * and remote (the owner's region as mapped here) as a run for the kernel:
 * into local for a READ (rd), else into remote. */
static inline struct xfer_block_run ipc_block_run(char *local, char *remote,
                                                  const struct xfer_block_list *bl, uint32_t s0,
                                                  uint32_t s1, bool rd)
{
    return (struct xfer_block_run){.a = local,
                                   .b = remote,
                                   .a_base = bl->local_base,
                                   .b_base = bl->remote_base,
                                   .a_ids = bl->local_ids,
                                   .b_ids = bl->remote_ids,
                                   .a_stride = bl->local_stride,
                                   .b_stride = bl->remote_stride,
                                   .len = bl->len,
                                   .nstreams = bl->nstreams,
                                   .nids = bl->nids,
                                   .s0 = s0,
                                   .s1 = s1,
                                   .a_is_dst = rd};
}

/* ---- direct copies without the owner (ipc_direct.c, docs/ipc.md) ------- */

/* Each connection has a control page: a memfd the owner creates and passes
 * with HELLO, mapped by both. Slot s describes one region the owner lent
 * the peer for direct copies: key = id << 32 | gen while the loan stands, 0
 * once withdrawn; pins = the peer's copies in progress (Dekker handshake:
 * the peer adds a pin, then reads key; the owner clears key, then waits for
 * pins to reach 0). */
#define IPC_CTL_SLOTS 256u
#define IPC_SLOT_NONE UINT32_MAX
struct ipc_ctl_slot {
    uint64_t key;
    uint64_t pins;
    uint64_t pad[6]; /* one cache line per slot */
};
static inline uint64_t ipc_ctl_key(uint32_t id, uint32_t gen)
{
    return (uint64_t)id << 32 | gen; /* generations start at 1: never 0 */
}

/* Owner: the loans of one connection. */
struct ipc_loans {
    pthread_mutex_t mu;
    struct ipc_ctl_slot *ctl;      /* shared with the peer */
    int ctl_fd;                    /* passed with HELLO, then closed */
    int sock;                      /* the connection, shut down to revoke a stuck peer */
    int timeout_ms;                /* how long a peer's pin may delay a withdrawal */
    xfer_region *r[IPC_CTL_SLOTS]; /* each lent region holds one pin */
};
int ipc_loans_init(struct ipc_loans *l, int sock, int timeout_ms);
/* Withdraws every loan (waiting for copies in progress unless the peer hung
 * up); _fini also frees the page. */
void ipc_loans_withdraw_all(struct ipc_loans *l);
void ipc_loans_fini(struct ipc_loans *l);
/* Lends (id, gen) = r for direct copies: a slot, or IPC_SLOT_NONE when the
 * region may not be lent (ipc_direct_allowed) or no slot is free. */
uint32_t ipc_loan_add(struct ipc_loans *l, xfer_engine *e, xfer_region *r, uint32_t id,
                      uint32_t gen);
/* r is going or guarded: withdraws its loan, waits for the peer's
 * copies in progress (at most timeout_ms, then revokes the peer). */
void ipc_loans_withdraw(struct ipc_loans *l, xfer_region *r);
/* The one place that decides whether a region may be copied without asking
 * the owner: host memfd memory the peer may read (a write-only region
 * cannot be enforced by the MMU) or, unless XFER_IPC_DIRECT_GPU=0
 * (docs/ipc.md "GPU loans"), CUDA memory (GPU loans: the peer's
 * CUDA IPC mapping reaches all of it anyway; the peer honours the access
 * the owner answered), without lease rules (guarded ranges need the
 * owner's check per access), XFER_IPC_DIRECT not 0. */
bool ipc_direct_allowed(xfer_region *r);

/* Initiator: regions lent to us, looked up under the connection's lock. */
struct ipc_direct {
    uint32_t id, gen, slot;
    unsigned access;
    uint64_t len;
    char *base;  /* the owner's memory, mapped by the ipc_map entry */
    int dev;     /* GPU loan: the GPU of base (CUDA IPC mapping); -1 host memory */
    int users;   /* copies running on this entry (atomic) */
    bool listed; /* still in the table */
    struct ipc_direct *next;
};
struct ipc_direct_table {
    struct ipc_ctl_slot *ctl; /* NULL: no direct copies on this connection */
    uint32_t nslots;
    uint64_t max_item; /* larger items go through the owner (XFER_IPC_DIRECT_MAX, default none) */
    /* The list: read by posting threads under lock (read side) alone, so
     * that threads posting on one connection do not queue on its mutex;
     * changed (note, unlist) under the connection's mutex and lock
     * (write side), so the worker reads it under its mutex alone. */
    pthread_rwlock_t lock;
    struct ipc_direct *head;
};
/* Maps the owner's control page (takes fd; -1 = none). */
void ipc_direct_init(struct ipc_direct_table *t, int fd, uint32_t nslots);
void ipc_direct_fini(struct ipc_direct_table *t);
/* Under t->lock (read side): the entry for item it if it may be copied
 * directly (a user is counted: ipc_direct_copy drops it), else NULL. */
struct ipc_direct *ipc_direct_get(struct ipc_direct_table *t, const struct xfer_item *it);
/* The same for a GPU loan (GPU memory on both sides, ipc_dgpu.c): the
 * entry if the owner lent the item's remote region and allows its op. */
struct ipc_direct *ipc_direct_get_gpu(struct ipc_direct_table *t, const struct xfer_item *it);
/* A copy holds its pin for one piece at a time, so a withdrawal (and hence
 * a deregistration) waits for one piece at most, whatever the item size. */
#define IPC_DIRECT_PIECE (256u << 10)
/* Without the lock: copies item i piece by piece and drops d's user; 0
 * done (reported unless the item was no longer live), 1 the owner withdrew
 * the loan (send it the slow way). */
int ipc_direct_copy(struct ipc_direct_table *t, struct ipc_direct *d, xfer_batch *b, size_t i);
/* Copies [off, off+len) of item i under one pin and reports those bytes:
 * 0 copied, 1 withdrawn, -1 the item has ended (nothing touched). */
int ipc_direct_piece(struct ipc_direct_table *t, const struct ipc_direct *d, xfer_batch *b,
                     size_t i, uint64_t off, uint64_t len);

/* ---- owner side (ipc_serve.c) ------------------------------------------- */

struct ipc_server;
struct ipc_server *ipc_server_start(xfer_engine *e, const char *node_id, uint64_t incarnation,
                                    int *err, char *why, size_t why_len);
void ipc_server_stop(struct ipc_server *s);
/* Local region r is going or got lease rules: withdraw its loans. */
void ipc_server_region_withdraw(struct ipc_server *s, xfer_region *r);
/* A thread waiting for a message from node (a RECV's RTS, a SEND's FIN)
 * reads node's connection to us itself for up to timeout_ms, or until
 * wake_fd (polled, not read) becomes readable, serving whatever request
 * arrives as the connection's serving thread would (ipc_serve_rx.c).
 * With spin_us > 0 it busy-polls that long before it sleeps.
 * 0, or -1: it cannot (no such connection, or it is over). */
int ipc_server_wait_in(struct ipc_server *s, const char *node, int wake_fd, int timeout_ms,
                       int spin_us);
/* ops->notif_wait_rx: the above for a thread in xfer_notif_wait, until a
 * notification is queued (node NULL: -1, the caller sleeps). */
int ipc_notif_wait_rx(struct xfer_transport *t, const char *node, int timeout_ms);
/* ops->wait_rx: the above for the peer of c, while b runs. */
int ipc_conn_wait_rx(struct xfer_conn *c, void *chan, bool inbound, xfer_batch *b, int timeout_ms);

/* ---- initiator side (ipc_conn.c) ---------------------------------------- */

/* ---- copy threads for large direct copies (ipc_pool.c) -------------------- */

struct ipc_pool;
struct ipc_conn;
/* Threads: XFER_IPC_COPY_THREADS, default ncpu / 4 (2..8); 0 = no pool.
 * They start at the first post. NULL when there is no pool. */
struct ipc_pool *ipc_pool_new(void);
/* Joins the threads; no connection may have work queued any more. */
void ipc_pool_free(struct ipc_pool *p);
/* The copy-thread tasks of one post (one batch): items lent to c (entry d,
 * a user counted) are added as the post's windows find them and published
 * to the threads in one go before the posting thread copies anything
 * itself, and at the end: one allocation, one batch hold and one wake per
 * publish, not per 64-item window. ipc_post_new: room for cap tasks, NULL
 * when out of memory; ipc_post_add: false when full; ipc_post_put drops
 * the poster's reference (the post goes with its last task). */
struct ipc_post;
struct ipc_post *ipc_post_new(size_t cap);
bool ipc_post_add(struct ipc_post *post, struct ipc_conn *c, xfer_batch *b, size_t i,
                  struct ipc_direct *d);
void ipc_post_put(struct ipc_post *post);
/* Queues the tasks added since the last publish (taking one hold on the
 * batch for each): 0, or < 0 with none of them queued: the caller takes
 * them back (up to max at a time) with ipc_post_reclaim and still owns
 * their users. */
int ipc_pool_publish(struct ipc_pool *p, struct ipc_post *post);
size_t ipc_post_reclaim(struct ipc_post *post, size_t *idx, struct ipc_direct **d, size_t max);
/* Runs fn(arg, k) for every k in [0, n) on the pool's threads and the
 * calling thread, returning once all have returned (the caller takes parts
 * too, so it never waits on threads busy elsewhere to start). */
void ipc_pool_run(struct ipc_pool *p, void (*fn)(void *arg, size_t k), void *arg, size_t n);

struct ipc_transport {
    struct xfer_transport base;
    struct ipc_server *server;
    struct ipc_pool *pool; /* NULL: large direct items go to the connection's worker */
    char host_id[XFER_HOSTID_MAX];
    char node_id[XFER_NAME_MAX];
    uint64_t incarnation;
    int cuda_devices; /* > 0 when CUDA copies are possible */
};

int ipc_conn_open(struct ipc_transport *t, xfer_peer *peer, int timeout_ms, struct xfer_conn **out);
void ipc_conn_close(struct xfer_conn *c);
/* conn_state op: all dead once the worker failed or the owner hung up (its
 * process died: the unix socket's HUP is reliable on one host), so the
 * engine fails messages waiting on that peer and repairs the connection. */
unsigned ipc_conn_state(struct xfer_conn *c);
int ipc_conn_post(struct xfer_conn *c, xfer_batch *b, const size_t *idx, size_t n);
/* Sends an engine message from the calling thread when the socket is free,
 * else queues it for the worker (ipc_link.c). */
int ipc_conn_send_msg(struct xfer_conn *c, struct xfer_msg *m);

extern const struct xfer_transport_ops xfer_ipc_transport_ops;

/* Text published in struct xfer_region_desc.ipc for a local region. */
void ipc_region_describe(const xfer_region *r, char *out, size_t len);

#endif
