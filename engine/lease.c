/*
 * Leases: per-peer access rules on byte ranges of local regions, checked
 * where a target admits an access (xfer_region_acquire_by, called by the tcp,
 * tcpx and ipc owners with the initiator's node id from its handshake).
 *
 * Each region may hold a table of rules: [off, end) -> lease (NULL for a
 * range whose grant was dropped). A lease is one peer and one deadline
 * shared by all its ranges, so renewing or ending it is one store. The
 * table is sorted by offset; max_len bounds how far back an overlapping rule
 * can start, so a check is one binary search plus a scan of the rules that
 * overlap the access. Tables change under the region table lock (the lock
 * acquire already holds); a change rebuilds the table (sort), which is the
 * owner's rare path (grant, release), never the data path.
 *
 * Transports whose peers reach memory without the owner's CPU (rdma) check
 * that they can enforce rules before a region gets any (lease_check) and
 * are told after every change that may revoke access (leases_changed), which
 * returns once their hardware refuses what was revoked. The rdma owner sizes
 * its memory windows with xfer_region_lease_window and re-checks them with
 * xfer_region_lease_admits (deadlines: its CM thread).
 */
#include "xfer_grow.h"
#include "internal.h"
#include "xfer_io.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct xfer_lease {
    xfer_engine *e;
    char peer[XFER_NAME_MAX];
    int64_t deadline; /* CLOCK_MONOTONIC ms; atomic */
    bool ended;       /* atomic: never live again */
    int refs;         /* atomic: the owner's + one per rule */
};

struct guard_rule {
    uint64_t off, end;
    struct xfer_lease *l; /* NULL: guarded, granted to nobody */
};

struct guard_table {
    struct guard_rule *v;
    size_t n, cap;
    uint64_t max_len; /* longest rule: how far back an overlap may start */
};

/* Rules changed or a lease ended: transports that enforce leases outside
 * acquire revoke what is no longer granted (no lock held). */
static void leases_changed(xfer_engine *e)
{
    for (size_t i = 0; i < e->n_transports; i++) {
        struct xfer_transport *t = e->transports[i];
        if (t->ops->leases_changed)
            t->ops->leases_changed(t);
    }
}

static int lease_check(xfer_engine *e, xfer_region *r)
{
    for (size_t i = 0; i < e->n_transports; i++) {
        struct xfer_transport *t = e->transports[i];
        int rc = t->ops->lease_check ? t->ops->lease_check(t, r) : 0;
        if (rc)
            return rc;
    }
    return 0;
}

static void lease_put(struct xfer_lease *l)
{
    if (l && __atomic_sub_fetch(&l->refs, 1, __ATOMIC_ACQ_REL) == 0)
        free(l);
}

static bool lease_grants(const struct xfer_lease *l, const char *peer, int64_t now)
{
    return l && peer && !__atomic_load_n(&l->ended, __ATOMIC_ACQUIRE) &&
           now < __atomic_load_n(&l->deadline, __ATOMIC_ACQUIRE) && !strcmp(l->peer, peer);
}

xfer_lease *xfer_lease_new(xfer_engine *e, const char *peer_node, int ttl_ms, int *err)
{
    int dummy;
    err = err ? err : &dummy;
    if (!e || !peer_node || !*peer_node || strlen(peer_node) >= XFER_NAME_MAX || ttl_ms <= 0) {
        *err = -XFER_EINVAL;
        return NULL;
    }
    struct xfer_lease *l = calloc(1, sizeof(*l));
    if (!l) {
        *err = -XFER_ENOMEM;
        return NULL;
    }
    l->e = e;
    snprintf(l->peer, sizeof(l->peer), "%s", peer_node);
    l->deadline = xfer_now_ms() + ttl_ms;
    l->refs = 1;
    *err = 0;
    return l;
}

bool xfer_lease_live(const xfer_lease *l)
{
    return l && !__atomic_load_n(&l->ended, __ATOMIC_ACQUIRE) &&
           xfer_now_ms() < __atomic_load_n(&l->deadline, __ATOMIC_ACQUIRE);
}

