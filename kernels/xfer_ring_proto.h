/*
 * The producer side of the request ring (kernels/xfer_ring.h), written once
 * and compiled twice: as device code by kernels/xfer_dev.cuh and as C11 by
 * engine/gpu_ring_host.c (CPU producers, the stand-in for kernels in tests).
 *
 * The includer defines, before including this file:
 *   XR_FN                       qualifiers of every function here
 *   uint64_t xr_ld_sys_u64(uint64_t *p)      acquire load, system scope
 *   int32_t  xr_ld_sys_i32(int32_t *p)       acquire load, system scope
 *   void     xr_st_sys_u64(uint64_t *p, v)   release store, system scope
 *   uint64_t xr_ld_dev_u64(uint64_t *p)      acquire load, producers' scope
 *   uint64_t xr_cas_dev_u64(uint64_t *p, expected, desired)
 *                                            strong CAS, returns the value seen
 *   void     xr_max_dev_u64(uint64_t *p, v)  atomic max, release
 *   void     xr_add_dev_u64(uint64_t *p, v)  atomic add, relaxed
 *   uint64_t xr_now_ns(void)                 a monotonic clock
 *   void     xr_pause(void)                  back off a little in a spin
 * "System scope" words are shared with the proxy (host-mapped memory for a
 * GPU ring); "producers' scope" words (struct xfer_ring_prod) only with the
 * other producers (GPU memory: device scope).
 *
 * Ordering, in short (docs/gpu_initiated.md has the long form):
 *  - a ticket comes from a CAS on prod->head, taken only when
 *    head + n <= tail + slots, with tail read (acquire) from hdr->tail or
 *    from prod->tail_seen (a copy made with release by a producer that
 *    acquired it): the proxy finished reading a slot before it released the
 *    tail that frees it, so a producer never overwrites a slot being read;
 *  - the request's fields are plain stores, then seq = ticket + 1 is stored
 *    with release at system scope: the proxy acquires seq, then reads the
 *    fields. The caller's own earlier writes (the data to send) are ordered
 *    by the same release; other threads' data must be made visible to the
 *    caller first (__syncthreads / __syncwarp).
 *  - the proxy stores a counter's failed/error, then releases done; a wait
 *    acquires done before reading them.
 * Polling: a waiting producer (ring full, counter not reached) reads proxy
 * memory only when it wins the ring's polling token (prod->next_poll_ns, at
 * most one winner per poll_ns); the others spin on GPU memory. Hundreds of
 * threads each reading host memory every microsecond would compete with the
 * GPU's own reads of system memory (its command fetch, the transports'
 * copies); docs/gpu_initiated.md says what the H100 runs did and did not show.
 */
#ifndef XFER_RING_PROTO_H
#define XFER_RING_PROTO_H

#include "xfer_ring.h"

/* The error a producer gets from a ring that is being torn down. */
XR_FN int xfer_ring_stopped_error(const struct xfer_ring_dev *r)
{
    int32_t err = xr_ld_sys_i32(&r->hdr->error);
    return err < 0 ? err : -XFER_ECANCELED;
}

/* The ring's error word: the first failure of any request, 0 if none. */
XR_FN int xfer_ring_error(const struct xfer_ring_dev *r)
{
    return xr_ld_sys_i32(&r->hdr->error);
}

XR_FN uint64_t xfer_ring_timeout(const struct xfer_ring_dev *r, uint64_t timeout_ns)
{
    return timeout_ns == XFER_RING_TIMEOUT_DEFAULT ? r->timeout_ns : timeout_ns;
}

/* Whether this thread may read proxy memory now: true for at most one
 * caller per poll_ns on the whole ring (always with poll_ns 0). */
XR_FN int xfer_ring_poll_turn(const struct xfer_ring_dev *r)
{
    if (r->poll_ns == 0)
        return 1;
    uint64_t now = xr_now_ns(), next = xr_ld_dev_u64(&r->prod->next_poll_ns);
    return now >= next && xr_cas_dev_u64(&r->prod->next_poll_ns, next, now + r->poll_ns) == next;
}

/* One round of waiting for room: 0 to try again, or why to give up. turn:
 * this thread holds the polling token. */
XR_FN int xfer_ring_full_wait(const struct xfer_ring_dev *r, uint64_t timeout_ns, int turn,
                              uint64_t *t0, int *waited)
{
    if (!*waited) {
        xr_add_dev_u64(&r->prod->full_waits, 1);
        *waited = 1;
        *t0 = xr_now_ns();
    }
    if (turn && xr_ld_sys_i32(&r->hdr->state) >= XFER_RING_STOPPING)
        return xfer_ring_stopped_error(r);
    if (timeout_ns == 0)
        return -XFER_EBUSY;
    if (xr_now_ns() - *t0 >= timeout_ns)
        return -XFER_ETIMEDOUT;
    xr_pause();
    return 0;
}

