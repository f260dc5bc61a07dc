/*
 * Test helper for two-sided messages (docs/notify.md): two of these, one
 * engine per process, each a peer of the other.
 *
 *   xfer_sendrecv --node ID --out MYFILE --other FILE --role a|b [--count N]
 *                 [--seed X] [--ready FILE [--stop]]
 *
 * Both write their node file, wait for the other's and add it as a peer,
 * then run the phases of run_role(); a failed check exits 1 with a FAIL line.
 * Every message carries (index, tag, length) in its first 24 bytes and a
 * pattern after them, so the receiver checks what it got on its own.
 *   1. both directions at once: N messages each way, random sizes 24 B..64 KiB
 *      (half of them eager-sized, some exactly at the eager threshold),
 *      tags i % 4, sent in vectored batches of 1..8 SEND items, received by
 *      any-tag RECV batches (recvv), half of them from any peer; every index
 *      exactly once, from the right sender;
 *   2. tags: 4 x 16 messages sent first, then received by exact-tag RECVs in
 *      reverse tag order: per tag in send order (FIFO per sender and tag);
 *   3. truncation: 1000 B (eager) and 20000 B (rendezvous) into a 100 B
 *      buffer fail on both sides, the next message is received;
 *   4. deadline and cancel of RECVs of other tags while a message waits:
 *      it is not consumed by them and goes to the next RECV of its tag;
 *   5. churn: for 2 s b removes a and adds it again in a loop while a sends
 *      eager messages and a thread of b receives them from any peer (each
 *      RTS looks its sender up and is matched on arrival while the peer may
 *      be going: under SAN=1 a use after free fails the test); every send
 *      ends (delivered, refused or timed out), and one after it gets through;
 *      the RECV item of the phase's first message still names its sender
 *      after b removed it (xfer_batch_item_msg: a copy, not the freed peer);
 *   6. (a, with --ready) a SEND and a RECV pending towards b, then FILE is
 *      created and the test kills b: both must fail with -XFER_ECONN; with
 *      --stop b is stopped first and a notification sent to it meanwhile
 *      (submit must not wait for the stopped peer) fails too.
 */
#include "node_common.h"

#include <getopt.h>
#include <unistd.h>
#include <poll.h>
#include <pthread.h>

#define MAX_MSG (64u << 10)
#define SLOT    (MAX_MSG + 64)

struct ctx {
    const char *other; /* the other side's node id */
    xfer_engine *e;
    xfer_peer *p;
    xfer_region *buf; /* [0, 32 MiB) send area, [32 MiB, 64 MiB) receive area */
    const char *role, *ready;
    bool stop; /* --stop: b is stopped before it is killed (stopped_notify) */
    int count;
    uint64_t seed;
    int failed;
};

#define CHECK(c, ...)                                                                              \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "FAIL: " __VA_ARGS__);                                                 \
            fputc('\n', stderr);                                                                   \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

static uint8_t *at(struct ctx *c, uint64_t off)
{
    return (uint8_t *)xfer_region_ptr(c->buf) + off;
}

/* Half of the messages fit the eager path (<= XFER_MSG_EAGER_MAX: data in
 * the RTS), half go either way (rendezvous above it); every 16th is exactly
 * at the threshold or one byte past it. */
static uint64_t msg_len(const struct ctx *c, int i)
{
    uint64_t r = mix64(c->seed ^ (uint64_t)i);
    if (i % 16 == 0)
        return XFER_MSG_EAGER_MAX + (uint64_t)(i / 16 % 2);
    return 24 + (r >> 1) % ((r & 1 ? XFER_MSG_EAGER_MAX + 1 : MAX_MSG) - 24);
}

/* Pattern seeds of a's and b's messages. */
static uint64_t own_seed(const struct ctx *c)
{
    return c->seed ^ (strcmp(c->role, "a") ? 2 : 1);
}

static uint64_t other_seed(const struct ctx *c)
{
    return c->seed ^ (strcmp(c->role, "a") ? 1 : 2);
}

/* Message i of this side at off: header + pattern. */
static void fill_msg(struct ctx *c, uint64_t off, int i, uint64_t tag, uint64_t len)
{
    uint64_t h[3] = {(uint64_t)i, tag, len};
    memcpy(at(c, off), h, sizeof(h));
    pattern_fill(at(c, off) + 24, len - 24, own_seed(c) ^ 0x5eed ^ (uint64_t)i, 0);
}

