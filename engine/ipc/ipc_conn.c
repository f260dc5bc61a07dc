/*
 * Initiator side of the ipc transport: one unix connection per peer and one
 * worker thread that takes posted items in groups of up to IPC_BATCH_MAX,
 *   1. checks each against the peer's published descriptor (generation,
 *      access, bounds) and the owner's own answer (mapping cache),
 *   2. pins all of them at the owner with one IPC_ACQ_REQ round trip,
 *   3. copies (memcpy on a memfd mapping, process_vm_*v, or async CUDA copies,
 *      all of a group in flight at once),
 *   4. unpins with one IPC_REL and reports each item.
 * Small host items of regions the owner lent for direct copies skip all
 * that: the posting thread copies them itself (ipc_direct.c).
 */
#include "handshake.h"
#include "mono_clock.h"
#include "ipc_conn.h"
#include "xfer_io.h"
#include "xfer_kernels.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

void ipc_job_fail(struct ipc_job *j, int status, const char *fmt, ...)
{
    if (j->status)
        return;
    j->status = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(j->why, sizeof(j->why), fmt, ap);
    va_end(ap);
}

/* The reason an item failed the descriptor check (the rare path: copies the
 * whole descriptor for its name). */
static void job_refuse(struct ipc_conn *c, struct ipc_job *j, unsigned need)
{
    const struct xfer_item *it = &j->it;
    struct xfer_region_desc d;
    if (xfer_peer_region_get(c->base.peer, it->remote_id, &d) < 0)
        return ipc_job_fail(j, -XFER_ENOENT, "remote region %u unknown", it->remote_id);
    if (d.gen != it->remote_gen)
        return ipc_job_fail(j, -XFER_ESTALE, "remote region %s: generation %u, item has %u", d.name,
                            d.gen, it->remote_gen);
    if (!(d.access & need))
        return ipc_job_fail(j, -XFER_EACCES, "remote region %s is '%s'", d.name,
                            xfer_access_str(d.access));
    for (uint32_t k = j->s0; j->segs && k < j->s1; k++) { /* name the segment */
        const struct xfer_seg *s = &j->segs[k];
        if (xfer_range_ok(s->remote_off, s->len, d.len))
            continue;
        j->bad = k;
        return ipc_job_fail(j, -XFER_ERANGE, "remote range %llu+%llu outside %s (%llu bytes)",
                            (unsigned long long)s->remote_off, (unsigned long long)s->len, d.name,
                            (unsigned long long)d.len);
    }
    return ipc_job_fail(j, -XFER_ERANGE, "remote range %llu+%llu outside %s (%llu bytes)",
                        (unsigned long long)it->remote_off, (unsigned long long)it->len, d.name,
                        (unsigned long long)d.len);
}

/* Checks the item against the peer's descriptor and the owner's answer. */
static void job_check(struct ipc_conn *c, struct ipc_job *j)
{
    const struct xfer_item *it = &j->it;
    struct xfer_region_brief d;
    unsigned need = it->op == XFER_OP_READ ? XFER_ACCESS_R : XFER_ACCESS_W;
    if (xfer_peer_region_brief(c->base.peer, it->remote_id, &d) < 0)
        return ipc_job_fail(j, -XFER_ENOENT, "remote region %u unknown", it->remote_id);
    if (d.gen != it->remote_gen || !(d.access & need) ||
        !xfer_range_ok(it->remote_off, it->len, d.len))
        return job_refuse(c, j, need);
    char why[256] = "";
    int rc = ipc_map_find(&c->maps, it->remote_id, it->remote_gen, &j->map);
    if (rc < 0) { /* not mapped yet: ask the owner */
        rc = ipc_link_lock(c, true);
        if (rc == 0)
            rc = ipc_map_get(&c->maps, c->fd, it->remote_id, it->remote_gen, it->op,
                             c->io_timeout_ms, &j->map, why, sizeof(why));
        else
            snprintf(why, sizeof(why), "ipc connection to the owner lost");
        ipc_link_unlock(c, 0); /* a broken socket fails the group's ACQ next */
    }
    if (rc < 0)
        return ipc_job_fail(j, rc, "%s", why);
    const struct ipc_map *m = j->map;
    if (m->ctl_slot != IPC_SLOT_NONE && c->direct.ctl) { /* lent: later items go direct */
        pthread_mutex_lock(&c->mu);
        ipc_direct_note(&c->direct, m);
        pthread_mutex_unlock(&c->mu);
    }
    if (!(m->access & need) || !xfer_range_ok(it->remote_off, it->len, m->len))
        return ipc_job_fail(j, -XFER_ERANGE, "owner's view of region %u differs (len %llu, '%s')",
                            it->remote_id, (unsigned long long)m->len, xfer_access_str(m->access));
    bool cuda = m->mech == IPC_MECH_CUDA || m->mech == IPC_MECH_CUMEM ||
                xfer_region_kind(it->local) == XFER_MEM_CUDA;
    if (cuda && c->t->cuda_devices <= 0)
        return ipc_job_fail(j, -XFER_ENODEV, "no CUDA device in this process");
    if (cuda && m->mech == IPC_MECH_CMA)
        return ipc_job_fail(j, -XFER_ENOTSUP,
                            "GPU memory to a peer's plain host pointer is not supported by ipc; "
                            "register the host region with xfer_region_alloc (memfd)");
}

