/* Registry schema against a real redis-server: what is written is exactly the
 * documented keys and fields (checked with raw hiredis, as redis-cli sees
 * them), lookups and listings read it back, malformed rows are skipped,
 * URLs with ACL users, unix sockets and db numbers work. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#define TR_GROUP_REDIS /* R: one redis-server for the group */
#include "registry_fixture.h"

static void expect_field(const char *key, const char *field, const char *want)
{
    char *got = tr_hget(&R, key, field);
    if (!got || strcmp(got, want))
        fail_msg("%s %s: got '%s', want '%s'", key, field, got ? got : "(nil)", want);
    free(got);
}

static uint64_t field_u64(const char *key, const char *field)
{
    char *got = tr_hget(&R, key, field);
    assert_non_null(got);
    char *end;
    uint64_t v = strtoull(got, &end, 10);
    assert_true(*got && !*end);
    free(got);
    return v;
}

static void publish_sample(xfer_registry *r, struct xfer_node_desc *n, struct xfer_region_desc d[2])
{
    tr_node(n, "n1");
    assert_int_equal(xfer_registry_publish_node(r, n), 0);
    assert_int_equal(xfer_registry_own_node(r, n), 0);
    tr_region(&d[0], "kv", 1);
    snprintf(d[0].layout.dtype, sizeof(d[0].layout.dtype), "bf16");
    d[0].layout.block_bytes = 16384;
    d[0].layout.num_blocks = 64;
    d[0].layout.layers = 32;
    snprintf(d[0].layout.tag, sizeof(d[0].layout.tag), "llama-3-8b");
    tr_region(&d[1], "g0", 2);
    d[1].kind = XFER_MEM_CUDA;
    d[1].device = 1;
    d[1].access = XFER_ACCESS_R;
    assert_int_equal(xfer_registry_publish_regions(r, d, 2), 0);
}

