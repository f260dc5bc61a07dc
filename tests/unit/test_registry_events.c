/* Registry events and cache against a real redis-server: join/leave/region
 * events, cache invalidation by events, incarnation change (RESTARTED),
 * TTL expiry of a node that stops heartbeating (and its reaped "leave"). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#define TR_GROUP_REDIS /* R: one redis-server for the group */
#include "registry_fixture.h"

struct seen {
    int n;
    struct {
        enum xfer_registry_event_type type;
        char node[XFER_NAME_MAX];
        char region[XFER_NAME_MAX];
        uint64_t old_inc, new_inc;
    } ev[256];
};

static void record(const struct xfer_registry_event *ev, void *arg)
{
    struct seen *s = arg;
    if (s->n >= 256)
        return;
    s->ev[s->n].type = ev->type;
    snprintf(s->ev[s->n].node, XFER_NAME_MAX, "%s", ev->node);
    snprintf(s->ev[s->n].region, XFER_NAME_MAX, "%s", ev->region ? ev->region : "");
    s->ev[s->n].old_inc = ev->old_incarnation;
    s->ev[s->n].new_inc = ev->new_incarnation;
    s->n++;
}

struct want {
    struct seen *s;
    enum xfer_registry_event_type type;
    const char *node, *region;
};

static bool has_event(void *arg)
{
    struct want *w = arg;
    for (int i = 0; i < w->s->n; i++)
        if (w->s->ev[i].type == w->type && !strcmp(w->s->ev[i].node, w->node) &&
            (!w->region || !strcmp(w->s->ev[i].region, w->region)))
            return true;
    return false;
}

static void wait_event(xfer_registry *r, struct seen *s, enum xfer_registry_event_type t,
                       const char *node, const char *region)
{
    struct want w = {s, t, node, region};
    if (!tr_wait(r, has_event, &w, 5000))
        fail_msg("no event %d for %s/%s within 5 s", t, node, region ? region : "-");
}

static bool is_watching(void *arg)
{
    return xfer_registry_watching(arg);
}

static xfer_registry *watcher(struct seen *s, int ttl_ms)
{
    xfer_registry *w = tr_registry(R.url, ttl_ms);
    assert_non_null(w);
    memset(s, 0, sizeof(*s));
    xfer_registry_on_event(w, record, s);
    assert_int_equal(xfer_registry_watch(w, NULL, NULL), 0);
    assert_true(tr_wait(w, is_watching, w, 5000));
    return w;
}

static void test_events(void **state)
{
    (void)state;
    struct seen s;
    xfer_registry *w = watcher(&s, 10000);
    assert_true(s.n >= 1 && s.ev[0].type == XFER_REG_EV_RESYNC);
    xfer_registry *p = tr_registry(R.url, 10000);
    struct xfer_node_desc n;
    struct xfer_region_desc d;
    tr_node(&n, "n1");
    assert_int_equal(xfer_registry_publish_node(p, &n), 0);
    wait_event(w, &s, XFER_REG_EV_JOIN, "n1", NULL);
    tr_region(&d, "kv", 1);
    assert_int_equal(xfer_registry_publish_region(p, &d), 0);
    wait_event(w, &s, XFER_REG_EV_REGION_ADD, "n1", "kv");
    assert_int_equal(xfer_registry_unpublish_region(p, "kv"), 0);
    wait_event(w, &s, XFER_REG_EV_REGION_DEL, "n1", "kv");
    assert_int_equal(xfer_registry_unpublish_node(p), 0);
    wait_event(w, &s, XFER_REG_EV_LEAVE, "n1", NULL);
    /* garbage on the channel is ignored */
    freeReplyObject(tr_cmd(&R, "PUBLISH xfer:events %s", "explode n1"));
    freeReplyObject(tr_cmd(&R, "PUBLISH xfer:events %s", "join"));
    freeReplyObject(tr_cmd(&R, "PUBLISH xfer:events %s", "join {bad}"));
    freeReplyObject(tr_cmd(&R, "PUBLISH xfer:events %s", "region+ n1"));
    freeReplyObject(tr_cmd(&R, "PUBLISH xfer:events %s", "leave n1 extra"));
    freeReplyObject(
        tr_cmd(&R, "PUBLISH xfer:events %s",
               "join n9aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"));
    int before = s.n;
    freeReplyObject(tr_cmd(&R, "PUBLISH xfer:events %s", "join n9"));
    wait_event(w, &s, XFER_REG_EV_JOIN, "n9", NULL);
    assert_int_equal(s.n, before + 1);
    xfer_registry_free(p);
    xfer_registry_free(w);
}

