/*
 * Test helper: a GPU request ring fed by CPU threads (the stand-in for
 * kernels: the same producer code, kernels/xfer_ring_proto.h) against a
 * peer engine in another process, over whatever transport the engines pick
 * (XFER_TRANSPORTS=ipc or tcp).
 *
 *   xfer_ring_node peer --out FILE [--node ID] [--len BYTES]
 *       serves region "dst" and checks its bytes on request (ring_common.h)
 *   xfer_ring_node slices   --peer FILE [--expect tcp|ipc]
 *       threads put their slices, wait on their counters; the receiver
 *       verifies every byte; GETs bring them back; grouping of requests
 *       posted before the proxy started
 *   xfer_ring_node pressure --peer FILE     a 4-slot ring, 8 threads
 *   xfer_ring_node dead     --peer FILE --ready F
 *       streams until the peer is killed (the test kills it once F exists):
 *       waits return its error, the error word holds it, nothing hangs
 *   xfer_ring_node teardown --peer FILE --ready F
 *       creates F, waits for F.go (peer frozen), leaves requests in flight
 *       and queued, stops the ring: all failed, counted and reported
 */
#include "check.h"
#include "ring_common.h"
#include "xfer_gpu_ring.h"

#include <getopt.h>
#include <pthread.h>

#define SEED 4242

struct opts {
    const char *cmd, *out, *peer, *ready, *expect, *node;
    uint64_t len;
};

/* ---- peer ---------------------------------------------------------------------- */

static int host_read(void *ctx, uint64_t off, void *dst, uint64_t len)
{
    memcpy(dst, (uint8_t *)ctx + off, len);
    return 0;
}

static int run_peer(const struct opts *o)
{
    struct xfer_engine_config cfg;
    xfer_engine_config_init(&cfg);
    cfg.node_id = o->node ? o->node : "ring-peer";
    cfg.transports = node_transports();
    int rc;
    xfer_engine *e = xfer_engine_new(&cfg, &rc);
    xfer_region *dst;
    if (!e || xfer_region_alloc(e, "dst", o->len, XFER_ACCESS_RW, &dst) < 0) {
        fprintf(stderr, "peer: %s\n", e ? xfer_engine_last_error(e) : xfer_strerror(rc));
        return 1;
    }
    catch_stop_signals();
    if (node_file_write(e, o->out) < 0)
        return 1;
    ring_peer_loop(o->out, host_read, xfer_region_ptr(dst), o->len, &stop);
    xfer_engine_free(e);
    return 0;
}

/* ---- client ------------------------------------------------------------------- */

struct client {
    struct node_file nf;
    xfer_engine *e;
    xfer_peer *p;
    xfer_region *src, *back;
    xfer_gpu_ring *r;
    uint64_t len;
};

enum { L_SRC = 0, L_BACK = 1, R_DST = 0 };

/* Engine connected to the peer, src (pattern SEED) and back regions of len
 * bytes, and a host ring with cfg addressing them. */
static int client_open(struct client *c, const struct opts *o, struct xfer_gpu_ring_config *cfg)
{
    int rc;
    memset(c, 0, sizeof(*c));
    if (node_file_read(o->peer, &c->nf) < 0) {
        fprintf(stderr, "%s: no usable node file %s\n", o->cmd, o->peer);
        return -1;
    }
    const struct xfer_region_desc *dst = node_region(&c->nf, "dst");
    c->e = client_engine("ring-client", &c->nf, NULL, 4, &c->p, &rc);
    if (!dst || !c->e || rc < 0) {
        fprintf(stderr, "connect: %s\n", xfer_strerror(rc));
        return -1;
    }
    c->len = dst->len;
    unsigned t = xfer_peer_transport(c->p);
    const char *tname = t == XFER_TRANSPORT_IPC ? "ipc" : t == XFER_TRANSPORT_TCP ? "tcp" : "?";
    printf("%s: transport %s\n", o->cmd, tname);
    if (o->expect && strcmp(o->expect, tname)) {
        fprintf(stderr, "expected transport %s, got %s\n", o->expect, tname);
        return -1;
    }
    if (xfer_region_alloc(c->e, "src", c->len, XFER_ACCESS_RW, &c->src) < 0 ||
        xfer_region_alloc(c->e, "back", c->len, XFER_ACCESS_RW, &c->back) < 0)
        return -1;
    pattern_fill(xfer_region_ptr(c->src), c->len, SEED, 0);
    cfg->device = -1;
    c->r = xfer_gpu_ring_new(c->e, cfg, &rc);
    if (!c->r || xfer_gpu_ring_add_local(c->r, c->src) != L_SRC ||
        xfer_gpu_ring_add_local(c->r, c->back) != L_BACK ||
        xfer_gpu_ring_add_remote(c->r, c->p, "dst") != R_DST) {
        fprintf(stderr, "ring: %s\n", xfer_strerror(rc));
        return -1;
    }
    return 0;
}

