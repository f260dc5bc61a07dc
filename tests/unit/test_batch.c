/* Batch state machine, driven through a fake transport that the test
 * completes by hand: chunk accounting, per-item errors, eventfd, cancel
 * waiting for io_begin/io_end, deadlines with a stuck transport, holds that
 * outlive the user's free, and an unconnected peer. White-box: the fake
 * connection is installed through engine/internal.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "batch.h"
#include "xfer_grow.h"
#include "internal.h"

/* ---- fake transport: remembers what was posted ---- */
struct posted {
    xfer_batch *b;
    size_t idx[64];
    size_t n;
    int calls;
};
static struct posted posted;

static int fake_post(struct xfer_conn *c, xfer_batch *b, const size_t *idx, size_t n)
{
    (void)c;
    posted.b = b;
    posted.n = n;
    posted.calls++;
    memcpy(posted.idx, idx, n * sizeof(*idx));
    xfer_batch_hold(b); /* like a real transport awaiting responses */
    return 0;
}
static void fake_disconnect(struct xfer_conn *c)
{
    (void)c;
}
static const struct xfer_transport_ops fake_ops = {
    .name = "fake",
    .bit = XFER_TRANSPORT_TCP,
    .caps = XFER_CAP_HOST_MEM,
    .post = fake_post,
    .disconnect = fake_disconnect,
};
static struct xfer_transport fake_transport = {.ops = &fake_ops};
static struct xfer_conn fake_conn = {.transport = &fake_transport};

struct fixture {
    xfer_engine *e;
    xfer_region *r;
    xfer_peer *p;    /* with the fake connection */
    xfer_peer *dead; /* never connected */
};

static int setup(void **state)
{
    static struct fixture f;
    struct xfer_engine_config cfg;
    xfer_engine_config_init(&cfg);
    cfg.node_id = "unit";
    cfg.transports = XFER_TRANSPORT_TCP;
    cfg.io_timeout_ms = 200;
    cfg.connect_timeout_ms = 200;
    int rc;
    f.e = xfer_engine_new(&cfg, &rc);
    if (!f.e || xfer_region_alloc(f.e, "local", 1 << 20, XFER_ACCESS_RW, &f.r) < 0)
        return -1;
    struct xfer_peer_desc d = {
        .node_id = "fake", .addr = "127.0.0.1", .data_port = 0, .transports = 0};
    xfer_peer_add(f.e, &d, &f.p); /* no common transport: stays unconnected */
    f.p->conn = &fake_conn;       /* ... until the fake one is installed */
    fake_conn.peer = f.p;
    struct xfer_peer_desc d2 = {
        .node_id = "nobody", .addr = "127.0.0.1", .data_port = 1, .transports = XFER_TRANSPORT_TCP};
    xfer_peer_add(f.e, &d2, &f.dead); /* connection refused */
    memset(&posted, 0, sizeof(posted));
    *state = &f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    xfer_engine_free(f->e);
    return 0;
}

static struct xfer_item item(struct fixture *f, enum xfer_op op, uint64_t off, uint64_t len)
{
    return (struct xfer_item){op, f->r, off, f->p, 7, 1, 0, len};
}

static void test_add_checks_local_bounds(void **state)
{
    struct fixture *f = *state;
    xfer_batch *b = xfer_batch_new(f->e, NULL);
    struct xfer_item it = item(f, XFER_OP_READ, (1 << 20) - 10, 10);
    assert_int_equal(xfer_batch_add(b, &it), 0); /* ends exactly at the end */
    it.len = 11;
    assert_int_equal(xfer_batch_add(b, &it), -XFER_ERANGE);
    it = item(f, XFER_OP_READ, UINT64_MAX, 2);
    assert_int_equal(xfer_batch_add(b, &it), -XFER_ERANGE);
    it = item(f, XFER_OP_READ, 1 << 20, 0);
    assert_int_equal(xfer_batch_add(b, &it), 1); /* empty item at the end */
    it.op = 0;
    assert_int_equal(xfer_batch_add(b, &it), -XFER_EINVAL);
    assert_int_equal(xfer_batch_count(b), 2);
    assert_int_equal(xfer_batch_poll(b), -XFER_EINVAL); /* not submitted */
    xfer_batch_free(b);
}

