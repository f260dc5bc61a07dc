/*
 * The proxy of a GPU request ring: one thread per ring that takes published
 * requests out in ticket order, groups them into engine batches (one
 * xfer_batch per round, up to batch_max requests, any mix of peers: the
 * engine posts each peer's share over the transport that reaches it), keeps
 * up to outstanding_max requests in flight, and writes every outcome back:
 * the request's completion counter, the ring's error word, the counts, the
 * on_fail report. Only the engine's public API is used.
 *
 * Loop: reap finished batches, take what the ring holds, submit; with
 * nothing to do it spins for spin_us, then sleeps in ppoll() on the
 * eventfds of its running batches and its wake fd, sleep_us at a time
 * (producers do not signal: a request posted while the proxy sleeps waits
 * up to sleep_us). A fence stops the taking until everything before it
 * finished. Teardown: see ring_teardown().
 */
#include "gpu_ring.h"
#include "mono_clock.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

struct px_batch {
    xfer_batch *b;
    struct xfer_ring_slot *reqs; /* the request behind each item */
    uint32_t n;
    bool busy; /* submitted, not reaped */
};

struct ring_proxy {
    struct px_batch *v;
    uint32_t n_batches;
    uint64_t tail;      /* next ticket to take */
    uint64_t in_flight; /* requests in busy batches */
    bool fence_pending;
    struct xfer_ring_slot fence;
    struct pollfd *pfds;
    int64_t last_work_ns;
};

static void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Single writer (the proxy, or stop/free once it is gone): plain
 * increments, published atomically for readers. */
static void bump(uint64_t *v, uint64_t by)
{
    __atomic_store_n(v, __atomic_load_n(v, __ATOMIC_RELAXED) + by, __ATOMIC_RELAXED);
}

/* ---- outcomes ------------------------------------------------------------------ */

/* failed and error before done (release): a waiter that acquired done sees them. */
static void counter_bump(xfer_gpu_ring *r, uint32_t idx, int status)
{
    if (idx >= r->cfg.counters)
        return;
    struct xfer_ring_counter *c = &r->counters[idx];
    if (status < 0) {
        bump(&c->failed, 1);
        __atomic_store_n(&c->error, status, __ATOMIC_RELAXED);
    }
    __atomic_store_n(&c->done, c->done + 1, __ATOMIC_RELEASE);
}

void ring_finish(xfer_gpu_ring *r, const struct xfer_ring_slot *req, int status, const char *why)
{
    if (status == 0) {
        bump(&r->n_completed, 1);
        bump(&r->hdr->completed, 1);
    } else {
        if (!why || !*why)
            why = xfer_strerror(status);
        bump(&r->n_failed, 1);
        bump(&r->hdr->failed, 1);
        int32_t none = 0;
        if (__atomic_compare_exchange_n(&r->hdr->error, &none, status, false, __ATOMIC_RELEASE,
                                        __ATOMIC_RELAXED)) {
            ring_set_error(r, "request tag %llu: %s", (unsigned long long)req->tag, why);
            xfer_warn("gpu ring: first failure: request tag %llu (op %u, %llu bytes): %s",
                      (unsigned long long)req->tag, req->op, (unsigned long long)req->len, why);
        } else {
            xfer_debug("gpu ring: request tag %llu failed: %s", (unsigned long long)req->tag, why);
        }
        if (r->cfg.on_fail)
            r->cfg.on_fail(req, status, why, r->cfg.on_fail_arg);
    }
    counter_bump(r, req->counter, status);
}

static void fence_finish(xfer_gpu_ring *r, const struct xfer_ring_slot *fence)
{
    bump(&r->n_fences, 1);
    counter_bump(r, fence->counter, 0);
}

/* ---- taking requests ------------------------------------------------------------- */

/* The next published request, in ticket order; false when it is not there
 * (yet). The producer stored seq last, with release. */
static bool take_one(xfer_gpu_ring *r, struct ring_proxy *px, struct xfer_ring_slot *out)
{
    struct xfer_ring_slot *s = &r->slots[px->tail & r->dev.mask];
    if (__atomic_load_n(&s->seq, __ATOMIC_ACQUIRE) != px->tail + 1)
        return false;
    *out = *s;
    px->tail++;
    bump(&r->n_taken, 1);
    return true;
}

