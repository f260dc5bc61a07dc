/* Unit tests of the verbs/rdma_cm stand-in itself: it must behave like a
 * NIC where the transport relies on it (linked with libfakeverbs.a). */
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "fakeverbs_pair.h"

static void test_devices(void **state)
{
    (void)state;
    int n = -1;
    struct ibv_device **list = ibv_get_device_list(&n);
    assert_non_null(list);
    assert_int_equal(n, 1);
    assert_string_equal(ibv_get_device_name(list[0]), "fake0");
    struct ibv_context *c = ibv_open_device(list[0]);
    assert_non_null(c);
    struct ibv_port_attr pa;
    assert_int_equal(ibv_query_port(c, 1, &pa), 0);
    assert_int_equal(pa.state, IBV_PORT_ACTIVE);
    assert_int_equal(pa.link_layer, IBV_LINK_LAYER_ETHERNET);
    assert_int_not_equal(ibv_query_port(c, 2, &pa), 0);
    struct ibv_gid_entry ge;
    assert_int_equal(ibv_query_gid_ex(c, 1, 1, &ge, 0), 0);
    assert_int_equal(ge.gid_type, IBV_GID_TYPE_ROCE_V2);
    assert_int_equal(ge.gid.raw[10], 0xff);
    assert_int_not_equal(ibv_query_gid_ex(c, 1, 7, &ge, 0), 0);
    ibv_close_device(c);
    ibv_free_device_list(list);
}

static void test_no_device(void **state)
{
    (void)state;
    pid_t pid = fork();
    if (pid == 0) { /* the device count is read once: decide it in a child */
        setenv("XFER_FAKEVERBS_DEVICES", "0", 1);
        int n = 5;
        errno = 0;
        _exit(ibv_get_device_list(&n) == NULL && n == 0 && errno == ENOSYS ? 0 : 1);
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

static void test_qp_state_machine(void **state)
{
    (void)state;
    struct ibv_device **list = ibv_get_device_list(NULL);
    struct ibv_context *c = ibv_open_device(list[0]);
    struct ibv_pd *pd = ibv_alloc_pd(c);
    struct ibv_cq *cq = ibv_create_cq(c, 4, NULL, NULL, 0);
    struct ibv_qp_init_attr ia = {.send_cq = cq,
                                  .recv_cq = cq,
                                  .qp_type = IBV_QPT_RC,
                                  .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1}};
    struct ibv_qp *qp = ibv_create_qp(pd, &ia);
    assert_non_null(qp);
    ia.qp_type = IBV_QPT_UD;
    assert_null(ibv_create_qp(pd, &ia));
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTR};
    assert_int_equal(ibv_modify_qp(qp, &a, IBV_QP_STATE), EINVAL); /* RESET -> RTR */
    a.qp_state = IBV_QPS_INIT;
    assert_int_equal(ibv_modify_qp(qp, &a, IBV_QP_STATE), EINVAL); /* missing attributes */
    assert_int_equal(
        ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS),
        0);
    assert_int_equal(qp->state, IBV_QPS_INIT);
    char buf[16];
    struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = 16};
    struct ibv_send_wr wr = {.sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE}, *bad;
    assert_int_equal(ibv_post_send(qp, &wr, &bad), EINVAL); /* not RTS */
    a.qp_state = IBV_QPS_ERR;
    assert_int_equal(ibv_modify_qp(qp, &a, IBV_QP_STATE), 0);
    /* Posting to a QP in error completes with a flush error. */
    wr.wr_id = 42;
    assert_int_equal(ibv_post_send(qp, &wr, &bad), 0);
    struct ibv_wc wc;
    assert_int_equal(ibv_poll_cq(cq, 1, &wc), 1);
    assert_int_equal(wc.status, IBV_WC_WR_FLUSH_ERR);
    assert_int_equal(wc.wr_id, 42);
    assert_int_equal(ibv_destroy_qp(qp), 0);
    /* MRs: remote write needs local write; keys are checked. */
    assert_null(ibv_reg_mr(pd, buf, 16, IBV_ACCESS_REMOTE_WRITE));
    struct ibv_mr *mr = ibv_reg_mr(pd, buf, 16, IBV_ACCESS_LOCAL_WRITE);
    assert_non_null(mr);
    /* memory the CPU cannot reach (a GPU pointer, say) is refused */
    assert_null(ibv_reg_mr(pd, (void *)(uintptr_t)0x10000, 4096, IBV_ACCESS_LOCAL_WRITE));
    assert_int_equal(errno, EFAULT);
    ibv_dereg_mr(mr);
    ibv_destroy_cq(cq);
    ibv_dealloc_pd(pd);
    ibv_close_device(c);
    ibv_free_device_list(list);
}