static void test_chunks_complete_items(void **state)
{
    struct fixture *f = *state;
    xfer_batch *b = xfer_batch_new(f->e, NULL);
    struct xfer_item a = item(f, XFER_OP_WRITE, 0, 1000), c = item(f, XFER_OP_READ, 4096, 10);
    xfer_batch_add(b, &a);
    xfer_batch_add(b, &c);
    assert_int_equal(xfer_batch_submit(b, 5000), 0);
    assert_int_equal(posted.n, 2);
    assert_int_equal(xfer_batch_poll(b), -XFER_EINPROGRESS);
    assert_int_equal(xfer_batch_item_status(b, 0), -XFER_EINPROGRESS);
    xfer_batch_chunk_done(b, 0, 600, 0, NULL);
    assert_int_equal(xfer_batch_item_status(b, 0), -XFER_EINPROGRESS);
    xfer_batch_chunk_done(b, 0, 400, 0, NULL);
    assert_int_equal(xfer_batch_item_status(b, 0), 0);
    struct pollfd pfd = {xfer_batch_fd(b), POLLIN, 0};
    assert_int_equal(poll(&pfd, 1, 0), 0); /* not finished: fd quiet */
    assert_int_equal(xfer_batch_poll(b), -XFER_EINPROGRESS);
    xfer_batch_chunk_done(b, 1, 10, 0, NULL);
    assert_int_equal(poll(&pfd, 1, 1000), 1);
    assert_int_equal(xfer_batch_poll(b), 0);
    assert_int_equal(xfer_batch_wait(b, 0), 0);
    xfer_batch_put(b); /* the fake transport's hold */
    struct xfer_stats st;
    xfer_engine_stats(f->e, &st);
    assert_int_equal(st.ops_write, 1);
    assert_int_equal(st.bytes_read, 10);
    xfer_batch_free(b);
}

static void test_item_errors_are_kept(void **state)
{
    struct fixture *f = *state;
    xfer_batch *b = xfer_batch_new(f->e, NULL);
    for (int i = 0; i < 3; i++) {
        struct xfer_item it = item(f, XFER_OP_READ, (uint64_t)i * 100, 100);
        xfer_batch_add(b, &it);
    }
    xfer_batch_submit(b, 5000);
    xfer_batch_chunk_done(b, 0, 100, 0, NULL);
    xfer_batch_chunk_done(b, 2, 0, -XFER_EACCES, "target refused: read-only");
    xfer_batch_chunk_done(b, 1, 0, -XFER_ERANGE, NULL);
    xfer_batch_chunk_done(b, 1, 100, 0, NULL);                /* late success is ignored */
    assert_int_equal(xfer_batch_wait(b, 1000), -XFER_ERANGE); /* first failing item */
    assert_int_equal(xfer_batch_item_status(b, 0), 0);
    assert_int_equal(xfer_batch_item_status(b, 1), -XFER_ERANGE);
    assert_int_equal(xfer_batch_item_status(b, 2), -XFER_EACCES);
    assert_string_equal(xfer_batch_item_error(b, 2), "target refused: read-only");
    assert_int_equal(xfer_batch_item_status(b, 3), -XFER_ENOENT);
    xfer_batch_put(b);
    xfer_batch_free(b);
}

static void *cancel_thread(void *arg)
{
    void **ctx = arg;
    *(int *)ctx[1] = xfer_batch_cancel(ctx[0]);
    __atomic_store_n((int *)ctx[2], 1, __ATOMIC_RELEASE);
    return NULL;
}

