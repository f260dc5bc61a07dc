/*
 * GPU-initiated transfers on a real GPU (issue 12): kernels put and get
 * through a request ring (kernels/xfer_dev.cuh), the proxy moves the bytes
 * over the engine, the receiver checks every byte.
 *
 *   gpu_ring check [--cases LIST] [--peer-gpu N]   the tests (default: all)
 *       local   receiver in this process, GPU memory on the same GPU, tcp
 *       tcp     receiver in another process (GPU memory), tcp
 *       ipc     receiver in another process, GPU --peer-gpu (CUDA IPC)
 *       pressure  a 4-slot ring under 64 blocks (back-pressure)
 *       teardown  receiver frozen, ring stopped: kernels' waits end
 *       dead    receiver killed mid-stream: the kernel reads the error word
 *       dead-ipc  the same over ipc
 *   gpu_ring bench [--cases LIST] [--peer-gpu N]   latency, rate, overlap
 *   gpu_ring peer --gpu N --len BYTES              the receiving child
 * Exit 0 passed, 1 failed, 77 no CUDA device (or built without CUDA).
 */
#include "gpu_ring.h"

#include <dirent.h>
#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

extern char **environ;
int failures;

/* A crash prints where (addresses resolve with addr2line on this binary). */
static void on_crash(int sig)
{
    void *frames[64];
    int n = backtrace(frames, 64);
    char line[64];
    int len = snprintf(line, sizeof(line), "gpu_ring: signal %d, backtrace:\n", sig);
    if (write(2, line, (size_t)len) < 0)
        _exit(128 + sig);
    backtrace_symbols_fd(frames, n, 2);
    _exit(128 + sig);
}

#define MB (1ull << 20)

/* ---- the receiving child (stdin: commands, stdout: answers) ------------------- */

struct peer_hello {
    int rc;
    struct xfer_peer_desc peer;
    struct xfer_region_desc dst, hdst;
};
struct peer_cmd {
    int op; /* 1 verify, 2 quit */
    uint64_t seed, len;
};

static int xread(int fd, void *p, size_t len)
{
    for (size_t got = 0; got < len;) {
        ssize_t n = read(fd, (char *)p + got, len - got);
        if (n <= 0)
            return -1;
        got += (size_t)n;
    }
    return 0;
}

static int gpu_read(void *ctx, uint64_t off, void *dst, uint64_t len)
{
    return cudaMemcpy(dst, (uint8_t *)ctx + off, len, cudaMemcpyDeviceToHost) == cudaSuccess ? 0
                                                                                             : -1;
}

static int host_read(void *ctx, uint64_t off, void *dst, uint64_t len)
{
    memcpy(dst, (uint8_t *)ctx + off, len);
    return 0;
}

/* Registers region `name` of len bytes on gpu (or host memory) in e. */
static void *dst_make(xfer_engine *e, const char *name, int gpu, uint64_t len, xfer_region **out)
{
    void *mem = NULL;
    if (gpu < 0) {
        if (xfer_region_alloc(e, name, len, XFER_ACCESS_RW, out) < 0)
            return NULL;
        return xfer_region_ptr(*out);
    }
    CK(cudaSetDevice(gpu));
    CK(cudaMalloc(&mem, len));
    CK(cudaMemset(mem, 0, len));
    if (xfer_region_register(e, name, mem, len, XFER_MEM_CUDA, gpu, XFER_ACCESS_RW, out) < 0) {
        fprintf(stderr, "register %s: %s\n", name, xfer_engine_last_error(e));
        return NULL;
    }
    return mem;
}

static xfer_engine *engine(const char *id, unsigned transports)
{
    struct xfer_engine_config cfg;
    xfer_engine_config_init(&cfg);
    cfg.node_id = id;
    cfg.transports = transports;
    cfg.connect_timeout_ms = 5000;
    cfg.io_timeout_ms = 5000;
    int rc;
    xfer_engine *e = xfer_engine_new(&cfg, &rc);
    if (!e)
        fprintf(stderr, "engine %s: %s\n", id, xfer_strerror(rc));
    return e;
}

