/*
 * GPU request rings: the object (config, memory layout, device handle),
 * the region tables kernels address by index, start/stop/free and queries.
 * The proxy thread is gpu_ring_proxy.c.
 */
#include "gpu_ring.h"

#include <errno.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define RING_DEFAULT_TIMEOUT_NS 10000000000ull /* 10 s */

void xfer_gpu_ring_config_init(struct xfer_gpu_ring_config *cfg)
{
    if (!cfg)
        return;
    memset(cfg, 0, sizeof(*cfg));
    cfg->device = 0;
    cfg->slots = 1024;
    cfg->counters = 256;
    cfg->regions_max = 256;
    cfg->batch_max = 256;
    cfg->outstanding_max = 4096;
    cfg->timeout_ns = RING_DEFAULT_TIMEOUT_NS;
    cfg->poll_ns = 250;
    cfg->spin_us = 200;
    cfg->sleep_us = 50;
    cfg->numa_node = XFER_GPU_RING_NUMA_AUTO;
}

void ring_set_error(xfer_gpu_ring *r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&r->err_mu);
    vsnprintf(r->last_err, sizeof(r->last_err), fmt, ap);
    pthread_mutex_unlock(&r->err_mu);
    va_end(ap);
}

static const char *config_problem(const struct xfer_gpu_ring_config *c)
{
    if (c->device < -1)
        return "device must be a CUDA ordinal or -1 (host ring)";
    if (c->slots < XFER_RING_MIN_SLOTS || c->slots > XFER_RING_MAX_SLOTS ||
        (c->slots & (c->slots - 1)))
        return "slots must be a power of two in [2, 2^20]";
    if (c->counters < 1 || c->counters > XFER_RING_MAX_COUNTERS)
        return "counters must be in [1, 65535]";
    if (c->regions_max < 1 || c->regions_max > 65536)
        return "regions_max must be in [1, 65536]";
    if (c->batch_max < 1 || c->batch_max > 65536 || c->outstanding_max < c->batch_max ||
        c->outstanding_max > (1u << 24))
        return "need 1 <= batch_max <= outstanding_max <= 2^24, batch_max <= 65536";
    if (c->deadline_ms < 0 || c->spin_us < 0 || c->sleep_us < 1 || c->sleep_us > 1000000)
        return "deadline_ms, spin_us >= 0 and 1 <= sleep_us <= 10^6";
    if (c->timeout_ns == 0 || c->timeout_ns == XFER_RING_TIMEOUT_DEFAULT)
        return "timeout_ns must be > 0 and finite";
    if (c->numa_node < XFER_GPU_RING_NUMA_AUTO)
        return "numa_node must be XFER_GPU_RING_NUMA_AUTO, -1 or a node";
    return NULL;
}

/* Where the proxy runs: the GPU's node, the configured one, or nowhere. */
static int choose_numa_node(const struct xfer_gpu_ring_config *c, int *node)
{
    cpu_set_t set;
    *node = c->numa_node;
    if (*node == XFER_GPU_RING_NUMA_AUTO)
        *node = c->device >= 0 ? ring_gpu_numa_node(c->device) : -1;
    if (*node < 0)
        return 0;
    if (ring_numa_cpus(*node, &set) == 0)
        return 0;
    if (c->numa_node >= 0) {
        xfer_err("gpu ring: NUMA node %d has no CPU list in sysfs", c->numa_node);
        return -XFER_EINVAL;
    }
    *node = -1; /* the GPU's node is unknown here: leave placement to the kernel */
    return 0;
}

/* slots | hdr | counters in one block; the device handle points into the
 * GPU's view of it. */
