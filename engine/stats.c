/* Counters of the node, per peer and per transport. Each thread adds to its
 * own shard of a set, and readers sum the shards, so the progress threads
 * and application threads completing items do not bounce one cache line
 * per item between them. The first STATS_OWNED threads to count each own a
 * shard (claimed at the first count, given back at the thread's exit) and
 * add to it with a plain load and store: no locked instruction (an item
 * made 12 locked adds: node, peer and transport sets; docs/perf.md "Step
 * 17"). Threads beyond them share the other shards with atomic adds. */
#include "internal.h"
#include "thread_exit.h"

#include <stdint.h>
#include <string.h>

#define STATS_OWNED (STATS_SHARDS / 2)

static unsigned owned_mask; /* atomic: bit k set while a thread owns shard k */

/* The thread's shard, and whether it is the thread's own. */
static _Thread_local struct {
    unsigned k;
    bool set, own;
} my;

/* At the thread's exit: its shard goes back (its counts stay in it), and a
 * count after this (another exit hook's) chooses again. The release orders
 * the last plain stores before the next owner's loads. If the library is
 * unloaded first, this does not run: the shards such threads own stay
 * claimed, and later threads share. */
static void owner_release(void)
{
    if (my.set && my.own)
        __atomic_fetch_and(&owned_mask, ~(1u << my.k), __ATOMIC_RELEASE);
    my.set = false;
}

/* A free shard of the first STATS_OWNED claimed for this thread, if one is
 * free and its exit can give it back; else -1. */
static int claim_shard(void)
{
    unsigned m = __atomic_load_n(&owned_mask, __ATOMIC_RELAXED);
    for (;;) {
        unsigned free_bits = ~m & ((1u << STATS_OWNED) - 1);
        if (!free_bits)
            return -1;
        unsigned k = (unsigned)__builtin_ctz(free_bits);
        if (!__atomic_compare_exchange_n(&owned_mask, &m, m | 1u << k, false, __ATOMIC_ACQUIRE,
                                         __ATOMIC_RELAXED))
            continue;
        if (xfer_thread_exit_arm(XFER_EXIT_STATS, owner_release))
            return (int)k;
        __atomic_fetch_and(&owned_mask, ~(1u << k), __ATOMIC_RELEASE);
        return -1;
    }
}

/* This thread's shard, chosen at its first count: its own, or one of the
 * shared ones round robin. (Not initial-exec TLS: libxfer.so is dlopened by
 * Python, and its static TLS reserve is spent.) */
static unsigned my_shard(bool *own)
{
    static unsigned next;
    if (!my.set) {
        int k = claim_shard();
        my.own = k >= 0;
        my.k = k >= 0 ? (unsigned)k
                      : STATS_OWNED + __atomic_fetch_add(&next, 1, __ATOMIC_RELAXED) %
                                          (STATS_SHARDS - STATS_OWNED);
        my.set = true;
    }
    *own = my.own;
    return my.k;
}

/* Adds v to a counter of this thread's shard: a plain load and store in its
 * own (readers load it atomically: never torn), an atomic add in a shared one. */
static inline void add(uint64_t *field, uint64_t v, bool own)
{
    if (own)
        __atomic_store_n(field, __atomic_load_n(field, __ATOMIC_RELAXED) + v, __ATOMIC_RELAXED);
    else
        __atomic_add_fetch(field, v, __ATOMIC_RELAXED);
}
#define ADD(field, v) add(&(field), (v), own)

int transport_index(unsigned bit)
{
    if (bit == 0 || (bit & (bit - 1)))
        return -1;
    int i = __builtin_ctz(bit);
    return i < XFER_MAX_TRANSPORTS ? i : -1;
}

static int lat_bucket(uint64_t us)
{
    /* bucket i holds [8 << (i-1), 8 << i): the first i with us < 8 << i */
    int i = us < 8 ? 0 : 64 - __builtin_clzll(us >> 3);
    return i < XFER_LAT_BUCKETS - 1 ? i : XFER_LAT_BUCKETS - 1;
}

