/* A notification ping-pong over tcp between two processes: each side sends
 * a standalone notification, then waits for the other's in xfer_notif_wait,
 * whose thread reads the accepted sockets the peer's messages come on and
 * (engine/tcp/tcp_wait.c, tcp_notif_wait_rx) the initiator socket the
 * acknowledgement of its own last notification comes back on. The
 * acknowledgement is then collected with xfer_batch_wait or, in a third of
 * the rounds, by polling the batch (no waiter: if neither the notification
 * waiter nor the socket's owner read it, the round's deadline fails it).
 * Every notification must arrive once, in order, with its text.
 *
 * Then the point of it, counted: with the acknowledgement read by the
 * notification waiter, the progress threads of the side measured here
 * sleep and wake much less than once per round trip; with
 * XFER_NOTIF_WAIT_ACK=0 (the owner reads it) at least once. Voluntary
 * context switches of every thread of this process but the main one
 * (/proc/self/task), per round trip, compared between the two runs.
 *
 * Both sides run with XFER_TCP_BACK=0: each side's messages on its own
 * connection, the topology this waiter's reading of the acknowledgement is
 * for. With one connection both ways (tcp_back.c, the default since
 * 2026-11-29) the acknowledgement comes on the socket the waiter polls for
 * the peer's notifications anyway, XFER_NOTIF_WAIT_ACK changes nothing, and
 * the comparison only measured noise (it failed once in five under
 * AddressSanitizer); test_tcp_back covers that topology. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <dirent.h>
#include <math.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fork_pair.h"
#include "xfer.h"

#define DEADLINE 5000
#define PAIRS    8 /* of runs, on and off, at most (two run ~0.1 s on the VM) */

#if defined(__SANITIZE_ADDRESS__)
#define ROUNDS 300
#else
#define ROUNDS 1000
#endif

/* Voluntary context switches of this process's threads but the main one. */
static long other_switches(void)
{
    long sum = 0;
    DIR *d = opendir("/proc/self/task");
    if (!d)
        return 0;
    for (struct dirent *t; (t = readdir(d));) {
        if (t->d_name[0] == '.' || atoi(t->d_name) == getpid())
            continue;
        char path[320], line[128];
        snprintf(path, sizeof(path), "/proc/self/task/%s/status", t->d_name);
        FILE *f = fopen(path, "r");
        while (f && fgets(line, sizeof(line), f))
            if (!strncmp(line, "voluntary_ctxt_switches:", 24))
                sum += atol(line + 24);
        if (f)
            fclose(f);
    }
    closedir(d);
    return sum;
}

struct side {
    xfer_engine *e;
    xfer_peer *p;
    const char *other;
    uint64_t rng;
};

/* An engine named me, each the other's peer (fork_pair.h). */
static int side_up(struct side *s, const char *me, const char *other, int rfd, int wfd)
{
    s->other = other;
    return fp_side_up(&s->e, &s->p, me, rfd, wfd);
}

static xfer_batch *note_send(struct side *s, int k)
{
    char text[32];
    int n = snprintf(text, sizeof(text), "note %d", k);
    xfer_batch *b = xfer_batch_new(s->e, NULL);
    if (b &&
        (xfer_batch_notify(b, s->p, text, (size_t)n) < 0 || xfer_batch_submit(b, DEADLINE) < 0)) {
        xfer_batch_free(b);
        b = NULL;
    }
    return b;
}

