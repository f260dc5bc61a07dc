/*
 * Posting to an ipc connection: items of regions the owner lent for direct
 * copies are copied by the posting thread itself (ipc_direct.c); the rest,
 * and engine messages, queue for the connection's worker (ipc_conn.c).
 */
#include "ipc_conn.h"

#include <stdlib.h>

/* mu held: queues items idx[0..n) for the worker. */
static int queue_locked(struct ipc_conn *c, xfer_batch *b, const size_t *idx, size_t n)
{
    if (c->broken || c->stop)
        return -XFER_ECONN;
    if (c->qlen + n > c->qcap) {
        size_t cap = c->qcap ? c->qcap : 256;
        while (cap < c->qlen + n)
            cap *= 2;
        struct ipc_work *q = malloc(cap * sizeof(*q));
        if (!q)
            return -XFER_ENOMEM;
        for (size_t k = 0; k < c->qlen; k++)
            q[k] = c->q[(c->qhead + k) % c->qcap];
        free(c->q);
        c->q = q;
        c->qhead = 0;
        c->qcap = cap;
    }
    xfer_batch_hold_n(b, (int)n); /* b must outlive our queue entries; put after the report */
    size_t tail = (c->qhead + c->qlen) % c->qcap;
    for (size_t k = 0; k < n; k++) { /* one hold and no division per item */
        c->q[tail] = (struct ipc_work){b, idx[k]};
        tail = tail + 1 == c->qcap ? 0 : tail + 1;
    }
    c->qlen += n;
    if (n)
        pthread_cond_signal(&c->cv);
    return 0;
}

int ipc_conn_queue(struct ipc_conn *c, xfer_batch *b, const size_t *idx, size_t n)
{
    pthread_mutex_lock(&c->mu);
    int rc = queue_locked(c, b, idx, n);
    pthread_mutex_unlock(&c->mu);
    for (size_t k = 0; rc < 0 && k < n; k++)
        xfer_batch_chunk_done(b, idx[k], 0, rc, "ipc: cannot queue the item");
    return rc;
}

/* Posts of up to this many items try direct copies (the latency path). */
#define IPC_DIRECT_POST_MAX 64
/* Bytes one post copies in the posting thread at most: submit stays quick;
 * the rest of a large batch goes to the copy threads (ipc_pool.c), or to
 * the worker without them, which copy in parallel with the caller. */
#define IPC_DIRECT_POST_BYTES (1u << 20)

/* Copies the items the owner lent (d[k] for idx[k]) in this thread; those it
 * withdrew meanwhile go to the worker, which gets the owner's answer. */
static void post_direct(struct ipc_conn *c, xfer_batch *b, const size_t *idx, struct ipc_direct **d,
                        size_t n)
{
    size_t back[IPC_DIRECT_POST_MAX], nb = 0;
    for (size_t k = 0; k < n; k++)
        if (ipc_direct_copy(&c->direct, d[k], b, idx[k]) == 1)
            back[nb++] = idx[k];
    if (nb)
        ipc_conn_queue(c, b, back, nb);
}

static void direct_unget(struct ipc_direct **d, size_t n)
{
    for (size_t k = 0; k < n; k++)
        __atomic_sub_fetch(&d[k]->users, 1, __ATOMIC_ACQ_REL);
}

/* The post's tasks for the copy threads so far go to them; those the pool
 * cannot take go to the worker. */
static void post_publish(struct ipc_conn *c, xfer_batch *b, struct ipc_post *post)
{
    if (!post || ipc_pool_publish(c->t->pool, post) == 0)
        return;
    size_t idx[IPC_DIRECT_POST_MAX], k;
    struct ipc_direct *d[IPC_DIRECT_POST_MAX];
    while ((k = ipc_post_reclaim(post, idx, d, IPC_DIRECT_POST_MAX)) > 0) {
        direct_unget(d, k);
        ipc_conn_queue(c, b, idx, k);
    }
}

