/* KV pool internals shared by kv_geom.c, pool.c and pool_xfer.c. */
#ifndef XFER_NODE_POOL_H
#define XFER_NODE_POOL_H

#include "node_int.h"

/* Where the blocks of one (layer, half) live: block b at base + b * stride
 * of member region `region`. */
struct kv_stream {
    uint32_t region;
    uint64_t base, stride;
};

/* 0, or -XFER_EINVAL with the reason (names the field). */
int kv_geom_check(const struct xfer_kv_geom *g, char *why, size_t why_len);
/* Bytes member region idx must hold. */
uint64_t kv_region_need(const struct xfer_kv_geom *g, size_t idx);
void kv_stream_of(const struct xfer_kv_geom *g, uint32_t layer, uint32_t half,
                  struct kv_stream *out);
/* The inverse: which layer, half and block offset off of member region
 * lies in, and the stride between blocks of that stream. */
struct kv_loc {
    uint32_t layer, half;
    uint64_t block, stride;
};
void kv_locate(const struct xfer_kv_geom *g, size_t region, uint64_t off, struct kv_loc *out);
/* K and V of one block adjacent (FlashInfer, block-major): one segment. */
bool kv_halves_adjacent(const struct xfer_kv_geom *g);

struct xfer_kv_pool {
    struct xfer_kv_pool *next;
    char name[XFER_NAME_MAX];
    struct xfer_kv_geom geom;
    size_t nregions;
    xfer_region **regions;
    int leases; /* xfer_kv_lease objects not freed (pool_lock) */
};

/* Geometry <-> registry fields (pool_desc.c). */
#define KV_FIELDS 13
struct kv_fields {
    char num[8][24];
    char shard[24];
    char *regions; /* malloc'ed "a,b,c" */
    struct xfer_registry_field f[KV_FIELDS];
};
int kv_fields_make(struct kv_fields *kf, const struct xfer_kv_geom *g, const char *const *names,
                   size_t n);
void kv_fields_free(struct kv_fields *kf);
struct kv_parse {
    struct xfer_kv_pool_desc *d;
    char bad[96]; /* first bad field, "" = none */
};
/* Fills kp->d from one field of a published pool (xfer_registry_field_fn). */
void kv_desc_field(const char *field, const char *value, void *arg);
/* After all fields: 0 or -XFER_EPROTO naming what is missing or bad. */
int kv_desc_finish(struct kv_parse *kp);

#endif