/* True once the owner closed the connection: it revokes a peer that held a
 * dying region too long (ipc_serve.c), and this process may just be
 * resuming from a stop; its pins are gone, so the memory must not be
 * touched. A zero-timeout poll per copy, cheap next to the copy. */
static bool owner_hung_up(struct ipc_conn *c)
{
    return ipc_sock_hung_up(c->fd);
}

unsigned ipc_conn_state(struct xfer_conn *xc)
{
    struct ipc_conn *c = container_of(xc, struct ipc_conn, base);
    bool broken = __atomic_load_n(&c->broken, __ATOMIC_RELAXED);
    return broken || owner_hung_up(c) ? XFER_CONN_ALL_DEAD : 0;
}

/* Copies len bytes between local and remote_off of j's mapped region:
 * 0 or -XFER_E* with the reason in j->why. */
static int copy_host(struct ipc_conn *c, struct ipc_job *j, char *local, uint64_t remote_off,
                     uint64_t len)
{
    const struct ipc_map *m = j->map;
    if (owner_hung_up(c)) {
        snprintf(j->why, sizeof(j->why), "the owner closed the connection (access revoked?)");
        return -XFER_ECONN;
    }
    if (m->mech == IPC_MECH_MEMFD) {
        char *remote = (char *)m->base + remote_off;
        if (j->it.op == XFER_OP_READ)
            memcpy(local, remote, len);
        else
            memcpy(remote, local, len);
        return 0;
    }
    if (j->it.op == XFER_OP_READ)
        return ipc_cma_read(c->pid, m->addr + remote_off, local, len, j->why, sizeof(j->why));
    return ipc_cma_write(c->pid, m->addr + remote_off, local, len, j->why, sizeof(j->why));
}

/* A plain item, or each segment of a vectored one (the first failing one
 * named). */
static void job_copy_host(struct ipc_conn *c, struct ipc_job *j)
{
    char *base = (char *)xfer_region_ptr(j->it.local);
    if (!j->segs) {
        j->status = copy_host(c, j, base + j->it.local_off, j->it.remote_off, j->it.len);
        return;
    }
    for (uint32_t k = j->s0; k < j->s1 && !j->status; k++) {
        const struct xfer_seg *s = &j->segs[k];
        if ((j->status = copy_host(c, j, base + s->local_off, s->remote_off, s->len)) < 0)
            j->bad = k;
    }
}

/* Local and remote GPU (-1 = host memory) and the remote region's start. */
static char *job_cuda_sides(const struct ipc_job *j, int *ldev, int *rdev)
{
    const struct xfer_item *it = &j->it;
    const struct ipc_map *m = j->map;
    *ldev = xfer_region_kind(it->local) == XFER_MEM_CUDA ? xfer_region_device(it->local) : -1;
    *rdev = m->cuda ? ipc_cuda_import_device(m->cuda) : -1;
    return (char *)(m->cuda ? ipc_cuda_import_ptr(m->cuda) : m->base);
}

/* Starts one CUDA copy of len bytes between local and remote_off: a ticket
 * or -XFER_E* with the reason in j->why. */
static int cuda_start(struct ipc_conn *c, struct ipc_job *j, char *local, uint64_t remote_off,
                      uint64_t len)
{
    int ldev, rdev;
    char *remote = job_cuda_sides(j, &ldev, &rdev) + remote_off;
    int rc = 0;
    if (!c->copier)
        c->copier = ipc_cuda_copier_new(&rc, &c->mu, &c->cv);
    if (rc == 0 && j->it.op == XFER_OP_READ)
        rc = ipc_cuda_copy_start(c->copier, local, ldev, remote, rdev, rdev, len, j->why,
                                 sizeof(j->why));
    else if (rc == 0)
        rc = ipc_cuda_copy_start(c->copier, remote, rdev, local, ldev, rdev, len, j->why,
                                 sizeof(j->why));
    return rc;
}

