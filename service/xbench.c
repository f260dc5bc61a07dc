/*
 * Library-level benchmark with the knobs users compare transfer engines on,
 * shared by bench/xfer_bench (its main) and `xferctl bench` (service/xbench.h;
 * in libxfer.a, not libxfer.so; bench/ is no library layer, so it lives in
 * service/, the layer of xferctl).
 * A target engine runs in a forked child process (so the two sides share no
 * locks or caches beyond what the transport does); the parent is the
 * initiator and keeps `depth` batches of `batch` items in flight for
 * `seconds`. Reports GB/s (1e9 bytes/s), items/s and the latency of whole
 * batches (submit -> wait returns): p50/p99/p99.9.
 *
 *   xfer_bench [--op write|read] [--size BYTES] [--batch N] [--depth N]
 *              [--sockets N] [--threads N] [--transport tcp|ipc]
 *              [--chunk BYTES] [--seconds S] [--warmup S] [--count N]
 *              [--slots N] [--gap BYTES] [--callers N] [--verify] [--fresh]
 *              [--warm-scratch] [--json]
 *
 * --fresh measures the first pass over freshly allocated regions: neither
 * side touches its memory before, and the run is one pass (each of the
 * depth x batch slots once; --size 1M --batch 16 --depth 64 = 1 GiB).
 * Its warm-up goes over a separate scratch region pair (--warm-scratch, one
 * batch large), so the pass starts on a warmed connection (grown socket
 * buffers, threads spread by the scheduler) like a run after a memset, and
 * still touches none of its own memory before: without it, the pass that
 * started right after setup measured 0.56-1.13 of a touched one on the
 * 32-core host (2026-11-28). Compare with the same shape plus --count
 * depth --warm-scratch over touched memory.
 *
 * --slots N makes the items reuse N item-sized slots of both regions (as
 * `ucx_perftest` puts one buffer over and over: a working set that stays in
 * the caches); by default every item in flight has its own slot.
 *
 * --gap BYTES leaves that many bytes between consecutive slots on both
 * sides. Items back to back (the default) go over tcp as runs, several
 * items a frame (docs/perf.md, "Runs of small items"); with a gap every item
 * is its own frame, which measures the engine's per-item cost.
 *
 * --count stops after N batches (or --seconds, whichever comes first): with
 * two counts under `valgrind --tool=callgrind`, the difference of the
 * instruction totals divided by the difference of the counts is the cost
 * of one batch, repeatable on a noisy machine (bench/callgrind.sh).
 *
 * --callers N runs N application threads on the initiator's one engine,
 * each calling the one-call function (xfer_write or xfer_read, blocking)
 * on a slot of its own in a loop: what the request threads of a server that
 * share an engine do. Latency is per call, ops/s the sum over the callers;
 * --count is per caller. Not with --batch or --depth above 1 or --fresh.
 *
 * --verify writes a pattern to the peer and reads it back (both ops over the
 * transport under test) before and after the timed run; a mismatch exits 1.
 * Exit: 0 ok, 1 transfer error or data mismatch, 2 bad arguments.
 */
#include "xbench.h"
#include "bench_util.h"
#include "xfer.h"

#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define REGION_MAX (1ull << 30)

static const char *prog = "xfer_bench"; /* prefix of messages */

struct opts {
    enum xfer_op op;
    uint64_t size;
    int batch, depth, sockets, threads, callers;
    unsigned transport;
    uint64_t chunk;
    double seconds, warmup;
    uint64_t count, slots, gap;
    bool verify, json, fresh, warm_scratch;
};

static uint64_t region_bytes(const struct opts *o)
{
    uint64_t n = o->slots ? o->slots : (uint64_t)o->batch * (uint64_t)o->depth;
    if (!o->slots && (uint64_t)o->callers > n)
        n = (uint64_t)o->callers;
    uint64_t stride = o->size + o->gap, want = stride * n;
    if (want / stride != n || want > REGION_MAX)
        want = REGION_MAX;
    if (want < o->size)
        want = o->size; /* one item always fits */
    return want < (1u << 16) ? (1u << 16) : want;
}

