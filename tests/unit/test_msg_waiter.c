/* Waiter-driven receive of messages over tcp (engine/tcp/tcp_wait.c) and ipc
 * (engine/ipc/ipc_serve_rx.c): the thread waiting for a SEND or RECV reads the
 * accepted socket its peer's messages arrive on, while that socket's progress
 * (tcp) or serving (ipc) thread wants it too. Two engines in this process, one
 * socket each way (so WRITE payloads and message frames share it), two
 * progress threads each; over ipc once with direct copies and once without
 * (XFER_IPC_DIRECT=0: every WRITE is a MAP/ACQ/REL exchange on the socket the
 * messages arrive on, which a waiter may serve), and once with waiters that
 * busy-poll the socket first (XFER_BUSY_POLL_US). Each round, each side may put a WRITE batch
 * (sizes from 1 B to 300 KiB, some cancelled at once, some with an item the target refuses: its
 * payload is discarded there, which a waiter leaves to the owner) on the socket right before its
 * message; A sends a message of a random size (eager and rendezvous), B receives it (blocking, or
 * posted ahead, or from any peer through the batch's fd: no waiter reads then) and echoes it. Every
 * message byte and every WRITE byte that landed is checked. Nothing else is
 * sent between rounds, so a frame that neither a waiter nor the owner reads
 * stalls the round: the deadline fails it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "xfer.h"

#define MIB      (1ull << 20)
#define MSG_OUT  0         /* messages sent from here */
#define MSG_IN   (4 * MIB) /* and received here */
#define LANES    (8 * MIB) /* WRITEs from the other side land here */
#define LANE     (2 * MIB) /* one lane per item of a batch */
#define NLANES   4
#define REGION   (16 * MIB)
#define DEADLINE 5000
#define REFUSED  (1ull << 62) /* in lens[]: an item the target refuses */

#if defined(__SANITIZE_ADDRESS__)
#define ROUNDS 400
#else
#define ROUNDS 2000
#endif

struct side {
    xfer_engine *e;
    xfer_region *r, *src; /* src: WRITE payloads, laid out like the lanes */
    xfer_peer *p;
    struct xfer_region_desc rd;
    struct side *other;
    struct xfer_region_desc gone; /* a region of this side, deregistered */
    uint64_t rng;
    int fails;
};

static uint64_t rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static uint8_t pat(uint64_t seed, uint64_t i)
{
    return (uint8_t)((seed * 0x9e3779b97f4a7c15ull + i * 131) >> 29);
}

static uint8_t *mem(xfer_region *r, uint64_t off)
{
    return (uint8_t *)xfer_region_ptr(r) + off;
}

static unsigned transports = XFER_TRANSPORT_TCP; /* of the test running */

static void side_new(struct side *s, const char *name, uint64_t seed)
{
    struct xfer_engine_config cfg;
    xfer_engine_config_init(&cfg);
    cfg.node_id = name;
    cfg.transports = transports;
    cfg.sockets_per_peer = 1;
    cfg.progress_threads = 2;
    int rc;
    s->e = xfer_engine_new(&cfg, &rc);
    assert_non_null(s->e);
    assert_int_equal(xfer_region_alloc(s->e, "buf", REGION, XFER_ACCESS_RW, &s->r), 0);
    assert_int_equal(xfer_region_alloc(s->e, "src", LANES, XFER_ACCESS_RW, &s->src), 0);
    xfer_region_describe(s->r, &s->rd);
    xfer_region *g;
    assert_int_equal(xfer_region_alloc(s->e, "gone", LANE, XFER_ACCESS_RW, &g), 0);
    xfer_region_describe(g, &s->gone);
    assert_int_equal(xfer_region_deregister(s->e, g), 0);
    s->rng = seed;
}

static void side_connect(struct side *s, struct side *o)
{
    struct xfer_peer_desc d;
    xfer_engine_describe(o->e, &d);
    assert_int_equal(xfer_peer_add(s->e, &d, &s->p), 0);
    assert_int_equal(xfer_peer_region_add(s->p, &o->rd), 0);
    assert_int_equal(xfer_peer_region_add(s->p, &o->gone), 0); /* refused there */
    s->other = o;
}

/* A WRITE batch of 1..NLANES items into the other side's lanes, submitted
 * (and maybe cancelled at once); *n and lens say what to check. NULL: none
 * this round. */
