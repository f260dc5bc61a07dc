/* Registry handle: configuration, lifetime, errors, tick/poll driver, thread. */
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "reg_internal.h"

static _Thread_local char tl_err[REG_ERR_MAX];

/* Schedules (heartbeats, retries, reaps, cache ages) run on the monotonic
 * clock: a wall-clock step back longer than the TTL would otherwise hold the
 * next heartbeat until the node had expired. */
uint64_t reg_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Timestamps other nodes read (heartbeat_ms, started_ms, the reap cutoff). */
uint64_t reg_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

int reg_set_err(int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tl_err, sizeof(tl_err), fmt, ap);
    va_end(ap);
    return err;
}

const char *xfer_registry_last_error(const xfer_registry *r)
{
    (void)r;
    return tl_err;
}

void reg_key_node(char *buf, const char *node)
{
    snprintf(buf, REG_KEY_MAX, "xfer:node:{%s}", node);
}

void reg_key_regions(char *buf, const char *node)
{
    snprintf(buf, REG_KEY_MAX, "xfer:regions:{%s}", node);
}

void reg_key_region(char *buf, const char *node, const char *name)
{
    snprintf(buf, REG_KEY_MAX, "xfer:region:{%s}:%s", node, name);
}

void reg_key_shard(char *buf, unsigned shard)
{
    snprintf(buf, REG_KEY_MAX, "xfer:nodes:{s%02u}", shard);
}

void reg_key_members(const xfer_registry *r, char *buf, const char *node)
{
    if (r->cl)
        reg_key_shard(buf, rcl_crc16(node, strlen(node)) % REG_SHARDS);
    else
        snprintf(buf, REG_KEY_MAX, "%s", REG_NODES_KEY);
}

void reg_emit(xfer_registry *r, const struct xfer_registry_event *ev)
{
    pthread_mutex_lock(&r->cb_lock);
    xfer_registry_event_fn fn = r->event_fn;
    void *arg = r->event_arg;
    pthread_mutex_unlock(&r->cb_lock);
    if (fn)
        fn(ev, arg);
}

void xfer_registry_on_event(xfer_registry *r, xfer_registry_event_fn fn, void *arg)
{
    pthread_mutex_lock(&r->cb_lock);
    r->event_fn = fn;
    r->event_arg = arg;
    pthread_mutex_unlock(&r->cb_lock);
}

void xfer_registry_config_init(struct xfer_registry_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->timeout_ms = 2000;
    cfg->ttl_ms = 10000;
    cfg->reap_ms = 1000;
    cfg->backoff_min_ms = 100;
    cfg->backoff_max_ms = 2000;
    cfg->cache_max_age_ms = 1000;
}

/* Fills what the caller left at 0 and rejects nonsense. */
static int config_fix(struct xfer_registry_config *c)
{
    if (c->timeout_ms <= 0)
        c->timeout_ms = 2000;
    if (c->ttl_ms <= 0)
        c->ttl_ms = 10000;
    if (c->heartbeat_ms <= 0)
        c->heartbeat_ms = c->ttl_ms / 3 > 0 ? c->ttl_ms / 3 : 1;
    if (c->heartbeat_ms >= c->ttl_ms)
        return reg_set_err(-XFER_EINVAL, "heartbeat_ms (%d) must be below ttl_ms (%d)",
                           c->heartbeat_ms, c->ttl_ms);
    if (c->reap_ms == 0)
        c->reap_ms = 1000;
    if (c->backoff_min_ms <= 0)
        c->backoff_min_ms = 100;
    if (c->backoff_max_ms < c->backoff_min_ms)
        c->backoff_max_ms = c->backoff_min_ms > 2000 ? c->backoff_min_ms : 2000;
    if (c->cache_max_age_ms < 0)
        c->cache_max_age_ms = 0;
    return 0;
}

