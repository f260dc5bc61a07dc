/*
 * The NCCL network plugin ABI, as xfer uses it: our own declarations of the
 * exported plugin structs v7 to v12, with their version numbers, and of the
 * "unpack" device-offload interface GPUDirect-TCPX uses for received data.
 *
 * Facts (NCCL's plugins/net/example headers, NCCL 2.30; the GPUDirect-TCPX
 * plugin's devcomm sources):
 *  - a plugin is a shared library exporting one struct per supported version
 *    under the name "ncclNetPlugin_v<N>"; NCCL looks for v12 down to v6;
 *  - v8 makes regMr's size a size_t, v9 the isend/irecv sizes (and adds
 *    makeVDevice), v10 adds a profiler callback to init, a comm config to
 *    connect and profiler handles to isend/irecv, v11 a per-communicator
 *    context (init returns it; listen and connect take it) plus finalize and
 *    setNetAttr, v12 only widens the properties (8 devices per vNIC, rail
 *    and plane ids);
 *  - connection handles are at most 128 bytes; connect and accept must not
 *    block: they return no comm until the connection is ready and are
 *    called again;
 *  - every call returns an ncclResult_t, 0 = success.
 * Only the layouts matter here: the names are ours (xnccl_*).
 */
#ifndef XFER_TCPX_NCCL_NET_H
#define XFER_TCPX_NCCL_NET_H

#include <stddef.h>
#include <stdint.h>

#define XNCCL_NET_HANDLE_MAXSIZE 128
#define XNCCL_PTR_HOST           0x1
#define XNCCL_PTR_CUDA           0x2
#define XNCCL_PTR_DMABUF         0x4

/* ncclResult_t */
enum xnccl_result {
    XNCCL_SUCCESS = 0,
    XNCCL_UNHANDLED_CUDA_ERROR = 1,
    XNCCL_SYSTEM_ERROR = 2,
    XNCCL_INTERNAL_ERROR = 3,
    XNCCL_INVALID_ARGUMENT = 4,
    XNCCL_INVALID_USAGE = 5,
    XNCCL_REMOTE_ERROR = 6,
    XNCCL_IN_PROGRESS = 7,
};
typedef int xnccl_result_t;

/* ncclDebugLogger_t: level (0 none .. 5 trace), subsystem flags. */
typedef void (*xnccl_logger_t)(int level, unsigned long flags, const char *file, int line,
                               const char *fmt, ...);
typedef xnccl_result_t (*xnccl_profiler_cb_t)(void **handle, int type, void *phandle,
                                              int64_t plugin_id, void *ext);

/* ---- device offload ("netDeviceType") -------------------------------------- */
enum xnccl_net_device_type { XNCCL_NET_DEVICE_HOST = 0, XNCCL_NET_DEVICE_UNPACK = 1 };
#define XNCCL_NET_DEVICE_UNPACK_VERSION 0x7

/* Returned by connect/accept when the caller asked for offload (passed a
 * non-NULL device-handle pointer); the same layout in v7..v12. */
struct xnccl_net_device_handle {
    int net_device_type; /* enum xnccl_net_device_type */
    int net_device_version;
    void *handle; /* UNPACK: device memory holding struct xnccl_unpack_handle */
    size_t size;
    int needs_proxy_progress;
};

/* The unpack interface of a receive comm in UNPACK mode. The plugin writes
 * every receive into its bounce buffer (GPU memory it owns) and describes it
 * as a list of fragments in meta->mem[slot][0 .. meta->cnt[slot]); slot is
 * (head + 1 + k) % XNCCL_UNPACK_QUEUE_DEPTH for the k-th receive posted on
 * the comm (the consumer increments head before each copy). dst_off is
 * relative to the data pointer the receive was posted with. After copying,
 * the consumer calls irecvConsumed so the plugin can reuse the pages. */
#define XNCCL_UNPACK_QUEUE_DEPTH 16
#define XNCCL_UNPACK_MAX_SLICE   (4u << 20) /* bytes per receive */
#define XNCCL_UNPACK_PAGE        4096
#define XNCCL_UNPACK_SLICE_PAGES (XNCCL_UNPACK_MAX_SLICE / XNCCL_UNPACK_PAGE * 2)

struct xnccl_unpack_frag { /* loadMeta: 16 bytes */
    uint32_t src_off;
    uint32_t len;
    uint64_t dst_off;
};

