/*
 * Notifications and two-sided messages (docs/notify.md), two engines in this
 * process over one transport (tcp loopback or ipc), each the other's peer:
 *   1. submit -> notification read at the target (a thread waiting in
 *      xfer_notif_wait, which reads the sender's socket itself;
 *      XFER_NOTIF_WAIT_RX=0: sleeps on xfer_notif_fd), for one WRITE item of 4 KiB and of 1 MiB
 * with a bound notification, against submit -> completion of the same batch without one (what a
 * sender learns without notifications);
 *   2. send/recv of 8 B: half a ping-pong round trip, against half the
 *      round trip of a one-sided 8 B WRITE + wait; then the same ping-pong
 *      with each side's next receive posted before its send (every message
 *      finds its receive: matched on arrival, answered without a FIN);
 *   3. 1 MiB messages, 4 in flight, receives posted ahead: GB/s against
 *      one-sided 1 MiB WRITEs, 4 in flight.
 * Medians of --iters runs (latency), best of --repeat (throughput).
 *
 *   bench_notify [--transport tcp|ipc|tcpx] [--iters N] [--seconds S] [--repeat N]
 *                [--json]
 *
 * --json prints one object (the same numbers) instead of the text lines;
 * bench/bench_all.py reads it for make bench's table.
 *
 * --only notify|sendrecv|sendrecv-pre runs that part alone, --iters times, without
 * spinning (the initiator waits in xfer_notif_wait): for
 * bench/callgrind_msg.sh, which counts instructions and system calls per
 * notified batch or per send/recv round trip (repeatable on a noisy VM).
 * --only notify-pp: a notification ping-pong (round trip of two standalone
 * notifications, each side waiting in xfer_notif_wait; no spinning).
 * --only notify-read runs part 1 at 4 KiB alone (a reader thread waits in
 * xfer_notif_wait before each batch is sent: context switches per batch).
 * --only sendrecv-local: the blocking 8 B ping-pong with XFER_SEND_LOCAL
 * SENDs (eager, locally completed: the opt-in of docs/notify.md).
 */
#include "bench_util.h"
#include "xfer.h"

#include <getopt.h>
#include <poll.h>
#include <sched.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define REGION (64ull << 20)
#define MIB    (1ull << 20)

/* What one run measured (µs, GB/s); printed as text or --json. */
static struct {
    double plain[2], notif[2]; /* [0] 4 KiB, [1] 1 MiB: submit->done, ->read */
    double sr_8, write_8;      /* one way */
    double sr_8_pre;           /* one way, each receive posted before the send it answers */
    double sr_gbps, write_gbps;
    bool json;
} res;

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_d);
    return v[n / 2];
}

struct side {
    const char *name;
    xfer_engine *e;
    xfer_region *r;
    xfer_peer *p; /* the other side */
    struct xfer_region_desc rd;
};

static int setup(struct side *s, const char *name, unsigned transports)
{
    struct xfer_engine_config cfg;
    xfer_engine_config_init(&cfg);
    cfg.node_id = s->name = name;
    cfg.transports = transports | XFER_TRANSPORT_TCP; /* tcp: the data port */
    int rc;
    s->e = xfer_engine_new(&cfg, &rc);
    if (!s->e || xfer_region_alloc(s->e, "buf", REGION, XFER_ACCESS_RW, &s->r) < 0) {
        fprintf(stderr, "bench: engine %s: %s\n", name, xfer_strerror(rc));
        return -1;
    }
    xfer_region_describe(s->r, &s->rd);
    return 0;
}

static int connect_pair(struct side *a, struct side *b, unsigned transports)
{
    struct side *v[2] = {a, b};
    for (int k = 0; k < 2; k++) {
        struct xfer_peer_desc d;
        xfer_engine_describe(v[1 - k]->e, &d);
        d.transports &= transports;
        if (xfer_peer_add(v[k]->e, &d, &v[k]->p) < 0 ||
            xfer_peer_region_add(v[k]->p, &v[1 - k]->rd) < 0) {
            fprintf(stderr, "bench: connect: %s\n", xfer_engine_last_error(v[k]->e));
            return -1;
        }
        if (xfer_peer_transport(v[k]->p) != transports) {
            fprintf(stderr, "bench: peer reached over transport 0x%x, wanted 0x%x\n",
                    xfer_peer_transport(v[k]->p), transports);
            return -1;
        }
    }
    return 0;
}

/* ---- 1. submit -> notification read ------------------------------------------------ */

struct reader {
    xfer_engine *e;
    const char *from; /* the sender's node id */
    volatile double t_read;
    volatile int seen, stop;
};

