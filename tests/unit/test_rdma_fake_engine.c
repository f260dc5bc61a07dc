/* The rdma transport inside two engines of one process, over the verbs
 * stand-in (linked with libfakeverbs.a): send-queue depth and signalling
 * with many chunks, cancellation and peer removal with work in flight, a
 * target region deregistered mid-batch (its rkeys revoked), engine
 * teardown with a batch running, and a descriptor naming another node whose
 * id shares the answering node's first 16 bytes (refused: the connect reply
 * carries the whole id). Everything must end, nothing may leak. */
#include "xfer.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

struct pair {
    xfer_engine *a, *b; /* a serves, b initiates */
    xfer_region *ra, *rb;
    xfer_peer *p;
    struct xfer_region_desc d;
};

static void pair_open(struct pair *x, size_t bytes, size_t chunk)
{
    memset(x, 0, sizeof(*x));
    struct xfer_engine_config cfg;
    int rc;
    xfer_engine_config_init(&cfg);
    cfg.transports = XFER_TRANSPORT_RDMA;
    cfg.chunk_bytes = chunk;
    cfg.io_timeout_ms = 3000;
    cfg.node_id = "target";
    x->a = xfer_engine_new(&cfg, &rc);
    assert_non_null(x->a);
    cfg.node_id = "initiator";
    x->b = xfer_engine_new(&cfg, &rc);
    assert_non_null(x->b);
    assert_int_equal(xfer_region_alloc(x->a, "t", bytes, XFER_ACCESS_RW, &x->ra), 0);
    assert_int_equal(xfer_region_alloc(x->b, "i", bytes, XFER_ACCESS_RW, &x->rb), 0);
    struct xfer_peer_desc pd;
    xfer_engine_describe(x->a, &pd);
    assert_true(strncmp(pd.nics, "fake0,", 6) == 0);
    assert_int_equal(xfer_peer_add(x->b, &pd, &x->p), 0);
    assert_int_equal(xfer_peer_transport(x->p), XFER_TRANSPORT_RDMA);
    xfer_region_describe(x->ra, &x->d);
    assert_true(x->d.rkeys[0] != '\0');
    assert_int_equal(xfer_peer_region_add(x->p, &x->d), 0);
}

static void pair_close(struct pair *x)
{
    xfer_engine_free(x->b);
    xfer_engine_free(x->a);
}

static xfer_batch *big_batch(struct pair *x, enum xfer_op op, int n, uint64_t size)
{
    int rc;
    xfer_batch *b = xfer_batch_new(x->b, &rc);
    assert_non_null(b);
    for (int i = 0; i < n; i++) {
        struct xfer_item it = {op,      x->rb,    (uint64_t)i * size, x->p,
                               x->d.id, x->d.gen, (uint64_t)i * size, size};
        assert_true(xfer_batch_add(b, &it) >= 0);
    }
    return b;
}

/* 1024 chunks of 16 KiB through 2 QPs of depth 4, one WR in 3 signaled. */
static void test_deep_queue(void **state)
{
    (void)state;
    setenv("XFER_RDMA_SQ_DEPTH", "4", 1);
    setenv("XFER_RDMA_SIGNAL_EVERY", "3", 1);
    struct pair x;
    pair_open(&x, 16 << 20, 16 << 10);
    uint8_t *src = xfer_region_ptr(x.rb), *dst = xfer_region_ptr(x.ra);
    for (size_t i = 0; i < (16 << 20); i++)
        src[i] = (uint8_t)(i * 131 + (i >> 12));
    xfer_batch *b = big_batch(&x, XFER_OP_WRITE, 4, 4 << 20);
    assert_int_equal(xfer_batch_submit(b, 20000), 0);
    assert_int_equal(xfer_batch_wait(b, -1), 0);
    assert_memory_equal(dst, src, 16 << 20);
    memset(src, 0, 16 << 20);
    xfer_batch_reset(b);
    xfer_batch_free(b);
    b = big_batch(&x, XFER_OP_READ, 4, 4 << 20);
    assert_int_equal(xfer_batch_submit(b, 20000), 0);
    assert_int_equal(xfer_batch_wait(b, -1), 0);
    assert_memory_equal(dst, src, 16 << 20);
    xfer_batch_free(b);
    pair_close(&x);
    unsetenv("XFER_RDMA_SQ_DEPTH");
    unsetenv("XFER_RDMA_SIGNAL_EVERY");
}

static void check_ended(xfer_batch *b, int n, int allowed_err, const char *what)
{
    for (int i = 0; i < n; i++) {
        int st = xfer_batch_item_status(b, i);
        if (st != 0 && st != allowed_err)
            fail_msg("%s: item %d ended with %s (%s)", what, i, xfer_strerror(st),
                     xfer_batch_item_error(b, i));
    }
}

