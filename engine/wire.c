/* Encoding of the tcp data-plane header (layout in wire.h). */
#include "wire.h"
#include "transport.h" /* XFER_MSG_DELIVERED */
#include "xfer.h"

#include <string.h>

void xfer_wire_encode(const struct xfer_wire_hdr *h, uint8_t out[XFER_WIRE_HDR_LEN])
{
    xfer_put32(out + 0, XFER_WIRE_MAGIC);
    out[4] = h->version;
    out[5] = h->op;
    xfer_put16(out + 6, h->flags);
    xfer_put64(out + 8, h->req_id);
    xfer_put32(out + 16, h->region_id);
    xfer_put32(out + 20, h->gen);
    xfer_put64(out + 24, h->offset);
    xfer_put64(out + 32, h->length);
    xfer_put32(out + 40, (uint32_t)h->status);
    xfer_put32(out + 44, h->payload);
}

/* Which ops carry a payload, and of what size, is fixed by the protocol;
 * anything else means the stream is out of sync. */
static int payload_consistent(const struct xfer_wire_hdr *h)
{
    switch (h->op) {
    case XFER_WIRE_WRITE_REQ:
    case XFER_WIRE_MSG_REQ:
        return h->status == 0 && h->payload == h->length;
    case XFER_WIRE_READ_REQ:
    case XFER_WIRE_WRITE_RESP:
    case XFER_WIRE_MSG_RESP:
        return h->payload == 0;
    case XFER_WIRE_READ_RESP:
        return h->status == 0 ? h->payload == h->length : h->payload == 0;
    case XFER_WIRE_FENCE:
        return h->status == 0 && h->payload == 0 && h->length == 0 && xfer_wire_seq(h) != 0;
    default:
        return 0;
    }
}

int xfer_wire_decode(const uint8_t in[XFER_WIRE_HDR_LEN], uint32_t max_payload,
                     struct xfer_wire_hdr *h)
{
    if (xfer_get32(in) != XFER_WIRE_MAGIC)
        return -XFER_EPROTO;
    memset(h, 0, sizeof(*h));
    h->version = in[4];
    h->op = in[5];
    h->flags = xfer_get16(in + 6);
    h->req_id = xfer_get64(in + 8);
    h->region_id = xfer_get32(in + 16);
    h->gen = xfer_get32(in + 20);
    h->offset = xfer_get64(in + 24);
    h->length = xfer_get64(in + 32);
    h->status = (int32_t)xfer_get32(in + 40);
    h->payload = xfer_get32(in + 44);
    if (h->version != XFER_PROTO_VERSION || (h->flags & ~(XFER_WIRE_F_SEQ | XFER_WIRE_F_NORESP)))
        return -XFER_EPROTO;
    if ((h->flags & XFER_WIRE_F_NORESP) && h->op != XFER_WIRE_MSG_REQ)
        return -XFER_EPROTO;
    if (h->op == 0 || h->op >= XFER_WIRE_OP_MAX)
        return -XFER_EPROTO;
    /* positive statuses: a message's answer "delivered" or "not behind" */
    if ((h->status > 0 && !(h->op == XFER_WIRE_MSG_RESP && h->status <= XFER_MSG_NOT_BEHIND)) ||
        h->status <= -XFER_ERR_MAX)
        return -XFER_EPROTO;
    if (h->payload > max_payload || h->length > max_payload)
        return -XFER_EPROTO;
    if (!payload_consistent(h))
        return -XFER_EPROTO;
    return 0;
}
