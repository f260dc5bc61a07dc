/*
 * xfer engine — public API.
 *
 * An engine is one node: it owns registered memory regions, listens for peers
 * on its transports and executes one-sided READ/WRITE batches against remote
 * regions. It knows nothing of Redis: peers and their regions are plain
 * descriptor structs filled in by the caller (the registry layer does this).
 *
 * Conventions: actions return 0 or a negative XFER_E* code; constructors
 * return NULL and store the code in *err when err is not NULL; _free()
 * accepts NULL. The last error of a handle is readable with *_last_error();
 * that string stays valid until the next call on the same handle.
 */
#ifndef XFER_H
#define XFER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "xfer_err.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Everything declared here is libxfer's public API: exported although the
 * library is built with -fvisibility=hidden. */
#pragma GCC visibility push(default)

#define XFER_VERSION_STRING "0.1.0"
#define XFER_PROTO_VERSION  2u /* 2: tcp FENCE frames and batch numbers */

#define XFER_NAME_MAX   64 /* node ids, region names, incl. NUL */
#define XFER_ADDR_MAX   64 /* textual IPv4/IPv6 address, incl. NUL */
#define XFER_HOSTID_MAX 64 /* kernel boot id, incl. NUL */
#define XFER_DTYPE_MAX  16
#define XFER_TAG_MAX    128
#define XFER_BLOB_MAX   256  /* transport-specific opaque data per region */
#define XFER_NICS_MAX   1024 /* a node's RDMA NIC list: 8+ NICs at ~60 chars each */

/* ---- logging ----------------------------------------------------------- */
enum xfer_log_level { XFER_LOG_ERROR = 0, XFER_LOG_WARN, XFER_LOG_INFO, XFER_LOG_DEBUG };

typedef void (*xfer_log_fn)(enum xfer_log_level lvl, const char *msg, void *arg);