static int peer_main(int gpu, uint64_t len)
{
    struct peer_hello h = {0};
    xfer_engine *e = engine("gpu-peer", XFER_TRANSPORT_TCP | XFER_TRANSPORT_IPC);
    xfer_region *dst = NULL, *hdst = NULL;
    void *mem = e ? dst_make(e, "dst", gpu, len, &dst) : NULL;
    h.rc = mem && dst_make(e, "hdst", -1, HDST_LEN, &hdst) ? 0 : -1;
    if (h.rc == 0) {
        xfer_engine_describe(e, &h.peer);
        xfer_region_describe(dst, &h.dst);
        xfer_region_describe(hdst, &h.hdst);
    }
    if (write(1, &h, sizeof(h)) != sizeof(h) || h.rc < 0)
        return 1;
    struct peer_cmd c;
    while (xread(0, &c, sizeof(c)) == 0 && c.op == 1) {
        uint64_t bad = c.len > len
                           ? 0
                           : ring_check_pattern(gpu < 0 ? host_read : gpu_read, mem, c.seed, c.len);
        if (write(1, &bad, sizeof(bad)) != sizeof(bad))
            break;
    }
    xfer_region_deregister(e, dst);
    xfer_region_deregister(e, hdst);
    xfer_engine_free(e);
    if (gpu >= 0)
        cudaFree(mem);
    return 0;
}

/* ---- targets ---------------------------------------------------------------------- */

static int spawn_peer(struct target *t, int gpu)
{
    int down[2], up[2];
    if (pipe(down) || pipe(up))
        return -1;
    char exe[512], g[16], l[32];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0)
        return -1;
    exe[n] = '\0';
    snprintf(g, sizeof(g), "%d", gpu);
    snprintf(l, sizeof(l), "%llu", (unsigned long long)t->len);
    char *argv[] = {exe, "peer", "--gpu", g, "--len", l, NULL};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, down[0], 0);
    posix_spawn_file_actions_adddup2(&fa, up[1], 1);
    posix_spawn_file_actions_addclose(&fa, down[1]);
    posix_spawn_file_actions_addclose(&fa, up[0]);
    int rc = posix_spawn(&t->pid, exe, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(down[0]);
    close(up[1]);
    t->to = down[1];
    t->from = up[0];
    return rc == 0 ? 0 : -1;
}

int target_open(struct target *t, const char *kind, int peer_gpu, uint64_t len)
{
    memset(t, 0, sizeof(*t));
    t->kind = kind;
    t->len = len;
    t->to = t->from = -1;
    t->transport = strcmp(kind, "ipc") ? XFER_TRANSPORT_TCP : XFER_TRANSPORT_IPC;
    struct xfer_peer_desc pd;
    struct xfer_region_desc rd, hrd;
    if (!strcmp(kind, "local")) {
        t->pe = engine("gpu-local-peer", XFER_TRANSPORT_TCP);
        t->pgpu = 0;
        t->pmem = t->pe ? dst_make(t->pe, "dst", 0, len, &t->pdst) : NULL;
        if (!t->pmem || !dst_make(t->pe, "hdst", -1, HDST_LEN, &t->phdst))
            return -1;
        xfer_engine_describe(t->pe, &pd);
        xfer_region_describe(t->pdst, &rd);
        xfer_region_describe(t->phdst, &hrd);
    } else {
        struct peer_hello h;
        if (spawn_peer(t, peer_gpu) < 0 || xread(t->from, &h, sizeof(h)) < 0 || h.rc < 0) {
            fprintf(stderr, "%s: the receiving process did not start\n", kind);
            return -1;
        }
        pd = h.peer;
        rd = h.dst;
        hrd = h.hdst;
    }
    t->e = engine("gpu-kernels", t->transport);
    if (!t->e || xfer_peer_add(t->e, &pd, &t->p) < 0 || xfer_peer_region_add(t->p, &rd) < 0 ||
        xfer_peer_region_add(t->p, &hrd) < 0) {
        fprintf(stderr, "%s: connect: %s\n", kind, t->e ? xfer_engine_last_error(t->e) : "");
        return -1;
    }
    if (xfer_peer_transport(t->p) != t->transport) {
        fprintf(stderr, "%s: transport 0x%x in use, wanted 0x%x\n", kind, xfer_peer_transport(t->p),
                t->transport);
        return -1;
    }
    return 0;
}