/* State of one ipc_conn_post across its windows. */
struct post_state {
    uint64_t budget;       /* bytes the posting thread still copies itself */
    struct ipc_post *post; /* tasks for the copy threads, NULL until the first */
    size_t left;           /* items not yet looked at (room for the post) */
    /* GPU loan items of the windows so far, launched together (one or two
     * launches for the whole post, not per window: 512 plain items were 8
     * launches); gback: room for those the launch leaves to the worker */
    size_t *gpu, *gback, ng, gcap;
    struct ipc_direct **gd;
};

/* Launches the GPU loan items collected so far (ipc_dgpu.c); what it
 * leaves goes to the worker, which asks the owner. */
static void post_gpu_flush(struct ipc_conn *c, xfer_batch *b, struct post_state *ps)
{
    size_t nback = ps->ng ? ipc_dgpu_post(c, b, ps->gpu, ps->gd, ps->ng, ps->gback) : 0;
    if (nback) /* withdrawn meanwhile, or not launched */
        ipc_conn_queue(c, b, ps->gback, nback);
    ps->ng = 0;
}

/* Up to IPC_DIRECT_POST_MAX items: those lent go direct while the budget
 * lasts, then to the post's copy-thread tasks; the rest queue. */
static int post_window(struct ipc_conn *c, xfer_batch *b, const size_t *idx, size_t n,
                       struct post_state *ps)
{
    size_t slow[IPC_DIRECT_POST_MAX], fast[IPC_DIRECT_POST_MAX], pool[IPC_DIRECT_POST_MAX];
    size_t ns = 0, nf = 0, np = 0;
    struct ipc_direct *d[IPC_DIRECT_POST_MAX], *pd[IPC_DIRECT_POST_MAX];
    if (ps->gcap - ps->ng < n) /* no room for another window's GPU items */
        post_gpu_flush(c, b, ps);
    size_t ng0 = ps->ng;
    /* The loans are looked up under their list's read lock, not the mutex
     * (threads posting at once went through it one by one, and slept on
     * it); the mutex is for the worker's queue. A close cannot run
     * meanwhile (the peer's connection lock); broken or stopped a moment
     * later is as if it came after the copy. */
    int rc =
        __atomic_load_n(&c->broken, __ATOMIC_RELAXED) || __atomic_load_n(&c->stop, __ATOMIC_RELAXED)
            ? -XFER_ECONN
            : 0;
    pthread_rwlock_rdlock(&c->direct.lock);
    for (size_t k = 0; rc == 0 && k < n; k++) {
        const struct xfer_item *it = xfer_batch_item(b, idx[k]);
        size_t nseg;               /* vectored items go to the worker: one owner check each */
        struct xfer_block_list bl; /* block items too, but any item of a GPU loan (ipc_dgpu.c) */
        bool vec = xfer_batch_item_segs(b, idx[k], &nseg) != NULL;
        bool blk = !vec && xfer_batch_item_blocks(b, idx[k], &bl), plain = !vec && !blk;
        if (c->direct.head && (ps->gd[ps->ng] = ipc_direct_get_gpu(&c->direct, it))) {
            ps->gpu[ps->ng++] = idx[k];
            continue;
        }
        bool room = it->len <= ps->budget;
        struct ipc_direct *dk =
            plain && c->direct.head && (room || c->t->pool) ? ipc_direct_get(&c->direct, it) : NULL;
        if (dk && room) {
            ps->budget -= it->len;
            d[nf] = dk;
            fast[nf++] = idx[k];
        } else if (dk) {
            pd[np] = dk;
            pool[np++] = idx[k];
        } else {
            slow[ns++] = idx[k];
        }
    }
    pthread_rwlock_unlock(&c->direct.lock);
    /* A dead owner's memory stays mapped here: copying into it would be a
     * silent loss. One poll per window that copies directly (the worker
     * learns it otherwise only from its next round trip), holding no lock:
     * under the connection's mutex, every thread posting on it waited for
     * this one's system call (8 B reads of several callers went slower in
     * sum than one caller's). */
    if (rc == 0 && (nf || np || ps->ng > ng0) && ipc_sock_hung_up(c->fd))
        rc = -XFER_ECONN;
    if (rc == 0 && ns) {
        pthread_mutex_lock(&c->mu);
        rc = queue_locked(c, b, slow, ns);
        pthread_mutex_unlock(&c->mu);
    }
    if (rc < 0) { /* none started: the direct ones are let go unstarted */
        direct_unget(d, nf);
        direct_unget(pd, np);
        direct_unget(ps->gd + ng0, ps->ng - ng0);
        ps->ng = ng0;
        return rc;
    }
    if (np && !ps->post) /* room for every pool item this post can still have */
        ps->post = ipc_post_new(ps->left);
    size_t k = 0;
    while (k < np && ps->post && ipc_post_add(ps->post, c, b, pool[k], pd[k]))
        k++;
    if (k < np) { /* out of memory for the tasks: the worker copies them */
        direct_unget(pd + k, np - k);
        ipc_conn_queue(c, b, pool + k, np - k);
    }
    ps->left -= n;
    if (nf) { /* the threads start on what is queued while we copy */
        post_publish(c, b, ps->post);
        post_direct(c, b, fast, d, nf);
    }
    return 0;
}

