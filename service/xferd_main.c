/* xferd: one transfer node = engine + config + registry publisher +
 * control server. See docs/service.md. */
#include "config.h"
#include "xfer_io.h"
#include "metrics.h"
#include "xferd.h"

#include <event2/event.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char usage[] =
    "usage: xferd [options]\n"
    "Runs one xfer node: registers memory regions, publishes them to Redis and\n"
    "serves named transfers on a control port and a unix socket.\n"
    "\n"
    "  -c, --config FILE         config file (key = value, [region NAME] sections)\n"
    "  -n, --node ID             node id                    (XFER_NODE)\n"
    "  -r, --redis-url URL       redis://[user:pw@]host:port[/db], unix:///path,\n"
    "                            redis-sentinel://[user:pw@]host:port[,...]/MASTER[/db]\n"
    "                            or redis-cluster://[user:pw@]host:port[,...]\n"
    "                                                       (XFER_REDIS_URL)\n"
    "      --secret S            cluster secret             (XFER_SECRET)\n"
    "      --secret-file F       read the secret from F     (XFER_SECRET_FILE)\n"
    "      --insecure            serve beyond loopback with no secret (refused\n"
    "                            otherwise; warns at start)  (XFER_INSECURE=1)\n"
    "  -t, --transports LIST     e.g. tcp,ipc               (XFER_TRANSPORTS)\n"
    "  -l, --listen ADDR[:PORT]  data/control address, data port\n"
    "                                                       (XFER_LISTEN)\n"
    "      --advertise ADDR      address published to peers (XFER_ADVERTISE)\n"
    "      --data-port P         data-plane port, 0 = any   (XFER_DATA_PORT)\n"
    "      --ctrl-port P         control TCP port, 0 = any  (XFER_CTRL_PORT)\n"
    "  -s, --ctrl-socket PATH    unix socket, default /tmp/xferd-NODE.sock\n"
    "                                                       (XFER_CTRL_SOCKET)\n"
    "  -R, --region NAME:SIZE[:ACCESS]  allocate a host region (repeatable)\n"
    "      --regions LIST        the same, comma-separated  (XFER_REGIONS)\n"
    "      --pool NAME=LAYOUT:DTYPE:BLOCK_BYTES:NUM_BLOCKS:LAYERS[:KV[:TAG]]\n"
    "                            a host-memory KV pool (regions NAME.0, ...; repeatable)\n"
    "      --metrics-port P      Prometheus /metrics over HTTP, default 9400, 0 = off\n"
    "                                                       (XFER_METRICS_PORT)\n"
    "      --metrics-addr ADDR   its address, default: --listen (XFER_METRICS_ADDR)\n"
    "      --ttl-ms MS           registry TTL, default 10000 (XFER_TTL_MS)\n"
    "      --heartbeat-ms MS     default ttl/3              (XFER_HEARTBEAT_MS)\n"
    "      --drain-ms MS         SIGTERM grace, default 5000 (XFER_DRAIN_MS)\n"
    "      --connect-timeout-ms, --io-timeout-ms, --request-timeout-ms MS\n"
    "      --sockets-per-peer N  tcp sockets per peer, default 4 (XFER_SOCKETS_PER_PEER)\n"
    "      --progress-threads N  transport progress threads, default 1\n"
    "                                                  (XFER_PROGRESS_THREADS)\n"
    "      --chunk-bytes N       items split above this, default 1048576 (XFER_CHUNK_BYTES)\n"
    "      --busy-poll-us US     waits spin this long first, default 0 (XFER_BUSY_POLL_US)\n"
    "      --workers N           request worker threads, default 4\n"
    "      --max-region-bytes N  host memory xferd keeps in regions (control-plane\n"
    "                            registrations past it are refused), default: the\n"
    "                            machine's RAM, 0 = no limit (XFER_MAX_REGION_BYTES)\n"
    "      --log-level L         error|warn|info|debug      (XFER_LOG_LEVEL)\n"
    "  -h, --help                this text\n"
    "  -V, --version             print the version\n"
    "Precedence: flags > environment > config file > defaults.\n";

