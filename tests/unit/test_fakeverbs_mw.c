/* Unit tests of the stand-in's type-2 memory windows (tests/fakeverbs/fv_mw.c):
 * what a NIC enforces for the rdma leases (docs/rdma.md "Leases"). The pair's
 * target QP b binds windows over an MR without remote access; the initiator
 * a reads and writes through them. */
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fakeverbs_pair.h"

#define RW (IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE)

/* A window of p's target: [buf_b + off, +len) of mr, access acc. */
struct win {
    struct ibv_mr *mr; /* LOCAL_WRITE | MW_BIND, no remote access */
    struct ibv_mw *mw;
    uint32_t key;
};

static int post_on(struct ibv_qp *qp, struct ibv_send_wr *wr)
{
    struct ibv_send_wr *bad = NULL;
    return ibv_post_send(qp, wr, &bad);
}

/* Posts one local operation (a bind or an invalidation) on qp and waits for
 * its completion on cq: its status. */
static enum ibv_wc_status local_op(struct ibv_qp *qp, struct ibv_cq *cq, struct ibv_send_wr *wr,
                                   enum ibv_wc_opcode op)
{
    assert_int_equal(post_on(qp, wr), 0);
    struct ibv_wc wc = poll_one(cq);
    assert_int_equal(wc.wr_id, wr->wr_id);
    if (wc.status == IBV_WC_SUCCESS)
        assert_int_equal(wc.opcode, op);
    return wc.status;
}

static enum ibv_wc_status bind_on(struct ibv_qp *qp, struct ibv_cq *cq, struct ibv_mw *mw,
                                  uint32_t key, struct ibv_mr *mr, void *addr, uint64_t len,
                                  unsigned acc)
{
    struct ibv_send_wr wr = {
        .wr_id = 77, .opcode = IBV_WR_BIND_MW, .send_flags = IBV_SEND_SIGNALED};
    wr.bind_mw.mw = mw;
    wr.bind_mw.rkey = key;
    wr.bind_mw.bind_info = (struct ibv_mw_bind_info){
        .mr = mr, .addr = (uintptr_t)addr, .length = len, .mw_access_flags = acc};
    return local_op(qp, cq, &wr, IBV_WC_BIND_MW);
}

static enum ibv_wc_status invalidate_on(struct ibv_qp *qp, struct ibv_cq *cq, uint32_t key)
{
    struct ibv_send_wr wr = {
        .wr_id = 78, .opcode = IBV_WR_LOCAL_INV, .send_flags = IBV_SEND_SIGNALED};
    wr.invalidate_rkey = key;
    return local_op(qp, cq, &wr, IBV_WC_LOCAL_INV);
}

