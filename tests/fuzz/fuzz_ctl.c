/* libFuzzer target: what xferd decodes from a control client. The input is
 * (1) a Request frame body, unpacked as the control server does and its
 * addresses, names, layouts and sizes parsed as the handlers do, and (2) a
 * stream of length-prefixed handshake frames fed to the control port's
 * handshake state machine (with and without a secret). Neither may crash,
 * leak or read out of bounds, and a finished handshake takes no more. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "proto/control.pb-c.h"
#include "xfer_handshake.h"
#include "xfer_node.h"
#include "xfer_registry.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void parse_addr(const char *s)
{
    struct xfer_node_addr n;
    char why[200];
    if (s && xfer_node_addr_parse(s, &n, why, sizeof(why)) == 0 &&
        (!n.node[0] || !n.region[0] || strlen(n.node) >= XFER_NAME_MAX))
        __builtin_trap(); /* accepted addresses name a node and a region */
}

static void request(const uint8_t *data, size_t size)
{
    Xctl__Request *req = xctl__request__unpack(NULL, size, data);
    if (!req)
        return;
    switch (req->body_case) {
    case XCTL__REQUEST__BODY_BATCH:
        for (size_t i = 0; i < req->batch->n_items; i++) {
            parse_addr(req->batch->items[i]->src);
            parse_addr(req->batch->items[i]->dst);
        }
        break;
    case XCTL__REQUEST__BODY_WRITE:
        parse_addr(req->write->dst);
        break;
    case XCTL__REQUEST__BODY_READ:
        parse_addr(req->read->src);
        break;
    case XCTL__REQUEST__BODY_REG:
        if (req->reg->name)
            (void)xfer_registry_name_ok(req->reg->name);
        if (req->reg->access) {
            unsigned acc;
            (void)xfer_access_parse(req->reg->access, &acc);
        }
        break;
    default:
        break;
    }
    xctl__request__free_unpacked(req, NULL);
}

static void handshake(const uint8_t *data, size_t size, const char *secret)
{
    struct xfer_hs_self self = {
        .node_id = "srv", .secret = secret, .secret_len = secret ? strlen(secret) : 0};
    xfer_hs_server *h = xfer_hs_server_new(&self);
    if (!h)
        return;
    uint8_t out[XFER_HS_FRAME_MAX];
    char why[256];
    int rc = XFER_HS_MORE, out_len;
    while (size >= 2 && rc == XFER_HS_MORE) {
        size_t len = (size_t)data[0] | (size_t)data[1] << 8;
        data += 2;
        size -= 2;
        if (len > size)
            len = size;
        struct xfer_hs_peer peer;
        rc = xfer_hs_server_step(h, data, len, out, &out_len, &peer, why, sizeof(why));
        if (out_len > XFER_HS_FRAME_MAX || (rc != XFER_HS_MORE && rc > 0))
            __builtin_trap();
        data += len;
        size -= len;
    }
    if (rc != XFER_HS_MORE &&
        xfer_hs_server_step(h, data, 0, out, &out_len, NULL, why, sizeof(why)) != -XFER_EPROTO)
        __builtin_trap(); /* a finished exchange refuses more */
    xfer_hs_server_free(h);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    request(data, size);
    handshake(data, size, NULL);
    handshake(data, size, "s3cret");
    return 0;
}
