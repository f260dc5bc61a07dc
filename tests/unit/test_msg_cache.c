/* The message path's block caches (engine/blk_cache.h) and the sizes at
 * which a message leaves them: a cache that is empty or full falls back to
 * malloc / free and never fails; blocks are never handed to two threads at
 * once; more messages, notifications and receives in flight than a cache
 * holds, with sizes on both sides of every cached-block limit (a binding's
 * inline bytes, a cached notification, a cached frame, an RTS with its
 * eager bytes in a cached entry), all arrive whole. Two engines over tcp in
 * this process. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blk_cache.h"
#include "xfer.h"

#define BURST    40 /* more than XFER_BLK_SLOTS in flight */
#define REGION   (4u << 20)
#define SLOT     (64u << 10) /* one message's room in the regions */
#define DEADLINE 10000

static void test_bounds(void **state)
{
    (void)state;
    struct xfer_blk_cache c = {.size = 64};
    void *p[BURST];
    for (int k = 0; k < BURST; k++) { /* empty: malloc */
        p[k] = xfer_blk_get(&c);
        assert_non_null(p[k]);
        memset(p[k], k, 64);
    }
    assert_int_equal(c.misses, BURST);
    for (int k = 0; k < BURST; k++) /* full after XFER_BLK_SLOTS: free */
        xfer_blk_put(&c, p[k]);
    int cached = 0;
    for (int k = 0; k < XFER_BLK_SLOTS; k++)
        cached += c.slot[k] != NULL;
    assert_int_equal(cached, XFER_BLK_SLOTS);
    for (int k = 0; k < BURST; k++) {
        p[k] = xfer_blk_get(&c);
        assert_non_null(p[k]);
        for (int j = 0; j < k; j++)
            assert_ptr_not_equal(p[j], p[k]);
    }
    assert_int_equal(c.hits, XFER_BLK_SLOTS);
    assert_int_equal(c.misses, 2 * BURST - XFER_BLK_SLOTS);
    for (int k = 0; k < BURST; k++)
        xfer_blk_put(&c, p[k]);
    xfer_blk_put(&c, NULL); /* nothing */
    for (int k = 0; k < XFER_BLK_SLOTS; k++)
        free(xfer_blk_get(&c)); /* a cached block is a malloc block */
}

static struct xfer_blk_cache shared = {.size = 128};

static void *hammer(void *arg)
{
    uint8_t id = (uint8_t)(uintptr_t)arg;
    for (int k = 0; k < 50000; k++) {
        uint8_t *b = xfer_blk_get(&shared);
        if (!b)
            return (void *)1;
        memset(b, id, 128);
        if (k % 64 == 0)
            sched_yield();
        for (int i = 0; i < 128; i++)
            if (b[i] != id)
                return (void *)1; /* another thread had it too */
        xfer_blk_put(&shared, b);
    }
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    pthread_t th[4];
    for (uintptr_t k = 0; k < 4; k++)
        assert_int_equal(pthread_create(&th[k], NULL, hammer, (void *)(k + 1)), 0);
    for (int k = 0; k < 4; k++) {
        void *bad;
        pthread_join(th[k], &bad);
        assert_null(bad);
    }
}

/* A cache with a thread-local part: each thread's last XFER_BLK_TL blocks
 * stay with it (taken back last-in first-out, not counted, never in the
 * shared slots); more go to the shared slots; another thread's blocks are
 * not handed out here; a thread's own blocks are freed when it exits (a
 * leak there fails the SAN run). */
static struct xfer_blk_cache tl_cache = {.size = 96, .tl = BLK_TL_TEST};

static int shared_count(const struct xfer_blk_cache *c)
{
    int n = 0;
    for (int k = 0; k < XFER_BLK_SLOTS; k++)
        n += c->slot[k] != NULL;
    return n;
}

static void *keep_and_exit(void *arg)
{
    void **mine = arg;
    for (int k = 0; k < XFER_BLK_TL; k++)
        mine[k] = xfer_blk_get(&tl_cache);
    for (int k = 0; k < XFER_BLK_TL; k++)
        xfer_blk_put(&tl_cache, mine[k]); /* this thread's: freed at its exit */
    return NULL;
}

