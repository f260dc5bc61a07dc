/*
 * Misbehaving control clients for the control-server limit tests:
 *
 *   ctl_abuse silent HOST PORT N    N TCP connections that never send a byte
 *   ctl_abuse hold SOCKET N         N unix connections that never send
 *   ctl_abuse noread SOCKET SRC LEN N
 *                                   pipelines N ReadData{SRC, LEN} requests on
 *                                   one unix connection and never reads a reply
 *   ctl_abuse async SOCKET SRC DST LEN REPEAT N
 *                                   pipelines N async SubmitBatch requests of
 *                                   one copy SRC -> DST of LEN bytes run
 *                                   REPEAT times,
 *                                   reads the N replies and prints
 *                                   "accepted A refused R" and the first
 *                                   refusal's message, then exits (no hold)
 *   ctl_abuse busy SOCKET SRC DST LEN REPEAT DEPTH
 *                                   keeps DEPTH synchronous batches of one
 *                                   copy run REPEAT times (xferd holds its
 *                                   region lock across the repeats) in
 *                                   flight on one connection; prints
 *                                   "busy" after the first reply, and at stdin
 *                                   EOF "done K" (batches answered), then exits
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
#include <stdbool.h>
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

static int send_frame(int fd, const Xctl__Request *req)
{
    size_t l = xctl__request__get_packed_size(req);
    uint8_t *buf = malloc(l + 4);
    if (!buf)
        return -1;
    xctl__request__pack(req, buf + 4);
    for (int b = 0; b < 4; b++)
        buf[b] = (uint8_t)(l >> (8 * b));
    ssize_t n = send(fd, buf, l + 4, MSG_NOSIGNAL);
    free(buf);
    return n == (ssize_t)(l + 4) ? 0 : -1;
}

static int read_full(int fd, void *p, size_t len)
{
    for (size_t got = 0; got < len;) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        if (poll(&pf, 1, 30000) <= 0)
            return -1; /* 30 s without a reply: xferd is wedged */
        ssize_t n = read(fd, (uint8_t *)p + got, len - got);
        if (n <= 0)
            return -1;
        got += (size_t)n;
    }
    return 0;
}

/* Submits all n batches before reading any reply, so that the later ones
 * meet the earlier ones still queued or running (each copies items*len). */
struct copies {
    Xctl__Transfer t;
    Xctl__Transfer **tv;
    Xctl__SubmitBatch sb;
    Xctl__Request req;
};

/* A SubmitBatch request of `items` copies src -> dst of len bytes. */
static int copies_init(struct copies *c, char *src, char *dst, unsigned long long len, int items,
                       int repeat, bool async)
{
    xctl__transfer__init(&c->t);
    c->t.op = XCTL__OP__OP_AUTO;
    c->t.src = src;
    c->t.dst = dst;
    c->t.len = len;
    c->t.repeat = (uint32_t)repeat;
    c->tv = calloc((size_t)items, sizeof(*c->tv));
    if (!c->tv)
        return -1;
    for (int i = 0; i < items; i++)
        c->tv[i] = &c->t;
    xctl__submit_batch__init(&c->sb);
    c->sb.n_items = (size_t)items;
    c->sb.items = c->tv;
    c->sb.async = async;
    xctl__request__init(&c->req);
    c->req.body_case = XCTL__REQUEST__BODY_BATCH;
    c->req.batch = &c->sb;
    return 0;
}

/* Reads one reply: its status (0 = a batch answered), -1000 on failure. */
static int read_reply(int fd, char *msg, size_t msg_len)
{
    uint8_t hdr[4];
    if (read_full(fd, hdr, 4))
        return -1000;
    uint32_t l = (uint32_t)(hdr[0] | hdr[1] << 8 | hdr[2] << 16 | (uint32_t)hdr[3] << 24);
    uint8_t *buf = malloc(l ? l : 1);
    if (!buf || read_full(fd, buf, l)) {
        free(buf);
        return -1000;
    }
    Xctl__Response *r = xctl__response__unpack(NULL, l, buf);
    free(buf);
    if (!r)
        return -1000;
    int st = r->status;
    if (st == 0 && r->body_case != XCTL__RESPONSE__BODY_BATCH)
        st = -1000;
    snprintf(msg, msg_len, "%d %s", r->status, r->message ? r->message : "");
    xctl__response__free_unpacked(r, NULL);
    return st;
}

static int async_flood(const char *path, char *src, char *dst, unsigned long long len, int repeat,
                       int n)
{
    int fd = unix_connect(path);
    if (fd < 0)
        return die("connect");
    struct copies c;
    if (copies_init(&c, src, dst, len, 1, repeat, true))
        return die("calloc");
    Xctl__Request req = c.req;
    req.batch = &c.sb;
    for (int k = 0; k < n; k++) {
        req.id = (uint64_t)k + 1;
        if (send_frame(fd, &req))
            return die("send");
    }
    int accepted = 0, refused = 0;
    char first[512] = "", msg[512];
    for (int k = 0; k < n; k++) {
        int st = read_reply(fd, msg, sizeof(msg));
        if (st == -1000)
            return errno = EPROTO, die("reply");
        if (st == 0)
            accepted++;
        else if (refused++ == 0)
            snprintf(first, sizeof(first), "%s", msg);
    }
    printf("accepted %d refused %d\n%s\n", accepted, refused, first);
    free(c.tv);
    close(fd);
    return 0;
}

/* Keeps depth batches in flight until stdin reaches EOF. */
static int busy(const char *path, char *src, char *dst, unsigned long long len, int repeat,
                int depth)
{
    int fd = unix_connect(path);
    if (fd < 0)
        return die("connect");
    struct copies c;
    if (copies_init(&c, src, dst, len, 1, repeat, false))
        return die("calloc");
    uint64_t id = 0;
    int answered = 0, inflight = 0;
    bool stop = false;
    char msg[512];
    while (!stop || inflight > 0) {
        while (!stop && inflight < depth) {
            c.req.id = ++id;
            if (send_frame(fd, &c.req))
                return die("send");
            inflight++;
        }
        struct pollfd p[2] = {{.fd = fd, .events = POLLIN}, {.fd = 0, .events = POLLIN}};
        if (poll(p, stop ? 1 : 2, 30000) <= 0)
            return errno = ETIMEDOUT, die("no reply in 30 s");
        if (p[1].revents) {
            char ch;
            stop = read(0, &ch, 1) <= 0;
        }
        if (!p[0].revents)
            continue;
        int st = read_reply(fd, msg, sizeof(msg));
        if (st != 0) {
            fprintf(stderr, "ctl_abuse busy: batch failed: %s\n", msg);
            return 1;
        }
        inflight--;
        if (answered++ == 0) {
            printf("busy\n");
            fflush(stdout);
        }
    }
    printf("done %d\n", answered);
    free(c.tv);
    close(fd);
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
    if (argc == 8 && !strcmp(argv[1], "async"))
        return async_flood(argv[2], argv[3], argv[4], strtoull(argv[5], NULL, 0), atoi(argv[6]),
                           atoi(argv[7]));
    if (argc == 8 && !strcmp(argv[1], "busy"))
        return busy(argv[2], argv[3], argv[4], strtoull(argv[5], NULL, 0), atoi(argv[6]),
                    atoi(argv[7]));
    fprintf(stderr, "usage: ctl_abuse silent HOST PORT N | hold SOCKET N | "
                    "noread SOCKET SRC LEN N | async SOCKET SRC DST LEN ITEMS N | "
                    "busy SOCKET SRC DST LEN REPEAT DEPTH\n");
    return 2;
}
