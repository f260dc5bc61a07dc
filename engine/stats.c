/* Counters of the node, per peer and per transport. Each thread adds to its
 * own shard of a set (relaxed atomics: two threads may share a shard), and
 * readers sum the shards, so the progress threads do not bounce one cache
 * line per completed item between them. */
#include "internal.h"

#include <string.h>

#define ADD(field, v) __atomic_add_fetch(&(field), (v), __ATOMIC_RELAXED)

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

/* This thread's shard, chosen round robin at its first count. */
static unsigned my_shard(void)
{
    static unsigned next;
    /* (not initial-exec: libxfer.so is dlopened by Python, and its static
     * TLS reserve is spent) */
    static _Thread_local unsigned mine = UINT32_MAX;
    if (mine == UINT32_MAX)
        mine = __atomic_fetch_add(&next, 1, __ATOMIC_RELAXED) % STATS_SHARDS;
    return mine;
}

void stats_count_items(struct stats_set *const *sets, size_t n, enum xfer_op op, uint64_t items,
                       uint64_t bytes, uint64_t lat_us)
{
    unsigned k = my_shard();
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
    unsigned k = my_shard();
    for (size_t j = 0; j < n; j++)
        ADD(sets[j]->sh[k].s.errors, 1);
}

void stats_count_served(struct stats_set *set, uint64_t bytes, int status)
{
    struct xfer_stats *s = &set->sh[my_shard()].s;
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
    unsigned k = my_shard();
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
