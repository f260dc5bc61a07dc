/* Handshake over a real socketpair: secrets matching, wrong, missing on
 * either side, garbage, oversize frames and a silent peer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "xfer_io.h"
#include "handshake.h"
#include "hs_msg.h"

struct server_run {
    int fd;
    struct xfer_hs_self self;
    int rc;
    struct xfer_hs_peer peer;
    char why[256];
};

static void *server_thread(void *arg)
{
    struct server_run *s = arg;
    s->rc = xfer_handshake_server(s->fd, &s->self, 2000, &s->peer, s->why, sizeof(s->why));
    return NULL;
}

/* Runs client and server against each other; returns the client's code. */
static int run_pair(const char *cli_secret, const char *srv_secret, struct server_run *srv,
                    char *cwhy, size_t cwhy_len)
{
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    memset(srv, 0, sizeof(*srv));
    srv->fd = sv[1];
    srv->self = (struct xfer_hs_self){.node_id = "srv",
                                      .incarnation = 42,
                                      .secret = srv_secret,
                                      .secret_len = srv_secret ? strlen(srv_secret) : 0};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, server_thread, srv), 0);
    struct xfer_hs_self cli = {.node_id = "cli",
                               .incarnation = 7,
                               .purpose = 3,
                               .secret = cli_secret,
                               .secret_len = cli_secret ? strlen(cli_secret) : 0};
    struct xfer_hs_peer peer;
    int rc = xfer_handshake_client(sv[0], &cli, 2000, &peer, cwhy, cwhy_len);
    if (rc == 0) {
        assert_string_equal(peer.node_id, "srv");
        assert_int_equal(peer.incarnation, 42);
    }
    close(sv[0]); /* unblocks a server still waiting */
    pthread_join(th, NULL);
    close(sv[1]);
    return rc;
}

static void test_no_secret_both(void **state)
{
    (void)state;
    struct server_run srv;
    char why[256] = "";
    assert_int_equal(run_pair(NULL, NULL, &srv, why, sizeof(why)), 0);
    assert_int_equal(srv.rc, 0);
    assert_string_equal(srv.peer.node_id, "cli");
    assert_int_equal(srv.peer.purpose, 3);
}

static void test_same_secret(void **state)
{
    (void)state;
    struct server_run srv;
    char why[256] = "";
    assert_int_equal(run_pair("s3cret", "s3cret", &srv, why, sizeof(why)), 0);
    assert_int_equal(srv.rc, 0);
}

static void test_wrong_secret(void **state)
{
    (void)state;
    struct server_run srv;
    char why[256] = "";
    /* The server's proof fails first: the client refuses the server. */
    assert_int_equal(run_pair("right", "wrong", &srv, why, sizeof(why)), -XFER_EAUTH);
    assert_non_null(strstr(why, XFER_HS_AUTH_FAILED));
    /* The server says the same (the client tells it with an empty proof). */
    assert_int_equal(srv.rc, -XFER_EAUTH);
    assert_non_null(strstr(srv.why, XFER_HS_AUTH_FAILED));
}

static void test_client_without_secret(void **state)
{
    (void)state;
    struct server_run srv;
    char why[256] = "";
    assert_int_equal(run_pair(NULL, "s3cret", &srv, why, sizeof(why)), -XFER_EAUTH);
    assert_non_null(strstr(why, "requires a cluster secret"));
    assert_int_not_equal(srv.rc, 0);
}

static void test_server_without_secret(void **state)
{
    (void)state;
    struct server_run srv;
    char why[256] = "";
    assert_int_equal(run_pair("s3cret", NULL, &srv, why, sizeof(why)), -XFER_EAUTH);
    assert_int_not_equal(srv.rc, 0);
}

/* The state machine on its own: a client's frames fed in one by one, as
 * xferd's control loop does; a wrong proof is refused with a message. */
