/* Test fixture for the registry unit tests: a real redis-server of their own
 * on a free port in a temp dir (killed in teardown, and by PR_SET_PDEATHSIG
 * if the test process dies), raw hiredis access, and deadline polling.
 * Header-only: included by tests/unit/test_registry_*.c. */
#ifndef XFER_TEST_REGISTRY_FIXTURE_H
#define XFER_TEST_REGISTRY_FIXTURE_H

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "xfer_registry.h"

struct test_redis {
    pid_t pid;
    int port;
    const char *const *extra; /* more redis-server arguments (NULL-terminated) */
    char dir[64];
    char url[128];
    char sock[128];
};

static inline uint64_t tr_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static inline void tr_nap_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static inline int tr_free_port(void)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    int port = -1;
    if (s >= 0 && !bind(s, (struct sockaddr *)&a, sizeof(a)) &&
        !getsockname(s, (struct sockaddr *)&a, &len))
        port = ntohs(a.sin_port);
    if (s >= 0)
        close(s);
    return port;
}

static inline redisContext *tr_raw(const struct test_redis *t)
{
    struct timeval tv = {2, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", t->port, tv);
    if (c && c->err) {
        redisFree(c);
        return NULL;
    }
    if (c)
        redisSetTimeout(c, tv);
    return c;
}

static inline bool tr_ping(const struct test_redis *t)
{
    redisContext *c = tr_raw(t);
    redisReply *r = c ? redisCommand(c, "PING") : NULL;
    bool ok = r && r->type == REDIS_REPLY_STATUS && !strcmp(r->str, "PONG");
    if (r)
        freeReplyObject(r);
    if (c)
        redisFree(c);
    return ok;
}

/* Starts redis-server on t->port (picked when 0); waits up to 5 s for PONG. */
static inline int tr_launch(struct test_redis *t)
{
    char port[16], logf[128];
    snprintf(port, sizeof(port), "%d", t->port);
    snprintf(logf, sizeof(logf), "%s/redis.log", t->dir);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int devnull = open("/dev/null", O_RDWR);
        if (devnull >= 0) {
            dup2(devnull, 0);
            dup2(devnull, 1);
        }
        const char *argv[48] = {
            "redis-server", "--port",           port,  "--bind",       "127.0.0.1", "--dir",
            t->dir,         "--save",           "",    "--appendonly", "no",        "--unixsocket",
            t->sock,        "--unixsocketperm", "700", "--logfile",    logf};
        int n = 17;
        for (int i = 0; t->extra && t->extra[i] && n < 47; i++)
            argv[n++] = t->extra[i];
        argv[n] = NULL;
        execvp("redis-server", (char *const *)argv);
        _exit(127);
    }
    t->pid = pid;
    uint64_t deadline = tr_now_ms() + 5000;
    while (tr_now_ms() < deadline) {
        if (tr_ping(t))
            return 0;
        if (waitpid(pid, NULL, WNOHANG) == pid) {
            t->pid = 0;
            return -1;
        }
        tr_nap_ms(20);
    }
    return -1;
}

static inline void tr_kill(struct test_redis *t, int sig)
{
    if (t->pid <= 0)
        return;
    kill(t->pid, sig);
    uint64_t deadline = tr_now_ms() + 5000;
    while (waitpid(t->pid, NULL, WNOHANG) == 0) {
        if (tr_now_ms() > deadline) {
            kill(t->pid, SIGKILL);
            waitpid(t->pid, NULL, 0);
            break;
        }
        tr_nap_ms(10);
    }
    t->pid = 0;
}

/* extra: more redis-server arguments for every (re)start, or NULL. */
static inline int test_redis_start_with(struct test_redis *t, const char *const *extra)
{
    memset(t, 0, sizeof(*t));
    t->extra = extra;
    snprintf(t->dir, sizeof(t->dir), "/tmp/xfer-test-redis.XXXXXX");
    if (!mkdtemp(t->dir))
        return -1;
    /* from a copy: gcc's -Wrestrict (SAN build) cannot tell that two
     * members of one struct do not overlap once it is reached through a
     * heap pointer */
    char dir[sizeof(t->dir)];
    memcpy(dir, t->dir, sizeof(dir));
    snprintf(t->sock, sizeof(t->sock), "%s/redis.sock", dir);
    for (int i = 0; i < 5; i++) {
        t->port = tr_free_port();
        if (t->port > 0 && tr_launch(t) == 0) {
            snprintf(t->url, sizeof(t->url), "redis://127.0.0.1:%d", t->port);
            return 0;
        }
    }
    return -1;
}

static inline int test_redis_start(struct test_redis *t)
{
    return test_redis_start_with(t, NULL);
}

/* Kills the server (SIGKILL: a crash) and starts an empty one on the same port. */
static inline int test_redis_restart(struct test_redis *t)
{
    tr_kill(t, SIGKILL);
    return tr_launch(t);
}

