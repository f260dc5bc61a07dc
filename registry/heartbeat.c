/* Heartbeat (TTL refresh of every own key, zset score) and reaping of nodes
 * whose TTL ran out (so that crashed nodes get a "leave" event). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reg_internal.h"

/* Atomically: every member of xfer:nodes whose score is older than ARGV[1]
 * and whose hash is gone is removed and announced with "leave". Returns the
 * removed ids. Only one of many reaping nodes wins each ZREM. */
static const char reap_script[] =
    "local gone = {}\n"
    "for _, n in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])) do\n"
    "  if redis.call('EXISTS', 'xfer:node:{' .. n .. '}') == 0 then\n"
    "    redis.call('ZREM', KEYS[1], n)\n"
    "    redis.call('PUBLISH', 'xfer:events', 'leave ' .. n)\n"
    "    gone[#gone + 1] = n\n"
    "  end\n"
    "end\n"
    "return gone\n";

/* Cluster mode: a Lua script may only touch keys of its own slot, so the
 * check that the node hash is gone is a separate command; then this script
 * removes the member only if its score is still old (the node did not come
 * back meanwhile): still exactly one "leave" per expired node. */
static const char reap_one_script[] =
    "local s = redis.call('ZSCORE', KEYS[1], ARGV[1])\n"
    "if s and tonumber(s) <= tonumber(ARGV[2]) then\n"
    "  redis.call('ZREM', KEYS[1], ARGV[1])\n"
    "  redis.call('PUBLISH', 'xfer:events', 'leave ' .. ARGV[1])\n"
    "  return 1\n"
    "end\n"
    "return 0\n";

/* One shard per call, in turn: with many nodes reaping, every shard is
 * looked at every reap_ms anyway; alone, within REG_SHARDS * reap_ms. */
static int reap_cluster(xfer_registry *r, const char *before)
{
    char shard[REG_KEY_MAX], key[REG_KEY_MAX];
    reg_key_shard(shard, r->reap_shard++ % REG_SHARDS);
    const char *argv[] = {"ZRANGEBYSCORE", shard, "-inf", before, "LIMIT", "0", "100"};
    redisReply *names;
    int rc = reg_cmd(r, &names, 7, argv, NULL);
    if (rc || (rc = reg_reply_check(names, "ZRANGEBYSCORE")) || names->type != REDIS_REPLY_ARRAY) {
        if (names)
            freeReplyObject(names);
        return rc;
    }
    for (size_t i = 0; !rc && i < names->elements; i++) {
        const redisReply *e = names->element[i];
        if (e->type != REDIS_REPLY_STRING || !xfer_registry_name_ok(e->str))
            continue;
        reg_key_node(key, e->str);
        const char *ex[] = {"EXISTS", key};
        const char *ev[] = {"EVAL", reap_one_script, "1", shard, e->str, before};
        redisReply *rep;
        if ((rc = reg_cmd(r, &rep, 2, ex, NULL)))
            break;
        bool gone = rep->type == REDIS_REPLY_INTEGER && rep->integer == 0;
        freeReplyObject(rep);
        if (!gone || (rc = reg_cmd(r, &rep, 6, ev, NULL)))
            continue;
        if (rep->type == REDIS_REPLY_INTEGER && rep->integer == 1)
            xfer_info("registry: node %s expired (no heartbeat for %d ms), announced leave", e->str,
                      r->cfg.ttl_ms);
        rc = reg_reply_check(rep, "reap script");
        freeReplyObject(rep);
    }
    freeReplyObject(names);
    return rc;
}

int reg_reap_locked(xfer_registry *r)
{
    /* Right after an outage nobody could heartbeat, and a failover longer
     * than the TTL lost the keys of live nodes: their owners write them again
     * at their next heartbeat or reconnect, so a "leave" now would be false. */
    if (reg_outage_recent(r))
        return 0;
    char before[24];
    uint64_t now = reg_wall_ms(), ttl = (uint64_t)r->cfg.ttl_ms;
    snprintf(before, sizeof(before), "%llu", (unsigned long long)(now > ttl ? now - ttl : 0));
    if (r->cl)
        return reap_cluster(r, before);
    const char *argv[] = {"EVAL", reap_script, "1", REG_NODES_KEY, before};
    redisReply *rep;
    int rc = reg_cmd(r, &rep, 5, argv, NULL);
    if (rc)
        return rc;
    rc = reg_reply_check(rep, "reap script");
    if (!rc && rep->type == REDIS_REPLY_ARRAY) {
        for (size_t i = 0; i < rep->elements; i++) {
            if (rep->element[i]->type != REDIS_REPLY_STRING)
                continue;
            xfer_info("registry: node %s expired (no heartbeat for %d ms), announced leave",
                      rep->element[i]->str, r->cfg.ttl_ms);
        }
    }
    freeReplyObject(rep);
    return rc;
}

static void append_argv(xfer_registry *r, int argc, const char **argv)
{
    reg_append(r, argc, argv, NULL);
}