static void show_url(xfer_registry *r)
{
    const struct xfer_redis_url *u = &r->url;
    char *o = r->url_shown, *end = r->url_shown + sizeof(r->url_shown);
    if (u->is_unix) {
        snprintf(o, (size_t)(end - o), "unix://%s", u->host);
        return;
    }
    static const char *const scheme[] = {"redis", "redis-sentinel", "redis-cluster"};
    o += snprintf(o, (size_t)(end - o), "%s://%s%s", scheme[u->mode], u->user,
                  u->password[0] ? ":***@" : "");
    for (int i = 0; i < (u->mode == XFER_REDIS_SINGLE ? 1 : u->n_seeds) && o < end; i++) {
        const char *h = u->mode == XFER_REDIS_SINGLE ? u->host : u->seeds[i].host;
        int port = u->mode == XFER_REDIS_SINGLE ? u->port : u->seeds[i].port;
        bool v6 = strchr(h, ':') != NULL;
        o += snprintf(o, (size_t)(end - o), "%s%s%s%s:%d", i ? "," : "", v6 ? "[" : "", h,
                      v6 ? "]" : "", port);
    }
    if (o < end && u->mode == XFER_REDIS_SENTINEL)
        o += snprintf(o, (size_t)(end - o), "/%s", u->master);
    if (o < end && u->mode != XFER_REDIS_CLUSTER)
        snprintf(o, (size_t)(end - o), "/%d", u->db);
}

static int registry_init(xfer_registry *r, const struct xfer_registry_config *cfg)
{
    r->cfg = *cfg;
    int rc = config_fix(&r->cfg);
    if (rc)
        return rc;
    const char *url = cfg->url ? cfg->url : getenv("XFER_REDIS_URL");
    if (!url || !*url)
        url = "redis://127.0.0.1:6379";
    char why[256];
    if (xfer_redis_url_parse(url, &r->url, why, sizeof(why)))
        return reg_set_err(-XFER_EINVAL, "bad redis URL: %s", why);
    r->url_text = strdup(url);
    if (!r->url_text)
        return -XFER_ENOMEM;
    r->cfg.url = r->url_text;
    show_url(r);
    snprintf(r->prim_host, sizeof(r->prim_host), "%s", r->url.host);
    r->prim_port = r->url.mode == XFER_REDIS_SINGLE && !r->url.is_unix ? r->url.port : 0;
    if (r->url.mode == XFER_REDIS_CLUSTER) {
        if (!(r->cl = malloc(sizeof(*r->cl))))
            return -XFER_ENOMEM;
        rcl_init(r->cl, &r->url, r->cfg.timeout_ms);
    }
    r->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (r->wake_fd < 0)
        return reg_set_err(-XFER_EIO, "eventfd: %s", strerror(errno));
    r->backoff_ms = r->cfg.backoff_min_ms;
    r->watch_backoff_ms = r->cfg.backoff_min_ms;
    return 0;
}

xfer_registry *xfer_registry_new(const struct xfer_registry_config *cfg, int *err)
{
    struct xfer_registry_config defaults;
    if (!cfg) {
        xfer_registry_config_init(&defaults);
        cfg = &defaults;
    }
    int rc = -XFER_ENOMEM;
    xfer_registry *r = calloc(1, sizeof(*r));
    if (!r)
        goto out;
    r->wake_fd = -1;
    pthread_mutex_init(&r->cmd_lock, NULL);
    pthread_mutex_init(&r->cache_lock, NULL);
    pthread_mutex_init(&r->cb_lock, NULL);
    strmap_init(&r->own_regions);
    strmap_init(&r->own_pools);
    strmap_init(&r->cache);
    rc = registry_init(r, cfg);
    if (rc)
        goto out_free;
    r->ctx = reg_redis_connect(r, &rc);
    if (r->ctx) {
        atomic_store(&r->connected, true);
    } else if (r->cfg.start_offline && rc == -XFER_EUNAVAIL) {
        xfer_warn("registry: %s; starting offline, will retry", tl_err);
        r->next_connect_ms = reg_now_ms() + (uint64_t)reg_backoff_next(r, &r->backoff_ms);
    } else {
        goto out_free;
    }
    if (err)
        *err = 0;
    return r;
out_free:
    xfer_err("registry: %s", tl_err);
    xfer_registry_free(r);
    r = NULL;
out:
    if (err)
        *err = rc;
    return r;
}

static void free_value(void *v)
{
    free(v);
}

void xfer_registry_free(xfer_registry *r)
{
    if (!r)
        return;
    xfer_registry_thread_stop(r);
    reg_watch_stop(r);
    if (r->ctx && r->ctx != &r->cl_marker)
        redisFree(r->ctx);
    if (r->cl) {
        rcl_close(r->cl);
        free(r->cl);
    }
    rcl_batch_free(&r->batch);
    while (r->held_pos < r->held_n)
        freeReplyObject(r->held[r->held_pos++]);
    free(r->held);
    strmap_clear(&r->own_regions, free_value);
    reg_pools_clear(r);
    reg_cache_free(r);
    if (r->wake_fd >= 0)
        close(r->wake_fd);
    pthread_mutex_destroy(&r->cmd_lock);
    pthread_mutex_destroy(&r->cache_lock);
    pthread_mutex_destroy(&r->cb_lock);
    free(r->url_text);
    free(r);
}

