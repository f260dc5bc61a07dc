/* Registry internals shared by the registry sources (not installed). */
#ifndef XFER_REG_INTERNAL_H
#define XFER_REG_INTERNAL_H

#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>

#include "cluster.h"
#include "strmap.h"
#include "xfer_registry.h"

#define REG_NODES_KEY   "xfer:nodes"
#define REG_EVENTS_CHAN "xfer:events"
#define REG_KEY_MAX     (XFER_NAME_MAX * 2 + 32)
#define REG_ERR_MAX     512
#define REG_PIPE_CHUNK  256 /* regions per pipelined round trip */
#define REG_SHARDS      16  /* cluster mode: membership zsets xfer:nodes:{sNN} */

/* A region this handle publishes (value of own_regions; desc first, so a
 * pointer to it is a pointer to the descriptor). */
struct reg_own_region {
    struct xfer_region_desc desc;
    bool announced; /* written once with its "region+" */
};

struct reg_cached_region {
    struct xfer_region_desc desc;
    uint64_t fetched_ms;
    bool stale;
};

struct reg_cached_node {
    struct xfer_node_desc desc;
    uint64_t fetched_ms;
    bool stale;
    struct strmap regions; /* name -> struct reg_cached_region * */
};

/* What hiredis asked the internal poll() adapter to wait for. */
struct reg_adstate {
    bool want_read, want_write;
};

/* Subscriber to +switch-master on one sentinel (sentinel mode only). */
struct reg_swatch {
    redisAsyncContext *ac;
    struct reg_adstate ad;
    bool subscribed;
    int idx;              /* which sentinel of the URL */
    uint64_t deadline_ms; /* SUBSCRIBE must be confirmed by then */
    uint64_t next_ms;     /* next (re)connect attempt */
    int backoff_ms;
};

struct xfer_registry {
    struct xfer_registry_config cfg;
    char *url_text;      /* cfg.url copy */
    char url_shown[640]; /* URL without the password, for messages */
    struct xfer_redis_url url;
    int wake_fd; /* eventfd: wakes xfer_registry_poll (thread stop) */

    /* Command connection and publisher state, under cmd_lock. */
    pthread_mutex_t cmd_lock;
    redisContext *ctx;                 /* NULL while down */
    char prim_host[XFER_REG_HOST_MAX]; /* where ctx points: the URL's host, or */
    int prim_port;                     /* the primary the sentinels named (0: none yet) */
    int sentinel_first;                /* sentinel that answered last: asked first */
    bool demoted;           /* sentinel mode: a -READONLY reply or +switch-master: reconnect */
    atomic_uint prim_epoch; /* bumped when the primary's address changes */
    /* Cluster mode: the router, the batch being built, replies being handed
     * out; ctx is then &cl_marker while the cluster is reachable. */
    struct rcl *cl;
    struct rcl_batch batch;
    redisReply **held;
    size_t held_n, held_pos, held_cap;
    redisContext cl_marker;
    unsigned reap_shard;
    unsigned watch_node;
    uint64_t next_connect_ms;
    int backoff_ms;
    atomic_bool connected;
    atomic_uint cmd_failures;   /* bumped by reg_conn_fail; the watcher resubscribes on change */
    _Atomic uint64_t outage_ms; /* reg_now_ms() of the last reg_conn_fail, or of the
                                   reconnect after it (0: none yet) */
    bool need_republish;
    bool purge_pending; /* first publish: delete regions of an old incarnation */
    bool own_valid;
    struct xfer_node_desc own;
    struct strmap own_regions; /* name -> struct reg_own_region * */
    struct strmap own_pools;   /* name -> struct reg_pool * (pools.c) */
    uint64_t next_heartbeat_ms, next_reap_ms;

    /* Cache, under cache_lock (taken after cmd_lock, never before). */
    pthread_mutex_t cache_lock;
    struct strmap cache; /* node id -> struct reg_cached_node * */

    pthread_mutex_t cb_lock;
    xfer_registry_event_fn event_fn;
    void *event_arg;

