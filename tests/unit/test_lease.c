/* Lease rules (engine/lease.c) as xfer_region_acquire_by applies them:
 * unguarded bytes open, guarded bytes only to a live lease of the accessing
 * node, accesses spanning several rules, partial drops, expiry, renewal,
 * supersession of dead rules, unguard. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>
#include <time.h>

#include "transport.h"
#include "xfer.h"

static int setup(void **state)
{
    struct xfer_engine_config cfg;
    xfer_engine_config_init(&cfg);
    cfg.node_id = "unit";
    cfg.transports = XFER_TRANSPORT_TCP;
    int rc;
    *state = xfer_engine_new(&cfg, &rc);
    return *state ? 0 : -1;
}

static int teardown(void **state)
{
    xfer_engine_free(*state);
    return 0;
}

/* 0 when peer may READ [off, off+len) of r, else the code. */
static int access_by(xfer_engine *e, xfer_region *r, const char *peer, uint64_t off, uint64_t len)
{
    int err = 0;
    xfer_region *got = xfer_region_acquire_by(e, peer, xfer_region_id(r), xfer_region_gen(r),
                                              XFER_OP_READ, off, len, &err);
    if (got)
        xfer_region_release(got);
    return err;
}

static void test_guarded_ranges(void **state)
{
    xfer_engine *e = *state;
    xfer_region *r;
    assert_int_equal(xfer_region_alloc(e, "g", 4096, XFER_ACCESS_RW, &r), 0);
    assert_int_equal(access_by(e, r, "a", 0, 4096), 0); /* no rules: open */
    int err;
    xfer_lease *la = xfer_lease_new(e, "a", 60000, &err), *lb = xfer_lease_new(e, "b", 60000, &err);
    assert_non_null(la);
    assert_non_null(lb);
    struct xfer_range ra[] = {{100, 100}, {200, 100}}, rb[] = {{1000, 100}};
    assert_int_equal(xfer_lease_add(la, r, ra, 2), 0);
    assert_int_equal(xfer_lease_add(lb, r, rb, 1), 0);
    assert_int_equal(xfer_lease_add(la, r, (struct xfer_range[]){{4000, 200}}, 1), -XFER_ERANGE);
    assert_int_equal(access_by(e, r, "a", 150, 100), 0);           /* spans two of a's rules */
    assert_int_equal(access_by(e, r, "a", 0, 150), 0);             /* partly unguarded */
    assert_int_equal(access_by(e, r, "a", 250, 100), 0);           /* [300,350) is unguarded */
    assert_int_equal(access_by(e, r, "a", 0, 4096), -XFER_ESTALE); /* touches b's */
    assert_int_equal(access_by(e, r, "b", 150, 10), -XFER_ESTALE);
    assert_int_equal(access_by(e, r, NULL, 150, 10), -XFER_ESTALE);
    assert_int_equal(access_by(e, r, "b", 1000, 100), 0);
    assert_int_equal(access_by(e, r, "b", 2000, 100), 0);
    assert_int_equal(access_by(e, r, "b", 150, 0), 0); /* zero bytes touch nothing */

    /* dropping the middle of a rule: that part refused, the rest kept */
    assert_int_equal(xfer_lease_drop(la, r, (struct xfer_range[]){{120, 10}}, 1), 0);
    assert_int_equal(access_by(e, r, "a", 100, 20), 0);
    assert_int_equal(access_by(e, r, "a", 119, 2), -XFER_ESTALE);
    assert_int_equal(access_by(e, r, "a", 130, 170), 0);

    /* b granted the dropped part too: both may read what both hold */
    struct xfer_range mid = {120, 10};
    assert_int_equal(xfer_lease_add(lb, r, &mid, 1), 0);
    assert_int_equal(access_by(e, r, "b", 120, 10), 0);
    assert_int_equal(access_by(e, r, "a", 120, 10), -XFER_ESTALE);

    /* ending a lease refuses all its ranges; renewal is refused after */
    xfer_lease_end(la);
    assert_int_equal(access_by(e, r, "a", 200, 10), -XFER_ESTALE);
    assert_int_equal(xfer_lease_renew(la, 1000), -XFER_ESTALE);
    assert_false(xfer_lease_live(la));

    /* a new grant over dead rules supersedes them: the table stays small */
    size_t before = xfer_region_guard_count(r);
    xfer_lease *lc = xfer_lease_new(e, "c", 60000, &err);
    assert_int_equal(xfer_lease_add(lc, r, (struct xfer_range[]){{0, 400}}, 1), 0);
    assert_true(xfer_region_guard_count(r) < before + 1);
    assert_int_equal(access_by(e, r, "c", 100, 200), 0);
    assert_int_equal(access_by(e, r, "a", 100, 10), -XFER_ESTALE);
    assert_int_equal(access_by(e, r, "b", 120, 10), 0); /* b's live rule is kept */

    xfer_lease_free(la);
    xfer_lease_free(lb);
    xfer_lease_free(lc);
    assert_int_equal(access_by(e, r, "c", 100, 10), -XFER_ESTALE); /* freed: still guarded */
    assert_int_equal(access_by(e, r, "c", 3000, 10), 0);
    assert_int_equal(xfer_region_unguard(r), 0);
    assert_int_equal(xfer_region_guard_count(r), 0);
    assert_int_equal(access_by(e, r, "x", 0, 4096), 0);
    assert_int_equal(xfer_region_deregister(e, r), 0);
}