bool xfer_registry_connected(const xfer_registry *r)
{
    return r && atomic_load(&r->connected);
}

static uint64_t min_u64(uint64_t a, uint64_t b)
{
    return a < b ? a : b;
}

/* Publisher side of tick: reconnect (and republish), heartbeat, reap. */
static void tick_publisher(xfer_registry *r, uint64_t now, uint64_t *due)
{
    pthread_mutex_lock(&r->cmd_lock);
    bool want_conn = r->own_valid || r->watch_on || r->cfg.reap_ms > 0;
    if ((!r->ctx || r->demoted) && want_conn && now >= r->next_connect_ms)
        reg_conn_ensure(r); /* failure: backoff already scheduled */
    if (!r->ctx)
        *due = min_u64(*due, r->next_connect_ms);
    if (r->ctx && r->own_valid && now >= r->next_heartbeat_ms)
        reg_heartbeat_locked(r); /* schedules the next one itself */
    if (r->own_valid)
        *due = min_u64(*due, r->next_heartbeat_ms);
    if (r->ctx && r->cfg.reap_ms > 0 && now >= r->next_reap_ms) {
        r->next_reap_ms = now + (uint64_t)r->cfg.reap_ms;
        reg_reap_locked(r);
    }
    if (r->cfg.reap_ms > 0)
        *due = min_u64(*due, r->next_reap_ms);
    pthread_mutex_unlock(&r->cmd_lock);
}

int xfer_registry_tick(xfer_registry *r)
{
    if (!r)
        return 1000;
    uint64_t now = reg_now_ms();
    uint64_t due = now + 1000;
    tick_publisher(r, now, &due);
    reg_watch_tick(r, reg_now_ms(), &due);
    now = reg_now_ms();
    return due <= now ? 1 : (int)min_u64(due - now, 1000);
}

int xfer_registry_poll(xfer_registry *r, int timeout_ms)
{
    if (!r)
        return -XFER_EINVAL;
    r->events_delivered = 0;
    int wait = xfer_registry_tick(r);
    if (timeout_ms >= 0 && timeout_ms < wait)
        wait = timeout_ms;
    struct pollfd pfd[3] = {{.fd = r->wake_fd, .events = POLLIN}};
    int have = reg_watch_pollfds(r, pfd + 1);
    int n = poll(pfd, (nfds_t)(1 + have), wait);
    if (n < 0 && errno != EINTR)
        return reg_set_err(-XFER_EIO, "poll: %s", strerror(errno));
    if (n > 0 && (pfd[0].revents & POLLIN)) {
        uint64_t v;
        ssize_t got = read(r->wake_fd, &v, sizeof(v));
        (void)got; /* only drains the wakeup */
    }
    if (n > 0 && have)
        reg_watch_handle(r, pfd + 1, have);
    return r->events_delivered;
}

static void *registry_thread(void *arg)
{
    xfer_registry *r = arg;
    while (!atomic_load(&r->thread_stop))
        xfer_registry_poll(r, 1000);
    return NULL;
}

int xfer_registry_thread_start(xfer_registry *r)
{
    if (!r)
        return -XFER_EINVAL;
    if (r->thread_on)
        return reg_set_err(-XFER_EBUSY, "registry thread already running");
    if (r->watch_on && r->attach_fn)
        return reg_set_err(-XFER_EINVAL, "watcher is attached to an event loop");
    int rc = r->watch_on ? 0 : xfer_registry_watch(r, NULL, NULL);
    if (rc)
        return rc;
    atomic_store(&r->thread_stop, false);
    if (pthread_create(&r->thread, NULL, registry_thread, r))
        return reg_set_err(-XFER_ENOMEM, "cannot start registry thread");
    r->thread_on = true;
    return 0;
}

void xfer_registry_thread_stop(xfer_registry *r)
{
    if (!r || !r->thread_on)
        return;
    atomic_store(&r->thread_stop, true);
    uint64_t one = 1;
    ssize_t n = write(r->wake_fd, &one, sizeof(one));
    (void)n; /* the 1 s poll bound ends the thread even if this failed */
    pthread_join(r->thread, NULL);
    r->thread_on = false;
}
