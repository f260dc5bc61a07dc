/*
 * Test helper for notifications (docs/notify.md): a receiving node and the
 * senders that check it, one engine per process.
 *
 *   xfer_notify serve --out FILE --node ID [--mb N] [--queue N] [--hold FILE]
 *       registers region "buf" (N MiB, memfd), writes FILE, and checks every
 *       notification the moment it is read (see check_notif). With --hold it
 *       reads nothing until FILE exists, then drains once (back-pressure).
 *       Exit 0 only if an "END n" arrived after n good batch notifications
 *       (or, held, the drain matched "EXPECT q r") and nothing was wrong.
 *   xfer_notify order  --peer FILE [--batches N] [--depth D] [--sockets S] [--seed X]
 *       N batches of 1..8 random WRITE items into fresh ranges, each with a
 *       bound notification listing (offset, length, checksum) of its items;
 *       D batches in flight; then a standalone "END N".
 *   xfer_notify failed --peer FILE
 *       a batch of 3 items whose item 1 is out of bounds at the target.
 *   xfer_notify flood --peer FILE --count N --queue Q --ready FILE
 *       N standalone notifications to a held receiver of queue Q: the first
 *       Q are accepted, the others refused with -XFER_ENOSPC; then "EXPECT".
 *   xfer_notify storm --peer FILE --count N --ready FILE
 *       notifications racing a reconnect (see run_storm).
 *   xfer_notify cancel --peer FILE    cancel of a batch with a notification
 *   xfer_notify closer --out FILE --node ID --ready FILE   (LD_PRELOAD=libslowsend.so)
 *   xfer_notify bye --peer FILE --ready FILE
 *       a receiver that frees its engine as soon as "BYE" is queued, with
 *       its answer delayed; the sender's BYE must still be answered 0.
 *   xfer_notify wire --peer FILE
 *       raw tcp frames after a real handshake: oversized, truncated and
 *       inconsistent message frames; the node answers or cuts, keeps serving
 *       (notify_wire.h).
 */
#include "node_common.h"

#include <dlfcn.h>
#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>

static volatile sig_atomic_t stop;
static void on_signal(int sig)
{
    (void)sig;
    stop = 1;
}

struct opts {
    const char *cmd, *out, *node, *peer, *hold, *ready;
    int mb, queue, batches, depth, sockets, count;
    uint64_t seed;
};

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        fprintf(stderr, "FAIL: " __VA_ARGS__);                                                     \
        fputc('\n', stderr);                                                                       \
        return 1;                                                                                  \
    } while (0)

#include "notify_wire.h" /* run_wire */

/* ---- receiver --------------------------------------------------------------------- */

struct recv_state {
    xfer_region *buf;
    long good, bad, ends, end_n, floods, failed_ok;
    long expect_q, expect_r;
    uint64_t last_seq_seen;
    uint8_t *storm; /* "S i" seen, for the reconnect race */
    long storm_n, storm_dups;
    long cancel_ok;
};

#define STORM_MAX 100000

/* "B k off:len:sum ..." -> every listed range must hold its data already. */
static bool check_ranges(struct recv_state *st, char *p)
{
    const uint8_t *base = xfer_region_ptr(st->buf);
    size_t size = xfer_region_len(st->buf);
    for (char *tok = strtok(p, " "); tok; tok = strtok(NULL, " ")) {
        unsigned long long off, len, sum;
        if (sscanf(tok, "%llu:%llu:%llx", &off, &len, &sum) != 3 || !xfer_range_ok(off, len, size))
            return false;
        if (checksum(base + off, len) != sum) {
            fprintf(stderr, "range %llu+%llu: data not there when its notification was read\n", off,
                    len);
            return false;
        }
    }
    return true;
}

