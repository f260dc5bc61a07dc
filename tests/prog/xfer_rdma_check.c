/*
 * Test helper for the rdma transport (integration tests; also runs on real
 * NICs, see docs/rdma.md). Talks to a node served by xfer_node.
 *
 *   Common options: --secret S, --progress N (engine progress threads: one CQ
 *   per thread and NIC, QPs spread over them).
 *
 *   xfer_rdma_check random --peer FILE [--seed N] [--rounds N]
 *       batches of random sizes (0 B .. 3 MiB, odd lengths, chunk-crossing),
 *       offsets and directions against region rw; every byte is checked
 *       against the position-based pattern (reads of the served content,
 *       written data read back into other local offsets).
 *   xfer_rdma_check bench --peer FILE [--seconds S] [--sizes 4096,65536,...]
 *       one-sided WRITE then READ against region rw, item sizes 4 KiB..64 MiB
 *       (or --sizes), two batches in flight, each point for S seconds
 *       (default 1); prints GB/s (1e9 B/s) and items/s. The numbers mean
 *       something on real NICs only (docs/rdma.md).
 *   xfer_rdma_check nic --peer FILE
 *       what the NIC itself refuses, with descriptors that lie to skip the
 *       initiator's own checks: a bad rkey, a write to a region the target
 *       registered read-only, a read beyond the registered bytes. Each must
 *       fail with -XFER_EACCES "remote access error", fail only its own item
 *       in a mixed batch, and leave the connection usable (the QP in error is
 *       re-established).
 *
 * Server regions: rw (rw, seed given by --server-seed, default 1), ro (r).
 */
#include "check.h"
#include "node_common.h"

#include <getopt.h>
#include <stdbool.h>

static uint64_t rng_state;
static uint64_t rnd(uint64_t n)
{
    return n ? mix64(rng_state++) % n : 0;
}

static bool pattern_ok(const uint8_t *p, uint64_t len, uint64_t seed, uint64_t base)
{
    for (uint64_t i = 0; i < len; i++)
        if (p[i] != pattern_byte(seed, base + i))
            return false;
    return true;
}

struct check {
    enum xfer_op op;
    uint64_t loff, roff, len, seed; /* what the local bytes must hold after */
};

/* Region rw is split in two halves: reads come from the lower half (served
 * content, never written), writes go to the upper half and are read back. */
static int run_random(xfer_engine *e, xfer_peer *p, const struct xfer_region_desc *rw,
                      uint64_t server_seed, int rounds)
{
    uint64_t half = rw->len / 2, max = 3u << 20;
    xfer_region *l;
    if (xfer_region_alloc(e, "local", 3 * rw->len, XFER_ACCESS_RW, &l) < 0)
        return 1;
    uint8_t *lp = xfer_region_ptr(l);
    uint64_t moved = 0;
    double t0 = now_s();
    for (int r = 0; r < rounds; r++) {
        int rc;
        xfer_batch *b = xfer_batch_new(e, &rc);
        struct check ck[16];
        int n = 1 + (int)rnd(16);
        /* Items use disjoint local and remote slots so they may run in any order. */
        uint64_t slot = rw->len / 32, lslot = 2 * rw->len / 16;
        for (int i = 0; i < n; i++) {
            uint64_t len = rnd(4) == 0 ? rnd(64) : rnd(slot < max ? slot : max);
            uint64_t roff = rnd(slot - len + 1), loff = (uint64_t)i * lslot + rnd(lslot - len + 1);
            ck[i] = (struct check){rnd(2) ? XFER_OP_READ : XFER_OP_WRITE, loff, 0, len, 0};
            if (ck[i].op == XFER_OP_READ) {
                ck[i].roff = (uint64_t)i * slot + roff; /* lower half */
                ck[i].seed = server_seed;
                memset(lp + loff, 0xee, len);
            } else {
                ck[i].roff = half + (uint64_t)i * slot + roff;
                ck[i].seed = 1000 + (uint64_t)r;
                pattern_fill(lp + loff, len, ck[i].seed, ck[i].roff);
            }
            struct xfer_item it = {ck[i].op, l, loff, p, rw->id, rw->gen, ck[i].roff, len};
            xfer_batch_add(b, &it);
        }
        rc = xfer_batch_submit(b, 20000);
        if (rc == 0)
            rc = xfer_batch_wait(b, -1);
        CHECK(rc == 0, "round %d: batch: %s", r, xfer_strerror(rc));
        for (int i = 0; i < n && rc == 0; i++) {
            moved += ck[i].len;
            if (ck[i].op == XFER_OP_READ) {
                CHECK(pattern_ok(lp + ck[i].loff, ck[i].len, ck[i].seed, ck[i].roff),
                      "round %d item %d: READ %llu bytes at %llu: content mismatch", r, i,
                      (unsigned long long)ck[i].len, (unsigned long long)ck[i].roff);
                continue;
            }
            /* read the written range back into a scratch area and compare */
            uint8_t *back = lp + 2 * rw->len; /* past the items' local slots */
            memset(back, 0, ck[i].len);
            int rc2 =
                xfer_read(e, l, 2 * rw->len, p, rw->id, rw->gen, ck[i].roff, ck[i].len, 10000);
            CHECK(rc2 == 0 && pattern_ok(back, ck[i].len, ck[i].seed, ck[i].roff),
                  "round %d item %d: WRITE %llu bytes at %llu not read back (%s)", r, i,
                  (unsigned long long)ck[i].len, (unsigned long long)ck[i].roff,
                  xfer_strerror(rc2));
        }
        xfer_batch_free(b);
    }
    double s = now_s() - t0;
    printf("random: %d rounds, %.1f MiB in %.2f s, %d failures\n", rounds, moved / 1048576.0, s,
           failures);
    return failures ? 1 : 0;
}

