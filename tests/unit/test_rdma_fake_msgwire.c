/* Bad message frames from the wire over rdma (engine/rdma/rdma_msg.c), on
 * the verbs stand-in: a raw initiator (this test, speaking verbs and the CM
 * itself with the cluster secret) connects to a real engine and SENDs frames
 * no xfer node would: a request before any HELLO, HELLOs with a bad proof or
 * naming another node than the CM request, bad rdma headers, a garbage
 * engine frame, a SEND longer than the target's receive buffers. Each is
 * answered with the right error (or fails only that QP) and the engine keeps
 * serving: a valid notification afterwards is queued with the sender's id
 * from the HELLO, never from the frame. Linked with libfakeverbs.a. */
#include "msg_wire.h"
#include "rdma/rdma_auth.h"
#include "rdma/rdma_plan.h"
#include "xfer.h"

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <arpa/inet.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#define SECRET   "s3cret"
#define ME       "raw-initiator-with-a-long-node-id"
#define HDR      24                   /* rdma_msg.c's frame header */
#define RECV_BUF (HDR + (128u << 10)) /* the target's receive buffers */
#define BIG      (RECV_BUF + 4096)    /* our send buffer */
enum { T_HELLO = 1, T_REQ = 2, T_RESP = 3 };

struct raw {
    struct rdma_event_channel *ch;
    struct rdma_cm_id *id;
    struct ibv_pd *pd;
    struct ibv_cq *cq;
    struct ibv_mr *mr;
    uint8_t *buf; /* [0, BIG) sends, then 8 answer receives of 64 bytes */
    struct xfer_rdma_nonce nonce;
    uint64_t next_id;
    struct ibv_wc stash; /* an answer polled while waiting for a send's CQE */
    bool stashed;
};

static const struct xfer_rdma_self me = {
    .node_id = ME, .incarnation = 77, .secret = SECRET, .secret_len = sizeof(SECRET) - 1};

static enum rdma_cm_event_type next_event(struct raw *r)
{
    struct pollfd p = {.fd = r->ch->fd, .events = POLLIN};
    struct rdma_cm_event *ev = NULL;
    assert_int_equal(poll(&p, 1, 5000), 1);
    assert_int_equal(rdma_get_cm_event(r->ch, &ev), 0);
    enum rdma_cm_event_type t = ev->event;
    rdma_ack_cm_event(ev);
    return t;
}

