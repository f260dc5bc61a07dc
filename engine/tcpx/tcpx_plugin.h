/*
 * An NCCL net plugin loaded at run time (dlopen), behind one set of calls
 * whatever struct version it exports (engine/tcpx/nccl_net.h).
 *
 * One plugin per process: the first tcpx_net_get() loads and initialises it,
 * later ones share it (NCCL's init is process-wide), the last
 * tcpx_net_put() finalises and unloads it. Every other call returns the
 * plugin's ncclResult_t (0 = success); tcpx_net_result_str() names it.
 */
#ifndef XFER_TCPX_PLUGIN_H
#define XFER_TCPX_PLUGIN_H

#include "nccl_net.h"

#include <stdbool.h>
#include <stddef.h>

/* Where the plugin is looked for when XFER_TCPX_PLUGIN is unset: NCCL's own
 * default name, resolved by the dynamic loader (LD_LIBRARY_PATH; the
 * GPUDirect-TCPX installer puts it in /usr/local/tcpx/lib64). */
#define TCPX_PLUGIN_DEFAULT "libnccl-net.so"

struct tcpx_net_props { /* the fields xfer uses, from any version */
    char name[64];
    int ptr_support; /* XNCCL_PTR_* */
    int reg_is_global;
    int force_flush;
    int speed_mbps;
    int max_recvs;
    int net_device_type; /* XNCCL_NET_DEVICE_* */
    int net_device_version;
};

struct tcpx_net {
    void *dl;
    int version; /* struct version found, XNCCL_NET_VERSION_MIN.. */
    const void *vt;
    void *ctx; /* v11+: context returned by init */
    int ndev;
    int dev; /* the device xfer uses (XFER_TCPX_DEV, default 0) */
    struct tcpx_net_props props;
    char path[256];
    int refs;
};

/* Loads path (NULL: $XFER_TCPX_PLUGIN, else TCPX_PLUGIN_DEFAULT); version 0
 * takes the newest exported struct (or $XFER_TCPX_NET_VERSION). 0 and *out,
 * or -XFER_ENOTSUP with the reason in why (not found, no known struct,
 * init failed, no device). */
int tcpx_net_get(const char *path, int version, struct tcpx_net **out, char *why, size_t why_len);
void tcpx_net_put(struct tcpx_net *n);
const char *tcpx_net_result_str(int result);

int tcpx_net_listen(struct tcpx_net *n, void *handle, void **listen_comm);
/* dev_out non-NULL asks for device offload (the plugin may still answer
 * HOST, or leave it NULL). */
int tcpx_net_connect(struct tcpx_net *n, void *handle, void **send_comm, xnccl_dh **dev_out);
int tcpx_net_accept(struct tcpx_net *n, void *listen_comm, void **recv_comm, xnccl_dh **dev_out);
int tcpx_net_reg_mr(struct tcpx_net *n, void *comm, void *data, size_t size, int type,
                    void **mhandle);
int tcpx_net_dereg_mr(struct tcpx_net *n, void *comm, void *mhandle);
int tcpx_net_isend(struct tcpx_net *n, void *comm, void *data, size_t size, int tag, void *mhandle,
                   void **request);
int tcpx_net_irecv(struct tcpx_net *n, void *comm, void *data, size_t size, int tag, void *mhandle,
                   void **request);
/* *request NULL after success: nothing to flush. */
int tcpx_net_iflush(struct tcpx_net *n, void *comm, void *data, int size, void *mhandle,
                    void **request);
int tcpx_net_test(struct tcpx_net *n, void *request, int *done, int *size);
/* Offload (UNPACK) comms: the receive's pages may be reused. */
int tcpx_net_irecv_consumed(struct tcpx_net *n, void *comm, void *request);
bool tcpx_net_has_consumed(const struct tcpx_net *n);
int tcpx_net_close_send(struct tcpx_net *n, void *comm);
int tcpx_net_close_recv(struct tcpx_net *n, void *comm);
int tcpx_net_close_listen(struct tcpx_net *n, void *comm);

#endif
