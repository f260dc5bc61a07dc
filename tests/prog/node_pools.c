/*
 * Test helper: KV pools between processes embedding the node library,
 * through a real redis-server (test_node_pools.sh drives them).
 *
 *   node_pools serve --node N [--ready FILE] [--transports T]
 *       registers one pool per layout kind (bm, fa, fi, sg, mla) in host
 *       memory, filled with a pattern of (node, pool, member), plus pools
 *       that differ from "fa" in one field each (m_<field>); serves until
 *       SIGTERM.
 *   node_pools check --node C --peer N [--transports T] [--expect tcp|ipc]
 *       the same pools locally; for each layout: random block lists READ
 *       and WRITE both ways over all layers, then a layer range, every byte
 *       checked against the layout formulas (written here again, not taken
 *       from the library); a vLLM pool fed from a FlashInfer one; run
 *       coalescing; each mismatch field refused; blocks out of range.
 */
#include "check.h"
#include "node_common.h"
#include "node_env.h"
#include "xfer_node.h"

#include <getopt.h>
#include <signal.h>

#define NB   64  /* blocks per pool */
#define LAY  4   /* layers */
#define BB   512 /* block bytes (one layer, one half) */
#define MAXR (2 * LAY)

struct kind {
    const char *name;
    enum xfer_kv_layout layout;
    uint32_t kv;
};
static const struct kind kinds[] = {
    {"bm", XFER_KV_BLOCK_MAJOR, 2}, {"fa", XFER_KV_VLLM_FA, 2}, {"fi", XFER_KV_FLASHINFER, 2},
    {"sg", XFER_KV_SGLANG, 2},      {"mla", XFER_KV_MLA, 1},
};
#define NKINDS (sizeof(kinds) / sizeof(kinds[0]))

static struct xfer_kv_geom geom_of(const struct kind *k)
{
    struct xfer_kv_geom g = {.layout = k->layout,
                             .block_bytes = BB,
                             .num_blocks = NB,
                             .layers = LAY,
                             .kv = k->kv,
                             .block_tokens = 16,
                             .kv_heads = 2,
                             .head_dim = 8,
                             .shard_count = 1};
    snprintf(g.dtype, sizeof(g.dtype), "bf16");
    snprintf(g.tag, sizeof(g.tag), "test-model");
    return g;
}

/* Layout formulas (the header's table), independent of the library. */
static void where(const struct xfer_kv_geom *g, uint32_t l, uint32_t h, uint64_t b, size_t *reg,
                  uint64_t *off)
{
    uint64_t B = g->block_bytes, N = g->num_blocks, kv = g->kv, L = g->layers;
    switch (g->layout) {
    case XFER_KV_BLOCK_MAJOR:
        *reg = 0, *off = ((b * L + l) * kv + h) * B;
        break;
    case XFER_KV_VLLM_FA:
        *reg = l, *off = h * N * B + b * B;
        break;
    case XFER_KV_FLASHINFER:
        *reg = l, *off = (b * kv + h) * B;
        break;
    case XFER_KV_SGLANG:
        *reg = l * kv + h, *off = b * B;
        break;
    default:
        *reg = l, *off = b * B;
        break;
    }
}

static uint64_t seed_of(const char *node, const char *pool, size_t reg)
{
    uint64_t s = 1469598103934665603ull;
    for (const char *p = node; *p; p++)
        s = (s ^ (uint8_t)*p) * 1099511628211ull;
    for (const char *p = pool; *p; p++)
        s = (s ^ (uint8_t)*p) * 1099511628211ull;
    return mix64(s + reg);
}

struct pool {
    char name[32];
    struct xfer_kv_geom g;
    size_t nr;
    xfer_region *r[MAXR];
    xfer_kv_pool *p;
};

/* Registers pool name with geometry g: its members NAME.i, filled. */
static int make_pool(xfer_node *n, const char *node, const char *name, struct xfer_kv_geom g,
                     struct pool *out)
{
    memset(out, 0, sizeof(*out));
    snprintf(out->name, sizeof(out->name), "%s", name);
    out->g = g;
    out->nr = xfer_kv_geom_regions(&g);
    size_t need = g.layout == XFER_KV_BLOCK_MAJOR                         ? NB * BB * g.kv * LAY
                  : g.layout == XFER_KV_SGLANG || g.layout == XFER_KV_MLA ? NB * BB
                                                                          : NB * BB * g.kv;
    need = need * g.block_bytes / BB;
    for (size_t i = 0; i < out->nr; i++) {
        char rn[64];
        snprintf(rn, sizeof(rn), "%s.%zu", name, i);
        if (xfer_node_region_alloc(n, rn, need, XFER_ACCESS_RW, &out->r[i])) {
            fprintf(stderr, "region %s: %s\n", rn, xfer_node_last_error(n));
            return -1;
        }
        pattern_fill(xfer_region_ptr(out->r[i]), need, seed_of(node, name, i), 0);
    }
    if (xfer_node_pool_register(n, name, &g, out->r, out->nr, &out->p)) {
        fprintf(stderr, "pool %s: %s\n", name, xfer_node_last_error(n));
        return -1;
    }
    return 0;
}

