/*
 * bench_pool_gpu: issue 16's Measure section between two processes — one KV
 * pool request (512 random blocks over 32 layers x K/V = 64 regions, vLLM
 * FlashAttention layout, 16 KiB blocks) moved through the node library, its
 * GB/s against the copy ceilings of the same bytes on the same GPU:
 *   one-copy   one cudaMemcpyAsync of all the request's bytes (D2D)
 *   per-block  one cudaMemcpyAsync per (layer, half, block): what a naive
 *              connector does
 * Two processes because CUDA IPC cannot open a handle in the process that
 * exported it. With --host the pools are host memory (memfd), the
 * comparison row for "GPU over tcp vs host over tcp".
 *
 *   bench_pool_gpu serve ID [opts]          registers pool "kv", serves until
 *                                           SIGTERM/SIGINT or --lifetime s
 *   bench_pool_gpu run ID PEER [opts]       moves blocks to/from PEER/kv
 * opts: --transports tcp|ipc  --host  --gpu N  --blocks 512 --pool-blocks 2048
 *       --layers 32 --block-bytes 16384 --reps 10 --lifetime 600
 *       --depths 2,4 (GPU pools over ipc: throughput rows with that many
 *       requests in flight, besides the one-at-a-time latency rows)
 *       --quick (no byte check, no per-block copy row: for A/B runs)
 *       --plain N (each request as N plain items of 1/N of its bytes, item
 *       k in region k % 64 at both ends, instead of one block item per
 *       region pair: plain GPU items over ipc, GPU loans or the worker)
 * REDIS_URL names the Redis. Exits 77 when GPU memory is asked for and
 * there is no CUDA device (or no CUDA in the build).
 */
#include "tests/prog/node_env.h"

#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if XFER_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

struct opts {
    const char *transports;
    const char *depths;                     /* requests in flight for the throughput rows, "2,4" */
    int host, gpu, reps, lifetime_s, quick; /* quick: no verify, no per-block copies */
    size_t plain;                           /* > 0: requests of that many plain items */
    size_t nb;
    struct xfer_kv_geom g;
};

static double now_s(int clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static uint64_t pool_bytes(const struct opts *o)
{
    return (uint64_t)o->g.layers * o->g.kv * o->g.num_blocks * o->g.block_bytes;
}

/* One allocation cut into the layer regions, so the one-copy ceiling can
 * copy the request's bytes between two halves of it. */
static void *pool_memory(const struct opts *o)
{
    if (o->host)
        return NULL; /* xfer_node_region_alloc per region */
#if XFER_WITH_CUDA
    int ndev = 0;
    void *p = NULL;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev <= o->gpu ||
        cudaSetDevice(o->gpu) != cudaSuccess || cudaMalloc(&p, pool_bytes(o)) != cudaSuccess)
        return NULL;
    cudaMemset(p, 0x5a, pool_bytes(o));
    cudaDeviceSynchronize();
    return p;
#else
    return NULL;
#endif
}

static xfer_region **regions; /* the pool's, for --plain */

static xfer_kv_pool *pool(xfer_node *n, const struct opts *o, char *mem)
{
    size_t nr = xfer_kv_geom_regions(&o->g);
    uint64_t len = pool_bytes(o) / nr;
    xfer_region **r = regions = calloc(nr, sizeof(*r));
    xfer_kv_pool *p = NULL;
    for (size_t i = 0; i < nr; i++) {
        char name[32];
        snprintf(name, sizeof(name), "kv.%zu", i);
        int rc = mem ? xfer_node_region_register(n, name, mem + i * len, len, XFER_MEM_CUDA, o->gpu,
                                                 XFER_ACCESS_RW, &r[i])
                     : xfer_node_region_alloc(n, name, len, XFER_ACCESS_RW, &r[i]);
        if (rc) {
            fprintf(stderr, "%s: %s\n", name, xfer_node_last_error(n));
            goto out;
        }
    }
    if (xfer_node_pool_register(n, "kv", &o->g, r, nr, &p))
        fprintf(stderr, "pool: %s\n", xfer_node_last_error(n));
out:
    return p;
}

