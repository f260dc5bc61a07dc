/* Encoding of the tcp data-plane header (layout in wire.h). */
#include "wire.h"
#include "xfer.h"

#include <string.h>

static void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint16_t get16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static uint32_t get32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

void xfer_wire_encode(const struct xfer_wire_hdr *h, uint8_t out[XFER_WIRE_HDR_LEN])
{
    put32(out + 0, XFER_WIRE_MAGIC);
    out[4] = h->version;
    out[5] = h->op;
    put16(out + 6, h->flags);
    put64(out + 8, h->req_id);
    put32(out + 16, h->region_id);
    put32(out + 20, h->gen);
    put64(out + 24, h->offset);
    put64(out + 32, h->length);
    put32(out + 40, (uint32_t)h->status);
    put32(out + 44, h->payload);
}

/* Which ops carry a payload, and of what size, is fixed by the protocol;
 * anything else means the stream is out of sync. */
static int payload_consistent(const struct xfer_wire_hdr *h)
{
    switch (h->op) {
    case XFER_WIRE_WRITE_REQ:
        return h->status == 0 && h->payload == h->length;
    case XFER_WIRE_READ_REQ:
    case XFER_WIRE_WRITE_RESP:
        return h->payload == 0;
    case XFER_WIRE_READ_RESP:
        return h->status == 0 ? h->payload == h->length : h->payload == 0;
    default:
        return 0;
    }
}

int xfer_wire_decode(const uint8_t in[XFER_WIRE_HDR_LEN], uint32_t max_payload,
                     struct xfer_wire_hdr *h)
{
    if (get32(in) != XFER_WIRE_MAGIC)
        return -XFER_EPROTO;
    memset(h, 0, sizeof(*h));
    h->version = in[4];
    h->op = in[5];
    h->flags = get16(in + 6);
    h->req_id = get64(in + 8);
    h->region_id = get32(in + 16);
    h->gen = get32(in + 20);
    h->offset = get64(in + 24);
    h->length = get64(in + 32);
    h->status = (int32_t)get32(in + 40);
    h->payload = get32(in + 44);
    if (h->version != XFER_PROTO_VERSION || h->flags != 0)
        return -XFER_EPROTO;
    if (h->op == 0 || h->op >= XFER_WIRE_OP_MAX)
        return -XFER_EPROTO;
    if (h->status > 0 || h->status <= -XFER_ERR_MAX)
        return -XFER_EPROTO;
    if (h->payload > max_payload || h->length > max_payload)
        return -XFER_EPROTO;
    if (!payload_consistent(h))
        return -XFER_EPROTO;
    return 0;
}
