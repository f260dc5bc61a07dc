/*
 * ipc_node: test and benchmark driver of the ipc transport. One binary, two
 * roles in two processes: `serve` (the owner: registers regions, answers
 * checksum/deregister commands on stdin) and a driver (`host`, `gpu`,
 * `bench`) that starts `serve` as a child over pipes and moves data.
 */
#ifndef IPC_TEST_H
#define IPC_TEST_H

#include "xfer.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Position-weighted checksum, the same on host and GPU (order-independent
 * sum, so a GPU computes it with atomics). */
static inline uint64_t ipc_sum_weight(uint64_t i)
{
    return i * 0x9E3779B97F4A7C15ull + 1;
}
uint64_t ipc_sum_host(const void *p, size_t len);
/* Deterministic fill: byte i = f(seed, i). */
void ipc_fill_host(void *p, size_t len, uint64_t seed);

/* GPU helpers (ipc_gpu_util.cu); return 0 or -1. */
int ipc_gpu_count(void);
int ipc_gpu_alloc(int dev, size_t len, bool cumem, void **out);
void ipc_gpu_free(int dev, void *p, bool cumem, size_t len);
int ipc_gpu_fill(int dev, void *p, size_t len, uint64_t seed);
int ipc_gpu_sum(int dev, const void *p, size_t len, uint64_t *out);
int ipc_gpu_can_peer(int a, int b);
/* Baseline for the benchmark: cudaMemcpyPeerAsync, GB/s over reps. */
double ipc_gpu_peer_gbps(void *dst, int ddev, const void *src, int sdev, size_t len, int slots,
                         int reps);

/* The child owner process, seen from the driver. */
struct owner {
    int to, from;    /* pipes: commands to the child, answers from it */
    char rbuf[8192]; /* answer bytes not yet consumed */
    size_t rlen;
    int pid;
    struct xfer_peer_desc desc;
    struct xfer_region_desc regions[32];
    int nregions;
};

/* Starts `ipc_node serve args...`; reads its descriptors up to READY. */
int owner_start(struct owner *o, const char *const *args);
/* Sends a command line, reads one answer line into buf. */
int owner_cmd(struct owner *o, char *buf, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
int owner_stop(struct owner *o);
const struct xfer_region_desc *owner_region(const struct owner *o, const char *name);
/* Remote checksum of [off, off+len) of region name. */
int owner_sum(struct owner *o, const char *name, uint64_t off, uint64_t len, uint64_t *out);

/* A driver-side engine connected to the owner, regions cached. */
xfer_engine *driver_engine(const char *node, struct owner *o, xfer_peer **peer);

int run_host_tests(int argc, char **argv);
int run_gpu_tests(int argc, char **argv);
int run_bench(int argc, char **argv);
int run_fault_tests(int argc, char **argv);
int run_serve(int argc, char **argv);

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                   \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

#endif
