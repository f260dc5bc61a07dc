/* Pools of the own node (KV caches spanning many regions; the node layer
 * gives their fields): one hash and a set member per pool, with the node's
 * TTL, refreshed by the heartbeat, republished with everything else, and
 * "pool+"/"pool-" events. Field names and values are opaque here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reg_internal.h"

struct reg_pool {
    size_t n;  /* field/value pairs */
    char **fv; /* 2n strings */
};

static void pool_free(void *v)
{
    struct reg_pool *p = v;
    if (!p)
        return;
    for (size_t i = 0; i < 2 * p->n; i++)
        free(p->fv[i]);
    free(p->fv);
    free(p);
}

void reg_pools_clear(xfer_registry *r)
{
    strmap_clear(&r->own_pools, pool_free);
}

static void key_pools(char *buf, const char *node)
{
    snprintf(buf, REG_KEY_MAX, "xfer:pools:{%s}", node);
}

static void key_pool(char *buf, const char *node, const char *name)
{
    snprintf(buf, REG_KEY_MAX, "xfer:pool:{%s}:%s", node, name);
}

static void append_v(xfer_registry *r, int argc, const char **argv)
{
    reg_append(r, argc, argv, NULL);
}

#define POOL_GROUP 8 /* commands in append_pool */

/* MULTI, DEL, HSET, PEXPIRE, SADD, PEXPIRE set, PUBLISH pool+, EXEC. */
static int append_pool(xfer_registry *r, const char *name, const struct reg_pool *p)
{
    const char *id = r->own.peer.node_id;
    char key[REG_KEY_MAX], set[REG_KEY_MAX], ttl[16], msg[2 * XFER_NAME_MAX + 16];
    key_pool(key, id, name);
    key_pools(set, id);
    snprintf(ttl, sizeof(ttl), "%d", r->cfg.ttl_ms);
    snprintf(msg, sizeof(msg), "pool+ %s %s", id, name);
    const char **hset = malloc((2 + 2 * p->n) * sizeof(*hset));
    if (!hset)
        return reg_set_err(-XFER_ENOMEM, "out of memory publishing pool %s", name);
    hset[0] = "HSET";
    hset[1] = key;
    for (size_t i = 0; i < 2 * p->n; i++)
        hset[2 + i] = p->fv[i];
    const char *multi[] = {"MULTI"}, *exec[] = {"EXEC"}, *del[] = {"DEL", key};
    const char *pe[] = {"PEXPIRE", key, ttl}, *sadd[] = {"SADD", set, name};
    const char *pes[] = {"PEXPIRE", set, ttl}, *pub[] = {"PUBLISH", REG_EVENTS_CHAN, msg};
    append_v(r, 1, multi);
    append_v(r, 2, del);
    append_v(r, (int)(2 + 2 * p->n), hset);
    append_v(r, 3, pe);
    append_v(r, 3, sadd);
    append_v(r, 3, pes);
    append_v(r, 3, pub);
    append_v(r, 1, exec);
    free(hset);
    return 0;
}

/* Reads one MULTI/EXEC group of n replies; 0 when EXEC ran every command. */
static int read_group(xfer_registry *r, size_t n, const char *what)
{
    int first = 0;
    for (size_t i = 0; i < n; i++) {
        redisReply *rep;
        int rc = reg_read_replies(r, 1, &rep);
        if (rc)
            return rc;
        if (i == n - 1 && !first) {
            if (rep->type != REDIS_REPLY_ARRAY)
                first = reg_reply_check(rep, what) ? -XFER_EPROTO
                                                   : reg_set_err(-XFER_EPROTO, "%s aborted", what);
            for (size_t j = 0; !first && j < rep->elements; j++)
                if (reg_reply_check(rep->element[j], what))
                    first = -XFER_EPROTO;
        }
        freeReplyObject(rep);
    }
    return first;
}

struct walk {
    xfer_registry *r;
    size_t n;
    int rc;
    const char *ttl;
};

static void append_each(const char *name, void *v, void *arg)
{
    struct walk *w = arg;
    if (!w->rc && !(w->rc = append_pool(w->r, name, v)))
        w->n++;
}

int reg_pools_republish_locked(xfer_registry *r)
{
    struct walk w = {.r = r};
    strmap_foreach(&r->own_pools, append_each, &w);
    int rc = 0;
    for (size_t i = 0; i < w.n; i++) { /* every reply is read, even after an error */
        int g = read_group(r, POOL_GROUP, "publishing a pool");
        if (g == -XFER_EUNAVAIL)
            return g;
        rc = rc ? rc : g;
    }
    return w.rc ? w.rc : rc;
}