static struct ibv_wc next_wc(struct raw *r)
{
    struct ibv_wc wc;
    if (r->stashed) {
        r->stashed = false;
        return r->stash;
    }
    for (int i = 0; i < 5000; i++) {
        if (ibv_poll_cq(r->cq, 1, &wc) == 1)
            return wc;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    fail_msg("no completion within 5 s");
    return wc;
}

static void post_answer_recv(struct raw *r, int k)
{
    struct ibv_sge sge = {
        .addr = (uintptr_t)r->buf + BIG + 64 * k, .length = 64, .lkey = r->mr->lkey};
    struct ibv_recv_wr wr = {.wr_id = 1000 + k, .sg_list = &sge, .num_sge = 1}, *bad;
    assert_int_equal(ibv_post_recv(r->id->qp, &wr, &bad), 0);
}

/* Connects to the engine's listener with a valid, authenticated REQ. */
static void raw_connect(struct raw *r, const struct xfer_peer_desc *target)
{
    memset(r, 0, sizeof(*r));
    struct xfer_rdma_nic_desc nic;
    assert_int_equal(xfer_rdma_nics_parse(target->nics, &nic, 1), 1);
    struct sockaddr_in dst = {.sin_family = AF_INET, .sin_port = htons(nic.cm_port)};
    uint32_t ip;
    assert_true(xfer_rdma_gid_ipv4(&nic.gid, &ip));
    dst.sin_addr.s_addr = ip;
    r->ch = rdma_create_event_channel();
    assert_int_equal(rdma_create_id(r->ch, &r->id, NULL, RDMA_PS_TCP), 0);
    assert_int_equal(rdma_resolve_addr(r->id, NULL, (struct sockaddr *)&dst, 1000), 0);
    assert_int_equal(next_event(r), RDMA_CM_EVENT_ADDR_RESOLVED);
    assert_int_equal(rdma_resolve_route(r->id, 1000), 0);
    assert_int_equal(next_event(r), RDMA_CM_EVENT_ROUTE_RESOLVED);
    r->pd = ibv_alloc_pd(r->id->verbs);
    r->cq = ibv_create_cq(r->id->verbs, 64, NULL, NULL, 0);
    r->buf = calloc(1, BIG + 8 * 64);
    r->mr = ibv_reg_mr(r->pd, r->buf, BIG + 8 * 64, IBV_ACCESS_LOCAL_WRITE);
    assert_non_null(r->mr);
    struct ibv_qp_init_attr qa = {
        .send_cq = r->cq,
        .recv_cq = r->cq,
        .qp_type = IBV_QPT_RC,
        .cap = {.max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1}};
    assert_int_equal(rdma_create_qp(r->id, r->pd, &qa), 0);
    uint8_t req[XFER_RDMA_REQ_LEN];
    assert_int_equal(xfer_rdma_nonce_new(&r->nonce), 0);
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    xfer_rdma_req_encode(&me, target->node_id, 0, (int64_t)now.tv_sec * 1000, &r->nonce, req);
    struct rdma_conn_param cp = {.private_data = req,
                                 .private_data_len = sizeof(req),
                                 .initiator_depth = 1,
                                 .responder_resources = 1,
                                 .rnr_retry_count = 7};
    assert_int_equal(rdma_connect(r->id, &cp), 0);
    assert_int_equal(next_event(r), RDMA_CM_EVENT_ESTABLISHED);
    for (int k = 0; k < 8; k++)
        post_answer_recv(r, k);
}

static void raw_close(struct raw *r)
{
    rdma_destroy_qp(r->id);
    rdma_destroy_id(r->id);
    ibv_dereg_mr(r->mr);
    ibv_destroy_cq(r->cq);
    ibv_dealloc_pd(r->pd);
    rdma_destroy_event_channel(r->ch);
    free(r->buf);
}

static void put32(uint8_t *p, uint32_t v)
{
    memcpy(p, &v, 4); /* little-endian host */
}

/* SENDs len bytes of r->buf as they are; returns the send's status. */
static enum ibv_wc_status raw_send(struct raw *r, uint32_t len)
{
    struct ibv_sge sge = {.addr = (uintptr_t)r->buf, .length = len, .lkey = r->mr->lkey};
    struct ibv_send_wr wr = {.wr_id = 1,
                             .sg_list = &sge,
                             .num_sge = 1,
                             .opcode = IBV_WR_SEND,
                             .send_flags = IBV_SEND_SIGNALED},
                       *bad;
    assert_int_equal(ibv_post_send(r->id->qp, &wr, &bad), 0);
    struct ibv_wc wc = next_wc(r);
    if (wc.wr_id != 1) { /* the answer's CQE may come before the send's */
        r->stash = wc;
        r->stashed = true;
        wc = next_wc(r);
    }
    assert_int_equal(wc.wr_id, 1);
    return wc.status;
}

/* Sends one frame (type, payload) and returns the target's answer. */
static int request(struct raw *r, int type, const void *payload, uint32_t len, uint32_t magic,
                   int32_t len_delta)
{
    uint64_t id = ++r->next_id;
    memset(r->buf, 0, HDR);
    put32(r->buf, magic);
    r->buf[4] = (uint8_t)type;
    put32(r->buf + 8, (uint32_t)id);
    put32(r->buf + 20, (uint32_t)((int32_t)len + len_delta));
    memcpy(r->buf + HDR, payload, len);
    assert_int_equal(raw_send(r, HDR + len), IBV_WC_SUCCESS);
    struct ibv_wc wc = next_wc(r);
    assert_int_equal(wc.status, IBV_WC_SUCCESS);
    assert_int_equal(wc.opcode, IBV_WC_RECV);
    assert_int_equal(wc.byte_len, HDR);
    uint8_t *a = r->buf + BIG + 64 * (wc.wr_id - 1000);
    uint32_t v[6];
    memcpy(v, a, sizeof(v));
    assert_int_equal(v[0], 0x534d5258u);
    assert_int_equal(a[4], T_RESP);
    assert_int_equal(v[2], (uint32_t)id);
    post_answer_recv(r, (int)(wc.wr_id - 1000));
    return (int32_t)v[4];
}

static int req(struct raw *r, int type, const void *payload, uint32_t len)
{
    return request(r, type, payload, len, 0x534d5258u, 0);
}

static size_t notify_frame(uint8_t *out, const char *text)
{
    struct xfer_msg_hdr h = {.kind = XFER_MSG_NOTIFY, .seq = 5, .msg_len = (uint32_t)strlen(text)};
    xfer_msg_encode(&h, NULL, text, out);
    return xfer_msg_frame_len(&h);
}

static void expect_notification(xfer_engine *e, const char *text)
{
    struct xfer_notif *n = NULL;
    for (int i = 0; i < 500 && xfer_notif_poll(e, &n, 1) == 0; i++) {
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    assert_non_null(n);
    assert_string_equal(n->node_id, ME); /* from the HELLO */
    assert_int_equal(n->incarnation, 77);
    assert_int_equal(n->len, strlen(text));
    assert_memory_equal(n->data, text, n->len);
    xfer_notif_free(n);
}

static void test_bad_frames(void **state)
{
    (void)state;
    struct xfer_engine_config cfg;
    int rc;
    xfer_engine_config_init(&cfg);
    cfg.transports = XFER_TRANSPORT_RDMA;
    cfg.node_id = "target";
    cfg.secret = SECRET;
    cfg.secret_len = sizeof(SECRET) - 1;
    xfer_engine *e = xfer_engine_new(&cfg, &rc);
    assert_non_null(e);
    struct xfer_peer_desc pd;
    xfer_engine_describe(e, &pd);
    struct raw r;
    raw_connect(&r, &pd);
    uint8_t frame[256], hello[XFER_RDMA_HELLO_MAX];
    size_t fl = notify_frame(frame, "hi");

    /* nothing reaches the engine before a valid HELLO */
    assert_int_equal(req(&r, T_REQ, frame, (uint32_t)fl), -XFER_EAUTH);
    size_t hl = xfer_rdma_hello_encode(&me, "target", &r.nonce, hello);
    hello[3] ^= 1; /* proof */
    assert_int_equal(req(&r, T_HELLO, hello, (uint32_t)hl), -XFER_EAUTH);
    struct xfer_rdma_self other = me;
    other.node_id = "another-node-entirely";
    size_t ol = xfer_rdma_hello_encode(&other, "target", &r.nonce, hello);
    assert_int_equal(req(&r, T_HELLO, hello, (uint32_t)ol), -XFER_EPROTO);
    assert_int_equal(req(&r, T_HELLO, hello, 10), -XFER_EPROTO); /* truncated */
    assert_int_equal(req(&r, T_REQ, frame, (uint32_t)fl), -XFER_EAUTH);
    hl = xfer_rdma_hello_encode(&me, "target", &r.nonce, hello);
    assert_int_equal(req(&r, T_HELLO, hello, (uint32_t)hl), 0);

    /* bad rdma headers and a garbage engine frame: EPROTO, the QP serves on */
    assert_int_equal(request(&r, T_REQ, frame, (uint32_t)fl, 0x12345678u, 0), -XFER_EPROTO);
    assert_int_equal(request(&r, T_REQ, frame, (uint32_t)fl, 0x534d5258u, -1), -XFER_EPROTO);
    assert_int_equal(req(&r, T_RESP, frame, (uint32_t)fl), -XFER_EPROTO);
    assert_int_equal(req(&r, 9, frame, (uint32_t)fl), -XFER_EPROTO);
    uint8_t junk[64];
    memset(junk, 0xa5, sizeof(junk));
    assert_int_equal(req(&r, T_REQ, junk, sizeof(junk)), -XFER_EPROTO);
    frame[0] ^= 0xff; /* engine magic */
    assert_int_equal(req(&r, T_REQ, frame, (uint32_t)fl), -XFER_EPROTO);
    frame[0] ^= 0xff;
    assert_int_equal(xfer_notif_poll(e, (struct xfer_notif *[1]){NULL}, 1), 0);
    assert_int_equal(req(&r, T_REQ, frame, (uint32_t)fl), 0);
    expect_notification(e, "hi");

    /* longer than the receive buffer: that QP fails (as on a NIC) */
    memset(r.buf, 0, HDR);
    assert_int_equal(raw_send(&r, BIG), IBV_WC_REM_INV_REQ_ERR);
    raw_close(&r);

    /* the engine still serves a new connection */
    raw_connect(&r, &pd);
    hl = xfer_rdma_hello_encode(&me, "target", &r.nonce, hello);
    assert_int_equal(req(&r, T_HELLO, hello, (uint32_t)hl), 0);
    fl = notify_frame(frame, "again");
    assert_int_equal(req(&r, T_REQ, frame, (uint32_t)fl), 0);
    expect_notification(e, "again");
    raw_close(&r);
    xfer_engine_free(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_frames),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
