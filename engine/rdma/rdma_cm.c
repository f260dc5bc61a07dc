/* rdma: the CM thread. It alone creates and destroys cm ids and QPs:
 * listeners (one per NIC), accepted target-side QPs, and the initiator's QP
 * slots, which it connects, re-establishes after an error (with backoff)
 * and tears down when their connection closes. */
#include "rdma.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#define RESOLVE_TIMEOUT_MS 2000
#define BACKOFF_MIN_MS     100
#define BACKOFF_MAX_MS     5000

void xrdma_cm_kick(struct rdma_transport *t)
{
    uint64_t one = 1;
    ssize_t w = write(t->cm_wake_fd, &one, sizeof(one));
    (void)w;
}

static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- initiator slots ---------------------------------------------------- */

static void conn_note(struct rdma_conn *c, int rc, const char *fmt, const char *detail)
{
    pthread_mutex_lock(&c->lock);
    c->why_rc = rc;
    snprintf(c->why, sizeof(c->why), fmt, detail);
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->lock);
}

/* Destroys the QP and id of s (after which the NIC touches none of its
 * buffers), then finishes what was still in its ring. */
static void slot_teardown(struct rdma_transport *t, struct rdma_slot *s, const char *why)
{
    pthread_mutex_lock(&s->lock);
    struct rdma_cm_id *id = s->id;
    s->id = NULL;
    if (s->state != SLOT_FAILED)
        s->state = SLOT_DEAD; /* no more posts */
    pthread_mutex_unlock(&s->lock);
    if (id) {
        if (id->qp)
            rdma_destroy_qp(id);
        rdma_destroy_id(id);
    }
    struct xfer_rdma_chunk *left = calloc(s->depth ? s->depth : 1, sizeof(*left));
    pthread_mutex_lock(&s->lock);
    size_t n = left ? xfer_rdma_ring_drain(&s->ring, -XFER_ECONN, why, left, s->depth) : 0;
    uint16_t uid = s->uid++;
    struct rdma_conn *c = s->conn;
    s->unsignaled = 0;
    s->credits = 0;
    pthread_mutex_unlock(&s->lock);
    for (size_t i = 0; i < n; i++)
        xrdma_chunk_finish(&left[i], true); /* message SENDs included */
    free(left);
    if (c) /* messages it carried and the peer never answered */
        xrdma_msg_slot_down(c, s, uid, why);
    (void)t;
}

/* Reconnects at once after a healthy QP failed; after failed attempts,
 * waits 100 ms doubling to 5 s. */
static void slot_retry_later(struct rdma_slot *s)
{
    pthread_mutex_lock(&s->lock);
    if (s->state != SLOT_FAILED)
        s->state = SLOT_IDLE;
    int delay = 0;
    if (s->failures > 0) {
        int shift = s->failures - 1 < 6 ? s->failures - 1 : 6;
        delay = BACKOFF_MIN_MS << shift;
        delay = delay > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : delay;
    }
    s->retry_at_ms = xfer_now_ms() + delay;
    pthread_mutex_unlock(&s->lock);
}

static void attempt_failed(struct rdma_transport *t, struct rdma_slot *s, int rc, const char *why,
                           bool permanent)
{
    xfer_debug("rdma: QP slot %u to %s: %s", s->index, s->conn->peer.node_id, why);
    slot_teardown(t, s, why);
    pthread_mutex_lock(&s->lock);
    s->failures++;
    pthread_mutex_unlock(&s->lock);
    if (permanent) {
        pthread_mutex_lock(&s->lock);
        s->state = SLOT_FAILED;
        pthread_mutex_unlock(&s->lock);
    } else {
        slot_retry_later(s);
    }
    conn_note(s->conn, rc, "%s", why);
}

static void remote_addr(const struct rdma_conn *c, const struct xfer_rdma_nic_desc *rn,
                        struct sockaddr_in *dst)
{
    uint32_t ip;
    memset(dst, 0, sizeof(*dst));
    dst->sin_family = AF_INET;
    dst->sin_port = htons(rn->cm_port);
    if (xfer_rdma_gid_ipv4(&rn->gid, &ip))
        dst->sin_addr.s_addr = ip;
    else
        inet_pton(AF_INET, c->peer.addr, &dst->sin_addr); /* InfiniBand: IPoIB */
}

