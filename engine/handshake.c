/* Connection handshake with mutual HMAC-SHA256 challenge-response. */
#include "handshake.h"
#include "xfer_io.h"
#include "hs_msg.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(XFER_HS_ID_MAX == XFER_NAME_MAX, "handshake node ids hold a whole node id");

static int fail(int code, char *why, size_t why_len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int fail(int code, char *why, size_t why_len, const char *fmt, ...)
{
    if (why && why_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, why_len, fmt, ap);
        va_end(ap);
    }
    return code;
}

/* proof = HMAC(secret, label | first nonce | second nonce | client id | server id).
 * The label and nonce order differ per direction, so a proof cannot be
 * reflected back to its sender. */
static int compute_proof(const struct xfer_hs_self *self, const char *label, const uint8_t *n1,
                         const uint8_t *n2, const char *cli_id, const char *srv_id,
                         uint8_t out[XFER_HS_PROOF_LEN])
{
    uint8_t msg[8 + 2 * XFER_HS_NONCE_LEN + 2 * XFER_NAME_MAX];
    size_t off = 0, l1 = strlen(cli_id) + 1, l2 = strlen(srv_id) + 1;
    memcpy(msg + off, label, 4);
    off += 4;
    memcpy(msg + off, n1, XFER_HS_NONCE_LEN);
    off += XFER_HS_NONCE_LEN;
    memcpy(msg + off, n2, XFER_HS_NONCE_LEN);
    off += XFER_HS_NONCE_LEN;
    memcpy(msg + off, cli_id, l1);
    off += l1;
    memcpy(msg + off, srv_id, l2);
    off += l2;
    unsigned int len = 0;
    if (!HMAC(EVP_sha256(), self->secret, (int)self->secret_len, msg, off, out, &len) ||
        len != XFER_HS_PROOF_LEN)
        return -XFER_EIO;
    return 0;
}

static bool proof_ok(const uint8_t *got, size_t got_len, const uint8_t *want)
{
    return got_len == XFER_HS_PROOF_LEN && CRYPTO_memcmp(got, want, XFER_HS_PROOF_LEN) == 0;
}

static int send_msg(int fd, const uint8_t *buf, int len, int64_t deadline)
{
    if (len < 0)
        return len;
    int left = (int)(deadline - xfer_now_ms());
    return left <= 0 ? -XFER_ETIMEDOUT : xfer_frame_send(fd, buf, (size_t)len, left);
}

static int recv_msg(int fd, int64_t deadline, uint8_t **buf, size_t *len)
{
    int left = (int)(deadline - xfer_now_ms());
    return left <= 0 ? -XFER_ETIMEDOUT : xfer_frame_recv(fd, XFER_HS_MSG_MAX, left, buf, len);
}

static int make_hello(const struct xfer_hs_self *self, struct xfer_hs_hello *h)
{
    memset(h, 0, sizeof(*h));
    h->version = XFER_PROTO_VERSION;
    snprintf(h->node_id, sizeof(h->node_id), "%s", self->node_id);
    h->incarnation = self->incarnation;
    h->purpose = self->purpose;
    h->auth = self->secret != NULL;
    return RAND_bytes(h->nonce, sizeof(h->nonce)) == 1 ? 0 : -XFER_EIO;
}

static void fill_peer(const struct xfer_hs_hello *h, struct xfer_hs_peer *peer)
{
    if (!peer)
        return;
    memcpy(peer->node_id, h->node_id, sizeof(peer->node_id));
    peer->incarnation = h->incarnation;
    peer->version = h->version;
    peer->purpose = h->purpose;
}

/* Decodes a peer's hello and checks its protocol version. */
static int check_hello(const uint8_t *buf, size_t len, struct xfer_hs_hello *h, char *why,
                       size_t wl)
{
    if (xfer_hs_hello_unpack(buf, len, h))
        return fail(-XFER_EPROTO, why, wl, "handshake: malformed hello");
    if (h->version != XFER_PROTO_VERSION)
        return fail(-XFER_EPROTO, why, wl, "handshake: peer %s speaks protocol %u, we speak %u",
                    h->node_id, h->version, XFER_PROTO_VERSION);
    return 0;
}

static int recv_hello(int fd, int64_t deadline, struct xfer_hs_hello *h, char *why, size_t wl)
{
    uint8_t *buf;
    size_t len;
    int rc = recv_msg(fd, deadline, &buf, &len);
    if (rc)
        return fail(rc, why, wl, "handshake: no hello from peer: %s", xfer_strerror(rc));
    rc = check_hello(buf, len, h, why, wl);
    free(buf);
    return rc;
}