/* What a receiver got at off (len bytes, sender's seed): index or -1. */
static int check_msg(struct ctx *c, uint64_t off, uint64_t len, uint64_t tag, uint64_t seed)
{
    uint64_t h[3];
    if (len < 24)
        return -1;
    memcpy(h, at(c, off), sizeof(h));
    if (h[1] != tag || h[2] != len)
        return -1;
    uint8_t *want = malloc(len - 24);
    pattern_fill(want, len - 24, seed ^ 0x5eed ^ h[0], 0);
    int ok = memcmp(want, at(c, off) + 24, len - 24) == 0;
    free(want);
    return ok ? (int)h[0] : -1;
}

/* ---- phase 1: both directions at once --------------------------------------------- */

static void *send_all(void *arg)
{
    struct ctx *c = arg;
    uint64_t x = c->seed | 1;
    for (int i = 0; i < c->count && !c->failed;) {
        int rc, k = 1 + (int)(mix64(x++) % 8);
        xfer_batch *b = xfer_batch_new(c->e, &rc);
        for (int j = 0; j < k && i < c->count; j++, i++) {
            uint64_t off = (uint64_t)j * SLOT, len = msg_len(c, i);
            fill_msg(c, off, i, (uint64_t)(i % 4), len);
            xfer_batch_add_send(b, c->buf, off, len, c->p, (uint64_t)(i % 4));
        }
        rc = xfer_batch_submit(b, 30000);
        if (rc == 0)
            rc = xfer_batch_wait(b, -1);
        if (rc != 0) {
            fprintf(stderr, "FAIL: send batch: %s (%s)\n", xfer_strerror(rc),
                    xfer_batch_item_error(b, 0));
            c->failed = 1;
        }
        xfer_batch_free(b);
    }
    return NULL;
}

static int recv_all(struct ctx *c)
{
    uint8_t *seen = calloc((size_t)c->count, 1);
    uint64_t base = 32u << 20, x = c->seed ^ 77;
    int got = 0;
    while (got < c->count && !c->failed) {
        int rc, k = 1 + (int)(mix64(x++) % 8);
        if (k > c->count - got)
            k = c->count - got;
        xfer_batch *b = xfer_batch_new(c->e, &rc);
        for (int j = 0; j < k; j++) /* recvv: several buffers, any tag, half any peer */
            xfer_batch_add_recv(b, c->buf, base + (uint64_t)j * SLOT, SLOT, (x & 1) ? c->p : NULL,
                                XFER_MSG_TAG_ANY);
        rc = xfer_batch_submit(b, 30000);
        if (rc == 0)
            rc = xfer_batch_wait(b, -1);
        CHECK(rc == 0, "recv batch: %s (%s)", xfer_strerror(rc), xfer_batch_item_error(b, 0));
        for (int j = 0; j < k; j++, got++) {
            uint64_t tag;
            char from[XFER_NAME_MAX];
            CHECK(xfer_batch_item_msg(b, (size_t)j, &tag, from) == 0, "item_msg");
            int i = check_msg(c, base + (uint64_t)j * SLOT, xfer_batch_item_bytes(b, (size_t)j),
                              tag, other_seed(c));
            CHECK(i >= 0 && i < c->count && !seen[i] && !strcmp(from, c->other),
                  "message %d from %s wrong or twice", i, from);
            seen[i] = 1;
        }
        xfer_batch_free(b);
    }
    free(seen);
    return c->failed;
}

/* ---- phases 2-4 --------------------------------------------------------------- */

static int one(struct ctx *c, enum xfer_op op, uint64_t off, uint64_t len, uint64_t tag, int dl,
               uint64_t *got)
{
    if (op == XFER_OP_SEND)
        return xfer_send(c->e, c->buf, off, len, c->p, tag, dl);
    return xfer_recv(c->e, c->buf, off, len, c->p, tag, got, dl);
}

static int tags_phase(struct ctx *c, bool sender)
{
    if (sender) { /* one batch (sendv): the receiver takes them tag by tag */
        int rc;
        xfer_batch *b = xfer_batch_new(c->e, &rc);
        for (int i = 0; i < 64; i++) {
            fill_msg(c, (uint64_t)i * 128, i, 100 + (uint64_t)(i % 4), 24 + (uint64_t)i);
            xfer_batch_add_send(b, c->buf, (uint64_t)i * 128, 24 + (uint64_t)i, c->p,
                                100 + (uint64_t)(i % 4));
        }
        rc = xfer_batch_submit(b, 20000);
        if (rc == 0)
            rc = xfer_batch_wait(b, -1);
        xfer_batch_free(b);
        CHECK(rc == 0, "tag sends: %s", xfer_strerror(rc));
        return 0;
    }
    for (int t = 3; t >= 0; t--) { /* messages wait until their RECV comes */
        int last = -1;
        for (int n = 0; n < 16; n++) {
            uint64_t got;
            CHECK(one(c, XFER_OP_RECV, 32u << 20, SLOT, 100 + (uint64_t)t, 10000, &got) == 0,
                  "tag recv");
            int i = check_msg(c, 32u << 20, got, 100 + (uint64_t)t, other_seed(c));
            CHECK(i > last && i % 4 == t, "tag %d: message %d after %d (not FIFO)", t, i, last);
            last = i;
        }
    }
    return 0;
}

