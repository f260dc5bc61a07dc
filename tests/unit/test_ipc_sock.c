/* Unit tests of the ipc transport's socket and host-memory helpers
 * (engine/ipc/ipc_sock.c, ipc_host.c), without an engine. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "ipc/ipc.h"

#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

static void test_fd_passing(void **state)
{
    (void)state;
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
    int mfd = memfd_create("t", 0);
    assert_true(mfd >= 0);
    assert_int_equal(ftruncate(mfd, 4096), 0);
    char *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
    assert_true(p != MAP_FAILED);
    strcpy(p, "hello through a memfd");
    uint32_t payload[3] = {1, 2, 3};
    assert_int_equal(ipc_send(sv[0], IPC_MAP_RESP, 3, payload, sizeof(payload), mfd, 1000), 0);
    struct ipc_hdr h;
    uint32_t got[3];
    int fd = -1;
    assert_int_equal(ipc_recv(sv[1], &h, got, sizeof(got), &fd, 1000), 0);
    assert_int_equal(h.type, IPC_MAP_RESP);
    assert_int_equal(h.count, 3);
    assert_memory_equal(got, payload, sizeof(got));
    assert_true(fd >= 0);
    int err = 0;
    char *q = ipc_host_map(fd, 4096, true, &err);
    assert_non_null(q);
    assert_string_equal(q, "hello through a memfd");
    q[0] = 'H'; /* shared: the owner sees it */
    assert_int_equal(p[0], 'H');
    ipc_host_unmap(q, 4096);
    /* A read-only reopen cannot be mapped writable. */
    int ro = ipc_memfd_reopen_ro(mfd);
    assert_true(ro >= 0);
    assert_null(ipc_host_map(ro, 4096, true, &err));
    assert_int_equal(err, -XFER_EACCES);
    q = ipc_host_map(ro, 4096, false, &err);
    assert_non_null(q);
    ipc_host_unmap(q, 4096);
    close(ro);
    close(fd);
    munmap(p, 4096);
    close(mfd);
    close(sv[0]);
    close(sv[1]);
}

static void test_bad_messages(void **state)
{
    (void)state;
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
    struct ipc_hdr h;
    char buf[64];
    /* Nothing arrives: a timeout, not a hang. */
    assert_int_equal(ipc_recv(sv[1], &h, buf, sizeof(buf), NULL, 50), -XFER_ETIMEDOUT);
    /* Payload over the receiver's limit. */
    char big[128] = {0};
    assert_int_equal(ipc_send(sv[0], IPC_REL, 1, big, sizeof(big), -1, 1000), 0);
    assert_int_equal(ipc_recv(sv[1], &h, buf, sizeof(buf), NULL, 1000), -XFER_EPROTO);
    /* After a protocol error the stream is out of step (the owner closes
     * it); each case below gets a fresh pair. */
    close(sv[0]);
    close(sv[1]);
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
    /* Bad magic. */
    struct ipc_hdr bad = {.magic = 0xdeadbeef, .type = IPC_REL, .version = IPC_VERSION};
    assert_int_equal(write(sv[0], &bad, sizeof(bad)), (ssize_t)sizeof(bad));
    assert_int_equal(ipc_recv(sv[1], &h, buf, sizeof(buf), NULL, 1000), -XFER_EPROTO);
    close(sv[0]);
    close(sv[1]);
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
    /* Peer gone mid-header. */
    assert_int_equal(write(sv[0], &bad, 3), 3);
    close(sv[0]);
    assert_int_equal(ipc_recv(sv[1], &h, buf, sizeof(buf), NULL, 1000), -XFER_ECONN);
    close(sv[1]);
}

/* IPC_ACQV_REQ: hull records (nseg 0 + one ipc_acqv_hull) and list
 * records (nseg ranges) exactly fill the payload; IPC_ACQV_RESP flags. */
