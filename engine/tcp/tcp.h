/*
 * TCP transport, private. One-sided ops are emulated by the target: the
 * initiator sends WRITE_REQ+payload or READ_REQ frames (engine/wire.h) on
 * one of the peer's sockets; the target's progress thread receives WRITE
 * payload straight into the region and answers READ from it.
 *
 * Threads: one acceptor, a short-lived thread per inbound handshake (which
 * then hands the socket over), and progress_threads epoll loops. Each socket belongs to exactly one
 * progress thread, which does its I/O; other threads append to its shared send queue (qmu)
 * and kick the owner through an eventfd. A submitting thread that finds an
 * initiator socket idle sends the frames itself (tcp_sock_send_direct): the
 * owner's hand-off (eventfd write, wake-up, epoll, eventfd read) was the
 * largest cost of a small round trip. iomu serializes the two: the owner
 * holds it around every call into a socket's I/O.
 */
#ifndef XFER_TCP_H
#define XFER_TCP_H

#include "transport.h"
#include "wire.h"

#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>

#define TCP_MAX_PAYLOAD (64u << 20) /* largest frame payload we accept */
#define TCP_RXBUF       8192        /* header read-ahead buffer */
/* A socket that keeps receiving small payloads grows its read-ahead, so one
 * recv brings many frames (one recv per 4 KiB frame was the largest
 * per-item cost of small batches); payloads of TCP_RX_DIRECT or more are
 * received straight into their memory, and the header after one is read
 * alone. */
#define TCP_RXBUF_BIG      (128u << 10)
#define TCP_RX_SMALL       (16u << 10) /* a payload this small counts as small */
#define TCP_RX_GROW_AFTER  64u         /* small payloads in a row before growing */
#define TCP_RX_DIRECT      (32u << 10)
#define TCP_IOV_MAX        64   /* frames gathered into one sendmsg */
#define TCP_DONE_MAX       64   /* chunk ends reported together */
#define TCP_TXQ_HIGH       4096 /* target stops reading above this backlog */
#define TCP_HANDSHAKES_MAX 64   /* concurrent inbound handshakes */
/* GPU memory goes through pinned staging slots (engine/gpu_stage, tcp_gpu.c):
 * chunks touching GPU memory are at most one slot long. Chunks of at most
 * TCP_GPU_SMALL_SLOT use a second ring of many small slots, so thousands of
 * tiny items are not queued four at a time behind per-copy latency. */
#define TCP_GPU_SLOT        (4u << 20)
#define TCP_GPU_SLOTS       4u /* per thread, GPU and direction */
#define TCP_GPU_SMALL_SLOT  (16u << 10)
#define TCP_GPU_SMALL_SLOTS 512u
#define TCP_GPU_PREFETCH    64u /* queued frames whose D2H may start ahead */
#define TCP_GPU_MAX_DEV     16
#define TCP_FENCES          4096u /* target: cancelled batches remembered (tcp_fence.c) */
#define TCP_FENCES_RESEND   64u   /* initiator: recent fences sent again on new connections */
#define TCP_IN_SLOTS        256u /* target: peers whose message socket is remembered (tcp_wait.c) */
#define TCP_IN_SOCKS        8    /* target: sockets remembered per peer (tcp_wait.c) */
#define TCP_TX_SPARE_MAX    256u /* target: sent responses kept per socket for reuse */
/* Lazy EPOLLIN (tcp_wait.c): how often a progress thread with lazy sockets
 * looks at them (TCP_LAZY_TICK_TGT_US while one of them is an accepted
 * socket: a request that comes there while nobody waits is read within two
 * of those ticks), how long one whose waiters stopped coming stays lazy,
 * and for how long an accepted socket whose request waited for a tick is
 * not left lazy again (unless TCP_LAZY_CLEAN waiters in a row came and
 * went with no request arriving between them). TCP_LAZY_CLEAN was 64: on
 * the H200 host a ping-pong stalls for a tick (no waiter for 100 us) every
 * ~300 round trips, and 64 waits of epoll_ctl pairs after each came to
 * ~0.4 epoll_ctl per round trip; with 4, 0.02-0.04 (8 takes about twice
 * that; docs/perf.md step 18). */
#define TCP_LAZY_TICK_MS     1
#define TCP_LAZY_TICK_TGT_US 100
#define TCP_LAZY_KEEP_MS     100
#define TCP_LAZY_OFF_MS      1000
#define TCP_LAZY_CLEAN       8
/* Answers ride along (tcp_back.c): held once TCP_HOLD_AFTER answers in a
 * row were followed by this side's next frame within TCP_HOLD_WINDOW_US
 * (XFER_TCP_HOLD_WINDOW_US); held ones nobody carried go at the owner's
 * first tick after that long. */
#define TCP_HOLD_WINDOW_US 20
#define TCP_HOLD_AFTER     4
/* Solo waiter (tcp_wait.c): the longest a waiter sleeps in a blocking recv
 * (SO_RCVTIMEO) before it goes back to polling its wake fd too. */
