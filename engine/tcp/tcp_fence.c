/*
 * Per-batch fences of the tcp transport (issue 18 item 7; docs/engine.md,
 * "Cancel and retry").
 *
 * A cancelled or timed-out WRITE may still have frames on the wire, in both
 * kernels' buffers, or half sent; a retry of the same range on another
 * socket must never be overwritten by them. Only the target sees the order
 * in which frames of different sockets are applied, so it applies the fence:
 *
 *  - initiator (tcp_fence, before the batch's items end): frames of b that
 *    are half sent get the rest of their payload copied out of the user's
 *    memory (so they finish with real data, never zeros, and no byte of the
 *    user's memory is read after cancel returns); then a FENCE frame naming
 *    b's sequence number goes on every live socket of the peer, behind
 *    everything of b still to be sent there. Recent fences are sent again
 *    first on every new connection (a thawed target may still hold frames
 *    of b on sockets that died before the fence could follow them).
 *  - target: a FENCE records (initiator incarnation, sequence) holding the
 *    fence_mu of every progress thread; every recv of WRITE payload into a
 *    region holds its own thread's fence_mu and first checks its batch
 *    against the fences (only when one was added since it last looked). A
 *    fenced batch's payload is discarded from then on and its frames are
 *    answered -XFER_ECANCELED. (One rwlock for all threads was shared by
 *    every payload recv of every thread: a cache line passed between them
 *    per recv call; fences are rare, receives are not.)
 *
 * So once a socket's FENCE has been processed, no byte of b is written into
 * a region any more, on any socket: anything the initiator sends on that
 * socket after cancel returned (a retry) lands after every byte of b.
 */
#include "tcp.h"

#include <stdlib.h>
#include <string.h>

static unsigned bucket_of(uint64_t inc, uint32_t seq)
{
    return (unsigned)((inc ^ seq) * 0x9e3779b97f4a7c15ull >> 40) & (TCP_FENCES - 1);
}

void tcp_fence_init(struct tcp_transport *tt)
{
    for (unsigned i = 0; i < TCP_FENCES; i++)
        tt->fence_head[i] = -1;
    pthread_mutex_init(&tt->sent_mu, NULL);
}

void tcp_fence_fini(struct tcp_transport *tt)
{
    pthread_mutex_destroy(&tt->sent_mu);
}

/* One thread's fence_mu held (read) or all of them (write). */
static bool fenced_locked(struct tcp_transport *tt, uint64_t inc, uint32_t seq)
{
    for (int i = tt->fence_head[bucket_of(inc, seq)]; i >= 0; i = tt->fences[i].next)
        if (tt->fences[i].seq == seq && tt->fences[i].inc == inc)
            return true;
    return false;
}

/* Target: a FENCE arrived. Waits (every thread's fence_mu, in order) for
 * payload receives in progress on other threads, so none of b lands after
 * this returns. */
static void fence_record(struct tcp_transport *tt, uint64_t inc, uint32_t seq)
{
    for (int i = 0; i < tt->n_threads; i++)
        pthread_mutex_lock(&tt->threads[i].fence_mu);
    if (!fenced_locked(tt, inc, seq)) { /* one per socket arrives: keep one */
        int slot = (int)(tt->fence_n % TCP_FENCES);
        struct tcp_fence *f = &tt->fences[slot];
        if (tt->fence_n >= TCP_FENCES) { /* the oldest goes */
            int *pp = &tt->fence_head[bucket_of(f->inc, f->seq)];
            while (*pp != slot)
                pp = &tt->fences[*pp].next;
            *pp = f->next;
        }
        unsigned bk = bucket_of(inc, seq);
        f->inc = inc;
        f->seq = seq;
        f->next = tt->fence_head[bk];
        tt->fence_head[bk] = slot;
        tt->fence_n++;
        tt->fence_gen++;
    }
    for (int i = tt->n_threads - 1; i >= 0; i--)
        pthread_mutex_unlock(&tt->threads[i].fence_mu);
}

void tcp_fence_frame_in(struct tcp_sock *s)
{
    fence_record(s->tt, s->peer_inc, xfer_wire_seq(&s->rh));
}

