/* Messages back on the peer's connection over tcp (engine/tcp/tcp_back.c,
 * docs/notify.md "One connection for messages both ways"). Two processes,
 * A ("back-a", whose id sorts first: it offers its connection) and B
 * ("back-b"), each connected to the other at set-up. B counts its debug
 * log lines that say which way its messages go. Checked:
 *  - a ping-pong of ROUNDS exchanges: A's local SEND, then B's answer as a
 *    local SEND, a default SEND (A's answer and FIN come back on the same
 *    stream) or a notification (acknowledged there), in turn, every byte
 *    checked: B's messages went back on A's connection (one "back" line,
 *    decided once);
 *  - A reconnects (its first connection closes, a new one offers): B's
 *    next messages go on B's own connection (one "own" line) and A
 *    receives MSGS of them in the order sent, every byte checked;
 *  - the same with XFER_TCP_BACK=0 in both: no "back" line, and nothing
 *    changes when A reconnects;
 *  - A killed while B's default SEND waits on A's connection for A's
 *    RECV: the SEND ends -XFER_ECONN well before its deadline;
 *  - answers ride along (tcp_back.c): after a notification ping-pong of
 *    ROUNDS (where each answer is followed by the next notification, so
 *    answers get held), each side in turn sends ONEWAY blocking
 *    notifications the other only receives: every acknowledgement comes
 *    (the one held is sent by the owner's tick, and holding stops), in
 *    order, well within the deadline;
 *  - FINs ride along (tcp_back.c): the same with blocking default SENDs
 *    (xfer_send then xfer_recv on both sides, so each RTS comes before its
 *    RECV and a FIN follows, held for the next SEND once learned), then
 *    ONEWAY SENDs each way to a side that only receives: every SEND ends
 *    well within its deadline (a FIN held there is sent by the tick),
 *    every byte checked, FINs were held on one side at least, and went
 *    inside the next RTS there (tcp_msg_fold: every SEND still ends, so
 *    the FIN inside was taken);
 *  - B removes A while such SENDs (and a notification) wait there: they
 *    end -XFER_ECONN at once, nothing is left to end after the peer is
 *    gone (AddressSanitizer: a use after free was the failure), and after
 *    A is added again messages flow both ways. */
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

#define DEADLINE         5000
#define MSGS             100
#define KILL_DEADLINE_MS 8000

#if defined(__SANITIZE_ADDRESS__)
#define ROUNDS 150
#else
#define ROUNDS 600
#endif

/* B's log lines: messages back, own connection from now on; answers held
 * from now on, held ones sent by the tick */
static int n_back, n_own, n_hold_on, n_hold_off, n_ride_on, n_fold;

static void count_lines(enum xfer_log_level lvl, const char *msg, void *arg)
{
    (void)lvl;
    (void)arg;
    if (strstr(msg, "go back on its connection"))
        __atomic_add_fetch(&n_back, 1, __ATOMIC_RELAXED);
    else if (strstr(msg, "go on our own connection from now on"))
        __atomic_add_fetch(&n_own, 1, __ATOMIC_RELAXED);
    else if (strstr(msg, "answers wait for the next frame"))
        __atomic_add_fetch(&n_hold_on, 1, __ATOMIC_RELAXED);
    else if (strstr(msg, "held frames: sent, holding stops"))
        __atomic_add_fetch(&n_hold_off, 1, __ATOMIC_RELAXED);
    else if (strstr(msg, "FINs wait for the next frame"))
        __atomic_add_fetch(&n_ride_on, 1, __ATOMIC_RELAXED);
    else if (strstr(msg, "FINs go inside the next RTS"))
        __atomic_add_fetch(&n_fold, 1, __ATOMIC_RELAXED);
}

static void log_to_counters(void)
{
    xfer_log_set_handler(count_lines, NULL);
    xfer_log_set_level(XFER_LOG_DEBUG);
}

/* A message of n bytes (pattern seed) from offset 0 of r. */
static int send_msg(xfer_engine *e, xfer_region *r, xfer_peer *p, uint64_t tag, uint32_t n,
                    uint32_t seed, unsigned flags)
{
    fp_fill(xfer_region_ptr(r), n, seed);
    return xfer_send_flags(e, r, 0, n, p, tag, flags, DEADLINE);
}