static xfer_engine *engine(const char *name, const struct opts *o)
{
    struct xfer_engine_config cfg;
    xfer_engine_config_init(&cfg);
    cfg.node_id = name;
    cfg.transports = o->transport;
    cfg.sockets_per_peer = o->sockets;
    cfg.progress_threads = o->threads;
    if (o->chunk)
        cfg.chunk_bytes = o->chunk;
    int rc;
    xfer_engine *e = xfer_engine_new(&cfg, &rc);
    if (!e)
        fprintf(stderr, "%s: engine %s: %s\n", prog, name, xfer_strerror(rc));
    return e;
}

struct hello {
    struct xfer_peer_desc peer;
    struct xfer_region_desc region, scratch; /* scratch: --warm-scratch only */
    int ok;
};

/* The scratch pair of --warm-scratch: one batch of items. */
static uint64_t scratch_bytes(const struct opts *o)
{
    uint64_t want = o->size * (uint64_t)o->batch, cap = 64u << 20;
    if (want > cap)
        want = o->size > cap ? o->size : cap;
    return want < (1u << 16) ? (1u << 16) : want;
}

/* Child: serves one region until the parent closes its end of `done`. */
static int run_target(const struct opts *o, int out_fd, int done_fd)
{
    struct hello h = {0};
    xfer_engine *e = engine("bench-target", o);
    xfer_region *r = NULL, *w = NULL;
    if (e && xfer_region_alloc(e, "bench", region_bytes(o), XFER_ACCESS_RW, &r) == 0 &&
        (!o->warm_scratch ||
         xfer_region_alloc(e, "scratch", scratch_bytes(o), XFER_ACCESS_RW, &w) == 0)) {
        if (!o->fresh)
            memset(xfer_region_ptr(r), 0x5a, xfer_region_len(r));
        xfer_engine_describe(e, &h.peer);
        xfer_region_describe(r, &h.region);
        if (w)
            xfer_region_describe(w, &h.scratch);
        h.ok = 1;
    }
    if (write(out_fd, &h, sizeof(h)) != (ssize_t)sizeof(h))
        h.ok = 0;
    char c;
    while (h.ok && read(done_fd, &c, 1) < 0 && errno == EINTR)
        ;
    xfer_engine_free(e);
    return h.ok ? 0 : 1;
}

/* Item k of batch slot d: offsets wrap around the region. */
static void fill(xfer_batch *b, const struct opts *o, enum xfer_op op, xfer_region *l, xfer_peer *p,
                 const struct xfer_region_desc *rd, int d)
{
    uint64_t stride = o->size + o->gap, slots = rd->len / stride;
    slots = slots ? slots : 1; /* one item always fits */
    if (o->slots && o->slots < slots)
        slots = o->slots;
    xfer_batch_reset(b);
    for (int k = 0; k < o->batch; k++) {
        uint64_t off = ((uint64_t)d * (uint64_t)o->batch + (uint64_t)k) % slots * stride;
        struct xfer_item it = {op, l, off, p, rd->id, rd->gen, off, o->size};
        xfer_batch_add(b, &it);
    }
}

static int report_error(xfer_batch *b, int rc)
{
    fprintf(stderr, "%s: %s: %s\n", prog, xfer_strerror(rc), xfer_batch_item_error(b, 0));
    return 1;
}