static void test_publish_readback(void **state)
{
    (void)state;
    xfer_registry *r = tr_registry(R.url, 10000);
    assert_non_null(r);
    struct xfer_node_desc n;
    struct xfer_region_desc d[2];
    uint64_t t0 = (uint64_t)time(NULL) * 1000;
    publish_sample(r, &n, d);

    /* xfer:nodes zset: n1 -> heartbeat ms */
    redisReply *z = tr_cmd(&R, "ZSCORE xfer:nodes n1");
    assert_non_null(z);
    assert_int_equal(z->type, REDIS_REPLY_STRING);
    uint64_t score = strtoull(z->str, NULL, 10);
    freeReplyObject(z);
    assert_true(score >= t0 - 1000 && score <= t0 + 60000);

    const char *nk = "xfer:node:{n1}";
    assert_int_equal(tr_int(&R, "HLEN %s", nk), 13);
    expect_field(nk, "host", "host-n1");
    expect_field(nk, "addr", "10.0.0.1");
    expect_field(nk, "ctrl_port", "7000");
    expect_field(nk, "data_port", "7001");
    expect_field(nk, "transports", "ipc,tcp");
    expect_field(nk, "gpus", "0:GPU-abc:0000:17:00.0");
    expect_field(nk, "nics", "mlx5_0,mlx5_1");
    expect_field(nk, "host_id", "boot-1234");
    expect_field(nk, "pid", "4242");
    expect_field(nk, "version", XFER_VERSION_STRING);
    assert_int_equal(field_u64(nk, "heartbeat_ms"), score);
    assert_true(field_u64(nk, "started_ms") >= t0 - 1000);
    assert_true(n.peer.incarnation != 0);
    assert_true(field_u64(nk, "incarnation") == n.peer.incarnation);
    long long pttl = tr_int(&R, "PTTL %s", nk);
    assert_true(pttl > 5000 && pttl <= 10000);

    /* regions set and hashes, each with a TTL */
    assert_int_equal(tr_int(&R, "SCARD xfer:regions:{n1}"), 2);
    assert_int_equal(tr_int(&R, "SISMEMBER xfer:regions:{n1} kv"), 1);
    assert_int_equal(tr_int(&R, "SISMEMBER xfer:regions:{n1} g0"), 1);
    assert_true(tr_int(&R, "PTTL xfer:regions:{n1}") > 5000);
    const char *rk = "xfer:region:{n1}:kv";
    assert_int_equal(tr_int(&R, "HLEN %s", rk), 15);
    assert_true(tr_int(&R, "PTTL %s", rk) > 5000);
    expect_field(rk, "id", "1");
    expect_field(rk, "gen", "3");
    expect_field(rk, "kind", "host");
    expect_field(rk, "device", "-1");
    expect_field(rk, "addr", "139637976731648"); /* 0x7f0000001000 */
    expect_field(rk, "len", "1048576");
    expect_field(rk, "access", "rw");
    expect_field(rk, "rkeys", "mlx5_0=0x1234");
    expect_field(rk, "ipc", "memfd:kv");
    assert_true(field_u64(rk, "created_ms") >= t0 - 1000);
    expect_field(rk, "dtype", "bf16");
    expect_field(rk, "block_bytes", "16384");
    expect_field(rk, "num_blocks", "64");
    expect_field(rk, "layers", "32");
    expect_field(rk, "tag", "llama-3-8b");
    expect_field("xfer:region:{n1}:g0", "kind", "cuda:1");
    expect_field("xfer:region:{n1}:g0", "device", "1");
    expect_field("xfer:region:{n1}:g0", "access", "r");
    expect_field("xfer:region:{n1}:g0", "dtype", "");

    /* read back through the API */
    xfer_registry *c = tr_registry(R.url, 10000);
    assert_non_null(c);
    struct xfer_node_desc got;
    assert_int_equal(xfer_registry_lookup_node(c, "n1", &got), 0);
    assert_memory_equal(&got.peer, &n.peer, sizeof(n.peer));
    assert_string_equal(got.host, n.host);
    assert_string_equal(got.gpus, n.gpus);
    assert_int_equal(got.ctrl_port, 7000);
    assert_int_equal(got.pid, 4242);
    assert_int_equal(got.heartbeat_ms, score);
    struct xfer_region_desc rd;
    assert_int_equal(xfer_registry_lookup_region(c, "n1", "kv", &rd), 0);
    assert_memory_equal(&rd, &d[0], sizeof(rd));
    assert_int_equal(xfer_registry_lookup_region(c, "n1", "g0", &rd), 0);
    assert_memory_equal(&rd, &d[1], sizeof(rd));

    struct xfer_node_desc *nodes;
    struct xfer_region_desc *regs;
    size_t nn, nr;
    assert_int_equal(xfer_registry_list_nodes(c, &nodes, &nn), 0);
    assert_int_equal(nn, 1);
    assert_string_equal(nodes[0].peer.node_id, "n1");
    free(nodes);
    assert_int_equal(xfer_registry_list_regions(c, "n1", &regs, &nr), 0);
    assert_int_equal(nr, 2);
    assert_string_equal(regs[0].name, "g0");
    assert_string_equal(regs[1].name, "kv");
    free(regs);
    xfer_registry_free(c);
    xfer_registry_free(r);
}

static void test_unknown_names(void **state)
{
    (void)state;
    xfer_registry *r = tr_registry(R.url, 10000);
    struct xfer_node_desc n;
    struct xfer_region_desc d[2];
    publish_sample(r, &n, d);
    assert_int_equal(xfer_registry_lookup_node(r, "ghost", &n), -XFER_ENOENT);
    assert_non_null(strstr(xfer_registry_last_error(r), "ghost"));
    struct xfer_region_desc rd;
    assert_int_equal(xfer_registry_lookup_region(r, "n1", "nope", &rd), -XFER_ENOENT);
    assert_non_null(strstr(xfer_registry_last_error(r), "nope"));
    assert_non_null(strstr(xfer_registry_last_error(r), "n1"));
    assert_int_equal(xfer_registry_lookup_region(r, "ghost", "kv", &rd), -XFER_ENOENT);
    assert_non_null(strstr(xfer_registry_last_error(r), "ghost"));
    struct xfer_region_desc *regs;
    size_t nr;
    assert_int_equal(xfer_registry_list_regions(r, "ghost", &regs, &nr), -XFER_ENOENT);
    assert_int_equal(xfer_registry_lookup_node(r, "bad name", &n), -XFER_EINVAL);
    xfer_registry_free(r);
}