/* Reserves n consecutive tickets; the first in *first. Waits while the ring
 * is full, up to timeout_ns (0: no wait, -XFER_EBUSY; XFER_RING_TIMEOUT_DEFAULT:
 * the ring's bound, then -XFER_ETIMEDOUT), or until the ring stops. Nothing
 * is reserved when it fails. */
XR_FN int xfer_ring_reserve(const struct xfer_ring_dev *r, uint32_t n, uint64_t timeout_ns,
                            uint64_t *first)
{
    const int64_t size = (int64_t)r->mask + 1;
    if (n == 0 || (int64_t)n > size)
        return -XFER_EINVAL;
    timeout_ns = xfer_ring_timeout(r, timeout_ns);
    struct xfer_ring_prod *pr = r->prod;
    uint64_t h = xr_ld_dev_u64(&pr->head), t0 = 0;
    int waited = 0;
    for (;;) {
        uint64_t t = xr_ld_dev_u64(&pr->tail_seen);
        /* signed: the tail may have passed a stale h; the CAS then fails */
        if ((int64_t)(h + n - t) > size) {
            int turn = xfer_ring_poll_turn(r);
            if (turn) {
                t = xr_ld_sys_u64(&r->hdr->tail);
                xr_max_dev_u64(&pr->tail_seen, t);
            }
            if ((int64_t)(h + n - t) > size) {
                int rc = xfer_ring_full_wait(r, timeout_ns, turn, &t0, &waited);
                if (rc < 0)
                    return rc;
                h = xr_ld_dev_u64(&pr->head);
                continue;
            }
        }
        uint64_t seen = xr_cas_dev_u64(&pr->head, h, h + n);
        if (seen == h) {
            *first = h;
            return 0;
        }
        h = seen;
    }
}

/* Writes request req (its seq is ignored) into the slot of ticket, then
 * publishes it. */
XR_FN void xfer_ring_publish(const struct xfer_ring_dev *r, uint64_t ticket,
                             const struct xfer_ring_slot *req)
{
    struct xfer_ring_slot *s = &r->slots[ticket & r->mask];
    s->op = req->op;
    s->counter = req->counter;
    s->local = req->local;
    s->remote = req->remote;
    s->local_off = req->local_off;
    s->remote_off = req->remote_off;
    s->len = req->len;
    s->tag = req->tag;
    xr_st_sys_u64(&s->seq, ticket + 1);
}

/* One request: reserve, write, publish. 0 or the reservation's error. */
XR_FN int xfer_ring_post(const struct xfer_ring_dev *r, const struct xfer_ring_slot *req,
                         uint64_t timeout_ns)
{
    uint64_t ticket;
    int rc = xfer_ring_reserve(r, 1, timeout_ns, &ticket);
    if (rc == 0)
        xfer_ring_publish(r, ticket, req);
    return rc;
}

/* Requests naming counter c that finished so far (ok or failed). */
XR_FN uint64_t xfer_ring_counter_done(const struct xfer_ring_dev *r, uint32_t c)
{
    return c < r->n_counters ? xr_ld_sys_u64(&r->counters[c].done) : 0;
}

/* Waits until counter c reached target. 0 when it did and none of its
 * requests failed; the counter's last error when some did; -XFER_EINPROGRESS
 * (timeout_ns 0: one look) or -XFER_ETIMEDOUT when it has not; the ring's
 * error when the ring stopped first; -XFER_EINVAL for a bad counter. */
XR_FN int xfer_ring_wait(const struct xfer_ring_dev *r, uint32_t c, uint64_t target,
                         uint64_t timeout_ns)
{
    if (c >= r->n_counters)
        return -XFER_EINVAL;
    timeout_ns = xfer_ring_timeout(r, timeout_ns);
    struct xfer_ring_counter *ctr = &r->counters[c];
    uint64_t t0 = 0;
    for (int round = 0;; round++) {
        if (round == 0 || xfer_ring_poll_turn(r)) { /* the first look is free */
            /* state first: the proxy bumps every counter before it says STOPPED */
            int32_t state = xr_ld_sys_i32(&r->hdr->state);
            if (xr_ld_sys_u64(&ctr->done) >= target) {
                if (xr_ld_sys_u64(&ctr->failed) == 0)
                    return 0;
                int32_t err = xr_ld_sys_i32(&ctr->error);
                return err < 0 ? err : -XFER_EIO;
            }
            if (state == XFER_RING_STOPPED)
                return xfer_ring_stopped_error(r);
        }
        if (timeout_ns == 0)
            return -XFER_EINPROGRESS;
        uint64_t now = xr_now_ns();
        if (round == 0)
            t0 = now;
        else if (now - t0 >= timeout_ns)
            return -XFER_ETIMEDOUT;
        xr_pause();
    }
}

#endif /* XFER_RING_PROTO_H */
