/*
 * Block runs (xfer_kernels_block_runs: the GPU computes each segment's
 * address from block ids, the form ipc gives KV pool requests) against the
 * CPU reference. Always: the argument checks and the reference itself
 * against an independent model. With a GPU: random pool-like layouts
 * (vLLM-like: stream s at s * N * L, stride L; block-major-like: stride
 * S * L; padded strides; odd block lengths and unaligned bases), several
 * runs sharing id arrays by pointer, partial segment ranges, every kernel
 * variant, the engine helper's ticketed launch, and across two GPUs when
 * there are two with peer access. Every destination arena is poisoned and
 * compared whole. Exits 77 ("skipped: no CUDA device") without a GPU,
 * after the CPU checks.
 *   test_kblocks [rounds [seed]]     (default 24 rounds)
 */
#include "xfer.h"
#include "xfer_kernels.h"

#include "tests/gpu/gpu_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXIDS  600
#define MAXRUNS 3

/* One side's layout: S streams of N blocks of stride bytes. */
struct side {
    uint64_t base[4], stride;
};

/* A round's shape: both sides, the ids, the runs (host form). */
struct shape {
    uint64_t len, N;
    uint32_t S, nids, nr;
    struct side A, B;
    uint64_t aid[MAXIDS], bid[MAXIDS];
    struct xfer_block_run run[MAXRUNS];
    int a_is_dst;
};

static void side_make(struct side *s, uint32_t S, uint64_t N, uint64_t len, uint64_t skew)
{
    bool vllm = rnd_below(2);
    uint64_t pad = rnd_below(2) ? 0 : 16 * rnd_below(3) + rnd_below(2) * 5;
    s->stride = vllm ? len + pad : S * len + pad;
    for (uint32_t k = 0; k < S; k++)
        s->base[k] = skew + (vllm ? k * N * (len + pad) : k * len);
}

/* Bytes a side's layout spans. */
static uint64_t side_span(const struct side *s, uint32_t S, uint64_t N, uint64_t len)
{
    uint64_t top = 0;
    for (uint32_t k = 0; k < S; k++) {
        uint64_t end = s->base[k] + (N - 1) * s->stride + len;
        top = end > top ? end : top;
    }
    return top;
}

/* ids: n of [0, N), distinct when asked. */
static void pick(uint64_t *ids, uint32_t n, uint64_t N, bool distinct)
{
    static uint64_t perm[4096];
    for (uint64_t i = 0; i < N; i++)
        perm[i] = i;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t j = i + rnd_below(N - i), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
        ids[i] = distinct ? perm[i] : rnd_below(N);
    }
}

/* A random shape whose destination side has distinct ids (exact result)
 * and fits `room` bytes on each side; runs split the streams and may take
 * a part of their segments only. a and b are the arenas' starts. */
static void shape_make(struct shape *sh, char *a, char *b, uint64_t room, bool aligned)
{
    static const uint64_t lens[] = {16384, 4096, 1000, 48, 777, 65536, 1};
    static const uint64_t alens[] = {16384, 4096, 48, 65536, 1024 + 16 * 7};
    sh->len = aligned ? alens[rnd_below(5)] : lens[rnd_below(7)];
    sh->S = 1 + (uint32_t)rnd_below(4);
    sh->N = room / (sh->S * (sh->len + 64)) - 1;
    sh->N = sh->N > 4096 ? 4096 : sh->N;
    sh->nids = 1 + (uint32_t)rnd_below(sh->N < MAXIDS ? sh->N : MAXIDS);
    uint64_t skew = aligned ? 16 * rnd_below(4) : rnd_below(40);
    side_make(&sh->A, sh->S, sh->N, sh->len, skew);
    side_make(&sh->B, sh->S, sh->N, sh->len, aligned ? skew : rnd_below(40));
    if (aligned)
        sh->A.stride = sh->A.stride / 16 * 16 + (sh->A.stride % 16 ? 16 : 0),
        sh->B.stride = sh->B.stride / 16 * 16 + (sh->B.stride % 16 ? 16 : 0);
    while (side_span(&sh->A, sh->S, sh->N, sh->len) > room ||
           side_span(&sh->B, sh->S, sh->N, sh->len) > room)
        sh->N /= 2; /* padding made it too long */
    if (sh->nids > sh->N)
        sh->nids = (uint32_t)sh->N;
    sh->a_is_dst = (int)rnd_below(2);
    pick(sh->aid, sh->nids, sh->N, sh->a_is_dst);
    pick(sh->bid, sh->nids, sh->N, !sh->a_is_dst);
    sh->nr = 1 + (uint32_t)rnd_below(sh->S < MAXRUNS ? sh->S : MAXRUNS);
    for (uint32_t r = 0, s0 = 0; r < sh->nr; r++) {
        uint32_t ns =
            r + 1 == sh->nr ? sh->S - s0 : 1 + (uint32_t)rnd_below(sh->S - s0 - (sh->nr - 1 - r));
        uint32_t nseg = ns * sh->nids, lo = (uint32_t)rnd_below(2) ? 0 : (uint32_t)rnd_below(nseg);
        uint32_t hi = lo + 1 + (uint32_t)rnd_below(nseg - lo);
        sh->run[r] = (struct xfer_block_run){.a = a,
                                             .b = b,
                                             .a_base = sh->A.base + s0,
                                             .b_base = sh->B.base + s0,
                                             .a_ids = sh->aid, /* shared by pointer */
                                             .b_ids = sh->bid,
                                             .a_stride = sh->A.stride,
                                             .b_stride = sh->B.stride,
                                             .len = sh->len,
                                             .nstreams = ns,
                                             .nids = sh->nids,
                                             .s0 = lo,
                                             .s1 = hi,
                                             .a_is_dst = sh->a_is_dst};
        s0 += ns;
    }
}

