/*
 * Setting a link up and tearing it down (control path only).
 *
 *   initiator                               target
 *   connect to addr:tcpx_port  ----------->  accept (acceptor thread)
 *   xfer handshake (HMAC, node id, incarnation) <-> (handshake thread)
 *   listen(); HELLO {plugin, version, handle I}  -->
 *                              <--  HELLO {status, handle T}   (its listen())
 *   connect(T) + accept(I) ...     ...   connect(I) + accept(T)   (non-blocking,
 *                                         both sides loop until both comms exist)
 *   READY {status}  ------------------------>
 *                              <--  READY {status, reason}
 *
 * Plugin listen handles thus only ever go to a peer that proved the cluster
 * secret. HELLO and READY are one fixed-size message (struct tcpx_msg),
 * length-framed like the handshake (proto/frame.h).
 */
#include "tcpx.h"
#include "xfer_io.h"
#include "handshake.h"

#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define TCPX_PURPOSE   0x54435058u /* "TCPX": handshake purpose of a tcpx link */
#define TCPX_MSG_MAGIC 0x58504354u
#define TCPX_MSG_LEN   (4 + 4 + 4 + 4 + 32 + XNCCL_NET_HANDLE_MAXSIZE + 128)

struct tcpx_msg {
    int32_t status;
    uint32_t version; /* plugin struct version */
    uint32_t handle_len;
    char plugin[32]; /* the plugin's name */
    uint8_t handle[XNCCL_NET_HANDLE_MAXSIZE];
    char text[128]; /* reason when status < 0 */
};

static void put32(uint8_t *p, uint32_t v)
{
    v = htole32(v);
    memcpy(p, &v, 4);
}

static uint32_t get32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return le32toh(v);
}

static int msg_send(int fd, const struct tcpx_msg *m, int64_t deadline)
{
    uint8_t b[TCPX_MSG_LEN];
    put32(b, TCPX_MSG_MAGIC);
    put32(b + 4, (uint32_t)m->status);
    put32(b + 8, m->version);
    put32(b + 12, m->handle_len);
    memcpy(b + 16, m->plugin, 32);
    memcpy(b + 48, m->handle, XNCCL_NET_HANDLE_MAXSIZE);
    memcpy(b + 48 + XNCCL_NET_HANDLE_MAXSIZE, m->text, 128);
    int left = (int)(deadline - xfer_now_ms());
    return left <= 0 ? -XFER_ETIMEDOUT : xfer_frame_send(fd, b, sizeof(b), left);
}

static int msg_recv(int fd, struct tcpx_msg *m, int64_t deadline)
{
    int left = (int)(deadline - xfer_now_ms());
    if (left <= 0)
        return -XFER_ETIMEDOUT;
    uint8_t *b;
    size_t len;
    int rc = xfer_frame_recv(fd, TCPX_MSG_LEN, left, &b, &len);
    if (rc)
        return rc;
    rc = len == TCPX_MSG_LEN && get32(b) == TCPX_MSG_MAGIC ? 0 : -XFER_EPROTO;
    if (rc == 0) {
        m->status = (int32_t)get32(b + 4);
        m->version = get32(b + 8);
        m->handle_len = get32(b + 12);
        memcpy(m->plugin, b + 16, 32);
        memcpy(m->handle, b + 48, XNCCL_NET_HANDLE_MAXSIZE);
        memcpy(m->text, b + 48 + XNCCL_NET_HANDLE_MAXSIZE, 128);
        m->plugin[31] = m->text[127] = '\0';
        if (m->handle_len > XNCCL_NET_HANDLE_MAXSIZE || m->status > 0 || m->status <= -XFER_ERR_MAX)
            rc = -XFER_EPROTO;
    }
    free(b);
    return rc;
}

static void msg_init(struct tcpx_msg *m, const struct tcpx_net *n, int status, const char *text)
{
    memset(m, 0, sizeof(*m));
    m->status = status;
    m->version = (uint32_t)n->version;
    m->handle_len = XNCCL_NET_HANDLE_MAXSIZE;
    snprintf(m->plugin, sizeof(m->plugin), "%.31s", n->props.name);
    snprintf(m->text, sizeof(m->text), "%s", text ? text : "");
}