/* The pools both sides register; mismatch variants only on the server. */
static int make_all(xfer_node *n, const char *node, struct pool *pools, bool variants)
{
    for (size_t k = 0; k < NKINDS; k++)
        if (make_pool(n, node, kinds[k].name, geom_of(&kinds[k]), &pools[k]))
            return -1;
    if (!variants)
        return 0;
    static const char *const fields[] = {"dtype",    "block_bytes", "layers", "block_tokens",
                                         "kv_heads", "head_dim",    "shard",  "tag"};
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
        struct xfer_kv_geom g = geom_of(&kinds[1]);
        switch (i) {
        case 0:
            snprintf(g.dtype, sizeof(g.dtype), "fp8");
            break;
        case 1:
            g.block_bytes = 2 * BB;
            break;
        case 2:
            g.layers = LAY + 1;
            break;
        case 3:
            g.block_tokens = 32;
            break;
        case 4:
            g.kv_heads = 4;
            break;
        case 5:
            g.head_dim = 16;
            break;
        case 6:
            g.shard_rank = 1, g.shard_count = 2;
            break;
        default:
            snprintf(g.tag, sizeof(g.tag), "other-model");
            break;
        }
        char name[32];
        struct pool scratch;
        snprintf(name, sizeof(name), "m_%s", fields[i]);
        if (make_pool(n, node, name, g, &scratch))
            return -1;
    }
    return 0;
}

/* ---- models: what every byte of a pool must be ---------------------------------- */

struct model {
    struct xfer_kv_geom g;
    size_t nr;
    uint64_t len;
    uint8_t *b[MAXR];
};

static uint64_t member_len(const struct xfer_kv_geom *g)
{
    uint64_t blk = g->num_blocks * g->block_bytes;
    switch (g->layout) {
    case XFER_KV_BLOCK_MAJOR:
        return blk * g->kv * g->layers;
    case XFER_KV_VLLM_FA:
    case XFER_KV_FLASHINFER:
        return blk * g->kv;
    default:
        return blk;
    }
}

static void model_init(struct model *m, const struct xfer_kv_geom *g, const char *node,
                       const char *pool)
{
    m->g = *g;
    m->nr = xfer_kv_geom_regions(g);
    m->len = member_len(g);
    for (size_t i = 0; i < m->nr; i++) {
        m->b[i] = malloc(m->len);
        pattern_fill(m->b[i], m->len, seed_of(node, pool, i), 0);
    }
}

static void model_free(struct model *m)
{
    for (size_t i = 0; i < m->nr; i++)
        free(m->b[i]);
}

/* dst's blocks db[i] <- src's blocks sb[i], layers [l0, l0 + nl). */
static void model_copy(struct model *dst, const uint64_t *db, const struct model *src,
                       const uint64_t *sb, size_t n, uint32_t l0, uint32_t nl)
{
    for (size_t i = 0; i < n; i++)
        for (uint32_t l = l0; l < l0 + nl; l++)
            for (uint32_t h = 0; h < dst->g.kv; h++) {
                size_t dr, sr;
                uint64_t doff, soff;
                where(&dst->g, l, h, db[i], &dr, &doff);
                where(&src->g, l, h, sb[i], &sr, &soff);
                memcpy(dst->b[dr] + doff, src->b[sr] + soff, dst->g.block_bytes);
            }
}

static bool model_matches(const struct model *m, const struct pool *p, const char *what)
{
    for (size_t i = 0; i < m->nr; i++) {
        const uint8_t *a = xfer_region_ptr(p->r[i]);
        for (uint64_t o = 0; o < m->len; o++)
            if (a[o] != m->b[i][o]) {
                fprintf(stderr, "  %s: pool %s member %zu byte %llu differs\n", what, p->name, i,
                        (unsigned long long)o);
                return false;
            }
    }
    return true;
}

