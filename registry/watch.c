/* Watcher: SUBSCRIBE xfer:events on a hiredis async context, driven either by
 * the caller's event loop (attach callback, e.g. hiredis's libevent adapter)
 * or by the small poll() adapter below (xfer_registry_poll / own thread).
 * Events invalidate the cache and are passed on to the user callback. */
#include <poll.h>
#include <stdio.h>
#include <string.h>

#include "reg_internal.h"

/* ---- internal adapter: remembers what hiredis wants to wait for ---------- */
static void ad_add_read(void *p)
{
    ((struct reg_adstate *)p)->want_read = true;
}
static void ad_del_read(void *p)
{
    ((struct reg_adstate *)p)->want_read = false;
}
static void ad_add_write(void *p)
{
    ((struct reg_adstate *)p)->want_write = true;
}
static void ad_del_write(void *p)
{
    ((struct reg_adstate *)p)->want_write = false;
}
static void ad_cleanup(void *p)
{
    ad_del_read(p);
    ad_del_write(p);
}

int reg_ad_attach(struct reg_adstate *ad, redisAsyncContext *ac)
{
    ac->ev.data = ad;
    ac->ev.addRead = ad_add_read;
    ac->ev.delRead = ad_del_read;
    ac->ev.addWrite = ad_add_write;
    ac->ev.delWrite = ad_del_write;
    ac->ev.cleanup = ad_cleanup;
    ad->want_read = ad->want_write = true; /* like the libevent adapter: wait for connect */
    return 0;
}

void reg_ad_pollfd(const redisAsyncContext *ac, const struct reg_adstate *ad, struct pollfd *p)
{
    p->fd = ac->c.fd;
    p->events = (short)((ad->want_read ? POLLIN : 0) | (ad->want_write ? POLLOUT : 0));
    p->revents = 0;
}

int reg_watch_pollfds(xfer_registry *r, struct pollfd *p)
{
    int n = 0;
    if (r->attach_fn)
        return 0;
    if (r->wac)
        reg_ad_pollfd(r->wac, &r->ad, &p[n++]);
    if (r->swatch.ac)
        reg_ad_pollfd(r->swatch.ac, &r->swatch.ad, &p[n++]);
    return n;
}

/* One context at a time, re-checking after each call: a read may end (and
 * free) the context. */
static void handle_one(redisAsyncContext **slot, const struct pollfd *p)
{
    redisAsyncContext *ac = *slot;
    if (!ac || ac->c.fd != p->fd)
        return;
    if (p->revents & (POLLIN | POLLHUP | POLLERR))
        redisAsyncHandleRead(ac);
    if (*slot == ac && (p->revents & POLLOUT))
        redisAsyncHandleWrite(ac);
}

void reg_watch_handle(xfer_registry *r, const struct pollfd *p, int n)
{
    for (int i = 0; i < n; i++) {
        handle_one(&r->wac, &p[i]);
        handle_one(&r->swatch.ac, &p[i]);
    }
}

/* ---- connection life ------------------------------------------------------ */
static void schedule_retry(xfer_registry *r, const char *why)
{
    bool was_up = atomic_load(&r->subscribed); /* warn once per outage */
    r->wac = NULL;
    r->wac_connected = false;
    atomic_store(&r->subscribed, false);
    int delay = reg_backoff_next(r, &r->watch_backoff_ms);
    r->watch_next_ms = reg_now_ms() + (uint64_t)delay;
    xfer_log(was_up ? XFER_LOG_WARN : XFER_LOG_DEBUG,
             "registry: event subscriber on %s: %s; retrying in %d ms", r->url_shown, why, delay);
}

static void on_connect(const redisAsyncContext *ac, int status)
{
    xfer_registry *r = ac->data;
    if (r->wac != ac)
        return;
    if (status == REDIS_OK)
        r->wac_connected = true;
    else
        schedule_retry(r, ac->errstr[0] ? ac->errstr : "connect failed"); /* hiredis frees ac */
}

static void on_disconnect(const redisAsyncContext *ac, int status)
{
    (void)status;
    xfer_registry *r = ac->data;
    if (r->wac == ac) /* not our own stop/timeout: hiredis frees ac after this */
        schedule_retry(r, ac->errstr[0] ? ac->errstr : "disconnected");
}

static void on_auth(redisAsyncContext *ac, void *reply, void *priv)
{
    (void)priv;
    redisReply *rep = reply;
    if (rep && rep->type == REDIS_REPLY_ERROR) {
        xfer_err("registry: event subscriber AUTH refused: %s", rep->str);
        redisAsyncDisconnect(ac);
    }
}

