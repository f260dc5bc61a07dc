/* xferd configuration: defaults < file < environment < flags. */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <unistd.h>

void xferd_config_defaults(struct xferd_config *c)
{
    memset(c, 0, sizeof(*c));
    snprintf(c->redis_url, sizeof(c->redis_url), "redis://127.0.0.1:6379");
    snprintf(c->listen, sizeof(c->listen), "127.0.0.1");
    c->ttl_ms = 10000;
    c->heartbeat_ms = 0; /* derived: ttl / 3 */
    c->drain_ms = 5000;
    c->connect_timeout_ms = 3000;
    c->io_timeout_ms = 10000;
    c->sockets_per_peer = 4;
    c->progress_threads = 1;
    c->chunk_bytes = 1 << 20;
    c->busy_poll_us = 0;
    c->request_timeout_ms = 30000;
    c->workers = 4;
    c->metrics_port = XFERD_METRICS_PORT_DEFAULT;
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    c->max_region_bytes = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : 0;
}

static int parse_int(const char *s, int lo, int hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return -XFER_EINVAL;
    *out = (int)v;
    return 0;
}

static int copy_str(char *dst, size_t cap, const char *val)
{
    if (strlen(val) >= cap)
        return -XFER_EINVAL;
    memcpy(dst, val, strlen(val) + 1);
    return 0;
}

/* A name usable in "node/region" addresses and Redis keys. */
static bool name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n >= XFER_NAME_MAX)
        return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (!(isalnum(ch) || ch == '_' || ch == '-' || ch == '.'))
            return false;
    }
    return true;
}

static int set_region_key(struct xferd_region_conf *r, const char *key, const char *val)
{
    struct xfer_layout *l = &r->layout;
    uint64_t u;
    int v;
    if (!strcmp(key, "size"))
        return xferd_parse_size(val, &r->size);
    if (!strcmp(key, "access"))
        return xfer_access_parse(val, &r->access);
    if (!strcmp(key, "kind"))
        return strcmp(val, "host") ? -XFER_ENOTSUP : 0;
    if (!strcmp(key, "dtype"))
        return copy_str(l->dtype, sizeof(l->dtype), val);
    if (!strcmp(key, "tag"))
        return copy_str(l->tag, sizeof(l->tag), val);
    if (!strcmp(key, "block_bytes") || !strcmp(key, "num_blocks")) {
        int rc = xferd_parse_size(val, &u);
        if (rc)
            return rc;
        *(key[0] == 'b' ? &l->block_bytes : &l->num_blocks) = u;
        return 0;
    }
    if (!strcmp(key, "layers")) {
        int rc = parse_int(val, 0, 1 << 20, &v);
        l->layers = (uint32_t)v;
        return rc;
    }
    return -XFER_ENOENT;
}

struct int_key {
    const char *key;
    size_t off;
    int lo, hi;
};
#define IK(k, lo, hi)                                                                              \
    {                                                                                              \
#k, offsetof(struct xferd_config, k), lo, hi                                               \
    }
static const struct int_key int_keys[] = {
    IK(ttl_ms, 500, 3600000),
    IK(heartbeat_ms, 100, 3600000),
    IK(drain_ms, 0, 600000),
    IK(connect_timeout_ms, 100, 600000),
    IK(io_timeout_ms, 100, 3600000),
    IK(sockets_per_peer, 1, 64),
    IK(progress_threads, 1, 64),
    IK(chunk_bytes, 4096, 64 << 20),
    IK(busy_poll_us, 0, 1000000),
    IK(request_timeout_ms, 100, 3600000),
    IK(workers, 1, 64),
};

struct str_key {
    const char *key;
    size_t off, cap;
};
#define SK(k)                                                                                      \
    {                                                                                              \
#k, offsetof(struct xferd_config, k), sizeof(((struct xferd_config *)0)->k)                \
    }