/* Level from XFER_LOG_LEVEL (error|warn|info|debug) unless set here. */
void xfer_log_set_level(enum xfer_log_level lvl);
enum xfer_log_level xfer_log_get_level(void);
/* Route log lines to fn (NULL restores stderr). */
void xfer_log_set_handler(xfer_log_fn fn, void *arg);
void xfer_log_write(enum xfer_log_level lvl, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* The level test happens before the arguments are evaluated. */
#define xfer_log(lvl, ...)                                                                         \
    do {                                                                                           \
        if ((lvl) <= xfer_log_get_level())                                                         \
            xfer_log_write((lvl), __FILE__, __LINE__, __VA_ARGS__);                                \
    } while (0)
#define xfer_err(...)   xfer_log(XFER_LOG_ERROR, __VA_ARGS__)
#define xfer_warn(...)  xfer_log(XFER_LOG_WARN, __VA_ARGS__)
#define xfer_info(...)  xfer_log(XFER_LOG_INFO, __VA_ARGS__)
#define xfer_debug(...) xfer_log(XFER_LOG_DEBUG, __VA_ARGS__)

/* ---- transports and memory kinds ---------------------------------------- */
enum xfer_transport_bit {
    XFER_TRANSPORT_TCP = 1u << 0,
    XFER_TRANSPORT_IPC = 1u << 1,
    XFER_TRANSPORT_RDMA = 1u << 2,
    XFER_TRANSPORT_TCPX = 1u << 3,
    XFER_TRANSPORT_ALL = 0xfu,
};

/* "tcp,ipc" -> mask; unknown names give -XFER_EINVAL. */
int xfer_transports_parse(const char *list, unsigned *mask);
/* mask -> "ipc,tcp" (preference order), written to buf. */
int xfer_transports_format(unsigned mask, char *buf, size_t len);

enum xfer_mem_kind { XFER_MEM_HOST = 0, XFER_MEM_CUDA = 1 };

enum xfer_access {
    XFER_ACCESS_R = 1u << 0, /* peers may READ */
    XFER_ACCESS_W = 1u << 1, /* peers may WRITE */
    XFER_ACCESS_RW = XFER_ACCESS_R | XFER_ACCESS_W,
    /* Registration only (never published): the region may carry leases
     * over rdma. Its rdma rkey is not published; rdma peers reach it only
     * through memory windows the owner binds on their queue pairs over what
     * the lease rules grant them, invalidated when a lease ends or its
     * ranges are released (docs/rdma.md "Leases"). Costs a round trip and
     * a window bind per queue pair and range on first access. */
    XFER_ACCESS_LEASED = 1u << 2,
};
/* "r", "w", "rw" <-> mask. */
int xfer_access_parse(const char *s, unsigned *mask);
const char *xfer_access_str(unsigned mask);

/* ---- descriptors (plain data, as published to the registry) ------------ */

/* Optional typed layout of a region (KV cache pools). All zero = untyped. */
struct xfer_layout {
    char dtype[XFER_DTYPE_MAX]; /* e.g. "bf16" */
    uint64_t block_bytes;       /* bytes of one block in one layer */
    uint64_t num_blocks;
    uint32_t layers;
    char tag[XFER_TAG_MAX]; /* free form, e.g. model id */
};

struct xfer_region_desc {
    char name[XFER_NAME_MAX];
    uint32_t id;  /* unique within a node while registered */
    uint32_t gen; /* bumped each time a name is registered again */
    enum xfer_mem_kind kind;
    int device; /* CUDA ordinal for XFER_MEM_CUDA, else -1 */
    uint64_t addr;
    uint64_t len;
    unsigned access; /* XFER_ACCESS_* */
    struct xfer_layout layout;
    /* Transport data published with the region, as text (hex/fields):
     * ipc = memfd/CUDA IPC handle, rkeys = one rkey per NIC. */
    char ipc[XFER_BLOB_MAX];
    char rkeys[XFER_BLOB_MAX];
};

struct xfer_peer_desc {
    char node_id[XFER_NAME_MAX];
    char addr[XFER_ADDR_MAX]; /* data-plane address */
    uint16_t data_port;
    char host_id[XFER_HOSTID_MAX]; /* same host_id => same kernel */
    unsigned transports;           /* XFER_TRANSPORT_* the peer offers */
    uint64_t incarnation;          /* fresh random value per process start */
    char nics[XFER_NICS_MAX];      /* RDMA NICs, as published */
    uint16_t tcpx_port;            /* tcpx control port on addr; 0 = no tcpx */
};

/* ---- engine ------------------------------------------------------------ */
typedef struct xfer_engine xfer_engine;
typedef struct xfer_region xfer_region;
typedef struct xfer_peer xfer_peer;
typedef struct xfer_batch xfer_batch;

struct xfer_engine_config {
    const char *node_id;     /* required */
    const char *listen_addr; /* default "127.0.0.1" */
    uint16_t data_port;      /* 0 = ephemeral */
    const void *secret;      /* cluster secret; NULL = no authentication */
    size_t secret_len;
    const char *host_id;     /* NULL = kernel boot id */
    unsigned transports;     /* allowed; 0 = XFER_TRANSPORTS env or all */
    int sockets_per_peer;    /* tcp sockets per peer, default 4 */
    size_t chunk_bytes;      /* split items above this, default 1 MiB */
    int progress_threads;    /* default 1 */
    int connect_timeout_ms;  /* default 5000 */
    int io_timeout_ms;       /* no progress for this long = peer dead, default 10000 */
    int default_deadline_ms; /* submit without deadline gets this, default 60000 */
    int notify_queue_len;    /* received notifications kept until polled, default 1024 */
    /* xfer_batch_wait spins up to this long before sleeping: saves the
     * wake-up (several us) on small round trips at the price of a busy
     * core (over ipc a SEND/RECV's waiter spins on its peer's socket,
     * before each 20 ms slice of its wait). 0 = off (default), or
     * XFER_BUSY_POLL_US from the environment. */
    int busy_poll_us;
};

/* Fills defaults; call before setting fields. */
void xfer_engine_config_init(struct xfer_engine_config *cfg);

/* Starts the node: opens every allowed transport that probes usable and
 * starts its listener and progress threads. The config's strings are copied. */
xfer_engine *xfer_engine_new(const struct xfer_engine_config *cfg, int *err);
/* Cancels in-flight batches, closes connections, joins threads. Calls of
 * the one-call functions (xfer_read, xfer_write, xfer_send, xfer_recv,
 * xfer_notify) must have returned: each waits for its own run and ends it
 * at its deadline itself (docs/perf.md, "Step 15"). */
void xfer_engine_free(xfer_engine *e);
/* The engine's last error message, copied under the engine's lock into a
 * buffer of the calling thread: safe while other threads set errors, valid
 * until this thread's next xfer_engine_last_error call. */
const char *xfer_engine_last_error(const xfer_engine *e);

/* This node as peers should see it (addr, port, host id, transports, ...). */
void xfer_engine_describe(const xfer_engine *e, struct xfer_peer_desc *out);
uint16_t xfer_engine_data_port(const xfer_engine *e);

/* CUDA GPUs visible to this process, "idx:uuid:pci,..." (e.g.
 * "0:GPU-8f3c...:0000:19:00.0"), published as the node's `gpus`. Returns the
 * number of GPUs (0 and "" without CUDA) or -XFER_ENOSPC when len is short. */
int xfer_gpus_describe(char *buf, size_t len);

/* ---- regions ----------------------------------------------------------- */

/* Registers caller memory [ptr, ptr+len) under name. The memory must stay
 * valid until xfer_region_deregister(). kind/device say where it lives. */
int xfer_region_register(xfer_engine *e, const char *name, void *ptr, size_t len,
                         enum xfer_mem_kind kind, int device, unsigned access, xfer_region **out);
/* Allocates len bytes of host memory from a memfd (shareable with same-host
 * peers) and registers it; the engine frees it on deregistration. The memfd
 * is sealed (F_SEAL_SHRINK|F_SEAL_GROW|F_SEAL_SEAL): no holder can resize it.
 * The pages are faulted in here (about 0.1-0.3 s per GiB; XFER_REGION_PREFAULT=0
 * skips it) and come from huge pages (MFD_HUGETLB) when len is a multiple
 * of the huge page size and the host has free ones, else 4 KiB pages with
 * one info log line per process (XFER_HUGETLB=0: never try). */
int xfer_region_alloc(xfer_engine *e, const char *name, size_t len, unsigned access,
                      xfer_region **out);
/* Registers an existing memfd (e.g. received over a unix socket) of len
 * bytes; the engine maps it and takes ownership of fd. The memfd must be
 * sealed against shrinking (a truncation would SIGBUS this process): one
 * created with MFD_ALLOW_SEALING is sealed here (F_SEAL_SHRINK, permanent);
 * any other gets -XFER_EINVAL. */
int xfer_region_adopt_memfd(xfer_engine *e, const char *name, int fd, size_t len, unsigned access,
                            xfer_region **out);
/* Registers GPU memory that another process of this host exported with
 * cudaIpcGetMemHandle (the 64-byte cudaIpcMemHandle_t of an allocation):
 * opens it on GPU `device` of this process and registers [offset, offset+len)
 * of the allocation as kind cuda:<device>. The mapping is closed on
 * deregistration; the exporter must keep the allocation alive until then.
 * Same-host peers reach it over ipc through the same handle. Errors:
 * -XFER_ENODEV (no CUDA device), -XFER_EINVAL (bad handle length, or CUDA
 * refused the handle: reason in the last error), -XFER_ERANGE (beyond the
 * allocation). */
int xfer_region_adopt_cuda(xfer_engine *e, const char *name, const void *handle, size_t handle_len,
                           int device, uint64_t offset, size_t len, unsigned access,
                           xfer_region **out);
/* Removes the region; peers holding its id/gen get -XFER_ESTALE/-XFER_ENOENT.
 * Waits for in-progress target-side accesses to finish: a tcp/rdma access
 * is bounded by io_timeout_ms, and a same-host (ipc) peer that holds the
 * region longer (stopped, hung) has its access revoked after io_timeout_ms
 * (its connection is closed), so this returns within about io_timeout_ms +
 * 1 s of the last local batch on r ending. */
int xfer_region_deregister(xfer_engine *e, xfer_region *r);
/* First half of xfer_region_deregister, which never waits: new accesses
 * fail and xfer_region_find no longer finds r. The caller that detached r
 * then calls xfer_region_deregister(e, r) (no other caller may), e.g. after
 * dropping its own locks so the wait stalls nobody else. */
int xfer_region_detach(xfer_engine *e, xfer_region *r);

int xfer_region_set_layout(xfer_region *r, const struct xfer_layout *layout);
xfer_region *xfer_region_find(xfer_engine *e, const char *name);
void *xfer_region_ptr(const xfer_region *r);
size_t xfer_region_len(const xfer_region *r);
/* memfd backing the region, or -1; borrowed, owned by the region. */
int xfer_region_memfd(const xfer_region *r);
void xfer_region_describe(const xfer_region *r, struct xfer_region_desc *out);
/* Calls fn for every registered region (table locked during the walk). */
void xfer_region_foreach(xfer_engine *e, void (*fn)(const struct xfer_region_desc *, void *),
                         void *arg);

/* ---- leases: per-peer access rules on byte ranges (engine/lease.c) ------ */
/* A lease lets one peer node reach ranges of local regions until a deadline.
 * A range once added to a lease is *guarded*: a target-side access (tcp,
 * tcpx, ipc) that touches guarded bytes is admitted only when every guarded
 * byte it touches is covered by a live lease of the accessing node (its id as
 * the handshake proved it); otherwise it is refused with -XFER_ESTALE.
 * Unguarded bytes are not affected. A range stays guarded after its lease
 * ended, was dropped or freed (it then refuses everyone without another live
 * lease on it) until xfer_region_unguard() or deregistration. Accesses
 * already admitted finish (one tcp chunk, one ipc group: docs/node.md).
 * rdma is one-sided: its owner enforces rules only on regions registered
 * with XFER_ACCESS_LEASED (memory windows; xfer_lease_add refuses other
 * regions the rdma transport serves, -XFER_ENOTSUP). xfer_lease_drop,
 * _end and _free return once the rdma NIC refuses what they revoked (the
 * windows' invalidations completed, at most io_timeout_ms). All calls are
 * thread-safe; none blocks on I/O but that. */
typedef struct xfer_lease xfer_lease;
struct xfer_range {
    uint64_t off, len;
};
/* A live lease for peer_node, ending ttl_ms from now (CLOCK_MONOTONIC). */
xfer_lease *xfer_lease_new(xfer_engine *e, const char *peer_node, int ttl_ms, int *err);
/* Guards v[0..n) of r and grants them to l. Ended or released rules that
 * lie wholly inside a new range are dropped (the new one guards them).
 * -XFER_ERANGE (a range past r's end), -XFER_ESTALE (l ended). */
int xfer_lease_add(xfer_lease *l, xfer_region *r, const struct xfer_range *v, size_t n);
/* l no longer grants v[0..n) of r (they stay guarded): refused at once. */
int xfer_lease_drop(xfer_lease *l, xfer_region *r, const struct xfer_range *v, size_t n);
/* Moves the deadline to ttl_ms from now; -XFER_ESTALE once ended (an ended
 * lease never comes back: its blocks may have been reused). */
int xfer_lease_renew(xfer_lease *l, int ttl_ms);
/* Ends l now: every range it granted is refused from this call on. */
void xfer_lease_end(xfer_lease *l);
/* True while l is live (not ended, deadline not passed). */
bool xfer_lease_live(const xfer_lease *l);
/* Ends l and drops the caller's reference; its ranges stay guarded. */
void xfer_lease_free(xfer_lease *l);
/* Removes every rule of r: all of it is open again to every peer. */
int xfer_region_unguard(xfer_region *r);
/* Number of rules (ranges) r holds; for tests and metrics. */
size_t xfer_region_guard_count(xfer_region *r);

/* ---- peers ------------------------------------------------------------- */

/* Adds or updates a peer. If one with the same node id exists and the
 * incarnation differs, its connections and cached regions are dropped.
 * Connections are set up here (bounded by connect_timeout_ms), never on the
 * data path; a failure leaves the peer registered but unconnected and the next
 * xfer_peer_add/xfer_peer_connect retries. A connection whose channels die
 * later (reset, io timeout) is replaced in the background by an engine thread
 * for transports that report their state (tcp), with backoff, bounded by
 * connect_timeout_ms; meanwhile items fail fast with -XFER_ECONN.
 * xfer_peer_connect() drops the connection and connects anew at once.
 * The returned handle is owned by the engine and valid until
 * xfer_peer_remove() or xfer_engine_free(). */
int xfer_peer_add(xfer_engine *e, const struct xfer_peer_desc *desc, xfer_peer **out);
int xfer_peer_connect(xfer_peer *p);
xfer_peer *xfer_peer_find(xfer_engine *e, const char *node_id);
/* Fails the peer's in-flight work with -XFER_ECONN and forgets it. */
int xfer_peer_remove(xfer_engine *e, xfer_peer *p);
/* Caches the descriptor of a remote region (replaces one of the same id). */
int xfer_peer_region_add(xfer_peer *p, const struct xfer_region_desc *d);
int xfer_peer_region_remove(xfer_peer *p, uint32_t id);
/* Copies a cached remote region found by name into out. */
int xfer_peer_region_lookup(xfer_peer *p, const char *name, struct xfer_region_desc *out);
void xfer_peer_describe(const xfer_peer *p, struct xfer_peer_desc *out);
/* Transport in use for this peer (XFER_TRANSPORT_* bit), 0 if unconnected
 * or if its connection is known dead (no channel left; see xfer_peer_add). */
unsigned xfer_peer_transport(const xfer_peer *p);

/* ---- batches ----------------------------------------------------------- */
/* SEND/RECV are two-sided messages (docs/notify.md), added with
 * xfer_batch_add_send/xfer_batch_add_recv, not xfer_batch_add. */
enum xfer_op { XFER_OP_READ = 1, XFER_OP_WRITE = 2, XFER_OP_SEND = 3, XFER_OP_RECV = 4 };

#define XFER_MSG_TAG_ANY UINT64_MAX /* RECV: matches any tag */
/* SENDs of host memory up to this many bytes carry their data inside the
 * message frame (eager: one round trip instead of two; docs/notify.md). */
#define XFER_MSG_EAGER_MAX 8192u

struct xfer_item {
    enum xfer_op op; /* READ: remote -> local; WRITE: local -> remote */
    xfer_region *local;
    uint64_t local_off;
    xfer_peer *peer;
    uint32_t remote_id;
    uint32_t remote_gen;
    uint64_t remote_off;
    uint64_t len;
};

xfer_batch *xfer_batch_new(xfer_engine *e, int *err);
/* Cancels and waits if still in flight, then frees. */
void xfer_batch_free(xfer_batch *b);
/* Appends an item; returns its index (>= 0) or a negative code. Local bounds
 * and access are checked here. Only before submit (or after reset). */
int xfer_batch_add(xfer_batch *b, const struct xfer_item *it);
/* Appends items[0..n) at once, all or none (one lock, one growth): returns
 * the index of the first, or a negative code with nothing appended. */
int xfer_batch_add_many(xfer_batch *b, const struct xfer_item *items, size_t n);
size_t xfer_batch_count(const xfer_batch *b);
/* Drops the items past the first n (undoes a partial fill; bindings stay).
 * -XFER_EBUSY while running. */
int xfer_batch_truncate(xfer_batch *b, size_t n);

/* A vectored item moves many pieces between one local and one remote region
 * (a KV pool's blocks of one layer, say) as ONE item: one status, one
 * reason, one completion, and transports that can move the whole list at
 * once do (ipc GPU<->GPU: one owner round trip and a few batched-copy
 * kernel launches; docs/engine.md, "Vectored items"). */
struct xfer_seg {
    uint64_t local_off;  /* in the item's local region */
    uint64_t remote_off; /* in the item's remote region */
    uint64_t len;        /* > 0 */
};
#define XFER_SEGS_MAX (1u << 20) /* segments of one vectored item */

/* Appends one vectored item: it->op, local, peer, remote_id and remote_gen
 * name the regions (it->local_off, remote_off and len must be 0);
 * segs[0..n) are copied. Every segment is checked against the local region
 * here; the remote side is checked where the item runs (the owner refuses
 * a segment outside its region or under lease rules the initiator lacks,
 * and the item's reason and xfer_batch_item_failed_segment() name it).
 * Returns the item's index, or -XFER_EINVAL (n == 0 or > XFER_SEGS_MAX, a
 * zero-length segment, offsets set in it, a bad op, region or peer),
 * -XFER_ERANGE (a segment outside the local region or past 2^64: the last
 * error names it), -XFER_EBUSY (batch running), -XFER_ENOMEM. */
int xfer_batch_add_segments(xfer_batch *b, const struct xfer_item *it, const struct xfer_seg *segs,
                            size_t n);
/* A block item is a vectored item whose segments are described, not listed:
 * nstreams x nids segments of len bytes, segment k = (stream k / nids, id
 * k % nids) at local_base[stream] + local_ids[id] * local_stride here and
 * remote_base[stream] + remote_ids[id] * remote_stride there. A KV pool
 * request (512 block ids over a layer's K and V halves) is then ~8 KiB of
 * ids instead of 1,024 segments per region pair, and a transport that
 * knows the form (ipc: XFER_CAP_BLOCKS) checks it on the largest id and
 * lets the GPU expand it (docs/engine.md, "Block items"). */
struct xfer_block_list {
    uint64_t len; /* bytes per segment, > 0 */
    uint64_t local_stride, remote_stride;
    const uint64_t *local_ids; /* nids each */
    const uint64_t *remote_ids;
    uint32_t nids;
    const uint64_t *local_base; /* nstreams each */
    const uint64_t *remote_base;
    uint32_t nstreams;
};

/* Appends one block item (it as for xfer_batch_add_segments; the arrays
 * are copied, equal id lists of consecutive calls stored once). The local
 * side is checked on each stream's largest id (offsets past 2^64 refused),
 * the remote side's arithmetic too; its bounds where the item runs. Only
 * transports with XFER_CAP_BLOCKS take such items (ipc); others fail them
 * with -XFER_ENOTSUP (use xfer_batch_add_segments there). Returns the
 * index, -XFER_EINVAL (no ids or streams, len 0, more than XFER_SEGS_MAX
 * segments, offsets in it), -XFER_ERANGE (the last error names the id),
 * -XFER_EBUSY, -XFER_ENOMEM. */
/* The same for items[0..n) with lists[0..n) at once, all or none: lists
 * sharing an id array by pointer are checked and stored once (a request's
 * region pairs: one scan of the ids, not one per pair). Returns the first
 * index. */
int xfer_batch_add_block_items(xfer_batch *b, const struct xfer_item *items,
                               const struct xfer_block_list *lists, size_t n);
int xfer_batch_add_block_item(xfer_batch *b, const struct xfer_item *it,
                              const struct xfer_block_list *bl);
/* Segment k of block list bl (k < nstreams * nids). */
static inline struct xfer_seg xfer_block_list_seg(const struct xfer_block_list *bl, uint64_t k)
{
    uint64_t s = k / bl->nids, i = k % bl->nids;
    return (struct xfer_seg){bl->local_base[s] + bl->local_ids[i] * bl->local_stride,
                             bl->remote_base[s] + bl->remote_ids[i] * bl->remote_stride, bl->len};
}
/* Index of the segment whose failure ended vectored item i, or -1 (plain
 * item, no failure, or a failure of the whole item: deadline, cancel, a
 * lost connection). */
int64_t xfer_batch_item_failed_segment(const xfer_batch *b, size_t i);
/* Starts the batch. deadline_ms > 0: cancelled and reported -XFER_ETIMEDOUT
 * past it; 0: the engine's default deadline. */
int xfer_batch_submit(xfer_batch *b, int deadline_ms);
/* 0 when all items succeeded, -XFER_EINPROGRESS while running, else the
 * first failing item's code. */
int xfer_batch_poll(xfer_batch *b);
/* Like poll but waits up to timeout_ms (-1 = until the deadline). */
int xfer_batch_wait(xfer_batch *b, int timeout_ms);
/* Items not yet done end with -XFER_ECANCELED; returns once no transport
 * touches the batch's local memory any more. */
int xfer_batch_cancel(xfer_batch *b);
/* eventfd readable once the batch is finished (borrowed, lives with b; made
 * on the first call: -1 if the system has none to give). */
int xfer_batch_fd(const xfer_batch *b);
/* Status of item i (0, -XFER_EINPROGRESS or an error) and its reason. */
int xfer_batch_item_status(const xfer_batch *b, size_t i);
const char *xfer_batch_item_error(const xfer_batch *b, size_t i);
/* XFER_TRANSPORT_* bit item i was posted on in its last run (0 if it never
 * reached a transport: refused before posting, or not run yet). */
unsigned xfer_batch_item_transport(const xfer_batch *b, size_t i);
/* Clears items so the batch can be filled again (not while in flight). */
int xfer_batch_reset(xfer_batch *b);

/* ---- notifications (docs/notify.md) -------------------------------------- */
/*
 * A notification is a message of at most XFER_NOTIFY_MAX bytes that lands in
 * the target engine's bounded receive queue. Bound to a batch, it is sent
 * only after every item of that batch addressed to its peer has ended (a
 * fence in the engine, the same on every transport): on arrival all those
 * items' data is in the target's memory, except items the notification
 * names as failed. Delivery is at most once (the engine never resends).
 */
#define XFER_NOTIFY_MAX        65536u /* bytes of one message (>= 4 KiB promised) */
#define XFER_NOTIFY_FAILED_MAX 4096u  /* failed items named per notification */

/* Binds msg (len <= XFER_NOTIFY_MAX bytes, copied) to batch b for peer p:
 * one per peer per batch, a second call for the same peer replaces the
 * first. Only before submit; xfer_batch_reset() drops the bindings. p need
 * not have items in b (then it is sent at submit: an async standalone
 * notification, e.g. a batch with no items and one binding).
 * The batch finishes only when each bound notification has been acknowledged
 * by its target (queued there) or has failed; xfer_batch_poll()/wait() then
 * return the first failing item's code, else the first failing
 * notification's code:
 *   -XFER_ENOSPC   the target's queue was full (not queued; back-pressure is
 *                  the sender's: read the code, retry later),
 *   -XFER_ECONN    the connection died after sending: it may or may not have
 *                  been queued (never twice),
 *   -XFER_ETIMEDOUT/-XFER_ECANCELED  deadline/cancel before the
 *                  acknowledgement: also "may or may not",
 *   -XFER_ENOTSUP  the peer's transport carries no messages (tcpx),
 *   -XFER_EPROTO   the target refused the frame.
 * Errors here: -XFER_EINVAL (len too long, p of another engine), -XFER_EBUSY
 * (batch running), -XFER_ENOMEM. */
int xfer_batch_notify(xfer_batch *b, xfer_peer *p, const void *msg, size_t len);
/* Status of b's notification for p: 0 (queued at the target),
 * -XFER_EINPROGRESS, an error above, or -XFER_ENOENT (none bound). */
int xfer_batch_notify_status(const xfer_batch *b, const xfer_peer *p);

/* Standalone notification: sends msg to p now and waits for the
 * acknowledgement, bounded by deadline_ms (0 = engine default). Same codes as
 * a bound notification. */
int xfer_notify(xfer_engine *e, xfer_peer *p, const void *msg, size_t len, int deadline_ms);

/* A failed item named by a bound notification. */
struct xfer_notif_fail {
    uint32_t index; /* the item's index in the sender's batch */
    int32_t status; /* its -XFER_E* code */
};

/* A received notification, one allocation: free with xfer_notif_free(). */
struct xfer_notif {
    char node_id[XFER_NAME_MAX]; /* sender (as its handshake proved it) */
    uint64_t incarnation;        /* sender's incarnation */
    uint64_t seq;                /* sender's message number (per sender engine) */
    bool bound;                  /* bound to a batch (else standalone) */
    int status;                  /* 0, or the first failed item's code */
    uint32_t n_items;            /* items of that batch addressed to this node */
    uint32_t n_failed;           /* how many of them failed */
    uint32_t n_listed;           /* entries in failed[]: min(n_failed, FAILED_MAX) */
    struct xfer_notif_fail *failed;
    size_t len;
    uint8_t *data; /* len bytes (+ a NUL, not counted) */
};

/* Takes up to max received notifications, oldest first, into out[]; returns
 * how many (0 = none queued) or -XFER_EINVAL. Each is the caller's to free. */
int xfer_notif_poll(xfer_engine *e, struct xfer_notif **out, size_t max);
void xfer_notif_free(struct xfer_notif *n);
/* eventfd readable while the receive queue is not empty (level: it is
 * drained by xfer_notif_poll taking the last one), from the first call of
 * this function on (until then the engine writes it only for its own
 * waiters). Borrowed, lives with e. */
int xfer_notif_fd(const xfer_engine *e);
/* Waits until a notification is queued or timeout_ms passed (-1: no
 * limit; the wait is made of bounded slices). While it waits, the calling
 * thread reads and serves the connection that node_id's messages arrive on
 * itself (NULL: the one the last message from anyone came on), so the
 * notification is taken off the socket by the thread that wants it, not
 * handed over by the transport's thread (tcp; docs/notify.md "Waiting for a
 * notification"); notifications from other peers wake it too. Returns how
 * many are queued (> 0; take them with xfer_notif_poll), 0 at the timeout,
 * or -XFER_EINVAL. XFER_NOTIF_WAIT_RX=0: only sleep on xfer_notif_fd(). */
int xfer_notif_wait(xfer_engine *e, const char *node_id, int timeout_ms);
/* Notifications queued now, and refused so far because the queue was full. */
size_t xfer_notif_pending(xfer_engine *e);
uint64_t xfer_notif_refused(xfer_engine *e);

/* ---- two-sided messages (docs/notify.md) ---------------------------------
 * A SEND item sends [off, +len) of local to p with a tag; a RECV item posts
 * [off, +cap) of local as a receive buffer for (p, or any peer when p is
 * NULL; tag, or any tag with XFER_MSG_TAG_ANY). Matching, per receiving
 * engine: an arriving message takes the oldest posted RECV whose peer and tag
 * fit; a RECV posted when messages wait takes the oldest fitting one (FIFO
 * per sender and tag: two messages of one sender with one tag are received in
 * the order they were sent). Vectored forms (sendv/recvv) are several SEND or
 * RECV items in one batch; they match in item order. Completion goes through
 * the usual batch status/poll/wait/fd. A message longer than the matched
 * buffer fails with -XFER_ETRUNC on both sides (nothing is written).
 * Data moves receiver-driven (rendezvous: the receiver READs the sender's
 * region, which must allow R) or, up to XFER_MSG_EAGER_MAX bytes of host
 * memory, inside the message itself (eager: the receiver copies the bytes,
 * into device memory with cudaMemcpy); either way both engines must know each other as peers
 * (xfer_peer_add; else the SEND fails -XFER_ENOENT); a SEND completes once
 * its bytes are in the receiver's buffer. At most 4096 messages wait
 * unmatched per receiver (more: -XFER_ENOSPC for the SEND). Peer death
 * (tcp) fails pending SENDs to it and RECVs that named it with -XFER_ECONN;
 * deadlines and cancel work as for READ/WRITE items. tcp and ipc; other
 * transports: -XFER_ENOTSUP. */
/* Append one SEND / RECV item; return its index (>= 0) or a negative code
 * (local bounds checked here, as xfer_batch_add). */
int xfer_batch_add_send(xfer_batch *b, xfer_region *local, uint64_t off, uint64_t len, xfer_peer *p,
                        uint64_t tag);
int xfer_batch_add_recv(xfer_batch *b, xfer_region *local, uint64_t off, uint64_t cap, xfer_peer *p,
                        uint64_t tag);
/* Opt-in weaker SEND (docs/notify.md, "Eager, locally completed"):
 * XFER_SEND_LOCAL, for host memory of at most XFER_MSG_EAGER_MAX bytes
 * (else -XFER_EINVAL at add). The SEND ends 0 once its frame (bytes
 * copied in) was written to the peer's message channel (tcp: the socket;
 * other transports: at the target's answer, which still comes), without
 * waiting for a RECV: no FIN, and over tcp no answer at all. The sender is
 * not told of truncation (the RECV still ends -XFER_ETRUNC), of a full
 * receive queue or an unknown sender (the receiver drops the message and
 * logs it), nor of a peer that dies after the frame left (-XFER_ECONN only
 * if the connection failed first). At most once and in order with the
 * peer's other messages, as any SEND; a RECV into device memory gets its
 * bytes copied in (before 2026-11-29 evening: -XFER_EINVAL). Both engines
 * must have this code (an older receiver refuses the frame). */
#define XFER_SEND_LOCAL 1u
int xfer_batch_add_send_flags(xfer_batch *b, xfer_region *local, uint64_t off, uint64_t len,
                              xfer_peer *p, uint64_t tag, unsigned flags);
/* Received length of a finished RECV item (else the item's len). */
uint64_t xfer_batch_item_bytes(const xfer_batch *b, size_t i);
/* Tag and sender of a finished RECV item (for any-tag, any-peer receives);
 * the name is copied into node_id (XFER_NAME_MAX bytes) when not NULL. The
 * batch keeps its own copy of the name: valid after xfer_peer_remove. */
int xfer_batch_item_msg(const xfer_batch *b, size_t i, uint64_t *tag, char *node_id);
/* One SEND / RECV, submitted and waited for; xfer_recv stores the length. */
int xfer_send(xfer_engine *e, xfer_region *local, uint64_t off, uint64_t len, xfer_peer *p,
              uint64_t tag, int deadline_ms);
int xfer_recv(xfer_engine *e, xfer_region *local, uint64_t off, uint64_t cap, xfer_peer *p,
              uint64_t tag, uint64_t *got, int deadline_ms);
/* xfer_send with flags (XFER_SEND_LOCAL). */
int xfer_send_flags(xfer_engine *e, xfer_region *local, uint64_t off, uint64_t len, xfer_peer *p,
                    uint64_t tag, unsigned flags, int deadline_ms);

/* ---- KV blocks ---------------------------------------------------------- */
/* Block i of a region with a layout is the xfer_layout_block_size() bytes
 * at offset i * that: block-major, [num_blocks][max(layers, 1)][block_bytes]
 * (the same blocks xferctl's NODE/REGION#B addresses). */
uint64_t xfer_layout_block_size(const struct xfer_layout *l);
/* 0 when blocks of a and b can be copied onto each other: both typed
 * (block_bytes > 0), same dtype, block_bytes and layers, same tag when both
 * have one. Else -XFER_EMISMATCH and the reason in why (may be NULL). */
int xfer_layouts_match(const struct xfer_layout *a, const struct xfer_layout *b, char *why,
                       size_t why_len);
/* Moves blocks local_ids[i] <-> remote_ids[i] (i < n) between the local
 * region and the peer's region remote_id (its descriptor must be cached with
 * xfer_peer_region_add). Checks both layouts (-XFER_EMISMATCH), block ids
 * against num_blocks and the regions' lengths (-XFER_ERANGE), then appends
 * one item per run of blocks that are consecutive on both sides: "7, 8, 9 ->
 * 40, 41, 42" is one item, "7, 19, 3 -> 40, 2, 11" three. Returns the number
 * of items appended (the first has index xfer_batch_count() before the
 * call), or a negative code with nothing appended; the reason is in
 * xfer_engine_last_error(). The id arrays are only read during the call. */
int xfer_batch_add_blocks(xfer_batch *b, enum xfer_op op, xfer_region *local,
                          const uint64_t *local_ids, xfer_peer *peer, uint32_t remote_id,
                          uint32_t remote_gen, const uint64_t *remote_ids, size_t n);

/* ---- statistics -------------------------------------------------------- */
#define XFER_LAT_BUCKETS 16 /* bucket i counts ops taking < 2^i * 8 us; last = the rest */

struct xfer_stats {
    uint64_t ops_read, ops_write;       /* items completed as initiator */
    uint64_t bytes_read, bytes_written; /* bytes moved by those items */
    uint64_t errors;                    /* items failed */
    uint64_t served_ops, served_bytes;  /* requests served as target */
    uint64_t served_errors;             /* requests refused as target */
    uint64_t lat_us_sum;                /* sum of item latencies */
    uint64_t lat_hist[XFER_LAT_BUCKETS];
};

/* Totals of the node, per peer, per transport (bit = XFER_TRANSPORT_*). */
void xfer_engine_stats(xfer_engine *e, struct xfer_stats *out);
void xfer_peer_stats(xfer_peer *p, struct xfer_stats *out);
void xfer_transport_stats(xfer_engine *e, unsigned transport_bit, struct xfer_stats *out);
/* Calls fn for every known peer (peer table locked during the walk). */
void xfer_peer_foreach(xfer_engine *e, void (*fn)(xfer_peer *, void *), void *arg);

/* ---- convenience ------------------------------------------------------- */
/* One item, submitted and waited for. */
int xfer_read(xfer_engine *e, xfer_region *local, uint64_t local_off, xfer_peer *p,
              uint32_t remote_id, uint32_t remote_gen, uint64_t remote_off, uint64_t len,
              int deadline_ms);
int xfer_write(xfer_engine *e, xfer_region *local, uint64_t local_off, xfer_peer *p,
               uint32_t remote_id, uint32_t remote_gen, uint64_t remote_off, uint64_t len,
               int deadline_ms);

/* Overflow-safe: true when [off, off+len) lies inside [0, size). len 0 is
 * in range for off <= size. */
static inline bool xfer_range_ok(uint64_t off, uint64_t len, uint64_t size)
{
    return off <= size && len <= size - off;
}

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif /* XFER_H */
