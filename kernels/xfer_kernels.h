/*
 * xfer kernels — GPU data-path kernels behind a plain C ABI.
 *
 *  - batched copy: one launch copies N (dst, src, len) descriptors; the bytes
 *    are spread evenly over thread blocks (prefix sum of lengths), 16-byte
 *    vector accesses where src/dst allow, narrower ones elsewhere.
 *  - paged KV gather/scatter: the listed blocks of every layer of a paged KV
 *    pool to/from one contiguous buffer, in one launch.
 *
 * Pointers are device pointers valid on the device of the stream (own memory,
 * or a peer GPU's memory with peer access enabled, or mapped pinned host
 * memory). Copying from GPU a to GPU b is fastest launched on a's stream
 * (local reads, remote writes): see docs/kernels.md.
 *
 * Host-side descriptors and block tables go to the GPU through a staging
 * object (struct xfer_kstage: pinned host + device memory, a small ring of
 * slots), so the caller's arrays may be reused as soon as a call returns.
 * All calls are asynchronous on the given stream (a cudaStream_t passed as
 * void *; NULL means the legacy default stream of the stage's device).
 *
 * Every function returns 0 or a negative XFER_E* code. With no usable CUDA
 * device (no GPU, no driver, or a build without CUDA) they return
 * -XFER_ENODEV. The CPU reference functions (xfer_kref_*) always work and are
 * what the tests compare against.
 *
 * Plain C11: this header needs no CUDA header.
 */
#ifndef XFER_KERNELS_H
#define XFER_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "xfer_err.h" /* XFER_API */

