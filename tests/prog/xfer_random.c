/*
 * Random READ/WRITE items against a served node, every byte verified.
 *
 *   xfer_random --peer FILE [--region rw] [--pattern-seed N] [--items N]
 *               [--seed N] [--sockets N] [--threads N]
 *
 * The served region starts as pattern(pattern-seed); this program keeps a
 * shadow copy of what it must contain. Per batch (1..256 items) the remote
 * ranges of all items are disjoint, and so are the local ranges, so the
 * outcome is exact whatever order the chunks land in. WRITE sources get fresh
 * random bytes, READ destinations are poisoned first; after each batch every
 * READ is compared with the shadow and every WRITE is applied to it. At the
 * end the whole region is read back and compared by checksum and memcmp.
 * With --threads N, N workers submit concurrently, each in its own slice of
 * the region (and of the local buffer), with its own batches.
 * Lengths: 97% log-uniform in [1 B, 1 MiB], 3% in [1 MiB, 64 MiB].
 */
#include "node_common.h"

#include <getopt.h>
#include <math.h>
#include <pthread.h>

#define MAX_BATCH 256

static __thread uint64_t rng_state; /* per worker thread */
static uint64_t rnd(void)
{
    rng_state += 0x9e3779b97f4a7c15ull;
    return mix64(rng_state);
}
static double rnd01(void)
{
    return (double)(rnd() >> 11) / 9007199254740992.0;
}
static uint64_t log_uniform(double lo, double hi)
{
    return (uint64_t)exp(log(lo) + rnd01() * (log(hi) - log(lo)));
}

struct span {
    uint64_t off, len;
};

static bool overlaps(const struct span *v, int n, uint64_t off, uint64_t len)
{
    for (int i = 0; i < n; i++)
        if (off < v[i].off + v[i].len && v[i].off < off + len)
            return true;
    return false;
}

/* Random offset in [0, size - len] whose range avoids v; false if none found. */
static bool place(const struct span *v, int n, uint64_t size, uint64_t len, uint64_t *off)
{
    for (int tries = 0; tries < 16; tries++) {
        *off = rnd() % (size - len + 1);
        if (!overlaps(v, n, *off, len))
            return true;
    }
    return false;
}

struct run {
    uint64_t base; /* this worker's slice of both regions: [base, base+size) */
    uint64_t seed;
    long todo;
    int batches;
    double busy;
    xfer_engine *e;
    xfer_peer *p;
    const struct xfer_region_desc *rd;
    xfer_region *local;
    uint8_t *lp, *shadow;
    uint64_t size, bytes, items, reads, writes;
    int failures;
};

/* Fills b with up to want items; returns how many. */
static int build_batch(struct run *r, xfer_batch *b, int want, struct xfer_item *items)
{
    struct span rs[MAX_BATCH], ls[MAX_BATCH];
    int n = 0;
    for (int k = 0; k < want; k++) {
        uint64_t len = rnd01() < 0.97 ? log_uniform(1, 1 << 20) : log_uniform(1 << 20, 64 << 20);
        if (len < 1)
            len = 1;
        if (len > r->size)
            len = r->size;
        uint64_t roff, loff;
        bool ok;
        for (;;) { /* shrink until it fits beside the others */
            ok = place(rs, n, r->size, len, &roff) && place(ls, n, r->size, len, &loff);
            if (ok || len == 1)
                break;
            len /= 2;
        }
        if (!ok)
            break;
        struct xfer_item *it = &items[n];
        rs[n] = (struct span){roff, len};
        ls[n] = (struct span){loff, len};
        loff += r->base;
        roff += r->base;
        *it = (struct xfer_item){rnd() & 1 ? XFER_OP_READ : XFER_OP_WRITE,
                                 r->local,
                                 loff,
                                 r->p,
                                 r->rd->id,
                                 r->rd->gen,
                                 roff,
                                 len};
        if (it->op == XFER_OP_WRITE)
            pattern_fill(r->lp + loff, len, rnd(), loff);
        else
            memset(r->lp + loff, 0xa5, len);
        if (xfer_batch_add(b, it) < 0) {
            fprintf(stderr, "batch_add: %s\n", xfer_engine_last_error(r->e));
            r->failures++;
            break;
        }
        n++;
    }
    return n;
}

