/*
 * One-sided WRITE and READ over loopback TCP: two engines in this process
 * (target and initiator, each with its own progress thread), item sizes
 * 4 KiB .. 64 MiB, 1 and 4 sockets per peer. Two batches stay in flight;
 * each point runs for --seconds. Prints GB/s (1e9 bytes/s) and ops/s, and
 * the ratio to --ceiling-gbps (iperf3 single stream, from bench/run.sh).
 *
 *   bench_tcp [--seconds 0.5] [--repeat N (best of N)] [--ceiling-gbps X]
 *             [--sizes 4096,1048576,...]
 *   env XFER_BENCH_CHUNK=bytes overrides chunk_bytes (tuning)
 */
#include "xfer.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define REGION_BYTES (128ull << 20)
#define MAX_ITEMS    256

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static xfer_engine *engine(const char *name, int sockets)
{
    struct xfer_engine_config cfg;
    xfer_engine_config_init(&cfg);
    cfg.node_id = name;
    cfg.transports = XFER_TRANSPORT_TCP;
    cfg.sockets_per_peer = sockets;
    const char *chunk = getenv("XFER_BENCH_CHUNK"); /* bytes, for tuning */
    if (chunk)
        cfg.chunk_bytes = strtoull(chunk, NULL, 0);
    int rc;
    xfer_engine *e = xfer_engine_new(&cfg, &rc);
    if (!e)
        fprintf(stderr, "bench: engine %s: %s\n", name, xfer_strerror(rc));
    return e;
}

/* Fills b with items of one op, half the remote region per batch. */
static void fill(xfer_batch *b, enum xfer_op op, xfer_region *l, xfer_peer *p,
                 const struct xfer_region_desc *rd, uint64_t size, int half)
{
    uint64_t span = REGION_BYTES / 2, n = span / size;
    if (n > MAX_ITEMS)
        n = MAX_ITEMS;
    if (n == 0)
        n = 1;
    xfer_batch_reset(b);
    for (uint64_t i = 0; i < n; i++) {
        uint64_t off = (uint64_t)half * span + i * size;
        struct xfer_item it = {op, l, off, p, rd->id, rd->gen, off, size};
        xfer_batch_add(b, &it);
    }
}

struct point {
    double gbps, ops;
    int errors;
};

static struct point run_point(xfer_engine *e, xfer_peer *p, xfer_region *l,
                              const struct xfer_region_desc *rd, enum xfer_op op, uint64_t size,
                              double seconds)
{
    struct point pt = {0};
    xfer_batch *b[2] = {xfer_batch_new(e, NULL), xfer_batch_new(e, NULL)};
    for (int k = 0; k < 2; k++) {
        fill(b[k], op, l, p, rd, size, k);
        xfer_batch_submit(b[k], 60000);
    }
    uint64_t bytes = 0, ops = 0;
    double t0 = now_s(), t;
    int k = 0, rounds = 0;
    for (;; k ^= 1, rounds++) {
        int rc = xfer_batch_wait(b[k], -1);
        if (rc < 0) {
            pt.errors++;
            fprintf(stderr, "bench: %s: %s\n", xfer_strerror(rc), xfer_batch_item_error(b[k], 0));
        }
        ops += xfer_batch_count(b[k]);
        bytes += xfer_batch_count(b[k]) * size;
        t = now_s();
        if ((t - t0 >= seconds && rounds >= 3) || pt.errors)
            break;
        xfer_batch_submit(b[k], 60000);
    }
    xfer_batch_wait(b[k ^ 1], -1); /* the other one is still in flight */
    pt.gbps = bytes / (t - t0) / 1e9;
    pt.ops = ops / (t - t0);
    xfer_batch_free(b[0]);
    xfer_batch_free(b[1]);
    return pt;
}

static void size_text(uint64_t s, char *out, size_t len)
{
    if (s >= (1 << 20))
        snprintf(out, len, "%llu MiB", (unsigned long long)(s >> 20));
    else
        snprintf(out, len, "%llu KiB", (unsigned long long)(s >> 10));
}

int main(int argc, char **argv)
{
    static const struct option lo[] = {{"seconds", 1, 0, 't'},
                                       {"ceiling-gbps", 1, 0, 'c'},
                                       {"sizes", 1, 0, 's'},
                                       {"repeat", 1, 0, 'r'},
                                       {0, 0, 0, 0}};
    double seconds = 0.5, ceiling = 0;
    int repeat = 1;
    uint64_t sizes[16] = {4096, 65536, 1 << 20, 4 << 20, 16 << 20, 64 << 20};
    int n_sizes = 6;
    for (int c; (c = getopt_long(argc, argv, "", lo, NULL)) != -1;) {
        if (c == 't')
            seconds = atof(optarg);
        else if (c == 'c')
            ceiling = atof(optarg);
        else if (c == 'r')
            repeat = atoi(optarg) > 0 ? atoi(optarg) : 1;
        else if (c == 's') {
            n_sizes = 0;
            for (char *tok = strtok(optarg, ","); tok && n_sizes < 16; tok = strtok(NULL, ","))
                sizes[n_sizes++] = strtoull(tok, NULL, 0);
        } else
            return 2;
    }
    xfer_engine *target = engine("bench-target", 1);
    xfer_region *tr;
    if (!target || xfer_region_alloc(target, "bench", REGION_BYTES, XFER_ACCESS_RW, &tr) < 0)
        return 1;
    memset(xfer_region_ptr(tr), 1, REGION_BYTES);
    struct xfer_region_desc rd;
    xfer_region_describe(tr, &rd);
    struct xfer_peer_desc td;
    xfer_engine_describe(target, &td);
    printf("%-6s %-8s %7s %9s %11s %s\n", "op", "size", "sockets", "GB/s", "ops/s",
           ceiling > 0 ? "of iperf3" : "");
    int errors = 0;
    static const int socket_counts[] = {1, 4};
    for (int si = 0; si < 2; si++) {
        xfer_engine *e = engine(si ? "bench-init-4" : "bench-init-1", socket_counts[si]);
        xfer_region *l;
        xfer_peer *p;
        if (!e || xfer_region_alloc(e, "local", REGION_BYTES, XFER_ACCESS_RW, &l) < 0 ||
            xfer_peer_add(e, &td, &p) < 0)
            return 1;
        memset(xfer_region_ptr(l), 2, REGION_BYTES);
        for (int op = XFER_OP_WRITE; op >= XFER_OP_READ; op--) {
            for (int i = 0; i < n_sizes; i++) {
                struct point pt = {0}; /* best of `repeat`: the machine is shared */
                for (int k = 0; k < repeat; k++) {
                    struct point q = run_point(e, p, l, &rd, op, sizes[i], seconds);
                    pt.errors += q.errors;
                    if (q.gbps > pt.gbps)
                        pt.gbps = q.gbps, pt.ops = q.ops;
                }
                char sz[32];
                size_text(sizes[i], sz, sizeof(sz));
                printf("%-6s %-8s %7d %9.2f %11.0f", op == XFER_OP_WRITE ? "WRITE" : "READ", sz,
                       socket_counts[si], pt.gbps, pt.ops);
                if (ceiling > 0)
                    printf(" %8.2f", pt.gbps / ceiling);
                printf("\n");
                fflush(stdout);
                errors += pt.errors;
            }
        }
        xfer_engine_free(e);
    }
    xfer_engine_free(target);
    return errors ? 1 : 0;
}
