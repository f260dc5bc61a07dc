/*
 * GPU-initiated transfers, host side: a request ring per GPU and the proxy
 * that turns its requests into engine batches.
 *
 * Kernels post put/get/fence requests into the ring (kernels/xfer_dev.cuh);
 * a proxy thread per ring, placed on the GPU's NUMA node, drains it, groups
 * what it finds into xfer_batch submissions over whatever transport reaches
 * each peer (ipc, tcp, rdma, ...), and writes completion counters and an
 * error word back into memory the kernel polls. The proxy uses only the
 * engine's public API (engine/xfer.h). docs/gpu_initiated.md has the design,
 * the memory ordering and the limits.
 *
 * Life of a ring:
 *   xfer_gpu_ring_new()          memory: pinned + mapped for a GPU ring
 *   xfer_gpu_ring_add_local()    local regions   -> small indices for kernels
 *   xfer_gpu_ring_add_remote()   (peer, region)  -> small indices for kernels
 *   xfer_gpu_ring_device_handle() -> struct xfer_ring_dev, a kernel argument
 *   xfer_gpu_ring_start()        the proxy thread (requests posted before
 *                                 wait in the ring)
 *   ... kernels run ...
 *   xfer_gpu_ring_stop()         no request starts any more; in-flight ones get
 *                                 drain_ms, then are cancelled; every request
 *                                 not finished is failed, counted and reported
 *   xfer_gpu_ring_free()         once no kernel uses the handle any more
 *
 * A "host ring" (config device -1) has the same layout in ordinary memory
 * and is fed by CPU threads through xfer_gpu_ring_host_post(): the same
 * producer code as the kernels' (kernels/xfer_ring_proto.h), for programs
 * without a GPU and for the tests.
 */
#ifndef XFER_GPU_RING_H
#define XFER_GPU_RING_H

#include "xfer.h"
#include "xfer_ring.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct xfer_gpu_ring xfer_gpu_ring;

#define XFER_GPU_RING_NUMA_AUTO (-2) /* the NUMA node of the ring's GPU */

/* Called by the proxy thread for every request that failed, with the
 * request as the producer wrote it, its code and the reason (valid during
 * the call). Must not call back into the ring. */
typedef void (*xfer_gpu_ring_fail_fn)(const struct xfer_ring_slot *req, int err, const char *why,
                                      void *arg);

struct xfer_gpu_ring_config {
    int device;               /* CUDA GPU of the producing kernels; -1 = host ring */
    uint32_t slots;           /* power of two, 2 .. 2^20; default 1024 */
    uint32_t counters;        /* 1 .. 65535; default 256 */
    uint32_t regions_max;     /* local and remote table sizes; default 256 each */
    uint32_t batch_max;       /* requests per engine batch; default 256 */
    uint32_t outstanding_max; /* requests taken out and not finished; default 4096 */
    int deadline_ms;          /* per engine batch; 0 = the engine's default deadline */
    uint64_t timeout_ns;      /* producers' bound on a full ring and on waits; default 10 s */
    uint32_t poll_ns; /* waiting producers, all together, read ring memory at most once per this
                         (a token in producers' memory); default 250 */
    int spin_us;      /* the proxy busy-polls this long after work; default 200 */
    int sleep_us;     /* then sleeps this long between looks; default 50 */
    int numa_node;    /* XFER_GPU_RING_NUMA_AUTO (default), -1 none, or a node */
    xfer_gpu_ring_fail_fn on_fail; /* optional */
    void *on_fail_arg;
};

/* Fills defaults; call before setting fields. */
XFER_API void xfer_gpu_ring_config_init(struct xfer_gpu_ring_config *cfg);

/* A ring for cfg->device (or a host ring) on engine e. Errors (in *err):
 * -XFER_EINVAL (sizes out of range), -XFER_ENODEV (no such CUDA device, or
 * built without CUDA), -XFER_ENOMEM, -XFER_EIO (CUDA refused: the reason is
 * in xfer_engine_last_error(e)). The engine must outlive the ring. */
XFER_API xfer_gpu_ring *xfer_gpu_ring_new(xfer_engine *e, const struct xfer_gpu_ring_config *cfg,
                                          int *err);

/* Stops the ring if running (drain 0), fails what producers posted since,
 * and frees everything. No kernel may use the device handle any more (the
 * caller synchronized its streams). NULL is fine. */
XFER_API void xfer_gpu_ring_free(xfer_gpu_ring *r);