static void test_cancel_waits_for_io(void **state)
{
    struct fixture *f = *state;
    xfer_batch *b = xfer_batch_new(f->e, NULL);
    struct xfer_item it = item(f, XFER_OP_READ, 0, 4096);
    xfer_batch_add(b, &it);
    xfer_batch_submit(b, 5000);
    assert_true(xfer_batch_io_begin(b, 0)); /* transport writes local memory */
    int rc = 1, done = 0;
    void *ctx[3] = {b, &rc, &done};
    pthread_t t;
    pthread_create(&t, NULL, cancel_thread, ctx);
    for (int i = 0; i < 1000 && xfer_batch_item_live(b, 0); i++)
        usleep(1000);
    assert_false(xfer_batch_item_live(b, 0)); /* the item ended at once ... */
    assert_false(xfer_batch_io_begin(b, 0));  /* ... no new access starts ... */
    usleep(50000);
    assert_int_equal(__atomic_load_n(&done, __ATOMIC_ACQUIRE), 0); /* ... cancel waits */
    assert_int_equal(xfer_batch_poll(b), -XFER_EINPROGRESS);
    xfer_batch_io_end(b, 0);
    pthread_join(t, NULL);
    assert_int_equal(rc, 0);
    assert_int_equal(xfer_batch_poll(b), -XFER_ECANCELED);
    assert_int_equal(xfer_batch_item_status(b, 0), -XFER_ECANCELED);
    xfer_batch_put(b);
    xfer_batch_free(b);
}

static void test_deadline_with_stuck_transport(void **state)
{
    struct fixture *f = *state;
    xfer_batch *b = xfer_batch_new(f->e, NULL);
    struct xfer_item it = item(f, XFER_OP_WRITE, 0, 4096);
    xfer_batch_add(b, &it);
    int64_t t0 = xfer_mono_ns();
    xfer_batch_submit(b, 100); /* the fake transport never answers */
    assert_int_equal(xfer_batch_wait(b, -1), -XFER_ETIMEDOUT);
    int64_t ms = (xfer_mono_ns() - t0) / 1000000;
    assert_true(ms >= 100 && ms < 1000);
    assert_int_equal(xfer_batch_item_status(b, 0), -XFER_ETIMEDOUT);
    /* the transport's late completion lands nowhere */
    xfer_batch_chunk_done(b, 0, 4096, 0, NULL);
    assert_int_equal(xfer_batch_poll(b), -XFER_ETIMEDOUT);
    xfer_batch_put(b);
    xfer_batch_free(b);
}

static void test_hold_outlives_free_and_gates_resubmit(void **state)
{
    struct fixture *f = *state;
    xfer_batch *b = xfer_batch_new(f->e, NULL);
    struct xfer_item it = item(f, XFER_OP_READ, 0, 64);
    xfer_batch_add(b, &it);
    xfer_batch_submit(b, 5000);
    xfer_batch_chunk_done(b, 0, 64, 0, NULL);
    assert_int_equal(xfer_batch_wait(b, 1000), 0);
    /* a transport hold is outstanding: resubmit waits until it is put */
    xfer_batch_put(b);
    assert_int_equal(xfer_batch_submit(b, 5000), 0); /* rerun of the same items */
    assert_int_equal(posted.calls, 2);
    xfer_batch_free(b); /* cancels; the hold keeps the memory valid */
    assert_false(xfer_batch_io_begin(b, 0));
    xfer_batch_chunk_done(b, 0, 64, 0, NULL); /* ignored, no crash (ASan) */
    xfer_batch_put(b);                        /* last reference: freed */
}

static void test_unconnected_peer_fails_fast(void **state)
{
    struct fixture *f = *state;
    xfer_batch *b = xfer_batch_new(f->e, NULL);
    struct xfer_item it = item(f, XFER_OP_READ, 0, 64), ok = item(f, XFER_OP_READ, 64, 64);
    it.peer = f->dead;
    xfer_batch_add(b, &it);
    xfer_batch_add(b, &ok);
    xfer_batch_submit(b, 5000);
    assert_int_equal(xfer_batch_item_status(b, 0), -XFER_ECONN);
    assert_int_equal(xfer_batch_poll(b), -XFER_EINPROGRESS); /* item 1 still runs */
    xfer_batch_chunk_done(b, 1, 64, 0, NULL);
    assert_int_equal(xfer_batch_wait(b, 1000), -XFER_ECONN);
    assert_non_null(strstr(xfer_batch_item_error(b, 0), "not connected"));
    xfer_batch_put(b);
    assert_int_equal(xfer_batch_reset(b), 0);
    assert_int_equal(xfer_batch_count(b), 0);
    xfer_batch_free(b);
}

/* The one grow helper: doubles from first, keeps the contents, and refuses
 * a size that overflows without touching the array. */
