/*
 * `ipc_node host`: host-memory tests against a child owner process: random
 * offsets and sizes over memfd and CMA regions, batches of mixed READ/WRITE,
 * and the bad inputs (bounds, access, generation), each both as caught by the
 * initiator and, with a forged descriptor, as refused by the owner.
 */
#include "ipc_test.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define RLEN     (4u << 20)
#define SMALL    (64u << 10)
#define DEADLINE 20000

static uint64_t rng_state;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static uint64_t rnd_len(uint64_t max)
{
    uint64_t r = rnd() % 4, cap = r == 0 ? 64 : r == 3 ? max : SMALL;
    return 1 + rnd() % (cap < max ? cap : max);
}

struct ctx {
    struct owner o;
    xfer_engine *e;
    xfer_peer *p;
    xfer_region *local[2]; /* memfd, malloc'd */
    void *heap;
};

static int one_op(struct ctx *c, const char *rname, xfer_region *l, enum xfer_op op, uint64_t roff,
                  uint64_t loff, uint64_t len)
{
    const struct xfer_region_desc *d = owner_region(&c->o, rname);
    char *lp = (char *)xfer_region_ptr(l) + loff;
    if (op == XFER_OP_WRITE)
        ipc_fill_host(lp, len, rnd());
    int rc = op == XFER_OP_WRITE
                 ? xfer_write(c->e, l, loff, c->p, d->id, d->gen, roff, len, DEADLINE)
                 : xfer_read(c->e, l, loff, c->p, d->id, d->gen, roff, len, DEADLINE);
    CHECK(rc == 0, "%s %s off %llu len %llu: %s (%s)", op == XFER_OP_READ ? "READ" : "WRITE", rname,
          (unsigned long long)roff, (unsigned long long)len, xfer_strerror(rc),
          xfer_engine_last_error(c->e));
    uint64_t s;
    CHECK(owner_sum(&c->o, rname, roff, len, &s) == 0, "owner sum");
    CHECK(s == ipc_sum_host(lp, len), "%s %s off %llu len %llu: checksum mismatch",
          op == XFER_OP_READ ? "READ" : "WRITE", rname, (unsigned long long)roff,
          (unsigned long long)len);
    return 0;
}

static int test_random(struct ctx *c, int iters)
{
    static const char *remote[] = {"mrw", "crw"};
    for (int i = 0; i < iters; i++) {
        uint64_t len = rnd_len(RLEN);
        uint64_t roff = rnd() % (RLEN - len + 1), loff = rnd() % (RLEN - len + 1);
        if (one_op(c, remote[rnd() % 2], c->local[rnd() % 2],
                   rnd() % 2 ? XFER_OP_READ : XFER_OP_WRITE, roff, loff, len))
            return 1;
    }
    printf("ok random single ops: %d\n", iters);
    return 0;
}

/* 64 items over both remote regions, disjoint ranges, READ and WRITE mixed. */
static int test_batch(struct ctx *c)
{
    enum { N = 64 };
    struct xfer_item it[N];
    const char *rn[N];
    uint64_t slice = RLEN / N;
    xfer_batch *b = xfer_batch_new(c->e, NULL);
    CHECK(b, "batch_new");
    for (int i = 0; i < N; i++) {
        rn[i] = i % 2 ? "crw" : "mrw";
        const struct xfer_region_desc *d = owner_region(&c->o, rn[i]);
        uint64_t len = 1 + rnd() % slice;
        it[i] = (struct xfer_item){.op = rnd() % 2 ? XFER_OP_READ : XFER_OP_WRITE,
                                   .local = c->local[i % 2 ? 0 : 1],
                                   .local_off = (uint64_t)i * slice,
                                   .peer = c->p,
                                   .remote_id = d->id,
                                   .remote_gen = d->gen,
                                   .remote_off = (uint64_t)i * slice + rnd() % (slice - len + 1),
                                   .len = len};
        if (it[i].op == XFER_OP_WRITE)
            ipc_fill_host((char *)xfer_region_ptr(it[i].local) + it[i].local_off, len, rnd());
        CHECK(xfer_batch_add(b, &it[i]) == i, "batch_add %d", i);
    }
    int rc = xfer_batch_submit(b, DEADLINE);
    if (rc == 0)
        rc = xfer_batch_wait(b, -1);
    CHECK(rc == 0, "batch: %s (item 0: %s)", xfer_strerror(rc), xfer_batch_item_error(b, 0));
    for (int i = 0; i < N; i++) {
        uint64_t s;
        CHECK(owner_sum(&c->o, rn[i], it[i].remote_off, it[i].len, &s) == 0, "sum");
        CHECK(s == ipc_sum_host((char *)xfer_region_ptr(it[i].local) + it[i].local_off, it[i].len),
              "batch item %d (%s) checksum mismatch", i, rn[i]);
    }
    xfer_batch_free(b);
    printf("ok batch of %d mixed items\n", N);
    return 0;
}

