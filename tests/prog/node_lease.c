/*
 * Test helper: leases on KV pool blocks between two processes embedding the
 * node library, through a real redis-server (test_node_lease.sh).
 *
 *   node_lease check --node C --transports T --expect tcp|ipc|rdma
 *       starts the owner (this program, "own" mode) as a child process,
 *       drives its leases through a pipe and reads its pool: blocks whose
 *       lease ended are refused with -XFER_ESTALE naming them while blocks
 *       still leased are served (every byte checked, refused ones left
 *       untouched); renewal extends a lease past its first deadline; a
 *       release refuses at once (part of a lease, then all of it); a lease
 *       for another node grants nothing to this one; WRITEs are refused the
 *       same way (the owner's bytes checked unchanged); blocks never leased
 *       are open; blocks granted again after a release are served.
 *   node_lease own --node N --transports T
 *       registers pool "kv" (vLLM FlashAttention layout, 4 layers, 64
 *       blocks of 512 bytes, K and V; regions registered with
 *       XFER_ACCESS_LEASED, so rdma peers reach them through memory windows
 *       only) filled with a pattern, prints "ready",
 *       then answers one line per command on stdin:
 *         grant SLOT PEER TTL_MS B,B,..   renew SLOT TTL_MS
 *         release SLOT [B,B,..]           free SLOT
 *         check B,B,..  (pattern intact)  quit
 *       with "ok" or "err CODE TEXT".
 */
#include "node_env.h"
#include "xfer_node.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define NB    64
#define LAY   4
#define BB    512
#define SLOTS 16
#define MARK  0xEE

static int fails;
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                   \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            fails++;                                                                               \
        }                                                                                          \
    } while (0)

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static struct xfer_kv_geom geom(void)
{
    struct xfer_kv_geom g = {.layout = XFER_KV_VLLM_FA,
                             .block_bytes = BB,
                             .num_blocks = NB,
                             .layers = LAY,
                             .kv = 2,
                             .shard_count = 1};
    snprintf(g.dtype, sizeof(g.dtype), "bf16");
    return g;
}

/* vLLM FlashAttention: region l, offset h*N*B + b*B (the header's table). */
static uint64_t off_of(uint32_t h, uint64_t b)
{
    return h * NB * BB + b * BB;
}

static uint8_t pattern(size_t reg, uint64_t off)
{
    return (uint8_t)(reg * 131 + off * 7 + (off >> 9) * 13 + 1);
}

static xfer_kv_pool *make_pool(xfer_node *n, xfer_region **r, bool fill)
{
    struct xfer_kv_geom g = geom();
    for (size_t i = 0; i < LAY; i++) {
        char name[32];
        snprintf(name, sizeof(name), "kv.%zu", i);
        if (xfer_node_region_alloc(n, name, 2 * NB * BB, XFER_ACCESS_RW | XFER_ACCESS_LEASED,
                                   &r[i])) {
            fprintf(stderr, "%s: %s\n", name, xfer_node_last_error(n));
            return NULL;
        }
        uint8_t *p = xfer_region_ptr(r[i]);
        for (uint64_t o = 0; o < 2 * NB * BB; o++)
            p[o] = fill ? pattern(i, o) : MARK;
    }
    xfer_kv_pool *p = NULL;
    if (xfer_node_pool_register(n, "kv", &g, r, LAY, &p))
        fprintf(stderr, "pool: %s\n", xfer_node_last_error(n));
    return p;
}

static size_t parse_blocks(char *s, uint64_t *v)
{
    size_t n = 0;
    for (char *t = strtok(s, ","); t && n < NB; t = strtok(NULL, ","))
        v[n++] = strtoull(t, NULL, 10);
    return n;
}

/* ---- owner ---------------------------------------------------------------- */