static void slot_start(struct rdma_transport *t, struct rdma_slot *s)
{
    struct rdma_conn *c = s->conn;
    struct rdma_cm_id *id;
    char why[160];
    if (rdma_create_id(t->channel, &id, s, RDMA_PS_TCP)) {
        snprintf(why, sizeof(why), "rdma_create_id: %s", strerror(errno));
        attempt_failed(t, s, -XFER_EIO, why, false);
        return;
    }
    pthread_mutex_lock(&s->lock);
    s->id = id;
    s->state = SLOT_CONNECTING;
    pthread_mutex_unlock(&s->lock);
    struct sockaddr_in dst;
    remote_addr(c, &c->rnics[s->rnic], &dst);
    if (rdma_resolve_addr(id, (struct sockaddr *)&t->nics[s->lnic].addr, (struct sockaddr *)&dst,
                          RESOLVE_TIMEOUT_MS)) {
        snprintf(why, sizeof(why), "rdma_resolve_addr: %s", strerror(errno));
        attempt_failed(t, s, -XFER_ECONN, why, false);
    }
}

static void slot_connect(struct rdma_transport *t, struct rdma_slot *s)
{
    struct rdma_nic *nic = &t->nics[s->lnic];
    char why[160];
    struct ibv_qp_init_attr qa = {.send_cq = s->prog->cq[s->lnic],
                                  .recv_cq = nic->msg_cq, /* answers to our messages */
                                  .qp_type = IBV_QPT_RC,
                                  .cap = {.max_send_wr = s->depth,
                                          .max_recv_wr = RDMA_MSG_CREDITS,
                                          .max_send_sge = 1,
                                          .max_recv_sge = 1}};
    if (s->id->verbs != nic->ctx) {
        snprintf(why, sizeof(why), "route to %s leaves through another device than %s",
                 s->conn->rnics[s->rnic].name, nic->desc.name);
        attempt_failed(t, s, -XFER_ECONN, why, false);
        return;
    }
    if (rdma_create_qp(s->id, nic->pd, &qa)) {
        snprintf(why, sizeof(why), "rdma_create_qp: %s", strerror(errno));
        attempt_failed(t, s, -XFER_EIO, why, false);
        return;
    }
    uint8_t req[XFER_RDMA_REQ_LEN];
    if (xfer_rdma_nonce_new(&s->nonce) < 0) {
        attempt_failed(t, s, -XFER_EIO, "no randomness for a connection nonce", false);
        return;
    }
    xfer_rdma_req_encode(&t->self, s->conn->peer.node_id, (uint16_t)s->index, wall_ms(), &s->nonce,
                         req);
    struct rdma_conn_param cp = {.private_data = req,
                                 .private_data_len = sizeof(req),
                                 .initiator_depth = nic->rd_atom,
                                 .responder_resources = nic->rd_atom,
                                 .retry_count = 7,
                                 .rnr_retry_count = 7};
    if (rdma_connect(s->id, &cp)) {
        snprintf(why, sizeof(why), "rdma_connect: %s", strerror(errno));
        attempt_failed(t, s, -XFER_ECONN, why, false);
    }
}

static void slot_established(struct rdma_transport *t, struct rdma_slot *s, const void *pdata,
                             size_t len)
{
    char why[192];
    int rc = xfer_rdma_rep_verify(&t->self, &s->nonce, pdata, len, why, sizeof(why));
    if (rc == 0) /* the node we meant, not another one or a restarted one */
        rc = xfer_rdma_rep_check_peer(pdata, len, s->conn->peer.node_id, s->conn->peer.incarnation,
                                      why, sizeof(why));
    if (rc < 0) {
        xfer_warn("rdma: connection to %s refused: %s", s->conn->peer.node_id, why);
        attempt_failed(t, s, rc, why, true);
        return;
    }
    xrdma_msg_slot_up(s); /* answers' receives posted before any request leaves */
    pthread_mutex_lock(&s->lock);
    s->state = SLOT_READY;
    s->failures = 0;
    s->unsignaled = 0;
    pthread_mutex_unlock(&s->lock);
    struct rdma_conn *c = s->conn;
    pthread_mutex_lock(&c->lock);
    c->why[0] = '\0'; /* an old failure no longer speaks for the peer */
    c->why_rc = 0;
    pthread_cond_broadcast(&c->cond);
    xrdma_pump_locked(c);
    pthread_mutex_unlock(&c->lock);
}

