/* Control requests -> responses (run on worker threads). */
#include "notify_tag.h"
#include "xfer_io.h"
#include "xferd.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define fail xferd_fail
void xferd_fail(Xctl__Response *resp, struct arena *a, int status, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    resp->status = status;
    resp->message = arena_strdup(a, buf);
}

static Xctl__Layout *layout_msg(struct arena *a, const struct xfer_layout *l)
{
    if (!l->block_bytes && !l->dtype[0] && !l->tag[0])
        return NULL;
    Xctl__Layout *m = arena_alloc(a, sizeof(*m));
    if (!m)
        return NULL;
    xctl__layout__init(m);
    m->dtype = arena_strdup(a, l->dtype);
    m->tag = arena_strdup(a, l->tag);
    m->block_bytes = l->block_bytes;
    m->num_blocks = l->num_blocks;
    m->layers = l->layers;
    return m;
}

static void layout_from_msg(const Xctl__Layout *m, struct xfer_layout *l)
{
    memset(l, 0, sizeof(*l));
    if (!m)
        return;
    snprintf(l->dtype, sizeof(l->dtype), "%s", m->dtype ? m->dtype : "");
    snprintf(l->tag, sizeof(l->tag), "%s", m->tag ? m->tag : "");
    l->block_bytes = m->block_bytes;
    l->num_blocks = m->num_blocks;
    l->layers = m->layers;
}

static Xctl__Region *region_msg(struct arena *a, const char *node,
                                const struct xfer_region_desc *rd)
{
    Xctl__Region *m = arena_alloc(a, sizeof(*m));
    if (!m)
        return NULL;
    xctl__region__init(m);
    m->node = arena_strdup(a, node);
    m->name = arena_strdup(a, rd->name);
    m->id = rd->id;
    m->gen = rd->gen;
    m->kind = arena_strdup(a, rd->kind == XFER_MEM_CUDA ? "cuda" : "host");
    m->device = rd->device;
    m->len = rd->len;
    m->access = arena_strdup(a, xfer_access_str(rd->access));
    m->layout = layout_msg(a, &rd->layout);
    return m;
}

static void do_health(struct xferd *d, Xctl__Response *resp, struct arena *a)
{
    Xctl__HealthInfo *h = arena_alloc(a, sizeof(*h));
    if (!h)
        return;
    xctl__health_info__init(h);
    struct xfer_peer_desc self;
    xfer_engine_describe(d->eng, &self);
    char tr[64] = "";
    xfer_transports_format(self.transports, tr, sizeof(tr));
    h->node = arena_strdup(a, d->cfg.node);
    h->version = arena_strdup(a, XFER_VERSION_STRING);
    h->incarnation = d->incarnation;
    h->uptime_ms = (uint64_t)(xfer_now_ms() - (int64_t)d->started_ms);
    h->registry_ok = xfer_registry_connected(d->reg);
    h->registry_error = arena_strdup(a, h->registry_ok ? "" : "redis unreachable");
    h->draining = atomic_load(&d->draining);
    h->transports = arena_strdup(a, tr);
    resp->body_case = XCTL__RESPONSE__BODY_HEALTH;
    resp->health = h;
}

struct count_arg {
    uint32_t n;
};
static void count_region(const struct xfer_region_desc *rd, void *arg)
{
    (void)rd;
    ((struct count_arg *)arg)->n++;
}
static void count_peer(xfer_peer *p, void *arg)
{
    (void)p;
    ((struct count_arg *)arg)->n++;
}