/* Frees the slots taken so far: producers may write them once they see it. */
static void release_tail(xfer_gpu_ring *r, const struct ring_proxy *px)
{
    __atomic_store_n(&r->hdr->tail, px->tail, __ATOMIC_RELEASE);
}

uint64_t ring_fail_posted(xfer_gpu_ring *r, int err, const char *why)
{
    struct ring_proxy *px = r->px;
    struct xfer_ring_slot q;
    uint64_t n = 0;
    if (!px)
        return 0;
    for (; take_one(r, px, &q); n++)
        ring_finish(r, &q, err, why); /* fences too: counted failed, reported */
    release_tail(r, px);
    return n;
}

/* The engine item for request q, or why it cannot be one. */
static int to_item(xfer_gpu_ring *r, const struct xfer_ring_slot *q, struct xfer_item *it,
                   char *why, size_t why_len)
{
    uint32_t n_loc = __atomic_load_n(&r->n_locals, __ATOMIC_ACQUIRE);
    uint32_t n_rem = __atomic_load_n(&r->n_remotes, __ATOMIC_ACQUIRE);
    if (q->op != XFER_RING_OP_PUT && q->op != XFER_RING_OP_GET) {
        snprintf(why, why_len, "unknown request op %u", q->op);
        return -XFER_EINVAL;
    }
    if (q->counter != XFER_RING_NO_COUNTER && q->counter >= r->cfg.counters) {
        snprintf(why, why_len, "counter %u, the ring has %u", q->counter, r->cfg.counters);
        return -XFER_EINVAL;
    }
    if (q->local >= n_loc || q->remote >= n_rem) {
        snprintf(why, why_len, "region index local %u / remote %u, added %u / %u", q->local,
                 q->remote, n_loc, n_rem);
        return -XFER_EINVAL;
    }
    const struct ring_local *l = &r->locals[q->local];
    const struct ring_remote *m = &r->remotes[q->remote];
    if (!xfer_range_ok(q->local_off, q->len, l->len) ||
        !xfer_range_ok(q->remote_off, q->len, m->len)) {
        snprintf(why, why_len, "[%llu, +%llu) -> [%llu, +%llu) outside %llu / %llu bytes",
                 (unsigned long long)q->local_off, (unsigned long long)q->len,
                 (unsigned long long)q->remote_off, (unsigned long long)q->len,
                 (unsigned long long)l->len, (unsigned long long)m->len);
        return -XFER_ERANGE;
    }
    *it = (struct xfer_item){q->op == XFER_RING_OP_PUT ? XFER_OP_WRITE : XFER_OP_READ,
                             l->region,
                             q->local_off,
                             m->peer,
                             m->id,
                             m->gen,
                             q->remote_off,
                             q->len};
    return 0;
}

/* Adds q to batch pb, or finishes it at once (bad request, zero length). */
static void add_request(xfer_gpu_ring *r, struct px_batch *pb, const struct xfer_ring_slot *q)
{
    struct xfer_item it;
    char why[200];
    int rc = to_item(r, q, &it, why, sizeof(why));
    if (rc == 0 && q->len == 0) {
        ring_finish(r, q, 0, NULL);
        return;
    }
    if (rc == 0) {
        rc = xfer_batch_add(pb->b, &it);
        if (rc < 0)
            snprintf(why, sizeof(why), "%s", xfer_engine_last_error(r->engine));
    }
    if (rc < 0)
        ring_finish(r, q, rc, why);
    else
        pb->reqs[pb->n++] = *q;
}

/* ---- batches -------------------------------------------------------------------- */

static struct px_batch *free_batch(struct ring_proxy *px)
{
    for (uint32_t i = 0; i < px->n_batches; i++)
        if (!px->v[i].busy)
            return &px->v[i];
    return NULL;
}

/* Makes pb reusable. A batch whose items all succeeded is reset (its
 * transports let go of it as they finished); one with failures may still be
 * held by a transport until its io timeout, and a reset would wait for
 * that: it is handed back (free does not wait for holds) and replaced. */
static void recycle(xfer_gpu_ring *r, struct px_batch *pb, bool clean)
{
    if (!clean || xfer_batch_reset(pb->b) < 0) {
        xfer_batch_free(pb->b);
        int rc;
        pb->b = xfer_batch_new(r->engine, &rc);
        if (!pb->b)
            xfer_err("gpu ring: cannot replace a batch: %s", xfer_strerror(rc));
    }
    pb->n = 0;
    pb->busy = false;
}

