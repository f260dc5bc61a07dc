/*
 * GPU regions through the engine between two processes: a forked target
 * node owns a GPU region on the last GPU and a host region; the initiator
 * (this process) owns the same pair on GPU 0 and moves random batches and KV
 * block lists both ways over one transport, for every pair of memory kinds.
 * The initiator keeps a host model of both sides; its own memory is compared
 * whole, the target's by a hash the target computes of its memory.
 *
 *   gpu_xfer [--transport tcp|ipc] [--bench]
 *
 * Without a CUDA device (CUDA-less build or no driver) it checks that GPU
 * regions over tcp fail cleanly with -XFER_ENODEV on both sides, then exits
 * 77. --bench adds GB/s of GPU->GPU vs host->host WRITE/READ (same run).
 */
#include "xfer.h"

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#if XFER_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#define REG_LEN     (32ull << 20)
#define BENCH_LEN   (512ull << 20)
#define BENCH_ITEM  (64ull << 20)
#define BLOCK_BYTES 4096u
#define LAYERS      4u
#define BLOCK       (BLOCK_BYTES * LAYERS)
#define NBLOCKS     (REG_LEN / BLOCK)
#define DEADLINE_MS 60000

static int failures;
#define FAIL(...)                                                                                  \
    do {                                                                                           \
        fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                       \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fputc('\n', stderr);                                                                       \
        failures++;                                                                                \
    } while (0)

/* ---- memory ------------------------------------------------------------------------ */

struct mem {
    char name[8]; /* "g", "h", "gb", "hb" */
    bool gpu;
    bool fake; /* host memory registered as CUDA: freed after the engine */
    int dev;
    uint8_t *p;
    size_t len;
    xfer_region *r;
};

static int gpu_count(void)
{
#if XFER_WITH_CUDA
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
#else
    return 0;
#endif
}

static void die(const char *what)
{
    fprintf(stderr, "gpu_xfer: %s\n", what);
    exit(1);
}

static void copy_out(const struct mem *m, void *dst, size_t off, size_t len)
{
#if XFER_WITH_CUDA
    if (m->gpu) {
        if (cudaMemcpy(dst, m->p + off, len, cudaMemcpyDeviceToHost) != cudaSuccess)
            die("cudaMemcpy D2H");
        return;
    }
#endif
    memcpy(dst, m->p + off, len);
}

static void copy_in(const struct mem *m, const void *src, size_t len)
{
#if XFER_WITH_CUDA
    if (m->gpu) {
        if (cudaMemcpy(m->p, src, len, cudaMemcpyHostToDevice) != cudaSuccess)
            die("cudaMemcpy H2D");
        return;
    }
#endif
    memcpy(m->p, src, len);
}

/* fake: a "GPU" region backed by host memory, to see the no-device errors. */
static void mem_make(xfer_engine *e, struct mem *m, const char *name, bool gpu, int dev, size_t len,
                     bool fake)
{
    snprintf(m->name, sizeof(m->name), "%s", name);
    m->gpu = gpu && !fake;
    m->fake = gpu && fake;
    m->dev = gpu ? dev : -1;
    m->len = len;
    int rc;
    if (!gpu) {
        if ((rc = xfer_region_alloc(e, name, len, XFER_ACCESS_RW, &m->r)) < 0)
            die("xfer_region_alloc");
        m->p = xfer_region_ptr(m->r);
    } else {
        if (fake) {
            m->p = calloc(1, len);
        } else {
#if XFER_WITH_CUDA
            if (cudaSetDevice(dev) != cudaSuccess || cudaMalloc((void **)&m->p, len) != cudaSuccess)
                die("cudaMalloc");
#endif
        }
        if (!m->p ||
            xfer_region_register(e, name, m->p, len, XFER_MEM_CUDA, dev, XFER_ACCESS_RW, &m->r) < 0)
            die("xfer_region_register");
    }
    struct xfer_layout l = {
        .dtype = "bf16", .block_bytes = BLOCK_BYTES, .num_blocks = len / BLOCK, .layers = LAYERS};
    xfer_region_set_layout(m->r, &l);
}

