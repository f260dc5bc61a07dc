/* Solo waiters over tcp (engine/tcp/tcp_wait.c, "Solo"): a thread waiting
 * alone on one initiator socket sleeps in a blocking recv on it, bounded
 * by TCP_SOLO_MS, and meanwhile nobody else reads that socket. A (this
 * process, one socket and one progress thread to B) and B (a child, the
 * target) check:
 *  - THREADS threads share that one socket: each round a WRITE of fresh
 *    bytes (8 B to 200 KiB) awaited blocking, then a READ of them back (the
 *    large ones read their header alone), every byte checked: a waiter in
 *    its recv takes the other threads' answers too, and they must end;
 *  - with B stopped (SIGSTOP) no answer comes: a WRITE with a 300 ms
 *    deadline ends -XFER_ETIMEDOUT within DEADLINE_SLACK_MS of it (as a
 *    batch and through xfer_write, whose waiter ends it at the deadline
 *    itself, not the deadline monitor), and one
 *    cancelled by another thread after 100 ms ends within that slack too
 *    (the waiter leaves its recv and sees its batch ended); after SIGCONT
 *    round trips work again;
 *  - B killed while A's waiter sleeps in recv: the WRITE fails (the end of
 *    the stream wakes the recv) well before its deadline.
 * The same again with XFER_TCP_SOLO=0 (waiters poll), which must behave
 * alike, and with XFER_TCP_ONE_READER=0 (every waiter of the socket reads
 * it, not only the first: tcp_wait.c "One reader"). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fork_pair.h"
#include "xfer.h"

#define THREADS           3
#define LANE              (512u << 10)
#define REGION            (THREADS * LANE)
#define DEADLINE          10000
#define DEADLINE_SLACK_MS 1500 /* generous for a loaded machine; TCP_SOLO_MS is 2 */
#define ONE_CALL_DEADLINE 1600 /* over the slack: a wait twice as long fails */

#if defined(__SANITIZE_ADDRESS__)
#define ROUNDS 300
#else
#define ROUNDS 1500
#endif

static xfer_engine *ea;
static xfer_region *ra;
static xfer_peer *pa;
static struct xfer_region_desc rdb;
static char fail_why[THREADS][160];

/* One socket, one progress thread: every waiter of A shares it. */
static int side_up(xfer_engine **e, xfer_peer **p, const char *me, int rfd, int wfd)
{
    return fp_side_up_n(e, p, me, rfd, wfd, 1, 1);
}

/* B: serves its region until A closes the pipe (or kills it). */
static int side_b(int rfd, int wfd, void *arg)
{
    (void)arg;
    xfer_engine *e;
    xfer_peer *p;
    xfer_region *r;
    struct xfer_region_desc d;
    if (side_up(&e, &p, "solo-b", rfd, wfd) < 0 ||
        xfer_region_alloc(e, "b", REGION, XFER_ACCESS_RW, &r) != 0)
        return 1;
    xfer_region_describe(r, &d);
    if (write(wfd, &d, sizeof(d)) != (ssize_t)sizeof(d))
        return 1;
    char c;
    while (read(rfd, &c, 1) > 0)
        ;
    xfer_engine_free(e);
    return 0;
}

static xfer_batch *one(enum xfer_op op, uint64_t off, uint64_t len)
{
    xfer_batch *b = xfer_batch_new(ea, NULL);
    struct xfer_item it = {op, ra, off, pa, rdb.id, rdb.gen, off, len};
    assert_true(xfer_batch_add(b, &it) >= 0);
    return b;
}

/* A blocking op of len bytes at off: its status. */
static int run_one(enum xfer_op op, uint64_t off, uint64_t len, int deadline)
{
    xfer_batch *b = one(op, off, len);
    int rc = xfer_batch_submit(b, deadline);
    if (rc == 0)
        rc = xfer_batch_wait(b, -1);
    xfer_batch_free(b);
    return rc;
}

