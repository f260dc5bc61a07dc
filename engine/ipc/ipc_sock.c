/*
 * Unix sockets of the ipc transport: abstract names derived from node id and
 * incarnation (a restarted node gets a new name, so a stale peer descriptor
 * cannot reach the new process), messages with an optional SCM_RIGHTS fd,
 * and deadlines on every wait.
 */
#include "xfer_io.h"
#include "ipc.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

int ipc_sock_addr(const char *node_id, uint64_t incarnation, void *sa, size_t sa_size)
{
    struct sockaddr_un *sun = sa;
    if (sa_size < sizeof(*sun))
        return -XFER_EINVAL;
    memset(sun, 0, sizeof(*sun));
    sun->sun_family = AF_UNIX;
    /* Abstract namespace: sun_path[0] = 0, no file to clean up. */
    int n = snprintf(sun->sun_path + 1, sizeof(sun->sun_path) - 1, "xfer-ipc/%s/%016" PRIx64,
                     node_id, incarnation);
    if (n < 0 || (size_t)n >= sizeof(sun->sun_path) - 1)
        return -XFER_EINVAL;
    return (int)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

int ipc_sock_listen(const char *node_id, uint64_t incarnation, char *why, size_t why_len)
{
    struct sockaddr_un sun;
    int alen = ipc_sock_addr(node_id, incarnation, &sun, sizeof(sun));
    if (alen < 0) {
        snprintf(why, why_len, "node id too long for a unix socket name");
        return alen;
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        snprintf(why, why_len, "socket(AF_UNIX): %s", strerror(errno));
        return -XFER_EIO;
    }
    if (bind(fd, (struct sockaddr *)&sun, (socklen_t)alen) < 0 || listen(fd, 64) < 0) {
        snprintf(why, why_len, "bind/listen @%s: %s", sun.sun_path + 1, strerror(errno));
        int rc = errno == EADDRINUSE ? -XFER_EEXIST : -XFER_EIO;
        close(fd);
        return rc;
    }
    return fd;
}

int ipc_wait_readable(int fd, int timeout_ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    for (;;) {
        int n = poll(&p, 1, timeout_ms);
        if (n > 0)
            return (p.revents & (POLLIN | POLLHUP | POLLERR)) ? 0 : -XFER_ECONN;
        if (n == 0)
            return -XFER_ETIMEDOUT;
        if (errno != EINTR)
            return -XFER_ECONN;
    }
}

int ipc_sock_connect(const char *node_id, uint64_t incarnation, int timeout_ms, char *why,
                     size_t why_len)
{
    struct sockaddr_un sun;
    int alen = ipc_sock_addr(node_id, incarnation, &sun, sizeof(sun));
    if (alen < 0) {
        snprintf(why, why_len, "node id too long for a unix socket name");
        return alen;
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        snprintf(why, why_len, "socket(AF_UNIX): %s", strerror(errno));
        return -XFER_EIO;
    }
    int64_t deadline = xfer_now_ms() + timeout_ms;
    /* A full backlog gives EAGAIN on unix sockets: retry until the deadline. */
    while (connect(fd, (struct sockaddr *)&sun, (socklen_t)alen) < 0) {
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN && xfer_now_ms() < deadline) {
            struct timespec ts = {0, 2000000};
            nanosleep(&ts, NULL);
            continue;
        }
        snprintf(why, why_len,
                 "connect @%s: %s (is the peer on this host and in this network "
                 "namespace?)",
                 sun.sun_path + 1, strerror(errno));
        close(fd);
        return -XFER_ECONN;
    }
    return fd;
}

pid_t ipc_sock_peer_pid(int fd)
{
    struct ucred cred;
    socklen_t len = sizeof(cred);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0)
        return -1;
    return cred.pid;
}

/* Sends every byte of iov, with at most one fd attached to the first byte. */
static int send_all(int fd, struct iovec *iov, int iovcnt, int pass_fd, int64_t deadline)
{
    char cbuf[CMSG_SPACE(sizeof(int))];
    bool fd_pending = pass_fd >= 0;
    while (iovcnt > 0) {
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)iovcnt};
        if (fd_pending) {
            memset(cbuf, 0, sizeof(cbuf));
            mh.msg_control = cbuf;
            mh.msg_controllen = sizeof(cbuf);
            struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
            cm->cmsg_level = SOL_SOCKET;
            cm->cmsg_type = SCM_RIGHTS;
            cm->cmsg_len = CMSG_LEN(sizeof(int));
            memcpy(CMSG_DATA(cm), &pass_fd, sizeof(int));
        }
        ssize_t n = sendmsg(fd, &mh, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                int rc = xfer_io_wait(fd, POLLOUT, deadline);
                if (rc < 0)
                    return rc;
                continue;
            }
            return -XFER_ECONN;
        }
        fd_pending = false;
        while (iovcnt > 0 && (size_t)n >= iov->iov_len) {
            n -= (ssize_t)iov->iov_len;
            iov++;
            iovcnt--;
        }
        if (iovcnt > 0) {
            iov->iov_base = (char *)iov->iov_base + n;
            iov->iov_len -= (size_t)n;
        }
    }
    return 0;
}

