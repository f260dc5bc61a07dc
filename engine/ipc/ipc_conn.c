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
#include "ipc_copy.h"
#include "xfer_io.h"
#include "xfer_kernels.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
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
    for (uint32_t k = j->s0; ipc_job_vec(j) && k < j->s1; k++) { /* name the segment */
        struct xfer_seg sg = ipc_job_seg(j, k), *s = &sg;
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

unsigned ipc_conn_state(struct xfer_conn *xc)
{
    struct ipc_conn *c = container_of(xc, struct ipc_conn, base);
    bool broken = __atomic_load_n(&c->broken, __ATOMIC_RELAXED);
    unsigned left = __atomic_load_n(&c->peer_left, __ATOMIC_RELAXED) ? XFER_CONN_PEER_LEFT : 0;
    return broken || ipc_sock_hung_up(c->fd) ? XFER_CONN_ALL_DEAD | left : 0;
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
        if (ipc_job_vec(j)) { /* checked as the hull of its segments (take_work) */
            j->it.remote_off = j->lo;
            j->it.len = j->hi - j->lo;
        }
        if (!xfer_batch_item_live(j->b, j->i))
            j->skip = true;
        else
            job_check(c, j);
    }
    g->rc = ipc_jobs_acquire(c, g->jobs, g->n);
    g->t_us[1] = xfer_mono_us();
    if (g->rc == 0)
        ipc_jobs_copy_start(c, g);
    g->t_us[2] = xfer_mono_us();
}

