/*
 * tcpx transport, private: one-sided READ/WRITE over an NCCL net plugin's
 * two-sided calls (GPUDirect-TCPX, or any plugin of the v7+ ABI).
 *
 *   tcpx_plugin.c     loading the plugin, one call set for every version
 *   tcpx_transport.c  ops table, probe/open/close, control listener, acceptor
 *   tcpx_link.c       a link: control socket + plugin send and receive comms,
 *                     set up (handshake, handle exchange) and torn down
 *   tcpx_mem.c        registrations (regMr per comm, cached) and staging slots
 *   tcpx_io.c         the progress thread: control frames, plugin requests,
 *                     completions, stalls
 *   tcpx_msg.c        engine messages (notifications, SEND/RECV frames) on
 *                     the control socket
 *   tcpx_unpack.c     receives in UNPACK device mode: fragment lists, checks,
 *                     copy into place (XFER_TCPX_UNPACK=kernel|d2d|host)
 *
 * A link joins two nodes in one direction of initiative: the initiator sends
 * WRITE_REQ / READ_REQ headers (engine/wire.h) on the control socket; a
 * WRITE's payload follows on the initiator's plugin send comm, a READ's
 * answer on the target's. Both sides post their plugin requests in the
 * order of the control frames, so the plugin's in-order matching pairs them.
 * The target checks region id, generation, access and bounds before posting
 * anything; a refused WRITE's payload is still received (into scratch, or
 * left in the bounce buffer) and a refused READ is answered with an empty
 * send, so the streams stay in step.
 *
 * Threads: one progress thread per transport makes every data-path plugin
 * call; connect/accept run in the caller of connect() (initiator) or a
 * short-lived handshake thread (target), before the link is handed over.
 */
#ifndef XFER_TCPX_H
#define XFER_TCPX_H

#include "tcpx_plugin.h"
#include "transport.h"
#include "wire.h"
#include "xfer_kernels.h"

#include <pthread.h>
#include <stdint.h>

#define TCPX_WINDOW         8          /* chunks in flight per link (v7's NCCL_NET_MAX_REQUESTS) */
#define TCPX_CHUNK_MAX      (4u << 20) /* one receive at most: TCPX's unpack slice */
#define TCPX_HANDSHAKES_MAX 64
#define TCPX_TAG            0x7846 /* tag of every isend/irecv */

struct tcpx_transport;
struct tcpx_link;
struct tcpx_msg;

/* A registered staging buffer of TCPX_CHUNK_MAX bytes (host or one GPU). */
struct tcpx_slot {
    uint8_t *buf;
    void *mh_send, *mh_recv; /* registrations with the link's two comms */
    bool busy;
};

struct tcpx_pool {
    int device; /* -1 host */
    struct tcpx_slot slot[TCPX_WINDOW];
};

/* A region registered with a link's comms (lazily, cached until the region
 * or the link goes). */
struct tcpx_mr {
    uint32_t id, gen;
    void *mh_send, *mh_recv;
    struct tcpx_mr *next;
};

enum tcpx_req_kind { REQ_SEND, REQ_RECV };

/* One plugin request, queued in post order on its comm. */
struct tcpx_req {
    struct tcpx_req *next;
    enum tcpx_req_kind kind;
    uint8_t *buf; /* posted address */
    uint64_t len;
    void *mh;
    void *preq;   /* the plugin's request, once posted */
    uint64_t seq; /* receives: index among the comm's receives (unpack slot) */
    bool done;
    int got; /* bytes the plugin reported */
    int err; /* 0 or -XFER_E* from the plugin */
    char why[96];
    void *owner; /* struct tcpx_chunk (initiator) or tcpx_serve (target) */
};

