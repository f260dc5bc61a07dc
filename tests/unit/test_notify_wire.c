/* Engine message frames (engine/msg_wire.c): round trip, and every
 * truncation, extension or corrupted field of a valid frame is refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "msg_wire.h"
#include "wire.h"
#include "xfer.h"

static const struct xfer_notif_fail failed[2] = {{1, -XFER_ERANGE}, {7, -XFER_ETIMEDOUT}};

static size_t sample(uint8_t *buf, struct xfer_msg_hdr *h)
{
    *h = (struct xfer_msg_hdr){.kind = XFER_MSG_NOTIFY,
                               .flags = XFER_MSG_F_BOUND,
                               .seq = 0x0102030405060708ull,
                               .status = -XFER_ERANGE,
                               .n_items = 9,
                               .n_failed = 3,
                               .n_listed = 2,
                               .msg_len = 5};
    xfer_msg_encode(h, failed, "hello", buf);
    return xfer_msg_frame_len(h);
}

static void test_roundtrip(void **state)
{
    (void)state;
    uint8_t buf[256];
    struct xfer_msg_hdr h, d;
    size_t len = sample(buf, &h);
    assert_int_equal(len, XFER_MSG_HDR_LEN + 16 + 5);
    assert_int_equal(buf[0], 'X');
    assert_int_equal(buf[8], 0x08); /* little-endian */
    assert_int_equal(xfer_msg_decode(buf, len, &d, NULL, 0), 0);
    assert_int_equal(d.seq, h.seq);
    assert_int_equal(d.status, -XFER_ERANGE);
    assert_int_equal(d.n_items, 9);
    assert_int_equal(d.n_failed, 3);
    struct xfer_notif_fail f = xfer_msg_failed_at(buf, 1);
    assert_int_equal(f.index, 7);
    assert_int_equal(f.status, -XFER_ETIMEDOUT);
    assert_memory_equal(xfer_msg_payload(buf, &d), "hello", 5);
}

static void test_truncated_and_extended(void **state)
{
    (void)state;
    uint8_t buf[256];
    struct xfer_msg_hdr h, d;
    size_t len = sample(buf, &h);
    char why[96];
    for (size_t n = 0; n < len; n++)
        assert_int_equal(xfer_msg_decode(buf, n, &d, why, sizeof(why)), -XFER_EPROTO);
    assert_int_equal(xfer_msg_decode(buf, len + 1, &d, why, sizeof(why)), -XFER_EPROTO);
}

static void test_bad_fields(void **state)
{
    (void)state;
    struct xfer_msg_hdr bad[] = {
        {.kind = 0},
        {.kind = XFER_MSG_KIND_MAX},
        {.kind = XFER_MSG_NOTIFY, .flags = 2},
        {.kind = XFER_MSG_NOTIFY, .n_items = 1},                            /* unbound with items */
        {.kind = XFER_MSG_NOTIFY, .flags = 1, .n_items = 1, .n_failed = 2}, /* failed > items */
        {.kind = XFER_MSG_NOTIFY, .flags = 1, .n_items = 2, .n_failed = 1}, /* nothing listed */
        {.kind = XFER_MSG_NOTIFY, .status = -XFER_EIO},                     /* status, no failure */
        {.kind = XFER_MSG_NOTIFY, .status = 5},
        {.kind = XFER_MSG_NOTIFY, .msg_len = XFER_NOTIFY_MAX + 1},
        {.kind = XFER_MSG_NOTIFY,
         .flags = 1,
         .n_items = 8000,
         .n_failed = 8000,
         .n_listed = XFER_NOTIFY_FAILED_MAX + 1,
         .status = -XFER_EIO},
    };
    size_t cap = XFER_MSG_HDR_LEN + 8u * (XFER_NOTIFY_FAILED_MAX + 1) + XFER_NOTIFY_MAX + 1;
    uint8_t *buf = calloc(1, cap);
    struct xfer_notif_fail *f = calloc(XFER_NOTIFY_FAILED_MAX + 1, sizeof(*f));
    for (size_t i = 0; i <= XFER_NOTIFY_FAILED_MAX; i++)
        f[i] = (struct xfer_notif_fail){(uint32_t)i, -XFER_EIO};
    char *msg = calloc(1, XFER_NOTIFY_MAX + 1);
    struct xfer_msg_hdr d;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        xfer_msg_encode(&bad[i], f, msg, buf);
        assert_int_equal(xfer_msg_decode(buf, xfer_msg_frame_len(&bad[i]), &d, NULL, 0),
                         -XFER_EPROTO);
    }
    /* a listed item without an error code */
    struct xfer_msg_hdr h = {.kind = XFER_MSG_NOTIFY,
                             .flags = 1,
                             .n_items = 2,
                             .n_failed = 1,
                             .n_listed = 1,
                             .status = -XFER_EIO};
    struct xfer_notif_fail zero = {0, 0};
    xfer_msg_encode(&h, &zero, "", buf);
    assert_int_equal(xfer_msg_decode(buf, xfer_msg_frame_len(&h), &d, NULL, 0), -XFER_EPROTO);
    free(buf);
    free(f);
    free(msg);
}