/* Word w of the fill is splitmix64(seed + w). */
static void fill(uint8_t *b, size_t len, uint64_t seed)
{
    for (size_t w = 0; w * 8 < len; w++) {
        uint64_t z = seed + (w + 1) * 0x9E3779B97F4A7C15ull;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        memcpy(b + w * 8, &z, len - w * 8 < 8 ? len - w * 8 : 8);
    }
}

static uint64_t hash(const uint8_t *b, size_t len)
{
    uint64_t h = 0xcbf29ce484222325ull;
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t w;
        memcpy(&w, b + i, 8);
        h = (h ^ w) * 0x100000001b3ull;
        h ^= h >> 29;
    }
    for (; i < len; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* ---- the target process ------------------------------------------------------------ */

enum { CMD_FILL = 1, CMD_HASH, CMD_ADOPT, CMD_DROP, CMD_QUIT };
struct cmd {
    int op;
    int region; /* index into the target's mems */
    uint64_t seed;
    uint8_t handle[64]; /* CMD_ADOPT: the initiator's cudaIpcGetMemHandle */
};
struct adopted {
    int rc;
    char why[200];
    struct xfer_region_desc rd;
};
#define ADOPT_OFF 4096u
#define ADOPT_LEN (4u << 20)
struct hello {
    int ngpu;
    struct xfer_peer_desc peer;
    int n;
    struct xfer_region_desc rd[4];
};

static void xread(int fd, void *p, size_t len)
{
    size_t got = 0;
    while (got < len) {
        ssize_t n = read(fd, (char *)p + got, len - got);
        if (n <= 0)
            die("pipe read");
        got += (size_t)n;
    }
}

static void xwrite(int fd, const void *p, size_t len)
{
    if (write(fd, p, len) != (ssize_t)len)
        die("pipe write");
}

static xfer_engine *engine(const char *id, unsigned transports)
{
    struct xfer_engine_config cfg;
    xfer_engine_config_init(&cfg);
    cfg.node_id = id;
    cfg.transports = transports;
    int rc;
    xfer_engine *e = xfer_engine_new(&cfg, &rc);
    if (!e)
        die("xfer_engine_new");
    return e;
}

static int target_main(int in, int out, unsigned transports, bool bench)
{
    struct hello h = {.ngpu = gpu_count()};
    xfer_engine *e = engine("target", transports);
    struct mem m[4] = {0};
    int last = h.ngpu > 0 ? h.ngpu - 1 : 0;
    mem_make(e, &m[0], "g", true, last, REG_LEN, h.ngpu == 0);
    mem_make(e, &m[1], "h", false, -1, REG_LEN, false);
    h.n = 2;
    if (bench) {
        mem_make(e, &m[2], "gb", true, last, BENCH_LEN, h.ngpu == 0);
        mem_make(e, &m[3], "hb", false, -1, BENCH_LEN, false);
        h.n = 4;
    }
    xfer_engine_describe(e, &h.peer);
    for (int i = 0; i < h.n; i++)
        xfer_region_describe(m[i].r, &h.rd[i]);
    xwrite(out, &h, sizeof(h));
    uint8_t *shadow = malloc(h.n > 2 ? BENCH_LEN : REG_LEN); /* the largest region */
    xfer_region *adopted = NULL;
    for (;;) {
        struct cmd c;
        xread(in, &c, sizeof(c));
        if (c.op == CMD_QUIT)
            break;
        if (c.op == CMD_ADOPT) { /* GPU memory of the other process, by handle */
            struct adopted a = {0};
            a.rc = xfer_region_adopt_cuda(e, "adopted", c.handle, sizeof(c.handle), 0, ADOPT_OFF,
                                          ADOPT_LEN, XFER_ACCESS_RW, &adopted);
            snprintf(a.why, sizeof(a.why), "%s", xfer_engine_last_error(e));
            if (a.rc == 0)
                xfer_region_describe(adopted, &a.rd);
            xwrite(out, &a, sizeof(a));
            continue;
        }
        if (c.op == CMD_DROP) {
            uint64_t rc = (uint64_t)xfer_region_deregister(e, adopted);
            adopted = NULL;
            xwrite(out, &rc, sizeof(rc));
            continue;
        }
        struct mem *r = &m[c.region];
        if (c.op == CMD_FILL) {
            fill(shadow, r->len, c.seed);
            copy_in(r, shadow, r->len);
            xwrite(out, &c.seed, sizeof(c.seed));
        } else {
            copy_out(r, shadow, 0, r->len);
            uint64_t v = hash(shadow, r->len);
            xwrite(out, &v, sizeof(v));
        }
    }
    free(shadow);
    xfer_engine_free(e);
    for (int i = 0; i < 4; i++)
        if (m[i].fake)
            free(m[i].p);
    return 0;
}

/* ---- initiator --------------------------------------------------------------------- */

struct ctx {
    xfer_engine *e;
    xfer_peer *p;
    int to, from;
    struct hello h;
    struct mem mine[4];
    uint8_t *model_l, *model_r; /* expected contents of both sides */
    uint64_t rng;
};

static uint64_t rnd(struct ctx *c)
{
    c->rng ^= c->rng << 13;
    c->rng ^= c->rng >> 7;
    c->rng ^= c->rng << 17;
    return c->rng;
}

static uint64_t remote_cmd(struct ctx *c, int op, int region, uint64_t seed)
{
    struct cmd k = {.op = op, .region = region, .seed = seed};
    uint64_t v;
    xwrite(c->to, &k, sizeof(k));
    xread(c->from, &v, sizeof(v));
    return v;
}

/* Both sides get fresh patterns; the model follows. */
static void reset_pair(struct ctx *c, struct mem *l, int ri)
{
    uint64_t s1 = rnd(c), s2 = rnd(c);
    fill(c->model_l, REG_LEN, s1);
    copy_in(l, c->model_l, REG_LEN);
    fill(c->model_r, REG_LEN, s2);
    remote_cmd(c, CMD_FILL, ri, s2);
}

static void verify(struct ctx *c, struct mem *l, int ri, const char *what)
{
    uint8_t *got = malloc(REG_LEN);
    copy_out(l, got, 0, REG_LEN);
    if (memcmp(got, c->model_l, REG_LEN)) {
        size_t i = 0;
        while (got[i] == c->model_l[i])
            i++;
        FAIL("%s: local %s differs from the model at byte %zu", what, l->name, i);
    }
    free(got);
    if (remote_cmd(c, CMD_HASH, ri, 0) != hash(c->model_r, REG_LEN))
        FAIL("%s: remote %s differs from the model (hash)", what, c->h.rd[ri].name);
}

static int run_batch(struct ctx *c, xfer_batch *b, const char *what)
{
    int rc = xfer_batch_submit(b, DEADLINE_MS);
    if (rc == 0)
        rc = xfer_batch_wait(b, -1);
    if (rc < 0) {
        for (size_t i = 0; i < xfer_batch_count(b); i++)
            if (xfer_batch_item_status(b, i) < 0) {
                FAIL("%s: item %zu: %s (%s)", what, i, xfer_strerror(xfer_batch_item_status(b, i)),
                     xfer_batch_item_error(b, i));
                break;
            }
    }
    (void)c;
    return rc;
}

/* k items with disjoint destination slots, random sources, random lengths. */
static void random_batch(struct ctx *c, struct mem *l, int ri, enum xfer_op op, size_t k)
{
    xfer_batch *b = xfer_batch_new(c->e, NULL);
    uint64_t slot = REG_LEN / k;
    uint8_t *dst_model = op == XFER_OP_WRITE ? c->model_r : c->model_l;
    const uint8_t *src_model = op == XFER_OP_WRITE ? c->model_l : c->model_r;
    for (size_t i = 0; i < k; i++) {
        uint64_t len = rnd(c) % (slot / 2 + 1);
        if (i == 0 && k == 1)
            len = slot / 2 + 12345; /* several staging slots, odd tail */
        uint64_t doff = i * slot + rnd(c) % (slot - len + 1);
        uint64_t soff = rnd(c) % (REG_LEN - len + 1);
        struct xfer_item it = {.op = op,
                               .local = l->r,
                               .peer = c->p,
                               .remote_id = c->h.rd[ri].id,
                               .remote_gen = c->h.rd[ri].gen,
                               .len = len};
        it.local_off = op == XFER_OP_WRITE ? soff : doff;
        it.remote_off = op == XFER_OP_WRITE ? doff : soff;
        if (xfer_batch_add(b, &it) < 0)
            die("xfer_batch_add");
        memcpy(dst_model + doff, src_model + soff, len);
    }
    char what[96];
    snprintf(what, sizeof(what), "%s %s<->%s %zu items", op == XFER_OP_WRITE ? "WRITE" : "READ",
             l->name, c->h.rd[ri].name, k);
    run_batch(c, b, what);
    xfer_batch_free(b);
    verify(c, l, ri, what);
}

/* n distinct random block ids with runs of consecutive ones mixed in. */
static void block_ids(struct ctx *c, uint64_t *ids, size_t n)
{
    static uint8_t used[NBLOCKS];
    memset(used, 0, sizeof(used));
    for (size_t i = 0; i < n;) {
        uint64_t start = rnd(c) % NBLOCKS, run = 1 + rnd(c) % 4;
        for (uint64_t j = 0; j < run && i < n && start + j < NBLOCKS && !used[start + j]; j++) {
            used[start + j] = 1;
            ids[i++] = start + j;
        }
    }
}

static void block_batch(struct ctx *c, struct mem *l, int ri, enum xfer_op op, size_t n)
{
    uint64_t *lids = malloc(n * sizeof(*lids)), *rids = malloc(n * sizeof(*rids));
    block_ids(c, lids, n);
    block_ids(c, rids, n);
    xfer_batch *b = xfer_batch_new(c->e, NULL);
    int items =
        xfer_batch_add_blocks(b, op, l->r, lids, c->p, c->h.rd[ri].id, c->h.rd[ri].gen, rids, n);
    if (items <= 0)
        FAIL("xfer_batch_add_blocks: %d %s", items, xfer_engine_last_error(c->e));
    for (size_t i = 0; i < n; i++) {
        if (op == XFER_OP_WRITE)
            memcpy(c->model_r + rids[i] * BLOCK, c->model_l + lids[i] * BLOCK, BLOCK);
        else
            memcpy(c->model_l + lids[i] * BLOCK, c->model_r + rids[i] * BLOCK, BLOCK);
    }
    char what[96];
    snprintf(what, sizeof(what), "blocks %s %s<->%s %zu blocks in %d items",
             op == XFER_OP_WRITE ? "WRITE" : "READ", l->name, c->h.rd[ri].name, n, items);
    run_batch(c, b, what);
    xfer_batch_free(b);
    verify(c, l, ri, what);
    printf("  %s\n", what);
    free(lids);
    free(rids);
}

static void pair_tests(struct ctx *c, struct mem *l, int ri)
{
    const size_t ks[] = {1, 8, 64, 512};
    int before = failures;
    reset_pair(c, l, ri);
    for (size_t i = 0; i < sizeof(ks) / sizeof(ks[0]); i++) {
        random_batch(c, l, ri, XFER_OP_WRITE, ks[i]);
        random_batch(c, l, ri, XFER_OP_READ, ks[i]);
    }
    block_batch(c, l, ri, XFER_OP_WRITE, 300);
    block_batch(c, l, ri, XFER_OP_READ, 300);
    printf("%s %s -> %s (and back): random batches of 1..512 items + KV blocks\n",
           failures == before ? "ok  " : "FAIL", l->name[0] == 'g' ? "gpu" : "host",
           c->h.rd[ri].kind == XFER_MEM_CUDA ? "gpu" : "host");
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* Best of 3 of BENCH_LEN moved in BENCH_ITEM items. */
static double bench_one(struct ctx *c, struct mem *l, int ri, enum xfer_op op)
{
    double best = 0;
    for (int rep = 0; rep < 4; rep++) { /* the first one warms up */
        xfer_batch *b = xfer_batch_new(c->e, NULL);
        for (uint64_t off = 0; off < BENCH_LEN; off += BENCH_ITEM) {
            struct xfer_item it = {.op = op,
                                   .local = l->r,
                                   .local_off = off,
                                   .peer = c->p,
                                   .remote_id = c->h.rd[ri].id,
                                   .remote_gen = c->h.rd[ri].gen,
                                   .remote_off = off,
                                   .len = BENCH_ITEM};
            xfer_batch_add(b, &it);
        }
        double t0 = now_s();
        int rc = run_batch(c, b, "bench");
        double dt = now_s() - t0;
        xfer_batch_free(b);
        if (rc < 0)
            return 0;
        if (rep > 0 && BENCH_LEN / dt / 1e9 > best)
            best = BENCH_LEN / dt / 1e9;
    }
    return best;
}

static void bench(struct ctx *c, const char *tname)
{
    struct mem *gb = &c->mine[2], *hb = &c->mine[3];
    uint8_t *tmp = malloc(BENCH_LEN);
    fill(tmp, BENCH_LEN, 7); /* touch every page before timing */
    copy_in(gb, tmp, BENCH_LEN);
    copy_in(hb, tmp, BENCH_LEN);
    free(tmp);
    remote_cmd(c, CMD_FILL, 2, 8);
    remote_cmd(c, CMD_FILL, 3, 9);
    double hw = bench_one(c, hb, 3, XFER_OP_WRITE), hr = bench_one(c, hb, 3, XFER_OP_READ);
    double gw = bench_one(c, gb, 2, XFER_OP_WRITE), gr = bench_one(c, gb, 2, XFER_OP_READ);
    printf("bench %s, %llu MiB in %llu MiB items, best of 3, GB/s:\n", tname,
           (unsigned long long)(BENCH_LEN >> 20), (unsigned long long)(BENCH_ITEM >> 20));
    printf("  host->host WRITE %.2f READ %.2f\n", hw, hr);
    printf("  gpu%d->gpu%d WRITE %.2f READ %.2f (ratio to host %.2f / %.2f)\n", gb->dev,
           c->h.rd[2].device, gw, gr, hw > 0 ? gw / hw : 0, hr > 0 ? gr / hr : 0);
}

/* No CUDA device: GPU regions over tcp fail with -XFER_ENODEV on both sides. */
static int no_device_checks(struct ctx *c)
{
    struct mem fake = {0};
    mem_make(c->e, &fake, "fake", true, 0, 1 << 20, true);
    struct {
        struct mem *l;
        int ri;
        enum xfer_op op;
        const char *what;
    } cases[] = {
        {&c->mine[1], 0, XFER_OP_WRITE, "host -> target's GPU region"},
        {&c->mine[1], 0, XFER_OP_READ, "target's GPU region -> host"},
        {&fake, 1, XFER_OP_WRITE, "local GPU region -> target host"},
        {&fake, 1, XFER_OP_READ, "target host -> local GPU region"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        xfer_batch *b = xfer_batch_new(c->e, NULL);
        struct xfer_item it = {.op = cases[i].op,
                               .local = cases[i].l->r,
                               .peer = c->p,
                               .remote_id = c->h.rd[cases[i].ri].id,
                               .remote_gen = c->h.rd[cases[i].ri].gen,
                               .len = 100000};
        xfer_batch_add(b, &it);
        int rc = xfer_batch_submit(b, 10000);
        if (rc == 0)
            rc = xfer_batch_wait(b, -1);
        const char *why = xfer_batch_item_error(b, 0);
        if (rc != -XFER_ENODEV && rc != -XFER_ENOTSUP)
            FAIL("%s: got %s (%s), want ENODEV", cases[i].what, xfer_strerror(rc), why);
        else
            printf("ok   no device: %s: %s (%s)\n", cases[i].what, xfer_strerror(rc), why);
        xfer_batch_free(b);
    }
    /* host <-> host still works next to them */
    reset_pair(c, &c->mine[1], 1);
    random_batch(c, &c->mine[1], 1, XFER_OP_WRITE, 8);
    random_batch(c, &c->mine[1], 1, XFER_OP_READ, 8);
    xfer_region_deregister(c->e, fake.r);
    free(fake.p);
    return failures ? 1 : 77;
}

/* GPU memory of this process, handed to the target as a CUDA IPC handle
 * (xfer_region_adopt_cuda there), then written and read over tcp: the
 * bytes must land in this process's allocation. */
static void adopt_test(struct ctx *c)
{
#if XFER_WITH_CUDA
    uint8_t *a = NULL;
    struct cmd k = {.op = CMD_ADOPT};
    cudaIpcMemHandle_t h;
    if (cudaSetDevice(0) || cudaMalloc((void **)&a, ADOPT_OFF + ADOPT_LEN) ||
        cudaMemset(a, 0, ADOPT_OFF + ADOPT_LEN) || cudaIpcGetMemHandle(&h, a))
        die("cudaMalloc/cudaIpcGetMemHandle");
    memcpy(k.handle, &h, sizeof(h));
    xwrite(c->to, &k, sizeof(k));
    struct adopted ad;
    xread(c->from, &ad, sizeof(ad));
    if (ad.rc < 0) {
        FAIL("xfer_region_adopt_cuda: %s (%s)", xfer_strerror(ad.rc), ad.why);
        return;
    }
    if (ad.rd.kind != XFER_MEM_CUDA || ad.rd.len != ADOPT_LEN)
        FAIL("adopted region: kind %d len %llu", ad.rd.kind, (unsigned long long)ad.rd.len);
    xfer_peer_region_add(c->p, &ad.rd);
    struct mem *hm = &c->mine[1];
    fill(c->model_l, REG_LEN, 4242);
    copy_in(hm, c->model_l, REG_LEN);
    int rc = xfer_write(c->e, hm->r, 123, c->p, ad.rd.id, ad.rd.gen, 0, ADOPT_LEN, DEADLINE_MS);
    uint8_t *got = malloc(ADOPT_LEN);
    if (rc == 0 && cudaMemcpy(got, a + ADOPT_OFF, ADOPT_LEN, cudaMemcpyDeviceToHost))
        die("cudaMemcpy");
    if (rc < 0 || memcmp(got, c->model_l + 123, ADOPT_LEN))
        FAIL("WRITE into the adopted region: %s", xfer_strerror(rc));
    rc = xfer_read(c->e, hm->r, 1 << 20, c->p, ad.rd.id, ad.rd.gen, 0, ADOPT_LEN, DEADLINE_MS);
    copy_out(hm, got, 1 << 20, ADOPT_LEN);
    if (rc < 0 || memcmp(got, c->model_l + 123, ADOPT_LEN))
        FAIL("READ from the adopted region: %s", xfer_strerror(rc));
    free(got);
    k.op = CMD_DROP;
    uint64_t drc;
    xwrite(c->to, &k, sizeof(k));
    xread(c->from, &drc, sizeof(drc));
    if (drc)
        FAIL("deregistering the adopted region: %s", xfer_strerror((int)drc));
    cudaFree(a);
    printf("%s adopted CUDA IPC handle on GPU %d: WRITE/READ over tcp land in the "
           "exporter's allocation\n",
           failures ? "FAIL" : "ok  ", ad.rd.device);
#else
    (void)c;
#endif
}

static int initiator_main(struct ctx *c, unsigned transports, bool bench_on, const char *tname)
{
    xread(c->from, &c->h, sizeof(c->h));
    c->e = engine("initiator", transports);
    int rc = xfer_peer_add(c->e, &c->h.peer, &c->p);
    if (rc < 0)
        die("xfer_peer_add");
    for (int i = 0; i < c->h.n; i++)
        xfer_peer_region_add(c->p, &c->h.rd[i]);
    char tn[32];
    xfer_transports_format(xfer_peer_transport(c->p), tn, sizeof(tn));
    printf("transport %s; %d GPU(s) visible\n", tn, c->h.ngpu);
    c->model_l = malloc(REG_LEN);
    c->model_r = malloc(REG_LEN);
    c->rng = 0x9e3779b97f4a7c15ull;
    mem_make(c->e, &c->mine[1], "h", false, -1, REG_LEN, false);
    bool emulate = getenv("XFER_GPU_STAGE_EMULATE") && !strcmp(tname, "tcp");
#if !XFER_WITH_CUDA
    if (emulate) { /* the staging ring is CUDA code: not in this build */
        printf("skipped: built without CUDA (XFER_WITH_CUDA=0): no GPU staging to emulate\n");
        return 77;
    }
#endif
    if ((c->h.ngpu == 0 || gpu_count() == 0) && emulate) {
        /* "GPU" regions are host memory, the staging ring copies with memcpy:
         * tcp's staging logic (slots, pipelining, acks, landing) runs here */
        mem_make(c->e, &c->mine[0], "g", true, 0, REG_LEN, true);
        for (int l = 0; l < 2; l++)
            for (int r = 0; r < 2; r++)
                pair_tests(c, &c->mine[l], r);
        if (bench_on) { /* exercises the bench code; the numbers mean nothing */
            mem_make(c->e, &c->mine[2], "gb", true, 0, BENCH_LEN, true);
            mem_make(c->e, &c->mine[3], "hb", false, -1, BENCH_LEN, false);
            bench(c, "tcp (emulated GPU staging)");
        }
        printf("emulated GPU staging (XFER_GPU_STAGE_EMULATE, no CUDA device): %s\n",
               failures ? "FAILED" : "passed");
        return failures ? 1 : 0;
    }
    if (c->h.ngpu == 0 || gpu_count() == 0) {
        rc = strcmp(tname, "tcp") ? 77 : no_device_checks(c);
        if (rc == 77)
            printf("skipped: no CUDA device (GPU paths not exercised)\n");
        return rc;
    }
    mem_make(c->e, &c->mine[0], "g", true, 0, REG_LEN, false);
    for (int l = 0; l < 2; l++)
        for (int r = 0; r < 2; r++)
            pair_tests(c, &c->mine[l], r);
    if (!strcmp(tname, "tcp")) /* over ipc we would open our own handle */
        adopt_test(c);
    if (bench_on) {
        mem_make(c->e, &c->mine[2], "gb", true, 0, BENCH_LEN, false);
        mem_make(c->e, &c->mine[3], "hb", false, -1, BENCH_LEN, false);
        bench(c, tname);
    }
    return failures ? 1 : 0;
}

int main(int argc, char **argv)
{
    const char *tname = "tcp";
    bool bench_on = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--transport") && i + 1 < argc)
            tname = argv[++i];
        else if (!strcmp(argv[i], "--bench"))
            bench_on = true;
        else {
            fprintf(stderr, "usage: gpu_xfer [--transport tcp|ipc] [--bench]\n");
            return 2;
        }
    }
    unsigned transports;
    if (xfer_transports_parse(tname, &transports) < 0)
        die("bad --transport");
    int down[2], up[2];
    if (pipe(down) || pipe(up))
        die("pipe");
    setvbuf(stdout, NULL, _IOLBF, 0);
    pid_t pid = fork(); /* before anything touches CUDA */
    if (pid < 0)
        die("fork");
    if (pid == 0) {
        close(down[1]);
        close(up[0]);
        _exit(target_main(down[0], up[1], transports, bench_on));
    }
    close(down[0]);
    close(up[1]);
    struct ctx c = {.to = down[1], .from = up[0]};
    int rc = initiator_main(&c, transports, bench_on, tname);
    struct cmd q = {.op = CMD_QUIT};
    xwrite(c.to, &q, sizeof(q));
    int st;
    waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "FAIL target exited abnormally (status %d)\n", st);
        rc = 1;
    }
    xfer_engine_free(c.e);
    for (int i = 0; i < 4; i++)
        if (c.mine[i].fake)
            free(c.mine[i].p);
    free(c.model_l);
    free(c.model_r);
    return rc;
}
