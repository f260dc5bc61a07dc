/* Publisher: the own node and its regions, written in MULTI/EXEC blocks and
 * pipelined; heartbeat (TTL refresh), republish, removal, reaping of nodes
 * whose TTL ran out. The registry keeps a copy of everything it published
 * (r->own, r->own_regions) so it can republish without the caller. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "reg_internal.h"

#define NODE_GROUP   7 /* commands in append_node */
#define REGION_GROUP 7 /* commands in append_region */

static void append(xfer_registry *r, struct reg_args *a)
{
    reg_append(r, a->argc, a->argv, a->len);
}

static void append_simple(xfer_registry *r, const char *c0, const char *c1, const char *c2,
                          const char *c3)
{
    struct reg_args a;
    reg_args_reset(&a);
    const char *v[] = {c0, c1, c2, c3};
    for (int i = 0; i < 4 && v[i]; i++)
        reg_args_add(&a, v[i]);
    append(r, &a);
}

static void append_pexpire(xfer_registry *r, const char *key)
{
    char ttl[16];
    snprintf(ttl, sizeof(ttl), "%d", r->cfg.ttl_ms);
    append_simple(r, "PEXPIRE", key, ttl, NULL);
}

/* MULTI, HSET node, PEXPIRE node, PEXPIRE set, ZADD, PUBLISH join, EXEC.
 * Cluster mode: the ZADD into the node's membership shard (another slot)
 * comes first, outside the transaction. */
static void append_node(xfer_registry *r)
{
    const char *id = r->own.peer.node_id;
    char key[REG_KEY_MAX], set[REG_KEY_MAX], score[24], msg[XFER_NAME_MAX + 8],
        members[REG_KEY_MAX];
    struct reg_args a;
    reg_key_node(key, id);
    reg_key_regions(set, id);
    reg_key_members(r, members, id);
    snprintf(score, sizeof(score), "%llu", (unsigned long long)r->own.heartbeat_ms);
    if (r->cl)
        append_simple(r, "ZADD", members, score, id);
    append_simple(r, "MULTI", NULL, NULL, NULL);
    reg_args_reset(&a);
    reg_args_add(&a, "HSET");
    reg_args_add(&a, key);
    reg_args_node_fields(&a, &r->own);
    append(r, &a);
    append_pexpire(r, key);
    append_pexpire(r, set);
    if (!r->cl)
        append_simple(r, "ZADD", members, score, id);
    snprintf(msg, sizeof(msg), "join %s", id);
    append_simple(r, "PUBLISH", REG_EVENTS_CHAN, msg, NULL);
    append_simple(r, "EXEC", NULL, NULL, NULL);
}

/* MULTI, HSET region, PEXPIRE region, SADD set, PEXPIRE set, PUBLISH region+
 * (when announce), EXEC. */
static void append_region(xfer_registry *r, const struct xfer_region_desc *d, uint64_t now,
                          bool announce)
{
    const char *id = r->own.peer.node_id;
    char key[REG_KEY_MAX], set[REG_KEY_MAX], msg[2 * XFER_NAME_MAX + 16];
    struct reg_args a;
    reg_key_region(key, id, d->name);
    reg_key_regions(set, id);
    append_simple(r, "MULTI", NULL, NULL, NULL);
    reg_args_reset(&a);
    reg_args_add(&a, "HSET");
    reg_args_add(&a, key);
    reg_args_region_fields(&a, d, now);
    append(r, &a);
    append_pexpire(r, key);
    append_simple(r, "SADD", set, d->name, NULL);
    append_pexpire(r, set);
    snprintf(msg, sizeof(msg), "region+ %s %s", id, d->name);
    if (announce)
        append_simple(r, "PUBLISH", REG_EVENTS_CHAN, msg, NULL);
    append_simple(r, "EXEC", NULL, NULL, NULL);
}

/* An EXEC reply: an array whose elements are no errors. */
static int check_exec(const redisReply *rep)
{
    if (!rep || rep->type != REDIS_REPLY_ARRAY)
        return reg_reply_check(rep, "MULTI/EXEC") ? -XFER_EPROTO
                                                  : reg_set_err(-XFER_EPROTO, "EXEC aborted");
    for (size_t i = 0; i < rep->elements; i++)
        if (reg_reply_check(rep->element[i], "a command in MULTI/EXEC"))
            return -XFER_EPROTO;
    return 0;
}