struct xnccl_unpack_meta { /* netUnpackMeta: mapped pinned host memory */
    struct xnccl_unpack_frag mem[XNCCL_UNPACK_QUEUE_DEPTH][XNCCL_UNPACK_SLICE_PAGES];
    uint64_t cnt[XNCCL_UNPACK_QUEUE_DEPTH];
};

struct xnccl_unpack_handle {        /* unpackNetDeviceHandle, in device memory */
    struct xnccl_unpack_meta *meta; /* device address of the mapped meta */
    void *bounce_buf;
    uint64_t head;
};

/* ---- properties ------------------------------------------------------------ */
struct xnccl_props_v7 {
    char *name;
    char *pci_path;
    uint64_t guid;
    int ptr_support; /* XNCCL_PTR_* */
    int speed;       /* Mbps */
    int port;
    float latency;
    int max_comms;
    int max_recvs;
    int net_device_type;
    int net_device_version;
};

struct xnccl_props_v8 {
    char *name;
    char *pci_path;
    uint64_t guid;
    int ptr_support;
    int reg_is_global;
    int speed;
    int port;
    float latency;
    int max_comms;
    int max_recvs;
    int net_device_type;
    int net_device_version;
};

struct xnccl_vdev_v9 { /* also v10 and v11 */
    int ndevs;
    int devs[4];
};

struct xnccl_props_v9 { /* also v10 */
    char *name;
    char *pci_path;
    uint64_t guid;
    int ptr_support;
    int reg_is_global;
    int force_flush;
    int speed;
    int port;
    float latency;
    int max_comms;
    int max_recvs;
    int net_device_type;
    int net_device_version;
    struct xnccl_vdev_v9 vprops;
    size_t max_p2p_bytes;
    size_t max_coll_bytes;
};

struct xnccl_props_v11 {
    struct xnccl_props_v9 v9;
    int max_multi_request_size;
};

struct xnccl_vdev_v12 {
    int ndevs;
    int devs[8];
};

struct xnccl_props_v12 {
    char *name;
    char *pci_path;
    uint64_t guid;
    int ptr_support;
    int reg_is_global;
    int force_flush;
    int speed;
    int port;
    float latency;
    int max_comms;
    int max_recvs;
    int net_device_type;
    int net_device_version;
    struct xnccl_vdev_v12 vprops;
    size_t max_p2p_bytes;
    size_t max_coll_bytes;
    int max_multi_request_size;
    int16_t rail_id;
    int16_t plane_id;
};

struct xnccl_comm_config { /* v10..v12 */
    int traffic_class;     /* -1 = undefined */
};

typedef struct xnccl_net_device_handle xnccl_dh;

/* ---- the exported structs -------------------------------------------------- */

/* v7 (the version GPUDirect-TCPX exports). */
struct xnccl_net_v7 {
    const char *name;
    xnccl_result_t (*init)(xnccl_logger_t log);
    xnccl_result_t (*devices)(int *ndev);
    xnccl_result_t (*get_properties)(int dev, struct xnccl_props_v7 *props);
    xnccl_result_t (*listen)(int dev, void *handle, void **listen_comm);
    xnccl_result_t (*connect)(int dev, void *handle, void **send_comm, xnccl_dh **send_dev);
    xnccl_result_t (*accept)(void *listen_comm, void **recv_comm, xnccl_dh **recv_dev);
    xnccl_result_t (*reg_mr)(void *comm, void *data, int size, int type, void **mhandle);
    xnccl_result_t (*reg_mr_dmabuf)(void *comm, void *data, size_t size, int type, uint64_t offset,
                                    int fd, void **mhandle);
    xnccl_result_t (*dereg_mr)(void *comm, void *mhandle);
    xnccl_result_t (*isend)(void *send_comm, void *data, int size, int tag, void *mhandle,
                            void **request);
    xnccl_result_t (*irecv)(void *recv_comm, int n, void **data, int *sizes, int *tags,
                            void **mhandles, void **request);
    xnccl_result_t (*iflush)(void *recv_comm, int n, void **data, int *sizes, void **mhandles,
                             void **request);
    xnccl_result_t (*test)(void *request, int *done, int *sizes);
    xnccl_result_t (*close_send)(void *send_comm);
    xnccl_result_t (*close_recv)(void *recv_comm);
    xnccl_result_t (*close_listen)(void *listen_comm);
    xnccl_result_t (*get_device_mr)(void *comm, void *mhandle, void **dptr_mhandle);
    xnccl_result_t (*irecv_consumed)(void *recv_comm, int n, void *request);
};

