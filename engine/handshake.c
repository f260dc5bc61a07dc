/* Connection handshake with mutual HMAC-SHA256 challenge-response. */
#include "handshake.h"
#include "frame.h"
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

static int recv_hello(int fd, int64_t deadline, struct xfer_hs_hello *h, char *why, size_t wl)
{
    uint8_t *buf;
    size_t len;
    int rc = recv_msg(fd, deadline, &buf, &len);
    if (rc)
        return fail(rc, why, wl, "handshake: no hello from peer: %s", xfer_strerror(rc));
    rc = xfer_hs_hello_unpack(buf, len, h);
    free(buf);
    if (rc)
        return fail(rc, why, wl, "handshake: malformed hello");
    if (h->version != XFER_PROTO_VERSION)
        return fail(-XFER_EPROTO, why, wl, "handshake: peer %s speaks protocol %u, we speak %u",
                    h->node_id, h->version, XFER_PROTO_VERSION);
    return 0;
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
        return fail(-XFER_EAUTH, why, wl, "handshake: %s did not prove the cluster secret",
                    srv->node_id);
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
    if (rc)
        return rc;
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

/* Tells the client why it was refused (best effort) and returns the code. */
static int refuse(int fd, int64_t deadline, int code, char *why, size_t wl, const char *msg)
{
    struct xfer_hs_result res = {.status = code};
    snprintf(res.message, sizeof(res.message), "%s", msg);
    uint8_t buf[XFER_HS_MSG_MAX];
    (void)send_msg(fd, buf, xfer_hs_result_pack(&res, buf, sizeof(buf)), deadline);
    return fail(code, why, wl, "handshake: %s", msg);
}

static int server_check_client(const struct xfer_hs_self *self, const struct xfer_hs_hello *cli,
                               const struct xfer_hs_hello *mine, const struct xfer_hs_auth *auth,
                               char *msg, size_t ml)
{
    if (!self->secret)
        return 0; /* a client with a secret refuses us itself */
    if (auth->proof_len == 0) {
        snprintf(msg, ml, "peer %s sent no proof of the cluster secret", cli->node_id);
        return -XFER_EAUTH;
    }
    uint8_t want[XFER_HS_PROOF_LEN];
    if (compute_proof(self, "cli1", mine->nonce, cli->nonce, cli->node_id, mine->node_id, want))
        return -XFER_EIO;
    if (!proof_ok(auth->proof, auth->proof_len, want)) {
        snprintf(msg, ml, "peer %s has a wrong cluster secret", cli->node_id);
        return -XFER_EAUTH;
    }
    return 0;
}

int xfer_handshake_server(int fd, const struct xfer_hs_self *self, int timeout_ms,
                          struct xfer_hs_peer *peer, char *why, size_t wl)
{
    int64_t deadline = xfer_now_ms() + timeout_ms;
    struct xfer_hs_hello cli, mine;
    uint8_t buf[XFER_HS_MSG_MAX];
    int rc = recv_hello(fd, deadline, &cli, why, wl);
    if (rc)
        return rc;
    rc = make_hello(self, &mine);
    if (rc == 0 && self->secret) {
        rc = compute_proof(self, "srv1", cli.nonce, mine.nonce, cli.node_id, mine.node_id,
                           mine.proof);
        mine.proof_len = XFER_HS_PROOF_LEN;
    }
    if (rc)
        return fail(rc, why, wl, "handshake: no random bytes or HMAC failed");
    rc = send_msg(fd, buf, xfer_hs_hello_pack(&mine, buf, sizeof(buf)), deadline);
    if (rc)
        return fail(rc, why, wl, "handshake: sending hello: %s", xfer_strerror(rc));
    uint8_t *abuf;
    size_t alen;
    struct xfer_hs_auth auth;
    rc = recv_msg(fd, deadline, &abuf, &alen);
    if (rc)
        return fail(rc, why, wl, "handshake: no proof from %s: %s", cli.node_id, xfer_strerror(rc));
    rc = xfer_hs_auth_unpack(abuf, alen, &auth);
    free(abuf);
    if (rc)
        return refuse(fd, deadline, rc, why, wl, "malformed proof message");
    char msg[200] = "";
    rc = server_check_client(self, &cli, &mine, &auth, msg, sizeof(msg));
    if (rc)
        return refuse(fd, deadline, rc, why, wl, msg[0] ? msg : "HMAC failed");
    struct xfer_hs_result ok = {.status = 0};
    rc = send_msg(fd, buf, xfer_hs_result_pack(&ok, buf, sizeof(buf)), deadline);
    if (rc)
        return fail(rc, why, wl, "handshake: sending result: %s", xfer_strerror(rc));
    fill_peer(&cli, peer);
    return 0;
}
