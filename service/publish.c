/* This node and its regions in the registry (heartbeat on the registry's
 * own thread, so a stalled Redis never stalls the control loop). */
#include "xferd.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

static void publish_one(const struct xfer_region_desc *rd, void *arg)
{
    struct xferd *d = arg;
    if (rd->name[0] != XFERD_PRIVATE_PREFIX)
        xfer_registry_publish_region(d->reg, rd);
}

int xferd_publish_start(struct xferd *d, char *why, size_t wl)
{
    struct xfer_registry_config rc_cfg;
    xfer_registry_config_init(&rc_cfg);
    rc_cfg.url = d->cfg.redis_url;
    rc_cfg.ttl_ms = d->cfg.ttl_ms;
    rc_cfg.heartbeat_ms = d->cfg.heartbeat_ms;
    rc_cfg.start_offline = true; /* serve now, publish when Redis answers */
    int err = 0;
    d->reg = xfer_registry_new(&rc_cfg, &err);
    if (!d->reg) {
        snprintf(why, wl, "registry %s: %s", d->cfg.redis_url, xfer_strerror(err));
        return err;
    }
    struct xfer_node_desc nd;
    memset(&nd, 0, sizeof(nd));
    xfer_engine_describe(d->eng, &nd.peer);
    snprintf(nd.peer.addr, sizeof(nd.peer.addr), "%s", d->cfg.advertise);
    gethostname(nd.host, sizeof(nd.host) - 1);
    if (xfer_gpus_describe(nd.gpus, sizeof(nd.gpus)) < 0) { /* too many to list */
        xfer_warn("GPU list does not fit the node's gpus field; published empty");
        nd.gpus[0] = '\0';
    }
    nd.ctrl_port = d->ctrl_port;
    nd.pid = (uint32_t)getpid();
    snprintf(nd.version, sizeof(nd.version), "%s", XFER_VERSION_STRING);
    int rc = xfer_registry_publish_node(d->reg, &nd);
    if (rc && rc != -XFER_EUNAVAIL) {
        snprintf(why, wl, "publishing node: %s", xfer_registry_last_error(d->reg));
        return rc;
    }
    if (rc)
        xfer_warn("registry unreachable (%s): will publish when it is back",
                  xfer_registry_last_error(d->reg));
    if (xfer_registry_own_node(d->reg, &nd) == 0)
        d->incarnation = nd.peer.incarnation;
    pthread_rwlock_rdlock(&d->region_lock);
    xfer_region_foreach(d->eng, publish_one, d);
    pthread_rwlock_unlock(&d->region_lock);
    xfer_registry_on_event(d->reg, xferd_on_registry_event, d);
    rc = xfer_registry_thread_start(d->reg);
    if (rc) {
        snprintf(why, wl, "registry thread: %s", xfer_strerror(rc));
        return rc;
    }
    return 0;
}

int xferd_publish_region(struct xferd *d, xfer_region *r)
{
    struct xfer_region_desc rd;
    xfer_region_describe(r, &rd);
    int rc = xfer_registry_publish_region(d->reg, &rd);
    if (rc && rc != -XFER_EUNAVAIL)
        xfer_warn("publishing region %s: %s", rd.name, xfer_registry_last_error(d->reg));
    return rc == -XFER_EUNAVAIL ? 0 : rc;
}

void xferd_unpublish_region(struct xferd *d, const char *name)
{
    int rc = xfer_registry_unpublish_region(d->reg, name);
    if (rc && rc != -XFER_EUNAVAIL)
        xfer_warn("unpublishing region %s: %s", name, xfer_registry_last_error(d->reg));
}

void xferd_publish_stop(struct xferd *d)
{
    if (!d->reg)
        return;
    xfer_registry_thread_stop(d->reg);
    int rc = xfer_registry_unpublish_node(d->reg);
    if (rc)
        xfer_warn("removing this node from the registry: %s (its keys expire by TTL)",
                  xfer_registry_last_error(d->reg));
    xfer_registry_free(d->reg);
    d->reg = NULL;
}