#define TCP_SOLO_MS 2
/* Initiator: plain host-memory items of at most TCP_RUN_ITEM_MAX bytes that
 * lie back to back on both sides go out as one frame of up to TCP_RUN_MAX
 * bytes (and at most chunk_bytes): per-frame costs were most of a 4 KiB
 * item's (docs/perf.md, "Runs of small items"). */
#define TCP_RUN_ITEM_MAX (64u << 10)
#define TCP_RUN_MAX      (256u << 10)
/* Payloads of at least this many bytes of memfd-backed host regions go
 * out with sendfile (tcp_send.c); smaller ones are gathered into sendmsg. */
#define TCP_FILE_MIN (64u << 10)

struct tcp_transport;
struct tcp_thread;
struct xfer_gpu_stage;

/* One frame to send. Initiator: a request chunk that afterwards waits for
 * its response on the in-flight FIFO. Target: a response, possibly carrying
 * region memory that stays pinned until sent. */
struct tcp_tx {
    struct tcp_tx *next;
    uint8_t hdr[XFER_WIRE_HDR_LEN];
    uint32_t hdr_sent;
    uint8_t *payload; /* WRITE_REQ: local memory; READ_RESP: region memory */
    uint64_t payload_len, payload_sent;
    bool pad; /* item ended mid-frame: the rest goes out as zeros */
    /* The payload is memfd-backed region memory, sent with sendfile from
     * file_fd at file_off (tcp_send.c, "Payload from the file"): the
     * kernel takes the pages instead of copying them. */
    bool file;
    int file_fd;
    uint64_t file_off;
    bool detached; /* fenced mid-frame: the rest goes out of own (or a GPU slot) */
    uint8_t *own;  /* detached copy of a WRITE payload (tcp_fence.c) */
    /* initiator chunk */
    xfer_batch *b; /* held, once per item it carries */
    size_t idx;
    /* A run (tcp_conn.c, "Runs"): items idx .. idx + nitems - 1 of b, each
     * len / nitems bytes, contiguous here and at the target, moved as one
     * frame; 0 or 1 = one chunk of item idx. */
    uint32_t nitems;
    uint32_t seg; /* segment of a vectored item (named if it fails), UINT32_MAX = plain */
    uint8_t op;   /* XFER_WIRE_WRITE_REQ / READ_REQ */
    uint64_t req_id;
    uint64_t len;   /* chunk bytes */
    uint8_t *local; /* READ: where the response payload goes */
    /* engine message (tcp_msg.c): MSG_REQ carrying msg->frame, b NULL */
    struct xfer_msg *msg;
    /* target response */
    xfer_region *region; /* pinned, released when sent */
    /* GPU memory (tcp_gpu.c). Payload from GPU memory (gsrc set): sent from
     * a staging slot once its D2H finished. Target WRITE into GPU memory
     * (gsrc NULL): the WRITE_RESP waits for the H2D out of gslot. */
    bool gpu;
    bool gready; /* staging copy seen finished */
    bool gpin;   /* initiator: io_begin held for the copy */
    int gdev;    /* CUDA ordinal of the GPU memory */
    int gslot;   /* -1 = none taken yet */
    struct xfer_gpu_stage *gst;
    const uint8_t *gsrc;   /* device memory to send */
    struct tcp_slab *slab; /* allocated with the other chunks of one post, or NULL */
    bool cached;           /* a MSG_REQ's, from tcp_msg.c's block cache (tcp_msg_tx_put) */
    /* Built by tcp_queue_response: an answer to the peer's request. On an
     * accepted socket most frames are; on an initiator socket, the answers
     * to messages its target sent back on it (tcp_back.c). */
    bool response;
    bool noresp; /* a MSG_REQ with XFER_WIRE_F_NORESP: done once written */
    /* A MSG_REQ sent back on an accepted socket (tcp_back.c): the
     * connection it belongs to; orphan: that connection went, its message
     * was ended, the frame still goes out whole (and its answer is read) */
    struct tcp_conn *back_tc;
    bool orphan;
};

/* The chunks of one post, allocated at once and freed with the last one:
 * a block list of 32k items costs one allocation, not 32k (tcp_post). */
struct tcp_slab {
    struct tcp_transport *tt;
    int refs;   /* chunks not freed yet; atomic */
    size_t cap; /* chunks it has room for */
    struct tcp_tx tx[];
};
/* A slab for n chunks (contents undefined): the transport's spare if large
 * enough, else a new one. NULL: out of memory. */
struct tcp_slab *tcp_slab_get(struct tcp_transport *tt, size_t n);
void tcp_slab_free(struct tcp_slab *s);

enum tcp_rx_state { RX_HDR, RX_PAYLOAD };