static void test_write_read(void **state)
{
    (void)state;
    struct pair p;
    pair_connect(&p, 1, 8, 64, NULL);
    for (int i = 0; i < 4096; i++)
        p.buf_a[i] = (char)(i * 7);
    assert_int_equal(post(&p, IBV_WR_RDMA_WRITE, 1, p.buf_a, 4096, p.mra->lkey,
                          (uintptr_t)p.buf_b + 100, p.mrb->rkey, false),
                     0);
    assert_int_equal(post(&p, IBV_WR_RDMA_READ, 2, p.buf_a + 4096, 4096, p.mra->lkey,
                          (uintptr_t)p.buf_b + 100, p.mrb->rkey, true),
                     0);
    struct ibv_wc wc = poll_one(p.cqa);
    assert_int_equal(wc.status, IBV_WC_SUCCESS);
    assert_int_equal(wc.wr_id, 2); /* the unsignaled WRITE gives no CQE */
    assert_int_equal(wc.opcode, IBV_WC_RDMA_READ);
    assert_memory_equal(p.buf_b + 100, p.buf_a, 4096);
    assert_memory_equal(p.buf_a + 4096, p.buf_a, 4096);
    /* Send-queue depth: unsignaled WRs hold their slots until a signaled
     * completion after them is polled. */
    int posted = 0;
    while (post(&p, IBV_WR_RDMA_WRITE, 10, p.buf_a, 8, p.mra->lkey, (uintptr_t)p.buf_b, p.mrb->rkey,
                false) == 0)
        posted++;
    assert_int_equal(posted, 8);
    pair_free(&p);
}

static void test_remote_access_errors(void **state)
{
    (void)state;
    struct pair p;
    pair_connect(&p, 1, 8, 64, NULL);
    struct ibv_mr *ro = ibv_reg_mr(p.pd, p.buf_b + 4096, 4096, IBV_ACCESS_REMOTE_READ);
    const struct {
        const char *what;
        enum ibv_wr_opcode op;
        enum ibv_wc_status want;
    } cases[] = {
        {"bad rkey", IBV_WR_RDMA_WRITE, IBV_WC_REM_ACCESS_ERR},
        {"read-only target", IBV_WR_RDMA_WRITE, IBV_WC_REM_ACCESS_ERR},
        {"out of bounds", IBV_WR_RDMA_READ, IBV_WC_REM_ACCESS_ERR},
        {"bad lkey", IBV_WR_RDMA_WRITE, IBV_WC_LOC_PROT_ERR},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        if (i > 0) {
            pair_free(&p);
            pair_connect(&p, 1, 8, 64, NULL);
            ibv_dereg_mr(ro);
            ro = ibv_reg_mr(p.pd, p.buf_b + 4096, 4096, IBV_ACCESS_REMOTE_READ);
        }
        uint64_t base = (uintptr_t)p.buf_b;
        uint64_t addr = i == 0 ? base : i == 1 ? base + 4096 : i == 2 ? base + 8000 : base;
        uint32_t rkey = i == 0 ? 0xdead00 : i == 1 ? ro->rkey : p.mrb->rkey;
        uint32_t lkey = i == 3 ? 0xbad00 : p.mra->lkey;
        assert_int_equal(post(&p, cases[i].op, 7, p.buf_a, 512, lkey, addr, rkey, false), 0);
        assert_int_equal(
            post(&p, IBV_WR_RDMA_WRITE, 8, p.buf_a, 16, p.mra->lkey, base, p.mrb->rkey, true), 0);
        struct ibv_wc wc = poll_one(p.cqa);
        assert_int_equal(wc.wr_id, 7); /* errors complete even when unsignaled */
        if (wc.status != cases[i].want)
            fail_msg("%s: got %s", cases[i].what, ibv_wc_status_str(wc.status));
        wc = poll_one(p.cqa);
        assert_int_equal(wc.wr_id, 8);
        assert_int_equal(wc.status, IBV_WC_WR_FLUSH_ERR);
        assert_int_equal(qp_state(p.a->qp), IBV_QPS_ERR);
        assert_int_equal(expect_event(p.cha, NULL), RDMA_CM_EVENT_DISCONNECTED);
    }
    ibv_dereg_mr(ro);
    pair_free(&p);
}