static void check_notif(struct recv_state *st, struct xfer_notif *n)
{
    char *msg = (char *)n->data;
    long k;
    if (msg[0] == 'B' && sscanf(msg, "B %ld", &k) == 1) {
        char *p = strchr(msg + 2, ' ');
        /* Bound, or sent again standalone after the bound one was refused
         * with -XFER_ENOSPC (run_order's notify_again): the data must be
         * there either way. */
        bool ok =
            (!n->bound || (n->status == 0 && n->n_failed == 0)) && p && check_ranges(st, p + 1);
        ok ? st->good++ : st->bad++;
    } else if (msg[0] == 'F') { /* failed: 3 items, item 1 refused, others landed */
        char *p = strchr(msg, ' ');
        bool ok = n->bound && n->n_items == 3 && n->n_failed == 1 && n->n_listed == 1 &&
                  n->failed[0].index == 1 && n->failed[0].status == -XFER_ERANGE &&
                  n->status == -XFER_ERANGE && p && check_ranges(st, p + 1);
        if (!ok)
            fprintf(stderr, "failed-item notification wrong: status %d items %u failed %u\n",
                    n->status, n->n_items, n->n_failed);
        ok ? st->failed_ok++ : st->bad++;
    } else if (msg[0] == 'C') { /* cancelled batch: still notified, item 0 named */
        bool ok = n->bound && n->n_items == 1 &&
                  (n->status == 0 ? n->n_failed == 0
                                  : n->status == -XFER_ECANCELED && n->n_failed == 1 &&
                                        n->failed[0].index == 0);
        ok ? st->cancel_ok++ : st->bad++;
    } else if (sscanf(msg, "END %ld", &k) == 1) {
        st->ends++;
        st->end_n = k;
    } else if (sscanf(msg, "S %ld", &k) == 1 && k >= 0 && k < STORM_MAX) {
        st->storm[k] ? st->storm_dups++ : st->storm_n++;
        st->storm[k] = 1;
    } else if (sscanf(msg, "P %ld", &k) == 1) {
        if (k != st->floods++ || n->bound)
            st->bad++;
    } else if (strcmp(msg, "PING")) {
        fprintf(stderr, "unexpected notification '%.40s'\n", msg);
        st->bad++;
    }
    if (n->incarnation == 0 || !n->node_id[0])
        st->bad++;
    xfer_notif_free(n);
}

static int drain(xfer_engine *e, struct recv_state *st)
{
    struct xfer_notif *v[64];
    int got, total = 0;
    while ((got = xfer_notif_poll(e, v, 64)) > 0) {
        for (int i = 0; i < got; i++)
            check_notif(st, v[i]);
        total += got;
    }
    return total;
}

/* Waits (bounded) until path exists: the sender's go-ahead. */
static bool wait_file(const char *path, int seconds)
{
    double until = now_s() + seconds;
    while (access(path, F_OK) != 0) {
        if (stop || now_s() > until)
            return false;
        poll(NULL, 0, 20);
    }
    return true;
}

/* xfer_notif_wait for node ("" = any peer), checked: a count never above
 * what is queued, never < 0. */
static int notif_wait(xfer_engine *e, const char *node, int ms, struct recv_state *st)
{
    int n = xfer_notif_wait(e, node[0] ? node : NULL, ms);
    if (n < 0 || (size_t)n > xfer_notif_pending(e)) {
        fprintf(stderr, "xfer_notif_wait returned %d\n", n);
        st->bad++;
    }
    return n;
}

/* Before anyone sends: no argument, 0 ms and 150 ms waits return what they
 * should, and the 150 ms one at about that time (bounded both ways). */
static int notif_wait_bounds(xfer_engine *e, const char *node)
{
    const char *nd = node[0] ? node : NULL;
    if (xfer_notif_wait(NULL, nd, 0) != -XFER_EINVAL || xfer_notif_wait(e, nd, 0) != 0)
        return -1;
    double t0 = now_s();
    int n = xfer_notif_wait(e, nd, 150);
    double dt = now_s() - t0;
    printf("notif_wait: empty queue, 150 ms: %d after %.0f ms\n", n, dt * 1e3);
    return n == 0 && dt >= 0.149 && dt < 5 ? 0 : -1;
}

