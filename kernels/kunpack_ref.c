/* TCPX unpack: the checks every method shares, the CPU reference, and the
 * method names. Always built (no CUDA needed). */
#include "xfer_err.h"
#include "xfer_kernels.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(sizeof(struct xfer_unpack_frag) == 16, "NCCL's loadMeta is 16 bytes");

static const char *const method_names[] = {"kernel", "d2d", "host"};

int xfer_unpack_method_parse(const char *s, enum xfer_unpack_method *m)
{
    for (int i = 0; s && i < 3; i++)
        if (!strcmp(s, method_names[i])) {
            *m = (enum xfer_unpack_method)i;
            return 0;
        }
    return -XFER_EINVAL;
}

const char *xfer_unpack_method_name(enum xfer_unpack_method m)
{
    return (unsigned)m < 3 ? method_names[m] : "?";
}

void xfer_kref_unpack(void *dst, const void *bounce, const struct xfer_unpack_frag *f, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (f[i].len)
            memcpy((char *)dst + f[i].dst_off, (const char *)bounce + f[i].src_off, f[i].len);
}

struct span {
    uint64_t off, len;
    size_t idx;
};

static int by_off(const void *a, const void *b)
{
    uint64_t x = ((const struct span *)a)->off, y = ((const struct span *)b)->off;
    return x < y ? -1 : x > y;
}

/* Fragments sorted by destination must each start where the previous one
 * ended; with the sum equal to total that means exact coverage. */
static int check_overlap(const struct xfer_unpack_frag *f, size_t n, size_t *bad)
{
    struct span *v = malloc(n * sizeof(*v));
    if (!v)
        return -XFER_ENOMEM;
    for (size_t i = 0; i < n; i++)
        v[i] = (struct span){f[i].dst_off, f[i].len, i};
    qsort(v, n, sizeof(*v), by_off);
    int rc = 0;
    for (size_t k = 1; k < n && rc == 0; k++)
        if (v[k - 1].off + v[k - 1].len > v[k].off) {
            if (bad)
                *bad = v[k].idx;
            rc = -XFER_EPROTO;
        }
    free(v);
    return rc;
}

int xfer_unpack_check(const struct xfer_unpack_frag *f, size_t n, uint64_t bounce_len,
                      uint64_t total, size_t *bad)
{
    uint64_t sum = 0;
    if (n && !f)
        return -XFER_EINVAL;
    for (size_t i = 0; i < n; i++) {
        bool in_bounce = !bounce_len || (uint64_t)f[i].src_off + f[i].len <= bounce_len;
        if (!in_bounce || f[i].dst_off > total || f[i].len > total - f[i].dst_off) {
            if (bad)
                *bad = i;
            return -XFER_ERANGE;
        }
        sum += f[i].len;
    }
    if (sum != total) {
        if (bad)
            *bad = n;
        return -XFER_EPROTO;
    }
    return n > 1 ? check_overlap(f, n, bad) : 0;
}