int ipc_conn_post(struct xfer_conn *xc, xfer_batch *b, const size_t *idx, size_t n)
{
    struct ipc_conn *c = container_of(xc, struct ipc_conn, base);
    if (!c->direct.ctl) { /* no loans on this connection: all to the worker */
        pthread_mutex_lock(&c->mu);
        int rc = queue_locked(c, b, idx, n);
        pthread_mutex_unlock(&c->mu);
        return rc;
    }
    size_t g_idx[IPC_DIRECT_POST_MAX], g_back[IPC_DIRECT_POST_MAX];
    struct ipc_direct *g_d[IPC_DIRECT_POST_MAX];
    struct post_state ps = {.budget = IPC_DIRECT_POST_BYTES,
                            .left = n,
                            .gpu = g_idx,
                            .gback = g_back,
                            .gd = g_d,
                            .gcap = IPC_DIRECT_POST_MAX};
    void *heap = NULL; /* room for every item's GPU launch (else one per window) */
    if (n > IPC_DIRECT_POST_MAX && (heap = malloc(n * (2 * sizeof(size_t) + sizeof(void *))))) {
        ps.gpu = heap, ps.gback = ps.gpu + n, ps.gd = (struct ipc_direct **)(ps.gback + n);
        ps.gcap = n;
    }
    int rc = 0;
    size_t k = 0;
    for (; k < n; k += IPC_DIRECT_POST_MAX) {
        size_t w = n - k < IPC_DIRECT_POST_MAX ? n - k : IPC_DIRECT_POST_MAX;
        /* spent, and no copy threads to take the rest: it queues in one go
         * (GPU memory here: its block items may be GPU loans) */
        const struct xfer_item *it = xfer_batch_item(b, idx[k]);
        if (!c->t->pool && ps.budget < it->len && xfer_region_kind(it->local) == XFER_MEM_HOST) {
            pthread_mutex_lock(&c->mu);
            rc = queue_locked(c, b, idx + k, n - k);
            pthread_mutex_unlock(&c->mu);
            break;
        }
        if ((rc = post_window(c, b, idx + k, w, &ps)) < 0)
            break;
    }
    if (rc < 0) { /* a later window found the connection gone: none launched */
        direct_unget(ps.gd, ps.ng);
        for (size_t j = 0; j < ps.ng; j++)
            xfer_batch_chunk_done(b, ps.gpu[j], 0, rc, "ipc: cannot queue the item");
        ps.ng = 0;
    }
    post_gpu_flush(c, b, &ps); /* the windows' GPU loan items: one launch per kind */
    free(heap);
    post_publish(c, b, ps.post); /* what the windows left for the threads */
    ipc_post_put(ps.post);
    if (rc < 0 && k == 0)
        return rc; /* nothing started */
    for (size_t j = k; rc < 0 && j < n; j++)
        xfer_batch_chunk_done(b, idx[j], 0, rc, "ipc: cannot queue the item");
    return 0;
}