/* v8: regMr takes a size_t. */
struct xnccl_net_v8 {
    const char *name;
    xnccl_result_t (*init)(xnccl_logger_t log);
    xnccl_result_t (*devices)(int *ndev);
    xnccl_result_t (*get_properties)(int dev, struct xnccl_props_v8 *props);
    xnccl_result_t (*listen)(int dev, void *handle, void **listen_comm);
    xnccl_result_t (*connect)(int dev, void *handle, void **send_comm, xnccl_dh **send_dev);
    xnccl_result_t (*accept)(void *listen_comm, void **recv_comm, xnccl_dh **recv_dev);
    xnccl_result_t (*reg_mr)(void *comm, void *data, size_t size, int type, void **mhandle);
    xnccl_result_t (*reg_mr_dmabuf)(void *comm, void *data, size_t size, int type, uint64_t offset,
                                    int fd, void **mhandle);
    xnccl_result_t (*dereg_mr)(void *comm, void *mhandle);
    xnccl_result_t (*isend)(void *send_comm, void *data, int size, int tag, void *mhandle,
                            void **request);
    xnccl_result_t (*irecv)(void *recv_comm, int n, void **data, int *sizes, int *tags,
                            void **mhandles, void **request);
    xnccl_result_t (*iflush)(void *recv_comm, int n, void **data, int *sizes, void **mhandles,
                             void **request);
    xnccl_result_t (*test)(void *request, int *done, int *sizes);
    xnccl_result_t (*close_send)(void *send_comm);
    xnccl_result_t (*close_recv)(void *recv_comm);
    xnccl_result_t (*close_listen)(void *listen_comm);
    xnccl_result_t (*get_device_mr)(void *comm, void *mhandle, void **dptr_mhandle);
    xnccl_result_t (*irecv_consumed)(void *recv_comm, int n, void *request);
};

/* v9: isend/irecv sizes are size_t; makeVDevice. */
struct xnccl_net_v9 {
    const char *name;
    xnccl_result_t (*init)(xnccl_logger_t log);
    xnccl_result_t (*devices)(int *ndev);
    xnccl_result_t (*get_properties)(int dev, struct xnccl_props_v9 *props);
    xnccl_result_t (*listen)(int dev, void *handle, void **listen_comm);
    xnccl_result_t (*connect)(int dev, void *handle, void **send_comm, xnccl_dh **send_dev);
    xnccl_result_t (*accept)(void *listen_comm, void **recv_comm, xnccl_dh **recv_dev);
    xnccl_result_t (*reg_mr)(void *comm, void *data, size_t size, int type, void **mhandle);
    xnccl_result_t (*reg_mr_dmabuf)(void *comm, void *data, size_t size, int type, uint64_t offset,
                                    int fd, void **mhandle);
    xnccl_result_t (*dereg_mr)(void *comm, void *mhandle);
    xnccl_result_t (*isend)(void *send_comm, void *data, size_t size, int tag, void *mhandle,
                            void **request);
    xnccl_result_t (*irecv)(void *recv_comm, int n, void **data, size_t *sizes, int *tags,
                            void **mhandles, void **request);
    xnccl_result_t (*iflush)(void *recv_comm, int n, void **data, int *sizes, void **mhandles,
                             void **request);
    xnccl_result_t (*test)(void *request, int *done, int *sizes);
    xnccl_result_t (*close_send)(void *send_comm);
    xnccl_result_t (*close_recv)(void *recv_comm);
    xnccl_result_t (*close_listen)(void *listen_comm);
    xnccl_result_t (*get_device_mr)(void *comm, void *mhandle, void **dptr_mhandle);
    xnccl_result_t (*irecv_consumed)(void *recv_comm, int n, void *request);
    xnccl_result_t (*make_vdevice)(int *d, struct xnccl_vdev_v9 *props);
};

/* v10: profiler callback in init, comm config in connect, profiler handles
 * in isend/irecv. */
