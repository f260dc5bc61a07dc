/*
 * Many tiny GPU items over tcp's staging path (engine/tcp/tcp_gpu.c), the
 * shape of the GPU request ring's rate bench: 64-byte WRITEs and READs
 * between GPU regions of two processes (a forked target), posted in batches
 * of 256 and 1024 with up to 4096 items in flight, then the latency of one
 * 4 KiB item against one 64 KiB item.
 *
 *   gpu_flood [--items N]
 *
 * With a CUDA device the regions are device memory (initiator GPU 0, target
 * the last GPU). Without one, XFER_GPU_STAGE_EMULATE=1 must be set: "GPU"
 * regions are host memory and the staging ring copies with memcpy, so the
 * slot accounting, re-driving and acks of tcp_gpu.c run here; with
 * XFER_GPU_STAGE_EMULATE_SMALL_US=2000 each small copy also takes 2 ms, as a
 * small H2D that waits for another process's kernel on the GPU (the ring
 * bench's stall: four slots, so four items per 2 ms). Every wait has a
 * deadline: a stalled or crawling staging path fails with how far it got.
 * 77 = no device and no emulation.
 */
#include "xfer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef XFER_WITH_CUDA
#define XFER_WITH_CUDA 0 /* the Makefile defines it only when CUDA is on */
#endif
#if XFER_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#define TINY        64u
#define IN_FLIGHT   4096u /* items outstanding at most, as the ring bench */
#define REG_LEN     (4u << 20)
#define DEADLINE_MS 5000 /* one flood: < 0.5 s here, even with 2 ms per small copy */
#define LAT_ITERS   200

static int failures;
#define FAIL(...)                                                                                  \
    do {                                                                                           \
        fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                       \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fputc('\n', stderr);                                                                       \
        failures++;                                                                                \
    } while (0)

static void die(const char *what)
{
    fprintf(stderr, "gpu_flood: %s\n", what);
    exit(1);
}

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

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

/* A GPU region: device memory, or host memory registered as CUDA (emulated). */
struct gmem {
    uint8_t *p;
    bool real;
    xfer_region *r;
};

static void gmem_make(xfer_engine *e, struct gmem *m, int dev, bool real)
{
    m->real = real;
#if XFER_WITH_CUDA
    if (real && (cudaSetDevice(dev) != cudaSuccess || cudaMalloc((void **)&m->p, REG_LEN)))
        die("cudaMalloc");
#endif
    if (!real && !(m->p = calloc(1, REG_LEN)))
        die("calloc");
    if (xfer_region_register(e, "g", m->p, REG_LEN, XFER_MEM_CUDA, dev, XFER_ACCESS_RW, &m->r) < 0)
        die("xfer_region_register");
}

static void gmem_io(struct gmem *m, uint8_t *host, bool to_dev)
{
#if XFER_WITH_CUDA
    if (m->real) {
        if (to_dev ? cudaMemcpy(m->p, host, REG_LEN, cudaMemcpyHostToDevice)
                   : cudaMemcpy(host, m->p, REG_LEN, cudaMemcpyDeviceToHost))
            die("cudaMemcpy");
        return;
    }
#endif
    memcpy(to_dev ? m->p : host, to_dev ? host : m->p, REG_LEN);
}

static uint64_t hash(const uint8_t *b, size_t len)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static void pattern(uint8_t *b, uint8_t seed)
{
    for (size_t i = 0; i < REG_LEN; i++)
        b[i] = (uint8_t)(i * 31 + seed + (i >> 12));
}

static xfer_engine *engine(const char *id)
{
    struct xfer_engine_config cfg;
    xfer_engine_config_init(&cfg);
    cfg.node_id = id;
    cfg.transports = XFER_TRANSPORT_TCP;
    xfer_engine *e = xfer_engine_new(&cfg, NULL);
    if (!e)
        die("xfer_engine_new");
    return e;
}

struct hello {
    int ngpu;
    struct xfer_peer_desc peer;
    struct xfer_region_desc rd;
};

/* Target: owns the region; each byte read from `in` is a command: 'f' fill
 * with the pattern (answers 1), 'h' hash (answers it), 'q' quit. */
static int target_main(int in, int out)
{
    struct hello h = {.ngpu = gpu_count()};
    xfer_engine *e = engine("flood-target");
    struct gmem m = {0};
    gmem_make(e, &m, h.ngpu > 0 ? h.ngpu - 1 : 0, h.ngpu > 0);
    xfer_engine_describe(e, &h.peer);
    xfer_region_describe(m.r, &h.rd);
    uint8_t *host = malloc(REG_LEN);
    if (!host || write(out, &h, sizeof(h)) != sizeof(h))
        die("hello");
    char c;
    while (read(in, &c, 1) == 1 && c != 'q') {
        uint64_t v = 1;
        if (c == 'f') {
            pattern(host, 7);
            gmem_io(&m, host, true);
        } else {
            gmem_io(&m, host, false);
            v = hash(host, REG_LEN);
        }
        if (write(out, &v, sizeof(v)) != sizeof(v))
            die("pipe");
    }
    xfer_engine_free(e);
    if (!m.real)
        free(m.p);
    free(host);
    return 0;
}

