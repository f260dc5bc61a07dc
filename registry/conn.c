/* The blocking command connection: connect with timeouts, AUTH/SELECT,
 * failure handling with bounded exponential backoff, and republish on
 * reconnect. All functions here run with cmd_lock held. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reg_internal.h"

static struct timeval ms_to_tv(int ms)
{
    struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
    return tv;
}

int reg_reply_check(const redisReply *rep, const char *what)
{
    if (rep && rep->type == REDIS_REPLY_ERROR)
        return reg_set_err(-XFER_EPROTO, "redis refused %s: %s", what, rep->str);
    return 0;
}

int reg_redis_login(const struct xfer_redis_url *u, const char *who, redisContext *c)
{
    redisReply *rep = NULL;
    if (u->password[0]) {
        if (u->user[0])
            rep = redisCommand(c, "AUTH %s %s", u->user, u->password);
        else
            rep = redisCommand(c, "AUTH %s", u->password);
        if (!rep)
            return reg_set_err(-XFER_EUNAVAIL, "redis %s: AUTH: %s", who, c->errstr);
        int bad = rep->type == REDIS_REPLY_ERROR;
        if (bad)
            reg_set_err(-XFER_EAUTH, "redis %s refused AUTH%s%s: %s", who, u->user[0] ? " as " : "",
                        u->user, rep->str);
        freeReplyObject(rep);
        if (bad)
            return -XFER_EAUTH;
    }
    if (u->db) {
        rep = redisCommand(c, "SELECT %d", u->db);
        if (!rep)
            return reg_set_err(-XFER_EUNAVAIL, "redis %s: SELECT: %s", who, c->errstr);
        int bad = rep->type == REDIS_REPLY_ERROR;
        if (bad)
            reg_set_err(-XFER_EINVAL, "redis %s: SELECT %d: %s", who, u->db, rep->str);
        freeReplyObject(rep);
        if (bad)
            return -XFER_EINVAL;
    }
    return 0;
}

redisContext *reg_redis_connect_to(const xfer_registry *r, const char *host, int port, int *err)
{
    struct timeval tv = ms_to_tv(r->cfg.timeout_ms);
    redisContext *c =
        port ? redisConnectWithTimeout(host, port, tv) : redisConnectUnixWithTimeout(host, tv);
    if (!c) {
        *err = reg_set_err(-XFER_ENOMEM, "out of memory connecting to redis");
        return NULL;
    }
    if (c->err) {
        *err = reg_set_err(-XFER_EUNAVAIL, "redis unreachable at %s: %s", r->url_shown, c->errstr);
        redisFree(c);
        return NULL;
    }
    int rc = redisSetTimeout(c, tv) == REDIS_OK
                 ? reg_redis_login(&r->url, r->url_shown, c)
                 : reg_set_err(-XFER_EUNAVAIL, "redis %s: %s", r->url_shown, "cannot set timeout");
    if (rc) {
        *err = rc;
        redisFree(c);
        return NULL;
    }
    *err = 0;
    return c;
}

/* Cluster mode: loads the slot map; the events subscriber will use the
 * node that answered. */
static redisContext *cluster_connect(xfer_registry *r, int *err)
{
    if ((*err = rcl_refresh(r->cl)))
        return reg_set_err(*err, "redis cluster %s: %s", r->url_shown, r->cl->err), NULL;
    for (int i = 0; i < r->cl->n_nodes; i++) {
        if (!r->cl->nodes[i].ctx)
            continue;
        snprintf(r->prim_host, sizeof(r->prim_host), "%s", r->cl->nodes[i].host);
        r->prim_port = r->cl->nodes[i].port;
        break;
    }
    return &r->cl_marker;
}

redisContext *reg_redis_connect(xfer_registry *r, int *err)
{
    if (r->url.mode == XFER_REDIS_SENTINEL)
        return reg_sentinel_connect(r, err);
    if (r->cl)
        return cluster_connect(r, err);
    return reg_redis_connect_to(r, r->prim_host, r->prim_port, err);
}