    /* Watcher: touched by the driver thread only. */
    bool watch_on;
    xfer_registry_attach_fn attach_fn;
    void *attach_arg;
    redisAsyncContext *wac;
    atomic_bool subscribed;
    unsigned watch_fail_mark; /* cmd_failures when the watcher subscribed */
    unsigned watch_epoch;     /* prim_epoch when the watcher connected */
    bool wac_connected;
    struct reg_adstate ad; /* internal adapter state of wac */
    struct reg_swatch swatch;
    uint64_t watch_deadline_ms; /* connect + subscribe must finish by then */
    uint64_t watch_next_ms;     /* next (re)connect attempt */
    int watch_backoff_ms;
    int events_delivered;

    /* Own thread. */
    pthread_t thread;
    bool thread_on;
    atomic_bool thread_stop;
};

/* ---- util (registry.c) ---- */
uint64_t reg_now_ms(void);  /* monotonic: intervals and schedules */
uint64_t reg_wall_ms(void); /* wall clock: published timestamps only */
/* Records the calling thread's last error and returns err (negative). */
int reg_set_err(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void reg_key_node(char *buf, const char *node);
void reg_key_regions(char *buf, const char *node);
void reg_key_region(char *buf, const char *node, const char *name);
/* Membership key of a node: xfer:nodes, or in cluster mode its shard
 * xfer:nodes:{sNN} (NN = CRC16(node) mod REG_SHARDS). */
void reg_key_members(const xfer_registry *r, char *buf, const char *node);
void reg_key_shard(char *buf, unsigned shard);
void reg_emit(xfer_registry *r, const struct xfer_registry_event *ev);

/* ---- connection (conn.c), cmd_lock held ---- */
/* Opens a blocking connection with timeouts, AUTH and SELECT done. NULL with
 * the error recorded (-XFER_EUNAVAIL / -XFER_EAUTH) in *err. */
redisContext *reg_redis_connect(xfer_registry *r, int *err);
/* AUTH and SELECT as the URL says; who names the server in messages. */
int reg_redis_login(const struct xfer_redis_url *u, const char *who, redisContext *c);
/* Same to host:port (unix socket when port is 0). */
redisContext *reg_redis_connect_to(const xfer_registry *r, const char *host, int port, int *err);
/* Connects if down and due (else fails fast), republishes when needed. */
int reg_conn_ensure(xfer_registry *r);
/* Drops a broken connection, schedules the reconnect; returns -XFER_EUNAVAIL. */
int reg_conn_fail(xfer_registry *r, const char *what);
/* Appends a command to the pipeline (cluster mode: to the batch that the
 * next reg_read_replies sends, routed by slot). */
void reg_append(xfer_registry *r, int argc, const char **argv, const size_t *lens);
/* One command (connecting first if needed); *out is the reply to free. */
int reg_cmd(xfer_registry *r, redisReply **out, int argc, const char **argv, const size_t *lens);
/* Reads n pipelined replies into out[0..n) (caller frees them), or frees
 * them when out is NULL. 0 or -XFER_EUNAVAIL (nothing left to free). */
int reg_read_replies(xfer_registry *r, size_t n, redisReply **out);
/* Reads n pipelined PEXPIRE replies; sets *gone when one key was missing
 * (the heartbeat then republishes). */
int reg_read_pexpire_replies(xfer_registry *r, size_t n, bool *gone);
/* Notes a -READONLY reply in sentinel mode (r->demoted: reconnect soon). */
void reg_reply_note(xfer_registry *r, const redisReply *rep);
/* "ERR ..." reply -> -XFER_EPROTO with its text recorded; else 0. */
int reg_reply_check(const redisReply *rep, const char *what);
/* True while a node's keys missing from Redis may be an outage's doing, not
 * the node's: within ttl_ms + backoff_max_ms of this handle's last command
 * failure or the reconnect after it (a failover longer than a TTL, or a
 * restart, loses keys that their live owners write again at their next
 * heartbeat or reconnect). */
bool reg_outage_recent(xfer_registry *r);
/* Next backoff delay after a failure (doubling, bounded, jittered). */
int reg_backoff_next(const xfer_registry *r, int *backoff_ms);

/* ---- sentinel (sentinel.c) ---- */
/* Asks the sentinels for the primary and connects there (checking ROLE);
 * fills r->prim_host/prim_port. NULL with *err like reg_redis_connect. */
redisContext *reg_sentinel_connect(xfer_registry *r, int *err);
/* Watcher side: keeps a +switch-master subscription on one sentinel. */
void reg_swatch_tick(xfer_registry *r, uint64_t now, uint64_t *due);
void reg_swatch_stop(xfer_registry *r);
/* Internal adapter helpers shared by both subscribers (watch.c). */
int reg_ad_attach(struct reg_adstate *ad, redisAsyncContext *ac);
void reg_ad_pollfd(const redisAsyncContext *ac, const struct reg_adstate *ad, struct pollfd *p);

/* ---- rows (rows.c) ---- */
struct reg_args {
    int argc;
    const char *argv[48];
    size_t len[48];
    char buf[4096];
    size_t used;
};
void reg_args_reset(struct reg_args *a);
void reg_args_add(struct reg_args *a, const char *s);
void reg_args_addf(struct reg_args *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends "field value ..." of a node / region hash. */
void reg_args_node_fields(struct reg_args *a, const struct xfer_node_desc *n);
void reg_args_region_fields(struct reg_args *a, const struct xfer_region_desc *d, uint64_t now);
/* HGETALL reply -> struct. -XFER_ENOENT for an empty reply (no key),
 * -XFER_EPROTO for a malformed row (reason recorded in last error). */
int reg_parse_node(const redisReply *rep, const char *node_id, struct xfer_node_desc *out);
int reg_parse_region(const redisReply *rep, const char *node_id, const char *name,
                     struct xfer_region_desc *out);
/* Checks a descriptor before publishing: 0 or -XFER_EINVAL (recorded). */
int reg_check_node(const struct xfer_node_desc *n);
int reg_check_region(const struct xfer_region_desc *d);

/* ---- publisher (publish.c), cmd_lock held ---- */
int reg_republish_locked(xfer_registry *r);
int reg_heartbeat_locked(xfer_registry *r);
int reg_reap_locked(xfer_registry *r);

/* ---- pools (pools.c), cmd_lock held ---- */
int reg_pools_republish_locked(xfer_registry *r);
/* PEXPIRE of the pool keys; *gone when one was missing. */
int reg_pools_beat_locked(xfer_registry *r, const char *ttl, bool *gone);
/* Deletes every own pool's keys (node leaving). */
int reg_pools_delete_all_locked(xfer_registry *r);
/* Deletes pool keys a previous incarnation of node id left. */
int reg_pools_purge_locked(xfer_registry *r, const char *id);
void reg_pools_clear(xfer_registry *r);

/* ---- cache (cache.c) ---- */
void reg_cache_free(xfer_registry *r);
void reg_cache_mark_all_stale(xfer_registry *r);
void reg_cache_mark_node_stale(xfer_registry *r, const char *node, bool *was_cached);
void reg_cache_drop_node(xfer_registry *r, const char *node);
void reg_cache_drop_region(xfer_registry *r, const char *node, const char *name);
/* Caches a node read from Redis (emits RESTARTED on a new incarnation). */
void reg_cache_store_node(xfer_registry *r, const struct xfer_node_desc *d);
/* Caches regions of a node if the cached node has incarnation inc. */
void reg_cache_store_regions(xfer_registry *r, const char *node, uint64_t inc,
                             const struct xfer_region_desc *v, size_t n);

/* ---- watcher (watch.c), driver thread ---- */
void reg_watch_tick(xfer_registry *r, uint64_t now, uint64_t *next_due);
void reg_watch_stop(xfer_registry *r);
/* Internal adapter: fills a pollfd for the subscriber; false when none. */
/* Fills up to 2 pollfds (events subscriber, sentinel subscriber); returns
 * how many. */
int reg_watch_pollfds(xfer_registry *r, struct pollfd *p);
void reg_watch_handle(xfer_registry *r, const struct pollfd *p, int n);

#endif
