/*
 * Vectored items (xfer_batch_add_segments) against a served node, every
 * byte checked, on whatever transport the engines pick (tcp, or ipc when
 * XFER_TRANSPORTS allows it on one host).
 *
 *   xfer_vec --peer FILE [--region rw] [--pattern-seed N] [--rounds N]
 *            [--seed N] [--guard REGION:OFF] [--expect tcp|ipc]
 *
 * Random rounds: a batch of 1..4 vectored items (READ or WRITE, 1..4096
 * segments of 1 B..64 KiB, now and then one of 20,000 segments: several
 * ipc jobs and groups) plus a plain item; the remote ranges of a batch are
 * disjoint and so are the local ones, so the outcome is exact. A shadow of
 * the region is kept as in xfer_random and the whole region is compared at
 * the end. Then: a segment past the remote region's end fails its item with
 * -XFER_ERANGE naming that segment; with --guard (the server's
 * --guard REGION:OFF:LEN, a range no lease covers) a segment touching it
 * fails with -XFER_ESTALE naming it; bad
 * lists are refused at add; a cancelled READ batch ends cleanly. Long
 * segments (cut into slices for the ipc copy threads) among short ones go
 * both ways; a WRITE list with one segment past the remote end moves no
 * byte at all, on every transport. Plain items back to back (one frame on
 * tcp) land whole, and past the end or on a guarded range fail one by one.
 */
#include "items_common.h"

#include <math.h>

#define MAX_ITEMS 5

/* The items of one batch as the test sees them. */
struct vec {
    enum xfer_op op;
    struct xfer_seg *s;
    size_t n;
};

/* n slots of size/n bytes on each side, shuffled, one segment per slot:
 * remote and local ranges disjoint whatever the item. */
static size_t make_segs(struct ctx *c, struct xfer_seg *out, size_t n, uint64_t *rperm,
                        uint64_t *lperm)
{
    uint64_t slot = c->size / n;
    for (size_t k = 0; k < n; k++)
        rperm[k] = lperm[k] = k;
    for (size_t k = n; k > 1; k--) {
        size_t a = rnd() % k, b = rnd() % k;
        uint64_t t = rperm[k - 1];
        rperm[k - 1] = rperm[a];
        rperm[a] = t;
        t = lperm[k - 1];
        lperm[k - 1] = lperm[b];
        lperm[b] = t;
    }
    size_t m = 0;
    for (size_t k = 0; k < n; k++) {
        uint64_t cap = slot < 65536 ? slot : 65536;
        uint64_t len =
            1 + (uint64_t)exp(log((double)cap) * (double)(rnd() >> 11) / 9007199254740992.0);
        len = len > cap ? cap : len;
        uint64_t ro = rperm[k] * slot + rnd() % (slot - len + 1);
        uint64_t lo = lperm[k] * slot + rnd() % (slot - len + 1);
        out[m++] = (struct xfer_seg){lo, ro, len};
    }
    return m;
}

/* One random batch: its segments share one slot layout (disjoint). */
static void random_round(struct ctx *c, xfer_batch *b, struct xfer_seg *all, uint64_t *rp,
                         uint64_t *lp)
{
    size_t total = rnd() % 16 == 0 ? 20000 : 1 + rnd() % 4096;
    size_t m = make_segs(c, all, total, rp, lp);
    struct vec v[MAX_ITEMS];
    size_t nv = 0, at = 0, nitems = 1 + rnd() % 4;
    xfer_batch_reset(b);
    for (size_t i = 0; i < nitems && at < m; i++) {
        size_t n = i + 1 == nitems ? m - at : 1 + rnd() % (m - at);
        v[nv] = (struct vec){rnd() & 1 ? XFER_OP_READ : XFER_OP_WRITE, all + at, n};
        at += n;
        for (size_t k = 0; k < v[nv].n; k++) {
            const struct xfer_seg *s = &v[nv].s[k];
            if (v[nv].op == XFER_OP_WRITE)
                pattern_fill(c->lp + s->local_off, s->len, rnd(), s->local_off);
            else
                memset(c->lp + s->local_off, 0xa5, s->len);
        }
        struct xfer_item it = item_head(c, v[nv].op, c->rd);
        int idx = xfer_batch_add_segments(b, &it, v[nv].s, v[nv].n);
        CHECK(idx == (int)nv, "add_segments: %d (%s)", idx, xfer_engine_last_error(c->e));
        nv++;
    }
    int rc = xfer_batch_submit(b, 60000);
    if (rc == 0)
        rc = xfer_batch_wait(b, -1);
    CHECK(rc == 0, "batch of %zu vectored items, %zu segments: %s", nv, m, xfer_strerror(rc));
    for (size_t i = 0; i < nv; i++) { /* READs saw the content before the batch */
        int st = xfer_batch_item_status(b, i);
        CHECK(st == 0, "item %zu: %s", i, xfer_batch_item_error(b, i));
        unsigned t = xfer_batch_item_transport(b, i);
        CHECK(!c->expect || t == c->expect, "item %zu went over transport %u", i, t);
        for (size_t k = 0; st == 0 && v[i].op == XFER_OP_READ && k < v[i].n; k++) {
            const struct xfer_seg *s = &v[i].s[k];
            CHECK(!memcmp(c->lp + s->local_off, c->shadow + s->remote_off, s->len),
                  "READ item %zu segment %zu (remote %llu, %llu B) differs", i, k,
                  (unsigned long long)s->remote_off, (unsigned long long)s->len);
        }
    }
    for (size_t i = 0; i < nv; i++)
        for (size_t k = 0; v[i].op == XFER_OP_WRITE && k < v[i].n; k++) {
            const struct xfer_seg *s = &v[i].s[k];
            memcpy(c->shadow + s->remote_off, c->lp + s->local_off, s->len);
        }
}

