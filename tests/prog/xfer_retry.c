/*
 * Cancel vs. retry (issue 18 item 7): after xfer_batch_cancel() returns, no
 * byte of the cancelled batch may land at the target after a byte sent
 * later, and a cancelled WRITE must not write zeros into the target.
 *
 *   xfer_retry --peer FILE [--rounds N] [--sockets N] [--reconnect]
 *
 * Against a node serving region "rw". Each round WRITEs pattern A over the
 * whole region as 16 items spread over the peer's sockets, cancels it
 * mid-flight (0..15 ms in), then:
 *  - even rounds: WRITEs pattern B (the retry) over the same range at once
 *    and READs it back twice: it must hold B only;
 *  - odd rounds: READs the range back first: every byte must be the
 *    round's old content or A's (a zero-filled frame remainder is neither),
 *    then WRITEs B and checks it as above.
 * --reconnect: every round replaces the connection between the cancel and
 * the retry (xfer_peer_connect, as xferd does for a broken peer): the old
 * sockets' unsent frames, their FENCE frames included, are dropped, while
 * frames already in the kernels' buffers still reach the target; the new
 * connection must carry the fence before the retry.
 * Prints how many items the cancels ended (the test script checks that
 * cancels hit transfers in flight). Exit 0 when every round held, 1 with the
 * first bad offset otherwise.
 */
#include "node_common.h"

#include <getopt.h>
#include <stdint.h>
#include <unistd.h>

/* First offset where got differs from want, or -1. */
static int64_t first_diff(const uint8_t *got, const uint8_t *want, uint64_t len)
{
    if (!memcmp(got, want, len))
        return -1;
    for (uint64_t i = 0; i < len; i++)
        if (got[i] != want[i])
            return (int64_t)i;
    return -1;
}

/* First offset holding neither old[i] nor a[i], or -1. */
static int64_t first_foreign(const uint8_t *got, const uint8_t *old, const uint8_t *a, uint64_t len)
{
    for (uint64_t i = 0; i < len; i++)
        if (got[i] != old[i] && got[i] != a[i])
            return (int64_t)i;
    return -1;
}

static int write_items(xfer_engine *e, xfer_region *l, xfer_peer *p,
                       const struct xfer_region_desc *rd, int n, xfer_batch **out)
{
    int rc;
    xfer_batch *b = xfer_batch_new(e, &rc);
    if (!b)
        return rc;
    uint64_t piece = rd->len / (uint64_t)n;
    for (int i = 0; i < n; i++) {
        struct xfer_item it = {XFER_OP_WRITE, l,       (uint64_t)i * piece, p,
                               rd->id,        rd->gen, (uint64_t)i * piece, piece};
        xfer_batch_add(b, &it);
    }
    *out = b;
    return xfer_batch_submit(b, 20000);
}

struct bufs {
    xfer_region *a, *b, *rd; /* pattern A, pattern B (retry), read back */
    uint8_t *pa, *pb, *pr, *old;
};

/* READs the whole remote region into bf->pr. */
static int read_back(xfer_engine *e, struct bufs *bf, xfer_peer *p,
                     const struct xfer_region_desc *rd)
{
    return xfer_read(e, bf->rd, 0, p, rd->id, rd->gen, 0, rd->len, 20000);
}

static int cancelled_items, reconnect;

