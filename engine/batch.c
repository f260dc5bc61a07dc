/*
 * Batches: lifetime, items, per-item status, chunk accounting and
 * completion (eventfd). Submit is in batch_submit.c, poll and wait in
 * batch_wait.c, deadlines and cancel in batch_deadline.c.
 *
 * States: IDLE (being filled) -> RUNNING (submitted) -> DONE. A running batch
 * becomes DONE when no item is open AND no transport is inside an
 * io_begin/io_end pair on its local memory; so cancel, a deadline or a first
 * error end items at once, but DONE (and the return of cancel) waits until
 * the local memory is no longer touched. Transports keep the batch alive
 * with hold/put while they refer to it; free() only drops the user's hold.
 */
#include "batch.h"
#include "blk_cache.h"
#include "xfer_grow.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

/* ---- lifetime --------------------------------------------------------------- */

/* Kept batches. A batch per message or notification (xfer_send, xfer_recv,
 * xfer_notify, an application's one-item batches) cost a calloc, an item
 * and a name array (the item array of 16 is beyond glibc's per-thread
 * cache) and their frees: ~2k instructions, a quarter of a send/recv
 * round trip's (docs/notify.md, "Per-message allocations"). So
 * xfer_batch_free of a small batch that finished and that nobody else
 * holds resets it and keeps it in one of the engine's slots, and the next
 * xfer_batch_new takes it: the caller cannot tell (its handle is gone
 * either way). Not kept: a batch with more than IDLE_ITEMS items' room,
 * segments, blocks or several bindings; its eventfd is closed (an
 * application may have it in its epoll set). Under AddressSanitizer a kept
 * batch is poisoned, so a use after the free is still caught. */
#define IDLE_ITEMS 16
#define IDLE_N     (sizeof(((xfer_engine *)0)->idle_b) / sizeof(void *))

static xfer_batch *idle_take(xfer_engine *e)
{
    return xfer_slots_take(e->idle_b, IDLE_N, sizeof(xfer_batch));
}

/* The application frees b: true if b was reset and kept. */
static bool idle_keep(xfer_batch *b)
{
    pthread_mutex_lock(&b->mu);
    bool keep = b->state != B_RUNNING && __atomic_load_n(&b->refs, __ATOMIC_ACQUIRE) == 1 &&
                b->cap <= IDLE_ITEMS && b->capnames <= IDLE_ITEMS && !b->capsegs && !b->capblks &&
                !b->capbwords && b->notes.cap <= 1;
    if (keep) { /* as xfer_batch_new leaves it, but for the arrays */
        b->n = b->nnames = 0;
        b->unshared = false;
        b->state = B_IDLE;
        b->result = 0;
        notes_free(&b->notes);
        free(b->whys);
        b->whys = NULL;
        b->nwhys = 0;
        if (b->efd >= 0)
            close(b->efd);
        b->efd = -1;
        b->fd_used = false;
    }
    pthread_mutex_unlock(&b->mu);
    return keep && xfer_slots_offer(b->engine->idle_b, IDLE_N, b, sizeof(*b));
}

void batch_idle_drain(xfer_engine *e)
{
    for (xfer_batch *b; (b = idle_take(e));)
        xfer_batch_put(b);
}

xfer_batch *xfer_batch_new(xfer_engine *e, int *err)
{
    int rc = -XFER_EINVAL;
    xfer_batch *b = NULL;
    if (!e)
        goto out;
    rc = 0;
    if ((b = idle_take(e)))
        goto out;
    rc = -XFER_ENOMEM;
    b = calloc(1, sizeof(*b));
    if (!b)
        goto out;
    b->efd = -1; /* made on first use (batch_efd): most batches never need one */
    b->wake_fd = -1;
    b->engine = e;
    pthread_mutex_init(&b->mu, NULL);
    xfer_cond_init_mono(&b->cv);
    b->refs = 1;
    b->state = B_IDLE;
    rc = 0;
out:
    if (err)
        *err = rc;
    return b;
}

/* b->mu held: b's eventfd, made now if it was never needed before; false
 * if the system has none to give. */
