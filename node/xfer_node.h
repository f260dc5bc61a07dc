/*
 * xfer node — the embeddable node (public header of node/).
 *
 * A node is one engine (engine/xfer.h) joined to the fleet through the
 * registry (registry/xfer_registry.h): it publishes itself and its regions,
 * heartbeats, watches xfer:events, keeps the name cache current, and turns
 * names ("decode-3/kv.L0+4096", "decode-3/kv" for a pool) into engine peers and
 * region descriptors. xferd is a node plus a control server; any process (an
 * inference worker, a Python program) can embed one.
 *
 * Conventions: as the engine's. Actions return 0 or a negative XFER_E* code,
 * constructors return NULL and store the code in *err; _free() accepts NULL.
 * The reason of the last failed call is xfer_node_last_error(), kept per
 * calling thread.
 *
 * Threads (what runs where, what blocks, for how long):
 *  - The node starts the engine's threads (listener, progress, deadline
 *    monitor, connection repair) and one registry thread of its own: it
 *    heartbeats every heartbeat_ms, reconnects to Redis with backoff, receives
 *    xfer:events and applies them (a peer that left or restarted loses its
 *    connections and cached regions; a removed region or pool is forgotten).
 *    The registry thread never connects to peers; removing a peer that left
 *    waits at most for one connection attempt of the engine's repair thread
 *    (connect_timeout_ms) that may be running on it.
 *  - Every function is thread-safe. Calls that may block, and their bound:
 *      xfer_node_new              Redis connect (registry_timeout_ms; with
 *                                 offline_ok it does not fail on Redis down)
 *                                 + engine start (no peer I/O)
 *      region/pool (de)register   one pipelined Redis round trip (fails fast,
 *                                 -XFER_EUNAVAIL is not an error: published on
 *                                 reconnect); deregistration also waits for
 *                                 target-side accesses in progress (engine)
 *      xfer_node_resolve, *_add   on a cache miss: Redis lookups (each
 *      (names not seen before)    registry_timeout_ms) and the first
 *                                 connection to the peer (connect_timeout_ms);
 *                                 cached names cost no I/O. Connecting happens
 *                                 with no node-wide lock held: one peer that
 *                                 black-holes SYNs delays only the callers
 *                                 that need that peer.
 *      xfer_node_batch_wait       up to its timeout / the batch deadline
 *                                 (plus one re-resolve and retry of items
 *                                 that met a restarted peer or a re-registered
 *                                 region, within the same deadline)
 *      xfer_node_free             unpublish (registry_timeout_ms), cancel and
 *                                 join engine work
 *    Nothing else blocks on the network. No call waits without a bound.
 *  - Event callbacks (xfer_node_config.on_event) run on the registry thread
 *    after the node has applied the event; they must not block for long and
 *    must not call xfer_node_free.
 *
 * Names: "node/region[+off]" (byte offset: decimal, 0x hex, or K/M/G
 * suffix), "node/region#block" (block index of a region with a typed layout),
 * "node/pool" for pools. Region and pool names whose first character is '_'
 * are private: registered on the engine but never published.
 */
#ifndef XFER_NODE_H
#define XFER_NODE_H

#include "xfer.h"
#include "xfer_registry.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct xfer_node xfer_node;

/* ---- node ---------------------------------------------------------------- */

/* Called on the registry thread after the node applied the event (see
 * xfer_registry_event in xfer_registry.h). */
typedef void (*xfer_node_event_fn)(const struct xfer_registry_event *ev, void *arg);