static void check_batch(struct run *r, xfer_batch *b, const struct xfer_item *items, int n)
{
    for (int k = 0; k < n; k++) { /* reads first: they saw the pre-batch content */
        const struct xfer_item *it = &items[k];
        int st = xfer_batch_item_status(b, (size_t)k);
        if (st != 0) {
            fprintf(stderr, "item %d (%s %llu B): %s\n", k,
                    it->op == XFER_OP_READ ? "READ" : "WRITE", (unsigned long long)it->len,
                    xfer_batch_item_error(b, (size_t)k));
            r->failures++;
            continue;
        }
        if (it->op == XFER_OP_READ &&
            memcmp(r->lp + it->local_off, r->shadow + it->remote_off, it->len)) {
            fprintf(
                stderr,
                "READ of %llu B at remote %llu: data differs (checksum %016llx, want %016llx)\n",
                (unsigned long long)it->len, (unsigned long long)it->remote_off,
                (unsigned long long)checksum(r->lp + it->local_off, it->len),
                (unsigned long long)checksum(r->shadow + it->remote_off, it->len));
            r->failures++;
        }
    }
    for (int k = 0; k < n; k++) {
        const struct xfer_item *it = &items[k];
        if (it->op == XFER_OP_WRITE)
            memcpy(r->shadow + it->remote_off, r->lp + it->local_off, it->len);
        r->bytes += it->len;
        r->reads += it->op == XFER_OP_READ;
        r->writes += it->op == XFER_OP_WRITE;
    }
    r->items += (uint64_t)n;
}

/* Reads the whole region back and compares it with the shadow. */
static void final_check(struct run *r)
{
    memset(r->lp, 0, r->size);
    for (uint64_t off = 0; off < r->size; off += 64 << 20) {
        uint64_t len = r->size - off < (64 << 20) ? r->size - off : 64 << 20;
        int rc = xfer_read(r->e, r->local, off, r->p, r->rd->id, r->rd->gen, off, len, 30000);
        if (rc < 0) {
            fprintf(stderr, "final read: %s\n", xfer_engine_last_error(r->e));
            r->failures++;
            return;
        }
    }
    uint64_t got = checksum(r->lp, r->size), want = checksum(r->shadow, r->size);
    printf("final region checksum %016llx, expected %016llx: %s\n", (unsigned long long)got,
           (unsigned long long)want,
           got == want && !memcmp(r->lp, r->shadow, r->size) ? "ok" : "MISMATCH");
    if (got != want || memcmp(r->lp, r->shadow, r->size))
        r->failures++;
}

/* One worker: its own batch, slice and random stream. */
static void *worker(void *arg)
{
    struct run *r = arg;
    rng_state = r->seed;
    int rc;
    xfer_batch *b = xfer_batch_new(r->e, &rc);
    struct xfer_item batch_items[MAX_BATCH];
    while (r->items < (uint64_t)r->todo && r->failures == 0) {
        xfer_batch_reset(b);
        long left = r->todo - (long)r->items;
        int want = 1 + (int)(rnd() % MAX_BATCH);
        int n = build_batch(r, b, want < left ? want : (int)left, batch_items);
        double t1 = now_s();
        rc = xfer_batch_submit(b, 60000);
        if (rc == 0)
            rc = xfer_batch_wait(b, -1);
        r->busy += now_s() - t1;
        if (rc < 0 && rc != -XFER_EINPROGRESS)
            fprintf(stderr, "batch %d: %s\n", r->batches, xfer_strerror(rc));
        check_batch(r, b, batch_items, n);
        r->batches++;
    }
    xfer_batch_free(b);
    return NULL;
}