static void *reader_main(void *arg)
{
    struct reader *r = arg;
    while (!r->stop) {
        if (xfer_notif_wait(r->e, r->from, 100) <= 0)
            continue;
        struct xfer_notif *n[16];
        int got = xfer_notif_poll(r->e, n, 16);
        if (got > 0) {
            r->t_read = now_us();
            for (int i = 0; i < got; i++)
                xfer_notif_free(n[i]);
            __atomic_add_fetch(&r->seen, got, __ATOMIC_RELEASE);
        }
    }
    return NULL;
}

static void bench_notify(struct side *I, struct side *T, uint64_t size, int iters, int slot)
{
    struct reader rd = {.e = T->e, .from = I->name};
    pthread_t th;
    pthread_create(&th, NULL, reader_main, &rd);
    double *with = calloc((size_t)iters, sizeof(double)), *with_done = calloc((size_t)iters, 8),
           *without = calloc((size_t)iters, sizeof(double));
    struct xfer_item it = {XFER_OP_WRITE, I->r, 0, I->p, T->rd.id, T->rd.gen, 0, size};
    for (int k = 0; k < iters; k++) {
        xfer_batch *b = xfer_batch_new(I->e, NULL);
        xfer_batch_add(b, &it);
        double t0 = now_us();
        xfer_batch_submit(b, 10000);
        xfer_batch_wait(b, -1);
        without[k] = now_us() - t0;
        xfer_batch_free(b);

        b = xfer_batch_new(I->e, NULL);
        xfer_batch_add(b, &it);
        xfer_batch_notify(b, I->p, "ready", 5);
        int before = __atomic_load_n(&rd.seen, __ATOMIC_ACQUIRE);
        t0 = now_us();
        xfer_batch_submit(b, 10000);
        while (__atomic_load_n(&rd.seen, __ATOMIC_ACQUIRE) == before)
            sched_yield(); /* the reader thread stamps the moment it read it; the
                            * yield leaves the transport's threads a core on a
                            * small host (tcpx's progress thread starved: 6 ms) */
        with[k] = rd.t_read - t0;
        xfer_batch_wait(b, -1);
        with_done[k] = now_us() - t0;
        xfer_batch_free(b);
    }
    rd.stop = 1;
    pthread_join(th, NULL);
    double m0 = median(without, iters), m1 = median(with, iters), m2 = median(with_done, iters);
    res.plain[slot] = m0;
    res.notif[slot] = m1;
    if (!res.json)
        printf("  WRITE %7llu B: submit->done %8.1f us | with notification: submit->read at target "
               "%8.1f us (+%.1f), submit->done %8.1f us\n",
               (unsigned long long)size, m0, m1, m1 - m0, m2);
    free(with);
    free(with_done);
    free(without);
}

/* --only notify: one 4 KiB WRITE with a bound notification, read at T by
 * this thread (no reader thread, no spinning): a fixed amount of work per
 * batch for instruction counts. */
static int count_notify(struct side *I, struct side *T, int iters)
{
    struct xfer_item it = {XFER_OP_WRITE, I->r, 0, I->p, T->rd.id, T->rd.gen, 0, 4096};
    for (int k = 0; k < iters; k++) {
        xfer_batch *b = xfer_batch_new(I->e, NULL);
        struct xfer_notif *n = NULL;
        xfer_batch_add(b, &it);
        xfer_batch_notify(b, I->p, "ready", 5);
        xfer_batch_submit(b, 10000);
        while (xfer_notif_wait(T->e, I->name, 10000) > 0 && xfer_notif_poll(T->e, &n, 1) == 0)
            ;
        int rc = xfer_batch_wait(b, -1);
        xfer_batch_free(b);
        if (!n || rc != 0) {
            fprintf(stderr, "bench: notified batch %d failed: %s\n", k, xfer_strerror(rc));
            return 1;
        }
        xfer_notif_free(n);
    }
    return 0;
}

/* --only notify-pp: a notification ping-pong, every wait blocking. Each
 * side sends a standalone notification without waiting for its
 * acknowledgement (a batch with no items and one binding), then waits for
 * the other's in xfer_notif_wait; the acknowledgement is collected after.
 * A round trip is two notifications: the number issue 15 compares with
 * the raw TCP ping-pong. */
static xfer_batch *note_send(struct side *s)
{
    xfer_batch *b = xfer_batch_new(s->e, NULL);
    if (b && (xfer_batch_notify(b, s->p, "pp", 2) < 0 || xfer_batch_submit(b, 10000) < 0)) {
        xfer_batch_free(b);
        b = NULL;
    }
    return b;
}

