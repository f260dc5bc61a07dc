/*
 * Shared by the test helper programs (xfer_node, xfer_random, xfer_raw):
 * the node file a serving node writes, position-based data patterns, and a
 * client engine connected to that node. Header-only: each helper is one
 * program built from one main file.
 */
#ifndef XFER_TEST_NODE_COMMON_H
#define XFER_TEST_NODE_COMMON_H

#include "xfer.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define NODE_MAX_REGIONS 16

struct node_file {
    struct xfer_peer_desc peer;
    int n_regions;
    struct xfer_region_desc regions[NODE_MAX_REGIONS];
};

static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Transports of the test engines: tcp, unless XFER_TRANSPORTS names them
 * (0 lets the engine read that variable). */
/* Creates the empty file path + suffix: a test script's signal. */
static inline void touch(const char *path, const char *suffix)
{
    char f[512];
    snprintf(f, sizeof(f), "%s%s", path, suffix);
    FILE *fp = fopen(f, "w");
    if (fp)
        fclose(fp);
}

static inline unsigned node_transports(void)
{
    return getenv("XFER_TRANSPORTS") ? 0 : XFER_TRANSPORT_TCP;
}

/* node=, port=, incarnation=, host_id=, transports=, nics=, tcpx_port=,
 * region=NAME ID GEN LEN ACCESS [ADDR RKEYS] */
static inline int node_file_read(const char *path, struct node_file *nf)
{
    memset(nf, 0, sizeof(*nf));
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "cannot open node file %s\n", path);
        return -1;
    }
    char line[XFER_NICS_MAX + 64]; /* the nics= line is the longest */
    snprintf(nf->peer.addr, sizeof(nf->peer.addr), "127.0.0.1");
    nf->peer.transports = XFER_TRANSPORT_TCP;
    while (fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\n")] = '\0';
        char *v = strchr(line, '=');
        if (!v)
            continue;
        *v++ = '\0';
        if (!strcmp(line, "node"))
            snprintf(nf->peer.node_id, sizeof(nf->peer.node_id), "%s", v);
        else if (!strcmp(line, "port"))
            nf->peer.data_port = (uint16_t)atoi(v);
        else if (!strcmp(line, "incarnation"))
            nf->peer.incarnation = strtoull(v, NULL, 10);
        else if (!strcmp(line, "host_id"))
            snprintf(nf->peer.host_id, sizeof(nf->peer.host_id), "%s", v);
        else if (!strcmp(line, "transports"))
            nf->peer.transports = (unsigned)strtoul(v, NULL, 10);
        else if (!strcmp(line, "tcpx_port"))
            nf->peer.tcpx_port = (uint16_t)atoi(v);
        else if (!strcmp(line, "nics") && strcmp(v, "-"))
            snprintf(nf->peer.nics, sizeof(nf->peer.nics), "%s", v);
        else if (!strcmp(line, "region") && nf->n_regions < NODE_MAX_REGIONS) {
            struct xfer_region_desc *d = &nf->regions[nf->n_regions];
            char acc[8], rkeys[XFER_BLOB_MAX] = "-";
            unsigned long long len, addr = 0;
            int got = sscanf(v, "%63s %u %u %llu %7s %llu %255s", d->name, &d->id, &d->gen, &len,
                             acc, &addr, rkeys);
            if (got >= 5 && xfer_access_parse(acc, &d->access) == 0) {
                d->len = len;
                d->addr = addr;
                if (strcmp(rkeys, "-"))
                    snprintf(d->rkeys, sizeof(d->rkeys), "%s", rkeys);
                nf->n_regions++;
            }
        }
    }
    fclose(f);
    /* rdma, tcpx or ipc alone have no data port */
    if (nf->peer.data_port || nf->peer.nics[0] || nf->peer.tcpx_port ||
        (nf->peer.transports & XFER_TRANSPORT_IPC))
        return 0;
    fprintf(stderr, "node file %s names no way to reach the node\n", path);
    return -1;
}