/* n distinct random block ids below NB. */
static void pick(uint64_t *v, size_t n, uint64_t *rng)
{
    uint64_t all[NB];
    for (uint64_t i = 0; i < NB; i++)
        all[i] = i;
    for (size_t i = 0; i < n; i++) {
        *rng = mix64(*rng + i);
        size_t j = i + *rng % (NB - i);
        uint64_t t = all[i];
        all[i] = all[j];
        all[j] = t;
        v[i] = all[i];
    }
}

/* Segments (block runs) of the last blocks() call's items, all together. */
static size_t last_segments;

/* One block-list op, submitted and waited for; returns its code, and the
 * number of items add_blocks made in *items. */
static int blocks(xfer_node *n, enum xfer_op op, struct pool *lp, const uint64_t *lb,
                  const char *remote, const uint64_t *rb, size_t nb, uint32_t l0, uint32_t nl,
                  int *items, unsigned *tbit)
{
    int err;
    xfer_node_batch *b = xfer_node_batch_new(n, &err);
    if (!b)
        return err;
    int rc = xfer_node_batch_add_blocks(b, op, lp->p, lb, remote, rb, nb, l0, nl);
    if (items)
        *items = rc;
    last_segments = 0;
    for (size_t i = 0; i < xfer_node_batch_count(b); i++)
        last_segments += xfer_node_batch_item_segments(b, i);
    if (rc >= 0 && (rc = xfer_node_batch_submit(b, 10000)) == 0)
        rc = xfer_node_batch_wait(b, -1);
    if (rc == 0 && tbit && xfer_node_batch_count(b))
        *tbit = xfer_node_batch_item_transport(b, 0);
    if (rc < 0)
        fprintf(stderr, "  (%s: %s)\n", remote,
                xfer_node_batch_count(b) ? xfer_node_batch_item_error(b, 0)
                                         : xfer_node_last_error(n));
    xfer_node_batch_free(b);
    return rc;
}

static const char *tname(unsigned t)
{
    static char buf[32];
    buf[0] = 0;
    if (t)
        xfer_transports_format(t, buf, sizeof(buf));
    return buf;
}

/* ---- check ------------------------------------------------------------------------ */

struct opts {
    const char *cmd, *node, *peer, *ready, *transports, *expect;
};

/* Random lists both ways over all layers, then a layer range. */
static void check_kind(xfer_node *n, const struct opts *o, struct pool *lp, uint64_t *rng)
{
    struct model lm, rm;
    model_init(&lm, &lp->g, o->node, lp->name);
    model_init(&rm, &lp->g, o->peer, lp->name);
    char remote[128];
    snprintf(remote, sizeof(remote), "%s/%s", o->peer, lp->name);
    uint64_t lb[24], rb[24];
    unsigned t = 0;
    pick(lb, 24, rng);
    pick(rb, 24, rng);
    CHECK(blocks(n, XFER_OP_READ, lp, lb, remote, rb, 24, 0, 0, NULL, &t) == 0, "%s read",
          lp->name);
    model_copy(&lm, lb, &rm, rb, 24, 0, LAY);
    CHECK(model_matches(&lm, lp, "read"), "%s: read bytes", lp->name);
    if (o->expect)
        CHECK(!strcmp(tname(t), o->expect), "%s moved over %s, expected %s", lp->name, tname(t),
              o->expect);
    pick(lb, 24, rng);
    pick(rb, 24, rng);
    CHECK(blocks(n, XFER_OP_WRITE, lp, lb, remote, rb, 24, 0, 0, NULL, NULL) == 0, "%s write",
          lp->name);
    model_copy(&rm, rb, &lm, lb, 24, 0, LAY);
    /* read every remote block back to check what the write left there */
    uint64_t all[NB], back[NB];
    for (uint64_t i = 0; i < NB; i++)
        all[i] = back[i] = i;
    CHECK(blocks(n, XFER_OP_READ, lp, back, remote, all, NB, 0, 0, NULL, NULL) == 0, "%s read back",
          lp->name);
    model_copy(&lm, back, &rm, all, NB, 0, LAY);
    CHECK(model_matches(&lm, lp, "write, read back"), "%s: written bytes", lp->name);
    /* layer ranges: local differs from remote again, then layers 1-2 of
     * some blocks are read and layer 3 of others written */
    for (size_t i = 0; i < lm.nr; i++) {
        pattern_fill(lm.b[i], lm.len, 777 + i, 0);
        memcpy(xfer_region_ptr(lp->r[i]), lm.b[i], lm.len);
    }
    pick(lb, 16, rng);
    pick(rb, 16, rng);
    CHECK(blocks(n, XFER_OP_READ, lp, lb, remote, rb, 16, 1, 2, NULL, NULL) == 0,
          "%s layer-range read", lp->name);
    model_copy(&lm, lb, &rm, rb, 16, 1, 2);
    CHECK(model_matches(&lm, lp, "layer-range read"), "%s: layer-range read bytes", lp->name);
    pick(lb, 16, rng);
    pick(rb, 16, rng);
    CHECK(blocks(n, XFER_OP_WRITE, lp, lb, remote, rb, 16, LAY - 1, 1, NULL, NULL) == 0,
          "%s layer-range write", lp->name);
    model_copy(&rm, rb, &lm, lb, 16, LAY - 1, 1);
    CHECK(blocks(n, XFER_OP_READ, lp, back, remote, all, NB, 0, 0, NULL, NULL) == 0, "%s read back",
          lp->name);
    model_copy(&lm, back, &rm, all, NB, 0, LAY);
    CHECK(model_matches(&lm, lp, "layer-range write"), "%s: layer-range write bytes", lp->name);
    printf("%s: %s random blocks both ways, a layer range: %s\n", lp->name,
           xfer_kv_layout_name(lp->g.layout), failures ? "FAILED" : "ok");
    model_free(&lm);
    model_free(&rm);
}