static void test_read_needs_responder_resources(void **state)
{
    (void)state;
    struct pair p;
    pair_connect(&p, 0, 8, 64, NULL);
    assert_int_equal(post(&p, IBV_WR_RDMA_READ, 3, p.buf_a, 64, p.mra->lkey, (uintptr_t)p.buf_b,
                          p.mrb->rkey, true),
                     0);
    assert_int_equal(poll_one(p.cqa).status, IBV_WC_REM_INV_REQ_ERR);
    pair_free(&p);
}

static void test_reject_and_unreachable(void **state)
{
    (void)state;
    struct pair p;
    assert_int_equal(pair_connect(&p, 1, 8, 64, "go away"), -1);
    rdma_destroy_id(p.a);
    /* Nobody listens on the port any more. */
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = rdma_get_src_port(p.listen)};
    inet_aton("127.0.0.1", &sin.sin_addr);
    rdma_destroy_id(p.listen);
    assert_int_equal(rdma_create_id(p.cha, &p.a, NULL, RDMA_PS_TCP), 0);
    assert_int_equal(rdma_resolve_addr(p.a, NULL, (struct sockaddr *)&sin, 1000), 0);
    assert_int_equal(expect_event(p.cha, NULL), RDMA_CM_EVENT_ADDR_RESOLVED);
    struct ibv_qp_init_attr qa = {.send_cq = p.cqa,
                                  .recv_cq = p.cqa,
                                  .qp_type = IBV_QPT_RC,
                                  .cap = {.max_send_wr = 1, .max_send_sge = 1}};
    assert_int_equal(rdma_create_qp(p.a, p.pd, &qa), 0);
    struct rdma_conn_param cp = {0};
    assert_int_equal(rdma_connect(p.a, &cp), 0);
    assert_int_equal(expect_event(p.cha, NULL), RDMA_CM_EVENT_REJECTED);
    rdma_destroy_id(p.a);
    ibv_destroy_cq(p.cqa);
    ibv_destroy_cq(p.cqb);
    ibv_dealloc_pd(p.pd);
    rdma_destroy_event_channel(p.cha);
    rdma_destroy_event_channel(p.chb);
}

