/*
 * GPU request rings: internals shared by gpu_ring.c (object, tables,
 * queries, stop), gpu_ring_proxy.c (the proxy thread), gpu_ring_mem.c
 * (ring memory and NUMA placement) and gpu_ring_host.c (CPU producers).
 * Built on the public engine API only (xfer.h): no engine internals.
 */
#ifndef XFER_GPU_RING_INTERNAL_H
#define XFER_GPU_RING_INTERNAL_H

#include "xfer_gpu_ring.h"

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

/* Ring memory (gpu_ring_mem.c). */
struct ring_mem {
    void *block;     /* host view: slots | hdr | counters */
    size_t bytes;    /* of block (whole pages) */
    void *block_dev; /* the GPU's view of block (block itself for a host ring) */
    void *prod;      /* struct xfer_ring_prod: GPU memory, or in host memory */
    int device;      /* -1 for a host ring */
    bool registered; /* block is cudaHostRegister'ed */
};

/* Allocates bytes of ring memory (zeroed) preferring NUMA node numa_node
 * (-1: anywhere), mapped into GPU `device` unless it is -1, plus the
 * producer state. 0, or -XFER_ENODEV/-XFER_ENOMEM/-XFER_EIO with the reason
 * in why. */
int ring_mem_alloc(struct ring_mem *m, int device, size_t bytes, int numa_node, char *why,
                   size_t why_len);
void ring_mem_free(struct ring_mem *m);
/* NUMA node of CUDA GPU `device`, -1 if unknown (or no such GPU). */
int ring_gpu_numa_node(int device);
/* CPUs of NUMA node `node` from sysfs into set; 0 or -XFER_ENOENT. */
int ring_numa_cpus(int node, void *cpu_set);
/* Parses a sysfs cpulist ("0-3,8,10-11") into a cpu_set_t; -XFER_EINVAL. */
int ring_parse_cpulist(const char *list, void *cpu_set);

struct ring_local {
    xfer_region *region;
    uint64_t len;
};

struct ring_remote {
    xfer_peer *peer;
    uint32_t id, gen;
    uint64_t len;
};

struct ring_proxy; /* gpu_ring_proxy.c */

struct xfer_gpu_ring {
    xfer_engine *engine;
    struct xfer_gpu_ring_config cfg;
    struct ring_mem mem;
    struct xfer_ring_slot *slots; /* host views into mem.block */
    struct xfer_ring_hdr *hdr;
    struct xfer_ring_counter *counters;
    struct xfer_ring_dev dev;      /* the kernels' handle */
    struct xfer_ring_dev host_dev; /* the same ring through host pointers */
    int numa_node;                 /* where the proxy runs, -1 = not placed */

    pthread_mutex_t table_mu; /* adders; the proxy reads the counts (acquire) */
    struct ring_local *locals;
    struct ring_remote *remotes;
    uint32_t n_locals, n_remotes; /* atomic */

    pthread_mutex_t mu; /* start/stop/free */
    pthread_t thread;
    bool started, stopped;
    int stop;     /* atomic: ask the proxy to tear down */
    int drain_ms; /* written before stop is set */
    int wake_fd;  /* eventfd: wakes a sleeping proxy */
    struct ring_proxy *px;

    /* counts: written by the proxy thread, read by anyone (atomic) */
    uint64_t n_taken, n_completed, n_failed, n_batches, n_batch_max, n_fences;
    struct xfer_gpu_ring_report report; /* filled by the teardown */

    pthread_mutex_t err_mu;
    char last_err[256];
};

void ring_set_error(xfer_gpu_ring *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- proxy (gpu_ring_proxy.c) --------------------------------------------- */
int ring_proxy_new(xfer_gpu_ring *r);
void ring_proxy_free(xfer_gpu_ring *r);
void *ring_proxy_main(void *arg);
/* Fails every request published in the ring and not taken yet (the proxy
 * is not running); returns how many. */
uint64_t ring_fail_posted(xfer_gpu_ring *r, int err, const char *why);
/* Finishes one request: counters, error word, counts, on_fail. */
void ring_finish(xfer_gpu_ring *r, const struct xfer_ring_slot *req, int status, const char *why);

#endif
