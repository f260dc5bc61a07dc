/*
 * Control server: libevent listeners on TCP and a unix socket, frames in and
 * out, memfds received with SCM_RIGHTS on the unix socket. Requests are
 * handed to the worker pool; responses go back (tagged with the request id,
 * possibly out of order when a client pipelines) when their job is done.
 */
#include "ctl_conn.h"
#include "frame.h"
#include "xfer_io.h"

#include <errno.h>
#include <event2/buffer.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

struct req_job {
    struct job job;
    struct conn *c;
    Xctl__Request *req;
    size_t bytes; /* frame size, counted in c->in_bytes */
    int fd;
    Xctl__Response resp;
    struct arena arena;
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
    ctl_quota_put(c->quota);
    free(c);
}

void conn_put(struct conn *c)
{
    c->refs--;
    conn_unref_maybe_free(c);
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

void conn_close(struct conn *c)
{
    if (c->dead)
        return;
    c->dead = true;
    ctl_hs_forget(c);
    ctl_listen_drop(c);
    if (c->counted)
        c->s->nconns--;
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

/* Back-pressure: a client is read from only while its requests in flight
 * and its unread replies are under their limits. */
static void conn_update_reading(struct conn *c)
{
    conn_set_reading(c, c->inflight < CONN_MAX_INFLIGHT && c->in_bytes < CONN_IN_MAX &&
                            evbuffer_get_length(c->out) < CONN_OUT_HIGH);
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
    size_t left = evbuffer_get_length(c->out);
    if (left > CONN_OUT_MAX) {
        xfer_warn("control: a client left %zu bytes of replies unread (limit %u): disconnected",
                  left, CONN_OUT_MAX);
        conn_close(c);
        return;
    }
    if (left > 0)
        event_add(c->wev, NULL);
    else
        event_del(c->wev);
    conn_update_reading(c);
}

void conn_send_raw(struct conn *c, const void *payload, size_t len)
{
    uint8_t hdr[4] = {(uint8_t)len, (uint8_t)(len >> 8), (uint8_t)(len >> 16),
                      (uint8_t)(len >> 24)};
    if (evbuffer_add(c->out, hdr, 4) || evbuffer_add(c->out, payload, len)) {
        conn_close(c);
        return;
    }
    conn_flush(c);
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
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf) {
        conn_close(c);
        return;
    }
    xctl__response__pack(resp, buf);
    conn_send_raw(c, buf, len);
    free(buf);
}

static void req_run(struct job *j)
{
    struct req_job *rj = (struct req_job *)j;
    xferd_handle(rj->c->s->d, rj->req, rj->fd, rj->c->quota, &rj->resp, &rj->arena);
}

static void req_done(struct job *j)
{
    struct req_job *rj = (struct req_job *)j;
    struct conn *c = rj->c;
    c->inflight--;
    c->in_bytes -= rj->bytes;
    conn_track_private(c, rj->req, &rj->resp); /* c->refs still counts this job */
    if (c->dead)
        conn_release_private(c); /* registered after the client went away */
    if (!c->dead)
        conn_send(c, &rj->resp); /* updates reading */
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

static void dispatch(struct conn *c, Xctl__Request *req, size_t bytes)
{
    struct xferd *d = c->s->d;
    int fd = -1;
    atomic_fetch_add(&d->ctl_requests, 1);
    if (req->body_case == XCTL__REQUEST__BODY_LISTEN) {
        /* a subscription, served by the loop thread (ctl_listen.c) */
        char why[160];
        int rc = atomic_load(&d->draining)
                     ? (snprintf(why, sizeof(why), "xferd is shutting down"), -XFER_EBUSY)
                     : ctl_listen_add(c, req->id, req->listen->count, why, sizeof(why));
        if (rc) {
            atomic_fetch_add(&d->ctl_errors, 1);
            reply_now(c, req->id, rc, why);
        }
        xctl__request__free_unpacked(req, NULL);
        return;
    }
    if (req->body_case == XCTL__REQUEST__BODY_LISTEN_ACK) {
        /* no reply unless it is wrong (a stream's acknowledgement) */
        char why[160];
        int rc = ctl_listen_ack(c, req->listen_ack->count, why, sizeof(why));
        if (rc) {
            atomic_fetch_add(&d->ctl_errors, 1);
            reply_now(c, req->id, rc, why);
        }
        xctl__request__free_unpacked(req, NULL);
        return;
    }
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
        rj->bytes = bytes;
        c->inflight++;
        c->in_bytes += bytes;
        c->refs++;
        rc = atomic_load(&d->draining) ? -XFER_EBUSY : jobq_push(d->jobs, &rj->job);
        if (rc) {
            c->inflight--;
            c->in_bytes -= bytes;
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
    conn_update_reading(c);
}

/* Parses every complete frame in c->in. false: the connection was closed. */
static bool parse_frames(struct conn *c)
{
    while (!c->dead && evbuffer_get_length(c->in) >= 4) {
        uint8_t h[4];
        evbuffer_copyout(c->in, h, 4);
        uint32_t len =
            (uint32_t)h[0] | (uint32_t)h[1] << 8 | (uint32_t)h[2] << 16 | (uint32_t)h[3] << 24;
        if (c->hs && len > XFER_HS_FRAME_MAX) {
            xfer_warn("control: handshake frame of %u bytes refused, closing", len);
            conn_close(c);
            return false;
        }
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
        if (c->hs) {
            bool open = ctl_hs_frame(c, buf, len);
            if (open)
                evbuffer_drain(c->in, len);
            if (!open)
                return false;
            continue;
        }
        Xctl__Request *req = xctl__request__unpack(NULL, len, buf);
        evbuffer_drain(c->in, len);
        if (!req) {
            atomic_fetch_add(&c->s->d->ctl_errors, 1);
            reply_now(c, 0, -XFER_EPROTO, "malformed request");
            continue;
        }
        dispatch(c, req, 4 + (size_t)len);
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

/* A new connection, read from at once (handshake frames first on TCP). */
struct conn *conn_new(struct ctl_server *s, int fd, bool is_unix)
{
    struct conn *c = calloc(1, sizeof(*c));
    if (!c) {
        close(fd);
        return NULL;
    }
    c->s = s;
    c->fd = fd;
    c->is_unix = is_unix;
    c->in = evbuffer_new();
    c->out = evbuffer_new();
    c->rev = event_new(s->d->base, fd, EV_READ | EV_PERSIST, on_read, c);
    c->wev = event_new(s->d->base, fd, EV_WRITE | EV_PERSIST, on_write, c);
    c->quota = ctl_quota_new();
    if (!c->in || !c->out || !c->rev || !c->wev || !c->quota) {
        xfer_err("control: out of memory for a connection");
        if (c->in)
            evbuffer_free(c->in);
        if (c->out)
            evbuffer_free(c->out);
        if (c->rev)
            event_free(c->rev);
        if (c->wev)
            event_free(c->wev);
        ctl_quota_put(c->quota);
        free(c);
        close(fd);
        return NULL;
    }
    c->next = s->conns;
    if (s->conns)
        s->conns->prev = c;
    s->conns = c;
    conn_set_reading(c, true);
    return c;
}

bool conn_admit(struct conn *c)
{
    struct ctl_server *s = c->s;
    if (s->nconns >= CTL_MAX_CONNS) {
        char msg[120];
        snprintf(msg, sizeof(msg), "xferd serves at most %d control connections; try again later",
                 CTL_MAX_CONNS);
        xfer_warn("control: connection refused: %d connections open", s->nconns);
        reply_now(c, 0, -XFER_EBUSY, msg);
        conn_close(c);
        return false;
    }
    c->counted = true;
    s->nconns++;
    return true;
}

static int listen_tcp(struct ctl_server *s, char *why, size_t wl)
{
    struct xferd *d = s->d;
    return xfer_listen_tcp(d->cfg.listen, d->cfg.ctrl_port, 128, true, &s->tcp_fd, &d->ctrl_port,
                           why, wl);
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
    s->tcp_ev = event_new(d->base, s->tcp_fd, EV_READ | EV_PERSIST, ctl_on_accept, s);
    s->unix_ev = event_new(d->base, s->unix_fd, EV_READ | EV_PERSIST, ctl_on_accept, s);
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
    while (s->hs_head)
        conn_close(s->hs_head);
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
    ctl_listen_free(s);
    free(s);
}
