/*
 * Pinned host staging ring for moving GPU memory over a byte stream (the tcp
 * transport): device memory is copied into pinned host slots (D2H) before it
 * is sent, and received bytes are copied from slots into device memory (H2D),
 * with the copies of one chunk overlapping the socket I/O of the next.
 *
 * Two ways to use it:
 *  - slot level, for an event loop (non-blocking): get a free slot, start a
 *    D2H into it or fill it from the socket and start an H2D out of it, poll
 *    the slot from the progress loop, put it back when done;
 *  - whole transfers on a connected socket: xfer_gpu_stage_send/recv, which
 *    run the pipeline themselves with poll() and a deadline.
 *
 * One stage belongs to one thread at a time (a tcp progress thread). Without
 * a CUDA device every call returns -XFER_ENODEV.
 */
#ifndef XFER_GPU_STAGE_H
#define XFER_GPU_STAGE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct xfer_gpu_stage;

/* nslots pinned buffers of slot_bytes each (0, 0: 4 x 4 MiB) for GPU
 * `device`, plus one stream per direction. 0 and *out, or -XFER_ENODEV,
 * -XFER_EINVAL, -XFER_ENOMEM. */
int xfer_gpu_stage_new(int device, size_t slot_bytes, unsigned nslots, struct xfer_gpu_stage **out);
/* Waits (bounded) for copies in flight, then frees; NULL is fine. */
void xfer_gpu_stage_free(struct xfer_gpu_stage *s);
size_t xfer_gpu_stage_slot_bytes(const struct xfer_gpu_stage *s);
/* Text of the last error ("" if none); valid until the next call. */
const char *xfer_gpu_stage_last_error(const struct xfer_gpu_stage *s);

/* Takes a free slot: its index (>= 0) and host buffer (slot_bytes long,
 * valid until xfer_gpu_stage_put), or -XFER_EBUSY when none is free. */
int xfer_gpu_stage_get(struct xfer_gpu_stage *s, void **host);
/* Starts copying len (<= slot_bytes) bytes of device memory into the slot. */
int xfer_gpu_stage_d2h(struct xfer_gpu_stage *s, int slot, const void *dev_src, size_t len);
/* Starts copying the slot's first len bytes into device memory. */
int xfer_gpu_stage_h2d(struct xfer_gpu_stage *s, int slot, void *dev_dst, size_t len);
/* 0 when the slot's last copy finished (or none was started),
 * -XFER_EINPROGRESS while it runs, -XFER_EIO if it failed. Never blocks. */
int xfer_gpu_stage_poll(struct xfer_gpu_stage *s, int slot);
/* Polls until done or timeout_ms passed (-XFER_ETIMEDOUT). */
int xfer_gpu_stage_wait(struct xfer_gpu_stage *s, int slot, int timeout_ms);
/* Gives the slot back. Its copy must have finished (poll() returned 0). */
void xfer_gpu_stage_put(struct xfer_gpu_stage *s, int slot);

/* Sends len bytes of device memory on a connected socket (blocking or not):
 * D2H of the next slots runs while the current one is written. 0, or
 * -XFER_ETIMEDOUT (timeout_ms for the whole transfer), -XFER_ECONN, -XFER_EIO. */
int xfer_gpu_stage_send(struct xfer_gpu_stage *s, int fd, const void *dev_src, uint64_t len,
                        int timeout_ms);
/* Receives len bytes into device memory: H2D of a slot runs while the next
 * one is read. Returns once every byte is in device memory. */
int xfer_gpu_stage_recv(struct xfer_gpu_stage *s, int fd, void *dev_dst, uint64_t len,
                        int timeout_ms);

#ifdef __cplusplus
}
#endif
#endif
