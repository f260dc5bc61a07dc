/*
 * Connection handshake, run on a connected blocking-or-not socket before any
 * data frame. Messages are the Hello/Auth/HelloResult protobufs of
 * proto/xfer.proto, each length-framed (proto/frame.h).
 *
 *   client -> server  Hello  {version, node_id, incarnation, nonce_c, purpose}
 *   server -> client  Hello  {version, node_id, incarnation, nonce_s,
 *                             proof_s = HMAC(secret, "srv" nonce_c nonce_s)}
 *   client -> server  Auth   {proof_c = HMAC(secret, "cli" nonce_s nonce_c)}
 *   server -> client  Result {status, message}
 *
 * Proofs are HMAC-SHA256 (libcrypto) and compared in constant time. With no
 * secret configured the proofs are empty; a side with a secret refuses a
 * peer without a valid proof, and says why in the log and in *why.
 */
#ifndef XFER_HANDSHAKE_H
#define XFER_HANDSHAKE_H

#include "xfer.h"

struct xfer_hs_self {
    const char *node_id;
    uint64_t incarnation;
    const void *secret; /* NULL = none */
    size_t secret_len;
    uint32_t purpose; /* caller-defined, e.g. tcp connection index */
};

struct xfer_hs_peer {
    char node_id[XFER_NAME_MAX];
    uint64_t incarnation;
    uint32_t version;
    uint32_t purpose;
};

/* Each returns 0, or -XFER_EAUTH, -XFER_EPROTO, -XFER_ECONN, -XFER_ETIMEDOUT
 * with a one-line reason in why. The whole exchange is bounded by timeout_ms.
 * fd may be non-blocking; its flags are left as they were. */
int xfer_handshake_client(int fd, const struct xfer_hs_self *self, int timeout_ms,
                          struct xfer_hs_peer *peer, char *why, size_t why_len);
int xfer_handshake_server(int fd, const struct xfer_hs_self *self, int timeout_ms,
                          struct xfer_hs_peer *peer, char *why, size_t why_len);

#endif