static void test_unpublish(void **state)
{
    (void)state;
    xfer_registry *r = tr_registry(R.url, 10000);
    struct xfer_node_desc n;
    struct xfer_region_desc d[2];
    publish_sample(r, &n, d);
    assert_int_equal(xfer_registry_unpublish_region(r, "kv"), 0);
    assert_int_equal(tr_int(&R, "EXISTS xfer:region:{n1}:kv"), 0);
    assert_int_equal(tr_int(&R, "SISMEMBER xfer:regions:{n1} kv"), 0);
    assert_int_equal(xfer_registry_unpublish_region(r, "kv"), -XFER_ENOENT);
    struct xfer_region_desc rd;
    assert_int_equal(xfer_registry_lookup_region(r, "n1", "kv", &rd), -XFER_ENOENT);
    assert_int_equal(xfer_registry_unpublish_node(r), 0);
    assert_int_equal(tr_int(&R, "EXISTS xfer:node:{n1}"), 0);
    assert_int_equal(tr_int(&R, "EXISTS xfer:regions:{n1}"), 0);
    assert_int_equal(tr_int(&R, "EXISTS xfer:region:{n1}:g0"), 0);
    assert_int_equal(tr_int(&R, "ZCARD xfer:nodes"), 0);
    assert_int_equal(xfer_registry_unpublish_node(r), -XFER_ENOENT);
    /* a handle can publish again after a clean leave, under another id */
    tr_node(&n, "n2");
    assert_int_equal(xfer_registry_publish_node(r, &n), 0);
    assert_int_equal(tr_int(&R, "EXISTS xfer:node:{n2}"), 1);
    xfer_registry_free(r);
}

static void test_malformed_rows(void **state)
{
    (void)state;
    xfer_registry *r = tr_registry(R.url, 10000);
    struct xfer_node_desc n;
    struct xfer_region_desc d[2];
    publish_sample(r, &n, d);
    char longs[300];
    memset(longs, 'h', sizeof(longs) - 1);
    longs[sizeof(longs) - 1] = '\0';
    const char *bad[][2] = {
        {"bad1", "HSET xfer:node:{bad1} data_port 1 transports tcp host_id h incarnation 1"},
        {"bad2",
         "HSET xfer:node:{bad2} addr a data_port 12x transports tcp host_id h incarnation 1"},
        {"bad3",
         "HSET xfer:node:{bad3} addr a data_port 99999 transports tcp host_id h incarnation 1"},
        {"bad4", "HSET xfer:node:{bad4} addr a data_port 1 transports carrier-pigeon host_id h "
                 "incarnation 1"},
        {"bad5", "HSET xfer:node:{bad5} addr a data_port 1 transports tcp host_id h incarnation "
                 "99999999999999999999"},
    };
    for (size_t i = 0; i < 5; i++) {
        freeReplyObject(tr_cmd(&R, bad[i][1]));
        freeReplyObject(tr_cmd(&R, "ZADD xfer:nodes 1 %s", bad[i][0]));
    }
    freeReplyObject(tr_cmd(&R,
                           "HSET xfer:node:{bad6} addr %s data_port 1 transports tcp "
                           "host_id h incarnation 1",
                           longs));
    freeReplyObject(tr_cmd(&R, "ZADD xfer:nodes 1 bad6"));
    freeReplyObject(tr_cmd(&R, "ZADD xfer:nodes 1 gone")); /* expired: no hash */
    freeReplyObject(tr_cmd(&R, "ZADD xfer:nodes 1 %s", "sp ace"));
    struct xfer_node_desc *nodes;
    size_t nn;
    assert_int_equal(xfer_registry_list_nodes(r, &nodes, &nn), 0);
    assert_int_equal(nn, 1);
    assert_string_equal(nodes[0].peer.node_id, "n1");
    free(nodes);
    assert_int_equal(xfer_registry_lookup_node(r, "bad2", &n), -XFER_EPROTO);
    assert_non_null(strstr(xfer_registry_last_error(r), "data_port"));
    assert_int_equal(xfer_registry_lookup_node(r, "bad6", &n), -XFER_EPROTO);

    /* malformed regions of a good node */
    freeReplyObject(
        tr_cmd(&R, "HSET xfer:region:{n1}:r1 id 5 gen 1 kind host addr 0 len abc access rw"));
    freeReplyObject(
        tr_cmd(&R, "HSET xfer:region:{n1}:r2 id 6 gen 1 kind gpu addr 0 len 1 access rw"));
    freeReplyObject(
        tr_cmd(&R, "HSET xfer:region:{n1}:r3 id 7 gen 1 kind host addr 0 len 1 access x"));
    freeReplyObject(tr_cmd(
        &R, "HSET xfer:region:{n1}:r4 id 8 gen 1 kind cuda:1 device 2 addr 0 len 1 access r"));
    freeReplyObject(
        tr_cmd(&R, "HSET xfer:region:{n1}:r5 id 4294967296 gen 1 kind host addr 0 len 1 access r"));
    freeReplyObject(tr_cmd(&R, "SADD xfer:regions:{n1} r1 r2 r3 r4 r5 r6 {x}"));
    struct xfer_region_desc *regs;
    size_t nr;
    assert_int_equal(xfer_registry_list_regions(r, "n1", &regs, &nr), 0);
    assert_int_equal(nr, 2);
    assert_string_equal(regs[0].name, "g0");
    assert_string_equal(regs[1].name, "kv");
    free(regs);
    struct xfer_region_desc rd;
    assert_int_equal(xfer_registry_lookup_region(r, "n1", "r1", &rd), -XFER_EPROTO);
    assert_non_null(strstr(xfer_registry_last_error(r), "len"));
    assert_int_equal(xfer_registry_lookup_region(r, "n1", "r4", &rd), -XFER_EPROTO);
    xfer_registry_free(r);
}