static void test_acqv_rules(void **state)
{
    (void)state;
    struct {
        struct ipc_acqv_req q0;
        struct ipc_acqv_hull hl;
        struct ipc_acqv_req q1;
        struct xfer_range v[2];
    } m = {{1, 1, XFER_OP_READ, IPC_ACQV_HULL},
           {0, 4096, 2048, 2},
           {2, 1, XFER_OP_WRITE, 2},
           {{0, 16}, {64, 16}}};
    struct ipc_hdr h = {.type = IPC_ACQV_REQ, .count = 2, .bytes = sizeof(m)};
    assert_int_equal(ipc_msg_check(&h, &m, IPC_ACQV_REQ, 0), 0);
    h.bytes = sizeof(m) - 1; /* a range cut short */
    assert_int_equal(ipc_msg_check(&h, &m, IPC_ACQV_REQ, 0), -XFER_EPROTO);
    h.bytes = sizeof(m.q0) + 8; /* a hull cut short */
    h.count = 1;
    assert_int_equal(ipc_msg_check(&h, &m, IPC_ACQV_REQ, 0), -XFER_EPROTO);
    h.bytes = sizeof(m.q0) + sizeof(m.hl);
    assert_int_equal(ipc_msg_check(&h, &m, IPC_ACQV_REQ, 0), 0);
    m.hl.nseg = 0; /* a hull of no segment */
    assert_int_equal(ipc_msg_check(&h, &m, IPC_ACQV_REQ, 0), -XFER_EPROTO);
    m.hl.nseg = IPC_VEC_SEGS_MAX + 1;
    assert_int_equal(ipc_msg_check(&h, &m, IPC_ACQV_REQ, 0), -XFER_EPROTO);
    struct ipc_acqv_resp r[2] = {{0, 3, UINT32_MAX, IPC_ACQV_NEED_LIST}, {-XFER_ERANGE, 0, 1, 0}};
    struct ipc_hdr hr = {.type = IPC_ACQV_RESP, .count = 2, .bytes = sizeof(r)};
    assert_int_equal(ipc_msg_check(&hr, r, IPC_ACQV_RESP, 2), 0);
    r[1].flags = 2; /* unknown flag */
    assert_int_equal(ipc_msg_check(&hr, r, IPC_ACQV_RESP, 2), -XFER_EPROTO);
}

static void test_listen_connect(void **state)
{
    (void)state;
    char why[256];
    char longid[200];
    memset(longid, 'x', sizeof(longid) - 1);
    longid[sizeof(longid) - 1] = 0;
    assert_int_equal(ipc_sock_listen(longid, 1, why, sizeof(why)), -XFER_EINVAL);
    int l = ipc_sock_listen("unit-node", 0x1234, why, sizeof(why));
    assert_true(l >= 0);
    /* Same node, same incarnation: the name is taken. */
    assert_int_equal(ipc_sock_listen("unit-node", 0x1234, why, sizeof(why)), -XFER_EEXIST);
    /* Another incarnation is another name: a stale descriptor cannot reach us. */
    assert_int_equal(ipc_sock_connect("unit-node", 0x1235, 200, why, sizeof(why)), -XFER_ECONN);
    int c = ipc_sock_connect("unit-node", 0x1234, 1000, why, sizeof(why));
    assert_true(c >= 0);
    assert_int_equal(ipc_sock_peer_pid(c), getpid());
    close(c);
    close(l);
}

static void test_cma_self(void **state)
{
    (void)state;
    char why[256];
    char src[100] = "cross memory attach", dst[100] = {0};
    assert_int_equal(
        ipc_cma_read(getpid(), (uint64_t)(uintptr_t)src, dst, sizeof(src), why, sizeof(why)), 0);
    assert_string_equal(dst, src);
    assert_int_equal(ipc_cma_write(getpid(), (uint64_t)(uintptr_t)dst, "W", 1, why, sizeof(why)),
                     0);
    assert_int_equal(dst[0], 'W');
    /* An unmapped address is a range error with a reason, not a crash. */
    assert_int_equal(ipc_cma_read(getpid(), 8, dst, 16, why, sizeof(why)), -XFER_ERANGE);
    assert_non_null(strstr(why, "not mapped"));
}

/* Issue 18 item 6: which tracer the owner declares to Yama. The
 * declaration itself (prctl) cannot be observed here: this machine has no
 * Yama (prctl answers EINVAL), see docs/ipc.md. */
static void test_ptracer_choice(void **state)
{
    (void)state;
    pid_t one[] = {4242}, same[] = {4242, 4242}, two[] = {4242, 4343}, unnamed[] = {4242, -1};
    assert_int_equal(ipc_ptracer_choice(NULL, 0), 0);     /* nobody: dropped */
    assert_int_equal(ipc_ptracer_choice(one, 1), 4242);   /* the one peer */
    assert_int_equal(ipc_ptracer_choice(same, 2), 4242);  /* two connections, one process */
    assert_int_equal(ipc_ptracer_choice(two, 2), -1);     /* Yama names one: "any" */
    assert_int_equal(ipc_ptracer_choice(unnamed, 2), -1); /* another pid namespace */
    /* add/remove keep a multiset; removing what was never added is harmless */
    ipc_tracer_add(4242);
    ipc_tracer_add(4242);
    ipc_tracer_remove(4242);
    ipc_tracer_remove(4242);
    ipc_tracer_remove(777);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fd_passing),     cmocka_unit_test(test_bad_messages),
        cmocka_unit_test(test_listen_connect), cmocka_unit_test(test_cma_self),
        cmocka_unit_test(test_ptracer_choice), cmocka_unit_test(test_acqv_rules),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
