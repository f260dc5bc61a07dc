/*
 * Pins at the owner for the worker's groups (ipc_conn.c): every checked
 * job of a group is validated and pinned in one round trip per kind —
 * IPC_ACQ_REQ for plain items (one range each), IPC_ACQV_REQ for vectored
 * items (a segment list each, checked by the owner under one lock with one
 * pin per list) — and unpinned with one IPC_REL.
 */
#include "ipc_conn.h"

#include <stdio.h>
#include <stdlib.h>

/* Regions the owner deregistered (records behind its answers): retire our
 * mappings of them. */
static void forget_revoked(struct ipc_conn *c, const void *recs, size_t bytes)
{
    const struct ipc_revoked *gone = recs;
    for (size_t x = 0; x < bytes / sizeof(*gone); x++)
        ipc_map_forget_gen(&c->maps, gone[x].id, gone[x].gen);
}

/* One round trip: sends req (count records), receives the answers of each
 * bytes into reply and retires revoked mappings. */
static int round_trip(struct ipc_conn *c, uint16_t type, uint32_t count, const void *req,
                      size_t req_bytes, void *reply, size_t reply_max, size_t each)
{
    int rc = ipc_link_lock(c, true); /* answers owed to messages come first */
    if (rc == 0)
        rc = ipc_send(c->fd, type, count, req, (uint32_t)req_bytes, -1, c->io_timeout_ms);
    struct ipc_hdr h;
    if (rc == 0)
        rc = ipc_recv(c->fd, &h, reply, (uint32_t)reply_max, NULL, c->io_timeout_ms);
    if (rc == 0)
        rc = ipc_msg_check(&h, reply, type + 1, count); /* each *_RESP follows its *_REQ */
    ipc_link_unlock(c, rc);
    if (rc == 0)
        forget_revoked(c, (char *)reply + count * each, h.bytes - count * each);
    return rc;
}

static int acquire_plain(struct ipc_conn *c, struct ipc_job *jobs, size_t n)
{
    struct ipc_acq_req req[IPC_BATCH_MAX];
    size_t map_of[IPC_BATCH_MAX], k = 0;
    for (size_t i = 0; i < n; i++) {
        if (jobs[i].status || jobs[i].skip || ipc_job_vec(&jobs[i]))
            continue;
        const struct xfer_item *it = &jobs[i].it;
        req[k] = (struct ipc_acq_req){.id = it->remote_id,
                                      .gen = it->remote_gen,
                                      .op = it->op,
                                      .off = it->remote_off,
                                      .len = it->len};
        map_of[k++] = i;
    }
    if (k == 0)
        return 0;
    struct {
        struct ipc_acq_resp r[IPC_BATCH_MAX];
        struct ipc_revoked gone[IPC_REVOKED_MAX];
    } reply;
    int rc = round_trip(c, IPC_ACQ_REQ, (uint32_t)k, req, k * sizeof(req[0]), &reply, sizeof(reply),
                        sizeof(reply.r[0]));
    for (size_t x = 0; rc == 0 && x < k; x++) {
        struct ipc_job *j = &jobs[map_of[x]];
        const struct ipc_acq_resp *r = &reply.r[x];
        if (r->status == 0) {
            j->pinned = true;
            j->slot = r->slot;
            continue;
        }
        ipc_job_fail(j, r->status, "owner refused region %u gen %u [%llu+%llu]: %s",
                     j->it.remote_id, j->it.remote_gen, (unsigned long long)j->it.remote_off,
                     (unsigned long long)j->it.len, xfer_strerror(r->status));
        if (r->status == -XFER_ESTALE || r->status == -XFER_ENOENT)
            ipc_map_forget(&c->maps, j->it.remote_id);
    }
    return rc;
}

/* Vectored jobs the next IPC_ACQV_REQ asks for: all of them as hulls, or
 * (lists) those the owner wants the ranges of. */
static bool acqv_wants(const struct ipc_job *j, bool lists)
{
    return ipc_job_vec(j) && !j->status && !j->skip && !j->pinned && (!lists || j->need_list);
}

/* Builds the IPC_ACQV_REQ (map_of: record -> job) in c->acqv. A hull
 * record is the same few bytes whatever the list's length; a list record
 * carries every range. */
static int acqv_build(struct ipc_conn *c, const struct ipc_job *jobs, size_t n, bool lists,
                      size_t *map_of, size_t *k_out, size_t *bytes_out)
{
    size_t k = 0, bytes = 0;
    for (size_t i = 0; i < n; i++)
        if (acqv_wants(&jobs[i], lists)) {
            map_of[k++] = i;
            bytes += sizeof(struct ipc_acqv_req) +
                     (lists ? (jobs[i].s1 - jobs[i].s0) * sizeof(struct xfer_range)
                            : sizeof(struct ipc_acqv_hull));
        }
    *k_out = k;
    *bytes_out = bytes;
    if (k && bytes > c->acqv_cap) { /* kept for the connection: no malloc per group */
        void *p = realloc(c->acqv, bytes);
        if (!p)
            return -XFER_ENOMEM;
        c->acqv = p;
        c->acqv_cap = bytes;
    }
    char *at = c->acqv;
    for (size_t x = 0; x < k; x++) {
        const struct ipc_job *j = &jobs[map_of[x]];
        struct ipc_acqv_req *q = (void *)at;
        *q = (struct ipc_acqv_req){.id = j->it.remote_id,
                                   .gen = j->it.remote_gen,
                                   .op = j->it.op,
                                   .nseg = lists ? j->s1 - j->s0 : IPC_ACQV_HULL};
        at += sizeof(*q);
        if (!lists) { /* group_start set it.remote_off/len to the hull */
            *(struct ipc_acqv_hull *)(void *)at = (struct ipc_acqv_hull){.off = j->it.remote_off,
                                                                         .len = j->it.len,
                                                                         .bytes = j->bytes,
                                                                         .nseg = j->s1 - j->s0};
            at += sizeof(struct ipc_acqv_hull);
            continue;
        }
        struct xfer_range *v = (void *)at;
        for (uint32_t s = j->s0; s < j->s1; s++) { /* a block job's computed here */
            struct xfer_seg sg = ipc_job_seg(j, s);
            v[s - j->s0] = (struct xfer_range){sg.remote_off, sg.len};
        }
        at += q->nseg * sizeof(*v);
    }
    return 0;
}