/* vLLM FlashAttention pool fed from a FlashInfer one; run coalescing. */
static void check_mixed(xfer_node *n, const struct opts *o, struct pool *fa, struct pool *fi,
                        struct pool *bm, uint64_t *rng)
{
    struct model lm, rm;
    model_init(&lm, &fa->g, "mixed", fa->name);
    for (size_t i = 0; i < lm.nr; i++)
        memcpy(xfer_region_ptr(fa->r[i]), lm.b[i], lm.len);
    /* what the peer's fi holds now is not known here (check_kind wrote
     * into it): read it whole into our fi first, then use our copy */
    uint64_t all[NB], lb[20], rb[20];
    for (uint64_t i = 0; i < NB; i++)
        all[i] = i;
    char remote[128];
    snprintf(remote, sizeof(remote), "%s/fi", o->peer);
    CHECK(blocks(n, XFER_OP_READ, fi, all, remote, all, NB, 0, 0, NULL, NULL) == 0, "fi whole");
    rm.g = fi->g;
    rm.nr = fi->nr;
    rm.len = member_len(&fi->g);
    for (size_t i = 0; i < rm.nr; i++)
        rm.b[i] = xfer_region_ptr(fi->r[i]); /* borrowed */
    pick(lb, 20, rng);
    pick(rb, 20, rng);
    CHECK(blocks(n, XFER_OP_READ, fa, lb, remote, rb, 20, 0, 0, NULL, NULL) == 0, "fa <- fi");
    model_copy(&lm, lb, &rm, rb, 20, 0, LAY);
    CHECK(model_matches(&lm, fa, "fa <- fi"), "vLLM pool fed from a FlashInfer pool");
    model_free(&lm);
    /* one vectored item per pair of regions; runs consecutive on both
     * sides: one segment per stream */
    uint64_t l3[] = {7, 8, 9}, r3[] = {40, 41, 42};
    int items = 0;
    snprintf(remote, sizeof(remote), "%s/fa", o->peer);
    CHECK(blocks(n, XFER_OP_READ, fa, l3, remote, r3, 3, 0, 0, &items, NULL) == 0 && items == LAY &&
              last_segments == LAY * 2,
          "fa 7,8,9 -> 40,41,42: %d items of %zu segments, want %d of %d", items, last_segments,
          LAY, LAY * 2);
    snprintf(remote, sizeof(remote), "%s/fi", o->peer);
    CHECK(blocks(n, XFER_OP_READ, fi, l3, remote, r3, 3, 0, 0, &items, NULL) == 0 && items == LAY &&
              last_segments == LAY,
          "fi 7,8,9 -> 40,41,42: %d items of %zu segments, want %d of %d (K and V adjacent)", items,
          last_segments, LAY, LAY);
    snprintf(remote, sizeof(remote), "%s/bm", o->peer);
    CHECK(blocks(n, XFER_OP_READ, bm, l3, remote, r3, 3, 0, 0, &items, NULL) == 0 && items == 1 &&
              last_segments == 1,
          "bm 7,8,9 -> 40,41,42: %d items of %zu segments, want 1 of 1", items, last_segments);
    uint64_t l3b[] = {7, 19, 3};
    CHECK(blocks(n, XFER_OP_READ, bm, l3b, remote, r3, 3, 0, 0, &items, NULL) == 0 && items == 1 &&
              last_segments == 3,
          "bm 7,19,3 -> 40,41,42: %d items of %zu segments, want 1 of 3", items, last_segments);
    printf("mixed layouts and coalescing: %s\n", failures ? "FAILED" : "ok");
}

