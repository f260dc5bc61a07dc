/* Internal (CUDA C++ only): launches on device-resident descriptors. */
#ifndef XFER_KLAUNCH_H
#define XFER_KLAUNCH_H

#include <cuda_runtime.h>
#include <stdint.h>

/* Grid shape: bytes per thread block and threads per block. */
struct kgrid {
    uint64_t chunk;
    unsigned threads;
    int variant;
};

/* Picks the grid and variant for `total` bytes on a device with `sms`
 * multiprocessors and compute capability cc_major, honouring
 * xfer_kernels_tune(). aligned: every piece has src == dst modulo 16 and
 * starts 16-byte aligned in whole 16-byte units (the bulk engine may run). */
struct kgrid kgrid_pick(uint64_t total, int sms, int cc_major, bool aligned);
/* The same for block runs (bulk engine: smaller ranges per thread block). */
struct kgrid kgrid_pick_blocks(uint64_t total, int sms, int cc_major, bool aligned);
/* Thread blocks of a launch of `total` bytes. */
unsigned kgrid_blocks(uint64_t total, struct kgrid g);

/* desc: n descriptors {dst, src, len} (24 bytes each) in device memory;
 * start: n + 1 prefix sums of len, start[n] == total; first: per thread
 * block, the first descriptor whose bytes reach past the block's start. */
cudaError_t klaunch_batched_copy(const uint64_t *desc, const uint64_t *start, const uint32_t *first,
                                 uint32_t n, uint64_t total, struct kgrid g, cudaStream_t st);

/* layer_base: one block-table base per layer; ids: n_ids block ids; both in
 * device memory. buf is the contiguous side (layer-major). */
cudaError_t klaunch_kv(const uint64_t *layer_base, const uint64_t *ids, uint64_t n_ids,
                       uint32_t layers, uint64_t block_bytes, uint64_t block_stride, char *buf,
                       int scatter, struct kgrid g, cudaStream_t st);

/* A block run as the kernel reads it (kstage.cu stages it): device
 * pointers to its stream bases and ids, and its first segment. */
struct kbrun {
    char *a, *b;
    const uint64_t *a_base, *b_base, *a_ids, *b_ids;
    uint64_t a_stride, b_stride, len;
    uint64_t s0, nids, a_is_dst;
};

/* A launch's block runs carried in its parameters (no upload): nr kbrun,
 * nr + 1 prefix sums, then the arrays, in w; each run's array fields are
 * byte offsets into w. 16 KiB: a KV pool request of 512 blocks over 64
 * streams takes ~12.5 KiB; larger ones are staged (kstage.cu). Parameters
 * past 4 KiB need CUDA 12.1 and a driver of r530 or later. */
#define KPARAM_WORDS 2040
struct kparam_blob {
    uint64_t total, chunk;
    uint32_t nr, pad;
    uint64_t w[KPARAM_WORDS];
};
cudaError_t klaunch_block_runs_param(const struct kparam_blob *p, struct kgrid g, cudaStream_t st);

/* runs: nr block runs; start: nr + 1 prefix sums of their bytes (start[nr]
 * == total); both in device memory. Each thread block finds its run by a
 * binary search and computes every address from the ids. */
cudaError_t klaunch_block_runs(const struct kbrun *runs, const uint64_t *start, uint32_t nr,
                               uint64_t total, struct kgrid g, cudaStream_t st);

/* Whether kernels on GPU dev (the current device) can read memory of GPU
 * peer: the same GPU, or a peer whose access from dev is enabled (here, on
 * the first ask). *on / *bad cache the answer per peer (bit peer) so the
 * CUDA calls run once per pair; peers outside [0, 64) are never reached.
 * Without peer access a kernel reading the peer's memory faults (an illegal
 * address that kills the context): callers copy with the copy engine or
 * refuse instead. */
bool kpeer_reach(int dev, int peer, uint64_t *on, uint64_t *bad);

/* Loads the TCPX unpack kernel on the current device (kunpack.cu), for
 * xfer_kernels_preload. */
cudaError_t kunpack_preload(void);

#endif
