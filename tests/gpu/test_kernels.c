/*
 * GPU kernels against the CPU reference: random descriptor batches (odd
 * sizes, unaligned and relatively misaligned addresses, zero lengths), random
 * KV block tables in both layouts, on one GPU and across two GPUs when there
 * are two with peer access. Exits 77 ("skipped: no CUDA device") without a
 * GPU. Every destination arena is poisoned first and compared whole, so a
 * byte written outside the listed ranges fails the test too.
 *   test_kernels [rounds [seed]]     (default 18 rounds)
 */
#include "xfer.h"
#include "xfer_kernels.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if XFER_WITH_CUDA
#include <cuda_runtime_api.h>
#include "tests/gpu/gpu_test.h"

static int aligned_only; /* rounds for the bulk variant: src == dst modulo 16 */

/* A random length: zero, tiny, odd, 16-multiple or large. */
static uint64_t rnd_len(void)
{
    switch (rnd_below(6)) {
    case 0:
        return rnd_below(3);
    case 1:
        return 1 + rnd_below(40);
    case 2:
        return 1 + rnd_below(5000);
    case 3:
        return 16 * (1 + rnd_below(4096));
    case 4:
        return 16384;
    default:
        return 1 + rnd_below(300000);
    }
}

/* One random batch from src to dst arenas, launched on stream of `on`. */
static void batch_round(struct xfer_kstage *st, cudaStream_t stream, struct arena *src,
                        struct arena *dst, const char *what)
{
    size_t cap = 4096, n = 0, pos = 0;
    struct xfer_copy_desc *dd = calloc(cap, sizeof(*dd)), *hd = calloc(cap, sizeof(*hd));
    if (!dd || !hd)
        exit(1);
    while (n < cap) {
        uint64_t len = rnd_len();
        pos += rnd_below(64); /* gap and misalignment of the destination */
        if (pos + len > dst->len || len > src->len)
            break;
        uint64_t so = rnd_below(src->len - len + 1);
        if (aligned_only || rnd_below(2)) /* equal alignment: the 16-byte path */
            so = (so & ~(uint64_t)15) | (pos & 15), so = so + len > src->len ? so - 16 : so;
        dd[n] = (struct xfer_copy_desc){dst->d + pos, src->d + so, len};
        hd[n] = (struct xfer_copy_desc){dst->h + pos, src->h + so, len};
        n++;
        pos += len;
    }
    int rc = xfer_kernels_batched_copy(st, dd, n, stream);
    EXPECT(rc == 0, "%s: batched copy of %zu: %s (%s)", what, n, xfer_strerror(rc),
           xfer_kstage_last_error(st));
    memset(dd, 0, cap * sizeof(*dd)); /* the call must not read it after returning */
    CK(cudaStreamSynchronize(stream));
    xfer_kref_batched_copy(hd, n);
    arena_same(dst, what);
    free(dd);
    free(hd);
}

/* The engine helper: one ticketed launch on `on`, polled to completion. */
static void kbatch_round(struct xfer_kbatch *kb, int on, struct arena *src, struct arena *dst)
{
    enum { N = 64 };
    struct xfer_copy_desc dd[N], hd[N];
    size_t pos = 0;
    for (int i = 0; i < N; i++) {
        uint64_t len = 1 + rnd_below(20000), so = rnd_below(src->len - len);
        dd[i] = (struct xfer_copy_desc){dst->d + pos, src->d + so, len};
        hd[i] = (struct xfer_copy_desc){dst->h + pos, src->h + so, len};
        pos += len + rnd_below(32);
    }
    uint64_t mask = (1ull << src->dev) | (1ull << dst->dev);
    int t = xfer_kbatch_start(kb, on, mask, dd, N);
    EXPECT(t >= 0, "kbatch start: %s (%s)", xfer_strerror(t), xfer_kbatch_last_error(kb));
    if (t < 0)
        return;
    int rc = xfer_kbatch_wait(kb, t, 10000);
    EXPECT(rc == 0, "kbatch wait: %s (%s)", xfer_strerror(rc), xfer_kbatch_last_error(kb));
    EXPECT(xfer_kbatch_poll(kb, t) == -XFER_EINVAL, "a finished ticket is freed");
    xfer_kref_batched_copy(hd, N);
    arena_same(dst, "kbatch");
}

struct kvside {
    struct arena ar;
    struct xfer_kv_layout dl, hl; /* device and host views */
    void *dbase[64], *hbase[64];
};

/* A random layout over a fresh arena: per-layer tensors at scattered,
 * possibly unaligned offsets, or one tensor with padded layers. */
