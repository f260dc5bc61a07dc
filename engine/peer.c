/*
 * Peer table: descriptors, cached remote regions, and the one connection per
 * peer over the preferred transport. Connections are made here, on the
 * control path, never when a batch is posted.
 */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void peer_table_init(struct peer_table *t)
{
    memset(t, 0, sizeof(*t));
    pthread_mutex_init(&t->mu, NULL);
}

static xfer_peer *find_locked(struct peer_table *t, const char *node_id)
{
    for (size_t i = 0; i < t->n; i++)
        if (!strcmp(t->v[i]->desc.node_id, node_id))
            return t->v[i];
    return NULL;
}

/* conn_lock held for writing. */
static void drop_conn(xfer_peer *p)
{
    if (!p->conn)
        return;
    struct xfer_conn *c = p->conn;
    p->conn = NULL;
    p->tbit = 0;
    p->conn_gen++;
    __atomic_store_n(&p->conn_down, false, __ATOMIC_RELAXED);
    c->transport->ops->disconnect(c);
}

static bool transport_fits(struct xfer_transport *t, const struct xfer_peer_desc *d)
{
    return (d->transports & t->ops->bit) && (t->ops->caps & XFER_CAP_HOST_MEM) &&
           t->ops->reaches(t, d);
}

/* Name of the first transport from index `from` on that could carry the
 * peer, NULL if none: the warning says what happens next, not a guess. */
static const char *next_fitting(xfer_engine *e, size_t from, const struct xfer_peer_desc *d)
{
    for (size_t i = from; i < e->n_transports; i++)
        if (transport_fits(e->transports[i], d))
            return e->transports[i]->ops->name;
    return NULL;
}

/* First transport in preference order that both sides allow, that reaches
 * the peer and moves host memory; falls back to the next one if connecting
 * fails. conn_lock held for writing. */
static int connect_locked(xfer_peer *p)
{
    xfer_engine *e = p->engine;
    int rc = -XFER_ENOTSUP;
    if (p->conn)
        return 0;
    for (size_t i = 0; i < e->n_transports; i++) {
        struct xfer_transport *t = e->transports[i];
        if (!(p->desc.transports & t->ops->bit)) /* we have it, the peer does not */
            xfer_info("peer %s does not offer %s: trying the next transport", p->desc.node_id,
                      t->ops->name);
        if (!transport_fits(t, &p->desc))
            continue;
        struct xfer_conn *c = NULL;
        rc = t->ops->connect(t, p, e->cfg.connect_timeout_ms, &c);
        if (rc == 0 && c) {
            c->transport = t;
            c->peer = p;
            p->conn = c;
            p->tbit = t->ops->bit;
            p->conn_gen++;
            __atomic_store_n(&p->conn_down, false, __ATOMIC_RELAXED);
            xfer_debug("peer %s connected over %s", p->desc.node_id, t->ops->name);
            return 0;
        }
        const char *next = next_fitting(e, i + 1, &p->desc);
        xfer_warn("peer %s: %s connect failed: %s (%s)%s%s", p->desc.node_id, t->ops->name,
                  xfer_strerror(rc), xfer_engine_last_error(e),
                  next ? "; falling back to " : "; no other transport to try", next ? next : "");
    }
    if (rc == -XFER_ENOTSUP)
        xfer_engine_set_error(e, "peer %s: no common transport (peer offers 0x%x, we 0x%x)",
                              p->desc.node_id, p->desc.transports, e->transport_mask);
    return rc;
}

static void clear_region_cache(xfer_peer *p)
{
    pthread_mutex_lock(&p->mu);
    p->n_regions = 0;
    pthread_mutex_unlock(&p->mu);
}

static xfer_peer *peer_new(xfer_engine *e, const struct xfer_peer_desc *desc)
{
    xfer_peer *p = calloc(1, sizeof(*p));
    if (!p)
        return NULL;
    p->engine = e;
    pthread_rwlock_init(&p->conn_lock, NULL);
    pthread_mutex_init(&p->mu, NULL);
    p->desc = *desc;
    return p;
}

static void peer_free(xfer_peer *p)
{
    pthread_rwlock_wrlock(&p->conn_lock);
    drop_conn(p);
    pthread_rwlock_unlock(&p->conn_lock);
    pthread_rwlock_destroy(&p->conn_lock);
    pthread_mutex_destroy(&p->mu);
    free(p->regions);
    free(p);
}