/* One item with a descriptor that lies; the NIC must refuse it. */
static void nic_case(xfer_engine *e, xfer_peer *p, xfer_region *l,
                     const struct xfer_region_desc *lie, const struct xfer_region_desc *truth,
                     enum xfer_op op, uint64_t off, uint64_t len, const char *what)
{
    xfer_peer_region_add(p, lie);
    double t0 = now_s();
    int rc = op == XFER_OP_WRITE ? xfer_write(e, l, 0, p, lie->id, lie->gen, off, len, 5000)
                                 : xfer_read(e, l, 0, p, lie->id, lie->gen, off, len, 5000);
    printf("  %-40s -> %s in %.1f ms\n", what, xfer_strerror(rc), (now_s() - t0) * 1e3);
    CHECK(rc == -XFER_EACCES, "%s: got %s, want access denied", what, xfer_strerror(rc));
    xfer_peer_region_add(p, truth);
}

static int run_nic(xfer_engine *e, xfer_peer *p, const struct xfer_region_desc *rw,
                   const struct xfer_region_desc *ro, uint64_t server_seed)
{
    xfer_region *l;
    if (xfer_region_alloc(e, "local", 8 << 20, XFER_ACCESS_RW, &l) < 0)
        return 1;
    uint8_t *lp = xfer_region_ptr(l);
    /* Known content first: other clients may have written rw before us. */
    server_seed = 4242;
    pattern_fill(lp, 5 << 20, server_seed, 0);
    int rc = xfer_write(e, l, 0, p, rw->id, rw->gen, 0, 5 << 20, 10000);
    CHECK(rc == 0, "initial write: %s", xfer_strerror(rc));
    memset(lp, 0x5a, 8 << 20);
    struct xfer_region_desc lie = *rw;
    snprintf(lie.rkeys, sizeof(lie.rkeys), "%s", "7fff0001,7fff0001,7fff0001,7fff0001");
    nic_case(e, p, l, &lie, rw, XFER_OP_WRITE, 0, 4096, "write with a bad rkey");
    lie = *ro;
    lie.access = XFER_ACCESS_RW;
    nic_case(e, p, l, &lie, ro, XFER_OP_WRITE, 0, 3 << 20, "write to a read-only registration");
    lie = *rw;
    lie.len = rw->len * 2;
    nic_case(e, p, l, &lie, rw, XFER_OP_READ, rw->len - 4096, 8192, "read beyond the registration");
    /* a mixed batch: only the lying item failures, the others complete */
    lie = *ro;
    lie.access = XFER_ACCESS_RW;
    xfer_peer_region_add(p, &lie);
    xfer_batch *b = xfer_batch_new(e, &rc);
    for (int i = 0; i < 9; i++) {
        bool bad = i == 4;
        struct xfer_item it = {bad ? XFER_OP_WRITE : XFER_OP_READ,
                               l,
                               (uint64_t)i << 19,
                               p,
                               bad ? ro->id : rw->id,
                               bad ? ro->gen : rw->gen,
                               (uint64_t)i << 19,
                               1 << 19};
        xfer_batch_add(b, &it);
    }
    rc = xfer_batch_submit(b, 10000);
    if (rc == 0)
        rc = xfer_batch_wait(b, -1);
    for (int i = 0; i < 9; i++) {
        int st = xfer_batch_item_status(b, i);
        if (i == 4) {
            const char *why = xfer_batch_item_error(b, i);
            printf("  mixed batch: lying item -> %s (%s)\n", xfer_strerror(st), why ? why : "");
            CHECK(st == -XFER_EACCES, "mixed batch: lying item got %s", xfer_strerror(st));
            CHECK(why && strstr(why, "remote access error"), "reason: %s", why ? why : "(none)");
        } else {
            CHECK(st == 0, "mixed batch: item %d got %s (%s)", i, xfer_strerror(st),
                  xfer_batch_item_error(b, i));
            CHECK(st ||
                      pattern_ok(lp + ((uint64_t)i << 19), 1 << 19, server_seed, (uint64_t)i << 19),
                  "mixed batch: item %d content", i);
        }
    }
    xfer_batch_free(b);
    xfer_peer_region_add(p, ro);
    /* the connection still works: the QPs in error were re-established */
    double t0 = now_s();
    rc = xfer_read(e, l, 0, p, rw->id, rw->gen, 0, 4 << 20, 10000);
    printf("  read after the errors -> %s in %.1f ms\n", xfer_strerror(rc), (now_s() - t0) * 1e3);
    CHECK(rc == 0 && pattern_ok(lp, 4 << 20, server_seed, 0), "read after errors: %s",
          xfer_strerror(rc));
    printf("nic: %d failures\n", failures);
    return failures ? 1 : 0;
}

