/* fakeverbs: type-2 memory windows, as a NIC keeps them.
 *
 * ibv_alloc_mw gives an unbound window with a key of its own key space
 * (FV_MW_KEY_BIT | index << 8 | tag). IBV_WR_BIND_MW, run by the QP's sender
 * in send-queue order, binds it over [addr, addr+len) of an MR that has
 * IBV_ACCESS_MW_BIND, with remote access flags and the key the application
 * chose (same index, new tag: ibv_inc_rkey); from then on remote READ/WRITE
 * with that key are served only when they arrive on the QP it was bound on,
 * lie inside the window and are allowed by its access flags — else
 * IBV_WC_REM_ACCESS_ERR at the requester. IBV_WR_LOCAL_INV of the key (or
 * ibv_dealloc_mw, or destroying the QP) unbinds it; binding needs an
 * unbound window. Binds and invalidations take the context's MR lock for
 * writing, so they wait for remote accesses in progress: once the CQE of a
 * LOCAL_INV is polled, no access through the window runs or will run.
 * Errors complete with IBV_WC_MW_BIND_ERR and put the QP in error. An MR
 * with bound windows cannot be deregistered (EBUSY). Type 1 windows
 * (ibv_bind_mw) are not modelled (EOPNOTSUPP).
 *
 * Faults for tests of QP churn around a bind (XFER_FAKEVERBS_MW_FAULT, read
 * once per process, or fv_mw_fault_set): a comma-separated list of KIND:N,
 * each firing once, on the N-th bind of the process (1-based):
 *   post:N  the N-th ibv_post_send of an IBV_WR_BIND_MW fails with ENOMEM
 *           (the QP cannot take it now, as while it is re-established)
 *   bind:N  the N-th bind the NIC runs fails: IBV_WC_MW_BIND_ERR, QP in error
 *   kill:N  the N-th bind the NIC runs finds its QP's link lost first (the
 *           QP dies between the ask and the bind): the QP goes to error, the
 *           bind and everything behind it are flushed, the peer's QP fails
 *   full:N  the N-th ibv_post_send of an RDMA READ or WRITE to a working
 *           QP (RTS) finds the send queue full (ENOMEM), as a NIC whose
 *           queue holds fewer WRs than it granted, or one that counts a WR
 *           as several slots
 * post counts posts of binds; bind and kill count the binds run; full
 * counts READ/WRITE posts to working QPs. Each firing says so on stderr ("fakeverbs:
 * fault: ...") and counts in fv_fault_fired(). */
#include "fv_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MW_INDEX_MAX (1u << 23)

/* ---- faults ------------------------------------------------------------- */

#define FAULTS_MAX 8
static struct {
    pthread_mutex_t lock;
    bool read;
    int n;
    struct {
        enum fv_mw_fault kind;
        unsigned at;
    } v[FAULTS_MAX];
    unsigned posts, runs, rdma, fired;
} faults = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void faults_parse_locked(const char *spec)
{
    faults.n = 0;
    faults.posts = faults.runs = faults.rdma = faults.fired = 0;
    faults.read = true;
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", spec ? spec : "");
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t && faults.n < FAULTS_MAX;
         t = strtok_r(NULL, ",", &save)) {
        char *colon = strchr(t, ':');
        unsigned at = colon ? (unsigned)strtoul(colon + 1, NULL, 10) : 0;
        enum fv_mw_fault k = !colon || !at             ? FV_FAULT_NONE
                             : !strncmp(t, "post:", 5) ? FV_FAULT_POST
                             : !strncmp(t, "bind:", 5) ? FV_FAULT_BIND
                             : !strncmp(t, "kill:", 5) ? FV_FAULT_KILL
                             : !strncmp(t, "full:", 5) ? FV_FAULT_FULL
                                                       : FV_FAULT_NONE;
        if (k == FV_FAULT_NONE)
            fprintf(stderr, "fakeverbs: XFER_FAKEVERBS_MW_FAULT: '%s' ignored\n", t);
        else
            faults.v[faults.n].kind = k, faults.v[faults.n++].at = at;
    }
}

void fv_mw_fault_set(const char *spec)
{
    pthread_mutex_lock(&faults.lock);
    faults_parse_locked(spec);
    pthread_mutex_unlock(&faults.lock);
}

