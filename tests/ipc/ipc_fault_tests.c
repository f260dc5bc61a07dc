/*
 * `ipc_node faults`: the ipc transport under failure, against a child owner:
 * a batch past its deadline, a cancelled batch, a stopped owner (bounded by
 * io_timeout, then a reconnect), and a killed owner (every item ends, nothing
 * hangs, the engine shuts down), and a client truncating a memfd region
 * under transfers (refused by its seals, where it would SIGBUS the process
 * that maps it). Each phase checks that plain transfers work again where the
 * owner is still alive.
 */
#include "ipc_test.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

#define RLEN (4u << 20)
#define BIG  2000 /* items of 1 MiB in the big batch: ~2 GB to copy */

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static xfer_batch *big_batch(xfer_engine *e, xfer_peer *p, xfer_region *l,
                             const struct xfer_region_desc *d)
{
    xfer_batch *b = xfer_batch_new(e, NULL);
    for (int i = 0; b && i < BIG; i++) {
        struct xfer_item it = {.op = i % 2 ? XFER_OP_READ : XFER_OP_WRITE,
                               .local = l,
                               .local_off = (uint64_t)(i % 4) << 20,
                               .peer = p,
                               .remote_id = d->id,
                               .remote_gen = d->gen,
                               .remote_off = (uint64_t)((i + 1) % 4) << 20,
                               .len = 1u << 20};
        if (xfer_batch_add(b, &it) < 0) {
            xfer_batch_free(b);
            return NULL;
        }
    }
    return b;
}

static int plain_op(xfer_engine *e, xfer_peer *p, xfer_region *l, struct owner *o)
{
    const struct xfer_region_desc *d = owner_region(o, "m");
    ipc_fill_host(xfer_region_ptr(l), 65536, 99);
    int rc = xfer_write(e, l, 0, p, d->id, d->gen, 4096, 65536, 10000);
    uint64_t s;
    CHECK(rc == 0, "plain write: %s", xfer_strerror(rc));
    CHECK(owner_sum(o, "m", 4096, 65536, &s) == 0 && s == ipc_sum_host(xfer_region_ptr(l), 65536),
          "plain write checksum");
    return 0;
}

static int phase_deadline(xfer_engine *e, xfer_peer *p, xfer_region *l, struct owner *o)
{
    xfer_batch *b = big_batch(e, p, l, owner_region(o, "m"));
    CHECK(b, "batch");
    double t0 = now_ms();
    int rc = xfer_batch_submit(b, 5);
    if (rc == 0)
        rc = xfer_batch_wait(b, -1);
    double took = now_ms() - t0;
    CHECK(rc == -XFER_ETIMEDOUT || rc == 0, "deadline: %s", xfer_strerror(rc));
    CHECK(took < 5000, "deadline: batch ended after %.0f ms", took);
    xfer_batch_free(b);
    printf("ok 5 ms deadline on a 2 GB batch -> %s after %.1f ms\n", xfer_strerror(rc), took);
    return plain_op(e, p, l, o);
}

static int phase_cancel(xfer_engine *e, xfer_peer *p, xfer_region *l, struct owner *o)
{
    xfer_batch *b = big_batch(e, p, l, owner_region(o, "c"));
    CHECK(b, "batch");
    CHECK(xfer_batch_submit(b, 30000) == 0, "submit");
    int rc = xfer_batch_cancel(b);
    int st = xfer_batch_poll(b);
    CHECK(st == -XFER_ECANCELED || st == 0, "cancel: batch status %s (cancel %s)",
          xfer_strerror(st), xfer_strerror(rc));
    xfer_batch_free(b); /* must not wait for anything or touch freed memory */
    printf("ok cancelled 2 GB batch over cma -> %s\n", xfer_strerror(st));
    return plain_op(e, p, l, o);
}

/* True once the child pid has stopped. kill(SIGSTOP) returns before every
 * thread of a multithreaded process has stopped: the stop is carried out by
 * one thread, which then stops the others, so the owner's ipc thread could
 * still answer a request sent at once (seen on a loaded machine). */
static bool wait_stopped(pid_t pid, int timeout_ms)
{
    struct timespec nap = {0, 1000000};
    for (double end = now_ms() + timeout_ms; now_ms() < end; nanosleep(&nap, NULL)) {
        int st;
        pid_t r = waitpid(pid, &st, WNOHANG | WUNTRACED);
        if (r == pid && WIFSTOPPED(st))
            return true;
        if (r < 0)
            return false;
    }
    return false;
}