int target_verify(struct target *t, uint64_t seed, uint64_t len)
{
    uint64_t bad;
    if (t->pe) {
        bad = ring_check_pattern(gpu_read, t->pmem, seed, len);
    } else {
        struct peer_cmd c = {1, seed, len};
        if (write(t->to, &c, sizeof(c)) != sizeof(c) || xread(t->from, &bad, sizeof(bad)) < 0)
            bad = 0;
    }
    if (bad != UINT64_MAX)
        fprintf(stderr, "%s: receiver found a difference at byte %llu of %llu\n", t->kind,
                (unsigned long long)bad, (unsigned long long)len);
    return bad == UINT64_MAX ? 0 : -1;
}

void target_signal(struct target *t, int sig)
{
    if (t->pid > 0)
        kill(t->pid, sig);
}

/* SIGSTOP, then until every thread of the child shows state T (5 s). */
int target_freeze(struct target *t)
{
    char dir[64];
    if (t->pid <= 0)
        return -1;
    kill(t->pid, SIGSTOP);
    snprintf(dir, sizeof(dir), "/proc/%d/task", (int)t->pid);
    for (double t0 = now_s(); now_s() - t0 < 5; usleep(10000)) {
        DIR *d = opendir(dir);
        int running = d ? 0 : 1;
        for (struct dirent *de; d && (de = readdir(d));) {
            char path[512], buf[512];
            if (de->d_name[0] == '.')
                continue;
            snprintf(path, sizeof(path), "%s/%s/stat", dir, de->d_name);
            FILE *f = fopen(path, "r");
            char *state = f && fgets(buf, sizeof(buf), f) ? strrchr(buf, ')') : NULL;
            running |= !state || state[1] != ' ' || state[2] != 'T';
            if (f)
                fclose(f);
        }
        if (d)
            closedir(d);
        if (!running)
            return 0;
    }
    return -1;
}

void target_close(struct target *t)
{
    xfer_engine_free(t->e);
    if (t->pe) {
        xfer_region_deregister(t->pe, t->pdst);
        xfer_region_deregister(t->pe, t->phdst);
        xfer_engine_free(t->pe);
        cudaFree(t->pmem);
    }
    if (t->pid > 0) {
        struct peer_cmd c = {2, 0, 0};
        if (write(t->to, &c, sizeof(c)) < 0)
            kill(t->pid, SIGKILL);
        int st;
        for (double t0 = now_s(); waitpid(t->pid, &st, WNOHANG) == 0; usleep(10000))
            if (now_s() - t0 > 10) {
                kill(t->pid, SIGKILL);
                waitpid(t->pid, &st, 0);
                break;
            }
        close(t->to);
        close(t->from);
    }
    memset(t, 0, sizeof(*t));
}

/* ---- local memory, rings, waits ------------------------------------------------------ */

int local_open(struct local *l, xfer_engine *e, uint64_t len, uint64_t back_len)
{
    memset(l, 0, sizeof(*l));
    l->len = len;
    l->back_len = back_len;
    CK(cudaSetDevice(0));
    CK(cudaMalloc((void **)&l->buf, len));
    CK(cudaMalloc((void **)&l->back, back_len));
    CK(cudaMemset(l->back, 0, back_len));
    if (xfer_region_register(e, "buf", l->buf, len, XFER_MEM_CUDA, 0, XFER_ACCESS_RW, &l->rbuf) ||
        xfer_region_register(e, "back", l->back, back_len, XFER_MEM_CUDA, 0, XFER_ACCESS_RW,
                             &l->rback) ||
        xfer_region_alloc(e, "hbuf", HDST_LEN, XFER_ACCESS_RW, &l->rhbuf)) {
        fprintf(stderr, "register: %s\n", xfer_engine_last_error(e));
        return -1;
    }
    return 0;
}

void local_close(struct local *l, xfer_engine *e)
{
    if (l->rbuf)
        xfer_region_deregister(e, l->rbuf);
    if (l->rback)
        xfer_region_deregister(e, l->rback);
    if (l->rhbuf)
        xfer_region_deregister(e, l->rhbuf);
    cudaFree(l->buf);
    cudaFree(l->back);
    memset(l, 0, sizeof(*l));
}