static void job_copy_cuda(struct ipc_conn *c, struct ipc_job *j, char *local)
{
    int rc = cuda_start(c, j, local, j->it.remote_off, j->it.len);
    if (rc < 0)
        j->status = rc;
    else
        j->ticket = rc;
}

/* Segment k of vectored job j as its own CUDA copy (its ticket kept in
 * j->tickets, room for every segment of the job); true if started. */
static bool seg_copy_cuda(struct ipc_conn *c, struct ipc_job *j, uint32_t k)
{
    if (j->status)
        return false;
    if (!j->tickets && !(j->tickets = malloc((j->s1 - j->s0) * sizeof(*j->tickets)))) {
        ipc_job_fail(j, -XFER_ENOMEM, "out of memory for copy tickets");
        return false;
    }
    const struct xfer_seg *s = &j->segs[k];
    int rc = cuda_start(c, j, (char *)xfer_region_ptr(j->it.local) + s->local_off, s->remote_off,
                        s->len);
    if (rc < 0) {
        j->status = rc;
        j->bad = k;
        return false;
    }
    j->tickets[j->ntickets++] = rc;
    return true;
}

/* A group of up to IPC_BATCH_MAX items, pinned at the owner together. */
struct ipc_group {
    struct ipc_job *jobs;
    size_t n;
    int rc;                     /* connection error while starting */
    struct ipc_cuda_mark *mark; /* CUDA copies still in flight */
    struct ipc_kcopy *kc;       /* GPU<->GPU items, batched when many */
    size_t nkc;
    bool kc_running; /* some launched as batched kernels */
    int64_t t_us[3]; /* taken, pinned, copies started (for the debug line) */
};

static char *job_local(const struct ipc_job *j)
{
    return (char *)xfer_region_ptr(j->it.local) + j->it.local_off;
}

/* Items this large stay with the copy engine: on 2 x H200 (NVLink) 64 and
 * 256 MiB items reached 0.84 of cudaMemcpyPeerAsync as batched kernels and
 * 0.92-0.95 as copy-engine copies; at 16 MiB both were 0.85-0.92, and below
 * it the kernel was ahead (1.0-4.3x at 4 KiB..4 MiB, docs/gpu.md). */
#define IPC_KBATCH_MAX_ITEM (16ull << 20)

/* Queues a GPU<->GPU copy of len bytes between local and remote (device
 * pointers of ldev and rdev) of job i (segment seg, or UINT32_MAX for the
 * whole job) for a batched launch; false if it must be copied otherwise. */
static bool kc_push(struct ipc_group *g, const struct ipc_job *j, size_t i, uint32_t seg,
                    char *local, char *remote, uint64_t len, int ldev, int rdev)
{
    if (!g->kc || ldev < 0 || rdev < 0 || len >= IPC_KBATCH_MAX_ITEM)
        return false;
    bool rd = j->it.op == XFER_OP_READ;
    g->kc[g->nkc++] = (struct ipc_kcopy){.dst = rd ? local : remote,
                                         .src = rd ? remote : local,
                                         .len = len,
                                         .exec = rdev,
                                         .other = ldev,
                                         .ticket = -1,
                                         .job = i,
                                         .seg = seg};
    return true;
}

/* GPU<->GPU items wait in g->kc for a batched launch; true if j went there. */
static bool kc_defer(struct ipc_group *g, struct ipc_job *j, size_t i)
{
    int ldev, rdev;
    char *remote = job_cuda_sides(j, &ldev, &rdev) + j->it.remote_off;
    return kc_push(g, j, i, UINT32_MAX, job_local(j), remote, j->it.len, ldev, rdev);
}

/* A vectored job's CUDA segments: batched where they can be (the sides
 * looked up once for the list), the rest one copy each; true if a copy
 * outside the batch started. */
static bool vjob_copy_cuda(struct ipc_conn *c, struct ipc_group *g, struct ipc_job *j, size_t i)
{
    int ldev, rdev;
    char *remote = job_cuda_sides(j, &ldev, &rdev), *local = xfer_region_ptr(j->it.local);
    bool any = false;
    for (uint32_t k = j->s0; k < j->s1 && !j->status; k++) {
        const struct xfer_seg *s = &j->segs[k];
        if (!kc_push(g, j, i, k, local + s->local_off, remote + s->remote_off, s->len, ldev, rdev))
            any |= seg_copy_cuda(c, j, k);
    }
    return any;
}

