/* tcpx transport: the ops table, probe/open/close, the control listener and
 * its acceptor, connections as seen by the engine. Tunables (environment):
 *   XFER_TCPX_PLUGIN       the NCCL net plugin (default libnccl-net.so)
 *   XFER_TCPX_NET_VERSION  use exactly this struct version (default: newest)
 *   XFER_TCPX_DEV          plugin device index (default 0)
 *   XFER_TCPX_PORT         control port (default ephemeral)
 *   XFER_TCPX_UNPACK       kernel | d2d | host (default kernel) */
#include "tcpx.h"
#include "xfer_io.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int tcpx_probe(xfer_engine *e, char *why, size_t why_len)
{
    (void)e;
    struct tcpx_net *n;
    int rc = tcpx_net_get(NULL, 0, &n, why, why_len);
    if (rc == 0)
        tcpx_net_put(n);
    return rc;
}

static bool tcpx_reaches(struct xfer_transport *t, const struct xfer_peer_desc *peer)
{
    (void)t;
    return (peer->transports & XFER_TRANSPORT_TCPX) && peer->tcpx_port && peer->addr[0];
}

static void tcpx_describe(struct xfer_transport *t, struct xfer_peer_desc *self)
{
    self->tcpx_port = tcpx_of(t)->port;
}

void tcpx_kick(struct tcpx_transport *tt)
{
    uint64_t one = 1;
    if (write(tt->wakefd, &one, sizeof(one)) < 0 && errno != EAGAIN)
        xfer_err("tcpx: eventfd write: %s", strerror(errno));
}

/* ---- control listener ---------------------------------------------------------- */

static int listen_on(struct tcpx_transport *tt, const char *addr)
{
    const char *p = getenv("XFER_TCPX_PORT");
    char why[160];
    int rc = xfer_listen_tcp(addr, (uint16_t)(p ? atoi(p) : 0), 64, false, &tt->listen_fd,
                             &tt->port, why, sizeof(why));
    if (rc < 0)
        xfer_engine_set_error(tt->engine, "tcpx: %s", why);
    return rc;
}

struct hs_job {
    struct tcpx_transport *tt;
    int fd;
    char from[64];
};

/* One inbound link: handshake, plugin comms, then the progress thread. A
 * peer that connects and says nothing delays no one else. */
static void *handshake_main(void *arg)
{
    struct hs_job *job = arg;
    struct tcpx_transport *tt = job->tt;
    struct tcpx_link *l;
    if (tcpx_link_accept(tt, job->fd, job->from, &l) == 0)
        tcpx_link_adopt(tt, l);
    free(job);
    pthread_mutex_lock(&tt->hs_mu);
    tt->hs_running--;
    pthread_cond_broadcast(&tt->hs_cv);
    pthread_mutex_unlock(&tt->hs_mu);
    return NULL;
}

static void start_handshake(struct tcpx_transport *tt, int fd, const char *from)
{
    struct hs_job *job = calloc(1, sizeof(*job));
    pthread_mutex_lock(&tt->hs_mu);
    bool room = job && tt->hs_running < TCPX_HANDSHAKES_MAX;
    tt->hs_running += room;
    pthread_mutex_unlock(&tt->hs_mu);
    pthread_attr_t attr;
    pthread_t th;
    if (room) {
        *job = (struct hs_job){.tt = tt, .fd = fd};
        snprintf(job->from, sizeof(job->from), "%s", from);
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        room = pthread_create(&th, &attr, handshake_main, job) == 0;
        pthread_attr_destroy(&attr);
        if (!room) {
            pthread_mutex_lock(&tt->hs_mu);
            tt->hs_running--;
            pthread_mutex_unlock(&tt->hs_mu);
        }
    }
    if (!room) {
        xfer_warn("tcpx: refused connection from %s: too many handshakes in progress", from);
        free(job);
        close(fd);
    }
}

static void *acceptor_main(void *arg)
{
    struct tcpx_transport *tt = arg;
    struct pollfd pfd = {tt->listen_fd, POLLIN, 0};
    while (!tt->stop) {
        if (poll(&pfd, 1, 200) <= 0 || tt->stop)
            continue;
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        int fd = accept4(tt->listen_fd, (struct sockaddr *)&ss, &sl, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
            if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
                xfer_warn("tcpx: accept: %s", strerror(errno));
            continue;
        }
        char host[48] = "?", from[64];
        uint16_t port = 0;
        if (ss.ss_family == AF_INET) {
            inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, host, sizeof(host));
            port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
        } else if (ss.ss_family == AF_INET6) {
            inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, host, sizeof(host));
            port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
        }
        snprintf(from, sizeof(from), "%s:%u", host, port);
        start_handshake(tt, fd, from);
    }
    return NULL;
}

