/* The engine's counters (engine/stats.c) from many threads at once: more
 * threads than shards, in waves that start and exit (so shards owned by
 * exited threads are claimed again), every thread counting into the node's
 * and a transport's set. An owned shard is added to with a plain load and
 * store: if a thread that does not own it added there too, counts would be
 * lost and the totals below would not match. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <pthread.h>
#include <string.h>

#include "internal.h"
#include "transport.h"

#define WAVES   3
#define THREADS (STATS_SHARDS + 8) /* more than there are shards, owned or shared */
#define ADDS    300000

static xfer_engine *eng;
static pthread_barrier_t start_line;

static void *counter(void *arg)
{
    uint64_t bytes = (uint64_t)(uintptr_t)arg;
    pthread_barrier_wait(&start_line); /* all of a wave count at once */
    for (int k = 0; k < ADDS; k++)
        xfer_engine_count_served_n(eng, XFER_TRANSPORT_TCP, 1, bytes);
    return NULL;
}

static void test_totals_exact_across_threads(void **state)
{
    (void)state;
    struct xfer_engine_config cfg;
    xfer_engine_config_init(&cfg);
    cfg.node_id = "stats";
    cfg.transports = XFER_TRANSPORT_TCP;
    int rc;
    eng = xfer_engine_new(&cfg, &rc);
    assert_non_null(eng);
    uint64_t want_bytes = 0;
    for (int w = 0; w < WAVES; w++) {
        pthread_t th[THREADS];
        assert_int_equal(pthread_barrier_init(&start_line, NULL, THREADS), 0);
        for (int i = 0; i < THREADS; i++) {
            uint64_t bytes = (uint64_t)(w * THREADS + i + 1);
            want_bytes += bytes * ADDS;
            assert_int_equal(pthread_create(&th[i], NULL, counter, (void *)(uintptr_t)bytes), 0);
        }
        for (int i = 0; i < THREADS; i++)
            pthread_join(th[i], NULL);
        pthread_barrier_destroy(&start_line);
        struct xfer_stats node, tcp;
        xfer_engine_stats(eng, &node);
        xfer_transport_stats(eng, XFER_TRANSPORT_TCP, &tcp);
        uint64_t want_ops = (uint64_t)(w + 1) * THREADS * ADDS;
        assert_int_equal(node.served_ops, want_ops);
        assert_int_equal(node.served_bytes, want_bytes);
        assert_int_equal(tcp.served_ops, want_ops);
        assert_int_equal(tcp.served_bytes, want_bytes);
    }
    xfer_engine_free(eng);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_totals_exact_across_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
