/* Builds without CUDA: no unpacker (-XFER_ENODEV); plugin memory is host
 * memory, so the pointer helpers are trivial. */
#include "xfer_err.h"
#include "xfer_kernels.h"

#include <string.h>

int xfer_kernels_ptr_device(const void *p)
{
    (void)p;
    return -1;
}

void *xfer_kernels_host_ptr(void *p)
{
    return p;
}

int xfer_kernels_copy(void *dst, const void *src, size_t len)
{
    memcpy(dst, src, len);
    return 0;
}

int xfer_unpacker_new(int device, struct xfer_unpacker **out)
{
    (void)device;
    *out = NULL;
    return -XFER_ENODEV;
}

void xfer_unpacker_free(struct xfer_unpacker *u)
{
    (void)u;
}

int xfer_unpacker_start(struct xfer_unpacker *u, enum xfer_unpack_method m, void *dst,
                        const void *bounce, const struct xfer_unpack_frag *f, size_t n)
{
    (void)u, (void)m, (void)dst, (void)bounce, (void)f, (void)n;
    return -XFER_ENODEV;
}

int xfer_unpacker_poll(struct xfer_unpacker *u)
{
    (void)u;
    return -XFER_ENODEV;
}

int xfer_unpacker_wait(struct xfer_unpacker *u, int timeout_ms)
{
    (void)u, (void)timeout_ms;
    return -XFER_ENODEV;
}

enum xfer_unpack_method xfer_unpacker_method(const struct xfer_unpacker *u)
{
    (void)u;
    return XFER_UNPACK_HOST;
}

uint64_t xfer_unpacker_launches(const struct xfer_unpacker *u)
{
    (void)u;
    return 0;
}

uint64_t xfer_unpacker_copies(const struct xfer_unpacker *u)
{
    (void)u;
    return 0;
}

const char *xfer_unpacker_last_error(const struct xfer_unpacker *u)
{
    (void)u;
    return "built without CUDA";
}
