/*
 * xferd configuration: built-in defaults, then a config file, then XFER_*
 * environment variables, then command-line flags (later wins).
 *
 * File format (docs/service.md has the full list):
 *
 *     # comment
 *     node = n1
 *     redis_url = redis://127.0.0.1:6379
 *     listen = 10.0.0.1          # data-plane address (port: data_port)
 *     [region kv]
 *     size = 64M
 *     access = rw
 *     dtype = bf16
 *     block_bytes = 4096
 *
 * Keys before the first section are global; each `[region NAME]` section
 * declares one host pool that xferd allocates at start.
 */
#ifndef XFER_SERVICE_CONFIG_H
#define XFER_SERVICE_CONFIG_H

#include "xfer.h"
#include "xfer_node.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define XFERD_MAX_REGIONS          64
#define XFERD_MAX_POOLS            16
#define XFERD_PATH_MAX             256
#define XFERD_STR_MAX              256
#define XFERD_METRICS_PORT_DEFAULT 9400

struct xferd_region_conf {
    char name[XFER_NAME_MAX];
    uint64_t size;
    unsigned access;
    struct xfer_layout layout;
};

/* A host-memory KV pool xferd makes at start (`pool = NAME=GEOMETRY`). */
struct xferd_pool_conf {
    char name[XFER_NAME_MAX];
    struct xfer_kv_geom geom;
};

struct xferd_config {
    char node[XFER_NAME_MAX];
    char redis_url[XFERD_STR_MAX];
    char secret[XFERD_STR_MAX];
    char transports[XFERD_STR_MAX];   /* "" = engine default */
    char listen[XFER_ADDR_MAX];       /* data and control TCP address */
    char advertise[XFER_ADDR_MAX];    /* published address; "" = listen */
    uint16_t data_port;               /* 0 = ephemeral */
    uint16_t ctrl_port;               /* 0 = ephemeral */
    uint16_t metrics_port;            /* Prometheus /metrics; 0 = off */
    bool metrics_port_given;          /* set by flag/env/file, not the default */
    char metrics_addr[XFER_ADDR_MAX]; /* "" = listen */
    char ctrl_socket[XFERD_PATH_MAX];
    char config_path[XFERD_PATH_MAX];
    int ttl_ms;
    int heartbeat_ms;
    int drain_ms;
    int connect_timeout_ms;
    int io_timeout_ms;
    /* engine data path (docs/service.md: defaults from docs/perf.md) */
    int sockets_per_peer;
    int progress_threads;
    int chunk_bytes;
    int busy_poll_us;
    int request_timeout_ms; /* default deadline of a named transfer */
    int workers;
    uint64_t max_region_bytes; /* host memory in regions; 0 = no limit */
    bool insecure;             /* serve beyond loopback with no secret */
    char log_level[16];
    int nregions;
    struct xferd_region_conf regions[XFERD_MAX_REGIONS];
    int npools;
    struct xferd_pool_conf pools[XFERD_MAX_POOLS];
};

/* Fills defaults (no node, socket path derived from the node later). */
void xferd_config_defaults(struct xferd_config *c);
/* Parses a config file; on error returns -XFER_EINVAL with "file:line: why"
 * in why. A missing file is -XFER_ENOENT. */
int xferd_config_load_file(struct xferd_config *c, const char *path, char *why, size_t why_len);
/* Applies XFER_* environment variables. */
int xferd_config_load_env(struct xferd_config *c, char *why, size_t why_len);
/* Sets one key (file keys and flag names are the same, '-' == '_').
 * section: NULL for globals, else the region being declared. */
int xferd_config_set(struct xferd_config *c, const char *key, const char *val, char *why,
                     size_t why_len);
/* Fills derived defaults and checks the result (node given, ...). */
int xferd_config_finish(struct xferd_config *c, char *why, size_t why_len);

/* True for 127.0.0.0/8, ::1 and "localhost". */
bool xferd_addr_is_loopback(const char *addr);
/* True when xferd would serve beyond loopback with no secret (allowed only
 * with insecure; xferd then warns at start). */
bool xferd_config_unauthenticated_exposed(const struct xferd_config *c);

/* "64M", "4k", "1G", "123" -> bytes (binary units): the node library's. */
static inline int xferd_parse_size(const char *s, uint64_t *out)
{
    return xfer_node_parse_size(s, out);
}
/* Declares a pool from "NAME=LAYOUT:DTYPE:BLOCK_BYTES:NUM_BLOCKS:LAYERS[:KV[:TAG]]"
 * (the --pool flag, `pool =` lines; repeatable). */
int xferd_config_add_pool_spec(struct xferd_config *c, const char *spec, char *why, size_t why_len);
/* Declares a region from "NAME:SIZE[:ACCESS]" (the --region flag). */
int xferd_config_add_region_spec(struct xferd_config *c, const char *spec, char *why,
                                 size_t why_len);

#endif