static int expect_err(struct ctx *c, enum xfer_op op, uint32_t id, uint32_t gen, uint64_t off,
                      uint64_t len, int want, const char *what)
{
    int rc = op == XFER_OP_WRITE
                 ? xfer_write(c->e, c->local[0], 0, c->p, id, gen, off, len, DEADLINE)
                 : xfer_read(c->e, c->local[0], 0, c->p, id, gen, off, len, DEADLINE);
    CHECK(rc == want, "%s: got %s, want %s (%s)", what, xfer_strerror(rc), xfer_strerror(want),
          xfer_engine_last_error(c->e));
    printf("ok %s -> %s\n", what, xfer_strerror(rc));
    return 0;
}

/* Initiator-side checks against the published descriptors. */
static int test_bad_local_checks(struct ctx *c)
{
    const struct xfer_region_desc *m = owner_region(&c->o, "mrw"), *ro = owner_region(&c->o, "mro"),
                                  *wo = owner_region(&c->o, "cwo");
    return expect_err(c, XFER_OP_WRITE, m->id, m->gen, RLEN - 10, 20, -XFER_ERANGE,
                      "write past the end") ||
           expect_err(c, XFER_OP_READ, m->id, m->gen, UINT64_MAX - 5, 10, -XFER_ERANGE,
                      "read at an overflowing offset") ||
           expect_err(c, XFER_OP_WRITE, ro->id, ro->gen, 0, 16, -XFER_EACCES,
                      "write to a read-only region") ||
           expect_err(c, XFER_OP_READ, wo->id, wo->gen, 0, 16, -XFER_EACCES,
                      "read from a write-only region") ||
           expect_err(c, XFER_OP_READ, m->id, m->gen + 1, 0, 16, -XFER_ESTALE,
                      "wrong generation") ||
           expect_err(c, XFER_OP_READ, 99999, 1, 0, 16, -XFER_ENOENT, "unknown region id");
}

/* The owner re-validates: a forged descriptor gets past the initiator's
 * checks, never past the owner. */