/* Launches the batched GPU<->GPU copies; the rest become per-item copies. */
static bool kc_start(struct ipc_conn *c, struct ipc_group *g)
{
    bool any_item = false;
    ipc_kbatch_start(&c->kb, g->kc, g->nkc);
    for (size_t k = 0; k < g->nkc; k++) {
        if (g->kc[k].ticket >= 0) {
            g->kc_running = true;
            continue;
        }
        struct ipc_job *j = &g->jobs[g->kc[k].job];
        if (g->kc[k].seg != UINT32_MAX) {
            any_item |= seg_copy_cuda(c, j, g->kc[k].seg);
            continue;
        }
        job_copy_cuda(c, j, job_local(j));
        any_item |= j->ticket >= 0;
    }
    return any_item;
}

/* Host copies run here; CUDA copies are started and left in flight behind a
 * mark (g->mark, NULL when none) or as batched kernels (g->kc_running). */
static void jobs_copy_start(struct ipc_conn *c, struct ipc_group *g)
{
    struct ipc_job *jobs = g->jobs;
    size_t n = g->n;
    bool any_cuda = false;
    g->nkc = 0;
    g->kc_running = false;
    for (size_t i = 0; i < n; i++) {
        struct ipc_job *j = &jobs[i];
        if (!j->pinned)
            continue;
        if (!xfer_batch_io_begin(j->b, j->i)) {
            j->skip = true; /* cancelled or timed out: memory is off limits */
            continue;
        }
        j->begun = true;
        char *local = (char *)xfer_region_ptr(j->it.local) + j->it.local_off;
        bool cuda = j->map->mech == IPC_MECH_CUDA || j->map->mech == IPC_MECH_CUMEM ||
                    xfer_region_kind(j->it.local) == XFER_MEM_CUDA;
        if (cuda && j->segs) {
            any_cuda |= vjob_copy_cuda(c, g, j, i);
        } else if (cuda && kc_defer(g, j, i)) {
            continue;
        } else if (cuda) {
            job_copy_cuda(c, j, local);
            any_cuda |= j->ticket >= 0;
        } else {
            job_copy_host(c, j);
            xfer_batch_io_end(j->b, j->i);
            j->begun = false;
        }
    }
    if (g->nkc)
        any_cuda |= kc_start(c, g);
    int err = 0;
    g->mark = any_cuda ? ipc_cuda_mark_new(c->copier, &err) : NULL;
}

/* Waits for the group's CUDA copies (if any) and ends their local I/O. */
static void jobs_copy_finish(struct ipc_conn *c, struct ipc_group *g)
{
    struct ipc_job *jobs = g->jobs;
    size_t n = g->n;
    char why[160];
    if (g->mark && ipc_cuda_mark_wait(g->mark, c->io_timeout_ms, why, sizeof(why)) < 0)
        xfer_warn("ipc: %s", why); /* each ticket below then reports its own state */
    if (g->kc_running) {
        ipc_kbatch_finish(c->kb, g->kc, g->nkc, c->io_timeout_ms);
        for (size_t k = 0; k < g->nkc; k++)
            if (g->kc[k].ran && g->kc[k].status < 0)
                ipc_job_fail(&jobs[g->kc[k].job], g->kc[k].status, "batched GPU copy: %s",
                             xfer_kbatch_last_error(c->kb));
        g->kc_running = false;
    }
    for (size_t i = 0; i < n; i++) {
        struct ipc_job *j = &jobs[i];
        if (j->ticket >= 0)
            j->status =
                ipc_cuda_copy_wait(c->copier, j->ticket, c->io_timeout_ms, j->why, sizeof(j->why));
        for (size_t t = 0; t < j->ntickets; t++) { /* every ticket is waited for (and freed) */
            char tw[sizeof(j->why)];
            int st = ipc_cuda_copy_wait(c->copier, j->tickets[t], c->io_timeout_ms, tw, sizeof(tw));
            if (st < 0 && !j->status)
                ipc_job_fail(j, st, "%s", tw);
        }
        if (j->begun)
            xfer_batch_io_end(j->b, j->i);
    }
}

static void jobs_report(struct ipc_job *jobs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        struct ipc_job *j = &jobs[i];
        if (!j->skip && j->status && j->bad >= 0)
            xfer_batch_seg_fail(j->b, j->i, (size_t)j->bad, j->status, j->why);
        else if (!j->skip)
            xfer_batch_chunk_done(j->b, j->i, j->status ? 0 : j->bytes, j->status,
                                  j->status ? j->why : NULL);
        free(j->tickets);
        xfer_batch_put(j->b);
    }
}