static void test_cache_invalidation(void **state)
{
    (void)state;
    struct seen s;
    xfer_registry *c = watcher(&s, 10000);
    xfer_registry *p = tr_registry(R.url, 10000);
    struct xfer_node_desc n;
    struct xfer_region_desc d, got;
    tr_node(&n, "n1");
    assert_int_equal(xfer_registry_publish_node(p, &n), 0);
    tr_region(&d, "kv", 1);
    assert_int_equal(xfer_registry_publish_region(p, &d), 0);
    wait_event(c, &s, XFER_REG_EV_REGION_ADD, "n1", "kv");
    assert_int_equal(xfer_registry_lookup_region(c, "n1", "kv", &got), 0);
    assert_int_equal(got.len, 1u << 20);
    /* a change without an event is not seen: the cache answers */
    freeReplyObject(tr_cmd(&R, "HSET xfer:region:{n1}:kv len 5"));
    assert_int_equal(xfer_registry_lookup_region(c, "n1", "kv", &got), 0);
    assert_int_equal(got.len, 1u << 20);
    /* the event invalidates it */
    s.n = 0;
    d.len = 2u << 20;
    d.gen = 4;
    assert_int_equal(xfer_registry_publish_region(p, &d), 0);
    wait_event(c, &s, XFER_REG_EV_REGION_ADD, "n1", "kv");
    assert_int_equal(xfer_registry_lookup_region(c, "n1", "kv", &got), 0);
    assert_int_equal(got.len, 2u << 20);
    assert_int_equal(got.gen, 4);
    /* region- and leave drop entries: lookups then fail */
    assert_int_equal(xfer_registry_unpublish_region(p, "kv"), 0);
    wait_event(c, &s, XFER_REG_EV_REGION_DEL, "n1", "kv");
    assert_int_equal(xfer_registry_lookup_region(c, "n1", "kv", &got), -XFER_ENOENT);
    assert_int_equal(xfer_registry_lookup_node(c, "n1", &n), 0);
    assert_int_equal(xfer_registry_unpublish_node(p), 0);
    wait_event(c, &s, XFER_REG_EV_LEAVE, "n1", NULL);
    assert_int_equal(xfer_registry_lookup_node(c, "n1", &n), -XFER_ENOENT);
    xfer_registry_free(p);
    xfer_registry_free(c);
}

static bool restarted(void *arg)
{
    struct seen *s = arg;
    for (int i = 0; i < s->n; i++)
        if (s->ev[i].type == XFER_REG_EV_RESTARTED)
            return true;
    return false;
}