static void client_close(struct client *c)
{
    xfer_gpu_ring_free(c->r);
    xfer_engine_free(c->e);
}

static struct xfer_ring_slot put(uint64_t off, uint64_t len, uint32_t counter)
{
    return (struct xfer_ring_slot){.op = XFER_RING_OP_PUT,
                                   .counter = counter,
                                   .local = L_SRC,
                                   .remote = R_DST,
                                   .local_off = off,
                                   .remote_off = off,
                                   .len = len,
                                   .tag = off};
}

/* ---- slices ------------------------------------------------------------------- */

#define THREADS 8
#define SLICES  64
#define SLICE   (64u << 10)

struct worker {
    struct client *c;
    uint32_t id;
    enum xfer_ring_op op;
    int rc;
};

/* Thread id moves its SLICES slices (PUT from src, or GET into back). */
static void *slice_worker(void *arg)
{
    struct worker *w = arg;
    uint32_t counter = w->op == XFER_RING_OP_PUT ? w->id : THREADS + w->id;
    for (uint64_t s = 0; s < SLICES && w->rc == 0; s++) {
        struct xfer_ring_slot q = put((w->id * SLICES + s) * SLICE, SLICE, counter);
        q.op = w->op;
        q.local = w->op == XFER_RING_OP_PUT ? L_SRC : L_BACK;
        w->rc = xfer_gpu_ring_host_post(w->c->r, &q, XFER_RING_TIMEOUT_DEFAULT);
    }
    if (w->rc == 0)
        w->rc = xfer_gpu_ring_host_wait(w->c->r, counter, SLICES, XFER_RING_TIMEOUT_DEFAULT);
    return NULL;
}

static double run_workers(struct client *c, enum xfer_ring_op op)
{
    pthread_t th[THREADS];
    struct worker w[THREADS];
    double t0 = now_s();
    for (uint32_t i = 0; i < THREADS; i++) {
        w[i] = (struct worker){c, i, op, 0};
        pthread_create(&th[i], NULL, slice_worker, &w[i]);
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(th[i], NULL);
        CHECK(w[i].rc == 0, "thread %d: %s (%s)", i, xfer_strerror(w[i].rc),
              xfer_gpu_ring_last_error(c->r));
    }
    return now_s() - t0;
}

