/*
 * Block items (xfer_batch_add_block_item) against a served node, every
 * byte checked: the form a KV pool request takes over ipc (block ids +
 * stream bases instead of one segment per block).
 *
 *   xfer_blocks --peer FILE [--region rw] [--pattern-seed N] [--rounds N]
 *               [--seed N] [--guard REGION:OFF] [--expect ipc|tcp]
 *
 * --expect ipc: random rounds, each a pool-like layout laid over the
 * remote region and a local one (vLLM-like: stream s at s * N * L, stride
 * L; or block-major-like: stride S * L) with a random block length, 1..4
 * streams split into 1..3 items sharing one id list (stored once), READ
 * or WRITE each, now and then 4,096 ids x 4 streams (several ipc jobs);
 * ids distinct on each side, so the outcome is exact: a shadow of the
 * region is kept and the whole region compared at the end. Then refusals:
 * a local id past the region or past 2^64 / stride and a remote id past
 * 2^64 refused at add naming the id; a remote id past the remote region
 * fails its item with -XFER_ERANGE naming the segment; with --guard (a
 * range no lease covers) a block on it fails with -XFER_ESTALE naming the
 * segment; bad lists refused at add. --expect tcp: the item is refused
 * with -XFER_ENOTSUP (tcp keeps segment lists).
 */
#include "check.h"
#include "node_common.h"

#include <getopt.h>

static uint64_t rng_state = 1;
static uint64_t rnd(void)
{
    rng_state += 0x9e3779b97f4a7c15ull;
    return mix64(rng_state);
}

struct ctx {
    xfer_engine *e;
    xfer_peer *p;
    const struct xfer_region_desc *rd;
    xfer_region *local;
    uint8_t *lp, *shadow;
    uint64_t size;
    const struct xfer_region_desc *grd;
    uint64_t guard_off;
};

static struct xfer_item head(struct ctx *c, enum xfer_op op, const struct xfer_region_desc *rd)
{
    return (struct xfer_item){
        .op = op, .local = c->local, .peer = c->p, .remote_id = rd->id, .remote_gen = rd->gen};
}

/* n distinct ids below nblocks (a partial shuffle). */
static void pick_ids(uint64_t *ids, size_t n, uint64_t nblocks, uint64_t *perm)
{
    for (uint64_t k = 0; k < nblocks; k++)
        perm[k] = k;
    for (size_t k = 0; k < n; k++) {
        uint64_t j = k + rnd() % (nblocks - k), t = perm[k];
        perm[k] = perm[j];
        perm[j] = t;
        ids[k] = perm[k];
    }
}

#define MAX_IDS 4096