/* Frees retired mappings once no direct copy can use them any more. */
static void maps_gc(struct ipc_conn *c)
{
    pthread_mutex_lock(&c->mu);
    struct ipc_direct *gone = ipc_direct_unlist(&c->direct, &c->maps);
    pthread_mutex_unlock(&c->mu);
    ipc_direct_free(gone);
    ipc_map_gc(&c->maps);
}

/* Checks, pins and starts the copies of g. */
static void group_start(struct ipc_conn *c, struct ipc_group *g)
{
    g->mark = NULL;
    g->t_us[0] = xfer_mono_us();
    for (size_t i = 0; i < g->n; i++) {
        struct ipc_job *j = &g->jobs[i];
        j->it = *xfer_batch_item(j->b, j->i);
        if (j->segs) { /* checked as the span of its segments, then each by the owner */
            uint64_t lo = UINT64_MAX, hi = 0;
            for (uint32_t k = j->s0; k < j->s1; k++) {
                const struct xfer_seg *sg = &j->segs[k];
                lo = sg->remote_off < lo ? sg->remote_off : lo;
                hi = sg->remote_off + sg->len > hi ? sg->remote_off + sg->len : hi;
            }
            j->it.remote_off = lo;
            j->it.len = hi - lo;
        }
        if (!xfer_batch_item_live(j->b, j->i))
            j->skip = true;
        else
            job_check(c, j);
    }
    g->rc = ipc_jobs_acquire(c, g->jobs, g->n);
    g->t_us[1] = xfer_mono_us();
    if (g->rc == 0)
        jobs_copy_start(c, g);
    g->t_us[2] = xfer_mono_us();
}

/* XFER_LOG_LEVEL=debug: where a group's time went. */
static void group_debug(const struct ipc_group *g)
{
    size_t segs = 0;
    uint64_t bytes = 0;
    for (size_t i = 0; i < g->n; i++) {
        segs += g->jobs[i].segs ? g->jobs[i].s1 - g->jobs[i].s0 : 1;
        bytes += g->jobs[i].bytes;
    }
    int64_t end = xfer_mono_us();
    xfer_debug("ipc: group of %zu jobs, %zu segments, %llu bytes: check+pin %lld us, copies "
               "started %lld us, then waited+released+reported %lld us",
               g->n, segs, (unsigned long long)bytes, (long long)(g->t_us[1] - g->t_us[0]),
               (long long)(g->t_us[2] - g->t_us[1]), (long long)(end - g->t_us[2]));
}

/* Waits for g's copies, unpins and reports; < 0 if the connection broke. */
static int group_finish(struct ipc_conn *c, struct ipc_group *g)
{
    jobs_copy_finish(c, g);
    g->mark = NULL;
    int rc = g->rc, rel = ipc_jobs_release(c, g->jobs, g->n);
    if (rc == 0)
        rc = rel;
    for (size_t i = 0; rc < 0 && i < g->n; i++)
        ipc_job_fail(&g->jobs[i], -XFER_ECONN, "ipc connection to the owner lost: %s",
                     xfer_strerror(rc));
    jobs_report(g->jobs, g->n);
    if (xfer_log_get_level() >= XFER_LOG_DEBUG)
        group_debug(g);
    return rc;
}

/* A group ends at IPC_BATCH_MAX items or once it holds group_bytes
 * (XFER_IPC_GROUP_MIB, 0 = no limit): large items then form several groups
 * that the worker pipelines, so the GPU is never left without queued copies
 * while a finished group is released and the next one pinned. */
#define IPC_GROUP_MIB_DEFAULT 256

/* Vectored items become jobs of up to IPC_VEC_SEGS_MAX segments; a group
 * holds at most IPC_ACQV_SEGS_MAX segments (one IPC_ACQV_REQ). */