static int run_serve(const struct opts *o)
{
    struct xfer_engine_config cfg;
    xfer_engine_config_init(&cfg);
    cfg.node_id = o->node;
    cfg.transports = node_transports();
    cfg.io_timeout_ms = 3000;
    if (o->queue)
        cfg.notify_queue_len = o->queue;
    if (getenv("XFER_TEST_PROGRESS_THREADS"))
        cfg.progress_threads = atoi(getenv("XFER_TEST_PROGRESS_THREADS"));
    int rc;
    xfer_engine *e = xfer_engine_new(&cfg, &rc);
    if (!e)
        FAIL("engine: %s", xfer_strerror(rc));
    struct recv_state st = {0};
    st.storm = calloc(STORM_MAX, 1);
    /* XFER_TEST_NOTIF_WAIT=NODE or "any": wait in xfer_notif_wait (the
     * waiting thread reads the sender's socket itself) instead of poll on
     * the queue's fd; first its bounds, before anyone can send. */
    const char *wait_for = getenv("XFER_TEST_NOTIF_WAIT");
    if (wait_for && !strcmp(wait_for, "any"))
        wait_for = "";
    if (wait_for && notif_wait_bounds(e, wait_for) < 0)
        FAIL("xfer_notif_wait bounds");
    if (xfer_region_alloc(e, "buf", (size_t)o->mb << 20, XFER_ACCESS_RW, &st.buf) < 0 ||
        node_file_write(e, o->out) < 0)
        FAIL("setup: %s", xfer_engine_last_error(e));
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    if (o->hold) { /* back-pressure: read nothing until the sender says "q r" */
        bool go = wait_file(o->hold, 120);
        FILE *f = go ? fopen(o->hold, "r") : NULL;
        if (!f || fscanf(f, "%ld %ld", &st.expect_q, &st.expect_r) != 2)
            go = false;
        if (f)
            fclose(f);
        size_t pending = xfer_notif_pending(e);
        uint64_t refused = xfer_notif_refused(e);
        drain(e, &st);
        printf("held: go=%d pending=%zu refused=%llu floods=%ld expect=%ld/%ld bad=%ld\n", go,
               pending, (unsigned long long)refused, st.floods, st.expect_q, st.expect_r, st.bad);
        rc = go && st.bad == 0 && st.floods == st.expect_q && (long)refused == st.expect_r &&
                     (long)pending == st.expect_q
                 ? 0
                 : 1;
        char done[512];
        snprintf(done, sizeof(done), "%s.done", o->hold);
        if ((f = fopen(done, "w")))
            fclose(f);
        struct pollfd p = {.fd = xfer_notif_fd(e), .events = POLLIN};
        while (!stop) /* serve on (the sender checks the queue works again) */
            if (wait_for ? notif_wait(e, wait_for, 100, &st) > 0 : poll(&p, 1, 100) > 0)
                drain(e, &st);
        rc |= st.bad != 0;
    } else {
        struct pollfd p = {.fd = xfer_notif_fd(e), .events = POLLIN};
        while (!stop) {
            if (wait_for ? notif_wait(e, wait_for, 100, &st) > 0 : poll(&p, 1, 100) > 0)
                drain(e, &st);
        }
        drain(e, &st);
        printf("notifications: good=%ld bad=%ld failed_ok=%ld ends=%ld end_n=%ld\n", st.good,
               st.bad, st.failed_ok, st.ends, st.end_n);
        printf("storm: received=%ld dups=%ld\n", st.storm_n, st.storm_dups);
        printf("cancel_ok=%ld\n", st.cancel_ok);
        char path[512];
        snprintf(path, sizeof(path), "%s.storm", o->out);
        FILE *f = fopen(path, "w");
        for (long k = 0; f && k < STORM_MAX; k++)
            if (st.storm[k])
                fprintf(f, "%ld\n", k);
        if (f)
            fclose(f);
        rc |= st.storm_dups != 0;
        rc = st.bad == 0 && (st.ends == 0 || st.end_n == st.good) ? 0 : 1;
    }
    fflush(stdout);
    xfer_engine_free(e);
    free(st.storm);
    return rc;
}

