/*
 * Prometheus metrics: snapshot of the engine counters and the evhttp server
 * that answers GET /metrics (text in metrics_text.c). Names: metrics.h.
 */
#include "metrics.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

/* ---- snapshot ----------------------------------------------------------- */

struct peer_walk {
    struct xfer_metrics_snapshot *s;
    size_t cap;
};

static void copy_name(char *dst, size_t cap, const char *src)
{
    snprintf(dst, cap, "%s", src ? src : "");
}

static void take_peer(xfer_peer *p, void *arg)
{
    struct peer_walk *w = arg;
    struct xfer_metrics_snapshot *s = w->s;
    if (s->npeers == w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 16;
        struct xfer_metrics_named *n = realloc(s->peers, cap * sizeof(*n));
        if (!n)
            return; /* this scrape shows fewer peers; the next one retries */
        s->peers = n;
        w->cap = cap;
    }
    struct xfer_metrics_named *m = &s->peers[s->npeers++];
    memset(m, 0, sizeof(*m));
    struct xfer_peer_desc d;
    xfer_peer_describe(p, &d);
    copy_name(m->name, sizeof(m->name), d.node_id);
    unsigned bit = xfer_peer_transport(p);
    if (bit)
        xfer_transports_format(bit, m->transport, sizeof(m->transport));
    xfer_peer_stats(p, &m->st);
}

int xfer_metrics_snapshot_take(xfer_engine *e, struct xfer_metrics_snapshot *s)
{
    if (!s)
        return -XFER_EINVAL;
    memset(s, 0, sizeof(*s));
    if (!e)
        return 0;
    xfer_engine_stats(e, &s->total);
    struct peer_walk w = {.s = s};
    xfer_peer_foreach(e, take_peer, &w);
    static const unsigned bits[] = {XFER_TRANSPORT_TCP, XFER_TRANSPORT_IPC, XFER_TRANSPORT_RDMA,
                                    XFER_TRANSPORT_TCPX};
    for (size_t i = 0; i < sizeof(bits) / sizeof(bits[0]); i++) {
        struct xfer_metrics_named *t = &s->transports[s->ntransports++];
        xfer_transports_format(bits[i], t->name, sizeof(t->name));
        xfer_transport_stats(e, bits[i], &t->st);
    }
    return 0;
}

/* ---- HTTP --------------------------------------------------------------- */

struct xfer_metrics {
    struct evhttp *http;
    uint16_t port;
    uint64_t started_ms;
    char node[XFER_NAME_MAX];
    xfer_engine *engine;
    xfer_metrics_registry_fn registry_fn;
    void *registry_arg;
};

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void on_metrics(struct evhttp_request *req, void *arg)
{
    struct xfer_metrics *m = arg;
    struct xfer_metrics_snapshot s;
    xfer_metrics_snapshot_take(m->engine, &s);
    copy_name(s.node, sizeof(s.node), m->node);
    s.live = true;
    s.uptime_ms = mono_ms() - m->started_ms;
    if (m->registry_fn) {
        s.have_registry = true;
        m->registry_fn(&s.reg, m->registry_arg);
    }
    char *text = NULL;
    size_t len = 0;
    int rc = xfer_metrics_render(&s, &text, &len);
    xfer_metrics_snapshot_clear(&s);
    if (rc) {
        evhttp_send_error(req, HTTP_INTERNAL, "cannot render metrics");
        return;
    }
    struct evbuffer *body = evhttp_request_get_output_buffer(req);
    evbuffer_add(body, text, len);
    free(text);
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
                      "text/plain; version=0.0.4; charset=utf-8");
    evhttp_send_reply(req, HTTP_OK, "OK", NULL);
}

static void on_other(struct evhttp_request *req, void *arg)
{
    (void)arg;
    evhttp_send_error(req, HTTP_NOTFOUND, "only /metrics here");
}

static uint16_t bound_port(struct evhttp_bound_socket *h)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    if (getsockname(evhttp_bound_socket_get_fd(h), (struct sockaddr *)&ss, &sl))
        return 0;
    if (ss.ss_family == AF_INET)
        return ntohs(((struct sockaddr_in *)&ss)->sin_port);
    if (ss.ss_family == AF_INET6)
        return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    return 0;
}

struct xfer_metrics *xfer_metrics_start(struct event_base *base,
                                        const struct xfer_metrics_config *cfg, int *err)
{
    int rc = -XFER_EINVAL;
    if (!base || !cfg)
        goto out;
    struct xfer_metrics *m = calloc(1, sizeof(*m));
    rc = -XFER_ENOMEM;
    if (!m)
        goto out;
    m->engine = cfg->engine;
    m->registry_fn = cfg->registry_fn;
    m->registry_arg = cfg->registry_arg;
    m->started_ms = mono_ms();
    copy_name(m->node, sizeof(m->node), cfg->node);
    m->http = evhttp_new(base);
    if (!m->http)
        goto out_free;
    /* A scrape is one small GET; anything else is refused early. */
    evhttp_set_allowed_methods(m->http, EVHTTP_REQ_GET | EVHTTP_REQ_HEAD);
    evhttp_set_max_headers_size(m->http, 8192);
    evhttp_set_max_body_size(m->http, 1024);
    evhttp_set_timeout(m->http, 10);
    evhttp_set_cb(m->http, "/metrics", on_metrics, m);
    evhttp_set_gencb(m->http, on_other, m);
    const char *addr = cfg->addr && *cfg->addr ? cfg->addr : "0.0.0.0";
    struct evhttp_bound_socket *h = evhttp_bind_socket_with_handle(m->http, addr, cfg->port);
    if (!h) {
        rc = errno == EADDRINUSE ? -XFER_EBUSY : -XFER_EINVAL;
        xfer_err("metrics: cannot listen on %s:%u: %s", addr, cfg->port, strerror(errno));
        goto out_http;
    }
    m->port = bound_port(h);
    xfer_info("metrics: serving http://%s:%u/metrics", addr, m->port);
    if (err)
        *err = 0;
    return m;

out_http:
    evhttp_free(m->http);
out_free:
    free(m);
out:
    if (err)
        *err = rc;
    return NULL;
}

uint16_t xfer_metrics_port(const struct xfer_metrics *m)
{
    return m ? m->port : 0;
}

void xfer_metrics_stop(struct xfer_metrics *m)
{
    if (!m)
        return;
    evhttp_free(m->http);
    free(m);
}
