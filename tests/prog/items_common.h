/*
 * Shared by xfer_vec.c (vectored items) and xfer_blocks.c (block items),
 * both run against a served node (tests/lib/core.sh core_start): their
 * options, the client engine, the local region and the shadow of the
 * remote one, the whole-region comparison at the end, and the check of an
 * item that its own run refused. Header-only, like check.h.
 *
 *   PROG --peer FILE [--region rw] [--pattern-seed N] [--rounds N]
 *        [--seed N] [--guard REGION:OFF] [--expect tcp|ipc]
 *
 * A region named "ro" in the node file (read-only) is used, when there, to
 * check that a WRITE to it is refused before anything moves.
 */
#ifndef XFER_TEST_ITEMS_COMMON_H
#define XFER_TEST_ITEMS_COMMON_H

#include "check.h"
#include "node_common.h"

#include <getopt.h>

static uint64_t rng_state = 1;
static inline uint64_t rnd(void)
{
    rng_state += 0x9e3779b97f4a7c15ull;
    return mix64(rng_state);
}

struct ctx {
    xfer_engine *e;
    xfer_peer *p;
    const struct xfer_region_desc *rd;
    xfer_region *local;
    uint8_t *lp, *shadow;
    uint64_t size;
    const struct xfer_region_desc *grd; /* the guarded region, or NULL */
    uint64_t guard_off;
    const struct xfer_region_desc *ro; /* the read-only region, or NULL */
    unsigned expect;                   /* transport bit, 0 = any */
    long rounds;
    struct node_file nf;
};

/* Parses the options into c (rounds and expect keep the caller's defaults
 * unless given), connects engine `name` to the served node and allocates
 * the local region, as large as the remote one, and the shadow of the
 * remote one (its pattern). 0, 1 (set-up failed) or 2 (usage). */
static inline int items_setup(int argc, char **argv, const char *name, struct ctx *c)
{
    static const struct option lo[] = {{"peer", 1, 0, 'p'},   {"region", 1, 0, 'r'},
                                       {"rounds", 1, 0, 'n'}, {"seed", 1, 0, 's'},
                                       {"guard", 1, 0, 'g'},  {"pattern-seed", 1, 0, 'P'},
                                       {"expect", 1, 0, 'x'}, {0, 0, 0, 0}};
    const char *peer = NULL, *region = "rw", *guard = NULL;
    char gname[64] = "";
    uint64_t pseed = 0;
    for (int o; (o = getopt_long(argc, argv, "", lo, NULL)) != -1;) {
        if (o == 'p')
            peer = optarg;
        else if (o == 'r')
            region = optarg;
        else if (o == 'n')
            c->rounds = atol(optarg);
        else if (o == 's')
            rng_state = strtoull(optarg, NULL, 0);
        else if (o == 'P')
            pseed = strtoull(optarg, NULL, 0);
        else if (o == 'g')
            guard = optarg;
        else if (o == 'x' && xfer_transports_parse(optarg, &c->expect) == 0)
            continue;
        else
            return 2;
    }
    if (!peer || node_file_read(peer, &c->nf) < 0 || !(c->rd = node_region(&c->nf, region)))
        return 2;
    if (guard && (sscanf(guard, "%63[^:]:%" SCNu64, gname, &c->guard_off) != 2 ||
                  !(c->grd = node_region(&c->nf, gname))))
        return 2;
    c->ro = node_region(&c->nf, "ro");
    int rc;
    c->e = client_engine(name, &c->nf, NULL, 4, &c->p, &rc);
    if (!c->e || rc < 0)
        return 1;
    c->size = c->rd->len;
    if (xfer_region_alloc(c->e, "local", c->size, XFER_ACCESS_RW, &c->local) < 0 ||
        !(c->shadow = malloc(c->size)))
        return 1;
    c->lp = xfer_region_ptr(c->local);
    pattern_fill(c->shadow, c->size, pseed, 0);
    return 0;
}

static inline void items_teardown(struct ctx *c)
{
    xfer_engine_free(c->e);
    free(c->shadow);
}

/* An item of op from the local region to remote region rd (no range yet). */
static inline struct xfer_item item_head(const struct ctx *c, enum xfer_op op,
                                         const struct xfer_region_desc *rd)
{
    return (struct xfer_item){
        .op = op, .local = c->local, .peer = c->p, .remote_id = rd->id, .remote_gen = rd->gen};
}

/* The whole remote region read back equals the shadow. */
static inline void final_check(struct ctx *c)
{
    memset(c->lp, 0, c->size);
    int rc = xfer_read(c->e, c->local, 0, c->p, c->rd->id, c->rd->gen, 0, c->size, 30000);
    CHECK(rc == 0, "final read: %s", xfer_engine_last_error(c->e));
    uint64_t at = 0;
    while (rc == 0 && at < c->size && c->lp[at] == c->shadow[at])
        at++;
    CHECK(rc != 0 || at == c->size, "final region content differs at %llu of %llu",
          (unsigned long long)at, (unsigned long long)c->size);
}

/* Submits b (one item, added by the caller) and waits: the item must end
 * with code and, when seg >= 0, with its segment seg failed and named in
 * the reason. */
static inline void expect_item_fails(struct ctx *c, xfer_batch *b, int64_t seg, int code,
                                     const char *what)
{
    (void)c;
    int rc = xfer_batch_submit(b, 10000);
    rc = rc ? rc : xfer_batch_wait(b, -1);
    const char *why = xfer_batch_item_error(b, 0);
    printf("%s: %s (segment %lld): %s\n", what, xfer_strerror(rc),
           (long long)xfer_batch_item_failed_segment(b, 0), why);
    CHECK(rc == code, "%s: got %s, want %s", what, xfer_strerror(rc), xfer_strerror(code));
    CHECK(seg < 0 || xfer_batch_item_failed_segment(b, 0) == seg,
          "%s: failed segment %lld, want %lld", what,
          (long long)xfer_batch_item_failed_segment(b, 0), (long long)seg);
    char want[32];
    snprintf(want, sizeof(want), "segment %lld", (long long)seg);
    CHECK(seg < 0 || strstr(why, want) != NULL, "%s: reason does not name %s: %s", what, want, why);
}

#endif
