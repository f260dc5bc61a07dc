/* Redis Cluster router (see cluster.h): CRC16 slots, slot map from CLUSTER
 * SLOTS, a connection per node, batches sent per slot with redirects
 * followed. Not thread-safe: the registry calls it with cmd_lock held. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "cluster.h"
#include "reg_internal.h"

/* ---- slots ----------------------------------------------------------------- */

unsigned rcl_crc16(const char *buf, size_t len)
{
    unsigned crc = 0; /* CRC16-CCITT (XMODEM), as in the Redis Cluster spec */
    for (size_t i = 0; i < len; i++) {
        crc ^= (unsigned)(unsigned char)buf[i] << 8;
        for (int b = 0; b < 8; b++)
            crc = crc & 0x8000 ? (crc << 1) ^ 0x1021 : crc << 1;
        crc &= 0xffff;
    }
    return crc;
}

unsigned rcl_key_slot(const char *key, size_t len)
{
    size_t s = 0, e;
    while (s < len && key[s] != '{')
        s++;
    if (s == len)
        return rcl_crc16(key, len) & (RCL_SLOTS - 1);
    for (e = s + 1; e < len && key[e] != '}'; e++)
        ;
    if (e == len || e == s + 1) /* no '}' or "{}": the whole key */
        return rcl_crc16(key, len) & (RCL_SLOTS - 1);
    return rcl_crc16(key + s + 1, e - s - 1) & (RCL_SLOTS - 1);
}

static bool cmd_is(const char *argv0, const char *name)
{
    return !strcasecmp(argv0, name);
}

int rcl_command_slot(int argc, const char **argv, const size_t *lens)
{
    static const char *const keyless[] = {"MULTI", "EXEC", "DISCARD", "PUBLISH", "PING", "ASKING"};
    for (size_t i = 0; i < sizeof(keyless) / sizeof(keyless[0]); i++)
        if (cmd_is(argv[0], keyless[i]))
            return -1;
    int k = 1;
    if (cmd_is(argv[0], "EVAL") || cmd_is(argv[0], "EVALSHA"))
        k = argc > 2 && atoi(argv[2]) > 0 ? 3 : argc; /* numkeys, then the keys */
    if (k >= argc)
        return -1;
    return (int)rcl_key_slot(argv[k], lens ? lens[k] : strlen(argv[k]));
}

/* ---- nodes and connections -------------------------------------------------- */

static void set_err(struct rcl *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_err(struct rcl *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof(c->err), fmt, ap);
    va_end(ap);
}

void rcl_init(struct rcl *c, const struct xfer_redis_url *u, int timeout_ms)
{
    memset(c, 0, sizeof(*c));
    c->url = u;
    c->timeout_ms = timeout_ms;
    memset(c->owner, 0xff, sizeof(c->owner)); /* -1 */
}

static void drop_conn(struct rcl_node *n)
{
    if (n->ctx)
        redisFree(n->ctx);
    n->ctx = NULL;
}

void rcl_close(struct rcl *c)
{
    for (int i = 0; i < c->n_nodes; i++)
        drop_conn(&c->nodes[i]);
}

/* Index of host:port, added when new; -1 when the table is full. */
static int node_index(struct rcl *c, const char *host, int port)
{
    for (int i = 0; i < c->n_nodes; i++)
        if (c->nodes[i].port == port && !strcmp(c->nodes[i].host, host))
            return i;
    if (c->n_nodes == RCL_MAX_NODES || strlen(host) >= sizeof(c->nodes[0].host))
        return -1;
    struct rcl_node *n = &c->nodes[c->n_nodes];
    snprintf(n->host, sizeof(n->host), "%s", host);
    n->port = port;
    n->ctx = NULL;
    return c->n_nodes++;
}

