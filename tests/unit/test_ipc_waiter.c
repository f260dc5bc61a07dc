/* Bad requests on an ipc connection that a message waiter reads
 * (engine/ipc/ipc_serve_rx.c). Engines A and B in this process, connected
 * over ipc; a raw client connects to A claiming to be B (same uid, no
 * secret: the handshake accepts it), so it is the newest connection of B's
 * and the one a thread in A waiting for a message from B polls. While that
 * RECV waits, the raw client sends a bad request: an unknown type, an
 * oversized or truncated one, a bad header, or a well-formed MSG_REQ whose
 * engine frame is garbage. A must answer the garbage frame -XFER_EPROTO and
 * keep the connection, close it for the others (within io_timeout_ms for the
 * truncated one), and go on serving: the RECV then gets B's real message,
 * byte for byte, over B's own connection.
 *
 * Then the states of ipc_serve_rx.c's linger (a connection stays with its
 * waiters for XFER_IPC_LINGER_US after the last one left), of
 * xfer_notif_wait(e, NULL, ...) reading every peer's connection, and of the
 * owner's orderly close (IPC_BYE). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "ipc/ipc.h"
#include "msg_wire.h"
#include "transport.h"
#include "xfer_handshake.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define IO_TIMEOUT 400
#define DEADLINE   10000

#include "ipc_fixture.h"

struct recv_job {
    struct side *a;
    uint64_t tag, got;
    int rc;
};

static void *recv_main(void *arg)
{
    struct recv_job *j = arg;
    j->rc = xfer_recv(j->a->e, j->a->r, 4096, 64, j->a->p, j->tag, &j->got, DEADLINE);
    return NULL;
}

enum bad { UNKNOWN_TYPE, OVERSIZED, TRUNCATED, BAD_MAGIC, GARBAGE_FRAME, HANG_UP, NBAD };

/* Sends the bad request; true if A must close the connection for it. */
static bool send_bad(int fd, enum bad k)
{
    uint8_t junk[64];
    memset(junk, 0xab, sizeof(junk));
    struct ipc_hdr h = {
        .magic = IPC_MAGIC, .version = IPC_VERSION, .type = IPC_MSG_REQ, .count = 1};
    switch (k) {
    case UNKNOWN_TYPE:
        assert_int_equal(ipc_send(fd, 99, 1, junk, 8, -1, 1000), 0);
        return true;
    case OVERSIZED: /* a header announcing 64 MiB: refused before reading it */
        h.bytes = 64u << 20;
        assert_int_equal(send(fd, &h, sizeof(h), MSG_NOSIGNAL), (ssize_t)sizeof(h));
        return true;
    case TRUNCATED: /* 64 bytes announced, 10 sent, then silence */
        h.bytes = sizeof(junk);
        assert_int_equal(send(fd, &h, sizeof(h), MSG_NOSIGNAL), (ssize_t)sizeof(h));
        assert_int_equal(send(fd, junk, 10, MSG_NOSIGNAL), 10);
        return true;
    case BAD_MAGIC:
        h.magic = 0x12345678;
        assert_int_equal(send(fd, &h, sizeof(h), MSG_NOSIGNAL), (ssize_t)sizeof(h));
        return true;
    case GARBAGE_FRAME: { /* well-formed request, bad engine frame: answered */
        assert_int_equal(ipc_send(fd, IPC_MSG_REQ, 1, junk, sizeof(junk), -1, 1000), 0);
        int32_t st = 0;
        assert_int_equal(ipc_recv(fd, &h, &st, sizeof(st), NULL, 5000), 0);
        assert_int_equal(h.type, IPC_MSG_RESP);
        assert_int_equal(st, -XFER_EPROTO);
        return false;
    }
    case HANG_UP:
    case NBAD:
        break;
    }
    return false;
}

