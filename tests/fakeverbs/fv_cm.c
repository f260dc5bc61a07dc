/* fakeverbs: librdmacm — event channels, ids, address/route resolution,
 * listen/connect/accept/reject with private data, disconnect. A connection
 * is a TCP connection to the listener's address and port; after the REQ/REP
 * exchange the socket becomes the link of the two QPs. */
#include "fv_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#define CONNECT_TIMEOUT_MS     3000
#define REJ_INVALID_SERVICE_ID 8 /* IB CM reject reason: nobody listens */
#define REJ_CONSUMER_DEFINED   28

static int fail(int err)
{
    errno = err;
    return -1;
}

static struct fv_id *fid(struct rdma_cm_id *id)
{
    return container_of(id, struct fv_id, id);
}
static struct fv_channel *fch(struct rdma_event_channel *c)
{
    return container_of(c, struct fv_channel, ch);
}

struct rdma_event_channel *rdma_create_event_channel(void)
{
    struct fv_channel *c = calloc(1, sizeof(*c));
    int p[2];
    if (!c || pipe2(p, O_CLOEXEC)) {
        free(c);
        errno = ENOMEM;
        return NULL;
    }
    fcntl(p[1], F_SETFL, O_NONBLOCK);
    pthread_mutex_init(&c->lock, NULL);
    c->ch.fd = p[0];
    c->wfd = p[1];
    return &c->ch;
}