/* Round trip of the whole region: pattern out, zeros in, pattern back. */
static int verify(xfer_engine *e, xfer_region *l, xfer_peer *p, const struct xfer_region_desc *rd,
                  uint8_t seed)
{
    uint8_t *m = xfer_region_ptr(l);
    uint64_t n = rd->len < (16u << 20) ? rd->len : (16u << 20);
    for (uint64_t i = 0; i < n; i++)
        m[i] = (uint8_t)(seed + i * 131 + (i >> 12));
    int rc = xfer_write(e, l, 0, p, rd->id, rd->gen, 0, n, 60000);
    if (rc == 0) {
        memset(m, 0, n);
        rc = xfer_read(e, l, 0, p, rd->id, rd->gen, 0, n, 60000);
    }
    if (rc < 0) {
        fprintf(stderr, "%s: verify: %s: %s\n", prog, xfer_strerror(rc), xfer_engine_last_error(e));
        return 1;
    }
    for (uint64_t i = 0; i < n; i++)
        if (m[i] != (uint8_t)(seed + i * 131 + (i >> 12))) {
            fprintf(stderr, "%s: verify: byte %llu differs after WRITE+READ\n", prog,
                    (unsigned long long)i);
            return 1;
        }
    return 0;
}

struct result {
    double secs;
    uint64_t batches, items;
    struct bench_lat lat;
};

/* One --callers thread: the one-call function on its own slot until
 * `seconds` after the common start t0 (or --count calls). */
struct caller {
    const struct opts *o;
    xfer_engine *e;
    xfer_region *l;
    xfer_peer *p;
    const struct xfer_region_desc *rd;
    uint64_t off, calls;
    double t0, seconds;
    struct bench_lat lat;
    int rc;
};

static void *caller_main(void *arg)
{
    struct caller *c = arg;
    const struct opts *o = c->o;
    for (double t = bench_now(); t - c->t0 < c->seconds && (!o->count || c->calls < o->count);) {
        int rc = o->op == XFER_OP_WRITE ? xfer_write(c->e, c->l, c->off, c->p, c->rd->id,
                                                     c->rd->gen, c->off, o->size, 60000)
                                        : xfer_read(c->e, c->l, c->off, c->p, c->rd->id, c->rd->gen,
                                                    c->off, o->size, 60000);
        double done = bench_now();
        if (rc < 0) {
            c->rc = rc;
            break;
        }
        bench_lat_add(&c->lat, done - t);
        c->calls++;
        t = done;
    }
    return NULL;
}

/* --callers: the threads' calls and latencies summed into res. */
static int run_callers(const struct opts *o, xfer_engine *e, xfer_region *l, xfer_peer *p,
                       const struct xfer_region_desc *rd, double seconds, struct result *res)
{
    struct caller *c = calloc((size_t)o->callers, sizeof(*c));
    pthread_t *th = calloc((size_t)o->callers, sizeof(*th));
    uint64_t stride = o->size + o->gap, slots = rd->len / stride;
    int started = 0;
    double t0 = bench_now();
    for (; c && th && started < o->callers; started++) {
        c[started] =
            (struct caller){.o = o, .e = e, .l = l, .p = p, .rd = rd, .t0 = t0, .seconds = seconds};
        c[started].off = slots ? (uint64_t)started % slots * stride : 0;
        if (pthread_create(&th[started], NULL, caller_main, &c[started]) != 0)
            break;
    }
    int err = !c || !th || started < o->callers;
    if (err)
        fprintf(stderr, "%s: could start only %d of %d caller threads\n", prog, started,
                o->callers);
    for (int k = 0; k < started; k++) {
        pthread_join(th[k], NULL);
        if (c[k].rc < 0 && !err) {
            fprintf(stderr, "%s: caller %d: %s\n", prog, k, xfer_strerror(c[k].rc));
            err = 1;
        }
        res->batches += c[k].calls;
        res->items += c[k].calls;
        for (size_t i = 0; i < c[k].lat.n; i++)
            bench_lat_add(&res->lat, c[k].lat.v[i]);
        free(c[k].lat.v);
    }
    res->secs = bench_now() - t0;
    free(c);
    free(th);
    return err;
}

