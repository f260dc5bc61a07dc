/*
 * Control server: libevent listeners on TCP and a unix socket, frames in and
 * out, memfds received with SCM_RIGHTS on the unix socket. Requests are
 * handed to the worker pool; responses go back (tagged with the request id,
 * possibly out of order when a client pipelines) when their job is done.
 */
#include "frame.h"
#include "handshake.h"
#include "xferd.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define CONN_MAX_FDS         8
#define CONN_MAX_INFLIGHT    1024
#define HANDSHAKE_TIMEOUT_MS 3000

struct conn {
    struct ctl_server *s;
    int fd;
    bool is_unix;
    struct event *rev, *wev;
    struct evbuffer *in, *out;
    int fds[CONN_MAX_FDS];
    int nfds;
    int inflight; /* requests queued or running (flow control) */
    int refs;     /* jobs and callbacks using the struct (lifetime) */
    bool dead, reading;
    char **priv; /* private regions registered over this connection */
    size_t npriv;
    struct conn *prev, *next;
};

struct ctl_server {
    struct xferd *d;
    int tcp_fd, unix_fd;
    struct event *tcp_ev, *unix_ev;
    struct conn *conns;
    bool accepting;
};

struct req_job {
    struct job job;
    struct conn *c;
    Xctl__Request *req;
    int fd;
    Xctl__Response resp;
    struct arena arena;
};

struct hs_job {
    struct job job;
    struct ctl_server *s;
    int fd;
    int rc;
};

/* The struct outlives conn_close() while anything still holds it. */
static void conn_unref_maybe_free(struct conn *c)
{
    if (!c->dead || c->refs > 0)
        return;
    for (size_t i = 0; i < c->npriv; i++)
        free(c->priv[i]);
    free(c->priv);
    for (int i = 0; i < c->nfds; i++)
        close(c->fds[i]);
    evbuffer_free(c->in);
    evbuffer_free(c->out);
    free(c);
}

struct dereg_job {
    struct job job;
    struct xferd *d;
    char *name;
};

static void dereg_run(struct job *j)
{
    struct dereg_job *dj = (struct dereg_job *)j;
    struct xferd *d = dj->d;
    pthread_rwlock_wrlock(&d->region_lock);
    xfer_region *r = xfer_region_find(d->eng, dj->name);
    bool mine = r && xfer_region_detach(d->eng, r) == 0;
    pthread_rwlock_unlock(&d->region_lock);
    if (mine && xfer_region_deregister(d->eng, r) == 0) /* waits without our lock */
        xfer_info("region %s of a closed control connection deregistered", dj->name);
}

static void dereg_done(struct job *j)
{
    struct dereg_job *dj = (struct dereg_job *)j;
    free(dj->name);
    free(dj);
}

/* A client that dies mid-put must not leave its staging region behind. */
static void conn_release_private(struct conn *c)
{
    for (size_t i = 0; i < c->npriv; i++) {
        struct dereg_job *dj = calloc(1, sizeof(*dj));
        if (!dj) {
            free(c->priv[i]); /* stays registered until shutdown */
            continue;
        }
        dj->job.run = dereg_run;
        dj->job.done = dereg_done;
        dj->d = c->s->d;
        dj->name = c->priv[i];
        if (jobq_push(c->s->d->jobs, &dj->job)) {
            free(dj); /* shutting down: the engine frees every region */
            free(c->priv[i]);
        }
    }
    c->npriv = 0;
}

static void conn_track_private(struct conn *c, const Xctl__Request *req, const Xctl__Response *resp)
{
    if (resp->status)
        return;
    if (req->body_case == XCTL__REQUEST__BODY_REG &&
        (req->reg->private_ || req->reg->name[0] == XFERD_PRIVATE_PREFIX)) {
        char **np = realloc(c->priv, (c->npriv + 1) * sizeof(*np));
        if (!np)
            return;
        c->priv = np;
        if ((c->priv[c->npriv] = strdup(req->reg->name)) != NULL)
            c->npriv++;
    } else if (req->body_case == XCTL__REQUEST__BODY_DEREG) {
        for (size_t i = 0; i < c->npriv; i++)
            if (!strcmp(c->priv[i], req->dereg->name)) {
                free(c->priv[i]);
                c->priv[i] = c->priv[--c->npriv];
                break;
            }
    }
}

static void conn_close(struct conn *c)
{
    if (c->dead)
        return;
    c->dead = true;
    conn_release_private(c);
    event_free(c->rev);
    event_free(c->wev);
    close(c->fd);
    if (c->prev)
        c->prev->next = c->next;
    else
        c->s->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    conn_unref_maybe_free(c);
}