static void submit(xfer_gpu_ring *r, struct ring_proxy *px, struct px_batch *pb)
{
    int rc = xfer_batch_submit(pb->b, r->cfg.deadline_ms);
    bump(&r->n_batches, 1);
    if (pb->n > __atomic_load_n(&r->n_batch_max, __ATOMIC_RELAXED))
        __atomic_store_n(&r->n_batch_max, pb->n, __ATOMIC_RELAXED);
    if (rc < 0) {
        char why[200];
        snprintf(why, sizeof(why), "submit: %s", xfer_engine_last_error(r->engine));
        for (uint32_t i = 0; i < pb->n; i++)
            ring_finish(r, &pb->reqs[i], rc, why);
        recycle(r, pb, false);
        return;
    }
    pb->busy = true;
    px->in_flight += pb->n;
}

/* Writes the outcome of every item of a finished batch. */
static uint64_t finish_batch(xfer_gpu_ring *r, struct ring_proxy *px, struct px_batch *pb)
{
    uint64_t cancelled = 0;
    bool clean = true;
    for (uint32_t i = 0; i < pb->n; i++) {
        int st = xfer_batch_item_status(pb->b, i);
        cancelled += st == -XFER_ECANCELED;
        clean &= st == 0;
        ring_finish(r, &pb->reqs[i], st, st < 0 ? xfer_batch_item_error(pb->b, i) : NULL);
    }
    px->in_flight -= pb->n;
    recycle(r, pb, clean);
    return cancelled;
}

static bool reap(xfer_gpu_ring *r, struct ring_proxy *px)
{
    bool work = false;
    for (uint32_t i = 0; i < px->n_batches; i++) {
        struct px_batch *pb = &px->v[i];
        if (pb->busy && xfer_batch_poll(pb->b) != -XFER_EINPROGRESS) {
            finish_batch(r, px, pb);
            work = true;
        }
    }
    if (px->fence_pending && px->in_flight == 0) {
        px->fence_pending = false;
        fence_finish(r, &px->fence);
        work = true;
    }
    return work;
}

/* Takes what the ring holds into one batch and submits it. */
static bool drain(xfer_gpu_ring *r, struct ring_proxy *px)
{
    struct px_batch *pb = px->fence_pending ? NULL : free_batch(px);
    if (!pb || !pb->b)
        return false;
    bool took = false;
    struct xfer_ring_slot q;
    while (pb->n < r->cfg.batch_max && px->in_flight + pb->n < r->cfg.outstanding_max &&
           take_one(r, px, &q)) {
        took = true;
        if (q.op != XFER_RING_OP_FENCE) {
            add_request(r, pb, &q);
        } else if (pb->n == 0 && px->in_flight == 0) {
            fence_finish(r, &q);
        } else {
            px->fence_pending = true;
            px->fence = q;
            break;
        }
    }
    if (took)
        release_tail(r, px);
    if (pb->n > 0)
        submit(r, px, pb);
    return took;
}

/* ---- waiting -------------------------------------------------------------------- */

/* Sleeps up to timeout_ns in ppoll on the wake fd and running batches. */
static void sleep_on_batches(xfer_gpu_ring *r, struct ring_proxy *px, int64_t timeout_ns)
{
    nfds_t n = 0;
    px->pfds[n++] = (struct pollfd){.fd = r->wake_fd, .events = POLLIN};
    for (uint32_t i = 0; i < px->n_batches; i++)
        if (px->v[i].busy)
            px->pfds[n++] = (struct pollfd){.fd = xfer_batch_fd(px->v[i].b), .events = POLLIN};
    struct timespec ts = {timeout_ns / 1000000000, timeout_ns % 1000000000};
    if (ppoll(px->pfds, n, &ts, NULL) > 0 && (px->pfds[0].revents & POLLIN)) {
        uint64_t v;
        if (read(r->wake_fd, &v, sizeof(v)) < 0)
            xfer_debug("gpu ring: wake fd: %s", strerror(errno));
    }
}

static void idle(xfer_gpu_ring *r, struct ring_proxy *px)
{
    if (xfer_mono_ns() - px->last_work_ns < (int64_t)r->cfg.spin_us * 1000) {
        cpu_relax();
        return;
    }
    sleep_on_batches(r, px, (int64_t)r->cfg.sleep_us * 1000);
}