static const char *recv_check(xfer_engine *e, xfer_region *r, xfer_peer *p, uint64_t tag,
                              uint32_t n, uint32_t seed)
{
    return fp_recv_check(e, r, p, tag, n, seed, DEADLINE);
}

/* B's k-th answer: a local SEND, a default SEND or a notification. */
static const char *answer(xfer_engine *e, xfer_region *r, xfer_peer *p, int k)
{
    uint32_t n = 8 + (uint32_t)k % 300;
    if (k % 3 == 0)
        return send_msg(e, r, p, 2, n, (uint32_t)k, XFER_SEND_LOCAL) ? "local send failed" : NULL;
    if (k % 3 == 1)
        return send_msg(e, r, p, 2, n, (uint32_t)k, 0) ? "send failed" : NULL;
    char note[32];
    int len = snprintf(note, sizeof(note), "note %d", k);
    return xfer_notify(e, p, note, (size_t)len, DEADLINE) ? "notify failed" : NULL;
}

/* A's side of B's k-th answer. */
static const char *take_answer(xfer_engine *e, xfer_region *r, xfer_peer *p, int k)
{
    if (k % 3 != 2)
        return recv_check(e, r, p, 2, 8 + (uint32_t)k % 300, (uint32_t)k);
    struct xfer_notif *n = NULL;
    while (!n && xfer_notif_wait(e, "back-b", DEADLINE) > 0)
        xfer_notif_poll(e, &n, 1);
    char want[32];
    int len = snprintf(want, sizeof(want), "note %d", k);
    bool ok = n && n->len == (size_t)len && !memcmp(n->data, want, (size_t)len);
    xfer_notif_free(n);
    return ok ? NULL : "wrong or no notification";
}

static bool pipe_byte(int fd_w)
{
    return write(fd_w, "x", 1) == 1;
}

/* A byte from the other side: false at the end of the pipe (the other
 * side failed and went, or is done). */
static bool pipe_wait(int fd_r)
{
    char c;
    return read(fd_r, &c, 1) == 1;
}

/* B: exit status 0, or 1 with why on stderr. arg: whether back is on. */
static int side_b(int rfd, int wfd, void *arg)
{
    bool back = *(bool *)arg;
    log_to_counters();
    xfer_engine *e;
    xfer_peer *p;
    xfer_region *r;
    if (fp_side_up(&e, &p, "back-b", rfd, wfd) < 0 ||
        xfer_region_alloc(e, "b", 1 << 17, XFER_ACCESS_RW, &r) != 0)
        return 1;
    const char *why = NULL;
    int k = 0;
    for (; k < ROUNDS && !why; k++) {
        why = recv_check(e, r, p, 1, 8 + (uint32_t)k % 200, (uint32_t)k + 5);
        if (!why)
            why = answer(e, r, p, k);
    }
    if (!why && n_back != (back ? 1 : 0))
        why = back ? "messages did not go back on A's connection" : "messages went back though off";
    if (!why && n_own != 0)
        why = "messages left A's connection before it closed";
    /* A reconnects: from then on, B's own connection, in order */
    if (!why && (!pipe_byte(wfd) || !pipe_wait(rfd)))
        why = "pipe";
    for (uint32_t j = 0; j < MSGS && !why; j++)
        if (send_msg(e, r, p, 7, 16 + j, 500 + j, XFER_SEND_LOCAL) != 0)
            why = "send after A reconnected failed";
    if (!why && n_own != (back ? 1 : 0))
        why = back ? "no switch to B's own connection after A's closed" : "a switch though off";
    if (!why)
        why = recv_check(e, r, p, 8, 8, 99); /* A has them all */
    if (why) { /* A sees the pipe end instead of waiting for the next step */
        fprintf(stderr, "b: %s (round %d, back %d, own %d)\n", why, k - 1, n_back, n_own);
        close(wfd);
    }
    while (pipe_wait(rfd)) /* until A is done with us */
        ;
    xfer_engine_free(e);
    return why ? 1 : 0;
}

