/*
 * Submitting a batch: a run starts (regions pinned, items opened, the
 * deadline monitor told) and the READ/WRITE items go to their peers'
 * transports, grouped by peer; SEND/RECV items go through batch_msg.c.
 */
#include "batch.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* ---- submit ----------------------------------------------------------------- */

static int item_peer_cmp(const void *a, const void *b, void *arg)
{
    const struct batch_item *items = arg;
    uintptr_t pa = (uintptr_t)items[*(const size_t *)a].it.peer;
    uintptr_t pb = (uintptr_t)items[*(const size_t *)b].it.peer;
    return pa < pb ? -1 : pa > pb;
}

/* The remote half of caps_fit for the last remote region id seen: items of
 * a block list come in runs on one region, so one lookup per run. */
struct caps_memo {
    bool valid;
    uint32_t id;
    unsigned need;
};

/* Can the peer's transport move the memory of item i? */
static bool caps_fit(xfer_peer *p, unsigned caps, const struct xfer_item *it, struct caps_memo *m)
{
    const unsigned both = XFER_CAP_HOST_MEM | XFER_CAP_CUDA_MEM;
    if ((caps & both) == both)
        return true; /* moves either kind: no look-up of the peer's region (a lock round) */
    unsigned need = it->local->kind == XFER_MEM_CUDA ? XFER_CAP_CUDA_MEM : XFER_CAP_HOST_MEM;
    if (!m->valid || m->id != it->remote_id) {
        struct xfer_region_brief rd;
        m->need = xfer_peer_region_brief(p, it->remote_id, &rd) < 0 ? 0
                  : rd.kind == XFER_MEM_CUDA                        ? XFER_CAP_CUDA_MEM
                                                                    : XFER_CAP_HOST_MEM;
        m->id = it->remote_id;
        m->valid = true;
    }
    need |= m->need;
    return (caps & need) == need;
}

static void fail_items(xfer_batch *b, const size_t *idx, size_t n, int rc, const char *why)
{
    for (size_t k = 0; k < n; k++)
        xfer_batch_chunk_done(b, idx[k], 0, rc, why);
}

void batch_post_to_peer(xfer_batch *b, xfer_peer *p, size_t *idx, size_t n)
{
    char why[160];
    pthread_rwlock_rdlock(&p->conn_lock);
    struct xfer_conn *c = p->conn;
    if (!c) {
        snprintf(why, sizeof(why), "peer %s is not connected", p->desc.node_id);
        fail_items(b, idx, n, -XFER_ECONN, why);
        goto unlock;
    }
    const struct xfer_transport_ops *ops = c->transport->ops;
    size_t m = 0;
    struct caps_memo memo = {0};
    for (size_t k = 0; k < n; k++) {
        bool blocks_ok = !b->items[idx[k]].blk || (ops->caps & XFER_CAP_BLOCKS);
        if (!blocks_ok || !caps_fit(p, ops->caps, &b->items[idx[k]].it, &memo)) {
            snprintf(why, sizeof(why),
                     blocks_ok ? "transport %s cannot move this memory kind"
                               : "transport %s cannot expand block items (add segments instead)",
                     ops->name);
            xfer_batch_chunk_done(b, idx[k], 0, -XFER_ENOTSUP, why);
            continue;
        }
        if (!batch_item_remote_ok(b, idx[k], p))
            continue;
        b->items[idx[k]].tbit = ops->bit;
        idx[m++] = idx[k];
    }
    if (m == 0)
        goto unlock;
    int rc = ops->post(c, b, idx, m);
    if (rc < 0) {
        snprintf(why, sizeof(why), "%s post to %s: %s", ops->name, p->desc.node_id,
                 xfer_strerror(rc));
        fail_items(b, idx, m, rc, why);
        if (rc == -XFER_ECONN)
            peer_repair_kick(p);
    }
unlock:
    pthread_rwlock_unlock(&p->conn_lock);
}

/* Moves b to RUNNING and pins the local regions. b->mu held. */
static int start_run(xfer_batch *b, int deadline_ms)
{
    int rc = batch_wait_unheld(b);
    if (rc < 0)
        return rc;
    for (size_t i = 0, j; i < b->n; i = j) { /* one pin per run on a region */
        xfer_region *r = b->items[i].it.local;
        for (j = i + 1; j < b->n && b->items[j].it.local == r; j++)
            ;
        if (!region_pin_n(r, (int)(j - i))) {
            while (i-- > 0)
                region_unpin(b->items[i].it.local);
            xfer_engine_set_error(b->engine, "batch item %zu: local region deregistered", j - 1);
            return -XFER_ENOENT;
        }
    }
    uint64_t drain;
    if (b->fd_used && read(b->efd, &drain, sizeof(drain)) < 0 && errno != EAGAIN)
        xfer_debug("batch eventfd drain failed");
    free(b->whys); /* sized for this run's items at the first failure */
    b->whys = NULL;
    b->nwhys = 0;
    b->all_rma = true;
    for (size_t i = 0; i < b->n; i++) {
        struct batch_item *bi = &b->items[i];
        bi->status = -XFER_EINPROGRESS;
        bi->open = true;
        bi->done = 0;
        bi->tbit = 0;
        bi->bad_seg = -1;
        b->all_rma &= bi->kind == BK_RMA;
    }
    b->deadline_ms = deadline_ms > 0 ? deadline_ms : b->engine->cfg.default_deadline_ms;
    b->t_submit_ns = xfer_mono_ns();
    b->deadline_ns = b->t_submit_ns + (int64_t)b->deadline_ms * 1000000;
    b->n_open = b->n;
    b->io_active = 0;
    do /* 0 means "no batch" on the wire */
        b->seq = __atomic_add_fetch(&b->engine->batch_seq, 1, __ATOMIC_RELAXED);
    while (b->seq == 0);
    __atomic_store_n(&b->stopping, false, __ATOMIC_RELAXED);
    b->result = -XFER_EINPROGRESS;
    __atomic_store_n(&b->state, B_RUNNING, __ATOMIC_RELEASE); /* read unlocked */
    b->wait_conn = NULL;
    b->wait_chan = NULL;
    b->wait_many = false;
    batch_msg_start(b);
    return 0;
}