/* A READ item of n segments where segment bad is replaced by `evil`:
 * expects code, the failed segment named by number and in the reason. */
static void expect_bad_segment(struct ctx *c, const struct xfer_region_desc *rd, xfer_batch *b,
                               size_t n, size_t bad, struct xfer_seg evil, int code,
                               const char *what)
{
    struct xfer_seg s[64];
    for (size_t k = 0; k < n; k++)
        s[k] = (struct xfer_seg){k * 4096, k * 4096, 4096};
    s[bad] = evil;
    xfer_batch_reset(b);
    struct xfer_item it = item_head(c, XFER_OP_READ, rd);
    CHECK(xfer_batch_add_segments(b, &it, s, n) == 0, "%s: add: %s", what,
          xfer_engine_last_error(c->e));
    expect_item_fails(c, b, (int64_t)bad, code, what);
}

/* Long segments (slices of 256 KiB over the ipc copy threads) among
 * short ones, WRITTEN then READ back into other local bytes, every byte
 * checked: the parts a host list is cut into land where they belong. */
static void long_round(struct ctx *c, xfer_batch *b)
{
    uint64_t big = c->size / 8; /* remote [0, 4 big) written, read back to local [4 big, 8 big) */
    struct xfer_seg w[6] = {{0, 3 * big, big},       {big, 2 * big, 300000},
                            {2 * big, 0, 7},         {2 * big + 7, 100, 65536},
                            {3 * big, big, big / 2}, {3 * big + big / 2, big + big / 2, 1}};
    struct xfer_seg r[6];
    for (int k = 0; k < 6; k++) /* the same remote ranges, into the upper local half */
        r[k] = (struct xfer_seg){4 * big + w[k].local_off, w[k].remote_off, w[k].len};
    pattern_fill(c->lp, 4 * big, rnd(), 0);
    memset(c->lp + 4 * big, 0xa5, 4 * big);
    for (int op = 0; op < 2; op++) {
        xfer_batch_reset(b);
        struct xfer_item it = item_head(c, op ? XFER_OP_READ : XFER_OP_WRITE, c->rd);
        CHECK(xfer_batch_add_segments(b, &it, op ? r : w, 6) == 0, "long: add");
        int rc = xfer_batch_submit(b, 60000);
        rc = rc ? rc : xfer_batch_wait(b, -1);
        CHECK(rc == 0, "long %s: %s (%s)", op ? "READ" : "WRITE", xfer_strerror(rc),
              xfer_batch_item_error(b, 0));
    }
    for (int k = 0; k < 6; k++) {
        CHECK(!memcmp(c->lp + r[k].local_off, c->lp + w[k].local_off, w[k].len),
              "long: segment %d (%llu B) read back differs", k, (unsigned long long)w[k].len);
        memcpy(c->shadow + w[k].remote_off, c->lp + w[k].local_off, w[k].len);
    }
}

/* A WRITE list whose one segment runs past the remote end is refused
 * before any byte of it moves: the remote region still holds the shadow
 * (the engine checks the list whole against the region's descriptor before
 * any transport sees it; ipc's owner checks it whole again). Until
 * 2026-11-28 tcp, tcpx and rdma sent the 63 good segments. */
