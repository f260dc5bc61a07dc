/* Engine lifecycle: configuration, identity, transports, last error. */
#include "internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

void xfer_engine_config_init(struct xfer_engine_config *cfg)
{
    if (!cfg)
        return;
    memset(cfg, 0, sizeof(*cfg));
    cfg->listen_addr = "127.0.0.1";
    cfg->sockets_per_peer = 4;
    cfg->chunk_bytes = 1u << 20;
    cfg->progress_threads = 1;
    cfg->connect_timeout_ms = 5000;
    cfg->io_timeout_ms = 10000;
    cfg->default_deadline_ms = 60000;
    cfg->notify_queue_len = 1024;
}

/* The kernel's boot id: shared by every container of one host. */
static void read_boot_id(char *out, size_t len)
{
    snprintf(out, len, "unknown");
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (!f)
        return;
    if (fgets(out, (int)len, f))
        out[strcspn(out, "\r\n")] = '\0';
    fclose(f);
}

static uint64_t random_incarnation(void)
{
    uint64_t v = 0;
    if (getrandom(&v, sizeof(v), 0) != (ssize_t)sizeof(v))
        v = (uint64_t)xfer_mono_ns() ^ ((uint64_t)getpid() << 32);
    return v ? v : 1;
}

static unsigned allowed_transports(const struct xfer_engine_config *cfg)
{
    if (cfg->transports)
        return cfg->transports;
    const char *env = getenv("XFER_TRANSPORTS");
    unsigned mask = 0;
    if (env && *env) {
        if (xfer_transports_parse(env, &mask) == 0 && mask)
            return mask;
        xfer_warn("XFER_TRANSPORTS=\"%s\" is not a transport list; using all", env);
    }
    return XFER_TRANSPORT_ALL;
}

/* Copies cfg with defaults filled in for zero fields and strings owned by e. */
static int copy_config(xfer_engine *e, const struct xfer_engine_config *cfg)
{
    if (!cfg || !cfg->node_id || !*cfg->node_id || strlen(cfg->node_id) >= XFER_NAME_MAX)
        return -XFER_EINVAL;
    struct xfer_engine_config d;
    xfer_engine_config_init(&d);
    e->cfg = *cfg;
    snprintf(e->node_id, sizeof(e->node_id), "%s", cfg->node_id);
    snprintf(e->listen_addr, sizeof(e->listen_addr), "%s",
             cfg->listen_addr ? cfg->listen_addr : d.listen_addr);
    if (cfg->host_id)
        snprintf(e->host_id, sizeof(e->host_id), "%s", cfg->host_id);
    else
        read_boot_id(e->host_id, sizeof(e->host_id));
    e->cfg.node_id = e->node_id;
    e->cfg.listen_addr = e->listen_addr;
    e->cfg.host_id = e->host_id;
    e->cfg.secret = NULL;
    if (cfg->secret && cfg->secret_len) {
        e->secret = malloc(cfg->secret_len);
        if (!e->secret)
            return -XFER_ENOMEM;
        memcpy(e->secret, cfg->secret, cfg->secret_len);
        e->cfg.secret = e->secret;
    } else {
        e->cfg.secret_len = 0;
    }
    e->cfg.transports = allowed_transports(cfg);
#define DEFAULT_IF_ZERO(f)                                                                         \
    if (e->cfg.f <= 0)                                                                             \
    e->cfg.f = d.f
    DEFAULT_IF_ZERO(sockets_per_peer);
    DEFAULT_IF_ZERO(chunk_bytes);
    DEFAULT_IF_ZERO(progress_threads);
    DEFAULT_IF_ZERO(connect_timeout_ms);
    DEFAULT_IF_ZERO(io_timeout_ms);
    DEFAULT_IF_ZERO(default_deadline_ms);
    DEFAULT_IF_ZERO(notify_queue_len);
#undef DEFAULT_IF_ZERO
    const char *bp = getenv("XFER_BUSY_POLL_US");
    if (e->cfg.busy_poll_us <= 0)
        e->cfg.busy_poll_us = bp ? atoi(bp) : 0;
    if (e->cfg.busy_poll_us < 0 || e->cfg.busy_poll_us > 1000000)
        e->cfg.busy_poll_us = 0;
    return 0;
}

static void insert_by_preference(xfer_engine *e, struct xfer_transport *t)
{
    size_t i = e->n_transports++;
    while (i > 0 && e->transports[i - 1]->ops->preference > t->ops->preference) {
        e->transports[i] = e->transports[i - 1];
        i--;
    }
    e->transports[i] = t;
}

static int open_transports(xfer_engine *e)
{
    for (size_t i = 0; xfer_transport_table[i]; i++) {
        const struct xfer_transport_ops *ops = xfer_transport_table[i];
        char why[160] = "";
        if (!(e->cfg.transports & ops->bit) || e->n_transports == XFER_MAX_TRANSPORTS)
            continue;
        int rc = ops->probe(e, why, sizeof(why));
        if (rc < 0) {
            xfer_info("transport %s not usable: %s", ops->name, why[0] ? why : xfer_strerror(rc));
            continue;
        }
        struct xfer_transport *t = NULL;
        rc = ops->open(e, &t);
        if (rc < 0 || !t) {
            xfer_warn("transport %s failed to open: %s (%s)", ops->name, xfer_strerror(rc),
                      xfer_engine_last_error(e));
            continue;
        }
        t->ops = ops;
        t->engine = e;
        insert_by_preference(e, t);
        e->transport_mask |= ops->bit;
    }
    if (e->n_transports == 0) {
        xfer_engine_set_error(e, "no usable transport among those allowed");
        return -XFER_ENOTSUP;
    }
    return 0;
}

