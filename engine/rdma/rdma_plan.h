/*
 * Pure helpers of the rdma transport: chunking and striping arithmetic,
 * signalling policy, the in-flight ring and its completion accounting,
 * verbs status → xfer error mapping, the published NIC list and rkeys, PCI
 * distance. No verbs calls here, so everything is unit-tested directly.
 */
#ifndef XFER_RDMA_PLAN_H
#define XFER_RDMA_PLAN_H

#include "xfer.h"

#include <infiniband/verbs.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define XFER_RDMA_MAX_NICS 8

/* ---- chunking and striping ---- */

/* Number of chunks of an item of len bytes (0 for len 0 → 1: a zero-length
 * item still completes through one zero-length WR). chunk > 0. */
size_t xfer_rdma_chunk_count(uint64_t len, uint64_t chunk);
/* Offset and length of chunk k (k < count). */
void xfer_rdma_chunk_at(uint64_t len, uint64_t chunk, size_t k, uint64_t *off, uint64_t *n);
/* Queue pair for chunk k of an item whose first chunk goes to `first`:
 * consecutive chunks on consecutive QPs, wrapping over nslots. */
static inline size_t xfer_rdma_stripe_slot(size_t first, size_t k, size_t nslots)
{
    return (first + k) % nslots;
}
/* A WR is signaled when `every` unsignaled ones precede it, or when it is
 * the last one posted for now (so nothing waits on a later completion). */
static inline bool xfer_rdma_should_signal(uint32_t unsignaled_before, uint32_t every, bool last)
{
    return last || unsignaled_before + 1 >= every;
}

/* ---- in-flight chunks and completion accounting ---- */

struct xfer_rdma_chunk {
    xfer_batch *b;
    size_t item;
    uint32_t seg; /* the item's segment when vectored (named if it fails) */
    enum xfer_op op;
    uint64_t laddr, raddr, len;
    const void *lmr;                   /* struct rdma_region of the local region */
    uint32_t rkey[XFER_RDMA_MAX_NICS]; /* the remote region's rkey per remote NIC */
    uint32_t nic_mask;                 /* local NICs allowed (near the region's GPU) */
    /* A leased remote region (XFER_ACCESS_LEASED, rkeys "mw"): reached only
     * through a memory window its owner bound on our QP (rdma_win.c). */
    bool win;
    bool win_refused;       /* the owner's NIC refused our window once already */
    uint8_t win_qp_lost;    /* times its QP died under its window (rdma_progress.c) */
    int64_t win_busy_until; /* ms: asks answered "busy" are repeated until then, 0 none yet */
    uint32_t rid, rgen, wkey;
    uint64_t rbase; /* the remote region's address */
    uint64_t seq;   /* set when posted */
    uint8_t retries;
    bool signaled;
    bool drain;     /* not a chunk: the WR that reports a broken QP's last WRs */
    int status;     /* set by completion accounting */
    bool retryable; /* flushed: did nothing wrong itself */
    const char *why;
    void *msg; /* not a data chunk but an engine message's SEND (rdma_msg.c):
                * its connection; item is the message's index there */
};

/* FIFO of posted chunks of one QP, in posting order (sequence numbers
 * strictly increasing). */
struct xfer_rdma_ring {
    struct xfer_rdma_chunk *v;
    uint32_t cap, head, n;
};

int xfer_rdma_ring_init(struct xfer_rdma_ring *r, uint32_t cap);
void xfer_rdma_ring_free(struct xfer_rdma_ring *r);
/* 0, or -XFER_ENOSPC when full. */
int xfer_rdma_ring_push(struct xfer_rdma_ring *r, const struct xfer_rdma_chunk *c);

/*
 * A CQE for the WR of sequence seq arrived with status st. On an RC QP
 * completions are in order, so every older chunk finished successfully (an
 * unsignaled WR reports nothing on success); the chunk of seq itself gets
 * st. Moves those chunks, oldest first, to out (room for max) with status
 * and why set, and returns how many. A seq no longer in the ring moves none.
 */
size_t xfer_rdma_ring_complete(struct xfer_rdma_ring *r, uint64_t seq, enum ibv_wc_status st,
                               struct xfer_rdma_chunk *out, size_t max);
/* Moves every chunk left (a QP torn down) to out with status/why. */
size_t xfer_rdma_ring_drain(struct xfer_rdma_ring *r, int status, const char *why,
                            struct xfer_rdma_chunk *out, size_t max);

/* IBV_WC_* → 0 or -XFER_E*, with a static reason ("remote access error ..."). */
int xfer_rdma_wc_error(enum ibv_wc_status st, const char **why);
/* Flushed WRs did nothing wrong themselves: they may be retried elsewhere. */
static inline bool xfer_rdma_wc_retryable(enum ibv_wc_status st)
{
    return st == IBV_WC_WR_FLUSH_ERR;
}

/* Little-endian 64-bit fields of the window request and answer (leases). */
static inline uint64_t xfer_rdma_get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}
static inline void xfer_rdma_put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* ---- published NIC list ----
 * "name,port,gid,ll,gbps,pci,numa,cmport;..." e.g.
 * "mlx5_0,1,::ffff:10.0.0.1,eth,200,0000:3b:00.0,0,43711". ll is eth or ib,
 * pci "-" and numa -1 when unknown. */
struct xfer_rdma_nic_desc {
    char name[32];
    uint8_t port;
    union ibv_gid gid;
    bool ib; /* link layer InfiniBand, else Ethernet (RoCE) */
    uint32_t gbps;
    char pci[16];
    int numa;
    uint16_t cm_port;
};

/* Appends one entry to buf (NUL-terminated); -XFER_ENOSPC when it does not fit. */
int xfer_rdma_nics_append(char *buf, size_t len, const struct xfer_rdma_nic_desc *n);
/* Parses up to max entries; returns the count or -XFER_EPROTO. */
int xfer_rdma_nics_parse(const char *s, struct xfer_rdma_nic_desc *out, int max);
/* IPv4 address of an IPv4-mapped GID (RoCE v2), false otherwise. */
bool xfer_rdma_gid_ipv4(const union ibv_gid *gid, uint32_t *addr_be);

/* ---- rkeys: "hex,hex,..." one per NIC in NIC-list order ---- */
int xfer_rdma_rkeys_format(const uint32_t *rkeys, int n, char *buf, size_t len);
int xfer_rdma_rkeys_parse(const char *s, uint32_t *out, int max);
/* The rkeys field of a region reached through memory windows only (leases). */
#define XFER_RDMA_RKEYS_WINDOWED "mw"
static inline bool xfer_rdma_rkeys_windowed(const char *s)
{
    return s[0] == 'm' && s[1] == 'w' && s[2] == '\0';
}

/* ---- PCI topology ----
 * Hops between two devices through their closest common ancestor in the
 * sysfs device tree, e.g. /sys/devices/pci0000:00/0000:00:01.0/0000:3b:00.0
 * and .../0000:00:01.0/0000:3c:00.0 are 2 apart. Different roots (or an
 * unknown path) count as far (1000). */
int xfer_rdma_pci_distance(const char *a, const char *b);

#endif