static int round_run(xfer_engine *e, struct bufs *bf, xfer_peer *p,
                     const struct xfer_region_desc *rd, int round)
{
    uint64_t len = rd->len;
    pattern_fill(bf->pa, len, 1000 + (uint64_t)round, 0);
    pattern_fill(bf->pb, len, 5000 + (uint64_t)round, 0);
    xfer_batch *b = NULL;
    int rc = write_items(e, bf->a, p, rd, 16, &b);
    if (rc < 0) {
        fprintf(stderr, "round %d: submit: %s\n", round, xfer_strerror(rc));
        xfer_batch_free(b);
        return 1;
    }
    usleep((useconds_t)(round % 16) * 1000);
    rc = xfer_batch_cancel(b);
    for (size_t i = 0; i < xfer_batch_count(b); i++)
        cancelled_items += xfer_batch_item_status(b, i) == -XFER_ECANCELED;
    xfer_batch_free(b);
    if (rc < 0) {
        fprintf(stderr, "round %d: cancel: %s\n", round, xfer_strerror(rc));
        return 1;
    }
    if (reconnect && (rc = xfer_peer_connect(p)) < 0) {
        fprintf(stderr, "round %d: reconnect: %s\n", round, xfer_strerror(rc));
        return 1;
    }
    int64_t bad;
    if (round & 1) {
        if ((rc = read_back(e, bf, p, rd)) < 0) {
            fprintf(stderr, "round %d: read after cancel: %s\n", round, xfer_strerror(rc));
            return 1;
        }
        if ((bad = first_foreign(bf->pr, bf->old, bf->pa, len)) >= 0) {
            fprintf(stderr,
                    "round %d: after cancel, byte %lld is 0x%02x: neither the old content "
                    "(0x%02x) nor the cancelled write's (0x%02x)\n",
                    round, (long long)bad, bf->pr[bad], bf->old[bad], bf->pa[bad]);
            return 1;
        }
    }
    rc = xfer_write(e, bf->b, 0, p, rd->id, rd->gen, 0, len, 20000);
    if (rc < 0) {
        fprintf(stderr, "round %d: retry write: %s\n", round, xfer_strerror(rc));
        return 1;
    }
    for (int k = 0; k < 2; k++) { /* the second read comes after any straggler */
        if ((rc = read_back(e, bf, p, rd)) < 0) {
            fprintf(stderr, "round %d: read after retry: %s\n", round, xfer_strerror(rc));
            return 1;
        }
        if ((bad = first_diff(bf->pr, bf->pb, len)) >= 0) {
            fprintf(stderr,
                    "round %d (read %d): byte %lld is 0x%02x, the retry wrote 0x%02x (the "
                    "cancelled write's: 0x%02x): an older byte landed after the retry\n",
                    round, k + 1, (long long)bad, bf->pr[bad], bf->pb[bad], bf->pa[bad]);
            return 1;
        }
    }
    memcpy(bf->old, bf->pb, len);
    return 0;
}

int main(int argc, char **argv)
{
    const char *peer = NULL;
    int rounds = 60, sockets = 4;
    static const struct option lo[] = {{"peer", 1, 0, 'p'},
                                       {"rounds", 1, 0, 'r'},
                                       {"sockets", 1, 0, 's'},
                                       {"reconnect", 0, 0, 'c'},
                                       {0, 0, 0, 0}};
    for (int c; (c = getopt_long(argc, argv, "", lo, NULL)) != -1;) {
        if (c == 'p')
            peer = optarg;
        else if (c == 'r')
            rounds = atoi(optarg);
        else if (c == 's')
            sockets = atoi(optarg);
        else if (c == 'c')
            reconnect = 1;
        else
            return 2;
    }
    struct node_file nf;
    if (!peer || node_file_read(peer, &nf) < 0) {
        fprintf(stderr, "usage: xfer_retry --peer FILE [--rounds N] [--sockets N] [--reconnect]\n");
        return 2;
    }
    const struct xfer_region_desc *rd = node_region(&nf, "rw");
    xfer_peer *p;
    int rc;
    xfer_engine *e = client_engine("retrier", &nf, NULL, sockets, &p, &rc);
    if (!rd || !e || rc < 0) {
        fprintf(stderr, "set-up: %s\n", e ? xfer_engine_last_error(e) : xfer_strerror(rc));
        return 1;
    }
    struct bufs bf = {0};
    if (xfer_region_alloc(e, "a", rd->len, XFER_ACCESS_RW, &bf.a) < 0 ||
        xfer_region_alloc(e, "b", rd->len, XFER_ACCESS_RW, &bf.b) < 0 ||
        xfer_region_alloc(e, "r", rd->len, XFER_ACCESS_RW, &bf.rd) < 0 ||
        !(bf.old = malloc(rd->len))) {
        fprintf(stderr, "set-up: %s\n", xfer_engine_last_error(e));
        return 1;
    }
    bf.pa = xfer_region_ptr(bf.a);
    bf.pb = xfer_region_ptr(bf.b);
    bf.pr = xfer_region_ptr(bf.rd);
    /* Known starting content. */
    pattern_fill(bf.pb, rd->len, 4999, 0);
    rc = xfer_write(e, bf.b, 0, p, rd->id, rd->gen, 0, rd->len, 20000);
    memcpy(bf.old, bf.pb, rd->len);
    int failed = rc < 0;
    int r = 0;
    for (; !failed && r < rounds; r++)
        failed = round_run(e, &bf, p, rd, r);
    printf("retry: %d of %d rounds held (region %llu bytes, %d sockets%s), %d items cancelled "
           "in flight\n",
           failed ? r - 1 : r, rounds, (unsigned long long)rd->len, sockets,
           reconnect ? ", reconnecting" : "", cancelled_items);
    free(bf.old);
    xfer_engine_free(e);
    return failed ? 1 : 0;
}
