/*
 * Test helper: processes embedding the node library (node/xfer_node.h)
 * against a real redis-server (test_node_lib.sh drives them).
 *
 *   node_lib serve --node N --seed S [--ready FILE]
 *       regions buf (1 MiB rw, pattern S) and ro (64 KiB, read-only);
 *       writes FILE once published, serves until SIGTERM.
 *   node_lib basic --node C --peer N --seed S [--expect tcp|ipc]
 *       named READ/WRITE with every byte checked, the transport each item
 *       used, the refusals (unknown node/region, self, range, access, a
 *       transport requirement that cannot be met), notifications by name.
 *   node_lib blackhole --node C --peer N --hole PORT
 *       a published peer whose port drops SYNs: connecting to it must not
 *       stall transfers to N or registry events (issue 18 item 4).
 *   node_lib restart --node C --peer N --seed S --seed2 S2 --go FILE
 *       N is restarted (by the script, once FILE exists) under the same
 *       name, its regions registered in another order (serve --ro-first):
 *       a batch built before is re-resolved, not sent to the old ids.
 * Common: --transports LIST (default tcp). Exit 0 = pass.
 */
#include "check.h"
#include "node_common.h"
#include "node_env.h"
#include "xfer_node.h"

#include <getopt.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>

#define BUF_LEN (1u << 20)
#define RO_LEN  (64u << 10)
#define CHUNK   (64u << 10)

struct opts {
    const char *cmd, *node, *peer, *ready, *transports, *expect, *go;
    uint64_t seed, seed2;
    int hole;
    bool ro_first; /* serve: register "ro" before "buf" (other ids) */
};

static xfer_node *make_node(const struct opts *o, const char *id, int connect_ms,
                            xfer_node_event_fn ev, void *arg)
{
    struct xfer_node_config c;
    xfer_node_config_init(&c);
    c.ttl_ms = 3000;
    c.connect_timeout_ms = connect_ms;
    c.default_deadline_ms = 10000;
    c.on_event = ev;
    c.event_arg = arg;
    return node_from_env(id, o->transports, &c);
}

/* ---- serve ---------------------------------------------------------------------- */

static int run_serve(const struct opts *o)
{
    xfer_node *n = make_node(o, o->node, 3000, NULL, NULL);
    if (!n)
        return 1;
    xfer_region *buf, *ro;
    int rc = o->ro_first ? xfer_node_region_alloc(n, "ro", RO_LEN, XFER_ACCESS_R, &ro) : 0;
    if (rc || xfer_node_region_alloc(n, "buf", BUF_LEN, XFER_ACCESS_RW, &buf) ||
        (!o->ro_first && xfer_node_region_alloc(n, "ro", RO_LEN, XFER_ACCESS_R, &ro))) {
        fprintf(stderr, "serve: %s\n", xfer_node_last_error(n));
        return 1;
    }
    pattern_fill(xfer_region_ptr(buf), BUF_LEN, o->seed, 0);
    pattern_fill(xfer_region_ptr(ro), RO_LEN, o->seed + 1, 0);
    if (o->ready) {
        FILE *f = fopen(o->ready, "w");
        if (f) {
            fprintf(f, "incarnation=%016" PRIx64 "\n", xfer_node_incarnation(n));
            fclose(f);
        }
    }
    while (!stop)
        pause();
    xfer_node_free(n);
    return 0;
}

/* ---- helpers ---------------------------------------------------------------------- */

/* One named item, submitted and waited for; returns the item's status. */
static int one(xfer_node *n, enum xfer_op op, xfer_region *loc, uint64_t loff, const char *remote,
               uint64_t len, unsigned require, unsigned *tbit)
{
    int err = 0;
    xfer_node_batch *b = xfer_node_batch_new(n, &err);
    if (!b)
        return err;
    int rc = require ? xfer_node_batch_require(b, require) : 0;
    if (!rc)
        rc = xfer_node_batch_add(b, op, loc, loff, remote, len);
    if (rc >= 0 && (rc = xfer_node_batch_submit(b, 5000)) == 0)
        rc = xfer_node_batch_wait(b, -1);
    if (rc == 0 && tbit)
        *tbit = xfer_node_batch_item_transport(b, 0);
    if (rc < 0 && xfer_node_batch_count(b))
        fprintf(stderr, "  (%s: %s)\n", remote, xfer_node_batch_item_error(b, 0));
    else if (rc < 0)
        fprintf(stderr, "  (%s: %s)\n", remote, xfer_node_last_error(n));
    xfer_node_batch_free(b);
    return rc;
}

