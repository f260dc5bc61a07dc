/* What the kernel test programs (test_kernels, test_kblocks) share: the
 * failure count and EXPECT (tests/prog/check.h's CHECK), the seeded xorshift, and with CUDA the
 * device arena with its host mirror and peer access between two GPUs. Include it once per program
 * (it defines static state). */
#ifndef XFER_GPU_TEST_H
#define XFER_GPU_TEST_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* failures and CHECK, as the test helper programs have them */
#include "tests/prog/check.h"
#define EXPECT CHECK

static uint64_t rng = 0x9e3779b97f4a7c15ull; /* main() mixes the seed argument in */
static inline uint64_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
static inline uint64_t rnd_below(uint64_t n)
{
    return n ? rnd() % n : 0;
}

#if XFER_WITH_CUDA
#include "tests/gpu/gpu_check.h"

/* A device buffer and its host mirror, same size. */
struct arena {
    int dev;
    size_t len;
    char *d, *h;
};

/* random: random bytes, else 0xa5 everywhere. */
static inline void arena_init(struct arena *a, int dev, size_t len, int random)
{
    a->dev = dev, a->len = len;
    if (!(a->h = malloc(len)))
        exit(1);
    for (size_t i = 0; i < len; i++)
        a->h[i] = random ? (char)rnd() : (char)0xa5;
    CK(cudaSetDevice(dev));
    CK(cudaMalloc((void **)&a->d, len));
    CK(cudaMemcpy(a->d, a->h, len, cudaMemcpyHostToDevice));
}

static inline void arena_free(struct arena *a)
{
    CK(cudaSetDevice(a->dev));
    CK(cudaFree(a->d));
    free(a->h);
}

/* Device arena equals host mirror; a failure names the first differing byte. */
static inline int arena_same(const struct arena *a, const char *what)
{
    char *got = malloc(a->len);
    if (!got)
        exit(1);
    CK(cudaMemcpy(got, a->d, a->len, cudaMemcpyDeviceToHost));
    size_t i = 0;
    while (i < a->len && got[i] == a->h[i])
        i++;
    EXPECT(i == a->len, "%s: first difference at byte %zu of %zu (got %02x want %02x)", what, i,
           a->len, i < a->len ? (unsigned char)got[i] : 0, i < a->len ? (unsigned char)a->h[i] : 0);
    free(got);
    return i == a->len;
}
#endif

#endif