static int run_slices(const struct opts *o)
{
    struct client c;
    struct xfer_gpu_ring_config cfg;
    xfer_gpu_ring_config_init(&cfg);
    if (client_open(&c, o, &cfg) < 0)
        return 1;
    const uint64_t total = (uint64_t)THREADS * SLICES * SLICE;
    if (c.len < total)
        return 1;
    /* 300 requests before the proxy starts: one batch of 256, one of 44 */
    for (uint64_t i = 0; i < 300; i++) {
        struct xfer_ring_slot q = put(i * SLICE, SLICE, 100);
        CHECK(xfer_gpu_ring_host_post(c.r, &q, 0) == 0, "pre-start post %llu",
              (unsigned long long)i);
    }
    CHECK(xfer_gpu_ring_start(c.r) == 0, "start");
    CHECK(xfer_gpu_ring_host_wait(c.r, 100, 300, XFER_RING_TIMEOUT_DEFAULT) == 0,
          "pre-start requests: %s", xfer_gpu_ring_last_error(c.r));
    struct xfer_gpu_ring_stats st;
    xfer_gpu_ring_stats(c.r, &st);
    printf("  300 requests queued before start: %llu batches, largest %llu\n",
           (unsigned long long)st.batches, (unsigned long long)st.batch_items_max);
    CHECK(st.batches == 2 && st.batch_items_max == 256, "grouping");
    double tp = run_workers(&c, XFER_RING_OP_PUT);
    printf("  %d threads x %d puts of %u KiB: %.1f ms (%.0f requests/s)\n", THREADS, SLICES,
           SLICE >> 10, tp * 1e3, THREADS * SLICES / tp);
    CHECK(ring_verify(o->peer, SEED, total, 60) == 0, "receiver's check");
    double tg = run_workers(&c, XFER_RING_OP_GET);
    printf("  %d threads x %d gets: %.1f ms\n", THREADS, SLICES, tg * 1e3);
    CHECK(!memcmp(xfer_region_ptr(c.back), xfer_region_ptr(c.src), total), "GETs brought back "
                                                                           "other bytes");
    xfer_gpu_ring_stats(c.r, &st);
    CHECK(st.completed == 300 + 2 * THREADS * SLICES && st.failed == 0 && st.in_flight == 0,
          "counts: %llu completed, %llu failed", (unsigned long long)st.completed,
          (unsigned long long)st.failed);
    CHECK(xfer_gpu_ring_error(c.r) == 0, "error word %d", xfer_gpu_ring_error(c.r));
    struct xfer_gpu_ring_report rep;
    CHECK(xfer_gpu_ring_stop(c.r, 1000, &rep) == 0 && rep.cancelled + rep.unstarted == 0,
          "clean stop");
    client_close(&c);
    printf("slices: %d failures\n", failures);
    return failures ? 1 : 0;
}

/* ---- pressure ------------------------------------------------------------------- */

#define PRESS_EACH 250

static void *press_worker(void *arg)
{
    struct worker *w = arg;
    for (uint64_t i = 0; i < PRESS_EACH && w->rc == 0; i++) {
        struct xfer_ring_slot q = put((w->id * PRESS_EACH + i) * 4096, 4096, w->id);
        w->rc = xfer_gpu_ring_host_post(w->c->r, &q, XFER_RING_TIMEOUT_DEFAULT);
    }
    if (w->rc == 0)
        w->rc = xfer_gpu_ring_host_wait(w->c->r, w->id, PRESS_EACH, XFER_RING_TIMEOUT_DEFAULT);
    return NULL;
}