static bool batch_efd(xfer_batch *b)
{
    if (b->efd < 0)
        b->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    return b->efd >= 0;
}

/* Atomic, so that the monitor may take a hold under its own lock. */
void xfer_batch_hold(xfer_batch *b)
{
    __atomic_add_fetch(&b->refs, 1, __ATOMIC_ACQ_REL);
}

void xfer_batch_hold_n(xfer_batch *b, int n)
{
    __atomic_add_fetch(&b->refs, n, __ATOMIC_ACQ_REL);
}

static void batch_destroy(xfer_batch *b);

/* b->mu held: drops n references; true if they were the last (the caller
 * destroys b after letting go of the lock). Under mu, so that whoever drops
 * the last reference frees b only after every other put has left it. */
static bool drop_holds_locked(xfer_batch *b, int n)
{
    int left = __atomic_sub_fetch(&b->refs, n, __ATOMIC_ACQ_REL);
    if (left == 1) /* a resubmit or reset may wait for this */
        pthread_cond_broadcast(&b->cv);
    return left == 0;
}

void xfer_batch_put(xfer_batch *b)
{
    pthread_mutex_lock(&b->mu);
    bool last = drop_holds_locked(b, 1);
    pthread_mutex_unlock(&b->mu);
    if (last)
        batch_destroy(b);
}

/* b->mu held: drops one hold and lets go of mu (xfer_batch_put without
 * taking mu again: a submit ends with both, one lock per message saved). */
void batch_put_unlock(xfer_batch *b)
{
    bool last = drop_holds_locked(b, 1);
    pthread_mutex_unlock(&b->mu);
    if (last)
        batch_destroy(b);
}

static void batch_destroy(xfer_batch *b)
{
    if (b->efd >= 0)
        close(b->efd);
    notes_free(&b->notes);
    pthread_cond_destroy(&b->cv);
    pthread_mutex_destroy(&b->mu);
    free(b->items);
    free(b->segs);
    free(b->blks);
    free(b->bwords);
    free(b->names);
    free(b->whys);
    free(b);
}

void xfer_batch_free(xfer_batch *b)
{
    if (!b || idle_keep(b))
        return;
    xfer_batch_cancel(b);
    xfer_batch_put(b);
}

/* Waits until no transport holds b (stale chunks of an earlier run are
 * bounded by io_timeout_ms). b->mu held. */
int batch_wait_unheld(xfer_batch *b)
{
    if (__atomic_load_n(&b->refs, __ATOMIC_ACQUIRE) <= 1)
        return 0; /* the usual case: no clock read */
    int64_t limit = (int64_t)b->engine->cfg.io_timeout_ms * 1000000 + 2000000000;
    struct timespec ts = xfer_mono_after_ns(limit);
    while (__atomic_load_n(&b->refs, __ATOMIC_ACQUIRE) > 1)
        if (batch_cv_wait(b, &ts) == ETIMEDOUT)
            return __atomic_load_n(&b->refs, __ATOMIC_ACQUIRE) > 1 ? -XFER_EBUSY : 0;
    return 0;
}

int batch_cv_wait(xfer_batch *b, const struct timespec *ts)
{
    b->cv_sleepers++;
    int rc = pthread_cond_timedwait(&b->cv, &b->mu, ts);
    b->cv_sleepers--;
    return rc;
}

int xfer_batch_reset(xfer_batch *b)
{
    if (!b)
        return -XFER_EINVAL;
    pthread_mutex_lock(&b->mu);
    int rc = b->state == B_RUNNING ? -XFER_EBUSY : batch_wait_unheld(b);
    if (rc == 0) {
        b->n = 0;
        b->nsegs = 0;
        b->nblks = b->nbwords = 0;
        b->nnames = 0;
        b->state = B_IDLE;
        notes_free(&b->notes);
    }
    pthread_mutex_unlock(&b->mu);
    return rc;
}

