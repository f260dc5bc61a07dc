/*
 * xfer registry — nodes and regions in Redis (the one public header of registry/).
 *
 * Schema (docs/registry.md has the redis-cli view):
 *   xfer:nodes                   zset  node id -> last heartbeat (unix ms)
 *   xfer:node:{<node>}           hash  host addr ctrl_port data_port transports gpus
 *                                      nics host_id pid version started_ms
 *                                      heartbeat_ms incarnation            (TTL)
 *   xfer:regions:{<node>}        set   region names                         (TTL)
 *   xfer:region:{<node>}:<name>  hash  id gen kind device addr len access rkeys
 *                                      ipc created_ms dtype block_bytes
 *                                      num_blocks layers tag                (TTL)
 *   xfer:pools:{<node>}          set   pool names                           (TTL)
 *   xfer:pool:{<node>}:<name>    hash  fields given by the node layer       (TTL)
 *   channel xfer:events                "join <node>", "leave <node>",
 *                                      "region+ <node> <name>", "region- <node> <name>",
 *                                      "pool+ <node> <name>", "pool- <node> <name>"
 * Every key of a node carries the node TTL and is refreshed by the heartbeat,
 * so a crashed node leaves nothing behind once its TTL runs out. On Redis
 * Cluster (redis-cluster:// URL) xfer:nodes is split into 16 shards
 * xfer:nodes:{s00}..{s15} (shard = CRC16(node id) mod 16); with Sentinel
 * (redis-sentinel://) the handle follows the primary through failovers and
 * republishes there.
 *
 * One handle plays three roles:
 *  - publisher: the node this process owns and its regions. The registry keeps
 *    a copy of everything published, and republishes it all by itself after a
 *    reconnect or when it finds its keys gone (restarted/flushed Redis).
 *  - reader: lookups answered from a local cache of nodes and regions, filled
 *    from Redis on a miss and invalidated by xfer:events. While Redis is
 *    unreachable, cached entries keep being served.
 *  - watcher: a SUBSCRIBE connection (hiredis async) delivering events.
 *
 * Threads: every function is thread-safe, except that the "driver" functions
 * (xfer_registry_tick, xfer_registry_poll, and the event loop that runs an
 * attached watcher) must all be called from one thread — the loop thread, or
 * the registry's own thread after xfer_registry_thread_start(); with an
 * attached watcher, xfer_registry_free() too (the event base must outlive the
 * handle). Event callbacks run with no registry lock held, so they may call
 * any lookup function: on the driver thread for xfer:events, or on the thread
 * of a lookup that found a node's incarnation changed (RESTARTED).
 *
 * Errors: actions return 0 or a negative XFER_E* code; Redis unreachable is
 * -XFER_EUNAVAIL (fails at once while a reconnect is backing off), unknown
 * node/region is -XFER_ENOENT. The reason is in xfer_registry_last_error().
 *
 * Hooking the watcher into libevent (service side, a few lines):
 *
 *   #include <hiredis/adapters/libevent.h>
 *   static int attach(struct redisAsyncContext *ac, void *base)
 *   { return redisLibeventAttach(ac, base) == REDIS_OK ? 0 : -XFER_EIO; }
 *   ...
 *   xfer_registry_watch(reg, attach, base);
 *   // and a libevent timer that calls xfer_registry_tick(reg) and re-arms
 *   // itself after the number of ms it returns (heartbeat, reconnects).
 *
 * Without an event loop: xfer_registry_watch(reg, NULL, NULL) then call
 * xfer_registry_poll(reg, timeout_ms) in a loop, or xfer_registry_thread_start().
 */
#ifndef XFER_REGISTRY_H
#define XFER_REGISTRY_H

#include "xfer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Everything declared here is libxfer's public API: exported although the
 * library is built with -fvisibility=hidden. */
#pragma GCC visibility push(default)

struct redisAsyncContext; /* hiredis; only a pointer crosses this header */

#define XFER_REG_HOST_MAX    256 /* hostname incl. NUL */
#define XFER_REG_VERSION_MAX 32