enum { OPT_KEY = 1000 };
static const struct option long_opts[] = {
    {"config", required_argument, 0, 'c'},
    {"node", required_argument, 0, 'n'},
    {"redis-url", required_argument, 0, 'r'},
    {"transports", required_argument, 0, 't'},
    {"listen", required_argument, 0, 'l'},
    {"ctrl-socket", required_argument, 0, 's'},
    {"region", required_argument, 0, 'R'},
    {"help", no_argument, 0, 'h'},
    {"version", no_argument, 0, 'V'},
    {"secret", required_argument, 0, OPT_KEY},
    {"secret-file", required_argument, 0, OPT_KEY},
    {"insecure", no_argument, 0, OPT_KEY},
    {"advertise", required_argument, 0, OPT_KEY},
    {"data-port", required_argument, 0, OPT_KEY},
    {"ctrl-port", required_argument, 0, OPT_KEY},
    {"ttl-ms", required_argument, 0, OPT_KEY},
    {"heartbeat-ms", required_argument, 0, OPT_KEY},
    {"drain-ms", required_argument, 0, OPT_KEY},
    {"connect-timeout-ms", required_argument, 0, OPT_KEY},
    {"io-timeout-ms", required_argument, 0, OPT_KEY},
    {"sockets-per-peer", required_argument, 0, OPT_KEY},
    {"progress-threads", required_argument, 0, OPT_KEY},
    {"chunk-bytes", required_argument, 0, OPT_KEY},
    {"busy-poll-us", required_argument, 0, OPT_KEY},
    {"request-timeout-ms", required_argument, 0, OPT_KEY},
    {"workers", required_argument, 0, OPT_KEY},
    {"log-level", required_argument, 0, OPT_KEY},
    {"regions", required_argument, 0, OPT_KEY},
    {"pool", required_argument, 0, OPT_KEY},
    {"metrics-port", required_argument, 0, OPT_KEY},
    {"metrics-addr", required_argument, 0, OPT_KEY},
    {"max-region-bytes", required_argument, 0, OPT_KEY},
    {0, 0, 0, 0},
};

static const char *short_key(int c)
{
    switch (c) {
    case 'n':
        return "node";
    case 'r':
        return "redis_url";
    case 't':
        return "transports";
    case 'l':
        return "listen";
    case 's':
        return "ctrl_socket";
    default:
        return NULL;
    }
}

/* Flags > env > file: find the config file first, load it, apply the
 * environment, then the flags. Returns 0, 1 (help/version printed) or -1. */
static int load_config(int argc, char **argv, struct xferd_config *c)
{
    char why[400];
    const char *file = getenv("XFER_CONFIG");
    for (int i = 1; i < argc; i++) {
        if ((!strcmp(argv[i], "-c") || !strcmp(argv[i], "--config")) && i + 1 < argc)
            file = argv[i + 1];
        else if (!strncmp(argv[i], "--config=", 9))
            file = argv[i] + 9;
    }
    xferd_config_defaults(c);
    if (file && *file && xferd_config_load_file(c, file, why, sizeof(why)))
        goto bad;
    if (xferd_config_load_env(c, why, sizeof(why)))
        goto bad;
    int opt, idx;
    while ((opt = getopt_long(argc, argv, "c:n:r:t:l:s:R:hV", long_opts, &idx)) != -1) {
        const char *key = opt == OPT_KEY ? long_opts[idx].name : short_key(opt);
        if (opt == 'h') {
            fputs(usage, stdout);
            return 1;
        } else if (opt == 'V') {
            printf("xferd %s (protocol %u)\n", XFER_VERSION_STRING, XFER_PROTO_VERSION);
            return 1;
        } else if (opt == 'c') {
            continue;
        } else if (opt == 'R') {
            if (xferd_config_add_region_spec(c, optarg, why, sizeof(why)))
                goto bad;
        } else if (key) {
            if (xferd_config_set(c, key, optarg ? optarg : "true", why, sizeof(why)))
                goto bad;
        } else {
            fprintf(stderr, "xferd: try --help\n");
            return -1;
        }
    }
    if (optind < argc) {
        snprintf(why, sizeof(why), "unexpected argument '%s'", argv[optind]);
        goto bad;
    }
    if (xferd_config_finish(c, why, sizeof(why)))
        goto bad;
    return 0;
bad:
    fprintf(stderr, "xferd: %s\n", why);
    return -1;
}