xfer_gpu_ring *ring_open(struct target *t, struct local *l, struct xfer_gpu_ring_config *cfg,
                         struct xfer_ring_dev *dev)
{
    int rc;
    cfg->device = 0;
    xfer_gpu_ring *r = xfer_gpu_ring_new(t->e, cfg, &rc);
    if (!r || xfer_gpu_ring_add_local(r, l->rbuf) != 0 ||
        xfer_gpu_ring_add_local(r, l->rback) != 1 || xfer_gpu_ring_add_local(r, l->rhbuf) != 2 ||
        xfer_gpu_ring_add_remote(r, t->p, "dst") != 0 ||
        xfer_gpu_ring_add_remote(r, t->p, "hdst") != 1 || xfer_gpu_ring_start(r) < 0) {
        fprintf(stderr, "ring: %s (%s)\n", xfer_strerror(rc), r ? xfer_gpu_ring_last_error(r) : "");
        xfer_gpu_ring_free(r);
        return NULL;
    }
    xfer_gpu_ring_device_handle(r, dev);
    return r;
}

int stream_wait(cudaStream_t s, double seconds)
{
    double t0 = now_s();
    /* polls without sleeping for the first 5 ms: timings stay exact */
    for (double t = t0; t - t0 < seconds; t = now_s()) {
        if (t - t0 > 0.005)
            usleep(200);
        cudaError_t e = cudaStreamQuery(s);
        if (e == cudaSuccess)
            return 0;
        if (e != cudaErrorNotReady) {
            fprintf(stderr, "stream: %s\n", cudaGetErrorString(e));
            return -1;
        }
    }
    fprintf(stderr, "stream: kernel still running after %.0f s\n", seconds);
    return -1;
}

int counters_wait(xfer_gpu_ring *r, uint32_t n, const uint64_t *want)
{
    int first = 0;
    double end = now_s() + 30; /* for all of them */
    for (uint32_t i = 0; i < n; i++) {
        double left = end - now_s();
        int rc = xfer_gpu_ring_host_wait(r, i, want[i], left > 0 ? (uint64_t)(left * 1e9) : 0);
        if (rc < 0 && first == 0)
            first = rc;
    }
    return first;
}

/* ---- check cases --------------------------------------------------------------------- */

static int *dev_ints(int n)
{
    int *p;
    CK(cudaMalloc((void **)&p, n * sizeof(int)));
    CK(cudaMemset(p, 0, n * sizeof(int)));
    return p;
}

