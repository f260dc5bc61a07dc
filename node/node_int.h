/* Node internals shared by the node/ sources (not installed). */
#ifndef XFER_NODE_INT_H
#define XFER_NODE_INT_H

#include "xfer_node.h"

#include <pthread.h>
#include <stdarg.h>

#define NODE_ERR_MAX 512

/* A peer held by resolved refs, or being connected. The node's peer_lock
 * guards this table only; it is never held across network I/O. */
struct peer_use {
    char node[XFER_NAME_MAX];
    int inuse;       /* refs held (and callers connecting) */
    bool doomed;     /* left/restarted while in use: removed by the last unref */
    bool connecting; /* busy: one caller connects or removes this peer; others
                        wait on xfer_node.connected */
    bool removing;   /* busy removing: the engine peer may be freed any time */
};

struct xfer_node {
    char node_id[XFER_NAME_MAX];
    char advertise[XFER_ADDR_MAX];
    unsigned require; /* XFER_TRANSPORT_* mask; 0 = any */
    int connect_timeout_ms;
    int default_deadline_ms;
    xfer_node_event_fn on_event;
    void *event_arg;
    xfer_engine *eng;
    xfer_registry *reg;
    uint64_t incarnation;

    pthread_mutex_t peer_lock; /* uses[] only; a leaf lock */
    pthread_cond_t connected;  /* a peer's connecting flag went false */
    struct peer_use *uses;
    size_t n_uses, cap_uses;

    pthread_mutex_t pool_lock; /* own pools and the remote pool cache */
    struct xfer_kv_pool *pools;
    struct rpool *rpools; /* remote pools resolved for block transfers */
};

/* Records the calling thread's last error; returns rc. */
int node_err(int rc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Pointer to the calling thread's error buffer (NODE_ERR_MAX bytes). */
char *node_err_buf(void);

/* peers.c */
void node_on_event(const struct xfer_registry_event *ev, void *arg);
void node_peers_free(xfer_node *n);
/* Holds/releases a peer by name (see struct peer_use). */
void node_peer_hold_release(xfer_node *n, const char *node);

/* pool.c / pool_xfer.c */
void node_pools_free(xfer_node *n);
/* Forgets cached remote pools of node (pool NULL: all of the node). */
void node_rpools_forget(xfer_node *n, const char *node, const char *pool);
bool node_region_in_pool(xfer_node *n, const xfer_region *r);

#endif