/* depth batches in flight, resubmitted as each completes, for `seconds`. */
static int run(const struct opts *o, xfer_engine *e, xfer_region *l, xfer_peer *p,
               const struct xfer_region_desc *rd, double seconds, struct result *res)
{
    if (o->callers)
        return run_callers(o, e, l, p, rd, seconds, res);
    xfer_batch **b = calloc((size_t)o->depth, sizeof(*b));
    double *t_sub = calloc((size_t)o->depth, sizeof(*t_sub));
    int err = 0;
    if (!b || !t_sub)
        return 1;
    double t0 = bench_now(), t = t0;
    for (int d = 0; d < o->depth; d++) {
        b[d] = xfer_batch_new(e, NULL);
        fill(b[d], o, o->op, l, p, rd, d);
        t_sub[d] = bench_now();
        xfer_batch_submit(b[d], 60000);
    }
    for (int d = 0;; d = (d + 1) % o->depth) {
        int rc = xfer_batch_wait(b[d], -1);
        t = bench_now();
        if (rc < 0) {
            err = report_error(b[d], rc);
            break;
        }
        bench_lat_add(&res->lat, t - t_sub[d]);
        res->batches++;
        res->items += (uint64_t)o->batch;
        if (t - t0 >= seconds || (o->count && res->batches >= o->count))
            break;
        t_sub[d] = bench_now();
        xfer_batch_submit(b[d], 60000);
    }
    res->secs = t - t0;
    /* Let the batches still in flight finish (not timed): cancelling them
     * would cut WRITE frames mid-payload, which the target logs as a lost
     * connection when the engine closes. */
    for (int d = 0; d < o->depth; d++) {
        if (!err)
            xfer_batch_wait(b[d], 60000);
        xfer_batch_free(b[d]);
    }
    free(b);
    free(t_sub);
    return err;
}

static void print(const struct opts *o, const struct result *r)
{
    double gbps = (double)r->items * (double)o->size / r->secs / 1e9;
    double ops = (double)r->items / r->secs;
    double p50 = bench_lat_pct(&r->lat, 50), p99 = bench_lat_pct(&r->lat, 99),
           p999 = bench_lat_pct(&r->lat, 99.9);
    const char *op = o->op == XFER_OP_WRITE ? "write" : "read";
    const char *tr = o->transport == XFER_TRANSPORT_IPC ? "ipc" : "tcp";
    if (o->json) {
        printf("{\"op\":\"%s\",\"transport\":\"%s\",\"size\":%llu,\"batch\":%d,\"depth\":%d,"
               "\"sockets\":%d,\"threads\":%d,\"callers\":%d,\"gap\":%llu,\"seconds\":%.3f,"
               "\"batches\":%llu,"
               "\"gbps\":%.6g,\"ops\":%.1f,\"lat_us\":{\"p50\":%.2f,\"p99\":%.2f,"
               "\"p999\":%.2f},\"verified\":%s}\n",
               op, tr, (unsigned long long)o->size, o->batch, o->depth, o->sockets, o->threads,
               o->callers, (unsigned long long)o->gap, r->secs, (unsigned long long)r->batches,
               gbps, ops, p50 * 1e6, p99 * 1e6, p999 * 1e6, o->verify ? "true" : "false");
        return;
    }
    if (o->callers) {
        printf("%s %s size=%llu callers=%d sockets=%d threads=%d: %.3f GB/s, %.0f ops/s, "
               "call latency p50 %.1f us p99 %.1f us p99.9 %.1f us (%llu calls)%s\n",
               tr, op, (unsigned long long)o->size, o->callers, o->sockets, o->threads, gbps, ops,
               p50 * 1e6, p99 * 1e6, p999 * 1e6, (unsigned long long)r->batches,
               o->verify ? ", data verified" : "");
        return;
    }
    printf("%s %s size=%llu batch=%d depth=%d sockets=%d threads=%d: %.3f GB/s, %.0f ops/s, "
           "batch latency p50 %.1f us p99 %.1f us p99.9 %.1f us (%llu batches)%s\n",
           tr, op, (unsigned long long)o->size, o->batch, o->depth, o->sockets, o->threads, gbps,
           ops, p50 * 1e6, p99 * 1e6, p999 * 1e6, (unsigned long long)r->batches,
           o->verify ? ", data verified" : "");
}

