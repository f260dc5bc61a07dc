/* Blocking control-API client with timeouts (see ctl_client.h). */
#include "ctl_client.h"
#include "xfer_io.h"
#include "xfer_handshake.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

struct ctl_client {
    int fd;
    bool is_unix;
    uint64_t next_id;
};

int ctl_fd(const struct ctl_client *c)
{
    return c->fd;
}

static struct ctl_client *client_new(int fd, bool is_unix)
{
    struct ctl_client *c = calloc(1, sizeof(*c));
    if (!c) {
        close(fd);
        return NULL;
    }
    c->fd = fd;
    c->is_unix = is_unix;
    c->next_id = 1;
    return c;
}

/* Non-blocking connect bounded by timeout_ms. */
static int connect_timeout(int fd, const struct sockaddr *sa, socklen_t sl, int timeout_ms)
{
    if (connect(fd, sa, sl) == 0)
        return 0;
    if (errno != EINPROGRESS && errno != EAGAIN)
        return -errno;
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    int n;
    do
        n = poll(&p, 1, timeout_ms);
    while (n < 0 && errno == EINTR);
    if (n == 0)
        return -ETIMEDOUT;
    int soerr = 0;
    socklen_t el = sizeof(soerr);
    if (n < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &el))
        return -errno;
    return soerr ? -soerr : 0;
}

struct ctl_client *ctl_connect_unix(const char *path, int timeout_ms, int *err, char *why,
                                    size_t wl)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof(sa.sun_path)) {
        snprintf(why, wl, "socket path too long: %s", path);
        *err = -XFER_EINVAL;
        return NULL;
    }
    strcpy(sa.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int rc = fd < 0 ? -errno : connect_timeout(fd, (struct sockaddr *)&sa, sizeof(sa), timeout_ms);
    if (rc) {
        snprintf(why, wl, "cannot reach xferd at %s: %s", path, strerror(-rc));
        if (fd >= 0)
            close(fd);
        *err = rc == -ETIMEDOUT ? -XFER_ETIMEDOUT : -XFER_ECONN;
        return NULL;
    }
    struct ctl_client *c = client_new(fd, true);
    if (!c)
        *err = -XFER_ENOMEM;
    return c;
}

static int resolve(const char *host, uint16_t port, struct sockaddr_storage *ss, socklen_t *sl)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
    char ps[8];
    snprintf(ps, sizeof(ps), "%u", port);
    if (getaddrinfo(host, ps, &hints, &ai) || !ai)
        return -XFER_EINVAL;
    memcpy(ss, ai->ai_addr, ai->ai_addrlen);
    *sl = ai->ai_addrlen;
    freeaddrinfo(ai);
    return 0;
}

struct ctl_client *ctl_connect_tcp(const char *host, uint16_t port, const char *secret,
                                   int timeout_ms, int *err, char *why, size_t wl)
{
    struct sockaddr_storage ss;
    socklen_t sl;
    if (resolve(host, port, &ss, &sl)) {
        snprintf(why, wl, "cannot resolve '%s'", host);
        *err = -XFER_EINVAL;
        return NULL;
    }
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int rc = fd < 0 ? -errno : connect_timeout(fd, (struct sockaddr *)&ss, sl, timeout_ms);
    if (rc) {
        snprintf(why, wl, "cannot reach xferd at %s:%u: %s", host, port, strerror(-rc));
        if (fd >= 0)
            close(fd);
        *err = rc == -ETIMEDOUT ? -XFER_ETIMEDOUT : -XFER_ECONN;
        return NULL;
    }
    int one = 1; /* small request/response frames: no Nagle delay */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    struct xfer_hs_self self = {.node_id = "xferctl", .incarnation = (uint64_t)getpid()};
    if (secret && *secret) {
        self.secret = secret;
        self.secret_len = strlen(secret);
    }
    struct xfer_hs_peer peer;
    char hwhy[200] = "";
    rc = xfer_handshake_client(fd, &self, timeout_ms, &peer, hwhy, sizeof(hwhy));
    if (rc) {
        snprintf(why, wl, "handshake with %s:%u failed: %s", host, port, hwhy);
        close(fd);
        *err = rc;
        return NULL;
    }
    struct ctl_client *c = client_new(fd, false);
    if (!c)
        *err = -XFER_ENOMEM;
    return c;
}