static bool blocks_intact(xfer_region **r, const uint64_t *b, size_t nb)
{
    for (size_t i = 0; i < nb; i++)
        for (uint32_t l = 0; l < LAY; l++)
            for (uint32_t h = 0; h < 2; h++) {
                const uint8_t *p = (const uint8_t *)xfer_region_ptr(r[l]) + off_of(h, b[i]);
                for (uint64_t k = 0; k < BB; k++)
                    if (p[k] != pattern(l, off_of(h, b[i]) + k))
                        return false;
            }
    return true;
}

static int own(const char *id, const char *transports)
{
    xfer_node *n = node_from_env(id, transports, NULL);
    xfer_region *r[LAY];
    xfer_kv_pool *pool = n ? make_pool(n, r, true) : NULL;
    if (!pool)
        return 1;
    xfer_kv_lease *slot[SLOTS] = {0};
    printf("ready\n");
    fflush(stdout);
    char line[1024];
    while (fgets(line, sizeof(line), stdin)) {
        char *av[6] = {0};
        int ac = 0;
        for (char *t = strtok(line, " \n"); t && ac < 6; t = strtok(NULL, " \n"))
            av[ac++] = t;
        if (!ac || !strcmp(av[0], "quit"))
            break;
        uint64_t blocks[NB];
        int rc = -XFER_EINVAL, s = ac > 1 ? atoi(av[1]) : -1;
        bool slot_ok = s >= 0 && s < SLOTS;
        if (!strcmp(av[0], "grant") && ac == 5 && slot_ok) {
            char *list = av[4];
            rc = xfer_node_lease_grant(n, pool, av[2], blocks, 0, atoi(av[3]), &slot[s]);
            if (!rc) { /* blocks added after: exercises add too */
                size_t nb = 0;
                for (char *t = strtok(list, ","); t && nb < NB; t = strtok(NULL, ","))
                    blocks[nb++] = strtoull(t, NULL, 10);
                rc = xfer_node_lease_add(slot[s], blocks, nb);
            }
        } else if (!strcmp(av[0], "renew") && ac == 3 && slot_ok) {
            rc = xfer_node_lease_renew(slot[s], atoi(av[2]));
        } else if (!strcmp(av[0], "release") && (ac == 2 || ac == 3) && slot_ok) {
            size_t nb = ac == 3 ? parse_blocks(av[2], blocks) : 0;
            rc = xfer_node_lease_release(slot[s], ac == 3 ? blocks : NULL, nb);
        } else if (!strcmp(av[0], "free") && ac == 2 && slot_ok) {
            xfer_node_lease_free(slot[s]);
            slot[s] = NULL;
            rc = 0;
        } else if (!strcmp(av[0], "check") && ac == 2) {
            size_t nb = parse_blocks(av[1], blocks);
            rc = blocks_intact(r, blocks, nb) ? 0 : -XFER_EIO;
        }
        if (rc)
            printf("err %d %s\n", rc, xfer_node_last_error(n));
        else
            printf("ok\n");
        fflush(stdout);
    }
    for (int i = 0; i < SLOTS; i++)
        xfer_node_lease_free(slot[i]);
    xfer_node_pool_deregister(n, pool);
    xfer_node_free(n);
    return 0;
}

/* ---- client --------------------------------------------------------------- */

static FILE *to_owner, *from_owner;
static pid_t owner_pid;
static xfer_node *cn;
static xfer_kv_pool *cpool;
static xfer_region *cr[LAY];
static char owner_id[64], pool_name[80];
static unsigned expect_t;