static bool same_pattern(const uint8_t *p, uint64_t len, uint64_t seed, uint64_t base)
{
    for (uint64_t i = 0; i < len; i++)
        if (p[i] != pattern_byte(seed, base + i)) {
            fprintf(stderr, "  byte %" PRIu64 " differs\n", i);
            return false;
        }
    return true;
}

/* ---- basic -------------------------------------------------------------------------- */

static void basic_refusals(xfer_node *n, const struct opts *o, xfer_region *loc)
{
    char name[160];
    snprintf(name, sizeof(name), "nosuchnode/buf");
    CHECK(one(n, XFER_OP_READ, loc, 0, name, 16, 0, NULL) == -XFER_ENOENT, "unknown node");
    CHECK(strstr(xfer_node_last_error(n), "nosuchnode"), "reason names the node: %s",
          xfer_node_last_error(n));
    snprintf(name, sizeof(name), "%s/nosuch", o->peer);
    CHECK(one(n, XFER_OP_READ, loc, 0, name, 16, 0, NULL) == -XFER_ENOENT, "unknown region");
    snprintf(name, sizeof(name), "%s/buf", o->node);
    CHECK(one(n, XFER_OP_READ, loc, 0, name, 16, 0, NULL) == -XFER_EINVAL, "self");
    snprintf(name, sizeof(name), "%s/buf+%u", o->peer, BUF_LEN - 8);
    CHECK(one(n, XFER_OP_READ, loc, 0, name, 16, 0, NULL) == -XFER_ERANGE, "past the end");
    snprintf(name, sizeof(name), "%s/ro", o->peer);
    CHECK(one(n, XFER_OP_WRITE, loc, 0, name, 16, 0, NULL) == -XFER_EACCES, "read-only");
    CHECK(one(n, XFER_OP_READ, loc, 0, "no-slash", 16, 0, NULL) == -XFER_EINVAL, "bad name");
}

/* A requirement that the connection cannot meet fails with the reason. */
static void basic_require(xfer_node *n, const struct opts *o, xfer_region *loc, unsigned used)
{
    char name[160];
    snprintf(name, sizeof(name), "%s/buf", o->peer);
    unsigned other = used == XFER_TRANSPORT_IPC ? XFER_TRANSPORT_TCP : XFER_TRANSPORT_IPC;
    int rc = one(n, XFER_OP_READ, loc, 0, name, 64, other | XFER_TRANSPORT_RDMA, NULL);
    const char *why = xfer_node_last_error(n);
    CHECK(rc == -XFER_ENOTSUP, "requirement not met: got %d", rc);
    CHECK(strstr(why, "requires") && strstr(why, "rdma:"), "reason: %s", why);
    printf("require refused: %s\n", why);
    unsigned t = 0;
    CHECK(one(n, XFER_OP_READ, loc, 0, name, 64, used, &t) == 0 && t == used,
          "the transport in use satisfies its own requirement");
}

/* Takes one notification from n's queue, waiting on its eventfd (5 s). */
static struct xfer_notif *notif_take(xfer_node *n)
{
    struct xfer_notif *nf = NULL;
    double until = now_s() + 5;
    while (xfer_notif_poll(xfer_node_engine(n), &nf, 1) == 0 && now_s() < until) {
        struct pollfd p = {.fd = xfer_notif_fd(xfer_node_engine(n)), .events = POLLIN};
        poll(&p, 1, 100);
    }
    return nf;
}

/* Notifications by node name: bound to a named WRITE (data first), and
 * standalone; received by a second node of this process. */
