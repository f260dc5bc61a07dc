/* KV pool geometry: the five layouts, where a block lives, compatibility. */
#include "node_pool.h"

#include <stdio.h>
#include <string.h>

static const char *const layout_names[] = {"block_major", "vllm_fa", "flashinfer", "sglang", "mla"};
#define N_LAYOUTS (sizeof(layout_names) / sizeof(layout_names[0]))

const char *xfer_kv_layout_name(enum xfer_kv_layout l)
{
    return (unsigned)l < N_LAYOUTS ? layout_names[l] : "?";
}

int xfer_kv_layout_parse(const char *s, enum xfer_kv_layout *out)
{
    for (size_t i = 0; s && i < N_LAYOUTS; i++)
        if (!strcmp(s, layout_names[i])) {
            *out = (enum xfer_kv_layout)i;
            return 0;
        }
    return -XFER_EINVAL;
}

static uint32_t shards(const struct xfer_kv_geom *g)
{
    return g->shard_count ? g->shard_count : 1;
}

int kv_geom_check(const struct xfer_kv_geom *g, char *why, size_t wl)
{
    const char *bad = NULL;
    if (!g)
        bad = "no geometry";
    else if ((unsigned)g->layout >= N_LAYOUTS)
        bad = "layout: unknown";
    else if (!g->block_bytes)
        bad = "block_bytes: 0";
    else if (!g->num_blocks)
        bad = "num_blocks: 0";
    else if (!g->layers)
        bad = "layers: 0";
    else if (g->kv != 1 && g->kv != 2)
        bad = "kv: must be 1 or 2";
    else if (g->layout == XFER_KV_MLA && g->kv != 1)
        bad = "kv: an MLA pool has one latent tensor per layer (kv = 1)";
    else if (g->shard_rank >= shards(g))
        bad = "shard: rank not below the shard count";
    else if (!memchr(g->dtype, 0, sizeof(g->dtype)) || !memchr(g->tag, 0, sizeof(g->tag)))
        bad = "dtype or tag: not terminated";
    else if (strchr(g->dtype, ',') || g->layers > 65536)
        bad = "dtype or layers: out of range";
    else {
        /* every offset of the largest member must fit in 64 bits */
        uint64_t per = g->block_bytes * g->kv, t = g->num_blocks;
        if (g->block_bytes > UINT64_MAX / g->kv || t > UINT64_MAX / per ||
            (g->layout == XFER_KV_BLOCK_MAJOR && t * per > UINT64_MAX / g->layers))
            bad = "num_blocks x block_bytes: too large";
    }
    if (bad && why && wl)
        snprintf(why, wl, "%s", bad);
    return bad ? -XFER_EINVAL : 0;
}

size_t xfer_kv_geom_regions(const struct xfer_kv_geom *g)
{
    if (kv_geom_check(g, NULL, 0))
        return 0;
    switch (g->layout) {
    case XFER_KV_BLOCK_MAJOR:
        return 1;
    case XFER_KV_SGLANG:
        return (size_t)g->kv * g->layers;
    default:
        return g->layers;
    }
}