/* The warm-up: over the measured regions, or over the scratch pair. */
static int warm_up(const struct opts *o, xfer_engine *e, xfer_region *l, xfer_peer *p,
                   const struct hello *h, struct result *warm)
{
    if (o->warmup <= 0)
        return 0;
    if (!o->warm_scratch)
        return run(o, e, l, p, &h->region, o->warmup, warm);
    xfer_region *w = NULL;
    if (xfer_region_alloc(e, "scratch", h->scratch.len, XFER_ACCESS_RW, &w) < 0 ||
        xfer_peer_region_add(p, &h->scratch) < 0) {
        fprintf(stderr, "%s: scratch: %s\n", prog, xfer_engine_last_error(e));
        return 1;
    }
    return run(o, e, w, p, &h->scratch, o->warmup, warm);
}

static int initiator(const struct opts *o, const struct hello *h)
{
    xfer_engine *e = engine("bench-init", o);
    xfer_region *l = NULL;
    xfer_peer *p = NULL;
    struct result warm = {0}, res = {0};
    int rc = 1;
    if (!e)
        return 1;
    if (xfer_region_alloc(e, "local", h->region.len, XFER_ACCESS_RW, &l) < 0 ||
        xfer_peer_add(e, &h->peer, &p) < 0 || xfer_peer_region_add(p, &h->region) < 0) {
        fprintf(stderr, "%s: setup: %s\n", prog, xfer_engine_last_error(e));
        goto out;
    }
    if (o->verify && verify(e, l, p, &h->region, 7))
        goto out;
    if (!o->fresh)
        memset(xfer_region_ptr(l), 0xa5, xfer_region_len(l));
    if (warm_up(o, e, l, p, h, &warm))
        goto out;
    if (run(o, e, l, p, &h->region, o->seconds, &res))
        goto out;
    if (o->verify && verify(e, l, p, &h->region, 11))
        goto out;
    if (res.items == 0) {
        fprintf(stderr, "%s: nothing completed\n", prog);
        goto out;
    }
    print(o, &res);
    rc = 0;
out:
    free(warm.lat.v);
    free(res.lat.v);
    xfer_engine_free(e);
    return rc;
}

static int usage(void)
{
    fprintf(stderr,
            "usage: %s [--op write|read] [--size BYTES] [--batch N] [--depth N]\n"
            "  [--sockets N] [--threads N] [--transport tcp|ipc] [--chunk BYTES]\n"
            "  [--seconds S] [--warmup S] [--count N] [--slots N] [--gap BYTES]\n"
            "  [--callers N] [--verify] [--fresh] [--warm-scratch] [--json]\n",
            prog);
    return 2;
}