static void emit(xfer_registry *r, enum xfer_registry_event_type t, const char *node,
                 const char *region)
{
    struct xfer_registry_event ev = {.type = t, .node = node, .region = region};
    r->events_delivered++;
    reg_emit(r, &ev);
}

/* Splits msg into at most 3 space-separated tokens, each shorter than
 * XFER_NAME_MAX; returns the count, or -1 when malformed. */
static int split_event(const char *msg, size_t len, char tok[3][XFER_NAME_MAX])
{
    int n = 0;
    size_t i = 0;
    while (i < len) {
        if (msg[i] == ' ') {
            i++;
            continue;
        }
        size_t j = i;
        while (j < len && msg[j] != ' ')
            j++;
        if (n == 3 || j - i >= XFER_NAME_MAX)
            return -1;
        memcpy(tok[n], msg + i, j - i);
        tok[n++][j - i] = '\0';
        i = j;
    }
    return n;
}

/* "join n" | "leave n" | "region+ n name" | "region- n name" */
static void handle_payload(xfer_registry *r, const char *msg, size_t len)
{
    char tok[3][XFER_NAME_MAX];
    int n = split_event(msg, len, tok);
    const char *verb = tok[0], *node = tok[1], *name = tok[2];
    if (n < 2 || !xfer_registry_name_ok(node))
        goto bad;
    bool pool = !strcmp(verb, "pool+") || !strcmp(verb, "pool-");
    bool region = pool || !strcmp(verb, "region+") || !strcmp(verb, "region-");
    if (region != (n == 3) || (region && !xfer_registry_name_ok(name)))
        goto bad;
    if (!strcmp(verb, "join")) {
        bool cached;
        struct xfer_node_desc d;
        reg_cache_mark_node_stale(r, node, &cached);
        if (cached) /* a re-join may be a restart: compare incarnations now */
            xfer_registry_fetch_node(r, node, &d);
        emit(r, XFER_REG_EV_JOIN, node, NULL);
    } else if (!strcmp(verb, "leave")) {
        reg_cache_drop_node(r, node);
        emit(r, XFER_REG_EV_LEAVE, node, NULL);
    } else if (pool) {
        emit(r, verb[4] == '+' ? XFER_REG_EV_POOL_ADD : XFER_REG_EV_POOL_DEL, node, name);
    } else if (region) {
        reg_cache_drop_region(r, node, name);
        emit(r, verb[6] == '+' ? XFER_REG_EV_REGION_ADD : XFER_REG_EV_REGION_DEL, node, name);
    } else {
        goto bad;
    }
    return;
bad:
    xfer_warn("registry: ignoring malformed event '%.*s'", (int)(len > 200 ? 200 : len), msg);
}

static void on_message(redisAsyncContext *ac, void *reply, void *priv)
{
    (void)priv;
    xfer_registry *r = ac->data;
    redisReply *rep = reply;
    if (!rep || r->wac != ac || rep->type != REDIS_REPLY_ARRAY || rep->elements < 3 ||
        rep->element[0]->type != REDIS_REPLY_STRING)
        return;
    const char *kind = rep->element[0]->str;
    if (!strcmp(kind, "subscribe")) {
        atomic_store(&r->subscribed, true);
        r->watch_fail_mark = atomic_load(&r->cmd_failures);
        r->watch_backoff_ms = r->cfg.backoff_min_ms;
        xfer_info("registry: watching %s on %s", REG_EVENTS_CHAN, r->url_shown);
        reg_cache_mark_all_stale(r);      /* events may have been missed meanwhile */
        pthread_mutex_lock(&r->cmd_lock); /* Redis is back: no need to wait out */
        if (!r->ctx) {                    /* the command connection's backoff */
            r->next_connect_ms = 0;
            r->backoff_ms = r->cfg.backoff_min_ms;
        }
        pthread_mutex_unlock(&r->cmd_lock);
        emit(r, XFER_REG_EV_RESYNC, "", NULL);
    } else if (!strcmp(kind, "message") && rep->element[2]->type == REDIS_REPLY_STRING) {
        handle_payload(r, rep->element[2]->str, rep->element[2]->len);
    }
}

