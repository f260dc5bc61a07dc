/* Data header encode/decode and overflow-safe bounds arithmetic. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "transport.h"
#include "wire.h"
#include "xfer.h"

static struct xfer_wire_hdr sample(void)
{
    struct xfer_wire_hdr h;
    memset(&h, 0, sizeof(h)); /* padding too: the test compares whole structs */
    h = (struct xfer_wire_hdr){
        .version = XFER_PROTO_VERSION,
        .op = XFER_WIRE_WRITE_REQ,
        .req_id = 0x0102030405060708ull,
        .region_id = 0xa1b2c3d4u,
        .gen = 7,
        .offset = 0xfffffffff0ull,
        .length = 4096,
        .payload = 4096,
    };
    return h;
}

static void test_roundtrip_is_little_endian(void **state)
{
    (void)state;
    struct xfer_wire_hdr h = sample(), d;
    uint8_t buf[XFER_WIRE_HDR_LEN];
    xfer_wire_encode(&h, buf);
    assert_int_equal(buf[0], 'R');
    assert_int_equal(buf[3], 'X');
    assert_int_equal(buf[8], 0x08); /* req_id low byte first */
    assert_int_equal(buf[15], 0x01);
    assert_int_equal(xfer_wire_decode(buf, 1 << 20, &d), 0);
    assert_int_equal(d.req_id, h.req_id);
    assert_int_equal(d.region_id, h.region_id);
    assert_int_equal(d.gen, h.gen);
    assert_int_equal(d.offset, h.offset);
    assert_int_equal(d.length, h.length);
    assert_int_equal(d.payload, h.payload);
    assert_int_equal(d.op, h.op);
}

static void test_rejects_bad_magic_version_op(void **state)
{
    (void)state;
    struct xfer_wire_hdr h = sample(), d;
    uint8_t buf[XFER_WIRE_HDR_LEN];
    xfer_wire_encode(&h, buf);
    buf[0] ^= 1;
    assert_int_equal(xfer_wire_decode(buf, 1 << 20, &d), -XFER_EPROTO);
    h.version = 99;
    xfer_wire_encode(&h, buf);
    assert_int_equal(xfer_wire_decode(buf, 1 << 20, &d), -XFER_EPROTO);
    h = sample();
    h.op = XFER_WIRE_OP_MAX;
    xfer_wire_encode(&h, buf);
    assert_int_equal(xfer_wire_decode(buf, 1 << 20, &d), -XFER_EPROTO);
    h.op = 0;
    xfer_wire_encode(&h, buf);
    assert_int_equal(xfer_wire_decode(buf, 1 << 20, &d), -XFER_EPROTO);
    h = sample();
    h.flags = 4; /* only XFER_WIRE_F_SEQ and XFER_WIRE_F_NORESP are defined */
    xfer_wire_encode(&h, buf);
    assert_int_equal(xfer_wire_decode(buf, 1 << 20, &d), -XFER_EPROTO);
    /* NORESP only on a MSG_REQ (the RTS of a locally completed SEND) */
    h = sample();
    h.flags = XFER_WIRE_F_NORESP;
    xfer_wire_encode(&h, buf);
    assert_int_equal(xfer_wire_decode(buf, 1 << 20, &d), -XFER_EPROTO);
    h = (struct xfer_wire_hdr){.version = XFER_PROTO_VERSION,
                               .op = XFER_WIRE_MSG_REQ,
                               .flags = XFER_WIRE_F_NORESP,
                               .req_id = 9,
                               .length = 100,
                               .payload = 100};
    xfer_wire_encode(&h, buf);
    assert_int_equal(xfer_wire_decode(buf, 1 << 20, &d), 0);
    assert_int_equal(d.flags, XFER_WIRE_F_NORESP);
    h.op = XFER_WIRE_MSG_RESP;
    h.length = h.payload = 0;
    xfer_wire_encode(&h, buf);
    assert_int_equal(xfer_wire_decode(buf, 1 << 20, &d), -XFER_EPROTO);
}

/* FENCE: no payload, no length, and a batch number (issue 18 item 7). */
static void test_fence_frame(void **state)
{
    (void)state;
    uint8_t buf[XFER_WIRE_HDR_LEN];
    struct xfer_wire_hdr h = {.version = XFER_PROTO_VERSION,
                              .op = XFER_WIRE_FENCE,
                              .flags = XFER_WIRE_F_SEQ,
                              .req_id = 77ull << 32},
                         d;
    xfer_wire_encode(&h, buf);
    assert_int_equal(xfer_wire_decode(buf, 1 << 20, &d), 0);
    assert_int_equal(xfer_wire_seq(&d), 77);
    struct xfer_wire_hdr bad = h;
    bad.req_id = 5; /* no batch number */
    xfer_wire_encode(&bad, buf);
    assert_int_equal(xfer_wire_decode(buf, 1 << 20, &d), -XFER_EPROTO);
    bad = h;
    bad.flags = 0;
    xfer_wire_encode(&bad, buf);
    assert_int_equal(xfer_wire_decode(buf, 1 << 20, &d), -XFER_EPROTO);
    bad = h;
    bad.length = bad.payload = 8;
    xfer_wire_encode(&bad, buf);
    assert_int_equal(xfer_wire_decode(buf, 1 << 20, &d), -XFER_EPROTO);
    /* A WRITE_REQ with F_SEQ carries its batch's number; without, none. */
    h = sample();
    h.flags = XFER_WIRE_F_SEQ;
    h.req_id = 9ull << 32 | 3;
    xfer_wire_encode(&h, buf);
    assert_int_equal(xfer_wire_decode(buf, 1 << 20, &d), 0);
    assert_int_equal(xfer_wire_seq(&d), 9);
    h.flags = 0;
    xfer_wire_encode(&h, buf);
    assert_int_equal(xfer_wire_decode(buf, 1 << 20, &d), 0);
    assert_int_equal(xfer_wire_seq(&d), 0);
}