static void check_refusals(xfer_node *n, const struct opts *o, struct pool *fa)
{
    static const char *const fields[] = {"dtype",    "block_bytes", "layers", "block_tokens",
                                         "kv_heads", "head_dim",    "shard",  "tag"};
    uint64_t lb[] = {1, 2}, rb[] = {3, 4};
    char remote[128];
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
        snprintf(remote, sizeof(remote), "%s/m_%s", o->peer, fields[i]);
        int rc = blocks(n, XFER_OP_READ, fa, lb, remote, rb, 2, 0, 0, NULL, NULL);
        const char *why = xfer_node_last_error(n);
        CHECK(rc == -XFER_EMISMATCH, "m_%s: %d", fields[i], rc);
        CHECK(strstr(why, fields[i]) != NULL, "m_%s: reason '%s' does not name the field",
              fields[i], why);
    }
    snprintf(remote, sizeof(remote), "%s/fa", o->peer);
    uint64_t past[] = {1, NB};
    CHECK(blocks(n, XFER_OP_READ, fa, lb, remote, past, 2, 0, 0, NULL, NULL) == -XFER_ERANGE,
          "remote block past the pool");
    CHECK(strstr(xfer_node_last_error(n), "64"), "reason names the block: %s",
          xfer_node_last_error(n));
    CHECK(blocks(n, XFER_OP_READ, fa, past, remote, rb, 2, 0, 0, NULL, NULL) == -XFER_ERANGE,
          "local block past the pool");
    CHECK(blocks(n, XFER_OP_READ, fa, lb, remote, rb, 2, LAY - 1, 2, NULL, NULL) == -XFER_ERANGE,
          "layer range past the pool");
    snprintf(remote, sizeof(remote), "%s/nosuch", o->peer);
    CHECK(blocks(n, XFER_OP_READ, fa, lb, remote, rb, 2, 0, 0, NULL, NULL) == -XFER_ENOENT,
          "unknown pool");
    struct xfer_kv_pool_desc *v = NULL;
    size_t k = 0;
    CHECK(xfer_node_pool_list(n, o->peer, &v, &k) == 0 && k == NKINDS + 8, "list: %zu pools", k);
    for (size_t i = 0; i < k; i++)
        xfer_kv_pool_desc_clear(&v[i]);
    free(v);
    printf("refusals: %s\n", failures ? "FAILED" : "ok");
}

int main(int argc, char **argv)
{
    static const struct option lo[] = {
        {"node", 1, 0, 'n'},       {"peer", 1, 0, 'p'},   {"ready", 1, 0, 'r'},
        {"transports", 1, 0, 't'}, {"expect", 1, 0, 'e'}, {0, 0, 0, 0},
    };
    struct opts o = {.transports = "tcp"};
    if (argc < 2)
        return 2;
    o.cmd = argv[1];
    optind = 2;
    int c;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        if (c == 'n')
            o.node = optarg;
        else if (c == 'p')
            o.peer = optarg;
        else if (c == 'r')
            o.ready = optarg;
        else if (c == 't')
            o.transports = optarg;
        else if (c == 'e')
            o.expect = optarg;
        else
            return 2;
    }
    catch_stop_signals();
    bool serve = !strcmp(o.cmd, "serve");
    if (!o.node || (!serve && (strcmp(o.cmd, "check") || !o.peer)))
        return 2;
    xfer_node *n = node_from_env(o.node, o.transports, NULL);
    static struct pool pools[NKINDS];
    if (!n || make_all(n, o.node, pools, serve))
        return 1;
    if (serve) {
        FILE *f = o.ready ? fopen(o.ready, "w") : NULL;
        if (f)
            fclose(f);
        while (!stop)
            pause();
    } else {
        uint64_t rng = 12345;
        for (size_t k = 0; k < NKINDS; k++)
            check_kind(n, &o, &pools[k], &rng);
        check_mixed(n, &o, &pools[1], &pools[2], &pools[0], &rng);
        check_refusals(n, &o, &pools[1]);
    }
    xfer_node_free(n);
    if (!serve)
        printf("pools: %s\n", failures ? "FAILED" : "ok");
    return failures ? 1 : 0;
}
