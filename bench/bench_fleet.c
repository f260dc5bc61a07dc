/* Fleet load on the registry: N simulated nodes (registry handles, each with
 * R regions, the normal heartbeat, reaping and an event subscriber) spread
 * over P worker processes, each driving its handles on one libevent loop.
 * Measures, against one Redis or a Redis Cluster:
 *   - Redis CPU and commands/s in steady state, and commands per heartbeat
 *     round (INFO of every server given with --info, summed);
 *   - event fan-out: a probe node publishes regions whose names carry the
 *     send time; every simulated node records when its region+ arrives;
 *   - uncached and cached lookup_region latency from one more handle;
 *   - (own Redis only) kill -9 and restart empty: time until all N nodes,
 *     and all their keys, are back.
 *   bench_fleet [-n N] [-p PROCS] [-r REGIONS] [--ttl-ms T] [--window-s S]
 *               [--url URL --info host:port[,host:port...]]
 * Without --url it starts its own redis-server (maxclients 20000). */
#include <event2/event.h>
#include <getopt.h>
#include <poll.h>
#include <hiredis/adapters/libevent.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>

#include "tests/unit/registry_fixture.h"

struct opts {
    int n, procs, regions, ttl_ms, window_s, probes;
    const char *url, *info;
};

static uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts); /* across processes of one machine */
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static xfer_registry *open_reg(const struct opts *o, int cache_max_age_ms)
{
    struct xfer_registry_config cfg;
    xfer_registry_config_init(&cfg);
    cfg.url = o->url;
    cfg.ttl_ms = o->ttl_ms;
    cfg.timeout_ms = 10000; /* a loaded 2-core VM: do not time out for nothing */
    cfg.cache_max_age_ms = cache_max_age_ms;
    cfg.start_offline = true;
    int err;
    xfer_registry *r = xfer_registry_new(&cfg, &err);
    if (!r)
        fprintf(stderr, "bench: %s: %s\n", o->url, xfer_registry_last_error(NULL));
    return r;
}

/* ---- worker process ---------------------------------------------------------- */

struct worker {
    const struct opts *o;
    struct event_base *base;
    xfer_registry **h;
    uint64_t *due_ms;
    int count, first;
    bool watch_started, ready_sent;
    int to_parent, from_parent;
    uint32_t *lat;
    size_t nlat, caplat;
};

static int attach(struct redisAsyncContext *ac, void *base)
{
    return redisLibeventAttach(ac, base) == REDIS_OK ? 0 : -XFER_EIO;
}

/* region+ of the probe node: "p<seq>-<send time us>" */
static void on_event(const struct xfer_registry_event *ev, void *arg)
{
    struct worker *w = arg;
    unsigned long long sent;
    if (ev->type != XFER_REG_EV_REGION_ADD || strcmp(ev->node, "probe") ||
        sscanf(ev->region, "p%*d-%llu", &sent) != 1)
        return;
    if (w->nlat == w->caplat) {
        size_t cap = w->caplat ? w->caplat * 2 : 4096;
        uint32_t *v = realloc(w->lat, cap * sizeof(*v));
        if (!v)
            return;
        w->lat = v;
        w->caplat = cap;
    }
    uint64_t now = now_us();
    w->lat[w->nlat++] = (uint32_t)(now > sent ? now - sent : 0);
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    struct worker *w = arg;
    uint64_t now = tr_now_ms();
    int watching = 0;
    for (int i = 0; i < w->count; i++) {
        if (now >= w->due_ms[i])
            w->due_ms[i] = now + (uint64_t)xfer_registry_tick(w->h[i]);
        watching += xfer_registry_watching(w->h[i]);
    }
    if (w->watch_started && !w->ready_sent && watching == w->count) {
        w->ready_sent = true;
        char c = 'R';
        if (write(w->to_parent, &c, 1) != 1)
            exit(3);
    }
}

static void on_parent(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    struct worker *w = arg;
    char c = 0;
    if (read(fd, &c, 1) != 1 || c == 'q') {
        event_base_loopbreak(w->base);
    } else if (c == 'w' && !w->watch_started) { /* everybody has published */
        w->watch_started = true;
        for (int i = 0; i < w->count; i++) {
            xfer_registry_on_event(w->h[i], on_event, w);
            xfer_registry_watch(w->h[i], attach, w->base);
        }
    }
}