struct xfer_node_config {
    const char *node_id;   /* required; xfer_registry_name_ok() */
    const char *redis_url; /* NULL: $XFER_REDIS_URL, else redis://127.0.0.1:6379 */
    const void *secret;    /* cluster secret (handshake auth); NULL = none */
    size_t secret_len;
    const char *transports;      /* allowed, e.g. "tcp,ipc"; NULL/"" = $XFER_TRANSPORTS or all */
    const char *require;         /* every transfer must use one of these, e.g. "ipc,rdma";
                                    NULL/"" = any. Per batch: xfer_node_batch_require(). */
    const char *listen_addr;     /* data-plane address, default "127.0.0.1" */
    uint16_t data_port;          /* 0 = ephemeral */
    const char *advertise;       /* address published to peers; NULL = listen_addr */
    uint16_t ctrl_port;          /* published control port (xferd's); 0 = none */
    int ttl_ms;                  /* registry TTL of this node's keys, default 10000 */
    int heartbeat_ms;            /* default ttl_ms / 3 */
    int registry_timeout_ms;     /* Redis connect and per-command timeout, default 2000 */
    int connect_timeout_ms;      /* peer connections, default 5000 */
    int io_timeout_ms;           /* no progress for this long = peer dead, default 10000 */
    int default_deadline_ms;     /* batches submitted with deadline 0, default 60000 */
    bool offline_ok;             /* start while Redis is down, publish when it answers;
                                    default true */
    xfer_node_event_fn on_event; /* optional */
    void *event_arg;
    /* engine data path (appended: the Python mirror follows this order) */
    int sockets_per_peer; /* 0 = the engine's default (4) */
    int progress_threads; /* 0 = engine default (1) */
    size_t chunk_bytes;   /* 0 = engine default (1 MiB) */
    int busy_poll_us;     /* 0 = off (or $XFER_BUSY_POLL_US) */
};

/* Fills defaults; call before setting fields. */
XFER_API void xfer_node_config_init(struct xfer_node_config *cfg);

/* Starts the engine, connects to Redis, publishes the node ("join") and
 * starts the registry thread. Strings of cfg are copied. Errors: -XFER_EINVAL
 * (bad config: reason logged), -XFER_EUNAVAIL (Redis down and !offline_ok),
 * -XFER_EAUTH, -XFER_ENOMEM, or the engine's code. */
XFER_API xfer_node *xfer_node_new(const struct xfer_node_config *cfg, int *err);
/* Unpublishes the node ("leave"; its keys expire by TTL if Redis is down),
 * stops the registry thread, frees the engine (cancelling its batches) and
 * every pool. Node batches must be freed before. Accepts NULL. */
XFER_API void xfer_node_free(xfer_node *n);
/* Reason of the calling thread's last failed node call; never NULL. */
XFER_API const char *xfer_node_last_error(const xfer_node *n);

XFER_API const char *xfer_node_id(const xfer_node *n);
XFER_API uint64_t xfer_node_incarnation(const xfer_node *n);
/* Borrowed handles, valid until xfer_node_free(). Use the engine for what
 * the node does not wrap (stats, adopt_memfd/adopt_cuda + region_publish). */
XFER_API xfer_engine *xfer_node_engine(xfer_node *n);
XFER_API xfer_registry *xfer_node_registry(xfer_node *n);

/* ---- regions ------------------------------------------------------------- */

/* xfer_region_register / xfer_region_alloc, then published (unless private). */
XFER_API int xfer_node_region_register(xfer_node *n, const char *name, void *ptr, size_t len,
                                       enum xfer_mem_kind kind, int device, unsigned access,
                                       xfer_region **out);
XFER_API int xfer_node_region_alloc(xfer_node *n, const char *name, size_t len, unsigned access,
                                    xfer_region **out);
/* (Re)publishes a region made with the engine API (or after
 * xfer_region_set_layout). Private names: no-op. */
XFER_API int xfer_node_region_publish(xfer_node *n, xfer_region *r);
/* Unpublishes ("region-"), then deregisters. A region that is a member of a
 * registered pool: -XFER_EBUSY. The wait for accesses in progress is bounded
 * (xfer_region_deregister). */
XFER_API int xfer_node_region_deregister(xfer_node *n, xfer_region *r);
/* The part of xfer_node_region_deregister that never waits: pool check,
 * unpublish, xfer_region_detach. The caller then calls
 * xfer_node_region_deregister(n, r), e.g. after dropping its own locks. */
XFER_API int xfer_node_region_detach(xfer_node *n, xfer_region *r);
XFER_API xfer_region *xfer_node_region_find(xfer_node *n, const char *name);

/* ---- names ----------------------------------------------------------------- */

struct xfer_node_addr {
    char node[XFER_NAME_MAX];
    char region[XFER_NAME_MAX];
    uint64_t off;  /* bytes, or the block index when is_block */
    bool is_block; /* "#block" form */
};

/* "node/region[+off]" or "node/region#block". 0 or -XFER_EINVAL with the
 * reason in why (why may be NULL). */