static void test_thread_local(void **state)
{
    (void)state;
    void *p[XFER_BLK_TL + 3];
    for (int k = 0; k < XFER_BLK_TL + 3; k++)
        assert_non_null(p[k] = xfer_blk_get(&tl_cache));
    for (int k = 0; k < XFER_BLK_TL + 3; k++)
        xfer_blk_put(&tl_cache, p[k]);
    assert_int_equal(shared_count(&tl_cache), 3); /* the first XFER_BLK_TL stayed here */
    unsigned long hits = tl_cache.hits;
    for (int k = XFER_BLK_TL - 1; k >= 0; k--) /* last in, first out */
        assert_ptr_equal(xfer_blk_get(&tl_cache), p[k]);
    assert_int_equal(tl_cache.hits, hits);
    for (int k = XFER_BLK_TL; k < XFER_BLK_TL + 3; k++)
        assert_non_null(xfer_blk_get(&tl_cache)); /* from the shared slots */
    assert_int_equal(shared_count(&tl_cache), 0);
    assert_int_equal(tl_cache.hits, hits + 3);
    for (int k = 0; k < XFER_BLK_TL + 3; k++)
        free(p[k]); /* a cached block is a malloc block */

    void *theirs[XFER_BLK_TL];
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, keep_and_exit, theirs), 0);
    pthread_join(th, NULL);
    assert_int_equal(shared_count(&tl_cache), 0); /* kept by that thread, not shared */
    void *mine = xfer_blk_get(&tl_cache);         /* here: a new block (theirs are freed) */
    assert_non_null(mine);
    xfer_blk_put(&tl_cache, mine);
    assert_ptr_equal(xfer_blk_get(&tl_cache), mine);
    free(mine);
}

/* ---- two engines ---------------------------------------------------------------- */

struct side {
    xfer_engine *e;
    xfer_region *r;
    xfer_peer *p;
    const char *name;
};

static struct side A, B;

static void side_new(struct side *s, const char *name)
{
    struct xfer_engine_config cfg;
    xfer_engine_config_init(&cfg);
    cfg.node_id = name;
    cfg.transports = XFER_TRANSPORT_TCP;
    cfg.sockets_per_peer = 2;
    int rc;
    s->e = xfer_engine_new(&cfg, &rc);
    assert_non_null(s->e);
    assert_int_equal(xfer_region_alloc(s->e, "buf", REGION, XFER_ACCESS_RW, &s->r), 0);
    s->name = name;
}

static int setup(void **state)
{
    (void)state;
    side_new(&A, "cache-a");
    side_new(&B, "cache-b");
    struct xfer_peer_desc d;
    xfer_engine_describe(B.e, &d);
    assert_int_equal(xfer_peer_add(A.e, &d, &A.p), 0);
    xfer_engine_describe(A.e, &d);
    assert_int_equal(xfer_peer_add(B.e, &d, &B.p), 0);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    xfer_engine_free(A.e);
    xfer_engine_free(B.e);
    return 0;
}

static uint8_t pat(size_t k, size_t i)
{
    return (uint8_t)(k * 31 + i * 7 + 1);
}

/* Message sizes on both sides of each limit (binding inline 48, cached
 * notification 256 with its header, cached frame 1024, RTS entry 1024,
 * eager 8 KiB). */
static const size_t sizes[] = {0,   1,   47,  48,  49,   120,  127,  128,  184,
                               185, 200, 900, 970, 1000, 5000, 8192, 8193, 20000};
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))

static void fill(uint8_t *buf, size_t k, size_t len)
{
    for (size_t i = 0; i < len; i++)
        buf[i] = pat(k, i);
}

