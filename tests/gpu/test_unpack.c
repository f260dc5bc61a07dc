/*
 * TCPX unpack on a GPU: the kernel, per-fragment copies and the host gather
 * (struct xfer_unpacker) against the CPU reference on random fragment
 * lists (out of order, gaps, odd sizes and alignments), device and host
 * destinations. --bench: GB/s and launches/copies per unpack of 1,000 to
 * 100,000 fragments of 4 KiB and of an MTU mix, for each method.
 * Exits 77 without a CUDA device.
 */
#include "unpack_frags.h"
#include "xfer.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#if XFER_WITH_CUDA
#include "gpu_check.h"

static int failures;

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* One random list, every method, device (and host) destination. */
static void check_round(struct xfer_unpacker *u, uint64_t round, uint8_t *dbounce, uint8_t *ddst,
                        uint8_t *hbounce, uint8_t *want, uint8_t *got, size_t cap,
                        struct xfer_unpack_frag *f)
{
    uint64_t s = round * 2654435761u + 3, blen;
    uint64_t total = 1 + uf_rand(&s) % (cap / 3);
    uint32_t fixed = round % 4 == 0 ? 4096 : round % 4 == 1 ? 1 + (uint32_t)(round % 61) : 0;
    size_t n = uf_make(f, 200000, total, fixed, round % 2 ? 64 : 0, round + 11, &blen);
    total = 0;
    for (size_t i = 0; i < n; i++)
        total = f[i].dst_off + f[i].len > total ? f[i].dst_off + f[i].len : total;
    for (uint64_t i = 0; i < blen; i++)
        hbounce[i] = (uint8_t)(uf_rand(&s));
    CK(cudaMemcpy(dbounce, hbounce, blen, cudaMemcpyHostToDevice));
    memset(want, 0x5a, total);
    xfer_kref_unpack(want, hbounce, f, n);
    EXPECT(xfer_unpack_check(f, n, blen, total, NULL) == 0, "round %llu: bad list",
           (unsigned long long)round);
    for (int m = 0; m < 3; m++) {
        for (int host_dst = 0; host_dst < 2; host_dst++) {
            uint8_t *dst = host_dst ? got : ddst;
            if (host_dst)
                memset(got, 0x5a, total);
            else
                CK(cudaMemset(ddst, 0x5a, total));
            int rc = xfer_unpacker_start(u, (enum xfer_unpack_method)m, dst, dbounce, f, n);
            if (rc == 0)
                rc = xfer_unpacker_wait(u, 10000);
            EXPECT(rc == 0, "round %llu %s: %s", (unsigned long long)round,
                   xfer_unpack_method_name((enum xfer_unpack_method)m),
                   xfer_unpacker_last_error(u));
            if (!host_dst)
                CK(cudaMemcpy(got, ddst, total, cudaMemcpyDeviceToHost));
            EXPECT(!memcmp(got, want, total), "round %llu: %s into %s memory differs from the CPU",
                   (unsigned long long)round, xfer_unpack_method_name((enum xfer_unpack_method)m),
                   host_dst ? "host" : "GPU");
        }
    }
}