static struct tcpx_link *link_new(struct tcpx_transport *tt, int fd, bool target, const char *name)
{
    struct tcpx_link *l = calloc(1, sizeof(*l));
    if (!l)
        return NULL;
    l->tt = tt;
    l->fd = fd;
    l->target = target;
    snprintf(l->name, sizeof(l->name), "%s", name);
    pthread_mutex_init(&l->mem_mu, NULL);
    pthread_mutex_init(&l->qmu, NULL);
    l->host.device = -1;
    l->last_progress_ms = xfer_now_ms();
    return l;
}

void tcpx_link_free(struct tcpx_link *l)
{
    if (!l)
        return;
    tcpx_msg_fail_all(l, "the link is closed");
    tcpx_mem_release(l);
    if (l->fd >= 0)
        close(l->fd);
    pthread_mutex_destroy(&l->mem_mu);
    pthread_mutex_destroy(&l->qmu);
    free(l->tx);
    free(l);
}

void tcpx_link_adopt(struct tcpx_transport *tt, struct tcpx_link *l)
{
    l->last_progress_ms = xfer_now_ms();
    pthread_mutex_lock(&tt->mu);
    l->next = tt->links;
    tt->links = l;
    pthread_mutex_unlock(&tt->mu);
    tcpx_kick(tt);
}

/* Offload objects for connect/accept, as NCCL passes them: present (type
 * UNPACK) when the plugin announced a device mode, else NULL. */
static xnccl_dh *offload_obj(struct tcpx_link *l, struct xnccl_net_device_handle *dh)
{
    const struct tcpx_net_props *p = &l->tt->net->props;
    if (p->net_device_type != XNCCL_NET_DEVICE_UNPACK)
        return NULL;
    memset(dh, 0, sizeof(*dh));
    dh->net_device_type = p->net_device_type;
    dh->net_device_version = p->net_device_version;
    return dh;
}

/* connect(peer_handle) and accept(listen_comm), again and again, until both
 * comms exist or the deadline passes. */
static int make_comms(struct tcpx_link *l, void *lc, uint8_t *peer_handle, int64_t deadline,
                      char *why, size_t wl)
{
    struct tcpx_net *n = l->tt->net;
    xnccl_dh *sdh = offload_obj(l, &l->send_dh), *rdh = offload_obj(l, &l->recv_dh);
    struct timespec nap = {0, 200000};
    while (!l->send_comm || !l->recv_comm) {
        int r = 0;
        if (!l->send_comm && (r = tcpx_net_connect(n, peer_handle, &l->send_comm, &sdh)) != 0) {
            snprintf(why, wl, "plugin connect: %s", tcpx_net_result_str(r));
            return -XFER_ECONN;
        }
        if (!l->recv_comm && (r = tcpx_net_accept(n, lc, &l->recv_comm, &rdh)) != 0) {
            snprintf(why, wl, "plugin accept: %s", tcpx_net_result_str(r));
            return -XFER_ECONN;
        }
        if (l->send_comm && l->recv_comm)
            break;
        if (xfer_now_ms() > deadline) {
            snprintf(why, wl, "plugin %s not ready in time", l->send_comm ? "accept" : "connect");
            return -XFER_ETIMEDOUT;
        }
        nanosleep(&nap, NULL); /* paces the retries the ABI asks for */
    }
    l->unpack = rdh && rdh->handle && rdh->net_device_type == XNCCL_NET_DEVICE_UNPACK;
    return l->unpack ? tcpx_unpack_setup(l, why, wl) : 0;
}

/* listen() + make_comms() + closeListen(). */
static int plugin_link(struct tcpx_link *l, void *lc, uint8_t *peer_handle, int64_t deadline,
                       char *why, size_t wl)
{
    int rc = make_comms(l, lc, peer_handle, deadline, why, wl);
    tcpx_net_close_listen(l->tt->net, lc);
    return rc;
}

static int check_peer_plugin(const struct tcpx_net *n, const struct tcpx_msg *m, char *why,
                             size_t wl)
{
    if (strncmp(m->plugin, n->props.name, sizeof(m->plugin) - 1) ||
        m->version != (uint32_t)n->version) {
        snprintf(why, wl, "peer uses plugin %s v%u, we use %s v%d", m->plugin, m->version,
                 n->props.name, n->version);
        return -XFER_ENOTSUP;
    }
    return 0;
}

/* ---- initiator ---------------------------------------------------------------------- */

