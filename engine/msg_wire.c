/* Encoding and validation of engine message frames (layout in msg_wire.h). */
#include "msg_wire.h"
#include "wire.h"

#include <stdio.h>
#include <string.h>

size_t xfer_msg_frame_len(const struct xfer_msg_hdr *h)
{
    return XFER_MSG_HDR_LEN + 8u * (size_t)h->n_listed + h->msg_len;
}

void xfer_msg_encode(const struct xfer_msg_hdr *h, const struct xfer_notif_fail *failed,
                     const void *msg, uint8_t *out)
{
    memset(out, 0, XFER_MSG_HDR_LEN);
    xfer_put32(out + 0, XFER_MSG_MAGIC);
    out[4] = XFER_MSG_VERSION;
    out[5] = h->kind;
    xfer_put16(out + 6, h->flags);
    xfer_put64(out + 8, h->seq);
    xfer_put32(out + 16, (uint32_t)h->status);
    xfer_put32(out + 20, h->n_items);
    xfer_put32(out + 24, h->n_failed);
    xfer_put32(out + 28, h->n_listed);
    xfer_put32(out + 32, h->msg_len);
    uint8_t *p = out + XFER_MSG_HDR_LEN;
    for (uint32_t k = 0; k < h->n_listed; k++, p += 8) {
        xfer_put32(p, failed[k].index);
        xfer_put32(p + 4, (uint32_t)failed[k].status);
    }
    if (h->msg_len)
        memcpy(p, msg, h->msg_len);
}

static bool is_error_code(int32_t st)
{
    return st < 0 && st > -XFER_ERR_MAX;
}

static int bad(char *why, size_t why_len, const char *what)
{
    if (why && why_len)
        snprintf(why, why_len, "%s", what);
    return -XFER_EPROTO;
}

int xfer_msg_decode(const uint8_t *in, size_t len, struct xfer_msg_hdr *h, char *why,
                    size_t why_len)
{
    if (len < XFER_MSG_HDR_LEN)
        return bad(why, why_len, "message frame shorter than its header");
    if (xfer_get32(in) != XFER_MSG_MAGIC || in[4] != XFER_MSG_VERSION)
        return bad(why, why_len, "message frame: bad magic or version");
    memset(h, 0, sizeof(*h));
    h->kind = in[5];
    h->flags = xfer_get16(in + 6);
    h->seq = xfer_get64(in + 8);
    h->status = (int32_t)xfer_get32(in + 16);
    h->n_items = xfer_get32(in + 20);
    h->n_failed = xfer_get32(in + 24);
    h->n_listed = xfer_get32(in + 28);
    h->msg_len = xfer_get32(in + 32);
    if (h->kind == 0 || h->kind >= XFER_MSG_KIND_MAX)
        return bad(why, why_len, "message frame: unknown kind");
    if (h->flags & ~XFER_MSG_F_BOUND)
        return bad(why, why_len, "message frame: unknown flags");
    if (h->n_listed > h->n_failed || h->n_failed > h->n_items ||
        h->n_listed > XFER_NOTIFY_FAILED_MAX || (h->n_failed && h->n_listed == 0))
        return bad(why, why_len, "message frame: inconsistent item counts");
    if (!(h->flags & XFER_MSG_F_BOUND) && h->n_items)
        return bad(why, why_len, "message frame: items in a standalone notification");
    if (h->msg_len > XFER_NOTIFY_MAX)
        return bad(why, why_len, "message frame: message over XFER_NOTIFY_MAX");
    if ((h->n_failed == 0) != (h->status == 0) || (h->status && !is_error_code(h->status)))
        return bad(why, why_len, "message frame: status disagrees with the failed items");
    if (len != xfer_msg_frame_len(h))
        return bad(why, why_len, "message frame: length differs from its header");
    for (uint32_t k = 0; k < h->n_listed; k++) {
        struct xfer_notif_fail f = xfer_msg_failed_at(in, k);
        if (!is_error_code(f.status))
            return bad(why, why_len, "message frame: failed item without an error code");
    }
    return 0;
}

struct xfer_notif_fail xfer_msg_failed_at(const uint8_t *in, uint32_t k)
{
    const uint8_t *p = in + XFER_MSG_HDR_LEN + 8u * k;
    return (struct xfer_notif_fail){xfer_get32(p), (int32_t)xfer_get32(p + 4)};
}

const uint8_t *xfer_msg_payload(const uint8_t *in, const struct xfer_msg_hdr *h)
{
    return in + XFER_MSG_HDR_LEN + 8u * (size_t)h->n_listed;
}