static void test_cq_overflow(void **state)
{
    (void)state;
    struct pair p;
    pair_connect(&p, 1, 8, 2, NULL);
    for (int i = 0; i < 3; i++)
        assert_int_equal(post(&p, IBV_WR_RDMA_WRITE, (uint64_t)i, p.buf_a, 8, p.mra->lkey,
                              (uintptr_t)p.buf_b, p.mrb->rkey, true),
                         0);
    struct ibv_wc wc[4];
    int n = 0;
    for (int i = 0; i < 5000 && n >= 0; i++) {
        n = ibv_poll_cq(p.cqa, 0, wc); /* look without consuming */
        if (n == 0) {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
    }
    assert_true(n < 0);
    pair_free(&p);
}

/* Target side in a child process: listens, accepts one connection with a
 * writable MR, reports port, address and rkey through a pipe, then waits. */
static void child_target(int wfd)
{
    struct rdma_event_channel *ch = rdma_create_event_channel();
    struct rdma_cm_id *l, *c;
    struct sockaddr_in sin = {.sin_family = AF_INET};
    inet_aton("127.0.0.1", &sin.sin_addr);
    if (rdma_create_id(ch, &l, NULL, RDMA_PS_TCP) || rdma_bind_addr(l, (struct sockaddr *)&sin) ||
        rdma_listen(l, 1))
        _exit(2);
    uint64_t msg[3] = {ntohs(rdma_get_src_port(l)), 0, 0};
    if (write(wfd, msg, sizeof(msg[0])) != sizeof(msg[0]))
        _exit(2);
    struct rdma_cm_event *ev = wait_event(ch, 5000);
    if (!ev || ev->event != RDMA_CM_EVENT_CONNECT_REQUEST)
        _exit(3);
    c = ev->id;
    rdma_ack_cm_event(ev);
    struct ibv_pd *pd = ibv_alloc_pd(c->verbs);
    struct ibv_cq *cq = ibv_create_cq(c->verbs, 4, NULL, NULL, 0);
    static char mem[1 << 20];
    struct ibv_mr *mr =
        ibv_reg_mr(pd, mem, sizeof(mem), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    struct ibv_qp_init_attr qa = {.send_cq = cq,
                                  .recv_cq = cq,
                                  .qp_type = IBV_QPT_RC,
                                  .cap = {.max_send_wr = 1, .max_send_sge = 1}};
    struct rdma_conn_param ap = {.responder_resources = 1};
    if (!mr || rdma_create_qp(c, pd, &qa) || rdma_accept(c, &ap))
        _exit(4);
    msg[1] = (uintptr_t)mem;
    msg[2] = mr->rkey;
    if (write(wfd, &msg[1], 2 * sizeof(msg[0])) != 2 * sizeof(msg[0]))
        _exit(5);
    for (;;)
        pause();
}

/* The target is another process; when it dies the outstanding request
 * fails with a retry-exceeded error and the rest are flushed. */
static void test_peer_killed(void **state)
{
    (void)state;
    int pfd[2];
    assert_int_equal(pipe(pfd), 0);
    pid_t pid = fork();
    if (pid == 0) {
        close(pfd[0]);
        child_target(pfd[1]);
    }
    close(pfd[1]);
    uint64_t msg[3];
    assert_int_equal(read(pfd[0], msg, sizeof(msg[0])), sizeof(msg[0]));
    struct pair p;
    memset(&p, 0, sizeof(p));
    p.cha = rdma_create_event_channel();
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)msg[0])};
    inet_aton("127.0.0.1", &sin.sin_addr);
    assert_int_equal(rdma_create_id(p.cha, &p.a, NULL, RDMA_PS_TCP), 0);
    assert_int_equal(rdma_resolve_addr(p.a, NULL, (struct sockaddr *)&sin, 1000), 0);
    assert_int_equal(expect_event(p.cha, NULL), RDMA_CM_EVENT_ADDR_RESOLVED);
    p.pd = ibv_alloc_pd(p.a->verbs);
    p.cqa = ibv_create_cq(p.a->verbs, 16, NULL, NULL, 0);
    struct ibv_qp_init_attr qa = {.send_cq = p.cqa,
                                  .recv_cq = p.cqa,
                                  .qp_type = IBV_QPT_RC,
                                  .cap = {.max_send_wr = 16, .max_send_sge = 1}};
    assert_int_equal(rdma_create_qp(p.a, p.pd, &qa), 0);
    struct rdma_conn_param cp = {.initiator_depth = 1};
    assert_int_equal(rdma_connect(p.a, &cp), 0);
    assert_int_equal(expect_event(p.cha, NULL), RDMA_CM_EVENT_ESTABLISHED);
    assert_int_equal(read(pfd[0], &msg[1], 2 * sizeof(msg[0])), 2 * sizeof(msg[0]));
    static char big[1 << 20];
    struct ibv_mr *mbig = ibv_reg_mr(p.pd, big, sizeof(big), IBV_ACCESS_LOCAL_WRITE);
    memset(big, 0x5a, sizeof(big));
    assert_int_equal(
        post(&p, IBV_WR_RDMA_WRITE, 1, big, 4096, mbig->lkey, msg[1], (uint32_t)msg[2], true), 0);
    assert_int_equal(poll_one(p.cqa).status, IBV_WC_SUCCESS); /* the child is alive */
    kill(pid, SIGSTOP); /* stalls its receiver: the next requests stay outstanding */
    int st;
    assert_int_equal(waitpid(pid, &st, WUNTRACED), pid); /* stopped for sure */
    assert_true(WIFSTOPPED(st));
    assert_int_equal(post(&p, IBV_WR_RDMA_WRITE, 2, big, sizeof(big), mbig->lkey, msg[1],
                          (uint32_t)msg[2], false),
                     0);
    assert_int_equal(
        post(&p, IBV_WR_RDMA_WRITE, 3, big, 8, mbig->lkey, msg[1], (uint32_t)msg[2], true), 0);
    struct ibv_wc wc;
    assert_int_equal(ibv_poll_cq(p.cqa, 1, &wc), 0);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    wc = poll_one(p.cqa);
    assert_int_equal(wc.wr_id, 2);
    assert_int_equal(wc.status, IBV_WC_RETRY_EXC_ERR);
    wc = poll_one(p.cqa);
    assert_int_equal(wc.wr_id, 3);
    assert_int_equal(wc.status, IBV_WC_WR_FLUSH_ERR);
    assert_int_equal(expect_event(p.cha, NULL), RDMA_CM_EVENT_DISCONNECTED);
    close(pfd[0]);
    rdma_destroy_id(p.a);
    ibv_dereg_mr(mbig);
    ibv_destroy_cq(p.cqa);
    ibv_dealloc_pd(p.pd);
    rdma_destroy_event_channel(p.cha);
}