static xfer_batch *write_start(struct side *s, uint64_t round, uint64_t *offs, uint64_t *lens,
                               size_t *n, bool *cancelled)
{
    if (rnd(&s->rng) % 3 == 0)
        return NULL;
    xfer_batch *b = xfer_batch_new(s->e, NULL);
    *n = 1 + rnd(&s->rng) % NLANES;
    for (size_t j = 0; j < *n; j++) {
        uint64_t k = rnd(&s->rng) % 3;
        lens[j] = k == 0   ? 1 + rnd(&s->rng) % 64
                  : k == 1 ? 4096 + rnd(&s->rng) % 12288
                           : 32768 + rnd(&s->rng) % (300 * 1024 - 32768);
        offs[j] = j * LANE + rnd(&s->rng) % (LANE - lens[j]);
        for (uint64_t i = 0; i < lens[j]; i++)
            mem(s->src, offs[j])[i] = pat(round * 8 + j, i);
        struct xfer_item it = {XFER_OP_WRITE,   s->src,           offs[j],         s->p,
                               s->other->rd.id, s->other->rd.gen, LANES + offs[j], lens[j]};
        if (j > 0 && rnd(&s->rng) % 6 == 0) { /* refused: its payload is discarded */
            it.remote_id = s->other->gone.id;
            it.remote_gen = s->other->gone.gen;
            it.remote_off = offs[j] - j * LANE;
            lens[j] |= REFUSED;
        }
        assert_true(xfer_batch_add(b, &it) >= 0);
    }
    assert_int_equal(xfer_batch_submit(b, DEADLINE), 0);
    *cancelled = lens[0] > 65536 && rnd(&s->rng) % 4 == 0;
    if (*cancelled)
        xfer_batch_cancel(b);
    return b;
}

static void write_end(struct side *s, xfer_batch *b, uint64_t round, const uint64_t *offs,
                      const uint64_t *lens, size_t n, bool cancelled)
{
    if (!b)
        return;
    int rc = xfer_batch_wait(b, -1);
    if (cancelled && rc < 0) {
        xfer_batch_free(b);
        return; /* what landed is undefined */
    }
    for (size_t j = 0; j < n; j++) {
        const uint8_t *got = mem(s->other->r, LANES + offs[j]);
        int st = xfer_batch_item_status(b, j);
        if (lens[j] & REFUSED) {
            if (st == 0)
                fail_msg("round %llu item %zu: WRITE to a deregistered region succeeded",
                         (unsigned long long)round, j);
            continue;
        }
        if (st != 0)
            fail_msg("round %llu item %zu: %s", (unsigned long long)round, j, xfer_strerror(st));
        for (uint64_t i = 0; i < lens[j]; i++)
            if (got[i] != pat(round * 8 + j, i))
                fail_msg("round %llu item %zu: WRITE byte %llu of %llu differs",
                         (unsigned long long)round, j, (unsigned long long)i,
                         (unsigned long long)lens[j]);
    }
    xfer_batch_free(b);
}

/* A RECV from any peer (no waiter-driven read: msg_many), waited for
 * through the batch's fd: only the socket's owner can deliver it, so an
 * edge its owner left to an earlier waiter that this one did not read
 * stalls it. */
static int recv_by_fd(struct side *s, uint64_t off, uint64_t *got)
{
    xfer_batch *b = xfer_batch_new(s->e, NULL);
    xfer_batch_add_recv(b, s->r, off, 65536, NULL, XFER_MSG_TAG_ANY);
    int rc = xfer_batch_submit(b, DEADLINE);
    struct pollfd p = {.fd = xfer_batch_fd(b), .events = POLLIN};
    if (rc == 0)
        while ((rc = xfer_batch_wait(b, 0)) == -XFER_EINPROGRESS)
            if (poll(&p, 1, 2 * DEADLINE) != 1)
                break;
    *got = rc == 0 ? xfer_batch_item_bytes(b, 0) : 0;
    xfer_batch_free(b);
    return rc;
}

static void check_msg(struct side *s, uint64_t off, uint64_t round, uint64_t len, uint64_t got)
{
    if (got != len)
        fail_msg("round %llu: message of %llu bytes received as %llu", (unsigned long long)round,
                 (unsigned long long)len, (unsigned long long)got);
    for (uint64_t i = 0; i < len; i++)
        if (mem(s->r, off)[i] != pat(round ^ 0x55, i))
            fail_msg("round %llu: message byte %llu of %llu differs", (unsigned long long)round,
                     (unsigned long long)i, (unsigned long long)len);
}

/* B: receives each message from A (blocking or posted ahead), checks it,
 * echoes it back, with its own WRITEs to A in between. */
static void *echo_main(void *arg)
{
    struct side *s = arg;
    uint64_t offs[NLANES], lens[NLANES];
    for (uint64_t k = 0; k < ROUNDS; k++) {
        uint64_t in = MSG_IN + (k % 8) * 65536, got = 0;
        int rc;
        uint64_t how = rnd(&s->rng) % 3;
        if (how == 0) {
            rc = xfer_recv(s->e, s->r, in, 65536, s->p, k, &got, DEADLINE);
        } else if (how == 1) {
            rc = recv_by_fd(s, in, &got);
        } else {
            xfer_batch *b = xfer_batch_new(s->e, NULL);
            xfer_batch_add_recv(b, s->r, in, 65536, s->p, XFER_MSG_TAG_ANY);
            rc = xfer_batch_submit(b, DEADLINE);
            if (rc == 0)
                rc = xfer_batch_wait(b, -1);
            got = rc == 0 ? xfer_batch_item_bytes(b, 0) : 0;
            xfer_batch_free(b);
        }
        if (rc != 0) {
            fprintf(stderr, "B: receive (%d) of round %llu: %s\n", (int)how, (unsigned long long)k,
                    xfer_strerror(rc));
            s->fails++;
            return NULL;
        }
        size_t n = 0;
        bool cancelled = false;
        xfer_batch *w = write_start(s, k + ROUNDS, offs, lens, &n, &cancelled);
        rc = xfer_send(s->e, s->r, in, got, s->p, k, DEADLINE);
        write_end(s, w, k + ROUNDS, offs, lens, n, cancelled);
        if (rc != 0) {
            fprintf(stderr, "B: echo of round %llu: %s\n", (unsigned long long)k,
                    xfer_strerror(rc));
            s->fails++;
            return NULL;
        }
    }
    return NULL;
}