struct tcp_sock {
    struct tcp_transport *tt;
    struct tcp_thread *th;
    int fd;
    bool target; /* accepted: serves requests */
    /* One connection for messages both ways (tcp_back.c). back_in
     * (initiator): its target may send messages (MSG_REQ) back on it;
     * back_out (accepted): its initiator said it takes them. back_used
     * (accepted, atomic, never goes back): messages were queued on it, so
     * its owner moves the shared queue too. All but back_used are fixed
     * at creation. */
    bool back_in, back_out, back_used;
    /* initiator, iomu: a message came back on it (from then on its owner
     * ticks fine while it is lazy, as for an accepted socket); lazy_fine
     * (th->mu and iomu): whether it counted in lazy_tgt when it went on
     * the lazy list */
    bool back_seen, lazy_fine;
    /* iomu: answers to messages this read queued (they go out when it
     * ends, or ride along: tcp_back.c); held, of them on the send list,
     * left by waiters for the next frame to carry (a direct sender may
     * then send though the list is not empty) */
    uint32_t answers, held;
    /* iomu: holding is on (hold_on) once TCP_HOLD_AFTER answers in a row
     * were followed by this side's next frame within TCP_HOLD_WINDOW_US
     * (hold_streak; ans_ns: when the last answer went out alone), and off
     * again once the owner's tick had to send held answers; held_ns: when
     * the oldest held answer was held. on_held, held_next: th->mu. */
    bool hold_on, on_held;
    bool folded; /* iomu: a FIN went into an RTS here (logged once: tcp_msg_fold) */
    uint8_t hold_streak;
    int64_t ans_ns, held_ns;
    /* iomu: the same for frames that may ride (a FIN, xfer_msg.ride):
     * ride_on once TCP_HOLD_AFTER of them in a row were followed by this
     * side's next frame within the window (ride_ns: when the last went out
     * alone); a held one counts in held */
    bool ride_on;
    uint8_t ride_streak;
    int64_t ride_ns;
    struct tcp_sock *held_next;
    bool in_gone;                       /* in_mu: tcp_in_forget ran: no table takes it again */
    bool dead;                          /* qmu: no new frames */
    bool close_req;                     /* th->mu: disconnect asks the owner to close */
    bool released;                      /* th->mu: owner closed it after close_req */
    bool linked;                        /* th->mu: on th->socks */
    bool kicked;                        /* th->mu: on the owner's kick list */
    bool closing;                       /* owner: close_req as seen when the kick was taken */
    bool in_ready;                      /* owner: on the ready list (rx budget exhausted) */
    bool rx_blocked;                    /* owner: target stopped reading, backlog too long */
    char name[96];                      /* for log lines */
    struct tcp_sock *th_prev, *th_next; /* th->mu */
    struct tcp_sock *kick_next;         /* th->mu */
    struct tcp_sock *ready_next;        /* owner */
    struct tcp_sock *grave_next;        /* th->mu */
    pthread_mutex_t iomu;               /* held by whoever does this socket's I/O (see top) */
    /* Waiter-driven receive (tcp_wait.c): threads waiting in poll on this
     * socket (atomic; the owner leaves EPOLLIN to them meanwhile), whether
     * the one holding iomu is such a waiter, and what it left to the owner
     * (a full rx budget, a failure to carry out: iomu). */
    int waiters;
    int pins;     /* target: waiters that may poll it (atomic); tcp_reap keeps it meanwhile */
    int in_slot;  /* target: 1 + its entry in tt->in_sock, 0 = none (tt->in_mu; atomic) */
    int in_idx;   /* target: its place in that entry (tt->in_mu) */
    bool tgt_gpu; /* target, iomu: served GPU memory: staging is the owner's, waiters keep off */
    bool skipped; /* iomu: the owner left a readable edge to a polling waiter */
    /* The owner's epoll interest (iomu; tcp_sock_interest): EPOLLOUT only
     * after a send found the socket full (out_armed), EPOLLIN taken out
     * while waiters poll (its progress thread is then not woken by data
     * a waiter reads) and kept out after the last one left (rx_lazy: the
     * next waiter then needs no epoll_ctl; the owner's tick takes it back
     * when nobody waits, tcp_wait.c "Lazy EPOLLIN"). */
    bool out_armed;
    bool rx_lazy;                  /* iomu: EPOLLIN out though no waiter polls (s is on th->lazy) */
    bool on_lazy;                  /* th->mu and iomu: on th->lazy_head */
    int64_t lazy_ms;               /* iomu: when the owner's tick last saw a waiter had come */
    uint32_t lazy_uses, lazy_seen; /* iomu: waiters that left it lazy; as the tick last saw */
    /* Target, atomic (the tick under iomu, the owner's loop and a waiter
     * coming in without it): the tick gave EPOLLIN back and no waiter came
     * since; until when its waiters leave EPOLLIN in. */
    bool lazy_gave;
    int64_t lazy_off_ms;
    /* Target, iomu: waiters that left it since its owner last read a
     * request while nobody waited; TCP_LAZY_CLEAN of them end lazy_off_ms
     * early (tcp_wait.c target_may_lazy). */
    uint32_t lazy_clean;
    struct tcp_sock *lazy_next; /* th->mu */
    uint32_t ev_mask;           /* as last given to epoll_ctl */
    bool by_waiter;
    /* Solo waiter (tcp_wait.c): solo_ok, the descriptor is blocking with a
     * receive timeout (every other call passes MSG_DONTWAIT); rx_solo
     * (iomu), a waiter alone on this initiator socket sleeps in recv on it:
     * no one else reads it meanwhile (they note skipped); solo_close
     * (iomu), it was closed meanwhile: shut down, its descriptor left to
     * that waiter to close. */
    bool solo_ok, rx_solo, solo_close;
    bool rx_defer;
    bool fail_defer;
    enum xfer_log_level fail_lvl;
    char fail_why[160];
    /* shared send queue */
    pthread_mutex_t qmu;
    /* GPU chunks were queued: no direct sends (staging is the owner's).
     * Set under qmu (atomic), read unlocked by waiters: it never goes back. */
    bool gpu_seen;
    struct tcp_tx *q_head, *q_tail;
    uint64_t load; /* atomic: bytes posted and not yet completed */
    /* owner-only */
    struct tcp_tx *tx_head, *tx_tail;
    size_t tx_count;
    struct tcp_tx *inf_head, *inf_tail; /* initiator: awaiting responses */
    /* target: sent responses kept for the next ones (a calloc and a free
     * per item were ~22 % of the target's instructions at 4 KiB, batch 128) */
    struct tcp_tx *tx_spare;
    uint32_t tx_nspare;
    /* initiator, iomu: chunks whose responses this read brought, ended
     * together when it stops (one batch lock per batch, not per chunk) */
    struct xfer_chunk_end done[TCP_DONE_MAX];
    size_t ndone;
    uint64_t done_load;
    /* Stall clock (iomu): io_count goes up with each recv or send that
     * moved bytes and each post onto an idle socket; the owner's 100 ms check
     * (tcp_sock_check_timeout) sets last_progress_ms when it changed since
     * io_seen. A clock read per recv and per send was ~4 of a round trip's
     * ~14 (each ~20 ns, more than a lock round). */
    uint32_t io_count, io_seen;
    int64_t last_progress_ms;
    uint8_t rxsmall[TCP_RXBUF];
    uint8_t *rxbuf; /* rxsmall, or TCP_RXBUF_BIG bytes once small frames stream in */
    size_t rxcap;
    uint32_t rx_small_run; /* small payloads in a row */
    bool rx_big;           /* the last payload was received directly: read headers alone */
    size_t rx_lo, rx_hi;
    enum tcp_rx_state rx_state;
    struct xfer_wire_hdr rh;
    uint64_t rx_got;
    uint8_t *rx_dst;  /* target: region memory, NULL = discard */
    uint32_t rx_seq;  /* target: the WRITE's batch sequence number, 0 = none */
    uint64_t rx_fgen; /* target: fence_gen when rx_seq was last checked */
    xfer_region *rx_region;
    int rx_status;
    int rx_errno;    /* why the last recv failed, 0 = EOF */
    bool rx_short;   /* the last recv returned less than asked: the socket is
                        drained, and new data brings a new edge (EPOLLET) */
    uint8_t *rx_msg; /* target: MSG_REQ payload being received (malloc'd) */
    /* target: WRITE frames of batch landed_seq that this socket took in a
     * row, and whether one of them did not land (tcp_msg.c, "behind") */
    uint32_t landed_seq, landed_n;
    bool landed_bad;
    /* target, iomu: requests served well in this read, counted at its end
     * (a count per request was ~90 instructions of a 4 KiB item's) */
    uint64_t srv_ops, srv_bytes;
    /* target: the initiator, as its handshake proved; initiator: the target */
    char peer_node[XFER_NAME_MAX];
    unsigned peer_hash; /* tcp_peer_hash(peer_node), made once: the tables' slot */
    uint64_t peer_inc;
    /* payload into GPU memory: received into a staging slot first */
    bool rx_gpu;
    int rx_gslot; /* -1 = none yet */
    int rx_gerr;  /* initiator: no slot could be had, discard */
    struct xfer_gpu_stage *rx_gst;
    uint8_t *rx_host;
    bool gpu_wait; /* owner: on th->gpu_head */
    struct tcp_sock *gpu_next;
    struct tcp_tx *land_head, *land_tail; /* initiator: READ chunks whose H2D runs */
};