static int client_check_server(const struct xfer_hs_self *self, const struct xfer_hs_hello *mine,
                               const struct xfer_hs_hello *srv, char *why, size_t wl)
{
    if (!self->secret)
        return srv->auth ? fail(-XFER_EAUTH, why, wl,
                                "handshake: %s requires a cluster secret and none is configured",
                                srv->node_id)
                         : 0;
    uint8_t want[XFER_HS_PROOF_LEN];
    int rc =
        compute_proof(self, "srv1", mine->nonce, srv->nonce, mine->node_id, srv->node_id, want);
    if (rc)
        return fail(rc, why, wl, "handshake: HMAC failed");
    if (!proof_ok(srv->proof, srv->proof_len, want))
        return fail(-XFER_EAUTH, why, wl, "handshake: %s: %s", srv->node_id, XFER_HS_AUTH_FAILED);
    return 0;
}

int xfer_handshake_client(int fd, const struct xfer_hs_self *self, int timeout_ms,
                          struct xfer_hs_peer *peer, char *why, size_t wl)
{
    int64_t deadline = xfer_now_ms() + timeout_ms;
    struct xfer_hs_hello mine, srv;
    uint8_t buf[XFER_HS_MSG_MAX];
    int rc = make_hello(self, &mine);
    if (rc)
        return fail(rc, why, wl, "handshake: no random bytes");
    rc = send_msg(fd, buf, xfer_hs_hello_pack(&mine, buf, sizeof(buf)), deadline);
    if (rc)
        return fail(rc, why, wl, "handshake: sending hello: %s", xfer_strerror(rc));
    rc = recv_hello(fd, deadline, &srv, why, wl);
    if (rc)
        return rc;
    rc = client_check_server(self, &mine, &srv, why, wl);
    if (rc) {
        /* Both have secrets that differ: an empty proof lets the server
         * log why, too. */
        struct xfer_hs_auth none = {.proof_len = 0};
        if (rc == -XFER_EAUTH && self->secret && srv.auth)
            (void)send_msg(fd, buf, xfer_hs_auth_pack(&none, buf, sizeof(buf)), deadline);
        return rc;
    }
    struct xfer_hs_auth auth = {.proof_len = 0};
    if (self->secret) {
        rc = compute_proof(self, "cli1", srv.nonce, mine.nonce, mine.node_id, srv.node_id,
                           auth.proof);
        if (rc)
            return fail(rc, why, wl, "handshake: HMAC failed");
        auth.proof_len = XFER_HS_PROOF_LEN;
    }
    rc = send_msg(fd, buf, xfer_hs_auth_pack(&auth, buf, sizeof(buf)), deadline);
    if (rc)
        return fail(rc, why, wl, "handshake: sending proof: %s", xfer_strerror(rc));
    uint8_t *rbuf;
    size_t rlen;
    struct xfer_hs_result res;
    rc = recv_msg(fd, deadline, &rbuf, &rlen);
    if (rc)
        return fail(rc, why, wl, "handshake: no answer from %s: %s", srv.node_id,
                    xfer_strerror(rc));
    rc = xfer_hs_result_unpack(rbuf, rlen, &res);
    free(rbuf);
    if (rc)
        return fail(rc, why, wl, "handshake: malformed result from %s", srv.node_id);
    if (res.status != 0)
        return fail(res.status < 0 && res.status > -XFER_ERR_MAX ? res.status : -XFER_EPROTO, why,
                    wl, "handshake: %s refused us: %s", srv.node_id, res.message);
    fill_peer(&srv, peer);
    return 0;
}

struct xfer_hs_server {
    struct xfer_hs_self self;
    struct xfer_hs_hello cli, mine;
    int step; /* 0: hello awaited, 1: proof awaited, 2: finished */
};

_Static_assert(XFER_HS_FRAME_MAX == XFER_HS_MSG_MAX, "one handshake frame limit");

xfer_hs_server *xfer_hs_server_new(const struct xfer_hs_self *self)
{
    xfer_hs_server *h = calloc(1, sizeof(*h));
    if (h)
        h->self = *self;
    return h;
}

void xfer_hs_server_free(xfer_hs_server *h)
{
    free(h);
}

/* Packs the refusal the client is told (best effort) and returns the code. */
static int refuse(int code, uint8_t *out, int *out_len, char *why, size_t wl, const char *msg)
{
    struct xfer_hs_result res = {.status = code};
    snprintf(res.message, sizeof(res.message), "%s", msg);
    int n = xfer_hs_result_pack(&res, out, XFER_HS_MSG_MAX);
    *out_len = n >= 0 ? n : -1;
    return fail(code, why, wl, "handshake: %s", msg);
}