void reg_reply_note(xfer_registry *r, const redisReply *rep)
{
    if (r->url.mode == XFER_REDIS_SENTINEL && rep && rep->type == REDIS_REPLY_ERROR &&
        !strncmp(rep->str, "READONLY", 8))
        r->demoted = true;
}

bool reg_outage_recent(xfer_registry *r)
{
    uint64_t t = atomic_load(&r->outage_ms);
    return t && reg_now_ms() - t < (uint64_t)r->cfg.ttl_ms + (uint64_t)r->cfg.backoff_max_ms;
}

int reg_backoff_next(const xfer_registry *r, int *backoff_ms)
{
    int b = *backoff_ms;
    int delay = b - (int)(random() % (b / 4 + 1)); /* jitter: nodes do not retry in step */
    *backoff_ms = b * 2 > r->cfg.backoff_max_ms ? r->cfg.backoff_max_ms : b * 2;
    return delay > 0 ? delay : 1;
}

int reg_conn_ensure(xfer_registry *r)
{
    if (r->ctx && r->demoted) { /* sentinel mode: ask again where the primary is */
        reg_conn_fail(r, "primary changed (READONLY reply or +switch-master)");
        r->next_connect_ms = 0;
        r->backoff_ms = r->cfg.backoff_min_ms;
    }
    if (r->ctx)
        return 0;
    uint64_t now = reg_now_ms();
    if (now < r->next_connect_ms)
        return reg_set_err(-XFER_EUNAVAIL, "redis unreachable at %s (next retry in %llu ms)",
                           r->url_shown, (unsigned long long)(r->next_connect_ms - now));
    int rc;
    r->ctx = reg_redis_connect(r, &rc);
    if (!r->ctx) {
        r->next_connect_ms = now + (uint64_t)reg_backoff_next(r, &r->backoff_ms);
        return rc;
    }
    if (r->url.mode == XFER_REDIS_SINGLE)
        xfer_info("registry: connected to %s", r->url_shown);
    else
        xfer_info("registry: connected to %s:%d (%s)", r->prim_host, r->prim_port, r->url_shown);
    atomic_store(&r->connected, true);
    if (atomic_load(&r->outage_ms)) /* the owners' rewrites are still to come */
        atomic_store(&r->outage_ms, reg_now_ms());
    r->backoff_ms = r->cfg.backoff_min_ms;
    if (r->own_valid)
        r->need_republish = true;
    return r->need_republish ? reg_republish_locked(r) : 0;
}

/* Cluster mode: replies and commands of the failed batch are dropped. */
static void cluster_forget(xfer_registry *r)
{
    while (r->held_pos < r->held_n)
        freeReplyObject(r->held[r->held_pos++]);
    r->held_n = r->held_pos = 0;
    rcl_batch_clear(&r->batch);
}

int reg_conn_fail(xfer_registry *r, const char *what)
{
    char why[RCL_ERR_MAX];
    if (r->cl) {
        cluster_forget(r);
        snprintf(why, sizeof(why), "%s", r->cl->err);
        r->ctx = NULL; /* the router keeps (or dropped) its own connections */
    }
    const char *e = !r->ctx             ? "connection lost"
                    : r->ctx->errstr[0] ? r->ctx->errstr
                                        : "closed to reconnect";
    if (r->cl)
        ; /* why is the router's reason */
    else if (r->ctx && r->ctx->err == REDIS_ERR_IO && strstr(e, "temporarily unavailable"))
        snprintf(why, sizeof(why), "no reply within %d ms", r->cfg.timeout_ms); /* SO_RCVTIMEO */
    else
        snprintf(why, sizeof(why), "%s", e);
    int rc =
        reg_set_err(-XFER_EUNAVAIL, "redis unreachable at %s: %s: %s", r->url_shown, what, why);
    xfer_warn("registry: %s", xfer_registry_last_error(r));
    if (r->ctx)
        redisFree(r->ctx);
    r->ctx = NULL;
    r->demoted = false;
    atomic_store(&r->connected, false);
    atomic_fetch_add(&r->cmd_failures, 1);
    atomic_store(&r->outage_ms, reg_now_ms());
    r->next_connect_ms = reg_now_ms() + (uint64_t)reg_backoff_next(r, &r->backoff_ms);
    if (r->own_valid)
        r->need_republish = true;
    return rc;
}

