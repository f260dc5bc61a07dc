/*
 * Engine messages over tcp (docs/notify.md): MSG_REQ carries an engine frame
 * on the first live socket of the connection (so messages to a peer arrive
 * in the order they were sent: two-sided matching is FIFO), the target's progress
 * thread receives it whole into a buffer, hands it to the engine and answers
 * MSG_RESP with the engine's status, in its response order like any request.
 */
#include "tcp.h"

#include "blk_cache.h"

#include <stdlib.h>
#include <string.h>

/* A MSG_REQ's tcp_tx is built by the sending thread and freed by whoever
 * reads the answer (often the socket's progress thread); a received frame
 * of up to RX_BLK bytes is read into a cached block too (blk_cache.h:
 * no malloc per message in steady state). */
#define RX_BLK 1024
static struct xfer_blk_cache tx_cache = {.size = sizeof(struct tcp_tx), .tl = BLK_TL_TX};
static struct xfer_blk_cache rx_cache = {.size = RX_BLK, .tl = BLK_TL_RX};

void tcp_msg_tx_put(struct tcp_tx *t)
{
    xfer_blk_put(&tx_cache, t);
}

/* t's wire header, for its message's frame as it is now. */
static void msg_hdr(struct tcp_tx *t, uint32_t frames)
{
    struct xfer_wire_hdr h = {.version = XFER_PROTO_VERSION,
                              .op = XFER_WIRE_MSG_REQ,
                              .flags = (uint16_t)((t->req_id >> 32 ? XFER_WIRE_F_SEQ : 0) |
                                                  (t->noresp ? XFER_WIRE_F_NORESP : 0)),
                              .req_id = t->req_id,
                              .region_id = frames,
                              .length = t->len,
                              .payload = (uint32_t)t->len};
    xfer_wire_encode(&h, t->hdr);
}

/* The MSG_REQ of m; behind a batch's frames: seq (else 0) and how many. */
static struct tcp_tx *msg_tx(struct tcp_conn *tc, struct xfer_msg *m, uint32_t seq, uint32_t frames)
{
    struct tcp_tx *t = xfer_blk_get(&tx_cache);
    if (!t)
        return NULL;
    memset(t, 0, sizeof(*t));
    t->cached = true;
    t->msg = m;
    t->op = XFER_WIRE_MSG_REQ;
    t->len = m->len;
    t->payload = (uint8_t *)m->frame;
    t->payload_len = m->len;
    t->gslot = -1;
    t->req_id = __atomic_add_fetch(&tc->tt->next_req, 1, __ATOMIC_RELAXED);
    if (seq)
        t->req_id = (uint64_t)seq << 32 | (t->req_id & 0xffffffffu);
    t->noresp = m->noresp;
    msg_hdr(t, frames);
    return t;
}

/* ---- a FIN rides in the next RTS --------------------------------------------------
 *
 * A held FIN (tcp_ride_hold) goes out with this side's next frame, which
 * in a blocking ping-pong is the RTS of its next SEND to the same peer:
 * two frames in one sendmsg, each read, decoded and dispatched on its own
 * at the peer. Folded, the RTS carries the FIN's 24 bytes (XFER_MSG_F_FIN)
 * and the FIN's frame is not sent: ~500 instructions less per FIN at the
 * receiver, and 96 bytes less on the wire (its 72-byte frame and 48-byte
 * wire header, less the 24 the RTS grows; docs/perf.md, step 19). */

/* May a's message go into b's? Both engine messages of one connection,
 * neither started nor orphaned, a being a held FIN that wants no answer (the
 * engine decides the rest: xfer_msg_fold). */
static bool foldable(const struct tcp_tx *a, const struct tcp_tx *b)
{
    return a->msg && b->msg && a->op == XFER_WIRE_MSG_REQ && b->op == XFER_WIRE_MSG_REQ &&
           a->msg->ride && a->noresp && !a->hdr_sent && !b->hdr_sent && !a->orphan && !b->orphan &&
           a->back_tc == b->back_tc && !(b->req_id >> 32);
}

void tcp_msg_fold(struct tcp_sock *s, uint32_t held)
{
    struct tcp_tx *prev = NULL;
    /* held frames (answers, FINs) are at the head: look no further */
    for (struct tcp_tx *t = s->tx_head; t && t->next && held-- > 0; prev = t, t = t->next) {
        struct tcp_tx *n = t->next;
        if (!foldable(t, n) || !xfer_msg_fold(n->msg, t->msg))
            continue;
        uint64_t grown = n->msg->len - n->len;
        n->len = n->msg->len;
        n->payload_len = n->len;
        msg_hdr(n, 0);
        __atomic_add_fetch(&s->load, grown, __ATOMIC_RELAXED); /* (taken off at its end) */
        if (prev)
            prev->next = n;
        else
            s->tx_head = n;
        s->tx_count--;
        tcp_chunk_complete(s, t, 0, NULL); /* written, as far as its sender is told */
        if (!s->folded) {
            s->folded = true;
            xfer_debug("tcp: %s: FINs go inside the next RTS", s->name);
        }
        return; /* (one FIN per RTS; the usual held list is one FIN) */
    }
}

