/*
 * Sending on a TCP socket (its progress thread, or a submitting thread on an
 * idle initiator socket: tcp_sock_send_direct): gathering frames into
 * sendmsg, the shared queue, frames whose items ended.
 *
 * Payload goes straight from registered memory to the socket. Local memory
 * of an initiator is touched only inside xfer_batch_io_begin/io_end, one
 * system call at a time, so cancellation never waits for a peer.
 */
#include "tcp.h"
#include "xfer_io.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

/* A response sent whole: kept on s's spare list for tcp_queue_response
 * (both run holding iomu), or freed. */
static void response_sent(struct tcp_sock *s, struct tcp_tx *t)
{
    if (t->slab || t->own || t->gpu || s->tx_nspare >= TCP_TX_SPARE_MAX) {
        tcp_response_done(t);
        return;
    }
    if (t->region)
        xfer_region_release(t->region);
    t->next = s->tx_spare;
    s->tx_spare = t;
    s->tx_nspare++;
}

/* ---- sending ------------------------------------------------------------------- */

static void tx_pop(struct tcp_sock *s)
{
    struct tcp_tx *t = s->tx_head;
    s->tx_head = t->next;
    if (!s->tx_head)
        s->tx_tail = NULL;
    s->tx_count--;
    t->next = NULL;
}

static void inflight_push(struct tcp_sock *s, struct tcp_tx *t)
{
    if (s->inf_tail)
        s->inf_tail->next = t;
    else
        s->inf_head = t;
    s->inf_tail = t;
}

/* Moves the shared queue to the owner's list; false (nothing moved) for a
 * direct sender once GPU chunks were queued: their staging is the owner's. */
static bool splice_queue(struct tcp_sock *s, bool direct)
{
    pthread_mutex_lock(&s->qmu);
    if (direct && s->gpu_seen) {
        pthread_mutex_unlock(&s->qmu);
        return false;
    }
    struct tcp_tx *q = s->q_head;
    s->q_head = s->q_tail = NULL;
    pthread_mutex_unlock(&s->qmu);
    if (!q)
        return true;
    if (!s->tx_head && !s->inf_head) /* was idle: the stall clock starts now */
        s->io_count++;
    for (; q; q = q->next) {
        if (s->tx_tail)
            s->tx_tail->next = q;
        else
            s->tx_head = q;
        s->tx_tail = q;
        s->tx_count++;
    }
    return true;
}

/* Initiator: drops unsent chunks at the head whose items ended. */
/* Unsent chunks of items that ended, or whose batch is being cancelled or
 * timed out, leave the head (a FENCE may wait behind them). A chunk of an
 * item that is still open only gives its hold back: ending the item here
 * (-XFER_ECANCELED) raced the cancel, which fences one socket at a time: a
 * frame of the same item half sent on a socket not fenced yet then lost its
 * memory and went out as zeros, landing at the target (test_tcp_cancel_retry
 * with bulk on 2 progress threads). The cancel or deadline ends the item
 * once every socket is fenced. */
static void drop_dead_heads(struct tcp_sock *s)
{
    while (s->tx_head && s->tx_head->hdr_sent == 0 && s->tx_head->b &&
           !xfer_batch_item_live(s->tx_head->b, s->tx_head->idx)) {
        struct tcp_tx *t = s->tx_head;
        tx_pop(s);
        if (xfer_batch_item_open(t->b, t->idx))
            tcp_chunk_release(s, t);
        else
            tcp_chunk_complete(s, t, -XFER_ECANCELED, "item ended before it was sent");
    }
}

struct gather {
    struct iovec iov[2 * TCP_IOV_MAX];
    struct tcp_tx *pinned[TCP_IOV_MAX];
    int niov, npinned;
    bool last; /* the frame just added is only partly covered */
};

/* Adds t to g; false = stop gathering here (t goes next round). An
 * initiator's WRITE payload is local memory: pinned for this call only. A
 * frame whose batch is cancelled or timed out was detached by tcp_fence()
 * before its item ended (the rest goes out of a copy). If its item ended
 * otherwise (a failure elsewhere) while the frame is half sent, the rest is
 * sent as zeros: the stream stays in sync (other chunks on this socket are
 * not hurt) and the failed item's remote range is undefined anyway. A chunk
 * not begun starts only while its item is live, so none starts once a
 * cancel began. */