static void random_round(struct ctx *c, xfer_batch *b, uint64_t *lid, uint64_t *rid, uint64_t *perm)
{
    static const uint64_t lens[] = {1, 24, 512, 4096, 16384};
    uint64_t L = lens[rnd() % 5];
    uint32_t S = 1 + (uint32_t)(rnd() % 4);
    bool big = rnd() % 8 == 0;
    uint64_t N = c->size / (S * L);
    N = N > 65536 ? 65536 : N;
    size_t n = big ? MAX_IDS : 1 + rnd() % 512;
    if (n > N)
        n = N;
    bool vllm = rnd() & 1; /* else block-major-like */
    uint64_t stride = vllm ? L : S * L, base[4];
    for (uint32_t s = 0; s < S; s++)
        base[s] = vllm ? s * N * L : s * L;
    pick_ids(lid, n, N, perm);
    pick_ids(rid, n, N, perm);
    uint32_t nitems = 1 + (uint32_t)(rnd() % (S < 3 ? S : 3)), s0 = 0;
    enum xfer_op ops[3];
    struct xfer_block_list bl[3];
    xfer_batch_reset(b);
    for (uint32_t i = 0; i < nitems; i++) {
        uint32_t ns =
            i + 1 == nitems ? S - s0 : 1 + (uint32_t)(rnd() % (S - s0 - (nitems - 1 - i)));
        ops[i] = rnd() & 1 ? XFER_OP_READ : XFER_OP_WRITE;
        bl[i] = (struct xfer_block_list){.len = L,
                                         .local_stride = stride,
                                         .remote_stride = stride,
                                         .local_ids = lid,
                                         .remote_ids = rid,
                                         .nids = (uint32_t)n,
                                         .local_base = base + s0,
                                         .remote_base = base + s0,
                                         .nstreams = ns};
        for (uint64_t k = 0; k < (uint64_t)ns * n; k++) {
            struct xfer_seg sg = xfer_block_list_seg(&bl[i], k);
            if (ops[i] == XFER_OP_WRITE)
                pattern_fill(c->lp + sg.local_off, sg.len, rnd(), sg.local_off);
            else
                memset(c->lp + sg.local_off, 0xa5, sg.len);
        }
        struct xfer_item it = head(c, ops[i], c->rd);
        int idx = xfer_batch_add_block_item(b, &it, &bl[i]);
        CHECK(idx == (int)i, "add_block_item: %d (%s)", idx, xfer_engine_last_error(c->e));
        s0 += ns;
    }
    int rc = xfer_batch_submit(b, 60000);
    rc = rc ? rc : xfer_batch_wait(b, -1);
    CHECK(rc == 0, "batch of %u block items (%zu ids x %u streams of %llu B): %s", nitems, n, S,
          (unsigned long long)L, xfer_strerror(rc));
    for (uint32_t i = 0; i < nitems; i++) {
        CHECK(xfer_batch_item_status(b, i) == 0, "item %u: %s", i, xfer_batch_item_error(b, i));
        CHECK(xfer_batch_item_transport(b, i) == XFER_TRANSPORT_IPC, "item %u not over ipc", i);
        for (uint64_t k = 0; k < (uint64_t)bl[i].nstreams * n; k++) {
            struct xfer_seg sg = xfer_block_list_seg(&bl[i], k);
            if (ops[i] == XFER_OP_READ)
                CHECK(!memcmp(c->lp + sg.local_off, c->shadow + sg.remote_off, sg.len),
                      "READ item %u segment %llu (remote %llu) differs", i, (unsigned long long)k,
                      (unsigned long long)sg.remote_off);
        }
    }
    for (uint32_t i = 0; i < nitems; i++) /* after every READ compared its bytes */
        for (uint64_t k = 0; ops[i] == XFER_OP_WRITE && k < (uint64_t)bl[i].nstreams * n; k++) {
            struct xfer_seg sg = xfer_block_list_seg(&bl[i], k);
            memcpy(c->shadow + sg.remote_off, c->lp + sg.local_off, sg.len);
        }
}

static void final_check(struct ctx *c)
{
    memset(c->lp, 0, c->size);
    int rc = xfer_read(c->e, c->local, 0, c->p, c->rd->id, c->rd->gen, 0, c->size, 30000);
    CHECK(rc == 0, "final read: %s", xfer_engine_last_error(c->e));
    uint64_t at = 0;
    while (rc == 0 && at < c->size && c->lp[at] == c->shadow[at])
        at++;
    CHECK(rc != 0 || at == c->size, "final region content differs at %llu of %llu",
          (unsigned long long)at, (unsigned long long)c->size);
}

/* Two streams of 8 ids of 4 KiB (stride 4 KiB, stream 1 at 1 MiB); id
 * entry `bad` of the remote list replaced by `evil`. */
static struct xfer_block_list small_list(uint64_t *lid, uint64_t *rid, const uint64_t *base)
{
    for (uint64_t k = 0; k < 8; k++)
        lid[k] = rid[k] = k * 2;
    return (struct xfer_block_list){.len = 4096,
                                    .local_stride = 4096,
                                    .remote_stride = 4096,
                                    .local_ids = lid,
                                    .remote_ids = rid,
                                    .nids = 8,
                                    .local_base = base,
                                    .remote_base = base,
                                    .nstreams = 2};
}

/* A READ block item failing where it runs: code, the segment and its
 * number in the reason. */
