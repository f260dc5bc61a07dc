/*
 * The copies of the ipc worker's groups (ipc_conn.c takes, checks and pins
 * them): host memory with memcpy on the owner's memfd mapping or
 * process_vm_*v, GPU memory as CUDA copies or batched-copy launches
 * (ipc_kbatch.c), whole vectored items as one run of a launch.
 */
#include "ipc_copy.h"
#include "xfer_io.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    struct xfer_seg s = ipc_job_seg(j, k);
    int rc =
        cuda_start(c, j, (char *)xfer_region_ptr(j->it.local) + s.local_off, s.remote_off, s.len);
    if (rc < 0) {
        j->status = rc;
        j->bad = k;
        return false;
    }
    j->tickets[j->ntickets++] = rc;
    return true;
}

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
                                         .w = {.ticket = -1},
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
        struct xfer_seg s = ipc_job_seg(j, k);
        if (!kc_push(g, j, i, k, local + s.local_off, remote + s.remote_off, s.len, ldev, rdev))
            any |= seg_copy_cuda(c, j, k);
    }
    return any;
}

/* A vectored job between two GPUs whose segments may all go into a
 * batched launch waits in g->kr as one run (nothing per segment here);
 * true if it went there. */
static bool kr_defer(struct ipc_group *g, struct ipc_job *j, size_t i)
{
    int ldev, rdev;
    char *remote = job_cuda_sides(j, &ldev, &rdev);
    if (!g->kr || ldev < 0 || rdev < 0 || j->maxseg >= IPC_KBATCH_MAX_ITEM)
        return false;
    bool rd = j->it.op == XFER_OP_READ;
    if (j->blocks) { /* the ids and bases as they are: the GPU computes each address */
        g->kr[g->nkr++] =
            (struct ipc_krun){.blk = ipc_block_run((char *)xfer_region_ptr(j->it.local), remote,
                                                   &j->blk, j->s0, j->s1, rd),
                              .is_blk = true,
                              .bytes = j->bytes,
                              .exec = rdev,
                              .other = ldev,
                              .w = {.ticket = -1},
                              .job = i};
        return true;
    }
    _Static_assert(sizeof(struct xfer_seg) == 3 * sizeof(uint64_t) &&
                       offsetof(struct xfer_seg, local_off) == 0 &&
                       offsetof(struct xfer_seg, remote_off) == 8,
                   "a segment is the (a_off, b_off, len) triple of struct xfer_copy_run");
    g->kr[g->nkr++] =
        (struct ipc_krun){.run = {.a = (char *)xfer_region_ptr(j->it.local),
                                  .b = remote,
                                  .segs = (const uint64_t *)(const void *)(j->segs + j->s0),
                                  .n = j->s1 - j->s0,
                                  .a_is_dst = rd},
                          .bytes = j->bytes,
                          .exec = rdev,
                          .other = ldev,
                          .w = {.ticket = -1},
                          .job = i};
    return true;
}

/* Launches the runs; a job whose run no launch took goes segment by
 * segment (batched per segment, else one copy each); true if such a copy
 * started outside a batch. */
static bool kr_start(struct ipc_conn *c, struct ipc_group *g)
{
    bool any = false;
    ipc_kbatch_start_runs(&c->kb, g->kr, g->nkr);
    for (size_t k = 0; k < g->nkr; k++) {
        if (g->kr[k].w.ticket >= 0)
            g->kc_running = true;
        else
            any |= vjob_copy_cuda(c, g, &g->jobs[g->kr[k].job], g->kr[k].job);
    }
    return any;
}

/* Launches the batched GPU<->GPU copies; the rest become per-item copies. */
static bool kc_start(struct ipc_conn *c, struct ipc_group *g)
{
    bool any_item = false;
    ipc_kbatch_start(&c->kb, g->kc, g->nkc);
    for (size_t k = 0; k < g->nkc; k++) {
        if (g->kc[k].w.ticket >= 0) {
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
void ipc_jobs_copy_start(struct ipc_conn *c, struct ipc_group *g)
{
    struct ipc_job *jobs = g->jobs;
    size_t n = g->n;
    bool any_cuda = false;
    g->nkc = g->nkr = 0;
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
        if (cuda && ipc_job_vec(j) && kr_defer(g, j, i)) {
            continue;
        } else if (cuda && ipc_job_vec(j)) {
            any_cuda |= vjob_copy_cuda(c, g, j, i);
        } else if (cuda && kc_defer(g, j, i)) {
            continue;
        } else if (cuda) {
            job_copy_cuda(c, j, local);
            any_cuda |= j->ticket >= 0;
        } else {
            j->host = true; /* below, once the GPU has its copies */
        }
    }
    if (g->nkr) /* before kc_start: a run no launch took joins g->kc */
        any_cuda |= kr_start(c, g);
    if (g->nkc)
        any_cuda |= kc_start(c, g);
    int err = 0;
    g->mark = any_cuda ? ipc_cuda_mark_new(c->copier, &err) : NULL;
    ipc_jobs_copy_host(c, jobs, n);
}

/* Waits for the group's CUDA copies (if any) and ends their local I/O. */
void ipc_jobs_copy_finish(struct ipc_conn *c, struct ipc_group *g)
{
    struct ipc_job *jobs = g->jobs;
    size_t n = g->n;
    char why[160];
    if (g->mark && ipc_cuda_mark_wait(g->mark, c->io_timeout_ms, why, sizeof(why)) < 0)
        xfer_warn("ipc: %s", why); /* each ticket below then reports its own state */
    if (g->kc_running) {
        ipc_kbatch_finish(c->kb, &g->kr[0].w, sizeof(g->kr[0]), g->nkr, c->io_timeout_ms);
        ipc_kbatch_finish(c->kb, &g->kc[0].w, sizeof(g->kc[0]), g->nkc, c->io_timeout_ms);
        for (size_t k = 0; k < g->nkr + g->nkc; k++) {
            bool run = k < g->nkr;
            const struct ipc_kwait *w = run ? &g->kr[k].w : &g->kc[k - g->nkr].w;
            if (w->ran && w->status < 0)
                ipc_job_fail(&jobs[run ? g->kr[k].job : g->kc[k - g->nkr].job], w->status,
                             "batched GPU copy: %s", xfer_kbatch_last_error(c->kb));
        }
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
