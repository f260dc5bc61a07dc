/*
 * Reading a TCP socket (its progress thread, or a waiter: tcp_wait.c):
 * responses (initiator) and requests (target), failure and stall handling.
 *
 * Payload goes straight from the socket into registered memory; only the
 * few bytes that arrive in the header read-ahead buffer are copied. Local
 * memory of an initiator is touched only inside xfer_batch_io_begin/io_end,
 * one system call at a time, so cancellation never waits for a peer.
 */
#include "tcp.h"
#include "xfer_io.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#define RX_BUDGET (8u << 20) /* bytes per readable event before yielding */

/* recv() with the error handling every reader shares: >0 bytes, 0 = try
 * later, -1 = the socket failed; the caller calls rx_failed() once it has
 * let go of any memory pin (failing completes and frees chunks). */
static ssize_t sock_recv(struct tcp_sock *s, void *buf, size_t len)
{
    if (s->rx_short) /* saves the recv that would say EAGAIN */
        return 0;
    for (;;) {
        ssize_t n = recv(s->fd, buf, len, MSG_DONTWAIT);
        if (n > 0) {
            s->io_count++;
            s->rx_short = (size_t)n < len;
            return n;
        }
        if (n == 0) {
            s->rx_errno = 0;
            return -1;
        }
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return 0;
        s->rx_errno = errno;
        return -1;
    }
}

static void rx_failed(struct tcp_sock *s)
{
    if (s->rx_errno) {
        tcp_sock_fail(s, -XFER_ECONN, strerror(s->rx_errno));
        return;
    }
    bool mid = s->rx_state == RX_PAYLOAD || s->rx_hi > s->rx_lo;
    bool clean = s->target && !mid;
    /* An initiator with nothing in flight loses nothing: the peer shut
     * down (or closed an idle socket); repair reconnects if it comes back. */
    pthread_mutex_lock(&s->qmu);
    bool idle = !mid && !s->tx_head && !s->inf_head && !s->q_head;
    pthread_mutex_unlock(&s->qmu);
    tcp_sock_fail_as(s, clean || idle ? XFER_LOG_INFO : XFER_LOG_WARN,
                     mid ? "peer closed the connection mid-frame" : "peer closed the connection");
}

/* Makes a whole header available in rxbuf: 1 = yes, 0 = later, -1 = failed.
 * exact: read no further than the header (a large payload follows, which
 * should go straight to its memory rather than through rxbuf). */
static int fill_header(struct tcp_sock *s, bool exact)
{
    exact |= s->rx_big;
    while (s->rx_hi - s->rx_lo < XFER_WIRE_HDR_LEN) {
        if (s->rx_small_run >= TCP_RX_GROW_AFTER && s->rxbuf == s->rxsmall) {
            uint8_t *big = malloc(TCP_RXBUF_BIG); /* NULL: stay small */
            if (big) {
                memcpy(big, s->rxbuf, s->rx_hi);
                s->rxbuf = big;
                s->rxcap = TCP_RXBUF_BIG;
            }
            s->rx_small_run = 0;
        }
        if (s->rx_lo > 0) {
            memmove(s->rxbuf, s->rxbuf + s->rx_lo, s->rx_hi - s->rx_lo);
            s->rx_hi -= s->rx_lo;
            s->rx_lo = 0;
        }
        size_t want = exact ? XFER_WIRE_HDR_LEN - s->rx_hi : s->rxcap - s->rx_hi;
        ssize_t n = sock_recv(s, s->rxbuf + s->rx_hi, want);
        if (n < 0)
            rx_failed(s);
        if (n <= 0)
            return (int)n;
        s->rx_hi += (size_t)n;
    }
    return 1;
}

/* A header announced `payload` bytes: counts small ones in a row (the
 * read-ahead grows after TCP_RX_GROW_AFTER) and notes a large one. */
static void rx_note(struct tcp_sock *s, uint64_t payload)
{
    s->rx_big = payload >= TCP_RX_DIRECT;
    if (payload > 0 && payload <= TCP_RX_SMALL)
        s->rx_small_run++;
    else if (payload)
        s->rx_small_run = 0;
}