/* ---- SEND / RECV ---------------------------------------------------------- */

static void post_recv_b(struct pair *p, uint64_t id, size_t off, uint32_t len)
{
    struct ibv_sge sge = {.addr = (uintptr_t)p->buf_b + off, .length = len, .lkey = p->mrb->lkey};
    struct ibv_recv_wr wr = {.wr_id = id, .sg_list = &sge, .num_sge = 1}, *bad = NULL;
    assert_int_equal(ibv_post_recv(p->b->qp, &wr, &bad), 0);
}

static bool cq_empty(struct ibv_cq *cq)
{
    struct ibv_wc wc;
    return ibv_poll_cq(cq, 1, &wc) == 0;
}

static int64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* The target's RNR timer (RTS -> RTS, as an application does after the CM). */
static void set_rnr_timer(struct ibv_qp *qp, uint8_t code)
{
    struct ibv_qp_attr a = {.min_rnr_timer = code};
    assert_int_equal(ibv_modify_qp(qp, &a, IBV_QP_MIN_RNR_TIMER), 0);
}

/* SEND and SEND_WITH_IMM consume posted receives in order: byte_len,
 * opcode, imm and the data; the sender's CQE is IBV_WC_SEND. */
static void test_send_recv(void **state)
{
    (void)state;
    struct pair p;
    pair_connect(&p, 1, 8, 64, NULL);
    post_recv_b(&p, 101, 0, 100);
    post_recv_b(&p, 102, 200, 100);
    for (int i = 0; i < 64; i++)
        p.buf_a[i] = (char)(i + 1);
    assert_int_equal(post(&p, IBV_WR_SEND, 1, p.buf_a, 64, p.mra->lkey, 0, 0, true), 0);
    struct ibv_sge sge = {.addr = (uintptr_t)p.buf_a + 64, .length = 10, .lkey = p.mra->lkey};
    struct ibv_send_wr wr = {.wr_id = 2,
                             .sg_list = &sge,
                             .num_sge = 1,
                             .opcode = IBV_WR_SEND_WITH_IMM,
                             .send_flags = IBV_SEND_SIGNALED,
                             .imm_data = htonl(0xabcd)},
                       *bad;
    assert_int_equal(ibv_post_send(p.a->qp, &wr, &bad), 0);
    struct ibv_wc wc = poll_one(p.cqb);
    assert_int_equal(wc.status, IBV_WC_SUCCESS);
    assert_int_equal(wc.opcode, IBV_WC_RECV);
    assert_int_equal(wc.wr_id, 101);
    assert_int_equal(wc.byte_len, 64);
    assert_false(wc.wc_flags & IBV_WC_WITH_IMM);
    assert_memory_equal(p.buf_b, p.buf_a, 64);
    wc = poll_one(p.cqb);
    assert_int_equal(wc.status, IBV_WC_SUCCESS);
    assert_int_equal(wc.wr_id, 102);
    assert_int_equal(wc.byte_len, 10);
    assert_true(wc.wc_flags & IBV_WC_WITH_IMM);
    assert_int_equal(ntohl(wc.imm_data), 0xabcd);
    assert_memory_equal(p.buf_b + 200, p.buf_a + 64, 10);
    for (uint64_t id = 1; id <= 2; id++) {
        wc = poll_one(p.cqa);
        assert_int_equal(wc.status, IBV_WC_SUCCESS);
        assert_int_equal(wc.opcode, IBV_WC_SEND);
        assert_int_equal(wc.wr_id, id);
    }
    pair_free(&p);
}

