/*
 * Handshake messages as plain C structs, packed to/unpacked from the
 * protobuf-c messages of proto/xfer.proto, so that engine/ never includes
 * protobuf headers.
 */
#ifndef XFER_HS_MSG_H
#define XFER_HS_MSG_H

#include "xfer_err.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define XFER_HS_NONCE_LEN 32
#define XFER_HS_PROOF_LEN 32 /* HMAC-SHA256 */
#define XFER_HS_MSG_MAX   1024
/* Node ids as carried in a Hello, incl. NUL; engine/handshake.c checks it
 * equals XFER_NAME_MAX. */
#define XFER_HS_ID_MAX 64

struct xfer_hs_hello {
    uint32_t version;
    char node_id[XFER_HS_ID_MAX];
    uint64_t incarnation;
    uint8_t nonce[XFER_HS_NONCE_LEN];
    uint8_t proof[XFER_HS_PROOF_LEN];
    size_t proof_len; /* 0 = no proof */
    uint32_t purpose;
    bool auth;
};

struct xfer_hs_auth {
    uint8_t proof[XFER_HS_PROOF_LEN];
    size_t proof_len;
};

struct xfer_hs_result {
    int32_t status;
    char message[256];
};

/* Pack into buf (at most cap bytes); returns bytes written or -XFER_ENOSPC. */
int xfer_hs_hello_pack(const struct xfer_hs_hello *m, uint8_t *buf, size_t cap);
int xfer_hs_auth_pack(const struct xfer_hs_auth *m, uint8_t *buf, size_t cap);
int xfer_hs_result_pack(const struct xfer_hs_result *m, uint8_t *buf, size_t cap);
/* Unpack and validate (field sizes, node id length); 0 or -XFER_EPROTO. */
int xfer_hs_hello_unpack(const uint8_t *buf, size_t len, struct xfer_hs_hello *m);
int xfer_hs_auth_unpack(const uint8_t *buf, size_t len, struct xfer_hs_auth *m);
int xfer_hs_result_unpack(const uint8_t *buf, size_t len, struct xfer_hs_result *m);

#endif