/* Moves up to `left` payload bytes into dst (NULL = discard) from the
 * read-ahead buffer or the socket. Returns bytes moved, 0 = later, -1.
 * Discarding from the socket goes through the owner's scratch buffer: a
 * waiter leaves that to the owner. */
static ssize_t payload_in(struct tcp_sock *s, uint8_t *dst, uint64_t left)
{
    size_t buffered = s->rx_hi - s->rx_lo;
    if (buffered) {
        size_t k = buffered < left ? buffered : (size_t)left;
        if (dst)
            memcpy(dst, s->rxbuf + s->rx_lo, k);
        s->rx_lo += k;
        return (ssize_t)k;
    }
    if (dst)
        return sock_recv(s, dst, left);
    if (s->by_waiter) {
        s->rx_defer = true;
        return 0;
    }
    size_t cap = sizeof(s->th->scratch);
    return sock_recv(s, s->th->scratch, left < cap ? (size_t)left : cap);
}

/* Reports the chunk ends collected by chunk_done_later. */
static void done_flush(struct tcp_sock *s)
{
    if (!s->ndone)
        return;
    __atomic_sub_fetch(&s->load, s->done_load, __ATOMIC_RELAXED);
    xfer_batch_chunks_done_put(s->done, s->ndone);
    s->ndone = 0;
    s->done_load = 0;
}

/* A host chunk's response arrived whole (status 0): its end is reported
 * with the others this read brings (done_flush when the read stops), so a
 * recv full of small responses takes each batch's lock once. */
static void chunk_done_later(struct tcp_sock *s, struct tcp_tx *t)
{
    if (t->op == XFER_WIRE_FENCE || t->msg || t->orphan || t->gpu) {
        tcp_chunk_complete(s, t, 0, NULL);
        return;
    }
    if (s->ndone == TCP_DONE_MAX)
        done_flush(s);
    uint32_t n = tcp_tx_items(t);
    if (n == 1) {
        s->done[s->ndone++] = (struct xfer_chunk_end){t->b, t->idx, t->len, 0, NULL};
    } else {
        for (uint32_t k = 0; k < n; k++) { /* a run: one entry per item */
            if (s->ndone == TCP_DONE_MAX)
                done_flush(s);
            s->done[s->ndone++] = (struct xfer_chunk_end){t->b, t->idx + k, t->len / n, 0, NULL};
        }
    }
    s->done_load += tcp_chunk_load(t);
    tcp_tx_free(t); /* its holds on t->b pass to the entries */
}

/* ---- initiator: responses --------------------------------------------------------- */

static struct tcp_tx *inflight_pop(struct tcp_sock *s)
{
    struct tcp_tx *t = s->inf_head;
    s->inf_head = t->next;
    if (!s->inf_head)
        s->inf_tail = NULL;
    return t;
}

static void remote_refused(struct tcp_sock *s, struct tcp_tx *t, int status)
{
    if (tcp_tx_items(t) > 1 && status != -XFER_ECANCELED) {
        tcp_run_split(s, t); /* each item gets its own answer */
        return;
    }
    char why[160];
    snprintf(why, sizeof(why), "target %s refused: %s", s->name, xfer_strerror(status));
    tcp_chunk_complete(s, t, status, why);
}

/* The response header in s->rh: checks it against the oldest request. 1 =
 * go on. (On an accepted socket: the answer to a message sent back on it.) */
static int response_header(struct tcp_sock *s)
{
    struct xfer_wire_hdr *h = &s->rh;
    struct tcp_tx *t = s->inf_head;
    if (!t || h->req_id != t->req_id || h->op != t->op + 1 ||
        (h->op == XFER_WIRE_READ_RESP && h->status == 0 && h->length != t->len)) {
        tcp_sock_fail(s, -XFER_EPROTO, "response does not match the oldest request");
        return -1;
    }
    rx_note(s, h->op == XFER_WIRE_READ_RESP && h->status == 0 ? t->len : 0);
    if (h->op == XFER_WIRE_READ_RESP && h->status == 0 && t->len > 0) {
        s->rx_state = RX_PAYLOAD;
        s->rx_got = 0;
        return 1;
    }
    inflight_pop(s);
    if (h->status < 0)
        remote_refused(s, t, h->status);
    else if (h->status == 0)
        chunk_done_later(s, t);
    else /* XFER_MSG_* answering a MSG_REQ (the decoder allows no other) */
        tcp_chunk_complete(s, t, h->status, NULL);
    return 1;
}