static inline void test_redis_stop(struct test_redis *t)
{
    tr_kill(t, SIGTERM);
    if (t->dir[0]) {
        char cmd[160];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", t->dir);
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", t->dir);
        t->dir[0] = '\0';
    }
}

/* Raw command on a fresh connection; the reply must be freed. */
static inline redisReply *tr_vcmd(const struct test_redis *t, const char *fmt, va_list ap)
{
    redisContext *c = tr_raw(t);
    if (!c)
        return NULL;
    redisReply *r = redisvCommand(c, fmt, ap);
    redisFree(c);
    return r;
}

static inline redisReply *tr_cmd(const struct test_redis *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = tr_vcmd(t, fmt, ap);
    va_end(ap);
    return r;
}

static inline long long tr_int(const struct test_redis *t, const char *fmt, ...)
{
    redisContext *c = tr_raw(t);
    if (!c)
        return -999;
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(c, fmt, ap);
    va_end(ap);
    long long v = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -998;
    if (r)
        freeReplyObject(r);
    redisFree(c);
    return v;
}

/* HGET as a malloc'ed string (NULL if missing). */
static inline char *tr_hget(const struct test_redis *t, const char *key, const char *field)
{
    redisReply *r = tr_cmd(t, "HGET %s %s", key, field);
    char *s = r && r->type == REDIS_REPLY_STRING ? strdup(r->str) : NULL;
    if (r)
        freeReplyObject(r);
    return s;
}

#ifdef TR_GROUP_REDIS
/* One redis-server R for every test of the file's group (cmocka group
 * setup and teardown), and a per-test setup that empties it. */
static struct test_redis R;

static inline int tr_group_setup(void **state)
{
    (void)state;
    return test_redis_start(&R);
}

static inline int tr_group_teardown(void **state)
{
    (void)state;
    test_redis_stop(&R);
    return 0;
}

static inline int tr_flush(void **state)
{
    (void)state;
    redisReply *r = tr_cmd(&R, "FLUSHALL");
    if (r)
        freeReplyObject(r);
    return r ? 0 : -1;
}
#endif

/* Polls cond(arg) until true or timeout; drives the registry r if given. */
static inline bool tr_wait(xfer_registry *r, bool (*cond)(void *), void *arg, int timeout_ms)
{
    uint64_t deadline = tr_now_ms() + (uint64_t)timeout_ms;
    while (!cond(arg)) {
        if (tr_now_ms() > deadline)
            return false;
        if (r)
            xfer_registry_poll(r, 20);
        else
            tr_nap_ms(20);
    }
    return true;
}

/* A plausible node / region for tests. */
static inline void tr_node(struct xfer_node_desc *n, const char *id)
{
    memset(n, 0, sizeof(*n));
    snprintf(n->peer.node_id, sizeof(n->peer.node_id), "%s", id);
    snprintf(n->peer.addr, sizeof(n->peer.addr), "10.0.0.1");
    n->peer.data_port = 7001;
    snprintf(n->peer.host_id, sizeof(n->peer.host_id), "boot-1234");
    n->peer.transports = XFER_TRANSPORT_TCP | XFER_TRANSPORT_IPC;
    snprintf(n->peer.nics, sizeof(n->peer.nics), "mlx5_0,mlx5_1");
    snprintf(n->host, sizeof(n->host), "host-%s", id);
    n->ctrl_port = 7000;
    snprintf(n->gpus, sizeof(n->gpus), "0:GPU-abc:0000:17:00.0");
    n->pid = 4242;
    snprintf(n->version, sizeof(n->version), "%s", XFER_VERSION_STRING);
}

static inline void tr_region(struct xfer_region_desc *d, const char *name, uint32_t id)
{
    memset(d, 0, sizeof(*d));
    snprintf(d->name, sizeof(d->name), "%s", name);
    d->id = id;
    d->gen = 3;
    d->kind = XFER_MEM_HOST;
    d->device = -1;
    d->addr = 0x7f0000001000ull;
    d->len = 1u << 20;
    d->access = XFER_ACCESS_RW;
    snprintf(d->ipc, sizeof(d->ipc), "memfd:%s", name);
    snprintf(d->rkeys, sizeof(d->rkeys), "mlx5_0=0x1234");
}

static inline xfer_registry *tr_registry(const char *url, int ttl_ms)
{
    struct xfer_registry_config cfg;
    xfer_registry_config_init(&cfg);
    cfg.url = url;
    cfg.ttl_ms = ttl_ms;
    cfg.timeout_ms = 1000;
    cfg.backoff_max_ms = 500;
    int err = 0;
    xfer_registry *r = xfer_registry_new(&cfg, &err);
    if (!r)
        fprintf(stderr, "xfer_registry_new(%s): %s\n", url, xfer_strerror(err));
    return r;
}

#endif