void rdma_destroy_event_channel(struct rdma_event_channel *ch)
{
    if (!ch)
        return;
    struct fv_channel *c = fch(ch);
    for (struct fv_event *e = c->head, *n; e; e = n) {
        n = e->next;
        free(e);
    }
    close(c->ch.fd);
    close(c->wfd);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

static void post_event(struct fv_id *id, struct fv_id *listen, enum rdma_cm_event_type type,
                       int status, const void *pdata, size_t len)
{
    struct fv_channel *c = fch(id->id.channel);
    struct fv_event *e = calloc(1, sizeof(*e));
    if (!e)
        return;
    e->ev.id = &id->id;
    e->ev.listen_id = listen ? &listen->id : NULL;
    e->ev.event = type;
    e->ev.status = status;
    if (len > sizeof(e->pdata))
        len = sizeof(e->pdata);
    if (pdata && len)
        memcpy(e->pdata, pdata, len);
    e->ev.param.conn.private_data = len ? e->pdata : NULL;
    e->ev.param.conn.private_data_len = (uint8_t)len;
    e->ev.param.conn.initiator_depth = id->initiator_depth;
    e->ev.param.conn.responder_resources = id->responder_resources;
    pthread_mutex_lock(&c->lock);
    if (c->tail)
        c->tail->next = e;
    else
        c->head = e;
    c->tail = e;
    pthread_mutex_unlock(&c->lock);
    char b = 1;
    ssize_t w = write(c->wfd, &b, 1);
    (void)w;
}

void fv_cm_post_disconnected(struct fv_id *id)
{
    if (!__atomic_exchange_n(&id->disconnected, true, __ATOMIC_ACQ_REL))
        post_event(id, NULL, RDMA_CM_EVENT_DISCONNECTED, 0, NULL, 0);
}

int rdma_get_cm_event(struct rdma_event_channel *ch, struct rdma_cm_event **out)
{
    if (!ch || !out)
        return fail(EINVAL);
    struct fv_channel *c = fch(ch);
    for (;;) {
        char b;
        ssize_t r = read(c->ch.fd, &b, 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r != 1)
            return -1; /* errno from read (EAGAIN on a non-blocking channel) */
        pthread_mutex_lock(&c->lock);
        struct fv_event *e = c->head;
        if (e && !(c->head = e->next))
            c->tail = NULL;
        pthread_mutex_unlock(&c->lock);
        if (e) { /* else: the event of a destroyed id, already purged */
            *out = &e->ev;
            return 0;
        }
    }
}

int rdma_ack_cm_event(struct rdma_cm_event *ev)
{
    if (!ev)
        return fail(EINVAL);
    free(container_of(ev, struct fv_event, ev));
    return 0;
}

static struct fv_id *new_id(struct rdma_event_channel *ch, void *context, enum rdma_port_space ps)
{
    struct fv_id *f = calloc(1, sizeof(*f));
    if (!f)
        return NULL;
    f->id.channel = ch;
    f->id.context = context;
    f->id.ps = ps;
    f->id.qp_type = IBV_QPT_RC;
    f->listen_sock = f->conn_sock = -1;
    return f;
}

int rdma_create_id(struct rdma_event_channel *ch, struct rdma_cm_id **out, void *context,
                   enum rdma_port_space ps)
{
    if (!ch || !out || ps != RDMA_PS_TCP)
        return fail(EINVAL);
    struct fv_id *f = new_id(ch, context, ps);
    if (!f)
        return fail(ENOMEM);
    *out = &f->id;
    return 0;
}

static socklen_t sa_len(const struct sockaddr *sa)
{
    return sa->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
}

int rdma_bind_addr(struct rdma_cm_id *id, struct sockaddr *addr)
{
    if (!id || !addr || (addr->sa_family != AF_INET && addr->sa_family != AF_INET6))
        return fail(EINVAL);
    struct fv_id *f = fid(id);
    if (f->listen_sock >= 0)
        return fail(EINVAL);
    bool any = addr->sa_family == AF_INET &&
               ((struct sockaddr_in *)addr)->sin_addr.s_addr == htonl(INADDR_ANY);
    struct fv_device *d = any ? NULL : fv_device_for_addr(addr);
    if (!any && !d)
        return fail(ENODEV); /* not the address of an RDMA device */
    int s = socket(addr->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    if (s < 0)
        return -1;
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(s, addr, sa_len(addr))) {
        int e = errno;
        close(s);
        return fail(e);
    }
    socklen_t l = sizeof(id->route.addr.src_storage);
    getsockname(s, &id->route.addr.src_addr, &l);
    f->listen_sock = s;
    id->verbs = d ? fv_shared_context(d->index) : NULL;
    id->port_num = d ? 1 : 0;
    return 0;
}

static struct fv_device *device_of_socket(int s)
{
    struct sockaddr_storage ss;
    socklen_t l = sizeof(ss);
    if (getsockname(s, (struct sockaddr *)&ss, &l))
        return NULL;
    return fv_device_for_addr((struct sockaddr *)&ss);
}

/* Reads the REQ of a new connection and reports CONNECT_REQUEST. */
static void incoming(struct fv_id *listen, int s)
{
    struct timeval tv = {.tv_sec = 2};
    struct fv_cm_msg m;
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    struct fv_device *d = device_of_socket(s);
    struct fv_id *c = d ? new_id(listen->id.channel, listen->id.context, listen->id.ps) : NULL;
    if (!c || fv_recv_all(s, &m, sizeof(m)) || m.magic != FV_CM_MAGIC || m.type != CM_REQ ||
        m.pdata_len > FV_MAX_PDATA) {
        free(c);
        close(s);
        return;
    }
    tv.tv_sec = 0;
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    int one = 1;
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    c->conn_sock = s;
    c->id.verbs = fv_shared_context(d->index);
    c->id.port_num = 1;
    socklen_t l = sizeof(c->id.route.addr.src_storage);
    getsockname(s, &c->id.route.addr.src_addr, &l);
    l = sizeof(c->id.route.addr.dst_storage);
    getpeername(s, &c->id.route.addr.dst_addr, &l);
    /* As seen from this side: the peer's depth is our responder resources. */
    c->initiator_depth = m.responder_resources;
    c->responder_resources = m.initiator_depth;
    c->rnr_mine = m.rnr_retry_count;
    post_event(c, listen, RDMA_CM_EVENT_CONNECT_REQUEST, 0, m.pdata, m.pdata_len);
}

static void *acceptor_main(void *arg)
{
    struct fv_id *f = arg;
    for (;;) {
        int s = accept4(f->listen_sock, NULL, NULL, SOCK_CLOEXEC);
        if (s < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            break; /* shut down by rdma_destroy_id */
        }
        incoming(f, s);
    }
    return NULL;
}

int rdma_listen(struct rdma_cm_id *id, int backlog)
{
    if (!id || fid(id)->listen_sock < 0 || fid(id)->thread_running)
        return fail(EINVAL);
    struct fv_id *f = fid(id);
    if (listen(f->listen_sock, backlog > 0 ? backlog : 64))
        return -1;
    if (pthread_create(&f->thread, NULL, acceptor_main, f))
        return fail(ENOMEM);
    f->thread_running = true;
    return 0;
}

int rdma_resolve_addr(struct rdma_cm_id *id, struct sockaddr *src, struct sockaddr *dst,
                      int timeout_ms)
{
    (void)timeout_ms;
    if (!id || !dst || (dst->sa_family != AF_INET && dst->sa_family != AF_INET6))
        return fail(EINVAL);
    struct fv_id *f = fid(id);
    /* The fake cannot route: with no source address, device 0 is used. */
    struct fv_device *d = fv_device_for_addr(src);
    memcpy(&f->dst, dst, sa_len(dst));
    memcpy(&id->route.addr.dst_storage, dst, sa_len(dst));
    if (!d) {
        post_event(f, NULL, RDMA_CM_EVENT_ADDR_ERROR, -ENODEV, NULL, 0);
        return 0;
    }
    struct sockaddr_in *sin = &id->route.addr.src_sin;
    sin->sin_family = AF_INET;
    sin->sin_addr = d->addr;
    id->verbs = fv_shared_context(d->index);
    id->port_num = 1;
    post_event(f, NULL, RDMA_CM_EVENT_ADDR_RESOLVED, 0, NULL, 0);
    return 0;
}

int rdma_resolve_route(struct rdma_cm_id *id, int timeout_ms)
{
    (void)timeout_ms;
    if (!id || !id->verbs)
        return fail(EINVAL);
    post_event(fid(id), NULL, RDMA_CM_EVENT_ROUTE_RESOLVED, 0, NULL, 0);
    return 0;
}

int rdma_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
    if (!id || !pd || !attr || !id->verbs || pd->context != id->verbs || id->qp)
        return fail(EINVAL);
    struct ibv_qp *q = ibv_create_qp(pd, attr);
    if (!q)
        return -1;
    struct fv_qp *qp = container_of(q, struct fv_qp, qp);
    if (fv_qp_set_state(qp, IBV_QPS_INIT, IBV_ACCESS_REMOTE_WRITE, false, 0)) {
        ibv_destroy_qp(q);
        return fail(EINVAL);
    }
    qp->cm_id = fid(id);
    id->qp = q;
    id->pd = pd;
    id->send_cq = attr->send_cq;
    id->recv_cq = attr->recv_cq;
    return 0;
}

