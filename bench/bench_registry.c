/* Registry benchmark: time to publish 10,000 regions (pipelined), one region
 * per call, heartbeat with 10,000 regions, listing, and lookup latency with
 * and without the cache. Uses $XFER_REDIS_URL, else starts a throwaway
 * redis-server of its own (like the unit tests).
 *   bench_registry [regions (default 10000)] */
#include <stdio.h>
#include <stdlib.h>

#include "tests/unit/registry_fixture.h"

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void report_lat(const char *what, uint64_t *ns, size_t n)
{
    qsort(ns, n, sizeof(*ns), cmp_u64);
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += (double)ns[i];
    printf("%-38s n=%-7zu mean %8.2f us  p50 %8.2f us  p99 %8.2f us\n", what, n,
           sum / (double)n / 1e3, (double)ns[n / 2] / 1e3, (double)ns[n * 99 / 100] / 1e3);
}

static xfer_registry *open_reg(const char *url, int cache_max_age_ms)
{
    struct xfer_registry_config cfg;
    xfer_registry_config_init(&cfg);
    cfg.url = url;
    cfg.cache_max_age_ms = cache_max_age_ms;
    cfg.reap_ms = -1;
    int err;
    xfer_registry *r = xfer_registry_new(&cfg, &err);
    if (!r)
        fprintf(stderr, "bench: %s: %s\n", url, xfer_registry_last_error(NULL));
    return r;
}

static double publish_all(xfer_registry *p, struct xfer_region_desc *d, size_t n)
{
    uint64_t t0 = now_ns();
    int rc = xfer_registry_publish_regions(p, d, n);
    double ms = (double)(now_ns() - t0) / 1e6;
    if (rc)
        fprintf(stderr, "publish: %s\n", xfer_registry_last_error(p));
    return ms;
}

static void bench_publish(xfer_registry *p, struct xfer_region_desc *d, size_t n)
{
    for (int round = 0; round < 3; round++) {
        double ms = publish_all(p, d, n);
        printf("publish %zu regions (pipelined)     %8.1f ms  (%.0f regions/s)\n", n, ms,
               (double)n / ms * 1e3);
    }
    size_t k = n < 1000 ? n : 1000;
    uint64_t t0 = now_ns();
    for (size_t i = 0; i < k; i++)
        xfer_registry_publish_region(p, &d[i]);
    printf("publish one region per call          %8.1f us/region\n",
           (double)(now_ns() - t0) / 1e3 / (double)k);
    t0 = now_ns();
    xfer_registry_heartbeat(p);
    printf("heartbeat with %zu regions          %8.1f ms\n", n, (double)(now_ns() - t0) / 1e6);
}

static void bench_lookups(const char *url, size_t n)
{
    size_t iters = 20000;
    uint64_t *ns = malloc(iters * sizeof(*ns));
    struct xfer_region_desc rd;
    struct xfer_node_desc nd;
    char name[32];
    xfer_registry *u = open_reg(url, 0); /* no watcher, max age 0: every lookup reads Redis */
    for (size_t i = 0; i < iters; i++) {
        snprintf(name, sizeof(name), "r%zu", (size_t)random() % n);
        uint64_t t0 = now_ns();
        xfer_registry_lookup_region(u, "bench", name, &rd);
        ns[i] = now_ns() - t0;
    }
    report_lat("uncached lookup_region (node+region)", ns, iters);
    for (size_t i = 0; i < iters; i++) {
        uint64_t t0 = now_ns();
        xfer_registry_fetch_node(u, "bench", &nd);
        ns[i] = now_ns() - t0;
    }
    report_lat("uncached fetch_node (1 round trip)", ns, iters);
    uint64_t t0 = now_ns();
    struct xfer_region_desc *all;
    size_t cnt = 0;
    xfer_registry_list_regions(u, "bench", &all, &cnt);
    printf("list_regions (%zu rows)              %8.1f ms\n", cnt, (double)(now_ns() - t0) / 1e6);
    free(all);
    xfer_registry_free(u);

    xfer_registry *c = open_reg(url, 1000); /* watching: entries trusted until an event */
    xfer_registry_watch(c, NULL, NULL);
    for (uint64_t until = tr_now_ms() + 5000; !xfer_registry_watching(c) && tr_now_ms() < until;)
        xfer_registry_poll(c, 50);
    for (size_t i = 0; i < n; i++) {
        snprintf(name, sizeof(name), "r%zu", i);
        xfer_registry_lookup_region(c, "bench", name, &rd); /* warm */
    }
    for (size_t i = 0; i < iters; i++) {
        snprintf(name, sizeof(name), "r%zu", (size_t)random() % n);
        uint64_t t0 = now_ns();
        xfer_registry_lookup_region(c, "bench", name, &rd);
        ns[i] = now_ns() - t0;
    }
    report_lat("cached lookup_region", ns, iters);
    xfer_registry_free(c);
    free(ns);
}

int main(int argc, char **argv)
{
    size_t n = argc > 1 ? strtoul(argv[1], NULL, 10) : 10000;
    if (n == 0)
        n = 1;
    xfer_log_set_level(XFER_LOG_ERROR);
    struct test_redis t = {0};
    const char *url = getenv("XFER_REDIS_URL");
    if (!url || !*url) {
        if (test_redis_start(&t)) {
            fprintf(stderr, "bench: cannot start redis-server\n");
            return 1;
        }
        url = t.url;
    }
    int rc = 1;
    xfer_registry *p = open_reg(url, 1000);
    struct xfer_region_desc *d = calloc(n, sizeof(*d));
    if (!p || !d)
        goto out;
    struct xfer_node_desc node;
    tr_node(&node, "bench");
    if (xfer_registry_publish_node(p, &node)) {
        fprintf(stderr, "bench: %s\n", xfer_registry_last_error(p));
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        char name[32];
        snprintf(name, sizeof(name), "r%zu", i);
        tr_region(&d[i], name, (uint32_t)i + 1);
    }
    printf("redis: %s\n", url);
    bench_publish(p, d, n);
    bench_lookups(url, n);
    xfer_registry_unpublish_node(p);
    rc = 0;
out:
    free(d);
    xfer_registry_free(p);
    if (t.pid)
        test_redis_stop(&t);
    return rc;
}