static int spawn_owner(const char *self, const char *transports)
{
    int in[2], out[2];
    if (pipe(in) || pipe(out))
        return -1;
    owner_pid = fork();
    if (owner_pid < 0)
        return -1;
    if (owner_pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        close(in[1]);
        close(out[0]);
        execl(self, self, "own", "--node", owner_id, "--transports", transports, (char *)NULL);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    to_owner = fdopen(in[1], "w");
    from_owner = fdopen(out[0], "r");
    char line[256];
    return from_owner && fgets(line, sizeof(line), from_owner) && !strncmp(line, "ready", 5) ? 0
                                                                                             : -1;
}

/* Sends one command; 0 for "ok", else the owner's code. */
static int cmd(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int cmd(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfprintf(to_owner, fmt, ap);
    va_end(ap);
    fputc('\n', to_owner);
    fflush(to_owner);
    char line[600];
    if (!fgets(line, sizeof(line), from_owner))
        return -XFER_ECONN;
    if (!strncmp(line, "ok", 2))
        return 0;
    int code = -XFER_EIO;
    sscanf(line, "err %d", &code);
    return code;
}

static bool in_list(uint64_t b, const uint64_t *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (v[i] == b)
            return true;
    return false;
}

/* READs blocks b[0..n) (no two neighbours consecutive: one segment per
 * block and half) of the owner's pool into the same blocks of ours (all
 * layers, K and V): one vectored item per layer. With refused[0..nr), every
 * item (each holds them) must fail with -XFER_ESTALE naming one of them;
 * refused blocks stay untouched, the others of a refused item are either
 * untouched or intact (ipc refuses the whole list before copying; tcp moves
 * the segments the owner admits), never anything else; without refusals
 * every block arrives intact. Returns the number of refused items. */
static int read_expect(const char *what, const uint64_t *b, size_t n, const uint64_t *refused,
                       size_t nr)
{
    for (size_t l = 0; l < LAY; l++)
        memset(xfer_region_ptr(cr[l]), MARK, 2 * NB * BB);
    int err = 0;
    xfer_node_batch *bt = xfer_node_batch_new(cn, &err);
    int items =
        bt ? xfer_node_batch_add_blocks(bt, XFER_OP_READ, cpool, b, pool_name, b, n, 0, 0) : err;
    size_t segs = 0;
    for (int i = 0; i < items; i++)
        segs += xfer_node_batch_item_segments(bt, (size_t)i);
    CHECK(items == LAY && segs == n * LAY * 2, "%s: %d items of %zu segments for %zu blocks (%s)",
          what, items, segs, n, xfer_node_last_error(cn));
    if (items <= 0) {
        xfer_node_batch_free(bt);
        return -1;
    }
    int rc = xfer_node_batch_submit(bt, 10000);
    if (!rc)
        rc = xfer_node_batch_wait(bt, -1);
    CHECK(nr ? rc == -XFER_ESTALE : rc == 0, "%s: batch ended with %s", what, xfer_strerror(rc));
    int nref = 0;
    bool item_ok[LAY];
    for (int i = 0; i < items; i++) {
        int st = xfer_node_batch_item_status(bt, (size_t)i);
        const char *why = xfer_node_batch_item_error(bt, (size_t)i);
        item_ok[i] = st == 0;
        if (st == 0) {
            unsigned t = xfer_node_batch_item_transport(bt, (size_t)i);
            CHECK(t == expect_t, "%s: item %d moved over transport %u, expected %u", what, i, t,
                  expect_t);
            continue;
        }
        nref++;
        CHECK(st == -XFER_ESTALE, "%s: item %d: %s (%s)", what, i, xfer_strerror(st), why);
        bool named = false;
        for (size_t k = 0; k < nr && !named; k++) {
            char want[120];
            snprintf(want, sizeof(want), "block %llu of %s (layer ", (unsigned long long)refused[k],
                     pool_name);
            named = strstr(why, want) != NULL;
        }
        CHECK(named && strstr(why, "refused by the owner"),
              "%s: item %d's reason names no refused block: %s", what, i, why);
    }
    CHECK(nref == (nr ? LAY : 0), "%s: %d items refused, expected %d", what, nref, nr ? LAY : 0);
    for (size_t i = 0; i < n; i++) {
        bool ref = in_list(b[i], refused, nr);
        for (uint32_t l = 0; l < LAY; l++)
            for (uint32_t h = 0; h < 2; h++) {
                const uint8_t *p = (const uint8_t *)xfer_region_ptr(cr[l]) + off_of(h, b[i]);
                /* the whole block untouched (allowed when its item failed)
                 * or the whole block intact (required for a non-refused
                 * block of an item that succeeded, forbidden for a refused
                 * one) */
                bool all_mark = true, all_data = true;
                for (uint64_t k = 0; k < BB; k++) {
                    all_mark &= p[k] == MARK;
                    all_data &= p[k] == pattern(l, off_of(h, b[i]) + k);
                }
                CHECK((!item_ok[l] && all_mark) || (!ref && all_data),
                      "%s: block %llu layer %u half %u %s", what, (unsigned long long)b[i], l, h,
                      ref ? "was written although refused" : "differs from the owner's");
            }
    }
    xfer_node_batch_free(bt);
    return nref;
}

/* Polls a one-block READ until the owner refuses it; ms until then, -1. */
static int64_t wait_refused(uint64_t b, int64_t since, int limit_ms)
{
    for (;;) {
        int err = 0;
        xfer_node_batch *bt = xfer_node_batch_new(cn, &err);
        int rc = xfer_node_batch_add_blocks(bt, XFER_OP_READ, cpool, &b, pool_name, &b, 1, 0, 1);
        if (rc > 0 && (rc = xfer_node_batch_submit(bt, 10000)) == 0)
            rc = xfer_node_batch_wait(bt, -1);
        xfer_node_batch_free(bt);
        int64_t t = now_ms() - since;
        if (rc == -XFER_ESTALE)
            return t;
        if (rc || t > limit_ms)
            return -1;
        struct timespec ts = {0, 20 * 1000000};
        nanosleep(&ts, NULL); /* pacing the poll, not waiting for a condition */
    }
}

static void write_refused(uint64_t b)
{
    int err = 0;
    xfer_node_batch *bt = xfer_node_batch_new(cn, &err);
    int items = xfer_node_batch_add_blocks(bt, XFER_OP_WRITE, cpool, &b, pool_name, &b, 1, 0, 0);
    int rc = items > 0 ? xfer_node_batch_submit(bt, 10000) : items;
    if (!rc)
        rc = xfer_node_batch_wait(bt, -1);
    CHECK(rc == -XFER_ESTALE, "WRITE to block %llu whose lease ended: %s", (unsigned long long)b,
          xfer_strerror(rc));
    xfer_node_batch_free(bt);
    CHECK(cmd("check %llu", (unsigned long long)b) == 0,
          "the owner's block %llu changed under a refused WRITE", (unsigned long long)b);
}

static int check(const char *self, const char *node, const char *transports, const char *expect)
{
    expect_t = !strcmp(expect, "ipc")    ? XFER_TRANSPORT_IPC
               : !strcmp(expect, "rdma") ? XFER_TRANSPORT_RDMA
                                         : XFER_TRANSPORT_TCP;
    snprintf(owner_id, sizeof(owner_id), "%s-own", node);
    snprintf(pool_name, sizeof(pool_name), "%s/kv", owner_id);
    signal(SIGPIPE, SIG_IGN);
    alarm(120); /* a hung owner ends the test, not the suite */
    if (spawn_owner(self, transports)) {
        fprintf(stderr, "FAIL: the owner did not start\n");
        return 1;
    }
    cn = node_from_env(node, transports, NULL);
    cpool = cn ? make_pool(cn, cr, false) : NULL;
    if (!cpool)
        return 1;
    const char *C = node;

    /* never leased: open, as before leases existed */
    read_expect("unleased", (uint64_t[]){3, 0, 2}, 3, NULL, 0);

    /* one lease ends by its deadline while another is live */
    int64_t t0 = now_ms();
    CHECK(cmd("grant 0 %s 1500 10,11,12,13", C) == 0, "grant 0");
    CHECK(cmd("grant 1 %s 60000 20,21", C) == 0, "grant 1");
    read_expect("both leases live", (uint64_t[]){10, 20, 11, 21}, 4, NULL, 0);
    int64_t t = wait_refused(10, t0, 15000);
    CHECK(t >= 1500, "block 10 refused after %lld ms, its lease ran 1500 ms", (long long)t);
    read_expect("lease 0 ended", (uint64_t[]){10, 20, 11, 21}, 4, (uint64_t[]){10, 11}, 2);
    write_refused(12);
    CHECK(cmd("renew 0 60000") == -XFER_ESTALE, "an ended lease was renewed");

    /* renewal extends: 800 ms lease kept alive for 2.4 s */
    t0 = now_ms();
    CHECK(cmd("grant 2 %s 800 30", C) == 0, "grant 2");
    int64_t last = now_ms(); /* the last renewal the owner confirmed */
    while (now_ms() - t0 < 2400) {
        int before = fails;
        int64_t asked = now_ms();
        CHECK(cmd("renew 2 800") == 0, "renew 2");
        int64_t confirmed = now_ms();
        read_expect("renewed lease", (uint64_t[]){30}, 1, NULL, 0);
        if (fails > before) /* an 800 ms lease lapses if this process or the owner stalls */
            fprintf(stderr,
                    "renewed lease: renewal asked %lld ms after the last one confirmed, "
                    "confirmed %lld ms later, read done %lld ms after that\n",
                    (long long)(asked - last), (long long)(confirmed - asked),
                    (long long)(now_ms() - confirmed));
        last = confirmed;
        struct timespec ts = {0, 150 * 1000000};
        nanosleep(&ts, NULL); /* the renewal period under test */
    }
    int64_t renewed = now_ms();
    t = wait_refused(30, renewed, 15000);
    CHECK(t >= 0, "block 30 still served after its renewals stopped");

    /* release: part of a lease, then all of it, refused at once */
    CHECK(cmd("grant 3 %s 60000 40,41,42", C) == 0, "grant 3");
    read_expect("lease 3", (uint64_t[]){41, 40, 42}, 3, NULL, 0);
    CHECK(cmd("release 3 40") == 0, "release 3 40");
    read_expect("block 40 released", (uint64_t[]){41, 40, 42}, 3, (uint64_t[]){40}, 1);
    CHECK(cmd("release 3") == 0, "release 3");
    read_expect("lease 3 released", (uint64_t[]){41, 43}, 2, (uint64_t[]){41}, 1);

    /* a lease for another node grants nothing to this one */
    CHECK(cmd("grant 4 someone-else 60000 50") == 0, "grant 4");
    read_expect("other node's lease", (uint64_t[]){51, 50}, 2, (uint64_t[]){50}, 1);

    /* blocks granted again after a release are served; freeing refuses */
    CHECK(cmd("grant 5 %s 60000 40,41", C) == 0, "grant 5");
    read_expect("granted again", (uint64_t[]){41, 40, 42}, 3, (uint64_t[]){42}, 1);
    CHECK(cmd("free 5") == 0, "free 5");
    read_expect("freed", (uint64_t[]){40, 2}, 2, (uint64_t[]){40}, 1);

    cmd("quit");
    int status = 0;
    waitpid(owner_pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "owner exit status %d", status);
    xfer_node_pool_deregister(cn, cpool);
    xfer_node_free(cn);
    if (fails)
        fprintf(stderr, "%d check(s) failed over %s\n", fails, expect);
    else
        printf("leases over %s: ok\n", expect);
    return fails ? 1 : 0;
}

int main(int argc, char **argv)
{
    const char *node = NULL, *transports = "tcp", *expect = "tcp";
    static const struct option lo[] = {
        {"node", 1, 0, 'n'}, {"transports", 1, 0, 't'}, {"expect", 1, 0, 'e'}, {0, 0, 0, 0}};
    if (argc < 2)
        return 2;
    const char *mode = argv[1];
    optind = 2;
    int c;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        if (c == 'n')
            node = optarg;
        else if (c == 't')
            transports = optarg;
        else if (c == 'e')
            expect = optarg;
        else
            return 2;
    }
    if (!node)
        return 2;
    if (!strcmp(mode, "own"))
        return own(node, transports);
    if (!strcmp(mode, "check"))
        return check(argv[0], node, transports, expect);
    return 2;
}