/* A hull the owner refused as out of bounds: the first segment past the
 * owner's length is named (the owner's view of the region, from its map
 * answer), else the region. */
static int64_t hull_bad_segment(const struct ipc_job *j)
{
    for (uint32_t s = j->s0; j->map && s < j->s1; s++) {
        struct xfer_seg sg = ipc_job_seg(j, s);
        if (!xfer_range_ok(sg.remote_off, sg.len, j->map->len))
            return s;
    }
    return -1;
}

static void acqv_refused(struct ipc_conn *c, struct ipc_job *j, const struct ipc_acqv_resp *r,
                         bool lists)
{
    int64_t bad = !lists && r->status == -XFER_ERANGE ? hull_bad_segment(j)
                  : lists && r->bad < j->s1 - j->s0   ? (int64_t)(j->s0 + r->bad)
                                                      : -1;
    if (bad < 0) { /* the region itself */
        ipc_job_fail(j, r->status, "owner refused region %u gen %u: %s", j->it.remote_id,
                     j->it.remote_gen, xfer_strerror(r->status));
        if (r->status == -XFER_ESTALE || r->status == -XFER_ENOENT)
            ipc_map_forget(&c->maps, j->it.remote_id);
        return;
    }
    struct xfer_seg sg = ipc_job_seg(j, (uint32_t)bad), *s = &sg;
    j->bad = bad;
    ipc_job_fail(j, r->status, "owner refused remote %llu+%llu of region %u: %s",
                 (unsigned long long)s->remote_off, (unsigned long long)s->len, j->it.remote_id,
                 xfer_strerror(r->status));
}

/* One IPC_ACQV_REQ round trip: the hulls, or the lists the owner asked for. */
static int acquire_vec_round(struct ipc_conn *c, struct ipc_job *jobs, size_t n, bool lists)
{
    size_t map_of[IPC_BATCH_MAX], k, bytes;
    int rc = acqv_build(c, jobs, n, lists, map_of, &k, &bytes);
    if (k == 0)
        return 0;
    if (rc < 0) {
        for (size_t x = 0; x < k; x++)
            ipc_job_fail(&jobs[map_of[x]], rc, "out of memory for the segment list");
        return 0;
    }
    struct {
        struct ipc_acqv_resp r[IPC_BATCH_MAX];
        struct ipc_revoked gone[IPC_REVOKED_MAX];
    } reply;
    rc = round_trip(c, IPC_ACQV_REQ, (uint32_t)k, c->acqv, bytes, &reply, sizeof(reply),
                    sizeof(reply.r[0]));
    for (size_t x = 0; rc == 0 && x < k; x++) {
        struct ipc_job *j = &jobs[map_of[x]];
        const struct ipc_acqv_resp *r = &reply.r[x];
        j->need_list = false;
        if (r->status == 0 && (r->flags & IPC_ACQV_NEED_LIST)) {
            j->need_list = !lists; /* lease rules: the owner checks each range */
            if (lists)
                ipc_job_fail(j, -XFER_EPROTO, "owner asked twice for the segment list");
        } else if (r->status == 0) {
            j->pinned = true;
            j->slot = r->slot;
        } else {
            acqv_refused(c, j, r, lists);
        }
    }
    return rc;
}

static int acquire_vec(struct ipc_conn *c, struct ipc_job *jobs, size_t n)
{
    int rc = acquire_vec_round(c, jobs, n, false);
    return rc ? rc : acquire_vec_round(c, jobs, n, true);
}

int ipc_jobs_acquire(struct ipc_conn *c, struct ipc_job *jobs, size_t n)
{
    int rc = acquire_plain(c, jobs, n);
    return rc ? rc : acquire_vec(c, jobs, n);
}

int ipc_jobs_release(struct ipc_conn *c, struct ipc_job *jobs, size_t n)
{
    uint32_t slot[IPC_BATCH_MAX];
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (jobs[i].pinned)
            slot[k++] = jobs[i].slot;
    if (k == 0)
        return 0;
    int rc = ipc_link_lock(c, false); /* no answer: owed ones may stay owed */
    if (rc == 0)
        rc = ipc_send(c->fd, IPC_REL, (uint32_t)k, slot, (uint32_t)(k * sizeof(slot[0])), -1,
                      c->io_timeout_ms);
    ipc_link_unlock(c, rc);
    return rc;
}