static void test_incarnation_change(void **state)
{
    (void)state;
    struct seen s;
    xfer_registry *c = watcher(&s, 10000);
    xfer_registry *p1 = tr_registry(R.url, 10000);
    struct xfer_node_desc n, own1, own2;
    struct xfer_region_desc d, got;
    tr_node(&n, "n1");
    assert_int_equal(xfer_registry_publish_node(p1, &n), 0);
    tr_region(&d, "kv", 1);
    assert_int_equal(xfer_registry_publish_region(p1, &d), 0);
    assert_int_equal(xfer_registry_own_node(p1, &own1), 0);
    assert_int_equal(xfer_registry_lookup_region(c, "n1", "kv", &got), 0);
    xfer_registry_free(p1); /* "crash": keys stay until their TTL */

    xfer_registry *p2 = tr_registry(R.url, 10000); /* the restarted process */
    tr_node(&n, "n1");
    assert_int_equal(xfer_registry_publish_node(p2, &n), 0);
    assert_int_equal(xfer_registry_own_node(p2, &own2), 0);
    assert_true(own1.peer.incarnation != own2.peer.incarnation);
    assert_true(tr_wait(c, restarted, &s, 5000));
    for (int i = 0; i < s.n; i++) {
        if (s.ev[i].type != XFER_REG_EV_RESTARTED)
            continue;
        assert_string_equal(s.ev[i].node, "n1");
        assert_true(s.ev[i].old_inc == own1.peer.incarnation);
        assert_true(s.ev[i].new_inc == own2.peer.incarnation);
    }
    /* the old incarnation's region is gone from the cache and from Redis */
    assert_int_equal(tr_int(&R, "EXISTS xfer:region:{n1}:kv"), 0);
    assert_int_equal(xfer_registry_lookup_region(c, "n1", "kv", &got), -XFER_ENOENT);
    assert_int_equal(xfer_registry_lookup_node(c, "n1", &n), 0);
    assert_true(n.peer.incarnation == own2.peer.incarnation);

    /* a reader without a watcher notices on a fresh lookup */
    struct seen s2 = {0};
    xfer_registry *q = tr_registry(R.url, 10000);
    xfer_registry_on_event(q, record, &s2);
    assert_int_equal(xfer_registry_lookup_node(q, "n1", &n), 0);
    xfer_registry_free(p2);
    xfer_registry *p3 = tr_registry(R.url, 10000);
    tr_node(&n, "n1");
    assert_int_equal(xfer_registry_publish_node(p3, &n), 0);
    assert_int_equal(xfer_registry_fetch_node(q, "n1", &n), 0);
    assert_int_equal(s2.n, 1);
    assert_int_equal(s2.ev[0].type, XFER_REG_EV_RESTARTED);
    xfer_registry_free(p3);
    xfer_registry_free(q);
    xfer_registry_free(c);
}

struct expiry {
    xfer_registry *alive;
    struct seen *s;
};

static bool n1_gone_and_left(void *arg)
{
    struct expiry *e = arg;
    xfer_registry_poll(e->alive, 0); /* keeps n2 heartbeating */
    struct want w = {e->s, XFER_REG_EV_LEAVE, "n1", NULL};
    /* each key expires on its own clock (set a few ms apart, and Redis
     * expires lazily or in sampled sweeps): wait for all of n1's keys */
    return has_event(&w) && tr_int(&R, "EXISTS xfer:node:{n1}") == 0 &&
           tr_int(&R, "EXISTS xfer:region:{n1}:kv") == 0 &&
           tr_int(&R, "EXISTS xfer:regions:{n1}") == 0;
}

