/*
 * GPU memory over a TCP loopback connection through the pinned staging ring
 * (engine/gpu_stage.c): a sender thread streams device memory of GPU 0, the
 * main thread receives into device memory of the last GPU; the bytes must
 * arrive intact for odd sizes, sizes below one slot, and several ring
 * shapes. Also the slot-level API and its errors. Exits 77 without a GPU.
 *   test_gpu_stage            correctness
 *   test_gpu_stage --bench    + GB/s of GPU->tcp->GPU vs host->tcp->host
 */
#include "gpu_stage.h"
#include "xfer.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#if XFER_WITH_CUDA
#include <cuda_runtime_api.h>
#include "tests/gpu/gpu_check.h"

static int failures;

/* A connected TCP pair on 127.0.0.1. */
static void tcp_pair(int fds[2])
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof(a);
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof(a)) || listen(l, 1) ||
        getsockname(l, (struct sockaddr *)&a, &al)) {
        perror("listen");
        exit(1);
    }
    fds[0] = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(fds[0], (struct sockaddr *)&a, sizeof(a))) {
        perror("connect");
        exit(1);
    }
    fds[1] = accept(l, NULL, NULL);
    if (fds[1] < 0) {
        perror("accept");
        exit(1);
    }
    setsockopt(fds[0], IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    close(l);
}

struct sender {
    struct xfer_gpu_stage *st; /* NULL: host memory */
    int fd;
    const char *src;
    uint64_t len;
    int rc;
};

