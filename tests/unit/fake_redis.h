/* A tiny fake Redis server over a real loopback socket, for the registry's
 * bad-answer tests (a sentinel or cluster node that answers errors, wrong
 * types, empty slot maps, redirect loops). A thread accepts clients, parses
 * RESP command arrays and writes whatever the test's handler returns (raw
 * RESP text). Header-only: included by tests/unit/test_registry_*.c. */
#ifndef XFER_TEST_FAKE_REDIS_H
#define XFER_TEST_FAKE_REDIS_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define FAKE_MAX_CLIENTS 16
#define FAKE_BUF         8192
#define FAKE_MAX_ARGS    16

struct fake_redis;
/* Writes the raw RESP reply to argv[0..argc) into out (cap bytes). */
typedef void (*fake_handler)(struct fake_redis *f, int argc, char **argv, char *out, size_t cap);

struct fake_redis {
    int lfd, port;
    pthread_t thread;
    atomic_bool stop;
    atomic_int commands; /* commands answered so far */
    fake_handler handle;
    void *arg;
    int fds[FAKE_MAX_CLIENTS];
    char buf[FAKE_MAX_CLIENTS][FAKE_BUF];
    size_t used[FAKE_MAX_CLIENTS];
};

/* Parses one "*N\r\n$len\r\narg\r\n..." command at the start of b (n bytes):
 * bytes consumed (args NUL-terminated in place), 0 when incomplete, -1 bad. */
static inline long fake_parse(char *b, size_t n, int *argc, char **argv)
{
    char *p = b, *end = b + n, *nl;
    if (n < 1 || *p != '*' || !(nl = memchr(p, '\n', n)))
        return n && *p != '*' ? -1 : 0;
    int cnt = atoi(p + 1);
    if (cnt < 1 || cnt > FAKE_MAX_ARGS)
        return -1;
    p = nl + 1;
    for (int i = 0; i < cnt; i++) {
        if (p >= end || !(nl = memchr(p, '\n', (size_t)(end - p))))
            return 0;
        if (*p != '$')
            return -1;
        long len = atol(p + 1);
        p = nl + 1;
        if (len < 0 || end - p < len + 2)
            return 0;
        argv[i] = p;
        p[len] = '\0';
        p += len + 2;
    }
    *argc = cnt;
    return p - b;
}

static inline void fake_serve(struct fake_redis *f, int i)
{
    char out[FAKE_BUF];
    ssize_t got = read(f->fds[i], f->buf[i] + f->used[i], FAKE_BUF - 1 - f->used[i]);
    if (got <= 0) {
        close(f->fds[i]);
        f->fds[i] = -1;
        f->used[i] = 0;
        return;
    }
    f->used[i] += (size_t)got;
    for (;;) {
        int argc = 0;
        char *argv[FAKE_MAX_ARGS];
        long k = fake_parse(f->buf[i], f->used[i], &argc, argv);
        if (k <= 0) {
            if (k < 0 || f->used[i] >= FAKE_BUF - 1) { /* garbage: hang up */
                close(f->fds[i]);
                f->fds[i] = -1;
                f->used[i] = 0;
            }
            return;
        }
        out[0] = '\0';
        f->handle(f, argc, argv, out, sizeof(out));
        atomic_fetch_add(&f->commands, 1);
        size_t len = strlen(out);
        if (len && write(f->fds[i], out, len) != (ssize_t)len)
            fprintf(stderr, "fake redis: short write\n");
        memmove(f->buf[i], f->buf[i] + k, f->used[i] - (size_t)k);
        f->used[i] -= (size_t)k;
    }
}

static inline void *fake_thread(void *arg)
{
    struct fake_redis *f = arg;
    while (!atomic_load(&f->stop)) {
        struct pollfd p[FAKE_MAX_CLIENTS + 1] = {{.fd = f->lfd, .events = POLLIN}};
        for (int i = 0; i < FAKE_MAX_CLIENTS; i++)
            p[i + 1] = (struct pollfd){.fd = f->fds[i], .events = POLLIN};
        if (poll(p, FAKE_MAX_CLIENTS + 1, 50) <= 0)
            continue;
        if (p[0].revents & POLLIN) {
            int c = accept(f->lfd, NULL, NULL);
            int i = 0;
            while (c >= 0 && i < FAKE_MAX_CLIENTS && f->fds[i] >= 0)
                i++;
            if (c >= 0 && i < FAKE_MAX_CLIENTS)
                f->fds[i] = c;
            else if (c >= 0)
                close(c);
        }
        for (int i = 0; i < FAKE_MAX_CLIENTS; i++)
            if (f->fds[i] >= 0 && (p[i + 1].revents & (POLLIN | POLLHUP | POLLERR)))
                fake_serve(f, i);
    }
    return NULL;
}

/* Listens on a free loopback port and starts serving; 0 or -1. */
static inline int fake_redis_start(struct fake_redis *f, fake_handler h, void *arg)
{
    memset(f, 0, sizeof(*f));
    for (int i = 0; i < FAKE_MAX_CLIENTS; i++)
        f->fds[i] = -1;
    f->handle = h;
    f->arg = arg;
    f->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    if (f->lfd < 0 || bind(f->lfd, (struct sockaddr *)&a, sizeof(a)) || listen(f->lfd, 16) ||
        getsockname(f->lfd, (struct sockaddr *)&a, &len))
        return -1;
    f->port = ntohs(a.sin_port);
    return pthread_create(&f->thread, NULL, fake_thread, f) ? -1 : 0;
}

static inline void fake_redis_stop(struct fake_redis *f)
{
    atomic_store(&f->stop, true);
    pthread_join(f->thread, NULL);
    for (int i = 0; i < FAKE_MAX_CLIENTS; i++)
        if (f->fds[i] >= 0)
            close(f->fds[i]);
    close(f->lfd);
}

/* Reply builders. */
static inline void fake_bulk_array(char *out, size_t cap, int n, const char *const *v)
{
    size_t o = (size_t)snprintf(out, cap, "*%d\r\n", n);
    for (int i = 0; i < n && o < cap; i++)
        o += (size_t)snprintf(out + o, cap - o, "$%zu\r\n%s\r\n", strlen(v[i]), v[i]);
}

#endif