static void expect_bad(struct ctx *c, xfer_batch *b, const struct xfer_region_desc *rd,
                       const struct xfer_block_list *bl, int64_t seg, int code, const char *what)
{
    xfer_batch_reset(b);
    struct xfer_item it = head(c, XFER_OP_READ, rd);
    CHECK(xfer_batch_add_block_item(b, &it, bl) == 0, "%s: add: %s", what,
          xfer_engine_last_error(c->e));
    int rc = xfer_batch_submit(b, 10000);
    rc = rc ? rc : xfer_batch_wait(b, -1);
    const char *why = xfer_batch_item_error(b, 0);
    char want[32];
    snprintf(want, sizeof(want), "segment %lld", (long long)seg);
    printf("%s: %s (segment %lld): %s\n", what, xfer_strerror(rc),
           (long long)xfer_batch_item_failed_segment(b, 0), why);
    CHECK(rc == code, "%s: got %s, want %s", what, xfer_strerror(rc), xfer_strerror(code));
    CHECK(xfer_batch_item_failed_segment(b, 0) == seg, "%s: failed segment %lld, want %lld", what,
          (long long)xfer_batch_item_failed_segment(b, 0), (long long)seg);
    CHECK(strstr(why, want) != NULL, "%s: reason does not name %s: %s", what, want, why);
}

static void refusals(struct ctx *c, xfer_batch *b)
{
    uint64_t lid[8], rid[8], base[2] = {0, 1 << 20};
    struct xfer_block_list bl = small_list(lid, rid, base);
    struct xfer_item it = head(c, XFER_OP_READ, c->rd);
    xfer_batch_reset(b);
    /* at add, with the id named */
    lid[5] = c->size / 4096; /* past the local region */
    CHECK(xfer_batch_add_block_item(b, &it, &bl) == -XFER_ERANGE, "local id past the region");
    const char *why = xfer_engine_last_error(c->e);
    char want[64];
    snprintf(want, sizeof(want), "local id %llu (entry 5)", (unsigned long long)lid[5]);
    CHECK(strstr(why, want) != NULL, "reason does not name %s: %s", want, why);
    printf("local id past the region: %s\n", why);
    lid[5] = UINT64_MAX / 4096 + 1; /* id * stride wraps to a small offset */
    CHECK(xfer_batch_add_block_item(b, &it, &bl) == -XFER_ERANGE, "local id * stride wraps");
    printf("local id past 2^64: %s\n", xfer_engine_last_error(c->e));
    lid[5] = 10;
    rid[3] = UINT64_MAX / 4096; /* base 1 MiB + id * stride > 2^64 */
    CHECK(xfer_batch_add_block_item(b, &it, &bl) == -XFER_ERANGE, "remote id past 2^64");
    why = xfer_engine_last_error(c->e);
    CHECK(strstr(why, "remote id") && strstr(why, "entry 3"), "reason: %s", why);
    printf("remote id past 2^64: %s\n", why);
    rid[3] = 6;
    struct xfer_block_list z = bl;
    z.nids = 0;
    CHECK(xfer_batch_add_block_item(b, &it, &z) == -XFER_EINVAL, "no ids accepted");
    z = bl;
    z.len = 0;
    CHECK(xfer_batch_add_block_item(b, &it, &z) == -XFER_EINVAL, "len 0 accepted");
    z = bl;
    z.nstreams = XFER_SEGS_MAX;
    CHECK(xfer_batch_add_block_item(b, &it, &z) == -XFER_EINVAL, "too many segments accepted");
    z = bl;
    z.remote_ids = NULL;
    CHECK(xfer_batch_add_block_item(b, &it, &z) == -XFER_EINVAL, "NULL ids accepted");
    CHECK(xfer_batch_count(b) == 0, "a refused list left %zu items", xfer_batch_count(b));
    /* where it runs: past the remote region (stream 1, entry 4 = segment 12) */
    rid[4] = (c->size - (1 << 20)) / 4096;
    expect_bad(c, b, c->rd, &bl, 8 + 4, -XFER_ERANGE, "remote id past the region");
    rid[4] = 8;
    if (c->grd) { /* a block on a range no lease covers: stream 0, entry 6 */
        rid[6] = c->guard_off / 4096;
        base[1] = 1 << 21;
        expect_bad(c, b, c->grd, &bl, 6, -XFER_ESTALE, "block on a guarded range");
    }
}

