/* Rows: descriptor structs <-> Redis hash fields. Everything read from Redis
 * is checked (present, numeric, in range, fits) before it is trusted. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reg_internal.h"

void reg_args_reset(struct reg_args *a)
{
    a->argc = 0;
    a->used = 0;
}

/* Arguments that do not fit are dropped; sizes are chosen so they always fit
 * (the longest row is ~1.5 KiB of the 4 KiB buffer, 32 of 48 arguments). */
static void args_push(struct reg_args *a, const char *s, size_t n)
{
    if (a->argc >= (int)(sizeof(a->argv) / sizeof(a->argv[0])) || a->used + n + 1 > sizeof(a->buf))
        return;
    char *dst = a->buf + a->used;
    memcpy(dst, s, n);
    dst[n] = '\0';
    a->used += n + 1;
    a->argv[a->argc] = dst;
    a->len[a->argc++] = n;
}

void reg_args_add(struct reg_args *a, const char *s)
{
    args_push(a, s, strlen(s));
}

void reg_args_addf(struct reg_args *a, const char *fmt, ...)
{
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    if (n >= 0)
        args_push(a, tmp, (size_t)n < sizeof(tmp) ? (size_t)n : sizeof(tmp) - 1);
}

static void add_pair(struct reg_args *a, const char *field, const char *value)
{
    reg_args_add(a, field);
    reg_args_add(a, value);
}

static void add_u64(struct reg_args *a, const char *field, uint64_t v)
{
    reg_args_add(a, field);
    reg_args_addf(a, "%" PRIu64, v);
}

void reg_args_node_fields(struct reg_args *a, const struct xfer_node_desc *n)
{
    char tr[64];
    if (xfer_transports_format(n->peer.transports, tr, sizeof(tr)))
        tr[0] = '\0';
    add_pair(a, "host", n->host);
    add_pair(a, "addr", n->peer.addr);
    add_u64(a, "ctrl_port", n->ctrl_port);
    add_u64(a, "data_port", n->peer.data_port);
    add_pair(a, "transports", tr);
    add_pair(a, "gpus", n->gpus);
    add_pair(a, "nics", n->peer.nics);
    if (n->peer.tcpx_port) /* tcpx control port (docs/tcpx.md) */
        add_u64(a, "tcpx_port", n->peer.tcpx_port);
    add_pair(a, "host_id", n->peer.host_id);
    add_u64(a, "pid", n->pid);
    add_pair(a, "version", n->version);
    add_u64(a, "started_ms", n->started_ms);
    add_u64(a, "heartbeat_ms", n->heartbeat_ms);
    add_u64(a, "incarnation", n->peer.incarnation);
}

void reg_args_region_fields(struct reg_args *a, const struct xfer_region_desc *d, uint64_t now)
{
    add_u64(a, "id", d->id);
    add_u64(a, "gen", d->gen);
    reg_args_add(a, "kind");
    if (d->kind == XFER_MEM_CUDA)
        reg_args_addf(a, "cuda:%d", d->device);
    else
        reg_args_add(a, "host");
    reg_args_add(a, "device");
    reg_args_addf(a, "%d", d->kind == XFER_MEM_CUDA ? d->device : -1);
    add_u64(a, "addr", d->addr);
    add_u64(a, "len", d->len);
    add_pair(a, "access", xfer_access_str(d->access));
    add_pair(a, "rkeys", d->rkeys);
    add_pair(a, "ipc", d->ipc);
    add_u64(a, "created_ms", now);
    add_pair(a, "dtype", d->layout.dtype);
    add_u64(a, "block_bytes", d->layout.block_bytes);
    add_u64(a, "num_blocks", d->layout.num_blocks);
    add_u64(a, "layers", d->layout.layers);
    add_pair(a, "tag", d->layout.tag);
}

/* ---- parsing ------------------------------------------------------------ */

struct row {
    const redisReply *rep; /* HGETALL reply: field, value, field, value... */
    const char *key;       /* for messages */
};

static const redisReply *row_get(const struct row *w, const char *field)
{
    for (size_t i = 0; i + 1 < w->rep->elements; i += 2) {
        const redisReply *f = w->rep->element[i];
        if (f->type == REDIS_REPLY_STRING && !strcmp(f->str, field))
            return w->rep->element[i + 1];
    }
    return NULL;
}

static int bad_field(const struct row *w, const char *field, const char *why)
{
    return reg_set_err(-XFER_EPROTO, "malformed registry row %s: field '%s' %s", w->key, field,
                       why);
}