static void do_peers(struct xferd *d, Xctl__Response *resp, struct arena *a)
{
    struct xfer_node_desc *nodes = NULL;
    size_t n = 0;
    int rc = xfer_registry_list_nodes(d->reg, &nodes, &n);
    if (rc) {
        fail(resp, a, rc, "listing peers: %s", xfer_registry_last_error(d->reg));
        return;
    }
    arena_adopt(a, nodes ? (void *)nodes : malloc(1));
    Xctl__PeerList *pl = arena_alloc(a, sizeof(*pl));
    Xctl__Peer **arr = arena_alloc(a, (n ? n : 1) * sizeof(*arr));
    if (!pl || !arr)
        return;
    xctl__peer_list__init(pl);
    for (size_t i = 0; i < n; i++) {
        const struct xfer_node_desc *nd = &nodes[i];
        Xctl__Peer *m = arena_alloc(a, sizeof(*m));
        if (!m)
            return;
        xctl__peer__init(m);
        char tr[64] = "";
        xfer_transports_format(nd->peer.transports, tr, sizeof(tr));
        m->node = arena_strdup(a, nd->peer.node_id);
        m->addr = arena_strdup(a, nd->peer.addr);
        m->ctrl_port = nd->ctrl_port;
        m->data_port = nd->peer.data_port;
        m->transports = arena_strdup(a, tr);
        m->host_id = arena_strdup(a, nd->peer.host_id);
        m->incarnation = nd->peer.incarnation;
        m->heartbeat_ms = nd->heartbeat_ms;
        m->alive = true;
        unsigned t = xfer_node_peer_transport(d->node, nd->peer.node_id);
        tr[0] = 0;
        if (t)
            xfer_transports_format(t, tr, sizeof(tr));
        m->connected = t != 0;
        m->transport = arena_strdup(a, tr);
        arr[i] = m;
    }
    pl->n_peers = n;
    pl->peers = arr;
    resp->body_case = XCTL__RESPONSE__BODY_PEERS;
    resp->peers = pl;
}

struct region_walk {
    struct arena *a;
    const char *node;
    Xctl__Region **arr;
    size_t n, cap;
};
static void add_region(const struct xfer_region_desc *rd, void *arg)
{
    struct region_walk *w = arg;
    if (w->n < w->cap)
        w->arr[w->n++] = region_msg(w->a, w->node, rd);
}

static void do_regions(struct xferd *d, const char *node, Xctl__Response *resp, struct arena *a)
{
    struct region_walk w = {.a = a, .node = node};
    if (!strcmp(node, d->cfg.node)) {
        struct count_arg cnt = {0};
        pthread_rwlock_rdlock(&d->region_lock);
        xfer_region_foreach(d->eng, count_region, &cnt);
        w.cap = cnt.n;
        w.arr = arena_alloc(a, (w.cap + 1) * sizeof(*w.arr));
        if (w.arr)
            xfer_region_foreach(d->eng, add_region, &w);
        pthread_rwlock_unlock(&d->region_lock);
    } else {
        struct xfer_region_desc *rds = NULL;
        size_t n = 0;
        int rc = xfer_registry_list_regions(d->reg, node, &rds, &n);
        if (rc) {
            fail(resp, a, rc, "%s", xfer_registry_last_error(d->reg));
            return;
        }
        arena_adopt(a, rds ? (void *)rds : malloc(1));
        w.cap = n;
        w.arr = arena_alloc(a, (n + 1) * sizeof(*w.arr));
        for (size_t i = 0; w.arr && i < n; i++)
            add_region(&rds[i], &w);
    }
    Xctl__RegionList *rl = arena_alloc(a, sizeof(*rl));
    if (!rl || !w.arr)
        return;
    xctl__region_list__init(rl);
    rl->n_regions = w.n;
    rl->regions = w.arr;
    resp->body_case = XCTL__RESPONSE__BODY_REGIONS;
    resp->regions = rl;
}

static void add_host_bytes(const struct xfer_region_desc *rd, void *arg)
{
    if (rd->kind == XFER_MEM_HOST)
        *(uint64_t *)arg += rd->len;
}

/* Host memory in regions is capped (max_region_bytes): a client cannot make
 * xferd allocate or map more than the machine holds. */