static int test_bad_owner_checks(struct ctx *c)
{
    static const char *names[] = {"mro", "cwo", "mrw", "crw"};
    uint64_t before[4];
    for (int i = 0; i < 4; i++)
        CHECK(owner_sum(&c->o, names[i], 0, owner_region(&c->o, names[i])->len, &before[i]) == 0,
              "sum");
    struct xfer_region_desc f[4];
    for (int i = 0; i < 4; i++) {
        f[i] = *owner_region(&c->o, names[i]);
        f[i].access = XFER_ACCESS_RW;
        f[i].len *= 2;
        xfer_peer_region_add(c->p, &f[i]);
    }
    int bad = expect_err(c, XFER_OP_WRITE, f[0].id, f[0].gen, 0, 16, -XFER_EACCES,
                         "owner refuses write to read-only memfd") ||
              expect_err(c, XFER_OP_READ, f[1].id, f[1].gen, 0, 16, -XFER_EACCES,
                         "owner refuses read of write-only cma") ||
              expect_err(c, XFER_OP_WRITE, f[2].id, f[2].gen, RLEN - 8, 16, -XFER_ERANGE,
                         "owner refuses write past memfd end") ||
              expect_err(c, XFER_OP_READ, f[3].id, f[3].gen, RLEN, 16, -XFER_ERANGE,
                         "owner refuses read past cma end");
    for (int i = 0; i < 4; i++)
        xfer_peer_region_add(c->p, owner_region(&c->o, names[i]));
    for (int i = 0; !bad && i < 4; i++) {
        uint64_t s;
        CHECK(owner_sum(&c->o, names[i], 0, owner_region(&c->o, names[i])->len, &s) == 0, "sum");
        CHECK(s == before[i], "region %s changed by a refused op", names[i]);
    }
    return bad;
}

/* Deregistered region: old id/gen refused by the owner even with the old
 * descriptor (and mapping) cached; after re-registration the new generation
 * works, the old one is stale. */
static int test_generation(struct ctx *c, const char *name)
{
    struct xfer_region_desc old = *owner_region(&c->o, name);
    char buf[256];
    CHECK(one_op(c, name, c->local[0], XFER_OP_WRITE, 0, 0, 4096) == 0, "warm-up");
    CHECK(owner_cmd(&c->o, buf, sizeof(buf), "DEREG %s", name) == 0, "dereg: %s", buf);
    int rc = xfer_write(c->e, c->local[0], 0, c->p, old.id, old.gen, 0, 64, DEADLINE);
    CHECK(rc == -XFER_ENOENT || rc == -XFER_ESTALE, "%s: write to deregistered region: %s", name,
          xfer_strerror(rc));
    CHECK(owner_cmd(&c->o, buf, sizeof(buf), "REREG %s", name) == 0, "rereg: %s", buf);
    const struct xfer_region_desc *nd = owner_region(&c->o, name);
    CHECK(nd->gen != old.gen || nd->id != old.id, "re-registration kept id and generation");
    rc = xfer_write(c->e, c->local[0], 0, c->p, old.id, old.gen, 0, 64, DEADLINE);
    CHECK(rc == -XFER_ENOENT || rc == -XFER_ESTALE, "%s: old generation after re-register: %s",
          name, xfer_strerror(rc));
    xfer_peer_region_add(c->p, nd);
    if (one_op(c, name, c->local[0], XFER_OP_WRITE, 100, 0, 5000) ||
        one_op(c, name, c->local[1], XFER_OP_READ, 0, 0, 65536))
        return 1;
    printf("ok generation: %s deregistered (%s), re-registered gen %u works\n", name,
           xfer_strerror(rc), nd->gen);
    return 0;
}

static bool mapped_here(const char *memfd_name)
{
    char line[512], want[96];
    snprintf(want, sizeof(want), "/memfd:%s ", memfd_name);
    FILE *f = fopen("/proc/self/maps", "r");
    bool found = false;
    while (f && !found && fgets(line, sizeof(line), f))
        found = strstr(line, want) != NULL;
    if (f)
        fclose(f);
    return found;
}

/* A deregistered region's memfd must not stay mapped here for ever: the
 * owner reports it on a later answer and the mapping is dropped. */
static int test_revocation(struct ctx *c)
{
    char buf[128];
    CHECK(one_op(c, "mrev", c->local[0], XFER_OP_WRITE, 0, 0, 4096) == 0, "map mrev");
    CHECK(mapped_here("mrev"), "mrev is not mapped after a transfer");
    CHECK(owner_cmd(&c->o, buf, sizeof(buf), "DEREG mrev") == 0, "dereg");
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do { /* other traffic carries the news; poll with a deadline */
        CHECK(one_op(c, "mrw", c->local[0], XFER_OP_READ, 0, 0, 64) == 0, "traffic");
        clock_gettime(CLOCK_MONOTONIC, &t);
        CHECK(t.tv_sec - t0.tv_sec < 5, "mrev still mapped 5 s after deregistration");
    } while (mapped_here("mrev"));
    printf("ok deregistered memfd unmapped by the initiator\n");
    return 0;
}