XFER_API int xfer_node_addr_parse(const char *s, struct xfer_node_addr *out, char *why,
                                  size_t why_len);
/* "4096", "0x1000", "4K", "1M", "2G" -> bytes. 0 or -XFER_EINVAL. */
XFER_API int xfer_node_parse_size(const char *s, uint64_t *out);

/* A remote region resolved for transfers. While held, its peer stays in the
 * engine (a "leave" or restart event removes it only after the last
 * xfer_node_unref). */
struct xfer_node_ref {
    xfer_peer *peer;            /* borrowed; valid while held */
    struct xfer_region_desc rd; /* zeroed when resolved without a region */
    char node[XFER_NAME_MAX];
    uint64_t incarnation; /* the peer process the descriptor belongs to */
};

/* Resolves node (and region, if not NULL) through the registry cache,
 * adds or refreshes the engine peer (a new incarnation replaces the old one:
 * the old process's region ids are refused from then on) and connects it if
 * needed, then checks the transport against require (0 = the node's
 * require): a peer that can only be reached by another transport is refused
 * with -XFER_ENOTSUP and the reason (e.g. "requires ipc: n2 is on another
 * host"). Errors: -XFER_ENOENT (unknown node/region, named), -XFER_EUNAVAIL
 * (not cached and Redis down), -XFER_ECONN (cannot connect), -XFER_EINVAL
 * (node is this node). On success the ref is held: xfer_node_unref() it. */
XFER_API int xfer_node_resolve(xfer_node *n, const char *node, const char *region, unsigned require,
                               struct xfer_node_ref *out);
XFER_API void xfer_node_unref(xfer_node *n, struct xfer_node_ref *ref);
/* After a transfer failed with -XFER_ECONN: true when Redis now has another
 * incarnation of ref's node (it restarted; resolve again). Reads Redis. */
XFER_API bool xfer_node_peer_restarted(xfer_node *n, const struct xfer_node_ref *ref);
/* Why peer p cannot be used under require (writes the reason; returns
 * -XFER_ENOTSUP), or 0 when its connection's transport is in require. */
XFER_API int xfer_node_transport_check(xfer_node *n, xfer_peer *p, unsigned require, char *why,
                                       size_t why_len);

/* Transport of the engine's connection to node (XFER_TRANSPORT_* bit), 0
 * when not connected. Never connects. */
XFER_API unsigned xfer_node_peer_transport(xfer_node *n, const char *node);

/* ---- named batches ---------------------------------------------------------- */

typedef struct xfer_node_batch xfer_node_batch;

XFER_API xfer_node_batch *xfer_node_batch_new(xfer_node *n, int *err);
/* Cancels and waits if in flight, releases held peers, frees. */
XFER_API void xfer_node_batch_free(xfer_node_batch *b);
/* Transports this batch's items must use (XFER_TRANSPORT_* mask; 0 = the
 * node's require). Before the first add. */
XFER_API int xfer_node_batch_require(xfer_node_batch *b, unsigned transports);
/* Appends one item: READ copies remote -> local, WRITE local -> remote.
 * remote is "node/region[+off]" (len bytes at byte local_off) or
 * "node/region#block" (len blocks; local_off is a block index too; both
 * regions need matching layouts). Resolves the name (may block on a cache
 * miss, see the top), checks access, bounds and the transport requirement.
 * Returns the item index or a negative code; the reason is in
 * xfer_node_last_error(). A remote on this node is refused (-XFER_EINVAL:
 * copy locally). */
XFER_API int xfer_node_batch_add(xfer_node_batch *b, enum xfer_op op, xfer_region *local,
                                 uint64_t local_off, const char *remote, uint64_t len);
XFER_API size_t xfer_node_batch_count(const xfer_node_batch *b);
/* Starts the batch (deadline_ms 0 = the node's default). Items are never
 * posted to another incarnation of a peer than the one they were resolved
 * against (its regions may reuse the old ids): names whose peer restarted
 * since they were added are resolved again first (pool blocks:
 * -XFER_ESTALE, add them again). Then the transport requirement is checked
 * again (-XFER_ENOTSUP with the reason). */
XFER_API int xfer_node_batch_submit(xfer_node_batch *b, int deadline_ms);
/* 0 when every item succeeded, -XFER_EINPROGRESS while running, else the
 * first failing item's code. Non-blocking; does no retry. */