/* Longer than the posted buffer: LOC_LEN_ERR on the receive, REM_INV_REQ_ERR
 * on the SEND, both QPs in error (the next receive is flushed). */
static void test_send_too_long(void **state)
{
    (void)state;
    struct pair p;
    pair_connect(&p, 1, 8, 64, NULL);
    post_recv_b(&p, 7, 0, 16);
    post_recv_b(&p, 8, 16, 16);
    assert_int_equal(post(&p, IBV_WR_SEND, 1, p.buf_a, 64, p.mra->lkey, 0, 0, true), 0);
    struct ibv_wc wc = poll_one(p.cqb);
    assert_int_equal(wc.wr_id, 7);
    assert_int_equal(wc.status, IBV_WC_LOC_LEN_ERR);
    wc = poll_one(p.cqb);
    assert_int_equal(wc.wr_id, 8);
    assert_int_equal(wc.status, IBV_WC_WR_FLUSH_ERR);
    wc = poll_one(p.cqa);
    assert_int_equal(wc.wr_id, 1);
    assert_int_equal(wc.status, IBV_WC_REM_INV_REQ_ERR);
    assert_int_equal(qp_state(p.a->qp), IBV_QPS_ERR);
    assert_int_equal(qp_state(p.b->qp), IBV_QPS_ERR);
    pair_free(&p);
}

/* No receive posted, rnr_retry 3: the SEND is retried 3 times, each after
 * the target's timer (code 14 = 1.28 ms), then fails RNR_RETRY_EXC_ERR; a
 * WRITE posted after it never lands (go-back-N) and is flushed. */
