/*
 * xfer_notify wire: raw tcp frames after a real handshake (oversized,
 * truncated and inconsistent message frames, two-sided frames referring to
 * nothing, notifications not behind their data); the node answers or cuts,
 * and keeps serving. Header-only (each helper is one program built from
 * one main file): included by xfer_notify.c, which defines FAIL (say why,
 * return 1).
 */
#ifndef XFER_TEST_NOTIFY_WIRE_H
#define XFER_TEST_NOTIFY_WIRE_H

#include "xfer_io.h"
#include "handshake.h"
#include "msg_wire.h"
#include "node_common.h"
#include "transport.h"
#include "wire.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#ifndef FAIL
#error "notify_wire.h: the including program defines FAIL"
#endif

static int raw_connect(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0)
        return -1;
    struct xfer_hs_self hs = {"raw-notify", 4242, NULL, 0, 0};
    struct xfer_hs_peer hp;
    char why[200];
    if (xfer_handshake_client(fd, &hs, 3000, &hp, why, sizeof(why)) < 0) {
        fprintf(stderr, "handshake: %s\n", why);
        close(fd);
        return -1;
    }
    return fd;
}

/* Sends h (op, region, offset, and for a batch's frames F_SEQ and seq)
 * with len bytes of body, announcing `announce` bytes; when want_resp,
 * reads the response and returns its status (-1000 = no answer). */
static int raw_frame(int fd, struct xfer_wire_hdr h, uint32_t seq, const void *body, uint32_t len,
                     uint32_t announce, bool want_resp)
{
    static uint64_t req = 1;
    h.version = XFER_PROTO_VERSION;
    h.req_id = (uint64_t)seq << 32 | req++;
    h.flags = seq ? XFER_WIRE_F_SEQ : 0;
    h.length = h.payload = announce;
    uint8_t hdr[XFER_WIRE_HDR_LEN];
    xfer_wire_encode(&h, hdr);
    int64_t dl = xfer_now_ms() + 3000;
    if (xfer_io_write_all(fd, hdr, sizeof(hdr), dl) < 0 ||
        (len && xfer_io_write_all(fd, body, len, dl) < 0))
        return -1000;
    if (!want_resp)
        return 0;
    uint8_t in[XFER_WIRE_HDR_LEN];
    struct xfer_wire_hdr r;
    if (xfer_io_read_all(fd, in, sizeof(in), xfer_now_ms() + 3000) < 0 ||
        xfer_wire_decode(in, 64u << 20, &r) < 0 || r.op != h.op + 1 || r.req_id != h.req_id)
        return -1000;
    return r.status;
}

/* MSG_REQ (see raw_frame); 1 = no answer. */
static int raw_msg(int fd, const void *body, uint32_t len, uint32_t announce, bool want_resp)
{
    struct xfer_wire_hdr h = {.op = XFER_WIRE_MSG_REQ};
    int st = raw_frame(fd, h, 0, body, len, announce, want_resp);
    return st == -1000 ? 1 : st;
}

static uint32_t frame_of(struct xfer_msg_hdr *h, const char *msg, uint8_t *out)
{
    h->msg_len = (uint32_t)strlen(msg);
    xfer_msg_encode(h, NULL, msg, out);
    return (uint32_t)xfer_msg_frame_len(h);
}

/* Notifications behind their data (docs/notify.md): the target delivers a
 * MSG_REQ naming batch seq and n frames only if exactly those n WRITE
 * frames of seq came just before it on this socket and landed; else it
 * answers XFER_MSG_NOT_BEHIND and delivers nothing (the receiver counts
 * any "NOTBEHIND" notification as bad). */