/* The model, without the library: segment by segment. */
static void model(const struct shape *sh, char *a, char *b)
{
    for (uint32_t r = 0; r < sh->nr; r++) {
        const struct xfer_block_run *q = &sh->run[r];
        for (uint32_t k = q->s0; k < q->s1; k++) {
            uint32_t st = k / q->nids, i = k % q->nids;
            char *pa = a + q->a_base[st] + q->a_ids[i] * q->a_stride;
            char *pb = b + q->b_base[st] + q->b_ids[i] * q->b_stride;
            memcpy(q->a_is_dst ? pa : pb, q->a_is_dst ? pb : pa, q->len);
        }
    }
}

/* The reference against the model, and the argument checks: no GPU needed. */
static void cpu_checks(unsigned rounds)
{
    enum { ROOM = 4u << 20 };
    char *a = malloc(ROOM), *b = malloc(ROOM), *ma = malloc(ROOM), *mb = malloc(ROOM);
    if (!a || !b || !ma || !mb)
        exit(1);
    for (unsigned r = 0; r < rounds; r++) {
        for (size_t i = 0; i < ROOM; i++)
            a[i] = (char)rnd(), b[i] = (char)rnd();
        memcpy(ma, a, ROOM);
        memcpy(mb, b, ROOM);
        struct shape sh;
        shape_make(&sh, a, b, ROOM, false);
        EXPECT(xfer_kref_block_runs(sh.run, sh.nr) == 0, "reference refused a good run");
        for (uint32_t x = 0; x < sh.nr; x++)
            sh.run[x].a = ma, sh.run[x].b = mb;
        model(&sh, ma, mb);
        EXPECT(!memcmp(a, ma, ROOM) && !memcmp(b, mb, ROOM), "reference round %u differs", r);
    }
    uint64_t ids[2] = {0, 1}, base[1] = {0}, total = 0;
    size_t bad = 9;
    struct xfer_block_run ok = {a, b, base, base, ids, ids, 64, 64, 64, 1, 2, 0, 2, 0}, q;
    EXPECT(xfer_block_runs_check(&ok, 1, &total, &bad) == 0 && total == 128, "good run refused");
    q = ok, q.s1 = 3;
    EXPECT(xfer_block_runs_check(&q, 1, &total, &bad) == -XFER_EINVAL, "s1 past the segments");
    q = ok, q.s0 = 2;
    EXPECT(xfer_block_runs_check(&q, 1, &total, &bad) == -XFER_EINVAL, "empty range");
    q = ok, q.len = 0;
    EXPECT(xfer_block_runs_check(&q, 1, &total, &bad) == -XFER_EINVAL, "len 0");
    q = ok, q.b_ids = NULL;
    struct xfer_block_run two[2] = {ok, q};
    EXPECT(xfer_block_runs_check(two, 2, &total, &bad) == -XFER_EINVAL && bad == 1, "NULL ids");
    q = ok, q.len = UINT64_MAX / 2 + 1;
    EXPECT(xfer_block_runs_check(&q, 1, &total, &bad) == -XFER_EINVAL, "bytes past 2^64");
    free(a), free(b), free(ma), free(mb);
    printf("cpu: reference and checks %s\n", failures ? "FAILED" : "ok");
}

#if XFER_WITH_CUDA

/* Cycles through variants and grid shapes (tiny chunks: pieces cross
 * thread-block boundaries everywhere); the bulk ones on aligned input. */
static bool tune_round(unsigned r)
{
    static const struct {
        uint64_t chunk;
        unsigned threads;
        int variant;
        bool aligned;
    } t[] = {{0, 0, 0, 0},     {16, 32, 1, 0},     {4096, 512, 2, 0},
             {48, 96, 3, 0},   {65536, 256, 4, 0}, {0, 128, 5, 1},
             {4096, 64, 5, 1}, {1008, 64, 5, 1},   {0, 0, 0, 1}};
    unsigned i = r % (sizeof(t) / sizeof(t[0]));
    xfer_kernels_tune(t[i].chunk, t[i].threads, t[i].variant);
    /* the runs in the launch's parameters, or uploaded (both ways) */
    xfer_kernels_tune_upload((int)(r / 2 % 3));
    return t[i].aligned;
}

/* One random round on arenas A (dev a) and B (dev b), launched on `on`:
 * by the stage, or (kb) as a ticket of the engine helper. */