static int parse(int argc, char **argv, struct opts *o)
{
    static const struct option lo[] = {{"op", 1, 0, 'o'},
                                       {"size", 1, 0, 's'},
                                       {"batch", 1, 0, 'b'},
                                       {"depth", 1, 0, 'd'},
                                       {"sockets", 1, 0, 'k'},
                                       {"threads", 1, 0, 'n'},
                                       {"transport", 1, 0, 'T'},
                                       {"chunk", 1, 0, 'c'},
                                       {"seconds", 1, 0, 't'},
                                       {"warmup", 1, 0, 'w'},
                                       {"verify", 0, 0, 'v'},
                                       {"json", 0, 0, 'j'},
                                       {"count", 1, 0, 'N'},
                                       {"fresh", 0, 0, 'F'},
                                       {"slots", 1, 0, 'S'},
                                       {"warm-scratch", 0, 0, 'W'},
                                       {"gap", 1, 0, 'G'},
                                       {"callers", 1, 0, 'C'},
                                       {0, 0, 0, 0}};
    *o = (struct opts){.op = XFER_OP_WRITE,
                       .size = 8,
                       .batch = 1,
                       .depth = 1,
                       .sockets = 1,
                       .threads = 1,
                       .transport = XFER_TRANSPORT_TCP,
                       .seconds = 1.0,
                       .warmup = 0.2};
    optind = 0; /* glibc: full re-initialisation (xferctl parsed its own first) */
    for (int c; (c = getopt_long(argc, argv, "", lo, NULL)) != -1;) {
        switch (c) {
        case 'o':
            if (strcmp(optarg, "write") && strcmp(optarg, "read"))
                return usage();
            o->op = strcmp(optarg, "write") ? XFER_OP_READ : XFER_OP_WRITE;
            break;
        case 's':
            o->size = bench_size(optarg);
            break;
        case 'b':
            o->batch = atoi(optarg);
            break;
        case 'd':
            o->depth = atoi(optarg);
            break;
        case 'k':
            o->sockets = atoi(optarg);
            break;
        case 'n':
            o->threads = atoi(optarg);
            break;
        case 'c':
            o->chunk = bench_size(optarg);
            break;
        case 't':
            o->seconds = atof(optarg);
            break;
        case 'w':
            o->warmup = atof(optarg);
            break;
        case 'N':
            o->count = strtoull(optarg, NULL, 0);
            break;
        case 'F':
            o->fresh = true;
            break;
        case 'S':
            o->slots = strtoull(optarg, NULL, 0);
            break;
        case 'W':
            o->warm_scratch = true;
            break;
        case 'G':
            o->gap = bench_size(optarg);
            break;
        case 'C':
            o->callers = atoi(optarg);
            if (o->callers < 1 || o->callers > 64)
                return usage();
            break;
        case 'v':
            o->verify = true;
            break;
        case 'j':
            o->json = true;
            break;
        case 'T':
            if (xfer_transports_parse(optarg, &o->transport) < 0 ||
                (o->transport != XFER_TRANSPORT_TCP && o->transport != XFER_TRANSPORT_IPC))
                return usage();
            break;
        default:
            return usage();
        }
    }
    if (optind != argc || o->size == 0 || o->size > (256ull << 20) || o->batch < 1 ||
        o->batch > 4096 || o->depth < 1 || o->depth > 1024 || o->sockets < 1 || o->sockets > 64 ||
        o->threads < 1 || o->threads > 64 || !(o->seconds > 0) || o->warmup < 0 ||
        (o->fresh && o->verify) || o->slots > (1u << 20) || (o->slots && o->fresh) ||
        o->gap > (256ull << 20) || (o->callers && (o->batch > 1 || o->depth > 1 || o->fresh)))
        return usage();
    if (o->fresh) { /* one pass, nothing of it touched before */
        o->warm_scratch = true;
        o->count = (uint64_t)o->depth;
        o->seconds = 600;
    }
    return 0;
}

int xbench_main(int argc, char **argv, const char *name)
{
    struct opts o;
    prog = name;
    if (parse(argc, argv, &o))
        return 2;
    int hello_p[2], done_p[2];
    if (pipe(hello_p) < 0 || pipe(done_p) < 0)
        return 1;
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0)
        return 1;
    if (pid == 0) {
        close(hello_p[0]);
        close(done_p[1]);
        _exit(run_target(&o, hello_p[1], done_p[0]));
    }
    close(hello_p[1]);
    close(done_p[0]);
    struct hello h;
    int rc = 1;
    if (bench_read_full(hello_p[0], &h, sizeof(h)) == 0 && h.ok)
        rc = initiator(&o, &h);
    else
        fprintf(stderr, "%s: the target process did not start\n", prog);
    close(done_p[1]); /* the target exits */
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    return rc;
}