uint64_t kv_region_need(const struct xfer_kv_geom *g, size_t idx)
{
    (void)idx; /* every member of a layout has the same size */
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

int xfer_kv_geom_parse(const char *spec, struct xfer_kv_geom *g, char *why, size_t wl)
{
    char buf[256], *save = NULL, *f[8] = {0};
    if (!spec || !g || strlen(spec) >= sizeof(buf))
        goto bad;
    strcpy(buf, spec);
    for (int i = 0; i < 8; i++)
        f[i] = strtok_r(i ? NULL : buf, ":", &save);
    memset(g, 0, sizeof(*g));
    uint64_t layers, kv = 2;
    if (!f[4] || f[7] || xfer_kv_layout_parse(f[0], &g->layout) ||
        strlen(f[1]) >= sizeof(g->dtype) || xfer_node_parse_size(f[2], &g->block_bytes) ||
        xfer_node_parse_size(f[3], &g->num_blocks) || xfer_node_parse_size(f[4], &layers) ||
        layers > UINT32_MAX || (f[5] && xfer_node_parse_size(f[5], &kv)) || kv > 2 ||
        (f[6] && strlen(f[6]) >= sizeof(g->tag)))
        goto bad;
    strcpy(g->dtype, f[1]);
    if (f[6])
        strcpy(g->tag, f[6]);
    g->layers = (uint32_t)layers;
    g->kv = g->layout == XFER_KV_MLA && !f[5] ? 1 : (uint32_t)kv;
    g->shard_count = 1;
    return kv_geom_check(g, why, wl);
bad:
    if (why && wl)
        snprintf(
            why, wl,
            "bad pool geometry '%s' (want LAYOUT:DTYPE:BLOCK_BYTES:NUM_BLOCKS:LAYERS[:KV[:TAG]], "
            "LAYOUT one of block_major, vllm_fa, flashinfer, sglang, mla)",
            spec ? spec : "");
    return -XFER_EINVAL;
}

int xfer_kv_geom_check(const struct xfer_kv_geom *g, char *why, size_t why_len)
{
    return kv_geom_check(g, why, why_len);
}

uint64_t xfer_kv_geom_region_bytes(const struct xfer_kv_geom *g)
{
    return g && kv_geom_check(g, NULL, 0) == 0 ? kv_region_need(g, 0) : 0; /* no overflow */
}

void kv_stream_of(const struct xfer_kv_geom *g, uint32_t l, uint32_t h, struct kv_stream *s)
{
    uint64_t B = g->block_bytes, N = g->num_blocks, kv = g->kv;
    switch (g->layout) {
    case XFER_KV_BLOCK_MAJOR:
        *s = (struct kv_stream){0, ((uint64_t)l * kv + h) * B, (uint64_t)g->layers * kv * B};
        break;
    case XFER_KV_VLLM_FA:
        *s = (struct kv_stream){l, h * N * B, B};
        break;
    case XFER_KV_FLASHINFER:
        *s = (struct kv_stream){l, h * B, kv * B};
        break;
    case XFER_KV_SGLANG:
        *s = (struct kv_stream){l * g->kv + h, 0, B};
        break;
    default: /* MLA */
        *s = (struct kv_stream){l, 0, B};
        break;
    }
}

void kv_locate(const struct xfer_kv_geom *g, size_t region, uint64_t off, struct kv_loc *out)
{
    uint64_t B = g->block_bytes, N = g->num_blocks, kv = g->kv, u = off / B;
    switch (g->layout) {
    case XFER_KV_BLOCK_MAJOR:
        *out = (struct kv_loc){(uint32_t)(u / kv % g->layers), (uint32_t)(u % kv),
                               u / kv / g->layers, (uint64_t)g->layers * kv * B};
        break;
    case XFER_KV_VLLM_FA:
        *out = (struct kv_loc){(uint32_t)region, (uint32_t)(off / (N * B)), off % (N * B) / B, B};
        break;
    case XFER_KV_FLASHINFER:
        *out = (struct kv_loc){(uint32_t)region, (uint32_t)(u % kv), u / kv, kv * B};
        break;
    case XFER_KV_SGLANG:
        *out = (struct kv_loc){(uint32_t)(region / kv), (uint32_t)(region % kv), u, B};
        break;
    default: /* MLA */
        *out = (struct kv_loc){(uint32_t)region, 0, u, B};
        break;
    }
}

bool kv_halves_adjacent(const struct xfer_kv_geom *g)
{
    return g->kv == 1 || g->layout == XFER_KV_FLASHINFER || g->layout == XFER_KV_BLOCK_MAJOR;
}

static int differ(char *why, size_t wl, const char *field, const char *a, const char *b)
{
    if (why && wl)
        snprintf(why, wl, "%s: %s vs %s", field, a, b);
    return -XFER_EMISMATCH;
}

static int differ_u(char *why, size_t wl, const char *field, uint64_t a, uint64_t b)
{
    char x[24], y[24];
    snprintf(x, sizeof(x), "%llu", (unsigned long long)a);
    snprintf(y, sizeof(y), "%llu", (unsigned long long)b);
    return differ(why, wl, field, x, y);
}

int xfer_kv_geom_match(const struct xfer_kv_geom *a, const struct xfer_kv_geom *b, char *why,
                       size_t wl)
{
    if (kv_geom_check(a, why, wl) || kv_geom_check(b, why, wl))
        return -XFER_EINVAL;
    if (strcmp(a->dtype, b->dtype))
        return differ(why, wl, "dtype", a->dtype, b->dtype);
    if (a->block_bytes != b->block_bytes)
        return differ_u(why, wl, "block_bytes", a->block_bytes, b->block_bytes);
    if (a->layers != b->layers)
        return differ_u(why, wl, "layers", a->layers, b->layers);
    if (a->kv != b->kv)
        return differ_u(why, wl, "kv", a->kv, b->kv);
    if (a->block_tokens && b->block_tokens && a->block_tokens != b->block_tokens)
        return differ_u(why, wl, "block_tokens", a->block_tokens, b->block_tokens);
    if (a->kv_heads && b->kv_heads && a->kv_heads != b->kv_heads)
        return differ_u(why, wl, "kv_heads", a->kv_heads, b->kv_heads);
    if (a->head_dim && b->head_dim && a->head_dim != b->head_dim)
        return differ_u(why, wl, "head_dim", a->head_dim, b->head_dim);
    if (a->shard_rank != b->shard_rank || shards(a) != shards(b)) {
        char x[24], y[24];
        snprintf(x, sizeof(x), "%u/%u", a->shard_rank, shards(a));
        snprintf(y, sizeof(y), "%u/%u", b->shard_rank, shards(b));
        return differ(why, wl, "shard", x, y);
    }
    if (strcmp(a->tag, b->tag))
        return differ(why, wl, "tag", a->tag[0] ? a->tag : "(none)", b->tag[0] ? b->tag : "(none)");
    return 0;
}