static int table_append(struct peer_table *t, xfer_peer *p)
{
    if (t->n == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 16;
        xfer_peer **v = realloc(t->v, cap * sizeof(*v));
        if (!v)
            return -XFER_ENOMEM;
        t->v = v;
        t->cap = cap;
    }
    t->v[t->n++] = p;
    return 0;
}

/* Updates an existing peer from desc; a new incarnation means the process
 * restarted, so everything learned about the old one is dropped. */
static void peer_update(xfer_peer *p, const struct xfer_peer_desc *desc)
{
    pthread_rwlock_wrlock(&p->conn_lock);
    bool restarted = desc->incarnation != p->desc.incarnation;
    bool moved = strcmp(desc->addr, p->desc.addr) || desc->data_port != p->desc.data_port;
    if (restarted || moved) {
        xfer_info("peer %s %s: dropping its connection%s", desc->node_id,
                  restarted ? "restarted" : "moved", restarted ? " and cached regions" : "");
        drop_conn(p);
        if (restarted)
            clear_region_cache(p);
    }
    pthread_mutex_lock(&p->mu);
    p->desc = *desc;
    pthread_mutex_unlock(&p->mu);
    pthread_rwlock_unlock(&p->conn_lock);
}

int xfer_peer_add(xfer_engine *e, const struct xfer_peer_desc *desc, xfer_peer **out)
{
    if (!e || !desc || !desc->node_id[0] || !memchr(desc->node_id, 0, sizeof(desc->node_id)))
        return -XFER_EINVAL;
    struct peer_table *t = &e->peers;
    pthread_mutex_lock(&t->mu);
    xfer_peer *p = find_locked(t, desc->node_id);
    bool fresh = !p;
    if (fresh) {
        p = peer_new(e, desc);
        if (!p || table_append(t, p) < 0) {
            pthread_mutex_unlock(&t->mu);
            if (p)
                peer_free(p);
            return -XFER_ENOMEM;
        }
    }
    pthread_mutex_unlock(&t->mu);
    if (!fresh)
        peer_update(p, desc);
    if (out)
        *out = p;
    pthread_rwlock_wrlock(&p->conn_lock);
    int rc = connect_locked(p);
    pthread_rwlock_unlock(&p->conn_lock);
    return rc;
}

int xfer_peer_connect(xfer_peer *p)
{
    if (!p)
        return -XFER_EINVAL;
    pthread_rwlock_wrlock(&p->conn_lock);
    drop_conn(p); /* an explicit (re)connect: sockets may have died since */
    int rc = connect_locked(p);
    pthread_rwlock_unlock(&p->conn_lock);
    return rc;
}

xfer_peer *xfer_peer_find(xfer_engine *e, const char *node_id)
{
    if (!e || !node_id)
        return NULL;
    pthread_mutex_lock(&e->peers.mu);
    xfer_peer *p = find_locked(&e->peers, node_id);
    pthread_mutex_unlock(&e->peers.mu);
    return p;
}

int xfer_peer_remove(xfer_engine *e, xfer_peer *p)
{
    if (!e || !p)
        return -XFER_EINVAL;
    struct peer_table *t = &e->peers;
    pthread_mutex_lock(&t->mu);
    size_t i;
    for (i = 0; i < t->n && t->v[i] != p; i++)
        ;
    if (i == t->n) {
        pthread_mutex_unlock(&t->mu);
        return -XFER_ENOENT;
    }
    t->v[i] = t->v[--t->n];
    pthread_mutex_unlock(&t->mu);
    peer_repair_quiesce(e, p); /* the repair thread may still use p */
    pthread_rwlock_wrlock(&p->conn_lock);
    drop_conn(p); /* fails what p's connection carries */
    pthread_rwlock_unlock(&p->conn_lock);
    msg_peer_gone(e, p); /* messages and two-sided items naming p */
    peer_free(p);
    return 0;
}

void peer_table_destroy(xfer_engine *e)
{
    struct peer_table *t = &e->peers;
    while (t->n > 0)
        xfer_peer_remove(e, t->v[t->n - 1]);
    free(t->v);
    t->v = NULL;
    t->cap = 0;
}

/* ---- cached remote regions ------------------------------------------------ */

/* The cache is sorted by id: transports look a region up per item (tens of
 * thousands per KV request over a pool's 64 regions), adds and removes are
 * rare. Returns the index of id, or where it would go. */
