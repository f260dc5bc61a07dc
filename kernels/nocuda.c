/* Builds without CUDA: every GPU entry point reports "no CUDA device". */
#include "xfer_kernels.h"

#include "xfer.h"

#include <stddef.h>

int xfer_kernels_probe(int *count)
{
    if (count)
        *count = 0;
    return -XFER_ENODEV;
}

int xfer_kstage_new(int device, struct xfer_kstage **out)
{
    (void)device;
    if (out)
        *out = NULL;
    return -XFER_ENODEV;
}

void xfer_kstage_free(struct xfer_kstage *s)
{
    (void)s;
}

const char *xfer_kstage_last_error(const struct xfer_kstage *s)
{
    (void)s;
    return "built without CUDA";
}

int xfer_kernels_batched_copy(struct xfer_kstage *s, const struct xfer_copy_desc *d, size_t n,
                              void *stream)
{
    (void)s, (void)d, (void)n, (void)stream;
    return -XFER_ENODEV;
}

int xfer_kernels_kv_gather(struct xfer_kstage *s, const struct xfer_kv_layout *lay,
                           const uint64_t *ids, size_t n_ids, void *buf, void *stream)
{
    (void)s, (void)lay, (void)ids, (void)n_ids, (void)buf, (void)stream;
    return -XFER_ENODEV;
}

int xfer_kernels_kv_scatter(struct xfer_kstage *s, const struct xfer_kv_layout *lay,
                            const uint64_t *ids, size_t n_ids, const void *buf, void *stream)
{
    (void)s, (void)lay, (void)ids, (void)n_ids, (void)buf, (void)stream;
    return -XFER_ENODEV;
}

void xfer_kernels_tune(uint64_t chunk_bytes, unsigned threads, int variant)
{
    (void)chunk_bytes, (void)threads, (void)variant;
}