static void close_transports(xfer_engine *e)
{
    while (e->n_transports > 0) {
        struct xfer_transport *t = e->transports[--e->n_transports];
        t->ops->close(t);
    }
    e->transport_mask = 0;
}

xfer_engine *xfer_engine_new(const struct xfer_engine_config *cfg, int *err)
{
    int rc = -XFER_ENOMEM;
    xfer_engine *e = calloc(1, sizeof(*e));
    if (!e)
        goto out;
    pthread_mutex_init(&e->err_mu, NULL);
    region_table_init(&e->regions);
    peer_table_init(&e->peers);
    rc = copy_config(e, cfg);
    if (rc < 0)
        goto free_engine;
    e->incarnation = random_incarnation();
    rc = notify_queue_init(e);
    if (rc < 0)
        goto free_engine;
    rc = msg_thread_start(e);
    if (rc < 0)
        goto free_queue;
    rc = batch_monitor_start(e);
    if (rc < 0)
        goto stop_msgs;
    rc = open_transports(e);
    if (rc < 0)
        goto stop_monitor;
    rc = peer_repair_start(e);
    if (rc < 0) {
        close_transports(e);
        goto stop_monitor;
    }
    xfer_info("engine %s up: transports 0x%x, data port %u", e->node_id, e->transport_mask,
              e->data_port);
    if (err)
        *err = 0;
    return e;

stop_monitor:
    xfer_err("engine %s: %s", e->node_id, xfer_engine_last_error(e));
    batch_monitor_stop(e);
stop_msgs:
    msg_thread_stop(e);
free_queue:
    notify_queue_destroy(e);
free_engine:
    region_table_destroy(e);
    peer_table_destroy(e);
    free(e->secret);
    pthread_mutex_destroy(&e->err_mu);
    free(e);
    e = NULL;
out:
    if (err)
        *err = rc;
    return NULL;
}

void xfer_engine_free(xfer_engine *e)
{
    if (!e)
        return;
    peer_repair_stop(e);   /* no reconnects from here on */
    batch_monitor_stop(e); /* cancels what still runs */
    batch_idle_drain(e);
    msg_thread_stop(e);    /* fails unsent messages */
    peer_table_destroy(e); /* disconnects */
    close_transports(e);   /* joins progress threads */
    notify_queue_destroy(e);
    region_table_destroy(e);
    free(e->secret);
    pthread_mutex_destroy(&e->err_mu);
    free(e);
}

/* Workers, the registry thread and progress threads set errors at any
 * time: the text is copied out under the lock into the caller's own
 * thread-local buffer, so a reader never sees a string being rewritten. */
const char *xfer_engine_last_error(const xfer_engine *e)
{
    static _Thread_local char copy[sizeof(e->last_err)];
    if (!e)
        return "no engine";
    xfer_engine *me = (xfer_engine *)e; /* the lock, not the text, changes */
    pthread_mutex_lock(&me->err_mu);
    memcpy(copy, e->last_err, sizeof(copy));
    pthread_mutex_unlock(&me->err_mu);
    return copy;
}

void xfer_engine_set_error(xfer_engine *e, const char *fmt, ...)
{
    if (!e)
        return;
    char buf[sizeof(e->last_err)];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&e->err_mu);
    memcpy(e->last_err, buf, sizeof(buf));
    pthread_mutex_unlock(&e->err_mu);
}

const struct xfer_engine_config *xfer_engine_config_get(const xfer_engine *e)
{
    return &e->cfg;
}

uint64_t xfer_engine_incarnation(const xfer_engine *e)
{
    return e->incarnation;
}

void xfer_engine_set_data_port(xfer_engine *e, uint16_t port)
{
    __atomic_store_n(&e->data_port, port, __ATOMIC_RELEASE);
}

uint16_t xfer_engine_data_port(const xfer_engine *e)
{
    return e ? __atomic_load_n(&e->data_port, __ATOMIC_ACQUIRE) : 0;
}

void xfer_engine_describe(const xfer_engine *e, struct xfer_peer_desc *out)
{
    if (!e || !out)
        return;
    memset(out, 0, sizeof(*out));
    snprintf(out->node_id, sizeof(out->node_id), "%s", e->node_id);
    snprintf(out->addr, sizeof(out->addr), "%s", e->listen_addr);
    out->data_port = xfer_engine_data_port(e);
    snprintf(out->host_id, sizeof(out->host_id), "%s", e->host_id);
    out->transports = e->transport_mask;
    out->incarnation = e->incarnation;
    for (size_t i = 0; i < e->n_transports; i++)
        if (e->transports[i]->ops->describe)
            e->transports[i]->ops->describe(e->transports[i], out);
}
