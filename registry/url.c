/* Redis URL parsing (redis://, unix://, redis-sentinel://, redis-cluster://) and
 * name validation. */
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xfer_registry.h"

static int url_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int url_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -XFER_EINVAL;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    c = (char)tolower((unsigned char)c);
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* Copies [s, s+n) to dst decoding %XX; false when it does not fit or an
 * escape is bad. */
static bool copy_decoded(char *dst, size_t cap, const char *s, size_t n)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c == '%') {
            if (i + 2 >= n)
                return false;
            int hi = hexval(s[i + 1]), lo = hexval(s[i + 2]);
            if (hi < 0 || lo < 0)
                return false;
            c = (char)(hi * 16 + lo);
            i += 2;
        }
        if (o + 1 >= cap)
            return false;
        dst[o++] = c;
    }
    dst[o] = '\0';
    return true;
}

/* Strict decimal in [lo, hi]. */
static bool parse_int(const char *s, size_t n, long lo, long hi, int *out)
{
    if (n == 0 || n > 9)
        return false;
    long v = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isdigit((unsigned char)s[i]))
            return false;
        v = v * 10 + (s[i] - '0');
    }
    if (v < lo || v > hi)
        return false;
    *out = (int)v;
    return true;
}

static int parse_unix(const char *p, struct xfer_redis_url *out, char *err, size_t errlen)
{
    const char *q = strchr(p, '?');
    size_t n = q ? (size_t)(q - p) : strlen(p);
    if (n == 0 || p[0] != '/')
        return url_err(err, errlen, "unix URL needs an absolute path: unix:///path");
    if (!copy_decoded(out->host, sizeof(out->host), p, n))
        return url_err(err, errlen, "unix socket path too long or badly escaped");
    if (q) {
        if (strncmp(q, "?db=", 4) || !parse_int(q + 4, strlen(q + 4), 0, 100000, &out->db))
            return url_err(err, errlen, "unix URL: only '?db=N' is understood after the path");
    }
    out->is_unix = true;
    return 0;
}

static int parse_userinfo(const char *p, size_t n, struct xfer_redis_url *out, char *err,
                          size_t errlen)
{
    const char *colon = memchr(p, ':', n);
    size_t ulen = colon ? (size_t)(colon - p) : n;
    if (!colon) /* "redis://secret@host": a password alone, like redis-cli -u */
        return copy_decoded(out->password, sizeof(out->password), p, n)
                   ? 0
                   : url_err(err, errlen, "password too long or badly escaped");
    if (!copy_decoded(out->user, sizeof(out->user), p, ulen))
        return url_err(err, errlen, "user name too long or badly escaped");
    if (!copy_decoded(out->password, sizeof(out->password), colon + 1, n - ulen - 1))
        return url_err(err, errlen, "password too long or badly escaped");
    if (out->user[0] && !out->password[0])
        return url_err(err, errlen, "user '%s' given without a password", out->user);
    return 0;
}

static int parse_hostport(const char *p, size_t n, struct xfer_redis_hostport *out, char *err,
                          size_t errlen)
{
    const char *host = p, *port = NULL;
    size_t hlen;
    if (n && p[0] == '[') { /* [v6]:port */
        const char *close = memchr(p, ']', n);
        if (!close)
            return url_err(err, errlen, "unterminated '[' in host");
        host = p + 1;
        hlen = (size_t)(close - host);
        if (close + 1 < p + n) {
            if (close[1] != ':')
                return url_err(err, errlen, "garbage after ']' in host");
            port = close + 2;
        }
    } else {
        const char *colon = memchr(p, ':', n);
        hlen = colon ? (size_t)(colon - p) : n;
        port = colon ? colon + 1 : NULL;
    }
    if (hlen == 0)
        return url_err(err, errlen, "missing host");
    if (hlen >= sizeof(out->host))
        return url_err(err, errlen, "host name too long");
    memcpy(out->host, host, hlen);
    out->host[hlen] = '\0';
    if (port && !parse_int(port, (size_t)(p + n - port), 1, 65535, &out->port))
        return url_err(err, errlen, "bad port '%.*s' (1..65535)", (int)(p + n - port), port);
    return 0;
}