static void test_notifications(void **state)
{
    (void)state;
    static uint8_t msg[20000];
    xfer_batch *b[BURST];
    for (size_t k = 0; k < BURST; k++) { /* all in flight before any wait */
        size_t len = sizes[k % NSIZES];
        msg[0] = (uint8_t)k;
        fill(msg + 1, k, len ? len - 1 : 0);
        b[k] = xfer_batch_new(A.e, NULL);
        assert_non_null(b[k]);
        assert_int_equal(xfer_batch_notify(b[k], A.p, msg, len), 0);
        assert_int_equal(xfer_batch_submit(b[k], DEADLINE), 0);
    }
    for (size_t k = 0; k < BURST; k++) {
        assert_int_equal(xfer_batch_wait(b[k], DEADLINE), 0);
        xfer_batch_free(b[k]);
    }
    bool seen[BURST] = {false};
    bool seen_empty = false;
    for (size_t got = 0; got < BURST;) {
        struct xfer_notif *n;
        if (xfer_notif_poll(B.e, &n, 1) != 1) {
            assert_true(xfer_notif_wait(B.e, A.name, DEADLINE) > 0);
            continue;
        }
        got++;
        if (n->len == 0) { /* k = 0 (sizes[0]) and every NSIZES-th */
            seen_empty = true;
            xfer_notif_free(n);
            continue;
        }
        size_t k = n->data[0];
        assert_true(k < BURST);
        assert_false(seen[k]);
        seen[k] = true;
        assert_int_equal(n->len, sizes[k % NSIZES]);
        for (size_t i = 1; i < n->len; i++)
            assert_int_equal(n->data[i], pat(k, i - 1));
        assert_int_equal(n->data[n->len], 0);
        xfer_notif_free(n);
    }
    assert_true(seen_empty);
}

/* One batch rebound to the same peer (a long message, then a short one
 * kept inline) and submitted again: the peer gets the latest each run. */
static void test_rebind(void **state)
{
    (void)state;
    static uint8_t msg[5000];
    fill(msg, 3, sizeof(msg));
    xfer_batch *b = xfer_batch_new(A.e, NULL);
    for (int run = 0; run < 6; run++) {
        size_t len = run % 2 ? 10 : sizeof(msg);
        assert_int_equal(xfer_batch_notify(b, A.p, msg, sizeof(msg)), 0);
        assert_int_equal(xfer_batch_notify(b, A.p, msg, len), 0); /* replaces it */
        assert_int_equal(xfer_batch_submit(b, DEADLINE), 0);
        assert_int_equal(xfer_batch_wait(b, DEADLINE), 0);
        struct xfer_notif *n = NULL;
        while (xfer_notif_poll(B.e, &n, 1) != 1)
            assert_true(xfer_notif_wait(B.e, A.name, DEADLINE) > 0);
        assert_int_equal(n->len, len);
        assert_memory_equal(n->data, msg, len);
        xfer_notif_free(n);
    }
    xfer_batch_free(b);
}

static xfer_batch *post(struct side *s, bool send, size_t k, size_t len)
{
    xfer_batch *b = xfer_batch_new(s->e, NULL);
    assert_non_null(b);
    uint64_t off = (uint64_t)k * SLOT;
    if (send)
        assert_true(xfer_batch_add_send(b, s->r, off, len, s->p, k) >= 0);
    else
        assert_true(xfer_batch_add_recv(b, s->r, off, SLOT, s->p, k) >= 0);
    assert_int_equal(xfer_batch_submit(b, DEADLINE), 0);
    return b;
}

/* BURST messages each way of order: receives posted first (entries of
 * posted RECVs and waiting SENDs beyond the cache), then sends first
 * (unexpected RTS beyond the cache). */
static void burst(bool recv_first)
{
    xfer_batch *rb[BURST] = {NULL}, *sb[BURST];
    for (size_t k = 0; recv_first && k < BURST; k++)
        rb[k] = post(&B, false, k, 0);
    for (size_t k = 0; k < BURST; k++) {
        size_t len = sizes[k % NSIZES];
        fill((uint8_t *)xfer_region_ptr(A.r) + k * SLOT, k + recv_first, len);
        memset((uint8_t *)xfer_region_ptr(B.r) + k * SLOT, 0, len);
        sb[k] = post(&A, true, k, len);
    }
    for (size_t k = 0; !recv_first && k < BURST; k++)
        rb[k] = post(&B, false, k, 0);
    for (size_t k = 0; k < BURST; k++) {
        size_t len = sizes[k % NSIZES];
        assert_int_equal(xfer_batch_wait(rb[k], DEADLINE), 0);
        assert_int_equal(xfer_batch_item_bytes(rb[k], 0), len);
        assert_int_equal(xfer_batch_wait(sb[k], DEADLINE), 0);
        const uint8_t *got = (const uint8_t *)xfer_region_ptr(B.r) + k * SLOT;
        for (size_t i = 0; i < len; i++)
            assert_int_equal(got[i], pat(k + recv_first, i));
        xfer_batch_free(rb[k]);
        xfer_batch_free(sb[k]);
    }
}

