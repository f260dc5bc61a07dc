/* Sentinel mode against a fake sentinel (a real socket, tests/unit/fake_redis.h)
 * and real redis-servers: the primary it names is used; a -READONLY reply
 * (the primary was turned into a replica) makes the registry ask again and
 * republish on the new primary; bad sentinel answers (unknown master, error,
 * wrong type, a replica named as primary, nobody listening) give clear
 * -XFER_EUNAVAIL errors and no crash. The real failover with three real
 * sentinels is tests/integration/test_registry_sentinel.sh. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "fake_redis.h"
#include "registry_fixture.h"

enum answer { ANS_PRIMARY, ANS_NIL, ANS_ERROR, ANS_INT };

struct fake_sentinel {
    atomic_int port; /* the primary it names */
    atomic_int answer;
};

static void sentinel_handler(struct fake_redis *f, int argc, char **argv, char *out, size_t cap)
{
    struct fake_sentinel *s = f->arg;
    if (argc != 3 || strcasecmp(argv[0], "SENTINEL") ||
        strcasecmp(argv[1], "get-master-addr-by-name")) {
        snprintf(out, cap, "-ERR fake sentinel: unknown command '%s'\r\n", argv[0]);
        return;
    }
    char port[16];
    snprintf(port, sizeof(port), "%d", atomic_load(&s->port));
    const char *v[] = {"127.0.0.1", port};
    switch (atomic_load(&s->answer)) {
    case ANS_NIL:
        snprintf(out, cap, "*-1\r\n");
        break;
    case ANS_ERROR:
        snprintf(out, cap, "-ERR sentinel is confused\r\n");
        break;
    case ANS_INT:
        snprintf(out, cap, ":42\r\n");
        break;
    default:
        if (strcmp(argv[2], "xfer"))
            snprintf(out, cap, "*-1\r\n");
        else
            fake_bulk_array(out, cap, 2, v);
    }
}

struct ctx {
    struct test_redis a, b;
    struct fake_redis fake;
    struct fake_sentinel s;
    char url[128];
};

static int setup(void **state)
{
    struct ctx *c = calloc(1, sizeof(*c));
    if (!c || test_redis_start(&c->a) || test_redis_start(&c->b))
        return -1;
    atomic_store(&c->s.port, c->a.port);
    if (fake_redis_start(&c->fake, sentinel_handler, &c->s))
        return -1;
    snprintf(c->url, sizeof(c->url), "redis-sentinel://127.0.0.1:%d/xfer", c->fake.port);
    *state = c;
    return 0;
}

static int teardown(void **state)
{
    struct ctx *c = *state;
    fake_redis_stop(&c->fake);
    test_redis_stop(&c->a);
    test_redis_stop(&c->b);
    free(c);
    return 0;
}

static bool has_node(const struct test_redis *t)
{
    return tr_int(t, "EXISTS xfer:node:{n1}") == 1 && tr_int(t, "EXISTS xfer:region:{n1}:kv") == 1;
}

struct on_b {
    struct ctx *c;
};
static bool node_on_b(void *arg)
{
    return has_node(&((struct on_b *)arg)->c->b);
}

static void test_readonly_moves(void **state)
{
    struct ctx *c = *state;
    xfer_registry *r = tr_registry(c->url, 3000);
    assert_non_null(r);
    struct xfer_node_desc n;
    struct xfer_region_desc d;
    tr_node(&n, "n1");
    tr_region(&d, "kv", 1);
    assert_int_equal(xfer_registry_publish_node(r, &n), 0);
    assert_int_equal(xfer_registry_publish_regions(r, &d, 1), 0);
    assert_true(has_node(&c->a));

    /* a becomes a replica of b (as after a failover the old primary would);
     * the sentinel names b. The next write is refused with READONLY. */
    atomic_store(&c->s.port, c->b.port);
    redisReply *rep = tr_cmd(&c->a, "REPLICAOF 127.0.0.1 %d", c->b.port);
    assert_non_null(rep);
    freeReplyObject(rep);
    int rc = xfer_registry_heartbeat(r);
    assert_int_not_equal(rc, 0);
    printf("heartbeat into the demoted primary: %s\n", xfer_registry_last_error(r));
    struct on_b arg = {c};
    assert_true(tr_wait(r, node_on_b, &arg, 3000)); /* tick: ask, reconnect, republish */
    assert_int_equal(xfer_registry_heartbeat(r), 0);
    xfer_registry_free(r);
}

static void expect_new_fails(const char *url, const char *needle)
{
    struct xfer_registry_config cfg;
    xfer_registry_config_init(&cfg);
    cfg.url = url;
    cfg.timeout_ms = 500;
    int err = 0;
    xfer_registry *r = xfer_registry_new(&cfg, &err);
    assert_null(r);
    assert_int_equal(err, -XFER_EUNAVAIL);
    const char *why = xfer_registry_last_error(NULL);
    printf("%s -> %s\n", url, why);
    if (!strstr(why, needle))
        fail_msg("'%s' does not say '%s'", why, needle);
}

static void test_bad_answers(void **state)
{
    struct ctx *c = *state;
    char url[160];
    snprintf(url, sizeof(url), "redis-sentinel://127.0.0.1:%d/nope", c->fake.port);
    expect_new_fails(url, "does not know master 'nope'");
    atomic_store(&c->s.answer, ANS_ERROR);
    expect_new_fails(c->url, "sentinel is confused");
    atomic_store(&c->s.answer, ANS_INT);
    expect_new_fails(c->url, "unexpected answer");
    atomic_store(&c->s.answer, ANS_NIL);
    expect_new_fails(c->url, "does not know master 'xfer'");

    /* The sentinel names a replica: not used. */
    atomic_store(&c->s.answer, ANS_PRIMARY);
    redisReply *rep = tr_cmd(&c->a, "REPLICAOF 127.0.0.1 %d", c->b.port);
    assert_non_null(rep);
    freeReplyObject(rep);
    atomic_store(&c->s.port, c->a.port);
    expect_new_fails(c->url, "is not a primary");

    /* Nobody listening on two sentinel ports; the second is also asked. */
    int p1 = tr_free_port(), p2 = tr_free_port();
    snprintf(url, sizeof(url), "redis-sentinel://127.0.0.1:%d,127.0.0.1:%d/xfer", p1, p2);
    char second[32];
    snprintf(second, sizeof(second), "127.0.0.1:%d", p2);
    expect_new_fails(url, second);
    assert_true(atomic_load(&c->fake.commands) >= 5);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_readonly_moves, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_answers, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
