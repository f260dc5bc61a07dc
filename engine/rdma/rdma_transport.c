/* rdma transport: the ops table, open/close, reachability, connection
 * objects. Tunables (environment):
 *   XFER_RDMA_QPS           QPs per local NIC per peer (default 2, max 16)
 *   XFER_RDMA_SQ_DEPTH      send queue depth per QP (default 128)
 *   XFER_RDMA_SIGNAL_EVERY  signal one WR in N (default 16)
 *   XFER_RDMA_GID_INDEX     force a GID index (default: RoCE v2 IPv4)
 *   XFER_RDMA_DEVICES       only these devices, "mlx5_0,mlx5_1"
 *   XFER_RDMA_PORT          first CM port (one per NIC; default ephemeral) */
#include "rdma.h"

extern const struct xfer_transport_ops xfer_rdma_transport_ops;

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static long env_long(const char *name, long def, long lo, long hi)
{
    const char *s = getenv(name);
    if (!s || !*s)
        return def;
    long v = strtol(s, NULL, 10);
    return v < lo ? lo : v > hi ? hi : v;
}

static int xrdma_probe(xfer_engine *e, char *why, size_t why_len)
{
    (void)e;
    return xrdma_devices_probe(why, why_len);
}

static void tunables(struct rdma_transport *t)
{
    t->qps_per_nic = (int)env_long("XFER_RDMA_QPS", 2, 1, 16);
    t->sq_depth = (uint32_t)env_long("XFER_RDMA_SQ_DEPTH", 128, 4, 4096);
    t->signal_every = (uint32_t)env_long("XFER_RDMA_SIGNAL_EVERY", 16, 1, 1024);
    t->n_progress = t->cfg->progress_threads > 0 ? t->cfg->progress_threads : 1;
    if (t->n_progress > RDMA_MAX_PROGRESS)
        t->n_progress = RDMA_MAX_PROGRESS;
    t->chunk = t->cfg->chunk_bytes ? t->cfg->chunk_bytes : (1u << 20);
    for (int i = 0; i < t->n_nics; i++) {
        if (t->sq_depth > t->nics[i].max_qp_wr)
            t->sq_depth = t->nics[i].max_qp_wr;
        if (t->chunk > t->nics[i].max_msg)
            t->chunk = t->nics[i].max_msg;
    }
    t->cq_depth = t->sq_depth * 64; /* 64 QPs per progress thread and NIC */
}

static void xrdma_close(struct xfer_transport *tr)
{
    if (!tr)
        return;
    struct rdma_transport *t = xrdma_of(tr);
    xrdma_cm_stop(t);
    xrdma_progress_stop(t);
    xrdma_regions_release(t);
    /* The engine disconnected every peer before; nothing may be left. */
    if (t->slots) {
        for (int i = 0; i < RDMA_MAX_SLOTS; i++)
            pthread_mutex_destroy(&t->slots[i].lock);
        free(t->slots);
    }
    xrdma_lease_fini(t); /* windows died with their QPs; before the PDs go */
    xrdma_devices_close(t);
    xfer_rdma_replay_free(&t->replay);
    pthread_cond_destroy(&t->acc_cond);
    pthread_mutex_destroy(&t->acc_lock);
    pthread_mutex_destroy(&t->lock);
    free(t);
}

static int xrdma_open(xfer_engine *e, struct xfer_transport **out)
{
    struct rdma_transport *t = calloc(1, sizeof(*t));
    char why[256] = "";
    if (!t)
        return -XFER_ENOMEM;
    t->base.ops = &xfer_rdma_transport_ops;
    t->base.engine = e;
    t->cfg = xfer_engine_config_get(e);
    t->cm_wake_fd = -1;
    pthread_mutex_init(&t->lock, NULL);
    pthread_mutex_init(&t->acc_lock, NULL);
    pthread_cond_init(&t->acc_cond, NULL);
    xrdma_lease_init(t);
    struct xfer_peer_desc self;
    xfer_engine_describe(e, &self);
    t->self = (struct xfer_rdma_self){.node_id = t->cfg->node_id,
                                      .incarnation = self.incarnation,
                                      .secret = t->cfg->secret,
                                      .secret_len = t->cfg->secret_len};
    t->slots = calloc(RDMA_MAX_SLOTS, sizeof(*t->slots));
    int rc = t->slots ? 0 : -XFER_ENOMEM;
    for (int i = 0; t->slots && i < RDMA_MAX_SLOTS; i++) {
        pthread_mutex_init(&t->slots[i].lock, NULL);
        t->slots[i].tag = TAG_SLOT;
        t->slots[i].index = (uint32_t)i;
    }
    if (rc == 0)
        rc = xrdma_devices_open(t, why, sizeof(why));
    if (rc == 0) {
        tunables(t);
        rc = xrdma_progress_start(t, why, sizeof(why));
    }
    if (rc == 0)
        rc = xrdma_cm_start(t, why, sizeof(why));
    if (rc < 0) {
        xfer_engine_set_error(e, "%s", why[0] ? why : xfer_strerror(rc));
        xrdma_close(&t->base);
        return rc;
    }
    xfer_info("rdma: %d NIC(s): %s; %d QPs/NIC, sq depth %u, signal every %u, chunk %llu",
              t->n_nics, t->nic_list, t->qps_per_nic, t->sq_depth, t->signal_every,
              (unsigned long long)t->chunk);
    *out = &t->base;
    return 0;
}