/* "h[:p],h[:p]..." of a sentinel or cluster URL into out->seeds. */
static int parse_seeds(const char *p, size_t n, int defport, struct xfer_redis_url *out, char *err,
                       size_t errlen)
{
    const char *end = p + n;
    while (p <= end) {
        const char *comma = memchr(p, ',', (size_t)(end - p));
        size_t len = comma ? (size_t)(comma - p) : (size_t)(end - p);
        if (out->n_seeds == XFER_REDIS_MAX_SEEDS)
            return url_err(err, errlen, "more than %d hosts", XFER_REDIS_MAX_SEEDS);
        struct xfer_redis_hostport *hp = &out->seeds[out->n_seeds];
        hp->port = defport;
        int rc = parse_hostport(p, len, hp, err, errlen);
        if (rc)
            return rc;
        out->n_seeds++;
        if (!comma)
            break;
        p = comma + 1;
    }
    memcpy(out->host, out->seeds[0].host, sizeof(out->host));
    out->port = out->seeds[0].port;
    return 0;
}

/* "/MASTER[/db]" of a sentinel URL. */
static int parse_master(const char *path, struct xfer_redis_url *out, char *err, size_t errlen)
{
    if (!path || !path[1])
        return url_err(err, errlen,
                       "sentinel URL needs the master name: "
                       "redis-sentinel://host:port[,host:port...]/MASTER[/db]");
    const char *name = path + 1, *slash = strchr(name, '/');
    size_t n = slash ? (size_t)(slash - name) : strlen(name);
    if (n == 0 || n >= sizeof(out->master))
        return url_err(err, errlen, "master name empty or longer than %zu characters",
                       sizeof(out->master) - 1);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)name[i] <= 0x20 || (unsigned char)name[i] >= 0x7f)
            return url_err(err, errlen, "master name '%.*s': printable characters only", (int)n,
                           name);
    memcpy(out->master, name, n);
    out->master[n] = '\0';
    if (slash && slash[1] && !parse_int(slash + 1, strlen(slash + 1), 0, 100000, &out->db))
        return url_err(err, errlen, "bad database number '%s'", slash + 1);
    return 0;
}

int xfer_redis_url_parse(const char *url, struct xfer_redis_url *out, char *err, size_t errlen)
{
    if (!url || !out)
        return url_err(err, errlen, "no URL");
    memset(out, 0, sizeof(*out));
    out->port = 6379;
    if (!strncmp(url, "unix://", 7))
        return parse_unix(url + 7, out, err, errlen);
    const char *p;
    if (!strncmp(url, "redis://", 8)) {
        p = url + 8;
    } else if (!strncmp(url, "redis-sentinel://", 17)) {
        p = url + 17;
        out->mode = XFER_REDIS_SENTINEL;
    } else if (!strncmp(url, "redis-cluster://", 16)) {
        p = url + 16;
        out->mode = XFER_REDIS_CLUSTER;
    } else {
        return url_err(err, errlen,
                       "'%s': URL must start with redis://, unix://, redis-sentinel:// or "
                       "redis-cluster://",
                       url);
    }
    const char *slash = strchr(p, '/');
    size_t auth_len = slash ? (size_t)(slash - p) : strlen(p);
    const char *at = memrchr(p, '@', auth_len);
    if (at) {
        int rc = parse_userinfo(p, (size_t)(at - p), out, err, errlen);
        if (rc)
            return rc;
        auth_len -= (size_t)(at + 1 - p);
        p = at + 1;
    }
    if (out->mode == XFER_REDIS_SENTINEL) {
        int rc = parse_seeds(p, auth_len, 26379, out, err, errlen);
        return rc ? rc : parse_master(slash, out, err, errlen);
    }
    if (out->mode == XFER_REDIS_CLUSTER) {
        int rc = parse_seeds(p, auth_len, 6379, out, err, errlen);
        if (!rc && slash && slash[1] && strcmp(slash, "/0"))
            rc = url_err(err, errlen, "Redis Cluster has database 0 only (got '%s')", slash);
        return rc;
    }
    struct xfer_redis_hostport hp = {.port = 6379};
    int rc = parse_hostport(p, auth_len, &hp, err, errlen);
    if (rc)
        return rc;
    memcpy(out->host, hp.host, sizeof(out->host));
    out->port = hp.port;
    if (slash && slash[1] && !parse_int(slash + 1, strlen(slash + 1), 0, 100000, &out->db))
        return url_err(err, errlen, "bad database number '%s'", slash + 1);
    return 0;
}

bool xfer_registry_name_ok(const char *name)
{
    if (!name)
        return false;
    size_t n = strlen(name);
    if (n == 0 || n >= XFER_NAME_MAX)
        return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)name[i];
        if (c <= 0x20 || c >= 0x7f || c == '{' || c == '}')
            return false;
    }
    return true;
}