static uint64_t rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void *racer(void *arg)
{
    int t = (int)(intptr_t)arg;
    uint64_t seed = 0x9e3779b97f4a7c15ull * (uint64_t)(t + 1);
    uint8_t *lane = (uint8_t *)xfer_region_ptr(ra) + (uint64_t)t * LANE;
    for (int k = 0; k < ROUNDS && !fail_why[t][0]; k++) {
        uint64_t len = k % 16 == 15 ? 65536 + rnd(&seed) % (200u << 10) : 8 + rnd(&seed) % 4096;
        uint8_t v = (uint8_t)rnd(&seed);
        memset(lane, v, len);
        uint64_t off = (uint64_t)t * LANE;
        int rc = run_one(XFER_OP_WRITE, off, len, DEADLINE);
        if (rc == 0) {
            memset(lane, (uint8_t)~v, len);
            rc = run_one(XFER_OP_READ, off, len, DEADLINE);
        }
        if (rc != 0) {
            snprintf(fail_why[t], sizeof(fail_why[t]), "round %d: %s", k, xfer_strerror(rc));
            break;
        }
        for (uint64_t i = 0; i < len; i++) {
            if (lane[i] != v) {
                snprintf(fail_why[t], sizeof(fail_why[t]), "round %d: byte %llu of %llu wrong", k,
                         (unsigned long long)i, (unsigned long long)len);
                break;
            }
        }
    }
    return NULL;
}

static void race(void)
{
    pthread_t th[THREADS];
    for (int t = 0; t < THREADS; t++)
        assert_int_equal(pthread_create(&th[t], NULL, racer, (void *)(intptr_t)t), 0);
    for (int t = 0; t < THREADS; t++)
        pthread_join(th[t], NULL);
    for (int t = 0; t < THREADS; t++) {
        if (fail_why[t][0])
            fail_msg("thread %d: %s", t, fail_why[t]);
    }
}

struct canceller {
    xfer_batch *b;
    int after_ms;
};

/* SIGSTOP takes effect asynchronously: until B is stopped it may answer. */
static void stop_b(pid_t pid)
{
    int st = 0;
    assert_int_equal(kill(pid, SIGSTOP), 0);
    assert_int_equal(waitpid(pid, &st, WUNTRACED), pid);
    assert_true(WIFSTOPPED(st));
}

static void *cancel_later(void *arg)
{
    struct canceller *c = arg;
    nanosleep(&(struct timespec){0, (long)c->after_ms * 1000000}, NULL);
    xfer_batch_cancel(c->b);
    return NULL;
}

/* With B stopped: a deadline, then a cancel, end the wait in time. */
static void stopped_peer(pid_t pid)
{
    assert_int_equal(run_one(XFER_OP_WRITE, 0, 8, DEADLINE), 0); /* a waiter was here */
    stop_b(pid);
    int64_t t0 = fp_now_ms();
    assert_int_equal(run_one(XFER_OP_WRITE, 0, 8, 300), -XFER_ETIMEDOUT);
    int64_t took = fp_now_ms() - t0;
    printf("deadline 300 ms: wait ended after %lld ms\n", (long long)took);
    if (took > 300 + DEADLINE_SLACK_MS)
        fail_msg("the deadline's wait took %lld ms", (long long)took);
    /* The one-call form: its run is on no deadline monitor, its waiter
     * ends it at the deadline (batch_submit_wait), not before and not a
     * deadline later (longer than the slack: a wait that counted its
     * time from after its receive took 2 x 1600 ms). */
    t0 = fp_now_ms();
    int one_rc = xfer_write(ea, ra, 0, pa, rdb.id, rdb.gen, 0, 8, ONE_CALL_DEADLINE);
    int64_t one_took = fp_now_ms() - t0; /* checked once B runs again (below) */
    printf("xfer_write, deadline %d ms: ended after %lld ms\n", ONE_CALL_DEADLINE,
           (long long)one_took);
    xfer_batch *b = one(XFER_OP_WRITE, 0, 8);
    assert_int_equal(xfer_batch_submit(b, DEADLINE), 0);
    struct canceller c = {b, 100};
    pthread_t th;
    t0 = fp_now_ms();
    assert_int_equal(pthread_create(&th, NULL, cancel_later, &c), 0);
    int rc = xfer_batch_wait(b, -1);
    took = fp_now_ms() - t0;
    assert_int_equal(kill(pid, SIGCONT), 0); /* the cancel may wait for B's fence answer */
    pthread_join(th, NULL);
    assert_int_equal(one_rc, -XFER_ETIMEDOUT);
    if (one_took < ONE_CALL_DEADLINE - 10 || one_took > ONE_CALL_DEADLINE + DEADLINE_SLACK_MS)
        fail_msg("xfer_write's deadline of %d ms ended after %lld ms", ONE_CALL_DEADLINE,
                 (long long)one_took);
    assert_int_equal(rc, -XFER_ECANCELED);
    printf("cancel after 100 ms: wait ended after %lld ms\n", (long long)took);
    if (took > 100 + DEADLINE_SLACK_MS)
        fail_msg("the cancelled wait took %lld ms", (long long)took);
    xfer_batch_free(b);
    for (int k = 0; k < 50; k++)
        assert_int_equal(run_one(XFER_OP_WRITE, (uint64_t)k * 64, 64, DEADLINE), 0);
}