/* Connected (and logged in) context of node i; NULL with c->err. */
static redisContext *node_conn(struct rcl *c, int i, int *err)
{
    struct rcl_node *n = &c->nodes[i];
    if (n->ctx)
        return n->ctx;
    struct timeval tv = {.tv_sec = c->timeout_ms / 1000, .tv_usec = (c->timeout_ms % 1000) * 1000};
    redisContext *x = redisConnectWithTimeout(n->host, n->port, tv);
    if (!x || x->err || redisSetTimeout(x, tv) != REDIS_OK) {
        set_err(c, "cluster node %s:%d: %s", n->host, n->port, x ? x->errstr : "out of memory");
        *err = -XFER_EUNAVAIL;
        if (x)
            redisFree(x);
        return NULL;
    }
    char who[XFER_REG_HOST_MAX + 24];
    snprintf(who, sizeof(who), "cluster node %s:%d", n->host, n->port);
    if ((*err = reg_redis_login(c->url, who, x))) {
        set_err(c, "%s", xfer_registry_last_error(NULL));
        redisFree(x);
        return NULL;
    }
    n->ctx = x;
    return x;
}

/* ---- slot map ----------------------------------------------------------------- */

static bool int_in(const redisReply *e, long long lo, long long hi)
{
    return e->type == REDIS_REPLY_INTEGER && e->integer >= lo && e->integer <= hi;
}

/* Parses a CLUSTER SLOTS reply into owner[] (node indexes); returns the
 * number of slots covered, or -1 with c->err. asked: the node answering
 * (its address stands in for an empty ip). */
static int parse_slots(struct rcl *c, const redisReply *rep, const struct rcl_node *asked,
                       int16_t *owner)
{
    const char *who = asked->host;
    if (rep->type == REDIS_REPLY_ERROR) {
        set_err(c, "%s:%d: CLUSTER SLOTS: %s", who, asked->port, rep->str);
        return -1;
    }
    if (rep->type != REDIS_REPLY_ARRAY) {
        set_err(c, "%s:%d: CLUSTER SLOTS: reply of type %d, not an array", who, asked->port,
                rep->type);
        return -1;
    }
    int covered = 0;
    for (size_t i = 0; i < rep->elements; i++) {
        const redisReply *e = rep->element[i], *m;
        if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 || !int_in(e->element[0], 0, 16383) ||
            !int_in(e->element[1], e->element[0]->integer, 16383) ||
            (m = e->element[2])->type != REDIS_REPLY_ARRAY || m->elements < 2 ||
            m->element[0]->type != REDIS_REPLY_STRING || !int_in(m->element[1], 1, 65535)) {
            set_err(c, "%s:%d: CLUSTER SLOTS: malformed entry %zu", who, asked->port, i);
            return -1;
        }
        const char *host = m->element[0]->len && strcmp(m->element[0]->str, "?")
                               ? m->element[0]->str
                               : asked->host;
        char h[XFER_REG_HOST_MAX];
        snprintf(h, sizeof(h), "%s", host); /* node_index may move asked's table */
        int idx = node_index(c, h, (int)m->element[1]->integer);
        if (idx < 0) {
            set_err(c, "CLUSTER SLOTS: more than %d nodes", RCL_MAX_NODES);
            return -1;
        }
        for (long long s = e->element[0]->integer; s <= e->element[1]->integer; s++) {
            covered += owner[s] < 0;
            owner[s] = (int16_t)idx;
        }
    }
    if (!covered)
        set_err(c, "%s:%d: CLUSTER SLOTS: empty slot map", who, asked->port);
    return covered;
}

/* Asks node i; 0 = map loaded, else the error (c->err). */
static int refresh_from(struct rcl *c, int i)
{
    int err;
    redisContext *x = node_conn(c, i, &err);
    if (!x)
        return err;
    redisReply *rep = redisCommand(x, "CLUSTER SLOTS");
    if (!rep) {
        set_err(c, "cluster node %s:%d: CLUSTER SLOTS: %s", c->nodes[i].host, c->nodes[i].port,
                x->errstr);
        drop_conn(&c->nodes[i]);
        return -XFER_EUNAVAIL;
    }
    int16_t *owner = malloc(sizeof(c->owner));
    if (!owner) {
        freeReplyObject(rep);
        set_err(c, "out of memory");
        return -XFER_ENOMEM;
    }
    memset(owner, 0xff, sizeof(c->owner));
    struct rcl_node asked = c->nodes[i];
    int covered = parse_slots(c, rep, &asked, owner);
    freeReplyObject(rep);
    if (covered > 0) {
        memcpy(c->owner, owner, sizeof(c->owner));
        c->map_ok = true;
        c->refreshes++;
        if (covered < RCL_SLOTS)
            xfer_warn("registry: cluster map from %s:%d covers %d of %d slots", asked.host,
                      asked.port, covered, RCL_SLOTS);
    }
    free(owner);
    return covered > 0 ? 0 : -XFER_EPROTO;
}