struct hb_walk {
    xfer_registry *r;
    const char *ttl;
};

static void append_region_pexpire(const char *name, void *value, void *arg)
{
    (void)value;
    struct hb_walk *w = arg;
    char key[REG_KEY_MAX];
    reg_key_region(key, w->r->own.peer.node_id, name);
    const char *argv[] = {"PEXPIRE", key, w->ttl};
    append_argv(w->r, 3, argv);
}

/* Sets heartbeat_ms only on a node hash that still exists; returns 1 when it
 * had vanished. A plain HSET would recreate an expired hash holding that one
 * field, and peers would read it as a malformed row (no addr, no
 * incarnation) until the republish that follows. */
static const char beat_script[] = "if redis.call('EXISTS', KEYS[1]) == 0 then return 1 end\n"
                                  "redis.call('HSET', KEYS[1], 'heartbeat_ms', ARGV[1])\n"
                                  "return 0\n";

/* MULTI, heartbeat_ms (beat_script), PEXPIRE node, PEXPIRE set, ZADD, EXEC
 * (cluster mode: the ZADD into the membership shard first, outside). Returns
 * true in *gone when the node hash had vanished. */
static int beat_node(xfer_registry *r, uint64_t now, const char *ttl, bool *gone)
{
    const char *id = r->own.peer.node_id;
    char key[REG_KEY_MAX], set[REG_KEY_MAX], ms[24], members[REG_KEY_MAX];
    reg_key_node(key, id);
    reg_key_regions(set, id);
    reg_key_members(r, members, id);
    snprintf(ms, sizeof(ms), "%llu", (unsigned long long)now);
    const char *multi[] = {"MULTI"}, *exec[] = {"EXEC"};
    const char *hset[] = {"EVAL", beat_script, "1", key, ms};
    const char *pe_node[] = {"PEXPIRE", key, ttl}, *pe_set[] = {"PEXPIRE", set, ttl};
    const char *zadd[] = {"ZADD", members, ms, id};
    if (r->cl)
        append_argv(r, 4, zadd);
    append_argv(r, 1, multi);
    append_argv(r, 5, hset);
    append_argv(r, 3, pe_node);
    append_argv(r, 3, pe_set);
    if (!r->cl)
        append_argv(r, 4, zadd);
    append_argv(r, 1, exec);
    redisReply *rep[6];
    int rc = reg_read_replies(r, 6, rep);
    if (rc)
        return rc;
    const redisReply *ex = rep[5];
    size_t want = r->cl ? 3 : 4;
    bool ints = ex->type == REDIS_REPLY_ARRAY && ex->elements == want;
    for (size_t i = 0; ints && i < want; i++)
        ints = ex->element[i]->type == REDIS_REPLY_INTEGER;
    if (!ints)
        rc = reg_reply_check(ex, "heartbeat")
                 ? -XFER_EPROTO
                 : reg_set_err(-XFER_EPROTO, "heartbeat of %s: unexpected EXEC reply", id);
    else
        *gone =
            ex->element[0]->integer == 1 || (r->own_regions.count && ex->element[2]->integer == 0);
    for (int i = 0; i < 6; i++)
        freeReplyObject(rep[i]);
    return rc;
}

/* PEXPIRE of every own region key, pipelined; *gone when one was missing. */
static int beat_regions(xfer_registry *r, const char *ttl, bool *gone)
{
    struct hb_walk w = {r, ttl};
    size_t n = r->own_regions.count;
    strmap_foreach(&r->own_regions, append_region_pexpire, &w);
    return reg_read_pexpire_replies(r, n, gone);
}

int reg_heartbeat_locked(xfer_registry *r)
{
    uint64_t now = reg_wall_ms(); /* published */
    r->next_heartbeat_ms = reg_now_ms() + (uint64_t)r->cfg.heartbeat_ms;
    if (!r->own_valid)
        return 0;
    int rc = reg_conn_ensure(r); /* after a reconnect this already republished */
    if (rc)
        return rc;
    char ttl[16];
    snprintf(ttl, sizeof(ttl), "%d", r->cfg.ttl_ms);
    bool gone = false;
    rc = beat_node(r, now, ttl, &gone);
    if (!rc)
        rc = beat_regions(r, ttl, &gone);
    if (!rc)
        rc = reg_pools_beat_locked(r, ttl, &gone);
    if (rc)
        return rc;
    r->own.heartbeat_ms = now;
    if (!gone)
        return 0;
    xfer_warn("registry: keys of node %s were gone from %s (flushed or expired); republishing",
              r->own.peer.node_id, r->url_shown);
    return reg_republish_locked(r);
}

int xfer_registry_heartbeat(xfer_registry *r)
{
    if (!r)
        return -XFER_EINVAL;
    pthread_mutex_lock(&r->cmd_lock);
    int rc = r->own_valid ? reg_heartbeat_locked(r)
                          : reg_set_err(-XFER_ENOENT, "no node published by this handle");
    pthread_mutex_unlock(&r->cmd_lock);
    return rc;
}
