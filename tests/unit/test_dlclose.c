/* libxfer.so unloaded (dlclose) while application threads that used it
 * still run, as a plugin host or an embedding runtime may do: their exit
 * must not call into the unloaded library. Each thread that sends or
 * receives keeps message blocks in thread-local rows (engine/blk_cache.c),
 * a counter shard (engine/stats.c) and a waiter's eventfd
 * (engine/batch_wait.c), released at its exit by one pthread key's
 * destructor (engine/thread_exit.c); the library deletes the key when it
 * is unloaded.
 * Here: the library loaded with dlopen (this program's own static copy is
 * not used), two engines over tcp, a sender and a receiver thread that
 * exchange messages and then wait; the engines are freed, the library
 * unloaded (checked: RTLD_NOLOAD finds it gone), then the threads exit.
 * Without the keys deleted, their exit jumps into unmapped code. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "xfer.h"

#define MESSAGES 50
#define DEADLINE 10000

/* The blocks of threads alive at the unload are left behind by design
 * (and the shared caches' blocks live in the unloaded library's data,
 * where the leak checker cannot see them): no leak check here. Exported,
 * so that the sanitizer runtime finds it (this tree builds hidden). */
__attribute__((visibility("default"))) const char *__asan_default_options(void);
__attribute__((visibility("default"))) const char *__asan_default_options(void)
{
    return "detect_leaks=0";
}

static struct { /* the library's functions, from dlsym */
    __typeof__(xfer_engine_config_init) *config_init;
    __typeof__(xfer_engine_new) *engine_new;
    __typeof__(xfer_engine_free) *engine_free;
    __typeof__(xfer_engine_describe) *engine_describe;
    __typeof__(xfer_region_alloc) *region_alloc;
    __typeof__(xfer_peer_add) *peer_add;
    __typeof__(xfer_peer_connect) *peer_connect;
    __typeof__(xfer_send) *send;
    __typeof__(xfer_recv) *recv;
} api;

struct side {
    xfer_engine *e;
    xfer_region *r;
    xfer_peer *p;
    int failed;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int done_threads;
static int let_go;

/* After its messages: tells main, then waits (holding its cached blocks)
 * until the library is gone, and exits. */
static void park(void)
{
    pthread_mutex_lock(&mu);
    done_threads++;
    pthread_cond_broadcast(&cv);
    while (!let_go)
        pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
}

static void *sender(void *arg)
{
    struct side *s = arg;
    for (int k = 0; k < MESSAGES && !s->failed; k++)
        s->failed = api.send(s->e, s->r, 0, 8, s->p, 1, DEADLINE) != 0;
    park();
    return NULL;
}

static void *receiver(void *arg)
{
    struct side *s = arg;
    for (int k = 0; k < MESSAGES && !s->failed; k++) {
        uint64_t got = 0;
        s->failed = api.recv(s->e, s->r, 0, 64, NULL, 1, &got, DEADLINE) != 0 || got != 8;
    }
    park();
    return NULL;
}

#define LOAD(field, name) assert_non_null(*(void **)&api.field = dlsym(h, name))

static void *load(const char *path)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h)
        fail_msg("dlopen %s: %s", path, dlerror());
    LOAD(config_init, "xfer_engine_config_init");
    LOAD(engine_new, "xfer_engine_new");
    LOAD(engine_free, "xfer_engine_free");
    LOAD(engine_describe, "xfer_engine_describe");
    LOAD(region_alloc, "xfer_region_alloc");
    LOAD(peer_add, "xfer_peer_add");
    LOAD(peer_connect, "xfer_peer_connect");
    LOAD(send, "xfer_send");
    LOAD(recv, "xfer_recv");
    return h;
}

static xfer_engine *engine(const char *name)
{
    struct xfer_engine_config cfg;
    api.config_init(&cfg);
    cfg.transports = XFER_TRANSPORT_TCP;
    cfg.node_id = name;
    int rc;
    xfer_engine *e = api.engine_new(&cfg, &rc);
    assert_non_null(e);
    return e;
}

static void test_unload_with_threads(void **state)
{
    (void)state;
    const char *b = getenv("B");
    char path[512];
    snprintf(path, sizeof(path), "%s/lib/libxfer.so", b && *b ? b : "build");
    void *h = load(path);
    struct side a = {.e = engine("dl-a")}, r = {.e = engine("dl-b")};
    assert_int_equal(api.region_alloc(a.e, "a", 4096, XFER_ACCESS_RW, &a.r), 0);
    assert_int_equal(api.region_alloc(r.e, "b", 4096, XFER_ACCESS_RW, &r.r), 0);
    struct xfer_peer_desc d;
    api.engine_describe(r.e, &d);
    assert_int_equal(api.peer_add(a.e, &d, &a.p), 0);
    api.engine_describe(a.e, &d); /* b receives from known peers only */
    assert_int_equal(api.peer_add(r.e, &d, &r.p), 0);
    assert_int_equal(api.peer_connect(a.p), 0);
    pthread_t ts, tr;
    assert_int_equal(pthread_create(&tr, NULL, receiver, &r), 0);
    assert_int_equal(pthread_create(&ts, NULL, sender, &a), 0);
    pthread_mutex_lock(&mu);
    while (done_threads < 2)
        pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
    assert_false(a.failed);
    assert_false(r.failed);
    api.engine_free(a.e);
    api.engine_free(r.e);
    assert_int_equal(dlclose(h), 0);
    assert_null(dlopen(path, RTLD_NOW | RTLD_NOLOAD)); /* really unloaded */
    pthread_mutex_lock(&mu);
    let_go = 1;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    assert_int_equal(pthread_join(ts, NULL), 0); /* their exits ran no unloaded code */
    assert_int_equal(pthread_join(tr, NULL), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unload_with_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
