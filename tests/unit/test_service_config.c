/* service/config.c and node/names.c: file/env/flag precedence, region
 * sections, sizes, named addresses and layout checks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "config.h"
#include "xfer_node.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char *write_tmp(const char *text)
{
    static char path[64];
    snprintf(path, sizeof(path), "/tmp/xferd-conf-test.%d", (int)getpid());
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return path;
}

static void test_sizes(void **state)
{
    (void)state;
    uint64_t v;
    assert_int_equal(xferd_parse_size("123", &v), 0);
    assert_int_equal(v, 123);
    assert_int_equal(xferd_parse_size("4k", &v), 0);
    assert_int_equal(v, 4096);
    assert_int_equal(xferd_parse_size("64M", &v), 0);
    assert_int_equal(v, 64u << 20);
    assert_int_equal(xferd_parse_size("1GiB", &v), 0);
    assert_int_equal(v, 1u << 30);
    assert_int_equal(xferd_parse_size("0x10", &v), 0);
    assert_int_equal(v, 16);
    assert_int_not_equal(xferd_parse_size("-1", &v), 0);
    assert_int_not_equal(xferd_parse_size("12q", &v), 0);
    assert_int_not_equal(xferd_parse_size("", &v), 0);
    assert_int_not_equal(xferd_parse_size("99999999999T", &v), 0);
}

static void test_file_env_flags(void **state)
{
    (void)state;
    struct xferd_config c;
    char why[300];
    const char *path = write_tmp("# comment\n"
                                 "node = filenode\n"
                                 "redis_url = redis://10.0.0.9:7000\n"
                                 "listen = 10.0.0.1:7001   # data port too\n"
                                 "ttl_ms = 3000\n"
                                 "sockets_per_peer = 8\n"
                                 "[region kv]\n"
                                 "size = 64M\n"
                                 "access = r\n"
                                 "dtype = bf16\n"
                                 "block_bytes = 4k\n"
                                 "num_blocks = 16k\n"
                                 "layers = 32\n"
                                 "tag = llama\n"
                                 "[region scratch]\n"
                                 "size = 1M\n");
    xferd_config_defaults(&c);
    assert_int_equal(c.sockets_per_peer, 4); /* engine data path defaults */
    assert_int_equal(c.progress_threads, 1);
    assert_int_equal(c.chunk_bytes, 1 << 20);
    assert_int_equal(c.busy_poll_us, 0);
    assert_int_equal(xferd_config_load_file(&c, path, why, sizeof(why)), 0);
    assert_int_equal(c.sockets_per_peer, 8);
    assert_string_equal(c.node, "filenode");
    assert_string_equal(c.listen, "10.0.0.1");
    assert_int_equal(c.data_port, 7001);
    assert_int_equal(c.nregions, 2);
    assert_string_equal(c.regions[0].name, "kv");
    assert_int_equal(c.regions[0].size, 64u << 20);
    assert_int_equal(c.regions[0].access, XFER_ACCESS_R);
    assert_int_equal(c.regions[0].layout.block_bytes, 4096);
    assert_int_equal(c.regions[0].layout.layers, 32);
    assert_string_equal(c.regions[0].layout.tag, "llama");
    assert_int_equal(c.regions[1].access, XFER_ACCESS_RW);

    setenv("XFER_NODE", "envnode", 1);
    setenv("XFER_TTL_MS", "2000", 1);
    setenv("XFER_PROGRESS_THREADS", "2", 1);
    assert_int_equal(xferd_config_load_env(&c, why, sizeof(why)), 0);
    unsetenv("XFER_NODE");
    unsetenv("XFER_TTL_MS");
    unsetenv("XFER_PROGRESS_THREADS");
    assert_int_equal(c.progress_threads, 2);
    assert_int_equal(xferd_config_set(&c, "chunk-bytes", "262144", why, sizeof(why)), 0);
    assert_int_equal(c.chunk_bytes, 262144);
    assert_string_equal(c.node, "envnode");
    assert_int_equal(c.ttl_ms, 2000);
    assert_int_equal(xferd_config_set(&c, "node", "flagnode", why, sizeof(why)), 0);
    assert_int_equal(xferd_config_set(&c, "heartbeat-ms", "500", why, sizeof(why)), 0);
    assert_int_equal(xferd_config_set(&c, "secret", "s3cret", why, sizeof(why)), 0);
    assert_int_equal(xferd_config_finish(&c, why, sizeof(why)), 0);
    assert_string_equal(c.node, "flagnode");
    assert_string_equal(c.ctrl_socket, "/tmp/xferd-flagnode.sock");
    assert_string_equal(c.advertise, "10.0.0.1");
    unlink(path);
}