static void publish_one(struct worker *w, int i)
{
    struct xfer_node_desc n;
    char id[32];
    snprintf(id, sizeof(id), "f%05d", w->first + i);
    tr_node(&n, id);
    struct xfer_region_desc *d = calloc((size_t)w->o->regions, sizeof(*d));
    for (int k = 0; d && k < w->o->regions; k++) {
        char name[32];
        snprintf(name, sizeof(name), "kv%02d", k);
        tr_region(&d[k], name, (uint32_t)k + 1);
    }
    if (xfer_registry_publish_node(w->h[i], &n) ||
        (d && xfer_registry_publish_regions(w->h[i], d, (size_t)w->o->regions)))
        fprintf(stderr, "worker: %s: %s\n", id, xfer_registry_last_error(w->h[i]));
    free(d);
}

static int worker_main(const struct opts *o, int first, int count, int to_parent, int from_parent)
{
    struct worker w = {
        .o = o, .first = first, .count = count, .to_parent = to_parent, .from_parent = from_parent};
    w.base = event_base_new();
    w.h = calloc((size_t)count, sizeof(*w.h));
    w.due_ms = calloc((size_t)count, sizeof(*w.due_ms));
    if (!w.base || !w.h || !w.due_ms)
        return 1;
    for (int i = 0; i < count; i++) {
        if (!(w.h[i] = open_reg(o, 1000)))
            return 1;
        publish_one(&w, i);
    }
    char c = 'P'; /* subscribers come after every node has published: see
                     docs/registry.md on the cold-start storm */
    if (write(to_parent, &c, 1) != 1)
        return 3;
    struct timeval tv = {0, 50000};
    struct event *tick = event_new(w.base, -1, EV_PERSIST, on_tick, &w);
    struct event *ctl = event_new(w.base, from_parent, EV_READ | EV_PERSIST, on_parent, &w);
    event_add(tick, &tv);
    event_add(ctl, NULL);
    event_base_dispatch(w.base);
    uint32_t nlat = (uint32_t)w.nlat; /* report the fan-out samples */
    if (write(to_parent, &nlat, sizeof(nlat)) != sizeof(nlat) ||
        (nlat &&
         write(to_parent, w.lat, nlat * sizeof(*w.lat)) != (ssize_t)(nlat * sizeof(*w.lat))))
        return 2;
    for (int i = 0; i < count; i++)
        xfer_registry_free(w.h[i]); /* keys expire by TTL: the next run flushes */
    event_free(tick);
    event_free(ctl);
    event_base_free(w.base);
    return 0;
}

/* ---- parent: measurements -------------------------------------------------------- */

struct sample {
    double cpu_s;
    long long cmds;
};

/* Sum of used_cpu_* and total_commands_processed over the --info servers. */
static struct sample sample_info(const char *targets)
{
    struct sample s = {0};
    char list[512];
    snprintf(list, sizeof(list), "%s", targets);
    for (char *save = NULL, *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        char *colon = strrchr(t, ':');
        if (!colon)
            continue;
        *colon = '\0';
        struct timeval tv = {5, 0};
        redisContext *c = redisConnectWithTimeout(t, atoi(colon + 1), tv);
        redisReply *r = c && !c->err ? redisCommand(c, "INFO") : NULL;
        const char *p;
        if (r && r->type == REDIS_REPLY_STRING) {
            if ((p = strstr(r->str, "used_cpu_sys:")))
                s.cpu_s += atof(p + 13);
            if ((p = strstr(r->str, "used_cpu_user:")))
                s.cpu_s += atof(p + 14);
            if ((p = strstr(r->str, "total_commands_processed:")))
                s.cmds += atoll(p + 25);
        }
        if (r)
            freeReplyObject(r);
        if (c)
            redisFree(c);
    }
    return s;
}

static void pct(uint32_t *v, size_t n, double *p50, double *p99)
{
    qsort(v, n, sizeof(*v), cmp_u32);
    *p50 = n ? v[n / 2] : 0;
    *p99 = n ? v[n * 99 / 100] : 0;
}