int xfer_batch_truncate(xfer_batch *b, size_t n)
{
    if (!b)
        return -XFER_EINVAL;
    pthread_mutex_lock(&b->mu);
    bool running = b->state == B_RUNNING;
    pthread_mutex_unlock(&b->mu);
    if (running)
        return -XFER_EBUSY;
    batch_truncate(b, n);
    return 0;
}

void batch_truncate(xfer_batch *b, size_t n)
{
    pthread_mutex_lock(&b->mu);
    if (b->state != B_RUNNING && n < b->n) {
        for (size_t i = n; i < b->n; i++) { /* segments and names go with their items */
            if (b->items[i].nseg && !b->items[i].blk && b->items[i].seg0 < b->nsegs)
                b->nsegs = b->items[i].seg0;
            if (b->items[i].blk && b->items[i].blk <= b->nblks) {
                b->nbwords = b->blks[b->items[i].blk - 1].words0;
                b->nblks = b->items[i].blk - 1;
            }
            if (b->items[i].name && b->items[i].name <= b->nnames)
                b->nnames = b->items[i].name - 1;
        }
        b->n = n;
    }
    pthread_mutex_unlock(&b->mu);
}

xfer_engine *batch_engine(const xfer_batch *b)
{
    return b->engine;
}

/* READ/WRITE items need an op and a peer; SEND/RECV items (batch_msg.c)
 * were checked by their adder (a RECV may name no peer). */
int batch_item_check(xfer_engine *e, const struct xfer_item *it, uint8_t kind)
{
    bool rma_ok = (it->op == XFER_OP_READ || it->op == XFER_OP_WRITE) && it->peer;
    if ((kind == BK_RMA && !rma_ok) || !it->local || it->local->engine != e ||
        (it->peer && it->peer->engine != e)) {
        xfer_engine_set_error(e, "batch item: bad op, region or peer");
        return -XFER_EINVAL;
    }
    if (!xfer_range_ok(it->local_off, it->len, it->local->len)) {
        xfer_engine_set_error(e, "batch item: local [%llu, +%llu) outside region %s of %zu bytes",
                              (unsigned long long)it->local_off, (unsigned long long)it->len,
                              it->local->name, it->local->len);
        return -XFER_ERANGE;
    }
    return 0;
}

/* Appends n checked items of one kind; returns the first index. With segs
 * (n is 1 then), the item is vectored over segs[0..nseg). */
static int append_items(xfer_batch *b, const struct xfer_item *items, size_t n, uint8_t kind,
                        uint64_t tag, const struct xfer_seg *segs, size_t nseg,
                        const struct xfer_block_list *bl, bool local)
{
    bool shared = !b->unshared;
    if (shared)
        pthread_mutex_lock(&b->mu);
    int rc = 0;
    if (b->state == B_RUNNING)
        rc = -XFER_EBUSY;
    else if (b->n > (size_t)INT_MAX - n)
        rc = -XFER_ENOSPC;
    if (rc == 0 && segs)
        rc = xfer_grow((void **)&b->segs, &b->capsegs, b->nsegs + nseg, sizeof(*b->segs), 256);
    if (rc == 0 && bl)
        rc = blk_reserve_locked(b, bl, n);
    if (rc == 0 && kind != BK_RMA)
        rc = xfer_grow((void **)&b->names, &b->capnames, b->nnames + n, sizeof(*b->names), 16);
    if (rc == 0)
        rc = xfer_grow((void **)&b->items, &b->cap, b->n + n, sizeof(*b->items), 16);
    if (rc == 0) {
        if (b->state == B_DONE) /* adding after a run starts a new one */
            b->state = B_IDLE;
        for (size_t i = 0; i < n; i++) {
            struct batch_item *bi = &b->items[b->n + i];
            memset(bi, 0, sizeof(*bi));
            bi->it = items[i];
            bi->kind = kind;
            bi->tag = tag;
            bi->cap = items[i].len;
            bi->want = items[i].peer;
            bi->local = local;
            if (kind != BK_RMA) { /* a SEND's peer now; a RECV's sender when matched */
                bi->name = (uint32_t)++b->nnames;
                xfer_copy_str(b->names[bi->name - 1], XFER_NAME_MAX,
                              kind == BK_SEND && items[i].peer ? items[i].peer->desc.node_id : "");
            }
        }
        if (segs) {
            memcpy(b->segs + b->nsegs, segs, nseg * sizeof(*segs));
            b->items[b->n].seg0 = b->nsegs;
            b->items[b->n].nseg = (uint32_t)nseg;
            b->nsegs += nseg;
        }
        if (bl)
            blk_store_locked(b, &b->items[b->n], bl, n);
        rc = (int)b->n;
        b->n += n;
    }
    if (shared)
        pthread_mutex_unlock(&b->mu);
    return rc;
}