/* ---- Redis URL --------------------------------------------------------- */
/* redis://[user:password@]host[:port][/db]   (user may be empty: ":pw@")
 * unix:///path/to/redis.sock[?db=N]
 * redis-sentinel://[user:password@]host[:port][,host[:port]...]/MASTER[/db]
 *     sentinels (default port 26379) asked for the primary of MASTER; the
 *     credentials are for the primary (sentinels get them only if they
 *     answer NOAUTH)
 * redis-cluster://[user:password@]host[:port][,host[:port]...]
 *     seed nodes of a Redis Cluster (default port 6379; database 0 only)
 * IPv6 hosts in brackets: redis://[::1]:6379. %XX escapes are decoded in user
 * and password. Default port 6379, db 0. */
enum xfer_redis_mode { XFER_REDIS_SINGLE = 0, XFER_REDIS_SENTINEL, XFER_REDIS_CLUSTER };
#define XFER_REDIS_MAX_SEEDS  16
#define XFER_REDIS_MASTER_MAX 128
struct xfer_redis_hostport {
    char host[XFER_REG_HOST_MAX];
    int port;
};
struct xfer_redis_url {
    enum xfer_redis_mode mode;
    bool is_unix;
    char host[XFER_REG_HOST_MAX]; /* host name/address, or socket path
                                     (sentinel/cluster: the first seed) */
    int port;
    int db;
    char user[128];     /* empty: no user (AUTH password only, or no AUTH) */
    char password[256]; /* empty: no AUTH */
    int n_seeds;        /* sentinel/cluster: sentinels / seed nodes */
    struct xfer_redis_hostport seeds[XFER_REDIS_MAX_SEEDS];
    char master[XFER_REDIS_MASTER_MAX]; /* sentinel: the monitored master's name */
};

/* 0 or -XFER_EINVAL with the reason written to err (if errlen > 0). */
int xfer_redis_url_parse(const char *url, struct xfer_redis_url *out, char *err, size_t errlen);

/* ---- descriptors -------------------------------------------------------- */

/* A node as published: the engine's peer descriptor plus service fields. */
struct xfer_node_desc {
    struct xfer_peer_desc peer;   /* node_id, addr, data_port, host_id,
                                     transports, incarnation, nics */
    char host[XFER_REG_HOST_MAX]; /* hostname, for humans */
    uint16_t ctrl_port;           /* xferd control port, 0 = none */
    char gpus[XFER_BLOB_MAX];     /* "idx:uuid:pci,..." ("" = none) */
    uint32_t pid;
    char version[XFER_REG_VERSION_MAX];
    uint64_t started_ms;   /* unix ms; 0 at publish = now */
    uint64_t heartbeat_ms; /* unix ms of the last heartbeat (set by the registry) */
};

/* Node ids and region names: 1..XFER_NAME_MAX-1 printable ASCII characters,
 * no space, no '{' or '}' (they delimit the Redis Cluster hash tag). */
bool xfer_registry_name_ok(const char *name);

/* ---- handle ------------------------------------------------------------ */
typedef struct xfer_registry xfer_registry;

struct xfer_registry_config {
    const char *url;      /* NULL: $XFER_REDIS_URL, else redis://127.0.0.1:6379 */
    int timeout_ms;       /* connect and per-command timeout, default 2000 */
    int ttl_ms;           /* TTL of this node's keys, default 10000 */
    int heartbeat_ms;     /* default ttl_ms / 3 */
    int reap_ms;          /* how often expired nodes are looked for (to
                             publish their "leave"), default 1000; <0 = never */
    int backoff_min_ms;   /* first reconnect delay, default 100 */
    int backoff_max_ms;   /* reconnect delays double up to this, default 2000 */
    int cache_max_age_ms; /* while no watcher is subscribed, cached entries
                             older than this are re-read from Redis (and
                             still served if Redis is down); default 1000 */
    bool start_offline;   /* new() succeeds when Redis is down and connects
                             later (from tick/poll or any call) */
};

/* Fills defaults; call before setting fields. */
void xfer_registry_config_init(struct xfer_registry_config *cfg);

/* Parses the URL and connects (AUTH, SELECT). Returns NULL with *err set:
 * -XFER_EINVAL (bad URL/config), -XFER_EUNAVAIL (unreachable, unless
 * start_offline), -XFER_EAUTH (AUTH refused), -XFER_ENOMEM. A reason is
 * logged with xfer_err(). Strings of cfg are copied. */
