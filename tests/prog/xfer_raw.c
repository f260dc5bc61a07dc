/*
 * Raw data-plane client for bad-input tests: does a real handshake (unless
 * the case is about the handshake), then misbehaves, and checks that the
 * server closes the connection within --within-ms.
 *
 *   xfer_raw --peer FILE --case CASE [--within-ms N] [--region scratch]
 *
 * cases: garbage      4 KiB of random bytes instead of a header
 *        bad-magic    a well-formed header with a wrong magic
 *        huge         WRITE_REQ announcing a 1 GiB payload (over the limit)
 *        bad-op       a response op sent to the target
 *        trunc-hdr    20 bytes of a header, then close (server must survive)
 *        trunc-payload WRITE_REQ of 1 MiB, 1000 bytes of it, then close
 *        stall        WRITE_REQ of 1 MiB, 1000 bytes, then silence: the
 *                     server must cut us after its io_timeout
 *        pre-hs       garbage before any handshake
 *        hs-stall     connect and say nothing for --within-ms (others must
 *                     still be able to connect meanwhile)
 */
#include "node_common.h"
#include "xfer_io.h"
#include "handshake.h"
#include "wire.h"

#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

static int dial(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
        perror("connect");
        return -1;
    }
    return fd;
}

/* Waits for EOF/reset from the server; returns ms waited or -1. */
static double wait_closed(int fd, int within_ms)
{
    double t0 = now_s();
    uint8_t buf[4096];
    for (;;) {
        int left = within_ms - (int)((now_s() - t0) * 1e3);
        struct pollfd p = {fd, POLLIN, 0};
        if (left <= 0 || poll(&p, 1, left) <= 0)
            return -1;
        ssize_t n = recv(fd, buf, sizeof(buf), 0);
        if (n == 0 || (n < 0 && errno == ECONNRESET))
            return (now_s() - t0) * 1e3;
        /* responses to valid frames may come first; keep reading */
    }
}

static void send_all(int fd, const void *buf, size_t len)
{
    if (xfer_io_write_all(fd, buf, len, xfer_now_ms() + 3000) < 0)
        fprintf(stderr, "raw: send failed (server closed early?)\n");
}

static void header(uint8_t *out, uint8_t op, const struct xfer_region_desc *d, uint64_t len)
{
    struct xfer_wire_hdr h = {.version = XFER_PROTO_VERSION,
                              .op = op,
                              .req_id = 1,
                              .region_id = d->id,
                              .gen = d->gen,
                              .offset = 0,
                              .length = len,
                              .payload = op == XFER_WIRE_WRITE_REQ ? (uint32_t)len : 0};
    xfer_wire_encode(&h, out);
}

int main(int argc, char **argv)
{
    static const struct option lo[] = {{"peer", 1, 0, 'p'},
                                       {"case", 1, 0, 'c'},
                                       {"within-ms", 1, 0, 'w'},
                                       {"region", 1, 0, 'r'},
                                       {0, 0, 0, 0}};
    const char *peer = NULL, *cs = NULL, *region = "scratch";
    int within = 3000;
    for (int c; (c = getopt_long(argc, argv, "", lo, NULL)) != -1;) {
        if (c == 'p')
            peer = optarg;
        else if (c == 'c')
            cs = optarg;
        else if (c == 'w')
            within = atoi(optarg);
        else if (c == 'r')
            region = optarg;
        else
            return 2;
    }
    struct node_file nf;
    if (!peer || !cs || node_file_read(peer, &nf) < 0)
        return 2;
    const struct xfer_region_desc *d = node_region(&nf, region);
    int fd = d ? dial(nf.peer.data_port) : -1;
    if (fd < 0)
        return 1;
    if (!strcmp(cs, "hs-stall")) { /* connect, say nothing, hold the socket */
        wait_closed(fd, within);
        close(fd);
        printf("raw hs-stall: held the connection for up to %d ms\n", within);
        return 0;
    }
    if (strcmp(cs, "pre-hs")) {
        struct xfer_hs_self self = {"raw-client", 12345, NULL, 0, 0};
        struct xfer_hs_peer hp;
        char why[200];
        int rc = xfer_handshake_client(fd, &self, 3000, &hp, why, sizeof(why));
        if (rc < 0) {
            fprintf(stderr, "raw: handshake: %s\n", why);
            return 1;
        }
    }
    uint8_t hdr[XFER_WIRE_HDR_LEN], junk[4096];
    pattern_fill(junk, sizeof(junk), (uint64_t)getpid(), 0);
    bool expect_close = true;
    if (!strcmp(cs, "garbage") || !strcmp(cs, "pre-hs")) {
        send_all(fd, junk, sizeof(junk));
    } else if (!strcmp(cs, "bad-magic")) {
        header(hdr, XFER_WIRE_READ_REQ, d, 16);
        hdr[0] ^= 0xff;
        send_all(fd, hdr, sizeof(hdr));
    } else if (!strcmp(cs, "huge")) {
        header(hdr, XFER_WIRE_WRITE_REQ, d, 1u << 30);
        send_all(fd, hdr, sizeof(hdr));
    } else if (!strcmp(cs, "bad-op")) {
        header(hdr, XFER_WIRE_WRITE_RESP, d, 0);
        send_all(fd, hdr, sizeof(hdr));
    } else if (!strcmp(cs, "trunc-hdr")) {
        header(hdr, XFER_WIRE_READ_REQ, d, 16);
        send_all(fd, hdr, 20);
        expect_close = false;
    } else if (!strcmp(cs, "trunc-payload") || !strcmp(cs, "stall")) {
        header(hdr, XFER_WIRE_WRITE_REQ, d, 1 << 20);
        send_all(fd, hdr, sizeof(hdr));
        send_all(fd, junk, 1000);
        expect_close = !strcmp(cs, "stall");
    } else {
        fprintf(stderr, "raw: unknown case %s\n", cs);
        return 2;
    }
    if (!expect_close) {
        close(fd);
        printf("raw %s: sent and closed\n", cs);
        return 0;
    }
    double ms = wait_closed(fd, within);
    close(fd);
    if (ms < 0) {
        printf("raw %s: FAIL, server did not close the connection within %d ms\n", cs, within);
        return 1;
    }
    printf("raw %s: server closed the connection after %.0f ms\n", cs, ms);
    return 0;
}