/* Waits for one notification from `from`, then for the acknowledgement of
 * prev (this side's last one): 0 or < 0. */
static int note_take(struct side *s, const char *from, xfer_batch *prev)
{
    struct xfer_notif *n = NULL;
    while (!n && xfer_notif_wait(s->e, from, 10000) > 0)
        xfer_notif_poll(s->e, &n, 1);
    int rc = n ? 0 : -1;
    xfer_notif_free(n);
    if (prev && xfer_batch_wait(prev, -1) != 0)
        rc = -1;
    xfer_batch_free(prev);
    return rc;
}

struct note_echo {
    struct side *I, *T;
    int iters;
};

static void *note_echo_main(void *arg)
{
    struct note_echo *x = arg;
    xfer_batch *prev = NULL;
    for (int k = 0; k < x->iters; k++) {
        if (note_take(x->T, x->I->name, prev) != 0 || !(prev = note_send(x->T))) {
            fprintf(stderr, "bench: notification echo failed at %d\n", k);
            break;
        }
    }
    if (prev)
        xfer_batch_wait(prev, -1);
    xfer_batch_free(prev);
    return NULL;
}

static int bench_note_pp(struct side *I, struct side *T, int iters)
{
    double *v = calloc((size_t)iters, sizeof(double));
    struct note_echo x = {I, T, iters};
    pthread_t th;
    pthread_create(&th, NULL, note_echo_main, &x);
    int rc = 0;
    for (int k = 0; k < iters; k++) {
        double t0 = now_us();
        xfer_batch *b = note_send(I);
        if (!b || note_take(I, T->name, b) != 0) {
            fprintf(stderr, "bench: notification ping failed at %d\n", k);
            rc = 1;
            break;
        }
        v[k] = now_us() - t0;
    }
    pthread_join(th, NULL);
    if (!rc && !res.json)
        printf("  notification round trip (ping-pong) %7.1f us\n", median(v, iters));
    free(v);
    return rc;
}

/* ---- 2. 8 B latency ------------------------------------------------------------------- */

struct echo {
    struct side *T;
    int iters;
    bool pre;
};

/* --only sendrecv-local: the blocking ping-pong's SENDs are XFER_SEND_LOCAL
 * (eager, locally completed: docs/notify.md). */
static unsigned send_flags;

/* BENCH_PIN (bench_util.h) takes effect after this many round trips: the
 * engines' threads made on the way (inheriting the caller's CPU set) are
 * there by then. */
#define PIN_AFTER 100

/* A RECV batch submitted now, waited for later. */
static xfer_batch *recv_post(struct side *s, uint64_t off, uint64_t tag)
{
    xfer_batch *b = xfer_batch_new(s->e, NULL);
    if (b &&
        (xfer_batch_add_recv(b, s->r, off, 64, s->p, tag) < 0 || xfer_batch_submit(b, 10000) < 0)) {
        xfer_batch_free(b);
        b = NULL;
    }
    return b;
}

/* Waits for and frees a posted RECV: 0 and the bytes received, or < 0. */
static int recv_end(xfer_batch *b, uint64_t *got)
{
    int rc = b ? xfer_batch_wait(b, -1) : -1;
    *got = rc == 0 ? xfer_batch_item_bytes(b, 0) : 0;
    xfer_batch_free(b);
    return rc;
}

/* The echo with its next receive posted before it answers: every message
 * finds its receive posted (matched on arrival, no FIN). */
static void echo_pre(struct echo *x)
{
    xfer_batch *rb = recv_post(x->T, 0, 1);
    for (int k = 0; k < x->iters; k++) {
        uint64_t got;
        if (k == PIN_AFTER)
            bench_pin(1);
        int rc = recv_end(rb, &got);
        rb = k + 1 < x->iters ? recv_post(x->T, 0, 1) : NULL;
        if (rc != 0 || xfer_send(x->T->e, x->T->r, 128, got, x->T->p, 2, 10000) != 0) {
            fprintf(stderr, "bench: echo failed at %d\n", k);
            break;
        }
    }
    xfer_batch_free(rb);
}

static void *echo_main(void *arg)
{
    struct echo *x = arg;
    if (x->pre) {
        echo_pre(x);
        return NULL;
    }
    for (int k = 0; k < x->iters; k++) {
        uint64_t got;
        if (k == PIN_AFTER)
            bench_pin(1);
        if (xfer_recv(x->T->e, x->T->r, 0, 64, x->T->p, 1, &got, 10000) != 0 ||
            xfer_send_flags(x->T->e, x->T->r, 0, got, x->T->p, 2, send_flags, 10000) != 0) {
            fprintf(stderr, "bench: echo failed at %d\n", k);
            break;
        }
    }
    return NULL;
}