int xfer_lease_renew(xfer_lease *l, int ttl_ms)
{
    if (!l || ttl_ms <= 0)
        return -XFER_EINVAL;
    /* Under the table lock so a renewal cannot revive a lease between an
     * expiry seen by xfer_lease_live and a check. */
    struct region_table *t = &l->e->regions;
    pthread_mutex_lock(&t->mu);
    int rc = 0;
    if (!xfer_lease_live(l)) {
        __atomic_store_n(&l->ended, true, __ATOMIC_RELEASE);
        rc = -XFER_ESTALE;
    } else {
        __atomic_store_n(&l->deadline, xfer_now_ms() + ttl_ms, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&t->mu);
    return rc;
}

void xfer_lease_end(xfer_lease *l)
{
    if (!l)
        return;
    __atomic_store_n(&l->ended, true, __ATOMIC_RELEASE);
    leases_changed(l->e);
}

void xfer_lease_free(xfer_lease *l)
{
    if (!l)
        return;
    xfer_lease_end(l);
    lease_put(l);
}

static int rule_cmp(const void *a, const void *b)
{
    const struct guard_rule *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off;
}

static int table_reserve(struct guard_table *g, size_t more)
{
    return xfer_grow((void **)&g->v, &g->cap, g->n + more, sizeof(*g->v), 16);
}

static void table_finish(struct guard_table *g)
{
    qsort(g->v, g->n, sizeof(*g->v), rule_cmp);
    g->max_len = 0;
    for (size_t i = 0; i < g->n; i++)
        if (g->v[i].end - g->v[i].off > g->max_len)
            g->max_len = g->v[i].end - g->v[i].off;
}

static bool range_inside(const struct xfer_range *v, size_t n, uint64_t off, uint64_t end)
{
    for (size_t i = 0; i < n; i++)
        if (v[i].off <= off && end <= v[i].off + v[i].len)
            return true;
    return false;
}

static int check_ranges(const xfer_region *r, const struct xfer_range *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!v[i].len || !xfer_range_ok(v[i].off, v[i].len, r->len))
            return -XFER_ERANGE;
    return 0;
}

int xfer_lease_add(xfer_lease *l, xfer_region *r, const struct xfer_range *v, size_t n)
{
    if (!l || !r || r->engine != l->e || (n && !v))
        return -XFER_EINVAL;
    if (check_ranges(r, v, n))
        return -XFER_ERANGE;
    if (n && lease_check(l->e, r))
        return -XFER_ENOTSUP;
    struct region_table *t = &l->e->regions;
    pthread_mutex_lock(&t->mu);
    int rc = __atomic_load_n(&l->ended, __ATOMIC_ACQUIRE) ? -XFER_ESTALE : 0;
    if (!rc && !r->guards && !(r->guards = calloc(1, sizeof(*r->guards))))
        rc = -XFER_ENOMEM;
    struct guard_table *g = r->guards;
    if (!rc)
        rc = table_reserve(g, n);
    if (!rc) {
        /* Dead rules wholly under a new range are superseded: the table
         * stays as large as the live state, however often blocks are
         * granted, released and granted again. */
        size_t k = 0;
        for (size_t i = 0; i < g->n; i++) {
            struct guard_rule *u = &g->v[i];
            if ((!u->l || __atomic_load_n(&u->l->ended, __ATOMIC_ACQUIRE)) &&
                range_inside(v, n, u->off, u->end))
                lease_put(u->l);
            else
                g->v[k++] = *u;
        }
        g->n = k;
        for (size_t i = 0; i < n; i++) {
            g->v[g->n++] = (struct guard_rule){v[i].off, v[i].off + v[i].len, l};
            __atomic_add_fetch(&l->refs, 1, __ATOMIC_RELAXED);
        }
        table_finish(g);
    }
    pthread_mutex_unlock(&t->mu);
    /* Guarded bytes need the owner's check on every access: no peer may
     * keep copying r without asking (ipc direct copies, docs/ipc.md). */
    if (!rc && n) {
        region_withdraw_direct(l->e, r);
        leases_changed(l->e); /* an rdma window over bytes now guarded goes */
    }
    return rc;
}