static const struct str_key str_keys[] = {
    SK(redis_url),   SK(secret),    SK(transports),   SK(advertise),
    SK(ctrl_socket), SK(log_level), SK(metrics_addr),
};

static int set_port(const char *val, uint16_t *out)
{
    int v;
    if (parse_int(val, 0, 65535, &v))
        return -XFER_EINVAL;
    *out = (uint16_t)v;
    return 0;
}

/* "addr" or "addr:port" (port = data port). */
static int set_listen(struct xferd_config *c, const char *val)
{
    const char *colon = strrchr(val, ':');
    if (colon && !strchr(colon + 1, ']') && strchr(val, ':') == colon) {
        if (set_port(colon + 1, &c->data_port))
            return -XFER_EINVAL;
        size_t n = (size_t)(colon - val);
        if (n == 0 || n >= sizeof(c->listen))
            return -XFER_EINVAL;
        memcpy(c->listen, val, n);
        c->listen[n] = 0;
        return 0;
    }
    return copy_str(c->listen, sizeof(c->listen), val);
}

static int set_global_key(struct xferd_config *c, const char *key, const char *val)
{
    for (size_t i = 0; i < sizeof(int_keys) / sizeof(int_keys[0]); i++)
        if (!strcmp(key, int_keys[i].key))
            return parse_int(val, int_keys[i].lo, int_keys[i].hi,
                             (int *)((char *)c + int_keys[i].off));
    for (size_t i = 0; i < sizeof(str_keys) / sizeof(str_keys[0]); i++)
        if (!strcmp(key, str_keys[i].key))
            return copy_str((char *)c + str_keys[i].off, str_keys[i].cap, val);
    if (!strcmp(key, "node"))
        return name_ok(val) ? copy_str(c->node, sizeof(c->node), val) : -XFER_EINVAL;
    if (!strcmp(key, "listen"))
        return set_listen(c, val);
    if (!strcmp(key, "data_port"))
        return set_port(val, &c->data_port);
    if (!strcmp(key, "ctrl_port"))
        return set_port(val, &c->ctrl_port);
    if (!strcmp(key, "metrics_port")) {
        c->metrics_port_given = true;
        return set_port(val, &c->metrics_port);
    }
    if (!strcmp(key, "insecure")) {
        if (!strcmp(val, "true") || !strcmp(val, "1") || !strcmp(val, "yes"))
            c->insecure = true;
        else if (!strcmp(val, "false") || !strcmp(val, "0") || !strcmp(val, "no"))
            c->insecure = false;
        else
            return -XFER_EINVAL;
        return 0;
    }
    if (!strcmp(key, "max_region_bytes"))
        return xferd_parse_size(val, &c->max_region_bytes);
    if (!strcmp(key, "secret_file")) {
        FILE *f = fopen(val, "r");
        if (!f)
            return -XFER_ENOENT;
        size_t n = fread(c->secret, 1, sizeof(c->secret) - 1, f);
        fclose(f);
        while (n && (c->secret[n - 1] == '\n' || c->secret[n - 1] == '\r'))
            n--;
        c->secret[n] = 0;
        return 0;
    }
    if (!strcmp(key, "config"))
        return copy_str(c->config_path, sizeof(c->config_path), val);
    return -XFER_ENOENT;
}

/* "kv:64M:rw,ro:1M:r" (XFER_REGIONS, --regions, `regions =`): one
 * NAME:SIZE[:ACCESS] spec per comma-separated item. */
static int add_region_list(struct xferd_config *c, const char *list, char *why, size_t why_len)
{
    char buf[1024], *save = NULL;
    if (strlen(list) >= sizeof(buf)) {
        snprintf(why, why_len, "region list too long");
        return -XFER_EINVAL;
    }
    strcpy(buf, list);
    for (char *it = strtok_r(buf, ", \t", &save); it; it = strtok_r(NULL, ", \t", &save))
        if (xferd_config_add_region_spec(c, it, why, why_len))
            return -XFER_EINVAL;
    return 0;
}