/* Random corruption never crashes and never passes a frame whose declared
 * length differs from what arrived. */
static void test_random_bytes(void **state)
{
    (void)state;
    uint8_t buf[256], good[256];
    struct xfer_msg_hdr h, d;
    size_t len = sample(good, &h);
    srand(42);
    for (int round = 0; round < 20000; round++) {
        memcpy(buf, good, len);
        buf[rand() % len] ^= (uint8_t)(1 + rand() % 255);
        if (xfer_msg_decode(buf, len, &d, NULL, 0) == 0)
            assert_int_equal(xfer_msg_frame_len(&d), len);
    }
}

/* RTS and FIN bodies: round trip; unterminated names, a range outside the
 * region and non-error statuses are refused. */
static void test_two_sided(void **state)
{
    (void)state;
    uint8_t buf[XFER_MSG_HDR_LEN + XFER_MSG_RTS_BODY];
    struct xfer_msg_rts r = {.send_id = 9, .tag = 77, .len = 100, .off = 28};
    r.src = (struct xfer_region_desc){.id = 3, .gen = 2, .len = 128, .access = XFER_ACCESS_RW};
    strcpy(r.src.name, "kv");
    strcpy(r.src.ipc, "memfd");
    size_t len = xfer_msg_encode_rts(5, &r, buf);
    assert_int_equal(len, sizeof(buf));
    struct xfer_msg_hdr h;
    struct xfer_msg_rts d;
    assert_int_equal(xfer_msg_decode(buf, len, &h, NULL, 0), 0);
    assert_int_equal(h.kind, XFER_MSG_RTS);
    assert_int_equal(xfer_msg_decode_rts(&h, xfer_msg_payload(buf, &h), &d), 0);
    assert_int_equal(d.tag, 77);
    assert_int_equal(d.src.gen, 2);
    assert_string_equal(d.src.ipc, "memfd");
    r.off = 29; /* 29 + 100 > 128 */
    xfer_msg_encode_rts(5, &r, buf);
    assert_int_equal(xfer_msg_decode_rts(&h, xfer_msg_payload(buf, &h), &d), -XFER_EPROTO);
    r.off = 0;
    xfer_msg_encode_rts(5, &r, buf);
    memset(buf + XFER_MSG_HDR_LEN + 72, 'x', XFER_NAME_MAX); /* name without NUL */
    assert_int_equal(xfer_msg_decode_rts(&h, xfer_msg_payload(buf, &h), &d), -XFER_EPROTO);
    assert_int_equal(xfer_msg_decode(buf, len - 1, &h, NULL, 0), -XFER_EPROTO);

    uint8_t fb[XFER_MSG_HDR_LEN + XFER_MSG_FIN_BODY];
    struct xfer_msg_fin f = {9, -XFER_ETRUNC, 0}, g;
    len = xfer_msg_encode_fin(6, &f, fb);
    assert_int_equal(xfer_msg_decode(fb, len, &h, NULL, 0), 0);
    assert_int_equal(xfer_msg_decode_fin(xfer_msg_payload(fb, &h), &g), 0);
    assert_int_equal(g.status, -XFER_ETRUNC);
    f.status = 3;
    xfer_msg_encode_fin(6, &f, fb);
    assert_int_equal(xfer_msg_decode_fin(xfer_msg_payload(fb, &h), &g), -XFER_EPROTO);
    fb[5] = XFER_MSG_RTS; /* a FIN-sized body under the RTS kind */
    assert_int_equal(xfer_msg_decode(fb, len, &h, NULL, 0), -XFER_EPROTO);
}

