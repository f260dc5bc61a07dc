/* The engine's clock and deadline-bounded socket I/O (CLOCK_MONOTONIC, so a
 * wall-clock step neither stretches nor cuts a wait), and length-framed
 * messages on top of it (proto/frame.h has the framing and its limit). */
#include "mono_clock.h"
#include "xfer_io.h"
#include "xfer_err.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

int64_t xfer_now_ms(void)
{
    return xfer_mono_ns() / 1000000;
}

int xfer_io_wait(int fd, short events, int64_t deadline_ms)
{
    for (;;) {
        int64_t left = deadline_ms - xfer_now_ms();
        if (left <= 0)
            return -XFER_ETIMEDOUT;
        struct pollfd p = {.fd = fd, .events = events};
        int n = poll(&p, 1, left > 1000000 ? 1000000 : (int)left);
        if (n > 0)
            return 0;
        if (n < 0 && errno != EINTR)
            return -XFER_ECONN;
    }
}

int xfer_io_write_all(int fd, const void *buf, size_t len, int64_t deadline_ms)
{
    const char *p = buf;
    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int rc = xfer_io_wait(fd, POLLOUT, deadline_ms);
            if (rc)
                return rc;
            continue;
        }
        return -XFER_ECONN;
    }
    return 0;
}

int xfer_io_read_all(int fd, void *buf, size_t len, int64_t deadline_ms)
{
    char *p = buf;
    while (len > 0) {
        ssize_t n = recv(fd, p, len, MSG_DONTWAIT);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n == 0)
            return -XFER_ECONN; /* orderly close mid-message */
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            int rc = xfer_io_wait(fd, POLLIN, deadline_ms);
            if (rc)
                return rc;
            continue;
        }
        return -XFER_ECONN;
    }
    return 0;
}

int xfer_frame_send(int fd, const void *buf, size_t len, int timeout_ms)
{
    if (len > XFER_FRAME_MAX)
        return -XFER_EINVAL;
    int64_t deadline = xfer_now_ms() + timeout_ms;
    uint8_t hdr[4] = {(uint8_t)len, (uint8_t)(len >> 8), (uint8_t)(len >> 16),
                      (uint8_t)(len >> 24)};
    int rc = xfer_io_write_all(fd, hdr, sizeof(hdr), deadline);
    if (rc == 0 && len > 0)
        rc = xfer_io_write_all(fd, buf, len, deadline);
    return rc;
}

int xfer_frame_recv(int fd, size_t max, int timeout_ms, uint8_t **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    if (max > XFER_FRAME_MAX)
        max = XFER_FRAME_MAX;
    int64_t deadline = xfer_now_ms() + timeout_ms;
    uint8_t hdr[4];
    int rc = xfer_io_read_all(fd, hdr, sizeof(hdr), deadline);
    if (rc)
        return rc;
    size_t n = (size_t)hdr[0] | (size_t)hdr[1] << 8 | (size_t)hdr[2] << 16 | (size_t)hdr[3] << 24;
    if (n > max)
        return -XFER_EPROTO;
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf)
        return -XFER_ENOMEM;
    rc = xfer_io_read_all(fd, buf, n, deadline);
    if (rc) {
        free(buf);
        return rc;
    }
    *out = buf;
    *len = n;
    return 0;
}

int xfer_listen_tcp(const char *addr, uint16_t port, int backlog, bool nonblock, int *fd,
                    uint16_t *bound, char *why, size_t why_len)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICHOST | AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    char ports[8];
    snprintf(ports, sizeof(ports), "%u", port);
    int rc = getaddrinfo(addr, ports, &hints, &res);
    if (rc != 0) {
        snprintf(why, why_len, "listen address '%s' is not an IP address: %s", addr,
                 gai_strerror(rc));
        return -XFER_EINVAL;
    }
    int s = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | (nonblock ? SOCK_NONBLOCK : 0), 0);
    int one = 1;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    if (s < 0 || setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ||
        bind(s, res->ai_addr, res->ai_addrlen) || listen(s, backlog) ||
        getsockname(s, (struct sockaddr *)&ss, &sl)) {
        snprintf(why, why_len, "cannot listen on %s:%u: %s", addr, port, strerror(errno));
        if (s >= 0)
            close(s);
        freeaddrinfo(res);
        return -XFER_EIO;
    }
    freeaddrinfo(res);
    *bound = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                            : ((struct sockaddr_in *)&ss)->sin_port);
    *fd = s;
    return 0;
}