static void apply_log_level(const char *s)
{
    static const char *const names[] = {"error", "warn", "info", "debug"};
    for (int i = 0; s && *s && i < 4; i++)
        if (!strcasecmp(s, names[i]))
            xfer_log_set_level((enum xfer_log_level)i);
}

/* Registry events, after the node applied them (registry thread). */
static void on_node_event(const struct xfer_registry_event *ev, void *arg)
{
    xferd_known_on_event(arg, ev);
}

/* The node (engine, registry publisher and watcher) and the configured
 * regions, published as they are made. Runs after the control server bound
 * its port, which the node publishes. */
static int start_node(struct xferd *d)
{
    struct xfer_node_config nc;
    xfer_node_config_init(&nc);
    nc.node_id = d->cfg.node;
    nc.redis_url = d->cfg.redis_url;
    if (d->cfg.secret[0]) {
        nc.secret = d->cfg.secret;
        nc.secret_len = strlen(d->cfg.secret);
    }
    nc.transports = d->cfg.transports;
    nc.listen_addr = d->cfg.listen;
    nc.data_port = d->cfg.data_port;
    nc.advertise = d->cfg.advertise;
    nc.ctrl_port = d->ctrl_port;
    nc.ttl_ms = d->cfg.ttl_ms;
    nc.heartbeat_ms = d->cfg.heartbeat_ms;
    nc.connect_timeout_ms = d->cfg.connect_timeout_ms;
    nc.io_timeout_ms = d->cfg.io_timeout_ms;
    nc.sockets_per_peer = d->cfg.sockets_per_peer;
    nc.progress_threads = d->cfg.progress_threads;
    nc.chunk_bytes = (size_t)d->cfg.chunk_bytes;
    nc.busy_poll_us = d->cfg.busy_poll_us;
    nc.default_deadline_ms = d->cfg.request_timeout_ms;
    nc.offline_ok = true; /* serve now, publish when Redis answers */
    nc.on_event = on_node_event;
    nc.event_arg = d;
    int err = 0;
    d->node = xfer_node_new(&nc, &err);
    if (!d->node) {
        fprintf(stderr, "xferd: %s\n", xfer_node_last_error(NULL));
        return err;
    }
    d->eng = xfer_node_engine(d->node);
    d->reg = xfer_node_registry(d->node);
    xferd_known_attach(d, d->reg);
    d->incarnation = xfer_node_incarnation(d->node);
    for (int i = 0; i < d->cfg.nregions; i++) {
        const struct xferd_region_conf *rc = &d->cfg.regions[i];
        xfer_region *r;
        err = xfer_region_alloc(d->eng, rc->name, rc->size, rc->access, &r);
        if (!err && (rc->layout.block_bytes || rc->layout.dtype[0] || rc->layout.tag[0]))
            err = xfer_region_set_layout(r, &rc->layout);
        if (err) {
            fprintf(stderr, "xferd: region %s: %s\n", rc->name, xfer_engine_last_error(d->eng));
            return err;
        }
        if ((err = xfer_node_region_publish(d->node, r))) {
            fprintf(stderr, "xferd: region %s: %s\n", rc->name, xfer_node_last_error(d->node));
            return err;
        }
    }
    for (int i = 0; i < d->cfg.npools; i++) {
        char why[300];
        const struct xferd_pool_conf *pc = &d->cfg.pools[i];
        if ((err = xferd_pool_create(d, pc->name, &pc->geom, XFER_ACCESS_RW, why, sizeof(why)))) {
            fprintf(stderr, "xferd: %s\n", why);
            return err;
        }
    }
    return 0;
}

