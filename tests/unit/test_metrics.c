/* Prometheus text of a metrics snapshot: names, labels, histogram
 * arithmetic, escaping, and that the output is well-formed exposition text. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metrics.h"

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>

static char *render(const struct xfer_metrics_snapshot *s)
{
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(xfer_metrics_render(s, &text, &len), 0);
    assert_non_null(text);
    assert_int_equal(strlen(text), len);
    return text;
}

static void assert_has_line(const char *text, const char *line)
{
    const char *p = text;
    size_t n = strlen(line);
    while ((p = strstr(p, line))) {
        if ((p == text || p[-1] == '\n') && p[n] == '\n')
            return;
        p++;
    }
    fail_msg("missing line: %s", line);
}

/* Every line: a # HELP / # TYPE comment, or name[{k="v",...}] value; each
 * family's TYPE appears once and before its samples. */
static void assert_well_formed(const char *text)
{
    char *copy = strdup(text), *save = NULL;
    char types[256][96];
    int ntypes = 0;
    assert_true(text[0] && text[strlen(text) - 1] == '\n');
    for (char *l = strtok_r(copy, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        if (!strncmp(l, "# HELP ", 7))
            continue;
        if (!strncmp(l, "# TYPE ", 7)) {
            char name[96], type[32];
            assert_int_equal(sscanf(l + 7, "%95s %31s", name, type), 2);
            for (int i = 0; i < ntypes; i++)
                assert_string_not_equal(types[i], name);
            assert_true(ntypes < 256);
            strcpy(types[ntypes++], name);
            continue;
        }
        const char *p = l;
        assert_true(isalpha((unsigned char)*p) || *p == '_');
        while (isalnum((unsigned char)*p) || *p == '_' || *p == ':')
            p++;
        if (*p == '{') {
            const char *end = strstr(p, "} ");
            assert_non_null(end);
            p = end + 1;
        }
        assert_int_equal(*p, ' ');
        char *num_end;
        strtod(p + 1, &num_end);
        assert_int_equal(*num_end, '\0');
        /* the sample belongs to the last declared family */
        assert_true(ntypes > 0);
        assert_memory_equal(l, types[ntypes - 1], strlen(types[ntypes - 1]));
    }
    free(copy);
}

static void test_empty_snapshot(void **state)
{
    (void)state;
    struct xfer_metrics_snapshot s;
    memset(&s, 0, sizeof(s));
    snprintf(s.node, sizeof(s.node), "n1");
    char *t = render(&s);
    assert_null(strstr(t, "xfer_up")); /* not rendered by the serving xferd */
    free(t);
    s.live = true;
    t = render(&s);
    assert_well_formed(t);
    assert_has_line(t, "xfer_up 1");
    assert_has_line(t, "xfer_build_info{node=\"n1\",version=\"" XFER_VERSION_STRING "\"} 1");
    assert_has_line(t, "xfer_node_ops_total{op=\"read\"} 0");
    assert_has_line(t, "xfer_node_bytes_total{op=\"write\"} 0");
    assert_has_line(t, "xfer_node_op_latency_seconds_count 0");
    assert_null(strstr(t, "xfer_registry_connected")); /* no registry callback */
    assert_null(strstr(t, "peer="));                   /* no peers */
    free(t);
    xfer_metrics_snapshot_clear(&s);
}

static void test_peers_transports_registry(void **state)
{
    (void)state;
    struct xfer_metrics_snapshot s;
    memset(&s, 0, sizeof(s));
    snprintf(s.node, sizeof(s.node), "n1");
    s.live = true;
    s.uptime_ms = 12345;
    s.have_registry = true;
    s.reg = (struct xfer_metrics_registry){.connected = true, .known_peers = 2, .regions = 3};
    s.total = (struct xfer_stats){.ops_read = 3,
                                  .ops_write = 5,
                                  .bytes_read = 300,
                                  .bytes_written = 5 << 20,
                                  .errors = 1,
                                  .served_ops = 7,
                                  .served_bytes = 700,
                                  .served_errors = 2};
    struct xfer_metrics_named peers[2] = {
        {.name = "n2", .transport = "tcp", .st = {.ops_write = 5, .bytes_written = 5 << 20}},
        {.name = "n3", .st = {.ops_read = 3, .bytes_read = 300}},
    };
    s.peers = peers;
    s.npeers = 2;
    s.ntransports = 1;
    snprintf(s.transports[0].name, sizeof(s.transports[0].name), "tcp");
    s.transports[0].st = s.total;
    char *t = render(&s);
    assert_well_formed(t);
    assert_has_line(t, "xfer_uptime_seconds 12.345");
    assert_has_line(t, "xfer_registry_connected 1");
    assert_has_line(t, "xfer_registry_known_peers 2");
    assert_has_line(t, "xfer_regions 3");
    assert_has_line(t, "xfer_node_bytes_total{op=\"write\"} 5242880");
    assert_has_line(t, "xfer_node_errors_total 1");
    assert_has_line(t, "xfer_node_served_bytes_total 700");
    assert_has_line(t, "xfer_node_served_errors_total 2");
    assert_has_line(t, "xfer_peer_bytes_total{peer=\"n2\",op=\"write\"} 5242880");
    assert_has_line(t, "xfer_peer_ops_total{peer=\"n3\",op=\"read\"} 3");
    assert_has_line(t, "xfer_transport_ops_total{transport=\"tcp\",op=\"write\"} 5");
    assert_has_line(t, "xfer_peer_transport_info{peer=\"n2\",transport=\"tcp\"} 1");
    assert_null(strstr(t, "xfer_peer_transport_info{peer=\"n3\"")); /* unconnected */
    free(t);
}

static void test_latency_histogram_is_cumulative(void **state)
{
    (void)state;
    struct xfer_metrics_snapshot s;
    memset(&s, 0, sizeof(s));
    s.total.lat_hist[0] = 1;                    /* < 8 us */
    s.total.lat_hist[3] = 2;                    /* < 64 us */
    s.total.lat_hist[XFER_LAT_BUCKETS - 1] = 4; /* slower than the last bound */
    s.total.lat_us_sum = 2500000;
    char *t = render(&s);
    assert_well_formed(t);
    assert_has_line(t, "xfer_node_op_latency_seconds_bucket{le=\"8e-06\"} 1");
    assert_has_line(t, "xfer_node_op_latency_seconds_bucket{le=\"3.2e-05\"} 1");
    assert_has_line(t, "xfer_node_op_latency_seconds_bucket{le=\"6.4e-05\"} 3");
    assert_has_line(t, "xfer_node_op_latency_seconds_bucket{le=\"0.131072\"} 3");
    assert_has_line(t, "xfer_node_op_latency_seconds_bucket{le=\"+Inf\"} 7");
    assert_has_line(t, "xfer_node_op_latency_seconds_sum 2.500000");
    assert_has_line(t, "xfer_node_op_latency_seconds_count 7");
    free(t);
}

static void test_label_values_are_escaped(void **state)
{
    (void)state;
    struct xfer_metrics_snapshot s;
    memset(&s, 0, sizeof(s));
    struct xfer_metrics_named p = {.name = "a\"b\\c\nd"};
    s.peers = &p;
    s.npeers = 1;
    char *t = render(&s);
    assert_has_line(t, "xfer_peer_errors_total{peer=\"a\\\"b\\\\c\\nd\"} 0");
    free(t);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    char *t = NULL;
    assert_int_equal(xfer_metrics_render(NULL, &t, NULL), -XFER_EINVAL);
    xfer_metrics_snapshot_clear(NULL);
    struct xfer_metrics_snapshot s;
    assert_int_equal(xfer_metrics_snapshot_take(NULL, NULL), -XFER_EINVAL);
    assert_int_equal(xfer_metrics_snapshot_take(NULL, &s), 0); /* no engine: zeros */
    assert_int_equal(s.npeers, 0);
    assert_int_equal(s.total.ops_write, 0);
    int err = 0;
    assert_null(xfer_metrics_start(NULL, NULL, &err));
    assert_int_equal(err, -XFER_EINVAL);
    xfer_metrics_stop(NULL);
    assert_int_equal(xfer_metrics_port(NULL), 0);
}

/* ---- the HTTP server, with a real engine and a client on the same loop ---- */

struct fetch {
    struct event_base *base;
    int status;
    char body[1 << 16];
};

static void on_fetched(struct evhttp_request *req, void *arg)
{
    struct fetch *f = arg;
    f->status = req ? evhttp_request_get_response_code(req) : -1;
    if (req) {
        struct evbuffer *b = evhttp_request_get_input_buffer(req);
        size_t n = evbuffer_get_length(b);
        n = n < sizeof(f->body) - 1 ? n : sizeof(f->body) - 1;
        evbuffer_remove(b, f->body, n);
        f->body[n] = 0;
    }
    event_base_loopbreak(f->base);
}

/* GET path from 127.0.0.1:port, running base until the answer (5 s max). */
static void fetch(struct event_base *base, uint16_t port, const char *path, struct fetch *f)
{
    memset(f, 0, sizeof(*f));
    f->base = base;
    f->status = 0;
    struct evhttp_connection *c = evhttp_connection_base_new(base, NULL, "127.0.0.1", port);
    assert_non_null(c);
    evhttp_connection_set_timeout(c, 5);
    struct evhttp_request *req = evhttp_request_new(on_fetched, f);
    evhttp_add_header(evhttp_request_get_output_headers(req), "Host", "127.0.0.1");
    assert_int_equal(evhttp_make_request(c, req, EVHTTP_REQ_GET, path), 0);
    struct timeval limit = {5, 0};
    event_base_loopexit(base, &limit);
    event_base_dispatch(base);
    evhttp_connection_free(c);
    assert_int_not_equal(f->status, 0); /* answered before the limit */
}

static void fake_registry(struct xfer_metrics_registry *out, void *arg)
{
    (void)arg;
    out->connected = true;
    out->known_peers = 5;
    out->regions = 1;
}

static void test_http_serves_metrics(void **state)
{
    (void)state;
    struct event_base *base = event_base_new();
    assert_non_null(base);
    struct xfer_engine_config ec;
    xfer_engine_config_init(&ec);
    ec.node_id = "h1";
    ec.transports = XFER_TRANSPORT_TCP;
    int err = 0;
    xfer_engine *e = xfer_engine_new(&ec, &err);
    assert_non_null(e);
    struct xfer_metrics_config mc = {
        .addr = "127.0.0.1",
        .port = 0,
        .node = "h1",
        .engine = e,
        .registry_fn = fake_registry,
    };
    struct xfer_metrics *m = xfer_metrics_start(base, &mc, &err);
    assert_non_null(m);
    uint16_t port = xfer_metrics_port(m);
    assert_true(port > 0);

    struct fetch *f = malloc(sizeof(*f));
    fetch(base, port, "/metrics", f);
    assert_int_equal(f->status, 200);
    assert_well_formed(f->body);
    assert_has_line(f->body, "xfer_build_info{node=\"h1\",version=\"" XFER_VERSION_STRING "\"} 1");
    assert_has_line(f->body, "xfer_registry_known_peers 5");
    assert_has_line(f->body, "xfer_transport_bytes_total{transport=\"tcp\",op=\"write\"} 0");
    fetch(base, port, "/other", f);
    assert_int_equal(f->status, 404);
    free(f);

    /* the same port again: a clear error, nothing leaked */
    mc.port = port;
    assert_null(xfer_metrics_start(base, &mc, &err));
    assert_int_equal(err, -XFER_EBUSY);

    xfer_metrics_stop(m);
    xfer_engine_free(e);
    event_base_free(base);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_empty_snapshot),
        cmocka_unit_test(test_peers_transports_registry),
        cmocka_unit_test(test_latency_histogram_is_cumulative),
        cmocka_unit_test(test_label_values_are_escaped),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_http_serves_metrics),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