void ctl_close(struct ctl_client *c)
{
    if (!c)
        return;
    close(c->fd);
    free(c);
}

/* The frame header goes with the fd in one sendmsg; the body follows. */
static int send_with_fd(int fd, const uint8_t *buf, size_t len, int pass_fd, int64_t deadline)
{
    uint8_t hdr[4] = {(uint8_t)len, (uint8_t)(len >> 8), (uint8_t)(len >> 16),
                      (uint8_t)(len >> 24)};
    union {
        char b[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } ctl;
    memset(&ctl, 0, sizeof(ctl));
    struct iovec iov = {.iov_base = hdr, .iov_len = 4};
    struct msghdr mh = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b, .msg_controllen = sizeof(ctl.b)};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &pass_fd, sizeof(int));
    ssize_t n;
    do
        n = sendmsg(fd, &mh, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int left = (int)(deadline - xfer_now_ms());
        if (left <= 0 || poll(&p, 1, left) <= 0)
            return -XFER_ETIMEDOUT;
        n = sendmsg(fd, &mh, MSG_NOSIGNAL);
    }
    if (n <= 0)
        return -XFER_ECONN;
    int rc = xfer_io_write_all(fd, hdr + n, 4 - (size_t)n, deadline);
    return rc ? rc : xfer_io_write_all(fd, buf, len, deadline);
}

static int send_req(struct ctl_client *c, Xctl__Request *req, int pass_fd, int timeout_ms,
                    char *why, size_t wl)
{
    req->id = c->next_id++;
    size_t len = xctl__request__get_packed_size(req);
    if (len > XFER_FRAME_MAX) {
        snprintf(why, wl, "request too large (%zu bytes, max %u)", len, XFER_FRAME_MAX);
        return -XFER_EINVAL;
    }
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf) {
        snprintf(why, wl, "out of memory");
        return -XFER_ENOMEM;
    }
    xctl__request__pack(req, buf);
    int rc;
    if (pass_fd >= 0 && c->is_unix)
        rc = send_with_fd(c->fd, buf, len, pass_fd, xfer_now_ms() + timeout_ms);
    else if (pass_fd >= 0)
        rc = -XFER_EINVAL;
    else
        rc = xfer_frame_send(c->fd, buf, len, timeout_ms);
    free(buf);
    if (rc)
        snprintf(why, wl, "sending to xferd: %s", xfer_strerror(rc));
    return rc;
}

int ctl_send(struct ctl_client *c, Xctl__Request *req, int timeout_ms, char *why, size_t wl)
{
    return send_req(c, req, -1, timeout_ms, why, wl);
}

int ctl_recv(struct ctl_client *c, int timeout_ms, Xctl__Response **resp, char *why, size_t wl)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    int rc = xfer_frame_recv(c->fd, XFER_FRAME_MAX, timeout_ms, &buf, &len);
    if (rc) {
        snprintf(why, wl, "%s from xferd",
                 rc == -XFER_ETIMEDOUT ? "no answer in time" : xfer_strerror(rc));
        return rc;
    }
    *resp = xctl__response__unpack(NULL, len, buf);
    free(buf);
    if (!*resp) {
        snprintf(why, wl, "malformed response from xferd");
        return -XFER_EPROTO;
    }
    return 0;
}

int ctl_call(struct ctl_client *c, Xctl__Request *req, int pass_fd, int timeout_ms,
             Xctl__Response **resp, char *why, size_t wl)
{
    int64_t deadline = xfer_now_ms() + timeout_ms;
    int rc = send_req(c, req, pass_fd, timeout_ms, why, wl);
    if (rc == -XFER_ECONN) {
        /* xferd may have refused this connection with a reason (id 0) and
         * closed it before our request went out: that reason is the answer */
        char late[64];
        if (ctl_recv(c, 200, resp, late, sizeof(late)) == 0) {
            if ((*resp)->id == 0)
                return 0;
            xctl__response__free_unpacked(*resp, NULL);
            *resp = NULL;
        }
    }
    while (rc == 0) {
        int left = (int)(deadline - xfer_now_ms());
        rc = ctl_recv(c, left > 0 ? left : 1, resp, why, wl);
        if (rc == 0 && (*resp)->id != req->id && (*resp)->id != 0) {
            xctl__response__free_unpacked(*resp, NULL);
            continue; /* a late answer to an earlier, timed-out call */
        }
        break;
    }
    return rc;
}