static void lookups(const struct opts *o, double res[4])
{
    xfer_registry *unc = open_reg(o, 0), *cac = open_reg(o, 3600000);
    enum { K = 2000 };
    uint32_t a[K], b[K];
    char node[32], name[32];
    for (int pass = 0; unc && cac && pass < 3; pass++) {
        srand(7); /* the same (node, region) sequence in every pass */
        for (int i = 0; i < K; i++) {
            snprintf(node, sizeof(node), "f%05d", rand() % o->n);
            snprintf(name, sizeof(name), "kv%02d", rand() % o->regions);
            struct xfer_region_desc d;
            xfer_registry *h = pass == 0 ? unc : cac;
            uint64_t t0 = now_us();
            int rc = xfer_registry_lookup_region(h, node, name, &d);
            uint32_t us = (uint32_t)(now_us() - t0);
            if (rc)
                fprintf(stderr, "lookup %s/%s: %s\n", node, name, xfer_registry_last_error(h));
            if (pass == 0)
                a[i] = us;
            else if (pass == 2) /* pass 1 filled the cache */
                b[i] = us;
        }
    }
    pct(a, K, &res[0], &res[1]);
    pct(b, K, &res[2], &res[3]);
    xfer_registry_free(unc);
    xfer_registry_free(cac);
}

static long long nonneg(long long v)
{
    return v < 0 ? 0 : v;
}

/* Own Redis only: kill -9, restart empty, time until every node and then
 * every key is back. */
static void restart(struct test_redis *t, const struct opts *o, double *nodes_s, double *keys_s)
{
    long long want_keys = (long long)o->n * (2 + o->regions);
    uint64_t t0 = tr_now_ms();
    *nodes_s = *keys_s = -1;
    if (test_redis_restart(t))
        return;
    while (tr_now_ms() - t0 < 120000 && *keys_s < 0) {
        long long nodes = nonneg(tr_int(t, "ZCARD %s", "xfer:nodes"));
        long long keys = nonneg(tr_int(t, "DBSIZE"));
        if (*nodes_s < 0 && nodes >= o->n)
            *nodes_s = (double)(tr_now_ms() - t0) / 1e3;
        if (keys >= want_keys) {
            *keys_s = (double)(tr_now_ms() - t0) / 1e3;
            if (*nodes_s < 0) /* every node's MULTI, with its ZADD, came first */
                *nodes_s = *keys_s;
        }
        tr_nap_ms(20);
        if (*keys_s < 0 && tr_now_ms() - t0 >= 120000)
            fprintf(stderr, "restart: after 120 s %lld nodes, %lld of %lld keys\n", nodes, keys,
                    want_keys);
    }
}

/* One byte `want` from each worker, within 600 s of t0. */
static int wait_workers(int up[][2], int procs, char want, uint64_t t0)
{
    for (int p = 0; p < procs; p++) {
        struct pollfd pf = {.fd = up[p][0], .events = POLLIN};
        char c = 0;
        int left = 600000 - (int)(tr_now_ms() - t0); /* every wait has a bound */
        if (left <= 0 || poll(&pf, 1, left) != 1 || read(up[p][0], &c, 1) != 1 || c != want) {
            fprintf(stderr, "bench: worker %d: no '%c' (died or > 600 s)\n", p, want);
            return -1; /* the workers die with us (PR_SET_PDEATHSIG) */
        }
    }
    return 0;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: bench_fleet [-n N] [-p PROCS] [-r REGIONS] [--ttl-ms T] [--window-s S]\n"
            "                   [--url URL --info host:port[,host:port...]]\n");
    exit(2);
}

static void parse(int argc, char **argv, struct opts *o)
{
    *o = (struct opts){
        .n = 100, .procs = 2, .regions = 64, .ttl_ms = 10000, .window_s = 10, .probes = 20};
    static const struct option lo[] = {{"ttl-ms", 1, 0, 't'},
                                       {"window-s", 1, 0, 'w'},
                                       {"url", 1, 0, 'u'},
                                       {"info", 1, 0, 'i'},
                                       {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "n:p:r:", lo, NULL)) != -1) {
        switch (c) {
        case 'n':
            o->n = atoi(optarg);
            break;
        case 'p':
            o->procs = atoi(optarg);
            break;
        case 'r':
            o->regions = atoi(optarg);
            break;
        case 't':
            o->ttl_ms = atoi(optarg);
            break;
        case 'w':
            o->window_s = atoi(optarg);
            break;
        case 'u':
            o->url = optarg;
            break;
        case 'i':
            o->info = optarg;
            break;
        default:
            usage();
        }
    }
    if (o->n < 1 || o->procs < 1 || o->procs > o->n || o->regions < 1 || o->regions > 100 ||
        (o->url && !o->info))
        usage();
}

