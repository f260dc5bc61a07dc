/* A connected RC pair over the verbs stand-in, inside one process, for the
 * stand-in's unit tests (test_fakeverbs.c, test_fakeverbs_mw.c). Include
 * after <cmocka.h>. */
#ifndef FAKEVERBS_PAIR_H
#define FAKEVERBS_PAIR_H

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <arpa/inet.h>
#include <poll.h>
#include <string.h>
#include <time.h>

static struct rdma_cm_event *wait_event(struct rdma_event_channel *ch, int ms)
{
    struct pollfd p = {.fd = ch->fd, .events = POLLIN};
    struct rdma_cm_event *ev = NULL;
    if (poll(&p, 1, ms) != 1 || rdma_get_cm_event(ch, &ev))
        return NULL;
    return ev;
}

static enum rdma_cm_event_type expect_event(struct rdma_event_channel *ch, struct rdma_cm_id **id)
{
    struct rdma_cm_event *ev = wait_event(ch, 5000);
    assert_non_null(ev);
    enum rdma_cm_event_type t = ev->event;
    if (id)
        *id = ev->id;
    rdma_ack_cm_event(ev);
    return t;
}

/* A connected pair inside this process: a (initiator) and b (target). */
struct pair {
    struct rdma_event_channel *cha, *chb;
    struct rdma_cm_id *listen, *a, *b;
    struct ibv_pd *pd;
    struct ibv_cq *cqa, *cqb;
    char buf_a[8192], buf_b[8192];
    struct ibv_mr *mra, *mrb;
};

/* rnr_retry_count the target accepts with: the initiator QP's rnr_retry. */
static uint8_t pair_rnr_retry;
/* When set, pairs use this PD (two connections of one PD) and keep it. */
static struct ibv_pd *pair_shared_pd;

