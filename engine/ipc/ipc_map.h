/*
 * Initiator-side cache of opened remote regions, one entry per (region id,
 * generation): a memfd mapping, a CMA address, or an opened CUDA handle.
 * Entries are created by asking the owner (IPC_MAP_REQ); a newer generation
 * or an owner's "stale"/"unknown" answer retires the older entries, which are
 * freed at the end of the current group (ipc_map_gc) so pointers handed out
 * for that group stay valid.
 */
#ifndef XFER_IPC_MAP_H
#define XFER_IPC_MAP_H

#include "ipc.h"

struct ipc_map {
    uint32_t id, gen;
    uint32_t mech; /* enum ipc_mech */
    unsigned access;
    uint64_t len;      /* region length, per the owner */
    uint64_t addr;     /* CMA: region address in the owner */
    void *base;        /* memfd: our mapping of the region */
    uint32_t ctl_slot; /* the owner lent it for direct copies, else IPC_SLOT_NONE */
    struct ipc_cuda_import *cuda;
    struct ipc_map *next;
};

struct ipc_map_cache {
    struct ipc_map *live, *retired;
    size_t nlive;
};

/* Finds (id, gen) among the open entries: 0, or -XFER_ENOENT. */
int ipc_map_find(struct ipc_map_cache *mc, uint32_t id, uint32_t gen, const struct ipc_map **out);
/* Finds or opens (id, gen), asking the owner over fd. *out stays valid until
 * the next ipc_map_gc(). */
int ipc_map_get(struct ipc_map_cache *mc, int fd, uint32_t id, uint32_t gen, enum xfer_op op,
                int timeout_ms, const struct ipc_map **out, char *why, size_t why_len);
/* Retires every entry of region id / the entry (id, gen). */
void ipc_map_forget(struct ipc_map_cache *mc, uint32_t id);
void ipc_map_forget_gen(struct ipc_map_cache *mc, uint32_t id, uint32_t gen);
/* Entries mapped (live), for tests and stats. */
size_t ipc_map_count(const struct ipc_map_cache *mc);
void ipc_map_gc(struct ipc_map_cache *mc);
/* Retires and frees everything. */
void ipc_map_clear(struct ipc_map_cache *mc);

/* Direct copies (ipc_direct.c). With the connection's lock: lists m when the
 * owner lent it; unlists entries whose mapping is no longer live in mc and
 * returns them. Without the lock: waits for their copies, frees them (before
 * ipc_map_gc unmaps their memory). */
void ipc_direct_note(struct ipc_direct_table *t, const struct ipc_map *m);
struct ipc_direct *ipc_direct_unlist(struct ipc_direct_table *t, const struct ipc_map_cache *mc);
void ipc_direct_free(struct ipc_direct *list);

#endif