/* XFER_LOG_LEVEL=debug: where a group's time went. */
static void group_debug(const struct ipc_group *g)
{
    size_t segs = 0;
    uint64_t bytes = 0;
    for (size_t i = 0; i < g->n; i++) {
        segs += ipc_job_vec(&g->jobs[i]) ? g->jobs[i].s1 - g->jobs[i].s0 : 1;
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
    ipc_jobs_copy_finish(c, g);
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

/* Bytes, longest segment and remote hull of segments [s0, s1) of j, in
 * one pass over a list; a block job's from its ids (the hull of all its
 * ids over the streams it touches: a superset, still inside the region
 * when every segment is, and the engine made sure nothing wraps). */
struct ids_memo { /* the last id list's extremes, within one take_work (batches running) */
    const uint64_t *ids;
    uint32_t n;
    uint64_t min, max;
};

static void job_span(struct ipc_job *j, struct ids_memo *m)
{
    uint64_t lo = UINT64_MAX, hi = 0, top = 0, sum = 0;
    if (j->blocks) {
        const struct xfer_block_list *bl = &j->blk;
        if (m->ids != bl->remote_ids || m->n != bl->nids) { /* a request's items share one */
            *m = (struct ids_memo){bl->remote_ids, bl->nids, UINT64_MAX, 0};
            for (uint32_t i = 0; i < bl->nids; i++) {
                m->min = bl->remote_ids[i] < m->min ? bl->remote_ids[i] : m->min;
                m->max = bl->remote_ids[i] > m->max ? bl->remote_ids[i] : m->max;
            }
        }
        uint64_t imin = m->min, imax = m->max;
        for (uint32_t st = j->s0 / bl->nids; st <= (j->s1 - 1) / bl->nids; st++) {
            uint64_t a = bl->remote_base[st] + imin * bl->remote_stride;
            uint64_t z = bl->remote_base[st] + imax * bl->remote_stride + bl->len;
            lo = a < lo ? a : lo;
            hi = z > hi ? z : hi;
        }
        j->bytes = (uint64_t)(j->s1 - j->s0) * bl->len;
        j->maxseg = bl->len;
        j->lo = lo;
        j->hi = hi;
        return;
    }
    for (size_t k = j->s0; k < j->s1; k++) {
        uint64_t len = j->segs[k].len, ro = j->segs[k].remote_off;
        sum += len;
        top = len > top ? len : top;
        lo = ro < lo ? ro : lo;
        hi = ro + len > hi ? ro + len : hi;
    }
    j->bytes = sum;
    j->maxseg = top;
    j->lo = lo;
    j->hi = hi;
}

/* Vectored and block items become jobs of up to IPC_VEC_SEGS_MAX segments;
 * a group holds at most IPC_ACQV_SEGS_MAX segments (one IPC_ACQV_REQ). */
static size_t take_work(struct ipc_conn *c, struct ipc_job *jobs)
{
    size_t n = 0, segs = 0;
    uint64_t bytes = 0, cap = c->group_bytes;
    struct ids_memo memo = {0};
    while (c->qlen && n < IPC_BATCH_MAX && bytes < cap) {
        struct ipc_work *w = &c->q[c->qhead];
        struct ipc_job *j = &jobs[n];
        size_t nseg;
        const struct xfer_seg *sv = xfer_batch_item_segs(w->b, w->i, &nseg);
        *j = (struct ipc_job){.b = w->b, .i = w->i, .ticket = -1, .bad = -1, .segs = sv};
        j->blocks = xfer_batch_item_blocks(w->b, w->i, &j->blk);
        if (!ipc_job_vec(j)) {
            j->bytes = xfer_batch_item(w->b, w->i)->len;
        } else {
            size_t s0 = c->qseg, s1 = nseg - s0 > IPC_VEC_SEGS_MAX ? s0 + IPC_VEC_SEGS_MAX : nseg;
            if (segs + (s1 - s0) > IPC_ACQV_SEGS_MAX)
                break; /* the next group's */
            segs += s1 - s0;
            j->s0 = (uint32_t)s0;
            j->s1 = (uint32_t)s1;
            job_span(j, &memo);
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
    if (ipc_sock_hung_up(c->fd))
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
    /* its naps while batched kernels run (xfer_kbatch_wait: 2-4 us) would
     * last 50 us more with the default timer slack */
    prctl(PR_SET_TIMERSLACK, 1000UL);
    struct ipc_group g[2] = {{.jobs = calloc(IPC_BATCH_MAX, sizeof(struct ipc_job))},
                             {.jobs = calloc(IPC_BATCH_MAX, sizeof(struct ipc_job))}};
    /* without room for batched copies, items are copied one by one */
    size_t nkc = IPC_BATCH_MAX + IPC_ACQV_SEGS_MAX; /* a copy per item or segment */
    g[0].kc = c->t->cuda_devices > 0 ? calloc(nkc, sizeof(struct ipc_kcopy)) : NULL;
    g[1].kc = c->t->cuda_devices > 0 ? calloc(nkc, sizeof(struct ipc_kcopy)) : NULL;
    g[0].kr = c->t->cuda_devices > 0 ? calloc(IPC_BATCH_MAX, sizeof(struct ipc_krun)) : NULL;
    g[1].kr = c->t->cuda_devices > 0 ? calloc(IPC_BATCH_MAX, sizeof(struct ipc_krun)) : NULL;
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
    bool bye = rc < 0 && !c->stop && ipc_sock_said_bye(c->fd); /* nothing of ours cut off */
    if (bye) /* before broken: ipc_conn_state reads both */
        __atomic_store_n(&c->peer_left, true, __ATOMIC_RELAXED);
    if (rc < 0)
        __atomic_store_n(&c->broken, true, __ATOMIC_RELEASE);
    if (bye)
        xfer_info("ipc: %s closed its connection (its engine stopped)",
                  xfer_peer_desc_get(c->base.peer)->node_id);
    else if (rc < 0 && !c->stop) /* a close shuts the socket down: no news */
        xfer_warn("ipc: connection to %s lost: %s", xfer_peer_desc_get(c->base.peer)->node_id,
                  xfer_strerror(rc));
    struct ipc_msgq *mq = c->mhead; /* queued messages fail */
    c->mhead = c->mtail = NULL;
    c->stop = true; /* no more are queued */
    pthread_mutex_unlock(&c->mu);
    ipc_link_fini(c); /* neither are answers read any more */
    while (mq) {
        struct ipc_msgq *next = mq->next;
        xfer_msg_done(mq->m, -XFER_ECONN, "ipc connection to the owner lost"); /* mq too */
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
    free(g[0].kr);
    free(g[1].kr);
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
    if (rc == 0 && (rc = ipc_link_ring_setup(c, hello.flags, timeout_ms)) < 0)
        snprintf(why, why_len, "message ring setup: %s", xfer_strerror(rc));
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
    pthread_mutex_init(&c->dkb_mu, NULL);
    if (pthread_create(&c->worker, NULL, worker_main, c) != 0) {
        pthread_cond_destroy(&c->cv);
        pthread_mutex_destroy(&c->mu);
        pthread_mutex_destroy(&c->link_mu);
        pthread_mutex_destroy(&c->dkb_mu);
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
    ipc_ring_unmap(&c->ring);
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
    ipc_dgpu_fini(c);            /* GPU loans in flight reported */
    ipc_direct_fini(&c->direct); /* before the mappings it points into go */
    ipc_map_clear(&c->maps);
    ipc_ring_unmap(&c->ring);
    ipc_cuda_copier_free(c->copier);
    xfer_kbatch_free(c->kb);
    close(c->fd);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->link_mu);
    pthread_mutex_destroy(&c->dkb_mu);
    free(c->q);
    free(c->acqv);
    free(c->hparts);
    free(c);
}