XFER_API int xfer_node_batch_poll(xfer_node_batch *b);
/* Waits up to timeout_ms (-1 = until the deadline). Items that failed
 * because their peer restarted (-XFER_ECONN and a new incarnation in Redis)
 * or their region was re-registered (-XFER_ESTALE) are re-resolved and run
 * once more within the deadline. Same result codes as poll. */
XFER_API int xfer_node_batch_wait(xfer_node_batch *b, int timeout_ms);
XFER_API int xfer_node_batch_cancel(xfer_node_batch *b);
/* Status of item i (0, -XFER_EINPROGRESS or an error) and its reason
 * (valid until the next call on b). */
XFER_API int xfer_node_batch_item_status(const xfer_node_batch *b, size_t i);
XFER_API const char *xfer_node_batch_item_error(const xfer_node_batch *b, size_t i);
/* The XFER_TRANSPORT_* bit the item's bytes moved over (0 for a local copy
 * or an item that never started). */
XFER_API unsigned xfer_node_batch_item_transport(const xfer_node_batch *b, size_t i);
/* Segments of item i: 1 for an item added by address, the number of block
 * runs for a pool item (a vectored item, xfer_batch_add_segments; over ipc
 * a block item, xfer_batch_add_block_item, which moves each block of a run
 * as its own piece); 0 for no such item. */
XFER_API size_t xfer_node_batch_item_segments(const xfer_node_batch *b, size_t i);
/* Clears items and releases their peers so b can be filled again. */
XFER_API int xfer_node_batch_reset(xfer_node_batch *b);

/* ---- notifications by node name (engine/xfer.h has the rules) ------------------ */

/* Binds msg (<= XFER_NOTIFY_MAX bytes, copied) for node to b: sent after
 * every item of b addressed to node has ended, naming failed ones (items
 * run again by xfer_node_batch_wait's retry are not covered: the
 * notification went with the first run). One per node per batch; before
 * submit. Resolves node like an item. */
XFER_API int xfer_node_batch_notify(xfer_node_batch *b, const char *node, const void *msg,
                                    size_t len);
/* 0 (queued at node), -XFER_EINPROGRESS, an error, -XFER_ENOENT (none). */
XFER_API int xfer_node_batch_notify_status(const xfer_node_batch *b, const char *node);
/* Standalone: sends msg to node now and waits for its acknowledgement
 * (deadline_ms, 0 = engine default). Received notifications are the
 * engine's queue: xfer_notif_poll(xfer_node_engine(n), ...) and
 * xfer_notif_fd(). */
XFER_API int xfer_node_notify(xfer_node *n, const char *node, const void *msg, size_t len,
                              int deadline_ms);

/* ---- KV pools ------------------------------------------------------------- */

/* Where block b of layer l (and half h: 0 = K, 1 = V) lives, with B =
 * block_bytes, N = num_blocks, L = layers, kv = 2 (K/V) or 1 (one tensor):
 *   BLOCK_MAJOR  1 region  [N][L][kv][B]          off (b*L + l)*kv*B + h*B
 *   VLLM_FA      L regions [kv][N][B] (vLLM FlashAttention [2,N,bs,heads,dim])
 *                                                 region l, off h*N*B + b*B
 *   FLASHINFER   L regions [N][kv][B] (FlashInfer [N,2,bs,heads,dim])
 *                                                 region l, off b*kv*B + h*B
 *   SGLANG       kv*L regions K0,V0,K1,V1,... [N][B] (per-layer K and V
 *                buffers [tokens,heads,dim] addressed by page)
 *                                                 region l*kv + h, off b*B
 *   MLA          L regions [N][B], kv = 1 (one latent buffer per layer)
 *                                                 region l, off b*B
 * B is one block of one layer and one half: block_tokens * kv_heads *
 * head_dim * dtype size (for MLA: block_tokens * latent dim * dtype size). */
enum xfer_kv_layout {
    XFER_KV_BLOCK_MAJOR = 0,
    XFER_KV_VLLM_FA = 1,
    XFER_KV_FLASHINFER = 2,
    XFER_KV_SGLANG = 3,
    XFER_KV_MLA = 4,
};
/* "block_major", "vllm_fa", "flashinfer", "sglang", "mla" <-> enum. */
XFER_API const char *xfer_kv_layout_name(enum xfer_kv_layout l);
XFER_API int xfer_kv_layout_parse(const char *s, enum xfer_kv_layout *out);