/* Initiator: one chunk of an item. */
struct tcpx_chunk {
    struct tcpx_chunk *next;
    xfer_batch *b; /* held */
    size_t idx;
    uint32_t seg; /* segment of a vectored item (named if it fails), UINT32_MAX = plain */
    uint8_t op;   /* XFER_WIRE_WRITE_REQ / READ_REQ */
    uint64_t req_id;
    uint32_t region_id, gen;
    uint64_t remote_off, len;
    uint8_t *local;
    struct tcpx_slot *slot; /* staging: WRITE source, READ landing */
    struct tcpx_req req;
    bool resp;  /* the target's response arrived */
    int status; /* the response's status */
};

/* Target: one request being served. */
struct tcpx_serve {
    struct tcpx_serve *next;
    struct xfer_wire_hdr h;
    xfer_region *r; /* pinned, NULL when refused */
    int status;
    struct tcpx_slot *slot; /* region memory the plugin cannot take directly */
    struct tcpx_req req;
};

struct tcpx_link {
    struct tcpx_transport *tt;
    struct tcpx_link *next; /* tt->links */
    bool target;
    char name[96];
    char peer_node[XFER_NAME_MAX]; /* target: the initiator, as its handshake proved */
    int fd;                        /* control socket */
    /* plugin comms */
    void *send_comm, *recv_comm;
    struct xnccl_net_device_handle send_dh, recv_dh; /* offload objects we own */
    bool unpack;                                     /* receives arrive in UNPACK mode */
    struct xnccl_unpack_handle uh;                   /* read once from the plugin (device copy) */
    struct xnccl_unpack_meta *meta;                  /* host view of uh.meta */
    uint64_t recv_seq, send_seq;
    /* registrations and staging (mem_mu) */
    pthread_mutex_t mem_mu;
    struct tcpx_mr *mrs;
    struct tcpx_pool host;
    struct tcpx_pool *gpu[16];
    /* initiator: chunks posted by users (qmu), then in flight (owner) */
    pthread_mutex_t qmu;
    struct tcpx_chunk *q_head, *q_tail;
    struct tcpx_chunk *inflight; /* owner: started, not finished */
    int n_inflight;
    uint64_t load; /* atomic: chunks queued or in flight */
    /* initiator: engine messages queued by users (qmu), then sent (owner) */
    struct tcpx_msg *mq_head, *mq_tail;
    struct tcpx_msg *msgs; /* owner: sent, waiting for MSG_RESP */
    int n_msgs;
    /* target (owner) */
    struct tcpx_serve *serving;
    int n_serving;
    uint64_t peer_inc; /* the initiator's incarnation, as its handshake proved it */
    uint8_t *rx_msg;   /* frame of a MSG_REQ being read from the control socket */
    size_t rx_msg_have;
    struct xfer_wire_hdr rx_msg_h;
    /* plugin request queues (owner): posted in order */
    struct tcpx_req *sq_head, *sq_tail, *rq_head, *rq_tail;
    /* control socket (owner) */
    uint8_t rx[4 * XFER_WIRE_HDR_LEN];
    size_t rx_have;
    uint8_t *tx;
    size_t tx_len, tx_off, tx_cap;
    int64_t last_progress_ms;
    bool dead;                /* atomic: failed, nothing new is accepted */
    bool close_req, released; /* tt->mu */
    char dead_why[160];
};

struct tcpx_conn {
    struct xfer_conn base;
    struct tcpx_link *link;
};

struct tcpx_transport {
    struct xfer_transport base;
    xfer_engine *engine;
    struct tcpx_net *net;
    enum xfer_unpack_method method;
    int listen_fd;
    uint16_t port;
    pthread_t acceptor, progress;
    bool acceptor_started, progress_started;
    volatile bool stop;
    int wakefd;
    pthread_mutex_t mu; /* links list, close handshakes */
    pthread_cond_t cv;
    struct tcpx_link *links;
    pthread_mutex_t hs_mu;
    pthread_cond_t hs_cv;
    int hs_running;
    uint64_t next_req;                  /* atomic */
    struct xfer_unpacker *unpacker[16]; /* progress thread only, per GPU */
    bool warned_unpack;
};

extern const struct xfer_transport_ops xfer_tcpx_transport_ops;

