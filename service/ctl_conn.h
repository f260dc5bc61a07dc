/*
 * Control connections, shared by the control server's files: ctl_server.c
 * (frames, requests, replies, limits) and ctl_accept.c (accepting, the TCP
 * handshake run in the event loop, caps on half-open connections).
 * Everything here runs on the loop thread.
 */
#ifndef XFER_SERVICE_CTL_CONN_H
#define XFER_SERVICE_CTL_CONN_H

#include "xfer_handshake.h"
#include "xferd.h"

#include <event2/event.h>
#include <sys/socket.h>

#define CONN_MAX_FDS      8
#define CONN_MAX_INFLIGHT 1024
/* Established control connections (TCP and unix together); more are
 * answered -XFER_EBUSY and closed. */
#define CTL_MAX_CONNS 256
/* TCP connections still in their handshake: in all, and from one source
 * address. Over a cap the oldest such connection is dropped. */
#define CTL_MAX_HALF_OPEN            128
#define CTL_MAX_HALF_OPEN_PER_SOURCE 16
/* Per connection: request bytes queued or running, and reply bytes not yet
 * taken by the client. Past CONN_OUT_HIGH reading pauses; a client that
 * lets replies pile past CONN_OUT_MAX is disconnected. */
#define CONN_IN_MAX   (16u << 20)
#define CONN_OUT_HIGH (8u << 20)
#define CONN_OUT_MAX  (32u << 20)

struct conn {
    struct ctl_server *s;
    int fd;
    bool is_unix;
    struct event *rev, *wev;
    struct evbuffer *in, *out;
    int fds[CONN_MAX_FDS];
    int nfds;
    int inflight;    /* requests queued or running (flow control) */
    size_t in_bytes; /* their frame bytes */
    int refs;        /* jobs and callbacks using the struct (lifetime) */
    bool dead, reading, counted;
    bool listening; /* subscribed to notifications (ctl_listen.c) */
    char **priv;    /* private regions registered over this connection */
    size_t npriv;
    struct ctl_quota *quota;
    struct conn *prev, *next;
    /* TCP handshake in progress (hs != NULL): */
    xfer_hs_server *hs;
    struct event *hs_timer;
    struct sockaddr_storage src;
    struct conn *hs_prev, *hs_next; /* half-open list, oldest first */
};

struct ctl_server {
    struct xferd *d;
    int tcp_fd, unix_fd;
    struct event *tcp_ev, *unix_ev;
    struct conn *conns;
    int nconns; /* established */
    struct conn *hs_head, *hs_tail;
    int nhalf;
    int64_t cap_warned_ms;
    bool accepting;
    struct ctl_listen *listen; /* notification listeners, NULL until the first */
};

/* ctl_server.c */
struct conn *conn_new(struct ctl_server *s, int fd, bool is_unix);
void conn_close(struct conn *c);
void conn_send_raw(struct conn *c, const void *payload, size_t len);
/* Drops a reference taken with c->refs++ (frees a closed c on the last). */
void conn_put(struct conn *c);
/* Counts c as established, or answers -XFER_EBUSY and closes it (false). */
bool conn_admit(struct conn *c);

/* ctl_listen.c: notification listeners (Listen requests) */
/* Subscribes c (answers the request itself); 0 or an error with why. */
int ctl_listen_add(struct conn *c, uint64_t id, uint32_t count, char *why, size_t why_len);
/* ListenAck: c's client took the first count notifications of its stream
 * (cumulative); 0 or an error with why. */
int ctl_listen_ack(struct conn *c, uint64_t count, char *why, size_t why_len);
/* c closes: forget its subscription, give back what it did not acknowledge. */
void ctl_listen_drop(struct conn *c);
void ctl_listen_free(struct ctl_server *s);

/* ctl_accept.c */
void ctl_on_accept(evutil_socket_t lfd, short what, void *arg);
/* One handshake frame; false when c was closed. */
bool ctl_hs_frame(struct conn *c, const uint8_t *buf, size_t len);
/* Drops c's handshake state (on success or close). */
void ctl_hs_forget(struct conn *c);

#endif