static size_t take_work(struct ipc_conn *c, struct ipc_job *jobs)
{
    size_t n = 0, segs = 0;
    uint64_t bytes = 0, cap = c->group_bytes;
    while (c->qlen && n < IPC_BATCH_MAX && bytes < cap) {
        struct ipc_work *w = &c->q[c->qhead];
        struct ipc_job *j = &jobs[n];
        size_t nseg;
        const struct xfer_seg *sv = xfer_batch_item_segs(w->b, w->i, &nseg);
        *j = (struct ipc_job){.b = w->b, .i = w->i, .ticket = -1, .bad = -1};
        if (!sv) {
            j->bytes = xfer_batch_item(w->b, w->i)->len;
        } else {
            size_t s0 = c->qseg, s1 = nseg - s0 > IPC_VEC_SEGS_MAX ? s0 + IPC_VEC_SEGS_MAX : nseg;
            if (segs + (s1 - s0) > IPC_ACQV_SEGS_MAX)
                break; /* the next group's */
            segs += s1 - s0;
            *j = (struct ipc_job){.b = w->b,
                                  .i = w->i,
                                  .ticket = -1,
                                  .bad = -1,
                                  .segs = sv,
                                  .s0 = (uint32_t)s0,
                                  .s1 = (uint32_t)s1};
            for (size_t k = s0; k < s1; k++)
                j->bytes += sv[k].len;
            c->qseg = s1 < nseg ? s1 : 0;
            if (s1 < nseg) { /* the entry stays for the rest; this job holds b itself */
                xfer_batch_hold(w->b);
                bytes += j->bytes;
                n++;
                continue;
            }
        }
        bytes += j->bytes;
        n++;
        c->qhead = (c->qhead + 1) % c->qcap;
        c->qlen--;
    }
    return n;
}

static void fail_queued(struct ipc_conn *c, struct ipc_job *jobs, const char *why)
{
    size_t n;
    pthread_mutex_lock(&c->mu);
    while ((n = take_work(c, jobs)) > 0) {
        pthread_mutex_unlock(&c->mu);
        for (size_t i = 0; i < n; i++) {
            xfer_batch_chunk_done(jobs[i].b, jobs[i].i, 0, -XFER_ECONN, why);
            xfer_batch_put(jobs[i].b);
        }
        pthread_mutex_lock(&c->mu);
    }
    pthread_mutex_unlock(&c->mu);
}

/* With c->mu held and nothing queued: sleeps until new work is posted or the
 * pending group's copies have finished (the copier's host functions
 * broadcast c->cv), so a batch posted while the GPU is still copying starts
 * at once instead of after the pending group's release round trip. Returns
 * false when pending should be finished now (copies done, batched kernels,
 * which have no wake-up, or no sign of progress for a second: the blocking
 * finish then applies io_timeout). */
static bool pending_wait(struct ipc_conn *c, struct ipc_group *pending)
{
    if (pending->kc_running || !pending->mark || ipc_cuda_mark_done_locked(pending->mark))
        return false;
    struct timespec ts = xfer_mono_after_ms(1000);
    return pthread_cond_timedwait(&c->cv, &c->mu, &ts) == 0 || c->qlen > 0 || c->stop;
}

/* While loans exist, the idle worker looks this often for loans the owner
 * withdrew and for an owner that hung up: direct copies do not talk to the
 * owner, so nothing else would tell. */
#define DIRECT_CHECK_MS 100

/* Worker, mu held: a withdrawn loan retires its mapping (as a revocation
 * riding on an ACQ answer does); an owner gone fails the connection, so
 * direct copies stop too. */
static int direct_check(struct ipc_conn *c)
{
    int64_t now = xfer_now_ms();
    if (!c->direct.head || now - c->direct_check_ms < DIRECT_CHECK_MS)
        return 0;
    c->direct_check_ms = now;
    if (owner_hung_up(c))
        return -XFER_ECONN;
    bool gone = false;
    for (struct ipc_direct *d = c->direct.head; d; d = d->next) {
        if (__atomic_load_n(&c->direct.ctl[d->slot].key, __ATOMIC_ACQUIRE) ==
            ipc_ctl_key(d->id, d->gen))
            continue;
        ipc_map_forget_gen(&c->maps, d->id, d->gen);
        gone = true;
    }
    if (gone) {
        pthread_mutex_unlock(&c->mu);
        maps_gc(c);
        pthread_mutex_lock(&c->mu);
    }
    return 0;
}

/* Two groups alternate: while the GPU runs one group's copies, the next one
 * is checked, pinned and started, so the owner round trip and the thread
 * wake-ups overlap the copies. Host copies finish inside group_start. */