static int trunc_phase(struct ctx *c, bool sender)
{
    uint64_t got = 0;
    if (sender) {
        fill_msg(c, 0, 7, 99, 1000);
        int rc = one(c, XFER_OP_SEND, 0, 1000, 99, 10000, NULL);
        CHECK(rc == -XFER_ETRUNC, "truncated eager send: %s", xfer_strerror(rc));
        fill_msg(c, 0, 6, 99, 20000);
        rc = one(c, XFER_OP_SEND, 0, 20000, 99, 10000, NULL);
        CHECK(rc == -XFER_ETRUNC, "truncated rendezvous send: %s", xfer_strerror(rc));
        fill_msg(c, 0, 8, 99, 50);
        CHECK(one(c, XFER_OP_SEND, 0, 50, 99, 10000, NULL) == 0, "send after truncation");
        return 0;
    }
    memset(at(c, 32u << 20), 0xa5, 100);
    for (int k = 0; k < 2; k++) { /* eager, then rendezvous: nothing written */
        int rc = one(c, XFER_OP_RECV, 32u << 20, 100, 99, 10000, &got);
        CHECK(rc == -XFER_ETRUNC, "truncated recv %d: %s", k, xfer_strerror(rc));
        for (int j = 0; j < 100; j++)
            CHECK(at(c, 32u << 20)[j] == 0xa5, "truncated recv %d wrote the buffer", k);
    }
    CHECK(one(c, XFER_OP_RECV, 32u << 20, 100, 99, 10000, &got) == 0 && got == 50 &&
              check_msg(c, 32u << 20, 50, 99, other_seed(c)) == 8,
          "recv after truncation");
    return 0;
}

static int deadline_phase(struct ctx *c, bool sender)
{
    if (sender) {
        fill_msg(c, 0, 9, 1235, 64);
        CHECK(one(c, XFER_OP_SEND, 0, 64, 1235, 10000, NULL) == 0, "send after cancel");
        return 0;
    }
    double t0 = now_s();
    int rc = one(c, XFER_OP_RECV, 32u << 20, 100, 1234, 300, NULL);
    CHECK(rc == -XFER_ETIMEDOUT && now_s() - t0 < 5, "recv deadline: %s", xfer_strerror(rc));
    xfer_batch *b = xfer_batch_new(c->e, &rc);
    xfer_batch_add_recv(b, c->buf, 32u << 20, 100, c->p, 1236);
    xfer_batch_submit(b, 10000);
    CHECK(xfer_batch_cancel(b) == 0 && xfer_batch_poll(b) == -XFER_ECANCELED, "recv cancel");
    xfer_batch_free(b);
    uint64_t got;
    CHECK(one(c, XFER_OP_RECV, 32u << 20, 100, 1235, 10000, &got) == 0 &&
              check_msg(c, 32u << 20, got, 1235, other_seed(c)) == 9,
          "message after a cancelled recv");
    return 0;
}

/* With --stop: the test stops b (SIGSTOP, then waits until every thread of
 * b is stopped: kill returns before they all are, and a running progress
 * thread of b would answer the notification) after FILE and says so in
 * FILE.stopped; a then submits a notification, which b cannot answer, says
 * FILE.sent, and b is killed (the message is owed its answer then: ipc's
 * sender leaves it to the connection's worker, tcp's to the socket).
 * Submit must not wait for the stopped peer. */
