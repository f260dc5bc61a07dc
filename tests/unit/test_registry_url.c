/* Redis URL parsing and name validation (no server needed). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "xfer_registry.h"

static void parse_ok(const char *url, struct xfer_redis_url *u)
{
    char err[128] = "";
    int rc = xfer_redis_url_parse(url, u, err, sizeof(err));
    if (rc)
        fail_msg("%s: %s", url, err);
}

static void test_plain(void **state)
{
    (void)state;
    struct xfer_redis_url u;
    parse_ok("redis://127.0.0.1:6380", &u);
    assert_false(u.is_unix);
    assert_string_equal(u.host, "127.0.0.1");
    assert_int_equal(u.port, 6380);
    assert_int_equal(u.db, 0);
    assert_string_equal(u.user, "");
    assert_string_equal(u.password, "");
    parse_ok("redis://redis.example", &u);
    assert_string_equal(u.host, "redis.example");
    assert_int_equal(u.port, 6379);
    parse_ok("redis://h:1/7", &u);
    assert_int_equal(u.db, 7);
    parse_ok("redis://h:1/", &u);
    assert_int_equal(u.db, 0);
}

static void test_userinfo(void **state)
{
    (void)state;
    struct xfer_redis_url u;
    parse_ok("redis://alice:s3cr%40t@10.1.2.3:7000/2", &u);
    assert_string_equal(u.user, "alice");
    assert_string_equal(u.password, "s3cr@t");
    assert_string_equal(u.host, "10.1.2.3");
    assert_int_equal(u.port, 7000);
    assert_int_equal(u.db, 2);
    parse_ok("redis://:onlypw@h:1", &u);
    assert_string_equal(u.user, "");
    assert_string_equal(u.password, "onlypw");
    parse_ok("redis://pw@h", &u); /* redis-cli -u style: password alone */
    assert_string_equal(u.password, "pw");
    parse_ok("redis://a:b:c@h:2", &u); /* password may contain ':' */
    assert_string_equal(u.user, "a");
    assert_string_equal(u.password, "b:c");
    parse_ok("redis://u:p@ss@h:3", &u); /* the last '@' ends the userinfo */
    assert_string_equal(u.password, "p@ss");
    assert_string_equal(u.host, "h");
}

static void test_ipv6_unix(void **state)
{
    (void)state;
    struct xfer_redis_url u;
    parse_ok("redis://[::1]:6390", &u);
    assert_string_equal(u.host, "::1");
    assert_int_equal(u.port, 6390);
    parse_ok("unix:///run/redis/redis.sock", &u);
    assert_true(u.is_unix);
    assert_string_equal(u.host, "/run/redis/redis.sock");
    assert_int_equal(u.db, 0);
    parse_ok("unix:///tmp/r.sock?db=3", &u);
    assert_string_equal(u.host, "/tmp/r.sock");
    assert_int_equal(u.db, 3);
}

static void test_sentinel_cluster(void **state)
{
    (void)state;
    struct xfer_redis_url u;
    parse_ok("redis-sentinel://alice:pw@10.0.0.1,10.0.0.2:26380,[::1]/mymaster/3", &u);
    assert_int_equal(u.mode, XFER_REDIS_SENTINEL);
    assert_int_equal(u.n_seeds, 3);
    assert_string_equal(u.seeds[0].host, "10.0.0.1");
    assert_int_equal(u.seeds[0].port, 26379);
    assert_string_equal(u.seeds[1].host, "10.0.0.2");
    assert_int_equal(u.seeds[1].port, 26380);
    assert_string_equal(u.seeds[2].host, "::1");
    assert_string_equal(u.master, "mymaster");
    assert_int_equal(u.db, 3);
    assert_string_equal(u.user, "alice");
    assert_string_equal(u.password, "pw");
    assert_string_equal(u.host, "10.0.0.1"); /* first seed */
    parse_ok("redis-sentinel://s:1/m", &u);
    assert_int_equal(u.n_seeds, 1);
    assert_int_equal(u.db, 0);
    parse_ok("redis-cluster://a:7000,b:7001,c", &u);
    assert_int_equal(u.mode, XFER_REDIS_CLUSTER);
    assert_int_equal(u.n_seeds, 3);
    assert_int_equal(u.seeds[2].port, 6379);
    assert_string_equal(u.master, "");
    parse_ok("redis-cluster://:pw@a:7000/0", &u);
    assert_string_equal(u.password, "pw");
    parse_ok("redis://h:1", &u);
    assert_int_equal(u.mode, XFER_REDIS_SINGLE);
    assert_int_equal(u.n_seeds, 0);
}

static void test_bad(void **state)
{
    (void)state;
    const char *bad[] = {
        "",
        "http://h:1",
        "redis://",
        "redis://:1",
        "redis://h:0",
        "redis://h:65536",
        "redis://h:12x",
        "redis://h:1/x",
        "redis://h:1/-1",
        "redis://[::1",
        "redis://[::1]x",
        "unix://",
        "unix://rel/path",
        "unix:///p?x=1",
        "redis://u:%zz@h",
        "redis://u:%4@h",
        "redis://user:@h",
        "redis-sentinel://s:1",
        "redis-sentinel://s:1/",
        "redis-sentinel://s:1,/m",
        "redis-sentinel://s:1,s:x/m",
        "redis-sentinel://s:1/m/x",
        "redis-sentinel://s:1/a b",
        "redis-sentinel://",
        "redis-cluster://",
        "redis-cluster://a:1,,b:2",
        "redis-cluster://a:1/3",
        "redis-cluster://a,b,c,d,e,f,g,h,i,j,k,l,m,n,o,p,q",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct xfer_redis_url u;
        char err[128] = "";
        int rc = xfer_redis_url_parse(bad[i], &u, err, sizeof(err));
        if (rc != -XFER_EINVAL)
            fail_msg("'%s' accepted", bad[i]);
        assert_true(err[0] != '\0');
    }
    char longhost[400];
    memset(longhost, 'a', sizeof(longhost));
    memcpy(longhost, "redis://", 8);
    longhost[sizeof(longhost) - 1] = '\0';
    struct xfer_redis_url u;
    assert_int_equal(xfer_redis_url_parse(longhost, &u, NULL, 0), -XFER_EINVAL);
    assert_int_equal(xfer_redis_url_parse(NULL, &u, NULL, 0), -XFER_EINVAL);
}

static void test_names(void **state)
{
    (void)state;
    assert_true(xfer_registry_name_ok("n1"));
    assert_true(xfer_registry_name_ok("kv-cache.0:layer/3"));
    assert_false(xfer_registry_name_ok(""));
    assert_false(xfer_registry_name_ok(NULL));
    assert_false(xfer_registry_name_ok("a b"));
    assert_false(xfer_registry_name_ok("a{b"));
    assert_false(xfer_registry_name_ok("a}b"));
    assert_false(xfer_registry_name_ok("tab\there"));
    char n[XFER_NAME_MAX + 1];
    memset(n, 'x', sizeof(n));
    n[XFER_NAME_MAX - 1] = '\0';
    assert_true(xfer_registry_name_ok(n));
    n[XFER_NAME_MAX - 1] = 'x';
    n[XFER_NAME_MAX] = '\0';
    assert_false(xfer_registry_name_ok(n));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plain),
        cmocka_unit_test(test_userinfo),
        cmocka_unit_test(test_sentinel_cluster),
        cmocka_unit_test(test_ipv6_unix),
        cmocka_unit_test(test_bad),
        cmocka_unit_test(test_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