/* Reads the replies of pipelined MULTI/EXEC groups of per commands each
 * (or sizes[i] for group i when sizes is given); checks each EXEC. The
 * first failure is returned after every reply was consumed. */
static int read_groups(xfer_registry *r, size_t groups, size_t per, const unsigned char *sizes)
{
    int first = 0;
    for (size_t g = 0; g < groups; g++) {
        size_t n = sizes ? sizes[g] : per;
        for (size_t i = 0; i < n; i++) {
            redisReply *rep;
            int rc = reg_read_replies(r, 1, &rep);
            if (rc)
                return rc;
            if (i == n - 1 && (rc = check_exec(rep)) && !first)
                first = rc;
            freeReplyObject(rep);
        }
    }
    return first;
}

/* Writes regions d[0..n) of the own node, REG_PIPE_CHUNK per round trip.
 * own: d are the recorded copies (republish): a region already written
 * once is written again without "region+" — its content did not change,
 * and after a Redis restart N nodes announcing R regions each to N
 * subscribers would be N * N * R messages; peers resync on their own
 * reconnect, and the node's "join" still goes out. */
static int write_regions(xfer_registry *r, const struct xfer_region_desc *const *d, size_t n,
                         bool own)
{
    uint64_t now = reg_wall_ms();
    unsigned char sizes[REG_PIPE_CHUNK];
    for (size_t i = 0; i < n; i += REG_PIPE_CHUNK) {
        size_t k = n - i < REG_PIPE_CHUNK ? n - i : REG_PIPE_CHUNK;
        for (size_t j = 0; j < k; j++) {
            bool announce = !own || !((const struct reg_own_region *)d[i + j])->announced;
            append_region(r, d[i + j], now, announce);
            sizes[j] = announce ? REGION_GROUP : REGION_GROUP - 1;
        }
        int rc = read_groups(r, k, 0, sizes);
        if (rc)
            return rc;
        for (size_t j = 0; j < k; j++) {
            struct reg_own_region *o = strmap_get(&r->own_regions, d[i + j]->name);
            if (o)
                o->announced = true;
        }
    }
    return 0;
}

static void collect(const char *key, void *value, void *arg)
{
    (void)key;
    const struct xfer_region_desc ***p = arg;
    *(*p)++ = value;
}

/* Array of pointers to every own region (borrowed); NULL+0 when none. */
static const struct xfer_region_desc **own_region_list(xfer_registry *r, size_t *n)
{
    *n = r->own_regions.count;
    if (!*n)
        return NULL;
    const struct xfer_region_desc **v = malloc(*n * sizeof(*v)), **p = v;
    if (v)
        strmap_foreach(&r->own_regions, collect, &p);
    return v;
}

/* First publish of a node by this process: region keys left in Redis by a
 * previous incarnation (crashed, not yet expired) are deleted, so nobody
 * looks up a region of the old process through the new node. */
static int purge_old_regions(xfer_registry *r, const char *id)
{
    char set[REG_KEY_MAX];
    reg_key_regions(set, id);
    const char *argv[] = {"SMEMBERS", set};
    redisReply *names;
    int rc = reg_cmd(r, &names, 2, argv, NULL);
    if (rc || (rc = reg_reply_check(names, "SMEMBERS")) || names->type != REDIS_REPLY_ARRAY ||
        !names->elements) {
        if (names)
            freeReplyObject(names);
        return rc;
    }
    size_t k = 0;
    append_simple(r, "MULTI", NULL, NULL, NULL);
    for (size_t i = 0; i < names->elements; i++) {
        const redisReply *e = names->element[i];
        if (e->type != REDIS_REPLY_STRING || !xfer_registry_name_ok(e->str))
            continue;
        char key[REG_KEY_MAX];
        reg_key_region(key, id, e->str);
        append_simple(r, "DEL", key, NULL, NULL);
        k++;
    }
    append_simple(r, "DEL", set, NULL, NULL);
    append_simple(r, "EXEC", NULL, NULL, NULL);
    xfer_info("registry: removed %zu regions of a previous incarnation of %s", k, id);
    freeReplyObject(names);
    return read_groups(r, 1, k + 3, NULL);
}