static void test_publish_validation(void **state)
{
    (void)state;
    xfer_registry *r = tr_registry(R.url, 10000);
    struct xfer_node_desc n;
    struct xfer_region_desc d;
    tr_region(&d, "kv", 1);
    assert_int_equal(xfer_registry_publish_region(r, &d), -XFER_EINVAL); /* node first */
    tr_node(&n, "bad{id}");
    assert_int_equal(xfer_registry_publish_node(r, &n), -XFER_EINVAL);
    tr_node(&n, "n1");
    n.peer.addr[0] = '\0';
    assert_int_equal(xfer_registry_publish_node(r, &n), -XFER_EINVAL);
    tr_node(&n, "n1");
    assert_int_equal(xfer_registry_publish_node(r, &n), 0);
    tr_node(&n, "other");
    assert_int_equal(xfer_registry_publish_node(r, &n), -XFER_EINVAL);
    d.access = 0;
    assert_int_equal(xfer_registry_publish_region(r, &d), -XFER_EINVAL);
    tr_region(&d, "a b", 1);
    assert_int_equal(xfer_registry_publish_region(r, &d), -XFER_EINVAL);
    tr_region(&d, "g", 1);
    d.kind = XFER_MEM_CUDA;
    d.device = -1;
    assert_int_equal(xfer_registry_publish_region(r, &d), -XFER_EINVAL);
    d.device = 1024;
    assert_int_equal(xfer_registry_publish_region(r, &d), -XFER_EINVAL);
    assert_int_equal(tr_int(&R, "SCARD xfer:regions:{n1}"), 0);
    /* re-publish keeps the incarnation unless a new one is given */
    struct xfer_node_desc own;
    assert_int_equal(xfer_registry_own_node(r, &own), 0);
    uint64_t inc = own.peer.incarnation;
    tr_node(&n, "n1");
    n.peer.data_port = 9999;
    assert_int_equal(xfer_registry_publish_node(r, &n), 0);
    assert_int_equal(xfer_registry_own_node(r, &own), 0);
    assert_true(own.peer.incarnation == inc);
    expect_field("xfer:node:{n1}", "data_port", "9999");
    xfer_registry_free(r);
}