/* Counts an event of kind's counter and returns kind when a fault of that
 * kind is armed for this count, else FV_FAULT_NONE. */
static enum fv_mw_fault fault_at(unsigned *counter, enum fv_mw_fault kind, enum fv_mw_fault other)
{
    pthread_mutex_lock(&faults.lock);
    if (!faults.read)
        faults_parse_locked(getenv("XFER_FAKEVERBS_MW_FAULT"));
    unsigned k = ++*counter;
    enum fv_mw_fault f = FV_FAULT_NONE;
    for (int i = 0; i < faults.n && f == FV_FAULT_NONE; i++)
        if (faults.v[i].at == k && (faults.v[i].kind == kind || faults.v[i].kind == other))
            f = faults.v[i].kind;
    faults.fired += f != FV_FAULT_NONE;
    pthread_mutex_unlock(&faults.lock);
    static const char *const names[] = {"", "post", "bind", "kill", "full"};
    if (f != FV_FAULT_NONE)
        fprintf(stderr, "fakeverbs: fault: %s:%u (%s)\n", names[f], k,
                f == FV_FAULT_POST   ? "memory window bind not posted"
                : f == FV_FAULT_BIND ? "memory window bind failed"
                : f == FV_FAULT_KILL ? "memory window bind flushed: its QP lost its link first"
                                     : "send queue full");
    return f;
}

/* The fault for the next bind posted (post) or run (run), FV_FAULT_NONE. */
enum fv_mw_fault fv_mw_fault_next(bool post)
{
    return post ? fault_at(&faults.posts, FV_FAULT_POST, FV_FAULT_POST)
                : fault_at(&faults.runs, FV_FAULT_BIND, FV_FAULT_KILL);
}

bool fv_fault_sq_full(void)
{
    return fault_at(&faults.rdma, FV_FAULT_FULL, FV_FAULT_FULL) == FV_FAULT_FULL;
}

unsigned fv_fault_fired(void)
{
    pthread_mutex_lock(&faults.lock);
    unsigned n = faults.fired;
    pthread_mutex_unlock(&faults.lock);
    return n;
}

/* ---- windows ------------------------------------------------------------- */

bool fv_is_mw_key(uint32_t key)
{
    return key & FV_MW_KEY_BIT;
}

static uint32_t mw_index(uint32_t key)
{
    return (key & ~FV_MW_KEY_BIT) >> 8;
}

/* The window of key (bound or not) or NULL; mr_lock held. */
static struct fv_mw *mw_at(struct fv_context *c, uint32_t key)
{
    uint32_t i = mw_index(key);
    return fv_is_mw_key(key) && i < c->n_mws ? c->mws[i] : NULL;
}

struct ibv_mw *fv_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type)
{
    if (type != IBV_MW_TYPE_2) {
        errno = type == IBV_MW_TYPE_1 ? EOPNOTSUPP : EINVAL;
        return NULL;
    }
    struct fv_context *c = fv_context_of(pd->context);
    struct fv_mw *m = calloc(1, sizeof(*m));
    if (!m) {
        errno = ENOMEM;
        return NULL;
    }
    pthread_rwlock_wrlock(&c->mr_lock);
    uint32_t i = 1;
    while (i < c->n_mws && c->mws[i])
        i++;
    if (i >= c->n_mws) {
        uint32_t n = c->n_mws ? c->n_mws * 2 : 64;
        struct fv_mw **t = n <= MW_INDEX_MAX ? realloc(c->mws, n * sizeof(*t)) : NULL;
        if (!t) {
            pthread_rwlock_unlock(&c->mr_lock);
            free(m);
            errno = ENOMEM;
            return NULL;
        }
        for (uint32_t k = c->n_mws; k < n; k++)
            t[k] = NULL;
        c->mws = t;
        c->n_mws = n;
    }
    c->key_variant++;
    m->mw.context = pd->context;
    m->mw.pd = pd;
    m->mw.handle = i;
    m->mw.type = IBV_MW_TYPE_2;
    m->mw.rkey = FV_MW_KEY_BIT | i << 8 | c->key_variant;
    c->mws[i] = m;
    pthread_rwlock_unlock(&c->mr_lock);
    return &m->mw;
}

static void unbind_locked(struct fv_mw *m)
{
    if (m->bound && m->mr)
        m->mr->windows--;
    m->bound = false;
    m->qp = NULL;
    m->mr = NULL;
}

