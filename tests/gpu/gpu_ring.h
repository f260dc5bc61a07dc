/* Shared by the GPU request ring test (tests/gpu/gpu_ring.c) and its
 * bench (tests/gpu/gpu_ring_bench.c): targets (where kernels' puts land),
 * the kernels' local GPU memory, rings over them. */
#ifndef XFER_TEST_GPU_RING_H
#define XFER_TEST_GPU_RING_H

#include "gpu_check.h"
#include "gpu_ring_kernels.h"
#include "ring_common.h"
#include "xfer_gpu_ring.h"

#include <sys/types.h>

extern int failures;

/* A receiving engine with region "dst" of len bytes on GPU gpu (host
 * memory for gpu -1): in this process ("local", over tcp) or in a child
 * process ("tcp", "ipc"); the client engine e reaches it as peer p. */
struct target {
    const char *kind;
    unsigned transport;
    xfer_engine *e; /* the kernels' side */
    xfer_peer *p;
    uint64_t len;
    /* child */
    pid_t pid;
    int to, from;
    /* in this process */
    xfer_engine *pe;
    xfer_region *pdst, *phdst;
    void *pmem;
    int pgpu;
};

/* kind: "local" | "tcp" | "ipc". 0 or -1 (reason printed). */
int target_open(struct target *t, const char *kind, int peer_gpu, uint64_t len);
/* The receiver compares [0, len) of dst with pattern seed: 0 when equal. */
int target_verify(struct target *t, uint64_t seed, uint64_t len);
void target_signal(struct target *t, int sig); /* child only */
int target_freeze(struct target *t);           /* SIGSTOP, until every thread stopped */
void target_close(struct target *t);

/* Memory of the kernels: GPU buf (local index 0) and back (1), and a host
 * region hbuf (2) of HDST_LEN bytes; the receiver has GPU "dst" (remote 0)
 * and host "hdst" (remote 1) of HDST_LEN bytes. */
#define HDST_LEN (32ull << 20)
struct local {
    uint8_t *buf, *back;
    uint64_t len, back_len;
    xfer_region *rbuf, *rback, *rhbuf;
};
int local_open(struct local *l, xfer_engine *e, uint64_t len, uint64_t back_len);
void local_close(struct local *l, xfer_engine *e);

/* A ring on GPU 0 over t and l (locals buf 0, back 1, hbuf 2; remotes
 * dst 0, hdst 1), started. */
xfer_gpu_ring *ring_open(struct target *t, struct local *l, struct xfer_gpu_ring_config *cfg,
                         struct xfer_ring_dev *dev);
/* Waits for the stream up to seconds: 0, or -1 (the program cannot go on
 * safely: a kernel still runs). */
int stream_wait(cudaStream_t s, double seconds);
/* Waits until counters [0, n) reached want[i] (bounded); 0 or first error. */
int counters_wait(xfer_gpu_ring *r, uint32_t n, const uint64_t *want);

int gpu_ring_bench(const char *cases, int peer_gpu);

#endif