static void gpu_round(struct xfer_kstage *st, struct xfer_kbatch *kb, cudaStream_t stream, int on,
                      struct arena *A, struct arena *B, bool aligned, const char *what)
{
    struct shape sh;
    shape_make(&sh, A->d, B->d, A->len < B->len ? A->len : B->len, aligned);
    int rc;
    if (kb) {
        uint64_t mask = (1ull << A->dev) | (1ull << B->dev);
        int t = xfer_kbatch_start_blocks(kb, on, mask, sh.run, sh.nr);
        EXPECT(t >= 0, "%s: kbatch: %s (%s)", what, xfer_strerror(t), xfer_kbatch_last_error(kb));
        rc = t >= 0 ? xfer_kbatch_wait(kb, t, 10000) : t;
    } else {
        rc = xfer_kernels_block_runs(st, sh.run, sh.nr, stream);
    }
    EXPECT(rc == 0, "%s: %s (%s)", what, xfer_strerror(rc),
           kb ? xfer_kbatch_last_error(kb) : xfer_kstage_last_error(st));
    struct shape keep = sh; /* the call must not read the arrays after returning */
    memset(sh.aid, 0xff, sizeof(sh.aid));
    memset(sh.bid, 0xff, sizeof(sh.bid));
    memset(&sh.A, 0xff, sizeof(sh.A));
    if (!kb)
        CK(cudaStreamSynchronize(stream));
    for (uint32_t x = 0; x < keep.nr; x++) {
        keep.run[x].a = A->h, keep.run[x].b = B->h;
        keep.run[x].a_ids = keep.aid, keep.run[x].b_ids = keep.bid;
        keep.run[x].a_base = keep.A.base + (sh.run[x].a_base - sh.A.base);
        keep.run[x].b_base = keep.B.base + (sh.run[x].b_base - sh.B.base);
    }
    EXPECT(xfer_kref_block_runs(keep.run, keep.nr) == 0, "reference");
    char w[200];
    snprintf(w, sizeof(w), "%s: %u runs, %u streams x %u ids of %llu B, %s", what, keep.nr, keep.S,
             keep.nids, (unsigned long long)keep.len, keep.a_is_dst ? "into a" : "into b");
    arena_same(A, w);
    arena_same(B, w);
}

static void run_pair(int a, int b, int on, unsigned rounds)
{
    struct xfer_kstage *st;
    struct xfer_kbatch *kb;
    cudaStream_t stream;
    EXPECT(xfer_kstage_new(on, &st) == 0 && xfer_kbatch_new(&kb) == 0, "stage, helper");
    CK(cudaSetDevice(on));
    CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    struct arena A, B;
    arena_init(&A, a, 6u << 20, 1);
    arena_init(&B, b, 6u << 20, 1);
    char what[80];
    for (unsigned r = 0; r < rounds; r++) {
        bool aligned = tune_round(r);
        snprintf(what, sizeof(what), "gpu%d<->gpu%d on gpu%d round %u", a, b, on, r);
        gpu_round(st, r % 4 == 3 ? kb : NULL, stream, on, &A, &B, aligned, what);
    }
    xfer_kernels_tune(0, 0, 0);
    xfer_kernels_tune_upload(0);
    struct xfer_block_run bad = {0};
    EXPECT(xfer_kernels_block_runs(st, &bad, 1, stream) == -XFER_EINVAL, "a NULL run launched");
    EXPECT(xfer_kernels_block_runs(st, NULL, 0, stream) == 0, "no runs: a no-op");
    arena_free(&A);
    arena_free(&B);
    CK(cudaSetDevice(on));
    CK(cudaStreamDestroy(stream));
    xfer_kbatch_free(kb);
    xfer_kstage_free(st);
    printf("ok: gpu%d <-> gpu%d launched on gpu%d, %u rounds\n", a, b, on, rounds);
}

#endif

int main(int argc, char **argv)
{
    unsigned rounds = argc > 1 ? (unsigned)atoi(argv[1]) : 24;
    rng ^= (uint64_t)(argc > 2 ? atoll(argv[2]) : 1);
    cpu_checks(8);
    int ndev = 0;
    if (xfer_kernels_probe(&ndev)) {
        EXPECT(xfer_kernels_block_runs(NULL, NULL, 0, NULL) == -XFER_ENODEV, "no device: ENODEV");
        if (failures)
            return 1;
        printf("skipped: no CUDA device\n");
        return 77;
    }
#if !XFER_WITH_CUDA
    (void)rounds; /* a build without CUDA never gets here: the probe fails */
#else
    printf("%d CUDA device(s)\n", ndev);
    run_pair(0, 0, 0, rounds);
    if (ndev >= 2 && enable_peer(0, 1) && enable_peer(1, 0)) {
        run_pair(0, 1, 0, rounds);
        run_pair(0, 1, 1, rounds);
    } else if (ndev >= 2) {
        printf("note: gpu0 and gpu1 have no peer access; cross-GPU cases not run\n");
    }
#endif
    printf("%s (%d failures)\n", failures ? "FAILED" : "passed", failures);
    return failures ? 1 : 0;
}