static const uint8_t zeros[65536];

static bool gather_add(struct gather *g, struct tcp_tx *t)
{
    bool chunk = t->b != NULL;
    bool needs_mem = chunk && !t->pad && !t->detached && t->payload_sent < t->payload_len;
    if (chunk && t->hdr_sent == 0 && !xfer_batch_item_live(t->b, t->idx))
        return false; /* the head is dropped next round (drop_dead_heads) */
    if (needs_mem) {
        if (xfer_batch_io_begin(t->b, t->idx)) {
            g->pinned[g->npinned++] = t;
        } else if (t->hdr_sent == 0) {
            return false; /* not started: dropped when it reaches the head */
        } else {
            t->pad = true;
        }
    }
    if (t->hdr_sent < XFER_WIRE_HDR_LEN)
        g->iov[g->niov++] = (struct iovec){t->hdr + t->hdr_sent, XFER_WIRE_HDR_LEN - t->hdr_sent};
    uint64_t left = t->payload_len - t->payload_sent;
    if (left && t->pad) {
        g->iov[g->niov++] =
            (struct iovec){(void *)zeros, left < sizeof(zeros) ? (size_t)left : sizeof(zeros)};
        /* tx_advance() assumes each frame's iovs cover all it has left, so a
         * frame sent only in part by this call must be the last one. */
        g->last = left > sizeof(zeros);
    } else if (left)
        g->iov[g->niov++] = (struct iovec){t->payload + t->payload_sent, left};
    return true;
}

/* Accounts n sent bytes to the queue head onwards. */
static void tx_advance(struct tcp_sock *s, size_t n)
{
    while (s->tx_head) {
        struct tcp_tx *t = s->tx_head;
        size_t h = XFER_WIRE_HDR_LEN - t->hdr_sent;
        if (h > n)
            h = n;
        t->hdr_sent += (uint32_t)h;
        n -= h;
        uint64_t p = t->payload_len - t->payload_sent;
        if (p > n)
            p = n;
        t->payload_sent += p;
        n -= (size_t)p;
        if (t->hdr_sent < XFER_WIRE_HDR_LEN || t->payload_sent < t->payload_len)
            return;
        tx_pop(s);
        tcp_gpu_tx_sent(t);
        if (t->response)
            response_sent(s, t);
        else if (t->op == XFER_WIRE_FENCE) /* answered by nothing */
            tcp_tx_free(t);
        else if (t->noresp) /* a locally completed SEND: written is done */
            tcp_chunk_complete(s, t, 0, NULL);
        else
            inflight_push(s, t);
    }
}

/* Is the head's GPU payload (or the GPU copy its ack waits for) done? 1 yes,
 * 0 not yet, -1 the head was a chunk whose copy failed (completed, popped). */
static int gpu_head_ready(struct tcp_sock *s)
{
    struct tcp_tx *t = s->tx_head;
    char why[240];
    int rc = tcp_gpu_tx_check(s, t, why, sizeof(why));
    if (rc >= 0)
        return rc;
    tx_pop(s);
    tcp_chunk_complete(s, t, rc, why);
    return -1;
}

/* ---- payload from the file ---------------------------------------------------------
 *
 * Region memory the engine allocated is a memfd (region_mem.c): a large
 * payload of it goes out with sendfile, which hands the socket the memfd's
 * pages instead of copying them into socket buffers (over loopback the
 * receiver's recv is then the only copy; on a NIC the send side copies
 * nothing). The header goes first with MSG_MORE. An initiator's payload is
 * pinned for the call (io_begin/io_end) as sendmsg's is: the pages stay
 * referenced by the kernel until sent, and an item answered by its target
 * was read there whole. A blocking descriptor (solo waiters,
 * tcp_solo_setup) turns non-blocking around the call (a waiter that enters
 * recv meanwhile returns at once and polls). A file that cannot be spliced
 * (hugetlbfs) falls back to sendmsg for that frame. */