static void conn_flush(struct conn *c)
{
    while (evbuffer_get_length(c->out) > 0) {
        int n = evbuffer_write(c->out, c->fd);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            break;
        if (n <= 0) {
            conn_close(c);
            return;
        }
    }
    if (evbuffer_get_length(c->out) > 0)
        event_add(c->wev, NULL);
    else
        event_del(c->wev);
}

static void conn_send(struct conn *c, const Xctl__Response *resp)
{
    size_t len = xctl__response__get_packed_size(resp);
    if (len > XFER_FRAME_MAX) {
        Xctl__Response err = XCTL__RESPONSE__INIT;
        err.id = resp->id;
        err.status = -XFER_ERANGE;
        err.message = "response too large";
        conn_send(c, &err);
        return;
    }
    uint8_t hdr[4] = {(uint8_t)len, (uint8_t)(len >> 8), (uint8_t)(len >> 16),
                      (uint8_t)(len >> 24)};
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf) {
        conn_close(c);
        return;
    }
    xctl__response__pack(resp, buf);
    evbuffer_add(c->out, hdr, 4);
    evbuffer_add(c->out, buf, len);
    free(buf);
    conn_flush(c);
}

static void conn_set_reading(struct conn *c, bool on)
{
    if (c->dead || c->reading == on)
        return;
    c->reading = on;
    if (on)
        event_add(c->rev, NULL);
    else
        event_del(c->rev);
}

static void req_run(struct job *j)
{
    struct req_job *rj = (struct req_job *)j;
    xferd_handle(rj->c->s->d, rj->req, rj->fd, &rj->resp, &rj->arena);
}

static void req_done(struct job *j)
{
    struct req_job *rj = (struct req_job *)j;
    struct conn *c = rj->c;
    c->inflight--;
    conn_track_private(c, rj->req, &rj->resp); /* c->refs still counts this job */
    if (c->dead)
        conn_release_private(c); /* registered after the client went away */
    if (!c->dead) {
        conn_send(c, &rj->resp);
        if (c->inflight < CONN_MAX_INFLIGHT / 2)
            conn_set_reading(c, true);
    }
    arena_free(&rj->arena);
    xctl__request__free_unpacked(rj->req, NULL);
    free(rj);
    c->refs--;
    conn_unref_maybe_free(c);
}

static void reply_now(struct conn *c, uint64_t id, int status, const char *msg)
{
    Xctl__Response r = XCTL__RESPONSE__INIT;
    r.id = id;
    r.status = status;
    r.message = (char *)msg;
    conn_send(c, &r);
}

static int take_fd(struct conn *c)
{
    if (c->nfds == 0)
        return -1;
    int fd = c->fds[0];
    memmove(c->fds, c->fds + 1, (size_t)(c->nfds - 1) * sizeof(int));
    c->nfds--;
    return fd;
}

static void dispatch(struct conn *c, Xctl__Request *req)
{
    struct xferd *d = c->s->d;
    int fd = -1;
    atomic_fetch_add(&d->ctl_requests, 1);
    if (req->body_case == XCTL__REQUEST__BODY_REG && req->reg->memfd) {
        fd = c->is_unix ? take_fd(c) : -1;
        if (fd < 0) {
            atomic_fetch_add(&d->ctl_errors, 1);
            reply_now(c, req->id, -XFER_EINVAL,
                      c->is_unix ? "memfd expected with the request (SCM_RIGHTS)"
                                 : "memfd handover needs the unix socket");
            xctl__request__free_unpacked(req, NULL);
            return;
        }
    }
    struct req_job *rj = calloc(1, sizeof(*rj));
    int rc = rj ? 0 : -XFER_ENOMEM;
    if (rj) {
        rj->job.run = req_run;
        rj->job.done = req_done;
        rj->c = c;
        rj->req = req;
        rj->fd = fd;
        c->inflight++;
        c->refs++;
        rc = atomic_load(&d->draining) ? -XFER_EBUSY : jobq_push(d->jobs, &rj->job);
        if (rc) {
            c->inflight--;
            c->refs--;
        }
    }
    if (rc) {
        atomic_fetch_add(&d->ctl_errors, 1);
        reply_now(c, req->id, rc, rc == -XFER_EBUSY ? "xferd is shutting down" : "out of memory");
        if (fd >= 0)
            close(fd);
        free(rj);
        xctl__request__free_unpacked(req, NULL);
        return;
    }
    if (c->inflight >= CONN_MAX_INFLIGHT)
        conn_set_reading(c, false);
}

