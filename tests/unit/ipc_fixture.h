/* Test fixture for the ipc unit tests (test_ipc_waiter.c, test_ipc_ring.c):
 * engines in this process reachable over ipc, and a raw ipc client that
 * claims to be one of them (same uid, no secret: the handshake accepts it).
 * Header-only; the includer defines IO_TIMEOUT (the engines' io_timeout_ms)
 * and includes cmocka first. */
#ifndef XFER_TEST_IPC_FIXTURE_H
#define XFER_TEST_IPC_FIXTURE_H

#include "ipc/ipc.h"
#include "xfer_handshake.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

struct side {
    xfer_engine *e;
    xfer_region *r;
    xfer_peer *p;
    struct xfer_peer_desc d;
};

static void side_new(struct side *s, const char *name)
{
    struct xfer_engine_config cfg;
    xfer_engine_config_init(&cfg);
    cfg.node_id = name;
    cfg.transports = XFER_TRANSPORT_IPC | XFER_TRANSPORT_TCP;
    cfg.io_timeout_ms = IO_TIMEOUT;
    int rc;
    s->e = xfer_engine_new(&cfg, &rc);
    assert_non_null(s->e);
    assert_int_equal(xfer_region_alloc(s->e, "buf", 1 << 20, XFER_ACCESS_RW, &s->r), 0);
    xfer_engine_describe(s->e, &s->d);
}

/* Two engines that know each other, connected over ipc both ways. */
static void linked(struct side *A, struct side *B, const char *a, const char *b)
{
    side_new(A, a);
    side_new(B, b);
    assert_int_equal(xfer_peer_add(A->e, &B->d, &A->p), 0);
    assert_int_equal(xfer_peer_add(B->e, &A->d, &B->p), 0);
    assert_int_equal(xfer_peer_connect(A->p), 0);
    assert_int_equal(xfer_peer_connect(B->p), 0);
    assert_int_equal(xfer_peer_transport(A->p), XFER_TRANSPORT_IPC);
    assert_int_equal(xfer_peer_transport(B->p), XFER_TRANSPORT_IPC);
}

/* A raw ipc client of a, claiming to be b: past the handshake and HELLO
 * (its flags in *flags unless NULL). */
static int raw_as(const struct side *a, const struct side *b, uint32_t *flags)
{
    char why[256];
    int fd = ipc_sock_connect(a->d.node_id, a->d.incarnation, 2000, why, sizeof(why));
    assert_true(fd >= 0);
    struct xfer_hs_self self = {.node_id = b->d.node_id, .incarnation = b->d.incarnation};
    struct xfer_hs_peer peer;
    assert_int_equal(xfer_handshake_client(fd, &self, 2000, &peer, why, sizeof(why)), 0);
    struct ipc_hello hello;
    struct ipc_hdr h;
    int ctl = -1;
    assert_int_equal(ipc_recv(fd, &h, &hello, sizeof(hello), &ctl, 2000), 0);
    assert_int_equal(h.type, IPC_HELLO);
    if (ctl >= 0)
        close(ctl);
    if (flags)
        *flags = hello.flags;
    return fd;
}

/* Has a closed fd within ms? (EOF or a reset; anything else it sent is read past) */
static bool closed_within(int fd, int ms)
{
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        int left = ms - (int)((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000);
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (left <= 0 || poll(&p, 1, left) != 1)
            return false;
        char buf[256];
        ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
            return true;
    }
}

#endif