struct ctx {
    xfer_engine *e;
    xfer_peer *p;
    struct hello h;
    struct gmem g;
    int to, from;
};

static uint64_t remote(struct ctx *c, char cmd)
{
    uint64_t v = 0;
    if (write(c->to, &cmd, 1) != 1 || read(c->from, &v, sizeof(v)) != sizeof(v))
        die("pipe to the target");
    return v;
}

/* Item k moves TINY bytes between slot k on both sides, mirrored so that
 * WRITE and READ touch different bytes of the source pattern. */
static struct xfer_item tiny_item(struct ctx *c, enum xfer_op op, uint64_t k)
{
    struct xfer_item it = {.op = op,
                           .local = c->g.r,
                           .local_off = k * TINY,
                           .peer = c->p,
                           .remote_id = c->h.rd.id,
                           .remote_gen = c->h.rd.gen,
                           .remote_off = (REG_LEN / TINY - 1 - k) * TINY,
                           .len = TINY};
    return it;
}

/* n tiny items of op in batches of per_batch, IN_FLIGHT at most in flight,
 * all within DEADLINE_MS: 0, or -1 (reported). */
static int flood(struct ctx *c, enum xfer_op op, uint64_t n, size_t per_batch)
{
    size_t nb = IN_FLIGHT / per_batch, head = 0, live = 0;
    xfer_batch **b = calloc(nb, sizeof(*b));
    uint64_t posted = 0, done = 0;
    double t0 = now_ms(), end = t0 + DEADLINE_MS;
    int rc = 0;
    for (size_t i = 0; i < nb; i++)
        if (!(b[i] = xfer_batch_new(c->e, NULL)))
            die("xfer_batch_new");
    while (rc == 0 && done < n) {
        while (live < nb && posted < n) { /* fill the window */
            xfer_batch *x = b[(head + live) % nb];
            xfer_batch_reset(x);
            for (size_t i = 0; i < per_batch && posted < n; i++, posted++) {
                struct xfer_item it = tiny_item(c, op, posted);
                if (xfer_batch_add(x, &it) < 0)
                    die("xfer_batch_add");
            }
            if ((rc = xfer_batch_submit(x, DEADLINE_MS)) < 0)
                break;
            live++;
        }
        int left = (int)(end - now_ms());
        xfer_batch *old = b[head];
        if (rc == 0)
            rc = xfer_batch_wait(old, left > 0 ? left : 0);
        if (rc == -XFER_EINPROGRESS)
            rc = -XFER_ETIMEDOUT;
        if (rc == 0) {
            done += xfer_batch_count(old);
            head = (head + 1) % nb;
            live--;
        }
    }
    double ms = now_ms() - t0;
    const char *what = op == XFER_OP_WRITE ? "WRITE" : "READ";
    if (rc < 0)
        FAIL("%s flood, batches of %zu: %s after %.0f ms: %llu of %llu done, %llu posted "
             "(staging path stalled?)",
             what, per_batch, xfer_strerror(rc), ms, (unsigned long long)done,
             (unsigned long long)n, (unsigned long long)posted);
    else
        printf("ok   %s gpu -> gpu, %llu x %u B, batches of %zu, %u in flight: %.0f ms "
               "(%.0f items/s)\n",
               what, (unsigned long long)n, TINY, per_batch, IN_FLIGHT, ms, n / ms * 1e3);
    for (size_t i = 0; i < nb; i++)
        xfer_batch_free(b[i]); /* cancels a stalled one */
    free(b);
    return rc < 0 ? -1 : 0;
}

/* IN_FLIGHT tiny items of op submitted, then cancelled while in flight:
 * whatever slots and pins they held must come back (the next floods pass). */