static void refused_write(struct ctx *c, xfer_batch *b)
{
    struct xfer_seg s[64];
    for (size_t k = 0; k < 64; k++)
        s[k] = (struct xfer_seg){k * 4096, k * 8192, 4096};
    s[40].remote_off = c->size - 100;
    pattern_fill(c->lp, 64 * 4096, rnd(), 0);
    xfer_batch_reset(b);
    struct xfer_item it = item_head(c, XFER_OP_WRITE, c->rd);
    CHECK(xfer_batch_add_segments(b, &it, s, 64) == 0, "refused write: add");
    int rc = xfer_batch_submit(b, 10000);
    rc = rc ? rc : xfer_batch_wait(b, -1);
    CHECK(rc == -XFER_ERANGE, "refused write: %s", xfer_strerror(rc));
    CHECK(xfer_batch_item_failed_segment(b, 0) == 40, "refused write: failed segment %lld",
          (long long)xfer_batch_item_failed_segment(b, 0));
    printf("refused write: %s (segment %lld): %s\n", xfer_strerror(rc),
           (long long)xfer_batch_item_failed_segment(b, 0), xfer_batch_item_error(b, 0));
    final_check(c); /* nothing of the 63 good segments moved either */
}

/* A WRITE list with one segment on a range no lease covers: ipc's owner
 * refuses the list whole (lease rules are the owner's alone: tcp, tcpx and
 * rdma check them per chunk or window, where good segments may land,
 * docs/engine.md "All or nothing"). The 32 good ranges read back as before. */
static void refused_guard_write(struct ctx *c, xfer_batch *b)
{
    enum { N = 32, LEN = 4096 };
    struct xfer_seg s[N + 1];
    for (size_t k = 0; k < N; k++) /* [0, 256 KiB): below the guard */
        s[k] = (struct xfer_seg){k * LEN, k * 2 * LEN, LEN};
    s[N] = (struct xfer_seg){N * LEN, c->guard_off, LEN};
    uint8_t *before = c->lp + 2 * N * LEN, *after = before + 2 * N * LEN;
    int rc = xfer_read(c->e, c->local, 2 * N * LEN, c->p, c->grd->id, c->grd->gen, 0, 2 * N * LEN,
                       10000);
    CHECK(rc == 0, "guarded write: read before: %s", xfer_strerror(rc));
    pattern_fill(c->lp, (N + 1) * LEN, rnd(), 0);
    xfer_batch_reset(b);
    struct xfer_item it = item_head(c, XFER_OP_WRITE, c->grd);
    CHECK(xfer_batch_add_segments(b, &it, s, N + 1) == 0, "guarded write: add");
    rc = xfer_batch_submit(b, 10000);
    rc = rc ? rc : xfer_batch_wait(b, -1);
    printf("guarded write: %s (segment %lld): %s\n", xfer_strerror(rc),
           (long long)xfer_batch_item_failed_segment(b, 0), xfer_batch_item_error(b, 0));
    CHECK(rc == -XFER_ESTALE && xfer_batch_item_failed_segment(b, 0) == N,
          "guarded write: %s, segment %lld", xfer_strerror(rc),
          (long long)xfer_batch_item_failed_segment(b, 0));
    rc = xfer_read(c->e, c->local, 4 * N * LEN, c->p, c->grd->id, c->grd->gen, 0, 2 * N * LEN,
                   10000);
    CHECK(rc == 0 && !memcmp(before, after, 2 * N * LEN),
          "guarded write: good segments landed (%s)", xfer_strerror(rc));
}

/* n plain items of len bytes, back to back on both sides (local from lo,
 * remote from ro on rd): tcp sends such runs as one frame (docs/perf.md
 * "Runs"). Returns the batch's code. */
static int plain_run(struct ctx *c, xfer_batch *b, const struct xfer_region_desc *rd,
                     enum xfer_op op, size_t n, uint64_t len, uint64_t lo, uint64_t ro)
{
    xfer_batch_reset(b);
    for (size_t k = 0; k < n; k++) {
        struct xfer_item it = {op,     c->local, lo + k * len, c->p,
                               rd->id, rd->gen,  ro + k * len, len};
        CHECK(xfer_batch_add(b, &it) == (int)k, "run: add item %zu", k);
    }
    int rc = xfer_batch_submit(b, 10000);
    return rc ? rc : xfer_batch_wait(b, -1);
}

/* Contiguous plain items: every byte of a 96-item WRITE and READ checked;
 * a run reaching past the remote end (with and without the peer's cached
 * descriptor of the region) or onto a guarded range fails only the items
 * that do (each item gets the answer it would have alone). */
