/*
 * GPU memory over the tcp transport, run by a socket's progress thread only.
 *
 * Sockets carry host bytes, so GPU memory goes through pinned staging slots
 * (engine/gpu_stage): each progress thread owns, per GPU, rings for sending
 * (D2H, then the slot is the frame's payload) and for receiving (payload
 * read into a slot, then H2D). Separate directions so that a thread whose
 * send slots all wait for a slow reader can still receive. Chunks touching
 * GPU memory are at most one slot (TCP_GPU_SLOT): the initiator splits them
 * that way and the target refuses larger ones with -XFER_ENOTSUP.
 *
 * Two size classes per direction: 4 big slots, and TCP_GPU_SMALL_SLOTS small
 * ones for chunks of at most TCP_GPU_SMALL_SLOT. A copy's cost on a GPU is
 * mostly latency, not bytes (a small H2D can wait a whole time slice of
 * another process's kernel, docs/gpu.md), so with four slots thousands of
 * tiny items went through four at a time; with many small slots they are
 * all in flight at once and share that latency.
 *
 * Pipelining: the D2H of the next queued frames runs while the current one is
 * written (tcp_gpu_prefetch), and the H2D of a received chunk runs while the
 * next one is read. A socket waiting for a copy is put on the thread's
 * gpu list, and the thread polls the copies (epoll timeout 0) while that list
 * is not empty; copies of one slot take tens of microseconds.
 *
 * An initiator's local GPU memory is pinned (xfer_batch_io_begin) for as
 * long as a copy touches it, so cancellation waits for the copy, not for the
 * peer.
 */
#include "tcp.h"
#include "gpu_stage.h"

#include <stdio.h>
#include <string.h>

#define GPU_SEND     0
#define GPU_RECV     1
#define DROP_WAIT_MS 5000

/* The ring for `len` bytes of GPU `dev` in direction dir, made on first use. */
static struct xfer_gpu_stage *stage_for(struct tcp_thread *th, int dev, int dir, uint64_t len,
                                        int *err, char *why, size_t why_len)
{
    if (dev < 0 || dev >= TCP_GPU_MAX_DEV) {
        *err = -XFER_ENODEV;
        snprintf(why, why_len, "GPU %d outside the %d GPUs tcp stages for", dev, TCP_GPU_MAX_DEV);
        return NULL;
    }
    bool small = len <= TCP_GPU_SMALL_SLOT;
    struct xfer_gpu_stage **st = &th->gst[dev][dir][small];
    if (*st)
        return *st;
    int rc = small ? xfer_gpu_stage_new(dev, TCP_GPU_SMALL_SLOT, TCP_GPU_SMALL_SLOTS, st)
                   : xfer_gpu_stage_new(dev, TCP_GPU_SLOT, TCP_GPU_SLOTS, st);
    if (rc == 0)
        return *st;
    *err = rc;
    if (rc == -XFER_ENODEV)
        snprintf(why, why_len, "no CUDA device (GPU %d memory over tcp)", dev);
    else
        snprintf(why, why_len, "GPU %d staging ring: %s", dev, xfer_strerror(rc));
    return NULL;
}

void tcp_gpu_wait_mark(struct tcp_sock *s)
{
    if (s->gpu_wait || s->fd < 0)
        return;
    s->gpu_wait = true;
    s->gpu_next = s->th->gpu_head;
    s->th->gpu_head = s;
}

static void gpu_unlink(struct tcp_sock *s)
{
    if (!s->gpu_wait)
        return;
    for (struct tcp_sock **pp = &s->th->gpu_head; *pp; pp = &(*pp)->gpu_next) {
        if (*pp == s) {
            *pp = s->gpu_next;
            break;
        }
    }
    s->gpu_wait = false;
}

/* ---- sending GPU payload ---------------------------------------------------------- */

/* Takes a slot and starts the D2H of t's payload: 1 started, 0 no slot. */
static int send_start(struct tcp_sock *s, struct tcp_tx *t)
{
    int err = 0;
    char why[160];
    if (!t->gst)
        t->gst = stage_for(s->th, t->gdev, GPU_SEND, t->payload_len, &err, why, sizeof(why));
    if (!t->gst)
        return err;
    void *host;
    int slot = xfer_gpu_stage_get(t->gst, &host);
    if (slot < 0)
        return 0;
    if (!t->response) {
        if (!xfer_batch_io_begin(t->b, t->idx)) { /* item ended: dropped at the head */
            xfer_gpu_stage_put(t->gst, slot);
            return 0;
        }
        t->gpin = true;
    }
    int rc = xfer_gpu_stage_d2h(t->gst, slot, t->gsrc, (size_t)t->payload_len);
    if (rc < 0) {
        xfer_warn("tcp: %s: D2H staging: %s", s->name, xfer_gpu_stage_last_error(t->gst));
        xfer_gpu_stage_put(t->gst, slot);
        if (t->gpin)
            xfer_batch_io_end(t->b, t->idx);
        t->gpin = false;
        return rc;
    }
    t->gslot = slot;
    t->payload = host;
    return 1;
}