static void test_rnr_exhausted(void **state)
{
    (void)state;
    struct pair p;
    pair_rnr_retry = 3;
    pair_connect(&p, 1, 8, 64, NULL);
    pair_rnr_retry = 0;
    set_rnr_timer(p.b->qp, 14);
    memset(p.buf_b, 0, 64);
    memset(p.buf_a, 0x5a, 64);
    int64_t t0 = now_us();
    assert_int_equal(post(&p, IBV_WR_SEND, 1, p.buf_a, 32, p.mra->lkey, 0, 0, true), 0);
    assert_int_equal(post(&p, IBV_WR_RDMA_WRITE, 2, p.buf_a, 64, p.mra->lkey, (uintptr_t)p.buf_b,
                          p.mrb->rkey, false),
                     0);
    struct ibv_wc wc = poll_one(p.cqa);
    assert_int_equal(wc.wr_id, 1);
    assert_int_equal(wc.status, IBV_WC_RNR_RETRY_EXC_ERR);
    assert_true(now_us() - t0 >= 3 * 1280);
    wc = poll_one(p.cqa);
    assert_int_equal(wc.wr_id, 2);
    assert_int_equal(wc.status, IBV_WC_WR_FLUSH_ERR);
    assert_int_equal(p.buf_b[0], 0); /* the WRITE behind the SEND did not run */
    assert_true(cq_empty(p.cqb));
    pair_free(&p);
}

/* rnr_retry 7 retries forever: nothing completes (nor does the WRITE behind
 * the SEND land) until a receive is posted, then both complete in order. */
static void test_rnr_infinite(void **state)
{
    (void)state;
    struct pair p;
    pair_rnr_retry = 7;
    pair_connect(&p, 1, 8, 64, NULL);
    pair_rnr_retry = 0;
    set_rnr_timer(p.b->qp, 1); /* 0.01 ms: many retries in the wait below */
    memset(p.buf_b, 0, 256);
    memset(p.buf_a, 0x3c, 256);
    assert_int_equal(post(&p, IBV_WR_SEND, 1, p.buf_a, 32, p.mra->lkey, 0, 0, true), 0);
    assert_int_equal(post(&p, IBV_WR_RDMA_WRITE, 2, p.buf_a, 64, p.mra->lkey,
                          (uintptr_t)p.buf_b + 128, p.mrb->rkey, true),
                     0);
    struct timespec ts = {0, 100 * 1000000};
    nanosleep(&ts, NULL);
    assert_true(cq_empty(p.cqa));
    assert_int_equal(p.buf_b[128], 0);
    post_recv_b(&p, 9, 0, 64);
    struct ibv_wc wc = poll_one(p.cqa);
    assert_int_equal(wc.wr_id, 1);
    assert_int_equal(wc.status, IBV_WC_SUCCESS);
    wc = poll_one(p.cqa);
    assert_int_equal(wc.wr_id, 2);
    assert_int_equal(wc.status, IBV_WC_SUCCESS);
    wc = poll_one(p.cqb);
    assert_int_equal(wc.wr_id, 9);
    assert_int_equal(wc.byte_len, 32);
    assert_memory_equal(p.buf_b, p.buf_a, 32);
    assert_memory_equal(p.buf_b + 128, p.buf_a, 64);
    assert_true(cq_empty(p.cqb));
    pair_free(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_device),
        cmocka_unit_test(test_devices),
        cmocka_unit_test(test_qp_state_machine),
        cmocka_unit_test(test_write_read),
        cmocka_unit_test(test_remote_access_errors),
        cmocka_unit_test(test_read_needs_responder_resources),
        cmocka_unit_test(test_reject_and_unreachable),
        cmocka_unit_test(test_cq_overflow),
        cmocka_unit_test(test_peer_killed),
        cmocka_unit_test(test_send_recv),
        cmocka_unit_test(test_send_too_long),
        cmocka_unit_test(test_rnr_exhausted),
        cmocka_unit_test(test_rnr_infinite),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