static uint64_t rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Takes the other's notification k, then collects the acknowledgement of
 * prev (this side's last notification) one way or the other. 0 or why. */
static const char *note_take(struct side *s, int k, xfer_batch *prev)
{
    struct xfer_notif *n = NULL;
    int64_t end = fp_now_ms() + DEADLINE;
    while (!n && fp_now_ms() < end)
        if (xfer_notif_wait(s->e, s->other, DEADLINE) > 0)
            xfer_notif_poll(s->e, &n, 1);
    char want[32];
    int len = snprintf(want, sizeof(want), "note %d", k);
    const char *why = NULL;
    if (!n)
        why = "no notification within the deadline";
    else if (strcmp(n->node_id, s->other) || n->len != (size_t)len || memcmp(n->data, want, n->len))
        why = "wrong notification (sender, order or text)";
    xfer_notif_free(n);
    if (!prev || why)
        return why;
    int rc;
    if (rnd(&s->rng) % 3 == 0) { /* nobody waits: someone must have read it */
        while ((rc = xfer_batch_poll(prev)) == -XFER_EINPROGRESS && fp_now_ms() < end)
            sched_yield();
    } else {
        rc = xfer_batch_wait(prev, DEADLINE);
    }
    xfer_batch_free(prev);
    return rc == 0 ? NULL : "acknowledgement missing or failed";
}

/* B, in the child: echoes ROUNDS notifications. Exit status 0 or 1. */
static int side_b(int rfd, int wfd, void *arg)
{
    const char *ack = arg;
    setenv("XFER_NOTIF_WAIT_ACK", ack, 1);
    struct side s = {.rng = 0x9e3779b97f4a7c15ull};
    if (side_up(&s, "ack-b", "ack-a", rfd, wfd) < 0)
        return 1;
    xfer_batch *prev = NULL;
    for (int k = 0; k < ROUNDS; k++) {
        const char *why = note_take(&s, k, prev);
        if (why || !(prev = note_send(&s, k))) {
            fprintf(stderr, "b: round %d: %s\n", k, why ? why : "send failed");
            return 1;
        }
    }
    int rc = xfer_batch_wait(prev, DEADLINE);
    xfer_batch_free(prev);
    char c;
    while (read(rfd, &c, 1) > 0) /* until A is done with us */
        ;
    xfer_engine_free(s.e);
    return rc == 0 ? 0 : 1;
}

/* One ping-pong with XFER_NOTIF_WAIT_ACK=ack on both sides: this
 * process's other threads' voluntary context switches per round trip. */
static double ping_pong(const char *ack)
{
    int rfd = -1, wfd = -1;
    pid_t pid = fp_fork(side_b, (void *)ack, &rfd, &wfd);
    assert_true(pid > 0);
    setenv("XFER_NOTIF_WAIT_ACK", ack, 1);
    struct side s = {.rng = 0x2545f4914f6cdd1dull};
    assert_int_equal(side_up(&s, "ack-a", "ack-b", rfd, wfd), 0);
    unsetenv("XFER_NOTIF_WAIT_ACK");
    long sw0 = other_switches();
    int64_t t0 = fp_now_ms();
    const char *why = NULL;
    int k = 0;
    for (xfer_batch *b; k < ROUNDS && !why; k++) {
        if (!(b = note_send(&s, k)))
            why = "send failed";
        else
            why = note_take(&s, k, b);
    }
    long sw = other_switches() - sw0;
    int64_t ms = fp_now_ms() - t0;
    if (why)
        print_message("a: round %d: %s\n", k - 1, why);
    int st = fp_join(pid, rfd, wfd);
    xfer_engine_free(s.e);
    assert_null(why);
    assert_int_equal(st, 0);
    double per = (double)sw / ROUNDS;
    print_message("XFER_NOTIF_WAIT_ACK=%s: %.2f voluntary switches of other threads per round "
                  "trip (%d in %lld ms)\n",
                  ack, per, ROUNDS, (long long)ms);
    return per;
}

static void test_ack_by_waiter(void **state)
{
    (void)state;
    /* Off, the owner of the initiator socket wakes for each acknowledgement
     * (about 1 switch per round trip in every run); on, only for the 1 ms lazy
     * tick and races. On a loaded machine (the 2-core dev VM running other
     * tests, a CI container beside a build) any run can be preempted so
     * that its main thread lags behind the socket: what it waits for is
     * there before it polls, the owner reads it, as designed, and that run
     * counts like an off-run (seen: 1.34 on against 1.16 off at full
     * speed). So the quietest run of each setting is compared: up to
     * PAIRS pairs, until the quietest on-run is below 0.6 x the quietest
     * off-run. With the waiter not reading acknowledgements every on-run
     * counts like an off-run and no pair gets there. Each run checks every
     * notification and acknowledgement either way. */
    double min_on = 1e9, min_off = 1e9;
    for (int k = 0; k < PAIRS && !(min_on < 0.6 * min_off); k++) {
        min_on = fmin(min_on, ping_pong("1"));
        min_off = fmin(min_off, ping_pong("0"));
    }
    print_message("quietest runs: %.2f on, %.2f off\n", min_on, min_off);
    assert_true(min_on < 0.6 * min_off);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    setenv("XFER_TCP_BACK", "0", 1); /* two connections (see top); children inherit it */
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_ack_by_waiter)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