static void lay_out(xfer_gpu_ring *r)
{
    const struct xfer_gpu_ring_config *c = &r->cfg;
    size_t hdr_off = (size_t)c->slots * sizeof(struct xfer_ring_slot);
    size_t ctr_off = hdr_off + sizeof(struct xfer_ring_hdr);
    uint8_t *h = r->mem.block, *d = r->mem.block_dev;
    r->slots = (struct xfer_ring_slot *)h;
    r->hdr = (struct xfer_ring_hdr *)(h + hdr_off);
    r->counters = (struct xfer_ring_counter *)(h + ctr_off);
    r->hdr->abi = XFER_RING_ABI_VERSION;
    r->hdr->slots = c->slots;
    r->hdr->state = XFER_RING_CREATED;
    struct xfer_ring_dev dev = {
        .slots = (struct xfer_ring_slot *)d,
        .hdr = (struct xfer_ring_hdr *)(d + hdr_off),
        .counters = (struct xfer_ring_counter *)(d + ctr_off),
        .prod = r->mem.prod,
        .mask = c->slots - 1,
        .n_counters = c->counters,
        .timeout_ns = c->timeout_ns,
        .poll_ns = c->poll_ns,
    };
    r->dev = dev;
    r->host_dev = dev;
    r->host_dev.slots = r->slots;
    r->host_dev.hdr = r->hdr;
    r->host_dev.counters = r->counters;
    if (c->device >= 0) { /* the host reads host memory only: producer state is on the GPU */
        r->host_dev.prod = NULL;
        r->host_dev.poll_ns = 0;
    }
}

static int ring_init(xfer_gpu_ring *r)
{
    const struct xfer_gpu_ring_config *c = &r->cfg;
    size_t bytes = (size_t)c->slots * sizeof(struct xfer_ring_slot) + sizeof(struct xfer_ring_hdr) +
                   (size_t)c->counters * sizeof(struct xfer_ring_counter);
    char why[160];
    int rc = ring_mem_alloc(&r->mem, c->device, bytes, r->numa_node, why, sizeof(why));
    if (rc < 0) {
        xfer_err("gpu ring for %s %d: %s", c->device < 0 ? "host" : "GPU", c->device, why);
        return rc;
    }
    lay_out(r);
    r->locals = calloc(c->regions_max, sizeof(*r->locals));
    r->remotes = calloc(c->regions_max, sizeof(*r->remotes));
    r->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (!r->locals || !r->remotes || r->wake_fd < 0)
        return -XFER_ENOMEM;
    return ring_proxy_new(r);
}

xfer_gpu_ring *xfer_gpu_ring_new(xfer_engine *e, const struct xfer_gpu_ring_config *cfg, int *err)
{
    int rc = -XFER_EINVAL;
    xfer_gpu_ring *r = NULL;
    const char *bad = cfg ? config_problem(cfg) : "no config";
    if (!e || bad) {
        xfer_err("gpu ring: %s", bad ? bad : "no engine");
        goto out;
    }
    rc = -XFER_ENOMEM;
    r = calloc(1, sizeof(*r));
    if (!r)
        goto out;
    r->engine = e;
    r->cfg = *cfg;
    r->wake_fd = -1;
    r->mem.device = -1;
    pthread_mutex_init(&r->table_mu, NULL);
    pthread_mutex_init(&r->mu, NULL);
    pthread_mutex_init(&r->err_mu, NULL);
    rc = choose_numa_node(cfg, &r->numa_node);
    if (rc == 0)
        rc = ring_init(r);
    if (rc < 0) {
        xfer_gpu_ring_free(r);
        r = NULL;
    }
out:
    if (err)
        *err = rc;
    return r;
}

void xfer_gpu_ring_free(xfer_gpu_ring *r)
{
    if (!r)
        return;
    if (r->hdr) {
        xfer_gpu_ring_stop(r, 0, NULL);
        uint64_t late = ring_fail_posted(r, -XFER_ECANCELED, "posted after the ring stopped");
        if (late)
            xfer_warn("gpu ring: %llu requests posted after the stop were failed",
                      (unsigned long long)late);
    }
    ring_proxy_free(r);
    if (r->wake_fd >= 0)
        close(r->wake_fd);
    free(r->locals);
    free(r->remotes);
    ring_mem_free(&r->mem);
    pthread_mutex_destroy(&r->table_mu);
    pthread_mutex_destroy(&r->mu);
    pthread_mutex_destroy(&r->err_mu);
    free(r);
}

/* ---- tables ------------------------------------------------------------------- */