void reg_append(xfer_registry *r, int argc, const char **argv, const size_t *lens)
{
    if (r->cl)
        rcl_batch_add(&r->batch, argc, argv, lens);
    else
        redisAppendCommandArgv(r->ctx, argc, argv, lens);
}

/* Cluster mode: sends the batch, keeps its replies in r->held. */
static int cluster_flush(xfer_registry *r)
{
    while (r->held_pos < r->held_n) /* left unread by a failed caller */
        freeReplyObject(r->held[r->held_pos++]);
    size_t n = r->batch.n;
    if (!n)
        return reg_set_err(-XFER_EPROTO, "registry: reply wanted but nothing was sent");
    if (n > r->held_cap) {
        redisReply **h = realloc(r->held, n * sizeof(*h));
        if (!h) {
            rcl_batch_clear(&r->batch);
            return reg_set_err(-XFER_ENOMEM, "out of memory sending to the cluster");
        }
        r->held = h;
        r->held_cap = n;
    }
    int rc = rcl_batch_run(r->cl, &r->batch, r->held);
    rcl_batch_clear(&r->batch);
    if (rc == -XFER_EUNAVAIL)
        return reg_conn_fail(r, "cluster");
    if (rc)
        return reg_set_err(rc, "redis cluster %s: %s", r->url_shown, r->cl->err);
    r->held_n = n;
    r->held_pos = 0;
    return 0;
}

static int cluster_read(xfer_registry *r, size_t n, redisReply **out)
{
    for (size_t i = 0; i < n; i++) {
        int rc = r->held_pos < r->held_n ? 0 : cluster_flush(r);
        if (rc) {
            for (size_t j = 0; out && j < i; j++)
                freeReplyObject(out[j]);
            return rc;
        }
        redisReply *rep = r->held[r->held_pos++];
        if (out)
            out[i] = rep;
        else
            freeReplyObject(rep);
    }
    return 0;
}

int reg_cmd(xfer_registry *r, redisReply **out, int argc, const char **argv, const size_t *lens)
{
    *out = NULL;
    int rc = reg_conn_ensure(r);
    if (rc)
        return rc;
    if (r->cl) {
        reg_append(r, argc, argv, lens);
        return cluster_read(r, 1, out);
    }
    *out = redisCommandArgv(r->ctx, argc, argv, lens);
    reg_reply_note(r, *out);
    return *out ? 0 : reg_conn_fail(r, argv[0]);
}

int reg_read_replies(xfer_registry *r, size_t n, redisReply **out)
{
    if (r->cl)
        return cluster_read(r, n, out);
    for (size_t i = 0; i < n; i++) {
        void *rep = NULL;
        if (!r->ctx || redisGetReply(r->ctx, &rep) != REDIS_OK || !rep) {
            if (out)
                for (size_t j = 0; j < i; j++)
                    freeReplyObject(out[j]);
            return reg_conn_fail(r, "pipeline");
        }
        reg_reply_note(r, rep);
        if (out)
            out[i] = rep;
        else
            freeReplyObject(rep);
    }
    return 0;
}

int reg_read_pexpire_replies(xfer_registry *r, size_t n, bool *gone)
{
    for (size_t i = 0; i < n; i++) {
        redisReply *rep;
        int rc = reg_read_replies(r, 1, &rep);
        if (rc)
            return rc;
        if (rep->type == REDIS_REPLY_INTEGER && rep->integer == 0)
            *gone = true; /* PEXPIRE answers 0 for a key that does not exist */
        freeReplyObject(rep);
    }
    return 0;
}