int reg_republish_locked(xfer_registry *r)
{
    if (!r->own_valid || !r->ctx)
        return r->own_valid ? -XFER_EUNAVAIL : 0;
    size_t n;
    const struct xfer_region_desc **v = own_region_list(r, &n);
    if (n && !v)
        return reg_set_err(-XFER_ENOMEM, "out of memory republishing");
    int rc = r->purge_pending ? purge_old_regions(r, r->own.peer.node_id) : 0;
    if (!rc && r->purge_pending)
        rc = reg_pools_purge_locked(r, r->own.peer.node_id);
    if (rc) {
        free(v);
        return rc;
    }
    r->purge_pending = false;
    r->own.heartbeat_ms = reg_wall_ms();
    append_node(r);
    rc = read_groups(r, 1, NODE_GROUP, NULL);
    if (!rc)
        rc = write_regions(r, v, n, true);
    if (!rc)
        rc = reg_pools_republish_locked(r);
    free(v);
    if (!rc) {
        r->need_republish = false;
        r->next_heartbeat_ms = reg_now_ms() + (uint64_t)r->cfg.heartbeat_ms;
        xfer_info("registry: published node %s and %zu regions to %s", r->own.peer.node_id, n,
                  r->url_shown);
    }
    return rc;
}

static uint64_t fresh_incarnation(void)
{
    uint64_t v = 0;
    if (getrandom(&v, sizeof(v), GRND_NONBLOCK) != (ssize_t)sizeof(v))
        v = reg_wall_ms() * 6364136223846793005ull ^ (uint64_t)getpid() << 32;
    return v ? v : 1;
}

int xfer_registry_publish_node(xfer_registry *r, const struct xfer_node_desc *node)
{
    if (!r)
        return -XFER_EINVAL;
    int rc = reg_check_node(node);
    if (rc)
        return rc;
    pthread_mutex_lock(&r->cmd_lock);
    if (r->own_valid && strcmp(r->own.peer.node_id, node->peer.node_id)) {
        rc = reg_set_err(-XFER_EINVAL, "this registry handle already publishes node %s",
                         r->own.peer.node_id);
        goto out;
    }
    rc = reg_conn_ensure(r);
    struct xfer_node_desc prev = r->own;
    bool had = r->own_valid;
    r->own = *node;
    if (!r->own.peer.incarnation)
        r->own.peer.incarnation =
            had && prev.peer.incarnation ? prev.peer.incarnation : fresh_incarnation();
    if (!r->own.started_ms)
        r->own.started_ms = had && prev.started_ms ? prev.started_ms : reg_wall_ms();
    r->own.heartbeat_ms = reg_wall_ms();
    r->own_valid = true;
    r->need_republish = true;
    if (!had)
        r->purge_pending = true;
    if (!rc)
        rc = reg_republish_locked(r);
out:
    pthread_mutex_unlock(&r->cmd_lock);
    return rc;
}

int xfer_registry_own_node(xfer_registry *r, struct xfer_node_desc *out)
{
    pthread_mutex_lock(&r->cmd_lock);
    int rc = r->own_valid ? 0 : reg_set_err(-XFER_ENOENT, "no node published by this handle");
    if (!rc)
        *out = r->own;
    pthread_mutex_unlock(&r->cmd_lock);
    return rc;
}

/* Records copies of d[0..n) as own regions (replacing same names). */
static int remember_regions(xfer_registry *r, const struct xfer_region_desc *d, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        struct reg_own_region *c = malloc(sizeof(*c));
        void *old = NULL;
        if (!c || strmap_put(&r->own_regions, d[i].name, c, &old)) {
            free(c);
            return reg_set_err(-XFER_ENOMEM, "out of memory recording regions");
        }
        c->desc = d[i];
        c->announced = false;
        free(old);
    }
    return 0;
}