static int run_pressure(const struct opts *o)
{
    struct client c;
    struct xfer_gpu_ring_config cfg;
    xfer_gpu_ring_config_init(&cfg);
    cfg.slots = 4;
    cfg.batch_max = 2;
    cfg.outstanding_max = 2;
    if (client_open(&c, o, &cfg) < 0)
        return 1;
    for (int i = 0; i < 4; i++) { /* fills the ring: the proxy is not running */
        struct xfer_ring_slot q = put(i * 4096, 4096, 20);
        CHECK(xfer_gpu_ring_host_post(c.r, &q, 0) == 0, "post %d", i);
    }
    struct xfer_ring_slot extra = put(4 * 4096, 4096, 20);
    CHECK(xfer_gpu_ring_host_post(c.r, &extra, 0) == -XFER_EBUSY, "full ring, no wait");
    double t0 = now_s();
    int rc = xfer_gpu_ring_host_post(c.r, &extra, 100 * 1000000ull);
    printf("  full ring, 100 ms bound: %s after %.0f ms\n", xfer_strerror(rc),
           (now_s() - t0) * 1e3);
    CHECK(rc == -XFER_ETIMEDOUT, "full ring with a bound");
    CHECK(xfer_gpu_ring_start(c.r) == 0, "start");
    pthread_t th[THREADS];
    struct worker w[THREADS];
    for (uint32_t i = 0; i < THREADS; i++) {
        w[i] = (struct worker){&c, i, XFER_RING_OP_PUT, 0};
        pthread_create(&th[i], NULL, press_worker, &w[i]);
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(th[i], NULL);
        CHECK(w[i].rc == 0, "thread %d: %s", i, xfer_strerror(w[i].rc));
    }
    CHECK(xfer_gpu_ring_host_wait(c.r, 20, 4, XFER_RING_TIMEOUT_DEFAULT) == 0, "first four");
    struct xfer_gpu_ring_stats st;
    xfer_gpu_ring_stats(c.r, &st);
    printf("  %d threads x %d puts through 4 slots: %llu completed, %llu full waits, largest "
           "batch %llu\n",
           THREADS, PRESS_EACH, (unsigned long long)st.completed, (unsigned long long)st.full_waits,
           (unsigned long long)st.batch_items_max);
    CHECK(st.completed == THREADS * PRESS_EACH + 4, "completed");
    CHECK(st.full_waits > 1 && st.batch_items_max <= 2, "back-pressure");
    CHECK(ring_verify(o->peer, SEED, (uint64_t)THREADS * PRESS_EACH * 4096, 60) == 0,
          "receiver's check");
    client_close(&c);
    printf("pressure: %d failures\n", failures);
    return failures ? 1 : 0;
}

/* ---- dead peer ------------------------------------------------------------------- */

#define DEAD_THREADS 4

struct streamer {
    struct client *c;
    uint32_t id;
    uint64_t posted;
    int rc;
    double t_err;
};

static double deadline_at;

/* Rounds of 16 puts and a wait, until something failures or the deadline. */
static void *stream_worker(void *arg)
{
    struct streamer *s = arg;
    const uint64_t piece = 64 << 10, base = s->id * 16 * piece;
    while (s->rc == 0 && now_s() < deadline_at) {
        for (int i = 0; i < 16 && s->rc == 0; i++) {
            struct xfer_ring_slot q = put(base + i * piece, piece, s->id);
            s->rc = xfer_gpu_ring_host_post(s->c->r, &q, XFER_RING_TIMEOUT_DEFAULT);
            s->posted += s->rc == 0;
        }
        if (s->rc == 0)
            s->rc = xfer_gpu_ring_host_wait(s->c->r, s->id, s->posted, XFER_RING_TIMEOUT_DEFAULT);
    }
    s->t_err = now_s();
    return NULL;
}

