/*
 * Test helper for the tcpx transport: connects to a node served by
 * xfer_node, says which transport the engine chose, runs one batch of READ
 * and WRITE items and checks each item's status against what is expected
 * (a misbehaving plugin must give clear per-item errors within the
 * deadline, and never crash or hang).
 *
 *   tcpx_check --peer FILE [--transport tcpx|tcp] [--expect-read WHAT]
 *              [--expect-write WHAT] [--items N] [--bytes N] [--deadline MS]
 *              [--region NAME (default rw)]
 *   WHAT: ok | error (any failure) | EPROTO | ETIMEDOUT | ECONN | EIO | ECANCELED
 */
#include "node_common.h"

#include <getopt.h>

static int want_code(const char *what)
{
    static const struct {
        const char *name;
        int code;
    } names[] = {{"ok", 0},
                 {"error", 1}, /* any failure */
                 {"EPROTO", -XFER_EPROTO},
                 {"ETIMEDOUT", -XFER_ETIMEDOUT},
                 {"ECONN", -XFER_ECONN},
                 {"EIO", -XFER_EIO},
                 {"ECANCELED", -XFER_ECANCELED}};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (!strcmp(what, names[i].name))
            return names[i].code;
    fprintf(stderr, "unknown expectation %s\n", what);
    exit(2);
}

static bool matches(int got, int want)
{
    return want == 1 ? got < 0 : got == want;
}

int main(int argc, char **argv)
{
    static const struct option lo[] = {
        {"peer", 1, 0, 'p'},         {"transport", 1, 0, 't'}, {"expect-read", 1, 0, 'r'},
        {"expect-write", 1, 0, 'w'}, {"items", 1, 0, 'n'},     {"bytes", 1, 0, 'b'},
        {"deadline", 1, 0, 'd'},     {"region", 1, 0, 'R'},    {0, 0, 0, 0}};
    const char *peer = NULL, *transport = NULL, *er = "ok", *ew = "ok", *region = "rw";
    int items = 8, deadline = 3000;
    uint64_t bytes = 1 << 20;
    for (int c; (c = getopt_long(argc, argv, "", lo, NULL)) != -1;) {
        switch (c) {
        case 'p':
            peer = optarg;
            break;
        case 't':
            transport = optarg;
            break;
        case 'r':
            er = optarg;
            break;
        case 'w':
            ew = optarg;
            break;
        case 'n':
            items = atoi(optarg);
            break;
        case 'b':
            bytes = strtoull(optarg, NULL, 0);
            break;
        case 'd':
            deadline = atoi(optarg);
            break;
        case 'R':
            region = optarg;
            break;
        default:
            return 2;
        }
    }
    struct node_file nf;
    if (!peer || node_file_read(peer, &nf) < 0)
        return 2;
    const struct xfer_region_desc *rd = node_region(&nf, region);
    xfer_peer *p;
    int rc;
    xfer_engine *e = client_engine("tcpx-check", &nf, NULL, 1, &p, &rc);
    if (!rd || !e || rc < 0) {
        fprintf(stderr, "connect: %s (%s)\n", xfer_strerror(rc),
                e ? xfer_engine_last_error(e) : "");
        xfer_engine_free(e);
        return 1;
    }
    char tname[32] = "";
    xfer_transports_format(xfer_peer_transport(p), tname, sizeof(tname));
    printf("transport chosen: %s\n", tname);
    int failures = 0;
    if (transport && strcmp(tname, transport)) {
        printf("FAIL: want transport %s\n", transport);
        failures++;
    }
    xfer_region *l;
    uint64_t total = (uint64_t)items * 2 * bytes;
    if (total > rd->len || xfer_region_alloc(e, "local", total, XFER_ACCESS_RW, &l) < 0) {
        fprintf(stderr, "region too small or no local memory\n");
        return 1;
    }
    pattern_fill(xfer_region_ptr(l), total, 5, 0);
    xfer_batch *b = xfer_batch_new(e, &rc);
    for (int i = 0; i < 2 * items; i++) {
        struct xfer_item it = {i & 1 ? XFER_OP_WRITE : XFER_OP_READ,
                               l,
                               i * bytes,
                               p,
                               rd->id,
                               rd->gen,
                               i * bytes,
                               bytes};
        xfer_batch_add(b, &it);
    }
    double t0 = now_s();
    xfer_batch_submit(b, deadline);
    rc = xfer_batch_wait(b, -1);
    double ms = (now_s() - t0) * 1e3;
    printf("batch: %s after %.0f ms (deadline %d ms)\n", xfer_strerror(rc), ms, deadline);
    if (ms > deadline + 1500) {
        printf("FAIL: the batch outlived its deadline\n");
        failures++;
    }
    int wr = want_code(er), ww = want_code(ew);
    for (int i = 0; i < 2 * items; i++) {
        int st = xfer_batch_item_status(b, (size_t)i);
        bool write = i & 1;
        bool ok = matches(st, write ? ww : wr);
        if (!ok || i < 4)
            printf("  item %2d %-5s %-10s %s%s\n", i, write ? "WRITE" : "READ",
                   st ? xfer_strerror(st) : "ok", st ? xfer_batch_item_error(b, (size_t)i) : "",
                   ok ? "" : "   <- unexpected");
        if (!ok)
            failures++;
        if (st < 0 && !xfer_batch_item_error(b, (size_t)i)[0]) {
            printf("  item %d failed without a reason\n", i);
            failures++;
        }
    }
    xfer_batch_free(b);
    xfer_engine_free(e);
    printf("tcpx_check: %d failures\n", failures);
    return failures ? 1 : 0;
}
