/*
 * Engine messages over tcpx (docs/notify.md, docs/tcpx.md "Messages"):
 * notifications and the frames of two-sided SEND/RECV travel on the link's
 * authenticated TCP control socket, not through the plugin. A message is a
 * MSG_REQ header (engine/wire.h, length = frame bytes) followed by the
 * frame; the target's progress thread reads it whole, hands it to the
 * engine and answers MSG_RESP with the engine's status. Why the control
 * socket: the plugin's comms match receives to sends in post order and
 * both sides post in the order of the control frames, so a message in the
 * plugin stream would need the target to post a receive of a size it does
 * not know yet (one more round trip); frames are small (at most
 * XFER_MSG_FRAME_MAX) and the control socket already orders everything of
 * the link. A message goes out after the WRITE requests queued before it
 * on the link and is answered whatever their state: the engine's fence
 * (items end only after their WRITE_RESP) is what puts a bound
 * notification after its data.
 */
#include "tcpx.h"
#include "xfer_io.h"

#include <stdlib.h>
#include <string.h>

/* One message of an initiator link: queued (qmu), then sent (owner). */
struct tcpx_msg {
    struct tcpx_msg *next;
    struct xfer_msg *m;
    uint64_t req_id;
};

int tcpx_send_msg(struct xfer_conn *xc, struct xfer_msg *m)
{
    struct tcpx_link *l = container_of(xc, struct tcpx_conn, base)->link;
    if (m->len > XFER_MSG_FRAME_MAX)
        return -XFER_EINVAL;
    struct tcpx_msg *x = calloc(1, sizeof(*x));
    if (!x)
        return -XFER_ENOMEM;
    x->m = m;
    x->req_id = __atomic_add_fetch(&l->tt->next_req, 1, __ATOMIC_RELAXED);
    pthread_mutex_lock(&l->qmu);
    bool dead = __atomic_load_n(&l->dead, __ATOMIC_RELAXED);
    if (!dead) {
        if (l->mq_tail)
            l->mq_tail->next = x;
        else
            l->mq_head = x;
        l->mq_tail = x;
        __atomic_add_fetch(&l->load, 1, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&l->qmu);
    if (dead) {
        free(x);
        return -XFER_ECONN; /* not sent, no completion */
    }
    tcpx_kick(l->tt);
    return 0;
}

/* Owner: queued messages go on the control socket, in order. */
bool tcpx_msg_start(struct tcpx_link *l)
{
    pthread_mutex_lock(&l->qmu);
    struct tcpx_msg *x = l->mq_head;
    l->mq_head = l->mq_tail = NULL;
    pthread_mutex_unlock(&l->qmu);
    bool moved = x != NULL;
    while (x) {
        struct tcpx_msg *next = x->next;
        struct xfer_wire_hdr h = {.version = XFER_PROTO_VERSION,
                                  .op = XFER_WIRE_MSG_REQ,
                                  .req_id = x->req_id,
                                  .length = x->m->len,
                                  .payload = (uint32_t)x->m->len};
        x->next = l->msgs;
        l->msgs = x;
        l->n_msgs++;
        tcpx_ctrl_queue(l, &h, x->m->frame, x->m->len);
        x = next;
    }
    return moved;
}

static void msg_done(struct tcpx_link *l, struct tcpx_msg *x, int status, const char *why)
{
    __atomic_sub_fetch(&l->load, 1, __ATOMIC_RELAXED);
    xfer_msg_done(x->m, status, why);
    free(x);
}

/* Initiator: MSG_RESP for a message in flight. */
void tcpx_msg_response(struct tcpx_link *l, const struct xfer_wire_hdr *h)
{
    for (struct tcpx_msg **pp = &l->msgs; *pp; pp = &(*pp)->next) {
        struct tcpx_msg *x = *pp;
        if (x->req_id != h->req_id)
            continue;
        *pp = x->next;
        l->n_msgs--;
        msg_done(l, x, h->status, NULL);
        return;
    }
    tcpx_link_fail(l, -XFER_EPROTO, "message response matches no message in flight");
}

/* Target: a MSG_REQ header; its frame follows on the control socket. */
void tcpx_msg_request(struct tcpx_link *l, const struct xfer_wire_hdr *h)
{
    if (h->length > XFER_MSG_FRAME_MAX || h->payload != h->length) {
        /* bounded by the protocol: a longer one is a broken or hostile peer */
        tcpx_link_fail(l, -XFER_EPROTO, "message frame over XFER_MSG_FRAME_MAX");
        return;
    }
    l->rx_msg_h = *h;
    l->rx_msg = malloc(h->length ? h->length : 1);
    l->rx_msg_have = 0;
    if (!l->rx_msg)
        tcpx_link_fail(l, -XFER_ENOMEM, "out of memory for a message frame");
}

/* Target: the frame of the current MSG_REQ is in: to the engine, answered. */
void tcpx_msg_received(struct tcpx_link *l)
{
    struct xfer_wire_hdr h = l->rx_msg_h;
    int status =
        xfer_engine_msg_recv(l->tt->engine, l->peer_node, l->peer_inc, l->rx_msg, (size_t)h.length);
    free(l->rx_msg);
    l->rx_msg = NULL;
    h.op = XFER_WIRE_MSG_RESP;
    h.status = status;
    h.length = h.payload = 0;
    tcpx_ctrl_queue(l, &h, NULL, 0);
}

/* The link failed or goes: every message ends -XFER_ECONN ("may or may not
 * have arrived": those sent may have been queued at the target). */
void tcpx_msg_fail_all(struct tcpx_link *l, const char *why)
{
    pthread_mutex_lock(&l->qmu);
    struct tcpx_msg *q = l->mq_head;
    l->mq_head = l->mq_tail = NULL;
    pthread_mutex_unlock(&l->qmu);
    while (q) {
        struct tcpx_msg *next = q->next;
        msg_done(l, q, -XFER_ECONN, why);
        q = next;
    }
    while (l->msgs) {
        struct tcpx_msg *x = l->msgs;
        l->msgs = x->next;
        l->n_msgs--;
        msg_done(l, x, -XFER_ECONN, why);
    }
    free(l->rx_msg);
    l->rx_msg = NULL;
}