static int stopped_notify(struct ctx *c, xfer_batch **out)
{
    *out = NULL;
    if (!c->stop)
        return 0;
    char path[512];
    snprintf(path, sizeof(path), "%s.stopped", c->ready);
    for (double t0 = now_s(); access(path, F_OK) != 0 && now_s() - t0 < 60;)
        poll(NULL, 0, 20);
    int rc;
    xfer_batch *nb = xfer_batch_new(c->e, &rc);
    CHECK(nb && xfer_batch_notify(nb, c->p, "stopped", 7) == 0, "notification batch");
    double t0 = now_s();
    CHECK(xfer_batch_submit(nb, 60000) == 0, "submit of the notification");
    printf("kill: notification to the stopped peer submitted in %.3f s\n", now_s() - t0);
    CHECK(now_s() - t0 < 5, "submit waited for a stopped peer (%.1f s)", now_s() - t0);
    touch(c->ready, ".sent");
    *out = nb;
    return 0;
}

/* a: pending SEND and RECV towards b, which the test kills after FILE. */
static int kill_phase(struct ctx *c)
{
    int rc;
    xfer_batch *b = xfer_batch_new(c->e, &rc);
    fill_msg(c, 0, 1, 778, 64);
    xfer_batch_add_send(b, c->buf, 0, 64, c->p, 778);          /* b never receives it */
    xfer_batch_add_recv(b, c->buf, 32u << 20, 100, c->p, 777); /* b never sends it */
    fill_msg(c, 4096, 2, 778, 20000);
    xfer_batch_add_send(b, c->buf, 4096, 20000, c->p, 778); /* rendezvous-sized */
    CHECK(xfer_batch_submit(b, 60000) == 0, "submit");
    touch(c->ready, "");
    xfer_batch *nb; /* a notification owed its answer when b dies */
    CHECK(stopped_notify(c, &nb) == 0, "notification to the stopped peer");
    double t0 = now_s();
    rc = xfer_batch_wait(b, 30000); /* half the deadline: ECONN must come first */
    printf("kill: sends %s/%s, recv %s after %.1f s\n", xfer_strerror(xfer_batch_item_status(b, 0)),
           xfer_strerror(xfer_batch_item_status(b, 2)), xfer_strerror(xfer_batch_item_status(b, 1)),
           now_s() - t0);
    CHECK(xfer_batch_item_status(b, 0) == -XFER_ECONN &&
              xfer_batch_item_status(b, 1) == -XFER_ECONN &&
              xfer_batch_item_status(b, 2) == -XFER_ECONN,
          "pending messages of a killed peer: %s", xfer_strerror(rc));
    xfer_batch_free(b);
    if (nb) { /* it fails too, well before its deadline: nobody will answer it */
        rc = xfer_batch_wait(nb, 30000);
        printf("kill: notification sent while the peer was stopped: %s (%s)\n", xfer_strerror(rc),
               xfer_strerror(xfer_batch_notify_status(nb, c->p)));
        CHECK(rc == -XFER_ECONN && xfer_batch_notify_status(nb, c->p) == -XFER_ECONN,
              "notification owed by a peer killed while stopped: %s", xfer_strerror(rc));
        xfer_batch_free(nb);
    }
    /* and a notification to the dead peer fails, it is not kept */
    t0 = now_s();
    rc = xfer_notify(c->e, c->p, "late", 4, 5000);
    printf("kill: notification to the dead peer: %s after %.1f s (%s)\n", xfer_strerror(rc),
           now_s() - t0, xfer_engine_last_error(c->e));
    CHECK(rc == -XFER_ECONN, "notification to a killed peer: %s", xfer_strerror(rc));
    /* removing the peer ends what still names it, and nothing touches it after */
    b = xfer_batch_new(c->e, &rc);
    xfer_batch_add_recv(b, c->buf, 32u << 20, 100, c->p, 999);
    xfer_batch_add_recv(b, c->buf, (32u << 20) + 128, 100, NULL, 999); /* any peer */
    xfer_batch_submit(b, 60000);
    t0 = now_s();
    CHECK(xfer_peer_remove(c->e, c->p) == 0, "peer remove");
    c->p = NULL;
    rc = xfer_batch_wait(b, 0);
    printf("kill: removed peer: recv naming it %s after %.2f s, any-peer recv %s\n",
           xfer_strerror(xfer_batch_item_status(b, 0)), now_s() - t0,
           xfer_strerror(xfer_batch_item_status(b, 1)));
    CHECK(xfer_batch_item_status(b, 0) == -XFER_ECONN &&
              xfer_batch_item_status(b, 1) == -XFER_EINPROGRESS,
          "recv naming a removed peer");
    xfer_batch_free(b);
    return 0;
}

/* ---- phase 5: a peer removed and added again while its messages arrive ---------- */

struct churn {
    struct ctx *c;
    volatile int stop;
    int got;
};