static void plain_runs(struct ctx *c, xfer_batch *b)
{
    enum { N = 96, LEN = 4096 };
    uint64_t ro = c->size / 2 + 12345;
    pattern_fill(c->lp, N * LEN, rnd(), 0);
    memset(c->lp + N * LEN, 0xa5, N * LEN);
    int rc = plain_run(c, b, c->rd, XFER_OP_WRITE, N, LEN, 0, ro);
    rc = rc ? rc : plain_run(c, b, c->rd, XFER_OP_READ, N, LEN, N * LEN, ro);
    CHECK(rc == 0, "run: %s (%s)", xfer_strerror(rc), xfer_batch_item_error(b, 0));
    CHECK(!memcmp(c->lp, c->lp + N * LEN, N * LEN), "run: read back differs");
    memcpy(c->shadow + ro, c->lp, N * LEN);
    /* 16 items from 8 items before the end: 8 land, 8 fail -XFER_ERANGE;
     * again without the peer's descriptor of the region (then the target
     * refuses the whole run first; tcp: ipc needs the descriptor) */
    for (int cached = 1; cached >= (c->expect == XFER_TRANSPORT_TCP ? 0 : 1); cached--) {
        if (!cached)
            CHECK(xfer_peer_region_remove(c->p, c->rd->id) == 0, "run: uncache the region");
        pattern_fill(c->lp, 16 * LEN, rnd(), 0);
        plain_run(c, b, c->rd, XFER_OP_WRITE, 16, LEN, 0, c->size - 8 * LEN);
        for (size_t k = 0; k < 16; k++) {
            int st = xfer_batch_item_status(b, k), want = k < 8 ? 0 : -XFER_ERANGE;
            CHECK(st == want, "run past the end (%s): item %zu: %s, want %s",
                  cached ? "cached" : "not cached", k, xfer_strerror(st), xfer_strerror(want));
        }
        memcpy(c->shadow + c->size - 8 * LEN, c->lp, 8 * LEN);
    }
    CHECK(xfer_peer_region_add(c->p, c->rd) == 0, "run: cache the region again");
    if (!c->grd)
        return;
    /* 32 items, the last 16 on the guarded 64 KiB: those fail -XFER_ESTALE */
    pattern_fill(c->lp, 32 * LEN, rnd(), 0);
    plain_run(c, b, c->grd, XFER_OP_WRITE, 32, LEN, 0, c->guard_off - 16 * LEN);
    for (size_t k = 0; k < 32; k++) {
        int st = xfer_batch_item_status(b, k), want = k < 16 ? 0 : -XFER_ESTALE;
        CHECK(st == want, "run onto a guarded range: item %zu: %s, want %s", k, xfer_strerror(st),
              xfer_strerror(want));
    }
    rc = xfer_read(c->e, c->local, 32 * LEN, c->p, c->grd->id, c->grd->gen, c->guard_off - 16 * LEN,
                   16 * LEN, 10000);
    CHECK(rc == 0 && !memcmp(c->lp, c->lp + 32 * LEN, 16 * LEN),
          "run onto a guarded range: the good items did not land (%s)", xfer_strerror(rc));
}

/* Lists refused at add, with nothing appended. */
static void bad_lists(struct ctx *c, xfer_batch *b)
{
    xfer_batch_reset(b);
    struct xfer_item it = item_head(c, XFER_OP_READ, c->rd);
    struct xfer_seg one = {0, 0, 16}, zero = {0, 0, 0}, past = {c->size - 8, 0, 16};
    CHECK(xfer_batch_add_segments(b, &it, &one, 0) == -XFER_EINVAL, "empty list accepted");
    CHECK(xfer_batch_add_segments(b, &it, NULL, 1) == -XFER_EINVAL, "NULL list accepted");
    CHECK(xfer_batch_add_segments(b, &it, &one, (size_t)XFER_SEGS_MAX + 1) == -XFER_EINVAL,
          "oversized list accepted");
    CHECK(xfer_batch_add_segments(b, &it, &zero, 1) == -XFER_EINVAL, "zero-length segment");
    CHECK(xfer_batch_add_segments(b, &it, &past, 1) == -XFER_ERANGE, "local overrun accepted");
    CHECK(strstr(xfer_engine_last_error(c->e), "segment 0") != NULL, "reason: %s",
          xfer_engine_last_error(c->e));
    struct xfer_item off = it;
    off.len = 16;
    CHECK(xfer_batch_add_segments(b, &off, &one, 1) == -XFER_EINVAL, "item length accepted");
    off = it;
    off.op = XFER_OP_SEND;
    CHECK(xfer_batch_add_segments(b, &off, &one, 1) == -XFER_EINVAL, "SEND accepted");
    CHECK(xfer_batch_count(b) == 0, "a refused list left %zu items", xfer_batch_count(b));
}