/* Registry state for /metrics; runs on the loop thread at each scrape and
 * never talks to Redis (known peers come from registry events, known.c). */
static void count_public_region(const struct xfer_region_desc *rd, void *arg)
{
    if (rd->name[0] != XFERD_PRIVATE_PREFIX)
        (*(uint32_t *)arg)++;
}

static void metrics_registry_state(struct xfer_metrics_registry *out, void *arg)
{
    struct xferd *d = arg;
    out->connected = d->reg && xfer_registry_connected(d->reg);
    xfer_region_foreach(d->eng, count_public_region, &out->regions);
    out->known_peers = xferd_known_count(d);
}

static int start_metrics(struct xferd *d, char *why, size_t why_len)
{
    if (!d->cfg.metrics_port)
        return 0;
    struct xfer_metrics_config mc = {
        .addr = d->cfg.metrics_addr[0] ? d->cfg.metrics_addr : d->cfg.listen,
        .port = d->cfg.metrics_port,
        .node = d->cfg.node,
        .engine = d->eng,
        .registry_fn = metrics_registry_state,
        .registry_arg = d,
    };
    int err = 0;
    d->metrics = xfer_metrics_start(d->base, &mc, &err);
    if (!d->metrics && !d->cfg.metrics_port_given) {
        /* The default port may be another xferd's on this address. */
        xfer_warn("metrics on %s:%u (the default port): %s; /metrics is off, set "
                  "--metrics-port (0 = off) to choose",
                  mc.addr, mc.port, xfer_strerror(err));
        return 0;
    }
    if (!d->metrics)
        snprintf(why, why_len, "metrics on %s:%u: %s", mc.addr, mc.port, xfer_strerror(err));
    return d->metrics ? 0 : err;
}

struct drain {
    struct xferd *d;
    struct event *timer;
    int64_t deadline;
    bool cancelled;
};

/* Polls until in-flight requests are done or the deadline passed; at the
 * deadline the engine batches still running are cancelled (they fail with
 * -XFER_ECANCELED) and the loop ends once the workers are free. */
static void on_drain_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct drain *dr = arg;
    int pending = jobq_pending(dr->d->jobs) + jobq_pending(dr->d->async_jobs);
    if (pending == 0 || xfer_now_ms() > dr->deadline + 2000) {
        if (pending)
            xfer_warn("drain: %d requests still running after the deadline", pending);
        event_base_loopbreak(dr->d->base);
        return;
    }
    if (xfer_now_ms() >= dr->deadline && !dr->cancelled) {
        xfer_warn("drain: deadline passed, cancelling %d requests", pending);
        xferd_cancel_inflight(dr->d);
        dr->cancelled = true;
    }
    struct timeval tv = {0, 20000};
    evtimer_add(dr->timer, &tv);
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
    (void)what;
    struct drain *dr = arg;
    struct xferd *d = dr->d;
    if (atomic_load(&d->draining)) {
        xfer_warn("second signal %d: stopping now", (int)sig);
        dr->deadline = 0;
        xferd_cancel_inflight(d);
        return;
    }
    xfer_info("signal %d: draining (up to %d ms)", (int)sig, d->cfg.drain_ms);
    dr->deadline = xfer_now_ms() + d->cfg.drain_ms;
    atomic_store(&d->drain_deadline_ms, dr->deadline);
    atomic_store(&d->draining, true);
    ctl_server_stop_accepting(d->srv);
    struct timeval tv = {0, 0};
    evtimer_add(dr->timer, &tv);
}

