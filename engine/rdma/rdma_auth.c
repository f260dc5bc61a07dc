/* rdma_cm private data: node identity, version and HMAC proofs (rdma_auth.h). */
#include "rdma_auth.h"
#include "xfer_handshake.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <stdio.h>
#include <string.h>

#define REQ_MAGIC 0x51445258u /* "XRDQ" */
#define REP_MAGIC 0x50445258u /* "XRDP" */
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

uint64_t xfer_rdma_nonce_new(int64_t now_ms)
{
    uint16_t r = 0;
    if (RAND_bytes((unsigned char *)&r, sizeof(r)) != 1)
        r = (uint16_t)now_ms;
    return (uint64_t)now_ms << 16 | r;
}

static void put_node(uint8_t *p, const char *node)
{
    memset(p, 0, 16);
    memcpy(p, node, strnlen(node, 16));
}

void xfer_rdma_req_encode(const struct xfer_rdma_self *self, const char *target_node, uint16_t slot,
                          uint64_t nonce, uint8_t out[XFER_RDMA_REQ_LEN])
{
    memset(out, 0, XFER_RDMA_REQ_LEN);
    put32(out, REQ_MAGIC);
    out[4] = XFER_PROTO_VERSION;
    out[6] = (uint8_t)slot;
    out[7] = (uint8_t)(slot >> 8);
    put64(out + 8, self->incarnation);
    put64(out + 16, nonce);
    put_node(out + 24, self->node_id);
    proof(self, "xfer-rdma-req", out, 40, target_node, strlen(target_node), out + 40);
}

static bool replayed(struct xfer_rdma_replay *r, uint64_t nonce)
{
    for (unsigned i = 0; i < XFER_RDMA_REPLAY_SLOTS; i++)
        if (r->seen[i] == nonce)
            return true;
    r->seen[r->next] = nonce;
    r->next = (r->next + 1) % XFER_RDMA_REPLAY_SLOTS;
    return false;
}

int xfer_rdma_req_verify(const struct xfer_rdma_self *self, const void *pdata, size_t len,
                         int64_t now_ms, struct xfer_rdma_replay *replay, struct xfer_rdma_req *out,
                         char *why, size_t why_len)
{
    const uint8_t *p = pdata;
    if (!p || len < XFER_RDMA_REQ_LEN || get32(p) != REQ_MAGIC) {
        snprintf(why, why_len, "connection request is not from an xfer node");
        return -XFER_EPROTO;
    }
    memset(out, 0, sizeof(*out));
    out->version = p[4];
    out->slot = (uint16_t)(p[6] | p[7] << 8);
    out->incarnation = get64(p + 8);
    out->nonce = get64(p + 16);
    memcpy(out->node, p + 24, 16);
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
    int64_t ts = (int64_t)(out->nonce >> 16);
    if (ts < now_ms - XFER_RDMA_NONCE_WINDOW_MS || ts > now_ms + XFER_RDMA_NONCE_WINDOW_MS) {
        snprintf(why, why_len, "node %s: stale connection request (clock skew above %d s?)",
                 out->node, XFER_RDMA_NONCE_WINDOW_MS / 1000);
        return -XFER_EAUTH;
    }
    if (replay && replayed(replay, out->nonce)) {
        snprintf(why, why_len, "node %s: replayed connection request", out->node);
        return -XFER_EAUTH;
    }
    return 0;
}

size_t xfer_rdma_rep_encode(const struct xfer_rdma_self *self, uint64_t nonce, int status,
                            const char *reason, uint8_t *out)
{
    memset(out, 0, XFER_RDMA_REJ_LEN);
    put32(out, REP_MAGIC);
    out[4] = XFER_PROTO_VERSION;
    out[5] = (uint8_t)(status < 0 ? -status : status);
    put64(out + 8, self->incarnation);
    put_node(out + 16, self->node_id);
    uint8_t n[8];
    put64(n, nonce);
    proof(self, "xfer-rdma-rep", out, 32, n, sizeof(n), out + 32);
    if (status == 0)
        return XFER_RDMA_REP_LEN;
    snprintf((char *)out + 48, XFER_RDMA_REJ_LEN - 48, "%s", reason ? reason : "");
    return XFER_RDMA_REJ_LEN;
}

int xfer_rdma_rep_verify(const struct xfer_rdma_self *self, uint64_t nonce, const void *pdata,
                         size_t len, char *why, size_t why_len)
{
    const uint8_t *p = pdata;
    if (!p || len < XFER_RDMA_REP_LEN || get32(p) != REP_MAGIC) {
        snprintf(why, why_len, "reply is not from an xfer node");
        return -XFER_EPROTO;
    }
    char node[17] = {0};
    memcpy(node, p + 16, 16);
    if (p[5]) {
        int st = p[5] < XFER_ERR_MAX ? -(int)p[5] : -XFER_EPROTO;
        char reason[101] = {0};
        if (len >= XFER_RDMA_REJ_LEN)
            memcpy(reason, p + 48, 100);
        snprintf(why, why_len, "node %s refused: %s", node, reason[0] ? reason : xfer_strerror(st));
        return st;
    }
    if (!self->secret)
        return 0;
    uint8_t n[8], want[PROOF_LEN];
    put64(n, nonce);
    proof(self, "xfer-rdma-rep", p, 32, n, sizeof(n), want);
    if (CRYPTO_memcmp(want, p + 32, PROOF_LEN)) {
        snprintf(why, why_len, "node %s: " XFER_HS_AUTH_FAILED, node);
        return -XFER_EAUTH;
    }
    return 0;
}

int xfer_rdma_rep_check_peer(const void *pdata, size_t len, const char *want_node,
                             uint64_t want_incarnation, char *why, size_t why_len)
{
    const uint8_t *p = pdata;
    if (!p || len < XFER_RDMA_REP_LEN || get32(p) != REP_MAGIC) {
        snprintf(why, why_len, "reply is not from an xfer node");
        return -XFER_EPROTO;
    }
    char node[17] = {0};
    memcpy(node, p + 16, 16);
    if (strncmp(node, want_node, 16)) {
        snprintf(why, why_len, "node %s answered, expected %.40s", node, want_node);
        return -XFER_ESTALE;
    }
    uint64_t inc = get64(p + 8);
    if (want_incarnation && inc != want_incarnation) {
        snprintf(why, why_len, "node %.40s restarted (incarnation %016llx, expected %016llx)",
                 want_node, (unsigned long long)inc, (unsigned long long)want_incarnation);
        return -XFER_ESTALE;
    }
    return 0;
}