/* Items that are all locally completed SENDs (XFER_SEND_LOCAL), no
 * bindings: such a run usually ends inside its own submit (its frames are
 * written at msg_direct_end), so the deadline monitor is told only if it
 * has not ended by then (xfer_batch_submit): two monitor locks per message
 * saved. Nothing in the submit waits for the monitor (frames are queued
 * when they cannot be written at once), so its deadline still holds. The
 * kinds are read unlocked as below (set before the submit). */
static bool only_local_sends(const xfer_batch *b, size_t n)
{
    bool all = n > 0 && b->notes.n == 0;
    for (size_t i = 0; all && i < n; i++)
        all = b->items[i].kind == BK_SEND && b->items[i].local;
    return all;
}

/* waited: the caller waits for the run at once on this thread and holds
 * b meanwhile (batch_submit_wait): no hold of the submit's own and no
 * deadline monitor (the waiter is it), so no lock round after the posts
 * (three lock rounds per one-item call saved: link, unlink, that one). */
static int submit_run(xfer_batch *b, int deadline_ms, bool waited, bool *link_late)
{
    pthread_mutex_lock(&b->mu);
    int rc = b->state == B_RUNNING ? -XFER_EBUSY : b->n == 0 && b->notes.n == 0 ? -XFER_EINVAL : 0;
    if (rc == 0)
        rc = start_run(b, deadline_ms);
    if (rc == 0)
        b->waited = waited;
    b->unshared = false; /* transports see it from here on */
    size_t n = b->n;
    pthread_mutex_unlock(&b->mu);
    if (rc < 0)
        return rc;
    size_t idx_small[16]; /* small batches (messages, notifications): no malloc */
    size_t *idx = n <= 16 ? idx_small : malloc(n * sizeof(*idx));
    if (!idx) {
        pthread_mutex_lock(&b->mu);
        batch_end_open_items(b, -XFER_ENOMEM, "out of memory at submit");
        batch_maybe_finish(b);
        pthread_mutex_unlock(&b->mu);
        return 0;
    }
    if (!waited)
        xfer_batch_hold(b); /* the batch may finish (and be freed) while we still post */
    *link_late = !waited && only_local_sends(b, n);
    if (!waited && !*link_late)
        batch_monitor_link(b->engine, b);
    size_t n_rma = 0; /* READ/WRITE items; SEND/RECV go through batch_msg.c */
    bool one_peer = true;
    for (size_t i = 0; i < n; i++)
        if (b->items[i].kind == BK_RMA) {
            one_peer &= !n_rma || b->items[i].it.peer == b->items[idx[0]].it.peer;
            idx[n_rma++] = i;
        }
    n = n_rma;
    if (!one_peer) /* group by peer; a batch to one peer (the usual) needs no sort */
        qsort_r(idx, n, sizeof(*idx), item_peer_cmp, b->items);
    for (size_t s = 0, e; s < n; s = e) {
        xfer_peer *p = b->items[idx[s]].it.peer;
        for (e = s + 1; e < n && b->items[idx[e]].it.peer == p; e++)
            ;
        batch_post_to_peer(b, p, idx + s, e - s);
    }
    if (idx != idx_small)
        free(idx);
    if (!b->all_rma)
        batch_msg_submit(b);
    if (waited)
        return 0;
    pthread_mutex_lock(&b->mu);
    if (b->state != B_RUNNING) /* finished already: make sure it is unlinked */
        batch_monitor_unlink(b->engine, b);
    batch_put_unlock(b); /* our hold, under the same lock */
    return 0;
}

static int submit(xfer_batch *b, int deadline_ms, bool waited)
{
    if (!b)
        return -XFER_EINVAL;
    /* Notifications, RTS and FINs the run queues go out from this thread,
     * after the batch lock is let go (msg.c). */
    msg_direct_begin();
    bool link_late = false;
    int rc = submit_run(b, deadline_ms, waited, &link_late);
    msg_direct_end();
    /* (b is the caller's: alive. Linked under b->mu, so an end of the run
     * on another thread either comes before, and it is not linked, or
     * after, and unlinks it.) */
    if (link_late && xfer_batch_running(b)) {
        pthread_mutex_lock(&b->mu);
        if (b->state == B_RUNNING)
            batch_monitor_link(b->engine, b);
        pthread_mutex_unlock(&b->mu);
    }
    return rc;
}

int xfer_batch_submit(xfer_batch *b, int deadline_ms)
{
    return submit(b, deadline_ms, false);
}

int batch_submit_wait(xfer_batch *b, int deadline_ms)
{
    int rc = submit(b, deadline_ms, true);
    return rc < 0 ? rc : batch_wait_submitted(b);
}
