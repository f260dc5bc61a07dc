/* KV block transfers -> batch items (engine/blocks.c): runs of blocks that
 * are consecutive on both sides become one item, offsets and lengths follow
 * the block-major layout, layouts and ids are checked and a refused call
 * appends nothing. No transfer runs: the peer is never connected. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "transport.h"

#define BB     4096u /* block_bytes */
#define LAYERS 3u
#define NB     64u
#define BS     ((uint64_t)BB * LAYERS)

struct fixture {
    xfer_engine *e;
    xfer_region *r;
    xfer_peer *p;
    struct xfer_region_desc rd;
    xfer_batch *b;
};

static const struct xfer_layout kv = {
    .dtype = "bf16", .block_bytes = BB, .num_blocks = NB, .layers = LAYERS, .tag = "m"};

static int setup(void **state)
{
    static struct fixture f;
    struct xfer_engine_config cfg;
    xfer_engine_config_init(&cfg);
    cfg.node_id = "blocks";
    cfg.transports = XFER_TRANSPORT_TCP;
    int rc;
    f.e = xfer_engine_new(&cfg, &rc);
    if (!f.e || xfer_region_alloc(f.e, "kv", NB * BS, XFER_ACCESS_RW, &f.r) < 0 ||
        xfer_region_set_layout(f.r, &kv) < 0)
        return -1;
    struct xfer_peer_desc d = {.node_id = "far", .addr = "127.0.0.1", .transports = 0};
    if (xfer_peer_add(f.e, &d, &f.p) < 0 && !f.p)
        return -1;
    memset(&f.rd, 0, sizeof(f.rd));
    snprintf(f.rd.name, sizeof(f.rd.name), "kv");
    f.rd.id = 7;
    f.rd.gen = 2;
    f.rd.len = 2 * NB * BS; /* remote pool is twice as large */
    f.rd.access = XFER_ACCESS_RW;
    f.rd.layout = kv;
    f.rd.layout.num_blocks = 2 * NB;
    f.rd.layout.tag[0] = '\0'; /* a tag on one side only is fine */
    if (xfer_peer_region_add(f.p, &f.rd) < 0)
        return -1;
    f.b = xfer_batch_new(f.e, &rc);
    *state = &f;
    return f.b ? 0 : -1;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    xfer_batch_free(f->b);
    xfer_engine_free(f->e);
    return 0;
}

static void expect_item(xfer_batch *b, size_t i, uint64_t lblock, uint64_t rblock, uint64_t n)
{
    const struct xfer_item *it = xfer_batch_item(b, i);
    assert_int_equal(it->local_off, lblock * BS);
    assert_int_equal(it->remote_off, rblock * BS);
    assert_int_equal(it->len, n * BS);
    assert_int_equal(it->remote_id, 7);
    assert_int_equal(it->remote_gen, 2);
}

static void test_runs(void **state)
{
    struct fixture *f = *state;
    /* 7,8,9->40,41,42 is one run; 19->2; 3->11; 4->13 breaks (remote not +1);
     * 20,21 -> 14,15 one run; repeated block 63 twice -> two items */
    uint64_t l[] = {7, 8, 9, 19, 3, 4, 20, 21, 63, 63};
    uint64_t r[] = {40, 41, 42, 2, 11, 13, 14, 15, 127, 126};
    int n = xfer_batch_add_blocks(f->b, XFER_OP_WRITE, f->r, l, f->p, 7, 2, r, 10);
    assert_int_equal(n, 7);
    assert_int_equal(xfer_batch_count(f->b), 7);
    expect_item(f->b, 0, 7, 40, 3);
    expect_item(f->b, 1, 19, 2, 1);
    expect_item(f->b, 2, 3, 11, 1);
    expect_item(f->b, 3, 4, 13, 1);
    expect_item(f->b, 4, 20, 14, 2);
    expect_item(f->b, 5, 63, 127, 1);
    expect_item(f->b, 6, 63, 126, 1);
    assert_int_equal(xfer_batch_item(f->b, 0)->op, XFER_OP_WRITE);
    /* appending more continues the indices; zero blocks add nothing */
    uint64_t all_l[NB], all_r[NB];
    for (unsigned i = 0; i < NB; i++) {
        all_l[i] = i;
        all_r[i] = NB + i;
    }
    assert_int_equal(xfer_batch_add_blocks(f->b, XFER_OP_READ, f->r, all_l, f->p, 7, 2, all_r, NB),
                     1);
    expect_item(f->b, 7, 0, NB, NB);
    assert_int_equal(xfer_batch_add_blocks(f->b, XFER_OP_READ, f->r, NULL, f->p, 7, 2, NULL, 0), 0);
    assert_int_equal(xfer_batch_count(f->b), 8);
}