int xferd_config_set(struct xferd_config *c, const char *key, const char *val, char *why,
                     size_t why_len)
{
    char k[64];
    size_t n = strlen(key);
    if (n >= sizeof(k)) {
        snprintf(why, why_len, "unknown key '%s'", key);
        return -XFER_EINVAL;
    }
    for (size_t i = 0; i <= n; i++)
        k[i] = key[i] == '-' ? '_' : key[i];
    if (!strcmp(k, "regions"))
        return add_region_list(c, val, why, why_len);
    if (!strcmp(k, "pool"))
        return xferd_config_add_pool_spec(c, val, why, why_len);
    int rc = set_global_key(c, k, val);
    if (rc == -XFER_ENOENT && !strcmp(k, "secret_file"))
        snprintf(why, why_len, "cannot read secret file '%s'", val);
    else if (rc == -XFER_ENOENT)
        snprintf(why, why_len, "unknown key '%s'", key);
    else if (rc)
        snprintf(why, why_len, "bad value '%s' for '%s'", val, key);
    return rc ? -XFER_EINVAL : 0;
}

int xferd_config_add_pool_spec(struct xferd_config *c, const char *spec, char *why, size_t why_len)
{
    const char *eq = strchr(spec, '=');
    size_t nl = eq ? (size_t)(eq - spec) : 0;
    char g[200];
    if (c->npools >= XFERD_MAX_POOLS) {
        snprintf(why, why_len, "more than %d pools", XFERD_MAX_POOLS);
        return -XFER_EINVAL;
    }
    struct xferd_pool_conf *p = &c->pools[c->npools];
    memset(p, 0, sizeof(*p));
    if (!eq || nl == 0 || nl >= sizeof(p->name)) {
        snprintf(why, why_len,
                 "bad pool '%s' (want NAME=LAYOUT:DTYPE:BLOCK_BYTES:NUM_BLOCKS:LAYERS[:KV[:TAG]])",
                 spec);
        return -XFER_EINVAL;
    }
    memcpy(p->name, spec, nl);
    if (!name_ok(p->name) || strpbrk(p->name, ".,")) {
        snprintf(why, why_len, "bad pool name '%s'", p->name);
        return -XFER_EINVAL;
    }
    if (xfer_kv_geom_parse(eq + 1, &p->geom, g, sizeof(g))) {
        snprintf(why, why_len, "pool %s: %s", p->name, g);
        return -XFER_EINVAL;
    }
    c->npools++;
    return 0;
}

int xferd_config_add_region_spec(struct xferd_config *c, const char *spec, char *why,
                                 size_t why_len)
{
    char buf[256], *save = NULL;
    if (strlen(spec) >= sizeof(buf) || c->nregions >= XFERD_MAX_REGIONS) {
        snprintf(why, why_len, "bad region '%s'", spec);
        return -XFER_EINVAL;
    }
    strcpy(buf, spec);
    const char *name = strtok_r(buf, ":", &save);
    const char *size = strtok_r(NULL, ":", &save);
    const char *access = strtok_r(NULL, ":", &save);
    struct xferd_region_conf *r = &c->regions[c->nregions];
    memset(r, 0, sizeof(*r));
    r->access = XFER_ACCESS_RW;
    if (!name || !size || !name_ok(name) || xferd_parse_size(size, &r->size) || !r->size ||
        (access && xfer_access_parse(access, &r->access))) {
        snprintf(why, why_len, "bad region '%s' (want NAME:SIZE[:r|w|rw])", spec);
        return -XFER_EINVAL;
    }
    strcpy(r->name, name);
    c->nregions++;
    return 0;
}

static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1]))
        *--e = 0;
    return s;
}

