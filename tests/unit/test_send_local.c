/* XFER_SEND_LOCAL over tcp between two processes (docs/notify.md, "Eager,
 * locally completed"): the SEND ends once its frame is written, the
 * receiver sends neither an answer nor a FIN. A (this process) and B (a
 * child) check, in order:
 *  - a blocking ping-pong of local SENDs and RECVs, every byte checked;
 *  - a local SEND larger than the RECV: A's SEND ends 0, B's RECV
 *    -XFER_ETRUNC, and the next message is received whole; the same at
 *    the eager limit (XFER_MSG_EAGER_MAX bytes into one byte less, then
 *    into enough);
 *  - local and default SENDs with one tag are received in the order sent;
 *  - back-pressure: with B not receiving, A's XFER_MSG_UNEXPECTED_MAX + 8
 *    local SENDs all end 0 (a default SEND would get -XFER_ENOSPC); then a
 *    notification (same socket, after them) tells B they are all in: B
 *    receives exactly the first 4096, in order, and the next RECV times out;
 *  - arguments: more than XFER_MSG_EAGER_MAX bytes or unknown flags are
 *    -XFER_EINVAL.
 * Run twice: as built (both send the short RTS, XFER_MSG_F_SHORT), and with
 * A sending the long form an engine before the short RTS sent
 * (XFER_MSG_SHORT=0 in A only): B takes both forms. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fork_pair.h"
#include "xfer.h"

#define DEADLINE 5000
#define QMAX     4096 /* XFER_MSG_UNEXPECTED_MAX */
#define EXTRA    8

#if defined(__SANITIZE_ADDRESS__)
#define ROUNDS 300
#else
#define ROUNDS 1000
#endif

/* A local SEND of n bytes (pattern seed) from r's offset 0. */
static int send_local(xfer_engine *e, xfer_region *r, xfer_peer *p, uint64_t tag, uint32_t n,
                      uint32_t seed)
{
    fp_fill(xfer_region_ptr(r), n, seed);
    return xfer_send_flags(e, r, 0, n, p, tag, XFER_SEND_LOCAL, DEADLINE);
}

/* B's receive of a message of n bytes (pattern seed) with tag: 0 or why. */
static const char *recv_check(xfer_engine *e, xfer_region *r, xfer_peer *p, uint64_t tag,
                              uint32_t n, uint32_t seed)
{
    return fp_recv_check(e, r, p, tag, n, seed, DEADLINE);
}

/* B: exit status 0, or 1 with why on stderr. */
static int side_b(int rfd, int wfd, void *arg)
{
    (void)arg;
    xfer_engine *e;
    xfer_peer *p;
    xfer_region *r;
    if (fp_side_up(&e, &p, "local-b", rfd, wfd) < 0 ||
        xfer_region_alloc(e, "b", 1 << 17, XFER_ACCESS_RW, &r) != 0)
        return 1;
    const char *why = NULL;
    int k = 0;
    for (; k < ROUNDS && !why; k++) { /* ping-pong */
        why = recv_check(e, r, p, 1, 8 + k % 200, (uint32_t)k);
        if (!why && send_local(e, r, p, 2, 8 + k % 300, (uint32_t)k + 7) != 0)
            why = "send failed";
    }
    uint64_t got;
    if (!why && xfer_recv(e, r, 65536, 10, p, 3, &got, DEADLINE) != -XFER_ETRUNC)
        why = "a 100 B message into 10 B did not end -XFER_ETRUNC";
    if (!why)
        why = recv_check(e, r, p, 3, 5, 33);
    if (!why &&
        xfer_recv(e, r, 65536, XFER_MSG_EAGER_MAX - 1, p, 3, &got, DEADLINE) != -XFER_ETRUNC)
        why = "an eager-limit message into one byte less did not end -XFER_ETRUNC";
    if (!why)
        why = recv_check(e, r, p, 3, XFER_MSG_EAGER_MAX, 35);
    for (uint32_t j = 0; j < 4 && !why; j++) /* local, default, local, default: in order */
        why = recv_check(e, r, p, 4, 16, 40 + j);
    /* back-pressure: the notification comes behind all of them */
    struct xfer_notif *n = NULL;
    while (!why && !n && xfer_notif_wait(e, "local-a", DEADLINE) > 0)
        xfer_notif_poll(e, &n, 1);
    if (!why && !n)
        why = "no notification after the local SENDs";
    xfer_notif_free(n);
    for (uint32_t j = 0; j < QMAX && !why; j++)
        why = recv_check(e, r, p, 5, 8, 1000 + j);
    if (!why && xfer_recv(e, r, 65536, 64, p, 5, &got, 300) != -XFER_ETIMEDOUT)
        why = "a message beyond the receive queue was not dropped";
    if (why)
        fprintf(stderr, "b: %s (round %d)\n", why, k - 1);
    char c;
    while (read(rfd, &c, 1) > 0) /* until A is done with us */
        ;
    xfer_engine_free(e);
    return why ? 1 : 0;
}