/* A frame buffer with room for the largest eager RTS, and message bytes one
 * past XFER_MSG_EAGER_MAX in a pattern (k * mul + add) a decode must return. */
static void eager_bufs(uint8_t **buf, uint8_t **data, unsigned mul, unsigned add)
{
    *buf = calloc(1, XFER_MSG_HDR_LEN + XFER_MSG_RTS_BODY + XFER_MSG_EAGER_MAX + 1);
    *data = malloc(XFER_MSG_EAGER_MAX + 1);
    assert_non_null(*buf);
    assert_non_null(*data);
    for (size_t k = 0; k <= XFER_MSG_EAGER_MAX; k++)
        (*data)[k] = (uint8_t)(k * mul + add);
}

/* Eager RTS: the message bytes ride after the body; their length must be
 * the message's and at most XFER_MSG_EAGER_MAX; the flag only on RTS. */
static void test_eager(void **state)
{
    (void)state;
    uint8_t *buf, *data;
    eager_bufs(&buf, &data, 7, 1);
    struct xfer_msg_rts r = {.send_id = 4, .tag = 1, .len = 13, .off = 0, .eager = data};
    r.src = (struct xfer_region_desc){.id = 1, .gen = 1, .len = 1 << 20, .access = XFER_ACCESS_R};
    struct xfer_msg_hdr h;
    struct xfer_msg_rts d;
    /* round trip at 0, 13 and the threshold */
    uint64_t lens[] = {0, 13, XFER_MSG_EAGER_MAX};
    for (size_t k = 0; k < 3; k++) {
        r.len = lens[k];
        size_t len = xfer_msg_encode_rts(8, &r, buf);
        assert_int_equal(len, xfer_msg_rts_frame_len(&r));
        assert_int_equal(len, XFER_MSG_HDR_LEN + XFER_MSG_RTS_BODY + lens[k]);
        assert_int_equal(xfer_msg_decode(buf, len, &h, NULL, 0), 0);
        assert_int_equal(h.flags, XFER_MSG_F_EAGER);
        assert_int_equal(xfer_msg_decode_rts(&h, xfer_msg_payload(buf, &h), &d), 0);
        assert_non_null(d.eager);
        assert_int_equal(d.len, lens[k]);
        if (lens[k])
            assert_memory_equal(d.eager, data, lens[k]);
        /* one byte short or long of what the header announced */
        assert_int_equal(xfer_msg_decode(buf, len - 1, &h, NULL, 0), -XFER_EPROTO);
        assert_int_equal(xfer_msg_decode(buf, len + 1, &h, NULL, 0), -XFER_EPROTO);
    }
    /* over the threshold: the header is refused */
    r.len = XFER_MSG_EAGER_MAX + 1;
    size_t len = xfer_msg_encode_rts(8, &r, buf);
    assert_int_equal(xfer_msg_decode(buf, len, &h, NULL, 0), -XFER_EPROTO);
    /* eager bytes that are not the message's length */
    r.len = 13;
    len = xfer_msg_encode_rts(8, &r, buf);
    xfer_put64(buf + XFER_MSG_HDR_LEN + 16, 12); /* body says 12, 13 bytes ride */
    assert_int_equal(xfer_msg_decode(buf, len, &h, NULL, 0), 0);
    assert_int_equal(xfer_msg_decode_rts(&h, xfer_msg_payload(buf, &h), &d), -XFER_EPROTO);
    /* the flag on other kinds, and an RTS longer than its body without it */
    len = xfer_msg_encode_rts(8, &r, buf);
    buf[6] = 0;
    assert_int_equal(xfer_msg_decode(buf, len, &h, NULL, 0), -XFER_EPROTO);
    uint8_t fb[XFER_MSG_HDR_LEN + XFER_MSG_FIN_BODY];
    struct xfer_msg_fin f = {4, 0, 13};
    len = xfer_msg_encode_fin(9, &f, fb);
    xfer_put16(fb + 6, XFER_MSG_F_EAGER);
    assert_int_equal(xfer_msg_decode(fb, len, &h, NULL, 0), -XFER_EPROTO);
    struct xfer_msg_hdr n = {.kind = XFER_MSG_NOTIFY, .flags = XFER_MSG_F_EAGER, .msg_len = 1};
    xfer_msg_encode(&n, NULL, "x", buf);
    assert_int_equal(xfer_msg_decode(buf, xfer_msg_frame_len(&n), &h, NULL, 0), -XFER_EPROTO);
    /* LOCAL (XFER_SEND_LOCAL): on an eager RTS only */
    r.len = 13;
    r.eager = data;
    r.local = true;
    len = xfer_msg_encode_rts(8, &r, buf);
    assert_int_equal(xfer_msg_decode(buf, len, &h, NULL, 0), 0);
    assert_int_equal(h.flags, XFER_MSG_F_EAGER | XFER_MSG_F_LOCAL);
    assert_int_equal(xfer_msg_decode_rts(&h, xfer_msg_payload(buf, &h), &d), 0);
    assert_true(d.local);
    assert_memory_equal(d.eager, data, 13);
    xfer_put16(buf + 6, XFER_MSG_F_LOCAL); /* without EAGER */
    assert_int_equal(xfer_msg_decode(buf, len, &h, NULL, 0), -XFER_EPROTO);
    xfer_put16(fb + 6, XFER_MSG_F_LOCAL); /* on a FIN */
    assert_int_equal(xfer_msg_decode(fb, XFER_MSG_HDR_LEN + XFER_MSG_FIN_BODY, &h, NULL, 0),
                     -XFER_EPROTO);
    n.flags = XFER_MSG_F_LOCAL; /* on a notification */
    xfer_msg_encode(&n, NULL, "x", buf);
    assert_int_equal(xfer_msg_decode(buf, xfer_msg_frame_len(&n), &h, NULL, 0), -XFER_EPROTO);
    r.local = false;
    /* rendezvous RTS: no bytes, eager stays NULL */
    r.eager = NULL;
    len = xfer_msg_encode_rts(8, &r, buf);
    assert_int_equal(len, XFER_MSG_HDR_LEN + XFER_MSG_RTS_BODY);
    assert_int_equal(xfer_msg_decode(buf, len, &h, NULL, 0), 0);
    assert_int_equal(xfer_msg_decode_rts(&h, xfer_msg_payload(buf, &h), &d), 0);
    assert_null(d.eager);
    free(buf);
    free(data);
}