static void do_register(struct xferd *d, const Xctl__RegisterRegion *m, int fd,
                        Xctl__Response *resp, struct arena *a)
{
    unsigned access = XFER_ACCESS_RW;
    if (m->access && *m->access && xfer_access_parse(m->access, &access)) {
        fail(resp, a, -XFER_EINVAL, "bad access '%s' (want r, w or rw)", m->access);
        goto out;
    }
    if (!m->name || !xfer_registry_name_ok(m->name) || strchr(m->name, '/') ||
        strpbrk(m->name, "+#")) {
        fail(resp, a, -XFER_EINVAL, "bad region name '%s'", m->name ? m->name : "");
        goto out;
    }
    if (!m->len) {
        fail(resp, a, -XFER_EINVAL, "region '%s' needs a length", m->name);
        goto out;
    }
    bool priv = m->private_ || m->name[0] == XFERD_PRIVATE_PREFIX;
    xfer_region *r = NULL;
    pthread_rwlock_wrlock(&d->region_lock);
    int rc;
    uint64_t held = 0, limit = d->cfg.max_region_bytes;
    if (!m->cuda_ipc.len && limit)
        xfer_region_foreach(d->eng, add_host_bytes, &held);
    if (!m->cuda_ipc.len && limit && (m->len > limit || held > limit - m->len)) {
        pthread_rwlock_unlock(&d->region_lock);
        fail(resp, a, -XFER_ENOSPC,
             "register '%s': %llu bytes would take this node's regions past max_region_bytes "
             "(%llu bytes, %llu held)",
             m->name, (unsigned long long)m->len, (unsigned long long)limit,
             (unsigned long long)held);
        goto out;
    }
    if (m->cuda_ipc.len && fd < 0)
        rc = xfer_region_adopt_cuda(d->eng, m->name, m->cuda_ipc.data, m->cuda_ipc.len, m->gpu,
                                    m->cuda_offset, m->len, access, &r);
    else if (m->cuda_ipc.len)
        rc = -XFER_EINVAL; /* memory is either a memfd or a CUDA handle */
    else if (fd >= 0)
        rc = xfer_region_adopt_memfd(d->eng, m->name, fd, m->len, access, &r);
    else
        rc = xfer_region_alloc(d->eng, m->name, m->len, access, &r);
    if (rc && fd >= 0)
        close(fd); /* the engine owns it only on success */
    fd = -1;
    struct xfer_layout l;
    layout_from_msg(m->layout, &l);
    if (rc == 0 && m->layout && (rc = xfer_region_set_layout(r, &l)) != 0)
        xfer_region_deregister(d->eng, r);
    if (rc == 0 && !priv && xfer_node_region_publish(d->node, r))
        xfer_warn("publishing region %s: %s", m->name, xfer_node_last_error(d->node));
    struct xfer_region_desc rd;
    if (rc == 0)
        xfer_region_describe(r, &rd);
    pthread_rwlock_unlock(&d->region_lock);
    if (rc) {
        fail(resp, a, rc, "register '%s': %s", m->name, xfer_engine_last_error(d->eng));
        return;
    }
    xfer_info("region %s registered (%llu bytes, %s%s)", m->name, (unsigned long long)m->len,
              xfer_access_str(access), priv ? ", private" : "");
    resp->body_case = XCTL__RESPONSE__BODY_REGION;
    resp->region = region_msg(a, d->cfg.node, &rd);
out:
    if (fd >= 0)
        close(fd);
}

static void do_deregister(struct xferd *d, const char *name, Xctl__Response *resp, struct arena *a)
{
    pthread_rwlock_wrlock(&d->region_lock);
    xfer_region *r = name ? xfer_region_find(d->eng, name) : NULL;
    int rc = r ? xfer_node_region_detach(d->node, r) : -XFER_ENOENT;
    pthread_rwlock_unlock(&d->region_lock);
    /* Detached: no transfer finds it any more. The wait for accesses in
     * progress (bounded, docs/engine.md) holds no lock of ours. */
    if (!rc)
        rc = xfer_node_region_deregister(d->node, r);
    if (rc)
        fail(resp, a, rc, "deregister '%s': %s", name ? name : "",
             rc == -XFER_ENOENT ? "no such region here" : xfer_node_last_error(d->node));
    else
        xfer_info("region %s deregistered", name);
}