bool tcp_fence_enter(struct tcp_sock *s)
{
    struct tcp_transport *tt = s->tt;
    pthread_mutex_lock(&s->th->fence_mu);
    if (tt->fence_gen == s->rx_fgen)
        return true;
    s->rx_fgen = tt->fence_gen;
    if (!fenced_locked(tt, s->peer_inc, s->rx_seq))
        return true;
    pthread_mutex_unlock(&s->th->fence_mu);
    return false;
}

void tcp_fence_leave(struct tcp_sock *s)
{
    pthread_mutex_unlock(&s->th->fence_mu);
}

/* ---- initiator ------------------------------------------------------------------ */

static struct tcp_tx *fence_tx(uint32_t seq)
{
    struct tcp_tx *t = calloc(1, sizeof(*t));
    if (!t)
        return NULL;
    t->op = XFER_WIRE_FENCE;
    t->gslot = -1;
    struct xfer_wire_hdr h = {.version = XFER_PROTO_VERSION,
                              .op = XFER_WIRE_FENCE,
                              .flags = XFER_WIRE_F_SEQ,
                              .req_id = (uint64_t)seq << 32};
    xfer_wire_encode(&h, t->hdr);
    return t;
}

/* Appends a FENCE for seq to s's queue; false if s is dead (or no memory). */
static bool queue_fence(struct tcp_sock *s, uint32_t seq)
{
    struct tcp_tx *t = fence_tx(seq);
    if (!t) {
        xfer_warn("tcp: %s: no memory for a fence frame", s->name);
        return false;
    }
    bool ok = tcp_sock_append(s, t);
    if (!ok)
        tcp_tx_free(t);
    return ok;
}

/* s's iomu held: no frame of s is being sent. Frames of b already begun
 * get the unsent rest of their payload copied, so that they finish without
 * the user's memory (which is off limits once cancel returns). */
static void detach_begun(struct tcp_sock *s, xfer_batch *b)
{
    for (struct tcp_tx *t = s->tx_head; t; t = t->next) {
        if (t->b != b || t->op != XFER_WIRE_WRITE_REQ || t->hdr_sent == 0 || t->pad ||
            t->detached || t->payload_sent == t->payload_len)
            continue;
        if (t->gpu) { /* sent from a staging slot, which stays the transport's */
            t->detached = true;
            continue;
        }
        uint8_t *copy = malloc(t->payload_len);
        if (!copy) { /* the rest then goes out as zeros, as before */
            xfer_warn("tcp: %s: no memory to detach a cancelled frame", s->name);
            continue;
        }
        memcpy(copy + t->payload_sent, t->payload + t->payload_sent,
               t->payload_len - t->payload_sent);
        t->own = copy;
        t->payload = copy;
        t->file = false; /* the rest from the copy */
        t->detached = true;
    }
}

/* Initiator: remembers seq to be sent again on new connections. */
static void remember(struct tcp_transport *tt, uint32_t seq)
{
    pthread_mutex_lock(&tt->sent_mu);
    tt->sent[tt->sent_n++ % TCP_FENCES_RESEND] = seq;
    pthread_mutex_unlock(&tt->sent_mu);
}

void tcp_fence(struct xfer_conn *c, xfer_batch *b)
{
    struct tcp_conn *tc = container_of(c, struct tcp_conn, base);
    uint32_t seq = xfer_batch_seq(b);
    remember(tc->tt, seq);
    for (int k = 0; k < tc->n; k++) {
        struct tcp_sock *s = tc->socks[k];
        if (__atomic_load_n(&s->dead, __ATOMIC_RELAXED))
            continue;
        pthread_mutex_lock(&s->iomu);
        detach_begun(s, b);
        pthread_mutex_unlock(&s->iomu);
        if (queue_fence(s, seq))
            tcp_thread_kick(s);
    }
}

void tcp_fence_resend(struct tcp_transport *tt, struct tcp_sock *s)
{
    pthread_mutex_lock(&tt->sent_mu);
    unsigned n = tt->sent_n < TCP_FENCES_RESEND ? tt->sent_n : TCP_FENCES_RESEND;
    uint32_t seqs[TCP_FENCES_RESEND];
    for (unsigned i = 0; i < n; i++)
        seqs[i] = tt->sent[(tt->sent_n - n + i) % TCP_FENCES_RESEND];
    pthread_mutex_unlock(&tt->sent_mu);
    for (unsigned i = 0; i < n; i++)
        queue_fence(s, seqs[i]);
}