/* Stops an active id's connector thread: it must not touch a QP being
 * destroyed (librdmacm lets a QP go while its connection is under way). */
static void stop_connector(struct fv_id *f)
{
    if (!f->thread_running || f->listen_sock >= 0)
        return;
    int cs = __atomic_load_n(&f->conn_sock, __ATOMIC_ACQUIRE);
    if (cs >= 0)
        shutdown(cs, SHUT_RDWR);
    pthread_join(f->thread, NULL);
    f->thread_running = false;
}

void rdma_destroy_qp(struct rdma_cm_id *id)
{
    if (id)
        stop_connector(fid(id));
    if (id && id->qp) {
        ibv_destroy_qp(id->qp);
        id->qp = NULL;
    }
}

/* INIT -> RTR -> RTS with the access librdmacm derives from the negotiated
 * responder resources (RDMA READ is served only when they are > 0), and the
 * rnr_retry the peer asked for in its REQ or REP (the IB CM sets a QP's
 * rnr_retry from the other side's rnr_retry_count). */
static int qp_ready(struct fv_id *f, uint8_t responder_resources, uint8_t rnr_retry)
{
    struct fv_qp *qp = container_of(f->id.qp, struct fv_qp, qp);
    int access = IBV_ACCESS_REMOTE_WRITE | (responder_resources ? IBV_ACCESS_REMOTE_READ : 0);
    if (fv_qp_set_state(qp, IBV_QPS_RTR, access, responder_resources > 0, rnr_retry) ||
        fv_qp_set_state(qp, IBV_QPS_RTS, access, responder_resources > 0, rnr_retry))
        return -1;
    return 0;
}

