/*
 * Engine messages over tcp (docs/notify.md): MSG_REQ carries an engine frame
 * on the first live socket of the connection (so messages to a peer arrive
 * in the order they were sent: two-sided matching is FIFO), the target's progress
 * thread receives it whole into a buffer, hands it to the engine and answers
 * MSG_RESP with the engine's status, in its response order like any request.
 */
#include "tcp.h"

#include <stdlib.h>
#include <string.h>

int tcp_send_msg(struct xfer_conn *c, struct xfer_msg *m)
{
    struct tcp_conn *tc = container_of(c, struct tcp_conn, base);
    if (m->len > XFER_MSG_FRAME_MAX)
        return -XFER_EINVAL;
    struct tcp_tx *t = calloc(1, sizeof(*t));
    if (!t)
        return -XFER_ENOMEM;
    t->msg = m;
    t->op = XFER_WIRE_MSG_REQ;
    t->len = m->len;
    t->payload = (uint8_t *)m->frame;
    t->payload_len = m->len;
    t->gslot = -1;
    t->req_id = __atomic_add_fetch(&tc->tt->next_req, 1, __ATOMIC_RELAXED);
    struct xfer_wire_hdr h = {.version = XFER_PROTO_VERSION,
                              .op = XFER_WIRE_MSG_REQ,
                              .req_id = t->req_id,
                              .length = m->len,
                              .payload = (uint32_t)m->len};
    xfer_wire_encode(&h, t->hdr);
    bool kick[64] = {false};
    if (!tcp_enqueue(tc, t, kick, true)) {
        tcp_tx_free(t);
        return -XFER_ECONN;
    }
    /* The caller holds only conn_lock (msg.c): on an idle socket it sends
     * the frame itself, as a submitter does with data chunks (tcp_post). */
    for (int k = 0; k < tc->n; k++)
        if (kick[k] &&
            !(tc->tt->direct && !tc->socks[k]->target && tcp_sock_send_direct(tc->socks[k])))
            tcp_thread_kick(tc->socks[k]);
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
    s->rx_msg = malloc(s->rh.length ? s->rh.length : 1);
    s->rx_dst = s->rx_msg; /* NULL (no memory): discarded, answered ENOMEM */
    s->rx_region = NULL;
    s->rx_gpu = false;
    s->rx_got = 0;
    s->rx_state = RX_PAYLOAD;
    return 1;
}

void tcp_msg_received(struct tcp_sock *s)
{
    int status = -XFER_ENOMEM;
    if (s->rx_msg)
        status = xfer_engine_msg_recv(s->tt->engine, s->peer_node, s->peer_inc, s->rx_msg,
                                      (size_t)s->rh.length);
    free(s->rx_msg);
    s->rx_msg = NULL;
    s->rx_dst = NULL;
    s->rx_state = RX_HDR;
    tcp_queue_response(s, &s->rh, XFER_WIRE_MSG_RESP, status, NULL, NULL);
}