static void xrdma_describe(struct xfer_transport *tr, struct xfer_peer_desc *self)
{
    struct rdma_transport *t = xrdma_of(tr);
    snprintf(self->nics, sizeof(self->nics), "%s", t->nic_list);
}

/* Both sides have NICs, of one link layer (RoCE reaches RoCE, IB reaches IB). */
static bool xrdma_reaches(struct xfer_transport *tr, const struct xfer_peer_desc *peer)
{
    struct rdma_transport *t = xrdma_of(tr);
    struct xfer_rdma_nic_desc rn[XFER_RDMA_MAX_NICS];
    int n = xfer_rdma_nics_parse(peer->nics, rn, XFER_RDMA_MAX_NICS);
    if (!(peer->transports & XFER_TRANSPORT_RDMA) || n <= 0)
        return false;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < t->n_nics; j++)
            if (rn[i].ib == t->nics[j].desc.ib)
                return true;
    return false;
}

/* Reserves one slot per (local NIC, QP); local NIC i talks to remote NIC
 * i mod n_remote of the same link layer. t->lock held. */
static int conn_slots(struct rdma_transport *t, struct rdma_conn *c)
{
    uint32_t next = 0;
    for (int i = 0; i < t->n_nics; i++) {
        int rn = -1;
        for (int k = 0; k < c->n_rnics && rn < 0; k++) {
            int j = (i + k) % c->n_rnics;
            if (c->rnics[j].ib == t->nics[i].desc.ib)
                rn = j;
        }
        for (int q = 0; rn >= 0 && q < t->qps_per_nic; q++) {
            while (next < RDMA_MAX_SLOTS && t->slots[next].state != SLOT_FREE)
                next++;
            struct rdma_progress *p = &t->progress[(c->n_slots) % t->n_progress];
            if (next == RDMA_MAX_SLOTS || p->cq_room[i] < t->sq_depth)
                return -XFER_ENOSPC;
            struct rdma_slot *s = &t->slots[next];
            pthread_mutex_lock(&s->lock);
            int rc = xfer_rdma_ring_init(&s->ring, t->sq_depth);
            s->state = rc ? SLOT_FREE : SLOT_IDLE;
            s->conn = c;
            s->lnic = i;
            s->rnic = rn;
            s->prog = p;
            s->depth = t->sq_depth;
            s->next_seq = 1;
            s->conn_pos = c->n_slots;
            s->failures = 0;
            s->retry_at_ms = 0;
            pthread_mutex_unlock(&s->lock);
            if (rc)
                return rc;
            p->cq_room[i] -= t->sq_depth;
            c->slots[c->n_slots++] = next;
        }
    }
    return c->n_slots ? 0 : -XFER_ENOTSUP;
}

static void slots_release(struct rdma_transport *t, struct rdma_conn *c)
{
    for (int i = 0; i < c->n_slots; i++) {
        struct rdma_slot *s = &t->slots[c->slots[i]];
        s->prog->cq_room[s->lnic] += t->sq_depth;
    }
}