static int rule_push(struct guard_table *g, uint64_t off, uint64_t end, struct xfer_lease *l)
{
    if (table_reserve(g, 1))
        return -XFER_ENOMEM;
    g->v[g->n++] = (struct guard_rule){off, end, l};
    if (l)
        __atomic_add_fetch(&l->refs, 1, __ATOMIC_RELAXED);
    return 0;
}

/* Appends u cut by v: the parts outside v keep u's lease, the parts inside
 * are granted to nobody. v need not be sorted. */
static int rule_cut(struct guard_table *g, struct guard_rule u, const struct xfer_range *v,
                    size_t n)
{
    int rc = 0;
    while (!rc && u.off < u.end) {
        const struct xfer_range *first = NULL; /* the overlapping range that starts first */
        for (size_t i = 0; i < n; i++)
            if (v[i].off < u.end && v[i].off + v[i].len > u.off &&
                (!first || v[i].off < first->off))
                first = &v[i];
        if (!first)
            return rule_push(g, u.off, u.end, u.l);
        uint64_t a = first->off > u.off ? first->off : u.off;
        uint64_t b = first->off + first->len < u.end ? first->off + first->len : u.end;
        if (a > u.off)
            rc = rule_push(g, u.off, a, u.l);
        if (!rc)
            rc = rule_push(g, a, b, NULL);
        u.off = b;
    }
    return rc;
}

int xfer_lease_drop(xfer_lease *l, xfer_region *r, const struct xfer_range *v, size_t n)
{
    if (!l || !r || r->engine != l->e || (n && !v))
        return -XFER_EINVAL;
    if (check_ranges(r, v, n))
        return -XFER_ERANGE;
    struct region_table *t = &l->e->regions;
    pthread_mutex_lock(&t->mu);
    struct guard_table *g = r->guards;
    int rc = 0;
    size_t old = g ? g->n : 0, k = 0;
    for (size_t i = 0; i < old; i++) {
        struct guard_rule u = g->v[i];
        if (u.l != l || rc) {
            g->v[k++] = u;
            continue;
        }
        /* Appended after the old rules (index >= old > k): no overlap with
         * the compaction, which only writes below i. */
        rc = rule_cut(g, u, v, n);
        if (rc)
            g->v[k++] = u;
        else
            lease_put(l);
    }
    if (g) {
        memmove(&g->v[k], &g->v[old], (g->n - old) * sizeof(*g->v));
        g->n = k + (g->n - old);
        table_finish(g);
    }
    pthread_mutex_unlock(&t->mu);
    leases_changed(l->e);
    return rc;
}

int xfer_region_unguard(xfer_region *r)
{
    if (!r)
        return -XFER_EINVAL;
    struct region_table *t = &r->engine->regions;
    pthread_mutex_lock(&t->mu);
    guard_free(r);
    pthread_mutex_unlock(&t->mu);
    return 0;
}

size_t xfer_region_guard_count(xfer_region *r)
{
    if (!r)
        return 0;
    pthread_mutex_lock(&r->engine->regions.mu);
    size_t n = r->guards ? r->guards->n : 0;
    pthread_mutex_unlock(&r->engine->regions.mu);
    return n;
}

void guard_free(xfer_region *r)
{
    struct guard_table *g = r->guards;
    if (!g)
        return;
    for (size_t i = 0; i < g->n; i++)
        lease_put(g->v[i].l);
    free(g->v);
    free(g);
    r->guards = NULL;
}

/* First rule that may overlap [off, ...): rules start at most max_len
 * before off. */