/* Parses every complete frame in c->in. false: the connection was closed. */
static bool parse_frames(struct conn *c)
{
    while (!c->dead && evbuffer_get_length(c->in) >= 4) {
        uint8_t h[4];
        evbuffer_copyout(c->in, h, 4);
        uint32_t len =
            (uint32_t)h[0] | (uint32_t)h[1] << 8 | (uint32_t)h[2] << 16 | (uint32_t)h[3] << 24;
        if (len > XFER_FRAME_MAX) {
            xfer_warn("control: frame of %u bytes refused, closing", len);
            reply_now(c, 0, -XFER_EPROTO, "frame too large");
            conn_close(c);
            return false;
        }
        if (evbuffer_get_length(c->in) < 4 + (size_t)len)
            break;
        evbuffer_drain(c->in, 4);
        uint8_t *buf = evbuffer_pullup(c->in, len);
        Xctl__Request *req = xctl__request__unpack(NULL, len, buf);
        evbuffer_drain(c->in, len);
        if (!req) {
            atomic_fetch_add(&c->s->d->ctl_errors, 1);
            reply_now(c, 0, -XFER_EPROTO, "malformed request");
            continue;
        }
        dispatch(c, req);
    }
    return !c->dead;
}

static void stash_fds(struct conn *c, struct msghdr *mh)
{
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(mh); cm; cm = CMSG_NXTHDR(mh, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
            continue;
        size_t n = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        int *fds = (int *)CMSG_DATA(cm);
        for (size_t i = 0; i < n; i++) {
            if (c->nfds < CONN_MAX_FDS)
                c->fds[c->nfds++] = fds[i];
            else
                close(fds[i]);
        }
    }
}

static void read_some(struct conn *c, int fd)
{
    char data[65536];
    union {
        char buf[CMSG_SPACE(sizeof(int) * 4)];
        struct cmsghdr align;
    } ctl;
    for (int rounds = 0; rounds < 16 && c->reading; rounds++) {
        struct iovec iov = {.iov_base = data, .iov_len = sizeof(data)};
        struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
        if (c->is_unix) {
            mh.msg_control = ctl.buf;
            mh.msg_controllen = sizeof(ctl.buf);
        }
        ssize_t n = recvmsg(fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            return;
        if (c->is_unix && n >= 0)
            stash_fds(c, &mh);
        if (n <= 0) {
            conn_close(c);
            return;
        }
        evbuffer_add(c->in, data, (size_t)n);
        if (!parse_frames(c))
            return;
        if ((size_t)n < sizeof(data))
            return;
    }
}

static void on_read(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    struct conn *c = arg;
    c->refs++; /* a reply may close the connection under us */
    read_some(c, fd);
    c->refs--;
    conn_unref_maybe_free(c);
}

static void on_write(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    conn_flush(arg);
}

static void conn_adopt(struct ctl_server *s, int fd, bool is_unix)
{
    struct conn *c = calloc(1, sizeof(*c));
    if (!c) {
        close(fd);
        return;
    }
    c->s = s;
    c->fd = fd;
    c->is_unix = is_unix;
    c->in = evbuffer_new();
    c->out = evbuffer_new();
    c->rev = event_new(s->d->base, fd, EV_READ | EV_PERSIST, on_read, c);
    c->wev = event_new(s->d->base, fd, EV_WRITE | EV_PERSIST, on_write, c);
    if (!c->in || !c->out || !c->rev || !c->wev) {
        xfer_err("control: out of memory for a connection");
        if (c->in)
            evbuffer_free(c->in);
        if (c->out)
            evbuffer_free(c->out);
        if (c->rev)
            event_free(c->rev);
        if (c->wev)
            event_free(c->wev);
        free(c);
        close(fd);
        return;
    }
    c->next = s->conns;
    if (s->conns)
        s->conns->prev = c;
    s->conns = c;
    conn_set_reading(c, true);
}

static void hs_run(struct job *j)
{
    struct hs_job *h = (struct hs_job *)j;
    struct xferd *d = h->s->d;
    struct xfer_hs_self self = {.node_id = d->cfg.node, .incarnation = d->incarnation};
    if (d->cfg.secret[0]) {
        self.secret = d->cfg.secret;
        self.secret_len = strlen(d->cfg.secret);
    }
    struct xfer_hs_peer peer;
    char why[200] = "";
    h->rc = xfer_handshake_server(h->fd, &self, HANDSHAKE_TIMEOUT_MS, &peer, why, sizeof(why));
    if (h->rc)
        xfer_warn("control: handshake refused: %s", why);
}

static void hs_done(struct job *j)
{
    struct hs_job *h = (struct hs_job *)j;
    if (h->rc == 0 && h->s->accepting)
        conn_adopt(h->s, h->fd, false);
    else
        close(h->fd);
    free(h);
}

static void on_accept(evutil_socket_t lfd, short what, void *arg)
{
    (void)what;
    struct ctl_server *s = arg;
    bool is_unix = lfd == s->unix_fd;
    int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0)
        return;
    if (is_unix) {
        conn_adopt(s, fd, true);
        return;
    }
    int one = 1; /* small request/response frames: no Nagle delay */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    /* The handshake blocks (bounded): run it on a worker, not the loop. */
    struct hs_job *h = calloc(1, sizeof(*h));
    if (!h) {
        close(fd);
        return;
    }
    h->job.run = hs_run;
    h->job.done = hs_done;
    h->s = s;
    h->fd = fd;
    if (jobq_push(s->d->jobs, &h->job)) {
        close(fd);
        free(h);
    }
}

