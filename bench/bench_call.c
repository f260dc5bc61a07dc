/*
 * Per-call cost of small transfers from C, the baseline of the Python
 * package's overhead (python/bench/bench_call.py does the same calls through
 * ctypes). Two engines in this process; the initiator READs --size bytes per
 * transfer, --depth transfers in flight (submit all, then wait all), over
 * --transport. Two ways per depth: "new" (batch_new + add + submit + wait +
 * free per transfer, what xfer.Engine.read does) and "reuse" (reset + add +
 * submit + wait on kept batches). Prints microseconds per transfer, best of
 * --repeat.
 *
 *   bench_call [--transport tcp|ipc] [--size 64] [--iters 20000] [--repeat 3]
 */
#include "xfer.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_DEPTH 64

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

struct setup {
    xfer_engine *a, *b;
    xfer_region *src, *dst;
    xfer_peer *p;
    struct xfer_region_desc rd;
};

static int setup(struct setup *s, unsigned transport)
{
    struct xfer_engine_config cfg;
    int rc = 0;
    xfer_engine_config_init(&cfg);
    cfg.transports = transport;
    cfg.node_id = "call-a";
    s->a = xfer_engine_new(&cfg, &rc);
    cfg.node_id = "call-b";
    s->b = s->a ? xfer_engine_new(&cfg, &rc) : NULL;
    if (!s->b)
        return rc;
    struct xfer_peer_desc pd;
    xfer_engine_describe(s->a, &pd);
    if ((rc = xfer_region_alloc(s->a, "src", 1 << 20, XFER_ACCESS_RW, &s->src)) ||
        (rc = xfer_region_alloc(s->b, "dst", 1 << 20, XFER_ACCESS_RW, &s->dst)) ||
        (rc = xfer_peer_add(s->b, &pd, &s->p)))
        return rc;
    xfer_region_describe(s->src, &s->rd);
    return xfer_peer_region_add(s->p, &s->rd);
}

/* Seconds per transfer for iters transfers at depth d. */
static double run(struct setup *s, int d, int iters, uint64_t size, int reuse)
{
    xfer_batch *bs[MAX_DEPTH] = {0};
    int rc = 0;
    for (int i = 0; reuse && i < d; i++)
        bs[i] = xfer_batch_new(s->b, &rc);
    double t0 = now_s();
    for (int done = 0; done < iters; done += d) {
        for (int i = 0; i < d; i++) {
            if (reuse)
                xfer_batch_reset(bs[i]);
            else
                bs[i] = xfer_batch_new(s->b, &rc);
            uint64_t off = (uint64_t)i * size;
            struct xfer_item it = {XFER_OP_READ, s->dst, off, s->p, s->rd.id, s->rd.gen, off, size};
            if (xfer_batch_add(bs[i], &it) < 0 || xfer_batch_submit(bs[i], 0) < 0)
                return -1;
        }
        for (int i = 0; i < d; i++) {
            if (xfer_batch_wait(bs[i], -1) != 0)
                return -1;
            if (!reuse)
                xfer_batch_free(bs[i]);
        }
    }
    double t = (now_s() - t0) / iters;
    for (int i = 0; reuse && i < d; i++)
        xfer_batch_free(bs[i]);
    return t;
}

int main(int argc, char **argv)
{
    const char *transport = "tcp";
    uint64_t size = 64;
    int iters = 20000, repeat = 3;
    static const struct option opts[] = {{"transport", 1, 0, 't'},
                                         {"size", 1, 0, 's'},
                                         {"iters", 1, 0, 'n'},
                                         {"repeat", 1, 0, 'r'},
                                         {0, 0, 0, 0}};
    for (int c; (c = getopt_long(argc, argv, "", opts, NULL)) != -1;) {
        switch (c) {
        case 't':
            transport = optarg;
            break;
        case 's':
            size = strtoull(optarg, NULL, 0);
            break;
        case 'n':
            iters = atoi(optarg);
            break;
        case 'r':
            repeat = atoi(optarg);
            break;
        default:
            fprintf(stderr, "usage: bench_call [--transport T] [--size B] [--iters N]\n");
            return 2;
        }
    }
    unsigned mask;
    if (xfer_transports_parse(transport, &mask) || size == 0 || size * MAX_DEPTH > (1 << 20) ||
        iters < MAX_DEPTH || repeat < 1) {
        fprintf(stderr,
                "bench_call: bad --transport, --size (1..16384), --iters (>= 64) or --repeat\n");
        return 2;
    }
    struct setup s = {0};
    int rc = setup(&s, mask);
    if (rc) {
        fprintf(stderr, "bench_call: setup: %s\n", xfer_strerror(rc));
        return 1;
    }
    static const int depths[] = {1, 32};
    for (size_t k = 0; k < 2; k++) {
        for (int reuse = 0; reuse < 2; reuse++) {
            double best = 1e9;
            for (int r = 0; r < repeat; r++) {
                double t = run(&s, depths[k], iters, size, reuse);
                if (t < 0) {
                    fprintf(stderr, "bench_call: transfer failed: %s\n",
                            xfer_engine_last_error(s.b));
                    return 1;
                }
                best = t < best ? t : best;
            }
            printf("C      %-4s size %-6llu depth %-3d %-5s %8.2f us/transfer\n", transport,
                   (unsigned long long)size, depths[k], reuse ? "reuse" : "new", best * 1e6);
        }
    }
    xfer_engine_free(s.b);
    xfer_engine_free(s.a);
    return 0;
}
