/*
 * Stopping a running batch early: the deadline monitor (a thread that ends
 * the runs whose deadline passed) and cancel. Both fence first: no new
 * chunk starts, and each peer written to gets its transport's fence.
 */
#include "batch.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

/* ---- deadline monitor ------------------------------------------------------ */

void batch_monitor_link(xfer_engine *e, xfer_batch *b)
{
    struct batch_monitor *m = &e->monitor;
    pthread_mutex_lock(&m->mu);
    b->mon_prev = NULL;
    b->mon_next = m->head;
    if (m->head)
        m->head->mon_prev = b;
    m->head = b;
    __atomic_store_n(&b->on_monitor, true, __ATOMIC_RELAXED);
    /* Waking the monitor on every submit cost a thread wake-up per batch;
     * it only needs to know of a deadline earlier than its next wake. */
    if (b->deadline_ns < m->wake_ns)
        pthread_cond_signal(&m->cv);
    pthread_mutex_unlock(&m->mu);
}

/* Monitor mu held. */
static void monitor_unlink_locked(struct batch_monitor *m, xfer_batch *b)
{
    if (!__atomic_load_n(&b->on_monitor, __ATOMIC_RELAXED))
        return;
    if (b->mon_prev)
        b->mon_prev->mon_next = b->mon_next;
    else
        m->head = b->mon_next;
    if (b->mon_next)
        b->mon_next->mon_prev = b->mon_prev;
    b->mon_prev = b->mon_next = NULL;
    __atomic_store_n(&b->on_monitor, false, __ATOMIC_RELAXED);
}

void batch_monitor_unlink(xfer_engine *e, xfer_batch *b)
{
    /* Not linked: no lock (a locally completed SEND never is, batch_submit.c).
     * b->mu held by the callers: only the monitor thread (unlinking a batch
     * it expires) or a submit's early link (which checks again under b->mu
     * after it: submit_run) change on_monitor meanwhile; a stale true is
     * checked again under the monitor's lock. */
    if (!__atomic_load_n(&b->on_monitor, __ATOMIC_RELAXED))
        return;
    pthread_mutex_lock(&e->monitor.mu);
    monitor_unlink_locked(&e->monitor, b);
    pthread_mutex_unlock(&e->monitor.mu);
}

static void batch_fence(xfer_batch *b);

void batch_expire(xfer_batch *b)
{
    batch_fence(b);
    pthread_mutex_lock(&b->mu);
    if (b->state == B_RUNNING && (b->n_open > 0 || b->notes.n_unacked > 0)) {
        char why[64];
        snprintf(why, sizeof(why), "deadline of %d ms passed", b->deadline_ms);
        batch_end_open_items(b, -XFER_ETIMEDOUT, why);
        notes_abort(&b->notes, -XFER_ETIMEDOUT, why);
        batch_maybe_finish(b);
    }
    pthread_mutex_unlock(&b->mu);
}

/* Sleeps until the earliest deadline, expires what is due. A deadline fires
 * even if the transport that carries the batch is stuck. */
static void *monitor_main(void *arg)
{
    xfer_engine *e = arg;
    struct batch_monitor *m = &e->monitor;
    pthread_mutex_lock(&m->mu);
    while (!m->stop) {
        int64_t now = xfer_mono_ns(), next = now + 1000000000;
        xfer_batch *due = NULL;
        for (xfer_batch *b = m->head; b; b = b->mon_next) {
            if (b->deadline_ns <= now) {
                due = b;
                break;
            }
            if (b->deadline_ns < next)
                next = b->deadline_ns;
        }
        if (due) {
            monitor_unlink_locked(m, due);
            xfer_batch_hold(due);
            pthread_mutex_unlock(&m->mu);
            batch_expire(due);
            xfer_batch_put(due);
            pthread_mutex_lock(&m->mu);
            continue;
        }
        struct timespec ts = xfer_mono_after_ns(next - now);
        m->wake_ns = next;
        pthread_cond_timedwait(&m->cv, &m->mu, &ts);
        m->wake_ns = 0;
    }
    pthread_mutex_unlock(&m->mu);
    return NULL;
}