static void shutdown_all(struct xferd *d)
{
    xfer_metrics_stop(d->metrics);
    /* drained by now: no transfer uses the node any more. Requests first: one
     * still running may queue an async batch, which the second free runs. */
    jobq_free(d->jobs);
    jobq_free(d->async_jobs);
    xferd_forward_close_all(d);
    ctl_server_free(d->srv);
    batch_table_free(d->batches);
    xfer_node_free(d->node); /* removes our keys, publishes "leave", frees the engine */
    xferd_known_free(d);
    if (d->base)
        event_base_free(d->base);
}

int main(int argc, char **argv)
{
    static struct xferd dd;
    struct xferd *d = &dd;
    int rc = load_config(argc, argv, &d->cfg);
    if (rc)
        return rc > 0 ? 0 : 2;
    apply_log_level(d->cfg.log_level);
    if (xferd_config_unauthenticated_exposed(&d->cfg))
        xfer_warn("INSECURE: serving on %s with no cluster secret (--insecure): anyone who "
                  "reaches its control or data port can read and write this node's memory",
                  d->cfg.listen);
    signal(SIGPIPE, SIG_IGN);
    pthread_mutex_init(&d->inflight_lock, NULL);
    pthread_mutex_init(&d->fwd_lock, NULL);
    pthread_mutex_init(&d->known_lock, NULL);
    /* Writers first (issue 18 item 4): transfers hold the read side for a
     * whole batch, and with glibc's default (readers first) a steady stream
     * of overlapping transfers kept register/deregister waiting for as long
     * as the stream lasted. Non-recursive: no path takes it twice. */
    pthread_rwlockattr_t rwa;
    pthread_rwlockattr_init(&rwa);
    pthread_rwlockattr_setkind_np(&rwa, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&d->region_lock, &rwa);
    pthread_rwlockattr_destroy(&rwa);
    d->started_ms = (uint64_t)xfer_now_ms();
    char why[400] = "";
    struct drain dr = {.d = d};
    struct event *sigs[2] = {0};
    d->base = event_base_new();
    d->jobs = d->base ? jobq_new(d->base, d->cfg.workers) : NULL;
    d->async_jobs = d->base ? jobq_new(d->base, d->cfg.workers) : NULL;
    d->batches = batch_table_new();
    if (!d->jobs || !d->async_jobs || !d->batches) {
        fprintf(stderr, "xferd: out of memory at start\n");
        goto fail;
    }
    d->srv = ctl_server_new(d, why, sizeof(why));
    if (!d->srv) {
        fprintf(stderr, "xferd: %s\n", why);
        goto fail;
    }
    if (start_node(d))
        goto fail;
    if (start_metrics(d, why, sizeof(why))) {
        fprintf(stderr, "xferd: %s\n", why);
        goto fail;
    }
    dr.timer = evtimer_new(d->base, on_drain_tick, &dr);
    sigs[0] = evsignal_new(d->base, SIGTERM, on_signal, &dr);
    sigs[1] = evsignal_new(d->base, SIGINT, on_signal, &dr);
    if (!dr.timer || !sigs[0] || !sigs[1] || evsignal_add(sigs[0], NULL) ||
        evsignal_add(sigs[1], NULL)) {
        fprintf(stderr, "xferd: event setup failed\n");
        goto fail;
    }
    fprintf(stderr, "xferd: node %s ready: control %s:%u and %s, data port %u\n", d->cfg.node,
            d->cfg.listen, d->ctrl_port, d->cfg.ctrl_socket, xfer_engine_data_port(d->eng));
    event_base_dispatch(d->base);
    xfer_info("xferd %s: stopping", d->cfg.node);
    rc = 0;
    goto out;
fail:
    rc = 1;
out:
    for (int i = 0; i < 2; i++)
        if (sigs[i])
            event_free(sigs[i]);
    if (dr.timer)
        event_free(dr.timer);
    shutdown_all(d);
    return rc;
}
