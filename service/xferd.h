/*
 * State of one xferd process, shared by the service files.
 *
 * Threads: the libevent loop thread owns listeners and control connections
 * and does I/O only; requests run on a pool of worker threads (jobs.c), which
 * may block (engine batches, registry lookups, forwarding) within their
 * deadlines. The node library (node/xfer_node.h) owns the engine, the
 * registry thread, peer setup and event handling.
 */
#ifndef XFER_SERVICE_XFERD_H
#define XFER_SERVICE_XFERD_H

#include "arena.h"
#include "config.h"
#include "xfer.h"
#include "xfer_node.h"
#include "xfer_registry.h"
#include "proto/control.pb-c.h"

#include <pthread.h>
#include <stdatomic.h>
#include <sys/types.h>
#include <stdbool.h>

struct event_base;
struct ctl_server;
struct jobq;
struct batch_table;
struct xfer_metrics;

struct xferd {
    struct xferd_config cfg;
    xfer_node *node;    /* engine + registry (node/) */
    xfer_engine *eng;   /* borrowed from node */
    xfer_registry *reg; /* borrowed from node */
    struct event_base *base;
    struct ctl_server *srv;
    struct jobq *jobs;       /* control requests (a copy request runs its transfer here) */
    struct jobq *async_jobs; /* --async batches: their own workers, so that transfers
                              * stalled on a dead or stopped peer never hold control
                              * requests queued behind them (health, status, ...) */
    struct batch_table *batches;
    struct xfer_metrics *metrics; /* NULL unless metrics_port is set */
    uint64_t incarnation;
    uint64_t started_ms; /* CLOCK_MONOTONIC ms */
    uint16_t ctrl_port;  /* bound TCP control port */
    atomic_bool draining;
    atomic_uint_fast64_t ctl_requests, ctl_errors;
    pthread_mutex_t fwd_lock;
    struct fwd_conn *fwd_idle; /* idle control connections to other xferd */
    int fwd_nidle;
    pthread_rwlock_t region_lock; /* write: register/deregister; read: transfers */
    pthread_mutex_t inflight_lock;
    struct inflight *inflight;         /* engine batches in flight (cancelled at drain end) */
    _Atomic int64_t drain_deadline_ms; /* 0 until SIGTERM */
    pthread_mutex_t known_lock;        /* known.c: other nodes in the registry */
    char (*known)[XFER_NAME_MAX];
    size_t nknown, capknown;
    xfer_registry *known_reg; /* under known_lock: set once the node is up */
    bool known_due;           /* a RESYNC came before known_reg was set */
};

/* ---- jobs.c: worker pool; done callbacks run on the loop thread ---- */
struct job {
    void (*run)(struct job *j);  /* worker thread */
    void (*done)(struct job *j); /* loop thread; frees the job */
    struct job *next;
};
struct jobq *jobq_new(struct event_base *base, int workers);
/* Queues j; -XFER_EBUSY once stopping. */
int jobq_push(struct jobq *q, struct job *j);
/* Jobs queued or running. */
int jobq_pending(struct jobq *q);
/* Runs remaining done callbacks, joins workers, frees. */
void jobq_free(struct jobq *q);

/* ---- handlers.c: one request -> one response (worker thread) ---- */
/* Limits of one control client, shared by its connection and the async
 * batches it started (which may outlive it). */
#define XFERD_MAX_ASYNC_PER_CLIENT 64
struct ctl_quota {
    atomic_int refs;
    atomic_int async; /* async batches queued or running */
};
struct ctl_quota *ctl_quota_new(void);
void ctl_quota_put(struct ctl_quota *q); /* NULL is fine */
/* fd: memfd attached to the request (ownership passes), or -1. q: the
 * client's limits. Everything resp points to is allocated in a (freed after
 * the response is sent). */
void xferd_handle(struct xferd *d, const Xctl__Request *req, int fd, struct ctl_quota *q,
                  Xctl__Response *resp, struct arena *a);

/* ---- transfer.c: named transfers ---- */
/* Runs one transfer (possibly forwarding it) within deadline_ms; res's
 * strings are allocated in a. */
void xferd_transfer(struct xferd *d, const Xctl__Transfer *t, uint32_t hops, int deadline_ms,
                    Xctl__ItemResult *res, struct arena *a);
/* The same with a notification bound to it (notify != NULL, <= XFER_NOTIFY_MAX
 * bytes), delivered to the remote node of the transfer after its data. */
