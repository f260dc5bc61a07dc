/*
 * Length framing for control messages: a 4-byte little-endian length, then
 * that many bytes. Lengths above XFER_FRAME_MAX are refused before any
 * allocation. Blocking helpers with a deadline, usable on non-blocking fds.
 */
#ifndef XFER_FRAME_H
#define XFER_FRAME_H

#include <stddef.h>
#include <stdint.h>

#define XFER_FRAME_MAX (4u << 20) /* 4 MiB */

/* Writes the frame within timeout_ms: 0, -XFER_EINVAL (too long),
 * -XFER_ECONN, -XFER_ETIMEDOUT. */
int xfer_frame_send(int fd, const void *buf, size_t len, int timeout_ms);
/* Reads one frame into a malloc'd buffer (*out, caller frees) of *len bytes:
 * 0, -XFER_EPROTO (length over max), -XFER_ECONN (closed/error),
 * -XFER_ETIMEDOUT, -XFER_ENOMEM. max <= XFER_FRAME_MAX. */
int xfer_frame_recv(int fd, size_t max, int timeout_ms, uint8_t **out, size_t *len);

/* Full-buffer I/O with a deadline (ms since CLOCK_MONOTONIC epoch). */
int xfer_io_write_all(int fd, const void *buf, size_t len, int64_t deadline_ms);
int xfer_io_read_all(int fd, void *buf, size_t len, int64_t deadline_ms);
int64_t xfer_now_ms(void);
/* Waits until fd is ready for poll() events or the deadline passes:
 * 0, -XFER_ETIMEDOUT, or -XFER_ECONN when poll fails. */
int xfer_io_wait(int fd, short events, int64_t deadline_ms);

#endif