static size_t cache_pos(const xfer_peer *p, uint32_t id)
{
    size_t lo = 0, hi = p->n_regions;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (p->regions[mid].id < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static struct xfer_region_desc *cache_find(xfer_peer *p, uint32_t id)
{
    size_t i = cache_pos(p, id);
    return i < p->n_regions && p->regions[i].id == id ? &p->regions[i] : NULL;
}

int xfer_peer_region_add(xfer_peer *p, const struct xfer_region_desc *d)
{
    if (!p || !d)
        return -XFER_EINVAL;
    int rc = 0;
    pthread_mutex_lock(&p->mu);
    struct xfer_region_desc *slot = cache_find(p, d->id);
    if (!slot && p->n_regions == p->cap_regions) {
        size_t cap = p->cap_regions ? 2 * p->cap_regions : 8;
        struct xfer_region_desc *v = realloc(p->regions, cap * sizeof(*v));
        if (v) {
            p->regions = v;
            p->cap_regions = cap;
        } else {
            rc = -XFER_ENOMEM;
        }
    }
    if (rc == 0 && !slot) {
        size_t i = cache_pos(p, d->id);
        memmove(&p->regions[i + 1], &p->regions[i], (p->n_regions++ - i) * sizeof(*slot));
        slot = &p->regions[i];
    }
    if (rc == 0)
        *slot = *d;
    pthread_mutex_unlock(&p->mu);
    return rc;
}

int xfer_peer_region_remove(xfer_peer *p, uint32_t id)
{
    if (!p)
        return -XFER_EINVAL;
    pthread_mutex_lock(&p->mu);
    struct xfer_region_desc *slot = cache_find(p, id);
    if (slot) {
        size_t i = (size_t)(slot - p->regions);
        memmove(slot, slot + 1, (--p->n_regions - i) * sizeof(*slot));
    }
    pthread_mutex_unlock(&p->mu);
    return slot ? 0 : -XFER_ENOENT;
}

int xfer_peer_region_lookup(xfer_peer *p, const char *name, struct xfer_region_desc *out)
{
    if (!p || !name)
        return -XFER_EINVAL;
    int rc = -XFER_ENOENT;
    pthread_mutex_lock(&p->mu);
    for (size_t i = 0; i < p->n_regions; i++) {
        if (!strcmp(p->regions[i].name, name)) {
            if (out)
                *out = p->regions[i];
            rc = 0;
            break;
        }
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

int xfer_peer_region_get(xfer_peer *p, uint32_t id, struct xfer_region_desc *out)
{
    pthread_mutex_lock(&p->mu);
    struct xfer_region_desc *slot = cache_find(p, id);
    if (slot && out)
        *out = *slot;
    pthread_mutex_unlock(&p->mu);
    return slot ? 0 : -XFER_ENOENT;
}

int xfer_peer_region_brief(xfer_peer *p, uint32_t id, struct xfer_region_brief *out)
{
    pthread_mutex_lock(&p->mu);
    const struct xfer_region_desc *slot = cache_find(p, id);
    if (slot)
        *out = (struct xfer_region_brief){
            .gen = slot->gen, .kind = slot->kind, .access = slot->access, .len = slot->len};
    pthread_mutex_unlock(&p->mu);
    return slot ? 0 : -XFER_ENOENT;
}

/* ---- accessors ------------------------------------------------------------ */

void xfer_peer_describe(const xfer_peer *p, struct xfer_peer_desc *out)
{
    if (!p || !out)
        return;
    pthread_mutex_lock((pthread_mutex_t *)&p->mu);
    *out = p->desc;
    pthread_mutex_unlock((pthread_mutex_t *)&p->mu);
}

const struct xfer_peer_desc *xfer_peer_desc_get(const xfer_peer *p)
{
    return &p->desc;
}

struct xfer_conn *xfer_peer_conn(xfer_peer *p)
{
    return p ? p->conn : NULL;
}

unsigned xfer_peer_transport(const xfer_peer *p)
{
    if (!p || __atomic_load_n(&p->conn_down, __ATOMIC_RELAXED))
        return 0; /* a dead connection counts as none (peer_repair.c) */
    return __atomic_load_n(&p->tbit, __ATOMIC_RELAXED);
}

void xfer_peer_foreach(xfer_engine *e, void (*fn)(xfer_peer *, void *), void *arg)
{
    if (!e || !fn)
        return;
    pthread_mutex_lock(&e->peers.mu);
    for (size_t i = 0; i < e->peers.n; i++)
        fn(e->peers.v[i], arg);
    pthread_mutex_unlock(&e->peers.mu);
}
