/*
 * Connection repair: an engine thread that replaces a peer's connection
 * whose channels died (a network blip, a socket cut after io_timeout_ms
 * because the peer froze) so that a live peer becomes reachable again
 * without a new xfer_peer_add/xfer_peer_connect. Connection setup stays off
 * the data path: submit only notes a dead connection (peer_repair_kick).
 *
 * A connection is replaced when the transport's conn_state() says all its
 * channels died, or some died and the live ones are idle (a busy degraded
 * connection keeps serving over its live channels until it is idle). The
 * new connection is made with the peer's conn_lock held for reading, so
 * submits go on meanwhile, over the same transport and bounded by
 * connect_timeout_ms; it is swapped in under the write lock only if the
 * connection did not change meanwhile (conn_gen). Failed attempts back off
 * from REPAIR_DELAY_MIN_MS doubling up to REPAIR_DELAY_MAX_MS.
 */
#include "internal.h"
#include "xfer_io.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define REPAIR_TICK_MS      200
#define REPAIR_DELAY_MIN_MS 100
#define REPAIR_DELAY_MAX_MS 2000

static bool wants_repair(unsigned st)
{
    return (st & XFER_CONN_ALL_DEAD) || ((st & XFER_CONN_SOME_DEAD) && !(st & XFER_CONN_BUSY));
}

static unsigned conn_state(const struct xfer_conn *c)
{
    const struct xfer_transport_ops *ops = c ? c->transport->ops : NULL;
    return ops && ops->conn_state ? ops->conn_state((struct xfer_conn *)c) : 0;
}

static void backoff(xfer_peer *p, int64_t now)
{
    int d = p->repair_delay_ms ? 2 * p->repair_delay_ms : REPAIR_DELAY_MIN_MS;
    p->repair_delay_ms = d > REPAIR_DELAY_MAX_MS ? REPAIR_DELAY_MAX_MS : d;
    p->repair_at_ms = now + p->repair_delay_ms;
}

/* Installs nc in place of old if nothing changed since gen; returns the
 * connection to disconnect (old if swapped, else nc). */
static struct xfer_conn *swap_in(xfer_peer *p, struct xfer_conn *old, uint64_t gen,
                                 struct xfer_conn *nc)
{
    pthread_rwlock_wrlock(&p->conn_lock);
    struct xfer_conn *drop = nc;
    /* No post runs now, so BUSY is exact: a degraded connection that got
     * work meanwhile keeps it (disconnecting would fail that work). */
    if (p->conn == old && p->conn_gen == gen && wants_repair(conn_state(old))) {
        p->conn = nc;
        p->conn_gen++;
        __atomic_store_n(&p->conn_down, false, __ATOMIC_RELAXED);
        drop = old;
    }
    pthread_rwlock_unlock(&p->conn_lock);
    return drop;
}

static void repair_peer(xfer_peer *p, int timeout_ms)
{
    xfer_engine *e = p->engine;
    int64_t now = xfer_now_ms();
    pthread_rwlock_rdlock(&p->conn_lock);
    struct xfer_conn *c = p->conn;
    unsigned st = conn_state(c);
    __atomic_store_n(&p->conn_down, (st & XFER_CONN_ALL_DEAD) != 0, __ATOMIC_RELAXED);
    if (!wants_repair(st) || now < p->repair_at_ms) {
        if (!st)
            p->repair_delay_ms = 0;
        pthread_rwlock_unlock(&p->conn_lock);
        return;
    }
    struct xfer_transport *t = c->transport;
    uint64_t gen = p->conn_gen;
    char node[XFER_NAME_MAX];
    snprintf(node, sizeof(node), "%s", p->desc.node_id); /* desc changes under the write lock */
    struct xfer_conn *nc = NULL;
    int rc = t->ops->connect(t, p, timeout_ms, &nc);
    pthread_rwlock_unlock(&p->conn_lock);
    if (rc < 0 || !nc) {
        bool first = p->repair_delay_ms == 0; /* later ones at debug: no log flood */
        bool left = st & XFER_CONN_PEER_LEFT; /* it said so: expected, not a fault */
        backoff(p, xfer_now_ms());
        xfer_log(first ? (left ? XFER_LOG_INFO : XFER_LOG_WARN) : XFER_LOG_DEBUG,
                 "peer %s: %s reconnect failed%s: %s (%s); retrying every %d ms at most", node,
                 t->ops->name, left ? " (its engine stopped)" : "", xfer_strerror(rc),
                 xfer_engine_last_error(e), REPAIR_DELAY_MAX_MS);
        return;
    }
    nc->transport = t;
    nc->peer = p;
    struct xfer_conn *drop = swap_in(p, c, gen, nc);
    if (drop == c) {
        p->repair_delay_ms = 0;
        xfer_info("peer %s: %s connection re-established (%s)", node, t->ops->name,
                  st & XFER_CONN_ALL_DEAD ? "all channels had died" : "some channels had died");
    }
    drop->transport->ops->disconnect(drop);
}