static size_t first_candidate(const struct guard_table *g, uint64_t off)
{
    uint64_t from = off > g->max_len ? off - g->max_len : 0;
    size_t lo = 0, hi = g->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (g->v[mid].off < from)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* How far from a the rules granted to peer cover without a gap. Rules are
 * sorted by off, so one pass from the first candidate suffices. */
static uint64_t covered_to(const struct guard_table *g, size_t i, const char *peer, int64_t now,
                           uint64_t a, uint64_t b)
{
    uint64_t cur = a;
    for (; i < g->n && g->v[i].off <= cur && cur < b; i++)
        if (g->v[i].end > cur && lease_grants(g->v[i].l, peer, now))
            cur = g->v[i].end;
    return cur;
}

int guard_check(const xfer_region *r, const char *peer, uint64_t off, uint64_t len)
{
    const struct guard_table *g = r->guards;
    if (!g || !g->n || !len)
        return 0;
    uint64_t end = off + len, ca = 0, cb = 0; /* [ca, cb): known covered */
    int64_t now = xfer_now_ms();
    size_t first = first_candidate(g, off);
    for (size_t i = first; i < g->n && g->v[i].off < end; i++) {
        const struct guard_rule *u = &g->v[i];
        if (u->end <= off || lease_grants(u->l, peer, now))
            continue;
        uint64_t a = u->off > off ? u->off : off, b = u->end < end ? u->end : end;
        if (a >= ca && b <= cb)
            continue;
        ca = a;
        cb = covered_to(g, first, peer, now, a, end);
        if (cb < b)
            return -XFER_ESTALE;
    }
    return 0;
}

/* The earliest deadline of peer's live rules overlapping [off, end). */
static int64_t rules_until(const struct guard_table *g, const char *peer, int64_t now, uint64_t off,
                           uint64_t end)
{
    int64_t until = INT64_MAX;
    for (size_t i = g ? first_candidate(g, off) : 0; g && i < g->n && g->v[i].off < end; i++) {
        const struct guard_rule *u = &g->v[i];
        if (u->end > off && lease_grants(u->l, peer, now)) {
            int64_t d = __atomic_load_n(&u->l->deadline, __ATOMIC_ACQUIRE);
            until = d < until ? d : until;
        }
    }
    return until;
}

/* Widens [*a, *b) over peer's live rules that overlap or touch it. */
static void widen(const struct guard_table *g, const char *peer, int64_t now, uint64_t *a,
                  uint64_t *b)
{
    for (bool grew = true; grew;) {
        grew = false;
        for (size_t i = 0; i < g->n; i++) {
            const struct guard_rule *u = &g->v[i];
            if (u->end < *a || u->off > *b || !lease_grants(u->l, peer, now))
                continue;
            grew |= u->off < *a || u->end > *b;
            *a = u->off < *a ? u->off : *a;
            *b = u->end > *b ? u->end : *b;
        }
    }
}

int xfer_region_lease_window(xfer_region *r, const char *peer, uint64_t off, uint64_t len,
                             uint64_t *woff, uint64_t *wlen, int64_t *until)
{
    struct region_table *t = &r->engine->regions;
    pthread_mutex_lock(&t->mu);
    int64_t now = xfer_now_ms();
    int rc = r->dead ? -XFER_ESTALE : guard_check(r, peer, off, len);
    if (!rc) {
        uint64_t a = off, b = off + len;
        if (!r->guards || !guard_check(r, peer, 0, r->len))
            a = 0, b = r->len;
        else
            widen(r->guards, peer, now, &a, &b);
        *woff = a;
        *wlen = b - a;
        *until = rules_until(r->guards, peer, now, a, b);
    }
    pthread_mutex_unlock(&t->mu);
    return rc;
}

int xfer_region_lease_admits(xfer_region *r, const char *peer, uint64_t off, uint64_t len,
                             int64_t *until)
{
    struct region_table *t = &r->engine->regions;
    pthread_mutex_lock(&t->mu);
    int rc = r->dead ? -XFER_ESTALE : guard_check(r, peer, off, len);
    if (!rc)
        *until = rules_until(r->guards, peer, xfer_now_ms(), off, off + len);
    pthread_mutex_unlock(&t->mu);
    return rc;
}
