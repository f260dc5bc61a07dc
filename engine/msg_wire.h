/*
 * Engine message frame (notifications; docs/notify.md): what the engine
 * hands a transport's send_msg and gets back from xfer_engine_msg_recv.
 * Little-endian, independent of struct padding:
 *
 *  off size field
 *    0   4  magic     0x47534d58 ("XMSG" as LE bytes)
 *    4   1  version   XFER_MSG_VERSION
 *    5   1  kind      enum xfer_msg_kind
 *    6   2  flags     XFER_MSG_F_*
 *    8   8  seq       sender's message number
 *   16   4  status    0 or the first failed item's code
 *   20   4  n_items   items of the batch addressed to the target
 *   24   4  n_failed  failed items (total)
 *   28   4  n_listed  (index u32, status i32) pairs following the header
 *   32   4  msg_len   message bytes following the pairs
 *   36  12  reserved  0
 */
#ifndef XFER_MSG_WIRE_H
#define XFER_MSG_WIRE_H

#include "xfer.h"

#include <stddef.h>
#include <stdint.h>

#define XFER_MSG_MAGIC   0x47534d58u
#define XFER_MSG_VERSION 1u
#define XFER_MSG_HDR_LEN 48u

enum xfer_msg_kind {
    XFER_MSG_NOTIFY = 1, /* a notification (message bytes follow) */
    XFER_MSG_RTS = 2,    /* two-sided: "read my message" (body: xfer_msg_rts) */
    XFER_MSG_FIN = 3,    /* two-sided: the receiver is done (body: xfer_msg_fin) */
    XFER_MSG_KIND_MAX
};

#define XFER_MSG_F_BOUND 1u /* NOTIFY: bound to a batch */
#define XFER_MSG_F_EAGER 2u /* RTS: the message's len bytes follow the body */
#define XFER_MSG_F_LOCAL                                                                           \
    4u /* RTS, with EAGER: the sender completed it (no FIN, no answer wanted) */
/* RTS, with EAGER: the short body, no offset nor region description (the
 * receiver copies the bytes, into device memory too, and never READs):
 * with LOCAL tag and len (nobody FINs it; since 2026-11-29), without it
 * send id, tag and len (a default SEND, FINned; since 2026-11-29 evening).
 * docs/notify.md "Engine message frame". */
#define XFER_MSG_F_SHORT 8u
/* RTS: a FIN rides in it (since 2026-11-30): the XFER_MSG_FIN_BODY bytes of
 * a FIN to this side come first, then the RTS's own body. The FIN was sent
 * before the RTS; the receiver takes it first (xfer_msg_fold_fin). */
#define XFER_MSG_F_FIN 16u

struct xfer_msg_hdr {
    uint8_t kind;
    uint16_t flags;
    uint64_t seq;
    int32_t status;
    uint32_t n_items, n_failed, n_listed, msg_len;
};

/* Two-sided bodies, carried as the message bytes of their frame (fixed
 * lengths, little-endian; layout in msg_wire.c). */
#define XFER_MSG_RTS_BODY           (32u + 32u + 8u + XFER_NAME_MAX + 2u * XFER_BLOB_MAX)
#define XFER_MSG_FIN_BODY           24u
#define XFER_MSG_RTS_SHORT_BODY     16u /* tag 8, len 8 (XFER_MSG_F_SHORT with LOCAL) */
#define XFER_MSG_RTS_SHORT_FIN_BODY 24u /* send id 8, tag 8, len 8 (SHORT without LOCAL) */

struct xfer_msg_rts {
    uint64_t send_id; /* sender's id of the SEND, echoed in the FIN */
    uint64_t tag, len;
    uint64_t off;         /* of the message in src */
    const uint8_t *eager; /* NULL, or the len message bytes (XFER_MSG_F_EAGER) */
    bool local;           /* XFER_MSG_F_LOCAL (eager only) */
    /* XFER_MSG_F_SHORT (eager only): off and src are not sent (nor
     * send_id when local), and src is not filled in by the decoder nor by
     * the sender (it is last so that the ~650 bytes need not be zeroed or
     * copied either). */
    bool short_form;
    struct xfer_region_desc src; /* sender's region (id, gen, addr, len, access, blobs) */
};
/* Bytes of r that a short RTS uses (the fields before src). */
#define XFER_MSG_RTS_SHORT_SIZE offsetof(struct xfer_msg_rts, src)

struct xfer_msg_fin {
    uint64_t send_id;
    int32_t status; /* 0, -XFER_ETRUNC, or the READ's error */
    uint64_t got;   /* bytes received */
};

/* Whole frames of the two kinds into out (XFER_MSG_HDR_LEN + body bytes,
 * + r->len for an eager RTS: xfer_msg_rts_frame_len). An RTS with
 * short_form (local and eager only) gets the short body. */
size_t xfer_msg_rts_frame_len(const struct xfer_msg_rts *r);
size_t xfer_msg_encode_rts(uint64_t seq, const struct xfer_msg_rts *r, uint8_t *out);
size_t xfer_msg_encode_fin(uint64_t seq, const struct xfer_msg_fin *f, uint8_t *out);
/* Bodies of decoded frames: 0 or -XFER_EPROTO (unterminated strings, bad
 * kind or access, message outside its region, eager bytes other than the
 * message's length, non-error status). r->eager points into h's frame. */
int xfer_msg_decode_rts(const struct xfer_msg_hdr *h, const uint8_t *body, struct xfer_msg_rts *r);
int xfer_msg_decode_fin(const uint8_t *body, struct xfer_msg_fin *f);
/* An RTS decoded with XFER_MSG_F_FIN (its length checked): the FIN in
 * front into f, and *h and *body left describing the RTS alone (its body,
 * msg_len and flags without the FIN), for xfer_msg_decode_rts. 0, or
 * -XFER_EPROTO (the FIN's status): nothing changed. */
int xfer_msg_split_fin(struct xfer_msg_hdr *h, const uint8_t **body, struct xfer_msg_fin *f);
/* Folds the FIN frame fin (fin_len bytes) into the RTS frame at rts (len
 * bytes, room for cap): the FIN's body goes in front of the RTS's body and
 * the RTS gets XFER_MSG_F_FIN. Returns the RTS frame's new length, or 0
 * (not a FIN and an RTS without one, or no room): nothing changed. */
size_t xfer_msg_fold_fin(uint8_t *rts, size_t len, size_t cap, const uint8_t *fin, size_t fin_len);

/* Bytes of the frame this header announces. */
size_t xfer_msg_frame_len(const struct xfer_msg_hdr *h);
/* Writes a whole frame into out (xfer_msg_frame_len bytes): the header,
 * n_listed pairs from failed, msg_len bytes of msg. */
void xfer_msg_encode(const struct xfer_msg_hdr *h, const struct xfer_notif_fail *failed,
                     const void *msg, uint8_t *out);
/* Validates a received frame of len bytes: magic, version, kind, flags,
 * counts (n_listed <= n_failed <= n_items, n_listed <= FAILED_MAX),
 * msg_len <= XFER_NOTIFY_MAX, every listed status an error code, and len ==
 * the announced length. 0 or -XFER_EPROTO with the reason in why. */
int xfer_msg_decode(const uint8_t *in, size_t len, struct xfer_msg_hdr *h, char *why,
                    size_t why_len);
/* Pair k of a decoded frame. */
struct xfer_notif_fail xfer_msg_failed_at(const uint8_t *in, uint32_t k);
/* Message bytes of a decoded frame. */
const uint8_t *xfer_msg_payload(const uint8_t *in, const struct xfer_msg_hdr *h);

#endif
