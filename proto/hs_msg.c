/* Handshake message (un)packing over protobuf-c. */
#include "hs_msg.h"
#include "proto/xfer.pb-c.h"

#include <stdio.h>
#include <string.h>

static int packed(size_t need, size_t cap)
{
    return need > cap ? -XFER_ENOSPC : (int)need;
}

int xfer_hs_hello_pack(const struct xfer_hs_hello *m, uint8_t *buf, size_t cap)
{
    Xfer__Hello h = XFER__HELLO__INIT;
    h.version = m->version;
    h.node_id = (char *)m->node_id;
    h.incarnation = m->incarnation;
    h.nonce.data = (uint8_t *)m->nonce;
    h.nonce.len = sizeof(m->nonce);
    h.proof.data = (uint8_t *)m->proof;
    h.proof.len = m->proof_len;
    h.purpose = m->purpose;
    h.auth = m->auth;
    int rc = packed(xfer__hello__get_packed_size(&h), cap);
    return rc < 0 ? rc : (int)xfer__hello__pack(&h, buf);
}

int xfer_hs_auth_pack(const struct xfer_hs_auth *m, uint8_t *buf, size_t cap)
{
    Xfer__Auth a = XFER__AUTH__INIT;
    a.proof.data = (uint8_t *)m->proof;
    a.proof.len = m->proof_len;
    int rc = packed(xfer__auth__get_packed_size(&a), cap);
    return rc < 0 ? rc : (int)xfer__auth__pack(&a, buf);
}

int xfer_hs_result_pack(const struct xfer_hs_result *m, uint8_t *buf, size_t cap)
{
    Xfer__HelloResult r = XFER__HELLO_RESULT__INIT;
    r.status = m->status;
    r.message = (char *)m->message;
    int rc = packed(xfer__hello_result__get_packed_size(&r), cap);
    return rc < 0 ? rc : (int)xfer__hello_result__pack(&r, buf);
}

static int copy_proof(const ProtobufCBinaryData *src, uint8_t *dst, size_t *len)
{
    if (src->len != 0 && src->len != XFER_HS_PROOF_LEN)
        return -XFER_EPROTO;
    if (src->len)
        memcpy(dst, src->data, src->len);
    *len = src->len;
    return 0;
}

int xfer_hs_hello_unpack(const uint8_t *buf, size_t len, struct xfer_hs_hello *m)
{
    Xfer__Hello *h = xfer__hello__unpack(NULL, len, buf);
    if (!h)
        return -XFER_EPROTO;
    int rc = -XFER_EPROTO;
    memset(m, 0, sizeof(*m));
    size_t id_len = strlen(h->node_id);
    if (id_len == 0 || id_len >= sizeof(m->node_id) || h->nonce.len != XFER_HS_NONCE_LEN)
        goto out_free;
    if (copy_proof(&h->proof, m->proof, &m->proof_len))
        goto out_free;
    memcpy(m->node_id, h->node_id, id_len + 1);
    memcpy(m->nonce, h->nonce.data, XFER_HS_NONCE_LEN);
    m->version = h->version;
    m->incarnation = h->incarnation;
    m->purpose = h->purpose;
    m->auth = h->auth;
    rc = 0;
out_free:
    xfer__hello__free_unpacked(h, NULL);
    return rc;
}

int xfer_hs_auth_unpack(const uint8_t *buf, size_t len, struct xfer_hs_auth *m)
{
    Xfer__Auth *a = xfer__auth__unpack(NULL, len, buf);
    if (!a)
        return -XFER_EPROTO;
    int rc = copy_proof(&a->proof, m->proof, &m->proof_len);
    xfer__auth__free_unpacked(a, NULL);
    return rc;
}

int xfer_hs_result_unpack(const uint8_t *buf, size_t len, struct xfer_hs_result *m)
{
    Xfer__HelloResult *r = xfer__hello_result__unpack(NULL, len, buf);
    if (!r)
        return -XFER_EPROTO;
    m->status = r->status;
    snprintf(m->message, sizeof(m->message), "%s", r->message);
    xfer__hello_result__free_unpacked(r, NULL);
    return 0;
}