/* The short RTS (XFER_MSG_F_SHORT): of XFER_SEND_LOCAL tag and length,
 * of a default eager SEND send id, tag and length, then the bytes; no
 * offset or region description. Only with EAGER, bytes up to
 * XFER_MSG_EAGER_MAX and exactly the message's length; the long local
 * form (a sender before the short one, or XFER_MSG_SHORT=0) still
 * decodes. */
static void test_short(void **state)
{
    (void)state;
    uint8_t *buf, *data;
    eager_bufs(&buf, &data, 5, 3);
    struct xfer_msg_rts r = {.tag = 77, .eager = data, .local = true, .short_form = true};
    struct xfer_msg_hdr h;
    struct xfer_msg_rts d;
    uint64_t lens[] = {0, 8, XFER_MSG_EAGER_MAX};
    for (size_t k = 0; k < 3; k++) {
        r.len = lens[k];
        size_t len = xfer_msg_encode_rts(8, &r, buf);
        assert_int_equal(len, xfer_msg_rts_frame_len(&r));
        assert_int_equal(len, XFER_MSG_HDR_LEN + XFER_MSG_RTS_SHORT_BODY + lens[k]);
        assert_int_equal(xfer_msg_decode(buf, len, &h, NULL, 0), 0);
        assert_int_equal(h.flags, XFER_MSG_F_EAGER | XFER_MSG_F_LOCAL | XFER_MSG_F_SHORT);
        memset(&d, 0xa5, sizeof(d));
        assert_int_equal(xfer_msg_decode_rts(&h, xfer_msg_payload(buf, &h), &d), 0);
        assert_true(d.local && d.short_form);
        assert_int_equal(d.tag, 77);
        assert_int_equal(d.len, lens[k]);
        assert_int_equal(d.send_id, 0); /* no FIN for it */
        assert_ptr_equal(d.eager, buf + XFER_MSG_HDR_LEN + XFER_MSG_RTS_SHORT_BODY);
        if (lens[k])
            assert_memory_equal(d.eager, data, lens[k]);
        assert_int_equal(xfer_msg_decode(buf, len - 1, &h, NULL, 0), -XFER_EPROTO);
        assert_int_equal(xfer_msg_decode(buf, len + 1, &h, NULL, 0), -XFER_EPROTO);
    }
    /* 8 B: 72 bytes on the wire, against 704 for the long form */
    r.len = 8;
    assert_int_equal(xfer_msg_rts_frame_len(&r), 72);
    /* one byte over the eager limit: the header is refused */
    r.len = XFER_MSG_EAGER_MAX + 1;
    size_t len = xfer_msg_encode_rts(8, &r, buf);
    assert_int_equal(len, XFER_MSG_HDR_LEN + XFER_MSG_RTS_SHORT_BODY + XFER_MSG_EAGER_MAX + 1);
    assert_int_equal(xfer_msg_decode(buf, len, &h, NULL, 0), -XFER_EPROTO);
    /* a length other than the bytes that ride */
    r.len = 13;
    len = xfer_msg_encode_rts(8, &r, buf);
    xfer_put64(buf + XFER_MSG_HDR_LEN + 8, 12);
    assert_int_equal(xfer_msg_decode(buf, len, &h, NULL, 0), 0);
    assert_int_equal(xfer_msg_decode_rts(&h, xfer_msg_payload(buf, &h), &d), -XFER_EPROTO);
    xfer_put64(buf + XFER_MSG_HDR_LEN + 8, 13);
    /* SHORT without EAGER, or on other kinds */
    uint16_t bad[] = {XFER_MSG_F_SHORT, XFER_MSG_F_LOCAL | XFER_MSG_F_SHORT, 32};
    for (size_t k = 0; k < 3; k++) {
        xfer_put16(buf + 6, bad[k]);
        assert_int_equal(xfer_msg_decode(buf, len, &h, NULL, 0), -XFER_EPROTO);
    }
    struct xfer_msg_hdr n = {.kind = XFER_MSG_NOTIFY, .flags = XFER_MSG_F_SHORT, .msg_len = 1};
    xfer_msg_encode(&n, NULL, "x", buf);
    assert_int_equal(xfer_msg_decode(buf, xfer_msg_frame_len(&n), &h, NULL, 0), -XFER_EPROTO);
    /* a default eager SEND's short form: its send id too (the FIN names it) */
    r.local = false;
    r.send_id = 99;
    len = xfer_msg_encode_rts(8, &r, buf);
    assert_int_equal(len, XFER_MSG_HDR_LEN + XFER_MSG_RTS_SHORT_FIN_BODY + 13);
    assert_int_equal(xfer_msg_decode(buf, len, &h, NULL, 0), 0);
    assert_int_equal(h.flags, XFER_MSG_F_EAGER | XFER_MSG_F_SHORT);
    memset(&d, 0xa5, sizeof(d));
    assert_int_equal(xfer_msg_decode_rts(&h, xfer_msg_payload(buf, &h), &d), 0);
    assert_true(!d.local && d.short_form);
    assert_int_equal(d.send_id, 99);
    assert_int_equal(d.tag, 77);
    assert_int_equal(d.len, 13);
    assert_ptr_equal(d.eager, buf + XFER_MSG_HDR_LEN + XFER_MSG_RTS_SHORT_FIN_BODY);
    assert_memory_equal(d.eager, data, 13);
    assert_int_equal(xfer_msg_decode(buf, len - 1, &h, NULL, 0), -XFER_EPROTO);
    xfer_put64(buf + XFER_MSG_HDR_LEN + 16, 12); /* a length other than the bytes */
    assert_int_equal(xfer_msg_decode(buf, len, &h, NULL, 0), 0);
    assert_int_equal(xfer_msg_decode_rts(&h, xfer_msg_payload(buf, &h), &d), -XFER_EPROTO);
    r.len = 8; /* 80 bytes on the wire for 8 B, against 704 */
    assert_int_equal(xfer_msg_rts_frame_len(&r), 80);
    r.len = 13;
    /* short_form asks for nothing on a rendezvous RTS (no bytes ride): long */
    r.eager = NULL;
    r.src = (struct xfer_region_desc){.id = 1, .gen = 1, .len = 1 << 20, .access = XFER_ACCESS_R};
    len = xfer_msg_encode_rts(8, &r, buf);
    assert_int_equal(len, XFER_MSG_HDR_LEN + XFER_MSG_RTS_BODY);
    assert_int_equal(xfer_msg_decode(buf, len, &h, NULL, 0), 0);
    assert_int_equal(h.flags, 0);
    r.eager = data;
    /* the long local form (an older sender) decodes as before */
    r.local = true;
    r.short_form = false;
    len = xfer_msg_encode_rts(8, &r, buf);
    assert_int_equal(len, XFER_MSG_HDR_LEN + XFER_MSG_RTS_BODY + 13);
    assert_int_equal(xfer_msg_decode(buf, len, &h, NULL, 0), 0);
    assert_int_equal(xfer_msg_decode_rts(&h, xfer_msg_payload(buf, &h), &d), 0);
    assert_true(d.local && !d.short_form);
    assert_int_equal(d.src.id, 1);
    assert_memory_equal(d.eager, data, 13);
    free(buf);
    free(data);
}