/* Handshakes are bounded by connect_timeout_ms (plus the plugin's connect
 * loop, bounded the same way). */
static void wait_handshakes(struct tcpx_transport *tt)
{
    int ms = 2 * xfer_engine_config_get(tt->engine)->connect_timeout_ms + 2000;
    struct timespec ts = xfer_mono_after_ms(ms);
    pthread_mutex_lock(&tt->hs_mu);
    while (tt->hs_running > 0)
        if (pthread_cond_timedwait(&tt->hs_cv, &tt->hs_mu, &ts) == ETIMEDOUT)
            break;
    if (tt->hs_running > 0)
        xfer_err("tcpx: %d handshakes still running at close", tt->hs_running);
    pthread_mutex_unlock(&tt->hs_mu);
}

/* ---- open / close ---------------------------------------------------------------- */

static void tcpx_close(struct xfer_transport *t)
{
    struct tcpx_transport *tt = tcpx_of(t);
    tt->stop = true;
    if (tt->acceptor_started)
        pthread_join(tt->acceptor, NULL);
    wait_handshakes(tt);
    if (tt->progress_started) {
        tcpx_kick(tt);
        pthread_join(tt->progress, NULL);
    }
    /* target links (initiator links went with their peers) */
    while (tt->links) {
        struct tcpx_link *l = tt->links;
        tt->links = l->next;
        tcpx_link_fail(l, 0, "transport closing");
        tcpx_link_free(l);
    }
    tcpx_unpack_free(tt);
    if (tt->listen_fd >= 0)
        close(tt->listen_fd);
    if (tt->wakefd >= 0)
        close(tt->wakefd);
    tcpx_net_put(tt->net);
    pthread_mutex_destroy(&tt->mu);
    pthread_cond_destroy(&tt->cv);
    pthread_mutex_destroy(&tt->hs_mu);
    pthread_cond_destroy(&tt->hs_cv);
    free(tt);
}

static int unpack_method(struct tcpx_transport *tt)
{
    const char *m = getenv("XFER_TCPX_UNPACK");
    tt->method = XFER_UNPACK_KERNEL;
    if (m && *m && xfer_unpack_method_parse(m, &tt->method) < 0) {
        xfer_engine_set_error(tt->engine, "tcpx: XFER_TCPX_UNPACK=%s: want kernel, d2d or host", m);
        return -XFER_EINVAL;
    }
    return 0;
}

static int tcpx_open(xfer_engine *e, struct xfer_transport **out)
{
    struct tcpx_transport *tt = calloc(1, sizeof(*tt));
    if (!tt)
        return -XFER_ENOMEM;
    tt->base.ops = &xfer_tcpx_transport_ops;
    tt->base.engine = e;
    tt->engine = e;
    tt->listen_fd = -1;
    pthread_mutex_init(&tt->mu, NULL);
    xfer_cond_init_mono(&tt->cv);
    pthread_mutex_init(&tt->hs_mu, NULL);
    xfer_cond_init_mono(&tt->hs_cv);
    tt->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    char why[256] = "";
    int rc = tcpx_net_get(NULL, 0, &tt->net, why, sizeof(why));
    if (rc < 0)
        xfer_engine_set_error(e, "tcpx: %s", why);
    if (rc == 0)
        rc = unpack_method(tt);
    if (rc == 0)
        rc = tt->wakefd < 0 ? -XFER_EIO : listen_on(tt, xfer_engine_config_get(e)->listen_addr);
    if (rc == 0) {
        rc = pthread_create(&tt->progress, NULL, tcpx_progress_main, tt) ? -XFER_ENOMEM : 0;
        tt->progress_started = rc == 0;
    }
    if (rc == 0) {
        rc = pthread_create(&tt->acceptor, NULL, acceptor_main, tt) ? -XFER_ENOMEM : 0;
        tt->acceptor_started = rc == 0;
    }
    if (rc < 0) {
        tcpx_close(&tt->base);
        return rc;
    }
    const struct tcpx_net_props *p = &tt->net->props;
    xfer_info("tcpx: plugin %s (%s, struct v%d), device %d of %d, %s%s memory, receives %s, "
              "unpack %s, control port %u",
              tt->net->path, p->name, tt->net->version, tt->net->dev, tt->net->ndev,
              p->ptr_support & XNCCL_PTR_HOST ? "host " : "",
              p->ptr_support & XNCCL_PTR_CUDA ? "cuda" : "",
              p->net_device_type == XNCCL_NET_DEVICE_UNPACK ? "in unpack mode" : "in place",
              xfer_unpack_method_name(tt->method), tt->port);
    *out = &tt->base;
    return 0;
}