static int run_dead(const struct opts *o)
{
    struct client c;
    struct xfer_gpu_ring_config cfg;
    xfer_gpu_ring_config_init(&cfg);
    cfg.deadline_ms = 20000;
    cfg.timeout_ns = 30000000000ull;
    if (client_open(&c, o, &cfg) < 0 || xfer_gpu_ring_start(c.r) < 0)
        return 1;
    deadline_at = now_s() + 60;
    pthread_t th[DEAD_THREADS];
    struct streamer s[DEAD_THREADS];
    for (uint32_t i = 0; i < DEAD_THREADS; i++) {
        s[i] = (struct streamer){&c, i, 0, 0, 0};
        pthread_create(&th[i], NULL, stream_worker, &s[i]);
    }
    struct xfer_gpu_ring_stats st;
    do { /* paces the look at the counts; the deadline bounds it */
        usleep(5000);
        xfer_gpu_ring_stats(c.r, &st);
    } while (st.completed < 400 && now_s() < deadline_at);
    CHECK(st.completed >= 400, "streaming did not get going");
    ring_file_put(o->ready, "streaming\n");
    double t_ready = now_s();
    for (int i = 0; i < DEAD_THREADS; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < DEAD_THREADS; i++) {
        printf("  thread %d: %llu requests, stopped by %s %.0f ms after the kill was asked\n", i,
               (unsigned long long)s[i].posted, xfer_strerror(s[i].rc),
               (s[i].t_err - t_ready) * 1e3);
        CHECK(s[i].rc == -XFER_ECONN, "thread %d ended with %s", i, xfer_strerror(s[i].rc));
        /* every request it posted finished (failed or not): nothing hangs */
        uint64_t done = 0, failed = 0;
        int rc = xfer_gpu_ring_host_wait(c.r, i, s[i].posted, 20000000000ull);
        xfer_gpu_ring_counter(c.r, i, &done, &failed, NULL);
        CHECK(rc == -XFER_ECONN && done == s[i].posted && failed > 0,
              "thread %d: wait %s, %llu of %llu done", i, xfer_strerror(rc),
              (unsigned long long)done, (unsigned long long)s[i].posted);
    }
    int err = xfer_gpu_ring_error(c.r);
    printf("  error word: %s (%s)\n", xfer_strerror(err), xfer_gpu_ring_last_error(c.r));
    CHECK(err == -XFER_ECONN, "error word %d", err);
    struct xfer_ring_slot q = put(0, 4096, 50); /* a request after the death failures too */
    CHECK(xfer_gpu_ring_host_post(c.r, &q, XFER_RING_TIMEOUT_DEFAULT) == 0, "post after death");
    int rc = xfer_gpu_ring_host_wait(c.r, 50, 1, 20000000000ull);
    CHECK(rc == -XFER_ECONN, "request after the death: %s", xfer_strerror(rc));
    xfer_gpu_ring_stats(c.r, &st);
    CHECK(st.in_flight == 0, "%llu still in flight", (unsigned long long)st.in_flight);
    struct xfer_gpu_ring_report rep;
    xfer_gpu_ring_stop(c.r, 0, &rep);
    CHECK(rep.cancelled + rep.unstarted == 0, "nothing left to cancel");
    client_close(&c);
    printf("dead: %d failures\n", failures);
    return failures ? 1 : 0;
}

/* ---- teardown with requests in flight -------------------------------------------------- */

struct fail_log {
    pthread_mutex_t mu;
    int n, wrong;
    uint8_t seen[64];
};

static void log_fail(const struct xfer_ring_slot *req, int err, const char *why, void *arg)
{
    struct fail_log *fl = arg;
    (void)why;
    pthread_mutex_lock(&fl->mu);
    fl->n++;
    uint64_t i = req->tag / 4096;
    if (err != -XFER_ECANCELED || req->counter != 1 || i >= 64 || fl->seen[i]++)
        fl->wrong++;
    pthread_mutex_unlock(&fl->mu);
}