struct tcp_thread {
    struct tcp_transport *tt;
    pthread_t thread;
    int epfd, wakefd;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* a close_req was served */
    struct tcp_sock *socks;
    struct tcp_sock *kick_head;
    struct tcp_sock *ready_head;
    struct tcp_sock *grave;                            /* target sockets to free after this round */
    uint8_t scratch[65536];                            /* discarded payload lands here */
    struct xfer_gpu_stage *gst[TCP_GPU_MAX_DEV][2][2]; /* [gpu][send, recv][big, small] */
    struct tcp_sock *gpu_head; /* sockets waiting for a staging copy or slot */
    /* mu (read unlocked by the thread itself): sockets whose EPOLLIN a
     * waiter left out (rx_lazy); while there are any, epoll_wait wakes
     * every TCP_LAZY_TICK_MS (ticking, atomic) to give it back to those
     * nobody waits on (tcp_lazy_tick); every TCP_LAZY_TICK_TGT_US while
     * lazy_tgt (mu; read unlocked) of them are accepted sockets (then
     * tick_fine, atomic, as ticking). */
    struct tcp_sock *lazy_head;
    bool ticking, tick_fine;
    int lazy_tgt;
    /* mu: sockets with answers held for their next frame (tcp_back.c);
     * while there are any (held_n, atomic) the thread ticks fine and its
     * tick sends what is still held. */
    struct tcp_sock *held_head;
    int held_n;
    /* The read side of the fences for this thread's payload receives
     * (tcp_fence.c): a FENCE takes every thread's, a receive only its own,
     * so receives on different threads share no lock. */
    pthread_mutex_t fence_mu;
};

