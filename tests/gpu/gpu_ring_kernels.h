/* Kernels of the GPU request ring tests and benches
 * (tests/gpu/gpu_ring_kernels.cu), behind a C ABI for tests/gpu/gpu_ring.c.
 * Every launcher is asynchronous on `stream` (a cudaStream_t) and returns 0
 * or -1 (launch error, printed). Data patterns are node_common.h's
 * pattern_fill(seed, base) at 8-byte aligned positions. */
#ifndef XFER_GPU_RING_KERNELS_H
#define XFER_GPU_RING_KERNELS_H

#include <stdint.h>

#include "xfer_ring.h"

#ifdef __cplusplus
extern "C" {
#endif

enum gr_put_mode {
    GR_PUT_BLOCK = 0, /* thread 0 of each block puts the block's slice */
    GR_PUT_WARP = 1,  /* each warp puts its part with xfer_dev_put_warp */
    GR_PUT_LANES = 2, /* each thread puts its part, one reservation per warp */
};

/* Block b fills [b*slice, +slice) of buf (the local region `local`) with
 * the pattern, puts it to the same offsets of `remote` (mode), counter
 * ctr0 + b, then thread 0 waits for that counter. rc[b] = 0 or the first
 * error of the block (rc zeroed by the caller). slice % (threads * 8) == 0. */
int gr_launch_slices(const struct xfer_ring_dev *r, uint32_t local, uint32_t remote, uint8_t *buf,
                     uint64_t slice, uint64_t seed, int mode, uint32_t ctr0, int blocks,
                     int threads, int *rc, void *stream);

/* Block b gets [b*slice, +slice) of `remote` into back (local region
 * `local`), waits on counter ctr0 + b, then compares with the pattern:
 * mismatching bytes are added to *bad. */
int gr_launch_get_check(const struct xfer_ring_dev *r, uint32_t local, uint32_t remote,
                        uint8_t *back, uint64_t slice, uint64_t seed, uint32_t ctr0, int blocks,
                        int *rc, unsigned long long *bad, void *stream);

/* One thread: iters times put [0, len) and wait for counter ctr to move
 * (the previous value + 1); ns[i] = globaltimer of put -> counter. */
int gr_launch_latency(const struct xfer_ring_dev *r, uint32_t local, uint32_t remote, uint8_t *buf,
                      uint64_t len, uint32_t ctr, int iters, uint64_t *ns, int *rc, void *stream);

/* One block of 1024 threads fills [0, len) of buf with the pattern; with
 * put, thread 0 then puts it and waits for counter ctr to reach target. */
int gr_launch_produce(const struct xfer_ring_dev *r, uint32_t local, uint32_t remote, uint8_t *buf,
                      uint64_t len, uint64_t seed, int put, uint32_t ctr, uint64_t target, int *rc,
                      void *stream);

/* Each thread posts per_thread puts of len bytes (distinct offsets modulo
 * span) counted on counter (block % counters); lanes: one reservation per
 * warp. No waiting in the kernel. */
int gr_launch_rate(const struct xfer_ring_dev *r, uint32_t local, uint32_t remote, uint64_t len,
                   uint64_t span, int per_thread, int lanes, int blocks, int threads,
                   uint32_t counters, int *rc, void *stream);

/* Block b computes compute_iters FMA rounds over its slice of buf (as
 * floats), then (put) thread 0 puts the slice on counter b % counters
 * without waiting. */
int gr_launch_overlap(const struct xfer_ring_dev *r, uint32_t local, uint32_t remote, uint8_t *buf,
                      uint64_t slice, int compute_iters, int put, int blocks, uint32_t counters,
                      int *rc, void *stream);

/* One warp, each lane streaming rounds of put + wait (counter = lane) on
 * its own 64 KiB until a wait or put fails or max_rounds: out[0] = the first
 * error, out[1] = the error word read by the kernel, out[2] = rounds done. */
int gr_launch_stream(const struct xfer_ring_dev *r, uint32_t local, uint32_t remote, int max_rounds,
                     long long *out, void *stream);

#ifdef __cplusplus
}
#endif
#endif
