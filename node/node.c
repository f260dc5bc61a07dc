/* The node: engine + registry publisher/reader/watcher on its own thread,
 * and regions published as they are registered. */
#include "xfer_io.h" /* xfer_cond_init_mono */
#include "node_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static _Thread_local char tl_err[NODE_ERR_MAX];

int node_err(int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tl_err, sizeof(tl_err), fmt, ap);
    va_end(ap);
    return rc;
}

char *node_err_buf(void)
{
    return tl_err;
}

const char *xfer_node_last_error(const xfer_node *n)
{
    (void)n;
    return tl_err;
}

void xfer_node_config_init(struct xfer_node_config *c)
{
    memset(c, 0, sizeof(*c));
    c->listen_addr = "127.0.0.1";
    c->ttl_ms = 10000;
    c->registry_timeout_ms = 2000;
    c->connect_timeout_ms = 5000;
    c->io_timeout_ms = 10000;
    c->default_deadline_ms = 60000;
    c->offline_ok = true;
}

static int start_engine(xfer_node *n, const struct xfer_node_config *c)
{
    struct xfer_engine_config ec;
    xfer_engine_config_init(&ec);
    ec.node_id = c->node_id;
    ec.listen_addr = c->listen_addr && *c->listen_addr ? c->listen_addr : "127.0.0.1";
    ec.data_port = c->data_port;
    ec.secret = c->secret;
    ec.secret_len = c->secret ? c->secret_len : 0;
    if (c->transports && *c->transports && xfer_transports_parse(c->transports, &ec.transports))
        return node_err(-XFER_EINVAL, "bad transports '%s'", c->transports);
    if (c->require && *c->require && xfer_transports_parse(c->require, &n->require))
        return node_err(-XFER_EINVAL, "bad required transports '%s'", c->require);
    if (c->connect_timeout_ms > 0)
        ec.connect_timeout_ms = c->connect_timeout_ms;
    if (c->io_timeout_ms > 0)
        ec.io_timeout_ms = c->io_timeout_ms;
    if (c->sockets_per_peer > 0)
        ec.sockets_per_peer = c->sockets_per_peer;
    if (c->progress_threads > 0)
        ec.progress_threads = c->progress_threads;
    if (c->chunk_bytes > 0)
        ec.chunk_bytes = c->chunk_bytes;
    if (c->busy_poll_us > 0)
        ec.busy_poll_us = c->busy_poll_us;
    if (c->default_deadline_ms > 0)
        ec.default_deadline_ms = c->default_deadline_ms;
    n->connect_timeout_ms = ec.connect_timeout_ms;
    n->default_deadline_ms = ec.default_deadline_ms;
    int err = 0;
    n->eng = xfer_engine_new(&ec, &err);
    if (!n->eng)
        return node_err(err, "engine: %s", xfer_strerror(err));
    struct xfer_peer_desc self;
    xfer_engine_describe(n->eng, &self);
    n->incarnation = self.incarnation;
    return 0;
}