static void messages_and_writes(void)
{
    uint64_t seed = (uint64_t)time(NULL) | 1;
    const char *env = getenv("XFER_TEST_SEED");
    if (env)
        seed = strtoull(env, NULL, 0) | 1;
    printf("seed %llu, %d rounds\n", (unsigned long long)seed, ROUNDS);
    struct side A = {0}, B = {0};
    side_new(&A, "waiter-a", seed);
    side_new(&B, "waiter-b", seed * 3);
    side_connect(&A, &B);
    side_connect(&B, &A);
    unsigned want = transports & XFER_TRANSPORT_IPC ? XFER_TRANSPORT_IPC : XFER_TRANSPORT_TCP;
    assert_int_equal(xfer_peer_connect(A.p), 0);
    assert_int_equal(xfer_peer_connect(B.p), 0);
    assert_int_equal(xfer_peer_transport(A.p), want);
    assert_int_equal(xfer_peer_transport(B.p), want);
    pthread_t th;
    pthread_create(&th, NULL, echo_main, &B);
    uint64_t offs[NLANES], lens[NLANES];
    for (uint64_t k = 0; k < ROUNDS && !B.fails; k++) {
        uint64_t len = rnd(&A.rng) % 3 ? rnd(&A.rng) % 8193 : 8193 + rnd(&A.rng) % 40000;
        uint64_t out = MSG_OUT + (k % 8) * 65536, back = MSG_IN + (k % 8) * 65536;
        for (uint64_t i = 0; i < len; i++)
            mem(A.r, out)[i] = pat(k ^ 0x55, i);
        memset(mem(A.r, back), 0xee, len);
        xfer_batch *rb = NULL;
        if (rnd(&A.rng) % 2) { /* the echo's receive posted ahead */
            rb = xfer_batch_new(A.e, NULL);
            xfer_batch_add_recv(rb, A.r, back, 65536, A.p, k);
            assert_int_equal(xfer_batch_submit(rb, DEADLINE), 0);
        }
        size_t n = 0;
        bool cancelled = false;
        xfer_batch *w = write_start(&A, k, offs, lens, &n, &cancelled);
        int rc = xfer_send(A.e, A.r, out, len, A.p, k, DEADLINE);
        if (rc != 0)
            fail_msg("A: send of round %llu: %s", (unsigned long long)k, xfer_strerror(rc));
        uint64_t got = 0;
        if (rb) {
            rc = xfer_batch_wait(rb, -1);
            got = rc == 0 ? xfer_batch_item_bytes(rb, 0) : 0;
            xfer_batch_free(rb);
        } else if (rnd(&A.rng) % 2) {
            rc = recv_by_fd(&A, back, &got);
        } else {
            rc = xfer_recv(A.e, A.r, back, 65536, A.p, k, &got, DEADLINE);
        }
        if (rc != 0)
            fail_msg("A: echo of round %llu: %s", (unsigned long long)k, xfer_strerror(rc));
        check_msg(&A, back, k, len, got);
        write_end(&A, w, k, offs, lens, n, cancelled);
    }
    pthread_join(th, NULL);
    assert_int_equal(B.fails, 0);
    xfer_engine_free(A.e);
    xfer_engine_free(B.e);
}

static void test_tcp(void **state)
{
    (void)state;
    transports = XFER_TRANSPORT_TCP;
    messages_and_writes();
}

static void test_ipc(void **state)
{
    (void)state;
    transports = XFER_TRANSPORT_IPC | XFER_TRANSPORT_TCP; /* ipc is preferred */
    setenv("XFER_IPC_DIRECT", "1", 1);
    messages_and_writes();
}

static void test_ipc_nodirect(void **state)
{
    (void)state;
    transports = XFER_TRANSPORT_IPC | XFER_TRANSPORT_TCP;
    setenv("XFER_IPC_DIRECT", "0", 1); /* read per loan and connection */
    messages_and_writes();
    unsetenv("XFER_IPC_DIRECT");
}

static void test_ipc_spin(void **state)
{
    (void)state;
    transports = XFER_TRANSPORT_IPC | XFER_TRANSPORT_TCP;
    setenv("XFER_BUSY_POLL_US", "20", 1); /* waiters spin on the socket first */
    messages_and_writes();
    unsetenv("XFER_BUSY_POLL_US");
}

int main(void)
{
    setenv("XFER_WAIT_RX_IN", "1", 1); /* the default, whatever the environment says */
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_tcp), cmocka_unit_test(test_ipc),
                                       cmocka_unit_test(test_ipc_nodirect),
                                       cmocka_unit_test(test_ipc_spin)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
