/* GPU request rings without a GPU: the producer protocol of
 * kernels/xfer_ring_proto.h (compiled for CPU threads) against a consumer
 * that checks every ticket, the proxy against a real peer engine in this
 * process over tcp (grouping, counters, fence ordering, bad requests,
 * back-pressure, teardown of a ring never started), config checks, cpulist
 * parsing and NUMA placement. Two processes and dead/frozen peers:
 * tests/integration/test_gpu_ring.sh. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <pthread.h>
#include <sched.h>
#include <string.h>
#include <unistd.h>

#include "gpu_ring.h"
#include "xfer_kernels.h"

#define MB (1u << 20)

/* ---- fixture: a client engine and a peer engine with region "dst" ---- */
struct fix {
    xfer_engine *a, *b;
    xfer_region *src, *back, *dst;
    xfer_peer *p;
};

static xfer_engine *engine(const char *name)
{
    struct xfer_engine_config cfg;
    xfer_engine_config_init(&cfg);
    cfg.node_id = name;
    cfg.transports = XFER_TRANSPORT_TCP;
    cfg.connect_timeout_ms = 3000;
    cfg.io_timeout_ms = 3000;
    int rc;
    return xfer_engine_new(&cfg, &rc);
}

static void fill(xfer_region *r, uint8_t seed)
{
    uint8_t *p = xfer_region_ptr(r);
    for (size_t i = 0; i < xfer_region_len(r); i++)
        p[i] = (uint8_t)(seed + i * 7 + (i >> 9));
}

static int setup(void **state)
{
    static struct fix f;
    memset(&f, 0, sizeof(f));
    f.a = engine("ring-a");
    f.b = engine("ring-b");
    if (!f.a || !f.b)
        return -1;
    if (xfer_region_alloc(f.a, "src", 4 * MB, XFER_ACCESS_RW, &f.src) < 0 ||
        xfer_region_alloc(f.a, "back", 4 * MB, XFER_ACCESS_RW, &f.back) < 0 ||
        xfer_region_alloc(f.b, "dst", 4 * MB, XFER_ACCESS_RW, &f.dst) < 0)
        return -1;
    fill(f.src, 1);
    struct xfer_peer_desc pd;
    struct xfer_region_desc rd;
    xfer_engine_describe(f.b, &pd);
    xfer_region_describe(f.dst, &rd);
    if (xfer_peer_add(f.a, &pd, &f.p) < 0 || xfer_peer_region_add(f.p, &rd) < 0)
        return -1;
    *state = &f;
    return 0;
}

static int teardown(void **state)
{
    struct fix *f = *state;
    xfer_engine_free(f->a);
    xfer_engine_free(f->b);
    return 0;
}

/* failures seen through on_fail */
struct fails {
    pthread_mutex_t mu;
    int n, last_err;
    uint64_t tags[256];
};

static void on_fail(const struct xfer_ring_slot *req, int err, const char *why, void *arg)
{
    struct fails *fl = arg;
    assert_non_null(why);
    pthread_mutex_lock(&fl->mu);
    if (fl->n < 256)
        fl->tags[fl->n] = req->tag;
    fl->n++;
    fl->last_err = err;
    pthread_mutex_unlock(&fl->mu);
}

/* A host ring on f with "src"=0, "back"=1 local and "dst"=0 remote. */
static xfer_gpu_ring *host_ring(struct fix *f, struct xfer_gpu_ring_config *cfg)
{
    int rc;
    cfg->device = -1;
    xfer_gpu_ring *r = xfer_gpu_ring_new(f->a, cfg, &rc);
    assert_non_null(r);
    assert_int_equal(xfer_gpu_ring_add_local(r, f->src), 0);
    assert_int_equal(xfer_gpu_ring_add_local(r, f->back), 1);
    assert_int_equal(xfer_gpu_ring_add_remote(r, f->p, "dst"), 0);
    return r;
}

static struct xfer_ring_slot req(uint32_t op, uint64_t loff, uint64_t roff, uint64_t len,
                                 uint32_t counter, uint64_t tag)
{
    return (struct xfer_ring_slot){.op = op,
                                   .counter = counter,
                                   .local = op == XFER_RING_OP_GET ? 1 : 0,
                                   .remote = 0,
                                   .local_off = loff,
                                   .remote_off = roff,
                                   .len = len,
                                   .tag = tag};
}