static void test_bad_requests_while_waiting(void **state)
{
    (void)state;
    struct side A = {0}, B = {0};
    side_new(&A, "ipcw-a");
    side_new(&B, "ipcw-b");
    assert_int_equal(xfer_peer_add(A.e, &B.d, &A.p), 0);
    assert_int_equal(xfer_peer_add(B.e, &A.d, &B.p), 0);
    assert_int_equal(xfer_peer_connect(A.p), 0);
    assert_int_equal(xfer_peer_connect(B.p), 0);
    assert_int_equal(xfer_peer_transport(A.p), XFER_TRANSPORT_IPC);
    assert_int_equal(xfer_peer_transport(B.p), XFER_TRANSPORT_IPC);
    uint8_t *out = xfer_region_ptr(B.r), *in = (uint8_t *)xfer_region_ptr(A.r) + 4096;
    for (int round = 0; round < 3 * NBAD; round++) {
        enum bad k = (enum bad)(round % NBAD);
        int raw = raw_as(&A, &B, NULL);
        struct recv_job j = {.a = &A, .tag = 100 + (uint64_t)round};
        pthread_t th;
        pthread_create(&th, NULL, recv_main, &j);
        bool closes = send_bad(raw, k);
        if (k == HANG_UP)
            shutdown(raw, SHUT_RDWR);
        else if (closes)
            assert_true(closed_within(raw, IO_TIMEOUT + 4000));
        else
            assert_int_equal(send_bad(raw, k), false); /* still served */
        for (int i = 0; i < 40; i++)
            out[i] = (uint8_t)(round * 7 + i);
        assert_int_equal(xfer_send(B.e, B.r, 0, 40, B.p, j.tag, DEADLINE), 0);
        pthread_join(th, NULL);
        assert_int_equal(j.rc, 0);
        assert_int_equal(j.got, 40);
        assert_memory_equal(in, out, 40);
        close(raw);
    }
    xfer_engine_free(A.e);
    xfer_engine_free(B.e);
}