static void test_refusals(void **state)
{
    struct fixture *f = *state;
    uint64_t l[] = {1, 2, 5}, r[] = {1, 2, 5};
    /* ids outside either side: nothing appended */
    uint64_t bad_l[] = {1, 2, NB};
    assert_int_equal(xfer_batch_add_blocks(f->b, XFER_OP_WRITE, f->r, bad_l, f->p, 7, 2, r, 3),
                     -XFER_ERANGE);
    assert_non_null(strstr(xfer_engine_last_error(f->e), "local block id"));
    uint64_t bad_r[] = {1, 2 * NB, 3};
    assert_int_equal(xfer_batch_add_blocks(f->b, XFER_OP_WRITE, f->r, l, f->p, 7, 2, bad_r, 3),
                     -XFER_ERANGE);
    assert_int_equal(xfer_batch_count(f->b), 0);
    /* unknown remote region, bad op */
    assert_int_equal(xfer_batch_add_blocks(f->b, XFER_OP_WRITE, f->r, l, f->p, 99, 2, r, 3),
                     -XFER_ENOENT);
    assert_int_equal(xfer_batch_add_blocks(f->b, 0, f->r, l, f->p, 7, 2, r, 3), -XFER_EINVAL);
    /* mismatched layouts: block_bytes, layers, dtype, tag; untyped */
    struct xfer_region_desc d = f->rd;
    d.id = 8;
    d.layout.block_bytes = 2 * BB;
    assert_int_equal(xfer_peer_region_add(f->p, &d), 0);
    assert_int_equal(xfer_batch_add_blocks(f->b, XFER_OP_READ, f->r, l, f->p, 8, 2, r, 3),
                     -XFER_EMISMATCH);
    assert_non_null(strstr(xfer_engine_last_error(f->e), "layouts disagree"));
    d = f->rd;
    d.id = 9;
    d.layout.layers = 1;
    xfer_peer_region_add(f->p, &d);
    assert_int_equal(xfer_batch_add_blocks(f->b, XFER_OP_READ, f->r, l, f->p, 9, 2, r, 3),
                     -XFER_EMISMATCH);
    d = f->rd;
    d.id = 10;
    snprintf(d.layout.tag, sizeof(d.layout.tag), "other");
    xfer_peer_region_add(f->p, &d);
    assert_int_equal(xfer_batch_add_blocks(f->b, XFER_OP_READ, f->r, l, f->p, 10, 2, r, 3),
                     -XFER_EMISMATCH);
    d = f->rd;
    d.id = 11;
    memset(&d.layout, 0, sizeof(d.layout));
    xfer_peer_region_add(f->p, &d);
    assert_int_equal(xfer_batch_add_blocks(f->b, XFER_OP_READ, f->r, l, f->p, 11, 2, r, 3),
                     -XFER_EMISMATCH);
    assert_int_equal(xfer_batch_count(f->b), 0);
    /* a pool shorter than num_blocks says: ids bounded by the length */
    d = f->rd;
    d.id = 12;
    d.len = 4 * BS + 1;
    xfer_peer_region_add(f->p, &d);
    uint64_t r4[] = {1, 2, 4};
    assert_int_equal(xfer_batch_add_blocks(f->b, XFER_OP_READ, f->r, l, f->p, 12, 2, r4, 3),
                     -XFER_ERANGE);
    uint64_t r3[] = {1, 2, 3};
    assert_int_equal(xfer_batch_add_blocks(f->b, XFER_OP_READ, f->r, l, f->p, 12, 2, r3, 3), 2);
}

static void test_layout_helpers(void **state)
{
    (void)state;
    struct xfer_layout a = {.block_bytes = 100}, b = a;
    assert_int_equal(xfer_layout_block_size(&a), 100); /* layers 0 counts as 1 */
    a.layers = 1;
    assert_int_equal(xfer_layouts_match(&a, &b, NULL, 0), -XFER_EMISMATCH);
    b.layers = 1;
    assert_int_equal(xfer_layouts_match(&a, &b, NULL, 0), 0);
    a.layers = 3;
    assert_int_equal(xfer_layout_block_size(&a), 300);
    a.block_bytes = UINT64_MAX / 2;
    assert_int_equal(xfer_layout_block_size(&a), 0); /* overflow: untyped */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_runs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refusals, setup, teardown),
        cmocka_unit_test(test_layout_helpers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