/* Returns a connected blocking socket or -errno. */
static int tcp_connect(const struct sockaddr *dst, int timeout_ms)
{
    int s = socket(dst->sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (s < 0)
        return -errno;
    int err = 0;
    if (connect(s, dst, sa_len(dst)) && errno != EINPROGRESS) {
        err = errno;
    } else {
        struct pollfd p = {.fd = s, .events = POLLOUT};
        socklen_t l = sizeof(err);
        if (poll(&p, 1, timeout_ms) != 1)
            err = ETIMEDOUT;
        else if (getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &l))
            err = errno;
    }
    if (err) {
        close(s);
        return -err;
    }
    fcntl(s, F_SETFL, 0);
    int one = 1; /* a NIC does not wait to coalesce small messages */
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return s;
}

static void *connector_main(void *arg)
{
    struct fv_id *f = arg;
    struct fv_cm_msg m = {.magic = FV_CM_MAGIC,
                          .type = CM_REQ,
                          .pdata_len = f->req_len,
                          .initiator_depth = f->initiator_depth,
                          .responder_resources = f->responder_resources,
                          .rnr_retry_count = f->rnr_for_peer};
    memcpy(m.pdata, f->req_pdata, f->req_len);
    int s = tcp_connect((struct sockaddr *)&f->dst, CONNECT_TIMEOUT_MS);
    if (s < 0) { /* nobody listens: the CM rejects; no answer: unreachable */
        post_event(f, NULL, s == -ECONNREFUSED ? RDMA_CM_EVENT_REJECTED : RDMA_CM_EVENT_UNREACHABLE,
                   s == -ECONNREFUSED ? REJ_INVALID_SERVICE_ID : -ETIMEDOUT, NULL, 0);
        return NULL;
    }
    __atomic_store_n(&f->conn_sock, s, __ATOMIC_RELEASE);
    if (fv_send_all(s, &m, sizeof(m)) || fv_recv_all(s, &m, sizeof(m)) || m.magic != FV_CM_MAGIC ||
        (m.type != CM_REP && m.type != CM_REJ)) {
        post_event(f, NULL, RDMA_CM_EVENT_UNREACHABLE, -ETIMEDOUT, NULL, 0);
        return NULL;
    }
    if (m.type == CM_REJ) {
        post_event(f, NULL, RDMA_CM_EVENT_REJECTED, REJ_CONSUMER_DEFINED, m.pdata, m.pdata_len);
        return NULL;
    }
    struct fv_qp *qp = container_of(f->id.qp, struct fv_qp, qp);
    if (qp_ready(f, f->responder_resources, m.rnr_retry_count) || fv_qp_start_link(qp, s)) {
        post_event(f, NULL, RDMA_CM_EVENT_CONNECT_ERROR, -EINVAL, NULL, 0);
        return NULL;
    }
    __atomic_store_n(&f->conn_sock, -1, __ATOMIC_RELEASE); /* the QP owns it now */
    post_event(f, NULL, RDMA_CM_EVENT_ESTABLISHED, 0, m.pdata, m.pdata_len);
    return NULL;
}