static void test_server_steps(void **state)
{
    (void)state;
    struct xfer_hs_self srv = {.node_id = "srv", .secret = "a", .secret_len = 1};
    xfer_hs_server *h = xfer_hs_server_new(&srv);
    assert_non_null(h);
    struct xfer_hs_hello hello = {.version = XFER_PROTO_VERSION, .node_id = "cli"};
    uint8_t in[XFER_HS_FRAME_MAX], out[XFER_HS_FRAME_MAX];
    int n = xfer_hs_hello_pack(&hello, in, sizeof(in)), out_len;
    char why[256] = "";
    assert_true(n > 0);
    assert_int_equal(xfer_hs_server_step(h, in, (size_t)n, out, &out_len, NULL, why, sizeof(why)),
                     XFER_HS_MORE);
    struct xfer_hs_hello got;
    assert_true(out_len > 0);
    assert_int_equal(xfer_hs_hello_unpack(out, (size_t)out_len, &got), 0);
    assert_string_equal(got.node_id, "srv");
    assert_true(got.auth);
    struct xfer_hs_auth bad = {.proof_len = XFER_HS_PROOF_LEN};
    n = xfer_hs_auth_pack(&bad, in, sizeof(in));
    assert_int_equal(xfer_hs_server_step(h, in, (size_t)n, out, &out_len, NULL, why, sizeof(why)),
                     -XFER_EAUTH);
    assert_non_null(strstr(why, XFER_HS_AUTH_FAILED));
    struct xfer_hs_result res;
    assert_true(out_len >= 0);
    assert_int_equal(xfer_hs_result_unpack(out, (size_t)out_len, &res), 0);
    assert_int_equal(res.status, -XFER_EAUTH);
    assert_non_null(strstr(res.message, XFER_HS_AUTH_FAILED));
    /* finished: anything more is refused, an oversize frame too */
    assert_int_equal(xfer_hs_server_step(h, in, (size_t)n, out, &out_len, NULL, why, sizeof(why)),
                     -XFER_EPROTO);
    assert_int_equal(out_len, -1);
    xfer_hs_server_free(h);
    h = xfer_hs_server_new(&srv);
    assert_int_equal(
        xfer_hs_server_step(h, in, XFER_HS_FRAME_MAX + 1, out, &out_len, NULL, why, sizeof(why)),
        -XFER_EPROTO);
    xfer_hs_server_free(h);
}

static void test_garbage_and_oversize(void **state)
{
    (void)state;
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    struct xfer_hs_self self = {.node_id = "srv"};
    char why[256];
    const uint8_t junk[] = {5, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff};
    assert_int_equal(write(sv[0], junk, sizeof(junk)), (ssize_t)sizeof(junk));
    assert_int_equal(xfer_handshake_server(sv[1], &self, 500, NULL, why, sizeof(why)),
                     -XFER_EPROTO);
    const uint8_t huge[] = {0xff, 0xff, 0xff, 0x7f}; /* 2 GiB frame: refused unread */
    assert_int_equal(write(sv[0], huge, sizeof(huge)), (ssize_t)sizeof(huge));
    assert_int_equal(xfer_handshake_server(sv[1], &self, 500, NULL, why, sizeof(why)),
                     -XFER_EPROTO);
    close(sv[0]);
    close(sv[1]);
}

static void test_silent_and_truncated_peer(void **state)
{
    (void)state;
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    struct xfer_hs_self self = {.node_id = "srv"};
    char why[256];
    int64_t t0 = xfer_now_ms();
    assert_int_equal(xfer_handshake_server(sv[1], &self, 300, NULL, why, sizeof(why)),
                     -XFER_ETIMEDOUT);
    int64_t took = xfer_now_ms() - t0;
    assert_true(took >= 250 && took < 2000);
    const uint8_t partial[] = {100, 0, 0, 0, 1, 2};
    assert_int_equal(write(sv[0], partial, sizeof(partial)), (ssize_t)sizeof(partial));
    close(sv[0]);
    assert_int_equal(xfer_handshake_server(sv[1], &self, 500, NULL, why, sizeof(why)), -XFER_ECONN);
    close(sv[1]);
}

static void test_frame_roundtrip_and_limit(void **state)
{
    (void)state;
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    assert_int_equal(xfer_frame_send(sv[0], "hello", 5, 500), 0);
    assert_int_equal(xfer_frame_send(sv[0], "", 0, 500), 0);
    uint8_t *buf;
    size_t len;
    assert_int_equal(xfer_frame_recv(sv[1], 64, 500, &buf, &len), 0);
    assert_int_equal(len, 5);
    assert_memory_equal(buf, "hello", 5);
    free(buf);
    assert_int_equal(xfer_frame_recv(sv[1], 64, 500, &buf, &len), 0);
    assert_int_equal(len, 0);
    free(buf);
    assert_int_equal(xfer_frame_send(sv[0], "0123456789", 10, 500), 0);
    assert_int_equal(xfer_frame_recv(sv[1], 9, 500, &buf, &len), -XFER_EPROTO);
    assert_int_equal(xfer_frame_send(sv[0], "x", XFER_FRAME_MAX + 1u, 500), -XFER_EINVAL);
    close(sv[0]);
    close(sv[1]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_secret_both),
        cmocka_unit_test(test_same_secret),
        cmocka_unit_test(test_wrong_secret),
        cmocka_unit_test(test_client_without_secret),
        cmocka_unit_test(test_server_without_secret),
        cmocka_unit_test(test_server_steps),
        cmocka_unit_test(test_garbage_and_oversize),
        cmocka_unit_test(test_silent_and_truncated_peer),
        cmocka_unit_test(test_frame_roundtrip_and_limit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
