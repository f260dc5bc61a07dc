/* xferctl output: tables for people, JSON for scripts. */
#include "ctl_print.h"
#include "frame.h"
#include "progress.h"

#include <inttypes.h>
#include <string.h>
#include <sys/time.h>

void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < 0x20)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

static uint64_t unix_ms(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (uint64_t)tv.tv_sec * 1000 + (uint64_t)tv.tv_usec / 1000;
}

void print_peers(FILE *f, const Xctl__PeerList *pl, bool json)
{
    uint64_t now = unix_ms();
    if (json) {
        fputc('[', f);
        for (size_t i = 0; i < pl->n_peers; i++) {
            const Xctl__Peer *p = pl->peers[i];
            fprintf(f, "%s{\"node\":", i ? "," : "");
            json_str(f, p->node);
            fputs(",\"addr\":", f);
            json_str(f, p->addr);
            fprintf(f, ",\"ctrl_port\":%u,\"data_port\":%u,\"transports\":", p->ctrl_port,
                    p->data_port);
            json_str(f, p->transports);
            fputs(",\"host_id\":", f);
            json_str(f, p->host_id);
            fprintf(f,
                    ",\"incarnation\":\"%016" PRIx64 "\",\"heartbeat_ms\":%" PRIu64
                    ",\"connected\":%s,\"transport\":",
                    p->incarnation, p->heartbeat_ms, p->connected ? "true" : "false");
            json_str(f, p->transport);
            fputc('}', f);
        }
        fputs("]\n", f);
        return;
    }
    fprintf(f, "%-16s %-22s %-6s %-6s %-12s %-10s %s\n", "NODE", "ADDR", "CTRL", "DATA",
            "TRANSPORTS", "CONNECTED", "HEARTBEAT");
    for (size_t i = 0; i < pl->n_peers; i++) {
        const Xctl__Peer *p = pl->peers[i];
        char age[32];
        if (p->heartbeat_ms && p->heartbeat_ms <= now)
            snprintf(age, sizeof(age), "%.1fs ago", (double)(now - p->heartbeat_ms) / 1000);
        else
            snprintf(age, sizeof(age), "-");
        fprintf(f, "%-16s %-22s %-6u %-6u %-12s %-10s %s\n", p->node, p->addr, p->ctrl_port,
                p->data_port, p->transports, p->connected ? p->transport : "no", age);
    }
}

static void layout_json(FILE *f, const Xctl__Layout *l)
{
    if (!l) {
        fputs("null", f);
        return;
    }
    fputs("{\"dtype\":", f);
    json_str(f, l->dtype);
    fprintf(f, ",\"block_bytes\":%" PRIu64 ",\"num_blocks\":%" PRIu64 ",\"layers\":%u,\"tag\":",
            l->block_bytes, l->num_blocks, l->layers);
    json_str(f, l->tag);
    fputc('}', f);
}

void print_regions(FILE *f, const Xctl__RegionList *rl, bool json)
{
    if (json) {
        fputc('[', f);
        for (size_t i = 0; i < rl->n_regions; i++) {
            const Xctl__Region *r = rl->regions[i];
            fprintf(f, "%s{\"node\":", i ? "," : "");
            json_str(f, r->node);
            fputs(",\"name\":", f);
            json_str(f, r->name);
            fprintf(f,
                    ",\"id\":%u,\"gen\":%u,\"kind\":\"%s\",\"device\":%d,\"len\":%" PRIu64
                    ",\"access\":\"%s\",\"layout\":",
                    r->id, r->gen, r->kind, r->device, r->len, r->access);
            layout_json(f, r->layout);
            fputc('}', f);
        }
        fputs("]\n", f);
        return;
    }
    fprintf(f, "%-12s %-20s %-5s %-5s %-8s %-14s %-6s %s\n", "NODE", "REGION", "ID", "GEN", "KIND",
            "LEN", "ACCESS", "LAYOUT");
    for (size_t i = 0; i < rl->n_regions; i++) {
        const Xctl__Region *r = rl->regions[i];
        char kind[24], lay[200] = "-";
        if (!strcmp(r->kind, "cuda"))
            snprintf(kind, sizeof(kind), "cuda:%d", r->device);
        else
            snprintf(kind, sizeof(kind), "%s", r->kind);
        if (r->layout)
            snprintf(lay, sizeof(lay), "%s block=%" PRIu64 " blocks=%" PRIu64 " layers=%u%s%s",
                     r->layout->dtype[0] ? r->layout->dtype : "-", r->layout->block_bytes,
                     r->layout->num_blocks, r->layout->layers, r->layout->tag[0] ? " tag=" : "",
                     r->layout->tag);
        fprintf(f, "%-12s %-20s %-5u %-5u %-8s %-14" PRIu64 " %-6s %s\n", r->node, r->name, r->id,
                r->gen, kind, r->len, r->access, lay);
    }
}