/* ---- config ---- */
static void test_config(void **state)
{
    struct fix *f = *state;
    struct xfer_gpu_ring_config c;
    int rc;
    uint32_t bad_slots[] = {0, 1, 3, 1000, XFER_RING_MAX_SLOTS * 2};
    for (size_t i = 0; i < sizeof(bad_slots) / sizeof(bad_slots[0]); i++) {
        xfer_gpu_ring_config_init(&c);
        c.device = -1;
        c.slots = bad_slots[i];
        assert_null(xfer_gpu_ring_new(f->a, &c, &rc));
        assert_int_equal(rc, -XFER_EINVAL);
    }
    xfer_gpu_ring_config_init(&c);
    c.device = -1;
    c.counters = 0;
    assert_null(xfer_gpu_ring_new(f->a, &c, &rc));
    xfer_gpu_ring_config_init(&c);
    c.device = -1;
    c.batch_max = 64;
    c.outstanding_max = 32;
    assert_null(xfer_gpu_ring_new(f->a, &c, &rc));
    assert_int_equal(rc, -XFER_EINVAL);
    xfer_gpu_ring_config_init(&c);
    c.device = -1;
    c.numa_node = 4000; /* no such node */
    assert_null(xfer_gpu_ring_new(f->a, &c, &rc));
    assert_int_equal(rc, -XFER_EINVAL);
    assert_null(xfer_gpu_ring_new(NULL, &c, &rc));
    /* a GPU ring: refused without a device, made with one */
    int gpus = 0;
    bool have_gpu = xfer_kernels_probe(&gpus) == 0 && gpus > 0;
    xfer_gpu_ring_config_init(&c);
    xfer_gpu_ring *r = xfer_gpu_ring_new(f->a, &c, &rc);
    if (have_gpu) {
        assert_non_null(r);
        struct xfer_ring_slot q = req(XFER_RING_OP_PUT, 0, 0, 1, 0, 0);
        assert_int_equal(xfer_gpu_ring_host_post(r, &q, 0), -XFER_ENOTSUP);
    } else {
        assert_null(r);
        assert_int_equal(rc, -XFER_ENODEV);
    }
    xfer_gpu_ring_free(r);
    xfer_gpu_ring_free(NULL);
}

