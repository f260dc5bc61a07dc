/*
 * Prometheus text exposition (format 0.0.4) of a metrics snapshot. Plain
 * data in, text out: no engine, no sockets, so it is unit-tested directly.
 */
#include "metrics.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void xfer_metrics_snapshot_clear(struct xfer_metrics_snapshot *s)
{
    if (!s)
        return;
    free(s->peers);
    s->peers = NULL;
    s->npeers = 0;
}

/* Label value per the exposition format: \ " and newline escaped. */
static void put_escaped(FILE *f, const char *v)
{
    for (; *v; v++) {
        if (*v == '\\' || *v == '"')
            fputc('\\', f);
        if (*v == '\n') {
            fputs("\\n", f);
            continue;
        }
        fputc(*v, f);
    }
}

/* One series of a scope: node (no label), a peer, or a transport. */
struct series {
    const char *label; /* "peer", "transport" or NULL */
    const char *value;
    const struct xfer_stats *st;
};

/* name{<series label>,<extra>} value */
static void put_sample(FILE *f, const char *name, const struct series *se, const char *extra,
                       const char *value)
{
    fputs(name, f);
    if (se->label || extra) {
        fputc('{', f);
        if (se->label) {
            fprintf(f, "%s=\"", se->label);
            put_escaped(f, se->value);
            fputc('"', f);
        }
        if (extra)
            fprintf(f, "%s%s", se->label ? "," : "", extra);
        fputc('}', f);
    }
    fprintf(f, " %s\n", value);
}

static void put_u64(FILE *f, const char *name, const struct series *se, const char *extra,
                    uint64_t v)
{
    char buf[24];
    snprintf(buf, sizeof(buf), "%llu", (unsigned long long)v);
    put_sample(f, name, se, extra, buf);
}

#define NO_FIELD ((size_t)-1)
struct counter_def {
    const char *suffix, *help;
    size_t off_a, off_b; /* off_b != NO_FIELD: a = op="read", b = op="write" */
};
#define ST(field) offsetof(struct xfer_stats, field)
static const struct counter_def counters[] = {
    {"ops_total", "Transfer items completed as initiator.", ST(ops_read), ST(ops_write)},
    {"bytes_total", "Bytes moved by items completed as initiator.", ST(bytes_read),
     ST(bytes_written)},
    {"errors_total", "Transfer items that failed.", ST(errors), NO_FIELD},
    {"served_ops_total", "Requests served as target.", ST(served_ops), NO_FIELD},
    {"served_bytes_total", "Bytes served as target.", ST(served_bytes), NO_FIELD},
    {"served_errors_total", "Requests refused as target.", ST(served_errors), NO_FIELD},
};

static uint64_t field(const struct xfer_stats *st, size_t off)
{
    return *(const uint64_t *)((const char *)st + off);
}

static void render_counter(FILE *f, const char *scope, const struct counter_def *c,
                           const struct series *se, size_t n)
{
    char name[96];
    snprintf(name, sizeof(name), "xfer_%s_%s", scope, c->suffix);
    fprintf(f, "# HELP %s %s\n# TYPE %s counter\n", name, c->help, name);
    for (size_t i = 0; i < n; i++) {
        if (c->off_b == NO_FIELD) {
            put_u64(f, name, &se[i], NULL, field(se[i].st, c->off_a));
        } else {
            put_u64(f, name, &se[i], "op=\"read\"", field(se[i].st, c->off_a));
            put_u64(f, name, &se[i], "op=\"write\"", field(se[i].st, c->off_b));
        }
    }
}

/* Bucket i of struct xfer_stats counts items faster than 2^i * 8 us; the
 * last one holds the rest, so it is the +Inf bucket. */