/* ---- connections ------------------------------------------------------------------ */

static int tcpx_connect(struct xfer_transport *t, xfer_peer *peer, int timeout_ms,
                        struct xfer_conn **out)
{
    struct tcpx_transport *tt = tcpx_of(t);
    struct tcpx_conn *c = calloc(1, sizeof(*c));
    if (!c)
        return -XFER_ENOMEM;
    int rc = tcpx_link_dial(tt, xfer_peer_desc_get(peer), xfer_now_ms() + timeout_ms, &c->link);
    if (rc < 0) {
        free(c);
        return rc;
    }
    tcpx_link_adopt(tt, c->link);
    c->base.transport = t;
    c->base.peer = peer;
    *out = &c->base;
    return 0;
}

/* Asks the progress thread to fail and drop the link, waits for that
 * (bounded: a stuck thread leaks the link rather than freeing it in use). */
static void tcpx_disconnect(struct xfer_conn *xc)
{
    struct tcpx_conn *c = container_of(xc, struct tcpx_conn, base);
    struct tcpx_link *l = c->link;
    struct tcpx_transport *tt = l->tt;
    pthread_mutex_lock(&tt->mu);
    l->close_req = true;
    pthread_mutex_unlock(&tt->mu);
    tcpx_kick(tt);
    struct timespec ts = xfer_mono_after_ms(30000);
    pthread_mutex_lock(&tt->mu);
    while (!l->released)
        if (pthread_cond_timedwait(&tt->cv, &tt->mu, &ts) == ETIMEDOUT)
            break;
    bool released = l->released;
    pthread_mutex_unlock(&tt->mu);
    if (released)
        tcpx_link_free(l);
    else
        xfer_err("tcpx: link %s not released by the progress thread", l->name);
    free(c);
}

static unsigned tcpx_conn_state(struct xfer_conn *xc)
{
    struct tcpx_link *l = container_of(xc, struct tcpx_conn, base)->link;
    if (__atomic_load_n(&l->dead, __ATOMIC_RELAXED))
        return XFER_CONN_SOME_DEAD | XFER_CONN_ALL_DEAD;
    return __atomic_load_n(&l->load, __ATOMIC_RELAXED) ? XFER_CONN_BUSY : 0;
}

/* A region goes away: its registrations with every link go too (no request
 * uses it any more: target pins and initiator batches hold it till done). */
static void tcpx_dereg_mem(struct xfer_transport *t, xfer_region *r)
{
    struct tcpx_transport *tt = tcpx_of(t);
    pthread_mutex_lock(&tt->mu);
    for (struct tcpx_link *l = tt->links; l; l = l->next)
        tcpx_mem_forget(l, xfer_region_id(r), xfer_region_gen(r));
    pthread_mutex_unlock(&tt->mu);
}

const struct xfer_transport_ops xfer_tcpx_transport_ops = {
    .name = "tcpx",
    .bit = XFER_TRANSPORT_TCPX,
#if XFER_WITH_CUDA
    .caps = XFER_CAP_HOST_MEM | XFER_CAP_CUDA_MEM | XFER_CAP_NEEDS_REG,
#else
    .caps = XFER_CAP_HOST_MEM | XFER_CAP_NEEDS_REG,
#endif
    .preference = 60,
    .probe = tcpx_probe,
    .open = tcpx_open,
    .close = tcpx_close,
    .reaches = tcpx_reaches,
    .connect = tcpx_connect,
    .disconnect = tcpx_disconnect,
    .conn_state = tcpx_conn_state,
    .dereg_mem = tcpx_dereg_mem,
    .describe = tcpx_describe,
    .post = tcpx_post,
    .send_msg = tcpx_send_msg,
};