static void test_bad_config(void **state)
{
    (void)state;
    struct xferd_config c;
    char why[300];
    const char *bad[] = {"node = a\nbogus = 1\n",  "[region]\nsize=1\n",  "[region x]\nsize=abc\n",
                         "ttl_ms = 1\n",           "just words\n",        "node = a/b\n",
                         "[region x]\nfoo=1\n",    "chunk_bytes = 100\n", "sockets_per_peer = 0\n",
                         "progress_threads = 65\n"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        xferd_config_defaults(&c);
        const char *path = write_tmp(bad[i]);
        assert_int_equal(xferd_config_load_file(&c, path, why, sizeof(why)), -XFER_EINVAL);
        assert_non_null(strstr(why, ":"));
        unlink(path);
    }
    xferd_config_defaults(&c);
    assert_int_equal(xferd_config_finish(&c, why, sizeof(why)), -XFER_EINVAL);
    assert_non_null(strstr(why, "node"));
    assert_int_equal(xferd_config_load_file(&c, "/nonexistent/x.conf", why, sizeof(why)),
                     -XFER_ENOENT);
    xferd_config_defaults(&c);
    assert_int_equal(xferd_config_add_region_spec(&c, "a:1M:rw", why, sizeof(why)), 0);
    assert_int_equal(xferd_config_add_region_spec(&c, "a:1M", why, sizeof(why)), 0);
    assert_int_not_equal(xferd_config_add_region_spec(&c, "b", why, sizeof(why)), 0);
    assert_int_not_equal(xferd_config_add_region_spec(&c, "b:1M:x", why, sizeof(why)), 0);
    xferd_config_set(&c, "node", "n", why, sizeof(why));
    assert_int_equal(xferd_config_finish(&c, why, sizeof(why)), -XFER_EINVAL);
    assert_non_null(strstr(why, "twice"));
    xferd_config_defaults(&c);
    xferd_config_set(&c, "node", "n", why, sizeof(why));
    xferd_config_set(&c, "listen", "0.0.0.0", why, sizeof(why));
    assert_int_equal(xferd_config_finish(&c, why, sizeof(why)), -XFER_EINVAL);
    assert_non_null(strstr(why, "advertise"));
    xferd_config_set(&c, "advertise", "10.1.2.3", why, sizeof(why));
    /* beyond loopback with no secret: refused unless insecure on purpose */
    assert_int_equal(xferd_config_finish(&c, why, sizeof(why)), -XFER_EINVAL);
    assert_non_null(strstr(why, "no cluster secret"));
    assert_non_null(strstr(why, "--insecure"));
    assert_true(xferd_config_unauthenticated_exposed(&c));
    assert_int_equal(xferd_config_set(&c, "insecure", "maybe", why, sizeof(why)), -XFER_EINVAL);
    assert_int_equal(xferd_config_set(&c, "insecure", "true", why, sizeof(why)), 0);
    assert_int_equal(xferd_config_finish(&c, why, sizeof(why)), 0);
    c.insecure = false;
    xferd_config_set(&c, "secret", "s3cret", why, sizeof(why));
    assert_int_equal(xferd_config_finish(&c, why, sizeof(why)), 0);
    assert_false(xferd_config_unauthenticated_exposed(&c));
    /* loopback needs no secret */
    xferd_config_defaults(&c);
    xferd_config_set(&c, "node", "n", why, sizeof(why));
    xferd_config_set(&c, "listen", "127.0.0.2", why, sizeof(why));
    assert_int_equal(xferd_config_finish(&c, why, sizeof(why)), 0);
    assert_true(xferd_addr_is_loopback("::1"));
    assert_false(xferd_addr_is_loopback("10.0.0.1"));
    assert_false(xferd_addr_is_loopback("::"));
}