static void basic_notify(xfer_node *n, const struct opts *o, xfer_region *loc)
{
    char rxname[80], name[160];
    snprintf(rxname, sizeof(rxname), "%s-rx", o->node);
    xfer_node *rx = make_node(o, rxname, 3000, NULL, NULL);
    xfer_region *rbuf;
    if (!rx || xfer_node_region_alloc(rx, "buf", CHUNK, XFER_ACCESS_RW, &rbuf)) {
        failures++;
        return;
    }
    pattern_fill(xfer_region_ptr(loc), CHUNK, 55, 0);
    int err;
    xfer_node_batch *b = xfer_node_batch_new(n, &err);
    snprintf(name, sizeof(name), "%s/buf", rxname);
    CHECK(xfer_node_batch_add(b, XFER_OP_WRITE, loc, 0, name, CHUNK) == 0, "add");
    CHECK(xfer_node_batch_notify(b, rxname, "landed", 6) == 0, "bind: %s", xfer_node_last_error(n));
    CHECK(xfer_node_batch_submit(b, 5000) == 0 && xfer_node_batch_wait(b, -1) == 0, "batch");
    CHECK(xfer_node_batch_notify_status(b, rxname) == 0, "notification queued");
    xfer_node_batch_free(b);
    struct xfer_notif *nf = notif_take(rx);
    CHECK(nf && !strcmp(nf->node_id, o->node) && nf->len == 6 && !memcmp(nf->data, "landed", 6) &&
              nf->bound && nf->status == 0 && nf->n_items == 1,
          "bound notification");
    CHECK(same_pattern(xfer_region_ptr(rbuf), CHUNK, 55, 0), "data before its notification");
    xfer_notif_free(nf);
    CHECK(xfer_node_notify(n, rxname, "ping", 4, 2000) == 0, "standalone: %s",
          xfer_node_last_error(n));
    nf = notif_take(rx);
    CHECK(nf && nf->len == 4 && !memcmp(nf->data, "ping", 4) && !nf->bound, "standalone");
    xfer_notif_free(nf);
    CHECK(xfer_node_notify(n, "nosuchnode", "x", 1, 1000) == -XFER_ENOENT, "unknown node");
    xfer_node_free(rx);
    printf("notifications by node name: %s\n", failures ? "FAILED" : "ok");
}

static int run_basic(const struct opts *o)
{
    xfer_node *n = make_node(o, o->node, 3000, NULL, NULL);
    xfer_region *loc;
    if (!n || xfer_node_region_alloc(n, "loc", BUF_LEN, XFER_ACCESS_RW, &loc))
        return 1;
    uint8_t *lp = xfer_region_ptr(loc);
    char name[160];
    unsigned t = 0;
    snprintf(name, sizeof(name), "%s/buf+4096", o->peer);
    CHECK(one(n, XFER_OP_READ, loc, 0, name, CHUNK, 0, &t) == 0, "read");
    CHECK(same_pattern(lp, CHUNK, o->seed, 4096), "read bytes");
    char tn[32] = "";
    xfer_transports_format(t, tn, sizeof(tn));
    printf("read %u bytes over %s\n", CHUNK, tn);
    if (o->expect)
        CHECK(!strcmp(tn, o->expect), "transport %s, expected %s", tn, o->expect);
    CHECK(xfer_node_peer_transport(n, o->peer) == t, "peer transport");
    pattern_fill(lp + CHUNK, CHUNK, 99, 0);
    snprintf(name, sizeof(name), "%s/buf+128K", o->peer);
    CHECK(one(n, XFER_OP_WRITE, loc, CHUNK, name, CHUNK, 0, NULL) == 0, "write");
    CHECK(one(n, XFER_OP_READ, loc, 4 * CHUNK, name, CHUNK, 0, NULL) == 0, "read back");
    CHECK(same_pattern(lp + 4 * CHUNK, CHUNK, 99, 0), "written bytes");
    /* Many items in one batch over two regions. */
    int err;
    xfer_node_batch *b = xfer_node_batch_new(n, &err);
    for (int i = 0; i < 8; i++) {
        snprintf(name, sizeof(name), "%s/%s+%d", o->peer, i & 1 ? "ro" : "buf", i * 1000);
        CHECK(xfer_node_batch_add(b, XFER_OP_READ, loc, (uint64_t)i * 4096, name, 1000) == i,
              "add %d", i);
    }
    CHECK(xfer_node_batch_submit(b, 5000) == 0 && xfer_node_batch_wait(b, -1) == 0, "batch");
    for (int i = 0; i < 8; i++)
        CHECK(same_pattern(lp + i * 4096, 1000, o->seed + (i & 1), (uint64_t)i * 1000),
              "batch item %d bytes", i);
    xfer_node_batch_free(b);
    basic_refusals(n, o, loc);
    basic_require(n, o, loc, t);
    basic_notify(n, o, loc);
    xfer_node_free(n);
    printf("basic: %s\n", failures ? "FAILED" : "ok");
    return failures ? 1 : 0;
}