static int start_registry(xfer_node *n, const struct xfer_node_config *c)
{
    struct xfer_registry_config rc_cfg;
    xfer_registry_config_init(&rc_cfg);
    rc_cfg.url = c->redis_url;
    if (c->ttl_ms > 0)
        rc_cfg.ttl_ms = c->ttl_ms;
    if (c->heartbeat_ms > 0)
        rc_cfg.heartbeat_ms = c->heartbeat_ms;
    if (c->registry_timeout_ms > 0)
        rc_cfg.timeout_ms = c->registry_timeout_ms;
    rc_cfg.start_offline = c->offline_ok;
    int err = 0;
    n->reg = xfer_registry_new(&rc_cfg, &err);
    if (!n->reg)
        return node_err(err, "registry %s: %s", c->redis_url ? c->redis_url : "(default)",
                        xfer_strerror(err));
    struct xfer_node_desc nd;
    memset(&nd, 0, sizeof(nd));
    xfer_engine_describe(n->eng, &nd.peer);
    snprintf(nd.peer.addr, sizeof(nd.peer.addr), "%s", n->advertise);
    gethostname(nd.host, sizeof(nd.host) - 1);
    if (xfer_gpus_describe(nd.gpus, sizeof(nd.gpus)) < 0) { /* too many to list */
        xfer_warn("GPU list does not fit the node's gpus field; published empty");
        nd.gpus[0] = '\0';
    }
    nd.ctrl_port = c->ctrl_port;
    nd.pid = (uint32_t)getpid();
    snprintf(nd.version, sizeof(nd.version), "%s", XFER_VERSION_STRING);
    int rc = xfer_registry_publish_node(n->reg, &nd);
    if (rc == -XFER_EUNAVAIL && c->offline_ok)
        xfer_warn("registry unreachable (%s): will publish when it is back",
                  xfer_registry_last_error(n->reg));
    else if (rc)
        return node_err(rc, "publishing node: %s", xfer_registry_last_error(n->reg));
    xfer_registry_on_event(n->reg, node_on_event, n);
    rc = xfer_registry_thread_start(n->reg);
    return rc ? node_err(rc, "registry thread: %s", xfer_strerror(rc)) : 0;
}

xfer_node *xfer_node_new(const struct xfer_node_config *c, int *err)
{
    int rc = -XFER_EINVAL;
    xfer_node *n = NULL;
    if (!c || !c->node_id || !xfer_registry_name_ok(c->node_id) || strchr(c->node_id, '/')) {
        node_err(rc, "bad node id '%s'", c && c->node_id ? c->node_id : "");
        goto fail;
    }
    if (!(n = calloc(1, sizeof(*n)))) {
        rc = node_err(-XFER_ENOMEM, "out of memory");
        goto fail;
    }
    snprintf(n->node_id, sizeof(n->node_id), "%s", c->node_id);
    const char *adv = c->advertise && *c->advertise ? c->advertise : c->listen_addr;
    snprintf(n->advertise, sizeof(n->advertise), "%s", adv && *adv ? adv : "127.0.0.1");
    n->on_event = c->on_event;
    n->event_arg = c->event_arg;
    pthread_mutex_init(&n->peer_lock, NULL);
    xfer_cond_init_mono(&n->connected); /* waits are intervals: immune to wall-clock steps */
    pthread_mutex_init(&n->pool_lock, NULL);
    if ((rc = start_engine(n, c)) || (rc = start_registry(n, c)))
        goto fail;
    return n;
fail:
    if (rc)
        xfer_err("node %s: %s", c && c->node_id ? c->node_id : "?", tl_err);
    if (err)
        *err = rc;
    xfer_node_free(n);
    return NULL;
}

void xfer_node_free(xfer_node *n)
{
    if (!n)
        return;
    if (n->reg) {
        xfer_registry_thread_stop(n->reg); /* no event callback after this */
        int rc = xfer_registry_unpublish_node(n->reg);
        if (rc && rc != -XFER_ENOENT)
            xfer_warn("removing node %s from the registry: %s (its keys expire by TTL)", n->node_id,
                      xfer_registry_last_error(n->reg));
    }
    node_pools_free(n);
    xfer_engine_free(n->eng);
    xfer_registry_free(n->reg);
    node_peers_free(n);
    pthread_mutex_destroy(&n->peer_lock);
    pthread_cond_destroy(&n->connected);
    pthread_mutex_destroy(&n->pool_lock);
    free(n);
}

const char *xfer_node_id(const xfer_node *n)
{
    return n->node_id;
}

uint64_t xfer_node_incarnation(const xfer_node *n)
{
    struct xfer_node_desc nd;
    if (n->reg && xfer_registry_own_node(n->reg, &nd) == 0)
        return nd.peer.incarnation;
    return n->incarnation;
}

xfer_engine *xfer_node_engine(xfer_node *n)
{
    return n ? n->eng : NULL;
}

