/* Redis Sentinel: asking the sentinels which server is the primary of the
 * monitored master (connecting there only once it says ROLE master), and a
 * +switch-master subscription on one sentinel so that a failover is acted on
 * at once instead of after the next failed command. The data stays where
 * Sentinel keeps it: a primary with replicas; this file only follows it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reg_internal.h"

/* A connection to a sentinel; NULL with why filled. */
static redisContext *dial(const xfer_registry *r, const struct xfer_redis_hostport *s, char *why,
                          size_t wl)
{
    struct timeval tv = {.tv_sec = r->cfg.timeout_ms / 1000,
                         .tv_usec = (r->cfg.timeout_ms % 1000) * 1000};
    redisContext *c = redisConnectWithTimeout(s->host, s->port, tv);
    if (c && !c->err && redisSetTimeout(c, tv) == REDIS_OK)
        return c;
    snprintf(why, wl, "sentinel %s:%d: %s", s->host, s->port, c ? c->errstr : "out of memory");
    if (c)
        redisFree(c);
    return NULL;
}

/* SENTINEL get-master-addr-by-name; a sentinel that wants AUTH (NOAUTH) gets
 * the URL's credentials. Reply to free, or NULL with why filled. */
static redisReply *ask(const xfer_registry *r, redisContext *c, const char *who, char *why,
                       size_t wl)
{
    const struct xfer_redis_url *u = &r->url;
    redisReply *rep = redisCommand(c, "SENTINEL get-master-addr-by-name %s", u->master);
    if (rep && rep->type == REDIS_REPLY_ERROR && !strncmp(rep->str, "NOAUTH", 6) &&
        u->password[0]) {
        freeReplyObject(rep);
        rep = u->user[0] ? redisCommand(c, "AUTH %s %s", u->user, u->password)
                         : redisCommand(c, "AUTH %s", u->password);
        bool ok = rep && rep->type == REDIS_REPLY_STATUS;
        if (rep)
            freeReplyObject(rep);
        rep = ok ? redisCommand(c, "SENTINEL get-master-addr-by-name %s", u->master) : NULL;
    }
    if (!rep)
        snprintf(why, wl, "%s: %s", who, c->errstr[0] ? c->errstr : "AUTH refused");
    return rep;
}

/* Address of the primary according to sentinel i: 0, or -1 with why. */
static int primary_from(const xfer_registry *r, int i, char *host, size_t hl, int *port, char *why,
                        size_t wl)
{
    const struct xfer_redis_hostport *s = &r->url.seeds[i];
    char who[XFER_REG_HOST_MAX + 24];
    snprintf(who, sizeof(who), "sentinel %s:%d", s->host, s->port);
    redisContext *c = dial(r, s, why, wl);
    redisReply *rep = c ? ask(r, c, who, why, wl) : NULL;
    int rc = -1;
    if (!rep) {
        /* why is filled */
    } else if (rep->type == REDIS_REPLY_ERROR) {
        snprintf(why, wl, "%s: %s", who, rep->str);
    } else if (rep->type == REDIS_REPLY_NIL) {
        snprintf(why, wl, "%s does not know master '%s'", who, r->url.master);
    } else if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 ||
               rep->element[0]->type != REDIS_REPLY_STRING ||
               rep->element[1]->type != REDIS_REPLY_STRING ||
               (*port = atoi(rep->element[1]->str)) <= 0 || *port > 65535 ||
               rep->element[0]->len >= hl) {
        snprintf(why, wl, "%s: unexpected answer to get-master-addr-by-name", who);
    } else {
        memcpy(host, rep->element[0]->str, rep->element[0]->len + 1);
        rc = 0;
    }
    if (rep)
        freeReplyObject(rep);
    if (c)
        redisFree(c);
    return rc;
}

/* True when the server says ROLE master (a freshly promoted replica, or a
 * sentinel answering from before a failover, would write into a replica). */
static bool is_primary(redisContext *c)
{
    redisReply *rep = redisCommand(c, "ROLE");
    bool ok = rep && rep->type == REDIS_REPLY_ARRAY && rep->elements > 0 &&
              rep->element[0]->type == REDIS_REPLY_STRING &&
              !strcmp(rep->element[0]->str, "master");
    if (rep)
        freeReplyObject(rep);
    return ok;
}

redisContext *reg_sentinel_connect(xfer_registry *r, int *err)
{
    const struct xfer_redis_url *u = &r->url;
    char why[REG_ERR_MAX] = "no sentinel";
    for (int k = 0; k < u->n_seeds; k++) {
        int i = (r->sentinel_first + k) % u->n_seeds, port = 0;
        char host[XFER_REG_HOST_MAX];
        if (primary_from(r, i, host, sizeof(host), &port, why, sizeof(why)))
            continue;
        redisContext *c = reg_redis_connect_to(r, host, port, err);
        if (!c && *err != -XFER_EUNAVAIL)
            return NULL; /* AUTH refused, bad db: asking others will not help */
        if (!c) {
            snprintf(why, sizeof(why), "%s", xfer_registry_last_error(r));
            continue;
        }
        if (!is_primary(c)) {
            snprintf(why, sizeof(why), "%s:%d, named by sentinel %s:%d, is not a primary (yet)",
                     host, port, u->seeds[i].host, u->seeds[i].port);
            redisFree(c);
            continue;
        }
        if (strcmp(host, r->prim_host) || port != r->prim_port) {
            atomic_fetch_add(&r->prim_epoch, 1); /* the events subscriber follows */
            xfer_info("registry: sentinel %s:%d names %s:%d primary of '%s'", u->seeds[i].host,
                      u->seeds[i].port, host, port, u->master);
        }
        snprintf(r->prim_host, sizeof(r->prim_host), "%s", host);
        r->prim_port = port;
        r->sentinel_first = i;
        *err = 0;
        return c;
    }
    *err = reg_set_err(-XFER_EUNAVAIL, "redis unreachable at %s: no primary for '%s': %s",
                       r->url_shown, u->master, why);
    return NULL;
}