/* Returns 0 if every round trip went through; with_write adds the WRITE
 * comparison and prints. */
static int bench_latency(struct side *I, struct side *T, int iters, bool with_write, bool pre)
{
    int rc = 0;
    double *v = calloc((size_t)iters, sizeof(double)), *w = calloc((size_t)iters, 8);
    struct echo x = {T, iters, pre};
    pthread_t th;
    pthread_create(&th, NULL, echo_main, &x);
    for (int k = 0; k < iters; k++) {
        uint64_t got;
        if (k == PIN_AFTER)
            bench_pin(0);
        double t0 = now_us();
        xfer_batch *rb = pre ? recv_post(I, 64, 2) : NULL;
        if (xfer_send_flags(I->e, I->r, 0, 8, I->p, 1, send_flags, 10000) != 0 ||
            (pre ? recv_end(rb, &got) : xfer_recv(I->e, I->r, 64, 64, I->p, 2, &got, 10000)) != 0) {
            fprintf(stderr, "bench: ping failed at %d\n", k);
            rc = 1;
            break;
        }
        v[k] = (now_us() - t0) / 2;
    }
    pthread_join(th, NULL);
    for (int k = 0; with_write && k < iters; k++) {
        double t0 = now_us();
        xfer_write(I->e, I->r, 0, I->p, T->rd.id, T->rd.gen, 0, 8, 10000);
        w[k] = (now_us() - t0) / 2;
    }
    *(pre ? &res.sr_8_pre : &res.sr_8) = median(v, iters);
    if (with_write)
        res.write_8 = median(w, iters);
    if (!res.json && with_write)
        printf("  8 B: send/recv one way (ping-pong / 2) %7.1f us | WRITE + wait / 2 %7.1f us\n",
               res.sr_8, res.write_8);
    if (!res.json && !with_write && !pre) /* --only sendrecv */
        printf("  8 B: send/recv one way (ping-pong / 2) %7.1f us\n", res.sr_8);
    if (!res.json && pre)
        printf("  8 B: send/recv one way, receives posted ahead %7.1f us\n", res.sr_8_pre);
    free(v);
    free(w);
    return rc;
}

/* ---- 3. 1 MiB throughput --------------------------------------------------------------- */

struct sink {
    struct side *T;
    double seconds;
    volatile int stop;
};

static void *sink_main(void *arg)
{
    struct sink *s = arg;
    xfer_batch *b[4];
    for (int k = 0; k < 4; k++) {
        b[k] = xfer_batch_new(s->T->e, NULL);
        xfer_batch_add_recv(b[k], s->T->r, (uint64_t)k * MIB, MIB, s->T->p, 7);
        xfer_batch_submit(b[k], 30000);
    }
    for (int k = 0; !s->stop; k = (k + 1) % 4) {
        if (xfer_batch_wait(b[k], 200) == -XFER_EINPROGRESS)
            continue;
        xfer_batch_submit(b[k], 30000);
    }
    for (int k = 0; k < 4; k++)
        xfer_batch_free(b[k]);
    return NULL;
}

static double pump(struct side *I, struct side *T, enum xfer_op op, double seconds)
{
    xfer_batch *b[4];
    for (int k = 0; k < 4; k++) {
        b[k] = xfer_batch_new(I->e, NULL);
        if (op == XFER_OP_SEND) {
            xfer_batch_add_send(b[k], I->r, (uint64_t)k * MIB, MIB, I->p, 7);
        } else {
            struct xfer_item it = {XFER_OP_WRITE, I->r,      (uint64_t)k * MIB, I->p,
                                   T->rd.id,      T->rd.gen, (uint64_t)k * MIB, MIB};
            xfer_batch_add(b[k], &it);
        }
        xfer_batch_submit(b[k], 30000);
    }
    uint64_t n = 0;
    double t0 = now_us(), t = t0;
    for (int k = 0; t - t0 < seconds * 1e6; k = (k + 1) % 4) {
        if (xfer_batch_wait(b[k], -1) != 0)
            break;
        n++;
        t = now_us();
        xfer_batch_submit(b[k], 30000);
    }
    for (int k = 0; k < 4; k++) {
        xfer_batch_wait(b[k], -1);
        xfer_batch_free(b[k]);
    }
    return (double)n * MIB / ((t - t0) * 1e3);
}