int main(int argc, char **argv)
{
    struct opts o;
    parse(argc, argv, &o);
    xfer_log_set_level(XFER_LOG_ERROR);
    struct rlimit rl;
    if (!getrlimit(RLIMIT_NOFILE, &rl)) { /* 4 connections per handle in cluster mode */
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    static const char *const extra[] = {"--maxclients", "20000", NULL};
    struct test_redis t = {0};
    char info[64];
    if (!o.url) {
        if (test_redis_start_with(&t, extra)) {
            fprintf(stderr, "bench: cannot start redis-server\n");
            return 1;
        }
        o.url = t.url;
        snprintf(info, sizeof(info), "127.0.0.1:%d", t.port);
        o.info = info;
    }
    int up[64][2], down[64][2];
    pid_t pids[64];
    if (o.procs > 64)
        o.procs = 64;
    uint64_t t0 = tr_now_ms();
    for (int p = 0; p < o.procs; p++) {
        int first = o.n * p / o.procs, last = o.n * (p + 1) / o.procs;
        if (pipe(up[p]) || pipe(down[p]) || (pids[p] = fork()) < 0)
            return 1;
        if (pids[p] == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            close(up[p][0]);
            close(down[p][1]);
            _exit(worker_main(&o, first, last - first, up[p][1], down[p][0]));
        }
        close(up[p][1]);
        close(down[p][0]);
    }
    if (wait_workers(up, o.procs, 'P', t0) != 0)
        return 1;
    double start_s = (double)(tr_now_ms() - t0) / 1e3;
    for (int p = 0; p < o.procs; p++)
        if (write(down[p][1], "w", 1) != 1)
            return 1;
    if (wait_workers(up, o.procs, 'R', t0) != 0) /* and every one watching */
        return 1;
    tr_nap_ms(1000);
    int hb_ms = o.ttl_ms / 3;
    struct sample s0 = sample_info(o.info);
    uint64_t w0 = tr_now_ms();
    tr_nap_ms(o.window_s * 1000);
    struct sample s1 = sample_info(o.info);
    double win = (double)(tr_now_ms() - w0) / 1e3;
    double ops = (double)(s1.cmds - s0.cmds) / win, cpu = (s1.cpu_s - s0.cpu_s) / win * 100;
    double per_round = ops * hb_ms / 1e3;

    /* Fan-out: the probe publishes regions named after their send time. */
    xfer_registry *probe = open_reg(&o, 1000);
    struct xfer_node_desc pn;
    tr_node(&pn, "probe");
    if (!probe || xfer_registry_publish_node(probe, &pn))
        return 1;
    tr_nap_ms(500);
    for (int k = 0; k < o.probes; k++) {
        struct xfer_region_desc d;
        char name[48];
        snprintf(name, sizeof(name), "p%d-%llu", k, (unsigned long long)now_us());
        tr_region(&d, name, (uint32_t)k + 1);
        xfer_registry_publish_regions(probe, &d, 1);
        tr_nap_ms(200);
    }
    tr_nap_ms(2000);
    double lk[4];
    lookups(&o, lk);
    double back_nodes = -1, back_keys = -1;
    if (t.pid)
        restart(&t, &o, &back_nodes, &back_keys);

    size_t nlat = 0, cap = (size_t)o.n * (size_t)o.probes + 1;
    uint32_t *lat = calloc(cap, sizeof(*lat));
    for (int p = 0; p < o.procs; p++) {
        char q = 'q';
        uint32_t k = 0;
        if (write(down[p][1], &q, 1) != 1 || read(up[p][0], &k, sizeof(k)) != sizeof(k))
            continue;
        for (uint32_t i = 0; i < k; i++) {
            uint32_t v;
            if (read(up[p][0], &v, sizeof(v)) != sizeof(v))
                break;
            if (lat && nlat < cap)
                lat[nlat++] = v;
        }
        waitpid(pids[p], NULL, 0);
    }
    double f50, f99;
    pct(lat, nlat, &f50, &f99);
    char back[64] = "n/a";
    if (t.pid)
        snprintf(back, sizeof(back), "%.2f / %.2f s", back_nodes, back_keys);
    printf("| %s | %d | %d | %.1f s | %.0f | %.0f | %.1f %% | %.2f / %.2f ms (%zu of %d) | "
           "%.0f / %.0f us | %.1f / %.1f us | %s |\n",
           t.pid ? "one Redis" : "cluster", o.n, o.procs, start_s, ops, per_round, cpu, f50 / 1e3,
           f99 / 1e3, nlat, o.n * o.probes, lk[0], lk[1], lk[2], lk[3], back);
    fflush(stdout);
    free(lat);
    xfer_registry_unpublish_node(probe);
    xfer_registry_free(probe);
    if (t.pid)
        test_redis_stop(&t);
    return 0;
}
