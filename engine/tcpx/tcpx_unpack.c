/*
 * Receives of a plugin in UNPACK device mode (GPUDirect-TCPX): the data is
 * in the plugin's bounce buffer, described by fragments in the unpack
 * metadata (engine/tcpx/nccl_net.h). They are read through that declared
 * interface only, checked (xfer_unpack_check: inside the destination, no
 * overlap, adding up to the size the plugin reported), copied into place by
 * the method of XFER_TCPX_UNPACK, and the pages are given back with
 * irecvConsumed.
 */
#include "tcpx.h"

#include <stdio.h>
#include <string.h>

#define UNPACK_WAIT_MS 5000

int tcpx_unpack_setup(struct tcpx_link *l, char *why, size_t wl)
{
    struct xnccl_net_device_handle *dh = &l->recv_dh;
    if (dh->net_device_version != XNCCL_NET_DEVICE_UNPACK_VERSION) {
        snprintf(why, wl, "plugin offers unpack version %d, we know %d", dh->net_device_version,
                 XNCCL_NET_DEVICE_UNPACK_VERSION);
        return -XFER_ENOTSUP;
    }
    if (dh->size && dh->size < sizeof(l->uh)) {
        snprintf(why, wl, "plugin's unpack handle is %zu bytes, want %zu", dh->size, sizeof(l->uh));
        return -XFER_EPROTO;
    }
    /* the handle lives in device memory (host memory for a plugin without
     * a GPU): one copy, it does not change for the life of the comm */
    if (xfer_kernels_copy(&l->uh, dh->handle, sizeof(l->uh)) < 0) {
        snprintf(why, wl, "cannot read the plugin's unpack handle");
        return -XFER_EIO;
    }
    l->meta = l->uh.meta ? xfer_kernels_host_ptr(l->uh.meta) : NULL;
    if (!l->meta || !l->uh.bounce_buf) {
        snprintf(why, wl, "plugin's unpack handle has no %s",
                 l->uh.bounce_buf ? "host-visible metadata" : "bounce buffer");
        return -XFER_EPROTO;
    }
    return 0;
}

static int copy_out(struct tcpx_link *l, void *dst, const struct xfer_unpack_frag *f, size_t n,
                    char *why, size_t wl)
{
    struct tcpx_transport *tt = l->tt;
    const void *bounce = l->uh.bounce_buf;
    int dev = xfer_kernels_ptr_device(dst);
    if (dev < 0)
        dev = xfer_kernels_ptr_device(bounce);
    if (dev < 0) { /* both host memory: the CPU copies */
        xfer_kref_unpack(dst, bounce, f, n);
        return 0;
    }
    if (dev >= 16) {
        snprintf(why, wl, "GPU %d: too many GPUs", dev);
        return -XFER_ENOTSUP;
    }
    int rc = 0;
    if (!tt->unpacker[dev] && (rc = xfer_unpacker_new(dev, &tt->unpacker[dev])) < 0) {
        snprintf(why, wl, "no unpacker for GPU %d: %s", dev, xfer_strerror(rc));
        return rc;
    }
    struct xfer_unpacker *u = tt->unpacker[dev];
    rc = xfer_unpacker_start(u, tt->method, dst, bounce, f, n);
    if (rc == 0)
        rc = xfer_unpacker_wait(u, UNPACK_WAIT_MS);
    if (rc < 0)
        snprintf(why, wl, "unpack (%s): %s", xfer_unpack_method_name(xfer_unpacker_method(u)),
                 xfer_unpacker_last_error(u));
    else if (xfer_unpacker_method(u) != tt->method && !tt->warned_unpack) {
        tt->warned_unpack = true;
        xfer_info("tcpx: unpack method %s cannot reach this memory; using %s",
                  xfer_unpack_method_name(tt->method),
                  xfer_unpack_method_name(xfer_unpacker_method(u)));
    }
    return rc;
}

int tcpx_unpack(struct tcpx_link *l, struct tcpx_req *req, void *dst, char *why, size_t wl)
{
    char scratch[8];
    if (!why) {
        why = scratch;
        wl = sizeof(scratch);
    }
    unsigned slot = (unsigned)((l->uh.head + 1 + req->seq) % XNCCL_UNPACK_QUEUE_DEPTH);
    uint64_t cnt = __atomic_load_n(&l->meta->cnt[slot], __ATOMIC_ACQUIRE);
    const struct xfer_unpack_frag *f = (const struct xfer_unpack_frag *)l->meta->mem[slot];
    size_t bad = 0;
    int rc = 0;
    if (cnt > XNCCL_UNPACK_SLICE_PAGES) {
        snprintf(why, wl, "plugin reported %llu fragments for one receive (at most %u)",
                 (unsigned long long)cnt, XNCCL_UNPACK_SLICE_PAGES);
        rc = -XFER_EPROTO;
    } else if ((rc = xfer_unpack_check(f, cnt, 0, (uint64_t)req->got, &bad)) < 0) {
        if (bad < cnt)
            snprintf(why, wl, "plugin fragment %zu/%llu (len %u at %llu) %s %d-byte receive", bad,
                     (unsigned long long)cnt, f[bad].len, (unsigned long long)f[bad].dst_off,
                     rc == -XFER_ERANGE ? "outside its" : "overlaps another in its", req->got);
        else
            snprintf(why, wl, "plugin's %llu fragments do not add up to its %d-byte receive",
                     (unsigned long long)cnt, req->got);
        if (rc == -XFER_ERANGE)
            rc = -XFER_EPROTO;
    } else if (dst && cnt) {
        rc = copy_out(l, dst, f, cnt, why, wl);
    }
    int r = tcpx_net_irecv_consumed(l->tt->net, l->recv_comm, req->preq);
    if (r != 0 && rc == 0) {
        snprintf(why, wl, "plugin irecvConsumed: %s", tcpx_net_result_str(r));
        rc = -XFER_EIO;
    }
    return rc;
}

void tcpx_unpack_free(struct tcpx_transport *tt)
{
    for (int d = 0; d < 16; d++) {
        xfer_unpacker_free(tt->unpacker[d]);
        tt->unpacker[d] = NULL;
    }
}