/* ---- blackhole ---------------------------------------------------------------------- */

struct hole_ctx {
    xfer_node *n;
    atomic_int started, done, rc, leave_seen;
    double t_start, t_done, t_leave;
};

static void *resolve_hole(void *arg)
{
    struct hole_ctx *h = arg;
    struct xfer_node_ref ref;
    h->t_start = now_s();
    atomic_store(&h->started, 1);
    int rc = xfer_node_resolve(h->n, "hole", "buf", 0, &ref);
    h->t_done = now_s();
    if (rc == 0)
        xfer_node_unref(h->n, &ref);
    atomic_store(&h->rc, rc);
    atomic_store(&h->done, 1);
    return NULL;
}

static void hole_event(const struct xfer_registry_event *ev, void *arg)
{
    struct hole_ctx *h = arg;
    if (ev->type == XFER_REG_EV_LEAVE && !strcmp(ev->node, "hole")) {
        h->t_leave = now_s();
        atomic_store(&h->leave_seen, 1);
    }
}

/* Publishes a node "hole" whose data port drops SYNs (the script fills its
 * listen backlog), with one region. */
static xfer_registry *publish_hole(int port)
{
    struct xfer_registry_config rc;
    xfer_registry_config_init(&rc);
    rc.url = getenv("REDIS_URL");
    int err = 0;
    xfer_registry *r = xfer_registry_new(&rc, &err);
    if (!r)
        return NULL;
    struct xfer_node_desc nd = {0};
    snprintf(nd.peer.node_id, sizeof(nd.peer.node_id), "hole");
    snprintf(nd.peer.addr, sizeof(nd.peer.addr), "127.0.0.1");
    snprintf(nd.peer.host_id, sizeof(nd.peer.host_id), "another-host");
    nd.peer.data_port = (uint16_t)port;
    nd.peer.transports = XFER_TRANSPORT_TCP;
    nd.peer.incarnation = 42;
    struct xfer_region_desc rd = {.id = 1, .gen = 1, .len = BUF_LEN, .access = XFER_ACCESS_RW};
    snprintf(rd.name, sizeof(rd.name), "buf");
    rd.device = -1;
    if (xfer_registry_publish_node(r, &nd) || xfer_registry_publish_region(r, &rd)) {
        xfer_registry_free(r);
        return NULL;
    }
    return r;
}

/* Whether some socket of this network namespace is in SYN_SENT towards
 * 127.0.0.1:port (/proc/net/tcp): the resolver has reached its connect. */
static bool syn_sent_to(int port)
{
    FILE *f = fopen("/proc/net/tcp", "r");
    if (!f)
        return false;
    char line[512];
    bool found = false;
    while (!found && fgets(line, sizeof(line), f)) {
        unsigned rport, st;
        if (sscanf(line, " %*u: %*x:%*x %*x:%x %x", &rport, &st) == 2)
            found = rport == (unsigned)port && st == 0x02;
    }
    fclose(f);
    return found;
}

