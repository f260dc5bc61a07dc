/*
 * Batched copy and KV gather/scatter bandwidth against the CUDA copy paths.
 *
 * For 4096 blocks of 16, 64 and 256 KiB at random slots of a source and a
 * destination pool, on one GPU and (with two GPUs) from GPU 0 to GPU 1:
 *   ceiling    one cudaMemcpyAsync / cudaMemcpyPeerAsync of all the bytes
 *   kernel     xfer_kernels_batched_copy (staging of descriptors included),
 *              automatic grid and a sweep of grid shapes
 *   per-block  one cudaMemcpyAsync per block
 *   batch      one cudaMemcpyBatchAsync
 * and KV gather/scatter (32 layers, 1024 blocks per layer, 256 listed) with
 * the same ceiling. GB/s = payload bytes / time (a copy's bytes counted
 * once). Timed with CUDA events per repetition after warm-ups; best and
 * median of the repetitions. Exits 77 without a GPU.
 *   bench_kernels [reps]      (default 20)
 *   bench_kernels blocks [reps]
 *       only the block-runs kernel (xfer_kernels_block_runs, what ipc
 *       launches for a KV pool request) on the request of issue 16: vLLM
 *       FlashAttention pools of 32 layers x K/V, 16 KiB blocks, 512 random
 *       ids per side = 512 MiB, against one cudaMemcpyAsync D2D of 512 MiB,
 *       with a sweep of variants and grid shapes; as one launch of 32 runs
 *       and as the ipc worker's two launches of 16 (256 MiB groups)
 */
#include "xfer.h"
#include "xfer_kernels.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if XFER_WITH_CUDA
#include <cuda_runtime_api.h>
#include "tests/gpu/gpu_check.h"

#define NBLK    4096
#define WARM    3
#define MAXREPS 64

static int reps = 20;
static int skip_bulk; /* XFER_BENCH_SKIP_BULK=1: leave the bulk variant out */
static uint64_t rng = 88172645463325252ull;
static uint64_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

struct gbs {
    double best, med;
};

/* One timed operation and everything it needs. */
struct op {
    cudaStream_t st;
    struct xfer_kstage *stage;
    size_t n;
    uint64_t bytes; /* payload per run */
    struct xfer_copy_desc *d;
    void **dsts;
    const void **srcs;
    size_t *sizes;
    char *big_dst, *big_src;
    int dst_dev, src_dev;
    const struct xfer_kv_layout *kv;
    const uint64_t *ids;
    char *kvbuf;
    const struct xfer_block_run *br;
    size_t nbr, br_split; /* runs; launches of br_split runs each (0: one) */
};

typedef void (*op_fn)(struct op *o);

static void op_kernel(struct op *o)
{
    int rc = xfer_kernels_batched_copy(o->stage, o->d, o->n, o->st);
    if (rc) {
        fprintf(stderr, "batched copy: %s (%s)\n", xfer_strerror(rc),
                xfer_kstage_last_error(o->stage));
        exit(1);
    }
}

static void op_per_block(struct op *o)
{
    for (size_t i = 0; i < o->n; i++)
        CK(cudaMemcpyAsync(o->d[i].dst, o->d[i].src, o->d[i].len, cudaMemcpyDefault, o->st));
}

static void op_batch(struct op *o)
{
    struct cudaMemcpyAttributes attr;
    size_t idx0 = 0;
    memset(&attr, 0, sizeof(attr));
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    CK(cudaMemcpyBatchAsync(o->dsts, o->srcs, o->sizes, o->n, &attr, &idx0, 1, o->st));
}

static void op_ceiling(struct op *o)
{
    if (o->dst_dev == o->src_dev)
        CK(cudaMemcpyAsync(o->big_dst, o->big_src, o->bytes, cudaMemcpyDeviceToDevice, o->st));
    else
        CK(cudaMemcpyPeerAsync(o->big_dst, o->dst_dev, o->big_src, o->src_dev, o->bytes, o->st));
}