static void bench_one(struct xfer_unpacker *u, const char *what, size_t n, uint32_t fixed,
                      uint8_t *dbounce, uint8_t *ddst, struct xfer_unpack_frag *f)
{
    uint64_t blen, total = 0;
    n = uf_make(f, n, (uint64_t)n * 9000, fixed, 64, 42 + n, &blen);
    for (size_t i = 0; i < n; i++)
        total += f[i].len;
    for (int m = 0; m < 3; m++) {
        int iters = n >= 100000 ? 3 : n >= 10000 ? 10 : 50;
        uint64_t l0 = xfer_unpacker_launches(u), c0 = xfer_unpacker_copies(u);
        int rc = xfer_unpacker_start(u, (enum xfer_unpack_method)m, ddst, dbounce, f, n);
        rc = rc ? rc : xfer_unpacker_wait(u, 60000); /* warm-up */
        double t0 = now();
        for (int i = 0; i < iters && rc == 0; i++) {
            rc = xfer_unpacker_start(u, (enum xfer_unpack_method)m, ddst, dbounce, f, n);
            rc = rc ? rc : xfer_unpacker_wait(u, 60000);
        }
        double dt = (now() - t0) / iters;
        uint64_t launches = xfer_unpacker_launches(u) - l0, copies = xfer_unpacker_copies(u) - c0;
        EXPECT(rc == 0, "bench %s: %s", what, xfer_unpacker_last_error(u));
        printf("%-10s %7zu frags %8.1f MB  %-6s %8.2f GB/s %9.1f us/unpack  %6.1f launches "
               "%8.1f copies per unpack\n",
               what, n, total / 1e6, xfer_unpack_method_name((enum xfer_unpack_method)m),
               total / dt / 1e9, dt * 1e6, (double)launches / (iters + 1),
               (double)copies / (iters + 1));
    }
}

int main(int argc, char **argv)
{
    bool bench = argc > 1 && !strcmp(argv[1], "--bench");
    int ndev = 0;
    if (xfer_kernels_probe(&ndev) != 0) {
        printf("skipped: no CUDA device\n");
        return 77;
    }
    struct xfer_unpacker *u;
    if (xfer_unpacker_new(0, &u) != 0) {
        printf("FAIL: no unpacker on GPU 0\n");
        return 1;
    }
    const size_t cap = bench ? (size_t)100000 * 9000 + (100000 * 65) : (size_t)48 << 20;
    uint8_t *dbounce, *ddst, *hbounce = malloc(cap), *want = malloc(cap), *got = malloc(cap);
    struct xfer_unpack_frag *f = malloc(200000 * sizeof(*f));
    CK(cudaMalloc((void **)&dbounce, cap));
    CK(cudaMalloc((void **)&ddst, cap));
    if (!bench) {
        int rounds = argc > 1 ? atoi(argv[1]) : 60;
        for (int r = 0; r < rounds; r++)
            check_round(u, (uint64_t)r, dbounce, ddst, hbounce, want, got, cap, f);
        printf("unpack: %d random lists x 3 methods x 2 destinations vs the CPU reference: %d "
               "failures\n",
               rounds, failures);
        if (ndev > 1) { /* TCPX's bounce on another GPU than the destination (its NIC's) */
            uint8_t *far;
            CK(cudaSetDevice(ndev - 1));
            CK(cudaMalloc((void **)&far, cap));
            CK(cudaSetDevice(0));
            int before = failures;
            for (int r = 0; r < rounds / 4 + 1; r++)
                check_round(u, (uint64_t)r + 1000, far, ddst, hbounce, want, got, cap, f);
            printf("unpack: bounce on GPU %d, destination on GPU 0: %d failures\n", ndev - 1,
                   failures - before);
            cudaFree(far);
        }
    } else {
        CK(cudaMemset(dbounce, 7, cap));
        struct cudaDeviceProp p;
        CK(cudaGetDeviceProperties(&p, 0));
        printf("device: %s\n", p.name);
        static const size_t counts[] = {1000, 10000, 100000};
        for (size_t i = 0; i < 3; i++)
            bench_one(u, "4KiB", counts[i], 4096, dbounce, ddst, f);
        for (size_t i = 0; i < 3; i++)
            bench_one(u, "MTU-mix", counts[i], 0, dbounce, ddst, f);
    }
    xfer_unpacker_free(u);
    cudaFree(dbounce);
    cudaFree(ddst);
    free(hbounce);
    free(want);
    free(got);
    free(f);
    return failures ? 1 : 0;
}

#else /* !XFER_WITH_CUDA */

int main(void)
{
    printf("skipped: built without CUDA\n");
    return 77;
}
#endif