static int batch_deadline(struct xferd *d, const Xctl__SubmitBatch *b)
{
    return b->deadline_ms ? (int)b->deadline_ms : d->cfg.request_timeout_ms;
}

static void run_items(struct xferd *d, const Xctl__SubmitBatch *b, uint32_t hops,
                      Xctl__ItemResult **items, struct arena *a)
{
    for (size_t i = 0; i < b->n_items; i++) {
        items[i] = arena_alloc(a, sizeof(*items[i]));
        if (!items[i])
            return;
        xctl__item_result__init(items[i]);
    }
    if (b->n_items == 1)
        xferd_transfer_notify(d, b->items[0], b->notify.len ? b->notify.data : NULL, b->notify.len,
                              hops, batch_deadline(d, b), items[0], a);
    else
        xferd_transfer_many(d, b->items, b->n_items, b->notify.len ? b->notify.data : NULL,
                            b->notify.len, hops, batch_deadline(d, b), items, a);
}

struct ctl_quota *ctl_quota_new(void)
{
    struct ctl_quota *q = calloc(1, sizeof(*q));
    if (q)
        atomic_init(&q->refs, 1);
    return q;
}

void ctl_quota_put(struct ctl_quota *q)
{
    if (q && atomic_fetch_sub(&q->refs, 1) == 1)
        free(q);
}

struct async_job {
    struct job job;
    struct xferd *d;
    struct ctl_quota *q;      /* the submitting client's: one async slot, one ref */
    Xctl__SubmitBatch *batch; /* unpacked copy, owned */
    uint32_t hops;
    uint64_t id;
};

static void async_run(struct job *j)
{
    struct async_job *aj = (struct async_job *)j;
    struct arena a = {0};
    size_t n = aj->batch->n_items;
    Xctl__ItemResult **items = arena_alloc(&a, (n + 1) * sizeof(*items));
    if (items) {
        run_items(aj->d, aj->batch, aj->hops, items, &a);
        if (!a.failed)
            batch_table_finish(aj->d->batches, aj->id, items, n);
    }
    arena_free(&a);
}

static void async_done(struct job *j)
{
    struct async_job *aj = (struct async_job *)j;
    xctl__submit_batch__free_unpacked(aj->batch, NULL);
    if (aj->q) {
        atomic_fetch_sub(&aj->q->async, 1);
        ctl_quota_put(aj->q);
    }
    free(aj);
}

/* Copies the batch (the request dies with the response) and queues it. */
static int start_async(struct xferd *d, const Xctl__SubmitBatch *b, uint32_t hops,
                       struct ctl_quota *q, uint64_t *id)
{
    if (q && atomic_fetch_add(&q->async, 1) >= XFERD_MAX_ASYNC_PER_CLIENT) {
        atomic_fetch_sub(&q->async, 1);
        return -XFER_EBUSY;
    }
    size_t len = xctl__submit_batch__get_packed_size(b);
    uint8_t *buf = malloc(len ? len : 1);
    struct async_job *aj = calloc(1, sizeof(*aj));
    if (!buf || !aj)
        goto nomem;
    xctl__submit_batch__pack(b, buf);
    aj->batch = xctl__submit_batch__unpack(NULL, len, buf);
    free(buf);
    buf = NULL;
    if (!aj->batch)
        goto nomem;
    aj->job.run = async_run;
    aj->job.done = async_done;
    aj->d = d;
    aj->hops = hops;
    aj->q = q;
    if (q)
        atomic_fetch_add(&q->refs, 1);
    aj->id = *id = batch_table_add(d->batches, b->n_items);
    if (jobq_push(d->async_jobs, &aj->job)) {
        aj->job.done(&aj->job);
        return -XFER_EBUSY;
    }
    return 0;
nomem:
    free(buf);
    free(aj);
    if (q)
        atomic_fetch_sub(&q->async, 1);
    return -XFER_ENOMEM;
}