/* Copies a string field into dst[cap]; missing optional fields give "". */
static int row_str(const struct row *w, const char *field, char *dst, size_t cap, bool required)
{
    const redisReply *v = row_get(w, field);
    dst[0] = '\0';
    if (!v)
        return required ? bad_field(w, field, "is missing") : 0;
    if (v->type != REDIS_REPLY_STRING)
        return bad_field(w, field, "is not a string");
    if (v->len >= cap || strlen(v->str) != v->len)
        return bad_field(w, field, v->len >= cap ? "is too long" : "contains NUL");
    memcpy(dst, v->str, v->len + 1);
    return 0;
}

/* Strict unsigned decimal, at most max; missing optional fields give 0. */
static int row_u64(const struct row *w, const char *field, uint64_t max, bool required,
                   uint64_t *out)
{
    char s[24];
    *out = 0;
    int rc = row_str(w, field, s, sizeof(s), required);
    if (rc || !row_get(w, field))
        return rc;
    uint64_t v = 0;
    if (!s[0])
        return bad_field(w, field, "is empty");
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9')
            return bad_field(w, field, "is not a number");
        if (v > (UINT64_MAX - (uint64_t)(*p - '0')) / 10)
            return bad_field(w, field, "overflows");
        v = v * 10 + (uint64_t)(*p - '0');
    }
    if (v > max)
        return bad_field(w, field, "is out of range");
    *out = v;
    return 0;
}

static int empty_or_missing(const redisReply *rep)
{
    if (!rep || rep->type != REDIS_REPLY_ARRAY)
        return reg_set_err(-XFER_EPROTO, "unexpected reply type to HGETALL");
    return rep->elements == 0 ? -XFER_ENOENT : 0;
}

#define TRY(x)                                                                                     \
    do {                                                                                           \
        int rc_ = (x);                                                                             \
        if (rc_)                                                                                   \
            return rc_;                                                                            \
    } while (0)

int reg_parse_node(const redisReply *rep, const char *node_id, struct xfer_node_desc *out)
{
    char key[REG_KEY_MAX];
    reg_key_node(key, node_id);
    struct row w = {rep, key};
    TRY(empty_or_missing(rep));
    memset(out, 0, sizeof(*out));
    snprintf(out->peer.node_id, sizeof(out->peer.node_id), "%s", node_id);
    char tr[64];
    uint64_t v;
    TRY(row_str(&w, "addr", out->peer.addr, sizeof(out->peer.addr), true));
    TRY(row_u64(&w, "data_port", 65535, true, &v));
    out->peer.data_port = (uint16_t)v;
    TRY(row_str(&w, "transports", tr, sizeof(tr), true));
    if (xfer_transports_parse(tr, &out->peer.transports))
        return bad_field(&w, "transports", "names an unknown transport");
    TRY(row_str(&w, "host_id", out->peer.host_id, sizeof(out->peer.host_id), true));
    TRY(row_u64(&w, "incarnation", UINT64_MAX, true, &out->peer.incarnation));
    TRY(row_str(&w, "nics", out->peer.nics, sizeof(out->peer.nics), false));
    TRY(row_u64(&w, "tcpx_port", 65535, false, &v));
    out->peer.tcpx_port = (uint16_t)v;
    TRY(row_str(&w, "host", out->host, sizeof(out->host), false));
    TRY(row_u64(&w, "ctrl_port", 65535, false, &v));
    out->ctrl_port = (uint16_t)v;
    TRY(row_str(&w, "gpus", out->gpus, sizeof(out->gpus), false));
    TRY(row_u64(&w, "pid", UINT32_MAX, false, &v));
    out->pid = (uint32_t)v;
    TRY(row_str(&w, "version", out->version, sizeof(out->version), false));
    TRY(row_u64(&w, "started_ms", UINT64_MAX, false, &out->started_ms));
    TRY(row_u64(&w, "heartbeat_ms", UINT64_MAX, false, &out->heartbeat_ms));
    return 0;
}

/* kind "host" | "cuda:<n>", cross-checked with the device field. */
static int parse_kind(const struct row *w, struct xfer_region_desc *out)
{
    char kind[24], dev[16];
    TRY(row_str(w, "kind", kind, sizeof(kind), true));
    TRY(row_str(w, "device", dev, sizeof(dev), false));
    if (!strcmp(kind, "host")) {
        out->kind = XFER_MEM_HOST;
        out->device = -1;
        return dev[0] && strcmp(dev, "-1") ? bad_field(w, "device", "must be -1 for host") : 0;
    }
    char *end;
    long n = strncmp(kind, "cuda:", 5) ? -1 : strtol(kind + 5, &end, 10);
    if (n < 0 || n > 1023 || !kind[5] || *end)
        return bad_field(w, "kind", "is neither 'host' nor 'cuda:<gpu>'");
    out->kind = XFER_MEM_CUDA;
    out->device = (int)n;
    if (dev[0] && atol(dev) != n)
        return bad_field(w, "device", "disagrees with kind");
    return 0;
}

