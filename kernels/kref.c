/* CPU reference for the GPU kernels, and the layout checks both share. */
#include "xfer_kernels.h"

#include "xfer_err.h"

#include <string.h>

static uint64_t kv_block_stride(const struct xfer_kv_layout *lay)
{
    return lay->block_stride ? lay->block_stride : lay->block_bytes;
}

static uint64_t kv_layer_stride(const struct xfer_kv_layout *lay)
{
    return lay->layer_stride ? lay->layer_stride : lay->num_blocks * kv_block_stride(lay);
}

int xfer_kv_check(const struct xfer_kv_layout *lay, const uint64_t *ids, size_t n_ids)
{
    if (!lay || (n_ids && !ids) || !lay->num_layers || !lay->block_bytes || !lay->num_blocks)
        return -XFER_EINVAL;
    if (kv_block_stride(lay) < lay->block_bytes)
        return -XFER_EINVAL;
    if (!lay->layer_base && !lay->base)
        return -XFER_EINVAL;
    if (!lay->layer_base && lay->layer_stride &&
        lay->layer_stride < lay->num_blocks * kv_block_stride(lay))
        return -XFER_EINVAL;
    for (uint32_t l = 0; lay->layer_base && l < lay->num_layers; l++)
        if (!lay->layer_base[l])
            return -XFER_EINVAL;
    for (size_t i = 0; i < n_ids; i++)
        if (ids[i] >= lay->num_blocks)
            return -XFER_ERANGE;
    return 0;
}

char *xfer_kv_block_addr(const struct xfer_kv_layout *lay, uint32_t l, uint64_t id)
{
    char *layer = lay->layer_base ? (char *)lay->layer_base[l]
                                  : (char *)lay->base + (uint64_t)l * kv_layer_stride(lay);
    return layer + id * kv_block_stride(lay);
}

uint64_t xfer_copy_runs_fill(const struct xfer_copy_run *r, size_t nr, struct xfer_copy_desc *d,
                             uint64_t *start, uint64_t *mis)
{
    uint64_t acc = 0, m = 0;
    for (size_t x = 0; x < nr; x++) {
        /* the direction picks the bases once per run, not per segment */
        char *dst = r[x].a_is_dst ? r[x].a : r[x].b, *src = r[x].a_is_dst ? r[x].b : r[x].a;
        int dk = r[x].a_is_dst ? 0 : 1; /* which offset of a segment is dst's */
        const uint64_t *s = r[x].segs;
        for (size_t k = 0; k < r[x].n; k++, s += 3, d++, start++) {
            d->dst = dst + s[dk];
            d->src = src + s[1 - dk];
            d->len = s[2];
            *start = acc;
            acc += s[2];
            m |= (uintptr_t)d->dst ^ (uintptr_t)d->src;
        }
    }
    *start = acc;
    *mis = m;
    return acc;
}

void xfer_kref_batched_copy(const struct xfer_copy_desc *d, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (d[i].len)
            memcpy(d[i].dst, d[i].src, d[i].len);
}

static int kref_kv(const struct xfer_kv_layout *lay, const uint64_t *ids, size_t n_ids, char *buf,
                   int scatter)
{
    int rc = xfer_kv_check(lay, ids, n_ids);
    if (rc)
        return rc;
    if (n_ids && !buf)
        return -XFER_EINVAL;
    for (uint32_t l = 0; l < lay->num_layers; l++)
        for (size_t i = 0; i < n_ids; i++) {
            char *blk = xfer_kv_block_addr(lay, l, ids[i]);
            char *b = buf + ((uint64_t)l * n_ids + i) * lay->block_bytes;
            if (scatter)
                memcpy(blk, b, lay->block_bytes);
            else
                memcpy(b, blk, lay->block_bytes);
        }
    return 0;
}

int xfer_kref_kv_gather(const struct xfer_kv_layout *lay, const uint64_t *ids, size_t n_ids,
                        void *buf)
{
    return kref_kv(lay, ids, n_ids, buf, 0);
}

int xfer_kref_kv_scatter(const struct xfer_kv_layout *lay, const uint64_t *ids, size_t n_ids,
                         const void *buf)
{
    return kref_kv(lay, ids, n_ids, (char *)buf, 1);
}

int xfer_block_runs_check(const struct xfer_block_run *r, size_t nr, uint64_t *total, size_t *bad)
{
    uint64_t sum = 0;
    for (size_t x = 0; x < nr; x++) {
        const struct xfer_block_run *q = &r[x];
        uint64_t n = (uint64_t)q->s1 - q->s0;
        *bad = x;
        if (!q->a || !q->b || !q->a_base || !q->b_base || !q->a_ids || !q->b_ids || !q->len ||
            !q->nids || q->s0 >= q->s1 || q->s1 > (uint64_t)q->nstreams * q->nids ||
            q->len > (UINT64_MAX - sum) / n)
            return -XFER_EINVAL;
        sum += n * q->len;
    }
    *total = sum;
    return 0;
}

/* Address of segment k's bytes on one side. */
static char *blk_addr(char *base, const uint64_t *sb, const uint64_t *ids, uint64_t stride,
                      uint32_t nids, uint64_t k)
{
    return base + sb[k / nids] + ids[k % nids] * stride;
}

int xfer_kref_block_runs(const struct xfer_block_run *r, size_t nr)
{
    uint64_t total;
    size_t bad;
    int rc = xfer_block_runs_check(r, nr, &total, &bad);
    for (size_t x = 0; rc == 0 && x < nr; x++) {
        const struct xfer_block_run *q = &r[x];
        for (uint64_t k = q->s0; k < q->s1; k++) {
            char *a = blk_addr(q->a, q->a_base, q->a_ids, q->a_stride, q->nids, k);
            char *b = blk_addr(q->b, q->b_base, q->b_ids, q->b_stride, q->nids, k);
            memcpy(q->a_is_dst ? a : b, q->a_is_dst ? b : a, q->len);
        }
    }
    return rc;
}