int xfer_batch_add_many(xfer_batch *b, const struct xfer_item *items, size_t n)
{
    if (!b || (!items && n) || n > INT_MAX)
        return -XFER_EINVAL;
    const xfer_region *ok_local = NULL; /* item_check passed for this pair */
    const xfer_peer *ok_peer = NULL;
    for (size_t i = 0; i < n; i++) {
        const struct xfer_item *it = &items[i];
        /* Block lists come in runs on one region and peer: the full check
         * once per run, then op and bounds. */
        if (it->local == ok_local && it->peer == ok_peer &&
            (it->op == XFER_OP_READ || it->op == XFER_OP_WRITE) &&
            xfer_range_ok(it->local_off, it->len, it->local->len))
            continue;
        int rc = batch_item_check(b->engine, it, BK_RMA);
        if (rc)
            return rc;
        ok_local = it->local;
        ok_peer = it->peer;
    }
    return append_items(b, items, n, BK_RMA, 0, NULL, 0, NULL, false);
}

int xfer_batch_add(xfer_batch *b, const struct xfer_item *it)
{
    return it ? xfer_batch_add_many(b, it, 1) : -XFER_EINVAL;
}

int batch_append(xfer_batch *b, const struct xfer_item *it, uint8_t kind, uint64_t tag, bool local)
{
    int rc = batch_item_check(b->engine, it, kind);
    return rc ? rc : append_items(b, it, 1, kind, tag, NULL, 0, NULL, local);
}

int batch_append_segs(xfer_batch *b, const struct xfer_item *it, const struct xfer_seg *segs,
                      size_t n)
{
    return append_items(b, it, 1, BK_RMA, 0, segs, n, NULL, false);
}

int batch_append_blocks(xfer_batch *b, const struct xfer_item *items,
                        const struct xfer_block_list *lists, size_t n)
{
    return append_items(b, items, n, BK_RMA, 0, NULL, 0, lists, false);
}

size_t xfer_batch_count(const xfer_batch *b)
{
    return b ? b->n : 0;
}

/* ---- completion ------------------------------------------------------------- */

/* Counts the items gathered by run_count. b->mu held. */
static void run_flush(xfer_batch *b)
{
    if (b->run.items)
        stats_count_items(b->run.sets, b->run.nsets, b->run.op, b->run.items, b->run.bytes,
                          b->run.lat_us);
    b->run.items = 0;
}

/* A successful item ended in a run: gathered with the previous ones if
 * they are alike (same statistics, op and latency), else those are counted
 * first. b->mu held. */
static void run_count(xfer_batch *b, struct stats_set *const *sets, size_t nsets, enum xfer_op op,
                      uint64_t bytes, uint64_t lat_us)
{
    bool like = b->run.items && b->run.nsets == nsets && b->run.op == op && b->run.lat_us == lat_us;
    for (size_t j = 0; like && j < nsets; j++)
        like = b->run.sets[j] == sets[j];
    if (!like) {
        run_flush(b);
        for (size_t j = 0; j < nsets; j++)
            b->run.sets[j] = sets[j];
        b->run.nsets = nsets;
        b->run.op = op;
        b->run.lat_us = lat_us;
        b->run.bytes = 0;
    }
    b->run.items++;
    b->run.bytes += bytes;
}