/* ---- senders ----------------------------------------------------------------------- */

struct sender {
    xfer_engine *e;
    xfer_peer *p;
    xfer_region *src;
    const struct xfer_region_desc *rd;
};

static int sender_open(const struct opts *o, struct sender *s, struct node_file *nf)
{
    int rc;
    if (node_file_read(o->peer, nf) < 0 || !(s->rd = node_region(nf, "buf")))
        return -1;
    s->e = client_engine("notify-sender", nf, NULL, o->sockets, &s->p, &rc);
    if (!s->e || rc < 0) {
        fprintf(stderr, "connect: %s (%s)\n", xfer_strerror(rc),
                s->e ? xfer_engine_last_error(s->e) : "");
        return -1;
    }
    if (xfer_region_alloc(s->e, "src", s->rd->len, XFER_ACCESS_RW, &s->src) < 0)
        return -1;
    /* ipc needs a tcp port in the node file: the test allows both and checks
     * that ipc (preferred) carries the traffic. */
    const char *want = getenv("XFER_NOTIFY_EXPECT");
    char have[32] = "";
    xfer_transports_format(xfer_peer_transport(s->p), have, sizeof(have));
    if (want && strcmp(want, have)) {
        fprintf(stderr, "peer reached over '%s', expected '%s'\n", have, want);
        return -1;
    }
    return 0;
}

