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
        cmocka_unit_test(test_check),
        cmocka_unit_test(test_gather_scatter),
        cmocka_unit_test(test_batched_ref),
        cmocka_unit_test(test_no_device),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
