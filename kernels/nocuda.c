/* Builds without CUDA: every GPU entry point reports "no CUDA device". */
#include "xfer_kernels.h"

#include "xfer_err.h"

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

int xfer_kernels_batched_copy_runs(struct xfer_kstage *s, const struct xfer_copy_run *r, size_t nr,
                                   uint64_t total, void *stream)
{
    (void)s, (void)r, (void)nr, (void)total, (void)stream;
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

int xfer_kernels_preload(int device)
{
    (void)device;
    return -XFER_ENODEV;
}

void xfer_kernels_tune_upload(int mode)
{
    (void)mode;
}

void xfer_kernels_tune(uint64_t chunk_bytes, unsigned threads, int variant)
{
    (void)chunk_bytes, (void)threads, (void)variant;
}

int xfer_kbatch_new(struct xfer_kbatch **out)
{
    if (out)
        *out = NULL;
    return -XFER_ENODEV;
}

void xfer_kbatch_free(struct xfer_kbatch *b)
{
    (void)b;
}

int xfer_kbatch_start(struct xfer_kbatch *b, int exec, uint64_t peer_mask,
                      const struct xfer_copy_desc *d, size_t n)
{
    (void)b, (void)exec, (void)peer_mask, (void)d, (void)n;
    return -XFER_ENODEV;
}

int xfer_kbatch_start_runs(struct xfer_kbatch *b, int exec, uint64_t peer_mask,
                           const struct xfer_copy_run *r, size_t nr, uint64_t total)
{
    (void)b, (void)exec, (void)peer_mask, (void)r, (void)nr, (void)total;
    return -XFER_ENODEV;
}

int xfer_kbatch_start_copies(struct xfer_kbatch *b, int exec, uint64_t peer_mask,
                             const struct xfer_copy_run *r, size_t nr, uint64_t total,
                             const struct xfer_copy_desc *ce, size_t nce)
{
    (void)b, (void)exec, (void)peer_mask, (void)r, (void)nr, (void)total, (void)ce, (void)nce;
    return -XFER_ENODEV;
}

int xfer_kbatch_start_blocks(struct xfer_kbatch *b, int exec, uint64_t peer_mask,
                             const struct xfer_block_run *r, size_t nr)
{
    (void)b, (void)exec, (void)peer_mask, (void)r, (void)nr;
    return -XFER_ENODEV;
}

int xfer_kbatch_poll(struct xfer_kbatch *b, int ticket)
{
    (void)b, (void)ticket;
    return -XFER_ENODEV;
}

double xfer_kbatch_gpu_us(const struct xfer_kbatch *b, int ticket)
{
    (void)b, (void)ticket;
    return -1;
}

int xfer_kbatch_wait(struct xfer_kbatch *b, int ticket, int timeout_ms)
{
    (void)b, (void)ticket, (void)timeout_ms;
    return -XFER_ENODEV;
}

const char *xfer_kbatch_last_error(const struct xfer_kbatch *b)
{
    (void)b;
    return "built without CUDA";
}

int xfer_kernels_block_runs(struct xfer_kstage *s, const struct xfer_block_run *r, size_t nr,
                            void *stream)
{
    (void)s, (void)r, (void)nr, (void)stream;
    return -XFER_ENODEV;
}