static void render_latency(FILE *f, const char *scope, const struct series *se, size_t n)
{
    char name[96], sample[112], le[48], val[32];
    snprintf(name, sizeof(name), "xfer_%s_op_latency_seconds", scope);
    fprintf(f, "# HELP %s Latency of transfer items as initiator.\n# TYPE %s histogram\n", name,
            name);
    for (size_t i = 0; i < n; i++) {
        uint64_t cum = 0;
        snprintf(sample, sizeof(sample), "%s_bucket", name);
        for (int b = 0; b < XFER_LAT_BUCKETS; b++) {
            cum += se[i].st->lat_hist[b];
            if (b < XFER_LAT_BUCKETS - 1)
                snprintf(le, sizeof(le), "le=\"%.6g\"", (double)(8ull << b) * 1e-6);
            else
                snprintf(le, sizeof(le), "le=\"+Inf\"");
            put_u64(f, sample, &se[i], le, cum);
        }
        snprintf(sample, sizeof(sample), "%s_sum", name);
        snprintf(val, sizeof(val), "%.6f", (double)se[i].st->lat_us_sum * 1e-6);
        put_sample(f, sample, &se[i], NULL, val);
        snprintf(sample, sizeof(sample), "%s_count", name);
        put_u64(f, sample, &se[i], NULL, cum);
    }
}

static void render_scope(FILE *f, const char *scope, const struct series *se, size_t n)
{
    for (size_t c = 0; c < sizeof(counters) / sizeof(counters[0]); c++)
        render_counter(f, scope, &counters[c], se, n);
    render_latency(f, scope, se, n);
}

static void render_gauge(FILE *f, const char *name, const char *help, uint64_t v)
{
    static const struct series none = {0};
    fprintf(f, "# HELP %s %s\n# TYPE %s gauge\n", name, help, name);
    put_u64(f, name, &none, NULL, v);
}

static void render_info(FILE *f, const struct xfer_metrics_snapshot *s)
{
    static const struct series none = {0};
    fputs("# HELP xfer_build_info Node id and version of this xferd.\n"
          "# TYPE xfer_build_info gauge\nxfer_build_info{node=\"",
          f);
    put_escaped(f, s->node);
    fputs("\",version=\"" XFER_VERSION_STRING "\"} 1\n", f);
    if (s->live) {
        render_gauge(f, "xfer_up", "1 while xferd serves.", 1);
        fputs("# HELP xfer_uptime_seconds Seconds since xferd started.\n"
              "# TYPE xfer_uptime_seconds gauge\n",
              f);
        char val[32];
        snprintf(val, sizeof(val), "%.3f", (double)s->uptime_ms / 1000.0);
        put_sample(f, "xfer_uptime_seconds", &none, NULL, val);
    }
    if (s->have_registry) {
        render_gauge(f, "xfer_registry_connected", "1 when Redis is reachable.", s->reg.connected);
        render_gauge(f, "xfer_registry_known_peers", "Other nodes listed in the registry.",
                     s->reg.known_peers);
        render_gauge(f, "xfer_regions", "Regions this node publishes.", s->reg.regions);
    }
    fputs("# HELP xfer_peer_transport_info Transport in use towards each connected peer.\n"
          "# TYPE xfer_peer_transport_info gauge\n",
          f);
    for (size_t i = 0; i < s->npeers; i++) {
        if (!s->peers[i].transport[0])
            continue;
        fputs("xfer_peer_transport_info{peer=\"", f);
        put_escaped(f, s->peers[i].name);
        fputs("\",transport=\"", f);
        put_escaped(f, s->peers[i].transport);
        fputs("\"} 1\n", f);
    }
}

int xfer_metrics_render(const struct xfer_metrics_snapshot *s, char **out, size_t *len)
{
    if (!s || !out)
        return -XFER_EINVAL;
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (!f)
        return -XFER_ENOMEM;
    render_info(f, s);

    struct series node = {.st = &s->total};
    render_scope(f, "node", &node, 1);

    size_t cap = s->npeers > s->ntransports ? s->npeers : s->ntransports;
    struct series *se = calloc(cap ? cap : 1, sizeof(*se));
    if (se) {
        for (size_t i = 0; i < s->npeers; i++)
            se[i] = (struct series){"peer", s->peers[i].name, &s->peers[i].st};
        render_scope(f, "peer", se, s->npeers);
        for (size_t i = 0; i < s->ntransports; i++)
            se[i] = (struct series){"transport", s->transports[i].name, &s->transports[i].st};
        render_scope(f, "transport", se, s->ntransports);
        free(se);
    }
    bool failed = ferror(f) || !se;
    if (fclose(f) || failed) {
        free(buf);
        return -XFER_ENOMEM;
    }
    *out = buf;
    if (len)
        *len = n;
    return 0;
}
