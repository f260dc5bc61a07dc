/*
 * Region table: registration, ids and generations, memfd-backed memory, and
 * pins that make deregistration wait for target-side accesses in progress.
 *
 * A name keeps its id across registrations and gets a new generation each
 * time, so a peer holding an old (id, gen) learns -XFER_ESTALE while a peer
 * holding an id never registered learns -XFER_ENOENT.
 */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

void region_table_init(struct region_table *t)
{
    memset(t, 0, sizeof(*t));
    pthread_mutex_init(&t->mu, NULL);
    xfer_cond_init_mono(&t->unpinned);
    t->next_id = 1;
}

/* Index of id in the sorted table, or where it would go. Table locked. */
static size_t table_slot(const struct region_table *t, uint32_t id)
{
    size_t lo = 0, hi = t->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (t->v[mid]->id < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static xfer_region *table_get(const struct region_table *t, uint32_t id)
{
    size_t i = table_slot(t, id);
    return i < t->n && t->v[i]->id == id ? t->v[i] : NULL;
}

static xfer_region *table_find_name(const struct region_table *t, const char *name)
{
    for (size_t i = 0; i < t->n; i++)
        if (!strcmp(t->v[i]->name, name))
            return t->v[i];
    return NULL;
}

/* Assigns id and next generation for name. Table locked. */
static int name_assign(struct region_table *t, const char *name, uint32_t *id, uint32_t *gen)
{
    for (size_t i = 0; i < t->n_names; i++) {
        if (!strcmp(t->names[i].name, name)) {
            *id = t->names[i].id;
            *gen = ++t->names[i].gen;
            return 0;
        }
    }
    if (t->n_names == t->cap_names) {
        size_t cap = t->cap_names ? 2 * t->cap_names : 16;
        struct region_name *v = realloc(t->names, cap * sizeof(*v));
        if (!v)
            return -XFER_ENOMEM;
        t->names = v;
        t->cap_names = cap;
    }
    struct region_name *rn = &t->names[t->n_names++];
    snprintf(rn->name, sizeof(rn->name), "%s", name);
    rn->id = *id = t->next_id++;
    rn->gen = *gen = 1;
    return 0;
}

static int table_insert(struct region_table *t, xfer_region *r)
{
    if (t->n == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 16;
        xfer_region **v = realloc(t->v, cap * sizeof(*v));
        if (!v)
            return -XFER_ENOMEM;
        t->v = v;
        t->cap = cap;
    }
    size_t i = table_slot(t, r->id);
    memmove(&t->v[i + 1], &t->v[i], (t->n - i) * sizeof(*t->v));
    t->v[i] = r;
    t->n++;
    return 0;
}

static void table_remove(struct region_table *t, xfer_region *r)
{
    size_t i = table_slot(t, r->id);
    if (i < t->n && t->v[i] == r) {
        memmove(&t->v[i], &t->v[i + 1], (t->n - i - 1) * sizeof(*t->v));
        t->n--;
    }
}

static void transports_dereg(xfer_engine *e, xfer_region *r, size_t upto)
{
    for (size_t i = 0; i < upto; i++) {
        struct xfer_transport *t = e->transports[i];
        if ((t->ops->caps & XFER_CAP_NEEDS_REG) && t->ops->dereg_mem)
            t->ops->dereg_mem(t, r);
    }
}

static int transports_reg(xfer_engine *e, xfer_region *r)
{
    for (size_t i = 0; i < e->n_transports; i++) {
        struct xfer_transport *t = e->transports[i];
        if (!(t->ops->caps & XFER_CAP_NEEDS_REG) || !t->ops->reg_mem)
            continue;
        int rc = t->ops->reg_mem(t, r);
        if (rc < 0) {
            xfer_engine_set_error(e, "region %s: transport %s cannot register it: %s", r->name,
                                  t->ops->name, xfer_strerror(rc));
            transports_dereg(e, r, i);
            return rc;
        }
    }
    return 0;
}

/* Common path of register/alloc/adopt: r has memory; gives it id and gen. */
static int region_add(xfer_engine *e, xfer_region *r, xfer_region **out)
{
    struct region_table *t = &e->regions;
    int rc = transports_reg(e, r);
    if (rc < 0)
        return rc;
    pthread_mutex_lock(&t->mu);
    if (table_find_name(t, r->name)) {
        rc = -XFER_EEXIST;
        xfer_engine_set_error(e, "region name %s already registered", r->name);
    } else if ((rc = name_assign(t, r->name, &r->id, &r->gen)) == 0) {
        rc = table_insert(t, r);
    }
    pthread_mutex_unlock(&t->mu);
    if (rc < 0) {
        transports_dereg(e, r, e->n_transports);
        return rc;
    }
    xfer_debug("region %s registered: id %u gen %u len %zu access %s", r->name, r->id, r->gen,
               r->len, xfer_access_str(r->access));
    if (out)
        *out = r;
    return 0;
}

static xfer_region *region_new(xfer_engine *e, const char *name, size_t len, unsigned access,
                               int *rc)
{
    *rc = -XFER_EINVAL;
    if (!e || !name || !*name || strlen(name) >= XFER_NAME_MAX || len == 0 ||
        !(access & XFER_ACCESS_RW) || (access & ~(XFER_ACCESS_RW | XFER_ACCESS_LEASED))) {
        if (e)
            xfer_engine_set_error(e, "region: bad name, length or access");
        return NULL;
    }
    xfer_region *r = calloc(1, sizeof(*r));
    if (!r) {
        *rc = -XFER_ENOMEM;
        return NULL;
    }
    r->engine = e;
    snprintf(r->name, sizeof(r->name), "%s", name);
    r->len = len;
    r->access = access;
    r->kind = XFER_MEM_HOST;
    r->device = -1;
    r->memfd = -1;
    *rc = 0;
    return r;
}

static void region_free_memory(xfer_region *r)
{
    guard_free(r);
    region_cuda_close(r);
    if (r->owns_map && r->ptr)
        munmap(r->ptr, r->len);
    if (r->memfd >= 0)
        close(r->memfd);
    free(r);
}

int xfer_region_register(xfer_engine *e, const char *name, void *ptr, size_t len,
                         enum xfer_mem_kind kind, int device, unsigned access, xfer_region **out)
{
    int rc;
    if (!ptr || (kind != XFER_MEM_HOST && kind != XFER_MEM_CUDA))
        return -XFER_EINVAL;
    xfer_region *r = region_new(e, name, len, access, &rc);
    if (!r)
        return rc;
    r->ptr = ptr;
    r->kind = kind;
    r->device = kind == XFER_MEM_CUDA ? device : -1;
    rc = region_add(e, r, out);
    if (rc < 0)
        free(r);
    return rc;
}

/* Any holder of a memfd (a client that registered it, a peer we passed it
 * to) could ftruncate it smaller, and the next access to the mapping would
 * kill this process with SIGBUS. A memfd sealed against shrinking cannot be
 * truncated by anyone. With add, seals one that still allows sealing. */
int xfer_memfd_seal_shrink(int fd, bool add, char *why, size_t why_len)
{
    int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0) {
        snprintf(why, why_len, "not a memfd (its seals cannot be read: %s)", strerror(errno));
        return -XFER_EINVAL;
    }
    if (seals & F_SEAL_SHRINK)
        return 0;
    if (add && !(seals & F_SEAL_SEAL) && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) == 0)
        return 0;
    snprintf(why, why_len,
             "memfd not sealed against shrinking (create it with MFD_ALLOW_SEALING or add "
             "F_SEAL_SHRINK): a holder could truncate it under a transfer");
    return -XFER_EINVAL;
}