static void slot_event(struct rdma_transport *t, struct rdma_slot *s, enum rdma_cm_event_type ev,
                       int status, const void *pdata, size_t len)
{
    char why[192];
    switch (ev) {
    case RDMA_CM_EVENT_ADDR_RESOLVED:
        if (rdma_resolve_route(s->id, RESOLVE_TIMEOUT_MS)) {
            snprintf(why, sizeof(why), "rdma_resolve_route: %s", strerror(errno));
            attempt_failed(t, s, -XFER_ECONN, why, false);
        }
        break;
    case RDMA_CM_EVENT_ROUTE_RESOLVED:
        slot_connect(t, s);
        break;
    case RDMA_CM_EVENT_ESTABLISHED:
        slot_established(t, s, pdata, len);
        break;
    case RDMA_CM_EVENT_REJECTED:
        if (len) { /* refused by an xfer node: its reason; refused for good on auth */
            int rc = xfer_rdma_rep_verify(&t->self, &s->nonce, pdata, len, why, sizeof(why));
            if (rc < 0) {
                attempt_failed(t, s, rc, why, rc == -XFER_EAUTH || rc == -XFER_EPROTO);
                break;
            }
        }
        snprintf(why, sizeof(why), "connection rejected (status %d: nobody listening?)", status);
        attempt_failed(t, s, -XFER_ECONN, why, false);
        break;
    case RDMA_CM_EVENT_DISCONNECTED:
        pthread_mutex_lock(&s->lock);
        if (s->state == SLOT_READY)
            s->state = SLOT_ERROR;
        if (s->state == SLOT_ERROR && s->ring.n == 0)
            s->state = SLOT_DEAD; /* nothing in flight: tear down now */
        pthread_mutex_unlock(&s->lock);
        break;
    default: /* ADDR/ROUTE_ERROR, UNREACHABLE, CONNECT_ERROR, ... */
        snprintf(why, sizeof(why), "%s (status %d)", rdma_event_str(ev), status);
        attempt_failed(t, s, -XFER_ECONN, why, false);
        break;
    }
}

/* ---- target side -------------------------------------------------------- */

static struct rdma_nic *nic_of(struct rdma_transport *t, struct rdma_cm_id *id)
{
    for (int i = 0; i < t->n_nics; i++)
        if (t->nics[i].ctx == id->verbs && t->nics[i].desc.port == id->port_num)
            return &t->nics[i];
    for (int i = 0; i < t->n_nics; i++)
        if (t->nics[i].ctx == id->verbs)
            return &t->nics[i];
    return NULL;
}

static void refuse(struct rdma_transport *t, struct rdma_cm_id *id, int rc, const char *why)
{
    uint8_t rej[XFER_RDMA_REJ_LEN];
    size_t n = xfer_rdma_rep_encode(&t->self, NULL, rc, why, rej);
    rdma_reject(id, rej, (uint8_t)n);
    rdma_destroy_id(id);
}

static void incoming(struct rdma_transport *t, struct rdma_cm_id *id, const void *pdata, size_t len)
{
    char why[192];
    struct xfer_rdma_req req;
    int rc =
        xfer_rdma_req_verify(&t->self, pdata, len, wall_ms(), &t->replay, &req, why, sizeof(why));
    struct rdma_nic *nic = nic_of(t, id);
    if (rc == 0 && !nic) {
        rc = -XFER_ENODEV;
        snprintf(why, sizeof(why), "request arrived on an unknown device");
    }
    if (rc < 0) {
        xfer_warn("rdma: refused connection: %s", why);
        refuse(t, id, rc, why);
        return;
    }
    struct rdma_accepted *a = calloc(1, sizeof(*a));
    if (a) {
        a->tag = TAG_ACCEPTED;
        a->id = id;
        a->req = req;
        a->index = RDMA_MAX_ACCEPTED;
        snprintf(a->node, sizeof(a->node), "%s", req.node);
    }
    /* The QP with its message receives posted (rdma_msg.c). */
    rc = a ? xrdma_msg_accept_qp(t, nic, a) : -XFER_ENOMEM;
    if (rc < 0) {
        if (a) {
            xrdma_msg_accepted_close(t, a);
            if (id->qp)
                rdma_destroy_qp(id);
            xrdma_msg_accepted_free(a);
        }
        free(a);
        refuse(t, id, rc,
               rc == -XFER_ENOSPC ? "too many connections" : "cannot create a queue pair");
        return;
    }
    id->context = a;
    uint8_t rep[XFER_RDMA_REJ_LEN];
    size_t n = xfer_rdma_rep_encode(&t->self, &req.nonce, 0, NULL, rep);
    struct rdma_conn_param cp = {.private_data = rep,
                                 .private_data_len = (uint8_t)n,
                                 .responder_resources = nic->rd_atom,
                                 .initiator_depth = nic->rd_atom,
                                 .rnr_retry_count = 7};
    if (rdma_accept(id, &cp)) {
        xfer_warn("rdma: rdma_accept for %s: %s", req.node, strerror(errno));
        xrdma_msg_accepted_close(t, a);
        rdma_destroy_qp(id);
        rdma_destroy_id(id);
        xrdma_msg_accepted_free(a);
        free(a);
        return;
    }
    xrdma_msg_accepted_ready(a);
    a->next = t->accepted;
    t->accepted = a;
    xfer_debug("rdma: accepted QP from %s on %s", req.node, nic->desc.name);
}