xfer_registry *xfer_node_registry(xfer_node *n)
{
    return n ? n->reg : NULL;
}

/* ---- regions ---------------------------------------------------------------- */

static bool is_private(const char *name)
{
    return name[0] == '_';
}

static int check_name(const char *name)
{
    if (!name || !xfer_registry_name_ok(name) || strchr(name, '/') || strpbrk(name, "+#,"))
        return node_err(-XFER_EINVAL, "bad region name '%s' (printable, no space, / + # , { })",
                        name ? name : "");
    return 0;
}

int xfer_node_region_publish(xfer_node *n, xfer_region *r)
{
    if (!n || !r)
        return node_err(-XFER_EINVAL, "no node or region");
    struct xfer_region_desc rd;
    xfer_region_describe(r, &rd);
    if (is_private(rd.name))
        return 0;
    int rc = xfer_registry_publish_region(n->reg, &rd);
    if (rc == -XFER_EUNAVAIL)
        return 0; /* recorded: published on reconnect */
    return rc ? node_err(rc, "publishing region %s: %s", rd.name, xfer_registry_last_error(n->reg))
              : 0;
}

static int registered(xfer_node *n, int rc, xfer_region *r, xfer_region **out)
{
    if (rc)
        return node_err(rc, "%s", xfer_engine_last_error(n->eng));
    rc = xfer_node_region_publish(n, r);
    if (rc) {
        xfer_region_deregister(n->eng, r);
        return rc;
    }
    if (out)
        *out = r;
    return 0;
}

int xfer_node_region_register(xfer_node *n, const char *name, void *ptr, size_t len,
                              enum xfer_mem_kind kind, int device, unsigned access,
                              xfer_region **out)
{
    int rc = n ? check_name(name) : -XFER_EINVAL;
    if (rc)
        return rc;
    xfer_region *r = NULL;
    rc = xfer_region_register(n->eng, name, ptr, len, kind, device, access, &r);
    return registered(n, rc, r, out);
}

int xfer_node_region_alloc(xfer_node *n, const char *name, size_t len, unsigned access,
                           xfer_region **out)
{
    int rc = n ? check_name(name) : -XFER_EINVAL;
    if (rc)
        return rc;
    xfer_region *r = NULL;
    rc = xfer_region_alloc(n->eng, name, len, access, &r);
    return registered(n, rc, r, out);
}

int xfer_node_region_detach(xfer_node *n, xfer_region *r)
{
    if (!n || !r)
        return node_err(-XFER_EINVAL, "no node or region");
    char name[XFER_NAME_MAX];
    struct xfer_region_desc rd;
    xfer_region_describe(r, &rd);
    snprintf(name, sizeof(name), "%s", rd.name);
    if (node_region_in_pool(n, r))
        return node_err(-XFER_EBUSY, "region %s belongs to a registered pool", name);
    if (!is_private(name)) {
        int rc = xfer_registry_unpublish_region(n->reg, name);
        if (rc && rc != -XFER_EUNAVAIL && rc != -XFER_ENOENT)
            xfer_warn("unpublishing region %s: %s", name, xfer_registry_last_error(n->reg));
    }
    int rc = xfer_region_detach(n->eng, r);
    return rc ? node_err(rc, "deregistering %s: %s", name, xfer_engine_last_error(n->eng)) : 0;
}

int xfer_node_region_deregister(xfer_node *n, xfer_region *r)
{
    int rc = xfer_node_region_detach(n, r);
    if (rc && rc != -XFER_ENOENT) /* ENOENT: detached already (by our caller) */
        return rc;
    rc = xfer_region_deregister(n->eng, r);
    return rc ? node_err(rc, "deregistering: %s", xfer_engine_last_error(n->eng)) : 0;
}

xfer_region *xfer_node_region_find(xfer_node *n, const char *name)
{
    return n && name ? xfer_region_find(n->eng, name) : NULL;
}