static int run_teardown(const struct opts *o)
{
    struct client c;
    struct fail_log fl = {.mu = PTHREAD_MUTEX_INITIALIZER};
    struct xfer_gpu_ring_config cfg;
    xfer_gpu_ring_config_init(&cfg);
    cfg.slots = 64;
    cfg.batch_max = 8;
    cfg.outstanding_max = 8;
    cfg.on_fail = log_fail;
    cfg.on_fail_arg = &fl;
    if (client_open(&c, o, &cfg) < 0 || xfer_gpu_ring_start(c.r) < 0)
        return 1;
    for (int i = 0; i < 16; i++) { /* warm-up: the connection works */
        struct xfer_ring_slot q = put(i * 4096, 4096, 0);
        xfer_gpu_ring_host_post(c.r, &q, XFER_RING_TIMEOUT_DEFAULT);
    }
    CHECK(xfer_gpu_ring_host_wait(c.r, 0, 16, XFER_RING_TIMEOUT_DEFAULT) == 0, "warm-up");
    char go[600];
    snprintf(go, sizeof(go), "%s.go", o->ready);
    ring_file_put(o->ready, "ready\n");
    double t0 = now_s();
    while (access(go, F_OK) != 0 && now_s() - t0 < 20)
        usleep(10000);
    for (int i = 0; i < 40; i++) { /* the peer is frozen: 8 go in flight, 32 wait in the ring */
        struct xfer_ring_slot q = put(i * 4096, 4096, 1);
        CHECK(xfer_gpu_ring_host_post(c.r, &q, 0) == 0, "post %d", i);
    }
    struct xfer_gpu_ring_stats st;
    t0 = now_s();
    do {
        usleep(1000);
        xfer_gpu_ring_stats(c.r, &st);
    } while (st.in_flight < 8 && now_s() - t0 < 10);
    printf("  in flight %llu, taken %llu\n", (unsigned long long)st.in_flight,
           (unsigned long long)st.taken);
    CHECK(st.in_flight == 8, "in flight");
    struct xfer_gpu_ring_report rep;
    t0 = now_s();
    CHECK(xfer_gpu_ring_stop(c.r, 200, &rep) == 0, "stop");
    double ms = (now_s() - t0) * 1e3;
    printf("  stop took %.0f ms: %llu cancelled in flight, %llu not started, %d reported\n", ms,
           (unsigned long long)rep.cancelled, (unsigned long long)rep.unstarted, fl.n);
    CHECK(rep.cancelled == 8 && rep.unstarted == 32, "report");
    CHECK(fl.n == 40 && fl.wrong == 0, "on_fail: %d calls, %d wrong", fl.n, fl.wrong);
    uint64_t done, failed;
    xfer_gpu_ring_counter(c.r, 1, &done, &failed, NULL);
    CHECK(done == 40 && failed == 40, "counter: %llu done, %llu failed", (unsigned long long)done,
          (unsigned long long)failed);
    CHECK(xfer_gpu_ring_host_wait(c.r, 1, 40, 0) == -XFER_ECANCELED, "wait after stop");
    CHECK(xfer_gpu_ring_error(c.r) == -XFER_ECANCELED, "error word");
    xfer_gpu_ring_stats(c.r, &st);
    CHECK(st.state == XFER_RING_STOPPED && st.in_flight == 0, "stopped, nothing in flight");
    ring_file_put(o->ready, "done\n");
    client_close(&c);
    printf("teardown: %d failures\n", failures);
    return failures ? 1 : 0;
}

int main(int argc, char **argv)
{
    static const struct option lo[] = {
        {"out", 1, 0, 'o'},    {"peer", 1, 0, 'p'}, {"ready", 1, 0, 'R'}, {"len", 1, 0, 'l'},
        {"expect", 1, 0, 'x'}, {"node", 1, 0, 'n'}, {0, 0, 0, 0}};
    struct opts o = {.len = 48u << 20};
    if (argc < 2) {
        fprintf(stderr, "usage: xfer_ring_node peer|slices|pressure|dead|teardown [options]\n");
        return 2;
    }
    o.cmd = argv[1];
    optind = 2;
    for (int ch; (ch = getopt_long(argc, argv, "", lo, NULL)) != -1;) {
        if (ch == 'o')
            o.out = optarg;
        else if (ch == 'p')
            o.peer = optarg;
        else if (ch == 'R')
            o.ready = optarg;
        else if (ch == 'l')
            o.len = strtoull(optarg, NULL, 0);
        else if (ch == 'x')
            o.expect = optarg;
        else if (ch == 'n')
            o.node = optarg;
        else
            return 2;
    }
    if (!strcmp(o.cmd, "peer") && o.out)
        return run_peer(&o);
    if (!o.peer) {
        fprintf(stderr, "%s: --peer FILE is required\n", o.cmd);
        return 2;
    }
    if (!strcmp(o.cmd, "slices"))
        return run_slices(&o);
    if (!strcmp(o.cmd, "pressure"))
        return run_pressure(&o);
    if (!strcmp(o.cmd, "dead") && o.ready)
        return run_dead(&o);
    if (!strcmp(o.cmd, "teardown") && o.ready)
        return run_teardown(&o);
    fprintf(stderr, "unknown command %s (or missing --ready)\n", o.cmd);
    return 2;
}
