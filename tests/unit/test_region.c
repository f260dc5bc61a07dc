/* Region table: ids and generations, access and bounds checks at the edges,
 * memfd allocation and adoption, deregistration waiting for pins. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

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

static void test_ids_and_generations(void **state)
{
    xfer_engine *e = *state;
    static uint8_t mem[4096];
    xfer_region *a, *b;
    assert_int_equal(
        xfer_region_register(e, "a", mem, sizeof(mem), XFER_MEM_HOST, -1, XFER_ACCESS_RW, &a), 0);
    assert_int_equal(xfer_region_alloc(e, "b", 8192, XFER_ACCESS_R, &b), 0);
    assert_int_not_equal(xfer_region_id(a), xfer_region_id(b));
    assert_int_equal(xfer_region_gen(a), 1);
    xfer_region *dup;
    assert_int_equal(xfer_region_register(e, "a", mem, 16, XFER_MEM_HOST, -1, XFER_ACCESS_RW, &dup),
                     -XFER_EEXIST);
    uint32_t id = xfer_region_id(a);
    assert_int_equal(xfer_region_deregister(e, a), 0);
    assert_null(xfer_region_find(e, "a"));
    assert_int_equal(
        xfer_region_register(e, "a", mem, sizeof(mem), XFER_MEM_HOST, -1, XFER_ACCESS_RW, &a), 0);
    assert_int_equal(xfer_region_id(a), id); /* a name keeps its id ... */
    assert_int_equal(xfer_region_gen(a), 2); /* ... and gets a new generation */
    assert_ptr_equal(xfer_region_find(e, "a"), a);
    struct xfer_region_desc d;
    xfer_region_describe(b, &d);
    assert_string_equal(d.name, "b");
    assert_int_equal(d.len, 8192);
    assert_int_equal(d.access, XFER_ACCESS_R);
}