void tcp_tx_file(struct tcp_transport *tt, struct tcp_tx *t, const xfer_region *r, const uint8_t *p,
                 uint64_t len)
{
    int fd = xfer_region_memfd(r);
    if (!tt->sendfile || fd < 0 || len < TCP_FILE_MIN || xfer_region_kind(r) != XFER_MEM_HOST)
        return;
    t->file = true;
    t->file_fd = fd;
    t->file_off = (uint64_t)(p - (const uint8_t *)xfer_region_ptr(r));
}

/* A socket's file status flags are O_NONBLOCK or none (tcp_solo_setup
 * took it out): no F_GETFL needed. */
/* sendfile has no MSG_NOSIGNAL: a peer gone raises SIGPIPE in the calling
 * thread. So only progress threads, which block SIGPIPE for good
 * (tcp_send_thread_init), send file frames; a submitting thread or a
 * waiter stops before one and leaves it to the owner (a hand-off per
 * large frame at most). */
static __thread bool sigpipe_blocked;

void tcp_send_thread_init(void)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    sigpipe_blocked = pthread_sigmask(SIG_BLOCK, &set, NULL) == 0;
}

static int nonblock(int fd, bool on)
{
    return fcntl(fd, F_SETFL, on ? O_NONBLOCK : 0);
}

/* One step of the head frame, a file frame: its header (MSG_MORE), or a
 * sendfile of its payload. 1 = went on (or the frame fell back to memory),
 * 0 = the socket is full (EPOLLOUT armed), -1 = failed (*err). */
static int file_step(struct tcp_sock *s, int *err)
{
    struct tcp_tx *t = s->tx_head;
    ssize_t n;
    if (t->hdr_sent < XFER_WIRE_HDR_LEN) {
        struct iovec iov = {t->hdr + t->hdr_sent, XFER_WIRE_HDR_LEN - t->hdr_sent};
        struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
        n = sendmsg(s->fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL | MSG_MORE);
        *err = errno;
    } else {
        bool pinned = t->b && !t->pad && !t->detached;
        if (pinned && !xfer_batch_io_begin(t->b, t->idx)) {
            t->file = false;
            t->pad = true; /* the item ended mid-frame: zeros, as sendmsg's path */
            return 1;
        }
        off_t off = (off_t)(t->file_off + t->payload_sent);
        uint64_t left = t->payload_len - t->payload_sent;
        bool flip = s->solo_ok && nonblock(s->fd, true) == 0;
        n = sendfile(s->fd, t->file_fd, &off, left < (1u << 30) ? (size_t)left : (1u << 30));
        *err = errno;
        if (flip)
            nonblock(s->fd, false);
        if (pinned)
            xfer_batch_io_end(t->b, t->idx);
        if (n == 0 || (n < 0 && (*err == EINVAL || *err == ENOSYS || *err == EOPNOTSUPP))) {
            t->file = false; /* not a file sendfile takes: from memory */
            return 1;
        }
    }
    if (n < 0) {
        if (*err == EINTR)
            return 1;
        if (*err != EAGAIN && *err != EWOULDBLOCK)
            return -1;
        if (!s->out_armed) { /* the owner goes on at EPOLLOUT */
            s->out_armed = true;
            tcp_sock_interest(s);
        }
        return 0;
    }
    s->io_count++;
    tx_advance(s, (size_t)n);
    return 1;
}

/* direct: called by a submitting thread; a failing send is left to the
 * owner (kicked by the caller), which alone closes sockets. Returns false if
 * frames are left unsent. */
