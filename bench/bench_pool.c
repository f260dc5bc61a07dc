/*
 * bench_pool: CPU cost of building and submitting one KV block-list request
 * (issue 16: 512 blocks x 64 regions, target < 1 ms), and its rate, between
 * two nodes of this process through a real redis-server ($REDIS_URL).
 *
 *   bench_pool [--transports tcp|ipc] [--layout sglang|vllm_fa|...]
 *              [--blocks 512] [--pool-blocks 1024] [--layers 32]
 *              [--block-bytes 1024] [--reps 20] [--reuse]
 *
 * Prints, per run, the thread CPU time of xfer_node_batch_add_blocks and of
 * xfer_node_batch_submit (median and best), the number of items the request
 * became, and the wall time until it completed (GB/s of the bytes moved).
 * By default every request is a new batch (its item arrays are fresh
 * memory: page faults count); --reuse resets one batch between requests,
 * as a connector that keeps a batch per worker would.
 */
#include "tests/prog/node_env.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double cpu_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static double wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static xfer_kv_pool *pool(xfer_node *n, const struct xfer_kv_geom *g)
{
    size_t nr = xfer_kv_geom_regions(g);
    uint64_t len = g->num_blocks * g->block_bytes *
                   (g->layout == XFER_KV_VLLM_FA || g->layout == XFER_KV_FLASHINFER ? g->kv
                    : g->layout == XFER_KV_BLOCK_MAJOR ? (uint64_t)g->kv * g->layers
                                                       : 1);
    xfer_region **r = calloc(nr, sizeof(*r));
    for (size_t i = 0; i < nr; i++) {
        char name[32];
        snprintf(name, sizeof(name), "kv.%zu", i);
        if (xfer_node_region_alloc(n, name, len, XFER_ACCESS_RW, &r[i])) {
            fprintf(stderr, "%s: %s\n", name, xfer_node_last_error(n));
            return NULL;
        }
    }
    xfer_kv_pool *p = NULL;
    if (xfer_node_pool_register(n, "kv", g, r, nr, &p))
        fprintf(stderr, "pool: %s\n", xfer_node_last_error(n));
    free(r);
    return p;
}

int main(int argc, char **argv)
{
    const char *transports = "tcp", *layout = "sglang";
    size_t nb = 512, reps = 20;
    bool reuse = false;
    xfer_node_batch *kept = NULL;
    struct xfer_kv_geom g = {
        .block_bytes = 1024, .num_blocks = 1024, .layers = 32, .kv = 2, .shard_count = 1};
    snprintf(g.dtype, sizeof(g.dtype), "bf16");
    static const struct option lo[] = {
        {"transports", 1, 0, 't'},  {"layout", 1, 0, 'l'}, {"blocks", 1, 0, 'b'},
        {"pool-blocks", 1, 0, 'n'}, {"layers", 1, 0, 'L'}, {"block-bytes", 1, 0, 'B'},
        {"reps", 1, 0, 'r'},        {"reuse", 0, 0, 'u'},  {0, 0, 0, 0},
    };
    int c;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        if (c == 't')
            transports = optarg;
        else if (c == 'l')
            layout = optarg;
        else if (c == 'b')
            nb = strtoul(optarg, NULL, 0);
        else if (c == 'n')
            g.num_blocks = strtoull(optarg, NULL, 0);
        else if (c == 'L')
            g.layers = (uint32_t)strtoul(optarg, NULL, 0);
        else if (c == 'B')
            g.block_bytes = strtoull(optarg, NULL, 0);
        else if (c == 'r')
            reps = strtoul(optarg, NULL, 0);
        else if (c == 'u')
            reuse = true;
        else
            return 2;
    }
    if (xfer_kv_layout_parse(layout, &g.layout) || nb > g.num_blocks || !reps) {
        fprintf(stderr, "bad arguments\n");
        return 2;
    }
    if (g.layout == XFER_KV_MLA)
        g.kv = 1;
    xfer_node *a = node_from_env("bench-a", transports, NULL),
              *b = node_from_env("bench-b", transports, NULL);
    xfer_kv_pool *pa = a ? pool(a, &g) : NULL, *pb = b ? pool(b, &g) : NULL;
    if (!pa || !pb)
        return 1;
    uint64_t *lb = malloc(nb * sizeof(*lb)), *rb = malloc(nb * sizeof(*rb));
    double *t_add = calloc(reps, sizeof(double)), *t_sub = calloc(reps, sizeof(double));
    double *t_wall = calloc(reps, sizeof(double));
    uint64_t x = 88172645463325252ull;
    int items = 0;
    unsigned tbit = 0;
    for (size_t r = 0; r <= reps; r++) {  /* run 0 warms up (resolves the pool) */
        for (size_t i = 0; i < nb; i++) { /* random, distinct enough: a stride walk */
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            lb[i] = (x + i * 7919) % g.num_blocks;
            rb[i] = (x / 3 + i * 104729) % g.num_blocks;
        }
        int err;
        xfer_node_batch *bt = kept ? kept : xfer_node_batch_new(a, &err);
        if (kept)
            xfer_node_batch_reset(bt);
        double w0 = wall_s(), c0 = cpu_us();
        items = xfer_node_batch_add_blocks(bt, XFER_OP_WRITE, pa, lb, "bench-b/kv", rb, nb, 0, 0);
        double c1 = cpu_us();
        int rc = items < 0 ? items : xfer_node_batch_submit(bt, 30000);
        double c2 = cpu_us();
        if (!rc)
            rc = xfer_node_batch_wait(bt, -1);
        double w1 = wall_s();
        if (rc) {
            fprintf(stderr, "run %zu: %s (%s)\n", r, xfer_strerror(rc), xfer_node_last_error(a));
            return 1;
        }
        tbit = xfer_node_batch_item_transport(bt, 0);
        if (reuse)
            kept = bt;
        else
            xfer_node_batch_free(bt);
        if (r) {
            t_add[r - 1] = c1 - c0;
            t_sub[r - 1] = c2 - c1;
            t_wall[r - 1] = w1 - w0;
        }
    }
    double bytes = (double)nb * g.layers * g.kv * g.block_bytes;
    qsort(t_add, reps, sizeof(double), cmp_d);
    qsort(t_sub, reps, sizeof(double), cmp_d);
    qsort(t_wall, reps, sizeof(double), cmp_d);
    char tn[32] = "";
    xfer_transports_format(tbit, tn, sizeof(tn));
    printf("layout %s, %zu blocks x %zu regions (%u layers, kv %u), %llu-byte blocks, over %s: "
           "%d items\n",
           layout, nb, xfer_kv_geom_regions(&g), g.layers, g.kv, (unsigned long long)g.block_bytes,
           tn, items);
    printf("  CPU build (add_blocks): median %.0f us, best %.0f us\n", t_add[reps / 2], t_add[0]);
    printf("  CPU submit:             median %.0f us, best %.0f us\n", t_sub[reps / 2], t_sub[0]);
    printf("  CPU build+submit:       median %.0f us\n", t_add[reps / 2] + t_sub[reps / 2]);
    printf("  wall to completion:     median %.2f ms (%.2f GB/s), best %.2f ms\n",
           t_wall[reps / 2] * 1e3, bytes / t_wall[reps / 2] / 1e9, t_wall[0] * 1e3);
    xfer_node_batch_free(kept);
    xfer_node_free(a);
    xfer_node_free(b);
    return 0;
}