/* A fresh pair with a window of b allocated over buf_b, not bound yet. */
static void pair_with_mw(struct pair *p, struct win *w)
{
    pair_connect(p, 1, 8, 64, NULL);
    w->mr =
        ibv_reg_mr(p->pd, p->buf_b, sizeof(p->buf_b), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
    assert_non_null(w->mr);
    w->mw = ibv_alloc_mw(p->pd, IBV_MW_TYPE_2);
    assert_non_null(w->mw);
    w->key = ibv_inc_rkey(w->mw->rkey);
}

/* A fresh pair with a window bound on b over buf_b[1024, 3072). */
static void pair_with_window(struct pair *p, struct win *w, unsigned acc)
{
    pair_with_mw(p, w);
    assert_int_equal(bind_on(p->b->qp, p->cqb, w->mw, w->key, w->mr, p->buf_b + 1024, 2048, acc),
                     IBV_WC_SUCCESS);
}

static void win_free(struct pair *p, struct win *w)
{
    ibv_dealloc_mw(w->mw);
    assert_int_equal(ibv_dereg_mr(w->mr), 0);
    pair_free(p);
}

/* One READ (or WRITE) of len bytes at buf_b + off through key; its status. */
static enum ibv_wc_status access_b(struct pair *p, enum ibv_wr_opcode op, uint64_t off,
                                   uint32_t len, uint32_t key)
{
    assert_int_equal(
        post(p, op, 5, p->buf_a, len, p->mra->lkey, (uintptr_t)p->buf_b + off, key, true), 0);
    struct ibv_wc wc = poll_one(p->cqa);
    assert_int_equal(wc.wr_id, 5);
    return wc.status;
}

static void test_mw_serves_inside(void **state)
{
    (void)state;
    struct pair p;
    struct win w;
    pair_with_window(&p, &w, RW);
    for (int i = 0; i < 2048; i++)
        p.buf_b[1024 + i] = (char)(i * 13);
    assert_int_equal(access_b(&p, IBV_WR_RDMA_READ, 1024, 2048, w.key), IBV_WC_SUCCESS);
    assert_memory_equal(p.buf_a, p.buf_b + 1024, 2048);
    memset(p.buf_a, 0x5a, 100);
    assert_int_equal(access_b(&p, IBV_WR_RDMA_WRITE, 2000, 100, w.key), IBV_WC_SUCCESS);
    assert_int_equal(p.buf_b[2000], 0x5a);
    assert_int_equal(p.buf_b[2099], 0x5a);
    /* The MR cannot go while the window is bound to it. */
    assert_int_equal(ibv_dereg_mr(w.mr), EBUSY);
    /* Invalidated: refused at once; rebound with a new tag: served again,
     * the old tag stays refused. */
    assert_int_equal(invalidate_on(p.b->qp, p.cqb, w.key), IBV_WC_SUCCESS);
    assert_int_equal(access_b(&p, IBV_WR_RDMA_READ, 1024, 8, w.key), IBV_WC_REM_ACCESS_ERR);
    assert_int_equal(qp_state(p.a->qp), IBV_QPS_ERR);
    win_free(&p, &w);

    pair_with_window(&p, &w, RW);
    uint32_t old = w.key;
    assert_int_equal(invalidate_on(p.b->qp, p.cqb, w.key), IBV_WC_SUCCESS);
    w.key = ibv_inc_rkey(old);
    assert_int_equal(bind_on(p.b->qp, p.cqb, w.mw, w.key, w.mr, p.buf_b, 512, RW), IBV_WC_SUCCESS);
    assert_int_equal(access_b(&p, IBV_WR_RDMA_READ, 0, 512, w.key), IBV_WC_SUCCESS);
    assert_int_equal(access_b(&p, IBV_WR_RDMA_READ, 0, 8, old), IBV_WC_REM_ACCESS_ERR);
    win_free(&p, &w);
}

/* Every remote access a NIC refuses through a window (each on a fresh pair:
 * the refusal puts the requester's QP in error). */
static void test_mw_refusals(void **state)
{
    (void)state;
    const struct {
        const char *what;
        unsigned acc;
        enum ibv_wr_opcode op;
        uint64_t off;
        uint32_t len;
        int key; /* 0 the window's, 1 the MR's own rkey, 2 the key before the bind */
    } cases[] = {
        {"before the window", RW, IBV_WR_RDMA_READ, 1000, 100, 0},
        {"past its end", RW, IBV_WR_RDMA_READ, 3000, 100, 0},
        {"write to a read window", IBV_ACCESS_REMOTE_READ, IBV_WR_RDMA_WRITE, 1024, 8, 0},
        {"read of a write window", IBV_ACCESS_REMOTE_WRITE, IBV_WR_RDMA_READ, 1024, 8, 0},
        {"the MR's rkey (no remote access)", RW, IBV_WR_RDMA_READ, 1024, 8, 1},
        {"the unbound key", RW, IBV_WR_RDMA_READ, 1024, 8, 2},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct pair p;
        struct win w;
        pair_with_window(&p, &w, cases[i].acc);
        uint32_t key = cases[i].key == 0 ? w.key : cases[i].key == 1 ? w.mr->rkey : w.key - 1;
        print_message("  %s\n", cases[i].what);
        assert_int_equal(access_b(&p, cases[i].op, cases[i].off, cases[i].len, key),
                         IBV_WC_REM_ACCESS_ERR);
        win_free(&p, &w);
    }
}

/* Type 2: only the QP the window was bound on may use it, even in the
 * same PD; destroying that QP unbinds it. */
static void test_mw_bound_to_qp(void **state)
{
    (void)state;
    struct pair p, q;
    struct win w;
    pair_with_window(&p, &w, RW);
    pair_shared_pd = p.pd;
    pair_connect(&q, 1, 8, 64, NULL);
    assert_int_equal(access_b(&q, IBV_WR_RDMA_READ, 1024, 8, w.key), IBV_WC_REM_ACCESS_ERR);
    assert_int_equal(access_b(&p, IBV_WR_RDMA_READ, 1024, 8, w.key), IBV_WC_SUCCESS);
    pair_free(&q);
    pair_shared_pd = NULL;
    rdma_destroy_qp(p.b);
    assert_int_equal(ibv_dereg_mr(w.mr), 0); /* no longer bound */
    w.mr = ibv_reg_mr(p.pd, p.buf_b, 16, IBV_ACCESS_LOCAL_WRITE);
    win_free(&p, &w);
}

/* Binds a NIC refuses: IBV_WC_MW_BIND_ERR and the QP in error (each on a
 * fresh pair). */
static void test_mw_bind_errors(void **state)
{
    (void)state;
    const struct {
        const char *what;
        bool mw_bind;  /* the MR allows binding windows */
        uint64_t len;  /* of the bind, over a 4096-byte MR */
        bool twice;    /* bound already, not invalidated since */
        bool other_ix; /* the key of another window's index */
    } cases[] = {
        {"MR without IBV_ACCESS_MW_BIND", false, 1024, false, false},
        {"past the MR", true, 8192, false, false},
        {"bound twice without an invalidation", true, 1024, true, false},
        {"the key of another window's index", true, 1024, false, true},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct pair p;
        pair_connect(&p, 1, 8, 64, NULL);
        print_message("  %s\n", cases[i].what);
        int mr_acc = IBV_ACCESS_LOCAL_WRITE | (cases[i].mw_bind ? IBV_ACCESS_MW_BIND : 0);
        struct ibv_mr *mr = ibv_reg_mr(p.pd, p.buf_b, 4096, mr_acc);
        struct ibv_mw *mw = ibv_alloc_mw(p.pd, IBV_MW_TYPE_2);
        uint32_t key = ibv_inc_rkey(mw->rkey);
        if (cases[i].twice) {
            assert_int_equal(bind_on(p.b->qp, p.cqb, mw, key, mr, p.buf_b, cases[i].len, RW), 0);
            key = ibv_inc_rkey(key);
        }
        if (cases[i].other_ix)
            key = mw->rkey + 0x100;
        assert_int_equal(bind_on(p.b->qp, p.cqb, mw, key, mr, p.buf_b, cases[i].len, RW),
                         IBV_WC_MW_BIND_ERR);
        assert_int_equal(qp_state(p.b->qp), IBV_QPS_ERR);
        ibv_dealloc_mw(mw);
        assert_int_equal(ibv_dereg_mr(mr), 0);
        pair_free(&p);
    }
    /* Type 1 windows are not modelled. */
    struct pair p;
    pair_connect(&p, 1, 8, 64, NULL);
    errno = 0;
    assert_null(ibv_alloc_mw(p.pd, IBV_MW_TYPE_1));
    assert_int_equal(errno, EOPNOTSUPP);
    struct ibv_device_attr da;
    assert_int_equal(ibv_query_device(p.pd->context, &da), 0);
    assert_true(da.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B);
    assert_true(da.max_mw > 0);
    pair_free(&p);
}

/* The stand-in's faults for tests of QP churn around binds (fv_mw.c,
 * XFER_FAKEVERBS_MW_FAULT): each fires once, on the N-th bind posted (post)
 * or run (bind, kill), counted from fv_mw_fault_set. */
void fv_mw_fault_set(const char *spec);

static void test_mw_faults(void **state)
{
    (void)state;
    struct pair p;
    struct win w;
    /* post:1: the post of the first bind is refused (ENOMEM); the next goes */
    fv_mw_fault_set("post:1");
    pair_with_mw(&p, &w);
    struct ibv_send_wr wr = {
        .wr_id = 77, .opcode = IBV_WR_BIND_MW, .send_flags = IBV_SEND_SIGNALED};
    wr.bind_mw.mw = w.mw;
    wr.bind_mw.rkey = w.key;
    wr.bind_mw.bind_info = (struct ibv_mw_bind_info){
        .mr = w.mr, .addr = (uintptr_t)p.buf_b, .length = 1024, .mw_access_flags = RW};
    assert_int_equal(post_on(p.b->qp, &wr), ENOMEM);
    assert_int_equal(bind_on(p.b->qp, p.cqb, w.mw, w.key, w.mr, p.buf_b, 1024, RW), IBV_WC_SUCCESS);
    assert_int_equal(access_b(&p, IBV_WR_RDMA_READ, 0, 64, w.key), IBV_WC_SUCCESS);
    win_free(&p, &w);
    /* bind:1: the bind fails on the NIC, its QP in error; kill:1: the QP
     * loses its link before the bind runs: flushed as the oldest WR of a
     * vanished peer, and the peer's QP fails too */
    const struct {
        const char *spec;
        enum ibv_wc_status st;
        bool peer_down;
    } cases[] = {{"bind:1", IBV_WC_MW_BIND_ERR, false}, {"kill:1", IBV_WC_RETRY_EXC_ERR, true}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        fv_mw_fault_set(cases[i].spec);
        pair_with_mw(&p, &w);
        assert_int_equal(bind_on(p.b->qp, p.cqb, w.mw, w.key, w.mr, p.buf_b, 1024, RW),
                         cases[i].st);
        assert_int_equal(qp_state(p.b->qp), IBV_QPS_ERR);
        for (int k = 0; cases[i].peer_down && k < 5000 && qp_state(p.a->qp) != IBV_QPS_ERR; k++) {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL); /* polling the peer's state, bounded */
        }
        if (cases[i].peer_down)
            assert_int_equal(qp_state(p.a->qp), IBV_QPS_ERR);
        win_free(&p, &w);
    }
    fv_mw_fault_set(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mw_serves_inside), cmocka_unit_test(test_mw_refusals),
        cmocka_unit_test(test_mw_bound_to_qp),   cmocka_unit_test(test_mw_bind_errors),
        cmocka_unit_test(test_mw_faults),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