/* Two batches in flight over the lower/upper half of the region. */
static void bench_fill(xfer_batch *b, enum xfer_op op, xfer_region *l, xfer_peer *p,
                       const struct xfer_region_desc *rw, uint64_t size, int half)
{
    uint64_t span = rw->len / 2, n = span / size;
    n = n > 256 ? 256 : n ? n : 1;
    xfer_batch_reset(b);
    for (uint64_t i = 0; i < n; i++) {
        uint64_t off = (uint64_t)half * span + i * size;
        struct xfer_item it = {op, l, off, p, rw->id, rw->gen, off, size};
        xfer_batch_add(b, &it);
    }
}

static int bench_point(xfer_engine *e, xfer_peer *p, xfer_region *l,
                       const struct xfer_region_desc *rw, enum xfer_op op, uint64_t size,
                       double seconds)
{
    xfer_batch *b[2] = {xfer_batch_new(e, NULL), xfer_batch_new(e, NULL)};
    uint64_t bytes = 0, items = 0;
    int errors = 0;
    for (int k = 0; k < 2; k++) {
        bench_fill(b[k], op, l, p, rw, size, k);
        xfer_batch_submit(b[k], 60000);
    }
    double t0 = now_s(), t = t0;
    for (int k = 0;; k ^= 1) {
        if (xfer_batch_wait(b[k], -1) < 0)
            errors++;
        bytes += xfer_batch_count(b[k]) * size;
        items += xfer_batch_count(b[k]);
        t = now_s();
        if (t - t0 >= seconds || errors) {
            xfer_batch_wait(b[k ^ 1], -1);
            break;
        }
        xfer_batch_submit(b[k], 60000);
    }
    printf("%-10llu %-6s %9.2f GB/s %11.0f items/s%s\n", (unsigned long long)size,
           op == XFER_OP_WRITE ? "WRITE" : "READ", bytes / (t - t0) / 1e9, items / (t - t0),
           errors ? "  ERRORS" : "");
    xfer_batch_free(b[0]);
    xfer_batch_free(b[1]);
    return errors;
}