/* ---- +switch-master subscription ------------------------------------------ */

static void sw_retry(xfer_registry *r, const char *why)
{
    struct reg_swatch *w = &r->swatch;
    bool was_up = w->subscribed;
    w->ac = NULL;
    w->subscribed = false;
    w->idx = (w->idx + 1) % r->url.n_seeds; /* try the next sentinel */
    int delay = reg_backoff_next(r, &w->backoff_ms);
    w->next_ms = reg_now_ms() + (uint64_t)delay;
    xfer_log(was_up ? XFER_LOG_WARN : XFER_LOG_DEBUG,
             "registry: +switch-master subscriber: %s; retrying in %d ms", why, delay);
}

static void sw_on_connect(const redisAsyncContext *ac, int status)
{
    xfer_registry *r = ac->data;
    if (r->swatch.ac == ac && status != REDIS_OK)
        sw_retry(r, ac->errstr[0] ? ac->errstr : "connect failed"); /* hiredis frees ac */
}

static void sw_on_disconnect(const redisAsyncContext *ac, int status)
{
    (void)status;
    xfer_registry *r = ac->data;
    if (r->swatch.ac == ac)
        sw_retry(r, ac->errstr[0] ? ac->errstr : "disconnected");
}

/* "<master> <old ip> <old port> <new ip> <new port>": when it is ours, the
 * command connection is dropped and redone at once (republishing), and the
 * events subscriber moves along with it (cmd_failures changes). */
static void sw_on_message(redisAsyncContext *ac, void *reply, void *priv)
{
    (void)priv;
    xfer_registry *r = ac->data;
    redisReply *rep = reply;
    if (!rep || r->swatch.ac != ac || rep->type != REDIS_REPLY_ARRAY || rep->elements < 3 ||
        rep->element[0]->type != REDIS_REPLY_STRING || rep->element[2]->type != REDIS_REPLY_STRING)
        return;
    if (!strcmp(rep->element[0]->str, "subscribe")) {
        r->swatch.subscribed = true;
        r->swatch.backoff_ms = r->cfg.backoff_min_ms;
        return;
    }
    char name[XFER_REDIS_MASTER_MAX], newhost[XFER_REG_HOST_MAX];
    int newport = 0;
    if (strcmp(rep->element[0]->str, "message") ||
        sscanf(rep->element[2]->str, "%127s %*s %*s %255s %d", name, newhost, &newport) != 3 ||
        strcmp(name, r->url.master))
        return;
    xfer_warn("registry: sentinel: primary of '%s' is now %s:%d; reconnecting", name, newhost,
              newport);
    pthread_mutex_lock(&r->cmd_lock);
    if (r->ctx && (strcmp(newhost, r->prim_host) || newport != r->prim_port))
        r->demoted = true;
    if (!r->ctx || r->demoted) {
        r->next_connect_ms = 0;
        r->backoff_ms = r->cfg.backoff_min_ms;
    }
    pthread_mutex_unlock(&r->cmd_lock);
}

static void sw_connect(xfer_registry *r, uint64_t now)
{
    struct reg_swatch *w = &r->swatch;
    const struct xfer_redis_hostport *s = &r->url.seeds[w->idx];
    redisAsyncContext *ac = redisAsyncConnect(s->host, s->port);
    if (!ac || ac->err) {
        w->ac = ac;
        sw_retry(r, ac ? ac->errstr : "out of memory");
        if (ac)
            redisAsyncFree(ac);
        return;
    }
    ac->data = r;
    redisAsyncSetConnectCallback(ac, sw_on_connect);
    redisAsyncSetDisconnectCallback(ac, sw_on_disconnect);
    int rc = r->attach_fn ? r->attach_fn(ac, r->attach_arg) : reg_ad_attach(&w->ad, ac);
    if (rc) {
        redisAsyncFree(ac);
        w->ac = NULL;
        sw_retry(r, "attach to the event loop failed");
        return;
    }
    w->ac = ac;
    w->deadline_ms = now + (uint64_t)r->cfg.timeout_ms;
    redisAsyncCommand(ac, sw_on_message, NULL, "SUBSCRIBE +switch-master");
}

void reg_swatch_tick(xfer_registry *r, uint64_t now, uint64_t *due)
{
    struct reg_swatch *w = &r->swatch;
    if (r->url.mode != XFER_REDIS_SENTINEL || !r->watch_on)
        return;
    if (!w->backoff_ms)
        w->backoff_ms = r->cfg.backoff_min_ms;
    if (!w->ac && now >= w->next_ms)
        sw_connect(r, now);
    if (!w->ac) {
        if (w->next_ms < *due)
            *due = w->next_ms;
    } else if (!w->subscribed && now >= w->deadline_ms) {
        redisAsyncContext *ac = w->ac;
        sw_retry(r, "no SUBSCRIBE confirmation in time");
        redisAsyncFree(ac);
    } else if (!w->subscribed && w->deadline_ms < *due) {
        *due = w->deadline_ms;
    }
}

void reg_swatch_stop(xfer_registry *r)
{
    redisAsyncContext *ac = r->swatch.ac;
    r->swatch.ac = NULL;
    r->swatch.subscribed = false;
    if (ac)
        redisAsyncFree(ac);
}