/* tcp does not expand block items: the item is refused, not misread. */
static void refused_by_tcp(struct ctx *c, xfer_batch *b)
{
    uint64_t lid[8], rid[8], base[2] = {0, 1 << 20};
    struct xfer_block_list bl = small_list(lid, rid, base);
    struct xfer_item it = head(c, XFER_OP_READ, c->rd);
    xfer_batch_reset(b);
    CHECK(xfer_batch_add_block_item(b, &it, &bl) == 0, "add: %s", xfer_engine_last_error(c->e));
    int rc = xfer_batch_submit(b, 10000);
    rc = rc ? rc : xfer_batch_wait(b, -1);
    printf("over tcp: %s: %s\n", xfer_strerror(rc), xfer_batch_item_error(b, 0));
    CHECK(rc == -XFER_ENOTSUP, "over tcp: %s", xfer_strerror(rc));
    CHECK(strstr(xfer_batch_item_error(b, 0), "block items"), "reason: %s",
          xfer_batch_item_error(b, 0));
}

int main(int argc, char **argv)
{
    static const struct option lo[] = {{"peer", 1, 0, 'p'},   {"region", 1, 0, 'r'},
                                       {"rounds", 1, 0, 'n'}, {"seed", 1, 0, 's'},
                                       {"guard", 1, 0, 'g'},  {"pattern-seed", 1, 0, 'P'},
                                       {"expect", 1, 0, 'x'}, {0, 0, 0, 0}};
    const char *peer = NULL, *region = "rw", *guard = NULL;
    char gname[64] = "";
    long rounds = 40;
    uint64_t pseed = 0;
    unsigned expect = XFER_TRANSPORT_IPC;
    struct ctx c = {0};
    for (int o; (o = getopt_long(argc, argv, "", lo, NULL)) != -1;) {
        if (o == 'p')
            peer = optarg;
        else if (o == 'r')
            region = optarg;
        else if (o == 'n')
            rounds = atol(optarg);
        else if (o == 's')
            rng_state = strtoull(optarg, NULL, 0);
        else if (o == 'P')
            pseed = strtoull(optarg, NULL, 0);
        else if (o == 'g')
            guard = optarg;
        else if (o == 'x' && xfer_transports_parse(optarg, &expect) == 0)
            continue;
        else
            return 2;
    }
    struct node_file nf;
    if (!peer || node_file_read(peer, &nf) < 0 || !(c.rd = node_region(&nf, region)))
        return 2;
    if (guard && (sscanf(guard, "%63[^:]:%" SCNu64, gname, &c.guard_off) != 2 ||
                  !(c.grd = node_region(&nf, gname))))
        return 2;
    int rc;
    c.e = client_engine("blocks-client", &nf, NULL, 4, &c.p, &rc);
    if (!c.e || rc < 0)
        return 1;
    c.size = c.rd->len;
    uint64_t *lid = malloc(MAX_IDS * sizeof(*lid)), *rid = malloc(MAX_IDS * sizeof(*rid));
    uint64_t *perm = malloc(65536 * sizeof(*perm));
    xfer_batch *b = xfer_batch_new(c.e, &rc);
    if (xfer_region_alloc(c.e, "local", c.size, XFER_ACCESS_RW, &c.local) < 0 || !lid || !rid ||
        !perm || !b || !(c.shadow = malloc(c.size)))
        return 1;
    c.lp = xfer_region_ptr(c.local);
    pattern_fill(c.shadow, c.size, pseed, 0);
    if (expect != XFER_TRANSPORT_IPC) {
        refused_by_tcp(&c, b);
    } else {
        printf("blocks: %ld rounds, seed %llu, region %s of %llu bytes\n", rounds,
               (unsigned long long)rng_state, region, (unsigned long long)c.size);
        double t0 = now_s();
        for (long r = 0; r < rounds && !failures; r++)
            random_round(&c, b, lid, rid, perm);
        printf("blocks: random rounds %s in %.1f s\n", failures ? "FAILED" : "passed",
               now_s() - t0);
        if (!failures)
            final_check(&c);
        refusals(&c, b);
    }
    xfer_batch_free(b);
    xfer_engine_free(c.e);
    free(lid);
    free(rid);
    free(perm);
    free(c.shadow);
    printf("blocks: %s (%d failures)\n", failures ? "FAILED" : "passed", failures);
    return failures ? 1 : 0;
}