static void run_a(bool back)
{
    if (!back)
        setenv("XFER_TCP_BACK", "0", 1); /* both read it at engine creation */
    int rfd = -1, wfd = -1;
    pid_t pid = fp_fork(side_b, &back, &rfd, &wfd);
    assert_true(pid > 0);
    xfer_engine *e;
    xfer_peer *p;
    xfer_region *r;
    assert_int_equal(fp_side_up(&e, &p, "back-a", rfd, wfd), 0);
    unsetenv("XFER_TCP_BACK");
    assert_int_equal(xfer_region_alloc(e, "a", 1 << 17, XFER_ACCESS_RW, &r), 0);
    const char *why = NULL;
    for (int k = 0; k < ROUNDS && !why; k++) {
        if (send_msg(e, r, p, 1, 8 + (uint32_t)k % 200, (uint32_t)k + 5, XFER_SEND_LOCAL) != 0)
            why = "send failed";
        if (!why)
            why = take_answer(e, r, p, k);
        if (why)
            fprintf(stderr, "a: %s (round %d)\n", why, k);
    }
    assert_null(why);
    assert_true(pipe_wait(rfd));
    assert_int_equal(xfer_peer_connect(p), 0); /* the old connection closes */
    assert_true(pipe_byte(wfd));
    for (uint32_t j = 0; j < MSGS && !why; j++)
        why = recv_check(e, r, p, 7, 16 + j, 500 + j);
    assert_null(why);
    assert_int_equal(send_msg(e, r, p, 8, 8, 99, XFER_SEND_LOCAL), 0);
    int st = fp_join(pid, rfd, wfd);
    xfer_engine_free(e);
    assert_int_equal(st, 0);
}

static void test_back(void **state)
{
    (void)state;
    run_a(true);
}

static void test_back_off(void **state)
{
    (void)state;
    run_a(false);
}

#define ONEWAY 100

/* Takes the next notification from `from`: NULL, or why it is not text. */
static const char *note_check(xfer_engine *e, const char *from, const char *text)
{
    struct xfer_notif *n = NULL;
    while (!n && xfer_notif_wait(e, from, DEADLINE) > 0)
        xfer_notif_poll(e, &n, 1);
    bool ok = n && n->len == strlen(text) && !memcmp(n->data, text, n->len);
    xfer_notif_free(n);
    return ok ? NULL : "wrong or no notification";
}

/* The hold test's messages: notifications, or blocking default SENDs of
 * r (k: the message's number, its text or its bytes' pattern). */
static const char *hold_put(xfer_engine *e, xfer_peer *p, xfer_region *r, int k, int deadline)
{
    if (r)
        return send_msg(e, r, p, 3, 8 + (uint32_t)k % 100, (uint32_t)k, 0) == 0 ? NULL
                                                                                : "send failed";
    char text[32];
    snprintf(text, sizeof(text), "note %d", k);
    return xfer_notify(e, p, text, strlen(text), deadline) ? "notify not acknowledged" : NULL;
}

static const char *hold_take(xfer_engine *e, xfer_peer *p, xfer_region *r, const char *peer, int k)
{
    if (r)
        return recv_check(e, r, p, 3, 8 + (uint32_t)k % 100, (uint32_t)k);
    char text[32];
    snprintf(text, sizeof(text), "note %d", k);
    return note_check(e, peer, text);
}

/* One side of the hold test: `first` sends first in the ping-pong, and its
 * one-way messages go first too. NULL or why. */
static const char *hold_side(xfer_engine *e, xfer_peer *p, xfer_region *r, const char *peer,
                             bool first)
{
    const char *why = NULL;
    for (int k = 0; k < ROUNDS && !why; k++) {
        if (first)
            why = hold_put(e, p, r, k, DEADLINE);
        if (!why)
            why = hold_take(e, p, r, peer, k);
        if (!why && !first)
            why = hold_put(e, p, r, k, DEADLINE);
    }
    for (int turn = 0; turn < 2 && !why; turn++) { /* first sends, then the other */
        bool sending = (turn == 0) == first;
        for (int j = 0; j < ONEWAY && !why; j++) {
            int k = 1000 * (turn + 1) + j;
            why = sending ? hold_put(e, p, r, k, DEADLINE / 2) : hold_take(e, p, r, peer, k);
        }
    }
    return why;
}