/* A large READ batch cancelled right after submit: every item ends with 0
 * or -XFER_ECANCELED, and the batch is reusable. */
static void cancel_round(struct ctx *c, xfer_batch *b, struct xfer_seg *all, uint64_t *rp,
                         uint64_t *lp)
{
    size_t m = make_segs(c, all, 20000, rp, lp);
    xfer_batch_reset(b);
    struct xfer_item it = item_head(c, XFER_OP_READ, c->rd);
    CHECK(xfer_batch_add_segments(b, &it, all, m / 2) == 0, "add");
    CHECK(xfer_batch_add_segments(b, &it, all + m / 2, m - m / 2) == 1, "add");
    CHECK(xfer_batch_submit(b, 10000) == 0, "submit");
    int rc = xfer_batch_cancel(b);
    int w = xfer_batch_wait(b, 10000);
    CHECK(rc == 0, "cancel: %s", xfer_strerror(rc));
    CHECK(w == 0 || w == -XFER_ECANCELED, "after cancel: %s", xfer_strerror(w));
    for (size_t i = 0; i < 2; i++) {
        int st = xfer_batch_item_status(b, i);
        CHECK(st == 0 || st == -XFER_ECANCELED, "item %zu after cancel: %s", i, xfer_strerror(st));
    }
}

/* A WRITE list to a read-only region is refused whole where it runs
 * (the engine's check against the cached descriptor): nothing moves. */
static void refused_readonly(struct ctx *c, xfer_batch *b)
{
    struct xfer_seg s[4] = {{0, 0, 16}, {4096, 4096, 16}, {8192, 8192, 16}, {12288, 12288, 16}};
    xfer_batch_reset(b);
    struct xfer_item it = item_head(c, XFER_OP_WRITE, c->ro);
    CHECK(xfer_batch_add_segments(b, &it, s, 4) == 0, "read-only: add");
    expect_item_fails(c, b, -1, -XFER_EACCES, "WRITE list to a read-only region");
}

int main(int argc, char **argv)
{
    struct ctx c = {.rounds = 60};
    int rc = items_setup(argc, argv, "vec-client", &c);
    if (rc)
        return rc;
    struct xfer_seg *all = malloc(20000 * sizeof(*all));
    uint64_t *rp = malloc(20000 * sizeof(*rp)), *lp = malloc(20000 * sizeof(*lp));
    xfer_batch *b = xfer_batch_new(c.e, &rc);
    if (!all || !rp || !lp || !b)
        return 1;
    printf("vec: %ld rounds, seed %llu, region %s of %llu bytes\n", c.rounds,
           (unsigned long long)rng_state, c.rd->name, (unsigned long long)c.size);
    double t0 = now_s();
    for (long r = 0; r < c.rounds && !failures; r++)
        random_round(&c, b, all, rp, lp);
    printf("vec: random rounds %s in %.1f s\n", failures ? "FAILED" : "passed", now_s() - t0);
    if (!failures)
        long_round(&c, b);
    if (!failures)
        plain_runs(&c, b);
    if (!failures)
        final_check(&c);
    if (!failures) /* every transport: the list is refused whole */
        refused_write(&c, b);
    if (!failures && c.grd && c.expect == XFER_TRANSPORT_IPC)
        refused_guard_write(&c, b);
    struct xfer_seg past = {5 * 4096, c.size - 100, 4096};
    expect_bad_segment(&c, c.rd, b, 9, 5, past, -XFER_ERANGE, "segment past the remote end");
    if (c.grd) {
        struct xfer_seg g = {3 * 4096, c.guard_off, 4096};
        expect_bad_segment(&c, c.grd, b, 7, 3, g, -XFER_ESTALE, "segment on a guarded range");
    }
    if (c.ro)
        refused_readonly(&c, b);
    bad_lists(&c, b);
    cancel_round(&c, b, all, rp, lp);
    xfer_batch_free(b);
    items_teardown(&c);
    free(all);
    free(rp);
    free(lp);
    printf("vec: %s (%d failures)\n", failures ? "FAILED" : "passed", failures);
    return failures ? 1 : 0;
}