void batch_item_end(xfer_batch *b, size_t i, int status, const char *why)
{
    struct batch_item *bi = &b->items[i];
    if (!bi->open)
        return;
    __atomic_store_n(&bi->open, false, __ATOMIC_RELAXED); /* read unlocked: item_live */
    bi->status = status;
    if (status < 0 && !b->whys) {
        b->whys = calloc(b->n, sizeof(*b->whys)); /* NULL: the code's text stands in */
        b->nwhys = b->whys ? b->n : 0;
    }
    if (status < 0 && i < b->nwhys)
        snprintf(b->whys[i], sizeof(b->whys[i]), "%s", why && *why ? why : xfer_strerror(status));
    b->n_open--;
    xfer_engine *e = b->engine;
    int64_t now = b->run.now_ns ? b->run.now_ns : xfer_mono_ns();
    uint64_t lat_us = (uint64_t)(now - b->t_submit_ns) / 1000;
    uint64_t bytes = status == 0 ? bi->it.len : 0;
    struct stats_set *sets[3] = {&e->stats};
    size_t nsets = 1;
    if (bi->it.peer) /* NULL: a RECV from any peer that matched nothing */
        sets[nsets++] = &bi->it.peer->stats;
    int ti = transport_index(bi->tbit);
    if (ti >= 0)
        sets[nsets++] = &e->tstats[ti];
    if (status == 0 && b->run.now_ns)
        run_count(b, sets, nsets, bi->it.op, bytes, lat_us);
    else
        stats_count_item(sets, nsets, bi->it.op, bytes, status, lat_us);
    batch_msg_item_end(b, i, status);
}

void batch_end_open_items(xfer_batch *b, int status, const char *why)
{
    for (size_t i = 0; i < b->n; i++)
        batch_item_end(b, i, status, why);
}

/* Declares the batch DONE once nothing is open or touched, without waking
 * waiters: true if it did. b->mu held. */
static bool finish_quiet(xfer_batch *b)
{
    if (b->state != B_RUNNING || b->n_open > 0 || b->io_active > 0 || b->notes.n_unacked > 0)
        return false;
    run_flush(b); /* counted before anyone can see the batch done */
    b->result = 0;
    for (size_t i = 0; i < b->n && b->result == 0; i++)
        if (b->items[i].status < 0)
            b->result = b->items[i].status;
    for (size_t i = 0, j; i < b->n; i = j) { /* one lock per run on a region */
        xfer_region *r = b->items[i].it.local;
        for (j = i + 1; j < b->n && b->items[j].it.local == r; j++)
            ;
        region_unpin_n(r, (int)(j - i));
    }
    if (b->result == 0)
        b->result = notes_result(&b->notes);
    batch_monitor_unlink(b->engine, b);
    /* Stored after the result and the unpins: a waiter that reads DONE
     * unlocked (xfer_batch_wait) reads the result and finds its regions
     * free; read unlocked by xfer_batch_running too. */
    __atomic_store_n(&b->state, B_DONE, __ATOMIC_RELEASE);
    /* The eventfd costs a system call per batch: only once someone has it. */
    uint64_t one = 1;
    if (b->fd_used && write(b->efd, &one, sizeof(one)) < 0)
        xfer_debug("batch eventfd write failed");
    /* The waiter's poll needs waking, unless the waiter itself is the one
     * that finished b (it read the answer: no system call for nobody). */
    bool wake = b->wait_polling && batch_polling != b;
    if (wake && write(b->wake_fd, &one, sizeof(one)) < 0)
        xfer_debug("waiter eventfd write failed");
    b->wake_hit |= wake;
    return true;
}

/* finish_quiet() and wake the waiters. b->mu held. */
void batch_maybe_finish(xfer_batch *b)
{
    if (finish_quiet(b))
        pthread_cond_broadcast(&b->cv);
}

/* True if b became DONE (waiters not woken yet). b->mu held. */
static bool chunk_done_locked(xfer_batch *b, size_t i, uint64_t bytes, int status, const char *why)
{
    bool done = false;
    if (b->state == B_RUNNING && i < b->n && b->items[i].open) {
        struct batch_item *bi = &b->items[i];
        if (status < 0) {
            batch_item_end(b, i, status, why);
        } else {
            bi->done += bytes;
            if (bi->done >= bi->it.len)
                batch_item_end(b, i, 0, NULL);
        }
        done = finish_quiet(b);
    }
    return done;
}