int ipc_send(int fd, uint16_t type, uint32_t count, const void *payload, uint32_t bytes,
             int pass_fd, int timeout_ms)
{
    struct ipc_hdr h = {
        .magic = IPC_MAGIC, .type = type, .version = IPC_VERSION, .count = count, .bytes = bytes};
    struct iovec iov[2] = {{&h, sizeof(h)}, {(void *)payload, bytes}};
    return send_all(fd, iov, bytes ? 2 : 1, pass_fd, xfer_now_ms() + timeout_ms);
}

/* Reads exactly len bytes; keeps the first fd that arrives in *got_fd. */
static int recv_all(int fd, void *buf, size_t len, int *got_fd, int64_t deadline)
{
    char cbuf[CMSG_SPACE(sizeof(int) * 4)];
    size_t done = 0;
    while (done < len) {
        struct iovec iov = {(char *)buf + done, len - done};
        struct msghdr mh = {
            .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf)};
        ssize_t n = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                int rc = xfer_io_wait(fd, POLLIN, deadline);
                if (rc < 0)
                    return rc;
                continue;
            }
            return -XFER_ECONN;
        }
        for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
            if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
                continue;
            size_t nfd = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            for (size_t i = 0; i < nfd; i++) {
                int f;
                memcpy(&f, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
                if (*got_fd < 0)
                    *got_fd = f;
                else
                    close(f); /* more fds than the protocol allows */
            }
        }
        if (n == 0)
            return -XFER_ECONN;
        done += (size_t)n;
    }
    return 0;
}

int ipc_recv(int fd, struct ipc_hdr *h, void *buf, uint32_t max, int *got_fd, int timeout_ms)
{
    int64_t deadline = xfer_now_ms() + timeout_ms;
    int rfd = -1;
    int rc = recv_all(fd, h, sizeof(*h), &rfd, deadline);
    if (rc == 0 && (h->magic != IPC_MAGIC || h->version != IPC_VERSION || h->bytes > max))
        rc = -XFER_EPROTO;
    if (rc == 0 && h->bytes)
        rc = recv_all(fd, buf, h->bytes, &rfd, deadline);
    if (rc < 0 || !got_fd) {
        if (rfd >= 0)
            close(rfd);
        rfd = -1;
    }
    if (got_fd)
        *got_fd = rfd;
    return rc;
}

int ipc_recv_fixed(int fd, struct ipc_hdr *h, void *buf, uint32_t bytes, int timeout_ms)
{
    struct {
        struct ipc_hdr h;
        uint8_t b[64];
    } m;
    if (bytes > sizeof(m.b))
        return -XFER_EINVAL;
    int rfd = -1;
    int rc = recv_all(fd, &m, sizeof(m.h) + bytes, &rfd, xfer_now_ms() + timeout_ms);
    if (rfd >= 0)
        close(rfd);
    if (rc == 0 && (m.h.magic != IPC_MAGIC || m.h.version != IPC_VERSION || m.h.bytes != bytes))
        rc = -XFER_EPROTO;
    *h = m.h;
    memcpy(buf, m.b, bytes);
    return rc;
}

bool ipc_sock_hung_up(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

bool ipc_sock_said_bye(int fd)
{
    uint8_t buf[4096];
    ssize_t n = recv(fd, buf, sizeof(buf), MSG_PEEK | MSG_DONTWAIT); /* no fds: none installed */
    for (size_t at = 0; n > 0 && at + sizeof(struct ipc_hdr) <= (size_t)n;) {
        struct ipc_hdr h;
        memcpy(&h, buf + at, sizeof(h));
        if (h.magic != IPC_MAGIC || h.version != IPC_VERSION)
            return false;
        if (h.type == IPC_BYE)
            return h.bytes == 0;
        at += sizeof(h) + h.bytes; /* answers not read yet */
    }
    return false;
}
