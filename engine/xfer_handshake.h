/*
 * Connection handshake (public: xferd's control port and xferctl use it as
 * the engine's transports do). Run on a connected socket before any data
 * frame. Messages are the Hello/Auth/HelloResult protobufs of
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
 * peer without a valid proof, and says why in the log and in *why
 * (XFER_HS_AUTH_FAILED on both sides when the secrets differ).
 */
#ifndef XFER_HANDSHAKE_PUBLIC_H
#define XFER_HANDSHAKE_PUBLIC_H

#include "xfer.h"

/* What either side says when a proof does not verify. */
#define XFER_HS_AUTH_FAILED                                                                        \
    "authentication failed: the cluster secrets differ (or the peer has none)"
/* Largest handshake frame payload; longer frames are refused unread. */
#define XFER_HS_FRAME_MAX 1024

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

/*
 * The server side as a state machine, for event loops that must not block
 * on a silent client: feed each received frame payload to
 * xfer_hs_server_step and send what it writes to out (a frame payload of
 * *out_len bytes, up to XFER_HS_FRAME_MAX, possibly 0; -1 = nothing to
 * send). Returns
 * XFER_HS_MORE while the next frame is awaited, 0 when the client is
 * authenticated (send out, then the connection is the caller's; peer is
 * filled), or an error with why (out may hold a refusal to send, best
 * effort, before closing). self's strings must outlive the state.
 */
#define XFER_HS_MORE 1
typedef struct xfer_hs_server xfer_hs_server;
xfer_hs_server *xfer_hs_server_new(const struct xfer_hs_self *self);
void xfer_hs_server_free(xfer_hs_server *h);
int xfer_hs_server_step(xfer_hs_server *h, const uint8_t *in, size_t in_len, uint8_t *out,
                        int *out_len, struct xfer_hs_peer *peer, char *why, size_t why_len);

#endif