void stats_count_items(struct stats_set *const *sets, size_t n, enum xfer_op op, uint64_t items,
                       uint64_t bytes, uint64_t lat_us)
{
    bool own;
    unsigned k = my_shard(&own);
    int bucket = lat_bucket(lat_us);
    for (size_t j = 0; j < n; j++) {
        struct xfer_stats *s = &sets[j]->sh[k].s;
        if (op == XFER_OP_READ) {
            ADD(s->ops_read, items);
            ADD(s->bytes_read, bytes);
        } else {
            ADD(s->ops_write, items);
            ADD(s->bytes_written, bytes);
        }
        ADD(s->lat_us_sum, lat_us * items);
        ADD(s->lat_hist[bucket], items);
    }
}

void stats_count_item(struct stats_set *const *sets, size_t n, enum xfer_op op, uint64_t bytes,
                      int status, uint64_t lat_us)
{
    if (status >= 0) {
        stats_count_items(sets, n, op, 1, bytes, lat_us);
        return;
    }
    bool own;
    unsigned k = my_shard(&own);
    for (size_t j = 0; j < n; j++)
        ADD(sets[j]->sh[k].s.errors, 1);
}

void stats_count_served(struct stats_set *set, uint64_t bytes, int status)
{
    bool own;
    struct xfer_stats *s = &set->sh[my_shard(&own)].s;
    if (status < 0) {
        ADD(s->served_errors, 1);
        return;
    }
    ADD(s->served_ops, 1);
    ADD(s->served_bytes, bytes);
}

#define LOAD(f) out->f += __atomic_load_n(&s->f, __ATOMIC_RELAXED)
void stats_read(const struct stats_set *set, struct xfer_stats *out)
{
    memset(out, 0, sizeof(*out));
    for (int k = 0; k < STATS_SHARDS; k++) {
        const struct xfer_stats *s = &set->sh[k].s;
        LOAD(ops_read);
        LOAD(ops_write);
        LOAD(bytes_read);
        LOAD(bytes_written);
        LOAD(errors);
        LOAD(served_ops);
        LOAD(served_bytes);
        LOAD(served_errors);
        LOAD(lat_us_sum);
        for (int i = 0; i < XFER_LAT_BUCKETS; i++)
            LOAD(lat_hist[i]);
    }
}
#undef LOAD

void xfer_engine_count_served_n(xfer_engine *e, unsigned transport_bit, uint64_t ops,
                                uint64_t bytes)
{
    bool own;
    unsigned k = my_shard(&own);
    struct xfer_stats *s = &e->stats.sh[k].s;
    ADD(s->served_ops, ops);
    ADD(s->served_bytes, bytes);
    int i = transport_index(transport_bit);
    if (i < 0)
        return;
    s = &e->tstats[i].sh[k].s;
    ADD(s->served_ops, ops);
    ADD(s->served_bytes, bytes);
}

void xfer_engine_count_served(xfer_engine *e, unsigned transport_bit, uint64_t bytes, int status)
{
    stats_count_served(&e->stats, bytes, status);
    int i = transport_index(transport_bit);
    if (i >= 0)
        stats_count_served(&e->tstats[i], bytes, status);
}

void xfer_engine_stats(xfer_engine *e, struct xfer_stats *out)
{
    if (e && out)
        stats_read(&e->stats, out);
}

void xfer_peer_stats(xfer_peer *p, struct xfer_stats *out)
{
    if (p && out)
        stats_read(&p->stats, out);
}

void xfer_transport_stats(xfer_engine *e, unsigned transport_bit, struct xfer_stats *out)
{
    if (!e || !out)
        return;
    int i = transport_index(transport_bit);
    if (i < 0) {
        memset(out, 0, sizeof(*out));
        return;
    }
    stats_read(&e->tstats[i], out);
}
