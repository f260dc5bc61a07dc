/* Redis Cluster router of the registry (registry/cluster.c): slot map from
 * CLUSTER SLOTS, CRC16 key slots with {hash tags}, one connection per node,
 * pipelined batches sent to the owner of their slot with MOVED / ASK /
 * TRYAGAIN / CLUSTERDOWN followed a bounded number of times. hiredis 0.14
 * has no cluster client, and Debian ships none: this is the small part of
 * one that the registry needs (no cross-slot commands, no replica reads). */
#ifndef XFER_REG_CLUSTER_H
#define XFER_REG_CLUSTER_H

#include <hiredis/hiredis.h>
#include <stdbool.h>
#include <stdint.h>

#include "xfer_registry.h"

#define RCL_SLOTS     16384
#define RCL_MAX_NODES 128
#define RCL_MAX_TRIES 8 /* sends of one batch (redirects, retries) */
#define RCL_ERR_MAX   512

struct rcl_node {
    char host[XFER_REG_HOST_MAX];
    int port;
    redisContext *ctx; /* NULL until used */
};

struct rcl {
    const struct xfer_redis_url *url; /* seeds and credentials (borrowed) */
    int timeout_ms;
    struct rcl_node nodes[RCL_MAX_NODES];
    int n_nodes;
    int16_t owner[RCL_SLOTS]; /* node index, -1 = unknown */
    bool map_ok;              /* a full map was loaded (else refresh first) */
    unsigned refreshes, redirects;
    char err[RCL_ERR_MAX]; /* reason of the last failure */
};

/* A batch: raw RESP commands (redisFormatCommandArgv) with their slots. */
struct rcl_batch {
    char **cmd;
    size_t *len;
    int *slot; /* -1: no key (MULTI, EXEC, PUBLISH...) */
    bool *multi;
    size_t n, cap;
};

unsigned rcl_crc16(const char *buf, size_t len);
/* Slot of a key: CRC16 of the {hash tag} when there is a non-empty one,
 * else of the whole key, mod 16384. */
unsigned rcl_key_slot(const char *key, size_t len);
/* Slot of a command by its key (-1 when it has none). */
int rcl_command_slot(int argc, const char **argv, const size_t *lens);

void rcl_init(struct rcl *c, const struct xfer_redis_url *u, int timeout_ms);
void rcl_close(struct rcl *c); /* closes connections; c can be reused */
/* Loads the slot map with CLUSTER SLOTS from the first node that answers
 * (known nodes, then the seeds). 0, or -XFER_EUNAVAIL (nobody answered),
 * -XFER_EPROTO (error reply, wrong types, empty or partial map), -XFER_EAUTH;
 * the reason in c->err. */
int rcl_refresh(struct rcl *c);
/* Connection to the owner of slot (loads the map when needed). */
redisContext *rcl_conn(struct rcl *c, int slot, int *err);

void rcl_batch_add(struct rcl_batch *b, int argc, const char **argv, const size_t *lens);
void rcl_batch_clear(struct rcl_batch *b);
void rcl_batch_free(struct rcl_batch *b);
/* Sends every command of b to the owner of its slot (keyless ones go with
 * their neighbours; runs of one slot share a round trip) and fills out[i]
 * with reply i (to free). Follows redirects; a run inside MULTI that gets
 * ASK is retried whole on the source until the slot is moved. 0 (replies
 * may still be ordinary error replies), or -XFER_EUNAVAIL / -XFER_EPROTO
 * with c->err (no replies left to free). */
int rcl_batch_run(struct rcl *c, const struct rcl_batch *b, redisReply **out);
/* One command routed by its key; NULL with *err and c->err. */
redisReply *rcl_command(struct rcl *c, int argc, const char **argv, const size_t *lens, int *err);

#endif
