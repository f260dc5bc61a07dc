/*
 * Measurements of GPU-initiated transfers (gpu_ring bench), all in one run
 * per receiver kind (tcp, ipc: another process; local: this process, tcp):
 *  latency  a kernel's put -> data landed + counter flipped (device clock),
 *           4 KiB .. 1 MiB; and end to end from the host's view: a kernel
 *           produces the data, then either the host writes it after a stream
 *           synchronize (xfer_write) or the kernel puts it and waits;
 *  rate     requests per second through one ring and one proxy (64-byte
 *           puts from many threads, per-thread and per-warp reservations);
 *  overlap  a kernel computes slices and puts each as it is done, against
 *           compute alone and puts alone.
 * Medians of interleaved repetitions; numbers are printed as tables.
 */
#include "gpu_ring.h"

#define MB (1ull << 20)

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, int n, double p)
{
    qsort(v, n, sizeof(*v), cmp_d);
    return v[(int)(p * (n - 1) + 0.5)];
}

struct bench {
    struct target t;
    struct local l;
    struct xfer_region_desc rd;
    cudaStream_t s;
    int *rc;
    int sms;
};

static int bench_open(struct bench *b, const char *kind, int peer_gpu, uint64_t len)
{
    memset(b, 0, sizeof(*b));
    if (target_open(&b->t, kind, peer_gpu, len) < 0 || local_open(&b->l, b->t.e, len, MB) < 0 ||
        xfer_peer_region_lookup(b->t.p, "dst", &b->rd) < 0)
        return -1;
    CK(cudaStreamCreateWithFlags(&b->s, cudaStreamNonBlocking));
    CK(cudaMalloc((void **)&b->rc, sizeof(int)));
    CK(cudaMemset(b->rc, 0, sizeof(int)));
    CK(cudaDeviceGetAttribute(&b->sms, cudaDevAttrMultiProcessorCount, 0));
    return 0;
}

static void bench_close(struct bench *b)
{
    cudaFree(b->rc);
    if (b->s)
        cudaStreamDestroy(b->s);
    local_close(&b->l, b->t.e);
    target_close(&b->t);
}

static int sync_or_die(struct bench *b)
{
    if (stream_wait(b->s, 60) < 0)
        exit(3);
    int rc = 0;
    CK(cudaMemcpy(&rc, b->rc, sizeof(rc), cudaMemcpyDeviceToHost));
    return rc;
}

/* ---- latency ---------------------------------------------------------------------- */

#define LAT_ITERS 100
#define E2E_ITERS 30

static void bench_latency(struct bench *b)
{
    struct xfer_gpu_ring_config cfg;
    xfer_gpu_ring_config_init(&cfg);
    struct xfer_ring_dev dev;
    xfer_gpu_ring *r = ring_open(&b->t, &b->l, &cfg, &dev);
    if (!r)
        return;
    uint64_t *ns;
    CK(cudaMalloc((void **)&ns, LAT_ITERS * sizeof(*ns)));
    static const uint64_t sizes[] = {4096, 16384, 65536, 262144, 1048576};
    printf("\nlatency, receiver %s (us; medians, p90 in brackets)\n", b->t.kind);
    printf("| size | kernel put -> landed + counter (device clock) | host: produce kernel, sync, "
           "xfer_write | of which xfer_write | kernel: produce, put, wait (one launch) |\n");
    printf("| --- | --- | --- | --- | --- |\n");
    for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
        uint64_t len = sizes[si];
        uint64_t h_ns[LAT_ITERS];
        double dev_us[LAT_ITERS], host_us[E2E_ITERS], write_us[E2E_ITERS], kern_us[E2E_ITERS];
        gr_launch_latency(&dev, 0, 0, b->l.buf, len, 0, 10, ns, b->rc, b->s); /* warm-up */
        int rc = sync_or_die(b);
        gr_launch_latency(&dev, 0, 0, b->l.buf, len, 0, LAT_ITERS, ns, b->rc, b->s);
        rc = rc ? rc : sync_or_die(b);
        CK(cudaMemcpy(h_ns, ns, sizeof(h_ns), cudaMemcpyDeviceToHost));
        for (int i = 0; i < LAT_ITERS; i++)
            dev_us[i] = h_ns[i] / 1e3;
        for (int i = 0; i < E2E_ITERS && rc == 0; i++) { /* the two host views, interleaved */
            double t0 = now_s();
            gr_launch_produce(&dev, 0, 0, b->l.buf, len, i, 0, 0, 0, b->rc, b->s);
            sync_or_die(b);
            double t1 = now_s();
            rc = xfer_write(b->t.e, b->l.rbuf, 0, b->t.p, b->rd.id, b->rd.gen, 0, len, 10000);
            double t2 = now_s();
            host_us[i] = (t2 - t0) * 1e6;
            write_us[i] = (t2 - t1) * 1e6;
            uint64_t done = 0;
            xfer_gpu_ring_counter(r, 1, &done, NULL, NULL);
            t0 = now_s();
            gr_launch_produce(&dev, 0, 0, b->l.buf, len, i, 1, 1, done + 1, b->rc, b->s);
            rc = rc ? rc : sync_or_die(b);
            kern_us[i] = (now_s() - t0) * 1e6;
        }
        EXPECT(rc == 0, "latency %s %llu: %s", b->t.kind, (unsigned long long)len,
               xfer_strerror(rc));
        if (rc)
            break;
        printf("| %llu KiB | %.1f (%.1f) | %.1f (%.1f) | %.1f | %.1f (%.1f) |\n",
               (unsigned long long)len >> 10, pct(dev_us, LAT_ITERS, 0.5),
               pct(dev_us, LAT_ITERS, 0.9), pct(host_us, E2E_ITERS, 0.5),
               pct(host_us, E2E_ITERS, 0.9), pct(write_us, E2E_ITERS, 0.5),
               pct(kern_us, E2E_ITERS, 0.5), pct(kern_us, E2E_ITERS, 0.9));
    }
    cudaFree(ns);
    xfer_gpu_ring_free(r);
}