static int server_check_client(const struct xfer_hs_self *self, const struct xfer_hs_hello *cli,
                               const struct xfer_hs_hello *mine, const struct xfer_hs_auth *auth,
                               char *msg, size_t ml)
{
    if (!self->secret)
        return 0; /* a client with a secret refuses us itself */
    uint8_t want[XFER_HS_PROOF_LEN];
    if (compute_proof(self, "cli1", mine->nonce, cli->nonce, cli->node_id, mine->node_id, want))
        return -XFER_EIO;
    if (!proof_ok(auth->proof, auth->proof_len, want)) {
        snprintf(msg, ml, "%s: %s", cli->node_id, XFER_HS_AUTH_FAILED);
        return -XFER_EAUTH;
    }
    return 0;
}

static int step_hello(xfer_hs_server *h, const uint8_t *in, size_t in_len, uint8_t *out,
                      int *out_len, char *why, size_t wl)
{
    int rc = check_hello(in, in_len, &h->cli, why, wl);
    if (rc)
        return rc;
    rc = make_hello(&h->self, &h->mine);
    if (rc == 0 && h->self.secret) {
        rc = compute_proof(&h->self, "srv1", h->cli.nonce, h->mine.nonce, h->cli.node_id,
                           h->mine.node_id, h->mine.proof);
        h->mine.proof_len = XFER_HS_PROOF_LEN;
    }
    if (rc)
        return fail(rc, why, wl, "handshake: no random bytes or HMAC failed");
    int n = xfer_hs_hello_pack(&h->mine, out, XFER_HS_MSG_MAX);
    if (n < 0)
        return fail(n, why, wl, "handshake: packing hello: %s", xfer_strerror(n));
    *out_len = n;
    return XFER_HS_MORE;
}

static int step_auth(xfer_hs_server *h, const uint8_t *in, size_t in_len, uint8_t *out,
                     int *out_len, struct xfer_hs_peer *peer, char *why, size_t wl)
{
    struct xfer_hs_auth auth;
    int rc = xfer_hs_auth_unpack(in, in_len, &auth);
    if (rc)
        return refuse(rc, out, out_len, why, wl, "malformed proof message");
    char msg[200] = "";
    rc = server_check_client(&h->self, &h->cli, &h->mine, &auth, msg, sizeof(msg));
    if (rc)
        return refuse(rc, out, out_len, why, wl, msg[0] ? msg : "HMAC failed");
    struct xfer_hs_result ok = {.status = 0};
    int n = xfer_hs_result_pack(&ok, out, XFER_HS_MSG_MAX);
    if (n < 0)
        return fail(n, why, wl, "handshake: packing result: %s", xfer_strerror(n));
    *out_len = n;
    fill_peer(&h->cli, peer);
    return 0;
}

int xfer_hs_server_step(xfer_hs_server *h, const uint8_t *in, size_t in_len, uint8_t *out,
                        int *out_len, struct xfer_hs_peer *peer, char *why, size_t wl)
{
    *out_len = -1;
    if (in_len > XFER_HS_MSG_MAX)
        return fail(-XFER_EPROTO, why, wl, "handshake: frame of %zu bytes", in_len);
    int step = h->step;
    h->step = 2; /* a failed step finishes the exchange */
    int rc = step == 0   ? step_hello(h, in, in_len, out, out_len, why, wl)
             : step == 1 ? step_auth(h, in, in_len, out, out_len, peer, why, wl)
                         : fail(-XFER_EPROTO, why, wl, "handshake: already finished");
    if (rc == XFER_HS_MORE)
        h->step = step + 1;
    return rc;
}

/* The blocking server: the state machine fed from the socket. */
int xfer_handshake_server(int fd, const struct xfer_hs_self *self, int timeout_ms,
                          struct xfer_hs_peer *peer, char *why, size_t wl)
{
    int64_t deadline = xfer_now_ms() + timeout_ms;
    xfer_hs_server h = {.self = *self};
    uint8_t out[XFER_HS_MSG_MAX];
    for (;;) {
        uint8_t *in;
        size_t in_len;
        int out_len;
        int rc = recv_msg(fd, deadline, &in, &in_len);
        if (rc)
            return h.step == 0
                       ? fail(rc, why, wl, "handshake: no hello from peer: %s", xfer_strerror(rc))
                       : fail(rc, why, wl, "handshake: no proof from %s: %s", h.cli.node_id,
                              xfer_strerror(rc));
        rc = xfer_hs_server_step(&h, in, in_len, out, &out_len, peer, why, wl);
        free(in);
        int src = out_len >= 0 ? send_msg(fd, out, out_len, deadline) : 0;
        if (rc == 0 && src)
            return fail(src, why, wl, "handshake: sending result: %s", xfer_strerror(src));
        if (rc != XFER_HS_MORE)
            return rc;
        if (src)
            return fail(src, why, wl, "handshake: sending hello: %s", xfer_strerror(src));
    }
}
