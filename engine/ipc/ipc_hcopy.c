/*
 * Host copies of the ipc worker's groups (memcpy on the owner's memfd
 * mapping, process_vm_*v for CMA), spread over the transport's copy
 * threads (ipc_pool.c) as the direct copies are: the jobs' bytes are cut
 * into parts of about IPC_DIRECT_PIECE (runs of whole segments, or a slice
 * of one long segment), which the threads and the worker take in turn.
 * Each part checks once that the owner is still there (a dead owner's
 * memory is a silent loss), not each segment. A failing part names its
 * first failing segment; the job reports the lowest one.
 */
#include "xfer_grow.h"
#include "ipc_copy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Below this a group's host bytes are copied by the worker alone: waking
 * threads costs more than it saves. */
#define IPC_HCOPY_SPREAD_MIN (1u << 20)

struct ipc_hpart {
    struct ipc_conn *c;
    struct ipc_job *j;
    uint32_t a, b;     /* segments [a, b) of j (plain job: 0, 1) */
    uint64_t off, len; /* len > 0: only [off, off+len) of segment a */
    int status;        /* 0 or -XFER_E* */
    int64_t bad;       /* j's failing segment, -1 = none */
    char why[sizeof(((struct ipc_job *)0)->why)];
};

/* Segment k of j: a plain job is its own one segment. */
static struct xfer_seg job_seg(const struct ipc_job *j, uint32_t k)
{
    if (ipc_job_vec(j))
        return ipc_job_seg(j, k);
    return (struct xfer_seg){j->it.local_off, j->it.remote_off, j->it.len};
}

static int seg_copy(struct ipc_hpart *p, char *local, uint64_t remote_off, uint64_t len)
{
    const struct ipc_map *m = p->j->map;
    bool rd = p->j->it.op == XFER_OP_READ;
    if (m->mech == IPC_MECH_MEMFD) {
        char *remote = (char *)m->base + remote_off;
        memcpy(rd ? local : remote, rd ? remote : local, len);
        return 0;
    }
    if (rd)
        return ipc_cma_read(p->c->pid, m->addr + remote_off, local, len, p->why, sizeof(p->why));
    return ipc_cma_write(p->c->pid, m->addr + remote_off, local, len, p->why, sizeof(p->why));
}

static void hpart_run(void *arg, size_t k)
{
    struct ipc_hpart *p = (struct ipc_hpart *)arg + k;
    char *base = (char *)xfer_region_ptr(p->j->it.local);
    if (ipc_sock_hung_up(p->c->fd)) {
        p->status = -XFER_ECONN;
        snprintf(p->why, sizeof(p->why), "the owner closed the connection (access revoked?)");
        return;
    }
    for (uint32_t s = p->a; s < p->b && !p->status; s++) {
        struct xfer_seg sg = job_seg(p->j, s);
        uint64_t off = p->len ? p->off : 0, len = p->len ? p->len : sg.len;
        if ((p->status = seg_copy(p, base + sg.local_off + off, sg.remote_off + off, len)) < 0)
            p->bad = ipc_job_vec(p->j) ? (int64_t)s : -1;
    }
}

/* Room for n more parts in the connection's part buffer (kept: nothing
 * allocated per group once it has grown). */
static struct ipc_hpart *parts_room(struct ipc_conn *c, size_t used, size_t n)
{
    if (xfer_grow(&c->hparts, &c->hparts_cap, used + n, sizeof(struct ipc_hpart), 64))
        return NULL;
    return (struct ipc_hpart *)c->hparts + used;
}

/* Cuts job j into parts after the first *np; false when out of memory. */
static bool job_parts(struct ipc_conn *c, struct ipc_job *j, size_t *np)
{
    uint32_t a = ipc_job_vec(j) ? j->s0 : 0, b = ipc_job_vec(j) ? j->s1 : 1, from = a;
    uint64_t acc = 0;
    for (uint32_t s = a; s < b; s++) {
        uint64_t len = job_seg(j, s).len;
        if (len > IPC_DIRECT_PIECE) { /* a long one: slices of its own */
            size_t nslice = (len + IPC_DIRECT_PIECE - 1) / IPC_DIRECT_PIECE;
            struct ipc_hpart *p = parts_room(c, *np, nslice + 1);
            if (!p)
                return false;
            if (s > from) /* the run before it */
                *p++ = (struct ipc_hpart){.c = c, .j = j, .a = from, .b = s, .bad = -1}, ++*np;
            for (uint64_t off = 0; off < len; off += IPC_DIRECT_PIECE, ++*np)
                *p++ = (struct ipc_hpart){.c = c,
                                          .j = j,
                                          .a = s,
                                          .b = s + 1,
                                          .off = off,
                                          .len = len - off < IPC_DIRECT_PIECE ? len - off
                                                                              : IPC_DIRECT_PIECE,
                                          .bad = -1};
            from = s + 1;
            acc = 0;
            continue;
        }
        acc += len;
        if (acc >= IPC_DIRECT_PIECE || s + 1 == b) {
            struct ipc_hpart *p = parts_room(c, *np, 1);
            if (!p)
                return false;
            *p = (struct ipc_hpart){.c = c, .j = j, .a = from, .b = s + 1, .bad = -1};
            ++*np;
            from = s + 1;
            acc = 0;
        }
    }
    return true;
}

void ipc_jobs_copy_host(struct ipc_conn *c, struct ipc_job *jobs, size_t n)
{
    size_t np = 0;
    uint64_t bytes = 0;
    for (size_t i = 0; i < n; i++) {
        struct ipc_job *j = &jobs[i];
        if (!j->host || !j->begun)
            continue;
        if (!job_parts(c, j, &np))
            ipc_job_fail(j, -XFER_ENOMEM, "out of memory for copy parts");
        bytes += j->bytes;
    }
    struct ipc_hpart *parts = c->hparts;
    if (np && bytes >= IPC_HCOPY_SPREAD_MIN && c->t->pool)
        ipc_pool_run(c->t->pool, hpart_run, parts, np);
    else
        for (size_t k = 0; k < np; k++)
            hpart_run(parts, k);
    for (size_t k = 0; k < np; k++) { /* parts are in segment order: the first failure wins */
        struct ipc_job *j = parts[k].j;
        if (parts[k].status == 0 || j->status)
            continue;
        j->status = parts[k].status;
        j->bad = parts[k].bad;
        snprintf(j->why, sizeof(j->why), "%s", parts[k].why);
    }
    for (size_t i = 0; i < n; i++) {
        struct ipc_job *j = &jobs[i];
        if (j->host && j->begun) {
            xfer_batch_io_end(j->b, j->i);
            j->begun = false;
        }
    }
}