static int phase_stopped(xfer_engine *e, xfer_peer *p, xfer_region *l, struct owner *o)
{
    const struct xfer_region_desc *d = owner_region(o, "m");
    kill(o->pid, SIGSTOP);
    if (!wait_stopped(o->pid, 5000)) {
        kill(o->pid, SIGCONT);
        CHECK(false, "owner %d did not stop within 5 s", (int)o->pid);
    }
    /* m is lent for direct copies (plain_op used it): items of any size
     * need no owner at all (large ones run on the copy threads, piece by
     * piece); c (a plain pointer, CMA) is never lent and asks it. */
    int rc = xfer_read(e, l, 0, p, d->id, d->gen, 0, 4096, 20000);
    if (rc == 0)
        rc = xfer_read(e, l, 0, p, d->id, d->gen, 0, 3u << 20, 20000);
    if (rc != 0)
        kill(o->pid, SIGCONT);
    CHECK(rc == 0, "direct read of a lent region from a stopped owner: %s", xfer_strerror(rc));
    const struct xfer_region_desc *c = owner_region(o, "c");
    double t0 = now_ms();
    rc = xfer_read(e, l, 0, p, c->id, c->gen, 0, 4096, 20000);
    double took = now_ms() - t0;
    kill(o->pid, SIGCONT);
    CHECK(rc < 0, "read from a stopped owner succeeded");
    CHECK(took < 10000, "stopped owner: failed only after %.0f ms", took);
    printf("ok stopped owner -> %s after %.0f ms\n", xfer_strerror(rc), took);
    CHECK(xfer_peer_connect(p) == 0, "reconnect: %s", xfer_engine_last_error(e));
    CHECK(xfer_peer_transport(p) == XFER_TRANSPORT_IPC, "reconnected over 0x%x",
          xfer_peer_transport(p));
    printf("ok reconnected over ipc\n");
    return plain_op(e, p, l, o);
}

/* Without seals the truncation makes this process's copies into the
 * mapping die of SIGBUS; with them it is refused and the batch checks out. */
static int phase_shrink(xfer_engine *e, xfer_peer *p, xfer_region *l, struct owner *o)
{
    xfer_batch *b = big_batch(e, p, l, owner_region(o, "a"));
    CHECK(b, "batch");
    CHECK(xfer_batch_submit(b, 30000) == 0, "submit");
    char ans[256] = "";
    /* owner_cmd returns -1 for an ERR answer (or a dead owner: ans empty) */
    CHECK(owner_cmd(o, ans, sizeof(ans), "SHRINK a") < 0 && !strncmp(ans, "ERR", 3),
          "the client truncated its adopted memfd under a transfer: %s", ans);
    ans[0] = 0;
    CHECK(owner_cmd(o, ans, sizeof(ans), "SHRINK m") < 0 && !strncmp(ans, "ERR", 3),
          "the engine's memfd was truncated: %s", ans);
    int rc = xfer_batch_wait(b, -1);
    xfer_batch_free(b);
    CHECK(rc == 0, "batch over a memfd a client tried to truncate: %s", xfer_strerror(rc));
    printf("ok ftruncate of adopted and engine memfds under a 2 GB batch refused; batch ok\n");
    ans[0] = 0;
    CHECK(owner_cmd(o, ans, sizeof(ans), "ADOPTRAW raw 65536") < 0 && strstr(ans, "not sealed"),
          "a memfd that cannot be sealed was adopted: %s", ans);
    printf("ok unsealable memfd refused: %s\n", ans);
    return plain_op(e, p, l, o);
}

static int phase_killed(xfer_engine *e, xfer_peer *p, xfer_region *l, struct owner *o)
{
    xfer_batch *b = big_batch(e, p, l, owner_region(o, "c"));
    CHECK(b, "batch");
    CHECK(xfer_batch_submit(b, 30000) == 0, "submit");
    kill(o->pid, SIGKILL);
    double t0 = now_ms();
    int rc = xfer_batch_wait(b, -1);
    double took = now_ms() - t0;
    CHECK(rc != -XFER_EINPROGRESS && took < 25000, "killed owner: %s after %.0f ms",
          xfer_strerror(rc), took);
    xfer_batch_free(b);
    const struct xfer_region_desc *d = owner_region(o, "m");
    int rc2 = xfer_read(e, l, 0, p, d->id, d->gen, 0, 4096, 5000);
    CHECK(rc2 < 0, "read from a dead owner succeeded");
    printf("ok killed owner -> batch %s after %.0f ms, next op %s\n", xfer_strerror(rc), took,
           xfer_strerror(rc2));
    return 0;
}

int run_fault_tests(int argc, char **argv)
{
    (void)argc, (void)argv;
    setenv("IPC_TEST_IO_TIMEOUT_MS", "1500", 0);
    const char *args[] = {"m:memfd:4194304:rw", "c:cma:4194304:rw", "a:adopt:4194304:rw", NULL};
    struct owner o;
    CHECK(owner_start(&o, args) == 0, "owner did not start");
    xfer_peer *p = NULL;
    xfer_engine *e = driver_engine("fault-driver", &o, &p);
    xfer_region *l = NULL;
    int bad = !e || !p || xfer_region_alloc(e, "l", RLEN, XFER_ACCESS_RW, &l) < 0;
    bad = bad || phase_deadline(e, p, l, &o) || phase_cancel(e, p, l, &o) ||
          phase_shrink(e, p, l, &o) || phase_stopped(e, p, l, &o) || phase_killed(e, p, l, &o);
    double t0 = now_ms();
    xfer_engine_free(e);
    printf("engine freed in %.0f ms\n", now_ms() - t0);
    owner_stop(&o); /* reaps the killed child */
    printf("%s\n", bad ? "FAILED" : "PASSED");
    return bad;
}