/* CLOCK_MONOTONIC in whole milliseconds, truncated as the engine's
 * xfer_now_ms: a lease deadline is renew_ms + ttl in those units, so only
 * times read the same way compare exactly (a finer t0 can be up to 1 ms
 * later than the renewal's truncated reading). */
static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void test_expiry_and_renewal(void **state)
{
    xfer_engine *e = *state;
    xfer_region *r;
    assert_int_equal(xfer_region_alloc(e, "t", 4096, XFER_ACCESS_RW, &r), 0);
    int err;
    xfer_lease *l = xfer_lease_new(e, "a", 400, &err);
    assert_int_equal(xfer_lease_add(l, r, (struct xfer_range[]){{0, 512}}, 1), 0);
    struct timespec step = {0, 100 * 1000000};
    int64_t t0 = 0;
    for (int i = 0; i < 5; i++) { /* 500 ms, renewed every 100 ms */
        assert_int_equal(access_by(e, r, "a", 0, 512), 0);
        t0 = mono_ms();
        assert_int_equal(xfer_lease_renew(l, 400), 0);
        nanosleep(&step, NULL);
    }
    assert_int_equal(access_by(e, r, "a", 0, 512), 0);
    /* no more renewals: refused 400 ms after the last one */
    int rc = 0;
    for (int i = 0; i < 100 && rc == 0; i++) {
        rc = access_by(e, r, "a", 0, 512);
        if (rc == 0)
            nanosleep(&(struct timespec){0, 10 * 1000000}, NULL);
    }
    int64_t t1 = mono_ms();
    assert_int_equal(rc, -XFER_ESTALE);
    assert_true(t1 - t0 >= 400);
    xfer_lease_free(l);
    assert_int_equal(xfer_region_deregister(e, r), 0); /* frees the rules */
}

/* What the rdma owner binds memory windows over (xfer_region_lease_window)
 * and re-checks them with (xfer_region_lease_admits). */
