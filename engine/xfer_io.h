/*
 * The engine's clock and deadline I/O: blocking helpers bounded by a
 * deadline, usable on non-blocking fds, and length-framed messages
 * (proto/frame.h: a 4-byte little-endian length, then that many bytes, at
 * most XFER_FRAME_MAX). Used by the transports' handshakes and by
 * xferd/xferctl's control connections; not part of libxfer.so's API. The
 * layers above the engine (node/) reach its interval clock through here.
 */
#ifndef XFER_IO_H
#define XFER_IO_H

#include "frame.h"
#include "mono_clock.h" /* xfer_mono_ns, xfer_mono_after_ms, xfer_cond_init_mono */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Milliseconds of CLOCK_MONOTONIC: deadlines are in this clock. */
int64_t xfer_now_ms(void);
/* Waits until fd is ready for poll() events or the deadline passes:
 * 0, -XFER_ETIMEDOUT, or -XFER_ECONN when poll fails. */
int xfer_io_wait(int fd, short events, int64_t deadline_ms);
/* Full-buffer I/O with a deadline: 0, -XFER_ECONN, -XFER_ETIMEDOUT. */
int xfer_io_write_all(int fd, const void *buf, size_t len, int64_t deadline_ms);
int xfer_io_read_all(int fd, void *buf, size_t len, int64_t deadline_ms);

/* Listens on TCP addr:port (a numeric IPv4 or IPv6 address; port 0: any
 * free one): *fd gets the socket (SOCK_CLOEXEC, SO_REUSEADDR, and
 * SOCK_NONBLOCK when nonblock), *bound the port it got. 0, -XFER_EINVAL
 * (addr is not an IP address) or -XFER_EIO (socket, bind or listen
 * failed), the reason in why. The transports' data and control listeners
 * and xferd's control port. */
int xfer_listen_tcp(const char *addr, uint16_t port, int backlog, bool nonblock, int *fd,
                    uint16_t *bound, char *why, size_t why_len);
/* Writes the frame within timeout_ms: 0, -XFER_EINVAL (too long),
 * -XFER_ECONN, -XFER_ETIMEDOUT. */
int xfer_frame_send(int fd, const void *buf, size_t len, int timeout_ms);
/* Reads one frame into a malloc'd buffer (*out, caller frees) of *len bytes:
 * 0, -XFER_EPROTO (length over max), -XFER_ECONN (closed/error),
 * -XFER_ETIMEDOUT, -XFER_ENOMEM. max <= XFER_FRAME_MAX. */
int xfer_frame_recv(int fd, size_t max, int timeout_ms, uint8_t **out, size_t *len);

#endif