int fv_dealloc_mw(struct ibv_mw *mw)
{
    if (!mw)
        return EINVAL;
    struct fv_context *c = fv_context_of(mw->context);
    struct fv_mw *m = container_of(mw, struct fv_mw, mw);
    pthread_rwlock_wrlock(&c->mr_lock); /* waits for accesses through it */
    if (mw->handle < c->n_mws && c->mws[mw->handle] == m)
        c->mws[mw->handle] = NULL;
    unbind_locked(m);
    pthread_rwlock_unlock(&c->mr_lock);
    free(m);
    return 0;
}

int fv_bind_mw(struct ibv_qp *qp, struct ibv_mw *mw, struct ibv_mw_bind *b)
{
    (void)qp, (void)mw, (void)b;
    return EOPNOTSUPP; /* type 1 windows: not modelled */
}

static bool inside(uint64_t addr, uint64_t len, uint64_t base, uint64_t size)
{
    return addr >= base && addr - base <= size && len <= size - (addr - base);
}

int fv_mw_check(struct fv_qp *qp, uint32_t key, uint64_t addr, uint64_t len, int need)
{
    struct fv_mw *m = mw_at(fv_context_of(qp->qp.context), key);
    if (!m || !m->bound || m->key != key || m->qp != qp || m->mw.pd != qp->qp.pd ||
        !(m->access & need) || !inside(addr, len, m->addr, m->len))
        return NAK_ACCESS;
    return NAK_OK;
}

enum ibv_wc_status fv_mw_bind(struct fv_qp *qp, const struct fv_wr *w)
{
    struct fv_context *c = fv_context_of(qp->qp.context);
    const struct ibv_mw_bind_info *b = &w->bind;
    const int remote = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
    enum ibv_wc_status st = IBV_WC_MW_BIND_ERR;
    pthread_rwlock_wrlock(&c->mr_lock); /* waits for accesses in progress */
    struct fv_mw *m = w->mw ? mw_at(c, w->mw->rkey) : NULL;
    struct fv_mr *mr = b->mr ? fv_mr_lookup(c, b->mr->lkey) : NULL;
    bool ok = m && &m->mw == w->mw && !m->bound && m->mw.pd == qp->qp.pd &&
              mw_index(w->rkey) == mw_index(m->mw.rkey) && fv_is_mw_key(w->rkey) && mr &&
              mr->mr.pd == qp->qp.pd && (mr->access & IBV_ACCESS_MW_BIND) &&
              !(b->mw_access_flags & ~remote) &&
              (!(b->mw_access_flags & IBV_ACCESS_REMOTE_WRITE) ||
               (mr->access & IBV_ACCESS_LOCAL_WRITE)) &&
              inside(b->addr, b->length, (uintptr_t)mr->mr.addr, mr->mr.length);
    if (ok) {
        m->bound = true;
        m->key = w->rkey;
        m->mw.rkey = w->rkey;
        m->qp = qp;
        m->mr = mr;
        m->addr = b->addr;
        m->len = b->length;
        m->access = (int)b->mw_access_flags;
        mr->windows++;
        st = IBV_WC_SUCCESS;
    }
    pthread_rwlock_unlock(&c->mr_lock);
    return st;
}

enum ibv_wc_status fv_mw_invalidate(struct fv_qp *qp, uint32_t key)
{
    struct fv_context *c = fv_context_of(qp->qp.context);
    pthread_rwlock_wrlock(&c->mr_lock); /* waits for accesses in progress */
    struct fv_mw *m = mw_at(c, key);
    bool ok = m && m->bound && m->key == key && m->mw.pd == qp->qp.pd;
    if (ok)
        unbind_locked(m);
    pthread_rwlock_unlock(&c->mr_lock);
    return ok ? IBV_WC_SUCCESS : IBV_WC_MW_BIND_ERR;
}

void fv_mw_forget_qp(struct fv_qp *qp)
{
    struct fv_context *c = fv_context_of(qp->qp.context);
    pthread_rwlock_wrlock(&c->mr_lock);
    for (uint32_t i = 0; i < c->n_mws; i++)
        if (c->mws[i] && c->mws[i]->qp == qp)
            unbind_locked(c->mws[i]);
    pthread_rwlock_unlock(&c->mr_lock);
}