#define BATCH_MAX_ITEMS 4096

static void do_batch(struct xferd *d, const Xctl__SubmitBatch *b, uint32_t hops,
                     struct ctl_quota *q, Xctl__Response *resp, struct arena *a)
{
    if (b->n_items == 0 || b->n_items > BATCH_MAX_ITEMS) {
        fail(resp, a, -XFER_EINVAL, "a batch holds 1..%d transfers", BATCH_MAX_ITEMS);
        return;
    }
    if (b->notify.len > XFERD_NOTIFY_MAX) {
        fail(resp, a, -XFER_EINVAL, "notification of %zu bytes is over the limit (%u bytes)",
             b->notify.len, XFERD_NOTIFY_MAX);
        return;
    }
    Xctl__BatchResult *br = arena_alloc(a, sizeof(*br));
    if (!br)
        return;
    xctl__batch_result__init(br);
    resp->body_case = XCTL__RESPONSE__BODY_BATCH;
    resp->batch = br;
    if (b->async) {
        int rc = start_async(d, b, hops, q, &br->batch_id);
        if (rc == -XFER_EBUSY && !atomic_load(&d->draining))
            fail(resp, a, rc,
                 "cannot start batch: this client has %d async batches running (the limit); "
                 "query them (QueryStatus) and submit again when some are done",
                 XFERD_MAX_ASYNC_PER_CLIENT);
        else if (rc)
            fail(resp, a, rc, "cannot start batch: %s", xfer_strerror(rc));
        return;
    }
    br->items = arena_alloc(a, b->n_items * sizeof(*br->items));
    if (!br->items)
        return;
    run_items(d, b, hops, br->items, a);
    br->n_items = b->n_items;
    br->done = true;
    for (size_t i = 0; i < b->n_items && br->items[i]; i++)
        if (br->items[i]->status) {
            /* The first failure becomes the response's status and reason. */
            resp->status = br->items[i]->status;
            resp->message = b->n_items == 1
                                ? br->items[i]->message
                                : arena_printf(a, "item %zu: %s", i, br->items[i]->message);
            break;
        }
}

static Xctl__Stats *stats_msg(struct arena *a, const struct xfer_stats *s)
{
    Xctl__Stats *m = arena_alloc(a, sizeof(*m));
    uint64_t *h = arena_alloc(a, sizeof(s->lat_hist));
    if (!m || !h)
        return NULL;
    xctl__stats__init(m);
    m->ops_read = s->ops_read;
    m->ops_write = s->ops_write;
    m->bytes_read = s->bytes_read;
    m->bytes_written = s->bytes_written;
    m->errors = s->errors;
    m->served_ops = s->served_ops;
    m->served_bytes = s->served_bytes;
    m->served_errors = s->served_errors;
    m->lat_us_sum = s->lat_us_sum;
    memcpy(h, s->lat_hist, sizeof(s->lat_hist));
    m->lat_hist = h;
    m->n_lat_hist = XFER_LAT_BUCKETS;
    return m;
}

struct peer_stats_walk {
    struct arena *a;
    Xctl__NamedStats **arr;
    size_t n, cap;
};
static void add_peer_stats(xfer_peer *p, void *arg)
{
    struct peer_stats_walk *w = arg;
    if (w->n >= w->cap)
        return;
    struct xfer_peer_desc pd;
    struct xfer_stats st;
    xfer_peer_describe(p, &pd);
    xfer_peer_stats(p, &st);
    Xctl__NamedStats *ns = arena_alloc(w->a, sizeof(*ns));
    if (!ns)
        return;
    xctl__named_stats__init(ns);
    ns->name = arena_strdup(w->a, pd.node_id);
    ns->stats = stats_msg(w->a, &st);
    w->arr[w->n++] = ns;
}