static void test_sendrecv(void **state)
{
    (void)state;
    burst(true);
    burst(false);
}

/* A small batch freed after it finished is kept by the engine and handed
 * out again by xfer_batch_new (batch.c, "kept batches"): it must look
 * new (no items, no bindings, idle), its old eventfd closed, and work. */
static void test_kept_batches(void **state)
{
    (void)state;
    xfer_batch *b = xfer_batch_new(A.e, NULL);
    assert_int_equal(xfer_batch_notify(b, A.p, "x", 1), 0);
    assert_int_equal(xfer_batch_submit(b, DEADLINE), 0);
    assert_int_equal(xfer_batch_wait(b, DEADLINE), 0);
    int fd = xfer_batch_fd(b);
    assert_true(fd >= 0);
    xfer_batch_free(b);
    assert_int_equal(fcntl(fd, F_GETFD), -1); /* closed with the handle */
    assert_int_equal(errno, EBADF);
    xfer_batch *k = xfer_batch_new(A.e, NULL), *fresh = xfer_batch_new(A.e, NULL);
    assert_ptr_equal(k, b); /* kept, not freed */
    assert_int_equal(xfer_batch_notify_status(k, A.p), xfer_batch_notify_status(fresh, A.p));
    assert_int_equal(xfer_batch_wait(k, 0), xfer_batch_wait(fresh, 0));
    assert_int_equal(xfer_batch_item_bytes(k, 0), 0);
    xfer_batch_free(fresh);
    /* it works as new: a message through it, then freed while running
     * (a RECV nobody sends to: cancelled, not kept) */
    struct xfer_notif *n = NULL;
    while (xfer_notif_poll(B.e, &n, 1) != 1)
        assert_true(xfer_notif_wait(B.e, A.name, DEADLINE) > 0);
    xfer_notif_free(n);
    memcpy(xfer_region_ptr(A.r), "kept", 4);
    assert_true(xfer_batch_add_send(k, A.r, 0, 4, A.p, 5) >= 0);
    assert_int_equal(xfer_batch_submit(k, DEADLINE), 0);
    uint64_t got = 0;
    assert_int_equal(xfer_recv(B.e, B.r, 0, 64, B.p, 5, &got, DEADLINE), 0);
    assert_int_equal(got, 4);
    assert_memory_equal(xfer_region_ptr(B.r), "kept", 4);
    assert_int_equal(xfer_batch_wait(k, DEADLINE), 0);
    xfer_batch_free(k);
    xfer_batch *r = xfer_batch_new(B.e, NULL);
    assert_true(xfer_batch_add_recv(r, B.r, 0, 64, B.p, 999) >= 0);
    assert_int_equal(xfer_batch_submit(r, DEADLINE), 0);
    xfer_batch_free(r);           /* running: cancelled and freed */
    for (int j = 0; j < 3; j++) { /* more kept batches than one (freed by the engine) */
        assert_int_equal(xfer_notify(A.e, A.p, "y", 1, DEADLINE), 0);
        xfer_batch *rb = post(&B, false, 0, 0); /* (posted before the blocking send) */
        assert_int_equal(xfer_send(A.e, A.r, 0, 4, A.p, 0, DEADLINE), 0);
        assert_int_equal(xfer_batch_wait(rb, DEADLINE), 0);
        assert_int_equal(xfer_batch_item_bytes(rb, 0), 4);
        xfer_batch_free(rb);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bounds),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_thread_local),
        cmocka_unit_test_setup_teardown(test_notifications, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rebind, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sendrecv, setup, teardown),
        cmocka_unit_test_setup_teardown(test_kept_batches, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