/* Marks p as being repaired if it is still in the table (so that
 * xfer_peer_remove waits for this peer only), false if it is gone. */
static bool claim(xfer_engine *e, xfer_peer *p)
{
    bool found = false;
    pthread_mutex_lock(&e->peers.mu);
    for (size_t i = 0; i < e->peers.n && !found; i++)
        found = e->peers.v[i] == p;
    if (found) {
        pthread_mutex_lock(&e->repair.mu);
        e->repair.current = p;
        pthread_mutex_unlock(&e->repair.mu);
    }
    pthread_mutex_unlock(&e->peers.mu);
    return found;
}

static void unclaim(xfer_engine *e)
{
    pthread_mutex_lock(&e->repair.mu);
    e->repair.current = NULL;
    pthread_cond_broadcast(&e->repair.done_cv);
    pthread_mutex_unlock(&e->repair.mu);
}

/* One pass over the peers, within about connect_timeout_ms in all. */
static void repair_round(xfer_engine *e)
{
    pthread_mutex_lock(&e->peers.mu);
    size_t n = e->peers.n;
    xfer_peer **v = n ? malloc(n * sizeof(*v)) : NULL;
    if (v)
        for (size_t i = 0; i < n; i++)
            v[i] = e->peers.v[i];
    pthread_mutex_unlock(&e->peers.mu);
    int budget = e->cfg.connect_timeout_ms > 0 ? e->cfg.connect_timeout_ms : 5000;
    int64_t end = xfer_now_ms() + budget;
    for (size_t i = 0; v && i < n; i++) {
        int left = (int)(end - xfer_now_ms());
        if (left <= 0 || __atomic_load_n(&e->repair.stop, __ATOMIC_RELAXED))
            break;
        if (!claim(e, v[i])) /* removed since the snapshot */
            continue;
        repair_peer(v[i], left);
        unclaim(e);
    }
    free(v);
}

static void *repair_main(void *arg)
{
    xfer_engine *e = arg;
    struct peer_repair *r = &e->repair;
    pthread_mutex_lock(&r->mu);
    while (!r->stop) {
        struct timespec ts = xfer_mono_after_ms(REPAIR_TICK_MS);
        pthread_cond_timedwait(&r->cv, &r->mu, &ts);
        if (r->stop)
            break;
        pthread_mutex_unlock(&r->mu);
        repair_round(e);
        pthread_mutex_lock(&r->mu);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

int peer_repair_start(xfer_engine *e)
{
    struct peer_repair *r = &e->repair;
    xfer_cond_init_mono(&r->cv);
    xfer_cond_init_mono(&r->done_cv);
    pthread_mutex_init(&r->mu, NULL);
    r->stop = false;
    if (pthread_create(&r->thread, NULL, repair_main, e) != 0) {
        xfer_engine_set_error(e, "cannot start the connection repair thread");
        return -XFER_ENOMEM;
    }
    r->started = true;
    return 0;
}

void peer_repair_stop(xfer_engine *e)
{
    struct peer_repair *r = &e->repair;
    if (!r->started)
        return;
    pthread_mutex_lock(&r->mu);
    __atomic_store_n(&r->stop, true, __ATOMIC_RELAXED);
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
    pthread_join(r->thread, NULL);
    r->started = false;
    pthread_cond_destroy(&r->cv);
    pthread_cond_destroy(&r->done_cv);
    pthread_mutex_destroy(&r->mu);
}

void peer_repair_quiesce(xfer_engine *e, xfer_peer *p)
{
    struct peer_repair *r = &e->repair;
    if (!r->started)
        return;
    pthread_mutex_lock(&r->mu);
    while (r->current == p) /* bounded: one repair attempt (connect_timeout_ms) */
        pthread_cond_wait(&r->done_cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
}

void peer_repair_kick(xfer_peer *p)
{
    struct peer_repair *r = &p->engine->repair;
    if (!p->conn || !p->conn->transport->ops->conn_state)
        return; /* not repaired here: its state would not be kept up to date */
    __atomic_store_n(&p->conn_down, true, __ATOMIC_RELAXED);
    pthread_mutex_lock(&r->mu);
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
}