struct xnccl_net_v10 {
    const char *name;
    xnccl_result_t (*init)(xnccl_logger_t log, xnccl_profiler_cb_t prof);
    xnccl_result_t (*devices)(int *ndev);
    xnccl_result_t (*get_properties)(int dev, struct xnccl_props_v9 *props);
    xnccl_result_t (*listen)(int dev, void *handle, void **listen_comm);
    xnccl_result_t (*connect)(int dev, struct xnccl_comm_config *config, void *handle,
                              void **send_comm, xnccl_dh **send_dev);
    xnccl_result_t (*accept)(void *listen_comm, void **recv_comm, xnccl_dh **recv_dev);
    xnccl_result_t (*reg_mr)(void *comm, void *data, size_t size, int type, void **mhandle);
    xnccl_result_t (*reg_mr_dmabuf)(void *comm, void *data, size_t size, int type, uint64_t offset,
                                    int fd, void **mhandle);
    xnccl_result_t (*dereg_mr)(void *comm, void *mhandle);
    xnccl_result_t (*isend)(void *send_comm, void *data, size_t size, int tag, void *mhandle,
                            void *phandle, void **request);
    xnccl_result_t (*irecv)(void *recv_comm, int n, void **data, size_t *sizes, int *tags,
                            void **mhandles, void **phandles, void **request);
    xnccl_result_t (*iflush)(void *recv_comm, int n, void **data, int *sizes, void **mhandles,
                             void **request);
    xnccl_result_t (*test)(void *request, int *done, int *sizes);
    xnccl_result_t (*close_send)(void *send_comm);
    xnccl_result_t (*close_recv)(void *recv_comm);
    xnccl_result_t (*close_listen)(void *listen_comm);
    xnccl_result_t (*get_device_mr)(void *comm, void *mhandle, void **dptr_mhandle);
    xnccl_result_t (*irecv_consumed)(void *recv_comm, int n, void *request);
    xnccl_result_t (*make_vdevice)(int *d, struct xnccl_vdev_v9 *props);
};

/* v11 (props v11) and v12 (props v12): a context from init, taken by listen
 * and connect; finalize and setNetAttr at the end. Same functions. */
#define XNCCL_NET_V11_BODY(props_t, vdev_t)                                                        \
    const char *name;                                                                              \
    xnccl_result_t (*init)(void **ctx, uint64_t comm_id, struct xnccl_comm_config *config,         \
                           xnccl_logger_t log, xnccl_profiler_cb_t prof);                          \
    xnccl_result_t (*devices)(int *ndev);                                                          \
    xnccl_result_t (*get_properties)(int dev, props_t *props);                                     \
    xnccl_result_t (*listen)(void *ctx, int dev, void *handle, void **listen_comm);                \
    xnccl_result_t (*connect)(void *ctx, int dev, void *handle, void **send_comm,                  \
                              xnccl_dh **send_dev);                                                \
    xnccl_result_t (*accept)(void *listen_comm, void **recv_comm, xnccl_dh **recv_dev);            \
    xnccl_result_t (*reg_mr)(void *comm, void *data, size_t size, int type, void **mhandle);       \
    xnccl_result_t (*reg_mr_dmabuf)(void *comm, void *data, size_t size, int type,                 \
                                    uint64_t offset, int fd, void **mhandle);                      \
    xnccl_result_t (*dereg_mr)(void *comm, void *mhandle);                                         \
    xnccl_result_t (*isend)(void *send_comm, void *data, size_t size, int tag, void *mhandle,      \
                            void *phandle, void **request);                                        \
    xnccl_result_t (*irecv)(void *recv_comm, int n, void **data, size_t *sizes, int *tags,         \
                            void **mhandles, void **phandles, void **request);                     \
    xnccl_result_t (*iflush)(void *recv_comm, int n, void **data, int *sizes, void **mhandles,     \
                             void **request);                                                      \
    xnccl_result_t (*test)(void *request, int *done, int *sizes);                                  \
    xnccl_result_t (*close_send)(void *send_comm);                                                 \
    xnccl_result_t (*close_recv)(void *recv_comm);                                                 \
    xnccl_result_t (*close_listen)(void *listen_comm);                                             \
    xnccl_result_t (*get_device_mr)(void *comm, void *mhandle, void **dptr_mhandle);               \
    xnccl_result_t (*irecv_consumed)(void *recv_comm, int n, void *request);                       \
    xnccl_result_t (*make_vdevice)(int *d, vdev_t *props);                                         \
    xnccl_result_t (*finalize)(void *ctx);                                                         \
    xnccl_result_t (*set_net_attr)(void *ctx, void *net_attr);

struct xnccl_net_v11 {
    XNCCL_NET_V11_BODY(struct xnccl_props_v11, struct xnccl_vdev_v9)
};
struct xnccl_net_v12 {
    XNCCL_NET_V11_BODY(struct xnccl_props_v12, struct xnccl_vdev_v12)
};

/* Versions we can drive, newest first, and the exported symbol of each. */
#define XNCCL_NET_VERSION_MAX 12
#define XNCCL_NET_VERSION_MIN 7
#define XNCCL_NET_SYMBOL_FMT  "ncclNetPlugin_v%d"

#endif