static int initiator_header(struct tcp_sock *s)
{
    struct xfer_wire_hdr *h = &s->rh;
    if (xfer_wire_decode(s->rxbuf + s->rx_lo, TCP_MAX_PAYLOAD, h) < 0) {
        tcp_sock_fail(s, -XFER_EPROTO, "malformed response header");
        return -1;
    }
    s->rx_lo += XFER_WIRE_HDR_LEN;
    if (h->op != XFER_WIRE_MSG_REQ)
        return response_header(s);
    if (!s->back_in) { /* we did not offer to take messages on it */
        tcp_sock_fail(s, -XFER_EPROTO, "a message from a target that was not offered it");
        return -1;
    }
    rx_note(s, h->length);
    s->back_seen = true;
    return tcp_msg_header(s); /* a message the target sent back (tcp_back.c) */
}

/* The payload of a message sent back on initiator socket s, into
 * s->rx_msg; once whole, handed to the engine (its answer queued:
 * s->answers). Bytes moved, 0 = later, -1. */
static ssize_t back_payload(struct tcp_sock *s)
{
    uint64_t left = s->rh.length - s->rx_got;
    ssize_t n = left ? payload_in(s, s->rx_dst ? s->rx_dst + s->rx_got : NULL, left) : 0;
    if (n < 0)
        rx_failed(s);
    if (n < 0 || (n == 0 && left))
        return n;
    s->rx_got += (uint64_t)n;
    if (s->rx_got == s->rh.length)
        tcp_msg_received(s);
    return n ? n : 1;
}

/* READ payload into local memory, pinned per call; discarded if the item
 * ended meanwhile. */
/* READ payload for local GPU memory: into a staging slot, then H2D. */
static ssize_t initiator_payload_gpu(struct tcp_sock *s, struct tcp_tx *t)
{
    if (s->rx_gslot < 0 && s->rx_gerr == 0) {
        char why[160];
        int rc = tcp_gpu_rx_slot(s, t->gdev, t->len, why, sizeof(why));
        if (rc == -XFER_EBUSY)
            return 0;
        if (rc < 0) {
            xfer_warn("tcp: %s: %s", s->name, why);
            s->rx_gerr = rc;
        }
    }
    uint64_t left = t->len - s->rx_got;
    ssize_t n = payload_in(s, s->rx_gslot >= 0 ? s->rx_host + s->rx_got : NULL, left);
    if (n < 0)
        rx_failed(s);
    if (n <= 0)
        return n;
    s->rx_got += (uint64_t)n;
    if (s->rx_got == t->len) {
        s->rx_state = RX_HDR;
        tcp_gpu_land(s, inflight_pop(s));
    }
    return n;
}

static ssize_t initiator_payload(struct tcp_sock *s)
{
    struct tcp_tx *t = s->inf_head;
    if (t->gpu)
        return initiator_payload_gpu(s, t);
    uint64_t left = t->len - s->rx_got;
    bool live = xfer_batch_io_begin(t->b, t->idx);
    ssize_t n = payload_in(s, live ? t->local + s->rx_got : NULL, left);
    if (live)
        xfer_batch_io_end(t->b, t->idx);
    if (n < 0)
        rx_failed(s);
    if (n <= 0)
        return n;
    s->rx_got += (uint64_t)n;
    if (s->rx_got == t->len) {
        s->rx_state = RX_HDR;
        chunk_done_later(s, inflight_pop(s));
    }
    return n;
}

static void initiator_read(struct tcp_sock *s);

static void initiator_readable(struct tcp_sock *s)
{
    initiator_read(s);
    done_flush(s);
    if (s->answers) {
        if (s->fd >= 0 && !tcp_answers_hold(s))
            tcp_sock_answer(s);
        s->answers = 0;
    }
}