/* ---- requests per second ------------------------------------------------------------- */

/* gpu: GPU memory to GPU memory (over ipc, groups of GPU items are one
 * batched copy kernel), else host memory to host memory: the ring, the
 * proxy and the transport without tcp's GPU staging. shapes: ring shapes
 * tried (1 or 2). */
static void bench_rate(struct bench *b, bool gpu, int shapes_n)
{
    const int blocks = 32, threads = 128, per_thread = 16;
    const uint32_t counters = 32;
    const uint64_t n = (uint64_t)blocks * threads * per_thread;
    const uint32_t local = gpu ? 0 : 2, remote = gpu ? 0 : 1;
    printf("\nrequests/s through one ring + proxy, receiver %s, %s: %llu puts of 64 B from %d x "
           "%d threads\n",
           b->t.kind, gpu ? "GPU -> GPU memory" : "host -> host memory", (unsigned long long)n,
           blocks, threads);
    printf("| ring (slots / batch_max / outstanding_max) | reservation | requests/s | batches | "
           "largest batch |\n| --- | --- | --- | --- | --- |\n");
    static const uint32_t shapes[][3] = {{1024, 256, 4096}, {4096, 1024, 16384}};
    for (int sh = 0; sh < shapes_n; sh++) {
        for (int lanes = 0; lanes < 2; lanes++) {
            struct xfer_gpu_ring_config cfg;
            xfer_gpu_ring_config_init(&cfg);
            cfg.slots = shapes[sh][0];
            cfg.batch_max = shapes[sh][1];
            cfg.outstanding_max = shapes[sh][2];
            cfg.counters = counters;
            cfg.timeout_ns = 5000000000ull; /* a stall ends the part in seconds */
            struct xfer_ring_dev dev;
            xfer_gpu_ring *r = ring_open(&b->t, &b->l, &cfg, &dev);
            if (!r)
                return;
            uint64_t want[32];
            double best = 0;
            int rc = 0;
            for (int rep = 1; rep <= 3 && rc == 0; rep++) {
                for (uint32_t c = 0; c < counters; c++)
                    want[c] = (uint64_t)rep * n / counters;
                double t0 = now_s();
                gr_launch_rate(&dev, local, remote, 64, HDST_LEN, per_thread, lanes, blocks,
                               threads, counters, b->rc, b->s);
                rc = sync_or_die(b);
                rc = rc ? rc : counters_wait(r, counters, want);
                double rate = n / (now_s() - t0);
                best = rate > best ? rate : best;
            }
            EXPECT(rc == 0, "rate %s: %s (%s)", b->t.kind, xfer_strerror(rc),
                   xfer_gpu_ring_last_error(r));
            struct xfer_gpu_ring_stats st;
            xfer_gpu_ring_stats(r, &st);
            if (rc) {
                printf("  stalled: taken %llu, completed %llu, failed %llu, in flight %llu, queued "
                       "%llu, batches %llu\n",
                       (unsigned long long)st.taken, (unsigned long long)st.completed,
                       (unsigned long long)st.failed, (unsigned long long)st.in_flight,
                       (unsigned long long)st.queued, (unsigned long long)st.batches);
                xfer_gpu_ring_free(r);
                return;
            }
            printf("| %u / %u / %u | %s | %.0f | %llu | %llu |\n", cfg.slots, cfg.batch_max,
                   cfg.outstanding_max, lanes ? "one per warp (put_lanes)" : "one per thread", best,
                   (unsigned long long)st.batches, (unsigned long long)st.batch_items_max);
            xfer_gpu_ring_free(r);
        }
    }
}

/* ---- overlap ------------------------------------------------------------------------- */

/* One launch of the overlap kernel, and (put) the wait for its puts:
 * seconds, or -1 (failure reported). */