int rcl_refresh(struct rcl *c)
{
    for (int s = 0; s < c->url->n_seeds; s++)
        if (node_index(c, c->url->seeds[s].host, c->url->seeds[s].port) < 0)
            break;
    int worst = -XFER_EUNAVAIL;
    char why[RCL_ERR_MAX] = "no cluster node";
    /* Known nodes first (the map's owners, then the seeds), connected ones first. */
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < c->n_nodes; i++) {
            if ((pass == 0) != (c->nodes[i].ctx != NULL))
                continue;
            int rc = refresh_from(c, i);
            if (!rc)
                return 0;
            if (rc != -XFER_EUNAVAIL)
                worst = rc; /* a node answered, badly: say so */
            if (rc != -XFER_EUNAVAIL || worst == -XFER_EUNAVAIL)
                snprintf(why, sizeof(why), "%s", c->err);
        }
    }
    c->map_ok = false;
    snprintf(c->err, sizeof(c->err), "%s", why);
    return worst;
}

redisContext *rcl_conn(struct rcl *c, int slot, int *err)
{
    if (!c->map_ok && (*err = rcl_refresh(c)))
        return NULL;
    if (slot < 0) { /* no key: any node of the map */
        for (int i = 0; i < RCL_SLOTS; i += 97)
            if (c->owner[i] >= 0)
                return node_conn(c, c->owner[i], err);
        slot = 0;
    }
    int i = c->owner[slot];
    if (i < 0) {
        set_err(c, "slot %d is not served by any node (cluster incomplete)", slot);
        *err = -XFER_EUNAVAIL;
        return NULL;
    }
    return node_conn(c, i, err);
}

/* ---- batches ---------------------------------------------------------------------- */

void rcl_batch_add(struct rcl_batch *b, int argc, const char **argv, const size_t *lens)
{
    if (b->n == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 64;
        char **cmd = realloc(b->cmd, cap * sizeof(*cmd));
        b->cmd = cmd ? cmd : b->cmd;
        size_t *len = realloc(b->len, cap * sizeof(*len));
        b->len = len ? len : b->len;
        int *slot = realloc(b->slot, cap * sizeof(*slot));
        b->slot = slot ? slot : b->slot;
        bool *multi = realloc(b->multi, cap * sizeof(*multi));
        b->multi = multi ? multi : b->multi;
        if (!cmd || !len || !slot || !multi)
            return; /* the batch comes up short: rcl_batch_run reports it */
        b->cap = cap;
    }
    char *s = NULL;
    int n = redisFormatCommandArgv(&s, argc, argv, lens);
    if (n < 0)
        return;
    b->cmd[b->n] = s;
    b->len[b->n] = (size_t)n;
    b->slot[b->n] = rcl_command_slot(argc, argv, lens);
    b->multi[b->n] = cmd_is(argv[0], "MULTI");
    b->n++;
}

void rcl_batch_clear(struct rcl_batch *b)
{
    for (size_t i = 0; i < b->n; i++)
        free(b->cmd[i]);
    b->n = 0;
}

void rcl_batch_free(struct rcl_batch *b)
{
    rcl_batch_clear(b);
    free(b->cmd);
    free(b->len);
    free(b->slot);
    free(b->multi);
    memset(b, 0, sizeof(*b));
}

enum redir { R_NONE, R_MOVED, R_ASK, R_RETRY };