int xfer_registry_publish_regions(xfer_registry *r, const struct xfer_region_desc *d, size_t n)
{
    if (!r || (!d && n))
        return -XFER_EINVAL;
    for (size_t i = 0; i < n; i++) {
        int rc = reg_check_region(&d[i]);
        if (rc)
            return rc;
    }
    pthread_mutex_lock(&r->cmd_lock);
    int rc = 0;
    if (!r->own_valid) {
        rc = reg_set_err(-XFER_EINVAL, "publish the node before its regions");
        goto out;
    }
    int conn = reg_conn_ensure(r); /* may republish what was recorded before */
    rc = remember_regions(r, d, n);
    if (rc)
        goto out;
    if (conn) {
        rc = conn;
        goto out;
    }
    const struct xfer_region_desc **v = malloc((n ? n : 1) * sizeof(*v));
    if (!v) {
        rc = reg_set_err(-XFER_ENOMEM, "out of memory publishing regions");
        goto out;
    }
    for (size_t i = 0; i < n; i++)
        v[i] = &d[i];
    rc = write_regions(r, v, n, false);
    free(v);
out:
    pthread_mutex_unlock(&r->cmd_lock);
    return rc;
}

int xfer_registry_unpublish_region(xfer_registry *r, const char *name)
{
    if (!r || !name)
        return -XFER_EINVAL;
    pthread_mutex_lock(&r->cmd_lock);
    struct xfer_region_desc *d = strmap_del(&r->own_regions, name);
    int rc = d ? reg_conn_ensure(r)
               : reg_set_err(-XFER_ENOENT, "region %s was not published by this handle", name);
    free(d);
    if (!rc) {
        const char *id = r->own.peer.node_id;
        char key[REG_KEY_MAX], set[REG_KEY_MAX], msg[2 * XFER_NAME_MAX + 16];
        reg_key_region(key, id, name);
        reg_key_regions(set, id);
        snprintf(msg, sizeof(msg), "region- %s %s", id, name);
        append_simple(r, "MULTI", NULL, NULL, NULL);
        append_simple(r, "DEL", key, NULL, NULL);
        append_simple(r, "SREM", set, name, NULL);
        append_simple(r, "PUBLISH", REG_EVENTS_CHAN, msg, NULL);
        append_simple(r, "EXEC", NULL, NULL, NULL);
        rc = read_groups(r, 1, 5, NULL);
    }
    pthread_mutex_unlock(&r->cmd_lock);
    return rc;
}

static void append_del_region(const char *name, void *value, void *arg)
{
    (void)value;
    xfer_registry *r = arg;
    char key[REG_KEY_MAX];
    reg_key_region(key, r->own.peer.node_id, name);
    append_simple(r, "DEL", key, NULL, NULL);
}

static void free_value(void *v)
{
    free(v);
}

int xfer_registry_unpublish_node(xfer_registry *r)
{
    if (!r)
        return -XFER_EINVAL;
    pthread_mutex_lock(&r->cmd_lock);
    int rc = r->own_valid ? 0 : reg_set_err(-XFER_ENOENT, "no node published by this handle");
    if (!rc) {
        r->need_republish = false; /* a reconnect inside ensure must not re-add it */
        r->own_valid = false;
        rc = reg_conn_ensure(r);
        r->own_valid = true;
    }
    if (!rc)
        rc = reg_pools_delete_all_locked(r);
    if (!rc) {
        const char *id = r->own.peer.node_id;
        char key[REG_KEY_MAX], set[REG_KEY_MAX], msg[XFER_NAME_MAX + 8], members[REG_KEY_MAX];
        reg_key_node(key, id);
        reg_key_regions(set, id);
        reg_key_members(r, members, id);
        snprintf(msg, sizeof(msg), "leave %s", id);
        if (r->cl) /* cluster: the shard is another slot, outside the transaction */
            append_simple(r, "ZREM", members, id, NULL);
        append_simple(r, "MULTI", NULL, NULL, NULL);
        strmap_foreach(&r->own_regions, append_del_region, r);
        append_simple(r, "DEL", set, NULL, NULL);
        append_simple(r, "DEL", key, NULL, NULL);
        if (!r->cl)
            append_simple(r, "ZREM", members, id, NULL);
        append_simple(r, "PUBLISH", REG_EVENTS_CHAN, msg, NULL);
        append_simple(r, "EXEC", NULL, NULL, NULL);
        size_t per = r->own_regions.count + 6;
        rc = read_groups(r, 1, per, NULL);
    }
    if (rc != -XFER_ENOENT) {
        reg_cache_drop_node(r, r->own.peer.node_id);
        r->own_valid = false; /* if Redis is down the keys expire by TTL */
        r->need_republish = false;
        strmap_clear(&r->own_regions, free_value);
        reg_pools_clear(r);
    }
    pthread_mutex_unlock(&r->cmd_lock);
    return rc;
}