int xfer_gpu_ring_add_local(xfer_gpu_ring *r, xfer_region *local)
{
    if (!r || !local)
        return -XFER_EINVAL;
    pthread_mutex_lock(&r->table_mu);
    uint32_t n = r->n_locals;
    int rc = -XFER_ENOSPC;
    if (n < r->cfg.regions_max) {
        r->locals[n] = (struct ring_local){local, xfer_region_len(local)};
        __atomic_store_n(&r->n_locals, n + 1, __ATOMIC_RELEASE);
        rc = (int)n;
    } else {
        ring_set_error(r, "local region table full (%u)", r->cfg.regions_max);
    }
    pthread_mutex_unlock(&r->table_mu);
    return rc;
}

int xfer_gpu_ring_add_remote(xfer_gpu_ring *r, xfer_peer *p, const char *region)
{
    if (!r || !p || !region)
        return -XFER_EINVAL;
    struct xfer_region_desc d;
    if (xfer_peer_region_lookup(p, region, &d) < 0) {
        struct xfer_peer_desc pd;
        xfer_peer_describe(p, &pd);
        ring_set_error(r, "peer %s has no cached region %s", pd.node_id, region);
        return -XFER_ENOENT;
    }
    pthread_mutex_lock(&r->table_mu);
    uint32_t n = r->n_remotes;
    int rc = -XFER_ENOSPC;
    if (n < r->cfg.regions_max) {
        r->remotes[n] = (struct ring_remote){p, d.id, d.gen, d.len};
        __atomic_store_n(&r->n_remotes, n + 1, __ATOMIC_RELEASE);
        rc = (int)n;
    } else {
        ring_set_error(r, "remote region table full (%u)", r->cfg.regions_max);
    }
    pthread_mutex_unlock(&r->table_mu);
    return rc;
}

/* ---- start / stop --------------------------------------------------------------- */

/* Thread attributes placing the proxy on its node's CPUs (those this process
 * may use); false when there is nothing to place. */
static bool placement(const xfer_gpu_ring *r, pthread_attr_t *attr)
{
    cpu_set_t node, allowed;
    if (r->numa_node < 0 || ring_numa_cpus(r->numa_node, &node) < 0 ||
        sched_getaffinity(0, sizeof(allowed), &allowed) < 0)
        return false;
    CPU_AND(&node, &node, &allowed);
    if (CPU_COUNT(&node) == 0)
        return false;
    pthread_attr_init(attr);
    if (pthread_attr_setaffinity_np(attr, sizeof(node), &node) != 0) {
        pthread_attr_destroy(attr);
        return false;
    }
    return true;
}

int xfer_gpu_ring_start(xfer_gpu_ring *r)
{
    if (!r)
        return -XFER_EINVAL;
    pthread_mutex_lock(&r->mu);
    int rc = r->started || r->stopped ? -XFER_EBUSY : 0;
    if (rc == 0) {
        pthread_attr_t attr;
        bool placed = placement(r, &attr);
        __atomic_store_n(&r->hdr->state, XFER_RING_RUNNING, __ATOMIC_RELEASE);
        int prc = pthread_create(&r->thread, placed ? &attr : NULL, ring_proxy_main, r);
        if (placed)
            pthread_attr_destroy(&attr);
        if (prc != 0) {
            __atomic_store_n(&r->hdr->state, XFER_RING_CREATED, __ATOMIC_RELEASE);
            ring_set_error(r, "cannot start the proxy thread: %s", strerror(prc));
            rc = -XFER_ENOMEM;
        } else {
            r->started = true;
            if (!placed)
                r->numa_node = -1;
        }
    }
    pthread_mutex_unlock(&r->mu);
    return rc;
}