struct xfer_kv_geom {
    enum xfer_kv_layout layout;
    char dtype[XFER_DTYPE_MAX]; /* e.g. "bf16" */
    uint64_t block_bytes;       /* B above */
    uint64_t num_blocks;        /* N */
    uint32_t layers;            /* L */
    uint32_t kv;                /* 2 = K and V halves, 1 = one tensor */
    uint32_t block_tokens;      /* tokens per block (0 = not given) */
    uint32_t kv_heads;          /* heads held by this pool (0 = not given) */
    uint32_t head_dim;          /* (0 = not given) */
    uint32_t shard_rank;        /* head sharding: this pool is shard */
    uint32_t shard_count;       /*   shard_rank of shard_count (1 = unsharded) */
    char tag[XFER_TAG_MAX];     /* e.g. model id */
};

/* Regions a pool of this geometry has (1, L or kv*L), 0 for a bad geometry. */
XFER_API size_t xfer_kv_geom_regions(const struct xfer_kv_geom *g);
/* "LAYOUT:DTYPE:BLOCK_BYTES:NUM_BLOCKS:LAYERS[:KV[:TAG]]" (sizes take K/M/G;
 * KV defaults to 2, 1 for mla; unsharded) -> checked geometry. 0, or
 * -XFER_EINVAL with the reason in why (why may be NULL). */
XFER_API int xfer_kv_geom_parse(const char *spec, struct xfer_kv_geom *out, char *why,
                                size_t why_len);
/* 0, or -XFER_EINVAL with why naming the bad field (why may be NULL). */
XFER_API int xfer_kv_geom_check(const struct xfer_kv_geom *g, char *why, size_t why_len);
/* Bytes each member region must hold (all members are alike), 0 for a bad
 * geometry or one whose size overflows. */
XFER_API uint64_t xfer_kv_geom_region_bytes(const struct xfer_kv_geom *g);
/* 0 when blocks of a and b can be copied onto each other (layouts may
 * differ: a vLLM pool may feed a FlashInfer one). Else -XFER_EMISMATCH and
 * why = "<field>: <a> vs <b>", field one of dtype, block_bytes, layers, kv,
 * block_tokens, kv_heads, head_dim, shard, tag (block counts may differ). */
XFER_API int xfer_kv_geom_match(const struct xfer_kv_geom *a, const struct xfer_kv_geom *b,
                                char *why, size_t why_len);

typedef struct xfer_kv_pool xfer_kv_pool;

/* Registers a pool over already registered regions (in the order above; each
 * at least as long as the layout needs) and publishes it:
 *   xfer:pools:{<node>}          set   pool names                    (TTL)
 *   xfer:pool:{<node>}:<name>    hash  layout dtype block_bytes num_blocks
 *                                      layers kv block_tokens kv_heads
 *                                      head_dim shard tag regions     (TTL)
 * (regions = the member region names, comma-separated). The regions are
 * published too. Errors: -XFER_EINVAL (geometry, count; reason names it),
 * -XFER_ERANGE (a region too short), -XFER_EEXIST. */
XFER_API int xfer_node_pool_register(xfer_node *n, const char *name, const struct xfer_kv_geom *g,
                                     xfer_region *const *regions, size_t nregions,
                                     xfer_kv_pool **out);
/* Unpublishes and forgets the pool (its regions stay registered). */
XFER_API int xfer_node_pool_deregister(xfer_node *n, xfer_kv_pool *p);
XFER_API xfer_kv_pool *xfer_node_pool_find(xfer_node *n, const char *name);
XFER_API void xfer_kv_pool_geom(const xfer_kv_pool *p, struct xfer_kv_geom *out);

/* A pool as published (own or remote): geometry and member names. */
struct xfer_kv_pool_desc {
    char node[XFER_NAME_MAX];
    char name[XFER_NAME_MAX];
    struct xfer_kv_geom geom;
    size_t nregions;
    char (*regions)[XFER_NAME_MAX]; /* malloc'ed; xfer_kv_pool_desc_clear() */
};
XFER_API void xfer_kv_pool_desc_clear(struct xfer_kv_pool_desc *d);
/* Reads a pool of any node from Redis. -XFER_ENOENT naming what is unknown. */
XFER_API int xfer_node_pool_lookup(xfer_node *n, const char *node, const char *pool,
                                   struct xfer_kv_pool_desc *out);
