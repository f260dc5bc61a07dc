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
#include "items_common.h"

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
        struct xfer_item it = item_head(c, ops[i], c->rd);
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
    struct xfer_item it = item_head(c, XFER_OP_READ, rd);
    CHECK(xfer_batch_add_block_item(b, &it, bl) == 0, "%s: add: %s", what,
          xfer_engine_last_error(c->e));
    expect_item_fails(c, b, seg, code, what);
}

static void refusals(struct ctx *c, xfer_batch *b)
{
    uint64_t lid[8], rid[8], base[2] = {0, 1 << 20};
    struct xfer_block_list bl = small_list(lid, rid, base);
    struct xfer_item it = item_head(c, XFER_OP_READ, c->rd);
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
    if (c->ro) { /* a WRITE to a read-only region: refused whole where it runs */
        uint64_t one = 0, zero = 0;
        struct xfer_block_list r = {.len = 16,
                                    .local_stride = 4096,
                                    .remote_stride = 4096,
                                    .local_ids = &one,
                                    .remote_ids = &one,
                                    .nids = 1,
                                    .local_base = &zero,
                                    .remote_base = &zero,
                                    .nstreams = 1};
        xfer_batch_reset(b);
        struct xfer_item w = item_head(c, XFER_OP_WRITE, c->ro);
        CHECK(xfer_batch_add_block_item(b, &w, &r) == 0, "read-only: add: %s",
              xfer_engine_last_error(c->e));
        expect_item_fails(c, b, -1, -XFER_EACCES, "WRITE block item to a read-only region");
    }
}

/* tcp does not expand block items: the item is refused, not misread. */
static void refused_by_tcp(struct ctx *c, xfer_batch *b)
{
    uint64_t lid[8], rid[8], base[2] = {0, 1 << 20};
    struct xfer_block_list bl = small_list(lid, rid, base);
    struct xfer_item it = item_head(c, XFER_OP_READ, c->rd);
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
    struct ctx c = {.rounds = 40, .expect = XFER_TRANSPORT_IPC};
    int rc = items_setup(argc, argv, "blocks-client", &c);
    if (rc)
        return rc;
    uint64_t *lid = malloc(MAX_IDS * sizeof(*lid)), *rid = malloc(MAX_IDS * sizeof(*rid));
    uint64_t *perm = malloc(65536 * sizeof(*perm));
    xfer_batch *b = xfer_batch_new(c.e, &rc);
    if (!lid || !rid || !perm || !b)
        return 1;
    if (c.expect != XFER_TRANSPORT_IPC) {
        refused_by_tcp(&c, b);
    } else {
        printf("blocks: %ld rounds, seed %llu, region %s of %llu bytes\n", c.rounds,
               (unsigned long long)rng_state, c.rd->name, (unsigned long long)c.size);
        double t0 = now_s();
        for (long r = 0; r < c.rounds && !failures; r++)
            random_round(&c, b, lid, rid, perm);
        printf("blocks: random rounds %s in %.1f s\n", failures ? "FAILED" : "passed",
               now_s() - t0);
        if (!failures)
            final_check(&c);
        refusals(&c, b);
    }
    xfer_batch_free(b);
    items_teardown(&c);
    free(lid);
    free(rid);
    free(perm);
    printf("blocks: %s (%d failures)\n", failures ? "FAILED" : "passed", failures);
    return failures ? 1 : 0;
}