static int side_b_hold(int rfd, int wfd, void *arg)
{
    bool sends = *(bool *)arg;
    log_to_counters();
    xfer_engine *e;
    xfer_peer *p;
    xfer_region *r = NULL;
    if (fp_side_up(&e, &p, "back-b", rfd, wfd) < 0 ||
        (sends && xfer_region_alloc(e, "b", 1 << 17, XFER_ACCESS_RW, &r) != 0))
        return 1;
    const char *why = hold_side(e, p, r, "back-a", false);
    int counts[4] = {n_hold_on, n_hold_off, n_ride_on, n_fold}; /* A adds them to its own */
    if (!why && write(wfd, counts, sizeof(counts)) != (ssize_t)sizeof(counts))
        why = "pipe";
    if (why)
        fprintf(stderr, "b: %s\n", why);
    while (pipe_wait(rfd))
        ;
    xfer_engine_free(e);
    return why ? 1 : 0;
}

static void run_hold(bool sends)
{
    /* A frame 2 ms after its answer still counts as following it: holding
     * starts on a loaded machine too (both read it at engine creation). */
    setenv("XFER_TCP_HOLD_WINDOW_US", "2000", 1);
    int rfd = -1, wfd = -1;
    pid_t pid = fp_fork(side_b_hold, &sends, &rfd, &wfd);
    assert_true(pid > 0);
    n_hold_on = n_hold_off = n_ride_on = n_fold = 0;
    log_to_counters();
    xfer_engine *e;
    xfer_peer *p;
    xfer_region *r = NULL;
    assert_int_equal(fp_side_up(&e, &p, "back-a", rfd, wfd), 0);
    unsetenv("XFER_TCP_HOLD_WINDOW_US");
    if (sends)
        assert_int_equal(xfer_region_alloc(e, "a", 1 << 17, XFER_ACCESS_RW, &r), 0);
    const char *why = hold_side(e, p, r, "back-b", true);
    if (why)
        fprintf(stderr, "a: %s\n", why);
    assert_null(why);
    int b_counts[4] = {0, 0, 0, 0};
    assert_int_equal(read(rfd, b_counts, sizeof(b_counts)), (ssize_t)sizeof(b_counts));
    fprintf(stderr, "hold (%s): a on %d off %d fin %d fold %d, b on %d off %d fin %d fold %d\n",
            sends ? "sends" : "notifications", n_hold_on, n_hold_off, n_ride_on, n_fold,
            b_counts[0], b_counts[1], b_counts[2], b_counts[3]);
    /* one side at least held answers (or FINs) in the ping-pong, and had
     * to have the tick send some in the one-way part */
    assert_true(n_hold_on + b_counts[0] >= 1);
    assert_true(n_hold_off + b_counts[1] >= 1);
    if (sends) /* FINs held, and carried inside the next RTS (tcp_msg_fold) */
        assert_true(n_ride_on + b_counts[2] >= 1 && n_fold + b_counts[3] >= 1);
    int st = fp_join(pid, rfd, wfd);
    xfer_engine_free(e);
    xfer_log_set_handler(NULL, NULL); /* (its threads log until it is freed) */
    assert_int_equal(st, 0);
}

static void test_back_hold(void **state)
{
    (void)state;
    run_hold(false);
}

static void test_fin_ride(void **state)
{
    (void)state;
    run_hold(true);
}

/* The killed peer: here B (this process), A the child, which connects,
 * says it is up and then only waits. */
static int side_a_idle(int rfd, int wfd, void *arg)
{
    (void)arg;
    xfer_engine *e;
    xfer_peer *p;
    if (fp_side_up(&e, &p, "back-a", rfd, wfd) < 0 || !pipe_byte(wfd))
        return 1;
    while (pipe_wait(rfd))
        ;
    xfer_engine_free(e);
    return 0;
}

/* B here, A the child running `child`, both up (A said so), B's region
 * allocated; B's log lines counted from now on. */
struct b_side {
    pid_t pid;
    int rfd, wfd;
    xfer_engine *e;
    xfer_peer *p;
    xfer_region *r;
};