static int dial_fd(const char *addr, uint16_t port, int64_t deadline, char *why, size_t wl)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    char ports[8];
    snprintf(ports, sizeof(ports), "%u", port);
    int rc = getaddrinfo(addr, ports, &hints, &res);
    if (rc != 0) {
        snprintf(why, wl, "address %s: %s", addr, gai_strerror(rc));
        return -XFER_EINVAL;
    }
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    rc = fd < 0 ? -1 : connect(fd, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    if (rc < 0 && fd >= 0 && errno == EINPROGRESS) {
        rc = xfer_io_wait(fd, POLLOUT, deadline);
        int soerr = 0;
        socklen_t sl = sizeof(soerr);
        if (rc == 0)
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
        errno = rc ? ETIMEDOUT : soerr;
        rc = rc || soerr ? -1 : 0;
    }
    if (rc < 0) {
        snprintf(why, wl, "connect to %s:%u: %s", addr, port, strerror(errno));
        if (fd >= 0)
            close(fd);
        return errno == ETIMEDOUT ? -XFER_ETIMEDOUT : -XFER_ECONN;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

static int client_handshake(struct tcpx_transport *tt, int fd, const struct xfer_peer_desc *d,
                            int64_t deadline, char *why, size_t wl)
{
    const struct xfer_engine_config *cfg = xfer_engine_config_get(tt->engine);
    struct xfer_hs_self hs = {cfg->node_id, xfer_engine_incarnation(tt->engine), cfg->secret,
                              cfg->secret_len, TCPX_PURPOSE};
    struct xfer_hs_peer hp;
    int left = (int)(deadline - xfer_now_ms());
    int rc = left > 0 ? xfer_handshake_client(fd, &hs, left, &hp, why, wl) : -XFER_ETIMEDOUT;
    if (rc == 0 && strcmp(hp.node_id, d->node_id)) {
        snprintf(why, wl, "node %.40s answered, expected %.40s", hp.node_id, d->node_id);
        rc = -XFER_ESTALE;
    } else if (rc == 0 && d->incarnation && hp.incarnation != d->incarnation) {
        snprintf(why, wl, "node %s restarted (incarnation differs)", d->node_id);
        rc = -XFER_ESTALE;
    }
    return rc;
}

static int dial_steps(struct tcpx_link *l, const struct xfer_peer_desc *d, int64_t deadline,
                      char *why, size_t wl)
{
    struct tcpx_net *n = l->tt->net;
    int rc = client_handshake(l->tt, l->fd, d, deadline, why, wl);
    if (rc)
        return rc;
    struct tcpx_msg mine, theirs;
    void *lc = NULL;
    msg_init(&mine, n, 0, NULL);
    int r = tcpx_net_listen(n, mine.handle, &lc);
    if (r != 0) {
        snprintf(why, wl, "plugin listen: %s", tcpx_net_result_str(r));
        return -XFER_EIO;
    }
    if ((rc = msg_send(l->fd, &mine, deadline)) || (rc = msg_recv(l->fd, &theirs, deadline))) {
        snprintf(why, wl, "exchanging plugin handles: %s", xfer_strerror(rc));
    } else if (theirs.status < 0) {
        snprintf(why, wl, "%s", theirs.text);
        rc = theirs.status;
    } else {
        rc = check_peer_plugin(n, &theirs, why, wl);
    }
    if (rc) {
        tcpx_net_close_listen(n, lc);
        return rc;
    }
    rc = plugin_link(l, lc, theirs.handle, deadline, why, wl);
    msg_init(&mine, n, rc, rc ? why : NULL);
    int rc2 = msg_send(l->fd, &mine, deadline);
    if (rc)
        return rc;
    if (rc2 == 0)
        rc2 = msg_recv(l->fd, &theirs, deadline);
    if (rc2) {
        snprintf(why, wl, "no READY from the peer: %s", xfer_strerror(rc2));
        return rc2;
    }
    if (theirs.status < 0)
        snprintf(why, wl, "%s", theirs.text);
    return theirs.status;
}

int tcpx_link_dial(struct tcpx_transport *tt, const struct xfer_peer_desc *d, int64_t deadline,
                   struct tcpx_link **out)
{
    char why[200] = "", name[96];
    snprintf(name, sizeof(name), "%.40s@%.40s:%u", d->node_id, d->addr, d->tcpx_port);
    int fd = dial_fd(d->addr, d->tcpx_port, deadline, why, sizeof(why));
    struct tcpx_link *l = fd >= 0 ? link_new(tt, fd, false, name) : NULL;
    int rc = fd < 0 ? fd : l ? dial_steps(l, d, deadline, why, sizeof(why)) : -XFER_ENOMEM;
    if (rc < 0) {
        xfer_engine_set_error(tt->engine, "tcpx: link to %s: %s", name,
                              why[0] ? why : xfer_strerror(rc));
        xfer_warn("%s", xfer_engine_last_error(tt->engine));
        if (l)
            tcpx_link_free(l);
        else if (fd >= 0)
            close(fd);
        return rc;
    }
    xfer_debug("tcpx: link %s up (receives %s)", name, l->unpack ? "unpacked" : "in place");
    *out = l;
    return 0;
}

/* ---- target --------------------------------------------------------------------------- */

static int accept_steps(struct tcpx_link *l, int64_t deadline, char *why, size_t wl)
{
    struct tcpx_net *n = l->tt->net;
    struct tcpx_msg theirs, mine;
    int rc = msg_recv(l->fd, &theirs, deadline);
    if (rc) {
        snprintf(why, wl, "no plugin handle from the peer: %s", xfer_strerror(rc));
        return rc;
    }
    void *lc = NULL;
    rc = check_peer_plugin(n, &theirs, why, wl);
    int r;
    msg_init(&mine, n, rc, rc ? why : NULL);
    if (rc == 0 && (r = tcpx_net_listen(n, mine.handle, &lc)) != 0) {
        snprintf(why, wl, "plugin listen: %s", tcpx_net_result_str(r));
        rc = -XFER_EIO;
        msg_init(&mine, n, rc, why);
    }
    int rc2 = msg_send(l->fd, &mine, deadline);
    if (rc || rc2) {
        if (lc)
            tcpx_net_close_listen(n, lc);
        return rc ? rc : rc2;
    }
    rc = plugin_link(l, lc, theirs.handle, deadline, why, wl);
    rc2 = msg_recv(l->fd, &theirs, deadline);
    msg_init(&mine, n, rc, rc ? why : NULL);
    if (rc2 == 0)
        rc2 = msg_send(l->fd, &mine, deadline);
    if (rc)
        return rc;
    if (rc2 == 0 && theirs.status < 0) {
        snprintf(why, wl, "peer failed: %s", theirs.text);
        return theirs.status;
    }
    if (rc2)
        snprintf(why, wl, "READY: %s", xfer_strerror(rc2));
    return rc2;
}

int tcpx_link_accept(struct tcpx_transport *tt, int fd, const char *from, struct tcpx_link **out)
{
    xfer_engine *e = tt->engine;
    const struct xfer_engine_config *cfg = xfer_engine_config_get(e);
    int64_t deadline = xfer_now_ms() + 2 * cfg->connect_timeout_ms;
    struct xfer_hs_self hs = {cfg->node_id, xfer_engine_incarnation(e), cfg->secret,
                              cfg->secret_len, 0};
    struct xfer_hs_peer hp;
    char why[200] = "", name[96];
    int rc = xfer_handshake_server(fd, &hs, cfg->connect_timeout_ms, &hp, why, sizeof(why));
    if (rc == 0 && hp.purpose != TCPX_PURPOSE) {
        snprintf(why, sizeof(why), "not a tcpx link (purpose %u)", hp.purpose);
        rc = -XFER_EPROTO;
    }
    snprintf(name, sizeof(name), "%.40s@%.50s", rc == 0 ? hp.node_id : "?", from);
    struct tcpx_link *l = rc == 0 ? link_new(tt, fd, true, name) : NULL;
    if (l) {
        snprintf(l->peer_node, sizeof(l->peer_node), "%s", hp.node_id);
        l->peer_inc = hp.incarnation;
    }
    if (rc == 0)
        rc = l ? accept_steps(l, deadline, why, sizeof(why)) : -XFER_ENOMEM;
    if (rc < 0) {
        xfer_warn("tcpx: refused connection from %s: %s (%s)", name, why, xfer_strerror(rc));
        if (l)
            tcpx_link_free(l);
        else
            close(fd);
        return rc;
    }
    xfer_debug("tcpx: serving %s (receives %s)", name, l->unpack ? "unpacked" : "in place");
    *out = l;
    return 0;
}