/* Target: one cancelled batch of one initiator (tcp_fence.c). */
struct tcp_fence {
    uint64_t inc; /* the initiator's incarnation */
    uint32_t seq;
    int next; /* hash chain, -1 = end */
};

struct tcp_transport {
    struct xfer_transport base;
    xfer_engine *engine;
    int listen_fd, accept_wakefd;
    pthread_t acceptor;
    bool acceptor_started;
    pthread_mutex_t hs_mu;
    pthread_cond_t hs_cv;
    int hs_running; /* handshake threads alive; hs_mu */
    volatile bool stop;
    int n_threads;
    struct tcp_thread *threads;
    unsigned next_thread; /* atomic round robin */
    uint64_t next_req;    /* atomic */
    int sockbuf;          /* SO_SNDBUF/SO_RCVBUF, 0 = kernel autotuning */
    bool direct;          /* submitters may send on idle sockets (XFER_TCP_DIRECT=0: off) */
    bool solo;            /* solo waiters on initiator sockets (XFER_TCP_SOLO=0: off) */
    /* Accepted sockets stay lazy between waiters (tcp_wait.c) unless
     * XFER_TCP_LAZY_TARGET=0: a request that comes right after a target's
     * waiter left waits for the owner's fine tick (at most two of
     * TCP_LAZY_TICK_TGT_US), and such a socket is then not left lazy for
     * TCP_LAZY_OFF_MS (docs/perf.md step 10). */
    bool lazy_target;
    /* XFER_TCP_ONE_READER (tcp_wait.c "One reader"): a waiter does not
     * join a socket another waiter reads already. */
    bool one_reader;
    /* Waiters in a row after which an accepted socket whose request waited
     * for the tick is left lazy again (TCP_LAZY_CLEAN; XFER_TCP_LAZY_CLEAN=0:
     * never, the whole TCP_LAZY_OFF_MS as before). */
    uint32_t lazy_clean;
    /* A notification waiter also reads the answers to this side's last
     * message to its peer (tcp_wait.c; XFER_NOTIF_WAIT_ACK=0: off). */
    bool notif_ack;
    struct tcp_slab *spare; /* the last slab freed, reused by the next post; atomic */
    /* fences (tcp_fence.c). Target: written with every thread's fence_mu
     * held (record one), read with one (WRITE payload going into a region). */
    struct tcp_fence fences[TCP_FENCES]; /* ring, oldest replaced */
    int fence_head[TCP_FENCES];          /* hash buckets */
    uint64_t fence_n, fence_gen;         /* recorded so far; bumped per record */
    /* Target: per peer (hash of its node id; a collision forgets the
     * older), the accepted sockets its messages arrived on (the last
     * TCP_IN_SOCKS): a waiter for that peer's messages reads them
     * (tcp_wait.c). */
    pthread_mutex_t in_mu;
    struct tcp_sock *in_sock[TCP_IN_SLOTS][TCP_IN_SOCKS];
    unsigned in_next[TCP_IN_SLOTS]; /* the place the next one takes when all are used */
    struct tcp_sock *in_last; /* anyone's last message came on it (atomic; cleared under in_mu) */
    /* Initiator: per peer (same hash), the socket our last message to it
     * went out on: a thread in xfer_notif_wait for that peer reads its
     * answer there too (tcp_wait.c). Set and cleared under in_mu. */
    struct tcp_sock *out_sock[TCP_IN_SLOTS];
    /* Target: per peer (same hash), the accepted socket whose initiator
     * takes messages back (back_out; tcp_back.c). Set and cleared under
     * in_mu. */
    struct tcp_sock *back_sock[TCP_IN_SLOTS];
    bool back;              /* XFER_TCP_BACK=0: every message goes on its sender's own connection */
    bool hold;              /* XFER_TCP_HOLD=0: a waiter sends its answers at once (tcp_back.c) */
    bool fold;              /* XFER_TCP_FOLD=0: a held FIN goes as its own frame (tcp_msg.c) */
    int64_t hold_window_ns; /* TCP_HOLD_WINDOW_US, or XFER_TCP_HOLD_WINDOW_US */
    bool sendfile;          /* XFER_TCP_SENDFILE=0: payloads always copied by sendmsg */
    pthread_mutex_t sent_mu; /* initiator: recent fences */
    uint32_t sent[TCP_FENCES_RESEND];
    unsigned sent_n;
};