static void run_a(bool long_form)
{
    int rfd = -1, wfd = -1;
    xfer_engine *e;
    xfer_peer *p;
    xfer_region *r;
    pid_t pid = fp_fork_up(side_b, NULL, "local-a", long_form, &e, &p, &rfd, &wfd);
    assert_true(pid > 0);
    assert_int_equal(xfer_region_alloc(e, "a", 1 << 17, XFER_ACCESS_RW, &r), 0);
    for (int k = 0; k < ROUNDS; k++) {
        assert_int_equal(send_local(e, r, p, 1, 8 + k % 200, (uint32_t)k), 0);
        uint64_t got = 0;
        uint8_t *at = (uint8_t *)xfer_region_ptr(r) + 65536;
        assert_int_equal(xfer_recv(e, r, 65536, 65536, p, 2, &got, DEADLINE), 0);
        assert_int_equal(got, 8 + k % 300);
        assert_true(fp_same(at, (uint32_t)got, (uint32_t)k + 7));
    }
    /* truncation: the sender is not told */
    assert_int_equal(send_local(e, r, p, 3, 100, 32), 0);
    assert_int_equal(send_local(e, r, p, 3, 5, 33), 0);
    assert_int_equal(send_local(e, r, p, 3, XFER_MSG_EAGER_MAX, 34), 0);
    assert_int_equal(send_local(e, r, p, 3, XFER_MSG_EAGER_MAX, 35), 0);
    /* order with a default SEND between (it waits for B's RECV) */
    assert_int_equal(send_local(e, r, p, 4, 16, 40), 0);
    fp_fill((uint8_t *)xfer_region_ptr(r) + 4096, 16, 41);
    assert_int_equal(xfer_send(e, r, 4096, 16, p, 4, DEADLINE), 0);
    assert_int_equal(send_local(e, r, p, 4, 16, 42), 0);
    /* ... and a default SEND last: it ends once B matched it, so B's queue
     * of unexpected messages is empty before the back-pressure burst (a
     * local SEND still queued there, its RECV not posted yet because B
     * was descheduled, would take one of the QMAX places) */
    fp_fill((uint8_t *)xfer_region_ptr(r) + 4096, 16, 43);
    assert_int_equal(xfer_send(e, r, 4096, 16, p, 4, DEADLINE), 0);
    /* back-pressure: all complete here, B keeps the first QMAX */
    for (uint32_t j = 0; j < QMAX + EXTRA; j++) {
        uint8_t *at = (uint8_t *)xfer_region_ptr(r) + 8 * (j % 1024);
        fp_fill(at, 8, 1000 + j);
        assert_int_equal(xfer_send_flags(e, r, 8 * (j % 1024), 8, p, 5, XFER_SEND_LOCAL, DEADLINE),
                         0);
    }
    assert_int_equal(xfer_notify(e, p, "all sent", 8, DEADLINE), 0);
    /* arguments */
    assert_int_equal(xfer_send_flags(e, r, 0, XFER_MSG_EAGER_MAX + 1, p, 6, XFER_SEND_LOCAL, 100),
                     -XFER_EINVAL);
    assert_int_equal(xfer_send_flags(e, r, 0, 8, p, 6, 2, 100), -XFER_EINVAL);
    int st = fp_join(pid, rfd, wfd);
    xfer_engine_free(e);
    assert_int_equal(st, 0);
}

static void test_send_local(void **state)
{
    (void)state;
    run_a(false);
}

static void test_send_local_long_form(void **state)
{
    (void)state;
    run_a(true);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_send_local),
                                       cmocka_unit_test(test_send_local_long_form)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
