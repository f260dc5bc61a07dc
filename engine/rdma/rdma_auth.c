/* rdma_cm private data: node identity, version and HMAC proofs (rdma_auth.h). */
#include "rdma_auth.h"
#include "xfer_handshake.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#define REQ_MAGIC 0x32445258u /* "XRD2" (v1 "XRDQ": 64-bit nonces) */
#define REP_MAGIC 0x32505258u /* "XRP2" (v1 "XRDP": 16-byte node ids) */
#define REP_HDR   32
#define PROOF_LEN 16

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
static uint32_t get32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}
static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* HMAC-SHA256(secret, label | a | b), truncated; zeros without a secret. */
static void proof(const struct xfer_rdma_self *self, const char *label, const void *a, size_t alen,
                  const void *b, size_t blen, uint8_t out[PROOF_LEN])
{
    memset(out, 0, PROOF_LEN);
    if (!self->secret || !self->secret_len)
        return;
    uint8_t msg[256], md[EVP_MAX_MD_SIZE];
    size_t ll = strlen(label), n = 0;
    if (ll + alen + blen > sizeof(msg))
        return;
    memcpy(msg, label, ll), n += ll;
    memcpy(msg + n, a, alen), n += alen;
    if (blen)
        memcpy(msg + n, b, blen), n += blen;
    unsigned mdlen = 0;
    if (HMAC(EVP_sha256(), self->secret, (int)self->secret_len, msg, n, md, &mdlen))
        memcpy(out, md, PROOF_LEN);
}

int xfer_rdma_nonce_new(struct xfer_rdma_nonce *n)
{
    if (RAND_bytes(n->b, sizeof(n->b)) == 1 ||
        getrandom(n->b, sizeof(n->b), 0) == (ssize_t)sizeof(n->b))
        return 0;
    return -XFER_EIO;
}

void xfer_rdma_req_encode(const struct xfer_rdma_self *self, const char *target_node, uint16_t slot,
                          int64_t now_ms, const struct xfer_rdma_nonce *nonce,
                          uint8_t out[XFER_RDMA_REQ_LEN])
{
    memset(out, 0, XFER_RDMA_REQ_LEN);
    put32(out, REQ_MAGIC);
    out[4] = XFER_PROTO_VERSION;
    out[6] = (uint8_t)slot;
    out[7] = (uint8_t)(slot >> 8);
    put32(out + 8, (uint32_t)(now_ms / 1000));
    memcpy(out + 12, nonce->b, XFER_RDMA_NONCE_LEN);
    memcpy(out + 28, self->node_id, strnlen(self->node_id, 12));
    proof(self, "xfer-rdma-req", out, 40, target_node, strlen(target_node), out + 40);
}

void xfer_rdma_replay_free(struct xfer_rdma_replay *r)
{
    free(r->v);
    memset(r, 0, sizeof(*r));
}

/* 0 for a nonce not seen within the window (now recorded), -XFER_EAUTH for
 * a replay, -XFER_EBUSY when the window already holds its maximum. */
static int replay_check(struct xfer_rdma_replay *r, const struct xfer_rdma_nonce *n,
                        int64_t until_ms, int64_t now_ms)
{
    for (size_t i = 0; i < r->n;) {
        if (r->v[i].until_ms < now_ms) { /* its request would be stale by now */
            r->v[i] = r->v[--r->n];
            continue;
        }
        if (!memcmp(r->v[i].nonce.b, n->b, sizeof(n->b)))
            return -XFER_EAUTH;
        i++;
    }
    if (r->n == r->cap) {
        size_t cap = r->cap ? 2 * r->cap : 64;
        struct xfer_rdma_seen *v =
            cap <= XFER_RDMA_REPLAY_MAX ? realloc(r->v, cap * sizeof(*v)) : NULL;
        if (!v)
            return -XFER_EBUSY;
        r->v = v;
        r->cap = cap;
    }
    r->v[r->n++] = (struct xfer_rdma_seen){*n, until_ms};
    return 0;
}