static int run_bench(xfer_engine *e, xfer_peer *p, const struct xfer_region_desc *rw,
                     const char *sizes, double seconds)
{
    xfer_region *l;
    if (xfer_region_alloc(e, "local", rw->len, XFER_ACCESS_RW, &l) < 0)
        return 1;
    const char *list = sizes ? sizes : "4096,65536,1048576,4194304,16777216,67108864";
    printf("%-10s %-6s %14s %17s\n", "size", "op", "bandwidth", "rate");
    int errors = 0;
    for (const char *q = list; *q;) {
        uint64_t size = strtoull(q, NULL, 10);
        if (size > 0 && size <= rw->len / 2)
            for (int op = XFER_OP_WRITE; op >= XFER_OP_READ; op--)
                errors += bench_point(e, p, l, rw, (enum xfer_op)op, size, seconds);
        q += strcspn(q, ",");
        q += *q == ',';
    }
    return errors ? 1 : 0;
}

/* client_engine() of node_common.h, with a number of progress threads. */
static xfer_engine *check_engine(const struct node_file *nf, const char *secret, int progress,
                                 xfer_peer **peer, int *rc)
{
    struct xfer_engine_config cfg;
    xfer_engine_config_init(&cfg);
    cfg.node_id = "rdma-check";
    cfg.transports = node_transports();
    if (secret) {
        cfg.secret = secret;
        cfg.secret_len = strlen(secret);
    }
    if (progress > 0)
        cfg.progress_threads = progress;
    cfg.connect_timeout_ms = 3000;
    cfg.io_timeout_ms = 3000;
    xfer_engine *e = xfer_engine_new(&cfg, rc);
    if (!e)
        return NULL;
    *rc = xfer_peer_add(e, &nf->peer, peer);
    for (int i = 0; *rc == 0 && i < nf->n_regions; i++)
        xfer_peer_region_add(*peer, &nf->regions[i]);
    return e;
}

int main(int argc, char **argv)
{
    static const struct option lo[] = {
        {"peer", 1, 0, 'p'},    {"seed", 1, 0, 's'},        {"rounds", 1, 0, 'r'},
        {"secret", 1, 0, 'S'},  {"server-seed", 1, 0, 'x'}, {"progress", 1, 0, 'P'},
        {"seconds", 1, 0, 't'}, {"sizes", 1, 0, 'z'},       {0, 0, 0, 0}};
    const char *peer = NULL, *secret = NULL, *sizes = NULL;
    double seconds = 1;
    uint64_t seed = 1, server_seed = 1;
    int rounds = 20, progress = 0;
    if (argc < 2) {
        fprintf(stderr, "usage: xfer_rdma_check random|nic|bench --peer FILE [options]\n");
        return 2;
    }
    optind = 2;
    for (int c; (c = getopt_long(argc, argv, "", lo, NULL)) != -1;) {
        switch (c) {
        case 'p':
            peer = optarg;
            break;
        case 's':
            seed = strtoull(optarg, NULL, 10);
            break;
        case 'r':
            rounds = atoi(optarg);
            break;
        case 'S':
            secret = optarg;
            break;
        case 'x':
            server_seed = strtoull(optarg, NULL, 10);
            break;
        case 'P':
            progress = atoi(optarg);
            break;
        case 't':
            seconds = atof(optarg);
            break;
        case 'z':
            sizes = optarg;
            break;
        default:
            return 2;
        }
    }
    struct node_file nf;
    if (!peer || node_file_read(peer, &nf) < 0)
        return 2;
    const struct xfer_region_desc *rw = node_region(&nf, "rw"), *ro = node_region(&nf, "ro");
    rng_state = seed;
    xfer_peer *p;
    int rc;
    xfer_engine *e = check_engine(&nf, secret, progress, &p, &rc);
    if (!e || rc < 0 || !rw) {
        fprintf(stderr, "connect: %s (%s)\n", xfer_strerror(rc),
                e ? xfer_engine_last_error(e) : "");
        return 1;
    }
    printf("peer %s over %s\n", nf.peer.node_id,
           xfer_peer_transport(p) == XFER_TRANSPORT_RDMA ? "rdma" : "another transport");
    int ret = 2;
    if (!strcmp(argv[1], "random"))
        ret = run_random(e, p, rw, server_seed, rounds);
    else if (!strcmp(argv[1], "bench"))
        ret = run_bench(e, p, rw, sizes, seconds);
    else if (!strcmp(argv[1], "nic") && ro)
        ret = run_nic(e, p, rw, ro, server_seed);
    xfer_engine_free(e);
    return ret;
}
