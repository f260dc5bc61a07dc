/* Random TCPX-style fragment lists for the unpack tests and bench: a message
 * of `total` bytes cut into fragments of the given sizes, placed in a bounce
 * buffer out of order and with gaps. Header-only (tests and bench). */
#ifndef XFER_TEST_UNPACK_FRAGS_H
#define XFER_TEST_UNPACK_FRAGS_H

#include "xfer_kernels.h"

#include <stdint.h>
#include <stdlib.h>

static inline uint64_t uf_rand(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* size(i) of fragment i: fixed (fixed > 0) or a realistic MTU mix: 70% 4096
 * (devmem pages), 20% 8948 (jumbo-frame MSS), 10% 1..1448. */
static inline uint32_t uf_size(uint64_t *s, uint32_t fixed)
{
    if (fixed)
        return fixed;
    uint64_t r = uf_rand(s) % 10;
    return r < 7 ? 4096 : r < 9 ? 8948 : 1 + (uint32_t)(uf_rand(s) % 1448);
}

/* Fills f (capacity cap) for a message of `total` bytes; shuffles; places
 * fragments in the bounce with gaps of 0..max_gap bytes (and, with
 * misalign, random byte offsets). Returns the count; *bounce_len gets the
 * bounce bytes used. */
static inline size_t uf_make(struct xfer_unpack_frag *f, size_t cap, uint64_t total, uint32_t fixed,
                             uint32_t max_gap, uint64_t seed, uint64_t *bounce_len)
{
    uint64_t s = seed | 1, off = 0;
    size_t n = 0;
    while (off < total && n < cap) {
        uint64_t len = uf_size(&s, fixed);
        len = len < total - off ? len : total - off;
        f[n++] = (struct xfer_unpack_frag){0, (uint32_t)len, off};
        off += len;
    }
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)(uf_rand(&s) % i);
        struct xfer_unpack_frag t = f[i - 1];
        f[i - 1] = f[j];
        f[j] = t;
    }
    uint64_t pos = max_gap ? uf_rand(&s) % (max_gap + 1) : 0;
    for (size_t i = 0; i < n; i++) {
        f[i].src_off = (uint32_t)pos;
        pos += f[i].len + (max_gap ? uf_rand(&s) % (max_gap + 1) : 0);
    }
    *bounce_len = pos;
    return n;
}

#endif