xfer_registry *xfer_registry_new(const struct xfer_registry_config *cfg, int *err);
/* Stops the thread and watcher, closes connections, frees the cache. Does
 * NOT remove published keys (call xfer_registry_unpublish_node first for a
 * clean leave; otherwise they expire by TTL). Accepts NULL. */
void xfer_registry_free(xfer_registry *r);

/* Reason of the last failed registry call made by the calling thread;
 * valid until that thread's next registry call. Never NULL. */
const char *xfer_registry_last_error(const xfer_registry *r);
/* True while the command connection to Redis is up. */
bool xfer_registry_connected(const xfer_registry *r);

/* ---- publisher (this process's node) ------------------------------------ */

/* Publishes (or re-publishes, replacing all fields) the node owned by this
 * handle in one MULTI/EXEC, and publishes "join". A handle owns at most one
 * node: a different node_id than before gives -XFER_EINVAL. peer.incarnation
 * 0 = a fresh random value is chosen (read it back with own_node). On
 * -XFER_EUNAVAIL the node is still recorded and published on reconnect. */
int xfer_registry_publish_node(xfer_registry *r, const struct xfer_node_desc *node);
/* Copy of the node as last published (with incarnation, times filled in).
 * -XFER_ENOENT when none. */
int xfer_registry_own_node(xfer_registry *r, struct xfer_node_desc *out);

/* Publishes n regions of the own node (after publish_node, else
 * -XFER_EINVAL): each region in its own MULTI/EXEC (hash, set member, TTLs,
 * "region+"), all pipelined. A region of an existing name is replaced. Like
 * publish_node, regions are recorded even when Redis is unreachable. */
int xfer_registry_publish_regions(xfer_registry *r, const struct xfer_region_desc *d, size_t n);
static inline int xfer_registry_publish_region(xfer_registry *r, const struct xfer_region_desc *d)
{
    return xfer_registry_publish_regions(r, d, 1);
}
/* Removes one own region (hash, set member) and publishes "region-".
 * -XFER_ENOENT if this handle never published it. */
int xfer_registry_unpublish_region(xfer_registry *r, const char *name);
/* Removes every key of the own node, ZREMs it, publishes "leave" and forgets
 * the publisher state. -XFER_ENOENT if no node was published. */
int xfer_registry_unpublish_node(xfer_registry *r);

/* Refreshes TTLs, heartbeat_ms and the zset score now (tick does this every
 * heartbeat_ms). Republishes everything if the node's keys are gone. */
int xfer_registry_heartbeat(xfer_registry *r);

/* ---- reader --------------------------------------------------------------- */

/* Node by id: from the cache, else HGETALL (then cached). -XFER_ENOENT when
 * the node is not in Redis (message names it); -XFER_EUNAVAIL when it is not
 * cached and Redis is unreachable. */
int xfer_registry_lookup_node(xfer_registry *r, const char *node_id, struct xfer_node_desc *out);
/* Region of a node by name, same rules (region and node both unknown:
 * -XFER_ENOENT naming which one). */
int xfer_registry_lookup_region(xfer_registry *r, const char *node_id, const char *name,
                                struct xfer_region_desc *out);
/* Always reads Redis (bypasses but refreshes the cache). */
int xfer_registry_fetch_node(xfer_registry *r, const char *node_id, struct xfer_node_desc *out);

/* Live nodes: members of xfer:nodes whose hash still exists, sorted by id;
 * malformed rows are skipped with a warning. *out is malloc'ed (free() it,
 * NULL when *n == 0). Refreshes the cache. */
int xfer_registry_list_nodes(xfer_registry *r, struct xfer_node_desc **out, size_t *n);
/* Regions of a node, sorted by name; -XFER_ENOENT if the node is unknown. */
int xfer_registry_list_regions(xfer_registry *r, const char *node_id, struct xfer_region_desc **out,
                               size_t *n);

/* Drops everything cached (next lookups read Redis). */
void xfer_registry_cache_clear(xfer_registry *r);

/* ---- pools --------------------------------------------------------------------
 * A pool (node/xfer_node.h: a KV cache spanning many regions) is one hash of
 * string fields per pool of the own node, kept, refreshed, republished and
 * removed with the node like its regions. Field names and values are opaque
 * to the registry. Pools are not cached: lookups read Redis. */