static inline struct tcpx_transport *tcpx_of(struct xfer_transport *t)
{
    return container_of(t, struct tcpx_transport, base);
}

/* tcpx_transport.c */
void tcpx_kick(struct tcpx_transport *tt);

/* tcpx_link.c */
/* Initiator: control connection, handshake, plugin comms; bounded by
 * deadline_ms. 0 and *out, or -XFER_E* with the reason set on the engine. */
int tcpx_link_dial(struct tcpx_transport *tt, const struct xfer_peer_desc *d, int64_t deadline_ms,
                   struct tcpx_link **out);
/* Target: the same on an accepted control socket (handshake thread). */
int tcpx_link_accept(struct tcpx_transport *tt, int fd, const char *from, struct tcpx_link **out);
/* Closes comms and socket, frees. Only once no thread uses the link. */
void tcpx_link_free(struct tcpx_link *l);
/* Hands a set-up link to the progress thread. */
void tcpx_link_adopt(struct tcpx_transport *tt, struct tcpx_link *l);

/* tcpx_mem.c */
/* mhandles of a region with the link's comms (registered on first use). */
int tcpx_mem_region(struct tcpx_link *l, xfer_region *r, void **mh_send, void **mh_recv, char *why,
                    size_t why_len);
void tcpx_mem_forget(struct tcpx_link *l, uint32_t id, uint32_t gen);
/* Can the plugin take this memory directly (NCCL_PTR_HOST / _CUDA)? */
bool tcpx_mem_direct(const struct tcpx_link *l, enum xfer_mem_kind kind);
/* A free staging slot for memory of `device` (-1 host), or NULL (none free,
 * or no staging possible: reason in why). */
struct tcpx_slot *tcpx_mem_slot(struct tcpx_link *l, int device, char *why, size_t why_len);
void tcpx_mem_slot_put(struct tcpx_slot *s);
/* Deregisters everything and closes both comms: from then on the plugin
 * touches no memory of the link. */
void tcpx_mem_close_comms(struct tcpx_link *l);
void tcpx_mem_release(struct tcpx_link *l); /* the above, and frees the slots */
/* Synchronous copy between any two memories (host/GPU). */
int tcpx_copy(void *dst, const void *src, size_t len);

/* tcpx_io.c */
void *tcpx_progress_main(void *arg);
int tcpx_post(struct xfer_conn *c, xfer_batch *b, const size_t *idx, size_t n);
/* Fails everything the link carries (status, why); idempotent. Owner. */
void tcpx_link_fail(struct tcpx_link *l, int status, const char *why);
/* Queues a control frame: header h, then len payload bytes (may be 0). */
void tcpx_ctrl_queue(struct tcpx_link *l, const struct xfer_wire_hdr *h, const void *payload,
                     size_t len);

/* tcpx_msg.c (the owner's calls run on the progress thread) */
int tcpx_send_msg(struct xfer_conn *c, struct xfer_msg *m);
bool tcpx_msg_start(struct tcpx_link *l); /* initiator: queued messages go out */
void tcpx_msg_response(struct tcpx_link *l, const struct xfer_wire_hdr *h);
void tcpx_msg_request(struct tcpx_link *l, const struct xfer_wire_hdr *h); /* target */
void tcpx_msg_received(struct tcpx_link *l); /* target: l->rx_msg is complete */
void tcpx_msg_fail_all(struct tcpx_link *l, const char *why);

/* tcpx_unpack.c */
/* Receive req of link l finished in UNPACK mode: checks its fragments and
 * (dst non-NULL) copies them to dst; always gives the pages back. 0 or
 * -XFER_EPROTO/-XFER_ERANGE/-XFER_EIO with why. */
int tcpx_unpack(struct tcpx_link *l, struct tcpx_req *req, void *dst, char *why, size_t why_len);
/* After accept: reads the plugin's unpack handle (0, or an error). */
int tcpx_unpack_setup(struct tcpx_link *l, char *why, size_t why_len);
void tcpx_unpack_free(struct tcpx_transport *tt);

#endif