/* Decodes the RTS frame buf (len bytes) with a FIN inside, as msg.c takes
 * it apart (xfer_msg_split_fin): the FIN first, then the RTS alone. */
static void split_fin(const uint8_t *buf, size_t len, struct xfer_msg_fin *f,
                      struct xfer_msg_rts *r)
{
    struct xfer_msg_hdr h;
    assert_int_equal(xfer_msg_decode(buf, len, &h, NULL, 0), 0);
    assert_true(h.flags & XFER_MSG_F_FIN);
    const uint8_t *body = xfer_msg_payload(buf, &h);
    assert_int_equal(xfer_msg_split_fin(&h, &body, f), 0);
    assert_ptr_equal(body, xfer_msg_payload(buf, &h) + XFER_MSG_FIN_BODY);
    assert_false(h.flags & XFER_MSG_F_FIN);
    assert_int_equal(xfer_msg_decode_rts(&h, body, r), 0);
}

/* A FIN folded into the next RTS (XFER_MSG_F_FIN, tcp_msg_fold): both come
 * back out whole, for the short, the local and the long form; no fold
 * without room, of anything but a FIN, into anything but an RTS, or twice;
 * the flag on other kinds, or an RTS too short for the FIN, is refused. */
static void test_fin_inside(void **state)
{
    (void)state;
    uint8_t *buf, *data, fin[XFER_MSG_HDR_LEN + XFER_MSG_FIN_BODY];
    eager_bufs(&buf, &data, 3, 1);
    size_t cap = XFER_MSG_HDR_LEN + XFER_MSG_RTS_BODY + XFER_MSG_EAGER_MAX + 1;
    struct xfer_msg_fin f = {.send_id = 41, .status = -XFER_ETRUNC, .got = 5}, df;
    assert_int_equal(xfer_msg_encode_fin(3, &f, fin), sizeof(fin));
    struct xfer_msg_rts r = {.send_id = 9, .tag = 4, .len = 13, .eager = data, .short_form = true};
    r.src = (struct xfer_region_desc){.id = 1, .gen = 2, .len = 64, .access = XFER_ACCESS_R};
    struct xfer_msg_rts d;
    for (int form = 0; form < 3; form++) { /* short default, short local, long */
        r.local = form == 1;
        r.short_form = form < 2;
        size_t len = xfer_msg_encode_rts(8, &r, buf);
        assert_int_equal(xfer_msg_fold_fin(buf, len, len + XFER_MSG_FIN_BODY - 1, fin, sizeof(fin)),
                         0); /* no room */
        size_t grown = xfer_msg_fold_fin(buf, len, cap, fin, sizeof(fin));
        assert_int_equal(grown, len + XFER_MSG_FIN_BODY);
        assert_int_equal(xfer_msg_fold_fin(buf, grown, cap, fin, sizeof(fin)), 0); /* one FIN */
        memset(&d, 0xa5, sizeof(d));
        split_fin(buf, grown, &df, &d);
        assert_int_equal(df.send_id, 41);
        assert_int_equal(df.status, -XFER_ETRUNC);
        assert_int_equal(df.got, 5);
        assert_int_equal(d.tag, 4);
        assert_int_equal(d.len, 13);
        assert_int_equal(d.local, form == 1);
        assert_int_equal(d.send_id, form == 1 ? 0 : 9);
        assert_memory_equal(d.eager, data, 13);
        if (form == 2)
            assert_int_equal(d.src.gen, 2);
        struct xfer_msg_hdr h;
        assert_int_equal(xfer_msg_decode(buf, grown - 1, &h, NULL, 0), -XFER_EPROTO);
        /* a FIN inside with a status that is no error code: refused, h untouched */
        xfer_put32(buf + XFER_MSG_HDR_LEN + 8, 5);
        assert_int_equal(xfer_msg_decode(buf, grown, &h, NULL, 0), 0);
        const uint8_t *body = xfer_msg_payload(buf, &h);
        struct xfer_msg_hdr was = h;
        assert_int_equal(xfer_msg_split_fin(&h, &body, &df), -XFER_EPROTO);
        assert_ptr_equal(body, xfer_msg_payload(buf, &h));
        assert_memory_equal(&h, &was, sizeof(h));
    }
    /* not a FIN into an RTS: nothing changes */
    size_t len = xfer_msg_encode_rts(8, &r, buf);
    uint8_t other[XFER_MSG_HDR_LEN + XFER_MSG_FIN_BODY];
    memcpy(other, buf, sizeof(other));
    assert_int_equal(xfer_msg_fold_fin(buf, len, cap, other, sizeof(other)), 0);
    assert_int_equal(xfer_msg_fold_fin(fin, sizeof(fin), sizeof(fin) + 100, fin, sizeof(fin)), 0);
    struct xfer_msg_hdr h;
    /* the flag on a FIN or a notification, or an RTS whose length cannot hold the FIN */
    xfer_put16(fin + 6, XFER_MSG_F_FIN);
    assert_int_equal(xfer_msg_decode(fin, sizeof(fin), &h, NULL, 0), -XFER_EPROTO);
    struct xfer_msg_hdr n = {.kind = XFER_MSG_NOTIFY, .flags = XFER_MSG_F_FIN, .msg_len = 1};
    xfer_msg_encode(&n, NULL, "x", buf);
    assert_int_equal(xfer_msg_decode(buf, xfer_msg_frame_len(&n), &h, NULL, 0), -XFER_EPROTO);
    r.local = false;
    r.short_form = true;
    len = xfer_msg_encode_rts(8, &r, buf);
    xfer_put16(buf + 6, (uint16_t)(xfer_get16(buf + 6) | XFER_MSG_F_FIN)); /* no FIN bytes */
    assert_int_equal(xfer_msg_decode(buf, len, &h, NULL, 0), -XFER_EPROTO);
    free(buf);
    free(data);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),  cmocka_unit_test(test_truncated_and_extended),
        cmocka_unit_test(test_bad_fields), cmocka_unit_test(test_random_bytes),
        cmocka_unit_test(test_two_sided),  cmocka_unit_test(test_eager),
        cmocka_unit_test(test_short),      cmocka_unit_test(test_fin_inside),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