static void test_bad_arguments(void **state)
{
    xfer_engine *e = *state;
    static uint8_t mem[64];
    xfer_region *r;
    char longname[XFER_NAME_MAX + 4];
    memset(longname, 'x', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    assert_int_equal(xfer_region_register(e, "z", mem, 0, XFER_MEM_HOST, -1, XFER_ACCESS_RW, &r),
                     -XFER_EINVAL);
    assert_int_equal(
        xfer_region_register(e, longname, mem, 64, XFER_MEM_HOST, -1, XFER_ACCESS_RW, &r),
        -XFER_EINVAL);
    assert_int_equal(xfer_region_register(e, "z", mem, 64, XFER_MEM_HOST, -1, 0, &r), -XFER_EINVAL);
    assert_int_equal(xfer_region_register(e, "z", NULL, 64, XFER_MEM_HOST, -1, XFER_ACCESS_RW, &r),
                     -XFER_EINVAL);
}

static void test_acquire_checks(void **state)
{
    xfer_engine *e = *state;
    xfer_region *r, *ro;
    int err;
    assert_int_equal(xfer_region_alloc(e, "rw", 4096, XFER_ACCESS_RW, &r), 0);
    assert_int_equal(xfer_region_alloc(e, "ro", 4096, XFER_ACCESS_R, &ro), 0);
    uint32_t id = xfer_region_id(r), gen = xfer_region_gen(r);
    assert_null(xfer_region_acquire(e, 99999, 1, XFER_OP_READ, 0, 1, &err));
    assert_int_equal(err, -XFER_ENOENT);
    assert_null(xfer_region_acquire(e, id, gen + 1, XFER_OP_READ, 0, 1, &err));
    assert_int_equal(err, -XFER_ESTALE);
    assert_null(xfer_region_acquire(e, xfer_region_id(ro), 1, XFER_OP_WRITE, 0, 1, &err));
    assert_int_equal(err, -XFER_EACCES);
    /* bounds at the edges */
    struct {
        uint64_t off, len;
        int want;
    } cases[] = {
        {0, 4096, 0},
        {4095, 1, 0},
        {4096, 0, 0},
        {4096, 1, -XFER_ERANGE},
        {4097, 0, -XFER_ERANGE},
        {1, 4096, -XFER_ERANGE},
        {UINT64_MAX, 2, -XFER_ERANGE},
        {2, UINT64_MAX, -XFER_ERANGE},
        {UINT64_MAX - 4095, 4097, -XFER_ERANGE},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        xfer_region *a =
            xfer_region_acquire(e, id, gen, XFER_OP_WRITE, cases[i].off, cases[i].len, &err);
        assert_int_equal(err, cases[i].want);
        if (a) {
            assert_ptr_equal(a, r);
            xfer_region_release(a);
        }
    }
}

static void *deregister_thread(void *arg)
{
    void **ctx = arg;
    xfer_region_deregister(ctx[0], ctx[1]);
    __atomic_store_n((int *)ctx[2], 1, __ATOMIC_RELEASE);
    return NULL;
}

static void test_deregister_waits_for_pins(void **state)
{
    xfer_engine *e = *state;
    xfer_region *r;
    int err, done = 0;
    assert_int_equal(xfer_region_alloc(e, "pinned", 4096, XFER_ACCESS_RW, &r), 0);
    uint32_t id = xfer_region_id(r), gen = xfer_region_gen(r);
    xfer_region *a = xfer_region_acquire(e, id, gen, XFER_OP_READ, 0, 16, &err);
    assert_non_null(a);
    pthread_t t;
    void *ctx[3] = {e, r, &done};
    pthread_create(&t, NULL, deregister_thread, ctx);
    /* new accesses are refused at once, while the pinned one continues */
    for (int i = 0; i < 1000 && xfer_region_find(e, "pinned"); i++)
        usleep(1000);
    assert_null(xfer_region_acquire(e, id, gen, XFER_OP_READ, 0, 16, &err));
    assert_int_equal(err, -XFER_ENOENT);
    usleep(50000);
    assert_int_equal(__atomic_load_n(&done, __ATOMIC_ACQUIRE), 0);
    ((uint8_t *)xfer_region_ptr(a))[0] = 1; /* still mapped */
    xfer_region_release(a);
    pthread_join(t, NULL);
    assert_int_equal(done, 1);
}

static void test_memfd_alloc_and_adopt(void **state)
{
    xfer_engine *e = *state;
    xfer_region *r;
    assert_int_equal(xfer_region_alloc(e, "m", 1 << 20, XFER_ACCESS_RW, &r), 0);
    assert_true(xfer_region_memfd(r) >= 0);
    memset(xfer_region_ptr(r), 0x5a, 1 << 20);
    /* a second mapping of the same memfd sees the bytes: shareable */
    uint8_t *p2 = mmap(NULL, 1 << 20, PROT_READ, MAP_SHARED, xfer_region_memfd(r), 0);
    assert_true(p2 != MAP_FAILED);
    assert_int_equal(p2[12345], 0x5a);
    munmap(p2, 1 << 20);
    /* sealed: no holder of the fd can resize it under the mapping */
    assert_int_equal(ftruncate(xfer_region_memfd(r), 4096), -1);
    assert_int_equal(ftruncate(xfer_region_memfd(r), 2 << 20), -1);

    /* a memfd that cannot be sealed is refused */
    int raw = memfd_create("raw", MFD_CLOEXEC);
    assert_int_equal(ftruncate(raw, 8192), 0);
    xfer_region *a;
    assert_int_equal(xfer_region_adopt_memfd(e, "raw", raw, 8192, XFER_ACCESS_RW, &a),
                     -XFER_EINVAL);
    assert_non_null(strstr(xfer_engine_last_error(e), "not sealed"));
    close(raw);

    int fd = memfd_create("adopt", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    assert_int_equal(ftruncate(fd, 8192), 0);
    assert_int_equal(pwrite(fd, "hello", 5, 100), 5);
    assert_int_equal(xfer_region_adopt_memfd(e, "big", fd, 16384, XFER_ACCESS_RW, &a),
                     -XFER_ERANGE);
    assert_int_equal(xfer_region_adopt_memfd(e, "adopted", fd, 8192, XFER_ACCESS_R, &a), 0);
    assert_memory_equal((uint8_t *)xfer_region_ptr(a) + 100, "hello", 5);
    assert_int_equal(xfer_region_memfd(a), fd);
    assert_int_equal(ftruncate(fd, 4096), -1);         /* adopting sealed it */
    assert_int_equal(xfer_region_deregister(e, a), 0); /* closes fd */
    assert_int_equal(xfer_region_deregister(e, r), 0);
}

/* A region large enough to be populated by several threads (region_mem.c
 * splits from 2 x 64 MiB), with a length that is no multiple of the pieces:
 * every page is resident when alloc returns, and reads as zeros. */
static void test_alloc_prefaults_all_pages(void **state)
{
    xfer_engine *e = *state;
    xfer_region *r;
    size_t len = (130u << 20) + 4096, pg = (size_t)sysconf(_SC_PAGESIZE);
    assert_int_equal(xfer_region_alloc(e, "pf", len, XFER_ACCESS_RW, &r), 0);
    uint8_t *p = xfer_region_ptr(r);
    unsigned char *vec = malloc((len + pg - 1) / pg);
    assert_non_null(vec);
    assert_int_equal(mincore(p, len, vec), 0);
    size_t missing = 0;
    for (size_t i = 0; i < (len + pg - 1) / pg; i++)
        missing += !(vec[i] & 1);
    assert_int_equal(missing, 0);
    for (size_t off = 0; off < len; off += pg)
        assert_int_equal(p[off], 0);
    assert_int_equal(p[len - 1], 0);
    free(vec);
    assert_int_equal(xfer_region_deregister(e, r), 0);
}

static void count_region(const struct xfer_region_desc *d, void *arg)
{
    (void)d;
    (*(int *)arg)++;
}

static void test_foreach(void **state)
{
    xfer_engine *e = *state;
    xfer_region *r;
    int n0 = 0, n1 = 0;
    xfer_region_foreach(e, count_region, &n0);
    assert_int_equal(xfer_region_alloc(e, "f", 64, XFER_ACCESS_RW, &r), 0);
    xfer_region_foreach(e, count_region, &n1);
    assert_int_equal(n1, n0 + 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_ids_and_generations, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_arguments, setup, teardown),
        cmocka_unit_test_setup_teardown(test_acquire_checks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_deregister_waits_for_pins, setup, teardown),
        cmocka_unit_test_setup_teardown(test_memfd_alloc_and_adopt, setup, teardown),
        cmocka_unit_test_setup_teardown(test_foreach, setup, teardown),
        cmocka_unit_test_setup_teardown(test_alloc_prefaults_all_pages, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