static void op_gather(struct op *o)
{
    int rc = xfer_kernels_kv_gather(o->stage, o->kv, o->ids, o->n, o->kvbuf, o->st);
    if (rc) {
        fprintf(stderr, "gather: %s (%s)\n", xfer_strerror(rc), xfer_kstage_last_error(o->stage));
        exit(1);
    }
}

static void op_scatter(struct op *o)
{
    int rc = xfer_kernels_kv_scatter(o->stage, o->kv, o->ids, o->n, o->kvbuf, o->st);
    if (rc) {
        fprintf(stderr, "scatter: %s (%s)\n", xfer_strerror(rc), xfer_kstage_last_error(o->stage));
        exit(1);
    }
}

static void op_block_runs(struct op *o)
{
    size_t step = o->br_split ? o->br_split : o->nbr;
    for (size_t x = 0; x < o->nbr; x += step) {
        size_t k = o->nbr - x < step ? o->nbr - x : step;
        int rc = xfer_kernels_block_runs(o->stage, o->br + x, k, o->st);
        if (rc) {
            fprintf(stderr, "block runs: %s (%s)\n", xfer_strerror(rc),
                    xfer_kstage_last_error(o->stage));
            exit(1);
        }
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Warm-ups, then `reps` runs each between two events on the op's stream. */
static struct gbs time_op(op_fn fn, struct op *o)
{
    cudaEvent_t ev[MAXREPS + 1];
    double ms[MAXREPS];
    for (int i = 0; i <= reps; i++)
        CK(cudaEventCreate(&ev[i]));
    for (int i = 0; i < WARM; i++)
        fn(o);
    CK(cudaStreamSynchronize(o->st));
    for (int i = 0; i < reps; i++) { /* back to back: event i ends run i-1, starts run i */
        CK(cudaEventRecord(ev[i], o->st));
        fn(o);
    }
    CK(cudaEventRecord(ev[reps], o->st));
    CK(cudaEventSynchronize(ev[reps]));
    for (int i = 0; i < reps; i++) {
        float f;
        CK(cudaEventElapsedTime(&f, ev[i], ev[i + 1]));
        ms[i] = f;
    }
    for (int i = 0; i <= reps; i++)
        CK(cudaEventDestroy(ev[i]));
    qsort(ms, (size_t)reps, sizeof(ms[0]), cmp_double);
    struct gbs g = {o->bytes / (ms[0] * 1e6), o->bytes / (ms[reps / 2] * 1e6)};
    return g;
}

/* Each run alone: the stream is idle before it, nothing overlaps it. */
static double oneshot_call_us; /* the last time_op_oneshot's median host time of fn */

static double host_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static struct gbs time_op_oneshot(op_fn fn, struct op *o)
{
    cudaEvent_t a, b;
    double ms[MAXREPS], us[MAXREPS];
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    fn(o);
    CK(cudaStreamSynchronize(o->st));
    for (int i = 0; i < reps; i++) {
        CK(cudaEventRecord(a, o->st));
        double t0 = host_us();
        fn(o);
        us[i] = host_us() - t0;
        CK(cudaEventRecord(b, o->st));
        CK(cudaEventSynchronize(b));
        float f;
        CK(cudaEventElapsedTime(&f, a, b));
        ms[i] = f;
    }
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    qsort(ms, (size_t)reps, sizeof(ms[0]), cmp_double);
    qsort(us, (size_t)reps, sizeof(us[0]), cmp_double);
    oneshot_call_us = us[reps / 2];
    struct gbs g = {o->bytes / (ms[0] * 1e6), o->bytes / (ms[reps / 2] * 1e6)};
    return g;
}

static char *dev_alloc(int dev, size_t len)
{
    char *p;
    CK(cudaSetDevice(dev));
    CK(cudaMalloc((void **)&p, len));
    CK(cudaMemset(p, 0x5a, len));
    return p;
}

static void shuffle(uint32_t *a, size_t n)
{
    for (size_t i = 0; i < n; i++)
        a[i] = (uint32_t)i;
    for (size_t i = n - 1; i > 0; i--) {
        size_t j = rnd() % (i + 1);
        uint32_t t = a[i];
        a[i] = a[j], a[j] = t;
    }
}

/* The op's stream and staging on GPU on. */
static void op_open(struct op *o, int on)
{
    CK(cudaSetDevice(on));
    CK(cudaStreamCreateWithFlags(&o->st, cudaStreamNonBlocking));
    if (xfer_kstage_new(on, &o->stage))
        exit(1);
}

static void op_close(struct op *o)
{
    xfer_kstage_free(o->stage);
    CK(cudaStreamDestroy(o->st));
}

/* n distinct random ids below nb (<= 4096). */
static void pick_ids(uint64_t *ids, size_t n, size_t nb)
{
    static uint32_t perm[4096];
    shuffle(perm, nb);
    for (size_t i = 0; i < n; i++)
        ids[i] = perm[i];
}

/* Grid shapes and variants tried (xfer_kernels_tune); entry 0 is automatic. */
static const struct shape {
    uint64_t chunk;
    unsigned threads;
    int variant;
} sweep[] = {
    {0, 0, 0},        {0, 0, 1},        {65536, 256, 1},  {262144, 256, 1}, {65536, 512, 1},
    {0, 0, 2},        {65536, 256, 2},  {262144, 256, 2}, {0, 0, 3},        {65536, 256, 3},
    {262144, 256, 3}, {0, 0, 4},        {65536, 256, 4},  {0, 0, 5},        {65536, 64, 5},
    {131072, 64, 5},  {262144, 128, 5}, {65536, 128, 5},  {65536, 512, 2},
};
#define NSWEEP (sizeof(sweep) / sizeof(sweep[0]))
static const char *const variant_names[] = {"auto", "vec4", "vec8", "vec4s", "vec8s", "bulk"};

static void shape_name(char *buf, size_t len, const struct shape *sh)
{
    snprintf(buf, len, "kernel %s c=%lluK t=%u", variant_names[sh->variant],
             (unsigned long long)(sh->chunk >> 10), sh->threads);
}

static void report(const char *path, const char *what, uint64_t bs, struct gbs g, double ceil)
{
    printf("%-10s %-28s %7llu KiB  best %8.1f GB/s  median %8.1f GB/s  %5.3f of ceiling\n", path,
           what, (unsigned long long)(bs >> 10), g.best, g.med, ceil > 0 ? g.med / ceil : 0);
}

/* Times fn under each grid shape of sw[0..n) (entry 0 automatic, named
 * auto_name), reports each and the best; the tuning is reset after. */
static void sweep_run(const char *path, const struct shape *sw, size_t n, op_fn fn, struct op *o,
                      const char *auto_name, uint64_t bs, double ceil)
{
    struct gbs best = {0, 0};
    size_t best_i = 0;
    char name[48];
    for (size_t v = 0; v < n; v++) {
        if (sw[v].variant == 5 && skip_bulk)
            continue;
        xfer_kernels_tune(sw[v].chunk, sw[v].threads, sw[v].variant);
        struct gbs g = time_op(fn, o);
        shape_name(name, sizeof(name), &sw[v]);
        report(path, v ? name : auto_name, bs, g, ceil);
        if (g.med > best.med)
            best = g, best_i = v;
    }
    xfer_kernels_tune(0, 0, 0);
    shape_name(name, sizeof(name), &sw[best_i]);
    printf("%-12s best: %s\n", path, name);
}

/* Batched copy of NBLK blocks of bs from src_dev to dst_dev, launched on on. */
static void bench_copy(const char *path, int src_dev, int dst_dev, int on, uint64_t bs)
{
    struct op o;
    memset(&o, 0, sizeof(o));
    uint64_t pool = (uint64_t)NBLK * bs;
    char *src = dev_alloc(src_dev, pool), *dst = dev_alloc(dst_dev, pool);
    uint32_t ps[NBLK], pd[NBLK];
    shuffle(ps, NBLK);
    shuffle(pd, NBLK);
    o.n = NBLK;
    o.bytes = pool;
    o.d = calloc(NBLK, sizeof(*o.d));
    o.dsts = calloc(NBLK, sizeof(void *));
    o.srcs = calloc(NBLK, sizeof(void *));
    o.sizes = calloc(NBLK, sizeof(size_t));
    for (size_t i = 0; i < NBLK; i++) {
        o.d[i] = (struct xfer_copy_desc){dst + pd[i] * bs, src + ps[i] * bs, bs};
        o.dsts[i] = o.d[i].dst;
        o.srcs[i] = o.d[i].src;
        o.sizes[i] = bs;
    }
    o.big_dst = dst, o.big_src = src, o.dst_dev = dst_dev, o.src_dev = src_dev;
    op_open(&o, on);

    struct gbs ceil = time_op(op_ceiling, &o);
    report(path, "ceiling (1 copy)", bs, ceil, ceil.med);
    sweep_run(path, sweep, NSWEEP, op_kernel, &o, "kernel (auto)", bs, ceil.med);
    report(path, "kernel (auto) one-shot", bs, time_op_oneshot(op_kernel, &o), ceil.med);
    report(path, "per-block memcpyAsync", bs, time_op(op_per_block, &o), ceil.med);
    report(path, "cudaMemcpyBatchAsync", bs, time_op(op_batch, &o), ceil.med);

    op_close(&o);
    CK(cudaFree(src));
    CK(cudaFree(dst));
    free(o.d), free(o.dsts), free(o.srcs), free(o.sizes);
}

#define KV_LAYERS 32
#define KV_BLOCKS 1024
#define KV_IDS    256

/* Gather from a pool on pool_dev into a buffer on buf_dev, then scatter a
 * buffer on pool_dev... each launched on `on`. */
static void bench_kv(const char *path, int a, int b, int on, uint64_t bb)
{
    struct op o;
    memset(&o, 0, sizeof(o));
    void *la[KV_LAYERS], *lb[KV_LAYERS];
    uint64_t ida[KV_IDS], idb[KV_IDS];
    for (int l = 0; l < KV_LAYERS; l++) { /* per-layer tensors, as vLLM has them */
        la[l] = dev_alloc(a, KV_BLOCKS * bb);
        lb[l] = dev_alloc(b, KV_BLOCKS * bb);
    }
    pick_ids(ida, KV_IDS, KV_BLOCKS);
    pick_ids(idb, KV_IDS, KV_BLOCKS);
    struct xfer_kv_layout A = {KV_LAYERS, KV_BLOCKS, bb, 0, la, NULL, 0};
    struct xfer_kv_layout Bl = {KV_LAYERS, KV_BLOCKS, bb, 0, lb, NULL, 0};
    uint64_t total = (uint64_t)KV_LAYERS * KV_IDS * bb;
    char *src_a = dev_alloc(a, total), *buf_b = dev_alloc(b, total);
    op_open(&o, on);
    o.bytes = total;
    o.n = KV_IDS;
    o.big_src = src_a, o.big_dst = buf_b, o.src_dev = a, o.dst_dev = b;
    struct gbs ceil = time_op(op_ceiling, &o);
    report(path, "kv ceiling (1 copy)", bb, ceil, ceil.med);
    for (int v = 0; v <= (skip_bulk ? 4 : 5); v++) {
        char g_name[40], s_name[40];
        snprintf(g_name, sizeof(g_name), "kv gather %s", variant_names[v]);
        snprintf(s_name, sizeof(s_name), "kv scatter %s", variant_names[v]);
        xfer_kernels_tune(0, 0, v);
        o.kv = &A, o.ids = ida, o.kvbuf = buf_b; /* gather a's blocks into b's buffer */
        report(path, g_name, bb, time_op(op_gather, &o), ceil.med);
        o.kv = &Bl, o.ids = idb, o.kvbuf = src_a; /* scatter a's buffer into b's blocks */
        report(path, s_name, bb, time_op(op_scatter, &o), ceil.med);
    }
    xfer_kernels_tune(0, 0, 0);
    op_close(&o);
    for (int l = 0; l < KV_LAYERS; l++) {
        CK(cudaFree(la[l]));
        CK(cudaFree(lb[l]));
    }
    CK(cudaFree(src_a));
    CK(cudaFree(buf_b));
}

static void bench_big(const char *path, int a, int b)
{
    struct op o;
    memset(&o, 0, sizeof(o));
    o.bytes = 1ull << 30;
    o.big_src = dev_alloc(a, o.bytes), o.big_dst = dev_alloc(b, o.bytes);
    o.src_dev = a, o.dst_dev = b;
    CK(cudaSetDevice(a));
    CK(cudaStreamCreateWithFlags(&o.st, cudaStreamNonBlocking));
    report(path, "ceiling 1 GiB copy", 1 << 20, time_op(op_ceiling, &o), 0);
    CK(cudaStreamDestroy(o.st));
    CK(cudaFree(o.big_src));
    CK(cudaFree(o.big_dst));
}

#define BR_LAYERS 32
#define BR_NB     2048 /* blocks per pool: [2, 2048, 16 KiB] per layer, 64 MiB */
#define BR_IDS    512
#define BR_LEN    16384

/* Grid shapes for the block runs (entry 0 automatic). */
static const struct shape br_sweep[] = {
    {0, 0, 0},       {0, 0, 1},       {0, 0, 2},       {0, 0, 5},        {131072, 64, 5},
    {262144, 64, 5}, {65536, 64, 5},  {32768, 64, 5},  {16384, 64, 5},   {8192, 64, 5},
    {16384, 128, 5}, {16384, 256, 1}, {16384, 256, 2}, {131072, 256, 2},
};

/* The KV pool request of issue 16 as block runs, one GPU or src -> dst. */
static void bench_block_runs(const char *path, int src_dev, int dst_dev, int on)
{
    struct op o;
    memset(&o, 0, sizeof(o));
    uint64_t layer = 2ull * BR_NB * BR_LEN;
    char *src[BR_LAYERS], *dst[BR_LAYERS];
    static uint64_t sid[BR_IDS], did[BR_IDS], base[2] = {0, (uint64_t)BR_NB * BR_LEN};
    static struct xfer_block_run run[BR_LAYERS];
    pick_ids(sid, BR_IDS, BR_NB);
    pick_ids(did, BR_IDS, BR_NB);
    for (int l = 0; l < BR_LAYERS; l++) {
        src[l] = dev_alloc(src_dev, layer);
        dst[l] = dev_alloc(dst_dev, layer);
        run[l] = (struct xfer_block_run){.a = dst[l],
                                         .b = src[l],
                                         .a_base = base,
                                         .b_base = base,
                                         .a_ids = did,
                                         .b_ids = sid,
                                         .a_stride = BR_LEN,
                                         .b_stride = BR_LEN,
                                         .len = BR_LEN,
                                         .nstreams = 2,
                                         .nids = BR_IDS,
                                         .s0 = 0,
                                         .s1 = 2 * BR_IDS,
                                         .a_is_dst = 1};
    }
    o.bytes = (uint64_t)BR_LAYERS * 2 * BR_IDS * BR_LEN;
    o.br = run, o.nbr = BR_LAYERS;
    o.big_src = dev_alloc(src_dev, o.bytes), o.big_dst = dev_alloc(dst_dev, o.bytes);
    o.src_dev = src_dev, o.dst_dev = dst_dev;
    op_open(&o, on);
    struct gbs ceil = time_op(op_ceiling, &o);
    report(path, "kvpool ceiling (1 copy)", BR_LEN, ceil, ceil.med);
    report(path, "kvpool ceiling one-shot", BR_LEN, time_op_oneshot(op_ceiling, &o), ceil.med);
    sweep_run(path, br_sweep, sizeof(br_sweep) / sizeof(br_sweep[0]), op_block_runs, &o,
              "blocks (auto)", BR_LEN, ceil.med);
    static const uint64_t os_chunk[] = {65536, 16384, 8192}; /* alone, bulk engine */
    for (size_t i = 0; i < 3 && !skip_bulk; i++) {
        char what[48];
        xfer_kernels_tune(os_chunk[i], 64, 5);
        snprintf(what, sizeof(what), "one-shot bulk c=%lluK",
                 (unsigned long long)os_chunk[i] >> 10);
        report(path, what, BR_LEN, time_op_oneshot(op_block_runs, &o), ceil.med);
    }
    xfer_kernels_tune(0, 0, 0);
    static const char *const up_names[] = {"param", "up", "same"};
    for (int m = 0; m < 3; m++) { /* how the runs reach the GPU (xfer_kernels_tune_upload) */
        char what[48];
        xfer_kernels_tune_upload(m);
        snprintf(what, sizeof(what), "blocks (auto) %s", up_names[m]);
        report(path, what, BR_LEN, time_op(op_block_runs, &o), ceil.med);
        snprintf(what, sizeof(what), "blocks (auto) one-shot %s", up_names[m]);
        report(path, what, BR_LEN, time_op_oneshot(op_block_runs, &o), ceil.med);
        printf("%-10s   host time of the launch call (%s): %.1f us\n", path, up_names[m],
               oneshot_call_us);
    }
    xfer_kernels_tune_upload(0);
    o.br_split = BR_LAYERS / 2; /* the ipc worker's two 256 MiB groups */
    report(path, "blocks (auto) 2 launches", BR_LEN, time_op(op_block_runs, &o), ceil.med);
    report(path, "blocks (auto) 2 l. one-shot", BR_LEN, time_op_oneshot(op_block_runs, &o),
           ceil.med);
    op_close(&o);
    for (int l = 0; l < BR_LAYERS; l++) {
        CK(cudaFree(src[l]));
        CK(cudaFree(dst[l]));
    }
    CK(cudaFree(o.big_src));
    CK(cudaFree(o.big_dst));
}

int main(int argc, char **argv)
{
    static const uint64_t sizes[] = {16384, 65536, 262144};
    int ndev = 0;
    bool blocks = argc > 1 && !strcmp(argv[1], "blocks");
    if (blocks)
        argc--, argv++;
    if (argc > 1)
        reps = atoi(argv[1]);
    if (reps < 3 || reps > MAXREPS)
        reps = 20;
    skip_bulk = getenv("XFER_BENCH_SKIP_BULK") != NULL;
    if (xfer_kernels_probe(&ndev)) {
        printf("skipped: no CUDA device\n");
        return 77;
    }
    struct cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, 0));
    printf("devices: %d x %s, %d SMs; %d blocks per batch; %d warm-ups, %d reps\n", ndev, p.name,
           p.multiProcessorCount, NBLK, WARM, reps);
    if (blocks) {
        bench_block_runs("gpu0", 0, 0, 0);
        if (ndev >= 2 && enable_peer(0, 1) && enable_peer(1, 0)) {
            bench_block_runs("0->1 push", 0, 1, 0);
            bench_block_runs("0->1 pull", 0, 1, 1);
        }
        return 0;
    }
    bench_big("gpu0", 0, 0);
    for (int i = 0; i < 3; i++)
        bench_copy("gpu0", 0, 0, 0, sizes[i]);
    for (int i = 0; i < 2; i++)
        bench_kv("gpu0", 0, 0, 0, sizes[i]);
    if (ndev >= 2 && enable_peer(0, 1) && enable_peer(1, 0)) {
        bench_big("gpu0->gpu1", 0, 1);
        for (int i = 0; i < 3; i++) {
            bench_copy("0->1 push", 0, 1, 0, sizes[i]);
            bench_copy("0->1 pull", 0, 1, 1, sizes[i]);
        }
        for (int i = 0; i < 2; i++)
            bench_kv("0->1 push", 0, 1, 0, sizes[i]);
    } else {
        printf("cross-GPU: not run (%d device(s) or no peer access)\n", ndev);
    }
    return 0;
}

#else
int main(void)
{
    printf("skipped: no CUDA device (built without CUDA)\n");
    return 77;
}
#endif