static void stats_json(FILE *f, const Xctl__Stats *s)
{
    if (!s) {
        fputs("null", f);
        return;
    }
    fprintf(f,
            "{\"ops_read\":%" PRIu64 ",\"ops_write\":%" PRIu64 ",\"bytes_read\":%" PRIu64
            ",\"bytes_written\":%" PRIu64 ",\"errors\":%" PRIu64 ",\"served_ops\":%" PRIu64
            ",\"served_bytes\":%" PRIu64 ",\"served_errors\":%" PRIu64 ",\"lat_us_sum\":%" PRIu64
            "}",
            s->ops_read, s->ops_write, s->bytes_read, s->bytes_written, s->errors, s->served_ops,
            s->served_bytes, s->served_errors, s->lat_us_sum);
}

static void stats_row(FILE *f, const char *what, const char *name, const Xctl__Stats *s)
{
    if (!s)
        return;
    uint64_t ops = s->ops_read + s->ops_write;
    fprintf(f,
            "%-10s %-14s %10" PRIu64 " %10" PRIu64 " %14" PRIu64 " %14" PRIu64 " %8" PRIu64
            " %10" PRIu64 " %14" PRIu64 " %8" PRIu64 " %10.1f\n",
            what, name, s->ops_read, s->ops_write, s->bytes_read, s->bytes_written, s->errors,
            s->served_ops, s->served_bytes, s->served_errors,
            ops ? (double)s->lat_us_sum / (double)ops : 0.0);
}

void print_stats(FILE *f, const Xctl__StatsInfo *si, bool json)
{
    if (json) {
        fputs("{\"node\":", f);
        json_str(f, si->node);
        fputs(",\"total\":", f);
        stats_json(f, si->total);
        fprintf(f, ",\"ctl_requests\":%" PRIu64 ",\"ctl_errors\":%" PRIu64 ",\"peers\":{",
                si->ctl_requests, si->ctl_errors);
        for (size_t i = 0; i < si->n_peers; i++) {
            fputs(i ? "," : "", f);
            json_str(f, si->peers[i]->name);
            fputc(':', f);
            stats_json(f, si->peers[i]->stats);
        }
        fputs("},\"transports\":{", f);
        for (size_t i = 0; i < si->n_transports; i++) {
            fputs(i ? "," : "", f);
            json_str(f, si->transports[i]->name);
            fputc(':', f);
            stats_json(f, si->transports[i]->stats);
        }
        fputs("}}\n", f);
        return;
    }
    fprintf(f, "node %s: %" PRIu64 " control requests, %" PRIu64 " failed\n", si->node,
            si->ctl_requests, si->ctl_errors);
    fprintf(f, "%-10s %-14s %10s %10s %14s %14s %8s %10s %14s %8s %10s\n", "SCOPE", "NAME", "READS",
            "WRITES", "BYTES_READ", "BYTES_WRITTEN", "ERRORS", "SERVED", "SERVED_BYTES", "REFUSED",
            "AVG_US");
    stats_row(f, "total", si->node, si->total);
    for (size_t i = 0; i < si->n_peers; i++)
        stats_row(f, "peer", si->peers[i]->name, si->peers[i]->stats);
    for (size_t i = 0; i < si->n_transports; i++)
        stats_row(f, "transport", si->transports[i]->name, si->transports[i]->stats);
}

void print_health(FILE *f, const Xctl__HealthInfo *h, bool json)
{
    if (json) {
        fputs("{\"node\":", f);
        json_str(f, h->node);
        fprintf(f,
                ",\"version\":\"%s\",\"incarnation\":\"%016" PRIx64 "\",\"uptime_ms\":%" PRIu64
                ",\"registry_ok\":%s,\"draining\":%s,\"transports\":",
                h->version, h->incarnation, h->uptime_ms, h->registry_ok ? "true" : "false",
                h->draining ? "true" : "false");
        json_str(f, h->transports);
        fputs("}\n", f);
        return;
    }
    fprintf(f, "node %s: ok, version %s, up %.1fs, transports %s, registry %s%s\n", h->node,
            h->version, (double)h->uptime_ms / 1000, h->transports,
            h->registry_ok ? "connected" : "UNREACHABLE (serving from cache)",
            h->draining ? ", draining" : "");
}

void print_batch(FILE *f, const Xctl__BatchResult *b, bool json)
{
    if (json) {
        fprintf(f, "{\"batch_id\":%" PRIu64 ",\"done\":%s,\"items\":[", b->batch_id,
                b->done ? "true" : "false");
        for (size_t i = 0; i < b->n_items; i++) {
            const Xctl__ItemResult *r = b->items[i];
            fprintf(f, "%s{\"status\":%d,\"message\":", i ? "," : "", r->status);
            json_str(f, r->message);
            fputs(",\"executor\":", f);
            json_str(f, r->executor);
            fprintf(f, ",\"elapsed_us\":%" PRIu64 ",\"bytes\":%" PRIu64 "}", r->elapsed_us,
                    r->bytes);
        }
        fputs("]}\n", f);
        return;
    }
    fprintf(f, "batch %" PRIu64 ": %s\n", b->batch_id, b->done ? "done" : "running");
    for (size_t i = 0; i < b->n_items; i++) {
        const Xctl__ItemResult *r = b->items[i];
        fprintf(f, "  item %zu: %s%s%s (%" PRIu64 " bytes by %s in %" PRIu64 " us)\n", i,
                r->status ? "FAILED: " : "ok", r->message, "", r->bytes, r->executor,
                r->elapsed_us);
    }
}
