/* Redis outages against a real redis-server: killed -> calls fail fast with
 * -XFER_EUNAVAIL while cached lookups keep working; restarted empty -> the
 * publisher (on the registry's own thread) republishes everything it owns,
 * including what was published while Redis was down, and watchers resync. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#define TR_GROUP_REDIS /* R: one redis-server for the group */
#include "registry_fixture.h"

static int resyncs;

static void count_resync(const struct xfer_registry_event *ev, void *arg)
{
    (void)arg;
    if (ev->type == XFER_REG_EV_RESYNC)
        resyncs++;
}

static bool is_watching(void *arg)
{
    return xfer_registry_watching(arg);
}

static bool republished(void *arg)
{
    (void)arg;
    return tr_int(&R, "HLEN xfer:node:{n1}") == 13 &&
           tr_int(&R, "HLEN xfer:region:{n1}:kv") == 15 &&
           tr_int(&R, "HLEN xfer:region:{n1}:late") == 15 &&
           tr_int(&R, "SCARD xfer:regions:{n1}") == 2 && tr_int(&R, "ZCARD xfer:nodes") == 1;
}

static bool resynced(void *arg)
{
    return xfer_registry_watching(arg) && resyncs >= 2;
}

static void test_kill_and_restart(void **state)
{
    (void)state;
    xfer_registry *p = tr_registry(R.url, 3000);
    xfer_registry *c = tr_registry(R.url, 3000);
    assert_non_null(p);
    assert_non_null(c);
    struct xfer_node_desc n, got;
    struct xfer_region_desc d, rd;
    tr_node(&n, "n1");
    assert_int_equal(xfer_registry_publish_node(p, &n), 0);
    tr_region(&d, "kv", 1);
    assert_int_equal(xfer_registry_publish_region(p, &d), 0);
    assert_int_equal(xfer_registry_thread_start(p), 0);
    xfer_registry_on_event(c, count_resync, NULL);
    assert_int_equal(xfer_registry_watch(c, NULL, NULL), 0);
    assert_true(tr_wait(c, is_watching, c, 5000));
    assert_int_equal(xfer_registry_lookup_region(c, "n1", "kv", &rd), 0);

    tr_kill(&R, SIGKILL);
    /* cached entries keep being served */
    uint64_t t0 = tr_now_ms();
    assert_int_equal(xfer_registry_lookup_node(c, "n1", &got), 0);
    assert_string_equal(got.peer.addr, "10.0.0.1");
    assert_int_equal(xfer_registry_lookup_region(c, "n1", "kv", &rd), 0);
    assert_int_equal(rd.id, 1);
    /* anything needing Redis fails fast, with a reason */
    assert_int_equal(xfer_registry_lookup_node(c, "n2", &got), -XFER_EUNAVAIL);
    assert_non_null(strstr(xfer_registry_last_error(c), "unreachable"));
    assert_int_equal(xfer_registry_lookup_node(c, "n3", &got), -XFER_EUNAVAIL);
    struct xfer_node_desc *nodes;
    size_t nn;
    assert_int_equal(xfer_registry_list_nodes(c, &nodes, &nn), -XFER_EUNAVAIL);
    tr_region(&d, "late", 2); /* published while down: recorded, republished later */
    assert_int_equal(xfer_registry_publish_region(p, &d), -XFER_EUNAVAIL);
    assert_int_equal(xfer_registry_publish_region(p, &d), -XFER_EUNAVAIL);
    uint64_t took = tr_now_ms() - t0;
    print_message("7 calls with redis down took %llu ms\n", (unsigned long long)took);
    assert_true(took < 1000);
    assert_false(xfer_registry_connected(c));
    /* still served after the cache entries aged past cache_max_age_ms */
    uint64_t until = tr_now_ms() + 1200;
    while (tr_now_ms() < until)
        xfer_registry_poll(c, 100);
    assert_int_equal(xfer_registry_lookup_region(c, "n1", "kv", &rd), 0);
    assert_false(xfer_registry_watching(c));

    /* an empty Redis comes back: everything is republished by the thread */
    assert_int_equal(tr_launch(&R), 0);
    t0 = tr_now_ms();
    assert_true(tr_wait(NULL, republished, NULL, 5000));
    print_message("republished %llu ms after redis restart\n",
                  (unsigned long long)(tr_now_ms() - t0));
    assert_true(tr_wait(c, resynced, c, 5000));
    assert_int_equal(xfer_registry_lookup_region(c, "n1", "late", &rd), 0);
    assert_int_equal(rd.id, 2);
    assert_true(xfer_registry_connected(c));
    xfer_registry_thread_stop(p);
    xfer_registry_free(p);
    xfer_registry_free(c);
}