static void accepted_close(struct rdma_transport *t, struct rdma_accepted *a)
{
    for (struct rdma_accepted **pp = &t->accepted; *pp; pp = &(*pp)->next)
        if (*pp == a) {
            *pp = a->next;
            break;
        }
    xrdma_msg_accepted_close(t, a); /* the progress thread lets go of it first */
    xrdma_lease_accepted_closing(t, a);
    rdma_destroy_qp(a->id);
    xrdma_lease_accepted_gone(t, a); /* its type-2 windows died with it */
    rdma_destroy_id(a->id);
    xrdma_msg_accepted_free(a); /* the QP is gone: the NIC no longer writes there */
    free(a);
}

/* ---- the thread ------------------------------------------------------------ */

static void handle_event(struct rdma_transport *t, struct rdma_cm_event *ev)
{
    enum rdma_cm_event_type type = ev->event;
    int status = ev->status;
    struct rdma_cm_id *id = ev->id;
    uint8_t pdata[256];
    size_t len = ev->param.conn.private_data ? ev->param.conn.private_data_len : 0;
    if (len > sizeof(pdata))
        len = sizeof(pdata);
    if (len)
        memcpy(pdata, ev->param.conn.private_data, len);
    rdma_ack_cm_event(ev); /* before any destroy: rdma_destroy_id waits for acks */
    enum rdma_tag tag = id->context ? *(enum rdma_tag *)id->context : 0;
    if (type == RDMA_CM_EVENT_CONNECT_REQUEST)
        incoming(t, id, pdata, len);
    else if (tag == TAG_SLOT)
        slot_event(t, id->context, type, status, pdata, len);
    else if (tag == TAG_ACCEPTED &&
             (type == RDMA_CM_EVENT_DISCONNECTED || type == RDMA_CM_EVENT_TIMEWAIT_EXIT))
        accepted_close(t, id->context);
}

static void conn_teardown(struct rdma_transport *t, struct rdma_conn *c)
{
    for (int i = 0; i < c->n_slots; i++) {
        struct rdma_slot *s = &t->slots[c->slots[i]];
        slot_teardown(t, s, "rdma connection closed");
        pthread_mutex_lock(&s->lock);
        s->conn = NULL;
        s->state = SLOT_FREE;
        xfer_rdma_ring_free(&s->ring);
        pthread_mutex_unlock(&s->lock);
    }
    pthread_mutex_lock(&c->lock);
    while (__atomic_load_n(&c->refs, __ATOMIC_ACQUIRE) > 0)
        pthread_cond_wait(&c->cond, &c->lock);
    struct rdma_pending *left = xrdma_take_pending_locked(c);
    pthread_mutex_unlock(&c->lock);
    xrdma_fail_pending(left, -XFER_ECONN, "rdma connection closed");
    xrdma_msg_fail_waiting(c, -XFER_ECONN, "rdma connection closed");
    pthread_mutex_lock(&c->lock);
    c->torn_down = true;
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->lock);
}

/* Starts due (re)connections; fails waiting chunks when no QP of the
 * connection is up and none is on its way. t->lock held. */
static void conn_service(struct rdma_transport *t, struct rdma_conn *c, int64_t now)
{
    int ready = 0, coming = 0;
    for (int i = 0; i < c->n_slots; i++) {
        struct rdma_slot *s = &t->slots[c->slots[i]];
        pthread_mutex_lock(&s->lock);
        enum slot_state st = s->state;
        bool due = st == SLOT_IDLE && now >= s->retry_at_ms;
        pthread_mutex_unlock(&s->lock);
        if (st == SLOT_DEAD) {
            slot_teardown(t, s, "queue pair torn down");
            slot_retry_later(s);
        } else if (due) {
            slot_start(t, s);
        }
        pthread_mutex_lock(&s->lock);
        ready += s->state == SLOT_READY;
        coming += s->state == SLOT_CONNECTING || s->state == SLOT_ERROR;
        pthread_mutex_unlock(&s->lock);
    }
    pthread_mutex_lock(&c->lock);
    struct rdma_pending *left = NULL;
    bool give_up = !ready && !coming && c->why[0];
    __atomic_store_n(&c->unreachable, give_up, __ATOMIC_RELAXED); /* conn_state() */
    if (give_up && c->head)
        left = xrdma_take_pending_locked(c);
    bool msgs = give_up && c->mq_head;
    char why[sizeof(c->why) + 32];
    snprintf(why, sizeof(why), "peer unreachable over rdma: %s", c->why);
    pthread_mutex_unlock(&c->lock);
    if (left)
        xrdma_fail_pending(left, -XFER_ECONN, why);
    if (msgs)
        xrdma_msg_fail_waiting(c, -XFER_ECONN, why);
}