static uint64_t rnd(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

/* Appends a WRITE of [off, +len) (same offset on both sides) with fresh
 * random bytes, and its "off:len:sum" to msg. */
static int add_write(struct sender *s, xfer_batch *b, uint64_t off, uint64_t len, uint64_t *x,
                     char *msg, size_t cap)
{
    uint8_t *p = (uint8_t *)xfer_region_ptr(s->src) + off;
    for (uint64_t i = 0; i < len; i++)
        p[i] = (uint8_t)rnd(x);
    struct xfer_item it = {XFER_OP_WRITE, s->src, off, s->p, s->rd->id, s->rd->gen, off, len};
    size_t used = strlen(msg);
    snprintf(msg + used, cap - used, " %llu:%llu:%llx", (unsigned long long)off,
             (unsigned long long)len, (unsigned long long)checksum(p, len));
    return xfer_batch_add(b, &it);
}

/* The documented answer to -XFER_ENOSPC (the receiver's queue was full; the
 * batch's data landed, its notification was not queued): send it again
 * later. Bounded: 30 s. */
static int notify_again(struct sender *s, const char *msg, long *resent)
{
    double until = now_s() + 30;
    int rc;
    do {
        nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
        rc = xfer_notify(s->e, s->p, msg, strlen(msg), 10000);
        ++*resent;
    } while (rc == -XFER_ENOSPC && now_s() < until);
    return rc;
}

static bool items_ok(const xfer_batch *b)
{
    for (size_t i = 0; i < xfer_batch_count(b); i++)
        if (xfer_batch_item_status(b, i) != 0)
            return false;
    return true;
}

static int run_order(const struct opts *o)
{
    struct node_file nf;
    struct sender s = {0};
    if (sender_open(o, &s, &nf) < 0)
        FAIL("sender setup");
    int depth = o->depth > 0 ? o->depth : 8;
    xfer_batch **ring = calloc((size_t)depth, sizeof(*ring));
    char(*msgs)[1024] = calloc((size_t)depth, sizeof(*msgs));
    uint64_t x = o->seed | 1, bump = 0, size = s.rd->len;
    long sent = 0, resent = 0;
    double t0 = now_s();
    for (long k = 0; k < o->batches + depth; k++) {
        xfer_batch **slot = &ring[k % depth];
        if (*slot) { /* the oldest batch in flight */
            int rc = xfer_batch_wait(*slot, -1), ns = xfer_batch_notify_status(*slot, s.p);
            if (rc == -XFER_ENOSPC && ns == -XFER_ENOSPC && items_ok(*slot))
                rc = ns = notify_again(&s, msgs[k % depth], &resent);
            if (rc != 0 || ns != 0)
                FAIL("batch %ld: %s / notify %d (%s)", k - depth, xfer_strerror(rc), ns,
                     xfer_batch_item_error(*slot, 0));
            xfer_batch_free(*slot);
            *slot = NULL;
        }
        if (k >= o->batches)
            continue;
        int rc;
        xfer_batch *b = xfer_batch_new(s.e, &rc);
        char *msg = msgs[k % depth];
        snprintf(msg, sizeof(msgs[0]), "B %ld", k);
        int n = 1 + (int)(rnd(&x) % 8);
        for (int i = 0; i < n; i++) { /* mostly small, some spread over several chunks */
            uint64_t len = rnd(&x) % 16 == 0 ? 1 + rnd(&x) % 49152 : 1 + rnd(&x) % 2048;
            uint64_t off = bump + rnd(&x) % 64;
            if (off + len > size)
                FAIL("region too small for %d batches (give --mb)", o->batches);
            bump = off + len;
            if (add_write(&s, b, off, len, &x, msg, sizeof(msgs[0])) < 0)
                FAIL("add: %s", xfer_engine_last_error(s.e));
        }
        if ((rc = xfer_batch_notify(b, s.p, msg, strlen(msg))) < 0 ||
            (rc = xfer_batch_submit(b, 30000)) < 0)
            FAIL("notify/submit: %s", xfer_strerror(rc));
        *slot = b;
        sent++;
    }
    double dt = now_s() - t0;
    char end[32];
    snprintf(end, sizeof(end), "END %ld", sent);
    int rc = xfer_notify(s.e, s.p, end, strlen(end), 10000);
    if (rc != 0)
        FAIL("END: %s", xfer_strerror(rc));
    printf("order: %ld batches with notifications in %.2f s (%.0f/s), %ld sent again after "
           "-XFER_ENOSPC\n",
           sent, dt, sent / dt, resent);
    free(ring);
    free(msgs);
    xfer_engine_free(s.e);
    return 0;
}

static int run_failed(const struct opts *o)
{
    struct node_file nf;
    struct sender s = {0};
    if (sender_open(o, &s, &nf) < 0)
        FAIL("sender setup");
    uint64_t x = o->seed | 1, size = s.rd->len;
    int rc;
    xfer_batch *b = xfer_batch_new(s.e, &rc);
    char msg[256] = "F";
    add_write(&s, b, 0, 1000, &x, msg, sizeof(msg));
    /* item 1: past the end of the target's region; the local side is fine */
    struct xfer_item bad = {XFER_OP_WRITE, s.src, 0, s.p, s.rd->id, s.rd->gen, size - 10, 100};
    if (xfer_batch_add(b, &bad) != 1)
        FAIL("add bad item");
    add_write(&s, b, 4096, 5000, &x, msg, sizeof(msg));
    if (xfer_batch_notify(b, s.p, msg, strlen(msg)) < 0 || xfer_batch_submit(b, 10000) < 0)
        FAIL("submit");
    rc = xfer_batch_wait(b, -1);
    int ns = xfer_batch_notify_status(b, s.p);
    printf("failed: batch %s, item 1 %s, notification %s\n", xfer_strerror(rc),
           xfer_strerror(xfer_batch_item_status(b, 1)), xfer_strerror(ns));
    if (rc != -XFER_ERANGE || xfer_batch_item_status(b, 0) != 0 || ns != 0)
        FAIL("expected ERANGE for the batch, a delivered notification");
    xfer_batch_free(b);
    xfer_engine_free(s.e);
    return 0;
}

static int run_flood(const struct opts *o)
{
    struct node_file nf;
    struct sender s = {0};
    if (sender_open(o, &s, &nf) < 0)
        FAIL("sender setup");
    long ok = 0, full = 0;
    for (int i = 0; i < o->count; i++) {
        char m[32];
        snprintf(m, sizeof(m), "P %ld", ok);
        int rc = xfer_notify(s.e, s.p, m, strlen(m), 5000);
        if (rc == 0)
            ok++;
        else if (rc == -XFER_ENOSPC)
            full++;
        else
            FAIL("notify %d: %s", i, xfer_strerror(rc));
    }
    /* a bound notification is refused the same way; its data still landed */
    int rc;
    xfer_batch *b = xfer_batch_new(s.e, &rc);
    uint64_t x = 7;
    char msg[128] = "B 0";
    add_write(&s, b, 0, 512, &x, msg, sizeof(msg));
    xfer_batch_notify(b, s.p, msg, strlen(msg));
    xfer_batch_submit(b, 5000);
    rc = xfer_batch_wait(b, -1);
    if (o->queue > 0 && (ok != o->queue || full != o->count - o->queue || rc != -XFER_ENOSPC ||
                         xfer_batch_item_status(b, 0) != 0))
        FAIL("flood: %ld accepted, %ld refused, bound %s (queue %d)", ok, full, xfer_strerror(rc),
             o->queue);
    xfer_batch_free(b);
    printf("flood: %ld accepted, %ld refused with ENOSPC\n", ok, full);
    /* Tell the held receiver what to expect (atomically), wait until it
     * drained, then the queue must accept again. */
    char tmp[512], done[512];
    snprintf(tmp, sizeof(tmp), "%s.tmp", o->ready);
    snprintf(done, sizeof(done), "%s.done", o->ready);
    FILE *f = fopen(tmp, "w");
    if (!f)
        FAIL("cannot write %s", tmp);
    fprintf(f, "%ld %ld\n", ok, full + 1);
    fclose(f);
    rename(tmp, o->ready);
    if (!wait_file(done, 60))
        FAIL("receiver did not drain");
    rc = xfer_notify(s.e, s.p, "PING", 4, 5000);
    if (rc != 0)
        FAIL("after the drain: %s", xfer_strerror(rc));
    xfer_engine_free(s.e);
    return 0;
}

/* A batch of one large WRITE with a bound notification, cancelled right
 * after submit: cancel returns, and the notification still goes out (marked
 * failed, naming item 0) unless the WRITE won the race. */
static int run_cancel(const struct opts *o)
{
    struct node_file nf;
    struct sender s = {0};
    if (sender_open(o, &s, &nf) < 0)
        FAIL("sender setup");
    int rc;
    xfer_batch *b = xfer_batch_new(s.e, &rc);
    struct xfer_item it = {XFER_OP_WRITE, s.src, 0, s.p, s.rd->id, s.rd->gen, 0, s.rd->len};
    xfer_batch_add(b, &it);
    xfer_batch_notify(b, s.p, "C", 1);
    double t0 = now_s();
    xfer_batch_submit(b, 30000);
    rc = xfer_batch_cancel(b);
    int res = xfer_batch_poll(b), ns = xfer_batch_notify_status(b, s.p);
    printf("cancel: cancel %s after %.3f s, batch %s, notification %s\n", xfer_strerror(rc),
           now_s() - t0, xfer_strerror(res), xfer_strerror(ns));
    if (rc != 0 || (res != -XFER_ECANCELED && res != 0) || ns == -XFER_EINPROGRESS)
        FAIL("cancel of a batch with a notification");
    xfer_batch_free(b);
    /* Messages to a peer leave in order on one channel: once this one is
     * acknowledged, the cancelled batch's notification has arrived. */
    if ((rc = xfer_notify(s.e, s.p, "PING", 4, 5000)) != 0)
        FAIL("ping after cancel: %s", xfer_strerror(rc));
    xfer_engine_free(s.e);
    return 0;
}

/* Standalone notifications "S i" one after the other (deadline 1 s each)
 * while the test freezes the receiver past io_timeout and resumes it: the
 * connection dies and is rebuilt under them. Acknowledged ones are listed
 * in --ready; the receiver must have each of those exactly once. */
static int run_storm(const struct opts *o)
{
    struct node_file nf;
    struct sender s = {0};
    if (sender_open(o, &s, &nf) < 0)
        FAIL("sender setup");
    FILE *f = fopen(o->ready, "w");
    if (!f)
        FAIL("cannot write %s", o->ready);
    long acked = 0, lost = 0, other = 0, refused = 0;
    double until = now_s() + 60;
    for (int i = 0; i < o->count && now_s() < until; i++) {
        char m[32];
        snprintf(m, sizeof(m), "S %d", i);
        int rc = xfer_notify(s.e, s.p, m, strlen(m), 1000);
        if (rc == 0) {
            fprintf(f, "%d\n", i);
            acked++;
        } else if (rc == -XFER_ECONN || rc == -XFER_ETIMEDOUT) {
            lost++; /* may or may not have arrived */
            poll(NULL, 0, 20);
        } else if (rc == -XFER_ENOSPC) { /* the resumed receiver's queue is full: */
            refused++;                   /* not queued, send it again (documented) */
            poll(NULL, 0, 1);
            i--;
        } else {
            other++;
            fprintf(stderr, "storm %d: %s\n", i, xfer_strerror(rc));
        }
    }
    fclose(f);
    printf("storm: %ld acknowledged, %ld unknown (ECONN/ETIMEDOUT), %ld refused and sent again "
           "(ENOSPC), %ld other\n",
           acked, lost, refused, other);
    xfer_engine_free(s.e);
    return other == 0 && acked > 0 && lost > 0 ? 0 : 1;
}

/* ---- closing right after a notification -------------------------------------- */

#define CLOSER_SLOW_MS 300 /* each sendmsg of the closer, from "ARM" on */

/* A receiver that frees its engine the moment "BYE" is queued, while the
 * answer to it is still on its way: libslowsend (LD_PRELOAD) delays this
 * process's sendmsg from "ARM" on. The sender must still learn that BYE
 * was queued (docs/notify.md, "Closing right after a notification"). */
static int run_closer(const struct opts *o)
{
    void (*arm)(int) = (void (*)(int))dlsym(RTLD_DEFAULT, "xfer_slowsend_arm");
    if (!arm)
        FAIL("closer: run with LD_PRELOAD=libslowsend.so");
    struct xfer_engine_config cfg;
    xfer_engine_config_init(&cfg);
    cfg.node_id = o->node;
    cfg.transports = node_transports();
    int rc;
    xfer_engine *e = xfer_engine_new(&cfg, &rc);
    xfer_region *buf;
    if (!e)
        FAIL("engine: %s", xfer_strerror(rc));
    if (xfer_region_alloc(e, "buf", 1 << 20, XFER_ACCESS_RW, &buf) < 0 ||
        node_file_write(e, o->out) < 0)
        FAIL("setup: %s", xfer_engine_last_error(e));
    struct pollfd p = {.fd = xfer_notif_fd(e), .events = POLLIN};
    for (double until = now_s() + 60; now_s() < until;) {
        struct xfer_notif *n;
        if (poll(&p, 1, 100) <= 0)
            continue;
        while (xfer_notif_poll(e, &n, 1) == 1) {
            bool bye = !strcmp((char *)n->data, "BYE");
            if (!strcmp((char *)n->data, "ARM")) {
                arm(CLOSER_SLOW_MS);
                touch(o->ready, ""); /* the sender may send BYE now */
            }
            xfer_notif_free(n);
            if (bye) {
                double t0 = now_s();
                xfer_engine_free(e);
                printf("closer: BYE queued, engine freed in %.0f ms\n", (now_s() - t0) * 1e3);
                return 0;
            }
        }
    }
    FAIL("closer: no BYE within 60 s");
}

/* The closer's sender: "ARM", then (once the closer armed its delay)
 * "BYE", each answered 0 (queued). */
static int run_bye(const struct opts *o)
{
    struct node_file nf;
    struct sender s = {0};
    if (sender_open(o, &s, &nf) < 0)
        FAIL("sender setup");
    int rc = xfer_notify(s.e, s.p, "ARM", 3, 10000);
    if (rc == 0 && !wait_file(o->ready, 30))
        FAIL("bye: the closer did not arm within 30 s");
    if (rc == 0)
        rc = xfer_notify(s.e, s.p, "BYE", 3, 10000);
    printf("bye: ARM, BYE -> %s%s%s\n", xfer_strerror(rc), rc ? ": " : "",
           rc ? xfer_engine_last_error(s.e) : "");
    xfer_engine_free(s.e);
    return rc == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
    struct opts o = {.node = "notify-target", .mb = 64, .batches = 1000, .sockets = 4};
    o.seed = (uint64_t)time(NULL);
    static const struct option lo[] = {
        {"out", 1, 0, 'o'},   {"node", 1, 0, 'n'},    {"peer", 1, 0, 'p'},  {"hold", 1, 0, 'h'},
        {"ready", 1, 0, 'r'}, {"mb", 1, 0, 'm'},      {"queue", 1, 0, 'q'}, {"batches", 1, 0, 'b'},
        {"depth", 1, 0, 'd'}, {"sockets", 1, 0, 's'}, {"count", 1, 0, 'c'}, {"seed", 1, 0, 'x'},
        {0, 0, 0, 0}};
    if (argc < 2) {
        fprintf(stderr, "usage: xfer_notify COMMAND [options] (commands: see xfer_notify.c)\n");
        return 2;
    }
    o.cmd = argv[1];
    optind = 2;
    for (int c; (c = getopt_long(argc, argv, "", lo, NULL)) != -1;) {
        switch (c) {
        case 'o':
            o.out = optarg;
            break;
        case 'n':
            o.node = optarg;
            break;
        case 'p':
            o.peer = optarg;
            break;
        case 'h':
            o.hold = optarg;
            break;
        case 'r':
            o.ready = optarg;
            break;
        case 'm':
            o.mb = atoi(optarg);
            break;
        case 'q':
            o.queue = atoi(optarg);
            break;
        case 'b':
            o.batches = atoi(optarg);
            break;
        case 'd':
            o.depth = atoi(optarg);
            break;
        case 's':
            o.sockets = atoi(optarg);
            break;
        case 'c':
            o.count = atoi(optarg);
            break;
        case 'x':
            o.seed = strtoull(optarg, NULL, 0);
            break;
        default:
            return 2;
        }
    }
    if (!strcmp(o.cmd, "serve") && o.out)
        return run_serve(&o);
    if (!strcmp(o.cmd, "closer") && o.out && o.ready)
        return run_closer(&o);
    if (!o.peer) {
        fprintf(stderr, "--peer FILE required\n");
        return 2;
    }
    if (!strcmp(o.cmd, "order"))
        return run_order(&o);
    if (!strcmp(o.cmd, "failed"))
        return run_failed(&o);
    if (!strcmp(o.cmd, "flood") && o.ready)
        return run_flood(&o);
    if (!strcmp(o.cmd, "wire"))
        return run_wire(o.peer);
    if (!strcmp(o.cmd, "storm") && o.ready)
        return run_storm(&o);
    if (!strcmp(o.cmd, "cancel"))
        return run_cancel(&o);
    if (!strcmp(o.cmd, "bye") && o.ready)
        return run_bye(&o);
    fprintf(stderr, "unknown command %s\n", o.cmd);
    return 2;
}
