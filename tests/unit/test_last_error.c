/* xfer_engine_last_error read while other threads set errors (as xferd's
 * workers, the registry thread and progress threads do): every string read
 * is one whole message, never a mix of two. Run under `make test SAN=1` too. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "transport.h"
#include "xfer.h"

#define WRITERS 3
#define READERS 3
#define ROUNDS  20000
#define MSG_LEN 200 /* long enough that a torn copy is likely to be seen */

struct shared {
    xfer_engine *e;
    int bad;
    char bad_text[256];
};

static void *writer(void *arg)
{
    struct shared *s = arg;
    char fill[MSG_LEN + 1];
    for (int i = 0; i < ROUNDS; i++) {
        memset(fill, 'a' + (i % 26), MSG_LEN);
        fill[MSG_LEN] = 0;
        xfer_engine_set_error(s->e, "%s", fill);
    }
    return NULL;
}

/* A whole message is MSG_LEN copies of one letter (or the empty start). */
static bool whole(const char *m)
{
    size_t n = strlen(m);
    if (n == 0)
        return true;
    if (n != MSG_LEN)
        return false;
    for (size_t i = 1; i < n; i++)
        if (m[i] != m[0])
            return false;
    return true;
}

static void *reader(void *arg)
{
    struct shared *s = arg;
    for (int i = 0; i < ROUNDS; i++) {
        const char *m = xfer_engine_last_error(s->e);
        if (!whole(m) && !__atomic_exchange_n(&s->bad, 1, __ATOMIC_RELAXED))
            snprintf(s->bad_text, sizeof(s->bad_text), "%s", m);
    }
    return NULL;
}

static void test_last_error_from_threads(void **state)
{
    (void)state;
    struct xfer_engine_config cfg;
    xfer_engine_config_init(&cfg);
    cfg.node_id = "unit-err";
    cfg.transports = XFER_TRANSPORT_TCP;
    int rc;
    struct shared s = {.e = xfer_engine_new(&cfg, &rc)};
    assert_non_null(s.e);
    xfer_engine_set_error(s.e, "%s", "");
    pthread_t t[WRITERS + READERS];
    for (int i = 0; i < WRITERS + READERS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, i < WRITERS ? writer : reader, &s), 0);
    for (int i = 0; i < WRITERS + READERS; i++)
        pthread_join(t[i], NULL);
    if (s.bad)
        fail_msg("torn last error read: \"%.60s...\"", s.bad_text);
    /* the copy is the caller's: an error set later does not rewrite it */
    xfer_engine_set_error(s.e, "first");
    const char *m = xfer_engine_last_error(s.e);
    xfer_engine_set_error(s.e, "second");
    assert_string_equal(m, "first");
    assert_string_equal(xfer_engine_last_error(s.e), "second");
    xfer_engine_free(s.e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_last_error_from_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