#ifdef __cplusplus
extern "C" {
#endif

/* One copy: len bytes from src to dst. Ranges of one batch must not overlap
 * any destination range of the same batch (they run concurrently). */
struct xfer_copy_desc {
    void *dst;
    const void *src;
    uint64_t len;
};

/*
 * A paged KV pool: num_layers tensors, each [num_blocks][block_stride] bytes,
 * of which the first block_bytes of each block are the payload.
 *  - per-layer tensors: layer_base[l] is layer l's base (num_layers entries;
 *    the array is read during the call only), base is ignored;
 *  - one tensor [layers][num_blocks][block_stride]: layer_base = NULL,
 *    base is the tensor, layer_stride the bytes between layers
 *    (0 means num_blocks * block_stride).
 * block_stride 0 means block_bytes.
 */
struct xfer_kv_layout {
    uint32_t num_layers;
    uint64_t num_blocks;
    uint64_t block_bytes;
    uint64_t block_stride;
    void *const *layer_base;
    void *base;
    uint64_t layer_stride;
};

/*
 * The contiguous side of a gather/scatter is layer-major:
 *   buf[(l * n_ids + i) * block_bytes ...] = block ids[i] of layer l.
 * So a gather on one node with its block ids and a scatter on another with
 * different ids move "blocks 7, 19, 3" into "blocks 40, 2, 11".
 */

/* Number of CUDA devices in *count (may be NULL): 0, or -XFER_ENODEV when
 * there is no usable device or driver. Never crashes without a GPU. */
int xfer_kernels_probe(int *count);

/* Loads every kernel of this library on GPU `device` now (and sets their
 * launch attributes). CUDA loads modules lazily on first launch, and a load
 * may wait for the whole context: a kernel that spins until one of ours has
 * run (a GPU-initiated transfer waiting for an ipc batched copy) would
 * deadlock. 0, -XFER_ENODEV, -XFER_EIO. The caller's current device is kept. */
int xfer_kernels_preload(int device);

struct xfer_kstage;

/* Creates staging for device `device` (pinned host + device memory, grown on
 * demand). One stage serves one thread at a time; it may be used with any
 * stream of its device. Returns 0 and *out, or -XFER_ENODEV/-XFER_EINVAL/
 * -XFER_ENOMEM. Free with xfer_kstage_free(), which waits for the stage's
 * launches to finish. */
int xfer_kstage_new(int device, struct xfer_kstage **out);
void xfer_kstage_free(struct xfer_kstage *s);
/* Text of the stage's last error ("" if none); valid until the next call. */
const char *xfer_kstage_last_error(const struct xfer_kstage *s);

/* Copies n descriptors in one launch on `stream`. The descriptor array is
 * read before the call returns. Zero-length descriptors are allowed; n == 0
 * does nothing. -XFER_EINVAL for NULL pointers with len > 0. */
int xfer_kernels_batched_copy(struct xfer_kstage *s, const struct xfer_copy_desc *d, size_t n,
                              void *stream);

/* Segment lists as copies without a descriptor array of the caller's: run
 * r copies, for each of its n segments (three uint64 each: a_off, b_off,
 * len; the layout of the engine's struct xfer_seg), len bytes between
 * a + a_off and b + b_off, into a when a_is_dst, else into b. The
 * segments are read before the call returns. */
struct xfer_copy_run {
    char *a, *b;
    const uint64_t *segs;
    size_t n;
    int a_is_dst;
};
/* Host part of a runs launch (no CUDA): writes the runs' descriptors to
 * d[0..N) and their byte offsets in the concatenation to start[0..N]
 * (start[N] = total), N = the runs' segments, in one pass without a
 * branch per segment; *mis gets the OR of dst ^ src of every copy (the
 * 16-byte alignment test). Returns the total bytes. */
uint64_t xfer_copy_runs_fill(const struct xfer_copy_run *r, size_t nr, struct xfer_copy_desc *d,
                             uint64_t *start, uint64_t *mis);
/* One launch of every segment of runs r[0..nr), descriptors written
 * straight into the stage's pinned slot and uploaded with one copy.
 * total: the runs' bytes as the caller counted them (sizes the staging;
 * -XFER_EINVAL if the segments add up to something else). */
int xfer_kernels_batched_copy_runs(struct xfer_kstage *s, const struct xfer_copy_run *r, size_t nr,
                                   uint64_t total, void *stream);

/* Block lists as copies, the addressing done on the GPU from block ids
 * (the engine's block items, engine/xfer.h struct xfer_block_list):
 * segment k of nstreams x nids (stream k / nids, id k % nids) is len bytes
 * between a + a_base[stream] + a_ids[id] * a_stride and b + b_base[stream]
 * + b_ids[id] * b_stride, into a when a_is_dst, else into b; a run copies
 * its segments [s0, s1). The arrays are read before a call returns (runs
 * sharing an id array by pointer upload it once): a KV pool request of
 * 512 blocks x 64 streams is ~10 KiB of staging instead of 786 KiB of
 * descriptors written by the CPU. */
struct xfer_block_run {
    char *a, *b;
    const uint64_t *a_base, *b_base; /* nstreams each */
    const uint64_t *a_ids, *b_ids;   /* nids each */
    uint64_t a_stride, b_stride, len;
    uint32_t nstreams, nids;
    uint32_t s0, s1;
    int a_is_dst;
};
/* Checks runs r[0..nr) (no NULL arrays, len > 0, s0 < s1 <= nstreams *
 * nids, no byte total past 2^64; the addresses are the caller's): 0 and
 * *total, or -XFER_EINVAL with the bad run in *bad. No CUDA. */
int xfer_block_runs_check(const struct xfer_block_run *r, size_t nr, uint64_t *total, size_t *bad);
/* One launch of every segment of runs r[0..nr) on `stream`. */
int xfer_kernels_block_runs(struct xfer_kstage *s, const struct xfer_block_run *r, size_t nr,
                            void *stream);
/* CPU reference (host memory): the same copies with memcpy. */
int xfer_kref_block_runs(const struct xfer_block_run *r, size_t nr);

/* Copies layout's blocks ids[0..n_ids) of every layer into buf (gather) or
 * buf into them (scatter), in one launch. ids are read before the call
 * returns. -XFER_ERANGE if an id >= num_blocks, -XFER_EINVAL for a bad
 * layout. Scatter with a repeated id leaves that block holding one of the
 * sources (which one is unspecified). */
int xfer_kernels_kv_gather(struct xfer_kstage *s, const struct xfer_kv_layout *lay,
                           const uint64_t *ids, size_t n_ids, void *buf, void *stream);
int xfer_kernels_kv_scatter(struct xfer_kstage *s, const struct xfer_kv_layout *lay,
                            const uint64_t *ids, size_t n_ids, const void *buf, void *stream);

/*
 * Engine helper: batched device-to-device copies with tickets, for a
 * transport that would otherwise issue one cudaMemcpyAsync per item (the ipc
 * transport's GPU<->GPU items). One object per connection or thread; it owns
 * a stage and a non-blocking stream per device it launches on.
 *
 * Worth it from about XFER_KBATCH_MIN_ITEMS items (docs/kernels.md: a lone
 * launch costs ~20-40 us of staging + launch; one 16 KiB cudaMemcpyAsync
 * ~4 us); fewer items: keep per-item copies.
 */
#define XFER_KBATCH_MIN_ITEMS 8

struct xfer_kbatch;

/* 0 and *out, or -XFER_ENODEV (no GPU) / -XFER_ENOMEM. */
int xfer_kbatch_new(struct xfer_kbatch **out);
/* Waits (at most 30 s) for outstanding launches, then frees; NULL is fine. */
void xfer_kbatch_free(struct xfer_kbatch *b);

/* Starts one launch on GPU `exec` copying d[0..n) (read before returning).
 * Every pointer is device memory of exec or of a GPU in peer_mask (bit i =
 * device i), for which peer access from exec is enabled here on first use.
 * Launch on the source GPU (push) for GPU->GPU items. Returns a ticket >= 0,
 * or -XFER_ENOTSUP when exec cannot reach a GPU of peer_mask as a peer
 * (then use copy-engine copies, e.g. cudaMemcpyPeerAsync), -XFER_EINVAL,
 * -XFER_ENODEV, -XFER_EIO. */
int xfer_kbatch_start(struct xfer_kbatch *b, int exec, uint64_t peer_mask,
                      const struct xfer_copy_desc *d, size_t n);
/* The same for segment runs (xfer_kernels_batched_copy_runs). */
int xfer_kbatch_start_runs(struct xfer_kbatch *b, int exec, uint64_t peer_mask,
                           const struct xfer_copy_run *r, size_t nr, uint64_t total);
/* Segment runs r[0..nr) (total bytes, as xfer_kbatch_start_runs; nr may
 * be 0) and then copy-engine copies ce[0..nce) (one cudaMemcpyAsync each:
 * for segments of 16 MiB and more, where the copy engine is ahead of the
 * kernel), one ticket for all. */
int xfer_kbatch_start_copies(struct xfer_kbatch *b, int exec, uint64_t peer_mask,
                             const struct xfer_copy_run *r, size_t nr, uint64_t total,
                             const struct xfer_copy_desc *ce, size_t nce);
/* The same for block runs (xfer_kernels_block_runs). */
int xfer_kbatch_start_blocks(struct xfer_kbatch *b, int exec, uint64_t peer_mask,
                             const struct xfer_block_run *r, size_t nr);
/* 0 when the ticket's copies are done (the ticket is then freed),
 * -XFER_EINPROGRESS while running, else the CUDA error (ticket freed). */
int xfer_kbatch_poll(struct xfer_kbatch *b, int ticket);
/* With XFER_KBATCH_TRACE=1 in the environment at xfer_kbatch_new: the GPU
 * microseconds from just before the launch of ticket's last completion
 * (polled 0) to its end, for traces; else -1. */
double xfer_kbatch_gpu_us(const struct xfer_kbatch *b, int ticket);
/* poll() until done or timeout_ms: -XFER_ETIMEDOUT keeps the ticket. */
int xfer_kbatch_wait(struct xfer_kbatch *b, int ticket, int timeout_ms);
/* Text of the last error ("" if none). */
const char *xfer_kbatch_last_error(const struct xfer_kbatch *b);

/*
 * TCPX receive unpack: a receive that GPUDirect-TCPX (or any NCCL net plugin
 * in "unpack" device mode) delivered into its bounce buffer, described as
 * fragments, is copied into place. Three methods (docs/tcpx.md measures
 * them): one kernel launch for all fragments, one device-to-device copy per
 * fragment, or a host-mediated gather (one D2H of the bounce span, a CPU
 * gather, one copy out).
 */

/* len bytes at src_off of the bounce buffer belong at dst_off of the
 * destination: the 16-byte layout of NCCL's unpack metadata (loadMeta). */
struct xfer_unpack_frag {
    uint32_t src_off;
    uint32_t len;
    uint64_t dst_off;
};

enum xfer_unpack_method { XFER_UNPACK_KERNEL = 0, XFER_UNPACK_D2D, XFER_UNPACK_HOST };

/* "kernel" | "d2d" | "host" -> *m; -XFER_EINVAL for anything else. */
XFER_API int xfer_unpack_method_parse(const char *s, enum xfer_unpack_method *m);
XFER_API const char *xfer_unpack_method_name(enum xfer_unpack_method m);

/* Checks what a plugin reported before anything is copied: every fragment
 * inside the bounce buffer (bounce_len; 0 = unknown, not checked) and inside
 * [0, total) of the destination, no two overlapping there, lengths adding up
 * to total (so together they cover it exactly). 0, or -XFER_ERANGE /
 * -XFER_EPROTO (overlap, sum) / -XFER_ENOMEM, the first bad fragment's index
 * in *bad (may be NULL). The array is not modified. */
XFER_API int xfer_unpack_check(const struct xfer_unpack_frag *f, size_t n, uint64_t bounce_len,
                               uint64_t total, size_t *bad);

struct xfer_unpacker;

/* For GPU `device`: a stream of its own, a pinned fragment buffer and a
 * pinned gather buffer, grown on demand. One unpack in flight at a time,
 * one thread at a time. 0 and *out, or -XFER_ENODEV / -XFER_ENOMEM. */
XFER_API int xfer_unpacker_new(int device, struct xfer_unpacker **out);
/* Waits (bounded) for the unpack in flight, then frees; NULL is fine. */
XFER_API void xfer_unpacker_free(struct xfer_unpacker *u);
/* Starts copying the n fragments (array read before returning) from bounce
 * to dst. Either pointer may be memory of the unpacker's device or host
 * memory; kernel and d2d need a device destination and fall back to host
 * otherwise (xfer_unpacker_method() says what ran). No bounds checks: call
 * xfer_unpack_check() first. */
XFER_API int xfer_unpacker_start(struct xfer_unpacker *u, enum xfer_unpack_method m, void *dst,
                                 const void *bounce, const struct xfer_unpack_frag *f, size_t n);
/* 0 when the unpack finished, -XFER_EINPROGRESS, or -XFER_EIO. */
XFER_API int xfer_unpacker_poll(struct xfer_unpacker *u);
/* poll() until done or timeout_ms (-XFER_ETIMEDOUT). */
XFER_API int xfer_unpacker_wait(struct xfer_unpacker *u, int timeout_ms);
XFER_API enum xfer_unpack_method xfer_unpacker_method(const struct xfer_unpacker *u);
/* Kernel launches and copy calls issued so far (for the measurements). */
XFER_API uint64_t xfer_unpacker_launches(const struct xfer_unpacker *u);
XFER_API uint64_t xfer_unpacker_copies(const struct xfer_unpacker *u);
XFER_API const char *xfer_unpacker_last_error(const struct xfer_unpacker *u);

/* Pointer helpers for plugin-owned memory: the CUDA device whose memory p
 * is (>= 0), or -1 for host memory (always -1 without CUDA); the host
 * address of mapped pinned memory known by its device address (p itself
 * when p is not CUDA memory, NULL for device memory); a synchronous copy
 * between any two memories (memcpy when both are host memory). */
XFER_API int xfer_kernels_ptr_device(const void *p);
XFER_API void *xfer_kernels_host_ptr(void *p);
XFER_API int xfer_kernels_copy(void *dst, const void *src, size_t len);

/* Benchmark knobs: bytes per thread block (multiple of 16, 0 = automatic),
 * threads per block (32..512, multiple of 32, 0 = automatic) and kernel
 * variant (0 = automatic; 1..4: 16-byte vector copy with 4 or 8 loads in
 * flight per thread, 3 and 4 with streaming cache hints; 5: Hopper bulk
 * copy engine, used only where every src/dst pair agrees modulo 16, else
 * automatic). Process-wide, not thread-safe; meant for bench_kernels and the
 * tests (XFER_KERNELS_VARIANT / XFER_KERNELS_CHUNK set it from the
 * environment at the first launch, for programs that do not call it). */
void xfer_kernels_tune(uint64_t chunk_bytes, unsigned threads, int variant);
/* How xfer_kernels_block_runs hands its runs to the GPU: 0 (default) in
 * the launch's parameters when they fit (16 KiB: a request of 512 blocks
 * over 64 streams), else as 1; 1 uploaded on the stage's own stream; 2
 * uploaded on the launch's stream. XFER_KSTAGE_UPLOAD=param|up|same sets
 * it at the first launch. Benchmark and test knob, process-wide. */
void xfer_kernels_tune_upload(int mode);

/* CPU reference implementations on host memory (same semantics). */
void xfer_kref_batched_copy(const struct xfer_copy_desc *d, size_t n);
int xfer_kref_kv_gather(const struct xfer_kv_layout *lay, const uint64_t *ids, size_t n_ids,
                        void *buf);
int xfer_kref_kv_scatter(const struct xfer_kv_layout *lay, const uint64_t *ids, size_t n_ids,
                         const void *buf);
XFER_API void xfer_kref_unpack(void *dst, const void *bounce, const struct xfer_unpack_frag *f,
                               size_t n);
/* Checks a layout and ids (shared by the GPU and CPU paths): 0,
 * -XFER_EINVAL or -XFER_ERANGE. */
int xfer_kv_check(const struct xfer_kv_layout *lay, const uint64_t *ids, size_t n_ids);
/* Address of block `id` of layer l (no checks). */
char *xfer_kv_block_addr(const struct xfer_kv_layout *lay, uint32_t l, uint64_t id);

#ifdef __cplusplus
}
#endif
#endif