static void initiator_read(struct tcp_sock *s)
{
    size_t budget = RX_BUDGET;
    while (s->fd >= 0 && !s->rx_blocked) {
        ssize_t n;
        if (s->rx_state == RX_HDR) {
            struct tcp_tx *t = s->inf_head;
            bool big = t && t->op == XFER_WIRE_READ_REQ && t->len >= 65536;
            int rc = fill_header(s, big);
            if (rc <= 0)
                return;
            if (initiator_header(s) < 0)
                return;
            continue;
        }
        n = s->rh.op == XFER_WIRE_MSG_REQ ? back_payload(s) : initiator_payload(s);
        if (n <= 0)
            return;
        if ((size_t)n >= budget) {
            tcp_ready_push(s);
            return;
        }
        budget -= (size_t)n;
    }
}

/* ---- target: requests ---------------------------------------------------------- */

struct tcp_tx *tcp_queue_response(struct tcp_sock *s, const struct xfer_wire_hdr *req, uint8_t op,
                                  int status, xfer_region *r, uint8_t *payload)
{
    struct tcp_tx *t = s->tx_spare;
    if (t) {
        s->tx_spare = t->next;
        s->tx_nspare--;
        memset(t, 0, sizeof(*t));
    } else {
        t = calloc(1, sizeof(*t));
    }
    if (!t) {
        if (r)
            xfer_region_release(r);
        tcp_sock_fail(s, -XFER_ENOMEM, "out of memory for a response");
        return NULL;
    }
    struct xfer_wire_hdr h = *req;
    h.op = op;
    h.status = status;
    h.payload = op == XFER_WIRE_READ_RESP && status == 0 ? (uint32_t)req->length : 0;
    xfer_wire_encode(&h, t->hdr);
    t->response = true;
    t->region = r;
    t->payload = payload;
    t->payload_len = h.payload;
    t->gslot = -1;
    if (r && t->payload_len)
        tcp_tx_file(s->tt, t, r, payload, t->payload_len);
    if (r && t->payload_len && xfer_region_kind(r) == XFER_MEM_CUDA) {
        t->gpu = true; /* sent from a staging slot after its D2H */
        t->gdev = xfer_region_device(r);
        t->gsrc = payload;
        t->payload = NULL;
        __atomic_store_n(&s->tgt_gpu, true, __ATOMIC_RELAXED); /* waiters keep off s */
    }
    if (s->tx_tail)
        s->tx_tail->next = t;
    else
        s->tx_head = t;
    s->tx_tail = t;
    s->tx_count++;
    if (s->tx_count > TCP_TXQ_HIGH)
        s->rx_blocked = true;
    return t;
}

static void served(struct tcp_sock *s, uint64_t bytes, int status)
{
    if (status == 0) { /* counted by served_flush */
        s->srv_ops++;
        s->srv_bytes += bytes;
        return;
    }
    xfer_engine_count_served(s->tt->engine, XFER_TRANSPORT_TCP, bytes, status);
    if (status < 0)
        xfer_debug("tcp: refused request from %s: %s", s->name, xfer_strerror(status));
}

/* Counts what this read served, before its responses go out (whoever sees
 * a response sees the count). */
static void served_flush(struct tcp_sock *s)
{
    if (!s->srv_ops)
        return;
    xfer_engine_count_served_n(s->tt->engine, XFER_TRANSPORT_TCP, s->srv_ops, s->srv_bytes);
    s->srv_ops = s->srv_bytes = 0;
}

/* A chunk of a GPU region must fit one staging slot (our initiators split
 * them so); a larger one is refused and r released. */
static xfer_region *gpu_chunk_fits(struct tcp_sock *s, xfer_region *r, uint64_t len, int *err)
{
    if (!r || xfer_region_kind(r) != XFER_MEM_CUDA || len <= TCP_GPU_SLOT)
        return r;
    xfer_warn("tcp: %s: refused a %llu-byte chunk of GPU memory (staging slots hold %u)", s->name,
              (unsigned long long)len, TCP_GPU_SLOT);
    xfer_region_release(r);
    *err = -XFER_ENOTSUP;
    return NULL;
}