static void test_payload_must_match_op(void **state)
{
    (void)state;
    struct xfer_wire_hdr h = sample(), d;
    uint8_t buf[XFER_WIRE_HDR_LEN];
    h.payload = 4095; /* WRITE_REQ payload must equal length */
    xfer_wire_encode(&h, buf);
    assert_int_equal(xfer_wire_decode(buf, 1 << 20, &d), -XFER_EPROTO);
    h = sample();
    h.op = XFER_WIRE_READ_REQ; /* requests to read carry nothing */
    xfer_wire_encode(&h, buf);
    assert_int_equal(xfer_wire_decode(buf, 1 << 20, &d), -XFER_EPROTO);
    h.payload = 0;
    xfer_wire_encode(&h, buf);
    assert_int_equal(xfer_wire_decode(buf, 1 << 20, &d), 0);
    h.op = XFER_WIRE_READ_RESP; /* an error answer carries no data */
    h.status = -XFER_EACCES;
    xfer_wire_encode(&h, buf);
    assert_int_equal(xfer_wire_decode(buf, 1 << 20, &d), 0);
    assert_int_equal(d.status, -XFER_EACCES);
    h.payload = 4096;
    xfer_wire_encode(&h, buf);
    assert_int_equal(xfer_wire_decode(buf, 1 << 20, &d), -XFER_EPROTO);
    h.status = 5; /* positive status is not a code */
    h.payload = 0;
    xfer_wire_encode(&h, buf);
    assert_int_equal(xfer_wire_decode(buf, 1 << 20, &d), -XFER_EPROTO);
}

/* Positive statuses: only a MSG_RESP's XFER_MSG_DELIVERED (1, an eager
 * message consumed on arrival) and XFER_MSG_NOT_BEHIND (2, a notification
 * whose data had not all landed before it) decode. */
static void test_msg_resp_answers(void **state)
{
    (void)state;
    struct xfer_wire_hdr h = sample(), d;
    uint8_t buf[XFER_WIRE_HDR_LEN];
    h.op = XFER_WIRE_MSG_RESP;
    h.payload = 0;
    for (int st = 0; st <= 3; st++) {
        h.status = st;
        xfer_wire_encode(&h, buf);
        assert_int_equal(xfer_wire_decode(buf, 1 << 20, &d),
                         st <= XFER_MSG_NOT_BEHIND ? 0 : -XFER_EPROTO);
    }
    h.op = XFER_WIRE_WRITE_RESP; /* a data answer is 0 or an error code */
    h.status = XFER_MSG_DELIVERED;
    xfer_wire_encode(&h, buf);
    assert_int_equal(xfer_wire_decode(buf, 1 << 20, &d), -XFER_EPROTO);
}

static void test_payload_limit(void **state)
{
    (void)state;
    struct xfer_wire_hdr h = sample(), d;
    uint8_t buf[XFER_WIRE_HDR_LEN];
    xfer_wire_encode(&h, buf);
    assert_int_equal(xfer_wire_decode(buf, 4096, &d), 0);
    assert_int_equal(xfer_wire_decode(buf, 4095, &d), -XFER_EPROTO);
}

static void test_range_edges(void **state)
{
    (void)state;
    assert_true(xfer_range_ok(0, 0, 0));
    assert_true(xfer_range_ok(10, 0, 10)); /* zero length at the exact end */
    assert_false(xfer_range_ok(11, 0, 10));
    assert_true(xfer_range_ok(0, 10, 10)); /* exact end */
    assert_false(xfer_range_ok(1, 10, 10));
    assert_true(xfer_range_ok(9, 1, 10));
    assert_false(xfer_range_ok(UINT64_MAX, 2, 10)); /* off+len wraps */
    assert_false(xfer_range_ok(2, UINT64_MAX, 10));
    assert_false(xfer_range_ok(UINT64_MAX - 1, 4, UINT64_MAX)); /* wraps near max */
    assert_true(xfer_range_ok(UINT64_MAX - 4, 4, UINT64_MAX));
}

static void test_parsers(void **state)
{
    (void)state;
    unsigned m;
    assert_int_equal(xfer_transports_parse("tcp,ipc", &m), 0);
    assert_int_equal(m, XFER_TRANSPORT_TCP | XFER_TRANSPORT_IPC);
    assert_int_equal(xfer_transports_parse("tcp,bogus", &m), -XFER_EINVAL);
    char buf[32];
    assert_int_equal(xfer_transports_format(XFER_TRANSPORT_ALL, buf, sizeof(buf)), 0);
    assert_string_equal(buf, "ipc,rdma,tcpx,tcp");
    assert_int_equal(xfer_transports_format(XFER_TRANSPORT_ALL, buf, 5), -XFER_ENOSPC);
    assert_int_equal(xfer_access_parse("rw", &m), 0);
    assert_int_equal(m, XFER_ACCESS_RW);
    assert_int_equal(xfer_access_parse("x", &m), -XFER_EINVAL);
    assert_string_equal(xfer_access_str(XFER_ACCESS_R), "r");
    assert_string_equal(xfer_strerror(-XFER_EACCES), xfer_strerror(XFER_EACCES));
    assert_string_equal(xfer_strerror(-9999), "unknown error");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_is_little_endian),
        cmocka_unit_test(test_rejects_bad_magic_version_op),
        cmocka_unit_test(test_payload_must_match_op),
        cmocka_unit_test(test_fence_frame),
        cmocka_unit_test(test_msg_resp_answers),
        cmocka_unit_test(test_payload_limit),
        cmocka_unit_test(test_range_edges),
        cmocka_unit_test(test_parsers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