void tcp_gpu_prefetch(struct tcp_sock *s)
{
    unsigned k = 0;
    for (struct tcp_tx *t = s->tx_head; t && k < TCP_GPU_PREFETCH; t = t->next, k++) {
        if (!t->gpu || !t->gsrc || t->gslot >= 0 || t->gready)
            continue;
        if (send_start(s, t) <= 0)
            break; /* no slot (or an error, reported by tcp_gpu_tx_check) */
        tcp_gpu_wait_mark(s);
    }
}

/* Turns a target response into a bare status (its GPU copy failed). */
static void response_to_error(struct tcp_tx *t, int status)
{
    struct xfer_wire_hdr h;
    xfer_wire_decode(t->hdr, TCP_MAX_PAYLOAD, &h);
    h.status = status;
    h.payload = 0;
    xfer_wire_encode(&h, t->hdr);
    t->payload = NULL;
    t->payload_len = 0;
}

static int copy_failed(struct tcp_sock *s, struct tcp_tx *t, int rc, char *why, size_t why_len)
{
    char local[200];
    if (!why || !why_len) { /* a frame behind the head: reason logged only */
        why = local;
        why_len = sizeof(local);
    }
    if (!t->gst && rc == -XFER_ENODEV)
        snprintf(why, why_len, "no CUDA device (GPU %d memory over tcp)", t->gdev);
    else
        snprintf(why, why_len, "GPU %d staging copy: %s", t->gdev,
                 t->gst ? xfer_gpu_stage_last_error(t->gst) : xfer_strerror(rc));
    if (t->gslot >= 0)
        xfer_gpu_stage_put(t->gst, t->gslot);
    t->gslot = -1;
    if (t->gpin)
        xfer_batch_io_end(t->b, t->idx);
    t->gpin = false;
    if (!t->response)
        return rc;
    xfer_warn("tcp: %s: %s", s->name, why);
    response_to_error(t, rc);
    t->gready = true;
    return 1;
}

int tcp_gpu_tx_check(struct tcp_sock *s, struct tcp_tx *t, char *why, size_t why_len)
{
    if (!t->gpu || t->gready || (!t->gsrc && t->gslot < 0))
        return 1; /* nothing staged: a READ_REQ, or an ack whose copy never started */
    if (t->gslot < 0) {
        int rc = send_start(s, t);
        if (rc < 0)
            return copy_failed(s, t, rc, why, why_len);
        tcp_gpu_wait_mark(s);
        return 0;
    }
    int rc = xfer_gpu_stage_poll(t->gst, t->gslot);
    if (rc == -XFER_EINPROGRESS) {
        tcp_gpu_wait_mark(s);
        return 0;
    }
    if (rc < 0)
        return copy_failed(s, t, rc, why, why_len);
    if (t->gpin)
        xfer_batch_io_end(t->b, t->idx);
    t->gpin = false;
    t->gready = true;
    if (!t->gsrc) { /* WRITE ack: the data is in GPU memory, the slot is free */
        xfer_gpu_stage_put(t->gst, t->gslot);
        t->gslot = -1;
    }
    return 1;
}

void tcp_gpu_tx_sent(struct tcp_tx *t)
{
    if (t->gpu && t->gslot >= 0) {
        xfer_gpu_stage_put(t->gst, t->gslot);
        t->gslot = -1;
    }
}

void tcp_gpu_tx_release(struct tcp_tx *t)
{
    if (!t->gpu)
        return;
    if (t->gslot >= 0) {
        if (xfer_gpu_stage_wait(t->gst, t->gslot, DROP_WAIT_MS) == -XFER_ETIMEDOUT)
            xfer_err("tcp: GPU staging copy still running after %d ms; slot leaked", DROP_WAIT_MS);
        else
            xfer_gpu_stage_put(t->gst, t->gslot);
        t->gslot = -1;
    }
    if (t->gpin)
        xfer_batch_io_end(t->b, t->idx);
    t->gpin = false;
}

/* ---- receiving into GPU memory ----------------------------------------------------- */

int tcp_gpu_rx_slot(struct tcp_sock *s, int dev, uint64_t len, char *why, size_t why_len)
{
    int err = 0;
    struct xfer_gpu_stage *st = stage_for(s->th, dev, GPU_RECV, len, &err, why, why_len);
    if (!st)
        return err;
    void *host;
    int slot = xfer_gpu_stage_get(st, &host);
    if (slot < 0) {
        tcp_gpu_wait_mark(s);
        return -XFER_EBUSY;
    }
    s->rx_gst = st;
    s->rx_gslot = slot;
    s->rx_host = host;
    return 0;
}

void tcp_gpu_rx_drop(struct tcp_sock *s)
{
    if (s->rx_gslot >= 0)
        xfer_gpu_stage_put(s->rx_gst, s->rx_gslot); /* no copy runs on a receiving slot */
    s->rx_gslot = -1;
    s->rx_host = NULL;
    s->rx_gpu = false;
    s->rx_gerr = 0;
}