static int map_memfd(xfer_region *r, int fd)
{
    void *p = mmap(NULL, r->len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return -XFER_ENOMEM;
    r->ptr = p;
    r->owns_map = true;
    r->memfd = fd;
    return 0;
}

int xfer_region_alloc(xfer_engine *e, const char *name, size_t len, unsigned access,
                      xfer_region **out)
{
    int rc;
    xfer_region *r = region_new(e, name, len, access, &rc);
    if (!r)
        return rc;
    int fd;
    void *p;
    rc = region_mem_alloc(e, name, len, &fd, &p);
    if (rc < 0) {
        free(r);
        return rc;
    }
    r->ptr = p;
    r->owns_map = true;
    r->memfd = fd;
    rc = region_add(e, r, out);
    if (rc < 0)
        region_free_memory(r);
    return rc;
}

int xfer_region_adopt_memfd(xfer_engine *e, const char *name, int fd, size_t len, unsigned access,
                            xfer_region **out)
{
    int rc;
    struct stat st;
    char why[200];
    if (fd < 0)
        return -XFER_EINVAL;
    /* Sealed first, measured second: the size cannot change in between. */
    if ((rc = xfer_memfd_seal_shrink(fd, true, why, sizeof(why))) < 0) {
        if (e)
            xfer_engine_set_error(e, "region %s: %s", name, why);
        return rc;
    }
    if (fstat(fd, &st) < 0 || st.st_size < 0 || (uint64_t)st.st_size < len) {
        if (e)
            xfer_engine_set_error(e, "region %s: memfd smaller than %zu bytes", name, len);
        return -XFER_ERANGE;
    }
    xfer_region *r = region_new(e, name, len, access, &rc);
    if (!r)
        return rc;
    rc = map_memfd(r, fd);
    if (rc < 0) {
        free(r);
        return rc;
    }
    rc = region_add(e, r, out);
    if (rc < 0) {
        r->memfd = -1; /* ownership passes only on success */
        region_free_memory(r);
    }
    return rc;
}

/* Deregistration of r started (r is dead, out of the table) or r got lease
 * rules: transports that lent it to peers withdraw it. Called without the
 * table lock. */
void region_withdraw_direct(xfer_engine *e, xfer_region *r)
{
    for (size_t i = 0; i < e->n_transports; i++) {
        struct xfer_transport *t = e->transports[i];
        if (t->ops->region_withdraw)
            t->ops->region_withdraw(t, r);
    }
}

int xfer_region_detach(xfer_engine *e, xfer_region *r)
{
    if (!e || !r || r->engine != e)
        return -XFER_EINVAL;
    struct region_table *t = &e->regions;
    pthread_mutex_lock(&t->mu);
    int rc = r->dead ? -XFER_ENOENT : 0;
    if (!rc) {
        r->detached = true;
        __atomic_store_n(&r->dead, true, __ATOMIC_SEQ_CST); /* region_pin_n */
        table_remove(t, r);
    }
    pthread_mutex_unlock(&t->mu);
    if (!rc)
        region_withdraw_direct(e, r);
    return rc;
}

bool xfer_region_dying(xfer_region *r)
{
    pthread_mutex_lock(&r->engine->regions.mu);
    bool dead = r->dead;
    pthread_mutex_unlock(&r->engine->regions.mu);
    return dead;
}

int xfer_engine_regions_dying(const xfer_engine *e)
{
    return __atomic_load_n(&e->regions.dying, __ATOMIC_RELAXED);
}

int xfer_region_deregister(xfer_engine *e, xfer_region *r)
{
    if (!e || !r || r->engine != e)
        return -XFER_EINVAL;
    struct region_table *t = &e->regions;
    pthread_mutex_lock(&t->mu);
    if (r->dead && !r->detached) {
        pthread_mutex_unlock(&t->mu);
        return -XFER_ENOENT;
    }
    bool was_detached = r->dead;
    if (!r->dead)
        table_remove(t, r);
    __atomic_store_n(&r->dead, true, __ATOMIC_SEQ_CST); /* before the pins are read */
    r->detached = false;
    if (!was_detached) { /* detach told the transports already */
        pthread_mutex_unlock(&t->mu);
        region_withdraw_direct(e, r);
        pthread_mutex_lock(&t->mu);
    }
    /* Target accesses are bounded by io_timeout_ms, and ipc peers' pins on
     * a dying region are revoked after it (ipc_serve.c); local batches end
     * by their deadline. Say so if it takes longer. */
    __atomic_add_fetch(&t->dying, 1, __ATOMIC_RELAXED);
    __atomic_or_fetch(&r->pins, REGION_PINS_DEAD, __ATOMIC_SEQ_CST); /* unpins wake us now */
    int left;
    while ((left = __atomic_load_n(&r->pins, __ATOMIC_SEQ_CST) & ~REGION_PINS_DEAD) > 0) {
        struct timespec ts = xfer_mono_after_ms(1000 + e->cfg.io_timeout_ms);
        if (pthread_cond_timedwait(&t->unpinned, &t->mu, &ts) == ETIMEDOUT)
            xfer_warn("region %s: deregistration waits for %d accesses", r->name,
                      __atomic_load_n(&r->pins, __ATOMIC_SEQ_CST) & ~REGION_PINS_DEAD);
    }
    __atomic_sub_fetch(&t->dying, 1, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&t->mu);
    transports_dereg(e, r, e->n_transports);
    xfer_debug("region %s deregistered (id %u gen %u)", r->name, r->id, r->gen);
    region_free_memory(r);
    return 0;
}

void region_table_destroy(xfer_engine *e)
{
    struct region_table *t = &e->regions;
    while (t->n > 0)
        xfer_region_deregister(e, t->v[t->n - 1]);
    free(t->v);
    free(t->names);
    t->v = NULL;
    t->names = NULL;
    t->cap = t->cap_names = t->n_names = 0;
}

/* Without the table lock (it was one lock per batch run, every message):
 * the pin is counted first, then dead is read, both seq_cst; detach and
 * deregistration store dead (seq_cst) before the deregistration reads the
 * pins. So either this pin sees dead and takes itself back (an unpin that
 * wakes a waiting deregistration), or the deregistration sees the pin and
 * waits for it: what the table lock ordered before. */
bool region_pin_n(xfer_region *r, int n)
{
    __atomic_add_fetch(&r->pins, n, __ATOMIC_SEQ_CST);
    if (!__atomic_load_n(&r->dead, __ATOMIC_SEQ_CST))
        return true;
    region_unpin_n(r, n);
    return false;
}

/* Without the table lock (a target serving requests on several threads
 * took it twice per request): only the last unpin of a dying region takes
 * it, to wake the deregistration. r may be freed once the count is 0, so
 * only the engine's table is touched after it. */
void region_unpin_n(xfer_region *r, int n)
{
    struct region_table *t = &r->engine->regions;
    if (__atomic_sub_fetch(&r->pins, n, __ATOMIC_SEQ_CST) == REGION_PINS_DEAD) {
        pthread_mutex_lock(&t->mu);
        pthread_cond_broadcast(&t->unpinned);
        pthread_mutex_unlock(&t->mu);
    }
}

bool region_pin(xfer_region *r)
{
    return region_pin_n(r, 1);
}

void region_unpin(xfer_region *r)
{
    region_unpin_n(r, 1);
}

xfer_region *xfer_region_acquire(xfer_engine *e, uint32_t id, uint32_t gen, enum xfer_op op,
                                 uint64_t off, uint64_t len, int *err)
{
    return xfer_region_acquire_by(e, NULL, id, gen, op, off, len, err);
}

/* Table mu held: the 0 or -XFER_E* of an access to region r (NULL: not
 * registered) of generation gen by op, before its ranges are looked at. */
static int acquire_check(const xfer_region *r, uint32_t gen, enum xfer_op op)
{
    if (!r)
        return -XFER_ENOENT;
    if (r->gen != gen)
        return -XFER_ESTALE;
    if (!(r->access & (op == XFER_OP_READ ? XFER_ACCESS_R : XFER_ACCESS_W)) ||
        (op != XFER_OP_READ && op != XFER_OP_WRITE))
        return -XFER_EACCES;
    return 0;
}

xfer_region *xfer_region_acquire_segs_by(xfer_engine *e, const char *peer, uint32_t id,
                                         uint32_t gen, enum xfer_op op, const struct xfer_range *v,
                                         size_t n, size_t *bad, int *err)
{
    struct region_table *t = &e->regions;
    *bad = SIZE_MAX;
    pthread_mutex_lock(&t->mu);
    xfer_region *r = table_get(t, id);
    int rc = acquire_check(r, gen, op);
    for (size_t k = 0; rc == 0 && k < n; k++) { /* one lock for the whole list */
        if (!xfer_range_ok(v[k].off, v[k].len, r->len))
            rc = -XFER_ERANGE;
        else if (r->guards)
            rc = guard_check(r, peer, v[k].off, v[k].len);
        if (rc)
            *bad = k;
    }
    if (rc == 0)
        __atomic_add_fetch(&r->pins, 1, __ATOMIC_SEQ_CST); /* unpins take no lock */
    pthread_mutex_unlock(&t->mu);
    *err = rc;
    return rc ? NULL : r;
}

xfer_region *xfer_region_acquire_hull_by(xfer_engine *e, const char *peer, uint32_t id,
                                         uint32_t gen, enum xfer_op op, uint64_t off, uint64_t len,
                                         bool *need_list, int *err)
{
    struct region_table *t = &e->regions;
    *need_list = false;
    pthread_mutex_lock(&t->mu);
    xfer_region *r = table_get(t, id);
    int rc = acquire_check(r, gen, op);
    if (rc == 0 && !xfer_range_ok(off, len, r->len))
        rc = -XFER_ERANGE;
    else if (rc == 0 && r->guards && guard_check(r, peer, off, len) != 0)
        *need_list = true; /* the ranges may avoid what the hull touches */
    else if (rc == 0)
        __atomic_add_fetch(&r->pins, 1, __ATOMIC_SEQ_CST); /* unpins take no lock */
    pthread_mutex_unlock(&t->mu);
    *err = rc;
    return rc || *need_list ? NULL : r;
}

xfer_region *xfer_region_acquire_by(xfer_engine *e, const char *peer, uint32_t id, uint32_t gen,
                                    enum xfer_op op, uint64_t off, uint64_t len, int *err)
{
    struct region_table *t = &e->regions;
    int rc = 0;
    pthread_mutex_lock(&t->mu);
    xfer_region *r = table_get(t, id);
    if ((rc = acquire_check(r, gen, op)) != 0)
        ; /* rc says why */
    else if (!xfer_range_ok(off, len, r->len))
        rc = -XFER_ERANGE;
    else if ((rc = guard_check(r, peer, off, len)) != 0)
        xfer_debug("region %s [%llu+%llu]: refused to %s: no live lease (ended, released or "
                   "not granted to it)",
                   r->name, (unsigned long long)off, (unsigned long long)len, peer ? peer : "?");
    else
        __atomic_add_fetch(&r->pins, 1, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&t->mu);
    if (err)
        *err = rc;
    return rc ? NULL : r;
}

void xfer_region_release(xfer_region *r)
{
    if (r)
        region_unpin(r);
}

xfer_region *xfer_region_find(xfer_engine *e, const char *name)
{
    if (!e || !name)
        return NULL;
    pthread_mutex_lock(&e->regions.mu);
    xfer_region *r = table_find_name(&e->regions, name);
    pthread_mutex_unlock(&e->regions.mu);
    return r;
}

int xfer_region_set_layout(xfer_region *r, const struct xfer_layout *layout)
{
    if (!r || !layout)
        return -XFER_EINVAL;
    pthread_mutex_lock(&r->engine->regions.mu);
    r->layout = *layout;
    pthread_mutex_unlock(&r->engine->regions.mu);
    return 0;
}

void *xfer_region_ptr(const xfer_region *r)
{
    return r ? r->ptr : NULL;
}
size_t xfer_region_len(const xfer_region *r)
{
    return r ? r->len : 0;
}
bool xfer_region_leased(const xfer_region *r)
{
    return r && (r->access & XFER_ACCESS_LEASED);
}
int xfer_region_memfd(const xfer_region *r)
{
    return r ? r->memfd : -1;
}
uint32_t xfer_region_id(const xfer_region *r)
{
    return r->id;
}
uint32_t xfer_region_gen(const xfer_region *r)
{
    return r->gen;
}
enum xfer_mem_kind xfer_region_kind(const xfer_region *r)
{
    return r->kind;
}
int xfer_region_device(const xfer_region *r)
{
    return r->device;
}

void *xfer_region_transport_data(const xfer_region *r, unsigned bit)
{
    int i = transport_index(bit);
    return i < 0 ? NULL : __atomic_load_n(&r->tdata[i], __ATOMIC_ACQUIRE);
}

void xfer_region_set_transport_data(xfer_region *r, unsigned bit, void *data)
{
    int i = transport_index(bit);
    if (i >= 0)
        __atomic_store_n(&r->tdata[i], data, __ATOMIC_RELEASE);
}

static void describe_locked(const xfer_region *r, struct xfer_region_desc *out)
{
    memset(out, 0, sizeof(*out));
    xfer_copy_str(out->name, sizeof(out->name), r->name); /* per message (an RTS) */
    out->id = r->id;
    out->gen = r->gen;
    out->kind = r->kind;
    out->device = r->device;
    out->addr = (uint64_t)(uintptr_t)r->ptr;
    out->len = r->len;
    out->access = r->access & XFER_ACCESS_RW; /* LEASED is not published */
    out->layout = r->layout;
    /* Transport-published fields (ipc handle text, rkeys). */
    for (size_t i = 0; i < r->engine->n_transports; i++) {
        struct xfer_transport *t = r->engine->transports[i];
        if (t->ops->describe_region)
            t->ops->describe_region(t, r, out);
    }
}

void xfer_region_describe(const xfer_region *r, struct xfer_region_desc *out)
{
    if (!r || !out)
        return;
    pthread_mutex_lock(&r->engine->regions.mu);
    describe_locked(r, out);
    pthread_mutex_unlock(&r->engine->regions.mu);
}

void xfer_region_foreach(xfer_engine *e, void (*fn)(const struct xfer_region_desc *, void *),
                         void *arg)
{
    if (!e || !fn)
        return;
    pthread_mutex_lock(&e->regions.mu);
    for (size_t i = 0; i < e->regions.n; i++) {
        struct xfer_region_desc d;
        describe_locked(e->regions.v[i], &d);
        fn(&d, arg);
    }
    pthread_mutex_unlock(&e->regions.mu);
}