static void test_cpulist(void **state)
{
    (void)state;
    cpu_set_t s;
    assert_int_equal(ring_parse_cpulist("0-3,8,10-11\n", &s), 0);
    assert_int_equal(CPU_COUNT(&s), 7);
    assert_true(CPU_ISSET(8, &s) && CPU_ISSET(11, &s) && !CPU_ISSET(9, &s));
    assert_int_equal(ring_parse_cpulist("5", &s), 0);
    assert_int_equal(CPU_COUNT(&s), 1);
    const char *bad[] = {"", "\n", "3-1", "a", "1,,2", "1-", "-1", "2;3"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        assert_int_equal(ring_parse_cpulist(bad[i], &s), -XFER_EINVAL);
    assert_int_equal(ring_numa_cpus(100000, &s), -XFER_ENOENT);
}

/* The proxy thread of a ring placed on node 0 runs on node 0's CPUs. */
static void test_numa_placement(void **state)
{
    struct fix *f = *state;
    cpu_set_t node0;
    if (ring_numa_cpus(0, &node0) < 0)
        skip(); /* no sysfs NUMA information in this container */
    struct xfer_gpu_ring_config c;
    xfer_gpu_ring_config_init(&c);
    c.numa_node = 0;
    xfer_gpu_ring *r = host_ring(f, &c);
    assert_int_equal(xfer_gpu_ring_start(r), 0);
    assert_int_equal(xfer_gpu_ring_start(r), -XFER_EBUSY);
    cpu_set_t got;
    assert_int_equal(pthread_getaffinity_np(r->thread, sizeof(got), &got), 0);
    CPU_AND(&got, &got, &node0);
    assert_true(CPU_COUNT(&got) > 0);
    struct xfer_gpu_ring_stats st;
    xfer_gpu_ring_stats(r, &st);
    assert_int_equal(st.numa_node, 0);
    assert_int_equal(st.state, XFER_RING_RUNNING);
    xfer_gpu_ring_free(r);
}

/* ---- producer protocol against a checking consumer (no proxy) ---- */
#define PROTO_PRODUCERS 4
#define PROTO_EACH      50000

struct proto {
    xfer_gpu_ring *r;
    int id;
};

static void *proto_producer(void *arg)
{
    struct proto *p = arg;
    for (uint64_t i = 0; i < PROTO_EACH; i++) {
        uint64_t tag = (uint64_t)p->id << 32 | i;
        struct xfer_ring_slot q = req(XFER_RING_OP_PUT, tag * 3, tag * 5, i, (uint32_t)p->id, tag);
        if (xfer_gpu_ring_host_post(p->r, &q, XFER_RING_TIMEOUT_DEFAULT) != 0)
            return (void *)1;
    }
    return NULL;
}

/* Tickets are taken in order, each once, with the producer's fields intact;
 * per producer its requests arrive in its order. A tiny ring keeps the
 * producers on the full path most of the time. */
static void test_protocol_threads(void **state)
{
    struct fix *f = *state;
    struct xfer_gpu_ring_config c;
    xfer_gpu_ring_config_init(&c);
    c.slots = 8;
    xfer_gpu_ring *r = host_ring(f, &c);
    pthread_t th[PROTO_PRODUCERS];
    struct proto pa[PROTO_PRODUCERS];
    for (int i = 0; i < PROTO_PRODUCERS; i++) {
        pa[i] = (struct proto){r, i};
        pthread_create(&th[i], NULL, proto_producer, &pa[i]);
    }
    uint64_t next[PROTO_PRODUCERS] = {0}, tail = 0, bad = 0;
    while (tail < (uint64_t)PROTO_PRODUCERS * PROTO_EACH) {
        struct xfer_ring_slot *s = &r->slots[tail & 7];
        if (__atomic_load_n(&s->seq, __ATOMIC_ACQUIRE) != tail + 1) {
            sched_yield();
            continue;
        }
        struct xfer_ring_slot q = *s;
        uint32_t id = (uint32_t)(q.tag >> 32);
        uint64_t i = q.tag & 0xffffffffu;
        if (id >= PROTO_PRODUCERS || i != next[id] || q.counter != id || q.len != i ||
            q.local_off != q.tag * 3 || q.remote_off != q.tag * 5 || q.op != XFER_RING_OP_PUT)
            bad++;
        else
            next[id]++;
        tail++;
        __atomic_store_n(&r->hdr->tail, tail, __ATOMIC_RELEASE);
    }
    for (int i = 0; i < PROTO_PRODUCERS; i++) {
        void *ret;
        pthread_join(th[i], &ret);
        assert_null(ret);
        assert_int_equal(next[i], PROTO_EACH);
    }
    assert_int_equal(bad, 0);
    struct xfer_ring_prod *pr = r->mem.prod;
    assert_int_equal(pr->head, tail);
    assert_true(pr->full_waits > 0);
    xfer_gpu_ring_free(r); /* its proxy, never started, takes nothing: seq moved on */
}

/* A full ring: -XFER_EBUSY at once, -XFER_ETIMEDOUT after the bound;
 * a ring stopped unstarted fails what it holds and says why. */
static void test_full_and_unstarted_stop(void **state)
{
    struct fix *f = *state;
    struct fails fl = {.mu = PTHREAD_MUTEX_INITIALIZER};
    struct xfer_gpu_ring_config c;
    xfer_gpu_ring_config_init(&c);
    c.slots = 4;
    c.on_fail = on_fail;
    c.on_fail_arg = &fl;
    xfer_gpu_ring *r = host_ring(f, &c);
    for (int i = 0; i < 4; i++) {
        struct xfer_ring_slot q = req(XFER_RING_OP_PUT, 0, 0, 4096, 3, 100 + i);
        assert_int_equal(xfer_gpu_ring_host_post(r, &q, 0), 0);
    }
    struct xfer_ring_slot q = req(XFER_RING_OP_PUT, 0, 0, 4096, 3, 200);
    assert_int_equal(xfer_gpu_ring_host_post(r, &q, 0), -XFER_EBUSY);
    assert_int_equal(xfer_gpu_ring_host_post(r, &q, 20 * 1000000ull), -XFER_ETIMEDOUT);
    assert_int_equal(xfer_gpu_ring_host_wait(r, 3, 4, 0), -XFER_EINPROGRESS);
    assert_int_equal(xfer_gpu_ring_host_wait(r, 3, 4, 20 * 1000000ull), -XFER_ETIMEDOUT);
    assert_int_equal(xfer_gpu_ring_host_wait(r, 9999, 1, 0), -XFER_EINVAL);
    struct xfer_gpu_ring_report rep;
    assert_int_equal(xfer_gpu_ring_stop(r, 100, &rep), 0);
    assert_int_equal(rep.unstarted, 4);
    assert_int_equal(rep.cancelled, 0);
    assert_int_equal(fl.n, 4);
    assert_int_equal(fl.last_err, -XFER_ECANCELED);
    assert_int_equal(xfer_gpu_ring_error(r), -XFER_ECANCELED);
    assert_int_equal(xfer_gpu_ring_host_wait(r, 3, 4, 0), -XFER_ECANCELED);
    assert_int_equal(xfer_gpu_ring_host_wait(r, 3, 5, 0), -XFER_ECANCELED); /* stopped */
    assert_int_equal(xfer_gpu_ring_host_post(r, &q, 0), 0);                 /* room again */
    assert_int_equal(xfer_gpu_ring_host_post(r, &q, 0), 0);
    assert_int_equal(xfer_gpu_ring_start(r), -XFER_EBUSY);
    assert_int_equal(xfer_gpu_ring_stop(r, 0, &rep), 0); /* a second stop reports nothing */
    assert_int_equal(rep.unstarted, 0);
    xfer_gpu_ring_free(r); /* fails the two late ones */
    assert_int_equal(fl.n, 6);
}

/* ---- the proxy against a real peer engine ---- */

/* 300 requests posted before the start: two batches (256 + 44); every
 * byte lands; counters count; GETs bring them back. */
static void test_grouping_and_data(void **state)
{
    struct fix *f = *state;
    struct xfer_gpu_ring_config c;
    xfer_gpu_ring_config_init(&c);
    c.spin_us = 0;
    xfer_gpu_ring *r = host_ring(f, &c);
    const uint64_t piece = 4 * MB / 512;
    for (uint64_t i = 0; i < 300; i++) {
        struct xfer_ring_slot q = req(XFER_RING_OP_PUT, i * piece, i * piece, piece, 0, i);
        assert_int_equal(xfer_gpu_ring_host_post(r, &q, 0), 0);
    }
    assert_int_equal(xfer_gpu_ring_start(r), 0);
    assert_int_equal(xfer_gpu_ring_host_wait(r, 0, 300, XFER_RING_TIMEOUT_DEFAULT), 0);
    struct xfer_gpu_ring_stats st;
    xfer_gpu_ring_stats(r, &st);
    assert_int_equal(st.batches, 2);
    assert_int_equal(st.batch_items_max, 256);
    assert_int_equal(st.completed, 300);
    assert_int_equal(st.in_flight, 0);
    assert_memory_equal(xfer_region_ptr(f->dst), xfer_region_ptr(f->src), 300 * piece);
    /* and back, with one zero-length request that finishes at once */
    memset(xfer_region_ptr(f->back), 0, 4 * MB);
    for (uint64_t i = 0; i < 300; i++) {
        struct xfer_ring_slot q = req(XFER_RING_OP_GET, i * piece, i * piece, piece, 1, i);
        assert_int_equal(xfer_gpu_ring_host_post(r, &q, XFER_RING_TIMEOUT_DEFAULT), 0);
    }
    struct xfer_ring_slot z = req(XFER_RING_OP_GET, 0, 0, 0, 1, 999);
    assert_int_equal(xfer_gpu_ring_host_post(r, &z, XFER_RING_TIMEOUT_DEFAULT), 0);
    assert_int_equal(xfer_gpu_ring_host_wait(r, 1, 301, XFER_RING_TIMEOUT_DEFAULT), 0);
    assert_memory_equal(xfer_region_ptr(f->back), xfer_region_ptr(f->src), 300 * piece);
    uint64_t done, failed;
    int err;
    assert_int_equal(xfer_gpu_ring_counter(r, 1, &done, &failed, &err), 0);
    assert_int_equal(done, 301);
    assert_int_equal(failed, 0);
    assert_int_equal(xfer_gpu_ring_counter(r, 256, &done, &failed, &err), -XFER_EINVAL);
    assert_int_equal(xfer_gpu_ring_error(r), 0);
    struct xfer_gpu_ring_report rep;
    assert_int_equal(xfer_gpu_ring_stop(r, 1000, &rep), 0);
    assert_int_equal(rep.cancelled + rep.unstarted, 0);
    xfer_gpu_ring_stats(r, &st);
    assert_int_equal(st.state, XFER_RING_STOPPED);
    xfer_gpu_ring_free(r);
}

/* PUT new content, FENCE, GET: the GET sees the new content every round
 * (without the fence the two would be one batch, run concurrently). */
static void test_fence_orders(void **state)
{
    struct fix *f = *state;
    struct xfer_gpu_ring_config c;
    xfer_gpu_ring_config_init(&c);
    xfer_gpu_ring *r = host_ring(f, &c);
    assert_int_equal(xfer_gpu_ring_start(r), 0);
    uint8_t *src = xfer_region_ptr(f->src), *back = xfer_region_ptr(f->back);
    for (int round = 0; round < 20; round++) {
        memset(src, round + 1, MB);
        struct xfer_ring_slot put = req(XFER_RING_OP_PUT, 0, MB, MB, XFER_RING_NO_COUNTER, round);
        struct xfer_ring_slot fence = req(XFER_RING_OP_FENCE, 0, 0, 0, 3, 0);
        struct xfer_ring_slot get = req(XFER_RING_OP_GET, 0, MB, MB, 2, round);
        assert_int_equal(xfer_gpu_ring_host_post(r, &put, XFER_RING_TIMEOUT_DEFAULT), 0);
        assert_int_equal(xfer_gpu_ring_host_post(r, &fence, XFER_RING_TIMEOUT_DEFAULT), 0);
        assert_int_equal(xfer_gpu_ring_host_post(r, &get, XFER_RING_TIMEOUT_DEFAULT), 0);
        assert_int_equal(xfer_gpu_ring_host_wait(r, 2, round + 1, XFER_RING_TIMEOUT_DEFAULT), 0);
        assert_int_equal(back[0], round + 1);
        assert_int_equal(back[MB - 1], round + 1);
    }
    assert_int_equal(xfer_gpu_ring_host_wait(r, 3, 20, 0), 0); /* fences counted */
    struct xfer_gpu_ring_stats st;
    xfer_gpu_ring_stats(r, &st);
    assert_int_equal(st.fences, 20);
    assert_int_equal(st.completed, 40);
    xfer_gpu_ring_free(r);
    fill(f->src, 1);
}

/* Bad requests fail alone, on their counter and in the error word. */
static void test_bad_requests(void **state)
{
    struct fix *f = *state;
    struct fails fl = {.mu = PTHREAD_MUTEX_INITIALIZER};
    struct xfer_gpu_ring_config c;
    xfer_gpu_ring_config_init(&c);
    c.counters = 8;
    c.on_fail = on_fail;
    c.on_fail_arg = &fl;
    xfer_gpu_ring *r = host_ring(f, &c);
    assert_int_equal(xfer_gpu_ring_add_remote(r, f->p, "nope"), -XFER_ENOENT);
    assert_int_equal(xfer_gpu_ring_add_local(r, NULL), -XFER_EINVAL);
    assert_int_equal(xfer_gpu_ring_start(r), 0);
    struct xfer_ring_slot bad[] = {
        req(XFER_RING_OP_PUT, 0, 0, 10, 1, 1),          /* ok */
        req(XFER_RING_OP_PUT, 0, 4 * MB - 5, 10, 1, 2), /* remote range */
        req(XFER_RING_OP_PUT, 4 * MB - 5, 0, 10, 1, 3), /* local range */
        req(XFER_RING_OP_PUT, 0, UINT64_MAX, 10, 1, 4), /* overflow */
        req(77, 0, 0, 10, 1, 5),                        /* op */
        req(XFER_RING_OP_PUT, 0, 0, 10, 1, 6),          /* local index 9 (set below) */
        req(XFER_RING_OP_PUT, 0, 0, 10, 1, 7),          /* remote index 3 (set below) */
        req(XFER_RING_OP_PUT, 0, 0, 10, 1, 8),          /* ok */
    };
    bad[5].local = 9;
    bad[6].remote = 3;
    for (size_t i = 0; i < 8; i++)
        assert_int_equal(xfer_gpu_ring_host_post(r, &bad[i], XFER_RING_TIMEOUT_DEFAULT), 0);
    struct xfer_ring_slot no_counter = req(XFER_RING_OP_PUT, 0, 0, 10, 8, 9); /* counter 8 of 8 */
    assert_int_equal(xfer_gpu_ring_host_post(r, &no_counter, XFER_RING_TIMEOUT_DEFAULT), 0);
    int rc = xfer_gpu_ring_host_wait(r, 1, 8, XFER_RING_TIMEOUT_DEFAULT);
    assert_true(rc == -XFER_EINVAL || rc == -XFER_ERANGE);
    uint64_t done, failed;
    int err;
    xfer_gpu_ring_counter(r, 1, &done, &failed, &err);
    assert_int_equal(done, 8);
    assert_int_equal(failed, 6);
    assert_int_equal(xfer_gpu_ring_error(r), -XFER_ERANGE); /* the first failure */
    assert_non_null(strstr(xfer_gpu_ring_last_error(r), "tag 2"));
    struct xfer_ring_slot fence = req(XFER_RING_OP_FENCE, 0, 0, 0, 2, 0);
    assert_int_equal(xfer_gpu_ring_host_post(r, &fence, XFER_RING_TIMEOUT_DEFAULT), 0);
    assert_int_equal(xfer_gpu_ring_host_wait(r, 2, 1, XFER_RING_TIMEOUT_DEFAULT), 0);
    pthread_mutex_lock(&fl.mu);
    assert_int_equal(fl.n, 7); /* six bad + the one with counter 8 */
    uint64_t want[] = {2, 3, 4, 5, 6, 7, 9};
    for (int i = 0; i < 7; i++)
        assert_int_equal(fl.tags[i], want[i]);
    pthread_mutex_unlock(&fl.mu);
    xfer_gpu_ring_free(r);
}

/* Back-pressure: 4 threads x 200 requests through a 4-slot ring with two
 * requests in flight at most; all land, producers found it full. */
struct presser {
    xfer_gpu_ring *r;
    uint32_t id;
    int rc;
};

static void *press(void *arg)
{
    struct presser *p = arg;
    const uint64_t piece = 4096;
    for (uint64_t i = 0; i < 200 && p->rc == 0; i++) {
        uint64_t off = (p->id * 200 + i) * piece;
        struct xfer_ring_slot q = req(XFER_RING_OP_PUT, off, off, piece, p->id, off);
        p->rc = xfer_gpu_ring_host_post(p->r, &q, XFER_RING_TIMEOUT_DEFAULT);
    }
    if (p->rc == 0)
        p->rc = xfer_gpu_ring_host_wait(p->r, p->id, 200, XFER_RING_TIMEOUT_DEFAULT);
    return NULL;
}

static void test_back_pressure(void **state)
{
    struct fix *f = *state;
    struct xfer_gpu_ring_config c;
    xfer_gpu_ring_config_init(&c);
    c.slots = 4;
    c.batch_max = 2;
    c.outstanding_max = 2;
    xfer_gpu_ring *r = host_ring(f, &c);
    memset(xfer_region_ptr(f->dst), 0, 4 * MB);
    assert_int_equal(xfer_gpu_ring_start(r), 0);
    pthread_t th[4];
    struct presser ps[4];
    for (uint32_t i = 0; i < 4; i++) {
        ps[i] = (struct presser){r, i, 0};
        pthread_create(&th[i], NULL, press, &ps[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(ps[i].rc, 0);
    }
    struct xfer_gpu_ring_stats st;
    xfer_gpu_ring_stats(r, &st);
    assert_int_equal(st.completed, 800);
    assert_true(st.full_waits > 0);
    assert_true(st.batch_items_max <= 2);
    assert_memory_equal(xfer_region_ptr(f->dst), xfer_region_ptr(f->src), 800 * 4096);
    xfer_gpu_ring_free(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config),
        cmocka_unit_test(test_cpulist),
        cmocka_unit_test(test_numa_placement),
        cmocka_unit_test(test_protocol_threads),
        cmocka_unit_test(test_full_and_unstarted_stop),
        cmocka_unit_test(test_grouping_and_data),
        cmocka_unit_test(test_fence_orders),
        cmocka_unit_test(test_bad_requests),
        cmocka_unit_test(test_back_pressure),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