int reg_parse_region(const redisReply *rep, const char *node_id, const char *name,
                     struct xfer_region_desc *out)
{
    char key[REG_KEY_MAX], acc[8];
    reg_key_region(key, node_id, name);
    struct row w = {rep, key};
    TRY(empty_or_missing(rep));
    memset(out, 0, sizeof(*out));
    snprintf(out->name, sizeof(out->name), "%s", name);
    uint64_t v;
    TRY(row_u64(&w, "id", UINT32_MAX, true, &v));
    out->id = (uint32_t)v;
    TRY(row_u64(&w, "gen", UINT32_MAX, true, &v));
    out->gen = (uint32_t)v;
    TRY(parse_kind(&w, out));
    TRY(row_u64(&w, "addr", UINT64_MAX, true, &out->addr));
    TRY(row_u64(&w, "len", UINT64_MAX, true, &out->len));
    TRY(row_str(&w, "access", acc, sizeof(acc), true));
    if (xfer_access_parse(acc, &out->access))
        return bad_field(&w, "access", "is not r, w or rw");
    TRY(row_str(&w, "rkeys", out->rkeys, sizeof(out->rkeys), false));
    TRY(row_str(&w, "ipc", out->ipc, sizeof(out->ipc), false));
    TRY(row_u64(&w, "created_ms", UINT64_MAX, false, &v));
    TRY(row_str(&w, "dtype", out->layout.dtype, sizeof(out->layout.dtype), false));
    TRY(row_u64(&w, "block_bytes", UINT64_MAX, false, &out->layout.block_bytes));
    TRY(row_u64(&w, "num_blocks", UINT64_MAX, false, &out->layout.num_blocks));
    TRY(row_u64(&w, "layers", UINT32_MAX, false, &v));
    out->layout.layers = (uint32_t)v;
    TRY(row_str(&w, "tag", out->layout.tag, sizeof(out->layout.tag), false));
    return 0;
}

/* ---- checks before publishing ---------------------------------------------- */

static bool fits(const char *s, size_t cap)
{
    return memchr(s, '\0', cap) != NULL;
}

int reg_check_node(const struct xfer_node_desc *n)
{
    if (!n)
        return reg_set_err(-XFER_EINVAL, "no node descriptor");
    const struct xfer_peer_desc *p = &n->peer;
    if (!fits(p->node_id, sizeof(p->node_id)) || !xfer_registry_name_ok(p->node_id))
        return reg_set_err(-XFER_EINVAL,
                           "bad node id (1..%d printable characters, no space, no braces)",
                           XFER_NAME_MAX - 1);
    if (!fits(p->addr, sizeof(p->addr)) || !p->addr[0])
        return reg_set_err(-XFER_EINVAL, "node %s: missing data address", p->node_id);
    if (!fits(p->host_id, sizeof(p->host_id)) || !fits(p->nics, sizeof(p->nics)) ||
        !fits(n->host, sizeof(n->host)) || !fits(n->gpus, sizeof(n->gpus)) ||
        !fits(n->version, sizeof(n->version)))
        return reg_set_err(-XFER_EINVAL, "node %s: unterminated string field", p->node_id);
    if (p->transports & ~(unsigned)XFER_TRANSPORT_ALL)
        return reg_set_err(-XFER_EINVAL, "node %s: unknown transport bits", p->node_id);
    return 0;
}

int reg_check_region(const struct xfer_region_desc *d)
{
    if (!fits(d->name, sizeof(d->name)) || !xfer_registry_name_ok(d->name))
        return reg_set_err(-XFER_EINVAL,
                           "bad region name (1..%d printable characters, no space, no braces)",
                           XFER_NAME_MAX - 1);
    if (!(d->access & XFER_ACCESS_RW) || (d->access & ~(unsigned)XFER_ACCESS_RW))
        return reg_set_err(-XFER_EINVAL, "region %s: access must be r, w or rw", d->name);
    if (d->kind != XFER_MEM_HOST && (d->kind != XFER_MEM_CUDA || d->device < 0 || d->device > 1023))
        return reg_set_err(-XFER_EINVAL, "region %s: bad memory kind/device", d->name);
    if (!fits(d->ipc, sizeof(d->ipc)) || !fits(d->rkeys, sizeof(d->rkeys)) ||
        !fits(d->layout.dtype, sizeof(d->layout.dtype)) ||
        !fits(d->layout.tag, sizeof(d->layout.tag)))
        return reg_set_err(-XFER_EINVAL, "region %s: unterminated string field", d->name);
    return 0;
}