void xferd_transfer_notify(struct xferd *d, const Xctl__Transfer *t, const uint8_t *notify,
                           size_t notify_len, uint32_t hops, int deadline_ms, Xctl__ItemResult *res,
                           struct arena *a);
/* Runs n transfers: those this node carries out against peers go out as
 * one engine batch; res[i] (allocated by the caller) gets item i. With
 * notify, every line must run here against a remote node (all or none) and
 * each remote node gets one notification after its lines landed. */
void xferd_transfer_many(struct xferd *d, Xctl__Transfer *const *items, size_t n,
                         const uint8_t *notify, size_t notify_len, uint32_t hops, int deadline_ms,
                         Xctl__ItemResult **res, struct arena *a);
/* Writes/reads inline bytes at a named address (forwarded to the owner).
 * read: *out is malloc'd (caller frees). */
int xferd_write_data(struct xferd *d, const char *dst, const uint8_t *data, size_t len,
                     uint32_t hops, char *why, size_t why_len);
int xferd_read_data(struct xferd *d, const char *src, uint64_t len, uint32_t hops, uint8_t **out,
                    char *why, size_t why_len);
/* ---- forward.c ---- */
/* Forwards one request to node over its TCP control port (connections are
 * kept for reuse); *resp is protobuf-c allocated
 * (xctl__response__free_unpacked). */
int xferd_forward(struct xferd *d, const char *node, const Xctl__Request *req,
                  Xctl__Response **resp, int timeout_ms, char *why, size_t why_len);
/* Closes the idle forwarding connections (shutdown). */
void xferd_forward_close_all(struct xferd *d);

/* ---- notify_ctl.c, pools_ctl.c: requests on worker threads ---- */
void xferd_do_notify(struct xferd *d, const Xctl__Notify *m, Xctl__Response *resp, struct arena *a);
void xferd_do_pools(struct xferd *d, const char *node, Xctl__Response *resp, struct arena *a);
/* Allocates a host-memory pool's member regions NAME.0.. and registers and
 * publishes the pool (takes region_lock). 0 or an error with why. */
int xferd_pool_create(struct xferd *d, const char *name, const struct xfer_kv_geom *g,
                      unsigned access, char *why, size_t why_len);
void xferd_do_pool_create(struct xferd *d, const Xctl__CreatePool *m, Xctl__Response *resp,
                          struct arena *a);
void xferd_do_pool_delete(struct xferd *d, const char *name, Xctl__Response *resp, struct arena *a);
void xferd_do_pool_copy(struct xferd *d, const Xctl__Request *req, Xctl__Response *resp,
                        struct arena *a);
/* Forwards req (once: hops) to node and makes its answer ours. */
void xferd_forward_whole(struct xferd *d, const char *node, const Xctl__Request *req,
                         Xctl__Response *resp, struct arena *a);
/* Response status and reason (allocated in a). */
void xferd_fail(Xctl__Response *resp, struct arena *a, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Cancels every engine batch still in flight (end of drain). */
void xferd_cancel_inflight(struct xferd *d);
/* Deadline for new work: min(deadline_ms, time left to drain). */
int xferd_clamp_deadline(struct xferd *d, int deadline_ms);

/* ---- batches.c: async batches polled with QueryStatus ---- */
struct batch_table *batch_table_new(void);
void batch_table_free(struct batch_table *t);
uint64_t batch_table_add(struct batch_table *t, size_t nitems);
/* Stores (copies) the results of batch id. */
void batch_table_finish(struct batch_table *t, uint64_t id, Xctl__ItemResult *const *items,
                        size_t n);
/* Fills res from the table (allocating in a): -XFER_ENOENT for unknown or
 * forgotten ids (the newest 1024 finished batches are kept). */
int batch_table_query(struct batch_table *t, uint64_t id, Xctl__BatchResult *res, struct arena *a);

/* ---- known.c: the nodes of the registry, kept from its events ---- */
void xferd_known_on_event(struct xferd *d, const struct xfer_registry_event *ev);
void xferd_known_attach(struct xferd *d, xfer_registry *reg);
uint32_t xferd_known_count(struct xferd *d);
void xferd_known_free(struct xferd *d);

/* ---- ctl_server.c ---- */
struct ctl_server *ctl_server_new(struct xferd *d, char *why, size_t why_len);
/* Closes listeners; connections get -XFER_EBUSY for new requests. */
void ctl_server_stop_accepting(struct ctl_server *s);
void ctl_server_free(struct ctl_server *s);

/* Private regions (client staging) start with this and are not published. */
#define XFERD_PRIVATE_PREFIX '_'

#endif