int xfer_rdma_req_verify(const struct xfer_rdma_self *self, const void *pdata, size_t len,
                         int64_t now_ms, struct xfer_rdma_replay *replay, struct xfer_rdma_req *out,
                         char *why, size_t why_len)
{
    const uint8_t *p = pdata;
    if (!p || len < XFER_RDMA_REQ_LEN || get32(p) != REQ_MAGIC) {
        snprintf(why, why_len, "connection request is not from an xfer node of this version");
        return -XFER_EPROTO;
    }
    memset(out, 0, sizeof(*out));
    out->version = p[4];
    out->slot = (uint16_t)(p[6] | p[7] << 8);
    out->sent_ms = (int64_t)get32(p + 8) * 1000;
    memcpy(out->nonce.b, p + 12, XFER_RDMA_NONCE_LEN);
    memcpy(out->node, p + 28, 12);
    if (out->version != XFER_PROTO_VERSION) {
        snprintf(why, why_len, "node %s speaks protocol %u, we speak %u", out->node, out->version,
                 XFER_PROTO_VERSION);
        return -XFER_EPROTO;
    }
    if (!self->secret)
        return 0;
    uint8_t want[PROOF_LEN];
    proof(self, "xfer-rdma-req", p, 40, self->node_id, strlen(self->node_id), want);
    if (CRYPTO_memcmp(want, p + 40, PROOF_LEN)) {
        snprintf(why, why_len, "node %s: " XFER_HS_AUTH_FAILED, out->node);
        return -XFER_EAUTH;
    }
    /* whole seconds: the request may be up to 1 s older than it says */
    int64_t oldest = now_ms - XFER_RDMA_NONCE_WINDOW_MS - 1000;
    if (out->sent_ms < oldest || out->sent_ms > now_ms + XFER_RDMA_NONCE_WINDOW_MS) {
        snprintf(why, why_len, "node %s: stale connection request (clock skew above %d s?)",
                 out->node, XFER_RDMA_NONCE_WINDOW_MS / 1000);
        return -XFER_EAUTH;
    }
    int rc = replay ? replay_check(replay, &out->nonce,
                                   out->sent_ms + XFER_RDMA_NONCE_WINDOW_MS + 1000, now_ms)
                    : 0;
    if (rc == -XFER_EAUTH)
        snprintf(why, why_len, "node %s: replayed connection request", out->node);
    else if (rc < 0)
        snprintf(why, why_len, "node %s: more than %d connection requests within %d s", out->node,
                 XFER_RDMA_REPLAY_MAX, XFER_RDMA_NONCE_WINDOW_MS / 1000);
    return rc;
}

/* The REP proof: header bytes 0..15, node id, nonce (zeros for none). */
static void rep_proof(const struct xfer_rdma_self *self, const uint8_t *p, size_t nlen,
                      const struct xfer_rdma_nonce *nonce, uint8_t out[PROOF_LEN])
{
    uint8_t a[16 + XFER_NAME_MAX];
    struct xfer_rdma_nonce zero = {{0}};
    memcpy(a, p, 16);
    memcpy(a + 16, p + REP_HDR, nlen);
    proof(self, "xfer-rdma-rep", a, 16 + nlen, (nonce ? nonce : &zero)->b, XFER_RDMA_NONCE_LEN,
          out);
}

size_t xfer_rdma_rep_encode(const struct xfer_rdma_self *self, const struct xfer_rdma_nonce *nonce,
                            int status, const char *reason, uint8_t *out)
{
    size_t nlen = strnlen(self->node_id, XFER_NAME_MAX - 1);
    memset(out, 0, XFER_RDMA_REJ_LEN);
    put32(out, REP_MAGIC);
    out[4] = XFER_PROTO_VERSION;
    out[5] = (uint8_t)(status < 0 ? -status : status);
    out[6] = (uint8_t)nlen;
    put64(out + 8, self->incarnation);
    memcpy(out + REP_HDR, self->node_id, nlen);
    rep_proof(self, out, nlen, nonce, out + 16);
    if (status == 0)
        return REP_HDR + nlen;
    /* the REJ limit leaves the reason what the node id does not take */
    snprintf((char *)out + REP_HDR + nlen, XFER_RDMA_REJ_LEN - REP_HDR - nlen, "%s",
             reason ? reason : "");
    return XFER_RDMA_REJ_LEN;
}

/* Checks magic and length; copies the node id. Returns its length or -1. */
static int rep_parse(const uint8_t *p, size_t len, char node[XFER_NAME_MAX])
{
    if (!p || len < REP_HDR || get32(p) != REP_MAGIC || p[6] >= XFER_NAME_MAX ||
        len < REP_HDR + (size_t)p[6])
        return -1;
    memcpy(node, p + REP_HDR, p[6]);
    node[p[6]] = '\0';
    return p[6];
}