static int run_blackhole(const struct opts *o)
{
    const int connect_ms = 3000;
    struct hole_ctx h = {0};
    xfer_registry *hole = publish_hole(o->hole);
    h.n = make_node(o, o->node, connect_ms, hole_event, &h);
    xfer_region *loc;
    if (!hole || !h.n || xfer_node_region_alloc(h.n, "loc", BUF_LEN, XFER_ACCESS_RW, &loc))
        return 1;
    char name[160];
    snprintf(name, sizeof(name), "%s/buf", o->peer);
    CHECK(one(h.n, XFER_OP_READ, loc, 0, name, CHUNK, 0, NULL) == 0, "warm-up read");
    pthread_t th[2];
    pthread_create(&th[0], NULL, resolve_hole, &h);
    while (!atomic_load(&h.started))
        sched_yield();
    /* A second caller for the same peer waits for the first, bounded. */
    struct hole_ctx h2 = {.n = h.n};
    pthread_create(&th[1], NULL, resolve_hole, &h2);
    /* The leave below must find the resolver connecting, not still looking
     * "hole" up (it would fail ENOENT at once: a fast machine did that). */
    double reach = now_s() + 5.0;
    while (!syn_sent_to(o->hole) && !atomic_load(&h.done) && now_s() < reach)
        usleep(1000);
    /* Transfers to the good peer go on while "hole" is being connected. */
    double worst = 0;
    for (int i = 0; i < 20; i++) {
        double t0 = now_s();
        CHECK(one(h.n, XFER_OP_READ, loc, 0, name, CHUNK, 0, NULL) == 0, "read %d", i);
        CHECK(same_pattern(xfer_region_ptr(loc), CHUNK, o->seed, 0), "bytes %d", i);
        if (now_s() - t0 > worst)
            worst = now_s() - t0;
    }
    /* Registry events are applied meanwhile: "hole" leaves. */
    xfer_registry_unpublish_node(hole);
    double until = now_s() + 2.0;
    while (!atomic_load(&h.leave_seen) && now_s() < until)
        sched_yield();
    bool still = !atomic_load(&h.done);
    printf("blackhole: 20 reads to %s while connecting, worst %.1f ms; leave event %s; "
           "resolver still connecting: %s\n",
           o->peer, worst * 1e3, atomic_load(&h.leave_seen) ? "applied" : "MISSING",
           still ? "yes" : "no");
    CHECK(still, "the black-holed connect ended too early to prove anything");
    CHECK(worst < 1.0, "a transfer to a good peer took %.3f s", worst);
    CHECK(atomic_load(&h.leave_seen), "leave event not applied while connecting");
    pthread_join(th[0], NULL);
    pthread_join(th[1], NULL);
    double took = h.t_done - h.t_start;
    printf("blackhole: resolve failed after %.2f s: %s; second caller: %d after %.2f s\n", took,
           xfer_strerror(atomic_load(&h.rc)), atomic_load(&h2.rc), h2.t_done - h2.t_start);
    CHECK(atomic_load(&h.rc) < 0, "connect to a black hole succeeded");
    CHECK(took < 4.0 * connect_ms / 1000.0 + 1.5, "connect took %.2f s", took);
    CHECK(atomic_load(&h2.rc) < 0 && h2.t_done - h2.t_start < 8.0 * connect_ms / 1000.0 + 3,
          "second caller: %d after %.2f s", atomic_load(&h2.rc), h2.t_done - h2.t_start);
    xfer_registry_free(hole);
    xfer_node_free(h.n);
    printf("blackhole: %s\n", failures ? "FAILED" : "ok");
    return failures ? 1 : 0;
}

/* ---- restart ------------------------------------------------------------------------ */

static uint64_t registry_incarnation(xfer_node *n, const char *node)
{
    struct xfer_node_desc nd;
    return xfer_registry_fetch_node(xfer_node_registry(n), node, &nd) == 0 ? nd.peer.incarnation
                                                                           : 0;
}

static bool peer_has_region(xfer_node *n, const char *node, const char *name)
{
    struct xfer_region_desc *rd = NULL;
    size_t nr = 0;
    bool found = false;
    if (xfer_registry_list_regions(xfer_node_registry(n), node, &rd, &nr) == 0)
        for (size_t i = 0; i < nr; i++)
            found = found || !strcmp(rd[i].name, name);
    free(rd);
    return found;
}