/* Direct copies (no owner per item): a read-only region is mapped read-only
 * here, and the kernel refuses to make that mapping writable (the fd the
 * owner passed is read-only), so nothing but the owner's word could write. */
static int test_direct_readonly(struct ctx *c)
{
    CHECK(one_op(c, "mro", c->local[0], XFER_OP_READ, 0, 0, 4096) == 0, "read mro");
    char line[512];
    unsigned long lo = 0, hi = 0;
    char perms[8] = "";
    FILE *f = fopen("/proc/self/maps", "r");
    while (f && fgets(line, sizeof(line), f))
        if (strstr(line, "/memfd:mro ") && sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) == 3)
            break;
    if (f)
        fclose(f);
    CHECK(hi > lo, "mro is not mapped after a read");
    CHECK(perms[1] == '-', "read-only region mapped '%s'", perms);
    errno = 0;
    int rc = mprotect((void *)lo, hi - lo, PROT_READ | PROT_WRITE);
    CHECK(rc < 0 && errno == EACCES, "mapping of a read-only region made writable (rc %d, %s)", rc,
          strerror(errno));
    printf("ok read-only region mapped '%s'; making it writable: %s\n", perms, strerror(errno));
    return 0;
}

/* A lease rule on a lent region withdraws the loan: the next direct copy
 * asks the owner, who refuses (the driver holds no lease); once the rule is
 * gone the region is lent again and copies work. */
static int test_direct_guard(struct ctx *c)
{
    char ans[128];
    const struct xfer_region_desc *d = owner_region(&c->o, "mguard");
    CHECK(one_op(c, "mguard", c->local[0], XFER_OP_WRITE, 0, 0, 64) == 0, "lend mguard");
    CHECK(one_op(c, "mguard", c->local[0], XFER_OP_READ, 64, 0, 64) == 0, "direct read");
    CHECK(owner_cmd(&c->o, ans, sizeof(ans), "GUARD mguard") == 0, "guard: %s", ans);
    int rc = xfer_read(c->e, c->local[0], 0, c->p, d->id, d->gen, 128, 64, DEADLINE);
    CHECK(rc == -XFER_ESTALE, "read of a guarded region without a lease: %s", xfer_strerror(rc));
    CHECK(owner_cmd(&c->o, ans, sizeof(ans), "UNGUARD mguard") == 0, "unguard: %s", ans);
    CHECK(one_op(c, "mguard", c->local[0], XFER_OP_READ, 192, 0, 64) == 0, "read after unguard");
    printf("ok lease rule on a lent region: refused (%s), unguarded: works\n", xfer_strerror(rc));
    return 0;
}

struct racer {
    struct ctx *c;
    struct xfer_region_desc d;
    uint64_t len;        /* bytes per write */
    uint64_t loff;       /* this writer's part of the local region */
    uint64_t roff, rlen; /* its part of the remote one (no two write the same bytes) */
    long n;              /* writes done (atomic) */
    int rc;              /* the first failure (atomic) */
};

static void *race_main(void *arg)
{
    struct racer *r = arg;
    uint64_t *lp = (uint64_t *)((char *)xfer_region_ptr(r->c->local[0]) + r->loff);
    for (uint64_t i = 1;; i++) {
        for (uint64_t k = 0; k < r->len / 8; k += 512)
            lp[k] = i; /* every piece changes: a late one would show */
        int rc = xfer_write(r->c->e, r->c->local[0], r->loff, r->c->p, r->d.id, r->d.gen,
                            r->roff + (i % (r->rlen / r->len)) * r->len, r->len, DEADLINE);
        if (rc) {
            __atomic_store_n(&r->rc, rc, __ATOMIC_RELAXED);
            return NULL;
        }
        __atomic_add_fetch(&r->n, 1, __ATOMIC_RELAXED);
    }
}