static int target_header(struct tcp_sock *s)
{
    struct xfer_wire_hdr *h = &s->rh;
    if (xfer_wire_decode(s->rxbuf + s->rx_lo, TCP_MAX_PAYLOAD, h) < 0) {
        tcp_sock_fail(s, -XFER_EPROTO, "malformed request header (garbage on the stream)");
        return -1;
    }
    s->rx_lo += XFER_WIRE_HDR_LEN;
    if (h->op == XFER_WIRE_MSG_RESP) /* to a message sent back on s (tcp_back.c) */
        return response_header(s);
    rx_note(s, h->op == XFER_WIRE_READ_REQ ? 0 : h->length);
    int err = 0;
    if (h->op == XFER_WIRE_READ_REQ) {
        xfer_region *r = xfer_region_acquire_by(s->tt->engine, s->peer_node, h->region_id, h->gen,
                                                XFER_OP_READ, h->offset, h->length, &err);
        r = gpu_chunk_fits(s, r, h->length, &err);
        served(s, r ? h->length : 0, err);
        tcp_queue_response(s, h, XFER_WIRE_READ_RESP, err, r,
                           r ? (uint8_t *)xfer_region_ptr(r) + h->offset : NULL);
        return 1;
    }
    if (h->op == XFER_WIRE_MSG_REQ)
        return tcp_msg_header(s);
    if (h->op == XFER_WIRE_FENCE) {
        tcp_fence_frame_in(s);
        return 1;
    }
    if (h->op != XFER_WIRE_WRITE_REQ) {
        tcp_sock_fail(s, -XFER_EPROTO, "unexpected frame type from an initiator");
        return -1;
    }
    /* Refused writes still consume their payload so the stream stays in sync. */
    s->rx_region = xfer_region_acquire_by(s->tt->engine, s->peer_node, h->region_id, h->gen,
                                          XFER_OP_WRITE, h->offset, h->length, &err);
    s->rx_region = gpu_chunk_fits(s, s->rx_region, h->length, &err);
    s->rx_status = err;
    s->rx_dst = s->rx_region ? (uint8_t *)xfer_region_ptr(s->rx_region) + h->offset : NULL;
    s->rx_gpu = s->rx_region && xfer_region_kind(s->rx_region) == XFER_MEM_CUDA && h->length;
    if (s->rx_gpu) /* staging is the owner's: waiters keep off s (tcp_wait.c) */
        __atomic_store_n(&s->tgt_gpu, true, __ATOMIC_RELAXED);
    s->rx_seq = xfer_wire_seq(h);
    s->rx_fgen = 0; /* look its batch up once fences exist */
    s->rx_got = 0;
    s->rx_state = RX_PAYLOAD;
    return 1;
}

/* The payload is in the region, or (GPU region) in a staging slot whose
 * H2D must finish before the ack goes out; the region stays pinned till then. */
static void target_write_done(struct tcp_sock *s)
{
    tcp_msg_landed(s, s->rx_seq, s->rx_status == 0 && !s->rx_gpu);
    xfer_region *r = s->rx_region;
    s->rx_region = NULL;
    s->rx_state = RX_HDR;
    bool gpu = s->rx_gpu;
    s->rx_gpu = false;
    struct tcp_tx *t =
        tcp_queue_response(s, &s->rh, XFER_WIRE_WRITE_RESP, s->rx_status, gpu ? r : NULL, NULL);
    if (!gpu && r)
        xfer_region_release(r);
    if (gpu && t) {
        t->gdev = xfer_region_device(r);
        uint8_t *dst = (uint8_t *)xfer_region_ptr(r) + s->rh.offset;
        int rc = tcp_gpu_ack_start(s, t, dst, s->rh.length);
        if (rc < 0) {
            s->rx_status = rc;
            struct xfer_wire_hdr h = s->rh;
            h.op = XFER_WIRE_WRITE_RESP;
            h.status = rc;
            h.payload = 0;
            xfer_wire_encode(&h, t->hdr);
        }
    }
    served(s, s->rx_status == 0 ? s->rh.length : 0, s->rx_status);
}

/* A GPU region's payload goes into a staging slot: 1 = have one (or the
 * payload is discarded), 0 = wait for one. */