static void kv_make(struct kvside *k, int dev, uint32_t layers, uint64_t nblk, uint64_t bb,
                    int per_layer)
{
    uint64_t stride = bb + (rnd_below(2) ? 0 : 16 * rnd_below(4) + rnd_below(2) * 3);
    uint64_t lstride = nblk * stride + rnd_below(3) * 100;
    uint64_t skew = rnd_below(2) ? 0 : 1 + rnd_below(15);
    if (aligned_only)
        stride = bb, lstride = nblk * stride + 16 * rnd_below(3), skew = 0;
    size_t len = skew + (size_t)layers * (lstride + 256);
    arena_init(&k->ar, dev, len, 1);
    memset(&k->dl, 0, sizeof(k->dl));
    k->dl.num_layers = layers;
    k->dl.num_blocks = nblk;
    k->dl.block_bytes = bb;
    k->dl.block_stride = stride;
    k->hl = k->dl;
    if (per_layer) {
        for (uint32_t l = 0; l < layers; l++) { /* layers in reverse order, gaps between */
            size_t off = skew + (size_t)(layers - 1 - l) * (lstride + 256) + rnd_below(200);
            if (aligned_only)
                off &= ~(size_t)15;
            k->dbase[l] = k->ar.d + off;
            k->hbase[l] = k->ar.h + off;
        }
        k->dl.layer_base = k->dbase;
        k->hl.layer_base = k->hbase;
    } else {
        k->dl.base = k->ar.d + skew;
        k->hl.base = k->ar.h + skew;
        k->dl.layer_stride = k->hl.layer_stride = lstride;
    }
}