static void service(struct rdma_transport *t)
{
    int64_t now = xfer_now_ms();
    pthread_mutex_lock(&t->lock);
    for (struct rdma_conn *c = t->conns; c; c = c->next) {
        pthread_mutex_lock(&c->lock);
        bool closing = c->closing, done = c->torn_down;
        pthread_mutex_unlock(&c->lock);
        if (closing && !done)
            conn_teardown(t, c);
        else if (!closing)
            conn_service(t, c, now);
    }
    pthread_mutex_unlock(&t->lock);
}

static void *cm_main(void *arg)
{
    struct rdma_transport *t = arg;
    struct pollfd fds[2] = {{.fd = t->channel->fd, .events = POLLIN},
                            {.fd = t->cm_wake_fd, .events = POLLIN}};
    while (!__atomic_load_n(&t->stopping, __ATOMIC_ACQUIRE)) {
        int r = poll(fds, 2, xrdma_lease_expire(t, 100)); /* lease deadlines, too */
        if (r < 0 && errno != EINTR)
            break;
        if (fds[1].revents & POLLIN) {
            uint64_t v;
            ssize_t n = read(t->cm_wake_fd, &v, sizeof(v));
            (void)n;
        }
        struct rdma_cm_event *ev;
        while (!rdma_get_cm_event(t->channel, &ev))
            handle_event(t, ev);
        service(t);
    }
    return NULL;
}

int xrdma_cm_start(struct rdma_transport *t, char *why, size_t why_len)
{
    t->channel = rdma_create_event_channel();
    t->cm_wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (!t->channel || t->cm_wake_fd < 0) {
        snprintf(why, why_len, "rdma: event channel: %s", strerror(errno));
        return -XFER_EIO;
    }
    fcntl(t->channel->fd, F_SETFL, fcntl(t->channel->fd, F_GETFL) | O_NONBLOCK);
    const char *port_env = getenv("XFER_RDMA_PORT");
    uint16_t port = port_env ? (uint16_t)atoi(port_env) : 0;
    t->nic_list[0] = '\0';
    for (int i = 0; i < t->n_nics; i++) {
        struct rdma_nic *n = &t->nics[i];
        ((struct sockaddr_in *)&n->addr)->sin_port = htons(port ? (uint16_t)(port + i) : 0);
        if (rdma_create_id(t->channel, &n->listen_id, n, RDMA_PS_TCP) ||
            rdma_bind_addr(n->listen_id, (struct sockaddr *)&n->addr) ||
            rdma_listen(n->listen_id, 128)) {
            snprintf(why, why_len, "rdma: listen on %s: %s", n->desc.name, strerror(errno));
            return -XFER_EIO;
        }
        ((struct sockaddr_in *)&n->addr)->sin_port = 0; /* connect from any port */
        n->desc.cm_port = ntohs(rdma_get_src_port(n->listen_id));
        if (xfer_rdma_nics_append(t->nic_list, sizeof(t->nic_list), &n->desc) < 0)
            xfer_warn("rdma: NIC list full, %s not published", n->desc.name);
    }
    if (pthread_create(&t->cm_thread, NULL, cm_main, t)) {
        snprintf(why, why_len, "rdma: cannot start the CM thread");
        return -XFER_ENOMEM;
    }
    t->cm_running = true;
    return 0;
}

void xrdma_cm_stop(struct rdma_transport *t)
{
    __atomic_store_n(&t->stopping, true, __ATOMIC_RELEASE);
    if (t->cm_running) {
        xrdma_cm_kick(t);
        pthread_join(t->cm_thread, NULL);
        t->cm_running = false;
    }
    while (t->accepted)
        accepted_close(t, t->accepted);
    for (int i = 0; i < t->n_nics; i++)
        if (t->nics[i].listen_id) {
            rdma_destroy_id(t->nics[i].listen_id);
            t->nics[i].listen_id = NULL;
        }
    if (t->channel)
        rdma_destroy_event_channel(t->channel);
    t->channel = NULL;
    if (t->cm_wake_fd > 0)
        close(t->cm_wake_fd);
    t->cm_wake_fd = -1;
}
