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

/* AUTH [user] password, then SELECT db. */
static int conn_login(const xfer_registry *r, redisContext *c)
{
    const struct xfer_redis_url *u = &r->url;
    redisReply *rep = NULL;
    if (u->password[0]) {
        if (u->user[0])
            rep = redisCommand(c, "AUTH %s %s", u->user, u->password);
        else
            rep = redisCommand(c, "AUTH %s", u->password);
        if (!rep)
            return reg_set_err(-XFER_EUNAVAIL, "redis %s: AUTH: %s", r->url_shown, c->errstr);
        int bad = rep->type == REDIS_REPLY_ERROR;
        if (bad)
            reg_set_err(-XFER_EAUTH, "redis %s refused AUTH%s%s: %s", r->url_shown,
                        u->user[0] ? " as " : "", u->user, rep->str);
        freeReplyObject(rep);
        if (bad)
            return -XFER_EAUTH;
    }
    if (u->db) {
        rep = redisCommand(c, "SELECT %d", u->db);
        if (!rep)
            return reg_set_err(-XFER_EUNAVAIL, "redis %s: SELECT: %s", r->url_shown, c->errstr);
        int bad = rep->type == REDIS_REPLY_ERROR;
        if (bad)
            reg_set_err(-XFER_EINVAL, "redis %s: SELECT %d: %s", r->url_shown, u->db, rep->str);
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
                 ? conn_login(r, c)
                 : reg_set_err(-XFER_EUNAVAIL, "redis %s: %s", r->url_shown, "cannot set timeout");
    if (rc) {
        *err = rc;
        redisFree(c);
        return NULL;
    }
    *err = 0;
    return c;
}

redisContext *reg_redis_connect(xfer_registry *r, int *err)
{
    if (r->url.mode == XFER_REDIS_SENTINEL)
        return reg_sentinel_connect(r, err);
    return reg_redis_connect_to(r, r->prim_host, r->prim_port, err);
}

void reg_reply_note(xfer_registry *r, const redisReply *rep)
{
    if (r->url.mode == XFER_REDIS_SENTINEL && rep && rep->type == REDIS_REPLY_ERROR &&
        !strncmp(rep->str, "READONLY", 8))
        r->demoted = true;
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
    r->backoff_ms = r->cfg.backoff_min_ms;
    if (r->own_valid)
        r->need_republish = true;
    return r->need_republish ? reg_republish_locked(r) : 0;
}

int reg_conn_fail(xfer_registry *r, const char *what)
{
    char why[160];
    const char *e = !r->ctx             ? "connection lost"
                    : r->ctx->errstr[0] ? r->ctx->errstr
                                        : "closed to reconnect";
    if (r->ctx && r->ctx->err == REDIS_ERR_IO && strstr(e, "temporarily unavailable"))
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
    r->next_connect_ms = reg_now_ms() + (uint64_t)reg_backoff_next(r, &r->backoff_ms);
    if (r->own_valid)
        r->need_republish = true;
    return rc;
}

int reg_cmd(xfer_registry *r, redisReply **out, int argc, const char **argv, const size_t *lens)
{
    *out = NULL;
    int rc = reg_conn_ensure(r);
    if (rc)
        return rc;
    *out = redisCommandArgv(r->ctx, argc, argv, lens);
    reg_reply_note(r, *out);
    return *out ? 0 : reg_conn_fail(r, argv[0]);
}

int reg_read_replies(xfer_registry *r, size_t n, redisReply **out)
{
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