/* b: any-peer RECVs all along, so that RTS are matched on arrival. */
static void *churn_recv(void *arg)
{
    struct churn *h = arg;
    while (!h->stop) {
        uint64_t got;
        if (xfer_recv(h->c->e, h->c->buf, 33u << 20, 128, NULL, 1300, &got, 50) == 0)
            h->got++;
    }
    return NULL;
}

/* b: the first message of the churn phase, from any peer; then its sender
 * is removed (the churn starts) and the ended RECV item still names it
 * (xfer_batch_item_msg keeps a copy: under SAN=1 reading the freed peer
 * fails the test). */
static int churn_start(struct ctx *c, struct xfer_peer_desc *d)
{
    int rc;
    xfer_batch *b = xfer_batch_new(c->e, &rc);
    xfer_batch_add_recv(b, c->buf, 33u << 20, 128, NULL, 1299);
    rc = xfer_batch_submit(b, 30000);
    if (rc == 0)
        rc = xfer_batch_wait(b, -1);
    xfer_peer_describe(c->p, d);
    xfer_peer_remove(c->e, c->p);
    c->p = NULL;
    uint64_t tag = 0;
    char from[XFER_NAME_MAX] = "";
    int mrc = rc == 0 ? xfer_batch_item_msg(b, 0, &tag, from) : rc;
    xfer_batch_free(b);
    CHECK(rc == 0, "churn: first message: %s", xfer_strerror(rc));
    CHECK(mrc == 0 && tag == 1299 && !strcmp(from, c->other),
          "item_msg after its sender was removed: %s, tag %llu, from '%s'", xfer_strerror(mrc),
          (unsigned long long)tag, from);
    xfer_peer_add(c->e, d, &c->p); /* the churn loop removes it again */
    return 0;
}

static int churn_phase(struct ctx *c, bool sender)
{
    if (sender) {
        int ok = 0, tries = 0, rc;
        /* the start: b churns only once our last phase's SEND has its FIN
         * (its own may be lost to the churn: any outcome) */
        fill_msg(c, 0, 0, 1299, 64);
        one(c, XFER_OP_SEND, 0, 64, 1299, 2000, NULL);
        fill_msg(c, 0, 1, 1300, 64);
        for (double until = now_s() + 2.5; now_s() < until; tries++) /* any outcome */
            ok += one(c, XFER_OP_SEND, 0, 64, 1300, 300, NULL) == 0;
        fill_msg(c, 0, 2, 1301, 64);
        double until = now_s() + 30;
        while ((rc = one(c, XFER_OP_SEND, 0, 64, 1301, 2000, NULL)) != 0 && now_s() < until)
            poll(NULL, 0, 20);
        printf("churn: %d of %d sends delivered while b removed and added us; then %s\n", ok, tries,
               xfer_strerror(rc));
        CHECK(rc == 0, "send after the churn: %s", xfer_strerror(rc));
        return 0;
    }
    uint64_t got = 0;
    struct xfer_peer_desc d;
    CHECK(churn_start(c, &d) == 0, "churn: start");
    struct churn h = {c, 0, 0};
    pthread_t th;
    pthread_create(&th, NULL, churn_recv, &h);
    int rounds = 0, add_rc = 0;
    for (double until = now_s() + 2; now_s() < until && add_rc == 0; rounds++) {
        if (c->p) /* the first round: churn_start removed it */
            xfer_peer_remove(c->e, c->p);
        c->p = NULL;
        /* a connect may fail while a still tears down the last ones: the
         * peer is added all the same, and reconnects */
        add_rc = xfer_peer_add(c->e, &d, &c->p);
        for (int k = 0; k < 50 && add_rc < 0 && c->p; k++) {
            poll(NULL, 0, 20);
            add_rc = xfer_peer_connect(c->p);
        }
        poll(NULL, 0, 2);
    }
    h.stop = 1;
    pthread_join(th, NULL);
    CHECK(add_rc == 0 && c->p, "churn: add: %s", xfer_engine_last_error(c->e));
    got = 0;
    int rc = one(c, XFER_OP_RECV, 33u << 20, 128, 1301, 30000, &got);
    printf("churn: %d removals, %d messages received meanwhile; then %s\n", rounds, h.got,
           xfer_strerror(rc));
    CHECK(rc == 0 && got == 64 && check_msg(c, 33u << 20, 64, 1301, other_seed(c)) == 2,
          "recv after the churn: %s", xfer_strerror(rc));
    return 0;
}

