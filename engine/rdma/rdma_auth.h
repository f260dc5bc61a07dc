/*
 * Private data of the rdma_cm exchange, which replaces the TCP handshake of
 * engine/handshake.h: a CM REQ carries at most 56 bytes and there is no
 * round trip before the target must accept or reject, so the challenge is
 * the initiator's fresh nonce (128 random bits) with its wall-clock second;
 * the target refuses a request older than the window and one whose nonce it
 * has seen within the window (issue 18 item 8).
 *
 *  REQ (56 bytes, little-endian):
 *    0 magic "XRD2"  4 version  5 flags  6 qp slot(2)  8 unix seconds(4)
 *   12 nonce(16)  28 initiator node id (12, truncated, NUL-padded; logs only)
 *   40 proof = HMAC-SHA256(secret, "xfer-rdma-req" | bytes 0..39 | target node id)[0..16)
 *  REP / REJ (at most 148 bytes, the REJ limit):
 *    0 magic "XRP2"  4 version  5 status (0 accept, else XFER_E*)  6 node id length n
 *    7 reserved  8 incarnation(8)
 *   16 proof = HMAC-SHA256(secret, "xfer-rdma-rep" | bytes 0..15 | node id | nonce)[0..16)
 *   32 target node id (n bytes, the whole id: issue 14)
 *   32+n reason text (REJ, NUL-terminated, to the end)
 * With no secret configured proofs are zero; a side with a secret refuses a
 * peer without a valid proof.
 */
#ifndef XFER_RDMA_AUTH_H
#define XFER_RDMA_AUTH_H

#include "xfer.h"

#define XFER_RDMA_REQ_LEN         56
#define XFER_RDMA_REP_MAX         (32 + XFER_NAME_MAX) /* REP: 32 + node id length */
#define XFER_RDMA_REJ_LEN         148
#define XFER_RDMA_NONCE_LEN       16
#define XFER_RDMA_NONCE_WINDOW_MS 120000
#define XFER_RDMA_REPLAY_MAX      65536 /* nonces within one window */

struct xfer_rdma_self {
    const char *node_id;
    uint64_t incarnation;
    const void *secret; /* NULL = none */
    size_t secret_len;
};

struct xfer_rdma_nonce {
    uint8_t b[XFER_RDMA_NONCE_LEN];
};

struct xfer_rdma_req {
    uint32_t version;
    uint16_t slot;
    int64_t sent_ms; /* the initiator's wall clock, whole seconds */
    struct xfer_rdma_nonce nonce;
    char node[13]; /* initiator id, first 12 bytes */
};

/* Nonces accepted within the window: each is kept until its request would
 * be refused as stale anyway, so a replay is caught however many requests
 * came in between (at most XFER_RDMA_REPLAY_MAX live ones). */
struct xfer_rdma_replay {
    struct xfer_rdma_seen {
        struct xfer_rdma_nonce nonce;
        int64_t until_ms;
    } * v;
    size_t n, cap;
};
void xfer_rdma_replay_free(struct xfer_rdma_replay *r);

/* 128 random bits; -XFER_EIO when the system has no randomness to give. */
int xfer_rdma_nonce_new(struct xfer_rdma_nonce *n);

void xfer_rdma_req_encode(const struct xfer_rdma_self *self, const char *target_node, uint16_t slot,
                          int64_t now_ms, const struct xfer_rdma_nonce *nonce,
                          uint8_t out[XFER_RDMA_REQ_LEN]);
/* Target side: 0, -XFER_EPROTO (not ours / wrong version), -XFER_EAUTH (bad
 * proof, stale or replayed nonce) or -XFER_EBUSY (the replay window is
 * full), reason in why. Records the nonce. now_ms: wall clock. */
int xfer_rdma_req_verify(const struct xfer_rdma_self *self, const void *pdata, size_t len,
                         int64_t now_ms, struct xfer_rdma_replay *replay, struct xfer_rdma_req *out,
                         char *why, size_t why_len);

/* status 0 = accept (REP), else a negative XFER_E* with reason (REJ; nonce
 * may be NULL). Returns the number of bytes written to out (room for
 * XFER_RDMA_REJ_LEN). */
size_t xfer_rdma_rep_encode(const struct xfer_rdma_self *self, const struct xfer_rdma_nonce *nonce,
                            int status, const char *reason, uint8_t *out);
/* Initiator side, on ESTABLISHED or REJECTED: 0 for a valid accept, else the
 * target's refusal (its status and reason) or -XFER_EAUTH when the target
 * did not prove the secret. */
int xfer_rdma_rep_verify(const struct xfer_rdma_self *self, const struct xfer_rdma_nonce *nonce,
                         const void *pdata, size_t len, char *why, size_t why_len);

/* Initiator side, after xfer_rdma_rep_verify accepted: the node that
 * answered must be the one the descriptor names (its whole id) and, when
 * want_incarnation is not 0, that incarnation; else -XFER_ESTALE with the
 * reason. With a secret both fields are covered by the REP's proof. */
int xfer_rdma_rep_check_peer(const void *pdata, size_t len, const char *want_node,
                             uint64_t want_incarnation, char *why, size_t why_len);

/*
 * HELLO: the first message an initiator sends on the QP that carries its
 * engine messages (engine/rdma/rdma_msg.c). The REQ has room for 12 bytes
 * of the initiator's id only, and the target hands every message to the
 * engine with the sender's whole id and incarnation, so the initiator sends
 * them here, bound to the REQ the target verified:
 *    0 proof = HMAC-SHA256(secret, "xfer-rdma-hello" | bytes 16.. |
 *              REQ nonce | target node id)[0..16)
 *   16 incarnation(8)  24 node id length n  25 node id (n bytes)
 * The target also checks that the id starts with the REQ's 12-byte label.
 */
#define XFER_RDMA_HELLO_MAX (25 + XFER_NAME_MAX)
size_t xfer_rdma_hello_encode(const struct xfer_rdma_self *self, const char *target_node,
                              const struct xfer_rdma_nonce *nonce, uint8_t *out);
/* Target side: 0 and the initiator's id/incarnation, or -XFER_EPROTO
 * (malformed, another node than the REQ's) / -XFER_EAUTH (bad proof). */
int xfer_rdma_hello_verify(const struct xfer_rdma_self *self, const struct xfer_rdma_req *req,
                           const void *pdata, size_t len, char node[XFER_NAME_MAX],
                           uint64_t *incarnation, char *why, size_t why_len);

#endif