/* Long enough for "segment N: " and a transport's reason. */
#define BATCH_SEG_WHY 256

void xfer_batch_seg_fail(xfer_batch *b, size_t i, size_t k, int status, const char *why)
{
    char named[BATCH_SEG_WHY];
    snprintf(named, sizeof(named), "segment %zu: %s", k, why && *why ? why : xfer_strerror(status));
    pthread_mutex_lock(&b->mu);
    bool seg = b->state == B_RUNNING && i < b->n && b->items[i].open && k < b->items[i].nseg;
    if (seg)
        b->items[i].bad_seg = (int32_t)k;
    bool done = chunk_done_locked(b, i, 0, status, seg ? named : why);
    pthread_mutex_unlock(&b->mu);
    if (done)
        pthread_cond_broadcast(&b->cv);
}

void xfer_batch_chunk_done(xfer_batch *b, size_t i, uint64_t bytes, int status, const char *why)
{
    pthread_mutex_lock(&b->mu);
    if (chunk_done_locked(b, i, bytes, status, why))
        pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

/* One lock round per run of chunks of the same batch, the holds dropped in
 * it too. The waiter is woken after b->mu is let go (one hold kept until
 * then keeps b alive), so it does not wake into a held lock: that cost two
 * more futex calls and a context switch per small batch. */
void xfer_batch_chunks_done_put(const struct xfer_chunk_end *v, size_t n)
{
    for (size_t s = 0, e; s < n; s = e) {
        xfer_batch *b = v[s].b;
        for (e = s + 1; e < n && v[e].b == b; e++)
            ;
        pthread_mutex_lock(&b->mu);
        bool done = false;
        b->run.now_ns = xfer_mono_ns();
        for (size_t k = s; k < e; k++)
            done |= chunk_done_locked(b, v[k].i, v[k].bytes, v[k].status, v[k].why);
        run_flush(b);
        b->run.now_ns = 0;
        /* A hold is kept past the unlock to wake the sleepers on cv; with
         * none (a message's waiter polls its socket, or has not come yet)
         * it goes now: no lock round for it (one per message). */
        if (done && b->cv_sleepers == 0)
            done = false;
        bool last = drop_holds_locked(b, (int)(e - s) - done);
        pthread_mutex_unlock(&b->mu);
        if (done) {
            pthread_cond_broadcast(&b->cv);
            xfer_batch_put(b);
        } else if (last) {
            batch_destroy(b);
        }
    }
}

void xfer_batch_chunk_done_put(xfer_batch *b, size_t i, uint64_t bytes, int status, const char *why)
{
    struct xfer_chunk_end one = {b, i, bytes, status, why};
    xfer_batch_chunks_done_put(&one, 1);
}

bool xfer_batch_io_begin(xfer_batch *b, size_t i)
{
    pthread_mutex_lock(&b->mu);
    bool live = b->state == B_RUNNING && i < b->n && b->items[i].open;
    if (live)
        b->io_active++;
    pthread_mutex_unlock(&b->mu);
    return live;
}

void xfer_batch_io_end_n(xfer_batch *b, int n)
{
    pthread_mutex_lock(&b->mu);
    b->io_active -= n;
    batch_maybe_finish(b);
    pthread_mutex_unlock(&b->mu);
}

void xfer_batch_io_end(xfer_batch *b, size_t i)
{
    (void)i;
    xfer_batch_io_end_n(b, 1);
}

bool xfer_batch_item_live(const xfer_batch *b, size_t i)
{
    return i < b->n && __atomic_load_n(&b->items[i].open, __ATOMIC_RELAXED) &&
           !__atomic_load_n(&b->stopping, __ATOMIC_ACQUIRE);
}

bool xfer_batch_item_open(const xfer_batch *b, size_t i)
{
    return i < b->n && __atomic_load_n(&b->items[i].open, __ATOMIC_RELAXED);
}

uint32_t xfer_batch_seq(const xfer_batch *b)
{
    return b->seq;
}

const struct xfer_item *xfer_batch_item(const xfer_batch *b, size_t i)
{
    return i < b->n ? &b->items[i].it : NULL;
}

int xfer_batch_fd(const xfer_batch *b)
{
    if (!b)
        return -1;
    xfer_batch *m = (xfer_batch *)b; /* const in the API; fd_used is bookkeeping */
    pthread_mutex_lock(&m->mu);
    if (!m->fd_used && batch_efd(m)) { /* from now on kept up to date; catch up once */
        m->fd_used = true;
        uint64_t one = 1;
        if (m->state == B_DONE && write(m->efd, &one, sizeof(one)) < 0)
            xfer_debug("batch eventfd write failed");
    }
    int fd = m->efd;
    pthread_mutex_unlock(&m->mu);
    if (fd < 0)
        xfer_engine_set_error(m->engine, "batch fd: eventfd failed");
    return fd;
}

int xfer_batch_item_status(const xfer_batch *b, size_t i)
{
    if (!b)
        return -XFER_EINVAL;
    pthread_mutex_lock((pthread_mutex_t *)&b->mu);
    int rc = i < b->n ? b->items[i].status : -XFER_ENOENT;
    pthread_mutex_unlock((pthread_mutex_t *)&b->mu);
    return rc;
}

unsigned xfer_batch_item_transport(const xfer_batch *b, size_t i)
{
    if (!b)
        return 0;
    pthread_mutex_lock((pthread_mutex_t *)&b->mu);
    unsigned t = i < b->n ? b->items[i].tbit : 0;
    pthread_mutex_unlock((pthread_mutex_t *)&b->mu);
    return t;
}

const char *xfer_batch_item_error(const xfer_batch *b, size_t i)
{
    if (!b || i >= b->n)
        return "no such item";
    const struct batch_item *bi = &b->items[i];
    if (bi->status == 0)
        return "";
    if (bi->status == -XFER_EINPROGRESS)
        return xfer_strerror(bi->status);
    const char *why = batch_item_why(b, i);
    return *why ? why : xfer_strerror(bi->status);
}

const char *batch_item_why(const xfer_batch *b, size_t i)
{
    return i < b->nwhys && i < b->n ? b->whys[i] : "";
}

/* ---- convenience ------------------------------------------------------------ */

static int one_item(xfer_engine *e, enum xfer_op op, xfer_region *local, uint64_t local_off,
                    xfer_peer *p, uint32_t remote_id, uint32_t remote_gen, uint64_t remote_off,
                    uint64_t len, int deadline_ms)
{
    int rc;
    xfer_batch *b = xfer_batch_new(e, &rc);
    if (!b)
        return rc;
    b->unshared = true; /* until the submit */
    struct xfer_item it = {op, local, local_off, p, remote_id, remote_gen, remote_off, len};
    rc = xfer_batch_add(b, &it);
    if (rc >= 0)
        rc = batch_submit_wait(b, deadline_ms);
    if (rc < 0 && b->n > 0 && batch_item_why(b, 0)[0])
        xfer_engine_set_error(e, "%s", batch_item_why(b, 0));
    xfer_batch_free(b);
    return rc;
}

int xfer_read(xfer_engine *e, xfer_region *local, uint64_t local_off, xfer_peer *p,
              uint32_t remote_id, uint32_t remote_gen, uint64_t remote_off, uint64_t len,
              int deadline_ms)
{
    return one_item(e, XFER_OP_READ, local, local_off, p, remote_id, remote_gen, remote_off, len,
                    deadline_ms);
}

int xfer_write(xfer_engine *e, xfer_region *local, uint64_t local_off, xfer_peer *p,
               uint32_t remote_id, uint32_t remote_gen, uint64_t remote_off, uint64_t len,
               int deadline_ms)
{
    return one_item(e, XFER_OP_WRITE, local, local_off, p, remote_id, remote_gen, remote_off, len,
                    deadline_ms);
}