int main(int argc, char **argv)
{
    static const struct option lo[] = {{"peer", 1, 0, 'p'},         {"region", 1, 0, 'r'},
                                       {"items", 1, 0, 'i'},        {"seed", 1, 0, 's'},
                                       {"pattern-seed", 1, 0, 'P'}, {"sockets", 1, 0, 'k'},
                                       {"threads", 1, 0, 'T'},      {0, 0, 0, 0}};
    const char *peer = NULL, *region = "rw";
    long items = 10000, sockets = 4;
    int threads = 1;
    uint64_t pseed = 0;
    rng_state = 1;
    for (int c; (c = getopt_long(argc, argv, "", lo, NULL)) != -1;) {
        switch (c) {
        case 'p':
            peer = optarg;
            break;
        case 'r':
            region = optarg;
            break;
        case 'i':
            items = atol(optarg);
            break;
        case 's':
            rng_state = strtoull(optarg, NULL, 0);
            break;
        case 'P':
            pseed = strtoull(optarg, NULL, 0);
            break;
        case 'k':
            sockets = atol(optarg);
            break;
        case 'T':
            threads = atoi(optarg) < 1 ? 1 : atoi(optarg) > 16 ? 16 : atoi(optarg);
            break;
        default:
            return 2;
        }
    }
    struct node_file nf;
    if (!peer || node_file_read(peer, &nf) < 0)
        return 2;
    struct run r = {0};
    r.rd = node_region(&nf, region);
    int rc;
    r.e = r.rd ? client_engine("random-client", &nf, NULL, (int)sockets, &r.p, &rc) : NULL;
    if (!r.e || rc < 0) {
        fprintf(stderr, "connect failed\n");
        return 1;
    }
    r.size = r.rd->len;
    if (xfer_region_alloc(r.e, "local", r.size, XFER_ACCESS_RW, &r.local) < 0 ||
        !(r.shadow = malloc(r.size)))
        return 1;
    r.lp = xfer_region_ptr(r.local);
    pattern_fill(r.shadow, r.size, pseed, 0);
    printf("random: %ld items, seed %llu, region %s of %llu bytes, %ld sockets, %d threads\n",
           items, (unsigned long long)rng_state, region, (unsigned long long)r.size, sockets,
           threads);
    pthread_t tids[16];
    struct run w[16];
    uint64_t slice = r.size / (uint64_t)threads;
    double t0 = now_s();
    for (int i = 0; i < threads; i++) {
        w[i] = r;
        w[i].base = (uint64_t)i * slice;
        w[i].size = slice;
        w[i].seed = rng_state + (uint64_t)i * 0x1000193;
        w[i].todo = items / threads + (i < items % threads);
        pthread_create(&tids[i], NULL, worker, &w[i]);
    }
    double busy = 0;
    int batches = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(tids[i], NULL);
        r.items += w[i].items;
        r.reads += w[i].reads;
        r.writes += w[i].writes;
        r.bytes += w[i].bytes;
        r.failures += w[i].failures;
        batches += w[i].batches;
        busy = w[i].busy > busy ? w[i].busy : busy;
    }
    double total = now_s() - t0;
    printf("random: %llu items (%llu READ, %llu WRITE) in %d batches, %.2f GB moved, "
           "%.1f s total, %.2f GB/s while transferring\n",
           (unsigned long long)r.items, (unsigned long long)r.reads, (unsigned long long)r.writes,
           batches, r.bytes / 1e9, total, busy > 0 ? r.bytes / busy / 1e9 : 0.0);
    if (r.failures == 0)
        final_check(&r);
    xfer_engine_free(r.e);
    free(r.shadow);
    printf("random: %s (%d failures)\n", r.failures ? "FAILED" : "passed", r.failures);
    return r.failures ? 1 : 0;
}