static void test_rdma_windows(void **state)
{
    xfer_engine *e = *state;
    xfer_region *r;
    assert_int_equal(xfer_region_alloc(e, "w", 8192, XFER_ACCESS_RW | XFER_ACCESS_LEASED, &r), 0);
    struct xfer_region_desc d;
    xfer_region_describe(r, &d);
    assert_int_equal(d.access, XFER_ACCESS_RW); /* LEASED is never published */
    uint64_t wo = 0, wl = 0;
    int64_t until = 0, now = mono_ms();
    /* nothing guarded: the whole region, relying on no lease */
    assert_int_equal(xfer_region_lease_window(r, "a", 100, 10, &wo, &wl, &until), 0);
    assert_true(wo == 0 && wl == 8192 && until == INT64_MAX);
    int err;
    xfer_lease *la = xfer_lease_new(e, "a", 60000, &err), *lb = xfer_lease_new(e, "b", 60000, &err);
    struct xfer_range ra[] = {{1000, 100}, {1100, 100}, {3000, 100}};
    assert_int_equal(xfer_lease_add(la, r, ra, 3), 0);
    /* only a's rules guarded: a may reach all of it */
    assert_int_equal(xfer_region_lease_window(r, "a", 7000, 10, &wo, &wl, &until), 0);
    assert_true(wo == 0 && wl == 8192 && until >= now + 60000 && until < now + 61000);
    assert_int_equal(xfer_lease_add(lb, r, (struct xfer_range[]){{5000, 100}}, 1), 0);
    /* b's rule: a's window is widened over a's adjacent rules only */
    assert_int_equal(xfer_region_lease_window(r, "a", 1050, 10, &wo, &wl, &until), 0);
    assert_true(wo == 1000 && wl == 200 && until < INT64_MAX);
    assert_int_equal(xfer_region_lease_window(r, "a", 1150, 150, &wo, &wl, &until), 0);
    assert_true(wo == 1000 && wl == 300); /* [1200, 1300) is unguarded */
    assert_int_equal(xfer_region_lease_window(r, "a", 7000, 10, &wo, &wl, &until), 0);
    assert_true(wo == 7000 && wl == 10 && until == INT64_MAX); /* unguarded: just the access */
    assert_int_equal(xfer_region_lease_window(r, "a", 5000, 10, &wo, &wl, &until), -XFER_ESTALE);
    assert_int_equal(xfer_region_lease_window(r, "b", 5050, 10, &wo, &wl, &until), 0);
    assert_true(wo == 5000 && wl == 100);
    /* re-checks: a drop in the middle, then the end of the lease */
    assert_int_equal(xfer_region_lease_admits(r, "a", 1000, 200, &until), 0);
    assert_int_equal(xfer_lease_drop(la, r, (struct xfer_range[]){{1100, 100}}, 1), 0);
    assert_int_equal(xfer_region_lease_admits(r, "a", 1000, 200, &until), -XFER_ESTALE);
    assert_int_equal(xfer_region_lease_admits(r, "a", 1000, 100, &until), 0);
    xfer_lease_end(la);
    assert_int_equal(xfer_region_lease_admits(r, "a", 1000, 100, &until), -XFER_ESTALE);
    assert_int_equal(xfer_region_lease_admits(r, "b", 5000, 100, &until), 0);
    /* a deadline: until says when to look again, and then it is refused */
    xfer_lease *lc = xfer_lease_new(e, "c", 300, &err);
    assert_int_equal(xfer_lease_add(lc, r, (struct xfer_range[]){{6000, 100}}, 1), 0);
    now = mono_ms();
    assert_int_equal(xfer_region_lease_admits(r, "c", 6000, 100, &until), 0);
    assert_true(until > now && until <= now + 300);
    int rc = 0;
    while (rc == 0 && mono_ms() < now + 5000)
        rc = xfer_region_lease_admits(r, "c", 6000, 100, &until);
    assert_int_equal(rc, -XFER_ESTALE);
    assert_true(mono_ms() >= now + 299);
    xfer_lease_free(la);
    xfer_lease_free(lb);
    xfer_lease_free(lc);
    assert_int_equal(xfer_region_deregister(e, r), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_guarded_ranges, setup, teardown),
        cmocka_unit_test_setup_teardown(test_expiry_and_renewal, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rdma_windows, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
