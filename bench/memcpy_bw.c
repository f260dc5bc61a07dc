/*
 * memcpy ceiling: GB/s (1e9 bytes/s) of memcpy between two touched buffers,
 * by copy size, with `threads` threads copying disjoint buffers at once
 * (same-host transfers cannot beat this).
 *
 *   memcpy_bw [--sizes 4K,64K,1M,...] [--threads N] [--seconds S] [--json]
 */
#include "bench_util.h"

#include <getopt.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#define BUF_BYTES (256ull << 20)

struct job {
    uint64_t size;
    double seconds;
    uint8_t *src, *dst;
    uint64_t bytes;
    double secs;
};

/* Walks the buffers so large sizes do not just hit the cache. */
static void *copy_main(void *arg)
{
    struct job *j = arg;
    uint64_t slots = BUF_BYTES / j->size, k = 0;
    double t0 = bench_now(), t = t0;
    while (t - t0 < j->seconds) {
        for (int r = 0; r < 16; r++, k++) {
            uint64_t off = k % slots * j->size;
            memcpy(j->dst + off, j->src + off, j->size);
            j->bytes += j->size;
        }
        t = bench_now();
    }
    j->secs = t - t0;
    return NULL;
}

int main(int argc, char **argv)
{
    static const struct option lo[] = {{"sizes", 1, 0, 's'},
                                       {"threads", 1, 0, 'n'},
                                       {"seconds", 1, 0, 't'},
                                       {"json", 0, 0, 'j'},
                                       {0, 0, 0, 0}};
    uint64_t sizes[32] = {4096, 65536, 1 << 20, 16 << 20};
    int n_sizes = 4, threads = 1;
    double seconds = 0.5;
    bool json = false;
    for (int c; (c = getopt_long(argc, argv, "", lo, NULL)) != -1;) {
        if (c == 's') {
            n_sizes = 0;
            for (char *tok = strtok(optarg, ","); tok && n_sizes < 32; tok = strtok(NULL, ","))
                if ((sizes[n_sizes++] = bench_size(tok)) == 0 || sizes[n_sizes - 1] > BUF_BYTES)
                    return 2;
        } else if (c == 'n')
            threads = atoi(optarg);
        else if (c == 't')
            seconds = atof(optarg);
        else if (c == 'j')
            json = true;
        else
            return 2;
    }
    if (threads < 1 || threads > 256 || !(seconds > 0) || optind != argc) {
        fprintf(stderr, "usage: memcpy_bw [--sizes 4K,1M,...] [--threads N] [--seconds S]\n");
        return 2;
    }
    struct job *jobs = calloc((size_t)threads, sizeof(*jobs));
    if (!jobs)
        return 1;
    for (int i = 0; i < threads; i++) {
        jobs[i].src = malloc(BUF_BYTES);
        jobs[i].dst = malloc(BUF_BYTES);
        if (!jobs[i].src || !jobs[i].dst)
            return 1;
        memset(jobs[i].src, 1, BUF_BYTES);
        memset(jobs[i].dst, 2, BUF_BYTES);
    }
    for (int s = 0; s < n_sizes; s++) {
        pthread_t tid[256];
        for (int i = 0; i < threads; i++) {
            jobs[i].size = sizes[s];
            jobs[i].seconds = seconds;
            jobs[i].bytes = 0;
            pthread_create(&tid[i], NULL, copy_main, &jobs[i]);
        }
        double gbps = 0;
        for (int i = 0; i < threads; i++) {
            pthread_join(tid[i], NULL);
            gbps += (double)jobs[i].bytes / jobs[i].secs / 1e9;
        }
        if (json)
            printf("{\"size\":%llu,\"threads\":%d,\"gbps\":%.3f}\n", (unsigned long long)sizes[s],
                   threads, gbps);
        else
            printf("memcpy size=%llu threads=%d: %.2f GB/s\n", (unsigned long long)sizes[s],
                   threads, gbps);
    }
    for (int i = 0; i < threads; i++) {
        free(jobs[i].src);
        free(jobs[i].dst);
    }
    free(jobs);
    return 0;
}