static inline void node_file_region_line(const struct xfer_region_desc *d, void *arg)
{
    fprintf(arg, "region=%s %u %u %llu %s %llu %s\n", d->name, d->id, d->gen,
            (unsigned long long)d->len, xfer_access_str(d->access), (unsigned long long)d->addr,
            d->rkeys[0] ? d->rkeys : "-");
}

/* Writes the node file of engine e (the format node_file_read reads),
 * atomically: a reader never sees half of it. */
static inline int node_file_write(xfer_engine *e, const char *path)
{
    char tmp[512];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return -1;
    struct xfer_peer_desc d;
    xfer_engine_describe(e, &d);
    fprintf(f, "node=%s\nport=%u\nincarnation=%llu\nhost_id=%s\npid=%d\n", d.node_id, d.data_port,
            (unsigned long long)d.incarnation, d.host_id, (int)getpid());
    fprintf(f, "transports=%u\nnics=%s\ntcpx_port=%u\n", d.transports, d.nics[0] ? d.nics : "-",
            d.tcpx_port);
    xfer_region_foreach(e, node_file_region_line, f);
    fclose(f);
    return rename(tmp, path);
}

static inline const struct xfer_region_desc *node_region(const struct node_file *nf,
                                                         const char *name)
{
    for (int i = 0; i < nf->n_regions; i++)
        if (!strcmp(nf->regions[i].name, name))
            return &nf->regions[i];
    fprintf(stderr, "node file has no region %s\n", name);
    return NULL;
}

/* ---- position-based patterns: any range can be checked on its own ---- */
static inline uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static inline uint8_t pattern_byte(uint64_t seed, uint64_t pos)
{
    return (uint8_t)(mix64(seed ^ (pos >> 3) * 0x100000001b3ull) >> (8 * (pos & 7)));
}

/* buf[i] = pattern_byte(seed, base + i), 8 bytes per hash when aligned. */
static inline void pattern_fill(uint8_t *buf, uint64_t len, uint64_t seed, uint64_t base)
{
    uint64_t i = 0;
    while (i < len && ((base + i) & 7))
        buf[i] = pattern_byte(seed, base + i), i++;
    for (; i + 8 <= len; i += 8) {
        uint64_t v = mix64(seed ^ ((base + i) >> 3) * 0x100000001b3ull);
        memcpy(buf + i, &v, 8);
    }
    for (; i < len; i++)
        buf[i] = pattern_byte(seed, base + i);
}

/* FNV-1a over 8-byte words (checksums for log lines). */
static inline uint64_t checksum(const uint8_t *p, uint64_t len)
{
    uint64_t h = 0xcbf29ce484222325ull;
    uint64_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t v;
        memcpy(&v, p + i, 8);
        h = (h ^ v) * 0x100000001b3ull;
    }
    for (; i < len; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* A client engine named node_id connected to the node described by nf. */
static inline xfer_engine *client_engine(const char *node_id, const struct node_file *nf,
                                         const char *secret, int sockets, xfer_peer **peer,
                                         int *rc_out)
{
    struct xfer_engine_config cfg;
    xfer_engine_config_init(&cfg);
    cfg.node_id = node_id;
    cfg.transports = node_transports();
    if (sockets > 0)
        cfg.sockets_per_peer = sockets;
    if (secret) {
        cfg.secret = secret;
        cfg.secret_len = strlen(secret);
    }
    cfg.connect_timeout_ms = 3000;
    cfg.io_timeout_ms = 3000;
    if (getenv("XFER_TEST_PROGRESS_THREADS")) /* exercise several progress threads */
        cfg.progress_threads = atoi(getenv("XFER_TEST_PROGRESS_THREADS"));
    int rc;
    xfer_engine *e = xfer_engine_new(&cfg, &rc);
    if (!e) {
        fprintf(stderr, "engine: %s\n", xfer_strerror(rc));
        *rc_out = rc;
        return NULL;
    }
    rc = xfer_peer_add(e, &nf->peer, peer);
    for (int i = 0; rc == 0 && i < nf->n_regions; i++)
        xfer_peer_region_add(*peer, &nf->regions[i]);
    *rc_out = rc;
    return e;
}

#endif