struct tcp_conn {
    struct xfer_conn base;
    struct tcp_transport *tt;
    int n;
    unsigned next; /* atomic round robin among equals */
    struct tcp_sock **socks;
    /* How this connection's messages travel (tcp_back.c), decided at the
     * first one and only ever moved to TCP_PATH_OWN; back_sock: the
     * accepted socket they went back on, pinned until tcp_disconnect.
     * back_mu guards both. */
    pthread_mutex_t back_mu;
    int path;
    struct tcp_sock *back_sock;
    /* tcp_peer_hash of the peer's node id, made once: its slot in the
     * tables of in_sock, out_sock and back_sock (a hash per wait and per
     * message sent back was ~2 % of a message round trip's instructions) */
    unsigned peer_hash;
};
enum { TCP_PATH_UNDECIDED, TCP_PATH_OWN, TCP_PATH_BACK };
/* Handshake purpose bit (tcp_conn.c): this initiator socket takes messages
 * back from its target; the low 16 bits are the socket's index. */
#define TCP_PURPOSE_BACK  0x10000u
#define TCP_PURPOSE_INDEX 0xffffu

extern const struct xfer_transport_ops xfer_tcp_transport_ops;

/* tcp_transport.c */
void tcp_thread_adopt(struct tcp_transport *tt, struct tcp_sock *s);
void tcp_thread_kick(struct tcp_sock *s);
/* Wakes th's epoll_wait (no socket named). */
void tcp_thread_wake(struct tcp_thread *th);
void tcp_sock_tune(struct tcp_transport *tt, int fd);
/* A solo waiter (tcp_wait.c) sleeps in a blocking recv on a socket: its
 * descriptor turns blocking (every other call on it passes MSG_DONTWAIT)
 * with a receive timeout, which bounds that sleep. */
bool tcp_solo_setup(int fd);
/* iomu held, s open: brings the owner's epoll interest in s up to date
 * (out_armed, waiters, rx_lazy). */
void tcp_sock_interest(struct tcp_sock *s);
/* Frees the target sockets closed this round; one a waiter still pins
 * stays for a later round, unless force (the transport is closing). */
void tcp_reap(struct tcp_thread *th, bool force);

/* tcp_sock.c: socket lifecycle, chunk and response ends, failure */
struct tcp_sock *tcp_sock_new(struct tcp_transport *tt, int fd, bool target, const char *name);
void tcp_sock_destroy(struct tcp_sock *s);
/* Closes the socket and fails what it carries with -XFER_ECONN; status 0
 * is an orderly close (logged at info), else a warning. Idempotent. */
void tcp_sock_fail(struct tcp_sock *s, int status, const char *why);
void tcp_sock_fail_as(struct tcp_sock *s, enum xfer_log_level lvl, const char *why);
void tcp_sock_check_timeout(struct tcp_sock *s, int64_t now_ms);
void tcp_tx_free(struct tcp_tx *t);
/* Items an initiator chunk carries (a run: several). */
static inline uint32_t tcp_tx_items(const struct tcp_tx *t)
{
    return t->nitems > 1 ? t->nitems : 1;
}
/* Bytes an initiator chunk counts in its socket's load. */
static inline uint64_t tcp_chunk_load(const struct tcp_tx *t)
{
    return XFER_WIRE_HDR_LEN + t->len;
}
/* Initiator chunk finished: reports it to the batch, frees t. */
void tcp_chunk_complete(struct tcp_sock *s, struct tcp_tx *t, int status, const char *why);
/* An unsent chunk of a stopping batch's open item: its hold goes, the item
 * stays open (the cancel or deadline ends it). */
void tcp_chunk_release(struct tcp_sock *s, struct tcp_tx *t);
/* Target response t is done with (sent, or dropped): frees it. */
void tcp_response_done(struct tcp_tx *t);
/* s has more to read than its rx budget allowed: the owner goes on later
 * (a waiter reading s leaves that to the owner, tcp_wait.c). */
void tcp_ready_push(struct tcp_sock *s);

/* tcp_send.c: sending */
/* May t's payload at p (in region r, host memory), len bytes, go out with
 * sendfile? Then marks t so. */
void tcp_tx_file(struct tcp_transport *tt, struct tcp_tx *t, const xfer_region *r, const uint8_t *p,
                 uint64_t len);
/* A progress thread, at its start: blocks SIGPIPE (sendfile has no
 * MSG_NOSIGNAL); only such threads send payloads from the file. */
void tcp_send_thread_init(void);
void tcp_sock_writable(struct tcp_sock *s);
/* Submitting thread, after queueing on s: sends the queue itself if s is
 * idle and its I/O lock free (ride: the frame queued may ride with the
 * next one instead, tcp_ride_hold). False = the owner must be kicked. */
bool tcp_sock_send_direct(struct tcp_sock *s, bool ride);
/* iomu held: moves s's shared send queue onto its send list (false: a
 * direct sender must leave it to the owner). */
bool tcp_sock_take_queue(struct tcp_sock *s);

/* iomu held, after a read of initiator socket s queued answers to messages
 * its target sent back: sends them (a waiter: as a direct sender). */