static void b_up(struct b_side *b, int (*child)(int, int, void *))
{
    n_back = n_own = 0;
    log_to_counters();
    b->pid = fp_fork(child, NULL, &b->rfd, &b->wfd);
    assert_true(b->pid > 0);
    assert_int_equal(fp_side_up(&b->e, &b->p, "back-b", b->rfd, b->wfd), 0);
    assert_true(pipe_wait(b->rfd));
    assert_int_equal(xfer_region_alloc(b->e, "b", 1 << 17, XFER_ACCESS_RW, &b->r), 0);
}

static void test_back_peer_killed(void **state)
{
    (void)state;
    struct b_side bs;
    b_up(&bs, side_a_idle);
    xfer_batch *b = xfer_batch_new(bs.e, NULL);
    assert_non_null(b);
    assert_true(xfer_batch_add_send(b, bs.r, 0, 64, bs.p, 3) >= 0);
    assert_int_equal(xfer_batch_submit(b, KILL_DEADLINE_MS), 0);
    assert_int_equal(n_back, 1); /* it went back on A's connection */
    kill(bs.pid, SIGKILL);
    int64_t t0 = fp_now_ms();
    int rc = xfer_batch_wait(b, -1);
    int64_t took = fp_now_ms() - t0;
    assert_int_equal(rc, -XFER_ECONN);
    assert_true(took < KILL_DEADLINE_MS / 2);
    xfer_batch_free(b);
    waitpid(bs.pid, NULL, 0);
    close(bs.rfd);
    close(bs.wfd);
    xfer_engine_free(bs.e);
    xfer_log_set_handler(NULL, NULL);
}

/* A, connected, says it is up, then (once told) receives one message and
 * answers it. */
static int side_a_late(int rfd, int wfd, void *arg)
{
    (void)arg;
    xfer_engine *e;
    xfer_peer *p;
    xfer_region *r;
    if (fp_side_up(&e, &p, "back-a", rfd, wfd) < 0 ||
        xfer_region_alloc(e, "a", 1 << 17, XFER_ACCESS_RW, &r) != 0 || !pipe_byte(wfd))
        return 1;
    const char *why = pipe_wait(rfd) ? NULL : "pipe";
    if (!why)
        why = recv_check(e, r, p, 9, 32, 77);
    if (!why && send_msg(e, r, p, 10, 24, 78, 0) != 0)
        why = "answer failed";
    if (why)
        fprintf(stderr, "a: %s\n", why);
    while (pipe_wait(rfd))
        ;
    xfer_engine_free(e);
    return why ? 1 : 0;
}

static void test_back_peer_removed(void **state)
{
    (void)state;
    struct b_side bs;
    b_up(&bs, side_a_late);
    struct xfer_peer_desc d;
    xfer_peer_describe(bs.p, &d);
    xfer_batch *b = xfer_batch_new(bs.e, NULL);
    assert_non_null(b);
    for (int k = 0; k < 3; k++)
        assert_true(xfer_batch_add_send(b, bs.r, 64 * (uint64_t)k, 64, bs.p, 3) >= 0);
    assert_true(xfer_batch_notify(b, bs.p, "gone", 4) >= 0);
    assert_int_equal(xfer_batch_submit(b, DEADLINE), 0);
    assert_int_equal(n_back, 1);
    int64_t t0 = fp_now_ms();
    assert_int_equal(xfer_peer_remove(bs.e, bs.p), 0);
    int rc = xfer_batch_wait(b, -1);
    assert_int_equal(rc, -XFER_ECONN);
    assert_true(fp_now_ms() - t0 < DEADLINE / 2);
    xfer_batch_free(b);
    /* A again: a message there and its answer back */
    assert_int_equal(xfer_peer_add(bs.e, &d, &bs.p), 0);
    assert_true(pipe_byte(bs.wfd));
    assert_int_equal(send_msg(bs.e, bs.r, bs.p, 9, 32, 77, 0), 0);
    assert_null(recv_check(bs.e, bs.r, bs.p, 10, 24, 78));
    assert_int_equal(fp_join(bs.pid, bs.rfd, bs.wfd), 0);
    xfer_engine_free(bs.e);
    xfer_log_set_handler(NULL, NULL);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_back),
                                       cmocka_unit_test(test_back_off),
                                       cmocka_unit_test(test_back_hold),
                                       cmocka_unit_test(test_fin_ride),
                                       cmocka_unit_test(test_back_peer_killed),
                                       cmocka_unit_test(test_back_peer_removed)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
