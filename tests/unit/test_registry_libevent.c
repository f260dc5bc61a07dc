/* The watcher driven by a libevent loop through hiredis's libevent adapter,
 * the way xferd wires it: attach callback + a timer calling tick. Events
 * arrive; after a Redis restart the attach callback runs again (new async
 * context) and the publisher, ticked by the same timer, republishes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <event2/event.h>
#include <hiredis/adapters/libevent.h>

#include "registry_fixture.h"

static struct test_redis R;

struct loop {
    struct event_base *base;
    struct event *timer;
    xfer_registry *reg;
    int attaches;
    int joins, resyncs;
};

static int attach(struct redisAsyncContext *ac, void *arg)
{
    struct loop *l = arg;
    l->attaches++;
    return redisLibeventAttach(ac, l->base) == REDIS_OK ? 0 : -XFER_EIO;
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    struct loop *l = arg;
    int ms = xfer_registry_tick(l->reg);
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    evtimer_add(l->timer, &tv);
}

static void on_event(const struct xfer_registry_event *ev, void *arg)
{
    struct loop *l = arg;
    if (ev->type == XFER_REG_EV_JOIN && !strcmp(ev->node, "n1"))
        l->joins++;
    if (ev->type == XFER_REG_EV_RESYNC)
        l->resyncs++;
}

/* Runs the loop in 20 ms slices until cond or timeout. */
static bool run_until(struct loop *l, bool (*cond)(struct loop *), int timeout_ms)
{
    uint64_t deadline = tr_now_ms() + (uint64_t)timeout_ms;
    struct timeval slice = {0, 20000};
    while (!cond(l)) {
        if (tr_now_ms() > deadline)
            return false;
        event_base_loopexit(l->base, &slice);
        event_base_dispatch(l->base);
    }
    return true;
}

static bool watching(struct loop *l)
{
    return xfer_registry_watching(l->reg);
}

static bool joined(struct loop *l)
{
    return l->joins >= 1;
}

static bool back(struct loop *l)
{
    return l->resyncs >= 2 && xfer_registry_watching(l->reg) &&
           tr_int(&R, "HLEN xfer:node:{n1}") == 13;
}

static void test_libevent_watch(void **state)
{
    (void)state;
    assert_int_equal(test_redis_start(&R), 0);
    struct loop l = {0};
    l.base = event_base_new();
    l.reg = tr_registry(R.url, 3000);
    assert_non_null(l.base);
    assert_non_null(l.reg);
    l.timer = evtimer_new(l.base, on_timer, &l);
    on_timer(-1, 0, &l);
    xfer_registry_on_event(l.reg, on_event, &l);
    assert_int_equal(xfer_registry_watch(l.reg, attach, &l), 0);
    assert_true(run_until(&l, watching, 5000));
    assert_int_equal(l.attaches, 1);

    struct xfer_node_desc n;
    tr_node(&n, "n1");
    assert_int_equal(xfer_registry_publish_node(l.reg, &n), 0);
    assert_true(run_until(&l, joined, 5000));

    tr_kill(&R, SIGKILL);
    assert_int_equal(tr_launch(&R), 0);
    assert_true(run_until(&l, back, 8000));
    assert_true(l.attaches >= 2);

    xfer_registry_free(l.reg); /* before the base: the adapter frees its events */
    event_free(l.timer);
    event_base_free(l.base);
    test_redis_stop(&R);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_libevent_watch)};
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    test_redis_stop(&R); /* no-op unless a failure left it running */
    return rc;
}