#define RACERS_MAX 4

/* Writes done by all of them so far. */
static long racers_done(struct racer *r, int n)
{
    long sum = 0;
    for (int k = 0; k < n; k++)
        sum += __atomic_load_n(&r[k].n, __ATOMIC_RELAXED);
    return sum;
}

/* Deregistration while threads write directly into the region, 8 bytes
 * after 8 bytes (in the posting threads; several at once share the
 * connection's loan list, read side, while its worker must take the write
 * side to retire the loan) or 4 MiB after 4 MiB (16 pieces on the copy
 * threads): it returns within the bound (one piece in progress, not
 * io_timeout), nothing lands in the memory after it returned (the owner
 * watches the client's memfd), and every writer then gets the owner's
 * refusal. */
static int test_direct_race(struct ctx *c, const char *rname, uint64_t len, long warm, int n)
{
    struct racer r[RACERS_MAX];
    pthread_t t[RACERS_MAX];
    int started = 0;
    for (; started < n && started < RACERS_MAX; started++) {
        r[started] = (struct racer){.c = c, .d = *owner_region(&c->o, rname), .len = len};
        r[started].loff = (uint64_t)started * 4096; /* 8 B writers: apart; one 4 MiB writer */
        r[started].rlen = r[started].d.len / (uint64_t)n;
        r[started].roff = (uint64_t)started * r[started].rlen;
        if (pthread_create(&t[started], NULL, race_main, &r[started]) != 0)
            break;
    }
    struct timespec nap = {0, 1000000}, t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    bool failed = false;
    do { /* poll with a deadline until the writers are going */
        nanosleep(&nap, NULL);
        clock_gettime(CLOCK_MONOTONIC, &now);
        for (int k = 0; k < started; k++)
            failed |= __atomic_load_n(&r[k].rc, __ATOMIC_RELAXED) != 0;
    } while (racers_done(r, started) < warm && !failed && now.tv_sec - t0.tv_sec < 20);
    char ans[128] = "";
    long before = racers_done(r, started);
    int rc = before >= warm && started == n
                 ? owner_cmd(&c->o, ans, sizeof(ans), "DEREGWATCH %s 300", rname)
                 : -1;
    for (int k = 0; k < started; k++)
        pthread_join(t[k], NULL);
    CHECK(started == n, "started %d of %d writers", started, n);
    CHECK(before >= warm, "writers did only %ld writes in 20 s (%s)", before,
          xfer_strerror(r[0].rc));
    CHECK(rc == 0 && !strncmp(ans, "OK ", 3), "deregistration under direct writes: %s", ans);
    double took = atof(ans + 3);
    CHECK(took < 1000, "deregistration took %.1f ms under direct writes", took);
    for (int k = 0; k < n; k++)
        CHECK(r[k].rc == -XFER_ENOENT || r[k].rc == -XFER_ESTALE, "writer %d ended with %s", k,
              xfer_strerror(r[k].rc));
    printf("ok deregistration under %ld direct writes of %llu B by %d thread(s): %.1f ms, memory "
           "untouched after, writers then got %s\n",
           racers_done(r, n), (unsigned long long)len, n, took, xfer_strerror(r[0].rc));
    return 0;
}