static void xrdma_disconnect(struct xfer_conn *xc)
{
    struct rdma_conn *c = container_of(xc, struct rdma_conn, base);
    struct rdma_transport *t = c->t;
    pthread_mutex_lock(&c->lock);
    c->closing = true;
    pthread_mutex_unlock(&c->lock);
    xrdma_cm_kick(t);
    struct timespec dl = xfer_mono_after_ms(30000);
    pthread_mutex_lock(&c->lock);
    int rc = 0;
    while (!c->torn_down && rc == 0)
        rc = pthread_cond_timedwait(&c->cond, &c->lock, &dl);
    bool done = c->torn_down;
    pthread_mutex_unlock(&c->lock);
    if (!done) { /* the CM thread is wedged: leak rather than free under it */
        xfer_err("rdma: connection to %s not torn down in 30 s", c->peer.node_id);
        return;
    }
    pthread_mutex_lock(&t->lock);
    for (struct rdma_conn **pp = &t->conns; *pp; pp = &(*pp)->next)
        if (*pp == c) {
            *pp = c->next;
            break;
        }
    slots_release(t, c);
    pthread_mutex_unlock(&t->lock);
    xrdma_msg_conn_free(c); /* every QP is destroyed: no SEND reads it any more */
    pthread_cond_destroy(&c->cond);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

/* Waits until every QP is settled (connected, or failed once) or the
 * deadline; 0 when at least one QP is connected. */
static int wait_connected(struct rdma_conn *c, int timeout_ms, char *why, size_t why_len)
{
    struct rdma_transport *t = c->t;
    struct timespec dl = xfer_mono_after_ms(timeout_ms);
    pthread_mutex_lock(&c->lock);
    for (;;) {
        int ready = 0, settled = 0;
        for (int i = 0; i < c->n_slots; i++) {
            struct rdma_slot *s = &t->slots[c->slots[i]];
            pthread_mutex_lock(&s->lock);
            ready += s->state == SLOT_READY;
            settled += s->state == SLOT_READY || s->state == SLOT_FAILED ||
                       (s->state == SLOT_IDLE && s->failures > 0);
            pthread_mutex_unlock(&s->lock);
        }
        if (settled == c->n_slots) {
            int rc = ready ? 0 : c->why_rc ? c->why_rc : -XFER_ECONN;
            snprintf(why, why_len, "%s", c->why);
            pthread_mutex_unlock(&c->lock);
            return rc;
        }
        if (pthread_cond_timedwait(&c->cond, &c->lock, &dl)) {
            snprintf(why, why_len, "%d of %d queue pairs connected in %d ms%s%s", ready, c->n_slots,
                     timeout_ms, c->why[0] ? "; last error: " : "", c->why);
            pthread_mutex_unlock(&c->lock);
            return ready ? 0 : -XFER_ETIMEDOUT;
        }
    }
}

static int xrdma_connect(struct xfer_transport *tr, xfer_peer *peer, int timeout_ms,
                         struct xfer_conn **out)
{
    struct rdma_transport *t = xrdma_of(tr);
    struct rdma_conn *c = calloc(1, sizeof(*c));
    if (!c)
        return -XFER_ENOMEM;
    c->t = t;
    c->base.transport = tr;
    c->base.peer = peer;
    c->peer = *xfer_peer_desc_get(peer);
    pthread_mutex_init(&c->lock, NULL);
    xfer_cond_init_mono(&c->cond);
    c->n_rnics = xfer_rdma_nics_parse(c->peer.nics, c->rnics, XFER_RDMA_MAX_NICS);
    if (c->n_rnics <= 0) {
        xfer_engine_set_error(t->base.engine, "rdma: peer %s publishes no usable NIC list",
                              c->peer.node_id);
        free(c);
        return -XFER_EPROTO;
    }
    int rc = xrdma_msg_conn_init(c, t->n_nics * t->qps_per_nic);
    if (rc < 0) {
        free(c);
        return rc;
    }
    pthread_mutex_lock(&t->lock);
    rc = conn_slots(t, c);
    if (rc == 0) {
        c->next = t->conns;
        t->conns = c;
    } else {
        for (int i = 0; i < c->n_slots; i++) {
            struct rdma_slot *s = &t->slots[c->slots[i]];
            xfer_rdma_ring_free(&s->ring);
            s->conn = NULL;
            s->state = SLOT_FREE;
        }
        slots_release(t, c);
    }
    pthread_mutex_unlock(&t->lock);
    if (rc < 0) {
        xfer_engine_set_error(t->base.engine, "rdma: no queue pair for %s: %s", c->peer.node_id,
                              xfer_strerror(rc));
        xrdma_msg_conn_free(c);
        free(c);
        return rc;
    }
    xrdma_cm_kick(t);
    char why[256];
    rc = wait_connected(c, timeout_ms, why, sizeof(why));
    if (rc < 0) {
        xfer_engine_set_error(t->base.engine, "rdma: connect to %s: %s", c->peer.node_id, why);
        xrdma_disconnect(&c->base);
        return rc;
    }
    *out = &c->base;
    return 0;
}

/* All channels dead: no QP up or on its way and the last attempt failed.
 * The engine then fails messages waiting on the peer (RECVs naming it,
 * SENDs waiting for a FIN) and tries a new connection in the background;
 * the CM thread keeps re-establishing this one's QPs meanwhile. */
static unsigned xrdma_conn_state(struct xfer_conn *xc)
{
    struct rdma_conn *c = container_of(xc, struct rdma_conn, base);
    return __atomic_load_n(&c->unreachable, __ATOMIC_RELAXED) ? XFER_CONN_ALL_DEAD : 0;
}

const struct xfer_transport_ops xfer_rdma_transport_ops = {
    .name = "rdma",
    .bit = XFER_TRANSPORT_RDMA,
#if XFER_WITH_CUDA
    .caps = XFER_CAP_HOST_MEM | XFER_CAP_CUDA_MEM | XFER_CAP_NEEDS_REG,
#else
    .caps = XFER_CAP_HOST_MEM | XFER_CAP_NEEDS_REG,
#endif
    .preference = 50, /* after ipc (same host), before tcp */
    .probe = xrdma_probe,
    .open = xrdma_open,
    .close = xrdma_close,
    .reaches = xrdma_reaches,
    .connect = xrdma_connect,
    .disconnect = xrdma_disconnect,
    .conn_state = xrdma_conn_state,
    .reg_mem = xrdma_reg_mem,
    .dereg_mem = xrdma_dereg_mem,
    .post = xrdma_post,
    .describe = xrdma_describe,
    .describe_region = xrdma_describe_region,
    .send_msg = xrdma_send_msg,
    .lease_check = xrdma_lease_check,
    .leases_changed = xrdma_leases_changed,
};
