/*
 * The message channel of an ipc connection in shared memory (docs/ipc.md,
 * "Message ring"): engine message frames (IPC_MSG_REQ) go from the
 * initiator to the owner through a byte ring, their answers (the int32
 * status of IPC_MSG_RESP) come back through a ring of slots, both in one
 * memfd the initiator creates, seals and passes with IPC_RING_REQ.
 *
 * Wake-ups only when needed. A reader that may sleep says so (`sleep`);
 * a writer, after publishing, looks at it (Dekker: each side stores its
 * own word, issues a full fence, then loads the other's) and only then
 * wakes the reader: requests with an IPC_RING_BELL on the connection's
 * socket (the owner's serving thread sleeps in epoll on it), or, when a
 * message waiter sleeps (IPC_SLEEP_EFD), a write to the owner's eventfd
 * that came with IPC_RING_RESP (the waiter polls it beside its wake fd:
 * no epoll_ctl pair to take the socket from the serving thread, no
 * socket message); answers with a futex in the page (one reader, the
 * initiator's link holder). Either the reader's re-check after its store
 * sees the frame, or the writer's load sees the reader's store: no lost
 * wake-up.
 *
 * Everything read from the page is untrusted: each side keeps its own
 * copy of the indices it writes, checks the other's against them (never
 * behind, never more than the ring ahead), checks every record header
 * (sequence number, length) and copies a frame out before anyone parses
 * it. A bad ring returns -XFER_EPROTO and the connection ends as for a
 * malformed socket message.
 */
#ifndef XFER_IPC_RING_H
#define XFER_IPC_RING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define IPC_RING_MAGIC      0x474e4952u  /* "RING" */
#define IPC_RING_REQ_BYTES  (512u << 10) /* >= 2 largest frames + record headers */
#define IPC_RING_RESP_SLOTS 8192u
#define IPC_RING_HDR_BYTES  4096u

struct ipc_ring_side {
    _Alignas(64) uint64_t head;  /* writer: bytes (requests) or slots (answers) published */
    _Alignas(64) uint64_t tail;  /* reader: consumed */
    _Alignas(64) uint32_t sleep; /* reader: IPC_SLEEP_* (how to wake it) */
    uint32_t belled;             /* requests: an IPC_RING_BELL is on its way */
    uint32_t fut;                /* answers: futex word, bumped per answer */
};

/* The requests' `sleep` word, written by the owner. */
#define IPC_SLEEP_SPIN 0u /* a reader spins: no wake-up */
#define IPC_SLEEP_SOCK 1u /* readers sleep on the socket: IPC_RING_BELL */
#define IPC_SLEEP_EFD  2u /* a message waiter sleeps on the eventfd: write it */

/* `features`, set by the initiator (an initiator built before: 0). */
#define IPC_RING_F_EFD 1u /* it takes an eventfd with IPC_RING_RESP */

struct ipc_ring_shm {
    uint32_t magic, req_bytes, resp_slots, features;
    struct ipc_ring_side req, resp;
};

struct ipc_ring_slot {
    int32_t status;
    uint32_t seq; /* low bits of its index: a stale or forged slot shows */
};

/* One side's view. Each index below is this side's own copy of what it
 * writes; the shared one is only ever stored from it. */
struct ipc_ring {
    struct ipc_ring_shm *shm;
    char *req;                  /* IPC_RING_REQ_BYTES */
    struct ipc_ring_slot *resp; /* IPC_RING_RESP_SLOTS */
    size_t map_len;
    uint64_t req_pos;  /* initiator: req head; owner: req tail */
    uint64_t resp_pos; /* initiator: resp tail; owner: resp head */
    uint32_t req_seq;  /* frames written / read */
    bool efd_up;       /* efd is ours (closed by ipc_ring_unmap) */
    int efd;           /* owner: waiters' eventfd; initiator: the owner's, to write */
};

size_t ipc_ring_size(void);
/* Initiator: a new sealed memfd (*fd, for IPC_RING_REQ) mapped into r. */
int ipc_ring_create(struct ipc_ring *r, int *fd);
/* Owner: maps the peer's fd after checking it is a sealed memfd of the
 * right size (a peer that could shrink it would crash us with SIGBUS). */
int ipc_ring_attach(struct ipc_ring *r, int fd);
void ipc_ring_unmap(struct ipc_ring *r);

/* Initiator: publishes a frame: 0, -XFER_EBUSY (no room now), -XFER_EPROTO. */
int ipc_ring_put(struct ipc_ring *r, const void *frame, uint32_t len);
/* After a publish: which wake-up the owner needs: 0 none, IPC_SLEEP_SOCK
 * an IPC_RING_BELL (at most once per bell taken: ipc_ring_bell_taken),
 * IPC_SLEEP_EFD a write to r->efd (each time: its readers drain it). */
unsigned ipc_ring_need_bell(struct ipc_ring *r);
/* Initiator: wakes the owner as need_bell said, on socket fd: 0 or < 0. */
int ipc_ring_ring(struct ipc_ring *r, unsigned bell, int fd, int timeout_ms);
/* Owner: copies the next frame into buf: 1, 0 none, -XFER_EPROTO. */
int ipc_ring_get(struct ipc_ring *r, void *buf, uint32_t max, uint32_t *len);
/* Owner: a frame is there (a hint from shared memory, no check). */
bool ipc_ring_pending(const struct ipc_ring *r);
/* Owner: kind byte of the next frame (hint only), -1 when none. */
int ipc_ring_peek_kind(const struct ipc_ring *r);
/* Owner: how its readers wait now (IPC_SLEEP_*), then a full fence:
 * re-check ipc_ring_pending after it. */
void ipc_ring_sleep(struct ipc_ring *r, uint32_t how);
/* Owner: an eventfd for waiters when the initiator takes one (-1: none);
 * r keeps it (efd_up) and passes it with IPC_RING_RESP. */
int ipc_ring_make_efd(struct ipc_ring *r);
/* Owner: a bell was read; frames published from now on ring again once
 * the ring is drained (call before draining). */
void ipc_ring_bell_taken(struct ipc_ring *r);

/* Owner: publishes an answer: 0, -XFER_EBUSY (full), -XFER_EPROTO. */
int ipc_ring_answer(struct ipc_ring *r, int32_t status);
/* Initiator: the next answer: 1, 0 none, -XFER_EPROTO. */
int ipc_ring_take_answer(struct ipc_ring *r, int32_t *status);
/* Initiator: sleeps until an answer may be there, at most timeout_us. */
void ipc_ring_wait_answer(struct ipc_ring *r, int64_t timeout_us);

/* XFER_IPC_RING=0 turns the ring off on this side (either side may). */
bool ipc_ring_enabled(void);

#endif