static int pair_connect(struct pair *p, uint8_t responder_resources, int sq_depth, int cqe,
                        const char *reject_with)
{
    memset(p, 0, sizeof(*p));
    p->cha = rdma_create_event_channel();
    p->chb = rdma_create_event_channel();
    assert_int_equal(rdma_create_id(p->chb, &p->listen, NULL, RDMA_PS_TCP), 0);
    struct sockaddr_in sin = {.sin_family = AF_INET};
    inet_aton("127.0.0.1", &sin.sin_addr);
    assert_int_equal(rdma_bind_addr(p->listen, (struct sockaddr *)&sin), 0);
    assert_int_equal(rdma_listen(p->listen, 8), 0);
    sin.sin_port = rdma_get_src_port(p->listen);
    assert_int_not_equal(sin.sin_port, 0);
    assert_non_null(p->listen->verbs);
    p->pd = pair_shared_pd ? pair_shared_pd : ibv_alloc_pd(p->listen->verbs);
    p->cqa = ibv_create_cq(p->listen->verbs, cqe, NULL, NULL, 0);
    p->cqb = ibv_create_cq(p->listen->verbs, 16, NULL, NULL, 0);
    assert_int_equal(rdma_create_id(p->cha, &p->a, NULL, RDMA_PS_TCP), 0);
    assert_int_equal(rdma_resolve_addr(p->a, NULL, (struct sockaddr *)&sin, 1000), 0);
    assert_int_equal(expect_event(p->cha, NULL), RDMA_CM_EVENT_ADDR_RESOLVED);
    assert_int_equal(rdma_resolve_route(p->a, 1000), 0);
    assert_int_equal(expect_event(p->cha, NULL), RDMA_CM_EVENT_ROUTE_RESOLVED);
    struct ibv_qp_init_attr qa = {.send_cq = p->cqa,
                                  .recv_cq = p->cqa,
                                  .qp_type = IBV_QPT_RC,
                                  .cap = {.max_send_wr = (uint32_t)sq_depth,
                                          .max_recv_wr = 4,
                                          .max_send_sge = 2,
                                          .max_recv_sge = 1}};
    assert_int_equal(rdma_create_qp(p->a, p->pd, &qa), 0);
    struct rdma_conn_param cp = {.private_data = "hello",
                                 .private_data_len = 6,
                                 .initiator_depth = 1,
                                 .responder_resources = 1};
    assert_int_equal(rdma_connect(p->a, &cp), 0);
    struct rdma_cm_event *ev = wait_event(p->chb, 5000);
    assert_non_null(ev);
    assert_int_equal(ev->event, RDMA_CM_EVENT_CONNECT_REQUEST);
    assert_ptr_equal(ev->listen_id, p->listen);
    assert_int_equal(ev->param.conn.private_data_len, 6);
    assert_string_equal(ev->param.conn.private_data, "hello");
    p->b = ev->id;
    rdma_ack_cm_event(ev);
    if (reject_with) {
        rdma_reject(p->b, reject_with, (uint8_t)(strlen(reject_with) + 1));
        rdma_destroy_id(p->b);
        p->b = NULL;
        ev = wait_event(p->cha, 5000);
        assert_non_null(ev);
        assert_int_equal(ev->event, RDMA_CM_EVENT_REJECTED);
        assert_string_equal(ev->param.conn.private_data, reject_with);
        rdma_ack_cm_event(ev);
        return -1;
    }
    qa.send_cq = qa.recv_cq = p->cqb;
    assert_int_equal(rdma_create_qp(p->b, p->pd, &qa), 0);
    struct rdma_conn_param ap = {.private_data = "welcome",
                                 .private_data_len = 8,
                                 .responder_resources = responder_resources,
                                 .rnr_retry_count = pair_rnr_retry};
    assert_int_equal(rdma_accept(p->b, &ap), 0);
    assert_int_equal(expect_event(p->chb, NULL), RDMA_CM_EVENT_ESTABLISHED);
    ev = wait_event(p->cha, 5000);
    assert_non_null(ev);
    assert_int_equal(ev->event, RDMA_CM_EVENT_ESTABLISHED);
    assert_string_equal(ev->param.conn.private_data, "welcome");
    rdma_ack_cm_event(ev);
    p->mra = ibv_reg_mr(p->pd, p->buf_a, sizeof(p->buf_a),
                        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
    p->mrb = ibv_reg_mr(p->pd, p->buf_b, sizeof(p->buf_b),
                        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
    assert_non_null(p->mra);
    assert_non_null(p->mrb);
    return 0;
}

static void pair_free(struct pair *p)
{
    if (p->a)
        rdma_destroy_id(p->a);
    if (p->b)
        rdma_destroy_id(p->b);
    rdma_destroy_id(p->listen);
    if (p->mra)
        ibv_dereg_mr(p->mra);
    if (p->mrb)
        ibv_dereg_mr(p->mrb);
    ibv_destroy_cq(p->cqa);
    ibv_destroy_cq(p->cqb);
    if (p->pd != pair_shared_pd)
        ibv_dealloc_pd(p->pd);
    rdma_destroy_event_channel(p->cha);
    rdma_destroy_event_channel(p->chb);
}

static int post(struct pair *p, enum ibv_wr_opcode op, uint64_t id, void *local, uint32_t len,
                uint32_t lkey, uint64_t raddr, uint32_t rkey, bool signaled)
{
    struct ibv_sge sge = {.addr = (uintptr_t)local, .length = len, .lkey = lkey};
    struct ibv_send_wr wr = {.wr_id = id,
                             .sg_list = &sge,
                             .num_sge = 1,
                             .opcode = op,
                             .send_flags = signaled ? IBV_SEND_SIGNALED : 0};
    wr.wr.rdma.remote_addr = raddr;
    wr.wr.rdma.rkey = rkey;
    struct ibv_send_wr *bad = NULL;
    return ibv_post_send(p->a->qp, &wr, &bad);
}

static enum ibv_qp_state qp_state(struct ibv_qp *qp)
{
    struct ibv_qp_attr a;
    struct ibv_qp_init_attr ia;
    assert_int_equal(ibv_query_qp(qp, &a, IBV_QP_STATE, &ia), 0);
    return a.qp_state;
}

static struct ibv_wc poll_one(struct ibv_cq *cq)
{
    struct ibv_wc wc;
    for (int i = 0; i < 5000; i++) {
        int n = ibv_poll_cq(cq, 1, &wc);
        assert_true(n >= 0);
        if (n == 1)
            return wc;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    fail_msg("no completion within 5 s");
    return wc;
}

#endif