int xfer_gpu_ring_stop(xfer_gpu_ring *r, int drain_ms, struct xfer_gpu_ring_report *rep)
{
    if (!r)
        return -XFER_EINVAL;
    if (rep)
        memset(rep, 0, sizeof(*rep));
    pthread_mutex_lock(&r->mu);
    if (!r->stopped) {
        if (r->started) {
            r->drain_ms = drain_ms > 0 ? drain_ms : 0;
            __atomic_store_n(&r->stop, 1, __ATOMIC_RELEASE);
            uint64_t one = 1;
            if (write(r->wake_fd, &one, sizeof(one)) < 0)
                xfer_debug("gpu ring: wake: %s", strerror(errno));
            pthread_join(r->thread, NULL); /* the proxy tears down, then leaves */
        } else {
            __atomic_store_n(&r->hdr->state, XFER_RING_STOPPING, __ATOMIC_RELEASE);
            r->report.unstarted = ring_fail_posted(r, -XFER_ECANCELED, "ring stopped unstarted");
            __atomic_store_n(&r->hdr->state, XFER_RING_STOPPED, __ATOMIC_RELEASE);
        }
        r->stopped = true;
        if (rep)
            *rep = r->report;
        if (r->report.cancelled || r->report.unstarted)
            xfer_warn("gpu ring: stop failed %llu requests in flight and %llu not started",
                      (unsigned long long)r->report.cancelled,
                      (unsigned long long)r->report.unstarted);
    }
    pthread_mutex_unlock(&r->mu);
    return 0;
}

/* ---- queries --------------------------------------------------------------------- */

int xfer_gpu_ring_device_handle(const xfer_gpu_ring *r, struct xfer_ring_dev *out)
{
    if (!r || !out)
        return -XFER_EINVAL;
    *out = r->dev;
    return 0;
}

int xfer_gpu_ring_counter(const xfer_gpu_ring *r, uint32_t idx, uint64_t *done, uint64_t *failed,
                          int *last_err)
{
    if (!r || idx >= r->cfg.counters)
        return -XFER_EINVAL;
    struct xfer_ring_counter *c = &r->counters[idx];
    uint64_t d = __atomic_load_n(&c->done, __ATOMIC_ACQUIRE);
    if (done)
        *done = d;
    if (failed)
        *failed = __atomic_load_n(&c->failed, __ATOMIC_RELAXED);
    if (last_err)
        *last_err = __atomic_load_n(&c->error, __ATOMIC_RELAXED);
    return 0;
}

int xfer_gpu_ring_error(const xfer_gpu_ring *r)
{
    return r ? __atomic_load_n(&r->hdr->error, __ATOMIC_ACQUIRE) : -XFER_EINVAL;
}

const char *xfer_gpu_ring_last_error(const xfer_gpu_ring *r)
{
    return r ? r->last_err : "no ring";
}

#define LOAD(x) __atomic_load_n(&(x), __ATOMIC_RELAXED)

/* Requests published past the released tail, in ticket order. */
static uint64_t queued(const xfer_gpu_ring *r)
{
    uint64_t t = __atomic_load_n(&r->hdr->tail, __ATOMIC_ACQUIRE), n = 0;
    while (n < r->cfg.slots &&
           __atomic_load_n(&r->slots[(t + n) & r->dev.mask].seq, __ATOMIC_ACQUIRE) == t + n + 1)
        n++;
    return n;
}

void xfer_gpu_ring_stats(const xfer_gpu_ring *r, struct xfer_gpu_ring_stats *out)
{
    if (!out)
        return;
    memset(out, 0, sizeof(*out));
    if (!r)
        return;
    out->state = __atomic_load_n(&r->hdr->state, __ATOMIC_ACQUIRE);
    out->error = __atomic_load_n(&r->hdr->error, __ATOMIC_ACQUIRE);
    out->numa_node = r->numa_node;
    out->queued = queued(r);
    out->taken = LOAD(r->n_taken);
    out->completed = LOAD(r->n_completed);
    out->failed = LOAD(r->n_failed);
    out->fences = LOAD(r->n_fences);
    /* every request taken ends completed, failed or (a fence) in fences */
    uint64_t finished = out->completed + out->failed + out->fences;
    out->in_flight = out->taken > finished ? out->taken - finished : 0;
    out->batches = LOAD(r->n_batches);
    out->batch_items_max = LOAD(r->n_batch_max);
    if (r->cfg.device < 0)
        out->full_waits = LOAD(((struct xfer_ring_prod *)r->mem.prod)->full_waits);
}