struct xfer_registry_field {
    const char *name;
    const char *value;
};
typedef void (*xfer_registry_field_fn)(const char *field, const char *value, void *arg);

/* Publishes (replacing) pool name of the own node with fields f[0..n) and
 * "pool+". Recorded even when Redis is down (-XFER_EUNAVAIL). */
int xfer_registry_publish_pool(xfer_registry *r, const char *name,
                               const struct xfer_registry_field *f, size_t n);
/* Removes an own pool and publishes "pool-"; -XFER_ENOENT if never published. */
int xfer_registry_unpublish_pool(xfer_registry *r, const char *name);
/* Calls fn for every field of pool node/name (read from Redis);
 * -XFER_ENOENT when there is no such pool. */
int xfer_registry_lookup_pool(xfer_registry *r, const char *node, const char *name,
                              xfer_registry_field_fn fn, void *arg);
/* Names of node's pools, sorted; *names malloc'ed (NULL when *n == 0). */
int xfer_registry_list_pools(xfer_registry *r, const char *node, char (**names)[XFER_NAME_MAX],
                             size_t *n);

/* ---- watcher and events ----------------------------------------------------- */
enum xfer_registry_event_type {
    XFER_REG_EV_JOIN = 1,   /* node (re)published */
    XFER_REG_EV_LEAVE,      /* node removed, or reaped after its TTL ran out */
    XFER_REG_EV_REGION_ADD, /* region+ */
    XFER_REG_EV_REGION_DEL, /* region- */
    XFER_REG_EV_RESTARTED,  /* a node's incarnation changed: its cached regions
                               were dropped; drop connections to it */
    XFER_REG_EV_RESYNC,     /* the watcher (re)subscribed: events may have been
                               missed, every cached entry was marked stale */
    XFER_REG_EV_POOL_ADD,   /* pool+ (region = the pool's name) */
    XFER_REG_EV_POOL_DEL,   /* pool- (region = the pool's name) */
};

struct xfer_registry_event {
    enum xfer_registry_event_type type;
    const char *node;         /* node id ("" for RESYNC) */
    const char *region;       /* region name for REGION_*, else NULL */
    uint64_t old_incarnation; /* RESTARTED: the cached one */
    uint64_t new_incarnation; /* RESTARTED: the one now in Redis */
};

/* Called after the cache has been updated (see "Threads" above); ev and its
 * strings are valid only during the call. */
typedef void (*xfer_registry_event_fn)(const struct xfer_registry_event *ev, void *arg);
/* Sets (or with NULL clears) the event callback. */
void xfer_registry_on_event(xfer_registry *r, xfer_registry_event_fn fn, void *arg);

/* Attaches a freshly connected hiredis async context to the caller's event
 * loop; return 0 or a negative XFER_E* code. Called again on every reconnect
 * (the previous context is gone by then; hiredis calls the adapter's cleanup). */
typedef int (*xfer_registry_attach_fn)(struct redisAsyncContext *ac, void *arg);

/* Starts watching xfer:events. attach = NULL: the registry drives the
 * subscriber itself from xfer_registry_poll (or its thread). Connection
 * loss is handled by tick/poll: reconnect with backoff, then RESYNC. */
int xfer_registry_watch(xfer_registry *r, xfer_registry_attach_fn attach, void *arg);
/* True while the watcher is subscribed. */
bool xfer_registry_watching(const xfer_registry *r);

/* Periodic work: heartbeat when due, reaping of expired nodes, reconnects of
 * both connections with backoff, republish after a reconnect. Cheap when
 * nothing is due. Returns ms until it wants to be called again (>= 1). */
int xfer_registry_tick(xfer_registry *r);

/* For callers without an event loop: waits up to timeout_ms for subscriber
 * traffic (internal watcher only), handles it (events, callbacks) and runs
 * tick. Returns the number of events delivered, or a negative code. */
int xfer_registry_poll(xfer_registry *r, int timeout_ms);

/* Runs watch(NULL) + poll + tick on a thread of the registry's own until
 * xfer_registry_thread_stop() or free. Callbacks then run on that thread. */
int xfer_registry_thread_start(xfer_registry *r);
void xfer_registry_thread_stop(xfer_registry *r);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif /* XFER_REGISTRY_H */