static void append_pexpire(const char *name, void *v, void *arg)
{
    (void)v;
    struct walk *w = arg;
    char key[REG_KEY_MAX];
    key_pool(key, w->r->own.peer.node_id, name);
    const char *argv[] = {"PEXPIRE", key, w->ttl};
    append_v(w->r, 3, argv);
    w->n++;
}

int reg_pools_beat_locked(xfer_registry *r, const char *ttl, bool *gone)
{
    if (!r->own_pools.count)
        return 0;
    char set[REG_KEY_MAX];
    key_pools(set, r->own.peer.node_id);
    struct walk w = {.r = r, .ttl = ttl};
    strmap_foreach(&r->own_pools, append_pexpire, &w);
    const char *pes[] = {"PEXPIRE", set, ttl};
    append_v(r, 3, pes);
    return reg_read_pexpire_replies(r, w.n + 1, gone);
}

static void append_del(const char *name, void *v, void *arg)
{
    (void)v;
    struct walk *w = arg;
    char key[REG_KEY_MAX];
    key_pool(key, w->r->own.peer.node_id, name);
    const char *argv[] = {"DEL", key};
    append_v(w->r, 2, argv);
    w->n++;
}

int reg_pools_delete_all_locked(xfer_registry *r)
{
    char set[REG_KEY_MAX];
    key_pools(set, r->own.peer.node_id);
    struct walk w = {.r = r};
    strmap_foreach(&r->own_pools, append_del, &w);
    const char *del[] = {"DEL", set};
    append_v(r, 2, del);
    return reg_read_replies(r, w.n + 1, NULL);
}

int reg_pools_purge_locked(xfer_registry *r, const char *id)
{
    char set[REG_KEY_MAX];
    key_pools(set, id);
    const char *argv[] = {"SMEMBERS", set};
    redisReply *names;
    int rc = reg_cmd(r, &names, 2, argv, NULL);
    if (rc || (rc = reg_reply_check(names, "SMEMBERS")) || names->type != REDIS_REPLY_ARRAY) {
        if (names)
            freeReplyObject(names);
        return rc;
    }
    size_t k = 0;
    for (size_t i = 0; i < names->elements; i++) {
        const redisReply *e = names->element[i];
        if (e->type != REDIS_REPLY_STRING || !xfer_registry_name_ok(e->str))
            continue;
        char key[REG_KEY_MAX];
        key_pool(key, id, e->str);
        const char *del[] = {"DEL", key};
        append_v(r, 2, del);
        k++;
    }
    const char *del[] = {"DEL", set};
    append_v(r, 2, del);
    freeReplyObject(names);
    return reg_read_replies(r, k + 1, NULL);
}

static struct reg_pool *pool_copy(const struct xfer_registry_field *f, size_t n)
{
    struct reg_pool *p = calloc(1, sizeof(*p));
    if (!p || !(p->fv = calloc(2 * n, sizeof(char *)))) {
        free(p);
        return NULL;
    }
    p->n = n;
    for (size_t i = 0; i < n; i++) {
        p->fv[2 * i] = strdup(f[i].name);
        p->fv[2 * i + 1] = strdup(f[i].value);
        if (!p->fv[2 * i] || !p->fv[2 * i + 1]) {
            pool_free(p);
            return NULL;
        }
    }
    return p;
}

int xfer_registry_publish_pool(xfer_registry *r, const char *name,
                               const struct xfer_registry_field *f, size_t n)
{
    if (!r || !name || !xfer_registry_name_ok(name) || (!f && n) || !n)
        return reg_set_err(-XFER_EINVAL, "bad pool name or no fields");
    for (size_t i = 0; i < n; i++)
        if (!f[i].name || !*f[i].name || !f[i].value)
            return reg_set_err(-XFER_EINVAL, "pool %s: field %zu has no name or value", name, i);
    struct reg_pool *p = pool_copy(f, n);
    if (!p)
        return reg_set_err(-XFER_ENOMEM, "out of memory recording pool %s", name);
    pthread_mutex_lock(&r->cmd_lock);
    int rc = 0;
    void *old = NULL;
    if (!r->own_valid) {
        rc = reg_set_err(-XFER_EINVAL, "publish the node before its pools");
        pool_free(p);
        goto out;
    }
    if (strmap_put(&r->own_pools, name, p, &old)) {
        pool_free(p);
        rc = reg_set_err(-XFER_ENOMEM, "out of memory recording pool %s", name);
        goto out;
    }
    pool_free(old);
    rc = reg_conn_ensure(r); /* a reconnect republishes it with the rest */
    if (!rc && !(rc = append_pool(r, name, p)))
        rc = read_group(r, POOL_GROUP, "publishing a pool");
out:
    pthread_mutex_unlock(&r->cmd_lock);
    return rc;
}