static void watch_connect(xfer_registry *r, uint64_t now)
{
    const struct xfer_redis_url *u = &r->url;
    char host[XFER_REG_HOST_MAX];
    pthread_mutex_lock(&r->cmd_lock); /* sentinel mode: the primary in use */
    r->watch_epoch = atomic_load(&r->prim_epoch);
    int port = r->prim_port;
    snprintf(host, sizeof(host), "%s", r->prim_host);
    if (r->cl && r->cl->n_nodes) { /* PUBLISH reaches every node of a cluster: */
        const struct rcl_node *n = &r->cl->nodes[r->watch_node++ % (unsigned)r->cl->n_nodes];
        snprintf(host, sizeof(host), "%s", n->host); /* any will do, in turn */
        port = n->port;
    }
    pthread_mutex_unlock(&r->cmd_lock);
    if (u->mode != XFER_REDIS_SINGLE && !port) {
        r->wac = NULL;
        schedule_retry(r, "no primary known yet");
        return;
    }
    redisAsyncContext *ac = port ? redisAsyncConnect(host, port) : redisAsyncConnectUnix(host);
    if (!ac || ac->err) {
        r->wac = ac; /* for the message only */
        schedule_retry(r, ac ? ac->errstr : "out of memory");
        if (ac)
            redisAsyncFree(ac);
        return;
    }
    ac->data = r;
    redisAsyncSetConnectCallback(ac, on_connect);
    redisAsyncSetDisconnectCallback(ac, on_disconnect);
    int rc = r->attach_fn ? r->attach_fn(ac, r->attach_arg) : reg_ad_attach(&r->ad, ac);
    if (rc) {
        redisAsyncFree(ac);
        schedule_retry(r, "attach to the event loop failed");
        return;
    }
    r->wac = ac;
    r->wac_connected = false;
    r->watch_deadline_ms = now + (uint64_t)r->cfg.timeout_ms;
    if (u->password[0] && u->user[0])
        redisAsyncCommand(ac, on_auth, NULL, "AUTH %s %s", u->user, u->password);
    else if (u->password[0])
        redisAsyncCommand(ac, on_auth, NULL, "AUTH %s", u->password);
    redisAsyncCommand(ac, on_message, NULL, "SUBSCRIBE %s", REG_EVENTS_CHAN);
}

void reg_watch_tick(xfer_registry *r, uint64_t now, uint64_t *due)
{
    if (!r->watch_on)
        return;
    reg_swatch_tick(r, now, due);
    if (!r->wac && r->watch_epoch != atomic_load(&r->prim_epoch))
        r->watch_next_ms = now; /* a new primary is known: no need to back off */
    if (!r->wac && now >= r->watch_next_ms)
        watch_connect(r, now);
    if (!r->wac) {
        if (r->watch_next_ms < *due)
            *due = r->watch_next_ms;
        return;
    }
    if (atomic_load(&r->subscribed)) {
        /* A subscriber sees no traffic from a frozen or cut-off Redis, but the
         * command connection (reaping every second) times out: then the
         * subscriber is not trusted either and is set up again, which
         * resyncs the cache once Redis answers. */
        if (atomic_load(&r->cmd_failures) != r->watch_fail_mark ||
            r->watch_epoch != atomic_load(&r->prim_epoch)) {
            redisAsyncContext *ac = r->wac;
            xfer_warn("registry: command connection to %s failed; resubscribing", r->url_shown);
            schedule_retry(r, "command connection failed");
            redisAsyncFree(ac);
        }
        return;
    }
    if (now >= r->watch_deadline_ms) { /* connect/SUBSCRIBE hangs: start over */
        redisAsyncContext *ac = r->wac;
        schedule_retry(r, "no SUBSCRIBE confirmation in time");
        redisAsyncFree(ac);
    } else if (r->watch_deadline_ms < *due) {
        *due = r->watch_deadline_ms;
    }
}

void reg_watch_stop(xfer_registry *r)
{
    r->watch_on = false;
    reg_swatch_stop(r);
    redisAsyncContext *ac = r->wac;
    r->wac = NULL;
    atomic_store(&r->subscribed, false);
    if (ac)
        redisAsyncFree(ac);
}

int xfer_registry_watch(xfer_registry *r, xfer_registry_attach_fn attach, void *arg)
{
    if (!r)
        return -XFER_EINVAL;
    if (r->watch_on)
        return reg_set_err(-XFER_EBUSY, "already watching");
    r->attach_fn = attach;
    r->attach_arg = arg;
    r->watch_on = true;
    r->watch_next_ms = 0;
    watch_connect(r, reg_now_ms());
    return 0;
}

bool xfer_registry_watching(const xfer_registry *r)
{
    return r && atomic_load(&r->subscribed);
}