static int setup(struct ctx *c, bool nodump)
{
    const char *args[] = {"mrw:memfd:4194304:rw",
                          "crw:cma:4194304:rw",
                          "mro:memfd:65536:r",
                          "cwo:cma:65536:w",
                          "mgen:memfd:65536:rw",
                          "cgen:cma:65536:rw",
                          "mrev:memfd:65536:rw",
                          "arace:adopt:65536:rw",
                          "abig:adopt:16777216:rw",
                          "mguard:memfd:65536:rw",
                          NULL,
                          NULL};
    if (nodump) {
        memmove(args + 1, args, 10 * sizeof(args[0]));
        args[0] = "--nodump";
    }
    CHECK(owner_start(&c->o, args) == 0, "owner did not start");
    c->e = driver_engine("driver", &c->o, &c->p);
    CHECK(c->e && c->p, "driver engine");
    CHECK(xfer_region_alloc(c->e, "lm", RLEN, XFER_ACCESS_RW, &c->local[0]) == 0, "alloc");
    c->heap = malloc(RLEN);
    CHECK(c->heap && xfer_region_register(c->e, "lc", c->heap, RLEN, XFER_MEM_HOST, -1,
                                          XFER_ACCESS_RW, &c->local[1]) == 0,
          "register");
    return 0;
}

int run_host_tests(int argc, char **argv)
{
    int iters = 300;
    uint64_t seed = 12345;
    const char *expect = "ipc";
    bool nodump = false;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--iters") && i + 1 < argc)
            iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc)
            seed = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--expect") && i + 1 < argc)
            expect = argv[++i];
        else if (!strcmp(argv[i], "--nodump"))
            nodump = true;
    }
    rng_state = seed ? seed : 1;
    const char *de = getenv("XFER_IPC_DIRECT");
    bool direct = !de || strcmp(de, "0") != 0;
    printf("seed %llu\n", (unsigned long long)seed);
    struct ctx c;
    memset(&c, 0, sizeof(c));
    int bad = setup(&c, nodump);
    unsigned want = !strcmp(expect, "tcp") ? XFER_TRANSPORT_TCP : XFER_TRANSPORT_IPC;
    if (!bad && want == XFER_TRANSPORT_IPC) {
        /* What the owner publishes for each mechanism (region desc .ipc). */
        char cma[64];
        snprintf(cma, sizeof(cma), "cma:%d:", c.o.pid);
        const char *m = owner_region(&c.o, "mrw")->ipc, *k = owner_region(&c.o, "crw")->ipc;
        printf("published ipc: mrw \"%s\", crw \"%s\"\n", m, k);
        if (strcmp(m, "memfd") != 0 || strncmp(k, cma, strlen(cma)) != 0) {
            fprintf(stderr, "FAIL published ipc text\n");
            bad = 1;
        }
    }
    if (!bad) {
        unsigned got = xfer_peer_transport(c.p);
        printf("transport in use: 0x%x (want 0x%x)\n", got, want);
        bad = got != want;
    }
    bad = bad || test_random(&c, iters) || test_batch(&c) || test_bad_local_checks(&c) ||
          test_bad_owner_checks(&c) || test_generation(&c, "mgen") || test_generation(&c, "cgen") ||
          (want == XFER_TRANSPORT_IPC && test_revocation(&c)) ||
          (want == XFER_TRANSPORT_IPC && direct && test_direct_readonly(&c)) ||
          (want == XFER_TRANSPORT_IPC && direct &&
           test_direct_race(&c, "arace", 8, 2000, RACERS_MAX)) ||
          (want == XFER_TRANSPORT_IPC && direct && test_direct_race(&c, "abig", RLEN, 20, 1)) ||
          (want == XFER_TRANSPORT_IPC && test_direct_guard(&c));
    if (!bad && want == XFER_TRANSPORT_IPC) {
        struct xfer_stats st;
        xfer_transport_stats(c.e, XFER_TRANSPORT_IPC, &st);
        printf("ipc stats: %llu reads, %llu writes, %llu errors\n", (unsigned long long)st.ops_read,
               (unsigned long long)st.ops_write, (unsigned long long)st.errors);
    }
    xfer_engine_free(c.e);
    free(c.heap);
    if (owner_stop(&c.o) < 0 && !bad) {
        fprintf(stderr, "FAIL owner exited badly\n");
        bad = 1;
    }
    printf("%s\n", bad ? "FAILED" : "PASSED");
    return bad ? 1 : 0;
}