static int target_gpu_slot(struct tcp_sock *s)
{
    if (!s->rx_gpu || s->rx_gslot >= 0)
        return 1;
    char why[160];
    int rc = tcp_gpu_rx_slot(s, xfer_region_device(s->rx_region), s->rh.length, why, sizeof(why));
    if (rc == -XFER_EBUSY)
        return 0;
    if (rc < 0) { /* no device: refuse, discard the payload */
        xfer_warn("tcp: %s: %s", s->name, why);
        xfer_region_release(s->rx_region);
        s->rx_region = NULL;
        s->rx_gpu = false;
        s->rx_status = rc;
        s->rx_dst = NULL;
        return 1;
    }
    s->rx_dst = s->rx_host;
    return 1;
}

/* The WRITE being received belongs to a fenced (cancelled) batch: the rest
 * of its payload is discarded, the frame answered -XFER_ECANCELED. */
static void fenced_write(struct tcp_sock *s)
{
    xfer_region_release(s->rx_region);
    s->rx_region = NULL;
    s->rx_dst = NULL;
    s->rx_status = -XFER_ECANCELED;
}

static void target_readable(struct tcp_sock *s)
{
    size_t budget = RX_BUDGET;
    while (s->fd >= 0 && !s->rx_blocked) {
        if (s->by_waiter && s->tgt_gpu) { /* GPU staging: the owner goes on */
            s->rx_defer = true;
            break;
        }
        if (s->rx_state == RX_HDR) {
            int rc = fill_header(s, false);
            if (rc <= 0 || target_header(s) < 0)
                break;
            continue;
        }
        if (!target_gpu_slot(s))
            break;
        uint64_t left = s->rh.length - s->rx_got;
        bool fence = left && s->rx_seq && s->rx_region && !s->rx_gpu;
        if (fence && !tcp_fence_enter(s)) {
            fence = false;
            fenced_write(s);
        }
        ssize_t n = left ? payload_in(s, s->rx_dst ? s->rx_dst + s->rx_got : NULL, left) : 0;
        if (fence)
            tcp_fence_leave(s);
        if (n < 0)
            rx_failed(s);
        if (n < 0 || (n == 0 && left))
            break;
        s->rx_got += (uint64_t)n;
        if (s->rx_got == s->rh.length && s->rh.op == XFER_WIRE_MSG_REQ)
            tcp_msg_received(s);
        else if (s->rx_got == s->rh.length)
            target_write_done(s);
        if ((size_t)n >= budget) {
            tcp_ready_push(s);
            break;
        }
        budget -= (size_t)n;
    }
    served_flush(s);
    done_flush(s);
    if (s->fd >= 0 && s->tx_head && !(s->by_waiter && s->tgt_gpu) && !tcp_answers_hold(s))
        tcp_sock_writable(s);
    s->answers = 0;
}

/* Reads on, by the socket's kind (both kinds read the other's frames of a
 * message sent back: tcp_back.c). */
static void sock_read(struct tcp_sock *s)
{
    if (s->target)
        target_readable(s);
    else
        initiator_readable(s);
}

void tcp_sock_readable(struct tcp_sock *s)
{
    if (s->rx_solo) { /* a solo waiter sleeps in recv on it: it reads (tcp_wait.c) */
        s->skipped = true;
        return;
    }
    s->rx_short = false;
    sock_read(s);
}

/* A solo waiter's blocking recv (tcp_wait.c) brought n bytes into rxbuf,
 * which was empty (n <= 0: end of stream, or errno err); iomu held, s
 * open. Reads on as the owner would, and no recv just to hear EAGAIN after
 * a short one unless something came meanwhile (skipped). */
void tcp_sock_solo_in(struct tcp_sock *s, ssize_t n, size_t asked, int err)
{
    if (n <= 0) {
        s->rx_errno = n < 0 ? err : 0;
        rx_failed(s);
        return;
    }
    s->io_count++;
    s->rx_lo = 0;
    s->rx_hi = (size_t)n;
    s->rx_short = (size_t)n < asked && !s->skipped;
    s->skipped = false;
    sock_read(s);
}