int rdma_connect(struct rdma_cm_id *id, struct rdma_conn_param *param)
{
    if (!id || !id->qp || !param || param->private_data_len > FV_MAX_PDATA ||
        (param->private_data_len && !param->private_data))
        return fail(EINVAL);
    struct fv_id *f = fid(id);
    if (f->thread_running || id->qp->state != IBV_QPS_INIT)
        return fail(EINVAL);
    if (param->private_data_len)
        memcpy(f->req_pdata, param->private_data, param->private_data_len);
    f->req_len = param->private_data_len;
    f->initiator_depth = param->initiator_depth;
    f->responder_resources = param->responder_resources;
    f->rnr_for_peer = param->rnr_retry_count > 7 ? 7 : param->rnr_retry_count;
    if (pthread_create(&f->thread, NULL, connector_main, f))
        return fail(ENOMEM);
    f->thread_running = true;
    return 0;
}

static int send_reply(struct fv_id *f, uint8_t type, const void *pdata, size_t len)
{
    struct fv_cm_msg m = {.magic = FV_CM_MAGIC,
                          .type = type,
                          .pdata_len = (uint8_t)len,
                          .initiator_depth = f->initiator_depth,
                          .responder_resources = f->responder_resources,
                          .rnr_retry_count = f->rnr_for_peer};
    if (len)
        memcpy(m.pdata, pdata, len);
    return fv_send_all(f->conn_sock, &m, sizeof(m));
}

int rdma_accept(struct rdma_cm_id *id, struct rdma_conn_param *param)
{
    if (!id || !id->qp || fid(id)->conn_sock < 0 ||
        (param && param->private_data_len > FV_MAX_REP_PDATA))
        return fail(EINVAL);
    struct fv_id *f = fid(id);
    struct fv_qp *qp = container_of(id->qp, struct fv_qp, qp);
    if (param) {
        f->responder_resources = param->responder_resources;
        f->initiator_depth = param->initiator_depth;
        f->rnr_for_peer = param->rnr_retry_count > 7 ? 7 : param->rnr_retry_count;
    } else {
        f->responder_resources = f->initiator_depth = 0;
    }
    if (qp_ready(f, f->responder_resources, f->rnr_mine))
        return fail(EINVAL);
    if (send_reply(f, CM_REP, param ? param->private_data : NULL,
                   param ? param->private_data_len : 0) ||
        fv_qp_start_link(qp, f->conn_sock)) {
        fv_qp_to_error(qp, IBV_WC_WR_FLUSH_ERR);
        return fail(ECONNRESET);
    }
    f->conn_sock = -1;
    post_event(f, NULL, RDMA_CM_EVENT_ESTABLISHED, 0, NULL, 0);
    return 0;
}

int rdma_reject(struct rdma_cm_id *id, const void *pdata, uint8_t len)
{
    if (!id || fid(id)->conn_sock < 0 || len > FV_MAX_REP_PDATA)
        return fail(EINVAL);
    struct fv_id *f = fid(id);
    send_reply(f, CM_REJ, pdata, len);
    close(f->conn_sock);
    f->conn_sock = -1;
    return 0;
}

int rdma_disconnect(struct rdma_cm_id *id)
{
    if (!id || !id->qp)
        return fail(EINVAL);
    fv_qp_to_error(container_of(id->qp, struct fv_qp, qp), IBV_WC_WR_FLUSH_ERR);
    return 0;
}

/* Drops queued events of id; CONNECT_REQUESTs of a dying listener take
 * their never-accepted child ids with them. */
