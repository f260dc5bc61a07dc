/*
 * Data-plane frame header of the tcp transport: fixed size, little-endian,
 * independent of host byte order and struct padding.
 *
 *  off size field
 *    0   4  magic      0x58464552 ("XFER" read as LE bytes 'R','E','F','X')
 *    4   1  version    XFER_PROTO_VERSION
 *    5   1  op         enum xfer_wire_op
 *    6   2  flags      XFER_WIRE_F_SEQ, XFER_WIRE_F_NORESP (MSG_REQ) or 0
 *    8   8  req_id     initiator's chunk id, echoed in the response; with
 *                      XFER_WIRE_F_SEQ its high 32 bits are the batch's
 *                      sequence number (the fence of docs/engine.md)
 *   16   4  region_id  target region
 *   20   4  gen        target region generation
 *   24   8  offset     byte offset in the target region
 *   32   8  length     bytes requested (WRITE_REQ: payload follows)
 *   40   4  status     0 or -XFER_E* (responses)
 *   44   4  payload    bytes of payload following this header
 */
#ifndef XFER_WIRE_H
#define XFER_WIRE_H

#include <endian.h>
#include <stdint.h>
#include <stddef.h>
#include <string.h>

#define XFER_WIRE_MAGIC   0x58464552u
#define XFER_WIRE_HDR_LEN 48

enum xfer_wire_op {
    XFER_WIRE_WRITE_REQ = 1,  /* payload = data to write */
    XFER_WIRE_WRITE_RESP = 2, /* no payload */
    XFER_WIRE_READ_REQ = 3,   /* no payload */
    XFER_WIRE_READ_RESP = 4,  /* payload = data read, when status == 0 */
    XFER_WIRE_MSG_REQ = 5,    /* payload = an engine message frame (msg_wire.h) */
    XFER_WIRE_MSG_RESP = 6,   /* no payload; status = the target engine's answer */
    XFER_WIRE_FENCE = 7,      /* no payload, no response: batch (req_id >> 32) was cancelled */
    XFER_WIRE_OP_MAX
};

#define XFER_WIRE_F_SEQ 1u /* req_id >> 32 is the initiator's batch sequence number */
/* MSG_REQ only: no MSG_RESP wanted (the RTS of a locally completed SEND,
 * XFER_SEND_LOCAL): the target answers nothing, the initiator does not
 * wait for an answer. */
#define XFER_WIRE_F_NORESP 2u

struct xfer_wire_hdr {
    uint8_t version;
    uint8_t op;
    uint16_t flags;
    uint64_t req_id;
    uint32_t region_id;
    uint32_t gen;
    uint64_t offset;
    uint64_t length;
    int32_t status;
    uint32_t payload;
};

/* Little-endian field access, shared with the engine message frame. One
 * unaligned load/store each (memcpy of a converted value; the byte loops
 * they replace cost ~175 instructions per header, 32k headers per KV
 * request). */
static inline void xfer_put16(uint8_t *p, uint16_t v)
{
    v = htole16(v);
    memcpy(p, &v, sizeof(v));
}

static inline void xfer_put32(uint8_t *p, uint32_t v)
{
    v = htole32(v);
    memcpy(p, &v, sizeof(v));
}

static inline void xfer_put64(uint8_t *p, uint64_t v)
{
    v = htole64(v);
    memcpy(p, &v, sizeof(v));
}

static inline uint16_t xfer_get16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, sizeof(v));
    return le16toh(v);
}

static inline uint32_t xfer_get32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof(v));
    return le32toh(v);
}

static inline uint64_t xfer_get64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, sizeof(v));
    return le64toh(v);
}

/* The batch sequence number a frame carries, 0 = none. */
static inline uint32_t xfer_wire_seq(const struct xfer_wire_hdr *h)
{
    return h->flags & XFER_WIRE_F_SEQ ? (uint32_t)(h->req_id >> 32) : 0;
}

void xfer_wire_encode(const struct xfer_wire_hdr *h, uint8_t out[XFER_WIRE_HDR_LEN]);
/* Validates magic, version, op, flags, the payload/op/status agreement and
 * payload <= max_payload; returns 0 or -XFER_EPROTO. */
int xfer_wire_decode(const uint8_t in[XFER_WIRE_HDR_LEN], uint32_t max_payload,
                     struct xfer_wire_hdr *h);

#endif