/* ---- teardown -------------------------------------------------------------------- */

/* STOPPING: requests queued in the ring (and a pending fence) are failed
 * without starting; running batches get drain_ms to finish, then are
 * cancelled (xfer_batch_cancel returns once no transport touches their
 * memory) and their unfinished requests fail with -XFER_ECANCELED; the ring
 * is emptied once more; STOPPED. Every counter is final before STOPPED is
 * published, so waiters that see STOPPED know nothing more will come. */
static void ring_teardown(xfer_gpu_ring *r, struct ring_proxy *px)
{
    __atomic_store_n(&r->hdr->state, XFER_RING_STOPPING, __ATOMIC_RELEASE);
    const char *why = "ring stopped before the request started";
    uint64_t unstarted = ring_fail_posted(r, -XFER_ECANCELED, why);
    if (px->fence_pending) {
        px->fence_pending = false;
        ring_finish(r, &px->fence, -XFER_ECANCELED, why);
        unstarted++;
    }
    int64_t deadline = xfer_mono_ns() + (int64_t)r->drain_ms * 1000000;
    for (;;) {
        reap(r, px);
        int64_t left = deadline - xfer_mono_ns();
        if (px->in_flight == 0 || left <= 0)
            break;
        sleep_on_batches(r, px, left < 10000000 ? left : 10000000);
    }
    uint64_t cancelled = 0;
    for (uint32_t i = 0; i < px->n_batches; i++) {
        struct px_batch *pb = &px->v[i];
        if (!pb->busy)
            continue;
        if (xfer_batch_cancel(pb->b) < 0)
            xfer_err("gpu ring: cancel: %s", xfer_engine_last_error(r->engine));
        cancelled += finish_batch(r, px, pb);
    }
    unstarted += ring_fail_posted(r, -XFER_ECANCELED, why);
    r->report.cancelled = cancelled;
    r->report.unstarted = unstarted;
    __atomic_store_n(&r->hdr->state, XFER_RING_STOPPED, __ATOMIC_RELEASE);
}

void *ring_proxy_main(void *arg)
{
    xfer_gpu_ring *r = arg;
    struct ring_proxy *px = r->px;
    char name[16];
    snprintf(name, sizeof(name), "xfer-ring%d", r->cfg.device);
    pthread_setname_np(pthread_self(), name);
    prctl(PR_SET_TIMERSLACK, 1000UL); /* sleeps of sleep_us, not sleep_us + 50 us */
    px->last_work_ns = xfer_mono_ns();
    while (!__atomic_load_n(&r->stop, __ATOMIC_ACQUIRE)) {
        bool work = reap(r, px);
        work |= drain(r, px);
        if (work)
            px->last_work_ns = xfer_mono_ns();
        else
            idle(r, px);
    }
    ring_teardown(r, px);
    return NULL;
}

/* ---- lifetime --------------------------------------------------------------------- */

int ring_proxy_new(xfer_gpu_ring *r)
{
    struct ring_proxy *px = calloc(1, sizeof(*px));
    if (!px)
        return -XFER_ENOMEM;
    r->px = px;
    px->n_batches = (r->cfg.outstanding_max + r->cfg.batch_max - 1) / r->cfg.batch_max;
    px->v = calloc(px->n_batches, sizeof(*px->v));
    px->pfds = calloc(px->n_batches + 1, sizeof(*px->pfds));
    if (!px->v || !px->pfds)
        return -XFER_ENOMEM;
    for (uint32_t i = 0; i < px->n_batches; i++) {
        int rc;
        px->v[i].reqs = calloc(r->cfg.batch_max, sizeof(*px->v[i].reqs));
        px->v[i].b = xfer_batch_new(r->engine, &rc);
        if (!px->v[i].reqs || !px->v[i].b)
            return -XFER_ENOMEM;
    }
    return 0;
}

void ring_proxy_free(xfer_gpu_ring *r)
{
    struct ring_proxy *px = r->px;
    if (!px)
        return;
    for (uint32_t i = 0; px->v && i < px->n_batches; i++) {
        xfer_batch_free(px->v[i].b);
        free(px->v[i].reqs);
    }
    free(px->v);
    free(px->pfds);
    free(px);
    r->px = NULL;
}
