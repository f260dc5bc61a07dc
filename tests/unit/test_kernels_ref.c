/* CPU reference of the kernels and the layout checks they share; the GPU
 * entry points must say -XFER_ENODEV where there is no device. */
#include "xfer.h"
#include "xfer_kernels.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#define L  3
#define NB 8
#define BB 40

static void test_check(void **state)
{
    (void)state;
    static char mem[L * NB * BB];
    void *bases[L] = {mem, mem + NB * BB, NULL};
    uint64_t ids[2] = {1, 7};
    struct xfer_kv_layout lay = {L, NB, BB, 0, NULL, mem, 0};
    assert_int_equal(xfer_kv_check(&lay, ids, 2), 0);
    assert_int_equal(xfer_kv_check(NULL, ids, 2), -XFER_EINVAL);
    assert_int_equal(xfer_kv_check(&lay, NULL, 2), -XFER_EINVAL);
    ids[1] = NB;
    assert_int_equal(xfer_kv_check(&lay, ids, 2), -XFER_ERANGE);
    ids[1] = 7;
    lay.block_stride = BB - 1;
    assert_int_equal(xfer_kv_check(&lay, ids, 2), -XFER_EINVAL);
    lay.block_stride = 0;
    lay.layer_stride = NB * BB - 1;
    assert_int_equal(xfer_kv_check(&lay, ids, 2), -XFER_EINVAL);
    lay.layer_stride = 0;
    lay.layer_base = bases; /* third layer NULL */
    assert_int_equal(xfer_kv_check(&lay, ids, 2), -XFER_EINVAL);
    lay.num_blocks = 0;
    assert_int_equal(xfer_kv_check(&lay, ids, 2), -XFER_EINVAL);
}

/* Gather from a single-tensor pool, scatter into a per-layer pool with
 * other ids: the listed blocks move, nothing else changes. */
static void test_gather_scatter(void **state)
{
    (void)state;
    static unsigned char a[L * NB * BB], b[L][NB * BB], buf[L * 3 * BB];
    for (size_t i = 0; i < sizeof(a); i++)
        a[i] = (unsigned char)(i * 7 + 1);
    memset(b, 0xee, sizeof(b));
    void *lb[L] = {b[0], b[1], b[2]};
    uint64_t ida[3] = {5, 0, 5}, idb[3] = {2, 7, 4};
    struct xfer_kv_layout A = {L, NB, BB, 0, NULL, a, 0};
    struct xfer_kv_layout B = {L, NB, BB, 0, lb, NULL, 0};
    assert_int_equal(xfer_kref_kv_gather(&A, ida, 3, buf), 0);
    for (int l = 0; l < L; l++)
        for (int i = 0; i < 3; i++)
            assert_memory_equal(buf + (l * 3 + i) * BB, a + (l * NB + ida[i]) * BB, BB);
    assert_int_equal(xfer_kref_kv_scatter(&B, idb, 3, buf), 0);
    for (int l = 0; l < L; l++)
        for (uint64_t k = 0; k < NB; k++) {
            int listed = -1;
            for (int i = 0; i < 3; i++)
                if (idb[i] == k)
                    listed = i;
            if (listed >= 0)
                assert_memory_equal(b[l] + k * BB, a + (l * NB + ida[listed]) * BB, BB);
            else
                assert_int_equal(b[l][k * BB], 0xee);
        }
    assert_int_equal(xfer_kref_kv_gather(&A, ida, 3, NULL), -XFER_EINVAL);
}

static void test_batched_ref(void **state)
{
    (void)state;
    char src[64], dst[64];
    for (int i = 0; i < 64; i++)
        src[i] = (char)i, dst[i] = 0;
    struct xfer_copy_desc d[3] = {
        {dst + 1, src + 10, 5}, {dst + 20, src, 0}, {dst + 30, src + 3, 17}};
    xfer_kref_batched_copy(d, 3);
    assert_memory_equal(dst + 1, src + 10, 5);
    assert_memory_equal(dst + 30, src + 3, 17);
    assert_int_equal(dst[0], 0);
    assert_int_equal(dst[20], 0);
}

/* Segment runs (the ipc worker's vectored GPU jobs): the descriptors and
 * prefix sums a launch uploads, both directions, checked by running them
 * through the CPU reference. */
static void test_copy_runs_fill(void **state)
{
    (void)state;
    char a[256], b[256];
    for (int i = 0; i < 256; i++)
        a[i] = (char)i, b[i] = (char)(255 - i);
    /* (a_off, b_off, len): run 0 copies b -> a (a is dst), run 1 a -> b */
    const uint64_t s0[] = {0, 100, 16, 32, 0, 8, 64, 200, 3};
    const uint64_t s1[] = {128, 16, 32};
    struct xfer_copy_run r[2] = {{a, b, s0, 3, 1}, {a, b, s1, 1, 0}};
    struct xfer_copy_desc d[4];
    uint64_t start[5], mis = 0;
    char a0[256], b0[256];
    memcpy(a0, a, sizeof(a));
    memcpy(b0, b, sizeof(b));
    assert_int_equal(xfer_copy_runs_fill(r, 2, d, start, &mis), 16 + 8 + 3 + 32);
    uint64_t want[5] = {0, 16, 24, 27, 59};
    assert_memory_equal(start, want, sizeof(want));
    assert_ptr_equal(d[0].dst, a + 0);
    assert_ptr_equal(d[0].src, b + 100);
    assert_ptr_equal(d[3].dst, b + 16);
    assert_ptr_equal(d[3].src, a + 128);
    assert_true((mis & 15) != 0); /* 64 vs 200 and 0 vs 100 differ mod 16 */
    xfer_kref_batched_copy(d, 4);
    assert_memory_equal(a, b0 + 100, 16);
    assert_memory_equal(a + 32, b0 + 0, 8);
    assert_memory_equal(a + 64, b0 + 200, 3);
    assert_memory_equal(b + 16, a0 + 128, 32);
    assert_int_equal(a[16], a0[16]); /* between segments: untouched */
    assert_int_equal(b[15], b0[15]);
    const uint64_t al[] = {16, 32, 48};
    struct xfer_copy_run r2 = {a, b, al, 1, 0};
    assert_int_equal(xfer_copy_runs_fill(&r2, 1, d, start, &mis), 48);
    assert_int_equal(mis & 15, ((uintptr_t)a ^ (uintptr_t)b) & 15);
}

static void test_no_device(void **state)
{
    (void)state;
    int n = -1;
    if (xfer_kernels_probe(&n) == 0)
        skip(); /* a GPU is present: tests/gpu covers it */
    assert_int_equal(n, 0);
    struct xfer_kstage *s = (struct xfer_kstage *)1;
    assert_int_equal(xfer_kstage_new(0, &s), -XFER_ENODEV);
    assert_null(s);
    struct xfer_copy_desc d = {NULL, NULL, 0};
    assert_int_equal(xfer_kernels_batched_copy(NULL, &d, 1, NULL), -XFER_ENODEV);
    xfer_kstage_free(NULL);
    struct xfer_kbatch *kb = (struct xfer_kbatch *)1;
    assert_int_equal(xfer_kbatch_new(&kb), -XFER_ENODEV);
    assert_null(kb);
    xfer_kbatch_free(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_check),       cmocka_unit_test(test_gather_scatter),
        cmocka_unit_test(test_batched_ref), cmocka_unit_test(test_copy_runs_fill),
        cmocka_unit_test(test_no_device),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