static double overlap_run(struct bench *b, xfer_gpu_ring *r, const struct xfer_ring_dev *dev,
                          int blocks, int iters, int put, uint64_t *want, uint32_t counters)
{
    double t0 = now_s();
    gr_launch_overlap(dev, 0, 0, b->l.buf, 256 << 10, iters, put, blocks, counters, b->rc, b->s);
    int rc = sync_or_die(b);
    if (put) {
        for (int i = 0; i < blocks; i++)
            want[i % counters]++;
        rc = rc ? rc : counters_wait(r, counters, want);
    }
    EXPECT(rc == 0, "overlap %s: %s (%s)", b->t.kind, xfer_strerror(rc),
           xfer_gpu_ring_last_error(r));
    return rc == 0 ? now_s() - t0 : -1;
}

static void bench_overlap(struct bench *b)
{
    const int blocks = 4 * b->sms;
    const uint32_t counters = 1024;
    struct xfer_gpu_ring_config cfg;
    xfer_gpu_ring_config_init(&cfg);
    cfg.counters = counters;
    struct xfer_ring_dev dev;
    xfer_gpu_ring *r = ring_open(&b->t, &b->l, &cfg, &dev);
    if (!r)
        return;
    uint64_t *want = calloc(counters, sizeof(*want));
    int iters = 64;
    double tc[3], tpp[3], tb[3];
    double tp = overlap_run(b, r, &dev, blocks, 0, 1, want, counters); /* warm-up */
    tp = tp < 0 ? tp : overlap_run(b, r, &dev, blocks, 0, 1, want, counters);
    double t64 = tp < 0 ? tp : overlap_run(b, r, &dev, blocks, iters, 0, want, counters);
    for (int round = 0; round < 2 && t64 > 0; round++) { /* compute about as long as the puts */
        double f = iters * tp / t64;
        iters = f < 1 ? 1 : f > 1000000 ? 1000000 : (int)f;
        t64 = overlap_run(b, r, &dev, blocks, iters, 0, want, counters);
    }
    bool ok = t64 > 0;
    for (int i = 0; i < 3 && ok; i++) { /* interleaved */
        tc[i] = overlap_run(b, r, &dev, blocks, iters, 0, want, counters);
        tpp[i] = overlap_run(b, r, &dev, blocks, 0, 1, want, counters);
        tb[i] = overlap_run(b, r, &dev, blocks, iters, 1, want, counters);
        ok = tc[i] > 0 && tpp[i] > 0 && tb[i] > 0;
    }
    if (!ok) {
        free(want);
        xfer_gpu_ring_free(r);
        return;
    }
    double c = pct(tc, 3, 0.5), p = pct(tpp, 3, 0.5), both = pct(tb, 3, 0.5);
    double lo = c < p ? c : p, ov = (c + p - both) / lo;
    printf("\noverlap, receiver %s: %d blocks x 256 KiB (%.0f MiB), %d FMA rounds per element\n",
           b->t.kind, blocks, blocks * 0.25, iters);
    printf("| compute alone | puts alone | compute + puts (one kernel) | overlap |\n");
    printf("| --- | --- | --- | --- |\n| %.2f ms | %.2f ms | %.2f ms | %.0f %% |\n", c * 1e3,
           p * 1e3, both * 1e3, ov * 100);
    free(want);
    xfer_gpu_ring_free(r);
}

static bool named(const char *cases, const char *const *names, size_t n)
{
    for (size_t i = 0; cases && i < n; i++)
        if (strstr(cases, names[i]))
            return true;
    return false;
}

/* cases: receiver kinds (ipc, tcp, local) and parts (latency, rate,
 * overlap), comma-separated; a missing group means all of it. */
int gpu_ring_bench(const char *cases, int peer_gpu)
{
    static const char *const kinds[] = {"ipc", "local", "tcp"};
    static const char *const parts[] = {"latency", "rate", "overlap"};
    bool all_kinds = !named(cases, kinds, 3), all_parts = !named(cases, parts, 3);
    for (size_t k = 0; k < 3; k++) {
        if (!all_kinds && !strstr(cases, kinds[k]))
            continue;
        struct bench b;
        if (bench_open(&b, kinds[k], peer_gpu, 160 * MB) < 0) {
            EXPECT(0, "bench %s: set-up", kinds[k]);
            bench_close(&b);
            continue;
        }
        if (all_parts || strstr(cases, "latency"))
            bench_latency(&b);
        bool ipc = b.t.transport == XFER_TRANSPORT_IPC;
        if (all_parts || strstr(cases, "rate"))
            bench_rate(&b, ipc, 2);
        if (all_parts || strstr(cases, "overlap"))
            bench_overlap(&b);
        if ((all_parts || strstr(cases, "rate")) && !ipc && !b.t.pe) /* the very last: tcp's */
            bench_rate(&b, true, 1); /* GPU staging with 64-byte items (stalled before) */
        bench_close(&b);
    }
    printf("gpu_ring bench: %d failures\n", failures);
    return failures ? 1 : 0;
}