static void test_ttl_expiry(void **state)
{
    (void)state;
    struct seen s;
    xfer_registry *w = watcher(&s, 1000);
    xfer_registry *dead = tr_registry(R.url, 1000);
    xfer_registry *alive = tr_registry(R.url, 1000);
    struct xfer_node_desc n;
    struct xfer_region_desc d;
    tr_node(&n, "n1");
    assert_int_equal(xfer_registry_publish_node(dead, &n), 0);
    tr_region(&d, "kv", 1);
    assert_int_equal(xfer_registry_publish_region(dead, &d), 0);
    tr_node(&n, "n2");
    assert_int_equal(xfer_registry_publish_node(alive, &n), 0);
    assert_int_equal(xfer_registry_publish_region(alive, &d), 0);
    uint64_t t0 = tr_now_ms();
    struct expiry e = {alive, &s};
    /* "dead" never ticks: its keys expire after 1 s, the watcher reaps it */
    assert_true(tr_wait(w, n1_gone_and_left, &e, 3000));
    uint64_t took = tr_now_ms() - t0;
    print_message("n1 expired and left after %llu ms (ttl 1000)\n", (unsigned long long)took);
    assert_true(took >= 900);
    assert_int_equal(tr_int(&R, "EXISTS xfer:region:{n1}:kv"), 0);
    assert_int_equal(tr_int(&R, "EXISTS xfer:regions:{n1}"), 0);
    assert_int_equal(tr_int(&R, "ZRANK xfer:nodes n1"), -998); /* nil: removed */
    /* n2 kept heartbeating: all of its keys are alive */
    assert_int_equal(tr_int(&R, "EXISTS xfer:node:{n2}"), 1);
    assert_int_equal(tr_int(&R, "EXISTS xfer:region:{n2}:kv"), 1);
    assert_int_equal(tr_int(&R, "EXISTS xfer:regions:{n2}"), 1);
    assert_true(tr_int(&R, "PTTL xfer:node:{n2}") > 0);
    struct xfer_node_desc *nodes;
    size_t nn;
    assert_int_equal(xfer_registry_list_nodes(w, &nodes, &nn), 0);
    assert_int_equal(nn, 1);
    assert_string_equal(nodes[0].peer.node_id, "n2");
    free(nodes);
    xfer_registry_free(dead);
    xfer_registry_free(alive);
    xfer_registry_free(w);
}

static void test_heartbeat_restores_flushed_keys(void **state)
{
    (void)state;
    xfer_registry *p = tr_registry(R.url, 10000);
    struct xfer_node_desc n;
    struct xfer_region_desc d;
    tr_node(&n, "n1");
    assert_int_equal(xfer_registry_publish_node(p, &n), 0);
    tr_region(&d, "kv", 1);
    assert_int_equal(xfer_registry_publish_region(p, &d), 0);
    const struct xfer_registry_field pf[] = {{"layout", "vllm"}, {"blocks", "16"}};
    assert_int_equal(xfer_registry_publish_pool(p, "kv", pf, 2), 0);
    freeReplyObject(tr_cmd(&R, "FLUSHALL"));
    assert_int_equal(xfer_registry_heartbeat(p), 0);
    assert_int_equal(tr_int(&R, "HLEN xfer:node:{n1}"), 13);
    assert_int_equal(tr_int(&R, "HLEN xfer:pool:{n1}:kv"), 2);
    assert_int_equal(tr_int(&R, "SISMEMBER xfer:pools:{n1} kv"), 1);
    assert_int_equal(tr_int(&R, "HLEN xfer:region:{n1}:kv"), 15);
    assert_int_equal(tr_int(&R, "SISMEMBER xfer:regions:{n1} kv"), 1);
    freeReplyObject(tr_cmd(&R, "DEL xfer:region:{n1}:kv"));
    assert_int_equal(xfer_registry_heartbeat(p), 0);
    assert_int_equal(tr_int(&R, "HLEN xfer:region:{n1}:kv"), 15);
    freeReplyObject(tr_cmd(&R, "DEL xfer:pool:{n1}:kv")); /* one pool key expired alone */
    assert_int_equal(xfer_registry_heartbeat(p), 0);
    assert_int_equal(tr_int(&R, "HLEN xfer:pool:{n1}:kv"), 2);
    xfer_registry_free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_events, tr_flush),
        cmocka_unit_test_setup(test_cache_invalidation, tr_flush),
        cmocka_unit_test_setup(test_incarnation_change, tr_flush),
        cmocka_unit_test_setup(test_ttl_expiry, tr_flush),
        cmocka_unit_test_setup(test_heartbeat_restores_flushed_keys, tr_flush),
    };
    return cmocka_run_group_tests(tests, tr_group_setup, tr_group_teardown);
}