/* Kind of an error reply; MOVED/ASK fill slot, host, port. */
static enum redir classify(const redisReply *rep, int *slot, char *host, size_t hl, int *port)
{
    if (!rep || rep->type != REDIS_REPLY_ERROR)
        return R_NONE;
    bool moved = !strncmp(rep->str, "MOVED ", 6), ask = !strncmp(rep->str, "ASK ", 4);
    if (moved || ask) {
        const char *p = rep->str + (moved ? 6 : 4), *colon = strrchr(p, ':');
        const char *sp = strchr(p, ' ');
        *slot = atoi(p);
        *port = colon ? atoi(colon + 1) : 0;
        if (!sp || !colon || colon < sp || (size_t)(colon - sp - 1) >= hl || *slot < 0 ||
            *slot >= RCL_SLOTS || *port <= 0 || *port > 65535)
            return R_NONE; /* garbled: passed on as an ordinary error */
        memcpy(host, sp + 1, (size_t)(colon - sp - 1));
        host[colon - sp - 1] = '\0';
        return moved ? R_MOVED : R_ASK;
    }
    static const char *const retry[] = {"TRYAGAIN", "CLUSTERDOWN", "LOADING", "MASTERDOWN"};
    for (size_t i = 0; i < sizeof(retry) / sizeof(retry[0]); i++)
        if (!strncmp(rep->str, retry[i], strlen(retry[i])))
            return R_RETRY;
    return R_NONE;
}

static void nap_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Sends cmd[i..j) (after ASKING when asking) on x and reads the replies into
 * out[0..j-i). 0, or -XFER_EUNAVAIL (connection broken, nothing left). */
static int send_run(redisContext *x, const struct rcl_batch *b, size_t i, size_t j, bool asking,
                    redisReply **out)
{
    if (asking)
        redisAppendCommand(x, "ASKING");
    for (size_t k = i; k < j; k++)
        redisAppendFormattedCommand(x, b->cmd[k], b->len[k]);
    size_t got = 0;
    for (size_t k = 0; k < j - i + asking; k++) {
        void *rep = NULL;
        if (redisGetReply(x, &rep) != REDIS_OK || !rep) {
            for (size_t f = 0; f < got; f++)
                freeReplyObject(out[f]);
            return -XFER_EUNAVAIL;
        }
        if (asking && k == 0) /* the ASKING reply */
            freeReplyObject(rep);
        else
            out[got++] = rep;
    }
    return 0;
}

/* Commands outside MULTI that got ASK go one by one to the importing node. */
static void resend_asked(struct rcl *c, const struct rcl_batch *b, size_t i, size_t j,
                         redisReply **out)
{
    for (size_t k = i; k < j; k++) {
        char host[XFER_REG_HOST_MAX];
        int slot, port, err;
        if (classify(out[k], &slot, host, sizeof(host), &port) != R_ASK)
            continue;
        int n = node_index(c, host, port);
        redisContext *x = n >= 0 ? node_conn(c, n, &err) : NULL;
        redisReply *rep[1];
        if (x && send_run(x, b, k, k + 1, true, rep) == 0) {
            freeReplyObject(out[k]);
            out[k] = rep[0];
        } else if (n >= 0) {
            drop_conn(&c->nodes[n]); /* out[k] stays the ASK error */
        }
    }
}

/* One run of commands of one slot (or keyless), until it gets answers
 * that are not redirects or the tries are used up. */