/* "[region NAME]" -> starts a region section. */
static int file_section(struct xferd_config *c, char *line, struct xferd_region_conf **cur)
{
    char *end = strchr(line, ']');
    if (!end || trim(end + 1)[0])
        return -XFER_EINVAL;
    *end = 0;
    char *body = trim(line + 1);
    if (strncmp(body, "region", 6) || !isspace((unsigned char)body[6]))
        return -XFER_EINVAL;
    char *name = trim(body + 6);
    if (!name_ok(name) || c->nregions >= XFERD_MAX_REGIONS)
        return -XFER_EINVAL;
    *cur = &c->regions[c->nregions++];
    memset(*cur, 0, sizeof(**cur));
    strcpy((*cur)->name, name);
    (*cur)->access = XFER_ACCESS_RW;
    return 0;
}

static int file_line(struct xferd_config *c, char *line, struct xferd_region_conf **cur, char *why,
                     size_t why_len)
{
    char *hash = strchr(line, '#');
    if (hash)
        *hash = 0;
    line = trim(line);
    if (!*line)
        return 0;
    if (*line == '[') {
        if (file_section(c, line, cur) == 0)
            return 0;
        snprintf(why, why_len, "bad section (want [region NAME])");
        return -XFER_EINVAL;
    }
    char *eq = strchr(line, '=');
    if (!eq) {
        snprintf(why, why_len, "expected 'key = value'");
        return -XFER_EINVAL;
    }
    *eq = 0;
    char *key = trim(line), *val = trim(eq + 1);
    if (!*cur)
        return xferd_config_set(c, key, val, why, why_len);
    int rc = set_region_key(*cur, key, val);
    if (rc == -XFER_ENOENT)
        snprintf(why, why_len, "unknown region key '%s'", key);
    else if (rc)
        snprintf(why, why_len, "bad value '%s' for '%s'", val, key);
    return rc ? -XFER_EINVAL : 0;
}

int xferd_config_load_file(struct xferd_config *c, const char *path, char *why, size_t why_len)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(why, why_len, "%s: %s", path, strerror(errno));
        return -XFER_ENOENT;
    }
    char line[1024], detail[200];
    struct xferd_region_conf *cur = NULL;
    int lineno = 0, rc = 0;
    while (fgets(line, sizeof(line), f)) {
        lineno++;
        if (!strchr(line, '\n') && !feof(f)) {
            snprintf(why, why_len, "%s:%d: line too long", path, lineno);
            rc = -XFER_EINVAL;
            break;
        }
        rc = file_line(c, line, &cur, detail, sizeof(detail));
        if (rc) {
            snprintf(why, why_len, "%s:%d: %s", path, lineno, detail);
            break;
        }
    }
    fclose(f);
    return rc;
}

static const char *const env_keys[][2] = {
    {"XFER_NODE", "node"},
    {"XFER_REDIS_URL", "redis_url"},
    {"XFER_SECRET", "secret"},
    {"XFER_SECRET_FILE", "secret_file"},
    {"XFER_TRANSPORTS", "transports"},
    {"XFER_LISTEN", "listen"},
    {"XFER_ADVERTISE", "advertise"},
    {"XFER_DATA_PORT", "data_port"},
    {"XFER_CTRL_PORT", "ctrl_port"},
    {"XFER_CTRL_SOCKET", "ctrl_socket"},
    {"XFER_TTL_MS", "ttl_ms"},
    {"XFER_HEARTBEAT_MS", "heartbeat_ms"},
    {"XFER_DRAIN_MS", "drain_ms"},
    {"XFER_CONNECT_TIMEOUT_MS", "connect_timeout_ms"},
    {"XFER_IO_TIMEOUT_MS", "io_timeout_ms"},
    {"XFER_SOCKETS_PER_PEER", "sockets_per_peer"},
    {"XFER_PROGRESS_THREADS", "progress_threads"},
    {"XFER_CHUNK_BYTES", "chunk_bytes"},
    {"XFER_BUSY_POLL_US", "busy_poll_us"},
    {"XFER_REQUEST_TIMEOUT_MS", "request_timeout_ms"},
    {"XFER_WORKERS", "workers"},
    {"XFER_METRICS_PORT", "metrics_port"},
    {"XFER_METRICS_ADDR", "metrics_addr"},
    {"XFER_MAX_REGION_BYTES", "max_region_bytes"},
    {"XFER_INSECURE", "insecure"},
    {"XFER_REGIONS", "regions"},
};