int batch_monitor_start(xfer_engine *e)
{
    struct batch_monitor *m = &e->monitor;
    pthread_mutex_init(&m->mu, NULL);
    xfer_cond_init_mono(&m->cv);
    if (pthread_create(&m->thread, NULL, monitor_main, e) != 0) {
        xfer_engine_set_error(e, "cannot start the deadline thread");
        return -XFER_ENOMEM;
    }
    m->started = true;
    return 0;
}

void batch_monitor_stop(xfer_engine *e)
{
    struct batch_monitor *m = &e->monitor;
    if (!m->started)
        return;
    for (;;) { /* cancel what still runs */
        pthread_mutex_lock(&m->mu);
        xfer_batch *b = m->head;
        if (b) {
            monitor_unlink_locked(m, b);
            xfer_batch_hold(b);
        }
        pthread_mutex_unlock(&m->mu);
        if (!b)
            break;
        xfer_batch_cancel(b);
        xfer_batch_put(b);
    }
    pthread_mutex_lock(&m->mu);
    m->stop = true;
    pthread_cond_signal(&m->cv);
    pthread_mutex_unlock(&m->mu);
    pthread_join(m->thread, NULL);
    m->started = false;
}

static int peer_ptr_cmp(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t) * (xfer_peer *const *)a, y = (uintptr_t) * (xfer_peer *const *)b;
    return x < y ? -1 : x > y;
}

/* Cancel and deadline, before the items end: no new chunk of b starts
 * from now on, and each peer b WRITEs to gets its transport's fence (tcp:
 * docs/engine.md, "Cancel and retry"), so no byte of b lands there after
 * anything sent later. No lock held. */
static void batch_fence(xfer_batch *b)
{
    pthread_mutex_lock(&b->mu);
    size_t np = 0;
    xfer_peer **peers = NULL;
    if (b->state == B_RUNNING) {
        __atomic_store_n(&b->stopping, true, __ATOMIC_RELEASE);
        peers = malloc((b->n ? b->n : 1) * sizeof(*peers));
        for (size_t i = 0; peers && i < b->n; i++) {
            const struct batch_item *bi = &b->items[i];
            if (bi->kind == BK_RMA && bi->it.op == XFER_OP_WRITE && bi->open &&
                (np == 0 || peers[np - 1] != bi->it.peer))
                peers[np++] = bi->it.peer;
        }
        if (!peers)
            xfer_warn("batch: no memory to fence a cancelled batch");
    }
    pthread_mutex_unlock(&b->mu);
    if (np > 1)
        qsort(peers, np, sizeof(*peers), peer_ptr_cmp);
    for (size_t k = 0; k < np; k++) {
        if (k > 0 && peers[k] == peers[k - 1])
            continue;
        xfer_peer *p = peers[k];
        pthread_rwlock_rdlock(&p->conn_lock);
        struct xfer_conn *c = p->conn;
        if (c && c->transport->ops->fence)
            c->transport->ops->fence(c, b);
        pthread_rwlock_unlock(&p->conn_lock);
    }
    free(peers);
}

int xfer_batch_cancel(xfer_batch *b)
{
    if (!b)
        return -XFER_EINVAL;
    batch_fence(b);
    pthread_mutex_lock(&b->mu);
    if (b->state != B_RUNNING) {
        pthread_mutex_unlock(&b->mu);
        return 0;
    }
    batch_end_open_items(b, -XFER_ECANCELED, "cancelled");
    notes_abort(&b->notes, -XFER_ECANCELED, "cancelled");
    batch_maybe_finish(b);
    /* io_begin/io_end pairs span one system call each: this is short. */
    int64_t limit = ((int64_t)b->engine->cfg.io_timeout_ms + 2000) * 1000000;
    struct timespec ts = xfer_mono_after_ns(limit);
    while (b->state == B_RUNNING)
        if (batch_cv_wait(b, &ts) == ETIMEDOUT)
            break;
    int rc = b->state == B_RUNNING ? -XFER_EBUSY : 0;
    pthread_mutex_unlock(&b->mu);
    if (rc < 0)
        xfer_engine_set_error(b->engine, "cancel: a transport still touches the memory");
    return rc;
}