void tcp_sock_answer(struct tcp_sock *s);

/* tcp_recv.c: reading */
void tcp_sock_readable(struct tcp_sock *s);
void tcp_sock_solo_in(struct tcp_sock *s, ssize_t n, size_t asked, int err);
/* Target: queues the response op to request req (r pinned: payload from
 * it, released when sent). NULL when out of memory (socket failed). */
struct tcp_tx *tcp_queue_response(struct tcp_sock *s, const struct xfer_wire_hdr *req, uint8_t op,
                                  int status, xfer_region *r, uint8_t *payload);

/* Does s have a shared send queue to move (tcp_sock_append)? An initiator
 * socket, or an accepted one that messages were sent back on. */
static inline bool tcp_sock_queues(const struct tcp_sock *s)
{
    return !s->target || __atomic_load_n(&s->back_used, __ATOMIC_ACQUIRE);
}

/* A socket that requests may arrive on unasked: accepted, or an initiator
 * socket whose target sends messages back on it. */
static inline bool tcp_sock_serves(const struct tcp_sock *s)
{
    return s->target || s->back_in;
}

/* tcp_back.c: messages back on the peer's connection */
/* Accepted socket s, handshake done: remember it if its initiator takes
 * messages back. */
void tcp_back_note(struct tcp_sock *s);
/* in_mu held: s closes. */
void tcp_back_drop(struct tcp_sock *s);
/* The initiator side: should the socket of this index to node `peer`
 * offer to take messages back (the handshake's TCP_PURPOSE_BACK)? */
bool tcp_back_offer(struct tcp_transport *tt, const char *peer, uint32_t index);
/* Queues MSG_REQ t back on the peer's connection if tc's messages go
 * that way: 0 queued (and sent or its owner kicked), 1 not this way (t is
 * still the caller's: its own sockets). */
int tcp_back_send(struct tcp_conn *tc, struct tcp_tx *t);
/* tcp_disconnect: tc's messages not done on its back socket end
 * -XFER_ECONN (their peer goes), and the socket's pin goes. */
void tcp_back_detach(struct tcp_conn *tc);
/* iomu held, a read that queued s->answers ends: true = they are held for
 * the next frame on s (at most until the owner's next tick), false = the
 * caller sends them now. */
bool tcp_answers_hold(struct tcp_sock *s);
/* iomu held, a direct send of this side's frame went out (ride: it was a
 * frame that may ride): learns whether answers and riding frames are worth
 * holding on s. */
void tcp_answers_learn(struct tcp_sock *s, bool ride);
/* iomu held, a frame that may ride (xfer_msg.ride) was queued on idle s:
 * true = it is held for this side's next frame (at most until the owner's
 * tick sends it), false = the caller sends it now. */
bool tcp_ride_hold(struct tcp_sock *s);
/* Owner thread, each tick while th->held_n: sends answers nobody carried. */
void tcp_held_tick(struct tcp_thread *th);
/* th->mu held: s leaves th's held list (it closes). */
void tcp_held_unlink(struct tcp_sock *s);

/* tcp_wait.c: waiter-driven receive */
unsigned tcp_peer_hash(const char *node);
/* Owner, iomu held, after a kick: carries out what a waiter left (tcp_wait.c). */
void tcp_sock_deferred(struct tcp_sock *s);
/* ops->wait_rx: the waiting thread polls chan (an initiator socket) and,
 * inbound, the peer's message socket, and reads them itself. */
int tcp_wait_rx(struct xfer_conn *c, void *chan, bool inbound, xfer_batch *b, int timeout_ms);
/* ops->notif_wait_rx: the same for a thread in xfer_notif_wait, on the
 * socket node's (NULL: anyone's) last message came on. */
int tcp_notif_wait_rx(struct xfer_transport *t, const char *node, int timeout_ms);
/* Target, iomu held: a message arrived on s (remember it for waiters);
 * s closes (forget it). */
void tcp_in_note(struct tcp_sock *s);
void tcp_in_forget(struct tcp_sock *s);
/* Initiator: a message went out on s (its answer comes back there: a
 * notification waiter for that peer reads it); s is about to be freed
 * (forget it, wait until no waiter polls it). */
void tcp_out_note(struct tcp_sock *s);
void tcp_out_forget(struct tcp_sock *s);
/* Owner, iomu held, after serving s: takes EPOLLIN back if a waiter left it
 * out and none polls now. */
void tcp_sock_attend(struct tcp_sock *s);
/* Owner thread, every TCP_LAZY_TICK_MS while th->lazy_head: gives EPOLLIN
 * back to the lazy sockets nobody polls that may get data. */
void tcp_lazy_tick(struct tcp_thread *th);
/* th->mu held: s leaves th's lazy list (it closes). */
void tcp_lazy_unlink(struct tcp_sock *s);

/* tcp_gpu.c: GPU memory through pinned staging slots */
/* Starts D2H copies for the first queued frames whose payload is GPU memory. */
void tcp_gpu_prefetch(struct tcp_sock *s);
/* May t be sent now? 1 yes, 0 not yet (the socket is re-driven when the
 * copy finishes), or a negative code with why (initiator chunk: fail it). */