static bool not_watching(void *arg)
{
    return !xfer_registry_watching(arg);
}

/* A frozen Redis (SIGSTOP): every command ends by its timeout, cached
 * entries are served, the subscriber is torn down and resubscribes (RESYNC)
 * once Redis runs again. */
static void test_frozen_redis(void **state)
{
    (void)state;
    xfer_registry *p = tr_registry(R.url, 3000);
    xfer_registry *c = tr_registry(R.url, 3000);
    struct xfer_node_desc n, got;
    tr_node(&n, "n1");
    assert_int_equal(xfer_registry_publish_node(p, &n), 0);
    assert_int_equal(xfer_registry_thread_start(p), 0);
    resyncs = 0;
    xfer_registry_on_event(c, count_resync, NULL);
    assert_int_equal(xfer_registry_watch(c, NULL, NULL), 0);
    assert_true(tr_wait(c, is_watching, c, 5000));
    assert_int_equal(xfer_registry_lookup_node(c, "n1", &got), 0);

    kill(R.pid, SIGSTOP);
    uint64_t t0 = tr_now_ms();
    assert_int_equal(xfer_registry_lookup_node(c, "n2", &got), -XFER_EUNAVAIL);
    uint64_t took = tr_now_ms() - t0;
    print_message("uncached lookup with redis frozen failed after %llu ms (timeout 1000)\n",
                  (unsigned long long)took);
    assert_true(took >= 900 && took < 2500);
    t0 = tr_now_ms();
    assert_int_equal(xfer_registry_lookup_node(c, "n1", &got), 0);              /* cached */
    assert_int_equal(xfer_registry_lookup_node(c, "n2", &got), -XFER_EUNAVAIL); /* backoff */
    assert_true(tr_now_ms() - t0 < 100);
    assert_true(tr_wait(c, not_watching, c, 3000));

    kill(R.pid, SIGCONT);
    assert_true(tr_wait(c, resynced, c, 8000));
    assert_int_equal(xfer_registry_fetch_node(c, "n1", &got), 0);
    xfer_registry_thread_stop(p);
    xfer_registry_free(p);
    xfer_registry_free(c);
}

static void test_start_offline_then_connect(void **state)
{
    (void)state;
    struct xfer_registry_config cfg;
    xfer_registry_config_init(&cfg);
    cfg.url = R.url;
    cfg.start_offline = true;
    cfg.backoff_max_ms = 300;
    tr_kill(&R, SIGKILL);
    int err;
    xfer_registry *p = xfer_registry_new(&cfg, &err);
    assert_non_null(p);
    struct xfer_node_desc n;
    struct xfer_region_desc d;
    tr_node(&n, "n1");
    assert_int_equal(xfer_registry_publish_node(p, &n), -XFER_EUNAVAIL);
    tr_region(&d, "kv", 1);
    assert_int_equal(xfer_registry_publish_region(p, &d), -XFER_EUNAVAIL);
    tr_region(&d, "late", 2);
    assert_int_equal(xfer_registry_publish_region(p, &d), -XFER_EUNAVAIL);
    assert_int_equal(tr_launch(&R), 0);
    assert_true(tr_wait(p, republished, NULL, 5000));
    xfer_registry_free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kill_and_restart),
        cmocka_unit_test(test_frozen_redis),
        cmocka_unit_test(test_start_offline_then_connect),
    };
    return cmocka_run_group_tests(tests, tr_group_setup, tr_group_teardown);
}