static void test_grow_keeps_contents(void **state)
{
    (void)state;
    uint32_t *v = NULL;
    size_t cap = 0;
    assert_int_equal(xfer_grow((void **)&v, &cap, 0, sizeof(*v), 16), 0);
    assert_null(v); /* nothing wanted: nothing allocated */
    assert_int_equal(xfer_grow((void **)&v, &cap, 5, sizeof(*v), 16), 0);
    assert_int_equal(cap, 16);
    for (uint32_t i = 0; i < 16; i++)
        v[i] = i * 7;
    assert_int_equal(xfer_grow((void **)&v, &cap, 17, sizeof(*v), 16), 0);
    assert_int_equal(cap, 32);
    assert_int_equal(xfer_grow((void **)&v, &cap, 100, sizeof(*v), 16), 0);
    assert_int_equal(cap, 128);
    for (uint32_t i = 0; i < 16; i++)
        assert_int_equal(v[i], i * 7);
    uint32_t *was = v;
    assert_int_equal(xfer_grow((void **)&v, &cap, SIZE_MAX / 2, sizeof(*v), 16), -XFER_ENOMEM);
    assert_int_equal(xfer_grow((void **)&v, &cap, SIZE_MAX, 1, 16), -XFER_ENOMEM);
    assert_ptr_equal(v, was);
    assert_int_equal(cap, 128);
    free(v);
}

/* Items, segments and names grow past their first capacity (16, 256, 16)
 * with what was added kept in order. */
static void test_batch_arrays_grow(void **state)
{
    struct fixture *f = *state;
    xfer_batch *b = xfer_batch_new(f->e, NULL);
    struct xfer_item it = item(f, XFER_OP_WRITE, 0, 0);
    for (uint32_t i = 0; i < 120; i++) {
        struct xfer_seg segs[3];
        for (uint32_t k = 0; k < 3; k++)
            segs[k] = (struct xfer_seg){i * 64 + k * 16, i * 100 + k, 8 + k};
        assert_int_equal(xfer_batch_add_segments(b, &it, segs, 3), (int)(2 * i));
        struct xfer_item one = item(f, XFER_OP_READ, i, 1);
        assert_int_equal(xfer_batch_add(b, &one), (int)(2 * i + 1));
    }
    assert_int_equal(xfer_batch_count(b), 240);
    assert_int_equal(b->nsegs, 360);
    assert_true(b->capsegs >= 360 && b->cap >= 240);
    for (uint32_t i = 0; i < 120; i++) {
        const struct batch_item *bi = &b->items[2 * i];
        assert_int_equal(bi->nseg, 3);
        for (uint32_t k = 0; k < 3; k++) {
            const struct xfer_seg *sg = &b->segs[bi->seg0 + k];
            assert_int_equal(sg->local_off, i * 64 + k * 16);
            assert_int_equal(sg->remote_off, i * 100 + k);
            assert_int_equal(sg->len, 8 + k);
        }
        assert_int_equal(b->items[2 * i + 1].it.local_off, i);
    }
    for (uint32_t j = 0; j < 20; j++) /* RECVs from anyone: a name each */
        assert_int_equal(xfer_batch_add_recv(b, f->r, j * 8, 8, NULL, j), (int)(240 + j));
    assert_int_equal(b->nnames, 20);
    assert_true(b->capnames >= 20);
    for (uint32_t j = 0; j < 20; j++) {
        assert_int_equal(b->items[240 + j].name, j + 1);
        assert_int_equal(b->items[240 + j].tag, j);
    }
    xfer_batch_free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_add_checks_local_bounds, setup, teardown),
        cmocka_unit_test_setup_teardown(test_chunks_complete_items, setup, teardown),
        cmocka_unit_test_setup_teardown(test_item_errors_are_kept, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cancel_waits_for_io, setup, teardown),
        cmocka_unit_test_setup_teardown(test_deadline_with_stuck_transport, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hold_outlives_free_and_gates_resubmit, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_unconnected_peer_fails_fast, setup, teardown),
        cmocka_unit_test(test_grow_keeps_contents),
        cmocka_unit_test_setup_teardown(test_batch_arrays_grow, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
