/* A pool's geometry and member list as registry fields, and back. */
#include "node_pool.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const num_field[8] = {"block_bytes",  "num_blocks", "layers",   "kv",
                                         "block_tokens", "kv_heads",   "head_dim", "nregions"};

int kv_fields_make(struct kv_fields *kf, const struct xfer_kv_geom *g, const char *const *names,
                   size_t n)
{
    memset(kf, 0, sizeof(*kf));
    uint64_t v[8] = {g->block_bytes,  g->num_blocks, g->layers,   g->kv,
                     g->block_tokens, g->kv_heads,   g->head_dim, n};
    size_t k = 0;
    kf->f[k++] = (struct xfer_registry_field){"layout", xfer_kv_layout_name(g->layout)};
    kf->f[k++] = (struct xfer_registry_field){"dtype", g->dtype};
    for (int i = 0; i < 8; i++) {
        snprintf(kf->num[i], sizeof(kf->num[i]), "%llu", (unsigned long long)v[i]);
        kf->f[k++] = (struct xfer_registry_field){num_field[i], kf->num[i]};
    }
    snprintf(kf->shard, sizeof(kf->shard), "%u/%u", g->shard_rank,
             g->shard_count ? g->shard_count : 1);
    kf->f[k++] = (struct xfer_registry_field){"shard", kf->shard};
    size_t len = 1;
    for (size_t i = 0; i < n; i++)
        len += strlen(names[i]) + 1;
    if (!(kf->regions = malloc(len)))
        return -XFER_ENOMEM;
    char *p = kf->regions;
    *p = '\0';
    for (size_t i = 0; i < n; i++)
        p += sprintf(p, "%s%s", i ? "," : "", names[i]);
    kf->f[k++] = (struct xfer_registry_field){"regions", kf->regions};
    kf->f[k++] = (struct xfer_registry_field){"tag", g->tag};
    return k == KV_FIELDS ? 0 : -XFER_EINVAL;
}

void kv_fields_free(struct kv_fields *kf)
{
    free(kf->regions);
    kf->regions = NULL;
}

static int parse_u64(const char *s, uint64_t max, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || *s == '-' || v > max)
        return -1;
    *out = v;
    return 0;
}

static int split_regions(struct xfer_kv_pool_desc *d, const char *v)
{
    size_t n = *v ? 1 : 0;
    for (const char *p = v; *p; p++)
        n += *p == ',';
    free(d->regions);
    d->regions = n ? calloc(n, sizeof(*d->regions)) : NULL;
    if (n && !d->regions)
        return -1;
    for (size_t i = 0; i < n; i++) {
        size_t len = strcspn(v, ",");
        if (!len || len >= XFER_NAME_MAX)
            return -1;
        memcpy(d->regions[i], v, len);
        v += len + (v[len] == ',');
    }
    d->nregions = n;
    return 0;
}

void kv_desc_field(const char *f, const char *v, void *arg)
{
    struct kv_parse *kp = arg;
    struct xfer_kv_geom *g = &kp->d->geom;
    uint64_t u = 0;
    int bad = 0;
    if (!strcmp(f, "layout")) {
        bad = xfer_kv_layout_parse(v, &g->layout);
    } else if (!strcmp(f, "dtype") || !strcmp(f, "tag")) {
        char *dst = f[0] == 'd' ? g->dtype : g->tag;
        size_t cap = f[0] == 'd' ? sizeof(g->dtype) : sizeof(g->tag);
        if (!(bad = strlen(v) >= cap))
            strcpy(dst, v);
    } else if (!strcmp(f, "shard")) {
        bad = sscanf(v, "%u/%u", &g->shard_rank, &g->shard_count) != 2;
    } else if (!strcmp(f, "regions")) {
        bad = split_regions(kp->d, v);
    } else if (!strcmp(f, "block_bytes") || !strcmp(f, "num_blocks")) {
        if (!(bad = parse_u64(v, UINT64_MAX, &u)))
            *(f[0] == 'b' ? &g->block_bytes : &g->num_blocks) = u;
    } else {
        uint32_t *dst = !strcmp(f, "layers")         ? &g->layers
                        : !strcmp(f, "kv")           ? &g->kv
                        : !strcmp(f, "block_tokens") ? &g->block_tokens
                        : !strcmp(f, "kv_heads")     ? &g->kv_heads
                        : !strcmp(f, "head_dim")     ? &g->head_dim
                                                     : NULL;
        if (dst && !(bad = parse_u64(v, UINT32_MAX, &u)))
            *dst = (uint32_t)u;
    }
    if (bad && !kp->bad[0])
        snprintf(kp->bad, sizeof(kp->bad), "field %s = '%.40s'", f, v);
}

int kv_desc_finish(struct kv_parse *kp)
{
    char why[160];
    struct xfer_kv_pool_desc *d = kp->d;
    if (kp->bad[0])
        return node_err(-XFER_EPROTO, "pool %s/%s: bad %s", d->node, d->name, kp->bad);
    if (kv_geom_check(&d->geom, why, sizeof(why)))
        return node_err(-XFER_EPROTO, "pool %s/%s: %s", d->node, d->name, why);
    if (d->nregions != xfer_kv_geom_regions(&d->geom))
        return node_err(-XFER_EPROTO, "pool %s/%s: %zu member regions, its layout has %zu", d->node,
                        d->name, d->nregions, xfer_kv_geom_regions(&d->geom));
    return 0;
}

void xfer_kv_pool_desc_clear(struct xfer_kv_pool_desc *d)
{
    if (!d)
        return;
    free(d->regions);
    d->regions = NULL;
    d->nregions = 0;
}