static int run_restart(const struct opts *o)
{
    xfer_node *n = make_node(o, o->node, 3000, NULL, NULL);
    xfer_region *loc;
    if (!n || xfer_node_region_alloc(n, "loc", BUF_LEN, XFER_ACCESS_RW, &loc))
        return 1;
    uint8_t *lp = xfer_region_ptr(loc);
    char name[160];
    snprintf(name, sizeof(name), "%s/buf", o->peer);
    struct xfer_node_ref old;
    CHECK(xfer_node_resolve(n, o->peer, "buf", 0, &old) == 0, "resolve");
    CHECK(one(n, XFER_OP_READ, loc, 0, name, CHUNK, 0, NULL) == 0, "read before");
    CHECK(same_pattern(lp, CHUNK, o->seed, 0), "bytes before");
    int err;
    xfer_node_batch *b = xfer_node_batch_new(n, &err); /* built before the restart */
    CHECK(xfer_node_batch_add(b, XFER_OP_READ, loc, CHUNK, name, CHUNK) == 0, "add");
    uint64_t inc0 = old.incarnation;
    FILE *f = fopen(o->go, "w");
    if (f)
        fclose(f);
    double until = now_s() + 30;
    while (registry_incarnation(n, o->peer) == inc0 || !registry_incarnation(n, o->peer)) {
        if (now_s() > until) {
            fprintf(stderr, "FAIL: %s was not restarted within 30 s\n", o->peer);
            return 1;
        }
        usleep(20000); /* polling Redis, bounded above */
    }
    /* the new process publishes its node hash before its regions: wait
     * (bounded) until its "buf" is in Redis too */
    while (!peer_has_region(n, o->peer, "buf")) {
        if (now_s() > until) {
            fprintf(stderr, "FAIL: %s/buf not published again within 30 s\n", o->peer);
            return 1;
        }
        usleep(20000); /* polling Redis, bounded above */
    }
    CHECK(xfer_node_peer_restarted(n, &old), "old ref sees the restart");
    /* A fresh name connects the peer to the new process, whose "buf" has
     * the id "ro" had before (the script restarts it with --ro-first)... */
    memset(lp, 0, CHUNK);
    CHECK(one(n, XFER_OP_READ, loc, 0, name, CHUNK, 0, NULL) == 0, "read after");
    CHECK(same_pattern(lp, CHUNK, o->seed2, 0), "bytes after");
    /* ...so the batch built before must be re-resolved, not sent to old ids. */
    CHECK(xfer_node_batch_submit(b, 5000) == 0, "submit: %s", xfer_node_last_error(n));
    CHECK(xfer_node_batch_wait(b, -1) == 0, "batch from before: %s",
          xfer_node_batch_item_error(b, 0));
    CHECK(same_pattern(lp + CHUNK, CHUNK, o->seed2, 0), "batch from before read the new buf");
    xfer_node_batch_free(b);
    xfer_node_unref(n, &old);
    xfer_node_free(n);
    printf("restart: %s\n", failures ? "FAILED" : "ok");
    return failures ? 1 : 0;
}

int main(int argc, char **argv)
{
    static const struct option lo[] = {
        {"node", 1, 0, 'n'},     {"peer", 1, 0, 'p'},  {"seed", 1, 0, 's'},
        {"seed2", 1, 0, 'S'},    {"ready", 1, 0, 'r'}, {"transports", 1, 0, 't'},
        {"expect", 1, 0, 'e'},   {"hole", 1, 0, 'H'},  {"go", 1, 0, 'g'},
        {"ro-first", 0, 0, 'o'}, {0, 0, 0, 0},
    };
    struct opts o = {.transports = "tcp"};
    if (argc < 2)
        return 2;
    o.cmd = argv[1];
    optind = 2;
    int c;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case 'n':
            o.node = optarg;
            break;
        case 'p':
            o.peer = optarg;
            break;
        case 's':
            o.seed = strtoull(optarg, NULL, 0);
            break;
        case 'S':
            o.seed2 = strtoull(optarg, NULL, 0);
            break;
        case 'r':
            o.ready = optarg;
            break;
        case 't':
            o.transports = optarg;
            break;
        case 'e':
            o.expect = optarg;
            break;
        case 'H':
            o.hole = atoi(optarg);
            break;
        case 'g':
            o.go = optarg;
            break;
        case 'o':
            o.ro_first = true;
            break;
        default:
            return 2;
        }
    }
    catch_stop_signals();
    signal(SIGPIPE, SIG_IGN);
    if (!o.node)
        return 2;
    if (!strcmp(o.cmd, "serve"))
        return run_serve(&o);
    if (!o.peer)
        return 2;
    if (!strcmp(o.cmd, "basic"))
        return run_basic(&o);
    if (!strcmp(o.cmd, "blackhole") && o.hole > 0)
        return run_blackhole(&o);
    if (!strcmp(o.cmd, "restart") && o.go)
        return run_restart(&o);
    return 2;
}