/* ids: n picks from [0, nblk); distinct when `distinct` (n <= nblk). */
static void rnd_ids(uint64_t *ids, size_t n, uint64_t nblk, int distinct)
{
    uint64_t *perm = calloc(nblk, sizeof(*perm));
    if (!perm)
        exit(1);
    for (uint64_t i = 0; i < nblk; i++)
        perm[i] = i;
    for (uint64_t i = nblk - 1; i > 0; i--) {
        uint64_t j = rnd_below(i + 1), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    for (size_t i = 0; i < n; i++)
        ids[i] = distinct ? perm[i] : rnd_below(nblk);
    free(perm);
}

/* Gather blocks of A (on dev a) into a buffer on dev b, scatter it into
 * other blocks of B (on dev b); both launched on stream (of dev `on`). */
static void kv_round(struct xfer_kstage *st, cudaStream_t stream, int a, int b, const char *what)
{
    static const uint64_t sizes[] = {16384, 1000, 4100, 777, 65536, 48};
    static const uint64_t aligned_sizes[] = {16384, 4096, 48, 65536, 1024 + 16 * 7};
    uint32_t layers = 1 + (uint32_t)rnd_below(12);
    uint64_t bb = aligned_only ? aligned_sizes[rnd_below(5)] : sizes[rnd_below(6)];
    uint64_t nblk = 8 + rnd_below(56);
    size_t n = 1 + rnd_below(nblk);
    struct kvside A, B;
    struct arena buf;
    uint64_t ida[64], idb[64];
    kv_make(&A, a, layers, nblk, bb, (int)rnd_below(2));
    kv_make(&B, b, layers, nblk, bb, (int)rnd_below(2));
    arena_init(&buf, b, (size_t)layers * n * bb + 7, 0);
    size_t skew = rnd_below(2) || aligned_only ? 0 : 1 + rnd_below(6); /* unaligned buffer too */
    rnd_ids(ida, n, nblk, 0);
    rnd_ids(idb, n, nblk, 1);

    int rc = xfer_kernels_kv_gather(st, &A.dl, ida, n, buf.d + skew, stream);
    EXPECT(rc == 0, "%s: gather: %s (%s)", what, xfer_strerror(rc), xfer_kstage_last_error(st));
    rc = xfer_kernels_kv_scatter(st, &B.dl, idb, n, buf.d + skew, stream);
    EXPECT(rc == 0, "%s: scatter: %s (%s)", what, xfer_strerror(rc), xfer_kstage_last_error(st));
    CK(cudaStreamSynchronize(stream));
    EXPECT(xfer_kref_kv_gather(&A.hl, ida, n, buf.h + skew) == 0, "ref gather");
    EXPECT(xfer_kref_kv_scatter(&B.hl, idb, n, buf.h + skew) == 0, "ref scatter");
    char w[160];
    snprintf(w, sizeof(w), "%s gather L=%u bb=%llu n=%zu", what, layers, (unsigned long long)bb, n);
    arena_same(&buf, w);
    snprintf(w, sizeof(w), "%s scatter L=%u bb=%llu n=%zu", what, layers, (unsigned long long)bb,
             n);
    arena_same(&B.ar, w);
    arena_same(&A.ar, "gather source untouched");

    /* bad ids and layouts are refused before anything is launched */
    ida[0] = nblk;
    EXPECT(xfer_kernels_kv_gather(st, &A.dl, ida, n, buf.d, stream) == -XFER_ERANGE, "ERANGE");
    EXPECT(xfer_kernels_kv_gather(st, NULL, ida, n, buf.d, stream) == -XFER_EINVAL, "EINVAL");
    arena_free(&A.ar);
    arena_free(&B.ar);
    arena_free(&buf);
}

/* Cycles through kernel variants and grid shapes, tiny chunks included so
 * that pieces cross thread-block boundaries everywhere. */
static void tune_round(unsigned r)
{
    static const struct {
        uint64_t chunk;
        unsigned threads;
        int variant;
        int aligned;
    } t[] = {{0, 0, 0, 0},       {16, 32, 1, 0}, {4096, 512, 2, 0}, {48, 96, 3, 0},
             {65536, 256, 4, 0}, {0, 128, 5, 1}, {4096, 64, 5, 1},  {1008, 64, 5, 1},
             {0, 0, 0, 1}}; /* the last: automatic choice on aligned input (bulk) */
    unsigned i = r % (sizeof(t) / sizeof(t[0]));
    xfer_kernels_tune(t[i].chunk, t[i].threads, t[i].variant);
    aligned_only = t[i].aligned;
}

static void test_api_errors(struct xfer_kstage *st, cudaStream_t s)
{
    struct xfer_copy_desc d = {NULL, NULL, 5};
    EXPECT(xfer_kernels_batched_copy(st, NULL, 0, s) == 0, "n == 0 is a no-op");
    EXPECT(xfer_kernels_batched_copy(st, &d, 1, s) == -XFER_EINVAL, "NULL with len");
    d.len = 0;
    EXPECT(xfer_kernels_batched_copy(st, &d, 1, s) == 0, "zero-length NULL is fine");
    EXPECT(xfer_kstage_new(1 << 20, &st) == -XFER_EINVAL, "bad device");
}

static void run_pair(int a, int b, int on, unsigned rounds)
{
    char what[64];
    struct xfer_kstage *st;
    cudaStream_t stream;
    int rc = xfer_kstage_new(on, &st);
    EXPECT(rc == 0, "stage on %d: %s", on, xfer_strerror(rc));
    if (rc)
        return;
    CK(cudaSetDevice(on));
    CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    test_api_errors(st, stream);
    struct arena src, dst;
    arena_init(&src, a, 4u << 20, 1);
    arena_init(&dst, b, 6u << 20, 0);
    for (unsigned r = 0; r < rounds; r++) {
        tune_round(r);
        snprintf(what, sizeof(what), "copy gpu%d->gpu%d on gpu%d round %u", a, b, on, r);
        batch_round(st, stream, &src, &dst, what);
        snprintf(what, sizeof(what), "kv gpu%d->gpu%d on gpu%d round %u", a, b, on, r);
        kv_round(st, stream, a, b, what);
    }
    xfer_kernels_tune(0, 0, 0);
    aligned_only = 0;
    struct xfer_kbatch *kb;
    rc = xfer_kbatch_new(&kb);
    EXPECT(rc == 0, "kbatch new: %s", xfer_strerror(rc));
    for (int i = 0; rc == 0 && i < 4; i++)
        kbatch_round(kb, on, &src, &dst);
    xfer_kbatch_free(kb);
    arena_free(&src);
    arena_free(&dst);
    CK(cudaSetDevice(on));
    CK(cudaStreamDestroy(stream));
    xfer_kstage_free(st);
    printf("ok: gpu%d -> gpu%d launched on gpu%d, %u rounds\n", a, b, on, rounds);
}

int main(int argc, char **argv)
{
    unsigned rounds = argc > 1 ? (unsigned)atoi(argv[1]) : 18;
    int ndev = 0;
    if (xfer_kernels_probe(&ndev)) {
        struct xfer_kstage *st = NULL;
        if (xfer_kstage_new(0, &st) != -XFER_ENODEV ||
            xfer_kernels_batched_copy(NULL, NULL, 0, NULL) != -XFER_ENODEV) {
            fprintf(stderr, "FAIL: without a device the API must say -XFER_ENODEV\n");
            return 1;
        }
        printf("skipped: no CUDA device\n");
        return 77;
    }
    rng ^= (uint64_t)(argc > 2 ? atoll(argv[2]) : 1);
    printf("%d CUDA device(s)\n", ndev);
    run_pair(0, 0, 0, rounds);
    if (ndev >= 2 && enable_peer(0, 1) && enable_peer(1, 0)) {
        run_pair(0, 1, 0, rounds); /* push: local reads, remote writes */
        run_pair(0, 1, 1, rounds); /* pull: remote reads, local writes */
    } else if (ndev >= 2) {
        printf("note: gpu0 and gpu1 have no peer access; cross-GPU cases not run\n");
    }
    printf("%s (%d failures)\n", failures ? "FAILED" : "passed", failures);
    return failures ? 1 : 0;
}

#else /* !XFER_WITH_CUDA */

int main(void)
{
    struct xfer_kstage *st = NULL;
    if (xfer_kstage_new(0, &st) != -XFER_ENODEV) {
        fprintf(stderr, "FAIL: a build without CUDA must say -XFER_ENODEV\n");
        return 1;
    }
    printf("skipped: no CUDA device (built without CUDA)\n");
    return 77;
}
#endif