int tcp_send_msg(struct xfer_conn *c, struct xfer_msg *m)
{
    struct tcp_conn *tc = container_of(c, struct tcp_conn, base);
    if (m->len > XFER_MSG_FRAME_MAX)
        return -XFER_EINVAL;
    xfer_batch *wait_b = m->wait_b; /* m may be gone once the frame is out */
    bool ride = m->ride;
    struct tcp_tx *t = msg_tx(tc, m, 0, 0);
    if (!t)
        return -XFER_ENOMEM;
    if (tcp_back_send(tc, t) == 0)
        return 0; /* back on the peer's connection (tcp_back.c) */
    bool kick[64] = {false};
    if (!tcp_enqueue(tc, t, kick, true)) {
        tcp_tx_free(t);
        return -XFER_ECONN;
    }
    /* The caller holds only conn_lock (msg.c): on an idle socket it sends
     * the frame itself, as a submitter does with data chunks (tcp_post). */
    for (int k = 0; k < tc->n; k++) {
        if (!kick[k])
            continue;
        tcp_out_note(tc->socks[k]); /* before the frame goes: its answer comes there */
        if (!(tc->tt->direct && !tc->socks[k]->target && tcp_sock_send_direct(tc->socks[k], ride)))
            tcp_thread_kick(tc->socks[k]);
        if (wait_b) /* its answer ends the SEND: the waiter may read it itself */
            xfer_batch_wait_hint(wait_b, c, tc->socks[k]);
    }
    return 0;
}

int tcp_msg_header(struct tcp_sock *s)
{
    if (s->rh.length > XFER_MSG_FRAME_MAX) {
        /* The frame is bounded by the protocol; a longer one means a broken
         * or hostile peer: same treatment as any malformed frame. */
        tcp_sock_fail(s, -XFER_EPROTO, "message frame over XFER_MSG_FRAME_MAX");
        return -1;
    }
    tcp_in_note(s); /* a waiter for this peer's messages reads s (tcp_wait.c) */
    /* (s->rx_msg is freed with free() if the socket fails meanwhile:
     * correct for a cached block too) */
    s->rx_msg = s->rh.length <= RX_BLK ? xfer_blk_get(&rx_cache) : malloc(s->rh.length);
    s->rx_dst = s->rx_msg; /* NULL (no memory): discarded, answered ENOMEM */
    s->rx_region = NULL;
    s->rx_gpu = false;
    s->rx_got = 0;
    s->rx_state = RX_PAYLOAD;
    return 1;
}

/* ---- behind the data (docs/notify.md, "Behind the data") --------------------------
 *
 * A notification bound to items that all went out on one socket follows
 * their frames on that socket at once, instead of leaving after their
 * responses came back (a round trip and the message thread later). Its
 * MSG_REQ names the batch (F_SEQ) and how many WRITE frames of it precede it
 * on the socket (region_id). The target's progress thread takes a socket's
 * frames in order, so when the MSG_REQ arrives those frames were handled;
 * it delivers the notification only if exactly that many frames of the
 * batch, each landed in host memory, came just before on this socket. Else
 * (one refused or fenced, a frame never sent because the batch was
 * cancelled, frames of another batch in between) it answers
 * XFER_MSG_NOT_BEHIND without delivering, and the engine sends the
 * notification the fenced way, naming the failed items. */

void tcp_msg_behind(struct tcp_conn *tc, xfer_batch *b, struct tcp_sock *s, const size_t *idx,
                    size_t n, uint32_t frames)
{
    struct xfer_msg *m = xfer_batch_note_behind(b, tc->base.peer, idx, n);
    if (!m)
        return;
    struct tcp_tx *t =
        m->len <= XFER_MSG_FRAME_MAX ? msg_tx(tc, m, xfer_batch_seq(b), frames) : NULL;
    if (t && tcp_sock_append(s, t))
        return; /* the caller sends or kicks s */
    tcp_tx_free(t);
    xfer_msg_done(m, XFER_MSG_NOT_BEHIND, NULL);
}

void tcp_msg_landed(struct tcp_sock *s, uint32_t seq, bool landed)
{
    if (seq != s->landed_seq) {
        s->landed_seq = seq;
        s->landed_n = 0;
        s->landed_bad = false;
    }
    s->landed_n++;
    s->landed_bad |= !landed;
}

/* Target: may the MSG_REQ in s->rh be delivered now? */
static bool behind_ok(const struct tcp_sock *s)
{
    uint32_t seq = xfer_wire_seq(&s->rh);
    return !seq || (seq == s->landed_seq && s->landed_n == s->rh.region_id && !s->landed_bad);
}

void tcp_msg_received(struct tcp_sock *s)
{
    int status = -XFER_ENOMEM;
    if (!behind_ok(s))
        status = XFER_MSG_NOT_BEHIND;
    else if (s->rx_msg)
        status = xfer_engine_msg_recv(s->tt->engine, s->peer_node, s->peer_inc, s->rx_msg,
                                      (size_t)s->rh.length);
    if (s->rh.length <= RX_BLK)
        xfer_blk_put(&rx_cache, s->rx_msg);
    else
        free(s->rx_msg);
    s->rx_msg = NULL;
    s->rx_dst = NULL;
    s->rx_state = RX_HDR;
    if (s->rh.flags & XFER_WIRE_F_NORESP)
        return; /* its sender completed it: no answer */
    tcp_queue_response(s, &s->rh, XFER_WIRE_MSG_RESP, status, NULL, NULL);
    s->answers++; /* sent when the read ends, or held (tcp_back.c) */
}