static int run_slot(struct rcl *c, const struct rcl_batch *b, size_t i, size_t j, int slot,
                    redisReply **out)
{
    bool in_multi = false;
    for (size_t k = i; k < j; k++)
        in_multi |= b->multi[k];
    int rc = -XFER_EUNAVAIL;
    char last[RCL_ERR_MAX] = "";
    for (int t = 0; t < RCL_MAX_TRIES; t++) {
        if (t)
            nap_ms(t < 5 ? 10 << t : 200); /* 20, 40, 80, 160, 200...: ~1.3 s in all */
        int err;
        redisContext *x = rcl_conn(c, slot, &err);
        if (!x) {
            rc = err;
            snprintf(last, sizeof(last), "%s", c->err);
            c->map_ok = err == -XFER_EUNAVAIL ? false : c->map_ok;
            continue;
        }
        if ((rc = send_run(x, b, i, j, false, out + i))) {
            snprintf(last, sizeof(last), "connection to a cluster node lost: %s", x->errstr);
            for (int n = 0; n < c->n_nodes; n++)
                if (c->nodes[n].ctx == x)
                    drop_conn(&c->nodes[n]);
            c->map_ok = false; /* a failover, maybe */
            continue;
        }
        enum redir worst = R_NONE;
        int rslot = 0, rport = 0;
        char rhost[XFER_REG_HOST_MAX];
        for (size_t k = i; k < j; k++) {
            enum redir d = classify(out[k], &rslot, rhost, sizeof(rhost), &rport);
            if (d > worst || (d == R_MOVED && worst != R_MOVED)) {
                worst = d;
                snprintf(last, sizeof(last), "%s", out[k]->str);
            }
            if (d == R_MOVED)
                break;
        }
        if (worst == R_NONE)
            return 0;
        c->redirects++;
        if (worst == R_ASK && !in_multi) {
            resend_asked(c, b, i, j, out);
            return 0;
        }
        for (size_t k = i; k < j; k++)
            freeReplyObject(out[k]);
        if (worst == R_MOVED) { /* the map is old: reload it, trust the MOVED */
            rcl_refresh(c);
            int n = node_index(c, rhost, rport);
            if (n >= 0 && rslot == slot)
                c->owner[rslot] = (int16_t)n;
        } else if (worst == R_RETRY && !strncmp(last, "CLUSTERDOWN", 11)) {
            c->map_ok = false;
        } /* ASK inside MULTI and TRYAGAIN: the same node again, a bit later */
        /* Still CLUSTERDOWN/TRYAGAIN/... after the last try: the cluster is
         * unavailable (a failover in progress), not misbehaving — callers
         * serve their cache and the handle reconnects and republishes. */
        rc = worst == R_RETRY ? -XFER_EUNAVAIL : -XFER_EPROTO;
    }
    set_err(c, "slot %d: gave up after %d tries: %s", slot, RCL_MAX_TRIES, last);
    return rc;
}

/* Slot of the first keyed command after j (-1 when none). */
static int next_slot(const struct rcl_batch *b, size_t j)
{
    for (size_t k = j + 1; k < b->n; k++)
        if (b->slot[k] >= 0)
            return b->slot[k];
    return -1;
}

int rcl_batch_run(struct rcl *c, const struct rcl_batch *b, redisReply **out)
{
    size_t i = 0;
    while (i < b->n) {
        int slot = -1;
        size_t j = i;
        /* A run: keyless commands join the next keyed one (MULTI) or the
         * previous one (EXEC, PUBLISH); a keyed command of another slot, or
         * a MULTI whose commands are of another slot, starts the next run. */
        for (; j < b->n; j++) {
            if (b->slot[j] >= 0 && slot >= 0 && b->slot[j] != slot)
                break;
            if (b->multi[j] && slot >= 0 && next_slot(b, j) != slot)
                break;
            if (b->slot[j] >= 0)
                slot = b->slot[j];
        }
        int rc = run_slot(c, b, i, j, slot, out);
        if (rc) {
            for (size_t f = 0; f < i; f++)
                freeReplyObject(out[f]);
            return rc;
        }
        i = j;
    }
    return 0;
}

redisReply *rcl_command(struct rcl *c, int argc, const char **argv, const size_t *lens, int *err)
{
    struct rcl_batch b = {0};
    redisReply *rep = NULL;
    rcl_batch_add(&b, argc, argv, lens);
    *err = b.n == 1 ? rcl_batch_run(c, &b, &rep) : -XFER_ENOMEM;
    if (b.n != 1)
        set_err(c, "out of memory");
    rcl_batch_free(&b);
    return *err ? NULL : rep;
}