static int run_behind(int fd, const struct xfer_region_desc *rd)
{
    static uint8_t f[256], data[64];
    struct xfer_msg_hdr no = {.kind = XFER_MSG_NOTIFY}, yes = {.kind = XFER_MSG_NOTIFY};
    uint32_t nlen = frame_of(&no, "NOTBEHIND", f);
    static uint8_t fy[256];
    uint32_t ylen = frame_of(&yes, "PING", fy);
    struct xfer_wire_hdr w = {.op = XFER_WIRE_WRITE_REQ, .region_id = rd->id, .gen = rd->gen};
    w.offset = rd->len - sizeof(data); /* the end of the region: no test checks it */
    struct xfer_wire_hdr m = {.op = XFER_WIRE_MSG_REQ};
    struct {
        const char *what;
        uint32_t seqs[3]; /* WRITE frames sent first (0 = none) */
        bool refuse;      /* the first one out of bounds */
        uint32_t seq, frames;
        int want;
    } cases[] = {
        {"1 of 2 frames", {70, 0, 0}, false, 70, 2, XFER_MSG_NOT_BEHIND},
        {"a refused frame", {71, 0, 0}, true, 71, 1, XFER_MSG_NOT_BEHIND},
        {"another batch between", {72, 73, 0}, false, 72, 1, XFER_MSG_NOT_BEHIND},
        {"no frame at all", {0, 0, 0}, false, 74, 1, XFER_MSG_NOT_BEHIND},
        {"2 of 2 frames", {75, 75, 0}, false, 75, 2, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        for (int k = 0; k < 3 && cases[i].seqs[k]; k++) {
            struct xfer_wire_hdr wk = w;
            if (k == 0 && cases[i].refuse)
                wk.offset = rd->len; /* past the end */
            int st = raw_frame(fd, wk, cases[i].seqs[k], data, sizeof(data), sizeof(data), true);
            if (st != (k == 0 && cases[i].refuse ? -XFER_ERANGE : 0))
                FAIL("behind, %s: WRITE answered %d", cases[i].what, st);
        }
        m.region_id = cases[i].frames;
        bool good = cases[i].want == 0;
        int st = raw_frame(fd, m, cases[i].seq, good ? fy : f, good ? ylen : nlen,
                           good ? ylen : nlen, true);
        printf("wire: behind, %-22s -> %d\n", cases[i].what, st);
        if (st != cases[i].want)
            FAIL("behind, %s: expected %d, got %d", cases[i].what, cases[i].want, st);
    }
    return 0;
}

static int run_wire(const char *peer)
{
    struct node_file nf;
    if (node_file_read(peer, &nf) < 0)
        FAIL("node file");
    int fd = raw_connect(nf.peer.data_port);
    if (fd < 0)
        FAIL("connect");
    static uint8_t f[XFER_MSG_FRAME_MAX];
    struct {
        const char *what;
        struct xfer_msg_hdr h;
        int cut; /* bytes removed from the end of the frame */
    } cases[] = {
        {"truncated frame", {.kind = XFER_MSG_NOTIFY}, 3},
        {"unknown kind", {.kind = 9}, 0},
        {"failed > items", {.kind = XFER_MSG_NOTIFY, .flags = 1, .n_items = 1, .n_failed = 2}, 0},
        {"items in a standalone", {.kind = XFER_MSG_NOTIFY, .n_items = 3}, 0},
        {"status without failures", {.kind = XFER_MSG_NOTIFY, .status = -XFER_EIO}, 0},
        {"unknown flags", {.kind = XFER_MSG_NOTIFY, .flags = 0x80}, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        uint32_t len = frame_of(&cases[i].h, "bad", f) - (uint32_t)cases[i].cut;
        int st = raw_msg(fd, f, len, len, true);
        printf("wire: %-24s -> %s\n", cases[i].what, xfer_strerror(st));
        if (st != -XFER_EPROTO)
            FAIL("%s: expected EPROTO, got %d", cases[i].what, st);
    }
    /* a message over XFER_NOTIFY_MAX inside a frame that fits */
    struct xfer_msg_hdr big = {.kind = XFER_MSG_NOTIFY, .msg_len = XFER_NOTIFY_MAX + 1};
    memset(f, 'x', sizeof(f));
    xfer_msg_encode(&big, NULL, f + XFER_MSG_HDR_LEN, f);
    uint32_t blen = (uint32_t)xfer_msg_frame_len(&big);
    if (raw_msg(fd, f, blen, blen, true) != -XFER_EPROTO)
        FAIL("oversized message not refused");
    /* two-sided frames that refer to nothing: a FIN for a send never made,
     * an RTS from a node the target does not know, a malformed RTS body */
    struct xfer_msg_fin fin = {0xdeadbeef, 0, 0};
    uint32_t flen = (uint32_t)xfer_msg_encode_fin(1, &fin, f);
    if (raw_msg(fd, f, flen, flen, true) != -XFER_ENOENT)
        FAIL("FIN for an unknown send not refused with ENOENT");
    struct xfer_msg_rts rts = {.send_id = 1, .tag = 5, .len = 10};
    rts.src.len = 100;
    strcpy(rts.src.name, "x");
    uint32_t rlen = (uint32_t)xfer_msg_encode_rts(2, &rts, f);
    if (raw_msg(fd, f, rlen, rlen, true) != -XFER_ENOENT)
        FAIL("RTS from an unknown node not refused with ENOENT");
    rts.off = 95; /* 95 + 10 > 100 */
    xfer_msg_encode_rts(3, &rts, f);
    if (raw_msg(fd, f, rlen, rlen, true) != -XFER_EPROTO)
        FAIL("RTS outside its region not refused with EPROTO");
    uint8_t ten[10] = {0}; /* eager: 10 bytes ride, the body says 9 */
    rts.off = 0;
    rts.eager = ten;
    rlen = (uint32_t)xfer_msg_encode_rts(4, &rts, f);
    xfer_put64(f + XFER_MSG_HDR_LEN + 16, 9);
    if (raw_msg(fd, f, rlen, rlen, true) != -XFER_EPROTO)
        FAIL("eager RTS with bytes other than its length not refused with EPROTO");
    printf("wire: FIN/RTS referring to nothing -> ENOENT, bad RTS/eager RTS -> EPROTO\n");
    if (nf.n_regions < 1 || run_behind(fd, &nf.regions[0]) != 0)
        FAIL("notifications behind their data");
    struct xfer_msg_hdr ok = {.kind = XFER_MSG_NOTIFY};
    uint32_t len = frame_of(&ok, "PING", f);
    if (raw_msg(fd, f, len, len, true) != 0)
        FAIL("valid frame after bad ones not accepted");
    close(fd);
    /* a frame over XFER_MSG_FRAME_MAX: the node cuts the connection */
    fd = raw_connect(nf.peer.data_port);
    if (fd < 0 || raw_msg(fd, NULL, 0, XFER_MSG_FRAME_MAX + 1, false) != 0)
        FAIL("connect 2");
    struct pollfd p = {.fd = fd, .events = POLLIN};
    char c;
    if (poll(&p, 1, 3000) != 1 || recv(fd, &c, 1, 0) != 0)
        FAIL("oversized frame: connection not closed within 3 s");
    close(fd);
    printf("wire: oversized frame -> connection closed\n");
    return 0;
}

#endif
