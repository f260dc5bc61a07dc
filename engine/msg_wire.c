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

/* The short RTS's body: without a send id when local (nobody FINs it). */
static uint32_t rts_short_body(bool local)
{
    return local ? XFER_MSG_RTS_SHORT_BODY : XFER_MSG_RTS_SHORT_FIN_BODY;
}

/* RTS and FIN bodies have fixed lengths; an eager RTS adds its message, a
 * FIN riding in an RTS its body in front. */
static bool two_sided_len_ok(const struct xfer_msg_hdr *h)
{
    if (h->kind == XFER_MSG_FIN)
        return h->msg_len == XFER_MSG_FIN_BODY;
    uint32_t fin = h->flags & XFER_MSG_F_FIN ? XFER_MSG_FIN_BODY : 0;
    if (h->msg_len < fin)
        return false;
    uint32_t len = h->msg_len - fin;
    uint32_t body = h->flags & XFER_MSG_F_SHORT ? rts_short_body(h->flags & XFER_MSG_F_LOCAL)
                                                : XFER_MSG_RTS_BODY;
    if (h->flags & XFER_MSG_F_EAGER)
        return len >= body && len - body <= XFER_MSG_EAGER_MAX;
    return len == XFER_MSG_RTS_BODY;
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
    const uint16_t rts_flags =
        XFER_MSG_F_EAGER | XFER_MSG_F_LOCAL | XFER_MSG_F_SHORT | XFER_MSG_F_FIN;
    if (h->flags & ~(XFER_MSG_F_BOUND | rts_flags) ||
        (h->flags & ~(h->kind == XFER_MSG_NOTIFY ? XFER_MSG_F_BOUND
                      : h->kind == XFER_MSG_RTS  ? rts_flags
                                                 : 0u)) ||
        ((h->flags & XFER_MSG_F_LOCAL) && !(h->flags & XFER_MSG_F_EAGER)) ||
        ((h->flags & XFER_MSG_F_SHORT) && !(h->flags & XFER_MSG_F_EAGER)))
        return bad(why, why_len, "message frame: unknown flags");
    if (h->kind != XFER_MSG_NOTIFY && (h->status || h->n_items || !two_sided_len_ok(h)))
        return bad(why, why_len, "message frame: malformed two-sided frame");
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

/* ---- two-sided bodies --------------------------------------------------------- */
/*  RTS: send_id 8, tag 8, len 8, off 8 | id 4, gen 4, kind 4, device 4, addr 8,
 *       rlen 8 | access 4, pad 4 | name 64 | ipc 256 | rkeys 256
 *       [flag EAGER: the len message bytes]
 *  RTS with flags SHORT and EAGER: [without LOCAL: send_id 8] tag 8, len 8 |
 *       the len message bytes (the receiver copies the bytes or fails the
 *       RECV; the region is never read; a FIN goes back unless LOCAL)
 *  FIN: send_id 8, status 4, pad 4, got 8 */

static size_t put_hdr(uint8_t kind, uint64_t seq, uint32_t body, uint8_t *out)
{
    struct xfer_msg_hdr h = {.kind = kind, .seq = seq};
    xfer_msg_encode(&h, NULL, NULL, out);
    xfer_put32(out + 32, body); /* the body is written by the caller */
    return XFER_MSG_HDR_LEN;
}

static uint32_t rts_body(const struct xfer_msg_rts *r)
{
    return r->short_form && r->eager ? rts_short_body(r->local) : XFER_MSG_RTS_BODY;
}

size_t xfer_msg_rts_frame_len(const struct xfer_msg_rts *r)
{
    return XFER_MSG_HDR_LEN + rts_body(r) + (r->eager ? r->len : 0);
}

static size_t encode_rts_short(uint64_t seq, const struct xfer_msg_rts *r, uint32_t body,
                               uint8_t *out)
{
    uint8_t *p = out + put_hdr(XFER_MSG_RTS, seq, body + (uint32_t)r->len, out);
    xfer_put16(out + 6, XFER_MSG_F_EAGER | XFER_MSG_F_SHORT | (r->local ? XFER_MSG_F_LOCAL : 0));
    if (!r->local) { /* its FIN names it */
        xfer_put64(p, r->send_id);
        p += 8;
    }
    xfer_put64(p, r->tag);
    xfer_put64(p + 8, r->len);
    memcpy(p + 16, r->eager, r->len);
    return xfer_msg_rts_frame_len(r);
}

size_t xfer_msg_encode_rts(uint64_t seq, const struct xfer_msg_rts *r, uint8_t *out)
{
    uint32_t body = rts_body(r);
    if (body != XFER_MSG_RTS_BODY)
        return encode_rts_short(seq, r, body, out);
    uint32_t eager = r->eager ? (uint32_t)r->len : 0;
    uint8_t *p = out + put_hdr(XFER_MSG_RTS, seq, XFER_MSG_RTS_BODY + eager, out);
    if (r->eager)
        xfer_put16(out + 6, XFER_MSG_F_EAGER | (r->local ? XFER_MSG_F_LOCAL : 0));
    memset(p, 0, XFER_MSG_RTS_BODY);
    xfer_put64(p, r->send_id);
    xfer_put64(p + 8, r->tag);
    xfer_put64(p + 16, r->len);
    xfer_put64(p + 24, r->off);
    xfer_put32(p + 32, r->src.id);
    xfer_put32(p + 36, r->src.gen);
    xfer_put32(p + 40, (uint32_t)r->src.kind);
    xfer_put32(p + 44, (uint32_t)r->src.device);
    xfer_put64(p + 48, r->src.addr);
    xfer_put64(p + 56, r->src.len);
    xfer_put32(p + 64, r->src.access);
    memcpy(p + 72, r->src.name, XFER_NAME_MAX);
    memcpy(p + 72 + XFER_NAME_MAX, r->src.ipc, XFER_BLOB_MAX);
    memcpy(p + 72 + XFER_NAME_MAX + XFER_BLOB_MAX, r->src.rkeys, XFER_BLOB_MAX);
    if (eager)
        memcpy(p + XFER_MSG_RTS_BODY, r->eager, eager);
    return xfer_msg_rts_frame_len(r);
}

size_t xfer_msg_encode_fin(uint64_t seq, const struct xfer_msg_fin *f, uint8_t *out)
{
    uint8_t *p = out + put_hdr(XFER_MSG_FIN, seq, XFER_MSG_FIN_BODY, out);
    memset(p, 0, XFER_MSG_FIN_BODY);
    xfer_put64(p, f->send_id);
    xfer_put32(p + 8, (uint32_t)f->status);
    xfer_put64(p + 16, f->got);
    return XFER_MSG_HDR_LEN + XFER_MSG_FIN_BODY;
}

size_t xfer_msg_fold_fin(uint8_t *rts, size_t len, size_t cap, const uint8_t *fin, size_t fin_len)
{
    size_t grown = len + XFER_MSG_FIN_BODY;
    if (fin_len != XFER_MSG_HDR_LEN + XFER_MSG_FIN_BODY || fin[5] != XFER_MSG_FIN ||
        len < XFER_MSG_HDR_LEN || rts[5] != XFER_MSG_RTS ||
        (xfer_get16(rts + 6) & XFER_MSG_F_FIN) || grown > cap ||
        xfer_get32(rts + 32) + XFER_MSG_FIN_BODY > XFER_NOTIFY_MAX)
        return 0;
    uint8_t *body = rts + XFER_MSG_HDR_LEN;
    memmove(body + XFER_MSG_FIN_BODY, body, len - XFER_MSG_HDR_LEN);
    memcpy(body, fin + XFER_MSG_HDR_LEN, XFER_MSG_FIN_BODY);
    xfer_put16(rts + 6, (uint16_t)(xfer_get16(rts + 6) | XFER_MSG_F_FIN));
    xfer_put32(rts + 32, xfer_get32(rts + 32) + XFER_MSG_FIN_BODY);
    return grown;
}

int xfer_msg_split_fin(struct xfer_msg_hdr *h, const uint8_t **body, struct xfer_msg_fin *f)
{
    if (xfer_msg_decode_fin(*body, f) < 0)
        return -XFER_EPROTO;
    *body += XFER_MSG_FIN_BODY;
    h->msg_len -= XFER_MSG_FIN_BODY;
    h->flags &= (uint16_t)~XFER_MSG_F_FIN;
    return 0;
}

static bool terminated(const uint8_t *p, size_t n)
{
    return memchr(p, 0, n) != NULL;
}

/* The short body: the fields before src, which stays as it was (unread). */
static int decode_rts_short(const struct xfer_msg_hdr *h, const uint8_t *p, struct xfer_msg_rts *r)
{
    memset(r, 0, XFER_MSG_RTS_SHORT_SIZE);
    r->local = h->flags & XFER_MSG_F_LOCAL;
    uint32_t body = rts_short_body(r->local);
    if (!r->local) {
        r->send_id = xfer_get64(p);
        p += 8;
    }
    r->tag = xfer_get64(p);
    r->len = xfer_get64(p + 8);
    if (h->msg_len - body != r->len) /* (the header bounded the bytes) */
        return -XFER_EPROTO;
    r->eager = p + 16;
    r->short_form = true;
    return 0;
}

int xfer_msg_decode_rts(const struct xfer_msg_hdr *h, const uint8_t *p, struct xfer_msg_rts *r)
{
    if (h->flags & XFER_MSG_F_SHORT) /* (xfer_msg_decode: only with EAGER) */
        return decode_rts_short(h, p, r);
    memset(r, 0, sizeof(*r));
    r->send_id = xfer_get64(p);
    r->tag = xfer_get64(p + 8);
    r->len = xfer_get64(p + 16);
    r->off = xfer_get64(p + 24);
    r->src.id = xfer_get32(p + 32);
    r->src.gen = xfer_get32(p + 36);
    r->src.kind = (enum xfer_mem_kind)xfer_get32(p + 40);
    r->src.device = (int)xfer_get32(p + 44);
    r->src.addr = xfer_get64(p + 48);
    r->src.len = xfer_get64(p + 56);
    r->src.access = xfer_get32(p + 64);
    const uint8_t *names = p + 72;
    if (!terminated(names, XFER_NAME_MAX) || !terminated(names + XFER_NAME_MAX, XFER_BLOB_MAX) ||
        !terminated(names + XFER_NAME_MAX + XFER_BLOB_MAX, XFER_BLOB_MAX))
        return -XFER_EPROTO;
    memcpy(r->src.name, names, XFER_NAME_MAX);
    memcpy(r->src.ipc, names + XFER_NAME_MAX, XFER_BLOB_MAX);
    memcpy(r->src.rkeys, names + XFER_NAME_MAX + XFER_BLOB_MAX, XFER_BLOB_MAX);
    if ((r->src.kind != XFER_MEM_HOST && r->src.kind != XFER_MEM_CUDA) ||
        (r->src.access & ~XFER_ACCESS_RW) || !xfer_range_ok(r->off, r->len, r->src.len))
        return -XFER_EPROTO;
    if (h->flags & XFER_MSG_F_EAGER) { /* the header bounded the bytes; they must be the message */
        if (h->msg_len - XFER_MSG_RTS_BODY != r->len)
            return -XFER_EPROTO;
        r->eager = p + XFER_MSG_RTS_BODY;
        r->local = h->flags & XFER_MSG_F_LOCAL;
    }
    return 0;
}

int xfer_msg_decode_fin(const uint8_t *p, struct xfer_msg_fin *f)
{
    f->send_id = xfer_get64(p);
    f->status = (int32_t)xfer_get32(p + 8);
    f->got = xfer_get64(p + 16);
    return f->status > 0 || f->status <= -XFER_ERR_MAX ? -XFER_EPROTO : 0;
}