static void purge_events(struct fv_id *f)
{
    struct fv_channel *c = fch(f->id.channel);
    struct fv_event *dropped = NULL;
    pthread_mutex_lock(&c->lock);
    struct fv_event **pp = &c->head, *keep_tail = NULL;
    while (*pp) {
        struct fv_event *e = *pp;
        if (e->ev.id == &f->id || e->ev.listen_id == &f->id) {
            *pp = e->next;
            e->next = dropped;
            dropped = e;
        } else {
            keep_tail = e;
            pp = &e->next;
        }
    }
    c->tail = keep_tail;
    pthread_mutex_unlock(&c->lock);
    while (dropped) {
        struct fv_event *e = dropped;
        dropped = e->next;
        if (e->ev.listen_id == &f->id && e->ev.id != &f->id)
            rdma_destroy_id(e->ev.id);
        free(e);
    }
}

int rdma_destroy_id(struct rdma_cm_id *id)
{
    if (!id)
        return fail(EINVAL);
    struct fv_id *f = fid(id);
    if (f->listen_sock >= 0)
        shutdown(f->listen_sock, SHUT_RDWR);
    int cs = __atomic_load_n(&f->conn_sock, __ATOMIC_ACQUIRE);
    if (cs >= 0)
        shutdown(cs, SHUT_RDWR);
    if (f->thread_running)
        pthread_join(f->thread, NULL);
    f->thread_running = false;
    if (f->listen_sock >= 0)
        close(f->listen_sock);
    if (f->conn_sock >= 0)
        close(f->conn_sock);
    rdma_destroy_qp(id);
    purge_events(f);
    free(f);
    return 0;
}

struct ibv_context **rdma_get_devices(int *num)
{
    int n = fv_device_count();
    if (num)
        *num = 0;
    if (n == 0) {
        errno = ENODEV;
        return NULL;
    }
    struct ibv_context **list = calloc((size_t)n + 1, sizeof(*list));
    if (!list) {
        errno = ENOMEM;
        return NULL;
    }
    for (int i = 0; i < n; i++)
        list[i] = fv_shared_context(i);
    if (num)
        *num = n;
    return list;
}

void rdma_free_devices(struct ibv_context **list)
{
    free(list);
}

__be16 rdma_get_src_port(struct rdma_cm_id *id)
{
    return id->route.addr.src_addr.sa_family == AF_INET6 ? id->route.addr.src_sin6.sin6_port
                                                         : id->route.addr.src_sin.sin_port;
}

__be16 rdma_get_dst_port(struct rdma_cm_id *id)
{
    return id->route.addr.dst_addr.sa_family == AF_INET6 ? id->route.addr.dst_sin6.sin6_port
                                                         : id->route.addr.dst_sin.sin_port;
}

const char *rdma_event_str(enum rdma_cm_event_type ev)
{
    static const char *const names[] = {
        "RDMA_CM_EVENT_ADDR_RESOLVED",   "RDMA_CM_EVENT_ADDR_ERROR",
        "RDMA_CM_EVENT_ROUTE_RESOLVED",  "RDMA_CM_EVENT_ROUTE_ERROR",
        "RDMA_CM_EVENT_CONNECT_REQUEST", "RDMA_CM_EVENT_CONNECT_RESPONSE",
        "RDMA_CM_EVENT_CONNECT_ERROR",   "RDMA_CM_EVENT_UNREACHABLE",
        "RDMA_CM_EVENT_REJECTED",        "RDMA_CM_EVENT_ESTABLISHED",
        "RDMA_CM_EVENT_DISCONNECTED",    "RDMA_CM_EVENT_DEVICE_REMOVAL",
        "RDMA_CM_EVENT_MULTICAST_JOIN",  "RDMA_CM_EVENT_MULTICAST_ERROR",
        "RDMA_CM_EVENT_ADDR_CHANGE",     "RDMA_CM_EVENT_TIMEWAIT_EXIT",
    };
    return (unsigned)ev < sizeof(names) / sizeof(names[0]) ? names[ev] : "UNKNOWN EVENT";
}
