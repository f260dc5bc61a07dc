/* Messages received into device memory over tcp, between two processes
 * (docs/notify.md, "Eager path"): A (this process) sends, B (a child)
 * receives into a region of kind XFER_MEM_CUDA at offset 4096:
 *  - eager default SENDs of 8 B and XFER_MSG_EAGER_MAX bytes, and an eager
 *    XFER_SEND_LOCAL of 100 B: their bytes ride with the RTS and B copies
 *    them into device memory itself (short RTS: nothing to READ);
 *  - a default SEND of 20000 B (rendezvous: B READs it);
 *  - then a message into host memory, received whole.
 * With a CUDA device, every RECV ends 0 with the bytes checked (copied back
 * to host) and every default SEND 0. Without one (this dev VM, a CUDA-less
 * build), B's region is host memory registered as device memory: every
 * RECV into it ends -XFER_ENODEV (or -XFER_ENOTSUP: a READ built without
 * CUDA) with a reason, a default SEND learns it from the FIN, a local one
 * ends 0 (not told), and the message into host memory still arrives.
 * Run twice: as built (short RTS), and with A sending the long form
 * (XFER_MSG_SHORT=0 in A: eager default bytes are READ, local ones copied). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fork_pair.h"
#include "xfer.h"

#if XFER_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#define DEADLINE 10000
#define DEV_LEN  (1u << 20)
#define AT       4096u

struct msg_case {
    uint32_t n;
    unsigned flags;
};
static const struct msg_case cases[] = {
    {8, 0}, {XFER_MSG_EAGER_MAX, 0}, {100, XFER_SEND_LOCAL}, {20000, 0}};
#define NCASES (sizeof(cases) / sizeof(cases[0]))

static bool have_gpu(void)
{
#if XFER_WITH_CUDA
    int n = 0;
    if (cudaGetDeviceCount(&n) == cudaSuccess && n > 0)
        return true;
    cudaGetLastError();
#endif
    return false;
}

/* B's device region: device memory of GPU 0, or host memory said to be. */
static int device_region(xfer_engine *e, bool gpu, void **mem, xfer_region **r)
{
#if XFER_WITH_CUDA
    if (gpu && cudaMalloc(mem, DEV_LEN) != cudaSuccess)
        return -1;
#endif
    if (!gpu && !(*mem = calloc(1, DEV_LEN)))
        return -1;
    return xfer_region_register(e, "dev", *mem, DEV_LEN, XFER_MEM_CUDA, 0, XFER_ACCESS_RW, r);
}

/* NULL, or why the n bytes at dev + AT are not pattern seed. */
static const char *device_same(const void *dev, uint32_t n, uint32_t seed)
{
    static uint8_t host[65536];
#if XFER_WITH_CUDA
    if (cudaMemcpy(host, (const uint8_t *)dev + AT, n, cudaMemcpyDeviceToHost) != cudaSuccess)
        return "copying back from the device failed";
#else
    (void)dev;
#endif
    return fp_same(host, n, seed) ? NULL : "wrong bytes in device memory";
}

/* What a move into device memory ends with where there is none: copied
 * in, -XFER_ENODEV; READ over tcp, -XFER_ENODEV (CUDA built, no driver) or
 * -XFER_ENOTSUP (built without CUDA). */
static bool no_device(int rc)
{
    return rc == -XFER_ENODEV || rc == -XFER_ENOTSUP;
}

/* B: exit status 0, or 1 with why on stderr. */
static int side_b(int rfd, int wfd, void *arg)
{
    (void)arg;
    bool gpu = have_gpu();
    xfer_engine *e;
    xfer_peer *p;
    xfer_region *dr, *hr;
    void *dev = NULL;
    char g = gpu;
    if (fp_side_up(&e, &p, "dev-b", rfd, wfd) < 0 || write(wfd, &g, 1) != 1 ||
        device_region(e, gpu, &dev, &dr) != 0 ||
        xfer_region_alloc(e, "host", 1 << 17, XFER_ACCESS_RW, &hr) != 0)
        return 1;
    const char *why = NULL;
    for (size_t k = 0; k < NCASES && !why; k++) {
        uint64_t got = 0;
        int rc = xfer_recv(e, dr, AT, 65536, p, k + 1, &got, DEADLINE);
        if (gpu)
            why = rc != 0 || got != cases[k].n ? "recv into device memory failed"
                                               : device_same(dev, cases[k].n, (uint32_t)k);
        else if (!no_device(rc) || !xfer_engine_last_error(e)[0])
            why = "recv into device memory without a device: no clear error";
        if (why)
            fprintf(stderr, "b: case %zu (%u B): rc %d: %s (%s)\n", k, cases[k].n, rc, why,
                    xfer_engine_last_error(e));
    }
    if (!why)
        why = fp_recv_check(e, hr, p, 99, 64, 99, DEADLINE);
    if (why)
        fprintf(stderr, "b: %s\n", why);
    char c;
    while (read(rfd, &c, 1) > 0) /* until A is done with us */
        ;
    xfer_engine_free(e);
#if XFER_WITH_CUDA
    if (gpu)
        cudaFree(dev);
#endif
    if (!gpu)
        free(dev);
    return why ? 1 : 0;
}

static void run_a(bool long_form)
{
    int rfd = -1, wfd = -1;
    xfer_engine *e;
    xfer_peer *p;
    xfer_region *r;
    pid_t pid = fp_fork_up(side_b, NULL, "dev-a", long_form, &e, &p, &rfd, &wfd);
    assert_true(pid > 0);
    /* B says whether it has a device: this process must not initialize
     * CUDA, the next run forks again (a child of a CUDA process cannot
     * use CUDA) */
    char g = 0;
    assert_int_equal(read(rfd, &g, 1), 1);
    bool gpu = g;
    assert_int_equal(xfer_region_alloc(e, "a", 1 << 17, XFER_ACCESS_RW, &r), 0);
    for (size_t k = 0; k < NCASES; k++) {
        fp_fill(xfer_region_ptr(r), cases[k].n, (uint32_t)k);
        int rc = xfer_send_flags(e, r, 0, cases[k].n, p, k + 1, cases[k].flags, DEADLINE);
        bool ok = gpu || cases[k].flags ? rc == 0 : no_device(rc); /* (local: not told) */
        if (!ok)
            print_message("case %zu (%u B): send %d (%s)\n", k, cases[k].n, rc,
                          xfer_engine_last_error(e));
        assert_true(ok);
    }
    fp_fill(xfer_region_ptr(r), 64, 99);
    assert_int_equal(xfer_send(e, r, 0, 64, p, 99, DEADLINE), 0);
    int st = fp_join(pid, rfd, wfd);
    xfer_engine_free(e);
    assert_int_equal(st, 0);
    if (!gpu)
        print_message("skip-case: no CUDA device: the error paths only\n");
}

/* state: the form A sends (false: short, as built; true: long). */
static void test_msg_device(void **state)
{
    run_a(*(const bool *)*state);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    static bool short_form = false, long_form = true;
    const struct CMUnitTest tests[] = {
        {"messages into device memory, short RTS", test_msg_device, NULL, NULL, &short_form},
        {"messages into device memory, long RTS", test_msg_device, NULL, NULL, &long_form},
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