/* B dies while A's waiter sleeps: the wait ends with an error, not at the
 * deadline. */
static void killed_peer(pid_t pid)
{
    assert_int_equal(run_one(XFER_OP_WRITE, 0, 8, DEADLINE), 0);
    stop_b(pid);
    xfer_batch *b = one(XFER_OP_WRITE, 0, 8);
    assert_int_equal(xfer_batch_submit(b, DEADLINE), 0);
    int64_t t0 = fp_now_ms();
    pid_t killer = fork();
    if (killer == 0) {
        nanosleep(&(struct timespec){0, 100000000}, NULL);
        kill(pid, SIGKILL);
        _exit(0);
    }
    assert_true(killer > 0);
    int rc = xfer_batch_wait(b, -1);
    int64_t took = fp_now_ms() - t0;
    waitpid(killer, NULL, 0);
    assert_int_not_equal(rc, 0);
    assert_int_not_equal(rc, -XFER_ETIMEDOUT);
    printf("B killed after 100 ms: wait ended after %lld ms\n", (long long)took);
    if (took > DEADLINE / 2)
        fail_msg("the wait after B died took %lld ms", (long long)took);
    xfer_batch_free(b);
}

static void run_all(void)
{
    memset(fail_why, 0, sizeof(fail_why));
    int rfd = -1, wfd = -1;
    pid_t pid = fp_fork(side_b, NULL, &rfd, &wfd);
    assert_true(pid > 0);
    assert_int_equal(side_up(&ea, &pa, "solo-a", rfd, wfd), 0);
    assert_int_equal(read(rfd, &rdb, sizeof(rdb)), (ssize_t)sizeof(rdb));
    assert_int_equal(xfer_peer_region_add(pa, &rdb), 0);
    assert_int_equal(xfer_region_alloc(ea, "a", REGION, XFER_ACCESS_RW, &ra), 0);
    race();
    stopped_peer(pid);
    race();
    killed_peer(pid);
    close(wfd);
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    close(rfd);
    xfer_engine_free(ea);
}

static void test_solo(void **state)
{
    (void)state;
    unsetenv("XFER_TCP_SOLO");
    run_all();
}

static void test_polling(void **state)
{
    (void)state;
    setenv("XFER_TCP_SOLO", "0", 1);
    run_all();
    unsetenv("XFER_TCP_SOLO");
}

static void test_every_waiter_reads(void **state)
{
    (void)state;
    setenv("XFER_TCP_ONE_READER", "0", 1);
    run_all();
    unsetenv("XFER_TCP_ONE_READER");
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_solo),
        cmocka_unit_test(test_polling),
        cmocka_unit_test(test_every_waiter_reads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
