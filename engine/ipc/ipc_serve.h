/*
 * The owner's side of the ipc transport, private to ipc_serve.c (the
 * serving threads) and ipc_serve_rx.c (who reads a connection's requests:
 * its serving thread, or a thread waiting for a message from that peer).
 */
#ifndef XFER_IPC_SERVE_H
#define XFER_IPC_SERVE_H

#include "ipc.h"
#include "ipc_ring.h"

#define IPC_MAP_TRACK 1024 /* mappings tracked per peer for revocation */

/* One accepted connection. Its requests are read and answered under rx_mu,
 * by its serving thread or by a waiter (ipc_serve_rx.c): the state below
 * marked rx_mu is touched only there. */
struct serve_conn {
    struct ipc_server *srv;
    int fd;
    pid_t pid; /* the peer, once it passed the handshake; 0 before */
    pthread_t thread;
    bool done;  /* srv->mu: thread finished; joined by the reaper */
    bool ready; /* srv->mu: handshake passed, waiters may read it */
    int pins;   /* srv->mu: waiters holding c (the reaper waits for 0) */
    /* Reading the socket (ipc_serve_rx.c). */
    pthread_mutex_t rx_mu;
    pthread_cond_t rx_cv; /* the parked or lingering serving thread */
    int ep;               /* the serving thread's epoll: fd, EPOLLIN off while waiters poll */
    int waiters;          /* rx_mu: threads polling fd themselves */
    int64_t left_ns;      /* rx_mu: when the last waiter left (monotonic; 0: never) */
    bool skipped;         /* rx_mu: the serving thread saw fd readable while they did */
    bool parked;          /* rx_mu: the serving thread sleeps on rx_cv */
    int failed;           /* rx_mu: < 0 once the connection is over (nobody reads it) */
    uint64_t served;      /* rx_mu: requests read so far */
    void *buf;            /* rx_mu: a request, up to buf_max bytes */
    size_t buf_max;
    /* rx_mu: */
    xfer_region **slots;
    int64_t *pinned_ms;  /* when each slot was pinned */
    uint32_t *free_next; /* free list threaded through slot indices */
    uint32_t nslots, free_head;
    struct ipc_revoked mapped[IPC_MAP_TRACK]; /* (id, gen) this peer mapped */
    uint32_t nmapped;
    int64_t revoke_check_ms;       /* last scan of mapped[] for deregistered regions */
    int64_t lease_check_ms;        /* last scan of slots[] for pins held too long */
    char peer_node[XFER_NAME_MAX]; /* the initiator, as its handshake proved */
    uint64_t peer_inc;
    struct ipc_loans loans; /* regions lent for direct copies (ipc_direct.c) */
    bool loans_up;
    /* The message ring (ipc_ring.h): set up once under rx_mu, read without
     * it by spinning waiters (ring_up, acquire), freed with c. */
    struct ipc_ring ring;
    bool ring_up;
    int ring_spin;     /* rx_mu: waiters spinning on the ring (none: its readers sleep) */
    int ring_sleepers; /* rx_mu: waiters asleep on ring.efd (none: on the socket) */
    struct serve_conn *next;
};

struct ipc_server {
    xfer_engine *engine;
    char node_id[XFER_NAME_MAX];
    uint64_t incarnation;
    int listen_fd, stop_fd;
    pthread_t accept_thread;
    pthread_mutex_t mu;
    pthread_cond_t done_cv; /* mu: a connection's thread finished (done) */
    struct serve_conn *conns;
    bool stopping;
    unsigned any_next; /* mu: where the next wait for any peer starts */
    int linger_us;     /* how long a connection stays with its waiters (XFER_IPC_LINGER_US) */
    bool ring_ok;      /* peers may set up a message ring (XFER_IPC_RING not 0) */
    uint8_t probe_cookie[16];
};

/* ipc_serve.c, rx_mu held: reads one request (fd is readable) and answers
 * it. < 0: the connection is over (malformed request, peer gone). */
int ipc_serve_one(struct serve_conn *c);

/* ipc_serve.c, rx_mu held: serves every frame waiting in c's ring; < 0:
 * the connection is over (a corrupt ring, answers not taken). */
int ipc_serve_ring(struct serve_conn *c);
/* rx_mu held: IPC_RING_REQ with the ring's fd (taken, -1 = none): maps it
 * when this side takes rings and answers IPC_RING_RESP. */
int ipc_serve_ring_setup(struct serve_conn *c, int fd);
static inline bool ipc_ring_has(const struct serve_conn *c)
{
    return __atomic_load_n(&c->ring_up, __ATOMIC_ACQUIRE) && ipc_ring_pending(&c->ring);
}

/* ipc_serve_rx.c */
int ipc_rx_init(struct serve_conn *c);
void ipc_rx_fini(struct serve_conn *c);
/* The serving thread: waits up to timeout_ms for a request and serves it,
 * unless a waiter reads the socket (then it sleeps until none does).
 * < 0: the connection is over. */
int ipc_rx_serve_step(struct serve_conn *c, int timeout_ms);
/* The serving thread is leaving: waiters no longer read c (rx_mu). */
void ipc_rx_close(struct serve_conn *c, int rc);

#endif