int xfer_registry_unpublish_pool(xfer_registry *r, const char *name)
{
    if (!r || !name)
        return -XFER_EINVAL;
    pthread_mutex_lock(&r->cmd_lock);
    struct reg_pool *p = strmap_del(&r->own_pools, name);
    int rc = p ? reg_conn_ensure(r)
               : reg_set_err(-XFER_ENOENT, "pool %s was not published by this handle", name);
    pool_free(p);
    if (!rc) {
        const char *id = r->own.peer.node_id;
        char key[REG_KEY_MAX], set[REG_KEY_MAX], msg[2 * XFER_NAME_MAX + 16];
        key_pool(key, id, name);
        key_pools(set, id);
        snprintf(msg, sizeof(msg), "pool- %s %s", id, name);
        const char *multi[] = {"MULTI"}, *exec[] = {"EXEC"}, *del[] = {"DEL", key};
        const char *srem[] = {"SREM", set, name}, *pub[] = {"PUBLISH", REG_EVENTS_CHAN, msg};
        append_v(r, 1, multi);
        append_v(r, 2, del);
        append_v(r, 3, srem);
        append_v(r, 3, pub);
        append_v(r, 1, exec);
        rc = read_group(r, 5, "removing a pool");
    }
    pthread_mutex_unlock(&r->cmd_lock);
    return rc;
}

int xfer_registry_lookup_pool(xfer_registry *r, const char *node, const char *name,
                              xfer_registry_field_fn fn, void *arg)
{
    if (!r || !node || !name || !fn)
        return -XFER_EINVAL;
    if (!xfer_registry_name_ok(node) || !xfer_registry_name_ok(name))
        return reg_set_err(-XFER_EINVAL, "bad pool name %s/%s", node, name);
    char key[REG_KEY_MAX];
    key_pool(key, node, name);
    const char *argv[] = {"HGETALL", key};
    redisReply *rep;
    pthread_mutex_lock(&r->cmd_lock);
    int rc = reg_cmd(r, &rep, 2, argv, NULL);
    pthread_mutex_unlock(&r->cmd_lock);
    if (rc)
        return rc;
    if ((rc = reg_reply_check(rep, "HGETALL")) == 0) {
        if (rep->type != REDIS_REPLY_ARRAY || rep->elements % 2)
            rc = reg_set_err(-XFER_EPROTO, "pool %s/%s: malformed reply", node, name);
        else if (!rep->elements)
            rc = reg_set_err(-XFER_ENOENT, "unknown pool %s/%s", node, name);
    }
    for (size_t i = 0; !rc && i < rep->elements; i += 2) {
        const redisReply *f = rep->element[i], *v = rep->element[i + 1];
        if (f->type == REDIS_REPLY_STRING && v->type == REDIS_REPLY_STRING)
            fn(f->str, v->str, arg);
    }
    freeReplyObject(rep);
    return rc;
}

int xfer_registry_list_pools(xfer_registry *r, const char *node, char (**names)[XFER_NAME_MAX],
                             size_t *n)
{
    if (!r || !node || !names || !n)
        return -XFER_EINVAL;
    *names = NULL;
    *n = 0;
    char set[REG_KEY_MAX];
    key_pools(set, node);
    const char *argv[] = {"SMEMBERS", set};
    redisReply *rep;
    pthread_mutex_lock(&r->cmd_lock);
    int rc = reg_cmd(r, &rep, 2, argv, NULL);
    pthread_mutex_unlock(&r->cmd_lock);
    if (rc)
        return rc;
    if ((rc = reg_reply_check(rep, "SMEMBERS")) == 0 && rep->type != REDIS_REPLY_ARRAY)
        rc = reg_set_err(-XFER_EPROTO, "pools of %s: malformed reply", node);
    if (!rc && rep->elements && !(*names = calloc(rep->elements, XFER_NAME_MAX)))
        rc = reg_set_err(-XFER_ENOMEM, "out of memory");
    for (size_t i = 0; !rc && i < rep->elements; i++) {
        const redisReply *e = rep->element[i];
        if (e->type == REDIS_REPLY_STRING && xfer_registry_name_ok(e->str))
            snprintf((*names)[(*n)++], XFER_NAME_MAX, "%s", e->str);
    }
    freeReplyObject(rep);
    if (!rc && *n > 1)
        qsort(*names, *n, XFER_NAME_MAX, (int (*)(const void *, const void *))strcmp);
    return rc;
}