int tcp_gpu_tx_check(struct tcp_sock *s, struct tcp_tx *t, char *why, size_t why_len);
/* t was sent whole: its slot goes back. */
void tcp_gpu_tx_sent(struct tcp_tx *t);
/* t is dropped: waits (bounded) for its copy, gives back slot and pin. */
void tcp_gpu_tx_release(struct tcp_tx *t);
/* Receiving len bytes of payload for GPU memory `dev` into a slot: 0 and
 * s->rx_host set, -XFER_EBUSY (no free slot: the socket is re-driven later),
 * or an error. */
int tcp_gpu_rx_slot(struct tcp_sock *s, int dev, uint64_t len, char *why, size_t why_len);
void tcp_gpu_rx_drop(struct tcp_sock *s);
/* Initiator READ chunk t fully received into s's slot: H2D into its local
 * memory, completed when the copy is (tcp_gpu_pump). */
void tcp_gpu_land(struct tcp_sock *s, struct tcp_tx *t);
/* Target WRITE fully received into s's slot: starts the H2D to dst and
 * attaches the slot to the response t. Returns 0 or an error (slot freed). */
int tcp_gpu_ack_start(struct tcp_sock *s, struct tcp_tx *t, uint8_t *dst, uint64_t len);
void tcp_gpu_wait_mark(struct tcp_sock *s);
void tcp_gpu_sock_fail(struct tcp_sock *s); /* from tcp_sock_fail */
/* Progress loop: re-drives sockets whose staging copies finished. */
void tcp_gpu_pump(struct tcp_thread *th);
void tcp_gpu_thread_free(struct tcp_thread *th);

/* tcp_msg.c: engine messages (MSG_REQ/MSG_RESP) */
int tcp_send_msg(struct xfer_conn *c, struct xfer_msg *m);
/* Target: a MSG_REQ header was decoded into s->rh: 1 = receive its payload,
 * -1 = the socket failed (oversized frame). */
int tcp_msg_header(struct tcp_sock *s);
/* Target: the payload is in s->rx_msg: hand it to the engine, answer. */
void tcp_msg_received(struct tcp_sock *s);
/* Frees a MSG_REQ's t->cached (tcp_tx_free): back into the cache. */
void tcp_msg_tx_put(struct tcp_tx *t);
/* Initiator, tcp_post: the n items idx of b went out as frames chunks, all
 * on s: a notification bound to them goes right behind (docs/notify.md). */
void tcp_msg_behind(struct tcp_conn *tc, xfer_batch *b, struct tcp_sock *s, const size_t *idx,
                    size_t n, uint32_t frames);
/* iomu held, the shared queue spliced: a held FIN among the first held
 * frames goes into the RTS right behind it (xfer_msg_fold). */
void tcp_msg_fold(struct tcp_sock *s, uint32_t held);
/* Target: a WRITE frame of batch seq ended here; landed: its bytes are in
 * host memory. */
void tcp_msg_landed(struct tcp_sock *s, uint32_t seq, bool landed);

/* tcp_fence.c: per-batch fences (cancel vs. retry) */
void tcp_fence_init(struct tcp_transport *tt);
void tcp_fence_fini(struct tcp_transport *tt);
/* Initiator (ops->fence): detaches b's begun frames, FENCE on every socket. */
void tcp_fence(struct xfer_conn *c, xfer_batch *b);
/* Initiator: queues the recent fences on new socket s (not yet adopted). */
void tcp_fence_resend(struct tcp_transport *tt, struct tcp_sock *s);
/* Target: a FENCE header is in s->rh. */
void tcp_fence_frame_in(struct tcp_sock *s);
/* Target: before WRITE payload of batch s->rx_seq goes into a region: true
 * = go on, then tcp_fence_leave() after the copy; false = the batch was
 * fenced, discard (no lock held). */
bool tcp_fence_enter(struct tcp_sock *s);
void tcp_fence_leave(struct tcp_sock *s);

/* tcp_conn.c */
/* Queues t on the least loaded live socket of tc, or the first live one
 * (kick[k] set for socket k); false if every socket is dead. */
bool tcp_enqueue(struct tcp_conn *tc, struct tcp_tx *t, bool *kick, bool first_live);
/* Appends t to s's queue (no kick); its load counts until it completes
 * (not a FENCE's: it has no completion). false if s is dead. */
bool tcp_sock_append(struct tcp_sock *s, struct tcp_tx *t);
int tcp_connect(struct xfer_transport *t, xfer_peer *peer, int timeout_ms, struct xfer_conn **out);
void tcp_disconnect(struct xfer_conn *c);
unsigned tcp_conn_state(struct xfer_conn *c);
int tcp_post(struct xfer_conn *c, xfer_batch *b, const size_t *idx, size_t n);
/* Initiator, reading s: the target refused run t; its items go again one
 * frame each (or fail if that cannot be). */
void tcp_run_split(struct tcp_sock *s, struct tcp_tx *t);

#endif
