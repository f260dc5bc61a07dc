/*
 * GPU-initiated transfers: the request ring shared by producers (CUDA
 * threads, or CPU threads standing in for them) and the engine's proxy.
 *
 * Plain C11 and CUDA C++: only fixed-width fields, no pointers to host-only
 * objects, no atomics here (kernels/xfer_ring_proto.h holds the protocol).
 * docs/gpu_initiated.md describes the protocol and its memory ordering.
 *
 * Where each part lives for a GPU ring:
 *   slots, hdr, counters   host memory, pinned and mapped into the GPU
 *                          (producers write slots; the proxy writes hdr and
 *                          counters; both read across PCIe/C2C)
 *   prod                   GPU memory: only producers touch it (the
 *                          reservation CAS stays on the GPU)
 * For a host ring (CPU producers) all four are ordinary host memory.
 */
#ifndef XFER_RING_H
#define XFER_RING_H

#include <stdint.h>

#include "xfer_err.h"

#ifdef __cplusplus
extern "C" {
#endif

#define XFER_RING_ABI_VERSION  1u
#define XFER_RING_MIN_SLOTS    2u
#define XFER_RING_MAX_SLOTS    (1u << 20)
#define XFER_RING_MAX_COUNTERS 65535u
#define XFER_RING_NO_COUNTER   0xffffffffu /* a request that bumps no counter */
/* timeout_ns argument meaning "the ring's configured bound" */
#define XFER_RING_TIMEOUT_DEFAULT 0xffffffffffffffffull

enum xfer_ring_op {
    XFER_RING_OP_PUT = 1,   /* local -> remote (an engine WRITE) */
    XFER_RING_OP_GET = 2,   /* remote -> local (an engine READ) */
    XFER_RING_OP_FENCE = 3, /* later requests start after every earlier one finished */
};

enum xfer_ring_state {
    XFER_RING_CREATED = 0,  /* proxy not started yet: requests queue up */
    XFER_RING_RUNNING = 1,  /* proxy draining */
    XFER_RING_STOPPING = 2, /* teardown: no request starts any more */
    XFER_RING_STOPPED = 3,  /* proxy gone; what was in flight has been failed */
};

/* One request: one 64-byte line. seq is written last, with release
 * semantics at system scope; the proxy reads the other fields only after it
 * saw seq == ticket + 1. */
struct xfer_ring_slot {
    uint64_t seq;        /* ticket + 1 once the request is complete */
    uint32_t op;         /* enum xfer_ring_op */
    uint32_t counter;    /* completion counter, or XFER_RING_NO_COUNTER */
    uint32_t local;      /* local region index (xfer_gpu_ring_add_local) */
    uint32_t remote;     /* remote (peer, region) index (xfer_gpu_ring_add_remote) */
    uint64_t local_off;  /* byte offset in the local region */
    uint64_t remote_off; /* byte offset in the remote region */
    uint64_t len;        /* bytes */
    uint64_t tag;        /* the producer's cookie, given back with failures */
    uint64_t reserved;
};

/* Written by the proxy only; producers read it. tail on its own line: it
 * is what producers poll when the ring is full. */
struct xfer_ring_hdr {
    uint64_t tail; /* requests taken out: ticket t may be written once t < tail + slots */
    uint8_t pad0[56];
    int32_t state;      /* enum xfer_ring_state */
    int32_t error;      /* first failure of any request (-XFER_E*), sticky; 0 = none */
    uint64_t completed; /* requests finished without error */
    uint64_t failed;    /* requests finished with an error */
    uint32_t abi;       /* XFER_RING_ABI_VERSION */
    uint32_t slots;
    uint8_t pad1[32];
};

/* A completion counter, written by the proxy only: failed and error are
 * stored before done (release), so a producer that acquired done sees them. */
struct xfer_ring_counter {
    uint64_t done;   /* requests naming this counter that finished (ok or not) */
    uint64_t failed; /* of which failed */
    int32_t error;   /* code of the last failure (-XFER_E*) */
    uint32_t pad;
    uint64_t reserved;
};

/* Producer-only state (GPU memory for a GPU ring). */
struct xfer_ring_prod {
    uint64_t head; /* tickets handed out (reservation CAS) */
    uint8_t pad0[56];
    uint64_t tail_seen;    /* a recent hdr->tail: spares a PCIe read per request */
    uint64_t full_waits;   /* reservations that found the ring full (back-pressure) */
    uint64_t next_poll_ns; /* the polling token: no read of proxy memory before this */
    uint8_t pad1[40];
};

/* What a kernel gets (by value, as a kernel argument): pointers valid on the
 * ring's GPU, or in the host process for a host ring. */
struct xfer_ring_dev {
    struct xfer_ring_slot *slots;
    struct xfer_ring_hdr *hdr;
    struct xfer_ring_counter *counters;
    struct xfer_ring_prod *prod;
    uint32_t mask;       /* slots - 1 (slots is a power of two) */
    uint32_t n_counters; /* valid counter indices: 0 .. n_counters - 1 */
    uint64_t timeout_ns; /* bound of back-pressure waits and counter waits */
    uint32_t poll_ns;    /* waiting producers read proxy memory at most once per this, together */
    uint32_t pad;
};

#ifdef __cplusplus
#define XFER_RING_ASSERT static_assert
#else
#define XFER_RING_ASSERT _Static_assert
#endif
XFER_RING_ASSERT(sizeof(struct xfer_ring_slot) == 64, "a request is one 64-byte line");
XFER_RING_ASSERT(sizeof(struct xfer_ring_hdr) == 128, "ring header is two lines");
XFER_RING_ASSERT(sizeof(struct xfer_ring_counter) == 32, "counter is 32 bytes");
XFER_RING_ASSERT(sizeof(struct xfer_ring_prod) == 128, "producer state is two lines");
#undef XFER_RING_ASSERT

#ifdef __cplusplus
}
#endif
#endif /* XFER_RING_H */
