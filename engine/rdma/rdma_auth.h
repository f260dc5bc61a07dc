/*
 * Private data of the rdma_cm exchange, which replaces the TCP handshake of
 * engine/handshake.h: a CM REQ carries at most 56 bytes and there is no
 * round trip before the target must accept or reject, so the challenge is
 * the initiator's fresh nonce (millisecond clock << 16 | random) and the
 * target refuses stale or replayed nonces.
 *
 *  REQ (56 bytes, little-endian):
 *    0 magic "XRDQ"  4 version  5 flags  6 qp slot(2)  8 incarnation(8)
 *   16 nonce(8)  24 initiator node id (16, truncated, NUL-padded)
 *   40 proof = HMAC-SHA256(secret, "xfer-rdma-req" | bytes 0..39 | target node id)[0..16)
 *  REP / REJ (at most 196 bytes):
 *    0 magic "XRDP"  4 version  5 status (0 accept, else XFER_E*)  6 reserved(2)
 *    8 incarnation(8)  16 target node id (16)
 *   32 proof = HMAC-SHA256(secret, "xfer-rdma-rep" | bytes 0..31 | nonce)[0..16)
 *   48 reason text (REJ, NUL-terminated, up to 100 bytes)
 * With no secret configured proofs are zero; a side with a secret refuses a
 * peer without a valid proof.
 */
#ifndef XFER_RDMA_AUTH_H
#define XFER_RDMA_AUTH_H

#include "xfer.h"

#define XFER_RDMA_REQ_LEN         56
#define XFER_RDMA_REP_LEN         48
#define XFER_RDMA_REJ_LEN         148
#define XFER_RDMA_NONCE_WINDOW_MS 120000
#define XFER_RDMA_REPLAY_SLOTS    1024

struct xfer_rdma_self {
    const char *node_id;
    uint64_t incarnation;
    const void *secret; /* NULL = none */
    size_t secret_len;
};

struct xfer_rdma_req {
    uint32_t version;
    uint16_t slot;
    uint64_t incarnation;
    uint64_t nonce;
    char node[17];
};

/* Nonces recently accepted, to refuse a replayed REQ. */
struct xfer_rdma_replay {
    uint64_t seen[XFER_RDMA_REPLAY_SLOTS];
    unsigned next;
};

uint64_t xfer_rdma_nonce_new(int64_t now_ms);

void xfer_rdma_req_encode(const struct xfer_rdma_self *self, const char *target_node, uint16_t slot,
                          uint64_t nonce, uint8_t out[XFER_RDMA_REQ_LEN]);
/* Target side: 0, -XFER_EPROTO (not ours / wrong version) or -XFER_EAUTH
 * (bad proof, stale or replayed nonce), reason in why. Records the nonce. */
int xfer_rdma_req_verify(const struct xfer_rdma_self *self, const void *pdata, size_t len,
                         int64_t now_ms, struct xfer_rdma_replay *replay, struct xfer_rdma_req *out,
                         char *why, size_t why_len);

/* status 0 = accept (REP), else a negative XFER_E* with reason (REJ).
 * Returns the number of bytes written to out (room for XFER_RDMA_REJ_LEN). */
size_t xfer_rdma_rep_encode(const struct xfer_rdma_self *self, uint64_t nonce, int status,
                            const char *reason, uint8_t *out);
/* Initiator side, on ESTABLISHED or REJECTED: 0 for a valid accept, else the
 * target's refusal (its status and reason) or -XFER_EAUTH when the target
 * did not prove the secret. */
int xfer_rdma_rep_verify(const struct xfer_rdma_self *self, uint64_t nonce, const void *pdata,
                         size_t len, char *why, size_t why_len);

/* Initiator side, after xfer_rdma_rep_verify accepted: the node that
 * answered must be the one the descriptor names (the first 16 bytes of its
 * id, all the REP carries) and, when want_incarnation is not 0, that
 * incarnation; else -XFER_ESTALE with the reason. With a secret both fields
 * are covered by the REP's proof. */
int xfer_rdma_rep_check_peer(const void *pdata, size_t len, const char *want_node,
                             uint64_t want_incarnation, char *why, size_t why_len);

#endif