int xfer_rdma_rep_verify(const struct xfer_rdma_self *self, const struct xfer_rdma_nonce *nonce,
                         const void *pdata, size_t len, char *why, size_t why_len)
{
    const uint8_t *p = pdata;
    char node[XFER_NAME_MAX];
    int nlen = rep_parse(p, len, node);
    if (nlen < 0) {
        snprintf(why, why_len, "reply is not from an xfer node of this version");
        return -XFER_EPROTO;
    }
    if (p[5]) {
        int st = p[5] < XFER_ERR_MAX ? -(int)p[5] : -XFER_EPROTO;
        char reason[XFER_RDMA_REJ_LEN] = {0};
        size_t at = REP_HDR + (size_t)nlen;
        if (len > at)
            memcpy(reason, p + at, len - at < sizeof(reason) - 1 ? len - at : sizeof(reason) - 1);
        snprintf(why, why_len, "node %s refused: %s", node, reason[0] ? reason : xfer_strerror(st));
        return st;
    }
    if (!self->secret)
        return 0;
    uint8_t want[PROOF_LEN];
    rep_proof(self, p, (size_t)nlen, nonce, want);
    if (CRYPTO_memcmp(want, p + 16, PROOF_LEN)) {
        snprintf(why, why_len, "node %s: " XFER_HS_AUTH_FAILED, node);
        return -XFER_EAUTH;
    }
    return 0;
}

int xfer_rdma_rep_check_peer(const void *pdata, size_t len, const char *want_node,
                             uint64_t want_incarnation, char *why, size_t why_len)
{
    const uint8_t *p = pdata;
    char node[XFER_NAME_MAX];
    if (rep_parse(p, len, node) < 0) {
        snprintf(why, why_len, "reply is not from an xfer node of this version");
        return -XFER_EPROTO;
    }
    if (strcmp(node, want_node)) {
        snprintf(why, why_len, "node %s answered, expected %s", node, want_node);
        return -XFER_ESTALE;
    }
    uint64_t inc = get64(p + 8);
    if (want_incarnation && inc != want_incarnation) {
        snprintf(why, why_len, "node %s restarted (incarnation %016llx, expected %016llx)",
                 want_node, (unsigned long long)inc, (unsigned long long)want_incarnation);
        return -XFER_ESTALE;
    }
    return 0;
}

/* The HELLO's proof: label | body | nonce | target node id. */
static void hello_proof(const struct xfer_rdma_self *self, const uint8_t *body, size_t len,
                        const struct xfer_rdma_nonce *nonce, const char *target,
                        uint8_t out[PROOF_LEN])
{
    uint8_t b[XFER_RDMA_NONCE_LEN + XFER_NAME_MAX];
    size_t tl = strnlen(target, XFER_NAME_MAX - 1);
    memcpy(b, nonce->b, XFER_RDMA_NONCE_LEN);
    memcpy(b + XFER_RDMA_NONCE_LEN, target, tl);
    proof(self, "xfer-rdma-hello", body, len, b, XFER_RDMA_NONCE_LEN + tl, out);
}

size_t xfer_rdma_hello_encode(const struct xfer_rdma_self *self, const char *target_node,
                              const struct xfer_rdma_nonce *nonce, uint8_t *out)
{
    size_t n = strnlen(self->node_id, XFER_NAME_MAX - 1);
    memset(out, 0, 25);
    put64(out + 16, self->incarnation);
    out[24] = (uint8_t)n;
    memcpy(out + 25, self->node_id, n);
    hello_proof(self, out + 16, 9 + n, nonce, target_node, out);
    return 25 + n;
}

int xfer_rdma_hello_verify(const struct xfer_rdma_self *self, const struct xfer_rdma_req *req,
                           const void *pdata, size_t len, char node[XFER_NAME_MAX],
                           uint64_t *incarnation, char *why, size_t why_len)
{
    const uint8_t *p = pdata;
    size_t n = len >= 25 ? p[24] : 0;
    if (len < 25 || n == 0 || n >= XFER_NAME_MAX || len != 25 + n || memchr(p + 25, 0, n)) {
        snprintf(why, why_len, "malformed hello from %s", req->node);
        return -XFER_EPROTO;
    }
    size_t ll = strnlen(req->node, 12);
    if (n < ll || memcmp(p + 25, req->node, ll) || (ll < 12 && n != ll)) {
        snprintf(why, why_len, "hello names another node than the connection request (%s)",
                 req->node);
        return -XFER_EPROTO;
    }
    uint8_t want[PROOF_LEN];
    hello_proof(self, p + 16, 9 + n, &req->nonce, self->node_id, want);
    if (CRYPTO_memcmp(want, p, PROOF_LEN)) {
        snprintf(why, why_len, "hello from %s: bad proof (cluster secrets differ)", req->node);
        return -XFER_EAUTH;
    }
    memcpy(node, p + 25, n);
    node[n] = '\0';
    *incarnation = get64(p + 16);
    return 0;
}