/* Worst (most negative... first non-zero) of n device ints. */
static int first_error(const int *dev, int n)
{
    int *h = calloc(n, sizeof(int)), rc = 0;
    CK(cudaMemcpy(h, dev, n * sizeof(int), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n && rc == 0; i++)
        rc = h[i];
    free(h);
    return rc;
}

static const char *mode_name[] = {"one put per block", "put_warp per warp", "put_lanes per thread"};

/* Blocks put their slices (mode), the receiver checks; then (block mode)
 * blocks get them back and check on the GPU. */
static void slices_round(struct target *t, struct local *l, int mode, int blocks, int threads,
                         uint64_t slice, uint64_t seed)
{
    struct xfer_gpu_ring_config cfg;
    xfer_gpu_ring_config_init(&cfg);
    cfg.counters = 2 * (uint32_t)blocks;
    struct xfer_ring_dev dev;
    xfer_gpu_ring *r = ring_open(t, l, &cfg, &dev);
    EXPECT(r, "%s: ring", t->kind);
    if (!r)
        return;
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int *rc = dev_ints(blocks);
    double t0 = now_s();
    gr_launch_slices(&dev, 0, 0, l->buf, slice, seed, mode, 0, blocks, threads, rc, s);
    if (stream_wait(s, 120) < 0)
        exit(3);
    double ms = (now_s() - t0) * 1e3;
    int err = first_error(rc, blocks);
    uint64_t total = (uint64_t)blocks * slice;
    EXPECT(err == 0, "%s %s: kernel saw %s", t->kind, mode_name[mode], xfer_strerror(err));
    EXPECT(target_verify(t, seed, total) == 0, "%s %s: receiver", t->kind, mode_name[mode]);
    struct xfer_gpu_ring_stats st;
    xfer_gpu_ring_stats(r, &st);
    printf("%s  %-5s %-22s %4d blocks x %3d threads, %6llu KiB slices: %6.1f ms, %llu requests, "
           "%llu batches\n",
           err == 0 ? "ok  " : "FAIL", t->kind, mode_name[mode], blocks, threads,
           (unsigned long long)slice >> 10, ms, (unsigned long long)st.completed,
           (unsigned long long)st.batches);
    if (mode == GR_PUT_BLOCK && total <= l->back_len) {
        unsigned long long *bad;
        CK(cudaMalloc((void **)&bad, sizeof(*bad)));
        CK(cudaMemset(bad, 0, sizeof(*bad)));
        CK(cudaMemset(rc, 0, blocks * sizeof(int)));
        gr_launch_get_check(&dev, 1, 0, l->back, slice, seed, (uint32_t)blocks, blocks, rc, bad, s);
        if (stream_wait(s, 120) < 0)
            exit(3);
        unsigned long long nbad = 1;
        CK(cudaMemcpy(&nbad, bad, sizeof(nbad), cudaMemcpyDeviceToHost));
        err = first_error(rc, blocks);
        EXPECT(err == 0 && nbad == 0, "%s: GETs: %s, %llu bad words", t->kind, xfer_strerror(err),
               nbad);
        printf("%s  %-5s GET back + check on the GPU: %llu bad words\n",
               err == 0 && nbad == 0 ? "ok  " : "FAIL", t->kind, nbad);
        cudaFree(bad);
    }
    EXPECT(xfer_gpu_ring_error(r) == 0, "%s: error word %d (%s)", t->kind, xfer_gpu_ring_error(r),
           xfer_gpu_ring_last_error(r));
    /* the host waits on a GPU ring's counters too (host memory only) */
    EXPECT(err != 0 || xfer_gpu_ring_host_wait(r, 0, 1, XFER_RING_TIMEOUT_DEFAULT) == 0,
           "%s: host wait", t->kind);
    cudaFree(rc);
    cudaStreamDestroy(s);
    xfer_gpu_ring_free(r);
}

static void case_slices(const char *kind, int peer_gpu)
{
    struct target t;
    struct local l;
    if (target_open(&t, kind, peer_gpu, 64 * MB) < 0 || local_open(&l, t.e, 64 * MB, 64 * MB) < 0) {
        EXPECT(0, "%s: set-up", kind);
        target_close(&t);
        return;
    }
    slices_round(&t, &l, GR_PUT_BLOCK, 256, 256, 256 << 10, 11);
    slices_round(&t, &l, GR_PUT_WARP, 64, 256, 512 << 10, 12);
    slices_round(&t, &l, GR_PUT_LANES, 16, 128, 128 << 10, 13);
    local_close(&l, t.e);
    target_close(&t);
}

/* 4 slots, 2 requests in flight: 64 blocks must wait for room. */
static void case_pressure(void)
{
    struct target t;
    struct local l;
    if (target_open(&t, "local", 0, 16 * MB) < 0 || local_open(&l, t.e, 16 * MB, MB) < 0) {
        EXPECT(0, "pressure: set-up");
        target_close(&t);
        return;
    }
    struct xfer_gpu_ring_config cfg;
    xfer_gpu_ring_config_init(&cfg);
    cfg.slots = 4;
    cfg.batch_max = 2;
    cfg.outstanding_max = 2;
    struct xfer_ring_dev dev;
    xfer_gpu_ring *r = ring_open(&t, &l, &cfg, &dev);
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int *rc = dev_ints(64);
    gr_launch_slices(&dev, 0, 0, l.buf, 256 << 10, 21, GR_PUT_BLOCK, 0, 64, 256, rc, s);
    if (stream_wait(s, 120) < 0)
        exit(3);
    struct xfer_ring_prod prod;
    CK(cudaMemcpy(&prod, dev.prod, sizeof(prod), cudaMemcpyDeviceToHost));
    struct xfer_gpu_ring_stats st;
    xfer_gpu_ring_stats(r, &st);
    int err = first_error(rc, 64);
    int ok = err == 0 && target_verify(&t, 21, 64 * (256 << 10)) == 0 && prod.full_waits > 0 &&
             st.batch_items_max <= 2;
    EXPECT(ok, "pressure: %s, %llu full waits", xfer_strerror(err),
           (unsigned long long)prod.full_waits);
    printf("%s  pressure: 64 blocks through 4 slots: %llu completed, %llu reservations found it "
           "full, largest batch %llu\n",
           ok ? "ok  " : "FAIL", (unsigned long long)st.completed,
           (unsigned long long)prod.full_waits, (unsigned long long)st.batch_items_max);
    cudaFree(rc);
    cudaStreamDestroy(s);
    xfer_gpu_ring_free(r);
    local_close(&l, t.e);
    target_close(&t);
}

/* The receiver frozen with the kernel's puts in flight; the ring stopped:
 * every block's wait returns -XFER_ECANCELED, the kernel ends. */
static void case_teardown(int peer_gpu)
{
    struct target t;
    struct local l;
    if (target_open(&t, "tcp", peer_gpu, 16 * MB) < 0 || local_open(&l, t.e, 16 * MB, MB) < 0) {
        EXPECT(0, "teardown: set-up");
        target_close(&t);
        return;
    }
    struct xfer_gpu_ring_config cfg;
    xfer_gpu_ring_config_init(&cfg);
    cfg.batch_max = 4;
    cfg.outstanding_max = 4;
    struct xfer_ring_dev dev;
    xfer_gpu_ring *r = ring_open(&t, &l, &cfg, &dev);
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int *rc = dev_ints(16);
    EXPECT(target_freeze(&t) == 0, "teardown: the receiver did not stop");
    gr_launch_slices(&dev, 0, 0, l.buf, 64 << 10, 31, GR_PUT_BLOCK, 0, 16, 256, rc, s);
    struct xfer_gpu_ring_stats st;
    double t0 = now_s();
    do { /* 4 in flight, 12 posted behind them */
        usleep(1000);
        xfer_gpu_ring_stats(r, &st);
    } while ((st.in_flight < 4 || st.queued < 12) && now_s() - t0 < 20);
    struct xfer_gpu_ring_report rep;
    t0 = now_s();
    xfer_gpu_ring_stop(r, 100, &rep);
    int waited = stream_wait(s, 30);
    double ms = (now_s() - t0) * 1e3;
    target_signal(&t, SIGCONT);
    if (waited < 0)
        exit(3);
    int *h = calloc(16, sizeof(int)), cancelled = 0;
    CK(cudaMemcpy(h, rc, 16 * sizeof(int), cudaMemcpyDeviceToHost));
    for (int i = 0; i < 16; i++)
        cancelled += h[i] == -XFER_ECANCELED;
    free(h);
    int ok = rep.cancelled == 4 && rep.unstarted == 12 && cancelled == 16 &&
             xfer_gpu_ring_error(r) == -XFER_ECANCELED;
    EXPECT(ok, "teardown: report %llu/%llu, %d blocks saw -XFER_ECANCELED",
           (unsigned long long)rep.cancelled, (unsigned long long)rep.unstarted, cancelled);
    printf("%s  teardown: 16 blocks waiting, receiver frozen: stop + kernel end in %.0f ms, "
           "%llu cancelled in flight, %llu not started, %d blocks read -XFER_ECANCELED\n",
           ok ? "ok  " : "FAIL", ms, (unsigned long long)rep.cancelled,
           (unsigned long long)rep.unstarted, cancelled);
    cudaFree(rc);
    cudaStreamDestroy(s);
    xfer_gpu_ring_free(r);
    local_close(&l, t.e);
    target_close(&t);
}

/* A warp streams puts; the receiver is killed; the kernel must end with
 * -XFER_ECONN from its wait and in the error word, within a bound. */
static void case_dead(const char *kind, int peer_gpu)
{
    struct target t;
    struct local l;
    if (target_open(&t, kind, peer_gpu, 16 * MB) < 0 || local_open(&l, t.e, 16 * MB, MB) < 0) {
        EXPECT(0, "dead %s: set-up", kind);
        target_close(&t);
        return;
    }
    struct xfer_gpu_ring_config cfg;
    xfer_gpu_ring_config_init(&cfg);
    cfg.timeout_ns = 30000000000ull;
    struct xfer_ring_dev dev;
    xfer_gpu_ring *r = ring_open(&t, &l, &cfg, &dev);
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    long long *out, h[3] = {0};
    CK(cudaMalloc((void **)&out, sizeof(h)));
    CK(cudaMemset(out, 0, sizeof(h)));
    gr_launch_stream(&dev, 0, 0, 1000000, out, s);
    struct xfer_gpu_ring_stats st;
    double t0 = now_s();
    do {
        usleep(1000);
        xfer_gpu_ring_stats(r, &st);
    } while (st.completed < 256 && now_s() - t0 < 30);
    target_signal(&t, SIGKILL);
    t0 = now_s();
    if (stream_wait(s, 60) < 0)
        exit(3);
    double ms = (now_s() - t0) * 1e3;
    CK(cudaMemcpy(h, out, sizeof(h), cudaMemcpyDeviceToHost));
    int ok = st.completed >= 256 && h[0] == -XFER_ECONN && h[1] == -XFER_ECONN;
    EXPECT(ok, "dead %s: kernel error %lld, error word %lld", kind, h[0], h[1]);
    printf(
        "%s  dead %s: receiver killed after %llu requests; kernel ended %.0f ms later after %lld "
        "rounds with %s, error word %s (%s)\n",
        ok ? "ok  " : "FAIL", kind, (unsigned long long)st.completed, ms, h[2],
        xfer_strerror((int)h[0]), xfer_strerror((int)h[1]), xfer_gpu_ring_last_error(r));
    cudaFree(out);
    cudaStreamDestroy(s);
    xfer_gpu_ring_free(r);
    local_close(&l, t.e);
    target_close(&t);
}

static bool wanted(const char *cases, const char *name)
{
    if (!cases)
        return true;
    size_t n = strlen(name);
    for (const char *p = cases; (p = strstr(p, name)); p += n)
        if ((p == cases || p[-1] == ',') && (p[n] == '\0' || p[n] == ','))
            return true;
    return false;
}

static int check(const char *cases, int peer_gpu)
{
    if (wanted(cases, "local"))
        case_slices("local", 0);
    if (wanted(cases, "tcp"))
        case_slices("tcp", peer_gpu);
    if (wanted(cases, "ipc"))
        case_slices("ipc", peer_gpu);
    if (wanted(cases, "pressure"))
        case_pressure();
    if (wanted(cases, "teardown"))
        case_teardown(peer_gpu);
    if (wanted(cases, "dead"))
        case_dead("tcp", peer_gpu);
    if (wanted(cases, "dead-ipc")) /* last: the receiver's memory goes away under CUDA IPC */
        case_dead("ipc", peer_gpu);
    printf("gpu_ring check: %d failures\n", failures);
    return failures ? 1 : 0;
}

int main(int argc, char **argv)
{
    const char *cmd = argc > 1 ? argv[1] : "check", *cases = NULL;
    int peer_gpu = 0, gpu = 0;
    uint64_t len = 64 * MB;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--cases"))
            cases = argv[i + 1];
        else if (!strcmp(argv[i], "--peer-gpu"))
            peer_gpu = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--gpu"))
            gpu = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--len"))
            len = strtoull(argv[i + 1], NULL, 0);
    }
    signal(SIGPIPE, SIG_IGN);
    signal(SIGSEGV, on_crash);
    signal(SIGBUS, on_crash);
    signal(SIGABRT, on_crash);
    if (!strcmp(cmd, "peer"))
        return peer_main(gpu, len);
    setvbuf(stdout, NULL, _IOLBF, 0); /* a run cut short by a timeout keeps its lines */
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        printf("skip: no CUDA device (%s)\n", cudaGetErrorString(cudaGetLastError()));
        return 77;
    }
    if (peer_gpu >= n) {
        printf("skip: --peer-gpu %d but %d GPU(s)\n", peer_gpu, n);
        return 77;
    }
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("gpu_ring %s on %s (%d SMs), %d GPU(s), receiver GPU %d\n", cmd, prop.name,
           prop.multiProcessorCount, n, peer_gpu);
    if (!strcmp(cmd, "check"))
        return check(cases, peer_gpu);
    if (!strcmp(cmd, "bench"))
        return gpu_ring_bench(cases, peer_gpu);
    fprintf(stderr, "usage: gpu_ring check|bench|peer [--cases LIST] [--peer-gpu N]\n");
    return 2;
}