static int listen_tcp(struct ctl_server *s, char *why, size_t wl)
{
    struct xferd *d = s->d;
    struct sockaddr_storage ss = {0};
    socklen_t sl;
    struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
    if (inet_pton(AF_INET, d->cfg.listen, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET;
        a4->sin_port = htons(d->cfg.ctrl_port);
        sl = sizeof(*a4);
    } else if (inet_pton(AF_INET6, d->cfg.listen, &a6->sin6_addr) == 1) {
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons(d->cfg.ctrl_port);
        sl = sizeof(*a6);
    } else {
        snprintf(why, wl, "listen address '%s' is not an IP address", d->cfg.listen);
        return -XFER_EINVAL;
    }
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ||
        bind(fd, (struct sockaddr *)&ss, sl) || listen(fd, 128) ||
        getsockname(fd, (struct sockaddr *)&ss, &sl)) {
        snprintf(why, wl, "control port %s:%u: %s", d->cfg.listen, d->cfg.ctrl_port,
                 strerror(errno));
        if (fd >= 0)
            close(fd);
        return -XFER_EIO;
    }
    d->ctrl_port = ntohs(ss.ss_family == AF_INET ? a4->sin_port : a6->sin6_port);
    s->tcp_fd = fd;
    return 0;
}

static int listen_unix(struct ctl_server *s, char *why, size_t wl)
{
    const char *path = s->d->cfg.ctrl_socket;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof(sa.sun_path)) {
        snprintf(why, wl, "socket path too long: %s", path);
        return -XFER_EINVAL;
    }
    strcpy(sa.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        goto fail;
    /* A socket file left by a crashed xferd would block bind(); one that
     * still answers belongs to a live xferd and is not taken over. */
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 || errno == EAGAIN) {
        snprintf(why, wl, "%s: another xferd is listening there", path);
        close(fd);
        return -XFER_EEXIST;
    }
    close(fd);
    unlink(path);
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    mode_t old = umask(0077);
    int rc = fd < 0 ? -1 : bind(fd, (struct sockaddr *)&sa, sizeof(sa));
    umask(old);
    if (rc || listen(fd, 128))
        goto fail;
    s->unix_fd = fd;
    return 0;
fail:
    snprintf(why, wl, "control socket %s: %s", path, strerror(errno));
    if (fd >= 0)
        close(fd);
    return -XFER_EIO;
}

struct ctl_server *ctl_server_new(struct xferd *d, char *why, size_t wl)
{
    struct ctl_server *s = calloc(1, sizeof(*s));
    if (!s) {
        snprintf(why, wl, "out of memory");
        return NULL;
    }
    s->d = d;
    s->tcp_fd = s->unix_fd = -1;
    if (listen_tcp(s, why, wl) || listen_unix(s, why, wl))
        goto fail;
    s->tcp_ev = event_new(d->base, s->tcp_fd, EV_READ | EV_PERSIST, on_accept, s);
    s->unix_ev = event_new(d->base, s->unix_fd, EV_READ | EV_PERSIST, on_accept, s);
    if (!s->tcp_ev || !s->unix_ev || event_add(s->tcp_ev, NULL) || event_add(s->unix_ev, NULL)) {
        snprintf(why, wl, "event setup failed");
        goto fail;
    }
    s->accepting = true;
    return s;
fail:
    ctl_server_free(s);
    return NULL;
}

void ctl_server_stop_accepting(struct ctl_server *s)
{
    if (!s || !s->accepting)
        return;
    s->accepting = false;
    event_del(s->tcp_ev);
    event_del(s->unix_ev);
    close(s->tcp_fd);
    close(s->unix_fd);
    s->tcp_fd = s->unix_fd = -1;
    unlink(s->d->cfg.ctrl_socket);
}

void ctl_server_free(struct ctl_server *s)
{
    if (!s)
        return;
    if (s->accepting)
        ctl_server_stop_accepting(s);
    if (s->tcp_ev)
        event_free(s->tcp_ev);
    if (s->unix_ev)
        event_free(s->unix_ev);
    if (s->tcp_fd >= 0)
        close(s->tcp_fd);
    if (s->unix_fd >= 0)
        close(s->unix_fd);
    while (s->conns)
        conn_close(s->conns);
    free(s);
}