static bool send_queued(struct tcp_sock *s, bool direct)
{
    if (s->fd < 0)
        return false;
    uint32_t held = s->held;
    s->held = 0; /* held answers go with what this sends (or at EPOLLOUT) */
    /* An accepted socket's list is its owner's responses, unless messages
     * were sent back on it (tcp_back.c): then its shared queue moves too. */
    if (tcp_sock_queues(s) && !splice_queue(s, direct))
        return false;
    if (held && s->tt->fold)
        tcp_msg_fold(s, held);
    for (;;) {
        drop_dead_heads(s);
        if (!s->tx_head)
            break;
        tcp_gpu_prefetch(s);
        int ready = gpu_head_ready(s);
        if (ready < 0)
            continue;
        if (ready == 0)
            break;
        if (s->tx_head->file && !sigpipe_blocked) { /* the owner sends it (see above) */
            if (s->by_waiter)
                s->rx_defer = true; /* kicked when the waiter leaves */
            return false;           /* a direct sender's caller kicks it */
        }
        if (s->tx_head->file) {
            int err = 0, rc = file_step(s, &err);
            if (rc > 0)
                continue;
            if (rc < 0 && !direct)
                tcp_sock_fail(s, -XFER_ECONN, strerror(err));
            return false;
        }
        struct gather g;
        g.niov = g.npinned = 0;
        g.last = false;
        int n_ent = 0;
        for (struct tcp_tx *t = s->tx_head; t && n_ent < TCP_IOV_MAX && !g.last;
             t = t->next, n_ent++)
            if ((t != s->tx_head &&
                 (t->file || (t->gpu && tcp_gpu_tx_check(s, t, NULL, 0) != 1))) ||
                !gather_add(&g, t))
                break;
        if (n_ent == 0)
            continue; /* the unsent head just ended: dropped next round */
        struct msghdr msg = {.msg_iov = g.iov, .msg_iovlen = (size_t)g.niov};
        ssize_t n = sendmsg(s->fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
        int err = errno;
        for (int i = 0, j; i < g.npinned; i = j) { /* one lock round per run of a batch */
            for (j = i + 1; j < g.npinned && g.pinned[j]->b == g.pinned[i]->b; j++)
                ;
            xfer_batch_io_end_n(g.pinned[i]->b, j - i);
        }
        if (n < 0) {
            if (err == EINTR)
                continue;
            if (err == EAGAIN || err == EWOULDBLOCK) { /* the owner goes on at EPOLLOUT */
                if (!s->out_armed) {
                    s->out_armed = true;
                    tcp_sock_interest(s);
                }
            } else if (!direct) {
                tcp_sock_fail(s, -XFER_ECONN, strerror(err));
            }
            return false;
        }
        s->io_count++;
        tx_advance(s, (size_t)n);
    }
    if (s->rx_blocked && s->tx_count < TCP_TXQ_HIGH / 4) {
        s->rx_blocked = false;
        tcp_ready_push(s);
    }
    return true;
}

void tcp_sock_writable(struct tcp_sock *s)
{
    send_queued(s, false);
}

void tcp_sock_answer(struct tcp_sock *s)
{
    if (!s->by_waiter) {
        send_queued(s, false);
        return;
    }
    /* A waiter sends as a direct sender would: GPU chunks queued meanwhile
     * (staging) and a failing send are the owner's, kicked when the waiter
     * leaves (rx_defer); a full socket goes on at the owner's EPOLLOUT. */
    if (!send_queued(s, true) && s->fd >= 0 && !s->out_armed)
        s->rx_defer = true;
}

bool tcp_sock_take_queue(struct tcp_sock *s)
{
    return !tcp_sock_queues(s) || splice_queue(s, true);
}

bool tcp_sock_send_direct(struct tcp_sock *s, bool ride)
{
    if (pthread_mutex_trylock(&s->iomu) != 0)
        return false; /* the owner is at it: it sees the queue when done */
    /* Only an idle socket (a busy one has the owner waiting for EPOLLOUT),
     * or one with held frames only: this frame carries them. */
    uint32_t had = s->held;
    bool ok = (!s->tx_head || s->tx_count == had) && s->fd >= 0;
    if (ok && ride && tcp_ride_hold(s)) {
        pthread_mutex_unlock(&s->iomu);
        return true; /* held: the next frame or the owner's tick sends it */
    }
    ok = ok && send_queued(s, true) && !s->tx_head;
    if (ok)
        tcp_answers_learn(s, ride);
    pthread_mutex_unlock(&s->iomu);
    return ok;
}