static int run_role(struct ctx *c)
{
    bool a = !strcmp(c->role, "a");
    pthread_t th;
    pthread_create(&th, NULL, send_all, c);
    int rc = recv_all(c);
    pthread_join(th, NULL);
    CHECK(rc == 0 && !c->failed, "both directions");
    printf("%s: %d messages each way\n", c->role, c->count);
    CHECK(tags_phase(c, a) == 0, "tags");
    CHECK(trunc_phase(c, a) == 0, "truncation");
    CHECK(deadline_phase(c, a) == 0, "deadline/cancel");
    printf("%s: tags, truncation, deadline, cancel ok\n", c->role);
    CHECK(churn_phase(c, a) == 0, "peer churn");
    if (a && c->ready)
        return kill_phase(c);
    if (!a && c->ready) /* b waits to be killed */
        for (;;)
            poll(NULL, 0, 1000);
    return 0;
}

int main(int argc, char **argv)
{
    struct ctx c = {.count = 1000, .seed = 42};
    const char *node = NULL, *out = NULL, *other = NULL;
    static const struct option lo[] = {
        {"node", 1, 0, 'n'},  {"out", 1, 0, 'o'},   {"other", 1, 0, 'p'},
        {"role", 1, 0, 'r'},  {"count", 1, 0, 'c'}, {"seed", 1, 0, 's'},
        {"ready", 1, 0, 'y'}, {"stop", 0, 0, 'S'},  {0, 0, 0, 0}};
    for (int o; (o = getopt_long(argc, argv, "", lo, NULL)) != -1;) {
        switch (o) {
        case 'n':
            node = optarg;
            break;
        case 'o':
            out = optarg;
            break;
        case 'p':
            other = optarg;
            break;
        case 'r':
            c.role = optarg;
            break;
        case 'c':
            c.count = atoi(optarg);
            break;
        case 's':
            c.seed = strtoull(optarg, NULL, 0);
            break;
        case 'y':
            c.ready = optarg;
            break;
        case 'S':
            c.stop = true;
            break;
        default:
            return 2;
        }
    }
    if (!node || !out || !other || !c.role) {
        fprintf(stderr, "usage: xfer_sendrecv --node ID --out F --other F --role a|b\n");
        return 2;
    }
    struct xfer_engine_config cfg;
    xfer_engine_config_init(&cfg);
    cfg.node_id = node;
    cfg.transports = node_transports();
    cfg.io_timeout_ms = 2000;
    cfg.connect_timeout_ms = 3000;
    if (getenv("XFER_TEST_PROGRESS_THREADS"))
        cfg.progress_threads = atoi(getenv("XFER_TEST_PROGRESS_THREADS"));
    int rc;
    c.e = xfer_engine_new(&cfg, &rc);
    CHECK(c.e, "engine: %s", xfer_strerror(rc));
    CHECK(xfer_region_alloc(c.e, "buf", 64u << 20, XFER_ACCESS_RW, &c.buf) == 0 &&
              node_file_write(c.e, out) == 0,
          "setup");
    struct node_file nf;
    double until = now_s() + 60;
    while (access(other, F_OK) != 0 && now_s() < until)
        poll(NULL, 0, 20);
    CHECK(node_file_read(other, &nf) == 0, "other node file %s", other);
    CHECK(xfer_peer_add(c.e, &nf.peer, &c.p) == 0, "peer add: %s", xfer_engine_last_error(c.e));
    c.other = nf.peer.node_id;
    for (int i = 0; i < nf.n_regions; i++)
        xfer_peer_region_add(c.p, &nf.regions[i]);
    /* Barrier: a SEND to an engine that has not added us yet is refused
     * (-XFER_ENOENT), so both announce "peer added" and wait for the other. */
    char mine[512], theirs[512];
    snprintf(mine, sizeof(mine), "%s.added", out);
    snprintf(theirs, sizeof(theirs), "%s.added", other);
    FILE *f = fopen(mine, "w");
    CHECK(f, "cannot write %s", mine);
    fclose(f);
    until = now_s() + 60;
    while (access(theirs, F_OK) != 0 && now_s() < until)
        poll(NULL, 0, 20);
    CHECK(access(theirs, F_OK) == 0, "the other side never added us");
    const char *want = getenv("XFER_NOTIFY_EXPECT");
    char have[32] = "";
    xfer_transports_format(xfer_peer_transport(c.p), have, sizeof(have));
    CHECK(!want || !strcmp(want, have), "peer reached over '%s', expected '%s'", have, want);
    rc = run_role(&c);
    xfer_engine_free(c.e);
    return rc;
}