int xferd_config_load_env(struct xferd_config *c, char *why, size_t why_len)
{
    char detail[200];
    for (size_t i = 0; i < sizeof(env_keys) / sizeof(env_keys[0]); i++) {
        const char *v = getenv(env_keys[i][0]);
        if (!v || !*v)
            continue;
        if (xferd_config_set(c, env_keys[i][1], v, detail, sizeof(detail))) {
            snprintf(why, why_len, "%s: %s", env_keys[i][0], detail);
            return -XFER_EINVAL;
        }
    }
    return 0;
}

bool xferd_addr_is_loopback(const char *a)
{
    struct in_addr v4;
    if (inet_pton(AF_INET, a, &v4) == 1)
        return (ntohl(v4.s_addr) >> 24) == 127;
    return !strcmp(a, "::1") || !strcmp(a, "localhost");
}

bool xferd_config_unauthenticated_exposed(const struct xferd_config *c)
{
    /* (/metrics is read-only and does not count) */
    return !c->secret[0] && !xferd_addr_is_loopback(c->listen);
}

int xferd_config_finish(struct xferd_config *c, char *why, size_t why_len)
{
    if (!c->node[0]) {
        snprintf(why, why_len, "no node id (use --node, XFER_NODE or 'node =')");
        return -XFER_EINVAL;
    }
    if (!c->heartbeat_ms)
        c->heartbeat_ms = c->ttl_ms / 3 > 100 ? c->ttl_ms / 3 : 100;
    if (c->heartbeat_ms >= c->ttl_ms) {
        snprintf(why, why_len, "heartbeat_ms (%d) must be below ttl_ms (%d)", c->heartbeat_ms,
                 c->ttl_ms);
        return -XFER_EINVAL;
    }
    if (!c->ctrl_socket[0])
        snprintf(c->ctrl_socket, sizeof(c->ctrl_socket), "/tmp/xferd-%s.sock", c->node);
    if (!c->advertise[0] && (!strcmp(c->listen, "0.0.0.0") || !strcmp(c->listen, "::"))) {
        snprintf(why, why_len, "listening on %s: set advertise (the address peers should use)",
                 c->listen);
        return -XFER_EINVAL;
    }
    if (!c->advertise[0])
        memcpy(c->advertise, c->listen, sizeof(c->advertise));
    /* Anyone who reaches an unauthenticated control or data port can read
     * and write every registered region: only on purpose. */
    if (xferd_config_unauthenticated_exposed(c) && !c->insecure) {
        snprintf(why, why_len,
                 "listening on %s with no cluster secret: anyone who reaches it could read and "
                 "write this node's memory; set a secret (--secret-file, XFER_SECRET_FILE) or "
                 "pass --insecure (insecure = true) to serve unauthenticated",
                 c->listen);
        return -XFER_EINVAL;
    }
    unsigned mask;
    if (c->transports[0] && xfer_transports_parse(c->transports, &mask)) {
        snprintf(why, why_len, "unknown transport in '%s'", c->transports);
        return -XFER_EINVAL;
    }
    for (int i = 0; i < c->nregions; i++) {
        struct xferd_region_conf *r = &c->regions[i];
        if (!r->size) {
            snprintf(why, why_len, "region '%s' has no size", r->name);
            return -XFER_EINVAL;
        }
        for (int j = 0; j < i; j++)
            if (!strcmp(c->regions[j].name, r->name)) {
                snprintf(why, why_len, "region '%s' declared twice", r->name);
                return -XFER_EINVAL;
            }
    }
    return 0;
}