static void test_acl_user(void **state)
{
    (void)state;
    redisReply *rep = tr_cmd(&R, "ACL SETUSER xu on >pw ~xfer:* &xfer:* +@all");
    assert_non_null(rep);
    assert_int_equal(rep->type, REDIS_REPLY_STATUS);
    freeReplyObject(rep);
    char url[160];
    snprintf(url, sizeof(url), "redis://xu:pw@127.0.0.1:%d", R.port);
    xfer_registry *r = tr_registry(url, 10000);
    assert_non_null(r);
    struct xfer_node_desc n;
    struct xfer_region_desc d[2];
    publish_sample(r, &n, d);
    assert_int_equal(xfer_registry_heartbeat(r), 0);
    struct xfer_region_desc rd;
    xfer_registry_cache_clear(r);
    assert_int_equal(xfer_registry_lookup_region(r, "n1", "kv", &rd), 0);
    xfer_registry_free(r);

    snprintf(url, sizeof(url), "redis://xu:wrong@127.0.0.1:%d", R.port);
    struct xfer_registry_config cfg;
    xfer_registry_config_init(&cfg);
    cfg.url = url;
    int err = 0;
    assert_null(xfer_registry_new(&cfg, &err));
    assert_int_equal(err, -XFER_EAUTH);
    freeReplyObject(tr_cmd(&R, "ACL DELUSER xu"));
}

static void test_unix_socket_db(void **state)
{
    (void)state;
    char url[200];
    snprintf(url, sizeof(url), "unix://%s?db=2", R.sock);
    xfer_registry *r = tr_registry(url, 10000);
    assert_non_null(r);
    struct xfer_node_desc n;
    struct xfer_region_desc d[2];
    publish_sample(r, &n, d);
    assert_int_equal(tr_int(&R, "EXISTS xfer:node:{n1}"), 0); /* not in db 0 */
    redisContext *c = tr_raw(&R);
    redisReply *rep = redisCommand(c, "SELECT 2");
    freeReplyObject(rep);
    rep = redisCommand(c, "EXISTS xfer:node:{n1}");
    assert_int_equal(rep->integer, 1);
    freeReplyObject(rep);
    redisFree(c);
    xfer_registry_free(r);
}

static void test_connect_errors(void **state)
{
    (void)state;
    struct xfer_registry_config cfg;
    xfer_registry_config_init(&cfg);
    int err = 0;
    cfg.url = "http://x";
    assert_null(xfer_registry_new(&cfg, &err));
    assert_int_equal(err, -XFER_EINVAL);
    char url[64];
    snprintf(url, sizeof(url), "redis://127.0.0.1:%d", tr_free_port());
    cfg.url = url;
    uint64_t t0 = tr_now_ms();
    assert_null(xfer_registry_new(&cfg, &err));
    assert_int_equal(err, -XFER_EUNAVAIL);
    assert_true(tr_now_ms() - t0 < 1000);
    assert_non_null(strstr(xfer_registry_last_error(NULL), "127.0.0.1"));
    cfg.start_offline = true;
    xfer_registry *r = xfer_registry_new(&cfg, &err);
    assert_non_null(r);
    assert_false(xfer_registry_connected(r));
    struct xfer_node_desc n;
    tr_node(&n, "n1");
    assert_int_equal(xfer_registry_publish_node(r, &n), -XFER_EUNAVAIL);
    assert_int_equal(xfer_registry_lookup_node(r, "n1", &n), -XFER_EUNAVAIL);
    xfer_registry_free(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_publish_readback, tr_flush),
        cmocka_unit_test_setup(test_unknown_names, tr_flush),
        cmocka_unit_test_setup(test_unpublish, tr_flush),
        cmocka_unit_test_setup(test_malformed_rows, tr_flush),
        cmocka_unit_test_setup(test_publish_validation, tr_flush),
        cmocka_unit_test_setup(test_acl_user, tr_flush),
        cmocka_unit_test_setup(test_unix_socket_db, tr_flush),
        cmocka_unit_test_setup(test_connect_errors, tr_flush),
    };
    return cmocka_run_group_tests(tests, tr_group_setup, tr_group_teardown);
}