static int serve(xfer_node *n, const struct opts *o)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigprocmask(SIG_BLOCK, &set, NULL);
    printf("serving\n");
    fflush(stdout);
    struct timespec lim = {.tv_sec = o->lifetime_s};
    if (sigtimedwait(&set, NULL, &lim) < 0)
        fprintf(stderr, "serve: lifetime of %d s over\n", o->lifetime_s);
    (void)n;
    return 0;
}

static void random_blocks(uint64_t *ids, size_t nb, uint64_t nblocks, uint64_t *x)
{
    for (size_t i = 0; i < nb; i++) { /* distinct: a random start, an odd stride */
        *x ^= *x << 13, *x ^= *x >> 7, *x ^= *x << 17;
        ids[i] = i == 0 ? *x % nblocks : (ids[0] + i * 2654435761u) % nblocks;
    }
}

/* One request: the block items of lb/rb, or (--plain) o->plain plain
 * items, item k between region k % R at both ends, at offset k / R times
 * its length (the same bytes as the block request, in large pieces). */
static int add_request(xfer_node_batch *b, enum xfer_op op, xfer_kv_pool *p, const uint64_t *lb,
                       const char *remote, const uint64_t *rb, const struct opts *o)
{
    if (!o->plain)
        return xfer_node_batch_add_blocks(b, op, p, lb, remote, rb, o->nb, 0, 0);
    size_t nr = xfer_kv_geom_regions(&o->g);
    uint64_t len = (uint64_t)o->nb * o->g.layers * o->g.kv * o->g.block_bytes / o->plain;
    const char *peer = remote; /* "peer/kv": the node part */
    size_t pl = strcspn(peer, "/");
    for (size_t k = 0; k < o->plain; k++) {
        char name[2 * XFER_NAME_MAX + 48];
        uint64_t off = (k / nr) * len;
        snprintf(name, sizeof(name), "%.*s/kv.%zu+%llu", (int)pl, peer, k % nr,
                 (unsigned long long)off);
        int rc = xfer_node_batch_add(b, op, regions[k % nr], off, name, len);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Median wall seconds of reps requests (op) of nb random blocks to peer. */
static int move(xfer_node *n, xfer_kv_pool *p, const char *remote, enum xfer_op op,
                const struct opts *o, double *wall, double *cpu)
{
    uint64_t *lb = malloc(o->nb * sizeof(*lb)), *rb = malloc(o->nb * sizeof(*rb));
    double *tw = calloc(o->reps, sizeof(double)), *tc = calloc(o->reps, sizeof(double));
    uint64_t x = 88172645463325252ull;
    int rc = 0;
    const char *tr =
        getenv("XFER_BENCH_TRACE"); /* per request: ns of start, added, submitted, done */
    for (int r = 0; r <= o->reps && !rc; r++) { /* run 0 warms up */
        random_blocks(lb, o->nb, o->g.num_blocks, &x);
        random_blocks(rb, o->nb, o->g.num_blocks, &x);
        xfer_node_batch *b = xfer_node_batch_new(n, &rc);
        double w0 = now_s(CLOCK_MONOTONIC), c0 = now_s(CLOCK_THREAD_CPUTIME_ID);
        rc = add_request(b, op, p, lb, remote, rb, o);
        double w1 = now_s(CLOCK_MONOTONIC);
        rc = rc < 0 ? rc : xfer_node_batch_submit(b, 60000);
        double c1 = now_s(CLOCK_THREAD_CPUTIME_ID), w2 = now_s(CLOCK_MONOTONIC);
        if (!rc)
            rc = xfer_node_batch_wait(b, -1);
        if (tr && *tr == '1')
            fprintf(stderr, "bench-trace %s %.0f %.0f %.0f %.0f\n", op == XFER_OP_READ ? "R" : "W",
                    w0 * 1e9, w1 * 1e9, w2 * 1e9, now_s(CLOCK_MONOTONIC) * 1e9);
        if (rc)
            fprintf(stderr, "%s: %s (%s)\n", op == XFER_OP_READ ? "READ" : "WRITE",
                    xfer_strerror(rc), xfer_node_last_error(n));
        else if (r && xfer_node_batch_item_transport(b, 0) == 0)
            rc = -XFER_EPROTO;
        if (r) {
            tw[r - 1] = now_s(CLOCK_MONOTONIC) - w0;
            tc[r - 1] = c1 - c0;
        }
        xfer_node_batch_free(b);
    }
    qsort(tw, o->reps, sizeof(double), cmp_d);
    qsort(tc, o->reps, sizeof(double), cmp_d);
    *wall = tw[o->reps / 2];
    *cpu = tc[o->reps / 2];
    free(lb), free(rb), free(tw), free(tc);
    return rc;
}

/* Requests of op kept `depth` in flight (a new one submitted as the oldest
 * completes, as an inference server's transfers overlap): GB/s over n of
 * them, from the first submit to the last completion. */
static int move_depth(xfer_node *n, xfer_kv_pool *p, const char *remote, enum xfer_op op,
                      const struct opts *o, int depth, int count, double *gbs)
{
    uint64_t *lb = malloc(o->nb * sizeof(*lb)), *rb = malloc(o->nb * sizeof(*rb));
    xfer_node_batch **q = calloc((size_t)depth, sizeof(*q));
    uint64_t x = 0x9e3779b97f4a7c15ull;
    int rc = lb && rb && q ? 0 : -XFER_ENOMEM;
    double t0 = now_s(CLOCK_MONOTONIC);
    for (int i = 0; i < count + depth && !rc; i++) {
        xfer_node_batch **slot = &q[i % depth];
        if (*slot) { /* the oldest in flight */
            rc = xfer_node_batch_wait(*slot, -1);
            xfer_node_batch_free(*slot);
            *slot = NULL;
        }
        if (rc || i >= count)
            continue;
        random_blocks(lb, o->nb, o->g.num_blocks, &x);
        random_blocks(rb, o->nb, o->g.num_blocks, &x);
        *slot = xfer_node_batch_new(n, &rc);
        rc = rc ? rc : add_request(*slot, op, p, lb, remote, rb, o);
        rc = rc < 0 ? rc : xfer_node_batch_submit(*slot, 60000);
    }
    double t = now_s(CLOCK_MONOTONIC) - t0;
    for (int i = 0; q && i < depth; i++)
        if (q[i]) {
            xfer_node_batch_wait(q[i], -1);
            xfer_node_batch_free(q[i]);
        }
    if (rc)
        fprintf(stderr, "%s x%d: %s (%s)\n", op == XFER_OP_READ ? "READ" : "WRITE", depth,
                xfer_strerror(rc), xfer_node_last_error(n));
    *gbs = (double)count * o->nb * o->g.layers * o->g.kv * o->g.block_bytes / t / 1e9;
    free(lb), free(rb), free(q);
    return rc;
}

#if XFER_WITH_CUDA
static uint8_t pattern(uint64_t off)
{
    return (uint8_t)((off * 2654435761u) >> 13);
}

/* Where piece (block b, layer l, half h) of a vLLM FlashAttention pool is. */
static uint64_t fa_off(const struct opts *o, uint64_t b, uint32_t l, uint32_t h)
{
    uint64_t region = pool_bytes(o) / o->g.layers, B = o->g.block_bytes;
    return l * region + h * o->g.num_blocks * B + b * B;
}

/* GPU pools, every byte: the local pool filled with a pattern, blocks lb
 * WRITTEN to the peer's rb, then READ back from rb into other local blocks
 * l2; the whole local pool then holds the pattern except l2, which holds
 * lb's bytes. Checks the layout end to end on the device. */
static int verify(xfer_node *n, xfer_kv_pool *p, const char *remote, char *mem,
                  const struct opts *o)
{
    uint64_t total = pool_bytes(o), B = o->g.block_bytes, N = o->g.num_blocks;
    size_t nb = o->nb / 2 < 64 ? o->nb / 2 : 64;
    uint64_t lb[64], rb[64], l2[64];
    for (size_t i = 0; i < nb; i++) { /* lb in the lower half, l2 in the upper */
        lb[i] = (i * 7) % (N / 2);
        l2[i] = N / 2 + (i * 13) % (N / 2);
        rb[i] = (i * 29 + 3) % N;
    }
    uint8_t *h = malloc(total);
    int rc = h ? 0 : -XFER_ENOMEM;
    for (uint64_t i = 0; h && i < total; i++)
        h[i] = pattern(i);
    if (!rc && cudaMemcpy(mem, h, total, cudaMemcpyHostToDevice) != cudaSuccess)
        rc = -XFER_EIO;
    for (int op = 0; op < 2 && !rc; op++) {
        xfer_node_batch *b = xfer_node_batch_new(n, &rc);
        rc = xfer_node_batch_add_blocks(b, op ? XFER_OP_READ : XFER_OP_WRITE, p, op ? l2 : lb,
                                        remote, rb, nb, 0, 0);
        rc = rc < 0 ? rc : xfer_node_batch_submit(b, 60000);
        rc = rc ? rc : xfer_node_batch_wait(b, -1);
        xfer_node_batch_free(b);
    }
    if (!rc && cudaMemcpy(h, mem, total, cudaMemcpyDeviceToHost) != cudaSuccess)
        rc = -XFER_EIO;
    uint64_t bad = 0;
    for (size_t i = 0; !rc && i < nb; i++) /* l2 holds lb's bytes; then mark them checked */
        for (uint32_t l = 0; l < o->g.layers; l++)
            for (uint32_t k = 0; k < o->g.kv; k++)
                for (uint64_t j = 0, d = fa_off(o, l2[i], l, k), s = fa_off(o, lb[i], l, k); j < B;
                     j++)
                    if (h[d + j] != pattern(s + j))
                        bad++;
                    else
                        h[d + j] = pattern(d + j);
    for (uint64_t i = 0; !rc && i < total; i++)
        bad += h[i] != pattern(i);
    printf("  verify: %zu blocks x %u layers x %u halves WRITTEN and READ back, %llu bytes "
           "checked: %s\n",
           nb, o->g.layers, o->g.kv, (unsigned long long)total,
           rc    ? xfer_strerror(rc)
           : bad ? "WRONG"
                 : "OK");
    if (bad)
        printf("  verify: %llu bytes wrong\n", (unsigned long long)bad);
    free(h);
    return rc || bad ? 1 : 0;
}

/* Median host seconds of one D2D copy of the request's bytes from the
 * call to the return of the stream's synchronize: the ceiling as a
 * program that waits for its one copy sees it (launch and wake-up in). */
static double copy_ceiling_host(char *mem, const struct opts *o)
{
    uint64_t bytes = (uint64_t)o->nb * o->g.layers * o->g.kv * o->g.block_bytes;
    uint64_t half = pool_bytes(o) / 2;
    cudaStream_t s;
    cudaStreamCreate(&s);
    double *t = calloc(o->reps, sizeof(double));
    for (int r = 0; r <= o->reps; r++) {
        double t0 = now_s(CLOCK_MONOTONIC);
        cudaMemcpyAsync(mem + half, mem, bytes < half ? bytes : half, cudaMemcpyDeviceToDevice, s);
        cudaStreamSynchronize(s);
        if (r)
            t[r - 1] = now_s(CLOCK_MONOTONIC) - t0;
    }
    qsort(t, o->reps, sizeof(double), cmp_d);
    double med = t[o->reps / 2];
    free(t);
    cudaStreamDestroy(s);
    return med;
}

/* Median seconds of: one D2D copy of `bytes` (per_block 0), or one copy per
 * block_bytes piece at the request's random places (per_block 1). */
static double copy_ceiling(char *mem, const struct opts *o, int per_block)
{
    uint64_t piece = o->g.block_bytes, bytes = (uint64_t)o->nb * o->g.layers * o->g.kv * piece;
    uint64_t half = pool_bytes(o) / 2, npieces = half / piece, x = 1234567;
    cudaStream_t s;
    cudaEvent_t e0, e1;
    cudaStreamCreate(&s);
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    double *t = calloc(o->reps, sizeof(double));
    for (int r = 0; r <= o->reps; r++) {
        cudaEventRecord(e0, s);
        if (!per_block)
            cudaMemcpyAsync(mem + half, mem, bytes < half ? bytes : half, cudaMemcpyDeviceToDevice,
                            s);
        for (uint64_t i = 0; per_block && i < bytes / piece; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            cudaMemcpyAsync(mem + half + (x % npieces) * piece, mem + ((x >> 20) % npieces) * piece,
                            piece, cudaMemcpyDeviceToDevice, s);
        }
        cudaEventRecord(e1, s);
        cudaEventSynchronize(e1);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        if (r)
            t[r - 1] = ms / 1e3;
    }
    qsort(t, o->reps, sizeof(double), cmp_d);
    double med = t[o->reps / 2];
    free(t);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    cudaStreamDestroy(s);
    return med;
}
#endif

static int run(xfer_node *n, xfer_kv_pool *p, const char *peer, char *mem, const struct opts *o)
{
    char remote[2 * XFER_NAME_MAX];
    snprintf(remote, sizeof(remote), "%s/kv", peer);
    struct xfer_kv_pool_desc d;
    double until = now_s(CLOCK_MONOTONIC) + 30;
    while (xfer_node_pool_lookup(n, peer, "kv", &d)) { /* the server may still be starting */
        if (now_s(CLOCK_MONOTONIC) > until) {
            fprintf(stderr, "no pool %s within 30 s\n", remote);
            return 1;
        }
        nanosleep(&(struct timespec){.tv_nsec = 20000000}, NULL);
    }
    xfer_kv_pool_desc_clear(&d);
    double bytes = (double)o->nb * o->g.layers * o->g.kv * o->g.block_bytes;
    printf("%s pools, vllm_fa, %u layers x kv %u, %llu-byte blocks, %zu random blocks "
           "(%.0f MiB) per request, over %s, median of %d\n",
           mem ? "GPU" : "host", o->g.layers, o->g.kv, (unsigned long long)o->g.block_bytes, o->nb,
           bytes / 1048576, o->transports, o->reps);
    if (o->plain)
        printf("  as %zu plain items of %.2f MiB each (--plain)\n", o->plain,
               bytes / o->plain / 1048576);
    double one = 0, lat[2] = {0, 0}; /* lat: the host-timed ceiling's rows (CUDA builds) */
    (void)lat;
#if XFER_WITH_CUDA
    if (mem) /* first: the rows below are read against it */
        one = copy_ceiling(mem, o, 0);
#endif
    for (int i = 0; i < 2; i++) {
        enum xfer_op op = i ? XFER_OP_READ : XFER_OP_WRITE;
        double wall, cpu;
        if (move(n, p, remote, op, o, &wall, &cpu))
            return 1;
        lat[i] = wall;
        printf("  %-5s  %8.2f ms  %7.2f GB/s  (CPU build+submit %.0f us)", i ? "READ" : "WRITE",
               wall * 1e3, bytes / wall / 1e9, cpu * 1e6);
        if (one > 0)
            printf("  %.3f of one copy", one / wall);
        printf("\n");
    }
    /* throughput with requests in flight: GPU pools over ipc (tcp takes
     * ~0.35 s a request) */
    for (const char *d = o->depths; mem && d && *d && !strcmp(o->transports, "ipc");) {
        int depth = atoi(d);
        for (int i = 0; depth > 1 && i < 2; i++) {
            double g[3];
            for (int k = 0; k < 3; k++) /* median of three runs of 8 x reps requests */
                if (move_depth(n, p, remote, i ? XFER_OP_READ : XFER_OP_WRITE, o, depth,
                               8 * o->reps, &g[k]))
                    return 1;
            qsort(g, 3, sizeof(double), cmp_d);
            printf("  %-5s  %d in flight: %7.2f GB/s, %.3f ms per request", i ? "READ" : "WRITE",
                   depth, g[1], bytes / g[1] / 1e6);
            if (one > 0)
                printf("  %.3f of one copy", g[1] / (bytes / one / 1e9));
            printf("\n");
        }
        d = strchr(d, ',');
        d = d ? d + 1 : NULL;
    }
#if XFER_WITH_CUDA
    if (mem && !o->quick && verify(n, p, remote, mem, o))
        return 1;
    if (mem) {
        double host = copy_ceiling_host(mem, o), per = o->quick ? 0 : copy_ceiling(mem, o, 1);
        printf("  one-copy ceiling (D2D, same GPU)  %8.2f ms  %7.2f GB/s\n", one * 1e3,
               bytes / one / 1e9);
        printf("  one copy, host-timed (call to sync return)  %8.3f ms: WRITE %.3f, READ %.3f "
               "of it\n",
               host * 1e3, host / lat[0], host / lat[1]);
        if (per > 0)
            printf("  one cudaMemcpyAsync per block     %8.2f ms  %7.2f GB/s\n", per * 1e3,
                   bytes / per / 1e9);
    }
#endif
    return 0;
}

static int parse(int argc, char **argv, struct opts *o)
{
    static const struct option lo[] = {
        {"transports", 1, 0, 't'},
        {"host", 0, 0, 'H'},
        {"gpu", 1, 0, 'g'},
        {"blocks", 1, 0, 'b'},
        {"pool-blocks", 1, 0, 'n'},
        {"layers", 1, 0, 'L'},
        {"block-bytes", 1, 0, 'B'},
        {"reps", 1, 0, 'r'},
        {"lifetime", 1, 0, 'T'},
        {"depths", 1, 0, 'D'},
        {"quick", 0, 0, 'Q'},
        {"plain", 1, 0, 'P'},
        {0, 0, 0, 0},
    };
    int c;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        if (c == 't')
            o->transports = optarg;
        else if (c == 'H')
            o->host = 1;
        else if (c == 'g')
            o->gpu = atoi(optarg);
        else if (c == 'b')
            o->nb = strtoul(optarg, NULL, 0);
        else if (c == 'n')
            o->g.num_blocks = strtoull(optarg, NULL, 0);
        else if (c == 'L')
            o->g.layers = (uint32_t)strtoul(optarg, NULL, 0);
        else if (c == 'B')
            o->g.block_bytes = strtoull(optarg, NULL, 0);
        else if (c == 'r')
            o->reps = atoi(optarg);
        else if (c == 'T')
            o->lifetime_s = atoi(optarg);
        else if (c == 'D')
            o->depths = optarg;
        else if (c == 'Q')
            o->quick = 1;
        else if (c == 'P')
            o->plain = strtoul(optarg, NULL, 0);
        else
            return -1;
    }
    uint64_t per = o->plain ? (uint64_t)o->nb * o->g.block_bytes * o->g.layers * o->g.kv / o->plain
                            : 0; /* a plain item's bytes: whole, and inside its region */
    bool plain_ok =
        !o->plain ||
        (per && per * o->plain == (uint64_t)o->nb * o->g.block_bytes * o->g.layers * o->g.kv &&
         (o->plain + o->g.layers * o->g.kv - 1) / (o->g.layers * o->g.kv) * per <=
             o->g.num_blocks * o->g.block_bytes);
    return o->nb && o->nb <= o->g.num_blocks && o->reps > 0 && o->g.layers && plain_ok ? 0 : -1;
}

int main(int argc, char **argv)
{
    struct opts o = {.transports = "tcp",
                     .depths = "2,4",
                     .nb = 512,
                     .reps = 10,
                     .lifetime_s = 600,
                     .g = {.layout = XFER_KV_VLLM_FA,
                           .block_bytes = 16384,
                           .num_blocks = 2048,
                           .layers = 32,
                           .kv = 2,
                           .shard_count = 1}};
    snprintf(o.g.dtype, sizeof(o.g.dtype), "bf16");
    int is_run = argc > 3 && !strcmp(argv[1], "run");
    if (argc < 3 || (!is_run && strcmp(argv[1], "serve")) ||
        parse(argc - (is_run ? 3 : 2), argv + (is_run ? 3 : 2), &o)) {
        fprintf(stderr, "usage: bench_pool_gpu serve ID | run ID PEER  [options, see source]\n");
        return 2;
    }
    char *mem = pool_memory(&o);
    if (!o.host && !mem) {
        fprintf(stderr, "bench_pool_gpu: no CUDA device (GPU %d)\n", o.gpu);
        return 77;
    }
    xfer_node *n = node_from_env(argv[2], o.transports, NULL);
    xfer_kv_pool *p = n ? pool(n, &o, mem) : NULL;
    int rc = !p ? 1 : is_run ? run(n, p, argv[3], mem, &o) : serve(n, &o);
    if (n)
        xfer_node_free(n);
#if XFER_WITH_CUDA
    if (mem)
        cudaFree(mem);
#endif
    return rc;
}