static void cancel_burst(struct ctx *c, enum xfer_op op, uint64_t n)
{
    xfer_batch *b[IN_FLIGHT / 256];
    for (size_t i = 0; i < IN_FLIGHT / 256; i++) {
        if (!(b[i] = xfer_batch_new(c->e, NULL)))
            die("xfer_batch_new");
        for (uint64_t k = i * 256; k < (i + 1) * 256 && k < n; k++) {
            struct xfer_item it = tiny_item(c, op, k);
            if (xfer_batch_add(b[i], &it) < 0)
                die("xfer_batch_add");
        }
        if (xfer_batch_submit(b[i], DEADLINE_MS) < 0)
            die("xfer_batch_submit");
    }
    for (size_t i = 0; i < IN_FLIGHT / 256; i++) {
        xfer_batch_cancel(b[i]);
        xfer_batch_free(b[i]);
    }
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median us of one xfer_write of len bytes, GPU -> GPU. */
static double latency_us(struct ctx *c, uint64_t len)
{
    double v[LAT_ITERS];
    for (int i = 0; i < LAT_ITERS; i++) {
        double t0 = now_ms();
        int rc = xfer_write(c->e, c->g.r, 0, c->p, c->h.rd.id, c->h.rd.gen, 0, len, 10000);
        v[i] = (now_ms() - t0) * 1e3;
        if (rc < 0) {
            FAIL("xfer_write of %llu B: %s", (unsigned long long)len, xfer_strerror(rc));
            return -1;
        }
    }
    qsort(v, LAT_ITERS, sizeof(v[0]), cmp_d);
    return v[LAT_ITERS / 2];
}

static void run(struct ctx *c, uint64_t n)
{
    uint8_t *host = malloc(REG_LEN), *want = malloc(REG_LEN);
    pattern(host, 3);
    gmem_io(&c->g, host, true);
    remote(c, 'f');
    /* the model: WRITE item k copies local slot k to remote slot mirror(k) */
    pattern(want, 7);
    for (uint64_t k = 0; k < n; k++)
        memcpy(want + (REG_LEN / TINY - 1 - k) * TINY, host + k * TINY, TINY);
    static const size_t shapes[] = {256, 1024};
    for (size_t s = 0; s < 2; s++)
        if (flood(c, XFER_OP_WRITE, n, shapes[s]) < 0)
            break;
    if (!failures && remote(c, 'h') != hash(want, REG_LEN))
        FAIL("the target's region differs from the model after the WRITE floods");
    /* READ the same slots back into the local region: it becomes the model's
     * mirror image of the target's bytes */
    for (size_t s = 0; s < 2 && !failures; s++)
        if (flood(c, XFER_OP_READ, n, shapes[s]) < 0)
            break;
    /* the same items again after a cancelled burst of each op: same bytes */
    for (int again = 0; again < 2 && !failures; again++) {
        gmem_io(&c->g, host, false);
        for (uint64_t k = 0; k < n && !failures; k++)
            if (memcmp(host + k * TINY, want + (REG_LEN / TINY - 1 - k) * TINY, TINY)) {
                FAIL("READ flood: local slot %llu differs", (unsigned long long)k);
                break;
            }
        if (again || failures)
            break;
        cancel_burst(c, XFER_OP_WRITE, n);
        cancel_burst(c, XFER_OP_READ, n);
        printf("ok   4096 WRITEs and 4096 READs cancelled in flight\n");
        if (flood(c, XFER_OP_WRITE, n, 256) == 0 && remote(c, 'h') != hash(want, REG_LEN))
            FAIL("the target's region differs from the model after the cancelled burst");
        if (!failures)
            flood(c, XFER_OP_READ, n, 256);
    }
    if (!failures) {
        double small = latency_us(c, 4096), big = latency_us(c, 65536);
        printf("ok   latency of one xfer_write gpu -> gpu, median of %d: 4 KiB %.1f us, 64 KiB "
               "%.1f us\n",
               LAT_ITERS, small, big);
    }
    free(host);
    free(want);
}

int main(int argc, char **argv)
{
    uint64_t n = 16384;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--items") && i + 1 < argc)
            n = strtoull(argv[++i], NULL, 10);
        else {
            fprintf(stderr, "usage: gpu_flood [--items N]\n");
            return 2;
        }
    }
    if (n == 0 || n > REG_LEN / TINY)
        die("--items: 1 .. 65536");
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
        _exit(target_main(down[0], up[1]));
    }
    close(down[0]);
    close(up[1]);
    struct ctx c = {.to = down[1], .from = up[0]};
    if (read(c.from, &c.h, sizeof(c.h)) != sizeof(c.h))
        die("the target did not start");
    bool real = c.h.ngpu > 0 && gpu_count() > 0;
    const char *emu = getenv("XFER_GPU_STAGE_EMULATE");
    int rc = 77;
    if (!real && !(XFER_WITH_CUDA && emu && *emu == '1')) {
        printf("skipped: no CUDA device and no XFER_GPU_STAGE_EMULATE=1 (CUDA build)\n");
    } else {
        c.e = engine("flood-initiator");
        if (xfer_peer_add(c.e, &c.h.peer, &c.p) < 0 || xfer_peer_region_add(c.p, &c.h.rd) < 0)
            die("xfer_peer_add");
        gmem_make(c.e, &c.g, 0, real);
        printf("%s GPU regions over tcp, %llu items of %u B\n",
               real ? "real" : "emulated (XFER_GPU_STAGE_EMULATE)", (unsigned long long)n, TINY);
        run(&c, n);
        rc = failures ? 1 : 0;
    }
    char q = 'q';
    if (write(c.to, &q, 1) != 1)
        die("pipe");
    int st;
    waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "FAIL target exited abnormally (status %d)\n", st);
        rc = 1;
    }
    xfer_engine_free(c.e);
    if (c.g.p && !c.g.real)
        free(c.g.p);
    return rc;
}