/* Makes local region `local` (of the ring's engine) addressable by kernels:
 * returns its index (>= 0), or -XFER_EINVAL, -XFER_ENOSPC (table full). The
 * region must stay registered until the ring is stopped. Allowed while the
 * proxy runs (an index is usable once returned). */
XFER_API int xfer_gpu_ring_add_local(xfer_gpu_ring *r, xfer_region *local);

/* Same for the remote region named `region` of peer p, whose descriptor
 * must be cached (xfer_peer_region_add): -XFER_ENOENT when it is not. The
 * peer must stay added until the ring is stopped. */
XFER_API int xfer_gpu_ring_add_remote(xfer_gpu_ring *r, xfer_peer *p, const char *region);

/* Starts the proxy thread (once; -XFER_EBUSY after). */
XFER_API int xfer_gpu_ring_start(xfer_gpu_ring *r);

/* The handle kernels take (valid until xfer_gpu_ring_free). */
XFER_API int xfer_gpu_ring_device_handle(const xfer_gpu_ring *r, struct xfer_ring_dev *out);

/* Counter idx as kernels see it: finished requests, of which failed, and
 * the last error. -XFER_EINVAL for a bad index. */
XFER_API int xfer_gpu_ring_counter(const xfer_gpu_ring *r, uint32_t idx, uint64_t *done,
                                   uint64_t *failed, int *last_err);

/* The error word: first failure of any request (sticky), 0 if none. */
XFER_API int xfer_gpu_ring_error(const xfer_gpu_ring *r);
/* Text of the first failure (or of the last API error); valid until the
 * next call on r. */
XFER_API const char *xfer_gpu_ring_last_error(const xfer_gpu_ring *r);

struct xfer_gpu_ring_stats {
    int state;                /* enum xfer_ring_state */
    int error;                /* the error word */
    int numa_node;            /* where the proxy runs; -1 = not placed */
    uint64_t queued;          /* posted and not taken yet (a scan of the ring) */
    uint64_t taken;           /* requests taken out of the ring (fences included) */
    uint64_t completed;       /* finished without error */
    uint64_t failed;          /* finished with an error (including those failed by stop) */
    uint64_t in_flight;       /* taken and not finished */
    uint64_t batches;         /* engine batches submitted */
    uint64_t batch_items_max; /* largest batch */
    uint64_t fences;          /* fences completed */
    uint64_t full_waits;      /* producers that found the ring full (host rings; 0 for GPU rings,
                                 whose count lives in GPU memory) */
};
XFER_API void xfer_gpu_ring_stats(const xfer_gpu_ring *r, struct xfer_gpu_ring_stats *out);

/* What a stop failed. */
struct xfer_gpu_ring_report {
    uint64_t cancelled; /* in flight in the engine at the end of drain_ms: cancelled */
    uint64_t unstarted; /* taken or posted, never started (including a pending fence) */
};

/* Tears the ring down: no request starts any more, in-flight ones get up
 * to drain_ms to finish, then are cancelled; every request not finished is
 * failed (-XFER_ECANCELED on its counter, the error word, on_fail) and
 * counted in *rep (may be NULL). Producers waiting for room or for a
 * counter return. Requests posted after the stop are failed by
 * xfer_gpu_ring_free. 0, or -XFER_EINVAL; a second stop reports nothing. */
XFER_API int xfer_gpu_ring_stop(xfer_gpu_ring *r, int drain_ms, struct xfer_gpu_ring_report *rep);

/* ---- CPU producers -------------------------------------------------------- */

/* Host rings only (-XFER_ENOTSUP on a GPU ring, whose tickets live in GPU
 * memory). Posts request req (op, counter, local, remote, offsets, len, tag; seq is
 * ignored), waiting up to timeout_ns for room (0: -XFER_EBUSY at once;
 * XFER_RING_TIMEOUT_DEFAULT: the ring's bound). Thread-safe. */
XFER_API int xfer_gpu_ring_host_post(xfer_gpu_ring *r, const struct xfer_ring_slot *req,
                                     uint64_t timeout_ns);
/* Waits for counter idx to reach target (see xfer_dev_wait); any ring. */
XFER_API int xfer_gpu_ring_host_wait(xfer_gpu_ring *r, uint32_t idx, uint64_t target,
                                     uint64_t timeout_ns);

#ifdef __cplusplus
}
#endif
#endif /* XFER_GPU_RING_H */