/* Sends an eager RTS of 8 bytes with tag from a raw client claiming to be b. */
static void rts_send(int fd, const struct side *b, uint64_t tag)
{
    static uint8_t frame[XFER_MSG_HDR_LEN + XFER_MSG_RTS_BODY + 64];
    static const uint8_t bytes[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    struct xfer_msg_rts r = {
        .send_id = 5000 + tag, .tag = tag, .len = sizeof(bytes), .eager = bytes};
    xfer_region_describe(b->r, &r.src);
    assert_true(xfer_msg_rts_frame_len(&r) <= sizeof(frame));
    size_t n = xfer_msg_encode_rts(tag, &r, frame);
    assert_int_equal(ipc_send(fd, IPC_MSG_REQ, 1, frame, (uint32_t)n, -1, 1000), 0);
}

/* The owner's answer (0: queued, XFER_MSG_DELIVERED: matched on arrival)
 * within ms, or -1000 if none came. */
static int answer_within(int fd, int ms)
{
    struct ipc_hdr h;
    int32_t st = 0;
    if (ipc_wait_readable(fd, ms) != 0)
        return -1000;
    assert_int_equal(ipc_recv(fd, &h, &st, sizeof(st), NULL, 1000), 0);
    assert_int_equal(h.type, IPC_MSG_RESP);
    return st;
}

#define LINGER_US 1000000 /* long enough that no stall of this machine outlasts it */

/* A RECV's waiter that leaves (here: its deadline passed) leaves the
 * connection lingering: a message arriving then is not read by the serving
 * thread as an unexpected one but by the next RECV's waiter (answered
 * DELIVERED, no FIN); one nobody waits for is still read once the linger
 * is over (answered 0: queued), and a later RECV takes it. */
static void test_linger(void **state)
{
    (void)state;
    setenv("XFER_IPC_LINGER_US", "1000000", 1);
    struct side A = {0}, B = {0};
    linked(&A, &B, "ipcl-a", "ipcl-b");
    int raw = raw_as(&A, &B, NULL);
    send_bad(raw, GARBAGE_FRAME); /* answered: past HELLO, waiters may poll it */
    uint64_t got = 0;
    uint8_t *in = (uint8_t *)xfer_region_ptr(A.r) + 4096;
    for (int round = 0; round < 3; round++) {
        uint64_t tag = 10 + (uint64_t)round * 2;
        /* a waiter polls the raw connection (B's newest), then leaves */
        assert_int_equal(xfer_recv(A.e, A.r, 4096, 64, A.p, tag, &got, 30), -XFER_ETIMEDOUT);
        rts_send(raw, &B, tag);
        memset(in, 0, 8);
        assert_int_equal(xfer_recv(A.e, A.r, 4096, 64, A.p, tag, &got, DEADLINE), 0);
        assert_int_equal(got, 8);
        assert_int_equal(in[7], 8);
        assert_int_equal(answer_within(raw, DEADLINE), XFER_MSG_DELIVERED);
        /* nobody waits now: read at the linger's end, queued */
        rts_send(raw, &B, tag + 1);
        assert_int_equal(answer_within(raw, LINGER_US / 1000 + DEADLINE), 0);
        memset(in, 0, 8);
        assert_int_equal(xfer_recv(A.e, A.r, 4096, 64, A.p, tag + 1, &got, DEADLINE), 0);
        assert_int_equal(got, 8);
        assert_int_equal(in[7], 8);
    }
    close(raw);
    xfer_engine_free(A.e);
    xfer_engine_free(B.e);
    unsetenv("XFER_IPC_LINGER_US");
}

struct any_job {
    xfer_engine *e;
    int ms;
};

static void *wait_any_main(void *arg)
{
    struct any_job *j = arg;
    xfer_notif_wait(j->e, NULL, j->ms);
    return NULL;
}

/* xfer_notif_wait(e, NULL, ...) reads the connections of every peer: with
 * an RTS lingering on two of A's connections (B's and C's, each raw; the
 * serving threads would read them only after LINGER_US), a thread waiting
 * for a notification from anyone reads both: each is answered (0, queued:
 * no RECV) within half of it. */
static void test_notif_wait_any(void **state)
{
    (void)state;
    setenv("XFER_IPC_LINGER_US", "1000000", 1);
    struct side A = {0}, B = {0}, C = {0};
    linked(&A, &B, "ipcn-a", "ipcn-b");
    side_new(&C, "ipcn-c");
    xfer_peer *ac;
    assert_int_equal(xfer_peer_add(A.e, &C.d, &ac), 0);
    assert_int_equal(xfer_peer_connect(ac), 0);
    int rb = raw_as(&A, &B, NULL), rc = raw_as(&A, &C, NULL);
    send_bad(rb, GARBAGE_FRAME); /* answered: past HELLO, waiters may poll them */
    send_bad(rc, GARBAGE_FRAME);
    uint64_t got;
    for (int round = 0; round < 3; round++) {
        uint64_t tag = 70 + (uint64_t)round;
        /* waiters on B's and C's connections leave: an RTS now lingers */
        assert_int_equal(xfer_recv(A.e, A.r, 0, 64, A.p, 1, &got, 30), -XFER_ETIMEDOUT);
        assert_int_equal(xfer_recv(A.e, A.r, 0, 64, ac, 1, &got, 30), -XFER_ETIMEDOUT);
        struct any_job j = {A.e, LINGER_US / 1000 / 2 + 100};
        pthread_t th;
        pthread_create(&th, NULL, wait_any_main, &j);
        rts_send(rb, &B, tag);
        rts_send(rc, &C, tag);
        assert_int_equal(answer_within(rb, LINGER_US / 2000), 0);
        assert_int_equal(answer_within(rc, LINGER_US / 2000), 0);
        pthread_join(th, NULL);
        assert_int_equal(xfer_recv(A.e, A.r, 0, 64, A.p, tag, &got, DEADLINE), 0);
        assert_int_equal(xfer_recv(A.e, A.r, 0, 64, ac, tag, &got, DEADLINE), 0);
    }
    close(rb);
    close(rc);
    xfer_engine_free(A.e);
    xfer_engine_free(B.e);
    xfer_engine_free(C.e);
    unsetenv("XFER_IPC_LINGER_US");
}

/* An owner whose engine stops says IPC_BYE before it closes: its peers
 * tell an orderly close from a death (ipc_sock_said_bye). */
static void test_bye(void **state)
{
    (void)state;
    struct side A = {0}, B = {0};
    side_new(&A, "ipcb-a");
    side_new(&B, "ipcb-b");
    int raw = raw_as(&A, &B, NULL);
    assert_false(ipc_sock_said_bye(raw));
    xfer_engine_free(A.e);
    assert_true(ipc_sock_said_bye(raw));
    struct ipc_hdr h;
    uint8_t buf[16];
    assert_int_equal(ipc_recv(raw, &h, buf, sizeof(buf), NULL, 1000), 0);
    assert_int_equal(h.type, IPC_BYE);
    assert_int_equal(h.bytes, 0);
    assert_true(closed_within(raw, 1000));
    close(raw);
    /* a connection closed without it (a dead owner) does not say it */
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    close(sv[1]);
    assert_false(ipc_sock_said_bye(sv[0]));
    close(sv[0]);
    xfer_engine_free(B.e);
}

int main(void)
{
    setenv("XFER_WAIT_RX_IN", "1", 1); /* the default, whatever the environment says */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_requests_while_waiting), cmocka_unit_test(test_linger),
        cmocka_unit_test(test_notif_wait_any), cmocka_unit_test(test_bye)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