/* Pools of node, sorted by name; *out malloc'ed (free each with
 * xfer_kv_pool_desc_clear, then free(*out)). */
XFER_API int xfer_node_pool_list(xfer_node *n, const char *node, struct xfer_kv_pool_desc **out,
                                 size_t *count);

/* Appends the moves of blocks local_blocks[i] <-> remote_blocks[i] (i < nb)
 * between local pool p and remote pool "node/pool", over layers
 * [first_layer, first_layer + nlayers) (nlayers 0 = all). READ: remote ->
 * local; WRITE: local -> remote. Checks before anything is appended:
 * geometry (-XFER_EMISMATCH naming the field), block ids against both
 * num_blocks and layer range (-XFER_ERANGE naming the block), access,
 * transport requirement. Each pair of member regions (a layer's tensor, or
 * its K or V buffer, here and there) becomes ONE vectored item whose
 * segments are the blocks, runs consecutive on both sides merged into one
 * segment (xfer_node_batch_item_segments); no allocation per block. One
 * status per item: a block the owner refuses fails its item, and the
 * item's reason names that block. The remote pool's members are resolved on
 * first use and cached until an event invalidates them. Returns the number
 * of items appended or a negative code with nothing appended. */
XFER_API int xfer_node_batch_add_blocks(xfer_node_batch *b, enum xfer_op op, xfer_kv_pool *p,
                                        const uint64_t *local_blocks, const char *remote_pool,
                                        const uint64_t *remote_blocks, size_t nb,
                                        uint32_t first_layer, uint32_t nlayers);

/* ---- leases on this node's pool blocks ------------------------------------- */

/* In pull-with-release handoffs the owner frees blocks after a timeout; a
 * late reader must not read them once they are reused. A lease grants one
 * peer node access to blocks of a pool (all layers and halves) until a
 * deadline, renewable. Blocks under any lease are guarded: at this node
 * (the owner), every tcp, tcpx and ipc access to them by a peer without a
 * live lease on them is refused with -XFER_ESTALE, and the initiator's item
 * error names the refused blocks ("blocks 17-18 of n1/kv (layer 2, V):
 * ..."). Blocks stay guarded after their lease ended, was released or freed
 * (they then refuse everyone until granted again), until the pool is
 * deregistered. Blocks never leased are open as before. Not enforced over
 * rdma (one-sided; docs/node.md says how it would be). An access the owner
 * admitted before the end finishes (one tcp chunk, one ipc group). None of
 * these calls does I/O or waits. */
typedef struct xfer_kv_lease xfer_kv_lease;
/* Grants peer_node blocks[0..nb) of own pool p for ttl_ms. -XFER_ERANGE
 * (a block past num_blocks), -XFER_EINVAL. */
XFER_API int xfer_node_lease_grant(xfer_node *n, xfer_kv_pool *p, const char *peer_node,
                                   const uint64_t *blocks, size_t nb, int ttl_ms,
                                   xfer_kv_lease **out);
/* Adds blocks to a live lease (same deadline). */
XFER_API int xfer_node_lease_add(xfer_kv_lease *l, const uint64_t *blocks, size_t nb);
/* Deadline = now + ttl_ms. -XFER_ESTALE once the lease ended (expired or
 * released whole): an ended lease never comes back. */
XFER_API int xfer_node_lease_renew(xfer_kv_lease *l, int ttl_ms);
/* Releases blocks[0..nb) of the lease (refused from this call on); blocks
 * NULL: the whole lease ends now. */
XFER_API int xfer_node_lease_release(xfer_kv_lease *l, const uint64_t *blocks, size_t nb);
XFER_API bool xfer_node_lease_live(const xfer_kv_lease *l);
/* Ends the lease (if live) and frees it; before its pool is deregistered
 * (which is refused with -XFER_EBUSY while leases exist) and its node freed. */
XFER_API void xfer_node_lease_free(xfer_kv_lease *l);

#ifdef __cplusplus
}
#endif
#endif /* XFER_NODE_H */
