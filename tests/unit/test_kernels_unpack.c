/* TCPX unpack on the CPU: the fragment checks every method relies on, and
 * the CPU reference on random fragment lists (out of order, gaps). */
#include "xfer.h"
#include "xfer_kernels.h"

#include "../gpu/unpack_frags.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

static void test_method_names(void **state)
{
    (void)state;
    enum xfer_unpack_method m;
    assert_int_equal(xfer_unpack_method_parse("kernel", &m), 0);
    assert_int_equal(m, XFER_UNPACK_KERNEL);
    assert_int_equal(xfer_unpack_method_parse("d2d", &m), 0);
    assert_int_equal(m, XFER_UNPACK_D2D);
    assert_int_equal(xfer_unpack_method_parse("host", &m), 0);
    assert_string_equal(xfer_unpack_method_name(m), "host");
    assert_int_equal(xfer_unpack_method_parse("gpu", &m), -XFER_EINVAL);
    assert_int_equal(xfer_unpack_method_parse(NULL, &m), -XFER_EINVAL);
}

static void test_check(void **state)
{
    (void)state;
    struct xfer_unpack_frag f[3] = {{100, 10, 20}, {0, 20, 0}, {50, 5, 30}};
    size_t bad = 99;
    assert_int_equal(xfer_unpack_check(f, 3, 200, 35, &bad), 0);
    assert_int_equal(xfer_unpack_check(f, 3, 0, 35, &bad), 0); /* bounce size unknown */
    assert_int_equal(xfer_unpack_check(f, 3, 109, 35, &bad), -XFER_ERANGE); /* past the bounce */
    assert_int_equal(bad, 0);
    assert_int_equal(xfer_unpack_check(f, 3, 200, 34, &bad), -XFER_ERANGE); /* past the dst */
    assert_int_equal(bad, 2);
    assert_int_equal(xfer_unpack_check(f, 3, 200, 36, &bad), -XFER_EPROTO); /* a gap */
    assert_int_equal(bad, 3);
    f[2].dst_off = 25; /* overlaps fragment 0, leaves [30, 35) uncovered */
    assert_int_equal(xfer_unpack_check(f, 3, 200, 35, &bad), -XFER_EPROTO);
    f[2].dst_off = UINT64_MAX - 2; /* wraps */
    assert_int_equal(xfer_unpack_check(f, 3, 200, 35, &bad), -XFER_ERANGE);
    assert_int_equal(xfer_unpack_check(NULL, 0, 0, 0, NULL), 0);
    assert_int_equal(xfer_unpack_check(NULL, 1, 0, 0, NULL), -XFER_EINVAL);
}

/* Random lists: the reference puts every byte where the fragments say. */
static void test_reference_random(void **state)
{
    (void)state;
    enum { CAP = 4096, MAXMSG = 1 << 20 };
    static struct xfer_unpack_frag f[CAP];
    uint8_t *bounce = malloc(3 * MAXMSG), *dst = malloc(MAXMSG), *want = malloc(MAXMSG);
    assert_non_null(bounce);
    for (uint64_t round = 0; round < 200; round++) {
        uint64_t s = round * 7919 + 1, blen;
        uint64_t total = 1 + uf_rand(&s) % MAXMSG;
        uint32_t fixed = round % 3 == 0 ? 4096 : round % 3 == 1 ? 1 + (uint32_t)(round % 97) : 0;
        size_t n = uf_make(f, CAP, total, fixed, 64, round + 5, &blen);
        total = 0; /* what the fragments cover (less when CAP cut the list) */
        for (size_t i = 0; i < n; i++)
            total = f[i].dst_off + f[i].len > total ? f[i].dst_off + f[i].len : total;
        assert_true(blen <= 3 * (uint64_t)MAXMSG);
        for (uint64_t i = 0; i < blen; i++)
            bounce[i] = (uint8_t)(i * 131 + round);
        for (size_t i = 0; i < n; i++)
            memcpy(want + f[i].dst_off, bounce + f[i].src_off, f[i].len);
        memset(dst, 0xee, total);
        if (n < CAP)
            assert_int_equal(xfer_unpack_check(f, n, blen, total, NULL), 0);
        xfer_kref_unpack(dst, bounce, f, n);
        assert_memory_equal(dst, want, total);
    }
    free(bounce);
    free(dst);
    free(want);
}

/* Without a GPU the unpacker says so; host pointers are host memory. */
static void test_no_device(void **state)
{
    (void)state;
    if (xfer_kernels_probe(NULL) == 0)
        skip();
    struct xfer_unpacker *u = (struct xfer_unpacker *)&u;
    assert_int_equal(xfer_unpacker_new(0, &u), -XFER_ENODEV);
    assert_null(u);
    int x = 5, y = 0;
    assert_int_equal(xfer_kernels_ptr_device(&x), -1);
    assert_ptr_equal(xfer_kernels_host_ptr(&x), &x);
    assert_int_equal(xfer_kernels_copy(&y, &x, sizeof(x)), 0);
    assert_int_equal(y, 5);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_method_names),
        cmocka_unit_test(test_check),
        cmocka_unit_test(test_reference_random),
        cmocka_unit_test(test_no_device),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