static void *worker_main(void *arg)
{
    struct ipc_conn *c = arg;
    struct ipc_group g[2] = {{.jobs = calloc(IPC_BATCH_MAX, sizeof(struct ipc_job))},
                             {.jobs = calloc(IPC_BATCH_MAX, sizeof(struct ipc_job))}};
    /* without room for batched copies, items are copied one by one */
    size_t nkc = IPC_BATCH_MAX + IPC_ACQV_SEGS_MAX; /* a copy per item or segment */
    g[0].kc = c->t->cuda_devices > 0 ? calloc(nkc, sizeof(struct ipc_kcopy)) : NULL;
    g[1].kc = c->t->cuda_devices > 0 ? calloc(nkc, sizeof(struct ipc_kcopy)) : NULL;
    struct ipc_group *pending = NULL;
    int cur = 0, rc = 0;
    pthread_mutex_lock(&c->mu);
    while (!c->stop && g[0].jobs && g[1].jobs && rc == 0) {
        if (c->mhead || c->owed_wake) { /* messages it must send, answers it must read */
            pthread_mutex_unlock(&c->mu);
            ipc_link_worker_msgs(c);
            pthread_mutex_lock(&c->mu);
            rc = __atomic_load_n(&c->broken, __ATOMIC_RELAXED) ? -XFER_ECONN : 0;
            continue;
        }
        if (c->qlen == 0 && pending && pending_wait(c, pending))
            continue; /* new work or the pending copies finished: look again */
        if (c->qlen == 0 && pending) {
            pthread_mutex_unlock(&c->mu);
            rc = group_finish(c, pending);
            pending = NULL;
            maps_gc(c); /* nothing in flight: retired mappings can go */
            pthread_mutex_lock(&c->mu);
            continue;
        }
        if (c->qlen == 0 && c->owed_lazy_ms &&
            xfer_now_ms() >= c->owed_lazy_ms + IPC_OWED_LAZY_MS) {
            c->owed_lazy_ms = 0; /* ipc_link_lazy sets it again if some are left */
            pthread_mutex_unlock(&c->mu);
            ipc_link_lazy(c);
            pthread_mutex_lock(&c->mu);
            rc = __atomic_load_n(&c->broken, __ATOMIC_RELAXED) ? -XFER_ECONN : 0;
            continue;
        }
        if (c->qlen == 0) {
            int64_t ms = c->direct.head ? DIRECT_CHECK_MS : 1000;
            if (c->owed_lazy_ms) /* answers left owed: read them soon */
                ms = c->owed_lazy_ms + IPC_OWED_LAZY_MS - xfer_now_ms();
            struct timespec ts = xfer_mono_after_ms(ms > 0 ? ms : 0);
            pthread_cond_timedwait(&c->cv, &c->mu, &ts);
            rc = direct_check(c);
            continue;
        }
        struct ipc_group *ng = &g[cur];
        cur ^= 1;
        ng->n = take_work(c, ng->jobs);
        pthread_mutex_unlock(&c->mu);
        group_start(c, ng);
        if (pending)
            rc = group_finish(c, pending);
        pending = NULL;
        if (ng->mark || ng->kc_running) {
            pending = ng;
        } else {
            int r = group_finish(c, ng);
            rc = rc ? rc : r;
            maps_gc(c);
        }
        pthread_mutex_lock(&c->mu);
    }
    if (rc < 0)
        __atomic_store_n(&c->broken, true, __ATOMIC_RELAXED); /* ipc_conn_state reads it */
    if (rc < 0 && !c->stop) /* a close shuts the socket down: no news */
        xfer_warn("ipc: connection to %s lost: %s", xfer_peer_desc_get(c->base.peer)->node_id,
                  xfer_strerror(rc));
    struct ipc_msgq *mq = c->mhead; /* queued messages fail */
    c->mhead = c->mtail = NULL;
    c->stop = true; /* no more are queued */
    pthread_mutex_unlock(&c->mu);
    ipc_link_fini(c); /* neither are answers read any more */
    while (mq) {
        struct ipc_msgq *next = mq->next;
        xfer_msg_done(mq->m, -XFER_ECONN, "ipc connection to the owner lost");
        free(mq);
        mq = next;
    }
    if (pending)
        group_finish(c, pending);
    if (g[0].jobs)
        fail_queued(c, g[0].jobs, "ipc connection closed");
    free(g[0].jobs);
    free(g[1].jobs);
    free(g[0].kc);
    free(g[1].kc);
    return NULL;
}

/* Handshake, then the owner's HELLO, then a CMA probe: if the kernel will not
 * let us attach to the owner, this peer is not reachable by ipc at all, and
 * the engine falls back to the next transport (tcp). */