/* Moves the receiving slot to t (its copy is started next). */
static void slot_to_tx(struct tcp_sock *s, struct tcp_tx *t)
{
    t->gpu = true;
    t->gst = s->rx_gst;
    t->gslot = s->rx_gslot;
    s->rx_gslot = -1;
    s->rx_host = NULL;
}

void tcp_gpu_land(struct tcp_sock *s, struct tcp_tx *t)
{
    if (s->rx_gslot < 0) { /* no slot could be had: the payload was discarded */
        int err = s->rx_gerr ? s->rx_gerr : -XFER_EIO;
        tcp_gpu_rx_drop(s);
        tcp_chunk_complete(s, t, err,
                           err == -XFER_ENODEV ? "no CUDA device (GPU memory over tcp)"
                                               : "no staging ring for GPU memory over tcp");
        return;
    }
    slot_to_tx(s, t);
    if (!xfer_batch_io_begin(t->b, t->idx)) { /* item ended: the data goes nowhere */
        tcp_gpu_tx_release(t);
        tcp_chunk_complete(s, t, -XFER_ECANCELED, "item ended");
        return;
    }
    t->gpin = true;
    int rc = xfer_gpu_stage_h2d(t->gst, t->gslot, t->local, (size_t)t->len);
    if (rc < 0) {
        char why[200];
        snprintf(why, sizeof(why), "H2D staging: %s", xfer_gpu_stage_last_error(t->gst));
        tcp_gpu_tx_release(t);
        tcp_chunk_complete(s, t, rc, why);
        return;
    }
    t->next = NULL;
    if (s->land_tail)
        s->land_tail->next = t;
    else
        s->land_head = t;
    s->land_tail = t;
    tcp_gpu_wait_mark(s);
}

/* Completes landed READ chunks whose H2D finished; true if any is left. */
static bool land_poll(struct tcp_sock *s)
{
    struct tcp_tx **pp = &s->land_head, *last = NULL;
    while (*pp) {
        struct tcp_tx *t = *pp;
        int rc = xfer_gpu_stage_poll(t->gst, t->gslot);
        if (rc == -XFER_EINPROGRESS) {
            last = t;
            pp = &t->next;
            continue;
        }
        *pp = t->next;
        char why[200] = "";
        if (rc < 0)
            snprintf(why, sizeof(why), "H2D staging: %s", xfer_gpu_stage_last_error(t->gst));
        tcp_gpu_tx_release(t);
        tcp_chunk_complete(s, t, rc, rc < 0 ? why : NULL);
    }
    s->land_tail = last;
    return s->land_head != NULL;
}

int tcp_gpu_ack_start(struct tcp_sock *s, struct tcp_tx *t, uint8_t *dst, uint64_t len)
{
    struct xfer_gpu_stage *st = s->rx_gst;
    slot_to_tx(s, t);
    s->rx_gpu = false;
    int rc = xfer_gpu_stage_h2d(st, t->gslot, dst, (size_t)len);
    if (rc < 0) {
        xfer_warn("tcp: %s: H2D staging: %s", s->name, xfer_gpu_stage_last_error(st));
        xfer_gpu_stage_put(st, t->gslot);
        t->gpu = false;
        t->gslot = -1;
        return rc;
    }
    tcp_gpu_wait_mark(s);
    return 0;
}

void tcp_gpu_sock_fail(struct tcp_sock *s)
{
    gpu_unlink(s);
    tcp_gpu_rx_drop(s);
    struct tcp_tx *t = s->land_head;
    s->land_head = s->land_tail = NULL;
    while (t) {
        struct tcp_tx *next = t->next;
        tcp_gpu_tx_release(t);
        tcp_chunk_complete(s, t, -XFER_ECONN, "connection lost while its data landed");
        t = next;
    }
}

void tcp_gpu_pump(struct tcp_thread *th)
{
    struct tcp_sock *s = th->gpu_head;
    th->gpu_head = NULL;
    for (struct tcp_sock *k = s; k; k = k->gpu_next)
        k->gpu_wait = false;
    while (s) {
        struct tcp_sock *next = s->gpu_next;
        pthread_mutex_lock(&s->iomu);
        if (s->fd >= 0 && land_poll(s))
            tcp_gpu_wait_mark(s);
        if (s->fd >= 0)
            tcp_sock_writable(s);
        if (s->fd >= 0)
            tcp_sock_readable(s);
        pthread_mutex_unlock(&s->iomu);
        s = next;
    }
}

void tcp_gpu_thread_free(struct tcp_thread *th)
{
    for (int d = 0; d < TCP_GPU_MAX_DEV; d++)
        for (int dir = 0; dir < 2; dir++)
            for (int small = 0; small < 2; small++) {
                xfer_gpu_stage_free(th->gst[d][dir][small]);
                th->gst[d][dir][small] = NULL;
            }
}