static void test_cancel_in_flight(void **state)
{
    (void)state;
    struct pair x;
    pair_open(&x, 64 << 20, 64 << 10);
    for (int round = 0; round < 5; round++) {
        xfer_batch *b = big_batch(&x, round & 1 ? XFER_OP_READ : XFER_OP_WRITE, 64, 1 << 20);
        assert_int_equal(xfer_batch_submit(b, 20000), 0);
        assert_int_equal(xfer_batch_cancel(b), 0); /* returns once the NIC let go */
        check_ended(b, 64, -XFER_ECANCELED, "cancel");
        xfer_batch_free(b);
    }
    /* the connection is still good */
    xfer_batch *b = big_batch(&x, XFER_OP_READ, 8, 1 << 20);
    assert_int_equal(xfer_batch_submit(b, 20000), 0);
    assert_int_equal(xfer_batch_wait(b, -1), 0);
    xfer_batch_free(b);
    pair_close(&x);
}

static void test_target_deregisters(void **state)
{
    (void)state;
    struct pair x;
    pair_open(&x, 64 << 20, 64 << 10);
    xfer_batch *b = big_batch(&x, XFER_OP_READ, 64, 1 << 20);
    assert_int_equal(xfer_batch_submit(b, 20000), 0);
    assert_int_equal(xfer_region_deregister(x.a, x.ra), 0); /* rkeys revoked */
    int rc = xfer_batch_wait(b, -1);
    assert_true(rc == 0 || rc == -XFER_EACCES);
    check_ended(b, 64, -XFER_EACCES, "deregistered target");
    xfer_batch_free(b);
    /* the stale descriptor is refused by the NIC from now on */
    rc = xfer_read(x.b, x.rb, 0, x.p, x.d.id, x.d.gen, 0, 4096, 5000);
    assert_int_equal(rc, -XFER_EACCES);
    pair_close(&x);
}

static void test_peer_removed_in_flight(void **state)
{
    (void)state;
    struct pair x;
    pair_open(&x, 64 << 20, 64 << 10);
    xfer_batch *b = big_batch(&x, XFER_OP_WRITE, 64, 1 << 20);
    assert_int_equal(xfer_batch_submit(b, 20000), 0);
    assert_int_equal(xfer_peer_remove(x.b, x.p), 0);
    int rc = xfer_batch_wait(b, -1);
    assert_true(rc == 0 || rc == -XFER_ECONN);
    check_ended(b, 64, -XFER_ECONN, "peer removed");
    xfer_batch_free(b);
    pair_close(&x);
}

static void test_engine_freed_in_flight(void **state)
{
    (void)state;
    struct pair x;
    pair_open(&x, 64 << 20, 64 << 10);
    xfer_batch *b = big_batch(&x, XFER_OP_WRITE, 64, 1 << 20);
    assert_int_equal(xfer_batch_submit(b, 20000), 0);
    xfer_batch_free(b); /* cancels and waits */
    b = big_batch(&x, XFER_OP_READ, 64, 1 << 20);
    assert_int_equal(xfer_batch_submit(b, 20000), 0);
    xfer_engine_free(x.a); /* the target goes away under a running batch */
    int rc = xfer_batch_wait(b, -1);
    assert_true(rc == 0 || rc == -XFER_ECONN);
    check_ended(b, 64, -XFER_ECONN, "target freed");
    xfer_batch_free(b);
    xfer_engine_free(x.b);
}

/* Issue 14: the v1 reply carried 16 bytes of the node id, so a descriptor
 * of "cluster-a-prefill-node-2" was satisfied by "cluster-a-prefill-node-1"
 * answering at its address. */
static void test_twin_node_id_refused(void **state)
{
    (void)state;
    struct xfer_engine_config cfg;
    int rc;
    xfer_engine_config_init(&cfg);
    cfg.transports = XFER_TRANSPORT_RDMA;
    cfg.node_id = "cluster-a-prefill-node-1";
    xfer_engine *a = xfer_engine_new(&cfg, &rc);
    assert_non_null(a);
    cfg.node_id = "initiator";
    xfer_engine *b = xfer_engine_new(&cfg, &rc);
    assert_non_null(b);
    struct xfer_peer_desc pd;
    xfer_engine_describe(a, &pd);
    xfer_peer *p = NULL;
    assert_int_equal(xfer_peer_add(b, &pd, &p), 0); /* the right name connects */
    assert_int_equal(xfer_peer_remove(b, p), 0);
    snprintf(pd.node_id, sizeof(pd.node_id), "cluster-a-prefill-node-2");
    p = NULL;
    rc = xfer_peer_add(b, &pd, &p);
    if (rc == 0)
        rc = xfer_peer_connect(p);
    assert_true(rc < 0);
    if (!strstr(xfer_engine_last_error(b), "answered, expected"))
        fail_msg("twin refused for another reason: %s", xfer_engine_last_error(b));
    xfer_engine_free(b);
    xfer_engine_free(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_deep_queue),
        cmocka_unit_test(test_cancel_in_flight),
        cmocka_unit_test(test_target_deregisters),
        cmocka_unit_test(test_peer_removed_in_flight),
        cmocka_unit_test(test_engine_freed_in_flight),
        cmocka_unit_test(test_twin_node_id_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
