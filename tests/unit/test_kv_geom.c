/* node/kv_geom.c: KV pool layouts (region counts, names) and the
 * compatibility check that names the differing field. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "xfer_node.h"

#include <stdio.h>
#include <string.h>

static struct xfer_kv_geom base(enum xfer_kv_layout l)
{
    struct xfer_kv_geom g = {.layout = l,
                             .block_bytes = 4096,
                             .num_blocks = 100,
                             .layers = 32,
                             .kv = l == XFER_KV_MLA ? 1 : 2,
                             .block_tokens = 16,
                             .kv_heads = 8,
                             .head_dim = 128,
                             .shard_count = 1};
    snprintf(g.dtype, sizeof(g.dtype), "bf16");
    snprintf(g.tag, sizeof(g.tag), "llama-3-8b");
    return g;
}

static void test_regions(void **state)
{
    (void)state;
    struct xfer_kv_geom g = base(XFER_KV_BLOCK_MAJOR);
    assert_int_equal(xfer_kv_geom_regions(&g), 1);
    g = base(XFER_KV_VLLM_FA);
    assert_int_equal(xfer_kv_geom_regions(&g), 32);
    g = base(XFER_KV_FLASHINFER);
    assert_int_equal(xfer_kv_geom_regions(&g), 32);
    g = base(XFER_KV_SGLANG);
    assert_int_equal(xfer_kv_geom_regions(&g), 64);
    g = base(XFER_KV_MLA);
    assert_int_equal(xfer_kv_geom_regions(&g), 32);
    g.kv = 2; /* MLA has one latent tensor per layer */
    assert_int_equal(xfer_kv_geom_regions(&g), 0);
    g = base(XFER_KV_VLLM_FA);
    g.block_bytes = 0;
    assert_int_equal(xfer_kv_geom_regions(&g), 0);
    g = base(XFER_KV_VLLM_FA);
    g.shard_rank = 2, g.shard_count = 2;
    assert_int_equal(xfer_kv_geom_regions(&g), 0);
    g = base(XFER_KV_BLOCK_MAJOR);
    g.num_blocks = UINT64_MAX / 4096; /* offsets would overflow */
    assert_int_equal(xfer_kv_geom_regions(&g), 0);
}

static void test_names(void **state)
{
    (void)state;
    static const char *const n[] = {"block_major", "vllm_fa", "flashinfer", "sglang", "mla"};
    for (int i = 0; i < 5; i++) {
        enum xfer_kv_layout l;
        assert_string_equal(xfer_kv_layout_name((enum xfer_kv_layout)i), n[i]);
        assert_int_equal(xfer_kv_layout_parse(n[i], &l), 0);
        assert_int_equal(l, i);
    }
    enum xfer_kv_layout l;
    assert_int_equal(xfer_kv_layout_parse("paged", &l), -XFER_EINVAL);
}

static void test_match(void **state)
{
    (void)state;
    char why[128];
    struct xfer_kv_geom a = base(XFER_KV_VLLM_FA), b = base(XFER_KV_FLASHINFER);
    b.num_blocks = 7; /* block counts and layouts may differ */
    assert_int_equal(xfer_kv_geom_match(&a, &b, why, sizeof(why)), 0);
    static const char *const fields[] = {"dtype",    "block_bytes",  "layers", "kv_heads",
                                         "head_dim", "block_tokens", "shard",  "tag"};
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
        b = a;
        switch (i) {
        case 0:
            snprintf(b.dtype, sizeof(b.dtype), "fp8");
            break;
        case 1:
            b.block_bytes = 2048;
            break;
        case 2:
            b.layers = 31;
            break;
        case 3:
            b.kv_heads = 4;
            break;
        case 4:
            b.head_dim = 64;
            break;
        case 5:
            b.block_tokens = 32;
            break;
        case 6:
            b.shard_rank = 1, b.shard_count = 2;
            break;
        default:
            b.tag[0] = '\0';
            break;
        }
        assert_int_equal(xfer_kv_geom_match(&a, &b, why, sizeof(why)), -XFER_EMISMATCH);
        assert_non_null(strstr(why, fields[i]));
    }
    b = a; /* optional fields not given on one side are not compared */
    b.kv_heads = b.head_dim = b.block_tokens = 0;
    assert_int_equal(xfer_kv_geom_match(&a, &b, why, sizeof(why)), 0);
    b = base(XFER_KV_MLA);
    assert_int_equal(xfer_kv_geom_match(&a, &b, why, sizeof(why)), -XFER_EMISMATCH);
    assert_non_null(strstr(why, "kv"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_regions),
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_match),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