static void do_stats(struct xferd *d, Xctl__Response *resp, struct arena *a)
{
    Xctl__StatsInfo *si = arena_alloc(a, sizeof(*si));
    if (!si)
        return;
    xctl__stats_info__init(si);
    struct xfer_stats st;
    xfer_engine_stats(d->eng, &st);
    si->node = arena_strdup(a, d->cfg.node);
    si->total = stats_msg(a, &st);
    si->ctl_requests = atomic_load(&d->ctl_requests);
    si->ctl_errors = atomic_load(&d->ctl_errors);
    struct count_arg cnt = {0};
    xfer_peer_foreach(d->eng, count_peer, &cnt);
    struct peer_stats_walk w = {.a = a, .cap = cnt.n};
    w.arr = arena_alloc(a, (cnt.n + 1) * sizeof(*w.arr));
    if (w.arr)
        xfer_peer_foreach(d->eng, add_peer_stats, &w);
    si->peers = w.arr;
    si->n_peers = w.n;
    si->transports = arena_alloc(a, 4 * sizeof(*si->transports));
    for (unsigned bit = 1; si->transports && bit <= XFER_TRANSPORT_TCPX; bit <<= 1) {
        char name[16];
        xfer_transport_stats(d->eng, bit, &st);
        if (!st.ops_read && !st.ops_write && !st.served_ops && !st.errors)
            continue;
        Xctl__NamedStats *ns = arena_alloc(a, sizeof(*ns));
        if (!ns)
            break;
        xctl__named_stats__init(ns);
        xfer_transports_format(bit, name, sizeof(name));
        ns->name = arena_strdup(a, name);
        ns->stats = stats_msg(a, &st);
        si->transports[si->n_transports++] = ns;
    }
    resp->body_case = XCTL__RESPONSE__BODY_STATS;
    resp->stats = si;
}

static void free_response(void *p)
{
    xctl__response__free_unpacked(p, NULL);
}

/* Another node's answer becomes ours: the response is re-packed into a. */
void xferd_forward_whole(struct xferd *d, const char *node, const Xctl__Request *req,
                         Xctl__Response *resp, struct arena *a)
{
    if (req->hops >= 1) {
        fail(resp, a, -XFER_EINVAL, "request for %s reached %s after forwarding", node,
             d->cfg.node);
        return;
    }
    Xctl__Request fwd = *req;
    fwd.hops = req->hops + 1;
    Xctl__Response *r = NULL;
    char why[300];
    int rc = xferd_forward(d, node, &fwd, &r, xferd_clamp_deadline(d, d->cfg.request_timeout_ms),
                           why, sizeof(why));
    if (rc) {
        fail(resp, a, rc, "%s", why);
        return;
    }
    /* The unpacked tree lives until the response is sent. */
    if (arena_defer(a, free_response, r)) {
        fail(resp, a, -XFER_ENOMEM, "out of memory");
        return;
    }
    uint64_t id = resp->id;
    *resp = *r;
    resp->id = id;
}

static void do_write(struct xferd *d, const Xctl__WriteData *m, uint32_t hops, Xctl__Response *resp,
                     struct arena *a)
{
    char why[300];
    int rc = xferd_write_data(d, m->dst, m->data.data, m->data.len, hops, why, sizeof(why));
    if (rc)
        fail(resp, a, rc, "%s", why);
}