static void *send_main(void *arg)
{
    struct sender *s = arg;
    if (s->st) {
        s->rc = xfer_gpu_stage_send(s->st, s->fd, s->src, s->len, 60000);
        return NULL;
    }
    for (uint64_t off = 0; off < s->len;) { /* host->host baseline: 4 MiB writes */
        size_t n = s->len - off < (4u << 20) ? (size_t)(s->len - off) : 4u << 20;
        ssize_t w = send(s->fd, s->src + off, n, MSG_NOSIGNAL);
        if (w <= 0) {
            s->rc = -XFER_ECONN;
            return NULL;
        }
        off += (uint64_t)w;
    }
    return NULL;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Streams len bytes from GPU a to GPU b; returns seconds. */
static double transfer(int a, int b, uint64_t len, size_t slot, unsigned nslots, int check)
{
    struct xfer_gpu_stage *sa, *sb;
    int fds[2];
    tcp_pair(fds);
    EXPECT(xfer_gpu_stage_new(a, slot, nslots, &sa) == 0, "stage a");
    EXPECT(xfer_gpu_stage_new(b, slot, nslots, &sb) == 0, "stage b");
    char *h = malloc(len + 1), *back = malloc(len + 1), *src, *dst;
    for (uint64_t i = 0; i < len; i++)
        h[i] = (char)(i * 2654435761u >> 13);
    CK(cudaSetDevice(a));
    CK(cudaMalloc((void **)&src, len + 1));
    CK(cudaMemcpy(src, h, len, cudaMemcpyHostToDevice));
    CK(cudaSetDevice(b));
    CK(cudaMalloc((void **)&dst, len + 1));
    CK(cudaMemset(dst, 0x77, len + 1));
    struct sender snd = {sa, fds[0], src, len, 0};
    pthread_t th;
    double t0 = now_s();
    pthread_create(&th, NULL, send_main, &snd);
    int rc = xfer_gpu_stage_recv(sb, fds[1], dst, len, 60000);
    double t = now_s() - t0;
    pthread_join(th, NULL);
    EXPECT(rc == 0, "recv %llu: %s (%s)", (unsigned long long)len, xfer_strerror(rc),
           xfer_gpu_stage_last_error(sb));
    EXPECT(snd.rc == 0, "send: %s (%s)", xfer_strerror(snd.rc), xfer_gpu_stage_last_error(sa));
    if (check) {
        CK(cudaMemcpy(back, dst, len + 1, cudaMemcpyDeviceToHost));
        EXPECT(memcmp(back, h, len) == 0 && (unsigned char)back[len] == 0x77,
               "%llu bytes, slot %zu x %u: data differs", (unsigned long long)len, slot, nslots);
    }
    CK(cudaFree(dst));
    CK(cudaSetDevice(a));
    CK(cudaFree(src));
    free(h), free(back);
    xfer_gpu_stage_free(sa);
    xfer_gpu_stage_free(sb);
    close(fds[0]), close(fds[1]);
    return t;
}

/* Host->host baseline. Buffers are written before the clock starts (a zero
 * memset may become calloc, leaving the pages untouched and their first-touch
 * faults inside the timing). */
static double host_transfer(uint64_t len)
{
    int fds[2];
    tcp_pair(fds);
    char *src = malloc(len), *dst = malloc(len);
    memset(src, 1, len);
    memset(dst, 2, len);
    struct sender snd = {NULL, fds[0], src, len, 0};
    pthread_t th;
    double t0 = now_s();
    pthread_create(&th, NULL, send_main, &snd);
    for (uint64_t got = 0; got < len;) {
        ssize_t r = recv(fds[1], dst + got, len - got, 0);
        if (r <= 0)
            break;
        got += (uint64_t)r;
    }
    double t = now_s() - t0;
    pthread_join(th, NULL);
    free(src), free(dst);
    close(fds[0]), close(fds[1]);
    return t;
}

static void test_slots(void)
{
    struct xfer_gpu_stage *s;
    void *h;
    EXPECT(xfer_gpu_stage_new(0, 4096, 2, &s) == 0, "new");
    int a = xfer_gpu_stage_get(s, &h), b = xfer_gpu_stage_get(s, NULL);
    EXPECT(a >= 0 && b >= 0 && a != b, "two slots");
    EXPECT(xfer_gpu_stage_get(s, NULL) == -XFER_EBUSY, "ring of two is full");
    EXPECT(xfer_gpu_stage_d2h(s, a, (void *)16, 4097) == -XFER_EINVAL, "longer than a slot");
    EXPECT(xfer_gpu_stage_h2d(s, 5, (void *)16, 1) == -XFER_EINVAL, "no such slot");
    EXPECT(xfer_gpu_stage_poll(s, a) == 0, "idle slot is done");
    xfer_gpu_stage_put(s, a);
    xfer_gpu_stage_put(s, b);
    xfer_gpu_stage_free(s);
    EXPECT(xfer_gpu_stage_new(1 << 20, 0, 0, &s) == -XFER_EINVAL, "bad device");
}

int main(int argc, char **argv)
{
    int ndev = 0;
    struct xfer_gpu_stage *s = NULL;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev <= 0) {
        if (xfer_gpu_stage_new(0, 0, 0, &s) != -XFER_ENODEV) {
            fprintf(stderr, "FAIL: without a device the stage must say -XFER_ENODEV\n");
            return 1;
        }
        printf("skipped: no CUDA device\n");
        return 77;
    }
    int b = ndev - 1;
    test_slots();
    static const struct {
        uint64_t len;
        size_t slot;
        unsigned n;
    } c[] = {{0, 0, 0},
             {1, 0, 0},
             {4095, 4096, 2},
             {4097, 4096, 2},
             {(10u << 20) + 123, 1u << 20, 4},
             {(33u << 20) + 7, 0, 0},
             {(5u << 20) + 1, 65536, 16}};
    for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++)
        transfer(0, b, c[i].len, c[i].slot, c[i].n, 1);
    printf("gpu%d -> tcp loopback -> gpu%d: %zu transfers checked\n", 0, b,
           sizeof(c) / sizeof(c[0]));
    if (argc > 1 && !strcmp(argv[1], "--bench")) {
        const uint64_t len = 1ull << 30;
        static const size_t slots[] = {1u << 20, 4u << 20, 16u << 20};
        double th = 1e9;
        for (int r = 0; r < 3; r++) {
            double t = host_transfer(len);
            th = t < th ? t : th;
        }
        printf("tcp loopback, 1 GiB, best of 3: host->host %.2f GB/s\n", len / th / 1e9);
        for (int i = 0; i < 3; i++) {
            double tg = 1e9;
            for (int r = 0; r < 3; r++) {
                double t = transfer(0, b, len, slots[i], 4, r == 0);
                tg = t < tg ? t : tg;
            }
            printf("tcp loopback, 1 GiB, best of 3: gpu%d->gpu%d %.2f GB/s (4 x %zu MiB slots)\n",
                   0, b, len / tg / 1e9, slots[i] >> 20);
        }
    }
    printf("%s (%d failures)\n", failures ? "FAILED" : "passed", failures);
    return failures ? 1 : 0;
}

#else
int main(void)
{
    struct xfer_gpu_stage *s = NULL;
    if (xfer_gpu_stage_new(0, 0, 0, &s) != -XFER_ENODEV)
        return 1;
    printf("skipped: no CUDA device (built without CUDA)\n");
    return 77;
}
#endif