static int conn_hello(struct ipc_conn *c, const struct xfer_peer_desc *pd, int timeout_ms,
                      char *why, size_t why_len)
{
    const struct xfer_engine_config *cfg = xfer_engine_config_get(c->t->base.engine);
    struct xfer_hs_self self = {.node_id = c->t->node_id,
                                .incarnation = c->t->incarnation,
                                .secret = cfg->secret,
                                .secret_len = cfg->secret_len};
    struct xfer_hs_peer hp;
    int rc = xfer_handshake_client(c->fd, &self, timeout_ms, &hp, why, why_len);
    if (rc < 0)
        return rc;
    if (strcmp(hp.node_id, pd->node_id) != 0 || hp.incarnation != pd->incarnation) {
        snprintf(why, why_len, "socket answered as %s/%llx, expected %s/%llx", hp.node_id,
                 (unsigned long long)hp.incarnation, pd->node_id,
                 (unsigned long long)pd->incarnation);
        return -XFER_ESTALE;
    }
    struct ipc_hdr h;
    struct ipc_hello hello;
    int ctl_fd = -1; /* the control page of direct copies, if the owner has one */
    rc = ipc_recv(c->fd, &h, &hello, sizeof(hello), &ctl_fd, timeout_ms);
    if (rc == 0)
        rc = ipc_msg_check(&h, &hello, IPC_HELLO, 1);
    if (rc == 0)
        ipc_direct_init(&c->direct, ctl_fd, hello.ctl_slots);
    else if (ctl_fd >= 0)
        close(ctl_fd);
    if (rc < 0) {
        snprintf(why, why_len, "no ipc hello from the peer: %s", xfer_strerror(rc));
        return rc;
    }
    c->pid = ipc_sock_peer_pid(c->fd); /* in our pid namespace, unlike hello.pid */
    if (c->pid <= 0) {
        snprintf(why, why_len, "peer process (pid %d) is in another pid namespace", hello.pid);
        return -XFER_ENOTSUP;
    }
    uint8_t got[sizeof(hello.probe_cookie)];
    rc = ipc_cma_read(c->pid, hello.probe_addr, got, sizeof(got), why, why_len);
    if (rc == 0 && memcmp(got, hello.probe_cookie, sizeof(got)) != 0) {
        snprintf(why, why_len, "cross-memory attach probe read the wrong bytes (pid reuse?)");
        rc = -XFER_EPROTO;
    }
    return rc;
}

int ipc_conn_open(struct ipc_transport *t, xfer_peer *peer, int timeout_ms, struct xfer_conn **out)
{
    const struct xfer_peer_desc *pd = xfer_peer_desc_get(peer);
    char why[256] = "";
    struct ipc_conn *c = calloc(1, sizeof(*c));
    if (!c)
        return -XFER_ENOMEM;
    c->base = (struct xfer_conn){.transport = &t->base, .peer = peer};
    c->t = t;
    c->io_timeout_ms = xfer_engine_config_get(t->base.engine)->io_timeout_ms;
    const char *gm = getenv("XFER_IPC_GROUP_MIB");
    long mib = gm ? atol(gm) : IPC_GROUP_MIB_DEFAULT;
    c->group_bytes = mib > 0 ? (uint64_t)mib << 20 : UINT64_MAX;
    c->fd = ipc_sock_connect(pd->node_id, pd->incarnation, timeout_ms, why, sizeof(why));
    int rc = c->fd < 0 ? c->fd : conn_hello(c, pd, timeout_ms, why, sizeof(why));
    if (rc == -XFER_EACCES)
        rc = -XFER_ENOTSUP; /* the kernel's policy, not a region's access mode */
    if (rc < 0)
        goto out_fail;
    xfer_cond_init_mono(&c->cv);
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->link_mu, NULL);
    if (pthread_create(&c->worker, NULL, worker_main, c) != 0) {
        pthread_cond_destroy(&c->cv);
        pthread_mutex_destroy(&c->mu);
        pthread_mutex_destroy(&c->link_mu);
        snprintf(why, sizeof(why), "cannot start the ipc worker thread");
        rc = -XFER_ENOMEM;
        goto out_fail;
    }
    *out = &c->base;
    return 0;
out_fail:
    /* the engine's connect loop logs it, naming the transport it tries next
     * (none, when the peer is simply gone) */
    xfer_engine_set_error(t->base.engine, "ipc to %s: %s", pd->node_id, why);
    if (c->fd >= 0)
        close(c->fd);
    ipc_direct_fini(&c->direct);
    free(c);
    return rc;
}

void ipc_conn_close(struct xfer_conn *xc)
{
    if (!xc)
        return;
    struct ipc_conn *c = container_of(xc, struct ipc_conn, base);
    pthread_mutex_lock(&c->mu);
    c->stop = true;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
    shutdown(c->fd, SHUT_RDWR); /* wakes the worker out of a pending round trip */
    pthread_join(c->worker, NULL);
    ipc_direct_fini(&c->direct); /* before the mappings it points into go */
    ipc_map_clear(&c->maps);
    ipc_cuda_copier_free(c->copier);
    xfer_kbatch_free(c->kb);
    close(c->fd);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->link_mu);
    free(c->q);
    free(c);
}