static void do_read(struct xferd *d, const Xctl__ReadData *m, uint32_t hops, Xctl__Response *resp,
                    struct arena *a)
{
    char why[300];
    uint8_t *buf = NULL;
    if (m->len > XFER_FRAME_MAX - 1024) {
        fail(resp, a, -XFER_EINVAL, "read of %llu bytes is over the inline limit (use get)",
             (unsigned long long)m->len);
        return;
    }
    int rc = xferd_read_data(d, m->src, m->len, hops, &buf, why, sizeof(why));
    if (rc) {
        fail(resp, a, rc, "%s", why);
        return;
    }
    arena_adopt(a, buf ? buf : malloc(1));
    Xctl__Data *dm = arena_alloc(a, sizeof(*dm));
    if (!dm)
        return;
    xctl__data__init(dm);
    dm->data.data = buf;
    dm->data.len = m->len;
    resp->body_case = XCTL__RESPONSE__BODY_DATA;
    resp->data = dm;
}

static void do_query(struct xferd *d, uint64_t id, Xctl__Response *resp, struct arena *a)
{
    Xctl__BatchResult *br = arena_alloc(a, sizeof(*br));
    if (!br)
        return;
    xctl__batch_result__init(br);
    int rc = batch_table_query(d->batches, id, br, a);
    if (rc) {
        fail(resp, a, rc, "unknown batch %llu", (unsigned long long)id);
        return;
    }
    resp->body_case = XCTL__RESPONSE__BODY_BATCH;
    resp->batch = br;
}

void xferd_handle(struct xferd *d, const Xctl__Request *req, int fd, struct ctl_quota *q,
                  Xctl__Response *resp, struct arena *a)
{
    xctl__response__init(resp);
    resp->id = req->id;
    const char *node;
    switch (req->body_case) {
    case XCTL__REQUEST__BODY_HEALTH:
        do_health(d, resp, a);
        break;
    case XCTL__REQUEST__BODY_PEERS:
        do_peers(d, resp, a);
        break;
    case XCTL__REQUEST__BODY_REGIONS:
        node = req->regions->node && *req->regions->node ? req->regions->node : d->cfg.node;
        do_regions(d, node, resp, a);
        break;
    case XCTL__REQUEST__BODY_REG:
        do_register(d, req->reg, fd, resp, a);
        fd = -1;
        break;
    case XCTL__REQUEST__BODY_DEREG:
        do_deregister(d, req->dereg->name, resp, a);
        break;
    case XCTL__REQUEST__BODY_BATCH:
        do_batch(d, req->batch, req->hops, q, resp, a);
        break;
    case XCTL__REQUEST__BODY_QUERY:
        do_query(d, req->query->batch_id, resp, a);
        break;
    case XCTL__REQUEST__BODY_STATS:
        node = req->stats->node;
        if (node && *node && strcmp(node, d->cfg.node))
            xferd_forward_whole(d, node, req, resp, a);
        else
            do_stats(d, resp, a);
        break;
    case XCTL__REQUEST__BODY_WRITE:
        do_write(d, req->write, req->hops, resp, a);
        break;
    case XCTL__REQUEST__BODY_READ:
        do_read(d, req->read, req->hops, resp, a);
        break;
    case XCTL__REQUEST__BODY_NOTIFY:
        xferd_do_notify(d, req->notify, resp, a);
        break;
    case XCTL__REQUEST__BODY_POOLS:
        node = req->pools->node && *req->pools->node ? req->pools->node : d->cfg.node;
        xferd_do_pools(d, node, resp, a);
        break;
    case XCTL__REQUEST__BODY_POOL_CREATE:
        xferd_do_pool_create(d, req->pool_create, resp, a);
        break;
    case XCTL__REQUEST__BODY_POOL_DELETE:
        xferd_do_pool_delete(d, req->pool_delete->name, resp, a);
        break;
    case XCTL__REQUEST__BODY_POOL_COPY:
        xferd_do_pool_copy(d, req, resp, a);
        break;
    default:
        fail(resp, a, -XFER_EPROTO, "unknown request");
        break;
    }
    if (fd >= 0)
        close(fd);
    if (a->failed) {
        xctl__response__init(resp);
        resp->id = req->id;
        resp->status = -XFER_ENOMEM;
        resp->message = "out of memory";
    }
    if (resp->status)
        atomic_fetch_add(&d->ctl_errors, 1);
}