static void test_naddr(void **state)
{
    (void)state;
    struct xfer_node_addr n;
    char why[200];
    assert_int_equal(xfer_node_addr_parse("n1/kv", &n, why, sizeof(why)), 0);
    assert_string_equal(n.node, "n1");
    assert_string_equal(n.region, "kv");
    assert_int_equal(n.off, 0);
    assert_int_equal(xfer_node_addr_parse("n1/kv+4k", &n, why, sizeof(why)), 0);
    assert_int_equal(n.off, 4096);
    assert_false(n.is_block);
    assert_int_equal(xfer_node_addr_parse("n1/kv#7", &n, why, sizeof(why)), 0);
    assert_int_equal(n.off, 7);
    assert_true(n.is_block);
    const char *bad[] = {"", "n1", "/kv", "n1/", "n1/kv+", "n1/kv+x", "n1/a/b", "n1/+3"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        assert_int_equal(xfer_node_addr_parse(bad[i], &n, why, sizeof(why)), -XFER_EINVAL);
}

/* pool = NAME=GEOMETRY: parsed by the node library, names checked here. */
static void test_pools(void **state)
{
    (void)state;
    struct xferd_config c;
    char why[300];
    xferd_config_defaults(&c);
    assert_int_equal(xferd_config_set(&c, "pool", "kv=vllm_fa:bf16:16K:4096:32", why, sizeof(why)),
                     0);
    assert_int_equal(xferd_config_set(&c, "pool", "lat=mla:fp8:1K:64:4:1:dsv3", why, sizeof(why)),
                     0);
    assert_int_equal(c.npools, 2);
    assert_string_equal(c.pools[0].name, "kv");
    assert_int_equal(c.pools[0].geom.layout, XFER_KV_VLLM_FA);
    assert_int_equal(c.pools[0].geom.block_bytes, 16384);
    assert_int_equal(c.pools[0].geom.layers, 32);
    assert_int_equal(c.pools[0].geom.kv, 2);
    assert_int_equal(c.pools[1].geom.kv, 1);
    assert_string_equal(c.pools[1].geom.tag, "dsv3");
    assert_int_equal(xferd_config_set(&c, "pool", "m=mla:fp8:1K:64:4", why, sizeof(why)), 0);
    assert_int_equal(c.pools[2].geom.kv, 1); /* mla without KV: one latent tensor */
    assert_int_not_equal(xferd_config_set(&c, "pool", "kv", why, sizeof(why)), 0);
    assert_int_not_equal(xferd_config_set(&c, "pool", "a.b=mla:fp8:1K:64:4", why, sizeof(why)), 0);
    assert_int_not_equal(xferd_config_set(&c, "pool", "x=vllm_fa:bf16:4K:8:2:3", why, sizeof(why)),
                         0);
    assert_non_null(strstr(why, "pool x"));
    assert_int_not_equal(xferd_config_set(&c, "pool", "x=paged:bf16:4K:8:2", why, sizeof(why)), 0);
    assert_non_null(strstr(why, "bad pool geometry"));
    assert_int_equal(c.npools, 3);
}

static void test_layouts(void **state)
{
    (void)state;
    char why[200];
    struct xfer_layout a = {.dtype = "bf16", .block_bytes = 4096, .num_blocks = 8, .layers = 2};
    struct xfer_layout b = a, none = {0};
    assert_int_equal(xfer_layouts_match(&a, &b, why, sizeof(why)), 0);
    assert_int_equal(xfer_layout_block_size(&a), 8192);
    b.block_bytes = 2048;
    assert_int_equal(xfer_layouts_match(&a, &b, why, sizeof(why)), -XFER_EMISMATCH);
    assert_non_null(strstr(why, "disagree"));
    b = a;
    strcpy(b.dtype, "fp8");
    assert_int_equal(xfer_layouts_match(&a, &b, why, sizeof(why)), -XFER_EMISMATCH);
    assert_int_equal(xfer_layouts_match(&a, &none, why, sizeof(why)), -XFER_EMISMATCH);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sizes),      cmocka_unit_test(test_file_env_flags),
        cmocka_unit_test(test_bad_config), cmocka_unit_test(test_naddr),
        cmocka_unit_test(test_layouts),    cmocka_unit_test(test_pools),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
