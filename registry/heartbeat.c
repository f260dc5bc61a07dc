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

int reg_reap_locked(xfer_registry *r)
{
    char before[24];
    uint64_t now = reg_wall_ms(), ttl = (uint64_t)r->cfg.ttl_ms;
    snprintf(before, sizeof(before), "%llu", (unsigned long long)(now > ttl ? now - ttl : 0));
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
    redisAppendCommandArgv(r->ctx, argc, argv, NULL);
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

/* MULTI, HSET heartbeat_ms, PEXPIRE node, PEXPIRE set, ZADD, EXEC. Returns
 * true in *gone when the node hash had vanished (HSET added a field). */
static int beat_node(xfer_registry *r, uint64_t now, const char *ttl, bool *gone)
{
    const char *id = r->own.peer.node_id;
    char key[REG_KEY_MAX], set[REG_KEY_MAX], ms[24];
    reg_key_node(key, id);
    reg_key_regions(set, id);
    snprintf(ms, sizeof(ms), "%llu", (unsigned long long)now);
    const char *multi[] = {"MULTI"}, *exec[] = {"EXEC"};
    const char *hset[] = {"HSET", key, "heartbeat_ms", ms};
    const char *pe_node[] = {"PEXPIRE", key, ttl}, *pe_set[] = {"PEXPIRE", set, ttl};
    const char *zadd[] = {"ZADD", REG_NODES_KEY, ms, id};
    append_argv(r, 1, multi);
    append_argv(r, 4, hset);
    append_argv(r, 3, pe_node);
    append_argv(r, 3, pe_set);
    append_argv(r, 4, zadd);
    append_argv(r, 1, exec);
    redisReply *rep[6];
    int rc = reg_read_replies(r, 6, rep);
    if (rc)
        return rc;
    const redisReply *ex = rep[5];
    bool ints = ex->type == REDIS_REPLY_ARRAY && ex->elements == 4;
    for (size_t i = 0; ints && i < 4; i++)
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
    for (size_t i = 0; i < n; i++) {
        redisReply *rep;
        int rc = reg_read_replies(r, 1, &rep);
        if (rc)
            return rc;
        if (rep->type == REDIS_REPLY_INTEGER && rep->integer == 0)
            *gone = true;
        freeReplyObject(rep);
    }
    return 0;
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