static void bench_throughput(struct side *I, struct side *T, double seconds, int repeat)
{
    double best_s = 0, best_w = 0;
    for (int r = 0; r < repeat; r++) {
        struct sink s = {T, seconds, 0};
        pthread_t th;
        pthread_create(&th, NULL, sink_main, &s);
        double g = pump(I, T, XFER_OP_SEND, seconds);
        s.stop = 1;
        pthread_join(th, NULL);
        best_s = g > best_s ? g : best_s;
        g = pump(I, T, XFER_OP_WRITE, seconds);
        best_w = g > best_w ? g : best_w;
    }
    res.sr_gbps = best_s;
    res.write_gbps = best_w;
    if (!res.json)
        printf("  1 MiB, 4 in flight: send/recv %6.2f GB/s | WRITE %6.2f GB/s\n", best_s, best_w);
}

int main(int argc, char **argv)
{
    const char *tr = "tcp", *only = NULL;
    int iters = 200, repeat = 3;
    double seconds = 0.5;
    static const struct option lo[] = {{"transport", 1, 0, 't'},
                                       {"iters", 1, 0, 'i'},
                                       {"seconds", 1, 0, 's'},
                                       {"repeat", 1, 0, 'r'},
                                       {"json", 0, 0, 'j'},
                                       {"only", 1, 0, 'o'},
                                       {0, 0, 0, 0}};
    for (int c; (c = getopt_long(argc, argv, "", lo, NULL)) != -1;) {
        switch (c) {
        case 't':
            tr = optarg;
            break;
        case 'i':
            iters = atoi(optarg);
            break;
        case 's':
            seconds = atof(optarg);
            break;
        case 'r':
            repeat = atoi(optarg);
            break;
        case 'j':
            res.json = true;
            break;
        case 'o':
            only = optarg;
            break;
        default:
            return 2;
        }
    }
    unsigned mask;
    if (xfer_transports_parse(tr, &mask) < 0 ||
        (mask != XFER_TRANSPORT_TCP && mask != XFER_TRANSPORT_IPC && mask != XFER_TRANSPORT_TCPX)) {
        fprintf(stderr, "bench_notify: --transport tcp, ipc or tcpx (XFER_TCPX_PLUGIN)\n");
        return 2;
    }
    struct side I = {0}, T = {0};
    if (setup(&I, "bench-init", mask) < 0 || setup(&T, "bench-target", mask) < 0 ||
        connect_pair(&I, &T, mask) < 0)
        return 1;
    if (only) {
        int rc = 2;
        if (!strcmp(only, "notify"))
            rc = count_notify(&I, &T, iters);
        else if (!strcmp(only, "notify-pp"))
            rc = bench_note_pp(&I, &T, iters);
        else if (!strcmp(only, "notify-read")) {
            bench_notify(&I, &T, 4096, iters, 0);
            rc = 0;
        } else if (!strcmp(only, "sendrecv"))
            rc = bench_latency(&I, &T, iters, false, false);
        else if (!strcmp(only, "sendrecv-pre"))
            rc = bench_latency(&I, &T, iters, false, true);
        else if (!strcmp(only, "sendrecv-local")) {
            send_flags = XFER_SEND_LOCAL;
            rc = bench_latency(&I, &T, iters, false, false);
        } else
            fprintf(
                stderr,
                "bench_notify: --only notify, notify-read, notify-pp, sendrecv, sendrecv-pre or "
                "sendrecv-local\n");
        xfer_engine_free(I.e);
        xfer_engine_free(T.e);
        return rc;
    }
    if (!res.json)
        printf("%s:\n", tr);
    bench_notify(&I, &T, 4096, iters, 0);
    bench_notify(&I, &T, MIB, iters / 4 > 10 ? iters / 4 : 10, 1);
    bench_latency(&I, &T, iters, true, false);
    bench_latency(&I, &T, iters, false, true);
    bench_throughput(&I, &T, seconds, repeat);
    if (res.json)
        printf("{\"transport\":\"%s\",\"write_4k_us\":%.2f,\"notif_4k_us\":%.2f,"
               "\"write_1m_us\":%.2f,\"notif_1m_us\":%.2f,\"sendrecv_8_us\":%.2f,"
               "\"write_8_us\":%.2f,\"sendrecv_8_pre_us\":%.2f,\"sendrecv_1m_gbps\":%.3f,"
               "\"write_1m_gbps\":%.3f}\n",
               tr, res.plain[0], res.notif[0], res.plain[1], res.notif[1], res.sr_8, res.write_8,
               res.sr_8_pre, res.sr_gbps, res.write_gbps);
    xfer_engine_free(I.e);
    xfer_engine_free(T.e);
    return 0;
}
