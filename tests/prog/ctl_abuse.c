/*
 * Misbehaving control clients for the control-server limit tests:
 *
 *   ctl_abuse silent HOST PORT N    N TCP connections that never send a byte
 *   ctl_abuse hold SOCKET N         N unix connections that never send
 *   ctl_abuse noread SOCKET SRC LEN N
 *                                   pipelines N ReadData{SRC, LEN} requests on
 *                                   one unix connection and never reads a reply
 *
 * Each prints one line when its connections are open (or, for noread, when
 * it cannot send more: "closed after K" when xferd hung up, "blocked after
 * K" when xferd stopped reading), then holds everything open until its
 * stdin reaches EOF or it is killed. Exit 2 on usage or set-up errors.
 */
#include "proto/control.pb-c.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static int die(const char *what)
{
    fprintf(stderr, "ctl_abuse: %s: %s\n", what, strerror(errno));
    return 2;
}

static void hold_until_eof(void)
{
    char c;
    while (read(0, &c, 1) > 0)
        ;
}

static int unix_connect(const char *path)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa))) {
        close(fd);
        return -1;
    }
    return fd;
}

static void raise_fd_limit(int n)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < (rlim_t)n + 64) {
        rl.rlim_cur = rl.rlim_max < (rlim_t)n + 64 ? rl.rlim_max : (rlim_t)n + 64;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

static int silent(const char *host, int port, int n)
{
    raise_fd_limit(n);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1)
        return errno = EINVAL, die("address");
    for (int i = 0; i < n; i++) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)))
            return die("connect");
    }
    printf("open %d\n", n);
    fflush(stdout);
    hold_until_eof();
    return 0;
}

static int hold(const char *path, int n)
{
    raise_fd_limit(n);
    for (int i = 0; i < n; i++)
        if (unix_connect(path) < 0)
            return die("connect");
    printf("open %d\n", n);
    fflush(stdout);
    hold_until_eof();
    return 0;
}

static int noread(const char *path, const char *src, unsigned long long len, int n)
{
    int fd = unix_connect(path);
    if (fd < 0)
        return die("connect");
    Xctl__ReadData rd = XCTL__READ_DATA__INIT;
    rd.src = (char *)src;
    rd.len = len;
    Xctl__Request req = XCTL__REQUEST__INIT;
    req.body_case = XCTL__REQUEST__BODY_READ;
    req.read = &rd;
    int k = 0;
    const char *how = "sent";
    for (; k < n; k++) {
        req.id = (uint64_t)k + 1;
        uint8_t buf[512];
        size_t l = xctl__request__pack(&req, buf + 4);
        for (int b = 0; b < 4; b++)
            buf[b] = (uint8_t)(l >> (8 * b));
        /* Blocked for 2 s: xferd stopped reading us. */
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        if (poll(&p, 1, 2000) == 0) {
            how = "blocked after";
            break;
        }
        if (send(fd, buf, l + 4, MSG_NOSIGNAL) != (ssize_t)(l + 4)) {
            how = "closed after";
            break;
        }
    }
    printf("%s %d\n", how, k);
    fflush(stdout);
    hold_until_eof();
    return 0;
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    if (argc == 5 && !strcmp(argv[1], "silent"))
        return silent(argv[2], atoi(argv[3]), atoi(argv[4]));
    if (argc == 4 && !strcmp(argv[1], "hold"))
        return hold(argv[2], atoi(argv[3]));
    if (argc == 6 && !strcmp(argv[1], "noread"))
        return noread(argv[2], argv[3], strtoull(argv[4], NULL, 0), atoi(argv[5]));
    fprintf(stderr, "usage: ctl_abuse silent HOST PORT N | hold SOCKET N | "
                    "noread SOCKET SRC LEN N\n");
    return 2;
}
