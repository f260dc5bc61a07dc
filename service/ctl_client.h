/*
 * Blocking control-API client (xferctl, and xferd forwarding to a peer).
 * Every call is bounded by a timeout; a dead xferd gives -XFER_ECONN or
 * -XFER_ETIMEDOUT, never a hang.
 */
#ifndef XFER_SERVICE_CTL_CLIENT_H
#define XFER_SERVICE_CTL_CLIENT_H

#include "proto/control.pb-c.h"
#include "xfer.h"

struct ctl_client;

/* Unix socket of a local xferd (no handshake; memfds may be passed). */
struct ctl_client *ctl_connect_unix(const char *path, int timeout_ms, int *err, char *why,
                                    size_t why_len);
/* TCP control port; runs the handshake with secret (NULL/"" = none). */
struct ctl_client *ctl_connect_tcp(const char *host, uint16_t port, const char *secret,
                                   int timeout_ms, int *err, char *why, size_t why_len);
void ctl_close(struct ctl_client *c);
/* The connection's socket, for poll() before ctl_recv (streams: Listen). */
int ctl_fd(const struct ctl_client *c);

/* Sends req (its id is set here) with pass_fd attached when >= 0 (unix
 * only; the fd stays the caller's) and waits for its response. *resp is
 * freed with xctl__response__free_unpacked(). Returns 0 when a response came
 * (its status may still be an error), else a transport error with why. */
int ctl_call(struct ctl_client *c, Xctl__Request *req, int pass_fd, int timeout_ms,
             Xctl__Response **resp, char *why, size_t why_len);

/* Pipelining: send now, collect later (responses come back by id). */
int ctl_send(struct ctl_client *c, Xctl__Request *req, int timeout_ms, char *why, size_t why_len);
int ctl_recv(struct ctl_client *c, int timeout_ms, Xctl__Response **resp, char *why,
             size_t why_len);

#endif
