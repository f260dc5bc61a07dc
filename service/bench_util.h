/* Small helpers shared by the bench programs and xferctl bench (service/xbench.c): clock, latency
 * samples and percentiles, size arguments ("4K", "1M", "256M"), full reads. */
#ifndef XFER_BENCH_UTIL_H
#define XFER_BENCH_UTIL_H

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static inline double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Latency samples in seconds; grows by doubling, drops samples past 16M. */
struct bench_lat {
    double *v;
    size_t n, cap;
};

static inline void bench_lat_add(struct bench_lat *l, double s)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4096;
        double *v = cap <= (16u << 20) ? realloc(l->v, cap * sizeof(*v)) : NULL;
        if (!v)
            return;
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = s;
}

static inline int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Percentile p (0..100) of the samples, nearest rank; sorts in place. */
static inline double bench_lat_pct(const struct bench_lat *l, double p)
{
    if (l->n == 0)
        return 0;
    qsort(l->v, l->n, sizeof(*l->v), bench_cmp_double);
    size_t k = (size_t)(p / 100.0 * (double)l->n);
    return l->v[k < l->n ? k : l->n - 1];
}

/* "4096", "4K", "1M", "2G" -> bytes; 0 if malformed. */
static inline uint64_t bench_size(const char *s)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 0);
    switch (*end) {
    case 'k':
    case 'K':
        v <<= 10;
        end++;
        break;
    case 'm':
    case 'M':
        v <<= 20;
        end++;
        break;
    case 'g':
    case 'G':
        v <<= 30;
        end++;
        break;
    default:
        break;
    }
    return *end ? 0 : (uint64_t)v;
}

static inline int bench_read_full(int fd, void *buf, size_t len)
{
    uint8_t *p = buf;
    while (len) {
        ssize_t n = read(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* BENCH_PIN="A,B": the calling thread runs on CPU A (which 0: the pinging
 * side) or B (which 1: the echoing side) from now on; unset: nothing. For
 * measuring what a thread's move to another core costs a round trip
 * (docs/perf.md, Step 14, "Where the rest of the user time goes"). */
static inline void bench_pin(int which)
{
    const char *v = getenv("BENCH_PIN");
    int cpu[2];
    if (!v || sscanf(v, "%d,%d", &cpu[0], &cpu[1]) != 2)
        return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu[which != 0], &set);
    if (pthread_setaffinity_np(pthread_self(), sizeof(set), &set) != 0)
        fprintf(stderr, "bench: cannot pin to CPU %d\n", cpu[which != 0]);
}

#endif
