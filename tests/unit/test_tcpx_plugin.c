/* The NCCL net plugin loader against the test plugin (xfertest), once per
 * struct version it exports (v7..v12): properties, a connection made with
 * the non-blocking connect/accept loop, registration, one message each way
 * through isend/irecv/test, and the errors for a missing plugin or version. */
#include "tcpx_plugin.h"
#include "xfer.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

static char plugin[512];

static void nap(void)
{
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
}

static void round_trip(struct tcpx_net *n)
{
    uint8_t handle[XNCCL_NET_HANDLE_MAXSIZE];
    void *lc = NULL, *sc = NULL, *rc = NULL;
    assert_int_equal(tcpx_net_listen(n, handle, &lc), 0);
    for (int i = 0; i < 5000 && (!sc || !rc); i++, nap()) {
        xnccl_dh *none = NULL;
        if (!sc)
            assert_int_equal(tcpx_net_connect(n, handle, &sc, &none), 0);
        if (!rc)
            assert_int_equal(tcpx_net_accept(n, lc, &rc, &none), 0);
    }
    assert_non_null(sc);
    assert_non_null(rc);
    assert_int_equal(tcpx_net_close_listen(n, lc), 0);
    char out[100] = "hello over the plugin", in[100] = "";
    void *ms, *mr, *sreq = NULL, *rreq = NULL;
    assert_int_equal(tcpx_net_reg_mr(n, sc, out, sizeof(out), XNCCL_PTR_HOST, &ms), 0);
    assert_int_equal(tcpx_net_reg_mr(n, rc, in, sizeof(in), XNCCL_PTR_HOST, &mr), 0);
    assert_int_equal(tcpx_net_isend(n, sc, out, 22, 1, ms, &sreq), 0);
    assert_int_equal(tcpx_net_irecv(n, rc, in, sizeof(in), 1, mr, &rreq), 0);
    assert_non_null(sreq);
    assert_non_null(rreq);
    int sdone = 0, rdone = 0, size = -1, ssize;
    for (int i = 0; i < 5000 && (!sdone || !rdone); i++) {
        if (!sdone)
            assert_int_equal(tcpx_net_test(n, sreq, &sdone, &ssize), 0);
        if (!rdone)
            assert_int_equal(tcpx_net_test(n, rreq, &rdone, &size), 0);
    }
    assert_true(sdone && rdone);
    assert_int_equal(size, 22);
    assert_string_equal(in, out);
    /* a receive posted outside its registration is refused */
    assert_int_not_equal(tcpx_net_irecv(n, rc, in + 50, 100, 1, mr, &rreq), 0);
    tcpx_net_dereg_mr(n, sc, ms);
    tcpx_net_dereg_mr(n, rc, mr);
    assert_int_equal(tcpx_net_close_send(n, sc), 0);
    assert_int_equal(tcpx_net_close_recv(n, rc), 0);
}

static void test_versions(void **state)
{
    (void)state;
    for (int v = XNCCL_NET_VERSION_MIN; v <= XNCCL_NET_VERSION_MAX; v++) {
        struct tcpx_net *n;
        char why[256] = "";
        int rc = tcpx_net_get(plugin, v, &n, why, sizeof(why));
        if (rc)
            fail_msg("v%d: %s", v, why);
        assert_int_equal(n->version, v);
        assert_string_equal(n->props.name, "xfertest");
        assert_true(n->props.ptr_support & XNCCL_PTR_HOST);
        assert_int_equal(n->ndev, 1);
        round_trip(n);
        tcpx_net_put(n);
    }
}

static void test_newest_and_shared(void **state)
{
    (void)state;
    struct tcpx_net *a, *b;
    char why[256];
    assert_int_equal(tcpx_net_get(plugin, 0, &a, why, sizeof(why)), 0);
    assert_int_equal(a->version, XNCCL_NET_VERSION_MAX); /* newest first, as NCCL looks */
    assert_int_equal(tcpx_net_get(plugin, 0, &b, why, sizeof(why)), 0);
    assert_ptr_equal(a, b); /* one plugin per process */
    assert_int_equal(tcpx_net_get(plugin, 7, &b, why, sizeof(why)), -XFER_EBUSY);
    tcpx_net_put(a);
    tcpx_net_put(a);
}

static void test_missing(void **state)
{
    (void)state;
    struct tcpx_net *n = (struct tcpx_net *)&n;
    char why[256] = "";
    assert_int_equal(tcpx_net_get("/nonexistent/libnccl-net.so", 0, &n, why, sizeof(why)),
                     -XFER_ENOTSUP);
    assert_null(n);
    assert_non_null(strstr(why, "no NCCL net plugin"));
    assert_int_equal(tcpx_net_get(plugin, 6, &n, why, sizeof(why)), -XFER_ENOTSUP);
    assert_non_null(strstr(why, "exports no ncclNetPlugin_v6"));
    /* a library that is no plugin at all */
    assert_int_equal(tcpx_net_get("libc.so.6", 0, &n, why, sizeof(why)), -XFER_ENOTSUP);
}

int main(void)
{
    const char *b = getenv("B") ? getenv("B") : "build";
    const char *root = getenv("XFER_ROOT") ? getenv("XFER_ROOT") : ".";
    snprintf(plugin, sizeof(plugin), "%s/%s/tests/libnccl-net-xfertest.so", root, b);
    unsetenv("XFER_TESTNET_MODE");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_versions),
        cmocka_unit_test(test_newest_and_shared),
        cmocka_unit_test(test_missing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
